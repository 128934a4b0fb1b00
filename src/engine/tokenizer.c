/* Tokenizer front end: loading from GGUF metadata, special-token partitioning, end-of-generation
 * set, pieces and detokenization. The algorithms are in tokenizer_bpe.c and tokenizer_spm.c.
 *
 * Behaviour follows llama.cpp's llama_vocab (load, tokenizer_st_partition, tokenize,
 * token_to_piece, detokenize); where this file is stricter (malformed metadata is an error,
 * not a warning) it says so. docs/tokenizer.md lists the details.
 */
#include "engine/tokenizer_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/unicode_utf8.h"

struct tokenizer {
    enum tok_kind kind;
    tok_vocab v;
    tok_bpe *bpe;
    int32_t bos, eos, eot, eom, unk;
    bool add_bos, add_eos;
    bool add_space_prefix; /* SPM: prefix a space to text that starts the input or follows a special */
    bool clean_spaces;     /* detokenize: clean_up_tokenization_spaces */
    uint8_t *eog;          /* per token: 1 when it ends generation */
    int32_t *special;      /* control / user-defined / unknown tokens, longest text first */
    size_t n_special;
};

/* ------------------------------------------------------------------------------------------ */
/* small helpers */

static void fail(char *err, size_t err_len, const char *fmt, ...) {
    if (!err || !err_len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

int tok_push(int32_t **ids, size_t *n, size_t *cap, int32_t id) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        int32_t *p = realloc(*ids, nc * sizeof *p);
        if (!p) return -1;
        *ids = p;
        *cap = nc;
    }
    (*ids)[(*n)++] = id;
    return 0;
}

uint64_t tok_hash_bytes(const char *s, size_t len) {
    /* FNV-1a, then a final mix so that the low bits used for slots are well spread */
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 32;
    return h;
}

int32_t tok_vocab_find(const tok_vocab *v, const char *s, size_t len) {
    for (uint64_t i = tok_hash_bytes(s, len) & v->slot_mask;; i = (i + 1) & v->slot_mask) {
        int32_t id = v->slot[i];
        if (id < 0) return -1;
        if (v->len[id] == len && memcmp(v->arena + v->off[id], s, len) == 0) return id;
    }
}

static bool is_special_type(uint8_t t) {
    return t == TOK_TYPE_CONTROL || t == TOK_TYPE_USER_DEFINED || t == TOK_TYPE_UNKNOWN;
}

/* ------------------------------------------------------------------------------------------ */
/* metadata access */

static bool is_int_type(enum gguf_vtype t) {
    return t == GGUF_VT_U8 || t == GGUF_VT_I8 || t == GGUF_VT_U16 || t == GGUF_VT_I16 ||
           t == GGUF_VT_U32 || t == GGUF_VT_I32 || t == GGUF_VT_U64 || t == GGUF_VT_I64;
}

static bool is_signed_type(enum gguf_vtype t) {
    return t == GGUF_VT_I8 || t == GGUF_VT_I16 || t == GGUF_VT_I32 || t == GGUF_VT_I64;
}

/* A special-token id key. Returns 1 and sets *out when it holds an id in [0, n), 0 when the key
 * is absent or holds the "none" sentinel (-1, or 0xFFFFFFFF as converters write it), -1 on
 * error. strict: an out-of-range id is an error (llama.cpp warns and keeps its default; for
 * bos/eos/eot/eom/unk we refuse the file instead, since generation would silently misbehave);
 * otherwise it is ignored like the sentinel. */
static int get_id(const gguf_file *f, const char *key, int32_t n, bool strict, int32_t *out,
                  char *err, size_t err_len) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return 0;
    if (!is_int_type(kv->type)) {
        fail(err, err_len, "%s: expected an integer, found %s", key, gguf_vtype_name(kv->type));
        return -1;
    }
    if (is_signed_type(kv->type)) {
        if (kv->v.i == -1) return 0;
        if (kv->v.i >= 0 && kv->v.i < n) {
            *out = (int32_t)kv->v.i;
            return 1;
        }
        if (!strict) return 0;
        fail(err, err_len, "%s = %lld is outside the vocabulary (%d tokens)", key,
             (long long)kv->v.i, (int)n);
        return -1;
    }
    if (kv->v.u == 0xFFFFFFFFu || kv->v.u == UINT64_MAX) return 0;
    if (kv->v.u < (uint64_t)n) {
        *out = (int32_t)kv->v.u;
        return 1;
    }
    if (!strict) return 0;
    fail(err, err_len, "%s = %llu is outside the vocabulary (%d tokens)", key,
         (unsigned long long)kv->v.u, (int)n);
    return -1;
}

/* 1 and *out when present, 0 when absent, -1 when present with another type */
static int get_bool(const gguf_file *f, const char *key, bool *out, char *err, size_t err_len) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return 0;
    if (kv->type != GGUF_VT_BOOL) {
        fail(err, err_len, "%s: expected a bool, found %s", key, gguf_vtype_name(kv->type));
        return -1;
    }
    *out = kv->v.u != 0;
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* vocabulary */

static int load_vocab(tokenizer *t, const gguf_file *f, char *err, size_t err_len) {
    tok_vocab *v = &t->v;
    const gguf_kv *toks = gguf_find(f, "tokenizer.ggml.tokens");
    if (!toks) {
        fail(err, err_len, "tokenizer.ggml.tokens: missing");
        return -1;
    }
    if (toks->type != GGUF_VT_ARRAY || toks->arr_type != GGUF_VT_STRING || !toks->arr_strs) {
        fail(err, err_len, "tokenizer.ggml.tokens: not an array of strings");
        return -1;
    }
    if (toks->arr_n == 0 || toks->arr_n > (uint64_t)INT32_MAX / 4) {
        fail(err, err_len, "tokenizer.ggml.tokens: %llu tokens is not a usable vocabulary",
             (unsigned long long)toks->arr_n);
        return -1;
    }
    int32_t n = (int32_t)toks->arr_n;
    v->n = n;

    const gguf_kv *scores = gguf_find(f, "tokenizer.ggml.scores");
    if (scores) {
        if (scores->type != GGUF_VT_ARRAY ||
            (scores->arr_type != GGUF_VT_F32 && scores->arr_type != GGUF_VT_I32)) {
            fail(err, err_len, "tokenizer.ggml.scores: not an array of f32 or i32");
            return -1;
        }
        if (scores->arr_n != (uint64_t)n) {
            fail(err, err_len, "tokenizer.ggml.scores: %llu entries for %d tokens",
                 (unsigned long long)scores->arr_n, (int)n);
            return -1;
        }
    }
    const gguf_kv *types = gguf_find(f, "tokenizer.ggml.token_type");
    if (types) {
        if (types->type != GGUF_VT_ARRAY || types->arr_type != GGUF_VT_I32) {
            fail(err, err_len, "tokenizer.ggml.token_type: not an array of i32");
            return -1;
        }
        if (types->arr_n != (uint64_t)n) {
            fail(err, err_len, "tokenizer.ggml.token_type: %llu entries for %d tokens",
                 (unsigned long long)types->arr_n, (int)n);
            return -1;
        }
    }

    /* llama.cpp renames empty tokens "[EMPTY_<id>]"; reserve room for that */
    uint64_t bytes = 0;
    for (int32_t i = 0; i < n; i++) bytes += toks->arr_strs[i].len + 1 + (toks->arr_strs[i].len ? 0 : 24);
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap <<= 1;
    v->arena = malloc(bytes ? bytes : 1);
    v->off = malloc((size_t)n * sizeof *v->off);
    v->len = malloc((size_t)n * sizeof *v->len);
    v->score = malloc((size_t)n * sizeof *v->score);
    v->type = malloc((size_t)n);
    v->slot = malloc(cap * sizeof *v->slot);
    t->eog = calloc((size_t)n, 1);
    if (!v->arena || !v->off || !v->len || !v->score || !v->type || !v->slot || !t->eog) {
        fail(err, err_len, "tokenizer: out of memory");
        return -1;
    }
    memset(v->slot, 0xFF, cap * sizeof *v->slot);
    v->slot_mask = cap - 1;

    uint64_t o = 0;
    for (int32_t i = 0; i < n; i++) {
        const gguf_str *s = &toks->arr_strs[i];
        if (s->len > UINT32_MAX / 2) {
            fail(err, err_len, "tokenizer.ggml.tokens[%d]: too long", (int)i);
            return -1;
        }
        v->off[i] = o;
        if (s->len == 0) {
            v->len[i] = (uint32_t)snprintf(v->arena + o, 24, "[EMPTY_%d]", (int)i);
        } else {
            memcpy(v->arena + o, s->ptr, s->len);
            v->len[i] = (uint32_t)s->len;
        }
        v->arena[o + v->len[i]] = 0;
        o += v->len[i] + 1;

        double sc = 0;
        if (scores) gguf_arr_get_f64(scores, (uint64_t)i, &sc);
        v->score[i] = (float)sc;
        int64_t ty = TOK_TYPE_NORMAL;
        if (types) gguf_arr_get_i64(types, (uint64_t)i, &ty);
        /* unknown type values count as undefined, as in llama.cpp */
        v->type[i] = (uint8_t)(ty >= TOK_TYPE_UNDEFINED && ty <= TOK_TYPE_BYTE ? ty : TOK_TYPE_UNDEFINED);

        const char *txt = v->arena + v->off[i];
        uint64_t k = tok_hash_bytes(txt, v->len[i]) & v->slot_mask;
        for (;; k = (k + 1) & v->slot_mask) {
            int32_t id = v->slot[k];
            if (id < 0) break;
            if (v->len[id] == v->len[i] && memcmp(v->arena + v->off[id], txt, v->len[i]) == 0) {
                fail(err, err_len, "tokenizer.ggml.tokens: '%.40s' appears twice (ids %d and %d)",
                     txt, (int)id, (int)i);
                return -1;
            }
        }
        v->slot[k] = i;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* special tokens and end of generation (llama-vocab.cpp, load(): "auto-detect special tokens by
 * text" and "maintain a list of tokens that cause end-of-generation") */

static const char *const EOT_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
    "<end_of_utterance>", NULL};
static const char *const EOM_TEXTS[] = {"<|eom_id|>", NULL};
static const char *const FIM_PRE_TEXTS[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>",
    "<PRE>", "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
static const char *const FIM_SUF_TEXTS[] = {
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>",
    "<SUF>", "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
static const char *const FIM_MID_TEXTS[] = {
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>",
    "<MID>", "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL};
static const char *const FIM_PAD_TEXTS[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const FIM_REP_TEXTS[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                            "<reponame>", NULL};
static const char *const FIM_SEP_TEXTS[] = {"<|file_sep|>", NULL};
static const char *const EOG_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>", "[e~[", NULL};

/* The lowest id among the tokens whose text is in list; llama.cpp also forces such a token to be
 * a control token. llama.cpp scans a hash map, so when two texts of a list are present its pick
 * is arbitrary; lowest id is a deterministic stand-in. */
static int32_t detect(tok_vocab *v, const char *const *list) {
    int32_t best = -1;
    for (; *list; list++) {
        int32_t id = tok_vocab_find(v, *list, strlen(*list));
        if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    if (best >= 0) v->type[best] = TOK_TYPE_CONTROL;
    return best;
}

static int32_t find_text(const tok_vocab *v, const char *s) { return tok_vocab_find(v, s, strlen(s)); }

static void build_eog(tokenizer *t, int32_t fim_pad, int32_t fim_rep, int32_t fim_sep) {
    tok_vocab *v = &t->v;
    if (fim_pad >= 0) t->eog[fim_pad] = 1;
    if (fim_rep >= 0) t->eog[fim_rep] = 1;
    if (fim_sep >= 0) t->eog[fim_sep] = 1;
    for (const char *const *e = EOG_TEXTS; *e; e++) {
        int32_t id = find_text(v, *e);
        if (id >= 0) {
            t->eog[id] = 1;
            v->type[id] = TOK_TYPE_CONTROL;
        }
    }
    /* gpt-oss: these always render, as user-defined tokens */
    static const char *const USER_TEXTS[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
    for (const char *const *u = USER_TEXTS; *u; u++) {
        int32_t id = find_text(v, *u);
        if (id >= 0) v->type[id] = TOK_TYPE_USER_DEFINED;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;

    /* o200k_harmony / solar-open: "<|end|>" ends a message, not the generation */
    int32_t ret = find_text(v, "<|return|>"), call = find_text(v, "<|call|>");
    int32_t calls = find_text(v, "<|calls|>"), flush = find_text(v, "<|flush|>");
    int32_t end = find_text(v, "<|end|>");
    bool has_call = (call >= 0 && t->eog[call]) || (calls >= 0 && t->eog[calls]);
    bool has_return = ret >= 0 && t->eog[ret], has_flush = flush >= 0 && t->eog[flush];
    if (end >= 0 && t->eog[end] && has_call && (has_return || has_flush)) {
        t->eog[end] = 0;
        v->type[end] = TOK_TYPE_USER_DEFINED;
    }
    /* gemma4 / paddleocr: "</s>" is not an end when "<|tool_response>" is */
    int32_t tool = find_text(v, "<|tool_response>"), s_end = find_text(v, "</s>");
    if (tool >= 0 && t->eog[tool] && s_end >= 0 && t->eog[s_end]) {
        t->eog[s_end] = 0;
        v->type[s_end] = TOK_TYPE_NORMAL;
    }
}

typedef struct len_id {
    uint32_t len;
    int32_t id;
} len_id;

static int cmp_len_desc(const void *a, const void *b) {
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int build_special_cache(tokenizer *t) {
    const tok_vocab *v = &t->v;
    size_t cnt = 0;
    for (int32_t i = 0; i < v->n; i++) cnt += is_special_type(v->type[i]);
    if (!cnt) return 0;
    len_id *tmp = malloc(cnt * sizeof *tmp);
    t->special = malloc(cnt * sizeof *t->special);
    if (!tmp || !t->special) {
        free(tmp);
        return -1;
    }
    size_t k = 0;
    for (int32_t i = 0; i < v->n; i++) {
        if (is_special_type(v->type[i])) {
            tmp[k].len = v->len[i];
            tmp[k].id = i;
            k++;
        }
    }
    qsort(tmp, cnt, sizeof *tmp, cmp_len_desc);
    for (size_t i = 0; i < cnt; i++) t->special[i] = tmp[i].id;
    t->n_special = cnt;
    free(tmp);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* load */

tokenizer *tokenizer_load(const gguf_file *f, char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (!f) {
        fail(err, err_len, "tokenizer: no file");
        return NULL;
    }
    gguf_str model, pre;
    if (!gguf_get_str(f, "tokenizer.ggml.model", &model)) {
        fail(err, err_len, "tokenizer.ggml.model: missing or not a string");
        return NULL;
    }
    enum tok_kind kind;
    if (model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0) {
        kind = TOK_BPE;
    } else if (model.len == 5 && memcmp(model.ptr, "llama", 5) == 0) {
        kind = TOK_SPM;
    } else {
        fail(err, err_len, "tokenizer.ggml.model: '%.*s' is not supported (gpt2 and llama are)",
             (int)(model.len > 40 ? 40 : model.len), model.ptr);
        return NULL;
    }
    bool has_pre = false;
    if (gguf_find(f, "tokenizer.ggml.pre")) {
        if (!gguf_get_str(f, "tokenizer.ggml.pre", &pre)) {
            fail(err, err_len, "tokenizer.ggml.pre: not a string");
            return NULL;
        }
        has_pre = true;
    }

    tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        fail(err, err_len, "tokenizer: out of memory");
        return NULL;
    }
    t->kind = kind;
    t->bos = t->eos = t->eot = t->eom = t->unk = -1;
    if (load_vocab(t, f, err, err_len)) goto bad;
    tok_vocab *v = &t->v;
    int32_t n = v->n;

    /* llama.cpp's defaults per tokenizer model, then the metadata overrides them */
    tok_bpe_pre_info pi = {true, false, false, false};
    if (kind == TOK_BPE) {
        pi = tok_bpe_pre_lookup(has_pre ? pre.ptr : NULL, has_pre ? (size_t)pre.len : 0);
        t->bpe = tok_bpe_new(v, has_pre ? pre.ptr : NULL, has_pre ? (size_t)pre.len : 0,
                             gguf_find(f, "tokenizer.ggml.merges"), err, err_len);
        if (!t->bpe) goto bad;
        t->bos = pi.no_bos ? -1 : 11;
        t->eos = 11;
        t->add_bos = pi.add_bos;
        t->clean_spaces = pi.clean_spaces;
        t->add_space_prefix = false;
    } else {
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
        t->clean_spaces = false;
    }
    /* defaults that do not fit the vocabulary are dropped */
    if (t->bos >= n) t->bos = -1;
    if (t->eos >= n) t->eos = -1;
    if (t->unk >= n) t->unk = -1;

    if (get_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err, err_len) < 0 ||
        get_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err, err_len) < 0 ||
        get_bool(f, "tokenizer.ggml.add_eos_token", &t->add_eos, err, err_len) < 0)
        goto bad;

    int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
    int32_t dummy = -1;
    struct {
        const char *key;
        int32_t *dst;
        bool strict;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", &t->bos, true},
        {"tokenizer.ggml.eos_token_id", &t->eos, true},
        {"tokenizer.ggml.eot_token_id", &t->eot, true},
        {"tokenizer.ggml.eom_token_id", &t->eom, true},
        {"tokenizer.ggml.unknown_token_id", &t->unk, true},
        {"tokenizer.ggml.seperator_token_id", &dummy, false}, /* sic: llama.cpp's spelling */
        {"tokenizer.ggml.padding_token_id", &dummy, false},
        {"tokenizer.ggml.mask_token_id", &dummy, false},
        {"tokenizer.ggml.fim_pre_token_id", &fim_pre, false},
        {"tokenizer.ggml.fim_suf_token_id", &fim_suf, false},
        {"tokenizer.ggml.fim_mid_token_id", &fim_mid, false},
        {"tokenizer.ggml.fim_pad_token_id", &fim_pad, false},
        {"tokenizer.ggml.fim_rep_token_id", &fim_rep, false},
        {"tokenizer.ggml.fim_sep_token_id", &fim_sep, false},
        {"tokenizer.ggml.prefix_token_id", &fim_pre, false}, /* deprecated spellings */
        {"tokenizer.ggml.suffix_token_id", &fim_suf, false},
        {"tokenizer.ggml.middle_token_id", &fim_mid, false},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (get_id(f, ids[i].key, n, ids[i].strict, ids[i].dst, err, err_len) < 0) goto bad;
    if (t->add_bos && t->bos < 0) {
        fail(err, err_len, "tokenizer.ggml.add_bos_token is true, but there is no BOS token");
        goto bad;
    }
    if (t->add_eos && t->eos < 0) {
        fail(err, err_len, "tokenizer.ggml.add_eos_token is true, but there is no EOS token");
        goto bad;
    }

    if (t->eot < 0) t->eot = detect(v, EOT_TEXTS);
    if (t->eom < 0) t->eom = detect(v, EOM_TEXTS);
    if (fim_pre < 0) fim_pre = detect(v, FIM_PRE_TEXTS);
    if (fim_suf < 0) fim_suf = detect(v, FIM_SUF_TEXTS);
    if (fim_mid < 0) fim_mid = detect(v, FIM_MID_TEXTS);
    if (fim_pad < 0) fim_pad = detect(v, FIM_PAD_TEXTS);
    if (fim_rep < 0) fim_rep = detect(v, FIM_REP_TEXTS);
    if (fim_sep < 0) fim_sep = detect(v, FIM_SEP_TEXTS);
    build_eog(t, fim_pad, fim_rep, fim_sep);

    if (build_special_cache(t)) {
        fail(err, err_len, "tokenizer: out of memory");
        goto bad;
    }
    return t;
bad:
    if (err && err_len && !err[0]) fail(err, err_len, "tokenizer: invalid metadata");
    tokenizer_free(t);
    return NULL;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    tok_bpe_free(t->bpe);
    free(t->v.arena);
    free(t->v.off);
    free(t->v.len);
    free(t->v.score);
    free(t->v.type);
    free(t->v.slot);
    free(t->eog);
    free(t->special);
    free(t);
}

/* ------------------------------------------------------------------------------------------ */
/* queries */

enum tok_kind tokenizer_kind(const tokenizer *t) { return t->kind; }
int32_t tokenizer_n_vocab(const tokenizer *t) { return t->v.n; }
int32_t tokenizer_bos(const tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const tokenizer *t) { return t->eos; }
bool tokenizer_add_bos(const tokenizer *t) { return t->add_bos; }
bool tokenizer_add_eos(const tokenizer *t) { return t->add_eos; }

bool tokenizer_is_eog(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->v.n && t->eog[id];
}

enum tok_type tokenizer_token_type(const tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->v.n) return TOK_TYPE_UNDEFINED;
    return (enum tok_type)t->v.type[id];
}

const char *tokenizer_token_text(const tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->v.n) return NULL;
    return tok_vocab_text(&t->v, id);
}

int32_t tokenizer_find(const tokenizer *t, const char *s, size_t len) {
    return tok_vocab_find(&t->v, s, len);
}

/* ------------------------------------------------------------------------------------------ */
/* encoding */

typedef struct frag {
    size_t off, len;
    int32_t id; /* >= 0: a special token; -1: raw text [off, off+len) */
} frag;

typedef struct frag_vec {
    frag *v;
    size_t n, cap;
} frag_vec;

static int frag_push(frag_vec *fv, size_t off, size_t len, int32_t id) {
    if (fv->n == fv->cap) {
        size_t nc = fv->cap ? fv->cap * 2 : 16;
        frag *p = realloc(fv->v, nc * sizeof *p);
        if (!p) return -1;
        fv->v = p;
        fv->cap = nc;
    }
    fv->v[fv->n].off = off;
    fv->v[fv->n].len = len;
    fv->v[fv->n].id = id;
    fv->n++;
    return 0;
}

/* The byte pairs and bytes of a text, as bit sets: a special token can only occur in the text
 * if each of its bytes and byte pairs does. Searching only for those gives the same partition
 * (the test is a necessary condition) while most of a large vocabulary's special tokens are
 * ruled out without a pass over the text: qwen3.5's 248,320-token vocabulary spent 0.7 s of a
 * 39 KB prompt's tokenization in those searches. */
typedef struct {
    uint64_t pair[65536 / 64], byte[256 / 64];
} text_pairs;

static void text_pairs_fill(text_pairs *tp, const char *text, size_t len) {
    memset(tp, 0, sizeof *tp);
    const unsigned char *u = (const unsigned char *)text;
    for (size_t i = 0; i < len; i++) {
        tp->byte[u[i] >> 6] |= 1ull << (u[i] & 63);
        if (i + 1 < len) {
            unsigned p = (unsigned)u[i] << 8 | u[i + 1];
            tp->pair[p >> 6] |= 1ull << (p & 63);
        }
    }
}

static bool text_pairs_may_hold(const text_pairs *tp, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n; i++) {
        if (!(tp->byte[u[i] >> 6] >> (u[i] & 63) & 1)) return false;
        if (i + 1 < n) {
            unsigned p = (unsigned)u[i] << 8 | u[i + 1];
            if (!(tp->pair[p >> 6] >> (p & 63) & 1)) return false;
        }
    }
    return true;
}

/* llama.cpp's tokenizer_st_partition: special tokens are taken longest first; each one splits
 * every remaining raw fragment at all its (non-overlapping, left to right) occurrences. Control
 * and unknown tokens only count when parse_special; user-defined tokens always do. */
static int partition(const tokenizer *t, const char *text, size_t len, bool parse_special,
                     frag_vec *out) {
    frag_vec a = {0}, b = {0};
    if (frag_push(&a, 0, len, -1)) return -1;
    text_pairs *tp = t->n_special ? malloc(sizeof *tp) : NULL; /* NULL: search for every token */
    if (tp) text_pairs_fill(tp, text, len);
    for (size_t s = 0; s < t->n_special; s++) {
        int32_t id = t->special[s];
        uint8_t ty = t->v.type[id];
        if (!parse_special && (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN)) continue;
        const char *st = tok_vocab_text(&t->v, id);
        size_t sl = t->v.len[id];
        if (tp && !text_pairs_may_hold(tp, st, sl)) continue;
        bool any = false;
        for (size_t k = 0; k < a.n && !any; k++)
            any = a.v[k].id < 0 && a.v[k].len >= sl && memmem(text + a.v[k].off, a.v[k].len, st, sl);
        if (!any) continue;
        b.n = 0;
        for (size_t k = 0; k < a.n; k++) {
            frag fr = a.v[k];
            if (fr.id >= 0) {
                if (frag_push(&b, fr.off, fr.len, fr.id)) goto oom;
                continue;
            }
            size_t pos = fr.off, end = fr.off + fr.len;
            while (pos < end) {
                const char *m = end - pos >= sl ? memmem(text + pos, end - pos, st, sl) : NULL;
                if (!m) break;
                size_t mo = (size_t)(m - text);
                if (mo > pos && frag_push(&b, pos, mo - pos, -1)) goto oom;
                if (frag_push(&b, mo, sl, id)) goto oom;
                pos = mo + sl;
            }
            if (pos < end && frag_push(&b, pos, end - pos, -1)) goto oom;
        }
        frag_vec tmp = a;
        a = b;
        b = tmp;
    }
    free(b.v);
    free(tp);
    *out = a;
    return 0;
oom:
    free(tp);
    free(a.v);
    free(b.v);
    return -1;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool parse_special,
                     bool add_bos, int32_t **ids, size_t *n, size_t *cap) {
    if (add_bos && t->bos >= 0 && tok_push(ids, n, cap, t->bos)) return -1;
    if (len == 0) return 0;
    frag_vec fv = {0};
    if (partition(t, text, len, parse_special, &fv)) return -1;
    int rc = -1;
    char *buf = NULL;
    bool prev_special = true; /* SPM: the input's start counts as "after a special token" */
    for (size_t k = 0; k < fv.n; k++) {
        const frag *fr = &fv.v[k];
        if (fr->id >= 0) {
            if (tok_push(ids, n, cap, fr->id)) goto done;
            prev_special = true;
            continue;
        }
        if (t->kind == TOK_BPE) {
            if (tok_bpe_encode(t->bpe, &t->v, text + fr->off, fr->len, ids, n, cap)) goto done;
        } else {
            const char *s = text + fr->off;
            size_t sl = fr->len;
            if (t->add_space_prefix && prev_special) {
                free(buf);
                buf = malloc(sl + 1);
                if (!buf) goto done;
                buf[0] = ' ';
                memcpy(buf + 1, s, sl);
                s = buf;
                sl++;
            }
            if (tok_spm_encode(&t->v, t->unk, s, sl, ids, n, cap)) goto done;
        }
        prev_special = false;
    }
    rc = 0;
done:
    free(buf);
    free(fv.v);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* pieces and detokenization */

static size_t copy_out(const char *s, size_t len, char *buf, size_t cap) {
    if (buf && cap) memcpy(buf, s, len < cap ? len : cap);
    return len;
}

/* llama_unescape_whitespace: U+2581 -> ' ' */
static size_t unescape_spaces(const char *s, size_t len, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        char c;
        if (i + 3 <= len && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
            c = ' ';
            i += 3;
        } else {
            c = s[i++];
        }
        if (o < cap) buf[o] = c;
        o++;
    }
    return o;
}

/* "<0xNN>" -> NN (llama.cpp reads the two characters after "<0x" as hex) */
static size_t byte_piece(const char *s, size_t len, char *buf, size_t cap) {
    unsigned v = 0;
    for (size_t i = 3; i < 5 && i < len; i++) {
        char c = s[i];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16;
        if (d > 15) break;
        v = v * 16 + d;
    }
    char b = (char)v;
    return copy_out(&b, 1, buf, cap);
}

size_t tokenizer_piece(const tokenizer *t, int32_t id, bool render_special, char *buf, size_t cap) {
    if (id < 0 || id >= t->v.n) return 0;
    uint8_t ty = t->v.type[id];
    const char *s = tok_vocab_text(&t->v, id);
    size_t len = t->v.len[id];
    if (!buf) cap = 0;
    switch (ty) {
    case TOK_TYPE_CONTROL:
    case TOK_TYPE_UNKNOWN:
        return render_special ? copy_out(s, len, buf, cap) : 0;
    case TOK_TYPE_USER_DEFINED:
        return copy_out(s, len, buf, cap);
    case TOK_TYPE_NORMAL:
        return t->kind == TOK_BPE ? tok_bpe_decode_text(s, len, buf, cap)
                                  : unescape_spaces(s, len, buf, cap);
    case TOK_TYPE_BYTE:
        return byte_piece(s, len, buf, cap);
    default: /* unused and undefined tokens render as nothing, as in llama.cpp */
        return 0;
    }
}

/* llama.cpp's clean_up_tokenization_spaces passes, in place; returns the new length */
static size_t clean_spaces(char *s, size_t total) {
    /* " ?", " !", " .", " ," lose the space */
    size_t t1 = total, o = total ? 1 : 0;
    for (size_t i = 1; i < t1; i++) {
        char x = s[i];
        if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) o--;
        s[o++] = x;
    }
    /* " ' " loses both spaces */
    size_t t2 = o;
    o = t2 ? 1 : 0;
    for (size_t i = 1; i < t2; i++) {
        char x = s[i];
        if (x == '\'' && i + 1 < t2 && s[i - 1] == ' ' && s[i + 1] == ' ') {
            o--;
            s[++i] = '\0';
        }
        s[o++] = x;
    }
    /* " 's", " 'm", " 're", " 've" lose the space */
    size_t t3 = o;
    o = t3 ? 1 : 0;
    for (size_t i = 1; i < t3; i++) {
        char x = s[i];
        if (s[i - 1] == ' ' && x == '\'' && i + 1 < t3) {
            char x1 = s[i + 1];
            if (x1 == 's' || x1 == 'm') {
                o--;
            } else if (i + 2 < t3) {
                char x2 = s[i + 2];
                if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) o--;
            }
        }
        s[o++] = x;
    }
    return o;
}

size_t tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, bool remove_special,
                        bool render_special, char *buf, size_t cap) {
    bool remove_space = t->add_space_prefix;
    if (remove_special && t->add_bos && n > 0 && ids[0] == t->bos) {
        /* as llama.cpp: with the BOS removed the prefixed space stays */
        remove_space = false;
        ids++;
        n--;
    }
    if (remove_special && t->add_eos && n > 0 && ids[n - 1] == t->eos) n--;

    size_t total = 0, tcap = 256;
    char *tmp = malloc(tcap);
    if (!tmp) return SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        size_t need = tokenizer_piece(t, ids[i], render_special, NULL, 0);
        if (total + need > tcap) {
            while (total + need > tcap) tcap *= 2;
            char *nt = realloc(tmp, tcap);
            if (!nt) {
                free(tmp);
                return SIZE_MAX;
            }
            tmp = nt;
        }
        size_t got = tokenizer_piece(t, ids[i], render_special, tmp + total, need);
        /* the first piece loses one leading space (the one SPM prefixed) */
        if (remove_space && got > 0 && tmp[total] == ' ') {
            memmove(tmp + total, tmp + total + 1, got - 1);
            got--;
        }
        remove_space = false;
        total += got;
    }
    if (t->clean_spaces) total = clean_spaces(tmp, total);
    copy_out(tmp, total, buf, buf ? cap : 0);
    free(tmp);
    return total;
}

/* ---- merge queue ---------------------------------------------------------------------------- */

int tok_heap_push(tok_heap *h, const void *e) {
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        unsigned char *nd = realloc(h->data, nc * h->elem);
        if (!nd) return -1;
        h->data = nd;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i > 0) { /* sift up */
        size_t p = (i - 1) / 2;
        if (!h->before(e, h->data + p * h->elem)) break;
        memcpy(h->data + i * h->elem, h->data + p * h->elem, h->elem);
        i = p;
    }
    memcpy(h->data + i * h->elem, e, h->elem);
    return 0;
}

void tok_heap_pop(tok_heap *h, void *out) {
    unsigned char last[64];
    memcpy(out, h->data, h->elem);
    memcpy(last, h->data + --h->n * h->elem, h->elem);
    size_t i = 0, n = h->n;
    for (;;) { /* sift down */
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h->before(h->data + (c + 1) * h->elem, h->data + c * h->elem)) c++;
        if (!h->before(h->data + c * h->elem, last)) break;
        memcpy(h->data + i * h->elem, h->data + c * h->elem, h->elem);
        i = c;
    }
    if (n) memcpy(h->data + i * h->elem, last, h->elem);
}
