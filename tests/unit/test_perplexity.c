/* Perplexity: the library's llama.cpp-style figure equals a direct computation (each window
 * evaluated as one batch with all logits, the second half scored with a float64 log-softmax);
 * the decode path agrees to 1e-4 relative on an F32 model; too little text is refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixtures.h"
#include "tools/perplexity.h"
#include "tools/synth.h"

static double direct_nll(const float *l, int V, int tok) {
    double mx = l[0];
    for (int i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    double s = 0;
    for (int i = 0; i < V; i++) s += exp((double)l[i] - mx);
    return mx + log(s) - l[tok];
}

int main(void) {
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/ppl-qwen3moe-tiny-F32.gguf", SLUICE_TEST_WORK);
    synth_options o = {.preset = "qwen3moe-tiny", .type = "F32", .out = path, .seed = 3,
                       .routing_skew = 1.0f};
    CHECKF(synth_run(&o, NULL, err, sizeof err) == 0, "%s", err);
    sluice_model *m = sluice_model_load(path, NULL);
    CHECKF(m != NULL, "%s", sluice_last_error());
    if (!m) CHECK_DONE();
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    const int V = info.n_vocab, n_ctx = 32, n_tok = 3 * n_ctx + 5;
    int32_t *tok = malloc((size_t)n_tok * sizeof *tok);
    uint32_t s = 77;
    for (int i = 0; i < n_tok; i++) {
        s = s * 1103515245u + 12345u;
        tok[i] = (int32_t)((s >> 8) % 2000u);
    }
    ppl_params pp = {.n_ctx = n_ctx, .n_chunks = -1, .n_batch = 5, .n_threads = 2, .decode = true};
    ppl_result r;
    CHECKF(ppl_compute(m, tok, n_tok, &pp, &r, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(r.n_chunks == 3 && r.count == 3 * (n_ctx - n_ctx / 2 - 1));

    /* direct: one batch per window, every position's logits */
    float *all = malloc((size_t)n_ctx * V * sizeof *all);
    double nll = 0, nll2 = 0;
    long count = 0;
    for (int c = 0; c < 3; c++) {
        sluice_session_params sp = {.n_ctx = n_ctx, .n_batch = n_ctx, .n_threads = 1};
        sluice_session *ss = sluice_session_new(m, &sp);
        int32_t win[32];
        memcpy(win, tok + c * n_ctx, sizeof win);
        if (info.add_bos && info.bos >= 0) win[0] = info.bos;
        CHECK(ss && sluice_session_eval(ss, win, n_ctx, all) == 0);
        for (int j = n_ctx / 2; j < n_ctx - 1; j++) {
            double v = direct_nll(all + (size_t)j * V, V, win[j + 1]);
            nll += v;
            nll2 += v * v;
            count++;
        }
        sluice_session_free(ss);
    }
    const double ppl = exp(nll / count);
    const double var = nll2 / count - (nll / count) * (nll / count);
    const double perr = ppl * sqrt(var / (count - 1));
    CHECKF(fabs(r.ppl - ppl) / ppl < 1e-6, "library %.9g vs direct %.9g", r.ppl, ppl);
    CHECKF(fabs(r.ppl_err - perr) / perr < 1e-4, "error %.9g vs %.9g", r.ppl_err, perr);
    CHECKF(fabs(r.ppl_decode - r.ppl) / r.ppl < 1e-4, "decode %.9g vs batch %.9g", r.ppl_decode, r.ppl);
    CHECK(isfinite(r.ppl) && r.ppl > 1.0);

    /* too little text for two windows */
    CHECK(ppl_compute(m, tok, 2 * n_ctx - 1, &pp, &r, NULL, err, sizeof err) != 0 &&
          strstr(err, "need at least") != NULL);
    free(all);
    free(tok);
    sluice_model_free(m);
    remove(path);
    CHECK_DONE();
}
