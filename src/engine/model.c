/* sluice_model: open the GGUF, pick the architecture, bind weights, build the tokenizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/error.h"
#include "models/model.h"

static void copy_str(char *dst, size_t cap, gguf_str s) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = 0;
}

static sluice_model *load_from(gguf_file *g, const char *label) {
    char err[512] = "";
    sluice_model *m = calloc(1, sizeof *m);
    if (!m) {
        gguf_close(g);
        sluice_set_error("%s: out of memory", label);
        return NULL;
    }
    m->gguf = g;
    gguf_str s;
    if (!gguf_get_str(g, "general.architecture", &s)) {
        sluice_set_error("%s: missing general.architecture", label);
        goto fail;
    }
    copy_str(m->arch_name, sizeof m->arch_name, s);
    m->arch = arch_find(m->arch_name);
    if (!m->arch) {
        sluice_set_error("%s: architecture '%s' is not supported (supported: %s)", label,
                         m->arch_name, arch_supported_list());
        goto fail;
    }
    if (gguf_get_str(g, "general.name", &s)) copy_str(m->name, sizeof m->name, s);
    else copy_str(m->name, sizeof m->name, (gguf_str){label, strlen(label)});

    if (m->arch->load(m, err, sizeof err) != 0) {
        sluice_set_error("%s: %s", label, err);
        goto fail;
    }
    m->tok = tokenizer_load(g, err, sizeof err);
    if (!m->tok) {
        sluice_set_error("%s: tokenizer: %s", label, err);
        goto fail;
    }
    if (tokenizer_n_vocab(m->tok) > m->hp.n_vocab) {
        sluice_set_error("%s: the tokenizer has %d tokens but the model only %d embeddings",
                         label, tokenizer_n_vocab(m->tok), m->hp.n_vocab);
        goto fail;
    }
    return m;
fail:
    sluice_model_free(m);
    return NULL;
}

sluice_model *sluice_model_load(const char *path, const sluice_model_params *params) {
    (void)params;
    char err[512];
    gguf_file *g = gguf_open(path, err, sizeof err);
    if (!g) {
        sluice_set_error("%s", err);
        return NULL;
    }
    const char *base = strrchr(path, '/');
    return load_from(g, base ? base + 1 : path);
}

sluice_model *sluice_model_load_memory(const void *data, size_t size, const char *name,
                                       const sluice_model_params *params) {
    (void)params;
    char err[512];
    gguf_file *g = gguf_open_memory(data, size, err, sizeof err);
    if (!g) {
        sluice_set_error("%s: %s", name, err);
        return NULL;
    }
    return load_from(g, name);
}

void sluice_model_free(sluice_model *m) {
    if (!m) return;
    expert_store_free(m->experts);
    tokenizer_free(m->tok);
    free(m->layers);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    gguf_close(m->gguf);
    free(m);
}

void sluice_model_get_info(const sluice_model *m, sluice_model_info *info) {
    memset(info, 0, sizeof *info);
    info->arch = m->arch_name;
    info->name = m->name;
    info->n_vocab = m->hp.n_vocab;
    info->n_ctx_train = m->hp.n_ctx_train;
    info->n_layer = m->hp.n_layer;
    info->n_embd = m->hp.n_embd;
    info->n_expert = m->hp.n_expert;
    info->n_expert_used = m->hp.n_expert_used;
    info->n_params = m->n_params;
    info->file_bytes = m->gguf->size;
    info->bos = tokenizer_bos(m->tok);
    info->eos = tokenizer_eos(m->tok);
    info->add_bos = tokenizer_add_bos(m->tok);
}

int sluice_tokenize(const sluice_model *m, const char *text, size_t len, bool parse_special,
                    bool add_bos, int32_t *ids, int cap) {
    int32_t *buf = NULL;
    size_t n = 0, bcap = 0;
    if (tokenizer_encode(m->tok, text, len, parse_special, add_bos && tokenizer_add_bos(m->tok),
                         &buf, &n, &bcap) != 0) {
        free(buf);
        sluice_set_error("tokenize: out of memory");
        return -1;
    }
    if (n > (size_t)INT32_MAX) {
        free(buf);
        sluice_set_error("tokenize: text too long");
        return -1;
    }
    for (size_t i = 0; i < n && (int)i < cap; i++) ids[i] = buf[i];
    free(buf);
    return (int)n;
}

int sluice_token_to_piece(const sluice_model *m, int32_t id, bool render_special, char *buf,
                          int cap) {
    if (id < 0 || id >= tokenizer_n_vocab(m->tok)) return 0;
    return (int)tokenizer_piece(m->tok, id, render_special, buf, cap > 0 ? (size_t)cap : 0);
}

bool sluice_token_is_eog(const sluice_model *m, int32_t id) {
    return tokenizer_is_eog(m->tok, id);
}

void sluice_model_expert_stats(const sluice_model *m, sluice_expert_stats *stats) {
    if (m->experts) *stats = m->experts->stats;
    else memset(stats, 0, sizeof *stats);
}
