/* qwen35moe (Qwen3.5/3.6-MoE, e.g. Qwen3.6-35B-A3B) and qwen3next (Qwen3-Next): hybrid
 * decoders. Most layers are Gated DeltaNet (models/gated_deltanet.c); every
 * full_attention_interval-th layer (or as the per-layer flag array says) is gated attention:
 *
 *   [q | gate] per head = Wq x;  q = rope(rmsnorm_q(q)), k = rope(rmsnorm_k(Wk x)), v = Wv x
 *   y = Wo (attention(q, k, v) * sigmoid(gate))            RoPE: NeoX on the first n_rot dims
 *
 * Both mixers sit in the same pre-norm block (attn_norm, then post_attention_norm before the
 * MoE, each with a residual), and every MoE adds a sigmoid-gated shared expert (models/moe.c).
 *
 * GGUF facts the fixtures confirm: norm weights are used as stored (the +1 of zero-centred
 * norms is already in them); the router is softmax, top-k, renormalized; qwen35moe files tile
 * the value heads (value head h reads key head h % n_k_head), qwen3next files group them
 * (h / (n_v_head / n_k_head)). The MTP block (nextn_predict_layers) is not part of the main
 * pass: its tensors are not bound (its routed experts are only accounted for in the expert
 * layout). For text, qwen35moe's multi-section RoPE equals NeoX RoPE. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/hybrid.h"

/* ---- loading ------------------------------------------------------------------------------ */

/* Which layers are recurrent: "<arch>.attention.recurrent_layers" (an array with a flag per
 * layer, or one value for all) when present, else every full_attention_interval-th layer is
 * attention (interval 4 when absent), as llama.cpp decides. */
bool hybrid_layer_pattern(sluice_model *m, char *err, size_t n) {
    hparams *hp = &m->hp;
    char key[160];
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", m->arch_name);
    const gguf_kv *kv = gguf_find(m->gguf, key);
    if (kv) {
        for (int il = 0; il < hp->n_layer; il++) {
            int64_t v = 0;
            bool ok = kv->type == GGUF_VT_ARRAY
                          ? (uint64_t)il < kv->arr_n && gguf_arr_get_i64(kv, (uint64_t)il, &v)
                          : gguf_get_i64(m->gguf, key, &v);
            if (!ok) {
                snprintf(err, n, "metadata key '%s' has no numeric flag for layer %d", key, il);
                return false;
            }
            m->layers[il].recurrent = v != 0;
        }
    } else {
        int interval = 4;
        if (!ld_int(m, "full_attention_interval", &interval, false, err, n)) return false;
        if (interval < 1) {
            snprintf(err, n, "invalid full_attention_interval %d", interval);
            return false;
        }
        for (int il = 0; il < hp->n_layer; il++)
            m->layers[il].recurrent = (il + 1) % interval != 0;
    }
    hp->n_layer_recurrent = 0;
    for (int il = 0; il < hp->n_layer; il++) hp->n_layer_recurrent += m->layers[il].recurrent;
    return true;
}

/* Hyper-parameters shared by the hybrid Gated DeltaNet + MoE families (qwen35moe, qwen3next,
 * qwen4exp): attention, routed and shared experts, linear attention, the MTP block count. */
bool hybrid_load_hparams(sluice_model *m, int *nextn_out, char *err, size_t n) {
    hparams *hp = &m->hp;
    int nextn = 0, d_inner = 0;
    if (!load_attention_hparams(m, err, n) ||
        !ld_int(m, "expert_count", &hp->n_expert, true, err, n) ||
        !ld_int(m, "expert_used_count", &hp->n_expert_used, true, err, n) ||
        !ld_int(m, "feed_forward_length", &hp->n_ff, false, err, n) ||
        !ld_int(m, "expert_feed_forward_length", &hp->n_ff_exp, false, err, n) ||
        !ld_int(m, "expert_shared_feed_forward_length", &hp->n_ff_shexp, false, err, n) ||
        !ld_int(m, "nextn_predict_layers", &nextn, false, err, n) ||
        !ld_int(m, "ssm.conv_kernel", &hp->ssm_kernel, true, err, n) ||
        !ld_int(m, "ssm.inner_size", &d_inner, true, err, n) ||
        !ld_int(m, "ssm.state_size", &hp->ssm_d_k, true, err, n) ||
        !ld_int(m, "ssm.time_step_rank", &hp->ssm_n_v_head, true, err, n) ||
        !ld_int(m, "ssm.group_count", &hp->ssm_n_k_head, true, err, n))
        return false;
    /* llama.cpp's defaults for absent widths */
    if (hp->n_ff_exp == 0 && hp->n_expert_used > 0) hp->n_ff_exp = hp->n_ff / hp->n_expert_used;
    if (hp->n_ff_shexp == 0) hp->n_ff_shexp = hp->n_ff;
    if (nextn >= hp->n_layer) {
        snprintf(err, n, "nextn_predict_layers %d leaves no trunk of %d blocks", nextn,
                 hp->n_layer);
        return false;
    }
    *nextn_out = nextn;
    hp->n_layer -= nextn; /* the MTP block(s) come last and are not run */
    if (hp->n_expert <= 0 || hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert ||
        hp->n_expert_used > 64 || hp->n_ff_exp <= 0) {
        snprintf(err, n, "invalid MoE shape: %d experts, %d used, width %d", hp->n_expert,
                 hp->n_expert_used, hp->n_ff_exp);
        return false;
    }
    if (hp->ssm_kernel < 1 || hp->ssm_kernel > HYBRID_MAX_CONV_KERNEL || hp->ssm_d_k <= 0 ||
        hp->ssm_n_k_head <= 0 || hp->ssm_n_v_head <= 0 ||
        hp->ssm_n_v_head % hp->ssm_n_k_head != 0 || d_inner <= 0 ||
        d_inner % hp->ssm_n_v_head != 0 || hp->ssm_d_k > 4096) {
        snprintf(err, n,
                 "invalid linear-attention shape: kernel %d, %d key heads of %d, %d value heads, "
                 "inner size %d",
                 hp->ssm_kernel, hp->ssm_n_k_head, hp->ssm_d_k, hp->ssm_n_v_head, d_inner);
        return false;
    }
    hp->ssm_d_v = d_inner / hp->ssm_n_v_head;
    /* bounds that keep every derived width (conv channels, state sizes) far from int overflow */
    if ((int64_t)hp->ssm_n_k_head * hp->ssm_d_k > (1 << 24) || d_inner > (1 << 24)) {
        snprintf(err, n, "linear-attention widths too large: %d key heads of %d, inner size %d",
                 hp->ssm_n_k_head, hp->ssm_d_k, d_inner);
        return false;
    }
    if (hp->head_dim_k != hp->head_dim_v) {
        snprintf(err, n, "gated attention needs equal key and value head dims (%d, %d)",
                 hp->head_dim_k, hp->head_dim_v);
        return false;
    }
    hp->rope = ROPE_NEOX;
    hp->norm_topk = true;
    return true;
}

static bool load_hparams(sluice_model *m, bool qwen3next, char *err, size_t n) {
    int nextn;
    if (!hybrid_load_hparams(m, &nextn, err, n)) return false;
    m->hp.ssm_kv_tiled = !qwen3next;
    return true;
}

static bool load_attention_layer(sluice_model *m, int il, char *err, size_t n) {
    const hparams *hp = &m->hp;
    layer_weights *L = &m->layers[il];
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim_k,
                  K = (int64_t)hp->n_head_kv * hp->head_dim_k,
                  V = (int64_t)hp->n_head_kv * hp->head_dim_v;
    return ld_tensor(m, &L->wq, true, E, 2 * Q, -1, err, n, "blk.%d.attn_q.weight", il) &&
           ld_tensor(m, &L->wk, true, E, K, -1, err, n, "blk.%d.attn_k.weight", il) &&
           ld_tensor(m, &L->wv, true, E, V, -1, err, n, "blk.%d.attn_v.weight", il) &&
           ld_tensor(m, &L->wo, true, Q, E, -1, err, n, "blk.%d.attn_output.weight", il) &&
           ld_tensor(m, &L->q_norm, true, hp->head_dim_k, -1, -1, err, n,
                     "blk.%d.attn_q_norm.weight", il) &&
           ld_tensor(m, &L->k_norm, true, hp->head_dim_k, -1, -1, err, n,
                     "blk.%d.attn_k_norm.weight", il);
}

/* Router and shared expert of layer il; the routed experts are bound through the expert store
 * (ld_experts: plain stacked or fused gate_up tensors, or an expert-major store). */
bool hybrid_load_moe_layer(sluice_model *m, int il, char *err, size_t n) {
    const hparams *hp = &m->hp;
    layer_weights *L = &m->layers[il];
    const int64_t E = hp->n_embd, X = hp->n_expert, FS = hp->n_ff_shexp;
    if (!ld_tensor(m, &L->ffn_gate_inp, true, E, X, -1, err, n, "blk.%d.ffn_gate_inp.weight",
                   il) ||
        !ld_tensor(m, &L->ffn_up_shexp, false, E, FS, -1, err, n, "blk.%d.ffn_up_shexp.weight",
                   il))
        return false;
    if (!L->ffn_up_shexp.data) return true; /* no shared expert in this layer */
    if (m->hp.n_ff_shexp == 0) m->hp.n_ff_shexp = (int)L->ffn_up_shexp.ne[1]; /* width unstated */
    const int64_t FS1 = m->hp.n_ff_shexp;
    if (FS1 != L->ffn_up_shexp.ne[1]) {
        snprintf(err, n, "layer %d: shared expert width %lld, expected %lld", il,
                 (long long)L->ffn_up_shexp.ne[1], (long long)FS1);
        return false;
    }
    return ld_tensor(m, &L->ffn_gate_shexp, true, E, FS1, -1, err, n,
                     "blk.%d.ffn_gate_shexp.weight", il) &&
           ld_tensor(m, &L->ffn_down_shexp, true, FS1, E, -1, err, n,
                     "blk.%d.ffn_down_shexp.weight", il) &&
           ld_tensor(m, &L->ffn_gate_inp_shexp, true, E, -1, -1, err, n,
                     "blk.%d.ffn_gate_inp_shexp.weight", il);
}

static int hybrid_load(sluice_model *m, bool qwen3next, char *err, size_t n) {
    hparams *hp = &m->hp;
    if (!load_hparams(m, qwen3next, err, n) || !load_io_tensors(m, err, n)) return -1;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    if (!hybrid_layer_pattern(m, err, n)) return -1;
    const int64_t E = hp->n_embd;
    for (int il = 0; il < hp->n_layer; il++) {
        layer_weights *L = &m->layers[il];
        bool ok = ld_tensor(m, &L->attn_norm, true, E, -1, -1, err, n, "blk.%d.attn_norm.weight",
                            il) &&
                  ld_tensor(m, &L->ffn_norm, true, E, -1, -1, err, n,
                            "blk.%d.post_attention_norm.weight", il) &&
                  (L->recurrent ? gdn_load_layer(m, il, qwen3next, err, n)
                                : load_attention_layer(m, il, err, n)) &&
                  hybrid_load_moe_layer(m, il, err, n);
        if (!ok) return -1;
    }
    /* The store is created by the engine once the memory plan is known. An MTP block's
     * experts (blocks past the trunk) are in the file too: the layout spans every block so
     * that they are accounted for, and they are simply never acquired. */
    int nextn = 0;
    if (!ld_int(m, "nextn_predict_layers", &nextn, false, err, n)) return -1;
    const int trunk = hp->n_layer;
    hp->n_layer = trunk + nextn;
    const bool ok = ld_experts(m, true, err, n);
    hp->n_layer = trunk;
    return ok ? 0 : -1;
}

static int qwen35moe_load(sluice_model *m, char *err, size_t n) {
    return hybrid_load(m, false, err, n);
}
static int qwen3next_load(sluice_model *m, char *err, size_t n) {
    return hybrid_load(m, true, err, n);
}

/* ---- per-session state -------------------------------------------------------------------- */

static uint64_t hybrid_recurrent_bytes(const sluice_model *m) {
    const hparams *hp = &m->hp;
    const uint64_t per_layer =
        (uint64_t)hp->ssm_n_v_head * hp->ssm_d_v * hp->ssm_d_k +
        (uint64_t)(hp->ssm_kernel - 1) * (uint64_t)hybrid_conv_dim(hp);
    return (uint64_t)hp->n_layer_recurrent * per_layer * sizeof(float);
}

static uint64_t hybrid_state_bytes(const sluice_model *m, int n_ctx) {
    const hparams *hp = &m->hp;
    const uint64_t kv = (uint64_t)(hp->n_layer - hp->n_layer_recurrent) * (uint64_t)n_ctx *
                        (uint64_t)hp->n_head_kv * (uint64_t)(hp->head_dim_k + hp->head_dim_v) *
                        sizeof(float);
    return kv + hybrid_recurrent_bytes(m);
}

static void hybrid_state_free(model_state *st) {
    if (!st) return;
    backend *be = st->be;
    struct hybrid_state *H = st->hybrid;
    if (H) {
        float *bufs[] = {H->conv, H->ssm, H->qkv, H->conv_out, H->lq, H->lk, H->lv, H->z,
                         H->beta, H->alpha, H->ba, H->mix, H->out, H->qg, H->gate};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) state_release(be, bufs[i]);
        free(H->slot);
        free(H);
    }
    void *std_bufs[] = {st->kv_k, st->kv_v, st->x, st->cur, st->tmp, st->q, st->k, st->v,
                        st->attn, st->ff_a, st->ff_b, st->router, st->moe_ids,
                        st->moe_w, st->moe_slots, st->moe_x, st->moe_y, st->moe_rows,
                        st->logits, st->shexp_gate, st->shexp_out};
    for (size_t i = 0; i < sizeof std_bufs / sizeof std_bufs[0]; i++) state_release(be, std_bufs[i]);
    moe_state_release(st);
    free(st);
}

static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

static model_state *hybrid_state_new(const sluice_model *m, backend *be, int n_ctx, int n_batch) {
    const hparams *hp = &m->hp;
    model_state *st = calloc(1, sizeof *st);
    struct hybrid_state *H = calloc(1, sizeof *H);
    if (!st || !H) {
        free(st);
        free(H);
        return NULL;
    }
    st->hybrid = H;
    st->be = be;
    st->n_ctx = n_ctx;
    st->n_batch = n_batch;
    const size_t B = (size_t)n_batch, F = sizeof(float), E = (size_t)hp->n_embd;
    const size_t ff = max_z(max_z((size_t)hp->n_ff, (size_t)hp->n_ff_exp), (size_t)hp->n_ff_shexp);
    const size_t k_used = (size_t)hp->n_expert_used, Q = (size_t)hp->n_head * hp->head_dim_k;
    const size_t KD = (size_t)hp->ssm_n_k_head * hp->ssm_d_k;
    const size_t VD = (size_t)hp->ssm_n_v_head * hp->ssm_d_v, CD = (size_t)hybrid_conv_dim(hp);

    /* layer slots: KV only for attention layers, recurrent state only for recurrent ones */
    H->slot = calloc((size_t)hp->n_layer, sizeof *H->slot);
    int n_rec = 0, n_attn = 0;
    bool legacy = false;
    for (int il = 0; H->slot && il < hp->n_layer; il++) {
        H->slot[il] = m->layers[il].recurrent ? n_rec++ : n_attn++;
        legacy |= m->layers[il].ssm.in.data != NULL;
    }
    H->n_attn = n_attn;
    H->n_rec = n_rec;
    H->conv_len = (size_t)(hp->ssm_kernel - 1) * CD;
    H->ssm_len = (size_t)hp->ssm_n_v_head * hp->ssm_d_v * hp->ssm_d_k;

    st->kv_row_k = (size_t)hp->n_head_kv * hp->head_dim_k;
    st->kv_row_v = (size_t)hp->n_head_kv * hp->head_dim_v;
    st->kv_k = state_alloc(be, (size_t)n_attn * n_ctx * st->kv_row_k * F);
    st->kv_v = state_alloc(be, (size_t)n_attn * n_ctx * st->kv_row_v * F);
    st->x = state_alloc(be, B * E * F);
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
    st->moe_ids = state_alloc(be, (size_t)hp->n_layer * B * k_used * sizeof(int32_t));
    st->moe_w = state_alloc(be, (size_t)hp->n_layer * B * k_used * F);
    const bool table = be_has_expert_table(be); /* device backends: no per-expert rows */
    if (!table) {
        st->moe_slots = state_alloc(be, B * k_used * E * F);
        st->moe_x = state_alloc(be, B * E * F);
        st->moe_y = state_alloc(be, B * E * F);
        st->moe_rows = state_alloc(be, B * k_used * sizeof(int32_t));
    }
    st->shexp_gate = state_alloc(be, B * F);
    st->shexp_out = state_alloc(be, B * E * F);

    H->conv = state_alloc(be, (size_t)n_rec * H->conv_len * F);
    H->ssm = state_alloc(be, (size_t)n_rec * H->ssm_len * F);
    H->qkv = state_alloc(be, B * CD * F);
    H->conv_out = state_alloc(be, B * CD * F);
    H->lq = state_alloc(be, B * KD * F);
    H->lk = state_alloc(be, B * KD * F);
    H->lv = state_alloc(be, B * VD * F);
    H->z = state_alloc(be, B * VD * F);
    H->beta = state_alloc(be, B * hp->ssm_n_v_head * F);
    H->alpha = state_alloc(be, B * hp->ssm_n_v_head * F);
    H->ba = state_alloc(be, B * 2 * hp->ssm_n_v_head * F);
    H->mix = legacy ? state_alloc(be, B * (CD + VD) * F) : NULL;
    H->out = state_alloc(be, B * VD * F);
    H->qg = state_alloc(be, B * 2 * Q * F);
    H->gate = state_alloc(be, B * Q * F);

    bool ok = H->slot && st->kv_k && st->kv_v && st->x && st->cur && st->tmp && st->q &&
              st->k && st->v && st->attn && st->ff_a && st->ff_b &&
              (st->logits || be->host_memory) && st->router && st->moe_ids && st->moe_w &&
              (table || (st->moe_slots && st->moe_x && st->moe_y && st->moe_rows)) &&
              st->shexp_gate && st->shexp_out && H->conv &&
              H->ssm && H->qkv && H->conv_out && H->lq && H->lk && H->lv && H->z && H->beta &&
              H->alpha && H->ba && (H->mix || !legacy) && H->out && H->qg && H->gate;
    if (!ok) {
        hybrid_state_free(st);
        return NULL;
    }
    return st;
}

/* A new timeline starts from zero recurrent state (the KV cache needs no clearing: positions
 * past the session's position are never read). */
static void hybrid_state_reset(model_state *st) {
    struct hybrid_state *H = st->hybrid;
    be_memzero(st->be, H->conv, (size_t)H->n_rec * H->conv_len * sizeof(float));
    be_memzero(st->be, H->ssm, (size_t)H->n_rec * H->ssm_len * sizeof(float));
}

/* ---- forward ------------------------------------------------------------------------------ */

/* Gated full attention for layer il: reads st->cur, writes st->tmp. */
static void gated_attention(const sluice_model *m, model_state *st, backend *be, int il, int n,
                            int pos0) {
    const hparams *hp = &m->hp;
    const layer_weights *L = &m->layers[il];
    struct hybrid_state *H = st->hybrid;
    const int nh = hp->n_head, hd = hp->head_dim_k;
    const tview *w[3] = {&L->wq, &L->wk, &L->wv};
    float *o[3] = {H->qg, st->k, st->v};
    be_matmul_multi(be, 3, w, st->cur, n, o);
    /* each head's rows are [query (hd) | gate (hd)] */
    be_copy_rows(be, st->q, (size_t)hd, H->qg, (size_t)2 * hd, n * nh, hd);
    const int slot = H->slot[il];
    float *kc = st->kv_k + (size_t)slot * st->n_ctx * st->kv_row_k;
    float *vc = st->kv_v + (size_t)slot * st->n_ctx * st->kv_row_v;
    be_qk_norm_rope_store(be, st->q, st->k, st->v, n, nh, hp->n_head_kv, hd, &L->q_norm, &L->k_norm,
                          hp->rms_eps, hp->n_rot, st->pos, hp->rope_base, hp->rope, kc, vc, st->kv_row_k,
                          st->kv_row_v);
    /* the output gate sigmoid(gate) read in place where the backend fuses it, else copied out
     * of the rows and applied by its own op (the same values) */
    const float scale = 1.0f / sqrtf((float)hd);
    if (!(be->ops->attention_gated && hp->head_dim_v == hd &&
          be->ops->attention_gated(be, st->q, kc, vc, n, pos0, nh, hp->n_head_kv, hd, hp->head_dim_v, scale,
                                   H->qg + hd, (size_t)2 * hd, st->attn))) {
        be_copy_rows(be, H->gate, (size_t)hd, H->qg + hd, (size_t)2 * hd, n * nh, hd);
        be_attention(be, st->q, kc, vc, n, pos0, nh, hp->n_head_kv, hd, hp->head_dim_v, scale, st->attn);
        be_sigmoid_mul(be, st->attn, H->gate, n, nh * hd, nh * hd);
    }
    be_matmul(be, &L->wo, st->attn, n, st->tmp);
}

static int hybrid_forward(const sluice_model *m, model_state *st, backend *be,
                          const int32_t *tokens, int n, int pos0, float *logits,
                          bool all_logits) {
    const hparams *hp = &m->hp;
    const size_t E = (size_t)hp->n_embd;
    const int32_t *ids;
    be_set_inputs(be, tokens, n, pos0, &ids, &st->pos);
    st->pos0 = pos0;
    be_embed(be, &m->tok_embd, ids, n, st->x);
    moe_lookahead_start(m, st, be, st->x, n);
    for (int il = 0; il < hp->n_layer; il++) {
        const layer_weights *L = &m->layers[il];
        /* the MoE layer before normed this layer's input already (its tail, fused) */
        if (il == 0) be_rmsnorm(be, st->x, &L->attn_norm, n, hp->n_embd, hp->rms_eps, st->cur);
        if (L->recurrent) gdn_layer_forward(m, st, be, il, n);
        else gated_attention(m, st, be, il, n, pos0);
        be_add_rmsnorm(be, st->x, st->tmp, &L->ffn_norm, n, hp->n_embd, hp->rms_eps, st->cur);
        const tview *next = il + 1 < hp->n_layer ? &m->layers[il + 1].attn_norm : NULL;
        if (moe_forward(m, st, be, il, st->cur, n, st->tmp, st->x, next, st->cur) != 0) return -1;
    }
    if (!logits) return 0; /* an intermediate prompt chunk */
    const float *rows = all_logits ? st->x : st->x + (size_t)(n - 1) * E;
    model_output_logits(m, st, be, rows, all_logits ? n : 1, logits);
    return 0;
}

const arch_desc arch_qwen35moe = {
    .name = "qwen35moe",
    .load = qwen35moe_load,
    .state_bytes = hybrid_state_bytes,
    .state_new = hybrid_state_new,
    .state_free = hybrid_state_free,
    .state_reset = hybrid_state_reset,
    .recurrent_bytes = hybrid_recurrent_bytes,
    .forward = hybrid_forward,
};

const arch_desc arch_qwen3next = {
    .name = "qwen3next",
    .load = qwen3next_load,
    .state_bytes = hybrid_state_bytes,
    .state_new = hybrid_state_new,
    .state_free = hybrid_state_free,
    .state_reset = hybrid_state_reset,
    .recurrent_bytes = hybrid_recurrent_bytes,
    .forward = hybrid_forward,
};
