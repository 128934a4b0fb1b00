/* The OpenAI request and response shapes, parsed and built with jansson.
 *
 * Validation is strict about the fields sluice uses (type and range; a mistake gets a 400 that
 * names the field) and lenient about the rest of the OpenAI surface: fields that change nothing
 * here (user, presence_penalty, ...) are accepted and ignored, fields whose meaning sluice cannot
 * honour (tools, logprobs, n > 1, ...) are refused rather than silently dropped. */
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

#define MAX_MESSAGES 100000
#define BAD "invalid_request_error"

void api_set_error(api_error *e, int status, const char *type, const char *param,
                   const char *code, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

/* A JSON string from bytes that may not be valid UTF-8 (an error message quoting a truncated
 * field, generated text): invalid sequences become U+FFFD instead of failing the encoder. */
static json_t *jstr(const char *p, size_t n) {
    json_t *s = json_stringn(p, n);
    if (s) return s;
    strbuf b = {0};
    if (text_utf8_sanitize(p, n, &b) && b.p) s = json_stringn(b.p, b.len);
    sb_free(&b);
    return s;
}

static char *dump(json_t *root) {
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

char *api_error_json(const api_error *e) {
    json_t *err = json_object();
    json_object_set_new(err, "message", jstr(e->message, strlen(e->message)));
    json_object_set_new(err, "type", json_string(e->type ? e->type : BAD));
    json_object_set_new(err, "param", e->param[0] ? jstr(e->param, strlen(e->param)) : json_null());
    json_object_set_new(err, "code", e->code ? json_string(e->code) : json_null());
    json_t *root = json_object();
    json_object_set_new(root, "error", err);
    char *s = dump(root);
    if (!s) {
        static const char fallback[] =
            "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
            "\"code\":null}}";
        s = malloc(sizeof fallback);
        if (s) memcpy(s, fallback, sizeof fallback);
    }
    return s;
}

/* ---- field readers: absent and null leave the default; a wrong type or range is a 400 ---- */

static json_t *field(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return json_is_null(v) ? NULL : v;
}

static int bad(api_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(api_error *e, const char *param, const char *fmt, ...) {
    e->status = 400;
    e->type = BAD;
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* Client text quoted in an error message: at most cap - 1 bytes, whole characters, control
 * characters as '?', so that the message stays one line (found by tests/fuzz/fuzz_server.c: a
 * newline in a role, or in the text jansson quotes from malformed JSON, split it). */
static const char *quote(const char *s, char *out, size_t cap) {
    size_t n = strlen(s) < cap - 1 ? strlen(s) : cap - 1;
    memcpy(out, s, n);
    n = text_utf8_complete_prefix(out, n);
    out[n] = 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)out[i] < 0x20 || out[i] == 0x7f) out[i] = '?';
    return out;
}

static int get_bool(json_t *root, const char *key, bool *out, api_error *e) {
    json_t *v = field(root, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return bad(e, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

static int get_int(json_t *root, const char *key, int64_t lo, int64_t hi, bool *given,
                   int64_t *out, api_error *e) {
    json_t *v = field(root, key);
    if (!v) return 0;
    if (!json_is_integer(v)) return bad(e, key, "'%s' must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return bad(e, key, "'%s' is %" PRId64 "; it must lie in [%" PRId64 ", %" PRId64 "]",
                   key, (int64_t)x, lo, hi);
    *out = x;
    if (given) *given = true;
    return 0;
}

static int get_num(json_t *root, const char *key, double lo, double hi, double *out,
                   api_error *e) {
    json_t *v = field(root, key);
    if (!v) return 0;
    if (!json_is_number(v)) return bad(e, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return bad(e, key, "'%s' is %g; it must lie in [%g, %g]", key, x, lo, hi);
    *out = x;
    return 0;
}

static char *dup_bytes(const char *p, size_t n) {
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

static int parse_stop(json_t *root, gen_request *r, api_error *e) {
    json_t *v = field(root, "stop");
    if (!v) return 0;
    json_t *one[1] = {v};
    json_t **items = one;
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > TS_MAX_STOP) return bad(e, "stop", "at most %d stop sequences", TS_MAX_STOP);
        items = NULL;
    } else if (!json_is_string(v)) {
        return bad(e, "stop", "'stop' must be a string or an array of strings");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = items ? items[i] : json_array_get(v, i);
        if (!json_is_string(s)) return bad(e, "stop", "'stop' must be a string or an array of strings");
        size_t len = json_string_length(s);
        if (len == 0) return bad(e, "stop", "stop sequences must not be empty");
        if (len > TS_MAX_STOP_LEN)
            return bad(e, "stop", "stop sequences are at most %d bytes", TS_MAX_STOP_LEN);
        r->stop[r->n_stop] = dup_bytes(json_string_value(s), len);
        if (!r->stop[r->n_stop]) return bad(e, "stop", "out of memory");
        r->stop_len[r->n_stop++] = len;
    }
    return 0;
}

/* Fields sluice cannot honour: refused unless they hold the value that means "off". */
static int refuse_unsupported(json_t *root, api_kind kind, api_error *e) {
    json_t *v;
    if ((v = field(root, "tools")) && !(json_is_array(v) && json_array_size(v) == 0))
        return bad(e, "tools", "tools are not supported");
    if ((v = field(root, "functions")) && !(json_is_array(v) && json_array_size(v) == 0))
        return bad(e, "functions", "functions are not supported");
    if ((v = field(root, "logprobs")) && !json_is_false(v) &&
        !(kind == API_COMPLETION && json_is_integer(v) && json_integer_value(v) == 0))
        return bad(e, "logprobs", "logprobs are not supported");
    if ((v = field(root, "top_logprobs")) && !(json_is_integer(v) && json_integer_value(v) == 0))
        return bad(e, "top_logprobs", "logprobs are not supported");
    if ((v = field(root, "echo")) && !json_is_false(v))
        return bad(e, "echo", "echo is not supported");
    if ((v = field(root, "suffix")) && !(json_is_string(v) && json_string_length(v) == 0))
        return bad(e, "suffix", "suffix is not supported");
    if ((v = field(root, "best_of")) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return bad(e, "best_of", "best_of must be 1");
    if ((v = field(root, "n")) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return bad(e, "n", "only n = 1 is supported");
    if ((v = field(root, "logit_bias")) && !(json_is_object(v) && json_object_size(v) == 0))
        return bad(e, "logit_bias", "logit_bias is not supported");
    if ((v = field(root, "response_format"))) {
        json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
            return bad(e, "response_format", "only response_format {\"type\": \"text\"} is supported");
    }
    return 0;
}

/* content: a string, an array of {"type": "text", "text": ...} parts (joined by newlines), or
 * null for an assistant turn. */
static int parse_content(json_t *c, chat_role role, size_t idx, chat_msg *out, api_error *e) {
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].content", idx);
    if (!c) {
        if (role != ROLE_ASSISTANT) return bad(e, param, "%s is missing", param);
        out->text = dup_bytes("", 0);
        out->len = 0;
        return out->text ? 0 : bad(e, param, "out of memory");
    }
    if (json_is_string(c)) {
        out->len = json_string_length(c);
        out->text = dup_bytes(json_string_value(c), out->len);
        return out->text ? 0 : bad(e, param, "out of memory");
    }
    if (!json_is_array(c)) return bad(e, param, "%s must be a string or an array of parts", param);
    strbuf b = {0};
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        json_t *text = json_is_object(part) ? json_object_get(part, "text") : NULL;
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0) {
            sb_free(&b);
            return bad(e, param, "only text content parts are supported");
        }
        if (!json_is_string(text)) {
            sb_free(&b);
            return bad(e, param, "a text part needs a string 'text'");
        }
        if (i) sb_puts(&b, "\n");
        sb_append(&b, json_string_value(text), json_string_length(text));
    }
    out->len = b.len;
    out->text = sb_take(&b);
    return out->text ? 0 : bad(e, param, "out of memory");
}

static int parse_messages(json_t *root, gen_request *r, api_error *e) {
    json_t *msgs = field(root, "messages");
    if (!msgs) return bad(e, "messages", "'messages' is required");
    if (!json_is_array(msgs)) return bad(e, "messages", "'messages' must be an array");
    size_t n = json_array_size(msgs);
    if (n == 0) return bad(e, "messages", "'messages' must not be empty");
    if (n > MAX_MESSAGES) return bad(e, "messages", "at most %d messages", MAX_MESSAGES);
    r->msgs = calloc(n, sizeof *r->msgs);
    if (!r->msgs) return bad(e, "messages", "out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m)) return bad(e, param, "%s must be an object", param);
        json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!json_is_string(role)) return bad(e, param, "%s must be a string", param);
        const char *rs = json_string_value(role);
        chat_role cr;
        if (strcmp(rs, "system") == 0 || strcmp(rs, "developer") == 0) cr = ROLE_SYSTEM;
        else if (strcmp(rs, "user") == 0) cr = ROLE_USER;
        else if (strcmp(rs, "assistant") == 0) cr = ROLE_ASSISTANT;
        else if (strcmp(rs, "tool") == 0) cr = ROLE_TOOL;
        else {
            char q[41];
            return bad(e, param, "unknown role '%s' (system, developer, user, assistant, tool)",
                       quote(rs, q, sizeof q));
        }
        json_t *calls = field(m, "tool_calls");
        if (calls && !(json_is_array(calls) && json_array_size(calls) == 0)) {
            snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
            return bad(e, param, "tool calls are not supported");
        }
        r->msgs[i].role = cr;
        r->n_msgs = (int)i + 1;
        if (parse_content(field(m, "content"), cr, i, &r->msgs[i], e) != 0) return -1;
    }
    return 0;
}

static int parse_ids(json_t *arr, int n_vocab, gen_request *r, api_error *e) {
    size_t n = json_array_size(arr);
    if (n > INT_MAX / 2) return bad(e, "prompt", "too many prompt tokens");
    r->prompt_ids = malloc((n ? n : 1) * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return bad(e, "prompt", "out of memory");
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v)) return bad(e, "prompt", "a token-id prompt holds only integers");
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= n_vocab)
            return bad(e, "prompt", "token id %" PRId64 " is outside the vocabulary (0..%d)",
                       (int64_t)id, n_vocab - 1);
        r->prompt_ids[i] = (int32_t)id;
    }
    r->n_prompt_ids = (int)n;
    return 0;
}

/* prompt: a string, [string], [int, ...] or [[int, ...]]; one prompt per request. */
static int parse_prompt(json_t *root, int n_vocab, gen_request *r, api_error *e) {
    json_t *p = field(root, "prompt");
    if (!p) return bad(e, "prompt", "'prompt' is required");
    if (json_is_array(p)) {
        size_t n = json_array_size(p);
        if (n == 0) return bad(e, "prompt", "'prompt' must not be empty");
        json_t *first = json_array_get(p, 0);
        if (json_is_integer(first)) return parse_ids(p, n_vocab, r, e);
        if (n != 1) return bad(e, "prompt", "one prompt per request");
        if (json_is_array(first)) return parse_ids(first, n_vocab, r, e);
        p = first;
    }
    if (!json_is_string(p))
        return bad(e, "prompt", "'prompt' must be a string, an array of token ids, or an array "
                                "holding one of those");
    r->prompt_len = json_string_length(p);
    r->prompt = dup_bytes(json_string_value(p), r->prompt_len);
    return r->prompt ? 0 : bad(e, "prompt", "out of memory");
}

static int parse_fields(json_t *root, api_kind kind, const server_config *cfg, int n_vocab,
                        uint64_t next_seed, gen_request *r, api_error *e) {
    json_t *model = field(root, "model");
    if (model && !json_is_string(model)) return bad(e, "model", "'model' must be a string");
    if (refuse_unsupported(root, kind, e)) return -1;
    if (get_bool(root, "stream", &r->stream, e)) return -1;
    json_t *so = field(root, "stream_options");
    if (so) {
        if (!json_is_object(so)) return bad(e, "stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &r->include_usage, e)) return -1;
    }
    int64_t x = 0;
    bool given = false;
    if (get_int(root, "max_tokens", 1, INT32_MAX, &given, &x, e)) return -1;
    if (get_int(root, "max_completion_tokens", 1, INT32_MAX, &given, &x, e)) return -1;
    r->max_tokens = given ? (int)x : 0;
    double d = r->sp.temperature;
    if (get_num(root, "temperature", 0, 2, &d, e)) return -1;
    r->sp.temperature = (float)d;
    d = r->sp.top_p;
    if (get_num(root, "top_p", 0, 1, &d, e)) return -1;
    r->sp.top_p = (float)d;
    d = r->sp.min_p;
    if (get_num(root, "min_p", 0, 1, &d, e)) return -1;
    r->sp.min_p = (float)d;
    d = r->sp.repeat_penalty;
    if (get_num(root, "repeat_penalty", 0x1p-20, 100, &d, e)) return -1;
    r->sp.repeat_penalty = (float)d;
    x = r->sp.top_k;
    if (get_int(root, "top_k", 0, INT32_MAX, NULL, &x, e)) return -1;
    r->sp.top_k = (int)x;
    x = r->sp.repeat_last_n;
    if (get_int(root, "repeat_last_n", 0, 1 << 16, NULL, &x, e)) return -1;
    r->sp.repeat_last_n = (int)x;
    /* accepted for compatibility, no effect (the sampler has no presence/frequency terms) */
    d = 0;
    if (get_num(root, "presence_penalty", -2, 2, &d, e)) return -1;
    if (get_num(root, "frequency_penalty", -2, 2, &d, e)) return -1;
    given = false;
    x = 0;
    if (get_int(root, "seed", INT64_MIN, INT64_MAX, &given, &x, e)) return -1;
    r->sp.seed = given ? (uint64_t)x : cfg->seed_fixed ? cfg->sampling.seed : next_seed;
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e)) return -1;
    if (parse_stop(root, r, e)) return -1;
    json_t *kw = field(root, "chat_template_kwargs");
    if (kw) {
        if (!json_is_object(kw))
            return bad(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        if (get_bool(kw, "enable_thinking", &r->thinking, e)) return -1;
    }
    if (kind == API_CHAT) return parse_messages(root, r, e);
    return parse_prompt(root, n_vocab, r, e);
}

int api_parse_request(api_kind kind, const char *body, size_t len, const server_config *cfg,
                      int n_vocab, uint64_t next_seed, gen_request *r, api_error *e) {
    *r = (gen_request){.kind = kind, .sp = cfg->sampling, .thinking = cfg->thinking};
    json_error_t je;
    /* jansson rejects invalid UTF-8, NUL escapes, numbers out of range and nesting beyond its
     * depth limit; a body of anything but one JSON value is an error */
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root) {
        char q[sizeof je.text];
        return bad(e, "", "invalid JSON at line %d, column %d: %s", je.line, je.column,
                   quote(je.text, q, sizeof q));
    }
    int rc = json_is_object(root) ? parse_fields(root, kind, cfg, n_vocab, next_seed, r, e)
                                  : bad(e, "", "the request body must be a JSON object");
    json_decref(root);
    if (rc) gen_request_free(r);
    return rc;
}

void gen_request_free(gen_request *r) {
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    for (int i = 0; i < r->n_msgs; i++) free(r->msgs[i].text);
    free(r->msgs);
    free(r->prompt);
    free(r->prompt_ids);
    api_kind kind = r->kind;
    *r = (gen_request){.kind = kind};
}

/* ---- responses ------------------------------------------------------------------------- */

static json_t *usage(int p, int c) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(p));
    json_object_set_new(u, "completion_tokens", json_integer(c));
    json_object_set_new(u, "total_tokens", json_integer((json_int_t)p + c));
    return u;
}

static json_t *envelope(const api_meta *m, bool chunk) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(m->id));
    const char *obj = m->kind == API_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                          : "text_completion";
    json_object_set_new(o, "object", json_string(obj));
    json_object_set_new(o, "created", json_integer(m->created));
    json_object_set_new(o, "model", jstr(m->model, strlen(m->model)));
    json_object_set_new(o, "system_fingerprint", json_string("sluice-" SLUICE_VERSION));
    return o;
}

static json_t *choice(const api_meta *m, const char *text, size_t len, bool role, bool delta,
                      const char *finish) {
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    if (m->kind == API_CHAT) {
        json_t *msg = json_object();
        if (role || !delta) json_object_set_new(msg, "role", json_string("assistant"));
        if (!delta || len || role) json_object_set_new(msg, "content", jstr(text, len));
        json_object_set_new(c, delta ? "delta" : "message", msg);
    } else {
        json_object_set_new(c, "text", jstr(text, len));
    }
    json_object_set_new(c, "logprobs", json_null());
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    return c;
}

char *api_response_json(const api_meta *m, const char *text, size_t len, const char *finish,
                        int prompt_tokens, int completion_tokens) {
    json_t *o = envelope(m, false);
    json_t *choices = json_array();
    json_array_append_new(choices, choice(m, text, len, true, false, finish));
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", usage(prompt_tokens, completion_tokens));
    return dump(o);
}

char *api_chunk_json(const api_meta *m, const char *text, size_t len, bool role,
                     const char *finish, bool with_usage) {
    json_t *o = envelope(m, true);
    json_t *choices = json_array();
    json_array_append_new(choices, choice(m, text, len, role, true, finish));
    json_object_set_new(o, "choices", choices);
    if (with_usage) json_object_set_new(o, "usage", json_null());
    return dump(o);
}

char *api_usage_chunk_json(const api_meta *m, int prompt_tokens, int completion_tokens) {
    json_t *o = envelope(m, true);
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage(prompt_tokens, completion_tokens));
    return dump(o);
}

char *api_models_json(const char *model_id, int64_t created, const sluice_model_info *info,
                      int n_ctx) {
    json_t *mdl = json_object();
    json_object_set_new(mdl, "id", jstr(model_id, strlen(model_id)));
    json_object_set_new(mdl, "object", json_string("model"));
    json_object_set_new(mdl, "created", json_integer(created));
    json_object_set_new(mdl, "owned_by", json_string("sluice"));
    /* extensions, as llama.cpp's server reports them under "meta" */
    json_t *meta = json_object();
    json_object_set_new(meta, "architecture", jstr(info->arch, strlen(info->arch)));
    json_object_set_new(meta, "n_vocab", json_integer(info->n_vocab));
    json_object_set_new(meta, "n_ctx", json_integer(n_ctx));
    json_object_set_new(meta, "n_ctx_train", json_integer(info->n_ctx_train));
    json_object_set_new(meta, "n_params", json_integer(info->n_params));
    json_object_set_new(meta, "n_expert", json_integer(info->n_expert));
    json_object_set_new(meta, "n_expert_used", json_integer(info->n_expert_used));
    json_object_set_new(mdl, "meta", meta);
    json_t *data = json_array();
    json_array_append_new(data, mdl);
    json_t *root = json_object();
    json_object_set_new(root, "object", json_string("list"));
    json_object_set_new(root, "data", data);
    return dump(root);
}
