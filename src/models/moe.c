/* Routed mixture of experts (qwen3moe, qwen35moe, qwen3next):
 *
 *   p = softmax(W_router · x)            over all experts, float, sum in double (as ggml)
 *   top-k experts by p, weights p_k       renormalized over the k (clamped sum) when norm_topk
 *   y = sum_k w_k · down_k(silu(gate_k x) * up_k x)     summed in slot order
 *   y += sigmoid(g · x) · shared(x)       when the layer has a shared expert (SwiGLU as above)
 *
 * Tokens are grouped by expert: each expert is acquired from the expert store once per batch
 * and multiplied as a small matrix over the tokens routed to it. Every token's result is
 * computed the same way whatever the grouping, so batch composition never changes bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/error.h"
#include "models/state.h"
#include "runtime/watchdog.h"

/* Per-state buffers for streaming, allocated on first use. */
struct moe_scratch {
    int n_batch;
    int32_t *need;   /* unique experts of the batch, in first-use order [n_expert] */
    uint8_t *mark;   /* [n_expert] */
    float *look_x;   /* lookahead: normed residual [n_batch][n_embd] */
    float *look_r;   /* lookahead: router logits [n_batch][n_expert] */
    int32_t *pred;   /* predicted experts of pred_layer [n_expert] */
    int n_pred, pred_layer;
};

void moe_state_release(model_state *st) {
    struct moe_scratch *x = st->moe_extra;
    if (!x) return;
    free(x->need);
    free(x->mark);
    free(x->look_x);
    free(x->look_r);
    free(x->pred);
    free(x);
    st->moe_extra = NULL;
}

static struct moe_scratch *scratch_of(const sluice_model *m, model_state *st) {
    if (st->moe_extra) return st->moe_extra;
    const hparams *hp = &m->hp;
    struct moe_scratch *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    const size_t B = (size_t)st->n_batch, X = (size_t)hp->n_expert;
    x->n_batch = st->n_batch;
    x->need = malloc(X * sizeof *x->need);
    x->mark = calloc(X, 1);
    x->look_x = state_alloc(B * (size_t)hp->n_embd * sizeof(float));
    x->look_r = state_alloc(B * X * sizeof(float));
    x->pred = malloc(X * sizeof *x->pred);
    x->pred_layer = -1;
    st->moe_extra = x;
    if (!x->need || !x->mark || !x->look_x || !x->look_r || !x->pred) {
        moe_state_release(st);
        return NULL;
    }
    return x;
}

/* Router lookahead: apply the next MoE layer's norm and router to the residual stream as it is
 * now (after this layer's attention) and start reading the experts it would choose, so they
 * arrive while this layer's experts are multiplied. Only timing depends on it. */
static void lookahead(const sluice_model *m, model_state *st, backend *be, int il, int n,
                      struct moe_scratch *x) {
    const hparams *hp = &m->hp;
    int next = il + 1;
    if (next >= hp->n_layer || !m->layers[next].ffn_gate_inp.data ||
        !m->layout.layers[next].present)
        return;
    const layer_weights *N = &m->layers[next];
    be_rmsnorm(be, st->x, &N->ffn_norm, n, hp->n_embd, hp->rms_eps, x->look_x);
    be_matmul(be, &N->ffn_gate_inp, x->look_x, n, x->look_r);
    memset(x->mark, 0, (size_t)hp->n_expert);
    x->n_pred = 0;
    for (int t = 0; t < n; t++) {
        const float *r = x->look_r + (size_t)t * hp->n_expert;
        for (int s = 0; s < hp->n_expert_used; s++) { /* top-k by logit (softmax keeps order) */
            int best = -1;
            for (int e = 0; e < hp->n_expert; e++)
                if (!(x->mark[e] & 2) && (best < 0 || r[e] > r[best])) best = e;
            x->mark[best] |= 2;
            if (!(x->mark[best] & 1)) {
                x->mark[best] |= 1;
                x->pred[x->n_pred++] = best;
            }
        }
        for (int e = 0; e < hp->n_expert; e++) x->mark[e] &= 1;
    }
    memset(x->mark, 0, (size_t)hp->n_expert);
    x->pred_layer = next;
    expert_prefetch(m->experts, next, x->pred, x->n_pred, false);
}

/* ggml clamps the top-k weight sum from below before dividing */
#define MOE_MIN_WEIGHT_SUM 6.103515625e-5f

static void route_token(const hparams *hp, float *p, int32_t *ids, float *w) {
    const int ne = hp->n_expert, k = hp->n_expert_used;
    float mx = -INFINITY;
    for (int e = 0; e < ne; e++) mx = p[e] > mx ? p[e] : mx;
    double sum = 0.0;
    for (int e = 0; e < ne; e++) {
        p[e] = expf(p[e] - mx);
        sum += p[e];
    }
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < ne; e++) p[e] *= inv;
    /* top-k by descending probability; ties keep the lower expert id first */
    for (int s = 0; s < k; s++) {
        int best = -1;
        for (int e = 0; e < ne; e++) {
            bool taken = false;
            for (int j = 0; j < s; j++) taken |= ids[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        ids[s] = best;
        w[s] = p[best];
    }
    if (hp->norm_topk) {
        double ws = 0.0;
        for (int s = 0; s < k; s++) ws += w[s];
        float wsum = (float)ws;
        if (wsum < MOE_MIN_WEIGHT_SUM) wsum = MOE_MIN_WEIGHT_SUM;
        for (int s = 0; s < k; s++) w[s] /= wsum;
    }
}

int moe_forward(const sluice_model *m, model_state *st, backend *be, int il, const float *x,
                int n, float *out) {
    const hparams *hp = &m->hp;
    const layer_weights *L = &m->layers[il];
    const int k = hp->n_expert_used, E = hp->n_embd;

    be_matmul(be, &L->ffn_gate_inp, x, n, st->router);
    for (int t = 0; t < n; t++) {
        route_token(hp, st->router + (size_t)t * hp->n_expert, st->moe_ids + (size_t)t * k,
                    st->moe_w + (size_t)t * k);
        if (st->route_fn)
            st->route_fn(st->route_ctx, il, st->pos[t], k, st->moe_ids + (size_t)t * k,
                         st->moe_w + (size_t)t * k);
    }

    char why[256];
    if (watchdog_tripped(why, sizeof why)) { /* a long prefill stops within one layer */
        sluice_set_error("stopped by the memory watchdog: %s", why);
        return -1;
    }
    /* the experts this batch needs, in first-use order */
    struct moe_scratch *xs = scratch_of(m, st);
    if (!xs) return -1;
    int n_need = 0;
    for (int i = 0; i < n * k; i++) {
        int32_t e = st->moe_ids[i];
        if (!xs->mark[e]) {
            xs->mark[e] = 1;
            xs->need[n_need++] = e;
        }
    }
    if (xs->pred_layer == il) { /* how good was the lookahead for this layer? */
        int correct = 0;
        for (int i = 0; i < xs->n_pred; i++) correct += xs->mark[xs->pred[i]];
        m->experts->stats.prefetch_issued += (uint64_t)xs->n_pred;
        m->experts->stats.prefetch_used += (uint64_t)correct;
        xs->pred_layer = -1;
    }
    memset(xs->mark, 0, (size_t)hp->n_expert);
    if (m->experts->streaming) {
        expert_prefetch(m->experts, il, xs->need, n_need, true);
        if (!m->params.no_prefetch) lookahead(m, st, be, il, n, xs);
    }

    /* the shared expert first: its multiplications overlap the routed experts' reads */
    const bool shared = L->ffn_up_shexp.data != NULL;
    if (shared) {
        be_matmul_swiglu(be, &L->ffn_gate_shexp, &L->ffn_up_shexp, x, n, st->ff_a);
        be_matmul(be, &L->ffn_down_shexp, st->ff_a, n, st->shexp_out);
        be_matmul(be, &L->ffn_gate_inp_shexp, x, n, st->shexp_gate);
        be_sigmoid_mul(be, st->shexp_out, st->shexp_gate, n, E, 1);
    }

    for (int j = 0; j < n_need; j++) {
        const int e = xs->need[j];
        int m_rows = 0; /* (token * k + slot) entries routed to e, in token order */
        for (int i = 0; i < n * k; i++)
            if (st->moe_ids[i] == e) st->moe_rows[m_rows++] = i;
        expert_views ev;
        if (expert_acquire(m->experts, il, e, &ev) != 0) return -1;
        for (int r = 0; r < m_rows; r++)
            memcpy(st->moe_x + (size_t)r * E, x + (size_t)(st->moe_rows[r] / k) * E,
                   (size_t)E * sizeof(float));
        be_matmul_swiglu(be, &ev.gate, &ev.up, st->moe_x, m_rows, st->ff_a);
        be_matmul(be, &ev.down, st->ff_a, m_rows, st->moe_y);
        expert_release(m->experts, il, e);
        for (int r = 0; r < m_rows; r++)
            memcpy(st->moe_slots + (size_t)st->moe_rows[r] * E, st->moe_y + (size_t)r * E,
                   (size_t)E * sizeof(float));
    }

    for (int t = 0; t < n; t++) {
        float *o = out + (size_t)t * E;
        const float *w = st->moe_w + (size_t)t * k;
        const float *s0 = st->moe_slots + (size_t)t * k * E;
        for (int i = 0; i < E; i++) o[i] = s0[i] * w[0];
        for (int s = 1; s < k; s++) {
            const float *ss = s0 + (size_t)s * E;
            for (int i = 0; i < E; i++) o[i] += ss[i] * w[s];
        }
    }

    /* llama.cpp's order: routed sum + (shared output * gate) */
    if (shared) be_add(be, out, st->shexp_out, (size_t)n * E);
    return 0;
}
