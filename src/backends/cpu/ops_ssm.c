/* CPU backend: linear-attention operations (Gated DeltaNet) and the small gates around them.
 *
 * Determinism as in ops.c: work is split by output (conv channels, value heads), each output is
 * computed by one thread in a fixed order, so the thread count never changes a bit. The
 * recurrence also walks tokens strictly in order with the state kept in float between calls,
 * which is why feeding a sequence in one call, in pieces, or token by token gives the same bits.
 * The chunked form reorders the arithmetic (matrix products over a chunk) and therefore agrees
 * with the recurrence only to rounding; it is selected explicitly (gdn_params.chunk > 0). */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/exp_f32.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/threadpool.h"
#include "backends/cpu/ops_ssm.h"
#include "backends/cpu/sumsq_rows.h"

/* The float recipes of ggml's unary ops, so that gates round as in llama.cpp; the exponential is
 * exp_f32 (glibc's expf), as in the vector kernels that compute the wide gates. */
static inline float sigmoidf_(float x) { return 1.0f / (1.0f + exp_f32(-x)); }
static inline float softplusf_(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

/* ---- l2norm ------------------------------------------------------------------------------- */

/* A row-wise op's rows: [lo, hi) of n_rows for thread ith of nth, or all of them on the caller
 * below CPU_PAR_MIN_ELEMS values (a prefill's q and k norms and output gates ran on one thread
 * while the other waited). */
typedef struct rowwise_job {
    const float *x, *g;
    float *y;
    int n_rows, dim, g_dim;
    float eps;
} rowwise_job;

static void rows_run(backend *b, backend_task_fn fn, rowwise_job *j) {
    if ((int64_t)j->n_rows * j->dim < CPU_PAR_MIN_ELEMS || j->n_rows < 2) fn(j, 0, 1);
    else backend_cpu_parallel(b, fn, j);
}

/* ggml_l2_norm: squares summed in double, eps is a floor on the norm (not a term under the
 * root), the reciprocal taken in float. */
static void l2norm_task(void *ctx, int ith, int nth) {
    const rowwise_job *j = ctx;
    int64_t lo, hi;
    threadpool_share(j->n_rows, ith, nth, &lo, &hi);
    double sums[SUMSQ_ROWS];
    for (int64_t r = lo; r < hi; r++) {
        const float *xr = j->x + (size_t)r * j->dim;
        float *yr = j->y + (size_t)r * j->dim;
        if ((r - lo) % SUMSQ_ROWS == 0)
            sumsq_rows(xr, (size_t)j->dim, hi - r < SUMSQ_ROWS ? (int)(hi - r) : SUMSQ_ROWS, j->dim, sums);
        scale_row(yr, xr, NULL, 1.0f / fmaxf(sqrtf((float)sums[(r - lo) % SUMSQ_ROWS]), j->eps), j->dim);
    }
}

void cpu_l2norm(backend *b, const float *x, int n_rows, int dim, float eps, float *y) {
    rowwise_job j = {.x = x, .y = y, .n_rows = n_rows, .dim = dim, .eps = eps};
    rows_run(b, l2norm_task, &j);
}

/* ---- causal conv1d + SiLU ----------------------------------------------------------------- */

typedef struct conv_job {
    const float *x, *w;
    float *state, *y;
    int n, channels, kernel;
} conv_job;

/* Channels in runs of CONV_RUN, each run's weights copied tap-major once, then token by token
 * (a channel-major walk read x with a stride of C floats, a cache line per value: 3.6% of a
 * 35B-A3B prefill for ~17M multiply-adds): the taps of a run of channels are a vector kernel
 * (kernel_conv_taps, 3% of a 35B-A3B prefill as a scalar loop). Each (token, channel) still
 * adds its taps in order from zero, as ggml_ssm_conv's per-channel loop, so the bits are the
 * same; SiLU follows per value. */
#define CONV_RUN 128

static void conv_task(void *ctx, int ith, int nth) {
    const conv_job *j = ctx;
    const int C = j->channels, K = j->kernel, n = j->n;
    const kernel_conv_taps_fn taps = kernel_conv_taps();
    const kernel_silu_fn silu = kernel_silu();
    int64_t lo, hi;
    threadpool_share(C, ith, nth, &lo, &hi);
    float wt[CPU_CONV_MAX_KERNEL * CONV_RUN];
    for (int64_t c0 = lo; c0 < hi; c0 += CONV_RUN) {
        const int nc = hi - c0 < CONV_RUN ? (int)(hi - c0) : CONV_RUN;
        for (int c = 0; c < nc; c++)
            for (int i = 0; i < K; i++) wt[i * CONV_RUN + c] = j->w[(size_t)(c0 + c) * K + i];
        for (int t = 0; t < n; t++) {
            /* tap i reads input t + i - (K - 1): before the first token, a state row */
            const float *src[CPU_CONV_MAX_KERNEL];
            for (int i = 0; i < K; i++) {
                const int tau = t + i - (K - 1);
                src[i] = (tau < 0 ? j->state + (size_t)(tau + K - 1) * C : j->x + (size_t)tau * C) + c0;
            }
            float *yt = j->y + (size_t)t * C + c0;
            taps(nc, K, wt, CONV_RUN, src, yt);
            silu((size_t)nc, yt);
        }
    }
    /* the new state: the last K - 1 inputs. With fewer tokens than that, row i comes from old
     * row n + i (> i), so ascending rows never read one already replaced. */
    for (int i = 0; i < K - 1; i++) {
        const int tau = n - (K - 1) + i;
        const float *s = tau < 0 ? j->state + (size_t)(tau + K - 1) * C : j->x + (size_t)tau * C;
        float *d = j->state + (size_t)i * C;
        for (int64_t c = lo; c < hi; c++) d[c] = s[c];
    }
}

void cpu_conv1d_silu(backend *b, const float *x, int n, int channels, const float *w, int kernel,
                     float *state, float *y) {
    if (kernel < 1 || kernel > CPU_CONV_MAX_KERNEL) abort(); /* loaders validate the kernel */
    conv_job j = {.x = x, .w = w, .state = state, .y = y, .n = n, .channels = channels,
                  .kernel = kernel};
    backend_cpu_parallel(b, conv_task, &j);
}

/* ---- gated delta rule ----------------------------------------------------------------------- */

typedef struct gdn_job {
    const float *q, *k, *v, *g, *beta;
    float *state, *out;
    float *ck;        /* gated_delta_ck: the state after token t at ck + t * ck_stride; NULL: none */
    size_t ck_stride;
    gdn_params p;
    float *scratch; /* per thread: stride floats */
    size_t stride;
} gdn_job;

static int key_head(const gdn_params *p, int h) {
    return p->kv_tiled ? h % p->n_k_head : h / (p->n_v_head / p->n_k_head);
}

/* y[i] += a * x[i] */
static inline void axpy(int n, float a, const float *x, float *y) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* The two fused passes over a state row (decay_dot: s *= a, returns s . k; update_dot:
 * s += k d, returns s . q) are CPU kernels (kernels.h), vectorized per instruction set and
 * identical in bits to their scalar definitions. */

/* One value head through all its tokens. Each state row S[j] (one value dim) evolves on its own:
 * per token decay, prediction m = S[j]·k, correction d = beta (v[j] - m), rank-1 update
 * S[j] += d k, output S[j]·q; so two passes over a row per token (decay_dot, update_dot).
 *
 * The rows are outermost: a group of GDN_ROWS state rows goes through every token while it is
 * in L1, and only the tokens' k and q (1 KB a token at d_k 128) come from L2, where token by
 * token streamed the head's whole state (64 KB) through L2 twice. Measured on a Zen 5 host the
 * two walks took the same share of a 35B-A3B prefill (decay_dot4 + update_dot4 8.4-8.7% of a
 * pp512): the passes are bound by their multiplies (four per 8 values and row, none fused: the
 * bits of the scalar definition), not by the L2. The walk is kept because the same one serves
 * the checkpointed calls, which had their own copy of it. A row's operations are the same in
 * either order (rows never mix), so the bits are the same, and so are those of one token at a
 * time, which is this walk with T = 1. The decay exp(g) is computed once per token.
 *
 * ck (gated_delta_ck): the rows' state after token t (but the last) is also copied to its
 * checkpoint. qs: n_tok * (d_k + 1) floats of scratch for the tokens' scaled q and decay. */
#define GDN_ROWS 8
#define GDN_ROWS_MIN_TOKENS 2

static void gdn_head_recurrent(const gdn_job *J, int h, float *qs) {
    const gdn_params *p = &J->p;
    const int Dk = p->d_k, Dv = p->d_v, Hk = p->n_k_head, Hv = p->n_v_head, kh = key_head(p, h), T = p->n_tok;
    float *S = J->state + (size_t)h * Dv * Dk;
    const kernel_decay_dot_fn decay_dot = kernel_gdn_decay_dot();
    const kernel_update_dot_fn update_dot = kernel_gdn_update_dot();
    const kernel_decay_dot4_fn decay_dot4 = kernel_gdn_decay_dot4();
    const kernel_update_dot4_fn update_dot4 = kernel_gdn_update_dot4();
    float *decay = qs + (size_t)T * Dk; /* per token, for every group of rows */
    for (int t = 0; t < T; t++) { /* q is scaled first (ggml) */
        const float *qt = J->q + ((size_t)t * Hk + kh) * Dk;
        for (int i = 0; i < Dk; i++) qs[(size_t)t * Dk + i] = qt[i] * p->q_scale;
        decay[t] = expf(J->g[(size_t)t * Hv + h]);
    }
    const bool four = decay_dot4 && update_dot4;
    /* 8 rows through all the tokens in one call where the level has that walk (the state copied
     * to its layout and back, so not for one token, nor with checkpoints) */
    const kernel_gdn_rows_fn rows8 = T >= GDN_ROWS_MIN_TOKENS && !J->ck && Dk % 8 == 0 && Dk <= KERNEL_GDN_ROWS_MAX_N
                                         ? kernel_gdn_rows() : NULL;
    for (int j = 0; j < Dv;) {
        /* rows j .. j + g - 1, in runs of 4 through the dot4 kernels where there are 4 */
        const int g = four ? (Dv - j >= GDN_ROWS ? GDN_ROWS : Dv - j >= 4 ? 4 : 1) : 1;
        float *Sj = S + (size_t)j * Dk;
        if (rows8 && g == 8) {
            rows8(Dk, Sj, T, J->k + (size_t)kh * Dk, (size_t)Hk * Dk, qs, (size_t)Dk, J->v + (size_t)h * Dv + j,
                  (size_t)Hv * Dv, J->beta + h, (size_t)Hv, decay, J->out + (size_t)h * Dv + j, (size_t)Hv * Dv);
            j += g;
            continue;
        }
        for (int t = 0; t < T; t++) {
            const float *kt = J->k + ((size_t)t * Hk + kh) * Dk;
            const float *vt = J->v + ((size_t)t * Hv + h) * Dv;
            const float *qt = qs + (size_t)t * Dk;
            float *ot = J->out + ((size_t)t * Hv + h) * Dv;
            const float bt = J->beta[(size_t)t * Hv + h];
            if (g >= 4) {
                for (int r0 = 0; r0 < g; r0 += 4) {
                    float m[4], d[4];
                    float *Sr = Sj + (size_t)r0 * Dk;
                    decay_dot4(Dk, Sr, (size_t)Dk, decay[t], kt, m);
                    for (int r = 0; r < 4; r++) d[r] = (vt[j + r0 + r] - m[r]) * bt;
                    update_dot4(Dk, Sr, (size_t)Dk, d, kt, qt, ot + j + r0);
                }
            } else {
                const float d = (vt[j] - decay_dot(Dk, Sj, decay[t], kt)) * bt;
                ot[j] = update_dot(Dk, Sj, d, kt, qt);
            }
            if (J->ck && t + 1 < T)
                memcpy(J->ck + (size_t)t * J->ck_stride + ((size_t)h * Dv + (size_t)j) * Dk, Sj,
                       sizeof(float) * (size_t)g * (size_t)Dk);
        }
        j += g;
    }
}

/* Floats of per-thread scratch the chunked form needs. */
static size_t gdn_chunk_floats(const gdn_params *p) {
    const size_t C = (size_t)p->chunk, Dk = (size_t)p->d_k, Dv = (size_t)p->d_v;
    /* G, eG | P | kb, qs, W, kd | U, Vnew */
    return 2 * C + C * C + 4 * C * Dk + 2 * C * Dv;
}

/* One value head in chunks of C tokens (the WY representation). Within a chunk of c tokens,
 * G = cumulative log decay, Gamma_ij = exp(G_i - G_j):
 *   A = strictly_lower((beta k_i · k_j) Gamma_ij);   (I + A) U = beta v,  (I + A) W = beta k exp(G)
 *   (A is consumed row by row by the forward substitution, never stored)
 *   P = lower_with_diag((q_i · k_j) Gamma_ij);       Vnew = U - W S
 *   O_i = exp(G_i) (q_i S) + sum_{j<=i} P_ij Vnew_j
 *   S <- exp(G_c-1) S + sum_j exp(G_c-1 - G_j) k_j Vnew_j^T
 * with S as [value][key] rows, so W S and q S are dot products along the key dimension. */
static void gdn_head_chunked(const gdn_job *J, int h, float *ws) {
    const gdn_params *p = &J->p;
    const int Dk = p->d_k, Dv = p->d_v, Hk = p->n_k_head, Hv = p->n_v_head, kh = key_head(p, h);
    const int C = p->chunk;
    float *G = ws, *eG = G + C, *P = eG + C, *kb = P + (size_t)C * C;
    float *qs = kb + (size_t)C * Dk, *W = qs + (size_t)C * Dk, *kd = W + (size_t)C * Dk;
    float *U = kd + (size_t)C * Dk, *Vn = U + (size_t)C * Dv;
    float *S = J->state + (size_t)h * Dv * Dk;
#define KROW(t) (J->k + ((size_t)(t) * Hk + kh) * Dk)
    for (int c0 = 0; c0 < p->n_tok; c0 += C) {
        const int nc = p->n_tok - c0 < C ? p->n_tok - c0 : C;
        float acc = 0.0f;
        for (int i = 0; i < nc; i++) {
            acc += J->g[(size_t)(c0 + i) * Hv + h];
            G[i] = acc;
            eG[i] = expf(acc);
        }
        for (int i = 0; i < nc; i++) {
            const int t = c0 + i;
            const float bt = J->beta[(size_t)t * Hv + h];
            const float *kt = KROW(t), *qt = J->q + ((size_t)t * Hk + kh) * Dk;
            const float *vt = J->v + ((size_t)t * Hv + h) * Dv;
            float *kbi = kb + (size_t)i * Dk, *qsi = qs + (size_t)i * Dk;
            for (int r = 0; r < Dk; r++) {
                kbi[r] = kt[r] * bt;
                qsi[r] = qt[r] * p->q_scale;
            }
            /* forward substitution: row i of U and W from the rows before it */
            float *Ui = U + (size_t)i * Dv, *Wi = W + (size_t)i * Dk;
            for (int c = 0; c < Dv; c++) Ui[c] = vt[c] * bt;
            for (int r = 0; r < Dk; r++) Wi[r] = kbi[r] * eG[i];
            for (int j = 0; j < i; j++) {
                const float a = kernel_dot_f32(Dk, kbi, KROW(c0 + j)) * expf(G[i] - G[j]);
                axpy(Dv, -a, U + (size_t)j * Dv, Ui);
                axpy(Dk, -a, W + (size_t)j * Dk, Wi);
            }
            for (int j = 0; j <= i; j++)
                P[(size_t)i * C + j] = kernel_dot_f32(Dk, qsi, KROW(c0 + j)) * expf(G[i] - G[j]);
        }
        /* Vnew and the output, both against the state at the start of the chunk */
        for (int i = 0; i < nc; i++) {
            float *Vi = Vn + (size_t)i * Dv;
            const float *Ui = U + (size_t)i * Dv, *Wi = W + (size_t)i * Dk;
            for (int c = 0; c < Dv; c++) Vi[c] = Ui[c] - kernel_dot_f32(Dk, S + (size_t)c * Dk, Wi);
        }
        for (int i = 0; i < nc; i++) {
            float *o = J->out + ((size_t)(c0 + i) * Hv + h) * Dv;
            const float *qsi = qs + (size_t)i * Dk;
            for (int c = 0; c < Dv; c++) o[c] = eG[i] * kernel_dot_f32(Dk, S + (size_t)c * Dk, qsi);
            for (int j = 0; j <= i; j++) axpy(Dv, P[(size_t)i * C + j], Vn + (size_t)j * Dv, o);
        }
        /* carry the state over the chunk */
        const float gl = G[nc - 1], el = eG[nc - 1];
        for (int j = 0; j < nc; j++) {
            const float *kt = KROW(c0 + j);
            const float f = expf(gl - G[j]);
            for (int r = 0; r < Dk; r++) kd[(size_t)j * Dk + r] = kt[r] * f;
        }
        for (int c = 0; c < Dv; c++) {
            float *Sc = S + (size_t)c * Dk;
            for (int r = 0; r < Dk; r++) Sc[r] *= el;
            for (int j = 0; j < nc; j++) axpy(Dk, Vn[(size_t)j * Dv + c], kd + (size_t)j * Dk, Sc);
        }
    }
#undef KROW
}

static void gdn_task(void *ctx, int ith, int nth) {
    const gdn_job *J = ctx;
    int64_t lo, hi;
    threadpool_share(J->p.n_v_head, ith, nth, &lo, &hi);
    float *ws = J->scratch + (size_t)ith * J->stride;
    for (int64_t h = lo; h < hi; h++) {
        if (J->p.chunk > 0 && !J->ck) gdn_head_chunked(J, (int)h, ws);
        else gdn_head_recurrent(J, (int)h, ws);
    }
}

void cpu_gated_delta(backend *b, const float *q, const float *k, const float *v, const float *g,
                     const float *beta, float *state, const gdn_params *p, float *out) {
    gdn_job J = {.q = q, .k = k, .v = v, .g = g, .beta = beta, .state = state, .out = out,
                 .p = *p};
    /* per-thread scratch, rounded to 64 bytes so threads never share a cache line */
    size_t floats = p->chunk > 0 ? gdn_chunk_floats(p) : (size_t)p->n_tok * ((size_t)p->d_k + 1);
    J.stride = (floats + 15) / 16 * 16;
    J.scratch = cpu_backend_scratch(b, J.stride * sizeof(float) * (size_t)b->n_threads);
    backend_cpu_parallel(b, gdn_task, &J);
}

void cpu_gated_delta_ck(backend *b, const float *q, const float *k, const float *v, const float *g,
                        const float *beta, float *state, const gdn_params *p, float *out, float *ck,
                        size_t ck_stride) {
    gdn_job J = {.q = q, .k = k, .v = v, .g = g, .beta = beta, .state = state, .out = out, .ck = ck,
                 .ck_stride = ck_stride, .p = *p};
    J.p.chunk = 0;
    J.stride = ((size_t)p->n_tok * ((size_t)p->d_k + 1) + 15) / 16 * 16; /* the tokens' scaled q, decay */
    J.scratch = cpu_backend_scratch(b, J.stride * sizeof(float) * (size_t)b->n_threads);
    backend_cpu_parallel(b, gdn_task, &J);
}

/* ---- gates -------------------------------------------------------------------------------- */

static void sigmoid_mul_task(void *ctx, int ith, int nth) {
    const rowwise_job *j = ctx;
    const int dim = j->dim, g_dim = j->g_dim;
    int64_t lo, hi;
    threadpool_share(j->n_rows, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        float *xr = j->y + (size_t)r * dim;
        const float *gr = j->g + (size_t)r * g_dim;
        if (g_dim == 1) {
            const float s = sigmoidf_(gr[0]);
            for (int i = 0; i < dim; i++) xr[i] *= s;
        } else {
            kernel_sigmoid_mul()((size_t)dim, gr, xr);
        }
    }
}

void cpu_sigmoid_mul(backend *b, float *x, const float *g, int n_rows, int dim, int g_dim) {
    rowwise_job j = {.g = g, .y = x, .n_rows = n_rows, .dim = dim, .g_dim = g_dim};
    rows_run(b, sigmoid_mul_task, &j);
}

void cpu_gdn_gates(backend *b, float *beta, float *alpha, const float *dt_bias, const float *a,
                   int n, int n_head) {
    (void)b;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < n_head; h++) {
            const size_t i = (size_t)t * n_head + h;
            beta[i] = sigmoidf_(beta[i]);
            alpha[i] = softplusf_(alpha[i] + dt_bias[h]) * a[h];
        }
}
