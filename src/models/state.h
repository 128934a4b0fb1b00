/* Per-session memory of a model: the KV cache and the activation buffers of one forward pass
 * over at most n_batch tokens. Sized once when the session is created. */
#ifndef SLUICE_STATE_H
#define SLUICE_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "models/model.h"

struct model_state {
    int n_ctx, n_batch;
    /* KV cache: per layer [n_ctx][n_head_kv * head_dim] floats, K after norm and RoPE */
    float *kv_k, *kv_v;
    size_t kv_row_k, kv_row_v;   /* floats per position */
    /* activations, [n_batch][...] */
    float *x;                    /* residual stream [n_embd] */
    float *cur, *tmp;            /* [n_embd] */
    float *q, *k, *v, *attn;     /* attention projections and output */
    float *ff_a, *ff_b;          /* FFN hidden [max(n_ff, n_ff_exp)] */
    int32_t *pos;
    /* MoE */
    float *router;               /* [n_expert] logits, then probabilities */
    int32_t *moe_ids;            /* [n_expert_used] chosen experts */
    float *moe_w;                /* [n_expert_used] their weights */
    float *moe_slots;            /* [n_expert_used][n_embd] each expert's output */
    float *moe_x, *moe_y;        /* tokens gathered for one expert [n_embd] */
    int32_t *moe_rows;           /* (token, slot) pairs routed to one expert */
    float *logits;               /* [n_vocab] scratch when only the last row is wanted */
    /* shared expert (allocated by the hybrid state): [n_batch] gate logits, [n_batch][n_embd] */
    float *shexp_gate, *shexp_out;
    /* hybrid models: recurrent state and linear-attention buffers (models/hybrid.h) */
    struct hybrid_state *hybrid;
    /* streaming: unique experts of a batch, lookahead prediction (models/moe.c owns these) */
    struct moe_scratch *moe_extra;
    /* observation */
    sluice_route_fn route_fn;
    void *route_ctx;
};

/* Free what moe_forward allocated on first use (every state_free must call it). */
void moe_state_release(model_state *st);

/* One allocation helper: zeroed, 64-byte aligned, NULL on failure. */
void *state_alloc(size_t bytes);

/* MoE feed-forward for n tokens of layer il: out[t] = sum_k w_tk * expert_k(x[t]) (models/moe.c),
 * plus sigmoid(g · x[t]) * shared_expert(x[t]) when the layer has a shared expert.
 * 0, or -1 when the expert store fails. */
int moe_forward(const sluice_model *m, model_state *st, backend *be, int il, const float *x,
                int n, float *out);

#endif
