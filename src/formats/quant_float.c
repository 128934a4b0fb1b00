/* Plain float rows: F32, F16, BF16.
 *
 * The activation of a float weight row is encoded in the weight's own type (as llama.cpp's CPU
 * backend does: F16 weights see F16-rounded activations), so a dot product is a float dot over
 * two rows of converted values.
 *
 * Accumulation order (fixed; SIMD kernels must reproduce it): element i's product x_i * y_i,
 * rounded to float, is added to partial sum i mod 16 in increasing i; then the 16 partials are
 * folded pairwise, s[j] += s[j + w] for w = 8, 4, 2, 1 (j < w), and s[0] is the result. That is
 * the natural shape of a 2 x 8-lane (or 1 x 16-lane) vector loop with a tree reduction. No fused
 * multiply-add: the files must be compiled with floating-point contraction off (-std=c11 implies
 * -ffp-contract=off with GCC; clang needs -ffp-contract=off explicitly).
 *
 * Byte order: GGUF is little-endian and so are all hosts sluice targets; F32 values are copied
 * as host floats, 16-bit values are assembled from bytes.
 */
#include "formats/quant.h"

/* Bit-exact results need every float operation rounded as written: no fused multiply-add.
 * (-std=c11 already implies this for GCC; -std=gnu11 and clang's default do not.) */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <string.h>

#define DOT_LANES 16

static float fold_lanes(float *s) {
    for (int w = DOT_LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) s[j] += s[j + w];
    return s[0];
}

static uint16_t load_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static void store_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

static float load_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* ---- F32 ---------------------------------------------------------------------------------- */

void quant_dequantize_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void quant_quantize_f32(const float *src, void *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

float quant_dot_f32(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float s[DOT_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        float p = load_f32(x + 4 * i) * load_f32(y + 4 * i);
        s[i % DOT_LANES] += p;
    }
    return fold_lanes(s);
}

/* ---- F16 ---------------------------------------------------------------------------------- */

void quant_dequantize_f16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_f16_to_f32(load_u16(p + 2 * i));
}

void quant_quantize_f16(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) store_u16(p + 2 * i, quant_f32_to_f16(src[i]));
}

float quant_dot_f16(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float s[DOT_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        float p = quant_f16_to_f32(load_u16(x + 2 * i)) * quant_f16_to_f32(load_u16(y + 2 * i));
        s[i % DOT_LANES] += p;
    }
    return fold_lanes(s);
}

/* ---- BF16 --------------------------------------------------------------------------------- */

void quant_dequantize_bf16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_bf16_to_f32(load_u16(p + 2 * i));
}

void quant_quantize_bf16(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) store_u16(p + 2 * i, quant_f32_to_bf16(src[i]));
}

float quant_dot_bf16(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float s[DOT_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        float p = quant_bf16_to_f32(load_u16(x + 2 * i)) * quant_bf16_to_f32(load_u16(y + 2 * i));
        s[i % DOT_LANES] += p;
    }
    return fold_lanes(s);
}
