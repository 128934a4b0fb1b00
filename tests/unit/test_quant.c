/* Quant codecs: traits table, f16/bf16 conversions, decoders against an independent
 * double-precision decoder written from the format description (docs/quant.md), dot products,
 * activation encoders, weight encoders, and golden dot results that pin the accumulation order.
 *
 * The reference decoder below addresses every element by the element-index formulas of the
 * spec (not by the block loops of the codecs), in double precision, so a layout slip in either
 * shows up as a mismatch.
 */
#include "check.h"
#include "formats/quant.h"

/* lanes16() below recomputes a float order bit-exactly: no fused multiply-add here either. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------------------ */

typedef struct {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(rng *r) { return (double)(rng_next(r) >> 11) * 0x1p-53; }

static float rng_gauss(rng *r) {
    double u = rng_unit(r) + 0x1p-60, v = rng_unit(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* Uniform in [-4, 4), exactly representable, computed without libm so that the golden inputs
 * below are the same on every platform. */
static float rng_small(rng *r) {
    return (float)((int32_t)(rng_next(r) >> 40) - (1 << 23)) * 0x1p-21f;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)rd16(p) | ((uint32_t)rd16(p + 2) << 16); }
static void wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void wr32(uint8_t *p, uint32_t v) { wr16(p, (uint16_t)v), wr16(p + 2, (uint16_t)(v >> 16)); }

static float rdf32(const uint8_t *p) {
    uint32_t u = rd32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void wrf32(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    wr32(p, u);
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Every type with a full codec (decode + dot), and the activation-only encodings. */
static const uint32_t codec_types[] = {
    GGML_TYPE_F32,     GGML_TYPE_F16,    GGML_TYPE_BF16,   GGML_TYPE_Q4_0,  GGML_TYPE_Q4_1,
    GGML_TYPE_Q5_0,    GGML_TYPE_Q5_1,   GGML_TYPE_Q8_0,   GGML_TYPE_Q2_K,  GGML_TYPE_Q3_K,
    GGML_TYPE_Q4_K,    GGML_TYPE_Q5_K,   GGML_TYPE_Q6_K,   GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS,
    GGML_TYPE_IQ2_S,   GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
    GGML_TYPE_MXFP4,   GGML_TYPE_Q2_0,
};
#define N_CODEC_TYPES (sizeof codec_types / sizeof codec_types[0])

/* ---- independent reference decoder ---------------------------------------------------------- */

static double ref_f16(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
    double v = exp == 0 ? ldexp(mant, -24) : ldexp(1024 + mant, exp - 25);
    return sign ? -v : v;
}

static double ref_bf16(uint16_t h) {
    int sign = h >> 15, exp = (h >> 7) & 255, mant = h & 127;
    double v = exp == 0 ? ldexp(mant, -133) : ldexp(128 + mant, exp - 134);
    return sign ? -v : v;
}

/* Element j (0..31) of a 16-byte nibble array: low nibbles first half, high nibbles second. */
static int ref_nib(const uint8_t *qs, int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; }

/* Byte j of a packed grid entry. */
static int ref_g8(uint64_t e, int j) { return (int)((e >> (8 * j)) & 255); }

static double ref_sign(uint8_t mask, int j) { return (mask >> j) & 1 ? -1.0 : 1.0; }

/* Q4_K/Q5_K 6-bit scale and min of sub-block s, per the spec's get_scale_min formula. */
static void ref_k4(const uint8_t *sc, int s, int *scale, int *min) {
    if (s < 4) {
        *scale = sc[s] & 63;
        *min = sc[s + 4] & 63;
    } else {
        *scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
}

/* Element i of the block at b, in double precision. */
static double ref_element(uint32_t type, const uint8_t *b, int i) {
    switch (type) {
    case GGML_TYPE_F32: return rdf32(b);
    case GGML_TYPE_F16: return ref_f16(rd16(b));
    case GGML_TYPE_BF16: return ref_bf16(rd16(b));
    case GGML_TYPE_Q4_0: return ref_f16(rd16(b)) * (ref_nib(b + 2, i) - 8);
    case GGML_TYPE_Q4_1: return ref_f16(rd16(b)) * ref_nib(b + 4, i) + ref_f16(rd16(b + 2));
    case GGML_TYPE_Q5_0: {
        int q = ref_nib(b + 6, i) | (int)((rd32(b + 2) >> i) & 1) << 4;
        return ref_f16(rd16(b)) * (q - 16);
    }
    case GGML_TYPE_Q5_1: {
        int q = ref_nib(b + 8, i) | (int)((rd32(b + 4) >> i) & 1) << 4;
        return ref_f16(rd16(b)) * q + ref_f16(rd16(b + 2));
    }
    case GGML_TYPE_Q8_0: return ref_f16(rd16(b)) * (int8_t)b[2 + i];
    case GGML_TYPE_Q8_1: return ref_f16(rd16(b)) * (int8_t)b[4 + i];
    case GGML_TYPE_Q8_K: return (double)rdf32(b) * (int8_t)b[4 + i];
    case GGML_TYPE_Q2_K: {
        int sc = b[i / 16] & 15, mn = b[i / 16] >> 4;
        int q = (b[16 + 32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
        return ref_f16(rd16(b + 80)) * sc * q - ref_f16(rd16(b + 82)) * mn;
    }
    case GGML_TYPE_Q3_K: {
        const uint8_t *sc = b + 96;
        int s = i / 16;
        int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4;
        int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        int scale = (lo | hi << 4) - 32;
        int q = (b[32 + 32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
        if (!((b[i % 32] >> (i / 32)) & 1)) q -= 4;
        return ref_f16(rd16(b + 108)) * scale * q;
    }
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: {
        int sc, mn;
        ref_k4(b + 4, i / 32, &sc, &mn);
        const uint8_t *qs = b + (type == GGML_TYPE_Q4_K ? 16 : 48);
        uint8_t byte = qs[32 * (i / 64) + i % 32];
        int q = (i % 64) < 32 ? byte & 15 : byte >> 4;
        if (type == GGML_TYPE_Q5_K) q += 16 * ((b[16 + i % 32] >> (i / 32)) & 1);
        return ref_f16(rd16(b)) * sc * q - ref_f16(rd16(b + 2)) * mn;
    }
    case GGML_TYPE_Q6_K: {
        int n = i / 128, r = i % 128, a = r / 32, l = r % 32;
        uint8_t lb = b[64 * n + l + 32 * (a % 2)];
        int lo = a < 2 ? lb & 15 : lb >> 4;
        int hi = (b[128 + 32 * n + l] >> (2 * a)) & 3;
        return ref_f16(rd16(b + 208)) * (int8_t)b[192 + i / 16] * ((lo | hi << 4) - 32);
    }
    case GGML_TYPE_IQ2_XXS: {
        int g = i / 32, l = (i % 32) / 8, j = i % 8;
        uint32_t w1 = rd32(b + 2 + 8 * g + 4);
        double db = ref_f16(rd16(b)) * (0.5 + (w1 >> 28)) * 0.25;
        uint8_t signs = quant_ksigns_iq2xs[(w1 >> (7 * l)) & 127];
        return db * ref_g8(quant_iq2xxs_grid[b[2 + 8 * g + l]], j) * ref_sign(signs, j);
    }
    case GGML_TYPE_IQ2_XS: {
        uint16_t q = rd16(b + 2 + 2 * (i / 8));
        int ls = (b[66 + i / 32] >> (4 * ((i % 32) / 16))) & 15;
        double db = ref_f16(rd16(b)) * (0.5 + ls) * 0.25;
        return db * ref_g8(quant_iq2xs_grid[q & 511], i % 8) * ref_sign(quant_ksigns_iq2xs[q >> 9], i % 8);
    }
    case GGML_TYPE_IQ2_S: {
        int g = i / 32, l = (i % 32) / 8, j = i % 8;
        int idx = b[2 + 4 * g + l] | ((b[66 + g] >> (2 * l)) & 3) << 8;
        int ls = (b[74 + g] >> (4 * ((i % 32) / 16))) & 15;
        double db = ref_f16(rd16(b)) * (0.5 + ls) * 0.25;
        return db * ref_g8(quant_iq2s_grid[idx], j) * ref_sign(b[34 + 4 * g + l], j);
    }
    case GGML_TYPE_IQ3_XXS: {
        int g = i / 32, l = (i % 32) / 8, j = i % 8;
        uint32_t w = rd32(b + 66 + 4 * g);
        double db = ref_f16(rd16(b)) * (0.5 + (w >> 28)) * 0.5;
        int idx = b[2 + 8 * g + 2 * l + j / 4];
        return db * ref_g8(quant_iq3xxs_grid[idx], j % 4) *
               ref_sign(quant_ksigns_iq2xs[(w >> (7 * l)) & 127], j);
    }
    case GGML_TYPE_IQ3_S: {
        int g = i / 32, l = (i % 32) / 8, j = i % 8, k = 2 * l + j / 4;
        int idx = b[2 + 8 * g + k] | ((b[66 + g] >> k) & 1) << 8;
        int ls = (b[106 + g / 2] >> (4 * (g % 2))) & 15;
        double db = ref_f16(rd16(b)) * (1 + 2 * ls);
        return db * ref_g8(quant_iq3s_grid[idx], j % 4) * ref_sign(b[74 + 4 * g + l], j);
    }
    case GGML_TYPE_IQ4_NL: return ref_f16(rd16(b)) * quant_kvalues_iq4nl[ref_nib(b + 2, i)];
    case GGML_TYPE_IQ4_XS: {
        int g = i / 32;
        int ls = ((b[4 + g / 2] >> (4 * (g % 2))) & 15) | ((rd16(b + 2) >> (2 * g)) & 3) << 4;
        return ref_f16(rd16(b)) * (ls - 32) * quant_kvalues_iq4nl[ref_nib(b + 8 + 16 * g, i % 32)];
    }
    case GGML_TYPE_MXFP4: return ldexp(quant_kvalues_mxfp4[ref_nib(b + 1, i)], b[0] - 128);
    case GGML_TYPE_Q2_0: return ref_f16(rd16(b)) * (((b[2 + i / 4] >> (2 * (i % 4))) & 3) - 1);
    }
    return NAN;
}

static void ref_decode(uint32_t type, const uint8_t *row, int64_t n, double *out) {
    const quant_traits *t = quant_traits_of(type);
    for (int64_t i = 0; i < n; i++)
        out[i] = ref_element(type, row + (i / t->block_elems) * t->block_bytes, (int)(i % t->block_elems));
}

/* |got - want| within one float ulp of want (0 allowed to differ by the smallest subnormal). */
static bool ulp_close(float got, double want) {
    float fw = (float)want;
    float ulp = nextafterf(fabsf(fw), INFINITY) - fabsf(fw);
    return fabs((double)got - want) <= (double)ulp;
}

/* Random block with every scale field finite and moderate (f16 scales |v| in [2^-10, 2^3)). */
static void random_f16(uint8_t *p, rng *r) {
    uint64_t v = rng_next(r);
    wr16(p, (uint16_t)((v & 0x8000) | (uint16_t)((5 + (v >> 16) % 13) << 10) | ((v >> 32) & 1023)));
}

static void random_block(uint32_t type, uint8_t *b, rng *r) {
    const quant_traits *t = quant_traits_of(type);
    for (uint32_t i = 0; i < t->block_bytes; i++) b[i] = (uint8_t)rng_next(r);
    switch (type) {
    case GGML_TYPE_F32: wrf32(b, rng_small(r)); break;
    case GGML_TYPE_BF16: wr16(b, quant_f32_to_bf16(rng_small(r))); break;
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q8_1:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: random_f16(b, r), random_f16(b + 2, r); break;
    case GGML_TYPE_Q2_K: random_f16(b + 80, r), random_f16(b + 82, r); break;
    case GGML_TYPE_Q3_K: random_f16(b + 108, r); break;
    case GGML_TYPE_Q6_K: random_f16(b + 208, r); break;
    case GGML_TYPE_Q8_K: wrf32(b, rng_small(r) * 0.01f); break;
    case GGML_TYPE_MXFP4: b[0] = (uint8_t)(118 + rng_next(r) % 20); break; /* 2^-10 .. 2^9 */
    default: random_f16(b, r); break; /* F16 value, or the leading d of every other type */
    }
}

/* ---- 1. traits ------------------------------------------------------------------------------ */

static void test_traits(void) {
    /* ggml's type table (spec section 2.2; Q8_1 from its struct: two f16 + 32 int8). */
    static const struct {
        uint32_t id;
        const char *name;
        uint32_t blk, bytes;
    } want[] = {
        {0, "F32", 1, 4},          {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
        {3, "Q4_1", 32, 20},       {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
        {8, "Q8_0", 32, 34},       {9, "Q8_1", 32, 36},      {10, "Q2_K", 256, 84},
        {11, "Q3_K", 256, 110},    {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
        {14, "Q6_K", 256, 210},    {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
        {17, "IQ2_XS", 256, 74},   {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
        {20, "IQ4_NL", 32, 18},    {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
        {23, "IQ4_XS", 256, 136},  {24, "I8", 1, 1},         {25, "I16", 1, 2},
        {26, "I32", 1, 4},         {27, "I64", 1, 8},        {28, "F64", 1, 8},
        {29, "IQ1_M", 256, 56},    {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
        {35, "TQ2_0", 256, 66},    {39, "MXFP4", 32, 17},    {40, "NVFP4", 64, 36},
        {41, "Q1_0", 128, 18},     {42, "Q2_0", 64, 18},
    };
    bool defined[64] = {false};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const quant_traits *t = quant_traits_of(want[k].id);
        defined[want[k].id] = true;
        CHECKF(t != NULL, "id %u", want[k].id);
        if (!t) continue;
        CHECKF(strcmp(t->name, want[k].name) == 0, "id %u name %s", want[k].id, t->name);
        CHECKF(t->block_elems == want[k].blk && t->block_bytes == want[k].bytes, "%s geometry %u/%u",
               want[k].name, t->block_elems, t->block_bytes);
        CHECK(strcmp(quant_type_name(want[k].id), want[k].name) == 0);
        CHECK(quant_type_from_name(want[k].name) == (int)want[k].id);
        char lower[16];
        size_t len = strlen(want[k].name);
        for (size_t c = 0; c <= len; c++)
            lower[c] = (char)(want[k].name[c] >= 'A' && want[k].name[c] <= 'Z' ? want[k].name[c] + 32 : want[k].name[c]);
        CHECKF(quant_type_from_name(lower) == (int)want[k].id, "%s", lower);
        CHECK(quant_row_bytes(want[k].id, 2048) == (size_t)(2048 / want[k].blk) * want[k].bytes);
        bool plain = want[k].blk == 1;
        CHECKF(t->is_quantized == !plain, "%s is_quantized", want[k].name);
    }
    for (uint32_t id = 0; id < 64; id++) {
        if (defined[id]) continue;
        CHECKF(quant_traits_of(id) == NULL, "id %u should be undefined", id);
        char buf[24];
        snprintf(buf, sizeof buf, "type#%u", id);
        CHECKF(strcmp(quant_type_name(id), buf) == 0, "%s", quant_type_name(id));
        CHECK(!quant_has_codec(id));
        CHECK(quant_row_bytes(id, 256) == 0);
    }
    CHECK(quant_traits_of(UINT32_MAX) == NULL);
    CHECK(strcmp(quant_type_name(1000000), "type#1000000") == 0);
    CHECK(quant_type_from_name("Iq2_xXs") == GGML_TYPE_IQ2_XXS);
    CHECK(quant_type_from_name("bf16") == GGML_TYPE_BF16);
    CHECK(quant_type_from_name("Q4_K ") == -1);
    CHECK(quant_type_from_name("Q4") == -1);
    CHECK(quant_type_from_name("") == -1);
    CHECK(quant_type_from_name(NULL) == -1);
    CHECK(quant_type_from_name("type#4") == -1);

    /* row sizes: multiples only, no overflow */
    CHECK(quant_row_bytes(GGML_TYPE_Q4_K, 4096) == 16 * 144);
    CHECK(quant_row_bytes(GGML_TYPE_Q4_K, 0) == 0);
    CHECK(quant_row_bytes(GGML_TYPE_Q4_K, 4095) == 0);
    CHECK(quant_row_bytes(GGML_TYPE_Q4_0, 48) == 0);
    CHECK(quant_row_bytes(GGML_TYPE_F32, 3) == 12);
    CHECK(quant_row_bytes(GGML_TYPE_F32, -4) == 0);
    CHECK(quant_row_bytes(GGML_TYPE_F64, INT64_MAX) == 0 || sizeof(size_t) > 8);

    /* which types have codecs, and their activation encodings (ggml's vec_dot_type) */
    static const struct {
        uint32_t id, act;
    } act[] = {
        {GGML_TYPE_F32, GGML_TYPE_F32},       {GGML_TYPE_F16, GGML_TYPE_F16},
        {GGML_TYPE_BF16, GGML_TYPE_BF16},     {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0},
        {GGML_TYPE_Q4_1, GGML_TYPE_Q8_1},     {GGML_TYPE_Q5_0, GGML_TYPE_Q8_0},
        {GGML_TYPE_Q5_1, GGML_TYPE_Q8_1},     {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0},
        {GGML_TYPE_Q2_K, GGML_TYPE_Q8_K},     {GGML_TYPE_Q3_K, GGML_TYPE_Q8_K},
        {GGML_TYPE_Q4_K, GGML_TYPE_Q8_K},     {GGML_TYPE_Q5_K, GGML_TYPE_Q8_K},
        {GGML_TYPE_Q6_K, GGML_TYPE_Q8_K},     {GGML_TYPE_IQ2_XXS, GGML_TYPE_Q8_K},
        {GGML_TYPE_IQ2_XS, GGML_TYPE_Q8_K},   {GGML_TYPE_IQ2_S, GGML_TYPE_Q8_K},
        {GGML_TYPE_IQ3_XXS, GGML_TYPE_Q8_K},  {GGML_TYPE_IQ3_S, GGML_TYPE_Q8_K},
        {GGML_TYPE_IQ4_NL, GGML_TYPE_Q8_0},   {GGML_TYPE_IQ4_XS, GGML_TYPE_Q8_K},
        {GGML_TYPE_MXFP4, GGML_TYPE_Q8_0},    {GGML_TYPE_Q2_0, GGML_TYPE_Q8_0},
    };
    for (size_t k = 0; k < sizeof act / sizeof act[0]; k++) {
        const quant_traits *t = quant_traits_of(act[k].id);
        CHECKF(quant_has_codec(act[k].id), "%s has a codec", t->name);
        CHECKF(t->act_type == act[k].act, "%s act type", t->name);
        CHECKF(t->quantize != NULL, "%s has an encoder", t->name);
        const quant_traits *a = quant_traits_of(t->act_type);
        CHECK(a && a->quantize && a->dequantize);
    }
    static const uint32_t no_codec[] = {GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M, GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0,
                                        GGML_TYPE_NVFP4, GGML_TYPE_Q1_0,  GGML_TYPE_I8,    GGML_TYPE_I16,
                                        GGML_TYPE_I32,   GGML_TYPE_I64,   GGML_TYPE_F64,   GGML_TYPE_Q8_1,
                                        GGML_TYPE_Q8_K};
    for (size_t k = 0; k < sizeof no_codec / sizeof no_codec[0]; k++) CHECK(!quant_has_codec(no_codec[k]));
    /* activation-only encodings still encode and decode */
    CHECK(quant_traits_of(GGML_TYPE_Q8_1)->quantize && quant_traits_of(GGML_TYPE_Q8_1)->dequantize);
    CHECK(quant_traits_of(GGML_TYPE_Q8_K)->quantize && quant_traits_of(GGML_TYPE_Q8_K)->dequantize);
}

/* The lookup tables are format data: FNV-1a 64 over their little-endian bytes, computed from
 * ggml-common.h independently of sluice's copy. */
static uint64_t fnv_bytes(uint64_t h, uint64_t v, int bytes) {
    for (int k = 0; k < bytes; k++) {
        h ^= (v >> (8 * k)) & 255;
        h *= 0x100000001b3ull;
    }
    return h;
}

static void test_tables(void) {
    const uint64_t seed = 0xcbf29ce484222325ull;
    uint64_t h;
    h = seed;
    for (int i = 0; i < 16; i++) h = fnv_bytes(h, (uint8_t)quant_kvalues_iq4nl[i], 1);
    CHECKF(h == 0x055d06d2d8fa0f75ull, "kvalues_iq4nl %016llx", (unsigned long long)h);
    h = seed;
    for (int i = 0; i < 16; i++) h = fnv_bytes(h, (uint8_t)quant_kvalues_mxfp4[i], 1);
    CHECKF(h == 0x3f0e3c08af1e5eb5ull, "kvalues_mxfp4");
    h = seed;
    for (int i = 0; i < 128; i++) h = fnv_bytes(h, quant_ksigns_iq2xs[i], 1);
    CHECKF(h == 0xf19ba8f8c3292ba5ull, "ksigns");
    h = seed;
    for (int i = 0; i < 256; i++) h = fnv_bytes(h, quant_iq2xxs_grid[i], 8);
    CHECKF(h == 0xbb4ee025b5ac6e8eull, "iq2xxs_grid");
    h = seed;
    for (int i = 0; i < 512; i++) h = fnv_bytes(h, quant_iq2xs_grid[i], 8);
    CHECKF(h == 0xc9b1ee61e79909bdull, "iq2xs_grid");
    h = seed;
    for (int i = 0; i < 1024; i++) h = fnv_bytes(h, quant_iq2s_grid[i], 8);
    CHECKF(h == 0x123edd38a3b62b90ull, "iq2s_grid");
    h = seed;
    for (int i = 0; i < 256; i++) h = fnv_bytes(h, quant_iq3xxs_grid[i], 4);
    CHECKF(h == 0xdfa5dc83d6a155d5ull, "iq3xxs_grid");
    h = seed;
    for (int i = 0; i < 512; i++) h = fnv_bytes(h, quant_iq3s_grid[i], 4);
    CHECKF(h == 0xfa37020c25b44829ull, "iq3s_grid");
    /* structural facts the codecs rely on */
    for (int i = 0; i < 128; i++) {
        int bits = 0;
        for (int j = 0; j < 8; j++) bits += (quant_ksigns_iq2xs[i] >> j) & 1;
        CHECK((quant_ksigns_iq2xs[i] & 127) == i && bits % 2 == 0);
    }
    CHECK(quant_iq2xxs_grid[1] == 0x080808080808082bull);
    CHECK(quant_iq3xxs_grid[1] == 0x04040414u && quant_iq3s_grid[1] == 0x01010103u);
}

/* ---- 2. f16 / bf16 -------------------------------------------------------------------------- */

static void test_half(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_f16_to_f32((uint16_t)h);
        double want = ref_f16((uint16_t)h);
        bool nan = ((h >> 10) & 31) == 31 && (h & 1023);
        if (nan) {
            bad += !isnan(f);
            bad += quant_f32_to_f16(f) != (uint16_t)((h & 0x8000) | 0x7e00);
            continue;
        }
        if (((h >> 10) & 31) == 31) { /* infinities */
            bad += !(isinf(f) && (f < 0) == ((h & 0x8000) != 0));
            bad += quant_f32_to_f16(f) != h;
            continue;
        }
        bad += (double)f != want;
        bad += quant_f32_to_f16(f) != h; /* exact values round-trip */
        /* midpoint to the next larger magnitude rounds to the even one; just off it, to the
         * nearer one (the midpoint of two halves is exact in float) */
        if ((h & 0x7fff) < 0x7bff) {
            uint16_t up = (uint16_t)(h + 1);
            float mid = (float)((want + ref_f16(up)) / 2);
            uint16_t even = (h & 1) ? up : (uint16_t)h;
            bad += quant_f32_to_f16(mid) != even;
            bad += quant_f32_to_f16(nextafterf(mid, 0.0f)) != (uint16_t)h;
            bad += quant_f32_to_f16(nextafterf(mid, signbit(f) ? -INFINITY : INFINITY)) != up;
        }
    }
    CHECKF(bad == 0, "%d f16 conversion errors", bad);
    CHECK(quant_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(quant_f32_to_f16(65519.99f) == 0x7bff);
    CHECK(quant_f32_to_f16(65520.0f) == 0x7c00); /* ties to even: overflows to inf */
    CHECK(quant_f32_to_f16(-1e10f) == 0xfc00);
    CHECK(quant_f32_to_f16(0x1p-25f) == 0x0000);          /* tie between 0 and 2^-24 -> 0 */
    CHECK(quant_f32_to_f16(0x1.000002p-25f) == 0x0001);
    CHECK(quant_f32_to_f16(0x1.8p-24f) == 0x0002);        /* tie between 1 and 2 ulps -> 2 */
    CHECK(quant_f32_to_f16(-0.0f) == 0x8000);
    CHECK(quant_f32_to_f16(0x1.ffcp-15f) == 0x0400);      /* subnormal rounding up to normal */

    bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_bf16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        bad += (double)f != ref_bf16((uint16_t)h) && !isinf(f);
        bad += quant_f32_to_bf16(f) != h;
    }
    CHECKF(bad == 0, "%d bf16 conversion errors", bad);
    CHECK(quant_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);     /* tie -> even */
    CHECK(quant_f32_to_bf16(1.0f + 0x3p-8f) == 0x3f82);     /* tie -> even (up) */
    CHECK(quant_f32_to_bf16(1.0f + 0x1.2p-8f) == 0x3f81);   /* above the tie */
    CHECK(quant_f32_to_bf16(-2.0f) == 0xc000);
    uint32_t snan = 0x7f800001u;
    float fs;
    memcpy(&fs, &snan, 4);
    CHECK(quant_f32_to_bf16(fs) == 0x7fc0); /* NaN made quiet, never turned into inf */
    CHECK(quant_f32_to_bf16(FLT_MAX) == 0x7f80);
}

/* ---- 3. hand-built blocks -------------------------------------------------------------------- */

/* Decode with the codec and compare every element with the reference decoder, plus a few
 * literal values worked out by hand from the layout. */
static void check_block(uint32_t type, const uint8_t *b, const int *idx, const double *lit, int nlit) {
    const quant_traits *t = quant_traits_of(type);
    float out[256];
    t->dequantize(b, out, t->block_elems);
    for (uint32_t i = 0; i < t->block_elems; i++) {
        double want = ref_element(type, b, (int)i);
        CHECKF(ulp_close(out[i], want), "%s element %u: %.9g vs reference %.9g", t->name, i, out[i], want);
    }
    for (int k = 0; k < nlit; k++)
        CHECKF(out[idx[k]] == lit[k], "%s element %d: %.9g, expected %.9g", t->name, idx[k], out[idx[k]], lit[k]);
}

#define LITERALS(type, b, ...)                                                                \
    do {                                                                                      \
        static const struct {                                                                 \
            int i;                                                                            \
            double v;                                                                         \
        } lv[] = {__VA_ARGS__};                                                               \
        int ix[32];                                                                           \
        double vx[32];                                                                        \
        int nl = (int)(sizeof lv / sizeof lv[0]);                                             \
        for (int k = 0; k < nl; k++) ix[k] = lv[k].i, vx[k] = lv[k].v;                        \
        check_block(type, b, ix, vx, nl);                                                     \
    } while (0)

static void test_handbuilt(void) {
    uint8_t b[292];

    /* plain floats */
    wr16(b, 0x3c00);
    LITERALS(GGML_TYPE_F16, b, {0, 1.0});
    wr16(b, 0xc000);
    LITERALS(GGML_TYPE_F16, b, {0, -2.0});
    wr16(b, 0x0001);
    LITERALS(GGML_TYPE_F16, b, {0, 0x1p-24});
    wr16(b, 0x7bff);
    LITERALS(GGML_TYPE_F16, b, {0, 65504.0});
    wr16(b, 0xbfc0);
    LITERALS(GGML_TYPE_BF16, b, {0, -1.5});
    wrf32(b, 3.25f);
    LITERALS(GGML_TYPE_F32, b, {0, 3.25});

    /* Q8_0: d = 0.5, q_j = j - 16, with the int8 extremes at both ends */
    wr16(b, 0x3800);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j - 16);
    b[2] = 0x80, b[33] = 0x7f;
    LITERALS(GGML_TYPE_Q8_0, b, {0, -64.0}, {1, -7.5}, {16, 0.0}, {31, 63.5});

    /* Q8_1: d = 2, s ignored by decode */
    wr16(b, 0x4000), wr16(b + 2, 0x1234);
    for (int j = 0; j < 32; j++) b[4 + j] = (uint8_t)(int8_t)(3 * j - 50);
    LITERALS(GGML_TYPE_Q8_1, b, {0, -100.0}, {31, 86.0});

    /* Q4_0: d = 0.25; byte j = (j) | (15 - j) << 4 */
    wr16(b, 0x3400);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    LITERALS(GGML_TYPE_Q4_0, b, {0, -2.0}, {15, 1.75}, {16, 1.75}, {31, -2.0}, {8, 0.0});

    /* Q4_1: d = 0.5, m = -1 */
    wr16(b, 0x3800), wr16(b + 2, 0xbc00);
    for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(j | (15 - j) << 4);
    LITERALS(GGML_TYPE_Q4_1, b, {0, -1.0}, {15, 6.5}, {16, 6.5}, {31, -1.0});

    /* Q5_0: d = 1, fifth bits on odd elements (qh = 0xaaaaaaaa) */
    wr16(b, 0x3c00), wr32(b + 2, 0xaaaaaaaau);
    for (int j = 0; j < 16; j++) b[6 + j] = (uint8_t)(j | (15 - j) << 4);
    LITERALS(GGML_TYPE_Q5_0, b, {0, -16.0}, {1, 1.0}, {15, 15.0}, {16, -1.0}, {17, 14.0});

    /* Q5_1: d = 0.125, m = 2, fifth bits on the second half */
    wr16(b, 0x3000), wr16(b + 2, 0x4000), wr32(b + 4, 0xffff0000u);
    for (int j = 0; j < 16; j++) b[8 + j] = (uint8_t)(j | (15 - j) << 4);
    LITERALS(GGML_TYPE_Q5_1, b, {0, 2.0}, {15, 3.875}, {16, 5.875}, {31, 4.0});

    /* IQ4_NL: d = 1, nibble j in element j, 15 - j in element j + 16 */
    wr16(b, 0x3c00);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    LITERALS(GGML_TYPE_IQ4_NL, b, {0, -127.0}, {7, -10.0}, {8, 1.0}, {15, 113.0}, {16, 113.0}, {31, -127.0});

    /* MXFP4: e = 128 (scale 1), e = 130 (scale 4), e = 0 (2^-128, a float subnormal) */
    for (int j = 0; j < 16; j++) b[1 + j] = (uint8_t)(j | (15 - j) << 4);
    b[0] = 128;
    LITERALS(GGML_TYPE_MXFP4, b, {0, 0.0}, {5, 6.0}, {7, 12.0}, {9, -1.0}, {15, -12.0}, {16, -12.0});
    b[0] = 130;
    LITERALS(GGML_TYPE_MXFP4, b, {7, 48.0}, {13, -24.0});
    b[0] = 0;
    LITERALS(GGML_TYPE_MXFP4, b, {1, 0x1p-128}, {7, 12 * 0x1p-128});

    /* Q2_0: d = 1.5, codes 0,1,2,3 repeating (byte 0xe4) */
    wr16(b, 0x3e00);
    memset(b + 2, 0xe4, 16);
    LITERALS(GGML_TYPE_Q2_0, b, {0, -1.5}, {1, 0.0}, {2, 1.5}, {3, 3.0}, {63, 3.0});

    /* Q2_K: d = 1, dmin = 0.5, scales[s] = s | (15 - s) << 4, every qs byte 0xe4 so that the
     * code of element i is (i % 128) / 32: y = s * q - 0.5 * (15 - s) with s = i / 16 */
    for (int s = 0; s < 16; s++) b[s] = (uint8_t)(s | (15 - s) << 4);
    memset(b + 16, 0xe4, 64);
    wr16(b + 80, 0x3c00), wr16(b + 82, 0x3800);
    LITERALS(GGML_TYPE_Q2_K, b, {0, -7.5}, {40, -4.5}, {255, 45.0}, {127, 17.0}, {128, -3.5});

    /* Q3_K: d = 0.5, scale_s = s - 8 (6-bit code s + 24), hmask bytes 0x55 (high bit set for
     * even i/32), qs 0xe4 (low bits (i%128)/32): q = low - (even i/32 ? 0 : 4) */
    memset(b, 0x55, 32);
    memset(b + 32, 0xe4, 64);
    memset(b + 96, 0, 12);
    for (int s = 0; s < 16; s++) {
        int u = s + 24;
        if (s < 8)
            b[96 + s] |= (uint8_t)(u & 15);
        else
            b[96 + s - 8] |= (uint8_t)((u & 15) << 4);
        b[96 + 8 + s % 4] |= (uint8_t)((u >> 4) << (2 * (s / 4)));
    }
    wr16(b + 108, 0x3800);
    LITERALS(GGML_TYPE_Q3_K, b, {0, 0.0}, {32, 9.0}, {64, -4.0}, {96, 1.0}, {255, -3.5});

    /* Q4_K: d = 0.5, dmin = 0.25, scale_s = 10 + 7 s, min_s = 60 - 5 s (6-bit values that need
     * the high-bit packing), qs byte k = (k % 16) | (15 - k % 16) << 4 */
    wr16(b, 0x3800), wr16(b + 2, 0x3400);
    memset(b + 4, 0, 12);
    for (int s = 0; s < 8; s++) {
        int sc = 10 + 7 * s, mn = 60 - 5 * s;
        if (s < 4) {
            b[4 + s] |= (uint8_t)sc;
            b[4 + s + 4] |= (uint8_t)mn;
        } else {
            b[4 + s + 4] = (uint8_t)((sc & 15) | (mn & 15) << 4);
            b[4 + s - 4] |= (uint8_t)((sc >> 4) << 6);
            b[4 + s] |= (uint8_t)((mn >> 4) << 6);
        }
    }
    for (int k = 0; k < 128; k++) b[16 + k] = (uint8_t)((k % 16) | (15 - k % 16) << 4);
    /* i=0: 0.5*10*0 - 0.25*60; i=32: 0.5*17*15 - 0.25*55; i=255: s=7 (59, 25), high nibble of
     * byte 127 (15 - 15 = 0) */
    LITERALS(GGML_TYPE_Q4_K, b, {0, -15.0}, {32, 113.75}, {255, -6.25}, {225, 0.5 * 59 * 14 - 6.25});

    /* Q5_K: the same scales and nibbles, fifth bit set for odd i/32 (qh bytes 0xaa) */
    {
        uint8_t q5[176];
        memcpy(q5, b, 16);
        memset(q5 + 16, 0xaa, 32);
        memcpy(q5 + 48, b + 16, 128);
        LITERALS(GGML_TYPE_Q5_K, q5, {0, -15.0}, {32, 0.5 * 17 * 31 - 13.75}, {255, 0.5 * 59 * 16 - 6.25});
    }

    /* Q6_K: d = 0.25, scales s*16 - 128 (int8), ql byte k = k & 15 | (15 - (k & 15)) << 4,
     * qh bytes 0xe4 (quarter a gets top bits a) */
    for (int k = 0; k < 128; k++) b[k] = (uint8_t)((k & 15) | (15 - (k & 15)) << 4);
    memset(b + 128, 0xe4, 64);
    for (int s = 0; s < 16; s++) b[192 + s] = (uint8_t)(int8_t)(s * 16 - 128);
    wr16(b + 208, 0x3400);
    /* i=0: q = (0 | 0<<4) - 32 = -32, scale -128 -> 0.25*-128*-32 = 1024; i=200: n=1, a=2,
     * l=8: low = high nibble of ql[64+8] = 15-8 = 7, high = 2 -> q = 7+32-32 = 7, scale s=12
     * -> 64: 0.25*64*7 = 112 */
    LITERALS(GGML_TYPE_Q6_K, b, {0, 1024.0}, {200, 112.0});

    /* Q8_K: d = -0.5 (f32), q_j = j - 128 */
    wrf32(b, -0.5f);
    for (int j = 0; j < 256; j++) b[4 + j] = (uint8_t)(int8_t)(j - 128);
    LITERALS(GGML_TYPE_Q8_K, b, {0, 64.0}, {255, -63.5});

    /* IQ2_XXS: d = 1; group 0 uses grid entries 1, 0, 0, 0 (entry 1 = 43 then seven 8s), sign
     * index 1 (mask 0x81: elements 0 and 7 negative) for its first 8, ls = 3 (db = 0.875) */
    memset(b, 0, 66);
    wr16(b, 0x3c00);
    b[2] = 1;
    wr32(b + 6, (3u << 28) | 1u);
    LITERALS(GGML_TYPE_IQ2_XXS, b, {0, -37.625}, {1, 7.0}, {7, -7.0}, {8, 7.0}, {32, 8 * 0.125});

    /* IQ2_XS: d = 2; first u16 = entry 1 | sign index 1 << 9; scales 0x52 (ls 2 then 5) */
    memset(b, 0, 74);
    wr16(b, 0x4000);
    wr16(b + 2, (uint16_t)(1 | 1 << 9));
    b[66] = 0x52;
    LITERALS(GGML_TYPE_IQ2_XS, b, {0, -2 * 43 * 0.625}, {7, -2 * 8 * 0.625}, {16, 2 * 8 * 1.375});

    /* IQ2_S: d = 1; group 0 index 0 = 1 + (1 << 8) via qh bits 0..1 = 1 (entry 257), explicit
     * sign byte 0x02 (element 1 negative); scales 0x01 (ls 1 then 0) */
    memset(b, 0, 82);
    wr16(b, 0x3c00);
    b[2] = 1, b[66] = 1, b[34] = 0x02, b[74] = 0x01;
    {
        double db = 1.5 * 0.25;
        uint64_t e = quant_iq2s_grid[257];
        check_block(GGML_TYPE_IQ2_S, b, NULL, NULL, 0); /* reference comparison; literals below */
        float out[256];
        quant_traits_of(GGML_TYPE_IQ2_S)->dequantize(b, out, 256);
        CHECK(out[0] == (float)(db * (double)(e & 255)));
        CHECK(out[1] == (float)(-db * (double)((e >> 8) & 255)));
        CHECK(out[16] == (float)(0.125 * 8));
    }

    /* IQ3_XXS: d = 1; first index byte 1 (20, 4, 4, 4); u32 #0: ls 1, sign index 1 (mask
     * 0x81) -> db = 0.75 */
    memset(b, 0, 98);
    wr16(b, 0x3c00);
    b[2] = 1;
    wr32(b + 66, (1u << 28) | 1u);
    LITERALS(GGML_TYPE_IQ3_XXS, b, {0, -15.0}, {1, 3.0}, {4, 3.0}, {7, -3.0}, {32, 0.25 * 4});

    /* IQ3_S: d = 0.5; group 0: index byte 1 with ninth bit from qh bit 0 -> entry 257, second
     * index byte 1 (entry 1: 3,1,1,1); signs byte 0x10 (element 4 negative); ls 2 -> db 2.5 */
    memset(b, 0, 110);
    wr16(b, 0x3800);
    b[2] = 1, b[3] = 1, b[66] = 1, b[74] = 0x10, b[106] = 0x02;
    {
        uint32_t e = quant_iq3s_grid[257];
        LITERALS(GGML_TYPE_IQ3_S, b, {4, -7.5}, {5, 2.5}, {32, 0.5});
        float out[256];
        quant_traits_of(GGML_TYPE_IQ3_S)->dequantize(b, out, 256);
        CHECK(out[0] == (float)(2.5 * (double)(e & 255)));
    }

    /* IQ4_XS: d = 1, 6-bit scale of group g = 28 + g (dl = g - 4); nibble j / 15 - j */
    memset(b, 0, 136);
    wr16(b, 0x3c00);
    {
        uint16_t sh = 0;
        for (int g = 0; g < 8; g++) {
            int u = 28 + g;
            b[4 + g / 2] |= (uint8_t)((u & 15) << (4 * (g % 2)));
            sh |= (uint16_t)((u >> 4) << (2 * g));
        }
        wr16(b + 2, sh);
        for (int k = 0; k < 128; k++) b[8 + k] = (uint8_t)((k % 16) | (15 - k % 16) << 4);
    }
    LITERALS(GGML_TYPE_IQ4_XS, b, {0, 508.0}, {16, -452.0}, {128, 0.0}, {255, -381.0}, {100, 49.0});
}

/* ---- 4. random blocks ------------------------------------------------------------------------ */

static void test_random_blocks(void) {
    static const uint32_t extra[] = {GGML_TYPE_Q8_1, GGML_TYPE_Q8_K};
    rng r = {42};
    for (size_t k = 0; k < N_CODEC_TYPES + 2; k++) {
        uint32_t type = k < N_CODEC_TYPES ? codec_types[k] : extra[k - N_CODEC_TYPES];
        const quant_traits *t = quant_traits_of(type);
        int nblocks = t->block_elems == 1 ? 4096 : 256;
        uint8_t *row = malloc((size_t)nblocks * t->block_bytes);
        float *out = malloc((size_t)nblocks * t->block_elems * sizeof *out);
        double *want = malloc((size_t)nblocks * t->block_elems * sizeof *want);
        for (int i = 0; i < nblocks; i++) random_block(type, row + (size_t)i * t->block_bytes, &r);
        int64_t n = (int64_t)nblocks * t->block_elems;
        t->dequantize(row, out, n);
        ref_decode(type, row, n, want);
        int bad = 0;
        double worst = 0.0; /* max error relative to the block's largest magnitude */
        for (int bl = 0; bl < nblocks; bl++) {
            double scale = 0.0;
            for (uint32_t i = 0; i < t->block_elems; i++) scale = fmax(scale, fabs(want[bl * t->block_elems + i]));
            for (uint32_t i = 0; i < t->block_elems; i++) {
                size_t e = (size_t)bl * t->block_elems + i;
                bad += !ulp_close(out[e], want[e]);
                if (scale > 0) worst = fmax(worst, fabs(out[e] - want[e]) / scale);
            }
        }
        CHECKF(bad == 0 && worst <= 1e-6, "%s: %d elements off by more than 1 ulp, worst %.3g", t->name, bad, worst);
        free(row), free(out), free(want);
    }
}

/* ---- 5. dot products ------------------------------------------------------------------------- */

/* The documented float order of the plain-float dots: 16 interleaved float partial sums, then
 * s[j] += s[j + w] for w = 8, 4, 2, 1. */
static float lanes16(const float *x, const float *y, int64_t n) {
    float s[16] = {0};
    for (int64_t i = 0; i < n; i++) s[i % 16] += x[i] * y[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) s[j] += s[j + w];
    return s[0];
}

/* Reference dot in double from the reference decoders. Q4_1/Q5_1 use the Q8_1 activation's
 * stored s = f16(d * sum q) for the offset term (that is what the encoding carries: the exact
 * sum differs from it by the f16 rounding of s), everything else is sum w_i * a_i.
 * *mag receives sum |terms|, the scale of the tolerance. */
static double ref_dot(uint32_t type, int64_t n, const uint8_t *w, const uint8_t *a, double *mag) {
    const quant_traits *t = quant_traits_of(type), *at = quant_traits_of(t->act_type);
    double *dw = malloc((size_t)n * sizeof *dw), *da = malloc((size_t)n * sizeof *da);
    ref_decode(type, w, n, dw);
    ref_decode(t->act_type, a, n, da);
    double sum = 0.0, m = 0.0;
    if (t->act_type == GGML_TYPE_Q8_1) {
        for (int64_t bl = 0; bl < n / 32; bl++) {
            const uint8_t *wb = w + bl * t->block_bytes, *ab = a + bl * at->block_bytes;
            double off = ref_f16(rd16(wb + 2)), s = ref_f16(rd16(ab + 2));
            for (int j = 0; j < 32; j++) {
                double term = (dw[bl * 32 + j] - off) * da[bl * 32 + j];
                sum += term, m += fabs(term);
            }
            sum += off * s, m += fabs(off * s);
        }
    } else {
        for (int64_t i = 0; i < n; i++) sum += dw[i] * da[i], m += fabs(dw[i] * da[i]);
    }
    free(dw), free(da);
    *mag = m;
    return sum;
}

static void test_dot(void) {
    rng r = {7};
    enum { N = 2048 };
    static float x[N], fw[N], fa[N];
    static uint8_t w[N * 4], a[N * 4];
    for (size_t k = 0; k < N_CODEC_TYPES; k++) {
        uint32_t type = codec_types[k];
        const quant_traits *t = quant_traits_of(type), *at = quant_traits_of(t->act_type);
        double worst = 0.0;
        for (int rep = 0; rep < 12; rep++) {
            /* weights: random valid blocks, or an encoded gaussian row */
            if (rep % 2 == 0) {
                for (int64_t bl = 0; bl < N / t->block_elems; bl++) random_block(type, w + bl * t->block_bytes, &r);
            } else {
                for (int i = 0; i < N; i++) x[i] = rng_gauss(&r) * 0.05f;
                t->quantize(x, w, N);
            }
            /* activations: gaussian, sometimes with a few outliers */
            for (int i = 0; i < N; i++) x[i] = rng_gauss(&r) * (rep % 3 == 2 && i % 97 == 0 ? 30.0f : 1.0f);
            at->quantize(x, a, N);
            float got = t->dot(N, w, a);
            double mag, want = ref_dot(type, N, w, a, &mag);
            /* Integer sums inside a block are exact; the float steps are a handful of products
             * per block (each <= 2^-24 relative) and one running sum over at most N/32 = 64
             * block terms (error <= 64 * 2^-24 of sum |terms|). 1e-5 * sum |terms| covers that
             * with margin (64 * 6e-8 = 3.8e-6) while staying far below the contribution of a
             * single element (on average sum |terms| / 2048 = 4.9e-4 of it). */
            double tol = 1e-5 * mag + 1e-30;
            CHECKF(fabs((double)got - want) <= tol, "%s rep %d: dot %.9g, reference %.9g (tol %.3g)", t->name, rep,
                   got, want, tol);
            if (mag > 0) worst = fmax(worst, fabs((double)got - want) / mag);
            if (type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) {
                t->dequantize(w, fw, N);
                at->dequantize(a, fa, N);
                CHECKF(fbits(got) == fbits(lanes16(fw, fa, N)), "%s: float order", t->name);
                CHECK(fbits(t->dot(N - 5, w, a)) == fbits(lanes16(fw, fa, N - 5)));
            }
        }
        /* a zero activation row gives exactly 0 */
        memset(x, 0, sizeof x);
        at->quantize(x, a, N);
        CHECKF(t->dot(N, w, a) == 0.0f, "%s: zero activations", t->name);
        (void)worst;
    }
}

/* ---- 6. activation encoders ------------------------------------------------------------------ */

static void test_q8_0_q8_1(void) {
    rng r = {99};
    enum { N = 1024 };
    float x[N], y[N];
    uint8_t b[N / 32 * 36];
    static const float scales[] = {1e-3f, 1.0f, 300.0f};
    for (int kind = 0; kind < 2; kind++) {
        uint32_t type = kind ? GGML_TYPE_Q8_1 : GGML_TYPE_Q8_0;
        const quant_traits *t = quant_traits_of(type);
        int qoff = kind ? 4 : 2;
        for (int sc = 0; sc < 3; sc++) {
            for (int i = 0; i < N; i++) x[i] = rng_gauss(&r) * scales[sc];
            t->quantize(x, b, N);
            t->dequantize(b, y, N);
            for (int bl = 0; bl < N / 32; bl++) {
                const uint8_t *blk = b + bl * t->block_bytes;
                float amax = 0.0f;
                for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * bl + j]));
                float df = amax / 127.0f;
                CHECK(rd16(blk) == quant_f32_to_f16(df));
                double dh = ref_f16(rd16(blk));
                int qsum = 0;
                for (int j = 0; j < 32; j++) {
                    int q = (int8_t)blk[qoff + j];
                    qsum += q;
                    /* rounding error at the float scale plus the f16 rounding of the scale */
                    double bound = 0.5 * df + abs(q) * fabs(df - dh) + 1e-6 * df;
                    CHECKF(fabs((double)x[32 * bl + j] - (double)y[32 * bl + j]) <= bound, "%s error", t->name);
                }
                if (kind) CHECK(rd16(blk + 2) == quant_f32_to_f16((float)qsum * df));
            }
        }
        /* a block whose maximum is 127 encodes integers exactly (d = 1) */
        for (int j = 0; j < 32; j++) x[j] = (float)((j * 37) % 255 - 127);
        x[5] = 127.0f;
        t->quantize(x, b, 32);
        CHECK(rd16(b) == 0x3c00);
        for (int j = 0; j < 32; j++) CHECK((int8_t)b[qoff + j] == (int)x[j]);
        /* ties round to even (ggml's x86 encoder: _mm256_round_ps to nearest) */
        x[0] = 2.5f, x[1] = -2.5f, x[2] = 0.5f, x[3] = -0.5f, x[4] = 1.5f;
        t->quantize(x, b, 32);
        CHECK((int8_t)b[qoff] == 2 && (int8_t)b[qoff + 1] == -2 && (int8_t)b[qoff + 2] == 0 &&
              (int8_t)b[qoff + 3] == 0 && (int8_t)b[qoff + 4] == 2);
        /* all zero */
        memset(x, 0, 32 * sizeof *x);
        t->quantize(x, b, 32);
        bool zero = rd16(b) == 0;
        for (int j = 0; j < 32; j++) zero = zero && b[qoff + j] == 0;
        CHECK(zero);
    }
}

static void test_q8_k(void) {
    rng r = {5};
    enum { N = 1024 };
    float x[N], y[N];
    uint8_t b[N / 256 * 292];
    const quant_traits *t = quant_traits_of(GGML_TYPE_Q8_K);
    for (int rep = 0; rep < 4; rep++) {
        for (int i = 0; i < N; i++) x[i] = rng_gauss(&r) * (rep == 3 ? 1e-4f : 1.0f) * (rep == 2 ? -1 : 1);
        t->quantize(x, b, N);
        t->dequantize(b, y, N);
        for (int bl = 0; bl < N / 256; bl++) {
            const uint8_t *blk = b + bl * 292;
            float max = 0.0f;
            for (int j = 0; j < 256; j++)
                if (fabsf(x[256 * bl + j]) > fabsf(max)) max = x[256 * bl + j];
            float d = rdf32(blk);
            CHECK(fbits(d) == fbits(1.0f / (-127.0f / max)));
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++) s += (int8_t)blk[4 + 16 * g + j];
                CHECK((int16_t)rd16(blk + 260 + 2 * g) == s);
            }
            for (int j = 0; j < 256; j++)
                CHECK(fabs((double)x[256 * bl + j] - (double)y[256 * bl + j]) <= 0.5 * fabs(d) * (1 + 1e-5));
        }
    }
    /* max 127: iscale = -1, d = -1, q = -x; ties round to even (the magic-number rounding) */
    for (int j = 0; j < 256; j++) x[j] = (float)(j % 100 - 50);
    x[0] = 127.0f, x[1] = 2.5f, x[2] = 3.5f, x[3] = -2.5f, x[4] = 0.5f, x[5] = -126.5f;
    t->quantize(x, b, 256);
    CHECK(rdf32(b) == -1.0f);
    CHECK((int8_t)b[4] == -127 && (int8_t)b[5] == -2 && (int8_t)b[6] == -4 && (int8_t)b[7] == 2 &&
          (int8_t)b[8] == 0 && (int8_t)b[9] == 126);
    for (int j = 10; j < 256; j++) CHECK((int8_t)b[4 + j] == -(int)x[j]);
    /* all zero: d = 0, everything 0 */
    for (int j = 0; j < 256; j++) x[j] = 0.0f;
    memset(b, 0xcd, 292);
    t->quantize(x, b, 256);
    bool zero = true;
    for (int k = 0; k < 292; k++) zero = zero && b[k] == 0;
    CHECK(zero);
}

/* ---- 7. weight encoders ---------------------------------------------------------------------- */

static void test_weight_roundtrip(void) {
    /* rms(x - decode(encode(x))) / rms(x) on unit gaussians; bounds are ~15% above what the
     * encoders achieve (for reference, ggml's reference encoders land within a few percent of
     * the same numbers, IQ types and Q2_0 a little higher). */
    static const struct {
        uint32_t type;
        double bound;
    } want[] = {
        {GGML_TYPE_F32, 0.0},       {GGML_TYPE_F16, 3e-4},     {GGML_TYPE_BF16, 2.5e-3},
        {GGML_TYPE_Q8_0, 0.0065},   {GGML_TYPE_Q4_0, 0.099},   {GGML_TYPE_Q4_1, 0.090},
        {GGML_TYPE_Q5_0, 0.049},    {GGML_TYPE_Q5_1, 0.044},   {GGML_TYPE_Q2_K, 0.31},
        {GGML_TYPE_Q3_K, 0.165},    {GGML_TYPE_Q4_K, 0.082},   {GGML_TYPE_Q5_K, 0.041},
        {GGML_TYPE_Q6_K, 0.020},    {GGML_TYPE_IQ2_XXS, 0.38}, {GGML_TYPE_IQ2_XS, 0.33},
        {GGML_TYPE_IQ2_S, 0.275},   {GGML_TYPE_IQ3_XXS, 0.205}, {GGML_TYPE_IQ3_S, 0.15},
        {GGML_TYPE_IQ4_NL, 0.086},  {GGML_TYPE_IQ4_XS, 0.087}, {GGML_TYPE_MXFP4, 0.13},
        {GGML_TYPE_Q2_0, 0.415},
    };
    enum { N = 8192 };
    static float x[N], y[N];
    static uint8_t b[N * 4];
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const quant_traits *t = quant_traits_of(want[k].type);
        for (int scale_kind = 0; scale_kind < 2; scale_kind++) {
            rng r = {1234};
            float scale = scale_kind ? 0.02f : 1.0f; /* typical weight magnitudes, too */
            double sx = 0.0, se = 0.0;
            for (int i = 0; i < N; i++) x[i] = rng_gauss(&r) * scale;
            t->quantize(x, b, N);
            t->dequantize(b, y, N);
            bool finite = true;
            for (int i = 0; i < N; i++) {
                finite = finite && isfinite(y[i]);
                sx += (double)x[i] * x[i];
                se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
            }
            double rel = sqrt(se / sx);
            CHECKF(finite && rel <= want[k].bound, "%s (scale %g): relative rms error %.5f > %.5f", t->name,
                   scale, rel, want[k].bound);
        }
        /* an all-zero row stays zero; a lone spike survives */
        memset(x, 0, sizeof x);
        t->quantize(x, b, N);
        t->dequantize(b, y, N);
        bool zero = true;
        for (int i = 0; i < N; i++) zero = zero && y[i] == 0.0f;
        CHECKF(zero, "%s: zero row", t->name);
        /* A lone spike stays the row's largest value with its sign. The IQ2 grids have no zero
         * (smallest magnitude 8 against a largest of 43), so their best fit for a spike among
         * zeros lowers the spike to shrink the 31 unavoidable nonzero neighbours. */
        x[300] = 3.0f;
        t->quantize(x, b, N);
        t->dequantize(b, y, N);
        bool spike = y[300] > 1.2f;
        for (int i = 0; i < N; i++) spike = spike && (i == 300 || fabsf(y[i]) < 0.25f * y[300]);
        CHECKF(spike, "%s: spike decodes to %.4g, neighbour %.4g", t->name, y[300], y[301]);
    }
}

/* ---- 8. golden dot results --------------------------------------------------------------------
 * Fixed inputs (random valid weight blocks, activations encoded from fixed floats) and the exact
 * float bits of (a) the dot of the whole 8192-value row and (b) an FNV-1a hash of the bits of the
 * dot of every single weight block with its activation blocks and of every prefix of the row.
 * (b) pins the float association inside each block's term and each accumulation step, which a
 * long row can hide (a one-ulp change of one term is often absorbed by the running sum). Entries marked
 * "= ggml generic" were checked to be bit-identical, row, every block and every prefix, to ggml's generic CPU
 * vec_dot (ggml-cpu/quants.c) on the same bytes; the plain-float ones and those marked "sluice
 * order" (Q3_K..Q6_K, IQ4_XS: one exact integer per super-block, see quant_kquants.c) pin
 * sluice's own documented order, which the SIMD kernels reproduce (tests/unit/test_kernels.c). */

enum { GOLDEN_N = 8192 };

static void golden_inputs(uint32_t type, int64_t n, uint8_t *w, uint8_t *a) {
    const quant_traits *t = quant_traits_of(type), *at = quant_traits_of(t->act_type);
    rng r = {1000 + type};
    for (int64_t bl = 0; bl < n / t->block_elems; bl++) random_block(type, w + bl * t->block_bytes, &r);
    static float x[GOLDEN_N];
    for (int64_t i = 0; i < n; i++) x[i] = rng_small(&r) * (i % 61 == 0 ? 8.0f : 1.0f);
    at->quantize(x, a, n);
}

/* Hash of the dot of every single block, then of every prefix of the row (whole blocks; 32
 * values for the plain floats) -- together they pin each block term and every accumulation
 * step. */
static uint64_t golden_block_hash(uint32_t type, const uint8_t *w, const uint8_t *a) {
    const quant_traits *t = quant_traits_of(type), *at = quant_traits_of(t->act_type);
    int64_t step = t->block_elems == 1 ? 32 : t->block_elems;
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t i = 0; i < GOLDEN_N; i += step) {
        float d = t->dot(step, w + i / t->block_elems * t->block_bytes, a + i / at->block_elems * at->block_bytes);
        h = fnv_bytes(h, fbits(d), 4);
    }
    for (int64_t len = step; len <= GOLDEN_N; len += step) h = fnv_bytes(h, fbits(t->dot(len, w, a)), 4);
    return h;
}

static const struct {
    uint32_t type;
    uint32_t bits;
    uint64_t block_hash;
} golden[] = {
    {GGML_TYPE_F32, 0xc499dec2u, 0x7c8da5f5d7845faaull}, /* -1230.96118 */
    {GGML_TYPE_F16, 0xc3ea8b92u, 0xdbe30e182e6881e4ull}, /* -469.090393 */
    {GGML_TYPE_BF16, 0xc420d047u, 0xac98efb17e9b1b1cull}, /* -643.254333 */
    {GGML_TYPE_Q4_0, 0x45347d99u, 0x20bb99cf664d6006ull}, /* 2887.84985 (= ggml generic) */
    {GGML_TYPE_Q4_1, 0xc3c24ee8u, 0x73a1aaedbddf0ab6ull}, /* -388.616455 (= ggml generic) */
    {GGML_TYPE_Q5_0, 0x44a20425u, 0x99d3d8a7b4772644ull}, /* 1296.12952 (= ggml generic) */
    {GGML_TYPE_Q5_1, 0x469abe1fu, 0x5a054148c046a20eull}, /* 19807.0605 (= ggml generic) */
    {GGML_TYPE_Q8_0, 0xc6312d69u, 0x2df055eebc2b559eull}, /* -11339.3525 (= ggml generic) */
    {GGML_TYPE_Q2_K, 0xc5b43f4au, 0x3f944a2fe058a286ull}, /* -5767.91113 (= ggml generic) */
    {GGML_TYPE_Q3_K, 0xc6fbb4c7u, 0x6ce5ed273686a7fcull}, /* -32218.3887 (sluice order) */
    {GGML_TYPE_Q4_K, 0x4823cec0u, 0x8cf82cd33a9ee9a0ull}, /* 167739 (sluice order) */
    {GGML_TYPE_Q5_K, 0x488d54b2u, 0x4ea2b5f7f043c272ull}, /* 289445.562 (sluice order) */
    {GGML_TYPE_Q6_K, 0xc84eb611u, 0x7df5fa072ff886acull}, /* -211672.266 (sluice order) */
    {GGML_TYPE_IQ2_XXS, 0x46bc6b9eu, 0xa1c26a7c560c091dull}, /* 24117.8086 (= ggml generic) */
    {GGML_TYPE_IQ2_XS, 0x46b6b0f7u, 0x000ffdaccf683194ull}, /* 23384.4824 (= ggml generic) */
    {GGML_TYPE_IQ2_S, 0x4734d6eau, 0x9090bd87a3522763ull}, /* 46294.9141 (= ggml generic) */
    {GGML_TYPE_IQ3_XXS, 0x474de448u, 0x8d0ef74b5a6e3b61ull}, /* 52708.2812 (= ggml generic) */
    {GGML_TYPE_IQ3_S, 0x47aa4c10u, 0x9f32e3639ab0e47aull}, /* 87192.125 (= ggml generic) */
    {GGML_TYPE_IQ4_NL, 0xc75de082u, 0x44d59a21ac8dda22ull}, /* -56800.5078 (= ggml generic) */
    {GGML_TYPE_IQ4_XS, 0x49824592u, 0xaed724f81d1c442dull}, /* 1067186.25 (sluice order) */
    {GGML_TYPE_MXFP4, 0x4771c404u, 0x0e6e1d6494f70219ull}, /* 61892.0156 (= ggml generic) */
    {GGML_TYPE_Q2_0, 0x43e903b0u, 0xbee20cd744b9a11full}, /* 466.028809 (= ggml generic) */
};

/* Q2_0 without the scale search (the MTP draft head): the block's value of largest magnitude,
 * of either sign, comes back exactly (code 2 at half of it, a power-of-two-scaled f16), every
 * value within one step and a half of the scale (the codes stop at -1), the bytes as the
 * reference dequantizer reads them; and its error is near the searching quantizer's. */
static void test_q2_0_fast(void) {
    enum { N = 64 * 256 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N), *z = malloc(sizeof(float) * N);
    uint8_t *b = malloc(18 * (N / 64)), *c = malloc(18 * (N / 64));
    if (!x || !y || !z || !b || !c) {
        CHECKF(0, "out of memory");
        return;
    }
    uint32_t r = 99;
    for (int i = 0; i < N; i++) {
        r = r * 1664525u + 1013904223u;
        x[i] = ((float)(r >> 8) / 16777216.0f - 0.5f) * 3.0f;
    }
    x[5] = -8.0f;   /* block 0: its extreme negative */
    x[64 + 7] = 4.0f; /* block 1: positive */
    quant_quantize_q2_0_fast(x, b, N);
    quant_dequantize_q2_0(b, y, N);
    quant_quantize_q2_0(x, c, N);
    quant_dequantize_q2_0(c, z, N);
    CHECK(y[5] == -8.0f && y[64 + 7] == 4.0f);
    double e_fast = 0, e_search = 0;
    int far = 0;
    for (int i = 0; i < N; i++) {
        const float d = (float)fabs(ref_f16(rd16(b + 18 * (i / 64))));
        if (fabsf(x[i] - y[i]) > 1.5f * d + 1e-6f) far++;
        e_fast += (double)(x[i] - y[i]) * (x[i] - y[i]);
        e_search += (double)(x[i] - z[i]) * (x[i] - z[i]);
    }
    CHECKF(far == 0, "%d values further than 1.5 steps", far);
    CHECKF(e_fast < 3.0 * e_search, "squared error %.3g against the search's %.3g", e_fast, e_search);
    printf("Q2_0 without the scale search: squared error %.3g, with it %.3g\n", e_fast, e_search);
    /* a malformed file's NaN in a block: a defined code for it, the block's other values kept */
    x[64 * 2 + 3] = NAN;
    quant_quantize_q2_0_fast(x + 64 * 2, b, 64);
    quant_dequantize_q2_0(b, y, 64);
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += !isfinite(y[i]);
    CHECKF(bad == 0, "%d non-finite values from a block with a NaN", bad);
    free(x), free(y), free(z), free(b), free(c);
}

static void test_golden(void) {
    static uint8_t w[GOLDEN_N * 4], a[GOLDEN_N * 4];
    CHECK(sizeof golden / sizeof golden[0] == N_CODEC_TYPES);
    for (size_t k = 0; k < sizeof golden / sizeof golden[0]; k++) {
        const quant_traits *t = quant_traits_of(golden[k].type);
        golden_inputs(golden[k].type, GOLDEN_N, w, a);
        float got = t->dot(GOLDEN_N, w, a);
        CHECKF(fbits(got) == golden[k].bits, "%s: dot %.9g (0x%08x), golden 0x%08x", t->name, got, fbits(got),
               golden[k].bits);
        uint64_t h = golden_block_hash(golden[k].type, w, a);
        CHECKF(h == golden[k].block_hash, "%s: per-block dot hash 0x%016llx", t->name, (unsigned long long)h);
    }
}

int main(void) {
    test_traits();
    test_tables();
    test_half();
    test_handbuilt();
    test_random_blocks();
    test_dot();
    test_q8_0_q8_1();
    test_q8_k();
    test_weight_roundtrip();
    test_q2_0_fast();
    test_golden();
    if (!check_failures) printf("test_quant: all checks passed\n");
    CHECK_DONE();
}
