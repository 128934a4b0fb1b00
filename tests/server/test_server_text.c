/* Unit tests of the server's pure parts: UTF-8 hold-back and repair, stop sequences split
 * across tokens, ChatML rendering and thinking detection, chat-template discovery from a GGUF,
 * request validation. The HTTP side is tested end to end by run.sh.
 *
 * `test_server_text --write-template-model OUT` writes the tiny qwen3moe model with a Qwen3-style
 * chat template added (run.sh serves it to test thinking over HTTP). */
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "formats/gguf_write.h"
#include "server/internal.h"

#define TINY_QWEN SLUICE_TEST_DATA "/qwen3moe-tiny-Q4_K_M.gguf"
#define STORIES SLUICE_SOURCE_DIR "/models/stories260K.gguf"

/* The shape of Qwen3's hybrid-thinking template (written for this test): ChatML turns and a
 * generation prompt that closes an empty think block when enable_thinking is false. */
static const char QWEN3_STYLE_TEMPLATE[] =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}\n";

static int write_template_model(const char *src, const char *dst) {
    char err[256];
    gguf_file *f = gguf_open(src, err, sizeof err);
    if (!f) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    gguf_writer *w = gguf_writer_new();
    int rc = w ? 0 : -1;
    if (w) gguf_w_set_alignment(w, (uint32_t)f->alignment);
    for (uint64_t i = 0; rc == 0 && i < f->n_kv; i++)
        if (strcmp(f->kv[i].key, "tokenizer.chat_template") != 0) rc = gguf_w_copy_kv(w, &f->kv[i]);
    if (rc == 0) rc = gguf_w_str(w, "tokenizer.chat_template", QWEN3_STYLE_TEMPLATE);
    for (uint64_t i = 0; rc == 0 && i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) < 0) rc = -1;
    }
    if (rc == 0) rc = gguf_writer_save(w, dst);
    gguf_writer_free(w);
    gguf_close(f);
    return rc;
}

static void test_template_discovery(void) {
    char path[] = "/tmp/sluice-test-template-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    CHECK(write_template_model(TINY_QWEN, path) == 0);
    sluice_model *m = sluice_model_load(path, NULL);
    CHECKF(m != NULL, "%s", sluice_last_error());
    if (m) {
        CHECK(sluice_model_chat_format(m) == SLUICE_CHAT_CHATML);
        int n = sluice_model_chat_template(m, NULL, 0);
        CHECK(n == (int)strlen(QWEN3_STYLE_TEMPLATE));
        char small[8];
        CHECK(sluice_model_chat_template(m, small, sizeof small) == n);
        CHECK(strcmp(small, "{%- for") == 0);
        chat_template t;
        chat_template_init(&t, m, -1);
        CHECK(t.format == SLUICE_CHAT_CHATML && t.think == THINK_HYBRID && !t.from_vocab);
        CHECK(t.strip_reasoning);
        chat_template_init(&t, m, SLUICE_CHAT_NONE);
        CHECK(t.format == SLUICE_CHAT_NONE);
        sluice_model_free(m);
    }
    unlink(path);
    /* no template: ChatML from the vocabulary (tiny qwen), plain (stories260K) */
    m = sluice_model_load(TINY_QWEN, NULL);
    if (m) {
        CHECK(sluice_model_chat_template(m, NULL, 0) == -1);
        CHECK(sluice_model_chat_format(m) == SLUICE_CHAT_CHATML);
        chat_template t;
        chat_template_init(&t, m, -1);
        CHECK(t.from_vocab && t.think == THINK_NONE);
        sluice_model_free(m);
    }
    m = sluice_model_load(STORIES, NULL);
    CHECK(m && sluice_model_chat_format(m) == SLUICE_CHAT_NONE);
    sluice_model_free(m);
}

/* Feed pieces one by one; return everything released (stream + finish). */
static char *feed(const char *const *pieces, int n, const char *const *stops, int n_stop,
                  bool *stopped) {
    size_t lens[TS_MAX_STOP] = {0};
    for (int i = 0; i < n_stop; i++) lens[i] = strlen(stops[i]);
    textstream ts;
    ts_init(&ts, stops, lens, n_stop);
    strbuf out = {0};
    for (int i = 0; i < n && !ts.stopped; i++) ts_push(&ts, pieces[i], strlen(pieces[i]), &out);
    ts_finish(&ts, &out);
    *stopped = ts.stopped;
    ts_free(&ts);
    sb_append(&out, "", 0);
    return sb_take(&out);
}

static void test_utf8(void) {
    /* "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80 */
    CHECK(text_utf8_complete_prefix("ab\xC3", 3) == 2);
    CHECK(text_utf8_complete_prefix("ab\xC3\xA9", 4) == 4);
    CHECK(text_utf8_complete_prefix("\xE2\x82", 2) == 0);
    CHECK(text_utf8_complete_prefix("x\xF0\x9F\x98", 4) == 1);
    CHECK(text_utf8_complete_prefix("x\xF0\x9F\x98\x80", 5) == 5);
    /* bytes that can never complete are not held back (they become U+FFFD) */
    CHECK(text_utf8_complete_prefix("a\xFF", 2) == 2);
    CHECK(text_utf8_complete_prefix("a\xE0\x80", 3) == 3); /* overlong */

    strbuf b = {0};
    text_utf8_sanitize("a\xFF" "b\xC3", 4, &b);
    CHECKF(strcmp(b.p, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD") == 0, "got '%s'", b.p);
    sb_free(&b);
    text_utf8_sanitize("\xED\xA0\x80", 3, &b); /* a surrogate: three bytes, each refused */
    CHECKF(b.len == 9, "surrogate gave %zu bytes", b.len);
    sb_free(&b);
    text_utf8_sanitize("\xF0\x9F\x98" "x", 4, &b); /* truncated 4-byte: one replacement */
    CHECKF(strcmp(b.p, "\xEF\xBF\xBDx") == 0, "got '%s'", b.p);
    sb_free(&b);
}

static void test_stops(void) {
    bool stopped;
    /* a character split over two tokens comes out whole */
    const char *p1[] = {"caf", "\xC3", "\xA9", "!"};
    char *s = feed(p1, 4, NULL, 0, &stopped);
    CHECKF(strcmp(s, "caf\xC3\xA9!") == 0 && !stopped, "got '%s'", s);
    free(s);
    /* a stop spanning three tokens is cut, with nothing after it */
    const char *stops[] = {"<END>"};
    const char *p2[] = {"hello <", "EN", "D> world"};
    s = feed(p2, 3, stops, 1, &stopped);
    CHECKF(strcmp(s, "hello ") == 0 && stopped, "got '%s'", s);
    free(s);
    /* a false start of a stop is released once it cannot match */
    const char *p3[] = {"a <E", "X> b"};
    s = feed(p3, 2, stops, 1, &stopped);
    CHECKF(strcmp(s, "a <EX> b") == 0 && !stopped, "got '%s'", s);
    free(s);
    /* generation ending inside a possible stop releases the held text */
    const char *p4[] = {"tail <EN"};
    s = feed(p4, 1, stops, 1, &stopped);
    CHECKF(strcmp(s, "tail <EN") == 0 && !stopped, "got '%s'", s);
    free(s);
    /* of two stops completed by the same token, the one starting first cuts */
    const char *two[] = {"bc", "abcd"};
    const char *p5[] = {"xa", "bcd"};
    s = feed(p5, 2, two, 2, &stopped);
    CHECKF(strcmp(s, "x") == 0 && stopped, "got '%s'", s);
    free(s);
    /* a multi-byte stop split inside a character */
    const char *euro[] = {"\xE2\x82\xAC"};
    const char *p6[] = {"5 \xE2", "\x82", "\xAC more"};
    s = feed(p6, 3, euro, 1, &stopped);
    CHECKF(strcmp(s, "5 ") == 0 && stopped, "got '%s'", s);
    free(s);

    /* what is released before the end never contains a stop prefix that later matched */
    size_t len = 5;
    textstream ts;
    ts_init(&ts, stops, &len, 1);
    strbuf out = {0};
    ts_push(&ts, "ab<", 3, &out);
    CHECKF(out.len == 2 && memcmp(out.p, "ab", 2) == 0, "released %zu", out.len);
    ts_push(&ts, "END>", 4, &out);
    CHECK(ts.stopped && out.len == 2);
    ts_free(&ts);
    sb_free(&out);
}

static void test_chat(void) {
    chat_msg msgs[] = {
        {ROLE_SYSTEM, "Be brief.", 9},
        {ROLE_USER, "Hi", 2},
        {ROLE_ASSISTANT, "<think>\nhmm\n</think>\n\nHello!", 28},
        {ROLE_USER, "Bye", 3},
    };
    chat_template t = {.format = SLUICE_CHAT_CHATML, .think = THINK_HYBRID, .strip_reasoning = true};
    strbuf b = {0};
    CHECK(chat_render(&t, msgs, 4, false, &b));
    const char *want =
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    CHECKF(strcmp(b.p, want) == 0, "got:\n%s", b.p);
    sb_free(&b);

    t.think = THINK_OPENS;
    chat_render(&t, msgs + 1, 1, true, &b);
    CHECKF(strcmp(b.p, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n") == 0,
           "got:\n%s", b.p);
    sb_free(&b);

    chat_msg tools[] = {{ROLE_USER, "q", 1}, {ROLE_TOOL, "r1", 2}, {ROLE_TOOL, "r2", 2}};
    t.think = THINK_NONE;
    chat_render(&t, tools, 3, true, &b);
    CHECKF(strstr(b.p, "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\n"
                       "r2\n</tool_response><|im_end|>\n") != NULL,
           "got:\n%s", b.p);
    sb_free(&b);

    chat_template plain = {.format = SLUICE_CHAT_NONE};
    chat_render(&plain, msgs, 2, true, &b);
    CHECKF(strcmp(b.p, "Be brief.\nHi") == 0, "got '%s'", b.p);
    sb_free(&b);

    /* thinking switches as Qwen's templates spell them (escaped newlines, as stored) */
    CHECK(chat_classify_thinking("{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                                 "{%- if enable_thinking is defined and enable_thinking is false %}"
                                 "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}") ==
          THINK_HYBRID);
    CHECK(chat_classify_thinking("{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                                 "{%- if enable_thinking is defined and enable_thinking is false %}"
                                 "{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}"
                                 "{{- '<think>\\n' }}{%- endif %}{%- endif %}") == THINK_OPENS);
    CHECK(chat_classify_thinking("{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n"
                                 "{% endif %}") == THINK_ALWAYS);
    CHECK(chat_classify_thinking("{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}") ==
          THINK_NONE);
}

static int parse(api_kind k, const char *body, gen_request *r, api_error *e) {
    server_config cfg;
    server_config_defaults(&cfg);
    return api_parse_request(k, body, strlen(body), &cfg, 100, 7, r, e);
}

static void expect_400(api_kind k, const char *body, const char *param) {
    gen_request r;
    api_error e = {0};
    int rc = parse(k, body, &r, &e);
    CHECKF(rc == -1 && e.status == 400, "accepted: %s", body);
    if (rc == 0) gen_request_free(&r);
    else if (param) CHECKF(strcmp(e.param, param) == 0, "%s: param '%s'", body, e.param);
}

static void test_api(void) {
    gen_request r;
    api_error e;
    int rc = parse(API_CHAT,
                   "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                   "{\"type\":\"text\",\"text\":\"b\"}]}],\"max_tokens\":5,\"temperature\":0,"
                   "\"stop\":[\"x\",\"yz\"],\"seed\":-3,\"stream\":true,"
                   "\"chat_template_kwargs\":{\"enable_thinking\":false},\"user\":\"u\"}",
                   &r, &e);
    CHECKF(rc == 0, "%s", e.message);
    if (rc == 0) {
        CHECK(r.n_msgs == 1 && r.msgs[0].len == 3 && memcmp(r.msgs[0].text, "a\nb", 3) == 0);
        CHECK(r.max_tokens == 5 && r.sp.temperature == 0 && r.n_stop == 2 && r.stream);
        CHECK(r.sp.seed == (uint64_t)-3 && !r.thinking);
        gen_request_free(&r);
    }
    rc = parse(API_COMPLETION, "{\"prompt\":[1,2,3]}", &r, &e);
    CHECK(rc == 0 && r.n_prompt_ids == 3 && r.prompt_ids[2] == 3 && r.sp.seed == 7);
    if (rc == 0) gen_request_free(&r);

    expect_400(API_CHAT, "{", "");
    expect_400(API_CHAT, "[]", "");
    expect_400(API_CHAT, "{\"messages\":[]}", "messages");
    expect_400(API_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0].role");
    expect_400(API_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content");
    expect_400(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-1}", "max_tokens");
    expect_400(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":3}", "temperature");
    expect_400(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":\"1\"}", "top_p");
    expect_400(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"\"]}", "stop");
    expect_400(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", "n");
    expect_400(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\\u0000\"}]}", "");
    expect_400(API_COMPLETION, "{\"prompt\":[100]}", "prompt");
    expect_400(API_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt");
    expect_400(API_COMPLETION, "{}", "prompt");
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-template-model") == 0)
        return write_template_model(TINY_QWEN, argv[2]) == 0 ? 0 : 1;
    test_utf8();
    test_stops();
    test_chat();
    test_api();
    test_template_discovery();
    CHECK_DONE();
}
