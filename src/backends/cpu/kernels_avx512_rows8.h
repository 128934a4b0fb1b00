/* The row groups of the rows-in-lanes tiles (kernels_avx512_q2_0.c, kernels_avx512_b32.c):
 * eight weight rows whose sums share one reduction tree, rows past the matrix repeating its last
 * row (their lanes never stored), and the next group's bytes for the prefetch that runs ahead
 * of the first token pass. */
#ifndef SLUICE_KERNELS_AVX512_ROWS8_H
#define SLUICE_KERNELS_AVX512_ROWS8_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define ROWS8 8

typedef struct rows8 {
    int nr;                      /* real rows in the group (1..8) */
    const uint8_t *w0;           /* the group's first row */
    const uint8_t *wr[ROWS8];    /* row r, or the last real row for r >= nr */
    const uint8_t *next;         /* the next group's first row, or NULL after the last group */
    size_t next_bytes;           /* its rows' bytes */
} rows8;

static inline rows8 rows8_at(const void *w, size_t w_stride, int rows, int r0) {
    rows8 g;
    g.nr = rows - r0 < ROWS8 ? rows - r0 : ROWS8;
    g.w0 = (const uint8_t *)w + (size_t)r0 * w_stride;
    for (int r = 0; r < ROWS8; r++) g.wr[r] = g.w0 + (size_t)(r < g.nr ? r : g.nr - 1) * w_stride;
    const int next_rows = rows - r0 - g.nr < ROWS8 ? rows - r0 - g.nr : ROWS8;
    g.next = next_rows > 0 ? g.w0 + (size_t)g.nr * w_stride : NULL;
    g.next_bytes = next_rows > 0 ? (size_t)next_rows * w_stride : 0;
    return g;
}

/* One token's 64 activation bytes against the group's eight rows of 64 weight bytes:
 * s[r] = vpdpbusd(0, w[r], a) (16 dword sums of 4 products each, for the group's tree). */
static inline __attribute__((always_inline)) void rows8_dpbusd(const __m512i w[ROWS8], const uint8_t *a,
                                                               __m512i s[ROWS8]) {
    const __m512i av = _mm512_loadu_si512((const void *)a);
#pragma GCC unroll 8
    for (int r = 0; r < ROWS8; r++) s[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[r], av);
}

/* Rows r0 .. r0 + nr - 1 of token row o from a group's 16 sums, row r in lane lane_of[r]. */
static inline void rows8_store(const float v[16], const int lane_of[ROWS8], int nr, float *o) {
    for (int r = 0; r < nr; r++) o[r] = v[lane_of[r]];
}

#endif
