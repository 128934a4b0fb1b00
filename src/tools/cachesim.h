/* Expert-cache simulator: replays the expert uses of a routing trace through eviction policies
 * and counts hits. The engine's own policies come from runtime/cache_policy.h, the very code the
 * streaming expert cache runs, so a simulated curve is what the engine would get.
 *
 * An access is one (layer, expert) use in trace order; a hit is a use whose expert is already
 * in the cache. Capacities are in expert slots (one slot holds one expert's gate+up+down).
 *
 *   lru, lfu, engine     one pool shared by all layers (engine: decayed hotness, then recency)
 *   lru-layer,           one pool per layer, capacity / n_layer slots each
 *   engine-layer
 *   pinned-hot           the most used experts of the trace (pin_frac of the slots) are never
 *                        evicted once loaded; the rest of the slots run LRU
 *   lru-warm,            the cache starts filled with the trace's most used experts (as if
 *   engine-warm          warmed from an earlier session's statistics); the fill is free
 *   belady               the offline optimum (evict the expert used again farthest in the
 *                        future): an upper bound for every policy that starts cold
 *   belady-warm          the optimum with a free initial fill: an upper bound for the warm ones
 */
#ifndef SLUICE_CACHESIM_H
#define SLUICE_CACHESIM_H

#include <stddef.h>
#include <stdint.h>

#include "tools/trace.h"

typedef enum sim_policy {
    SIM_LRU, SIM_LFU, SIM_ENGINE, SIM_LRU_LAYER, SIM_ENGINE_LAYER, SIM_PINNED, SIM_LRU_WARM,
    SIM_ENGINE_WARM, SIM_BELADY, SIM_BELADY_WARM, SIM_COUNT
} sim_policy;

const char *sim_policy_name(sim_policy p);
/* true for policies that start with an empty cache (bounded by belady) */
int sim_policy_is_cold(sim_policy p);

typedef struct sim_keys {
    uint32_t *keys;     /* layer * n_expert + expert, in trace order */
    uint8_t *sweep;     /* [n] or NULL: the key's pass is a sweep (cache_sweep_batch) */
    size_t n;
    int n_layer, n_expert;
} sim_keys;

/* Which MoE calls to replay. A run of consecutive records of one sequence and layer is one
 * forward pass over several tokens (a prompt chunk); a run of one record is a decode step. */
typedef enum sim_phase { SIM_PHASE_ALL, SIM_PHASE_DECODE, SIM_PHASE_PREFILL } sim_phase;

/* The access sequence of a trace, as the engine acquires experts: per forward pass and layer,
 * each distinct routed expert once, in first-use order (token by token, slot by slot: what
 * models/moe.c does). seq < 0: all sequences, else only that one. */
int sim_keys_from_trace(const trace *t, int seq, sim_phase phase, sim_keys *out);
void sim_keys_free(sim_keys *k);
/* Distinct experts used (the cold-miss floor: no cache can hit their first use). */
size_t sim_distinct(const sim_keys *k);

/* Hits of one policy at one capacity (slots >= 1). pin_frac: pinned-hot's pinned share. */
uint64_t sim_hits(sim_policy p, const sim_keys *k, int capacity, double pin_frac);

/* All policies at all capacities on n_threads threads: hits[p * n_cap + c]. */
void sim_run_all(const sim_keys *k, const int *caps, int n_cap, double pin_frac, int n_threads,
                 uint64_t *hits);

/* An SVG plot of hit rate against cache size (percent of all experts). */
int sim_write_svg(const char *path, const sim_keys *k, const int *caps, int n_cap,
                  const uint64_t *hits, const char *title);

#endif
