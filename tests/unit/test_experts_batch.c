/* The CPU backend's experts_batch (a batch's routed SwiGLU experts, each expert taken whole by
 * one thread) against the ops it stands for: per expert, its tokens' rows gathered, then
 * matmul_swiglu, matmul, and the rows scattered to their slots, bit for bit. Experts of the
 * model files' types (Q4_K/Q6_K, the IQ mix of the Q2_K_XL files, Q8_0), token counts on both
 * sides of the tile kernels' threshold, one expert with more tokens than a piece (split in two
 * pieces), 1 and 2 threads; slots no expert writes stay untouched; float weights are declined
 * without touching anything. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "check.h"
#include "test_matrix.h"
#include "formats/quant.h"

/* ne experts (gate tg, up tu, down td) on n tokens with k slots each; expert i gets m[i] of the
 * n * k entries (the others stay unrouted, their slots untouched); expect_taken as above. */
static void run_case(backend *be, int ne, const int *m, int n, int k, uint32_t tg, uint32_t tu, uint32_t td, int64_t dim,
                     int64_t ff, bool expect_taken) {
    tview g[8] = {0}, u[8] = {0}, d[8] = {0};
    const tview *gv[8] = {0}, *uv[8] = {0}, *dv[8] = {0}; /* filled up to ne */
    const int slots = n * k;
    float *x = malloc(sizeof(float) * (size_t)(n * dim)), *got = malloc(sizeof(float) * (size_t)(slots * dim)),
          *ref = malloc(sizeof(float) * (size_t)(slots * dim));
    int32_t *entries = malloc(sizeof(int32_t) * (size_t)slots);
    int offset[9] = {0};
    for (int64_t i = 0; i < n * dim; i++) x[i] = rnd_unit();
    for (int64_t i = 0; i < slots * dim; i++) got[i] = ref[i] = -7.0f;
    /* deal the entries out: expert i takes m[i] distinct entries, in increasing (token) order */
    uint8_t *used = calloc((size_t)slots, 1);
    for (int i = 0; i < ne; i++) {
        offset[i + 1] = offset[i] + m[i];
        for (int c = 0; c < m[i]; c++) {
            int e;
            do e = (int)(rnd() % (uint32_t)slots);
            while (used[e]);
            used[e] = 1;
            entries[offset[i] + c] = e;
        }
        for (int a = offset[i]; a < offset[i + 1]; a++) /* insertion sort: token order */
            for (int b = a; b > offset[i] && entries[b - 1] > entries[b]; b--) {
                int32_t t = entries[b];
                entries[b] = entries[b - 1];
                entries[b - 1] = t;
            }
        g[i] = make_matrix(tg, dim, ff), u[i] = make_matrix(tu, dim, ff), d[i] = make_matrix(td, ff, dim);
        gv[i] = &g[i], uv[i] = &u[i], dv[i] = &d[i];
    }
    /* the reference: the separate ops, expert by expert */
    float *xs = malloc(sizeof(float) * (size_t)(slots * dim)), *mid = malloc(sizeof(float) * (size_t)(slots * ff)),
          *ys = malloc(sizeof(float) * (size_t)(slots * dim));
    for (int i = 0; i < ne; i++) {
        const int *rows = entries + offset[i];
        for (int t = 0; t < m[i]; t++) memcpy(xs + (size_t)t * dim, x + (size_t)(rows[t] / k) * dim, sizeof(float) * (size_t)dim);
        if (m[i] == 0) continue;
        be_matmul_swiglu(be, gv[i], uv[i], xs, m[i], mid);
        be_matmul(be, dv[i], mid, m[i], ys);
        for (int t = 0; t < m[i]; t++) memcpy(ref + (size_t)rows[t] * dim, ys + (size_t)t * dim, sizeof(float) * (size_t)dim);
    }
    const bool taken = be->ops->experts_batch(be, ne, gv, uv, dv, x, (int)dim, k, entries, offset, got);
    CHECKF(taken == expect_taken, "%d experts %s/%s/%s: experts_batch %s", ne, quant_traits_of(tg)->name,
           quant_traits_of(tu)->name, quant_traits_of(td)->name, taken ? "took them" : "declined");
    if (taken)
        CHECKF(!memcmp(got, ref, sizeof(float) * (size_t)(slots * dim)),
               "%d experts %s/%s/%s, %d threads: not the bits of the separate ops", ne, quant_traits_of(tg)->name,
               quant_traits_of(tu)->name, quant_traits_of(td)->name, be->n_threads);
    else
        for (int64_t i = 0; i < slots * dim; i++) CHECK(got[i] == -7.0f);
    for (int i = 0; i < ne; i++) {
        free((void *)g[i].data);
        free((void *)u[i].data);
        free((void *)d[i].data);
    }
    free(x), free(got), free(ref), free(entries), free(used), free(xs), free(mid), free(ys);
}

int main(void) {
    test_rs = 0x2545f4914f6cdd1dull;
    for (int threads = 1; threads <= 2; threads++) {
        backend *be = backend_cpu_new(threads);
        CHECK(be && be->ops->experts_batch);
        if (!be || !be->ops->experts_batch) CHECK_DONE();
        /* token counts: the dot path (1-3), the tile (4 on), partial and full blocks of 16 */
        const int m1[6] = {1, 2, 3, 4, 17, 32};
        run_case(be, 6, m1, 20, 4, GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 512, 256, true);
        const int m2[5] = {16, 5, 33, 1, 9};
        run_case(be, 5, m2, 16, 4, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ4_XS, 512, 256, true);
        const int m3[3] = {7, 0, 12};
        run_case(be, 3, m3, 8, 3, GGML_TYPE_Q8_0, GGML_TYPE_Q5_K, GGML_TYPE_Q4_0, 256, 256, true);
        /* more entries than a piece (EB_CHUNK = 256): one expert in two pieces */
        const int m4[2] = {300, 20};
        run_case(be, 2, m4, 80, 4, GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 256, 256, true);
        /* float weights multiply x in place: declined */
        const int m5[2] = {5, 6};
        run_case(be, 2, m5, 4, 4, GGML_TYPE_F32, GGML_TYPE_F32, GGML_TYPE_Q6_K, 256, 64, false);
        be_free(be);
    }
    if (!check_failures) printf("test_experts_batch: all checks passed\n");
    CHECK_DONE();
}
