/* A streamed MoE layer runs its experts in sets, as their reads land (models/moe.c
 * experts_one_sets for one token, experts_batch_sets for a batch): the experts already read
 * (and, for one token, the shared expert) first, then after each wait those that landed
 * meanwhile. Whatever the sets, the logits must equal the resident run's bit for bit. Which
 * experts have landed depends on the disk, so the test takes the decision from the store: it
 * replaces the streaming store's `ready` with one that follows a fixed pattern (never, every
 * other call, every third expert, the real one), evaluates the first half of the fixture's
 * prompt as one batch and the rest token by token, streamed at the cache's floor, and compares
 * every position's logits with the resident run's. It also counts the calls, so a MoE path that
 * stops asking (and so never forms sets) fails, and logs the one-token passes' prefetches and
 * acquires to check when the router lookahead reads (check_order). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixtures.h"
#include "stream_fixture.h"
#include "models/model.h"
#include "runtime/cache_policy.h"
#include "sluice.h"

typedef enum { READY_REAL, READY_NEVER, READY_ALTERNATE, READY_THIRD } ready_pattern;

static ready_pattern pattern;
static long ready_calls;
static bool (*real_ready)(expert_store *, int, int);
static void (*real_prefetch)(expert_store *, int, const int32_t *, int, bool);
static int (*real_acquire)(expert_store *, int, int, expert_views *);

/* The store calls of the one-token passes, in order: a demand prefetch, a lookahead (a
 * prefetch that is no demand) or an acquire, and its layer; a pass starts with PASS. */
typedef enum { EV_PASS, EV_DEMAND, EV_LOOK, EV_ACQUIRE } ev_kind;
typedef struct {
    ev_kind kind;
    int layer;
} store_event;
enum { MAX_EVENTS = 1 << 14 };
static store_event events[MAX_EVENTS];
static int n_events;
static bool logging; /* one-token passes only */
static int model_k, model_layers; /* of the last model decode_all loaded */

static void log_event(ev_kind kind, int layer) {
    if (logging && n_events < MAX_EVENTS) events[n_events++] = (store_event){kind, layer};
}
static void logged_prefetch(expert_store *s, int layer, const int32_t *experts, int n, bool demand) {
    log_event(demand ? EV_DEMAND : EV_LOOK, layer);
    real_prefetch(s, layer, experts, n, demand);
}
static int logged_acquire(expert_store *s, int layer, int expert, expert_views *out) {
    log_event(EV_ACQUIRE, layer);
    return real_acquire(s, layer, expert, out);
}

static bool patterned_ready(expert_store *s, int layer, int expert) {
    const long call = ready_calls++;
    switch (pattern) {
    case READY_NEVER: return false;
    case READY_ALTERNATE: return (call & 1) && real_ready(s, layer, expert);
    case READY_THIRD: return expert % 3 == 0 && real_ready(s, layer, expert);
    case READY_REAL: break;
    }
    return real_ready(s, layer, expert);
}

/* The logits of every position of ids[0..n): the first half as one batch, then token by token.
 * NULL on failure. With a streaming store, `ready` follows the pattern. */
static float *decode_all(const char *path, sluice_mode mode, int cache, ready_pattern pat, const int32_t *ids,
                         int n, int *n_vocab) {
    sluice_model_params mp = {.mode = mode, .cache_experts = cache, .n_ctx = n + 1};
    sluice_model *m = sluice_model_load(path, &mp);
    CHECKF(m != NULL, "%s: load: %s", path, sluice_last_error());
    if (!m) return NULL;
    expert_store_ops ops;
    if (mode == SLUICE_MODE_STREAM) {
        CHECKF(m->experts && m->experts->streaming && m->experts->ops->ready, "%s: no streaming store with ready",
               path);
        if (!m->experts || !m->experts->ops->ready) {
            sluice_model_free(m);
            return NULL;
        }
        ops = *m->experts->ops;
        real_ready = ops.ready;
        ops.ready = patterned_ready;
        real_prefetch = ops.prefetch;
        ops.prefetch = logged_prefetch;
        real_acquire = ops.acquire;
        ops.acquire = logged_acquire;
        m->experts->ops = &ops;
        pattern = pat;
    }
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    *n_vocab = info.n_vocab;
    model_k = m->hp.n_expert_used;
    model_layers = m->hp.n_layer;
    sluice_session_params sp = {.n_ctx = n + 1, .n_threads = 2};
    sluice_session *s = sluice_session_new(m, &sp);
    float *lg = malloc((size_t)n * info.n_vocab * sizeof *lg);
    const int half = n / 2;
    bool ok = s && lg && sluice_session_eval(s, ids, half, lg) == 0;
    n_events = 0;
    logging = mode == SLUICE_MODE_STREAM;
    for (int i = half; ok && i < n; i++) {
        log_event(EV_PASS, -1);
        ok = sluice_session_eval(s, &ids[i], 1, lg + (size_t)i * info.n_vocab) == 0;
    }
    logging = false;
    CHECKF(ok, "%s: decode: %s", path, sluice_last_error());
    sluice_session_free(s);
    sluice_model_free(m);
    if (!ok) {
        free(lg);
        return NULL;
    }
    return lg;
}

/* The order of a streamed one-token pass's store calls (models/moe.c):
 *   - the first MoE layer's experts are predicted before that layer runs (moe_lookahead_start):
 *     in every pass a lookahead for layer 0 comes before layer 0's demand;
 *   - a layer's lookahead for the next layer waits until the layer's own reads have landed
 *     (look_pending): with `ready` never true, not before all of the layer's k acquires.
 * Before 2026-12-03 neither held (no lookahead for layer 0; the next layer's right after the
 * demand, before any acquire). */
static void check_order(const char *name, ready_pattern pat, int k, int n_layer) {
    int passes = 0, look0 = 0, deferred = 0, lookaheads = 0;
    for (int i = 0; i < n_events; i++) {
        if (events[i].kind != EV_PASS) continue;
        passes++;
        int end = i + 1;
        while (end < n_events && events[end].kind != EV_PASS) end++;
        bool seen_look0 = false;
        for (int j = i + 1; j < end; j++) {
            if (events[j].kind == EV_LOOK && events[j].layer == 0) seen_look0 = true;
            if (events[j].kind == EV_DEMAND && events[j].layer == 0) {
                look0 += seen_look0;
                break;
            }
        }
        for (int j = i + 1; j < end; j++) { /* layer L's acquires before its lookahead for L + 1 */
            if (events[j].kind != EV_LOOK || events[j].layer == 0) continue;
            int acq = 0;
            for (int q = j - 1; q > i && !(events[q].kind == EV_DEMAND && events[q].layer == events[j].layer - 1); q--)
                acq += events[q].kind == EV_ACQUIRE && events[q].layer == events[j].layer - 1;
            lookaheads++;
            deferred += acq == k;
        }
    }
    CHECKF(passes > 0 && look0 == passes, "%s: %d of %d one-token passes predicted layer 0 before its demand", name,
           look0, passes);
    CHECKF(lookaheads >= passes * (n_layer - 1), "%s: %d lookaheads in %d passes", name, lookaheads, passes);
    if (pat == READY_NEVER)
        CHECKF(deferred == lookaheads, "%s: %d of %d lookaheads waited for their layer's %d acquires (ready never)",
               name, deferred, lookaheads, k);
}

static void check_fixture(const char *name) {
    char file[256], path[1024];
    snprintf(file, sizeof file, "%s.gguf", name);
    int n = 0;
    int32_t *ids = fixture_path("models", file, path, sizeof path) ? fixture_prompt_ids(name, 256, &n) : NULL;
    if (!ids) {
        fprintf(stderr, "SKIP: fixture %s not found\n", name);
        return;
    }
    if (n > 32) n = 32; /* a 16-token batch and 16 steps: a few hundred layers' worth of sets */
    int floor = 0, target = 0;
    CHECKF(stream_plan_slots(path, n + 1, &floor, &target), "%s: no plan", name);
    int nv = 0, nv2 = 0;
    float *ref = decode_all(path, SLUICE_MODE_RESIDENT, 0, READY_REAL, ids, n, &nv);
    static const char *labels[] = {"real", "never", "alternate", "every third expert"};
    for (int p = READY_REAL; ref && floor > 0 && p <= READY_THIRD; p++) {
        ready_calls = 0;
        float *lg = decode_all(path, SLUICE_MODE_STREAM, floor, (ready_pattern)p, ids, n, &nv2);
        CHECKF(lg && nv2 == nv && memcmp(lg, ref, (size_t)n * nv * sizeof *lg) == 0,
               "%s: streamed run with ready %s differs from resident", name, labels[p]);
        CHECKF(ready_calls >= n, "%s: ready %s asked %ld times in %d one-token steps", name, labels[p], ready_calls,
               n);
        check_order(name, (ready_pattern)p, model_k, model_layers);
        free(lg);
    }
    free(ref);
    free(ids);
}

/* The lookahead's rank rule (look_rank_wanted): every rank is read while it has been seen fewer
 * than LOOK_RANK_WARMUP times, then only while at least LOOK_RANK_PRECISION of its predictions
 * came true; a threshold of 0 reads every rank. */
static void check_rank_rule(void) {
    const uint64_t w = LOOK_RANK_WARMUP;
    CHECK(look_rank_wanted(0, 0, LOOK_RANK_PRECISION) && look_rank_wanted(w - 1, 0, LOOK_RANK_PRECISION));
    CHECK(!look_rank_wanted(w, 0, LOOK_RANK_PRECISION));
    CHECK(!look_rank_wanted(1000, 640, 0.65) && look_rank_wanted(1000, 650, 0.65) && look_rank_wanted(1000, 1000, 0.65));
    CHECK(look_rank_wanted(1000, 0, 0.0));
    CHECK(LOOK_RANK_PRECISION > 0.5 && LOOK_RANK_PRECISION < 0.8);
}

int main(void) {
    check_rank_rule();
    check_fixture("qwen35moe-tiny-Q4_K_M"); /* a shared expert: it joins the first set */
    check_fixture("qwen3moe-tiny-Q4_K_M");
    check_fixture("qwen4exp-tiny-Q2_0");
    CHECK_DONE();
}
