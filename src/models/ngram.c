/* qwen4exp's n-gram module ("PLE" in the checkpoint, Engram in the papers), on one linear-
 * attention layer, before its attention-side hyper-connection read (llama.cpp's qwen4exp
 * graph, whose hashing a Python re-implementation reproduces row for row):
 *
 *   context   ctx = [t, t-1, ..., t-(N-1)] (N = ngram_size); a predecessor before the sequence
 *             start, or at or behind an end-of-text token in the window, becomes that token
 *             (the token's own end-of-text does not cut)
 *   hash      for n = 2..N: mixed = XOR over j < n of ctx[j] * mult[j] (uint64, wrapping);
 *             head h of that order: row = mixed % size[h] + offset[h]
 *   e         the ple_n_heads rows of the table, concatenated (head slowest)      [n_embd]
 *   gate      key = grouped_rmsnorm(W_key e) [hc * n_embd], value = W_value e [n_embd],
 *             query = grouped_rmsnorm(x) (the wide residual); per stream s = <key_s, query_s>
 *             / sqrt(n_embd), g_s = sigmoid(sign(s) sqrt(max(|s|, 1e-6))); gated_s = g_s value
 *   conv      c = silu(dilated causal depthwise conv of grouped_rmsnorm(gated)), kernel K,
 *             dilation N, over a history of (K-1) N rows carried across calls
 *   x        += gated + c
 *
 * The rows depend on token ids only, so the forward pass asks the table tier for them before
 * layer 0 (qwen4exp.c) and gathers them here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/error.h"
#include "formats/quant.h"
#include "models/qwen4exp.h"
#include "runtime/ngram_table.h"

/* "<arch>.<suffix>" as a numeric array of at least `need` non-negative entries. */
static bool load_u64_array(sluice_model *m, const char *suffix, int need, uint64_t *out,
                           char *err, size_t n) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", m->arch_name, suffix);
    const gguf_kv *kv = gguf_find(m->gguf, key);
    if (!kv || kv->type != GGUF_VT_ARRAY || kv->arr_n < (uint64_t)need) {
        snprintf(err, n, "metadata key '%s' must be an array of at least %d integers", key, need);
        return false;
    }
    for (int i = 0; i < need; i++) {
        int64_t v;
        if (!gguf_arr_get_i64(kv, (uint64_t)i, &v) || v < 0) {
            snprintf(err, n, "metadata key '%s': entry %d is not a non-negative integer", key, i);
            return false;
        }
        out[i] = (uint64_t)v;
    }
    return true;
}

/* The conv taps are read element-wise: F32 whatever the file stores (F16 in quantized files). */
static bool taps_to_f32(sluice_model *m, const tview *t, const float **out, char *err, size_t n) {
    if (t->type == GGML_TYPE_F32) {
        *out = t->data;
        return true;
    }
    const size_t count = (size_t)t->ne[0] * (size_t)t->ne[1];
    float *f = malloc(count * sizeof *f);
    if (!f || !ld_own(m, f)) {
        snprintf(err, n, "out of memory converting '%s'", t->name);
        return false;
    }
    const quant_traits *qt = quant_traits_of(t->type);
    for (int64_t r = 0; r < t->ne[1]; r++)
        qt->dequantize((const uint8_t *)t->data + (size_t)r * t->row_bytes, f + r * t->ne[0],
                       t->ne[0]);
    *out = f;
    return true;
}

bool ngram_load(sluice_model *m, char *err, size_t n) {
    const hparams *hp = &m->hp;
    q4x_model *q = q4x_of(m);
    q->ple_layer = -1;
    char key[160];
    snprintf(key, sizeof key, "%s.ple.layers", m->arch_name);
    const gguf_kv *kv = gguf_find(m->gguf, key);
    if (!kv) return true; /* no n-gram module */
    int64_t layer = -1;
    if (kv->type != GGUF_VT_ARRAY || kv->arr_n != 1 || !gguf_arr_get_i64(kv, 0, &layer) ||
        layer < 0 || layer >= hp->n_layer) {
        snprintf(err, n, "metadata key '%s' must list exactly one layer below %d", key,
                 hp->n_layer);
        return false;
    }
    if (!m->layers[layer].recurrent) {
        snprintf(err, n, "the n-gram layer %d is not a linear-attention layer", (int)layer);
        return false;
    }
    q->ple_layer = (int)layer;
    int eos = -1, image = 0;
    if (!ld_int(m, "ple.ngram_size", &q->ngram_size, true, err, n) ||
        !ld_int(m, "ple.heads_per_ngram", &q->heads_per_ngram, true, err, n) ||
        !ld_int(m, "ple.conv_kernel", &q->ple_kernel, true, err, n) ||
        !ld_int(m, "ple.eos_token_id", &eos, true, err, n) ||
        !ld_int(m, "ple.image_token_id", &image, false, err, n) ||
        !ld_int(m, "embedding_length_per_layer_input", &q->ple_dim, true, err, n))
        return false;
    q->ple_eos = eos;
    q->ple_image = image ? image : eos; /* llama.cpp's fallback */
    if (q->ngram_size < 2 || q->ngram_size > Q4X_MAX_NGRAM || q->heads_per_ngram < 1 ||
        (q->ngram_size - 1) * q->heads_per_ngram > Q4X_MAX_HEADS || q->ple_kernel < 1 ||
        q->ple_kernel > 64 || q->ple_dim < 1) {
        snprintf(err, n, "invalid n-gram module: order %d, %d heads per order, kernel %d, dim %d",
                 q->ngram_size, q->heads_per_ngram, q->ple_kernel, q->ple_dim);
        return false;
    }
    q->ple_n_heads = (q->ngram_size - 1) * q->heads_per_ngram;
    if ((int64_t)q->ple_n_heads * q->ple_dim != hp->n_embd) {
        snprintf(err, n, "n-gram embedding of %d heads x %d differs from the width %d",
                 q->ple_n_heads, q->ple_dim, hp->n_embd);
        return false;
    }
    if (!load_u64_array(m, "ple.layer_multipliers", q->ngram_size, q->mult, err, n) ||
        !load_u64_array(m, "ple.head_offsets", q->ple_n_heads, q->head_offset, err, n) ||
        !load_u64_array(m, "ple.head_vocab_sizes", q->ple_n_heads, q->head_size, err, n))
        return false;
    uint64_t rows_needed = 0;
    for (int h = 0; h < q->ple_n_heads; h++) {
        if (q->head_size[h] == 0 || q->head_offset[h] + q->head_size[h] > (uint64_t)INT32_MAX) {
            snprintf(err, n, "n-gram head %d: range [%llu, +%llu) does not fit a row index", h,
                     (unsigned long long)q->head_offset[h], (unsigned long long)q->head_size[h]);
            return false;
        }
        if (q->head_offset[h] + q->head_size[h] > rows_needed)
            rows_needed = q->head_offset[h] + q->head_size[h];
    }
    if (!ld_tensor(m, &q->table, true, q->ple_dim, 0, -1, err, n, "per_layer_token_embd.weight"))
        return false;
    if ((uint64_t)q->table.ne[1] < rows_needed) {
        snprintf(err, n, "per_layer_token_embd has %lld rows, the heads need %llu",
                 (long long)q->table.ne[1], (unsigned long long)rows_needed);
        return false;
    }
    q->table_offset = (uint64_t)((const uint8_t *)q->table.data - m->gguf->base);

    q4x_layer *X = &q->layers[layer];
    const int64_t E = hp->n_embd, W = (int64_t)q->hc * E;
    const int il = (int)layer;
    tview conv;
    return ld_tensor(m, &X->ple_key, true, E, W, -1, err, n, "blk.%d.ple_key.weight", il) &&
           ld_tensor(m, &X->ple_value, true, E, E, -1, err, n, "blk.%d.ple_value.weight", il) &&
           ld_tensor(m, &X->ple_norm_key, true, W, -1, -1, err, n, "blk.%d.ple_norm_key.weight",
                     il) &&
           ld_tensor(m, &X->ple_norm_query, true, W, -1, -1, err, n,
                     "blk.%d.ple_norm_query.weight", il) &&
           ld_tensor(m, &X->ple_norm_conv, true, W, -1, -1, err, n,
                     "blk.%d.ple_norm_conv.weight", il) &&
           ld_tensor(m, &conv, true, q->ple_kernel, W, -1, err, n, "blk.%d.ple_conv1d.weight",
                     il) &&
           taps_to_f32(m, &conv, &X->ple_conv, err, n);
}

void ngram_rows(const q4x_model *q, const int32_t *ctx_in, int32_t *rows) {
    uint64_t ctx[Q4X_MAX_NGRAM];
    ctx[0] = (uint64_t)ctx_in[0];
    bool cut = false;
    for (int s = 1; s < q->ngram_size; s++) {
        const int32_t t = cut ? -1 : ctx_in[s];
        cut = cut || t < 0 || t == q->ple_eos;
        ctx[s] = (uint64_t)(cut ? q->ple_eos : t);
    }
    for (int order = 2; order <= q->ngram_size; order++) {
        uint64_t mixed = ctx[0] * q->mult[0];
        for (int j = 1; j < order; j++) mixed ^= ctx[j] * q->mult[j];
        const int base = (order - 2) * q->heads_per_ngram;
        for (int g = 0; g < q->heads_per_ngram; g++)
            rows[base + g] = (int32_t)(mixed % q->head_size[base + g] + q->head_offset[base + g]);
    }
}

void ngram_batch_rows(const q4x_model *q, const q4x_state *xs, const int32_t *tokens, int n,
                      int32_t *rows) {
    for (int i = 0; i < n; i++) {
        int32_t ctx[Q4X_MAX_NGRAM];
        ctx[0] = tokens[i];
        for (int s = 1; s < q->ngram_size; s++) {
            const int back = i - s; /* >= 0: inside the batch; else from the history */
            ctx[s] = back >= 0 ? tokens[back] : -back - 1 < xs->n_prev ? xs->prev[-back - 1] : -1;
        }
        ngram_rows(q, ctx, rows + (size_t)i * q->ple_n_heads);
    }
}

void ngram_advance(const q4x_model *q, q4x_state *xs, const int32_t *tokens, int n) {
    int32_t next[Q4X_MAX_NGRAM];
    int k = 0;
    for (int i = n - 1; i >= 0 && k < Q4X_MAX_NGRAM; i--) next[k++] = tokens[i];
    for (int i = 0; i < xs->n_prev && k < Q4X_MAX_NGRAM; i++) next[k++] = xs->prev[i];
    memcpy(xs->prev, next, (size_t)k * sizeof *next);
    xs->n_prev = k;
    (void)q;
}

int ngram_forward(const sluice_model *m, model_state *st, backend *be, int n, int pos0) {
    const hparams *hp = &m->hp;
    const q4x_model *q = q4x_of(m);
    const q4x_layer *X = &q->layers[q->ple_layer];
    q4x_state *xs = q4x_state_of(st);
    const int E = hp->n_embd, H = q->ple_n_heads, W = q->hc * E;
    const size_t rb = q->table.row_bytes;

    /* the rows (their reads started before layer 0), dequantized as get_rows does */
    if (xs->rows_fn)
        for (int t = 0; t < n; t++) xs->rows_fn(xs->rows_ctx, pos0 + t, xs->rows_h + (size_t)t * H, H);
    if (ngram_table_gather(m->ngram, xs->rows_h, n * H, xs->raw_h) != 0) return -1;
    const quant_traits *qt = quant_traits_of(q->table.type);
    for (int i = 0; i < n * H; i++)
        qt->dequantize(xs->raw_h + (size_t)i * rb, xs->emb_h + (size_t)i * q->ple_dim, q->ple_dim);
    be_upload(be, xs->ple_emb, xs->emb_h, (size_t)n * E * sizeof(float));

    /* the hyper-connection buffers are free here: key, then the normalized gated value, in
     * xn; the query, then the conv output, in hgate */
    float *key = xs->xn, *query = xs->hgate;
    be_matmul(be, &X->ple_key, xs->ple_emb, n, key);
    be_matmul(be, &X->ple_value, xs->ple_emb, n, xs->ple_val);
    be_rmsnorm_groups(be, key, X->ple_norm_key.data, n, q->hc, E, hp->rms_eps, key);
    be_rmsnorm_groups(be, st->x, X->ple_norm_query.data, n, q->hc, E, hp->rms_eps, query);
    be->ops->ple_gate(be, key, query, xs->ple_val, n, q->hc, E, xs->ple_gated);
    float *normed = key, *conv = query;
    be_rmsnorm_groups(be, xs->ple_gated, X->ple_norm_conv.data, n, q->hc, E, hp->rms_eps, normed);
    if (xs->ck_n > 0 && xs->ck_n == n && n > 1) { /* checkpoints (qwen4exp_mtp.c) */
        for (int t = 0; t < n; t++) {
            be->ops->conv1d_dilated_silu(be, normed + (size_t)t * W, 1, W, X->ple_conv,
                                         q->ple_kernel, q->ngram_size, xs->ple_hist,
                                         conv + (size_t)t * W);
            if (t + 1 < n) /* after the last token the history itself is the checkpoint */
                be_copy_rows(be, xs->ck_ple + (size_t)t * xs->ple_hist_len, xs->ple_hist_len,
                             xs->ple_hist, xs->ple_hist_len, 1, (int)xs->ple_hist_len);
        }
    } else {
        be->ops->conv1d_dilated_silu(be, normed, n, W, X->ple_conv, q->ple_kernel,
                                     q->ngram_size, xs->ple_hist, conv);
    }
    /* llama.cpp: x + (gated + conv) */
    be_add(be, xs->ple_gated, conv, (size_t)n * W);
    be_add(be, st->x, xs->ple_gated, (size_t)n * W);
    return 0;
}
