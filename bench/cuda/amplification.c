/* How far a rounding-level change travels through a model: the logits of the same prompt with
 * the Gated DeltaNet prefill in its two exact forms (the per-token recurrence and the chunked
 * form, which differ by ~3e-7 per call, test_gdn), CPU only, relative difference per position.
 * Used to tell amplification (a chaotic random-weight model) from a bug when two backends
 * disagree on a large synthetic file (bench/results/2026-11-29-cuda-h200.md).
 *
 *   gcc -O2 -std=gnu11 -Iinclude -Isrc bench/cuda/amplification.c build/libsluice.a \
 *       -lpcre2-8 -lcrypto -lz -luring -ljansson -lmicrohttpd -ldl -lm -lrt -lpthread \
 *       -o amplification          (add CUDA's libcudart_static.a when the build has CUDA)
 *   ./amplification MODEL.gguf    (a qwen35moe / qwen3next / qwen4exp file) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "sluice.h"
#include "models/hybrid.h"
#include "models/model.h"
#include "backends/backend.h"
/* all-position logits of one batch, the delta rule's prefill form chosen (0: recurrence) */
static float *run(const sluice_model *m, const int32_t *ids, int n, int chunk) {
    const int V = m->hp.n_vocab;
    backend *be = backend_cpu_new(2);
    model_state *st = be ? m->arch->state_new(m, be, n, n) : NULL;
    float *lg = malloc((size_t)n * V * sizeof *lg);
    if (!be || !st || !lg) abort();
    st->hybrid->gdn_chunk = chunk;
    if (m->arch->forward(m, st, be, ids, n, 0, lg, true) != 0) abort();
    m->arch->state_free(st);
    be_free(be);
    return lg;
}
int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: amplification MODEL.gguf\n");
        return 2;
    }
    sluice_model_params mp = {.no_watchdog = true, .n_ctx = 64};
    sluice_model *m = sluice_model_load(argv[1], &mp);
    if (!m) {
        fprintf(stderr, "amplification: %s\n", sluice_last_error());
        return 1;
    }
    if (m->hp.n_layer_recurrent == 0) {
        fprintf(stderr, "amplification: %s has no Gated DeltaNet layers\n", argv[1]);
        return 1;
    }
    int32_t ids[12] = {9707, 11, 1879, 525, 498, 30, 576, 374, 264, 1273, 315, 279};
    int n = 12, V = m->hp.n_vocab;
    float *a = run(m, ids, n, 0), *b = run(m, ids, n, 64);
    printf("recurrent vs chunked GDN prefill, relative difference by position:");
    for (int t = 0; t < n; t++) {
        const float *x = a + (size_t)t * V, *y = b + (size_t)t * V;
        double num = 0, den = 0;
        for (int i = 0; i < V; i++) {
            num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
            den += (double)x[i] * x[i];
        }
        printf(" %.2g", sqrt(num / (den > 0 ? den : 1)));
    }
    printf("\n");
    free(a);
    free(b);
    sluice_model_free(m);
    return 0;
}
