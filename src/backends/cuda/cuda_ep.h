/* Expert parallelism on the CUDA backend (backends/cuda/cuda_ep.cu, docs/multi-gpu.md), as seen
 * from C. Built with the CUDA backend; the NCCL parts only when CMake found nccl.h
 * (SLUICE_HAVE_NCCL), and NCCL itself is opened at run time. */
#ifndef SLUICE_CUDA_EP_H
#define SLUICE_CUDA_EP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"

typedef struct backend_cuda_ep_params {
    int n_rank, rank;     /* this build: 1 and 0 */
    const int32_t *owner; /* [n_layer][n_expert] owning rank (runtime/ep_placement.h), host */
    bool verbose;         /* one line on stderr: ranks, NCCL version */
} backend_cuda_ep_params;

/* Route the backend's moe_experts through the expert-parallel path (NCCL dispatch and combine,
 * bit-identical to the plain op). Call after experts_init. 0, or -1 with one line in err
 * (no NCCL, several ranks, no experts). The backend is freed as usual (be_free). */
int backend_cuda_ep_enable(backend *b, const backend_cuda_ep_params *p, char *err, size_t err_len);
/* Ranks of an EP backend; 0 when the backend runs the plain path. */
int backend_cuda_ep_ranks(const backend *b);

/* Unit-test hook (tests/gpu/test_ep.c): the device dispatch plan of m slots with expert ids
 * ids[m] over R ranks, own[n_expert] the owners (all host arrays): fills owner[m], perm[m],
 * inv[m], counts[R] from the device kernel, to compare with ep_dispatch_plan. 0 or -1. */
int backend_cuda_ep_selftest_plan(backend *b, const int32_t *ids, int m, const int32_t *own,
                                  int n_expert, int R, int32_t *owner, int32_t *perm,
                                  int32_t *inv, int32_t *counts);

#endif
