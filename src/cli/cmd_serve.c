/* sluice serve: the OpenAI-compatible HTTP server (src/server, docs/server.md). */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/model_opts.h"
#include "cli/plan_opts.h"
#include "server/server.h"

#define SERVE_DETAILS                                                                          \
    "Endpoints: POST /v1/chat/completions, POST /v1/completions (both with \"stream\": true\n"   \
    "for server-sent events), GET /v1/models, GET /health, GET /metrics (Prometheus).\n"         \
    "Requests wait in a queue for one engine thread; a full queue answers 503 with Retry-After.\n" \
    "Chat prompts use the model's template: ChatML for Qwen (thinking on unless --no-thinking\n"  \
    "or chat_template_kwargs.enable_thinking=false); a model without one (stories260K) gets the\n" \
    "message texts joined by newlines. Sampling options set the defaults for requests that do\n"  \
    "not give temperature, top_p, ... themselves. Stop with SIGINT or SIGTERM. See docs/server.md."

int cmd_serve(int argc, char **argv) {
    server_config cfg;
    server_config_defaults(&cfg);
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    cli_sampling_opts so;
    cli_sampling_opts_init(&so);
    cli_plan_opts po = {0};
    const char *chat_format = "auto";
    bool no_thinking = false;
    uint64_t max_body = cfg.max_body;
    const cli_opt own[] = {
        {"--host", NULL, OPT_STR, &cfg.host, "ADDR", "address to listen on (default 127.0.0.1; 0.0.0.0 or :: for all)"},
        {"--port", NULL, OPT_INT, &cfg.port, "N", "TCP port (default 8080; 0 picks a free one and logs it)"},
        {"--alias", NULL, OPT_STR, &cfg.model_id, "NAME", "model id for /v1/models and responses (default: general.name)"},
        {"--max-tokens", NULL, OPT_INT, &cfg.max_tokens, "N", "most tokens one request may generate; larger max_tokens are capped (default 2048)"},
        {"--max-body", NULL, OPT_SIZE, &max_body, "SIZE", "largest request body; larger ones get 413 (default 2M)"},
        {"--queue", NULL, OPT_INT, &cfg.queue, "N", "requests that may wait behind the running one; more get 503 (default 16)"},
        {"--max-connections", NULL, OPT_INT, &cfg.max_connections, "N", "open connections at most (default 128)"},
        {"--timeout", NULL, OPT_INT, &cfg.timeout_s, "S", "close connections idle for S seconds (default 60)"},
        {"--chat-format", NULL, OPT_STR, &chat_format, "F", "auto (the model's template), chatml or plain (default auto)"},
        {"--no-thinking", NULL, OPT_FLAG, &no_thinking, NULL, "default enable_thinking to false for thinking models"},
        {"--quiet", "-q", OPT_FLAG, &cfg.quiet, NULL, "no log line per request"},
        {"--debug-delay-ms", NULL, OPT_INT, &cfg.debug_delay_ms, "MS", "sleep MS after each generated token (testing aid)"},
    };
    cli_opt opts[64];
    int n = cli_add_model_opts(opts, 0, 64, &mo);
    n = cli_add_sampling_opts(opts, n, 64, &so);
    n = cli_add_plan_opts(opts, n, 64, &po);
    for (size_t i = 0; n >= 0 && i < sizeof own / sizeof own[0]; i++) {
        if (n >= 64) n = -1;
        else opts[n++] = own[i];
    }
    if (n < 0) {
        fprintf(stderr, "sluice serve: internal error: option table too small\n");
        return 1;
    }
    const cli_cmd cmd = {"serve", "[-m MODEL] [--host ADDR] [--port N] [options]",
                         "Serve a model over an OpenAI-compatible HTTP API.", SERVE_DETAILS,
                         opts, n, 0};
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (!cli_model_opts_check("serve", &mo) || !cli_sampling_opts_check("serve", &so)) return 2;
    if (cfg.port < 0 || cfg.port > 65535) {
        fprintf(stderr, "sluice serve: --port must lie in [0, 65535]\n");
        return 2;
    }
    if (cfg.max_tokens < 1 || cfg.queue < 0 || cfg.max_connections < 1 || cfg.timeout_s < 0 ||
        cfg.debug_delay_ms < 0 || max_body < 1) {
        fprintf(stderr, "sluice serve: --max-tokens, --max-connections and --max-body must be "
                        "positive; --queue, --timeout and --debug-delay-ms not negative\n");
        return 2;
    }
    if (strcmp(chat_format, "auto") == 0) cfg.chat_format = -1;
    else if (strcmp(chat_format, "chatml") == 0) cfg.chat_format = SLUICE_CHAT_CHATML;
    else if (strcmp(chat_format, "plain") == 0) cfg.chat_format = SLUICE_CHAT_NONE;
    else {
        fprintf(stderr, "sluice serve: --chat-format is auto, chatml or plain\n");
        return 2;
    }
    cfg.max_body = max_body;
    cfg.thinking = !no_thinking;
    cfg.session = cli_model_opts_session(&mo);
    cfg.sampling = so.sp;
    cfg.seed_fixed = so.seed != CLI_SEED_RANDOM;
    cfg.sampling.seed = cfg.seed_fixed ? so.seed : 0;

    /* the plan reserves KV for the server's one session: -c, or the session's default */
    sluice_model_params mp = {.n_ctx = mo.n_ctx, .n_batch = mo.n_batch};
    if (!cli_plan_params("serve", &po, &mp)) return 2;
    if (po.plan) return cli_print_plan("serve", mo.path, &mp, po.json);
    sluice_model *m = cli_load_model_params("serve", mo.path, &mp);
    if (!m) return 1;
    rc = server_run(m, &cfg);
    sluice_model_free(m);
    return rc;
}
