/* The router lookahead folded into a layer's router launch (models/moe.c moe_lookahead_bind):
 * for each MoE layer whose successor has a router, W'[e][j] = W_next[e][j] * g_next[j] / g[j],
 * so that W' applied to the layer's router input x = rmsnorm(h) * g gives the logits the
 * lookahead wants, W_next · (rmsnorm(h) * g_next), for the same residual h. Checked on the two
 * shipped tiny fixtures (CPU, no device needed: the fold is host work; what the device does
 * with it is test_cuda's streamed bit-identity, which holds whatever the lookahead predicts):
 *   - moe_lookahead_bytes: one F32 [n_expert][n_embd] matrix per layer with a successor;
 *   - bound: those layers get ffn_look, the last MoE layer none;
 *   - W' · x against the double reference of the next layer's logits over random residuals
 *     (one with a zero input component): within 1e-5 of
 *     the sum of the terms' magnitudes (float rounding of W' and x, each about 1e-7), and the
 *     same top-k experts wherever the reference's k-th and (k+1)-th logits are further apart
 *     than that bound. Folding without the norm ratio (W' = W_next) fails both. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixtures.h"
#include "formats/quant.h"
#include "models/model.h"
#include "models/state.h"
#include "sluice.h"

static uint64_t rng = 88172645463325252ull;
static double rnd_normal(void) { /* xorshift64, Box-Muller */
    double u[2];
    for (int i = 0; i < 2; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        u[i] = ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* the top-k ids of v[n] (higher first, ties to the lower id) */
static void top_k(const double *v, int n, int k, int *out) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            bool taken = false;
            for (int q = 0; q < j; q++) taken |= out[q] == e;
            if (!taken && (best < 0 || v[e] > v[best])) best = e;
        }
        out[j] = best;
    }
}

static void check_model(const char *name) {
    char path[1024];
    if (!fixture_path("models", name, path, sizeof path)) {
        fprintf(stderr, "SKIP: fixture %s not found\n", name);
        return;
    }
    sluice_model *m = sluice_model_load(path, NULL);
    CHECKF(m != NULL, "load %s: %s", name, sluice_last_error());
    if (!m) return;
    const int E = m->hp.n_embd, X = m->hp.n_expert, K = m->hp.n_expert_used, NL = m->hp.n_layer;
    int folds = 0;
    for (int il = 0; il + 1 < NL; il++) folds += m->layout.layers[il].present && m->layout.layers[il + 1].present;
    CHECKF(folds > 0, "%s: no MoE layer with a successor", name);
    CHECK(moe_lookahead_bytes(m) == (uint64_t)folds * (uint64_t)X * (uint64_t)E * sizeof(float));
    char err[256] = "";
    CHECKF(moe_lookahead_bind(m, err, sizeof err) == 0, "%s", err);

    double *wn = malloc(sizeof(double) * (size_t)X * E), *ref = malloc(sizeof(double) * X),
           *fold = malloc(sizeof(double) * X), *mag = malloc(sizeof(double) * X);
    float *row = malloc(sizeof(float) * E), *x = malloc(sizeof(float) * E), *g = malloc(sizeof(float) * E);
    double *h = malloc(sizeof(double) * E);
    for (int il = 0; il < NL; il++) {
        const layer_weights *L = &m->layers[il];
        const bool expect = il + 1 < NL && m->layout.layers[il].present && m->layout.layers[il + 1].present;
        CHECKF((L->ffn_look.data != NULL) == expect, "%s layer %d: ffn_look %s", name, il,
               L->ffn_look.data ? "bound" : "missing");
        if (!L->ffn_look.data) continue;
        CHECK(L->ffn_look.type == GGML_TYPE_F32 && L->ffn_look.ne[0] == E && L->ffn_look.ne[1] == X);
        const layer_weights *N = &m->layers[il + 1];
        const quant_traits *t = quant_traits_of(N->ffn_gate_inp.type);
        for (int e = 0; e < X; e++) {
            t->dequantize((const uint8_t *)N->ffn_gate_inp.data + (size_t)e * N->ffn_gate_inp.row_bytes, row, E);
            for (int j = 0; j < E; j++) wn[(size_t)e * E + j] = row[j];
        }
        const float *gn = N->ffn_norm.data, *W = L->ffn_look.data;
        for (int trial = 0; trial < 8; trial++) {
            memcpy(g, L->ffn_norm.data, sizeof(float) * E);
            if (trial == 7) g[E / 3] = 0.0f; /* an input component that is zero (as a zero norm weight makes it) */
            double ss = 0;
            for (int j = 0; j < E; j++) {
                h[j] = rnd_normal() * (1 + trial);
                ss += h[j] * h[j];
            }
            const double s = 1.0 / sqrt(ss / E + (double)m->hp.rms_eps);
            for (int j = 0; j < E; j++) x[j] = (float)(h[j] * s * g[j]);
            for (int e = 0; e < X; e++) {
                double r = 0, f = 0, a = 0;
                for (int j = 0; j < E; j++) {
                    if (g[j] == 0.0f) continue; /* what the router input no longer carries */
                    const double term = wn[(size_t)e * E + j] * h[j] * s * gn[j];
                    r += term;
                    a += fabs(term);
                    /* the bound fold of this trial: a zeroed g[j] only in the test's x */
                    f += (double)W[(size_t)e * E + j] * x[j];
                }
                ref[e] = r, fold[e] = f, mag[e] = a;
            }
            double worst = 0, tol_max = 0;
            for (int e = 0; e < X; e++) {
                const double tol = 1e-5 * mag[e] + 1e-30;
                if (fabs(fold[e] - ref[e]) / tol > worst) worst = fabs(fold[e] - ref[e]) / tol;
                if (tol > tol_max) tol_max = tol;
            }
            CHECKF(worst <= 1.0, "%s layer %d trial %d: folded logits off by %.2f x the bound", name, il, trial, worst);
            int tr[64], tf[64];
            const int k = K < 64 && K < X ? K : (X > 1 ? X - 1 : 1);
            top_k(ref, X, k + 1 <= X ? k + 1 : k, tr);
            top_k(fold, X, k, tf);
            if (k < X && ref[tr[k - 1]] - ref[tr[k]] > 2 * tol_max) {
                for (int j = 0; j < k; j++) {
                    bool in = false;
                    for (int q = 0; q < k; q++) in |= tf[q] == tr[j];
                    CHECKF(in, "%s layer %d trial %d: expert %d of the reference's top-%d not predicted", name, il,
                           trial, tr[j], k);
                }
            }
        }
    }
    free(wn), free(ref), free(fold), free(mag), free(row), free(x), free(g), free(h);
    sluice_model_free(m);
}

int main(void) {
    check_model("qwen35moe-tiny-Q4_K_M.gguf");
    check_model("qwen3moe-tiny-Q4_K_M.gguf");
    CHECK_DONE();
}
