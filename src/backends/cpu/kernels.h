/* CPU compute kernels: the fastest implementation of each codec's dot product that this
 * processor supports, chosen once at start-up. Every kernel returns bit-identical results to
 * the scalar reference in formats/quant_*.c (tests enforce it). */
#ifndef SLUICE_KERNELS_H
#define SLUICE_KERNELS_H

#include <stdint.h>

#include "formats/quant.h"

typedef quant_dot_fn kernel_dot_fn;

/* Dot product for weights of this type against activations in its act_type. */
kernel_dot_fn kernel_dot(uint32_t type);

/* Float dot product with a fixed summation order: 8 interleaved partial sums, combined
 * pairwise ((0+4)+(2+6))+((1+5)+(3+7)), then the tail in order. */
float kernel_dot_f32(int64_t n, const float *a, const float *b);

#endif
