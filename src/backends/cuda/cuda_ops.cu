/* CUDA backend: norms, RoPE, element-wise gates, the KV store and row copies, and the
 * linear-attention (Gated DeltaNet) operations (attention: cuda_attention.cu).
 *
 * Where the CPU's float steps are cheap to repeat they are repeated exactly (explicitly rounded
 * multiplies and adds, no contraction): RMSNorm sums squares in double and scales as the CPU,
 * RoPE takes the CPU's angle recipe (theta_scale computed on the host), the gates and the conv
 * use the CPU's formulas. The delta rule reorders sums (one thread cannot own a whole row
 * there); every reduction has a fixed order, so results never depend on timing. */
#include <cmath>
#include <cstring>

#include "backends/cuda/cuda_internal.cuh"
#include "backends/silu_fixed.h"

KTRACE_TU(ops) /* the kernel trace buffer of this file's kernels (cuda_ktrace.cu) */

/* silu(g) * u, rounded as the CPU rounds it (swiglu, and the fused gated norm), with the fixed
 * exponential that the host reproduces (backends/silu_fixed.h) */
__device__ __forceinline__ float silu_mul_f(float g, float u) { return silu_fixed_mul(g, u); }

/* ---- rmsnorm / l2norm -------------------------------------------------------------------------- */

/* One block of NT threads per row, NT chosen from the row width alone (never from the number of
 * rows), so a row's bits do not depend on the batch it is in. Squares are summed in double:
 * thread t takes elements t, t + NT, ... (loads unrolled so they are in flight together: a
 * single 2048-wide row was latency-bound at 27 us with one warp and a serial loop), then a fixed
 * butterfly per warp, then the warps' sums in warp order. */
template <bool L2, int NT>
__global__ void __launch_bounds__(NT) k_norm(const float *x, const float *w, int dim, float eps, float *y) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    constexpr int NW = NT / 32;
    __shared__ double part[NW];
    __shared__ float scale_s;
    const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float *xr = x + (size_t)row * dim;
    double s = 0.0;
    int i = tid;
    for (; i + 3 * NT < dim; i += 4 * NT) {
        const float v0 = xr[i], v1 = xr[i + NT], v2 = xr[i + 2 * NT], v3 = xr[i + 3 * NT];
        s += (double)__fmul_rn(v0, v0);
        s += (double)__fmul_rn(v1, v1);
        s += (double)__fmul_rn(v2, v2);
        s += (double)__fmul_rn(v3, v3);
    }
    for (; i < dim; i += NT) {
        const float v = xr[i];
        s += (double)__fmul_rn(v, v);
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) part[warp] = s;
    __syncthreads();
    if (tid == 0) {
        double t = part[0];
#pragma unroll
        for (int k = 1; k < NW; k++) t += part[k];
        float sc;
        if (L2) sc = __fdiv_rn(1.0f, fmaxf(__fsqrt_rn((float)t), eps));
        else sc = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(t / dim), eps)));
        scale_s = sc;
    }
    __syncthreads();
    const float scale = scale_s;
    float *yr = y + (size_t)row * dim;
    for (int j = tid; j < dim; j += NT) {
        const float v = __fmul_rn(xr[j], scale);
        yr[j] = w ? __fmul_rn(v, w[j]) : v;
    }

}

/* Rows of a width that is a multiple of 256 (the model width): dim / 8 threads per row, thread
 * t holding elements 8t .. 8t + 7 in registers from one pair of 16-byte loads (and the weights
 * with them), so warp w holds exactly Q8_K block w and can encode it without reading the row
 * back. Squares are summed in double per thread in element order, then the fixed butterfly,
 * then the warps' sums in warp order. The layout depends on dim alone, so a row gives the same
 * bits in any batch. */
__global__ void __launch_bounds__(1024) k_norm8(const float *x, float *add, float *s_, const float *g, float *xo,
                                                const float *w, int dim, float eps, float *y, int8_t *q, float *qd,
                                                int *qbs) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    __shared__ double part[32];
    __shared__ float scale_s;
    const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const float *xr = x + (size_t)row * dim + 8 * tid;
    float v[8], wv[8];
    {
        const float4 a = *reinterpret_cast<const float4 *>(xr), b = *reinterpret_cast<const float4 *>(xr + 4);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    }
    if (add) { /* the residual add first (add_rmsnorm): x = x + add, k_add's sum, written back */
        float *ar = add + (size_t)row * dim + 8 * tid;
        const float4 a = *reinterpret_cast<const float4 *>(ar), b = *reinterpret_cast<const float4 *>(ar + 4);
        float av[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        if (s_) { /* moe_tail's steps first: s = s * sigmoid(g), add += s (both written back) */
            float *sr = s_ + (size_t)row * dim + 8 * tid;
            const float gate = sigmoidf_(g[row]);
            const float4 c = *reinterpret_cast<const float4 *>(sr), d = *reinterpret_cast<const float4 *>(sr + 4);
            float sv[8] = {c.x, c.y, c.z, c.w, d.x, d.y, d.z, d.w};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                sv[j] = __fmul_rn(sv[j], gate);
                av[j] = __fadd_rn(av[j], sv[j]);
            }
            *reinterpret_cast<float4 *>(sr) = make_float4(sv[0], sv[1], sv[2], sv[3]);
            *reinterpret_cast<float4 *>(sr + 4) = make_float4(sv[4], sv[5], sv[6], sv[7]);
            *reinterpret_cast<float4 *>(ar) = make_float4(av[0], av[1], av[2], av[3]);
            *reinterpret_cast<float4 *>(ar + 4) = make_float4(av[4], av[5], av[6], av[7]);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = __fadd_rn(v[j], av[j]);
        float *xw = xo + (size_t)row * dim + 8 * tid;
        *reinterpret_cast<float4 *>(xw) = make_float4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<float4 *>(xw + 4) = make_float4(v[4], v[5], v[6], v[7]);
    }
    if (w) {
        const float4 a = *reinterpret_cast<const float4 *>(w + 8 * tid), b = *reinterpret_cast<const float4 *>(w + 8 * tid + 4);
        wv[0] = a.x; wv[1] = a.y; wv[2] = a.z; wv[3] = a.w; wv[4] = b.x; wv[5] = b.y; wv[6] = b.z; wv[7] = b.w;
    }
    double s = 0.0;
#pragma unroll
    for (int j = 0; j < 8; j++) s += (double)__fmul_rn(v[j], v[j]);
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) part[warp] = s;
    __syncthreads();
    if (tid == 0) {
        double t = part[0];
        for (int k = 1; k < nw; k++) t += part[k];
        scale_s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(t / dim), eps)));
    }
    __syncthreads();
    const float scale = scale_s;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        v[j] = __fmul_rn(v[j], scale);
        if (w) v[j] = __fmul_rn(v[j], wv[j]);
    }
    float *yr = y + (size_t)row * dim + 8 * tid;
    *reinterpret_cast<float4 *>(yr) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4 *>(yr + 4) = make_float4(v[4], v[5], v[6], v[7]);
    if (q) { /* the Q8_K encoding of the row for the matrix product that follows */
        const size_t blk = (size_t)row * nw + warp;
        q8k_block_regs(v, lane, q + blk * 256, qd + blk, qbs + blk * 16);
    }
}

/* Rows this short and this few (a decode step) also get their Q8_K encoding from the norm
 * kernel: the encoder's own launch was ~3 us of a ~130 us layer, twice per layer. */
#define NORM_ENCODE_MAX_ROWS 8

/* add (add_rmsnorm): x += add first, in the register form only; false when that form does not
 * apply (nothing launched) */
template <bool L2>
static bool launch_norm(cuda_backend *c, const float *x, const float *w, int n_rows, int dim, float eps,
                        float *y, float *add_x = nullptr, float *add = nullptr, float *s = nullptr,
                        const float *g = nullptr) {
    if (n_rows <= 0) return true;
    /* the register form needs 16-byte aligned rows (every buffer here is device memory from
     * cudaMalloc or a 256-byte aligned weight upload) */
    const bool aligned = ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y) |
                           reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(add) |
                           reinterpret_cast<uintptr_t>(s)) & 15) == 0;
    const bool reg = !L2 && dim % 256 == 0 && dim / 8 <= 1024 && aligned;
    if (add && !reg) return false;
    if (add) cuda_act_invalidate_range(c, add_x, (size_t)n_rows * dim * sizeof(float));
    if (s) {
        cuda_act_invalidate_range(c, add, (size_t)n_rows * dim * sizeof(float));
        cuda_act_invalidate_range(c, s, (size_t)n_rows * dim * sizeof(float));
    }
    cuda_act_invalidate_range(c, y, (size_t)n_rows * dim * sizeof(float));
    if (reg) {
        int8_t *q = nullptr;
        float *qd = nullptr;
        int *qbs = nullptr;
        if (n_rows <= NORM_ENCODE_MAX_ROWS) {
            const qact a = cuda_act_reserve(c, y, n_rows, dim, QT_Q8_K);
            q = (int8_t *)a.q;
            qd = (float *)a.d;
            qbs = (int *)a.bs;
        }
        pdl_launch(k_norm8, n_rows, dim / 8, 0, c->stream, x, add, s, g, add_x, w, dim, eps, y, q, qd, qbs);
        CU_LAUNCH();
        return true;
    }
    if (dim >= 1024) pdl_launch(k_norm<L2, 256>, n_rows, 256, 0, c->stream, x, w, dim, eps, y);
    else if (dim >= 256) pdl_launch(k_norm<L2, 64>, n_rows, 64, 0, c->stream, x, w, dim, eps, y);
    else pdl_launch(k_norm<L2, 32>, n_rows, 32, 0, c->stream, x, w, dim, eps, y);
    CU_LAUNCH();
    return true;
}

bool cuda_op_add_rmsnorm(backend *b, float *x, const float *a, const tview *w, int n_rows, int dim, float eps,
                         float *y) {
    cuda_backend *c = CB(b);
    if (c->no_add_norm) return false;
    cuda_prof_begin(c);
    const float *wd = w && w->data ? (const float *)cuda_weight(c, w->data, (size_t)dim * sizeof(float)) : nullptr;
    const bool done = launch_norm<false>(c, x, wd, n_rows, dim, eps, y, x, const_cast<float *>(a));
    cuda_prof_end(c, "add + rmsnorm");
    return done;
}

/* moe_tail then the next layer's input norm in k_norm8 (the tail's steps in its prologue, each
 * rounded as k_moe_tail rounds it): the end of a MoE layer and the start of the next were two
 * launches. Without s (no shared expert) it is add_rmsnorm with y as the addend. */
bool cuda_op_moe_tail_rmsnorm(backend *b, float *x, float *y, float *s, const float *g, int n_rows, int dim,
                              const tview *w, float eps, float *out) {
    cuda_backend *c = CB(b);
    if (c->no_tail_norm) return false;
    cuda_prof_begin(c);
    const float *wd = w && w->data ? (const float *)cuda_weight(c, w->data, (size_t)dim * sizeof(float)) : nullptr;
    const bool done = launch_norm<false>(c, x, wd, n_rows, dim, eps, out, x, y, s, s ? g : nullptr);
    cuda_prof_end(c, "moe_tail + rmsnorm");
    return done;
}

/* rmsnorm then swiglu (the gated norm of a linear-attention layer's output) for rows of 64 or
 * 128 values, and the Q8_K encoding of the gated result for the output product: one block per
 * 256 values, a warp per row doing k_norm<false, 32>'s arithmetic (elements lane + 32 j, the
 * same double sums), then swiglu's silu_mul_f, then warp 0 encodes the block with
 * q8k_block_regs, as k_quant_q8k does. Three launches of a decode step's linear-attention
 * layer (2.5 + 1.4 + 1.7 us, kernel trace of 2026-11-30) become one. */
template <int DIM>
__global__ void __launch_bounds__(256 / DIM * 32) k_norm_swiglu(float *x, const float *w, float eps, float *g,
                                                                int8_t *q, float *qd, int *qbs) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    constexpr int PER = DIM / 32;
    __shared__ __align__(16) float gs[256];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * (256 / DIM) + warp;
    float *xr = x + row * DIM, *gr = g + row * DIM;
    float v[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) v[j] = xr[lane + 32 * j];
    const float scale = warp_rms_scale(v, DIM, eps);
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int e = lane + 32 * j;
        float y = __fmul_rn(v[j], scale);
        if (w) y = __fmul_rn(y, w[e]);
        xr[e] = y;
        const float o = silu_mul_f(gr[e], y);
        gr[e] = o;
        gs[warp * DIM + e] = o;
    }
    if (!q) return;
    __syncthreads();
    if (warp == 0) {
        float b[8];
#pragma unroll
        for (int j = 0; j < 8; j++) b[j] = gs[lane * 8 + j];
        q8k_block_regs(b, lane, q + (size_t)blockIdx.x * 256, qd + blockIdx.x, qbs + (size_t)blockIdx.x * 16);
    }
}

#define NORM_SWIGLU_ENCODE 16384

bool cuda_op_rmsnorm_swiglu(backend *b, float *x, const tview *w, int n_rows, int dim, float eps, float *g) {
    cuda_backend *c = CB(b);
    const size_t total = (size_t)n_rows * dim;
    if (!c->norm_swiglu || (dim != 64 && dim != 128) || total % 256) return false;
    cuda_prof_begin(c);
    const float *wd = w && w->data ? (const float *)cuda_weight(c, w->data, (size_t)dim * sizeof(float)) : nullptr;
    cuda_act_invalidate_range(c, x, total * sizeof(float));
    cuda_act_invalidate_range(c, g, total * sizeof(float));
    /* One token's gated values (up to NORM_SWIGLU_ENCODE values) get their Q8_K encoding here,
     * as one row: the output product reads them as one row of that width. */
    int8_t *q = nullptr;
    float *qd = nullptr;
    int *qbs = nullptr;
    if (total <= NORM_SWIGLU_ENCODE) {
        const qact a = cuda_act_reserve(c, g, 1, (int64_t)total, QT_Q8_K);
        q = (int8_t *)a.q;
        qd = (float *)a.d;
        qbs = (int *)a.bs;
    }
    const unsigned blocks = (unsigned)(total / 256);
    if (dim == 64) pdl_launch(k_norm_swiglu<64>, blocks, 128, 0, c->stream, x, wd, eps, g, q, qd, qbs);
    else pdl_launch(k_norm_swiglu<128>, blocks, 64, 0, c->stream, x, wd, eps, g, q, qd, qbs);
    CU_LAUNCH();
    cuda_prof_end(c, "rmsnorm + swiglu");
    return true;
}

void cuda_op_rmsnorm(backend *b, const float *x, const tview *w, int n_rows, int dim, float eps,
                     float *y) {
    cuda_backend *c = CB(b);
    cuda_prof_begin(c);
    const float *wd = w && w->data ? (const float *)cuda_weight(c, w->data, (size_t)dim * sizeof(float)) : nullptr;
    launch_norm<false>(c, x, wd, n_rows, dim, eps, y);
    cuda_prof_end(c, "rmsnorm");
}

void cuda_op_l2norm(backend *b, const float *x, int n_rows, int dim, float eps, float *y) {
    cuda_backend *c = CB(b);
    cuda_prof_begin(c);
    launch_norm<true>(c, x, nullptr, n_rows, dim, eps, y);
    cuda_prof_end(c, "l2norm");
}

/* ---- rope -------------------------------------------------------------------------------------- */

__global__ void k_rope(float *x, int n_tok, int n_head, int head_dim, int n_rot, const int32_t *pos,
                       float theta_scale, int neox) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const int half = n_rot / 2;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n_tok * n_head * half) return;
    const int i = (int)(idx % half);
    const int64_t th = idx / half;
    const int t = (int)(th / n_head);
    float *v = x + th * head_dim;
    int i0, i1;
    rope_dims(i, half, neox, &i0, &i1);
    rope_rotate(i, (float)pos[t], theta_scale, v[i0], v[i1], &v[i0], &v[i1]);
}

void cuda_op_rope(backend *b, float *x, int n_tok, int n_head, int head_dim, int n_rot,
                  const int32_t *pos, float freq_base, rope_mode mode) {
    cuda_backend *c = CB(b);
    cuda_prof_begin(c);
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot); /* the CPU's value */
    const int64_t total = (int64_t)n_tok * n_head * (n_rot / 2);
    pdl_launch(k_rope, cdiv(total, 256), 256, 0, c->stream, x, n_tok, n_head, head_dim, n_rot, pos, theta_scale,
                                                    mode == ROPE_NEOX);
    CU_LAUNCH();
    cuda_act_invalidate_range(c, x, (size_t)n_tok * n_head * head_dim * sizeof(float));
    cuda_prof_end(c, "rope");
}

/* ---- element-wise ------------------------------------------------------------------------------- */

__global__ void k_add(float *x, const float *y, size_t n) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

__global__ void k_swiglu(const float *g, const float *u, size_t n, float *out) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = silu_mul_f(g[i], u[i]);
}

/* ---- argmax ------------------------------------------------------------------------------------- */

/* sluice_argmax's pick (the first index of the largest value; NaN never wins, unless x[0] is
 * NaN: then 0) as the reduction of (value, index) pairs under "larger value, then lower index"
 * over the non-NaN values, a strict total order: any order of reduction gives the same pick.
 * One launch: every block reduces a strided share, the last block to finish (an arrival
 * counter it sets back to zero, so that a graph replays) reduces the blocks' picks. */
#define AMAX_BLOCKS 128
struct amax_buf {
    float v[AMAX_BLOCKS];
    int i[AMAX_BLOCKS];
    unsigned count;
    int result;
};

__device__ __forceinline__ bool amax_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(256) k_argmax(const float *x, int n, amax_buf *B) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    __shared__ float sv[8];
    __shared__ int si[8];
    __shared__ bool last_s;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
        const float v = x[j];
        if (amax_better(v, j, bv, bi)) bv = v, bi = j;
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (amax_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (amax_better(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
        B->v[blockIdx.x] = bv;
        B->i[blockIdx.x] = bi;
        __threadfence(); /* the pick is visible before the count says so */
        last_s = atomicAdd(&B->count, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last_s || threadIdx.x != 0) return;
    __threadfence();
    float rv = -INFINITY;
    int ri = INT_MAX;
    for (int b = 0; b < (int)gridDim.x; b++) {
        const float v = __ldcg(&B->v[b]);
        const int i = __ldcg(&B->i[b]);
        if (amax_better(v, i, rv, ri)) rv = v, ri = i;
    }
    B->result = isnan(x[0]) || ri == INT_MAX ? 0 : ri;
    B->count = 0;
}

void cuda_op_argmax_row(backend *b, const float *x, int n, int32_t *out_host) {
    cuda_backend *c = CB(b);
    if (!c->amax) { /* first use: an eager step (a graph is captured from a later one) */
        if (c->capturing) {
            c->capture_broken = true;
            return;
        }
        c->amax = b->ops->alloc(b, sizeof(amax_buf)); /* zeroed: the count starts at 0 */
        if (!c->amax) {
            fprintf(stderr, "sluice: out of device memory for the argmax\n");
            abort();
        }
    }
    cuda_prof_begin(c);
    amax_buf *B = (amax_buf *)c->amax;
    const unsigned blocks = (unsigned)std::min<size_t>(cdiv((size_t)n, 256 * 8), AMAX_BLOCKS);
    pdl_launch(k_argmax, blocks ? blocks : 1, 256, 0, c->stream, x, n, B);
    CU_LAUNCH();
    cuda_prof_end(c, "argmax");
    b->ops->download(b, out_host, &B->result, sizeof(int32_t));
}

void cuda_op_add(backend *b, float *x, const float *y, size_t n) {
    cuda_backend *c = CB(b);
    cuda_prof_begin(c);
    pdl_launch(k_add, cdiv(n, 256), 256, 0, c->stream, x, y, n);
    CU_LAUNCH();
    cuda_act_invalidate_range(c, x, n * sizeof(float));
    cuda_prof_end(c, "add");
}

void cuda_swiglu_rows(cuda_backend *c, const float *g, const float *u, size_t n, float *out) {
    pdl_launch(k_swiglu, cdiv(n, 256), 256, 0, c->stream, g, u, n, out);
    CU_LAUNCH();
}

void cuda_op_swiglu(backend *b, float *g, const float *u, size_t n) {
    cuda_backend *c = CB(b);
    cuda_prof_begin(c);
    cuda_swiglu_rows(c, g, u, n, g);
    cuda_act_invalidate_range(c, g, n * sizeof(float));
    cuda_prof_end(c, "swiglu");
}


__global__ void k_sigmoid_mul(float *x, const float *g, int n_rows, int dim, int g_dim) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n_rows * dim) return;
    const size_t r = i / dim, j = i % dim;
    x[i] = __fmul_rn(x[i], sigmoidf_(g[r * g_dim + (g_dim == 1 ? 0 : j)]));
}

void cuda_op_sigmoid_mul(backend *b, float *x, const float *g, int n_rows, int dim, int g_dim) {
    cuda_backend *c = CB(b);
    cuda_prof_begin(c);
    const size_t n = (size_t)n_rows * dim;
    pdl_launch(k_sigmoid_mul, cdiv(n, 256), 256, 0, c->stream, x, g, n_rows, dim, g_dim);
    CU_LAUNCH();
    cuda_act_invalidate_range(c, x, n * sizeof(float));
    cuda_prof_end(c, "sigmoid_mul");
}

/* x += y + s * sigmoid(g): sigmoid_mul, add and add in one pass, each step rounded as they
 * round it (the end of a MoE layer, three launches otherwise). */
__global__ void k_moe_tail(float *x, float *y, float *s, const float *g, int n_rows, int dim) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n_rows * dim) return;
    float r = y[i];
    if (s) {
        const float sv = __fmul_rn(s[i], sigmoidf_(g[i / dim]));
        s[i] = sv;
        r = __fadd_rn(r, sv);
        y[i] = r;
    }
    x[i] = __fadd_rn(x[i], r);
}

void cuda_op_moe_tail(backend *b, float *x, float *y, float *s, const float *g, int n_rows, int dim) {
    cuda_backend *c = CB(b);
    cuda_prof_begin(c);
    const size_t n = (size_t)n_rows * dim;
    pdl_launch(k_moe_tail, cdiv(n, 256), 256, 0, c->stream, x, y, s, g, n_rows, dim);
    CU_LAUNCH();
    cuda_act_invalidate_range(c, x, n * sizeof(float));
    cuda_act_invalidate_range(c, y, n * sizeof(float));
    if (s) cuda_act_invalidate_range(c, s, n * sizeof(float));
    cuda_prof_end(c, "moe_tail");
}

/* Element i (token i / H, head i % H) of gdn_gates; shared by k_gdn_gates and the fused
 * k_conv_split, so both give the same bits. */
__device__ __forceinline__ void gdn_gate_one(float *beta, float *alpha, const float *dt, const float *a, int i,
                                             int H) {
    const int h = i % H;
    beta[i] = sigmoidf_(beta[i]);
    const float x = __fadd_rn(alpha[i], dt[h]);
    const float sp = x > 20.0f ? x : logf(__fadd_rn(1.0f, expf(x)));
    alpha[i] = __fmul_rn(sp, a[h]);
}

__global__ void k_gdn_gates(float *beta, float *alpha, const float *dt, const float *a, int n, int H) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * H) return;
    gdn_gate_one(beta, alpha, dt, a, i, H);
}

void cuda_op_gdn_gates(backend *b, float *beta, float *alpha, const float *dt_bias, const float *a,
                       int n, int n_head) {
    cuda_backend *c = CB(b);
    cuda_prof_begin(c);
    pdl_launch(k_gdn_gates, cdiv((size_t)n * n_head, 256), 256, 0, c->stream,
        beta, alpha, (const float *)cuda_weight(c, dt_bias, (size_t)n_head * sizeof(float)),
        (const float *)cuda_weight(c, a, (size_t)n_head * sizeof(float)), n, n_head);
    CU_LAUNCH();
    cuda_act_invalidate_range(c, beta, (size_t)n * n_head * sizeof(float));
    cuda_act_invalidate_range(c, alpha, (size_t)n * n_head * sizeof(float));
    cuda_prof_end(c, "gdn_gates");
}

/* ---- copies ------------------------------------------------------------------------------------- */

void cuda_op_copy_rows(backend *b, float *dst, size_t dst_stride, const float *src, size_t src_stride,
                       int n_rows, int width) {
    cuda_backend *c = CB(b);
    if (n_rows <= 0 || width <= 0) return;
    CU(cudaMemcpy2DAsync(dst, dst_stride * sizeof(float), src, src_stride * sizeof(float),
                         (size_t)width * sizeof(float), (size_t)n_rows, cudaMemcpyDeviceToDevice, c->stream));
    cuda_act_invalidate_range(c, dst, ((size_t)(n_rows - 1) * dst_stride + width) * sizeof(float));
}

__global__ void k_kv_store(float *kc, float *vc, const float *k, const float *v, int n, const int32_t *pos,
                           size_t row_k, size_t row_v) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t per = row_k + row_v;
    if (i >= (size_t)n * per) return;
    const int t = (int)(i / per);
    const size_t j = i % per;
    if (j < row_k) kc[(size_t)pos[t] * row_k + j] = k[(size_t)t * row_k + j];
    else vc[(size_t)pos[t] * row_v + (j - row_k)] = v[(size_t)t * row_v + (j - row_k)];
}

void cuda_op_kv_store(backend *b, float *kc, float *vc, const float *k, const float *v, int n,
                      const int32_t *pos, size_t row_k, size_t row_v) {
    cuda_backend *c = CB(b);
    cuda_prof_begin(c);
    const size_t total = (size_t)n * (row_k + row_v);
    pdl_launch(k_kv_store, cdiv(total, 256), 256, 0, c->stream, kc, vc, k, v, n, pos, row_k, row_v);
    CU_LAUNCH();
    cuda_prof_end(c, "kv_store");
}

/* ---- causal conv1d + SiLU ----------------------------------------------------------------------- */

#define CONV_MAXK 16

/* One token of one channel: win[0..K-2] holds the previous raw inputs; x_t joins them, the
 * window's dot with the taps goes through SiLU, and the window moves on. Shared by both conv
 * kernels, so the fused one gives the plain one's bits. */
__device__ __forceinline__ float conv_silu_step(float *win, const float *wc, int K, float x_t) {
    win[K - 1] = x_t;
    float acc = 0.0f;
    for (int i = 0; i < K; i++) acc = __fadd_rn(acc, __fmul_rn(wc[i], win[i]));
    for (int i = 0; i < K - 1; i++) win[i] = win[i + 1];
    return __fdiv_rn(acc, __fadd_rn(1.0f, expf(-acc)));
}

/* Tokens per block of the conv kernels (blockIdx.y): an output depends on inputs only, so chunks
 * of tokens run in parallel (the token-serial form took 2.3 ms per layer at 2048 tokens on the
 * 35B-A3B shape, 64 blocks each walking every token). At least CONV_MAXK - 1, so only chunk 0
 * reads the state; chunk 0 also writes the new one, after reading it, from the last inputs. */
#define CONV_CHUNK 32
static_assert(CONV_CHUNK >= CONV_MAXK - 1, "a chunk past the first must not need the state");

/* The window before token t0 of channel ch: inputs t0 - K + 1 .. t0 - 1, the state before 0. */
__device__ __forceinline__ void conv_window(float *win, const float *x, const float *state, int t0, int C,
                                            int ch, int K) {
    for (int i = 0; i < K - 1; i++) {
        const int tau = t0 - (K - 1) + i;
        /* both indices clamped into range: the compiler may load both sides of the select
         * (compute-sanitizer saw reads before x at n = 2) */
        const float xv = x[(size_t)max(tau, 0) * C + ch], sv = state[(size_t)min(tau + K - 1, K - 2) * C + ch];
        win[i] = tau >= 0 ? xv : sv;
    }
}

/* Chunk 0, after its tokens: the state becomes the last K - 1 inputs (with one chunk the window
 * holds exactly those, also when n < K - 1). */
__device__ __forceinline__ void conv_state_out(const float *win, const float *x, float *state, int n, int C,
                                               int ch, int K) {
    const bool one_chunk = n <= CONV_CHUNK;
    for (int i = 0; i < K - 1; i++)
        state[(size_t)i * C + ch] = one_chunk ? win[i] : x[(size_t)max(n - (K - 1) + i, 0) * C + ch];
}

__global__ void k_conv(const float *x, int n, int C, const float *w, int K, float *state, float *y) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= C) return;
    const int t0 = blockIdx.y * CONV_CHUNK, t1 = min(n, t0 + CONV_CHUNK);
    float win[CONV_MAXK];
    const float *wc = w + (size_t)ch * K;
    conv_window(win, x, state, t0, C, ch, K);
    for (int t = t0; t < t1; t++) {
        y[(size_t)t * C + ch] = conv_silu_step(win, wc, K, x[(size_t)t * C + ch]);
    }
    if (blockIdx.y == 0) conv_state_out(win, x, state, n, C, ch, K);
}

void cuda_op_conv1d_silu(backend *b, const float *x, int n, int channels, const float *w, int kernel,
                         float *state, float *y) {
    cuda_backend *c = CB(b);
    if (kernel < 1 || kernel > CONV_MAXK) abort();
    cuda_prof_begin(c);
    const float *wd = (const float *)cuda_weight(c, w, (size_t)channels * kernel * sizeof(float));
    const dim3 grid((unsigned)cdiv((size_t)channels, 128), (unsigned)cdiv((size_t)n, CONV_CHUNK));
    pdl_launch(k_conv, grid, 128, 0, c->stream, x, n, channels, wd, kernel, state, y);
    CU_LAUNCH();
    cuda_act_invalidate_range(c, y, (size_t)n * channels * sizeof(float));
    cuda_prof_end(c, "conv1d_silu");
}

/* conv1d_silu, the split into q | k | v and the L2 norm of each q and k head in one kernel: a
 * block per dk channels (one head of q or k, or a dk-wide piece of v) and CONV_CHUNK tokens, a
 * thread per channel, the chunk's tokens in order. Each output is what k_conv computes; a q/k
 * head's norm is reduced exactly as k_norm<true, 32> reduces a row (thread t of warp 0 sums
 * elements t, t + 32, ... in double in that order, then the butterfly), so the values equal the
 * three ops' bit for bit. */
__global__ void k_conv_split(const float *x, int n, int kd, int vd, int dk, const float *w, int K,
                             float *state, float eps, float *q, float *k, float *v, gdn_gate_args ga) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    if (ga.beta && blockIdx.y == 0) /* the gates (gdn_gates), spread over the first chunk's blocks */
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n * ga.n_head; i += gridDim.x * blockDim.x)
            gdn_gate_one(ga.beta, ga.alpha, ga.dt_bias, ga.a, i, ga.n_head);
    extern __shared__ float row[]; /* [dk] */
    __shared__ float scale_s;
    const int C = 2 * kd + vd, tid = threadIdx.x, ch = blockIdx.x * dk + tid;
    const int region = ch < kd ? 0 : ch < 2 * kd ? 1 : 2;
    const int t0 = blockIdx.y * CONV_CHUNK, t1 = min(n, t0 + CONV_CHUNK);
    float win[CONV_MAXK];
    const float *wc = w + (size_t)ch * K;
    conv_window(win, x, state, t0, C, ch, K);
    for (int t = t0; t < t1; t++) {
        const float y = conv_silu_step(win, wc, K, x[(size_t)t * C + ch]);
        if (region == 2) {
            v[(size_t)t * vd + (ch - 2 * kd)] = y;
            continue; /* the whole block is v: no barrier below is skipped by some threads only */
        }
        row[tid] = y;
        __syncthreads();
        if (tid < 32) {
            double sq = 0.0;
            int i = tid;
            for (; i + 3 * 32 < dk; i += 4 * 32) {
                const float v0 = row[i], v1 = row[i + 32], v2 = row[i + 64], v3 = row[i + 96];
                sq += (double)__fmul_rn(v0, v0);
                sq += (double)__fmul_rn(v1, v1);
                sq += (double)__fmul_rn(v2, v2);
                sq += (double)__fmul_rn(v3, v3);
            }
            for (; i < dk; i += 32) sq += (double)__fmul_rn(row[i], row[i]);
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
            if (tid == 0) scale_s = __fdiv_rn(1.0f, fmaxf(__fsqrt_rn((float)sq), eps));
        }
        __syncthreads();
        float *o = region == 0 ? q : k;
        o[(size_t)t * kd + (ch - region * kd)] = __fmul_rn(y, scale_s);
        __syncthreads(); /* row and scale_s are reused by the next token */
    }
    if (blockIdx.y == 0) conv_state_out(win, x, state, n, C, ch, K);
}

int cuda_op_gdn_conv_split(backend *b, const float *x, int n, int kd, int vd, int dk, const float *w,
                           int kernel, float *state, float eps, float *q, float *k, float *v,
                           const gdn_gate_args *gates) {
    /* heads of 32..255 channels (k_norm's one-warp form), v whole heads wide */
    if (dk < 32 || dk >= 256 || dk % 32 || kd % dk || vd % dk || kernel < 1 || kernel > CONV_MAXK)
        return 0;
    cuda_backend *c = CB(b);
    cuda_prof_begin(c);
    const int C = 2 * kd + vd;
    const float *wd = (const float *)cuda_weight(c, w, (size_t)C * kernel * sizeof(float));
    const dim3 grid((unsigned)(C / dk), (unsigned)cdiv((size_t)n, CONV_CHUNK));
    gdn_gate_args ga = {};
    if (gates && !c->gates_apart) {
        ga = *gates;
        ga.dt_bias = (const float *)cuda_weight(c, gates->dt_bias, (size_t)gates->n_head * sizeof(float));
        ga.a = (const float *)cuda_weight(c, gates->a, (size_t)gates->n_head * sizeof(float));
    }
    pdl_launch(k_conv_split, grid, (unsigned)dk, (size_t)dk * sizeof(float), c->stream, x, n, kd,
               vd, dk, wd, kernel, state, eps, q, k, v, ga);
    CU_LAUNCH();
    cuda_act_invalidate_range(c, q, (size_t)n * kd * sizeof(float));
    cuda_act_invalidate_range(c, k, (size_t)n * kd * sizeof(float));
    cuda_act_invalidate_range(c, v, (size_t)n * vd * sizeof(float));
    if (ga.beta) {
        cuda_act_invalidate_range(c, ga.beta, (size_t)n * ga.n_head * sizeof(float));
        cuda_act_invalidate_range(c, ga.alpha, (size_t)n * ga.n_head * sizeof(float));
    }
    cuda_prof_end(c, ga.beta ? "gdn_gates + conv1d_silu + split + l2norm" : "conv1d_silu + split + l2norm");
    return ga.beta ? 2 : 1;
}

/* ---- gated delta rule ---------------------------------------------------------------------------
 * Block: one value head, 32 of its value rows; thread (row jj, quarter p) keeps keys
 * 16 g + 4 p + {0..3} of row jj's state in registers (float4 groups: the state row is read and
 * written coalesced). Per token: k and the scaled q through shared memory (double-buffered),
 * decay, prediction (quarters summed by two shuffles), correction, rank-1 update, output. */

template <int KG> /* float4 groups per thread: d_k / 16 */
__global__ void __launch_bounds__(128) k_gdn(const float *q, const float *k, const float *v, const float *g,
                                             const float *beta, float *state, float *out, int n_tok,
                                             int Hk, int Hv, int Dv, int kv_tiled, float q_scale) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    constexpr int DK = KG * 16;
    __shared__ __align__(16) float kq[2][2][DK]; /* [buffer][k, q][d_k] */
    const int h = blockIdx.x, jj = threadIdx.x >> 2, p = threadIdx.x & 3;
    const int j = blockIdx.y * 32 + jj;
    const int kh = kv_tiled ? h % Hk : h / (Hv / Hk);
    const bool row_ok = j < Dv;
    float4 s[KG];
    float *S = state + ((size_t)h * Dv + (row_ok ? j : 0)) * DK;
#pragma unroll
    for (int gi = 0; gi < KG; gi++)
        s[gi] = row_ok ? *reinterpret_cast<const float4 *>(S + 16 * gi + 4 * p) : make_float4(0, 0, 0, 0);
    for (int t = 0; t < n_tok; t++) {
        const int buf = t & 1;
        for (int i = threadIdx.x; i < DK; i += 128) {
            kq[buf][0][i] = k[((size_t)t * Hk + kh) * DK + i];
            kq[buf][1][i] = __fmul_rn(q[((size_t)t * Hk + kh) * DK + i], q_scale);
        }
        __syncthreads();
        const float decay = expf(g[(size_t)t * Hv + h]), bt = beta[(size_t)t * Hv + h];
        float mk = 0.0f;
#pragma unroll
        for (int gi = 0; gi < KG; gi++) {
            const float4 kk = *reinterpret_cast<const float4 *>(&kq[buf][0][16 * gi + 4 * p]);
            s[gi].x = __fmul_rn(s[gi].x, decay);
            s[gi].y = __fmul_rn(s[gi].y, decay);
            s[gi].z = __fmul_rn(s[gi].z, decay);
            s[gi].w = __fmul_rn(s[gi].w, decay);
            mk = __fmaf_rn(s[gi].x, kk.x, mk);
            mk = __fmaf_rn(s[gi].y, kk.y, mk);
            mk = __fmaf_rn(s[gi].z, kk.z, mk);
            mk = __fmaf_rn(s[gi].w, kk.w, mk);
        }
        mk = __fadd_rn(mk, __shfl_xor_sync(0xffffffffu, mk, 1));
        mk = __fadd_rn(mk, __shfl_xor_sync(0xffffffffu, mk, 2));
        const float vj = row_ok ? v[((size_t)t * Hv + h) * Dv + j] : 0.0f;
        const float d = __fmul_rn(__fsub_rn(vj, mk), bt);
        float o = 0.0f;
#pragma unroll
        for (int gi = 0; gi < KG; gi++) {
            const float4 kk = *reinterpret_cast<const float4 *>(&kq[buf][0][16 * gi + 4 * p]);
            const float4 qq = *reinterpret_cast<const float4 *>(&kq[buf][1][16 * gi + 4 * p]);
            s[gi].x = __fmaf_rn(kk.x, d, s[gi].x);
            s[gi].y = __fmaf_rn(kk.y, d, s[gi].y);
            s[gi].z = __fmaf_rn(kk.z, d, s[gi].z);
            s[gi].w = __fmaf_rn(kk.w, d, s[gi].w);
            o = __fmaf_rn(s[gi].x, qq.x, o);
            o = __fmaf_rn(s[gi].y, qq.y, o);
            o = __fmaf_rn(s[gi].z, qq.z, o);
            o = __fmaf_rn(s[gi].w, qq.w, o);
        }
        o = __fadd_rn(o, __shfl_xor_sync(0xffffffffu, o, 1));
        o = __fadd_rn(o, __shfl_xor_sync(0xffffffffu, o, 2));
        if (row_ok && p == 0) out[((size_t)t * Hv + h) * Dv + j] = o;
        /* the buffer of token t is rewritten at t + 2: the barrier of t + 1 orders it */
    }
    if (row_ok)
#pragma unroll
        for (int gi = 0; gi < KG; gi++) *reinterpret_cast<float4 *>(S + 16 * gi + 4 * p) = s[gi];
}

void cuda_op_gated_delta(backend *b, const float *q, const float *k, const float *v, const float *g,
                         const float *beta, float *state, const gdn_params *p, float *out) {
    cuda_backend *c = CB(b);
    cuda_prof_begin(c);
    /* chunk > 0 asks for the chunked form; the device always runs the recurrence (the same
     * function; the chunked form only rounds differently) */
    dim3 grid(p->n_v_head, cdiv((size_t)p->d_v, 32));
    const int kt = p->kv_tiled ? 1 : 0;
#define GDN_CASE(KG)                                                                             \
    pdl_launch(k_gdn<KG>, grid, 128, 0, c->stream, q, k, v, g, beta, state, out, p->n_tok,           \
               p->n_k_head, p->n_v_head, p->d_v, kt, p->q_scale)
    switch (p->d_k) {
    case 16: GDN_CASE(1); break;
    case 32: GDN_CASE(2); break;
    case 64: GDN_CASE(4); break;
    case 128: GDN_CASE(8); break;
    case 256: GDN_CASE(16); break;
    default:
        fprintf(stderr, "sluice: CUDA gated delta rule: key dim %d unsupported\n", p->d_k);
        abort();
    }
#undef GDN_CASE
    CU_LAUNCH();
    cuda_act_invalidate_range(c, out, (size_t)p->n_tok * p->n_v_head * p->d_v * sizeof(float));
    cuda_prof_end(c, "gated_delta");
}
