/* The driver of the Q6_K_R16 kernel numbers (bench/results/2026-12-02-mtp-vocab.md): both tiles
 * on the same random Q6_K rows (n = 2560), best of 5 x reps, one thread. Built against the
 * library: gcc -O2 -march=native -I src -I include r16_driver.c build/libsluice.a -lm -lpthread
 * -lcrypto -lpcre2-8; run: ./a.out ROWS REPS (65536 3: a 137 MB matrix from memory). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/cpu/kernels.h"
#include "formats/quant.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
int main(int argc, char **argv) {
    const int64_t n = 2560; const int rows = argc > 1 ? atoi(argv[1]) : 1024; const int reps = argc > 2 ? atoi(argv[2]) : 50;
    const size_t ws = quant_row_bytes(GGML_TYPE_Q6_K, n), as = quant_row_bytes(GGML_TYPE_Q8_K, n);
    uint8_t *w = malloc(ws * rows), *g = malloc(ws * rows), *a = malloc(as * 4);
    float *x = malloc(n * 4), *out = malloc(4 * rows * 4);
    srand(1);
    for (int i = 0; i < rows; i++) { for (int k = 0; k < n; k++) x[k] = (float)rand() / RAND_MAX - 0.5f; quant_traits_of(GGML_TYPE_Q6_K)->quantize(x, w + i * ws, n); }
    for (int t = 0; t < 4; t++) { for (int k = 0; k < n; k++) x[k] = (float)rand() / RAND_MAX - 0.5f; quant_traits_of(GGML_TYPE_Q8_K)->quantize(x, a + t * as, n); }
    for (int k = 0; k < rows / 16; k++) quant_repack_q6_k_r16(w + k * 16 * ws, ws, g + k * 16 * ws, n);
    const kernel_tile *tr = kernel_tile_of(SLUICE_TYPE_Q6_K_R16), *tk = kernel_tile_of(GGML_TYPE_Q6_K);
    for (int toks = 1; toks <= 4; toks++) {
        void *pr = aligned_alloc(64, (tr->packed_bytes(n, toks) + 63) / 64 * 64), *pk = aligned_alloc(64, (tk->packed_bytes(n, toks) + 63) / 64 * 64);
        tr->pack(n, a, as, toks, 0, toks, pr); tk->pack(n, a, as, toks, 0, toks, pk);
        double best_r = 1e9, best_k = 1e9;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = now(); for (int i = 0; i < reps; i++) tr->run(n, g, ws, rows, pr, toks, out, rows); double t1 = now();
            for (int i = 0; i < reps; i++) tk->run(n, w, ws, rows, pk, toks, out, rows); double t2 = now();
            if (t1 - t0 < best_r) best_r = t1 - t0; if (t2 - t1 < best_k) best_k = t2 - t1;
        }
        const double rsb = (double)rows * (n / 256) * reps;
        printf("toks %d: r16 %.2f ns/row-sb, krows %.2f ns/row-sb\n", toks, best_r / rsb * 1e9, best_k / rsb * 1e9);
    }
    return 0;
}
