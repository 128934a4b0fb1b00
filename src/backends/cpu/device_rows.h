/* Products computed by the CPU in the CUDA backend's order, bit for bit.
 *
 * When a streamed GPU layer routes a token to experts that are not in VRAM, the host can compute
 * some of them from its own memory while the GPU computes the others and the bus copies more
 * (--gpu-miss host, backends/cuda/cuda_moe_host.cu). Evidence must not depend on who computed
 * what, so the host reproduces the GPU's one-token products exactly:
 *
 *   k_mv_q (cuda_matmul.cu), one output row by one warp: lane group g (B/32 lanes per block of B
 *   values, 32/(B/32) groups) adds the float terms of blocks g, g + groups, ... in order, each
 *   term the reference's per-block float step of the block's exact integer sums; then the 32
 *   lanes are folded by the butterfly (lane l += lane l ^ off for off = 16, 8, 4, 2, 1).
 *
 * A block's term is what the CPU's dot kernel returns for that one block (0 + term: the CPU
 * kernels do the reference's float step per block, and the GPU kernels keep that same split,
 * cuda_quant.cuh), so only the fold is new here. The gate of SwiGLU uses backends/silu_fixed.h,
 * as the GPU does; activations are the CPU's encoders (the GPU's encoders follow the same rule).
 * Float weights (F32/F16/BF16) take another device kernel and are not offered. */
#ifndef SLUICE_DEVICE_ROWS_H
#define SLUICE_DEVICE_ROWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/cpu/threadpool.h"

/* Whether rows of this weight type can be computed the device's way. */
bool device_rows_supported(uint32_t type);

/* One row of K values of a weight type against an activation row in the type's activation
 * encoding (CPU layout), folded as k_mv_q folds it. */
float device_row_dot(uint32_t type, int64_t K, const uint8_t *w, const uint8_t *a);

/* A routed expert's SwiGLU FFN for one input row: y = down(silu(gate x) * up x). */
typedef struct device_expert_job {
    const uint8_t *gate, *up, *down; /* the expert's three matrices (row-major, host memory) */
    const float *x;                  /* [E] */
    float *y;                        /* [E] */
} device_expert_job;

typedef struct device_expert_shape {
    uint32_t type_gate, type_up, type_down;
    int64_t E, F; /* gate/up: [E] -> [F], down: [F] -> [E] */
} device_expert_shape;

/* Whether the shape's three types are supported (and E, F whole blocks of them). */
bool device_experts_supported(const device_expert_shape *sh);
/* Scratch bytes device_experts_run needs for n jobs. */
size_t device_experts_work_bytes(const device_expert_shape *sh, int n);
/* n jobs on the pool's threads (the caller's thread takes part), each y the bits the CUDA
 * backend's decode-form moe_experts gives that slot. 0, or -1 for an unsupported shape. */
int device_experts_run(threadpool *pool, const device_expert_shape *sh, const device_expert_job *jobs, int n,
                       void *work, size_t work_bytes);

#endif
