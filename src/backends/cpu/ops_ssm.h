/* CPU operations of linear-attention (Gated DeltaNet) layers and their gates, and the pieces
 * of the CPU backend they share with ops.c. Registered in ops.c's operation table. */
#ifndef SLUICE_OPS_SSM_H
#define SLUICE_OPS_SSM_H

#include "backends/backend.h"

/* The backend's scratch buffer, at least bytes long (valid until the next call that uses it). */
void *cpu_backend_scratch(backend *b, size_t bytes);

void cpu_l2norm(backend *b, const float *x, int n_rows, int dim, float eps, float *y);
void cpu_conv1d_silu(backend *b, const float *x, int n, int channels, const float *w, int kernel,
                     float *state, float *y);
void cpu_gated_delta(backend *b, const float *q, const float *k, const float *v, const float *g,
                     const float *beta, float *state, const gdn_params *p, float *out);
/* backend.h gated_delta_ck */
void cpu_gated_delta_ck(backend *b, const float *q, const float *k, const float *v, const float *g,
                        const float *beta, float *state, const gdn_params *p, float *out, float *ck,
                        size_t ck_stride);
void cpu_sigmoid_mul(backend *b, float *x, const float *g, int n_rows, int dim, int g_dim);
void cpu_gdn_gates(backend *b, float *beta, float *alpha, const float *dt_bias, const float *a,
                   int n, int n_head);

/* Row-wise ops run on the pool from this many values (a decode step's rows stay on the caller);
 * every row is computed the same way either way. */
#define CPU_PAR_MIN_ELEMS 32768

/* Longest convolution kernel conv1d_silu accepts (the models use 4). */
#define CPU_CONV_MAX_KERNEL 16

#endif
