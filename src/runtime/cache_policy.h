/* Expert cache eviction policies, shared by the real expert cache (runtime/experts_stream.c)
 * and the cache simulator, so the simulator replays exactly what the engine does.
 *
 * Keys identify experts (layer * n_expert + expert). The policy keeps a score per key across
 * evictions (an expert evicted and read again keeps its history) and orders eviction
 * candidates: lower score goes first, ties go to the least recently used.
 *
 *   LRU      score = time of last use
 *   LFU      score = number of uses
 *   ENGINE   decayed hotness: h <- h * 2^(-dt / half_life) + 1 at each use, dt in uses of any
 *            expert since its last use; compared at the current time, i.e. hot and recent
 *            experts stay. The half-life is 32 cache-fulls of uses
 *            (cache_policy_engine_half_life): measured with `sluice cachesim` on skewed traces,
 *            a half-life of one cache-full collapses to 0% hits when a token's working set
 *            exceeds the cache, while 16-64 cache-fulls match LFU at small caches and beat it
 *            when topics drift (docs/cachesim.md). */
#ifndef SLUICE_CACHE_POLICY_H
#define SLUICE_CACHE_POLICY_H

#include <stdbool.h>
#include <stdint.h>

typedef enum cache_policy_kind {
    CACHE_POLICY_LRU = 0,
    CACHE_POLICY_LFU = 1,
    CACHE_POLICY_ENGINE = 2,
} cache_policy_kind;

typedef struct cache_policy cache_policy;

/* The ENGINE half-life (in uses) for a cache of n_slots. */
static inline double cache_policy_engine_half_life(int n_slots) {
    return 32.0 * (n_slots > 0 ? n_slots : 1);
}

/* n_keys: number of distinct experts; half_life: for ENGINE (uses), 0 = default. */
cache_policy *cache_policy_new(cache_policy_kind kind, int n_keys, double half_life);
void cache_policy_free(cache_policy *p);
const char *cache_policy_name(cache_policy_kind kind);

/* Record one use of key (advances the policy's clock). */
void cache_policy_touch(cache_policy *p, int key);
/* True when key a should be evicted before key b. */
bool cache_policy_prefer_evict(const cache_policy *p, int a, int b);
/* key's place in the eviction order: a goes before b exactly when (score, last) of a is
 * lexicographically below b's (cache_policy_prefer_evict), for choosing many victims at once. */
void cache_policy_rank(const cache_policy *p, int key, double *score, uint64_t *last);

/* Sweeps. A batch whose demand for a layer covers at least half of its experts (a prefill
 * chunk; a 16-token batch of a 256-expert top-8 model needs ~100) needs most of every layer's
 * experts at every pass, so the next use of a cached expert is the next pass over its layer,
 * whatever its history: the expert needed last is one of the layer that comes last. The ENGINE
 * order (hot and recent stay) evicts in a pass the layers about to come, the wrong end: a
 * chunked prompt of a 35B-A3B shape at a 12 GB cache read 76% of the experts' bytes every
 * chunk (bench/results/2026-12-03-stream-sweep.md). */
static inline bool cache_sweep_batch(int n_need, int n_expert) { return n_need > 1 && 2 * n_need >= n_expert; }

/* Layers from the one after layer_now until `layer` comes again, 0 .. n_layer - 1: victims in a
 * sweep go by the largest (layer_now itself: its experts not pinned or protected are done with
 * for this pass). */
static inline int cache_sweep_distance(int layer, int layer_now, int n_layer) {
    const int d = (layer - layer_now - 1) % n_layer;
    return d < 0 ? d + n_layer : d;
}

/* Router lookahead, one prediction rank at a time. A decode token's lookahead ranks the next
 * layer's experts as its router would; the lower ranks come true less often (qwen4exp-8l floor
 * run: rank 0 91%, rank 3 69%, rank 9 35%). A wrong guess costs a read and the slot it evicts;
 * a right one turns a read the layer waits for into one it does not, but the read costs the
 * same bytes. Where the disk is the bottleneck the wrong guesses' bytes cost more than the right
 * ones save: on 16 cores (compute ~1/4 of the reads) prefetching ranks 0-2 only decoded 64
 * tokens in 4.2-4.7 s against 5.3-6.4 s with all ten, and on 2 vCPUs it lost nothing
 * (bench/results/2026-12-03-synth-centred.md). So a rank is prefetched while the share of its
 * predictions that came true is at least LOOK_RANK_PRECISION; every rank is, until it has been
 * seen LOOK_RANK_WARMUP times. Its predictions are counted whether or not they were read. */
#define LOOK_RANK_PRECISION 0.65
#define LOOK_RANK_WARMUP 64
static inline bool look_rank_wanted(uint64_t seen, uint64_t came_true, double min_precision) {
    return seen < LOOK_RANK_WARMUP || (double)came_true >= min_precision * (double)seen;
}

#endif
