/* The streaming store's victims in sweeps and in decode (runtime/experts_stream.c,
 * cache_sweep_batch / cache_sweep_distance in runtime/cache_policy.h).
 *
 * A 6-layer x 16-expert file of distinct bytes per expert, a cache of 64 of its 96 experts:
 *   - sweeps (every layer needs all of its experts, as in a prefill chunk; the next layer's
 *     experts hinted while a layer runs, as the lookahead does): after the first pass a pass
 *     reads at most 96 - (64 - 2 x 16) experts (the furthest-next-use order keeps what the
 *     layer being computed and the next one's hints leave of the cache across passes; the
 *     recency order that ran before read all 96 every pass);
 *   - decode at a cache of 14 (3 of 16 experts a layer: two hot ones every token, a third that
 *     changes): the policy's order keeps the 12 hot experts, so a token misses only its 6 cold
 *     ones (recency alone would evict the next layer's hot experts, used longest ago);
 *   - lookahead hints that guess wrong, at a cache of 16 (experts 0 and 1 of every layer each
 *     token, 12 in all; the next layer hinted with expert 0 and with 14 or 15, never used): the
 *     wrong hints' slots are the victims, so nothing misses after the first tokens; a slot a hint
 *     filled stayed LOADING until acquired, i.e. forever for a wrong one, never a victim, so the
 *     wrong hints took the used experts' slots instead (7 misses a token);
 *   - every acquired view holds its expert's bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "formats/quant.h"
#include "runtime/experts.h"
#include "runtime/io.h"

#define NL 6
#define NE 16
#define SLOTS 64
#define SLOTS_DECODE 14
#define SLOTS_HINTS 16

static expert_layer_layout layers[NL];
static expert_layout layout = {.n_layer = NL, .n_expert = NE, .layers = layers};
static uint8_t *file;
static uint64_t file_bytes;

static void make_layout(void) {
    uint64_t off = 4096;
    for (int L = 0; L < NL; L++) {
        layers[L].present = true;
        for (int p = 0; p < EXPERT_PARTS; p++) {
            expert_part *P = &layers[L].part[p];
            P->type = GGML_TYPE_F32;
            P->ne0 = 32 + 8 * p;
            P->ne1 = 4 + L;
            P->bytes = (uint64_t)P->ne0 * P->ne1 * 4;
            P->stride = P->bytes + 64;
            P->offset = off;
            off += NE * P->stride;
        }
    }
    file_bytes = off;
    file = calloc(1, off);
    for (int L = 0; L < NL; L++)
        for (int e = 0; e < NE; e++)
            for (int p = 0; p < EXPERT_PARTS; p++) {
                const expert_part *P = &layers[L].part[p];
                uint8_t *d = file + expert_part_offset(P, e);
                for (uint64_t j = 0; j < P->bytes; j++) d[j] = (uint8_t)((L * 131 + e * 17 + p * 7 + j) * 2654435761u >> 24);
            }
}

/* acquire, compare the three parts with the file, release */
static int use(expert_store *s, int L, int e) {
    expert_views v;
    if (expert_acquire(s, L, e, &v) != 0) return -1;
    const tview *t[EXPERT_PARTS] = {&v.gate, &v.up, &v.down};
    int bad = 0;
    for (int p = 0; p < EXPERT_PARTS; p++)
        bad |= memcmp(t[p]->data, file + expert_part_offset(&layers[L].part[p], e), layers[L].part[p].bytes) != 0;
    expert_release(s, L, e);
    return bad ? -1 : 0;
}

static uint64_t experts_read(const expert_store *s) { return s->stats.reads / EXPERT_PARTS; }

/* A stream store of `slots` slots over the file at path (page I/O), or NULL (a failed check). */
static expert_store *store_of(const char *path, int slots) {
    char err[256];
    stream_params sp = {.path = path, .layout = &layout, .cache_bytes = (uint64_t)slots * expert_slot_bytes(&layout),
                        .io_mode = IO_PAGE};
    expert_store *s = expert_store_stream_new(&sp, err, sizeof err);
    CHECKF(s != NULL, "%s", err);
    return s;
}

int main(void) {
    make_layout();
    char path[] = "/tmp/sluice-sweep-XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) CHECK_DONE();
    CHECK(write(fd, file, file_bytes) == (ssize_t)file_bytes);
    close(fd);

    expert_store *s = store_of(path, SLOTS);
    if (!s) goto out;
    int32_t all[NE];
    for (int e = 0; e < NE; e++) all[e] = e;
    int bad = 0;

    /* sweeps */
    uint64_t per_pass[4];
    for (int pass = 0; pass < 4; pass++) {
        const uint64_t r0 = experts_read(s);
        for (int L = 0; L < NL; L++) {
            expert_prefetch(s, L, all, NE, true);
            if (L + 1 < NL) expert_prefetch(s, L + 1, all, NE, false); /* the lookahead */
            for (int e = 0; e < NE; e++) bad |= use(s, L, (e * 5 + pass) % NE) != 0;
        }
        per_pass[pass] = experts_read(s) - r0;
        printf("sweep pass %d: %llu experts read\n", pass, (unsigned long long)per_pass[pass]);
    }
    CHECKF(per_pass[0] == NL * NE, "first pass read %llu", (unsigned long long)per_pass[0]);
    for (int pass = 1; pass < 4; pass++)
        CHECKF(per_pass[pass] <= NL * NE - (SLOTS - 2 * NE), "pass %d read %llu experts, more than %d", pass,
               (unsigned long long)per_pass[pass], NL * NE - (SLOTS - 2 * NE));

    s->ops->free(s);
    /* decode: experts 0 and 1 of every layer each token, and one of 2..15 in turn */
    s = store_of(path, SLOTS_DECODE);
    if (!s) goto out;
    const int tokens = 64;
    uint64_t misses_late = 0;
    for (int t = 0; t < tokens; t++) {
        const uint64_t m0 = s->stats.misses;
        for (int L = 0; L < NL; L++) {
            const int32_t need[3] = {0, 1, 2 + (t * 3 + L) % (NE - 2)};
            expert_prefetch(s, L, need, 3, true);
            for (int j = 0; j < 3; j++) bad |= use(s, L, need[j]) != 0;
        }
        if (t >= tokens / 2) misses_late += s->stats.misses - m0;
    }
    printf("decode: %.2f misses a token over the last %d tokens\n", (double)misses_late / (tokens / 2), tokens / 2);
    /* the cold experts only, one a layer */
    CHECKF(misses_late <= (uint64_t)NL * (tokens / 2), "decode missed %llu times in %d tokens",
           (unsigned long long)misses_late, tokens / 2);
    s->ops->free(s);

    /* hints that guess wrong half the time */
    s = store_of(path, SLOTS_HINTS);
    if (!s) goto out;
    misses_late = 0;
    for (int t = 0; t < tokens; t++) {
        const uint64_t m0 = s->stats.misses;
        for (int L = 0; L < NL; L++) {
            const int32_t need[2] = {0, 1};
            expert_prefetch(s, L, need, 2, true);
            if (L + 1 < NL) { /* right, and one of two experts never used */
                const int32_t hint[2] = {0, NE - 2 + t % 2};
                expert_prefetch(s, L + 1, hint, 2, false);
            }
            for (int j = 0; j < 2; j++) bad |= use(s, L, need[j]) != 0;
        }
        if (t >= tokens / 2) misses_late += s->stats.misses - m0;
    }
    printf("hints: %.2f misses a token over the last %d tokens\n", (double)misses_late / (tokens / 2), tokens / 2);
    CHECKF(misses_late == 0, "with wrong hints missed %llu times in %d tokens",
           (unsigned long long)misses_late, tokens / 2);
    CHECK(!bad);
    s->ops->free(s);
out:
    unlink(path);
    free(file);
    CHECK_DONE();
}
