/* Q4_K, Q5_K and Q6_K products of one to a few tokens with 512-bit VNNI, eight weight rows in the
 * lanes of one reduction tree (decode, a speculative step's verification, the last tokens of an
 * expert's prefill group).
 *
 * Why: the K-quant prefill tiles (kernels_avx512.c) put 16 tokens in the lanes, so a product of
 * 2-8 tokens ran them with most lanes empty (2 tokens: 137 GOP/s, Q4_K, two threads) or the
 * one-row dot once per token, and that dot spends half its time on one horizontal sum per
 * super-block (one token from DRAM: 48 GB/s where the memory gives ~60). Here the activations are
 * packed once per product and each row's super-block is decoded once for all its tokens; eight
 * rows and two super-blocks share one reduction tree (kernels_avx512_rows8.h), the layout of the
 * Q2_0 and 32-value block tiles.
 *
 * Exactness (the references are quant_dot_q4_k / _q5_k / _q6_k in formats/quant_kquants.c): per
 * super-block one exact integer isum = sum over sub-blocks of scale * sum(q * a), and for Q4_K /
 * Q5_K summs = sum of min * (32-value activation sums); then sum = sum + (d * da) * isum
 * [- (dmin * da) * summs], the reference's float steps in its order, a row's super-blocks one
 * after the other in its lane. The integers: vpdpbusd of the unsigned codes (Q4_K 0..15, Q5_K
 * 0..31, Q6_K q + 32 in 0..63) with the int8 activations gives 4-value sums of at most
 * 4 * 63 * 127 = 32,004 in magnitude, so a dword times its sub-block scale is one vpdpwssd with the
 * words [scale, 0] (the sum's high word, its sign, times 0); Q6_K's "- 32" comes off as
 * -32 * scale * (16-value activation sum) in words, |-32 * 128| < 2^15 (the sums themselves
 * reach 2,032 and could not be scaled in a word). Compiled with the AVX-512 level's flags
 * (CMakeLists.txt); kernels_register_avx512_krows composes them with the 16-lane tiles. */
#if defined(__x86_64__)

#include "backends/cpu/kernels_x86_common.h" /* first: contraction off, the helpers */

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_avx512_rows8.h"

#include <stdlib.h>

#define QK 256
#define Q8K_BYTES 292 /* d:f32 | 256 int8 | 16 int16 sums of 16 */
#define KR_TOKS 4     /* tokens per pass over a row group */

/* Packed activations, per token: np = ceil(nsb / 2) pairs of super-blocks, each KR_PAIR bytes:
 *   [0, 512)    the two super-blocks' 256 values (the second zero when the pair is short);
 *   [512, 768)  four vectors B_k: dword i = the int16 pair (s32[2k], s32[2k + 1]) of the
 *               super-block of the tree's lane i (rows8_reduce: block (i / 4) % 2), s32 the
 *               32-value sums (Q4_K / Q5_K mins);
 *   [768, 832)  the two super-blocks' sixteen 16-value sums (Q6_K's "- 32");
 *   [832, 840)  the two scales da (float). */
#define KR_PAIR 896
#define KR_B 512
#define KR_BS 768
#define KR_DA 832

static size_t kr_token_bytes(int64_t n) { return (size_t)((n / QK + 1) / 2) * KR_PAIR; }

enum { KR_Q4_K, KR_Q5_K, KR_Q6_K };
static const int kr_bytes[] = {144, 176, 210};

static void kr_pack(const int kind, int64_t n, const void *a, size_t a_stride, int t0, int t1, void *dst) {
    const int64_t nsb = n / QK, np = (nsb + 1) / 2;
    const size_t tb = kr_token_bytes(n);
    for (int t = t0; t < t1; t++) {
        const uint8_t *y = (const uint8_t *)a + (size_t)t * a_stride;
        uint8_t *p = (uint8_t *)dst + (size_t)t * tb;
        for (int64_t pi = 0; pi < np; pi++, p += KR_PAIR) {
            memset(p, 0, KR_PAIR);
            int16_t s32[2][8] = {{0}};
            float da[2] = {0.0f, 0.0f};
            for (int h = 0; h < 2 && 2 * pi + h < nsb; h++) {
                const uint8_t *blk = y + (size_t)(2 * pi + h) * Q8K_BYTES;
                if (kind == KR_Q6_K) {
                    memcpy(p + 256 * h, blk + 4, 256);
                } else { /* vector 2g + e: sub-blocks 4g + e, then 4g + e + 2 (kr_decode) */
                    for (int c = 0; c < 4; c++)
                        for (int half = 0; half < 2; half++)
                            memcpy(p + 256 * h + 64 * c + 32 * half, blk + 4 + 32 * (4 * (c / 2) + c % 2 + 2 * half), 32);
                }
                memcpy(p + KR_BS + 32 * h, blk + 260, 32);
                int16_t s16[16];
                memcpy(s16, blk + 260, 32);
                for (int j = 0; j < 8; j++) s32[h][j] = (int16_t)(s16[2 * j] + s16[2 * j + 1]); /* |s| <= 32 * 128 */
                memcpy(&da[h], blk, 4);
            }
            for (int k = 0; k < 4; k++)
                for (int i = 0; i < 16; i++) {
                    const int h = (i / 4) % 2;
                    memcpy(p + KR_B + 64 * k + 4 * i, &s32[h][2 * k], 4);
                }
            memcpy(p + KR_DA, da, 8);
        }
    }
}

/* Four equal words. */
#define KR_W4(x) ((long long)(x) * 0x0001000100010001LL)

/* One super-block of a row: its 256 values as four vectors of 64 (unsigned codes: Q6_K's q + 32;
 * Q6_K's in element order, Q4_K / Q5_K's in pairs of sub-blocks as they lie in the bytes), and for each pair of vectors (2j, 2j + 1) the sub-block scale of every
 * word of their 4-value sums packed to words (kr_isum); sm: Q4_K / Q5_K's 16 words of
 * k4_scales16 (scales, then mins), Q6_K's sixteen scales as words. */
static inline __attribute__((always_inline)) void kr_decode(const int kind, const uint8_t *x, __m512i v[4],
                                                           __m512i sc[2], __m256i *sm) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (kind == KR_Q6_K) {
        const __m512i m30 = _mm512_set1_epi8(0x30);
        const __m512i sl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
        const __m512i sr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) { /* elements 128h + 0..63 (low nibbles), + 64..127 (high) */
            const __m512i ql = _mm512_loadu_si512((const void *)(x + 64 * h));
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x + 128 + 32 * h)));
            /* lo: qh bits 0-1 (first 32 bytes) / 2-3 (last 32) to bits 4-5; hi: bits 4-5 / 6-7 */
            v[2 * h] = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, m4), _mm512_sllv_epi16(qh, sl), m30, 0xF8);
            v[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                                     _mm512_srlv_epi16(qh, sr), m30, 0xF8);
        }
        *sm = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + 192)));
        const __m512i s = _mm512_castsi256_si512(*sm);
        /* packed word k of 128-bit lane L: vector 2j + k / 4, its dword 4L + k % 4, whose
         * sub-block is 4 (2j + k / 4) + L */
        const __m512i base = _mm512_setr_epi64(KR_W4(0), KR_W4(4), KR_W4(1), KR_W4(5), KR_W4(2), KR_W4(6), KR_W4(3), KR_W4(7));
        sc[0] = _mm512_permutexvar_epi16(base, s);
        sc[1] = _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16(8)), s);
        return;
    }
    const int qs = kind == KR_Q4_K ? 16 : 48;
    *sm = k4_scales16(x + 4);
    const __m512i s = _mm512_castsi256_si512(*sm);
    __m512i qh = _mm512_setzero_si512();
    if (kind == KR_Q5_K) qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x + 16)));
    /* 64 code bytes at a time, chunks 2g and 2g + 1 of 32: their low nibbles are sub-blocks 4g and
     * 4g + 2, the high ones 4g + 1 and 4g + 3 (kr_pack orders the activations to match). Three
     * operations a vector where a broadcast chunk took a variable shift and a mask for each. */
#pragma GCC unroll 2
    for (int g = 0; g < 2; g++) {
        const __m512i q = _mm512_loadu_si512((const void *)(x + qs + 64 * g));
        v[2 * g] = _mm512_and_si512(q, m4);
        v[2 * g + 1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        if (kind == KR_Q5_K) { /* the fifth bit of chunk c's low (high) nibbles: qh bit 2c (2c + 1) */
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                const __m512i sel = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (4 * g + e))),
                                                       _mm256_set1_epi8((char)(1 << (4 * g + 2 + e))), 1);
                v[2 * g + e] = _mm512_mask_add_epi8(v[2 * g + e], _mm512_test_epi8_mask(qh, sel), v[2 * g + e],
                                                    _mm512_set1_epi8(16));
            }
        }
    }
    /* packed word k of 128-bit lane L: vector 2j + k / 4, its dword 4L + k % 4, whose sub-block is
     * 4j + k / 4 + 2 (L / 2) */
    const __m512i base = _mm512_setr_epi64(KR_W4(0), KR_W4(1), KR_W4(0), KR_W4(1), KR_W4(2), KR_W4(3), KR_W4(2), KR_W4(3));
    sc[0] = _mm512_permutexvar_epi16(base, s);
    sc[1] = _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16(4)), s);
}

/* One token's exact 16-lane sums of sum(scale * code * a) over a super-block: the 4-value sums
 * of vectors 2j and 2j + 1 (at most 32,004 in magnitude) packed to words, each pair of words
 * times its scale by one vpdpwssd: 6 VNNI instructions where a vpdpwssd per vector took 8. */
static inline __attribute__((always_inline)) __m512i kr_isum(const __m512i v[4], const __m512i sc[2],
                                                            const uint8_t *act) {
    __m512i p[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
        p[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[c], _mm512_loadu_si512((const void *)(act + 64 * c)));
    /* two chains, not one: the products of vectors 0-1 and 2-3 are independent */
    return _mm512_add_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(p[0], p[1]), sc[0]),
                            _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(p[2], p[3]), sc[1]));
}

/* Dwords 0-7: a's 16 lanes folded to 8; 8-15: b's. */
static inline __m512i kr_fold(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}

/* One group of ROWS8 rows against tn tokens (a constant after inlining), all super-blocks.
 * acc lanes 0-3 and 8-11 end as rows 0-3 and 4-7. */
static inline __attribute__((always_inline)) void kr_group(const int kind, int64_t nsb, const uint8_t *w0,
                                                          __m512i offs, const uint8_t *const wr[ROWS8],
                                                          const uint8_t *packed, size_t tb, const int tn,
                                                          const uint8_t *ahead, size_t ahead_bytes, __m512 acc[KR_TOKS]) {
    const int64_t np = (nsb + 1) / 2;
    const int bytes = kr_bytes[kind], pair_lines = (2 * ROWS8 * bytes + 63) / 64;
    const __m512i pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    /* tree inputs per token and row, and the mins of each (row, super-block) lane (Q4_K / Q5_K:
     * four int16 pairs a super-block, a row's two in one register, so that a 4 x 4 transpose
     * gives the lanes' pair k in vector k) */
    __m512i tin[KR_TOKS][ROWS8];
    __m256i mins[ROWS8]; /* row r: the mins of super-blocks b (low half) and b + 1 */
    for (int t = 0; t < tn; t++) acc[t] = _mm512_setzero_ps();
    /* Q4_K / Q5_K: d | dmin << 16; Q6_K: the dword ending with d (its bytes 206-209); no super-block
     * b + 1: not read. One token gathers a pair's dwords one pair ahead: the gather waits for its
     * 16 lines, and issued where they are used it held the pair's work back (~10% of the samples
     * of an L2-resident one-token product); more tokens have the work to hide it, and the register
     * a gather ahead holds cost them more than it saved (3-4 tokens: ~8% slower). */
#define KR_GATHER(P)                                                                                    \
    _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), 2 * (P) + 1 < nsb ? (__mmask16)0xffff : (__mmask16)0x0f0f, \
                                offs, (const void *)(w0 + 2 * (P) * bytes), 1)
    __m512i raw_next = tn == 1 ? KR_GATHER(0) : _mm512_setzero_si512();
    for (int64_t pi = 0; pi < np; pi++) {
        const int64_t b = 2 * pi;
        const bool two = b + 1 < nsb;
        const __m512i raw = tn == 1 ? raw_next : KR_GATHER(pi);
        if (tn == 1 && pi + 1 < np) raw_next = KR_GATHER(pi + 1);
        /* The bytes of the group two ahead (kr_run): 8 rows x two super-blocks a pair, in lines, to
         * L2 (T1). A pair asks for 18-26 lines at once; into L1 (T0) they waited on its few miss
         * buffers, and on a Zen 4 host one token read 13-18 GB/s from DRAM where T1 gives 25-30
         * (Q4_K; Q6_K 8-16 against 26-30; bench_kernels --toks 1 --threads 2 --mb 256,
         * alternating). The rows are read from L2 two groups later, which the L2-resident speed
         * shows costs nothing. One token spreads a whole pair's span over the rows' work below as
         * instructions with constant offsets (a loop of its own, with its bounds spilled, took
         * ~16% of the L2-resident samples); the group's last, partial span and more tokens take
         * the loop. */
        const char *pf = NULL;
        if (ahead) {
            const size_t off = (size_t)pi * (size_t)pair_lines * 64, end = off + (size_t)pair_lines * 64;
            if (tn == 1 && end <= ahead_bytes) {
                pf = (const char *)ahead + off;
            } else {
                for (size_t o = off; o < (end < ahead_bytes ? end : ahead_bytes); o += 64)
                    _mm_prefetch((const char *)ahead + o, _MM_HINT_T1);
            }
        }
        const uint8_t *pp = packed + (size_t)pi * KR_PAIR;
#pragma GCC unroll 8
        for (int r = 0; r < ROWS8; r++) {
            __m512i v[4], sc[2], a0[KR_TOKS], a1[KR_TOKS];
            __m256i sm0, sm1 = _mm256_setzero_si256();
            if (pf) {
#pragma GCC unroll 8
                for (int l = r * pair_lines / ROWS8; l < (r + 1) * pair_lines / ROWS8; l++)
                    _mm_prefetch(pf + 64 * l, _MM_HINT_T1);
            }
            kr_decode(kind, wr[r] + b * bytes, v, sc, &sm0);
            for (int t = 0; t < tn; t++) a0[t] = kr_isum(v, sc, pp + (size_t)t * tb);
            if (two) {
                kr_decode(kind, wr[r] + (b + 1) * bytes, v, sc, &sm1);
                for (int t = 0; t < tn; t++) a1[t] = kr_isum(v, sc, pp + (size_t)t * tb + 256);
            } else {
                for (int t = 0; t < tn; t++) a1[t] = _mm512_setzero_si512();
            }
            if (kind == KR_Q6_K) { /* "- 32": -32 * scale * (16-value sum), two sub-blocks a dword */
                const __m512i n32 = _mm512_sub_epi16(_mm512_setzero_si512(),
                                                     _mm512_slli_epi16(_mm512_inserti64x4(_mm512_castsi256_si512(sm0), sm1, 1), 5));
                for (int t = 0; t < tn; t++)
                    tin[t][r] = _mm512_dpwssd_epi32(kr_fold(a0[t], a1[t]), n32,
                                                    _mm512_loadu_si512((const void *)(pp + (size_t)t * tb + KR_BS)));
            } else {
                for (int t = 0; t < tn; t++) tin[t][r] = kr_fold(a0[t], a1[t]);
                mins[r] = _mm256_permute2x128_si256(sm0, sm1, 0x31);
            }
        }
        __m512i m[4];
        if (kind != KR_Q6_K) {
            /* z[q]: rows q and q + 4, each super-block b then b + 1, built in registers (a
             * 512-bit load of four 128-bit stores cannot be forwarded from the store buffer:
             * it waited for them to retire) */
            __m512i z[4];
            for (int q = 0; q < 4; q++) z[q] = _mm512_inserti64x4(_mm512_castsi256_si512(mins[q]), mins[q + 4], 1);
            const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
            const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
            m[0] = _mm512_unpacklo_epi64(t0, t2);
            m[1] = _mm512_unpackhi_epi64(t0, t2);
            m[2] = _mm512_unpacklo_epi64(t1, t3);
            m[3] = _mm512_unpackhi_epi64(t1, t3);
        }
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(kind == KR_Q6_K ? _mm512_srli_epi32(raw, 16)
                                                                                 : _mm512_and_si512(raw, _mm512_set1_epi32(0xffff))));
        const __m512 mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(raw, 16)));
#pragma GCC unroll 4
        for (int t = 0; t < tn; t++) {
            const uint8_t *p = pp + (size_t)t * tb;
            const __m512i isum = rows8_reduce(tin[t]);
            const __m128i da2 = _mm_loadl_epi64((const __m128i *)(p + KR_DA));
            const __m512 da = _mm512_permutexvar_ps(pair_idx, _mm512_castps128_ps512(_mm_castsi128_ps(da2)));
            __m512 prod = _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum));
            if (kind != KR_Q6_K) {
                __m512i summs = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++)
                    summs = _mm512_dpwssd_epi32(summs, m[k], _mm512_loadu_si512((const void *)(p + KR_B + 64 * k)));
                prod = _mm512_sub_ps(prod, _mm512_mul_ps(_mm512_mul_ps(mw, da), _mm512_cvtepi32_ps(summs)));
            }
            /* super-block b, then b + 1 (its lanes moved onto b's) */
            acc[t] = _mm512_add_ps(acc[t], prod);
            if (two) acc[t] = _mm512_add_ps(acc[t], _mm512_shuffle_f32x4(prod, prod, _MM_SHUFFLE(2, 3, 0, 1)));
        }
    }
#undef KR_GATHER
}

static inline __attribute__((always_inline)) void kr_run(const int kind, int64_t n, const void *w, size_t w_stride,
                                                         int rows, const void *packed, int toks, float *out,
                                                         size_t out_stride) {
    const int64_t nsb = n / QK;
    const int bytes = kr_bytes[kind], d_off = kind == KR_Q6_K ? 206 : 0;
    const size_t tb = kr_token_bytes(n);
    static const int lane_of[ROWS8] = {0, 1, 2, 3, 8, 9, 10, 11}; /* rows8_reduce's layout */
    /* the group two ahead (rows8.ahead; kernels_avx512_rows8.h): one ahead, a one-token Q4_K
     * product from DRAM read 34 GB/s and a decode step's experts 31 (bench_kernels
     * --experts-one, median), two ahead 38 and 35 (Zen 4, two threads; 2026-12-03 record) */
    rows8_prefetch_second(w, w_stride, rows);
    for (int r0 = 0; r0 < rows; r0 += ROWS8) {
        const rows8 g = rows8_at(w, w_stride, rows, r0);
        const __m512i offs = rows8_pair_offsets(&g, w_stride, (size_t)bytes, (size_t)d_off);
        for (int t0 = 0; t0 < toks; t0 += KR_TOKS) {
            const int tn = toks - t0 < KR_TOKS ? toks - t0 : KR_TOKS;
            const uint8_t *p = (const uint8_t *)packed + (size_t)t0 * tb;
            const uint8_t *pf = t0 == 0 ? g.ahead : NULL; /* later passes find the rows in L1 */
            __m512 acc[KR_TOKS];
            switch (tn) {
            case 1: kr_group(kind, nsb, g.w0, offs, g.wr, p, tb, 1, pf, g.ahead_bytes, acc); break;
            case 2: kr_group(kind, nsb, g.w0, offs, g.wr, p, tb, 2, pf, g.ahead_bytes, acc); break;
            case 3: kr_group(kind, nsb, g.w0, offs, g.wr, p, tb, 3, pf, g.ahead_bytes, acc); break;
            default: kr_group(kind, nsb, g.w0, offs, g.wr, p, tb, 4, pf, g.ahead_bytes, acc); break;
            }
            for (int t = 0; t < tn; t++) {
                float v[16];
                _mm512_storeu_ps(v, acc[t]);
                rows8_store(v, lane_of, g.nr, out + (size_t)(t0 + t) * out_stride + r0);
            }
        }
    }
}

/* ---- each type's tile: rows in lanes for a few tokens, the 16-lane tile for blocks of 16 ---- */

/* Up to kr_alone tokens the rows-in-lanes kernel runs alone; above, whole blocks of 16 go to the
 * 16-lane tile and a remainder to this one when that is cheaper. Both give the reference's bits,
 * so the split changes no value. The 16-lane tile runs its blocks in pairs (one decoded weight
 * quad feeds two vpdpbusd), a last odd block alone, so a remainder that pairs with an odd block
 * costs it little, and this kernel reads the rows again (from L2). bench_kernels --threads 2
 * --toks K, GOP/s, split against the 16-lane tile alone, Q4_K (Q6_K): 17 tokens 775 / 680
 * (632 / 529), 18: 723 / 712, 19: 748 / 790 (613 / 598), 21: 715 / 816, 24: 723 / 949;
 * 33: 1043 / 854, 36: 1005 / 956 (822 / 743), 37: 954 / 964, 38: 920 / 954, 40: 858 / 1015.
 * Alone, this kernel against the 16-lane tile at the same count: Q4_K 2: 326 / 135,
 * 4: 456 / 244, 6: 447 / 355, 8: 494 / 462; Q6_K 2: 274 / 125, 4: 347 / 202, 6: 366 / 301,
 * 8: 386 / 350. */
static int kr_alone[3] = {8, 8, 8}, kr_tail_alone[3] = {4, 4, 4}, kr_tail_paired[3] = {2, 2, 2};

/* Tokens [0, lanes) go to the 16-lane tile. */
static int kr_lanes_toks(const int kind, int toks) {
    if (toks <= kr_alone[kind]) return 0;
    const int tail = toks % 16, blocks = toks / 16; /* whole blocks: an odd count leaves the tail a partner */
    const int most = blocks % 2 ? kr_tail_paired[kind] : kr_tail_alone[kind];
    return tail && tail <= most ? toks - tail : toks;
}

static const kernel_tile *kr_lanes[3]; /* the 16-lane tiles this level registered */

static size_t kr_lanes_bytes(const int kind, int64_t n, int lanes) {
    return lanes ? (kr_lanes[kind]->packed_bytes(n, lanes) + 63) / 64 * 64 : 0;
}

static inline size_t kr_mix_bytes(const int kind, int64_t n, int toks) {
    const int lanes = kr_lanes_toks(kind, toks);
    return kr_lanes_bytes(kind, n, lanes) + kr_token_bytes(n) * (size_t)(toks - lanes);
}

static inline void kr_mix_pack(const int kind, int64_t n, const void *a, size_t as, int toks, int t0, int t1,
                               void *dst) {
    const int lanes = kr_lanes_toks(kind, toks);
    if (t0 < lanes) kr_lanes[kind]->pack(n, a, as, lanes, t0, t1 < lanes ? t1 : lanes, dst);
    if (t1 > lanes)
        kr_pack(kind, n, (const uint8_t *)a + (size_t)lanes * as, as, (t0 > lanes ? t0 : lanes) - lanes, t1 - lanes,
                (uint8_t *)dst + kr_lanes_bytes(kind, n, lanes));
}

/* Rows in blocks of KR_MIX_ROWS when both kernels run: the remainder's pass finds the rows the
 * 16-lane pass just read in L2. */
#define KR_MIX_ROWS 64

static inline __attribute__((always_inline)) void kr_mix_run(const int kind, int64_t n, const void *w, size_t ws,
                                                             int rows, const void *packed, int toks, float *out,
                                                             size_t os) {
    const int lanes = kr_lanes_toks(kind, toks);
    const uint8_t *kp = (const uint8_t *)packed + kr_lanes_bytes(kind, n, lanes);
    if (!lanes) {
        kr_run(kind, n, w, ws, rows, kp, toks, out, os);
        return;
    }
    if (lanes == toks) {
        kr_lanes[kind]->run(n, w, ws, rows, packed, toks, out, os);
        return;
    }
    for (int r0 = 0; r0 < rows; r0 += KR_MIX_ROWS) {
        const int nr = rows - r0 < KR_MIX_ROWS ? rows - r0 : KR_MIX_ROWS;
        const uint8_t *wr = (const uint8_t *)w + (size_t)r0 * ws;
        kr_lanes[kind]->run(n, wr, ws, nr, packed, lanes, out + r0, os);
        kr_run(kind, n, wr, ws, nr, kp, toks - lanes, out + (size_t)lanes * os + r0, os);
    }
}

#define KR_TILE(NAME, KIND, MIN)                                                                               \
    static size_t NAME##_bytes(int64_t n, int toks) { return kr_mix_bytes(KIND, n, toks); }                   \
    static void NAME##_pack(int64_t n, const void *a, size_t as, int toks, int t0, int t1, void *dst) {         \
        kr_mix_pack(KIND, n, a, as, toks, t0, t1, dst);                                                         \
    }                                                                                                           \
    static void NAME##_run(int64_t n, const void *w, size_t ws, int rows, const void *packed, int toks,          \
                           float *out, size_t os) {                                                             \
        kr_mix_run(KIND, n, w, ws, rows, packed, toks, out, os);                                                \
    }                                                                                                           \
    static kernel_tile NAME = {NAME##_bytes, NAME##_pack, NAME##_run, MIN, 0};
KR_TILE(tile_q4_k_mix, KR_Q4_K, 1)
KR_TILE(tile_q5_k_mix, KR_Q5_K, 1)
KR_TILE(tile_q6_k_mix, KR_Q6_K, 1)

/* Wraps the Q4_K, Q5_K and Q6_K tiles registered so far (kernels_register_avx512), all three from
 * one token on (Q4_K 50 -> 62 GB/s from L3; experts_one runs a layer's experts through it).
 * Q6_K started at two tokens while its one-row dot streamed faster (87 against 64 GB/s, an
 * earlier version of this kernel); now, alternating, `bench_kernels --types q6_k --mb 512`
 * gives the dot 31-48 GB/s and this kernel 52-54 on two threads (18-19 against 23-27 on one),
 * and a one-token product of 2048 x 768 rows from DRAM 105-109 against 138-140 GOP/s.
 * SLUICE_KROWS_ALONE, _TAIL, _TAIL_PAIRED and _MIN set the thresholds for measurements (0, 0, 0,
 * 3: the 16-lane tiles as before). */
void kernels_register_avx512_krows(kernel_set *ks) {
    const char *e;
    const uint32_t types[3] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    kernel_tile *mix[3] = {&tile_q4_k_mix, &tile_q5_k_mix, &tile_q6_k_mix};
    for (int k = 0; k < 3; k++) {
        if (!ks->tile[types[k]] || ks->tile[types[k]] == mix[k]) continue; /* none, or wrapped already */
        /* over the AMX tiles this kernel runs alone up to 4 tokens (Intel Xeon VM, one thread,
         * --mb 2, this kernel / AMX GOP/s: Q4_K 4: 130-133 / 90-96, 5: 115-118 / 113-119, 6:
         * 122-129 / 134-140; Q6_K 4: 117-118 / 90-97, 5: 104 / 112-115; bench/results/
         * 2026-12-03-cpu-amx.md) */
        if (kernel_tile_is_amx(ks->tile[types[k]])) kr_alone[k] = 4;
        if ((e = getenv("SLUICE_KROWS_ALONE"))) kr_alone[k] = atoi(e);
        if ((e = getenv("SLUICE_KROWS_TAIL"))) kr_tail_alone[k] = kr_tail_paired[k] = atoi(e);
        if ((e = getenv("SLUICE_KROWS_TAIL_PAIRED"))) kr_tail_paired[k] = atoi(e);
        if ((e = getenv("SLUICE_KROWS_MIN"))) mix[k]->min_toks = atoi(e);
        kr_lanes[k] = ks->tile[types[k]];
        ks->tile[types[k]] = mix[k];
    }
}

#endif
