/* Q8_0 products on AVX2 (no AVX-512): eight weight rows in the lanes of one reduction, up to four
 * tokens a pass.
 *
 * Why: on a CPU without AVX-512 a Q8_0 product ran the one-row dot of kernels_x86.inc, which
 * ends every 32-value block with a horizontal sum and two scalar float multiplies: per 32 values
 * about four instructions of products and a dozen of reduction. Here the eight rows' partial
 * sums of a block meet in one tree (hadd8_i32, ten instructions for eight rows) and the float
 * steps run on eight lanes.
 *
 * Exactness (the reference is quant_dot_q8_0 in formats/quant_legacy.c): per block the exact
 * isum = sum(w * a) (|w| * (a with w's sign) by maddubs: pairs of at most 2 * 128 * 127, below
 * 2^15, as in the dot), then sum = sum + (float)isum * (dw * da), the reference's float steps in
 * its order, a row's blocks one after the other in its lane. Compiled with the AVX2 level's flags
 * (CMakeLists.txt); the AVX-512 level registers its own tile (kernels_avx512_b32.c) over it. */
#if defined(__x86_64__)

#include "backends/cpu/kernels_x86_common.h" /* first: contraction off, the helpers */

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_avx2_rows8.h"

#define B32_BYTES 34 /* f16 d | 32 int8, weights and activations alike */
#define B8_ROWS AVX2_ROWS8
#define B8_TOKS 4

static size_t b8_packed_bytes(int64_t n, int toks) { return (size_t)toks * (size_t)(n / 32) * B32_BYTES; }

static void b8_pack(int64_t n, const void *a, size_t a_stride, int toks, int t0, int t1, void *dst) {
    (void)toks;
    const size_t row = (size_t)(n / 32) * B32_BYTES;
    for (int t = t0; t < t1; t++) memcpy((uint8_t *)dst + (size_t)t * row, (const uint8_t *)a + (size_t)t * a_stride, row);
}

/* Rows wr[0..7] against tn tokens; acc[t] lane r ends as row r's product with token t. next: the
 * next group's rows, asked of L2 a block ahead of their use (NULL: none). */
static inline __attribute__((always_inline)) void b8_group(int64_t nb, const uint8_t *const wr[B8_ROWS],
                                                          const uint8_t *const next[B8_ROWS], const uint8_t *packed,
                                                          size_t tb, const int tn, __m256 acc[B8_TOKS]) {
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int t = 0; t < tn; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const size_t off = (size_t)b * B32_BYTES;
        __m256i is[B8_TOKS][B8_ROWS];
        uint16_t d[B8_ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < B8_ROWS; r++) {
            if (next && (b & 1) == 0) _mm_prefetch((const char *)next[r] + off, _MM_HINT_T1); /* 68 bytes: two blocks a line */
            const __m256i w = ldu(wr[r] + off + 2);
            const __m256i u = _mm256_sign_epi8(w, w);
            memcpy(&d[r], wr[r] + off, 2);
#pragma GCC unroll 4
            for (int t = 0; t < tn; t++) {
                const __m256i a = ldu(packed + (size_t)t * tb + off + 2);
                is[t][r] = _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(a, w)), ones);
            }
        }
        const __m256 dw = _mm256_cvtph_ps(ldu128(d));
#pragma GCC unroll 4
        for (int t = 0; t < tn; t++) {
            const __m256 da = _mm256_set1_ps(ld_f16(packed + (size_t)t * tb + off));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_cvtepi32_ps(hadd8_i32(is[t])), _mm256_mul_ps(dw, da)));
        }
    }
}

static void b8_run(int64_t n, const void *w, size_t w_stride, int rows, const void *packed, int toks, float *out,
                   size_t out_stride) {
    const int64_t nb = n / 32;
    const size_t tb = (size_t)nb * B32_BYTES;
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
                case 1: b8_group(nb, wr, pf, p, tb, 1, acc); break;
                case 2: b8_group(nb, wr, pf, p, tb, 2, acc); break;
                case 3: b8_group(nb, wr, pf, p, tb, 3, acc); break;
                default: b8_group(nb, wr, pf, p, tb, 4, acc); break;
                }
                avx2_rows8_store(acc, tn, nr, out, out_stride, t0, r0);
            }
        }
    }
}

/* From one token on (min_toks 1); a thread's rows start at a multiple of eight (row_group). */
static const kernel_tile tile_q8_0_b8 = {b8_packed_bytes, b8_pack, b8_run, 1, B8_ROWS};

void kernels_register_avx2_b32(kernel_set *ks) { ks->tile[GGML_TYPE_Q8_0] = &tile_q8_0_b8; }

#endif
