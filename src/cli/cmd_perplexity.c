/* sluice perplexity: llama.cpp-style perplexity of a text file (tools/perplexity.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/model_opts.h"
#include "cli/plan_opts.h"
#include "tools/perplexity.h"

int cmd_perplexity(int argc, char **argv) {
    cli_model_opts mo;
    cli_plan_opts po = {0};
    cli_model_opts_init(&mo);
    const char *file = NULL;
    int chunks = -1;
    bool decode = false;
    cli_opt opts[40];
    const cli_opt own[] = {
        {"--file", "-f", OPT_STR, &file, "FILE", "text to score (required)"},
        {"--chunks", NULL, OPT_INT, &chunks, "N", "score at most N windows (default: all)"},
        {"--decode", NULL, OPT_FLAG, &decode, NULL, "also score through the token-by-token decode path and compare"},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) opts[n++] = own[i];
    n = cli_add_model_opts(opts, n, 40, &mo);
    n = cli_add_plan_opts(opts, n, 40, &po);
    if (n < 0) {
        fprintf(stderr, "sluice perplexity: internal error: option table too small\n");
        return 1;
    }
    const cli_cmd cmd = {
        "perplexity", "-m MODEL -f TEXT [-c CTX] [--chunks N] [--decode]",
        "Perplexity as llama.cpp's perplexity tool computes it: non-overlapping windows of -c "
        "tokens (default 512), each from an empty context, scoring the second half of each.",
        "Prints the running PPL per window, then 'Final estimate: PPL = X +/- E' (E: standard "
        "error of the mean\nnegative log-likelihood, propagated). -b splits the scored half into "
        "batches (default: one batch).",
        opts, n, 0};
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (!file) {
        fprintf(stderr, "sluice perplexity: -f TEXT is required\n");
        return 2;
    }
    if (!cli_model_opts_check("perplexity", &mo)) return 2;
    sluice_model_params mp = {0};
    if (!cli_plan_params("perplexity", &po, &mp)) return 2;
    const int n_ctx = mo.n_ctx ? mo.n_ctx : 512;
    mp.n_ctx = n_ctx;
    mp.n_batch = mo.n_batch ? mo.n_batch : n_ctx;
    if (po.plan) return cli_print_plan("perplexity", mo.path, &mp, po.json);
    size_t len = 0;
    char *text = cli_prompt_text("perplexity", NULL, file, &len);
    if (!text) return 1;
    sluice_model *m = cli_load_model_params("perplexity", mo.path, &mp);
    int n_tok = 0;
    int32_t *ids = m ? cli_tokenize("perplexity", m, text, len, false, &n_tok) : NULL;
    rc = 1;
    if (ids) {
        ppl_params pp = {.n_ctx = n_ctx, .n_chunks = chunks, .n_batch = mo.n_batch,
                         .n_threads = mo.n_threads, .decode = decode};
        ppl_result r;
        char err[512];
        if (ppl_compute(m, ids, n_tok, &pp, &r, stderr, err, sizeof err) != 0) {
            fprintf(stderr, "sluice perplexity: %s\n", err);
        } else {
            printf("Final estimate: PPL = %.4f +/- %.5f (%d windows, %ld tokens scored)\n", r.ppl,
                   r.ppl_err, r.n_chunks, r.count);
            if (decode)
                printf("decode path:    PPL = %.4f (relative difference %.3g, largest per-token "
                       "NLL difference %.3g)\n",
                       r.ppl_decode, fabs(r.ppl_decode - r.ppl) / r.ppl, r.max_nll_diff);
            rc = 0;
        }
    }
    free(ids);
    free(text);
    sluice_model_free(m);
    return rc;
}
