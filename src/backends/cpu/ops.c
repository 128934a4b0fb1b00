/* CPU backend: the operations of backend.h over host memory, parallel on a thread pool.
 *
 * Work is split by output element (matmul rows, attention heads), never inside a reduction, so
 * the number of threads never changes a result bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/ops_ssm.h"
#include "backends/cpu/threadpool.h"
#include "formats/quant.h"

typedef struct cpu_backend {
    backend base;
    threadpool *pool;
    void *scratch; /* encoded activations, attention scores */
    size_t scratch_bytes;
} cpu_backend;

static void *scratch(cpu_backend *c, size_t bytes) {
    if (bytes > c->scratch_bytes) {
        free(c->scratch);
        size_t cap = bytes + bytes / 4 + 4096;
        c->scratch = aligned_alloc(64, (cap + 63) / 64 * 64);
        if (!c->scratch) abort(); /* scratch is planned; failing here is a planner bug */
        c->scratch_bytes = cap;
    }
    return c->scratch;
}

/* Contiguous share [*lo, *hi) of n items for thread ith of nth. */
static void split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    int64_t per = n / nth, extra = n % nth;
    *lo = ith * per + (ith < extra ? ith : extra);
    *hi = *lo + per + (ith < extra ? 1 : 0);
}

/* ---- embed -------------------------------------------------------------------------------- */

static void cpu_embed(backend *b, const tview *w, const int32_t *ids, int n, float *out) {
    const quant_traits *qt = quant_traits_of(w->type);
    for (int t = 0; t < n; t++)
        qt->dequantize((const uint8_t *)w->data + (size_t)ids[t] * w->row_bytes,
                       out + (size_t)t * w->ne[0], w->ne[0]);
}

/* ---- matmul ------------------------------------------------------------------------------- */

typedef struct mm_job {
    const tview *w;
    const float *x;
    int n;
    float *out;
    int out_stride;
    const uint8_t *act; /* activations encoded in act_type, n rows of act_row bytes */
    size_t act_row;
    quant_quantize_fn encode;
    kernel_dot_fn dot;
    kernel_tile_fn tile; /* NULL: loop over dots */
} mm_job;

static void mm_encode_task(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++)
        j->encode(j->x + t * j->w->ne[0], (uint8_t *)j->act + t * j->act_row, j->w->ne[0]);
}

/* Cache blocking: a tile of MM_ROW_BLOCK weight rows x MM_TOK_BLOCK tokens. The rows of a tile
 * are read from memory once and stay in L1/L2 while the tile's tokens pass over them; the
 * tokens' activations (a few KiB each) stay in L2 across the row tiles. */
#define MM_ROW_BLOCK 16
#define MM_TOK_BLOCK 16

static void mm_rows(const mm_job *j, int64_t lo, int64_t hi) {
    const tview *w = j->w;
    const uint8_t *wd = w->data;
    for (int64_t r0 = lo; r0 < hi; r0 += MM_ROW_BLOCK) {
        int64_t r1 = r0 + MM_ROW_BLOCK < hi ? r0 + MM_ROW_BLOCK : hi;
        for (int t0 = 0; t0 < j->n; t0 += MM_TOK_BLOCK) {
            int t1 = t0 + MM_TOK_BLOCK < j->n ? t0 + MM_TOK_BLOCK : j->n;
            const uint8_t *a = j->act + (size_t)t0 * j->act_row;
            float *o = j->out + (size_t)t0 * j->out_stride;
            if (j->tile && t1 - t0 > 1) {
                j->tile(w->ne[0], wd + r0 * w->row_bytes, w->row_bytes, (int)(r1 - r0), a,
                        j->act_row, t1 - t0, o + r0, (size_t)j->out_stride);
                continue;
            }
            for (int t = t0; t < t1; t++, a += j->act_row, o += j->out_stride)
                for (int64_t r = r0; r < r1; r++) o[r] = j->dot(w->ne[0], wd + r * w->row_bytes, a);
        }
    }
}

static void mm_task(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    int64_t lo, hi;
    split(j->w->ne[1], ith, nth, &lo, &hi);
    mm_rows(j, lo, hi);
}

static void cpu_matmul(backend *b, const tview *w, const float *x, int n, float *out,
                       int out_stride) {
    cpu_backend *c = (cpu_backend *)b;
    const quant_traits *qt = quant_traits_of(w->type);
    mm_job j = {.w = w, .x = x, .n = n, .out = out, .out_stride = out_stride,
                .encode = kernel_quantize(qt->act_type), .dot = kernel_dot(w->type),
                .tile = kernel_tile(w->type)};
    if (qt->act_type == GGML_TYPE_F32) {
        j.act = (const uint8_t *)x; /* no encoding needed */
        j.act_row = (size_t)w->ne[0] * sizeof(float);
    } else {
        j.act_row = quant_row_bytes(qt->act_type, w->ne[0]);
        j.act = scratch(c, j.act_row * (size_t)n);
        threadpool_run(c->pool, mm_encode_task, &j);
    }
    threadpool_run(c->pool, mm_task, &j);
}

/* ---- rmsnorm ------------------------------------------------------------------------------ */

static void cpu_rmsnorm(backend *b, const float *x, const tview *w, int n_rows, int dim,
                        float eps, float *y) {
    const float *wv = w && w->data ? w->data : NULL;
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * dim;
        float *yr = y + (size_t)r * dim;
        double sum = 0.0; /* as ggml: squares summed in double */
        for (int i = 0; i < dim; i++) sum += (double)(xr[i] * xr[i]);
        float scale = 1.0f / sqrtf((float)(sum / dim) + eps);
        if (wv)
            for (int i = 0; i < dim; i++) yr[i] = (xr[i] * scale) * wv[i];
        else
            for (int i = 0; i < dim; i++) yr[i] = xr[i] * scale;
    }
}

/* ---- rope --------------------------------------------------------------------------------- */

/* Angles follow ggml's float recipe (theta *= base^(-2/n_rot) per pair) so that positions
 * rotate exactly as in llama.cpp. */
static void cpu_rope(backend *b, float *x, int n_tok, int n_head, int head_dim, int n_rot,
                     const int32_t *pos, float freq_base, rope_mode mode) {
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    float cs[512], sn[512]; /* n_rot/2 pairs; head dims are at most 1024 */
    for (int t = 0; t < n_tok; t++) {
        float theta = (float)pos[t];
        for (int i = 0; i < n_rot / 2; i++) {
            cs[i] = cosf(theta);
            sn[i] = sinf(theta);
            theta *= theta_scale;
        }
        for (int h = 0; h < n_head; h++) {
            float *v = x + ((size_t)t * n_head + h) * head_dim;
            for (int i = 0; i < n_rot / 2; i++) {
                int i0 = mode == ROPE_NEOX ? i : 2 * i;
                int i1 = mode == ROPE_NEOX ? i + n_rot / 2 : 2 * i + 1;
                float x0 = v[i0], x1 = v[i1];
                v[i0] = x0 * cs[i] - x1 * sn[i];
                v[i1] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct attn_job {
    const float *q, *kc, *vc;
    int n, pos0, n_head, n_head_kv, hd, hd_v;
    float scale;
    float *out;
    float *scores; /* per thread: pos0 + n floats */
} attn_job;

static void attn_task(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    int64_t lo, hi;
    split((int64_t)j->n * j->n_head, ith, nth, &lo, &hi);
    float *s = j->scores + (size_t)ith * (size_t)(j->pos0 + j->n);
    const int group = j->n_head / j->n_head_kv;
    const size_t krow = (size_t)j->n_head_kv * j->hd, vrow = (size_t)j->n_head_kv * j->hd_v;
    for (int64_t item = lo; item < hi; item++) {
        int t = (int)(item / j->n_head), h = (int)(item % j->n_head), kvh = h / group;
        int n_kv = j->pos0 + t + 1;
        const float *q = j->q + ((size_t)t * j->n_head + h) * j->hd;
        float mx = -INFINITY;
        for (int p = 0; p < n_kv; p++) {
            const float *k = j->kc + p * krow + (size_t)kvh * j->hd;
            s[p] = kernel_dot_f32(j->hd, q, k) * j->scale;
            if (s[p] > mx) mx = s[p];
        }
        double sum = 0.0;
        for (int p = 0; p < n_kv; p++) {
            s[p] = expf(s[p] - mx);
            sum += s[p];
        }
        float inv = (float)(1.0 / sum);
        float *o = j->out + ((size_t)t * j->n_head + h) * j->hd_v;
        for (int d = 0; d < j->hd_v; d++) o[d] = 0.0f;
        for (int p = 0; p < n_kv; p++) {
            const float *v = j->vc + p * vrow + (size_t)kvh * j->hd_v;
            float wgt = s[p] * inv;
            for (int d = 0; d < j->hd_v; d++) o[d] += wgt * v[d];
        }
    }
}

static void cpu_attention(backend *b, const float *q, const float *kc, const float *vc, int n,
                          int pos0, int n_head, int n_head_kv, int hd, int hd_v, float scale,
                          float *out) {
    cpu_backend *c = (cpu_backend *)b;
    attn_job j = {q, kc, vc, n, pos0, n_head, n_head_kv, hd, hd_v, scale, out, NULL};
    j.scores = scratch(c, sizeof(float) * (size_t)(pos0 + n) * (size_t)threadpool_size(c->pool));
    threadpool_run(c->pool, attn_task, &j);
}

/* ---- elementwise -------------------------------------------------------------------------- */

static void cpu_add(backend *b, float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

static void cpu_swiglu(backend *b, float *g, const float *u, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

static void cpu_free(backend *b) {
    cpu_backend *c = (cpu_backend *)b;
    threadpool_free(c->pool);
    free(c->scratch);
    free(c);
}

static const backend_ops cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .embed = cpu_embed,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .add = cpu_add,
    .swiglu = cpu_swiglu,
    .l2norm = cpu_l2norm,
    .conv1d_silu = cpu_conv1d_silu,
    .gated_delta = cpu_gated_delta,
    .sigmoid_mul = cpu_sigmoid_mul,
    .gdn_gates = cpu_gdn_gates,
};

backend *backend_cpu_new(int n_threads) {
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (n_threads <= 0) n_threads = threadpool_default_threads();
    c->pool = threadpool_new(n_threads);
    if (!c->pool) {
        free(c);
        return NULL;
    }
    c->base.ops = &cpu_ops;
    c->base.n_threads = threadpool_size(c->pool);
    return &c->base;
}

void *cpu_backend_scratch(backend *b, size_t bytes) { return scratch((cpu_backend *)b, bytes); }

void backend_cpu_parallel(backend *b, backend_task_fn fn, void *ctx) {
    threadpool_run(((cpu_backend *)b)->pool, fn, ctx);
}

tview tview_matrix(const tview *t, int64_t i) {
    tview m = *t;
    m.data = (const uint8_t *)t->data + (size_t)i * t->mat_bytes;
    m.ne[2] = 1;
    m.ne[3] = 1;
    return m;
}
