/* qwen4exp (Qwen3.8-Flash-Next): the architecture's private model and state, shared by its
 * files:
 *
 *   qwen4exp.c   loading, per-session state, the forward pass
 *   hyperconn.c  the 4-stream hyper-connections (read before each mixer and MoE, write after,
 *                the final mixer before the output head)
 *   qsa.c        gated attention with the QSA block-sparse indexer
 *   ngram.c      the n-gram (PLE) module: hashing, the table rows, its gate and dilated conv
 *   qwen4exp_mtp.c  the MTP block (the drafter of speculative decoding) and the per-token
 *                checkpoints of the recurrent state that let a verified batch be cut short
 *
 * The residual stream is WIDE: hc streams of n_embd per token ([n][hc][n_embd], stream-major,
 * as the 1-D norm weights of hc * n_embd are laid out). There are no layer norms: the
 * hyper-connection read normalizes each stream. */
#ifndef SLUICE_QWEN4EXP_H
#define SLUICE_QWEN4EXP_H

#include "models/hybrid.h"

#define Q4X_MAX_NGRAM 4   /* n-gram orders are 2..ngram_size; the model uses 3 */
#define Q4X_MTP_SEEN 64   /* context ids a draft considers beyond its vocabulary */
#define Q4X_MAX_HEADS 64  /* n-gram heads ((ngram_size - 1) * heads_per_ngram); the model 16 */

/* One hyper-connection module: norm gamma [hc * n_embd] (F32), W_down [hc*n_embd -> low rank],
 * W_up [low rank -> hc*n_embd], W_inject [hc*n_embd -> hc] (absent for the final mixer). */
typedef struct q4x_hc {
    tview norm, down, up, inject;
} q4x_hc;

typedef struct q4x_layer {
    q4x_hc attn, ffn;
    /* attention layers: the QSA indexer (compress 0: dense attention) */
    int compress;
    tview idx_q, idx_k, idx_q_norm, idx_k_norm;
    /* the n-gram layer */
    tview ple_key, ple_value, ple_norm_key, ple_norm_query, ple_norm_conv;
    const float *ple_conv; /* F32 [hc * n_embd][kernel] */
} q4x_layer;

typedef struct q4x_model {
    int hc, hc_rank;
    /* QSA */
    int idx_n_head, idx_dim, idx_top_k, max_compress;
    /* final mixer */
    q4x_hc out_hc;
    q4x_layer *layers; /* [n_layer] */
    /* n-gram module: -1 when absent */
    int ple_layer;
    int ngram_size, heads_per_ngram, ple_n_heads, ple_dim, ple_kernel;
    int32_t ple_eos, ple_image;
    uint64_t mult[Q4X_MAX_NGRAM];
    uint64_t head_offset[Q4X_MAX_HEADS], head_size[Q4X_MAX_HEADS];
    tview table;       /* per_layer_token_embd [ple_dim] x rows */
    uint64_t table_offset; /* file offset of its first row */
    int nextn;         /* MTP blocks after the trunk (the file's) */
    /* the MTP block, bound when the model is loaded with params.mtp > 0 (qwen4exp_mtp.c): its
     * trunk-shaped layer is layers[n_layer] / m->layers[n_layer] (dense attention) */
    bool mtp;
    tview mtp_enorm, mtp_hnorm, mtp_eh_proj;
    q4x_hc mtp_head;   /* its own output mixer */
    /* the drafts' shortlisting head: the output head as Q2_0 (qwen4exp_mtp.c mtp_draft_head_bind);
     * data NULL where drafts read the full head */
    tview mtp_draft_head;
    /* the verification passes' head: the output head as Q6_K_R16 (mtp_verify_head_bind); data
     * NULL where they read the output head itself */
    tview mtp_verify_head;
} q4x_model;

/* Called for every token of a QSA layer with the positions it attends to (NULL, -1: dense). */
typedef void (*q4x_qsa_fn)(void *ctx, int layer, int pos, const int32_t *sel, int n_sel);
/* Called, when set, for every token of a QSA layer before its attention: sel[0..n_sel) are the
 * chosen positions (n_sel -1: dense); returns the count the token attends instead (positions
 * ascending, at most cap, each <= pos; -1: dense) after rewriting sel. Tests only: it attends
 * another selector's cells (transformers') with sluice's arithmetic. */
typedef int (*q4x_qsa_edit_fn)(void *ctx, int layer, int pos, int32_t *sel, int n_sel, int cap);
/* Called for every token with its n-gram table rows. */
typedef void (*q4x_rows_fn)(void *ctx, int pos, const int32_t *rows, int n_rows);

typedef struct q4x_state {
    /* hyper-connection buffers [n_batch][...] */
    float *xn, *hgate;   /* [hc * n_embd] normalized streams; gate pre-activations */
    float *lo;           /* [hc_rank] */
    float *inject;       /* [hc] */
    /* QSA: per attention layer with an indexer, raw keys [n_ctx][idx_dim] and block keys
     * [n_ctx / compress + 1][idx_dim]; selection of the batch */
    float *idx_kraw, *idx_kblk;
    size_t kraw_len, kblk_len; /* floats per layer */
    int32_t *idx_slot;   /* [n_layer] index among indexer layers, -1 */
    float *idx_q;        /* [n_batch][idx_n_head * idx_dim] */
    float *idx_knew;     /* [n_batch][idx_dim] */
    int32_t *sel, *sel_n;
    int sel_stride;
    int32_t *dense_h;    /* host [n_batch] of -1: "every token dense" */
    /* n-gram module */
    float *ple_emb;      /* [n_batch][ple_n_heads * ple_dim] (backend) */
    float *ple_val;      /* [n_batch][n_embd] */
    float *ple_gated;    /* [n_batch][hc * n_embd] */
    float *ple_hist;     /* conv history [(kernel - 1) * ngram_size][hc * n_embd] */
    size_t ple_hist_len; /* its floats */
    int32_t *rows_h;     /* [n_batch][ple_n_heads] host */
    uint8_t *raw_h;      /* the gathered rows as stored, host */
    float *emb_h;        /* dequantized, host */
    int32_t prev[Q4X_MAX_NGRAM]; /* the sequence's last tokens, newest first */
    int n_prev;
    /* MTP (qwen4exp_mtp.c; NULL without it) */
    float *mtp_h;        /* [n_batch + 1][hc * n_embd]: row 0 the trunk's last kept position
                          * before the batch, rows 1..n the batch's trunk residual */
    int mtp_pend;        /* the row of mtp_h holding the trunk residual of position pos - 1 */
    bool mtp_have;       /* mtp_h[mtp_pend] is valid (pos > 0) */
    float *mtp_x;        /* the MTP block's wide residual [n_batch][hc * n_embd] */
    float *mtp_chain;    /* a draft's exported residual, the next draft's input [hc * n_embd] */
    float *mtp_cat;      /* [n_batch * hc][2 * n_embd] eh_proj inputs */
    float *mtp_logits;   /* host [n_vocab] */
    uint8_t *mtp_rows;   /* host: a draft's candidate rows of the output head */
    /* the context's most recent distinct ids at or past the drafts' vocabulary (mtp_vocab): a
     * draft considers them too (qwen4exp_mtp.c, the drafts' head) */
    int32_t mtp_seen[Q4X_MTP_SEEN];
    int mtp_n_seen, mtp_seen_next;
    /* per-token checkpoints of the recurrent state of one forward pass (spec_begin) */
    int ck_cap, ck_n;    /* tokens they can hold; tokens of the pass being checkpointed (0: off) */
    float *ck_ple;       /* [ck_cap][ple_hist_len] */
    int32_t ck_prev[Q4X_MAX_NGRAM]; /* the n-gram history before the pass */
    int ck_n_prev;
    int32_t *ck_tokens;  /* host [ck_cap]: the pass's tokens */
    /* observation (tests) */
    q4x_qsa_fn qsa_fn;
    void *qsa_ctx;
    q4x_qsa_edit_fn qsa_edit;
    void *qsa_edit_ctx;
    q4x_rows_fn rows_fn;
    void *rows_ctx;
} q4x_state;

static inline q4x_model *q4x_of(const sluice_model *m) { return (q4x_model *)m->arch_priv; }
static inline q4x_state *q4x_state_of(const model_state *st) { return (q4x_state *)st->arch_state; }

/* ---- qwen4exp_mtp.c ---- */
/* Bind the MTP block (m->layers and q->layers have n_layer + 1 entries). false with err. */
bool mtp_load(sluice_model *m, char *err, size_t n);
/* The drafts' shortlisting head: its bytes (0: drafts read the full head), counted by the plan,
 * and its making after the plan (false: out of memory, err set). */
uint64_t mtp_draft_head_bytes(const sluice_model *m);
bool mtp_draft_head_bind(sluice_model *m, char *err, size_t n);
void mtp_draft_head_free(sluice_model *m);
/* The verification head (the output head's rows interleaved for the few-token kernel): made
 * after a resident plan when the plan's headroom holds it (false: out of memory, err set), and
 * the head a product of n rows reads. */
bool mtp_verify_head_bind(sluice_model *m, char *err, size_t n);
const tview *mtp_head_for(const sluice_model *m, int n);
/* Session memory of the MTP and of the checkpoints, in bytes (0 without MTP). */
uint64_t mtp_state_bytes(const sluice_model *m, int n_ctx);
bool mtp_state_alloc(const sluice_model *m, model_state *st);
void mtp_state_free(model_state *st);
/* After the trunk pass of tokens[0..n) at pos0 (st->x holds its residual): run the MTP block
 * over the positions whose next token is now known (pos0 - 1 .. pos0 + n - 2), so its KV
 * cache follows the trunk. 0 or -1. */
int mtp_follow(const sluice_model *m, model_state *st, backend *be, const int32_t *tokens, int n,
               int pos0);
/* The MTP block over n positions pos0.. with trunk (or chained) residual rows h [n][hc*E] and
 * the next tokens; the block's output residual stays in xs->mtp_x; logits (host [n][n_vocab])
 * of its own mixer and the shared head when not NULL. logits NULL: the block follows the trunk,
 * and only its attention's KV rows are made (the rest of the block feeds nothing later
 * positions read; xs->mtp_x is then not the block's output). 0 or -1. */
int mtp_forward(const sluice_model *m, model_state *st, backend *be, const float *h,
                const int32_t *next, int n, int pos0, float *logits);
/* Draft n_draft tokens after `next` (the token at position pos, not yet evaluated): greedy
 * argmax of the MTP logits, chained through the block's exported residual. 0 or -1. */
int mtp_draft(const sluice_model *m, model_state *st, backend *be, int32_t next, int pos,
              int n_draft, int32_t *drafts);
/* Checkpoints: keep the recurrent state after every token of the next forward pass, of these n
 * tokens (n <= ck_cap); spec_keep then rolls the state back to after its first `keep`. */
int mtp_spec_begin(const sluice_model *m, model_state *st, const int32_t *tokens, int n);
int mtp_spec_keep(const sluice_model *m, model_state *st, int keep);

/* Observers for tests (NULL: none). */
void qwen4exp_observe(model_state *st, q4x_qsa_fn qsa_fn, void *qsa_ctx, q4x_rows_fn rows_fn,
                      void *rows_ctx);
/* Replace the QSA selection of each token (tests; NULL: none). */
void qwen4exp_edit_qsa(model_state *st, q4x_qsa_edit_fn fn, void *ctx);

/* ---- hyperconn.c ---- */
/* Bind "<prefix>_{norm,down,up,inject}.weight" (inject only when asked). */
bool hc_load(sluice_model *m, q4x_hc *hc, bool inject, char *err, size_t n, const char *prefix);
/* Read: x (wide, n rows) -> out [n][n_embd]; with the module's inject weights, also
 * q4x_state.inject [n][hc]. */
void hc_read(const sluice_model *m, model_state *st, backend *be, const q4x_hc *hc,
             const float *x, int n, float *out);
/* Write: st->x[t][s] += 2 sigmoid(inject[t][s] / hc) * out[t]. */
void hc_write(const sluice_model *m, model_state *st, backend *be, const float *out, int n);

/* ---- qsa.c ---- */
bool qsa_load_layer(sluice_model *m, int il, char *err, size_t n);
/* Gated attention of attention layer il (QSA when the layer has an indexer): st->cur ->
 * st->tmp. kv_only: only what later positions read (the KV cache rows and the indexer's keys
 * and pooled blocks, computed exactly as the full pass computes them); st->tmp is untouched. */
void qsa_attention(const sluice_model *m, model_state *st, backend *be, int il, int n, int pos0,
                   bool kv_only);

/* ---- ngram.c ---- */
bool ngram_load(sluice_model *m, char *err, size_t n);
/* The table rows of one token: ctx[0] the token, ctx[j] the token j positions back (-1 when
 * before the sequence start). rows receives ple_n_heads ids. */
void ngram_rows(const q4x_model *q, const int32_t *ctx, int32_t *rows);
/* Rows of a batch (updates nothing): rows [n][ple_n_heads], from the state's history. */
void ngram_batch_rows(const q4x_model *q, const q4x_state *xs, const int32_t *tokens, int n,
                      int32_t *rows);
/* Remember the batch's last tokens as the history of the next one. */
void ngram_advance(const q4x_model *q, q4x_state *xs, const int32_t *tokens, int n);
/* The n-gram injection into st->x for the batch whose rows are in xs->rows_h. 0 or -1. */
int ngram_forward(const sluice_model *m, model_state *st, backend *be, int n, int pos0);

#endif
