/* times the GDN recurrence's row passes as gdn_head_recurrent drives them: H heads of Dv x Dk
 * state, T tokens, one thread; prints ns per head-token and a checksum of the state */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/cpu/kernels.h"
static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    const int H = 16, Dk = 128, Dv = 128, T = argc > 1 ? atoi(argv[1]) : 256;
    float *S = aligned_alloc(64, sizeof(float) * H * Dv * Dk);
    float *k = aligned_alloc(64, sizeof(float) * T * Dk), *q = aligned_alloc(64, sizeof(float) * T * Dk);
    float *v = aligned_alloc(64, sizeof(float) * T * Dv), *o = aligned_alloc(64, sizeof(float) * T * Dv);
    uint32_t x = 1;
    for (int i = 0; i < H * Dv * Dk; i++) { x = x * 1664525u + 1013904223u; S[i] = (x >> 8) * (1.0f / 16777216.0f) - 0.5f; }
    for (int i = 0; i < T * Dk; i++) { x = x * 1664525u + 1013904223u; k[i] = (x >> 8) * (1.0f / 16777216.0f) - 0.5f; q[i] = k[i] * 0.7f; }
    for (int i = 0; i < T * Dv; i++) { x = x * 1664525u + 1013904223u; v[i] = (x >> 8) * (1.0f / 16777216.0f) - 0.5f; }
    kernel_decay_dot4_fn d4 = kernel_gdn_decay_dot4();
    kernel_update_dot4_fn u4 = kernel_gdn_update_dot4();
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        for (int h = 0; h < H; h++) {
            float *Sh = S + (size_t)h * Dv * Dk;
            for (int t = 0; t < T; t++) {
                const float *kt = k + (size_t)t * Dk, *qt = q + (size_t)t * Dk;
                for (int j = 0; j < Dv; j += 4) {
                    float m[4], d[4];
                    d4(Dk, Sh + (size_t)j * Dk, Dk, 0.99f, kt, m);
                    for (int r = 0; r < 4; r++) d[r] = (v[t * Dv + j + r] - m[r]) * 0.5f;
                    u4(Dk, Sh + (size_t)j * Dk, Dk, d, kt, qt, o + (size_t)t * Dv + j);
                }
            }
        }
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    uint64_t hsh = 1469598103934665603ull;
    const uint8_t *b = (const uint8_t *)S;
    for (size_t i = 0; i < sizeof(float) * H * Dv * Dk; i++) hsh = (hsh ^ b[i]) * 1099511628211ull;
    for (size_t i = 0; i < sizeof(float) * T * Dv; i++) hsh = (hsh ^ ((const uint8_t *)o)[i]) * 1099511628211ull;
    printf("%s: %.1f ns per head-token (best of 5), state+out hash %016llx\n", kernel_isa_name(kernel_isa_current()), best * 1e9 / (H * T), (unsigned long long)hsh);
    return 0;
}
