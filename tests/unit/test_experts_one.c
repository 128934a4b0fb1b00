/* The CPU backend's experts_one (a MoE layer's SwiGLU experts of one token in two dispatches)
 * against the ops it stands for: for every expert, matmul_swiglu then matmul, bit for bit.
 * Experts of mixed types (a shared expert's types differ from the routed ones'), 1..16
 * experts, 1 and 2 threads, on the dots and on the tile kernels that run at one token (Q2_0,
 * Q8_0, MXFP4, Q4_K, ...); and it declines what it must not take (a gate and an up that cannot
 * share one encoding, more than 16 experts) without touching the outputs. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/cpu/kernels.h"
#include "check.h"
#include "test_matrix.h"
#include "formats/quant.h"

typedef struct expert {
    tview gate, up, down;
} expert;

/* Whether a gate of type a and an up of type b share one token's encoding: both on the dot
 * path, or both through tile kernels that pack the activations alike (ops.c's
 * gu_shared_encoding); experts_one takes them only then. */
static bool one_token_encoding_shared(uint32_t a, uint32_t b) {
    const kernel_tile *ta = kernel_tile_of(a), *tb = kernel_tile_of(b);
    const bool tiled_a = ta && ta->min_toks == 1, tiled_b = tb && tb->min_toks == 1;
    return tiled_a == tiled_b && (!tiled_a || ta->pack == tb->pack);
}

/* the up matrix's type: the gate's, unless up_type is set (a case that must be declined) */
static uint32_t up_type = GGML_TYPE_COUNT;

static expert make_expert(uint32_t tg, uint32_t td, int64_t dim, int64_t ff) {
    return (expert){make_matrix(tg, dim, ff), make_matrix(up_type < GGML_TYPE_COUNT ? up_type : tg, dim, ff),
                    make_matrix(td, ff, dim)};
}

static void free_expert(expert *e) {
    free((void *)e->gate.data);
    free((void *)e->up.data);
    free((void *)e->down.data);
}

/* ne experts (the last of types tg_last/td_last, like a shared expert) through experts_one and
 * through the separate ops; expect_taken: whether experts_one must take them. */
static void run_case(backend *be, int ne, uint32_t tg, uint32_t td, uint32_t tg_last, uint32_t td_last, int64_t dim,
                     int64_t ff, bool expect_taken) {
    expert ex[20];
    const tview *gv[20] = {0}, *uv[20] = {0}, *dv[20] = {0}; /* filled up to ne */
    float *one[20] = {0}, *ref[20] = {0};
    float *x = malloc(sizeof(float) * (size_t)dim), *mid = malloc(sizeof(float) * (size_t)ff);
    for (int64_t i = 0; i < dim; i++) x[i] = rnd_unit();
    for (int i = 0; i < ne; i++) {
        ex[i] = i == ne - 1 ? make_expert(tg_last, td_last, dim, ff) : make_expert(tg, td, dim, ff);
        gv[i] = &ex[i].gate, uv[i] = &ex[i].up, dv[i] = &ex[i].down;
        one[i] = malloc(sizeof(float) * (size_t)dim);
        ref[i] = malloc(sizeof(float) * (size_t)dim);
        for (int64_t k = 0; k < dim; k++) one[i][k] = -7.0f; /* declined: must stay untouched */
        be_matmul_swiglu(be, gv[i], uv[i], x, 1, mid);
        be_matmul(be, dv[i], mid, 1, ref[i]);
    }
    const bool taken = be->ops->experts_one(be, ne, gv, uv, dv, x, one);
    CHECKF(taken == expect_taken, "%d experts of %s/%s (last %s/%s): experts_one %s", ne, quant_traits_of(tg)->name,
           quant_traits_of(td)->name, quant_traits_of(tg_last)->name, quant_traits_of(td_last)->name,
           taken ? "took them" : "declined");
    for (int i = 0; i < ne; i++) {
        if (taken)
            CHECKF(!memcmp(one[i], ref[i], sizeof(float) * (size_t)dim), "expert %d of %d (%s/%s, %d threads): not the bits of matmul_swiglu + matmul",
                   i, ne, quant_traits_of(gv[i]->type)->name, quant_traits_of(dv[i]->type)->name, be->n_threads);
        else
            for (int64_t k = 0; k < dim; k++) CHECK(one[i][k] == -7.0f);
        free_expert(&ex[i]);
        free(one[i]);
        free(ref[i]);
    }
    free(x);
    free(mid);
}

int main(void) {
    for (int threads = 1; threads <= 2; threads++) {
        backend *be = backend_cpu_new(threads);
        CHECK(be && be->ops->experts_one);
        if (!be || !be->ops->experts_one) CHECK_DONE();
        /* the model files' expert shapes scaled down (K-quant rows: multiples of 256 values) */
        run_case(be, 1, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 512, 256, true);
        run_case(be, 9, GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, 512, 256, true);
        run_case(be, 11, GGML_TYPE_Q5_K, GGML_TYPE_IQ4_XS, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 512, 256, true);
        run_case(be, 16, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_F32, GGML_TYPE_F16, 256, 64, true);
        /* tile kernels at one token (AVX-512: Q2_0, the 32-value block types, Q4_K and Q5_K) */
        run_case(be, 16, GGML_TYPE_Q4_1, GGML_TYPE_Q5_1, GGML_TYPE_F32, GGML_TYPE_BF16, 256, 64, true);
        run_case(be, 4, GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, GGML_TYPE_Q2_0, GGML_TYPE_Q2_0, 512, 256, true);
        run_case(be, 9, GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, GGML_TYPE_Q6_K, 512, 256, true);
        run_case(be, 16, GGML_TYPE_MXFP4, GGML_TYPE_Q4_0, GGML_TYPE_F32, GGML_TYPE_BF16, 256, 64, true);
        run_case(be, 10, GGML_TYPE_Q5_K, GGML_TYPE_Q4_K, GGML_TYPE_IQ4_NL, GGML_TYPE_Q5_0, 256, 768, true);
        /* declined: a gate and an up of different activation formats, or one tiled at one token
         * and the other not; too many experts */
        up_type = GGML_TYPE_Q8_0;
        run_case(be, 3, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 256, 256, false);
        up_type = GGML_TYPE_Q6_K;
        run_case(be, 3, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 256, 256,
                 one_token_encoding_shared(GGML_TYPE_Q4_K, GGML_TYPE_Q6_K));
        up_type = GGML_TYPE_COUNT;
        run_case(be, 17, GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, 256, 256, false);
        be_free(be);
    }
    if (!check_failures) printf("test_experts_one: all checks passed\n");
    CHECK_DONE();
}
