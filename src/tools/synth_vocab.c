/* The tokenizer of a synthetic model: a real Qwen byte-level BPE vocabulary copied from one of
 * the vocabulary-only GGUF files (ggml-vocab-qwen2.gguf / ggml-vocab-qwen35.gguf), so text in
 * and text out work. Full-size presets keep the whole vocabulary and pad the token list with
 * "[PADn]" entries up to the embedding rows, as the real checkpoints do (151,936 / 248,320);
 * tiny presets keep the 256 byte symbols and the first merges (the fixtures' recipe). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "tools/synth.h"
#include "tools/synth_internal.h"

#ifndef SLUICE_DATA_DIRS
#define SLUICE_DATA_DIRS ""
#endif

/* Token types (llama.cpp's enum): 1 normal, 3 control, 4 user-defined. */
#define TT_CONTROL 3
#define TT_USER 4

const char *synth_vocab_search_path(void) {
    const char *env = getenv("SLUICE_VOCAB_DIR");
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s%s%s", env ? env : "", env ? ":" : "",
             SLUICE_DATA_DIRS ":tests/data:../shared/fixtures/tokenizer");
    return buf;
}

static bool find_vocab(const char *vocab, char *out, size_t cap) {
    const char *p = synth_vocab_search_path();
    while (*p) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0) {
            snprintf(out, cap, "%.*s/ggml-vocab-%s.gguf", (int)n, p, vocab);
            if (access(out, R_OK) == 0) return true;
        }
        p += n + (e ? 1 : 0);
    }
    return false;
}

static char *dup_view(gguf_str s) {
    char *c = malloc(s.len + 1);
    if (c) {
        memcpy(c, s.ptr, s.len);
        c[s.len] = 0;
    }
    return c;
}

static void free_strs(char **s, uint64_t n) {
    if (!s) return;
    for (uint64_t i = 0; i < n; i++) free(s[i]);
    free(s);
}

int synth_vocab_write(gguf_writer *w, const synth_preset *p, const char *path, char *used,
                      size_t used_cap, char *err, size_t err_len) {
    char found[4096];
    if (!path) {
        if (!find_vocab(p->vocab, found, sizeof found)) {
            snprintf(err, err_len,
                     "vocabulary file ggml-vocab-%s.gguf not found (searched %s; give --vocab FILE)",
                     p->vocab, synth_vocab_search_path());
            return -1;
        }
        path = found;
    }
    snprintf(used, used_cap, "%s", path);
    char gerr[512];
    gguf_file *g = gguf_open(path, gerr, sizeof gerr);
    if (!g) {
        snprintf(err, err_len, "vocabulary: %s", gerr);
        return -1;
    }
    int rc = -1;
    char **strs = NULL;
    int32_t *types = NULL;
    uint64_t n_out = 0, n_merges_out = 0;
    char **merges = NULL;
    const gguf_kv *ktok = gguf_find(g, "tokenizer.ggml.tokens");
    const gguf_kv *ktype = gguf_find(g, "tokenizer.ggml.token_type");
    const gguf_kv *kmerge = gguf_find(g, "tokenizer.ggml.merges");
    gguf_str model, pre;
    if (!ktok || ktok->type != GGUF_VT_ARRAY || ktok->arr_type != GGUF_VT_STRING || !ktype ||
        ktype->arr_type != GGUF_VT_I32 || ktype->arr_n != ktok->arr_n || !kmerge ||
        kmerge->arr_type != GGUF_VT_STRING || !gguf_get_str(g, "tokenizer.ggml.model", &model) ||
        !gguf_get_str(g, "tokenizer.ggml.pre", &pre)) {
        snprintf(err, err_len, "vocabulary %s: not a gpt2 vocabulary file", path);
        goto done;
    }
    const uint64_t n_file = ktok->arr_n;
    uint32_t bos = 0, eos = 0, pad = 0;
    if (p->tiny_vocab) {
        /* 256 byte symbols + merges in rank order, then the three ChatML specials */
        n_out = (uint64_t)p->tiny_vocab;
        const uint64_t n_keep = n_out - 3;
        if (n_keep < 256 || n_keep > n_file) {
            snprintf(err, err_len, "tiny vocabulary of %llu tokens is not possible",
                     (unsigned long long)n_out);
            goto done;
        }
        n_merges_out = n_keep - 256 < kmerge->arr_n ? n_keep - 256 : kmerge->arr_n;
        static const char *const specials[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
        strs = calloc(n_out, sizeof *strs);
        types = calloc(n_out, sizeof *types);
        merges = calloc(n_merges_out ? n_merges_out : 1, sizeof *merges);
        if (!strs || !types || !merges) goto oom;
        for (uint64_t i = 0; i < n_out; i++) {
            strs[i] = i < n_keep ? dup_view(ktok->arr_strs[i]) : strdup(specials[i - n_keep]);
            int64_t t = 1;
            if (i < n_keep) gguf_arr_get_i64(ktype, i, &t);
            types[i] = i < n_keep ? (int32_t)t : TT_CONTROL;
            if (!strs[i]) goto oom;
        }
        for (uint64_t i = 0; i < n_merges_out; i++)
            if (!(merges[i] = dup_view(kmerge->arr_strs[i]))) goto oom;
        bos = eos = pad = (uint32_t)n_keep;
    } else {
        n_out = (uint64_t)p->n_vocab;
        if (n_file > n_out) {
            snprintf(err, err_len, "vocabulary %s has %llu tokens, more than the preset's %d", path,
                     (unsigned long long)n_file, p->n_vocab);
            goto done;
        }
        strs = calloc(n_out, sizeof *strs);
        types = calloc(n_out, sizeof *types);
        if (!strs || !types) goto oom;
        for (uint64_t i = 0; i < n_out; i++) {
            if (i < n_file) {
                strs[i] = dup_view(ktok->arr_strs[i]);
                int64_t t = 1;
                gguf_arr_get_i64(ktype, i, &t);
                types[i] = (int32_t)t;
            } else {
                char b[32];
                snprintf(b, sizeof b, "[PAD%llu]", (unsigned long long)i);
                strs[i] = strdup(b);
                types[i] = TT_USER;
            }
            if (!strs[i]) goto oom;
        }
        uint32_t v;
        bos = gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &v) ? v : 0;
        eos = gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &v) ? v : bos;
        pad = gguf_get_u32(g, "tokenizer.ggml.padding_token_id", &v) ? v : eos;
    }
    char *model_s = dup_view(model), *pre_s = dup_view(pre);
    bool ok = model_s && pre_s && gguf_w_str(w, "tokenizer.ggml.model", model_s) == 0 &&
              gguf_w_str(w, "tokenizer.ggml.pre", pre_s) == 0 &&
              gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)strs, n_out) == 0 &&
              gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, types, n_out) == 0 &&
              (p->tiny_vocab ? gguf_w_arr_str(w, "tokenizer.ggml.merges",
                                              (const char *const *)merges, n_merges_out)
                             : gguf_w_copy_kv(w, kmerge)) == 0 &&
              gguf_w_u32(w, "tokenizer.ggml.bos_token_id", bos) == 0 &&
              gguf_w_u32(w, "tokenizer.ggml.eos_token_id", eos) == 0 &&
              gguf_w_u32(w, "tokenizer.ggml.padding_token_id", pad) == 0 &&
              gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false) == 0;
    const gguf_kv *tmpl = gguf_find(g, "tokenizer.chat_template");
    if (ok && tmpl && tmpl->type == GGUF_VT_STRING) ok = gguf_w_copy_kv(w, tmpl) == 0;
    free(model_s);
    free(pre_s);
    if (!ok) goto oom;
    rc = 0;
    goto done;
oom:
    snprintf(err, err_len, "out of memory copying the vocabulary");
done:
    free_strs(strs, n_out);
    free_strs(merges, n_merges_out);
    free(types);
    gguf_close(g);
    return rc;
}
