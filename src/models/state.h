/* Per-session memory of a model: the KV cache and the activation buffers of one forward pass
 * over at most n_batch tokens. Sized once when the session is created, in the backend's memory
 * (state_alloc): host memory on the CPU backend, device memory on CUDA. Host-side bookkeeping
 * (the MoE scratch) is plain host memory. */
#ifndef SLUICE_STATE_H
#define SLUICE_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "models/model.h"

struct model_state {
    backend *be;                 /* owns the buffers below */
    int n_ctx, n_batch;
    /* KV cache: per layer [n_ctx][n_head_kv * head_dim] floats, K after norm and RoPE */
    float *kv_k, *kv_v;
    size_t kv_row_k, kv_row_v;   /* floats per position */
    /* activations, [n_batch][...] */
    float *x;                    /* residual stream [n_embd] */
    float *cur, *tmp;            /* [n_embd] */
    float *q, *k, *v, *attn;     /* attention projections and output */
    float *ff_a, *ff_b;          /* FFN hidden [max(n_ff, n_ff_exp)] */
    const int32_t *pos;          /* positions of the batch (set_inputs: backend-owned) */
    int pos0;                    /* the batch's first position (host copy) */
    /* MoE */
    float *router;               /* [n_expert] logits, then probabilities */
    int32_t *moe_ids;            /* [n_layer][n_batch][n_expert_used] chosen experts: each
                                  * layer routes into its own slice (read back after a step) */
    float *moe_w;                /* [n_layer][n_batch][n_expert_used] their weights */
    float *moe_slots;            /* [n_expert_used][n_embd] each expert's output */
    float *moe_x, *moe_y;        /* tokens gathered for one expert [n_embd] */
    int32_t *moe_rows;           /* (token, slot) pairs routed to one expert */
    float *logits;               /* [STATE_LOGIT_ROWS][n_vocab] output rows before download
                                  * (device backends; NULL when backend memory is host memory) */
    int32_t *argmax_host;        /* where a device backend's argmax_row leaves the greedy pick
                                  * of a one-row output (the session's; NULL: not wanted) */
    /* shared expert (allocated by the hybrid state): [n_batch] gate logits, [n_batch][n_embd] */
    float *shexp_gate, *shexp_out;
    /* hybrid models: recurrent state and linear-attention buffers (models/hybrid.h) */
    struct hybrid_state *hybrid;
    /* architecture-specific state beyond the above (qwen4exp: wide residual buffers, indexer
     * caches, n-gram state); owned by the architecture's state functions */
    void *arch_state;
    /* streaming: unique experts of a batch, lookahead prediction (models/moe.c owns these) */
    struct moe_scratch *moe_extra;
    /* observation */
    sluice_route_fn route_fn;
    void *route_ctx;
};

/* Free what moe_forward allocated on first use (every state_free must call it). */
void moe_state_release(model_state *st);

/* Backend memory for state buffers: zeroed, aligned, NULL on failure; state_release frees. */
void *state_alloc(backend *be, size_t bytes);
void state_release(backend *be, void *p);

/* Logit rows computed per output-head pass when they must be downloaded from the backend. */
#define STATE_LOGIT_ROWS 32

/* The output head: logits[r] = Wout · rmsnorm(rows[r]) for r < n_out, rows in backend memory,
 * logits host memory (models/decoder.c). */
void model_output_logits(const sluice_model *m, model_state *st, backend *be, const float *rows,
                         int n_out, float *logits);

/* MoE feed-forward for n tokens of layer il: out[t] = sum_k w_tk * expert_k(x[t]) (models/moe.c),
 * plus sigmoid(g · x[t]) * shared_expert(x[t]) when the layer has a shared expert. With
 * residual != NULL that sum is added into residual instead (one fused step on backends that
 * have it, same bits) and out is left holding only the routed part; with next_norm too, the
 * next layer's input norm follows, next_out = rmsnorm(residual) * next_norm (again one step
 * where the backend fuses them). 0, or -1 when the expert store fails. */
int moe_forward(const sluice_model *m, model_state *st, backend *be, int il, const float *x,
                int n, float *out, float *residual, const tview *next_norm, float *next_out);

/* Router lookahead for the first MoE layer of a pass of n decode tokens, from the pass's
 * residual h right after the embedding: nothing before that layer predicts its experts, so its
 * misses were read at its demand (in the qwen4exp-8l floor run 623 of its 640 acquires, a quarter
 * of the decode's read wait). Applies that layer's norm and router to h and starts the reads, so
 * they overlap the layers ahead of it (attention, the n-gram module). A streaming store whose
 * experts the host reaches (CPU); only timing depends on it. */
void moe_lookahead_start(const sluice_model *m, model_state *st, backend *be, const float *h, int n);
/* A streaming device store with the router lookahead (copy path): fold each MoE layer's
 * successor's router for that layer's input (layer_weights.ffn_look), so that a decode layer's
 * lookahead costs no launch of its own. Bytes it takes: moe_lookahead_bytes (planned with the
 * dense tensors). 0, or -1 with err (out of memory). */
uint64_t moe_lookahead_bytes(const sluice_model *m);
int moe_lookahead_bind(sluice_model *m, char *err, size_t err_len);

/* True when the MoE layers need nothing from the host during a forward pass (the expert table
 * is complete and no layer-by-layer cache fills it): a device backend may then capture the
 * whole pass as a graph and replay it. */
bool moe_host_free(const sluice_model *m, const model_state *st, const backend *be);

/* A forward pass of n tokens whose MoE layers ran without the host (the expert table) leaves
 * its routing on the device. When the route callback or the expert store's observer (a
 * zero-copy cache promotes hot experts between steps) wants it (moe_step_collects), the pass
 * ends with moe_step_collect, which queues one download of every layer's routing: inside a
 * captured decode pass it becomes part of the graph. After the pass, moe_step_end hands the
 * routing to both. 0 or -1. */
bool moe_step_collects(const sluice_model *m, const model_state *st, int n);
int moe_step_collect(const sluice_model *m, model_state *st, int n);
int moe_step_end(const sluice_model *m, model_state *st, int n, int pos0);

#endif
