/* Expert parallelism on the CPU (runtime/ep_placement.c, docs/multi-gpu.md):
 *  - placement: per layer each rank holds ceil or floor of n_expert / n_rank experts, the
 *    expected load is at least as balanced as round-robin and within one expert's load of the
 *    mean (greedy bound), capacities are honored, the same input gives the same placement, and
 *    experts that cannot fit are refused with one line;
 *  - dispatch bookkeeping: perm and inv are inverse permutations grouped by rank in slot order;
 *  - an in-process simulation of N ranks (plain loops standing for NCCL sends and receives):
 *    replicated input, token shards per home rank, dispatch, the owners' expert FFNs, combine in
 *    slot order, all-gather; the output equals the one-rank MoE bit for bit for N = 1..4. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime/ep_placement.h"

static uint64_t rng_state = 777;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static float frnd(void) { return (float)((int)(rnd() % 20001) - 10000) / 10000.0f; }

/* Zipf-like popularity with a random permutation per layer (the hot experts differ by layer) */
static void skewed_counts(uint64_t *c, int L, int X) {
    for (int il = 0; il < L; il++) {
        int *perm = malloc((size_t)X * sizeof *perm);
        for (int e = 0; e < X; e++) perm[e] = e;
        for (int e = X - 1; e > 0; e--) {
            int j = (int)(rnd() % (uint32_t)(e + 1)), t = perm[e];
            perm[e] = perm[j];
            perm[j] = t;
        }
        for (int e = 0; e < X; e++) c[(size_t)il * X + perm[e]] = (uint64_t)(100000.0 / (e + 1.0));
        free(perm);
    }
}

static void test_balance(void) {
    const int L = 6, X = 128;
    uint64_t *counts = malloc((size_t)L * X * sizeof *counts);
    uint64_t eb[6];
    for (int il = 0; il < L; il++) eb[il] = il == 2 ? 0 : 1000; /* layer 2: dense */
    skewed_counts(counts, L, X);
    for (int R = 1; R <= 8; R++) {
        char err[256];
        ep_place_params p = {.n_rank = R, .n_layer = L, .n_expert = X, .counts = counts, .expert_bytes = eb};
        ep_placement pl;
        CHECKF(ep_place(&p, &pl, err, sizeof err) == 0, "R=%d: %s", R, err);
        if (!pl.owner) continue;
        for (int il = 0; il < L; il++) {
            if (eb[il] == 0) {
                for (int e = 0; e < X; e++) CHECK(pl.owner[(size_t)il * X + e] == -1);
                continue;
            }
            int n_on[EP_MAX_RANKS] = {0};
            uint64_t load[EP_MAX_RANKS] = {0}, rr[EP_MAX_RANKS] = {0}, total = 0, top = 0;
            for (int e = 0; e < X; e++) {
                const int o = pl.owner[(size_t)il * X + e];
                CHECK(o >= 0 && o < R);
                if (o < 0 || o >= R) continue;
                const uint64_t c = counts[(size_t)il * X + e] + 1;
                n_on[o]++;
                load[o] += c;
                rr[e % R] += c;
                total += c;
                if (c > top) top = c;
            }
            uint64_t mx = 0, mx_rr = 0;
            for (int r = 0; r < R; r++) {
                CHECKF(n_on[r] == X / R || n_on[r] == (X + R - 1) / R, "R=%d layer %d rank %d: %d experts", R, il, r, n_on[r]);
                CHECK(load[r] == pl.layer_load[(size_t)il * R + r]);
                if (load[r] > mx) mx = load[r];
                if (rr[r] > mx_rr) mx_rr = rr[r];
            }
            CHECKF(mx <= mx_rr, "R=%d layer %d: max load %llu worse than round-robin %llu", R, il,
                   (unsigned long long)mx, (unsigned long long)mx_rr);
            CHECKF(mx <= total / (uint64_t)R + top, "R=%d layer %d: max load %llu, mean %llu, top %llu",
                   R, il, (unsigned long long)mx, (unsigned long long)(total / (uint64_t)R),
                   (unsigned long long)top);
        }
        const double imb = ep_imbalance(&pl, counts);
        CHECKF(imb >= 1.0 && (R > 1 || imb == 1.0), "R=%d: imbalance %.4f", R, imb);
        int held = 0;
        for (int r = 0; r < R; r++) held += pl.experts[r];
        CHECK(held == (L - 1) * X);
        /* determinism: the same input, the same placement */
        ep_placement again;
        CHECK(ep_place(&p, &again, err, sizeof err) == 0);
        if (again.owner) CHECK(memcmp(pl.owner, again.owner, (size_t)L * X * sizeof *pl.owner) == 0);
        ep_placement_free(&again);
        ep_placement_free(&pl);
    }
    /* no counts: uniform; ties go to the lower rank, so expert e of 8 on 4 ranks is e % 4 */
    ep_place_params u = {.n_rank = 4, .n_layer = 1, .n_expert = 8, .expert_bytes = eb};
    ep_placement pu;
    char err[256];
    CHECK(ep_place(&u, &pu, err, sizeof err) == 0);
    for (int e = 0; pu.owner && e < 8; e++) CHECKF(pu.owner[e] == e % 4, "uniform expert %d on %d", e, pu.owner[e]);
    ep_placement_free(&pu);
    free(counts);
}

static void test_capacity(void) {
    const int L = 4, X = 16;
    uint64_t eb[4] = {100, 100, 200, 100}, counts[4 * 16];
    skewed_counts(counts, L, X);
    char err[256];
    /* total 16 * 500 = 8000 bytes; unequal capacities that fit only by exceeding the quota */
    uint64_t cap[3] = {1000, 4000, 3000};
    ep_place_params p = {.n_rank = 3, .n_layer = L, .n_expert = X, .counts = counts, .expert_bytes = eb, .capacity = cap};
    ep_placement pl;
    CHECKF(ep_place(&p, &pl, err, sizeof err) == 0, "%s", err);
    for (int r = 0; pl.owner && r < 3; r++)
        CHECKF(pl.bytes[r] <= cap[r], "rank %d holds %llu > %llu", r, (unsigned long long)pl.bytes[r],
               (unsigned long long)cap[r]);
    ep_placement_free(&pl);
    /* too little in total: refused before any work, one line */
    uint64_t small[3] = {1000, 1000, 1000};
    p.capacity = small;
    err[0] = 0;
    CHECK(ep_place(&p, &pl, err, sizeof err) == -1);
    CHECKF(strstr(err, "need") && !strchr(err, '\n'), "message: %s", err);
    CHECK(pl.owner == NULL);
    /* enough in total, but one expert fits on no rank (fragmentation by the 200-byte layer) */
    uint64_t frag[2] = {4050, 3990};
    ep_place_params q = {.n_rank = 2, .n_layer = L, .n_expert = X, .counts = counts, .expert_bytes = eb, .capacity = frag};
    err[0] = 0;
    const int rc = ep_place(&q, &pl, err, sizeof err);
    if (rc == 0) {
        for (int r = 0; r < 2; r++) CHECK(pl.bytes[r] <= frag[r]);
        ep_placement_free(&pl);
    } else {
        CHECKF(strstr(err, "fits on no rank") && !strchr(err, '\n'), "message: %s", err);
    }
    /* bad arguments */
    ep_place_params bad = {.n_rank = 0, .n_layer = 1, .n_expert = 4, .expert_bytes = eb};
    CHECK(ep_place(&bad, &pl, err, sizeof err) == -1);
}

static void test_dispatch(void) {
    const int X = 32, K = 4, N = 37;
    uint64_t eb[1] = {1};
    for (int R = 1; R <= 5; R++) {
        ep_place_params p = {.n_rank = R, .n_layer = 1, .n_expert = X, .expert_bytes = eb};
        ep_placement pl;
        char err[256];
        CHECK(ep_place(&p, &pl, err, sizeof err) == 0);
        int32_t ids[37 * 4];
        for (int i = 0; i < N * K; i++) ids[i] = (int32_t)(rnd() % X);
        ep_dispatch d;
        CHECK(ep_dispatch_plan(&pl, 0, ids, N * K, &d) == 0);
        CHECK(d.send_offset[R] == N * K);
        for (int i = 0; i < N * K; i++) {
            CHECK(d.perm[d.inv[i]] == i);
            const int j = d.inv[i], o = d.owner[i];
            CHECK(o == pl.owner[ids[i]]);
            CHECK(j >= d.send_offset[o] && j < d.send_offset[o + 1]);
        }
        for (int j = 1; j < N * K; j++) /* within a rank's block, slot order */
            if (d.owner[d.perm[j]] == d.owner[d.perm[j - 1]]) CHECK(d.perm[j] > d.perm[j - 1]);
        ep_dispatch_free(&d);
        int32_t badids[2] = {0, X};
        CHECK(ep_dispatch_plan(&pl, 0, badids, 2, &d) == -1);
        ep_placement_free(&pl);
    }
}

/* ---- N ranks in one process ---------------------------------------------------------------- */

enum { E = 48, F = 24, X = 16, K = 4, LAYERS = 2 };

typedef struct tiny_moe {
    float gate[LAYERS][X][F][E], up[LAYERS][X][F][E], down[LAYERS][X][E][F];
} tiny_moe;

static float silu(float v) { return v / (1.0f + expf(-v)); }

/* One expert on one row, sums in a fixed order: what any rank computes for a slot. */
static void expert_ffn(const tiny_moe *m, int il, int e, const float *x, float *y) {
    float h[F];
    for (int f = 0; f < F; f++) {
        float g = 0, u = 0;
        for (int i = 0; i < E; i++) {
            g += m->gate[il][e][f][i] * x[i];
            u += m->up[il][e][f][i] * x[i];
        }
        h[f] = silu(g) * u;
    }
    for (int i = 0; i < E; i++) {
        float s = 0;
        for (int f = 0; f < F; f++) s += m->down[il][e][i][f] * h[f];
        y[i] = s;
    }
}

/* The one-GPU moe_experts: every slot's output, then out[t] = sum_s w[t][s] y[t][s] with the
 * first term a product and the rest added in slot order (k_combine's arithmetic). */
static void combine_row(const float *const *ys, const float *w, float *out) {
    for (int i = 0; i < E; i++) {
        float o = ys[0][i] * w[0];
        for (int s = 1; s < K; s++) o = o + ys[s][i] * w[s];
        out[i] = o;
    }
}

static void moe_reference(const tiny_moe *m, int il, const float *x, int n, const int32_t *ids,
                          const float *w, float *out) {
    float *y = malloc((size_t)n * K * E * sizeof *y);
    for (int t = 0; t < n; t++)
        for (int s = 0; s < K; s++) expert_ffn(m, il, ids[t * K + s], x + (size_t)t * E, y + ((size_t)t * K + s) * E);
    for (int t = 0; t < n; t++) {
        const float *ys[K];
        for (int s = 0; s < K; s++) ys[s] = y + ((size_t)t * K + s) * E;
        combine_row(ys, w + (size_t)t * K, out + (size_t)t * E);
    }
    free(y);
}

/* R ranks; each rank's "device memory" is its own arrays, and a NCCL send/recv pair is a memcpy
 * from the sender's buffer into the receiver's, in the order the group would complete them
 * (the receiver lays blocks out by source rank). */
static void moe_ep_sim(const tiny_moe *m, const ep_placement *pl, int il, const float *x, int n,
                       const int32_t *ids, const float *w, float *out_all) {
    const int R = pl->n_rank;
    ep_dispatch d[EP_MAX_RANKS];
    float *send_x[EP_MAX_RANKS], *recv_x[EP_MAX_RANKS], *recv_y[EP_MAX_RANKS], *back_y[EP_MAX_RANKS];
    int32_t *send_id[EP_MAX_RANKS], *recv_id[EP_MAX_RANKS];
    int recv_n[EP_MAX_RANKS], recv_off[EP_MAX_RANKS][EP_MAX_RANKS + 1];
    float *out[EP_MAX_RANKS] = {0};
    /* dispatch plan and send buffers per home rank */
    for (int h = 0; h < R; h++) {
        int t0, t1;
        ep_shard(n, R, h, &t0, &t1);
        const int ns = (t1 - t0) * K;
        CHECK(ep_dispatch_plan(pl, il, ids + (size_t)t0 * K, ns, &d[h]) == 0);
        send_x[h] = malloc(((size_t)ns + 1) * E * sizeof(float));
        send_id[h] = malloc(((size_t)ns + 1) * sizeof(int32_t));
        back_y[h] = malloc(((size_t)ns + 1) * E * sizeof(float));
        for (int j = 0; j < ns; j++) {
            const int slot = d[h].perm[j]; /* local slot index within the shard */
            memcpy(send_x[h] + (size_t)j * E, x + ((size_t)t0 + slot / K) * E, E * sizeof(float));
            send_id[h][j] = ids[(size_t)t0 * K + slot];
        }
    }
    /* all-to-all of rows and expert ids: receiver r gets from each source h its block for r */
    for (int r = 0; r < R; r++) {
        recv_n[r] = 0;
        for (int h = 0; h < R; h++) {
            recv_off[r][h] = recv_n[r];
            recv_n[r] += d[h].send_count[r];
        }
        recv_off[r][R] = recv_n[r];
        recv_x[r] = malloc(((size_t)recv_n[r] + 1) * E * sizeof(float));
        recv_y[r] = malloc(((size_t)recv_n[r] + 1) * E * sizeof(float));
        recv_id[r] = malloc(((size_t)recv_n[r] + 1) * sizeof(int32_t));
        for (int h = 0; h < R; h++) {
            const int c = d[h].send_count[r], so = d[h].send_offset[r], ro = recv_off[r][h];
            memcpy(recv_x[r] + (size_t)ro * E, send_x[h] + (size_t)so * E, (size_t)c * E * sizeof(float));
            memcpy(recv_id[r] + ro, send_id[h] + so, (size_t)c * sizeof(int32_t));
        }
        /* the owner computes its rows; every id must be one of its experts */
        for (int j = 0; j < recv_n[r]; j++) {
            CHECK(pl->owner[(size_t)il * pl->n_expert + recv_id[r][j]] == r);
            expert_ffn(m, il, recv_id[r][j], recv_x[r] + (size_t)j * E, recv_y[r] + (size_t)j * E);
        }
    }
    /* the return all-to-all: the same blocks in the other direction */
    for (int h = 0; h < R; h++)
        for (int r = 0; r < R; r++) {
            const int c = d[h].send_count[r], so = d[h].send_offset[r], ro = recv_off[r][h];
            memcpy(back_y[h] + (size_t)so * E, recv_y[r] + (size_t)ro * E, (size_t)c * E * sizeof(float));
        }
    /* combine at home in slot order, then all-gather the shards into every rank's output */
    for (int h = 0; h < R; h++) {
        out[h] = malloc(((size_t)n + 1) * E * sizeof(float));
        int t0, t1;
        ep_shard(n, R, h, &t0, &t1);
        for (int t = t0; t < t1; t++) {
            const float *ys[K];
            for (int s = 0; s < K; s++) ys[s] = back_y[h] + (size_t)d[h].inv[(t - t0) * K + s] * E;
            combine_row(ys, w + (size_t)t * K, out[h] + (size_t)t * E);
        }
    }
    for (int r = 0; r < R; r++)
        for (int h = 0; h < R; h++) {
            int t0, t1;
            ep_shard(n, R, h, &t0, &t1);
            if (r != h) memcpy(out[r] + (size_t)t0 * E, out[h] + (size_t)t0 * E, (size_t)(t1 - t0) * E * sizeof(float));
        }
    if (out[R - 1]) memcpy(out_all, out[R - 1], (size_t)n * E * sizeof(float));
    for (int r = 1; r < R; r++) CHECK(memcmp(out[r], out[0], (size_t)n * E * sizeof(float)) == 0);
    for (int r = 0; r < R; r++) {
        ep_dispatch_free(&d[r]);
        free(send_x[r]);
        free(send_id[r]);
        free(back_y[r]);
        free(recv_x[r]);
        free(recv_y[r]);
        free(recv_id[r]);
        free(out[r]);
    }
}

static void test_simulation(void) {
    tiny_moe *m = malloc(sizeof *m);
    float *g = &m->gate[0][0][0][0];
    for (size_t i = 0; i < sizeof *m / sizeof(float); i++) g[i] = frnd() * 0.3f;
    uint64_t counts[LAYERS * X], eb[LAYERS] = {3 * E * F * 4, 3 * E * F * 4};
    skewed_counts(counts, LAYERS, X);
    const int sizes[4] = {1, 3, 8, 37}; /* decode, a few tokens, fewer tokens than ranks... */
    for (int si = 0; si < 4; si++) {
        const int n = sizes[si];
        float *x = malloc((size_t)n * E * sizeof *x), *w = malloc((size_t)n * K * sizeof *w);
        float *ref = malloc((size_t)n * E * sizeof *ref), *got = malloc((size_t)n * E * sizeof *got);
        int32_t *ids = malloc((size_t)n * K * sizeof *ids);
        for (int i = 0; i < n * E; i++) x[i] = frnd();
        for (int t = 0; t < n; t++) { /* k distinct experts, random weights */
            for (int s = 0; s < K; s++) {
                int e;
                bool dup;
                do {
                    e = (int)(rnd() % X);
                    dup = false;
                    for (int q = 0; q < s; q++) dup |= ids[t * K + q] == e;
                } while (dup);
                ids[t * K + s] = e;
                w[t * K + s] = (frnd() + 1.5f) / 3.0f;
            }
        }
        for (int il = 0; il < LAYERS; il++) {
            moe_reference(m, il, x, n, ids, w, ref);
            for (int R = 1; R <= 4; R++) {
                ep_place_params p = {.n_rank = R, .n_layer = LAYERS, .n_expert = X, .counts = counts, .expert_bytes = eb};
                ep_placement pl;
                char err[256];
                CHECK(ep_place(&p, &pl, err, sizeof err) == 0);
                memset(got, 0xff, (size_t)n * E * sizeof *got);
                moe_ep_sim(m, &pl, il, x, n, ids, w, got);
                CHECKF(memcmp(got, ref, (size_t)n * E * sizeof *got) == 0,
                       "n=%d layer %d: %d ranks differ from one rank", n, il, R);
                ep_placement_free(&pl);
            }
        }
        free(x);
        free(w);
        free(ref);
        free(got);
        free(ids);
    }
    free(m);
}

int main(void) {
    test_balance();
    test_capacity();
    test_dispatch();
    test_simulation();
    CHECK_DONE();
}
