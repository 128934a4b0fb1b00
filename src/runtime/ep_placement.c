/* Expert-parallel placement and dispatch bookkeeping (see ep_placement.h, docs/multi-gpu.md). */
#include "runtime/ep_placement.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ep_placement_free(ep_placement *pl) {
    if (!pl) return;
    free(pl->owner);
    free(pl->layer_load);
    free(pl->bytes);
    free(pl->experts);
    memset(pl, 0, sizeof *pl);
}

/* one expert of a layer in placement order: descending count, then ascending id (a total order,
 * so qsort's instability cannot change the result) */
typedef struct ex_key {
    uint64_t count;
    int32_t id;
} ex_key;

static int cmp_ex(const void *a, const void *b) {
    const ex_key *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

int ep_place(const ep_place_params *p, ep_placement *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    if (p->n_rank < 1 || p->n_rank > EP_MAX_RANKS || p->n_layer < 1 || p->n_expert < 1 ||
        !p->expert_bytes) {
        snprintf(err, err_len, "expert parallelism: %d ranks, %d layers, %d experts out of range",
                 p->n_rank, p->n_layer, p->n_expert);
        return -1;
    }
    const int R = p->n_rank, L = p->n_layer, X = p->n_expert;
    /* refuse before any work when the total cannot fit: the one-line answer a user needs */
    uint64_t need = 0, room = 0, per_rank_need = 0;
    bool unlimited = p->capacity == NULL;
    for (int il = 0; il < L; il++) {
        need += p->expert_bytes[il] * (uint64_t)X;
        per_rank_need += p->expert_bytes[il] * (uint64_t)((X + R - 1) / R);
    }
    if (!unlimited) {
        for (int r = 0; r < R; r++) room += p->capacity[r];
        if (need > room) {
            snprintf(err, err_len,
                     "expert parallelism: the routed experts need %.2f GiB but %d rank%s hold "
                     "%.2f GiB: use more GPUs, a smaller quantization, or stream experts",
                     gib(need), R, R == 1 ? "" : "s", gib(room));
            return -1;
        }
    }
    out->n_rank = R;
    out->n_layer = L;
    out->n_expert = X;
    out->owner = malloc((size_t)L * X * sizeof *out->owner);
    out->layer_load = calloc((size_t)L * R, sizeof *out->layer_load);
    out->bytes = calloc((size_t)R, sizeof *out->bytes);
    out->experts = calloc((size_t)R, sizeof *out->experts);
    ex_key *order = malloc((size_t)X * sizeof *order);
    int32_t *in_layer = malloc((size_t)R * sizeof *in_layer);
    if (!out->owner || !out->layer_load || !out->bytes || !out->experts || !order || !in_layer) {
        free(order);
        free(in_layer);
        ep_placement_free(out);
        snprintf(err, err_len, "expert parallelism: out of memory");
        return -1;
    }
    /* experts per rank per layer: floor or ceil of X / R, so ranks hold equal bytes */
    const int quota = (X + R - 1) / R, lo = X / R;
    int rc = 0;
    for (int il = 0; il < L && rc == 0; il++) {
        const uint64_t eb = p->expert_bytes[il];
        if (eb == 0) { /* a dense layer: nothing to place */
            for (int e = 0; e < X; e++) out->owner[(size_t)il * X + e] = -1;
            continue;
        }
        for (int e = 0; e < X; e++) {
            order[e].id = e;
            /* +1: an expert the trace never saw still costs a slot's work when it is chosen,
             * and without it all unseen experts would pile onto one rank */
            order[e].count = (p->counts ? p->counts[(size_t)il * X + e] : 0) + 1;
        }
        qsort(order, (size_t)X, sizeof *order, cmp_ex);
        memset(in_layer, 0, (size_t)R * sizeof *in_layer);
        uint64_t *load = out->layer_load + (size_t)il * R;
        for (int j = 0; j < X; j++) {
            int best = -1;
            /* the experts left must still cover the ranks below floor(X / R): when they just
             * do, only those ranks may take this one (so every rank ends with floor or ceil) */
            int deficit = 0;
            for (int r = 0; r < R; r++) deficit += in_layer[r] < lo ? lo - in_layer[r] : 0;
            const bool must_fill = X - j <= deficit;
            /* pass 0 keeps the per-layer quota; pass 1 (only when no rank under its quota has
             * room: unequal capacities) lets a rank with room take it */
            for (int pass = 0; pass < 2 && best < 0; pass++)
                for (int r = 0; r < R; r++) {
                    if (pass == 0 && (in_layer[r] >= quota || (must_fill && in_layer[r] >= lo))) continue;
                    if (!unlimited && out->bytes[r] + eb > p->capacity[r]) continue;
                    if (best < 0 || load[r] < load[best] ||
                        (load[r] == load[best] && out->bytes[r] < out->bytes[best]))
                        best = r; /* equal load and bytes: the lower rank (scan order) */
                }
            if (best < 0) {
                snprintf(err, err_len,
                         "expert parallelism: layer %d expert %d (%.1f MiB) fits on no rank "
                         "(each rank needs %.2f GiB for its share of the experts)",
                         il, order[j].id, (double)eb / (1 << 20), gib(per_rank_need));
                rc = -1;
                break;
            }
            out->owner[(size_t)il * X + order[j].id] = best;
            load[best] += order[j].count;
            in_layer[best]++;
            out->bytes[best] += eb;
            out->experts[best]++;
        }
    }
    free(order);
    free(in_layer);
    if (rc != 0) ep_placement_free(out);
    return rc;
}

void ep_counts_from_keys(const uint32_t *keys, size_t n, int n_layer, int n_expert,
                         uint64_t *counts) {
    const uint64_t lim = (uint64_t)n_layer * (uint64_t)n_expert;
    for (size_t i = 0; i < n; i++)
        if (keys[i] < lim) counts[keys[i]]++;
}

double ep_imbalance(const ep_placement *pl, const uint64_t *counts) {
    double sum = 0;
    int layers = 0;
    uint64_t load[EP_MAX_RANKS];
    for (int il = 0; il < pl->n_layer; il++) {
        uint64_t tot = 0, mx = 0;
        memset(load, 0, sizeof load);
        for (int e = 0; e < pl->n_expert; e++) {
            const int32_t o = pl->owner[(size_t)il * pl->n_expert + e];
            if (o < 0) continue;
            load[o] += counts[(size_t)il * pl->n_expert + e];
            tot += counts[(size_t)il * pl->n_expert + e];
        }
        if (tot == 0) continue;
        for (int r = 0; r < pl->n_rank; r++) mx = load[r] > mx ? load[r] : mx;
        sum += (double)mx * pl->n_rank / (double)tot;
        layers++;
    }
    return layers ? sum / layers : 0;
}

void ep_shard(int n_tok, int n_rank, int r, int *t0, int *t1) {
    *t0 = (int)((int64_t)n_tok * r / n_rank);
    *t1 = (int)((int64_t)n_tok * (r + 1) / n_rank);
}

void ep_dispatch_free(ep_dispatch *d) {
    if (!d) return;
    free(d->owner);
    free(d->send_count);
    free(d->send_offset);
    free(d->perm);
    free(d->inv);
    memset(d, 0, sizeof *d);
}

int ep_dispatch_plan(const ep_placement *pl, int il, const int32_t *ids, int n_slot,
                     ep_dispatch *d) {
    memset(d, 0, sizeof *d);
    if (il < 0 || il >= pl->n_layer || n_slot < 0) return -1;
    const int R = pl->n_rank;
    d->n_rank = R;
    d->n_slot = n_slot;
    const size_t ns = n_slot > 0 ? (size_t)n_slot : 1;
    d->owner = malloc(ns * sizeof *d->owner);
    d->send_count = calloc((size_t)R, sizeof *d->send_count);
    d->send_offset = calloc((size_t)R + 1, sizeof *d->send_offset);
    d->perm = malloc(ns * sizeof *d->perm);
    d->inv = malloc(ns * sizeof *d->inv);
    if (!d->owner || !d->send_count || !d->send_offset || !d->perm || !d->inv) {
        ep_dispatch_free(d);
        return -1;
    }
    for (int i = 0; i < n_slot; i++) {
        const int32_t e = ids[i];
        const int32_t o = e >= 0 && e < pl->n_expert ? pl->owner[(size_t)il * pl->n_expert + e] : -1;
        if (o < 0) {
            ep_dispatch_free(d);
            return -1;
        }
        d->owner[i] = o;
        d->send_count[o]++;
    }
    for (int r = 0; r < R; r++) d->send_offset[r + 1] = d->send_offset[r] + d->send_count[r];
    /* a counting sort, stable in slot order: the receiver computes its rows in an order that
     * depends only on the routing, and the combine reads them back through inv */
    int32_t cur[EP_MAX_RANKS];
    for (int r = 0; r < R; r++) cur[r] = d->send_offset[r];
    for (int i = 0; i < n_slot; i++) {
        const int j = cur[d->owner[i]]++;
        d->perm[j] = i;
        d->inv[i] = j;
    }
    return 0;
}
