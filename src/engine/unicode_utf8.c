/* UTF-8 helpers: llama.cpp-compatible lenient decoding (see unicode_utf8.h). */
#include "engine/unicode_utf8.h"

#include <stdlib.h>
#include <string.h>

size_t utf8_seq_len(unsigned char lead) {
    static const unsigned char by_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return by_nibble[lead >> 4];
}

static bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

uint32_t utf8_decode_lenient(const char *s, size_t len, size_t *off) {
    const unsigned char *p = (const unsigned char *)s + *off;
    size_t left = len - *off;
    unsigned char c = p[0];
    uint32_t cp;
    size_t n;
    if (c < 0x80) {
        cp = c;
        n = 1;
    } else if ((c & 0xE0) == 0xC0) { /* llama.cpp tests the bits one by one: 110xxxxx */
        if (left < 2 || !is_cont(p[1])) goto invalid;
        cp = ((uint32_t)(c & 0x1F) << 6) | (p[1] & 0x3Fu);
        n = 2;
    } else if ((c & 0xF0) == 0xE0) {
        if (left < 3 || !is_cont(p[1]) || !is_cont(p[2])) goto invalid;
        cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3Fu);
        n = 3;
    } else if ((c & 0xF8) == 0xF0) {
        if (left < 4 || !is_cont(p[1]) || !is_cont(p[2]) || !is_cont(p[3])) goto invalid;
        cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) |
             ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3Fu);
        /* llama.cpp decodes F4 90.. to F7 .. but then throws when re-encoding them; treating
         * the lead byte as invalid keeps the behaviour defined. */
        if (cp > 0x10FFFF) goto invalid;
        n = 4;
    } else {
        goto invalid; /* a stray continuation byte or 0xF8..0xFF */
    }
    *off += n;
    return cp;
invalid:
    *off += 1;
    return UTF8_INVALID;
}

size_t utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp <= 0x10FFFF) {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

bool utf8_is_valid(const char *s, size_t len) {
    size_t off = 0;
    while (off < len) {
        unsigned char c = (unsigned char)s[off];
        if (c < 0x80) { /* fast path for ASCII */
            off++;
            continue;
        }
        size_t start = off;
        uint32_t cp = utf8_decode_lenient(s, len, &off);
        if (cp == UTF8_INVALID || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        char tmp[4];
        if (utf8_encode(cp, tmp) != off - start) return false; /* overlong */
    }
    return true;
}

int utf8_sanitize(const char *s, size_t len, char **norm, char **shadow, size_t *out_len) {
    /* an invalid byte (1 byte in) becomes U+FFFD (3 bytes out): at most 3x growth */
    size_t cap = len * 3 + 1;
    char *a = malloc(cap), *b = malloc(cap);
    if (!a || !b) {
        free(a);
        free(b);
        return -1;
    }
    size_t off = 0, o = 0;
    while (off < len) {
        uint32_t cp = utf8_decode_lenient(s, len, &off);
        if (cp == UTF8_INVALID) cp = UTF8_REPLACEMENT;
        size_t n = utf8_encode(cp, a + o);
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            /* U+FFFD has the same regex classes as a surrogate (neither letter, digit, mark
             * nor space) and the same 3-byte length */
            utf8_encode(UTF8_REPLACEMENT, b + o);
        } else {
            memcpy(b + o, a + o, n);
        }
        o += n;
    }
    a[o] = b[o] = 0;
    *norm = a;
    *shadow = b;
    *out_len = o;
    return 0;
}
