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

typedef enum kernel_isa {
    KERNEL_ISA_SCALAR = 0,
    KERNEL_ISA_AVX2 = 1,
    KERNEL_ISA_AVX512 = 2,
    KERNEL_ISA_COUNT
} kernel_isa;

/* out[t * out_stride + r] = dot(row r of w, activation row t) for r < rows, t < toks: a tile of
 * a matrix product. Rows are w_stride bytes apart, activation rows a_stride bytes apart. A
 * kernel may reuse decoded weights across the tokens of the tile; each output equals the
 * single-row dot bit for bit. */
typedef void (*kernel_tile_fn)(int64_t n, const void *w, size_t w_stride, int rows,
                               const void *a, size_t a_stride, int toks, float *out,
                               size_t out_stride);

/* The functions of one instruction-set level; NULL entries fall back to the level below. */
typedef struct kernel_set {
    kernel_dot_fn dot[GGML_TYPE_COUNT];
    quant_quantize_fn quantize[GGML_TYPE_COUNT]; /* activation encoders (Q8_0, Q8_1, Q8_K, F16, BF16) */
    kernel_tile_fn tile[GGML_TYPE_COUNT];
} kernel_set;

/* Per-level registration, implemented in kernels_avx2.c / kernels_avx512.c (x86-64 only). */
void kernels_register_avx2(kernel_set *ks);
void kernels_register_avx512(kernel_set *ks);

const char *kernel_isa_name(kernel_isa isa);
/* The best level this CPU and OS support. */
kernel_isa kernel_isa_best(void);
/* The level in use. */
kernel_isa kernel_isa_current(void);
/* Use a lower level (tests and benchmarks); clamped to kernel_isa_best(). Returns the level now
 * in use. Not to be called while other threads run kernels. SLUICE_ISA=scalar|avx2|avx512 in
 * the environment sets the starting level the same way. */
kernel_isa kernel_isa_force(kernel_isa isa);

/* Dot product for weights of this type against activations in its act_type (NULL: no codec). */
kernel_dot_fn kernel_dot(uint32_t type);
/* Encoder of an activation type (the reference when no faster one exists). */
quant_quantize_fn kernel_quantize(uint32_t act_type);
/* Tile kernel for a weight type, or NULL where the level has none (then loop over dots). */
kernel_tile_fn kernel_tile(uint32_t type);

/* Float dot product with a fixed summation order: 8 interleaved partial sums, combined
 * pairwise ((0+4)+(2+6))+((1+5)+(3+7)), then the tail in order. */
float kernel_dot_f32(int64_t n, const float *a, const float *b);

/* AMX (int8 tiles) usable: the CPU has it and the OS granted the tile state to this process. */
bool kernel_amx_usable(void);

#endif
