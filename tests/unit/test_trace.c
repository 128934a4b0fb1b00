/* Routing traces and the cache simulator: a trace written through the route callback reads back
 * record for record; malformed files are refused with one line; on random skewed traces
 * Belady's optimum is >= every cold policy and belady-warm >= every warm one; LRU (global and
 * per layer) equals a brute-force reference; the engine policy's heap replay equals a direct
 * linear-scan replay with cache_policy_prefer_evict (what the expert cache does). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "formats/quant.h"
#include "runtime/cache_policy.h"
#include "tools/cachesim.h"
#include "tools/trace.h"

static uint64_t rng_state = 12345;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static char path_buf[4096];
static const char *work(const char *name) {
    snprintf(path_buf, sizeof path_buf, "%s/%s", SLUICE_TEST_WORK, name);
    return path_buf;
}

static void write_raw(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (fp) {
        fwrite(p, 1, n, fp);
        fclose(fp);
    }
}

static void test_round_trip(void) {
    char err[256], path[4096];
    snprintf(path, sizeof path, "%s", work("rt.trace"));
    const int L = 3, E = 40, K = 4, N = 5000;
    trace_writer *w = trace_writer_open(path, L, E, K, 12345, err, sizeof err);
    CHECKF(w != NULL, "%s", err);
    if (!w) return;
    int32_t *ex = malloc((size_t)N * K * sizeof *ex);
    float *wt = malloc((size_t)N * K * sizeof *wt);
    for (int i = 0; i < N; i++) {
        if (i == N / 2) trace_writer_set_seq(w, 1);
        const uint32_t base = rnd() % E; /* distinct experts within a record */
        for (int j = 0; j < K; j++) {
            ex[i * K + j] = (int32_t)((base + (uint32_t)j * 7) % E);
            wt[i * K + j] = (float)(rnd() % 1000) / 1000.0f;
        }
        trace_writer_route(w, i % L, i / L, K, ex + i * K, wt + i * K);
    }
    CHECK(trace_writer_records(w) == (uint64_t)N);
    CHECK(trace_writer_close(w, err, sizeof err) == 0);
    trace t;
    CHECKF(trace_load(path, &t, err, sizeof err) == 0, "%s", err);
    CHECK(t.n_layer == (uint32_t)L && t.n_expert == (uint32_t)E && t.k == (uint32_t)K);
    CHECK(t.expert_bytes == 12345 && t.n_records == (size_t)N);
    bool same = t.n_records == (size_t)N;
    for (int i = 0; same && i < N; i++) {
        same = t.layer[i] == i % L && t.pos[i] == (uint32_t)(i / L) && t.seq[i] == (i >= N / 2);
        for (int j = 0; same && j < K; j++)
            same = t.experts[i * K + j] == ex[i * K + j] &&
                   t.weights[i * K + j] == quant_f16_to_f32(quant_f32_to_f16(wt[i * K + j]));
    }
    CHECK(same);
    sim_keys k;
    CHECK(sim_keys_from_trace(&t, 1, SIM_PHASE_ALL, &k) == 0 && k.n == (size_t)(N - N / 2) * K);
    sim_keys_free(&k);
    /* every record here is its own pass (layers alternate): all decode, no prefill */
    CHECK(sim_keys_from_trace(&t, -1, SIM_PHASE_DECODE, &k) == 0 && k.n == (size_t)N * K);
    sim_keys_free(&k);
    CHECK(sim_keys_from_trace(&t, -1, SIM_PHASE_PREFILL, &k) == 0 && k.n == 0);
    sim_keys_free(&k);
    trace_free(&t);

    /* malformed files: one line each, nothing crashes */
    size_t n = 0;
    FILE *fp = fopen(path, "rb");
    unsigned char *raw = malloc(1 << 20);
    if (fp) {
        n = fread(raw, 1, 1 << 20, fp);
        fclose(fp);
    }
    const char *bad = work("bad.trace");
    char bpath[4096];
    snprintf(bpath, sizeof bpath, "%s", bad);
    struct {
        const char *what;
        size_t len;
        int off;
        unsigned char val;
    } cases[] = {
        {"magic", n, 0, 'X'},          {"version", n, 4, 9},      {"k", n, 20, 0},
        {"truncated", n - 3, -1, 0},   {"expert", n, 48 + 8, 200}, {"layer", n, 48, 9},
        {"short", 20, -1, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        unsigned char *b = malloc(n);
        memcpy(b, raw, n);
        if (cases[c].off >= 0) b[cases[c].off] = cases[c].val;
        write_raw(bpath, b, cases[c].len);
        err[0] = 0;
        CHECKF(trace_load(bpath, &t, err, sizeof err) != 0, "malformed trace (%s) accepted", cases[c].what);
        CHECKF(err[0] && !strchr(err, '\n'), "case %s: '%s'", cases[c].what, err);
        free(b);
    }
    CHECK(trace_load(work("no-such.trace"), &t, err, sizeof err) != 0);
    remove(bpath);
    remove(path);
    free(raw);
    free(ex);
    free(wt);
}

/* A skewed random access sequence with some locality; every sweep_every tokens (0: never) a
 * prompt chunk's pass: every expert of every layer, in a random order, marked as a sweep. */
static sim_keys make_keys(int L, int E, int K, int tokens, int sweep_every) {
    sim_keys k = {.n_layer = L, .n_expert = E};
    const size_t sweeps = sweep_every ? (size_t)(tokens / sweep_every + 1) : 0;
    k.keys = malloc(((size_t)L * K * tokens + sweeps * L * E) * sizeof *k.keys);
    k.sweep = calloc((size_t)L * K * tokens + sweeps * L * E, 1);
    for (int t = 0; t < tokens; t++) {
        if (sweep_every && t % sweep_every == 0)
            for (int l = 0; l < L; l++) {
                const size_t first = k.n;
                for (int e = 0; e < E; e++) k.keys[k.n++] = (uint32_t)(l * E + e);
                for (int e = E - 1; e > 0; e--) { /* shuffle the layer's order */
                    const int j = (int)(rnd() % (uint32_t)(e + 1));
                    const uint32_t x = k.keys[first + e];
                    k.keys[first + e] = k.keys[first + j];
                    k.keys[first + j] = x;
                }
                memset(k.sweep + first, 1, (size_t)E);
            }
        int topic = (t / 50) % 5;
        for (int l = 0; l < L; l++)
            for (int j = 0; j < K; j++) {
                uint32_t r = rnd() % 100, e;
                if (r < 50) e = (uint32_t)(topic * 3 + rnd() % 6) % (uint32_t)E;   /* topic's experts */
                else if (r < 80) e = rnd() % 4;                                   /* globally hot */
                else e = rnd() % (uint32_t)E;
                k.keys[k.n++] = (uint32_t)l * (uint32_t)E + e;
            }
    }
    return k;
}

/* LRU by brute force: a stamp per resident key, evict the smallest. */
static uint64_t lru_brute(const sim_keys *k, int cap, bool per_layer) {
    const int nk = k->n_layer * k->n_expert;
    long *stamp = malloc((size_t)nk * sizeof *stamp);
    for (int i = 0; i < nk; i++) stamp[i] = -1;
    uint64_t hits = 0;
    for (size_t i = 0; i < k->n; i++) {
        const int key = (int)k->keys[i], layer = key / k->n_expert;
        const int lo = per_layer ? layer * k->n_expert : 0, hi = per_layer ? lo + k->n_expert : nk;
        const int c = per_layer ? cap / k->n_layer : cap;
        if (stamp[key] >= 0) {
            hits++;
        } else if (c > 0) {
            int resident = 0, victim = -1;
            for (int j = lo; j < hi; j++)
                if (stamp[j] >= 0) {
                    resident++;
                    if (victim < 0 || stamp[j] < stamp[victim]) victim = j;
                }
            if (resident >= c) stamp[victim] = -1;
        }
        if (c > 0 || stamp[key] >= 0) stamp[key] = (long)i;
    }
    free(stamp);
    return hits;
}

/* The expert cache's own way (experts_stream.c's pick_victims, one at a time): a linear scan with
 * cache_policy_prefer_evict, in a sweep the largest cache_sweep_distance first. */
static uint64_t engine_scan(const sim_keys *k, int cap) {
    const int nk = k->n_layer * k->n_expert;
    cache_policy *p = cache_policy_new(CACHE_POLICY_ENGINE, nk, cache_policy_engine_half_life(cap));
    int *slot = malloc((size_t)cap * sizeof *slot);
    char *res = calloc((size_t)nk, 1);
    int used = 0;
    uint64_t hits = 0;
    for (size_t i = 0; i < k->n; i++) {
        const int key = (int)k->keys[i];
        if (res[key]) {
            hits++;
        } else {
            if (used == cap) {
                const bool sweep = k->sweep && k->sweep[i];
                const int now = key / k->n_expert;
                int best = 0, best_d = sweep ? cache_sweep_distance(slot[0] / k->n_expert, now, k->n_layer) : 0;
                for (int s = 1; s < cap; s++) {
                    const int d = sweep ? cache_sweep_distance(slot[s] / k->n_expert, now, k->n_layer) : 0;
                    if (d > best_d || (d == best_d && cache_policy_prefer_evict(p, slot[s], slot[best]))) {
                        best = s;
                        best_d = d;
                    }
                }
                res[slot[best]] = 0;
                slot[best] = key;
            } else {
                slot[used++] = key;
            }
            res[key] = 1;
        }
        cache_policy_touch(p, key);
    }
    cache_policy_free(p);
    free(slot);
    free(res);
    return hits;
}

static void test_cachesim(void) {
    for (int trial = 0; trial < 5; trial++) {
        /* trials 3 and 4: prompt chunks between the decode tokens */
        sim_keys k = make_keys(4, 32, 3, 400 + 200 * (trial % 3), trial < 3 ? 0 : 60 + 40 * (trial - 3));
        const int caps[] = {1, 4, 8, 13, 24, 40, 64, 100, 128};
        const int n_cap = (int)(sizeof caps / sizeof caps[0]);
        uint64_t hits[SIM_COUNT * 9];
        sim_run_all(&k, caps, n_cap, 0.5, 2, hits);
        for (int c = 0; c < n_cap; c++) {
            const uint64_t opt = hits[SIM_BELADY * n_cap + c], optw = hits[SIM_BELADY_WARM * n_cap + c];
            for (int p = 0; p < SIM_COUNT; p++) {
                const uint64_t h = hits[p * n_cap + c];
                CHECKF(h <= k.n, "%s: more hits than uses", sim_policy_name((sim_policy)p));
                if (sim_policy_is_cold((sim_policy)p))
                    CHECKF(h <= opt, "cap %d: %s %llu > belady %llu", caps[c], sim_policy_name((sim_policy)p),
                           (unsigned long long)h, (unsigned long long)opt);
                else
                    CHECKF(h <= optw, "cap %d: %s %llu > belady-warm %llu", caps[c],
                           sim_policy_name((sim_policy)p), (unsigned long long)h, (unsigned long long)optw);
            }
            CHECK(hits[SIM_LRU * n_cap + c] == lru_brute(&k, caps[c], false));
            CHECK(hits[SIM_LRU_LAYER * n_cap + c] == lru_brute(&k, caps[c], true));
            CHECK(hits[SIM_ENGINE * n_cap + c] == engine_scan(&k, caps[c]));
            if (c > 0) CHECK(opt >= hits[SIM_BELADY * n_cap + c - 1]); /* more room never hurts OPT */
        }
        /* a cache that holds everything misses only first uses */
        const size_t d = sim_distinct(&k);
        CHECK(sim_hits(SIM_LRU, &k, 128, 0.5) == k.n - d);
        CHECK(sim_hits(SIM_BELADY, &k, 128, 0.5) == k.n - d);
        sim_keys_free(&k);
    }
}

/* Prompt chunks alone (every expert of every layer, pass after pass) at 60% of the experts:
 * recency evicts the experts about to be used and hits nothing after the first pass; the
 * engine's sweep victims (the layer that comes last) keep all but about a layer's worth. */
static void test_cachesim_sweeps(void) {
    const int L = 4, E = 32, passes = 5, cap = 77;
    sim_keys k = {.n_layer = L, .n_expert = E};
    k.keys = malloc((size_t)passes * L * E * sizeof *k.keys);
    k.sweep = malloc((size_t)passes * L * E);
    for (int p = 0; p < passes; p++)
        for (int i = 0; i < L * E; i++) {
            k.sweep[k.n] = 1;
            k.keys[k.n++] = (uint32_t)((i / E) * E + (i * 7 + p) % E);
        }
    const uint64_t engine = sim_hits(SIM_ENGINE, &k, cap, 0.5), lru = sim_hits(SIM_LRU, &k, cap, 0.5);
    printf("sweeps at %d of %d slots: engine %llu hits, lru %llu, belady %llu\n", cap, L * E,
           (unsigned long long)engine, (unsigned long long)lru, (unsigned long long)sim_hits(SIM_BELADY, &k, cap, 0.5));
    CHECK(lru == 0);
    CHECKF(engine >= (uint64_t)(passes - 1) * (cap - E), "engine %llu hits", (unsigned long long)engine);
    CHECK(engine == engine_scan(&k, cap));
    sim_keys_free(&k);
}

int main(void) {
    test_round_trip();
    test_cachesim();
    test_cachesim_sweeps();
    CHECK_DONE();
}
