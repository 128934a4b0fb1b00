/* libFuzzer target for the tokenizers on arbitrary text (src/engine/tokenizer*.c): the byte-level
 * BPE vocabulary of models/sluice-moe-tiny.gguf and the SentencePiece one of
 * models/stories260K.gguf, loaded once in LLVMFuzzerInitialize (SLUICE_SOURCE_DIR is baked in by
 * tests/fuzz/CMakeLists.txt).
 *
 * Input: byte 0 picks the tokenizer (bit 0: SentencePiece), parse_special (bit 1, as the server
 * tokenizes rendered chat prompts) and add_bos (bit 2); the rest is the text. Every input is
 * encoded, every id checked against the vocabulary, and decoded again (whole and into a short
 * buffer). BPE is lossless: for valid UTF-8 encoded without special tokens, decoding gives the
 * text back byte for byte. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "formats/gguf.h"

#ifndef SLUICE_SOURCE_DIR
#error "SLUICE_SOURCE_DIR must name the source tree"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static tokenizer *tok[2]; /* [0] BPE, [1] SentencePiece */

static tokenizer *load(const char *name) {
    char path[1024], err[512] = "";
    snprintf(path, sizeof path, "%s/models/%s", SLUICE_SOURCE_DIR, name);
    gguf_file *g = gguf_open(path, err, sizeof err);
    tokenizer *t = g ? tokenizer_load(g, err, sizeof err) : NULL;
    if (!t) {
        fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err);
        abort();
    }
    gguf_close(g); /* the tokenizer keeps no pointers into the file */
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    tok[0] = load("sluice-moe-tiny.gguf");
    tok[1] = load("stories260K.gguf");
    if (tokenizer_kind(tok[0]) != TOK_BPE || tokenizer_kind(tok[1]) != TOK_SPM) abort();
    return 0;
}

/* Strict UTF-8 (RFC 3629): no overlongs, surrogates or values past U+10FFFF. */
static bool valid_utf8(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i], len, lo = 0x80, hi = 0xBF;
        if (c < 0x80) len = 1;
        else if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else return false;
        if (n - i < len) return false;
        for (unsigned k = 1; k < len; k++) {
            unsigned b = p[i + k];
            if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return false;
        }
        i += len;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t mode = data[0];
    const tokenizer *t = tok[mode & 1];
    const bool parse_special = mode & 2, add_bos = mode & 4;
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;

    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    if (tokenizer_encode(t, text, len, parse_special, add_bos, &ids, &n, &cap) != 0) abort();
    const int32_t nv = tokenizer_n_vocab(t);
    bool special = false;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= nv) abort();
        const enum tok_type ty = tokenizer_token_type(t, ids[i]);
        special |= ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN || ty == TOK_TYPE_USER_DEFINED;
        char small[4];
        size_t pl = tokenizer_piece(t, ids[i], true, small, sizeof small);
        if (pl && !tokenizer_token_text(t, ids[i])) abort();
    }
    if (len && n == 0) abort(); /* text never vanishes */

    const size_t total = tokenizer_decode(t, ids, n, false, false, NULL, 0);
    if (total == SIZE_MAX) abort();
    char *out = malloc(total + 1);
    if (!out) abort();
    if (tokenizer_decode(t, ids, n, false, false, out, total + 1) != total) abort();
    /* a short buffer gets a prefix of the same text */
    char half[16];
    const size_t hl = tokenizer_decode(t, ids, n, false, false, half, sizeof half);
    if (hl != total || memcmp(half, out, total < sizeof half ? total : sizeof half) != 0) abort();
    (void)tokenizer_decode(t, ids, n, true, true, NULL, 0);

    if (tokenizer_kind(t) == TOK_BPE && !parse_special && !add_bos && !special &&
        valid_utf8(data + 1, len)) {
        if (total != len || memcmp(out, text, len) != 0) {
            fprintf(stderr, "BPE round trip: %zu bytes in, %zu out\n", len, total);
            abort();
        }
    }
    free(out);
    free(ids);
    return 0;
}
