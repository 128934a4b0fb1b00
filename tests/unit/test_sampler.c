/* The greedy pick (sluice_argmax) against the plain first-maximum loop, and the sampler's greedy
 * paths (with and without a repetition penalty) against the same rule. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/sampler.h"
#include "sluice.h"

/* The definition: the first index whose value no later value exceeds. */
static int32_t plain_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

int main(void) {
    enum { NMAX = 248320 };
    float *x = malloc(NMAX * sizeof *x);
    if (!x) return 1;
    /* random values, then few distinct values (ties), at every length around the block size */
    for (int n = 1; n <= 300; n++)
        for (int mode = 0; mode < 2; mode++) {
            for (int i = 0; i < n; i++)
                x[i] = mode ? (float)(next_u32() % 5) : (float)next_u32() / 4294967296.0f - 0.5f;
            CHECKF(sluice_argmax(x, n) == plain_argmax(x, n), "n %d mode %d", n, mode);
        }
    /* a real vocabulary: the maximum in every possible block position */
    for (int i = 0; i < NMAX; i++) x[i] = (float)next_u32() / 4294967296.0f;
    for (int pos = 0; pos < 130; pos++) {
        const int at = pos < 65 ? pos : NMAX - 130 + pos;
        const float keep = x[at];
        x[at] = 2.0f;
        CHECKF(sluice_argmax(x, NMAX) == at, "max at %d", at);
        x[at] = keep;
    }
    CHECK(sluice_argmax(x, NMAX) == plain_argmax(x, NMAX));
    /* NaN and -inf: a NaN never wins (unless it is x[0], as in the plain loop), even when it
     * opens the block that holds the maximum */
    for (int i = 0; i < 200; i++) x[i] = -INFINITY;
    CHECK(sluice_argmax(x, 200) == 0);
    x[64] = NAN;
    x[70] = 1.0f;
    x[3] = NAN;
    CHECK(sluice_argmax(x, 200) == 70 && plain_argmax(x, 200) == 70);
    x[0] = NAN;
    CHECK(sluice_argmax(x, 200) == 0 && plain_argmax(x, 200) == 0);
    CHECK(sluice_argmax(x, 0) == 0);

    /* the sampler at temperature 0: the argmax, after the penalty when there is one */
    const int V = 1000;
    for (int i = 0; i < V; i++) x[i] = (float)(next_u32() % 1000) / 100.0f;
    sluice_sampler_params p = sluice_sampler_defaults();
    p.temperature = 0.0f;
    p.repeat_penalty = 1.0f;
    sampler *s = sampler_new(V, &p);
    CHECK(s != NULL);
    const int32_t g = plain_argmax(x, V);
    CHECK(sampler_sample(s, x) == g);
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 64;
    sampler_set(s, &p);
    CHECK(sampler_sample(s, x) == g); /* no history yet */
    sampler_accept(s, g);
    float *pen = malloc(V * sizeof *pen);
    memcpy(pen, x, V * sizeof *pen);
    pen[g] = pen[g] > 0 ? pen[g] / 2.0f : pen[g] * 2.0f;
    CHECK(sampler_sample(s, x) == plain_argmax(pen, V));
    CHECK(sampler_sample(s, x) != g || plain_argmax(pen, V) == g);
    sampler_free(s);
    free(pen);
    free(x);
    CHECK_DONE();
}
