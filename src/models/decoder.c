/* The standard pre-norm decoder shared by llama and qwen3moe:
 *
 *   x = embed(tokens)
 *   per layer:  x += Wo · attention(rope(norm_q(Wq·n)), rope(norm_k(Wk·n)), Wv·n),  n = rms(x)
 *               x += ffn(rms(x))          ffn = SwiGLU (dense) or routed experts (MoE)
 *   logits = Wout · rms(x)
 *
 * q/k norms are applied when the file has them (qwen3moe). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/state.h"

void *state_alloc(backend *be, size_t bytes) { return be_alloc(be, bytes); }

void state_release(backend *be, void *p) { be_mfree(be, p); }

static int max_i(int a, int b) { return a > b ? a : b; }

uint64_t decoder_state_bytes(const sluice_model *m, int n_ctx) {
    const hparams *hp = &m->hp;
    return (uint64_t)hp->n_layer * (uint64_t)n_ctx * (uint64_t)hp->n_head_kv *
           (uint64_t)(hp->head_dim_k + hp->head_dim_v) * sizeof(float);
}

void decoder_state_free(model_state *st) {
    if (!st) return;
    backend *be = st->be;
    void *bufs[] = {st->kv_k, st->kv_v, st->x, st->cur, st->tmp, st->q, st->k, st->v, st->attn,
                    st->ff_a, st->ff_b, st->router, st->moe_ids, st->moe_w, st->moe_slots,
                    st->moe_x, st->moe_y, st->moe_rows, st->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) state_release(be, bufs[i]);
    moe_state_release(st);
    free(st);
}

model_state *decoder_state_new(const sluice_model *m, backend *be, int n_ctx, int n_batch) {
    const hparams *hp = &m->hp;
    model_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->be = be;
    st->n_ctx = n_ctx;
    st->n_batch = n_batch;
    st->kv_row_k = (size_t)hp->n_head_kv * hp->head_dim_k;
    st->kv_row_v = (size_t)hp->n_head_kv * hp->head_dim_v;
    const size_t B = (size_t)n_batch, F = sizeof(float);
    const size_t ff = (size_t)max_i(hp->n_ff, hp->n_ff_exp);
    const size_t k_used = (size_t)max_i(hp->n_expert_used, 1);
    st->kv_k = state_alloc(be, (size_t)hp->n_layer * n_ctx * st->kv_row_k * F);
    st->kv_v = state_alloc(be, (size_t)hp->n_layer * n_ctx * st->kv_row_v * F);
    st->x = state_alloc(be, B * hp->n_embd * F);
    st->cur = state_alloc(be, B * hp->n_embd * F);
    st->tmp = state_alloc(be, B * hp->n_embd * F);
    st->q = state_alloc(be, B * hp->n_head * hp->head_dim_k * F);
    st->k = state_alloc(be, B * st->kv_row_k * F);
    st->v = state_alloc(be, B * st->kv_row_v * F);
    st->attn = state_alloc(be, B * hp->n_head * hp->head_dim_v * F);
    st->ff_a = state_alloc(be, B * ff * F);
    st->ff_b = state_alloc(be, B * ff * F);
    if (!be->host_memory) st->logits = state_alloc(be, STATE_LOGIT_ROWS * (size_t)hp->n_vocab * F);
    bool ok = st->kv_k && st->kv_v && st->x && st->cur && st->tmp && st->q && st->k && st->v &&
              st->attn && st->ff_a && st->ff_b && (st->logits || be->host_memory);
    if (hp->n_expert > 0) {
        /* the expert table path (device backends) needs no per-expert row buffers */
        const bool table = be_has_expert_table(be);
        st->router = state_alloc(be, B * hp->n_expert * F);
        st->moe_ids = state_alloc(be, (size_t)hp->n_layer * B * k_used * sizeof(int32_t));
        st->moe_w = state_alloc(be, (size_t)hp->n_layer * B * k_used * F);
        if (!table) {
            st->moe_slots = state_alloc(be, B * k_used * hp->n_embd * F);
            st->moe_x = state_alloc(be, B * hp->n_embd * F);
            st->moe_y = state_alloc(be, B * hp->n_embd * F);
            st->moe_rows = state_alloc(be, B * k_used * sizeof(int32_t));
        }
        ok = ok && st->router && st->moe_ids && st->moe_w &&
             (table || (st->moe_slots && st->moe_x && st->moe_y && st->moe_rows));
    }
    if (!ok) {
        decoder_state_free(st);
        return NULL;
    }
    return st;
}

void decoder_state_reset(model_state *st) {
    (void)st; /* positions past the session's position are never read */
}

/* Attention sub-block for layer il: reads the normed input st->cur, writes st->tmp. */
static void attention_block(const sluice_model *m, model_state *st, backend *be, int il, int n,
                            int pos0) {
    const hparams *hp = &m->hp;
    const layer_weights *L = &m->layers[il];
    const tview *w[3] = {&L->wq, &L->wk, &L->wv};
    float *o[3] = {st->q, st->k, st->v};
    be_matmul_multi(be, 3, w, st->cur, n, o);
    float *kc = st->kv_k + (size_t)il * st->n_ctx * st->kv_row_k;
    float *vc = st->kv_v + (size_t)il * st->n_ctx * st->kv_row_v;
    be_qk_norm_rope_store(be, st->q, st->k, st->v, n, hp->n_head, hp->n_head_kv, hp->head_dim_k, &L->q_norm,
                          &L->k_norm, hp->rms_eps, hp->n_rot, st->pos, hp->rope_base, hp->rope, kc, vc,
                          st->kv_row_k, st->kv_row_v);
    be_attention(be, st->q, kc, vc, n, pos0, hp->n_head, hp->n_head_kv, hp->head_dim_k,
                 hp->head_dim_v, 1.0f / sqrtf((float)hp->head_dim_k), st->attn);
    be_matmul(be, &L->wo, st->attn, n, st->tmp);
}

/* Dense SwiGLU feed-forward: reads st->cur, writes st->tmp. */
static void dense_ffn(const sluice_model *m, model_state *st, backend *be, int il, int n) {
    const layer_weights *L = &m->layers[il];
    be_matmul(be, &L->ffn_gate, st->cur, n, st->ff_a);
    be_matmul(be, &L->ffn_up, st->cur, n, st->ff_b);
    be_swiglu(be, st->ff_a, st->ff_b, (size_t)n * m->hp.n_ff);
    be_matmul(be, &L->ffn_down, st->ff_a, n, st->tmp);
}

int decoder_forward(const sluice_model *m, model_state *st, backend *be, const int32_t *tokens,
                    int n, int pos0, float *logits, bool all_logits) {
    const hparams *hp = &m->hp;
    const size_t E = (size_t)hp->n_embd;
    const int32_t *ids;
    be_set_inputs(be, tokens, n, pos0, &ids, &st->pos);
    st->pos0 = pos0;
    be_embed(be, &m->tok_embd, ids, n, st->x);
    moe_lookahead_start(m, st, be, st->x, n);
    for (int il = 0; il < hp->n_layer; il++) {
        const layer_weights *L = &m->layers[il];
        /* the layer before normed this layer's input already (its tail, fused) */
        if (il == 0) be_rmsnorm(be, st->x, &L->attn_norm, n, hp->n_embd, hp->rms_eps, st->cur);
        attention_block(m, st, be, il, n, pos0);
        be_add_rmsnorm(be, st->x, st->tmp, &L->ffn_norm, n, hp->n_embd, hp->rms_eps, st->cur);
        const tview *next = il + 1 < hp->n_layer ? &m->layers[il + 1].attn_norm : NULL;
        if (L->ffn_gate_inp.data) {
            if (moe_forward(m, st, be, il, st->cur, n, st->tmp, st->x, next, st->cur) != 0) return -1;
        } else {
            dense_ffn(m, st, be, il, n);
            if (next) be_add_rmsnorm(be, st->x, st->tmp, next, n, hp->n_embd, hp->rms_eps, st->cur);
            else be_add(be, st->x, st->tmp, (size_t)n * E);
        }
    }
    if (!logits) return 0; /* an intermediate prompt chunk */
    /* only the rows whose logits are wanted go through the output head */
    const float *rows = all_logits ? st->x : st->x + (size_t)(n - 1) * E;
    model_output_logits(m, st, be, rows, all_logits ? n : 1, logits);
    return 0;
}

void model_output_logits(const sluice_model *m, model_state *st, backend *be, const float *rows,
                         int n_out, float *logits) {
    const hparams *hp = &m->hp;
    const size_t E = (size_t)hp->n_embd, V = (size_t)hp->n_vocab;
    if (be->host_memory) { /* straight into the caller's rows */
        be_rmsnorm(be, rows, &m->output_norm, n_out, hp->n_embd, hp->rms_eps, st->cur);
        be_matmul(be, &m->output, st->cur, n_out, logits);
        return;
    }
    /* device memory: a few rows at a time through st->logits (all-position logits of a long
     * prompt would otherwise need a vocabulary-sized buffer per batch row) */
    for (int r0 = 0; r0 < n_out; r0 += STATE_LOGIT_ROWS) {
        const int nr = n_out - r0 < STATE_LOGIT_ROWS ? n_out - r0 : STATE_LOGIT_ROWS;
        be_rmsnorm(be, rows + (size_t)r0 * E, &m->output_norm, nr, hp->n_embd, hp->rms_eps,
                   st->cur);
        be_matmul(be, &m->output, st->cur, nr, st->logits);
        be_download(be, logits + (size_t)r0 * V, st->logits, (size_t)nr * V * sizeof(float));
    }
    /* one row (a decode step): its greedy pick on the device too (sluice_session_argmax) */
    if (n_out == 1 && st->argmax_host && be->ops->argmax_row) be->ops->argmax_row(be, st->logits, (int)V, st->argmax_host);
}
