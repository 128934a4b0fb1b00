/* Sampling chain, in llama.cpp's default order: penalties -> top-k -> top-p -> min-p ->
 * temperature -> softmax -> draw. The draw uses a seeded xoshiro256** generator, so a seed
 * fixes the output. */
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
    int32_t id;
    float logit;
    float p;
} cand;

struct sampler {
    int n_vocab;
    sluice_sampler_params p;
    uint64_t rng[4];
    int32_t *hist; /* ring of the last repeat_last_n tokens */
    int hist_cap, hist_len, hist_head;
    cand *c;
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(sampler *s) {
    uint64_t *r = s->rng;
    uint64_t out = rotl(r[1] * 5, 7) * 9, t = r[1] << 17;
    r[2] ^= r[0];
    r[3] ^= r[1];
    r[1] ^= r[2];
    r[0] ^= r[3];
    r[2] ^= t;
    r[3] = rotl(r[3], 45);
    return out;
}

/* uniform in [0, 1) with 53 random bits */
static double next_unit(sampler *s) { return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0); }

sluice_sampler_params sluice_sampler_defaults(void) {
    return (sluice_sampler_params){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f,
                                   .min_p = 0.05f, .repeat_penalty = 1.0f, .repeat_last_n = 64,
                                   .seed = 0};
}

void sampler_set(sampler *s, const sluice_sampler_params *p) {
    s->p = *p;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    int cap = p->repeat_last_n > 0 ? p->repeat_last_n : 0;
    if (cap != s->hist_cap) {
        free(s->hist);
        s->hist = cap ? calloc((size_t)cap, sizeof *s->hist) : NULL;
        s->hist_cap = s->hist ? cap : 0;
    }
    s->hist_len = s->hist_head = 0;
}

sampler *sampler_new(int n_vocab, const sluice_sampler_params *p) {
    sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_vocab = n_vocab;
    s->c = malloc((size_t)n_vocab * sizeof *s->c);
    if (!s->c) {
        free(s);
        return NULL;
    }
    sampler_set(s, p);
    return s;
}

void sampler_free(sampler *s) {
    if (!s) return;
    free(s->hist);
    free(s->c);
    free(s);
}

void sampler_reset(sampler *s) { sampler_set(s, &s->p); }

void sampler_accept(sampler *s, int32_t id) {
    if (!s->hist_cap) return;
    s->hist[s->hist_head] = id;
    s->hist_head = (s->hist_head + 1) % s->hist_cap;
    if (s->hist_len < s->hist_cap) s->hist_len++;
}

static int by_logit_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* softmax over c[0..n) by logit into p; c must be sorted descending */
static void softmax_sorted(cand *c, int n) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        c[i].p = expf(c[i].logit - c[0].logit);
        sum += c[i].p;
    }
    for (int i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

/* A block's maximum first, the index only in a block that beats the best so far: a 248K
 * vocabulary where the plain loop, reloading x[best] every element, took 0.95 ms (a tenth of a
 * GPU decode step). The block maximum is 16 independent running maxima (elementwise, which
 * the compiler vectorizes, and without one long chain of dependent compares: a single running
 * maximum took 0.15 ms, as it may not be reordered without fast-math), then their maximum. A
 * maximum is the same whatever the order of the compares, and NaN never wins (x > m is
 * false), so the pick is the plain loop's: the first index of the largest value. */
int32_t sluice_argmax(const float *x, int n) {
    enum { BLK = 64, LANES = 16 };
    if (n <= 0) return 0;
    int32_t best = 0;
    float bv = x[0];
    int i = 0;
    for (; i + BLK <= n; i += BLK) {
        float lm[LANES];
#ifdef __SSE2__
        /* maxps(a, b) is a > b ? a : b, lane by lane: the loop below, four lanes at a time */
        __m128 v[LANES / 4];
        for (int l = 0; l < LANES / 4; l++) v[l] = _mm_set1_ps(-INFINITY);
        for (int j = 0; j < BLK; j += LANES)
            for (int l = 0; l < LANES / 4; l++) v[l] = _mm_max_ps(_mm_loadu_ps(x + i + j + 4 * l), v[l]);
        for (int l = 0; l < LANES / 4; l++) _mm_storeu_ps(lm + 4 * l, v[l]);
#else
        for (int l = 0; l < LANES; l++) lm[l] = -INFINITY;
        for (int j = 0; j < BLK; j += LANES)
            for (int l = 0; l < LANES; l++) lm[l] = x[i + j + l] > lm[l] ? x[i + j + l] : lm[l];
#endif
        float m = lm[0];
        for (int l = 1; l < LANES; l++) m = lm[l] > m ? lm[l] : m;
        if (m > bv)
            for (int j = 0; j < BLK; j++)
                if (x[i + j] > bv) {
                    bv = x[i + j];
                    best = i + j;
                }
    }
    for (; i < n; i++)
        if (x[i] > bv) {
            bv = x[i];
            best = i;
        }
    return best;
}

bool sampler_is_argmax(const sampler *s) {
    const sluice_sampler_params *p = &s->p;
    const bool penalty = p->repeat_penalty != 1.0f && p->repeat_penalty > 0.0f;
    return p->temperature <= 0.0f && !(penalty && s->hist_len > 0);
}

int32_t sampler_sample(sampler *s, const float *logits) {
    const sluice_sampler_params *p = &s->p;
    int n = s->n_vocab;
    const bool penalty = p->repeat_penalty != 1.0f && p->repeat_penalty > 0.0f;
    if (sampler_is_argmax(s)) return sluice_argmax(logits, n);
    for (int i = 0; i < n; i++) s->c[i] = (cand){i, logits[i], 0.0f};
    if (penalty) {
        /* each distinct recent token is penalized once */
        for (int h = 0; h < s->hist_len; h++) {
            int32_t id = s->hist[h];
            bool seen = false;
            for (int j = 0; j < h; j++) seen |= s->hist[j] == id;
            if (seen || id < 0 || id >= n) continue;
            float *l = &s->c[id].logit;
            *l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
        }
    }
    if (p->temperature <= 0.0f) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (s->c[i].logit > s->c[best].logit) best = i;
        return best;
    }
    qsort(s->c, (size_t)n, sizeof *s->c, by_logit_desc);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    if (p->top_p < 1.0f) {
        softmax_sorted(s->c, n);
        double cum = 0.0;
        for (int i = 0; i < n; i++) {
            cum += s->c[i].p;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        softmax_sorted(s->c, n);
        float floor_p = p->min_p * s->c[0].p;
        int keep = 1;
        while (keep < n && s->c[keep].p >= floor_p) keep++;
        n = keep;
    }
    for (int i = 0; i < n; i++) s->c[i].logit /= p->temperature;
    softmax_sorted(s->c, n);
    double r = next_unit(s), cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += s->c[i].p;
        if (r < cum) return s->c[i].id;
    }
    return s->c[n - 1].id;
}
