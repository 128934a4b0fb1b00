/* The super-block types' products on AVX2 (no AVX-512): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K here and
 * the I-quants of 256 values (kernels_avx2_iq.h) against Q8_K activations, eight weight rows in the
 * lanes of one reduction, each row's super-block decoded once for up to four tokens.
 *
 * Why: on a CPU without AVX-512 (a Zen 1 EPYC VM, 2026-12-04) every such product ran the one-row
 * dot of kernels_x86.inc once per row and token. That dot ends each super-block with two
 * horizontal sums and scalar float steps, and decodes the row again for every token: one token
 * of Q4_K read 6.7 GB/s on two threads where the memory gives 17-18, and sluice decoded the
 * 30B-A3B shape at 0.73x and prefilled it at 0.57x of llama.cpp's AVX2 build
 * (bench/results/2026-12-04-cpu-avx2.md). Here the eight rows' per-lane partial sums meet in
 * one tree of horizontal adds (10 instructions for eight rows where the dot spent about 7 on
 * each), the float steps run on eight rows at once, and the scales and codes of a row's
 * super-block serve up to four tokens.
 *
 * Exactness (the references are quant_dot_q2_k ... _q6_k in formats/quant_kquants.c and
 * quant_dot_iq2_xxs ... _iq4_xs in formats/quant_iq.c): per super-block the exact
 * integers isum = sum over sub-blocks of scale * sum(q * a) (Q6_K with q + 32 and the "- 32"
 * taken off as 32 * sum(scale * 16-value activation sums), Q3_K likewise with q + 4) and, for
 * Q2_K / Q4_K / Q5_K, summs = sum of min * (16- or 32-value activation sums); then sum = sum +
 * ((d * da) * isum [- (dmin * da) * summs]), the reference's float steps in its order, a row's
 * super-blocks one after the other, and the I-quants' final factor (0.125, 0.25). maddubs's pair
 * sums stay below 2^15 (2 * 63 * 127), as in the dots. Compiled with the AVX2 level's flags
 * (CMakeLists.txt); registered by kernels_register_avx2 and replaced at the AVX-512 level by its
 * own tiles. */
#if defined(__x86_64__)

#include "backends/cpu/kernels_x86_common.h" /* first: contraction off, the helpers */

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_avx2_iq.h"
#include "backends/cpu/kernels_avx2_rows8.h"

#define QK 256
#define Q8K_BYTES 292 /* d:f32 | 256 int8 | 16 int16 sums of 16 */
#define A2_ROWS AVX2_ROWS8 /* rows in the lanes of one reduction */
#define A2_TOKS 4     /* tokens per pass over a group of rows */

enum { A2_Q4_K, A2_Q5_K, A2_Q6_K, A2_Q2_K, A2_Q3_K, A2_IQ2_XS, A2_IQ3_XXS, A2_IQ4_XS, A2_IQ2_XXS, A2_IQ2_S, A2_IQ3_S };
static const int a2_bytes[] = {144, 176, 210, 84, 110, 74, 98, 136, 66, 82, 110};
/* where a super-block keeps its d, f16 (kinds with mins: the dmin in the next two bytes) */
static const int a2_d_at[] = {0, 0, 208, 80, 108, 0, 0, 0, 0, 0, 0};
/* the reference's factor on the sum of a row's super-blocks (1: none) */
static const float a2_factor[] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.125f, 0.25f, 1.0f, 0.125f, 0.125f, 1.0f};
/* kinds with a dmin and the activations' sums (summs) */
#define A2_HAS_MINS(kind) ((kind) == A2_Q4_K || (kind) == A2_Q5_K || (kind) == A2_Q2_K)
#define A2_IS_IQ(kind) ((kind) >= A2_IQ2_XS) /* kernels_avx2_iq.h */

/* The packed activations are the Q8_K rows themselves, one after the other. */
static size_t a2_packed_bytes(int64_t n, int toks) { return (size_t)toks * (size_t)(n / QK) * Q8K_BYTES; }

/* The Q8_K rows of tokens t0 .. t1 - 1 copied, then (each: NULL for none) every copied
 * super-block handed to `each` to be put in a kind's own order. */
static void a2_pack_with(int64_t n, const void *a, size_t a_stride, int t0, int t1, void *dst, void (*each)(uint8_t *sb)) {
    const int64_t nsb = n / QK;
    const size_t row = (size_t)nsb * Q8K_BYTES;
    for (int t = t0; t < t1; t++) {
        uint8_t *r = (uint8_t *)dst + (size_t)t * row;
        memcpy(r, (const uint8_t *)a + (size_t)t * a_stride, row);
        if (each)
            for (int64_t b = 0; b < nsb; b++) each(r + (size_t)b * Q8K_BYTES);
    }
}

static void a2_pack(int64_t n, const void *a, size_t a_stride, int toks, int t0, int t1, void *dst) {
    (void)toks;
    a2_pack_with(n, a, a_stride, t0, t1, dst, NULL);
}

/* Q4_K / Q5_K take their mins per 32 values: each super-block's first eight 16-value sums
 * replaced by the eight 32-value sums (Q8_K codes are within +-127, so at most 32 * 127 in
 * magnitude: a word), so that a row's summs is one 128-bit madd by its eight mins. */
static void a2_sum32(uint8_t *sb) {
    int16_t s16[16], s32[8];
    memcpy(s16, sb + 260, sizeof s16);
    for (int j = 0; j < 8; j++) s32[j] = (int16_t)(s16[2 * j] + s16[2 * j + 1]);
    memcpy(sb + 260, s32, sizeof s32);
}

static void a2_pack_sum32(int64_t n, const void *a, size_t a_stride, int toks, int t0, int t1, void *dst) {
    (void)toks;
    a2_pack_with(n, a, a_stride, t0, t1, dst, a2_sum32);
}

/* IQ4_XS reads its activations two groups at a time (a2_iq4_xs_block): each super-block's
 * codes in that order; d and the sums stay where they are. */
static void a2_iq4_xs_codes(uint8_t *sb) { a2_iq4_xs_order(sb + 4); }

static void a2_pack_iq4_xs(int64_t n, const void *a, size_t a_stride, int toks, int t0, int t1, void *dst) {
    (void)toks;
    a2_pack_with(n, a, a_stride, t0, t1, dst, a2_iq4_xs_codes);
}

/* Row x's super-block against tn tokens' Q8_K blocks (y[t]): isum[t]'s lanes sum to the exact
 * isum; summs[t]'s (Q4_K / Q5_K) to summs. */
static inline __attribute__((always_inline)) void a2_block(const int kind, const uint8_t *x, const uint8_t *const y[A2_TOKS],
                                                          const int tn, __m256i isum[A2_TOKS], __m256i summs[A2_TOKS]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int t = 0; t < tn; t++) isum[t] = _mm256_setzero_si256();
    if (A2_IS_IQ(kind)) {
        if (kind == A2_IQ2_XS) a2_iq2_xs_block(x, y, tn, isum);
        if (kind == A2_IQ3_XXS) a2_iq3_xxs_block(x, y, tn, isum);
        if (kind == A2_IQ4_XS) a2_iq4_xs_block(x, y, tn, isum);
        if (kind == A2_IQ2_XXS) a2_iq2_xxs_block(x, y, tn, isum);
        if (kind == A2_IQ2_S) a2_iq2_s_block(x, y, tn, isum);
        if (kind == A2_IQ3_S) a2_iq3_s_block(x, y, tn, isum);
        return;
    }
    if (kind == A2_Q2_K || kind == A2_Q3_K) {
        /* 2-bit codes (Q3_K: and a third bit from hmask, q = u - 4), sixteen scales of 16 values;
         * Q2_K's mins against the 16-value sums, Q3_K's - 4 as 4 * sum(scale * 16-value sums) */
        __m128i sc8; /* the scales as bytes; scale pairs from them by one shuffle (lane_words_*) */
        if (kind == A2_Q2_K) {
            const __m128i raw = ldu128(x), nib = _mm_set1_epi8(0x0f);
            sc8 = _mm_and_si128(raw, nib);
            const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), nib));
#pragma GCC unroll 4
            for (int t = 0; t < tn; t++) summs[t] = _mm256_madd_epi16(ldu(y[t] + 260), mins);
        } else {
            sc8 = q3k_scales8(x + 96);
        }
        const __m256i scb = _mm256_broadcastsi128_si256(sc8);
        const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
        const __m256i hm = kind == A2_Q3_K ? ldu(x) : _mm256_setzero_si256();
        const int qs = kind == A2_Q2_K ? 16 : 32;
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i q = ldu(x + qs + 32 * h);
            /* Q3_K: its signed scales 8h .. 8h + 7 as words in both lanes (lane_words_w) */
            const __m256i sw = kind == A2_Q3_K ? _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_srli_si128(sc8, 8) : sc8))
                                               : _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const int j = 4 * h + k;
                __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3);
                if (kind == A2_Q3_K) u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, j), one), 2));
                const __m256i s = kind == A2_Q2_K ? lane_words_u8(scb, 2 * j, 2 * j + 1) : lane_words_w(sw, 2 * k, 2 * k + 1);
#pragma GCC unroll 4
                for (int t = 0; t < tn; t++)
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(u, ldu(y[t] + 4 + 32 * j)), s));
            }
        }
        if (kind == A2_Q3_K) {
#pragma GCC unroll 4
            for (int t = 0; t < tn; t++)
                isum[t] = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(_mm256_madd_epi16(ldu(y[t] + 260), _mm256_cvtepi8_epi16(sc8)), 2));
        }
        return;
    }
    if (kind == A2_Q6_K) {
        const __m128i sc8 = ldu128(x + 192); /* the sixteen scales */
        const __m256i sc = _mm256_cvtepi8_epi16(sc8);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i u[4];
            q6k_codes_half(x, h, u);
            /* scales 8h .. 8h + 7 as words in both lanes */
            const __m256i sw = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_srli_si128(sc8, 8) : sc8));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256i s = lane_words_w(sw, 2 * k, 2 * k + 1); /* sub-blocks 2j, 2j + 1 (j = 4h + k) */
#pragma GCC unroll 4
                for (int t = 0; t < tn; t++)
                    isum[t] = _mm256_add_epi32(isum[t],
                                               _mm256_madd_epi16(_mm256_maddubs_epi16(u[k], ldu(y[t] + 4 + 32 * (4 * h + k))), s));
            }
        }
        /* - 32 * sum(scale * 16-value sums) */
#pragma GCC unroll 4
        for (int t = 0; t < tn; t++)
            isum[t] = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(_mm256_madd_epi16(ldu(y[t] + 260), sc), 5));
        return;
    }
    const __m128i s8 = k4_scales8(x + 4); /* bytes 0..7 scales, 8..15 mins */
    /* the mins as words against the 32-value sums (a2_pack_sum32); the high lane is zero */
    const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(s8, 8));
#pragma GCC unroll 4
    for (int t = 0; t < tn; t++) summs[t] = _mm256_zextsi128_si256(_mm_madd_epi16(ldu128(y[t] + 260), mins));
    const int qs = kind == A2_Q4_K ? 16 : 48;
    const __m256i hb = kind == A2_Q5_K ? ldu(x + 16) : _mm256_setzero_si256();
    const __m256i one = _mm256_set1_epi8(1);
    /* word k of each 128-bit lane: scale k */
    const __m128i sw = _mm_cvtepu8_epi16(s8);
    const __m256i scl = _mm256_inserti128_si256(_mm256_castsi128_si256(sw), sw, 1);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i q = ldu(x + qs + 32 * c);
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (kind == A2_Q5_K) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c + 1), one), 4));
        }
        /* scales 2c and 2c + 1 in every word (word pairs 2c / 2c + 1 of the low lane, broadcast) */
        const __m256i sl = _mm256_shuffle_epi8(scl, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * c))));
        const __m256i sh = _mm256_shuffle_epi8(scl, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * c + 1))));
#pragma GCC unroll 4
        for (int t = 0; t < tn; t++) {
            const uint8_t *a = y[t] + 4 + 64 * c;
            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ldu(a)), sl));
            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ldu(a + 32)), sh));
        }
    }
}

/* The d and (kinds with mins) dmin of the super-blocks at byte off of eight rows (the dmin is
 * the f16 after the d; a word from the d would pass Q6_K's and Q3_K's block ends). */
static inline void a2_scales(const int kind, const uint8_t *const wr[A2_ROWS], size_t off, __m256 *dw, __m256 *mw) {
    const int doff = a2_d_at[kind];
    *mw = _mm256_setzero_ps();
    *dw = avx2_rows8_f16(wr, off + (size_t)doff, doff + 4 > a2_bytes[kind], A2_HAS_MINS(kind) ? mw : NULL);
}

/* Row r's super-block x against the tokens, its sums into column r of is (and ms); pf: the next
 * group's same super-block (NULL: none), asked of L2 (74-210 bytes, four lines at most). */
static inline __attribute__((always_inline)) void a2_row(const int kind, const uint8_t *x, const uint8_t *pf,
                                                        const uint8_t *const y[A2_TOKS], const int tn, int r,
                                                        __m256i is[A2_TOKS][A2_ROWS], __m256i ms[A2_TOKS][A2_ROWS]) {
    if (pf) {
#pragma GCC unroll 4
        for (int o = 0; o < a2_bytes[kind]; o += 64) _mm_prefetch((const char *)pf + o, _MM_HINT_T1);
    }
    __m256i i4[A2_TOKS], m4v[A2_TOKS];
    a2_block(kind, x, y, tn, i4, m4v);
#pragma GCC unroll 4
    for (int t = 0; t < tn; t++) {
        is[t][r] = i4[t];
        if (A2_HAS_MINS(kind)) ms[t][r] = m4v[t];
    }
}

/* Rows wr[0..7] (the last repeated past the end of the matrix) against tn tokens, all
 * super-blocks; acc[t] lane r ends as row r's product with token t. next: the next group's first
 * row (NULL: none), asked of L2 one super-block ahead of its use. */
static inline __attribute__((always_inline)) void a2_group(const int kind, int64_t nsb, const uint8_t *const wr[A2_ROWS],
                                                          const uint8_t *const next[A2_ROWS], const uint8_t *packed,
                                                          size_t tb, const int tn, __m256 acc[A2_TOKS]) {
    const int bytes = a2_bytes[kind];
#pragma GCC unroll 4
    for (int t = 0; t < tn; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const size_t off = (size_t)b * (size_t)bytes;
        const uint8_t *y[A2_TOKS];
#pragma GCC unroll 4
        for (int t = 0; t < A2_TOKS; t++) y[t] = packed + (size_t)(t < tn ? t : 0) * tb + (size_t)b * Q8K_BYTES;
        __m256i is[A2_TOKS][A2_ROWS], ms[A2_TOKS][A2_ROWS];
        /* one row at a time: unrolled over the rows, the decoding kept more values live than
         * AVX2's sixteen registers hold (gcc spilled the I-quants' grid indices) and the loop
         * grew to 3-5 KB of code; rolled, one token ran Q6_K +20%, Q2_K +14%, Q3_K +9%, Q5_K +4%
         * faster and Q4_K the same (bench_kernels --toks 1, Zen 1, 2026-12-05) */
#pragma GCC unroll 1
        for (int r = 0; r < A2_ROWS; r++) a2_row(kind, wr[r] + off, next ? next[r] + off : NULL, y, tn, r, is, ms);
        __m256 dw, mw;
        a2_scales(kind, wr, off, &dw, &mw);
#pragma GCC unroll 4
        for (int t = 0; t < tn; t++) {
            const __m256 da = _mm256_set1_ps(ld_f32(y[t]));
            __m256 prod = _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(hadd8_i32(is[t])));
            if (A2_HAS_MINS(kind))
                prod = _mm256_sub_ps(prod, _mm256_mul_ps(_mm256_mul_ps(mw, da), _mm256_cvtepi32_ps(hadd8_i32(ms[t]))));
            acc[t] = _mm256_add_ps(acc[t], prod);
        }
    }
}

static inline __attribute__((always_inline)) void a2_run(const int kind, int64_t n, const void *w, size_t w_stride,
                                                         int rows, const void *packed, int toks, float *out,
                                                         size_t out_stride) {
    const int64_t nsb = n / QK;
    const size_t tb = (size_t)nsb * Q8K_BYTES;
    /* the tokens in passes whose activations stay in L2 (kernels.h) */
    const int pass = kernel_tile_pass_units(toks, tb, A2_TOKS, toks > A2_TOKS ? toks : A2_TOKS);
    for (int p0 = 0; p0 < toks; p0 += pass) {
        const int p1 = toks - p0 < pass ? toks : p0 + pass;
        for (int r0 = 0; r0 < rows; r0 += A2_ROWS) {
            const uint8_t *wr[A2_ROWS], *nx[A2_ROWS];
            const int nr = avx2_rows8_at(w, w_stride, rows, r0, wr, nx);
            const bool more = r0 + A2_ROWS < rows;
            for (int t0 = p0; t0 < p1; t0 += A2_TOKS) {
                const int tn = p1 - t0 < A2_TOKS ? p1 - t0 : A2_TOKS;
                const uint8_t *p = (const uint8_t *)packed + (size_t)t0 * tb;
                /* the first pass over the group asks for the next group; later ones find it in cache */
                const uint8_t *const *pf = more && t0 == p0 ? nx : NULL;
                __m256 acc[A2_TOKS] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
                switch (tn) {
                case 1: a2_group(kind, nsb, wr, pf, p, tb, 1, acc); break;
                case 2: a2_group(kind, nsb, wr, pf, p, tb, 2, acc); break;
                case 3: a2_group(kind, nsb, wr, pf, p, tb, 3, acc); break;
                default: a2_group(kind, nsb, wr, pf, p, tb, 4, acc); break;
                }
                if (a2_factor[kind] != 1.0f) /* factor * sum, as the reference ends */
                    for (int t = 0; t < tn; t++) acc[t] = _mm256_mul_ps(_mm256_set1_ps(a2_factor[kind]), acc[t]);
                avx2_rows8_store(acc, tn, nr, out, out_stride, t0, r0);
            }
        }
    }
}

#define A2_TILE(NAME, KIND, PACK)                                                                       \
    static void NAME##_run(int64_t n, const void *w, size_t ws, int rows, const void *packed, int toks,   \
                           float *out, size_t os) {                                                      \
        a2_run(KIND, n, w, ws, rows, packed, toks, out, os);                                             \
    }                                                                                                    \
    static const kernel_tile NAME = {a2_packed_bytes, PACK, NAME##_run, 1, A2_ROWS};
A2_TILE(tile_q4_k_a2, A2_Q4_K, a2_pack_sum32)
A2_TILE(tile_q5_k_a2, A2_Q5_K, a2_pack_sum32)
A2_TILE(tile_q6_k_a2, A2_Q6_K, a2_pack)
A2_TILE(tile_q2_k_a2, A2_Q2_K, a2_pack)
A2_TILE(tile_q3_k_a2, A2_Q3_K, a2_pack)
A2_TILE(tile_iq2_xs_a2, A2_IQ2_XS, a2_pack)
A2_TILE(tile_iq3_xxs_a2, A2_IQ3_XXS, a2_pack)
A2_TILE(tile_iq4_xs_a2, A2_IQ4_XS, a2_pack_iq4_xs)
A2_TILE(tile_iq2_xxs_a2, A2_IQ2_XXS, a2_pack)
A2_TILE(tile_iq2_s_a2, A2_IQ2_S, a2_pack)
A2_TILE(tile_iq3_s_a2, A2_IQ3_S, a2_pack)

/* From one token on (min_toks 1); a thread's rows start at a multiple of eight (row_group). */
void kernels_register_avx2_krows(kernel_set *ks) {
    ks->tile[GGML_TYPE_Q4_K] = &tile_q4_k_a2;
    ks->tile[GGML_TYPE_Q5_K] = &tile_q5_k_a2;
    ks->tile[GGML_TYPE_Q6_K] = &tile_q6_k_a2;
    ks->tile[GGML_TYPE_Q2_K] = &tile_q2_k_a2;
    ks->tile[GGML_TYPE_Q3_K] = &tile_q3_k_a2;
    ks->tile[GGML_TYPE_IQ2_XS] = &tile_iq2_xs_a2;
    ks->tile[GGML_TYPE_IQ3_XXS] = &tile_iq3_xxs_a2;
    ks->tile[GGML_TYPE_IQ4_XS] = &tile_iq4_xs_a2;
    ks->tile[GGML_TYPE_IQ2_XXS] = &tile_iq2_xxs_a2;
    ks->tile[GGML_TYPE_IQ2_S] = &tile_iq2_s_a2;
    ks->tile[GGML_TYPE_IQ3_S] = &tile_iq3_s_a2;
}

#endif
