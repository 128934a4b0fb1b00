/* CPU compute kernels: the fastest implementation of each codec's dot product (and of each
 * activation encoder) that this processor supports, chosen once at start-up by cpuid/xgetbv.
 *
 * Every kernel returns results BIT-IDENTICAL to the scalar reference in formats/quant_*.c:
 * integer sums are exact in any order, and each kernel performs the reference's float steps
 * (documented next to each reference dot) in the reference's order, without fused
 * multiply-add. tests/unit/test_kernels.c checks every kernel at every instruction-set level
 * this machine supports against the references. So the instruction set, the thread count and
 * the tiling never change a result bit.
 *
 * Levels: scalar (the references, always available), AVX2 (+F16C), AVX-512 (F, BW, VL, DQ with
 * VNNI). One translation unit per level, each compiled with its own -m flags (CMakeLists.txt);
 * nothing outside those files uses instructions beyond the baseline. */
#ifndef SLUICE_KERNELS_H
#define SLUICE_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/quant.h"

typedef quant_dot_fn kernel_dot_fn;
/* Per-block terms of a dot product (kernel_block_terms). */
typedef void (*kernel_terms_fn)(int64_t n, const void *w, const void *a, float *terms);

typedef enum kernel_isa {
    KERNEL_ISA_SCALAR = 0,
    KERNEL_ISA_AVX2 = 1,
    KERNEL_ISA_AVX512 = 2,
    KERNEL_ISA_COUNT
} kernel_isa;

/* Prefill tiles. The activation rows of a matrix product are first PACKED once (a layout the
 * tile kernel streams well; the packing depends only on the activation type), then the tile
 * kernel computes out[t * out_stride + r] = dot(row r of w, activation row t) for r < rows,
 * t < toks, decoding each weight row once for all the tokens. Every output equals the
 * single-row reference dot bit for bit. */
typedef struct kernel_tile {
    size_t (*packed_bytes)(int64_t n, int toks);
    /* pack tokens [t0, t1) of the toks rows (a_stride bytes apart) into dst; disjoint token
     * ranges (multiples of 16) may be packed concurrently */
    void (*pack)(int64_t n, const void *a, size_t a_stride, int toks, int t0, int t1, void *dst);
    void (*run)(int64_t n, const void *w, size_t w_stride, int rows, const void *packed, int toks,
                float *out, size_t out_stride);
    /* the fewest tokens at which the tile beats the loop over dots (0: the backend's default);
     * 1 where packing pays even for one token (Q2_0) */
    int min_toks;
    /* rows come in groups of this many (a thread's rows start at a multiple; 0: 4); types whose
     * unit is a group of rows (Q6_K_R16: 16) have no dot, so their min_toks is 1 */
    int row_group;
} kernel_tile;

/* A tile's pass over a matrix's rows walks the packed activations of its tokens once per group
 * of rows, so a pass's activations must stay in L2: 512 tokens of K = 2048 are 1.1-1.2 MB
 * packed, and each group of 4-16 rows then read them again from L3 (the Q4_K byte tile, 512
 * tokens, two threads: 770-820 GOP/s against 1,010-1,040 in passes of at most 384 KiB). The
 * tokens go in passes of at most kernel_tile_l2_bytes of packed activations, of equal size;
 * each pass decodes the rows once more. SLUICE_TILE_L2_KB sets it at start-up (0: one pass). */
extern size_t kernel_tile_l2_bytes;

/* Units (tokens or token blocks of unit_bytes packed bytes each, `units` in all) per pass: a
 * multiple of step (a tile's tokens per inner pass), at most `most`, the passes equal in size. */
static inline int kernel_tile_pass_units(int units, size_t unit_bytes, int step, int most) {
    int c = most;
    if (kernel_tile_l2_bytes && unit_bytes) {
        const size_t fit = kernel_tile_l2_bytes / unit_bytes;
        c = fit < (size_t)step ? step : fit > (size_t)most ? most : (int)fit;
    }
    const int passes = (units + c - 1) / c;
    c = (units + passes - 1) / passes;
    c = (c + step - 1) / step * step;
    return c > most ? most : c;
}

/* Causal attention of one query position for G query heads that share one KV head, over
 * cache positions 0..n_kv-1: out_g = sum_p softmax_p(scale * q_g . k_p) v_p. q_g at
 * q + g * q_stride, out_g at out + g * out_stride; key p at k + p * k_stride, value p at
 * v + p * v_stride (floats). work: G * KERNEL_ATTN_TILE floats.
 *
 * ONE algorithm for every context length, batch split, thread count and instruction set (the
 * scalar definition is kernel_attn_ref in kernels.c): keys in tiles of KERNEL_ATTN_TILE from
 * position 0; per tile the scores s_p = fl(dot(q, k_p) * scale) with dot = fused
 * multiply-adds into 16 lanes by element index mod 16, folded pairwise (lane j += lane j+w for
 * w = 8, 4, 2, 1); the running maximum m' = max(m, tile max); c = exp_s(m - m');
 * l = l * c (l in double, as ggml sums softmax denominators); o = o * c; then per key in order
 * e = exp_s(s_p - m'), l = l + e, o[d] = fma(e, v_p[d], o[d]); finally o[d] * float(1 / l). exp_s is a fixed polynomial exponential
 * (kernels.c), evaluated with the same operations in scalar and vector code, so every level
 * gives the same bits. */
#define KERNEL_ATTN_TILE 64
typedef void (*kernel_attn_fn)(const float *q, size_t q_stride, int G, const float *k, size_t k_stride,
                               const float *v, size_t v_stride, int n_kv, int hd, int hd_v, float scale,
                               float *out, size_t out_stride, float *work);
void kernel_attn_ref(const float *q, size_t q_stride, int G, const float *k, size_t k_stride, const float *v,
                     size_t v_stride, int n_kv, int hd, int hd_v, float scale, float *out, size_t out_stride,
                     float *work);
/* The exponential of the attention algorithm: Cody-Waite reduction by ln 2, degree-7 Taylor
 * polynomial in Horner form (separate multiplies and adds), scaled by 2^n; 0 below -87. */
float kernel_exp_s(float x);
kernel_attn_fn kernel_attn(void);
/* The same attention for T consecutive query positions sharing one KV head (prefill): token i
 * (0 <= i < T) has its G query rows at q + i * q_tok_stride (rows q_stride apart), sees cache
 * positions 0..n_kv+i-1 and writes its rows at out + i * out_tok_stride (out_stride apart). Every
 * row gets exactly the bits kernel_attn gives it for its own token: only the interleaving of rows
 * differs, so that a level's own version reads each tile of keys and values once for the T
 * tokens. kernel_attn_tokens() returns a loop over kernel_attn() where the level has none.
 * work: G * KERNEL_ATTN_TILE floats. */
typedef void (*kernel_attn_tokens_fn)(const float *q, size_t q_tok_stride, size_t q_stride, int G, int T,
                                      const float *k, size_t k_stride, const float *v, size_t v_stride, int n_kv,
                                      int hd, int hd_v, float scale, float *out, size_t out_tok_stride,
                                      size_t out_stride, float *work);
kernel_attn_tokens_fn kernel_attn_tokens(void);

/* Gated DeltaNet state-row passes (ops_ssm.c), each summing in kernel_dot_f32's order:
 *   decay_dot:  s[i] *= a, returns sum s[i] * k[i]
 *   update_dot: s[i] += k[i] * d, returns sum s[i] * q[i] */
typedef float (*kernel_decay_dot_fn)(int n, float *s, float a, const float *k);
typedef float (*kernel_update_dot_fn)(int n, float *s, float d, const float *k, const float *q);
kernel_decay_dot_fn kernel_gdn_decay_dot(void);
kernel_update_dot_fn kernel_gdn_update_dot(void);
/* The same passes over the four state rows s + r * stride (r < 4) at once: four independent
 * chains where one row's pass waits on its own additions. Each row gets the bits of its
 * single-row pass. NULL where an instruction-set level has none (then call the single ones). */
typedef void (*kernel_decay_dot4_fn)(int n, float *s, size_t stride, float a, const float *k, float out[4]);
typedef void (*kernel_update_dot4_fn)(int n, float *s, size_t stride, const float d[4], const float *k,
                                      const float *q, float out[4]);
kernel_decay_dot4_fn kernel_gdn_decay_dot4(void);
kernel_update_dot4_fn kernel_gdn_update_dot4(void);
/* The recurrence of 8 state rows through T tokens, rows s + r * n (r < 8, n % 8 == 0, n at most
 * KERNEL_GDN_ROWS_MAX_N), token t's k, q (scaled), v at k + t * k_stride, q + t * q_stride,
 * v + t * v_stride (v and out indexed by the row), beta at beta[t * beta_stride], the decay a at
 * decay[t]: per row r and token, in order,
 *   m = decay_dot(row r, a, k);  d = (v[r] - m) * beta;  out[t * out_stride + r] = update_dot(row r, d, k, q)
 * Each row has the bits of those single-row passes. NULL where a level has none (then the
 * passes one token at a time). */
#define KERNEL_GDN_ROWS_MAX_N 256
typedef void (*kernel_gdn_rows_fn)(int n, float *s, int T, const float *k, size_t k_stride, const float *q,
                                   size_t q_stride, const float *v, size_t v_stride, const float *beta,
                                   size_t beta_stride, const float *decay, float *out, size_t out_stride);
kernel_gdn_rows_fn kernel_gdn_rows(void);
/* Causal conv1d taps (ops_ssm.c) over n channels of one token:
 *   y[c] = 0.0f + wt[0 * wt_stride + c] * src[0][c] + ... + wt[(K - 1) * wt_stride + c] * src[K - 1][c]
 * added in that order (ggml_ssm_conv's per-channel loop), wt the weights transposed to tap-major. */
typedef void (*kernel_conv_taps_fn)(int n, int K, const float *wt, size_t wt_stride, const float *const *src,
                                    float *y);
kernel_conv_taps_fn kernel_conv_taps(void);
/* The gates that take an exponential, over n floats, each value with exp_f32 (exp_f32.h, glibc's
 * expf) and then the float steps in the order written:
 *   silu_mul:    out[i] = g[i] / (1 + e(-g[i])) * u[i]   (SwiGLU; out may be g)
 *   sigmoid_mul: x[i] = x[i] * (1 / (1 + e(-g[i])))
 *   silu:        x[i] = x[i] / (1 + e(-x[i]))
 * The vector levels compute e in double lanes with the same fused steps, so every level gives
 * the same bits (test_kernels). */
typedef void (*kernel_silu_mul_fn)(size_t n, const float *g, const float *u, float *out);
typedef void (*kernel_sigmoid_mul_fn)(size_t n, const float *g, float *x);
typedef void (*kernel_silu_fn)(size_t n, float *x);
kernel_silu_mul_fn kernel_silu_mul(void);
kernel_sigmoid_mul_fn kernel_sigmoid_mul(void);
kernel_silu_fn kernel_silu(void);
void kernel_silu_mul_ref(size_t n, const float *g, const float *u, float *out);
void kernel_sigmoid_mul_ref(size_t n, const float *g, float *x);
void kernel_silu_ref(size_t n, float *x);
/* the scalar definitions */
void kernel_conv_taps_ref(int n, int K, const float *wt, size_t wt_stride, const float *const *src, float *y);
float kernel_decay_dot_ref(int n, float *s, float a, const float *k);
float kernel_update_dot_ref(int n, float *s, float d, const float *k, const float *q);
float kernel_dot_f32_ref(int64_t n, const float *a, const float *b);

/* The functions of one instruction-set level; NULL entries fall back to the level below. */
typedef struct kernel_set {
    kernel_attn_fn attn;
    kernel_attn_tokens_fn attn_tokens; /* NULL: kernel_attn_tokens() loops over attn */
    float (*dot_f32)(int64_t n, const float *a, const float *b); /* kernel_dot_f32 */
    kernel_decay_dot_fn decay_dot;
    kernel_update_dot_fn update_dot;
    kernel_decay_dot4_fn decay_dot4;   /* NULL: none */
    kernel_update_dot4_fn update_dot4; /* NULL: none */
    kernel_gdn_rows_fn gdn_rows;       /* NULL: none */
    kernel_conv_taps_fn conv_taps;
    kernel_silu_mul_fn silu_mul;
    kernel_sigmoid_mul_fn sigmoid_mul;
    kernel_silu_fn silu;
    kernel_dot_fn dot[GGML_TYPE_COUNT];
    kernel_terms_fn terms[GGML_TYPE_COUNT]; /* NULL: kernel_block_terms loops over dot */
    quant_quantize_fn quantize[GGML_TYPE_COUNT]; /* activation encoders (Q8_0, Q8_1, Q8_K, F16, BF16) */
    const kernel_tile *tile[QUANT_TYPE_LIMIT]; /* sluice's Q6_K_R16 too */
} kernel_set;

/* Per-level registration, implemented in kernels_avx2.c / kernels_avx512.c (x86-64 only). */
void kernels_register_avx2(kernel_set *ks);
void kernels_register_avx2_krows(kernel_set *ks); /* kernels_avx2_krows.c: Q4_K, Q5_K, Q6_K rows in lanes */
void kernels_register_avx2_b32(kernel_set *ks);   /* kernels_avx2_b32.c: Q8_0 rows in lanes */
void kernels_register_avx2_attn(kernel_set *ks);  /* kernels_avx2_attn.c: kernel_attn_tokens */
void kernels_register_avx512(kernel_set *ks);
void kernels_register_avx512_q2_0(kernel_set *ks); /* kernels_avx512_q2_0.c */
void kernels_register_avx512_b32(kernel_set *ks);  /* kernels_avx512_b32.c */
void kernels_register_avx512_float(kernel_set *ks); /* kernels_avx512_float.c */
void kernels_register_avx512_krows(kernel_set *ks); /* kernels_avx512_krows.c: wraps the K-quant tiles */
void kernels_register_avx512_q6k_r16(kernel_set *ks); /* kernels_avx512_q6k_r16.c */
void kernels_register_avx512_gdn(kernel_set *ks);     /* kernels_avx512_gdn.c: kernel_gdn_rows */
/* kernels_avx512_amx.c: the AMX byte tiles over the level's VNNI byte tiles of Q4_K, Q5_K, Q6_K,
 * IQ2_XS, IQ3_XXS, IQ4_XS (in that order; same packed activations) */
void kernels_register_avx512_amx(kernel_set *ks, const kernel_tile *const vnni[6]);
/* true for the tiles kernels_register_avx512_amx registered (the few-token wrappers hand over to
 * them at fewer tokens than to the VNNI tiles) */
bool kernel_tile_is_amx(const kernel_tile *t);
/* set by the CPU detection, before the levels register: AMX-TILE and AMX-INT8 present and the tile
 * state granted (kernel_amx_usable() for everyone else) */
extern bool kernels_amx_granted;

const char *kernel_isa_name(kernel_isa isa);
/* The best level this CPU and OS support (at most SLUICE_ISA's, where that names a lower one:
 * the process then acts as on a CPU without the levels above). */
kernel_isa kernel_isa_best(void);
/* The highest level whose own kernels were registered: kernel_isa_best() (tests/unit/test_kernels.c
 * holds it to that; a level above the CPU's is never registered). */
kernel_isa kernel_isa_registered(void);
/* The level in use. */
kernel_isa kernel_isa_current(void);
/* Use a lower level (tests and benchmarks); clamped to kernel_isa_best(). Returns the level now
 * in use. Not to be called while other threads run kernels. */
kernel_isa kernel_isa_force(kernel_isa isa);

/* Dot product for weights of this type against activations in its act_type (NULL: no codec). */
kernel_dot_fn kernel_dot(uint32_t type);
/* Each block's float term of that dot product (the reference's per-block step of the block's
 * exact integer sums): terms[b] = dot over block b alone, up to the sign of a zero. A device's
 * own reduction order is then a matter of adding them (backends/cpu/device_rows.c). */
void kernel_block_terms(uint32_t type, int64_t n, const void *w, const void *a, float *terms);
/* The level's own terms kernel for a type, or NULL (then kernel_block_terms loops over dot). */
kernel_terms_fn kernel_terms_of(uint32_t type);
/* Encoder of an activation type (the reference when no faster one exists). */
quant_quantize_fn kernel_quantize(uint32_t act_type);
/* Tile kernels for a weight type, or NULL where the level has none (then loop over dots). */
const kernel_tile *kernel_tile_of(uint32_t type);
/* True when the level's tile for a type is its own, not the scalar reference's (a type whose
 * only tile is the reference is no faster through it than through its dots). */
bool kernel_tile_vectorized(uint32_t type);

/* Float dot product with a fixed summation order: 8 interleaved partial sums, combined
 * pairwise ((0+4)+(2+6))+((1+5)+(3+7)), then the tail in order. */
float kernel_dot_f32(int64_t n, const float *a, const float *b);

/* AMX (int8 tiles) usable: the CPU has it and the OS granted the tile state to this process. */
bool kernel_amx_usable(void);
/* Where the AMX tiles are registered (kernel_amx_usable() and SLUICE_AMX not 0), runs their AMX
 * walk (true, the default) or the VNNI byte tiles' walk on the same packed activations (false):
 * for tests and A/B measurements. Not thread-safe: call between products. */
void kernel_amx_set(bool on);

#endif
