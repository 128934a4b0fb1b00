/* The converter's readers of Hugging Face metadata: config.json (architecture and
 * hyper-parameters, quantization method), tokenizer.json and tokenizer_config.json (vocabulary,
 * merges, special tokens, chat template). Every value is checked; problems are one line. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert/convert_internal.h"
#include "engine/tokenizer.h"

void conv_note(note_fn fn, void *ctx, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (fn) fn(ctx, line);
    else fprintf(stderr, "convert: %s\n", line);
}

static json_t *load_json(const char *dir, const char *file, bool required, char *err, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (!required && access(path, F_OK) != 0) return NULL;
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        if (access(path, F_OK) != 0) snprintf(err, n, "%s: no %s", dir, file);
        else snprintf(err, n, "%s: not valid JSON: %s (line %d, column %d)", file, je.text,
                      je.line, je.column);
    } else if (!json_is_object(j)) {
        snprintf(err, n, "%s: not a JSON object", file);
        json_decref(j);
        j = NULL;
    }
    return j;
}

/* ---- config.json --------------------------------------------------------------------------- */

typedef struct cfgctx {
    json_t *top, *text; /* text: text_config when present, else top */
    char *err;
    size_t n;
    bool bad;
} cfgctx;

static json_t *cfg_get(cfgctx *c, const char *key) {
    json_t *v = json_object_get(c->text, key);
    return v ? v : json_object_get(c->top, key);
}

static bool cfg_fail(cfgctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool cfg_fail(cfgctx *c, const char *fmt, ...) {
    if (c->bad) return false;
    int k = snprintf(c->err, c->n, "config.json: ");
    va_list ap;
    va_start(ap, fmt);
    if (k > 0 && (size_t)k < c->n) vsnprintf(c->err + k, c->n - (size_t)k, fmt, ap);
    va_end(ap);
    c->bad = true;
    return false;
}

/* Integer field in [lo, hi]; def when absent and not required. */
static int64_t cfg_int(cfgctx *c, const char *key, int64_t def, bool required, int64_t lo,
                       int64_t hi) {
    if (c->bad) return def;
    json_t *v = cfg_get(c, key);
    if (!v || json_is_null(v)) {
        if (required) {
            snprintf(c->err, c->n, "config.json: missing '%s'", key);
            c->bad = true;
        }
        return def;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        snprintf(c->err, c->n, "config.json: '%s' must be an integer in [%lld, %lld]", key,
                 (long long)lo, (long long)hi);
        c->bad = true;
        return def;
    }
    return json_integer_value(v);
}

static double num_value(json_t *v, bool *ok) {
    *ok = json_is_number(v);
    return *ok ? json_number_value(v) : 0.0;
}

static double cfg_num(cfgctx *c, json_t *obj, const char *key, double def) {
    if (c->bad || !obj) return def;
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return def;
    bool ok;
    double d = num_value(v, &ok);
    if (!ok || !(d > 0.0) || d > 1e30) {
        snprintf(c->err, c->n, "config.json: '%s' must be a positive number", key);
        c->bad = true;
        return def;
    }
    return d;
}

static bool cfg_bool(cfgctx *c, const char *key, bool def) {
    json_t *v = cfg_get(c, key);
    if (!v || json_is_null(v)) return def;
    if (!json_is_boolean(v)) {
        if (!c->bad) snprintf(c->err, c->n, "config.json: '%s' must be true or false", key);
        c->bad = true;
        return def;
    }
    return json_is_true(v);
}

static int cfg_token_id(cfgctx *c, const char *key) {
    json_t *v = cfg_get(c, key);
    if (json_is_array(v)) v = json_array_get(v, 0); /* eos_token_id: [a, b]: the first */
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return -1;
    return (int)json_integer_value(v);
}

/* RoPE: rope_theta / partial_rotary_factor / mrope_section live at the top level (transformers
 * 4) or in rope_parameters (transformers 5); rope_scaling may carry mrope_section too. Scaled
 * variants (yarn, linear, ...) are not supported. */
static void cfg_rope(cfgctx *c, hf_config *h) {
    json_t *rp = cfg_get(c, "rope_parameters"), *rs = cfg_get(c, "rope_scaling");
    if (rp && !json_is_object(rp)) rp = NULL;
    if (rs && !json_is_object(rs)) rs = NULL;
    json_t *objs[2] = {rp, rs};
    for (int i = 0; i < 2 && !c->bad; i++) {
        if (!objs[i]) continue;
        json_t *t = json_object_get(objs[i], "rope_type");
        if (!t) t = json_object_get(objs[i], "type");
        const char *s = json_string_value(t);
        if (s && strcmp(s, "default") != 0 && strcmp(s, "mrope") != 0) {
            snprintf(c->err, c->n, "config.json: RoPE scaling '%s' is not supported", s);
            c->bad = true;
        }
    }
    double def_partial = h->arch == ARCH_QWEN3MOE ? 1.0 : 0.25;
    h->rope_theta = cfg_num(c, c->text, "rope_theta", cfg_num(c, rp, "rope_theta", 0));
    if (h->rope_theta == 0) h->rope_theta = cfg_num(c, c->top, "rope_theta", 10000.0);
    h->partial_rotary = cfg_num(c, c->text, "partial_rotary_factor",
                                cfg_num(c, rp, "partial_rotary_factor", def_partial));
    if (h->partial_rotary > 1.0 && !c->bad) {
        snprintf(c->err, c->n, "config.json: partial_rotary_factor %g is above 1", h->partial_rotary);
        c->bad = true;
    }
    json_t *ms = rp ? json_object_get(rp, "mrope_section") : NULL;
    if (!ms && rs) ms = json_object_get(rs, "mrope_section");
    if (json_is_array(ms) && !c->bad) {
        if (json_array_size(ms) > 4) {
            snprintf(c->err, c->n, "config.json: mrope_section has more than 4 entries");
            c->bad = true;
            return;
        }
        for (size_t i = 0; i < json_array_size(ms); i++) {
            json_t *e = json_array_get(ms, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > 4096) {
                snprintf(c->err, c->n, "config.json: invalid mrope_section");
                c->bad = true;
                return;
            }
            h->mrope[i] = (int)json_integer_value(e);
        }
        h->has_mrope = true;
    }
}

/* quantization_config (HF: quant_method "fp8" with weight_block_size) or quantization (mlx-lm:
 * group_size, bits, mode "affine"; per-module overrides are read from the tensors' shapes). */
static void cfg_quant(cfgctx *c, hf_config *h) {
    json_t *qc = json_object_get(c->top, "quantization_config");
    json_t *mq = json_object_get(c->top, "quantization");
    if (json_is_object(qc) && json_object_get(qc, "quant_method")) {
        const char *m = json_string_value(json_object_get(qc, "quant_method"));
        if (!m || strcmp(m, "fp8") != 0) {
            snprintf(c->err, c->n, "config.json: quantization method '%s' is not supported "
                     "(fp8 and MLX affine are)", m ? m : "?");
            c->bad = true;
            return;
        }
        h->fp8 = true;
        h->fp8_block[0] = h->fp8_block[1] = 128;
        json_t *bs = json_object_get(qc, "weight_block_size");
        if (bs) {
            json_t *b0 = json_array_get(bs, 0), *b1 = json_array_get(bs, 1);
            if (!json_is_integer(b0) || !json_is_integer(b1) || json_integer_value(b0) <= 0 ||
                json_integer_value(b1) <= 0 || json_integer_value(b0) > 65536 ||
                json_integer_value(b1) > 65536) {
                snprintf(c->err, c->n, "config.json: invalid weight_block_size");
                c->bad = true;
                return;
            }
            h->fp8_block[0] = json_integer_value(b0);
            h->fp8_block[1] = json_integer_value(b1);
        }
        return;
    }
    if (!json_is_object(mq)) mq = json_is_object(qc) ? qc : NULL;
    if (!mq) return;
    const char *mode = json_string_value(json_object_get(mq, "mode"));
    if (mode && strcmp(mode, "affine") != 0) {
        snprintf(c->err, c->n, "config.json: MLX quantization mode '%s' is not supported "
                 "(affine is)", mode);
        c->bad = true;
        return;
    }
    json_t *g = json_object_get(mq, "group_size"), *b = json_object_get(mq, "bits");
    h->mlx = true;
    h->mlx_group = json_is_integer(g) ? (int)json_integer_value(g) : 64;
    h->mlx_bits = json_is_integer(b) ? (int)json_integer_value(b) : 4;
}

/* qwen4_exp (transformers' Qwen4ExpTextConfig): hyper-connections, the QSA indexer, the n-gram
 * (PLE) module. Only what sluice runs is accepted: one n-gram layer, on a linear-attention
 * layer, of ple_embed_dim = hidden_size; the sigmoid output gate of the Gated DeltaNet; the MTP
 * block sharing the trunk's embedding and head. */
static bool cfg_qwen4exp(cfgctx *c, hf_config *h) {
    const int64_t big = 1 << 24;
    h->hc = cfg_int(c, "hc_count", 4, false, 2, 16);
    h->hc_rank = cfg_int(c, "hc_lowrank", 320, false, 1, 1 << 16);
    h->idx_heads = cfg_int(c, "indexer_n_heads", 0, true, 1, 256);
    cfg_int(c, "indexer_kv_heads", 1, false, 1, 1); /* one key head, as transformers requires */
    h->idx_dim = cfg_int(c, "indexer_head_dim", 0, true, 2, 4096);
    h->idx_budget = cfg_int(c, "indexer_budget", 0, true, 1, big);
    h->idx_ratio = cfg_int(c, "indexer_compress_ratio", 0, true, 1, 64);
    h->ple_embed = cfg_int(c, "ple_embed_dim", h->hidden, false, 1, big);
    h->ple_kernel = cfg_int(c, "ple_conv_kernel_size", 4, false, 1, 64);
    h->ngram_size = cfg_int(c, "ngram_size", 3, false, 2, CONV_MAX_NGRAM);
    h->heads_per_ngram = cfg_int(c, "heads_per_ngram", 8, false, 1, CONV_MAX_PLE_HEADS);
    h->ngram_base = cfg_int(c, "ngram_vocab_size_base", 20000000, false, 2, INT32_MAX / 64);
    h->ngram_div = cfg_int(c, "make_ngram_vocab_size_divisible_by", 128, false, 1, 1 << 20);
    h->seed = cfg_int(c, "seed", 1234, false, 0, INT64_MAX);
    h->ngram_parts = cfg_int(c, "split_ngram_parts", 0, false, 1, 1 << 20);
    h->ff_shexp = cfg_int(c, "shared_expert_intermediate_size", 0, true, 1, big);
    h->image_id = -1;
    json_t *img = json_object_get(c->top, "image_token_id");
    if (json_is_integer(img) && json_integer_value(img) >= 0 && json_integer_value(img) < INT32_MAX)
        h->image_id = (int)json_integer_value(img);
    if (c->bad) return false;
    if (h->idx_budget % h->idx_ratio != 0)
        return cfg_fail(c, "indexer_budget %lld is not a multiple of indexer_compress_ratio "
                              "%lld", (long long)h->idx_budget, (long long)h->idx_ratio);
    const int64_t rot = (int64_t)((double)h->head_dim * h->partial_rotary);
    if (rot > h->idx_dim)
        return cfg_fail(c, "%lld rotary dims do not fit the indexer head of %lld",
                              (long long)rot, (long long)h->idx_dim);
    /* the output gate of the Gated DeltaNet: sluice implements sigmoid (Qwen3.8-Flash-Next) */
    json_t *g = cfg_get(c, "output_gate_type");
    if (!json_is_string(g)) g = cfg_get(c, "hidden_act");
    const char *gate = json_string_value(g) ? json_string_value(g) : "silu";
    if (strcmp(gate, "sigmoid") != 0)
        return cfg_fail(c, "output_gate_type '%s' is not supported (sluice's qwen4exp "
                              "gates the Gated DeltaNet output with sigmoid)", gate);
    if (cfg_bool(c, "mtp_use_dedicated_embeddings", false))
        return cfg_fail(c, "mtp_use_dedicated_embeddings is not supported (the MTP block "
                              "shares the trunk's embedding and output head)");
    /* ple_layer_ids: one-based */
    h->ple_layer = -1;
    json_t *ids = cfg_get(c, "ple_layer_ids");
    if (ids && !json_is_null(ids) && !json_is_array(ids))
        return cfg_fail(c, "ple_layer_ids must be a list");
    if (json_array_size(ids) > 1)
        return cfg_fail(c, "ple_layer_ids lists %zu layers; sluice runs one n-gram layer",
                              json_array_size(ids));
    if (json_array_size(ids) == 0) return true;
    json_t *id = json_array_get(ids, 0);
    if (!json_is_integer(id) || json_integer_value(id) < 1 || json_integer_value(id) > h->n_layer)
        return cfg_fail(c, "ple_layer_ids must hold one-based layer numbers up to %lld",
                              (long long)h->n_layer);
    h->ple_layer = json_integer_value(id) - 1;
    if (!h->recurrent[h->ple_layer])
        return cfg_fail(c, "the n-gram layer %lld is not a linear-attention layer (sluice "
                              "and llama.cpp run it only there)", (long long)h->ple_layer);
    const int64_t heads = (h->ngram_size - 1) * h->heads_per_ngram;
    if (heads > CONV_MAX_PLE_HEADS || h->ple_embed % heads != 0 || h->ple_embed != h->hidden)
        return cfg_fail(c, "ple_embed_dim %lld must equal hidden_size %lld and split into "
                              "%lld n-gram heads", (long long)h->ple_embed, (long long)h->hidden,
                              (long long)heads);
    if (h->eos_id < 0)
        return cfg_fail(c, "eos_token_id is required: the n-gram hash restarts at it");
    return true;
}

int hf_load_config(const char *dir, hf_config *h, char *err, size_t n) {
    memset(h, 0, sizeof *h);
    json_t *top = load_json(dir, "config.json", true, err, n);
    if (!top) return -1;
    cfgctx c = {.top = top, .text = top, .err = err, .n = n};
    json_t *tc = json_object_get(top, "text_config");
    if (json_is_object(tc)) c.text = tc;
    const char *mt = json_string_value(json_object_get(top, "model_type"));
    if (!mt) {
        snprintf(err, n, "config.json: missing 'model_type'");
        json_decref(top);
        return -1;
    }
    if (strcmp(mt, "qwen3_moe") == 0) {
        h->arch = ARCH_QWEN3MOE;
        h->arch_name = "qwen3moe";
    } else if (strcmp(mt, "qwen3_5_moe") == 0 || strcmp(mt, "qwen3_5_moe_text") == 0) {
        h->arch = ARCH_QWEN35MOE;
        h->arch_name = "qwen35moe";
    } else if (strcmp(mt, "qwen4_exp") == 0 || strcmp(mt, "qwen4_exp_text") == 0) {
        h->arch = ARCH_QWEN4EXP;
        h->arch_name = "qwen4exp";
    } else {
        snprintf(err, n, "config.json: model_type '%s' is not supported (qwen3_moe, qwen3_5_moe, "
                 "qwen4_exp)", mt);
        json_decref(top);
        return -1;
    }
    const int64_t big = 1 << 24;
    h->vocab = cfg_int(&c, "vocab_size", 0, true, 1, 1 << 22);
    h->hidden = cfg_int(&c, "hidden_size", 0, true, 1, big);
    h->n_layer = cfg_int(&c, "num_hidden_layers", 0, true, 1, 1024);
    h->n_head = cfg_int(&c, "num_attention_heads", 0, true, 1, 4096);
    h->n_head_kv = cfg_int(&c, "num_key_value_heads", h->n_head, false, 1, 4096);
    h->head_dim = cfg_int(&c, "head_dim", h->n_head ? h->hidden / h->n_head : 0, false, 1, 65536);
    h->ctx = cfg_int(&c, "max_position_embeddings", 4096, false, 1, 1 << 30);
    h->ff = cfg_int(&c, "intermediate_size", 0, false, 0, big);
    h->n_expert = cfg_int(&c, "num_experts", cfg_int(&c, "num_local_experts", 0, false, 1, 65536),
                          false, 1, 65536);
    if (!c.bad && h->n_expert == 0) {
        snprintf(err, n, "config.json: missing 'num_experts'");
        c.bad = true;
    }
    h->n_expert_used = cfg_int(&c, "num_experts_per_tok", 0, true, 1, 64);
    h->ff_exp = cfg_int(&c, "moe_intermediate_size", 0, true, 1, big);
    h->eps = cfg_num(&c, c.text, "rms_norm_eps", 1e-6);
    h->tie = cfg_bool(&c, "tie_word_embeddings", false);
    h->bos_id = cfg_token_id(&c, "bos_token_id");
    h->eos_id = cfg_token_id(&c, "eos_token_id");
    h->pad_id = cfg_token_id(&c, "pad_token_id");
    cfg_rope(&c, h);
    cfg_quant(&c, h);
    if (!c.bad && h->n_expert_used > h->n_expert) {
        snprintf(err, n, "config.json: num_experts_per_tok %lld exceeds num_experts %lld",
                 (long long)h->n_expert_used, (long long)h->n_expert);
        c.bad = true;
    }
    if (!c.bad && (h->n_head % h->n_head_kv != 0)) {
        snprintf(err, n, "config.json: %lld attention heads are not a multiple of %lld KV heads",
                 (long long)h->n_head, (long long)h->n_head_kv);
        c.bad = true;
    }
    if (!c.bad && h->arch == ARCH_QWEN3MOE) {
        h->norm_topk = cfg_bool(&c, "norm_topk_prob", false);
        json_t *mlp_only = cfg_get(&c, "mlp_only_layers");
        if (cfg_int(&c, "decoder_sparse_step", 1, false, 0, 1024) > 1 ||
            (json_is_array(mlp_only) && json_array_size(mlp_only) > 0)) {
            if (!c.bad)
                snprintf(err, n, "config.json: dense (non-MoE) layers (decoder_sparse_step, "
                         "mlp_only_layers) are not supported");
            c.bad = true;
        }
    }
    if (!c.bad && h->arch == ARCH_QWEN4EXP) h->norm_topk = cfg_bool(&c, "norm_topk_prob", true);
    if (!c.bad && h->arch != ARCH_QWEN3MOE) {
        if (h->arch == ARCH_QWEN35MOE) h->norm_topk = true;
        h->ff_shexp = cfg_int(&c, "shared_expert_intermediate_size", 0, false, 0, big);
        h->lin_k_heads = cfg_int(&c, "linear_num_key_heads", 0, true, 1, 4096);
        h->lin_v_heads = cfg_int(&c, "linear_num_value_heads", 0, true, 1, 4096);
        h->lin_k_dim = cfg_int(&c, "linear_key_head_dim", 0, true, 1, 4096);
        h->lin_v_dim = cfg_int(&c, "linear_value_head_dim", 0, true, 1, 4096);
        h->conv_kernel = cfg_int(&c, "linear_conv_kernel_dim", 4, false, 1, 64);
        if (!c.bad && h->lin_v_heads % h->lin_k_heads != 0) {
            snprintf(err, n, "config.json: %lld value heads are not a multiple of %lld key heads",
                     (long long)h->lin_v_heads, (long long)h->lin_k_heads);
            c.bad = true;
        }
        h->recurrent = calloc((size_t)(h->n_layer > 0 ? h->n_layer : 1), sizeof *h->recurrent);
        json_t *lt = cfg_get(&c, "layer_types");
        int64_t interval = cfg_int(&c, "full_attention_interval", 4, false, 1, 1024);
        if (!h->recurrent) {
            snprintf(err, n, "out of memory");
            c.bad = true;
        } else if (json_is_array(lt)) {
            if ((int64_t)json_array_size(lt) != h->n_layer && !c.bad) {
                snprintf(err, n, "config.json: layer_types has %zu entries for %lld layers",
                         json_array_size(lt), (long long)h->n_layer);
                c.bad = true;
            }
            for (int64_t i = 0; i < h->n_layer && !c.bad; i++) {
                const char *s = json_string_value(json_array_get(lt, (size_t)i));
                /* qwen4_exp's QSA attention layers: full_attention, or as transformers
                 * names them: qwen_sparse_attention in 5.17.0 (save_pretrained writes it:
                 * tests/data/hf/qwen4exp-tiny), deepseek_sparse_attention or hybrid_indexed
                 * (the n-gram module on that layer) in other versions of its qwen4_exp */
                const bool attn = s && (strcmp(s, "full_attention") == 0 ||
                                        (h->arch == ARCH_QWEN4EXP &&
                                         (strcmp(s, "qwen_sparse_attention") == 0 ||
                                          strcmp(s, "deepseek_sparse_attention") == 0 ||
                                          strcmp(s, "hybrid_indexed") == 0)));
                if (s && strcmp(s, "linear_attention") == 0) h->recurrent[i] = true;
                else if (!attn) {
                    snprintf(err, n, "config.json: layer_types[%lld] ('%s') is not a linear or "
                             "full attention layer", (long long)i, s ? s : "?");
                    c.bad = true;
                }
            }
        } else {
            for (int64_t i = 0; i < h->n_layer; i++) h->recurrent[i] = (i + 1) % interval != 0;
        }
        /* the single interval that reproduces the pattern, when there is one */
        for (int64_t k = 1; k <= h->n_layer && !c.bad && !h->full_attn_interval; k++) {
            bool fits = true;
            for (int64_t i = 0; i < h->n_layer && fits; i++)
                fits = h->recurrent[i] == ((i + 1) % k != 0);
            if (fits) h->full_attn_interval = (int)k;
        }
    }
    if (!c.bad && h->arch == ARCH_QWEN4EXP) cfg_qwen4exp(&c, h);
    json_decref(top);
    if (c.bad) {
        hf_config_free(h);
        return -1;
    }
    return 0;
}

void hf_config_free(hf_config *h) {
    free(h->recurrent);
    h->recurrent = NULL;
}

/* ---- tokenizer ----------------------------------------------------------------------------- */

/* The pre-tokenizer regexes of llama.cpp's "qwen2" and "qwen35" (spec section 4.1). */
static const char QWEN2_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN35_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}"
    "\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Find the Split regexes anywhere in the pre_tokenizer tree. */
static void find_regexes(json_t *j, int *qwen2, int *qwen35, int *other) {
    if (json_is_object(j)) {
        json_t *pat = json_object_get(j, "pattern");
        const char *re = pat ? json_string_value(json_object_get(pat, "Regex")) : NULL;
        if (re) {
            if (strcmp(re, QWEN2_RE) == 0) (*qwen2)++;
            else if (strcmp(re, QWEN35_RE) == 0) (*qwen35)++;
            else (*other)++;
        }
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) find_regexes(v, qwen2, qwen35, other);
    } else if (json_is_array(j)) {
        for (size_t i = 0; i < json_array_size(j); i++)
            find_regexes(json_array_get(j, i), qwen2, qwen35, other);
    }
}

/* A special-token field of tokenizer_config.json: "text", {"content": "text"} or null. */
static const char *special_text(json_t *tc, const char *key) {
    json_t *v = tc ? json_object_get(tc, key) : NULL;
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_string_value(v);
}

static int find_token(const hf_vocab *v, const char *s) {
    if (!s) return -1;
    for (int i = 0; i < v->n; i++)
        if (v->tokens[i] && strcmp(v->tokens[i], s) == 0) return i;
    return -1;
}

static char *read_text_file(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, fp);
        len += got;
        if (got == 0) break;
    }
    fclose(fp);
    if (buf) buf[len] = 0;
    return buf;
}

int hf_load_vocab(const char *dir, const hf_config *c, hf_vocab *v, note_fn note, void *nctx,
                  char *err, size_t n) {
    memset(v, 0, sizeof *v);
    v->bos = v->eos = v->pad = v->unk = v->add_bos = v->add_eos = -1;
    json_t *tj = load_json(dir, "tokenizer.json", true, err, n);
    if (!tj) return -1;
    json_t *tc = load_json(dir, "tokenizer_config.json", false, err, n);
    int rc = -1;
    json_t *model = json_object_get(tj, "model");
    const char *type = json_string_value(json_object_get(model, "type"));
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(tj, "added_tokens");
    if (!type || strcmp(type, "BPE") != 0) {
        snprintf(err, n, "tokenizer.json: model type '%s' is not supported (byte-level BPE is)",
                 type ? type : "?");
        goto done;
    }
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        snprintf(err, n, "tokenizer.json: model.vocab or model.merges missing");
        goto done;
    }
    v->n = (int)c->vocab;
    v->tokens = calloc((size_t)v->n, sizeof *v->tokens);
    v->types = calloc((size_t)v->n, sizeof *v->types);
    if (!v->tokens || !v->types) goto oom;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= v->n) {
            snprintf(err, n, "tokenizer.json: token '%.40s' has id %lld outside the vocabulary "
                     "of %d (config vocab_size)", key, (long long)id, v->n);
            goto done;
        }
        if (v->tokens[id]) {
            snprintf(err, n, "tokenizer.json: id %lld is given to two tokens", (long long)id);
            goto done;
        }
        if (!(v->tokens[id] = strdup(key))) goto oom;
        v->types[id] = TOK_TYPE_NORMAL;
    }
    for (size_t i = 0; json_is_array(added) && i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        json_t *jid = json_object_get(a, "id");
        const char *content = json_string_value(json_object_get(a, "content"));
        json_int_t id = json_is_integer(jid) ? json_integer_value(jid) : -1;
        if (!content || id < 0 || id >= v->n) {
            snprintf(err, n, "tokenizer.json: added token #%zu is invalid or outside the "
                     "vocabulary of %d", i, v->n);
            goto done;
        }
        if (v->tokens[id] && strcmp(v->tokens[id], content) != 0) {
            snprintf(err, n, "tokenizer.json: id %lld is given to two tokens", (long long)id);
            goto done;
        }
        if (!v->tokens[id] && !(v->tokens[id] = strdup(content))) goto oom;
        v->types[id] = json_is_true(json_object_get(a, "special")) ? TOK_TYPE_CONTROL
                                                                   : TOK_TYPE_USER_DEFINED;
    }
    /* ids the tokenizer does not use (a padded embedding): placeholders, as llama.cpp writes */
    for (int i = 0; i < v->n; i++) {
        if (v->tokens[i]) continue;
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%d]", i);
        if (!(v->tokens[i] = strdup(pad))) goto oom;
        v->types[i] = TOK_TYPE_UNUSED;
    }
    v->n_merges = (int)json_array_size(merges);
    v->merges = calloc((size_t)v->n_merges + 1, sizeof *v->merges);
    if (!v->merges) goto oom;
    for (int i = 0; i < v->n_merges; i++) {
        json_t *m = json_array_get(merges, (size_t)i);
        const char *s = json_string_value(m);
        if (s) {
            if (!strchr(s + (*s ? 1 : 0), ' ')) {
                snprintf(err, n, "tokenizer.json: merge #%d ('%.40s') is not 'left right'", i, s);
                goto done;
            }
            v->merges[i] = strdup(s);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            const char *a = json_string_value(json_array_get(m, 0)),
                       *b = json_string_value(json_array_get(m, 1));
            size_t la = strlen(a), lb = strlen(b);
            v->merges[i] = malloc(la + lb + 2);
            if (v->merges[i]) {
                memcpy(v->merges[i], a, la);
                v->merges[i][la] = ' ';
                memcpy(v->merges[i] + la + 1, b, lb + 1);
            }
        } else {
            snprintf(err, n, "tokenizer.json: merge #%d is neither 'a b' nor [a, b]", i);
            goto done;
        }
        if (!v->merges[i]) goto oom;
    }
    /* pre-tokenizer: by its regex; else the architecture's own */
    int q2 = 0, q35 = 0, other = 0;
    find_regexes(json_object_get(tj, "pre_tokenizer"), &q2, &q35, &other);
    if (q35 && !q2) v->pre = "qwen35";
    else if (q2 && !q35) v->pre = "qwen2";
    else {
        v->pre = c->arch == ARCH_QWEN3MOE ? "qwen2" : "qwen35";
        conv_note(note, nctx, "tokenizer.json: pre-tokenizer regex not recognized; using '%s'",
                  v->pre);
    }
    /* special tokens: tokenizer_config.json, then config.json's ids */
    v->bos = find_token(v, special_text(tc, "bos_token"));
    v->eos = find_token(v, special_text(tc, "eos_token"));
    v->pad = find_token(v, special_text(tc, "pad_token"));
    v->unk = find_token(v, special_text(tc, "unk_token"));
    if (v->bos < 0 && c->bos_id >= 0 && c->bos_id < v->n) v->bos = c->bos_id;
    if (v->eos < 0 && c->eos_id >= 0 && c->eos_id < v->n) v->eos = c->eos_id;
    if (v->pad < 0 && c->pad_id >= 0 && c->pad_id < v->n) v->pad = c->pad_id;
    json_t *ab = tc ? json_object_get(tc, "add_bos_token") : NULL;
    json_t *ae = tc ? json_object_get(tc, "add_eos_token") : NULL;
    if (json_is_boolean(ab)) v->add_bos = json_is_true(ab);
    if (json_is_boolean(ae)) v->add_eos = json_is_true(ae);
    /* chat template: tokenizer_config.json (a string, or named templates: "default"), else the
     * chat_template.jinja that newer transformers save beside it */
    json_t *ct = tc ? json_object_get(tc, "chat_template") : NULL;
    if (json_is_array(ct)) {
        json_t *pick = NULL;
        for (size_t i = 0; i < json_array_size(ct); i++) {
            json_t *e = json_array_get(ct, i);
            const char *nm = json_string_value(json_object_get(e, "name"));
            if (!pick || (nm && strcmp(nm, "default") == 0)) pick = json_object_get(e, "template");
        }
        ct = pick;
    }
    if (json_is_string(ct)) {
        if (!(v->chat_template = strdup(json_string_value(ct)))) goto oom;
    } else {
        v->chat_template = read_text_file(dir, "chat_template.jinja");
    }
    rc = 0;
    goto done;
oom:
    snprintf(err, n, "out of memory");
done:
    json_decref(tj);
    json_decref(tc);
    if (rc != 0) hf_vocab_free(v);
    return rc;
}

void hf_vocab_free(hf_vocab *v) {
    for (int i = 0; v->tokens && i < v->n; i++) free(v->tokens[i]);
    for (int i = 0; v->merges && i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->merges);
    free(v->chat_template);
    memset(v, 0, sizeof *v);
}
