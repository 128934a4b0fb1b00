/* Resident expert store: every expert is already in memory (the mapped GGUF), so acquire is a
 * pointer computation and release does nothing. Works for plain files and expert-major stores
 * alike, through the layout. */
#include <stdlib.h>
#include <string.h>

#include "formats/quant.h"
#include "runtime/experts.h"

typedef struct resident_store {
    expert_store base;
    const expert_layout *layout;
    const uint8_t *file;
} resident_store;

tview expert_part_view(const expert_part *p, const void *data) {
    tview v = {0};
    v.type = p->type;
    v.ne[0] = p->ne0;
    v.ne[1] = p->ne1;
    v.ne[2] = v.ne[3] = 1;
    v.row_bytes = quant_row_bytes(p->type, p->ne0);
    v.mat_bytes = p->bytes;
    v.data = data;
    return v;
}

static int resident_acquire(expert_store *s, int layer, int expert, expert_views *out) {
    resident_store *r = (resident_store *)s;
    const expert_layer_layout *L = &r->layout->layers[layer];
    s->stats.acquires++;
    s->stats.hits++;
    out->gate = expert_part_view(&L->part[EXPERT_GATE],
                                 r->file + expert_part_offset(&L->part[EXPERT_GATE], expert));
    out->up = expert_part_view(&L->part[EXPERT_UP],
                               r->file + expert_part_offset(&L->part[EXPERT_UP], expert));
    out->down = expert_part_view(&L->part[EXPERT_DOWN],
                                 r->file + expert_part_offset(&L->part[EXPERT_DOWN], expert));
    return 0;
}

static void resident_release(expert_store *s, int layer, int expert) {
    (void)s;
    (void)layer;
    (void)expert;
}

static void resident_free(expert_store *s) { free(s); }

static const expert_store_ops resident_ops = {
    .name = "resident",
    .acquire = resident_acquire,
    .release = resident_release,
    .prefetch = NULL,
    .free = resident_free,
};

expert_store *expert_store_resident_new(const expert_layout *layout, const uint8_t *base) {
    resident_store *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->layout = layout;
    r->file = base;
    r->base.ops = &resident_ops;
    r->base.n_layer = layout->n_layer;
    r->base.n_expert = layout->n_expert;
    return &r->base;
}
