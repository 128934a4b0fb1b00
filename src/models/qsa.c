/* qwen4exp's gated attention with the QSA block-sparse indexer (llama.cpp's qwen4exp graph).
 *
 * Main attention, as qwen35moe's gated attention:
 *   [q | gate] per head = Wq x;  q = rope(rmsnorm_q(q)), k = rope(rmsnorm_k(Wk x)), v = Wv x
 *   y = Wo (attention(q, k, v over the selected cells) * sigmoid(gate))
 * Indexer (one key head of idx_dim, idx_n_head query heads):
 *   raw keys Wk_idx x are cached un-normalized; when a block of `compress` consecutive positions
 *   completes, its key = rope(rmsnorm(mean of the raw keys) * k_norm) at the block's first
 *   position; queries = rope(rmsnorm(Wq_idx x) * q_norm) at the token's position;
 *   block score = sum over heads of relu(q_h . k_block) for the complete blocks before the
 *   token's own incomplete tail; the tail is always attended; llama.cpp keeps the best
 *   top_k + compress - 1 cells (backend.h: qsa_select). Below that many visible positions the
 *   attention is exactly dense.
 * RoPE: llama.cpp's interleaved M-RoPE; for text every section rotates by the token position,
 * which is NeoX rotation of the first n_rot dims (the indexer rotates the same n_rot dims of its
 * smaller heads). */
#include <math.h>
#include <stdio.h>

#include "models/qwen4exp.h"

bool qsa_load_layer(sluice_model *m, int il, char *err, size_t n) {
    const hparams *hp = &m->hp;
    q4x_model *q = q4x_of(m);
    layer_weights *L = &m->layers[il];
    q4x_layer *X = &q->layers[il];
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim_k,
                  K = (int64_t)hp->n_head_kv * hp->head_dim_k,
                  V = (int64_t)hp->n_head_kv * hp->head_dim_v, D = q->idx_dim;
    if (!ld_tensor(m, &L->wq, true, E, 2 * Q, -1, err, n, "blk.%d.attn_q.weight", il) ||
        !ld_tensor(m, &L->wk, true, E, K, -1, err, n, "blk.%d.attn_k.weight", il) ||
        !ld_tensor(m, &L->wv, true, E, V, -1, err, n, "blk.%d.attn_v.weight", il) ||
        !ld_tensor(m, &L->wo, true, Q, E, -1, err, n, "blk.%d.attn_output.weight", il) ||
        !ld_tensor(m, &L->q_norm, true, hp->head_dim_k, -1, -1, err, n,
                   "blk.%d.attn_q_norm.weight", il) ||
        !ld_tensor(m, &L->k_norm, true, hp->head_dim_k, -1, -1, err, n,
                   "blk.%d.attn_k_norm.weight", il))
        return false;
    if (X->compress == 0) return true; /* dense attention: the indexer is not used */
    if (!ld_tensor(m, &X->idx_q, true, E, (int64_t)q->idx_n_head * D, -1, err, n,
                   "blk.%d.indexer.q_proj.weight", il) ||
        !ld_tensor(m, &X->idx_k, true, E, D, -1, err, n, "blk.%d.indexer.k_proj.weight", il) ||
        !ld_tensor(m, &X->idx_q_norm, true, D, -1, -1, err, n, "blk.%d.indexer.q_norm.weight",
                   il) ||
        !ld_tensor(m, &X->idx_k_norm, true, D, -1, -1, err, n, "blk.%d.indexer.k_norm.weight",
                   il))
        return false;
    if (hp->n_rot > D) {
        snprintf(err, n, "layer %d: %d rotary dims exceed the indexer head of %d", il, hp->n_rot,
                 (int)D);
        return false;
    }
    return true;
}

/* The indexer of layer il for a batch: cache the raw keys, pool the blocks the batch
 * completes, and (unless keys_only) choose each token's cells (xs->sel, xs->sel_n). */
static void indexer(const sluice_model *m, model_state *st, backend *be, int il, int n, int pos0,
                    bool keys_only) {
    const hparams *hp = &m->hp;
    const q4x_model *q = q4x_of(m);
    const q4x_layer *X = &q->layers[il];
    q4x_state *xs = q4x_state_of(st);
    const int D = q->idx_dim, r = X->compress, slot = xs->idx_slot[il];
    float *kraw = xs->idx_kraw + (size_t)slot * xs->kraw_len;
    float *kblk = xs->idx_kblk + (size_t)slot * xs->kblk_len;
    be_matmul(be, &X->idx_k, st->cur, n, xs->idx_knew);
    be_copy_rows(be, kraw + (size_t)pos0 * D, (size_t)D, xs->idx_knew, (size_t)D, n, D);
    const int b0 = pos0 / r, b1 = (pos0 + n) / r; /* blocks complete before / after */
    if (b1 > b0)
        be->ops->qsa_pool(be, kraw, b0, b1 - b0, r, D, X->idx_k_norm.data, hp->rms_eps,
                          hp->n_rot, hp->rope_base, kblk);
    if (keys_only) return;
    const int width = q->idx_top_k + r - 1;
    if (pos0 + n <= width) { /* every token sees at most the budget: dense, no scores */
        be_upload(be, xs->sel_n, xs->dense_h, (size_t)n * sizeof(int32_t));
        return;
    }
    be_matmul(be, &X->idx_q, st->cur, n, xs->idx_q);
    be_rmsnorm(be, xs->idx_q, &X->idx_q_norm, n * q->idx_n_head, D, hp->rms_eps, xs->idx_q);
    be_rope(be, xs->idx_q, n, q->idx_n_head, D, hp->n_rot, st->pos, hp->rope_base, hp->rope);
    be->ops->qsa_select(be, xs->idx_q, kblk, n, pos0, q->idx_n_head, D, r, q->idx_top_k,
                        xs->sel, xs->sel_n, xs->sel_stride);
}

/* Let the editor replace the selection, then hand it to the observer (tests). */
static void observe(const sluice_model *m, model_state *st, int il, int n, int pos0) {
    q4x_state *xs = q4x_state_of(st);
    if (!xs->qsa_fn && !xs->qsa_edit) return;
    enum { CAP = 4096 };
    const int cap = xs->sel_stride < CAP ? xs->sel_stride : CAP;
    for (int t = 0; t < n; t++) {
        int32_t cnt, sel[CAP];
        int32_t *dst = xs->sel + (size_t)t * xs->sel_stride;
        be_download(st->be, &cnt, xs->sel_n + t, sizeof cnt);
        if (cnt > CAP) cnt = CAP;
        if (cnt > 0) be_download(st->be, sel, dst, (size_t)cnt * sizeof *sel);
        if (xs->qsa_edit) {
            int k = xs->qsa_edit(xs->qsa_edit_ctx, il, pos0 + t, sel, cnt, cap);
            cnt = k < 0 ? -1 : k > cap ? cap : k;
            if (cnt > 0) be_upload(st->be, dst, sel, (size_t)cnt * sizeof *sel);
            be_upload(st->be, xs->sel_n + t, &cnt, sizeof cnt);
        }
        if (xs->qsa_fn) xs->qsa_fn(xs->qsa_ctx, il, pos0 + t, cnt < 0 ? NULL : sel, cnt);
    }
    (void)m;
}

void qsa_attention(const sluice_model *m, model_state *st, backend *be, int il, int n, int pos0,
                   bool kv_only) {
    const hparams *hp = &m->hp;
    const q4x_model *q = q4x_of(m);
    const layer_weights *L = &m->layers[il];
    struct hybrid_state *H = st->hybrid;
    q4x_state *xs = q4x_state_of(st);
    const int nh = hp->n_head, hd = hp->head_dim_k;
    const bool sparse = q->layers[il].compress > 0;
    if (sparse) indexer(m, st, be, il, n, pos0, kv_only);
    const int slot = H->slot[il];
    float *kc = st->kv_k + (size_t)slot * st->n_ctx * st->kv_row_k;
    float *vc = st->kv_v + (size_t)slot * st->n_ctx * st->kv_row_v;
    /* the keys and values first: all that later positions read (kv_only stops there) */
    be_matmul(be, &L->wk, st->cur, n, st->k);
    be_matmul(be, &L->wv, st->cur, n, st->v);
    be_rmsnorm(be, st->k, &L->k_norm, n * hp->n_head_kv, hd, hp->rms_eps, st->k);
    be_rope(be, st->k, n, hp->n_head_kv, hd, hp->n_rot, st->pos, hp->rope_base, hp->rope);
    be_kv_store(be, kc, vc, st->k, st->v, n, st->pos, st->kv_row_k, st->kv_row_v);
    if (kv_only) return;

    be_matmul(be, &L->wq, st->cur, n, H->qg);
    /* each head's rows are [query (hd) | gate (hd)] */
    be_copy_rows(be, st->q, (size_t)hd, H->qg, (size_t)2 * hd, n * nh, hd);
    be_copy_rows(be, H->gate, (size_t)hd, H->qg + hd, (size_t)2 * hd, n * nh, hd);
    be_rmsnorm(be, st->q, &L->q_norm, n * nh, hd, hp->rms_eps, st->q);
    be_rope(be, st->q, n, nh, hd, hp->n_rot, st->pos, hp->rope_base, hp->rope);
    const float scale = 1.0f / sqrtf((float)hd);
    if (sparse) {
        observe(m, st, il, n, pos0);
        be->ops->attention_sel(be, st->q, kc, vc, n, pos0, nh, hp->n_head_kv, hd, hp->head_dim_v,
                               scale, xs->sel, xs->sel_n, xs->sel_stride, st->attn);
    } else {
        be_attention(be, st->q, kc, vc, n, pos0, nh, hp->n_head_kv, hd, hp->head_dim_v, scale,
                     st->attn);
    }
    be_sigmoid_mul(be, st->attn, H->gate, n, nh * hd, nh * hd);
    be_matmul(be, &L->wo, st->attn, n, st->tmp);
}
