/* The 16-key fold of the 512-bit attention and float tiles (kernels_avx512.c,
 * kernels_avx512_float.c): AVX-512 code, included only by files compiled with its flags. */
#ifndef SLUICE_KERNELS_AVX512_FOLD_H
#define SLUICE_KERNELS_AVX512_FOLD_H

#include <immintrin.h>

/* The 16-lane fold of 16 keys' accumulators at once, by a transposing tree: each level adds the
 * same lane pairs as the reference's fold of one key (lane j += lane j + w, w = 8, 4, 2, 1), two keys'
 * halves per instruction. Lane i of the result is key i's folded dot. The shuffles stay inside
 * 128-bit quarters (w = 8, 4: whole quarters; w = 2, 1: within each) and one permutation at the
 * end puts key i in lane i, instead of a two-source lane permutation at every level (the 30B-A3B
 * shape's prefill attention 7% faster on Zen 5: docs/kernels.md). */
static inline __m512 fold16x16(__m512 *acc) {
    __m512 r[8], q4[4], o[2];
    for (int i = 0; i < 8; i++) /* w = 8: [key 2i, lanes 0-7 | key 2i+1, lanes 0-7] */
        r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0xee));
    for (int i = 0; i < 4; i++) /* w = 4: quarter k holds key 4i + k, lanes 0-3 */
        q4[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0x88),
                              _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0xdd));
    for (int i = 0; i < 2; i++) /* w = 2: quarter k holds keys 8i + k and 8i + 4 + k, lanes 0-1 */
        o[i] = _mm512_add_ps(_mm512_shuffle_ps(q4[2 * i], q4[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(q4[2 * i], q4[2 * i + 1], 0xee));
    /* w = 1: lane 4k + m holds key k + 4m */
    const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(o[0], o[1], 0x88), _mm512_shuffle_ps(o[0], o[1], 0xdd));
    const __m512i to_key = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(to_key, f);
}

#endif
