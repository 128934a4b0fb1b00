/* HTTP front of the server on libmicrohttpd: routing, request bodies, validation, responses,
 * streaming, disconnects, startup and shutdown.
 *
 * libmicrohttpd runs one internal polling thread. A request is read and checked there, then
 * queued for the engine worker; the connection is suspended until the worker has something to
 * send (the whole answer, or the next server-sent events). The worker resumes it. The rule that
 * keeps suspend/resume balanced: job.suspended is set, under server.lock, only right before
 * libmicrohttpd's suspend, and whoever clears it calls resume exactly once. */
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/internal.h"

void server_config_defaults(server_config *cfg) {
    *cfg = (server_config){
        .host = "127.0.0.1",
        .port = 8080,
        .sampling = sluice_sampler_defaults(),
        .max_tokens = 2048,
        .max_body = 2u << 20,
        .queue = 16,
        .max_connections = 128,
        .timeout_s = 60,
        .chat_format = -1,
        .thinking = true,
    };
}

typedef struct conn_ctx {
    int ep;
    strbuf body;
    bool too_large;
    uint64_t seen;
    job *j; /* our reference to the job */
} conn_ctx;

/* ---- suspended connections ------------------------------------------------------------- */

void job_wake_locked(job *j) {
    if (!j->suspended || !j->conn) return;
    struct MHD_Connection *c = j->conn;
    j->suspended = false;
    /* resume outside our lock: libmicrohttpd takes its own locks inside */
    pthread_mutex_unlock(&j->srv->lock);
    MHD_resume_connection(c);
    pthread_mutex_lock(&j->srv->lock);
}

bool job_client_gone_locked(const job *j) {
    if (!j->conn) return true;
    if (!j->suspended || j->fd < 0) return false;
    char c;
    ssize_t r = recv(j->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    /* 0: orderly close; an error other than "nothing to read": reset. Bytes waiting (a
     * pipelined request) mean the client is still there. */
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* ---- responses --------------------------------------------------------------------------- */

static enum MHD_Result send_body(server *srv, struct MHD_Connection *c, int ep, unsigned status,
                                 char *body, const char *type, const char *allow,
                                 bool retry_after) {
    if (!body) return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (retry_after) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    pthread_mutex_lock(&srv->lock);
    metrics_count_response(&srv->met, ep, status);
    pthread_mutex_unlock(&srv->lock);
    return ok;
}

static enum MHD_Result send_json(server *srv, struct MHD_Connection *c, int ep, unsigned status,
                                 char *body) {
    return send_body(srv, c, ep, status, body, "application/json", NULL, false);
}

static enum MHD_Result send_error(server *srv, struct MHD_Connection *c, int ep,
                                  const api_error *e, const char *allow) {
    return send_body(srv, c, ep, (unsigned)e->status, api_error_json(e), "application/json",
                     allow, e->status == 503);
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* ---- streaming --------------------------------------------------------------------------- */

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    server *srv = j->srv;
    pthread_mutex_lock(&srv->lock);
    ssize_t n;
    if (j->out_off < j->out.len) {
        size_t k = j->out.len - j->out_off;
        if (k > max) k = max;
        memcpy(buf, j->out.p + j->out_off, k);
        j->out_off += k;
        if (j->out_off == j->out.len) j->out.len = j->out_off = 0;
        n = (ssize_t)k;
    } else if (j->finished) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (!j->conn) {
        n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else {
        /* nothing yet: park the connection until the worker has more (returning 0 without
         * suspending would make libmicrohttpd spin) */
        j->suspended = true;
        MHD_suspend_connection(j->conn);
        n = 0;
    }
    pthread_mutex_unlock(&srv->lock);
    return n;
}

static void sse_free(void *cls) { job_release(cls); }

/* ---- generation requests ----------------------------------------------------------------- */

static int32_t *tokenize(server *srv, const char *text, size_t len, int *n_out) {
    int n = sluice_tokenize(srv->model, text, len, true, srv->info.add_bos, NULL, 0);
    if (n < 0) return NULL;
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids) return NULL;
    if (sluice_tokenize(srv->model, text, len, true, srv->info.add_bos, ids, n) != n) {
        free(ids);
        return NULL;
    }
    *n_out = n;
    return ids;
}

/* The prompt tokens of a parsed request; 0, or -1 with e set. */
static int prompt_tokens(server *srv, job *j, api_error *e) {
    gen_request *r = &j->req;
    const char *param = r->kind == API_CHAT ? "messages" : "prompt";
    if (r->prompt_ids) {
        j->prompt = malloc(((size_t)r->n_prompt_ids + 1) * sizeof *j->prompt);
        if (!j->prompt) goto oom;
        memcpy(j->prompt, r->prompt_ids, (size_t)r->n_prompt_ids * sizeof *j->prompt);
        j->n_prompt = r->n_prompt_ids;
    } else {
        strbuf text = {0};
        if (r->kind == API_CHAT) {
            if (!chat_render(&srv->tmpl, r->msgs, r->n_msgs, r->thinking, &text)) {
                sb_free(&text);
                goto oom;
            }
        } else if (!sb_append(&text, r->prompt, r->prompt_len)) {
            sb_free(&text);
            goto oom;
        }
        j->prompt = tokenize(srv, text.p, text.len, &j->n_prompt);
        sb_free(&text);
        if (!j->prompt) goto oom;
    }
    if (j->n_prompt == 0) {
        /* an empty prompt starts from BOS when the model has one, as `sluice run` does */
        if (srv->info.bos < 0) {
            api_set_error(e, 400, "invalid_request_error", param, NULL,
                          "the prompt is empty and the model has no BOS token to start from");
            return -1;
        }
        j->prompt[0] = srv->info.bos;
        j->n_prompt = 1;
    }
    if (j->n_prompt >= srv->n_ctx) {
        api_set_error(e, 400, "invalid_request_error", param, "context_length_exceeded",
                      "the prompt has %d tokens; the context holds %d (-c), which leaves no room "
                      "to generate",
                      j->n_prompt, srv->n_ctx);
        return -1;
    }
    return 0;
oom:
    api_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

static enum MHD_Result start_generation(server *srv, struct MHD_Connection *c, conn_ctx *cx) {
    api_error e;
    if (cx->too_large) {
        api_set_error(&e, 413, "invalid_request_error", NULL, "request_too_large",
                      "the request body exceeds %llu bytes (--max-body)",
                      (unsigned long long)srv->cfg->max_body);
        return send_error(srv, c, cx->ep, &e, NULL);
    }
    job *j = job_new(srv);
    if (!j) return MHD_NO;
    pthread_mutex_lock(&srv->lock);
    uint64_t seed = server_next_seed_locked(srv);
    pthread_mutex_unlock(&srv->lock);
    api_kind kind = cx->ep == EP_CHAT ? API_CHAT : API_COMPLETION;
    if (api_parse_request(kind, cx->body.p ? cx->body.p : "", cx->body.len, srv->cfg,
                          srv->info.n_vocab, seed, &j->req, &e) != 0 ||
        prompt_tokens(srv, j, &e) != 0) {
        job_release(j);
        return send_error(srv, c, cx->ep, &e, NULL);
    }
    sb_free(&cx->body);
    int limit = srv->cfg->max_tokens;
    j->max_tokens = j->req.max_tokens > 0 && j->req.max_tokens < limit ? j->req.max_tokens : limit;
    snprintf(j->id, sizeof j->id, "%s-%016llx", kind == API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)seed);
    j->created = (int64_t)time(NULL);
    j->t_arrival = srv_now();
    j->conn = c;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    cx->j = j;

    pthread_mutex_lock(&srv->lock);
    if (!engine_submit_locked(srv, j, &e)) {
        pthread_mutex_unlock(&srv->lock);
        cx->j = NULL;
        job_release(j);
        return send_error(srv, c, cx->ep, &e, NULL);
    }
    if (!j->req.stream) {
        /* wait for the whole answer; the worker resumes us */
        j->suspended = true;
        MHD_suspend_connection(c);
        pthread_mutex_unlock(&srv->lock);
        return MHD_YES;
    }
    /* the response's reference, dropped by sse_free when libmicrohttpd destroys it; what the
     * worker streams before the response is queued waits in j->out */
    j->refs++;
    pthread_mutex_unlock(&srv->lock);
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, j, sse_free);
    if (!r) {
        job_release(j);
        return MHD_NO; /* the completion callback cancels the job */
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    /* reverse proxies (nginx) would otherwise buffer the events */
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    pthread_mutex_lock(&srv->lock);
    metrics_count_response(&srv->met, cx->ep, MHD_HTTP_OK);
    pthread_mutex_unlock(&srv->lock);
    return ok;
}

/* Called again after the worker resumed a non-streamed request. */
static enum MHD_Result finish_generation(server *srv, struct MHD_Connection *c, conn_ctx *cx) {
    job *j = cx->j;
    pthread_mutex_lock(&srv->lock);
    bool done = j->finished;
    unsigned status = j->status;
    char *body = j->body;
    j->body = NULL;
    pthread_mutex_unlock(&srv->lock);
    if (!done) {
        /* cannot happen: only the finished worker resumes a non-streamed request */
        free(body);
        return MHD_NO;
    }
    if (!body) {
        /* cancelled: by shutdown (say so), or because the client left (499, nginx's "client
         * closed request", which only the metrics see) */
        pthread_mutex_lock(&srv->lock);
        bool stopping = srv->stopping;
        pthread_mutex_unlock(&srv->lock);
        api_error e;
        api_set_error(&e, stopping ? 503 : 499, "server_error", NULL, "request_cancelled",
                      "the request was cancelled");
        return send_error(srv, c, cx->ep, &e, NULL);
    }
    return send_json(srv, c, cx->ep, status, body);
}

/* ---- routing ----------------------------------------------------------------------------- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    server *srv = cls;
    conn_ctx *cx = *con_cls;
    api_error e;
    if (!cx) {
        /* headers are in: route, method and declared size are decided before any body */
        int ep = metrics_endpoint(url);
        if (ep == EP_OTHER) {
            api_set_error(&e, 404, "invalid_request_error", NULL, "not_found",
                          "Invalid URL (%.16s %.200s)", method, url);
            return send_error(srv, c, ep, &e, NULL);
        }
        bool gen = ep == EP_CHAT || ep == EP_COMPLETIONS;
        bool ok = gen ? strcmp(method, MHD_HTTP_METHOD_POST) == 0
                      : strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
                            strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
        if (!ok) {
            api_set_error(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                          "method %.16s is not allowed on %s (use %s)", method, url,
                          gen ? "POST" : "GET");
            return send_error(srv, c, ep, &e, gen ? "POST" : "GET, HEAD");
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            /* libmicrohttpd refuses a malformed length itself; an overflow is too large */
            if (errno == ERANGE || (end != cl && n > srv->cfg->max_body)) {
                api_set_error(&e, 413, "invalid_request_error", NULL, "request_too_large",
                              "the request body exceeds %llu bytes (--max-body)",
                              (unsigned long long)srv->cfg->max_body);
                return send_error(srv, c, ep, &e, NULL);
            }
        }
        cx = calloc(1, sizeof *cx);
        if (!cx) return MHD_NO;
        cx->ep = ep;
        *con_cls = cx;
        return MHD_YES;
    }
    if (cx->j) return finish_generation(srv, c, cx);
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        cx->seen += n;
        if (!cx->too_large && cx->body.len + n > srv->cfg->max_body) {
            /* a chunked body can only be refused once it has been read; keep reading (and
             * dropping) it, but not forever */
            cx->too_large = true;
            sb_free(&cx->body);
        }
        if (cx->too_large) return cx->seen > 4 * srv->cfg->max_body + (1u << 20) ? MHD_NO : MHD_YES;
        return sb_append(&cx->body, upload, n) ? MHD_YES : MHD_NO;
    }
    switch (cx->ep) {
    case EP_HEALTH: return send_json(srv, c, cx->ep, MHD_HTTP_OK, dup_str("{\"status\":\"ok\"}"));
    case EP_MODELS:
        return send_json(srv, c, cx->ep, MHD_HTTP_OK,
                         api_models_json(srv->model_id, srv->started, &srv->info, srv->n_ctx));
    case EP_METRICS:
        return send_body(srv, c, cx->ep, MHD_HTTP_OK, metrics_render(srv),
                         "text/plain; version=0.0.4; charset=utf-8", NULL, false);
    default: return start_generation(srv, c, cx);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)c;
    (void)toe;
    server *srv = cls;
    conn_ctx *cx = *con_cls;
    if (!cx) return;
    if (cx->j) {
        job *j = cx->j;
        pthread_mutex_lock(&srv->lock);
        /* the connection is over: never touch it again; an unfinished generation stops */
        if (!j->finished) j->cancelled = true;
        j->conn = NULL;
        j->suspended = false;
        job_release_locked(j);
        pthread_mutex_unlock(&srv->lock);
    }
    sb_free(&cx->body);
    free(cx);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    fputs("sluice serve: http: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* ---- startup and shutdown ---------------------------------------------------------------- */

static int resolve(const server_config *cfg, struct sockaddr_storage *ss, bool *v6) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int rc = getaddrinfo(cfg->host, port, &hints, &res);
    if (rc != 0 || !res) {
        fprintf(stderr, "sluice serve: cannot resolve --host '%s': %s\n", cfg->host,
                rc ? gai_strerror(rc) : "no address");
        return -1;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return 0;
}

int server_run(sluice_model *model, const server_config *cfg) {
    server *srv = calloc(1, sizeof *srv);
    if (!srv) return 1;
    srv->cfg = cfg;
    srv->model = model;
    srv->started = (int64_t)time(NULL);
    sluice_model_get_info(model, &srv->info);
    snprintf(srv->model_id, sizeof srv->model_id, "%s", cfg->model_id ? cfg->model_id : srv->info.name);
    chat_template_init(&srv->tmpl, model, cfg->chat_format);
    pthread_mutex_init(&srv->lock, NULL);
    pthread_cond_init(&srv->cond, NULL);

    /* signals: every thread started from here on inherits the blocked mask, and the main thread
     * collects SIGINT/SIGTERM with sigwait; a closed client socket must not kill us */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    struct MHD_Daemon *d = NULL;
    struct sockaddr_storage ss;
    bool v6 = false;
    if (resolve(cfg, &ss, &v6) != 0 || engine_start(srv) != 0) goto out;
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (v6) flags |= MHD_USE_IPv6;
    /* the logger comes first so that messages about the other options go through it */
    d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, srv,
                         MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                         MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned int)cfg->max_connections,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)cfg->timeout_s,
                         MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "sluice serve: cannot listen on %s port %d: %s\n", cfg->host, cfg->port,
                errno ? strerror(errno) : "libmicrohttpd refused the configuration");
        goto out;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : cfg->port;
    fprintf(stderr,
            "sluice serve: model '%s' (%s), chat format %s%s, thinking %s, context %d, "
            "queue %d\n",
            srv->model_id, srv->info.arch, chat_format_name(srv->tmpl.format),
            srv->tmpl.from_vocab ? " (from the vocabulary)" : "",
            think_style_name(srv->tmpl.think), srv->n_ctx, cfg->queue);
    fprintf(stderr, "sluice serve: listening on http://%s%s%s:%d\n", v6 ? "[" : "", cfg->host,
            v6 ? "]" : "", port);
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "sluice serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    /* stop accepting, finish or cancel every job (which resumes every suspended connection, as
     * MHD_stop_daemon requires), then close the connections */
    MHD_socket lfd = MHD_quiesce_daemon(d);
    engine_stop(srv);
    MHD_stop_daemon(d);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    d = NULL;
    rc = 0;
out:
    if (d) MHD_stop_daemon(d);
    engine_stop(srv);
    pthread_cond_destroy(&srv->cond);
    pthread_mutex_destroy(&srv->lock);
    free(srv);
    return rc;
}
