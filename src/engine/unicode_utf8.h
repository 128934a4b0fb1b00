/* UTF-8 helpers for the tokenizers.
 *
 * Tokenizers must reproduce llama.cpp byte for byte, so decoding here follows llama.cpp's
 * lenient rules rather than strict UTF-8 (see docs/tokenizer.md):
 *   - the sequence length comes from the lead byte alone (high nibble: 0xC/0xD -> 2, 0xE -> 3,
 *     0xF -> 4, anything else 1), the continuation bytes must be 10xxxxxx;
 *   - overlong forms and surrogates are accepted and decoded to their value;
 *   - anything else is one invalid byte, which llama.cpp turns into U+FFFD.
 */
#ifndef SLUICE_UNICODE_UTF8_H
#define SLUICE_UNICODE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define UTF8_REPLACEMENT 0xFFFDu
#define UTF8_INVALID 0xFFFFFFFFu

/* Length of the sequence a lead byte announces (1..4), without validation: llama.cpp's
 * unicode_len_utf8, which the SentencePiece tokenizer uses to split text into symbols. */
size_t utf8_seq_len(unsigned char lead);

/* Decode the code point at s[*off] (len bytes in s, *off < len) with llama.cpp's rules.
 * Advances *off past it and returns it; on an invalid byte advances by one and returns
 * UTF8_INVALID. Values above U+10FFFF count as invalid (llama.cpp would throw later). */
uint32_t utf8_decode_lenient(const char *s, size_t len, size_t *off);

/* Shortest encoding of cp (<= 0x10FFFF; surrogates are encoded like any value). Returns the
 * number of bytes written to out (1..4), 0 for values above U+10FFFF. */
size_t utf8_encode(uint32_t cp, char out[4]);

/* True when s is well-formed UTF-8 (shortest forms, no surrogates, <= U+10FFFF). */
bool utf8_is_valid(const char *s, size_t len);

/* The text as llama.cpp's BPE path sees it: each code point decoded leniently and re-encoded
 * (invalid bytes become U+FFFD, overlong forms their shortest encoding). *norm receives those
 * bytes; *shadow the same bytes with surrogates replaced by U+FFFD (same length), so that a
 * regex engine that insists on valid UTF-8 can scan it and its offsets apply to *norm.
 * Both are malloc'd (free both); *out_len is their length. Returns 0, or -1 on allocation
 * failure. */
int utf8_sanitize(const char *s, size_t len, char **norm, char **shadow, size_t *out_len);

#endif /* SLUICE_UNICODE_UTF8_H */
