/* Expert parallelism on one GPU (backends/cuda/cuda_ep.cu, docs/multi-gpu.md):
 *  1. the device dispatch plan (k_ep_plan) against the CPU's ep_dispatch_plan, for 1..8 ranks
 *     and decode / prefill slot counts: owner, perm, inv and counts equal (no NCCL needed);
 *  2. the op: moe_experts through the EP path (NCCL over one rank: dispatch, the owner's
 *     experts, combine) against the plain op on the same backend and table, bit for bit, for
 *     the decode (grouped matvec) and prefill (tiled) families;
 *  3. models: each GGUF given, loaded with --gpu and with --gpu --gpus 1: prompt logits (one
 *     batch and small batches) and decode-step logits (graphs on and off) bit for bit.
 * Exit 77 (skipped) without a CUDA device; 2 when NCCL cannot be opened (set SLUICE_NCCL_LIB). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/cuda/backend_cuda.h"
#include "backends/cuda/cuda_ep.h"
#include "formats/quant.h"
#include "formats/store.h"
#include "runtime/ep_placement.h"
#include "sluice.h"

static int failures, checks;
#define EXPECT(cond, ...)                                                                        \
    do {                                                                                         \
        checks++;                                                                                \
        if (!(cond)) {                                                                           \
            failures++;                                                                          \
            printf("FAIL: ");                                                                    \
            printf(__VA_ARGS__);                                                                 \
            printf("\n");                                                                        \
        }                                                                                        \
    } while (0)

static uint64_t rng = 99;
static uint32_t rnd(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}
static float frnd(float scale) { return ((float)(rnd() % 20001) / 10000.0f - 1.0f) * scale; }

static void *dev_copy(backend *g, const void *h, size_t bytes) {
    void *d = be_alloc(g, bytes);
    be_upload(g, d, h, bytes);
    return d;
}

/* ---- 1. the dispatch plan ----------------------------------------------------------------------- */

static void test_plan(backend *g) {
    printf("== dispatch plan: device vs ep_dispatch_plan\n");
    const int X = 64, ms[] = {1, 8, 10, 300, 5000};
    uint64_t eb[1] = {1};
    for (int R = 1; R <= 8; R++) {
        ep_place_params pp = {.n_rank = R, .n_layer = 1, .n_expert = X, .expert_bytes = eb};
        ep_placement pl;
        char err[256];
        if (ep_place(&pp, &pl, err, sizeof err) != 0) {
            EXPECT(0, "ep_place: %s", err);
            continue;
        }
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            const int m = ms[mi];
            int32_t *ids = malloc((size_t)m * 4), *owner = malloc((size_t)m * 4);
            int32_t *perm = malloc((size_t)m * 4), *inv = malloc((size_t)m * 4), counts[8];
            for (int i = 0; i < m; i++) ids[i] = (int32_t)(rnd() % X);
            ep_dispatch d;
            const int rc = ep_dispatch_plan(&pl, 0, ids, m, &d);
            const int rg = backend_cuda_ep_selftest_plan(g, ids, m, pl.owner, X, R, owner, perm, inv, counts);
            EXPECT(rc == 0 && rg == 0, "plan R %d m %d: rc %d / %d", R, m, rc, rg);
            if (rc == 0 && rg == 0) {
                const bool same = memcmp(owner, d.owner, (size_t)m * 4) == 0 &&
                                  memcmp(perm, d.perm, (size_t)m * 4) == 0 &&
                                  memcmp(inv, d.inv, (size_t)m * 4) == 0 &&
                                  memcmp(counts, d.send_count, (size_t)R * 4) == 0;
                EXPECT(same, "device plan differs from the CPU's: %d ranks, %d slots", R, m);
            }
            ep_dispatch_free(&d);
            free(ids); free(owner); free(perm); free(inv);
        }
        ep_placement_free(&pl);
    }
}

/* ---- 2. the op ---------------------------------------------------------------------------------- */

static const void *make_weight(uint32_t type, int64_t K, int64_t rows, size_t *bytes) {
    const quant_traits *qt = quant_traits_of(type);
    const size_t rb = quant_row_bytes(type, K);
    uint8_t *data = malloc(rb * (size_t)rows);
    float *x = malloc((size_t)K * sizeof *x);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < K; i++) x[i] = frnd(0.3f);
        qt->quantize(x, data + (size_t)r * rb, K);
    }
    free(x);
    *bytes = rb * (size_t)rows;
    return data;
}

/* 1: passed, 0: failed, -1: NCCL unavailable */
static int test_op_shape(int E, int X, int k, int F, uint32_t tg, uint32_t td) {
    char err[256];
    backend_cuda_params bp = {.device = 0};
    backend *g = backend_cuda_new(&bp, err, sizeof err);
    if (!g) {
        EXPECT(0, "backend: %s", err);
        return 0;
    }
    expert_layer_layout L = {.present = true};
    for (int p = 0; p < EXPERT_PARTS; p++) {
        L.part[p].type = p == EXPERT_DOWN ? td : tg;
        L.part[p].ne0 = p == EXPERT_DOWN ? F : E;
        L.part[p].ne1 = p == EXPERT_DOWN ? E : F;
    }
    expert_layout lay = {.n_layer = 1, .n_expert = X, .layers = &L};
    if (g->ops->experts_init(g, &lay) != 0) {
        EXPECT(0, "experts_init");
        be_free(g);
        return 0;
    }
    for (int e = 0; e < X; e++) {
        size_t bg, bu, bd;
        const void *hg = make_weight(tg, E, F, &bg), *hu = make_weight(tg, E, F, &bu);
        const void *hd = make_weight(td, F, E, &bd);
        g->ops->experts_set(g, 0, e, dev_copy(g, hg, bg), dev_copy(g, hu, bu), dev_copy(g, hd, bd));
        free((void *)hg); /* the table points at the device copies */
        free((void *)hu);
        free((void *)hd);
    }
    const int ns[] = {1, 3, 8, 9, 40};
    const int NN = (int)(sizeof ns / sizeof ns[0]);
    float *plain[5] = {0};
    float *xd[5], *od[5], *wd[5];
    int32_t *idd[5];
    for (int ni = 0; ni < NN; ni++) {
        const int n = ns[ni];
        float *lg = malloc((size_t)n * X * 4), *x = malloc((size_t)n * E * 4);
        for (int i = 0; i < n * X; i++) lg[i] = frnd(2.0f);
        for (int i = 0; i < n * E; i++) x[i] = frnd(1.0f);
        float *lgd = dev_copy(g, lg, (size_t)n * X * 4);
        idd[ni] = be_alloc(g, (size_t)n * k * 4);
        wd[ni] = be_alloc(g, (size_t)n * k * 4);
        be_moe_route(g, lgd, n, X, k, true, idd[ni], wd[ni]);
        xd[ni] = dev_copy(g, x, (size_t)n * E * 4);
        od[ni] = be_alloc(g, (size_t)n * E * 4);
        EXPECT(g->ops->moe_experts(g, 0, xd[ni], n, idd[ni], wd[ni], k, od[ni]) == 0, "plain moe_experts");
        plain[ni] = malloc((size_t)n * E * 4);
        be_download(g, plain[ni], od[ni], (size_t)n * E * 4);
        be_mfree(g, lgd);
        free(lg);
        free(x);
    }
    int32_t *owner = calloc((size_t)X, sizeof *owner); /* one rank owns everything */
    backend_cuda_ep_params ep = {.n_rank = 1, .rank = 0, .owner = owner, .verbose = true};
    int result = 1;
    if (backend_cuda_ep_enable(g, &ep, err, sizeof err) != 0) {
        printf("EP unavailable: %s\n", err);
        result = -1;
    } else {
        EXPECT(backend_cuda_ep_ranks(g) == 1, "EP ranks");
        for (int ni = 0; ni < NN; ni++) {
            const int n = ns[ni];
            be_memzero(g, od[ni], (size_t)n * E * 4);
            const int rc = g->ops->moe_experts(g, 0, xd[ni], n, idd[ni], wd[ni], k, od[ni]);
            float *got = malloc((size_t)n * E * 4);
            be_download(g, got, od[ni], (size_t)n * E * 4);
            const bool same = rc == 0 && memcmp(got, plain[ni], (size_t)n * E * 4) == 0;
            printf("  %-6s/%-6s E %4d F %4d X %3d top-%d n %2d: EP (1 rank) vs plain: %s\n", quant_type_name(tg),
                   quant_type_name(td), E, F, X, k, n, same ? "identical" : "DIFFER");
            EXPECT(same, "EP op differs: %s/%s E %d n %d", quant_type_name(tg), quant_type_name(td), E, n);
            if (!same) result = 0;
            free(got);
        }
    }
    for (int ni = 0; ni < NN; ni++) free(plain[ni]);
    free(owner);
    be_free(g); /* through the EP free when enabled: communicator, placement, then the backend */
    return result;
}

/* ---- 3. models ---------------------------------------------------------------------------------- */

typedef struct run_out {
    float *all, *last;
    int32_t gen[16];
    int n_gen;
    bool ok;
} run_out;

static run_out run_model(const char *path, const sluice_model_params *mp, const int32_t *ids, int n, int n_gen,
                         int batch) {
    run_out r;
    memset(&r, 0, sizeof r);
    sluice_model *m = sluice_model_load(path, mp);
    if (!m) {
        printf("  load failed: %s\n", sluice_last_error());
        return r;
    }
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    const int V = info.n_vocab;
    sluice_session_params sp = {.n_ctx = n + n_gen + 8, .n_batch = batch, .n_threads = 0};
    sluice_session *s = sluice_session_new(m, &sp);
    r.all = malloc((size_t)n * V * sizeof(float));
    r.last = malloc((size_t)V * sizeof(float));
    bool ok = s && sluice_session_eval(s, ids, n, r.all) == 0;
    sluice_sampler_params gp = sluice_sampler_defaults();
    gp.temperature = 0;
    if (ok) sluice_session_set_sampler(s, &gp);
    for (int i = 0; ok && i < n_gen; i++) {
        int32_t t = sluice_session_sample(s);
        r.gen[r.n_gen++] = t;
        ok = sluice_session_eval(s, &t, 1, NULL) == 0;
    }
    if (ok) memcpy(r.last, sluice_session_logits(s), (size_t)V * sizeof(float));
    else printf("  eval failed: %s\n", sluice_last_error());
    r.ok = ok;
    if (s) sluice_session_free(s);
    sluice_model_free(m);
    return r;
}

static void test_model(const char *path) {
    printf("== model %s\n", path);
    sluice_model_params probe = {.plan_only = true, .no_watchdog = true};
    sluice_model *pm = sluice_model_load(path, &probe);
    if (!pm) {
        EXPECT(0, "cannot load %s: %s", path, sluice_last_error());
        return;
    }
    sluice_model_info info;
    sluice_model_get_info(pm, &info);
    sluice_model_free(pm);
    const int n = 24, n_gen = 8, V = info.n_vocab;
    int32_t ids[24];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 7919 + 13) % (V > 1 ? V - 1 : 1)) + 1;
    const int batches[] = {24, 5};
    for (int bi = 0; bi < 2; bi++)
        for (int graphs = 1; graphs >= 0; graphs--) {
            sluice_model_params gp = {.no_watchdog = true, .n_ctx = n + n_gen + 8,
                                      .backend = SLUICE_BACKEND_CUDA, .no_graph = !graphs};
            sluice_model_params ep = gp;
            ep.gpus = 1;
            run_out a = run_model(path, &gp, ids, n, n_gen, batches[bi]);
            run_out b = run_model(path, &ep, ids, n, n_gen, batches[bi]);
            EXPECT(a.ok && b.ok, "runs (batch %d, graphs %d)", batches[bi], graphs);
            if (a.ok && b.ok) {
                const bool pa = memcmp(a.all, b.all, (size_t)n * V * 4) == 0;
                const bool pd = memcmp(a.last, b.last, (size_t)V * 4) == 0 &&
                                memcmp(a.gen, b.gen, sizeof a.gen) == 0;
                double md = 0;
                for (size_t i = 0; i < (size_t)n * V; i++) md = fmax(md, fabs((double)a.all[i] - b.all[i]));
                printf("  batch %2d, graphs %-3s: prompt logits %s (max diff %.3g), decode logits and tokens %s\n",
                       batches[bi], graphs ? "on" : "off", pa ? "identical" : "DIFFER", md,
                       pd ? "identical" : "DIFFER");
                EXPECT(pa, "--gpus 1 prompt logits differ (batch %d, graphs %d)", batches[bi], graphs);
                EXPECT(pd, "--gpus 1 decode logits differ (batch %d, graphs %d)", batches[bi], graphs);
            }
            free(a.all); free(a.last); free(b.all); free(b.last);
        }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    cuda_device_info info;
    if (!backend_cuda_probe(0, &info)) {
        printf("no CUDA device (%s): skipped\n", info.error);
        return 77;
    }
    printf("device: %s, %d SMs\n", info.name, info.sm_count);
    char err[256];
    backend_cuda_params bp = {.device = 0};
    backend *g = backend_cuda_new(&bp, err, sizeof err);
    if (!g) {
        printf("cannot create the backend: %s\n", err);
        return 1;
    }
    test_plan(g);
    be_free(g);
    printf("== moe_experts: EP path over NCCL (1 rank) vs the plain op\n");
    int r = test_op_shape(256, 16, 4, 256, GGML_TYPE_Q4_K, GGML_TYPE_Q4_K);
    if (r == -1) {
        printf("== %d checks, %d failed; NCCL unavailable: the EP path is unrun\n", checks, failures);
        return 2;
    }
    test_op_shape(256, 16, 4, 256, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0);
    /* the 35B-A3B widths, and the 397B-A17B's (4096 wide, top-10, Q2_K/Q3_K experts); fewer
     * experts than the real models keep the CPU quantization of the weights short */
    test_op_shape(2048, 32, 8, 512, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K);
    test_op_shape(4096, 32, 10, 512, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K);
    for (int i = 1; i < argc; i++) test_model(argv[i]);
    printf("== %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
