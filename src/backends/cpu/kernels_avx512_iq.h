/* IQ2_XS and IQ3_XXS super-blocks decoded for the AVX-512 kernels: their signs (a mask bit per
 * value), scales and grid magnitudes, shared by the dot products (kernels_avx512_iq.c) and the
 * prefill byte tiles (kernels_avx512.c). Include only from translation units compiled with the
 * AVX-512 level's flags (CMakeLists.txt). */
#ifndef SLUICE_KERNELS_AVX512_IQ_H
#define SLUICE_KERNELS_AVX512_IQ_H

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backends/cpu/kernels.h"
#include "formats/quant.h"

/* ---- IQ2_XS / IQ3_XXS with the signs in mask registers ------------------------------------
 * The same integers and float steps as the 256-bit IQ_DOT kernels (mirroring quant_dot_iq2_xs
 * and quant_dot_iq3_xxs) and the same decoded rows as unpack_iq. What differs is the work around
 * the grid lookups: a super-block's 32 sign indices become their sign bytes in one vector pass
 * (the even-parity bit from a nibble table, as quant_ksigns_iq2xs defines it: index | parity <<
 * 7), and each group's 32 signs are applied by one masked subtract. In the dots the odd scales
 * multiply the group's vpdpbusd sums through vpdpwssd (those sums are at most 4 x 62 x 127 =
 * 31,496 for IQ3_XXS and 4 x 43 x 127 for IQ2_XS, so each fits the low int16 of its lane, whose
 * high half is its sign extension and meets a zero). Cache-resident, one core (bench_kernels
 * --l1, this host's AMD Zen 5): IQ3_XXS 3.3 -> 6.1 GB/s, IQ2_XS 4.4 -> 5.1 GB/s. A vector gather
 * of the grid entries was slower than scalar loads here (2.0 GB/s), as was a vpermi2d lookup
 * tree (4.0). */

/* 32 seven-bit sign indices, one per byte, to their sign bytes (bit j: element j negative). */
static inline __m256i ksign_bytes32(__m256i idx7) {
    const __m256i parity = _mm256_setr_epi8(0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1,
                                            1, 0, 0, 1, 0, 1, 1, 0);
    const __m256i lo = _mm256_and_si256(idx7, _mm256_set1_epi8(15));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(idx7, 4), _mm256_set1_epi8(15));
    const __m256i par = _mm256_xor_si256(_mm256_shuffle_epi8(parity, lo), _mm256_shuffle_epi8(parity, hi));
    return _mm256_or_si256(idx7, _mm256_slli_epi16(par, 7)); /* par is 0 or 1 per byte */
}

/* IQ3_XXS super-block: per group a u32 of four 7-bit sign indices and the 4-bit scale. Returns
 * the 32 sign bytes (group g's 32 sign bits in bytes 4g..4g+3) and sets *scales to the eight odd
 * group scales as dwords, both in registers: the byte tile takes its masks straight from them (a
 * store and reloads of these 32 bytes cost it a failed store forward per super-block). */
static inline __m256i iq3_xxs_sign_scale(const uint8_t *x, __m256i *scales) {
    const __m256i m7 = _mm256_set1_epi32(0x7f);
    const __m256i ss = _mm256_loadu_si256((const __m256i *)(x + 66));
    const __m256i idx7 = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(ss, m7), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(ss, 7), m7), 8)),
        _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(ss, 14), m7), 16),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(ss, 21), m7), 24)));
    *scales = _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(ss, 28), 1), _mm256_set1_epi32(1));
    return ksign_bytes32(idx7);
}

/* The same into arrays: sg[g] receives group g's 32 sign bits, sc[g] its odd scale. */
static inline void iq3_xxs_signs(const uint8_t *x, uint32_t sg[8], uint32_t sc[8]) {
    __m256i scales;
    _mm256_storeu_si256((__m256i *)sg, iq3_xxs_sign_scale(x, &scales));
    _mm256_storeu_si256((__m256i *)sc, scales);
}

/* The 32 magnitudes of IQ3_XXS group g (scalar loads: see above). */
static inline __m256i iq3_xxs_mag(const uint8_t *x, int g) {
    const uint32_t *grid = quant_iq3xxs_grid;
    const uint8_t *qi = x + 2 + 8 * g;
    return _mm256_setr_epi32((int)grid[qi[0]], (int)grid[qi[1]], (int)grid[qi[2]], (int)grid[qi[3]], (int)grid[qi[4]],
                             (int)grid[qi[5]], (int)grid[qi[6]], (int)grid[qi[7]]);
}

/* IQ2_XS super-block: 32 u16 of a 9-bit grid index and a 7-bit sign index; sg[g] receives
 * group g's 32 sign bits, gi the grid indices. */
static inline void iq2_xs_signs(const uint8_t *x, uint32_t sg[8], uint16_t gi[32]) {
    const __m512i qs = _mm512_loadu_si512((const void *)(x + 2));
    _mm256_storeu_si256((__m256i *)sg, ksign_bytes32(_mm512_cvtepi16_epi8(_mm512_srli_epi16(qs, 9))));
    _mm512_storeu_si512((void *)gi, _mm512_and_si512(qs, _mm512_set1_epi16(511)));
}

static inline __m256i iq2_xs_mag(const uint16_t *gi, int g) {
    const uint64_t *grid = quant_iq2xs_grid;
    const uint16_t *qi = gi + 4 * g;
    return _mm256_setr_epi64x((long long)grid[qi[0]], (long long)grid[qi[1]], (long long)grid[qi[2]],
                              (long long)grid[qi[3]]);
}

/* the odd scales of an IQ2_XS group's two halves, as 16-bit lanes */
static inline int iq2_xs_s0(const uint8_t *x, int g) { return 2 * (x[66 + g] & 15) + 1; }
static inline int iq2_xs_s1(const uint8_t *x, int g) { return 2 * (x[66 + g] >> 4) + 1; }

/* IQ2_XS with the grid looked up in registers. Each grid entry's eight bytes take three values
 * (8, 25, 43), so an entry is eight 2-bit codes: 512 x 16 bits, sixteen zmm registers. A super-
 * block's 32 grid indices are looked up by eight two-table word permutes (index bits 0-5) and a
 * select tree on bits 6-8; each output vector (two groups, 64 values) then takes its eight codes
 * (one per qword, by a word permute), shifts the four words of a qword by 0, 4, 8, 12 so that
 * word k holds the codes of values 2k and 2k + 1 in its low nibble, spreads them to the two
 * bytes and maps codes to magnitudes with one vpshufb. Signs, scales, integer sums and the float
 * step are dot_iq2_xs_512's; the scalar grid loads and vector inserts it spends most of its time
 * on are gone. */
extern uint16_t kernels_iq2xs_codes[512];  /* IQ2_XS grid entries as eight 2-bit codes */
extern uint16_t kernels_iq3xxs_codes[256]; /* IQ3_XXS grid entries as four 3-bit codes */
/* the register lookups are in use (the code tables matched the grids at registration, and not
 * SLUICE_IQ_GRID_LOADS): set once by kernels_register_avx512_iq */
extern bool kernels_iq_reg;
/* the VBMI forms are in use (the processor has AVX-512 VBMI and BITALG, the register lookups are,
 * and not SLUICE_IQ3_PLANES=0 / SLUICE_IQ2_MULTISHIFT=0): IQ3_XXS by byte planes, IQ2_XS by
 * multishift; set once by kernels_register_avx512_iq, for the dots and the byte tiles alike */
extern bool kernels_iq3_planes_on, kernels_iq2_ms_on;
/* byte b of quant_iq3xxs_grid[e] at [b][e] (filled where kernels_iq3_planes_on) */
extern _Alignas(64) uint8_t kernels_iq3_planes[4][256];

/* IQ3_XXS plane b of a super-block: byte b of the grid entries of its 64 indices idx (high: the
 * indices from 128), by two vpermt2b over the plane's 256 bytes and a blend */
static inline __attribute__((always_inline, target("avx512vbmi"))) __m512i iq3_xxs_plane(__m512i idx, __mmask64 high,
                                                                                        int b) {
    const __m512i *tb = (const __m512i *)kernels_iq3_planes[b];
    return _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(tb[0], idx, tb[1]), _mm512_permutex2var_epi8(tb[2], idx, tb[3]));
}

/* 32 word indices (< 256) into kernels_iq3xxs_codes: four two-table permutes and a select on bits 6, 7 */
static inline __m512i iq3_lookup(__m512i idx) {
    const uint16_t *t = kernels_iq3xxs_codes;
    const __m512i p0 = _mm512_permutex2var_epi16(_mm512_loadu_si512((const void *)t), idx,
                                                 _mm512_loadu_si512((const void *)(t + 32)));
    const __m512i p1 = _mm512_permutex2var_epi16(_mm512_loadu_si512((const void *)(t + 64)), idx,
                                                 _mm512_loadu_si512((const void *)(t + 96)));
    const __m512i p2 = _mm512_permutex2var_epi16(_mm512_loadu_si512((const void *)(t + 128)), idx,
                                                 _mm512_loadu_si512((const void *)(t + 160)));
    const __m512i p3 = _mm512_permutex2var_epi16(_mm512_loadu_si512((const void *)(t + 192)), idx,
                                                 _mm512_loadu_si512((const void *)(t + 224)));
    const __mmask32 b6 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(64));
    return _mm512_mask_blend_epi16(_mm512_test_epi16_mask(idx, _mm512_set1_epi16(128)),
                                   _mm512_mask_blend_epi16(b6, p0, p1), _mm512_mask_blend_epi16(b6, p2, p3));
}

/* IQ3_XXS the same way: 256 entries of four 3-bit codes (the bytes 4, 12, ..., 52, 62) in eight
 * registers; each output vector (two groups) takes its sixteen codes, one per dword, in both
 * words, shifts the high word by 6 (codes 2 and 3), spreads each word's two codes to its bytes.
 * mag as iq2_xs_mags_reg's; the signs and scales by iq3_xxs_signs. */
static inline void iq3_xxs_mags_reg(const uint8_t *x, __m512i mag[4]) {
    const __m512i shifts = _mm512_set1_epi32(0x00060000), m7 = _mm512_set1_epi16(7), m700 = _mm512_set1_epi16(0x700);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(4, 12, 20, 28, 36, 44, 52, 62, 0, 0, 0, 0, 0, 0, 0, 0));
    const __m512i c01 = iq3_lookup(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(x + 2)))), c23 = iq3_lookup(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(x + 34))));
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        /* dword l: the code of index 16r + l in both words */
        const int b = 16 * (r & 1);
        const __m512i rep = _mm512_setr_epi32(0x10001 * (b + 0), 0x10001 * (b + 1), 0x10001 * (b + 2), 0x10001 * (b + 3),
                                              0x10001 * (b + 4), 0x10001 * (b + 5), 0x10001 * (b + 6), 0x10001 * (b + 7),
                                              0x10001 * (b + 8), 0x10001 * (b + 9), 0x10001 * (b + 10), 0x10001 * (b + 11),
                                              0x10001 * (b + 12), 0x10001 * (b + 13), 0x10001 * (b + 14), 0x10001 * (b + 15));
        const __m512i wv = _mm512_srlv_epi16(_mm512_permutexvar_epi16(rep, r < 2 ? c01 : c23), shifts);
        mag[r] = _mm512_shuffle_epi8(lut, _mm512_or_si512(_mm512_and_si512(wv, m7), _mm512_and_si512(_mm512_slli_epi16(wv, 5), m700)));
    }
}

/* IQ2_XS super-block x: its 32 grid entries as words of eight 2-bit codes (entry order), and
 * the 32 sign bytes (one per grid index, bit j for its value j) in *signs */
static inline __m512i iq2_xs_codes_regv(const uint8_t *x, __m256i *signs) {
    const __m512i m511 = _mm512_set1_epi16(511);
    const __m512i qs = _mm512_loadu_si512((const void *)(x + 2));
    /* the 32 codes: eight two-table permutes (index bits 0-5), a select on bits 6, 7, 8; the
     * table read from memory (L1): a copy in a local array went to the stack */
    const __m512i idx = _mm512_and_si512(qs, m511);
    const __mmask32 b6 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(64));
    __m512i l1[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        const uint16_t *t = kernels_iq2xs_codes + 128 * q;
        const __m512i p0 = _mm512_permutex2var_epi16(_mm512_loadu_si512((const void *)t), idx,
                                                     _mm512_loadu_si512((const void *)(t + 32)));
        const __m512i p1 = _mm512_permutex2var_epi16(_mm512_loadu_si512((const void *)(t + 64)), idx,
                                                     _mm512_loadu_si512((const void *)(t + 96)));
        l1[q] = _mm512_mask_blend_epi16(b6, p0, p1);
    }
    const __mmask32 b7 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(128));
    const __m512i l2a = _mm512_mask_blend_epi16(b7, l1[0], l1[1]), l2b = _mm512_mask_blend_epi16(b7, l1[2], l1[3]);
    *signs = ksign_bytes32(_mm512_cvtepi16_epi8(_mm512_srli_epi16(qs, 9)));
    return _mm512_mask_blend_epi16(_mm512_test_epi16_mask(idx, _mm512_set1_epi16(256)), l2a, l2b);
}

/* The same with the sign bytes stored to sb. */
static inline __m512i iq2_xs_codes_reg(const uint8_t *x, uint8_t sb[32]) {
    __m256i signs;
    const __m512i codes = iq2_xs_codes_regv(x, &signs);
    _mm256_storeu_si256((__m256i *)sb, signs);
    return codes;
}

/* The word permute that puts entry 8r + m's codes in all four words of qword m. */
static inline __m512i iq2_xs_rep(int r) {
    const long long e = 0x0001000100010001ll;
    return _mm512_set_epi64(e * (8 * r + 7), e * (8 * r + 6), e * (8 * r + 5), e * (8 * r + 4), e * (8 * r + 3),
                            e * (8 * r + 2), e * (8 * r + 1), e * (8 * r));
}

/* IQ2_XS super-block x: the 256 magnitudes as four vectors of 64 bytes (two groups each) and
 * the 32 sign bytes (one per grid index, bit j for its value j) in *signs */
static inline void iq2_xs_mags_regv(const uint8_t *x, __m512i mag[4], __m256i *signs) {
    const __m512i m15 = _mm512_set1_epi16(15), m300 = _mm512_set1_epi16(0x300);
    const __m512i shifts = _mm512_set1_epi64(0x000c000800040000ll);
    const __m512i lut = _mm512_set1_epi32(0x002b1908); /* lut2 */
    const __m512i codes = iq2_xs_codes_regv(x, signs);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        /* qword m: the code of index 8r + m in all four words; word k shifted by 4k keeps the
         * codes of values 2k, 2k + 1 in its low nibble; spread to the word's two bytes */
        const __m512i L = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi16(iq2_xs_rep(r), codes), shifts), m15);
        mag[r] = _mm512_shuffle_epi8(lut, _mm512_or_si512(L, _mm512_and_si512(_mm512_slli_epi16(L, 6), m300)));
    }
}

/* The same with the sign bytes stored to sb. */
static inline void iq2_xs_mags_reg(const uint8_t *x, __m512i mag[4], uint8_t sb[32]) {
    __m256i signs;
    iq2_xs_mags_regv(x, mag, &signs);
    _mm256_storeu_si256((__m256i *)sb, signs);
}

/* IQ2_XS's sixteen odd scales, one per 16 values: [lo(0), hi(0), lo(1), hi(1), ...] */
static inline __m512i iq2_xs_scales16(const uint8_t *x) {
    const __m128i s8 = _mm_loadl_epi64((const __m128i *)(x + 66));
    const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(s8, _mm_set1_epi8(15)),
                                          _mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(15)));
    return _mm512_add_epi32(_mm512_slli_epi32(_mm512_cvtepu8_epi32(nib), 1), _mm512_set1_epi32(1));
}

/* ---- IQ4_XS, two groups of 32 per 512-bit vector (the dot and the byte tile) -------------- */

/* The table plus 128 (k ^ 0x80: unsigned 1..241) in every 128-bit lane. */
static inline __m512i iq4_xs_lut(void) {
    return _mm512_broadcast_i32x4(
        _mm_xor_si128(_mm_loadu_si128((const __m128i *)quant_kvalues_iq4nl), _mm_set1_epi8((char)0x80)));
}

/* The eight integer group scales ls - 32 as dwords, by variable shifts of their packed bits
 * (built in a scalar array and loaded as a vector, they cost a failed store forward a block). */
static inline __m256i iq4_xs_scales8(const uint8_t *x) {
    const __m256i sh4 = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), sh2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    uint32_t lo4, hi2 = 0;
    memcpy(&lo4, x + 4, 4);
    memcpy(&hi2, x + 2, 2);
    return _mm256_sub_epi32(
        _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)lo4), sh4), _mm256_set1_epi32(15)),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)hi2), sh2),
                                                           _mm256_set1_epi32(3)), 4)),
        _mm256_set1_epi32(32));
}

/* The scales as the correction's word pairs: each scale in both words. */
static inline __m256i iq4_xs_pairs(__m256i sv) {
    return _mm256_or_si256(_mm256_slli_epi32(sv, 16), _mm256_and_si256(sv, _mm256_set1_epi32(0xffff)));
}

/* Groups 2p and 2p + 1 (values 64p .. 64p + 63 in order) as table values + 128: each group's 16
 * code bytes broadcast to two lanes, the second lane's nibbles shifted down, then one vpshufb. */
static inline __m512i iq4_xs_codes64(const uint8_t *x, int p, __m512i lut) {
    const __m512i c = _mm512_shuffle_i64x2(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x + 8 + 32 * p))),
                                           _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x + 8 + 32 * p))),
                                           _MM_SHUFFLE(1, 1, 0, 0));
    const __m512i z = _mm512_mask_srli_epi16(c, (__mmask32)0xFF00FF00u, c, 4);
    return _mm512_shuffle_epi8(lut, _mm512_and_si512(z, _mm512_set1_epi8(15)));
}

/* the IQ2_XS, IQ3_XXS and IQ4_XS dot products of the AVX-512 level; sets kernels_iq_reg */
void kernels_register_avx512_iq(kernel_set *ks);

#endif
