/* CPU operations of qwen4exp: hyper-connections and the n-gram module (ops_hc.c), block-sparse
 * attention (ops_qsa.c). Registered in ops.c's operation table; see backend.h for each
 * operation's definition. */
#ifndef SLUICE_OPS_HC_H
#define SLUICE_OPS_HC_H

#include "backends/backend.h"

void cpu_rmsnorm_groups(backend *b, const float *x, const float *w, int n_tok, int groups,
                        int dim, float eps, float *y);
void cpu_scale_silu(backend *b, float *x, size_t n, float scale);
void cpu_hc_mix(backend *b, const float *xn, const float *gate, int n, int hc, int dim,
                float *out);
void cpu_hc_combine(backend *b, float *res, const float *out, const float *inject, int n, int hc,
                    int dim);
void cpu_ple_gate(backend *b, const float *key, const float *query, const float *value, int n,
                  int hc, int dim, float *gated);
void cpu_conv1d_dilated_silu(backend *b, const float *x, int n, int channels, const float *w,
                             int kernel, int dilation, float *state, float *y);
void cpu_qsa_pool(backend *b, const float *kraw, int b0, int nb, int ratio, int dim,
                  const float *k_norm, float eps, int n_rot, float freq_base, float *kblk);
void cpu_qsa_select(backend *b, const float *q, const float *kblk, int n, int pos0, int n_head,
                    int dim, int ratio, int top_k, int32_t *sel, int32_t *sel_n, int sel_stride);
void cpu_attention_sel(backend *b, const float *q, const float *kc, const float *vc, int n,
                       int pos0, int n_head, int n_head_kv, int hd, int hd_v, float scale,
                       const int32_t *sel, const int32_t *sel_n, int sel_stride, float *out);

#endif
