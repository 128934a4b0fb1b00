/* GPU expert store: keeps a device backend's expert table current (backend.h: experts_*).
 *
 * Resident: the backend holds a device copy of the whole file; every table entry points at the
 * expert's bytes in that copy, set once.
 *
 * Stream: the backend holds a page-locked host copy of the routed experts (it translates file
 * addresses to it); a pool of VRAM slots caches experts. A table entry points at the expert's
 * slot when it is cached, else at its page-locked host bytes. Two ways to use an expert that is not cached:
 *   copy      the layer's routing comes back to the host, missing experts are copied into
 *             slots (asynchronously, ordered before the kernels), then the layer runs; the
 *             router lookahead starts the next layer's copies early (per_layer);
 *   host      (copy, with host_max) up to host_max of a decode layer's misses stay in host
 *             memory and the host's cores compute them (the backend's moe_experts_host, bit for
 *             bit as the device would) while the device computes the rest: the bus then carries
 *             only the lookahead's copies (at most look_max a layer) and the other misses;
 *   zerocopy  decode steps run without the host: kernels read missing experts straight from
 *             pinned memory; after each step the routing is read back (observe) and hot
 *             experts are promoted into slots, displacing colder ones (decayed hotness, the CPU
 *             cache's policy). Prefill chunks use the copy path either way.
 * The slots are filled at load time, so a run starts warm. Which copy a kernel reads never
 * changes the bytes, so every mode and cache size gives the resident result bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/error.h"
#include "runtime/cache_policy.h"
#include "runtime/experts.h"
#include "runtime/experts_gpu.h"

#define SLOT_ALIGN 256ull

typedef struct gslot {
    int layer, expert; /* -1 when empty */
    int pins;
    uint64_t protect_tick;
    bool demand_load;  /* loaded by the current demand (counts as a miss at acquire) */
    /* the policy's rank of the expert held (cache_policy_rank), kept here so that choosing
     * victims reads the slots in order instead of two policy arrays at random (a decode layer
     * chooses twice, over every slot); refreshed whenever the expert is touched */
    double score;
    uint64_t last;
    /* zerocopy promotions: copying while the table still points at the host bytes (set at
     * the next step's commit), and the step whose kernels last read the host bytes */
    bool copying;
    uint64_t host_step;
} gslot;

typedef struct victim { /* an eviction candidate (pick_victims) */
    double score;
    uint64_t last;
    int slot;
} victim;

typedef struct gpu_store {
    expert_store base;
    backend *be;
    const expert_layout *layout;
    const uint8_t *file;
    bool resident;
    uint8_t *pool;          /* device slots */
    uint64_t slot_bytes;
    int n_slots;
    gslot *slots;
    int32_t *where;         /* [layer][expert] -> slot or -1 */
    cache_policy *policy;
    uint64_t demand_tick;
    int promote_max;        /* promotions per layer of an observed step */
    uint8_t *mark;          /* [n_expert] */
    victim *cand;           /* [n_slots] pick_victims' work space */
    int32_t *missing;       /* [n_expert] gpu_prefetch's experts to load */
    uint64_t *host_left;    /* [layer][expert]: the demand tick that left it to the host */
    int look_max;           /* lookahead copies per layer (0: no limit) */
    bool wait_pending;      /* copies marked that kernels do not wait for yet */
    /* the slots as a binary min-heap in victim order (victim_cmp: empty slots first, then by
     * rank, then by index), kept as ranks change, so that choosing m victims pops about m
     * slots instead of visiting all of them (pick_victims); victim_scan: the plain pass over
     * every slot instead (SLUICE_GPU_VICTIM_SCAN=1, a measurement switch; the same victims) */
    int *heap, *hpos;
    bool victim_scan;
    /* zerocopy: promotions copy beside the next step and their entries follow a step later
     * (commit_promotions); promote_wait: the old way, the next step waits for the copies */
    bool promote_wait;
    int *copying;           /* [n_slots] slots with a promotion in flight */
    int n_copying;
    uint64_t obs_step;      /* decode steps observed */
    int obs_layer;          /* the last layer observed (a lower one starts a step) */
} gpu_store;

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t expert_gpu_slot_bytes(const expert_layout *l) {
    uint64_t best = 0;
    for (int i = 0; i < l->n_layer; i++) {
        const expert_layer_layout *L = &l->layers[i];
        if (!L->present) continue;
        uint64_t b = 0;
        for (int p = 0; p < EXPERT_PARTS; p++) b += round_up(L->part[p].bytes, SLOT_ALIGN);
        if (b > best) best = b;
    }
    return best;
}

static const uint8_t *host_part(const gpu_store *s, int layer, int expert, int p) {
    return s->file + expert_part_offset(&s->layout->layers[layer].part[p], expert);
}

static uint8_t *slot_part(const gpu_store *s, int i, int layer, int p) {
    const expert_layer_layout *L = &s->layout->layers[layer];
    uint64_t off = 0;
    for (int q = 0; q < p; q++) off += round_up(L->part[q].bytes, SLOT_ALIGN);
    return s->pool + (uint64_t)i * s->slot_bytes + off;
}

static void point_host(gpu_store *s, int layer, int expert) {
    s->be->ops->experts_set(s->be, layer, expert, host_part(s, layer, expert, EXPERT_GATE),
                            host_part(s, layer, expert, EXPERT_UP),
                            host_part(s, layer, expert, EXPERT_DOWN));
}

static int key_of(const gpu_store *s, int layer, int expert) { return layer * s->base.n_expert + expert; }

/* ---- the victim heap ----------------------------------------------------------------------- */

static victim victim_of(const gpu_store *s, int i) {
    const gslot *sl = &s->slots[i];
    return sl->layer >= 0 ? (victim){sl->score, sl->last, i} : (victim){-INFINITY, 0, i};
}

static int victim_cmp(const void *x, const void *y);

static bool heap_less(const gpu_store *s, int a, int b) {
    const victim va = victim_of(s, a), vb = victim_of(s, b);
    return victim_cmp(&va, &vb) < 0;
}

static void heap_put(gpu_store *s, int at, int slot) {
    s->heap[at] = slot;
    s->hpos[slot] = at;
}

/* Place slot at heap position `at` of a heap of `size`, moving it up or down as its rank needs. */
static void heap_sift(gpu_store *s, int at, int slot, int size) {
    while (at > 0 && heap_less(s, slot, s->heap[(at - 1) / 2])) { /* up */
        heap_put(s, at, s->heap[(at - 1) / 2]);
        at = (at - 1) / 2;
    }
    for (;;) { /* down */
        const int l = 2 * at + 1, r = l + 1;
        int c = at, cs = slot;
        if (l < size && heap_less(s, s->heap[l], cs)) c = l, cs = s->heap[l];
        if (r < size && heap_less(s, s->heap[r], cs)) c = r, cs = s->heap[r];
        if (c == at) break;
        heap_put(s, at, cs);
        at = c;
    }
    heap_put(s, at, slot);
}

/* Slot i's rank changed: move it to its place. */
static void heap_fix(gpu_store *s, int i) {
    if (s->heap) heap_sift(s, s->hpos[i], i, s->n_slots);
}

/* A use of (layer, expert) for the policy, and the rank its slot keeps (if it has one). */
static void touch(gpu_store *s, int layer, int expert) {
    const int key = key_of(s, layer, expert);
    cache_policy_touch(s->policy, key);
    const int i = s->where[key];
    if (i >= 0) {
        cache_policy_rank(s->policy, key, &s->slots[i].score, &s->slots[i].last);
        heap_fix(s, i);
    }
}

static void point_slot(gpu_store *s, int i, int layer, int expert);

/* Copy (layer, expert) into slot i (on the backend's copy stream); with point, point the table
 * at it now (the kernels that read it wait for the copy: kernels_wait), else the entry keeps
 * the host bytes until point_slot. */
static void fill(gpu_store *s, int i, int layer, int expert, bool point) {
    gslot *sl = &s->slots[i];
    sl->layer = layer;
    sl->expert = expert;
    s->where[key_of(s, layer, expert)] = i;
    cache_policy_rank(s->policy, key_of(s, layer, expert), &sl->score, &sl->last);
    heap_fix(s, i);
    const expert_layer_layout *L = &s->layout->layers[layer];
    for (int p = 0; p < EXPERT_PARTS; p++) {
        s->be->ops->copy_async(s->be, slot_part(s, i, layer, p), host_part(s, layer, expert, p),
                               L->part[p].bytes);
        s->base.stats.bytes_read += L->part[p].bytes;
        s->base.stats.reads++;
    }
    if (point) point_slot(s, i, layer, expert);
}

static void point_slot(gpu_store *s, int i, int layer, int expert) {
    s->be->ops->experts_set(s->be, layer, expert, slot_part(s, i, layer, EXPERT_GATE),
                            slot_part(s, i, layer, EXPERT_UP), slot_part(s, i, layer, EXPERT_DOWN));
}

static void load(gpu_store *s, int i, int layer, int expert) { fill(s, i, layer, expert, true); }

/* The backend runs copies beside the kernels (backend.h copy_end / copy_wait). Close a batch
 * of slot copies; with mark, the next kernels_wait makes kernels wait for every copy so far. */
static void copies_end(gpu_store *s, bool mark) {
    if (s->be->ops->copy_end) s->be->ops->copy_end(s->be, mark);
    s->wait_pending |= mark;
}

/* Kernels queued from now on read the slots filled so far (up to the last mark). */
static void kernels_wait(gpu_store *s) {
    if (!s->wait_pending) return;
    if (s->be->ops->copy_wait) s->be->ops->copy_wait(s->be);
    s->wait_pending = false;
}

static void evict(gpu_store *s, int i) {
    gslot *sl = &s->slots[i];
    if (sl->layer < 0) return;
    s->where[key_of(s, sl->layer, sl->expert)] = -1;
    if (!sl->copying) point_host(s, sl->layer, sl->expert); /* copying: it points there still */
    sl->copying = false;
    sl->layer = sl->expert = -1;
    sl->demand_load = false;
    s->base.stats.evictions++;
    heap_fix(s, i);
}

static bool evictable(const gpu_store *s, const gslot *sl) {
    return sl->pins == 0 && sl->protect_tick != s->demand_tick && !sl->copying;
}

/* Point the table at the slots that the last observe's promotions are filling. Kernels queued
 * from now on wait for those copies, which a decode step in between has long finished, so the
 * device does not stall on them (it did when each step waited for its promotions). host_step:
 * the step whose kernels read these experts from host memory still (stats), or 0. */
static void commit_promotions(gpu_store *s, uint64_t host_step) {
    if (s->n_copying == 0) return;
    kernels_wait(s);
    for (int j = 0; j < s->n_copying; j++) {
        const int i = s->copying[j];
        gslot *sl = &s->slots[i];
        if (!sl->copying) continue;
        sl->copying = false;
        sl->host_step = host_step;
        point_slot(s, i, sl->layer, sl->expert);
    }
    s->n_copying = 0;
}

static int victim_cmp(const void *x, const void *y) {
    const victim *a = x, *b = y;
    if (a->score != b->score) return a->score < b->score ? -1 : 1;
    if (a->last != b->last) return a->last < b->last ? -1 : 1;
    return (a->slot > b->slot) - (a->slot < b->slot);
}

/* The heap's side of pick_victims: pop slots in victim order until m are evictable (pinned
 * and protected ones are passed over), then put every popped slot back; the victims' ranks
 * change when they are filled (heap_fix). */
static int pick_victims_heap(gpu_store *s, int m) {
    int popped = 0, n = 0;
    int *out = s->hpos + s->n_slots; /* work space: the popped slots in order */
    while (n < m && popped < s->n_slots) {
        const int top = s->heap[0];
        out[popped++] = top;
        /* the heap shrinks by one: its last slot goes to the root and sinks */
        const int size = s->n_slots - popped;
        if (size > 0) heap_sift(s, 0, s->heap[size], size);
        const gslot *sl = &s->slots[top];
        if (sl->layer < 0 || evictable(s, sl)) s->cand[n++] = victim_of(s, top);
    }
    for (int j = 0; j < popped; j++) /* back in, each from the end */
        heap_sift(s, s->n_slots - popped + j, out[j], s->n_slots - popped + j + 1);
    return n;
}

/* The m evictable slots to fill next, coldest first (empty ones before any). Returns how many
 * were found (< m when too few are evictable); their indices go to the front of s->cand. From
 * the heap, or (victim_scan) in one pass over the slots: find_victim per expert costs a pass
 * each, which for a prefill layer (all 256 experts) was 580K slot visits. */
static int pick_victims(gpu_store *s, int m) {
    if (s->heap) return pick_victims_heap(s, m);
    victim *c = s->cand;
    int n = 0;
    const bool few = m <= 32; /* keep the best m in order as we go; else sort them all */
    for (int i = 0; i < s->n_slots; i++) {
        const gslot *sl = &s->slots[i];
        victim v = {-INFINITY, 0, i};
        if (sl->layer >= 0) {
            if (!evictable(s, sl)) continue;
            v.score = sl->score;
            v.last = sl->last;
        } /* else empty: before every cached expert that has been used */
        if (!few) {
            c[n++] = v;
            continue;
        }
        if (n == m && victim_cmp(&v, &c[m - 1]) >= 0) continue;
        int j = n < m ? n++ : m - 1;
        while (j > 0 && victim_cmp(&v, &c[j - 1]) < 0) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = v;
    }
    if (!few) qsort(c, (size_t)n, sizeof *c, victim_cmp);
    return n < m ? n : m;
}

/* One slot to fill next, or -1 when none is evictable. */
static int find_victim(gpu_store *s) { return pick_victims(s, 1) == 1 ? s->cand[0].slot : -1; }

static int gpu_acquire(expert_store *base, int layer, int expert, expert_views *out) {
    gpu_store *s = (gpu_store *)base;
    const expert_layer_layout *L = &s->layout->layers[layer];
    base->stats.acquires++;
    if (s->resident) {
        base->stats.hits++;
        for (int p = 0; p < EXPERT_PARTS; p++) {
            tview v = expert_part_view(&L->part[p], host_part(s, layer, expert, p));
            if (p == EXPERT_GATE) out->gate = v;
            else if (p == EXPERT_UP) out->up = v;
            else out->down = v;
        }
        return 0;
    }
    commit_promotions(s, 0);
    int i = s->where[key_of(s, layer, expert)];
    if (i < 0 && s->host_left && s->host_left[key_of(s, layer, expert)] == s->demand_tick) {
        /* left in host memory by prefetch_host: the host computes it, nothing to copy or pin */
        base->stats.misses++;
        base->stats.host_computed++;
        kernels_wait(s);
        for (int p = 0; p < EXPERT_PARTS; p++) {
            tview v = expert_part_view(&L->part[p], host_part(s, layer, expert, p));
            if (p == EXPERT_GATE) out->gate = v;
            else if (p == EXPERT_UP) out->up = v;
            else out->down = v;
        }
        touch(s, layer, expert);
        return 0;
    }
    if (i >= 0 && !s->slots[i].demand_load) {
        base->stats.hits++;
    } else {
        base->stats.misses++;
        if (i < 0) {
            i = find_victim(s);
            if (i < 0) {
                sluice_set_error("GPU expert cache of %d slots is too small: all are in use", s->n_slots);
                return -1;
            }
            evict(s, i);
            load(s, i, layer, expert);
            copies_end(s, true);
        }
    }
    /* acquire comes right before the layer's expert kernels: they wait for the demand copies
     * (and earlier lookahead copies), not for a lookahead issued since */
    kernels_wait(s);
    gslot *sl = &s->slots[i];
    sl->demand_load = false;
    sl->pins++;
    touch(s, layer, expert);
    out->gate = expert_part_view(&L->part[EXPERT_GATE], slot_part(s, i, layer, EXPERT_GATE));
    out->up = expert_part_view(&L->part[EXPERT_UP], slot_part(s, i, layer, EXPERT_UP));
    out->down = expert_part_view(&L->part[EXPERT_DOWN], slot_part(s, i, layer, EXPERT_DOWN));
    return 0;
}

static void gpu_release(expert_store *base, int layer, int expert) {
    gpu_store *s = (gpu_store *)base;
    if (s->resident) return;
    int i = s->where[key_of(s, layer, expert)];
    if (i < 0) return;
    if (s->slots[i].pins > 0) s->slots[i].pins--;
    s->slots[i].protect_tick = 0;
}

/* Load the missing ones of experts into slots, leaving up to `leave` of them (the last ones
 * listed) in host memory for the host to compute (demand only). Returns how many were left. */
static int prefetch_common(gpu_store *s, int layer, const int32_t *experts, int n, bool demand, int leave) {
    commit_promotions(s, 0);
    if (demand) s->demand_tick++;
    int m = 0;
    for (int k = 0; k < n; k++) {
        int i = s->where[key_of(s, layer, experts[k])];
        if (i >= 0) {
            if (demand) s->slots[i].protect_tick = s->demand_tick;
            continue;
        }
        if (s->mark[experts[k]]) continue; /* listed twice: load it once */
        s->mark[experts[k]] = 1;
        s->missing[m++] = experts[k];
    }
    for (int k = 0; k < m; k++) s->mark[s->missing[k]] = 0;
    const int left = demand && leave > 0 ? (leave < m ? leave : m) : 0;
    for (int k = m - left; k < m; k++) s->host_left[key_of(s, layer, s->missing[k])] = s->demand_tick;
    m -= left;
    if (!demand && s->look_max > 0 && m > s->look_max) m = s->look_max; /* the bus's share */
    /* victims chosen before any is filled, so one just filled is never the next victim;
     * too few: acquire reports it if the layer cannot fit */
    const int nv = m > 0 ? pick_victims(s, m) : 0;
    for (int k = 0; k < nv; k++) {
        const int i = s->cand[k].slot;
        evict(s, i);
        load(s, i, layer, s->missing[k]);
        s->slots[i].demand_load = demand;
        if (demand) s->slots[i].protect_tick = s->demand_tick;
    }
    /* demand: the layer's kernels (after acquire) read these slots and any an earlier lookahead
     * filled; a lookahead's copies overlap the current layer's kernels */
    copies_end(s, demand);
    return left;
}

static void gpu_prefetch(expert_store *base, int layer, const int32_t *experts, int n, bool demand) {
    gpu_store *s = (gpu_store *)base;
    if (s->resident) return;
    prefetch_common(s, layer, experts, n, demand, 0);
}

static int gpu_prefetch_host(expert_store *base, int layer, const int32_t *experts, int n, int max) {
    gpu_store *s = (gpu_store *)base;
    if (s->resident) return 0;
    return prefetch_common(s, layer, experts, n, true, s->host_left ? max : 0);
}

/* After a decode step without the host (zerocopy): count hits and misses per unique expert and
 * promote missed experts that are hotter than the coldest cached one. A promotion's copy runs
 * beside the next step, whose kernels still read the expert from host memory; the step after
 * reads the slot (commit_promotions, at the first layer observed of a step). */
static int gpu_observe(expert_store *base, int layer, const int32_t *experts, int n) {
    gpu_store *s = (gpu_store *)base;
    if (s->resident) {
        base->stats.acquires += (uint64_t)n;
        base->stats.hits += (uint64_t)n;
        return 0;
    }
    if (layer <= s->obs_layer) { /* a new step */
        s->obs_step++;
        commit_promotions(s, s->obs_step);
    }
    s->obs_layer = layer;
    int promoted = 0;
    for (int k = 0; k < n; k++) {
        const int e = experts[k];
        if (e < 0 || e >= base->n_expert || s->mark[e]) continue;
        s->mark[e] = 1;
        base->stats.acquires++;
        const int key = key_of(s, layer, e);
        touch(s, layer, e);
        const int at = s->where[key];
        if (at >= 0 && s->slots[at].host_step != s->obs_step) {
            base->stats.hits++;
            continue;
        }
        base->stats.misses++;
        if (at >= 0 || promoted >= s->promote_max) continue; /* at: promoted last step */
        const int v = find_victim(s);
        if (v < 0) continue;
        const gslot *vs = &s->slots[v];
        if (vs->layer >= 0 && !cache_policy_prefer_evict(s->policy, key_of(s, vs->layer, vs->expert), key))
            continue; /* the coldest cached expert is still hotter than this one */
        evict(s, v);
        fill(s, v, layer, e, s->promote_wait);
        if (!s->promote_wait) {
            s->slots[v].copying = true;
            s->copying[s->n_copying++] = v;
        }
        promoted++;
    }
    for (int k = 0; k < n; k++)
        if (experts[k] >= 0 && experts[k] < base->n_expert) s->mark[experts[k]] = 0;
    copies_end(s, true); /* commit_promotions (or, promote_wait, the next step) waits for them */
    if (s->promote_wait) kernels_wait(s);
    return 0;
}

static void gpu_free(expert_store *base) {
    gpu_store *s = (gpu_store *)base;
    if (s->pool) {
        s->be->ops->sync(s->be);
        be_mfree(s->be, s->pool);
    }
    cache_policy_free(s->policy);
    free(s->slots);
    free(s->where);
    free(s->mark);
    free(s->missing);
    free(s->host_left);
    free(s->cand);
    free(s->heap);
    free(s->hpos);
    free(s->copying);
    free(s);
}

static const expert_store_ops gpu_ops = {
    .name = "gpu",
    .acquire = gpu_acquire,
    .release = gpu_release,
    .prefetch = gpu_prefetch,
    .free = gpu_free,
    .observe = gpu_observe,
    .prefetch_host = gpu_prefetch_host,
};

expert_store *expert_store_gpu_new(const gpu_store_params *p, char *err, size_t err_len) {
    const expert_layout *l = p->layout;
    gpu_store *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    s->base.ops = &gpu_ops;
    s->base.n_layer = l->n_layer;
    s->base.n_expert = l->n_expert;
    s->base.device_table = true;
    s->be = p->be;
    s->layout = l;
    s->file = p->file;
    s->resident = p->resident;
    s->base.streaming = !p->resident;
    s->base.per_layer = !p->resident && !p->zerocopy;
    /* slots start with protect_tick 0: a tick of 0 would protect every one of them until the
     * first demand prefetch (zero-copy decode has none, so nothing could ever be promoted) */
    s->demand_tick = 1;
    s->promote_max = p->promote_max > 0 ? p->promote_max : 16;
    s->mark = calloc((size_t)l->n_expert, 1);
    s->missing = malloc((size_t)l->n_expert * sizeof *s->missing);
    if (!s->mark || !s->missing || p->be->ops->experts_init(p->be, l) != 0) {
        snprintf(err, err_len, "cannot set up the device expert table");
        gpu_free(&s->base);
        return NULL;
    }
    /* every entry starts at the expert's bytes in the mapped file: the device copy when
     * resident, the pinned host bytes when streaming */
    for (int i = 0; i < l->n_layer; i++)
        if (l->layers[i].present)
            for (int e = 0; e < l->n_expert; e++) point_host(s, i, e);
    if (!p->resident) {
        s->slot_bytes = expert_gpu_slot_bytes(l);
        s->n_slots = s->slot_bytes ? (int)(p->cache_bytes / s->slot_bytes) : 0;
        s->slots = calloc((size_t)(s->n_slots > 0 ? s->n_slots : 1), sizeof *s->slots);
        s->cand = malloc((size_t)(s->n_slots > 0 ? s->n_slots : 1) * sizeof *s->cand);
        s->where = malloc((size_t)l->n_layer * l->n_expert * sizeof *s->where);
        /* the CPU cache's half-life (experts_stream.c): one cache-full collapses to no hits
         * once a token's working set exceeds the cache (cache_policy.h) */
        s->policy = cache_policy_new(CACHE_POLICY_ENGINE, l->n_layer * l->n_expert,
                                     cache_policy_engine_half_life(s->n_slots));
        s->pool = s->n_slots > 0 ? be_alloc(p->be, (size_t)(s->slot_bytes * (uint64_t)s->n_slots)) : NULL;
        if (s->n_slots < 1 || !s->slots || !s->cand || !s->where || !s->policy || !s->pool) {
            snprintf(err, err_len, "cannot allocate a GPU expert cache of %d slots of %llu bytes",
                     s->n_slots, (unsigned long long)s->slot_bytes);
            gpu_free(&s->base);
            return NULL;
        }
        for (size_t i = 0; i < (size_t)l->n_layer * l->n_expert; i++) s->where[i] = -1;
        if (p->host_max > 0 && !p->zerocopy) {
            s->host_left = calloc((size_t)l->n_layer * l->n_expert, sizeof *s->host_left);
            if (!s->host_left) {
                snprintf(err, err_len, "out of memory");
                gpu_free(&s->base);
                return NULL;
            }
            s->base.host_max = p->host_max;
        }
        s->look_max = p->look_max;
        const char *pw = getenv("SLUICE_GPU_PROMOTE_WAIT");
        s->promote_wait = p->promote_wait || (pw && atoi(pw) > 0);
        s->obs_layer = l->n_layer; /* the first layer observed starts a step */
        s->copying = malloc((size_t)s->n_slots * sizeof *s->copying);
        if (!s->copying) {
            snprintf(err, err_len, "out of memory");
            gpu_free(&s->base);
            return NULL;
        }
        for (int i = 0; i < s->n_slots; i++) s->slots[i].layer = s->slots[i].expert = -1;
        const char *scan = getenv("SLUICE_GPU_VICTIM_SCAN");
        s->victim_scan = p->victim_scan || (scan && atoi(scan) > 0);
        if (!s->victim_scan) { /* every slot empty: in index order, a valid heap */
            s->heap = malloc((size_t)s->n_slots * sizeof *s->heap);
            s->hpos = malloc(2 * (size_t)s->n_slots * sizeof *s->hpos);
            if (!s->heap || !s->hpos) {
                snprintf(err, err_len, "out of memory");
                gpu_free(&s->base);
                return NULL;
            }
            for (int i = 0; i < s->n_slots; i++) heap_put(s, i, i);
        }
        /* warm start: fill the slots expert-major across the layers (an equal share each) */
        int i = 0;
        for (int e = 0; e < l->n_expert && i < s->n_slots; e++)
            for (int L = 0; L < l->n_layer && i < s->n_slots; L++)
                if (l->layers[L].present) load(s, i++, L, e);
        s->base.stats.bytes_read = 0;
        s->base.stats.reads = 0;
    }
    p->be->ops->sync(p->be);
    return &s->base;
}

int expert_store_gpu_slots(const expert_store *base) {
    return base->ops == &gpu_ops ? ((const gpu_store *)base)->n_slots : 0;
}
