/* What every x86 kernel unit starts with: floating-point contraction off (each kernel repeats
 * its scalar reference's float steps exactly, docs/kernels.md) and the small load and reduction
 * helpers they share. Include first, from units compiled with at least AVX2 + F16C. */
#ifndef SLUICE_KERNELS_X86_COMMON_H
#define SLUICE_KERNELS_X86_COMMON_H

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline float ld_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h); /* exact, like quant_f16_to_f32 (NaNs quieted, payload kept) */
}

static inline float ld_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

static inline __m256i ldu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline __m128i ldu128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

#endif
