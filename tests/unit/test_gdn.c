/* Linear-attention backend operations (backends/cpu/ops_ssm.c):
 *
 * 1. The gated delta rule: the per-token recurrence and the chunked form against a
 *    double-precision recurrence (relative error <= 1e-5 over outputs and final state), the
 *    chunked form against the recurrence, across value/key head layouts (tiled and grouped),
 *    sequence lengths on both sides of chunk boundaries, a carried-in state, and strong decay.
 *    The recurrence must be bit-identical for any thread count and any split of the sequence
 *    into calls (one call, pieces of 7, token by token); the chunked form for any thread count.
 * 2. The causal conv1d + SiLU with its rolling state: split calls (including calls shorter than
 *    the kernel) give the same bits as one call, the state is exactly the last kernel-1 raw
 *    inputs, and the outputs match a double-precision convolution.
 * 3. l2norm's epsilon floor and the gates (sigmoid, softplus threshold) against double math. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "check.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) { /* uniform [0, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)urand(); }

static void l2_rows(float *x, int rows, int dim) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int i = 0; i < dim; i++) s += (double)x[r * dim + i] * x[r * dim + i];
        for (int i = 0; i < dim; i++) x[r * dim + i] = (float)(x[r * dim + i] / sqrt(s));
    }
}

/* ||a - b|| / ||b|| */
static double rel_err(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}
static double rel_err_f(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

typedef struct gdn_case {
    int hk, hv, dk, dv, t;
    bool tiled;
    int chunk;
    float g_lo, g_hi; /* log decay range */
} gdn_case;

/* The recurrence in double, state [hv][dv][dk]. */
static void gdn_ref(const gdn_case *c, const float *q, const float *k, const float *v,
                    const float *g, const float *beta, double *S, double *out) {
    const double scale = 1.0 / sqrt((double)c->dk);
    for (int h = 0; h < c->hv; h++) {
        const int kh = c->tiled ? h % c->hk : h / (c->hv / c->hk);
        double *Sh = S + (size_t)h * c->dv * c->dk;
        for (int t = 0; t < c->t; t++) {
            const float *qt = q + ((size_t)t * c->hk + kh) * c->dk;
            const float *kt = k + ((size_t)t * c->hk + kh) * c->dk;
            const float *vt = v + ((size_t)t * c->hv + h) * c->dv;
            const double a = exp((double)g[t * c->hv + h]), b = beta[t * c->hv + h];
            for (int j = 0; j < c->dv; j++) {
                double *Sj = Sh + (size_t)j * c->dk, m = 0, o = 0;
                for (int i = 0; i < c->dk; i++) {
                    Sj[i] *= a;
                    m += Sj[i] * kt[i];
                }
                const double d = b * (vt[j] - m);
                for (int i = 0; i < c->dk; i++) {
                    Sj[i] += kt[i] * d;
                    o += Sj[i] * qt[i] * scale;
                }
                out[((size_t)t * c->hv + h) * c->dv + j] = o;
            }
        }
    }
}

/* Run the backend op over the sequence in calls of `piece` tokens (0: one call). */
static void gdn_run(backend *be, const gdn_case *c, int chunk, int piece, const float *q,
                    const float *k, const float *v, const float *g, const float *beta,
                    float *state, float *out) {
    if (piece <= 0) piece = c->t;
    for (int t0 = 0; t0 < c->t; t0 += piece) {
        const int n = c->t - t0 < piece ? c->t - t0 : piece;
        gdn_params p = {.n_tok = n, .n_k_head = c->hk, .n_v_head = c->hv, .d_k = c->dk,
                        .d_v = c->dv, .kv_tiled = c->tiled,
                        .q_scale = 1.0f / sqrtf((float)c->dk), .chunk = chunk};
        be_gated_delta(be, q + (size_t)t0 * c->hk * c->dk, k + (size_t)t0 * c->hk * c->dk,
                       v + (size_t)t0 * c->hv * c->dv, g + (size_t)t0 * c->hv,
                       beta + (size_t)t0 * c->hv, state, &p, out + (size_t)t0 * c->hv * c->dv);
    }
}

static void test_gdn_case(backend *be[3], const gdn_case *c) {
    const size_t nq = (size_t)c->t * c->hk * c->dk, nv = (size_t)c->t * c->hv * c->dv;
    const size_t ng = (size_t)c->t * c->hv, ns = (size_t)c->hv * c->dv * c->dk;
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *g = malloc(ng * 4);
    float *beta = malloc(ng * 4), *s0 = malloc(ns * 4);
    for (size_t i = 0; i < nq; i++) q[i] = frand(-1, 1), k[i] = frand(-1, 1);
    l2_rows(q, c->t * c->hk, c->dk);
    l2_rows(k, c->t * c->hk, c->dk);
    for (size_t i = 0; i < nv; i++) v[i] = frand(-1, 1);
    for (size_t i = 0; i < ng; i++) g[i] = frand(c->g_lo, c->g_hi), beta[i] = frand(0.05f, 0.95f);
    for (size_t i = 0; i < ns; i++) s0[i] = frand(-0.5f, 0.5f); /* a state carried in */

    double *S = malloc(ns * 8), *ref = malloc(nv * 8);
    for (size_t i = 0; i < ns; i++) S[i] = s0[i];
    gdn_ref(c, q, k, v, g, beta, S, ref);

    float *st_r = malloc(ns * 4), *out_r = malloc(nv * 4);
    float *st_c = malloc(ns * 4), *out_c = malloc(nv * 4);
    float *st_x = malloc(ns * 4), *out_x = malloc(nv * 4);
    memcpy(st_r, s0, ns * 4);
    gdn_run(be[1], c, 0, 0, q, k, v, g, beta, st_r, out_r);
    memcpy(st_c, s0, ns * 4);
    gdn_run(be[1], c, c->chunk, 0, q, k, v, g, beta, st_c, out_c);

    const double e_r = rel_err(out_r, ref, nv), es_r = rel_err(st_r, S, ns);
    const double e_c = rel_err(out_c, ref, nv), es_c = rel_err(st_c, S, ns);
    const double e_rc = rel_err_f(out_c, out_r, nv);
    printf("gdn hk %d hv %d dk %d dv %d T %3d %s chunk %2d g [%g, %g]: recurrent %.2g (state "
           "%.2g), chunked %.2g (state %.2g), chunked vs recurrent %.2g\n",
           c->hk, c->hv, c->dk, c->dv, c->t, c->tiled ? "tiled  " : "grouped", c->chunk,
           (double)c->g_lo, (double)c->g_hi, e_r, es_r, e_c, es_c, e_rc);
    CHECKF(e_r <= 1e-5 && es_r <= 1e-5, "recurrence vs double: %g, state %g", e_r, es_r);
    CHECKF(e_c <= 1e-5 && es_c <= 1e-5, "chunked vs double: %g, state %g", e_c, es_c);
    CHECKF(e_rc <= 1e-5, "chunked vs recurrence: %g", e_rc);

    /* the recurrence: same bits for any thread count and any split into calls */
    const int pieces[] = {0, 7, 1};
    for (int th = 0; th < 3; th++)
        for (int pi = 0; pi < 3; pi++) {
            memcpy(st_x, s0, ns * 4);
            gdn_run(be[th], c, 0, pieces[pi], q, k, v, g, beta, st_x, out_x);
            CHECKF(memcmp(out_x, out_r, nv * 4) == 0 && memcmp(st_x, st_r, ns * 4) == 0,
                   "recurrence differs with %d threads, pieces of %d", th + 1, pieces[pi]);
        }
    /* with checkpoints (gated_delta_ck, a verification pass): the outputs and final state of
     * the token-at-a-time recurrence bit for bit, and checkpoint t the state after token t */
    if (be[0]->ops->gated_delta_ck && c->t <= 80) {
        float *ck = malloc(ns * 4 * (size_t)c->t), *st_1 = malloc(ns * 4);
        memcpy(st_1, s0, ns * 4);
        for (int t = 0; t < c->t; t++) { /* the reference checkpoints, one token a call */
            gdn_params p1 = {.n_tok = 1, .n_k_head = c->hk, .n_v_head = c->hv, .d_k = c->dk, .d_v = c->dv,
                             .kv_tiled = c->tiled, .q_scale = 1.0f / sqrtf((float)c->dk)};
            be_gated_delta(be[0], q + (size_t)t * c->hk * c->dk, k + (size_t)t * c->hk * c->dk,
                           v + (size_t)t * c->hv * c->dv, g + (size_t)t * c->hv, beta + (size_t)t * c->hv, st_1,
                           &p1, out_x + (size_t)t * c->hv * c->dv);
            memcpy(ck + (size_t)t * ns, st_1, ns * 4);
        }
        for (int th = 0; th < 3; th++) {
            float *got = calloc(ns * (size_t)c->t, 4);
            memcpy(st_x, s0, ns * 4);
            gdn_params pc = {.n_tok = c->t, .n_k_head = c->hk, .n_v_head = c->hv, .d_k = c->dk, .d_v = c->dv,
                             .kv_tiled = c->tiled, .q_scale = 1.0f / sqrtf((float)c->dk)};
            be[th]->ops->gated_delta_ck(be[th], q, k, v, g, beta, st_x, &pc, out_x, got, ns);
            bool ck_same = true;
            for (int t = 0; t + 1 < c->t; t++) ck_same &= memcmp(got + (size_t)t * ns, ck + (size_t)t * ns, ns * 4) == 0;
            CHECKF(memcmp(out_x, out_r, nv * 4) == 0 && memcmp(st_x, st_r, ns * 4) == 0 && ck_same,
                   "gated_delta_ck differs from the token-at-a-time recurrence (%d threads)", th + 1);
            free(got);
        }
        free(ck), free(st_1);
    }
    /* the chunked form: same bits for any thread count */
    for (int th = 0; th < 3; th++) {
        memcpy(st_x, s0, ns * 4);
        gdn_run(be[th], c, c->chunk, 0, q, k, v, g, beta, st_x, out_x);
        CHECKF(memcmp(out_x, out_c, nv * 4) == 0 && memcmp(st_x, st_c, ns * 4) == 0,
               "chunked form differs with %d threads", th + 1);
    }
    free(q), free(k), free(v), free(g), free(beta), free(s0), free(S), free(ref);
    free(st_r), free(out_r), free(st_c), free(out_c), free(st_x), free(out_x);
}

/* ---- conv1d ------------------------------------------------------------------------------ */

static void test_conv(backend *be[3]) {
    enum { C = 37, K = 4, T = 23 };
    float *x = malloc(sizeof(float) * T * C), w[C * K];
    for (int i = 0; i < T * C; i++) x[i] = frand(-2, 2);
    for (int i = 0; i < C * K; i++) w[i] = frand(-1, 1);
    double ref[T * C];
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int j = 0; j < K; j++) {
                int src = t + j - (K - 1);
                acc += src >= 0 ? (double)w[c * K + j] * x[src * C + c] : 0.0;
            }
            ref[t * C + c] = acc / (1.0 + exp(-acc));
        }
    float y1[T * C], st1[(K - 1) * C] = {0};
    be_conv1d_silu(be[0], x, T, C, w, K, st1, y1);
    const double e = rel_err(y1, ref, (size_t)T * C);
    printf("conv1d: C %d K %d T %d, one call vs double %.2g\n", C, K, T, e);
    CHECKF(e <= 1e-6, "conv1d vs double: %g", e);
    /* the state is the last K-1 raw inputs */
    CHECK(memcmp(st1, x + (size_t)(T - (K - 1)) * C, sizeof st1) == 0);

    /* calls of 1, 2, 3, 5, ... tokens (several shorter than the kernel), 1-3 threads */
    const int sizes[] = {1, 2, 1, 3, 5, 1, 1, 4, 2, 3};
    for (int th = 0; th < 3; th++) {
        float y[T * C], st[(K - 1) * C] = {0};
        int t0 = 0;
        for (int i = 0; t0 < T; i = (i + 1) % 10) {
            int n = sizes[i] < T - t0 ? sizes[i] : T - t0;
            be_conv1d_silu(be[th], x + (size_t)t0 * C, n, C, w, K, st, y + (size_t)t0 * C);
            t0 += n;
            /* after every call: the last K-1 raw rows seen so far (zeros before the start) */
            for (int r = 0; r < K - 1; r++) {
                int src = t0 - (K - 1) + r;
                for (int c = 0; c < C; c++) {
                    float want = src >= 0 ? x[src * C + c] : 0.0f;
                    if (memcmp(&st[r * C + c], &want, 4) != 0) {
                        CHECKF(0, "conv state row %d channel %d after %d tokens", r, c, t0);
                        r = K;
                        break;
                    }
                }
            }
        }
        CHECKF(memcmp(y, y1, sizeof y) == 0 && memcmp(st, st1, sizeof st) == 0,
               "conv1d split into calls differs (%d threads)", th + 1);
    }
    free(x);
}

/* ---- l2norm and gates --------------------------------------------------------------------- */

static void test_l2norm_gates(backend *be) {
    const float eps = 1e-6f;
    float x[3 * 4] = {3, 4, 0, 0, /* norm 5 */ 0, 0, 0, 0, /* zero */ 1e-7f, 0, 0, 0};
    float y[12];
    be_l2norm(be, x, 3, 4, eps, y);
    CHECK(fabsf(y[0] - 0.6f) < 1e-7f && fabsf(y[1] - 0.8f) < 1e-7f);
    CHECK(y[4] == 0 && y[5] == 0); /* no NaN: eps floors the norm */
    CHECK(fabsf(y[8] - 0.1f) < 1e-6f); /* below eps the vector is divided by eps */

    enum { N = 3, H = 4 };
    float beta[N * H], alpha[N * H], dt[H] = {0.5f, -1, 0, 2}, a[H] = {-0.1f, -1, -3, -0.01f};
    float b0[N * H], a0[N * H];
    for (int i = 0; i < N * H; i++) b0[i] = beta[i] = frand(-6, 6), a0[i] = alpha[i] = frand(-5, 25);
    alpha[0] = a0[0] = 19.8f; /* 20.3 with the bias: past the softplus threshold */
    be_gdn_gates(be, beta, alpha, dt, a, N, H);
    double worst = 0;
    for (int i = 0; i < N * H; i++) {
        double bx = 1 / (1 + exp(-(double)b0[i])), z = (double)a0[i] + dt[i % H];
        double ax = (z > 20 ? z : log1p(exp(z))) * a[i % H];
        worst = fmax(worst, fabs(beta[i] - bx) / bx);
        worst = fmax(worst, fabs(alpha[i] - ax) / fmax(fabs(ax), 1e-30));
    }
    CHECKF(worst < 1e-5, "gates vs double: %g", worst);
    CHECK(alpha[0] == (19.8f + 0.5f) * -0.1f);

    float xs[2 * 3] = {1, 2, 3, 4, 5, 6}, gs[2] = {0, 100};
    be_sigmoid_mul(be, xs, gs, 2, 3, 1);
    CHECK(xs[0] == 0.5f && xs[2] == 1.5f && xs[3] == 4.0f);
}

int main(void) {
    backend *be[3] = {backend_cpu_new(1), backend_cpu_new(2), backend_cpu_new(3)};
    CHECK(be[0] && be[1] && be[2]);
    const gdn_case cases[] = {
        /* the upstream kernel-test shapes: Hk 2 / Hv 6, Dk 8, Dv 16, T 3/12/13, chunk 4 */
        {2, 6, 8, 16, 3, false, 4, -1.0f, -0.01f},
        {2, 6, 8, 16, 12, false, 4, -1.0f, -0.01f},
        {2, 6, 8, 16, 13, true, 4, -1.0f, -0.01f},
        /* value dims not a multiple of 4: the rows after the last group of 4 one at a time */
        {1, 2, 8, 18, 5, false, 4, -1.0f, -0.01f},
        /* the fixture's layer shape, across chunk boundaries of 64 */
        {2, 4, 64, 64, 63, true, 64, -0.3f, -0.001f},
        {2, 4, 64, 64, 64, true, 64, -0.3f, -0.001f},
        {2, 4, 64, 64, 130, true, 64, -0.3f, -0.001f},
        {2, 4, 64, 64, 200, false, 64, -0.3f, -0.001f},
        /* Qwen3.6's head shape, one key head per value head pair */
        {2, 4, 128, 128, 150, true, 64, -0.1f, -0.001f},
        /* strong decay: exp(G) underflows inside a chunk */
        {1, 3, 32, 16, 150, true, 64, -12.0f, -2.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_gdn_case(be, &cases[i]);
    test_conv(be);
    test_l2norm_gates(be[0]);
    for (int i = 0; i < 3; i++) be_free(be[i]);
    CHECK_DONE();
}
