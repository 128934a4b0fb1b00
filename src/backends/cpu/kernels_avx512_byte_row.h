/* The byte tiles' decoded super-block (byte_row) and the IQ2_XS / IQ3_XXS / IQ4_XS decoders into
 * it, for kernels_avx512.c's walk (the K-quant decoders stay beside it). Include only from
 * translation units compiled with the AVX-512 level's flags (CMakeLists.txt), once. */
#ifndef SLUICE_KERNELS_AVX512_BYTE_ROW_H
#define SLUICE_KERNELS_AVX512_BYTE_ROW_H

#include "backends/cpu/kernels_x86_common.h"

#include "backends/cpu/kernels_avx512_iq.h"

/* One decoded super-block of a weight row for the byte tiles (Q4_K, Q5_K, Q6_K, the IQ types): the 256 quants
 * as bytes in element order, each sub-block's integer scale, for Q4_K/Q5_K the int16 pairs of the
 * mins step (the mins of sub-blocks 2i and 2i+1, low word first) and the float scales. The VNNI walk turns the offset types' bytes
 * into their signed values and fills corr (byte_signed, kernels_avx512_byte_tile.h). */
typedef struct byte_row {
    _Alignas(64) uint8_t q[256];
    int32_t sc[16];
    /* the VNNI walk's signed form (byte_corr): 128 * the sum of sc * v over the row, in every lane */
    _Alignas(64) int32_t corr[16];
    int32_t pairs[4]; /* Q4_K / Q5_K */
    float d, dm;
} byte_row;

/* ---- IQ2_XS / IQ3_XXS / IQ4_XS as byte tiles ------------------------------------------------
 * Their values are signed (grid magnitudes with signs; the IQ4_NL table). The VNNI walk decodes
 * a row's super-block to the values v as signed bytes and multiplies them by the activations +
 * 128 (byte_corr, kernels_avx512_byte_tile.h); the AMX walk takes v + off as unsigned bytes
 * (IQ2_XS |v| <= 43 and IQ3_XXS |v| <= 62 with off 64, IQ4_XS -127..113 with off 128) and folds
 * the offset into its planes. Either way the exact integer is the reference's isum (sum of scale
 * * sum(v * a)), so the float step (d * da) * isum and the final factor give the bits of the
 * dot. The kq tiles multiply these types as int16 pairs (vpdpwssd, 32 multiply-adds an
 * instruction); here vpdpbusd does 64. */

/* IQ2_XS / IQ3_XXS: 32 signed magnitudes of a group (signs bit j: element j negative) as
 * v + off (64: the unsigned form; 0: the VNNI walk's signed one), stored at dst */
static inline void st_offset_signed(uint8_t *dst, __m256i mag, uint32_t signs, int off8) {
    const __m256i off = _mm256_set1_epi8((char)off8);
    _mm256_store_si256((__m256i *)dst, _mm256_mask_blend_epi8((__mmask32)signs, _mm256_add_epi8(off, mag),
                                                              _mm256_sub_epi8(off, mag)));
}

/* the 16 scales of 16-value sub-blocks, widened to dwords */
static inline void byte_row_scales16(byte_row *o, const int16_t sc16[16]) {
    _mm512_storeu_si512(o->sc, _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)sc16)));
}

/* four vectors of 64 magnitudes with their sign bytes (bit j of byte m for value 8m + j) as
 * v + off (64 or 0) at dst: each vector's mask is a qword of the sign bytes, taken from the register */
static inline void st_offset_signed4(uint8_t *dst, const __m512i mag[4], __m256i signs, int off8) {
    const __m512i off = _mm512_set1_epi8((char)off8);
    /* the extract's lane must be a constant (clang checks it before unrolling) */
    const uint64_t sq[4] = {(uint64_t)_mm256_extract_epi64(signs, 0), (uint64_t)_mm256_extract_epi64(signs, 1),
                            (uint64_t)_mm256_extract_epi64(signs, 2), (uint64_t)_mm256_extract_epi64(signs, 3)};
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        const __mmask64 neg = _cvtu64_mask64(sq[r]);
        _mm512_store_si512((void *)(dst + 64 * r), _mm512_mask_sub_epi8(_mm512_add_epi8(off, mag[r]), neg, off, mag[r]));
    }
}

/* sixteen dword scales: o->sc */
static inline void byte_row_scales16v(byte_row *o, __m512i s) { _mm512_storeu_si512(o->sc, s); }

/* IQ3_XXS: the group scales and d into o; returns the 32 sign bytes */
static inline __m256i iq3_xxs8_head(const uint8_t *x, byte_row *o) {
    __m256i scales;
    const __m256i signs = iq3_xxs_sign_scale(x, &scales);
    _mm256_storeu_si256((__m256i *)o->sc, scales);
    o->d = ld_f16(x);
    return signs;
}

/* The VBMI decoders (kernels_iq3_planes_on, kernels_iq2_ms_on): called, not inlined, since the
 * byte tile itself is compiled for the level's flags without VBMI; the call costs little beside a
 * super-block's decoding. Same bytes and scales as the register forms below. */

/* IQ2_XS: the dot's multishift magnitudes (kernels_avx512_iq.c, iq2_xs_ms_rows): each qword's
 * codes spread to its eight bytes by one vpmultishiftqb and mapped by one vpermb, 3 operations a
 * vector where the register form takes 7 */
static __attribute__((noinline, target("avx512vbmi"))) void unpack_iq2_xs8_ms(const uint8_t *x, byte_row *o, int off) {
    const __m512i ctrl = _mm512_set1_epi64(0x0e0c0a0806040200ll), lut = _mm512_set1_epi32(0x002b1908);
    __m256i signs;
    const __m512i codes = iq2_xs_codes_regv(x, &signs);
    __m512i mag[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++)
        mag[q] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(ctrl, _mm512_permutexvar_epi16(iq2_xs_rep(q), codes)), lut);
    st_offset_signed4(o->q, mag, signs, off);
    byte_row_scales16v(o, iq2_xs_scales16(x));
    o->d = ld_f16(x);
}

/* IQ3_XXS by byte planes: plane b (byte b of the 64 entries) by two vpermt2b and a blend on the
 * index's top bit (the dot's lookup), then the four planes interleaved into the entries' dwords
 * (bytes, then words: entries 16L + 4k .. 16L + 4k + 3 in 128-bit lane L of X[k]) and a 4 x 4
 * transpose of 128-bit lanes into element order: 29 operations where the register form takes ~46
 * before its codes are spread to bytes */
static __attribute__((noinline, target("avx512vbmi,avx512bitalg"))) void unpack_iq3_xxs8_planes(const uint8_t *x,
                                                                                               byte_row *o, int off) {
    const __m256i signs = iq3_xxs8_head(x, o);
    const __m512i idx = _mm512_loadu_si512((const void *)(x + 2));
    const __mmask64 high = _mm512_movepi8_mask(idx);
    __m512i P[4];
#pragma GCC unroll 4
    for (int b = 0; b < 4; b++) P[b] = iq3_xxs_plane(idx, high, b);
    const __m512i a = _mm512_unpacklo_epi8(P[0], P[1]), b = _mm512_unpackhi_epi8(P[0], P[1]);
    const __m512i c = _mm512_unpacklo_epi8(P[2], P[3]), d = _mm512_unpackhi_epi8(P[2], P[3]);
    const __m512i X0 = _mm512_unpacklo_epi16(a, c), X1 = _mm512_unpackhi_epi16(a, c);
    const __m512i X2 = _mm512_unpacklo_epi16(b, d), X3 = _mm512_unpackhi_epi16(b, d);
    const __m512i t0 = _mm512_shuffle_i64x2(X0, X1, 0x44), t1 = _mm512_shuffle_i64x2(X0, X1, 0xEE);
    const __m512i t2 = _mm512_shuffle_i64x2(X2, X3, 0x44), t3 = _mm512_shuffle_i64x2(X2, X3, 0xEE);
    const __m512i mag[4] = {_mm512_shuffle_i64x2(t0, t2, 0x88), _mm512_shuffle_i64x2(t0, t2, 0xDD),
                            _mm512_shuffle_i64x2(t1, t3, 0x88), _mm512_shuffle_i64x2(t1, t3, 0xDD)};
    st_offset_signed4(o->q, mag, signs, off);
}

static inline void unpack_iq2_xs8(const uint8_t *x, byte_row *o, int off) {
    if (kernels_iq2_ms_on) {
        unpack_iq2_xs8_ms(x, o, off);
        return;
    }
    if (kernels_iq_reg) {
        __m512i mag[4];
        __m256i signs;
        iq2_xs_mags_regv(x, mag, &signs);
        st_offset_signed4(o->q, mag, signs, off);
        byte_row_scales16v(o, iq2_xs_scales16(x));
        o->d = ld_f16(x);
        return;
    }
    uint32_t sg[8];
    uint16_t gi[32];
    int16_t sc16[16];
    iq2_xs_signs(x, sg, gi);
    for (int g = 0; g < 8; g++) {
        st_offset_signed(o->q + 32 * g, iq2_xs_mag(gi, g), sg[g], off);
        sc16[2 * g] = (int16_t)iq2_xs_s0(x, g);
        sc16[2 * g + 1] = (int16_t)iq2_xs_s1(x, g);
    }
    byte_row_scales16(o, sc16);
    o->d = ld_f16(x);
}

/* IQ3_XXS: one scale per 32 values (a group), so o->sc holds the eight group scales and the pass
 * runs 8 sub-blocks of 8 quads as for IQ4_XS (half the scale steps of 16-value sub-blocks: the
 * same integers) */
static inline void unpack_iq3_xxs8(const uint8_t *x, byte_row *o, int off) {
    if (kernels_iq3_planes_on) {
        unpack_iq3_xxs8_planes(x, o, off);
        return;
    }
    const __m256i signs = iq3_xxs8_head(x, o);
    if (kernels_iq_reg) {
        __m512i mag[4];
        iq3_xxs_mags_reg(x, mag);
        st_offset_signed4(o->q, mag, signs, off);
        return;
    }
    uint32_t sg[8];
    _mm256_storeu_si256((__m256i *)sg, signs);
    for (int g = 0; g < 8; g++) st_offset_signed(o->q + 32 * g, iq3_xxs_mag(x, g), sg[g], off);
}

/* IQ4_XS: the table values + 128 (that is, with the sign bit flipped), or with sgn the values
 * themselves (the VNNI walk's signed form); sc holds the eight
 * 32-value scales (the pass runs 8 sub-blocks of 8 quads). Two groups a 512-bit vector and the eight scales by
 * variable shifts, the dot's decoding (kernels_avx512_iq.h): a group at a time with the scales
 * in scalar code, the decoding took as long as the 16-token pass. */
static inline void unpack_iq4_xs8(const uint8_t *x, byte_row *o, int sgn) {
    const __m512i lut = iq4_xs_lut();
    const __m256i sv = iq4_xs_scales8(x);
    _mm256_storeu_si256((__m256i *)o->sc, sv);
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        const __m512i v = iq4_xs_codes64(x, p, lut);
        _mm512_store_si512((void *)(o->q + 64 * p), sgn ? _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)) : v);
    }
    o->d = ld_f16(x);
}

#endif
