/* The row groups of the rows-in-lanes tiles (kernels_avx512_krows.c, kernels_avx512_b32.c):
 * eight weight rows whose sums share one reduction tree, rows past the matrix repeating its last
 * row (their lanes never stored), and the bytes of the group two ahead for the prefetch that
 * runs in the first token pass.
 *
 * The one-token products read their rows from DRAM as fast as the rows are asked for ahead
 * (kernels_avx512_krows.c measured it on Zen 4: the hardware prefetcher alone read eight
 * interleaved rows at ~11 GB/s, the next group asked for to L2 ~35, the group two ahead ~50; three
 * ahead no more): a group's first token pass prefetches the group two after it, and a range asks
 * for its second group whole before its first runs (rows8_prefetch_second; the first comes on
 * demand). */
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
    const uint8_t *ahead;        /* the first row of the group two ahead, or NULL past the end */
    size_t ahead_bytes;          /* its rows' bytes */
} rows8;

static inline rows8 rows8_at(const void *w, size_t w_stride, int rows, int r0) {
    rows8 g;
    g.nr = rows - r0 < ROWS8 ? rows - r0 : ROWS8;
    g.w0 = (const uint8_t *)w + (size_t)r0 * w_stride;
    for (int r = 0; r < ROWS8; r++) g.wr[r] = g.w0 + (size_t)(r < g.nr ? r : g.nr - 1) * w_stride;
    const int a0 = r0 + 2 * ROWS8, ahead_rows = rows - a0 < ROWS8 ? rows - a0 : ROWS8;
    g.ahead = ahead_rows > 0 ? (const uint8_t *)w + (size_t)a0 * w_stride : NULL;
    g.ahead_bytes = ahead_rows > 0 ? (size_t)ahead_rows * w_stride : 0;
    return g;
}

static inline void rows8_prefetch_second(const void *w, size_t w_stride, int rows) {
    if (rows <= ROWS8) return;
    const int n = rows - ROWS8 < ROWS8 ? rows - ROWS8 : ROWS8;
    const char *s = (const char *)w + (size_t)ROWS8 * w_stride;
    for (size_t o = 0; o < (size_t)n * w_stride; o += 64) _mm_prefetch(s + o, _MM_HINT_T1);
}

/* Byte offsets, from the group's first row, of what rows8_reduce's lanes hold: dword i is row
 * (i / 8) * 4 + i % 4 (a padding row reads the last real row) and block b + (i / 4) % 2 of
 * block_bytes bytes, plus `at` (the field a gather fetches). */
static inline __m512i rows8_pair_offsets(const rows8 *g, size_t w_stride, size_t block_bytes, size_t at) {
    int32_t off[16];
    for (int i = 0; i < 16; i++) {
        const int r = (i / 8) * 4 + i % 4, rr = r < g->nr ? r : g->nr - 1;
        off[i] = (int32_t)((size_t)rr * w_stride + (size_t)((i / 4) % 2) * block_bytes + at);
    }
    return _mm512_loadu_si512((const void *)off);
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

/* Eight vectors of vpdpbusd sums (row r: dwords 0-7 block b, 8-15 block b + 1) to one vector:
 * dwords 0-3 rows 0-3 of block b, 4-7 rows 0-3 of block b + 1, 8-11 rows 4-7 of block b,
 * 12-15 rows 4-7 of block b + 1. */
static inline __m512i rows8_reduce(const __m512i p[ROWS8]) {
    __m512i q[4], u[2];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) { /* per 128-bit lane: [a 0+1, a 2+3, b 0+1, b 2+3] */
        const __m512 a = _mm512_castsi512_ps(p[2 * j]), b = _mm512_castsi512_ps(p[2 * j + 1]);
        q[j] = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))),
                                _mm512_castps_si512(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))));
    }
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++) { /* per 128-bit lane: rows 4k .. 4k + 3, that lane's four dwords */
        const __m512 a = _mm512_castsi512_ps(q[2 * k]), b = _mm512_castsi512_ps(q[2 * k + 1]);
        u[k] = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))),
                                _mm512_castps_si512(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))));
    }
    /* lanes 0 + 1 hold block b, lanes 2 + 3 block b + 1 */
    return _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

#endif
