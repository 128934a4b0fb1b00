/* The model object behind sluice.h, and the interface each architecture implements.
 *
 * An architecture (llama, qwen3moe, ...) provides:
 *   load     read hyper-parameters and bind tensor views from the GGUF
 *   forward  evaluate a batch of tokens at a position, writing logits
 * Per-session memory (KV cache, recurrent state, activation buffers) lives in model_state. */
#ifndef SLUICE_MODEL_H
#define SLUICE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "engine/tokenizer.h"
#include "formats/gguf.h"
#include "formats/store.h"
#include "runtime/experts.h"
#include "runtime/plan.h"
#include "sluice.h"

typedef struct hparams {
    int n_vocab;
    int n_ctx_train;
    int n_embd;
    int n_layer;
    int n_head, n_head_kv;
    int head_dim_k, head_dim_v; /* per attention head */
    int n_ff;                   /* dense feed-forward width (0 for MoE-only models) */
    int n_rot;                  /* rotary dims per head */
    float rope_base;
    rope_mode rope;
    float rms_eps;
    int n_expert, n_expert_used;
    int n_ff_exp;               /* routed expert width */
    bool norm_topk;             /* renormalize the top-k router weights */
    int n_ff_shexp;             /* shared expert width (0: none) */
    /* hybrid models (qwen35moe, qwen3next): Gated DeltaNet layers, see models/hybrid.h */
    int n_layer_recurrent;      /* layers with layer_weights.recurrent set */
    int ssm_kernel;             /* causal conv1d taps */
    int ssm_n_k_head, ssm_n_v_head, ssm_d_k, ssm_d_v;
    bool ssm_kv_tiled;          /* value head h reads key head h % n_k_head (else grouped) */
    bool ssm_gate_sigmoid;      /* output gate rmsnorm(o) * sigmoid(z) (qwen4exp), else silu(z) */
} hparams;

/* Weights of a Gated DeltaNet (linear attention) layer. qwen35moe files have qkv, gate, beta,
 * alpha; qwen3next files have ba (beta and alpha interleaved per key head) and either qkv + gate
 * or the legacy fused in (q, k, v, z grouped per key head). */
typedef struct ssm_weights {
    tview qkv, gate, beta, alpha, ba, in;
    tview conv1d;               /* F32 [conv channels][kernel] */
    tview dt_bias, a, norm, out;
} ssm_weights;

typedef struct layer_weights {
    tview attn_norm, wq, wk, wv, wo, q_norm, k_norm;
    tview ffn_norm;
    tview ffn_gate, ffn_up, ffn_down; /* dense FFN */
    tview ffn_gate_inp;               /* MoE router [n_embd -> n_expert] */
    /* shared expert behind a sigmoid gate (qwen35moe, qwen3next): see moe_forward */
    tview ffn_gate_inp_shexp, ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
    /* streamed on a device: the next MoE layer's router folded for this layer's input, so the
     * router lookahead runs in this layer's router launch (moe_lookahead_bind); else absent */
    tview ffn_look;
    /* hybrid models: a Gated DeltaNet layer instead of attention (wq doubles as query+gate) */
    bool recurrent;
    ssm_weights ssm;
} layer_weights;

typedef struct model_state model_state;
typedef struct arch_desc arch_desc;

struct sluice_model {
    gguf_file *gguf;
    const arch_desc *arch;
    char arch_name[32];
    char name[128];
    hparams hp;
    tokenizer *tok;
    tview tok_embd, output_norm, output;
    layer_weights *layers;
    expert_store *experts; /* NULL for dense models (and for plan-only loads) */
    expert_layout layout;  /* where each routed expert lives in the file */
    /* the memory plan (runtime/plan.h) the model was loaded with */
    sluice_model_params params;
    plan_model_facts facts;
    plan_machine_facts machine;
    plan_request request;
    plan plan;
    backend *gpu;          /* the device backend holding the weights (NULL: CPU sessions) */
    char *path;            /* the model file (streaming reads it); NULL for in-memory models */
    bool watching;         /* holds a reference on the memory watchdog */
    void **owned;          /* buffers the model allocated (converted norms) */
    int n_owned;
    int64_t n_params;
    /* architecture-private hyper-parameters and weights (qwen4exp: models/qwen4exp.h); owned */
    void *arch_priv;
    /* the n-gram embedding table (qwen4exp): rows from the mapping or read on demand (a third
     * tier of the memory plan, runtime/ngram_table.h); NULL when the model has none */
    struct ngram_table *ngram;
};

struct arch_desc {
    const char *name;
    int (*load)(sluice_model *m, char *err, size_t err_len);
    /* bytes of per-session state for a context of n_ctx positions */
    uint64_t (*state_bytes)(const sluice_model *m, int n_ctx);
    model_state *(*state_new)(const sluice_model *m, backend *be, int n_ctx, int n_batch);
    void (*state_free)(model_state *st);
    void (*state_reset)(model_state *st);
    /* the part of state_bytes that does not grow with n_ctx (recurrent and conv state of
     * linear-attention layers); NULL when there is none */
    uint64_t (*recurrent_bytes)(const sluice_model *m);
    /* Evaluate tokens[0..n) at positions pos0..pos0+n-1 (n <= n_batch). logits receives
     * [n][n_vocab] when all_logits, else the last position's [n_vocab]; NULL skips the output
     * head (a prompt chunk before the last). 0 or -1. */
    int (*forward)(const sluice_model *m, model_state *st, backend *be, const int32_t *tokens,
                   int n, int pos0, float *logits, bool all_logits);
    /* Optional. The tokens a session is about to evaluate (all chunks of a prompt): start
     * whatever reads depend only on token ids (qwen4exp's n-gram rows). Timing only. */
    void (*prefetch)(const sluice_model *m, model_state *st, const int32_t *tokens, int n);
    /* Optional. Adjust the planner's model facts (model.c fills the generic ones first):
     * architecture scratch, tiers the generic accounting does not know. */
    void (*plan_facts)(const sluice_model *m, plan_model_facts *f);
    /* Optional. After the memory plan: create what the plan decided for the architecture
     * (qwen4exp: the n-gram table tier). 0, or -1 with err. */
    int (*bind)(sluice_model *m, char *err, size_t err_len);
    /* Optional. Release what load and bind created beyond the generic fields. */
    void (*unload)(sluice_model *m);
    /* Optional: speculative decoding with the model's own MTP block (qwen4exp_mtp.c).
     * mtp_blocks: blocks bound (0: the file has none or the model was loaded with params.mtp
     * 0). mtp_draft: n_draft greedy drafts after `next`, the token at position pos not yet
     * evaluated. spec_begin: keep the recurrent state after every token of the next forward
     * pass (of these n tokens); spec_keep: roll it back to after the first `keep`. 0 or -1. */
    int (*mtp_blocks)(const sluice_model *m);
    int (*mtp_draft)(const sluice_model *m, model_state *st, backend *be, int32_t next, int pos,
                     int n_draft, int32_t *drafts);
    int (*spec_begin)(const sluice_model *m, model_state *st, const int32_t *tokens, int n);
    int (*spec_keep)(const sluice_model *m, model_state *st, int keep);
};

/* Registry: the architecture implementing general.architecture, or NULL. */
const arch_desc *arch_find(const char *name);
const char *arch_supported_list(void);

/* ---- loading helpers (models/loader.c) -------------------------------------------------- */

/* "<arch>.<suffix>" integer / float hyper-parameters. Missing required keys are errors. */
bool ld_int(sluice_model *m, const char *suffix, int *out, bool required, char *err, size_t n);
bool ld_float(sluice_model *m, const char *suffix, float *out, bool required, char *err,
              size_t n);
/* Bind tensor `name` (printf format with one optional %d for the layer) with the expected
 * dims (ne0, ne1, ne2; 0 = unchecked, -1 = the dim must not exist). required=false leaves the
 * view empty (data NULL) when absent. The type must have a codec. Norm vectors (1-D) are
 * converted to F32 when stored otherwise. */
bool ld_tensor(sluice_model *m, tview *out, bool required, int64_t ne0, int64_t ne1, int64_t ne2,
               char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 9, 10)));
/* Find the routed experts (plain stacked tensors or an expert-major store) and check their
 * shapes against the hyper-parameters. every_layer: each layer must have experts. */
bool ld_experts(sluice_model *m, bool every_layer, char *err, size_t n);
/* Keep a buffer alive as long as the model. */
bool ld_own(sluice_model *m, void *p);
/* Attention hyper-parameters of llama-style files, with llama.cpp's defaults. */
bool load_attention_hparams(sluice_model *m, char *err, size_t n);
/* token_embd, output_norm, output (tied to token_embd when absent); sets n_vocab. */
bool load_io_tensors(sluice_model *m, char *err, size_t n);

/* The standard pre-norm decoder (llama, qwen3moe): state and forward. */
uint64_t decoder_state_bytes(const sluice_model *m, int n_ctx);
model_state *decoder_state_new(const sluice_model *m, backend *be, int n_ctx, int n_batch);
void decoder_state_free(model_state *st);
void decoder_state_reset(model_state *st);
int decoder_forward(const sluice_model *m, model_state *st, backend *be, const int32_t *tokens,
                    int n, int pos0, float *logits, bool all_logits);

#endif /* SLUICE_MODEL_H */
