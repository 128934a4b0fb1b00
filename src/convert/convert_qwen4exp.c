/* sluice convert for qwen4_exp (Qwen3.8-Flash-Next, GGUF qwen4exp): the tensors and metadata
 * sluice's models/qwen4exp.c loads, in llama.cpp's qwen4exp layout (docs/convert.md).
 *
 * Beyond the qwen35moe parts it shares (Gated DeltaNet with tiled value heads, gated attention,
 * MoE with a sigmoid-gated shared expert):
 *
 *   hyper-connections  *.attn_hyper_connection / *.mlp_hyper_connection / hyper_connection_mixer
 *                      {hc_norm (+1), input_mix_weight_down, input_mix_weight_up,
 *                      block_inject_weight} -> blk.N.hc_{attn,ffn}_{norm,down,up,inject},
 *                      output_hc_{norm,down,up}
 *   QSA indexer        self_attn.indexer.index_qk_proj [(heads + 1) * dim, H] split into
 *                      indexer.q_proj (the first heads * dim rows) and indexer.k_proj (the
 *                      last dim), kept F32 as llama.cpp keeps them; q/k_layernorm (+1) ->
 *                      indexer.q_norm / k_norm
 *   n-gram (PLE)       ple.{key_proj, value_proj, norm_key/query/conv (+1), conv1d [W, 1, K] ->
 *                      [K, W] F32} -> blk.N.ple_*; the table ple.ple_embedding.ngram_embedding
 *                      (one tensor, or shard_0..shard_{k-1} concatenated in index order) ->
 *                      per_layer_token_embd; the hashing constants from the checkpoint's
 *                      buffers (layer_multipliers, ngram_heads_offsets, ngram_heads_vocab_sizes),
 *                      else computed as transformers computes them, as u64 metadata arrays
 *   MTP block          mtp.layers.0.* -> blk.{n_layer}.* (a trunk-shaped attention layer with
 *                      its indexer), mtp.fc_embedding | mtp.fc_hidden -> nextn.eh_proj (input
 *                      columns [embedding | hidden]), pre_fc_norm_embedding / _hidden (+1) ->
 *                      nextn.enorm / hnorm, mtp.hyper_connection_mixer -> nextn.hc_head_*;
 *                      nextn_predict_layers 1 (sluice's qwen4exp_mtp.c; llama.cpp drops it)
 *
 * There are no other norms (no input/post-attention/final norm). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_internal.h"
#include "formats/quant.h"

/* ---- n-gram hashing constants ------------------------------------------------------------- */

/* transformers' _splitmix64, _build_layer_multipliers and _find_nth_prime_after (modular
 * qwen4_exp), in uint64 arithmetic (Python masks to 64 bits at every step). */
#define SPLITMIX_GAMMA 0x9E3779B97F4A7C15ull

static uint64_t splitmix64(uint64_t v) {
    v += SPLITMIX_GAMMA;
    v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
    v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
    return v ^ (v >> 31);
}

static bool is_prime(uint64_t v) {
    if (v < 2) return false;
    if (v % 2 == 0) return v == 2;
    for (uint64_t d = 3; d * d <= v; d += 2)
        if (v % d == 0) return false;
    return true;
}

void q4x_hash_constants(const hf_config *h, int ple_index, uint64_t *mult, uint64_t *size,
                        uint64_t *off, int64_t *rows_padded) {
    const uint64_t vocab = h->vocab > 1 ? (uint64_t)h->vocab : 1;
    const uint64_t half = (uint64_t)INT64_MAX / vocab / 2 > 0 ? (uint64_t)INT64_MAX / vocab / 2 : 1;
    const uint64_t base_seed = (uint64_t)h->seed + 10007ull * (uint64_t)ple_index;
    for (int i = 0; i < h->ngram_size; i++)
        mult[i] = 2 * (splitmix64(base_seed + SPLITMIX_GAMMA * (uint64_t)(i + 1)) % half) + 1;
    const int heads = (int)((h->ngram_size - 1) * h->heads_per_ngram);
    /* head h of layer index li takes the (li * heads + h + 1)-th prime >= ngram_base */
    uint64_t prime = (uint64_t)h->ngram_base - 1, total = 0;
    for (int k = 0; k < ple_index * heads; k++) {
        do {
            prime++;
        } while (!is_prime(prime));
    }
    for (int k = 0; k < heads; k++) {
        do {
            prime++;
        } while (!is_prime(prime));
        size[k] = prime;
        off[k] = total;
        total += prime;
    }
    const uint64_t div = h->ngram_div > 0 ? (uint64_t)h->ngram_div : 1;
    *rows_padded = (int64_t)((total + div - 1) / div * div);
}

/* An integer tensor (the hashing buffers) of exactly n entries into out; false otherwise. */
static bool read_ints(const st_tensor *t, int64_t n, uint64_t *out) {
    if (st_nelements(t) != n) return false;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = 0;
        if (t->dtype == ST_I64 || t->dtype == ST_U64) memcpy(&v, t->data + 8 * i, 8);
        else if (t->dtype == ST_I32) {
            int32_t x;
            memcpy(&x, t->data + 4 * i, 4);
            v = x;
        } else {
            return false;
        }
        if (v < 0) return false;
        out[i] = (uint64_t)v;
    }
    return true;
}

/* The constants: the checkpoint's buffers (what the model was trained with) when present, else
 * computed; a buffer that disagrees with the computation is noted. */
static void hash_constants(pctx *c, const char *pre) {
    conv_plan *p = c->p;
    const hf_config *h = &p->cfg;
    const int heads = p->ple_heads;
    uint64_t mult[CONV_MAX_NGRAM], size[CONV_MAX_PLE_HEADS], off[CONV_MAX_PLE_HEADS];
    int64_t rows;
    q4x_hash_constants(h, 0, mult, size, off, &rows);
    memcpy(p->ple_mult, mult, sizeof mult);
    memcpy(p->ple_size, size, sizeof size);
    memcpy(p->ple_off, off, sizeof off);
    static const char *const names[3] = {"layer_multipliers", "ngram_heads_vocab_sizes",
                                         "ngram_heads_offsets"};
    uint64_t *dst[3] = {p->ple_mult, p->ple_size, p->ple_off};
    const uint64_t *computed[3] = {mult, size, off};
    const int64_t count[3] = {h->ngram_size, heads, heads};
    for (int k = 0; k < 3 && !c->bad; k++) {
        char s[256];
        snprintf(s, sizeof s, "%s.ple.ple_embedding.%s", pre, names[k]);
        const st_tensor *t = pl_lookup(c, s);
        if (!t) continue;
        if (!read_ints(t, count[k], dst[k])) {
            pl_failf(c, "tensor '%s' is not %lld non-negative integers", s, (long long)count[k]);
            return;
        }
        if (memcmp(dst[k], computed[k], (size_t)count[k] * sizeof(uint64_t)) != 0)
            conv_note(c->note, c->nctx, "'%s' differs from the value computed from config.json "
                      "(seed, vocab_size, ngram_vocab_size_base): using the checkpoint's", s);
    }
}

/* ---- tensors ------------------------------------------------------------------------------ */

/* A hyper-connection module (src: its checkpoint prefix, dst: the GGUF prefix). */
static void hc_module(pctx *c, const char *src, const char *dst, bool inject, enum elem_op norm_op) {
    const hf_config *h = &c->p->cfg;
    const int64_t W = h->hc * h->hidden, R = h->hc_rank;
    char s[256], o[96];
    snprintf(s, sizeof s, "%s.hc_norm", src);
    snprintf(o, sizeof o, "%s_norm.weight", dst);
    pl_vec(c, o, s, true, W, norm_op);
    snprintf(s, sizeof s, "%s.input_mix_weight_down", src);
    snprintf(o, sizeof o, "%s_down.weight", dst);
    pl_mat(c, o, s, R, W, false);
    snprintf(s, sizeof s, "%s.input_mix_weight_up", src);
    snprintf(o, sizeof o, "%s_up.weight", dst);
    pl_mat(c, o, s, W, R, false);
    if (!inject) return;
    snprintf(s, sizeof s, "%s.block_inject_weight", src);
    snprintf(o, sizeof o, "%s_inject.weight", dst);
    pl_mat(c, o, s, h->hc, W, false);
}

/* One output tensor of rows [row_off, row_off + rows) of a source. */
static out_tensor *row_slice(pctx *c, const src_ref *sr, int64_t row_off, int64_t rows,
                             uint32_t type, const char *fmt, int L) {
    out_tensor *t = pl_add_out(c, fmt, L);
    if (!t) return NULL;
    if (!(t->src = malloc(sizeof *sr))) {
        pl_failf(c, "out of memory");
        return NULL;
    }
    *t->src = *sr;
    t->n_src = 1;
    t->n_dims = 2;
    t->ne[0] = sr->cols;
    t->ne[1] = rows;
    t->row_off = row_off;
    t->type = type;
    return t;
}

/* The QSA indexer of attention layer L: index_qk_proj split into q and k, the two norms. */
static void indexer(pctx *c, const char *pre, int L, enum elem_op norm_op) {
    const hf_config *h = &c->p->cfg;
    const int64_t D = h->idx_dim, NQ = h->idx_heads * D;
    char s[256], o[96];
    src_ref sr;
    snprintf(s, sizeof s, "%s.self_attn.indexer.index_qk_proj", pre);
    if (!pl_get_src(c, s, true, 0, NQ + D, h->hidden, true, &sr)) return;
    /* llama.cpp never quantizes the indexer projections */
    row_slice(c, &sr, 0, NQ, GGML_TYPE_F32, "blk.%d.indexer.q_proj.weight", L);
    row_slice(c, &sr, NQ, D, GGML_TYPE_F32, "blk.%d.indexer.k_proj.weight", L);
    snprintf(s, sizeof s, "%s.self_attn.indexer.q_layernorm", pre);
    snprintf(o, sizeof o, "blk.%d.indexer.q_norm.weight", L);
    pl_vec(c, o, s, true, D, norm_op);
    snprintf(s, sizeof s, "%s.self_attn.indexer.k_layernorm", pre);
    snprintf(o, sizeof o, "blk.%d.indexer.k_norm.weight", L);
    pl_vec(c, o, s, true, D, norm_op);
}

/* A depthwise conv1d of C channels and K taps (HF [C, 1, K], [C, K, 1] or [C, K]) -> F32 ne
 * [K, C]. */
static void conv_taps(pctx *c, const char *src, const char *out, int64_t C, int64_t K) {
    const st_tensor *cw = pl_lookup(c, src);
    if (!cw) {
        pl_failf(c, "missing tensor '%s'", src);
        return;
    }
    const bool ok = ((cw->n_dims == 3 && cw->shape[0] == C &&
                      ((cw->shape[1] == 1 && cw->shape[2] == K) ||
                       (cw->shape[1] == K && cw->shape[2] == 1))) ||
                     (cw->n_dims == 2 && cw->shape[0] == C && cw->shape[1] == K)) &&
                    st_is_float(cw->dtype);
    if (!ok) {
        pl_failf(c, "tensor '%s' is not a [%lld, 1, %lld] float convolution", src, (long long)C,
                 (long long)K);
        return;
    }
    out_tensor *t = pl_add_out(c, "%s", out);
    if (!t || !(t->src = calloc(1, sizeof *t->src))) {
        pl_failf(c, "out of memory");
        return;
    }
    *t->src = (src_ref){.kind = SRC_FLOAT, .w = cw, .outer = 1, .rows = C, .cols = K};
    t->n_src = 1;
    t->n_dims = 2;
    t->ne[0] = K;
    t->ne[1] = C;
    t->type = GGML_TYPE_F32;
}

/* The n-gram table: one tensor or its shards, rows concatenated in shard order. */
static void ngram_table(pctx *c, const char *pre) {
    conv_plan *p = c->p;
    const hf_config *h = &p->cfg;
    const int64_t dim = h->ple_embed / p->ple_heads;
    char s[256];
    int k = 0;
    for (;; k++) {
        snprintf(s, sizeof s, "%s.ple.ple_embedding.ngram_embedding.shard_%d.weight", pre, k);
        if (!pl_lookup(c, s)) break;
    }
    const bool sharded = k > 0;
    if (!sharded) k = 1;
    if (sharded && h->ngram_parts > 0 && k != h->ngram_parts)
        conv_note(c->note, c->nctx, "the n-gram table has %d shards, config.json's "
                  "split_ngram_parts says %lld", k, (long long)h->ngram_parts);
    out_tensor *t = pl_add_out(c, "per_layer_token_embd.weight");
    if (!t) return;
    t->src = calloc((size_t)k, sizeof *t->src);
    t->rowcat = calloc((size_t)k + 1, sizeof *t->rowcat);
    if (!t->src || !t->rowcat) {
        pl_failf(c, "out of memory");
        return;
    }
    t->n_src = k;
    for (int i = 0; i < k && !c->bad; i++) {
        if (sharded) snprintf(s, sizeof s, "%s.ple.ple_embedding.ngram_embedding.shard_%d", pre, i);
        else snprintf(s, sizeof s, "%s.ple.ple_embedding.ngram_embedding", pre);
        char w[300];
        snprintf(w, sizeof w, "%s.weight", s);
        const st_tensor *st = pl_lookup(c, w);
        if (!st) {
            pl_failf(c, "missing tensor '%s' (the n-gram table)", w);
            return;
        }
        const int64_t rows = st->n_dims == 2 ? st->shape[0] : -1;
        if (rows < 1) {
            pl_failf(c, "tensor '%s' is not a [rows, %lld] table", w, (long long)dim);
            return;
        }
        pl_get_src(c, s, true, 0, rows, dim, true, &t->src[i]);
        t->rowcat[i + 1] = t->rowcat[i] + rows;
    }
    if (c->bad) return;
    const int64_t total = t->rowcat[k];
    uint64_t need = 0;
    for (int i = 0; i < p->ple_heads; i++)
        if (p->ple_off[i] + p->ple_size[i] > need) need = p->ple_off[i] + p->ple_size[i];
    if ((uint64_t)total < need || total > INT32_MAX) {
        pl_failf(c, "the n-gram table has %lld rows; its heads need %llu (at most 2^31)",
                 (long long)total, (unsigned long long)need);
        return;
    }
    t->n_dims = 2;
    t->ne[0] = dim;
    t->ne[1] = total;
    t->type = pl_weight_type(c, &t->src[0], dim);
}

/* The n-gram (PLE) module of layer L. */
static void ple(pctx *c, const char *pre, int L, enum elem_op norm_op) {
    const hf_config *h = &c->p->cfg;
    const int64_t H = h->hidden, W = h->hc * H, P = h->ple_embed;
    char s[256], o[96];
    c->p->ple_heads = (int)((h->ngram_size - 1) * h->heads_per_ngram);
    hash_constants(c, pre);
    snprintf(s, sizeof s, "%s.ple.key_proj", pre);
    snprintf(o, sizeof o, "blk.%d.ple_key.weight", L);
    pl_mat(c, o, s, W, P, false);
    snprintf(s, sizeof s, "%s.ple.value_proj", pre);
    snprintf(o, sizeof o, "blk.%d.ple_value.weight", L);
    pl_mat(c, o, s, H, P, false);
    static const char *const norms[3] = {"key", "query", "conv"};
    for (int k = 0; k < 3; k++) {
        snprintf(s, sizeof s, "%s.ple.norm_%s", pre, norms[k]);
        snprintf(o, sizeof o, "blk.%d.ple_norm_%s.weight", L, norms[k]);
        pl_vec(c, o, s, true, W, norm_op);
    }
    snprintf(s, sizeof s, "%s.ple.conv1d.weight", pre);
    snprintf(o, sizeof o, "blk.%d.ple_conv1d.weight", L);
    if (!c->bad) conv_taps(c, s, o, W, h->ple_kernel);
    if (!c->bad) ngram_table(c, pre);
}

/* The MoE of a layer: router (F32), routed experts, shared expert. */
static void moe(pctx *c, const char *pre, int L) {
    const hf_config *h = &c->p->cfg;
    char s[256], o[96];
    snprintf(s, sizeof s, "%s.mlp.gate", pre);
    snprintf(o, sizeof o, "blk.%d.ffn_gate_inp.weight", L);
    pl_mat(c, o, s, h->n_expert, h->hidden, true);
    pl_experts(c, pre, L);
    pl_shared_expert(c, pre, L);
}

/* A trunk-shaped layer: hyper-connections, mixer (+ indexer), MoE. */
static void layer(pctx *c, const char *pre, int L, bool recurrent, enum elem_op norm_op) {
    char s[256], o[96];
    snprintf(s, sizeof s, "%s.attn_hyper_connection", pre);
    snprintf(o, sizeof o, "blk.%d.hc_attn", L);
    hc_module(c, s, o, true, norm_op);
    snprintf(s, sizeof s, "%s.mlp_hyper_connection", pre);
    snprintf(o, sizeof o, "blk.%d.hc_ffn", L);
    hc_module(c, s, o, true, norm_op);
    if (recurrent) {
        pl_linear_attention(c, pre, L);
    } else {
        pl_attention(c, pre, L, true, norm_op);
        indexer(c, pre, L, norm_op);
    }
    moe(c, pre, L);
}

/* The MTP block as block L (after the trunk), when the checkpoint has it. */
static void mtp(pctx *c, int L, enum elem_op norm_op) {
    const hf_config *h = &c->p->cfg;
    const int64_t H = h->hidden, W = h->hc * H;
    if (!pl_lookup(c, "mtp.fc_embedding.weight")) return;
    if (pl_lookup(c, "mtp.layers.1.mlp.gate.weight"))
        conv_note(c->note, c->nctx, "the checkpoint has more than one MTP layer: converting the "
                  "first (sluice drafts with one)");
    c->p->nextn = 1;
    layer(c, "mtp.layers.0", L, false, norm_op);
    out_tensor *t = pl_add_out(c, "blk.%d.nextn.eh_proj.weight", L);
    if (t && !(t->src = calloc(2, sizeof *t->src))) pl_failf(c, "out of memory");
    if (!t || c->bad) return;
    t->n_src = 2;
    t->colcat = true;
    t->n_dims = 2;
    t->ne[0] = 2 * H;
    t->ne[1] = H;
    pl_get_src(c, "mtp.fc_embedding", true, 0, H, H, true, &t->src[0]);
    pl_get_src(c, "mtp.fc_hidden", true, 0, H, H, true, &t->src[1]);
    if (c->bad) return;
    t->type = pl_weight_type(c, &t->src[0], 2 * H);
    char o[96];
    snprintf(o, sizeof o, "blk.%d.nextn.enorm.weight", L);
    pl_vec(c, o, "mtp.pre_fc_norm_embedding", true, H, norm_op);
    snprintf(o, sizeof o, "blk.%d.nextn.hnorm.weight", L);
    pl_vec(c, o, "mtp.pre_fc_norm_hidden", true, W, norm_op);
    snprintf(o, sizeof o, "blk.%d.nextn.hc_head", L);
    hc_module(c, "mtp.hyper_connection_mixer", o, false, norm_op);
}

bool q4x_plan_tensors(pctx *c) {
    conv_plan *p = c->p;
    const hf_config *h = &p->cfg;
    const int64_t H = h->hidden, V = h->vocab;
    char s[256];
    /* zero-centred norms are stored as offsets from 1 (GGUF: 1 + w), unless the checkpoint is
     * mlx-lm's, recognized as for qwen35moe by its [C, K, 1] conv1d layout */
    for (int L = 0; L < h->n_layer; L++) {
        if (!h->recurrent[L]) continue;
        snprintf(s, sizeof s, "model.layers.%d.linear_attn.conv1d.weight", L);
        const st_tensor *cw = pl_lookup(c, s);
        if (cw && cw->n_dims == 3 && cw->shape[2] == 1 && h->conv_kernel != 1)
            p->mlx_norms_shifted = true;
        break;
    }
    const enum elem_op norm_op = p->mlx_norms_shifted ? OP_NONE : OP_PLUS1;
    pl_mat(c, "token_embd.weight", "model.embed_tokens", V, H, false);
    if (!h->tie || pl_lookup(c, "lm_head.weight")) {
        if (h->tie) conv_note(c->note, c->nctx, "tie_word_embeddings is set but lm_head.weight "
                              "exists: writing it as output.weight");
        pl_mat(c, "output.weight", "lm_head", V, H, false);
    }
    hc_module(c, "model.hyper_connection_mixer", "output_hc", false, norm_op);
    for (int L = 0; L < h->n_layer && !c->bad; L++) {
        char pre[64];
        snprintf(pre, sizeof pre, "model.layers.%d", L);
        layer(c, pre, L, h->recurrent[L], norm_op);
        if (L == h->ple_layer) ple(c, pre, L, norm_op);
    }
    if (!c->bad) mtp(c, (int)h->n_layer, norm_op);
    return !c->bad;
}

/* ---- metadata ----------------------------------------------------------------------------- */

#define W(call)                                                                                \
    do {                                                                                       \
        if ((call) != 0) goto oom;                                                             \
    } while (0)

int q4x_metadata(const conv_plan *p, gguf_writer *w, char *err, size_t n) {
    const hf_config *h = &p->cfg;
    const int nb = (int)h->n_layer + p->nextn;
    char k[128];
#define KEY(s) (snprintf(k, sizeof k, "qwen4exp." s), k)
    int32_t *ratios = calloc((size_t)nb, sizeof *ratios);
    uint8_t *recurrent = calloc((size_t)nb, 1);
    if (!ratios || !recurrent) goto oom;
    for (int il = 0; il < h->n_layer; il++) {
        recurrent[il] = h->recurrent[il];
        ratios[il] = h->recurrent[il] ? 0 : (int32_t)h->idx_ratio;
    }
    /* (the MTP block: attention, dense, ratio 0) */
    W(gguf_w_arr(w, KEY("attention.recurrent_layers"), GGUF_VT_BOOL, recurrent, (uint64_t)nb));
    if (h->full_attn_interval > 0)
        W(gguf_w_u32(w, KEY("full_attention_interval"), (uint32_t)h->full_attn_interval));
    W(gguf_w_u32(w, KEY("hyper_connection.count"), (uint32_t)h->hc));
    W(gguf_w_u32(w, KEY("hyper_connection.low_rank"), (uint32_t)h->hc_rank));
    W(gguf_w_u32(w, KEY("attention.indexer.head_count"), (uint32_t)h->idx_heads));
    W(gguf_w_u32(w, KEY("attention.indexer.key_length"), (uint32_t)h->idx_dim));
    W(gguf_w_u32(w, KEY("attention.indexer.top_k"), (uint32_t)h->idx_budget));
    W(gguf_w_arr(w, KEY("attention.compress_ratios"), GGUF_VT_I32, ratios, (uint64_t)nb));
    if (h->ple_layer >= 0) {
        const int32_t layers[1] = {(int32_t)h->ple_layer};
        W(gguf_w_arr(w, KEY("ple.layers"), GGUF_VT_I32, layers, 1));
        W(gguf_w_u32(w, KEY("ple.ngram_size"), (uint32_t)h->ngram_size));
        W(gguf_w_u32(w, KEY("ple.heads_per_ngram"), (uint32_t)h->heads_per_ngram));
        W(gguf_w_u32(w, KEY("ple.conv_kernel"), (uint32_t)h->ple_kernel));
        W(gguf_w_u32(w, KEY("ple.eos_token_id"), (uint32_t)h->eos_id));
        if (h->image_id >= 0) W(gguf_w_u32(w, KEY("ple.image_token_id"), (uint32_t)h->image_id));
        W(gguf_w_u32(w, KEY("embedding_length_per_layer_input"),
                     (uint32_t)(h->ple_embed / p->ple_heads)));
        W(gguf_w_arr(w, KEY("ple.layer_multipliers"), GGUF_VT_U64, p->ple_mult,
                     (uint64_t)h->ngram_size));
        W(gguf_w_arr(w, KEY("ple.head_offsets"), GGUF_VT_U64, p->ple_off, (uint64_t)p->ple_heads));
        W(gguf_w_arr(w, KEY("ple.head_vocab_sizes"), GGUF_VT_U64, p->ple_size,
                     (uint64_t)p->ple_heads));
    }
    if (p->nextn > 0) W(gguf_w_u32(w, KEY("nextn_predict_layers"), (uint32_t)p->nextn));
#undef KEY
    free(ratios);
    free(recurrent);
    return 0;
oom:
    free(ratios);
    free(recurrent);
    snprintf(err, n, "out of memory writing metadata");
    return -1;
}
#undef W
