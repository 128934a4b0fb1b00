/* The I-quant super-blocks of the AVX2 tile (kernels_avx2_krows.c): IQ2_XS, IQ3_XXS and IQ4_XS
 * (the routed experts' types of the Q2_K_XL mix), IQ2_XXS, IQ2_S and IQ3_S, each decoded once for
 * up to four tokens.
 *
 * Why not the dots' decoders (kernels_x86.inc): IQ3_XXS gathered its grid entries with
 * vpgatherdd, and the dots rebuilt every scale per group and token; on a Zen 1 EPYC (AVX2 only,
 * 2026-12-04) one token of IQ3_XXS read 1.8 GB/s and IQ2_XS 3.0 GB/s on two threads where the
 * memory gives 19. Here the grid rows come in by scalar loads (two load ports, no microcoded
 * gather), a super-block's scales are built for all eight groups in a few vector steps, and the
 * per-token work of a group is one sign, one maddubs, one madd and one add.
 *
 * Exactness (the references are quant_dot_iq2_xxs ... _iq4_xs in formats/quant_iq.c):
 * each function leaves in the lanes of isum[t] the super-block's exact integer bsum / isum for
 * token t: per 16 (IQ2_XS) or 32 values, the magnitudes times the signed activations, times the
 * odd scale (2s + 1) or IQ4_XS's ls - 32. maddubs's pair sums stay below 2^15 (2 x 62 x 127, and
 * for IQ4_XS 2 x 127 x 127 with |code| <= 127); activations never hold -128, so flipping their
 * sign is exact. The caller does the float steps. Include after kernels_x86_common.h, from a
 * unit compiled with AVX2. */
#ifndef SLUICE_KERNELS_AVX2_IQ_H
#define SLUICE_KERNELS_AVX2_IQ_H

#include <stdint.h>
#include <string.h>

#include "formats/quant.h"

#define A2_IQ_TOKS 4 /* tokens a super-block is decoded for at most */

static inline uint64_t a2_ld_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Token t's activations of group g (32 values) with the group's signs (+1 / -1 bytes) applied,
 * against the group's magnitudes, scaled by scale (words), added to isum[t]. */
static inline __attribute__((always_inline)) void a2_iq_group(const uint8_t *const y[A2_IQ_TOKS], int tn, int g,
                                                              __m256i mag, __m256i sgn, __m256i scale,
                                                              __m256i isum[A2_IQ_TOKS]) {
#pragma GCC unroll 4
    for (int t = 0; t < tn; t++) {
        const __m256i a = _mm256_sign_epi8(ldu(y[t] + 4 + 32 * g), sgn);
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(mag, a), scale));
    }
}

/* The odd scales 2 s + 1 of eight scale bytes' nibbles (IQ2_XS, IQ2_S): bytes 0..7 from the low
 * nibbles (a group's first 16 values), 8..15 from the high ones, in both 128-bit lanes; group g's
 * scale words are lane_words_u8(S, g, 8 + g). */
static inline __m256i a2_odd_scales(const uint8_t *p) {
    const __m128i sc = _mm_loadl_epi64((const __m128i *)p), m4 = _mm_set1_epi8(0x0f);
    __m128i s = _mm_unpacklo_epi64(_mm_and_si128(sc, m4), _mm_and_si128(_mm_srli_epi16(sc, 4), m4));
    s = _mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1));
    return _mm256_broadcastsi128_si256(s);
}

/* +1 / -1 bytes of 32 values from four 7-bit sign indices (bits 0..27 of w; IQ2_XXS, IQ3_XXS) */
static inline __m256i a2_ksigns4(uint32_t w) {
    return _mm256_setr_epi64x((long long)kernels_ksigns_pm1[w & 127], (long long)kernels_ksigns_pm1[(w >> 7) & 127],
                              (long long)kernels_ksigns_pm1[(w >> 14) & 127], (long long)kernels_ksigns_pm1[(w >> 21) & 127]);
}

/* Eight groups' scales (dword g: a signed value of 16 bits) as word pairs [s, s] in out[g], for
 * _mm256_set1_epi32(out[g]) as a madd operand. */
static inline void a2_scale_words(__m256i v, int32_t out[8]) {
    v = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    _mm256_storeu_si256((__m256i *)out, _mm256_or_si256(v, _mm256_slli_epi32(v, 16)));
}

/* IQ2_XS (74 bytes: d | 32 x u16 (9-bit grid index, 7-bit sign index) | 8 scale bytes): group
 * g is four grid rows of eight magnitudes; its first 16 values take the low nibble of scale
 * byte g, the other 16 the high one. */
static inline __attribute__((always_inline)) void a2_iq2_xs_block(const uint8_t *x, const uint8_t *const y[A2_IQ_TOKS],
                                                                  int tn, __m256i isum[A2_IQ_TOKS]) {
    const uint64_t *grid = quant_iq2xs_grid;
    const __m256i S = a2_odd_scales(x + 66);
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        const uint64_t qw = a2_ld_u64(x + 2 + 8 * g);
        const uint32_t q0 = (uint32_t)qw & 0xffff, q1 = (uint32_t)(qw >> 16) & 0xffff,
                       q2 = (uint32_t)(qw >> 32) & 0xffff, q3 = (uint32_t)(qw >> 48);
        const __m256i mag = _mm256_setr_epi64x((long long)grid[q0 & 511], (long long)grid[q1 & 511],
                                               (long long)grid[q2 & 511], (long long)grid[q3 & 511]);
        const __m256i sgn = _mm256_setr_epi64x((long long)kernels_ksigns_pm1[q0 >> 9], (long long)kernels_ksigns_pm1[q1 >> 9],
                                               (long long)kernels_ksigns_pm1[q2 >> 9], (long long)kernels_ksigns_pm1[q3 >> 9]);
        a2_iq_group(y, tn, g, mag, sgn, lane_words_u8(S, g, 8 + g), isum);
    }
}

/* IQ3_XXS (98 bytes: d | 64 grid indices of four magnitudes | 8 x u32: four 7-bit sign indices
 * and a 4-bit scale): group g is eight grid entries, one scale for its 32 values. */
static inline __attribute__((always_inline)) void a2_iq3_xxs_block(const uint8_t *x, const uint8_t *const y[A2_IQ_TOKS],
                                                                   int tn, __m256i isum[A2_IQ_TOKS]) {
    const uint32_t *grid = quant_iq3xxs_grid;
    /* the eight groups' 2 s + 1 */
    const __m256i sv = _mm256_srli_epi32(ldu(x + 66), 28);
    int32_t scale[8];
    a2_scale_words(_mm256_add_epi32(_mm256_add_epi32(sv, sv), _mm256_set1_epi32(1)), scale);
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        const uint8_t *q = x + 2 + 8 * g;
        const __m256i mag = _mm256_setr_epi32((int)grid[q[0]], (int)grid[q[1]], (int)grid[q[2]], (int)grid[q[3]],
                                              (int)grid[q[4]], (int)grid[q[5]], (int)grid[q[6]], (int)grid[q[7]]);
        uint32_t w;
        memcpy(&w, x + 66 + 4 * g, 4);
        const __m256i sgn = a2_ksigns4(w);
        a2_iq_group(y, tn, g, mag, sgn, _mm256_set1_epi32(scale[g]), isum);
    }
}

/* IQ2_XXS (66 bytes: d | per group four 8-bit grid indices and a u32 of four 7-bit sign indices
 * and a 4-bit scale): one scale for the group's 32 values. */
static inline __attribute__((always_inline)) void a2_iq2_xxs_block(const uint8_t *x, const uint8_t *const y[A2_IQ_TOKS],
                                                                   int tn, __m256i isum[A2_IQ_TOKS]) {
    const uint64_t *grid = quant_iq2xxs_grid;
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        const uint8_t *q = x + 2 + 8 * g;
        uint32_t w;
        memcpy(&w, q + 4, 4);
        const __m256i mag = _mm256_setr_epi64x((long long)grid[q[0]], (long long)grid[q[1]], (long long)grid[q[2]],
                                               (long long)grid[q[3]]);
        const __m256i sgn = a2_ksigns4(w);
        a2_iq_group(y, tn, g, mag, sgn, _mm256_set1_epi16((short)(2 * (w >> 28) + 1)), isum);
    }
}

/* IQ2_S (82 bytes: d | 32 low index bytes | 32 sign bytes | 8 bytes of high index bits | 8
 * scale bytes): a 10-bit grid index per eight values, explicit signs, scales as IQ2_XS's. */
static inline __attribute__((always_inline)) void a2_iq2_s_block(const uint8_t *x, const uint8_t *const y[A2_IQ_TOKS],
                                                                 int tn, __m256i isum[A2_IQ_TOKS]) {
    const uint64_t *grid = quant_iq2s_grid;
    const __m256i S = a2_odd_scales(x + 74);
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        const uint8_t *q = x + 2 + 4 * g;
        const unsigned hb = x[66 + g];
        const __m256i mag = _mm256_setr_epi64x((long long)grid[q[0] | (hb & 3) << 8], (long long)grid[q[1] | (hb >> 2 & 3) << 8],
                                               (long long)grid[q[2] | (hb >> 4 & 3) << 8], (long long)grid[q[3] | (hb >> 6) << 8]);
        uint32_t m;
        memcpy(&m, x + 34 + 4 * g, 4);
        a2_iq_group(y, tn, g, mag, signs_pm1(m), lane_words_u8(S, g, 8 + g), isum);
    }
}

/* IQ3_S (110 bytes: d | 64 low index bytes | 8 bytes of ninth index bits | 32 sign bytes | 4
 * scale bytes): a 9-bit grid index per four values, explicit signs, one 4-bit scale (1 + 2 s)
 * per group. */
static inline __attribute__((always_inline)) void a2_iq3_s_block(const uint8_t *x, const uint8_t *const y[A2_IQ_TOKS],
                                                                 int tn, __m256i isum[A2_IQ_TOKS]) {
    const uint32_t *grid = quant_iq3s_grid;
    uint32_t sl;
    memcpy(&sl, x + 106, 4);
    const __m256i sv = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                        _mm256_set1_epi32(15));
    int32_t scale[8];
    a2_scale_words(_mm256_add_epi32(_mm256_add_epi32(sv, sv), _mm256_set1_epi32(1)), scale);
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        const uint8_t *q = x + 2 + 8 * g;
        const unsigned hb = x[66 + g];
        const __m256i mag = _mm256_setr_epi32((int)grid[q[0] | (hb & 1) << 8], (int)grid[q[1] | (hb >> 1 & 1) << 8],
                                              (int)grid[q[2] | (hb >> 2 & 1) << 8], (int)grid[q[3] | (hb >> 3 & 1) << 8],
                                              (int)grid[q[4] | (hb >> 4 & 1) << 8], (int)grid[q[5] | (hb >> 5 & 1) << 8],
                                              (int)grid[q[6] | (hb >> 6 & 1) << 8], (int)grid[q[7] | (hb >> 7) << 8]);
        uint32_t m;
        memcpy(&m, x + 74 + 4 * g, 4);
        a2_iq_group(y, tn, g, mag, signs_pm1(m), _mm256_set1_epi32(scale[g]), isum);
    }
}

/* IQ4_XS (136 bytes: d | 2 high scale bits per group (u16) | 4 bits per group (u32) | 128 bytes
 * of nibbles): group g's codes are its 16 bytes' low nibbles then high ones, through the IQ4_NL
 * table; the group's scale ls - 32 is signed. The products go as |code| x (activation with the
 * code's sign); no code is 0. Two groups at a time from one 32-byte load: the low nibbles are
 * the first 16 values of groups 2p (low lane) and 2p + 1 (high lane), the high nibbles their
 * last 16, against activations packed in that order (a2_iq4_xs_order); a pair's two scale words
 * are one shuffle. (One group a time, a 16-byte load, a shift and a lane insert each: one token
 * 4.46 against 5.37 GB/s, Zen 1, 2026-12-05.) */
static inline __attribute__((always_inline)) void a2_iq4_xs_block(const uint8_t *x, const uint8_t *const y[A2_IQ_TOKS],
                                                                  int tn, __m256i isum[A2_IQ_TOKS]) {
    uint16_t sh;
    uint32_t sl;
    memcpy(&sh, x + 2, 2);
    memcpy(&sl, x + 4, 4);
    /* ls_g - 32 = (bits 4g..4g+3 of sl | bits 2g..2g+1 of sh << 4) - 32, eight words in both lanes */
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                        _mm256_set1_epi32(15));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sh), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                        _mm256_set1_epi32(3));
    const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    const __m256i sw = _mm256_broadcastsi128_si256(_mm_packs_epi32(_mm256_castsi256_si128(ls), _mm256_extracti128_si256(ls, 1)));
    const __m256i lut = _mm256_broadcastsi128_si256(ldu128(quant_kvalues_iq4nl)), m4 = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        const __m256i v = ldu(x + 8 + 32 * p);
        const __m256i kf = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
        const __m256i kl = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
        const __m256i s = lane_words_w(sw, 2 * p, 2 * p + 1);
        a2_iq_group(y, tn, 2 * p, _mm256_sign_epi8(kf, kf), kf, s, isum);
        a2_iq_group(y, tn, 2 * p + 1, _mm256_sign_epi8(kl, kl), kl, s, isum);
    }
}

/* IQ4_XS's activation order within a super-block's 256 codes (a2_iq4_xs_block): of every 64
 * (groups 2p and 2p + 1, A and B), A's first 16, B's first 16, A's last 16, B's last 16. */
static inline void a2_iq4_xs_order(uint8_t *codes) {
    for (int p = 0; p < 4; p++) {
        uint8_t t[16];
        memcpy(t, codes + 64 * p + 16, 16);
        memcpy(codes + 64 * p + 16, codes + 64 * p + 32, 16);
        memcpy(codes + 64 * p + 32, t, 16);
    }
}

#endif
