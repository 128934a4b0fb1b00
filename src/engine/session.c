/* sluice_session: one timeline over a model: position, KV cache and state, sampler, backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/error.h"
#include "engine/sampler.h"
#include "engine/session_internal.h"
#include "models/state.h"
#include "runtime/watchdog.h"

#define DEFAULT_CTX_CAP 4096
#define DEFAULT_BATCH 512

struct sluice_session {
    const sluice_model *m;
    model_state *st;
    backend *be;
    sampler *smp;
    int n_ctx, n_batch, pos;
    float *last_logits;
    bool have_logits;
    /* the greedy pick of last_logits where the device computed it with the step (argmax_row):
     * page-locked, written by the step's own download; have_argmax: it is last_logits' */
    int32_t *argmax_h;
    bool have_argmax;
    session_spec spec; /* speculative decoding (engine/speculative.c) */
};

sluice_session *sluice_session_new(const sluice_model *m, const sluice_session_params *params) {
    sluice_session_params p = params ? *params : (sluice_session_params){0};
    if (p.n_ctx < 0 || p.n_batch < 0 || p.n_threads < 0) {
        sluice_set_error("session: negative context, batch or thread count");
        return NULL;
    }
    if (p.n_ctx == 0)
        p.n_ctx = m->hp.n_ctx_train < DEFAULT_CTX_CAP ? m->hp.n_ctx_train : DEFAULT_CTX_CAP;
    if (p.n_ctx > m->hp.n_ctx_train) {
        sluice_set_error("context %d exceeds the model's trained length %d", p.n_ctx,
                         m->hp.n_ctx_train);
        return NULL;
    }
    if (p.n_batch == 0) p.n_batch = m->plan.n_batch > 0 ? m->plan.n_batch : DEFAULT_BATCH; /* the plan's */
    if (p.n_batch > p.n_ctx) p.n_batch = p.n_ctx;
    if (m->hp.n_expert > 0 && !m->experts) {
        sluice_set_error("the model was loaded for planning only");
        return NULL;
    }
    if (p.n_ctx > m->plan.n_ctx || p.n_batch > m->plan.n_batch) {
        /* more than the plan reserved: still within the budget with the cache already sized? */
        plan_request r = m->request;
        r.n_ctx = p.n_ctx > m->plan.n_ctx ? p.n_ctx : m->plan.n_ctx;
        r.n_batch = p.n_batch > m->plan.n_batch ? p.n_batch : m->plan.n_batch;
        if (m->plan.mode == SLUICE_MODE_STREAM) r.cache_slots = m->plan.cache_slots;
        plan np;
        plan_compute(&m->facts, &m->machine, &r, &np);
        if (m->gpu) { /* the device's plan, with the cache already sized */
            if (m->plan.gpu_mode == SLUICE_MODE_STREAM) r.cache_slots = m->plan.gpu_slots;
            plan_compute_gpu(&m->facts, &m->machine, &r, &np);
            np.ok = np.gpu_ok && np.gpu_mode == m->plan.gpu_mode;
            np.mode = m->plan.mode;
            if (!np.gpu_ok) snprintf(np.message, sizeof np.message, "%s", np.gpu_message);
        }
        if (!np.ok || np.mode != m->plan.mode) {
            sluice_set_error("a session of %d positions (batch %d) does not fit the memory plan "
                             "made for %d (batch %d): %s; load the model with a larger context",
                             p.n_ctx, p.n_batch, m->plan.n_ctx, m->plan.n_batch, np.message);
            return NULL;
        }
    }
    sluice_session *s = calloc(1, sizeof *s);
    if (!s) {
        sluice_set_error("out of memory");
        return NULL;
    }
    s->m = m;
    s->n_ctx = p.n_ctx;
    s->n_batch = p.n_batch;
    sluice_sampler_params sp = sluice_sampler_defaults();
    /* a device backend belongs to the model (it holds the weights); sessions borrow it */
    s->be = m->gpu ? m->gpu : backend_cpu_new(p.n_threads);
    s->st = s->be ? m->arch->state_new(m, s->be, s->n_ctx, s->n_batch) : NULL;
    s->smp = sampler_new(m->hp.n_vocab, &sp);
    /* where a decode step's logits land: the backend's own host memory, so a device writes
     * them straight there */
    s->last_logits = s->be ? be_host_alloc(s->be, (size_t)m->hp.n_vocab * sizeof(float)) : NULL;
    if (s->be && s->st && s->be->ops->argmax_row) {
        s->argmax_h = be_host_alloc(s->be, sizeof(int32_t));
        s->st->argmax_host = s->argmax_h;
    }
    if (!s->st || !s->be || !s->smp || !s->last_logits || (s->be->ops->argmax_row && !s->argmax_h)) {
        sluice_set_error("out of memory for a session of %d positions", s->n_ctx);
        sluice_session_free(s);
        return NULL;
    }
    return s;
}

/* The graph key of the session's decode step: the session, and whether the step downloads
 * its routing (a graph captured without the download must not serve a step that needs it);
 * sessions are malloc-aligned, so the low bit is free. */
static uint64_t decode_graph_key(const sluice_session *s, bool routes) {
    return (uint64_t)(uintptr_t)s | (routes ? 1u : 0u);
}

void sluice_session_free(sluice_session *s) {
    if (!s) return;
    if (s->be && s->be->ops->graph_drop) {
        s->be->ops->graph_drop(s->be, decode_graph_key(s, false));
        s->be->ops->graph_drop(s->be, decode_graph_key(s, true));
    }
    if (s->st) s->m->arch->state_free(s->st);
    if (s->be) be_host_free(s->be, s->last_logits);
    if (s->be && s->argmax_h) be_host_free(s->be, s->argmax_h);
    if (s->be != s->m->gpu) be_free(s->be);
    sampler_free(s->smp);
    free(s->spec.logits);
    free(s);
}

/* The model's pass, ending with the download of its routing when someone wants it. */
static int forward_pass(sluice_session *s, const int32_t *tokens, int n, float *out, bool all_logits) {
    const sluice_model *m = s->m;
    int rc = m->arch->forward(m, s->st, s->be, tokens, n, s->pos, out, all_logits);
    if (rc == 0 && m->experts) rc = moe_step_collect(m, s->st, n);
    return rc;
}

/* One forward pass. A decode step (one token, last logits only) on a backend with CUDA graphs
 * replays the graph captured for it, or captures it: the pass must then need nothing from the
 * host (moe_host_free), since a replay does not run the model code. */

static int forward_chunk(sluice_session *s, const int32_t *tokens, int n, float *out,
                         bool all_logits) {
    const sluice_model *m = s->m;
    backend *be = s->be;
    const bool graph = be->ops->graph_replay && !m->params.no_graph && n == 1 && out &&
                       !all_logits && moe_host_free(m, s->st, be);
    int rc;
    if (graph) {
        const uint64_t key = decode_graph_key(s, m->experts && moe_step_collects(m, s->st, n));
        if (be->ops->graph_replay(be, key, tokens, n, s->pos)) {
            rc = 0;
        } else {
            be->ops->capture_begin(be, key);
            rc = forward_pass(s, tokens, n, out, all_logits);
            const int ce = be->ops->capture_end(be, rc == 0);
            if (ce == 1) /* only recorded, and not capturable: run it for real */
                rc = forward_pass(s, tokens, n, out, all_logits);
            else if (ce != 0)
                rc = -1;
        }
    } else {
        rc = forward_pass(s, tokens, n, out, all_logits);
    }
    if (rc == 0 && m->experts) rc = moe_step_end(m, s->st, n, s->pos);
    return rc;
}

int sluice_session_eval(sluice_session *s, const int32_t *tokens, int n, float *all_logits) {
    const int n_vocab = s->m->hp.n_vocab;
    if (n <= 0) {
        sluice_set_error("eval: no tokens");
        return -1;
    }
    if (n > s->n_ctx - s->pos) {
        sluice_set_error("eval: %d tokens at position %d exceed the context of %d", n, s->pos,
                         s->n_ctx);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            sluice_set_error("eval: token id %d at index %d is outside the vocabulary (0..%d)",
                             tokens[i], i, n_vocab - 1);
            return -1;
        }
    s->have_argmax = false;
    /* reads that depend only on token ids start now for the whole prompt, not chunk by chunk */
    if (n > s->n_batch && s->m->arch->prefetch) s->m->arch->prefetch(s->m, s->st, tokens, n);
    for (int done = 0; done < n;) {
        char why[256];
        if (watchdog_tripped(why, sizeof why)) {
            sluice_set_error("stopped by the memory watchdog: %s", why);
            s->have_logits = false;
            return -1;
        }
        int chunk = n - done < s->n_batch ? n - done : s->n_batch;
        bool last = done + chunk == n;
        float *out = all_logits ? all_logits + (size_t)done * n_vocab : s->last_logits;
        /* a chunk before the last needs no logits unless all are wanted */
        if (!all_logits && !last) out = NULL;
        if (forward_chunk(s, tokens + done, chunk, out, all_logits != NULL) != 0) {
            s->have_logits = false;
            return -1;
        }
        s->pos += chunk;
        done += chunk;
    }
    if (all_logits)
        memcpy(s->last_logits, all_logits + (size_t)(n - 1) * n_vocab,
               (size_t)n_vocab * sizeof(float));
    s->have_logits = true;
    /* the last chunk's one output row went through the model's output head with argmax_host
     * set (model_output_logits), in a replayed graph as in the pass it was captured from */
    s->have_argmax = s->argmax_h && !all_logits;
    return 0;
}

int32_t sluice_session_argmax(const sluice_session *s) {
    if (!s->have_logits) return -1;
    return s->have_argmax ? *s->argmax_h : sluice_argmax(s->last_logits, s->m->hp.n_vocab);
}

const float *sluice_session_logits(const sluice_session *s) {
    return s->have_logits ? s->last_logits : NULL;
}

int sluice_session_pos(const sluice_session *s) { return s->pos; }
int sluice_session_n_ctx(const sluice_session *s) { return s->n_ctx; }

void sluice_session_reset(sluice_session *s) {
    s->pos = 0;
    s->have_logits = s->have_argmax = false;
    s->m->arch->state_reset(s->st);
    sampler_reset(s->smp);
}

int sluice_session_truncate(sluice_session *s, int n) {
    if (n < 0 || n > s->pos) {
        sluice_set_error("truncate: %d is outside the evaluated positions 0..%d", n, s->pos);
        return -1;
    }
    if (n == s->pos) return 0;
    if (n == 0) {
        sluice_session_reset(s);
        return 0;
    }
    /* attention reads the cache below the current position only, so moving the position back
     * is the whole rollback; a recurrent state has folded every token in and cannot */
    if (s->m->arch->recurrent_bytes && s->m->arch->recurrent_bytes(s->m) > 0) {
        sluice_set_error("truncate: the model's recurrent state cannot be rolled back");
        return -1;
    }
    s->pos = n;
    s->have_logits = s->have_argmax = false;
    return 0;
}

/* ---- internal (engine/session_internal.h) ---- */

const sluice_model *session_model(const sluice_session *s) { return s->m; }
model_state *session_model_state(sluice_session *s) { return s->st; }
backend *session_backend(sluice_session *s) { return s->be; }
int session_batch(const sluice_session *s) { return s->n_batch; }
session_spec *session_spec_of(sluice_session *s) { return &s->spec; }

void session_set_position(sluice_session *s, int pos, const float *logits) {
    s->pos = pos;
    s->have_logits = logits != NULL;
    s->have_argmax = false;
    if (logits && logits != s->last_logits)
        memcpy(s->last_logits, logits, (size_t)s->m->hp.n_vocab * sizeof(float));
}

uint64_t sluice_session_state_bytes(const sluice_session *s) {
    return s->m->arch->state_bytes(s->m, s->n_ctx);
}

void sluice_session_state_breakdown(const sluice_session *s, uint64_t *kv_bytes,
                                    uint64_t *recurrent_bytes) {
    const uint64_t all = sluice_session_state_bytes(s);
    const uint64_t rec = s->m->arch->recurrent_bytes ? s->m->arch->recurrent_bytes(s->m) : 0;
    if (kv_bytes) *kv_bytes = all - rec;
    if (recurrent_bytes) *recurrent_bytes = rec;
}

void sluice_session_set_sampler(sluice_session *s, const sluice_sampler_params *p) {
    sampler_set(s->smp, p);
}

int32_t sluice_session_sample(sluice_session *s) {
    if (!s->have_logits) {
        sluice_set_error("sample: no logits (evaluate a token first)");
        return -1;
    }
    int32_t id = s->have_argmax && sampler_is_argmax(s->smp) ? *s->argmax_h : sampler_sample(s->smp, s->last_logits);
    sampler_accept(s->smp, id);
    return id;
}

void sluice_session_accept(sluice_session *s, int32_t id) { sampler_accept(s->smp, id); }

void sluice_session_set_route_callback(sluice_session *s, sluice_route_fn fn, void *ctx) {
    s->st->route_fn = fn;
    s->st->route_ctx = ctx;
}
