/* SentencePiece "llama" tokenizer, as llama.cpp implements it (llm_tokenizer_spm_session).
 *
 * The caller has already prefixed a space where llama.cpp does; here spaces become U+2581, the
 * text is split into UTF-8 characters (by lead byte, without validation, so any byte sequence
 * is accepted), and adjacent symbols are merged greedily: always the pair whose concatenation is
 * the vocabulary token with the highest score (ties: leftmost). Symbols that are not tokens at
 * the end fall back to byte tokens <0xNN>.
 */
#include "engine/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/unicode_utf8.h"

typedef struct spm_bigram {
    float score;
    int32_t left, right;
    uint32_t size; /* bytes of left+right when queued; a mismatch later means stale */
} spm_bigram;

typedef struct spm_state {
    const tok_vocab *v;
    const char *text;
    uint32_t *start, *len;
    int32_t *prev, *next;
    tok_heap heap; /* of spm_bigram */
} spm_state;

/* merge order: higher score first, then lower left index */
static bool spm_before(const void *a, const void *b) {
    const spm_bigram *x = a, *y = b;
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

static int try_add(spm_state *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    /* symbols stay contiguous in the text, so left+right is one slice */
    uint32_t size = s->len[l] + s->len[r];
    int32_t id = tok_vocab_find(s->v, s->text + s->start[l], size);
    if (id < 0) return 0;
    spm_bigram g = {s->v->score[id], l, r, size};
    return tok_heap_push(&s->heap, &g);
}

/* llama.cpp's byte_to_token for SPM: "<0xNN>", else the byte as a one-byte token. */
static int32_t byte_token(const tok_vocab *v, unsigned char c) {
    char b[7];
    snprintf(b, sizeof b, "<0x%02X>", c);
    int32_t id = tok_vocab_find(v, b, 6);
    if (id < 0) id = tok_vocab_find(v, (const char *)&c, 1);
    return id;
}

int tok_spm_encode(const tok_vocab *v, int32_t unk_id, const char *text, size_t len,
                   int32_t **ids, size_t *n, size_t *cap) {
    if (len == 0) return 0;
    size_t spaces = 0;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    size_t elen = len + spaces * 2;
    if (elen > UINT32_MAX / 2) return -1;
    spm_state s = {.v = v, .heap = {.elem = sizeof(spm_bigram), .before = spm_before}};
    char *esc = malloc(elen);
    s.start = malloc(elen * sizeof *s.start);
    s.len = malloc(elen * sizeof *s.len);
    s.prev = malloc(elen * sizeof *s.prev);
    s.next = malloc(elen * sizeof *s.next);
    int rc = -1;
    if (!esc || !s.start || !s.len || !s.prev || !s.next) goto done;

    /* llama_escape_whitespace: ' ' -> U+2581 */
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(esc + o, "\xE2\x96\x81", 3);
            o += 3;
        } else {
            esc[o++] = text[i];
        }
    }
    s.text = esc;

    int32_t ns = 0;
    for (size_t off = 0; off < elen;) {
        size_t cl = utf8_seq_len((unsigned char)esc[off]);
        if (cl > elen - off) cl = elen - off;
        s.start[ns] = (uint32_t)off;
        s.len[ns] = (uint32_t)cl;
        s.prev[ns] = ns - 1;
        off += cl;
        s.next[ns] = off == elen ? -1 : ns + 1;
        ns++;
    }
    for (int32_t i = 1; i < ns; i++)
        if (try_add(&s, i - 1, i)) goto done;
    while (s.heap.n) {
        spm_bigram g;
        tok_heap_pop(&s.heap, &g);
        if (s.len[g.left] == 0 || s.len[g.right] == 0 || s.len[g.left] + s.len[g.right] != g.size)
            continue;
        s.len[g.left] += s.len[g.right];
        s.len[g.right] = 0;
        s.next[g.left] = s.next[g.right];
        if (s.next[g.right] >= 0) s.prev[s.next[g.right]] = g.left;
        if (try_add(&s, s.prev[g.left], g.left) || try_add(&s, g.left, s.next[g.left])) goto done;
    }
    for (int32_t i = 0; i >= 0; i = s.next[i]) {
        int32_t id = tok_vocab_find(v, esc + s.start[i], s.len[i]);
        if (id >= 0) {
            if (tok_push(ids, n, cap, id)) goto done;
            continue;
        }
        /* Every merge produced a token, so only an unmerged character can get here; llama.cpp's
         * rev_merge lookup never finds one. Its bytes become byte tokens; where the vocabulary
         * has none llama.cpp throws, we emit <unk> (or nothing without one). */
        for (uint32_t k = 0; k < s.len[i]; k++) {
            int32_t bt = byte_token(v, (unsigned char)esc[s.start[i] + k]);
            if (bt < 0) bt = unk_id;
            if (bt >= 0 && tok_push(ids, n, cap, bt)) goto done;
        }
    }
    rc = 0;
done:
    free(esc);
    free(s.start);
    free(s.len);
    free(s.prev);
    free(s.next);
    free(s.heap.data);
    return rc;
}
