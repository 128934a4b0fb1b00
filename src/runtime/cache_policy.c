/* Eviction scores (see cache_policy.h). The ENGINE score is kept in log2 form shifted by the
 * clock, s = log2(h) + t / half_life, so comparing two keys at the current time needs no
 * decay computation: the common term -now / half_life cancels. */
#include "runtime/cache_policy.h"

#include <math.h>
#include <stdlib.h>

struct cache_policy {
    cache_policy_kind kind;
    int n;
    double half_life;
    uint64_t clock;
    double *score;
    uint64_t *last;
};

cache_policy *cache_policy_new(cache_policy_kind kind, int n_keys, double half_life) {
    cache_policy *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->kind = kind;
    p->n = n_keys;
    p->half_life = half_life > 0 ? half_life : 64.0;
    p->score = calloc((size_t)n_keys, sizeof *p->score);
    p->last = calloc((size_t)n_keys, sizeof *p->last);
    if (!p->score || !p->last) {
        cache_policy_free(p);
        return NULL;
    }
    if (kind == CACHE_POLICY_ENGINE)
        for (int i = 0; i < n_keys; i++) p->score[i] = -INFINITY; /* never used: h = 0 */
    return p;
}

void cache_policy_free(cache_policy *p) {
    if (!p) return;
    free(p->score);
    free(p->last);
    free(p);
}

const char *cache_policy_name(cache_policy_kind kind) {
    switch (kind) {
    case CACHE_POLICY_LRU: return "lru";
    case CACHE_POLICY_LFU: return "lfu";
    case CACHE_POLICY_ENGINE: return "engine";
    }
    return "?";
}

void cache_policy_touch(cache_policy *p, int key) {
    if (key < 0 || key >= p->n) return;
    p->clock++;
    switch (p->kind) {
    case CACHE_POLICY_LRU: p->score[key] = (double)p->clock; break;
    case CACHE_POLICY_LFU: p->score[key] += 1.0; break;
    case CACHE_POLICY_ENGINE: {
        double now = (double)p->clock / p->half_life;
        double decayed = isinf(p->score[key]) ? 0.0 : exp2(p->score[key] - now);
        p->score[key] = log2(decayed + 1.0) + now;
        break;
    }
    }
    p->last[key] = p->clock;
}

void cache_policy_rank(const cache_policy *p, int key, double *score, uint64_t *last) {
    *score = p->score[key];
    *last = p->last[key];
}

bool cache_policy_prefer_evict(const cache_policy *p, int a, int b) {
    if (p->score[a] != p->score[b]) return p->score[a] < p->score[b];
    return p->last[a] < p->last[b];
}
