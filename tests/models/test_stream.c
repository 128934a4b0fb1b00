/* Streaming invariants, for every MoE fixture found:
 *   - logits are bit-identical between the resident store and the streaming store at cache
 *     sizes floor, middle and full, with prefetch on and off, with 1 and 2 threads, direct and
 *     page-cache I/O, io_uring and the pread pool;
 *   - the expert-major store written by repack gives the same bits (resident and streamed, with
 *     per-record CRC checks), and repacking is deterministic;
 *   - a corrupted store is refused (a flipped manifest byte at load; a flipped record byte by
 *     verify and by CRC-checked reads);
 *   - a budget below the floor is refused before anything is allocated;
 *   - peak RSS stays within the plan.
 * qwen4exp's fixtures stream their n-gram table as well (the planner reads it on demand whenever
 * experts stream), so the same comparisons cover that tier. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "fixtures.h"
#include "stream_fixture.h"
#include "formats/store.h"
#include "sluice.h"

static const char *fixtures[] = {
    "qwen3moe-tiny-F32",    "qwen3moe-tiny-Q8_0",   "qwen3moe-tiny-Q6_K",  "qwen3moe-tiny-Q4_K_M",
    "qwen3moe-tiny-Q2_K",   "qwen3moe-tiny-IQ4_XS", "qwen3moe-tiny-MIX",   "qwen35moe-tiny-F32",
    "qwen35moe-tiny-Q8_0",  "qwen35moe-tiny-Q6_K",  "qwen35moe-tiny-Q4_K_M", "qwen35moe-tiny-Q2_K",
    "qwen35moe-tiny-IQ4_XS", "qwen35moe-tiny-MIX",   "qwen4exp-tiny-F32",   "qwen4exp-tiny-Q4_K_M",
    "qwen4exp-tiny-Q2_0",
};

typedef struct cfg {
    sluice_mode mode;
    int cache_experts; /* 0: planner */
    bool no_prefetch, verify;
    sluice_io io;
    int threads;
    const char *label;
} cfg;

static float *eval(const char *path, const cfg *c, const int32_t *ids, int n, size_t *n_out,
                   sluice_expert_stats *stats, char *mode_out) {
    sluice_model_params mp = {.mode = c->mode, .cache_experts = c->cache_experts,
                              .no_prefetch = c->no_prefetch, .verify_reads = c->verify,
                              .io = c->io, .n_ctx = n + 4};
    sluice_model *m = sluice_model_load(path, &mp);
    if (!m) {
        fprintf(stderr, "%s: %s\n", c->label, sluice_last_error());
        return NULL;
    }
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    sluice_session_params sp = {.n_ctx = n + 4, .n_threads = c->threads};
    sluice_session *s = sluice_session_new(m, &sp);
    float *lg = malloc((size_t)n * info.n_vocab * sizeof *lg);
    bool ok = s && lg && sluice_session_eval(s, ids, n, lg) == 0;
    /* then decode a few tokens one by one: exercises the single-token path through the cache */
    for (int i = 0; ok && i < 4; i++) ok = sluice_session_eval(s, &ids[i], 1, NULL) == 0;
    if (!ok) {
        if (strcmp(c->label, "corrupted store") != 0)
            fprintf(stderr, "%s: %s\n", c->label, sluice_last_error());
        free(lg);
        lg = NULL;
    }
    if (stats) sluice_model_expert_stats(m, stats);
    if (mode_out) strcpy(mode_out, sluice_model_mode(m));
    *n_out = (size_t)n * info.n_vocab;
    sluice_session_free(s);
    sluice_model_free(m);
    return lg;
}

static void flip_byte(const char *src, const char *dst, long offset) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    int c;
    long i = 0;
    while ((c = fgetc(in)) != EOF) {
        fputc(i == offset ? c ^ 0x5a : c, out);
        i++;
    }
    fclose(in);
    fclose(out);
}

static long find_bytes(const char *path, const char *needle) {
    FILE *fp = fopen(path, "rb");
    size_t cap = 1 << 20;
    char *buf = malloc(cap);
    size_t n = fread(buf, 1, cap, fp);
    fclose(fp);
    void *at = memmem(buf, n, needle, strlen(needle));
    long off = at ? (long)((char *)at - buf) : -1;
    free(buf);
    return off;
}

#ifndef __SANITIZE_ADDRESS__
static uint64_t peak_rss(void) {
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t kb = 0;
    while (fp && fgets(line, sizeof line, fp))
        if (strncmp(line, "VmHWM:", 6) == 0) kb = strtoull(line + 6, NULL, 10);
    if (fp) fclose(fp);
    return kb * 1024;
}
#endif

static void test_fixture(const char *name, const char *tmpdir) {
    char file[256], path[1024];
    snprintf(file, sizeof file, "%s.gguf", name);
    if (!fixture_path("models", file, path, sizeof path)) return;
    int n = 0;
    int32_t *ids = fixture_prompt_ids(name, 4096, &n);
    if (!ids) return;
    int floor = 0, target = 0;
    const bool planned = stream_plan_slots(path, n, &floor, &target);
    CHECKF(planned, "%s: no plan", name);
    if (!planned) return;
    size_t len = 0, len2 = 0;
    cfg base = {SLUICE_MODE_RESIDENT, 0, false, false, SLUICE_IO_DIRECT, 2, "resident"};
    char mode[16];
    float *ref = eval(path, &base, ids, n, &len, NULL, mode);
    CHECKF(ref && strcmp(mode, "resident") == 0, "%s: resident run", name);
    if (!ref) return;

    const cfg cfgs[] = {
        {SLUICE_MODE_STREAM, floor, false, false, SLUICE_IO_DIRECT, 2, "stream floor"},
        {SLUICE_MODE_STREAM, floor, true, false, SLUICE_IO_DIRECT, 1, "stream floor, no prefetch, 1 thread"},
        {SLUICE_MODE_STREAM, (floor + target) / 2, false, false, SLUICE_IO_DIRECT, 1, "stream middle, 1 thread"},
        {SLUICE_MODE_STREAM, (floor + target) / 2, true, false, SLUICE_IO_PAGE, 2, "stream middle, page I/O, no prefetch"},
        {SLUICE_MODE_STREAM, target, false, false, SLUICE_IO_DIRECT, 2, "stream full"},
        {SLUICE_MODE_STREAM, 0, false, false, SLUICE_IO_PAGE, 1, "stream planner-sized, page I/O"},
    };
    int identical = 0, total = 0;
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        sluice_expert_stats st;
        float *lg = eval(path, &cfgs[i], ids, n, &len2, &st, mode);
        bool same = lg && len2 == len && memcmp(lg, ref, len * sizeof *lg) == 0;
        CHECKF(same, "%s: %s differs from resident", name, cfgs[i].label);
        CHECKF(strcmp(mode, "stream") == 0, "%s: %s did not stream", name, cfgs[i].label);
        if (cfgs[i].cache_experts == floor) CHECKF(st.misses > 0, "%s: floor cache never missed", name);
        identical += same;
        total++;
        free(lg);
    }
    /* the pread pool instead of io_uring */
    setenv("SLUICE_IO_BACKEND", "pread", 1);
    float *lg = eval(path, &cfgs[0], ids, n, &len2, NULL, NULL);
    unsetenv("SLUICE_IO_BACKEND");
    CHECKF(lg && memcmp(lg, ref, len * sizeof *lg) == 0, "%s: pread pool differs", name);
    identical += lg && memcmp(lg, ref, len * sizeof *lg) == 0;
    total++;
    free(lg);

    /* the expert-major store: same bits, deterministic bytes */
    char store[1024], store2[1024], bad[1024], err[512];
    snprintf(store, sizeof store, "%s/%s.store.gguf", tmpdir, name);
    snprintf(store2, sizeof store2, "%s/%s.store2.gguf", tmpdir, name);
    CHECKF(store_repack(path, store, NULL, NULL, err, sizeof err) == 0, "%s: repack: %s", name, err);
    CHECKF(store_repack(path, store2, NULL, NULL, err, sizeof err) == 0, "%s: repack: %s", name, err);
    size_t a_len = 0, b_len = 0;
    {
        FILE *a = fopen(store, "rb"), *b = fopen(store2, "rb");
        bool same = a && b;
        int ca, cb;
        while (same && (ca = fgetc(a)) != EOF) {
            cb = fgetc(b);
            same = ca == cb;
            a_len++;
        }
        if (same && b) same = fgetc(b) == EOF;
        (void)b_len;
        CHECKF(same, "%s: repack is not deterministic", name);
        if (a) fclose(a);
        if (b) fclose(b);
    }
    store_verify_report rep;
    CHECKF(store_verify(store, &rep, NULL, NULL, err, sizeof err) == 0 && rep.packed,
           "%s: verify: %s", name, err);
    const cfg scfgs[] = {
        {SLUICE_MODE_RESIDENT, 0, false, false, SLUICE_IO_DIRECT, 2, "store resident"},
        {SLUICE_MODE_STREAM, floor, false, true, SLUICE_IO_DIRECT, 2, "store stream floor, CRC checked"},
        {SLUICE_MODE_STREAM, target, true, false, SLUICE_IO_DIRECT, 1, "store stream full"},
    };
    for (size_t i = 0; i < sizeof scfgs / sizeof scfgs[0]; i++) {
        lg = eval(store, &scfgs[i], ids, n, &len2, NULL, NULL);
        bool same = lg && len2 == len && memcmp(lg, ref, len * sizeof *lg) == 0;
        CHECKF(same, "%s: %s differs from the plain file", name, scfgs[i].label);
        identical += same;
        total++;
        free(lg);
    }

    /* corruption: a manifest byte (a record stride value) -> refused at load */
    long at = find_bytes(store, "sluice.store.record_stride");
    CHECK(at > 0);
    snprintf(bad, sizeof bad, "%s/%s.bad.gguf", tmpdir, name);
    flip_byte(store, bad, at + 26 + 4 + 4 + 8 + 1); /* inside the first stride value */
    sluice_model_params mp = {0};
    sluice_model *m = sluice_model_load(bad, &mp);
    CHECKF(!m && (strstr(sluice_last_error(), "manifest") || strstr(sluice_last_error(), "align")),
           "%s: corrupted manifest accepted (%s)", name, m ? "loaded" : sluice_last_error());
    sluice_model_free(m);
    /* a record byte -> verify fails; CRC-checked streaming fails at that expert */
    long rec = -1;
    {
        gguf_file *g = gguf_open(store, err, sizeof err);
        expert_layout lay;
        if (g && expert_layout_load(g, -1, -1, &lay, err, sizeof err) == 0) {
            for (int i = 0; i < lay.n_layer; i++)
                if (lay.layers[i].present) /* expert 1 of the last MoE layer, 100 bytes in */
                    rec = (long)(lay.layers[i].record_offset + lay.layers[i].record_stride + 100);
            expert_layout_free(&lay);
        }
        gguf_close(g);
    }
    CHECK(rec > 0);
    flip_byte(store, bad, rec);
    CHECKF(store_verify(bad, &rep, NULL, NULL, err, sizeof err) != 0 && strstr(err, "corrupted"),
           "%s: verify missed a flipped record byte", name);
    cfg all = {SLUICE_MODE_STREAM, target, true, true, SLUICE_IO_DIRECT, 2, "corrupted store"};
    lg = eval(bad, &all, ids, n, &len2, NULL, NULL);
    CHECKF(lg == NULL && strstr(sluice_last_error(), "checksum"),
           "%s: a corrupted record was used (%s)", name, sluice_last_error());
    free(lg);
    remove(bad);
    remove(store);
    remove(store2);

    /* a budget below the floor is refused with the numbers */
    mp = (sluice_model_params){.mode = SLUICE_MODE_STREAM, .mem_budget = 64ull << 20};
    m = sluice_model_load(path, &mp);
    CHECKF(!m && strstr(sluice_last_error(), "floor"), "%s: tiny budget accepted (%s)", name,
           m ? "loaded" : sluice_last_error());
    sluice_model_free(m);
    mp = (sluice_model_params){.cache_experts = floor - 1};
    m = sluice_model_load(path, &mp);
    CHECKF(!m && strstr(sluice_last_error(), "floor"), "%s: cache below floor accepted", name);
    sluice_model_free(m);

    printf("%s: %d/%d configurations bit-identical to resident (floor %d, full %d experts)\n",
           name, identical, total, floor, target);
    free(ref);
    free(ids);
}

/* test_stream [SUBSTRING]: only the fixtures whose name contains SUBSTRING (all by default). */
int main(int argc, char **argv) {
    char tmpl[] = "/tmp/sluice-stream-XXXXXX";
    char *tmpdir = mkdtemp(tmpl);
    CHECK(tmpdir != NULL);
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        if (argc < 2 || strstr(fixtures[i], argv[1])) test_fixture(fixtures[i], tmpdir);
    /* peak RSS within what the planner budgets for a process (tiny models: the allowance).
     * Not under AddressSanitizer: its shadow memory and quarantine are not the engine's. */
#ifndef __SANITIZE_ADDRESS__
    uint64_t rss = peak_rss();
    CHECKF(rss < (192ull << 20) + (64ull << 20), "peak RSS %llu bytes", (unsigned long long)rss);
#endif
    rmdir(tmpdir);
    CHECK_DONE();
}
