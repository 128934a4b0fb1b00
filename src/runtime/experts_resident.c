/* Resident expert store: every expert is already in memory (the mapped GGUF), so acquire is a
 * pointer computation and release does nothing. */
#include <stdlib.h>
#include <string.h>

#include "runtime/experts.h"

typedef struct resident_store {
    expert_store base;
    expert_layer_tensors *layers;
} resident_store;

static int resident_acquire(expert_store *s, int layer, int expert, expert_views *out) {
    const expert_layer_tensors *L = &((resident_store *)s)->layers[layer];
    s->stats.acquires++;
    s->stats.hits++;
    out->gate = tview_matrix(&L->gate, expert);
    out->up = tview_matrix(&L->up, expert);
    out->down = tview_matrix(&L->down, expert);
    return 0;
}

static void resident_release(expert_store *s, int layer, int expert) {
    (void)s;
    (void)layer;
    (void)expert;
}

static void resident_free(expert_store *s) {
    resident_store *r = (resident_store *)s;
    free(r->layers);
    free(r);
}

static const expert_store_ops resident_ops = {
    .name = "resident",
    .acquire = resident_acquire,
    .release = resident_release,
    .free = resident_free,
};

expert_store *expert_store_resident_new(const expert_layer_tensors *layers, int n_layer,
                                        int n_expert) {
    resident_store *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->layers = malloc((size_t)n_layer * sizeof *r->layers);
    if (!r->layers) {
        free(r);
        return NULL;
    }
    memcpy(r->layers, layers, (size_t)n_layer * sizeof *layers);
    r->base.ops = &resident_ops;
    r->base.n_layer = n_layer;
    r->base.n_expert = n_expert;
    return &r->base;
}
