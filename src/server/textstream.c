/* Generated text with stop sequences, released as soon as it is certain.
 *
 * Tokens carry arbitrary byte strings: a stop sequence may span several tokens and a character
 * may be split between two. After each token the stream releases the text up to the earliest
 * point that could still be the start of a stop sequence or of an unfinished character. A stop
 * found anywhere ends the text right before it, so the stop text is never sent. */
#include <string.h>

#include "server/internal.h"

void ts_init(textstream *ts, const char *const *stop, const size_t *stop_len, int n_stop) {
    *ts = (textstream){.stop = stop, .stop_len = stop_len, .n_stop = n_stop};
}

void ts_free(textstream *ts) { sb_free(&ts->text); }

/* Earliest start of a complete stop sequence in text[from..len), or SIZE_MAX. */
static size_t find_stop(const textstream *ts, size_t from) {
    size_t best = SIZE_MAX;
    const char *t = ts->text.p;
    size_t len = ts->text.len;
    for (int k = 0; k < ts->n_stop; k++) {
        size_t sl = ts->stop_len[k];
        if (sl == 0 || sl > len) continue;
        for (size_t i = from; i + sl <= len && i < best; i++)
            if (t[i] == ts->stop[k][0] && memcmp(t + i, ts->stop[k], sl) == 0) {
                best = i;
                break;
            }
    }
    return best;
}

/* Bytes at the end of the text that are a proper prefix of some stop sequence. */
static size_t partial_stop(const textstream *ts) {
    size_t hold = 0, len = ts->text.len;
    for (int k = 0; k < ts->n_stop; k++) {
        size_t sl = ts->stop_len[k];
        if (sl == 0) continue;
        size_t m = sl - 1 < len ? sl - 1 : len;
        for (size_t j = m; j > hold; j--)
            if (memcmp(ts->text.p + len - j, ts->stop[k], j) == 0) {
                hold = j;
                break;
            }
    }
    return hold;
}

static bool release(textstream *ts, size_t upto, strbuf *out) {
    if (upto <= ts->sent) return true;
    bool ok = text_utf8_sanitize(ts->text.p + ts->sent, upto - ts->sent, out);
    ts->sent = upto;
    return ok;
}

bool ts_push(textstream *ts, const char *p, size_t n, strbuf *out) {
    if (ts->stopped) return true;
    size_t old = ts->text.len;
    if (!sb_append(&ts->text, p, n)) return false;
    size_t max_stop = 0;
    for (int k = 0; k < ts->n_stop; k++)
        if (ts->stop_len[k] > max_stop) max_stop = ts->stop_len[k];
    /* a new match must end inside the new bytes, so it starts at most max_stop - 1 before them;
     * it never starts before `sent`, because a possible start is always held back */
    size_t from = max_stop > 1 && old > max_stop - 1 ? old - (max_stop - 1) : 0;
    if (from < ts->sent) from = ts->sent;
    size_t at = find_stop(ts, from);
    if (at != SIZE_MAX) {
        ts->stopped = true;
        ts->text.len = at;
        ts->text.p[at] = 0;
        return release(ts, at, out);
    }
    size_t safe = ts->text.len - partial_stop(ts);
    size_t whole = text_utf8_complete_prefix(ts->text.p, safe);
    return release(ts, whole, out);
}

bool ts_finish(textstream *ts, strbuf *out) { return release(ts, ts->text.len, out); }
