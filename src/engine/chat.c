/* Chat-template discovery: the stored Jinja source and the family it belongs to. Rendering lives
 * in the front ends (the server); the engine only says which framing the model was trained on. */
#include <string.h>

#include "models/model.h"

int sluice_model_chat_template(const sluice_model *m, char *buf, int cap) {
    gguf_str s;
    if (!gguf_get_str(m->gguf, "tokenizer.chat_template", &s)) return -1;
    /* a template beyond 2 GiB is not a template; report it as absent rather than truncate the
     * returned length */
    if (s.len > (uint64_t)INT32_MAX) return -1;
    if (buf && cap > 0) {
        size_t n = s.len < (uint64_t)cap - 1 ? (size_t)s.len : (size_t)cap - 1;
        memcpy(buf, s.ptr, n);
        buf[n] = 0;
    }
    return (int)s.len;
}

static bool contains(gguf_str s, const char *needle) {
    size_t n = strlen(needle);
    if (s.len < n) return false;
    for (uint64_t i = 0; i + n <= s.len; i++)
        if (memcmp(s.ptr + i, needle, n) == 0) return true;
    return false;
}

sluice_chat_format sluice_model_chat_format(const sluice_model *m) {
    gguf_str s;
    if (gguf_get_str(m->gguf, "tokenizer.chat_template", &s))
        return contains(s, "<|im_start|>") ? SLUICE_CHAT_CHATML : SLUICE_CHAT_NONE;
    /* No template: trust the vocabulary. Both markers must be single tokens, otherwise the
     * model has never seen the framing and plain text is the better prompt. */
    static const char start[] = "<|im_start|>", end[] = "<|im_end|>";
    if (tokenizer_find(m->tok, start, sizeof start - 1) >= 0 &&
        tokenizer_find(m->tok, end, sizeof end - 1) >= 0)
        return SLUICE_CHAT_CHATML;
    return SLUICE_CHAT_NONE;
}
