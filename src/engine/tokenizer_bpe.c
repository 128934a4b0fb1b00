/* Byte-level BPE ("gpt2" tokenizer model), as llama.cpp implements it.
 *
 * Pipeline for one raw-text fragment (special tokens were split off by tokenizer.c):
 *   1. Read the bytes as llama.cpp does: lenient UTF-8, invalid bytes become U+FFFD.
 *   2. Pre-tokenize with the regexes of tokenizer.ggml.pre (PCRE2, Unicode properties). Several
 *      regexes are applied in turn, each splitting the pieces of the previous one; the text
 *      between matches stays a piece of its own.
 *   3. Each piece: bytes -> byte-level symbols (GPT-2's bytes_to_unicode), then the adjacent pair
 *      with the lowest merge rank is merged (ties: leftmost) until no pair has a rank.
 *   4. Symbols -> token ids; a symbol missing from the vocabulary falls back to its bytes.
 *
 * llama.cpp runs the qwen2/qwen35/llama3/gpt2 regexes through hand-written scanners. Those
 * scanners are equivalent to the regexes with one exception that matters: "\s" is llama.cpp's
 * Unicode White_Space set, not PCRE2's (which adds U+180E). The patterns below therefore spell
 * the whitespace class out.
 */
#include "engine/tokenizer_internal.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/unicode_utf8.h"

/* ------------------------------------------------------------------------------------------ */
/* Pre-tokenizer regexes                                                                       */

/* llama.cpp's whitespace set (unicode_set_whitespace: the White_Space property). */
#define WS "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define WS_TAIL "|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"

/* Qwen2/Qwen3 (tokenizer.json: (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+): digits one by one. */
static const char RE_QWEN2[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*" WS_TAIL;
/* Qwen3.5: combining marks join letters and leave the punctuation class. */
static const char RE_QWEN35[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^" WS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*" WS_TAIL;
/* Llama 3: digits in groups of up to three. */
static const char RE_LLAMA3[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*" WS_TAIL;
/* GPT-2. llama.cpp's pattern lacks a final \s+, but its scanner behaves as if it had one. */
static const char RE_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS
                              "]+(?![^" WS "])|[" WS "]+";
static const char RE_DIGIT[] = "\\p{N}";
/* llama.cpp's fallback for "default" (and a missing pre key): four passes. */
static const char RE_DEFAULT_PUNCT[] = "[\\p{P}\\$\\+<=>\\^~\\|]+";
static const char RE_DIGITS[] = "\\p{N}+";
static const char RE_DIGITS3[] = "[0-9][0-9][0-9]";

enum { MAX_PASSES = 4 };

typedef struct pre_def {
    const char *name;
    const char *passes[MAX_PASSES]; /* NULL-terminated */
    bool clean_spaces;
    bool add_bos;
    bool ignore_merges;
    bool no_bos;
} pre_def;

#define PASSES_DEFAULT {RE_DEFAULT_PUNCT, RE_GPT2, RE_DIGITS, RE_DIGITS3}
#define PASSES_STARCODER {RE_DIGIT, RE_GPT2, NULL, NULL}

/* tokenizer.ggml.pre values and llama.cpp's settings for them (llama-vocab.cpp, load()). */
static const pre_def PRE_DEFS[] = {
    {"default", PASSES_DEFAULT, true, false, false, false},
    {"qwen2", {RE_QWEN2}, false, false, false, false},
    {"deepseek-r1-qwen", {RE_QWEN2}, false, false, false, false},
    {"kormo", {RE_QWEN2}, false, false, false, false},
    {"f2llmv2", {RE_QWEN2}, false, false, false, false},
    {"hunyuan", {RE_QWEN2}, false, false, false, false},
    {"solar-open", {RE_QWEN2}, false, false, false, false},
    {"grok-2", {RE_QWEN2}, false, false, false, false},
    {"megrez", {RE_QWEN2}, true, false, false, false},
    {"stablelm2", {RE_QWEN2}, true, false, false, false},
    {"qwen35", {RE_QWEN35}, false, false, false, false},
    {"llama3", {RE_LLAMA3}, true, true, true, false},
    {"llama-v3", {RE_LLAMA3}, true, true, true, false},
    {"llama-bpe", {RE_LLAMA3}, true, true, true, false},
    {"falcon3", {RE_LLAMA3}, true, true, true, false},
    {"falcon-h1", {RE_LLAMA3}, true, true, true, false},
    {"pixtral", {RE_LLAMA3}, true, true, true, false},
    {"midm-2.0", {RE_LLAMA3}, true, true, true, false},
    {"lfm2", {RE_LLAMA3}, true, true, true, false},
    {"jina-v5-nano", {RE_LLAMA3}, true, true, true, false},
    {"dbrx", {RE_LLAMA3}, true, false, false, false},
    {"smaug-bpe", {RE_LLAMA3}, true, false, false, false},
    {"glm4", {RE_LLAMA3}, true, false, false, true},
    {"chatglm-bpe", {RE_LLAMA3}, true, false, false, true},
    {"gpt2", {RE_GPT2}, true, false, false, false}, /* not a llama.cpp name; its obvious meaning */
    {"gpt-2", {RE_GPT2}, true, false, false, false},
    {"phi-2", {RE_GPT2}, true, false, false, false},
    {"jina-es", {RE_GPT2}, true, false, false, false},
    {"jina-de", {RE_GPT2}, true, false, false, false},
    {"gigachat", {RE_GPT2}, true, false, false, false},
    {"jina-v2-es", {RE_GPT2}, true, false, false, false},
    {"jina-v2-de", {RE_GPT2}, true, false, false, false},
    {"a.x-4.0", {RE_GPT2}, true, false, false, false},
    {"mellum", {RE_GPT2}, true, false, false, false},
    {"modern-bert", {RE_GPT2}, true, false, false, false},
    {"jina-v1-en", {RE_GPT2}, true, false, false, false},
    {"jina-v2-code", {RE_GPT2}, true, false, false, false},
    {"roberta-bpe", {RE_GPT2}, true, false, false, false},
    {"mpt", {RE_GPT2}, true, false, false, false},
    {"olmo", {RE_GPT2}, true, false, false, false},
    {"jais", {RE_GPT2}, true, false, false, false},
    {"exaone4", {RE_GPT2}, true, false, false, false},
    {"trillion", {RE_GPT2}, false, false, false, false},
    {"granite-docling", {RE_GPT2}, false, false, false, false},
    {"starcoder", PASSES_STARCODER, true, false, false, false},
    {"refact", PASSES_STARCODER, true, false, false, false},
    {"codeshell", PASSES_STARCODER, true, false, false, false},
    {"exaone", PASSES_STARCODER, true, false, false, false},
    {"minerva-7b", PASSES_STARCODER, true, false, false, false},
    {"mellum2", PASSES_STARCODER, true, false, false, false},
    {"command-r", PASSES_STARCODER, false, false, false, false},
    {"smollm", PASSES_STARCODER, false, false, false, false},
};

static const pre_def *pre_find(const char *pre, size_t len) {
    if (!pre) return &PRE_DEFS[0]; /* llama.cpp: missing key -> "default" (with a warning) */
    for (size_t i = 0; i < sizeof PRE_DEFS / sizeof PRE_DEFS[0]; i++) {
        if (strlen(PRE_DEFS[i].name) == len && memcmp(PRE_DEFS[i].name, pre, len) == 0)
            return &PRE_DEFS[i];
    }
    return NULL;
}

tok_bpe_pre_info tok_bpe_pre_lookup(const char *pre, size_t pre_len) {
    tok_bpe_pre_info info = {false, true, false, false};
    const pre_def *d = pre_find(pre, pre_len);
    if (d) {
        info.known = true;
        info.clean_spaces = d->clean_spaces;
        info.add_bos = d->add_bos;
        info.no_bos = d->no_bos;
    }
    return info;
}

/* ------------------------------------------------------------------------------------------ */
/* GPT-2 byte <-> symbol map: printable bytes stand for themselves, the other 68 (0x00-0x20,
 * 0x7F-0xA0, 0xAD) map in order to U+0100.. U+0143. */

static uint32_t byte_to_cp(unsigned b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 256 + b;
    if (b >= 0x7F && b <= 0xA0) return 256 + 33 + (b - 0x7F);
    return 256 + 67; /* 0xAD */
}

static int cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 256 && cp <= 256 + 32) return (int)(cp - 256);
    if (cp >= 256 + 33 && cp <= 256 + 66) return (int)(cp - 256 - 33 + 0x7F);
    if (cp == 256 + 67) return 0xAD;
    return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Merge table: (left id, right id) -> (rank, merged id), open addressing. Keys are built from
 * ids < 2^31, so an all-ones key marks an empty slot. */

#define MERGE_EMPTY UINT64_MAX

typedef struct merge_val {
    int32_t rank;
    int32_t result; /* id of left+right, -1 when the vocabulary lacks it */
} merge_val;

struct tok_bpe {
    pcre2_code *re[MAX_PASSES];
    int n_re;
    bool ignore_merges;
    int32_t byte_tok[256]; /* id of each byte's symbol, -1 if missing */
    uint64_t *mkey;
    merge_val *mval;
    uint64_t mmask;
};

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static const merge_val *merge_find(const tok_bpe *b, int32_t l, int32_t r) {
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    for (uint64_t i = mix64(key) & b->mmask;; i = (i + 1) & b->mmask) {
        if (b->mkey[i] == key) return &b->mval[i];
        if (b->mkey[i] == MERGE_EMPTY) return NULL;
    }
}

/* Inserts unless present (a repeated merge keeps its first, lowest, rank, as llama.cpp's
 * unordered_map::emplace does). */
static void merge_insert(tok_bpe *b, int32_t l, int32_t r, merge_val v) {
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    for (uint64_t i = mix64(key) & b->mmask;; i = (i + 1) & b->mmask) {
        if (b->mkey[i] == key) return;
        if (b->mkey[i] == MERGE_EMPTY) {
            b->mkey[i] = key;
            b->mval[i] = v;
            return;
        }
    }
}

static void set_err(char *err, size_t err_len, const char *fmt, ...) {
    if (!err || !err_len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

tok_bpe *tok_bpe_new(const tok_vocab *v, const char *pre, size_t pre_len, const gguf_kv *merges,
                     char *err, size_t err_len) {
    const pre_def *d = pre_find(pre, pre_len);
    if (!d) {
        set_err(err, err_len, "tokenizer.ggml.pre: unknown pre-tokenizer '%.*s'",
                (int)(pre_len > 60 ? 60 : pre_len), pre);
        return NULL;
    }
    if (!merges) {
        set_err(err, err_len, "tokenizer.ggml.merges: missing (required for gpt2)");
        return NULL;
    }
    if (merges->type != GGUF_VT_ARRAY || merges->arr_type != GGUF_VT_STRING ||
        (!merges->arr_strs && merges->arr_n)) {
        set_err(err, err_len, "tokenizer.ggml.merges: not an array of strings");
        return NULL;
    }
    if (merges->arr_n > (uint64_t)INT32_MAX) {
        set_err(err, err_len, "tokenizer.ggml.merges: too many entries");
        return NULL;
    }
    tok_bpe *b = calloc(1, sizeof *b);
    if (!b) goto oom;
    b->ignore_merges = d->ignore_merges;

    for (int i = 0; i < MAX_PASSES && d->passes[i]; i++) {
        int ec;
        PCRE2_SIZE eo;
        b->re[i] = pcre2_compile((PCRE2_SPTR)d->passes[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
        if (!b->re[i]) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof msg);
            set_err(err, err_len, "pre-tokenizer regex: %s at %zu", (const char *)msg, (size_t)eo);
            tok_bpe_free(b);
            return NULL;
        }
        /* JIT makes matching several times faster; without it the interpreter is used */
        (void)pcre2_jit_compile(b->re[i], PCRE2_JIT_COMPLETE);
        b->n_re = i + 1;
    }

    for (unsigned c = 0; c < 256; c++) {
        char s[4];
        size_t n = utf8_encode(byte_to_cp(c), s);
        b->byte_tok[c] = tok_vocab_find(v, s, n);
    }

    uint64_t cap = 16;
    while (cap < merges->arr_n * 2 + 16) cap <<= 1;
    b->mkey = malloc(cap * sizeof *b->mkey);
    b->mval = malloc(cap * sizeof *b->mval);
    if (!b->mkey || !b->mval) goto oom;
    memset(b->mkey, 0xFF, cap * sizeof *b->mkey);
    b->mmask = cap - 1;

    size_t buf_cap = 256;
    char *buf = malloc(buf_cap);
    if (!buf) goto oom;
    for (uint64_t i = 0; i < merges->arr_n; i++) {
        const char *s = merges->arr_strs[i].ptr;
        size_t len = (size_t)merges->arr_strs[i].len;
        /* "left right": split at the first space after the first byte, as llama.cpp does */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp) {
            set_err(err, err_len, "tokenizer.ggml.merges[%llu]: no space in '%.*s'",
                    (unsigned long long)i, (int)(len > 60 ? 60 : len), s);
            free(buf);
            tok_bpe_free(b);
            return NULL;
        }
        size_t ll = (size_t)(sp - s), rl = len - ll - 1;
        int32_t l = tok_vocab_find(v, s, ll), r = tok_vocab_find(v, sp + 1, rl);
        if (l < 0 || r < 0) {
            set_err(err, err_len,
                    "tokenizer.ggml.merges[%llu]: '%.*s' names a token not in the vocabulary",
                    (unsigned long long)i, (int)(len > 60 ? 60 : len), s);
            free(buf);
            tok_bpe_free(b);
            return NULL;
        }
        if (ll + rl > buf_cap) {
            buf_cap = (ll + rl) * 2;
            char *nb = realloc(buf, buf_cap);
            if (!nb) {
                free(buf);
                goto oom;
            }
            buf = nb;
        }
        memcpy(buf, s, ll);
        memcpy(buf + ll, sp + 1, rl);
        merge_val mv = {(int32_t)i, tok_vocab_find(v, buf, ll + rl)};
        merge_insert(b, l, r, mv);
    }
    free(buf);
    return b;
oom:
    set_err(err, err_len, "tokenizer: out of memory");
    tok_bpe_free(b);
    return NULL;
}

void tok_bpe_free(tok_bpe *b) {
    if (!b) return;
    for (int i = 0; i < MAX_PASSES; i++) pcre2_code_free(b->re[i]);
    free(b->mkey);
    free(b->mval);
    free(b);
}

/* ------------------------------------------------------------------------------------------ */
/* Encoding */

typedef struct span {
    size_t a, b; /* byte range [a, b) */
} span;

typedef struct span_vec {
    span *v;
    size_t n, cap;
} span_vec;

static int span_push(span_vec *s, size_t a, size_t b) {
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        span *nv = realloc(s->v, nc * sizeof *nv);
        if (!nv) return -1;
        s->v = nv;
        s->cap = nc;
    }
    s->v[s->n].a = a;
    s->v[s->n].b = b;
    s->n++;
    return 0;
}

/* Split every span of in by re: matches and the gaps between them become spans of out. The
 * subject of each search is the span alone, so lookarounds see its ends as the text's ends. */
static int regex_split(const pcre2_code *re, pcre2_match_data *md, const char *text,
                       const span_vec *in, span_vec *out) {
    out->n = 0;
    for (size_t k = 0; k < in->n; k++) {
        const char *sub = text + in->v[k].a;
        size_t len = in->v[k].b - in->v[k].a, pos = 0;
        while (pos < len) {
            int rc = pcre2_match(re, (PCRE2_SPTR)sub, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
                /* a resource limit (JIT stack): the interpreter keeps its state on the heap */
                rc = pcre2_match(re, (PCRE2_SPTR)sub, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                                 md, NULL);
            }
            if (rc < 0) break; /* no more matches (or still a limit: the rest is one piece) */
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me <= ms) { /* empty match: none of our patterns has one; step over a char */
                size_t step = 1;
                while (ms + step < len && ((unsigned char)sub[ms + step] & 0xC0) == 0x80) step++;
                me = ms + step;
            }
            if (ms > pos && span_push(out, in->v[k].a + pos, in->v[k].a + ms)) return -1;
            if (span_push(out, in->v[k].a + ms, in->v[k].a + me)) return -1;
            pos = me;
        }
        if (pos < len && span_push(out, in->v[k].a + pos, in->v[k].b)) return -1;
    }
    return 0;
}

/* Per-call scratch for the merge loop (encode is reentrant: nothing mutable is shared). */
typedef struct bigram {
    int32_t rank, left, lid, rid;
} bigram;

typedef struct scratch {
    int32_t *id, *prev, *next;
    uint32_t *start, *len;
    size_t sym_cap;
    tok_heap heap; /* of bigram */
    char *enc;
    size_t enc_cap;
} scratch;

/* merge order: lowest rank first, then leftmost */
static bool bigram_less(const void *a, const void *b) {
    const bigram *x = a, *y = b;
    return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

static int scratch_reserve(scratch *s, size_t n) {
    if (n <= s->sym_cap) return 0;
    size_t nc = s->sym_cap ? s->sym_cap : 64;
    while (nc < n) nc *= 2;
    int32_t *a = realloc(s->id, nc * sizeof *a);
    if (!a) return -1;
    s->id = a;
    a = realloc(s->prev, nc * sizeof *a);
    if (!a) return -1;
    s->prev = a;
    a = realloc(s->next, nc * sizeof *a);
    if (!a) return -1;
    s->next = a;
    uint32_t *u = realloc(s->start, nc * sizeof *u);
    if (!u) return -1;
    s->start = u;
    u = realloc(s->len, nc * sizeof *u);
    if (!u) return -1;
    s->len = u;
    s->sym_cap = nc;
    return 0;
}

static int try_bigram(const tok_bpe *b, scratch *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0 || s->id[l] < 0 || s->id[r] < 0) return 0;
    const merge_val *m = merge_find(b, s->id[l], s->id[r]);
    if (!m) return 0;
    bigram g = {m->rank, l, s->id[l], s->id[r]};
    return tok_heap_push(&s->heap, &g);
}

/* BPE of one pre-tokenized word (bytes as llama.cpp normalized them). */
static int bpe_word(const tok_bpe *b, const tok_vocab *v, scratch *s, const char *w, size_t wlen,
                    int32_t **ids, size_t *n, size_t *cap) {
    if (wlen == 0) return 0;
    if (wlen > INT32_MAX / 2) return -1;
    if (b->ignore_merges) {
        /* llama3-style vocabularies take a word whole when it is a token */
        if (wlen * 2 > s->enc_cap) {
            char *ne = realloc(s->enc, wlen * 2);
            if (!ne) return -1;
            s->enc = ne;
            s->enc_cap = wlen * 2;
        }
        size_t el = 0;
        for (size_t i = 0; i < wlen; i++) el += utf8_encode(byte_to_cp((unsigned char)w[i]), s->enc + el);
        int32_t id = tok_vocab_find(v, s->enc, el);
        if (id >= 0) return tok_push(ids, n, cap, id);
    }
    if (scratch_reserve(s, wlen)) return -1;
    int32_t ns = (int32_t)wlen;
    for (int32_t i = 0; i < ns; i++) {
        s->id[i] = b->byte_tok[(unsigned char)w[i]];
        s->start[i] = (uint32_t)i;
        s->len[i] = 1;
        s->prev[i] = i - 1;
        s->next[i] = i + 1 < ns ? i + 1 : -1;
    }
    s->heap.n = 0;
    for (int32_t i = 1; i < ns; i++)
        if (try_bigram(b, s, i - 1, i)) return -1;
    while (s->heap.n) {
        bigram g;
        tok_heap_pop(&s->heap, &g);
        int32_t l = g.left, r = s->next[l];
        /* stale: a side was merged away, or grew into a different token */
        if (s->len[l] == 0 || r < 0 || s->id[l] != g.lid || s->id[r] != g.rid) continue;
        const merge_val *m = merge_find(b, g.lid, g.rid);
        s->len[l] += s->len[r];
        s->len[r] = 0;
        s->id[l] = m->result;
        s->next[l] = s->next[r];
        if (s->next[r] >= 0) s->prev[s->next[r]] = l;
        if (try_bigram(b, s, s->prev[l], l) || try_bigram(b, s, l, s->next[l])) return -1;
    }
    for (int32_t i = 0; i >= 0; i = s->next[i]) {
        if (s->id[i] >= 0) {
            if (tok_push(ids, n, cap, s->id[i])) return -1;
            continue;
        }
        /* a merged symbol the vocabulary lacks: its bytes one by one (llama.cpp does the same,
         * looking the bytes up as 1-byte strings, which loses non-ASCII bytes; the byte-level
         * symbols used here keep every byte) */
        for (uint32_t k = 0; k < s->len[i]; k++) {
            int32_t t = b->byte_tok[(unsigned char)w[s->start[i] + k]];
            if (t >= 0 && tok_push(ids, n, cap, t)) return -1;
        }
    }
    return 0;
}

int tok_bpe_encode(const tok_bpe *b, const tok_vocab *v, const char *text, size_t len,
                   int32_t **ids, size_t *n, size_t *cap) {
    if (len == 0) return 0;
    const char *norm = text, *shadow = text;
    char *norm_buf = NULL, *shadow_buf = NULL;
    size_t nlen = len;
    if (!utf8_is_valid(text, len)) {
        if (utf8_sanitize(text, len, &norm_buf, &shadow_buf, &nlen)) return -1;
        norm = norm_buf;
        shadow = shadow_buf;
    }
    int rc = -1;
    span_vec cur = {0}, nxt = {0};
    scratch s = {.heap = {.elem = sizeof(bigram), .before = bigram_less}};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md || span_push(&cur, 0, nlen)) goto done;
    for (int i = 0; i < b->n_re; i++) {
        if (regex_split(b->re[i], md, shadow, &cur, &nxt)) goto done;
        span_vec t = cur;
        cur = nxt;
        nxt = t;
    }
    for (size_t k = 0; k < cur.n; k++) {
        if (bpe_word(b, v, &s, norm + cur.v[k].a, cur.v[k].b - cur.v[k].a, ids, n, cap)) goto done;
    }
    rc = 0;
done:
    pcre2_match_data_free(md);
    free(cur.v);
    free(nxt.v);
    free(s.id);
    free(s.prev);
    free(s.next);
    free(s.start);
    free(s.len);
    free(s.heap.data);
    free(s.enc);
    free(norm_buf);
    free(shadow_buf);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Decoding */

size_t tok_bpe_decode_text(const char *text, size_t len, char *buf, size_t cap) {
    size_t o = 0, off = 0;
#define EMIT(c)                                   \
    do {                                          \
        if (o < cap) buf[o] = (char)(c);          \
        o++;                                      \
    } while (0)
    while (off < len) {
        uint32_t cp = utf8_decode_lenient(text, len, &off);
        if (cp == UTF8_INVALID) cp = UTF8_REPLACEMENT;
        int byte = cp_to_byte(cp);
        if (byte >= 0) {
            EMIT(byte);
            continue;
        }
        /* not a byte symbol: llama.cpp writes "[UNK_BYTE_0x<utf8 hex><token text>]" */
        char u[4], hex[3];
        size_t un = utf8_encode(cp, u);
        static const char pre[] = "[UNK_BYTE_0x";
        for (size_t i = 0; i < sizeof pre - 1; i++) EMIT(pre[i]);
        for (size_t i = 0; i < un; i++) {
            snprintf(hex, sizeof hex, "%02x", (unsigned char)u[i]);
            EMIT(hex[0]);
            EMIT(hex[1]);
        }
        for (size_t i = 0; i < len; i++) EMIT(text[i]);
        EMIT(']');
    }
#undef EMIT
    return o;
}
