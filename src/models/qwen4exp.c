/* qwen4exp (Qwen3.8-Flash-Next, HF qwen4_exp), as llama.cpp's qwen4exp graph computes it:
 *
 *   x = hc copies of embed(token)                                    the wide residual
 *   per layer:  [n-gram injection, on its one layer]                 (ngram.c)
 *               m = hc_read_attn(x);  o = GatedDeltaNet(m) or QSA gated attention(m)
 *               hc_write_attn(x, o)                                   (hyperconn.c, qsa.c)
 *               m = hc_read_ffn(x);   o = routed experts(m) + sigmoid(g.m) shared(m)
 *               hc_write_ffn(x, o)                                    (models/moe.c)
 *   logits = W_out hc_read_out(x)                                    no output norm
 *
 * The Gated DeltaNet layers are qwen35moe's (models/gated_deltanet.c: tiled value heads, the
 * same gates) with a sigmoid output gate. MoE: softmax router over all experts, top-k
 * renormalized, SwiGLU experts through the expert store, a sigmoid-gated shared expert.
 * The MTP block (nextn_predict_layers) is bound only when the model is loaded for speculative
 * decoding (params.mtp > 0, qwen4exp_mtp.c); it then follows every trunk pass. Otherwise its
 * routed experts are in the expert layout but never acquired, and out of the plan's floor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/error.h"
#include "models/qwen4exp.h"
#include "runtime/ngram_table.h"

/* ---- loading ------------------------------------------------------------------------------ */

/* llama.cpp's interleaved M-RoPE picks, per rotary pair, the position of one of the sections
 * t, h, w (or a fourth, "e"). A text token has the same position in t, h and w and 0 in e, so
 * when every pair falls in t, h or w the rotation is NeoX RoPE at the token position, which is
 * what we compute; any other layout is refused rather than silently computed wrong. */
static bool check_rope_sections(sluice_model *m, char *err, size_t n) {
    char key[160];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", m->arch_name);
    const gguf_kv *kv = gguf_find(m->gguf, key);
    if (!kv) return true;
    int64_t s[4] = {0, 0, 0, 0};
    for (uint64_t i = 0; i < 4 && kv->type == GGUF_VT_ARRAY && i < kv->arr_n; i++)
        if (!gguf_arr_get_i64(kv, i, &s[i]) || s[i] < 0) s[i] = 0;
    const int64_t dims = s[0] + s[1] + s[2] + s[3];
    if (dims == 0) return true;
    for (int ic = 0; ic < m->hp.n_rot / 2; ic++) {
        const int64_t sec = ic % dims;
        const bool text = (sec % 3 == 0 && sec < 3 * s[0]) || (sec % 3 == 1 && sec < 3 * s[1]) ||
                          (sec % 3 == 2 && sec < 3 * s[2]);
        if (!text) {
            snprintf(err, n, "rope sections [%lld, %lld, %lld, %lld] rotate pair %d by the fourth "
                     "section, which sluice does not implement", (long long)s[0], (long long)s[1],
                     (long long)s[2], (long long)s[3], ic);
            return false;
        }
    }
    return true;
}

static bool load_hparams(sluice_model *m, char *err, size_t n) {
    hparams *hp = &m->hp;
    q4x_model *q = q4x_of(m);
    if (!hybrid_load_hparams(m, &q->nextn, err, n) ||
        !ld_int(m, "hyper_connection.count", &q->hc, true, err, n) ||
        !ld_int(m, "hyper_connection.low_rank", &q->hc_rank, true, err, n) ||
        !ld_int(m, "attention.indexer.head_count", &q->idx_n_head, true, err, n) ||
        !ld_int(m, "attention.indexer.key_length", &q->idx_dim, true, err, n) ||
        !ld_int(m, "attention.indexer.top_k", &q->idx_top_k, true, err, n))
        return false;
    /* llama.cpp: a single stream has nothing to mix; the indexer sizes must be set */
    if (q->hc < 2 || q->hc > 16 || q->hc_rank < 1 || q->hc_rank > (1 << 16) ||
        q->idx_n_head < 1 || q->idx_n_head > 256 || q->idx_dim < 2 || q->idx_dim > 4096 ||
        q->idx_top_k < 1 || q->idx_top_k > (1 << 24) || (int64_t)q->hc * hp->n_embd > (1 << 24)) {
        snprintf(err, n, "invalid qwen4exp shape: %d hyper-connection streams of rank %d, indexer "
                 "%d heads of %d, top_k %d", q->hc, q->hc_rank, q->idx_n_head, q->idx_dim,
                 q->idx_top_k);
        return false;
    }
    hp->ssm_kv_tiled = true;     /* value head h reads key head h % n_k_head, as qwen35moe */
    hp->ssm_gate_sigmoid = true; /* rmsnorm(o) * sigmoid(z) */
    return check_rope_sections(m, err, n);
}

/* Per-layer QSA block sizes ("attention.compress_ratios", 0 = dense; absent: all dense). */
static bool load_compress(sluice_model *m, char *err, size_t n) {
    q4x_model *q = q4x_of(m);
    char key[160];
    snprintf(key, sizeof key, "%s.attention.compress_ratios", m->arch_name);
    const gguf_kv *kv = gguf_find(m->gguf, key);
    q->max_compress = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        int64_t r = 0;
        if (kv && !(kv->type == GGUF_VT_ARRAY
                        ? (uint64_t)il < kv->arr_n && gguf_arr_get_i64(kv, (uint64_t)il, &r)
                        : gguf_get_i64(m->gguf, key, &r))) {
            snprintf(err, n, "metadata key '%s' has no ratio for layer %d", key, il);
            return false;
        }
        if (r < 0 || r > 64) {
            snprintf(err, n, "metadata key '%s': ratio %lld for layer %d is outside 0..64", key,
                     (long long)r, il);
            return false;
        }
        q->layers[il].compress = m->layers[il].recurrent ? 0 : (int)r;
        if (q->layers[il].compress > q->max_compress) q->max_compress = q->layers[il].compress;
    }
    return true;
}

static int qwen4exp_load(sluice_model *m, char *err, size_t n) {
    q4x_model *q = calloc(1, sizeof *q);
    if (!q || !ld_own(m, q)) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    m->arch_priv = q;
    hparams *hp = &m->hp;
    if (!load_hparams(m, err, n)) return -1;
    /* token embedding and output head (untied; tied when output is absent); no output norm */
    if (!ld_tensor(m, &m->tok_embd, true, hp->n_embd, 0, -1, err, n, "token_embd.weight"))
        return -1;
    hp->n_vocab = (int)m->tok_embd.ne[1];
    if (!ld_tensor(m, &m->output, false, hp->n_embd, hp->n_vocab, -1, err, n, "output.weight"))
        return -1;
    if (!m->output.data) m->output = m->tok_embd;
    /* the MTP block's layer follows the trunk's (bound only for speculative decoding) */
    m->layers = calloc((size_t)(hp->n_layer + q->nextn), sizeof *m->layers);
    q->layers = calloc((size_t)(hp->n_layer + q->nextn), sizeof *q->layers);
    if (!m->layers || !q->layers || !ld_own(m, q->layers)) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    if (!hybrid_layer_pattern(m, err, n) || !load_compress(m, err, n) ||
        !hc_load(m, &q->out_hc, false, err, n, "output_hc"))
        return -1;
    for (int il = 0; il < hp->n_layer; il++) {
        char pa[32], pf[32];
        snprintf(pa, sizeof pa, "blk.%d.hc_attn", il);
        snprintf(pf, sizeof pf, "blk.%d.hc_ffn", il);
        if (!hc_load(m, &q->layers[il].attn, true, err, n, pa) ||
            !hc_load(m, &q->layers[il].ffn, true, err, n, pf) ||
            !(m->layers[il].recurrent ? gdn_load_layer(m, il, false, err, n)
                                      : qsa_load_layer(m, il, err, n)) ||
            !hybrid_load_moe_layer(m, il, err, n))
            return -1;
    }
    if (!ngram_load(m, err, n)) return -1;
    /* the routed experts, the MTP block's included (accounted for, never acquired) */
    const int trunk = hp->n_layer;
    hp->n_layer = trunk + q->nextn;
    const bool ok = ld_experts(m, true, err, n);
    hp->n_layer = trunk;
    if (!ok) return -1;
    if (m->params.mtp > 0 && !mtp_load(m, err, n)) return -1;
    return 0;
}

/* After the plan: the n-gram table's tier (the planner decides; model.c has set
 * m->plan.ngram_resident and the cache size). */
static int qwen4exp_bind(sluice_model *m, char *err, size_t n) {
    const q4x_model *q = q4x_of(m);
    if (!mtp_draft_head_bind(m, err, n) || !mtp_verify_head_bind(m, err, n)) return -1;
    if (q->ple_layer < 0) return 0;
    const uint64_t rows = (uint64_t)q->table.ne[1], rb = q->table.row_bytes;
    if (m->plan.ngram_resident || !m->path) {
        m->ngram = ngram_table_resident(q->table.data, rb, rows);
        if (!m->ngram) snprintf(err, n, "out of memory");
        return m->ngram ? 0 : -1;
    }
    ngram_stream_params p = {.path = m->path, .offset = q->table_offset, .row_bytes = rb,
                             .n_rows = rows, .cache_rows = m->plan.ngram_cache_rows,
                             .io_mode = m->params.io == SLUICE_IO_PAGE ? 1 : 0,
                             .io_depth = m->params.io_depth};
    m->ngram = ngram_table_stream(&p, err, n);
    return m->ngram ? 0 : -1;
}

static void qwen4exp_unload(sluice_model *m) {
    mtp_draft_head_free(m);
    ngram_table_free(m->ngram);
    m->ngram = NULL;
}

/* ---- per-session state -------------------------------------------------------------------- */

static int n_indexed(const sluice_model *m) {
    const q4x_model *q = q4x_of(m);
    int k = 0;
    for (int il = 0; il < m->hp.n_layer; il++) k += q->layers[il].compress > 0;
    return k;
}

/* Positions of block keys an indexer layer keeps for n_ctx positions (the smallest ratio). */
static uint64_t blocks_for(const sluice_model *m, int n_ctx) {
    const q4x_model *q = q4x_of(m);
    int rmin = 0;
    for (int il = 0; il < m->hp.n_layer; il++)
        if (q->layers[il].compress > 0 && (rmin == 0 || q->layers[il].compress < rmin))
            rmin = q->layers[il].compress;
    return rmin ? (uint64_t)n_ctx / (uint64_t)rmin + 1 : 0;
}

static uint64_t q4x_recurrent_bytes(const sluice_model *m) {
    const hparams *hp = &m->hp;
    const q4x_model *q = q4x_of(m);
    const uint64_t per_layer = (uint64_t)hp->ssm_n_v_head * hp->ssm_d_v * hp->ssm_d_k +
                               (uint64_t)(hp->ssm_kernel - 1) * (uint64_t)hybrid_conv_dim(hp);
    uint64_t b = (uint64_t)hp->n_layer_recurrent * per_layer;
    if (q->ple_layer >= 0) /* the n-gram conv history */
        b += (uint64_t)(q->ple_kernel - 1) * q->ngram_size * (uint64_t)q->hc * hp->n_embd;
    return b * sizeof(float);
}

static uint64_t q4x_state_bytes(const sluice_model *m, int n_ctx) {
    const hparams *hp = &m->hp;
    const q4x_model *q = q4x_of(m);
    const uint64_t kv = (uint64_t)(hp->n_layer - hp->n_layer_recurrent) * (uint64_t)n_ctx *
                        (uint64_t)hp->n_head_kv * (uint64_t)(hp->head_dim_k + hp->head_dim_v);
    const uint64_t idx = (uint64_t)n_indexed(m) * ((uint64_t)n_ctx + blocks_for(m, n_ctx)) *
                         (uint64_t)q->idx_dim;
    return (kv + idx) * sizeof(float) + q4x_recurrent_bytes(m) + mtp_state_bytes(m, n_ctx);
}

static void q4x_state_free(model_state *st) {
    if (!st) return;
    backend *be = st->be;
    struct hybrid_state *H = st->hybrid;
    mtp_state_free(st);
    if (H) {
        float *bufs[] = {H->conv, H->ssm, H->qkv, H->conv_out, H->lq, H->lk, H->lv, H->z,
                         H->beta, H->alpha, H->out, H->qg, H->gate};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) state_release(be, bufs[i]);
        free(H->slot);
        free(H);
    }
    q4x_state *xs = st->arch_state;
    if (xs) {
        void *bufs[] = {xs->xn, xs->hgate, xs->lo, xs->inject, xs->idx_kraw, xs->idx_kblk,
                        xs->idx_q, xs->idx_knew, xs->sel, xs->sel_n, xs->ple_emb, xs->ple_val,
                        xs->ple_gated, xs->ple_hist};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) state_release(be, bufs[i]);
        free(xs->idx_slot);
        free(xs->dense_h);
        free(xs->rows_h);
        free(xs->raw_h);
        free(xs->emb_h);
        free(xs);
    }
    void *std_bufs[] = {st->kv_k, st->kv_v, st->x, st->cur, st->tmp, st->q, st->k, st->v,
                        st->attn, st->ff_a, st->ff_b, st->router, st->moe_ids, st->moe_w,
                        st->moe_slots, st->moe_x, st->moe_y, st->moe_rows, st->logits,
                        st->shexp_gate, st->shexp_out};
    for (size_t i = 0; i < sizeof std_bufs / sizeof std_bufs[0]; i++) state_release(be, std_bufs[i]);
    moe_state_release(st);
    free(st);
}

static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

/* The standard buffers and the linear-attention ones (as the hybrid models allocate them). */
static bool alloc_common(const sluice_model *m, model_state *st, struct hybrid_state *H) {
    const hparams *hp = &m->hp;
    const q4x_model *q = q4x_of(m);
    backend *be = st->be;
    const size_t B = (size_t)st->n_batch, F = sizeof(float), E = (size_t)hp->n_embd;
    const size_t W = (size_t)q->hc * E;
    const size_t ff = max_z(max_z((size_t)hp->n_ff, (size_t)hp->n_ff_exp), (size_t)hp->n_ff_shexp);
    const size_t k_used = (size_t)hp->n_expert_used, Q = (size_t)hp->n_head * hp->head_dim_k;
    const size_t KD = (size_t)hp->ssm_n_k_head * hp->ssm_d_k;
    const size_t VD = (size_t)hp->ssm_n_v_head * hp->ssm_d_v, CD = (size_t)hybrid_conv_dim(hp);
    const int n_lay = hp->n_layer + (q->mtp ? 1 : 0); /* the MTP block: one more KV layer */
    H->slot = calloc((size_t)n_lay, sizeof *H->slot);
    if (!H->slot) return false;
    int n_rec = 0, n_attn = 0;
    for (int il = 0; il < n_lay; il++)
        H->slot[il] = m->layers[il].recurrent ? n_rec++ : n_attn++;
    H->n_attn = n_attn;
    H->n_rec = n_rec;
    H->conv_len = (size_t)(hp->ssm_kernel - 1) * CD;
    H->ssm_len = (size_t)hp->ssm_n_v_head * hp->ssm_d_v * hp->ssm_d_k;
    st->kv_row_k = (size_t)hp->n_head_kv * hp->head_dim_k;
    st->kv_row_v = (size_t)hp->n_head_kv * hp->head_dim_v;
    const size_t C = (size_t)st->n_ctx;
    st->kv_k = state_alloc(be, max_z((size_t)n_attn * C * st->kv_row_k * F, F));
    st->kv_v = state_alloc(be, max_z((size_t)n_attn * C * st->kv_row_v * F, F));
    st->x = state_alloc(be, B * W * F); /* the wide residual */
    st->cur = state_alloc(be, B * E * F);
    st->tmp = state_alloc(be, B * E * F);
    st->q = state_alloc(be, B * Q * F);
    st->k = state_alloc(be, B * st->kv_row_k * F);
    st->v = state_alloc(be, B * st->kv_row_v * F);
    st->attn = state_alloc(be, B * (size_t)hp->n_head * hp->head_dim_v * F);
    st->ff_a = state_alloc(be, B * ff * F);
    st->ff_b = state_alloc(be, B * ff * F);
    if (!be->host_memory) st->logits = state_alloc(be, STATE_LOGIT_ROWS * (size_t)hp->n_vocab * F);
    st->router = state_alloc(be, B * hp->n_expert * F);
    st->moe_ids = state_alloc(be, (size_t)n_lay * B * k_used * sizeof(int32_t));
    st->moe_w = state_alloc(be, (size_t)n_lay * B * k_used * F); /* per layer (moe.c) */
    const bool table = be_has_expert_table(be);
    if (!table) {
        st->moe_slots = state_alloc(be, B * k_used * E * F);
        st->moe_x = state_alloc(be, B * E * F);
        st->moe_y = state_alloc(be, B * E * F);
        st->moe_rows = state_alloc(be, B * k_used * sizeof(int32_t));
    }
    st->shexp_gate = state_alloc(be, B * F);
    st->shexp_out = state_alloc(be, B * E * F);
    H->conv = state_alloc(be, max_z((size_t)n_rec * H->conv_len * F, F));
    H->ssm = state_alloc(be, max_z((size_t)n_rec * H->ssm_len * F, F));
    H->qkv = state_alloc(be, B * CD * F);
    H->conv_out = state_alloc(be, B * CD * F);
    H->lq = state_alloc(be, B * KD * F);
    H->lk = state_alloc(be, B * KD * F);
    H->lv = state_alloc(be, B * VD * F);
    H->z = state_alloc(be, B * VD * F);
    H->beta = state_alloc(be, B * hp->ssm_n_v_head * F);
    H->alpha = state_alloc(be, B * hp->ssm_n_v_head * F);
    H->out = state_alloc(be, B * VD * F);
    H->qg = state_alloc(be, B * 2 * Q * F);
    H->gate = state_alloc(be, B * Q * F);
    return st->kv_k && st->kv_v && st->x && st->cur && st->tmp && st->q && st->k && st->v &&
           st->attn && st->ff_a && st->ff_b && (st->logits || be->host_memory) && st->router &&
           st->moe_ids && st->moe_w &&
           (table || (st->moe_slots && st->moe_x && st->moe_y && st->moe_rows)) &&
           st->shexp_gate && st->shexp_out && H->conv && H->ssm && H->qkv && H->conv_out &&
           H->lq && H->lk && H->lv && H->z && H->beta && H->alpha && H->out && H->qg && H->gate;
}

/* Hyper-connection, indexer and n-gram buffers. */
static bool alloc_q4x(const sluice_model *m, model_state *st, q4x_state *xs) {
    const hparams *hp = &m->hp;
    const q4x_model *q = q4x_of(m);
    backend *be = st->be;
    const size_t B = (size_t)st->n_batch, F = sizeof(float), E = (size_t)hp->n_embd;
    const size_t W = (size_t)q->hc * E, D = (size_t)q->idx_dim;
    xs->xn = state_alloc(be, B * W * F);
    xs->hgate = state_alloc(be, B * W * F);
    xs->lo = state_alloc(be, B * (size_t)q->hc_rank * F);
    xs->inject = state_alloc(be, B * (size_t)q->hc * F);
    bool ok = xs->xn && xs->hgate && xs->lo && xs->inject;
    const int n_idx = n_indexed(m);
    xs->idx_slot = malloc((size_t)hp->n_layer * sizeof *xs->idx_slot);
    ok = ok && xs->idx_slot;
    for (int il = 0, k = 0; ok && il < hp->n_layer; il++)
        xs->idx_slot[il] = q->layers[il].compress > 0 ? k++ : -1;
    if (ok && n_idx > 0) {
        xs->kraw_len = (size_t)st->n_ctx * D;
        xs->kblk_len = (size_t)blocks_for(m, st->n_ctx) * D;
        xs->sel_stride = q->idx_top_k + q->max_compress - 1;
        xs->idx_kraw = state_alloc(be, (size_t)n_idx * xs->kraw_len * F);
        xs->idx_kblk = state_alloc(be, (size_t)n_idx * xs->kblk_len * F);
        xs->idx_q = state_alloc(be, B * (size_t)q->idx_n_head * D * F);
        xs->idx_knew = state_alloc(be, B * D * F);
        xs->sel = state_alloc(be, B * (size_t)xs->sel_stride * sizeof(int32_t));
        xs->sel_n = state_alloc(be, B * sizeof(int32_t));
        xs->dense_h = malloc(B * sizeof(int32_t));
        ok = xs->idx_kraw && xs->idx_kblk && xs->idx_q && xs->idx_knew && xs->sel && xs->sel_n &&
             xs->dense_h;
        for (size_t t = 0; ok && t < B; t++) xs->dense_h[t] = -1;
    }
    if (ok && q->ple_layer >= 0) {
        const size_t H = (size_t)q->ple_n_heads;
        xs->ple_emb = state_alloc(be, B * E * F);
        xs->ple_val = state_alloc(be, B * E * F);
        xs->ple_gated = state_alloc(be, B * W * F);
        xs->ple_hist_len = (size_t)(q->ple_kernel - 1) * q->ngram_size * W;
        xs->ple_hist = state_alloc(be, xs->ple_hist_len * F + F);
        xs->rows_h = malloc(B * H * sizeof(int32_t));
        xs->raw_h = malloc(B * H * q->table.row_bytes);
        xs->emb_h = malloc(B * E * F);
        ok = xs->ple_emb && xs->ple_val && xs->ple_gated && xs->ple_hist && xs->rows_h &&
             xs->raw_h && xs->emb_h;
    }
    return ok;
}

static model_state *q4x_state_new(const sluice_model *m, backend *be, int n_ctx, int n_batch) {
    if (!be_has_hc_ops(be)) {
        sluice_set_error("the %s backend lacks the qwen4exp operations", be->ops->name);
        return NULL;
    }
    model_state *st = calloc(1, sizeof *st);
    struct hybrid_state *H = calloc(1, sizeof *H);
    q4x_state *xs = calloc(1, sizeof *xs);
    if (!st || !H || !xs) {
        free(st);
        free(H);
        free(xs);
        return NULL;
    }
    st->hybrid = H;
    st->arch_state = xs;
    st->be = be;
    st->n_ctx = n_ctx;
    st->n_batch = n_batch;
    if (!alloc_common(m, st, H) || !alloc_q4x(m, st, xs) ||
        (q4x_of(m)->mtp && !mtp_state_alloc(m, st))) {
        q4x_state_free(st);
        return NULL;
    }
    return st;
}

/* A new timeline: zero recurrent state and n-gram history (caches past the position are never
 * read, block keys are rebuilt as blocks complete). */
static void q4x_state_reset(model_state *st) {
    struct hybrid_state *H = st->hybrid;
    q4x_state *xs = st->arch_state;
    be_memzero(st->be, H->conv, (size_t)H->n_rec * H->conv_len * sizeof(float));
    be_memzero(st->be, H->ssm, (size_t)H->n_rec * H->ssm_len * sizeof(float));
    if (xs->ple_hist) be_memzero(st->be, xs->ple_hist, xs->ple_hist_len * sizeof(float));
    xs->n_prev = 0;
    xs->mtp_pend = 0;
    H->ck_n = xs->ck_n = 0;
}

/* ---- forward ------------------------------------------------------------------------------ */

/* The n-gram rows of a batch, and the start of their reads (before layer 0). */
static void rows_and_prefetch(const sluice_model *m, model_state *st, const int32_t *tokens,
                              int n) {
    const q4x_model *q = q4x_of(m);
    q4x_state *xs = st->arch_state;
    ngram_batch_rows(q, xs, tokens, n, xs->rows_h);
    ngram_table_prefetch(m->ngram, xs->rows_h, n * q->ple_n_heads);
}

/* The tokens a session is about to evaluate, beyond one batch: their rows' reads start now. */
static void q4x_prefetch(const sluice_model *m, model_state *st, const int32_t *tokens, int n) {
    const q4x_model *q = q4x_of(m);
    if (q->ple_layer < 0 || !m->ngram || !ngram_table_streaming(m->ngram)) return;
    q4x_state *xs = st->arch_state;
    int32_t rows[Q4X_MAX_HEADS * 64];
    const int per = (int)(sizeof rows / sizeof rows[0]) / q->ple_n_heads;
    q4x_state hist = *xs; /* history copy: the batch rows must not advance the real one */
    for (int t0 = 0; t0 < n; t0 += per) {
        const int k = n - t0 < per ? n - t0 : per;
        ngram_batch_rows(q, &hist, tokens + t0, k, rows);
        ngram_table_prefetch(m->ngram, rows, k * q->ple_n_heads);
        ngram_advance(q, &hist, tokens + t0, k);
    }
}

/* Decoding: the next token is one of the likeliest now, and its n-gram rows depend only on it
 * and on the tokens already known, so the reads of the rows of the best few candidates start
 * here, a whole forward pass before the n-gram layer needs them (greedy decoding always
 * picks the first; a sampled token outside them is read on demand as before). */
#define Q4X_NEXT_CANDIDATES 4
static void prefetch_candidates(const sluice_model *m, model_state *st, const float *logits) {
    const q4x_model *q = q4x_of(m);
    if (!m->ngram || !ngram_table_streaming(m->ngram)) return;
    int32_t best[Q4X_NEXT_CANDIDATES];
    float val[Q4X_NEXT_CANDIDATES];
    int k = 0;
    for (int32_t v = 0; v < m->hp.n_vocab; v++) {
        const float x = logits[v];
        if (k == Q4X_NEXT_CANDIDATES && !(x > val[k - 1])) continue;
        int i = k < Q4X_NEXT_CANDIDATES ? k++ : k - 1;
        while (i > 0 && x > val[i - 1]) {
            val[i] = val[i - 1];
            best[i] = best[i - 1];
            i--;
        }
        val[i] = x;
        best[i] = v;
    }
    int32_t rows[Q4X_NEXT_CANDIDATES * Q4X_MAX_HEADS];
    for (int c = 0; c < k; c++)
        ngram_batch_rows(q, st->arch_state, &best[c], 1, rows + (size_t)c * q->ple_n_heads);
    ngram_table_prefetch(m->ngram, rows, k * q->ple_n_heads);
}

/* logits of n_out rows of mixed output (backend memory) */
static void output_logits(const sluice_model *m, model_state *st, backend *be, const float *rows,
                          int n_out, float *logits) {
    const size_t V = (size_t)m->hp.n_vocab;
    if (be->host_memory) {
        be_matmul(be, mtp_head_for(m, n_out), rows, n_out, logits);
        return;
    }
    for (int r0 = 0; r0 < n_out; r0 += STATE_LOGIT_ROWS) {
        const int nr = n_out - r0 < STATE_LOGIT_ROWS ? n_out - r0 : STATE_LOGIT_ROWS;
        be_matmul(be, &m->output, rows + (size_t)r0 * m->hp.n_embd, nr, st->logits);
        be_download(be, logits + (size_t)r0 * V, st->logits, (size_t)nr * V * sizeof(float));
    }
    /* one row (a decode step): its greedy pick on the device too (sluice_session_argmax) */
    if (n_out == 1 && st->argmax_host && be->ops->argmax_row) be->ops->argmax_row(be, st->logits, (int)V, st->argmax_host);
}

static int q4x_forward(const sluice_model *m, model_state *st, backend *be,
                       const int32_t *tokens, int n, int pos0, float *logits, bool all_logits) {
    const hparams *hp = &m->hp;
    const q4x_model *q = q4x_of(m);
    q4x_state *xs = st->arch_state;
    const size_t E = (size_t)hp->n_embd, W = (size_t)q->hc * E;
    const int32_t *ids;
    be_set_inputs(be, tokens, n, pos0, &ids, &st->pos);
    st->pos0 = pos0;
    if (q->ple_layer >= 0) rows_and_prefetch(m, st, tokens, n);
    /* the wide residual starts as hc copies of the embedding */
    be_embed(be, &m->tok_embd, ids, n, st->cur);
    moe_lookahead_start(m, st, be, st->cur, n);
    for (int s = 0; s < q->hc; s++)
        be_copy_rows(be, st->x + (size_t)s * E, W, st->cur, E, n, (int)E);
    for (int il = 0; il < hp->n_layer; il++) {
        const q4x_layer *X = &q->layers[il];
        if (il == q->ple_layer && ngram_forward(m, st, be, n, pos0) != 0) return -1;
        hc_read(m, st, be, &X->attn, st->x, n, st->cur);
        if (m->layers[il].recurrent) gdn_layer_forward(m, st, be, il, n);
        else qsa_attention(m, st, be, il, n, pos0, false);
        hc_write(m, st, be, st->tmp, n);
        hc_read(m, st, be, &X->ffn, st->x, n, st->cur);
        if (moe_forward(m, st, be, il, st->cur, n, st->tmp, NULL, NULL, NULL) != 0) return -1;
        hc_write(m, st, be, st->tmp, n);
    }
    if (q->ple_layer >= 0) ngram_advance(q, xs, tokens, n);
    struct hybrid_state *H = st->hybrid;
    if (H->ck_n != n) H->ck_n = xs->ck_n = 0; /* checkpoints only for the pass they were set for */
    /* the MTP block follows the trunk (its KV cache for the positions now complete) */
    if (q->mtp && mtp_follow(m, st, be, tokens, n, pos0) != 0) return -1;
    if (!logits) return 0; /* an intermediate prompt chunk */
    /* the final mixer is the output norm; only the rows whose logits are wanted */
    const int n_out = all_logits ? n : 1;
    const float *rows = all_logits ? st->x : st->x + (size_t)(n - 1) * W;
    hc_read(m, st, be, &q->out_hc, rows, n_out, st->cur);
    output_logits(m, st, be, st->cur, n_out, logits);
    if (q->ple_layer >= 0) prefetch_candidates(m, st, logits + (size_t)(n_out - 1) * hp->n_vocab);
    return 0;
}

/* ---- planning ------------------------------------------------------------------------------ */

static void q4x_plan_facts(const sluice_model *m, plan_model_facts *f) {
    const hparams *hp = &m->hp;
    const q4x_model *q = q4x_of(m);
    const uint64_t E = (uint64_t)hp->n_embd, W = (uint64_t)q->hc * E;
    /* wide residual beyond the generic n_embd, hyper-connection buffers, indexer, n-gram */
    uint64_t extra = 4 * ((W - E) + 2 * W + (uint64_t)q->hc_rank + (uint64_t)q->hc);
    if (n_indexed(m) > 0)
        extra += 4 * ((uint64_t)q->idx_n_head * q->idx_dim + q->idx_dim + 1) +
                 4 * (uint64_t)(q->idx_top_k + q->max_compress - 1);
    if (q->ple_layer >= 0) {
        extra += 4 * (2 * E + W) + 4 * E + (uint64_t)q->ple_n_heads * (4 + q->table.row_bytes);
        f->ngram_bytes = q->table.mat_bytes;
        f->ngram_row_bytes = q->table.row_bytes;
        f->ngram_rows_per_token = q->ple_n_heads;
    }
    if (q->mtp) { /* its trunk residual rows, its own residual, eh_proj's inputs */
        extra += 4 * (2 * W + 2 * W);
        f->scratch_fixed += mtp_draft_head_bytes(m); /* the drafts' 2-bit head */
    }
    f->scratch_per_token += extra;
    /* the MTP block's experts are acquired only with speculative decoding: then they count in
     * the cache's floor and target like a trunk layer's, else not at all */
    if (q->nextn > 0 && !q->mtp && f->n_moe_layers > q->nextn) f->n_moe_layers -= q->nextn;
}

static int q4x_mtp_blocks(const sluice_model *m) { return q4x_of(m)->mtp ? 1 : 0; }

const arch_desc arch_qwen4exp = {
    .name = "qwen4exp",
    .load = qwen4exp_load,
    .state_bytes = q4x_state_bytes,
    .state_new = q4x_state_new,
    .state_free = q4x_state_free,
    .state_reset = q4x_state_reset,
    .recurrent_bytes = q4x_recurrent_bytes,
    .forward = q4x_forward,
    .prefetch = q4x_prefetch,
    .plan_facts = q4x_plan_facts,
    .bind = qwen4exp_bind,
    .unload = qwen4exp_unload,
    .mtp_blocks = q4x_mtp_blocks,
    .mtp_draft = mtp_draft,
    .spec_begin = mtp_spec_begin,
    .spec_keep = mtp_spec_keep,
};

/* ---- observation (tests) -------------------------------------------------------------------- */

void qwen4exp_observe(model_state *st, q4x_qsa_fn qsa_fn, void *qsa_ctx, q4x_rows_fn rows_fn,
                      void *rows_ctx) {
    q4x_state *xs = st->arch_state;
    xs->qsa_fn = qsa_fn;
    xs->qsa_ctx = qsa_ctx;
    xs->rows_fn = rows_fn;
    xs->rows_ctx = rows_ctx;
}

void qwen4exp_edit_qsa(model_state *st, q4x_qsa_edit_fn fn, void *ctx) {
    q4x_state *xs = st->arch_state;
    xs->qsa_edit = fn;
    xs->qsa_edit_ctx = ctx;
}
