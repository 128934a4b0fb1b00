/* The IQ2_XS, IQ3_XXS and IQ4_XS dot products of the AVX-512 level (decode), with the same
 * integers and float steps as their scalar references (formats/quant_iq.c; test_kernels checks
 * them bit for bit). IQ2_XS and IQ3_XXS come in two forms: grid entries loaded one by one
 * (dot_iq2_xs_512, dot_iq3_xxs_512) and grid codes looked up in registers (the *_reg ones, used
 * unless SLUICE_IQ_GRID_LOADS=1 or the grids do not match the code tables); the decoding helpers
 * are kernels_avx512_iq.h's. Compiled with the AVX-512 level's flags (CMakeLists.txt);
 * registered by kernels_register_avx512. Measured: bench/results/2026-12-01-cpu-iq.md. */
#if defined(__x86_64__)

#include "backends/cpu/kernels_x86_common.h" /* first: contraction off, the helpers */

#include <cpuid.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/kernels_avx512_iq.h"

#define QK_K 256
#define IQM_TOKS 8  /* tokens per pass of the few-token tiles (their sums in registers) */

/* One group of a dot: the grid magnitudes against the activations with the group's signs, scaled. */
static inline __m256i iq_group_acc(__m256i acc, __m256i mag, const int8_t *q8, uint32_t signs, __m256i scale) {
    const __m256i q = ldu(q8);
    const __m256i sq = _mm256_mask_sub_epi8(q, (__mmask32)signs, _mm256_setzero_si256(), q);
    return _mm256_dpwssd_epi32(acc, _mm256_dpbusd_epi32(_mm256_setzero_si256(), mag, sq), scale);
}

static float dot_iq3_xxs_512(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 98, y += 292) {
        const int8_t *q8 = (const int8_t *)(y + 4);
        uint32_t sg[8], sc[8];
        iq3_xxs_signs(x, sg, sc);
        __m256i acc = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) acc = iq_group_acc(acc, iq3_xxs_mag(x, g), q8 + 32 * g, sg[g], _mm256_set1_epi32((int)sc[g]));
        sumf += (ld_f16(x) * ld_f32(y)) * (float)hsum_i32(acc);
    }
    return 0.25f * sumf;
}

static float dot_iq2_xs_512(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 74, y += 292) {
        const int8_t *q8 = (const int8_t *)(y + 4);
        uint32_t sg[8];
        uint16_t gi[32];
        iq2_xs_signs(x, sg, gi);
        __m256i acc = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            const __m256i scale = _mm256_set_m128i(_mm_set1_epi32(iq2_xs_s1(x, g)), _mm_set1_epi32(iq2_xs_s0(x, g)));
            acc = iq_group_acc(acc, iq2_xs_mag(gi, g), q8 + 32 * g, sg[g], scale);
        }
        sumf += (ld_f16(x) * ld_f32(y)) * (float)hsum_i32(acc);
    }
    return 0.125f * sumf;
}

uint16_t kernels_iq2xs_codes[512];
uint16_t kernels_iq3xxs_codes[256];
bool kernels_iq_reg, kernels_iq3_planes_on, kernels_iq2_ms_on;
_Alignas(64) uint8_t kernels_iq3_planes[4][256];

/* The code of byte b among the grid's sorted byte values lut[0..nv), or -1. */
static int grid_code(const uint8_t *lut, int nv, uint8_t b) {
    for (int i = 0; i < nv; i++)
        if (lut[i] == b) return i;
    return -1;
}

/* the grid bytes' values, in code order (the register kernels' vpshufb tables hold the same) */
static const uint8_t lut2[4] = {8, 25, 43, 0}, lut3[8] = {4, 12, 20, 28, 36, 44, 52, 62};

/* n grid entries of per bytes each (little-endian words of the grid) to codes of bits each */
static bool grid_codes(const void *grid, int n, int per, int bits, const uint8_t *lut, int nv, uint16_t *out) {
    const uint8_t *g = grid;
    for (int e = 0; e < n; e++) {
        uint16_t c = 0;
        for (int j = 0; j < per; j++) {
            const int k = grid_code(lut, nv, g[(size_t)e * (size_t)per + (size_t)j]);
            if (k < 0) return false;
            c |= (uint16_t)(k << (bits * j));
        }
        out[e] = c;
    }
    return true;
}

/* Both code tables; false (the grids are not what the register kernels expect: they stay
 * unused) unless IQ2_XS's bytes take exactly lut2's three values and IQ3_XXS's lut3's eight. */
static bool iq_codes_init(void) {
    return grid_codes(quant_iq2xs_grid, 512, 8, 2, lut2, 3, kernels_iq2xs_codes) &&
           grid_codes(quant_iq3xxs_grid, 256, 4, 3, lut3, 8, kernels_iq3xxs_codes);
}

/* A super-block's integer sum for the register kernels: four vectors of 64 magnitudes against
 * the activations q8, with the sign bytes sb (bit j of byte m: value 8m + j negative) and the
 * sixteen odd scales S (one per 16 values, as dwords). Each vpdpbusd lane sums four products of
 * at most 62 x 127 (so its low int16 holds it and vpdpwssd applies the scale, as above). */
static inline int32_t iq_block_isum(const int8_t *q8, const __m512i mag[4], const uint8_t *sb, __m512i S) {
    __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        uint64_t sm;
        memcpy(&sm, sb + 8 * r, 8);
        const __m512i q = _mm512_loadu_si512((const void *)(q8 + 64 * r));
        const __m512i sq = _mm512_mask_sub_epi8(q, _cvtu64_mask64(sm), _mm512_setzero_si512(), q);
        const __m512i pick = _mm512_setr_epi32(4 * r, 4 * r, 4 * r, 4 * r, 4 * r + 1, 4 * r + 1, 4 * r + 1, 4 * r + 1,
                                               4 * r + 2, 4 * r + 2, 4 * r + 2, 4 * r + 2, 4 * r + 3, 4 * r + 3, 4 * r + 3,
                                               4 * r + 3);
        acc = _mm512_dpwssd_epi32(acc, _mm512_dpbusd_epi32(_mm512_setzero_si512(), mag[r], sq),
                                  _mm512_permutexvar_epi32(pick, S));
    }
    return _mm512_reduce_add_epi32(acc);
}

static float dot_iq3_xxs_reg(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 98, y += 292) {
        __m512i mag[4];
        iq3_xxs_mags_reg(x, mag);
        uint32_t sg[8], sc[8];
        iq3_xxs_signs(x, sg, sc);
        /* a group's scale for both its 16-value halves */
        const __m512i S = _mm512_permutexvar_epi32(twice, _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)sc)));
        const int32_t isum = iq_block_isum((const int8_t *)(y + 4), mag, (const uint8_t *)sg, S);
        sumf += (ld_f16(x) * ld_f32(y)) * (float)isum;
    }
    return 0.25f * sumf;
}

static float dot_iq2_xs_reg(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 74, y += 292) {
        __m512i mag[4];
        uint8_t sb[32];
        iq2_xs_mags_reg(x, mag, sb);
        const int32_t isum = iq_block_isum((const int8_t *)(y + 4), mag, sb, iq2_xs_scales16(x));
        sumf += (ld_f16(x) * ld_f32(y)) * (float)isum;
    }
    return 0.125f * sumf;
}

/* IQ3_XXS by byte planes (AVX-512 VBMI and BITALG): the grid as four 256-byte tables, table b
 * holding byte b of every entry, so that a super-block's 64 indices give plane b's 64 magnitudes
 * (byte b of entries 0..63) by two vpermt2b (entries below / from 128) and a blend on the index's
 * top bit: 12 operations where the register lookup takes ~46 (iq3_lookup, then the codes spread
 * to bytes). Plane b meets the activations q[4i + b], gathered from the block's 256 by two
 * vpermt2b and a blend, and the signs of those values, picked from the group's 32 sign bits by
 * one vpshufbitqmb (qword g of the sign vector holds group g's bits; byte j of plane b's index
 * selects bit 4 (j mod 8) + b). A vpdpbusd lane then holds four values of one group (entries
 * 4l..4l+3, plane b), so the group scale applies per lane as in the register kernel. The same
 * integer sum in another order and the same float step: the same bits (test_kernels). One core,
 * cache resident (a scratch harness, 64 rows x 2048): 9.3 -> 11.7 GB/s. With the activations
 * de-interleaved once per product instead of per block the kernel would reach 14.5, but the dot
 * takes Q8_K as every other kernel of the type does. */
static _Alignas(64) uint8_t iq3_sign_pick[4][64], iq3_act_pick[4][64];

static void iq3_planes_init(void) {
    for (int e = 0; e < 256; e++)
        for (int b = 0; b < 4; b++) kernels_iq3_planes[b][e] = (uint8_t)(quant_iq3xxs_grid[e] >> (8 * b));
    for (int b = 0; b < 4; b++)
        for (int j = 0; j < 64; j++) {
            iq3_sign_pick[b][j] = (uint8_t)(4 * (j % 8) + b);
            iq3_act_pick[b][j] = (uint8_t)((4 * j + b) & 127); /* within a pair of 64-byte vectors */
        }
}

/* Rows [0, rows) against tn (<= IQM_TOKS) tokens' Q8_K rows (act, as bytes apart), each row's
 * super-block decoded once for the tokens; out[t * os + r]. The dot is tn = 1. */
static inline __attribute__((always_inline, target("avx512vbmi,avx512bitalg"))) void
iq3_xxs_planes_rows(int64_t n, const uint8_t *w, size_t ws, int rows, const uint8_t *act, size_t as, int tn, float *out,
    size_t os) {
    const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (int r = 0; r < rows; r++) {
        const uint8_t *x = w + (size_t)r * ws;
        float sumf[IQM_TOKS] = {0};
        for (int64_t blk = 0; blk < n / QK_K; blk++, x += 98) {
            const __m512i idx = _mm512_loadu_si512((const void *)(x + 2));
            const __mmask64 high = _mm512_movepi8_mask(idx);
            uint32_t sg[8], sc[8];
            iq3_xxs_signs(x, sg, sc);
            const __m512i S = _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)sg));
            const __m512i S16 = _mm512_permutexvar_epi32(twice, _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)sc)));
            __m512i mag[4];
            __mmask64 neg[4];
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++) {
                mag[b] = iq3_xxs_plane(idx, high, b);
                neg[b] = _mm512_bitshuffle_epi64_mask(S, _mm512_load_si512((const void *)iq3_sign_pick[b]));
            }
            const float d = ld_f16(x);
            for (int t = 0; t < tn; t++) {
                const uint8_t *y = act + (size_t)t * as + (size_t)blk * 292;
                const int8_t *q = (const int8_t *)(y + 4);
                const __m512i q0 = _mm512_loadu_si512((const void *)q), q1 = _mm512_loadu_si512((const void *)(q + 64)),
                              q2 = _mm512_loadu_si512((const void *)(q + 128)), q3 = _mm512_loadu_si512((const void *)(q + 192));
                __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) {
                    const __m512i pick = _mm512_load_si512((const void *)iq3_act_pick[b]);
                    const __m512i qa = _mm512_mask_blend_epi8(0xFFFFFFFF00000000ull, _mm512_permutex2var_epi8(q0, pick, q1),
                                                              _mm512_permutex2var_epi8(q2, pick, q3));
                    const __m512i sq = _mm512_mask_sub_epi8(qa, neg[b], _mm512_setzero_si512(), qa);
                    acc = _mm512_dpwssd_epi32(acc, _mm512_dpbusd_epi32(_mm512_setzero_si512(), mag[b], sq), S16);
                }
                sumf[t] += (d * ld_f32(y)) * (float)_mm512_reduce_add_epi32(acc);
            }
        }
        for (int t = 0; t < tn; t++) out[(size_t)t * os + r] = 0.25f * sumf[t];
    }
}

__attribute__((target("avx512vbmi,avx512bitalg"))) static float dot_iq3_xxs_planes(int64_t n, const void *w,
                                                                                   const void *a) {
    float o;
    iq3_xxs_planes_rows(n, w, 0, 1, a, 0, 1, &o, 0);
    return o;
}

/* IQ2_XS with VBMI: the codes of qword m's entry spread to its eight bytes by one vpmultishiftqb
 * (byte k takes the qword's bits 2k..2k+7, code k in its low two) and mapped to magnitudes by one
 * vpermb over a 64-byte table indexed by those six bits (lut2[i & 3]): 3 operations a vector
 * where the register kernel takes 7 (shift, mask, spread, vpshufb). The same magnitudes, so the
 * same sums and bits (test_kernels; SLUICE_IQ2_MULTISHIFT=0: the register kernel).
 * As rows: rows [0, rows) against tn (<= IQM_TOKS) tokens' Q8_K rows (act, as bytes apart), each
 * row's super-block decoded once for the tokens; out[t * os + r]. The dot is tn = 1. */
static inline __attribute__((always_inline, target("avx512vbmi"))) void
iq2_xs_ms_rows(int64_t n, const uint8_t *w, size_t ws, int rows, const uint8_t *act, size_t as, int tn, float *out,
    size_t os) {
    const __m512i ctrl = _mm512_set1_epi64(0x0e0c0a0806040200ll);
    const __m512i lut = _mm512_set1_epi32(0x002b1908);
    for (int r = 0; r < rows; r++) {
        const uint8_t *x = w + (size_t)r * ws;
        float sumf[IQM_TOKS] = {0};
        for (int64_t blk = 0; blk < n / QK_K; blk++, x += 74) {
            uint8_t sb[32];
            const __m512i codes = iq2_xs_codes_reg(x, sb);
            __m512i mag[4];
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                mag[q] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(ctrl, _mm512_permutexvar_epi16(iq2_xs_rep(q), codes)), lut);
            const __m512i S = iq2_xs_scales16(x);
            const float d = ld_f16(x);
            for (int t = 0; t < tn; t++) {
                const uint8_t *y = act + (size_t)t * as + (size_t)blk * 292;
                sumf[t] += (d * ld_f32(y)) * (float)iq_block_isum((const int8_t *)(y + 4), mag, sb, S);
            }
        }
        for (int t = 0; t < tn; t++) out[(size_t)t * os + r] = 0.125f * sumf[t];
    }
}

__attribute__((target("avx512vbmi"))) static float dot_iq2_xs_ms(int64_t n, const void *w, const void *a) {
    float o;
    iq2_xs_ms_rows(n, w, 0, 1, a, 0, 1, &o, 0);
    return o;
}

/* AVX-512 VBMI (vpermt2b) and BITALG (vpshufbitqmb), beside the level's F/BW/VL/DQ/VNNI */
static bool cpu_has_vbmi_bitalg(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (c & (1u << 1)) && (c & (1u << 12));
}

/* IQ4_XS, two groups of 32 per 512-bit step: the same integer isum as quant_dot_iq4_xs, then
 * its float step. The codes look up the table plus 128 (k ^ 0x80, unsigned 1..241), so one
 * vpdpbusd takes four products per lane with no sign handling; the offset comes back through
 * the activation's block sums: sum k q = sum (k + 128) q - 128 sum q, with sum q over a group
 * of 32 the two Q8_K bsums it spans. Each group pair's lanes take their integer scale ls - 32
 * by one vpmulld (|lane| <= 4 x 241 x 128 x 32 < 2^24); the eight scales come from their
 * packed bits by variable shifts (built in a scalar array and loaded as a vector, they cost a
 * failed store forward every block: 6.9 GB/s). One core, cache resident (bench_kernels --l1,
 * Zen 5): 16.1 GB/s with maddubs and the signs by masked subtracts, 27.2 GB/s now; two threads
 * from DRAM 29.5 -> 43.0 GB/s (92% of the measured read bandwidth).
 * As rows: rows [0, rows) against tn (<= IQM_TOKS) tokens' Q8_K rows (act, as bytes apart), each
 * row's super-block decoded once for the tokens; out[t * os + r]. The dot is tn = 1. */
static inline __attribute__((always_inline)) void
iq4_xs_rows(int64_t n, const uint8_t *w, size_t ws, int rows, const uint8_t *act, size_t as, int tn, float *out,
    size_t os) {
    const __m512i lut = iq4_xs_lut();
    const __m512i pick[4] = {_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                             _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
                             _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5),
                             _mm512_setr_epi32(6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7)};
    for (int r = 0; r < rows; r++) {
        const uint8_t *x = w + (size_t)r * ws;
        float sumf[IQM_TOKS] = {0};
        for (int64_t blk = 0; blk < n / QK_K; blk++, x += 136) {
            const __m256i sv = iq4_xs_scales8(x);
            const __m512i sv5 = _mm512_zextsi256_si512(sv);
            __m512i k[4], sp[4];
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) {
                k[p] = iq4_xs_codes64(x, p, lut);
                sp[p] = _mm512_permutexvar_epi32(pick[p], sv5);
            }
            const __m256i s16 = iq4_xs_pairs(sv);
            const float d = ld_f16(x);
            for (int t = 0; t < tn; t++) {
                const uint8_t *y = act + (size_t)t * as + (size_t)blk * 292;
                const int8_t *q8 = (const int8_t *)(y + 4);
                __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++)
                    acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), k[p],
                                                                                       _mm512_loadu_si512((const void *)(q8 + 64 * p))),
                                                                   sp[p]));
                const __m256i off = _mm256_madd_epi16(ldu(y + 260), s16);
                acc = _mm512_sub_epi32(acc, _mm512_zextsi256_si512(_mm256_slli_epi32(off, 7)));
                sumf[t] += (d * ld_f32(y)) * (float)_mm512_reduce_add_epi32(acc);
            }
        }
        for (int t = 0; t < tn; t++) out[(size_t)t * os + r] = sumf[t];
    }
}

static float dot_iq4_xs_512(int64_t n, const void *w, const void *a) {
    float o;
    iq4_xs_rows(n, w, 0, 1, a, 0, 1, &o, 0);
    return o;
}

/* ---- a few tokens: each super-block decoded once for all of them ---------------------------
 * An expert's prefill group of 2-8 tokens (a third of a 35B-A3B pp512's expert-token pairs; a
 * speculative step's verification too) ran the dot once per token, decoding every super-block's
 * grid magnitudes, signs and scales each time, or the 16-lane byte tile, which costs 16 tokens
 * at any count. Here a row's super-block is decoded once per pass of up to IQM_TOKS tokens and
 * each token then runs the dot's own per-token steps: the same operations on the same operands,
 * the same float step per super-block, the same final factor, so each output has the bits of
 * the dot (test_kernels compares every tile with the dot). The packed activations are the
 * tokens' Q8_K rows as given. Above iqm_alone tokens the 16-lane tile runs. Only the forms this
 * level selects for the dot have one (IQ2_XS by multishift, IQ3_XXS by planes, IQ4_XS). */

static size_t iqm_row_bytes(int64_t n) { return (size_t)(n / QK_K) * 292; }

__attribute__((target("avx512vbmi"))) static void iqm_iq2_xs(int64_t n, const uint8_t *w, size_t ws, int rows,
                                                           const uint8_t *act, size_t as, int tn, float *out,
                                                           size_t os) {
    iq2_xs_ms_rows(n, w, ws, rows, act, as, tn, out, os);
}

__attribute__((target("avx512vbmi,avx512bitalg"))) static void iqm_iq3_xxs(int64_t n, const uint8_t *w, size_t ws,
                                                                           int rows, const uint8_t *act, size_t as,
                                                                           int tn, float *out, size_t os) {
    iq3_xxs_planes_rows(n, w, ws, rows, act, as, tn, out, os);
}

static void iqm_iq4_xs(int64_t n, const uint8_t *w, size_t ws, int rows, const uint8_t *act, size_t as, int tn,
                       float *out, size_t os) {
    iq4_xs_rows(n, w, ws, rows, act, as, tn, out, os);
}

typedef void (*iqm_fn)(int64_t n, const uint8_t *w, size_t ws, int rows, const uint8_t *act, size_t as, int tn,
                       float *out, size_t os);
enum { IQM_IQ2_XS, IQM_IQ3_XXS, IQM_IQ4_XS };
static const iqm_fn iqm_fns[3] = {iqm_iq2_xs, iqm_iq3_xxs, iqm_iq4_xs};
static const kernel_tile *iqm_lanes[3]; /* the 16-lane tiles this level registered */

/* Up to this many tokens (IQ2_XS, IQ3_XXS, IQ4_XS) the few-token tile runs, above it the 16-lane
 * tile: where the two cross with the byte tiles' VBMI decoding (bench_kernels --threads 1 --toks K
 * --mb 2, few-token / 16-lane GOP/s on Zen 5; SLUICE_IQ_FEW=0 gives the second): IQ2_XS 7:
 * 133 / 123, 8: 137 / 143; IQ3_XXS 5: 102 / 103, 6: 106 / 124; IQ4_XS 6: 163 / 147, 7: 168 / 169,
 * 8: 171 / 195. Both give the dot's bits, so the choice changes no value. */
static int iqm_alone[3] = {7, 5, 6};
/* Over the AMX tiles (kernels_avx512_amx.c) the hand-over comes sooner: on the Intel Xeon VM of
 * 2026-12-03 (one thread, --mb 2, two alternating rounds, few-token / AMX GOP/s): IQ2_XS 4:
 * 64-66 / 59-60, 5: 69-71 / 75-77; IQ3_XXS 2: 37 / 26-27, 3: 42-44 / 48-52; IQ4_XS 3: 75-81 /
 * 71-73, 4: 86-88 / 92-96 (bench/results/2026-12-03-cpu-amx.md). */
static const int iqm_alone_amx[3] = {4, 2, 3};

static inline size_t iqm_bytes(const int kind, int64_t n, int toks) {
    return toks <= iqm_alone[kind] ? iqm_row_bytes(n) * (size_t)toks : iqm_lanes[kind]->packed_bytes(n, toks);
}

static inline void iqm_pack(const int kind, int64_t n, const void *a, size_t as, int toks, int t0, int t1, void *dst) {
    if (toks > iqm_alone[kind]) {
        iqm_lanes[kind]->pack(n, a, as, toks, t0, t1, dst);
        return;
    }
    const size_t rb = iqm_row_bytes(n);
    for (int t = t0; t < t1; t++) memcpy((uint8_t *)dst + (size_t)t * rb, (const uint8_t *)a + (size_t)t * as, rb);
}

static inline void iqm_tile_run(const int kind, int64_t n, const void *w, size_t ws, int rows, const void *packed,
                                int toks, float *out, size_t os) {
    if (toks > iqm_alone[kind]) {
        iqm_lanes[kind]->run(n, w, ws, rows, packed, toks, out, os);
        return;
    }
    const size_t rb = iqm_row_bytes(n);
    for (int t0 = 0; t0 < toks; t0 += IQM_TOKS)
        iqm_fns[kind](n, w, ws, rows, (const uint8_t *)packed + (size_t)t0 * rb, rb,
                      toks - t0 < IQM_TOKS ? toks - t0 : IQM_TOKS, out + (size_t)t0 * os, os);
}

#define IQM_TILE(NAME, KIND)                                                                                   \
    static size_t NAME##_bytes(int64_t n, int toks) { return iqm_bytes(KIND, n, toks); }                      \
    static void NAME##_pack(int64_t n, const void *a, size_t as, int toks, int t0, int t1, void *dst) {         \
        iqm_pack(KIND, n, a, as, toks, t0, t1, dst);                                                            \
    }                                                                                                           \
    static void NAME##_run(int64_t n, const void *w, size_t ws, int rows, const void *packed, int toks,          \
                           float *out, size_t os) {                                                             \
        iqm_tile_run(KIND, n, w, ws, rows, packed, toks, out, os);                                              \
    }                                                                                                           \
    static kernel_tile NAME = {NAME##_bytes, NAME##_pack, NAME##_run, 2, 0};
IQM_TILE(tile_iq2_xs_few, IQM_IQ2_XS)
IQM_TILE(tile_iq3_xxs_few, IQM_IQ3_XXS)
IQM_TILE(tile_iq4_xs_few, IQM_IQ4_XS)

/* Wraps the 16-lane tile of a type whose dot has a few-token form here (SLUICE_IQ_FEW=0: not). */
static void iqm_wrap(kernel_set *ks, uint32_t type, int kind, kernel_tile *few) {
    const char *e = getenv("SLUICE_IQ_FEW");
    if ((e && !strcmp(e, "0")) || !ks->tile[type] || ks->tile[type] == few) return;
    iqm_lanes[kind] = ks->tile[type];
    if (kernel_tile_is_amx(ks->tile[type])) iqm_alone[kind] = iqm_alone_amx[kind];
    ks->tile[type] = few;
}

void kernels_register_avx512_iq(kernel_set *ks) {
    kernels_iq_reg = iq_codes_init() && !getenv("SLUICE_IQ_GRID_LOADS");
    ks->dot[GGML_TYPE_IQ2_XS] = kernels_iq_reg ? dot_iq2_xs_reg : dot_iq2_xs_512;
    ks->dot[GGML_TYPE_IQ3_XXS] = kernels_iq_reg ? dot_iq3_xxs_reg : dot_iq3_xxs_512;
    const char *ms = getenv("SLUICE_IQ2_MULTISHIFT"); /* 0: the register kernel (tests, A/B runs) */
    kernels_iq2_ms_on = kernels_iq_reg && cpu_has_vbmi_bitalg() && !(ms && !strcmp(ms, "0"));
    if (kernels_iq2_ms_on) ks->dot[GGML_TYPE_IQ2_XS] = dot_iq2_xs_ms;
    const char *planes = getenv("SLUICE_IQ3_PLANES"); /* 0: the register kernel (tests, A/B runs) */
    kernels_iq3_planes_on = kernels_iq_reg && cpu_has_vbmi_bitalg() && !(planes && !strcmp(planes, "0"));
    if (kernels_iq3_planes_on) {
        iq3_planes_init();
        ks->dot[GGML_TYPE_IQ3_XXS] = dot_iq3_xxs_planes;
    }
    ks->dot[GGML_TYPE_IQ4_XS] = dot_iq4_xs_512;
    if (ks->dot[GGML_TYPE_IQ2_XS] == dot_iq2_xs_ms) iqm_wrap(ks, GGML_TYPE_IQ2_XS, IQM_IQ2_XS, &tile_iq2_xs_few);
    if (ks->dot[GGML_TYPE_IQ3_XXS] == dot_iq3_xxs_planes) iqm_wrap(ks, GGML_TYPE_IQ3_XXS, IQM_IQ3_XXS, &tile_iq3_xxs_few);
    iqm_wrap(ks, GGML_TYPE_IQ4_XS, IQM_IQ4_XS, &tile_iq4_xs_few);
}

#endif
