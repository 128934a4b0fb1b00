/* Expert parallelism (docs/multi-gpu.md): which rank (GPU) holds each routed expert, and how one
 * MoE layer's token-slots travel between ranks. Pure functions on host arrays, so the placement
 * and the bookkeeping of dispatch and combine are unit-tested without a GPU
 * (tests/unit/test_ep.c); the CUDA path (backends/cuda/cuda_ep.cu) builds the same dispatch on
 * the device.
 *
 * Terms. A batch of n tokens routes each token to k experts: n * k slots, slot i = t * k + s.
 * Every rank runs the dense layers on all n tokens (replicated), so every rank holds the MoE
 * input x. Rank h is the HOME of the token shard ep_shard(n, n_rank, h); for the slots of its
 * shard it sends x rows to the ranks that OWN the slots' experts (dispatch), the owners compute
 * the expert outputs, send them back (combine), and the home sums them per token in slot order,
 * exactly as the one-GPU moe_experts does: the result is bit-identical whatever the rank count. */
#ifndef SLUICE_EP_PLACEMENT_H
#define SLUICE_EP_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#define EP_MAX_RANKS 64

typedef struct ep_place_params {
    int n_rank;                   /* 1..EP_MAX_RANKS */
    int n_layer, n_expert;
    /* [n_layer][n_expert] routing counts (a trace's histogram, see ep_counts_from_keys);
     * NULL: every expert equally popular */
    const uint64_t *counts;
    /* [n_layer] bytes of one routed expert of the layer; 0: the layer has no routed experts */
    const uint64_t *expert_bytes;
    /* [n_rank] bytes each rank may spend on experts; NULL: no limit */
    const uint64_t *capacity;
} ep_place_params;

typedef struct ep_placement {
    int n_rank, n_layer, n_expert;
    int32_t *owner;       /* [n_layer][n_expert] owning rank; -1 for layers without experts */
    uint64_t *layer_load; /* [n_layer][n_rank] expected slots per layer (counts + 1 each) */
    uint64_t *bytes;      /* [n_rank] expert bytes held */
    int32_t *experts;     /* [n_rank] experts held (all layers) */
} ep_placement;

/* Assign every expert of every layer to a rank. Per layer (each layer's all-to-all is a barrier,
 * so balance must hold layer by layer, not only in total): experts in order of descending
 * count (ties: lower id first) go to the rank with the least expected load in that layer that
 * still has a free slot in the layer (ceil(n_expert / n_rank) each, which keeps bytes equal)
 * and room in its capacity (ties: fewer bytes held, then the lower rank); when no rank under
 * its quota has room (unequal capacities), any rank with room. Deterministic.
 * 0, or -1 with a one-line reason in err (the experts do not fit, bad arguments). */
int ep_place(const ep_place_params *p, ep_placement *out, char *err, size_t err_len);
void ep_placement_free(ep_placement *pl);

/* counts[layer * n_expert + expert] += 1 per key (keys as tools/cachesim's sim_keys:
 * layer * n_expert + expert); keys out of range are ignored. */
void ep_counts_from_keys(const uint32_t *keys, size_t n, int n_layer, int n_expert,
                         uint64_t *counts);

/* How a placement balances given counts (e.g. a held-out part of a trace): the mean over the
 * layers with experts of (the largest rank's slots / the mean rank's slots); 1 is perfect.
 * Layers whose counts are all zero are skipped; 0 when there is no such layer. */
double ep_imbalance(const ep_placement *pl, const uint64_t *counts);

/* The contiguous token shard [*t0, *t1) whose home is rank r (sizes differ by at most one). */
void ep_shard(int n_tok, int n_rank, int r, int *t0, int *t1);

/* One home rank's dispatch for its slots at one layer. */
typedef struct ep_dispatch {
    int n_rank, n_slot;
    int32_t *owner;       /* [n_slot] rank owning slot i's expert */
    int32_t *send_count;  /* [n_rank] slots sent to each rank */
    int32_t *send_offset; /* [n_rank + 1] first send position of each rank */
    int32_t *perm;        /* [n_slot] send position j -> slot i (by rank, then slot order) */
    int32_t *inv;         /* [n_slot] slot i -> send position (the combine's gather index) */
} ep_dispatch;

/* The dispatch of n_slot slots whose experts are ids[0..n_slot) at layer il. 0, or -1 (out of
 * memory, an expert id out of range or a layer without experts). */
int ep_dispatch_plan(const ep_placement *pl, int il, const int32_t *ids, int n_slot,
                     ep_dispatch *d);
void ep_dispatch_free(ep_dispatch *d);

#endif
