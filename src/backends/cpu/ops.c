/* CPU backend: the operations of backend.h over host memory, parallel on a thread pool.
 *
 * Work is split by output element (matmul rows, attention heads), never inside a reduction, so
 * the number of threads never changes a result bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/ops_hc.h"
#include "backends/cpu/ops_moe.h"
#include "backends/cpu/ops_ssm.h"
#include "backends/cpu/sumsq_rows.h"
#include "backends/cpu/threadpool.h"
#include "formats/quant.h"

typedef struct cpu_backend {
    backend base;
    threadpool *pool;
    void *scratch; /* encoded activations, attention scores */
    size_t scratch_bytes;
    struct cpu_ext *ext; /* step inputs (ops_moe.c) */
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
    const kernel_tile *tile; /* prefill tile kernels (NULL: loop over dots) */
    uint8_t *packed;         /* the activations packed for tile->run */
    int64_t out_r0;          /* row r is written at out[t * out_stride + r - out_r0] */
    const int32_t *rows;     /* non-NULL: token t's activations are x row rows[t] / rows_div */
    int rows_div;
    const uint8_t *pre;      /* non-NULL: x's rows already encoded (act_row bytes each): copied */
    bool guided;             /* more shares than threads (dot_shares): shrinking shares */
} mm_job;

/* Tile kernels pay a packing pass over the activations; below this many tokens the dot loop
 * (which reads each weight row once per 16 tokens from L1) is as fast, unless the tile says
 * otherwise (kernel_tile.min_toks). */
#define MM_TILE_MIN_TOKS 4

/* The tile kernel a product of n tokens with this weight type uses, or NULL (the dot loop). */
static const kernel_tile *mm_tile(uint32_t type, int n) {
    const kernel_tile *tile = kernel_tile_of(type);
    return tile && n >= (tile->min_toks > 0 ? tile->min_toks : MM_TILE_MIN_TOKS) ? tile : NULL;
}

static void mm_encode_task(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    int64_t lo, hi;
    threadpool_share(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const int64_t src = j->rows ? j->rows[t] / j->rows_div : t;
        if (j->pre)
            memcpy((uint8_t *)j->act + t * j->act_row, j->pre + src * j->act_row, j->act_row);
        else
            j->encode(j->x + src * j->w->ne[0], (uint8_t *)j->act + t * j->act_row, j->w->ne[0]);
    }
}

static void mm_pack_task(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    int64_t lo, hi;
    threadpool_share((j->n + 15) / 16, ith, nth, &lo, &hi); /* blocks of 16 tokens */
    if (lo < hi)
        j->tile->pack(j->w->ne[0], j->act, j->act_row, j->n, (int)(16 * lo),
                      (int)(16 * hi < j->n ? 16 * hi : j->n), j->packed);
}

/* Cache blocking of the dot path: a tile of MM_ROW_BLOCK weight rows x MM_TOK_BLOCK tokens.
 * The rows of a tile are read from memory once and stay in L1/L2 while the tile's tokens pass
 * over them; the tokens' activations (a few KiB each) stay in L2 across the row tiles. */
#define MM_ROW_BLOCK 16
#define MM_TOK_BLOCK 16
#ifndef MM_PREFETCH_ROWS
#define MM_PREFETCH_ROWS 4 /* 0: no software prefetch */
#endif

/* Rows a one-token product asks for ahead: MM_PREFETCH_ROWS, or more for short rows, so that at
 * least 3 KiB are in flight (an expert's down row of 768 values is 432-630 bytes; asking for
 * 7 of those instead of 4: +4% on that product, bench harness, 8 alternating runs). */
static inline int64_t mm_prefetch_rows(size_t row_bytes) {
    if (MM_PREFETCH_ROWS == 0 || (size_t)MM_PREFETCH_ROWS * row_bytes >= 3072) return MM_PREFETCH_ROWS;
    const int64_t r = (int64_t)((3072 + row_bytes - 1) / row_bytes);
    return r < 16 ? r : 16;
}

/* Ask L1 for a whole weight row. */
static inline void prefetch_row(const uint8_t *row, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(row + off);
}

/* Rows [lo, hi) of the product for all tokens. */
static void mm_rows(const mm_job *j, int64_t lo, int64_t hi) {
    const tview *w = j->w;
    const uint8_t *wd = w->data;
    if (lo >= hi) return;
    if (j->packed) {
        j->tile->run(w->ne[0], wd + lo * w->row_bytes, w->row_bytes, (int)(hi - lo), j->packed, j->n,
                     j->out + (lo - j->out_r0), (size_t)j->out_stride);
        return;
    }
    for (int64_t r0 = lo; r0 < hi; r0 += MM_ROW_BLOCK) {
        int64_t r1 = r0 + MM_ROW_BLOCK < hi ? r0 + MM_ROW_BLOCK : hi;
        for (int t0 = 0; t0 < j->n; t0 += MM_TOK_BLOCK) {
            int t1 = t0 + MM_TOK_BLOCK < j->n ? t0 + MM_TOK_BLOCK : j->n;
            const uint8_t *a = j->act + (size_t)t0 * j->act_row;
            float *o = j->out + (size_t)t0 * j->out_stride + (r0 - j->out_r0);
            if (t1 - t0 == 1) {
                /* one token (decode): a pure stream over the rows; ask for the rows a few KiB
                 * ahead so that they are in flight while this one is multiplied */
                const int64_t ahead = mm_prefetch_rows(w->row_bytes);
                /* a range's first row: its next rows all at once, not one by one on demand */
                if (ahead > 0 && r0 == lo)
                    for (int64_t r = lo + 1; r < lo + ahead && r < hi; r++) prefetch_row(wd + r * w->row_bytes, w->row_bytes);
                for (int64_t r = r0; r < r1; r++) {
                    if (ahead > 0 && r + ahead < hi) prefetch_row(wd + (r + ahead) * w->row_bytes, w->row_bytes);
                    o[r - r0] = j->dot(w->ne[0], wd + r * w->row_bytes, a);
                }
                continue;
            }
            for (int t = t0; t < t1; t++, a += j->act_row, o += j->out_stride)
                for (int64_t r = r0; r < r1; r++) o[r - r0] = j->dot(w->ne[0], wd + r * w->row_bytes, a);
        }
    }
}

/* Whether dot-path jobs (more shares than threads) take shrinking shares
 * (threadpool_share_guided): the even split left a thread waiting on the other's last share, 6.6%
 * of a 30B-A3B decode's samples in worker_main and threadpool_run_shares, 4.6% with 16 shares a
 * thread (whose extra row-stream starts cost more than that saved). SLUICE_CPU_EVEN_SHARES=1: the
 * even split (measurement). The rows each share computes, not which thread, decide every value. */
static bool guided_shares(void) {
    static int g = -1;
    if (g < 0) {
        const char *e = getenv("SLUICE_CPU_EVEN_SHARES");
        g = !(e && atoi(e) > 0);
    }
    return g;
}

/* Share ith of nth over n items: shrinking when guided (a dot-path job) unless switched off. */
static void share_of(int64_t n, int ith, int nth, bool guided, int64_t *lo, int64_t *hi) {
    if (guided && guided_shares()) threadpool_share_guided(n, ith, nth, lo, hi);
    else threadpool_share(n, ith, nth, lo, hi);
}

/* A share of rows, in multiples of g (the tile kernels' row group: 4, or the tile's own). */
static void split_rows_by(int64_t n, int64_t g, int ith, int nth, bool guided, int64_t *lo, int64_t *hi) {
    int64_t groups = (n + g - 1) / g, glo, ghi;
    share_of(groups, ith, nth, guided, &glo, &ghi);
    *lo = g * glo < n ? g * glo : n;
    *hi = g * ghi < n ? g * ghi : n;
}

static void split_rows(int64_t n, int ith, int nth, bool guided, int64_t *lo, int64_t *hi) {
    split_rows_by(n, 4, ith, nth, guided, lo, hi);
}

static void mm_task(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    int64_t lo, hi;
    split_rows_by(j->w->ne[1], j->tile && j->tile->row_group > 0 ? j->tile->row_group : 4, ith, nth, j->guided, &lo, &hi);
    mm_rows(j, lo, hi);
}

/* Bytes of scratch a job needs for its encoded (and packed) activations. */
static size_t mm_scratch_bytes(const tview *w, int n) {
    uint32_t at = quant_traits_of(w->type)->act_type;
    size_t bytes = at == GGML_TYPE_F32 ? 0 : (quant_row_bytes(at, w->ne[0]) * (size_t)n + 63) / 64 * 64;
    const kernel_tile *tile = mm_tile(w->type, n);
    if (tile) bytes += (tile->packed_bytes(w->ne[0], n) + 63) / 64 * 64;
    return bytes;
}

/* Sets up j for its weight: encodes its n activation rows into dst (on the caller for a few
 * rows, or with pool NULL: a dispatch costs more than encoding one row) and packs them for the
 * tile kernel when there is one. Returns the bytes used at dst (at most mm_scratch_bytes). */
static size_t mm_prepare_on(threadpool *pool, mm_job *j, uint8_t *dst) {
    const quant_traits *qt = quant_traits_of(j->w->type);
    size_t used = 0;
    j->encode = kernel_quantize(qt->act_type);
    j->dot = kernel_dot(j->w->type);
    j->tile = mm_tile(j->w->type, j->n);
    j->packed = NULL;
    if (qt->act_type == GGML_TYPE_F32) {
        j->act = (const uint8_t *)j->x; /* no encoding needed */
        j->act_row = (size_t)j->w->ne[0] * sizeof(float);
    } else {
        j->act_row = quant_row_bytes(qt->act_type, j->w->ne[0]);
        j->act = dst;
        if (j->n < 4 || !pool)
            mm_encode_task(j, 0, 1);
        else
            threadpool_run(pool, mm_encode_task, j);
        used = (j->act_row * (size_t)j->n + 63) / 64 * 64;
    }
    if (j->tile) {
        j->packed = dst + used;
        if (pool)
            threadpool_run(pool, mm_pack_task, j);
        else
            mm_pack_task(j, 0, 1);
        used += (j->tile->packed_bytes(j->w->ne[0], j->n) + 63) / 64 * 64;
    }
    return used;
}

static size_t mm_prepare(cpu_backend *c, mm_job *j, uint8_t *dst) { return mm_prepare_on(c->pool, j, dst); }

/* Shares of a row-streaming product (the dot path: decode and short batches) per thread, 4:
 * claimed by whichever thread is free, so a thread slowed by the other's memory traffic or by
 * the OS does not leave the other waiting at the job's end (decode, 2 threads, alternating
 * runs: 30B-A3B 6.59 -> 6.91 t/s, 35B-A3B 6.71 -> 7.12; bench/results/2026-11-30-cpu-shares.md).
 * SLUICE_CPU_SHARES overrides (measurement). The rows each share computes, not which thread,
 * decide every value. */
static int dot_shares(const cpu_backend *c) {
    static int per = 0;
    if (!per) {
        const char *e = getenv("SLUICE_CPU_SHARES");
        per = e && atoi(e) > 0 ? atoi(e) : 4;
    }
    return per * threadpool_size(c->pool);
}

static void cpu_matmul(backend *b, const tview *w, const float *x, int n, float *out,
                       int out_stride) {
    cpu_backend *c = (cpu_backend *)b;
    mm_job j = {.w = w, .x = x, .n = n, .out = out, .out_stride = out_stride};
    mm_prepare(c, &j, scratch(c, mm_scratch_bytes(w, n)));
    const int shares = j.tile && n >= MM_TILE_MIN_TOKS ? threadpool_size(c->pool) : dot_shares(c);
    j.guided = shares > threadpool_size(c->pool);
    threadpool_run_shares(c->pool, mm_task, &j, shares);
}

/* ---- fused gate/up projection with SwiGLU -------------------------------------------------
 * out[t][r] = silu(gate_r . x_t) * (up_r . x_t): one pass over the activation rows and one
 * dispatch; each thread computes both projections for a block of GU_ROWS rows (all tokens)
 * into its own buffers and combines them there, so neither projection is written out. The
 * dots and the combination are those of matmul + matmul + swiglu: the same bits. */

#define GU_ROWS 16

/* Rows per block: GU_ROWS for the dot path of a few tokens; for the tile path (and one token:
 * a tile used at decode, Q2_0) long runs of each matrix, so that the tile's prefetch of its
 * next row groups runs ahead through the block instead of every switch between the gate and
 * the up matrix starting cold (30B-A3B pp512, alternating: 111.8-112.6 -> 112.2-115.4 t/s;
 * the block's outputs, 2 x 128 rows x n tokens, stay in L2 up to about 512 tokens). */
static int64_t gu_block_rows(int n, bool tiled) { return n == 1 || tiled ? 128 : GU_ROWS; }

typedef struct gu_job {
    mm_job g, u;
    float *out;
    int out_stride;
    float *buf; /* per thread: 2 x GU_ROWS x n floats */
} gu_job;

/* The SwiGLU of gate and up values: one kernel (kernel_silu_mul, the expression
 * g / (1 + exp(-g)) * u with exp_f32) for the fused products and the plain swiglu op, so that
 * they round alike. The products below leave the gate's values where the SwiGLU goes, then run
 * it over a block of rows. */
#define GU_ONE_BLOCK 64

/* One token (decode): gate row r and up row r one after the other, both asked for ahead: the
 * two row streams advance together, where blocks of GU_ROWS rows of one then the other started
 * each block's rows cold. Same dots, same combination. */
static void gu_rows_one(const gu_job *j, int64_t lo, int64_t hi) {
    const tview *gw = j->g.w, *uw = j->u.w;
    const uint8_t *gd = gw->data, *ud = uw->data;
    const int64_t ahead = mm_prefetch_rows(gw->row_bytes > uw->row_bytes ? uw->row_bytes : gw->row_bytes);
    for (int64_t r = lo + 1; r < lo + ahead && r < hi; r++) {
        prefetch_row(gd + r * gw->row_bytes, gw->row_bytes);
        prefetch_row(ud + r * uw->row_bytes, uw->row_bytes);
    }
    const kernel_silu_mul_fn silu_mul = kernel_silu_mul();
    for (int64_t r0 = lo; r0 < hi; r0 += GU_ONE_BLOCK) {
        const int64_t r1 = r0 + GU_ONE_BLOCK < hi ? r0 + GU_ONE_BLOCK : hi;
        float ub[GU_ONE_BLOCK];
        for (int64_t r = r0; r < r1; r++) {
            if (ahead > 0 && r + ahead < hi) {
                prefetch_row(gd + (r + ahead) * gw->row_bytes, gw->row_bytes);
                prefetch_row(ud + (r + ahead) * uw->row_bytes, uw->row_bytes);
            }
            j->out[r] = j->g.dot(gw->ne[0], gd + r * gw->row_bytes, j->g.act);
            ub[r - r0] = j->u.dot(uw->ne[0], ud + r * uw->row_bytes, j->u.act);
        }
        silu_mul((size_t)(r1 - r0), j->out + r0, ub, j->out + r0);
    }
}

static void gu_task(void *ctx, int ith, int nth) {
    gu_job *j = ctx;
    const int n = j->g.n;
    int64_t lo, hi;
    split_rows(j->g.w->ne[1], ith, nth, j->g.guided, &lo, &hi);
    if (n == 1 && !j->g.packed && !j->u.packed) {
        gu_rows_one(j, lo, hi);
        return;
    }
    const int64_t br = gu_block_rows(n, j->g.packed || j->u.packed);
    float *gbuf = j->buf + (size_t)ith * 2 * br * (size_t)n, *ubuf = gbuf + br * (size_t)n;
    for (int64_t r0 = lo; r0 < hi; r0 += br) {
        int64_t r1 = r0 + br < hi ? r0 + br : hi;
        mm_job g = j->g, u = j->u;
        g.out = gbuf;
        u.out = ubuf;
        g.out_r0 = u.out_r0 = r0;
        g.out_stride = u.out_stride = (int)br;
        mm_rows(&g, r0, r1);
        mm_rows(&u, r0, r1);
        const kernel_silu_mul_fn silu_mul = kernel_silu_mul();
        for (int t = 0; t < n; t++)
            silu_mul((size_t)(r1 - r0), gbuf + (size_t)t * br, ubuf + (size_t)t * br,
                     j->out + (size_t)t * j->out_stride + r0);
    }
}

/* Whether gate and up take one encoding (and packing) of x: the same activation format and
 * the same tile packing, or both on the dot path. */
static bool gu_shared_encoding(const tview *gate, const tview *up, int n) {
    const kernel_tile *tg = mm_tile(gate->type, n), *tu = mm_tile(up->type, n);
    return quant_traits_of(up->type)->act_type == quant_traits_of(gate->type)->act_type && (tg == NULL) == (tu == NULL) &&
           (!tg || tg->pack == tu->pack);
}

/* Prepares j's gate and up at dst: one encoding for both where gu_shared_encoding, else one
 * each (pool NULL: on the caller). Returns the bytes used. */
static size_t gu_prepare(threadpool *pool, gu_job *j, uint8_t *dst) {
    size_t used = mm_prepare_on(pool, &j->g, dst);
    if (!gu_shared_encoding(j->g.w, j->u.w, j->g.n)) return used + mm_prepare_on(pool, &j->u, dst + used);
    j->u.encode = j->g.encode;
    j->u.act = j->g.act;
    j->u.act_row = j->g.act_row;
    j->u.dot = kernel_dot(j->u.w->type);
    j->u.tile = j->g.tile ? mm_tile(j->u.w->type, j->u.n) : NULL;
    j->u.packed = j->g.packed;
    return used;
}

static void cpu_matmul_swiglu(backend *b, const tview *gate, const tview *up, const float *x,
                              int n, float *out) {
    cpu_backend *c = (cpu_backend *)b;
    gu_job j = {.g = {.w = gate, .x = x, .n = n}, .u = {.w = up, .x = x, .n = n}, .out = out,
                .out_stride = (int)gate->ne[1]};
    /* one encoding (and packing) serves both when the activation formats agree */
    const kernel_tile *tg = mm_tile(gate->type, n), *tu = mm_tile(up->type, n);
    const bool share = gu_shared_encoding(gate, up, n);
    size_t gb = mm_scratch_bytes(gate, n), ub = share ? 0 : mm_scratch_bytes(up, n);
    const int shares = n >= MM_TILE_MIN_TOKS && (tg || tu) ? threadpool_size(c->pool) : dot_shares(c);
    size_t bufb = sizeof(float) * 2 * gu_block_rows(n, tg || tu) * (size_t)n * (size_t)shares;
    uint8_t *base = scratch(c, gb + ub + bufb);
    gu_prepare(c->pool, &j, base);
    j.buf = (float *)(base + gb + ub);
    j.g.guided = shares > threadpool_size(c->pool);
    threadpool_run_shares(c->pool, gu_task, &j, shares);
}

/* ---- SwiGLU experts of one token ------------------------------------------------------------
 * Decode runs a MoE layer's experts (the routed ones and a shared one) on the same single token:
 * as matmul_swiglu + matmul each, that is two dispatches, two barriers and one encoding of the
 * same x per expert. Here all the gate/up rows of all experts are one job and all the down rows
 * another, cut into shares over the experts' concatenated rows: the same dots on the same
 * encoded activations, the same SwiGLU expression, so every value has the bits of the separate
 * ops. */

#define EXPERTS_ONE_MAX 16

typedef struct eo_job {
    int ne;
    int64_t base[EXPERTS_ONE_MAX + 1]; /* expert i owns rows [base[i], base[i+1]) of the job */
    gu_job gu[EXPERTS_ONE_MAX];        /* gate/up of expert i (n = 1, out = its mid row) */
    mm_job down[EXPERTS_ONE_MAX];      /* down of expert i */
    float *gbuf[EXPERTS_ONE_MAX];      /* gate and up values of expert i where its gate/up are */
    float *ubuf[EXPERTS_ONE_MAX];      /* tiled (kernel_tile.min_toks 1) */
    bool down_phase;
} eo_job;

/* Gate/up rows [lo, hi) of one token through a tile kernel (min_toks 1): the gate's and the
 * up's values into the expert's two buffers, then the same SwiGLU expression as gu_rows_one. */
static void gu_rows_one_tiled(const gu_job *j, float *gbuf, float *ubuf, int64_t lo, int64_t hi) {
    mm_job g = j->g, u = j->u;
    g.out = gbuf;
    u.out = ubuf;
    g.out_r0 = u.out_r0 = 0;
    mm_rows(&g, lo, hi);
    mm_rows(&u, lo, hi);
    kernel_silu_mul()((size_t)(hi - lo), gbuf + lo, ubuf + lo, j->out + lo);
}

static void eo_task(void *ctx, int ith, int nth) {
    const eo_job *j = ctx;
    int64_t lo, hi;
    share_of(j->base[j->ne], ith, nth, nth > 1, &lo, &hi); /* dot_shares(c) shares */
    for (int i = 0; i < j->ne && lo < hi; i++) {
        const int64_t a = lo > j->base[i] ? lo : j->base[i], b = hi < j->base[i + 1] ? hi : j->base[i + 1];
        if (a >= b) continue;
        if (j->down_phase)
            mm_rows(&j->down[i], a - j->base[i], b - j->base[i]);
        else if (j->gu[i].g.packed)
            gu_rows_one_tiled(&j->gu[i], j->gbuf[i], j->ubuf[i], a - j->base[i], b - j->base[i]);
        else
            gu_rows_one(&j->gu[i], a - j->base[i], b - j->base[i]);
    }
}

static bool cpu_experts_one(backend *b, int ne, const tview *const *gate, const tview *const *up,
                            const tview *const *down, const float *x, float *const *out) {
    cpu_backend *c = (cpu_backend *)b;
    if (ne < 1 || ne > EXPERTS_ONE_MAX) return false;
    /* gate and up take one encoding (and packing, where tile kernels run at one token: Q2_0,
     * the 32-value block types, Q4_K and Q5_K) */
    size_t need = 0;
    for (int i = 0; i < ne; i++) {
        if (!gu_shared_encoding(gate[i], up[i], 1)) return false;
        if (up[i]->ne[1] != gate[i]->ne[1] || down[i]->ne[0] != gate[i]->ne[1]) return false;
        const size_t rowsf = ((size_t)gate[i]->ne[1] * sizeof(float) + 63) / 64 * 64;
        need += mm_scratch_bytes(gate[i], 1) + mm_scratch_bytes(down[i], 1) + rowsf * (mm_tile(gate[i]->type, 1) ? 3 : 1);
    }
    _Static_assert(sizeof(eo_job) < 16384, "eo_job lives on the stack");
    eo_job job = {0}, *j = &job; /* a few KiB: on the stack, not an allocation per layer and token */
    uint8_t *base = scratch(c, need), *p = base;
    j->ne = ne;
    /* gate/up: x encoded once per activation format (experts of a layer share it) */
    for (int i = 0; i < ne; i++) {
        gu_job *g = &j->gu[i];
        g->g = (mm_job){.w = gate[i], .x = x, .n = 1};
        g->u = (mm_job){.w = up[i], .x = x, .n = 1};
        const kernel_tile *tile = mm_tile(gate[i]->type, 1);
        int same = -1;
        for (int k = 0; k < i && same < 0; k++)
            if (quant_traits_of(gate[k]->type)->act_type == quant_traits_of(gate[i]->type)->act_type &&
                (j->gu[k].g.tile == NULL) == (tile == NULL) && (!tile || j->gu[k].g.tile->pack == tile->pack))
                same = k;
        if (same >= 0) {
            g->g.encode = j->gu[same].g.encode;
            g->g.act = j->gu[same].g.act;
            g->g.act_row = j->gu[same].g.act_row;
            g->g.dot = kernel_dot(gate[i]->type);
            g->g.tile = tile;
            g->g.packed = j->gu[same].g.packed;
        } else {
            p += mm_prepare(c, &g->g, p);
        }
        g->u.encode = g->g.encode;
        g->u.act = g->g.act;
        g->u.act_row = g->g.act_row;
        g->u.dot = kernel_dot(up[i]->type);
        g->u.tile = tile ? mm_tile(up[i]->type, 1) : NULL;
        g->u.packed = g->g.packed;
        const size_t rowsf = ((size_t)gate[i]->ne[1] * sizeof(float) + 63) / 64 * 64;
        g->out = (float *)p; /* the expert's mid row */
        g->out_stride = (int)gate[i]->ne[1];
        p += rowsf;
        if (tile) { /* its gate and up values (gu_rows_one_tiled) */
            j->gbuf[i] = (float *)p;
            j->ubuf[i] = (float *)(p + rowsf);
            p += 2 * rowsf;
        }
        j->base[i + 1] = j->base[i] + gate[i]->ne[1];
    }
    threadpool_run_shares(c->pool, eo_task, j, dot_shares(c));
    /* down: each expert's mid row encoded (on the caller: a few hundred values each) */
    for (int i = 0; i < ne; i++) {
        mm_job *d = &j->down[i];
        *d = (mm_job){.w = down[i], .x = j->gu[i].out, .n = 1, .out = out[i], .out_stride = (int)down[i]->ne[1]};
        p += mm_prepare(c, d, p);
        j->base[i + 1] = j->base[i] + down[i]->ne[1];
    }
    j->down_phase = true;
    threadpool_run_shares(c->pool, eo_task, j, dot_shares(c));
    return true;
}

/* ---- routed experts of a batch --------------------------------------------------------------
 * Prefill runs each routed expert on the tokens routed to it: as separate ops that is a gather,
 * an encoding, a packing, the gate/up product, another encoding and packing, the down product
 * and a scatter per expert, each a dispatch whose threads wait for the slowest, and every
 * token's row encoded once per expert it goes to. Here the threads take whole experts (or
 * pieces of EB_CHUNK tokens of one), longest first, and run those steps alone on their own
 * scratch: no barrier inside an expert; x's tokens encoded once (one dispatch) and each piece
 * copying its tokens' encoded rows (30B-A3B pp512, alternating: 109.9-113.5 -> 114.6-116.8
 * t/s against encoding per piece straight from x). The products,
 * encodings and SwiGLU are those of the separate ops, each output row is computed by one thread
 * from the same encoded activations, and a token's values do not depend on the other tokens of
 * its piece, so every value has the bits of the separate ops. */

#define EB_CHUNK 256 /* tokens of one expert per piece: bounds the scratch of a thread */

typedef struct eb_piece {
    int e;      /* the expert (index into the job's arrays) */
    int t0, m;  /* entries [t0, t0 + m) of its list */
} eb_piece;

typedef struct eb_job {
    const tview *const *gate, *const *up, *const *down;
    const float *x;
    int width, k;
    const uint8_t *pre;     /* x's tokens encoded once in the gate/up activation format */
    const int32_t *entries; /* per expert, its (token * k + slot) entries in token order */
    const int *offset;      /* expert i's entries: entries[offset[i] .. offset[i + 1]) */
    float *slots;
    eb_piece *piece;
    int n_piece;
    int next; /* the next piece to claim (atomic) */
    uint8_t *scratch;
    size_t per_thread;
} eb_job;

/* Scratch one thread needs for a piece of m tokens of expert i. */
static size_t eb_need(const eb_job *j, int i, int m, bool share) {
    const size_t ff = (size_t)j->gate[i]->ne[1];
    return mm_scratch_bytes(j->gate[i], m) + (share ? 0 : mm_scratch_bytes(j->up[i], m)) +
           (sizeof(float) * 2 * (size_t)gu_block_rows(m, true) * (size_t)m + 63) / 64 * 64 +
           (sizeof(float) * ff * (size_t)m + 63) / 64 * 64 + mm_scratch_bytes(j->down[i], m) +
           (sizeof(float) * (size_t)j->width * (size_t)m + 63) / 64 * 64;
}

static void eb_run_piece(const eb_job *j, const eb_piece *pc, uint8_t *p) {
    const int i = pc->e, m = pc->m;
    const int32_t *rows = j->entries + j->offset[i] + pc->t0;
    const tview *gate = j->gate[i], *up = j->up[i], *down = j->down[i];
    const int64_t ff = gate->ne[1];
    gu_job g = {.g = {.w = gate, .x = j->x, .n = m, .rows = rows, .rows_div = j->k, .pre = j->pre},
                .u = {.w = up, .x = j->x, .n = m, .rows = rows, .rows_div = j->k, .pre = j->pre}};
    p += gu_prepare(NULL, &g, p);
    g.buf = (float *)p;
    p += (sizeof(float) * 2 * (size_t)gu_block_rows(m, true) * (size_t)m + 63) / 64 * 64;
    g.out = (float *)p;
    g.out_stride = (int)ff;
    p += (sizeof(float) * (size_t)ff * (size_t)m + 63) / 64 * 64;
    gu_task(&g, 0, 1);
    float *y = (float *)p;
    p += (sizeof(float) * (size_t)j->width * (size_t)m + 63) / 64 * 64;
    mm_job d = {.w = down, .x = g.out, .n = m, .out = y, .out_stride = j->width};
    mm_prepare_on(NULL, &d, p);
    mm_rows(&d, 0, down->ne[1]);
    for (int t = 0; t < m; t++)
        memcpy(j->slots + (size_t)rows[t] * (size_t)j->width, y + (size_t)t * (size_t)j->width,
               sizeof(float) * (size_t)j->width);
}

static void eb_task(void *ctx, int ith, int nth) {
    eb_job *j = ctx;
    (void)nth;
    uint8_t *p = j->scratch + (size_t)ith * j->per_thread;
    for (;;) {
        const int q = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (q >= j->n_piece) break;
        eb_run_piece(j, &j->piece[q], p);
    }
}

typedef struct eb_encode_job {
    quant_quantize_fn encode;
    const float *x;
    int64_t width;
    int n;
    uint8_t *dst;
    size_t act_row;
} eb_encode_job;

static void eb_encode_task(void *ctx, int ith, int nth) {
    const eb_encode_job *j = ctx;
    int64_t lo, hi;
    threadpool_share(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) j->encode(j->x + t * j->width, j->dst + (size_t)t * j->act_row, j->width);
}

static int eb_longest_first(const void *a, const void *b) {
    const eb_piece *x = a, *y = b;
    if (x->m != y->m) return x->m > y->m ? -1 : 1;
    return x->e != y->e ? (x->e < y->e ? -1 : 1) : (x->t0 < y->t0 ? -1 : x->t0 > y->t0);
}

static bool cpu_experts_batch(backend *b, int ne, const tview *const *gate, const tview *const *up,
                              const tview *const *down, const float *x, int width, int k, const int32_t *entries,
                              const int *offset, float *slots) {
    cpu_backend *c = (cpu_backend *)b;
    if (ne < 1 || k < 1) return false;
    int n_piece = 0;
    for (int i = 0; i < ne; i++) {
        if (up[i]->ne[1] != gate[i]->ne[1] || down[i]->ne[0] != gate[i]->ne[1] || down[i]->ne[1] != width ||
            gate[i]->ne[0] != width || up[i]->ne[0] != width)
            return false;
        /* float weights multiply x in place, which a gathered piece cannot */
        if (quant_traits_of(gate[i]->type)->act_type == GGML_TYPE_F32 ||
            quant_traits_of(up[i]->type)->act_type == GGML_TYPE_F32)
            return false;
        n_piece += (offset[i + 1] - offset[i] + EB_CHUNK - 1) / EB_CHUNK;
    }
    eb_piece *piece = malloc(sizeof(eb_piece) * (size_t)(n_piece > 0 ? n_piece : 1));
    if (!piece) return false;
    eb_job j = {.gate = gate, .up = up, .down = down, .x = x, .width = width, .k = k, .entries = entries,
                .offset = offset, .slots = slots, .piece = piece};
    for (int i = 0; i < ne; i++) {
        const int m = offset[i + 1] - offset[i];
        for (int t0 = 0; t0 < m; t0 += EB_CHUNK) {
            piece[j.n_piece] = (eb_piece){.e = i, .t0 = t0, .m = m - t0 < EB_CHUNK ? m - t0 : EB_CHUNK};
            const size_t need = eb_need(&j, i, piece[j.n_piece].m, false);
            if (need > j.per_thread) j.per_thread = need;
            j.n_piece++;
        }
    }
    /* longest first, so that the last pieces to finish are short ones */
    qsort(piece, (size_t)j.n_piece, sizeof *piece, eb_longest_first);
    j.per_thread = (j.per_thread + 63) / 64 * 64;
    /* x's tokens encoded once where every gate and up takes the same format (a token goes to k
     * experts): the pieces copy their rows, the bytes mm_encode_task would make */
    const uint32_t at = quant_traits_of(gate[0]->type)->act_type;
    bool one_format = true;
    int n_tok = 0;
    for (int i = 0; i < ne; i++) {
        one_format &= quant_traits_of(gate[i]->type)->act_type == at && quant_traits_of(up[i]->type)->act_type == at;
        for (int q = offset[i]; q < offset[i + 1]; q++)
            if (entries[q] / k + 1 > n_tok) n_tok = entries[q] / k + 1;
    }
    const size_t act_row = quant_row_bytes(at, width), pre_bytes = one_format ? (act_row * (size_t)n_tok + 63) / 64 * 64 : 0;
    uint8_t *base = scratch(c, pre_bytes + j.per_thread * (size_t)threadpool_size(c->pool));
    if (one_format) {
        eb_encode_job ej = {kernel_quantize(at), x, width, n_tok, base, act_row};
        threadpool_run(c->pool, eb_encode_task, &ej);
        j.pre = base;
    }
    j.scratch = base + pre_bytes;
    threadpool_run(c->pool, eb_task, &j);
    free(piece);
    return true;
}

/* ---- rmsnorm ------------------------------------------------------------------------------ */

typedef struct norm_job {
    const float *x, *w;
    int n_rows, dim;
    float eps;
    float *y;
} norm_job;

static void norm_rows(const norm_job *j, int64_t lo, int64_t hi) {
    double sums[SUMSQ_ROWS]; /* as ggml: squares summed in double */
    for (int64_t r = lo; r < hi; r++) {
        const float *xr = j->x + (size_t)r * j->dim;
        float *yr = j->y + (size_t)r * j->dim;
        if ((r - lo) % SUMSQ_ROWS == 0)
            sumsq_rows(xr, (size_t)j->dim, hi - r < SUMSQ_ROWS ? (int)(hi - r) : SUMSQ_ROWS, j->dim, sums);
        const double sum = sums[(r - lo) % SUMSQ_ROWS];
        scale_row(yr, xr, j->w, 1.0f / sqrtf((float)(sum / j->dim) + j->eps), j->dim);
    }
}

static void norm_task(void *ctx, int ith, int nth) {
    norm_job *j = ctx;
    int64_t lo, hi;
    threadpool_share(j->n_rows, ith, nth, &lo, &hi);
    norm_rows(j, lo, hi);
}

static void cpu_rmsnorm(backend *b, const float *x, const tview *w, int n_rows, int dim,
                        float eps, float *y) {
    norm_job j = {x, w && w->data ? w->data : NULL, n_rows, dim, eps, y};
    if ((int64_t)n_rows * dim < CPU_PAR_MIN_ELEMS || n_rows < 2)
        norm_rows(&j, 0, n_rows);
    else
        threadpool_run(((cpu_backend *)b)->pool, norm_task, &j);
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

/* Work items are (block of up to ATTN_TOKENS consecutive tokens, KV head) pairs: the query heads
 * sharing a KV head are done together, and the tokens of a block together, so each tile of key
 * and value rows is read from memory once for the group and the block (kernels.h defines the
 * algorithm, a tiled online softmax that is the same for every context length, block and thread
 * count: each row's bits do not depend on the blocking). */
#define ATTN_TOKENS 8
typedef struct attn_job {
    const float *q, *kc, *vc;
    int n, pos0, n_head, n_head_kv, hd, hd_v;
    float scale;
    float *out;
    float *work; /* per thread: group * KERNEL_ATTN_TILE floats */
    kernel_attn_tokens_fn fn;
} attn_job;

static void attn_task(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    const int group = j->n_head / j->n_head_kv;
    float *work = j->work + (size_t)ith * (size_t)group * KERNEL_ATTN_TILE;
    const size_t krow = (size_t)j->n_head_kv * j->hd, vrow = (size_t)j->n_head_kv * j->hd_v;
    const int64_t blocks = (j->n + ATTN_TOKENS - 1) / ATTN_TOKENS;
    /* items round-robin: a later block sees more keys (causal), so contiguous shares would
     * leave the last thread with most of the work */
    for (int64_t item = ith; item < blocks * j->n_head_kv; item += nth) {
        int t = (int)(item / j->n_head_kv) * ATTN_TOKENS, kvh = (int)(item % j->n_head_kv), h0 = kvh * group;
        int T = j->n - t < ATTN_TOKENS ? j->n - t : ATTN_TOKENS;
        j->fn(j->q + ((size_t)t * j->n_head + h0) * j->hd, (size_t)j->n_head * j->hd, (size_t)j->hd, group, T,
              j->kc + (size_t)kvh * j->hd, krow, j->vc + (size_t)kvh * j->hd_v, vrow, j->pos0 + t + 1, j->hd,
              j->hd_v, j->scale, j->out + ((size_t)t * j->n_head + h0) * j->hd_v, (size_t)j->n_head * j->hd_v,
              (size_t)j->hd_v, work);
    }
}

static void cpu_attention(backend *b, const float *q, const float *kc, const float *vc, int n,
                          int pos0, int n_head, int n_head_kv, int hd, int hd_v, float scale,
                          float *out) {
    cpu_backend *c = (cpu_backend *)b;
    attn_job j = {q, kc, vc, n, pos0, n_head, n_head_kv, hd, hd_v, scale, out, NULL, kernel_attn_tokens()};
    j.work = scratch(c, sizeof(float) * (size_t)(n_head / n_head_kv) * KERNEL_ATTN_TILE *
                            (size_t)threadpool_size(c->pool));
    threadpool_run(c->pool, attn_task, &j);
}

/* ---- elementwise -------------------------------------------------------------------------- */

typedef struct add_job {
    float *x;
    const float *y;
    size_t n;
} add_job;

static void add_task(void *ctx, int ith, int nth) {
    add_job *j = ctx;
    int64_t lo, hi;
    threadpool_share((int64_t)j->n, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) j->x[i] += j->y[i];
}

static void cpu_add(backend *b, float *x, const float *y, size_t n) {
    add_job j = {x, y, n};
    if (n < CPU_PAR_MIN_ELEMS)
        add_task(&j, 0, 1);
    else
        threadpool_run(((cpu_backend *)b)->pool, add_task, &j);
}

typedef struct swiglu_job {
    float *g;
    const float *u;
    size_t n;
} swiglu_job;

static void swiglu_task(void *ctx, int ith, int nth) {
    const swiglu_job *j = ctx;
    int64_t lo, hi;
    threadpool_share((int64_t)j->n, ith, nth, &lo, &hi);
    kernel_silu_mul()((size_t)(hi - lo), j->g + lo, j->u + lo, j->g + lo);
}

/* On the pool from CPU_PAR_MIN_ELEMS values (a 35B-A3B pp512's gated norm: 2M a layer, which
 * ran on one thread while the other waited); each value's expression is the same either way. */
static void cpu_swiglu(backend *b, float *g, const float *u, size_t n) {
    swiglu_job j = {g, u, n};
    if (n < CPU_PAR_MIN_ELEMS)
        swiglu_task(&j, 0, 1);
    else
        threadpool_run(((cpu_backend *)b)->pool, swiglu_task, &j);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

static void cpu_free(backend *b) {
    cpu_backend *c = (cpu_backend *)b;
    threadpool_free(c->pool);
    free(c->scratch);
    cpu_ext_free(c->ext);
    free(c);
}

static void cpu_set_inputs_op(backend *b, const int32_t *tokens, int n, int pos0,
                              const int32_t **ids, const int32_t **pos) {
    cpu_set_inputs(b, &((cpu_backend *)b)->ext, tokens, n, pos0, ids, pos);
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
    .matmul_swiglu = cpu_matmul_swiglu,
    .experts_one = cpu_experts_one,
    .experts_batch = cpu_experts_batch,
    .l2norm = cpu_l2norm,
    .conv1d_silu = cpu_conv1d_silu,
    .gated_delta = cpu_gated_delta,
    .gated_delta_ck = cpu_gated_delta_ck,
    .sigmoid_mul = cpu_sigmoid_mul,
    .gdn_gates = cpu_gdn_gates,
    /* qwen4exp: hyper-connections, n-gram module, block-sparse attention (ops_hc.c, ops_qsa.c) */
    .rmsnorm_groups = cpu_rmsnorm_groups,
    .scale_silu = cpu_scale_silu,
    .hc_mix = cpu_hc_mix,
    .hc_combine = cpu_hc_combine,
    .ple_gate = cpu_ple_gate,
    .conv1d_dilated_silu = cpu_conv1d_dilated_silu,
    .qsa_pool = cpu_qsa_pool,
    .qsa_select = cpu_qsa_select,
    .attention_sel = cpu_attention_sel,
    /* memory, inputs and routed-expert steps: ops_moe.c */
    .alloc = cpu_alloc,
    .mfree = cpu_mfree,
    .upload = cpu_upload,
    .download = cpu_download,
    .memzero = cpu_memzero,
    .copy_rows = cpu_copy_rows,
    .kv_store = cpu_kv_store,
    .set_inputs = cpu_set_inputs_op,
    .moe_route = cpu_moe_route,
    .gather_rows = cpu_gather_rows,
    .scatter_rows = cpu_scatter_rows,
    .moe_combine = cpu_moe_combine,
};

bool backend_cpu_tile_vectorized(uint32_t type) { return kernel_tile_vectorized(type); }

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
    c->base.host_memory = true;
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
