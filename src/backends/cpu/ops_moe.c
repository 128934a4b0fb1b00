/* CPU backend: backend memory, step inputs, KV stores and the routed-expert operations.
 *
 * These are the host-side steps the model code used to do itself (memcpy of KV rows and of the
 * tokens routed to an expert, the router's softmax and top-k, the weighted sum of the top-k
 * outputs), moved behind the backend interface so that a device backend can run them where the
 * activations live. The arithmetic is exactly what the model code did, so results are the same
 * bits as before the move. */
#include "backends/cpu/ops_moe.h"
#include "backends/cpu/ops_ssm.h" /* CPU_PAR_MIN_ELEMS */
#include "backends/cpu/threadpool.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct cpu_ext {
    int32_t *ids, *pos;
    int cap;
};

void cpu_ext_free(struct cpu_ext *x) {
    if (!x) return;
    free(x->ids);
    free(x->pos);
    free(x);
}

/* ---- memory ------------------------------------------------------------------------------- */

/* Buffers of at least CPU_HUGE_MIN bytes (the KV cache, the recurrent state, the model's other
 * large buffers) are 2 MiB-aligned and asked for in 2 MiB pages (MADV_HUGEPAGE, before the memset
 * touches them):
 * a decode step reads every layer's keys and values once, a KV head's rows 512-1024 bytes at a
 * stride of 2-4 KiB, and in 4 KiB pages those reads came from DRAM at a TLB miss every few rows
 * (bench_kernels --attn-pos P --attn-cold). Where the kernel refuses, the pages stay 4 KiB. */
#define CPU_HUGE_MIN ((size_t)4 << 20)
#define CPU_HUGE_PAGE ((size_t)2 << 20)

void *cpu_alloc(backend *b, size_t bytes) {
    (void)b;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (!rounded) rounded = 64;
    const bool huge = rounded >= CPU_HUGE_MIN;
    if (huge) rounded = (rounded + CPU_HUGE_PAGE - 1) / CPU_HUGE_PAGE * CPU_HUGE_PAGE;
    void *p = aligned_alloc(huge ? CPU_HUGE_PAGE : 64, rounded);
    if (!p) return NULL;
    if (huge) (void)madvise(p, rounded, MADV_HUGEPAGE);
    memset(p, 0, rounded);
    return p;
}

void cpu_mfree(backend *b, void *p) {
    (void)b;
    free(p);
}

void cpu_upload(backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    if (bytes) memcpy(dst, src, bytes);
}

void cpu_download(backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    if (bytes && dst != src) memcpy(dst, src, bytes);
}

void cpu_memzero(backend *b, void *dst, size_t bytes) {
    (void)b;
    if (bytes) memset(dst, 0, bytes);
}

void cpu_copy_rows(backend *b, float *dst, size_t dst_stride, const float *src, size_t src_stride,
                   int n_rows, int width) {
    (void)b;
    for (int r = 0; r < n_rows; r++)
        memcpy(dst + (size_t)r * dst_stride, src + (size_t)r * src_stride,
               (size_t)width * sizeof(float));
}

void cpu_kv_store(backend *b, float *kc, float *vc, const float *k, const float *v, int n,
                  const int32_t *pos, size_t row_k, size_t row_v) {
    (void)b;
    for (int t = 0; t < n; t++) {
        memcpy(kc + (size_t)pos[t] * row_k, k + (size_t)t * row_k, row_k * sizeof(float));
        memcpy(vc + (size_t)pos[t] * row_v, v + (size_t)t * row_v, row_v * sizeof(float));
    }
}

void cpu_set_inputs(backend *b, struct cpu_ext **ext, const int32_t *tokens, int n, int pos0,
                    const int32_t **ids, const int32_t **pos) {
    (void)b;
    struct cpu_ext *x = *ext;
    if (!x && !(x = *ext = calloc(1, sizeof *x))) abort(); /* a few bytes: as scratch */
    if (n > x->cap) {
        free(x->ids);
        free(x->pos);
        x->cap = n < 64 ? 64 : n;
        x->ids = malloc((size_t)x->cap * sizeof *x->ids);
        x->pos = malloc((size_t)x->cap * sizeof *x->pos);
        if (!x->ids || !x->pos) abort();
    }
    for (int t = 0; t < n; t++) {
        x->ids[t] = tokens[t];
        x->pos[t] = pos0 + t;
    }
    *ids = x->ids;
    *pos = x->pos;
}

/* ---- routed experts ------------------------------------------------------------------------ */

/* Row copies and the combine of a prefill batch (tens of MB per layer) run on every
 * thread: each row (token) is written by one thread, with the same operations, so the bits do
 * not depend on the split; a decode-sized one stays on the caller (a dispatch costs more). */
#define MOE_PARALLEL_MIN_FLOATS (1 << 16)

/* ggml clamps the top-k weight sum from below before dividing */
#define MOE_MIN_WEIGHT_SUM 6.103515625e-5f

static void route_token(float *p, int ne, int k, bool norm, int32_t *ids, float *w) {
    float mx = -INFINITY;
    for (int e = 0; e < ne; e++) mx = p[e] > mx ? p[e] : mx;
    double sum = 0.0;
    for (int e = 0; e < ne; e++) {
        p[e] = expf(p[e] - mx);
        sum += p[e];
    }
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < ne; e++) p[e] *= inv;
    /* top-k by descending probability; ties keep the lower expert id first. The experts taken
     * are marked in place (a probability of -1, which no softmax output is below) instead of
     * searched among the ids (k * k tests an expert, a prefill's routing ran ~1% of its samples
     * on one thread), and restored after: the same choices. */
    for (int s = 0; s < k; s++) {
        int best = -1;
        for (int e = 0; e < ne; e++)
            if (p[e] != -1.0f && (best < 0 || p[e] > p[best])) best = e;
        ids[s] = best;
        w[s] = p[best];
        p[best] = -1.0f;
    }
    for (int s = 0; s < k; s++) p[ids[s]] = w[s];
    if (norm) {
        double ws = 0.0;
        for (int s = 0; s < k; s++) ws += w[s];
        float wsum = (float)ws;
        if (wsum < MOE_MIN_WEIGHT_SUM) wsum = MOE_MIN_WEIGHT_SUM;
        for (int s = 0; s < k; s++) w[s] /= wsum;
    }
}

typedef struct route_job {
    float *logits;
    int n, n_expert, k;
    bool norm;
    int32_t *ids;
    float *w;
} route_job;

static void route_task(void *ctx, int ith, int nth) {
    const route_job *j = ctx;
    int64_t lo, hi;
    threadpool_share(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++)
        route_token(j->logits + (size_t)t * j->n_expert, j->n_expert, j->k, j->norm, j->ids + (size_t)t * j->k,
                    j->w + (size_t)t * j->k);
}

/* tokens on the pool from CPU_PAR_MIN_ELEMS logits (each token's routing is the same either way) */
void cpu_moe_route(backend *b, float *logits, int n, int n_expert, int k, bool norm, int32_t *ids,
                   float *w) {
    route_job j = {logits, n, n_expert, k, norm, ids, w};
    if ((size_t)n * (size_t)n_expert >= CPU_PAR_MIN_ELEMS && n > 1) backend_cpu_parallel(b, route_task, &j);
    else route_task(&j, 0, 1);
}

typedef struct rows_job {
    float *dst;
    const float *src;
    const int32_t *idx;
    int div, m, width;
    bool scatter;
} rows_job;

static void rows_task(void *ctx, int ith, int nth) {
    const rows_job *j = ctx;
    const size_t bytes = (size_t)j->width * sizeof(float);
    int64_t lo, hi;
    threadpool_share(j->m, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        if (j->scatter) memcpy(j->dst + (size_t)j->idx[r] * j->width, j->src + (size_t)r * j->width, bytes);
        else memcpy(j->dst + (size_t)r * j->width, j->src + (size_t)(j->idx[r] / j->div) * j->width, bytes);
    }
}

static void run_rows(backend *b, const rows_job *j) {
    if ((size_t)j->m * (size_t)j->width >= MOE_PARALLEL_MIN_FLOATS) backend_cpu_parallel(b, rows_task, (void *)j);
    else rows_task((void *)j, 0, 1);
}

void cpu_gather_rows(backend *b, float *dst, const float *src, const int32_t *idx, int div, int m,
                     int width) {
    const rows_job j = {.dst = dst, .src = src, .idx = idx, .div = div, .m = m, .width = width, .scatter = false};
    run_rows(b, &j);
}

void cpu_scatter_rows(backend *b, float *dst, const int32_t *idx, const float *src, int m,
                      int width) {
    const rows_job j = {.dst = dst, .src = src, .idx = idx, .div = 1, .m = m, .width = width, .scatter = true};
    run_rows(b, &j);
}

typedef struct combine_job {
    const float *slots, *w;
    float *out;
    int n, k, width;
} combine_job;

typedef float combine_v4 __attribute__((vector_size(16)));

static void combine_task(void *ctx, int ith, int nth) {
    const combine_job *j = ctx;
    const int k = j->k, width = j->width;
    int64_t lo, hi;
    threadpool_share(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *o = j->out + (size_t)t * width;
        const float *wt = j->w + (size_t)t * k;
        const float *s0 = j->slots + (size_t)t * k * width;
        int i = 0;
        /* four values at a time through all the slots (the compiler's vector extension; gcc -O2
         * left these loops scalar), each value's products and sums in slot order as below */
        for (; i + 4 <= width; i += 4) {
            combine_v4 acc, v;
            memcpy(&acc, s0 + i, sizeof acc);
            acc *= wt[0];
            for (int s = 1; s < k; s++) {
                memcpy(&v, s0 + (size_t)s * width + i, sizeof v);
                acc += v * wt[s];
            }
            memcpy(o + i, &acc, sizeof acc);
        }
        for (; i < width; i++) {
            float a = s0[i] * wt[0];
            for (int s = 1; s < k; s++) a += s0[(size_t)s * width + i] * wt[s];
            o[i] = a;
        }
    }
}

void cpu_moe_combine(backend *b, const float *slots, const float *w, int n, int k, int width,
                     float *out) {
    const combine_job j = {.slots = slots, .w = w, .out = out, .n = n, .k = k, .width = width};
    if ((size_t)n * (size_t)k * (size_t)width >= MOE_PARALLEL_MIN_FLOATS) backend_cpu_parallel(b, combine_task, (void *)&j);
    else combine_task((void *)&j, 0, 1);
}
