/* llama: the dense decoder of Llama/TinyLlama files (stories260K). Adjacent-pair RoPE, SwiGLU
 * feed-forward, optional tied output head. */
#include <stdio.h>
#include <stdlib.h>

#include "models/model.h"

static int llama_load(sluice_model *m, char *err, size_t n) {
    hparams *hp = &m->hp;
    if (!load_attention_hparams(m, err, n) ||
        !ld_int(m, "feed_forward_length", &hp->n_ff, true, err, n))
        return -1;
    hp->rope = ROPE_NORM;
    if (!load_io_tensors(m, err, n)) return -1;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim_k,
                  K = (int64_t)hp->n_head_kv * hp->head_dim_k,
                  V = (int64_t)hp->n_head_kv * hp->head_dim_v,
                  O = (int64_t)hp->n_head * hp->head_dim_v;
    for (int il = 0; il < hp->n_layer; il++) {
        layer_weights *L = &m->layers[il];
        if (!ld_tensor(m, &L->attn_norm, true, E, -1, -1, err, n, "blk.%d.attn_norm.weight", il) ||
            !ld_tensor(m, &L->wq, true, E, Q, -1, err, n, "blk.%d.attn_q.weight", il) ||
            !ld_tensor(m, &L->wk, true, E, K, -1, err, n, "blk.%d.attn_k.weight", il) ||
            !ld_tensor(m, &L->wv, true, E, V, -1, err, n, "blk.%d.attn_v.weight", il) ||
            !ld_tensor(m, &L->wo, true, O, E, -1, err, n, "blk.%d.attn_output.weight", il) ||
            !ld_tensor(m, &L->ffn_norm, true, E, -1, -1, err, n, "blk.%d.ffn_norm.weight", il) ||
            !ld_tensor(m, &L->ffn_gate, true, E, hp->n_ff, -1, err, n, "blk.%d.ffn_gate.weight",
                       il) ||
            !ld_tensor(m, &L->ffn_up, true, E, hp->n_ff, -1, err, n, "blk.%d.ffn_up.weight", il) ||
            !ld_tensor(m, &L->ffn_down, true, hp->n_ff, E, -1, err, n, "blk.%d.ffn_down.weight",
                       il))
            return -1;
    }
    return 0;
}

const arch_desc arch_llama = {
    .name = "llama",
    .load = llama_load,
    .state_bytes = decoder_state_bytes,
    .state_new = decoder_state_new,
    .state_free = decoder_state_free,
    .state_reset = decoder_state_reset,
    .forward = decoder_forward,
};
