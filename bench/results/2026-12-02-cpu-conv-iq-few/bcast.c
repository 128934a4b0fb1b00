/* vpdpbusd throughput with (a) 4 rows x 2 blocks: per quad 2 act loads + 4 dword broadcasts + 8 dpbusd
 * and (b) 2 rows x 4 blocks: per quad 4 act loads + 2 broadcasts + 8 dpbusd; (c) 4 rows x 4 blocks */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static _Alignas(64) uint8_t A[4][64 * 64];   /* 4 token blocks x 64 quads */
static _Alignas(64) int32_t Q[4][64];        /* 4 rows x 64 quads */
__attribute__((noinline)) static __m512i run_a(int reps) {
    __m512i p[4][2] = {{0}};
    for (int k = 0; k < reps; k++)
        for (int i = 0; i < 64; i++) {
            const __m512i a0 = _mm512_load_si512(A[0] + 64 * i), a1 = _mm512_load_si512(A[1] + 64 * i);
            _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {
                const __m512i b = _mm512_set1_epi32(Q[r][i]);
                p[r][0] = _mm512_dpbusd_epi32(p[r][0], b, a0);
                p[r][1] = _mm512_dpbusd_epi32(p[r][1], b, a1);
            }
        }
    __m512i s = _mm512_setzero_si512();
    for (int r = 0; r < 4; r++) s = _mm512_add_epi32(s, _mm512_add_epi32(p[r][0], p[r][1]));
    return s;
}
__attribute__((noinline)) static __m512i run_b(int reps) {
    __m512i p[2][4] = {{0}};
    for (int k = 0; k < reps; k++)
        for (int i = 0; i < 64; i++) {
            __m512i a[4];
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) a[t] = _mm512_load_si512(A[t] + 64 * i);
            _Pragma("GCC unroll 4") for (int r = 0; r < 2; r++) {
                const __m512i b = _mm512_set1_epi32(Q[r][i]);
                _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) p[r][t] = _mm512_dpbusd_epi32(p[r][t], b, a[t]);
            }
        }
    __m512i s = _mm512_setzero_si512();
    for (int r = 0; r < 2; r++) for (int t = 0; t < 4; t++) s = _mm512_add_epi32(s, p[r][t]);
    return s;
}
__attribute__((noinline)) static __m512i run_c(int reps) {
    __m512i p[4][4] = {{0}};
    for (int k = 0; k < reps; k++)
        for (int i = 0; i < 64; i++) {
            __m512i a[4];
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) a[t] = _mm512_load_si512(A[t] + 64 * i);
            _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {
                const __m512i b = _mm512_set1_epi32(Q[r][i]);
                _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) p[r][t] = _mm512_dpbusd_epi32(p[r][t], b, a[t]);
            }
        }
    __m512i s = _mm512_setzero_si512();
    for (int r = 0; r < 4; r++) for (int t = 0; t < 4; t++) s = _mm512_add_epi32(s, p[r][t]);
    return s;
}
int main(void) {
    for (int i = 0; i < 4 * 64 * 64; i++) ((uint8_t *)A)[i] = (uint8_t)(i * 7);
    for (int i = 0; i < 4 * 64; i++) ((int32_t *)Q)[i] = i * 13;
    const int reps = 200000;
    for (int round = 0; round < 3; round++) {
        double t0 = now(); __m512i s = run_a(reps); double ta = now() - t0;
        t0 = now(); s = _mm512_add_epi32(s, run_b(reps)); double tb = now() - t0;
        t0 = now(); s = _mm512_add_epi32(s, run_c(reps)); double tc = now() - t0;
        printf("G dpbusd/s: 4rx2b %.2f  2rx4b %.2f  4rx4b %.2f  (%d)\n", 8.0 * 64 * reps / ta * 1e-9, 8.0 * 64 * reps / tb * 1e-9,
               16.0 * 64 * reps / tc * 1e-9, _mm512_reduce_add_epi32(s) & 1);
    }
    return 0;
}
