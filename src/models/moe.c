/* Routed mixture of experts (qwen3moe, qwen35moe):
 *
 *   p = softmax(W_router · x)            over all experts, float, sum in double (as ggml)
 *   top-k experts by p, weights p_k       renormalized over the k (clamped sum) when norm_topk
 *   y = sum_k w_k · down_k(silu(gate_k x) * up_k x)     summed in slot order
 *
 * Tokens are grouped by expert: each expert is acquired from the expert store once per batch
 * and multiplied as a small matrix over the tokens routed to it. Every token's result is
 * computed the same way whatever the grouping, so batch composition never changes bits. */
#include <math.h>
#include <string.h>

#include "models/state.h"

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
    const int k = hp->n_expert_used, E = hp->n_embd, F = hp->n_ff_exp;

    be_matmul(be, &L->ffn_gate_inp, x, n, st->router);
    for (int t = 0; t < n; t++) {
        route_token(hp, st->router + (size_t)t * hp->n_expert, st->moe_ids + (size_t)t * k,
                    st->moe_w + (size_t)t * k);
        if (st->route_fn)
            st->route_fn(st->route_ctx, il, st->pos[t], k, st->moe_ids + (size_t)t * k,
                         st->moe_w + (size_t)t * k);
    }

    for (int e = 0; e < hp->n_expert; e++) {
        int m_rows = 0; /* (token * k + slot) entries routed to e, in token order */
        for (int i = 0; i < n * k; i++)
            if (st->moe_ids[i] == e) st->moe_rows[m_rows++] = i;
        if (m_rows == 0) continue;
        expert_views ev;
        if (expert_acquire(m->experts, il, e, &ev) != 0) return -1;
        for (int r = 0; r < m_rows; r++)
            memcpy(st->moe_x + (size_t)r * E, x + (size_t)(st->moe_rows[r] / k) * E,
                   (size_t)E * sizeof(float));
        be_matmul(be, &ev.gate, st->moe_x, m_rows, st->ff_a);
        be_matmul(be, &ev.up, st->moe_x, m_rows, st->ff_b);
        be_swiglu(be, st->ff_a, st->ff_b, (size_t)m_rows * F);
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
    return 0;
}
