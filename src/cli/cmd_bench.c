/* sluice bench: llama-bench-style speed measurements with exact evidence (tools/bench.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/model_opts.h"
#include "cli/plan_opts.h"
#include "tools/bench.h"

static int parse_list(const char *s, int *out, int cap) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v <= 0 || v > (1L << 24) || n == cap) return -1;
        out[n++] = (int)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return n;
}

int cmd_bench(int argc, char **argv) {
    cli_model_opts mo;
    cli_plan_opts po = {0};
    cli_model_opts_init(&mo);
    const char *prompts = "128,2048,8192,32768", *out_path = NULL;
    bench_params bp = {.n_gen = 128, .reps = 1, .seed = 42, .warmup = true, .mtp_accept = -1.0f};
    bool csv = false, no_warmup = false;
    int mtp_vocab = SLUICE_MTP_VOCAB_DEFAULT;
    cli_opt opts[48];
    const cli_opt own[] = {
        {"--n-prompt", "-p", OPT_STR, &prompts, "LIST", "prompt lengths in tokens (default 128,2048,8192,32768; longer than the model's context: skipped)"},
        {"--n-gen", "-n", OPT_INT, &bp.n_gen, "N", "tokens generated per run (default 128)"},
        {"--repetitions", "-r", OPT_INT, &bp.reps, "N", "runs per prompt length (default 1)"},
        {"--seed", NULL, OPT_U64, &bp.seed, "S", "seed of the synthetic prompt tokens (default 42)"},
        {"--prompt-file", NULL, OPT_STR, &bp.prompt_file, "FILE", "take prompt tokens from a text file (cycled when shorter)"},
        {"--evidence-dir", NULL, OPT_STR, &bp.evidence_dir, "DIR", "write each run's logits and token ids, and bench.json, into DIR"},
        {"--hash-model", NULL, OPT_FLAG, &bp.hash_model, NULL, "full SHA-256 of the model file (default: size + first and last MiB)"},
        {"--trace-routing", NULL, OPT_STR, &bp.trace_path, "FILE", "write the routing of every measured run (docs/trace-format.md)"},
        {"--no-warmup", NULL, OPT_FLAG, &no_warmup, NULL, "skip the untimed warmup runs (a short one; with a resident model also one of each prompt length)"},
        {"--mtp", NULL, OPT_INT, &bp.mtp, "N", "decode by MTP speculative steps of up to N drafts (qwen4exp files with an MTP block; default 0: off), drafting only while it measures faster than plain steps; the evidence hashes equal the plain run's"},
        {"--mtp-always", NULL, OPT_FLAG, &bp.mtp_always, NULL, "with --mtp: draft N every step, even when it is slower"},
        {"--mtp-accept", NULL, OPT_FLOAT, &bp.mtp_accept, "P", "with --mtp (measurement): time MTP at acceptance P in 0..1: an untimed plain run records the greedy continuation, and each draft becomes its token with probability P (the drafts are still made; the evidence is unchanged)"},
        {"--mtp-vocab", NULL, OPT_INT, &mtp_vocab, "N", "with --mtp: a draft chooses among the first N token ids and the context's recent ids (default 32768; 0: every id); the tokens never depend on it"},
        {"--csv", NULL, OPT_FLAG, &csv, NULL, "print one CSV row per run instead of the table"},
        {"--output", "-o", OPT_STR, &out_path, "FILE", "write the report to FILE instead of stdout"},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) opts[n++] = own[i];
    n = cli_add_model_opts(opts, n, 48, &mo);
    n = cli_add_plan_opts(opts, n, 48, &po);
    if (n < 0) {
        fprintf(stderr, "sluice bench: internal error: option table too small\n");
        return 1;
    }
    const cli_cmd cmd = {
        "bench", "[-m MODEL] [-p 128,2048] [-n 128] [-r 3] [options]",
        "Measure prefill and decode speed, llama-bench style, with exact evidence: the SHA-256 of "
        "the logits and tokens of every run. --json (without --plan) prints the full run record.",
        "Each run: a reset session (one per context size, warmed up), the prompt in chunks of -b tokens (prefill; TTFT includes the "
        "first greedy pick),\nthen -n greedy decode steps (TPOT). Logits are copied and hashed "
        "outside the timed region.\n-c sets the context (default: prompt + generated tokens). "
        "docs/bench.md describes the record.",
        opts, n, 0};
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    const bool json_out = po.json && !po.plan;
    if (json_out) po.json = false; /* --json alone selects the bench record */
    bp.n_prompts = parse_list(prompts, bp.n_prompt, BENCH_MAX_PROMPTS);
    if (bp.n_prompts <= 0) {
        fprintf(stderr, "sluice bench: invalid -p '%s' (positive numbers separated by commas, at most %d)\n",
                prompts, BENCH_MAX_PROMPTS);
        return 2;
    }
    if (bp.n_gen < 0 || bp.reps < 1 || bp.reps > 64 || !cli_model_opts_check("bench", &mo)) {
        if (bp.n_gen < 0 || bp.reps < 1 || bp.reps > 64)
            fprintf(stderr, "sluice bench: -n must not be negative and -r must be in 1..64\n");
        return 2;
    }
    if (json_out && csv) {
        fprintf(stderr, "sluice bench: give --csv or --json, not both\n");
        return 2;
    }
    sluice_model_params mp = {0};
    if (!cli_plan_params("bench", &po, &mp)) return 2;
    int max_p = 0;
    for (int i = 0; i < bp.n_prompts; i++) max_p = bp.n_prompt[i] > max_p ? bp.n_prompt[i] : max_p;
    mp.n_ctx = mo.n_ctx ? mo.n_ctx : max_p + bp.n_gen;
    mp.n_batch = mo.n_batch;
    if (bp.mtp < 0 || bp.mtp > 64) {
        fprintf(stderr, "sluice bench: --mtp takes 0..64 drafts\n");
        return 2;
    }
    if (bp.mtp_always && bp.mtp == 0) {
        fprintf(stderr, "sluice bench: --mtp-always needs --mtp N\n");
        return 2;
    }
    if (bp.mtp_accept != -1.0f && (bp.mtp == 0 || !(bp.mtp_accept >= 0.0f && bp.mtp_accept <= 1.0f))) {
        fprintf(stderr, "sluice bench: --mtp-accept takes a probability in 0..1, with --mtp N\n");
        return 2;
    }
    bp.mtp_oracle = bp.mtp_accept != -1.0f;
    if (mtp_vocab < 0) {
        fprintf(stderr, "sluice bench: --mtp-vocab takes 0 (every id) or a number of ids\n");
        return 2;
    }
    mp.mtp = bp.mtp;
    mp.mtp_vocab = mtp_vocab == 0 ? -1 : mtp_vocab;
    if (po.plan) return cli_print_plan("bench", mo.path, &mp, po.json);
    bp.model_path = mo.path;
    bp.n_batch = mo.n_batch;
    /* record the thread count actually used (the session default is every online core) */
    bp.n_threads = mo.n_threads ? mo.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    bp.n_ctx = mo.n_ctx;
    bp.warmup = !no_warmup;

    FILE *out = stdout;
    if (out_path && !(out = fopen(out_path, "w"))) {
        fprintf(stderr, "sluice bench: %s: %s\n", out_path, strerror(errno));
        return 1;
    }
    sluice_model *m = cli_load_model_params("bench", mo.path, &mp);
    bench_result res = {0};
    char *json = NULL;
    rc = 1;
    if (!m) goto done;
    char err[512];
    if (bench_execute(m, &bp, &res, stderr, err, sizeof err) != 0) {
        fprintf(stderr, "sluice bench: %s\n", err);
        goto done;
    }
    if (res.n_runs == 0) {
        fprintf(stderr, "sluice bench: no prompt length fits the model's context\n");
        goto done;
    }
    json = bench_json(m, &bp, &res);
    if (!json) {
        fprintf(stderr, "sluice bench: cannot build the JSON record\n");
        goto done;
    }
    if (bp.evidence_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/bench.json", bp.evidence_dir);
        FILE *fp = fopen(path, "w");
        bool ok = fp && fputs(json, fp) >= 0 && fputc('\n', fp) != EOF;
        if (fp) ok = fclose(fp) == 0 && ok;
        if (!ok) {
            fprintf(stderr, "sluice bench: %s: %s\n", path, strerror(errno));
            goto done;
        }
    }
    if (json_out) fprintf(out, "%s\n", json);
    else if (csv) bench_print_csv(out, m, &bp, &res);
    else bench_print_markdown(out, m, &bp, &res);
    rc = 0;
done:
    free(json);
    bench_result_free(&res);
    sluice_model_free(m);
    if (out != stdout && fclose(out) != 0) rc = 1;
    return rc;
}
