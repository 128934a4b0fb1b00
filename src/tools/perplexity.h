/* Perplexity the way llama.cpp's perplexity tool measures it: the text is tokenized once (with
 * the model's BOS rule), cut into non-overlapping windows of n_ctx tokens; each window starts
 * from an empty context (its first token replaced by BOS when the model adds one) and only the
 * second half is scored, so every scored token has at least n_ctx/2 tokens of context:
 *
 *   nll_j = -log softmax(logits_j)[tok_{j+1}]   for j in [n_ctx/2, n_ctx - 1)
 *   PPL = exp(mean nll),  error = PPL * sqrt(var(nll) / (count - 1))
 *
 * The same windows can also be scored through the token-by-token decode path; on F32 models
 * both must agree (the batched and the decode path compute the same function). */
#ifndef SLUICE_PERPLEXITY_H
#define SLUICE_PERPLEXITY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "sluice.h"

typedef struct ppl_params {
    int n_ctx;      /* window (default 512) */
    int n_chunks;   /* < 0: all windows */
    int n_batch;    /* scored half evaluated in sub-batches of this many tokens (0: n_ctx) */
    int n_threads;
    bool decode;    /* also score through the decode path */
} ppl_params;

typedef struct ppl_result {
    int n_chunks;
    long count;              /* scored tokens */
    double nll, nll2;        /* sums */
    double ppl, ppl_err;
    double ppl_decode;       /* when decode */
    double max_nll_diff;     /* largest |nll_batch - nll_decode| of one token */
} ppl_result;

/* Negative log-likelihood of token tok under logits (log-softmax as llama.cpp computes it). */
double ppl_token_nll(const float *logits, int n_vocab, int32_t tok);

int ppl_compute(sluice_model *m, const int32_t *tokens, int n_tokens, const ppl_params *pp,
                ppl_result *res, FILE *log, char *err, size_t err_len);

#endif
