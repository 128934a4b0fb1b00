/* The backend interface: the operations a model's forward pass is written against.
 *
 * Activations live in BACKEND MEMORY: allocated with be_alloc, written from the host with
 * be_upload, read back with be_download (CPU: plain host memory, so these are memcpy; CUDA:
 * device memory). Model code never dereferences backend memory on the host. Weights are tviews:
 * a typed, possibly quantized matrix, usually a view into the mapped GGUF file; a device backend
 * translates such host addresses to its copy (be_weights_map).
 *
 * Determinism: every output element is produced by one thread in a fixed order, so results do
 * not depend on the number of threads (CPU) or on where weights reside (CUDA: VRAM, a VRAM
 * cache slot, or mapped host memory give the same bits).
 */
#ifndef SLUICE_BACKEND_H
#define SLUICE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "formats/store.h"

/* A weight matrix: ne[0] values per row (contiguous), ne[1] rows. 3-D tensors (stacked
 * experts) have ne[2] matrices of mat_bytes each. */
typedef struct tview {
    uint32_t type;     /* enum ggml_type */
    int64_t ne[4];
    size_t row_bytes;  /* bytes of one row of ne[0] values */
    size_t mat_bytes;  /* bytes of one ne[0] x ne[1] matrix */
    const void *data;  /* NULL when the tensor is absent */
    const char *name;
} tview;

/* The i-th matrix of a 3-D view as a 2-D view. */
tview tview_matrix(const tview *t, int64_t i);

typedef enum rope_mode { ROPE_NORM = 0, ROPE_NEOX = 2 } rope_mode;

typedef struct backend backend;

/* The gated delta rule (Gated DeltaNet), per value head h with state S_h [d_v][d_k] (key index
 * contiguous) and, per token t, q_t k_t (of key head kh(h)), v_t, log decay g_t, beta_t:
 *   S <- exp(g_t) S;  d = beta_t (v_t - S k_t);  S <- S + d k_t^T;  out_t = S (q_scale q_t)
 * kh(h) = h % n_k_head when kv_tiled (llama.cpp's qwen35/qwen35moe GGUFs), else
 * h / (n_v_head / n_k_head) (grouped, as qwen3next and Hugging Face).
 * Layouts: q, k [n][n_k_head][d_k]; v, out [n][n_v_head][d_v]; g, beta [n][n_v_head];
 * state [n_v_head][d_v][d_k], carried across calls.
 * chunk = 0: the per-token recurrence above (any split of a sequence into calls gives the same
 * bits). chunk > 0: the chunked (WY) form over chunks of that many tokens, counted from the
 * call's first token: the same function, different rounding (a prefill path for backends
 * where matrix products are cheap). */
typedef struct gdn_params {
    int n_tok, n_k_head, n_v_head, d_k, d_v;
    bool kv_tiled;
    float q_scale;
    int chunk;
} gdn_params;

/* gdn_gates' operands, for a backend that fuses them into another op (gdn_conv_split). */
typedef struct gdn_gate_args {
    float *beta, *alpha;
    const float *dt_bias, *a;
    int n_head;
} gdn_gate_args;

typedef struct backend_ops {
    const char *name;
    void (*free)(backend *b);
    /* out[t][:] = dequantize(row ids[t] of w) */
    void (*embed)(backend *b, const tview *w, const int32_t *ids, int n, float *out);
    /* out[t][r] = dot(row r of w, x[t]) for t < n, r < w->ne[1]; x rows have w->ne[0] values,
     * out rows have out_stride floats. Activations are encoded in the weight type's act_type. */
    void (*matmul)(backend *b, const tview *w, const float *x, int n, float *out, int out_stride);
    /* out[i] = w[i] . x for i < nw (out[i] rows of w[i]->ne[1] floats), each exactly as matmul
     * computes it; a backend may run them together. NULL: one matmul each. */
    void (*matmul_multi)(backend *b, int nw, const tview *const *w, const float *x, int n,
                         float *const *out);
    /* y = x / sqrt(mean(x^2) + eps) * w over rows of dim values (w: F32 view or NULL); y may be x */
    void (*rmsnorm)(backend *b, const float *x, const tview *w, int n_rows, int dim, float eps,
                    float *y);
    /* Optional fusion of add (x += a over n_rows x dim) and rmsnorm (y = the norm of the new x,
     * times w): every value exactly as the two ops give it. false: not done (shape or backend),
     * nothing changed; the caller runs both. */
    bool (*add_rmsnorm)(backend *b, float *x, const float *a, const tview *w, int n_rows, int dim,
                        float eps, float *y);
    /* Optional fusion of moe_tail (x += y + s * sigmoid(g)) and rmsnorm (out = the norm of the
     * new x times w): every value exactly as the two ops give it. false: not done (shape or
     * backend), nothing changed; the caller runs both. */
    bool (*moe_tail_rmsnorm)(backend *b, float *x, float *y, float *s, const float *g, int n_rows, int dim,
                             const tview *w, float eps, float *out);
    /* Optional fusion of rmsnorm (x = the norm of x times w, rows of dim) and swiglu (g =
     * silu(g) * x over the same n_rows x dim values): every value exactly as the two ops give
     * it. false: not done (shape or backend), nothing changed; the caller runs both. */
    bool (*rmsnorm_swiglu)(backend *b, float *x, const tview *w, int n_rows, int dim, float eps,
                           float *g);
    /* Rotate the first n_rot dims of each head of x [n_tok][n_head][head_dim] in place. */
    void (*rope)(backend *b, float *x, int n_tok, int n_head, int head_dim, int n_rot,
                 const int32_t *pos, float freq_base, rope_mode mode);
    /* Causal GQA attention over a KV cache. q [n][n_head][hd]; cache rows k/v
     * [n_ctx][n_head_kv][hd] for this layer; token t sees cache positions 0..pos0+t.
     * out [n][n_head][hd_v]. */
    void (*attention)(backend *b, const float *q, const float *kc, const float *vc, int n,
                      int pos0, int n_head, int n_head_kv, int hd, int hd_v, float scale,
                      float *out);
    /* Optional fusion of attention (as above) with the output gate of gated attention:
     * out[t][h][d] *= sigmoid(gate[(t n_head + h) gate_stride + d]) for d < hd_v, each value
     * rounded as attention then sigmoid_mul round it. false: not done (shape or backend),
     * nothing changed; the caller runs the ops. */
    bool (*attention_gated)(backend *b, const float *q, const float *kc, const float *vc, int n,
                            int pos0, int n_head, int n_head_kv, int hd, int hd_v, float scale,
                            const float *gate, size_t gate_stride, float *out);
    /* Optional (NULL: not offered; device backends): out_host[0] = sluice_argmax(x, n) for x
     * in backend memory, written into page-locked host memory (host_alloc) as a download
     * (within a captured graph, part of it): the greedy pick without the host reading the row. */
    void (*argmax_row)(backend *b, const float *x, int n, int32_t *out_host);
    /* x[i] += y[i] */
    void (*add)(backend *b, float *x, const float *y, size_t n);
    /* g[i] = silu(g[i]) * u[i], silu(v) = v / (1 + exp(-v)) */
    void (*swiglu)(backend *b, float *g, const float *u, size_t n);
    /* out[t][r] = silu(gate_r . x_t) * (up_r . x_t), out rows of gate->ne[1] floats: matmul,
     * matmul and swiglu fused (one pass over x, same bits as the three ops) */
    void (*matmul_swiglu)(backend *b, const tview *gate, const tview *up, const float *x, int n,
                          float *out);
    /* Optional (NULL: not offered): ne SwiGLU experts of ONE token x: out[i] = down_i (silu(
     * gate_i x) * (up_i x)), every value as matmul_swiglu and matmul give it, in two dispatches
     * for all of them instead of two each. false: declined (types, shapes), nothing done. */
    bool (*experts_one)(backend *b, int ne, const tview *const *gate, const tview *const *up,
                        const tview *const *down, const float *x, float *const *out);
    /* Optional (NULL: not offered): the routed SwiGLU experts of a batch of tokens x (rows of
     * width values). Expert i takes the entries entries[offset[i] .. offset[i + 1]) (each a
     * token * k + slot, in token order) and writes down_i (silu(gate_i x_t) * (up_i x_t)) of
     * token t = entry / k to slots + entry * width, every value as the per-expert matmul_swiglu
     * and matmul give it. false: declined (shapes), nothing done. */
    bool (*experts_batch)(backend *b, int ne, const tview *const *gate, const tview *const *up,
                          const tview *const *down, const float *x, int width, int k, const int32_t *entries,
                          const int *offset, float *slots);

    /* ---- linear attention (Gated DeltaNet) and gates; CPU: backends/cpu/ops_ssm.c ---- */
    /* y = x / max(||x||_2, eps) over rows of dim values (ggml_l2_norm); y may be x */
    void (*l2norm)(backend *b, const float *x, int n_rows, int dim, float eps, float *y);
    /* Causal depthwise convolution over time, then SiLU, with a rolling state. With
     * xp = [state (kernel-1 rows); x (n rows)], rows of `channels` floats:
     *   y[t][c] = silu(sum_{j < kernel} w[c][j] * xp[t + j][c])
     * and afterwards state = the last kernel-1 rows of xp (raw inputs, not convolved).
     * w is [channels][kernel]. Each output depends only on its own window, so any split of a
     * sequence into calls gives the same bits. */
    void (*conv1d_silu)(backend *b, const float *x, int n, int channels, const float *w,
                        int kernel, float *state, float *y);
    /* Optional fusion of conv1d_silu over [q | k | v] rows (2 kd + vd channels) with the split
     * and the per-head L2 norm of q and k (heads of dk): q, k rows of kd, v rows of vd, each
     * value exactly as conv1d_silu, copy_rows and l2norm give it; with gates (may be NULL) also
     * gdn_gates on them (independent of the convolution: one launch of a decode step fewer).
     * 0: not done (shape or backend), nothing changed, the caller runs those ops; 1: done
     * without the gates (the caller runs gdn_gates); 2: done, gates included. */
    int (*gdn_conv_split)(backend *b, const float *x, int n, int kd, int vd, int dk,
                          const float *w, int kernel, float *state, float eps, float *q,
                          float *k, float *v, const gdn_gate_args *gates);
    /* Optional fusion of the attention input's per-head steps: RMSNorm of the q rows (n x
     * n_head) and k rows (n x n_head_kv) of head_dim by q_norm / k_norm, RoPE of both at the
     * step's positions, and kv_store of k and v (rows of row_k = n_head_kv * head_dim, row_v);
     * q and k are rewritten in place; every value exactly as rmsnorm, rope and kv_store give
     * it. false: not done (shape or backend), the caller runs those ops. */
    bool (*qk_norm_rope_store)(backend *b, float *q, float *k, const float *v, int n, int n_head,
                               int n_head_kv, int head_dim, const tview *q_norm, const tview *k_norm,
                               float eps, int n_rot, const int32_t *pos, float freq_base,
                               rope_mode mode, float *kc, float *vc, size_t row_k, size_t row_v);
    /* Gated delta rule over n tokens (see gdn_params). */
    void (*gated_delta)(backend *b, const float *q, const float *k, const float *v,
                        const float *g, const float *beta, float *state, const gdn_params *p,
                        float *out);
    /* Optional (NULL: the caller runs gated_delta a token at a time and copies the state): the
     * recurrence (p->chunk 0) over p->n_tok tokens that also leaves the state after every token t
     * but the last at ck + t * ck_stride (floats, the state's layout): a verification pass's
     * checkpoints (models/qwen4exp_mtp.c) in one pass over the state instead of one a token plus
     * a copy. The same bits as gated_delta of one token at a time. */
    void (*gated_delta_ck)(backend *b, const float *q, const float *k, const float *v,
                           const float *g, const float *beta, float *state, const gdn_params *p,
                           float *out, float *ck, size_t ck_stride);
    /* x[r][i] *= sigmoid(g[r][g_dim == 1 ? 0 : i]) for r < n_rows, i < dim; g_dim is 1 or dim */
    void (*sigmoid_mul)(backend *b, float *x, const float *g, int n_rows, int dim, int g_dim);
    /* Optional fusion of a MoE layer's end, rows of dim: with s != NULL, s[r][i] *= sigmoid(
     * g[r]) and y[r][i] += s[r][i]; then x[r][i] += y[r][i] (sigmoid_mul, add, add, the same
     * bits). NULL: those ops one by one. */
    void (*moe_tail)(backend *b, float *x, float *y, float *s, const float *g, int n_rows,
                     int dim);
    /* Gated DeltaNet gates, per token t < n and value head h < n_head, in place:
     *   beta[t][h] = sigmoid(beta[t][h])
     *   alpha[t][h] = softplus(alpha[t][h] + dt_bias[h]) * a[h]   (log decay; a < 0 as stored) */
    void (*gdn_gates)(backend *b, float *beta, float *alpha, const float *dt_bias, const float *a,
                      int n, int n_head);

    /* ---- hyper-connections, n-gram module, block-sparse attention (qwen4exp);
     * CPU: backends/cpu/ops_hc.c, ops_qsa.c. NULL where a backend lacks them (the model refuses
     * to load there). Rows of a wide residual are [n][groups][dim], stream-major. ---- */
    /* y[t][g][i] = x[t][g][i] / sqrt(mean_i(x[t][g]^2) + eps) * w[g * dim + i] (w: groups*dim
     * floats: a weight, like a tview's data); y may be x */
    void (*rmsnorm_groups)(backend *b, const float *x, const float *w, int n_tok, int groups,
                           int dim, float eps, float *y);
    /* x[i] = silu(x[i] * scale) */
    void (*scale_silu)(backend *b, float *x, size_t n, float scale);
    /* Hyper-connection read: out[t][i] = (sum over s in order of xn[t][s][i] *
     * sigmoid(gate[t][s][i])) * (1 / hc); xn and gate [n][hc][dim], out [n][dim]. */
    void (*hc_mix)(backend *b, const float *xn, const float *gate, int n, int hc, int dim,
                   float *out);
    /* Hyper-connection write: res[t][s][i] += out[t][i] * (2 * sigmoid(inject[t][s] / hc));
     * res [n][hc][dim], out [n][dim], inject [n][hc]. */
    void (*hc_combine)(backend *b, float *res, const float *out, const float *inject, int n,
                       int hc, int dim);
    /* N-gram gate: per token and stream s = fl(sum_i key[t][s][i] * query[t][s][i]) / sqrt(dim)
     * (the sum in double), g = sigmoid(sign(s) sqrt(max(|s|, 1e-6))), gated[t][s][i] =
     * value[t][i] * g. key, query, gated [n][hc][dim]; value [n][dim]. */
    void (*ple_gate)(backend *b, const float *key, const float *query, const float *value, int n,
                     int hc, int dim, float *gated);
    /* Dilated causal depthwise convolution, then SiLU, with a rolling state: with xp =
     * [state ((kernel-1)*dilation rows); x (n rows)] of `channels` floats,
     *   y[t][c] = silu(sum over j < kernel in order of w[c][j] * xp[t + j * dilation][c])
     * and afterwards state = the last (kernel-1)*dilation rows of xp. */
    void (*conv1d_dilated_silu)(backend *b, const float *x, int n, int channels, const float *w,
                                int kernel, int dilation, float *state, float *y);
    /* QSA block keys: for blocks b0..b0+nb-1, kblk[b] = rope(rmsnorm(mean of the ratio raw keys
     * kraw[b*ratio ..]) * k_norm) at position b*ratio (NeoX on the first n_rot dims); the mean
     * sums the keys in order, then scales by 1/ratio. kraw, kblk rows of dim floats. */
    void (*qsa_pool)(backend *b, const float *kraw, int b0, int nb, int ratio, int dim,
                     const float *k_norm, float eps, int n_rot, float freq_base, float *kblk);
    /* QSA selection for n tokens at positions pos0..: block score = sum over heads in order of
     * relu(q[t][h] . kblk[b]) over the complete blocks b < (p+1)/ratio; the incomplete tail is
     * always kept; cells are chosen as llama.cpp's top-k over cells does (width
     * top_k + ratio - 1, its partial_sort tie order). sel[t] receives the chosen positions
     * ascending and sel_n[t] their count, or -1 when p+1 <= width (dense attention). */
    void (*qsa_select)(backend *b, const float *q, const float *kblk, int n, int pos0, int n_head,
                       int dim, int ratio, int top_k, int32_t *sel, int32_t *sel_n,
                       int sel_stride);
    /* attention (as above) where token t attends only to the sel_n[t] cache positions in
     * sel[t] (ascending), or causally to all when sel_n[t] < 0 */
    void (*attention_sel)(backend *b, const float *q, const float *kc, const float *vc, int n,
                          int pos0, int n_head, int n_head_kv, int hd, int hd_v, float scale,
                          const int32_t *sel, const int32_t *sel_n, int sel_stride, float *out);

    /* ---- backend memory (CPU: backends/cpu/ops_moe.c) ---- */
    /* zeroed, aligned; NULL when out of memory */
    void *(*alloc)(backend *b, size_t bytes);
    void (*mfree)(backend *b, void *p);
    void (*upload)(backend *b, void *dst, const void *src, size_t bytes);   /* host -> backend */
    /* backend -> host; when it returns, dst holds the bytes (a device backend waits) */
    void (*download)(backend *b, void *dst, const void *src, size_t bytes);
    /* Optional (NULL: calloc / free): zeroed host memory that download can fill directly (a
     * device backend: page-locked, so a download, even one inside a CUDA graph, lands there by
     * DMA instead of through a staging buffer and a host copy). NULL when out of memory. */
    void *(*host_alloc)(backend *b, size_t bytes);
    void (*host_free)(backend *b, void *p);
    void (*memzero)(backend *b, void *dst, size_t bytes);
    /* n_rows rows of width floats: dst[r * dst_stride + i] = src[r * src_stride + i] */
    void (*copy_rows)(backend *b, float *dst, size_t dst_stride, const float *src,
                      size_t src_stride, int n_rows, int width);
    /* KV cache store: row t of k [n][row_k] (v [n][row_v]) goes to cache row pos[t] of kc (vc).
     * pos is backend memory (the positions the step was given, see set_inputs). */
    void (*kv_store)(backend *b, float *kc, float *vc, const float *k, const float *v, int n,
                     const int32_t *pos, size_t row_k, size_t row_v);
    /* The inputs of a forward pass: tokens (host) and positions pos0..pos0+n-1, copied into
     * backend memory the backend owns; *ids and *pos receive those arrays. The same addresses
     * on every call (a captured CUDA graph reads them; CUDA's attention reads the step's
     * positions to know how many cache rows each token sees). */
    void (*set_inputs)(backend *b, const int32_t *tokens, int n, int pos0, const int32_t **ids,
                       const int32_t **pos);

    /* ---- routed experts (CPU: backends/cpu/ops_moe.c) ---- */
    /* Router of n tokens: logits [n][n_expert] become probabilities (softmax, sum in double);
     * ids [n][k] the k most probable experts (descending; ties: the lower id first) and w [n][k]
     * their probabilities, renormalized over the k when norm (the sum clamped from below at
     * 6.103515625e-5, as ggml). All backend memory. */
    void (*moe_route)(backend *b, float *logits, int n, int n_expert, int k, bool norm,
                      int32_t *ids, float *w);
    /* dst row r = src row (idx[r] / div), m rows of width floats (idx: backend memory) */
    void (*gather_rows)(backend *b, float *dst, const float *src, const int32_t *idx, int div,
                        int m, int width);
    /* dst row idx[r] = src row r */
    void (*scatter_rows)(backend *b, float *dst, const int32_t *idx, const float *src, int m,
                         int width);
    /* out[t] = sum over s < k of slots[t][s] * w[t][s] in slot order: slots [n][k][width] */
    void (*moe_combine)(backend *b, const float *slots, const float *w, int n, int k, int width,
                        float *out);

    /* ---- device backends only (NULL on the CPU) ---- */
    /* Make host weights reachable: upload copies [host, host + bytes) to device memory; else
     * the range is pinned and read in place over the bus (zero-copy). Views whose data lies in
     * a mapped range are translated (uploaded ranges before pinned ones; ranges of one kind
     * must not overlap). 0 or -1. */
    int (*weights_map)(backend *b, const void *host, size_t bytes, bool upload);
    /* The expert table: per layer the shapes of the three parts (type 0 with ne0 0: absent),
     * entries [layer][expert] set to the parts' addresses (host addresses in a mapped range
     * are translated; backend memory is taken as is). */
    int (*experts_init)(backend *b, const expert_layout *layout);
    void (*experts_set)(backend *b, int layer, int expert, const void *gate, const void *up,
                        const void *down);
    /* Routed experts of layer il through the table: out[t] = sum_s w[t][s] *
     * down_e(silu(gate_e x_t) * up_e x_t), e = ids[t][s], summed in slot order. */
    int (*moe_experts)(backend *b, int il, const float *x, int n, const int32_t *ids,
                       const float *w, int k, float *out);
    /* Optional (NULL: nothing): a hint that moe_experts of layer il will soon read the experts
     * ids [n][k] (backend memory, written by moe_route) through the table; a device backend
     * may start bringing their weights nearer (its L2). Changes no value. */
    void (*moe_prefetch)(backend *b, int il, const int32_t *ids, int n, int k);
    /* Optional (NULL: not offered): moe_experts and a shared expert together, for the batches
     * and shapes the backend chooses; returns 1 to decline (the caller then runs the shared
     * expert as be_matmul_swiglu + be_matmul and calls moe_experts), 0 done, -1 failed.
     * shared [n][E] gets down_s(silu(gate_s x_t) * up_s x_t) with the bits of that pair of
     * calls, out what moe_experts gives. Lets a device run the shared expert beside the routed
     * ones instead of ahead of them. */
    int (*moe_experts_shared)(backend *b, int il, const float *x, int n, const int32_t *ids, const float *w,
                              int k, const tview *gate_s, const tview *up_s, const tview *down_s, float *out,
                              float *shared);
    /* Optional (NULL: not offered): moe_experts for a decode-sized batch (n <= 8) whose input
     * and routing the host holds too (x_host [n][E], ids_host [n][k]; a layer-by-layer streamed
     * cache downloads them anyway). Slots whose experts the table points at in host memory are
     * computed by the host's cores, in the device's order and so with its bits
     * (backends/cpu/device_rows.h), while the device computes the others. The same result as
     * moe_experts, whoever computes what. 0 or -1. */
    int (*moe_experts_host)(backend *b, int il, const float *x, const float *x_host, int n, const int32_t *ids,
                            const int32_t *ids_host, const float *w, int k, float *out);
    /* Host -> backend copy (expert cache fills). The copies of a batch (those up to the next
     * copy_end) start after the work queued before the batch's first copy, and may overlap
     * work queued after it. copy_end closes the batch; with mark it remembers every copy queued
     * so far, and copy_wait makes every later operation wait for the copies of the last mark.
     * NULL copy_end / copy_wait: copies are ordered with everything else. Nothing else waits
     * for copies (a graph replay neither): whoever points a table entry at a copy's
     * destination calls copy_wait before the kernels that read it. */
    void (*copy_async)(backend *b, void *dst, const void *src, size_t bytes);
    void (*copy_end)(backend *b, bool mark);
    void (*copy_wait)(backend *b);
    /* Optional (NULL: copies keep the rule above). copy_fence(b, true): the next batch's copies
     * may start once the work queued so far is done, even when more work is queued before the
     * batch's first copy; the caller promises that this later work reads none of the batch's
     * destinations. copy_fence(b, false) drops a fence no batch used. */
    void (*copy_fence)(backend *b, bool on);
    /* Wait for all queued work. */
    void (*sync)(backend *b);
    /* CUDA graphs of decode steps: graph_replay launches the graph captured under key for these
     * inputs (true) or returns false (none: capture one); capture_begin / capture_end bracket
     * one forward pass whose ops are recorded and then launched. */
    bool (*graph_replay)(backend *b, uint64_t key, const int32_t *tokens, int n, int pos0);
    void (*capture_begin)(backend *b, uint64_t key);
    /* 0; 1: the pass was only recorded and could not be captured (run it again); -1 */
    int (*capture_end)(backend *b, bool ok);
    /* Forget the graph of key (its buffers are about to be freed). */
    void (*graph_drop)(backend *b, uint64_t key);
} backend_ops;

struct backend {
    const backend_ops *ops;
    int n_threads;
    bool host_memory; /* backend memory is host memory (CPU) */
};

backend *backend_cpu_new(int n_threads);
/* Whether the CPU backend has a vectorized tile for weights of this type at the instruction-set
 * level in use, not only the scalar reference tile (load-time copies in a layout only a tile
 * reads, such as Q6_K_R16, are made only where one does). */
bool backend_cpu_tile_vectorized(uint32_t type);

/* Run fn(ctx, ith, nth) on the backend's threads (ith = 0..nth-1) and wait. CPU backend only;
 * used by model code for work that is not one of the ops (MoE expert groups). */
typedef void (*backend_task_fn)(void *ctx, int ith, int nth);
void backend_cpu_parallel(backend *b, backend_task_fn fn, void *ctx);

static inline void be_embed(backend *b, const tview *w, const int32_t *ids, int n, float *out) {
    b->ops->embed(b, w, ids, n, out);
}
static inline void be_matmul(backend *b, const tview *w, const float *x, int n, float *out) {
    b->ops->matmul(b, w, x, n, out, (int)w->ne[1]);
}
/* Several products of one input (see matmul_multi). */
static inline void be_matmul_multi(backend *b, int nw, const tview *const *w, const float *x,
                                   int n, float *const *out) {
    if (b->ops->matmul_multi) {
        b->ops->matmul_multi(b, nw, w, x, n, out);
        return;
    }
    for (int i = 0; i < nw; i++) b->ops->matmul(b, w[i], x, n, out[i], (int)w[i]->ne[1]);
}
static inline void be_rmsnorm(backend *b, const float *x, const tview *w, int n_rows, int dim,
                              float eps, float *y) {
    b->ops->rmsnorm(b, x, w, n_rows, dim, eps, y);
}
static inline void be_rope(backend *b, float *x, int n_tok, int n_head, int head_dim, int n_rot,
                           const int32_t *pos, float base, rope_mode mode) {
    b->ops->rope(b, x, n_tok, n_head, head_dim, n_rot, pos, base, mode);
}
static inline void be_attention(backend *b, const float *q, const float *kc, const float *vc,
                                int n, int pos0, int n_head, int n_head_kv, int hd, int hd_v,
                                float scale, float *out) {
    b->ops->attention(b, q, kc, vc, n, pos0, n_head, n_head_kv, hd, hd_v, scale, out);
}
static inline void be_add(backend *b, float *x, const float *y, size_t n) {
    b->ops->add(b, x, y, n);
}
static inline void be_swiglu(backend *b, float *g, const float *u, size_t n) {
    b->ops->swiglu(b, g, u, n);
}
static inline void be_matmul_swiglu(backend *b, const tview *gate, const tview *up,
                                    const float *x, int n, float *out) {
    b->ops->matmul_swiglu(b, gate, up, x, n, out);
}
static inline void be_l2norm(backend *b, const float *x, int n_rows, int dim, float eps,
                              float *y) {
    b->ops->l2norm(b, x, n_rows, dim, eps, y);
}
static inline void be_conv1d_silu(backend *b, const float *x, int n, int channels,
                                  const float *w, int kernel, float *state, float *y) {
    b->ops->conv1d_silu(b, x, n, channels, w, kernel, state, y);
}
static inline void be_gated_delta(backend *b, const float *q, const float *k, const float *v,
                                  const float *g, const float *beta, float *state,
                                  const gdn_params *p, float *out) {
    b->ops->gated_delta(b, q, k, v, g, beta, state, p, out);
}
static inline void be_sigmoid_mul(backend *b, float *x, const float *g, int n_rows, int dim,
                                  int g_dim) {
    b->ops->sigmoid_mul(b, x, g, n_rows, dim, g_dim);
}
/* x += y + s * sigmoid(g) (s, g optional), as the separate ops round it (see moe_tail). */
static inline void be_moe_tail(backend *b, float *x, float *y, float *s, const float *g,
                               int n_rows, int dim) {
    if (b->ops->moe_tail) {
        b->ops->moe_tail(b, x, y, s, g, n_rows, dim);
        return;
    }
    if (s) {
        b->ops->sigmoid_mul(b, s, g, n_rows, dim, 1);
        b->ops->add(b, y, s, (size_t)n_rows * dim);
    }
    b->ops->add(b, x, y, (size_t)n_rows * dim);
}
static inline void be_gdn_gates(backend *b, float *beta, float *alpha, const float *dt_bias,
                                const float *a, int n, int n_head) {
    b->ops->gdn_gates(b, beta, alpha, dt_bias, a, n, n_head);
}
static inline void be_rmsnorm_groups(backend *b, const float *x, const float *w, int n_tok,
                                     int groups, int dim, float eps, float *y) {
    b->ops->rmsnorm_groups(b, x, w, n_tok, groups, dim, eps, y);
}
static inline void be_scale_silu(backend *b, float *x, size_t n, float scale) {
    b->ops->scale_silu(b, x, n, scale);
}
static inline void be_hc_mix(backend *b, const float *xn, const float *gate, int n, int hc,
                             int dim, float *out) {
    b->ops->hc_mix(b, xn, gate, n, hc, dim, out);
}
static inline void be_hc_combine(backend *b, float *res, const float *out, const float *inject,
                                 int n, int hc, int dim) {
    b->ops->hc_combine(b, res, out, inject, n, hc, dim);
}
/* True when the backend has every qwen4exp operation. */
static inline bool be_has_hc_ops(const backend *b) {
    const backend_ops *o = b->ops;
    return o->rmsnorm_groups && o->scale_silu && o->hc_mix && o->hc_combine && o->ple_gate &&
           o->conv1d_dilated_silu && o->qsa_pool && o->qsa_select && o->attention_sel;
}
static inline void be_free(backend *b) {
    if (b) b->ops->free(b);
}
static inline void *be_alloc(backend *b, size_t bytes) { return b->ops->alloc(b, bytes); }
static inline void be_mfree(backend *b, void *p) {
    if (p) b->ops->mfree(b, p);
}
static inline void *be_host_alloc(backend *b, size_t bytes) {
    return b->ops->host_alloc ? b->ops->host_alloc(b, bytes) : calloc(1, bytes);
}
static inline void be_host_free(backend *b, void *p) {
    if (!p) return;
    if (b->ops->host_free) b->ops->host_free(b, p);
    else free(p);
}
static inline void be_upload(backend *b, void *dst, const void *src, size_t bytes) {
    b->ops->upload(b, dst, src, bytes);
}
static inline void be_download(backend *b, void *dst, const void *src, size_t bytes) {
    b->ops->download(b, dst, src, bytes);
}
static inline void be_memzero(backend *b, void *dst, size_t bytes) {
    b->ops->memzero(b, dst, bytes);
}
static inline void be_copy_fence(backend *b, bool on) {
    if (b->ops->copy_fence) b->ops->copy_fence(b, on);
}
static inline void be_copy_rows(backend *b, float *dst, size_t dst_stride, const float *src,
                                size_t src_stride, int n_rows, int width) {
    b->ops->copy_rows(b, dst, dst_stride, src, src_stride, n_rows, width);
}
static inline void be_kv_store(backend *b, float *kc, float *vc, const float *k, const float *v,
                               int n, const int32_t *pos, size_t row_k, size_t row_v) {
    b->ops->kv_store(b, kc, vc, k, v, n, pos, row_k, row_v);
}
/* An attention layer's input steps: q/k RMSNorm (each weight optional: no data, no norm), RoPE
 * of both at pos, and the KV store of k and v; the backend's fused op when it takes them, else
 * the five ops (see qk_norm_rope_store). */
static inline void be_qk_norm_rope_store(backend *b, float *q, float *k, const float *v, int n, int n_head,
                                         int n_head_kv, int head_dim, const tview *q_norm,
                                         const tview *k_norm, float eps, int n_rot, const int32_t *pos,
                                         float freq_base, rope_mode mode, float *kc, float *vc,
                                         size_t row_k, size_t row_v) {
    if (q_norm->data && k_norm->data && b->ops->qk_norm_rope_store &&
        b->ops->qk_norm_rope_store(b, q, k, v, n, n_head, n_head_kv, head_dim, q_norm, k_norm, eps, n_rot,
                                   pos, freq_base, mode, kc, vc, row_k, row_v))
        return;
    if (q_norm->data) b->ops->rmsnorm(b, q, q_norm, n * n_head, head_dim, eps, q);
    if (k_norm->data) b->ops->rmsnorm(b, k, k_norm, n * n_head_kv, head_dim, eps, k);
    b->ops->rope(b, q, n, n_head, head_dim, n_rot, pos, freq_base, mode);
    b->ops->rope(b, k, n, n_head_kv, head_dim, n_rot, pos, freq_base, mode);
    b->ops->kv_store(b, kc, vc, k, v, n, pos, row_k, row_v);
}
/* x = rmsnorm(x) * w, then g = silu(g) * x: the backend's fused op when it takes the shape,
 * else both ops (see rmsnorm_swiglu). */
static inline void be_rmsnorm_swiglu(backend *b, float *x, const tview *w, int n_rows, int dim,
                                     float eps, float *g) {
    if (b->ops->rmsnorm_swiglu && b->ops->rmsnorm_swiglu(b, x, w, n_rows, dim, eps, g)) return;
    b->ops->rmsnorm(b, x, w, n_rows, dim, eps, x);
    b->ops->swiglu(b, g, x, (size_t)n_rows * dim);
}
/* moe_tail, then y = rmsnorm(x) * w (the next layer's input norm): the backend's fused op when
 * it takes the shape, else both (see moe_tail_rmsnorm). */
static inline void be_moe_tail_rmsnorm(backend *b, float *x, float *yv, float *s, const float *g, int n_rows,
                                       int dim, const tview *w, float eps, float *y) {
    if (b->ops->moe_tail_rmsnorm && b->ops->moe_tail_rmsnorm(b, x, yv, s, g, n_rows, dim, w, eps, y)) return;
    be_moe_tail(b, x, yv, s, g, n_rows, dim);
    b->ops->rmsnorm(b, x, w, n_rows, dim, eps, y);
}
/* x += a, then y = rmsnorm(x) * w: the backend's fused op when it takes the shape, else both
 * ops (see add_rmsnorm). */
static inline void be_add_rmsnorm(backend *b, float *x, const float *a, const tview *w, int n_rows,
                                  int dim, float eps, float *y) {
    if (b->ops->add_rmsnorm && b->ops->add_rmsnorm(b, x, a, w, n_rows, dim, eps, y)) return;
    b->ops->add(b, x, a, (size_t)n_rows * dim);
    b->ops->rmsnorm(b, x, w, n_rows, dim, eps, y);
}
static inline void be_set_inputs(backend *b, const int32_t *tokens, int n, int pos0,
                                 const int32_t **ids, const int32_t **pos) {
    b->ops->set_inputs(b, tokens, n, pos0, ids, pos);
}
static inline void be_moe_route(backend *b, float *logits, int n, int n_expert, int k, bool norm,
                                int32_t *ids, float *w) {
    b->ops->moe_route(b, logits, n, n_expert, k, norm, ids, w);
}
static inline void be_moe_prefetch(backend *b, int il, const int32_t *ids, int n, int k) {
    if (b->ops->moe_prefetch) b->ops->moe_prefetch(b, il, ids, n, k);
}
static inline void be_gather_rows(backend *b, float *dst, const float *src, const int32_t *idx,
                                  int div, int m, int width) {
    b->ops->gather_rows(b, dst, src, idx, div, m, width);
}
static inline void be_scatter_rows(backend *b, float *dst, const int32_t *idx, const float *src,
                                   int m, int width) {
    b->ops->scatter_rows(b, dst, idx, src, m, width);
}
static inline void be_moe_combine(backend *b, const float *slots, const float *w, int n, int k,
                                  int width, float *out) {
    b->ops->moe_combine(b, slots, w, n, k, width, out);
}
/* True when routed experts go through the backend's expert table (moe_experts). */
static inline bool be_has_expert_table(const backend *b) { return b->ops->moe_experts != NULL; }
static inline void be_sync(backend *b) {
    if (b->ops->sync) b->ops->sync(b);
}

#endif /* SLUICE_BACKEND_H */
