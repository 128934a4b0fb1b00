/* CUDA backend: attention. Decode (up to 8 tokens) by split key ranges, one warp per query row
 * with an online softmax; prefill on the tensor cores; the attention input's per-head steps
 * (q/k RMSNorm, RoPE, KV store) in one launch, or inside the decode kernel itself.
 *
 * Sums are reordered against the CPU (one thread cannot own a whole row), but every reduction
 * has a fixed order, so results never depend on timing or on which block finishes first. */
#include <cmath>
#include <cstring>

#include "backends/cuda/cuda_internal.cuh"

KTRACE_TU(attention) /* the kernel trace buffer of this file's kernels (cuda_ktrace.cu) */

/* ---- attention ----------------------------------------------------------------------------------
 * Block: one KV head, QT tokens x G query heads = up to 64 rows, 8 warps of up to 8 rows each;
 * keys in tiles of 32 through shared memory (K transposed: lane j scores key j), an online
 * softmax per row with the output spread over the lanes (lane owns dims lane + 32 i).
 * Decode (n <= 8) splits the visible keys into ATT_SPLITS ranges computed on the device from
 * the positions (so a captured graph stays right as the context grows) and combines them. 64
 * ranges: with 16, a 2K-token context gave the 35B-A3B shape's 2 KV heads 32 blocks of 128 keys
 * each, and decode at 2K positions ran 20% slower than at 512 (the 30B-A3B shape, attention in
 * every layer, half as fast); ranges past the context end at once. */

#define ATT_WARPS 8
#define ATT_RPW 8
#define ATT_KT 32
#define ATT_SPLITS 64

/* Shared-memory row stride (floats) of a key in k_attn's tile: the head plus 4 when it is a
 * multiple of 4 (16-byte rows; lanes j..j+7 of a float4 read land on distinct banks), else plus
 * 1 (scalar reads, conflict-free). */
__host__ __device__ __forceinline__ int att_key_stride(int hd) { return hd % 4 == 0 ? hd + 4 : hd + 1; }

struct att_args {
    const float *q, *kc, *vc;
    const int32_t *pos;
    float *out;
    float *part; /* splits: [row][split][2 + hd_v] (m, l, o) */
    int n, n_head, n_head_kv, hd, hd_v, qt, splits;
    float scale;
};

/* RPW: rows a warp holds: ATT_RPW, or 1 when a block has at most ATT_WARPS rows (one-token
 * decode at up to 8 query heads per KV head). Eight rows' accumulators held 203 registers a
 * thread, one block an SM, so the 256 blocks of a 30B-A3B-shape decode launch ran in two
 * waves; at one row, 64 registers and three blocks an SM. */
template <int DV, int RPW>
__global__ void __launch_bounds__(ATT_WARPS * 32, RPW == 1 ? 3 : 1) k_attn(att_args A) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    extern __shared__ __align__(16) float sm[];
    const int hd = A.hd, hdv = A.hd_v;
    const int SK = att_key_stride(hd);
    float *Ks = sm;                        /* [32][SK]: lane j scores key j from its own row */
    float *Vs = Ks + ATT_KT * SK;          /* [32][hd_v] */
    float *Qw = Vs + ATT_KT * hdv;         /* [warps][hd] */
    __shared__ int nkv_max_s;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = A.n_head / A.n_head_kv, kvh = blockIdx.y, split = blockIdx.z;
    const int t0 = blockIdx.x * A.qt;
    const int rows = A.qt * G;
    const size_t krow = (size_t)A.n_head_kv * hd, vrow = (size_t)A.n_head_kv * hdv;
    if (threadIdx.x == 0) {
        int m = 0;
        for (int t = t0; t < t0 + A.qt && t < A.n; t++) m = max(m, A.pos[t] + 1);
        nkv_max_s = m;
    }
    __syncthreads();
    const int nkv_max = nkv_max_s;
    int k_begin = 0, k_end = nkv_max;
    if (A.splits > 1) {
        const int per = ((nkv_max + A.splits - 1) / A.splits + ATT_KT - 1) / ATT_KT * ATT_KT;
        k_begin = min(split * per, nkv_max);
        k_end = min(k_begin + per, nkv_max);
    }
    float m[RPW], l[RPW], o[RPW][DV];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int d = 0; d < DV; d++) o[r][d] = 0.0f;
    }
    float *qw = Qw + warp * hd;
    const bool v16 = hdv % 4 == 0 && ((uintptr_t)A.vc & 15) == 0; /* V rows by 16-byte copies */
    const bool k16 = hd % 4 == 0 && ((uintptr_t)A.kc & 15) == 0;   /* K rows likewise */
    for (int k0 = k_begin; k0 < k_end; k0 += ATT_KT) {
        __syncthreads(); /* the previous tile is consumed */
        /* the tile (and the warp's first query row) by cp.async: every copy in flight at once.
         * Plain loads here were a chain of dependent batches: 20 us of a decode step's attention
         * at head size 256 for a context of 4 keys (bench/results/2026-11-30-cuda-decode/).
         * Warp w copies keys w, w + 8, ...: whole rows of 16 bytes per lane, no division (the
         * K tile was transposed by 4-byte copies, 16 per thread behind an index division each:
         * 11 us of a 30B-A3B attention layer at 144 keys, kernel trace of 2026-11-30) */
        for (int j = warp; j < ATT_KT; j += ATT_WARPS) {
            const bool in = k0 + j < k_end;
            const float *kr = in ? A.kc + (size_t)(k0 + j) * krow + (size_t)kvh * hd : A.kc;
            const float *vr = in ? A.vc + (size_t)(k0 + j) * vrow + (size_t)kvh * hdv : A.vc;
            if (k16)
                for (int d = 4 * lane; d < hd; d += 128) cp16(Ks + j * SK + d, in ? kr + d : kr, in ? 16 : 0);
            else
                for (int d = lane; d < hd; d += 32) cp4(Ks + j * SK + d, in ? kr + d : kr, in ? 4 : 0);
            if (v16)
                for (int d = 4 * lane; d < hdv; d += 128) cp16(Vs + j * hdv + d, in ? vr + d : vr, in ? 16 : 0);
            else
                for (int d = lane; d < hdv; d += 32) cp4(Vs + j * hdv + d, in ? vr + d : vr, in ? 4 : 0);
        }
        {
            const int t = t0 + warp / G, h = kvh * G + warp % G;
            if (warp < rows && t < A.n) {
                const float *qr = A.q + ((size_t)t * A.n_head + h) * hd;
                for (int d = lane; d < hd; d += 32) cp4(qw + d, qr + d, 4);
            }
        }
        cp_commit();
        cp_wait<0>();
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const int r = warp + rr * ATT_WARPS;
            const int t = t0 + r / G, h = kvh * G + r % G;
            if (r >= rows || t >= A.n) continue; /* warp-uniform */
            if (rr > 0) { /* row rr = 0 came with the tile */
                const float *qr = A.q + ((size_t)t * A.n_head + h) * hd;
                for (int d = lane; d < hd; d += 32) qw[d] = qr[d];
            }
            __syncwarp();
            const int key = k0 + lane;
            float s = 0.0f; /* q . k in dimension order, as ever */
            const float *kl = Ks + lane * SK;
            if (hd % 4 == 0) {
                for (int d = 0; d < hd; d += 4) {
                    const float4 k4 = *reinterpret_cast<const float4 *>(kl + d);
                    const float4 q4 = *reinterpret_cast<const float4 *>(qw + d);
                    s = __fmaf_rn(q4.x, k4.x, s);
                    s = __fmaf_rn(q4.y, k4.y, s);
                    s = __fmaf_rn(q4.z, k4.z, s);
                    s = __fmaf_rn(q4.w, k4.w, s);
                }
            } else {
                for (int d = 0; d < hd; d++) s = __fmaf_rn(qw[d], kl[d], s);
            }
            __syncwarp();
            const bool vis = key < k_end && key <= A.pos[t];
            s = vis ? __fmul_rn(s, A.scale) : -INFINITY;
            float tm = s;
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, off));
            const float mn = fmaxf(m[rr], tm);
            if (mn == -INFINITY) continue; /* nothing visible yet */
            const float corr = m[rr] == -INFINITY ? 0.0f : expf(__fsub_rn(m[rr], mn));
            const float p = vis ? expf(__fsub_rn(s, mn)) : 0.0f;
            float ps = p;
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1) ps = __fadd_rn(ps, __shfl_xor_sync(0xffffffffu, ps, off));
            l[rr] = __fadd_rn(__fmul_rn(l[rr], corr), ps);
            m[rr] = mn;
#pragma unroll
            for (int dv = 0; dv < DV; dv++) o[rr][dv] = __fmul_rn(o[rr][dv], corr);
            for (int j = 0; j < ATT_KT; j++) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int dv = 0; dv < DV; dv++) {
                    const int d = lane + 32 * dv;
                    if (d < hdv) o[rr][dv] = __fmaf_rn(pj, Vs[j * hdv + d], o[rr][dv]);
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int r = warp + rr * ATT_WARPS;
        const int t = t0 + r / G, h = kvh * G + r % G;
        if (r >= rows || t >= A.n) continue;
        if (A.splits > 1) {
            float *pp = A.part + (((size_t)t * A.n_head + h) * A.splits + split) * (2 + hdv);
            if (lane == 0) {
                pp[0] = m[rr];
                pp[1] = l[rr];
            }
#pragma unroll
            for (int dv = 0; dv < DV; dv++) {
                const int d = lane + 32 * dv;
                if (d < hdv) pp[2 + d] = o[rr][dv];
            }
        } else {
            const float inv = __fdiv_rn(1.0f, l[rr]);
            float *orow = A.out + ((size_t)t * A.n_head + h) * hdv;
#pragma unroll
            for (int dv = 0; dv < DV; dv++) {
                const int d = lane + 32 * dv;
                if (d < hdv) orow[d] = __fmul_rn(o[rr][dv], inv);
            }
        }
    }
}

/* R rows (token, head) a block, blockDim / R threads each: the splits in order. The splits'
 * maxima and sums are read at once into shared memory and the live ones (any visible key)
 * listed with their weights, so that each output dim adds only those: with a short context
 * most of the 64 are empty, and a loop over all of them per dim was ~5 us of every attention
 * layer's decode. The sums are the same, in the same order, as adding every split and skipping
 * the empty ones. q (R hdv = 256, one thread a value): the block's 256 outputs are also encoded
 * to Q8_K by q8k_block, the encoder kernel's function, for the output projection, whose
 * encoding launch (1.6 us a layer) then does not run. gate (attention_gated): each value times
 * sigmoid(gate[row gs + d]) before it is stored and encoded, as sigmoid_mul rounds it: gated
 * attention's sigmoid, encoding and gate copy launches then do not run either. */
template <int R>
__global__ void k_attn_combine(const float *part, int splits, int hdv, float *out, int8_t *q, float *qd, int *qbs,
                               const float *gate, size_t gs) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    __shared__ float ms_s[R][ATT_SPLITS], ls_s[R][ATT_SPLITS], w_s[R][ATT_SPLITS];
    __shared__ int live_s[R][ATT_SPLITS];
    __shared__ int n_live_s[R];
    __shared__ float inv_s[R];
    __shared__ __align__(16) float enc[256];
    const int nt = blockDim.x / R, r = threadIdx.x / nt, tid = threadIdx.x % nt;
    const size_t row = (size_t)blockIdx.x * R + r;
    const float *pp = part + row * splits * (2 + hdv);
    for (int s = tid; s < splits; s += nt) {
        ms_s[r][s] = pp[(size_t)s * (2 + hdv)];
        ls_s[r][s] = pp[(size_t)s * (2 + hdv) + 1];
    }
    __syncthreads();
    if (tid == 0) {
        float M = -INFINITY;
        for (int s = 0; s < splits; s++) M = fmaxf(M, ms_s[r][s]);
        float L = 0.0f;
        int nl = 0;
        for (int s = 0; s < splits; s++) {
            if (ms_s[r][s] == -INFINITY) continue;
            const float w = expf(__fsub_rn(ms_s[r][s], M));
            L = __fadd_rn(L, __fmul_rn(ls_s[r][s], w));
            live_s[r][nl] = s;
            w_s[r][nl++] = w;
        }
        n_live_s[r] = nl;
        inv_s[r] = __fdiv_rn(1.0f, L);
    }
    __syncthreads();
    const int nl = n_live_s[r];
    const float inv = inv_s[r];
    for (int d = tid; d < hdv; d += nt) {
        float O = 0.0f;
        for (int i = 0; i < nl; i++) O = __fadd_rn(O, __fmul_rn(pp[(size_t)live_s[r][i] * (2 + hdv) + 2 + d], w_s[r][i]));
        float v = __fmul_rn(O, inv);
        if (gate) v = __fmul_rn(v, sigmoidf_(gate[row * gs + d])); /* k_sigmoid_mul's step */
        out[row * hdv + d] = v;
        if (q) enc[r * hdv + d] = v;
    }
    if (!q) return;
    __syncthreads();
    if (threadIdx.x < 32)
        q8k_block(enc, threadIdx.x, q + (size_t)blockIdx.x * 256, qd + blockIdx.x, qbs + (size_t)blockIdx.x * 16);
}

/* Prefill (n > 8) on the tensor cores: 64 query rows (of one KV head) x 64 keys per step. The
 * FP32 form of this kernel (register-tiled, float4 shared-memory reads) reached ~20 TFLOP/s and
 * took 84 ms of a 30B-A3B pp2048 (bench/results/2026-11-30-cuda-prefill2.md). Here both
 * products, S = Q K^T and O += P V, are mma.m16n8k8 TF32 products in the "3xTF32" form: each
 * FP32 operand is split into x = hi + lo, both exact in TF32's 11-bit significand (22 bits
 * together), and a product is summed as lo*hi + hi*lo + hi*hi with FP32 accumulation. The
 * dropped lo*lo term is below 2^-22 of each product, so the result keeps FP32's accuracy to a
 * few ulps (test_cuda checks it against the CPU at every head size) while the multiply-adds run
 * on the tensor cores. Warp w owns rows 16 (w & 3) .. + 15; of the scores, keys 32 (w >> 2) ..
 * + 31, of the output, dims HDV/2 (w >> 2) .. + HDV/2 - 1. Q, K and V sit row-major in shared
 * memory with strides of 4 (Q, K) and 8 (V) floats past a multiple of 32: the fragment reads
 * are conflict-free. V takes K's place once the scores are written (87 KB at head size 128: two
 * blocks per SM). The softmax per row is updated once per 64 keys (maximum and sum by a fixed
 * butterfly). Every order is fixed (the MMA's own summation order is the hardware's): the same
 * inputs give the same bits on every run. */
#define APF_ROWS 64
#define APF_KT 64
#define APF_THREADS 256
#define APF_PS 68 /* row stride of the scores: conflict-free A fragments */

__device__ __forceinline__ void tf32_split(float x, uint32_t &hi, uint32_t &lo) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(__fsub_rn(x, __uint_as_float(hi))));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* D += A B, 3xTF32: the small terms first */
__device__ __forceinline__ void mma_3xtf32(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                           const float b0, const float b1) {
    uint32_t bh0, bl0, bh1, bl1;
    tf32_split(b0, bh0, bl0);
    tf32_split(b1, bh1, bl1);
    mma_tf32(d, al, bh0, bh1);
    mma_tf32(d, ah, bl0, bl1);
    mma_tf32(d, ah, bh0, bh1);
}

/* The A fragment of rows r, r + 8 and columns c, c + 4 of a row-major tile of stride s */
__device__ __forceinline__ void a_frag_3xtf32(const float *p, int s, uint32_t (&ah)[4], uint32_t (&al)[4]) {
    tf32_split(p[0], ah[0], al[0]);
    tf32_split(p[8 * s], ah[1], al[1]);
    tf32_split(p[4], ah[2], al[2]);
    tf32_split(p[8 * s + 4], ah[3], al[3]);
}

template <int DV16>
__global__ void __launch_bounds__(APF_THREADS, DV16 <= 8 ? 2 : 1) k_attn_prefill(att_args A) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    extern __shared__ __align__(16) float sm[];
    constexpr int HDV = DV16 * 16, VS = HDV + 8, VPT = APF_KT * HDV / 4 / APF_THREADS; /* float4s of V per thread */
    const int hd = A.hd, QS = hd + 4, hd4 = hd / 4;
    float *Qs = sm;                                            /* [64][QS] */
    const int kvf = APF_KT * (QS > VS ? QS : VS);
    float *KV = Qs + APF_ROWS * QS;                            /* [64][QS] K, then [64][VS] V */
    float *Ps = KV + kvf;                                      /* [64][APF_PS] scores, then probabilities */
    float *Ms = Ps + APF_ROWS * APF_PS;                        /* [64] running maximum */
    float *Ls = Ms + APF_ROWS;                                 /* [64] running sum */
    float *Cs = Ls + APF_ROWS;                                 /* [64] this step's correction */
    int *Pos = (int *)(Cs + APF_ROWS);                         /* [64] the row's position, -1: no row */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    /* the last tokens (the most keys) first: the long blocks start in the first wave and the
     * short ones fill the tail */
    const int G = A.n_head / A.n_head_kv, kvh = blockIdx.y, t0 = (gridDim.x - 1 - blockIdx.x) * A.qt, rows = A.qt * G;
    const int wr = 16 * (warp & 3), wk = 32 * (warp >> 2), wd = (HDV / 2) * (warp >> 2);
    const size_t krow = (size_t)A.n_head_kv * hd, vrow = (size_t)A.n_head_kv * HDV;
    for (int r = tid; r < APF_ROWS; r += APF_THREADS) {
        const int t = t0 + r / G;
        Pos[r] = r < rows && t < A.n ? A.pos[t] : -1;
        Ms[r] = -INFINITY;
        Ls[r] = 0.0f;
    }
    /* the tiles are copied by cp.async: every copy of a tile in flight at once, no registers */
    for (int i = tid; i < APF_ROWS * hd4; i += APF_THREADS) {
        const int r = i / hd4, d4 = i % hd4, t = t0 + r / G, h = kvh * G + r % G;
        const bool in = r < rows && t < A.n;
        cp16(Qs + r * QS + 4 * d4, in ? A.q + ((size_t)t * A.n_head + h) * hd + 4 * d4 : A.q, in ? 16 : 0);
    }
    cp_commit();
    __syncthreads();
    int nkv = 0;
    for (int r = 0; r < APF_ROWS; r++) nkv = max(nkv, Pos[r] + 1);
    const int r0 = wr + g, r1 = r0 + 8, p0 = Pos[r0], p1 = Pos[r1];
    float o[DV16][4];
#pragma unroll
    for (int n = 0; n < DV16; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[n][e] = 0.0f;
    for (int k0 = 0; k0 < nkv; k0 += APF_KT) {
        for (int i = tid; i < APF_KT * hd4; i += APF_THREADS) {
            const int j = i / hd4, d4 = i % hd4;
            const bool in = k0 + j < nkv;
            cp16(KV + j * QS + 4 * d4, in ? A.kc + (size_t)(k0 + j) * krow + (size_t)kvh * hd + 4 * d4 : A.kc, in ? 16 : 0);
        }
        cp_commit();
        cp_wait<0>(); /* Q too, on the first step */
        __syncthreads();
        /* S = Q K^T: the warp's 16 rows x 32 keys, four 8-key tiles */
        float sc[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) sc[j][e] = 0.0f;
#pragma unroll 2
        for (int kk = 0; kk < hd; kk += 8) {
            uint32_t ah[4], al[4];
            a_frag_3xtf32(Qs + r0 * QS + kk + tg, QS, ah, al);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float *kb = KV + (wk + 8 * j + g) * QS + kk + tg;
                mma_3xtf32(sc[j], ah, al, kb[0], kb[4]);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int c = wk + 8 * j + 2 * tg, key = k0 + c;
            float2 s0, s1;
            s0.x = key <= p0 ? __fmul_rn(sc[j][0], A.scale) : -INFINITY;
            s0.y = key + 1 <= p0 ? __fmul_rn(sc[j][1], A.scale) : -INFINITY;
            s1.x = key <= p1 ? __fmul_rn(sc[j][2], A.scale) : -INFINITY;
            s1.y = key + 1 <= p1 ? __fmul_rn(sc[j][3], A.scale) : -INFINITY;
            *reinterpret_cast<float2 *>(Ps + r0 * APF_PS + c) = s0;
            *reinterpret_cast<float2 *>(Ps + r1 * APF_PS + c) = s1;
        }
        __syncthreads(); /* K consumed: V may take its place */
        /* V's copies are issued before the softmax step and waited for after it */
#pragma unroll
        for (int u = 0; u < VPT; u++) {
            const int i = tid + u * APF_THREADS, j = i / (HDV / 4), d4 = i % (HDV / 4);
            const bool in = k0 + j < nkv;
            cp16(KV + j * VS + 4 * d4, in ? A.vc + (size_t)(k0 + j) * vrow + (size_t)kvh * HDV + 4 * d4 : A.vc, in ? 16 : 0);
        }
        cp_commit();
        /* the softmax step: warp w updates rows 8 w .. 8 w + 7, a lane holds keys lane, lane + 32
         * (unrolled: the rows' shuffle chains interleave) */
#pragma unroll
        for (int rr = 0; rr < APF_ROWS / 8; rr++) {
            const int row = warp * (APF_ROWS / 8) + rr;
            const float s0 = Ps[row * APF_PS + lane], s1 = Ps[row * APF_PS + lane + 32];
            float tm = fmaxf(s0, s1);
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, off));
            const float mo = Ms[row], mn = fmaxf(mo, tm);
            float e0 = 0.0f, e1 = 0.0f, corr = 0.0f;
            if (mn != -INFINITY) { /* else nothing visible yet: the row stays empty */
                corr = mo == -INFINITY ? 0.0f : expf(__fsub_rn(mo, mn));
                e0 = s0 == -INFINITY ? 0.0f : expf(__fsub_rn(s0, mn));
                e1 = s1 == -INFINITY ? 0.0f : expf(__fsub_rn(s1, mn));
            }
            float ps = __fadd_rn(e0, e1);
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1) ps = __fadd_rn(ps, __shfl_xor_sync(0xffffffffu, ps, off));
            Ps[row * APF_PS + lane] = e0;
            Ps[row * APF_PS + lane + 32] = e1;
            __syncwarp();
            if (lane == 0) {
                Cs[row] = corr;
                if (mn != -INFINITY) {
                    Ls[row] = __fadd_rn(__fmul_rn(Ls[row], corr), ps);
                    Ms[row] = mn;
                }
            }
        }
        cp_wait<0>();
        __syncthreads();
        /* O = O * corr + P V: the warp's 16 rows x HDV/2 dims, DV16 8-dim tiles */
        const float c0 = Cs[r0], c1 = Cs[r1];
#pragma unroll
        for (int n = 0; n < DV16; n++) {
            o[n][0] = __fmul_rn(o[n][0], c0);
            o[n][1] = __fmul_rn(o[n][1], c0);
            o[n][2] = __fmul_rn(o[n][2], c1);
            o[n][3] = __fmul_rn(o[n][3], c1);
        }
#pragma unroll 2
        for (int kk = 0; kk < APF_KT; kk += 8) {
            uint32_t ah[4], al[4];
            a_frag_3xtf32(Ps + r0 * APF_PS + kk + tg, APF_PS, ah, al);
#pragma unroll
            for (int n = 0; n < DV16; n++) {
                const float *vb = KV + (kk + tg) * VS + wd + 8 * n + g;
                mma_3xtf32(o[n], ah, al, vb[0], vb[4 * VS]);
            }
        }
        __syncthreads(); /* the tiles are consumed */
    }
    cp_wait<0>(); /* nothing left in flight, even with no step */
    const int rr[2] = {r0, r1};
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = rr[half];
        if (Pos[row] < 0) continue;
        const int t = t0 + row / G, h = kvh * G + row % G;
        const float inv = __fdiv_rn(1.0f, Ls[row]);
        float *orow = A.out + ((size_t)t * A.n_head + h) * HDV + wd + 2 * tg;
#pragma unroll
        for (int n = 0; n < DV16; n++) {
            float2 w;
            w.x = __fmul_rn(o[n][2 * half], inv);
            w.y = __fmul_rn(o[n][2 * half + 1], inv);
            *reinterpret_cast<float2 *>(orow + 8 * n) = w;
        }
    }
}

template <int DV16> static void attn_prefill_launch(cuda_backend *c, const att_args &a, dim3 grid, size_t smem) {
    static size_t set = 0;
    if (smem > set) {
        CU(cudaFuncSetAttribute(k_attn_prefill<DV16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        set = smem;
    }
    pdl_launch(k_attn_prefill<DV16>, grid, APF_THREADS, smem, c->stream, a);
    CU_LAUNCH();
}

/* The tiled prefill kernel's shared memory, or 0 when it does not apply (the warp-per-row
 * kernel then runs). */
static size_t attn_prefill_smem(const cuda_backend *c, int n, int G, int hd, int hd_v) {
    if (n <= 8 || G > APF_ROWS || hd % 8 != 0 || (hd_v != 64 && hd_v != 128 && hd_v != 256)) return 0;
    const size_t qs = (size_t)hd + 4, vs = (size_t)hd_v + 8; /* the kernel's row strides */
    const size_t f = APF_ROWS * qs + APF_KT * (qs > vs ? qs : vs) + (size_t)APF_ROWS * APF_PS + 4 * APF_ROWS;
    const size_t bytes = f * sizeof(float);
    return bytes <= (size_t)c->prop.sharedMemPerBlockOptin ? bytes : 0;
}

template <int DV, int RPW> static void attn_launch(cuda_backend *c, const att_args &a, dim3 grid, size_t smem) {
    static size_t set = 0;
    if (smem > set) {
        CU(cudaFuncSetAttribute(k_attn<DV, RPW>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        set = smem;
    }
    pdl_launch(k_attn<DV, RPW>, grid, ATT_WARPS * 32, smem, c->stream, a);
    CU_LAUNCH();
}

static void attention_run(cuda_backend *c, const float *q, const float *kc, const float *vc, int n, int n_head,
                          int n_head_kv, int hd, int hd_v, float scale, const float *gate, size_t gs, float *out);

void cuda_op_attention(backend *b, const float *q, const float *kc, const float *vc, int n, int pos0,
                       int n_head, int n_head_kv, int hd, int hd_v, float scale, float *out) {
    (void)pos0; /* the step's positions (set_inputs) say what each token sees */
    attention_run(CB(b), q, kc, vc, n, n_head, n_head_kv, hd, hd_v, scale, nullptr, 0, out);
}

/* A decode step (n <= 8: always the split kernel and its combine) takes the gate into the
 * combine; prefill runs the ops (the gate's copy and sigmoid_mul are a small part of it). */
bool cuda_op_attention_gated(backend *b, const float *q, const float *kc, const float *vc, int n, int pos0,
                             int n_head, int n_head_kv, int hd, int hd_v, float scale, const float *gate,
                             size_t gate_stride, float *out) {
    cuda_backend *c = CB(b);
    (void)pos0;
    if (c->attn_gate_apart || n > 8 || !gate) return false;
    attention_run(c, q, kc, vc, n, n_head, n_head_kv, hd, hd_v, scale, gate, gate_stride, out);
    return true;
}

static void attention_run(cuda_backend *c, const float *q, const float *kc, const float *vc, int n, int n_head,
                          int n_head_kv, int hd, int hd_v, float scale, const float *gate, size_t gs, float *out) {
    cuda_prof_begin(c);
    const int G = n_head / n_head_kv;
    if (G > ATT_WARPS * ATT_RPW || hd > 1024 || hd_v > 256) {
        fprintf(stderr, "sluice: CUDA attention: %d heads per KV head, dims %d/%d unsupported\n", G, hd, hd_v);
        abort();
    }
    att_args a;
    a.q = q;
    a.kc = kc;
    a.vc = vc;
    a.pos = c->d_in + c->in_cap;
    a.out = out;
    a.n = n;
    a.n_head = n_head;
    a.n_head_kv = n_head_kv;
    a.hd = hd;
    a.hd_v = hd_v;
    a.scale = scale;
    a.qt = (ATT_WARPS * ATT_RPW) / G;
    if (a.qt > n) a.qt = n;
    a.splits = n <= 8 ? ATT_SPLITS : 1;
    a.part = nullptr;
    if (a.splits > 1)
        a.part = (float *)cuda_scratch(c, SCR_ATTN, (size_t)n * n_head * a.splits * (2 + hd_v) * sizeof(float));
    const bool al16 = (((uintptr_t)q | (uintptr_t)kc | (uintptr_t)vc | (uintptr_t)out) & 15) == 0; /* float4 */
    const size_t pf_smem = c->attn_rows || !al16 ? 0 : attn_prefill_smem(c, n, G, hd, hd_v);
    if (pf_smem) {
        a.qt = APF_ROWS / G;
        dim3 pgrid(cdiv((size_t)n, (size_t)a.qt), n_head_kv, 1);
        if (hd_v == 64) attn_prefill_launch<4>(c, a, pgrid, pf_smem);
        else if (hd_v == 128) attn_prefill_launch<8>(c, a, pgrid, pf_smem);
        else attn_prefill_launch<16>(c, a, pgrid, pf_smem);
        cuda_act_invalidate_range(c, out, (size_t)n * n_head * hd_v * sizeof(float));
        cuda_prof_end(c, "attention (prefill)");
        return;
    }
    dim3 grid(cdiv((size_t)n, (size_t)a.qt), n_head_kv, a.splits);
    const size_t smem =
        ((size_t)ATT_KT * att_key_stride(hd) + (size_t)ATT_KT * hd_v + (size_t)ATT_WARPS * hd) * sizeof(float);
    const int dv = (hd_v + 31) / 32;
    if (a.qt * G <= ATT_WARPS && !c->attn_wide) {
        if (dv <= 1) attn_launch<1, 1>(c, a, grid, smem);
        else if (dv <= 2) attn_launch<2, 1>(c, a, grid, smem);
        else if (dv <= 4) attn_launch<4, 1>(c, a, grid, smem);
        else attn_launch<8, 1>(c, a, grid, smem);
    } else {
        if (dv <= 1) attn_launch<1, ATT_RPW>(c, a, grid, smem);
        else if (dv <= 2) attn_launch<2, ATT_RPW>(c, a, grid, smem);
        else if (dv <= 4) attn_launch<4, ATT_RPW>(c, a, grid, smem);
        else attn_launch<8, ATT_RPW>(c, a, grid, smem);
    }
    cuda_act_invalidate_range(c, out, (size_t)n * n_head * hd_v * sizeof(float));
    if (a.splits > 1) {
        /* the output's Q8_K encoding too, when its rows cut into whole blocks of 256 */
        const int64_t K = (int64_t)n_head * hd_v;
        if (c->attn_encode && (hd_v == 64 || hd_v == 128 || hd_v == 256) && K % 256 == 0) {
            const qact e = cuda_act_reserve(c, out, n, K, QT_Q8_K);
            const unsigned blocks = (unsigned)((size_t)n * K / 256);
            int8_t *eq = (int8_t *)e.q;
            float *ed = (float *)e.d;
            int *ebs = (int *)e.bs;
            if (hd_v == 64)
                pdl_launch(k_attn_combine<4>, blocks, 256, 0, c->stream, a.part, a.splits, hd_v, out, eq, ed, ebs,
                           gate, gs);
            else if (hd_v == 128)
                pdl_launch(k_attn_combine<2>, blocks, 256, 0, c->stream, a.part, a.splits, hd_v, out, eq, ed, ebs,
                           gate, gs);
            else
                pdl_launch(k_attn_combine<1>, blocks, 256, 0, c->stream, a.part, a.splits, hd_v, out, eq, ed, ebs,
                           gate, gs);
        } else {
            pdl_launch(k_attn_combine<1>, (unsigned)(n * n_head), 128, 0, c->stream, a.part, a.splits, hd_v, out,
                       (int8_t *)nullptr, (float *)nullptr, (int *)nullptr, gate, gs);
        }
        CU_LAUNCH();
    }
    cuda_prof_end(c, n <= 8 ? (gate ? "attention (decode) + sigmoid gate" : "attention (decode)") : "attention (prefill)");
}
/* ---- attention input: q/k norms, RoPE, KV store in one launch --------------------------------------
 * A decode step's attention layer ran rmsnorm (q), rmsnorm (k), rope (q), rope (k) and kv_store
 * as five dependent launches of ~2-3 us each over a few KB. Here one warp takes one head row:
 * blocks 0 .. n n_head - 1 the q rows, the rest the k rows, which also store their v row. The
 * norm keeps the layout the plain kernel uses at this width (k_norm8's eight consecutive values
 * per lane at 256, k_norm<32>'s lane-strided ones below), so its double sums are the same; RoPE
 * is k_rope's per-pair arithmetic; the stores are kv_store's copies. */
template <int HD>
__global__ void __launch_bounds__(32) k_qk_norm_rope_store(float *q, float *k, const float *v, int n, int n_head,
                                                           int n_head_kv, const float *qw, const float *kw, float eps,
                                                           int n_rot, const int32_t *pos, float theta_scale, int neox,
                                                           float *kc, float *vc, size_t row_k, size_t row_v, int hdv) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    constexpr int PER = HD / 32;
    __shared__ float r[HD];
    const int lane = threadIdx.x, nq = n * n_head;
    const bool isq = (int)blockIdx.x < nq;
    const int idx = isq ? (int)blockIdx.x : (int)blockIdx.x - nq, nh = isq ? n_head : n_head_kv;
    const int t = idx / nh, h = idx % nh;
    float *x = (isq ? q : k) + (size_t)idx * HD;
    const float *w = isq ? qw : kw;
    float vals[PER];
    if constexpr (HD == 256) { /* k_norm8: elements 8 lane + j */
#pragma unroll
        for (int j = 0; j < PER; j++) vals[j] = x[8 * lane + j];
    } else { /* k_norm<32>: elements lane + 32 j */
#pragma unroll
        for (int j = 0; j < PER; j++) vals[j] = x[lane + 32 * j];
    }
    const float scale = warp_rms_scale(vals, HD, eps);
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int e = HD == 256 ? 8 * lane + j : lane + 32 * j;
        r[e] = __fmul_rn(__fmul_rn(vals[j], scale), w[e]);
    }
    __syncwarp();
    float *kcr = isq ? nullptr : kc + (size_t)pos[t] * row_k + (size_t)h * HD;
    const int half = n_rot / 2;
    if (half > 0) {
        const float p0 = (float)pos[t];
        for (int i = lane; i < half; i += 32) {
            int i0, i1;
            float y0, y1;
            rope_dims(i, half, neox, &i0, &i1);
            rope_rotate(i, p0, theta_scale, r[i0], r[i1], &y0, &y1);
            x[i0] = y0;
            x[i1] = y1;
            if (kcr) {
                kcr[i0] = y0;
                kcr[i1] = y1;
            }
        }
    }
    for (int i = 2 * half + lane; i < HD; i += 32) { /* past the rotated dims */
        x[i] = r[i];
        if (kcr) kcr[i] = r[i];
    }
    if (!isq) {
        const float *vr = v + (size_t)t * row_v + (size_t)h * hdv;
        float *vcr = vc + (size_t)pos[t] * row_v + (size_t)h * hdv;
        for (int i = lane; i < hdv; i += 32) vcr[i] = vr[i];
    }
}

bool cuda_op_qk_norm_rope_store(backend *b, float *q, float *k, const float *v, int n, int n_head,
                                int n_head_kv, int head_dim, const tview *q_norm, const tview *k_norm,
                                float eps, int n_rot, const int32_t *pos, float freq_base, rope_mode mode,
                                float *kc, float *vc, size_t row_k, size_t row_v) {
    cuda_backend *c = CB(b);
    const int hd = head_dim;
    /* the widths whose plain norm is one warp (k_norm8 at 256 needs 16-byte aligned rows) */
    if (c->no_qk_fuse || (hd != 64 && hd != 128 && hd != 256)) return false;
    if (!q_norm || !q_norm->data || !k_norm || !k_norm->data || n_rot > hd || n_rot % 2 ||
        row_k != (size_t)n_head_kv * hd || row_v % (size_t)n_head_kv)
        return false;
    if (hd == 256 && ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k)) & 15)) return false;
    cuda_prof_begin(c);
    const float *qw = (const float *)cuda_weight(c, q_norm->data, (size_t)hd * sizeof(float));
    const float *kw = (const float *)cuda_weight(c, k_norm->data, (size_t)hd * sizeof(float));
    if (hd == 256 && ((reinterpret_cast<uintptr_t>(qw) | reinterpret_cast<uintptr_t>(kw)) & 15)) {
        cuda_prof_end(c, "qk norm + rope + kv_store");
        return false;
    }
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot); /* as cuda_op_rope */
    const unsigned blocks = (unsigned)(n * (n_head + n_head_kv));
    const int hdv = (int)(row_v / (size_t)n_head_kv), neox = mode == ROPE_NEOX;
    if (hd == 64)
        pdl_launch(k_qk_norm_rope_store<64>, blocks, 32, 0, c->stream, q, k, v, n, n_head, n_head_kv, qw, kw, eps,
                   n_rot, pos, theta_scale, neox, kc, vc, row_k, row_v, hdv);
    else if (hd == 128)
        pdl_launch(k_qk_norm_rope_store<128>, blocks, 32, 0, c->stream, q, k, v, n, n_head, n_head_kv, qw, kw, eps,
                   n_rot, pos, theta_scale, neox, kc, vc, row_k, row_v, hdv);
    else
        pdl_launch(k_qk_norm_rope_store<256>, blocks, 32, 0, c->stream, q, k, v, n, n_head, n_head_kv, qw, kw, eps,
                   n_rot, pos, theta_scale, neox, kc, vc, row_k, row_v, hdv);
    CU_LAUNCH();
    cuda_act_invalidate_range(c, q, (size_t)n * n_head * hd * sizeof(float));
    cuda_act_invalidate_range(c, k, (size_t)n * row_k * sizeof(float));
    cuda_prof_end(c, "qk norm + rope + kv_store");
    return true;
}
