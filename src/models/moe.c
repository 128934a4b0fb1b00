/* Routed mixture of experts (qwen3moe, qwen35moe, qwen3next):
 *
 *   p = softmax(W_router · x)            over all experts, float, sum in double (as ggml)
 *   top-k experts by p, weights p_k       renormalized over the k (clamped sum) when norm_topk
 *   y = sum_k w_k · down_k(silu(gate_k x) * up_k x)     summed in slot order
 *   y += sigmoid(g · x) · shared(x)       when the layer has a shared expert (SwiGLU as above)
 *
 * Tokens are grouped by expert: each expert is acquired from the expert store once per batch
 * and multiplied as a small matrix over the tokens routed to it. Every token's result is
 * computed the same way whatever the grouping, so batch composition never changes bits.
 *
 * Two ways to reach the experts, one routing and one combine rule:
 *   - host loop (CPU backend): the routed ids come back to the host, each needed expert is
 *     acquired, its tokens gathered, multiplied, scattered to their slots, then combined;
 *   - expert table (device backends, be_has_expert_table): one moe_experts op reads the
 *     experts through the backend's [layer][expert] table. The host sees the routing only when
 *     a layer-by-layer streaming cache must fill slots first (store->per_layer) or a route
 *     callback wants it; otherwise the layer runs without the host (a captured CUDA graph). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/error.h"
#include "formats/quant.h"
#include "models/state.h"
#include "runtime/cache_policy.h"
#include "runtime/watchdog.h"

/* experts in one backend call (experts_one): the routed ones of a layer and a shared one */
#define MOE_ONE_MAX 16

/* A decode batch of at most this many tokens may leave some misses to the host's cores
 * (expert_store host_max, backend moe_experts_host). */
#define MOE_HOST_MAX_TOKENS 8

/* Per-state MoE bookkeeping, allocated on first use: host arrays (the routed ids the host needs
 * to acquire experts, the rows routed to one expert) and backend buffers for the lookahead. */
struct moe_scratch {
    int n_batch;
    int32_t *need;    /* unique experts of the batch, in first-use order [n_expert] */
    uint8_t *mark;    /* [n_expert] */
    int32_t *ids_h;   /* host copy of a layer's routed ids [n_batch][k] */
    float *w_h;       /* host copy of their weights (route callback) */
    float *x_h;       /* host copy of the layer's input (moe_experts_host) [<= 8][n_embd] */
    int32_t *rows_h;  /* (token * k + slot) entries routed to one expert */
    int32_t *rows_set; /* experts_batch_sets: the entries of one set's experts [n_batch][k] */
    uint8_t *done;    /* computed in a set (experts_one_sets, experts_batch_sets), by need index [n_expert] */
    float *look_x;    /* lookahead: normed residual [n_batch][n_embd] (backend memory) */
    float *look_r;    /* lookahead: router logits of a batch ranked on the backend (backend memory) */
    float *look_w;    /* lookahead: their weights (unused; moe_route writes them) */
    int32_t *look_pair; /* backend memory: a streamed device layer's routed ids [n][k] at 0 (its
                         * moe_route writes them there), then at look_off(n, k) (int32-sized units)
                         * the lookahead's result (look_result), so that one read-back brings both */
    void *pair_h;     /* host copy of look_pair */
    float *look_l;    /* host: the lookahead's logits [n][n_expert] (look_host_ranks), else */
    int32_t *look_h;  /* its top-k [n][k] */
    int32_t *pred;    /* predicted experts of pred_layer [n_expert] */
    int n_pred, pred_layer;
    int32_t *step_ids; /* moe_step_collect: all layers' ids of a pass, then (route callback)
                        * their weights' bits (backend memory) */
    int32_t *step_h;   /* the same on the host (moe_step_end reads it) */
    /* SLUICE_MOE_TIMING: where a layer-by-layer streamed layer's host time goes (decode) */
    bool timing;
    uint64_t t_layers;
    double t_wait, t_issue, t_look, t_total; /* seconds: routing read-back, copies issued (of which
                                              * the lookahead's), whole layer */
    bool shared_apart; /* SLUICE_MOE_SHARED_APART (measurement): see shared_in in moe_forward */
    bool look_in_order; /* SLUICE_MOE_LOOK_IN_ORDER (measurement): see look_late in moe_forward */
    /* a decode token's lookahead, rank by rank (look_rank_wanted): its top-k of the last
     * prediction in rank order, and per rank the predictions made and those that came true */
    int32_t look_top[64];
    int n_look_top;
    uint64_t rank_seen[64], rank_true[64];
    double look_precision; /* LOOK_RANK_PRECISION, or SLUICE_MOE_LOOK_PRECISION (measurement) */
};

static double moe_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void moe_state_release(model_state *st) {
    struct moe_scratch *x = st->moe_extra;
    if (!x) return;
    if (x->timing && x->t_layers)
        fprintf(stderr, "sluice: moe timing: %llu streamed decode layers: %.1f us a layer on the host, of which "
                        "%.1f waiting for the routing, %.1f issuing copies (%.1f the lookahead's)\n",
                (unsigned long long)x->t_layers, x->t_total * 1e6 / (double)x->t_layers,
                x->t_wait * 1e6 / (double)x->t_layers, x->t_issue * 1e6 / (double)x->t_layers,
                x->t_look * 1e6 / (double)x->t_layers);
    free(x->need);
    free(x->mark);
    free(x->ids_h);
    free(x->w_h);
    free(x->x_h);
    free(x->rows_h);
    free(x->rows_set);
    free(x->done);
    free(x->pair_h);
    free(x->look_l);
    free(x->look_h);
    state_release(st->be, x->look_x);
    state_release(st->be, x->look_r);
    state_release(st->be, x->look_w);
    state_release(st->be, x->look_pair);
    state_release(st->be, x->step_ids);
    free(x->step_h);
    free(x->pred);
    free(x);
    st->moe_extra = NULL;
}

/* The lookahead ranks a decode batch's logits on the host (a few hundred values a token: less
 * host time than a routing launch costs) and a larger batch's on the backend (512 tokens x 256
 * logits took the host 0.4 ms a layer). */
#define MOE_LOOK_HOST_TOKENS 8
static bool look_host_ranks(size_t n) { return n <= MOE_LOOK_HOST_TOKENS; }
/* Where the lookahead's result starts in look_pair (int32-sized units): after the layer's ids,
 * 256-byte aligned for the device's stores; and the bytes up to its end. */
static size_t look_off(size_t n, size_t k) { return (n * k + 63) / 64 * 64; }
static size_t look_pair_bytes(size_t n, size_t k, size_t n_expert) {
    return (look_off(n, k) + n * (look_host_ranks(n) ? n_expert : k)) * 4;
}

static struct moe_scratch *scratch_of(const sluice_model *m, model_state *st) {
    if (st->moe_extra) return st->moe_extra;
    const hparams *hp = &m->hp;
    struct moe_scratch *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    const size_t B = (size_t)st->n_batch, X = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used;
    x->n_batch = st->n_batch;
    x->need = malloc(X * sizeof *x->need);
    x->mark = calloc(X, 1);
    x->ids_h = malloc(B * K * sizeof *x->ids_h);
    x->w_h = malloc(B * K * sizeof *x->w_h);
    /* moe_experts_host's input rows: decode batches only (at most MOE_HOST_MAX_TOKENS) */
    x->x_h = malloc((B < MOE_HOST_MAX_TOKENS ? B : MOE_HOST_MAX_TOKENS) * (size_t)hp->n_embd * sizeof *x->x_h);
    x->rows_h = malloc(B * K * sizeof *x->rows_h);
    x->rows_set = malloc(B * K * sizeof *x->rows_set);
    x->done = calloc(X, 1);
    x->pair_h = malloc(look_off(B, K) * 4 + B * (X > K ? X : K) * 4);
    x->look_l = malloc((B < MOE_LOOK_HOST_TOKENS ? B : MOE_LOOK_HOST_TOKENS) * X * sizeof *x->look_l);
    x->look_h = malloc(B * K * sizeof *x->look_h);
    x->pred = malloc(X * sizeof *x->pred);
    x->pred_layer = -1;
    x->timing = getenv("SLUICE_MOE_TIMING") != NULL;
    x->shared_apart = getenv("SLUICE_MOE_SHARED_APART") && atoi(getenv("SLUICE_MOE_SHARED_APART")) > 0;
    x->look_in_order = getenv("SLUICE_MOE_LOOK_IN_ORDER") && atoi(getenv("SLUICE_MOE_LOOK_IN_ORDER")) > 0;
    x->look_precision = getenv("SLUICE_MOE_LOOK_PRECISION") ? atof(getenv("SLUICE_MOE_LOOK_PRECISION"))
                                                          : LOOK_RANK_PRECISION;
    st->moe_extra = x;
    if (!x->need || !x->mark || !x->ids_h || !x->w_h || !x->x_h || !x->rows_h || !x->rows_set || !x->done || !x->pair_h || !x->look_l || !x->look_h || !x->pred) {
        moe_state_release(st);
        return NULL;
    }
    return x;
}

/* Router lookahead: apply the next MoE layer's norm and router to the residual stream as it is
 * now (after this layer's attention) and start reading the experts it would choose, so they
 * arrive while this layer's experts are multiplied. Only timing depends on it. In two halves:
 * lookahead_queue queues the norm, the router product and (a large batch) the routing into
 * look_pair (a device runs them with this layer's router, so one wait for the host covers
 * both), lookahead_issue prefetches the top-k, ranked on the host for a decode batch (softmax
 * keeps the logits' order). lookahead_ready false: no lookahead from layer il. */
static bool lookahead_ready(const sluice_model *m, backend *be, int il, struct moe_scratch *x) {
    const hparams *hp = &m->hp;
    const int next = il + 1;
    if (next >= hp->n_layer || !m->layers[next].ffn_gate_inp.data || !m->layout.layers[next].present)
        return false;
    if (!x->look_x) { /* backend buffers on first use */
        const size_t B = (size_t)x->n_batch;
        x->look_x = state_alloc(be, B * (size_t)hp->n_embd * sizeof(float));
        const size_t K = (size_t)hp->n_expert_used, X = (size_t)hp->n_expert;
        x->look_r = state_alloc(be, B * X * sizeof(float));
        x->look_w = state_alloc(be, B * K * sizeof(float));
        x->look_pair = state_alloc(be, look_off(B, K) * 4 + B * (X > K ? X : K) * 4);
    }
    return x->look_x && x->look_r && x->look_w && x->look_pair; /* else no lookahead: timing only */
}

/* after lookahead_ready: the next layer's norm and router product on the residual h, and the
 * routing of a batch the host does not rank; the result at look_off in look_pair */
static void lookahead_queue(const sluice_model *m, backend *be, int il, const float *h, int n,
                            struct moe_scratch *x) {
    const hparams *hp = &m->hp;
    const layer_weights *N = &m->layers[il + 1];
    const int k = hp->n_expert_used;
    int32_t *result = x->look_pair + look_off((size_t)n, (size_t)k);
    be_rmsnorm(be, h, &N->ffn_norm, n, hp->n_embd, hp->rms_eps, x->look_x);
    if (look_host_ranks((size_t)n)) {
        be_matmul(be, &N->ffn_gate_inp, x->look_x, n, (float *)result);
    } else {
        be_matmul(be, &N->ffn_gate_inp, x->look_x, n, x->look_r);
        be_moe_route(be, x->look_r, n, hp->n_expert, k, false, result, x->look_w);
    }
}

/* the host's copy of a lookahead result (its bytes at src) into look_l or look_h */
static void lookahead_result(const sluice_model *m, int n, struct moe_scratch *x, const void *src) {
    const size_t N = (size_t)n, w = look_host_ranks(N) ? (size_t)m->hp.n_expert : (size_t)m->hp.n_expert_used;
    memcpy(look_host_ranks(N) ? (void *)x->look_l : (void *)x->look_h, src, N * w * 4);
}

/* The lookahead folded into the router launch. The lookahead wants the next layer's logits
 * W_n · (rmsnorm(h) * g_n); the layer's router reads x = rmsnorm(h) * g, the same residual h
 * and norm scale, so those logits are W' · x with W'[e][j] = W_n[e][j] * g_n[j] / g[j]
 * (0 where g[j] = 0: that component is lost to the prediction, which only timing depends on).
 * For a layer whose successor has a router and experts, with F32 norms and a router sluice can
 * decode; W' is F32 host memory the device backend copies once (its own weights). */
static bool look_foldable(const sluice_model *m, int il) {
    const int next = il + 1;
    if (!m->layout.layers || next >= m->layout.n_layer || next >= m->hp.n_layer || !m->layout.layers[il].present ||
        !m->layout.layers[next].present || !m->layers)
        return false;
    const layer_weights *L = &m->layers[il], *N = &m->layers[next];
    const quant_traits *t = N->ffn_gate_inp.data ? quant_traits_of(N->ffn_gate_inp.type) : NULL;
    return L->ffn_gate_inp.data && t && t->dequantize && L->ffn_norm.data && N->ffn_norm.data &&
           L->ffn_norm.type == GGML_TYPE_F32 && N->ffn_norm.type == GGML_TYPE_F32 &&
           N->ffn_gate_inp.ne[0] == m->hp.n_embd && N->ffn_gate_inp.ne[1] == m->hp.n_expert &&
           N->ffn_gate_inp.ne[0] % t->block_elems == 0;
}

uint64_t moe_lookahead_bytes(const sluice_model *m) {
    uint64_t b = 0;
    for (int il = 0; il < m->hp.n_layer; il++)
        if (look_foldable(m, il)) b += (uint64_t)m->hp.n_expert * (uint64_t)m->hp.n_embd * sizeof(float);
    return b;
}

int moe_lookahead_bind(sluice_model *m, char *err, size_t err_len) {
    const int64_t E = m->hp.n_embd, X = m->hp.n_expert;
    for (int il = 0; il < m->hp.n_layer; il++) {
        if (!look_foldable(m, il)) continue;
        const layer_weights *N = &m->layers[il + 1];
        const float *g = m->layers[il].ffn_norm.data, *gn = N->ffn_norm.data;
        float *w = malloc((size_t)(X * E) * sizeof *w);
        if (!w || !ld_own(m, w)) { /* ld_own frees w when it cannot keep it */
            snprintf(err, err_len, "out of memory for the router lookahead (layer %d)", il);
            return -1;
        }
        const quant_traits *t = quant_traits_of(N->ffn_gate_inp.type);
        for (int64_t e = 0; e < X; e++) {
            float *row = w + e * E;
            t->dequantize((const uint8_t *)N->ffn_gate_inp.data + (size_t)e * N->ffn_gate_inp.row_bytes, row, E);
            for (int64_t j = 0; j < E; j++) row[j] = g[j] != 0.0f ? row[j] * (gn[j] / g[j]) : 0.0f;
        }
        tview *v = &m->layers[il].ffn_look;
        memset(v, 0, sizeof *v);
        v->type = GGML_TYPE_F32;
        v->ne[0] = E;
        v->ne[1] = X;
        v->ne[2] = v->ne[3] = 1;
        v->row_bytes = (size_t)E * sizeof(float);
        v->mat_bytes = v->row_bytes * (size_t)X;
        v->data = w;
        v->name = "ffn_look";
    }
    return 0;
}

/* Whether a is ranked before b (higher logit; NaN last; ties to the lower id). */
static bool look_before(float a, int ia, float b, int ib) {
    if (isnan(b)) return !isnan(a) || ia < ib;
    if (isnan(a)) return false;
    return a > b || (a == b && ia < ib);
}

/* Prefetch the next layer's top-k: look_h, or ranked here from the logits look_l. by_rank: a
 * decode token's ranks by look_rank_wanted (measured for host-reached experts only; a device
 * table's copies read every rank). */
static void lookahead_issue(const sluice_model *m, int il, int n, struct moe_scratch *x, bool by_rank) {
    const hparams *hp = &m->hp;
    const int next = il + 1, X = hp->n_expert;
    const int k = hp->n_expert_used < 64 ? hp->n_expert_used : 64; /* a prediction: 64 at most */
    memset(x->mark, 0, (size_t)X);
    x->n_pred = 0;
    for (int i = 0; !look_host_ranks((size_t)n) && i < n * hp->n_expert_used; i++) {
        const int32_t e = x->look_h[i];
        if (e >= 0 && e < X && !x->mark[e]) {
            x->mark[e] = 1;
            x->pred[x->n_pred++] = e;
        }
    }
    for (int t = 0; look_host_ranks((size_t)n) && t < n; t++) {
        const float *l = x->look_l + (size_t)t * X;
        int top[64], nt = 0; /* ids in rank order */
        for (int e = 0; e < X; e++) {
            if (nt == k && !look_before(l[e], e, l[top[k - 1]], top[k - 1])) continue;
            int j = nt < k ? nt++ : k - 1;
            while (j > 0 && look_before(l[e], e, l[top[j - 1]], top[j - 1])) {
                top[j] = top[j - 1];
                j--;
            }
            top[j] = e;
        }
        /* one token: its ranks are kept for look_rank_wanted, and only the wanted are read */
        const bool one = n == 1;
        if (one) {
            for (int j = 0; j < nt; j++) x->look_top[j] = top[j];
            x->n_look_top = nt;
        }
        for (int j = 0; j < nt; j++)
            if (!x->mark[top[j]] &&
                (!one || !by_rank || look_rank_wanted(x->rank_seen[j], x->rank_true[j], x->look_precision))) {
                x->mark[top[j]] = 1;
                x->pred[x->n_pred++] = top[j];
            }
    }
    if (n != 1) x->n_look_top = 0;
    memset(x->mark, 0, (size_t)X);
    x->pred_layer = next;
    expert_prefetch(m->experts, next, x->pred, x->n_pred, false);
}

/* The lookahead of a layer whose experts the host reaches (no device table): queue, read back,
 * rank and issue in one go. */
static void lookahead_now(const sluice_model *m, backend *be, int il, const float *h, int n, struct moe_scratch *x) {
    const size_t k = (size_t)m->hp.n_expert_used, off = look_off((size_t)n, k);
    lookahead_queue(m, be, il, h, n, x);
    be_download(be, x->pair_h, x->look_pair + off, look_pair_bytes((size_t)n, k, m->hp.n_expert) - off * 4);
    lookahead_result(m, n, x, x->pair_h);
    lookahead_issue(m, il, n, x, true);
}

/* A batch of more tokens than this multiplies most of a layer's experts: a streaming device
 * cache then fills its slots layer by layer (copy path) even when decode reads misses in place. */
#define MOE_PREP_MIN_TOKENS 8

/* The expert table's slots must be prepared per layer from the routing (on the host). */
static bool layer_prep(const sluice_model *m, int n) {
    const expert_store *s = m->experts;
    return s->per_layer || (s->device_table && s->streaming && n > MOE_PREP_MIN_TOKENS);
}

bool moe_host_free(const sluice_model *m, const model_state *st, const backend *be) {
    (void)st; /* a route callback is served after the pass (moe_step_end) */
    return be_has_expert_table(be) && m->experts && m->experts->device_table && !layer_prep(m, 1);
}

void moe_lookahead_start(const sluice_model *m, model_state *st, backend *be, const float *h, int n) {
    const expert_store *es = m->experts;
    /* host-reached experts (CPU) only: a device table's first layer was not measured with it */
    if (!es || !es->streaming || m->params.no_prefetch || !look_host_ranks((size_t)n) ||
        (be_has_expert_table(be) && es->device_table))
        return;
    int first = 0;
    while (first < m->hp.n_layer && !m->layers[first].ffn_gate_inp.data) first++;
    struct moe_scratch *xs = scratch_of(m, st);
    if (xs && lookahead_ready(m, be, first - 1, xs)) lookahead_now(m, be, first - 1, h, n, xs);
}

/* The next set of a layer's experts to compute: those not done whose bytes are there (all of
 * them with a resident store); when none is, the first not done (its acquire waits for it), or
 * none at all where the caller has other work to run meanwhile (wait_ok false). Returns the
 * set's size, its need indices in set[], in need order. */
static int next_set(expert_store *es, int il, const int32_t *need, int n_need, const uint8_t *done, bool wait_ok,
                    int *set, bool *all_ready) {
    int ns = 0, first = -1, left = 0;
    for (int j = 0; j < n_need; j++) {
        if (done[j]) continue;
        if (first < 0) first = j;
        left++;
        if (expert_ready(es, il, need[j])) set[ns++] = j;
    }
    if (all_ready) *all_ready = ns == left;
    if (ns == 0 && first >= 0 && wait_ok) set[ns++] = first;
    return ns;
}

/* A batch's routed experts through the backend's experts_batch (CPU: its threads take whole
 * experts), in sets of experts whose bytes are there: resident, one call for the layer;
 * streaming, the experts already read first, then after each wait those that landed meanwhile,
 * while the reads of the rest go on (after each set, the rest's reads are started again into
 * the slots the set released). Each expert's (token * k + slot) entries in token order, its
 * outputs in its own slots: the sets never change the bits. xs->done[j]: need[j] ran. 1: every
 * expert ran; 0: the backend declined a set (the caller computes the rest expert by expert);
 * -1: error. */
static int experts_batch_sets(const sluice_model *m, model_state *st, backend *be, int il, const float *x, int n,
                              int k, struct moe_scratch *xs, int n_need) {
    expert_store *es = m->experts;
    const int E = m->hp.n_embd;
    expert_views *ev = malloc(sizeof(expert_views) * (size_t)n_need);
    const tview **v = malloc(sizeof(tview *) * 3 * (size_t)n_need);
    int *offset = calloc((size_t)n_need + 1, sizeof(int)), *at = malloc(sizeof(int) * (size_t)m->hp.n_expert);
    int *set = malloc(sizeof(int) * (size_t)n_need), *set_off = malloc(sizeof(int) * ((size_t)n_need + 1));
    int32_t *pending = malloc(sizeof(int32_t) * (size_t)n_need);
    int rc = -1, left = n_need;
    if (!ev || !v || !offset || !at || !set || !set_off || !pending) {
        sluice_set_error("out of memory for a batch's experts (layer %d)", il);
        goto done;
    }
    for (int j = 0; j < n_need; j++) at[xs->need[j]] = j;
    for (int i = 0; i < n * k; i++) offset[at[xs->ids_h[i]] + 1]++;
    for (int j = 0; j < n_need; j++) offset[j + 1] += offset[j];
    { /* counting sort: the entries of need[j] at offset[j].., in entry (token) order */
        int *fill = at; /* reused: expert id -> next free position */
        for (int j = 0; j < n_need; j++) fill[xs->need[j]] = offset[j];
        for (int i = 0; i < n * k; i++) xs->rows_h[fill[xs->ids_h[i]]++] = i;
    }
    rc = 1;
    while (left > 0) {
        const int ns = next_set(es, il, xs->need, n_need, xs->done, true, set, NULL);
        int acquired = 0;
        set_off[0] = 0;
        for (; acquired < ns; acquired++) {
            const int j = set[acquired];
            if (expert_acquire(es, il, xs->need[j], &ev[acquired]) != 0) break;
            v[acquired] = &ev[acquired].gate;
            v[ns + acquired] = &ev[acquired].up;
            v[2 * ns + acquired] = &ev[acquired].down;
            const int cnt = offset[j + 1] - offset[j];
            memcpy(xs->rows_set + set_off[acquired], xs->rows_h + offset[j], sizeof(int32_t) * (size_t)cnt);
            set_off[acquired + 1] = set_off[acquired] + cnt;
        }
        const bool ran = acquired == ns && be->ops->experts_batch(be, ns, v, v + ns, v + 2 * ns, x, E, k, xs->rows_set,
                                                                  set_off, st->moe_slots);
        for (int a = 0; a < acquired; a++) expert_release(es, il, xs->need[set[a]]);
        if (acquired < ns) {
            rc = -1;
            break;
        }
        if (!ran) {
            rc = 0;
            break;
        }
        for (int a = 0; a < ns; a++) xs->done[set[a]] = 1;
        left -= ns;
        if (left > 0 && es->streaming) { /* the rest's reads, into the slots this set released */
            int np = 0;
            for (int j = 0; j < n_need; j++)
                if (!xs->done[j]) pending[np++] = xs->need[j];
            expert_prefetch(es, il, pending, np, true);
        }
    }
done:
    free(ev);
    free(v);
    free(offset);
    free(at);
    free(set);
    free(set_off);
    free(pending);
    return rc;
}

/* One token's routed experts (need[0..n_need), in slot order: top-k ids are distinct) and the
 * shared expert (Ls, or NULL) through experts_one, in sets of experts whose bytes are there.
 * Resident: one set, two dispatches for the layer. Streaming: the shared expert and the routed
 * experts whose reads have landed go first; then, after waiting for the first missing one, it
 * and those that landed meanwhile; so the products overlap the remaining reads as in the
 * expert-by-expert loop, with two dispatches a set instead of four an expert. Each expert writes
 * its own slot (moe_slots + j * n_embd), combined in slot order afterwards, and experts_one's
 * per-expert arithmetic does not depend on its companions: the sets never change the bits.
 * done[j] / *shared_done: what ran. 1: everything ran; 0: the backend declined a set (the
 * caller computes the rest expert by expert); -1: error. */
static int experts_one_sets(const sluice_model *m, model_state *st, backend *be, int il, const float *x,
                            const int32_t *need, int n_need, const layer_weights *Ls, uint8_t *done,
                            bool *shared_done, bool *look_pending) {
    expert_store *es = m->experts;
    const int E = m->hp.n_embd;
    int left = n_need;
    while (left > 0 || (Ls && !*shared_done)) {
        const tview *gv[MOE_ONE_MAX], *uv[MOE_ONE_MAX], *dv[MOE_ONE_MAX];
        expert_views ev[MOE_ONE_MAX];
        float *ov[MOE_ONE_MAX];
        int set[MOE_ONE_MAX];
        bool all_ready;
        /* while the shared expert is still to run, it runs alone rather than wait */
        const int ns = next_set(es, il, need, n_need, done, !Ls || *shared_done, set, &all_ready);
        if (*look_pending && all_ready) { /* the layer's reads have landed: the next layer's may start */
            lookahead_now(m, be, il, st->x, 1, st->moe_extra);
            *look_pending = false;
        }
        int acquired = 0;
        for (; acquired < ns; acquired++) {
            const int j = set[acquired];
            if (expert_acquire(es, il, need[j], &ev[acquired]) != 0) break;
            gv[acquired] = &ev[acquired].gate, uv[acquired] = &ev[acquired].up, dv[acquired] = &ev[acquired].down;
            ov[acquired] = st->moe_slots + (size_t)j * E;
        }
        bool ok = acquired == ns;
        int ne = ns;
        const bool with_shared = Ls && !*shared_done;
        if (ok && with_shared) {
            gv[ne] = &Ls->ffn_gate_shexp, uv[ne] = &Ls->ffn_up_shexp, dv[ne] = &Ls->ffn_down_shexp;
            ov[ne++] = st->shexp_out;
        }
        const bool ran = ok && be->ops->experts_one(be, ne, gv, uv, dv, x, ov);
        for (int a = 0; a < acquired; a++) expert_release(es, il, need[set[a]]);
        if (!ok) return -1;
        if (!ran) return 0;
        for (int a = 0; a < ns; a++) done[set[a]] = 1;
        left -= ns;
        if (with_shared) *shared_done = true;
    }
    return 1;
}

int moe_forward(const sluice_model *m, model_state *st, backend *be, int il, const float *x,
                int n, float *out, float *residual, const tview *next_norm, float *next_out) {
    const hparams *hp = &m->hp;
    const layer_weights *L = &m->layers[il];
    const int k = hp->n_expert_used, E = hp->n_embd;
    struct moe_scratch *xs = scratch_of(m, st);
    if (!xs) return -1;
    const bool table = be_has_expert_table(be) && m->experts->device_table;
    const bool prep = table && layer_prep(m, n);
    const bool look = m->experts->streaming && !m->params.no_prefetch && (!table || prep);
    /* a device backend queues the lookahead with the layer's router, so the host waits once
     * for both: the layer's ids then go to look_pair, beside the lookahead's logits; the CPU
     * computes the lookahead after the demand reads are issued */
    const bool look_early = look && prep && lookahead_ready(m, be, il, xs);
    /* each layer routes into its own slice, so a step's routing can be read back afterwards
     * (moe_step_collect: a pass that does not bring the routing to the host in every layer) */
    int32_t *ids = look_early ? xs->look_pair : st->moe_ids + (size_t)il * st->n_batch * k;
    float *wts = st->moe_w + (size_t)il * st->n_batch * k;

    const bool shared = L->ffn_up_shexp.data != NULL;
    /* the router, the shared expert's gate and (folded, moe_lookahead_bind) the lookahead's
     * router in one launch */
    const bool look_fold = look_early && look_host_ranks((size_t)n) && L->ffn_look.data;
    {
        const tview *w[3];
        float *o[3];
        int nw = 0;
        w[nw] = &L->ffn_gate_inp, o[nw++] = st->router;
        if (shared && L->ffn_gate_inp_shexp.data) w[nw] = &L->ffn_gate_inp_shexp, o[nw++] = st->shexp_gate;
        if (look_fold) w[nw] = &L->ffn_look, o[nw++] = (float *)(xs->look_pair + look_off((size_t)n, (size_t)k));
        if (nw == 1) be_matmul(be, w[0], x, n, o[0]);
        else be_matmul_multi(be, nw, w, x, n, o);
    }
    be_moe_route(be, st->router, n, hp->n_expert, k, hp->norm_topk, ids, wts);
    /* every expert resident on the device: its table entries are final now, so the device may
     * start fetching the routed experts' weights while the shared expert runs */
    if (table && !m->experts->streaming) be_moe_prefetch(be, il, ids, n, k);
    if (look_early && !look_fold) lookahead_queue(m, be, il, st->x, n, xs);

    /* The expert table (device backends) needs the routing on the host only to prepare a
     * streaming cache layer by layer; the CPU path always does. Without the host in the layer,
     * a route callback is served after the pass from the slices (moe_step_end). */
    const bool host = !table || prep;
    /* a streamed decode layer whose misses the host may compute in part (--gpu-miss host) */
    const bool host_split = prep && n <= MOE_HOST_MAX_TOKENS && m->experts->host_max > 0 &&
                            m->experts->ops->prefetch_host && be->ops->moe_experts_host;
    /* A streamed decode layer (device table) waits for its routing, and from then on the device
     * is idle until the host has launched the layer's experts: the shared expert goes into the
     * routed experts' launches there (after the acquires) instead of three launches of its own
     * (bench/results/2026-12-01-cuda-stream3.md). */
    const bool shared_in = shared && prep && n <= MOE_HOST_MAX_TOKENS && !host_split && !xs->shared_apart &&
                           be->ops->moe_experts_shared;
    /* set below: the lookahead waits until the layer's experts are launched (look_late) */
    bool look_late = false;
    /* One token, a backend that runs host-reached experts together (CPU): the routed experts
     * and the shared one in sets (experts_one_sets). There the lookahead waits until the layer's
     * own reads have landed (look_pending): issued at once, its reads shared the disk with the
     * demand's, and the layer waited for them about twice as long (qwen4exp-8l floor run on 2
     * vCPUs, 64 tokens: read wait 0.86-0.96 -> 0.48-0.52 s, decode 3.01-3.25 -> 2.80-2.82 s). */
    const bool sets_one = !table && n == 1 && be->ops->experts_one;
    bool look_pending = false;
    int n_need = 0;
    const bool timed = xs->timing && prep && n <= MOE_HOST_MAX_TOKENS;
    const double t0 = timed ? moe_now() : 0;
    double t1 = t0, t2 = t0, tl = t0;
    if (host && look_early) { /* the layer's ids and the lookahead's logits: one read-back */
        const size_t nk = (size_t)n * k, X = (size_t)hp->n_expert;
        be_download(be, xs->pair_h, xs->look_pair, look_pair_bytes((size_t)n, (size_t)k, X));
        memcpy(xs->ids_h, xs->pair_h, nk * sizeof(int32_t));
        lookahead_result(m, n, xs, (const char *)xs->pair_h + look_off((size_t)n, (size_t)k) * 4);
    } else if (host) {
        be_download(be, xs->ids_h, ids, (size_t)n * k * sizeof(int32_t));
    }
    if (host) {
        if (timed) t1 = moe_now();
        if (host_split) be_download(be, xs->x_h, x, (size_t)n * E * sizeof(float));
        if (st->route_fn) {
            be_download(be, xs->w_h, wts, (size_t)n * k * sizeof(float));
            for (int t = 0; t < n; t++)
                st->route_fn(st->route_ctx, il, st->pos0 + t, k, xs->ids_h + (size_t)t * k,
                             xs->w_h + (size_t)t * k);
        }
    }

    char why[256];
    if (watchdog_tripped(why, sizeof why)) { /* a long prefill stops within one layer */
        sluice_set_error("stopped by the memory watchdog: %s", why);
        return -1;
    }
    if (!table || prep) {
        /* the experts this batch needs, in first-use order */
        for (int i = 0; i < n * k; i++) {
            int32_t e = xs->ids_h[i];
            if (!xs->mark[e]) {
                xs->mark[e] = 1;
                xs->need[n_need++] = e;
            }
        }
        if (xs->pred_layer == il) { /* how good was the lookahead for this layer? */
            int correct = 0;
            for (int i = 0; i < xs->n_pred; i++) correct += xs->mark[xs->pred[i]];
            for (int r = 0; r < xs->n_look_top; r++) {
                xs->rank_seen[r]++;
                xs->rank_true[r] += xs->mark[xs->look_top[r]];
            }
            m->experts->stats.prefetch_issued += (uint64_t)xs->n_pred;
            m->experts->stats.prefetch_used += (uint64_t)correct;
            xs->pred_layer = -1;
        }
        memset(xs->mark, 0, (size_t)hp->n_expert);
        if (m->experts->streaming) {
            const uint64_t reads0 = m->experts->stats.reads;
            if (host_split) m->experts->ops->prefetch_host(m->experts, il, xs->need, n_need, m->experts->host_max);
            else expert_prefetch(m->experts, il, xs->need, n_need, true);
            if (timed) tl = moe_now();
            /* A decode layer whose experts were all cached: the device, not the bus, waits for
             * the host now, so the layer's experts are launched before the lookahead is issued
             * (its copies still overlap them: copy_fence). When the demand queued copies, the
             * lookahead's follow them at once, so that the bus does not idle in between. */
            look_late = look_early && !host_split && n <= MOE_HOST_MAX_TOKENS && m->experts->stats.reads == reads0 &&
                        !xs->look_in_order;
            if (look_early) {
                if (!look_late) lookahead_issue(m, il, n, xs, false);
            } else if (look && lookahead_ready(m, be, il, xs)) {
                if (sets_one) look_pending = true;
                else lookahead_now(m, be, il, st->x, n, xs);
            }
        }
        if (timed) {
            t2 = moe_now();
            xs->t_look += t2 - tl;
        }
    }

    if (shared && !L->ffn_gate_inp_shexp.data) { /* never: the loader requires it with the shared expert */
        sluice_set_error("layer %d: shared expert without its gate", il);
        return -1;
    }
    /* A resident device table may take the shared expert into the routed experts' launches
     * (decode: its three launches then run beside theirs instead of ahead of them); where it
     * declines, or cannot, the shared expert goes first: its multiplications overlap the routed
     * experts' reads. */
    bool merged = false;
    if (shared && table && !prep && !m->experts->streaming && be->ops->moe_experts_shared) {
        const int rc = be->ops->moe_experts_shared(be, il, x, n, ids, wts, k, &L->ffn_gate_shexp, &L->ffn_up_shexp,
                                                   &L->ffn_down_shexp, out, st->shexp_out);
        if (rc < 0) return -1;
        merged = rc == 0;
    }
    /* two dispatches a set instead of two an expert */
    bool one = false, shared_done = false;
    memset(xs->done, 0, (size_t)n_need);
    if (sets_one && n_need + 1 <= MOE_ONE_MAX) {
        const int rc = experts_one_sets(m, st, be, il, x, xs->need, n_need, shared ? L : NULL, xs->done, &shared_done,
                                        &look_pending);
        if (rc < 0) return -1;
        one = rc == 1;
    }
    if (look_pending) lookahead_now(m, be, il, st->x, n, xs); /* the sets declined, or every read had landed */
    if (shared && !merged && !one && !shared_in && !shared_done) {
        be_matmul_swiglu(be, &L->ffn_gate_shexp, &L->ffn_up_shexp, x, n, st->ff_a);
        be_matmul(be, &L->ffn_down_shexp, st->ff_a, n, st->shexp_out);
    }

    if (one) {
        be_moe_combine(be, st->moe_slots, wts, n, k, E, out);
    } else if (merged) {
        /* the routed experts are done too */
    } else if (table) {
        /* the lookahead's copies may start once the work queued so far is done, beside this
         * layer's experts: they never overwrite a slot the layer reads (pinned until the
         * releases below, after the lookahead) */
        if (look_late) be_copy_fence(be, true);
        /* a layer-by-layer cache (re)points the table's entries at the slots it acquired */
        int acquired = 0;
        for (; acquired < n_need; acquired++) {
            expert_views ev;
            if (expert_acquire(m->experts, il, xs->need[acquired], &ev) != 0) break;
        }
        int rc = 0;
        if (acquired < n_need) {
            rc = -1;
        } else if (host_split) {
            rc = be->ops->moe_experts_host(be, il, x, xs->x_h, n, ids, xs->ids_h, wts, k, out);
        } else {
            const int sh = shared_in ? be->ops->moe_experts_shared(be, il, x, n, ids, wts, k, &L->ffn_gate_shexp,
                                                                   &L->ffn_up_shexp, &L->ffn_down_shexp, out,
                                                                   st->shexp_out)
                                     : 1;
            if (sh < 0) {
                rc = -1;
            } else if (sh > 0) { /* declined, or not offered: the shared expert on its own */
                if (shared_in) {
                    be_matmul_swiglu(be, &L->ffn_gate_shexp, &L->ffn_up_shexp, x, n, st->ff_a);
                    be_matmul(be, &L->ffn_down_shexp, st->ff_a, n, st->shexp_out);
                }
                rc = be->ops->moe_experts(be, il, x, n, ids, wts, k, out);
            }
        }
        if (look_late) {
            const double tx = timed ? moe_now() : 0;
            if (rc == 0) lookahead_issue(m, il, n, xs, false);
            be_copy_fence(be, false);
            if (timed) xs->t_look += moe_now() - tx;
        }
        for (int j = 0; j < acquired; j++) expert_release(m->experts, il, xs->need[j]);
        if (rc != 0) return -1;
    } else {
        /* a batch: in sets through one backend call a set where the backend offers it (CPU:
         * its threads take whole experts; streaming, the sets follow the reads); else expert
         * by expert, each expert's reads overlapping the products of the ones already there */
        int batch = 0;
        if (n > 1 && be->ops->experts_batch) batch = experts_batch_sets(m, st, be, il, x, n, k, xs, n_need);
        if (batch < 0) return -1;
        for (int j = 0; j < n_need && !batch; j++) {
            if (xs->done[j]) continue; /* computed in a set (experts_one_sets, experts_batch_sets) */
            const int e = xs->need[j];
            int m_rows = 0; /* (token * k + slot) entries routed to e, in token order */
            for (int i = 0; i < n * k; i++)
                if (xs->ids_h[i] == e) xs->rows_h[m_rows++] = i;
            expert_views ev;
            if (expert_acquire(m->experts, il, e, &ev) != 0) return -1;
            be_upload(be, st->moe_rows, xs->rows_h, (size_t)m_rows * sizeof(int32_t));
            be_gather_rows(be, st->moe_x, x, st->moe_rows, k, m_rows, E);
            be_matmul_swiglu(be, &ev.gate, &ev.up, st->moe_x, m_rows, st->ff_a);
            be_matmul(be, &ev.down, st->ff_a, m_rows, st->moe_y);
            expert_release(m->experts, il, e);
            be_scatter_rows(be, st->moe_slots, st->moe_rows, st->moe_y, m_rows, E);
        }
        be_moe_combine(be, st->moe_slots, wts, n, k, E, out);
    }

    if (shared && !residual) be_sigmoid_mul(be, st->shexp_out, st->shexp_gate, n, E, 1);
    if (timed) {
        xs->t_layers++;
        xs->t_wait += t1 - t0;
        xs->t_issue += t2 - t1;
        xs->t_total += moe_now() - t0;
    }
    /* llama.cpp's order: routed sum + (shared output * gate), then the residual */
    if (residual && next_norm)
        be_moe_tail_rmsnorm(be, residual, out, shared ? st->shexp_out : NULL, shared ? st->shexp_gate : NULL, n,
                            E, next_norm, hp->rms_eps, next_out);
    else if (residual)
        be_moe_tail(be, residual, out, shared ? st->shexp_out : NULL,
                    shared ? st->shexp_gate : NULL, n, E);
    else if (shared)
        be_add(be, out, st->shexp_out, (size_t)n * E);
    return 0;
}

/* Who needs a pass's routing after it: the route callback, and a streaming store's observer. */
bool moe_step_collects(const sluice_model *m, const model_state *st, int n) {
    const expert_store *s = m->experts;
    if (!s || !be_has_expert_table(st->be) || !s->device_table || layer_prep(m, n))
        return false; /* the layers saw their routing on the host already */
    return st->route_fn || (s->ops->observe && s->streaming);
}

int moe_step_collect(const sluice_model *m, model_state *st, int n) {
    if (!moe_step_collects(m, st, n) || !st->moe_extra) return 0;
    const int k = m->hp.n_expert_used, L = m->hp.n_layer;
    struct moe_scratch *xs = st->moe_extra;
    backend *be = st->be;
    const size_t cap = (size_t)L * st->n_batch * k;
    if (!xs->step_ids) { /* every layer's ids, then their weights: one download per pass */
        xs->step_ids = state_alloc(be, 2 * cap * sizeof(int32_t));
        xs->step_h = malloc(2 * cap * sizeof(int32_t));
        if (!xs->step_ids || !xs->step_h) return -1;
    }
    const size_t nk = (size_t)n * k, stride = (size_t)st->n_batch * k, all = (size_t)L * nk;
    /* 4-byte rows: int32 ids moved as floats keep their bits */
    be_copy_rows(be, (float *)xs->step_ids, nk, (const float *)st->moe_ids, stride, L, (int)nk);
    if (st->route_fn) be_copy_rows(be, (float *)(xs->step_ids + all), nk, st->moe_w, stride, L, (int)nk);
    be_download(be, xs->step_h, xs->step_ids, (st->route_fn ? 2 : 1) * all * sizeof(int32_t));
    return 0;
}

int moe_step_end(const sluice_model *m, model_state *st, int n, int pos0) {
    if (!moe_step_collects(m, st, n) || !st->moe_extra || !st->moe_extra->step_h) return 0;
    expert_store *s = m->experts;
    const bool observe = s->ops->observe && s->streaming;
    const int k = m->hp.n_expert_used, L = m->hp.n_layer;
    const struct moe_scratch *xs = st->moe_extra;
    const size_t nk = (size_t)n * k, all = (size_t)L * nk;
    const float *wh = (const float *)(xs->step_h + all); /* that half only ever read as floats */
    for (int il = 0; il < L; il++) {
        if (!m->layers[il].ffn_gate_inp.data || !m->layout.layers[il].present) continue;
        const int32_t *ih = xs->step_h + (size_t)il * nk;
        if (st->route_fn)
            for (int t = 0; t < n; t++)
                st->route_fn(st->route_ctx, il, pos0 + t, k, ih + (size_t)t * k, wh + (size_t)il * nk + (size_t)t * k);
        if (observe && s->ops->observe(s, il, ih, (int)nk) != 0) return -1;
    }
    return 0;
}
