/* What the AVX2 rows-in-lanes tiles (kernels_avx2_krows.c, kernels_avx2_b32.c) share: a group
 * of eight weight rows, the next group's rows to prefetch, and the store of a pass's sums.
 * Include after kernels_x86_common.h, from units compiled with AVX2. */
#ifndef SLUICE_KERNELS_AVX2_ROWS8_H
#define SLUICE_KERNELS_AVX2_ROWS8_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define AVX2_ROWS8 8

/* Rows r0 .. r0 + 7 of w into wr (past the last row, the last row again: computed, not stored)
 * and the group after them into nx (likewise clamped). Returns how many rows are real. */
static inline int avx2_rows8_at(const void *w, size_t w_stride, int rows, int r0, const uint8_t *wr[AVX2_ROWS8],
                                const uint8_t *nx[AVX2_ROWS8]) {
    const int nr = rows - r0 < AVX2_ROWS8 ? rows - r0 : AVX2_ROWS8;
    for (int r = 0; r < AVX2_ROWS8; r++) {
        wr[r] = (const uint8_t *)w + (size_t)(r0 + (r < nr ? r : nr - 1)) * w_stride;
        const int rn = r0 + AVX2_ROWS8 + r < rows ? r0 + AVX2_ROWS8 + r : rows - 1;
        nx[r] = (const uint8_t *)w + (size_t)rn * w_stride;
    }
    return nr;
}

/* Token t's sums (lane r: row r) to out row t0 + t, columns r0 .. r0 + nr - 1. */
static inline void avx2_rows8_store(const __m256 *acc, int tn, int nr, float *out, size_t out_stride, int t0, int r0) {
    for (int t = 0; t < tn; t++) {
        float v[AVX2_ROWS8];
        _mm256_storeu_ps(v, acc[t]);
        memcpy(out + (size_t)(t0 + t) * out_stride + r0, v, (size_t)nr * sizeof(float));
    }
}

#endif
