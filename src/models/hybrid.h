/* Hybrid models (qwen35moe, qwen3next): Gated DeltaNet (linear attention) layers interleaved
 * with gated full-attention layers, every layer followed by routed experts + a shared expert.
 *
 * Per-session memory beyond the standard decoder state:
 *   KV cache      only for the full-attention layers, n_ctx positions
 *   conv state    per recurrent layer, the last kernel-1 raw (pre-conv) qkv rows
 *   ssm state     per recurrent layer, [n_v_head][d_v][d_k] floats
 * Both recurrent states are zero at session start and after a reset. */
#ifndef SLUICE_HYBRID_H
#define SLUICE_HYBRID_H

#include "models/state.h"

struct hybrid_state {
    int32_t *slot;         /* [n_layer] index among KV layers or among recurrent layers */
    int n_attn, n_rec;     /* layers with a KV cache, layers with recurrent state */
    float *conv, *ssm;     /* recurrent state of all recurrent layers */
    size_t conv_len, ssm_len; /* floats per layer */
    /* linear-attention buffers, [n_batch][...] */
    float *qkv;            /* [conv_dim] projection, before the convolution */
    float *conv_out;       /* [conv_dim] after conv1d + SiLU */
    float *lq, *lk, *lv;   /* [n_k_head*d_k] x 2, [n_v_head*d_v]: split, q and k L2-normed */
    float *z;              /* [n_v_head*d_v] output gate, then the gated-norm output */
    float *beta, *alpha;   /* [n_v_head] */
    float *ba;             /* [2*n_v_head] qwen3next's fused beta/alpha projection */
    float *mix;            /* [conv_dim + value_dim] qwen3next's legacy fused projection */
    float *out;            /* [n_v_head*d_v] delta-rule output */
    /* gated attention: query and gate interleaved per head, then the gate alone */
    float *qg, *gate;
    /* Prefill form of the delta rule for batches of more than one token. 0 (the default): the
     * per-token recurrence, bit-identical to decoding token by token and across any batch
     * split. > 0: the chunked form with this chunk length (equal to rounding; tests). */
    int gdn_chunk;
    /* Per-token checkpoints (speculative decoding, models/qwen4exp_mtp.c): when ck_n > 0 the
     * next pass (of ck_n tokens) runs the conv and the delta rule token by token and copies
     * every recurrent layer's conv and ssm state after token t to ck_conv / ck_ssm
     * [t][n_rec][len]; NULL / 0: off. */
    float *ck_conv, *ck_ssm;
    int ck_n;
};

/* Longest conv1d kernel a loader accepts (backends must support it; the models use 4). */
#define HYBRID_MAX_CONV_KERNEL 16

/* Conv channels of a recurrent layer: q, k (n_k_head * d_k each) and v (n_v_head * d_v). */
static inline int hybrid_conv_dim(const hparams *hp) {
    return 2 * hp->ssm_n_k_head * hp->ssm_d_k + hp->ssm_n_v_head * hp->ssm_d_v;
}

/* Bind the Gated DeltaNet tensors of layer il (models/gated_deltanet.c). qwen3next selects its
 * fused projections. false with err set. */
bool gdn_load_layer(sluice_model *m, int il, bool qwen3next, char *err, size_t n);

/* Which layers are recurrent (models/qwen35moe.c): "<arch>.attention.recurrent_layers" (a flag
 * per layer, or one for all) when present, else every full_attention_interval-th layer (4 when
 * absent) is attention, as llama.cpp decides. Sets layers[].recurrent, hp.n_layer_recurrent. */
bool hybrid_layer_pattern(sluice_model *m, char *err, size_t n);
/* Hyper-parameters common to the hybrid families; *nextn receives the MTP block count (removed
 * from n_layer). */
bool hybrid_load_hparams(sluice_model *m, int *nextn, char *err, size_t n);
/* Router and sigmoid-gated shared expert of layer il (models/qwen35moe.c). */
bool hybrid_load_moe_layer(sluice_model *m, int il, char *err, size_t n);

/* Gated DeltaNet mixer for n tokens of recurrent layer il: reads st->cur, writes st->tmp,
 * advances the layer's conv and ssm state. */
void gdn_layer_forward(const sluice_model *m, model_state *st, backend *be, int il, int n);

#endif
