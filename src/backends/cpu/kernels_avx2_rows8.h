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

/* Eight f16 values, one at byte `at` of each row wr[r] (lane r), as floats: one 32-bit load a
 * row, from `at` or, with high set, from at - 2 (where a load from `at` would pass the block's
 * end), the words met in two 128-bit registers and the halves packed. Copying them to the stack
 * as 2-byte values and reading those back as one 16-byte load stalls on store forwarding: for
 * the K-quants +5-10% one token without it (2026-12-05). The word's other f16 comes back in
 * *other (NULL: not wanted): the two bytes after `at`, or with high set the two before it. */
static inline __m256 avx2_rows8_f16(const uint8_t *const wr[AVX2_ROWS8], size_t at, int high, __m256 *other) {
    __m128i w[AVX2_ROWS8];
    const size_t from = high ? at - 2 : at;
    for (int r = 0; r < AVX2_ROWS8; r++) {
        int32_t v;
        memcpy(&v, wr[r] + from, 4);
        w[r] = _mm_cvtsi32_si128(v);
    }
    const __m128i lo = _mm_unpacklo_epi64(_mm_unpacklo_epi32(w[0], w[1]), _mm_unpacklo_epi32(w[2], w[3]));
    const __m128i hi = _mm_unpacklo_epi64(_mm_unpacklo_epi32(w[4], w[5]), _mm_unpacklo_epi32(w[6], w[7]));
    const __m128i m16 = _mm_set1_epi32(0xffff);
    const __m128i llo = _mm_and_si128(lo, m16), lhi = _mm_and_si128(hi, m16);
    const __m128i hlo = _mm_srli_epi32(lo, 16), hhi = _mm_srli_epi32(hi, 16);
    if (other) *other = _mm256_cvtph_ps(high ? _mm_packus_epi32(llo, lhi) : _mm_packus_epi32(hlo, hhi));
    return _mm256_cvtph_ps(high ? _mm_packus_epi32(hlo, hhi) : _mm_packus_epi32(llo, lhi));
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
