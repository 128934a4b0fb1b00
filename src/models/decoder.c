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

void *state_alloc(size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (p) memset(p, 0, rounded ? rounded : 64);
    return p;
}

static int max_i(int a, int b) { return a > b ? a : b; }

uint64_t decoder_state_bytes(const sluice_model *m, int n_ctx) {
    const hparams *hp = &m->hp;
    return (uint64_t)hp->n_layer * (uint64_t)n_ctx * (uint64_t)hp->n_head_kv *
           (uint64_t)(hp->head_dim_k + hp->head_dim_v) * sizeof(float);
}

void decoder_state_free(model_state *st) {
    if (!st) return;
    free(st->kv_k);
    free(st->kv_v);
    free(st->x);
    free(st->cur);
    free(st->tmp);
    free(st->q);
    free(st->k);
    free(st->v);
    free(st->attn);
    free(st->ff_a);
    free(st->ff_b);
    free(st->pos);
    free(st->router);
    free(st->moe_ids);
    free(st->moe_w);
    free(st->moe_slots);
    free(st->moe_x);
    free(st->moe_y);
    free(st->moe_rows);
    free(st->logits);
    moe_state_release(st);
    free(st);
}

model_state *decoder_state_new(const sluice_model *m, int n_ctx, int n_batch) {
    const hparams *hp = &m->hp;
    model_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->n_ctx = n_ctx;
    st->n_batch = n_batch;
    st->kv_row_k = (size_t)hp->n_head_kv * hp->head_dim_k;
    st->kv_row_v = (size_t)hp->n_head_kv * hp->head_dim_v;
    const size_t B = (size_t)n_batch, F = sizeof(float);
    const size_t ff = (size_t)max_i(hp->n_ff, hp->n_ff_exp);
    const size_t k_used = (size_t)max_i(hp->n_expert_used, 1);
    st->kv_k = state_alloc((size_t)hp->n_layer * n_ctx * st->kv_row_k * F);
    st->kv_v = state_alloc((size_t)hp->n_layer * n_ctx * st->kv_row_v * F);
    st->x = state_alloc(B * hp->n_embd * F);
    st->cur = state_alloc(B * hp->n_embd * F);
    st->tmp = state_alloc(B * hp->n_embd * F);
    st->q = state_alloc(B * hp->n_head * hp->head_dim_k * F);
    st->k = state_alloc(B * st->kv_row_k * F);
    st->v = state_alloc(B * st->kv_row_v * F);
    st->attn = state_alloc(B * hp->n_head * hp->head_dim_v * F);
    st->ff_a = state_alloc(B * ff * F);
    st->ff_b = state_alloc(B * ff * F);
    st->pos = state_alloc(B * sizeof(int32_t));
    st->logits = state_alloc((size_t)hp->n_vocab * F);
    bool ok = st->kv_k && st->kv_v && st->x && st->cur && st->tmp && st->q && st->k && st->v &&
              st->attn && st->ff_a && st->ff_b && st->pos && st->logits;
    if (hp->n_expert > 0) {
        st->router = state_alloc(B * hp->n_expert * F);
        st->moe_ids = state_alloc(B * k_used * sizeof(int32_t));
        st->moe_w = state_alloc(B * k_used * F);
        st->moe_slots = state_alloc(B * k_used * hp->n_embd * F);
        st->moe_x = state_alloc(B * hp->n_embd * F);
        st->moe_y = state_alloc(B * hp->n_embd * F);
        st->moe_rows = state_alloc(B * k_used * sizeof(int32_t));
        ok = ok && st->router && st->moe_ids && st->moe_w && st->moe_slots && st->moe_x &&
             st->moe_y && st->moe_rows;
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
    be_matmul(be, &L->wq, st->cur, n, st->q);
    be_matmul(be, &L->wk, st->cur, n, st->k);
    be_matmul(be, &L->wv, st->cur, n, st->v);
    if (L->q_norm.data)
        be_rmsnorm(be, st->q, &L->q_norm, n * hp->n_head, hp->head_dim_k, hp->rms_eps, st->q);
    if (L->k_norm.data)
        be_rmsnorm(be, st->k, &L->k_norm, n * hp->n_head_kv, hp->head_dim_k, hp->rms_eps, st->k);
    be_rope(be, st->q, n, hp->n_head, hp->head_dim_k, hp->n_rot, st->pos, hp->rope_base,
            hp->rope);
    be_rope(be, st->k, n, hp->n_head_kv, hp->head_dim_k, hp->n_rot, st->pos, hp->rope_base,
            hp->rope);
    float *kc = st->kv_k + (size_t)il * st->n_ctx * st->kv_row_k;
    float *vc = st->kv_v + (size_t)il * st->n_ctx * st->kv_row_v;
    memcpy(kc + (size_t)pos0 * st->kv_row_k, st->k, (size_t)n * st->kv_row_k * sizeof(float));
    memcpy(vc + (size_t)pos0 * st->kv_row_v, st->v, (size_t)n * st->kv_row_v * sizeof(float));
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
    for (int t = 0; t < n; t++) st->pos[t] = pos0 + t;
    be_embed(be, &m->tok_embd, tokens, n, st->x);
    for (int il = 0; il < hp->n_layer; il++) {
        const layer_weights *L = &m->layers[il];
        be_rmsnorm(be, st->x, &L->attn_norm, n, hp->n_embd, hp->rms_eps, st->cur);
        attention_block(m, st, be, il, n, pos0);
        be_add(be, st->x, st->tmp, (size_t)n * E);
        be_rmsnorm(be, st->x, &L->ffn_norm, n, hp->n_embd, hp->rms_eps, st->cur);
        if (L->ffn_gate_inp.data) {
            if (moe_forward(m, st, be, il, st->cur, n, st->tmp) != 0) return -1;
        } else {
            dense_ffn(m, st, be, il, n);
        }
        be_add(be, st->x, st->tmp, (size_t)n * E);
    }
    if (!logits) return 0; /* an intermediate prompt chunk */
    /* only the rows whose logits are wanted go through the output head */
    const float *rows = all_logits ? st->x : st->x + (size_t)(n - 1) * E;
    int n_out = all_logits ? n : 1;
    be_rmsnorm(be, rows, &m->output_norm, n_out, hp->n_embd, hp->rms_eps, st->cur);
    be_matmul(be, &m->output, st->cur, n_out, logits);
    return 0;
}
