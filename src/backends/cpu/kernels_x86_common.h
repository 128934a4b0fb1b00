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

/* The 128 sign patterns of quant_ksigns_iq2xs as 8 bytes of +1 / -1 (0x01 / 0xff), one per
 * element, ready for _mm256_sign_epi8 (IQ2_XS and IQ3_XXS signs); kernels.c fills it before any
 * level registers. */
extern uint64_t kernels_ksigns_pm1[128];

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

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15) then high ones (16..31). */
static inline __m256i nibbles32(const uint8_t *p) {
    __m128i q = ldu128(p);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* Byte mask from 32 bits: 0xff in byte k where bit k of mask is set (byte k takes the byte of
 * the mask that holds bit k, then tests bit k % 8). */
static inline __m256i mask_bytes32(uint32_t mask) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)mask), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits);
}

/* +1 / -1 bytes from 32 explicit sign bits (bit k: value k negative), for _mm256_sign_epi8 */
static inline __m256i signs_pm1(uint32_t mask) { return _mm256_or_si256(mask_bytes32(mask), _mm256_set1_epi8(1)); }

/* Q5 fifth bits: bit j of the 32-bit qh becomes 0x10 in byte j. */
static inline __m256i q5_high(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    return _mm256_and_si256(mask_bytes32(h), _mm256_set1_epi8(0x10));
}

/* Eight vectors' eight lanes each summed: lane r of the result is the sum of v[r] (exact:
 * integers). Horizontal adds, then the 128-bit halves added and joined by one insert: a
 * lane-crossing vperm2i128 is eight micro-ops on Zen 1. */
static inline __m256i hadd8_i32(const __m256i v[8]) {
    const __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    const __m128i r03 = _mm_add_epi32(_mm256_castsi256_si128(q0), _mm256_extracti128_si256(q0, 1));
    const __m128i r47 = _mm_add_epi32(_mm256_castsi256_si128(q1), _mm256_extracti128_si256(q1, 1));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(r03), r47, 1);
}

/* Sub-block scale vectors: with the 16 int16 scales of a super-block in sc (lane 0: scales
 * 0..7, lane 1: 8..15), the vector [scale 2j x8 | scale 2j+1 x8] for the j-th 32 elements. */
static inline __m256i scale_pair(__m256i sc, int j) {
    __m256i v = _mm256_permutevar8x32_epi32(sc, _mm256_set1_epi32(j)); /* dword j everywhere */
    const __m256i m = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3,
                                       2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(v, m);
}

/* Words from bytes in one in-lane shuffle (no lane-crossing permute, which costs 2-3 micro-ops on
 * Zen 1): with sixteen bytes broadcast to both lanes in b, every word of the low lane becomes byte
 * lo and every word of the high lane byte hi, zero-extended. lo and hi are constants where the
 * callers' loops unroll. */
static inline __m256i lane_words_u8(__m256i b, int lo, int hi) {
    const uint64_t l = (uint64_t)(0x8000u | (unsigned)lo) * 0x0001000100010001ull,
                   h = (uint64_t)(0x8000u | (unsigned)hi) * 0x0001000100010001ull;
    return _mm256_shuffle_epi8(b, _mm256_setr_epi64x((long long)l, (long long)l, (long long)h, (long long)h));
}

/* The same from words (signed scales, widened once a super-block half): with eight words
 * broadcast to both lanes in w, every word of the low lane becomes word lo and every word of the
 * high lane word hi. (Bytes sign-extended per use, a shuffle and an arithmetic shift each, were
 * slower: one token Q6_K 8.2 -> 8.9 GB/s, Q3_K 3.35 -> 3.94 with this, Zen 1, 2026-12-05.) */
static inline __m256i lane_words_w(__m256i w, int lo, int hi) {
    const uint64_t l = (uint64_t)(((unsigned)(2 * lo + 1) << 8) | (unsigned)(2 * lo)) * 0x0001000100010001ull,
                   h = (uint64_t)(((unsigned)(2 * hi + 1) << 8) | (unsigned)(2 * hi)) * 0x0001000100010001ull;
    return _mm256_shuffle_epi8(w, _mm256_setr_epi64x((long long)l, (long long)l, (long long)h, (long long)h));
}

/* Q3_K's sixteen signed 6-bit scales as bytes (q3k_scales8) or words (q3k_scales16): low nibbles from bytes 0..7 (low then high
 * nibbles), top two bits from bytes 8..11 at bit pairs 0..3 (one pair per group of four). */
static inline __m128i q3k_scales8(const uint8_t *p) {
    uint32_t u[3];
    memcpy(u, p, 12);
    const uint32_t nib = 0x0f0f0f0fu, two = 0x03030303u;
    uint32_t v0 = (u[0] & nib) | ((u[2] & two) << 4);
    uint32_t v1 = (u[1] & nib) | (((u[2] >> 2) & two) << 4);
    uint32_t v2 = ((u[0] >> 4) & nib) | (((u[2] >> 4) & two) << 4);
    uint32_t v3 = ((u[1] >> 4) & nib) | (((u[2] >> 6) & two) << 4);
    return _mm_sub_epi8(_mm_setr_epi32((int)v0, (int)v1, (int)v2, (int)v3), _mm_set1_epi8(32));
}

static inline __m256i q3k_scales16(const uint8_t *p) { return _mm256_cvtepi8_epi16(q3k_scales8(p)); }

/* Q6_K codes q + 32 (0..63) of elements 128h .. 128h + 127 as four vectors of 32: u[a] holds
 * elements 128h + 32a + 0..31, low four bits from ql (low nibbles of its first / second 32 bytes
 * for a = 0 / 1, high nibbles for 2 / 3), top two from qh bits 2a, 2a + 1 (quant_kquants.c). */
static inline void q6k_codes_half(const uint8_t *x, int h, __m256i u[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const __m256i ql0 = ldu(x + 64 * h), ql1 = ldu(x + 64 * h + 32), qh = ldu(x + 128 + 32 * h);
    u[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
    u[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
    u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
    u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
}

/* Scales and mins of a Q4_K/Q5_K super-block as 16 words: 0..7 scales, 8..15 mins. The 12
 * packed bytes as three little-endian u32 u0..u2: scales 0..3 / mins 0..3 are the low six bits
 * of the bytes of u0 / u1; scales 4..7 take their low nibble from u2's low nibbles and their top
 * two bits from the top of u0's bytes; mins 4..7 likewise from u2's high nibbles and u1. */
static inline __m128i k4_scales8(const uint8_t *p);

static inline __m256i k4_scales16(const uint8_t *p) { return _mm256_cvtepu8_epi16(k4_scales8(p)); }

/* The same as 16 bytes (k4_scales16's words before widening). */
static inline __m128i k4_scales8(const uint8_t *p) {
    /* dwords [s0, s1, m0, m1] with s0 = u0 & 0x3f.., m0 = u1 & 0x3f..,
     * s1 = (u2 & 0x0f..) | ((u0 >> 2) & 0x30..), m1 = ((u2 >> 4) & 0x0f..) | ((u1 >> 2) & 0x30..):
     * ((u >> 6) & 3) << 4 is (u >> 2) & 0x30 per byte. The 16-byte load reads 4 bytes past the
     * 12 scale bytes, inside the super-block (its quants follow). */
    const __m128i u = _mm_loadu_si128((const __m128i *)p);
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(u, 0x98), _mm_setr_epi32(0, 0, 0, 4)), /* u0 u2 u1 u2>>4 */
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(u, 0x50), 2), /* u0 u0 u1 u1, >> 2 */
                                     _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* kernel_exp_s on 8 lanes: the same operations, so the same bits (the attention kernels). */
static inline __m256 exp_s8(__m256 x) {
    __m256 valid = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693145751953125f))),
                             _mm256_mul_ps(n, _mm256_set1_ps(1.42860677e-06f)));
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(0.5f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), valid);
}

/* The attention's score dot: fused multiply-adds in 16 lanes (i mod 16), folded 8, 4, 2, 1; n a
 * multiple of 16 (kernels.h) */
static inline float attn_dot16(const float *a, const float *b, int n) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
    }
    __m256 t = _mm256_add_ps(lo, hi);
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    u = _mm_add_ps(u, _mm_movehl_ps(u, u));
    u = _mm_add_ss(u, _mm_shuffle_ps(u, u, 1));
    return _mm_cvtss_f32(u);
}

#endif
