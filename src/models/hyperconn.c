/* qwen4exp's hyper-connections ("gated residual", not DeepSeek-V4's Sinkhorn form), as
 * llama.cpp's qwen4exp graph computes them. Per module, with the wide residual x = [hc][n_embd]:
 *
 *   xn     = RMSNorm of each stream separately, times gamma [hc * n_embd]
 *   gate   = W_up silu((W_down xn) / hc)                         [hc * n_embd]
 *   input  = (sum over streams in order of xn_s * sigmoid(gate_s)) / hc     -> the sublayer
 *   inject = W_inject xn                                          [hc]
 *   write:   x_s += 2 sigmoid(inject_s / hc) * sublayer output    (streams never mix)
 *
 * The final mixer is a module without W_inject whose input feeds the output head; there is no
 * output norm. */
#include "models/qwen4exp.h"

bool hc_load(sluice_model *m, q4x_hc *hc, bool inject, char *err, size_t n, const char *prefix) {
    const q4x_model *q = q4x_of(m);
    const int64_t W = (int64_t)q->hc * m->hp.n_embd, R = q->hc_rank;
    if (!ld_tensor(m, &hc->norm, true, W, -1, -1, err, n, "%s_norm.weight", prefix) ||
        !ld_tensor(m, &hc->down, true, W, R, -1, err, n, "%s_down.weight", prefix) ||
        !ld_tensor(m, &hc->up, true, R, W, -1, err, n, "%s_up.weight", prefix))
        return false;
    return !inject ||
           ld_tensor(m, &hc->inject, true, W, q->hc, -1, err, n, "%s_inject.weight", prefix);
}

void hc_read(const sluice_model *m, model_state *st, backend *be, const q4x_hc *hc,
             const float *x, int n, float *out) {
    const q4x_model *q = q4x_of(m);
    q4x_state *xs = q4x_state_of(st);
    const int E = m->hp.n_embd;
    be_rmsnorm_groups(be, x, hc->norm.data, n, q->hc, E, m->hp.rms_eps, xs->xn);
    be_matmul(be, &hc->down, xs->xn, n, xs->lo);
    be_scale_silu(be, xs->lo, (size_t)n * q->hc_rank, 1.0f / (float)q->hc);
    be_matmul(be, &hc->up, xs->lo, n, xs->hgate);
    be_hc_mix(be, xs->xn, xs->hgate, n, q->hc, E, out);
    if (hc->inject.data) be_matmul(be, &hc->inject, xs->xn, n, xs->inject);
}

void hc_write(const sluice_model *m, model_state *st, backend *be, const float *out, int n) {
    const q4x_model *q = q4x_of(m);
    be_hc_combine(be, st->x, out, q4x_state_of(st)->inject, n, q->hc, m->hp.n_embd);
}
