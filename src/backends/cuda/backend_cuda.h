/* The CUDA backend (the .cu files of src/backends/cuda), as seen from C.
 *
 * Built only when CMake finds a CUDA toolkit (SLUICE_CUDA=AUTO/ON); SLUICE_HAVE_CUDA is then
 * defined for the library. One backend per model: it holds the weights in device memory (or
 * pins them in host memory for zero-copy reads), the expert table, and the work buffers; the
 * model's sessions share it and use it one at a time. */
#ifndef SLUICE_BACKEND_CUDA_H
#define SLUICE_BACKEND_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backends/backend.h"

typedef struct backend_cuda_params {
    int device;         /* CUDA device ordinal */
    uint64_t budget;    /* device bytes the backend may hold; 0: no limit but the device's */
    bool no_graph;      /* never capture graphs */
    bool profile;       /* time every op (eager, synchronous; for breakdowns) */
} backend_cuda_params;

/* What the device offers (free/total memory, name); false when no usable device. */
typedef struct cuda_device_info {
    bool present;
    char name[128];
    int cc_major, cc_minor, sm_count;
    uint64_t mem_free, mem_total;
    bool can_map_host;  /* kernels may read pinned host memory (zero-copy) */
    char error[160];
} cuda_device_info;

bool backend_cuda_probe(int device, cuda_device_info *out);

/* NULL with err on failure. */
backend *backend_cuda_new(const backend_cuda_params *p, char *err, size_t err_len);

/* Device bytes the backend holds now. */
uint64_t backend_cuda_allocated(const backend *b);

/* With profile: per-op time table (ms, calls) since the start. */
void backend_cuda_profile_report(const backend *b, FILE *out);

/* Unit-test hooks (tests/gpu): the device codecs against the CPU references. Decodes row r of
 * a weight matrix (type, K values per row) to floats with the device's dequantizer, and one
 * dot product of that row with x through the device's activation encoding and integer dot:
 * writes deq[K] and *dot. 0, or -1 when the type is unsupported. */
int backend_cuda_selftest_row(backend *b, uint32_t type, const void *row, int64_t K,
                              const float *x, float *deq, float *dot);

#endif
