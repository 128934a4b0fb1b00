/* Streaming expert store: experts are read from the model file into a fixed pool of slots.
 *
 * Slot states: EMPTY, LOADING (reads in flight), READY. A slot is pinned while acquired, and
 * protected while its expert is in the demand set of the layer being computed; neither kind is
 * evicted. Victims are chosen among the rest by decayed hotness, then recency (the engine's
 * policy, shared with the cache simulator: runtime/cache_policy.h). In a sweep (a batch whose
 * layers each need most of their experts: a prefill chunk), every cached expert is needed again
 * when its layer next comes, so the victims are those of the layer that comes last (the one
 * just computed, then the one before it, ...), the policy's order only within a layer: where the
 * policy would evict the layer about to be read, a chunked prompt larger than the cache would
 * read every expert in every chunk (cache_sweep_distance).
 *
 * All bookkeeping happens on the compute thread; the I/O engine moves bytes asynchronously, so
 * reads for later experts proceed while earlier ones are multiplied. Which slot holds an expert
 * never changes its bytes, so results are identical to the resident store's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <zlib.h>

#include "engine/error.h"
#include "runtime/cache_policy.h"
#include "runtime/experts.h"
#include "runtime/io.h"

enum slot_state { SLOT_EMPTY = 0, SLOT_LOADING, SLOT_READY };

typedef struct slot {
    int layer, expert;     /* owner, -1 when empty */
    int state;
    int pins;
    uint64_t protect_tick; /* protected while equal to the store's demand tick */
    uint64_t hint_tick;    /* listed by the prefetch under way (its victims spare it) */
    bool speculative;      /* loaded by a hint, not yet used */
    bool demand_loaded;    /* loaded by a demand prefetch: its first acquire counts as a miss */
    io_req req[EXPERT_PARTS];
    int n_req;
    const uint8_t *part_data[EXPERT_PARTS];
} slot;

typedef struct victim { /* an eviction candidate: where it goes in the order (victim_before) */
    int slot, d;          /* d: cache_sweep_distance in a sweep, else 0 */
    bool empty;
    double score;         /* cache_policy_rank */
    uint64_t last;
} victim;

typedef struct stream_store {
    expert_store base;
    const expert_layout *layout;
    io_engine *io;
    bool verify;
    uint8_t *pool;
    uint64_t slot_bytes;
    int n_slots;
    slot *slots;
    int32_t *where;       /* [layer][expert] -> slot or -1 */
    int *crc_index;       /* [layer] -> index of the layer's first record CRC, or -1 */
    cache_policy *policy; /* eviction order */
    victim *cand;         /* [n_slots] pick_victims' work space */
    uint64_t demand_tick, hint_tick;
    int demand_layer;     /* the layer of the last demand prefetch, -1 before the first */
    bool sweep;           /* that layer's first demand was a sweep's (cache_sweep_batch) */
} stream_store;

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t expert_slot_bytes(const expert_layout *l) {
    uint64_t best = 0;
    for (int i = 0; i < l->n_layer; i++) {
        const expert_layer_layout *L = &l->layers[i];
        if (!L->present) continue;
        uint64_t b = 0;
        if (l->packed) b = round_up(L->record_stride, IO_ALIGN);
        else
            for (int p = 0; p < EXPERT_PARTS; p++)
                b += round_up(L->part[p].bytes, IO_ALIGN) + IO_ALIGN;
        if (b > best) best = b;
    }
    return best;
}

static slot *slot_of(stream_store *s, int layer, int expert) {
    int32_t i = s->where[(size_t)layer * s->base.n_expert + expert];
    return i < 0 ? NULL : &s->slots[i];
}

int expert_io_depth(int n_expert) {
    const int layers = 2 * EXPERT_PARTS * n_expert;
    return layers < 64 ? 64 : layers > 1024 ? 1024 : layers;
}

/* Start the reads that fill slot i with (layer, expert). */
static int start_load(stream_store *s, int i, int layer, int expert) {
    slot *sl = &s->slots[i];
    const expert_layer_layout *L = &s->layout->layers[layer];
    uint8_t *dst = s->pool + (uint64_t)i * s->slot_bytes;
    sl->layer = layer;
    sl->expert = expert;
    sl->state = SLOT_LOADING;
    s->where[(size_t)layer * s->base.n_expert + expert] = i;
    if (s->layout->packed) {
        /* one record: gate|up|down, already aligned */
        uint64_t off = L->record_offset + (uint64_t)expert * L->record_stride;
        sl->req[0] = (io_req){.offset = off, .len = L->record_stride, .need = L->record_bytes,
                              .buf = dst};
        sl->n_req = 1;
        for (int p = 0; p < EXPERT_PARTS; p++)
            sl->part_data[p] = dst + (L->part[p].offset - L->record_offset);
    } else {
        /* three slices of the stacked tensors, each widened to aligned bounds */
        sl->n_req = EXPERT_PARTS;
        uint64_t cursor = 0;
        for (int p = 0; p < EXPERT_PARTS; p++) {
            uint64_t off = expert_part_offset(&L->part[p], expert);
            uint64_t start = off / IO_ALIGN * IO_ALIGN, head = off - start;
            uint64_t len = round_up(head + L->part[p].bytes, IO_ALIGN);
            sl->req[p] = (io_req){.offset = start, .len = len, .need = head + L->part[p].bytes,
                                  .buf = dst + cursor};
            sl->part_data[p] = dst + cursor + head;
            cursor += len;
        }
    }
    for (int r = 0; r < sl->n_req; r++) {
        if (io_submit(s->io, &sl->req[r]) != 0) {
            sluice_set_error("expert read (layer %d, expert %d): %s", layer, expert,
                             strerror(errno));
            return -1;
        }
        s->base.stats.reads++;
    }
    return 0;
}

/* Wait for a loading slot; verify it. 0, or -1 with the error set (the slot is emptied). */
static int finish_load(stream_store *s, slot *sl) {
    if (sl->state != SLOT_LOADING) return 0;
    double before = 0;
    io_stats st;
    io_get_stats(s->io, &st);
    before = st.wait_s;
    int err = 0;
    for (int r = 0; r < sl->n_req; r++) {
        int e = io_wait(s->io, &sl->req[r]);
        if (e && !err) err = e;
        s->base.stats.bytes_read += sl->req[r].done;
    }
    io_get_stats(s->io, &st);
    s->base.stats.io_wait_s += st.wait_s - before;
    int layer = sl->layer, expert = sl->expert;
    if (!err && s->verify && s->crc_index[layer] >= 0) {
        const expert_layer_layout *L = &s->layout->layers[layer];
        uint32_t c = (uint32_t)crc32_z(crc32(0L, Z_NULL, 0), sl->req[0].buf, L->record_bytes);
        if (c != s->layout->record_crc[s->crc_index[layer] + expert]) {
            sluice_set_error("expert record (layer %d, expert %d) fails its checksum: the store "
                             "file is corrupted (run sluice verify)", layer, expert);
            err = -1;
        }
    }
    if (err) {
        if (err > 0)
            sluice_set_error("reading expert (layer %d, expert %d) failed: %s", layer, expert,
                             strerror(err));
        s->where[(size_t)layer * s->base.n_expert + expert] = -1;
        sl->layer = sl->expert = -1;
        sl->state = SLOT_EMPTY;
        return -1;
    }
    sl->state = SLOT_READY;
    return 0;
}

/* Whether every read of a loading slot has landed (reaped by io_poll). */
static bool reads_landed(const slot *sl) {
    for (int r = 0; r < sl->n_req; r++)
        if (__atomic_load_n(&sl->req[r].state, __ATOMIC_ACQUIRE) != 2) return false;
    return true;
}

static int key_of(const stream_store *s, const slot *sl) {
    return sl->layer * s->base.n_expert + sl->expert;
}

static bool evictable(const stream_store *s, const slot *sl) {
    return sl->state != SLOT_LOADING && sl->pins == 0 && sl->protect_tick != s->demand_tick &&
           sl->hint_tick != s->hint_tick;
}

/* The eviction order: empty slots, then in a sweep the slot whose layer comes last (largest
 * cache_sweep_distance), then the policy's order (cache_policy_prefer_evict: lower score, then
 * used longer ago), then the lower slot index. */
static bool victim_before(const victim *a, const victim *b) {
    if (a->empty != b->empty) return a->empty;
    if (!a->empty) {
        if (a->d != b->d) return a->d > b->d;
        if (a->score != b->score) return a->score < b->score;
        if (a->last != b->last) return a->last < b->last;
    }
    return a->slot < b->slot;
}

/* v into the root of the heap h[0..n) (the worst candidate at the root), sinking it below the
 * children that come after it. */
static void victim_sink(victim *h, int n, victim v) {
    int j = 0;
    for (;;) {
        int c = 2 * j + 1;
        if (c >= n) break;
        if (c + 1 < n && victim_before(&h[c], &h[c + 1])) c++;
        if (!victim_before(&v, &h[c])) break;
        h[j] = h[c];
        j = c;
    }
    h[j] = v;
}

/* The m slots to (re)use first, best first, into s->cand; returns how many (fewer when fewer are
 * evictable). Loading into a victim changes no other slot's place in the order, so these are the
 * slots that m choices of the best one at a time would take, found in one pass over the slots
 * (with a bounded heap: the worst of the m kept at its root) instead of m passes: a 512-token
 * chunk loads ~250 experts a layer, and m scans of 6,000 slots (12 GB of 35B-A3B experts) held
 * the compute threads for 0.6 s a chunk. */
static int pick_victims(stream_store *s, int m) {
    victim *h = s->cand;
    int n = 0;
    if (m <= 0) return 0;
    io_poll(s->io);
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        /* A slot stays LOADING until an acquire finishes it; one a lookahead filled for an expert
         * the layer did not use never is, so such slots piled up, never victims: at the floor of
         * qwen4exp-8l (81 slots) the lookahead found room for 1,368 of the 3,955 experts it
         * predicted in 64 tokens, and the rest were read at their layer's demand instead of
         * beside the compute (bench/results/2026-12-03-h200-cpu-stream.md). Finished here once
         * its reads have landed (a failed one empties the slot; a demand re-reads it). */
        if (sl->state == SLOT_LOADING && sl->pins == 0 && reads_landed(sl)) (void)finish_load(s, sl);
        victim v = {.slot = i, .empty = sl->state == SLOT_EMPTY};
        if (!v.empty) {
            if (!evictable(s, sl)) continue;
            v.d = s->sweep ? cache_sweep_distance(sl->layer, s->demand_layer, s->base.n_layer) : 0;
            cache_policy_rank(s->policy, key_of(s, sl), &v.score, &v.last);
        }
        if (n < m) { /* sift up: parents come after (worse) */
            int j = n++;
            while (j > 0 && victim_before(&h[(j - 1) / 2], &v)) {
                h[j] = h[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            h[j] = v;
        } else if (victim_before(&v, &h[0])) { /* replaces the worst kept */
            victim_sink(h, n, v);
        }
    }
    /* heap -> best first: pop the worst to the end */
    for (int k = n - 1; k > 0; k--) {
        const victim worst = h[0];
        victim_sink(h, k, h[k]);
        h[k] = worst;
    }
    return n;
}

static void evict(stream_store *s, int i) {
    slot *sl = &s->slots[i];
    if (sl->state == SLOT_EMPTY) return;
    s->where[(size_t)sl->layer * s->base.n_expert + sl->expert] = -1;
    sl->layer = sl->expert = -1;
    sl->state = SLOT_EMPTY;
    sl->speculative = false;
    sl->demand_loaded = false;
    s->base.stats.evictions++;
}

/* Evict slot v and start loading (layer, expert) into it: v, or -2 when the read fails. */
static int load_into(stream_store *s, int v, int layer, int expert) {
    evict(s, v);
    return start_load(s, v, layer, expert) == 0 ? v : -2;
}

/* Make room and start loading; -1 when no slot can be freed right now. */
static int load_into_victim(stream_store *s, int layer, int expert) {
    return pick_victims(s, 1) == 1 ? load_into(s, s->cand[0].slot, layer, expert) : -1;
}

static int stream_acquire(expert_store *base, int layer, int expert, expert_views *out) {
    stream_store *s = (stream_store *)base;
    base->stats.acquires++;
    slot *sl = slot_of(s, layer, expert);
    if (sl) {
        /* read on demand for this layer just before: a miss whose read overlapped others */
        if (sl->demand_loaded) base->stats.misses++;
        else base->stats.hits++;
        sl->demand_loaded = false;
        if (finish_load(s, sl) != 0) return -1;
    } else {
        base->stats.misses++;
        int v;
        /* every slot busy: wait for in-flight reads until one becomes evictable */
        while ((v = load_into_victim(s, layer, expert)) == -1) {
            bool waited = false;
            for (int i = 0; i < s->n_slots && !waited; i++)
                if (s->slots[i].state == SLOT_LOADING) {
                    if (finish_load(s, &s->slots[i]) != 0) return -1;
                    waited = true;
                }
            if (!waited) {
                sluice_set_error("expert cache of %d slots is too small: all are in use",
                                 s->n_slots);
                return -1;
            }
        }
        if (v < 0) return -1;
        sl = &s->slots[v];
        if (finish_load(s, sl) != 0) return -1;
    }
    sl->pins++;
    sl->speculative = false;
    cache_policy_touch(s->policy, key_of(s, sl));
    const expert_layer_layout *L = &s->layout->layers[layer];
    out->gate = expert_part_view(&L->part[EXPERT_GATE], sl->part_data[EXPERT_GATE]);
    out->up = expert_part_view(&L->part[EXPERT_UP], sl->part_data[EXPERT_UP]);
    out->down = expert_part_view(&L->part[EXPERT_DOWN], sl->part_data[EXPERT_DOWN]);
    return 0;
}

static void stream_release(expert_store *base, int layer, int expert) {
    stream_store *s = (stream_store *)base;
    slot *sl = slot_of(s, layer, expert);
    if (!sl) return;
    if (sl->pins > 0) sl->pins--;
    sl->protect_tick = 0; /* done with it for this layer: it may make room for the rest */
}

static void stream_prefetch(expert_store *base, int layer, const int32_t *experts, int n,
                            bool demand) {
    stream_store *s = (stream_store *)base;
    if (demand) {
        s->demand_tick++;
        /* a layer's first demand decides (the demands after each set of a batch list only the
         * experts still to run) */
        if (layer != s->demand_layer) s->sweep = cache_sweep_batch(n, s->base.n_expert);
        s->demand_layer = layer;
    }
    /* the listed experts already here are spared by this call's victims (a demand's stay
     * protected until released); then the victims for the rest, in one pass (pick_victims) */
    s->hint_tick++;
    int missing = 0;
    for (int k = 0; k < n; k++) {
        slot *sl = slot_of(s, layer, experts[k]);
        if (!sl) {
            missing++;
            continue;
        }
        sl->hint_tick = s->hint_tick;
        if (demand) sl->protect_tick = s->demand_tick;
    }
    const int nv = pick_victims(s, missing);
    for (int k = 0, used = 0; k < n && used < nv; k++) {
        if (slot_of(s, layer, experts[k])) continue; /* here already, or listed twice */
        const int v = load_into(s, s->cand[used++].slot, layer, experts[k]);
        if (v < 0) break; /* the read failed: acquire reports it */
        s->slots[v].speculative = !demand;
        s->slots[v].demand_loaded = demand;
        s->slots[v].hint_tick = s->hint_tick;
        if (demand) s->slots[v].protect_tick = s->demand_tick;
    }
    s->hint_tick++; /* the spared slots are ordinary candidates again */
    io_poll(s->io);
}

static bool stream_ready(expert_store *base, int layer, int expert) {
    stream_store *s = (stream_store *)base;
    const slot *sl = slot_of(s, layer, expert);
    if (!sl) return false;
    if (sl->state == SLOT_READY) return true;
    io_poll(s->io); /* reap what has landed */
    return reads_landed(sl); /* its acquire finishes the load (and verifies it) without waiting */
}

static void stream_free(expert_store *base) {
    stream_store *s = (stream_store *)base;
    if (s->io) io_close(s->io); /* waits for reads still in flight into the pool */
    if (s->pool) munmap(s->pool, s->slot_bytes * (uint64_t)s->n_slots);
    cache_policy_free(s->policy);
    free(s->slots);
    free(s->cand);
    free(s->where);
    free(s->crc_index);
    free(s);
}

static const expert_store_ops stream_ops = {
    .name = "stream",
    .acquire = stream_acquire,
    .release = stream_release,
    .prefetch = stream_prefetch,
    .free = stream_free,
    .ready = stream_ready,
};

expert_store *expert_store_stream_new(const stream_params *p, char *err, size_t err_len) {
    const expert_layout *l = p->layout;
    stream_store *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    s->base.ops = &stream_ops;
    s->base.n_layer = l->n_layer;
    s->base.n_expert = l->n_expert;
    s->base.streaming = true;
    s->layout = l;
    s->demand_layer = -1;
    s->hint_tick = 1; /* above every slot's 0 */
    s->verify = p->verify_reads && l->packed;
    s->slot_bytes = expert_slot_bytes(l);
    s->n_slots = s->slot_bytes ? (int)(p->cache_bytes / s->slot_bytes) : 0;
    if (s->n_slots < 1) {
        snprintf(err, err_len, "expert cache of %llu bytes holds no expert (one needs %llu)",
                 (unsigned long long)p->cache_bytes, (unsigned long long)s->slot_bytes);
        free(s);
        return NULL;
    }
    size_t pool_bytes = s->slot_bytes * (uint64_t)s->n_slots;
    s->pool = mmap(NULL, pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    /* in 2 MiB pages where the kernel gives them (a hint; 4 KiB pages otherwise): at the cache's
     * floor, where every step reads ~112 MB into the pool, decode ran 5% faster on average and
     * used 8% less user time (7 alternating pairs, bench/results/2026-12-02-stream-dense-
     * populate.md) */
    if (s->pool != MAP_FAILED) (void)madvise(s->pool, pool_bytes, MADV_HUGEPAGE);
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    s->cand = malloc((size_t)s->n_slots * sizeof *s->cand);
    s->where = malloc((size_t)l->n_layer * l->n_expert * sizeof *s->where);
    s->crc_index = malloc((size_t)l->n_layer * sizeof *s->crc_index);
    s->policy = cache_policy_new(CACHE_POLICY_ENGINE, l->n_layer * l->n_expert,
                                 cache_policy_engine_half_life(s->n_slots));
    if (s->pool == MAP_FAILED || !s->slots || !s->cand || !s->where || !s->crc_index || !s->policy) {
        if (s->pool == MAP_FAILED) s->pool = NULL;
        snprintf(err, err_len, "cannot allocate an expert cache of %zu bytes", pool_bytes);
        stream_free(&s->base);
        return NULL;
    }
    for (size_t i = 0; i < (size_t)l->n_layer * l->n_expert; i++) s->where[i] = -1;
    for (int i = 0; i < s->n_slots; i++) s->slots[i].layer = s->slots[i].expert = -1;
    for (int i = 0, k = 0; i < l->n_layer; i++) {
        s->crc_index[i] = l->layers[i].present ? k : -1;
        if (l->layers[i].present) k += l->n_expert;
    }
    char ioerr[256];
    s->io = io_open(p->path, (io_mode)p->io_mode, p->io_depth > 0 ? p->io_depth : expert_io_depth(l->n_expert), ioerr,
                    sizeof ioerr);
    if (!s->io) {
        snprintf(err, err_len, "%s", ioerr);
        stream_free(&s->base);
        return NULL;
    }
    return &s->base;
}

int expert_store_stream_slots(const expert_store *base);

int expert_store_stream_slots(const expert_store *base) {
    return base->streaming ? ((const stream_store *)base)->n_slots : 0;
}
