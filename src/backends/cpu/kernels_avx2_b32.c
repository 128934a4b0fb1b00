/* The 32-value block types' products on AVX2 (no AVX-512): Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4 against
 * Q8_0 activations and Q4_1, Q5_1 against Q8_1, eight weight rows in the lanes of one reduction,
 * up to four tokens a pass.
 *
 * Why: on a CPU without AVX-512 these products ran the one-row dots of kernels_x86.inc, which end
 * every 32-value block with a horizontal sum and scalar float multiplies: per 32 values about four
 * instructions of products and a dozen of reduction. Here the eight rows' partial sums of a block
 * meet in one tree (hadd8_i32, ten instructions for eight rows), the float steps run on eight
 * lanes, and a row's block is decoded once for the pass's tokens.
 *
 * Exactness (the references are quant_dot_q8_0 ... _mxfp4 in formats/quant_legacy.c): per block
 * the exact isum = sum(w * a) (signed codes as |w| * (a with w's sign) by maddubs: pairs of at
 * most 2 * 128 * 127, below 2^15, as in the dots; Q4_1 / Q5_1's unsigned codes straight), then
 * the reference's float step on the eight lanes with its operands in its order (b8_step), a row's
 * blocks one after the other in its lane. Compiled with the AVX2 level's flags (CMakeLists.txt);
 * the AVX-512 level registers its own tiles (kernels_avx512_b32.c) over these. */
#if defined(__x86_64__)

#include "backends/cpu/kernels_x86_common.h" /* first: contraction off, the helpers */

#include "backends/cpu/kernels.h"
#include "formats/quant.h"
#include "backends/cpu/kernels_avx2_rows8.h"

#define B8_ROWS AVX2_ROWS8
#define B8_TOKS 4

enum { B8_Q8_0, B8_Q4_0, B8_Q5_0, B8_IQ4_NL, B8_MXFP4, B8_Q4_1, B8_Q5_1 };
static const int b8_bytes[] = {34, 18, 22, 18, 17, 20, 24};
/* Q4_1 / Q5_1: unsigned codes, a min, Q8_1 activations (f16 d | f16 s | 32 int8, 36 bytes) */
#define B8_Q8_1(kind) ((kind) == B8_Q4_1 || (kind) == B8_Q5_1)
#define B8_ACT_BYTES(kind) (B8_Q8_1(kind) ? 36 : 34)

/* The packed activations are the Q8_0 / Q8_1 rows themselves, one after the other. */
static inline size_t b8_packed(int kind, int64_t n, int toks) { return (size_t)toks * (size_t)(n / 32) * (size_t)B8_ACT_BYTES(kind); }

static inline void b8_copy(int kind, int64_t n, const void *a, size_t a_stride, int t0, int t1, void *dst) {
    const size_t row = (size_t)(n / 32) * (size_t)B8_ACT_BYTES(kind);
    for (int t = t0; t < t1; t++) memcpy((uint8_t *)dst + (size_t)t * row, (const uint8_t *)a + (size_t)t * a_stride, row);
}

/* A row's block as 32 codes: signed (w; the sum takes |w| and the activations' signs from it)
 * or, for Q4_1 / Q5_1, unsigned. */
static inline __m256i b8_codes(const int kind, const uint8_t *x) {
    switch (kind) {
    case B8_Q4_0: return _mm256_sub_epi8(nibbles32(x + 2), _mm256_set1_epi8(8));
    case B8_Q5_0: return _mm256_sub_epi8(_mm256_or_si256(nibbles32(x + 6), q5_high(x + 2)), _mm256_set1_epi8(16));
    case B8_IQ4_NL: return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(ldu128(quant_kvalues_iq4nl)), nibbles32(x + 2));
    case B8_MXFP4: return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(ldu128(quant_kvalues_mxfp4)), nibbles32(x + 1));
    case B8_Q4_1: return nibbles32(x + 4);
    case B8_Q5_1: return _mm256_or_si256(nibbles32(x + 8), q5_high(x + 4));
    default: return ldu(x + 2);
    }
}

/* MXFP4's scale 2^(e - 128) (e = 0, 1: float subnormals), as quant_legacy.c's e8m0_half. */
static inline float b8_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? (0x00200000u << e) : ((uint32_t)(e - 1) << 23);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* acc + the reference's float step of one block on eight rows' lanes: dw, mw the rows' scales and
 * mins, da, sa the token's scale and sum, isum the exact integers. */
static inline __m256 b8_step(const int kind, __m256 acc, __m256 dw, __m256 mw, __m256 da, __m256 sa, __m256 isum) {
    switch (kind) {
    case B8_Q4_0: return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(isum, dw), da)); /* isum * dw * da */
    case B8_Q5_0: return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dw, da), isum));
    case B8_IQ4_NL:
    case B8_MXFP4: return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(da, dw), isum));
    case B8_Q4_1:
    case B8_Q5_1: return _mm256_add_ps(acc, _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(dw, da), isum), _mm256_mul_ps(mw, sa)));
    default: return _mm256_add_ps(acc, _mm256_mul_ps(isum, _mm256_mul_ps(dw, da))); /* Q8_0: isum * (dw * da) */
    }
}

/* Rows wr[0..7] against tn tokens; acc[t] lane r ends as row r's product with token t. next: the
 * next group's rows, asked of L2 a block ahead of their use (NULL: none). */
static inline __attribute__((always_inline)) void b8_group(const int kind, int64_t nb, const uint8_t *const wr[B8_ROWS],
                                                          const uint8_t *const next[B8_ROWS], const uint8_t *packed,
                                                          size_t tb, const int tn, __m256 acc[B8_TOKS]) {
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int t = 0; t < tn; t++) acc[t] = _mm256_setzero_ps();
    const int bytes = b8_bytes[kind], ab = B8_ACT_BYTES(kind), aq = B8_Q8_1(kind) ? 4 : 2;
    for (int64_t b = 0; b < nb; b++) {
        const size_t off = (size_t)b * (size_t)bytes, aoff = (size_t)b * (size_t)ab;
        __m256i is[B8_TOKS][B8_ROWS];
        uint16_t d[B8_ROWS];
        float e[B8_ROWS];
        /* a line of the next group's rows each time a block starts a new one (17-34 bytes a block) */
        const bool pf = next && (int)(off & 63) < bytes;
#pragma GCC unroll 8
        for (int r = 0; r < B8_ROWS; r++) {
            if (pf) _mm_prefetch((const char *)next[r] + off, _MM_HINT_T1);
            const uint8_t *x = wr[r] + off;
            const __m256i w = b8_codes(kind, x);
            const __m256i u = B8_Q8_1(kind) ? w : _mm256_sign_epi8(w, w);
            if (kind == B8_MXFP4) e[r] = b8_e8m0_half(x[0]);
            else if (!B8_Q8_1(kind)) memcpy(&d[r], x, 2);
#pragma GCC unroll 4
            for (int t = 0; t < tn; t++) {
                __m256i a = ldu(packed + (size_t)t * tb + aoff + (size_t)aq);
                if (!B8_Q8_1(kind)) a = _mm256_sign_epi8(a, w);
                is[t][r] = _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), ones);
            }
        }
        /* Q4_1 / Q5_1: the d and the min after it, one 32-bit load a row (avx2_rows8_f16; two
         * f16 copied a row through the stack: Q4_1 one token 3.9 against 5.5 GB/s). The single d
         * of the other kinds stays a 2-byte copy: there the vector unit is the busier side
         * (Q4_0 4.7 against 4.5 GB/s, Q5_0 4.3 against 4.1, Q8_0 the same; Zen 1, 2026-12-05). */
        __m256 mw = _mm256_setzero_ps();
        const __m256 dw = kind == B8_MXFP4 ? _mm256_loadu_ps(e)
                          : B8_Q8_1(kind)  ? avx2_rows8_f16(wr, off, 0, &mw)
                                           : _mm256_cvtph_ps(ldu128(d));
#pragma GCC unroll 4
        for (int t = 0; t < tn; t++) {
            const uint8_t *y = packed + (size_t)t * tb + aoff;
            const __m256 da = _mm256_set1_ps(ld_f16(y)), sa = B8_Q8_1(kind) ? _mm256_set1_ps(ld_f16(y + 2)) : da;
            acc[t] = b8_step(kind, acc[t], dw, mw, da, sa, _mm256_cvtepi32_ps(hadd8_i32(is[t])));
        }
    }
}

static inline __attribute__((always_inline)) void b8_run(const int kind, int64_t n, const void *w, size_t w_stride,
                                                         int rows, const void *packed, int toks, float *out,
                                                         size_t out_stride) {
    const int64_t nb = n / 32;
    const size_t tb = (size_t)nb * (size_t)B8_ACT_BYTES(kind);
    /* the tokens in passes whose activations stay in L2 (kernels.h) */
    const int pass = kernel_tile_pass_units(toks, tb, B8_TOKS, toks > B8_TOKS ? toks : B8_TOKS);
    for (int p0 = 0; p0 < toks; p0 += pass) {
        const int p1 = toks - p0 < pass ? toks : p0 + pass;
        for (int r0 = 0; r0 < rows; r0 += B8_ROWS) {
            const uint8_t *wr[B8_ROWS], *nx[B8_ROWS];
            const int nr = avx2_rows8_at(w, w_stride, rows, r0, wr, nx);
            const bool more = r0 + B8_ROWS < rows;
            for (int t0 = p0; t0 < p1; t0 += B8_TOKS) {
                const int tn = p1 - t0 < B8_TOKS ? p1 - t0 : B8_TOKS;
                const uint8_t *p = (const uint8_t *)packed + (size_t)t0 * tb;
                const uint8_t *const *pf = more && t0 == p0 ? nx : NULL; /* later passes find them cached */
                __m256 acc[B8_TOKS] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
                switch (tn) {
                case 1: b8_group(kind, nb, wr, pf, p, tb, 1, acc); break;
                case 2: b8_group(kind, nb, wr, pf, p, tb, 2, acc); break;
                case 3: b8_group(kind, nb, wr, pf, p, tb, 3, acc); break;
                default: b8_group(kind, nb, wr, pf, p, tb, 4, acc); break;
                }
                avx2_rows8_store(acc, tn, nr, out, out_stride, t0, r0);
            }
        }
    }
}

/* From one token on (min_toks 1); a thread's rows start at a multiple of eight (row_group). */
#define B8_TILE(NAME, KIND)                                                                                    \
    static size_t NAME##_bytes(int64_t n, int toks) { return b8_packed(KIND, n, toks); }                      \
    static void NAME##_pack(int64_t n, const void *a, size_t as, int toks, int t0, int t1, void *dst) {       \
        (void)toks;                                                                                            \
        b8_copy(KIND, n, a, as, t0, t1, dst);                                                                  \
    }                                                                                                          \
    static void NAME##_run(int64_t n, const void *w, size_t ws, int rows, const void *packed, int toks,        \
                           float *out, size_t os) {                                                            \
        b8_run(KIND, n, w, ws, rows, packed, toks, out, os);                                                   \
    }                                                                                                          \
    static const kernel_tile NAME = {NAME##_bytes, NAME##_pack, NAME##_run, 1, B8_ROWS};
B8_TILE(tile_q8_0_b8, B8_Q8_0)
B8_TILE(tile_q4_0_b8, B8_Q4_0)
B8_TILE(tile_q5_0_b8, B8_Q5_0)
B8_TILE(tile_iq4_nl_b8, B8_IQ4_NL)
B8_TILE(tile_mxfp4_b8, B8_MXFP4)
B8_TILE(tile_q4_1_b8, B8_Q4_1)
B8_TILE(tile_q5_1_b8, B8_Q5_1)

void kernels_register_avx2_b32(kernel_set *ks) {
    ks->tile[GGML_TYPE_Q8_0] = &tile_q8_0_b8;
    ks->tile[GGML_TYPE_Q4_0] = &tile_q4_0_b8;
    ks->tile[GGML_TYPE_Q5_0] = &tile_q5_0_b8;
    ks->tile[GGML_TYPE_IQ4_NL] = &tile_iq4_nl_b8;
    ks->tile[GGML_TYPE_MXFP4] = &tile_mxfp4_b8;
    ks->tile[GGML_TYPE_Q4_1] = &tile_q4_1_b8;
    ks->tile[GGML_TYPE_Q5_1] = &tile_q5_1_b8;
}

#endif
