/* Expert-cache simulation (see cachesim.h).
 *
 * The online policies keep their resident experts in an indexed binary heap ordered by
 * cache_policy_prefer_evict, so the next victim is at the root. That order is the engine's: for
 * keys not being used it never changes (every score moves only when its own key is used, and
 * then only up), so a heap stays valid with one sift per use, and the simulator evicts exactly
 * the expert the engine's linear scan would pick. Belady's optimum uses a lazy max-heap of next
 * uses. */
#include "tools/cachesim.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cache_policy.h"

static const char *const names[SIM_COUNT] = {
    "lru", "lfu", "engine", "lru-layer", "engine-layer", "pinned-hot", "lru-warm", "engine-warm",
    "belady", "belady-warm"};

const char *sim_policy_name(sim_policy p) { return p < SIM_COUNT ? names[p] : "?"; }

int sim_policy_is_cold(sim_policy p) {
    return !(p == SIM_LRU_WARM || p == SIM_ENGINE_WARM || p == SIM_BELADY_WARM);
}

int sim_keys_from_trace(const trace *t, int seq, sim_phase phase, sim_keys *out) {
    memset(out, 0, sizeof *out);
    out->n_layer = (int)t->n_layer;
    out->n_expert = (int)t->n_expert;
    out->keys = malloc((t->n_records * t->k + 1) * sizeof *out->keys);
    out->sweep = malloc(t->n_records * t->k + 1);
    uint8_t *used = calloc(t->n_expert, 1);
    if (!out->keys || !out->sweep || !used) {
        free(used);
        sim_keys_free(out);
        return -1;
    }
    for (size_t i = 0; i < t->n_records;) {
        size_t j = i + 1; /* the run: same sequence and layer, consecutive positions */
        while (j < t->n_records && t->seq[j] == t->seq[i] && t->layer[j] == t->layer[i] &&
               t->pos[j] == t->pos[j - 1] + 1)
            j++;
        const bool decode = j - i == 1;
        if ((seq < 0 || t->seq[i] == seq) &&
            (phase == SIM_PHASE_ALL || (phase == SIM_PHASE_DECODE) == decode)) {
            const size_t first = out->n;
            for (size_t r = i; r < j; r++)
                for (uint32_t s = 0; s < t->k; s++) {
                    const uint16_t e = t->experts[r * t->k + s];
                    if (!used[e]) {
                        used[e] = 1;
                        out->keys[out->n++] = t->layer[i] * t->n_expert + e;
                    }
                }
            /* as the engine decides it: by the pass's distinct experts in this layer */
            const uint8_t sweep = cache_sweep_batch((int)(out->n - first), (int)t->n_expert);
            for (size_t q = first; q < out->n; q++) {
                used[out->keys[q] % t->n_expert] = 0;
                out->sweep[q] = sweep;
            }
        }
        i = j;
    }
    free(used);
    return 0;
}

void sim_keys_free(sim_keys *k) {
    free(k->keys);
    free(k->sweep);
    memset(k, 0, sizeof *k);
}

static size_t n_keys_of(const sim_keys *k) { return (size_t)k->n_layer * (size_t)k->n_expert; }

size_t sim_distinct(const sim_keys *k) {
    uint8_t *seen = calloc(n_keys_of(k), 1);
    if (!seen) return 0;
    size_t d = 0;
    for (size_t i = 0; i < k->n; i++) {
        d += !seen[k->keys[i]];
        seen[k->keys[i]] = 1;
    }
    free(seen);
    return d;
}

/* ---- online policies: an indexed heap ordered by the engine's comparator ------------------- */

typedef struct pool {
    cache_policy *pol;
    int cap, n;
    int *heap;
    int32_t *pos; /* shared by all pools of one simulation: a key lives in one pool */
} pool;

static bool less(const pool *p, int i, int j) {
    return cache_policy_prefer_evict(p->pol, p->heap[i], p->heap[j]);
}

static void swap_at(pool *p, int i, int j) {
    int a = p->heap[i], b = p->heap[j];
    p->heap[i] = b;
    p->heap[j] = a;
    p->pos[b] = i;
    p->pos[a] = j;
}

static void sift_up(pool *p, int i) {
    while (i > 0 && less(p, i, (i - 1) / 2)) {
        swap_at(p, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void sift_down(pool *p, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < p->n && less(p, l, m)) m = l;
        if (r < p->n && less(p, r, m)) m = r;
        if (m == i) return;
        swap_at(p, i, m);
        i = m;
    }
}

/* Remove the key at heap position i. */
static void pool_remove_at(pool *p, int i) {
    p->pos[p->heap[i]] = -1;
    p->n--;
    if (i == p->n) return;
    const int moved = p->heap[p->n];
    p->heap[i] = moved;
    p->pos[moved] = i;
    sift_up(p, i);
    sift_down(p, p->pos[moved]);
}

/* The victim in a sweep (the engine's pick_victims): the key whose layer comes last after
 * layer_now, the policy's order among equals; a scan, as the order moves with the layer. */
static int sweep_victim(const pool *p, int layer_now, int n_layer, int n_expert) {
    int best = 0, best_d = -1;
    for (int i = 0; i < p->n; i++) {
        const int d = cache_sweep_distance(p->heap[i] / n_expert, layer_now, n_layer);
        if (d > best_d || (d == best_d && less(p, i, best))) {
            best = i;
            best_d = d;
        }
    }
    return best;
}

/* One use of key; true on a hit. sweep: the use is a sweep's (engine policies only), whose
 * victim goes by layer (sweep_victim). */
static bool pool_access(pool *p, int key, bool sweep, int n_layer, int n_expert) {
    if (p->pos[key] >= 0) {
        int i = p->pos[key];
        cache_policy_touch(p->pol, key);
        sift_up(p, i);
        sift_down(p, p->pos[key]);
        return true;
    }
    if (p->cap <= 0) {
        cache_policy_touch(p->pol, key); /* the engine still counts the use */
        return false;
    }
    if (p->n == p->cap) pool_remove_at(p, sweep ? sweep_victim(p, key / n_expert, n_layer, n_expert) : 0);
    cache_policy_touch(p->pol, key);
    p->heap[p->n] = key;
    p->pos[key] = p->n;
    p->n++;
    sift_up(p, p->n - 1);
    return false;
}

static bool pool_init(pool *p, cache_policy_kind kind, int cap, int n_keys, int32_t *pos) {
    memset(p, 0, sizeof *p);
    p->cap = cap;
    p->pos = pos;
    /* the same half-life as the engine's expert cache */
    p->pol = cache_policy_new(kind, n_keys, cache_policy_engine_half_life(cap));
    p->heap = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *p->heap);
    return p->pol && p->heap;
}

static void pool_fini(pool *p) {
    cache_policy_free(p->pol);
    free(p->heap);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* keys ordered by use count, most used first (ties: lower key first) */
static int *by_popularity(const sim_keys *k) {
    const size_t nk = n_keys_of(k);
    uint64_t *cnt = calloc(nk, sizeof *cnt);
    uint64_t *pair = malloc(nk * sizeof *pair);
    int *order = malloc(nk * sizeof *order);
    if (!cnt || !pair || !order) {
        free(cnt);
        free(pair);
        free(order);
        return NULL;
    }
    for (size_t i = 0; i < k->n; i++) cnt[k->keys[i]]++;
    /* count descending in the high 32 bits, key ascending in the low 32 */
    for (size_t i = 0; i < nk; i++) {
        uint64_t c = cnt[i] > UINT32_MAX ? UINT32_MAX : cnt[i];
        pair[i] = ((uint64_t)(UINT32_MAX - c) << 32) | (uint64_t)i;
    }
    qsort(pair, nk, sizeof *pair, cmp_u64);
    for (size_t i = 0; i < nk; i++) order[i] = (int)(pair[i] & 0xFFFFFFFFu);
    free(pair);
    free(cnt);
    return order;
}

static uint64_t sim_online(sim_policy sp, const sim_keys *k, int cap, double pin_frac) {
    const size_t nk = n_keys_of(k);
    const bool per_layer = sp == SIM_LRU_LAYER || sp == SIM_ENGINE_LAYER;
    const bool warm = sp == SIM_LRU_WARM || sp == SIM_ENGINE_WARM;
    /* the engine's expert cache takes a sweep's victims by layer (cache_sweep_distance) */
    const bool sweeps = sp == SIM_ENGINE || sp == SIM_ENGINE_WARM;
    cache_policy_kind kind = CACHE_POLICY_LRU;
    if (sp == SIM_LFU) kind = CACHE_POLICY_LFU;
    if (sp == SIM_ENGINE || sp == SIM_ENGINE_LAYER || sp == SIM_ENGINE_WARM) kind = CACHE_POLICY_ENGINE;
    const int n_pools = per_layer ? k->n_layer : 1;
    int32_t *pos = malloc(nk * sizeof *pos);
    pool *pools = calloc((size_t)n_pools, sizeof *pools);
    uint8_t *pinned = NULL, *loaded = NULL;
    int *order = NULL;
    uint64_t hits = 0;
    bool ok = pos && pools;
    if (ok) for (size_t i = 0; i < nk; i++) pos[i] = -1;
    int n_pin = 0;
    if (ok && (sp == SIM_PINNED || warm)) {
        order = by_popularity(k);
        ok = order != NULL;
    }
    if (ok && sp == SIM_PINNED) {
        n_pin = (int)(pin_frac * cap);
        if (n_pin > cap) n_pin = cap;
        if ((size_t)n_pin > nk) n_pin = (int)nk;
        pinned = calloc(nk, 1);
        loaded = calloc(nk, 1);
        ok = pinned && loaded;
        for (int i = 0; ok && i < n_pin; i++) pinned[order[i]] = 1;
    }
    for (int i = 0; ok && i < n_pools; i++)
        ok = pool_init(&pools[i], kind, per_layer ? cap / k->n_layer : cap - n_pin, (int)nk, pos);
    if (ok && warm) {
        /* preload the cap most used experts, least used first, so the hottest is also the
         * most recent */
        int fill = (size_t)cap < nk ? cap : (int)nk;
        for (int i = fill - 1; i >= 0; i--) pool_access(&pools[0], order[i], false, k->n_layer, k->n_expert);
    }
    if (ok) {
        for (size_t i = 0; i < k->n; i++) {
            const uint32_t key = k->keys[i];
            if (pinned && pinned[key]) {
                hits += loaded[key];
                loaded[key] = 1;
                continue;
            }
            pool *p = &pools[per_layer ? key / (uint32_t)k->n_expert : 0];
            hits += pool_access(p, (int)key, sweeps && k->sweep && k->sweep[i], k->n_layer, k->n_expert);
        }
    }
    for (int i = 0; pools && i < n_pools; i++) pool_fini(&pools[i]);
    free(pools);
    free(pos);
    free(pinned);
    free(loaded);
    free(order);
    return ok ? hits : 0;
}

/* ---- Belady ------------------------------------------------------------------------------- */

typedef struct nu {
    uint64_t next;
    uint32_t key;
} nu;

static void nu_push(nu *h, size_t *n, nu v) {
    size_t i = (*n)++;
    h[i] = v;
    while (i > 0 && h[(i - 1) / 2].next < h[i].next) {
        nu t = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static nu nu_pop(nu *h, size_t *n) {
    nu top = h[0];
    h[0] = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && h[l].next > h[m].next) m = l;
        if (r < *n && h[r].next > h[m].next) m = r;
        if (m == i) break;
        nu t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
    return top;
}

static uint64_t sim_belady(const sim_keys *k, int cap) {
    const size_t nk = n_keys_of(k), n = k->n;
    uint64_t *next = malloc((n + 1) * sizeof *next), *cur = malloc(nk * sizeof *cur);
    uint8_t *res = calloc(nk, 1);
    nu *heap = malloc((n + 1) * sizeof *heap);
    uint64_t hits = 0;
    if (!next || !cur || !res || !heap || cap <= 0) goto done;
    for (size_t i = 0; i < nk; i++) cur[i] = UINT64_MAX;
    for (size_t i = n; i-- > 0;) { /* next use of the same expert, UINT64_MAX: never */
        next[i] = cur[k->keys[i]];
        cur[k->keys[i]] = i;
    }
    size_t hn = 0, resident = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t key = k->keys[i];
        if (res[key]) {
            hits++;
        } else {
            if (resident == (size_t)cap) {
                for (;;) { /* skip stale entries */
                    nu v = nu_pop(heap, &hn);
                    if (res[v.key] && cur[v.key] == v.next) {
                        res[v.key] = 0;
                        break;
                    }
                }
                resident--;
            }
            res[key] = 1;
            resident++;
        }
        cur[key] = next[i];
        nu_push(heap, &hn, (nu){next[i], key});
    }
done:
    free(next);
    free(cur);
    free(res);
    free(heap);
    return hits;
}

uint64_t sim_hits(sim_policy p, const sim_keys *k, int capacity, double pin_frac) {
    if (p == SIM_BELADY) return sim_belady(k, capacity);
    if (p == SIM_BELADY_WARM) {
        /* a free initial fill saves exactly the first min(cap, distinct) misses of the cold
         * optimum, and no initial content can do better (docs/cachesim.md) */
        size_t d = sim_distinct(k);
        return sim_belady(k, capacity) + ((size_t)capacity < d ? (size_t)capacity : d);
    }
    return sim_online(p, k, capacity, pin_frac);
}

/* ---- all policies x sizes on a few threads ------------------------------------------------ */

typedef struct job_ctx {
    const sim_keys *k;
    const int *caps;
    int n_cap;
    double pin_frac;
    uint64_t *hits;
    atomic_int next;
} job_ctx;

static void *job_main(void *arg) {
    job_ctx *c = arg;
    for (;;) {
        int j = atomic_fetch_add(&c->next, 1);
        if (j >= SIM_COUNT * c->n_cap) return NULL;
        c->hits[j] = sim_hits((sim_policy)(j / c->n_cap), c->k, c->caps[j % c->n_cap], c->pin_frac);
    }
}

void sim_run_all(const sim_keys *k, const int *caps, int n_cap, double pin_frac, int n_threads,
                 uint64_t *hits) {
    job_ctx c = {.k = k, .caps = caps, .n_cap = n_cap, .pin_frac = pin_frac, .hits = hits};
    atomic_init(&c.next, 0);
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 64) n_threads = 64;
    pthread_t th[64];
    int started = 0;
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&th[started], NULL, job_main, &c) == 0) started++;
    job_main(&c);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
}

/* ---- SVG ----------------------------------------------------------------------------------- */

int sim_write_svg(const char *path, const sim_keys *k, const int *caps, int n_cap,
                  const uint64_t *hits, const char *title) {
    FILE *fp = fopen(path, "w");
    if (!fp) return -1;
    static const char *const colors[SIM_COUNT] = {"#1f77b4", "#ff7f0e", "#d62728", "#9467bd",
                                                  "#8c564b", "#e377c2", "#17becf", "#bcbd22",
                                                  "#000000", "#7f7f7f"};
    const double W = 860, H = 520, L = 70, R = 200, T = 50, B = 60;
    const double pw = W - L - R, ph = H - T - B, all = (double)n_keys_of(k);
    double xmax = 0;
    for (int c = 0; c < n_cap; c++) xmax = caps[c] / all * 100 > xmax ? caps[c] / all * 100 : xmax;
    xmax = xmax <= 0 ? 100 : ceil(xmax / 10.0) * 10.0; /* round ticks */
    fprintf(fp, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(fp, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(fp, "<text x=\"%.0f\" y=\"24\" font-size=\"15\">", L);
    for (const char *s = title; *s; s++) { /* escape the few XML specials */
        if (*s == '<') fputs("&lt;", fp);
        else if (*s == '>') fputs("&gt;", fp);
        else if (*s == '&') fputs("&amp;", fp);
        else fputc(*s, fp);
    }
    fprintf(fp, "</text>\n");
    for (int i = 0; i <= 10; i++) { /* grid and ticks */
        double y = T + ph - ph * i / 10.0, x = L + pw * i / 10.0;
        fprintf(fp, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, y, L + pw, y);
        fprintf(fp, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%d%%</text>\n", L - 6, y + 4, i * 10);
        fprintf(fp, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", x, T, x, T + ph);
        fprintf(fp, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f%%</text>\n", x, T + ph + 16, xmax * i / 10.0);
    }
    fprintf(fp, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#333\"/>\n", L, T, pw, ph);
    fprintf(fp, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">cache size (%% of all %d x %d experts)</text>\n",
            L + pw / 2, H - 18, k->n_layer, k->n_expert);
    fprintf(fp, "<text transform=\"translate(18,%.1f) rotate(-90)\" text-anchor=\"middle\">hit rate</text>\n", T + ph / 2);
    for (int p = 0; p < SIM_COUNT; p++) {
        fprintf(fp, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", colors[p],
                sim_policy_is_cold((sim_policy)p) ? "" : " stroke-dasharray=\"6,3\"");
        for (int c = 0; c < n_cap; c++) {
            double x = L + pw * (caps[c] / all * 100) / xmax;
            double y = T + ph - ph * (k->n ? (double)hits[p * n_cap + c] / (double)k->n : 0);
            fprintf(fp, "%.1f,%.1f ", x, y);
        }
        fprintf(fp, "\"/>\n");
        double ly = T + 10 + 20 * p;
        fprintf(fp, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"3\"%s/>\n",
                L + pw + 15, ly, L + pw + 45, ly, colors[p],
                sim_policy_is_cold((sim_policy)p) ? "" : " stroke-dasharray=\"6,3\"");
        fprintf(fp, "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", L + pw + 52, ly + 4, names[p]);
    }
    fprintf(fp, "</svg>\n");
    return fclose(fp) == 0 ? 0 : -1;
}
