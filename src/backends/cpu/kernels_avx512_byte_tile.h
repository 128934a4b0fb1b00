/* The byte tiles' shared parts: the packed activation layouts and their packers, the K-quant
 * row decoders into byte_row, the float steps and the token-major store. Used by the VNNI walk
 * (kernels_avx512.c) and the AMX walk (kernels_avx512_amx.c), which must give the same bits.
 * Include only from translation units compiled with the AVX-512 level's flags, after
 * kernels_avx512_byte_row.h. */
#ifndef SLUICE_KERNELS_AVX512_BYTE_TILE_H
#define SLUICE_KERNELS_AVX512_BYTE_TILE_H

#include "backends/cpu/kernels_avx512_byte_row.h"
#include "formats/quant.h"

#define TB_CHUNK 32 /* token blocks per pass at most: accumulators for 4 rows x 32 x 16 tokens */

static inline uint32_t bt_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Writes a tile's results: acc[r][tb - tb0] holds rows r0 + r (r < R) for the 16 tokens of
 * token block tb; out is token-major (token t's row r at out[t * os + r]). With 4 rows the
 * 4 x 16 block is transposed in registers and each token gets one 16-byte store (scalar stores
 * to 16 different lines per row had the store buffer full: ~15% of the Q4_K tile with 16 tokens per
 * expert). The values are only moved, never changed. */
static inline void tile_store(__m512 acc[4][TB_CHUNK], int R, int r0, int tb0, int tb1, int toks, float *out,
                              size_t os) {
    for (int tb = tb0; tb < tb1; tb++) {
        const int nk = toks - tb * 16 < 16 ? toks - tb * 16 : 16;
        float *o = out + (size_t)(tb * 16) * os + (size_t)r0;
        if (R == 4) {
            const __m512 a = acc[0][tb - tb0], b = acc[1][tb - tb0], c = acc[2][tb - tb0], d = acc[3][tb - tb0];
            const __m512 ab_lo = _mm512_unpacklo_ps(a, b), ab_hi = _mm512_unpackhi_ps(a, b);
            const __m512 cd_lo = _mm512_unpacklo_ps(c, d), cd_hi = _mm512_unpackhi_ps(c, d);
            /* t[j], 128-bit lane L: rows 0..3 of token 4L + j */
            const __m512 t[4] = {_mm512_shuffle_ps(ab_lo, cd_lo, 0x44), _mm512_shuffle_ps(ab_lo, cd_lo, 0xEE),
                                 _mm512_shuffle_ps(ab_hi, cd_hi, 0x44), _mm512_shuffle_ps(ab_hi, cd_hi, 0xEE)};
            _Alignas(64) float v[4][16];
            for (int j = 0; j < 4; j++) _mm512_store_ps(v[j], t[j]);
            for (int k = 0; k < nk; k++) _mm_storeu_ps(o + (size_t)k * os, _mm_load_ps(&v[k & 3][4 * (k >> 2)]));
            continue;
        }
        for (int r = 0; r < R; r++) {
            float v[16];
            _mm512_storeu_ps(v, acc[r][tb - tb0]);
            for (int k = 0; k < nk; k++) o[(size_t)k * os + (size_t)r] = v[k];
        }
    }
}

/* From this many token blocks a tile's results go through a stage of 16 rows per token
 * (tile_stage_flush): a dense product of a prefill (512 tokens and more) wrote each token's 4 rows
 * of a row group with one 16-byte store, so each 64-byte line of the token-major output was
 * written by four stores a whole pass apart, each a miss that must own the line (with 2,048
 * tokens the stores and the memset after them, which waited on the full store buffer, were ~11%
 * of a 35B-A3B Q2_K_XL prefill in perf). */
#define TILE_STAGE_MIN_BLOCKS 4

/* Writes rows rb .. rb + 15 (fewer at the end of `rows`) of the stage's tokens (tile_store's
 * layout with os = 16: token k of the pass at stage + 16 k) to out, one store per token. Whole
 * aligned lines go by streaming stores, which need not read the line first (the output of a
 * 2,048-token product, 64 MiB at 8,192 rows, is twice the L3: each line came from memory only to
 * be overwritten); the tile ends with an sfence so that they are visible before the pool's
 * barrier. In perf, a 35B-A3B Q2_K_XL pp2048: the Q4_K tile's own share 7.1% and memset's 4.6%
 * (before the stage) -> 4.3% and 0.8% (stage) -> 2.3% (streaming). The values are only moved. */
static inline void tile_stage_flush(const float *stage, int rb, int rows, int tb0, int tb1, int toks, float *out,
                                    size_t os) {
    const int nr = rows - rb < 16 ? rows - rb : 16;
    const __mmask16 m = (__mmask16)((1u << nr) - 1u);
    const int t1 = 16 * tb1 < toks ? 16 * tb1 : toks;
    if (nr == 16 && os % 16 == 0 && ((uintptr_t)(out + (size_t)(16 * tb0) * os + (size_t)rb) & 63) == 0) {
        for (int t = 16 * tb0; t < t1; t++)
            _mm512_stream_ps(out + (size_t)t * os + (size_t)rb, _mm512_load_ps(stage + 16 * (t - 16 * tb0)));
        return;
    }
    for (int t = 16 * tb0; t < t1; t++)
        _mm512_mask_storeu_ps(out + (size_t)t * os + (size_t)rb, m, _mm512_load_ps(stage + 16 * (t - 16 * tb0)));
}

/* The tile kernels walk 4 rows at a time along their super-blocks. A row of an expert matrix is
 * only 1-2 KiB, so each of those 4 streams is too short for the hardware prefetcher to follow and
 * every super-block's first load waited on memory (a quarter of the Q4_K tile's samples sat on it with
 * 16 tokens per expert). Asking for the next group's block of the same super-block one group
 * ahead hides that: the 16-token Q4_K tile 125 -> 167 GOP/s on one thread (bench_kernels). */
static inline void prefetch_next_rows(const uint8_t *w, size_t ws, int first, int rows, size_t off, int bytes) {
    for (int r = first; r < rows && r < first + 4; r++)
        for (int b = 0; b < bytes; b += 64) __builtin_prefetch(w + (size_t)r * ws + off + (size_t)b);
}


/* ---- Q4_K / Q5_K tiles with u8 x s8 VNNI (vpdpbusd: 64 multiply-adds per instruction) -------
 * These two types have unsigned quants and non-negative 6-bit scales per 32 values, so a row's
 * super-block is decoded to 256 bytes (no int16 widening) and each sub-block's 8 quads are
 * accumulated with vpdpbusd into their own int32 lanes (16 tokens), then multiplied by the
 * sub-block scale and added: the same exact integer isum per (row, token) as the reference.
 * Packed activations per 16 tokens and super-block (SB_PACK8 bytes): A8 [64 quads][16 tokens]
 * of 4 code bytes, da [16] floats, bsp [4][16] pairs of 32-value sums (sub-blocks 2i and 2i+1 as
 * int16: at most 32 * 127 in magnitude), so that one vpdpwssd adds two sub-blocks' mins terms. */

#define SB_PACK8 (64 * 64 + 64 + 4 * 64)

static inline size_t q8k_packed_bytes8(int64_t n, int toks) {
    return (size_t)((toks + 15) / 16) * (size_t)(n / QK_K) * SB_PACK8;
}

/* Byte-quad activations per 16 tokens and super-block (sb_bytes each): A8 [64 quads][16 tokens]
 * of 4 code bytes, da [16], then with sums32 the 4 pairs of 32-value sums per token (sub-blocks
 * 2i and 2i+1, for the Q4_K/Q5_K mins). */
static inline void pack_quads(int64_t n, const void *a, size_t as, int toks, int t0, int t1, void *dst,
                              size_t sb_bytes, int sums32) {
    const int64_t nsb = n / QK_K;
    const int npairs = sums32 ? 4 : 0;
    for (int tb = t0 / 16; tb < (t1 + 15) / 16; tb++) {
        uint8_t *blk = (uint8_t *)dst + (size_t)tb * (size_t)nsb * sb_bytes;
        for (int64_t sb = 0; sb < nsb; sb++, blk += sb_bytes) {
            uint32_t *A = (uint32_t *)blk, *bsp = (uint32_t *)(blk + 64 * 64 + 64);
            float *da = (float *)(blk + 64 * 64);
            for (int k = 0; k < 16; k++) {
                int t = tb * 16 + k;
                if (t >= toks) {
                    for (int p = 0; p < 64; p++) A[p * 16 + k] = 0;
                    for (int i = 0; i < npairs; i++) bsp[i * 16 + k] = 0;
                    da[k] = 0.0f;
                    continue;
                }
                const uint8_t *y = (const uint8_t *)a + (size_t)t * as + (size_t)sb * 292;
                da[k] = ld_f32(y);
                for (int p = 0; p < 64; p++) A[p * 16 + k] = bt_u32(y + 4 + 4 * p);
                for (int i = 0; i < npairs; i++) {
                    int16_t g[4]; /* the 16-value sums of sub-blocks 2i and 2i+1 */
                    memcpy(g, y + 260 + 8 * i, 8);
                    uint16_t lo = (uint16_t)(int16_t)(g[0] + g[1]), hi = (uint16_t)(int16_t)(g[2] + g[3]);
                    bsp[i * 16 + k] = (uint32_t)lo | (uint32_t)hi << 16;
                }
            }
        }
    }
}

static inline void q8k_pack8(int64_t n, const void *a, size_t as, int toks, int t0, int t1, void *dst) {
    pack_quads(n, a, as, toks, t0, t1, dst, SB_PACK8, 1);
}

/* 64 code bytes at a time: chunks 2g and 2g + 1 of 32, whose low nibbles are sub-blocks 4g and
 * 4g + 2 and high ones 4g + 1 and 4g + 3; two 128-bit lane shuffles put each chunk's low then
 * high nibbles in element order (16 operations for the 256 values where 32-byte chunks took 24).
 * Q5_K's fifth bit of chunk c's low (high) nibbles is qh bit 2c (2c + 1), as kr_decode takes it. */
static inline void unpack_k45_8(const uint8_t *x, byte_row *o, int qs_off, int has_high) {
    /* scales 0..7 widened to dwords; mins 0..7 as words are already the four (2i, 2i+1) pairs */
    const __m256i s16 = k4_scales16(x + 4);
    _mm256_store_si256((__m256i *)o->sc, _mm256_cvtepu16_epi32(_mm256_castsi256_si128(s16)));
    _mm_store_si128((__m128i *)o->pairs, _mm256_extracti128_si256(s16, 1));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i qh = has_high ? _mm512_broadcast_i64x4(ldu(x + 16)) : _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int g = 0; g < 2; g++) {
        const __m512i q = _mm512_loadu_si512((const void *)(x + qs_off + 64 * g));
        __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        if (has_high) {
            const __m512i sel_lo = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (4 * g))),
                                                      _mm256_set1_epi8((char)(1 << (4 * g + 2))), 1);
            const __m512i sel_hi = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (4 * g + 1))),
                                                      _mm256_set1_epi8((char)(1 << (4 * g + 3))), 1);
            const __m512i b16 = _mm512_set1_epi8(16);
            lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, sel_lo), lo, b16);
            hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, sel_hi), hi, b16);
        }
        _mm512_store_si512((void *)(o->q + 128 * g), _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)));
        _mm512_store_si512((void *)(o->q + 128 * g + 64), _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    o->d = ld_f16(x);
    o->dm = ld_f16(x + 2);
}

/* The float step of one (4 rows) x (16 tokens) block: the reference's
 * sumf += (d*da)*isum - (dmin*da)*summs, lane-wise. */
static inline void k45_float(const byte_row *rw, int R, const uint8_t *blk, const __m512i *isum, __m512 *acc,
                             int stride) {
    __m512 vda = _mm512_load_ps((const float *)(blk + 64 * 64));
    const __m512i *bsp = (const __m512i *)(blk + 64 * 64 + 64);
    for (int r = 0; r < R; r++) {
        __m512i m = _mm512_setzero_si512();
        for (int i = 0; i < 4; i++)
            m = _mm512_dpwssd_epi32(m, _mm512_set1_epi32(rw[r].pairs[i]), _mm512_load_si512(bsp + i));
        __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(rw[r].d), vda), _mm512_cvtepi32_ps(isum[r]));
        __m512 mt = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(rw[r].dm), vda), _mm512_cvtepi32_ps(m));
        acc[r * stride] = _mm512_add_ps(acc[r * stride], _mm512_sub_ps(t, mt));
    }
}


/* ---- Q6_K tile with u8 x s8 VNNI (AMD) -------------------------------------------------------
 * The kq tile multiplies Q6_K as int16 pairs (vpdpwssd: 32 multiply-adds per instruction). Here
 * the 6-bit quants stay bytes and vpdpbusd takes 64 per instruction against the packed
 * activation quads (A and da as q8k_pack8's, no sums: the VNNI walk takes q - 32 as signed bytes
 * against the activations + 128 and subtracts one correction per row, byte_corr; the AMX walk
 * folds the 32 into its planes): per 16-value sub-block an exact sum (not an int16, so vpmulld
 * by the sub-block's scale). isum is the reference's exact integer, the float step its
 * (d*da) * isum: the same bits. SLUICE_K45_SCALE=dpwssd selects the kq tile. The IQ byte tiles
 * use the same packing. */
#define SB_PACK6 (64 * 64 + 64)

static inline size_t q6_packed_bytes(int64_t n, int toks) {
    return (size_t)((toks + 15) / 16) * (size_t)(n / QK_K) * SB_PACK6;
}

static inline void q6_pack(int64_t n, const void *a, size_t as, int toks, int t0, int t1, void *dst) {
    pack_quads(n, a, as, toks, t0, t1, dst, SB_PACK6, 0);
}


/* Q6_K: elements 128h + 0..63 from the low nibbles of ql[64h ..] and 128h + 64..127 from the high
 * ones, the top two bits from qh[32h ..] (bits 0-1 / 2-3 for the first / last 32 of each 64, 4-5
 * / 6-7 for the high nibbles), 64 values a vector as kr_decode does it; q (0..63), or with sgn
 * q - 32 (the VNNI walk's signed form) */
static inline void unpack_q6_k8(const uint8_t *x, byte_row *o, int sgn) {
    const __m512i off = _mm512_set1_epi8(sgn ? 32 : 0);
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i sl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i ql = _mm512_loadu_si512((const void *)(x + 64 * h));
        const __m512i qh = _mm512_broadcast_i64x4(ldu(x + 128 + 32 * h));
        _mm512_store_si512((void *)(o->q + 128 * h),
                           _mm512_sub_epi8(_mm512_ternarylogic_epi32(_mm512_and_si512(ql, m4), _mm512_sllv_epi16(qh, sl),
                                                                     m30, 0xF8),
                                           off));
        _mm512_store_si512((void *)(o->q + 128 * h + 64),
                           _mm512_sub_epi8(_mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                                                     _mm512_srlv_epi16(qh, sr), m30, 0xF8),
                                           off));
    }
    const __m128i s8 = _mm_loadu_si128((const __m128i *)(x + 192));
    _mm512_storeu_si512(o->sc, _mm512_cvtepi8_epi32(s8));
    o->d = ld_f16(x + 208);
}

/* The VNNI walk's float step of the offset types (Q6_K, the IQ types): isum is the exact
 * sum over sub-blocks of scale * sum((a + 128) * v) (byte_signed's form), so the reference's
 * integer is isum - corr; then the reference's float step (d * da) * isum, lane-wise. */
static inline void q6_float(const byte_row *rw, int R, const uint8_t *blk, const __m512i *isum, __m512 *acc,
                            int stride) {
    const __m512 vda = _mm512_load_ps((const float *)(blk + 64 * 64));
    for (int r = 0; r < R; r++) {
        const __m512i is = _mm512_sub_epi32(isum[r], _mm512_load_si512((const void *)rw[r].corr));
        acc[r * stride] = _mm512_add_ps(acc[r * stride],
                                        _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(rw[r].d), vda), _mm512_cvtepi32_ps(is)));
    }
}

/* ---- the byte tiles' walk (Q4_K, Q5_K, Q6_K) ---------------------------------------------- */

enum byte_kind { BYTE_Q4_K, BYTE_Q5_K, BYTE_Q6_K, BYTE_IQ2_XS, BYTE_IQ3_XXS, BYTE_IQ4_XS };

/* a kind's super-block bytes, its packed activation bytes per 16 tokens and super-block, and the
 * reference's final factor (result = factor * sumf; 0: none) */
static inline int byte_kind_bytes(int kind) {
    return kind == BYTE_Q4_K ? 144 : kind == BYTE_Q5_K ? 176 : kind == BYTE_Q6_K ? 210
         : kind == BYTE_IQ2_XS ? 74 : kind == BYTE_IQ3_XXS ? 98 : 136;
}
static inline size_t byte_kind_pack(int kind) { return kind == BYTE_Q4_K || kind == BYTE_Q5_K ? SB_PACK8 : SB_PACK6; }
/* sub-blocks of 16 values (Q6_K, IQ2_XS) or of 32 (the others) */
static inline int byte_kind_sub16(int kind) { return kind == BYTE_Q6_K || kind == BYTE_IQ2_XS; }
/* log2 of the offset that made the kind's values unsigned bytes (Q6_K 32, IQ2_XS / IQ3_XXS 64,
 * IQ4_XS 128); 0 for Q4_K / Q5_K, whose quants are unsigned and whose mins the float step takes */
static inline int byte_kind_offset_shift(int kind) {
    return kind == BYTE_Q6_K ? 5 : kind == BYTE_IQ4_XS ? 7 : kind == BYTE_IQ2_XS || kind == BYTE_IQ3_XXS ? 6 : 0;
}
static inline float byte_kind_factor(int kind) {
    return kind == BYTE_IQ2_XS ? 0.125f : kind == BYTE_IQ3_XXS ? 0.25f : 0.0f;
}

/* The offset types' rows in the VNNI walk's signed form: decoded with sgn (byte_decode), the
 * bytes are the values v themselves (Q6_K -32..31, IQ2_XS / IQ3_XXS |v| <= 62, IQ4_XS -127..113)
 * and not v + off, and corr = 128 * sum over sub-blocks of sc * sum(v). The pass multiplies the activations a + 128
 * (unsigned bytes) by v, so each sub-block's sum is sum(a * v) + 128 * sum(v), and isum - corr is
 * the reference's sum of sc * sum(a * v): one correction per row and super-block, where the
 * unsigned form subtracted off * sum(sc * bsum16) per row and token block (eight vpdpwssd; at 32
 * tokens and more a sixth of the IQ tiles' time). |corr| <= 16 * 128 * 512 * 128 < 2^28 (Q6_K,
 * the largest), the pass's isum at most 8 * 32 * 32 * 255 * 127 < 2^31 (IQ4_XS). The AMX walk
 * keeps the unsigned form (it folds the offset into its planes). */
static inline __attribute__((always_inline)) void byte_corr(int kind, byte_row *o) {
    const int sub16 = byte_kind_sub16(kind);
    /* the 32-value kinds' decoders store their 8 scales as 256 bits: a 512-bit load of them just
     * after that store cannot be forwarded and waited ~30 cycles a row (a third of the IQ4_XS
     * tile's samples at 16 tokens) */
    const __m512i ones = _mm512_set1_epi8(1),
                  sc = sub16 ? _mm512_loadu_si512((const void *)o->sc)
                             : _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)o->sc));
    /* lane l of chunk c (values 64c + 4l .. 64c + 4l + 3): sub-block 4c + l / 4 (16 values) or 2c + l / 8 */
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i sub = _mm512_srli_epi32(lane, sub16 ? 2 : 3);
    __m512i t = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i v = _mm512_load_si512((const void *)(o->q + 64 * c));
        const __m512i quad = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, v);
        const __m512i scv = _mm512_permutexvar_epi32(_mm512_add_epi32(sub, _mm512_set1_epi32(sub16 ? 4 * c : 2 * c)), sc);
        t = _mm512_add_epi32(t, _mm512_mullo_epi32(quad, scv));
    }
    /* the lanes' total in every lane (four exchanges), times 128: no trip through a scalar */
    t = _mm512_add_epi32(t, _mm512_shuffle_i64x2(t, t, _MM_SHUFFLE(1, 0, 3, 2)));
    t = _mm512_add_epi32(t, _mm512_shuffle_i64x2(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
    t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_BADC));
    t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_CDAB));
    _mm512_store_si512((void *)o->corr, _mm512_slli_epi32(t, 7));
}

/* one row's super-block x decoded into o; sgn: the offset types in the VNNI walk's signed form
 * (byte_corr), else as v + off (the AMX walk) */
static inline __attribute__((always_inline)) void byte_decode(int kind, const uint8_t *x, byte_row *o, int sgn) {
    if (kind == BYTE_Q6_K) unpack_q6_k8(x, o, sgn);
    else if (kind == BYTE_IQ2_XS) unpack_iq2_xs8(x, o, sgn ? 0 : 64);
    else if (kind == BYTE_IQ3_XXS) unpack_iq3_xxs8(x, o, sgn ? 0 : 64);
    else if (kind == BYTE_IQ4_XS) unpack_iq4_xs8(x, o, sgn);
    else unpack_k45_8(x, o, kind == BYTE_Q4_K ? 16 : 48, kind == BYTE_Q5_K);
}

/* the VNNI walk's float step of a super-block for R rows of exact integers isum[r] against one
 * token block's packed activations: Q4_K / Q5_K subtract the mins, the others their row's corr */
static inline __attribute__((always_inline)) void byte_float(int kind, const byte_row *rw, int R, const uint8_t *blk,
                                                             const __m512i *isum, __m512 *acc, int stride) {
    if (kind == BYTE_Q4_K || kind == BYTE_Q5_K) k45_float(rw, R, blk, isum, acc, stride);
    else q6_float(rw, R, blk, isum, acc, stride);
}


#endif
