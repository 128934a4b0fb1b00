/* MLX affine quantization as a sluice tensor type (ids 100+, see quant.h and docs/quant.md).
 *
 * Block = one group of G values of a row: scale (f16 or bf16), bias (same), then the G codes of
 * b bits as an LSB-first bit stream: code k occupies bits k*b .. k*b+b-1, bit i of the stream
 * being bit i%8 of byte i/8. That is exactly MLX's packing of a row (uint32 words, little-endian,
 * values LSB-first and, for 3/5/6 bits, straddling word boundaries), so a group of an MLX
 * checkpoint is the G*b/8 bytes at offset g*G*b/8 of its row, copied unchanged. Keeping scale and
 * bias in the block makes every row self-contained (expert records, row slicing).
 *
 * Value: w = scale*q + bias, q in [0, 2^b - 1].
 *
 * Dot product against Q8_0 activations (32 values, f16 d, int8 q): for each 32-value activation
 * block j of a weight group, in order, with integer sums isum = sum(q_w*q_a) and asum = sum(q_a)
 * (both exact),
 *     sumf += (scale*d_a)*isum + (bias*d_a)*asum
 * (the two products added first, then to sumf). No fused multiply-add (pragma below).
 */
#include "formats/quant.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <string.h>

#define MLX_MAX_GROUP 128

static float load_half(const uint8_t *p, bool bf16) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    return bf16 ? quant_bf16_to_f32(h) : quant_f16_to_f32(h);
}

static void store_half(uint8_t *p, float v, bool bf16) {
    uint16_t h = bf16 ? quant_f32_to_bf16(v) : quant_f32_to_f16(v);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

/* Decode n codes (n a multiple of 8) of b bits: every 8 codes fill exactly b bytes, so each run
 * of 8 is one little-endian load of b <= 8 bytes. */
static void unpack_codes(const uint8_t *src, int b, int n, uint8_t *q) {
    const uint64_t mask = (1u << b) - 1u;
    for (int k = 0; k < n; k += 8, src += b) {
        uint64_t v = 0;
        for (int i = 0; i < b; i++) v |= (uint64_t)src[i] << (8 * i);
        for (int j = 0; j < 8; j++) q[k + j] = (uint8_t)((v >> (j * b)) & mask);
    }
}

static void pack_codes(const uint8_t *q, int b, int n, uint8_t *dst) {
    for (int k = 0; k < n; k += 8, dst += b) {
        uint64_t v = 0;
        for (int j = 0; j < 8; j++) v |= (uint64_t)q[k + j] << (j * b);
        for (int i = 0; i < b; i++) dst[i] = (uint8_t)(v >> (8 * i));
    }
}

static void mlx_dequantize(const void *src, float *dst, int64_t n, int b, int g, bool bf16) {
    const uint8_t *p = src;
    const size_t block = 4 + (size_t)g * b / 8;
    uint8_t q[MLX_MAX_GROUP];
    for (int64_t i = 0; i < n; i += g, p += block, dst += g) {
        const float s = load_half(p, bf16), m = load_half(p + 2, bf16);
        unpack_codes(p + 4, b, g, q);
        for (int k = 0; k < g; k++) dst[k] = s * (float)q[k] + m;
    }
}

/* MLX's affine_quantize, per group, in float: the scale spans [min, max] in 2^b - 1 steps and
 * points from the extreme of larger magnitude (the "edge", which becomes the bias) towards the
 * other; the scale is then adjusted so that edge/scale is an integer, which puts 0.0 exactly on
 * the grid. One deliberate difference: the codes are computed against the stored (f16/bf16
 * rounded) scale and bias, so every code is the nearest grid point of the grid actually stored
 * (MLX rounds with the unrounded float scale). Rounding is to nearest, ties to even, as MLX's
 * round. */
static void mlx_quantize(const float *src, void *dst, int64_t n, int b, int g, bool bf16) {
    uint8_t *p = dst;
    const size_t block = 4 + (size_t)g * b / 8;
    const float n_bins = (float)((1 << b) - 1), eps = 1e-7f;
    uint8_t q[MLX_MAX_GROUP];
    for (int64_t i = 0; i < n; i += g, p += block, src += g) {
        float w_min = src[0], w_max = src[0];
        for (int k = 1; k < g; k++) {
            if (src[k] < w_min) w_min = src[k];
            if (src[k] > w_max) w_max = src[k];
        }
        const bool mask = fabsf(w_min) > fabsf(w_max);
        float scale = (w_max - w_min) / n_bins;
        if (!(scale > eps)) scale = eps; /* also catches NaN ranges */
        if (!mask) scale = -scale;
        const float edge = mask ? w_min : w_max;
        const float q0 = nearbyintf(edge / scale);
        float bias = 0.0f;
        if (q0 != 0.0f) {
            scale = edge / q0;
            bias = edge;
        }
        store_half(p, scale, bf16);
        store_half(p + 2, bias, bf16);
        const float s = load_half(p, bf16), m = load_half(p + 2, bf16);
        for (int k = 0; k < g; k++) {
            float v = s != 0.0f ? nearbyintf((src[k] - m) / s) : 0.0f;
            if (!(v >= 0.0f)) v = 0.0f; /* NaN to 0 too */
            if (v > n_bins) v = n_bins;
            q[k] = (uint8_t)v;
        }
        pack_codes(q, b, g, p + 4);
    }
}

static float mlx_dot(int64_t n, const void *w, const void *a, int b, int g, bool bf16) {
    const uint8_t *pw = w, *pa = a;
    const size_t block = 4 + (size_t)g * b / 8;
    uint8_t q[MLX_MAX_GROUP];
    float sumf = 0.0f;
    for (int64_t i = 0; i < n; i += g, pw += block) {
        const float s = load_half(pw, bf16), m = load_half(pw + 2, bf16);
        unpack_codes(pw + 4, b, g, q);
        for (int j = 0; j < g; j += 32, pa += 34) {
            const float da = quant_f16_to_f32((uint16_t)(pa[0] | (pa[1] << 8)));
            const int8_t *qa = (const int8_t *)(pa + 2);
            int32_t isum = 0, asum = 0;
            for (int k = 0; k < 32; k++) {
                isum += (int32_t)q[j + k] * qa[k];
                asum += qa[k];
            }
            sumf += (s * da) * (float)isum + (m * da) * (float)asum;
        }
    }
    return sumf;
}

/* One named triple per variant, for the traits table. */
#define MLX_DEFINE_(lower, UPPER, bits, group, bf16)                                          \
    void quant_dequantize_##lower(const void *src, float *dst, int64_t n) {                  \
        mlx_dequantize(src, dst, n, bits, group, bf16);                                       \
    }                                                                                         \
    void quant_quantize_##lower(const float *src, void *dst, int64_t n) {                    \
        mlx_quantize(src, dst, n, bits, group, bf16);                                         \
    }                                                                                         \
    float quant_dot_##lower(int64_t n, const void *w, const void *a) {                       \
        return mlx_dot(n, w, a, bits, group, bf16);                                           \
    }
QUANT_MLX_VARIANTS(MLX_DEFINE_)
#undef MLX_DEFINE_

static const struct {
    uint8_t bits, group, bf16;
} mlx_params[] = {
#define MLX_PARAM_(lower, UPPER, bits, group, bf16) {bits, group, bf16},
    QUANT_MLX_VARIANTS(MLX_PARAM_)
#undef MLX_PARAM_
};

bool quant_mlx_params(uint32_t type, int *bits, int *group, bool *bf16_scales) {
    if (type < SLUICE_TYPE_FIRST || type >= QUANT_MLX_LIMIT) return false;
    const size_t i = type - SLUICE_TYPE_FIRST;
    if (i >= sizeof mlx_params / sizeof mlx_params[0]) return false;
    if (bits) *bits = mlx_params[i].bits;
    if (group) *group = mlx_params[i].group;
    if (bf16_scales) *bf16_scales = mlx_params[i].bf16 != 0;
    return true;
}

int quant_mlx_type(int bits, int group, bool bf16_scales) {
    for (size_t i = 0; i < sizeof mlx_params / sizeof mlx_params[0]; i++)
        if (mlx_params[i].bits == bits && mlx_params[i].group == group &&
            (mlx_params[i].bf16 != 0) == bf16_scales)
            return (int)(SLUICE_TYPE_FIRST + i);
    return -1;
}
