/* The OpenAI-compatible HTTP server behind `sluice serve` (docs/server.md).
 *
 * One engine worker thread owns the only session and serves a bounded queue of requests; the
 * HTTP side (libmicrohttpd, one polling thread) parses and validates requests, renders the chat
 * template and tokenizes, then hands a job to the worker. */
#ifndef SLUICE_SERVER_H
#define SLUICE_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "sluice.h"

typedef struct server_config {
    const char *host;       /* address or name to bind */
    int port;               /* 0: an ephemeral port (the log line names it) */
    const char *model_id;   /* the id /v1/models reports; NULL: general.name */
    sluice_session_params session;
    sluice_sampler_params sampling; /* defaults for fields a request leaves out */
    bool seed_fixed;        /* requests without a seed use sampling.seed, else a fresh one */
    int max_tokens;         /* ceiling on generated tokens per request */
    uint64_t max_body;      /* bytes of request body */
    int queue;              /* requests that may wait behind the running one */
    int max_connections;
    int timeout_s;          /* idle connection timeout */
    int chat_format;        /* -1: the model's (sluice_model_chat_format), else a format */
    bool thinking;          /* enable_thinking for requests that do not say */
    int debug_delay_ms;     /* sleep after each generated token (tests of cancellation) */
    bool quiet;             /* no per-request log lines */
} server_config;

void server_config_defaults(server_config *cfg);

/* Serve until SIGINT or SIGTERM. Returns 0 after a clean shutdown, 1 when the server could not
 * start (reported on stderr). The model stays owned by the caller. */
int server_run(sluice_model *model, const server_config *cfg);

#endif
