/* CPU backend: backend memory (plain host memory), step inputs, KV-cache stores and the routed-
 * expert operations (router, gather/scatter of token rows, top-k combine). Registered in ops.c's
 * operation table; kept apart from the kernels so that the model code's host-side steps live
 * behind the backend interface without touching the hot CPU kernels. */
#ifndef SLUICE_OPS_MOE_H
#define SLUICE_OPS_MOE_H

#include "backends/backend.h"

/* Per-backend state of these operations (the step-input arrays); freed by cpu_ext_free. */
struct cpu_ext;
void cpu_ext_free(struct cpu_ext *x);

void *cpu_alloc(backend *b, size_t bytes);
void cpu_mfree(backend *b, void *p);
void cpu_upload(backend *b, void *dst, const void *src, size_t bytes);
void cpu_download(backend *b, void *dst, const void *src, size_t bytes);
void cpu_memzero(backend *b, void *dst, size_t bytes);
void cpu_copy_rows(backend *b, float *dst, size_t dst_stride, const float *src, size_t src_stride,
                   int n_rows, int width);
void cpu_kv_store(backend *b, float *kc, float *vc, const float *k, const float *v, int n,
                  const int32_t *pos, size_t row_k, size_t row_v);
/* ext: the backend's struct cpu_ext pointer (allocated on first use). */
void cpu_set_inputs(backend *b, struct cpu_ext **ext, const int32_t *tokens, int n, int pos0,
                    const int32_t **ids, const int32_t **pos);
void cpu_moe_route(backend *b, float *logits, int n, int n_expert, int k, bool norm, int32_t *ids,
                   float *w);
void cpu_gather_rows(backend *b, float *dst, const float *src, const int32_t *idx, int div, int m,
                     int width);
void cpu_scatter_rows(backend *b, float *dst, const int32_t *idx, const float *src, int m,
                      int width);
void cpu_moe_combine(backend *b, const float *slots, const float *w, int n, int k, int width,
                     float *out);

#endif
