/* Tokenizer tests: llama.cpp's test vectors for the Qwen2 / Qwen3.5 vocabularies, the golden
 * prompts of the fixture models, round trips, special tokens, invalid UTF-8, malformed metadata
 * and speed. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "engine/tokenizer.h"
#include "fixtures.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"

/* ------------------------------------------------------------------------------------------ */
/* helpers */

static char *read_all(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, fp)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(fp);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct loaded {
    gguf_file *f;
    tokenizer *t;
} loaded;

static loaded load_path(const char *path) {
    loaded l = {NULL, NULL};
    char err[256];
    l.f = gguf_open(path, err, sizeof err);
    if (!l.f) {
        fprintf(stderr, "%s: %s\n", path, err);
        return l;
    }
    l.t = tokenizer_load(l.f, err, sizeof err);
    if (!l.t) fprintf(stderr, "%s: tokenizer: %s\n", path, err);
    return l;
}

static void unload(loaded *l) {
    tokenizer_free(l->t);
    gguf_close(l->f);
}

/* A model file from the fixture sets; the first of the candidates that exists. */
static bool find_model(const char *const *names, char *out, size_t cap) {
    for (; *names; names++) {
        if (fixture_path("models", *names, out, cap)) return true;
        snprintf(out, cap, "%s/../../models/%s", SLUICE_TEST_DATA, *names);
        if (access(out, R_OK) == 0) return true;
    }
    return false;
}

typedef struct ids_t {
    int32_t *v;
    size_t n, cap;
} ids_t;

static ids_t enc(const tokenizer *t, const char *s, size_t len, bool special, bool bos) {
    ids_t r = {NULL, 0, 0};
    int rc = tokenizer_encode(t, s, len, special, bos, &r.v, &r.n, &r.cap);
    CHECK(rc == 0);
    return r;
}

static ids_t encs(const tokenizer *t, const char *s, bool special) {
    return enc(t, s, strlen(s), special, false);
}

static bool ids_eq(const ids_t *a, const int32_t *b, size_t bn) {
    return a->n == bn && (bn == 0 || memcmp(a->v, b, bn * sizeof *b) == 0);
}

static void print_ids(const char *what, const int32_t *v, size_t n) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", (int)v[i]);
    fprintf(stderr, n > 64 ? " ...\n" : "\n");
}

/* decode to a malloc'd NUL-terminated string */
static char *dec(const tokenizer *t, const int32_t *ids, size_t n, bool remove_special,
                 bool render_special, size_t *len) {
    size_t need = tokenizer_decode(t, ids, n, remove_special, render_special, NULL, 0);
    CHECK(need != SIZE_MAX);
    char *s = malloc(need + 1);
    size_t got = tokenizer_decode(t, ids, n, remove_special, render_special, s, need);
    CHECK(got == need);
    s[need] = 0;
    *len = need;
    return s;
}

static int32_t *parse_ids(const char *s, size_t len, size_t *n) {
    int32_t *v = malloc((len / 2 + 1) * sizeof *v);
    size_t k = 0, i = 0;
    while (i < len) {
        while (i < len && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
        if (i >= len) break;
        v[k++] = (int32_t)strtol(s + i, NULL, 10);
        while (i < len && s[i] != ' ' && s[i] != '\n' && s[i] != '\r' && s[i] != '\t') i++;
    }
    *n = k;
    return v;
}

/* ------------------------------------------------------------------------------------------ */
/* (1) llama.cpp's test vectors. Format as read by llama.cpp's test-tokenizer-0: the .inp file
 * is split on "\n__ggml_vocab_test__\n" (so a string's own leading and trailing newlines are
 * part of it, and a file ending in the separator has no empty last string); line i of .out
 * holds the ids of string i, whitespace-trimmed, space-separated. */

typedef struct vec_case {
    const char *s;
    size_t len;
    int32_t *ids;
    size_t n;
} vec_case;

static size_t parse_vectors(const char *inp, size_t inp_len, const char *out, size_t out_len,
                            vec_case **cases) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sl = sizeof sep - 1;
    size_t cap = 16, n = 0;
    vec_case *c = malloc(cap * sizeof *c);
    size_t pos = 0;
    while (pos < inp_len) {
        const char *m = memmem(inp + pos, inp_len - pos, sep, sl);
        size_t end = m ? (size_t)(m - inp) : inp_len;
        if (n == cap) c = realloc(c, (cap *= 2) * sizeof *c);
        c[n].s = inp + pos;
        c[n].len = end - pos;
        c[n].ids = NULL;
        c[n].n = 0;
        n++;
        if (!m) break;
        pos = end + sl;
    }
    size_t line = 0, lp = 0;
    while (lp < out_len && line < n) {
        const char *nl = memchr(out + lp, '\n', out_len - lp);
        size_t le = nl ? (size_t)(nl - out) : out_len;
        c[line].ids = parse_ids(out + lp, le - lp, &c[line].n);
        line++;
        lp = le + 1;
    }
    CHECKF(line == n, "%zu test strings but %zu result lines", n, line);
    for (; line < n; line++) c[line].ids = malloc(sizeof(int32_t));
    *cases = c;
    return n;
}

static void test_vectors(const char *vocab) {
    char path[1024], pin[1024], pout[1024];
    CHECKF(fixture_path("tokenizer", vocab, path, sizeof path), "vocab %s not found", vocab);
    char nin[256], nout[256];
    snprintf(nin, sizeof nin, "%s.inp", vocab);
    snprintf(nout, sizeof nout, "%s.out", vocab);
    CHECKF(fixture_path("tokenizer", nin, pin, sizeof pin), "%s not found", nin);
    CHECKF(fixture_path("tokenizer", nout, pout, sizeof pout), "%s not found", nout);
    double t0 = now_s();
    loaded l = load_path(path);
    double t1 = now_s();
    CHECK(l.t != NULL);
    if (!l.t) {
        unload(&l);
        return;
    }
    printf("%s: loaded %d tokens in %.3f s (gguf + tokenizer)\n", vocab, (int)tokenizer_n_vocab(l.t), t1 - t0);
    CHECK(t1 - t0 < 2.0);

    size_t il, ol;
    char *inp = read_all(pin, &il), *out = read_all(pout, &ol);
    CHECK(inp && out);
    if (!inp || !out) {
        free(inp);
        free(out);
        unload(&l);
        return;
    }
    vec_case *cases;
    size_t n = parse_vectors(inp, il, out, ol, &cases);
    size_t pass = 0, rt = 0;
    for (size_t i = 0; i < n; i++) {
        ids_t r = enc(l.t, cases[i].s, cases[i].len, false, false);
        if (ids_eq(&r, cases[i].ids, cases[i].n)) {
            pass++;
        } else {
            fprintf(stderr, "%s #%zu: '%.*s'\n", vocab, i, (int)cases[i].len, cases[i].s);
            print_ids("expected", cases[i].ids, cases[i].n);
            print_ids("got     ", r.v, r.n);
        }
        /* (3) decode(encode(s)) == s: the vectors are valid UTF-8, qwen2 does no clean-up */
        size_t dl;
        char *d = dec(l.t, r.v, r.n, false, false, &dl);
        if (dl == cases[i].len && memcmp(d, cases[i].s, dl) == 0) {
            rt++;
        } else {
            fprintf(stderr, "%s #%zu: round trip gave '%s'\n", vocab, i, d);
        }
        free(d);
        free(r.v);
    }
    printf("%s vectors %zu/%zu, round trips %zu/%zu\n", vocab, pass, n, rt, n);
    CHECK(n > 0 && pass == n);
    CHECK(rt == n);
    for (size_t i = 0; i < n; i++) free(cases[i].ids);
    free(cases);
    free(inp);
    free(out);
    unload(&l);
}

/* ------------------------------------------------------------------------------------------ */
/* (2) golden prompts */

static bool golden_prompt(const tokenizer *t, const char *prompt_name, const char *ids_name,
                          bool add_bos) {
    char pp[1024], ip[1024];
    if (!fixture_path("golden", prompt_name, pp, sizeof pp) ||
        !fixture_path("golden", ids_name, ip, sizeof ip)) {
        printf("SKIP golden %s: fixture not found\n", ids_name);
        return false;
    }
    size_t pl, il, en;
    char *p = read_all(pp, &pl), *is = read_all(ip, &il);
    CHECK(p && is);
    if (!p || !is) {
        free(p);
        free(is);
        return false;
    }
    int32_t *expect = parse_ids(is, il, &en);
    ids_t r = enc(t, p, pl, false, add_bos);
    bool ok = ids_eq(&r, expect, en);
    CHECKF(ok, "golden %s: %zu ids, expected %zu", ids_name, r.n, en);
    if (!ok) {
        print_ids("expected", expect, en);
        print_ids("got     ", r.v, r.n);
    }
    printf("golden %s: %zu/%zu ids %s\n", ids_name, r.n, en, ok ? "match" : "DIFFER");
    free(r.v);
    free(expect);
    free(p);
    free(is);
    return ok;
}

static void test_special_tiny(const tokenizer *t, int32_t im_start, int32_t im_end,
                              int32_t endoftext) {
    /* (4) chat markup is parsed into the control tokens only when asked */
    const char *chat = "<|im_start|>user\nhi<|im_end|>";
    ids_t sp = encs(t, chat, true), plain = encs(t, chat, false), mid = encs(t, "user\nhi", false);
    CHECK(sp.n == mid.n + 2 && sp.v[0] == im_start && sp.v[sp.n - 1] == im_end);
    CHECK(sp.n >= 2 && memcmp(sp.v + 1, mid.v, mid.n * sizeof(int32_t)) == 0);
    bool has_ctrl = false;
    for (size_t i = 0; i < plain.n; i++) has_ctrl |= plain.v[i] == im_start || plain.v[i] == im_end;
    CHECK(!has_ctrl && plain.n > sp.n);
    size_t dl;
    char *d = dec(t, plain.v, plain.n, false, false, &dl);
    CHECK(strcmp(d, chat) == 0); /* unparsed markup is ordinary text */
    free(d);
    d = dec(t, sp.v, sp.n, false, false, &dl);
    CHECK(strcmp(d, "user\nhi") == 0); /* control tokens render as nothing */
    free(d);
    d = dec(t, sp.v, sp.n, false, true, &dl);
    CHECK(strcmp(d, chat) == 0);
    free(d);
    char buf[64];
    CHECK(tokenizer_piece(t, im_start, false, buf, sizeof buf) == 0);
    CHECK(tokenizer_piece(t, im_start, true, buf, sizeof buf) == 12 && memcmp(buf, "<|im_start|>", 12) == 0);
    CHECK(tokenizer_token_type(t, im_start) == TOK_TYPE_CONTROL);
    /* end of generation: llama.cpp's set is eos plus the texts it knows */
    CHECK(tokenizer_is_eog(t, im_end));
    CHECK(tokenizer_is_eog(t, endoftext));
    CHECK(!tokenizer_is_eog(t, im_start));
    CHECK(!tokenizer_is_eog(t, 0) && !tokenizer_is_eog(t, -1) && !tokenizer_is_eog(t, 1 << 30));
    /* adjacent and repeated specials, text between */
    ids_t two = encs(t, "<|im_end|><|im_end|>x<|im_end|>", true);
    CHECK(two.n == 4 && two.v[0] == im_end && two.v[1] == im_end && two.v[3] == im_end);
    free(two.v);
    free(sp.v);
    free(plain.v);
    free(mid.v);
}

/* The synthetic models' vocabularies are a prefix of the Qwen2 one (fixtures/README.md): the
 * first n_normal tokens (256 byte symbols + merge results), the first n_merges merges, then
 * <|endoftext|>, <|im_start|>, <|im_end|> as control tokens, eos = bos = <|endoftext|>, no BOS
 * added. Without the model files (a plain clone) the test rebuilds that vocabulary in memory from
 * the shipped ggml-vocab-qwen2.gguf, so the golden prompts are still checked. */
typedef struct synth {
    uint8_t *mem;
    loaded l;
} synth;

static bool synth_tiny(int32_t n_normal, uint64_t n_merges, synth *out) {
    char path[1024], err[256];
    memset(out, 0, sizeof *out);
    if (!fixture_path("tokenizer", "ggml-vocab-qwen2.gguf", path, sizeof path)) return false;
    gguf_file *q = gguf_open(path, err, sizeof err);
    if (!q) return false;
    const gguf_kv *tk = gguf_find(q, "tokenizer.ggml.tokens"), *mk = gguf_find(q, "tokenizer.ggml.merges");
    bool ok = tk && mk && tk->arr_n >= (uint64_t)n_normal && mk->arr_n >= n_merges;
    size_t nt = (size_t)n_normal + 3;
    char **toks = calloc(nt, sizeof *toks), **merges = calloc(n_merges, sizeof *merges);
    int32_t *types = malloc(nt * sizeof *types);
    for (size_t i = 0; ok && i < (size_t)n_normal; i++) {
        toks[i] = strndup(tk->arr_strs[i].ptr, (size_t)tk->arr_strs[i].len);
        types[i] = TOK_TYPE_NORMAL;
    }
    static const char *const specials[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (size_t i = 0; i < 3; i++) {
        toks[n_normal + i] = strdup(specials[i]);
        types[n_normal + i] = TOK_TYPE_CONTROL;
    }
    for (uint64_t i = 0; ok && i < n_merges; i++) merges[i] = strndup(mk->arr_strs[i].ptr, (size_t)mk->arr_strs[i].len);
    size_t len = 0;
    if (ok) {
        gguf_writer *w = gguf_writer_new();
        gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
        gguf_w_str(w, "tokenizer.ggml.pre", "qwen2");
        gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, nt);
        gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, types, nt);
        gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, n_merges);
        gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)n_normal);
        gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)n_normal);
        gguf_w_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)n_normal);
        gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false);
        ok = gguf_writer_to_memory(w, &out->mem, &len) == 0;
        gguf_writer_free(w);
    }
    for (size_t i = 0; i < nt; i++) free(toks[i]);
    for (uint64_t i = 0; i < n_merges; i++) free(merges[i]);
    free(toks);
    free(merges);
    free(types);
    gguf_close(q);
    if (!ok) return false;
    out->l.f = gguf_open_memory(out->mem, len, err, sizeof err);
    if (out->l.f) out->l.t = tokenizer_load(out->l.f, err, sizeof err);
    CHECKF(out->l.t != NULL, "synthetic tiny vocabulary: %s", err);
    return out->l.t != NULL;
}

static void synth_free(synth *s) {
    unload(&s->l);
    free(s->mem);
}

/* the model's tokenizer if its file is there, else the rebuilt one */
static bool tiny_tokenizer(const char *const *names, int32_t n_normal, uint64_t n_merges, synth *out,
                           const char **source) {
    char path[1024];
    memset(out, 0, sizeof *out);
    if (find_model(names, path, sizeof path)) {
        out->l = load_path(path);
        CHECK(out->l.t != NULL);
        *source = names[0];
        return out->l.t != NULL;
    }
    *source = "vocabulary rebuilt from ggml-vocab-qwen2.gguf";
    return synth_tiny(n_normal, n_merges, out);
}

static void test_tiny_models(void) {
    static const char *const q3[] = {"qwen3moe-tiny-F32.gguf", "qwen3moe-tiny-Q8_0.gguf",
                                     "qwen3moe-tiny-Q4_K_M.gguf", NULL};
    static const char *const q35[] = {"qwen35moe-tiny-F32.gguf", "qwen35moe-tiny-Q8_0.gguf", NULL};
    static const char *const q4[] = {"qwen4exp-tiny-F32.gguf", NULL};
    synth s;
    const char *src;
    if (tiny_tokenizer(q3, 2045, 1789, &s, &src)) {
        printf("qwen3moe-tiny tokenizer: %s\n", src);
        CHECK(tokenizer_kind(s.l.t) == TOK_BPE && tokenizer_n_vocab(s.l.t) == 2048);
        CHECK(!tokenizer_add_bos(s.l.t) && tokenizer_eos(s.l.t) == 2045);
        golden_prompt(s.l.t, "prompt.txt", "qwen3moe-tiny-F32.prompt.ids", false);
        test_special_tiny(s.l.t, 2046, 2047, 2045);
    }
    synth_free(&s);
    if (tiny_tokenizer(q35, 2045, 1789, &s, &src)) {
        printf("qwen35moe-tiny tokenizer: %s\n", src);
        golden_prompt(s.l.t, "prompt.txt", "qwen35moe-tiny-F32.prompt.ids", false);
    }
    synth_free(&s);
    if (tiny_tokenizer(q4, 1021, 765, &s, &src)) {
        /* this prompt has "<|endoftext|>" in the middle, parsed as the control token */
        printf("qwen4exp-tiny tokenizer: %s\n", src);
        char pp[1024], ip[1024];
        if (fixture_path("golden", "qwen4exp-tiny-F32-eos.prompt.txt", pp, sizeof pp) &&
            fixture_path("golden", "qwen4exp-tiny-F32-eos.prompt.ids", ip, sizeof ip)) {
            size_t pl, il, en;
            char *p = read_all(pp, &pl), *is = read_all(ip, &il);
            int32_t *expect = parse_ids(is, il, &en);
            ids_t r = enc(s.l.t, p, pl, true, false);
            CHECKF(ids_eq(&r, expect, en), "qwen4exp eos prompt: %zu ids, expected %zu", r.n, en);
            printf("golden qwen4exp-tiny-F32-eos.prompt.ids (parse_special): %zu/%zu ids %s\n", r.n,
                   en, ids_eq(&r, expect, en) ? "match" : "DIFFER");
            free(r.v);
            free(expect);
            free(p);
            free(is);
        } else {
            printf("SKIP golden qwen4exp-tiny-F32-eos: fixture not found\n");
        }
    }
    synth_free(&s);
    /* the rebuilt vocabulary must be the model's: checked whenever both are at hand */
    char path[1024];
    if (find_model(q3, path, sizeof path) && synth_tiny(2045, 1789, &s)) {
        loaded l = load_path(path);
        char pp[1024];
        size_t pl = 0;
        char *p = fixture_path("golden", "prompt.txt", pp, sizeof pp) ? read_all(pp, &pl) : NULL;
        if (l.t && p) {
            ids_t a = enc(l.t, p, pl, false, false), b = enc(s.l.t, p, pl, false, false);
            CHECK(a.n == b.n && memcmp(a.v, b.v, a.n * sizeof(int32_t)) == 0);
            for (int32_t i = 0; i < 2048; i++)
                CHECK(strcmp(tokenizer_token_text(l.t, i), tokenizer_token_text(s.l.t, i)) == 0);
            free(a.v);
            free(b.v);
        }
        free(p);
        unload(&l);
        synth_free(&s);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* SentencePiece: stories260K */

static void test_spm(void) {
    static const char *const names[] = {"stories260K.gguf", NULL};
    char path[1024];
    if (!find_model(names, path, sizeof path)) {
        printf("SKIP stories260K: model not found\n");
        return;
    }
    loaded l = load_path(path);
    CHECK(l.t != NULL);
    if (!l.t) {
        unload(&l);
        return;
    }
    const tokenizer *t = l.t;
    CHECK(tokenizer_kind(t) == TOK_SPM && tokenizer_n_vocab(t) == 512);
    CHECK(tokenizer_add_bos(t) && tokenizer_bos(t) == 1 && tokenizer_eos(t) == 2);
    CHECK(tokenizer_is_eog(t, 2) && !tokenizer_is_eog(t, 1));
    golden_prompt(t, "stories260K.prompt.txt", "stories260K.prompt.ids", tokenizer_add_bos(t));

    /* pieces: '▁' is a space, <0xNN> a byte, control tokens nothing unless asked */
    char buf[16];
    int32_t nl = tokenizer_find(t, "<0x0A>", 6);
    CHECK(nl >= 0 && tokenizer_piece(t, nl, false, buf, sizeof buf) == 1 && buf[0] == '\n');
    CHECK(tokenizer_piece(t, 1, false, buf, sizeof buf) == 0);
    CHECK(tokenizer_piece(t, 1, true, buf, sizeof buf) == 3 && memcmp(buf, "<s>", 3) == 0);
    int32_t sp_the = tokenizer_find(t, "\xE2\x96\x81the", 6);
    if (sp_the >= 0) CHECK(tokenizer_piece(t, sp_the, false, buf, sizeof buf) == 4 && memcmp(buf, " the", 4) == 0);

    /* (3) round trips as llama.cpp detokenizes: without BOS the prefixed space is stripped;
     * after a BOS it stays (llama_detokenize keeps it, with or without remove_special) */
    static const char *const strs[] = {"Once upon a time", " leading", "two  spaces", "\n", "",
                                       "tab\tand\nnewline", "caf\xC3\xA9 \xE2\x9C\x85 \xF0\x9F\xA6\x99",
                                       "bad \x80 utf8 x\xC3(y", "trailing ", NULL};
    for (const char *const *s = strs; *s; s++) {
        size_t sl = strlen(*s), dl;
        ids_t r = enc(t, *s, sl, false, false);
        char *d = dec(t, r.v, r.n, false, false, &dl);
        CHECKF(dl == sl && memcmp(d, *s, sl) == 0, "spm round trip '%s' -> '%s'", *s, d);
        free(d);
        free(r.v);
        r = enc(t, *s, sl, false, true);
        CHECK(r.n >= 1 && r.v[0] == 1);
        d = dec(t, r.v, r.n, true, false, &dl);
        if (sl == 0) CHECK(dl == 0); /* nothing but the BOS */
        else CHECKF(dl == sl + 1 && d[0] == ' ' && memcmp(d + 1, *s, sl) == 0, "spm BOS round trip '%s' -> '%s'", *s, d);
        free(d);
        free(r.v);
    }
    /* invalid UTF-8 falls back to byte tokens, never rejected */
    ids_t r = encs(t, "\xFF", false);
    int32_t ff = tokenizer_find(t, "<0xFF>", 6);
    CHECK(ff >= 0 && r.n >= 1 && r.v[r.n - 1] == ff);
    free(r.v);
    /* as in llama.cpp, symbols are cut by the lead byte's announced length: 0xFF announces four
     * bytes and swallows the first byte of the following U+2581, whose three bytes then come
     * back as raw byte tokens; the text does not round-trip (it does not in llama.cpp either) */
    r = encs(t, "\xFF\xC3( b", false);
    size_t dl;
    char *d = dec(t, r.v, r.n, false, false, &dl);
    CHECK(dl == 7 && memcmp(d, "\xFF\xC3(\xE2\x96\x81" "b", 7) == 0);
    free(d);
    free(r.v);
    /* parse_special: "<s>" becomes BOS and the text after it gets its space prefix again */
    r = encs(t, "a<s>b", true);
    ids_t a = encs(t, "a", false), b = encs(t, "b", false);
    CHECK(r.n == a.n + 1 + b.n && r.v[a.n] == 1 && memcmp(r.v + a.n + 1, b.v, b.n * sizeof(int32_t)) == 0);
    free(r.v);
    free(a.v);
    free(b.v);
    unload(&l);
}

/* ------------------------------------------------------------------------------------------ */
/* invalid UTF-8, pieces and speed with the full Qwen2 vocabulary */

static void same_as(const tokenizer *t, const char *a, size_t al, const char *b, size_t bl) {
    ids_t x = enc(t, a, al, false, false), y = enc(t, b, bl, false, false);
    CHECKF(x.n == y.n && (x.n == 0 || memcmp(x.v, y.v, x.n * sizeof(int32_t)) == 0),
           "'%.*s' and '%.*s' should tokenize alike", (int)al, a, (int)bl, b);
    free(x.v);
    free(y.v);
}

typedef struct thread_job {
    const tokenizer *t;
    const char *text;
    size_t len;
    ids_t out;
} thread_job;

static void *encode_job(void *arg) {
    thread_job *j = arg;
    j->out = enc(j->t, j->text, j->len, false, false);
    return NULL;
}

static void test_qwen2_extra(void) {
    char path[1024];
    if (!fixture_path("tokenizer", "ggml-vocab-qwen2.gguf", path, sizeof path)) return;
    loaded l = load_path(path);
    if (!l.t) {
        unload(&l);
        return;
    }
    const tokenizer *t = l.t;
    /* llama.cpp decodes invalid bytes one by one to U+FFFD, overlong forms to their value */
    same_as(t, "\xFF", 1, "\xEF\xBF\xBD", 3);
    same_as(t, "a\x80" "b", 3, "a\xEF\xBF\xBD" "b", 5);
    same_as(t, "\xE4\xBD", 2, "\xEF\xBF\xBD\xEF\xBF\xBD", 6);
    same_as(t, "x\xC0\x80y", 4, "x\0y", 3);
    same_as(t, "\xF4\x90\x80\x80", 4, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 12);
    ids_t r = enc(t, "\xED\xA0\x80 surrogate", 13, false, false); /* kept as its 3 bytes */
    CHECK(r.n >= 3);
    free(r.v);

    /* qwen2 facts from the spec */
    r = encs(t, "user", false);
    CHECK(r.n == 1 && r.v[0] == 872);
    free(r.v);
    r = encs(t, "<|im_start|>user\nhi<|im_end|>", true);
    CHECK(r.n >= 2 && r.v[0] == 151644 && r.v[r.n - 1] == 151645);
    free(r.v);
    r = encs(t, "<|im_start|>user\nhi<|im_end|>", false);
    CHECK(r.n > 2 && r.v[0] != 151644);
    free(r.v);
    CHECK(tokenizer_is_eog(t, 151643) && tokenizer_is_eog(t, 151645) && !tokenizer_is_eog(t, 151644));
    /* user-defined tokens split the text even without parse_special (as in llama.cpp) */
    r = encs(t, "a[PAD151650]b", false);
    CHECK(r.n == 3 && r.v[1] == 151650);
    free(r.v);
    /* special tokens are searched only where their bytes and byte pairs all occur in the text
     * (tokenizer.c, text_pairs): at the text's two ends, side by side, and near misses whose
     * pairs all occur but which do not */
    r = encs(t, "[PAD151650]", false);
    CHECK(r.n == 1 && r.v[0] == 151650);
    free(r.v);
    r = encs(t, "[PAD151650][PAD151651]x[PAD151650]", false);
    CHECK(r.n == 4 && r.v[0] == 151650 && r.v[1] == 151651 && r.v[3] == 151650);
    free(r.v);
    r = encs(t, "[PAD15165 PAD151650 D151650] [PAD1516500]", false);
    for (size_t i = 0; i < r.n; i++) CHECK(r.v[i] < 151643);
    free(r.v);
    r = encs(t, "x<|im_end|><|im_start|>", true);
    CHECK(r.n == 3 && r.v[1] == 151645 && r.v[2] == 151644);
    free(r.v);
    char buf[8];
    CHECK(tokenizer_piece(t, 220, false, buf, sizeof buf) == 1 && buf[0] == ' ');
    CHECK(tokenizer_piece(t, 198, false, buf, sizeof buf) == 1 && buf[0] == '\n');
    CHECK(tokenizer_piece(t, 151643, false, buf, sizeof buf) == 0);
    CHECK(tokenizer_piece(t, -5, true, buf, sizeof buf) == 0);
    CHECK(tokenizer_token_text(t, 151644) && strcmp(tokenizer_token_text(t, 151644), "<|im_start|>") == 0);

    /* 100 KB of mixed text well under a second (sanitizers: a few) */
    size_t pl;
    char pp[1024];
    char *p = fixture_path("golden", "prompt.txt", pp, sizeof pp) ? read_all(pp, &pl) : NULL;
    static const char extra[] = " \xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C 12345 "
                                "\xD0\xBD\xD0\xB5\xD1\x89\xD0\xBE  \t\n\n  x = f(y) + 3.14; // \xF0\x9F\x9A\x80\n";
    size_t cap = 100 * 1024 + 4096, n = 0;
    char *big = malloc(cap);
    while (n < 100 * 1024) {
        if (p) {
            memcpy(big + n, p, pl < cap - n ? pl : cap - n);
            n += pl < cap - n ? pl : cap - n;
        }
        size_t el = sizeof extra - 1;
        if (el > cap - n) el = cap - n;
        memcpy(big + n, extra, el);
        n += el;
    }
    double t0 = now_s();
    r = enc(t, big, n, false, false);
    double t1 = now_s();
    printf("qwen2: %zu bytes -> %zu tokens in %.3f s\n", n, r.n, t1 - t0);
    CHECK(t1 - t0 < 3.0);
    size_t dl;
    char *d = dec(t, r.v, r.n, false, false, &dl);
    CHECK(dl == n && memcmp(d, big, n) == 0);
    free(d);
    /* a loaded tokenizer is shared by threads: same ids from four at once */
    thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].t = t;
        jobs[i].text = big;
        jobs[i].len = n;
        jobs[i].out.v = NULL;
        CHECK(pthread_create(&th[i], NULL, encode_job, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(ids_eq(&jobs[i].out, r.v, r.n));
        free(jobs[i].out.v);
    }
    free(r.v);
    /* a long run of one character (a single pre-token) and of spaces */
    memset(big, 'a', 50000);
    memset(big + 50000, ' ', 50000);
    t0 = now_s();
    r = enc(t, big, 100000, false, false);
    t1 = now_s();
    printf("qwen2: 50000 'a' + 50000 ' ' -> %zu tokens in %.3f s\n", r.n, t1 - t0);
    CHECK(t1 - t0 < 3.0);
    d = dec(t, r.v, r.n, false, false, &dl);
    CHECK(dl == 100000 && memcmp(d, big, dl) == 0);
    free(d);
    free(r.v);
    free(big);
    free(p);
    unload(&l);
}

/* ------------------------------------------------------------------------------------------ */
/* (5) malformed metadata: built in memory with the GGUF writer */

enum {
    M_NO_TOKENS = 1 << 0,
    M_BAD_MERGE = 1 << 1,
    M_TYPE_LEN = 1 << 2,
    M_BOS_RANGE = 1 << 3,
    M_TOKENS_INT = 1 << 4,
    M_NO_MERGES = 1 << 5,
    M_MODEL_BERT = 1 << 6,
    M_PRE_UNKNOWN = 1 << 7,
    M_DUP_TOKEN = 1 << 8,
    M_SCORES_LEN = 1 << 9,
    M_ADD_BOS_NONE = 1 << 10,
    M_MERGES_INT = 1 << 11,
    M_MERGE_NOSPACE = 1 << 12,
    M_BOS_STRING = 1 << 13,
    M_NO_MODEL = 1 << 14,
    M_EOS_SENTINEL = 1 << 15,
    M_EMPTY_TOKEN = 1 << 16,
};

static tokenizer *build(unsigned m, char *err, size_t err_len, uint8_t **mem, gguf_file **fout) {
    gguf_writer *w = gguf_writer_new();
    const char *toks[] = {"a", "b", "ab", "<|im_end|>", m & M_DUP_TOKEN ? "a" : "c",
                          m & M_EMPTY_TOKEN ? "" : "d"};
    int32_t types[] = {1, 1, 1, 3, 1, 1};
    float scores[7] = {0}; /* 7: room for the wrong-length case */
    const char *merges[] = {m & M_BAD_MERGE ? "a x" : m & M_MERGE_NOSPACE ? "ab" : "a b"};
    if (!(m & M_NO_MODEL)) gguf_w_str(w, "tokenizer.ggml.model", m & M_MODEL_BERT ? "bert" : "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", m & M_PRE_UNKNOWN ? "no-such-pre" : "qwen2");
    if (m & M_TOKENS_INT) gguf_w_arr(w, "tokenizer.ggml.tokens", GGUF_VT_I32, types, 6);
    else if (!(m & M_NO_TOKENS)) gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 6);
    gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, types, m & M_TYPE_LEN ? 5 : 6);
    gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_VT_F32, scores, m & M_SCORES_LEN ? 7 : 6);
    if (m & M_MERGES_INT) gguf_w_arr(w, "tokenizer.ggml.merges", GGUF_VT_I32, types, 1);
    else if (!(m & M_NO_MERGES)) gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    if (m & M_BOS_STRING) gguf_w_str(w, "tokenizer.ggml.bos_token_id", "3");
    else if (!(m & M_ADD_BOS_NONE)) gguf_w_u32(w, "tokenizer.ggml.bos_token_id", m & M_BOS_RANGE ? 6 : 3);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", m & M_EOS_SENTINEL ? 0xFFFFFFFFu : 3);
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", (m & M_ADD_BOS_NONE) != 0);
    size_t len = 0;
    *mem = NULL;
    int rc = gguf_writer_to_memory(w, mem, &len);
    gguf_writer_free(w);
    CHECK(rc == 0);
    *fout = gguf_open_memory(*mem, len, err, err_len);
    CHECKF(*fout != NULL, "gguf_open_memory: %s", err);
    if (!*fout) return NULL;
    return tokenizer_load(*fout, err, err_len);
}

static void expect_fail(unsigned m, const char *what) {
    char err[256] = "";
    uint8_t *mem;
    gguf_file *f;
    tokenizer *t = build(m, err, sizeof err, &mem, &f);
    CHECKF(t == NULL && err[0], "%s: should fail cleanly", what);
    printf("malformed %-28s -> %s\n", what, err);
    tokenizer_free(t);
    gguf_close(f);
    free(mem);
}

static void test_malformed(void) {
    char err[256] = "";
    uint8_t *mem;
    gguf_file *f;
    tokenizer *t = build(0, err, sizeof err, &mem, &f);
    CHECKF(t != NULL, "minimal vocabulary: %s", err);
    if (t) {
        ids_t r = encs(t, "abab", false);
        CHECK(r.n == 2 && r.v[0] == 2 && r.v[1] == 2);
        free(r.v);
        r = encs(t, "ba", false);
        CHECK(r.n == 2 && r.v[0] == 1 && r.v[1] == 0);
        free(r.v);
        /* bytes whose symbol the vocabulary lacks are dropped, never a crash */
        r = encs(t, "a z\xFF<|im_end|>", true);
        CHECK(r.n == 2 && r.v[0] == 0 && r.v[1] == 3);
        free(r.v);
        CHECK(tokenizer_is_eog(t, 3) && tokenizer_eos(t) == 3 && tokenizer_bos(t) == 3);
    }
    tokenizer_free(t);
    gguf_close(f);
    free(mem);

    t = build(M_EOS_SENTINEL | M_EMPTY_TOKEN, err, sizeof err, &mem, &f);
    CHECKF(t != NULL, "sentinel eos: %s", err);
    if (t) {
        CHECK(tokenizer_eos(t) == -1); /* BPE default 11 does not fit 6 tokens */
        CHECK(strcmp(tokenizer_token_text(t, 5), "[EMPTY_5]") == 0);
    }
    tokenizer_free(t);
    gguf_close(f);
    free(mem);

    expect_fail(M_NO_TOKENS, "missing tokens");
    expect_fail(M_TOKENS_INT, "tokens not strings");
    expect_fail(M_BAD_MERGE, "merge of unknown token");
    expect_fail(M_MERGE_NOSPACE, "merge without space");
    expect_fail(M_MERGES_INT, "merges not strings");
    expect_fail(M_NO_MERGES, "missing merges");
    expect_fail(M_TYPE_LEN, "token_type wrong length");
    expect_fail(M_SCORES_LEN, "scores wrong length");
    expect_fail(M_BOS_RANGE, "bos id out of range");
    expect_fail(M_BOS_STRING, "bos id a string");
    expect_fail(M_ADD_BOS_NONE, "add_bos without bos");
    expect_fail(M_MODEL_BERT, "unsupported model");
    expect_fail(M_NO_MODEL, "missing model");
    expect_fail(M_PRE_UNKNOWN, "unknown pre-tokenizer");
    expect_fail(M_DUP_TOKEN, "duplicate token");
    CHECK(tokenizer_load(NULL, err, sizeof err) == NULL);
}

/* ------------------------------------------------------------------------------------------ */

int main(void) {
    test_malformed();
    test_vectors("ggml-vocab-qwen2.gguf");
    test_vectors("ggml-vocab-qwen35.gguf");
    test_qwen2_extra();
    test_tiny_models();
    test_spm();
    CHECK_DONE();
}
