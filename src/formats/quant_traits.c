/* The one table of ggml tensor types: block geometry for every id ggml defines, the scalar
 * reference codec where sluice has one, and the f16/bf16 scalar conversions everything else
 * builds on.
 *
 * Block sizes and byte counts are format facts (ggml's type_traits); a GGUF reader relies on
 * them to compute tensor sizes even for types we cannot decode, so every defined id is listed.
 */
#include "formats/quant.h"

/* Bit-exact results need every float operation rounded as written: no fused multiply-add.
 * (-std=c11 already implies this for GCC; -std=gnu11 and clang's default do not.) */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#define CODEC(lower) quant_dequantize_##lower, quant_quantize_##lower, quant_dot_##lower
#define NO_CODEC NULL, NULL, NULL

/* Indexed by type id; an entry with name == NULL is an id ggml does not define (4, 5, 31-33,
 * 36-38 were removed from the format). */
static const quant_traits traits_table[GGML_TYPE_COUNT] = {
    [GGML_TYPE_F32] = {"F32", 1, 4, false, CODEC(f32), GGML_TYPE_F32},
    [GGML_TYPE_F16] = {"F16", 1, 2, false, CODEC(f16), GGML_TYPE_F16},
    [GGML_TYPE_Q4_0] = {"Q4_0", 32, 18, true, CODEC(q4_0), GGML_TYPE_Q8_0},
    [GGML_TYPE_Q4_1] = {"Q4_1", 32, 20, true, CODEC(q4_1), GGML_TYPE_Q8_1},
    [GGML_TYPE_Q5_0] = {"Q5_0", 32, 22, true, CODEC(q5_0), GGML_TYPE_Q8_0},
    [GGML_TYPE_Q5_1] = {"Q5_1", 32, 24, true, CODEC(q5_1), GGML_TYPE_Q8_1},
    [GGML_TYPE_Q8_0] = {"Q8_0", 32, 34, true, CODEC(q8_0), GGML_TYPE_Q8_0},
    /* Activation-only encodings: they decode and encode, but no weight row is ever dotted
     * with them, so they have no dot (as in ggml). */
    [GGML_TYPE_Q8_1] = {"Q8_1", 32, 36, true, quant_dequantize_q8_1, quant_quantize_q8_1, NULL,
                        GGML_TYPE_Q8_1},
    [GGML_TYPE_Q2_K] = {"Q2_K", QK_K, 84, true, CODEC(q2_k), GGML_TYPE_Q8_K},
    [GGML_TYPE_Q3_K] = {"Q3_K", QK_K, 110, true, CODEC(q3_k), GGML_TYPE_Q8_K},
    [GGML_TYPE_Q4_K] = {"Q4_K", QK_K, 144, true, CODEC(q4_k), GGML_TYPE_Q8_K},
    [GGML_TYPE_Q5_K] = {"Q5_K", QK_K, 176, true, CODEC(q5_k), GGML_TYPE_Q8_K},
    [GGML_TYPE_Q6_K] = {"Q6_K", QK_K, 210, true, CODEC(q6_k), GGML_TYPE_Q8_K},
    [GGML_TYPE_Q8_K] = {"Q8_K", QK_K, 292, true, quant_dequantize_q8_k, quant_quantize_q8_k, NULL,
                        GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ2_XXS] = {"IQ2_XXS", QK_K, 66, true, CODEC(iq2_xxs), GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ2_XS] = {"IQ2_XS", QK_K, 74, true, CODEC(iq2_xs), GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ3_XXS] = {"IQ3_XXS", QK_K, 98, true, CODEC(iq3_xxs), GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ1_S] = {"IQ1_S", QK_K, 50, true, NO_CODEC, GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18, true, CODEC(iq4_nl), GGML_TYPE_Q8_0},
    [GGML_TYPE_IQ3_S] = {"IQ3_S", QK_K, 110, true, CODEC(iq3_s), GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ2_S] = {"IQ2_S", QK_K, 82, true, CODEC(iq2_s), GGML_TYPE_Q8_K},
    [GGML_TYPE_IQ4_XS] = {"IQ4_XS", QK_K, 136, true, CODEC(iq4_xs), GGML_TYPE_Q8_K},
    [GGML_TYPE_I8] = {"I8", 1, 1, false, NO_CODEC, GGML_TYPE_I8},
    [GGML_TYPE_I16] = {"I16", 1, 2, false, NO_CODEC, GGML_TYPE_I16},
    [GGML_TYPE_I32] = {"I32", 1, 4, false, NO_CODEC, GGML_TYPE_I32},
    [GGML_TYPE_I64] = {"I64", 1, 8, false, NO_CODEC, GGML_TYPE_I64},
    [GGML_TYPE_F64] = {"F64", 1, 8, false, NO_CODEC, GGML_TYPE_F64},
    [GGML_TYPE_IQ1_M] = {"IQ1_M", QK_K, 56, true, NO_CODEC, GGML_TYPE_Q8_K},
    [GGML_TYPE_BF16] = {"BF16", 1, 2, false, CODEC(bf16), GGML_TYPE_BF16},
    [GGML_TYPE_TQ1_0] = {"TQ1_0", QK_K, 54, true, NO_CODEC, GGML_TYPE_Q8_K},
    [GGML_TYPE_TQ2_0] = {"TQ2_0", QK_K, 66, true, NO_CODEC, GGML_TYPE_Q8_K},
    [GGML_TYPE_MXFP4] = {"MXFP4", 32, 17, true, CODEC(mxfp4), GGML_TYPE_Q8_0},
    [GGML_TYPE_NVFP4] = {"NVFP4", 64, 36, true, NO_CODEC, GGML_TYPE_Q8_0},
    [GGML_TYPE_Q1_0] = {"Q1_0", 128, 18, true, NO_CODEC, GGML_TYPE_Q8_0},
    [GGML_TYPE_Q2_0] = {"Q2_0", 64, 18, true, CODEC(q2_0), GGML_TYPE_Q8_0},
};

/* sluice-private types, indexed by id - SLUICE_TYPE_FIRST. MLX affine: one block per group,
 * 4 bytes of scale and bias plus group*bits/8 bytes of codes; activations in Q8_0. */
#define MLX_ENTRY_(lower, UPPER, bits, group, bf16)                                           \
    {#UPPER, group, 4 + (group) * (bits) / 8, true, CODEC(lower), GGML_TYPE_Q8_0},
static const quant_traits sluice_table[QUANT_TYPE_LIMIT - SLUICE_TYPE_FIRST] = {
    QUANT_MLX_VARIANTS(MLX_ENTRY_)
    /* no codec: only the CPU backend's tile multiplies it (a group, not a row, is its unit) */
    [SLUICE_TYPE_Q6_K_R16 - SLUICE_TYPE_FIRST] = {"Q6_K_R16", 256, 210, true, NO_CODEC, GGML_TYPE_Q8_K},
};
#undef MLX_ENTRY_

const quant_traits *quant_traits_of(uint32_t type) {
    if (type >= SLUICE_TYPE_FIRST && type < QUANT_TYPE_LIMIT)
        return &sluice_table[type - SLUICE_TYPE_FIRST];
    if (type >= GGML_TYPE_COUNT || traits_table[type].name == NULL) return NULL;
    return &traits_table[type];
}

const char *quant_type_name(uint32_t type) {
    const quant_traits *t = quant_traits_of(type);
    if (t) return t->name;
    /* Per-thread buffer so that concurrent callers (loader threads) never see each other's text. */
    static _Thread_local char unknown[24];
    snprintf(unknown, sizeof unknown, "type#%u", (unsigned)type);
    return unknown;
}

int quant_type_from_name(const char *name) {
    if (!name) return -1;
    for (int id = 0; id < (int)QUANT_TYPE_LIMIT; id++) {
        const quant_traits *t = quant_traits_of((uint32_t)id);
        const char *known = t ? t->name : NULL;
        if (!known) continue;
        size_t i = 0;
        while (known[i] && name[i] &&
               toupper((unsigned char)name[i]) == (unsigned char)known[i])
            i++;
        if (known[i] == '\0' && name[i] == '\0') return id;
    }
    return -1;
}

bool quant_has_codec(uint32_t type) {
    const quant_traits *t = quant_traits_of(type);
    return t && t->dequantize && t->dot;
}

size_t quant_row_bytes(uint32_t type, int64_t n) {
    const quant_traits *t = quant_traits_of(type);
    /* 0 signals an invalid request; a GGUF validator turns that into a clear error. */
    if (!t || n < 0 || n % t->block_elems != 0) return 0;
    uint64_t blocks = (uint64_t)n / t->block_elems;
    if (blocks > SIZE_MAX / t->block_bytes) return 0;
    return (size_t)blocks * t->block_bytes;
}

/* ---- half and bfloat16 ------------------------------------------------------------------- */

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float quant_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in float */
        float v = (float)mant * 0x1p-24f;
        return bits_float(float_bits(v) | sign);
    }
    if (exp == 31) {
        /* inf, or NaN with its payload, made quiet (as ggml's arithmetic conversion does) */
        uint32_t quiet = mant ? 0x00400000u : 0u;
        return bits_float(sign | 0x7f800000u | (mant << 13) | quiet);
    }
    return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* Shift right by s (1..31) rounding to nearest, ties to even. */
static uint32_t shift_round_even(uint32_t v, unsigned s) {
    uint32_t q = v >> s;
    uint32_t rem = v & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return q;
}

uint16_t quant_f32_to_f16(float f) {
    uint32_t x = float_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u; /* NaN: quiet, payload dropped (as ggml) */
    if (ax >= 0x47800000u) return sign | 0x7c00u; /* >= 2^16 (or inf): overflows to inf */
    if (ax < 0x33000000u) return sign;            /* <= 2^-25 rounds to (signed) zero */
    uint32_t e = ax >> 23;
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    if (e < 113) {
        /* half subnormal: value / 2^-24 = mant * 2^(e - 126); a carry to 0x400 is the
         * smallest normal, which the same bit pattern encodes correctly */
        return sign | (uint16_t)shift_round_even(mant, 126u - e);
    }
    /* normal: rebias the exponent, round the mantissa to 10 bits; a mantissa carry ripples
     * into the exponent (and up to inf), which is exactly round-to-nearest-even */
    uint32_t combined = ((e - 112u) << 23) | (ax & 0x7fffffu);
    return sign | (uint16_t)shift_round_even(combined, 13);
}

float quant_bf16_to_f32(uint16_t h) { return bits_float((uint32_t)h << 16); }

uint16_t quant_f32_to_bf16(float f) {
    uint32_t x = float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
