/* Tiles of the float weight types, F32, F16 and BF16, with 512-bit AVX-512 (several tokens:
 * routers in prefill, and the products of F16 / BF16 models).
 *
 * Each (row, token) is the dot's sum (dot_f32 and HALF_DOT in kernels_x86.inc): the values
 * converted exactly to F32 (F16 by vcvtph2ps, BF16 by a 16-bit shift), then 16 lanes over
 * 16-value chunks in order (a product, then an add: never fused), the tail's products into the
 * first lanes, then the tree w = 8, 4, 2, 1. The dot loop runs one such chain at a time, an add's
 * latency per chunk; here 4 rows x 4 tokens run side by side (16 chains, each weight chunk
 * loaded and converted once for 4 tokens and each token chunk for 4 rows) and, without a tail,
 * the 16 folds by fold16x16 at once (the same lane pairs in the same order). The packed
 * activations are the token rows converted to F32 (F16 and BF16 activations) or as given.
 * Compiled with the AVX-512 level's flags (CMakeLists.txt); registered by
 * kernels_register_avx512. */
#if defined(__x86_64__)

#include "backends/cpu/kernels_x86_common.h" /* first: contraction off, the helpers */

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_avx512_fold.h"
#include "formats/quant.h"

#define FLT_BLOCK 16 /* rows x tokens per cache block: 2 x 16 rows of 8 KiB at 2,048 values */

enum { FLT_F32, FLT_F16, FLT_BF16 };
static const int flt_bytes[] = {4, 2, 2};

/* 16 values at p as F32 (exact) */
static inline __attribute__((always_inline)) __m512 flt_load16(const int kind, const uint8_t *p) {
    if (kind == FLT_F32) return _mm512_loadu_ps((const float *)p);
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (kind == FLT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* value i of a row at p as F32 (the scalar conversions of HALF_DOT's tail) */
static inline __attribute__((always_inline)) float flt_at(const int kind, const uint8_t *p, int64_t i) {
    if (kind == FLT_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return kind == FLT_F16 ? quant_f16_to_f32(h) : quant_bf16_to_f32(h);
}

static size_t flt_packed_bytes(int64_t n, int toks) { return (size_t)toks * (size_t)n * sizeof(float); }

static inline __attribute__((always_inline)) void flt_pack(const int kind, int64_t n, const void *a, size_t as,
                                                           int t0, int t1, void *dst) {
    for (int t = t0; t < t1; t++) {
        const uint8_t *src = (const uint8_t *)a + (size_t)t * as;
        float *d = (float *)dst + (size_t)t * (size_t)n;
        if (kind == FLT_F32) {
            memcpy(d, src, (size_t)n * sizeof(float));
            continue;
        }
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(d + i, flt_load16(kind, src + 2 * i));
        for (; i < n; i++) d[i] = flt_at(kind, src, i);
    }
}

static inline __attribute__((always_inline)) void flt_run(const int kind, int64_t n, const void *w, size_t ws,
                                                          int rows, const void *packed, int toks, float *out,
                                                          size_t os) {
    const float *x = packed;
    const int vb = flt_bytes[kind];
    const int64_t nf = n / 16 * 16;
    const int tail = (int)(n - nf);
    for (int rb = 0; rb < rows; rb += FLT_BLOCK)
        for (int tb = 0; tb < toks; tb += FLT_BLOCK)
            for (int r0 = rb; r0 < rows && r0 < rb + FLT_BLOCK; r0 += 4)
                for (int t0 = tb; t0 < toks && t0 < tb + FLT_BLOCK; t0 += 4) {
                    const int R = rows - r0 < 4 ? rows - r0 : 4, T = toks - t0 < 4 ? toks - t0 : 4;
                    const uint8_t *wr[4]; /* padding rows and tokens repeat the last: never stored */
                    const float *xt[4];
                    for (int r = 0; r < 4; r++) wr[r] = (const uint8_t *)w + (size_t)(r0 + (r < R ? r : R - 1)) * ws;
                    for (int t = 0; t < 4; t++) xt[t] = x + (size_t)(t0 + (t < T ? t : T - 1)) * (size_t)n;
                    __m512 acc[16]; /* [token][row] */
#pragma GCC unroll 16
                    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
                    for (int64_t i = 0; i < nf; i += 16) {
                        __m512 wv[4];
#pragma GCC unroll 4
                        for (int r = 0; r < 4; r++) wv[r] = flt_load16(kind, wr[r] + (size_t)i * (size_t)vb);
#pragma GCC unroll 4
                        for (int t = 0; t < 4; t++) {
                            const __m512 xv = _mm512_loadu_ps(xt[t] + i);
#pragma GCC unroll 4
                            for (int r = 0; r < 4; r++)
                                acc[4 * t + r] = _mm512_add_ps(acc[4 * t + r], _mm512_mul_ps(wv[r], xv));
                        }
                    }
                    _Alignas(64) float v[16];
                    if (tail == 0) {
                        _mm512_store_ps(v, fold16x16(acc));
                    } else {
                        for (int d = 0; d < 16; d++) {
                            float sl[16];
                            _mm512_storeu_ps(sl, acc[d]);
                            for (int i = 0; i < tail; i++) sl[i] += flt_at(kind, wr[d % 4], nf + i) * xt[d / 4][nf + i];
                            for (int h = 8; h >= 1; h /= 2)
                                for (int j = 0; j < h; j++) sl[j] += sl[j + h];
                            v[d] = sl[0];
                        }
                    }
                    for (int t = 0; t < T; t++)
                        for (int r = 0; r < R; r++) out[(size_t)(t0 + t) * os + (size_t)(r0 + r)] = v[4 * t + r];
                }
}

#define FLT_TILE(NAME, KIND)                                                                                \
    static void NAME##_pack(int64_t n, const void *a, size_t as, int toks, int t0, int t1, void *dst) {     \
        (void)toks;                                                                                          \
        flt_pack(KIND, n, a, as, t0, t1, dst);                                                              \
    }                                                                                                        \
    static void NAME##_run(int64_t n, const void *w, size_t ws, int rows, const void *packed, int toks,      \
                           float *out, size_t os) {                                                          \
        flt_run(KIND, n, w, ws, rows, packed, toks, out, os);                                               \
    }                                                                                                        \
    static const kernel_tile NAME = {flt_packed_bytes, NAME##_pack, NAME##_run, 0, 0};

/* From the backend's default token count on (kernels.h: min_toks): one token is the dot's,
 * which reads at the memory's speed. */
FLT_TILE(tile_f32, FLT_F32)
FLT_TILE(tile_f16, FLT_F16)
FLT_TILE(tile_bf16, FLT_BF16)

void kernels_register_avx512_float(kernel_set *ks) {
    ks->tile[GGML_TYPE_F32] = &tile_f32;
    ks->tile[GGML_TYPE_F16] = &tile_f16;
    ks->tile[GGML_TYPE_BF16] = &tile_bf16;
}

#endif
