/* The host's copy of the CUDA backend's one-token products (backends/cpu/device_rows.c) and the
 * fixed-exponential SwiGLU (backends/silu_fixed.h), without a GPU:
 *   - silu_fixed_exp against exp() in double over its whole range (relative error <= 3e-7, about
 *     2.5 ulp: a degree-7 polynomial on |r| <= ln2/2 errs by ~5e-9, the eight rounded steps by
 *     a few ulps at most), and its ends (0 below -87, +inf above 88, NaN -> 0);
 *   - device_row_dot against a literal simulation of k_mv_q's warp (32 lanes, lane groups of
 *     B/32, the terms of the scalar reference dot of one block, the full butterfly with a copy
 *     per step) bit for bit, for every supported type and several row lengths, at every
 *     instruction-set level (the terms then come from different kernels), and against the
 *     double-precision dot of the decoded rows (relative to sum |w a|: 1e-5, float sums of at
 *     most 64 terms);
 *   - device_experts_run: each output the serial composition of device_row_dot, silu_fixed_mul
 *     and the reference encoders, bit for bit, with 1 and 3 threads.
 * That the GPU gives these same bits is tests/gpu/test_cuda's (--gpu-miss host runs equal to
 * resident ones, bit for bit). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/device_rows.h"
#include "backends/cpu/kernels.h"
#include "backends/silu_fixed.h"
#include "check.h"
#include "formats/quant.h"
#include "test_matrix.h"

/* uniform in [-1, 1) from the shared test stream */
static float rndf(void) { return (float)(rnd() >> 8) / 16777216.0f * 2.0f - 1.0f; }

static void test_exp(void) {
    double worst = 0;
    for (int i = 0; i <= 400000; i++) {
        const float x = -87.0f + 175.0f * (float)i / 400000.0f;
        const double ref = exp((double)x), got = silu_fixed_exp(x);
        const double rel = fabs(got - ref) / ref;
        if (rel > worst) worst = rel;
    }
    printf("silu_fixed_exp: max rel error %.3g over [-87, 88]\n", worst);
    CHECKF(worst <= 3e-7, "max rel %.3g", worst);
    CHECK(silu_fixed_exp(-87.5f) == 0.0f);
    CHECK(silu_fixed_exp(-INFINITY) == 0.0f);
    CHECK(isinf(silu_fixed_exp(88.5f)));
    CHECK(silu_fixed_exp(NAN) == 0.0f);
    CHECK(silu_fixed_exp(0.0f) == 1.0f);
    /* silu(g) * u at the ends: a large negative gate gives -0 * u, a large positive one g * u */
    CHECK(silu_fixed_mul(-200.0f, 1.0f) == 0.0f);
    CHECK(silu_fixed_mul(100.0f, 2.0f) == 200.0f);
    double wsilu = 0;
    for (int i = 0; i < 100000; i++) {
        const float g = rndf() * 30.0f, u = rndf() * 4.0f;
        const double ref = (double)g / (1.0 + exp(-(double)g)) * (double)u;
        const double d = fabs(silu_fixed_mul(g, u) - ref) / (fabs(ref) + 1e-30);
        if (fabs(ref) > 1e-30 && d > wsilu) wsilu = d;
    }
    printf("silu_fixed_mul: max rel error %.3g\n", wsilu);
    CHECKF(wsilu <= 6e-7, "max rel %.3g", wsilu);
}

/* k_mv_q's warp, literally: 32 lanes, iterations of `groups` blocks, the butterfly over all. */
static float warp_sim(uint32_t type, int64_t K, const uint8_t *w, const uint8_t *a) {
    const quant_traits *wt = quant_traits_of(type), *at = quant_traits_of(wt->act_type);
    const int B = (int)wt->block_elems, LPB = B / 32, BPI = 32 / LPB;
    const int nblk = (int)(K / B), iters = (nblk + BPI - 1) / BPI;
    float acc[32] = {0}, tmp[32];
    for (int it = 0; it < iters; it++)
        for (int lane = 0; lane < 32; lane++) {
            const int blk = it * BPI + lane / LPB;
            if (blk < nblk && lane % LPB == 0) {
                const float t = wt->dot(B, w + (size_t)blk * wt->block_bytes, a + (size_t)blk * at->block_bytes);
                acc[lane] = acc[lane] + t;
            }
        }
    for (int off = 16; off >= 1; off >>= 1) {
        for (int l = 0; l < 32; l++) tmp[l] = acc[l] + acc[l ^ off];
        memcpy(acc, tmp, sizeof acc);
    }
    return acc[0];
}

static const uint32_t TYPES[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL,
                                 GGML_TYPE_MXFP4, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K,
                                 GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS,
                                 GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ4_XS};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

/* A random row of K values of type t (the reference encoder's output), into w. */
static void make_row(uint32_t t, int64_t K, uint8_t *w, float scale) {
    float *x = malloc((size_t)K * sizeof *x);
    for (int64_t i = 0; i < K; i++) x[i] = rndf() * scale;
    quant_traits_of(t)->quantize(x, w, K);
    free(x);
}

static int test_rows(void) {
    int compared = 0;
    const int64_t lens[] = {256, 512, 768, 2048, 4096};
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = TYPES[ti];
        const quant_traits *wt = quant_traits_of(t);
        CHECKF(device_rows_supported(t), "%s", wt->name);
        if (!device_rows_supported(t) || !wt->quantize) continue;
        const uint32_t act = wt->act_type;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int64_t K = lens[li];
            uint8_t *w = malloc(quant_row_bytes(t, K)), *a = malloc(quant_row_bytes(act, K));
            float *xa = malloc((size_t)K * sizeof *xa), *wd = malloc((size_t)K * sizeof *wd),
                  *ad = malloc((size_t)K * sizeof *ad);
            for (int rep = 0; rep < 4; rep++) {
                make_row(t, K, w, rep == 3 ? 1e-3f : 1.0f);
                for (int64_t i = 0; i < K; i++) xa[i] = rndf() * (rep == 2 ? 100.0f : 1.0f);
                quant_traits_of(act)->quantize(xa, a, K);
                const float got = device_row_dot(t, K, w, a), want = warp_sim(t, K, w, a);
                CHECKF(memcmp(&got, &want, sizeof got) == 0, "%s K %lld: %.9g vs warp %.9g", wt->name,
                       (long long)K, got, want);
                wt->dequantize(w, wd, K);
                quant_traits_of(act)->dequantize(a, ad, K);
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < K; i++) {
                    ref += (double)wd[i] * ad[i];
                    mag += fabs((double)wd[i] * ad[i]);
                }
                CHECKF(fabs(got - ref) <= 1e-5 * mag + 1e-30, "%s K %lld: %.9g vs double %.9g (mag %.3g)", wt->name,
                       (long long)K, got, ref, mag);
                compared++;
            }
            free(w);
            free(a);
            free(xa);
            free(wd);
            free(ad);
        }
    }
    return compared;
}

static void test_experts(void) {
    const struct {
        uint32_t g, u, d;
        int64_t E, F;
    } shapes[] = {{GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 512, 256},
                  {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q4_K, 256, 768},
                  {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 256, 96},
                  {GGML_TYPE_IQ4_XS, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4, 256, 64}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const device_expert_shape sh = {shapes[si].g, shapes[si].u, shapes[si].d, shapes[si].E, shapes[si].F};
        CHECK(device_experts_supported(&sh));
        const int n = 3;
        const size_t rg = quant_row_bytes(sh.type_gate, sh.E), ru = quant_row_bytes(sh.type_up, sh.E),
                     rd = quant_row_bytes(sh.type_down, sh.F);
        uint8_t *g = malloc(rg * sh.F * n), *u = malloc(ru * sh.F * n), *d = malloc(rd * sh.E * n);
        for (int64_t r = 0; r < sh.F * n; r++) {
            make_row(sh.type_gate, sh.E, g + r * rg, 1.0f);
            make_row(sh.type_up, sh.E, u + r * ru, 1.0f);
        }
        for (int64_t r = 0; r < sh.E * n; r++) make_row(sh.type_down, sh.F, d + r * rd, 1.0f);
        float *x = malloc((size_t)n * sh.E * sizeof *x), *y1 = malloc((size_t)n * sh.E * sizeof *y1),
              *y3 = malloc((size_t)n * sh.E * sizeof *y3);
        for (int64_t i = 0; i < n * sh.E; i++) x[i] = rndf();
        device_expert_job jobs[3];
        for (int j = 0; j < n; j++) {
            jobs[j].gate = g + (size_t)j * sh.F * rg;
            jobs[j].up = u + (size_t)j * sh.F * ru;
            jobs[j].down = d + (size_t)j * sh.E * rd;
            jobs[j].x = x + (size_t)(j % 2) * sh.E; /* two slots of one token, as in a decode step */
            jobs[j].y = y1 + (size_t)j * sh.E;
        }
        const size_t wb = device_experts_work_bytes(&sh, n);
        void *work = malloc(wb);
        threadpool *p1 = threadpool_new(1), *p3 = threadpool_new(3);
        CHECK(device_experts_run(p1, &sh, jobs, n, work, wb) == 0);
        for (int j = 0; j < n; j++) jobs[j].y = y3 + (size_t)j * sh.E;
        CHECK(device_experts_run(p3, &sh, jobs, n, work, wb) == 0);
        CHECKF(memcmp(y1, y3, (size_t)n * sh.E * sizeof *y1) == 0, "shape %zu: 1 vs 3 threads", si);
        CHECK(device_experts_run(p1, &sh, jobs, n, work, wb - 1) == -1); /* too little scratch */
        /* the serial composition */
        const uint32_t ag = quant_traits_of(sh.type_gate)->act_type, au = quant_traits_of(sh.type_up)->act_type,
                       ad = quant_traits_of(sh.type_down)->act_type;
        uint8_t *xg = malloc(quant_row_bytes(ag, sh.E)), *xu = malloc(quant_row_bytes(au, sh.E)),
                *hq = malloc(quant_row_bytes(ad, sh.F));
        float *h = malloc((size_t)sh.F * sizeof *h);
        int bad = 0;
        for (int j = 0; j < n; j++) {
            quant_traits_of(ag)->quantize(jobs[j].x, xg, sh.E);
            quant_traits_of(au)->quantize(jobs[j].x, xu, sh.E);
            for (int64_t r = 0; r < sh.F; r++)
                h[r] = silu_fixed_mul(device_row_dot(sh.type_gate, sh.E, jobs[j].gate + r * rg, xg),
                                      device_row_dot(sh.type_up, sh.E, jobs[j].up + r * ru, xu));
            quant_traits_of(ad)->quantize(h, hq, sh.F);
            for (int64_t r = 0; r < sh.E; r++) {
                const float want = device_row_dot(sh.type_down, sh.F, jobs[j].down + r * rd, hq);
                bad += memcmp(&want, &y1[(size_t)j * sh.E + r], sizeof want) != 0;
            }
        }
        CHECKF(bad == 0, "shape %zu: %d outputs differ from the serial composition", si, bad);
        printf("experts %s/%s/%s E %lld F %lld: %d jobs, 1 and 3 threads bit-identical, serial composition %s\n",
               quant_type_name(sh.type_gate), quant_type_name(sh.type_up), quant_type_name(sh.type_down),
               (long long)sh.E, (long long)sh.F, n, bad ? "DIFFERS" : "equal");
        threadpool_free(p1);
        threadpool_free(p3);
        free(work);
        free(g);
        free(u);
        free(d);
        free(x);
        free(y1);
        free(y3);
        free(xg);
        free(xu);
        free(hq);
        free(h);
    }
    /* float weights take another device kernel: not offered */
    const device_expert_shape f = {GGML_TYPE_F32, GGML_TYPE_F32, GGML_TYPE_F32, 256, 256};
    CHECK(!device_experts_supported(&f));
}

int main(void) {
    test_exp();
    const kernel_isa best = kernel_isa_best();
    for (int isa = KERNEL_ISA_SCALAR; isa <= (int)best; isa++) {
        kernel_isa_force((kernel_isa)isa);
        const int n = test_rows();
        printf("%s: %d rows equal to the warp simulation\n", kernel_isa_name((kernel_isa)isa), n);
    }
    kernel_isa_force(best);
    test_experts();
    CHECK_DONE();
}
