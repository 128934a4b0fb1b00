/* qwen4exp beyond the logits (test_fixture checks those against llama.cpp):
 *
 * 1. QSA block selection: with top_k overridden to 32 (as the -topk32 reference), the cells
 *    layer 2 attends to at positions 35..117 equal llama.cpp's (NAME-topk32.qsa.i32), in one
 *    batch, in batches of 7 and token by token; every earlier position, and every position with
 *    the file's top_k (2048), is dense.
 * 2. N-gram rows: the table rows of every position of the -eos prompt (prompt, end-of-text,
 *    prompt) equal NAME-eos.ple_rows.i32, whatever the batch split; after the end-of-text the
 *    rows restart as at position 0.
 * 3. The n-gram table tier: rows read on demand (direct and page-cache I/O, a cache so small
 *    it evicts, the whole prompt prefetched across batches) give the same bits as the mapped
 *    table; the counters add up; the stall time is printed.
 * 4. A session reset clears the n-gram history (same bits on re-evaluation).
 * 5. Metadata overrides: malformed ones are refused with one line; the plan shows the tier. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixtures.h"
#include "models/qwen4exp.h"
#include "sluice.h"

static int32_t *read_ids(const char *name, const char *ext, int *n) {
    char file[256], path[1024];
    snprintf(file, sizeof file, "%s.%s", name, ext);
    if (!fixture_path("golden", file, path, sizeof path)) return NULL;
    FILE *fp = fopen(path, "r");
    if (!fp) return NULL;
    int32_t *ids = malloc(8192 * sizeof *ids);
    int k = 0;
    while (k < 8192 && fscanf(fp, "%d", &ids[k]) == 1) k++;
    fclose(fp);
    *n = k;
    return ids;
}

static int32_t *read_i32(const char *name, const char *ext, size_t *n) {
    char file[256], path[1024];
    snprintf(file, sizeof file, "%s.%s", name, ext);
    if (!fixture_path("golden", file, path, sizeof path)) return NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    int32_t *v = malloc((size_t)len);
    *n = fread(v, 4, (size_t)len / 4, fp);
    fclose(fp);
    return v;
}

static sluice_model *load(const char *ovr, sluice_mode ngram_mode, int cache_rows, sluice_io io) {
    char path[1024];
    if (!fixture_path("models", "qwen4exp-tiny-F32.gguf", path, sizeof path)) return NULL;
    const char *ov[1] = {ovr};
    sluice_model_params mp = {.override_kv = ov, .n_override_kv = ovr ? 1 : 0,
                              .ngram_mode = ngram_mode, .ngram_cache_rows = cache_rows,
                              .io = io, .n_ctx = 512};
    return sluice_model_load(path, &mp); /* failures are checked by the callers */
}

/* ---- observers ---------------------------------------------------------------------------- */

typedef struct record {
    int n_pos, width;
    int32_t *sel;   /* [n_pos][width] QSA cells of layer `layer`, -1 padded */
    int32_t *n_sel; /* [n_pos]: count, -1 dense, -2 never seen */
    int32_t *rows;  /* [n_pos][n_rows] n-gram rows */
    int n_rows, layer;
} record;

static void on_qsa(void *ctx, int layer, int pos, const int32_t *sel, int n_sel) {
    record *r = ctx;
    if (layer != r->layer || pos >= r->n_pos) return;
    r->n_sel[pos] = n_sel;
    for (int i = 0; i < n_sel && i < r->width; i++) r->sel[(size_t)pos * r->width + i] = sel[i];
}

static void on_rows(void *ctx, int pos, const int32_t *rows, int n_rows) {
    record *r = ctx;
    if (pos >= r->n_pos || n_rows != r->n_rows) return;
    memcpy(r->rows + (size_t)pos * n_rows, rows, (size_t)n_rows * sizeof *rows);
}

/* Forward the tokens in batches of `batch` (1: decode) through a fresh state, observed. */
static bool run_observed(const sluice_model *m, const int32_t *ids, int n, int batch, record *r) {
    backend *be = backend_cpu_new(2);
    model_state *st = be ? m->arch->state_new(m, be, n, batch) : NULL;
    if (!st) return false;
    qwen4exp_observe(st, on_qsa, r, on_rows, r);
    bool ok = true;
    float *lg = malloc((size_t)m->hp.n_vocab * sizeof *lg);
    for (int t0 = 0; ok && t0 < n; t0 += batch) {
        const int k = n - t0 < batch ? n - t0 : batch;
        ok = m->arch->forward(m, st, be, ids + t0, k, t0, lg, false) == 0;
    }
    free(lg);
    m->arch->state_free(st);
    be_free(be);
    return ok;
}

static record record_new(int n_pos, int width, int n_rows, int layer) {
    record r = {.n_pos = n_pos, .width = width, .n_rows = n_rows, .layer = layer};
    r.sel = malloc((size_t)n_pos * width * sizeof *r.sel);
    r.n_sel = malloc((size_t)n_pos * sizeof *r.n_sel);
    r.rows = calloc((size_t)n_pos * n_rows, sizeof *r.rows);
    for (int i = 0; i < n_pos; i++) r.n_sel[i] = -2;
    memset(r.sel, 0xff, (size_t)n_pos * width * sizeof *r.sel);
    return r;
}

static void record_free(record *r) {
    free(r->sel);
    free(r->n_sel);
    free(r->rows);
}

/* ---- 1. QSA -------------------------------------------------------------------------------- */

static void test_qsa(void) {
    const char *name = "qwen4exp-tiny-F32-topk32";
    int n = 0;
    size_t n_ref = 0;
    int32_t *ids = read_ids(name, "prompt.ids", &n);
    int32_t *ref = read_i32(name, "qsa.i32", &n_ref);
    sluice_model *m = load("qwen4exp.attention.indexer.top_k=int:32", SLUICE_MODE_AUTO, 0,
                           SLUICE_IO_DIRECT);
    CHECK(ids && ref && m);
    if (!ids || !ref || !m) return;
    const int width = 32 + 4 - 1, first = 35; /* top_k + ratio - 1 cells from position 35 */
    CHECKF(n_ref == (size_t)(n - first) * width, "qsa.i32 has %zu entries", n_ref);
    const int batches[] = {n, 7, 1};
    int exact = 0;
    for (size_t b = 0; b < 3; b++) {
        record r = record_new(n, width, q4x_of(m)->ple_n_heads, 2);
        CHECK(run_observed(m, ids, n, batches[b], &r));
        int bad = 0;
        for (int p = 0; p < n; p++) {
            if (p < first) {
                bad += r.n_sel[p] != -1;
                continue;
            }
            bool same = r.n_sel[p] == width &&
                        memcmp(r.sel + (size_t)p * width, ref + (size_t)(p - first) * width,
                               (size_t)width * sizeof *ref) == 0;
            bad += !same;
            if (!same && b == 0 && bad < 4) {
                printf("  q=%d ours:", p);
                for (int i = 0; i < width && i < r.n_sel[p]; i++) printf(" %d", r.sel[(size_t)p * width + i]);
                printf("\n  q=%d ref: ", p);
                for (int i = 0; i < width; i++) printf(" %d", ref[(size_t)(p - first) * width + i]);
                printf("\n");
            }
        }
        CHECKF(bad == 0, "QSA selection differs at %d positions (batches of %d)", bad, batches[b]);
        exact += bad == 0;
        record_free(&r);
    }
    printf("QSA selection (top_k 32, layer 2, positions %d..%d): %d of 3 batch splits (one batch, "
           "7, token by token) equal llama.cpp's cells exactly, %d positions each\n",
           first, n - 1, exact, n - first);
    sluice_model_free(m);

    /* the file's budget (2048) is never reached: dense everywhere */
    m = load(NULL, SLUICE_MODE_AUTO, 0, SLUICE_IO_DIRECT);
    record r = record_new(n, width, q4x_of(m)->ple_n_heads, 2);
    CHECK(run_observed(m, ids, n, n, &r));
    int dense = 0;
    for (int p = 0; p < n; p++) dense += r.n_sel[p] == -1;
    CHECKF(dense == n, "top_k 2048: %d of %d positions dense", dense, n);
    record_free(&r);
    sluice_model_free(m);
    free(ids);
    free(ref);
}

/* ---- 2. n-gram rows ------------------------------------------------------------------------ */

static void test_rows(void) {
    const char *name = "qwen4exp-tiny-F32-eos";
    int n = 0;
    size_t n_ref = 0;
    int32_t *ids = read_ids(name, "prompt.ids", &n);
    int32_t *ref = read_i32(name, "ple_rows.i32", &n_ref);
    sluice_model *m = load(NULL, SLUICE_MODE_AUTO, 0, SLUICE_IO_DIRECT);
    CHECK(ids && ref && m);
    if (!ids || !ref || !m) return;
    const int H = q4x_of(m)->ple_n_heads;
    CHECKF(n_ref == (size_t)n * H, "ple_rows.i32 has %zu entries for %d positions", n_ref, n);
    const int batches[] = {n, 7, 1};
    for (size_t b = 0; b < 3; b++) {
        record r = record_new(n, 1, H, -1);
        CHECK(run_observed(m, ids, n, batches[b], &r));
        int bad = 0;
        for (int p = 0; p < n; p++)
            bad += memcmp(r.rows + (size_t)p * H, ref + (size_t)p * H, (size_t)H * 4) != 0;
        CHECKF(bad == 0, "n-gram rows differ at %d positions (batches of %d)", bad, batches[b]);
        record_free(&r);
    }
    /* the end-of-text at 118 cuts the context: 119 and 120 hash as 0 and 1 did */
    CHECK(memcmp(ref + 119 * H, ref, (size_t)2 * H * 4) == 0);
    printf("n-gram rows: %d positions x %d heads equal the reference in 3 batch splits\n", n, H);
    sluice_model_free(m);
    free(ids);
    free(ref);
}

/* ---- 3./4. the table tier, reset ------------------------------------------------------------ */

static float *eval_all(sluice_model *m, const int32_t *ids, int n, int batch, bool twice) {
    sluice_session_params sp = {.n_ctx = n, .n_batch = batch, .n_threads = 2};
    sluice_session *s = sluice_session_new(m, &sp);
    float *lg = malloc((size_t)n * m->hp.n_vocab * sizeof *lg);
    bool ok = s && sluice_session_eval(s, ids, n, lg) == 0;
    if (ok && twice) { /* a reset must forget the n-gram history and state */
        sluice_session_reset(s);
        ok = sluice_session_eval(s, ids, n, lg) == 0;
    }
    if (!ok) fprintf(stderr, "eval: %s\n", sluice_last_error());
    sluice_session_free(s);
    if (!ok) {
        free(lg);
        return NULL;
    }
    return lg;
}

static void test_tier(void) {
    const char *name = "qwen4exp-tiny-F32-eos";
    int n = 0;
    int32_t *ids = read_ids(name, "prompt.ids", &n);
    sluice_model *m = load(NULL, SLUICE_MODE_RESIDENT, 0, SLUICE_IO_DIRECT);
    CHECK(ids && m);
    if (!ids || !m) return;
    const size_t len = (size_t)n * m->hp.n_vocab;
    float *ref = eval_all(m, ids, n, 512, false);
    float *again = eval_all(m, ids, n, 512, true);
    CHECKF(ref && again && memcmp(ref, again, len * 4) == 0, "a reset did not clear the state");
    sluice_ngram_stats st;
    sluice_model_ngram_stats(m, &st);
    CHECK(!st.on_demand && st.lookups == (uint64_t)3 * n * 8 && st.hits == st.lookups && st.reads == 0);
    free(again);
    sluice_model_free(m);

    typedef struct {
        int cache_rows, batch;
        sluice_io io;
        const char *label;
    } tier_cfg;
    const tier_cfg cfgs[] = {
        {0, 512, SLUICE_IO_DIRECT, "planner-sized cache, direct I/O"},
        {16, 512, SLUICE_IO_DIRECT, "16-row cache, direct I/O"},
        {16, 16, SLUICE_IO_PAGE, "16-row cache, page cache, batches of 16"},
        {4096, 16, SLUICE_IO_DIRECT, "whole prompt prefetched, batches of 16"},
    };
    int same = 0;
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        m = load(NULL, SLUICE_MODE_STREAM, cfgs[i].cache_rows, cfgs[i].io);
        CHECK(m != NULL);
        if (!m) continue;
        float *lg = eval_all(m, ids, n, cfgs[i].batch, false);
        bool eq = lg && memcmp(lg, ref, len * 4) == 0;
        CHECKF(eq, "n-gram tier (%s) differs from the mapped table", cfgs[i].label);
        same += eq;
        sluice_model_ngram_stats(m, &st);
        CHECK(st.on_demand && st.lookups == (uint64_t)n * 8 && st.reads > 0 &&
              st.hits + st.misses <= st.lookups);
        if (cfgs[i].cache_rows == 16) CHECK(st.evictions > 0);
        if (cfgs[i].batch == 16 && cfgs[i].cache_rows == 4096)
            CHECKF(st.misses == 0, "rows of later batches were not prefetched (%llu misses)",
                   (unsigned long long)st.misses);
        printf("n-gram tier, %s: %llu lookups, %llu hits, %llu misses, %llu prefetched, %llu reads "
               "(%llu KiB), %llu evictions, %llu stalls %.3f ms over %llu passes\n",
               cfgs[i].label, (unsigned long long)st.lookups, (unsigned long long)st.hits,
               (unsigned long long)st.misses, (unsigned long long)st.prefetched,
               (unsigned long long)st.reads, (unsigned long long)(st.bytes_read >> 10),
               (unsigned long long)st.evictions, (unsigned long long)st.stalls,
               st.stall_s * 1e3, (unsigned long long)st.gathers);
        free(lg);
        sluice_model_free(m);
    }
    printf("n-gram tier: %d of %zu on-demand configurations bit-identical to the mapped table\n",
           same, sizeof cfgs / sizeof cfgs[0]);
    free(ref);
    free(ids);
}

/* Decoding with the table on demand: the rows of the next token's likeliest candidates are
 * read while the current step finishes, so greedy decoding should find its rows ready. */
static void test_decode_stall(void) {
    int n = 0;
    int32_t *ids = read_ids("qwen4exp-tiny-F32", "prompt.ids", &n);
    sluice_model *res = load(NULL, SLUICE_MODE_RESIDENT, 0, SLUICE_IO_DIRECT);
    sluice_model *str = load(NULL, SLUICE_MODE_STREAM, 0, SLUICE_IO_DIRECT);
    CHECK(ids && res && str);
    if (!ids || !res || !str) return;
    enum { STEPS = 64 };
    int32_t out[2][STEPS];
    sluice_ngram_stats before, after;
    for (int k = 0; k < 2; k++) {
        sluice_model *m = k ? str : res;
        sluice_session_params sp = {.n_ctx = n + STEPS + 1, .n_threads = 2};
        sluice_session *s = sluice_session_new(m, &sp);
        sluice_sampler_params g = sluice_sampler_defaults();
        g.temperature = 0;
        sluice_session_set_sampler(s, &g);
        CHECK(s && sluice_session_eval(s, ids, n, NULL) == 0);
        if (k) sluice_model_ngram_stats(m, &before);
        for (int i = 0; i < STEPS; i++) {
            out[k][i] = sluice_session_sample(s);
            CHECK(sluice_session_eval(s, &out[k][i], 1, NULL) == 0);
        }
        if (k) sluice_model_ngram_stats(m, &after);
        sluice_session_free(s);
    }
    CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0);
    const uint64_t look = after.lookups - before.lookups, miss = after.misses - before.misses;
    printf("n-gram tier, greedy decode of %d tokens on demand: %llu rows, %llu of them requested "
           "before their step, %llu ready when needed, %llu waits, %.1f us stalled per token\n",
           STEPS, (unsigned long long)look, (unsigned long long)(look - miss),
           (unsigned long long)(after.hits - before.hits),
           (unsigned long long)(after.stalls - before.stalls),
           (after.stall_s - before.stall_s) * 1e6 / STEPS);
    CHECKF(miss == 0, "greedy decode found %llu rows not requested in advance",
           (unsigned long long)miss);
    sluice_model_free(res);
    sluice_model_free(str);
    free(ids);
}

/* ---- 5. overrides, plan --------------------------------------------------------------------- */

static void test_overrides(void) {
    const char *bad[] = {"qwen4exp.attention.indexer.top_k", "=int:3", "k=int",
                         "qwen4exp.attention.indexer.top_k=int:x", "a=double:1",
                         "qwen4exp.ple.layers=int:1", "a=bool:maybe"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sluice_model *m = load(bad[i], SLUICE_MODE_AUTO, 0, SLUICE_IO_DIRECT);
        CHECKF(!m && strstr(sluice_last_error(), "override") && !strchr(sluice_last_error(), '\n'),
               "override '%s' accepted (%s)", bad[i], m ? "loaded" : sluice_last_error());
        sluice_model_free(m);
    }
    /* a valid override of a missing key adds it; a nonsense value is caught by the loader */
    sluice_model *m = load("qwen4exp.attention.indexer.top_k=int:0", SLUICE_MODE_AUTO, 0,
                           SLUICE_IO_DIRECT);
    CHECKF(!m && strstr(sluice_last_error(), "top_k"), "top_k 0 accepted (%s)",
           m ? "loaded" : sluice_last_error());
    sluice_model_free(m);
    m = load("general.name=str:overridden", SLUICE_MODE_STREAM, 0, SLUICE_IO_DIRECT);
    CHECK(m != NULL);
    if (!m) return;
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    CHECKF(strcmp(info.name, "overridden") == 0, "name %s", info.name);
    char buf[4096];
    sluice_model_plan(m, true, buf, sizeof buf);
    CHECKF(strstr(buf, "\"ngram_resident\":false") && strstr(buf, "\"ngram_bytes\":278528"),
           "plan: %s", buf);
    sluice_model_plan(m, false, buf, sizeof buf);
    CHECKF(strstr(buf, "n-gram cache"), "plan: %s", buf);
    sluice_model_free(m);
}

int main(void) {
    char path[1024];
    if (!fixture_path("models", "qwen4exp-tiny-F32.gguf", path, sizeof path)) {
        printf("qwen4exp-tiny-F32 not found: skipped\n");
        return 0;
    }
    test_qsa();
    test_rows();
    test_tier();
    test_decode_stall();
    test_overrides();
    CHECK_DONE();
}
