/* libFuzzer target for the server's request handling (src/server/api.c, chat.c, textstream.c,
 * util.c): the JSON body of /v1/chat/completions or /v1/completions through api_parse_request,
 * then what the HTTP side does with an accepted request before tokenizing: the chat template
 * (ChatML with each thinking style, or plain), the stop-sequence text stream over that text, and
 * the response builders that quote bytes back as JSON.
 *
 * Input: byte 0 picks the endpoint and the template (bit 0: completion; bit 1: plain format;
 * bits 2-3: thinking style; bit 4: strip reasoning; bit 5: enable_thinking default); the rest is
 * the request body. Contract: any body is either accepted into a request whose fields satisfy
 * the documented ranges, or refused with status 400, a non-empty one-line message and a valid
 * JSON error document; never a crash, a leak or undefined behaviour. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_VOCAB 1000

/* Valid UTF-8 JSON text: jansson's encoder refuses anything else. */
static void check_json(char *s) {
    if (!s) abort();
    json_error_t je;
    json_t *v = json_loads(s, 0, &je);
    if (!v) abort();
    json_decref(v);
    free(s);
}

static void check_request(const gen_request *r, api_kind kind) {
    if (r->kind != kind || r->max_tokens < 0 || r->n_stop < 0 || r->n_stop > TS_MAX_STOP) abort();
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || r->stop_len[i] == 0 || r->stop_len[i] > TS_MAX_STOP_LEN ||
            r->stop[i][r->stop_len[i]] != 0)
            abort();
    const sluice_sampler_params *sp = &r->sp;
    if (!(sp->temperature >= 0 && sp->temperature <= 2) || !(sp->top_p >= 0 && sp->top_p <= 1) ||
        !(sp->min_p >= 0 && sp->min_p <= 1) || !(sp->repeat_penalty > 0) || sp->top_k < 0 ||
        sp->repeat_last_n < 0)
        abort();
    if (kind == API_CHAT) {
        if (r->n_msgs < 1 || !r->msgs || r->prompt || r->prompt_ids) abort();
        for (int i = 0; i < r->n_msgs; i++)
            if (!r->msgs[i].text || r->msgs[i].text[r->msgs[i].len] != 0 ||
                (unsigned)r->msgs[i].role > ROLE_TOOL)
                abort();
    } else {
        if (r->msgs || r->n_msgs) abort();
        if (!r->prompt == !r->prompt_ids) abort(); /* exactly one form */
        if (r->prompt && r->prompt[r->prompt_len] != 0) abort();
        for (int i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= N_VOCAB) abort();
    }
}

/* Stream text through the stop sequences in uneven pieces. The released bytes are always valid
 * UTF-8; for valid input they are exactly the text before the first stop sequence (all of it when
 * none occurs), and never contain a stop sequence. */
static void stream(const gen_request *r, const char *text, size_t len) {
    textstream ts;
    ts_init(&ts, (const char *const *)r->stop, r->stop_len, r->n_stop);
    strbuf out = {0};
    size_t off = 0, step = 1;
    while (off < len) {
        size_t n = step < len - off ? step : len - off;
        if (!ts_push(&ts, text + off, n, &out)) abort();
        off += n;
        step = step * 3 % 7 + 1; /* 1..7 bytes: splits characters and stop sequences */
    }
    if (!ts_finish(&ts, &out)) abort();
    json_t *s = json_stringn(out.p ? out.p : "", out.len);
    if (!s) abort();
    json_decref(s);
    strbuf clean = {0};
    if (!text_utf8_sanitize(text, len, &clean)) abort();
    if (out.len > clean.len) abort();
    if (clean.len == len && (len == 0 || memcmp(clean.p, text, len) == 0)) {
        if (out.len && memcmp(out.p, text, out.len) != 0) abort(); /* a prefix of the text */
        if (!ts.stopped && out.len != len) abort();
        bool at_stop = !ts.stopped;
        for (int k = 0; k < r->n_stop; k++) {
            if (out.len && memmem(out.p, out.len, r->stop[k], r->stop_len[k])) abort();
            if (len - out.len >= r->stop_len[k] &&
                memcmp(text + out.len, r->stop[k], r->stop_len[k]) == 0)
                at_stop = true;
        }
        if (!at_stop) abort(); /* it stopped right before a stop sequence */
    }
    sb_free(&clean);
    sb_free(&out);
    ts_free(&ts);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t mode = data[0];
    const char *body = (const char *)data + 1;
    const size_t len = size - 1;
    const api_kind kind = mode & 1 ? API_COMPLETION : API_CHAT;

    server_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.sampling = sluice_sampler_defaults();
    cfg.thinking = mode & 32;
    gen_request r;
    api_error e;
    memset(&e, 0, sizeof e);
    if (api_parse_request(kind, body, len, &cfg, N_VOCAB, 42, &r, &e) != 0) {
        if (e.status != 400 || !e.message[0] || strchr(e.message, '\n')) abort();
        if (r.msgs || r.prompt || r.prompt_ids || r.n_stop) abort(); /* freed on failure */
        check_json(api_error_json(&e));
        return 0;
    }
    check_request(&r, kind);

    chat_template t = {
        .format = mode & 2 ? SLUICE_CHAT_NONE : SLUICE_CHAT_CHATML,
        .think = (think_style)((mode >> 2) & 3),
        .strip_reasoning = mode & 16,
    };
    strbuf text = {0};
    if (kind == API_CHAT) {
        if (!chat_render(&t, r.msgs, r.n_msgs, r.thinking, &text) || !text.p) abort();
    } else if (r.prompt) {
        if (!sb_append(&text, r.prompt, r.prompt_len)) abort();
    }
    stream(&r, text.p ? text.p : "", text.len);

    /* the text as if generated: the response builders must quote any bytes as valid JSON */
    api_meta m = {.kind = kind, .id = "cmpl-fuzz", .created = 1, .model = "fuzz"};
    const char *tx = text.p ? text.p : "";
    check_json(api_response_json(&m, tx, text.len, "stop", 1, 2));
    check_json(api_chunk_json(&m, tx, text.len, true, NULL, r.include_usage));
    /* a chat template (from a model file) is classified from the same bytes */
    (void)chat_classify_thinking(tx);
    sb_free(&text);
    gen_request_free(&r);
    return 0;
}
