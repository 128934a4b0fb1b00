/* A streamed MoE layer runs its experts in sets, as their reads land (models/moe.c
 * experts_one_sets for one token, experts_batch_sets for a batch): the experts already read
 * (and, for one token, the shared expert) first, then after each wait those that landed
 * meanwhile. Whatever the sets, the logits must equal the resident run's bit for bit. Which
 * experts have landed depends on the disk, so the test takes the decision from the store: it
 * replaces the streaming store's `ready` with one that follows a fixed pattern (never, every
 * other call, every third expert, the real one), evaluates the first half of the fixture's
 * prompt as one batch and the rest token by token, streamed at the cache's floor, and compares
 * every position's logits with the resident run's. It also counts the calls, so a MoE path that
 * stops asking (and so never forms sets) fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixtures.h"
#include "stream_fixture.h"
#include "models/model.h"
#include "sluice.h"

typedef enum { READY_REAL, READY_NEVER, READY_ALTERNATE, READY_THIRD } ready_pattern;

static ready_pattern pattern;
static long ready_calls;
static bool (*real_ready)(expert_store *, int, int);

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
        m->experts->ops = &ops;
        pattern = pat;
    }
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    *n_vocab = info.n_vocab;
    sluice_session_params sp = {.n_ctx = n + 1, .n_threads = 2};
    sluice_session *s = sluice_session_new(m, &sp);
    float *lg = malloc((size_t)n * info.n_vocab * sizeof *lg);
    const int half = n / 2;
    bool ok = s && lg && sluice_session_eval(s, ids, half, lg) == 0;
    for (int i = half; ok && i < n; i++) ok = sluice_session_eval(s, &ids[i], 1, lg + (size_t)i * info.n_vocab) == 0;
    CHECKF(ok, "%s: decode: %s", path, sluice_last_error());
    sluice_session_free(s);
    sluice_model_free(m);
    if (!ok) {
        free(lg);
        return NULL;
    }
    return lg;
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
        free(lg);
    }
    free(ref);
    free(ids);
}

int main(void) {
    check_fixture("qwen35moe-tiny-Q4_K_M"); /* a shared expert: it joins the first set */
    check_fixture("qwen3moe-tiny-Q4_K_M");
    check_fixture("qwen4exp-tiny-Q2_0");
    CHECK_DONE();
}
