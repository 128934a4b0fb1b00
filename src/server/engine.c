/* The engine worker: one thread owns the session and runs queued jobs one at a time.
 *
 * A session is a single timeline, so requests are serialized; the model is shared and
 * read-only. Between requests the session keeps its KV cache and the list of tokens it has
 * evaluated: a prompt that starts with exactly those tokens (the next turn of the same
 * conversation) evaluates only its new tail, on any model. A prompt that shares only a prefix
 * (the previous answer re-tokenized differently, a stop sequence cut the answer, an edited last
 * turn) rolls the session back to that prefix with sluice_session_truncate; hybrid models, whose
 * recurrent state cannot be rolled back, refuse, and the session starts over. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/internal.h"

job *job_new(server *srv) {
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->srv = srv;
    j->refs = 1;
    j->fd = -1;
    return j;
}

static void job_free(job *j) {
    gen_request_free(&j->req);
    free(j->prompt);
    sb_free(&j->out);
    free(j->body);
    free(j);
}

void job_release_locked(job *j) {
    if (--j->refs == 0) job_free(j);
}

void job_release(job *j) {
    server *srv = j->srv;
    pthread_mutex_lock(&srv->lock);
    job_release_locked(j);
    pthread_mutex_unlock(&srv->lock);
}

uint64_t server_next_seed_locked(server *srv) {
    /* splitmix64 over a counter started from the clock: distinct per request, and request ids
     * derived from it do not repeat across restarts */
    uint64_t z = (uint64_t)srv->started * 0x9e3779b97f4a7c15ull + (++srv->n_ids) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

bool engine_submit_locked(server *srv, job *j, api_error *err) {
    if (srv->stopping) {
        api_set_error(err, 503, "server_error", NULL, "server_shutting_down",
                      "the server is shutting down");
        return false;
    }
    /* capacity: the running request plus --queue waiting ones */
    if (srv->n_queued + (srv->busy ? 1 : 0) >= srv->cfg->queue + 1) {
        srv->met.rejected++;
        api_set_error(err, 503, "server_error", NULL, "server_overloaded",
                      "the server is busy (%d requests queued); retry later", srv->n_queued);
        return false;
    }
    j->refs++;
    j->next = NULL;
    if (srv->tail) srv->tail->next = j;
    else srv->head = j;
    srv->tail = j;
    srv->n_queued++;
    pthread_cond_signal(&srv->cond);
    return true;
}

/* ---- output ------------------------------------------------------------------------------- */

static void stream_bytes_locked(job *j, const char *p, size_t n) {
    sb_append(&j->out, p, n);
    job_wake_locked(j);
}

/* "data: <json>\n\n"; a NULL json (out of memory) is dropped. */
static void stream_event(job *j, char *json) {
    if (!json) return;
    server *srv = j->srv;
    pthread_mutex_lock(&srv->lock);
    if (!j->cancelled) {
        sb_puts(&j->out, "data: ");
        sb_puts(&j->out, json);
        stream_bytes_locked(j, "\n\n", 2);
    }
    pthread_mutex_unlock(&srv->lock);
    free(json);
}

/* The answer of a non-streamed request (or the status of a streamed one). Delivered by
 * complete(), after the worker has recorded the request's metrics, so that a client reading
 * /metrics right after its answer sees them. */
static void settle(job *j, unsigned status, char *body) {
    server *srv = j->srv;
    pthread_mutex_lock(&srv->lock);
    j->status = status;
    free(j->body);
    j->body = body;
    pthread_mutex_unlock(&srv->lock);
}

static void complete(job *j, bool done_marker) {
    server *srv = j->srv;
    pthread_mutex_lock(&srv->lock);
    if (done_marker && !j->cancelled) sb_puts(&j->out, "data: [DONE]\n\n");
    j->finished = true;
    job_wake_locked(j);
    pthread_mutex_unlock(&srv->lock);
}

static void fail_job(job *j, int status, const char *type, const char *code, const char *msg) {
    api_error e;
    api_set_error(&e, status, type, NULL, code, "%s", msg);
    char *json = api_error_json(&e);
    if (j->req.stream) {
        /* the 200 and the headers are gone already; the OpenAI clients raise an error for an
         * event that carries an "error" object */
        stream_event(j, json);
        settle(j, (unsigned)status, NULL);
    } else {
        settle(j, (unsigned)status, json);
    }
}

/* Should generation stop: client gone (libmicrohttpd told us, or the socket says so while the
 * connection is suspended), or the server stops. */
static bool should_stop(job *j) {
    server *srv = j->srv;
    pthread_mutex_lock(&srv->lock);
    if (!j->cancelled && (srv->stopping || job_client_gone_locked(j))) j->cancelled = true;
    bool stop = j->cancelled;
    pthread_mutex_unlock(&srv->lock);
    return stop;
}

/* ---- one request -------------------------------------------------------------------------- */

typedef struct run_stats {
    int reused, evaluated, generated;
    double t_start, t_prompt, t_first, t_end;
    bool cancelled, ok;
    const char *finish;
} run_stats;

static bool hist_push(server *srv, const int32_t *t, int n) {
    if (srv->n_hist + n > srv->n_ctx) return false;
    memcpy(srv->hist + srv->n_hist, t, (size_t)n * sizeof *t);
    srv->n_hist += n;
    return true;
}

/* After a failed evaluation the cache may hold part of a batch: start the next request afresh. */
static void forget_history(server *srv) {
    sluice_session_reset(srv->session);
    srv->n_hist = 0;
}

/* Bring the session to the end of j's prompt. */
static bool eval_prompt(server *srv, job *j, run_stats *st) {
    sluice_session *s = srv->session;
    int lcp = 0, lim = srv->n_hist < j->n_prompt ? srv->n_hist : j->n_prompt;
    while (lcp < lim && srv->hist[lcp] == j->prompt[lcp]) lcp++;
    int common;
    if (lcp == srv->n_hist && (lcp < j->n_prompt || sluice_session_logits(s))) {
        /* the prompt extends everything evaluated (an identical prompt also needs the last
         * logits, which are still there): any model can continue */
        common = lcp;
    } else {
        /* roll back to the shared prefix, keeping one prompt token to evaluate for fresh
         * logits; models with recurrent state refuse and start over */
        int want = lcp < j->n_prompt ? lcp : j->n_prompt - 1;
        if (want > 0 && sluice_session_truncate(s, want) == 0) {
            common = want;
        } else {
            sluice_session_reset(s);
            common = 0;
        }
        srv->n_hist = common;
    }
    st->reused = common;
    /* one n_batch chunk per call, so that a disconnect is noticed between chunks */
    for (int at = common; at < j->n_prompt;) {
        int k = j->n_prompt - at < srv->n_batch ? j->n_prompt - at : srv->n_batch;
        if (sluice_session_eval(srv->session, j->prompt + at, k, NULL) != 0) {
            fail_job(j, 500, "server_error", NULL, sluice_last_error());
            forget_history(srv);
            return false;
        }
        hist_push(srv, j->prompt + at, k);
        at += k;
        st->evaluated += k;
        if (at < j->n_prompt && should_stop(j)) {
            st->cancelled = true;
            return false;
        }
    }
    return true;
}

static void deliver(job *j, strbuf *delta, strbuf *content) {
    if (!delta->len) return;
    if (j->req.stream) {
        api_meta m = {j->req.kind, j->id, j->created, j->srv->model_id};
        stream_event(j, api_chunk_json(&m, delta->p, delta->len, false, NULL, j->req.include_usage));
    } else {
        sb_append(content, delta->p, delta->len);
    }
    delta->len = 0;
}

static void run_job(server *srv, job *j, run_stats *st) {
    sluice_session *s = srv->session;
    api_meta meta = {j->req.kind, j->id, j->created, srv->model_id};
    st->t_start = srv_now();
    if (should_stop(j)) {
        st->cancelled = true;
        return;
    }
    if (j->req.stream && j->req.kind == API_CHAT)
        stream_event(j, api_chunk_json(&meta, "", 0, true, NULL, j->req.include_usage));
    if (!eval_prompt(srv, j, st)) return;
    st->t_prompt = srv_now();

    sluice_session_set_sampler(s, &j->req.sp);
    int rl = j->req.sp.repeat_last_n;
    for (int i = j->n_prompt > rl ? j->n_prompt - rl : 0; i < j->n_prompt; i++)
        sluice_session_accept(s, j->prompt[i]);

    textstream ts;
    ts_init(&ts, (const char *const *)j->req.stop, j->req.stop_len, j->req.n_stop);
    strbuf delta = {0}, content = {0};
    char small[256];
    const char *finish = NULL;
    bool failed = false;
    while (!finish) {
        int32_t tok = sluice_session_sample(s);
        if (tok < 0) {
            fail_job(j, 500, "server_error", NULL, sluice_last_error());
            failed = true;
            break;
        }
        if (st->generated == 0) {
            st->t_first = srv_now();
            pthread_mutex_lock(&srv->lock);
            metrics_observe_ttft(&srv->met, st->t_first - j->t_arrival);
            pthread_mutex_unlock(&srv->lock);
        }
        if (!j->req.ignore_eos && sluice_token_is_eog(srv->model, tok)) {
            finish = "stop";
            break;
        }
        st->generated++;
        int k = sluice_token_to_piece(srv->model, tok, false, small, (int)sizeof small);
        char *piece = small;
        if (k > (int)sizeof small) {
            piece = malloc((size_t)k);
            if (piece) sluice_token_to_piece(srv->model, tok, false, piece, k);
            else k = 0;
        }
        ts_push(&ts, piece, (size_t)k, &delta);
        if (piece != small) free(piece);
        deliver(j, &delta, &content);
        if (ts.stopped) finish = "stop";
        else if (st->generated >= j->max_tokens || srv->n_hist >= srv->n_ctx) finish = "length";
        if (finish) break;
        /* the token joins the context only when another one will follow it */
        if (sluice_session_eval(s, &tok, 1, NULL) != 0) {
            fail_job(j, 500, "server_error", NULL, sluice_last_error());
            forget_history(srv);
            failed = true;
            break;
        }
        hist_push(srv, &tok, 1);
        if (srv->cfg->debug_delay_ms > 0) {
            struct timespec d = {srv->cfg->debug_delay_ms / 1000,
                                 (long)(srv->cfg->debug_delay_ms % 1000) * 1000000L};
            while (nanosleep(&d, &d) != 0 && errno == EINTR) {
            }
        }
        if (should_stop(j)) {
            st->cancelled = true;
            break;
        }
    }
    st->t_end = srv_now();
    if (!st->t_first) st->t_first = st->t_end;
    if (finish) {
        st->ok = true;
        st->finish = finish;
        ts_finish(&ts, &delta);
        deliver(j, &delta, &content);
        if (j->req.stream) {
            stream_event(j, api_chunk_json(&meta, "", 0, false, finish, j->req.include_usage));
            if (j->req.include_usage)
                stream_event(j, api_usage_chunk_json(&meta, j->n_prompt, st->generated));
            settle(j, 200, NULL); /* "data: [DONE]" follows in complete() */
        } else {
            char *body = api_response_json(&meta, content.p ? content.p : "", content.len, finish,
                                           j->n_prompt, st->generated);
            if (body) settle(j, 200, body);
            else fail_job(j, 500, "server_error", NULL, "out of memory");
        }
    } else if (!failed && !st->cancelled) {
        fail_job(j, 500, "server_error", NULL, "generation stopped unexpectedly");
    }
    ts_free(&ts);
    sb_free(&delta);
    sb_free(&content);
}

static void record(server *srv, job *j, const run_stats *st) {
    double tp = st->t_prompt > st->t_start ? st->t_prompt - st->t_start : 0;
    double tg = st->t_end > st->t_prompt && st->t_prompt > 0 ? st->t_end - st->t_prompt : 0;
    pthread_mutex_lock(&srv->lock);
    metrics *mt = &srv->met;
    if (st->cancelled) mt->cancelled++;
    if (st->ok) mt->completed++;
    mt->prompt_tokens += (uint64_t)j->n_prompt;
    mt->prompt_evaluated += (uint64_t)st->evaluated;
    mt->prompt_reused += (uint64_t)st->reused;
    mt->completion_tokens += (uint64_t)st->generated;
    mt->prompt_seconds += tp;
    mt->generation_seconds += tg;
    if (tp > 0 && st->evaluated) mt->last_prompt_tps = st->evaluated / tp;
    if (tg > 0 && st->generated) mt->last_generation_tps = st->generated / tg;
    mt->kv_tokens = srv->n_hist;
    /* the worker is the only thread running the model, so the store's counters are stable
     * here; /metrics reads this copy */
    sluice_model_expert_stats(srv->model, &mt->experts);
    pthread_mutex_unlock(&srv->lock);
    if (!srv->cfg->quiet)
        fprintf(stderr,
                "sluice serve: %s %s: prompt %d tokens (%d reused), %d generated, %s, "
                "ttft %.3f s, %.1f tokens/s\n",
                j->req.kind == API_CHAT ? "chat" : "completion", j->id, j->n_prompt, st->reused,
                st->generated, st->cancelled ? "cancelled" : st->finish ? st->finish : "error",
                st->t_first > 0 ? st->t_first - j->t_arrival : 0.0,
                tg > 0 ? st->generated / tg : 0.0);
}

static void *worker_main(void *arg) {
    server *srv = arg;
    pthread_mutex_lock(&srv->lock);
    for (;;) {
        while (!srv->head && !srv->stopping) pthread_cond_wait(&srv->cond, &srv->lock);
        if (srv->stopping) break;
        job *j = srv->head;
        srv->head = j->next;
        if (!srv->head) srv->tail = NULL;
        srv->n_queued--;
        srv->busy = true;
        pthread_mutex_unlock(&srv->lock);

        run_stats st = {0};
        run_job(srv, j, &st);
        if (st.cancelled) settle(j, 499, NULL);
        record(srv, j, &st);
        complete(j, j->req.stream && st.ok);

        pthread_mutex_lock(&srv->lock);
        srv->busy = false;
        job_release_locked(j);
    }
    /* stopping: whoever still waits gets a 503 (or, streaming, an error event) */
    while (srv->head) {
        job *j = srv->head;
        srv->head = j->next;
        srv->n_queued--;
        pthread_mutex_unlock(&srv->lock);
        fail_job(j, 503, "server_error", "server_shutting_down", "the server is shutting down");
        complete(j, false);
        pthread_mutex_lock(&srv->lock);
        job_release_locked(j);
    }
    srv->tail = NULL;
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

int engine_start(server *srv) {
    sluice_session_params sp = srv->cfg->session;
    srv->session = sluice_session_new(srv->model, &sp);
    if (!srv->session) {
        fprintf(stderr, "sluice serve: %s\n", sluice_last_error());
        return -1;
    }
    srv->n_ctx = sluice_session_n_ctx(srv->session);
    srv->n_batch = sp.n_batch > 0 ? sp.n_batch : 512;
    if (srv->n_batch > srv->n_ctx) srv->n_batch = srv->n_ctx;
    srv->hist = malloc((size_t)srv->n_ctx * sizeof *srv->hist);
    if (!srv->hist) {
        fprintf(stderr, "sluice serve: out of memory\n");
        return -1;
    }
    if (pthread_create(&srv->worker, NULL, worker_main, srv) != 0) {
        fprintf(stderr, "sluice serve: cannot start the engine thread\n");
        return -1;
    }
    srv->worker_started = true;
    return 0;
}

void engine_stop(server *srv) {
    pthread_mutex_lock(&srv->lock);
    srv->stopping = true;
    pthread_cond_broadcast(&srv->cond);
    pthread_mutex_unlock(&srv->lock);
    if (srv->worker_started) pthread_join(srv->worker, NULL);
    srv->worker_started = false;
    sluice_session_free(srv->session);
    srv->session = NULL;
    free(srv->hist);
    srv->hist = NULL;
}
