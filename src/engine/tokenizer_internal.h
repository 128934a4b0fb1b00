/* Internals shared by tokenizer.c, tokenizer_bpe.c and tokenizer_spm.c (not for other code). */
#ifndef SLUICE_TOKENIZER_INTERNAL_H
#define SLUICE_TOKENIZER_INTERNAL_H

#include "engine/tokenizer.h"


/* The vocabulary: token texts in one arena, and an open-addressing hash text -> id. */
typedef struct tok_vocab {
    int32_t n;
    char *arena;        /* all texts, each NUL-terminated */
    uint64_t *off;      /* text of token i: arena + off[i], len[i] bytes */
    uint32_t *len;
    float *score;
    uint8_t *type;      /* enum tok_type, after llama.cpp's overrides (EOG texts -> control) */
    int32_t *slot;      /* hash slots: token id or -1 */
    uint64_t slot_mask; /* capacity - 1 (a power of two) */
} tok_vocab;

uint64_t tok_hash_bytes(const char *s, size_t len);
int32_t tok_vocab_find(const tok_vocab *v, const char *s, size_t len);
static inline const char *tok_vocab_text(const tok_vocab *v, int32_t id) { return v->arena + v->off[id]; }

/* A binary heap of fixed-size elements (at most 64 bytes) ordered by `before`: the merge
 * queues of both BPE (lowest rank first) and SentencePiece (highest score first). */
typedef struct tok_heap {
    unsigned char *data;
    size_t n, cap, elem;
    bool (*before)(const void *a, const void *b);
} tok_heap;
int tok_heap_push(tok_heap *h, const void *e); /* 0, or -1 on allocation failure */
void tok_heap_pop(tok_heap *h, void *out);     /* h->n > 0 */

/* Append one id to a caller's growing array. 0, or -1 on allocation failure. */
int tok_push(int32_t **ids, size_t *n, size_t *cap, int32_t id);

/* Byte-level BPE ("gpt2"): pre-tokenizer regexes, merges, byte <-> symbol maps. */
typedef struct tok_bpe tok_bpe;
typedef struct tok_bpe_pre_info {
    bool known;         /* the pre name is one this file implements */
    bool clean_spaces;  /* llama.cpp's clean_up_tokenization_spaces default for it */
    bool add_bos;       /* llama.cpp's add_bos default for it */
    bool no_bos;        /* bos id defaults to none (chatglm) */
} tok_bpe_pre_info;
/* pre may be NULL (missing key: llama.cpp's "default"). */
tok_bpe_pre_info tok_bpe_pre_lookup(const char *pre, size_t pre_len);
/* merges: the tokenizer.ggml.merges key (an array of strings "left right"). */
tok_bpe *tok_bpe_new(const tok_vocab *v, const char *pre, size_t pre_len, const gguf_kv *merges,
                     char *err, size_t err_len);
void tok_bpe_free(tok_bpe *b);
/* Encode one raw-text fragment (no special tokens in it). 0, or -1 on allocation failure. */
int tok_bpe_encode(const tok_bpe *b, const tok_vocab *v, const char *text, size_t len,
                   int32_t **ids, size_t *n, size_t *cap);
/* Bytes of a normal BPE token: its symbols mapped back to bytes (llama.cpp's llama_decode_text). */
size_t tok_bpe_decode_text(const char *text, size_t len, char *buf, size_t cap);

/* SentencePiece ("llama"): text is a raw fragment, already space-prefixed as llama.cpp does. */
int tok_spm_encode(const tok_vocab *v, int32_t unk_id, const char *text, size_t len,
                   int32_t **ids, size_t *n, size_t *cap);

#endif /* SLUICE_TOKENIZER_INTERNAL_H */
