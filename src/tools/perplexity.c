/* Perplexity over non-overlapping windows, second half scored (see perplexity.h). */
#include "tools/perplexity.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double ppl_token_nll(const float *logits, int n_vocab, int32_t tok) {
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += expf(logits[i] - mx);
    return (double)mx + log(sum) - (double)logits[tok];
}

int ppl_compute(sluice_model *m, const int32_t *tokens, int n_tokens, const ppl_params *pp,
                ppl_result *res, FILE *log, char *err, size_t en) {
    memset(res, 0, sizeof *res);
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    const int n_ctx = pp->n_ctx > 0 ? pp->n_ctx : 512, V = info.n_vocab;
    if (n_ctx < 4 || n_ctx > info.n_ctx_train) {
        snprintf(err, en, "context %d must be between 4 and the model's %d", n_ctx, info.n_ctx_train);
        return -1;
    }
    if (n_tokens < 2 * n_ctx) {
        snprintf(err, en, "need at least %d tokens for a context of %d; the text has %d", 2 * n_ctx,
                 n_ctx, n_tokens);
        return -1;
    }
    int n_chunk = n_tokens / n_ctx;
    if (pp->n_chunks >= 0 && pp->n_chunks < n_chunk) n_chunk = pp->n_chunks;
    if (log)
        fprintf(log, "perplexity: %d tokens, %d windows of %d, scoring positions %d..%d of each\n",
                n_tokens, n_chunk, n_ctx, n_ctx / 2, n_ctx - 2);
    const int first = n_ctx / 2, nb = pp->n_batch > 0 && pp->n_batch < n_ctx ? pp->n_batch : n_ctx;
    sluice_session_params sp = {.n_ctx = n_ctx, .n_batch = nb, .n_threads = pp->n_threads};
    sluice_session *s = sluice_session_new(m, &sp);
    float *logits = malloc((size_t)nb * (size_t)V * sizeof(float));
    int32_t *win = malloc((size_t)n_ctx * sizeof *win);
    double *nll_b = malloc((size_t)n_ctx * sizeof *nll_b);
    double nll_dec = 0;
    int rc = -1;
    if (!s || !logits || !win || !nll_b) {
        snprintf(err, en, "%s", s ? "out of memory" : sluice_last_error());
        goto done;
    }
    for (int c = 0; c < n_chunk; c++) {
        memcpy(win, tokens + (size_t)c * n_ctx, (size_t)n_ctx * sizeof *win);
        if (info.add_bos && info.bos >= 0) win[0] = info.bos;
        sluice_session_reset(s);
        /* the unscored first half needs no logits */
        if (sluice_session_eval(s, win, first, NULL) != 0) goto eval_fail;
        for (int j0 = first; j0 < n_ctx; j0 += nb) {
            const int k = n_ctx - j0 < nb ? n_ctx - j0 : nb;
            if (sluice_session_eval(s, win + j0, k, logits) != 0) goto eval_fail;
            for (int i = 0; i < k; i++) {
                const int j = j0 + i;
                if (j >= n_ctx - 1) break;
                const double v = ppl_token_nll(logits + (size_t)i * V, V, win[j + 1]);
                nll_b[j] = v;
                res->nll += v;
                res->nll2 += v * v;
                res->count++;
            }
        }
        if (pp->decode) {
            sluice_session_reset(s);
            for (int j = 0; j < n_ctx - 1; j++) {
                if (sluice_session_eval(s, &win[j], 1, NULL) != 0) goto eval_fail;
                if (j < first) continue;
                const double v = ppl_token_nll(sluice_session_logits(s), V, win[j + 1]);
                nll_dec += v;
                const double d = fabs(v - nll_b[j]);
                res->max_nll_diff = d > res->max_nll_diff ? d : res->max_nll_diff;
            }
        }
        res->n_chunks = c + 1;
        if (log) {
            fprintf(log, "[%d]%.4f%s", c + 1, exp(res->nll / (double)res->count),
                    c + 1 < n_chunk ? "," : "\n");
            fflush(log);
        }
    }
    const double mean = res->nll / (double)res->count;
    double var = res->nll2 / (double)res->count - mean * mean;
    res->ppl = exp(mean);
    res->ppl_err = var > 0 && res->count > 1 ? res->ppl * sqrt(var / (double)(res->count - 1)) : 0;
    if (pp->decode) res->ppl_decode = exp(nll_dec / (double)res->count);
    rc = 0;
    goto done;
eval_fail:
    snprintf(err, en, "%s", sluice_last_error());
done:
    sluice_session_free(s);
    free(logits);
    free(win);
    free(nll_b);
    return rc;
}
