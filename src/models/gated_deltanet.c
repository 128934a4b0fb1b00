/* Gated DeltaNet (linear attention) layer of the hybrid models, per token t:
 *
 *   qkv_t = W_qkv x_t,  z_t = W_gate x_t,  b_t = W_beta x_t,  a_t = W_alpha x_t
 *   u_t = silu(causal_conv1d(qkv)_t)            kernel taps over the last kernel-1 raw rows
 *   q, k, v = split(u_t);  q, k L2-normalized per head (eps = rms eps, a floor on the norm)
 *   beta = sigmoid(b_t),  g = softplus(a_t + dt_bias) * ssm_a     (ssm_a = -exp(A_log), stored)
 *   o_t = gated delta rule(q / sqrt(d_k), k, v, g, beta)           (backend.h: gated_delta)
 *   y_t = W_out (rmsnorm(o_t) * norm_w * silu(z_t))                per value head
 *
 * Order and placement of every step follow llama.cpp's qwen35moe/qwen3next graphs, which the
 * fixtures were made with. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/quant.h"
#include "models/hybrid.h"

/* The conv taps are read element-wise by the backend: keep them as F32 whatever the file has. */
static bool conv_to_f32(sluice_model *m, tview *t, char *err, size_t n) {
    if (t->type == GGML_TYPE_F32) return true;
    const quant_traits *qt = quant_traits_of(t->type);
    float *f = malloc((size_t)t->ne[0] * (size_t)t->ne[1] * sizeof *f);
    if (!f || !ld_own(m, f)) {
        snprintf(err, n, "out of memory converting '%s'", t->name);
        return false;
    }
    for (int64_t r = 0; r < t->ne[1]; r++)
        qt->dequantize((const uint8_t *)t->data + (size_t)r * t->row_bytes, f + r * t->ne[0],
                       t->ne[0]);
    t->type = GGML_TYPE_F32;
    t->row_bytes = (size_t)t->ne[0] * sizeof(float);
    t->mat_bytes = t->row_bytes * (size_t)t->ne[1];
    t->data = f;
    return true;
}

bool gdn_load_layer(sluice_model *m, int il, bool qwen3next, char *err, size_t n) {
    const hparams *hp = &m->hp;
    ssm_weights *S = &m->layers[il].ssm;
    const int64_t E = hp->n_embd, KD = (int64_t)hp->ssm_n_k_head * hp->ssm_d_k,
                  VD = (int64_t)hp->ssm_n_v_head * hp->ssm_d_v, CD = hybrid_conv_dim(hp),
                  Hv = hp->ssm_n_v_head;
    if (qwen3next) {
        /* current converters write attn_qkv + attn_gate; older files the fused ssm_in */
        if (!ld_tensor(m, &S->qkv, false, E, CD, -1, err, n, "blk.%d.attn_qkv.weight", il) ||
            !ld_tensor(m, &S->gate, false, E, VD, -1, err, n, "blk.%d.attn_gate.weight", il))
            return false;
        if (!S->qkv.data || !S->gate.data) {
            memset(&S->qkv, 0, sizeof S->qkv);
            memset(&S->gate, 0, sizeof S->gate);
            if (!ld_tensor(m, &S->in, true, E, 2 * KD + 2 * VD, -1, err, n,
                           "blk.%d.ssm_in.weight", il))
                return false;
        }
        if (!ld_tensor(m, &S->ba, true, E, 2 * Hv, -1, err, n, "blk.%d.ssm_ba.weight", il))
            return false;
    } else {
        if (!ld_tensor(m, &S->qkv, true, E, CD, -1, err, n, "blk.%d.attn_qkv.weight", il) ||
            !ld_tensor(m, &S->gate, true, E, VD, -1, err, n, "blk.%d.attn_gate.weight", il) ||
            !ld_tensor(m, &S->beta, true, E, Hv, -1, err, n, "blk.%d.ssm_beta.weight", il) ||
            !ld_tensor(m, &S->alpha, true, E, Hv, -1, err, n, "blk.%d.ssm_alpha.weight", il))
            return false;
    }
    return ld_tensor(m, &S->conv1d, true, hp->ssm_kernel, CD, -1, err, n,
                     "blk.%d.ssm_conv1d.weight", il) &&
           conv_to_f32(m, &S->conv1d, err, n) &&
           ld_tensor(m, &S->dt_bias, true, Hv, -1, -1, err, n, "blk.%d.ssm_dt.bias", il) &&
           ld_tensor(m, &S->a, true, Hv, -1, -1, err, n, "blk.%d.ssm_a", il) &&
           ld_tensor(m, &S->norm, true, hp->ssm_d_v, -1, -1, err, n, "blk.%d.ssm_norm.weight",
                     il) &&
           ld_tensor(m, &S->out, true, VD, E, -1, err, n, "blk.%d.ssm_out.weight", il);
}

/* qwen3next's legacy fused projection holds, per key head g, [q_g | k_g | v of its r value
 * heads | z of them]; spread it into qkv = [all q | all k | all v] and z (strided row copies in
 * backend memory). */
static void split_legacy_qkvz(const hparams *hp, backend *be, const float *mix, int n, float *qkv,
                              float *z) {
    const int Dk = hp->ssm_d_k, Dv = hp->ssm_d_v, Hk = hp->ssm_n_k_head;
    const int r = hp->ssm_n_v_head / Hk, KD = Hk * Dk, VD = hp->ssm_n_v_head * Dv;
    const int CD = hybrid_conv_dim(hp), group = 2 * Dk + 2 * r * Dv;
    const size_t ms = (size_t)(CD + VD);
    for (int g = 0; g < Hk; g++) {
        const float *s = mix + (size_t)g * group;
        be_copy_rows(be, qkv + (size_t)g * Dk, (size_t)CD, s, ms, n, Dk);
        be_copy_rows(be, qkv + KD + (size_t)g * Dk, (size_t)CD, s + Dk, ms, n, Dk);
        be_copy_rows(be, qkv + 2 * KD + (size_t)g * r * Dv, (size_t)CD, s + 2 * Dk, ms, n, r * Dv);
        be_copy_rows(be, z + (size_t)g * r * Dv, (size_t)VD, s + 2 * Dk + r * Dv, ms, n, r * Dv);
    }
}

/* qwen3next's fused ba holds, per key head g, [beta of its r value heads | alpha of them]. */
static void split_ba(const hparams *hp, backend *be, const float *ba, int n, float *beta,
                     float *alpha) {
    const int Hv = hp->ssm_n_v_head, r = Hv / hp->ssm_n_k_head;
    for (int g = 0; g < hp->ssm_n_k_head; g++) {
        be_copy_rows(be, beta + (size_t)g * r, (size_t)Hv, ba + (size_t)g * 2 * r, (size_t)2 * Hv,
                     n, r);
        be_copy_rows(be, alpha + (size_t)g * r, (size_t)Hv, ba + (size_t)g * 2 * r + r,
                     (size_t)2 * Hv, n, r);
    }
}

/* conv_out = [q | k | v] rows into lq, lk, lv; q and k L2-normalized per head. */
static void gdn_split_norm(const hparams *hp, backend *be, struct hybrid_state *H, int n) {
    const int Hk = hp->ssm_n_k_head, Dk = hp->ssm_d_k, KD = Hk * Dk;
    const int VD = hp->ssm_n_v_head * hp->ssm_d_v, CD = hybrid_conv_dim(hp);
    be_copy_rows(be, H->lq, (size_t)KD, H->conv_out, (size_t)CD, n, KD);
    be_copy_rows(be, H->lk, (size_t)KD, H->conv_out + KD, (size_t)CD, n, KD);
    be_copy_rows(be, H->lv, (size_t)VD, H->conv_out + 2 * KD, (size_t)CD, n, VD);
    be_l2norm(be, H->lq, n * Hk, Dk, hp->rms_eps, H->lq);
    be_l2norm(be, H->lk, n * Hk, Dk, hp->rms_eps, H->lk);
}

void gdn_layer_forward(const sluice_model *m, model_state *st, backend *be, int il, int n) {
    const hparams *hp = &m->hp;
    const ssm_weights *S = &m->layers[il].ssm;
    struct hybrid_state *H = st->hybrid;
    const int Hk = hp->ssm_n_k_head, Hv = hp->ssm_n_v_head, Dk = hp->ssm_d_k, Dv = hp->ssm_d_v;
    const int KD = Hk * Dk, VD = Hv * Dv, CD = hybrid_conv_dim(hp);
    const int slot = H->slot[il];
    float *conv_state = H->conv + (size_t)slot * H->conv_len;
    float *ssm_state = H->ssm + (size_t)slot * H->ssm_len;

    /* input projections */
    if (S->in.data) {
        be_matmul(be, &S->in, st->cur, n, H->mix);
        split_legacy_qkvz(hp, be, H->mix, n, H->qkv, H->z);
    } else {
        if (!S->ba.data) { /* the four projections of one input together */
            const tview *w[4] = {&S->qkv, &S->gate, &S->beta, &S->alpha};
            float *o[4] = {H->qkv, H->z, H->beta, H->alpha};
            be_matmul_multi(be, 4, w, st->cur, n, o);
        } else {
            const tview *w[2] = {&S->qkv, &S->gate};
            float *o[2] = {H->qkv, H->z};
            be_matmul_multi(be, 2, w, st->cur, n, o);
        }
    }
    if (S->ba.data) {
        be_matmul(be, &S->ba, st->cur, n, H->ba);
        split_ba(hp, be, H->ba, n, H->beta, H->alpha);
    } else if (S->in.data) {
        be_matmul(be, &S->beta, st->cur, n, H->beta);
        be_matmul(be, &S->alpha, st->cur, n, H->alpha);
    }

    /* the gates, then a short causal convolution over q|k|v and per-head q/k normalization
     * (independent steps); with checkpoints token by token (the same per-token computation),
     * keeping the state after each */
    const bool ck = H->ck_n > 0 && H->ck_n == n && n > 1;
    const gdn_gate_args gates = {.beta = H->beta, .alpha = H->alpha, .dt_bias = S->dt_bias.data,
                                 .a = S->a.data, .n_head = Hv};
    const int fused = !ck && be->ops->gdn_conv_split
                          ? be->ops->gdn_conv_split(be, H->qkv, n, KD, VD, Dk, S->conv1d.data, hp->ssm_kernel,
                                                    conv_state, hp->rms_eps, H->lq, H->lk, H->lv, &gates)
                          : 0;
    if (fused != 2) be_gdn_gates(be, H->beta, H->alpha, S->dt_bias.data, S->a.data, n, Hv);
    if (fused) {
        /* convolution, split and q/k norms in one step (the same values) */
    } else if (!ck) {
        be_conv1d_silu(be, H->qkv, n, CD, S->conv1d.data, hp->ssm_kernel, conv_state, H->conv_out);
        gdn_split_norm(hp, be, H, n);
    } else {
        for (int t = 0; t < n; t++) {
            be_conv1d_silu(be, H->qkv + (size_t)t * CD, 1, CD, S->conv1d.data, hp->ssm_kernel,
                           conv_state, H->conv_out + (size_t)t * CD);
            if (t + 1 < n) /* after the last token the state itself is the checkpoint */
                be_copy_rows(be, H->ck_conv + ((size_t)t * H->n_rec + slot) * H->conv_len,
                             H->conv_len, conv_state, H->conv_len, 1, (int)H->conv_len);
        }
        gdn_split_norm(hp, be, H, n);
    }

    /* the delta rule; one token is always the recurrence */
    gdn_params p = {.n_tok = n, .n_k_head = Hk, .n_v_head = Hv, .d_k = Dk, .d_v = Dv,
                    .kv_tiled = hp->ssm_kv_tiled, .q_scale = 1.0f / sqrtf((float)Dk),
                    .chunk = n > 1 ? H->gdn_chunk : 0};
    if (!ck) {
        be_gated_delta(be, H->lq, H->lk, H->lv, H->alpha, H->beta, ssm_state, &p, H->out);
    } else if (be->ops->gated_delta_ck) { /* the same, with the checkpoints, in one pass */
        p.chunk = 0;
        be->ops->gated_delta_ck(be, H->lq, H->lk, H->lv, H->alpha, H->beta, ssm_state, &p, H->out,
                                H->ck_ssm + (size_t)slot * H->ssm_len, (size_t)H->n_rec * H->ssm_len);
    } else { /* the recurrence one token at a time (what the batch op computes for chunk 0) */
        p.n_tok = 1;
        p.chunk = 0;
        for (int t = 0; t < n; t++) {
            be_gated_delta(be, H->lq + (size_t)t * KD, H->lk + (size_t)t * KD,
                           H->lv + (size_t)t * VD, H->alpha + (size_t)t * Hv,
                           H->beta + (size_t)t * Hv, ssm_state, &p, H->out + (size_t)t * VD);
            if (t + 1 < n) /* spec_keep of every token restores nothing */
                be_copy_rows(be, H->ck_ssm + ((size_t)t * H->n_rec + slot) * H->ssm_len, H->ssm_len,
                             ssm_state, H->ssm_len, 1, (int)H->ssm_len);
        }
    }

    /* gated RMSNorm per value head: norm_w * rmsnorm(o) * silu(z), then the output projection;
     * qwen4exp gates with sigmoid(z) instead (its only difference from this layer) */
    if (hp->ssm_gate_sigmoid) {
        be_rmsnorm(be, H->out, &S->norm, n * Hv, Dv, hp->rms_eps, H->out);
        be_sigmoid_mul(be, H->out, H->z, n * Hv, Dv, Dv);
        be_matmul(be, &S->out, H->out, n, st->tmp);
        return;
    }
    be_rmsnorm_swiglu(be, H->out, &S->norm, n * Hv, Dv, hp->rms_eps, H->z);
    be_matmul(be, &S->out, H->z, n, st->tmp);
}
