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

/* What a row of one type needs, looked up once per matrix. */
typedef struct row_kind {
    uint32_t type;
    kernel_terms_fn terms; /* NULL: kernel_block_terms (one dot per block) */
    size_t wbb, abb;       /* bytes of a weight block, of an activation block */
    int B, groups;         /* values a block; blocks per warp iteration (lane groups of B / 32) */
} row_kind;

static row_kind kind_of(uint32_t type) {
    const quant_traits *wt = quant_traits_of(type), *at = quant_traits_of(wt->act_type);
    row_kind k = {type, kernel_terms_of(type), wt->block_bytes, at->block_bytes, (int)wt->block_elems,
                  32 / ((int)wt->block_elems / 32)};
    return k;
}

static float row_dot(const row_kind *k, int64_t K, const uint8_t *w, const uint8_t *a) {
    const int64_t nblk = K / k->B;
    /* v[g]: the sum of lane group g's first lane (its other lanes only ever hold +0) */
    float v[32], t[64];
    for (int g = 0; g < k->groups; g++) v[g] = 0.0f;
    int g = 0;
    for (int64_t b0 = 0; b0 < nblk; b0 += 64) {
        const int64_t nb = nblk - b0 < 64 ? nblk - b0 : 64;
        /* the blocks' terms (the CPU kernels' per-block float step, as the GPU's block_term) */
        const uint8_t *wb = w + (size_t)b0 * k->wbb, *ab = a + (size_t)b0 * k->abb;
        if (k->terms) k->terms(nb * k->B, wb, ab, t);
        else kernel_block_terms(k->type, nb * k->B, wb, ab, t);
        for (int64_t b = 0; b < nb; b++) {
            v[g] = v[g] + t[b];
            g = g + 1 == k->groups ? 0 : g + 1;
        }
    }
    /* The butterfly (lane l += lane l ^ off, off = 16 .. 1) as lane 0 sees it, on the groups'
     * first lanes: steps with off below B / 32 add +0 there, which changes nothing because a
     * lane never holds -0 (it starts at +0, and a rounded-to-nearest sum is -0 only when both
     * addends are); the sum commutes, so lane l + lane l + off is lane l + off + lane l. */
    for (int off = k->groups / 2; off >= 1; off >>= 1)
        for (int j = 0; j < off; j++) v[j] = v[j] + v[j + off];
    return v[0];
}

float device_row_dot(uint32_t type, int64_t K, const uint8_t *w, const uint8_t *a) {
    const row_kind k = kind_of(type);
    return row_dot(&k, K, w, a);
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
    row_kind kg, ku, kd;
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
        const float g = row_dot(&r->kg, r->sh->E, jb->gate + (size_t)row * r->rb_g, r->xg + (size_t)j * r->w.xg);
        const float u = row_dot(&r->ku, r->sh->E, jb->up + (size_t)row * r->rb_u, r->xu + (size_t)j * r->w.xu);
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
        jb->y[row] = row_dot(&r->kd, r->sh->F, jb->down + (size_t)row * r->rb_d, r->hd + (size_t)j * r->w.hd);
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
    r.kg = kind_of(sh->type_gate);
    r.ku = kind_of(sh->type_up);
    r.kd = kind_of(sh->type_down);
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
