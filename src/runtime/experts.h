/* The expert store: the only way model code reaches routed-expert weights.
 *
 *   expert_acquire(store, layer, expert, &views)  -> gate/up/down matrices of one expert
 *   expert_release(store, layer, expert)
 *
 * The resident store returns views into the mapped model file. A streaming store returns cache
 * slots filled by direct reads. MoE code cannot tell them apart, which is what makes resident
 * and streamed runs bit-identical. Views stay valid until released; an acquired expert is
 * pinned (never evicted) until then. */
#ifndef SLUICE_EXPERTS_H
#define SLUICE_EXPERTS_H

#include "backends/backend.h"
#include "sluice.h"

typedef struct expert_views {
    tview gate; /* [n_embd] -> [n_ff_exp] */
    tview up;   /* [n_embd] -> [n_ff_exp] */
    tview down; /* [n_ff_exp] -> [n_embd] */
} expert_views;

typedef struct expert_store expert_store;

typedef struct expert_store_ops {
    const char *name;
    /* 0, or -1 with sluice_last_error() set (I/O failure of a streaming store). */
    int (*acquire)(expert_store *s, int layer, int expert, expert_views *out);
    void (*release)(expert_store *s, int layer, int expert);
    void (*free)(expert_store *s);
} expert_store_ops;

struct expert_store {
    const expert_store_ops *ops;
    int n_layer;
    int n_expert;
    sluice_expert_stats stats;
};

/* Per-layer stacked expert tensors as found in a GGUF: ne = [in, out, n_expert]. */
typedef struct expert_layer_tensors {
    tview gate, up, down;
} expert_layer_tensors;

/* Views into the mapped file. layers[i] may have absent tensors (dense layers). */
expert_store *expert_store_resident_new(const expert_layer_tensors *layers, int n_layer,
                                        int n_expert);

static inline int expert_acquire(expert_store *s, int layer, int expert, expert_views *out) {
    return s->ops->acquire(s, layer, expert, out);
}
static inline void expert_release(expert_store *s, int layer, int expert) {
    s->ops->release(s, layer, expert);
}
static inline void expert_store_free(expert_store *s) {
    if (s) s->ops->free(s);
}

#endif /* SLUICE_EXPERTS_H */
