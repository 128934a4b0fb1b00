/* Tokenizers read from GGUF metadata (tokenizer.ggml.*).
 *
 *   "gpt2"  byte-level BPE (Qwen2/Qwen3/Qwen3.5 vocabularies); pre-tokenizer from
 *           tokenizer.ggml.pre: "qwen2" or "qwen35" (regex split via PCRE2 with Unicode
 *           properties), then rank-ordered merges. Also llama3/gpt2/default and the other
 *           pre values that share their patterns.
 *   "llama" SentencePiece (score-ordered bigram merges, byte fallback), as in stories260K.
 *
 * Results match llama.cpp's tokenizer (its test vectors are the tests). Thread safety: a loaded
 * tokenizer is immutable; any number of threads may encode and decode with it at once.
 * docs/tokenizer.md describes the llama.cpp behaviours reproduced.
 */
#ifndef SLUICE_TOKENIZER_H
#define SLUICE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/gguf.h"

typedef struct tokenizer tokenizer;

enum tok_kind { TOK_BPE, TOK_SPM };

/* token types as stored in tokenizer.ggml.token_type */
enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

/* Build from the file's metadata. NULL and one line in err on failure. The tokenizer copies
 * what it needs and does not keep pointers into f. */
tokenizer *tokenizer_load(const gguf_file *f, char *err, size_t err_len);
void tokenizer_free(tokenizer *t);

enum tok_kind tokenizer_kind(const tokenizer *t);
int32_t tokenizer_n_vocab(const tokenizer *t);
int32_t tokenizer_bos(const tokenizer *t);   /* -1 when none */
int32_t tokenizer_eos(const tokenizer *t);   /* -1 when none */
bool tokenizer_add_bos(const tokenizer *t);  /* metadata asks for BOS (tokenizer.ggml.add_bos_token) */
bool tokenizer_is_eog(const tokenizer *t, int32_t id);
enum tok_type tokenizer_token_type(const tokenizer *t, int32_t id);
/* The vocabulary string of a token as stored (e.g. "Ġthe", "▁the", "<0x0A>"). */
const char *tokenizer_token_text(const tokenizer *t, int32_t id);

/* Encode len bytes. Appends into *ids (realloc'd; *n and *cap track it). Returns 0, or -1 on
 * allocation failure. Invalid UTF-8 is tokenized byte-wise, never rejected. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool parse_special,
                     bool add_bos, int32_t **ids, size_t *n, size_t *cap);

/* The bytes a token stands for (BPE: byte-decoded; SPM: '▁' -> ' ', <0xNN> -> byte).
 * Control tokens give 0 bytes unless render_special. Returns the length, which may exceed cap. */
size_t tokenizer_piece(const tokenizer *t, int32_t id, bool render_special, char *buf, size_t cap);

/* --- additions ------------------------------------------------------------------------------ */

/* Metadata asks for EOS at the end of a prompt (tokenizer.ggml.add_eos_token); encode never adds
 * it by itself. */
bool tokenizer_add_eos(const tokenizer *t);
/* Id of the token whose text is exactly s (any type), -1 when none. */
int32_t tokenizer_find(const tokenizer *t, const char *s, size_t len);

/* Text of n tokens, as llama.cpp's llama_detokenize: pieces concatenated (control tokens only
 * when render_special); SPM strips the space it prefixed unless the text starts with BOS;
 * remove_special drops a leading BOS / trailing EOS where the metadata adds them; vocabularies
 * with clean_up_tokenization_spaces (BPE other than qwen2/qwen35/...) get llama.cpp's
 * " ," " ." " 's" clean-up. Writes min(length, cap) bytes to buf and returns the full length,
 * or SIZE_MAX on allocation failure. Ids out of range give nothing. */
size_t tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, bool remove_special,
                        bool render_special, char *buf, size_t cap);

/* --- internal: shared by tokenizer.c, tokenizer_bpe.c and tokenizer_spm.c --------------------- */
#ifdef SLUICE_TOKENIZER_INTERNAL

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

#endif /* SLUICE_TOKENIZER_INTERNAL */

#endif /* SLUICE_TOKENIZER_H */
