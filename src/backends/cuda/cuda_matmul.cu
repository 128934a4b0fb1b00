/* CUDA backend: matrix products over quantized weights, activation encoding, embedding rows.
 *
 * Two kernel families, chosen by the number of activation rows a product has (never by where
 * the weights live, so resident and streamed runs pick the same kernels):
 *   matvec (n <= 8): a warp per output row; lanes take 32-value chunks of the blocks (8 lanes
 *     per 256-value block), decode them to int8 words and dp4a them with the activations; the
 *     block's integer sums are reduced across its lanes exactly, its float term added by one
 *     lane, and the lanes' float sums folded in a fixed butterfly. A grouped form reads the
 *     weights of slot j from the expert table (MoE decode).
 *   tiled (n > 8): 64 rows x 64 (or 128) activation rows per block of 4 (8) warps; per 256
 *     values the raw weight bytes and the activations arrive by a two-stage cp.async pipeline,
 *     the weights are decoded to int8 in shared memory and multiplied with int8 tensor-core MMAs,
 *     one per group of values that shares an integer scale (m16n8k32 for types scaled per 32
 *     values, m16n8k16 per 16), so every group's exact integer sum is scaled by its integer
 *     scale; the mins' integer sums are tensor-core products too; float terms per block as in
 *     the reference. A grouped form takes its tiles (expert, entries) from cuda_moe's grouping
 *     (MoE prefill).
 * F32/F16/BF16 weights use float forms of both (products of the rounded activations).
 * Every output element is computed by one thread in a fixed order: results do not depend on
 * the grid, on n within a family, or on which other rows share a tile. */
#include <cstring>

#include "backends/cuda/cuda_internal.cuh"
#include "backends/silu_fixed.h"

extern "C" {
#include "formats/quant.h"
}

KTRACE_TU(matmul) /* the kernel trace buffer of this file's kernels (cuda_ktrace.cu) */

bool cuda_type_supported(uint32_t type) {
    switch (type) {
    case QT_F32: case QT_F16: case QT_BF16: case QT_Q4_0: case QT_Q5_0: case QT_Q8_0:
    case QT_IQ4_NL: case QT_MXFP4: case QT_Q2_K: case QT_Q3_K: case QT_Q4_K: case QT_Q5_K:
    case QT_Q6_K: case QT_IQ2_XXS: case QT_IQ2_XS: case QT_IQ3_XXS: case QT_IQ4_XS:
        return true;
    default:
        return false;
    }
}

int cuda_act_type(uint32_t type) {
    switch (type) {
    case QT_F32: return QT_F32;
    case QT_F16: return QT_F16;
    case QT_BF16: return QT_BF16;
    case QT_Q4_0: case QT_Q5_0: case QT_Q8_0: case QT_IQ4_NL: case QT_MXFP4: return QT_Q8_0;
    default: return QT_Q8_K;
    }
}

static bool is_float_type(uint32_t t) { return t == QT_F32 || t == QT_F16 || t == QT_BF16; }

/* ---- activation encodings --------------------------------------------------------------------- */

static size_t al256(size_t x) { return (x + 255) / 256 * 256; }

size_t cuda_act_bytes(int n, int64_t K, int act) {
    const size_t N = (size_t)n, k = (size_t)K;
    if (act == QT_Q8_K) return al256(N * k) + al256(N * (k / 256) * 4) + al256(N * (k / 16) * 4);
    if (act == QT_Q8_0) return al256(N * k) + al256(N * (k / 32) * 4);
    return al256(N * k * 4);
}

qact cuda_act_view(void *buf, int n, int64_t K, int act) {
    qact a;
    memset(&a, 0, sizeof a);
    a.K = K;
    a.act = act;
    uint8_t *p = (uint8_t *)buf;
    const size_t N = (size_t)n, k = (size_t)K;
    if (act == QT_Q8_K) {
        a.q = (const int8_t *)p;
        a.d = (const float *)(p + al256(N * k));
        a.bs = (const int *)(p + al256(N * k) + al256(N * (k / 256) * 4));
    } else if (act == QT_Q8_0) {
        a.q = (const int8_t *)p;
        a.d = (const float *)(p + al256(N * k));
    } else {
        a.f = (const float *)p;
    }
    return a;
}

/* Q8_K, one warp per 256 values (ggml's reference rule: the value of largest magnitude, the
 * first on ties, maps to -127; round half to even; clamp at 127; d = 1 / iscale). */
__global__ void k_quant_q8k(const float *x, int64_t nblk, int8_t *q, float *d, int *bs) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (wid >= nblk) return;
    q8k_block(x + wid * 256, lane, q + wid * 256, d + wid, bs + wid * 16);
}

/* Q8_0, one warp per 32 values: d = amax / 127 stored as f16, q = round half to even of
 * x * (127 / amax), the CPU encoder's recipe (llama.cpp's x86 one, formats/quant_legacy.c). */
__global__ void k_quant_q80(const float *x, int64_t nblk, int8_t *q, float *d) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (wid >= nblk) return;
    const float v = x[wid * 32 + lane];
    float am = fabsf(v);
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, off));
    const float dd = __fdiv_rn(am, 127.0f);
    const float id = am != 0.0f ? __fdiv_rn(127.0f, am) : 0.0f;
    q[wid * 32 + lane] = (int8_t)__float2int_rn(__fmul_rn(v, id));
    if (lane == 0) d[wid] = __half2float(__float2half_rn(dd));
}

template <int ACT> __global__ void k_round_act(const float *x, int64_t n, float *f) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if constexpr (ACT == QT_F16) f[i] = __half2float(__float2half_rn(x[i]));
    else f[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
}

void cuda_quantize_act(cuda_backend *c, const float *x, int n, int64_t K, int act, void *buf) {
    qact a = cuda_act_view(buf, n, K, act);
    const int64_t total = (int64_t)n * K;
    if (act == QT_Q8_K) {
        const int64_t nb = total / 256;
        pdl_launch(k_quant_q8k, cdiv(nb * 32, 256), 256, 0, c->stream, x, nb, (int8_t *)a.q, (float *)a.d,
                                                              (int *)a.bs);
    } else if (act == QT_Q8_0) {
        const int64_t nb = total / 32;
        pdl_launch(k_quant_q80, cdiv(nb * 32, 256), 256, 0, c->stream, x, nb, (int8_t *)a.q, (float *)a.d);
    } else if (act == QT_F16) {
        pdl_launch(k_round_act<QT_F16>, cdiv(total, 256), 256, 0, c->stream, x, total, (float *)a.f);
    } else if (act == QT_BF16) {
        pdl_launch(k_round_act<QT_BF16>, cdiv(total, 256), 256, 0, c->stream, x, total, (float *)a.f);
    } else {
        CU(cudaMemcpyAsync((void *)a.f, x, (size_t)total * 4, cudaMemcpyDeviceToDevice, c->stream));
    }
    CU_LAUNCH();
}

/* ---- matvec ------------------------------------------------------------------------------------ */

#define MV_MULTI_MAX 4

struct mv_args {
    mm_src s, s2;
    qact a;
    int64_t K, rows;
    int n;
    float *out;
    int64_t ostride;
    const qtables *tb;
    /* several matrices of one type and K on the same input, one launch (cuda_op_matmul_multi):
     * matrix m owns blocks mboff[m] .. mboff[m + 1] - 1; nm <= 1: the single matrix above */
    int nm;
    const uint8_t *mw[MV_MULTI_MAX];
    int64_t mrows[MV_MULTI_MAX];
    float *mout[MV_MULTI_MAX];
    uint32_t mrb[MV_MULTI_MAX]; /* each matrix's row bytes (two types in one launch differ) */
    unsigned mboff[MV_MULTI_MAX + 1];
    int nm1; /* k_mv_q_mix: matrices nm1 .. nm - 1 are of its second type */
    int pf; /* cuda_backend::mv_prefetch */
    int q6s; /* cuda_backend::q6_spread: Q6_K rows by q6s_chunk */
    float *xout; /* the extra slots' output (mm_src::extra) */
    /* the F32 activations, encoded to Q8_K by each block itself (half-warp rows of K <= 512,
     * cuda_mv_encodes: one link, the encoding launch, fewer); NULL: a is already encoded */
    const float *xin;
};

/* The matrix this block works on, its rows, output, and the block's index within it. */
struct mv_part {
    mm_src s;
    int64_t rows;
    float *out;
    int64_t ostride;
    unsigned bx;
};

__device__ __forceinline__ mv_part mv_pick(const mv_args &A) {
    mv_part p = {A.s, A.rows, A.out, A.ostride, blockIdx.x};
    if (A.nm > 1) {
        int m = 0;
        while (m + 1 < A.nm && p.bx >= A.mboff[m + 1]) m++;
        p.s.w = A.mw[m];
        p.s.row_bytes = A.mrb[m];
        p.rows = A.mrows[m];
        p.out = A.mout[m];
        p.ostride = A.mrows[m];
        p.bx -= A.mboff[m];
    }
    return p;
}

/* SwiGLU's gate with the fixed exponential (backends/silu_fixed.h): the host reproduces it */
__device__ __forceinline__ float silu_mul(float g, float u) { return silu_fixed_mul(g, u); }

__device__ __forceinline__ int dot8(const uint32_t q[8], uint4 a0, uint4 a1, int sc0, int sc1) {
    int p0 = __dp4a((int)q[0], (int)a0.x, 0);
    p0 = __dp4a((int)q[1], (int)a0.y, p0);
    p0 = __dp4a((int)q[2], (int)a0.z, p0);
    p0 = __dp4a((int)q[3], (int)a0.w, p0);
    int p1 = __dp4a((int)q[4], (int)a1.x, 0);
    p1 = __dp4a((int)q[5], (int)a1.y, p1);
    p1 = __dp4a((int)q[6], (int)a1.z, p1);
    p1 = __dp4a((int)q[7], (int)a1.w, p1);
    return sc0 * p0 + sc1 * p1;
}

/* The weight row of output `row` for output group j (plain: the matrix; grouped: slot j's expert). */
__device__ __forceinline__ const uint8_t *row_ptr(const mm_src &s, int j, int64_t row) {
    const uint8_t *base = !s.table ? s.w : s.extra && j >= s.n_tab ? s.extra : s.table[s.ids[j]].p[s.part];
    return base + (size_t)row * s.row_bytes;
}

/* The activation row of output group j (plain: token j). */
__device__ __forceinline__ int act_row(const mm_src &s, int j) {
    if (!s.table) return j;
    return s.extra && j >= s.n_tab ? s.x_arow0 + (j - s.n_tab) : j / s.act_div;
}

/* Where output group j's row goes: row j of the output, or an extra slot's row of xout. */
__device__ __forceinline__ float *out_row(const mv_args &A, const mv_part &P, int j) {
    if (A.s.table && A.s.extra && j >= A.s.n_tab) return A.xout + (size_t)(j - A.s.n_tab) * P.ostride;
    return P.out + (size_t)j * P.ostride;
}

/* The weight row's bytes asked of L2 by one lane each (w, then w2): a plain matrix's before
 * pdl_wait, while the previous kernel still runs (no kernel writes weights), an expert's
 * (through the table, known only from the routing) after it. */
template <bool DUAL>
__device__ __forceinline__ void mv_prefetch_row(const uint8_t *w, const uint8_t *w2, uint32_t bytes, int lane) {
    if (lane == 0) l2_prefetch(w, bytes);
    if (DUAL && lane == 1) l2_prefetch(w2, bytes);
}

/* A Q6_K block's share for lane group `sub` (0..7) of its 8 lanes, spread over the block's four
 * quadrants instead of one run of 32 values: h = sub / 4 (which 128 values), l0 = 8 (sub % 4);
 * words q[2r], q[2r + 1] hold values 128 h + 32 r + l0 .. + 7 (r = 0..3), each with its 16-value
 * group's scale sc[r]. The 32 values' bits then come from 8 bytes of ql at 64 h + l0 (low
 * nibbles: r = 0, high: r = 2), 8 at 64 h + 32 + l0 (r = 1, 3) and 8 of qh at 128 + 32 h + l0
 * (two bits for each r), 24 bytes, where dchunk<QT_Q6_K>'s run of 32 loads 64 (ql's and qh's
 * words around it, 18 loads and 16 funnel shifts a lane). The output head of a one-token step
 * is a Q6_K product that Nsight Compute found issue-bound (SM throughput 77%, DRAM 50%;
 * bench/results/2026-12-05-cuda-occupancy.md). The 8 lanes' integer sums per block are the
 * same integers in another grouping, so the block terms, and every bit after them, are those of
 * dchunk's form. */
__device__ __forceinline__ void q6s_chunk(const uint8_t *b, int sub, uint32_t q[8], int sc[4]) {
    const int h = sub >> 2, l0 = 8 * (sub & 3);
    uint32_t lo[2], hi[2], qh[2];
    ld32s_a2<2>(b + 64 * h + l0, lo);
    ld32s_a2<2>(b + 64 * h + 32 + l0, hi);
    ld32s_a2<2>(b + 128 + 32 * h + l0, qh);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        q[0 + i] = __vsub4((lo[i] & 0x0F0F0F0Fu) | ((qh[i] << 4) & 0x30303030u), 0x20202020u);
        q[2 + i] = __vsub4((hi[i] & 0x0F0F0F0Fu) | ((qh[i] << 2) & 0x30303030u), 0x20202020u);
        q[4 + i] = __vsub4(((lo[i] >> 4) & 0x0F0F0F0Fu) | (qh[i] & 0x30303030u), 0x20202020u);
        q[6 + i] = __vsub4(((hi[i] >> 4) & 0x0F0F0F0Fu) | ((qh[i] >> 2) & 0x30303030u), 0x20202020u);
    }
    const uint8_t *scp = b + 192 + 8 * h + (l0 >> 4);
#pragma unroll
    for (int r = 0; r < 4; r++) sc[r] = (int8_t)scp[2 * r];
}

/* q6s_chunk's words against the activations at ap (the block's values 128 h + l0 of the token):
 * four runs of 8 bytes, 32 apart */
__device__ __forceinline__ int q6s_dot(const uint32_t q[8], const int sc[4], const int8_t *ap) {
    int s = 0;
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const uint2 a = *reinterpret_cast<const uint2 *>(ap + 32 * r);
        s += sc[r] * __dp4a((int)q[2 * r + 1], (int)a.y, __dp4a((int)q[2 * r], (int)a.x, 0));
    }
    return s;
}

/* One output row (one warp): lane groups of B / 32 lanes take a block each, BPI blocks per
 * iteration; group g adds the terms of blocks g, g + BPI, ... in order, then the butterfly over
 * the lanes: the order depends on K and the type alone.
 * W = 16: half a warp per row (lane is the lane within the half; store false: a padding row,
 * computed, not written), for rows of at most BPI / 2 blocks, where the other half of the warp
 * only ever added zeros: each group takes the same block, and the butterfly's first step
 * (adding the other half's +0.0) is kept as an explicit + 0.0f, so the same bits. */
template <int T, int NT, bool DUAL, int W = 32, bool PAIR = false>
__device__ __forceinline__ void mv_q_row(const mv_args &A, const mv_part &P, int64_t row, int lane, bool store = true,
                                         const qact *own = nullptr) {
    constexpr int B = qtraits<T>::B, BYTES = qtraits<T>::BYTES, LPB = B / 32, BPI = W / LPB;
    constexpr bool TWO = DUAL || PAIR; /* a second weight row beside the first, same activations */
    /* own: the block's own encoding of its one activation row (shared memory), else A.a */
    const int8_t *aq = own ? own->q : A.a.q;
    const float *ad = own ? own->d : A.a.d;
    const int *abs_ = own ? own->bs : A.a.bs;
    const uint32_t row_len = (uint32_t)(A.K / B) * BYTES;
    const int j0 = blockIdx.y * NT; /* first token (plain) or the slot (grouped, NT = 1) */
    const uint8_t *w = row_ptr(P.s, j0, row);
    /* PAIR: the next row of the same matrix (itself again past the last row: computed, not
     * stored) */
    const bool second = PAIR && row + 1 < P.rows;
    const uint8_t *w2 = DUAL ? row_ptr(A.s2, j0, row) : PAIR ? (second ? w + P.s.row_bytes : w) : nullptr;
    if (P.s.table && (A.pf & 2)) mv_prefetch_row<TWO>(w, w2, row_len, lane);
    const int arow0 = own ? 0 : act_row(A.s, j0);
    const int nt = A.n - j0 < NT ? A.n - j0 : NT;
    const int sub = lane % LPB, bl = lane / LPB;
    const int nblk = (int)(A.K / B);
    float acc[NT], acc2[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = acc2[t] = 0.0f;
    const int iters = (nblk + BPI - 1) / BPI;
    /* two iterations in flight: their weight loads are issued before either is reduced */
#pragma unroll 2
    for (int it = 0; it < iters; it++) {
        const int blk = it * BPI + bl;
        const bool valid = blk < nblk;
        int is[NT], ms[NT], is2[NT], ms2[NT];
        float fw = 0, fm = 0, fw2 = 0, fm2 = 0;
#pragma unroll
        for (int t = 0; t < NT; t++) is[t] = ms[t] = is2[t] = ms2[t] = 0;
        if (T == QT_Q6_K && A.q6s && valid) {
            const uint8_t *bp = w + (size_t)blk * BYTES;
            uint32_t q[8], q2[8];
            int sc[4], sc2[4];
            q6s_chunk(bp, sub, q, sc);
            dfloats<T>(bp, fw, fm);
            if (TWO) {
                const uint8_t *bp2 = w2 + (size_t)blk * BYTES;
                q6s_chunk(bp2, sub, q2, sc2);
                dfloats<T>(bp2, fw2, fm2);
            }
            const int off = 128 * (sub >> 2) + 8 * (sub & 3);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    const int8_t *ap = aq + (size_t)(arow0 + t) * A.K + (size_t)blk * B + off;
                    is[t] = q6s_dot(q, sc, ap);
                    if (TWO) is2[t] = q6s_dot(q2, sc2, ap);
                }
            }
        } else if (valid) {
            const uint8_t *bp = w + (size_t)blk * BYTES;
            uint32_t q[8], q2[8];
            int sc[2], mn[2], sc2[2], mn2[2];
            dchunk<T>(bp, sub, A.tb, q, sc, mn);
            dfloats<T>(bp, fw, fm);
            if (TWO) {
                const uint8_t *bp2 = w2 + (size_t)blk * BYTES;
                dchunk<T>(bp2, sub, A.tb, q2, sc2, mn2);
                dfloats<T>(bp2, fw2, fm2);
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    const size_t ar = (size_t)(arow0 + t);
                    const uint4 *ap = reinterpret_cast<const uint4 *>(aq + ar * A.K + (size_t)blk * B + sub * 32);
                    const uint4 a0 = ap[0], a1 = ap[1];
                    is[t] = dot8(q, a0, a1, sc[0], sc[1]);
                    if (TWO) is2[t] = dot8(q2, a0, a1, sc2[0], sc2[1]);
                    if (qtraits<T>::MIN) {
                        const int *bsp = abs_ + ar * (A.K / 16) + (size_t)blk * 16 + 2 * sub;
                        ms[t] = mn[0] * bsp[0] + mn[1] * bsp[1];
                        if (TWO) ms2[t] = mn2[0] * bsp[0] + mn2[1] * bsp[1];
                    }
                }
            }
        }
        if (LPB > 1) {
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int off = 1; off < LPB; off <<= 1) {
                    is[t] += __shfl_xor_sync(0xffffffffu, is[t], off);
                    if (qtraits<T>::MIN) ms[t] += __shfl_xor_sync(0xffffffffu, ms[t], off);
                    if (TWO) {
                        is2[t] += __shfl_xor_sync(0xffffffffu, is2[t], off);
                        if (qtraits<T>::MIN) ms2[t] += __shfl_xor_sync(0xffffffffu, ms2[t], off);
                    }
                }
        }
        if (valid && sub == 0) {
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < nt) {
                    const float da = ad[(size_t)(arow0 + t) * nblk + blk];
                    acc[t] = __fadd_rn(acc[t], block_term<T>(fw, fm, da, is[t], ms[t]));
                    if (TWO) acc2[t] = __fadd_rn(acc2[t], block_term<T>(fw2, fm2, da, is2[t], ms2[t]));
                }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (W == 16) { /* the full warp's first step: the other half held +0.0 */
            acc[t] = __fadd_rn(acc[t], 0.0f);
            if (TWO) acc2[t] = __fadd_rn(acc2[t], 0.0f);
        }
#pragma unroll
        for (int off = W / 2; off >= 1; off >>= 1) {
            acc[t] = __fadd_rn(acc[t], __shfl_xor_sync(0xffffffffu, acc[t], off));
            if (TWO) acc2[t] = __fadd_rn(acc2[t], __shfl_xor_sync(0xffffffffu, acc2[t], off));
        }
    }
    if (lane == 0 && store)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < nt) {
                float *o = out_row(A, P, j0 + t);
                o[row] = DUAL ? silu_mul(acc[t], acc2[t]) : acc[t];
                if (second) o[row + 1] = acc2[t];
            }
}

/* One output row per warp, 4 warps per block. (Two or four rows per warp one after the other,
 * in fewer blocks, measured slower: 35B-A3B decode 300 -> 214 t/s with four; the rows' chains
 * of loads then run one after the other.) W = 16: two rows per warp side by side, one per half
 * (short rows, see mv_q_row), 8 per block. PAIR: two rows per warp computed together (their
 * loads in flight at once, mv_q_row), 8 per block: one token's grouped rows of one iteration
 * (mv_pair_rows), where a row per warp left more warps than the GPU holds at once. */
template <int T, int NT, bool DUAL, int W = 32, bool PAIR = false>
__global__ void __launch_bounds__(128) k_mv_q(mv_args A) {
    constexpr int B = qtraits<T>::B, BYTES = qtraits<T>::BYTES;
    const int warp = threadIdx.x >> 5, wl = threadIdx.x & 31;
    const int lane = W == 16 ? wl & 15 : wl; /* the lane within the row's lanes */
    const mv_part P = mv_pick(A);
    const int64_t row0 = W == 16 || PAIR ? ((int64_t)P.bx * 4 + warp) * 2 : (int64_t)P.bx * 4 + warp;
    const bool live = row0 + (W == 16 ? (wl >> 4) : 0) < P.rows;
    /* a half whose row is past the end computes the last row again (its shuffles need it) */
    const int64_t row = live ? row0 + (W == 16 ? (wl >> 4) : 0) : P.rows - 1;
    if (P.s.table == nullptr && (A.pf & 1) && live)
        mv_prefetch_row<DUAL>(P.s.w + (size_t)row * P.s.row_bytes,
                              DUAL ? A.s2.w + (size_t)row * A.s2.row_bytes : nullptr,
                              (uint32_t)(A.K / B) * BYTES, lane);
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    /* a routed slot whose expert the host computes (cuda_moe_host.cu marks it with id -1) */
    if (P.s.table && !(P.s.extra && (int)blockIdx.y >= P.s.n_tab) && P.s.ids[blockIdx.y] < 0) return;
    if (W == 16 && A.xin) {
        /* the block's one activation row (group blockIdx.y), encoded here by q8k_block, the
         * very function of k_quant_q8k: a warp per 256 values (K <= 512: warps 0 and 1) */
        __shared__ __align__(16) int8_t sq[512];
        __shared__ float sd[2];
        __shared__ int sbs[32];
        const float *xr = A.xin + (size_t)act_row(A.s, blockIdx.y) * A.K;
        if (warp < (int)(A.K / 256)) q8k_block(xr + warp * 256, wl, sq + warp * 256, sd + warp, sbs + warp * 16);
        __syncthreads();
        qact own;
        own.q = sq;
        own.d = sd;
        own.bs = sbs;
        if (row0 < P.rows) mv_q_row<T, NT, DUAL, W>(A, P, row, lane, live, &own); /* warp-uniform */
    } else if (W == 16) {
        if (row0 < P.rows) mv_q_row<T, NT, DUAL, W>(A, P, row, lane, live); /* warp-uniform */
    } else if (live) {
        mv_q_row<T, NT, DUAL, 32, PAIR>(A, P, row, lane);
    }
}

/* One token's products of one input by matrices of two types (k_mv_q's one-row form): matrices
 * 0 .. nm1 - 1 of T1, the rest of T2, both read the same Q8_K activations. Each row is
 * mv_q_row's, so the same bits as the two launches it replaces. A linear-attention layer's
 * input projections (Q6_K qkv, Q4_K z / beta / alpha) and an attention layer's q / k / v are
 * two launches otherwise; here the smaller one's blocks run beside the larger one's. */
template <int T1, int T2>
__global__ void __launch_bounds__(128) k_mv_q_mix(mv_args A) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const mv_part P = mv_pick(A);
    const bool second = blockIdx.x >= A.mboff[A.nm1];
    const int64_t row = (int64_t)P.bx * 4 + warp;
    const bool live = row < P.rows;
    if ((A.pf & 1) && live) {
        const uint32_t len = second ? (uint32_t)(A.K / qtraits<T2>::B) * qtraits<T2>::BYTES
                                    : (uint32_t)(A.K / qtraits<T1>::B) * qtraits<T1>::BYTES;
        mv_prefetch_row<false>(P.s.w + (size_t)row * P.s.row_bytes, nullptr, len, lane);
    }
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    if (!live) return;
    if (second) mv_q_row<T2, 1, false>(A, P, row, lane);
    else mv_q_row<T1, 1, false>(A, P, row, lane);
}

template <int WT> __device__ __forceinline__ float wval(const uint8_t *r, int64_t i) {
    if constexpr (WT == QT_F32) return reinterpret_cast<const float *>(r)[i];
    else if constexpr (WT == QT_F16) return __half2float(reinterpret_cast<const __half *>(r)[i]);
    else return __bfloat162float(reinterpret_cast<const __nv_bfloat16 *>(r)[i]);
}

/* Float weights: one block per output row, its 4 warps on 4 consecutive quarters of K (a
 * decode-sized product is latency-bound: with a warp per row a 2048-wide F32 row took 8.5 us,
 * eight memory round trips; a quarter row is 16 elements per lane, loaded together). Within a
 * quarter lane l sums elements l, l + 32, ... in order, then the butterfly; the quarters' sums
 * are added in quarter order. The order depends on K alone, never on the tokens or the batch. */
template <int WT, int NT, bool DUAL>
__global__ void __launch_bounds__(128) k_mv_f(mv_args A) {
    __shared__ float part[4][NT], part2[4][NT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const mv_part P = mv_pick(A);
    const int64_t row = P.bx;
    /* each warp asks L2 for its quarter of the row (see mv_prefetch_row) */
    const uint32_t esz = WT == QT_F32 ? 4 : 2, qb = (uint32_t)(A.K / 4) * esz;
    const uint32_t qlen = warp == 3 ? (uint32_t)A.K * esz - 3 * qb : qb;
    if (P.s.table == nullptr && (A.pf & 1))
        mv_prefetch_row<DUAL>(P.s.w + (size_t)row * P.s.row_bytes + warp * qb,
                              DUAL ? A.s2.w + (size_t)row * A.s2.row_bytes + warp * qb : nullptr, qlen, lane);
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const int j0 = blockIdx.y * NT;
    const uint8_t *w = row_ptr(P.s, j0, row);
    const uint8_t *w2 = DUAL ? row_ptr(A.s2, j0, row) : nullptr;
    const int arow0 = act_row(A.s, j0);
    const int nt = A.n - j0 < NT ? A.n - j0 : NT;
    const int64_t q = A.K / 4, i_beg = warp * q, i_end = warp == 3 ? A.K : i_beg + q;
    float acc[NT], acc2[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = acc2[t] = 0.0f;
    constexpr int U = NT == 1 ? 16 : 4; /* loads in flight per lane before the adds */
    for (int64_t i0 = i_beg + lane; i0 < i_end; i0 += U * 32) {
        float wv[U], wv2[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t i = i0 + u * 32;
            wv[u] = i < i_end ? wval<WT>(w, i) : 0.0f;
            wv2[u] = DUAL && i < i_end ? wval<WT>(w2, i) : 0.0f;
        }
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < nt) {
                const float *ar = A.a.f + (size_t)(arow0 + t) * A.K;
                float av[U];
#pragma unroll
                for (int u = 0; u < U; u++) av[u] = i0 + u * 32 < i_end ? ar[i0 + u * 32] : 0.0f;
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (i0 + u * 32 < i_end) {
                        acc[t] = __fadd_rn(acc[t], __fmul_rn(wv[u], av[u]));
                        if (DUAL) acc2[t] = __fadd_rn(acc2[t], __fmul_rn(wv2[u], av[u]));
                    }
            }
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1) {
            acc[t] = __fadd_rn(acc[t], __shfl_xor_sync(0xffffffffu, acc[t], off));
            if (DUAL) acc2[t] = __fadd_rn(acc2[t], __shfl_xor_sync(0xffffffffu, acc2[t], off));
        }
    if (lane == 0)
#pragma unroll
        for (int t = 0; t < NT; t++) part[warp][t] = acc[t], part2[warp][t] = acc2[t];
    __syncthreads();
    if (threadIdx.x < nt) {
        const int t = threadIdx.x;
        const float y = __fadd_rn(__fadd_rn(__fadd_rn(part[0][t], part[1][t]), part[2][t]), part[3][t]);
        if (DUAL) {
            const float y2 = __fadd_rn(__fadd_rn(__fadd_rn(part2[0][t], part2[1][t]), part2[2][t]), part2[3][t]);
            out_row(A, P, j0 + t)[row] = silu_mul(y, y2);
        } else {
            out_row(A, P, j0 + t)[row] = y;
        }
    }
}

/* rpb output rows per block: the grid (x) for one matrix, or the block offsets of several */
static unsigned mv_blocks(mv_args &a, unsigned rpb) {
    if (a.nm <= 1) return cdiv((size_t)a.rows, rpb);
    a.mboff[0] = 0;
    for (int m = 0; m < a.nm; m++) a.mboff[m + 1] = a.mboff[m] + cdiv((size_t)a.mrows[m], rpb);
    return a.mboff[a.nm];
}

template <typename K1> static void launch_mv(K1 kern, cuda_backend *c, const mv_args &args, int nt, int rpb = 4) {
    mv_args a = args;
    dim3 grid(mv_blocks(a, (unsigned)rpb), cdiv((size_t)a.n, (size_t)nt));
    pdl_launch(kern, grid, 128, 0, c->stream, a);
    CU_LAUNCH();
}

/* Whether a product takes half a warp per row (k_mv_q W = 16): one token or grouped, no dual,
 * rows of at most half a warp's blocks (of B values). */
static bool mv_half_rows(const cuda_backend *c, int B, int64_t K, bool one_row_group, bool dual) {
    return c->mv_half && !dual && one_row_group && B >= 32 && K / B * 2 <= 32 / (B / 32);
}

/* Whether a product takes two rows per warp (k_mv_q PAIR): one token's grouped (expert) rows,
 * no dual, full-warp rows of one iteration (at most 32 / (B / 32) blocks). The 30B-A3B shape's
 * down product (K = 768, Q6_K: 3 blocks) gave a warp per row to 8 x 2,048 rows, two waves of
 * the GPU's resident warps, each row a single round trip to memory. */
static bool mv_pair_rows(const cuda_backend *c, int B, int64_t K, bool grouped, bool dual, bool half) {
    return c->mv_pair && grouped && !dual && !half && B >= 32 && K / B <= 32 / (B / 32);
}

static int type_block(uint32_t type) { /* values per block of a quantized type; 0: a float type */
    switch (type) {
#define TB_CASE(T)                                                                                 \
    case T: return qtraits<T>::B;
        CUDA_QTYPES(TB_CASE)
#undef TB_CASE
    default: return 0;
    }
}

bool cuda_mv_encodes(const cuda_backend *c, uint32_t type, int64_t K) {
    return c->mv_encode && mv_half_rows(c, type_block(type), K, true, false) && cuda_act_type(type) == QT_Q8_K &&
           K % 256 == 0 && K <= 512;
}

template <int T> static void mv_q(cuda_backend *c, const mv_args &a, bool dual) {
    const bool grouped = a.s.table != nullptr;
    const bool half = mv_half_rows(c, qtraits<T>::B, a.K, grouped || a.n == 1, dual);
    if (a.xin && !half) {
        fprintf(stderr, "sluice: CUDA matvec: in-kernel encoding without half-warp rows\n");
        abort();
    }
    if (grouped || a.n == 1) {
        if (dual) launch_mv(k_mv_q<T, 1, true>, c, a, 1);
        else if (half) launch_mv(k_mv_q<T, 1, false, 16>, c, a, 1, 8);
        else if (!a.xin && mv_pair_rows(c, qtraits<T>::B, a.K, grouped, dual, half))
            launch_mv(k_mv_q<T, 1, false, 32, true>, c, a, 1, 8);
        else launch_mv(k_mv_q<T, 1, false>, c, a, 1);
    } else {
        if (dual) launch_mv(k_mv_q<T, 8, true>, c, a, 8);
        else launch_mv(k_mv_q<T, 8, false>, c, a, 8);
    }
}

template <int WT, int NT, bool DUAL> static void launch_mv_f(cuda_backend *c, const mv_args &args) {
    mv_args a = args;
    dim3 grid(mv_blocks(a, 1), cdiv((size_t)a.n, (size_t)NT));
    pdl_launch(k_mv_f<WT, NT, DUAL>, grid, 128, 0, c->stream, a);
    CU_LAUNCH();
}

template <int WT> static void mv_f(cuda_backend *c, const mv_args &a, bool dual) {
    const bool grouped = a.s.table != nullptr;
    if (grouped || a.n == 1) {
        if (dual) launch_mv_f<WT, 1, true>(c, a);
        else launch_mv_f<WT, 1, false>(c, a);
    } else {
        if (dual) launch_mv_f<WT, 8, true>(c, a);
        else launch_mv_f<WT, 8, false>(c, a);
    }
}

void cuda_matvec(cuda_backend *c, uint32_t type, int64_t K, int64_t rows, const mm_src *s,
                 const mm_src *s2, const qact *a, int n, float *out, int64_t ostride, float *xout,
                 const float *xin) {
    mv_args A;
    A.xout = xout;
    A.xin = xin;
    A.s = *s;
    A.s2 = s2 ? *s2 : *s;
    A.a = *a;
    A.K = K;
    A.rows = rows;
    A.n = n;
    A.out = out;
    A.ostride = ostride;
    A.tb = c->tables;
    A.pf = c->mv_prefetch;
    A.q6s = c->q6_spread;
    A.nm = 0;
    const bool dual = s2 != nullptr;
    switch (type) {
#define MV_CASE(T)                                                                               \
    case T: mv_q<T>(c, A, dual); break;
        CUDA_QTYPES(MV_CASE)
#undef MV_CASE
    case QT_F32: mv_f<QT_F32>(c, A, dual); break;
    case QT_F16: mv_f<QT_F16>(c, A, dual); break;
    case QT_BF16: mv_f<QT_BF16>(c, A, dual); break;
    default:
        fprintf(stderr, "sluice: CUDA matvec: unsupported type %u\n", type);
        abort();
    }
}

/* ---- tiled products ---------------------------------------------------------------------------- */

#define TS 272 /* shared row stride in bytes: 256 values + 16 (conflict-free fragment loads) */

struct tile_args {
    mm_src s;
    mm_groups g;
    bool grouped;
    qact a;
    int64_t K, rows;
    int n;
    float *out;
    int64_t ostride;
    const qtables *tb;
};

__device__ __forceinline__ void mma_s8_16816(int c[4], int a0, int a1, int b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                 "{%7,%7,%7,%7};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b), "r"(0));
}

/* one 32-value chunk: A rows gid / gid + 8, values 4 tig.. and 16 + 4 tig..; B likewise */
__device__ __forceinline__ void mma_s8_16832(int c[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%10,%10,%10,%10};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

/* Four 8 x 16-byte matrices from shared memory (ldmatrix, b16 view): thread t names row t % 8
 * of matrix t / 8 and receives bytes 4 (t % 4) .. + 3 of row t / 4 of each: the int8 MMA
 * fragment layout, one instruction for what took four 32-bit loads. */
__device__ __forceinline__ void ldsm_x4(int r[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* c += A (s8) x B (u8): the low bytes of the activation group sums */
__device__ __forceinline__ void mma_s8u8_16816_acc(int c[4], int a0, int a1, int b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b));
}

/* Fills Arow (activation row per tile column, -1: none) and Orow (output row) for NCOL
 * columns and sets *cols to the columns in use (a prefix); returns the weight base, or nullptr
 * when the block has no tile. */
template <int NCOL>
__device__ __forceinline__ const uint8_t *tile_setup(const tile_args &A, int *Arow, int *Orow, int *cols) {
    const int tid = threadIdx.x;
    if (A.grouped) {
        const int tile = blockIdx.y;
        if (tile >= *A.g.n_tiles) return nullptr;
        const int e = A.g.tile_exp[tile], off = A.g.tile_off[tile], cnt = A.g.tile_cnt[tile];
        if (tid < NCOL) {
            if (tid < cnt) {
                const int ent = A.g.list[off + tid];
                Arow[tid] = ent / A.g.act_div;
                Orow[tid] = ent;
            } else {
                Arow[tid] = Orow[tid] = -1;
            }
        }
        *cols = cnt;
        return A.s.table[e].p[A.s.part];
    }
    const int t0 = blockIdx.y * NCOL;
    if (tid < NCOL) Arow[tid] = Orow[tid] = t0 + tid < A.n ? t0 + tid : -1;
    *cols = A.n - t0 < NCOL ? A.n - t0 : NCOL;
    return A.s.w;
}

/* Shared memory of k_mm_q: two stages of what cp.async brings (raw weight bytes, activation
 * codes in TS-strided rows, activation scales, group sums), then the decoded step: int8
 * weights (TS-strided rows), the weights' integer scales per 16-value group and their mins
 * (int8, 16 per row), float factors, and for types with mins the activations' group sums split
 * into a signed high byte and an unsigned low byte (sum = 256 hi + lo, exact), so that the
 * mins' sums are two tensor-core products. Rows of 16 bytes are conflict-free for fragment
 * loads. */
template <int T, int NCOL> struct tile_smem {
    /* one step's raw weight bytes of a row, from the 16-byte boundary below its start */
    static constexpr int SB = (256 / qtraits<T>::B) * qtraits<T>::BYTES, RAWB = (SB + 15 + 15) / 16 * 16;
    static constexpr int WRAW = 0, AQ = WRAW + 2 * 64 * RAWB, ADS = AQ + 2 * NCOL * TS,
                         BSR = ADS + 2 * NCOL * 9 * 4, WQ = BSR + 2 * NCOL * 16 * 4, WSC = WQ + 64 * TS,
                         WMN = WSC + 64 * 16, WF = WMN + 64 * 16, WFM = WF + 64 * 9 * 4, ABH = WFM + 64 * 4,
                         ABL = ABH + NCOL * 16, AROW = ABL + NCOL * 16, OROW = AROW + NCOL * 4,
                         BYTES = OROW + NCOL * 4;
};

/* 64 weight rows x NCOL (64 or 128) activation rows per block: warps 2 (rows) x NCOL / 32
 * (columns), each 32 x 32 outputs; a warp whose 32 columns are all empty (a short expert
 * tile, the batch's end) skips its products. */
template <int T, int NCOL>
__global__ void __launch_bounds__(2 * NCOL) k_mm_q(tile_args A) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    constexpr int B = qtraits<T>::B, BYTES = qtraits<T>::BYTES, NTHR = 2 * NCOL;
    constexpr bool MIN = qtraits<T>::MIN, SC32 = scale_per_32<T>::value;
    using L = tile_smem<T, NCOL>;
    constexpr int SB = L::SB, RAWB = L::RAWB, NP = RAWB / 16;
    extern __shared__ __align__(16) uint8_t sm[];
    uint8_t *Wraw = sm + L::WRAW;
    int8_t *Wq = (int8_t *)(sm + L::WQ), *Aqs = (int8_t *)(sm + L::AQ);
    int8_t *Wsc = (int8_t *)(sm + L::WSC);
    int8_t *Wmn = (int8_t *)(sm + L::WMN), *Abh = (int8_t *)(sm + L::ABH);
    uint8_t *Abl = (uint8_t *)(sm + L::ABL);
    float *Wf = (float *)(sm + L::WF), *Wfm = (float *)(sm + L::WFM), *Ads = (float *)(sm + L::ADS);
    int *Bsr = (int *)(sm + L::BSR);
    int *Arow = (int *)(sm + L::AROW), *Orow = (int *)(sm + L::OROW);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
    int ncols;
    const uint8_t *wbase = tile_setup<NCOL>(A, Arow, Orow, &ncols);
    if (!wbase) return;
    const int64_t row0 = (int64_t)blockIdx.x * 64;
    const int wm = warp & 1, wn = warp >> 1;
    const bool active = wn * 32 < ncols; /* warp-uniform */
    const size_t rb = A.s.row_bytes;
    const int64_t K = A.K;
    float accf[2][4][4];
    int acci[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) accf[i][j][e] = 0.0f;
    __syncthreads();
    const int nsteps = (int)(K / 256);
    /* Step ks's raw bytes go to stage ks & 1 by cp.async while step ks - 1 is decoded and
     * multiplied: the weight rows' bytes from the 16-byte boundary below their start (the
     * offset within 16 is kept, so the decoders' aligned loads stay aligned; the last piece
     * reads only the row's own bytes), the activation codes straight into their tile, their
     * scales and group sums. Rows past the end and empty columns are not copied / zero-filled. */
    auto issue = [&](int ks) {
        const int st = ks & 1;
        for (int i = tid; i < 64 * NP; i += NTHR) {
            const int r = i / NP, p = i % NP;
            if (row0 + r >= A.rows) continue;
            const uint8_t *a = wbase + (size_t)(row0 + r) * rb + (size_t)ks * SB;
            const uint8_t *a16 = (const uint8_t *)((uintptr_t)a & ~(uintptr_t)15), *src = a16 + 16 * p;
            const int left = (int)(a + SB - src);
            if (left > 0) cp16(Wraw + (st * 64 + r) * RAWB + 16 * p, src, left < 16 ? left : 16);
        }
        int8_t *Aq = Aqs + st * NCOL * TS;
        for (int i = tid; i < NCOL * 16; i += NTHR) {
            const int r = i >> 4, v = i & 15, ar = Arow[r];
            cp16(Aq + r * TS + 16 * v, ar >= 0 ? A.a.q + (size_t)ar * K + (size_t)ks * 256 + 16 * v : A.a.q, ar >= 0 ? 16 : 0);
        }
        float *Ad = Ads + st * NCOL * 9;
        for (int i = tid; i < NCOL * (B == 32 ? 8 : 1); i += NTHR) {
            const int r = B == 32 ? i >> 3 : i, b = B == 32 ? i & 7 : 0, ar = Arow[r];
            const float *src = ar < 0 ? A.a.d : B == 32 ? A.a.d + (size_t)ar * (K / 32) + ks * 8 + b
                                                          : A.a.d + (size_t)ar * (K / 256) + ks;
            cp4(Ad + r * 9 + b, src, ar >= 0 ? 4 : 0);
        }
        if (MIN) {
            int *bs = Bsr + st * NCOL * 16;
            for (int i = tid; i < NCOL * 4; i += NTHR) {
                const int r = i >> 2, v = i & 3, ar = Arow[r];
                cp16(bs + r * 16 + 4 * v, ar >= 0 ? A.a.bs + (size_t)ar * (K / 16) + (size_t)ks * 16 + 4 * v : A.a.bs,
                     ar >= 0 ? 16 : 0);
            }
        }
        cp_commit();
    };
    issue(0);
    for (int ks = 0; ks < nsteps; ks++) {
        const int st = ks & 1;
        if (ks + 1 < nsteps) {
            issue(ks + 1);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const int8_t *Aq = Aqs + st * NCOL * TS;
        const float *Ad = Ads + st * NCOL * 9;
        /* weights: 64 rows x 8 chunks, decoded from the stage */
        for (int i = tid; i < 512; i += NTHR) {
            const int r = i >> 3, cc = i & 7;
            const int64_t grow = row0 + r;
            uint32_t q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int sc[2] = {0, 0}, mn[2] = {0, 0};
            float fw = 0.0f, fm = 0.0f;
            if (grow < A.rows) {
                const uintptr_t a = (uintptr_t)(wbase + (size_t)grow * rb + (size_t)ks * SB);
                const uint8_t *rp = Wraw + (st * 64 + r) * RAWB + (a & 15);
                const uint8_t *bp = B == 256 ? rp : rp + cc * BYTES;
                dchunk<T>(bp, B == 256 ? cc : 0, A.tb, q, sc, mn);
                dfloats<T>(bp, fw, fm);
            }
            uint4 *dst = reinterpret_cast<uint4 *>(Wq + r * TS + cc * 32);
            dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
            dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
            Wsc[r * 16 + 2 * cc] = (int8_t)sc[0]; /* every type's scales fit int8 */
            Wsc[r * 16 + 2 * cc + 1] = (int8_t)sc[1];
            if (MIN) {
                Wmn[r * 16 + 2 * cc] = (int8_t)mn[0];
                Wmn[r * 16 + 2 * cc + 1] = (int8_t)mn[1];
            }
            if (B == 32) {
                Wf[r * 9 + cc] = fw;
            } else if (cc == 0) {
                Wf[r * 9] = fw;
                Wfm[r] = fm;
            }
        }
        if (MIN) {
            const int *bs = Bsr + st * NCOL * 16;
            for (int i = tid; i < NCOL * 16; i += NTHR) {
                const int v = bs[i];
                Abh[i] = (int8_t)(v >> 8); /* |v| <= 16 * 128 */
                Abl[i] = (uint8_t)(v & 255);
            }
        }
        __syncthreads();
        if (!active) {
            __syncthreads();
            continue;
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) acci[i][j][e] = 0;
        /* per 32-value chunk: the fragments by ldmatrix, then one m16n8k32 (one scale per
         * chunk) or two m16n8k16 (a scale per 16 values), each exact sum times its scale */
#pragma unroll 2
        for (int g = 0; g < 8; g++) {
            int a[2][4], s0[2][2], s1[2][2], bq[4][2];
            const int mrow = (lane & 7) + 8 * ((lane >> 3) & 1), mhalf = 16 * (lane >> 4);
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int r = wm * 32 + mt * 16 + gid;
                /* matrices: rows +0..7 / +8..15, values 0..15 / 16..31 of the chunk */
                ldsm_x4(a[mt], Wq + (wm * 32 + mt * 16 + mrow) * TS + g * 32 + mhalf);
#pragma unroll
                for (int h = 0; h < (SC32 ? 1 : 2); h++) {
                    s0[mt][h] = Wsc[r * 16 + 2 * g + h];
                    s1[mt][h] = Wsc[(r + 8) * 16 + 2 * g + h];
                }
            }
#pragma unroll
            for (int np = 0; np < 2; np++) {
                /* matrices: columns of tile 2 np (values 0..15, 16..31), then of 2 np + 1 */
                const int col = wn * 32 + np * 16 + (lane & 7) + 8 * (lane >> 4);
                int b4[4];
                ldsm_x4(b4, Aq + col * TS + g * 32 + 16 * ((lane >> 3) & 1));
                bq[2 * np][0] = b4[0];
                bq[2 * np][1] = b4[1];
                bq[2 * np + 1][0] = b4[2];
                bq[2 * np + 1][1] = b4[3];
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    int c4[4];
                    if constexpr (SC32) {
                        mma_s8_16832(c4, a[mt][0], a[mt][1], a[mt][2], a[mt][3], bq[nt][0], bq[nt][1]);
                        acci[mt][nt][0] += s0[mt][0] * c4[0];
                        acci[mt][nt][1] += s0[mt][0] * c4[1];
                        acci[mt][nt][2] += s1[mt][0] * c4[2];
                        acci[mt][nt][3] += s1[mt][0] * c4[3];
                    } else {
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            mma_s8_16816(c4, a[mt][2 * h], a[mt][2 * h + 1], bq[nt][h]);
                            acci[mt][nt][0] += s0[mt][h] * c4[0];
                            acci[mt][nt][1] += s0[mt][h] * c4[1];
                            acci[mt][nt][2] += s1[mt][h] * c4[2];
                            acci[mt][nt][3] += s1[mt][h] * c4[3];
                        }
                    }
                }
            if (B == 32) { /* a 32-value block ends: its float term */
                static_assert(B == 256 || SC32, "32-value blocks have one scale");
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int nt = 0; nt < 4; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int r = wm * 32 + mt * 16 + gid + (e >= 2 ? 8 : 0);
                            const int col = wn * 32 + nt * 8 + tig * 2 + (e & 1);
                            accf[mt][nt][e] = __fadd_rn(accf[mt][nt][e],
                                                        block_term<T>(Wf[r * 9 + g], 0.0f, Ad[col * 9 + g],
                                                                      acci[mt][nt][e], 0));
                            acci[mt][nt][e] = 0;
                        }
            }
        }
        if (B == 256) {
            /* the mins' sums: sum over the 16 groups of min x group sum, as 256 x (mins . high
             * bytes) + (mins . low bytes) on the tensor cores, exact */
            int msum[2][4][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) msum[mt][nt][e] = 0;
            if (MIN) {
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const int r = wm * 32 + mt * 16 + gid;
                    const int m0 = *reinterpret_cast<const int *>(Wmn + r * 16 + tig * 4);
                    const int m1 = *reinterpret_cast<const int *>(Wmn + (r + 8) * 16 + tig * 4);
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        const int col = wn * 32 + nt * 8 + gid;
                        const int bh = *reinterpret_cast<const int *>(Abh + col * 16 + tig * 4);
                        const int bl = *reinterpret_cast<const int *>(Abl + col * 16 + tig * 4);
                        int c4[4];
                        mma_s8_16816(c4, m0, m1, bh);
#pragma unroll
                        for (int e = 0; e < 4; e++) c4[e] *= 256;
                        mma_s8u8_16816_acc(c4, m0, m1, bl);
#pragma unroll
                        for (int e = 0; e < 4; e++) msum[mt][nt][e] = c4[e];
                    }
                }
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = wm * 32 + mt * 16 + gid + (e >= 2 ? 8 : 0);
                        const int col = wn * 32 + nt * 8 + tig * 2 + (e & 1);
                        accf[mt][nt][e] = __fadd_rn(accf[mt][nt][e],
                                                    block_term<T>(Wf[r * 9], Wfm[r], Ad[col * 9],
                                                                  acci[mt][nt][e], msum[mt][nt][e]));
                    }
        }
        __syncthreads();
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = wm * 32 + mt * 16 + gid + (e >= 2 ? 8 : 0);
                const int col = wn * 32 + nt * 8 + tig * 2 + (e & 1);
                const int64_t grow = row0 + r;
                const int orow = Orow[col];
                if (grow < A.rows && orow >= 0) A.out[(size_t)orow * A.ostride + grow] = accf[mt][nt][e];
            }
}

/* Float weights, tiled on the CUDA cores: 64 x 64 outputs per block of 256 threads (4 x 4
 * each), 32 values of K per step, each output a sequential fused sum over K. */
template <int WT>
__global__ void __launch_bounds__(256) k_mm_f(tile_args A) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    __shared__ float Ws[64][33], As[64][33];
    __shared__ int Arow[64], Orow[64];
    int ncols;
    const uint8_t *wbase = tile_setup<64>(A, Arow, Orow, &ncols);
    if (!wbase) return;
    const int tid = threadIdx.x, tr = tid >> 4, tc = tid & 15;
    const int64_t row0 = (int64_t)blockIdx.x * 64;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    __syncthreads();
    for (int64_t k0 = 0; k0 < A.K; k0 += 32) {
        for (int i = tid; i < 64 * 32; i += 256) {
            const int r = i >> 5, kk = i & 31;
            const int64_t grow = row0 + r, k = k0 + kk;
            Ws[r][kk] = grow < A.rows && k < A.K ? wval<WT>(wbase + (size_t)grow * A.s.row_bytes, k) : 0.0f;
            const int ar = Arow[r];
            As[r][kk] = ar >= 0 && k < A.K ? A.a.f[(size_t)ar * A.K + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < 32; kk++) {
            float wv[4], av[4];
#pragma unroll
            for (int i = 0; i < 4; i++) wv[i] = Ws[tr + 16 * i][kk];
#pragma unroll
            for (int j = 0; j < 4; j++) av[j] = As[tc + 16 * j][kk];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = __fmaf_rn(wv[i], av[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t grow = row0 + tr + 16 * i;
            const int orow = Orow[tc + 16 * j];
            if (grow < A.rows && orow >= 0) A.out[(size_t)orow * A.ostride + grow] = acc[i][j];
        }
}

template <int T, int NCOL> static void mm_q(cuda_backend *c, const tile_args &a, unsigned gy) {
    static bool attr = false;
    if (!attr) {
        CU(cudaFuncSetAttribute(k_mm_q<T, NCOL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                tile_smem<T, NCOL>::BYTES));
        attr = true;
    }
    dim3 grid(cdiv((size_t)a.rows, 64), gy);
    pdl_launch(k_mm_q<T, NCOL>, grid, 2 * NCOL, tile_smem<T, NCOL>::BYTES, c->stream, a);
    CU_LAUNCH();
}

template <int WT> static void mm_f(cuda_backend *c, const tile_args &a, unsigned gy) {
    dim3 grid(cdiv((size_t)a.rows, 64), gy);
    pdl_launch(k_mm_f<WT>, grid, 256, 0, c->stream, a);
    CU_LAUNCH();
}

void cuda_matmul_tiled(cuda_backend *c, uint32_t type, int64_t K, int64_t rows, const mm_src *s,
                       const mm_groups *g, const qact *a, int n, float *out, int64_t ostride) {
    tile_args A;
    memset(&A, 0, sizeof A);
    A.s = *s;
    if (g) A.g = *g;
    A.grouped = g != nullptr;
    A.a = *a;
    A.K = K;
    A.rows = rows;
    A.n = n;
    A.out = out;
    A.ostride = ostride;
    A.tb = c->tables;
    /* dense quantized products of 128+ rows: 128 activation rows per block (the weights are
     * decoded once for twice the columns); expert tiles (64 entries) and float weights: 64 */
    const int ncol = !is_float_type(type) && !g && n >= 128 && !c->mm_cols64 ? 128 : 64;
    const unsigned gy = g ? (unsigned)g->max_tiles : cdiv((size_t)n, (size_t)ncol);
    if (gy == 0) return;
    switch (type) {
#define MM_CASE(T)                                                                               \
    case T: if (ncol == 128) mm_q<T, 128>(c, A, gy); else mm_q<T, 64>(c, A, gy); break;
        CUDA_QTYPES(MM_CASE)
#undef MM_CASE
    case QT_F32: mm_f<QT_F32>(c, A, gy); break;
    case QT_F16: mm_f<QT_F16>(c, A, gy); break;
    case QT_BF16: mm_f<QT_BF16>(c, A, gy); break;
    default:
        fprintf(stderr, "sluice: CUDA tiled matmul: unsupported type %u\n", type);
        abort();
    }
}

/* Tiled when there are enough rows to share a tile and the quantized path's 256-value steps
 * fit the row length. */
static bool use_tiled(uint32_t type, int64_t K, int n) {
    if (n <= 8) return false;
    return is_float_type(type) || K % 256 == 0;
}

/* ---- ops --------------------------------------------------------------------------------------- */

static void check_type(const tview *w) {
    if (!cuda_type_supported(w->type)) {
        fprintf(stderr, "sluice: the CUDA backend has no kernels for %s ('%s')\n",
                quant_type_name(w->type), w->name ? w->name : "?");
        abort();
    }
}

void cuda_op_matmul(backend *b, const tview *w, const float *x, int n, float *out, int out_stride) {
    cuda_backend *c = CB(b);
    check_type(w);
    cuda_prof_begin(c);
    const int64_t K = w->ne[0], rows = w->ne[1];
    mm_src s;
    memset(&s, 0, sizeof s);
    s.w = (const uint8_t *)cuda_weight(c, w->data, w->row_bytes * (size_t)rows);
    s.row_bytes = w->row_bytes;
    s.act_div = 1;
    qact a = cuda_act(c, x, n, K, w->type);
    if (a.act == QT_F32) a.f = x;
    if (use_tiled(w->type, K, n)) cuda_matmul_tiled(c, w->type, K, rows, &s, nullptr, &a, n, out, out_stride);
    else cuda_matvec(c, w->type, K, rows, &s, nullptr, &a, n, out, out_stride);
    cuda_act_invalidate_range(c, out, (size_t)n * out_stride * sizeof(float));
    cuda_prof_end(c, n == 1 ? "matmul (1 row)" : n <= 8 ? "matmul (<= 8 rows)" : "matmul (tiled)");
}

/* Products of one input by several matrices: runs of the same type and width that take the
 * matrix-vector path go out as one launch (each row computed exactly as alone); the rest one
 * by one. A decode step's layer input meets 2-4 such matrices (the linear-attention input
 * projections, q/k/v, the router and the shared expert's gate), each launch ~3-5 us. */
/* The nw matrices of one launch (matrix m: w[m] into out[m]); the first is also the plain one. */
static void mv_set_matrices(cuda_backend *c, mv_args &A, int nw, const tview *const *w, float *const *out) {
    A.nm = nw;
    for (int m = 0; m < nw; m++) {
        A.mw[m] = (const uint8_t *)cuda_weight(c, w[m]->data, w[m]->row_bytes * (size_t)w[m]->ne[1]);
        A.mrows[m] = w[m]->ne[1];
        A.mout[m] = out[m];
        A.mrb[m] = (uint32_t)w[m]->row_bytes;
    }
    A.s.w = A.mw[0];
    A.rows = A.mrows[0];
    A.out = A.mout[0];
    A.ostride = A.mrows[0];
}

/* The K-quant type pairs k_mv_q_mix is built for. */
#define MV_MIX_PAIRS(F)                                                                          \
    F(QT_Q4_K, QT_Q6_K) F(QT_Q6_K, QT_Q4_K) F(QT_Q4_K, QT_Q5_K) F(QT_Q5_K, QT_Q4_K) F(QT_Q5_K, QT_Q6_K) \
        F(QT_Q6_K, QT_Q5_K)

/* One token's products by matrices of exactly two types (a run of each, in that order), of one
 * width, in one k_mv_q_mix launch; false: not this case (nothing launched). */
static bool mv_mixed(cuda_backend *c, int nw, const tview *const *w, const float *x, float *const *out) {
    if (!c->mv_mix || nw < 2 || nw > MV_MULTI_MAX) return false;
    const uint32_t t1 = w[0]->type;
    int i1 = 1;
    while (i1 < nw && w[i1]->type == t1) i1++;
    if (i1 == nw) return false;
    const uint32_t t2 = w[i1]->type;
    const int64_t K = w[0]->ne[0];
    for (int k = 0; k < nw; k++)
        if (w[k]->ne[0] != K || w[k]->type != (k < i1 ? t1 : t2)) return false;
    bool pair = false;
#define MIX_OK(A1, A2) pair = pair || (t1 == (uint32_t)(A1) && t2 == (uint32_t)(A2));
    MV_MIX_PAIRS(MIX_OK)
#undef MIX_OK
    if (!pair || cuda_act_type(t1) != cuda_act_type(t2) || K % 256 ||
        mv_half_rows(c, type_block(t1), K, true, false) || mv_half_rows(c, type_block(t2), K, true, false))
        return false;
    cuda_prof_begin(c);
    mv_args A;
    memset(&A, 0, sizeof A);
    A.s.row_bytes = w[0]->row_bytes;
    A.s.act_div = 1;
    A.s2 = A.s;
    A.a = cuda_act(c, x, 1, K, t1);
    A.K = K;
    A.n = 1;
    A.tb = c->tables;
    A.pf = c->mv_prefetch;
    A.q6s = c->q6_spread;
    mv_set_matrices(c, A, nw, w, out);
    A.nm1 = i1;
    const dim3 grid(mv_blocks(A, 4), 1);
#define MIX_LAUNCH(A1, A2)                                                                       \
    if (t1 == (uint32_t)(A1) && t2 == (uint32_t)(A2)) pdl_launch(k_mv_q_mix<A1, A2>, grid, 128, 0, c->stream, A);
    MV_MIX_PAIRS(MIX_LAUNCH)
#undef MIX_LAUNCH
    CU_LAUNCH();
    for (int m = 0; m < nw; m++) cuda_act_invalidate_range(c, out[m], (size_t)w[m]->ne[1] * sizeof(float));
    cuda_prof_end(c, "matmul (1 row, two types)");
    return true;
}

void cuda_op_matmul_multi(backend *b, int nw, const tview *const *w, const float *x, int n,
                          float *const *out) {
    cuda_backend *c = CB(b);
    if (n == 1) {
        for (int k = 0; k < nw; k++) check_type(w[k]);
        if (mv_mixed(c, nw, w, x, out)) return;
    }
    for (int i = 0; i < nw;) {
        const int64_t K = w[i]->ne[0];
        int j = i + 1;
        while (j < nw && j - i < MV_MULTI_MAX && w[j]->type == w[i]->type && w[j]->ne[0] == K &&
               w[j]->row_bytes == w[i]->row_bytes)
            j++;
        if (j - i == 1 || use_tiled(w[i]->type, K, n)) {
            for (; i < j; i++) cuda_op_matmul(b, w[i], x, n, out[i], (int)w[i]->ne[1]);
            continue;
        }
        for (int k = i; k < j; k++) check_type(w[k]);
        cuda_prof_begin(c);
        mv_args A;
        memset(&A, 0, sizeof A);
        A.s.row_bytes = w[i]->row_bytes;
        A.s.act_div = 1;
        A.s2 = A.s;
        A.a = cuda_act(c, x, n, K, w[i]->type);
        if (A.a.act == QT_F32) A.a.f = x;
        A.K = K;
        A.n = n;
        A.tb = c->tables;
        A.pf = c->mv_prefetch;
        A.q6s = c->q6_spread;
        mv_set_matrices(c, A, j - i, w + i, out + i);
        switch (w[i]->type) {
#define MV_CASE(T)                                                                               \
    case T: mv_q<T>(c, A, false); break;
            CUDA_QTYPES(MV_CASE)
#undef MV_CASE
        case QT_F32: mv_f<QT_F32>(c, A, false); break;
        case QT_F16: mv_f<QT_F16>(c, A, false); break;
        case QT_BF16: mv_f<QT_BF16>(c, A, false); break;
        default: abort(); /* check_type refused it */
        }
        for (int k = i; k < j; k++)
            cuda_act_invalidate_range(c, out[k], (size_t)n * (size_t)w[k]->ne[1] * sizeof(float));
        cuda_prof_end(c, n == 1 ? "matmul (1 row, several)" : "matmul (<= 8 rows, several)");
        i = j;
    }
}

void cuda_op_matmul_swiglu(backend *b, const tview *gate, const tview *up, const float *x, int n,
                           float *out) {
    cuda_backend *c = CB(b);
    check_type(gate);
    check_type(up);
    const int64_t K = gate->ne[0], rows = gate->ne[1];
    const bool same = gate->type == up->type && gate->row_bytes == up->row_bytes;
    if (same && !use_tiled(gate->type, K, n)) {
        cuda_prof_begin(c);
        mm_src s, s2;
        memset(&s, 0, sizeof s);
        s.w = (const uint8_t *)cuda_weight(c, gate->data, gate->row_bytes * (size_t)rows);
        s.row_bytes = gate->row_bytes;
        s.act_div = 1;
        s2 = s;
        s2.w = (const uint8_t *)cuda_weight(c, up->data, up->row_bytes * (size_t)rows);
        qact a = cuda_act(c, x, n, K, gate->type);
        if (a.act == QT_F32) a.f = x;
        cuda_matvec(c, gate->type, K, rows, &s, &s2, &a, n, out, rows);
        cuda_act_invalidate_range(c, out, (size_t)n * rows * sizeof(float));
        cuda_prof_end(c, "matmul_swiglu (fused)");
        return;
    }
    /* the two products into scratch, then out = silu(g) * u (the same values) */
    float *gbuf = (float *)cuda_scratch(c, SCR_TMP, 2 * (size_t)n * rows * sizeof(float));
    float *ubuf = gbuf + (size_t)n * rows;
    cuda_op_matmul(b, gate, x, n, gbuf, (int)rows);
    cuda_op_matmul(b, up, x, n, ubuf, (int)rows);
    cuda_prof_begin(c);
    cuda_swiglu_rows(c, gbuf, ubuf, (size_t)n * rows, out);
    cuda_act_invalidate_range(c, out, (size_t)n * rows * sizeof(float));
    cuda_prof_end(c, "swiglu");
}

/* ---- embedding rows ---------------------------------------------------------------------------- */

template <int T>
__global__ void k_embed_q(const uint8_t *w, size_t row_bytes, const int32_t *ids, int64_t E,
                          float *out, const qtables *tb) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const int t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= E) return;
    out[(size_t)t * E + i] = dequant_value<T>(w + (size_t)ids[t] * row_bytes, i, tb);
}

template <int WT>
__global__ void k_embed_f(const uint8_t *w, size_t row_bytes, const int32_t *ids, int64_t E, float *out) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const int t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= E) return;
    out[(size_t)t * E + i] = wval<WT>(w + (size_t)ids[t] * row_bytes, i);
}

static void embed_launch(cuda_backend *c, uint32_t type, const uint8_t *w, size_t rb,
                         const int32_t *ids, int n, int64_t E, float *out) {
    dim3 grid(cdiv((size_t)E, 256), n);
    switch (type) {
#define EM_CASE(T)                                                                               \
    case T: pdl_launch(k_embed_q<T>, grid, 256, 0, c->stream, w, rb, ids, E, out, c->tables); break;
        CUDA_QTYPES(EM_CASE)
#undef EM_CASE
    case QT_F32: pdl_launch(k_embed_f<QT_F32>, grid, 256, 0, c->stream, w, rb, ids, E, out); break;
    case QT_F16: pdl_launch(k_embed_f<QT_F16>, grid, 256, 0, c->stream, w, rb, ids, E, out); break;
    case QT_BF16: pdl_launch(k_embed_f<QT_BF16>, grid, 256, 0, c->stream, w, rb, ids, E, out); break;
    default: abort();
    }
    CU_LAUNCH();
}

void cuda_op_embed(backend *b, const tview *w, const int32_t *ids, int n, float *out) {
    cuda_backend *c = CB(b);
    check_type(w);
    cuda_prof_begin(c);
    embed_launch(c, w->type, (const uint8_t *)cuda_weight(c, w->data, w->row_bytes * (size_t)w->ne[1]),
                 w->row_bytes, ids, n, w->ne[0], out);
    cuda_act_invalidate_range(c, out, (size_t)n * w->ne[0] * sizeof(float));
    cuda_prof_end(c, "embed");
}

/* ---- self-test hook ----------------------------------------------------------------------------- */

int backend_cuda_selftest_row(backend *b, uint32_t type, const void *row, int64_t K, const float *x,
                              float *deq, float *dot) {
    cuda_backend *c = CB(b);
    if (!cuda_type_supported(type)) return -1;
    const size_t rb = quant_row_bytes(type, K);
    uint8_t *buf = (uint8_t *)cuda_scratch(c, SCR_TMP, al256(rb) + 3 * al256((size_t)K * 4) + 1024);
    uint8_t *dw = buf;
    float *dx = (float *)(buf + al256(rb)), *dd = dx + al256((size_t)K * 4) / 4;
    float *dout = dd + al256((size_t)K * 4) / 4;
    int32_t *did = (int32_t *)(dout + 64);
    const int32_t zero = 0;
    CU(cudaMemcpyAsync(dw, row, rb, cudaMemcpyHostToDevice, c->stream));
    CU(cudaMemcpyAsync(dx, x, (size_t)K * 4, cudaMemcpyHostToDevice, c->stream));
    CU(cudaMemcpyAsync(did, &zero, 4, cudaMemcpyHostToDevice, c->stream));
    cuda_act_invalidate(c);
    embed_launch(c, type, dw, rb, did, 1, K, dd);
    mm_src s;
    memset(&s, 0, sizeof s);
    s.w = dw;
    s.row_bytes = rb;
    s.act_div = 1;
    qact a = cuda_act(c, dx, 1, K, type);
    if (a.act == QT_F32) a.f = dx;
    cuda_matvec(c, type, K, 1, &s, nullptr, &a, 1, dout, 1);
    CU(cudaMemcpyAsync(deq, dd, (size_t)K * 4, cudaMemcpyDeviceToHost, c->stream));
    CU(cudaMemcpyAsync(dot, dout, 4, cudaMemcpyDeviceToHost, c->stream));
    CU(cudaStreamSynchronize(c->stream));
    cuda_act_invalidate(c);
    return 0;
}
