/* I-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS) and Q2_0.
 *
 * The IQ2/IQ3 types store, per group of 8 (IQ2) or 4 (IQ3) values, an index into a fixed grid
 * of unsigned magnitude vectors (quant_iq_tables.c), plus signs and small odd sub-block scales.
 * Block images (little-endian, packed; 256 values each):
 *   IQ2_XXS  d:f16 | qs[64]                              (66 bytes)
 *            group g of 32: u32 w0 = bytes 8g..8g+3 (four grid indices), u32 w1 = the next
 *            four (four 7-bit sign indices at bits 7l, 4-bit scale ls at bits 28..31)
 *   IQ2_XS   d:f16 | qs:u16[32] | scales[8]              (74 bytes)
 *            u16 per 8 values: 9-bit grid index | 7-bit sign index << 9; scale nibble per 16
 *   IQ2_S    d:f16 | qs[32] | signs[32] | qh[8] | scales[8]   (82 bytes)
 *            10-bit grid index = qs byte | 2 bits of qh[g] (at 2l) << 8; explicit sign bytes
 *   IQ3_XXS  d:f16 | qs[64] | u32 scales_and_signs[8]   (98 bytes)
 *            two 4-value grid indices per 8 values; the u32 holds four 7-bit sign indices and
 *            the 4-bit scale at bits 28..31
 *   IQ3_S    d:f16 | qs[64] | qh[8] | signs[32] | scales[4]   (110 bytes)
 *            9-bit grid index = qs byte | bit of qh[g] << 8; explicit signs; scale nibble per 32
 *   IQ4_XS   d:f16 | scales_h:u16 | scales_l[4] | qs[128]     (136 bytes)
 *            6-bit scale per 32 (low 4 bits in scales_l nibbles, high 2 in scales_h), codes as
 *            IQ4_NL with element j of a 32-group in byte j's low nibble, j+16 in its high one
 *   Q2_0     d:f16 | qs[16]  (64 values; 2-bit code c, low bits first; y = (c - 1) * d)
 * A 7-bit sign index selects ksigns_iq2xs[index], an 8-bit mask with even parity (bit j set:
 * element j negative).
 *
 * Sub-block scale ls (0..15) -> float factor:  IQ2_*: d * (0.5 + ls) * 0.25,
 * IQ3_XXS: d * (0.5 + ls) * 0.5, IQ3_S: d * (1 + 2 ls); all are d * (2 ls + 1) * k with
 * k = 1/8, 1/4, 1 -- the dot products work with the odd integer 2 ls + 1 and apply k at the end.
 *
 * Dot products follow ggml's generic CPU code: exact int32 sums weighted by the odd scales,
 * one float term per super-block (sumf += (dw * da) * bsum), then the final factor
 * (0.125 for IQ2_*, 0.25 for IQ3_XXS, 1 for IQ3_S). IQ4_XS likewise sums the integers of the
 * whole super-block, each 32-group weighted by its integer scale (ls - 32), and adds one float
 * term per super-block: sumf += (dw * da) * isum (ggml's generic code adds a float term per
 * 32 values; one exact integer per super-block is what SIMD and matrix units produce). Q2_0 (activation Q8_0, two blocks per weight block):
 * per weight block t = da0 * isum0 + da1 * isum1 (in that order), sumf += dw * t.
 *
 * Encoders: real (deterministic, error-minimising) ones, simpler than ggml's importance-weighted
 * search. Signs come from the data (for even-parity types the smallest value of an odd group
 * gets its sign flipped); for each sub-block a range of scales is tried, each value group takes
 * its best grid entry at that scale (nearest per element when that vector is on the grid,
 * otherwise an exhaustive search over the grid), the scale is refitted by least squares and the
 * best candidate kept; finally scales are quantized against the super-block d and groups are
 * re-assigned at the quantized scale.
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

static float load_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Magnitude j (0..7) of an 8-wide / (0..3) of a 4-wide grid entry. */
static int grid8_at(const uint64_t *grid, int idx, int j) { return (int)((grid[idx] >> (8 * j)) & 0xff); }

static int grid4_at(const uint32_t *grid, int idx, int j) { return (int)((grid[idx] >> (8 * j)) & 0xff); }

static int sign_of(uint8_t mask, int j) { return (mask >> j) & 1 ? -1 : 1; }

/* Activation access (Q8_K: d f32 | qs int8[256] | bsums int16[16]). */
static int q8k_q(const uint8_t *b, int i) { return (int8_t)b[4 + i]; }

/* ============================================================================================
 * Decoders and dot products
 * ========================================================================================== */

/* ---- IQ2_XXS ------------------------------------------------------------------------------ */

void quant_dequantize_iq2_xxs(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 66) {
        float d = load_f16(b);
        for (int g = 0; g < 8; g++) {
            const uint8_t *q = b + 2 + 8 * g;
            uint32_t w1 = load_u32(q + 4);
            float db = d * (0.5f + (float)(w1 >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++) {
                uint8_t signs = quant_ksigns_iq2xs[(w1 >> (7 * l)) & 127];
                for (int j = 0; j < 8; j++)
                    *dst++ = db * (float)grid8_at(quant_iq2xxs_grid, q[l], j) * (float)sign_of(signs, j);
            }
        }
    }
}

float quant_dot_iq2_xxs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 66, y += 292) {
        int32_t bsum = 0;
        for (int g = 0; g < 8; g++) {
            const uint8_t *q = x + 2 + 8 * g;
            uint32_t w1 = load_u32(q + 4);
            int32_t sumi = 0;
            for (int l = 0; l < 4; l++) {
                uint8_t signs = quant_ksigns_iq2xs[(w1 >> (7 * l)) & 127];
                for (int j = 0; j < 8; j++)
                    sumi += grid8_at(quant_iq2xxs_grid, q[l], j) * q8k_q(y, 32 * g + 8 * l + j) *
                            sign_of(signs, j);
            }
            bsum += sumi * (int32_t)(2 * (w1 >> 28) + 1);
        }
        sumf += (load_f16(x) * load_f32(y)) * (float)bsum;
    }
    return 0.125f * sumf;
}

/* ---- IQ2_XS ------------------------------------------------------------------------------- */

void quant_dequantize_iq2_xs(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 74) {
        float d = load_f16(b);
        for (int g = 0; g < 8; g++) {
            uint8_t sc = b[66 + g];
            float db[2] = {d * (0.5f + (float)(sc & 0xf)) * 0.25f, d * (0.5f + (float)(sc >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++) {
                uint16_t q = load_u16(b + 2 + 2 * (4 * g + l));
                uint8_t signs = quant_ksigns_iq2xs[q >> 9];
                for (int j = 0; j < 8; j++)
                    *dst++ = db[l / 2] * (float)grid8_at(quant_iq2xs_grid, q & 511, j) * (float)sign_of(signs, j);
            }
        }
    }
}

float quant_dot_iq2_xs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 74, y += 292) {
        int32_t bsum = 0;
        for (int g = 0; g < 8; g++) {
            uint8_t sc = x[66 + g];
            for (int half = 0; half < 2; half++) {
                int32_t sumi = 0;
                for (int l = 2 * half; l < 2 * half + 2; l++) {
                    uint16_t q = load_u16(x + 2 + 2 * (4 * g + l));
                    uint8_t signs = quant_ksigns_iq2xs[q >> 9];
                    for (int j = 0; j < 8; j++)
                        sumi += grid8_at(quant_iq2xs_grid, q & 511, j) * q8k_q(y, 32 * g + 8 * l + j) *
                                sign_of(signs, j);
                }
                int ls = half ? (sc >> 4) : (sc & 0xf);
                bsum += sumi * (2 * ls + 1);
            }
        }
        sumf += (load_f16(x) * load_f32(y)) * (float)bsum;
    }
    return 0.125f * sumf;
}

/* ---- IQ2_S -------------------------------------------------------------------------------- */

static int iq2s_index(const uint8_t *b, int g, int l) {
    return b[2 + 4 * g + l] | (((b[66 + g] >> (2 * l)) & 3) << 8);
}

void quant_dequantize_iq2_s(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 82) {
        float d = load_f16(b);
        for (int g = 0; g < 8; g++) {
            uint8_t sc = b[74 + g];
            float db[2] = {d * (0.5f + (float)(sc & 0xf)) * 0.25f, d * (0.5f + (float)(sc >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++) {
                int idx = iq2s_index(b, g, l);
                uint8_t signs = b[34 + 4 * g + l];
                for (int j = 0; j < 8; j++)
                    *dst++ = db[l / 2] * (float)grid8_at(quant_iq2s_grid, idx, j) * (float)sign_of(signs, j);
            }
        }
    }
}

float quant_dot_iq2_s(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 82, y += 292) {
        int32_t bsum = 0;
        for (int g = 0; g < 8; g++) {
            int32_t sumi[2] = {0, 0};
            for (int l = 0; l < 4; l++) {
                int idx = iq2s_index(x, g, l);
                uint8_t signs = x[34 + 4 * g + l];
                for (int j = 0; j < 8; j++)
                    sumi[l / 2] += q8k_q(y, 32 * g + 8 * l + j) * grid8_at(quant_iq2s_grid, idx, j) *
                                   sign_of(signs, j);
            }
            uint8_t sc = x[74 + g];
            bsum += (1 + 2 * (sc & 0xf)) * sumi[0] + (1 + 2 * (sc >> 4)) * sumi[1];
        }
        sumf += (load_f16(x) * load_f32(y)) * (float)bsum;
    }
    return 0.125f * sumf;
}

/* ---- IQ3_XXS ------------------------------------------------------------------------------ */

void quant_dequantize_iq3_xxs(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 98) {
        float d = load_f16(b);
        for (int g = 0; g < 8; g++) {
            uint32_t ss = load_u32(b + 66 + 4 * g);
            float db = d * (0.5f + (float)(ss >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++) {
                uint8_t signs = quant_ksigns_iq2xs[(ss >> (7 * l)) & 127];
                int i1 = b[2 + 8 * g + 2 * l], i2 = b[2 + 8 * g + 2 * l + 1];
                for (int j = 0; j < 4; j++)
                    dst[j] = db * (float)grid4_at(quant_iq3xxs_grid, i1, j) * (float)sign_of(signs, j);
                for (int j = 0; j < 4; j++)
                    dst[4 + j] = db * (float)grid4_at(quant_iq3xxs_grid, i2, j) * (float)sign_of(signs, 4 + j);
                dst += 8;
            }
        }
    }
}

float quant_dot_iq3_xxs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 98, y += 292) {
        int32_t bsum = 0;
        for (int g = 0; g < 8; g++) {
            uint32_t ss = load_u32(x + 66 + 4 * g);
            int32_t sumi = 0;
            for (int l = 0; l < 4; l++) {
                uint8_t signs = quant_ksigns_iq2xs[(ss >> (7 * l)) & 127];
                int i1 = x[2 + 8 * g + 2 * l], i2 = x[2 + 8 * g + 2 * l + 1];
                int base = 32 * g + 8 * l;
                for (int j = 0; j < 4; j++) {
                    sumi += grid4_at(quant_iq3xxs_grid, i1, j) * q8k_q(y, base + j) * sign_of(signs, j);
                    sumi += grid4_at(quant_iq3xxs_grid, i2, j) * q8k_q(y, base + 4 + j) * sign_of(signs, 4 + j);
                }
            }
            bsum += sumi * (int32_t)(2 * (ss >> 28) + 1);
        }
        sumf += (load_f16(x) * load_f32(y)) * (float)bsum;
    }
    return 0.25f * sumf;
}

/* ---- IQ3_S -------------------------------------------------------------------------------- */

static int iq3s_index(const uint8_t *b, int g, int k) {
    /* k = 0..7: the k-th 4-value index of group g; its ninth bit is bit k of qh[g] */
    return b[2 + 8 * g + k] | (((b[66 + g] >> k) & 1) << 8);
}

static int iq3s_ls(const uint8_t *b, int g) { return (b[106 + g / 2] >> (4 * (g % 2))) & 0xf; }

void quant_dequantize_iq3_s(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 110) {
        float d = load_f16(b);
        for (int g = 0; g < 8; g++) {
            float db = d * (float)(1 + 2 * iq3s_ls(b, g));
            for (int l = 0; l < 4; l++) {
                uint8_t signs = b[74 + 4 * g + l];
                int i1 = iq3s_index(b, g, 2 * l), i2 = iq3s_index(b, g, 2 * l + 1);
                for (int j = 0; j < 4; j++)
                    dst[j] = db * (float)grid4_at(quant_iq3s_grid, i1, j) * (float)sign_of(signs, j);
                for (int j = 0; j < 4; j++)
                    dst[4 + j] = db * (float)grid4_at(quant_iq3s_grid, i2, j) * (float)sign_of(signs, 4 + j);
                dst += 8;
            }
        }
    }
}

float quant_dot_iq3_s(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 110, y += 292) {
        int32_t bsum = 0;
        for (int g = 0; g < 8; g++) {
            int32_t sumi = 0;
            for (int l = 0; l < 4; l++) {
                uint8_t signs = x[74 + 4 * g + l];
                int i1 = iq3s_index(x, g, 2 * l), i2 = iq3s_index(x, g, 2 * l + 1);
                int base = 32 * g + 8 * l;
                for (int j = 0; j < 4; j++) {
                    sumi += grid4_at(quant_iq3s_grid, i1, j) * q8k_q(y, base + j) * sign_of(signs, j);
                    sumi += grid4_at(quant_iq3s_grid, i2, j) * q8k_q(y, base + 4 + j) * sign_of(signs, 4 + j);
                }
            }
            bsum += sumi * (1 + 2 * iq3s_ls(x, g));
        }
        sumf += (load_f16(x) * load_f32(y)) * (float)bsum;
    }
    return sumf;
}

/* ---- IQ4_XS ------------------------------------------------------------------------------- */

static int iq4xs_ls(const uint8_t *b, int g) {
    int lo = (b[4 + g / 2] >> (4 * (g % 2))) & 0xf;
    int hi = (load_u16(b + 2) >> (2 * g)) & 3;
    return lo | (hi << 4);
}

static int iq4xs_code(const uint8_t *b, int i) {
    const uint8_t *qs = b + 8 + 16 * (i / 32);
    int j = i % 32;
    return j < 16 ? (qs[j] & 0xf) : (qs[j - 16] >> 4);
}

void quant_dequantize_iq4_xs(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 136, dst += QK_K) {
        float d = load_f16(b);
        for (int i = 0; i < QK_K; i++) {
            float dl = d * (float)(iq4xs_ls(b, i / 32) - 32);
            dst[i] = dl * (float)quant_kvalues_iq4nl[iq4xs_code(b, i)];
        }
    }
}

float quant_dot_iq4_xs(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 136, y += 292) {
        int32_t isum = 0;
        for (int g = 0; g < 8; g++) {
            int32_t part = 0;
            for (int i = 32 * g; i < 32 * g + 32; i++)
                part += q8k_q(y, i) * quant_kvalues_iq4nl[iq4xs_code(x, i)];
            isum += (iq4xs_ls(x, g) - 32) * part;
        }
        sumf += (load_f16(x) * load_f32(y)) * (float)isum;
    }
    return sumf;
}

/* ---- Q2_0 --------------------------------------------------------------------------------- */

static int q2_0_code(const uint8_t *b, int j) { return (b[2 + j / 4] >> (2 * (j % 4))) & 3; }

void quant_dequantize_q2_0(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 64; blk++, b += 18, dst += 64) {
        float d = load_f16(b);
        for (int j = 0; j < 64; j++) dst[j] = (float)(q2_0_code(b, j) - 1) * d;
    }
}

float quant_dot_q2_0(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    for (int64_t blk = 0; blk < n / 64; blk++, x += 18) {
        float t = 0.0f;
        for (int k = 0; k < 2; k++, y += 34) {
            int32_t isum = 0;
            for (int j = 0; j < 32; j++) isum += (q2_0_code(x, 32 * k + j) - 1) * (int8_t)y[2 + j];
            t += load_f16(y) * (float)isum;
        }
        sumf += load_f16(x) * t;
    }
    return sumf;
}

/* ============================================================================================
 * Encoders
 * ========================================================================================== */

/* A grid seen as vectors of level indices, with a reverse map from level-index vectors to grid
 * entries (-1 where the vector is not on the grid). Built per encoder call: the largest map
 * (3^8 IQ2 vectors) is 13 KiB, cheap next to the search itself. */
typedef struct {
    int width;         /* values per entry: 8 or 4 */
    int n_entries;
    int n_levels;
    float level[8];    /* magnitudes, ascending */
    uint8_t lvl[1024][8];
    int16_t map[6561];
} lattice;

static void lattice_build(lattice *L, const uint64_t *g8, const uint32_t *g4, int n_entries) {
    L->width = g8 ? 8 : 4;
    L->n_entries = n_entries;
    L->n_levels = 0;
    /* collect the distinct magnitudes */
    int seen[256] = {0};
    for (int e = 0; e < n_entries; e++)
        for (int j = 0; j < L->width; j++) seen[g8 ? grid8_at(g8, e, j) : grid4_at(g4, e, j)] = 1;
    int level_of[256];
    for (int v = 0; v < 256; v++) {
        level_of[v] = -1;
        if (seen[v]) {
            level_of[v] = L->n_levels;
            L->level[L->n_levels++] = (float)v;
        }
    }
    int map_size = 1;
    for (int j = 0; j < L->width; j++) map_size *= L->n_levels;
    for (int k = 0; k < map_size; k++) L->map[k] = -1;
    for (int e = 0; e < n_entries; e++) {
        int key = 0;
        for (int j = L->width - 1; j >= 0; j--) {
            int v = g8 ? grid8_at(g8, e, j) : grid4_at(g4, e, j);
            L->lvl[e][j] = (uint8_t)level_of[v];
            key = key * L->n_levels + level_of[v];
        }
        L->map[key] = (int16_t)e;
    }
}

/* Best grid entry for the (sign-folded) targets t[width] at scale db > 0: minimises
 * sum (t_j - db * g_j)^2. */
static int lattice_best(const lattice *L, const float *t, float db) {
    float err[8][8];
    int key = 0, nearest[8];
    for (int j = 0; j < L->width; j++) {
        int best = 0;
        for (int k = 0; k < L->n_levels; k++) {
            float r = t[j] - db * L->level[k];
            err[j][k] = r * r;
            if (err[j][k] < err[j][best]) best = k;
        }
        nearest[j] = best;
    }
    for (int j = L->width - 1; j >= 0; j--) key = key * L->n_levels + nearest[j];
    if (L->map[key] >= 0) return L->map[key]; /* per-element optimum is on the grid */
    int best_e = 0;
    float best_err = FLT_MAX;
    for (int e = 0; e < L->n_entries; e++) {
        float s = 0.0f;
        for (int j = 0; j < L->width; j++) s += err[j][L->lvl[e][j]];
        if (s < best_err) {
            best_err = s;
            best_e = e;
        }
    }
    return best_e;
}

static float lattice_mag(const lattice *L, int e, int j) { return L->level[L->lvl[e][j]]; }

/* Best float scale for n targets (n a multiple of the lattice width). */
static float lattice_fit_scale(const lattice *L, const float *t, int n) {
    float tmax = 0.0f, tt = 0.0f;
    for (int i = 0; i < n; i++) {
        if (t[i] > tmax) tmax = t[i];
        tt += t[i] * t[i];
    }
    if (tmax <= 0.0f) return 0.0f;
    float gmax = L->level[L->n_levels - 1];
    float best_db = tmax / gmax, best_err = FLT_MAX;
    for (int c = 0; c <= 16; c++) {
        /* map the largest target to 0.6 .. 1.4 of the largest magnitude */
        float db = tmax / (gmax * (0.6f + 0.05f * (float)c));
        float tg = 0.0f, gg = 0.0f;
        for (int i = 0; i < n; i += L->width) {
            int e = lattice_best(L, t + i, db);
            for (int j = 0; j < L->width; j++) {
                float g = lattice_mag(L, e, j);
                tg += t[i + j] * g;
                gg += g * g;
            }
        }
        if (!(tg > 0.0f) || !(gg > 0.0f)) continue;
        float err = tt - tg * tg / gg; /* error at the least-squares scale tg/gg */
        if (err < best_err) {
            best_err = err;
            best_db = tg / gg;
        }
    }
    return best_db;
}

/* Signs of 8 values as a mask (bit j: negative). With even_parity, an odd count of negatives
 * is fixed by flipping the sign of the smallest magnitude. Writes the sign-folded targets. */
static uint8_t choose_signs(const float *x, bool even_parity, float *t) {
    uint8_t mask = 0;
    int flip = 0;
    for (int j = 0; j < 8; j++) {
        if (x[j] < 0.0f) mask |= (uint8_t)(1u << j);
        if (fabsf(x[j]) < fabsf(x[flip])) flip = j;
    }
    if (even_parity) {
        int count = 0;
        for (int j = 0; j < 8; j++) count += (mask >> j) & 1;
        if (count & 1) mask ^= (uint8_t)(1u << flip);
    }
    for (int j = 0; j < 8; j++) t[j] = (mask >> j) & 1 ? -x[j] : x[j];
    return mask;
}

/* Shared super-block step: given the best float scale of each of n_sub sub-blocks (in units
 * where the stored factor is d * (2 ls + 1) * k), pick d and the 4-bit codes ls. Writes d (as
 * stored, f16-rounded) and returns it. */
static float choose_odd_scales(const float *db, int n_sub, float k, int *ls, uint8_t *d_out) {
    float max = 0.0f;
    for (int s = 0; s < n_sub; s++)
        if (db[s] > max) max = db[s];
    store_f16(d_out, max / (31.0f * k));
    float d = load_f16(d_out);
    for (int s = 0; s < n_sub; s++) {
        float c = d > 0.0f ? db[s] / (d * k) : 0.0f; /* wanted odd multiplier */
        ls[s] = clampi((int)lrintf((c - 1.0f) * 0.5f), 0, 15);
    }
    return d;
}

/* Encodes one super-block of an 8-wide IQ2 type: fills grid indices idx[32] (one per 8
 * values), sign masks sg[32], scale codes ls[n_sub] (n_sub = 8 or 16) and d. */
static void iq2_encode(const lattice *L, const float *x, bool even_parity, int n_sub, int *idx,
                       uint8_t *sg, int *ls, uint8_t *d_out) {
    float t[QK_K], db[16];
    int sub = QK_K / n_sub;
    for (int g = 0; g < 32; g++) sg[g] = choose_signs(x + 8 * g, even_parity, t + 8 * g);
    for (int s = 0; s < n_sub; s++) db[s] = lattice_fit_scale(L, t + sub * s, sub);
    float d = choose_odd_scales(db, n_sub, 0.125f, ls, d_out);
    for (int g = 0; g < 32; g++) {
        float dbq = d * (float)(2 * ls[(8 * g) / sub] + 1) * 0.125f;
        idx[g] = dbq > 0.0f ? lattice_best(L, t + 8 * g, dbq) : 0;
    }
}

void quant_quantize_iq2_xxs(const float *src, void *dst, int64_t n) {
    lattice L;
    lattice_build(&L, quant_iq2xxs_grid, NULL, 256);
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 66, src += QK_K) {
        int idx[32], ls[8];
        uint8_t sg[32];
        iq2_encode(&L, src, true, 8, idx, sg, ls, b);
        for (int g = 0; g < 8; g++) {
            uint32_t w1 = (uint32_t)ls[g] << 28;
            for (int l = 0; l < 4; l++) {
                b[2 + 8 * g + l] = (uint8_t)idx[4 * g + l];
                w1 |= (uint32_t)(sg[4 * g + l] & 127) << (7 * l);
            }
            store_u32(b + 2 + 8 * g + 4, w1);
        }
    }
}

void quant_quantize_iq2_xs(const float *src, void *dst, int64_t n) {
    lattice L;
    lattice_build(&L, quant_iq2xs_grid, NULL, 512);
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 74, src += QK_K) {
        int idx[32], ls[16];
        uint8_t sg[32];
        iq2_encode(&L, src, true, 16, idx, sg, ls, b);
        for (int q = 0; q < 32; q++) store_u16(b + 2 + 2 * q, (uint16_t)(idx[q] | ((sg[q] & 127) << 9)));
        for (int g = 0; g < 8; g++) b[66 + g] = (uint8_t)(ls[2 * g] | (ls[2 * g + 1] << 4));
    }
}

void quant_quantize_iq2_s(const float *src, void *dst, int64_t n) {
    lattice L;
    lattice_build(&L, quant_iq2s_grid, NULL, 1024);
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 82, src += QK_K) {
        int idx[32], ls[16];
        uint8_t sg[32];
        iq2_encode(&L, src, false, 16, idx, sg, ls, b);
        memset(b + 66, 0, 8);
        for (int g = 0; g < 8; g++) {
            for (int l = 0; l < 4; l++) {
                int e = idx[4 * g + l];
                b[2 + 4 * g + l] = (uint8_t)(e & 0xff);
                b[66 + g] |= (uint8_t)((e >> 8) << (2 * l));
                b[34 + 4 * g + l] = sg[4 * g + l];
            }
            b[74 + g] = (uint8_t)(ls[2 * g] | (ls[2 * g + 1] << 4));
        }
    }
}

/* Encodes one super-block of a 4-wide IQ3 type: idx[64] (one per 4 values), sign masks sg[32]
 * (one per 8), ls[8] (one per 32) and d; k is the type's scale factor (see the top). */
static void iq3_encode(const lattice *L, const float *x, bool even_parity, float k, int *idx,
                       uint8_t *sg, int *ls, uint8_t *d_out) {
    float t[QK_K], db[8];
    for (int g = 0; g < 32; g++) sg[g] = choose_signs(x + 8 * g, even_parity, t + 8 * g);
    for (int s = 0; s < 8; s++) db[s] = lattice_fit_scale(L, t + 32 * s, 32);
    float d = choose_odd_scales(db, 8, k, ls, d_out);
    for (int q = 0; q < 64; q++) {
        float dbq = d * (float)(2 * ls[q / 8] + 1) * k;
        idx[q] = dbq > 0.0f ? lattice_best(L, t + 4 * q, dbq) : 0;
    }
}

void quant_quantize_iq3_xxs(const float *src, void *dst, int64_t n) {
    lattice L;
    lattice_build(&L, NULL, quant_iq3xxs_grid, 256);
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 98, src += QK_K) {
        int idx[64], ls[8];
        uint8_t sg[32];
        iq3_encode(&L, src, true, 0.25f, idx, sg, ls, b);
        for (int q = 0; q < 64; q++) b[2 + q] = (uint8_t)idx[q];
        for (int g = 0; g < 8; g++) {
            uint32_t w = (uint32_t)ls[g] << 28;
            for (int l = 0; l < 4; l++) w |= (uint32_t)(sg[4 * g + l] & 127) << (7 * l);
            store_u32(b + 66 + 4 * g, w);
        }
    }
}

void quant_quantize_iq3_s(const float *src, void *dst, int64_t n) {
    lattice L;
    lattice_build(&L, NULL, quant_iq3s_grid, 512);
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 110, src += QK_K) {
        int idx[64], ls[8];
        uint8_t sg[32];
        iq3_encode(&L, src, false, 1.0f, idx, sg, ls, b);
        memset(b + 66, 0, 8);
        memset(b + 106, 0, 4);
        for (int q = 0; q < 64; q++) {
            b[2 + q] = (uint8_t)(idx[q] & 0xff);
            b[66 + q / 8] |= (uint8_t)((idx[q] >> 8) << (q % 8));
        }
        for (int g = 0; g < 32; g++) b[74 + g] = sg[g];
        for (int g = 0; g < 8; g++) b[106 + g / 2] |= (uint8_t)(ls[g] << (4 * (g % 2)));
    }
}

/* IQ4_XS: the per-32 scale search of IQ4_NL (its encoder is reused for the float scales), then
 * 6-bit signed scales against the super-block d (largest-magnitude scale -> code -32), then
 * every value re-coded at its quantized scale. */
static int nearest_iq4(float v) {
    int best = 0;
    float best_err = fabsf(v - (float)quant_kvalues_iq4nl[0]);
    for (int k = 1; k < 16; k++) {
        float err = fabsf(v - (float)quant_kvalues_iq4nl[k]);
        if (err < best_err) {
            best_err = err;
            best = k;
        }
    }
    return best;
}

void quant_quantize_iq4_xs(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / QK_K; blk++, b += 136, src += QK_K) {
        uint8_t nl[8 * 18];
        quant_quantize_iq4_nl(src, nl, QK_K);
        float scale[8], smax = 0.0f;
        for (int g = 0; g < 8; g++) {
            scale[g] = load_f16(nl + 18 * g);
            if (fabsf(scale[g]) > fabsf(smax)) smax = scale[g];
        }
        memset(b, 0, 136);
        store_f16(b, smax / -32.0f);
        float d = load_f16(b);
        uint16_t sh = 0;
        for (int g = 0; g < 8; g++) {
            int l = d != 0.0f ? clampi((int)lrintf(scale[g] / d), -32, 31) : 0;
            int u = l + 32;
            b[4 + g / 2] |= (uint8_t)((u & 0xf) << (4 * (g % 2)));
            sh |= (uint16_t)((u >> 4) << (2 * g));
        }
        store_u16(b + 2, sh);
        for (int i = 0; i < QK_K; i++) {
            float dl = d * (float)(iq4xs_ls(b, i / 32) - 32);
            int c = nearest_iq4(dl != 0.0f ? src[i] / dl : 0.0f);
            int j = i % 32;
            uint8_t *qs = b + 8 + 16 * (i / 32);
            if (j < 16)
                qs[j] |= (uint8_t)c;
            else
                qs[j - 16] |= (uint8_t)(c << 4);
        }
    }
}

/* Q2_0: values d * {-1, 0, 1, 2}; d may be negative, which mirrors the set, so both signs of
 * d are searched, each stretch refitted by least squares. */
void quant_quantize_q2_0(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / 64; blk++, b += 18, src += 64) {
        float amax = 0.0f;
        for (int j = 0; j < 64; j++)
            if (fabsf(src[j]) > amax) amax = fabsf(src[j]);
        float best_d = 0.0f, best_err = FLT_MAX;
        for (int sign = -1; sign <= 1 && amax > 0.0f; sign += 2) {
            for (int c = 0; c <= 16; c++) {
                float d = (float)sign * amax / (0.8f + 0.08f * (float)c);
                float xq = 0.0f, qq = 0.0f;
                for (int j = 0; j < 64; j++) {
                    int q = clampi((int)lrintf(src[j] / d), -1, 2);
                    xq += src[j] * (float)q;
                    qq += (float)(q * q);
                }
                if (!(qq > 0.0f)) continue;
                float dfit = xq / qq;
                float err = 0.0f;
                for (int j = 0; j < 64; j++) {
                    int q = dfit != 0.0f ? clampi((int)lrintf(src[j] / dfit), -1, 2) : 0;
                    float r = src[j] - dfit * (float)q;
                    err += r * r;
                }
                if (err < best_err) {
                    best_err = err;
                    best_d = dfit;
                }
            }
        }
        store_f16(b, best_d);
        float d = load_f16(b);
        memset(b + 2, 0, 16);
        for (int j = 0; j < 64; j++) {
            int q = d != 0.0f ? clampi((int)lrintf(src[j] / d), -1, 2) : 0;
            b[2 + j / 4] |= (uint8_t)((q + 1) << (2 * (j % 4)));
        }
    }
}

/* The same format without the scale search (quant.h). */
void quant_quantize_q2_0_fast(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / 64; blk++, b += 18, src += 64) {
        float hi = 0.0f, lo = 0.0f; /* loops of plain min / max / multiply: they vectorize */
        for (int j = 0; j < 64; j++) {
            hi = src[j] > hi ? src[j] : hi;
            lo = src[j] < lo ? src[j] : lo;
        }
        store_f16(b, 0.5f * (hi >= -lo ? hi : lo)); /* half the value of largest magnitude */
        const float d = load_f16(b), inv = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t c[64];
        for (int j = 0; j < 64; j++) { /* x / d clamped to [-1, 2] (NaN to -1), then rounded half up */
            float t = src[j] * inv;
            t = t > -1.0f ? t : -1.0f;
            t = t < 2.0f ? t : 2.0f;
            c[j] = (uint8_t)((int)(t + 2.5f) - 1);
        }
        for (int j = 0; j < 16; j++)
            b[2 + j] = (uint8_t)(c[4 * j] | c[4 * j + 1] << 2 | c[4 * j + 2] << 4 | c[4 * j + 3] << 6);
    }
}
