/* Chat prompts. sluice does not run Jinja: it renders the template families it knows (ChatML,
 * as Qwen's templates produce it) and reads from the stored template only the switches that
 * change the text (thinking, reasoning stripping). Models without a known template get the
 * message texts joined by newlines (docs/server.md). */
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

const char *chat_format_name(sluice_chat_format f) {
    return f == SLUICE_CHAT_CHATML ? "chatml" : "plain";
}

const char *think_style_name(think_style s) {
    switch (s) {
    case THINK_HYBRID: return "optional (off: empty think block)";
    case THINK_OPENS: return "optional (on: opens <think>)";
    case THINK_ALWAYS: return "always";
    case THINK_NONE: break;
    }
    return "none";
}

static const char *find_last(const char *hay, const char *needle) {
    const char *last = NULL;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) last = p;
    return last;
}

/* The generation prompt is the part after the last add_generation_prompt test; what it appends
 * decides the thinking style. Qwen3 hybrid templates close an empty block only when
 * enable_thinking is false; Qwen3.5 templates open "<think>\n" otherwise; thinking-only
 * templates open it unconditionally. */
think_style chat_classify_thinking(const char *tmpl) {
    const char *tail = find_last(tmpl, "add_generation_prompt");
    if (!tail) return THINK_NONE;
    if (strstr(tail, "enable_thinking")) {
        /* the opening literal on its own: '<think>\n' with an escaped or a real newline */
        if (strstr(tail, "'<think>\\n'") || strstr(tail, "\"<think>\\n\"") ||
            strstr(tail, "'<think>\n'") || strstr(tail, "\"<think>\n\""))
            return THINK_OPENS;
        return THINK_HYBRID;
    }
    return strstr(tail, "<think>") ? THINK_ALWAYS : THINK_NONE;
}

void chat_template_init(chat_template *t, const sluice_model *m, int forced) {
    *t = (chat_template){.format = SLUICE_CHAT_NONE, .think = THINK_NONE};
    int n = sluice_model_chat_template(m, NULL, 0);
    char *src = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (src) sluice_model_chat_template(m, src, n + 1);
    t->format = forced >= 0 ? (sluice_chat_format)forced : sluice_model_chat_format(m);
    t->from_vocab = t->format == SLUICE_CHAT_CHATML && !src;
    if (t->format == SLUICE_CHAT_CHATML && src) {
        t->think = chat_classify_thinking(src);
        t->strip_reasoning = strstr(src, "</think>") != NULL;
    }
    free(src);
}

static const char *role_name(chat_role r) {
    switch (r) {
    case ROLE_SYSTEM: return "system";
    case ROLE_USER: return "user";
    case ROLE_ASSISTANT: return "assistant";
    case ROLE_TOOL: return "tool";
    }
    return "user";
}

static const char *memfind_last(const char *h, size_t hn, const char *n, size_t nn) {
    if (hn < nn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(h + i, n, nn) == 0) return h + i;
    return NULL;
}

/* Qwen templates re-render earlier assistant turns without their reasoning: the text after the
 * last </think>, leading newlines removed. Keeping the prompt identical to theirs keeps the
 * model in distribution. */
static void strip_reasoning(const char **text, size_t *len) {
    static const char close[] = "</think>";
    const char *end = memfind_last(*text, *len, close, sizeof close - 1);
    if (!end) return;
    const char *p = end + sizeof close - 1;
    const char *stop = *text + *len;
    while (p < stop && *p == '\n') p++;
    *len = (size_t)(stop - p);
    *text = p;
}

static bool render_chatml(const chat_template *t, const chat_msg *msgs, int n, bool thinking,
                          strbuf *out) {
    int last_user = -1;
    for (int i = 0; i < n; i++)
        if (msgs[i].role == ROLE_USER) last_user = i;
    for (int i = 0; i < n; i++) {
        const chat_msg *m = &msgs[i];
        const char *text = m->text;
        size_t len = m->len;
        if (m->role == ROLE_TOOL) {
            /* Qwen: consecutive tool results share one user turn, each wrapped in
             * <tool_response> */
            if (i == 0 || msgs[i - 1].role != ROLE_TOOL) sb_puts(out, "<|im_start|>user");
            sb_puts(out, "\n<tool_response>\n");
            sb_append(out, text, len);
            sb_puts(out, "\n</tool_response>");
            if (i == n - 1 || msgs[i + 1].role != ROLE_TOOL) sb_puts(out, "<|im_end|>\n");
            continue;
        }
        if (m->role == ROLE_ASSISTANT && t->strip_reasoning && i < last_user)
            strip_reasoning(&text, &len);
        sb_printf(out, "<|im_start|>%s\n", role_name(m->role));
        sb_append(out, text, len);
        sb_puts(out, "<|im_end|>\n");
    }
    sb_puts(out, "<|im_start|>assistant\n");
    switch (t->think) {
    case THINK_HYBRID:
        if (!thinking) sb_puts(out, "<think>\n\n</think>\n\n");
        break;
    case THINK_OPENS: sb_puts(out, thinking ? "<think>\n" : "<think>\n\n</think>\n\n"); break;
    case THINK_ALWAYS: sb_puts(out, "<think>\n"); break;
    case THINK_NONE: break;
    }
    return !out->oom;
}

/* No template: the texts in order, one newline between them, no generation prompt, so that a
 * completion model continues the last message (stories260K continues a story). */
static bool render_plain(const chat_msg *msgs, int n, strbuf *out) {
    for (int i = 0; i < n; i++) {
        if (i) sb_puts(out, "\n");
        sb_append(out, msgs[i].text, msgs[i].len);
    }
    if (!out->p) sb_append(out, "", 0);
    return !out->oom;
}

bool chat_render(const chat_template *t, const chat_msg *msgs, int n, bool thinking,
                 strbuf *out) {
    if (t->format == SLUICE_CHAT_CHATML) return render_chatml(t, msgs, n, thinking, out);
    return render_plain(msgs, n, out);
}
