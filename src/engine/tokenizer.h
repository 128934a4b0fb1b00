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


#endif /* SLUICE_TOKENIZER_H */
