/* Quant codecs: one table of type traits for every ggml tensor type.
 *
 * A weight row of type T is a run of blocks; each block covers block_elems values in
 * block_bytes bytes. Dot products never run on float weights against float activations for
 * quantized types: as llama.cpp does on the CPU, the activation row is first encoded in the
 * weight type's act_type (Q8_0 for 32-element types, Q8_K for 256-element types, F16 for F16,
 * BF16 for BF16, F32 for F32), then the codec's dot product runs on the two encoded rows.
 * That keeps results close to llama.cpp's, fast (integer dot products) and deterministic.
 *
 * The functions in this table are the scalar references; backends may install faster ones that
 * must produce identical results (see backends/cpu/kernels.h).
 */
#ifndef SLUICE_QUANT_H
#define SLUICE_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ggml type ids, as stored in GGUF tensor infos. */
enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_IQ2_XXS = 16,
    GGML_TYPE_IQ2_XS = 17,
    GGML_TYPE_IQ3_XXS = 18,
    GGML_TYPE_IQ1_S = 19,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_IQ3_S = 21,
    GGML_TYPE_IQ2_S = 22,
    GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_IQ1_M = 29,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_TQ1_0 = 34,
    GGML_TYPE_TQ2_0 = 35,
    GGML_TYPE_MXFP4 = 39,
    GGML_TYPE_NVFP4 = 40,
    GGML_TYPE_Q1_0 = 41,
    GGML_TYPE_Q2_0 = 42,
    GGML_TYPE_COUNT = 43,
};

#define QK_K 256 /* elements per K-quant / I-quant super-block */

/* ---- sluice-private types -------------------------------------------------------------------
 * Ids from 100 up, outside ggml's range, for formats ggml has no type for. Only sluice's own
 * files (converted GGUFs, expert-major stores) contain them; docs/quant.md has the layouts.
 *
 * MLX affine quantization (mlx.core.quantize, mode "affine"): one block per group of G values
 * along a row: scale (2 bytes), bias (2 bytes), then the G codes of `bits` bits as an LSB-first
 * bit stream (G*bits/8 bytes); value = scale*q + bias. Scale and bias are f16, or bf16 for the
 * _BF16 variants (MLX files store them in the model's dtype, so conversion keeps them exactly).
 * X(lower, UPPER, bits, group, bf16) lists every variant; the order fixes the ids. */
#define QUANT_MLX_VARIANTS(X) \
    X(mlx2_g32, MLX2_G32, 2, 32, 0) X(mlx2_g64, MLX2_G64, 2, 64, 0) X(mlx2_g128, MLX2_G128, 2, 128, 0) \
    X(mlx3_g32, MLX3_G32, 3, 32, 0) X(mlx3_g64, MLX3_G64, 3, 64, 0) X(mlx3_g128, MLX3_G128, 3, 128, 0) \
    X(mlx4_g32, MLX4_G32, 4, 32, 0) X(mlx4_g64, MLX4_G64, 4, 64, 0) X(mlx4_g128, MLX4_G128, 4, 128, 0) \
    X(mlx5_g32, MLX5_G32, 5, 32, 0) X(mlx5_g64, MLX5_G64, 5, 64, 0) X(mlx5_g128, MLX5_G128, 5, 128, 0) \
    X(mlx6_g32, MLX6_G32, 6, 32, 0) X(mlx6_g64, MLX6_G64, 6, 64, 0) X(mlx6_g128, MLX6_G128, 6, 128, 0) \
    X(mlx8_g32, MLX8_G32, 8, 32, 0) X(mlx8_g64, MLX8_G64, 8, 64, 0) X(mlx8_g128, MLX8_G128, 8, 128, 0) \
    X(mlx2_g32_bf16, MLX2_G32_BF16, 2, 32, 1) X(mlx2_g64_bf16, MLX2_G64_BF16, 2, 64, 1)             \
    X(mlx2_g128_bf16, MLX2_G128_BF16, 2, 128, 1) X(mlx3_g32_bf16, MLX3_G32_BF16, 3, 32, 1)          \
    X(mlx3_g64_bf16, MLX3_G64_BF16, 3, 64, 1) X(mlx3_g128_bf16, MLX3_G128_BF16, 3, 128, 1)          \
    X(mlx4_g32_bf16, MLX4_G32_BF16, 4, 32, 1) X(mlx4_g64_bf16, MLX4_G64_BF16, 4, 64, 1)             \
    X(mlx4_g128_bf16, MLX4_G128_BF16, 4, 128, 1) X(mlx5_g32_bf16, MLX5_G32_BF16, 5, 32, 1)          \
    X(mlx5_g64_bf16, MLX5_G64_BF16, 5, 64, 1) X(mlx5_g128_bf16, MLX5_G128_BF16, 5, 128, 1)          \
    X(mlx6_g32_bf16, MLX6_G32_BF16, 6, 32, 1) X(mlx6_g64_bf16, MLX6_G64_BF16, 6, 64, 1)             \
    X(mlx6_g128_bf16, MLX6_G128_BF16, 6, 128, 1) X(mlx8_g32_bf16, MLX8_G32_BF16, 8, 32, 1)          \
    X(mlx8_g64_bf16, MLX8_G64_BF16, 8, 64, 1) X(mlx8_g128_bf16, MLX8_G128_BF16, 8, 128, 1)

#define QUANT_MLX_ENUM_(lower, UPPER, bits, group, bf16) SLUICE_TYPE_##UPPER,
enum sluice_type {
    SLUICE_TYPE_FIRST = 100,
    SLUICE_TYPE_MLX_BEFORE_ = SLUICE_TYPE_FIRST - 1,
    QUANT_MLX_VARIANTS(QUANT_MLX_ENUM_)
    SLUICE_TYPE_MLX_END_,
    SLUICE_TYPE_Q6_K_R16 = SLUICE_TYPE_MLX_END_, /* sixteen Q6_K rows interleaved (quant_q6k_r16.c):
                                                  * made at load time, refused in files */
    SLUICE_TYPE_END, /* one past the largest type id of any kind (ggml's or sluice's) */
};
#undef QUANT_MLX_ENUM_
#define QUANT_TYPE_LIMIT ((uint32_t)SLUICE_TYPE_END) /* arrays indexed by any type id */
#define QUANT_MLX_LIMIT ((uint32_t)SLUICE_TYPE_MLX_END_) /* one past the last MLX type */

/* Decode n values (n a multiple of block_elems) from src into dst. */
typedef void (*quant_dequantize_fn)(const void *src, float *dst, int64_t n);
/* Encode n floats (n a multiple of block_elems) into dst. */
typedef void (*quant_quantize_fn)(const float *src, void *dst, int64_t n);
/* Dot product of n values: a weight row w (this type) with an activation row a (act_type). */
typedef float (*quant_dot_fn)(int64_t n, const void *w, const void *a);

typedef struct quant_traits {
    const char *name;        /* "Q4_K" */
    uint32_t block_elems;    /* values per block */
    uint32_t block_bytes;    /* bytes per block */
    bool is_quantized;       /* false for F32/F16/BF16/F64/integers */
    /* Codec; NULL where sluice has none (the type can still be parsed and listed). */
    quant_dequantize_fn dequantize;
    quant_quantize_fn quantize; /* reference encoder (activations, synthetic files, tests) */
    quant_dot_fn dot;
    enum ggml_type act_type;    /* encoding of the activation row for dot */
} quant_traits;

/* Traits of a type id, or NULL for ids that ggml does not define. */
const quant_traits *quant_traits_of(uint32_t type);
/* "Q4_K", or "type#N" for unknown ids (static storage). */
const char *quant_type_name(uint32_t type);
/* Parse a type name ("q4_k", "F16", ...), case-insensitive; -1 if unknown. */
int quant_type_from_name(const char *name);
/* True when sluice can decode this type and take dot products with it. */
bool quant_has_codec(uint32_t type);
/* Bytes of a row of n values of this type (n must be a multiple of block_elems). */
size_t quant_row_bytes(uint32_t type, int64_t n);

/* The MLX affine type of these parameters (bits 2, 3, 4, 5, 6, 8; group 32, 64, 128), or -1. */
int quant_mlx_type(int bits, int group, bool bf16_scales);
/* Parameters of an MLX affine type; false for any other type. */
bool quant_mlx_params(uint32_t type, int *bits, int *group, bool *bf16_scales);

/* IEEE half and bfloat16 conversions (round to nearest even, as ggml does). */
float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f);
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);

/* ---- Scalar reference codecs ---------------------------------------------------------------
 * The entry points behind the traits table, one triple per type family. They are declared here
 * so that the table (quant_traits.c) and backends checking their kernels against the references
 * can name them; ordinary code should go through quant_traits_of(type)->... instead.
 * Rows are little-endian byte images of ggml blocks; pointers need no alignment.
 * Accumulation orders of every dot product are fixed and described in docs/quant.md. */

/* Plain floats (quant_float.c). */
void quant_dequantize_f32(const void *src, float *dst, int64_t n);
void quant_quantize_f32(const float *src, void *dst, int64_t n);
float quant_dot_f32(int64_t n, const void *w, const void *a);
void quant_dequantize_f16(const void *src, float *dst, int64_t n);
void quant_quantize_f16(const float *src, void *dst, int64_t n);
float quant_dot_f16(int64_t n, const void *w, const void *a);
void quant_dequantize_bf16(const void *src, float *dst, int64_t n);
void quant_quantize_bf16(const float *src, void *dst, int64_t n);
float quant_dot_bf16(int64_t n, const void *w, const void *a);

/* 32-element block types (quant_legacy.c). Q8_1 is an activation encoding only (no dot). */
void quant_dequantize_q4_0(const void *src, float *dst, int64_t n);
void quant_quantize_q4_0(const float *src, void *dst, int64_t n);
float quant_dot_q4_0(int64_t n, const void *w, const void *a);
void quant_dequantize_q4_1(const void *src, float *dst, int64_t n);
void quant_quantize_q4_1(const float *src, void *dst, int64_t n);
float quant_dot_q4_1(int64_t n, const void *w, const void *a);
void quant_dequantize_q5_0(const void *src, float *dst, int64_t n);
void quant_quantize_q5_0(const float *src, void *dst, int64_t n);
float quant_dot_q5_0(int64_t n, const void *w, const void *a);
void quant_dequantize_q5_1(const void *src, float *dst, int64_t n);
void quant_quantize_q5_1(const float *src, void *dst, int64_t n);
float quant_dot_q5_1(int64_t n, const void *w, const void *a);
void quant_dequantize_q8_0(const void *src, float *dst, int64_t n);
void quant_quantize_q8_0(const float *src, void *dst, int64_t n);
float quant_dot_q8_0(int64_t n, const void *w, const void *a);
void quant_dequantize_q8_1(const void *src, float *dst, int64_t n);
void quant_quantize_q8_1(const float *src, void *dst, int64_t n);
void quant_dequantize_iq4_nl(const void *src, float *dst, int64_t n);
void quant_quantize_iq4_nl(const float *src, void *dst, int64_t n);
float quant_dot_iq4_nl(int64_t n, const void *w, const void *a);
void quant_dequantize_mxfp4(const void *src, float *dst, int64_t n);
void quant_quantize_mxfp4(const float *src, void *dst, int64_t n);
float quant_dot_mxfp4(int64_t n, const void *w, const void *a);

/* K-quants (quant_kquants.c). Q8_K is an activation encoding only (no dot). */
void quant_dequantize_q2_k(const void *src, float *dst, int64_t n);
void quant_quantize_q2_k(const float *src, void *dst, int64_t n);
float quant_dot_q2_k(int64_t n, const void *w, const void *a);
void quant_dequantize_q3_k(const void *src, float *dst, int64_t n);
void quant_quantize_q3_k(const float *src, void *dst, int64_t n);
float quant_dot_q3_k(int64_t n, const void *w, const void *a);
void quant_dequantize_q4_k(const void *src, float *dst, int64_t n);
void quant_quantize_q4_k(const float *src, void *dst, int64_t n);
float quant_dot_q4_k(int64_t n, const void *w, const void *a);
void quant_dequantize_q5_k(const void *src, float *dst, int64_t n);
void quant_quantize_q5_k(const float *src, void *dst, int64_t n);
float quant_dot_q5_k(int64_t n, const void *w, const void *a);
void quant_dequantize_q6_k(const void *src, float *dst, int64_t n);
void quant_quantize_q6_k(const float *src, void *dst, int64_t n);
float quant_dot_q6_k(int64_t n, const void *w, const void *a);
void quant_dequantize_q8_k(const void *src, float *dst, int64_t n);
void quant_quantize_q8_k(const float *src, void *dst, int64_t n);

/* I-quants and Q2_0 (quant_iq.c; lookup grids in quant_iq_tables.c). */
void quant_dequantize_iq2_xxs(const void *src, float *dst, int64_t n);
void quant_quantize_iq2_xxs(const float *src, void *dst, int64_t n);
float quant_dot_iq2_xxs(int64_t n, const void *w, const void *a);
void quant_dequantize_iq2_xs(const void *src, float *dst, int64_t n);
void quant_quantize_iq2_xs(const float *src, void *dst, int64_t n);
float quant_dot_iq2_xs(int64_t n, const void *w, const void *a);
void quant_dequantize_iq2_s(const void *src, float *dst, int64_t n);
void quant_quantize_iq2_s(const float *src, void *dst, int64_t n);
float quant_dot_iq2_s(int64_t n, const void *w, const void *a);
void quant_dequantize_iq3_xxs(const void *src, float *dst, int64_t n);
void quant_quantize_iq3_xxs(const float *src, void *dst, int64_t n);
float quant_dot_iq3_xxs(int64_t n, const void *w, const void *a);
void quant_dequantize_iq3_s(const void *src, float *dst, int64_t n);
void quant_quantize_iq3_s(const float *src, void *dst, int64_t n);
float quant_dot_iq3_s(int64_t n, const void *w, const void *a);
void quant_dequantize_iq4_xs(const void *src, float *dst, int64_t n);
void quant_quantize_iq4_xs(const float *src, void *dst, int64_t n);
float quant_dot_iq4_xs(int64_t n, const void *w, const void *a);
void quant_dequantize_q2_0(const void *src, float *dst, int64_t n);
void quant_quantize_q2_0(const float *src, void *dst, int64_t n);
/* Q2_0 without the scale search: each block's scale is its value of largest magnitude over 2
 * (that value then has code 2, exactly). Coarser than quant_quantize_q2_0 and ~30x faster: for
 * copies made at load time where only an approximation is wanted (the MTP draft head). */
void quant_quantize_q2_0_fast(const float *src, void *dst, int64_t n);

/* Q6_K_R16 (quant_q6k_r16.c): sixteen Q6_K rows of n values in one group of 16 * 210 * n / 256
 * bytes, the layout of a rows-in-lanes kernel; a product gives quant_dot_q6_k's bits. Made at
 * load time from a Q6_K matrix whose rows come in whole groups (the MTP verification head). */
#define QUANT_R16_ROWS 16
/* Interleave the 16 rows at rows (row_bytes apart) into group. */
void quant_repack_q6_k_r16(const void *rows, size_t row_bytes, void *group, int64_t n);
/* out[r] = quant_dot_q6_k(n, row r of the group, a) for r < 16 (a: one Q8_K row). */
void quant_dot_q6_k_r16(int64_t n, const void *group, const void *a, float out[QUANT_R16_ROWS]);
/* The 256 unsigned codes (q + 32, 0..63) of one Q6_K block. */
void quant_q6_k_codes(const void *block, uint8_t codes[256]);
float quant_dot_q2_0(int64_t n, const void *w, const void *a);

/* MLX affine quantization (quant_mlx.c), every variant of QUANT_MLX_VARIANTS. The activation
 * encoding is Q8_0 (every group size is a multiple of 32). */
#define QUANT_MLX_DECL_(lower, UPPER, bits, group, bf16)                                     \
    void quant_dequantize_##lower(const void *src, float *dst, int64_t n);                  \
    void quant_quantize_##lower(const float *src, void *dst, int64_t n);                    \
    float quant_dot_##lower(int64_t n, const void *w, const void *a);
QUANT_MLX_VARIANTS(QUANT_MLX_DECL_)
#undef QUANT_MLX_DECL_

/* Lookup data of the I-quants and non-linear types (format data, reproduced verbatim from ggml). */
extern const int8_t quant_kvalues_iq4nl[16];  /* IQ4_NL / IQ4_XS levels */
extern const int8_t quant_kvalues_mxfp4[16];  /* E2M1 values, doubled */
extern const uint8_t quant_ksigns_iq2xs[128]; /* 7-bit index -> 8 signs with even parity */
extern const uint64_t quant_iq2xxs_grid[256]; /* 8 magnitudes per entry, byte j = element j */
extern const uint64_t quant_iq2xs_grid[512];
extern const uint64_t quant_iq2s_grid[1024];
extern const uint32_t quant_iq3xxs_grid[256]; /* 4 magnitudes per entry */
extern const uint32_t quant_iq3s_grid[512];

#endif /* SLUICE_QUANT_H */
