/* Products computed by the CPU in the CUDA backend's order (device_rows.h). */
#include "backends/cpu/device_rows.h"

#include <string.h>

#include "backends/cpu/kernels.h"
#include "backends/silu_fixed.h"
#include "formats/quant.h"

bool device_rows_supported(uint32_t type) {
    /* the CUDA backend's quantized types (cuda_type_supported), each with a CPU codec */
    switch (type) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: case GGML_TYPE_IQ4_NL:
    case GGML_TYPE_MXFP4: case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS:
    case GGML_TYPE_IQ3_XXS: case GGML_TYPE_IQ4_XS:
        return kernel_dot(type) != NULL;
    default:
        return false;
    }
}

float device_row_dot(uint32_t type, int64_t K, const uint8_t *w, const uint8_t *a) {
    const quant_traits *wt = quant_traits_of(type), *at = quant_traits_of(wt->act_type);
    const kernel_dot_fn dot = kernel_dot(type);
    const int B = (int)wt->block_elems;
    const int lpb = B / 32, groups = 32 / lpb; /* lanes per block, blocks per warp iteration */
    const int64_t nblk = K / B;
    float lane[32] = {0};
    for (int64_t b = 0; b < nblk; b++) {
        /* the block's term: one block through the CPU kernel gives 0 + term, as the GPU's first
         * add does (and a lane never holds -0, so the sign of a zero term never matters) */
        const float t = dot(B, w + (size_t)b * wt->block_bytes, a + (size_t)b * at->block_bytes);
        const int l = (int)(b % groups) * lpb;
        lane[l] = lane[l] + t;
    }
    /* the butterfly as lane 0 sees it: lane l + lane l ^ off for l < off (the sum commutes) */
    for (int off = 16; off >= 1; off >>= 1)
        for (int l = 0; l < off; l++) lane[l] = lane[l] + lane[l + off];
    return lane[0];
}

bool device_experts_supported(const device_expert_shape *sh) {
    const uint32_t t[3] = {sh->type_gate, sh->type_up, sh->type_down};
    for (int i = 0; i < 3; i++)
        if (!device_rows_supported(t[i])) return false;
    return sh->E > 0 && sh->F > 0 && sh->E % quant_traits_of(sh->type_gate)->block_elems == 0 &&
           sh->E % quant_traits_of(sh->type_up)->block_elems == 0 &&
           sh->F % quant_traits_of(sh->type_down)->block_elems == 0;
}

static size_t act_bytes(uint32_t type, int64_t n) {
    return quant_row_bytes(quant_traits_of(type)->act_type, n);
}

static size_t al64(size_t x) { return (x + 63) / 64 * 64; }

/* Per job: its x encoded for gate and for up, h = silu(gate x) * up x, h encoded for down. */
typedef struct work_layout {
    size_t xg, xu, h, hd; /* bytes of one job's part */
} work_layout;

static work_layout layout_of(const device_expert_shape *sh) {
    work_layout w = {al64(act_bytes(sh->type_gate, sh->E)), al64(act_bytes(sh->type_up, sh->E)),
                     al64((size_t)sh->F * sizeof(float)), al64(act_bytes(sh->type_down, sh->F))};
    return w;
}

size_t device_experts_work_bytes(const device_expert_shape *sh, int n) {
    const work_layout w = layout_of(sh);
    return (size_t)n * (w.xg + w.xu + w.h + w.hd);
}

typedef struct run_job {
    const device_expert_shape *sh;
    const device_expert_job *jobs;
    int n;
    uint8_t *xg, *xu, *hd; /* [n] encodings */
    float *h;              /* [n][F] */
    work_layout w;
    size_t rb_g, rb_u, rb_d;
} run_job;

/* Shares of the n * F gate/up rows: h[j][r] = silu(gate_r . x_j) * (up_r . x_j). */
static void gate_up_task(void *ctx, int ith, int nth) {
    const run_job *r = ctx;
    const int64_t F = r->sh->F, total = (int64_t)r->n * F;
    int64_t lo, hi;
    threadpool_share(total, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const int64_t j = i / F, row = i % F;
        const device_expert_job *jb = &r->jobs[j];
        const float g = device_row_dot(r->sh->type_gate, r->sh->E, jb->gate + (size_t)row * r->rb_g,
                                       r->xg + (size_t)j * r->w.xg);
        const float u = device_row_dot(r->sh->type_up, r->sh->E, jb->up + (size_t)row * r->rb_u,
                                       r->xu + (size_t)j * r->w.xu);
        float *h = (float *)((uint8_t *)r->h + (size_t)j * r->w.h);
        h[row] = silu_fixed_mul(g, u);
    }
}

/* Shares of the n * E down rows. */
static void down_task(void *ctx, int ith, int nth) {
    const run_job *r = ctx;
    const int64_t E = r->sh->E, total = (int64_t)r->n * E;
    int64_t lo, hi;
    threadpool_share(total, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const int64_t j = i / E, row = i % E;
        const device_expert_job *jb = &r->jobs[j];
        jb->y[row] = device_row_dot(r->sh->type_down, r->sh->F, jb->down + (size_t)row * r->rb_d,
                                    r->hd + (size_t)j * r->w.hd);
    }
}

int device_experts_run(threadpool *pool, const device_expert_shape *sh, const device_expert_job *jobs, int n,
                       void *work, size_t work_bytes) {
    if (n <= 0) return 0;
    if (!device_experts_supported(sh) || work_bytes < device_experts_work_bytes(sh, n)) return -1;
    run_job r = {.sh = sh, .jobs = jobs, .n = n, .w = layout_of(sh)};
    uint8_t *p = work;
    r.xg = p;
    r.xu = r.xg + (size_t)n * r.w.xg;
    r.h = (float *)(r.xu + (size_t)n * r.w.xu);
    r.hd = (uint8_t *)r.h + (size_t)n * r.w.h;
    r.rb_g = quant_row_bytes(sh->type_gate, sh->E);
    r.rb_u = quant_row_bytes(sh->type_up, sh->E);
    r.rb_d = quant_row_bytes(sh->type_down, sh->F);
    const quant_quantize_fn qg = kernel_quantize(quant_traits_of(sh->type_gate)->act_type);
    const quant_quantize_fn qu = kernel_quantize(quant_traits_of(sh->type_up)->act_type);
    const quant_quantize_fn qd = kernel_quantize(quant_traits_of(sh->type_down)->act_type);
    for (int j = 0; j < n; j++) { /* a few blocks each: not worth the threads */
        qg(jobs[j].x, r.xg + (size_t)j * r.w.xg, sh->E);
        qu(jobs[j].x, r.xu + (size_t)j * r.w.xu, sh->E);
    }
    threadpool_run(pool, gate_up_task, &r);
    for (int j = 0; j < n; j++)
        qd((const float *)((const uint8_t *)r.h + (size_t)j * r.w.h), r.hd + (size_t)j * r.w.hd, sh->F);
    threadpool_run(pool, down_task, &r);
    return 0;
}
