/* K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (weights) and Q8_K (their activation encoding).
 *
 * A super-block covers 256 values with one or two f16 super-scales and small integer scales per
 * sub-block of 16 or 32 values. Block images (little-endian, packed):
 *   Q2_K  scales[16] | qs[64] | d:f16 | dmin:f16                       (84 bytes)
 *   Q3_K  hmask[32] | qs[64] | scales[12] | d:f16                      (110 bytes)
 *   Q4_K  d:f16 | dmin:f16 | scales[12] | qs[128]                      (144 bytes)
 *   Q5_K  d:f16 | dmin:f16 | scales[12] | qh[32] | qs[128]             (176 bytes)
 *   Q6_K  ql[128] | qh[64] | scales:int8[16] | d:f16                   (210 bytes)
 *   Q8_K  d:f32 | qs:int8[256] | bsums:int16[16]                       (292 bytes)
 * Element addressing is in the *_unpack helpers; docs/quant.md spells it out.
 *
 * Dot products: per super-block ONE exact int32 sum isum = sum over sub-blocks s of
 * scale_s * (sum of q8_i * q_i over s), and for the types with mins one exact int32
 * summs = sum over groups of 16 of bsum_g * min_(g's sub-block); then one float step per
 * super-block, added to a single running sum in block order:
 *   Q2_K:       sumf += (da*d) * isum - (da*dmin) * summs        (ggml's generic order)
 *   Q4_K, Q5_K: sumf += (d*da) * isum - (dmin*da) * summs
 *   Q3_K, Q6_K: sumf += (d*da) * isum
 * ggml's generic code splits Q3_K..Q6_K into eight float lanes by element index mod 8; sluice
 * does not, because no SIMD or matrix unit (AVX2 maddubs, VNNI dpbusd, AMX tiles) produces
 * element-mod-8 partial sums cheaply, while all of them produce exact integer sums per
 * super-block. Results differ from ggml's generic code by float rounding only (a few ulp).
 * Integer sums are exact (no overflow is possible at these ranges), so only the float steps
 * above fix the result, and kernels may sum the integers in any order.
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

static uint16_t load_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static float load_f16(const uint8_t *p) { return quant_f16_to_f32(load_u16(p)); }

static void store_f16(uint8_t *p, float f) {
    uint16_t h = quant_f32_to_f16(f);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

static float load_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* Round to nearest, ties to even (|v| < 2^22), by the float magic-number addition that ggml's
 * nearest_int uses; every rounding in the K-quant encoders goes through it. */
static int round_even(float v) {
    float t = v + 12582912.0f; /* 1.5 * 2^23: the sum's last mantissa bit is the units digit */
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    return (int)(bits & 0x007fffffu) - 0x00400000;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- Q8_K --------------------------------------------------------------------------------
 * ggml's reference (quantize_row_q8_K_ref): take the value of largest magnitude with its sign,
 * iscale = -127 / max, q = min(127, round_even(iscale * x)), d = 1 / iscale, bsums = sums of
 * each 16 consecutive q. An all-zero block encodes d = 0, q = 0, bsums = 0. */

void quant_quantize_q8_k(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, b += 292, src += QK_K) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK_K; j++) {
            if (fabsf(src[j]) > amax) {
                amax = fabsf(src[j]);
                max = src[j];
            }
        }
        memset(b, 0, 292);
        if (amax == 0.0f) continue;
        float iscale = -127.0f / max;
        int8_t q[QK_K];
        for (int j = 0; j < QK_K; j++) {
            int v = round_even(iscale * src[j]);
            q[j] = (int8_t)(v > 127 ? 127 : v);
        }
        float d = 1.0f / iscale;
        memcpy(b, &d, 4);
        memcpy(b + 4, q, QK_K);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += q[16 * g + j];
            b[260 + 2 * g] = (uint8_t)((uint16_t)s & 0xff);
            b[261 + 2 * g] = (uint8_t)((uint16_t)s >> 8);
        }
    }
}

void quant_dequantize_q8_k(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += 292, dst += QK_K) {
        float d = load_f32(b);
        for (int j = 0; j < QK_K; j++) dst[j] = d * (float)(int8_t)b[4 + j];
    }
}

static int q8k_bsum(const uint8_t *b, int g) { return (int16_t)load_u16(b + 260 + 2 * g); }

/* ---- encoder helpers ----------------------------------------------------------------------- */

/* Affine fit of n values as scale * L - offset with L in 0..nmax and offset >= 0 (K-quant
 * mins are subtracted). Tries a few stretches of the min..max range, refits (scale, offset) by
 * weighted least squares for each resulting L, keeps the smallest weighted squared error.
 * Returns the scale; *offset receives the offset (>= 0). */
static float fit_affine(const float *x, const float *w, int n, int nmax, float *offset) {
    float min = x[0], max = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
    }
    if (min > 0.0f) min = 0.0f;
    if (max == min) {
        *offset = -min;
        return 0.0f;
    }
    float best_scale = (max - min) / (float)nmax, best_min = min, best_err = FLT_MAX;
    for (int t = -10; t <= 10; t++) {
        float iscale = ((float)nmax + 0.1f * (float)t) / (max - min);
        float sw = 0, sl = 0, sl2 = 0, sx = 0, sxl = 0;
        int L[32];
        for (int i = 0; i < n; i++) {
            L[i] = clampi(round_even(iscale * (x[i] - min)), 0, nmax);
            sw += w[i];
            sl += w[i] * (float)L[i];
            sl2 += w[i] * (float)(L[i] * L[i]);
            sx += w[i] * x[i];
            sxl += w[i] * x[i] * (float)L[i];
        }
        float det = sw * sl2 - sl * sl;
        if (!(det > 0.0f)) continue;
        float scale = (sw * sxl - sx * sl) / det;
        float mn = (sl2 * sx - sl * sxl) / det;
        if (mn > 0.0f) { /* offsets can only pull values down */
            mn = 0.0f;
            scale = sl2 > 0.0f ? sxl / sl2 : 0.0f;
        }
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            float r = scale * (float)L[i] + mn - x[i];
            err += w[i] * r * r;
        }
        if (err < best_err) {
            best_err = err;
            best_scale = scale;
            best_min = mn;
        }
    }
    *offset = -best_min;
    return best_scale;
}

/* Symmetric fit of n values as scale * L with L in qmin..qmax (qmin = -(qmax + 1)): the
 * largest-magnitude value is mapped near qmin (the wider side), a few stretches are tried,
 * each refitted by least squares. Returns the scale (sign included). */
static float fit_symmetric(const float *x, int n, int qmax) {
    int qmin = -qmax - 1;
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    if (amax == 0.0f) return 0.0f;
    float best_scale = max / (float)qmin, best_err = FLT_MAX;
    for (int t = -10; t <= 10; t++) {
        float iscale = ((float)qmin + 0.1f * (float)t) / max;
        float sxl = 0.0f, sl2 = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = clampi(round_even(iscale * x[i]), qmin, qmax);
            sxl += x[i] * (float)l;
            sl2 += (float)(l * l);
        }
        if (!(sl2 > 0.0f)) continue;
        float scale = sxl / sl2;
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = scale != 0.0f ? clampi(round_even(x[i] / scale), qmin, qmax) : 0;
            float r = x[i] - scale * (float)l;
            err += r * r;
        }
        if (err < best_err) {
            best_err = err;
            best_scale = scale;
        }
    }
    return best_scale;
}

/* Weights for the affine fits: emphasise large values a little (they dominate dot products)
 * without ignoring small ones. */
static void fit_weights(const float *x, int n, float *w) {
    float s2 = 0.0f;
    for (int i = 0; i < n; i++) s2 += x[i] * x[i];
    float rms = sqrtf(s2 / (float)n);
    for (int i = 0; i < n; i++) w[i] = rms + fabsf(x[i]);
}

/* ---- Q2_K ---------------------------------------------------------------------------------- */

/* The decoders and dots first unpack a super-block's quants into int8 q[256] in element order
 * (the *_unpack helpers hold the bit layouts), then work per sub-block. */

/* 2-bit codes (0..3): element i is in byte qs[32*(i/128) + i%32] at bits 2*((i%128)/32). */
static void q2k_unpack(const uint8_t *qs, int8_t *q) {
    for (int half = 0; half < 2; half++)
        for (int t = 0; t < 4; t++)
            for (int l = 0; l < 32; l++) q[128 * half + 32 * t + l] = (int8_t)((qs[32 * half + l] >> (2 * t)) & 3);
}

void quant_dequantize_q2_k(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 84, dst += QK_K) {
        float d = load_f16(b + 80), dmin = load_f16(b + 82);
        int8_t q[QK_K];
        q2k_unpack(b + 16, q);
        for (int s = 0; s < 16; s++) {
            float dl = d * (float)(b[s] & 0xf), ml = dmin * (float)(b[s] >> 4);
            for (int i = 16 * s; i < 16 * s + 16; i++) dst[i] = dl * (float)q[i] - ml;
        }
    }
}

void quant_quantize_q2_k(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 84, src += QK_K) {
        float scale[16], off[16], w[16], max_scale = 0.0f, max_off = 0.0f;
        for (int s = 0; s < 16; s++) {
            fit_weights(src + 16 * s, 16, w);
            scale[s] = fit_affine(src + 16 * s, w, 16, 3, &off[s]);
            if (scale[s] > max_scale) max_scale = scale[s];
            if (off[s] > max_off) max_off = off[s];
        }
        memset(b, 0, 84);
        float d = max_scale / 15.0f, dmin = max_off / 15.0f;
        store_f16(b + 80, d);
        store_f16(b + 82, dmin);
        d = load_f16(b + 80);
        dmin = load_f16(b + 82);
        for (int s = 0; s < 16; s++) {
            int sc = d > 0.0f ? clampi(round_even(scale[s] / d), 0, 15) : 0;
            int m = dmin > 0.0f ? clampi(round_even(off[s] / dmin), 0, 15) : 0;
            b[s] = (uint8_t)(sc | (m << 4));
        }
        for (int i = 0; i < QK_K; i++) {
            uint8_t sc = b[i / 16];
            float dl = d * (float)(sc & 0xf), ml = dmin * (float)(sc >> 4);
            int q = dl > 0.0f ? clampi(round_even((src[i] + ml) / dl), 0, 3) : 0;
            b[16 + 32 * (i / 128) + i % 32] |= (uint8_t)(q << (2 * ((i % 128) / 32)));
        }
    }
}

float quant_dot_q2_k(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 84, y += 292) {
        int8_t q[QK_K];
        q2k_unpack(x + 16, q);
        const int8_t *q8 = (const int8_t *)(y + 4);
        int32_t summs = 0, isum = 0;
        for (int s = 0; s < 16; s++) summs += q8k_bsum(y, s) * (x[s] >> 4);
        for (int s = 0; s < 16; s++) {
            int32_t part = 0;
            for (int i = 16 * s; i < 16 * s + 16; i++) part += q8[i] * q[i];
            isum += (x[s] & 0xf) * part;
        }
        float da = load_f32(y);
        float dall = da * load_f16(x + 80);
        float dmin = da * load_f16(x + 82);
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    return sumf;
}

/* ---- Q3_K ---------------------------------------------------------------------------------- */

/* Signed 6-bit scale of sub-block s (0..15), packed in 12 bytes: low nibble from byte s
 * (s < 8) or the high nibble of byte s-8, top two bits from byte 8 + s%4 at bit 2*(s/4). */
static int q3k_scale(const uint8_t *sc, int s) {
    int lo = s < 8 ? (sc[s] & 0xf) : (sc[s - 8] >> 4);
    int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* Quants in -4..3: low two bits as Q2_K (qs at byte 32), minus 4 unless bit i/32 of
 * hmask[i%32] is set. */
static void q3k_unpack(const uint8_t *b, int8_t *q) {
    q2k_unpack(b + 32, q);
    for (int t = 0; t < 8; t++)
        for (int l = 0; l < 32; l++) q[32 * t + l] = (int8_t)(q[32 * t + l] - (((b[l] >> t) & 1) ? 0 : 4));
}

void quant_dequantize_q3_k(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 110, dst += QK_K) {
        float d = load_f16(b + 108);
        int8_t q[QK_K];
        q3k_unpack(b, q);
        for (int s = 0; s < 16; s++) {
            float dl = d * (float)q3k_scale(b + 96, s);
            for (int i = 16 * s; i < 16 * s + 16; i++) dst[i] = dl * (float)q[i];
        }
    }
}

void quant_quantize_q3_k(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 110, src += QK_K) {
        float scale[16], amax = 0.0f, max_scale = 0.0f;
        for (int s = 0; s < 16; s++) {
            scale[s] = fit_symmetric(src + 16 * s, 16, 3);
            if (fabsf(scale[s]) > amax) {
                amax = fabsf(scale[s]);
                max_scale = scale[s];
            }
        }
        memset(b, 0, 110);
        /* the largest scale maps to code -32, the wide end of the signed 6-bit range */
        store_f16(b + 108, max_scale / -32.0f);
        float d = load_f16(b + 108);
        uint8_t *sc = b + 96;
        for (int s = 0; s < 16; s++) {
            int l = d != 0.0f ? clampi(round_even(scale[s] / d), -32, 31) : 0;
            int u = l + 32;
            if (s < 8)
                sc[s] |= (uint8_t)(u & 0xf);
            else
                sc[s - 8] |= (uint8_t)((u & 0xf) << 4);
            sc[8 + s % 4] |= (uint8_t)((u >> 4) << (2 * (s / 4)));
        }
        for (int i = 0; i < QK_K; i++) {
            float dl = d * (float)q3k_scale(sc, i / 16);
            int q = dl != 0.0f ? clampi(round_even(src[i] / dl), -4, 3) : 0;
            int u = q + 4;
            if (u & 4) b[i % 32] |= (uint8_t)(1u << (i / 32));
            b[32 + 32 * (i / 128) + i % 32] |= (uint8_t)((u & 3) << (2 * ((i % 128) / 32)));
        }
    }
}

float quant_dot_q3_k(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 110, y += 292) {
        int8_t q[QK_K];
        q3k_unpack(x, q);
        const int8_t *q8 = (const int8_t *)(y + 4);
        int32_t isum = 0;
        for (int s = 0; s < 16; s++) {
            int32_t part = 0;
            for (int i = 16 * s; i < 16 * s + 16; i++) part += q8[i] * q[i];
            isum += q3k_scale(x + 96, s) * part;
        }
        sumf += (load_f16(x + 108) * load_f32(y)) * (float)isum;
    }
    return sumf;
}

/* ---- Q4_K / Q5_K --------------------------------------------------------------------------- */

/* 6-bit scale and min of sub-block s (0..7) from the 12 packed bytes. */
static void k4_scale_min(const uint8_t *sc, int s, int *scale, int *min) {
    if (s < 4) {
        *scale = sc[s] & 63;
        *min = sc[s + 4] & 63;
    } else {
        *scale = (sc[s + 4] & 0xf) | ((sc[s - 4] >> 6) << 4);
        *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
}

static void k4_pack_scale_min(uint8_t *sc, int s, int scale, int min) {
    if (s < 4) {
        sc[s] |= (uint8_t)scale;
        sc[s + 4] |= (uint8_t)min;
    } else {
        sc[s + 4] = (uint8_t)((scale & 0xf) | ((min & 0xf) << 4));
        sc[s - 4] |= (uint8_t)((scale >> 4) << 6);
        sc[s] |= (uint8_t)((min >> 4) << 6);
    }
}

/* 4-bit codes: element i is in byte qs[32*(i/64) + i%32], low nibble when i%64 < 32. Q5_K
 * adds 16 when bit i/32 of qh[i%32] is set. */
static void q4k_unpack(const uint8_t *b, int8_t *q) {
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (int8_t)(qs[32 * c + l] & 0xf);
            q[64 * c + 32 + l] = (int8_t)(qs[32 * c + l] >> 4);
        }
}

static void q5k_unpack(const uint8_t *b, int8_t *q) {
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (int8_t)((qs[32 * c + l] & 0xf) | (((qh[l] >> (2 * c)) & 1) << 4));
            q[64 * c + 32 + l] = (int8_t)((qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4));
        }
}

static void k45_dequantize(const uint8_t *b, float *dst, void (*unpack)(const uint8_t *, int8_t *)) {
    float d = load_f16(b), dmin = load_f16(b + 2);
    int8_t q[QK_K];
    unpack(b, q);
    for (int s = 0; s < 8; s++) {
        int sc, m;
        k4_scale_min(b + 4, s, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        for (int i = 32 * s; i < 32 * s + 32; i++) dst[i] = d1 * (float)q[i] - m1;
    }
}

void quant_dequantize_q4_k(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 144, dst += QK_K) k45_dequantize(b, dst, q4k_unpack);
}

void quant_dequantize_q5_k(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 176, dst += QK_K) k45_dequantize(b, dst, q5k_unpack);
}

/* Encodes one Q4_K (nmax 15) or Q5_K (nmax 31) super-block; returns the codes in L. */
static void k45_quantize(const float *x, uint8_t *b, int nmax, int *L) {
    float scale[8], off[8], w[32], max_scale = 0.0f, max_off = 0.0f;
    for (int s = 0; s < 8; s++) {
        fit_weights(x + 32 * s, 32, w);
        scale[s] = fit_affine(x + 32 * s, w, 32, nmax, &off[s]);
        if (scale[s] > max_scale) max_scale = scale[s];
        if (off[s] > max_off) max_off = off[s];
    }
    store_f16(b, max_scale / 63.0f);
    store_f16(b + 2, max_off / 63.0f);
    float d = load_f16(b), dmin = load_f16(b + 2);
    memset(b + 4, 0, 12);
    for (int s = 0; s < 8; s++) {
        int sc = d > 0.0f ? clampi(round_even(scale[s] / d), 0, 63) : 0;
        int m = dmin > 0.0f ? clampi(round_even(off[s] / dmin), 0, 63) : 0;
        k4_pack_scale_min(b + 4, s, sc, m);
    }
    for (int i = 0; i < QK_K; i++) {
        int sc, m;
        k4_scale_min(b + 4, i / 32, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        L[i] = d1 > 0.0f ? clampi(round_even((x[i] + m1) / d1), 0, nmax) : 0;
    }
}

void quant_quantize_q4_k(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 144, src += QK_K) {
        int L[QK_K];
        k45_quantize(src, b, 15, L);
        memset(b + 16, 0, 128);
        for (int i = 0; i < QK_K; i++)
            b[16 + 32 * (i / 64) + i % 32] |= (uint8_t)(L[i] << ((i % 64) < 32 ? 0 : 4));
    }
}

void quant_quantize_q5_k(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 176, src += QK_K) {
        int L[QK_K];
        k45_quantize(src, b, 31, L);
        memset(b + 16, 0, 160);
        for (int i = 0; i < QK_K; i++) {
            b[48 + 32 * (i / 64) + i % 32] |= (uint8_t)((L[i] & 0xf) << ((i % 64) < 32 ? 0 : 4));
            if (L[i] & 16) b[16 + i % 32] |= (uint8_t)(1u << (i / 32));
        }
    }
}

static float k45_dot(int64_t n, const uint8_t *x, const uint8_t *y, int block_bytes,
                     void (*unpack)(const uint8_t *, int8_t *)) {
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += block_bytes, y += 292) {
        int sc[8], mn[8];
        for (int s = 0; s < 8; s++) k4_scale_min(x + 4, s, &sc[s], &mn[s]);
        int8_t q[QK_K];
        unpack(x, q);
        const int8_t *q8 = (const int8_t *)(y + 4);
        int32_t summs = 0, isum = 0;
        for (int g = 0; g < 16; g++) summs += q8k_bsum(y, g) * mn[g / 2];
        for (int s = 0; s < 8; s++) {
            int32_t part = 0;
            for (int i = 32 * s; i < 32 * s + 32; i++) part += q8[i] * q[i];
            isum += sc[s] * part;
        }
        float da = load_f32(y);
        sumf += (load_f16(x) * da) * (float)isum - (load_f16(x + 2) * da) * (float)summs;
    }
    return sumf;
}

float quant_dot_q4_k(int64_t n, const void *w, const void *a) { return k45_dot(n, w, a, 144, q4k_unpack); }

float quant_dot_q5_k(int64_t n, const void *w, const void *a) { return k45_dot(n, w, a, 176, q5k_unpack); }

/* ---- Q6_K ---------------------------------------------------------------------------------- */

/* Quants in -32..31: element i = 128h + 32a + l has its low four bits in
 * ql[64h + l + 32*(a%2)] (low nibble for a < 2, high for a >= 2) and its top two in
 * qh[32h + l] at bit 2a. */
static void q6k_unpack(const uint8_t *b, int8_t *q) {
    const uint8_t *ql = b, *qh = b + 128;
    for (int h = 0; h < 2; h++)
        for (int a = 0; a < 4; a++)
            for (int l = 0; l < 32; l++) {
                int lo = (ql[64 * h + l + 32 * (a % 2)] >> (4 * (a / 2))) & 0xf;
                int hi = (qh[32 * h + l] >> (2 * a)) & 3;
                q[128 * h + 32 * a + l] = (int8_t)((lo | (hi << 4)) - 32);
            }
}

void quant_q6_k_codes(const void *block, uint8_t codes[256]) {
    int8_t q[QK_K];
    q6k_unpack(block, q);
    for (int i = 0; i < QK_K; i++) codes[i] = (uint8_t)(q[i] + 32);
}

void quant_dequantize_q6_k(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 210, dst += QK_K) {
        float d = load_f16(b + 208);
        int8_t q[QK_K];
        q6k_unpack(b, q);
        for (int s = 0; s < 16; s++) {
            float dl = d * (float)(int8_t)b[192 + s];
            for (int i = 16 * s; i < 16 * s + 16; i++) dst[i] = dl * (float)q[i];
        }
    }
}

void quant_quantize_q6_k(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 210, src += QK_K) {
        float scale[16], amax = 0.0f, max_scale = 0.0f;
        for (int s = 0; s < 16; s++) {
            scale[s] = fit_symmetric(src + 16 * s, 16, 31);
            if (fabsf(scale[s]) > amax) {
                amax = fabsf(scale[s]);
                max_scale = scale[s];
            }
        }
        memset(b, 0, 210);
        /* the largest scale maps to int8 -128 (the wide end); others are clamped to 127 */
        store_f16(b + 208, max_scale / -128.0f);
        float d = load_f16(b + 208);
        for (int s = 0; s < 16; s++) {
            int l = d != 0.0f ? clampi(round_even(scale[s] / d), -128, 127) : 0;
            b[192 + s] = (uint8_t)(int8_t)l;
        }
        for (int i = 0; i < QK_K; i++) {
            float dl = d * (float)(int8_t)b[192 + i / 16];
            int q = dl != 0.0f ? clampi(round_even(src[i] / dl), -32, 31) : 0;
            int u = q + 32;
            int h = i / 128, r = i % 128, qa = r / 32, l = r % 32;
            b[64 * h + l + 32 * (qa % 2)] |= (uint8_t)((u & 0xf) << (qa < 2 ? 0 : 4));
            b[128 + 32 * h + l] |= (uint8_t)((u >> 4) << (2 * qa));
        }
    }
}

float quant_dot_q6_k(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 210, y += 292) {
        int8_t q[QK_K];
        q6k_unpack(x, q);
        const int8_t *q8 = (const int8_t *)(y + 4);
        int32_t isum = 0;
        for (int s = 0; s < 16; s++) {
            int32_t part = 0;
            for (int i = 16 * s; i < 16 * s + 16; i++) part += q8[i] * q[i];
            isum += (int8_t)x[192 + s] * part;
        }
        sumf += (load_f16(x + 208) * load_f32(y)) * (float)isum;
    }
    return sumf;
}
