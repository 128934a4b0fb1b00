/* The Q6_K_R16 tile (formats/quant_q6k_r16.c has the layout): sixteen interleaved Q6_K rows in
 * the lanes of 512-bit vectors, for products of a few tokens (the MTP verification's head).
 *
 * Per super-block and sub-block s: the 4 quads' codes of all 16 rows are unpacked once (L[2s],
 * L[2s + 1], H[s]: and, shift, ternary logic), then for each token one vpdpbusd per quad with
 * the token's 4 activations broadcast, starting from -32 * (the sub-block's activation sum),
 * leaves lane r with row r's exact sum(q * a) of the sub-block; times its scale (vpmulld) into
 * the super-block's isum. Then per lane the reference's float step, sum + (d * da) * isum,
 * super-block after super-block: quant_dot_q6_k's bits (test_kernels compares them). Compiled
 * with the AVX-512 level's flags (CMakeLists.txt). */
#if defined(__x86_64__)

#include "backends/cpu/kernels_x86_common.h" /* first: contraction off, the helpers */

#include "backends/cpu/kernels.h"

#define QK 256
#define R QUANT_R16_ROWS
#define SB_BYTES (R * 210)
#define Q8K_BYTES 292
#define R16_TOKS 4 /* tokens per pass over a group */
#define R16_AHEAD 4 /* super-blocks prefetched ahead */

/* Packed activations, per token and super-block, R16_SB bytes: [0, 256) the Q8_K values,
 * [256, 320) the sixteen -32 * (16-value sums) as int32, [320, 324) da. */
#define R16_SB 384

static size_t r16_token_bytes(int64_t n) { return (size_t)(n / QK) * R16_SB; }

static size_t r16_packed_bytes(int64_t n, int toks) { return r16_token_bytes(n) * (size_t)toks; }

static void r16_pack(int64_t n, const void *a, size_t a_stride, int toks, int t0, int t1, void *dst) {
    (void)toks;
    const int64_t nsb = n / QK;
    for (int t = t0; t < t1; t++) {
        const uint8_t *y = (const uint8_t *)a + (size_t)t * a_stride;
        uint8_t *p = (uint8_t *)dst + (size_t)t * r16_token_bytes(n);
        for (int64_t b = 0; b < nsb; b++, y += Q8K_BYTES, p += R16_SB) {
            memcpy(p, y + 4, 256);
            for (int s = 0; s < 16; s++) {
                int16_t bs;
                memcpy(&bs, y + 260 + 2 * s, 2);
                const int32_t v = -32 * (int32_t)bs;
                memcpy(p + 256 + 4 * s, &v, 4);
            }
            memcpy(p + 320, y, 4);
        }
    }
}

/* One group of 16 rows against tn tokens (a constant after inlining): sums into acc[t]. */
static inline __attribute__((always_inline)) void r16_group(int64_t nsb, const uint8_t *g, const uint8_t *packed,
                                                           size_t tb, const int tn, __m512 acc[R16_TOKS]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    for (int t = 0; t < tn; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nsb; b++, g += SB_BYTES) {
        __m512i isum[R16_TOKS];
        for (int t = 0; t < tn; t++) isum[t] = _mm512_setzero_si512();
        const uint8_t *pp = packed + (size_t)b * R16_SB;
#pragma GCC unroll 2
        for (int s = 0; s < 16; s++) {
            /* the super-block R16_AHEAD on, four lines a sub-block (its 53 lines in 14): a
             * group's blocks are one stream the hardware alone fetched too late (one thread,
             * a 137 MB matrix: 24.9 ns a row and super-block at one token, where the rows-in-
             * vectors kernel with its prefetch took 16.9) */
            for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(g + R16_AHEAD * SB_BYTES + 256 * s + 64 * l), _MM_HINT_T0);
            const __m512i l0 = _mm512_loadu_si512((const void *)(g + 64 * (2 * s)));
            const __m512i l1 = _mm512_loadu_si512((const void *)(g + 64 * (2 * s + 1)));
            const __m512i h = _mm512_loadu_si512((const void *)(g + 2048 + 64 * s));
            __m512i v[4];
            /* quad 4s + j: low bits from L[2s + j / 2] (nibble j % 2), top bits from H[s] bits 2j */
            v[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(l0, m4), _mm512_slli_epi16(h, 4), m30, 0xF8);
            v[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), _mm512_slli_epi16(h, 2), m30, 0xF8);
            v[2] = _mm512_ternarylogic_epi32(_mm512_and_si512(l1, m4), h, m30, 0xF8);
            v[3] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4), _mm512_srli_epi16(h, 2), m30, 0xF8);
            const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(g + 3072 + 16 * s)));
            for (int t = 0; t < tn; t++) {
                const uint8_t *p = pp + (size_t)t * tb;
                const int32_t *q4 = (const int32_t *)(const void *)(p + 16 * s);
                __m512i part = _mm512_set1_epi32(*(const int32_t *)(const void *)(p + 256 + 4 * s));
                part = _mm512_dpbusd_epi32(part, v[0], _mm512_set1_epi32(q4[0]));
                part = _mm512_dpbusd_epi32(part, v[1], _mm512_set1_epi32(q4[1]));
                part = _mm512_dpbusd_epi32(part, v[2], _mm512_set1_epi32(q4[2]));
                part = _mm512_dpbusd_epi32(part, v[3], _mm512_set1_epi32(q4[3]));
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(part, sc));
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + 3328)));
        for (int t = 0; t < tn; t++) {
            float da;
            memcpy(&da, pp + (size_t)t * tb + 320, 4);
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(da)), _mm512_cvtepi32_ps(isum[t])));
        }
    }
}

static void r16_run(int64_t n, const void *w, size_t w_stride, int rows, const void *packed, int toks, float *out,
                    size_t out_stride) {
    const int64_t nsb = n / QK;
    const size_t tb = r16_token_bytes(n);
    for (int g0 = 0; g0 + R <= rows; g0 += R) {
        const uint8_t *g = (const uint8_t *)w + (size_t)g0 * w_stride;
        for (int t0 = 0; t0 < toks; t0 += R16_TOKS) {
            const int tn = toks - t0 < R16_TOKS ? toks - t0 : R16_TOKS;
            const uint8_t *p = (const uint8_t *)packed + (size_t)t0 * tb;
            __m512 acc[R16_TOKS];
            switch (tn) {
            case 1: r16_group(nsb, g, p, tb, 1, acc); break;
            case 2: r16_group(nsb, g, p, tb, 2, acc); break;
            case 3: r16_group(nsb, g, p, tb, 3, acc); break;
            default: r16_group(nsb, g, p, tb, 4, acc); break;
            }
            for (int t = 0; t < tn; t++) _mm512_storeu_ps(out + (size_t)(t0 + t) * out_stride + g0, acc[t]);
        }
    }
}

static const kernel_tile tile_q6_k_r16 = {r16_packed_bytes, r16_pack, r16_run, 1, R};

void kernels_register_avx512_q6k_r16(kernel_set *ks) { ks->tile[SLUICE_TYPE_Q6_K_R16] = &tile_q6_k_r16; }

#endif
