/* qwen3moe (Qwen3-30B-A3B and relatives): the pre-norm decoder with per-head q/k RMSNorm,
 * NeoX RoPE, and a routed mixture of SwiGLU experts in every layer (no shared expert).
 * llama.cpp always renormalizes the top-k router weights for this architecture. */
#include <stdio.h>
#include <stdlib.h>

#include "models/model.h"

static int qwen3moe_load(sluice_model *m, char *err, size_t n) {
    hparams *hp = &m->hp;
    if (!load_attention_hparams(m, err, n) ||
        !ld_int(m, "expert_count", &hp->n_expert, true, err, n) ||
        !ld_int(m, "expert_used_count", &hp->n_expert_used, true, err, n) ||
        !ld_int(m, "expert_feed_forward_length", &hp->n_ff_exp, true, err, n))
        return -1;
    if (hp->n_expert <= 0 || hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert ||
        hp->n_expert_used > 64 || hp->n_ff_exp <= 0) {
        snprintf(err, n, "invalid MoE shape: %d experts, %d used, width %d", hp->n_expert,
                 hp->n_expert_used, hp->n_ff_exp);
        return -1;
    }
    hp->rope = ROPE_NEOX;
    hp->norm_topk = true;
    if (!load_io_tensors(m, err, n)) return -1;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim_k,
                  K = (int64_t)hp->n_head_kv * hp->head_dim_k,
                  V = (int64_t)hp->n_head_kv * hp->head_dim_v,
                  O = (int64_t)hp->n_head * hp->head_dim_v, X = hp->n_expert;
    for (int il = 0; il < hp->n_layer; il++) {
        layer_weights *L = &m->layers[il];
        if (!ld_tensor(m, &L->attn_norm, true, E, -1, -1, err, n, "blk.%d.attn_norm.weight", il) ||
            !ld_tensor(m, &L->wq, true, E, Q, -1, err, n, "blk.%d.attn_q.weight", il) ||
            !ld_tensor(m, &L->wk, true, E, K, -1, err, n, "blk.%d.attn_k.weight", il) ||
            !ld_tensor(m, &L->wv, true, E, V, -1, err, n, "blk.%d.attn_v.weight", il) ||
            !ld_tensor(m, &L->wo, true, O, E, -1, err, n, "blk.%d.attn_output.weight", il) ||
            !ld_tensor(m, &L->q_norm, true, hp->head_dim_k, -1, -1, err, n,
                       "blk.%d.attn_q_norm.weight", il) ||
            !ld_tensor(m, &L->k_norm, true, hp->head_dim_k, -1, -1, err, n,
                       "blk.%d.attn_k_norm.weight", il) ||
            !ld_tensor(m, &L->ffn_norm, true, E, -1, -1, err, n, "blk.%d.ffn_norm.weight", il) ||
            !ld_tensor(m, &L->ffn_gate_inp, true, E, X, -1, err, n, "blk.%d.ffn_gate_inp.weight",
                       il))
            return -1;
    }
    /* the routed experts are bound through the expert store (created by the engine once the
     * memory plan is known) */
    return ld_experts(m, true, err, n) ? 0 : -1;
}

const arch_desc arch_qwen3moe = {
    .name = "qwen3moe",
    .load = qwen3moe_load,
    .state_bytes = decoder_state_bytes,
    .state_new = decoder_state_new,
    .state_free = decoder_state_free,
    .state_reset = decoder_state_reset,
    .forward = decoder_forward,
};
