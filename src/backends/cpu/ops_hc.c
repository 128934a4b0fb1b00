/* CPU backend: hyper-connection and n-gram (PLE) operations of qwen4exp (backend.h).
 *
 * Each follows the float steps of llama.cpp's graph for the same formula (ggml ops one after
 * another, each rounding to float), so the results agree with the reference to rounding:
 * RMSNorm squares summed in double, sum_rows in double, sigmoid = 1/(1+expf(-x)), silu =
 * x/(1+expf(-x)), products and sums in the graph's order. Work is split by token (or by
 * channel for the convolution); every output is computed by one thread in a fixed order, so
 * neither the thread count nor the batch split changes a bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/ops_hc.h"
#include "backends/cpu/threadpool.h"

static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float siluf_(float x) { return x / (1.0f + expf(-x)); }

/* Below this many floats a dispatch to the pool costs more than the work. */
#define HC_PAR_MIN 16384

/* ---- grouped RMSNorm ------------------------------------------------------------------------ */

typedef struct gnorm_job {
    const float *x, *w;
    float *y;
    int n_tok, groups, dim;
    float eps;
} gnorm_job;

static void gnorm_task(void *ctx, int ith, int nth) {
    const gnorm_job *j = ctx;
    int64_t lo, hi;
    threadpool_share((int64_t)j->n_tok * j->groups, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const float *xr = j->x + (size_t)r * j->dim;
        const float *wr = j->w + (size_t)(r % j->groups) * j->dim;
        float *yr = j->y + (size_t)r * j->dim;
        double sum = 0.0;
        for (int i = 0; i < j->dim; i++) sum += (double)(xr[i] * xr[i]);
        const float scale = 1.0f / sqrtf((float)(sum / j->dim) + j->eps);
        for (int i = 0; i < j->dim; i++) yr[i] = (xr[i] * scale) * wr[i];
    }
}

void cpu_rmsnorm_groups(backend *b, const float *x, const float *w, int n_tok, int groups,
                        int dim, float eps, float *y) {
    gnorm_job j = {x, w, y, n_tok, groups, dim, eps};
    if ((int64_t)n_tok * groups * dim < HC_PAR_MIN) gnorm_task(&j, 0, 1);
    else backend_cpu_parallel(b, gnorm_task, &j);
}

/* ---- elementwise ---------------------------------------------------------------------------- */

void cpu_scale_silu(backend *b, float *x, size_t n, float scale) {
    (void)b;
    for (size_t i = 0; i < n; i++) x[i] = siluf_(x[i] * scale);
}

/* ---- hyper-connection read and write --------------------------------------------------------- */

typedef struct mix_job {
    const float *xn, *gate, *inject;
    float *out, *res;
    int n, hc, dim;
} mix_job;

/* llama.cpp: gated = xn * sigmoid(gate); mixed = stream 0, then + stream c in order; then
 * scaled by 1/hc. */
static void mix_task(void *ctx, int ith, int nth) {
    const mix_job *j = ctx;
    int64_t lo, hi;
    threadpool_share(j->n, ith, nth, &lo, &hi);
    const size_t D = (size_t)j->dim, W = (size_t)j->hc * D;
    const float inv = 1.0f / (float)j->hc;
    for (int64_t t = lo; t < hi; t++) {
        const float *xn = j->xn + (size_t)t * W, *g = j->gate + (size_t)t * W;
        float *o = j->out + (size_t)t * D;
        for (size_t i = 0; i < D; i++) o[i] = xn[i] * sigmoidf_(g[i]);
        for (int s = 1; s < j->hc; s++)
            for (size_t i = 0; i < D; i++) o[i] += xn[s * D + i] * sigmoidf_(g[s * D + i]);
        for (size_t i = 0; i < D; i++) o[i] *= inv;
    }
}

void cpu_hc_mix(backend *b, const float *xn, const float *gate, int n, int hc, int dim,
                float *out) {
    mix_job j = {.xn = xn, .gate = gate, .out = out, .n = n, .hc = hc, .dim = dim};
    if ((int64_t)n * hc * dim < HC_PAR_MIN) mix_task(&j, 0, 1);
    else backend_cpu_parallel(b, mix_task, &j);
}

/* llama.cpp: w = sigmoid(inject * (1/hc)) * 2; res = res + out * w */
static void combine_task(void *ctx, int ith, int nth) {
    const mix_job *j = ctx;
    int64_t lo, hi;
    threadpool_share(j->n, ith, nth, &lo, &hi);
    const size_t D = (size_t)j->dim, W = (size_t)j->hc * D;
    const float inv = 1.0f / (float)j->hc;
    for (int64_t t = lo; t < hi; t++) {
        const float *o = j->out + (size_t)t * D;
        for (int s = 0; s < j->hc; s++) {
            const float w = sigmoidf_(j->inject[(size_t)t * j->hc + s] * inv) * 2.0f;
            float *r = j->res + (size_t)t * W + (size_t)s * D;
            for (size_t i = 0; i < D; i++) r[i] = r[i] + o[i] * w;
        }
    }
}

void cpu_hc_combine(backend *b, float *res, const float *out, const float *inject, int n, int hc,
                    int dim) {
    mix_job j = {.inject = inject, .out = (float *)out, .res = res, .n = n, .hc = hc, .dim = dim};
    if ((int64_t)n * hc * dim < HC_PAR_MIN) combine_task(&j, 0, 1);
    else backend_cpu_parallel(b, combine_task, &j);
}

/* ---- n-gram gate ----------------------------------------------------------------------------- */

/* llama.cpp: s = sum_rows(key * query) (products in float, the sum in double), scaled by
 * 1/sqrtf(dim); gate = sigmoid(sgn(s) * sqrtf(clamp(|s|, 1e-6, inf))); gated = value * gate. */
void cpu_ple_gate(backend *b, const float *key, const float *query, const float *value, int n,
                  int hc, int dim, float *gated) {
    (void)b;
    const size_t D = (size_t)dim;
    const float scale = 1.0f / sqrtf((float)dim);
    for (int t = 0; t < n; t++)
        for (int s = 0; s < hc; s++) {
            const size_t off = ((size_t)t * hc + s) * D;
            double sum = 0.0;
            for (size_t i = 0; i < D; i++) sum += (double)(key[off + i] * query[off + i]);
            const float sc = (float)sum * scale;
            float mag = fabsf(sc);
            if (mag < 1e-6f) mag = 1e-6f;
            mag = sqrtf(mag);
            const float sgn = sc > 0.0f ? 1.0f : sc < 0.0f ? -1.0f : 0.0f;
            const float g = sigmoidf_(sgn * mag);
            const float *v = value + (size_t)t * D;
            for (size_t i = 0; i < D; i++) gated[off + i] = v[i] * g;
        }
}

/* ---- dilated causal conv + SiLU --------------------------------------------------------------- */

typedef struct dconv_job {
    const float *x, *w;
    float *state, *y;
    int n, channels, kernel, dil;
} dconv_job;

/* One channel at a time: its history (hist = (kernel-1)*dil values) and the n new inputs are
 * laid out in a small per-thread window, exactly xp of the definition. */
static void dconv_task(void *ctx, int ith, int nth) {
    const dconv_job *j = ctx;
    const int C = j->channels, K = j->kernel, hist = (K - 1) * j->dil;
    int64_t lo, hi;
    threadpool_share(C, ith, nth, &lo, &hi);
    float *xp = malloc(sizeof(float) * (size_t)(hist + j->n));
    if (!xp) abort(); /* a few KiB; failing here is out of memory */
    for (int64_t c = lo; c < hi; c++) {
        const float *wc = j->w + (size_t)c * K;
        for (int i = 0; i < hist; i++) xp[i] = j->state[(size_t)i * C + c];
        for (int t = 0; t < j->n; t++) xp[hist + t] = j->x[(size_t)t * C + c];
        for (int t = 0; t < j->n; t++) {
            /* llama.cpp: term_k = x[t - (K-1-k)*dil] * w_k; out = term_0 + term_1 + ... */
            float acc = xp[t] * wc[0];
            for (int k = 1; k < K; k++) acc = acc + xp[t + k * j->dil] * wc[k];
            j->y[(size_t)t * C + c] = siluf_(acc);
        }
        for (int i = 0; i < hist; i++) j->state[(size_t)i * C + c] = xp[j->n + i];
    }
    free(xp);
}

void cpu_conv1d_dilated_silu(backend *b, const float *x, int n, int channels, const float *w,
                             int kernel, int dilation, float *state, float *y) {
    if (kernel < 1 || dilation < 1) abort(); /* loaders validate both */
    dconv_job j = {x, w, state, y, n, channels, kernel, dilation};
    if ((int64_t)n * channels < HC_PAR_MIN) dconv_task(&j, 0, 1);
    else backend_cpu_parallel(b, dconv_task, &j);
}
