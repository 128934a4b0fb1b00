/* AVX-512 kernels (F, BW, VL, DQ, VNNI): the shared 256-bit code of kernels_x86.inc with the
 * u8 x s8 dot done by VNNI's vpdpbusd (no int16 intermediate), plus 512-bit versions of the
 * hottest kernels. Compiled alone with the AVX-512 -m flags (CMakeLists.txt); kernels.c calls
 * it only after cpuid and xgetbv confirmed them. */
#if defined(__x86_64__)

#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))

#include "backends/cpu/kernels_x86.inc"
#include "backends/cpu/kernels_avx512_fold.h"
#include "backends/cpu/kernels_avx512_iq.h"
#include "backends/cpu/kernels_avx512_byte_row.h"
#include "backends/cpu/kernels_avx512_byte_tile.h"

#include <cpuid.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>

/* ---- 512-bit K-quant dots (same integers, same float steps as the 256-bit ones) ----------- */

/* Reduce 16 int32 lanes (a) and 8 int32 lanes (b) to their two sums at once. */
static inline void hsum2(__m512i a, __m256i b, int32_t *sa, int32_t *sb) {
    __m256i a8 = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
    __m256i h = _mm256_hadd_epi32(a8, b);
    __m128i h2 = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    h2 = _mm_hadd_epi32(h2, h2);
    *sa = _mm_cvtsi128_si32(h2);
    *sb = _mm_extract_epi32(h2, 1);
}

/* 64 elements of a Q4_K/Q5_K chunk c as [low nibbles | high nibbles] (sub-blocks 2c, 2c+1),
 * matching 64 contiguous activation bytes. */
static inline __m512i k4_chunk(const uint8_t *qs) {
    __m256i q = ldu(qs);
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1);
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
}

/* The selectors k45_term needs (built once per call: word g of a scale vector picks sub-block
 * scale 2c / 2c + 1 for the two 256-bit halves of chunk c). */
static inline void k45_sel(__m512i sel[4]) {
    for (int c = 0; c < 4; c++)
        sel[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * c))),
                                    _mm256_set1_epi16((short)(2 * c + 1)), 1);
}

/* One Q4_K / Q5_K super-block's float term, (d*da) * isum - (dmin*da) * summs (quant_kquants.c). */
static inline float k45_term(const uint8_t *x, const uint8_t *y, const __m512i sel[4], int qs_off, int has_high) {
    /* word g of the result = min g/2 (words 8.. of the scale vector) */
    const __m256i mdup = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    const __m512i one = _mm512_set1_epi8(1);
    __m256i sm = k4_scales16(x + 4);
    __m256i pm = _mm256_madd_epi16(bsums16(y), _mm256_permutexvar_epi16(mdup, sm));
    __m512i sc = _mm512_castsi256_si512(sm);
    const int8_t *q8 = (const int8_t *)(y + 4);
    __m512i acc = _mm512_setzero_si512();
    __m512i hb = has_high ? _mm512_inserti64x4(_mm512_castsi256_si512(ldu(x + 16)), ldu(x + 16), 1)
                          : _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        __m512i u = k4_chunk(x + qs_off + 32 * c);
        if (has_high) {
            /* low half: bit 2c of qh, high half: bit 2c+1, moved to 0x10 */
            __m512i sh = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * c))),
                                            _mm256_set1_epi16((short)(2 * c + 1)), 1);
            __m512i b = _mm512_and_si512(_mm512_srlv_epi16(hb, sh), one);
            u = _mm512_or_si512(u, _mm512_slli_epi16(b, 4));
        }
        __m512i p = _mm512_maddubs_epi16(u, _mm512_loadu_si512(q8 + 64 * c));
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_permutexvar_epi16(sel[c], sc)));
    }
    int32_t isum, summs;
    hsum2(acc, pm, &isum, &summs);
    float da = ld_f32(y);
    return (ld_f16(x) * da) * (float)isum - (ld_f16(x + 2) * da) * (float)summs;
}

/* Q4_K / Q5_K: sumf += term per super-block */
static inline float k45_dot512(int64_t n, const uint8_t *x, const uint8_t *y, int bytes, int qs_off,
                               int has_high) {
    float sumf = 0.0f;
    __m512i sel[4];
    k45_sel(sel);
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += bytes, y += 292) sumf += k45_term(x, y, sel, qs_off, has_high);
    return sumf;
}

/* Every super-block's term (kernel_block_terms). */
static inline void k45_terms512(int64_t n, const uint8_t *x, const uint8_t *y, int bytes, int qs_off, int has_high,
                                float *t) {
    __m512i sel[4];
    k45_sel(sel);
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += bytes, y += 292) t[blk] = k45_term(x, y, sel, qs_off, has_high);
}

static void terms_q4_k_512(int64_t n, const void *w, const void *a, float *t) { k45_terms512(n, w, a, 144, 16, 0, t); }
static void terms_q5_k_512(int64_t n, const void *w, const void *a, float *t) { k45_terms512(n, w, a, 176, 48, 1, t); }

static float dot_q4_k_512(int64_t n, const void *w, const void *a) { return k45_dot512(n, w, a, 144, 16, 0); }
static float dot_q5_k_512(int64_t n, const void *w, const void *a) { return k45_dot512(n, w, a, 176, 48, 1); }

/* The four 16-element sub-blocks 4m..4m+3 of a 64-element zmm: word index vector that spreads
 * sub-block scale 4m+k over the k-th 128-bit lane (8 words). */
static inline __m512i sel16(int m) {
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16((short)(4 * m + 1)), _mm_set1_epi16((short)(4 * m)))),
        _mm256_set_m128i(_mm_set1_epi16((short)(4 * m + 3)), _mm_set1_epi16((short)(4 * m + 2))), 1);
}

/* Per-half shift counts [lo x16 words | hi x16 words]. */
static inline __m512i counts2(int lo, int hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)lo)), _mm256_set1_epi16((short)hi), 1);
}

static inline __m512i bcast256(__m256i v) { return _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1); }

/* Q2_K: sumf += (da*d) * isum - (da*dmin) * summs */
static float dot_q2_k_512(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    const __m512i m3 = _mm512_set1_epi8(3);
    __m512i sel[4];
    for (int m = 0; m < 4; m++) sel[m] = sel16(m);
    const __m512i sh01 = counts2(0, 2), sh23 = counts2(4, 6);
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 84, y += 292) {
        __m256i sc8 = _mm256_cvtepu8_epi16(ldu128(x));
        __m512i sc = _mm512_castsi256_si512(_mm256_and_si256(sc8, _mm256_set1_epi16(15)));
        __m256i pm = _mm256_madd_epi16(bsums16(y), _mm256_srli_epi16(sc8, 4));
        const int8_t *q8 = (const int8_t *)(y + 4);
        __m512i acc = _mm512_setzero_si512();
        for (int m = 0; m < 4; m++) { /* elements 64m..: half m/2, shifts 2t for t = 2(m%2), +1 */
            __m512i qs = bcast256(ldu(x + 16 + 32 * (m / 2)));
            __m512i u = _mm512_and_si512(_mm512_srlv_epi16(qs, (m % 2) ? sh23 : sh01), m3);
            __m512i p = _mm512_maddubs_epi16(u, _mm512_loadu_si512(q8 + 64 * m));
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_permutexvar_epi16(sel[m], sc)));
        }
        int32_t isum, summs;
        hsum2(acc, pm, &isum, &summs);
        float da = ld_f32(y);
        float dall = da * ld_f16(x + 80), dmin = da * ld_f16(x + 82);
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    return sumf;
}

/* q3k_scales16: kernels_x86_common.h */

/* Q3_K: sumf += (d*da) * isum, isum = sum sc*u*a - 4 sum sc*bsum, u = q + 4 */
static float dot_q3_k_512(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    const __m512i m3 = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1);
    __m512i sel[4], hsh[4];
    for (int m = 0; m < 4; m++) {
        sel[m] = sel16(m);
        hsh[m] = counts2(2 * m, 2 * m + 1);
    }
    const __m512i sh01 = counts2(0, 2), sh23 = counts2(4, 6);
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 110, y += 292) {
        __m256i sc16 = q3k_scales16(x + 96);
        __m256i bias = _mm256_madd_epi16(bsums16(y), sc16);
        __m512i sc = _mm512_castsi256_si512(sc16);
        const int8_t *q8 = (const int8_t *)(y + 4);
        __m512i hm = bcast256(ldu(x));
        __m512i acc = _mm512_setzero_si512();
        for (int m = 0; m < 4; m++) {
            __m512i qs = bcast256(ldu(x + 32 + 32 * (m / 2)));
            __m512i lo = _mm512_and_si512(_mm512_srlv_epi16(qs, (m % 2) ? sh23 : sh01), m3);
            __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(hm, hsh[m]), one);
            __m512i u = _mm512_or_si512(lo, _mm512_slli_epi16(hb, 2));
            __m512i p = _mm512_maddubs_epi16(u, _mm512_loadu_si512(q8 + 64 * m));
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_permutexvar_epi16(sel[m], sc)));
        }
        int32_t isum, corr;
        hsum2(acc, bias, &isum, &corr);
        isum -= 4 * corr;
        sumf += (ld_f16(x + 108) * ld_f32(y)) * (float)isum;
    }
    return sumf;
}

/* One Q6_K super-block's float term, (d*da) * isum with isum = sum sc*u*a - 32 sum sc*bsum,
 * u = q + 32 (quant_kquants.c). sel: sel16(0..3). */
static inline float q6k_term(const uint8_t *x, const uint8_t *y, const __m512i sel[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i shl = counts2(4, 2), shr = counts2(0, 2);
    __m256i sc16 = _mm256_cvtepi8_epi16(ldu128(x + 192));
    __m256i bias = _mm256_madd_epi16(bsums16(y), sc16);
    __m512i sc = _mm512_castsi256_si512(sc16);
    const int8_t *q8 = (const int8_t *)(y + 4);
    __m512i acc = _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
        __m512i ql = _mm512_loadu_si512(x + 64 * h);
        __m512i qh = bcast256(ldu(x + 128 + 32 * h));
        /* quarters 0,1: low nibbles of ql[0..31], ql[32..63] with qh bits 0-1 / 2-3;
         * quarters 2,3: high nibbles with qh bits 4-5 / 6-7 */
        __m512i u01 = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
        __m512i u23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                      _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
        __m512i p0 = _mm512_maddubs_epi16(u01, _mm512_loadu_si512(q8 + 128 * h));
        __m512i p1 = _mm512_maddubs_epi16(u23, _mm512_loadu_si512(q8 + 128 * h + 64));
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p0, _mm512_permutexvar_epi16(sel[2 * h], sc)));
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p1, _mm512_permutexvar_epi16(sel[2 * h + 1], sc)));
    }
    int32_t isum, corr;
    hsum2(acc, bias, &isum, &corr);
    isum -= 32 * corr;
    return (ld_f16(x + 208) * ld_f32(y)) * (float)isum;
}

/* Q6_K: sumf += term per super-block */
static float dot_q6_k_512(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    __m512i sel[4];
    for (int m = 0; m < 4; m++) sel[m] = sel16(m);
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 210, y += 292) sumf += q6k_term(x, y, sel);
    return sumf;
}

static void terms_q6_k_512(int64_t n, const void *w, const void *a, float *t) {
    const uint8_t *x = w, *y = a;
    __m512i sel[4];
    for (int m = 0; m < 4; m++) sel[m] = sel16(m);
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 210, y += 292) t[blk] = q6k_term(x, y, sel);
}

/* ---- prefill tiles for the Q8_K-activation types ---------------------------------------------
 * Packed activations, per block of 16 tokens and per super-block (SB_PACK bytes):
 *   A   [128 pairs][16 tokens] int32: the pair (q[2p], q[2p+1]) of int16, low half first
 *   da  [16 tokens] float
 *   bsp [8 pairs][16 tokens] int32: the pair (bsum[2j], bsum[2j+1]) of int16
 * Missing tokens of the last block are zero. A weight row's super-block is decoded once into
 * 256 int16 w = quant x integer sub-block scale, so isum = sum w * q exactly; VNNI vpdpwssd then
 * accumulates 16 tokens per instruction (lane = token) from a broadcast weight pair, and the
 * float step of the reference runs lane-wise on those 16 exact integers. Four rows share each
 * activation load. Q4_K and Q5_K use the vpdpbusd variant further down (bytes, not int16:
 * twice the multiply-adds per instruction, half the packed activations). */

#define SB_PACK (128 * 64 + 64 + 8 * 64)


static size_t q8k_packed_bytes(int64_t n, int toks) {
    return (size_t)((toks + 15) / 16) * (size_t)(n / QK_K) * SB_PACK;
}

static void q8k_pack(int64_t n, const void *a, size_t as, int toks, int t0, int t1, void *dst) {
    const int64_t nsb = n / QK_K;
    for (int tb = t0 / 16; tb < (t1 + 15) / 16; tb++) {
        uint8_t *blk = (uint8_t *)dst + (size_t)tb * (size_t)nsb * SB_PACK;
        for (int64_t sb = 0; sb < nsb; sb++, blk += SB_PACK) {
            uint32_t *A = (uint32_t *)blk, *bsp = (uint32_t *)(blk + 128 * 64 + 64);
            float *da = (float *)(blk + 128 * 64);
            for (int k = 0; k < 16; k++) {
                int t = tb * 16 + k;
                if (t >= toks) {
                    for (int p = 0; p < 128; p++) A[p * 16 + k] = 0;
                    for (int j = 0; j < 8; j++) bsp[j * 16 + k] = 0;
                    da[k] = 0.0f;
                    continue;
                }
                const uint8_t *y = (const uint8_t *)a + (size_t)t * as + (size_t)sb * 292;
                da[k] = ld_f32(y);
                for (int p = 0; p < 128; p++)
                    A[p * 16 + k] = (uint32_t)(uint16_t)(int16_t)(int8_t)y[4 + 2 * p] |
                                    ((uint32_t)(uint16_t)(int16_t)(int8_t)y[5 + 2 * p] << 16);
                for (int j = 0; j < 8; j++) {
                    uint32_t lo = (uint32_t)y[260 + 4 * j] | ((uint32_t)y[261 + 4 * j] << 8);
                    uint32_t hi = (uint32_t)y[262 + 4 * j] | ((uint32_t)y[263 + 4 * j] << 8);
                    bsp[j * 16 + k] = lo | (hi << 16);
                }
            }
        }
    }
}

/* One decoded super-block of a weight row. */
typedef struct kq_row {
    _Alignas(64) int16_t w[256];
    int32_t mp[8]; /* min pairs for bsp (types with mins) */
    float d, dm;
} kq_row;

/* 32 quants (u8 in u, minus off) times scales: the first 16 by s0, the next 16 by s1. */
static inline void st_w32(int16_t *dst, __m256i u, int off, int s0, int s1) {
    __m512i v = _mm512_sub_epi16(_mm512_cvtepu8_epi16(u), _mm512_set1_epi16((short)off));
    __m512i sc = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)s0)),
                                    _mm256_set1_epi16((short)s1), 1);
    _mm512_storeu_si512(dst, _mm512_mullo_epi16(v, sc));
}

static void unpack_q2_k(const uint8_t *x, kq_row *o) {
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        __m256i qs = ldu(x + 16 + 32 * h);
        for (int t = 0; t < 4; t++) {
            int j = 4 * h + t; /* elements 32j.., sub-blocks 2j, 2j+1 */
            __m256i u = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * t), m3);
            st_w32(o->w + 32 * j, u, 0, x[2 * j] & 15, x[2 * j + 1] & 15);
        }
    }
    for (int j = 0; j < 8; j++) o->mp[j] = (int32_t)((uint32_t)(x[2 * j] >> 4) | ((uint32_t)(x[2 * j + 1] >> 4) << 16));
    o->d = ld_f16(x + 80);
    o->dm = ld_f16(x + 82);
}

static void unpack_q3_k(const uint8_t *x, kq_row *o) {
    int16_t sc[16];
    _mm256_storeu_si256((__m256i *)sc, q3k_scales16(x + 96));
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m256i hm = ldu(x);
    for (int h = 0; h < 2; h++) {
        __m256i qs = ldu(x + 32 + 32 * h);
        for (int t = 0; t < 4; t++) {
            int j = 4 * h + t;
            __m256i lo = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * t), m3);
            __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, j), one);
            st_w32(o->w + 32 * j, _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)), 4, sc[2 * j], sc[2 * j + 1]);
        }
    }
    o->d = ld_f16(x + 108);
}

static void unpack_q6_k(const uint8_t *x, kq_row *o) {
    const int8_t *sc = (const int8_t *)(x + 192);
    for (int h = 0; h < 2; h++) {
        __m256i u[4];
        q6k_codes_half(x, h, u);
        for (int t = 0; t < 4; t++) {
            int j = 4 * h + t;
            st_w32(o->w + 32 * j, u[t], 32, sc[2 * j], sc[2 * j + 1]);
        }
    }
    o->d = ld_f16(x + 208);
}

static void unpack_iq4_xs(const uint8_t *x, kq_row *o) {
    const __m256i lut = lut16(quant_kvalues_iq4nl);
    uint16_t sh;
    memcpy(&sh, x + 2, 2);
    for (int g = 0; g < 8; g++) {
        int ls = (((x[4 + g / 2] >> (4 * (g % 2))) & 0xf) | (((sh >> (2 * g)) & 3) << 4)) - 32;
        __m256i k = _mm256_shuffle_epi8(lut, nibbles32(x + 8 + 16 * g));
        __m512i v = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(k), _mm512_set1_epi16((short)ls));
        _mm512_storeu_si512(o->w + 32 * g, v);
    }
    o->d = ld_f16(x);
}

/* IQ2/IQ3: signed grid magnitudes times the odd scales 2 ls + 1 */
static inline void unpack_iq(const uint8_t *x, kq_row *o, iq_group (*group)(const uint8_t *, int)) {
    for (int g = 0; g < 8; g++) {
        iq_group G = group(x, g);
        __m256i v = _mm256_sign_epi8(G.mag, G.sgn);
        __m512i sc = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)G.s0)),
                                        _mm256_set1_epi16((short)G.s1), 1);
        _mm512_storeu_si512(o->w + 32 * g, _mm512_mullo_epi16(_mm512_cvtepi8_epi16(v), sc));
    }
    o->d = ld_f16(x);
}
static void unpack_iq2_xxs(const uint8_t *x, kq_row *o) { unpack_iq(x, o, iq2_xxs_group); }
/* IQ2_XS / IQ3_XXS: the signs and lookups of their dots (above); the same decoded values as
 * unpack_iq: the signed magnitude times the odd scale of its half group */
static inline void st_signed_w32(int16_t *dst, __m256i mag, uint32_t signs, int s0, int s1) {
    const __m512i v = _mm512_cvtepu8_epi16(mag);
    const __m512i sv = _mm512_mask_sub_epi16(v, (__mmask32)signs, _mm512_setzero_si512(), v);
    const __m512i sc = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)s0)), _mm256_set1_epi16((short)s1), 1);
    _mm512_storeu_si512(dst, _mm512_mullo_epi16(sv, sc));
}
static void unpack_iq2_xs(const uint8_t *x, kq_row *o) {
    uint32_t sg[8];
    uint16_t gi[32];
    iq2_xs_signs(x, sg, gi);
    for (int g = 0; g < 8; g++) st_signed_w32(o->w + 32 * g, iq2_xs_mag(gi, g), sg[g], iq2_xs_s0(x, g), iq2_xs_s1(x, g));
    o->d = ld_f16(x);
}
static void unpack_iq2_s(const uint8_t *x, kq_row *o) { unpack_iq(x, o, iq2_s_group); }
static void unpack_iq3_xxs(const uint8_t *x, kq_row *o) {
    uint32_t sg[8], sc[8];
    iq3_xxs_signs(x, sg, sc);
    for (int g = 0; g < 8; g++) st_signed_w32(o->w + 32 * g, iq3_xxs_mag(x, g), sg[g], (int)sc[g], (int)sc[g]);
    o->d = ld_f16(x);
}
static void unpack_iq3_s(const uint8_t *x, kq_row *o) { unpack_iq(x, o, iq3_s_group); }

typedef struct kq_tile_type {
    void (*unpack)(const uint8_t *x, kq_row *o);
    int block_bytes;
    int has_min;
    float factor; /* the reference's final factor (result = factor * sumf), 0: none */
} kq_tile_type;

static const kq_tile_type kq_q2_k = {unpack_q2_k, 84, 1, 0}, kq_q3_k = {unpack_q3_k, 110, 0, 0},
                          kq_q6_k = {unpack_q6_k, 210, 0, 0}, kq_iq4_xs = {unpack_iq4_xs, 136, 0, 0},
                          kq_iq2_xxs = {unpack_iq2_xxs, 66, 0, 0.125f}, kq_iq2_xs = {unpack_iq2_xs, 74, 0, 0.125f},
                          kq_iq2_s = {unpack_iq2_s, 82, 0, 0.125f}, kq_iq3_xxs = {unpack_iq3_xxs, 98, 0, 0.25f},
                          kq_iq3_s = {unpack_iq3_s, 110, 0, 0};

/* The reference's float step for R rows and one token block, lane-wise (lane = token):
 * sumf += (d*da)*isum [- (dmin*da)*summs]; sumf of row r at acc[r * stride]. */
static inline void kq_float(const kq_tile_type *kt, const kq_row *rw, int R, const uint8_t *blk, const __m512i *isum,
                            __m512 *acc, int stride) {
    __m512 vda = _mm512_load_ps((const float *)(blk + 128 * 64));
    const __m512i *bsp = (const __m512i *)(blk + 128 * 64 + 64);
    for (int r = 0; r < R; r++) {
        __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(rw[r].d), vda), _mm512_cvtepi32_ps(isum[r]));
        if (kt->has_min) {
            __m512i m = _mm512_setzero_si512();
            for (int j = 0; j < 8; j++)
                m = _mm512_dpwssd_epi32(m, _mm512_set1_epi32(rw[r].mp[j]), _mm512_load_si512(bsp + j));
            __m512 mt = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(rw[r].dm), vda), _mm512_cvtepi32_ps(m));
            t = _mm512_sub_ps(t, mt);
        }
        acc[r * stride] = _mm512_add_ps(acc[r * stride], t);
    }
}

/* Rows r0..r0+R-1 (R <= 4) against token blocks tb0..tb1-1: accumulates into acc[r][tb - tb0]. */
static inline void kq_rows(const kq_tile_type *kt, int64_t nsb, const uint8_t *w, size_t ws, int R, int next_rows,
                           const uint8_t *packed, int tb0, int tb1, __m512 acc[4][TB_CHUNK]) {
    kq_row rw[4];
    for (int64_t sb = 0; sb < nsb; sb++) {
        prefetch_next_rows(w, ws, 4, 4 + next_rows, (size_t)sb * (size_t)kt->block_bytes, kt->block_bytes);
        for (int r = 0; r < R; r++) kt->unpack(w + (size_t)r * ws + (size_t)sb * (size_t)kt->block_bytes, &rw[r]);
        const int32_t *w0 = (const int32_t *)rw[0].w, *w1 = (const int32_t *)rw[1].w,
                      *w2 = (const int32_t *)rw[2].w, *w3 = (const int32_t *)rw[3].w;
        int tb = tb0;
        if (R == 4) {
            /* two token blocks at once: each broadcast weight pair feeds two multiplies */
            for (; tb + 1 < tb1; tb += 2) {
                const uint8_t *blk = packed + ((size_t)tb * (size_t)nsb + (size_t)sb) * SB_PACK;
                const __m512i *A = (const __m512i *)blk, *B = (const __m512i *)(blk + (size_t)nsb * SB_PACK);
                __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
                for (int p = 0; p < 128; p++) {
                    __m512i av = _mm512_load_si512(A + p), bv = _mm512_load_si512(B + p);
                    __m512i x0 = _mm512_set1_epi32(w0[p]), x1 = _mm512_set1_epi32(w1[p]);
                    __m512i x2 = _mm512_set1_epi32(w2[p]), x3 = _mm512_set1_epi32(w3[p]);
                    a0 = _mm512_dpwssd_epi32(a0, x0, av);
                    b0 = _mm512_dpwssd_epi32(b0, x0, bv);
                    a1 = _mm512_dpwssd_epi32(a1, x1, av);
                    b1 = _mm512_dpwssd_epi32(b1, x1, bv);
                    a2 = _mm512_dpwssd_epi32(a2, x2, av);
                    b2 = _mm512_dpwssd_epi32(b2, x2, bv);
                    a3 = _mm512_dpwssd_epi32(a3, x3, av);
                    b3 = _mm512_dpwssd_epi32(b3, x3, bv);
                }
                __m512i ia[4] = {a0, a1, a2, a3}, ib[4] = {b0, b1, b2, b3};
                kq_float(kt, rw, R, blk, ia, &acc[0][tb - tb0], TB_CHUNK);
                kq_float(kt, rw, R, blk + (size_t)nsb * SB_PACK, ib, &acc[0][tb + 1 - tb0], TB_CHUNK);
            }
        }
        for (; tb < tb1; tb++) {
            const uint8_t *blk = packed + ((size_t)tb * (size_t)nsb + (size_t)sb) * SB_PACK;
            const __m512i *A = (const __m512i *)blk;
            __m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
            if (R == 4) {
                for (int p = 0; p < 128; p++) {
                    __m512i av = _mm512_load_si512(A + p);
                    i0 = _mm512_dpwssd_epi32(i0, _mm512_set1_epi32(w0[p]), av);
                    i1 = _mm512_dpwssd_epi32(i1, _mm512_set1_epi32(w1[p]), av);
                    i2 = _mm512_dpwssd_epi32(i2, _mm512_set1_epi32(w2[p]), av);
                    i3 = _mm512_dpwssd_epi32(i3, _mm512_set1_epi32(w3[p]), av);
                }
            } else {
                for (int p = 0; p < 128; p++) {
                    __m512i av = _mm512_load_si512(A + p);
                    i0 = _mm512_dpwssd_epi32(i0, _mm512_set1_epi32(w0[p]), av);
                    if (R > 1) i1 = _mm512_dpwssd_epi32(i1, _mm512_set1_epi32(w1[p]), av);
                    if (R > 2) i2 = _mm512_dpwssd_epi32(i2, _mm512_set1_epi32(w2[p]), av);
                }
            }
            __m512i isum[4] = {i0, i1, i2, i3};
            kq_float(kt, rw, R, blk, isum, &acc[0][tb - tb0], TB_CHUNK);
        }
    }
}

static void kq_run(const kq_tile_type *kt, int64_t n, const void *w, size_t ws, int rows, const void *packed,
                   int toks, float *out, size_t os) {
    const int64_t nsb = n / QK_K;
    const int ntb = (toks + 15) / 16;
    __m512 acc[4][TB_CHUNK];
    const int chunk = kernel_tile_pass_units(ntb, (size_t)nsb * SB_PACK, 2, TB_CHUNK);
    for (int tb0 = 0; tb0 < ntb; tb0 += chunk) {
        int tb1 = tb0 + chunk < ntb ? tb0 + chunk : ntb;
        for (int r0 = 0; r0 < rows; r0 += 4) {
            int R = rows - r0 < 4 ? rows - r0 : 4;
            for (int r = 0; r < 4; r++)
                for (int k = 0; k < tb1 - tb0; k++) acc[r][k] = _mm512_setzero_ps();
            kq_rows(kt, nsb, (const uint8_t *)w + (size_t)r0 * ws, ws, R, rows - r0 - 4, packed, tb0, tb1, acc);
            if (kt->factor != 0.0f)
                for (int r = 0; r < R; r++)
                    for (int tb = tb0; tb < tb1; tb++)
                        acc[r][tb - tb0] = _mm512_mul_ps(_mm512_set1_ps(kt->factor), acc[r][tb - tb0]);
            tile_store(acc, R, r0, tb0, tb1, toks, out, os);
        }
    }
}

/* A sub-block's sum over its 8 quads times the sub-block's scale, added to the row's isum.
 * Q4_K (quants <= 15): a sum over 4 quads (16 products, at most 16 * 15 * 128 = 30720) fits an
 * int16, so its dword (low word the sum, high word its sign) times [scale, 0] as words is
 * one vpdpwssd: the exact product, two per sub-block instead of vpmulld (two uops on Intel) and
 * an add (mullo = 0). Q5_K (quants <= 31) overflows that bound and keeps vpmulld over the 8-quad
 * sum (mullo = 1), as Q4_K does on AMD Zen (k45_mullo_q4): there vpmulld is cheap and the
 * vpdpwssd took a VNNI slot per four vpdpbusd (16-token tile 303-308 -> 336-345 GOP/s,
 * 32 tokens 437-452 -> 478-490, one thread, bench_kernels --toks, alternating). The integers,
 * and so the results, are the same either way. */
static inline __m512i k45_scaled(__m512i isum, __m512i part, __m512i scale, int mullo) {
    return mullo ? _mm512_add_epi32(isum, _mm512_mullo_epi32(part, scale)) : _mm512_dpwssd_epi32(isum, part, scale);
}

/* The integer part of a byte tile's pass over one super-block of 4 rows: each row's 64 weight
 * quads q[r] against the packed activation quads of one token block (A0) or two (A1 too): with
 * two, each broadcast weight quad feeds two vpdpbusd (one per token block) and each activation
 * load four (one per row), where one block per pass paid a broadcast per vpdpbusd. Sums run
 * over `span` quads, then k45_scaled multiplies them by their sub-block's scale sc[r][sub]
 * (64 / n_sub quads a sub-block). isum0 (isum1) receive the exact integers per (row, token). */
static inline __attribute__((always_inline)) void quad_pass(const int32_t *const q[4], const int32_t *const sc[4],
                                                            int n_sub, int span, int mullo, int ua, const __m512i *A0,
                                                            const __m512i *A1, int two, __m512i isum0[4],
                                                            __m512i isum1[4]) {
    const int qps = 64 / n_sub;
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) isum0[r] = isum1[r] = _mm512_setzero_si512();
    for (int sub = 0; sub < n_sub; sub++) {
        for (int h = qps * sub; h < qps * sub + qps; h += span) {
            /* even and odd quads in separate sums, so that enough chains of vpdpbusd are in
             * flight (its latency is 4 cycles at 2 a cycle: a Zen 5 core ran 8 independent chains
             * at 1.64 a cycle, 12 at 1.92): one token block p0 / p1 (8 chains), two blocks p0, p1
             * and e0, e1 (16; the two-block pass had 8, and the Q4_K tile at 512 tokens, one
             * thread, went 509-600 -> 618-634 GOP/s, bench_kernels --toks 512 --mb 8, three
             * alternating rounds on 2026-12-05). Integer sums: any order gives the same bits. */
            __m512i p0[4], p1[4], e0[4], e1[4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) p0[r] = p1[r] = e0[r] = e1[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int i = h; i < h + span; i++) {
                __m512i a0 = _mm512_load_si512(A0 + i), a1 = two ? _mm512_load_si512(A1 + i) : a0;
                if (ua) { /* the activations + 128 as unsigned bytes against signed weights */
                    a0 = _mm512_xor_si512(a0, _mm512_set1_epi8((char)0x80));
                    a1 = _mm512_xor_si512(a1, _mm512_set1_epi8((char)0x80));
                }
                const int odd = (i - h) & 1;
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) {
                    const __m512i b = _mm512_set1_epi32(q[r][i]);
                    if (two && odd) {
                        e0[r] = ua ? _mm512_dpbusd_epi32(e0[r], a0, b) : _mm512_dpbusd_epi32(e0[r], b, a0);
                        e1[r] = ua ? _mm512_dpbusd_epi32(e1[r], a1, b) : _mm512_dpbusd_epi32(e1[r], b, a1);
                    } else if (two) {
                        p0[r] = ua ? _mm512_dpbusd_epi32(p0[r], a0, b) : _mm512_dpbusd_epi32(p0[r], b, a0);
                        p1[r] = ua ? _mm512_dpbusd_epi32(p1[r], a1, b) : _mm512_dpbusd_epi32(p1[r], b, a1);
                    } else if (odd) {
                        p1[r] = ua ? _mm512_dpbusd_epi32(p1[r], a0, b) : _mm512_dpbusd_epi32(p1[r], b, a0);
                    } else {
                        p0[r] = ua ? _mm512_dpbusd_epi32(p0[r], a0, b) : _mm512_dpbusd_epi32(p0[r], b, a0);
                    }
                }
            }
            if (two) {
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) {
                    p0[r] = _mm512_add_epi32(p0[r], e0[r]);
                    p1[r] = _mm512_add_epi32(p1[r], e1[r]);
                }
            } else {
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) p0[r] = _mm512_add_epi32(p0[r], p1[r]);
            }
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const __m512i s = _mm512_set1_epi32(sc[r][sub]);
                isum0[r] = k45_scaled(isum0[r], p0[r], s, mullo);
                if (two) isum1[r] = k45_scaled(isum1[r], p1[r], s, mullo);
            }
        }
    }
}

/* The Q4_K tile's scale step (k45_scaled): vpmulld on AMD processors, vpdpwssd elsewhere;
 * SLUICE_K45_SCALE=mullo|dpwssd chooses (tests run both, measurements compare them). */
static bool k45_mullo_q4(void) {
    const char *e = getenv("SLUICE_K45_SCALE");
    if (e && !strcmp(e, "mullo")) return true;
    if (e && !strcmp(e, "dpwssd")) return false;
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    return b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* "AuthenticAMD" */
}

/* The byte tiles for Q6_K and the IQ types unless SLUICE_K45_SCALE=dpwssd asks for the int16 kq
 * tiles (tests run both). */
static bool byte_tiles_q6_iq(void) {
    const char *e = getenv("SLUICE_K45_SCALE");
    return !(e && !strcmp(e, "dpwssd"));
}

/* One super-block of 4 rows against one token block (blk1 NULL) or two: the exact integers by
 * quad_pass (Q4_K/Q5_K: eight 32-value sub-blocks, Q4_K's 4-quad int16 sums where mullo is 0;
 * Q6_K: sixteen 16-value sub-blocks, vpmulld), then the type's float step. */
static inline __attribute__((always_inline)) void byte_pass(const byte_row *rw, int R, int kind, int mullo, int two,
                                                            const uint8_t *blk0, const uint8_t *blk1, __m512 *acc0,
                                                            __m512 *acc1, int stride) {
    const int32_t *q[4] = {(const int32_t *)rw[0].q, (const int32_t *)rw[1].q, (const int32_t *)rw[2].q,
                           (const int32_t *)rw[3].q};
    const int32_t *sc[4] = {rw[0].sc, rw[1].sc, rw[2].sc, rw[3].sc};
    /* sub-blocks of 16 values (Q6_K, IQ2_XS) or 32 (Q4_K, Q5_K, IQ3_XXS, IQ4_XS) */
    const int sub16 = byte_kind_sub16(kind);
    __m512i isum0[4], isum1[4];
    const int ua = kind != BYTE_Q4_K && kind != BYTE_Q5_K; /* byte_corr's signed form */
    quad_pass(q, sc, sub16 ? 16 : 8, sub16 ? 4 : mullo ? 8 : 4, mullo, ua, (const __m512i *)blk0,
              (const __m512i *)blk1, two, isum0, isum1);
    byte_float(kind, rw, R, blk0, isum0, acc0, stride);
    if (two) byte_float(kind, rw, R, blk1, isum1, acc1, stride);
}

/* byte_pass compiled once per (type, scale step, one or two token blocks), so that each has the
 * constants folded: inlined into the walk, GCC merged the one- and two-block calls into one body
 * that tests A1 per quad, spilled accumulators and ran 13% slower (Q4_K, 32 tokens). */
#define BYTE_PASS_FN(name, kind, mullo, two)                                                            \
    static __attribute__((noinline)) void name(const byte_row *rw, int R, const uint8_t *blk0,       \
                                               const uint8_t *blk1, __m512 *acc0, __m512 *acc1) {    \
        byte_pass(rw, R, kind, mullo, two, blk0, blk1, acc0, acc1, TB_CHUNK);                        \
    }
BYTE_PASS_FN(byte_pass_q4_1, BYTE_Q4_K, 0, 0)
BYTE_PASS_FN(byte_pass_q4_2, BYTE_Q4_K, 0, 1)
BYTE_PASS_FN(byte_pass_q4m_1, BYTE_Q4_K, 1, 0)
BYTE_PASS_FN(byte_pass_q4m_2, BYTE_Q4_K, 1, 1)
BYTE_PASS_FN(byte_pass_q5_1, BYTE_Q5_K, 1, 0)
BYTE_PASS_FN(byte_pass_q5_2, BYTE_Q5_K, 1, 1)
BYTE_PASS_FN(byte_pass_q6_1, BYTE_Q6_K, 1, 0)
BYTE_PASS_FN(byte_pass_q6_2, BYTE_Q6_K, 1, 1)
BYTE_PASS_FN(byte_pass_iq2xs_1, BYTE_IQ2_XS, 1, 0)
BYTE_PASS_FN(byte_pass_iq2xs_2, BYTE_IQ2_XS, 1, 1)
BYTE_PASS_FN(byte_pass_iq3xxs_1, BYTE_IQ3_XXS, 1, 0)
BYTE_PASS_FN(byte_pass_iq3xxs_2, BYTE_IQ3_XXS, 1, 1)
BYTE_PASS_FN(byte_pass_iq4xs_1, BYTE_IQ4_XS, 1, 0)
BYTE_PASS_FN(byte_pass_iq4xs_2, BYTE_IQ4_XS, 1, 1)

typedef void (*byte_pass_fn)(const byte_row *, int, const uint8_t *, const uint8_t *, __m512 *, __m512 *);

/* How far ahead the byte tiles prefetch weights, in super-blocks of 4 rows: 8 (one 2048-wide row
 * group) against the former 2, with expert-shaped matrices from DRAM (768 x 2048 and 2048 x 768,
 * one thread, alternating): Q4_K 16 tokens 358-367 -> 403-420 GOP/s, 32 tokens 490-514 ->
 * 513-523; the tile's first loads were the hottest instructions of its walk. */
#define BYTE_PREFETCH_AHEAD 8

static inline __attribute__((always_inline)) void byte_tile_run(int64_t n, const uint8_t *w, size_t ws, int rows,
                                                                const uint8_t *packed, int toks, float *out, size_t os,
                                                                int kind, int mullo) {
    const int bytes = byte_kind_bytes(kind);
    const size_t sbp = byte_kind_pack(kind);
    const float factor = byte_kind_factor(kind);
    const int64_t nsb = n / QK_K;
    const int ntb = (toks + 15) / 16;
    __m512 acc[4][TB_CHUNK];
    byte_row rw[4];
    const byte_pass_fn pass1 = kind == BYTE_Q6_K      ? byte_pass_q6_1
                               : kind == BYTE_Q5_K    ? byte_pass_q5_1
                               : kind == BYTE_IQ2_XS  ? byte_pass_iq2xs_1
                               : kind == BYTE_IQ3_XXS ? byte_pass_iq3xxs_1
                               : kind == BYTE_IQ4_XS  ? byte_pass_iq4xs_1
                               : mullo                ? byte_pass_q4m_1
                                                      : byte_pass_q4_1;
    const byte_pass_fn pass2 = kind == BYTE_Q6_K      ? byte_pass_q6_2
                               : kind == BYTE_Q5_K    ? byte_pass_q5_2
                               : kind == BYTE_IQ2_XS  ? byte_pass_iq2xs_2
                               : kind == BYTE_IQ3_XXS ? byte_pass_iq3xxs_2
                               : kind == BYTE_IQ4_XS  ? byte_pass_iq4xs_2
                               : mullo                ? byte_pass_q4m_2
                                                      : byte_pass_q4_2;
    const int chunk = kernel_tile_pass_units(ntb, (size_t)nsb * sbp, 2, TB_CHUNK);
    /* many tokens: results through the stage, 16 rows a token at once (tile_stage_flush) */
    _Alignas(64) float stage[TB_CHUNK * 16 * 16];
    const bool staged = ntb >= TILE_STAGE_MIN_BLOCKS;
    for (int tb0 = 0; tb0 < ntb; tb0 += chunk) {
        int tb1 = tb0 + chunk < ntb ? tb0 + chunk : ntb;
        for (int r0 = 0; r0 < rows; r0 += 4) {
            int R = rows - r0 < 4 ? rows - r0 : 4;
            for (int r = 0; r < 4; r++)
                for (int k = 0; k < tb1 - tb0; k++) acc[r][k] = _mm512_setzero_ps();
            for (int64_t sb = 0; sb < nsb; sb++) {
                /* the block BYTE_PREFETCH_AHEAD super-blocks ahead in walking order (rows
                 * r0..r0+3 of the next groups past a row's end) */
                const int64_t ahead = sb + BYTE_PREFETCH_AHEAD;
                prefetch_next_rows(w, ws, r0 + 4 * (int)(ahead / nsb), rows, (size_t)(ahead % nsb) * (size_t)bytes, bytes);
                for (int r = 0; r < R; r++) {
                    byte_decode(kind, w + (size_t)(r0 + r) * ws + (size_t)sb * (size_t)bytes, &rw[r], 1);
                    if (kind != BYTE_Q4_K && kind != BYTE_Q5_K) byte_corr(kind, &rw[r]);
                }
                for (int r = R; r < 4; r++) rw[r] = rw[0]; /* padding rows: computed, never stored */
                for (int tb = tb0; tb < tb1; tb += 2) {
                    const uint8_t *b0 = packed + ((size_t)tb * (size_t)nsb + (size_t)sb) * sbp;
                    if (tb + 1 < tb1) pass2(rw, R, b0, b0 + (size_t)nsb * sbp, &acc[0][tb - tb0], &acc[0][tb + 1 - tb0]);
                    else pass1(rw, R, b0, NULL, &acc[0][tb - tb0], NULL);
                }
            }
            if (factor != 0.0f)
                for (int r = 0; r < R; r++)
                    for (int tb = tb0; tb < tb1; tb++)
                        acc[r][tb - tb0] = _mm512_mul_ps(_mm512_set1_ps(factor), acc[r][tb - tb0]);
            if (!staged) {
                tile_store(acc, R, r0, tb0, tb1, toks, out, os);
                continue;
            }
            tile_store(acc, R, r0 % 16, 0, tb1 - tb0, toks - 16 * tb0, stage, 16);
            if (r0 % 16 == 12 || r0 + 4 >= rows) tile_stage_flush(stage, r0 - r0 % 16, rows, tb0, tb1, toks, out, os);
        }
    }
    if (staged) _mm_sfence(); /* the stage's streaming stores before the caller's barrier */
}

/* The byte tiles (vpmulld per sub-block, the AMD choice) from 3 tokens where the default is 4:
 * at 3 tokens, one thread, expert-shaped matrices, tile against the dot loop: IQ2_XS 34.6 ->
 * 49.4, Q4_K 73 -> 88 GOP/s; at 2 tokens the dots stay ahead (Q4_K 67 against 65). Prefill
 * sends a few tokens to many experts (35B-A3B: 256 experts, 16 tokens each on average at 512). */
#define BYTE_TILE_MIN_TOKS 3

/* A byte tile: its run function over byte_tile_run, its packer and threshold. */
#define BYTE_TILE(name, kind, mullo, packed_bytes, pack, min_toks)                                     \
    static void name##_run(int64_t n, const void *w, size_t ws, int rows, const void *packed, int toks, \
                           float *out, size_t os) {                                                     \
        byte_tile_run(n, w, ws, rows, packed, toks, out, os, kind, mullo);                              \
    }                                                                                                   \
    static const kernel_tile name = {packed_bytes, pack, name##_run, min_toks, 0};
BYTE_TILE(tile_q4_k8, BYTE_Q4_K, 0, q8k_packed_bytes8, q8k_pack8, 0)
BYTE_TILE(tile_q4_k8m, BYTE_Q4_K, 1, q8k_packed_bytes8, q8k_pack8, BYTE_TILE_MIN_TOKS)
BYTE_TILE(tile_q5_k8, BYTE_Q5_K, 1, q8k_packed_bytes8, q8k_pack8, BYTE_TILE_MIN_TOKS)
BYTE_TILE(tile_q6_k8, BYTE_Q6_K, 1, q6_packed_bytes, q6_pack, BYTE_TILE_MIN_TOKS)
BYTE_TILE(tile_iq2_xs8, BYTE_IQ2_XS, 1, q6_packed_bytes, q6_pack, BYTE_TILE_MIN_TOKS)
BYTE_TILE(tile_iq3_xxs8, BYTE_IQ3_XXS, 1, q6_packed_bytes, q6_pack, BYTE_TILE_MIN_TOKS)
BYTE_TILE(tile_iq4_xs8, BYTE_IQ4_XS, 1, q6_packed_bytes, q6_pack, BYTE_TILE_MIN_TOKS)

#define KQ_TILE(name, kt)                                                                          \
    static void name##_run(int64_t n, const void *w, size_t ws, int rows, const void *packed,     \
                           int toks, float *out, size_t os) {                                     \
        kq_run(&kt, n, w, ws, rows, packed, toks, out, os);                                        \
    }                                                                                              \
    static const kernel_tile name = {q8k_packed_bytes, q8k_pack, name##_run, 0, 0};
KQ_TILE(tile_q2_k, kq_q2_k)
KQ_TILE(tile_q3_k, kq_q3_k)
KQ_TILE(tile_q6_k, kq_q6_k)
KQ_TILE(tile_iq4_xs, kq_iq4_xs)
KQ_TILE(tile_iq2_xxs, kq_iq2_xxs)
KQ_TILE(tile_iq2_xs, kq_iq2_xs)
KQ_TILE(tile_iq2_s, kq_iq2_s)
KQ_TILE(tile_iq3_xxs, kq_iq3_xxs)
KQ_TILE(tile_iq3_s, kq_iq3_s)

/* ---- attention, 512-bit (mirrors kernel_attn_ref; see kernels.h) ------------------------- */

static inline __m512 exp_s16(__m512 x) {
    __mmask16 valid = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693145751953125f))),
                             _mm512_mul_ps(n, _mm512_set1_ps(1.42860677e-06f)));
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(0.5f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps(valid, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}


/* The attention kernel, hd = 16 * NQ and hd_v = 16 * NV, register-blocked over the query heads
 * of the group: one key or value vector loaded into a register serves up to ATTN_HB heads, so a
 * tile's keys and values are read from L1/L2 once per block of heads instead of once per head
 * (one load per FMA had made the kernel bound by the L2, not by the FMAs).
 *
 * Bit-identical to kernel_attn_ref (and to the per-head loop this replaced) because only the
 * interleaving of independent rows changes, never any one row's operations or their order:
 *  - score: per (head, key) one 16-lane accumulator, acc = fma(q_j, k_j, acc) for j = 0..NQ-1 in
 *    order, from zero; four keys at a time, then the 16 keys' accumulators folded by fold16x16
 *    (its lanes never mix keys, so the padding keys of a partial 16-key block, which repeat the
 *    last real key, touch no real score), times scale;
 *  - per head and tile exactly the reference's softmax steps (tile max, m, c, l * c, exp_s16);
 *  - value: per (head, 16-lane chunk) o = o * c, then o = fma(e_p, v_p, o) for the keys in
 *    order; chunks are independent, so four at a time in separate passes over the keys;
 *  - l = l + (double)e_p per head in key order (in the first value pass).
 * With many query rows per tile the scores come from keys transposed into the lanes
 * (attn512_scores_t), whose vector additions are the same fold.
 * Heads in groups of ATTN_GB per pass over the tiles (scores and weights of a tile kept for the
 * group), blocks of up to ATTN_HB heads inside; each (NQ, NV, H) is a separate always-inlined
 * instance, so the loops unroll and the accumulators stay in registers. kernel_attn_tokens: up
 * to ATTN_TB tokens per pass, each tile done for every token (with its own key count and its
 * rows' own m, l and outputs) before the next, so the tile is read from memory once per block;
 * a KV head's rows are 512-2048 bytes into rows n_head_kv times longer, which map to a fraction
 * of the L1/L2 sets, so without this every token streamed its keys from L3. */
#define ATTN_GB 8
#define ATTN_HB 4
#define ATTN_TB 8
/* Query rows (tokens x heads of a group) from which a tile's keys are transposed for the
 * scores (attn512_keys_t): a one-token decode's 8 heads fold, a 2-token block transposes */
#define ATTN_T_QUERIES 16
#define ATTN_INLINE static inline __attribute__((always_inline))
#define ATTN_UNROLL _Pragma("GCC unroll 16")

/* sc[h][p] = fl(dot(q_h, k_p) * scale) for the nt keys at k, heads h < H at q + h * q_stride;
 * mt[h] = their maximum. */
ATTN_INLINE void attn512_scores(const int NQ, const int H, const float *q, size_t q_stride, const float *k,
                                size_t k_stride, int nt, float scale, float (*sc)[KERNEL_ATTN_TILE], float *mt,
                                const float *pf, int pn) {
    __m512 acc[ATTN_HB][16], vmax[ATTN_HB];
    ATTN_UNROLL
    for (int h = 0; h < H; h++) vmax[h] = _mm512_set1_ps(-INFINITY);
    for (int p = 0; p < nt; p += 16) {
        const int kk = nt - p < 16 ? nt - p : 16;
        ATTN_UNROLL
        for (int i0 = 0; i0 < 16; i0 += 4) {
            if (i0 >= kk) {
                ATTN_UNROLL
                for (int h = 0; h < H; h++)
                    ATTN_UNROLL
                    for (int i = 0; i < 4; i++) acc[h][i0 + i] = _mm512_setzero_ps();
                continue;
            }
            const float *kp[4];
            ATTN_UNROLL
            for (int i = 0; i < 4; i++) kp[i] = k + (size_t)(p + (i0 + i < kk ? i0 + i : kk - 1)) * k_stride;
            if (pf) /* the next tile's key rows (attn512's pk) */
                ATTN_UNROLL
                for (int i = 0; i < 4; i++)
                    if (p + i0 + i < pn)
                        ATTN_UNROLL
                        for (int j = 0; j < NQ; j++) _mm_prefetch((const char *)(pf + (size_t)(p + i0 + i) * k_stride + 16 * j), _MM_HINT_T1);
            __m512 a[ATTN_HB][4];
            ATTN_UNROLL
            for (int h = 0; h < H; h++)
                ATTN_UNROLL
                for (int i = 0; i < 4; i++) a[h][i] = _mm512_setzero_ps();
            ATTN_UNROLL
            for (int j = 0; j < NQ; j++) {
                __m512 kv[4];
                ATTN_UNROLL
                for (int i = 0; i < 4; i++) kv[i] = _mm512_loadu_ps(kp[i] + 16 * j);
                ATTN_UNROLL
                for (int h = 0; h < H; h++) {
                    __m512 qj = _mm512_loadu_ps(q + (size_t)h * q_stride + 16 * j);
                    ATTN_UNROLL
                    for (int i = 0; i < 4; i++) a[h][i] = _mm512_fmadd_ps(qj, kv[i], a[h][i]);
                }
            }
            ATTN_UNROLL
            for (int h = 0; h < H; h++)
                ATTN_UNROLL
                for (int i = 0; i < 4; i++) acc[h][i0 + i] = a[h][i];
        }
        ATTN_UNROLL
        for (int h = 0; h < H; h++) {
            __m512 sv = _mm512_mul_ps(fold16x16(acc[h]), _mm512_set1_ps(scale));
            _mm512_store_ps(sc[h] + p, sv);
            vmax[h] = _mm512_mask_max_ps(vmax[h], (__mmask16)((1u << kk) - 1), sv, vmax[h]);
        }
    }
    ATTN_UNROLL
    for (int h = 0; h < H; h++) mt[h] = _mm512_reduce_max_ps(vmax[h]);
}

/* Key vectors (16 keys) the transposed scores compute for nt keys: 1, 2 or the whole tile. */
static inline int attn512_key_vectors(int nt) { return nt <= 16 ? 1 : nt <= 32 ? 2 : KERNEL_ATTN_TILE / 16; }

/* The same scores for many queries at once (a block of prefill tokens times the group's heads,
 * at least ATTN_T_QUERIES rows): the tile's keys transposed into the lanes once, so that the
 * 16-lane fold of every (row, key) becomes additions of whole vectors. Element d = 16j + c of
 * key p at kT[(c * NQ + j) * KERNEL_ATTN_TILE + p] (an element class's NQ rows side by side),
 * for the tile's nt keys at k, zero up to the key vectors computed (attn512_key_vectors);
 * 16 x 16 blocks transposed in registers (unpack, unpack, two 128-bit shuffles). */
ATTN_INLINE void attn512_keys_t(const int NQ, const float *k, size_t k_stride, int nt, float *kT) {
    const int np = 16 * attn512_key_vectors(nt);
    for (int p0 = 0; p0 < np; p0 += 16) {
        if (p0 >= nt) {
            for (int r = 0; r < 16 * NQ; r++) _mm512_store_ps(kT + (size_t)r * KERNEL_ATTN_TILE + p0, _mm512_setzero_ps());
            continue;
        }
        for (int j = 0; j < NQ; j++) {
            __m512 r[16], t[16];
            for (int i = 0; i < 16; i++)
                r[i] = p0 + i < nt ? _mm512_loadu_ps(k + (size_t)(p0 + i) * k_stride + 16 * j) : _mm512_setzero_ps();
            for (int i = 0; i < 8; i++) { /* quarter L: keys 2i, 2i+1 of elements 4L, 4L+1 / 4L+2, 4L+3 */
                t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            for (int i = 0; i < 4; i++) { /* r[4i + m], quarter L: keys 4i .. 4i+3 of element 4L + m */
                const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
                const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
                r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
                r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
                r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
                r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
            }
            for (int m = 0; m < 4; m++) { /* quarters: [keys 0-3 of element m, 8+m | keys 4-7 ...] */
                t[4 * m] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88);
                t[4 * m + 1] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xdd);
                t[4 * m + 2] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88);
                t[4 * m + 3] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xdd);
            }
            float *o = kT + (size_t)j * KERNEL_ATTN_TILE + p0; /* element 16j + c at row c * NQ + j */
            const size_t cs = (size_t)NQ * KERNEL_ATTN_TILE;
            for (int m = 0; m < 4; m++) { /* elements m, 4 + m, 8 + m, 12 + m: 16 keys each */
                _mm512_store_ps(o + (size_t)m * cs, _mm512_shuffle_f32x4(t[4 * m], t[4 * m + 2], 0x88));
                _mm512_store_ps(o + (size_t)(4 + m) * cs, _mm512_shuffle_f32x4(t[4 * m + 1], t[4 * m + 3], 0x88));
                _mm512_store_ps(o + (size_t)(8 + m) * cs, _mm512_shuffle_f32x4(t[4 * m], t[4 * m + 2], 0xdd));
                _mm512_store_ps(o + (size_t)(12 + m) * cs, _mm512_shuffle_f32x4(t[4 * m + 1], t[4 * m + 3], 0xdd));
            }
        }
    }
}

/* attn512_scores from the transposed keys, the same bits: lane p of part[c] is key p's
 * accumulator of element class c (acc = fma(q_d, k_d, acc) over d = c, c + 16, ... in order,
 * from zero), and the fold adds classes c and c + w for w = 8, 4, 2, 1 as vectors, which is
 * the 16-lane fold of one key. One class at a time over NV4 key vectors and H heads (16
 * accumulators, 8 loads per 16 FMAs); its loop over the classes is not unrolled (unrolled, the
 * code outgrew the op cache and was slower). Padding keys are computed and never read.
 * bench_kernels --attn --toks 2048, alternating with the fold16x16 form: 30B-A3B shape 1 thread
 * 302 -> 249 ms, 2 threads 194 -> 156 ms; 35B-A3B 266 -> 230, 164 -> 144; head size 64
 * 105 -> 79, 62 -> 47. */
ATTN_INLINE void attn512_scores_t(const int NQ, const int H, const int NV4, const float *q, size_t q_stride,
                                  const float *kT, int nt, float scale, float (*sc)[KERNEL_ATTN_TILE], float *mt) {
    __m512 part[16][ATTN_HB][KERNEL_ATTN_TILE / 16];
#pragma GCC unroll 1
    for (int c = 0; c < 16; c++) {
        __m512 acc[ATTN_HB][KERNEL_ATTN_TILE / 16];
        ATTN_UNROLL
        for (int h = 0; h < H; h++)
            ATTN_UNROLL
            for (int i = 0; i < NV4; i++) acc[h][i] = _mm512_setzero_ps();
        ATTN_UNROLL
        for (int j = 0; j < NQ; j++) {
            const int d = 16 * j + c;
            __m512 kv[KERNEL_ATTN_TILE / 16];
            ATTN_UNROLL
            for (int i = 0; i < NV4; i++) kv[i] = _mm512_load_ps(kT + (size_t)(c * NQ + j) * KERNEL_ATTN_TILE + 16 * i);
            ATTN_UNROLL
            for (int h = 0; h < H; h++) {
                const __m512 qd = _mm512_set1_ps(q[(size_t)h * q_stride + d]);
                ATTN_UNROLL
                for (int i = 0; i < NV4; i++) acc[h][i] = _mm512_fmadd_ps(qd, kv[i], acc[h][i]);
            }
        }
        ATTN_UNROLL
        for (int h = 0; h < H; h++)
            ATTN_UNROLL
            for (int i = 0; i < NV4; i++) part[c][h][i] = acc[h][i];
    }
    ATTN_UNROLL
    for (int h = 0; h < H; h++) {
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        ATTN_UNROLL
        for (int i = 0; i < NV4; i++) {
            const int kk = nt - 16 * i;
            if (kk <= 0) break;
            __m512 f[8];
            ATTN_UNROLL
            for (int c = 0; c < 8; c++) f[c] = _mm512_add_ps(part[c][h][i], part[c + 8][h][i]);
            ATTN_UNROLL
            for (int c = 0; c < 4; c++) f[c] = _mm512_add_ps(f[c], f[c + 4]);
            ATTN_UNROLL
            for (int c = 0; c < 2; c++) f[c] = _mm512_add_ps(f[c], f[c + 2]);
            const __m512 sv = _mm512_mul_ps(_mm512_add_ps(f[0], f[1]), _mm512_set1_ps(scale));
            _mm512_store_ps(sc[h] + 16 * i, sv);
            vmax = _mm512_mask_max_ps(vmax, (__mmask16)(kk >= 16 ? 0xffff : (1u << kk) - 1), sv, vmax);
        }
        mt[h] = _mm512_reduce_max_ps(vmax);
    }
}

/* o_h = o_h * c[h] + sum_p e[h][p] v_p over the nt values at v (o_h at out + h * out_stride),
 * l[h] = l[h] + e[h][p] in key order. */
ATTN_INLINE void attn512_values(const int NV, const int H, const float (*e)[KERNEL_ATTN_TILE], const float *v,
                                size_t v_stride, int nt, const float *c, double *l, float *out, size_t out_stride,
                                const float *pf, int pn) {
    ATTN_UNROLL
    for (int j0 = 0; j0 < NV; j0 += 4) {
        const int J = NV - j0 < 4 ? NV - j0 : 4;
        __m512 o[ATTN_HB][4];
        double lh[ATTN_HB];
        ATTN_UNROLL
        for (int h = 0; h < H; h++) {
            lh[h] = l[h];
            ATTN_UNROLL
            for (int j = 0; j < J; j++)
                o[h][j] = _mm512_mul_ps(_mm512_loadu_ps(out + (size_t)h * out_stride + 16 * (j0 + j)), _mm512_set1_ps(c[h]));
        }
        for (int p = 0; p < nt; p++) {
            const float *vp = v + (size_t)p * v_stride + 16 * j0;
            if (pf && p < pn) /* this pass's lines of the next tile's value row (attn512's pv) */
                ATTN_UNROLL
                for (int j = 0; j < J; j++) _mm_prefetch((const char *)(pf + (size_t)p * v_stride + 16 * (j0 + j)), _MM_HINT_T1);
            __m512 vv[4];
            ATTN_UNROLL
            for (int j = 0; j < J; j++) vv[j] = _mm512_loadu_ps(vp + 16 * j);
            ATTN_UNROLL
            for (int h = 0; h < H; h++) {
                if (j0 == 0) lh[h] = lh[h] + (double)e[h][p];
                __m512 ve = _mm512_set1_ps(e[h][p]);
                ATTN_UNROLL
                for (int j = 0; j < J; j++) o[h][j] = _mm512_fmadd_ps(ve, vv[j], o[h][j]);
            }
        }
        ATTN_UNROLL
        for (int h = 0; h < H; h++) {
            if (j0 == 0) l[h] = lh[h];
            ATTN_UNROLL
            for (int j = 0; j < J; j++) _mm512_storeu_ps(out + (size_t)h * out_stride + 16 * (j0 + j), o[h][j]);
        }
    }
}

/* Blocks of ATTN_HB heads, then the rest (1..ATTN_HB-1) as its own instance. */
#define ATTN_BLOCKS(G1, CALL)                                                                              \
    for (int h0 = 0; h0 < (G1); h0 += ATTN_HB) {                                                           \
        switch ((G1) - h0 < ATTN_HB ? (G1) - h0 : ATTN_HB) {                                               \
        case 4: CALL(4); break;                                                                            \
        case 3: CALL(3); break;                                                                            \
        case 2: CALL(2); break;                                                                            \
        default: CALL(1); break;                                                                           \
        }                                                                                                  \
    }

ATTN_INLINE void attn512(const int NQ, const int NV, const float *q, size_t q_tok_stride, size_t q_stride, int G,
                         int T, const float *k, size_t k_stride, const float *v, size_t v_stride, int n_kv,
                         float scale, float *out, size_t out_tok_stride, size_t out_stride) {
    float m[ATTN_TB][ATTN_GB], mt[ATTN_GB], c[ATTN_GB];
    double l[ATTN_TB][ATTN_GB];
    _Alignas(64) float sc[ATTN_GB][KERNEL_ATTN_TILE], e[ATTN_GB][KERNEL_ATTN_TILE];
    _Alignas(64) float kT[256 * KERNEL_ATTN_TILE]; /* 16 * NQ rows used */
    for (int t0 = 0; t0 < T; t0 += ATTN_TB) {
        const int T1 = T - t0 < ATTN_TB ? T - t0 : ATTN_TB;
        for (int g0 = 0; g0 < G; g0 += ATTN_GB) {
            const int G1 = G - g0 < ATTN_GB ? G - g0 : ATTN_GB;
            for (int t = 0; t < T1; t++)
                for (int g = 0; g < G1; g++) {
                    m[t][g] = -INFINITY;
                    l[t][g] = 0.0;
                    float *o = out + (size_t)(t0 + t) * out_tok_stride + (size_t)(g0 + g) * out_stride;
                    for (int j = 0; j < NV; j++) _mm512_storeu_ps(o + 16 * j, _mm512_setzero_ps());
                }
            const int n_last = n_kv + t0 + T1 - 1; /* the last token's keys: the most */
            const bool transposed = T1 * G1 >= ATTN_T_QUERIES;
            for (int p0 = 0; p0 < n_last; p0 += KERNEL_ATTN_TILE) {
                const float *kt = k + (size_t)p0 * k_stride, *vt = v + (size_t)p0 * v_stride;
                /* A decode step finds its keys and values in DRAM (the layer's weights evicted
                 * them): the first head block of the tile's first token asks for the next tile's
                 * rows to L2 as it reads this one's (docs/kernels.md, Attention). */
                const int pn = n_last - p0 - KERNEL_ATTN_TILE < KERNEL_ATTN_TILE ? n_last - p0 - KERNEL_ATTN_TILE : KERNEL_ATTN_TILE;
                const float *pk = pn > 0 ? kt + (size_t)KERNEL_ATTN_TILE * k_stride : NULL;
                const float *pv = pn > 0 ? vt + (size_t)KERNEL_ATTN_TILE * v_stride : NULL;
                if (transposed)
                    attn512_keys_t(NQ, kt, k_stride, n_last - p0 < KERNEL_ATTN_TILE ? n_last - p0 : KERNEL_ATTN_TILE, kT);
                for (int t = 0; t < T1; t++) { /* the tile's keys and values stay in L1/L2 for each token */
                    const int n_t = n_kv + t0 + t;
                    if (p0 >= n_t) continue;
                    const int nt = n_t - p0 < KERNEL_ATTN_TILE ? n_t - p0 : KERNEL_ATTN_TILE;
                    const float *qg = q + (size_t)(t0 + t) * q_tok_stride + (size_t)g0 * q_stride;
                    float *og = out + (size_t)(t0 + t) * out_tok_stride + (size_t)g0 * out_stride;
#define ATTN_SCORES(H) attn512_scores(NQ, H, qg + (size_t)h0 * q_stride, q_stride, kt, k_stride, nt, scale, sc + h0, mt + h0, t == 0 && h0 == 0 ? pk : NULL, pn)
#define ATTN_SCORES_T(H)                                                                                          \
    switch (attn512_key_vectors(nt)) {                                                                            \
    case 1: attn512_scores_t(NQ, H, 1, qg + (size_t)h0 * q_stride, q_stride, kT, nt, scale, sc + h0, mt + h0); break; \
    case 2: attn512_scores_t(NQ, H, 2, qg + (size_t)h0 * q_stride, q_stride, kT, nt, scale, sc + h0, mt + h0); break; \
    default: attn512_scores_t(NQ, H, KERNEL_ATTN_TILE / 16, qg + (size_t)h0 * q_stride, q_stride, kT, nt, scale, sc + h0, mt + h0); break; \
    }
                    if (transposed) {
                        ATTN_BLOCKS(G1, ATTN_SCORES_T)
                    } else {
                        ATTN_BLOCKS(G1, ATTN_SCORES)
                    }
#undef ATTN_SCORES
#undef ATTN_SCORES_T
                    for (int g = 0; g < G1; g++) {
                        float mn = m[t][g] > mt[g] ? m[t][g] : mt[g];
                        c[g] = kernel_exp_s(m[t][g] - mn);
                        l[t][g] = l[t][g] * (double)c[g];
                        m[t][g] = mn;
                        __m512 vm = _mm512_set1_ps(mn);
                        for (int p = 0; p < nt; p += 16)
                            _mm512_store_ps(e[g] + p, exp_s16(_mm512_sub_ps(
                                                          _mm512_maskz_loadu_ps((__mmask16)(nt - p >= 16 ? 0xffff : (1u << (nt - p)) - 1), sc[g] + p), vm)));
                    }
#define ATTN_VALUES(H) attn512_values(NV, H, (const float(*)[KERNEL_ATTN_TILE])(e + h0), vt, v_stride, nt, c + h0, l[t] + h0, og + (size_t)h0 * out_stride, out_stride, t == 0 && h0 == 0 ? pv : NULL, pn)
                    ATTN_BLOCKS(G1, ATTN_VALUES)
#undef ATTN_VALUES
                }
            }
            for (int t = 0; t < T1; t++)
                for (int g = 0; g < G1; g++) {
                    __m512 inv = _mm512_set1_ps((float)(1.0 / l[t][g]));
                    float *o = out + (size_t)(t0 + t) * out_tok_stride + (size_t)(g0 + g) * out_stride;
                    for (int j = 0; j < NV; j++) _mm512_storeu_ps(o + 16 * j, _mm512_mul_ps(_mm512_loadu_ps(o + 16 * j), inv));
                }
        }
    }
}

#define ATTN512(NAME, NQ, NV)                                                                              \
    static void NAME(const float *q, size_t q_tok_stride, size_t q_stride, int G, int T, const float *k,     \
                     size_t k_stride, const float *v, size_t v_stride, int n_kv, float scale, float *out,    \
                     size_t out_tok_stride, size_t out_stride) {                                            \
        attn512(NQ, NV, q, q_tok_stride, q_stride, G, T, k, k_stride, v, v_stride, n_kv, scale, out,        \
                out_tok_stride, out_stride);                                                                \
    }
ATTN512(attn512_64, 4, 4)
ATTN512(attn512_128, 8, 8)
ATTN512(attn512_256, 16, 16)

static void attn_tokens_avx512(const float *q, size_t q_tok_stride, size_t q_stride, int G, int T, const float *k,
                               size_t k_stride, const float *v, size_t v_stride, int n_kv, int hd, int hd_v,
                               float scale, float *out, size_t out_tok_stride, size_t out_stride, float *work) {
    if (hd == 128 && hd_v == 128)
        attn512_128(q, q_tok_stride, q_stride, G, T, k, k_stride, v, v_stride, n_kv, scale, out, out_tok_stride, out_stride);
    else if (hd == 256 && hd_v == 256)
        attn512_256(q, q_tok_stride, q_stride, G, T, k, k_stride, v, v_stride, n_kv, scale, out, out_tok_stride, out_stride);
    else if (hd == 64 && hd_v == 64)
        attn512_64(q, q_tok_stride, q_stride, G, T, k, k_stride, v, v_stride, n_kv, scale, out, out_tok_stride, out_stride);
    else
        for (int i = 0; i < T; i++)
            attn_x86(q + (size_t)i * q_tok_stride, q_stride, G, k, k_stride, v, v_stride, n_kv + i, hd, hd_v, scale,
                     out + (size_t)i * out_tok_stride, out_stride, work);
}

static void attn_avx512(const float *q, size_t q_stride, int G, const float *k, size_t k_stride, const float *v,
                        size_t v_stride, int n_kv, int hd, int hd_v, float scale, float *out, size_t out_stride,
                        float *work) {
    attn_tokens_avx512(q, 0, q_stride, G, 1, k, k_stride, v, v_stride, n_kv, hd, hd_v, scale, out, 0, out_stride, work);
}

void kernels_register_avx512(kernel_set *ks) {
    kx_register_common(ks); /* the 256-bit kernels, then the 512-bit ones over them */
    ks->attn = attn_avx512;
    ks->attn_tokens = attn_tokens_avx512;
    kernels_register_avx512_float(ks); /* F32, F16, BF16 */
    kernels_register_avx512_gdn(ks);
    ks->tile[GGML_TYPE_Q2_K] = &tile_q2_k;
    ks->tile[GGML_TYPE_Q3_K] = &tile_q3_k;
    ks->tile[GGML_TYPE_Q4_K] = k45_mullo_q4() ? &tile_q4_k8m : &tile_q4_k8;
    ks->tile[GGML_TYPE_Q5_K] = &tile_q5_k8;
    /* Q6_K and the IQ types: the byte tiles (vpdpbusd, vpmulld per sub-block) on AMD and Intel
     * alike (the Intel Xeon VM of bench/results/2026-12-03-cpu-amx.md without AMX, one core, 16 /
     * 128 tokens: Q6_K 123 -> 189-197 / 196-197 -> 257-264, IQ4_XS 121-122 -> 247-248 / 200-201
     * -> 299-304 GOP/s against the int16 kq tiles); SLUICE_K45_SCALE=dpwssd keeps the kq tiles */
    const bool byte16 = byte_tiles_q6_iq();
    ks->tile[GGML_TYPE_Q6_K] = byte16 ? &tile_q6_k8 : &tile_q6_k;
    ks->tile[GGML_TYPE_IQ4_XS] = byte16 ? &tile_iq4_xs8 : &tile_iq4_xs;
    ks->tile[GGML_TYPE_IQ2_XXS] = &tile_iq2_xxs;
    ks->tile[GGML_TYPE_IQ2_XS] = byte16 ? &tile_iq2_xs8 : &tile_iq2_xs;
    ks->tile[GGML_TYPE_IQ2_S] = &tile_iq2_s;
    ks->tile[GGML_TYPE_IQ3_XXS] = byte16 ? &tile_iq3_xxs8 : &tile_iq3_xxs;
    ks->tile[GGML_TYPE_IQ3_S] = &tile_iq3_s;
    const char *amx = getenv("SLUICE_AMX"); /* 0: the VNNI tiles (A/B runs) */
    if (kernels_amx_granted && !(amx && !strcmp(amx, "0"))) {
        const kernel_tile *const byte[6] = {&tile_q4_k8, &tile_q5_k8, &tile_q6_k8, &tile_iq2_xs8, &tile_iq3_xxs8,
                                            &tile_iq4_xs8};
        kernels_register_avx512_amx(ks, byte);
    }
    kernels_register_avx512_krows(ks); /* Q4_K, Q5_K, Q6_K: rows in lanes for a few tokens */
    kernels_register_avx512_q2_0(ks);
    kernels_register_avx512_q6k_r16(ks);
    kernels_register_avx512_b32(ks);
    ks->dot[GGML_TYPE_Q2_K] = dot_q2_k_512;
    ks->dot[GGML_TYPE_Q3_K] = dot_q3_k_512;
    ks->dot[GGML_TYPE_Q6_K] = dot_q6_k_512;
    ks->dot[GGML_TYPE_Q4_K] = dot_q4_k_512;
    ks->dot[GGML_TYPE_Q5_K] = dot_q5_k_512;
    ks->terms[GGML_TYPE_Q4_K] = terms_q4_k_512;
    ks->terms[GGML_TYPE_Q5_K] = terms_q5_k_512;
    ks->terms[GGML_TYPE_Q6_K] = terms_q6_k_512;
    kernels_register_avx512_iq(ks); /* the IQ dots; the byte tiles' row decoding follows its choice */
}

#endif
