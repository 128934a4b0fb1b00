/* Byte buffers and UTF-8 helpers for the server. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/internal.h"

static bool sb_reserve(strbuf *b, size_t extra) {
    if (b->oom) return false;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->oom = true;
        return false;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

bool sb_append(strbuf *b, const void *p, size_t n) {
    if (!sb_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = 0;
    return true;
}

bool sb_puts(strbuf *b, const char *s) { return sb_append(b, s, strlen(s)); }

bool sb_printf(strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !sb_reserve(b, (size_t)n)) return false;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

void sb_free(strbuf *b) {
    free(b->p);
    *b = (strbuf){0};
}

char *sb_take(strbuf *b) {
    if (b->oom) {
        sb_free(b);
        return NULL;
    }
    char *p = b->p ? b->p : calloc(1, 1);
    *b = (strbuf){0};
    return p;
}

/* Validity of a (possibly truncated) sequence starting at p[0], following RFC 3629: returns the
 * full length of the character when p[0..avail) is a valid prefix of one, or 0 when it can never
 * become valid (bad lead, bad continuation, overlong, surrogate, beyond U+10FFFF). */
static size_t utf8_seq(const unsigned char *p, size_t avail) {
    unsigned c = p[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;      /* overlong */
        else if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;      /* overlong */
        else if (c == 0xF4) hi = 0x8F; /* beyond U+10FFFF */
    } else {
        return 0;
    }
    for (size_t i = 1; i < len && i < avail; i++) {
        unsigned b = p[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return len;
}

size_t text_utf8_complete_prefix(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    /* only the last three bytes can belong to an unfinished character */
    size_t start = n > 3 ? n - 3 : 0;
    for (size_t i = start; i < n; i++) {
        if ((p[i] & 0xC0) == 0x80) continue; /* continuation: not a start */
        size_t len = utf8_seq(p + i, n - i);
        if (len > n - i) return i; /* valid so far, and more bytes are needed */
    }
    return n;
}

bool text_utf8_sanitize(const char *s, size_t n, strbuf *out) {
    static const char repl[] = "\xEF\xBF\xBD";
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of the pending valid stretch */
    while (i < n) {
        size_t len = utf8_seq(p + i, n - i);
        if (len && len <= n - i) {
            i += len;
            continue;
        }
        if (!sb_append(out, s + run, i - run) || !sb_append(out, repl, 3)) return false;
        /* skip the maximal invalid prefix as one replacement: the lead and any continuation
         * bytes that were acceptable to it (Unicode's "maximal subpart" practice) */
        size_t skip = 1;
        if (len) {
            /* truncated at the end of the input */
            skip = n - i;
        } else {
            unsigned c = p[i];
            if (c >= 0xC2 && c <= 0xF4) {
                size_t want = c <= 0xDF ? 2 : c <= 0xEF ? 3 : 4;
                while (skip < want && i + skip < n && utf8_seq(p + i, skip + 1) != 0) skip++;
            }
        }
        i += skip;
        run = i;
    }
    return sb_append(out, s + run, n - run);
}

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
