/* 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 (activation encoding), IQ4_NL,
 * MXFP4.
 *
 * Block images (little-endian, packed):
 *   Q4_0   d:f16 | qs[16]                 y = d * (q - 8)
 *   Q4_1   d:f16 | m:f16 | qs[16]         y = d * q + m
 *   Q5_0   d:f16 | qh[4] | qs[16]         y = d * (q - 16), q = nibble | bit << 4
 *   Q5_1   d:f16 | m:f16 | qh[4] | qs[16] y = d * q + m
 *   Q8_0   d:f16 | qs:int8[32]            y = d * q
 *   Q8_1   d:f16 | s:f16 | qs:int8[32]    y = d * q; s = f16(d * sum(q)) feeds the "+ m" term
 *   IQ4_NL d:f16 | qs[16]                 y = d * kvalues_iq4nl[nibble]
 *   MXFP4  e:u8  | qs[16]                 y = kvalues_mxfp4[nibble] * 2^(e - 128)
 * Nibble layout: byte j holds element j in its low nibble and element j + 16 in its high one;
 * Q5 fifth bits: bit j of the little-endian u32 qh belongs to element j.
 *
 * Dot products take the activation as Q8_0 (Q8_1 for Q4_1/Q5_1) and follow ggml's generic CPU
 * code: an exact int32 sum per block, then one float expression per block added to a single
 * float accumulator in block order. The exact per-block expressions (the association of the
 * float products matters for bit-exactness) are written next to each dot below.
 */
#include "formats/quant.h"

/* Bit-exact results need every float operation rounded as written: no fused multiply-add.
 * (-std=c11 already implies this for GCC; -std=gnu11 and clang's default do not.) */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <float.h>
#include <math.h>
#include <string.h>

#define QK 32

static uint16_t load_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t load_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void store_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

static void store_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static float load_f16(const uint8_t *p) { return quant_f16_to_f32(load_u16(p)); }

static void store_f16(uint8_t *p, float f) { store_u16(p, quant_f32_to_f16(f)); }

/* Element j of a 16-byte nibble array laid out as described above. */
static int nibble_at(const uint8_t *qs, int j) {
    return j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
}

/* MXFP4 scale: 2^(e - 128), i.e. half of the E8M0 value, as a float bit pattern; e = 0 and 1
 * fall below the normal range and are encoded as the float subnormals 2^-128 and 2^-127. */
static float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? (0x00200000u << e) : ((uint32_t)(e - 1) << 23);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---- Q8_0 / Q8_1: activation encodings ---------------------------------------------------
 * ggml's x86 encoder (quantize_row_q8_0/q8_1 in ggml-cpu/arch/x86, the one llama.cpp runs on
 * these machines): d = amax / 127, id = amax ? 127 / amax : 0, q = round-to-nearest-even(x * id).
 * ggml's portable reference (id = 1/d, roundf) differs from it where x * id lands on or next to
 * a half: rare for smooth activations, but frequent when the activations are themselves
 * dequantized values (a Q5_0 embedding table's rows are small multiples of one scale), where a
 * different code changes the result by ~1e-3 (qwen4exp's quantized fixtures need this one). */

static float q8_block_scale(const float *x, float *id) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) {
        float a = fabsf(x[j]);
        if (a > amax) amax = a;
    }
    float d = amax / 127.0f;
    *id = amax != 0.0f ? 127.0f / amax : 0.0f;
    return d;
}

void quant_quantize_q8_0(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b += 34, src += QK) {
        float id;
        float d = q8_block_scale(src, &id);
        store_f16(b, d);
        for (int j = 0; j < QK; j++) b[2 + j] = (uint8_t)(int8_t)nearbyintf(src[j] * id);
    }
}

void quant_dequantize_q8_0(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 34, dst += QK) {
        float d = load_f16(b);
        for (int j = 0; j < QK; j++) dst[j] = (float)(int8_t)b[2 + j] * d;
    }
}

/* Per block: sumf += sumi * (dw * da). */
float quant_dot_q8_0(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, x += 34, y += 34) {
        int32_t isum = 0;
        for (int j = 0; j < QK; j++) isum += (int8_t)x[2 + j] * (int8_t)y[2 + j];
        sum += (float)isum * (load_f16(x) * load_f16(y));
    }
    return sum;
}

void quant_quantize_q8_1(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b += 36, src += QK) {
        float id;
        float d = q8_block_scale(src, &id);
        int32_t qsum = 0;
        for (int j = 0; j < QK; j++) {
            int8_t q = (int8_t)nearbyintf(src[j] * id);
            b[4 + j] = (uint8_t)q;
            qsum += q;
        }
        store_f16(b, d);
        /* s uses the unrounded float d, as ggml does */
        store_f16(b + 2, (float)qsum * d);
    }
}

void quant_dequantize_q8_1(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 36, dst += QK) {
        float d = load_f16(b);
        for (int j = 0; j < QK; j++) dst[j] = (float)(int8_t)b[4 + j] * d;
    }
}

/* ---- Q4_0 ----------------------------------------------------------------------------------
 * Encoder: ggml's reference rule. The value of largest magnitude (sign kept) maps to -8, so
 * d = max / -8; q = min(15, trunc(x/d + 8.5)). */

void quant_quantize_q4_0(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b += 18, src += QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++) {
            if (fabsf(src[j]) > amax) {
                amax = fabsf(src[j]);
                max = src[j];
            }
        }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(b, d);
        for (int j = 0; j < 16; j++) {
            int lo = (int)(int8_t)(src[j] * id + 8.5f);
            int hi = (int)(int8_t)(src[j + 16] * id + 8.5f);
            lo = lo > 15 ? 15 : lo;
            hi = hi > 15 ? 15 : hi;
            b[2 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void quant_dequantize_q4_0(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 18, dst += QK) {
        float d = load_f16(b);
        for (int j = 0; j < QK; j++) dst[j] = (float)(nibble_at(b + 2, j) - 8) * d;
    }
}

/* Per block: sumf += sumi * dw * da (left to right). */
float quant_dot_q4_0(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, x += 18, y += 34) {
        int32_t isum = 0;
        for (int j = 0; j < QK; j++) isum += (nibble_at(x + 2, j) - 8) * (int8_t)y[2 + j];
        sum += (float)isum * load_f16(x) * load_f16(y);
    }
    return sum;
}

/* ---- Q4_1 / Q5_1 (affine, activation Q8_1) ------------------------------------------------
 * Encoder: ggml's reference rule: m = min, d = (max - min) / (2^bits - 1),
 * q = trunc((x - min)/d + 0.5) (clamped to 15 for 4 bits). */

static float affine_block_range(const float *x, float *min_out) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    *min_out = min;
    return max;
}

void quant_quantize_q4_1(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b += 20, src += QK) {
        float min;
        float max = affine_block_range(src, &min);
        float d = (max - min) / 15.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(b, d);
        store_f16(b + 2, min);
        for (int j = 0; j < 16; j++) {
            int lo = (int)(int8_t)((src[j] - min) * id + 0.5f);
            int hi = (int)(int8_t)((src[j + 16] - min) * id + 0.5f);
            lo = lo > 15 ? 15 : lo;
            hi = hi > 15 ? 15 : hi;
            b[4 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void quant_dequantize_q4_1(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 20, dst += QK) {
        float d = load_f16(b), m = load_f16(b + 2);
        for (int j = 0; j < QK; j++) dst[j] = (float)nibble_at(b + 4, j) * d + m;
    }
}

/* Per block: sumf += (dw * da) * sumi + mw * sa. */
float quant_dot_q4_1(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, x += 20, y += 36) {
        int32_t isum = 0;
        for (int j = 0; j < QK; j++) isum += nibble_at(x + 4, j) * (int8_t)y[4 + j];
        sum += (load_f16(x) * load_f16(y)) * (float)isum + load_f16(x + 2) * load_f16(y + 2);
    }
    return sum;
}

/* ---- Q5_0 / Q5_1 -------------------------------------------------------------------------- */

static int q5_at(const uint8_t *qh, const uint8_t *qs, int j) {
    uint32_t h = load_u32(qh);
    return nibble_at(qs, j) | (int)(((h >> j) & 1u) << 4);
}

static void q5_pack(const int *q, uint8_t *qh, uint8_t *qs) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
    for (int j = 0; j < QK; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    store_u32(qh, h);
}

/* Encoder: as Q4_0 with 5 bits: d = max / -16, q = min(31, trunc(x/d + 16.5)). */
void quant_quantize_q5_0(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b += 22, src += QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++) {
            if (fabsf(src[j]) > amax) {
                amax = fabsf(src[j]);
                max = src[j];
            }
        }
        float d = max / -16.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[QK];
        for (int j = 0; j < QK; j++) {
            int v = (int)(int8_t)(src[j] * id + 16.5f);
            q[j] = v > 31 ? 31 : v;
        }
        store_f16(b, d);
        q5_pack(q, b + 2, b + 6);
    }
}

void quant_dequantize_q5_0(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 22, dst += QK) {
        float d = load_f16(b);
        for (int j = 0; j < QK; j++) dst[j] = (float)(q5_at(b + 2, b + 6, j) - 16) * d;
    }
}

/* Per block: sumf += (dw * da) * sumi. */
float quant_dot_q5_0(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, x += 22, y += 34) {
        int32_t isum = 0;
        for (int j = 0; j < QK; j++) isum += (q5_at(x + 2, x + 6, j) - 16) * (int8_t)y[2 + j];
        sum += (load_f16(x) * load_f16(y)) * (float)isum;
    }
    return sum;
}

void quant_quantize_q5_1(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b += 24, src += QK) {
        float min;
        float max = affine_block_range(src, &min);
        float d = (max - min) / 31.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[QK];
        for (int j = 0; j < QK; j++) {
            int v = (int)(uint8_t)((src[j] - min) * id + 0.5f);
            q[j] = v > 31 ? 31 : v;
        }
        store_f16(b, d);
        store_f16(b + 2, min);
        q5_pack(q, b + 4, b + 8);
    }
}

void quant_dequantize_q5_1(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 24, dst += QK) {
        float d = load_f16(b), m = load_f16(b + 2);
        for (int j = 0; j < QK; j++) dst[j] = (float)q5_at(b + 4, b + 8, j) * d + m;
    }
}

/* Per block: sumf += (dw * da) * sumi + mw * sa. */
float quant_dot_q5_1(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, x += 24, y += 36) {
        int32_t isum = 0;
        for (int j = 0; j < QK; j++) isum += q5_at(x + 4, x + 8, j) * (int8_t)y[4 + j];
        sum += (load_f16(x) * load_f16(y)) * (float)isum + load_f16(x + 2) * load_f16(y + 2);
    }
    return sum;
}

/* ---- Non-linear 4-bit codes: IQ4_NL and MXFP4 ----------------------------------------------
 * Both store a 16-entry signed code book index per element. The encoders search the block
 * scale: for each candidate scale every element takes its nearest code, then the scale is
 * refitted by least squares for those codes; the candidate with the smallest squared error
 * wins. */

/* Index of the code nearest to v (ties to the lower index). */
static int nearest_code(const int8_t *codes, float v) {
    int best = 0;
    float best_err = fabsf(v - (float)codes[0]);
    for (int k = 1; k < 16; k++) {
        float err = fabsf(v - (float)codes[k]);
        if (err < best_err) {
            best_err = err;
            best = k;
        }
    }
    return best;
}

static void pack_nibbles(const uint8_t *idx, uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(idx[j] | (idx[j + 16] << 4));
}

void quant_quantize_iq4_nl(const float *src, void *dst, int64_t n) {
    const int8_t *kv = quant_kvalues_iq4nl;
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b += 18, src += QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++) {
            if (fabsf(src[j]) > amax) {
                amax = fabsf(src[j]);
                max = src[j];
            }
        }
        uint8_t best_idx[QK] = {0};
        float best_d = 0.0f;
        if (amax > 0.0f) {
            float best_err = FLT_MAX;
            /* the extreme code is -127: map max onto it, then try nearby stretches */
            for (int step = -10; step <= 10; step++) {
                float d = max / (-127.0f + 2.0f * (float)step);
                if (d == 0.0f) continue;
                uint8_t idx[QK];
                float sxq = 0.0f, sqq = 0.0f;
                for (int j = 0; j < QK; j++) {
                    idx[j] = (uint8_t)nearest_code(kv, src[j] / d);
                    float q = (float)kv[idx[j]];
                    sxq += src[j] * q;
                    sqq += q * q;
                }
                float dfit = sqq > 0.0f ? sxq / sqq : 0.0f;
                float dq = quant_f16_to_f32(quant_f32_to_f16(dfit));
                float err = 0.0f;
                for (int j = 0; j < QK; j++) {
                    float e = src[j] - dq * (float)kv[idx[j]];
                    err += e * e;
                }
                if (err < best_err) {
                    best_err = err;
                    best_d = dfit;
                    memcpy(best_idx, idx, sizeof idx);
                }
            }
        } else {
            for (int j = 0; j < QK; j++) best_idx[j] = (uint8_t)nearest_code(kv, 0.0f);
        }
        store_f16(b, best_d);
        pack_nibbles(best_idx, b + 2);
    }
}

void quant_dequantize_iq4_nl(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 18, dst += QK) {
        float d = load_f16(b);
        for (int j = 0; j < QK; j++) dst[j] = d * (float)quant_kvalues_iq4nl[nibble_at(b + 2, j)];
    }
}

/* Per block: sumf += (da * dw) * (sumi_lo + sumi_hi). */
float quant_dot_iq4_nl(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, x += 18, y += 34) {
        int32_t isum = 0;
        for (int j = 0; j < QK; j++)
            isum += (int8_t)y[2 + j] * quant_kvalues_iq4nl[nibble_at(x + 2, j)];
        sum += (load_f16(y) * load_f16(x)) * (float)isum;
    }
    return sum;
}

/* MXFP4 encoder: the exponent is a power of two, so only a few candidates make sense: the one
 * that puts the block maximum at the top code (6, doubled to 12) and its neighbours. */
void quant_quantize_mxfp4(const float *src, void *dst, int64_t n) {
    const int8_t *kv = quant_kvalues_mxfp4;
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b += 17, src += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++)
            if (fabsf(src[j]) > amax) amax = fabsf(src[j]);
        int e0 = 0;
        if (amax > 0.0f) {
            int ex;
            frexpf(amax, &ex);      /* amax in [2^(ex-1), 2^ex) */
            e0 = (ex - 1) - 2 + 127; /* 2^(e-128) * 12 is then within a factor 2 of amax */
        }
        int best_e = 0;
        float best_err = FLT_MAX;
        for (int e = e0 - 1; e <= e0 + 1; e++) {
            if (e < 0 || e > 254) continue;
            float d = e8m0_half((uint8_t)e);
            float err = 0.0f;
            for (int j = 0; j < QK; j++) {
                float r = src[j] - d * (float)kv[nearest_code(kv, src[j] / d)];
                err += r * r;
            }
            if (err < best_err) {
                best_err = err;
                best_e = e;
            }
        }
        float d = e8m0_half((uint8_t)best_e);
        uint8_t idx[QK];
        for (int j = 0; j < QK; j++) idx[j] = (uint8_t)nearest_code(kv, src[j] / d);
        b[0] = (uint8_t)best_e;
        pack_nibbles(idx, b + 1);
    }
}

void quant_dequantize_mxfp4(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK; i++, b += 17, dst += QK) {
        float d = e8m0_half(b[0]);
        for (int j = 0; j < QK; j++) dst[j] = (float)quant_kvalues_mxfp4[nibble_at(b + 1, j)] * d;
    }
}

/* Per block: sumf += (da * 2^(e-128)) * (sumi_lo + sumi_hi). */
float quant_dot_mxfp4(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, x += 17, y += 34) {
        int32_t isum = 0;
        for (int j = 0; j < QK; j++)
            isum += (int8_t)y[2 + j] * quant_kvalues_mxfp4[nibble_at(x + 1, j)];
        sum += (load_f16(y) * e8m0_half(x[0])) * (float)isum;
    }
    return sum;
}
