/* CPU backend: QSA block-sparse attention of qwen4exp (backend.h: qsa_pool, qsa_select,
 * attention_sel).
 *
 * Selection reproduces llama.cpp's: every cell (cache position) gets its block's score, the
 * cells of the incomplete tail block a value above all scores, and ggml's CPU top-k takes the
 * first top_k + ratio - 1 cells of std::partial_sort with "greater" as the order. Cells of one
 * block tie, so which cells of the last, partly taken block survive is decided by that
 * algorithm's heap order; we run the same heap selection (libstdc++'s __heap_select: make_heap
 * over the first `width` cells, then each later cell that beats the heap's top replaces it) so
 * that the tie falls the same way. Any other tie-break would attend to other cells.
 *
 * Attention over the chosen cells uses the dense kernel (kernels.h) on gathered key and value
 * rows, in ascending position order; a token whose visible context fits the budget uses the
 * dense kernel over the cache directly, so below the budget QSA is exactly dense attention. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/kernels.h"
#include "backends/cpu/threadpool.h"
#include "backends/cpu/ops_hc.h"
#include "backends/cpu/ops_ssm.h"

/* ---- block keys ------------------------------------------------------------------------------ */

/* NeoX rotation of the first n_rot dims at position pos, with cpu_rope's float recipe. */
static void rope_row(float *v, int n_rot, int pos, float freq_base) {
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_rot / 2; i++) {
        const float cs = cosf(theta), sn = sinf(theta);
        const float x0 = v[i], x1 = v[i + n_rot / 2];
        v[i] = x0 * cs - x1 * sn;
        v[i + n_rot / 2] = x0 * sn + x1 * cs;
        theta *= theta_scale;
    }
}

void cpu_qsa_pool(backend *b, const float *kraw, int b0, int nb, int ratio, int dim,
                  const float *k_norm, float eps, int n_rot, float freq_base, float *kblk) {
    (void)b;
    const float inv = 1.0f / (float)ratio;
    for (int bi = b0; bi < b0 + nb; bi++) {
        float *o = kblk + (size_t)bi * dim;
        const float *k0 = kraw + (size_t)bi * ratio * dim;
        /* llama.cpp: slice 0, + slice 1, ... in order, then * (1/ratio) */
        for (int i = 0; i < dim; i++) o[i] = k0[i];
        for (int m = 1; m < ratio; m++)
            for (int i = 0; i < dim; i++) o[i] = o[i] + k0[(size_t)m * dim + i];
        for (int i = 0; i < dim; i++) o[i] = o[i] * inv;
        double sum = 0.0;
        for (int i = 0; i < dim; i++) sum += (double)(o[i] * o[i]);
        const float scale = 1.0f / sqrtf((float)(sum / dim) + eps);
        for (int i = 0; i < dim; i++) o[i] = (o[i] * scale) * k_norm[i];
        rope_row(o, n_rot, bi * ratio, freq_base);
    }
}

/* ---- selection ------------------------------------------------------------------------------- */

/* The cell values of one query: the block score, or +inf for the tail (every tail cell ties
 * with every other and beats every block, as llama.cpp's 1e9 bias does). */
typedef struct cells {
    const float *score; /* per complete block */
    int ratio, tail_start;
} cells;

static inline float cell_val(const cells *c, int32_t j) {
    return j >= c->tail_start ? INFINITY : c->score[j / c->ratio];
}

/* comp(a, b) of ggml's top-k: a's value greater than b's */
static inline bool greater(const cells *c, int32_t a, int32_t b) {
    return cell_val(c, a) > cell_val(c, b);
}

/* libstdc++'s __push_heap / __adjust_heap with comp = greater (a min-heap on the value) */
static void push_heap_(const cells *c, int32_t *h, int64_t hole, int64_t top, int32_t v) {
    int64_t parent = (hole - 1) / 2;
    while (hole > top && greater(c, h[parent], v)) {
        h[hole] = h[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    h[hole] = v;
}

static void adjust_heap_(const cells *c, int32_t *h, int64_t hole, int64_t len, int32_t v) {
    const int64_t top = hole;
    int64_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (greater(c, h[child], h[child - 1])) child--;
        h[hole] = h[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        h[hole] = h[child - 1];
        hole = child - 1;
    }
    push_heap_(c, h, hole, top, v);
}

/* the first `width` entries of idx[0..len) after std::partial_sort(idx, idx + width, idx + len)
 * hold the selected cells (in heap order; only the set matters) */
static void heap_select(const cells *c, int32_t *idx, int64_t width, int64_t len) {
    if (width >= 2)
        for (int64_t parent = (width - 2) / 2;; parent--) {
            adjust_heap_(c, idx, parent, width, idx[parent]);
            if (parent == 0) break;
        }
    for (int64_t i = width; i < len; i++)
        if (greater(c, idx[i], idx[0])) {
            const int32_t v = idx[i];
            idx[i] = idx[0];
            adjust_heap_(c, idx, 0, width, v);
        }
}

typedef struct sel_job {
    const float *q, *kblk;
    int n, pos0, n_head, dim, ratio, top_k, sel_stride;
    int32_t *sel, *sel_n;
    uint8_t *work; /* per thread: stride bytes */
    size_t stride;
} sel_job;

static void sel_task(void *ctx, int ith, int nth) {
    const sel_job *j = ctx;
    int64_t lo, hi;
    threadpool_share(j->n, ith, nth, &lo, &hi);
    const int64_t width = (int64_t)j->top_k + j->ratio - 1;
    float *score = (float *)(j->work + (size_t)ith * j->stride);
    const int64_t max_cells = (int64_t)j->pos0 + j->n;
    int32_t *idx = (int32_t *)(score + (max_cells / j->ratio + 1));
    uint8_t *mark = (uint8_t *)(idx + max_cells);
    for (int64_t t = lo; t < hi; t++) {
        const int p = j->pos0 + (int)t;
        int32_t *sel = j->sel + (size_t)t * j->sel_stride;
        if ((int64_t)p + 1 <= width) {
            j->sel_n[t] = -1; /* within the budget: dense */
            continue;
        }
        const int nb = (p + 1) / j->ratio;
        const float *q = j->q + (size_t)t * j->n_head * j->dim;
        for (int b = 0; b < nb; b++) {
            const float *kb = j->kblk + (size_t)b * j->dim;
            float s = 0.0f;
            for (int h = 0; h < j->n_head; h++) {
                float d = kernel_dot_f32(j->dim, q + (size_t)h * j->dim, kb);
                d = d > 0.0f ? d : 0.0f;
                s = h == 0 ? d : s + d;
            }
            score[b] = s;
        }
        const cells c = {score, j->ratio, nb * j->ratio};
        const int64_t len = (int64_t)p + 1;
        for (int64_t i = 0; i < len; i++) idx[i] = (int32_t)i;
        heap_select(&c, idx, width, len);
        memset(mark, 0, (size_t)len);
        for (int64_t i = 0; i < width; i++) mark[idx[i]] = 1;
        int k = 0;
        for (int64_t i = 0; i < len; i++)
            if (mark[i]) sel[k++] = (int32_t)i;
        j->sel_n[t] = k;
    }
}

void cpu_qsa_select(backend *b, const float *q, const float *kblk, int n, int pos0, int n_head,
                    int dim, int ratio, int top_k, int32_t *sel, int32_t *sel_n, int sel_stride) {
    if (ratio < 1 || top_k < 1 || sel_stride < top_k + ratio - 1) abort(); /* loader checks */
    sel_job j = {q, kblk, n, pos0, n_head, dim, ratio, top_k, sel_stride, sel, sel_n, NULL, 0};
    const size_t cells_max = (size_t)pos0 + (size_t)n;
    j.stride = ((cells_max / (size_t)ratio + 1) * sizeof(float) + cells_max * sizeof(int32_t) +
                cells_max + 63) / 64 * 64;
    j.work = cpu_backend_scratch(b, j.stride * (size_t)b->n_threads);
    backend_cpu_parallel(b, sel_task, &j);
}

/* ---- attention over the chosen cells ---------------------------------------------------------- */

typedef struct asel_job {
    const float *q, *kc, *vc;
    int n, pos0, n_head, n_head_kv, hd, hd_v, sel_stride;
    float scale;
    const int32_t *sel, *sel_n;
    float *out;
    float *work; /* per thread: stride floats */
    size_t stride;
    kernel_attn_fn fn;
} asel_job;

static void asel_task(void *ctx, int ith, int nth) {
    const asel_job *j = ctx;
    int64_t lo, hi;
    threadpool_share((int64_t)j->n * j->n_head_kv, ith, nth, &lo, &hi);
    const int group = j->n_head / j->n_head_kv;
    float *work = j->work + (size_t)ith * j->stride;
    float *kbuf = work + (size_t)group * KERNEL_ATTN_TILE;
    float *vbuf = kbuf + (size_t)j->sel_stride * j->hd;
    const size_t krow = (size_t)j->n_head_kv * j->hd, vrow = (size_t)j->n_head_kv * j->hd_v;
    for (int64_t item = lo; item < hi; item++) {
        const int t = (int)(item / j->n_head_kv), kvh = (int)(item % j->n_head_kv), h0 = kvh * group;
        const float *q = j->q + ((size_t)t * j->n_head + h0) * j->hd;
        float *out = j->out + ((size_t)t * j->n_head + h0) * j->hd_v;
        const int cnt = j->sel_n[t];
        if (cnt < 0) {
            j->fn(q, (size_t)j->hd, group, j->kc + (size_t)kvh * j->hd, krow,
                  j->vc + (size_t)kvh * j->hd_v, vrow, j->pos0 + t + 1, j->hd, j->hd_v, j->scale,
                  out, (size_t)j->hd_v, work);
            continue;
        }
        const int32_t *sel = j->sel + (size_t)t * j->sel_stride;
        for (int i = 0; i < cnt; i++) {
            memcpy(kbuf + (size_t)i * j->hd, j->kc + (size_t)sel[i] * krow + (size_t)kvh * j->hd,
                   sizeof(float) * (size_t)j->hd);
            memcpy(vbuf + (size_t)i * j->hd_v,
                   j->vc + (size_t)sel[i] * vrow + (size_t)kvh * j->hd_v,
                   sizeof(float) * (size_t)j->hd_v);
        }
        j->fn(q, (size_t)j->hd, group, kbuf, (size_t)j->hd, vbuf, (size_t)j->hd_v, cnt, j->hd,
              j->hd_v, j->scale, out, (size_t)j->hd_v, work);
    }
}

void cpu_attention_sel(backend *b, const float *q, const float *kc, const float *vc, int n,
                       int pos0, int n_head, int n_head_kv, int hd, int hd_v, float scale,
                       const int32_t *sel, const int32_t *sel_n, int sel_stride, float *out) {
    asel_job j = {q, kc, vc, n, pos0, n_head, n_head_kv, hd, hd_v, sel_stride, scale, sel, sel_n,
                  out, NULL, 0, kernel_attn()};
    j.stride = ((size_t)(n_head / n_head_kv) * KERNEL_ATTN_TILE +
                (size_t)sel_stride * (size_t)(hd + hd_v) + 15) / 16 * 16;
    j.work = cpu_backend_scratch(b, j.stride * sizeof(float) * (size_t)b->n_threads);
    backend_cpu_parallel(b, asel_task, &j);
}
