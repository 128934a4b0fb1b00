/* The GPU expert store (runtime/experts_gpu.c) on the CPU, through a fake device backend: the
 * store normally drives the CUDA backend, which CI lacks, and no other test runs its logic
 * without a GPU. The fake keeps the [layer][expert] table the store sets and models the copy
 * stream (backend.h copy_async): a copy lands only when kernels are made to wait for it
 * (copy_wait after a copy_end mark covering it, or sync), so a table entry a "kernel" reads
 * while a copy into its slot is still in flight is caught. Checked, in copy and zero-copy mode,
 * on long random sequences used as moe.c uses the store (demand prefetch, lookahead, acquire,
 * kernel, release; zero-copy decode steps and observe):
 *   - a demand prefetch caches every needed expert, its copies marked for the layer's kernels;
 *     views and the entries the kernel reads point at the expert's bytes (file or slot), never
 *     into a slot with a copy in flight;
 *   - a lookahead never evicts or overwrites an expert of the demand in progress;
 *   - the whole table stays consistent (one expert per slot, the slot's bytes are the expert's);
 *   - observe promotes at most promote_max experts per call;
 *   - stats: hits + misses = acquires, hits as the table predicts, bytes_read = bytes copied;
 *   - the same sequence gives the same table and stats (also with immediate copies);
 * and with too few free slots prefetch loads what fits and acquire fails, with an error, only
 * when no slot can be found. Host mode (host_max, prefetch_host): a demand leaves at most max
 * of its misses in host memory (entries at the file's bytes, acquired without a copy or a slot,
 * counted as misses and host_computed), loads the rest, and a later demand that does not leave
 * an expert loads it at its acquire. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "formats/quant.h"
#include "runtime/experts_gpu.h"
#include "sluice.h"

#define NL 3
#define NE 16
#define MAX_PENDING 4096

/* ---- the fake device backend: just what the store calls ---- */
typedef struct copy_rec {
    uint8_t *dst;
    const uint8_t *src;
    size_t bytes;
} copy_rec;

typedef struct fake_be {
    backend b; /* first: the store holds a backend * */
    bool defer; /* copies land at copy_wait / sync, as on the copy stream (else at once) */
    const void *table[NL][NE][EXPERT_PARTS];
    uint8_t *pool;
    size_t pool_bytes;
    copy_rec pending[MAX_PENDING]; /* copies in flight, in order */
    int n_pending, n_marked;       /* the first n_marked: up to the last copy_end(mark) */
    const uint8_t *since[MAX_PENDING]; /* the sources of the copies since the last wait, landed or not */
    int n_since;
    uint64_t copies, copy_bytes;
} fake_be;
static fake_be fake; /* one store at a time */

static void *fb_alloc(backend *b, size_t bytes) {
    fake_be *f = (fake_be *)b;
    CHECK(f->pool == NULL); /* the store allocates its slot pool, nothing else */
    f->pool = calloc(1, bytes);
    f->pool_bytes = bytes;
    return f->pool;
}
static void fb_mfree(backend *b, void *p) {
    fake_be *f = (fake_be *)b;
    CHECK(p == f->pool && f->n_pending == 0);
    free(p);
    f->pool = NULL;
}
static int fb_experts_init(backend *b, const expert_layout *l) {
    return l->n_layer == NL && l->n_expert == NE ? 0 : -1;
}
static void fb_experts_set(backend *b, int L, int e, const void *g, const void *u, const void *d) {
    fake_be *f = (fake_be *)b;
    CHECKF(L >= 0 && L < NL && e >= 0 && e < NE, "experts_set(%d, %d)", L, e);
    f->table[L][e][EXPERT_GATE] = g;
    f->table[L][e][EXPERT_UP] = u;
    f->table[L][e][EXPERT_DOWN] = d;
}
static void land(fake_be *f, int n) { /* the first n copies in flight are done */
    for (int i = 0; i < n; i++) memcpy(f->pending[i].dst, f->pending[i].src, f->pending[i].bytes);
    memmove(f->pending, f->pending + n, (size_t)(f->n_pending - n) * sizeof *f->pending);
    f->n_pending -= n;
    f->n_marked = 0;
}
static void fb_copy_async(backend *b, void *dst, const void *src, size_t bytes) {
    fake_be *f = (fake_be *)b;
    uint8_t *d = dst;
    CHECKF(f->pool && d >= f->pool && d + bytes <= f->pool + f->pool_bytes, "copy off the pool");
    CHECK(f->n_pending < MAX_PENDING);
    f->copies++;
    f->copy_bytes += bytes;
    if (f->n_since < MAX_PENDING) f->since[f->n_since++] = src;
    if (f->defer && f->n_pending < MAX_PENDING)
        f->pending[f->n_pending++] = (copy_rec){d, src, bytes};
    else
        memcpy(dst, src, bytes);
}
static void fb_copy_end(backend *b, bool mark) {
    fake_be *f = (fake_be *)b;
    if (mark) f->n_marked = f->n_pending;
}
static void fb_copy_wait(backend *b) {
    land((fake_be *)b, ((fake_be *)b)->n_marked);
    ((fake_be *)b)->n_since = 0;
}
static void fb_sync(backend *b) {
    land((fake_be *)b, ((fake_be *)b)->n_pending);
    ((fake_be *)b)->n_since = 0;
}

static const backend_ops fake_ops = {
    .name = "fake-device", .alloc = fb_alloc, .mfree = fb_mfree,
    .experts_init = fb_experts_init, .experts_set = fb_experts_set,
    .copy_async = fb_copy_async, .copy_end = fb_copy_end, .copy_wait = fb_copy_wait,
    .sync = fb_sync};

/* ---- a 3-layer x 16-expert layout over a host "file" of distinct bytes per expert ---- */
static expert_layer_layout layers[NL];
static expert_layout layout = {.n_layer = NL, .n_expert = NE, .layers = layers};
static uint8_t *file;

static void make_file(void) {
    static const int ne0[EXPERT_PARTS] = {24, 24, 40}, ne1[EXPERT_PARTS] = {3, 5, 2};
    uint64_t off = 64;
    for (int L = 0; L < NL; L++) {
        layers[L].present = true;
        for (int p = 0; p < EXPERT_PARTS; p++) { /* sizes by part and layer, not 256-aligned */
            expert_part *P = &layers[L].part[p];
            P->type = GGML_TYPE_F32;
            P->ne0 = ne0[p] + 4 * L;
            P->ne1 = ne1[p] + L;
            P->bytes = (uint64_t)P->ne0 * P->ne1 * 4;
            P->stride = P->bytes + 32; /* a gap between experts */
            P->offset = off;
            off += NE * P->stride;
        }
    }
    file = calloc(1, off);
    for (int L = 0; L < NL; L++)
        for (int e = 0; e < NE; e++)
            for (int p = 0; p < EXPERT_PARTS; p++) {
                const expert_part *P = &layers[L].part[p];
                uint8_t *d = file + expert_part_offset(P, e);
                for (uint64_t j = 0; j < P->bytes; j++) {
                    uint32_t h = (uint32_t)(((L * NE + e) * 4 + p) * 100003 + j) * 2654435761u;
                    d[j] = (uint8_t)(h >> 24 ^ h >> 11);
                }
            }
}

static const uint8_t *host_bytes(int L, int e, int p) {
    return file + expert_part_offset(&layers[L].part[p], e);
}
/* The slot ptr lies in, or -1. */
static int slot_at(const fake_be *f, const void *ptr) {
    const uintptr_t q = (uintptr_t)ptr, b = (uintptr_t)f->pool;
    if (!f->pool || q < b || q >= b + f->pool_bytes) return -1;
    return (int)((q - b) / expert_gpu_slot_bytes(&layout));
}
/* A copy in flight, from the from-th on, writes into [p, p + n). */
static bool pending_in(const fake_be *f, const uint8_t *p, size_t n, int from) {
    if (slot_at(f, p) < 0) return false;
    for (int i = from; i < f->n_pending; i++)
        if (f->pending[i].dst < p + n && p < f->pending[i].dst + f->pending[i].bytes) return true;
    return false;
}

/* A copy since the last wait read src (an expert's first part in the file), landed or not. */
static bool copying_from(const fake_be *f, const uint8_t *src) {
    for (int i = 0; i < f->n_since; i++)
        if (f->since[i] == src) return true;
    return false;
}

/* A copy into slot i after the last mark: the next copy_wait does not cover it. */
static bool unmarked(const fake_be *f, int i) {
    const uint64_t sb = expert_gpu_slot_bytes(&layout);
    return i >= 0 && pending_in(f, f->pool + (uint64_t)i * sb, sb, f->n_marked);
}

/* What a kernel reading (L, e)'s table entry gets: its slot, -1 for the file's bytes, or -2
 * (reported) when the entry is wrong: not the file's bytes nor the three parts of one slot,
 * bytes that differ from the expert's, or a copy into them still pending. */
static int entry_slot(const fake_be *f, int L, int e) {
    const uint64_t sb = expert_gpu_slot_bytes(&layout);
    uint64_t in_slot = 0; /* the parts' places in a slot: 256-byte aligned (experts_gpu.h) */
    int slot = -1;
    const char *why = NULL;
    for (int p = 0; p < EXPERT_PARTS && !why; p++) {
        const uint8_t *ptr = f->table[L][e][p], *host = host_bytes(L, e, p);
        const uint64_t n = layers[L].part[p].bytes;
        const int s = slot_at(f, ptr);
        if (ptr == host) {
            if (p > 0 && slot >= 0) why = "parts in different places";
        } else if (s < 0) {
            why = "neither the file nor a slot";
        } else if ((p > 0 && s != slot) || ptr != f->pool + s * sb + in_slot || in_slot + n > sb) {
            why = "misplaced in a slot";
        } else if (pending_in(f, ptr, n, 0)) {
            why = "its slot is still being copied";
        } else if (memcmp(ptr, host, n) != 0) {
            why = "its slot holds other bytes";
        }
        slot = ptr == host ? -1 : s;
        in_slot += (n + 255) / 256 * 256;
    }
    if (why) fprintf(stderr, "table entry (%d,%d): %s\n", L, e, why);
    return why ? -2 : slot;
}

/* The whole table: every entry right and no slot holding two experts. Cached entries or -1. */
static int check_table(const fake_be *f, int n_slots, int code[NL][NE]) {
    int owner[64], cached = 0;
    for (int i = 0; i < 64; i++) owner[i] = -1;
    for (int L = 0; L < NL; L++)
        for (int e = 0; e < NE; e++) {
            const int s = code[L][e] = entry_slot(f, L, e);
            if (s == -2) return -1;
            if (s < 0) continue;
            CHECKF(s < n_slots && owner[s] < 0, "slot %d: (%d,%d) and key %d", s, L, e, owner[s]);
            if (s < n_slots) owner[s] = L * NE + e;
            cached++;
        }
    return cached;
}

static uint64_t rng;
static uint32_t rnd(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}
/* skewed routing: a hot band of 6 experts that drifts with the step, else any expert */
static int pick(int step, int L) {
    return rnd() % 4 == 0 ? (int)(rnd() % NE) : (step / 16 + 5 * L + (int)(rnd() % 6)) % NE;
}
/* n distinct experts (n = NE: all of them, a prefill-sized layer) */
static int pick_set(int step, int L, int n, int32_t *out) {
    bool used[NE] = {false};
    int m = 0;
    for (int t = 0; m < n && t < 64; t++) {
        const int e = n == NE ? t % NE : pick(step, L);
        if (!used[e]) {
            used[e] = true;
            out[m++] = e;
        }
    }
    return m;
}

/* choose victims by the pass over every slot instead of the heap (the same victims) */
static bool victim_scan;
/* zerocopy: each step waits for the last one's promotions (else they land a step later) */
static bool promote_wait;

static expert_store *new_store_host(bool zerocopy, bool defer, int n_slots, int promote_max, int host_max);
static expert_store *new_store(bool zerocopy, bool defer, int n_slots, int promote_max) {
    return new_store_host(zerocopy, defer, n_slots, promote_max, 0);
}

static expert_store *new_store_host(bool zerocopy, bool defer, int n_slots, int promote_max, int host_max) {
    fake_be *f = &fake;
    memset(f, 0, sizeof *f);
    f->b.ops = &fake_ops;
    f->defer = defer;
    const uint64_t sb = expert_gpu_slot_bytes(&layout);
    gpu_store_params p = {.be = &f->b, .layout = &layout, .file = file, .resident = false,
                          .cache_bytes = sb * (uint64_t)n_slots + sb / 2, .zerocopy = zerocopy,
                          .promote_max = promote_max, .host_max = host_max, .victim_scan = victim_scan,
                          .promote_wait = promote_wait};
    char err[256] = "";
    expert_store *s = expert_store_gpu_new(&p, err, sizeof err);
    CHECKF(s != NULL, "%s", err);
    if (!s) return NULL;
    CHECK(expert_store_gpu_slots(s) == n_slots);
    CHECK(s->streaming && s->device_table && s->per_layer == !zerocopy);
    CHECK(f->n_pending == 0); /* warm start: the slots are filled and synced */
    int code[NL][NE];
    CHECK(check_table(f, n_slots, code) == n_slots);
    return s;
}

/* The lookahead's prefetch of layer L + 1 during layer L, whose needed experts are in slot[]. */
static void lookahead(expert_store *s, fake_be *f, int L, const int32_t *need, int n, const int *slot,
                      const int32_t *pred, int n_pred) {
    if (n_pred <= 0) return;
    const uint64_t c0 = f->copies;
    expert_prefetch(s, L + 1, pred, n_pred, false);
    /* its copies overlap this layer's kernels: not marked (and the fake holds them) */
    if (f->defer && f->copies > c0) CHECK(f->n_pending > f->n_marked);
    for (int k = 0; k < n; k++) /* nor do they touch the demand in progress */
        CHECKF(slot_at(f, f->table[L][need[k]][EXPERT_GATE]) == slot[k] && !unmarked(f, slot[k]),
               "lookahead of layer %d evicted (%d,%d)", L + 1, L, need[k]);
}

/* One layer as moe.c runs it with the routing on the host: demand prefetch, the lookahead's
 * prefetch of the next layer, acquire every needed expert, the kernel, release; or (look_after:
 * a streamed device decode layer whose demand copied nothing) the lookahead after the kernel's
 * launch, while the layer's experts are still pinned, so its copies may overlap the kernel. */
static void run_layer(expert_store *s, fake_be *f, int L, const int32_t *need, int n,
                      const int32_t *pred, int n_pred, bool look_after, uint64_t *acquires) {
    int slot[NE], hits = 0;
    for (int k = 0; k < n; k++) /* cached, maybe still being copied (a lookahead, or a zero-copy
                                 * promotion whose entry still points at the file) */
        hits += slot_at(f, f->table[L][need[k]][EXPERT_GATE]) >= 0 ||
                copying_from(f, host_bytes(L, need[k], EXPERT_GATE));
    const uint64_t hits0 = s->stats.hits;
    expert_prefetch(s, L, need, n, true);
    /* all fit (20 slots, <= 16 needed, none pinned), their copies marked: the layer's kernels
     * will wait for them (unmarked: copies after the mark into the slot) */
    for (int k = 0; k < n; k++) {
        slot[k] = slot_at(f, f->table[L][need[k]][EXPERT_GATE]);
        CHECKF(slot[k] >= 0, "layer %d expert %d not cached by its demand prefetch", L, need[k]);
        CHECK(!unmarked(f, slot[k]));
    }
    if (!look_after) lookahead(s, f, L, need, n, slot, pred, n_pred);
    for (int k = 0; k < n; k++) {
        expert_views v;
        CHECKF(expert_acquire(s, L, need[k], &v) == 0, "%s", sluice_last_error());
        (*acquires)++;
        const tview *part[EXPERT_PARTS] = {&v.gate, &v.up, &v.down};
        for (int p = 0; p < EXPERT_PARTS; p++) {
            const expert_part *P = &layers[L].part[p];
            CHECK(part[p]->data == f->table[L][need[k]][p]);
            CHECK(part[p]->ne[0] == P->ne0 && part[p]->ne[1] == P->ne1);
            CHECK(part[p]->mat_bytes == P->bytes && part[p]->type == P->type);
            CHECK(!pending_in(f, part[p]->data, P->bytes, 0) &&
                  memcmp(part[p]->data, host_bytes(L, need[k], p), P->bytes) == 0);
        }
    }
    for (int k = 0; k < n; k++) /* the kernel reads the table */
        CHECKF(entry_slot(f, L, need[k]) == slot[k], "kernel of layer %d, expert %d", L, need[k]);
    if (look_after) {
        lookahead(s, f, L, need, n, slot, pred, n_pred);
        for (int k = 0; k < n; k++) /* the kernel, still running, reads the same slots */
            CHECKF(entry_slot(f, L, need[k]) == slot[k], "kernel of layer %d, expert %d", L, need[k]);
    }
    for (int k = 0; k < n; k++) expert_release(s, L, need[k]);
    CHECKF(s->stats.hits - hits0 == (uint64_t)hits, "layer %d: %llu hits, the table had %d", L,
           (unsigned long long)(s->stats.hits - hits0), hits);
}

typedef struct run_result {
    sluice_expert_stats stats;
    int code[NL][NE];
    uint64_t trace; /* hash of the table after every step */
    uint64_t promoted;
} run_result;

#define PROMOTE_MAX 2

/* A random run of `steps` forward passes. Copy mode: every layer through run_layer. Zero-copy:
 * every fourth pass is a prefill chunk (run_layer), the others decode 2 tokens x 4 experts per
 * layer straight through the table, then observe each layer. */
static void run_stream(bool zerocopy, bool defer, int steps, run_result *r) {
    fake_be *f = &fake;
    memset(r, 0, sizeof *r);
    rng = 2024;
    const int n_slots = NE + 4;
    expert_store *s = new_store(zerocopy, defer, n_slots, PROMOTE_MAX);
    if (!s) return;
    const uint64_t copied0 = f->copy_bytes, copies0 = f->copies;
    uint64_t acquires = 0;
    r->trace = 1469598103934665603ull;
    for (int step = 0; step < steps; step++) {
        if (!zerocopy || step % 4 == 0) {
            int32_t need[NL][NE], pred[NE];
            int n[NL];
            for (int L = 0; L < NL; L++)
                n[L] = pick_set(step, L, rnd() % 5 == 0 ? NE : 1 + (int)(rnd() % 8), need[L]);
            for (int L = 0; L < NL; L++) {
                int n_pred = 0;
                if (L + 1 < NL && rnd() % 4 != 0) { /* the lookahead: every expert, or */
                    if (rnd() % 3 == 0) {
                        n_pred = pick_set(step, L + 1, NE, pred);
                    } else { /* the next layer's experts with one guessed wrong */
                        n_pred = n[L + 1];
                        memcpy(pred, need[L + 1], (size_t)n_pred * sizeof *pred);
                        const int32_t x = (int32_t)pick(step + 7, L + 1);
                        bool known = false;
                        for (int k = 0; k < n_pred; k++) known |= pred[k] == x;
                        if (!known) pred[0] = x;
                    }
                }
                run_layer(s, f, L, need[L], n[L], pred, n_pred, (step + L) % 2 == 1, &acquires);
            }
        } else {
            int32_t ids[NL][8];
            for (int L = 0; L < NL; L++)
                for (int t = 0; t < 8; t++) {
                    ids[L][t] = (int32_t)pick(step, L);
                    CHECKF(entry_slot(f, L, ids[L][t]) >= -1, "decode kernel, layer %d", L);
                }
            for (int L = 0; L < NL; L++) {
                const uint64_t c0 = f->copies, a0 = s->stats.acquires;
                bool seen[NE] = {false};
                int uniq = 0;
                for (int t = 0; t < 8; t++) {
                    uniq += !seen[ids[L][t]];
                    seen[ids[L][t]] = true;
                }
                CHECK(s->ops->observe(s, L, ids[L], 8) == 0);
                CHECKF(f->copies - c0 <= 3 * PROMOTE_MAX && (f->copies - c0) % 3 == 0,
                       "observe copied %llu parts", (unsigned long long)(f->copies - c0));
                /* promote_wait: the next step's kernels read the promoted slots; else the copies
                 * run beside the next step (whose kernels must not see them: entry_slot) */
                if (promote_wait) CHECK(f->n_pending == 0);
                CHECK(s->stats.acquires - a0 == (uint64_t)uniq);
                acquires += (uint64_t)uniq;
                r->promoted += (f->copies - c0) / 3;
            }
        }
        if (!zerocopy || promote_wait) CHECK(f->n_pending == 0);
        CHECK(check_table(f, n_slots, r->code) >= 0);
        for (int L = 0; L < NL; L++)
            for (int e = 0; e < NE; e++)
                r->trace = (r->trace ^ (uint64_t)(r->code[L][e] + 2)) * 1099511628211ull;
    }
    r->stats = s->stats;
    CHECK(s->stats.hits + s->stats.misses == s->stats.acquires);
    CHECK(s->stats.acquires == acquires);
    CHECK(s->stats.bytes_read == f->copy_bytes - copied0 && s->stats.reads == f->copies - copies0);
    CHECK(s->stats.hits > 0 && s->stats.misses > 0 && s->stats.evictions > 0);
    expert_store_free(s);
    CHECK(f->pool == NULL);
}

static void test_stream(bool zerocopy) {
    run_result a, b, c, d;
    run_stream(zerocopy, true, 400, &a);
    run_stream(zerocopy, true, 400, &b);
    run_stream(zerocopy, false, 400, &c); /* copies done at once: the store cannot tell */
    victim_scan = true; /* victims by a pass over the slots: every choice the heap's */
    run_stream(zerocopy, true, 400, &d);
    victim_scan = false;
    CHECKF(memcmp(&a, &b, sizeof a) == 0, "zerocopy=%d: two runs differ", zerocopy);
    CHECKF(memcmp(&a, &c, sizeof a) == 0, "zerocopy=%d: deferred/immediate differ", zerocopy);
    CHECKF(memcmp(&a, &d, sizeof a) == 0, "zerocopy=%d: heap/scan victims differ", zerocopy);
    if (zerocopy) CHECK(a.promoted > 0);
    printf("%-9s%s acquires %llu hits %llu misses %llu evictions %llu promoted %llu\n",
           zerocopy ? "zero-copy" : "copy", zerocopy && promote_wait ? " (wait)" : "",
           (unsigned long long)a.stats.acquires,
           (unsigned long long)a.stats.hits, (unsigned long long)a.stats.misses,
           (unsigned long long)a.stats.evictions, (unsigned long long)a.promoted);
}

/* Too few slots: 6 (the warm start holds experts 0 and 1 of every layer). */
static void test_too_small(void) {
    fake_be *f = &fake;
    expert_store *s = new_store(false, true, 6, 0);
    if (!s) return;
    expert_views v;
    CHECK(expert_acquire(s, 0, 0, &v) == 0 && expert_acquire(s, 0, 1, &v) == 0); /* 2 pinned */
    const int32_t need[6] = {2, 3, 4, 5, 6, 7};
    const uint64_t c0 = f->copies;
    expert_prefetch(s, 1, need, 6, true); /* 6 missing, 4 slots evictable: loads 4 */
    CHECKF(f->copies - c0 == 4 * 3, "copied %llu parts", (unsigned long long)(f->copies - c0));
    int loaded = 0, code[NL][NE];
    for (int k = 0; k < 6; k++) loaded += slot_at(f, f->table[1][need[k]][EXPERT_GATE]) >= 0;
    CHECK(loaded == 4);
    const int late = slot_at(f, f->table[1][6][EXPERT_GATE]) < 0 ? 6 : 7; /* did not fit */
    /* every slot pinned or protected by the demand: acquire fails cleanly */
    CHECK(expert_acquire(s, 1, late, &v) == -1);
    CHECKF(strstr(sluice_last_error(), "too small") != NULL, "error: %s", sluice_last_error());
    CHECK(f->table[1][late][EXPERT_GATE] == host_bytes(1, late, EXPERT_GATE));
    for (int k = 0; k < 6; k++)
        if (need[k] != late && slot_at(f, f->table[1][need[k]][EXPERT_GATE]) >= 0)
            CHECK(expert_acquire(s, 1, need[k], &v) == 0);
    CHECK(check_table(f, 6, code) == 6); /* the acquires waited for the copies */
    expert_release(s, 0, 0); /* a slot frees up: now the late expert fits */
    CHECK(expert_acquire(s, 1, late, &v) == 0);
    CHECK(v.gate.data == f->table[1][late][EXPERT_GATE] && entry_slot(f, 1, late) >= 0);
    CHECK(memcmp(v.down.data, host_bytes(1, late, EXPERT_DOWN), layers[1].part[2].bytes) == 0);
    const int32_t other = (int32_t)(13 - late); /* 6 <-> 7: the other one, then none left */
    expert_release(s, 0, 1);
    CHECK(expert_acquire(s, 1, other, &v) == 0 && entry_slot(f, 1, other) >= 0);
    CHECK(expert_acquire(s, 2, 9, &v) == -1); /* all six pinned by layer 1 */
    for (int k = 0; k < 6; k++) expert_release(s, 1, need[k]);
    CHECK(expert_acquire(s, 2, 9, &v) == 0 && entry_slot(f, 2, 9) >= 0);
    expert_release(s, 2, 9);
    CHECK(check_table(f, 6, code) == 6);
    CHECK(s->stats.hits + s->stats.misses == s->stats.acquires);
    CHECK(s->stats.acquires == 11 && s->stats.hits == 2);
    const int32_t guess[2] = {12, 13};
    expert_prefetch(s, 2, guess, 2, false);
    CHECK(f->n_pending == 6); /* a lookahead's copies in flight: free waits for them (mfree) */
    expert_store_free(s);
}

/* observe promotes at most promote_max experts per call, coldest slots first. Each call is a
 * step of its own. promote_wait: the next step reads the promoted slots; else the step after
 * it (the one between reads host memory while the copies run: a miss still). */
static void test_observe(void) {
    fake_be *f = &fake;
    expert_store *s = new_store(true, true, NE + 4, PROMOTE_MAX);
    if (!s) return;
    /* no demand prefetch first (zero-copy decode has none): a fresh store's slots must be
     * evictable all the same (they once counted as protected until the first one) */
    const int32_t ids[8] = {10, 11, 12, 13, 14, 15, 10, 11}; /* layer 2: none cached */
    int code[NL][NE];
    const int lag = promote_wait ? 0 : 1; /* steps before a promoted slot is read */
    for (int call = 1; call <= 4; call++) {
        const uint64_t c0 = f->copies, h0 = s->stats.hits;
        CHECK(s->ops->observe(s, 2, ids, 8) == 0);
        const int promoted = (int)((f->copies - c0) / 3), want = call <= 3 ? PROMOTE_MAX : 0;
        CHECKF(promoted == want, "call %d promoted %d", call, promoted);
        CHECKF(promote_wait || f->n_pending == 3 * promoted, "call %d: %d copies in flight", call, f->n_pending);
        CHECK(check_table(f, NE + 4, code) >= 0);
        int cached = 0; /* in the table: what the next step's kernels read from slots */
        for (int e = 10; e < 16; e++) cached += code[2][e] >= 0;
        const int ready = call - lag < 3 ? call - lag : 3; /* promotions the table shows */
        CHECKF(cached == ready * PROMOTE_MAX, "call %d: %d cached", call, cached);
        /* this step's hits: what the table showed while it ran (two of its 8 ids repeat) */
        const int shown = call - 1 - lag < 0 ? 0 : call - 1 - lag < 3 ? call - 1 - lag : 3;
        CHECKF(s->stats.hits - h0 == (uint64_t)(shown * PROMOTE_MAX), "call %d: %llu hits", call,
               (unsigned long long)(s->stats.hits - h0));
    }
    CHECK(s->stats.acquires == 24 && s->stats.hits + s->stats.misses == 24);
    expert_store_free(s);
}

/* A prefetch list with repeats (moe.c removes them, the store must not rely on it): each
 * expert is loaded once, into one slot, and nothing overruns the store's work space. */
static void test_duplicates(void) {
    fake_be *f = &fake;
    expert_store *s = new_store(false, false, NE + 4, PROMOTE_MAX);
    if (!s) return;
    int32_t ids[3 * NE];
    for (int i = 0; i < 3 * NE; i++) ids[i] = (int32_t)(i % 2 ? 3 : 5 + i % 3);
    int code[NL][NE];
    CHECK(check_table(f, NE + 4, code) >= 0);
    int missing = 0; /* of the distinct experts 3, 5, 6, 7, those the warm start left out */
    for (int e = 3; e <= 7; e++) missing += e != 4 && code[2][e] < 0;
    const uint64_t c0 = f->copies;
    expert_prefetch(s, 2, ids, 3 * NE, true);
    CHECK(check_table(f, NE + 4, code) >= 0);
    int cached = 0;
    for (int e = 3; e <= 7; e++) cached += e != 4 && code[2][e] >= 0;
    CHECKF(missing > 0 && f->copies - c0 == 3 * (uint64_t)missing && cached == 4,
           "%d missing, %llu parts copied, %d of 4 cached", missing,
           (unsigned long long)(f->copies - c0), cached);
    expert_store_free(s);
}

/* Host mode: prefetch_host leaves up to max misses of a demand to the host. */
static void test_host_split(void) {
    fake_be *f = &fake;
    expert_store *s = new_store_host(false, true, NE + 4, 0, 3);
    if (!s) return;
    CHECK(s->host_max == 3 && s->ops->prefetch_host != NULL);
    int code[NL][NE];
    /* layer 1: the warm start cached experts 0..7 of every layer (20 slots over 3 layers) */
    CHECK(check_table(f, NE + 4, code) == NE + 4);
    const int32_t need[6] = {1, 9, 10, 11, 12, 13};
    int missing = 0;
    for (int k = 0; k < 6; k++) missing += code[1][need[k]] < 0;
    const uint64_t c0 = f->copies, m0 = s->stats.misses, h0 = s->stats.host_computed;
    const int left = s->ops->prefetch_host(s, 1, need, 6, 3);
    CHECKF(left == (missing < 3 ? missing : 3), "left %d of %d missing", left, missing);
    CHECK(f->copies - c0 == 3 * (uint64_t)(missing - left)); /* the others copied */
    int at_host = 0;
    for (int k = 0; k < 6; k++) {
        expert_views v;
        const bool host = entry_slot(f, 1, need[k]) == -1;
        at_host += host;
        CHECKF(expert_acquire(s, 1, need[k], &v) == 0, "%s", sluice_last_error());
        /* a left expert's views and entry are the file's bytes; the others a slot's */
        CHECK((v.gate.data == host_bytes(1, need[k], EXPERT_GATE)) == host);
        CHECK(memcmp(v.down.data, host_bytes(1, need[k], EXPERT_DOWN), layers[1].part[2].bytes) == 0);
        CHECK(entry_slot(f, 1, need[k]) == (host ? -1 : slot_at(f, v.gate.data)));
    }
    CHECKF(at_host == left, "%d at the host, %d left", at_host, left);
    CHECK(s->stats.host_computed - h0 == (uint64_t)left && s->stats.misses - m0 == (uint64_t)missing);
    CHECK(f->copies - c0 == 3 * (uint64_t)(missing - left)); /* acquire copied nothing more */
    for (int k = 0; k < 6; k++) expert_release(s, 1, need[k]);
    /* a later demand that leaves nothing: the expert left before is loaded at its acquire */
    int32_t was_left = -1;
    for (int k = 0; k < 6 && was_left < 0; k++)
        if (entry_slot(f, 1, need[k]) == -1) was_left = need[k];
    CHECK(was_left >= 0);
    const int32_t other = 2;
    expert_prefetch(s, 1, &other, 1, true);
    expert_views v;
    CHECK(expert_acquire(s, 1, was_left, &v) == 0 && entry_slot(f, 1, was_left) >= 0);
    CHECK(s->stats.host_computed - h0 == (uint64_t)left); /* not host-computed this time */
    expert_release(s, 1, was_left);
    /* max 0 is a plain demand prefetch */
    const int32_t more[2] = {14, 15};
    CHECK(s->ops->prefetch_host(s, 2, more, 2, 0) == 0);
    for (int k = 0; k < 2; k++) { /* acquire waits for their copies */
        CHECK(expert_acquire(s, 2, more[k], &v) == 0 && entry_slot(f, 2, more[k]) >= 0);
        expert_release(s, 2, more[k]);
    }
    CHECK(check_table(f, NE + 4, code) >= 0);
    CHECK(s->stats.hits + s->stats.misses == s->stats.acquires);
    printf("host split: %d of %d missing left to the host\n", left, missing);
    expert_store_free(s);
    /* a store without host_max leaves nothing */
    s = new_store(false, true, NE + 4, 0);
    if (!s) return;
    CHECK(s->host_max == 0 && s->ops->prefetch_host(s, 1, need, 6, 3) == 0);
    expert_store_free(s);
}

int main(void) {
    make_file();
    test_stream(false);
    test_stream(true);
    promote_wait = true;
    test_stream(true);
    test_observe();
    promote_wait = false;
    test_observe();
    test_too_small();
    test_duplicates();
    test_host_split();
    free(file);
    CHECK_DONE();
}
