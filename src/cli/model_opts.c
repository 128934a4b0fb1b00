/* Shared option groups (see model_opts.h). */
#include "cli/model_opts.h"

#include <stdio.h>

void cli_model_opts_init(cli_model_opts *mo) { *mo = (cli_model_opts){0}; }

void cli_sampling_opts_init(cli_sampling_opts *so) {
    so->sp = sluice_sampler_defaults();
    so->seed = CLI_SEED_RANDOM;
}

static int add(cli_opt *opts, int n, int cap, const cli_opt *src, int k) {
    if (n < 0 || n + k > cap) return -1;
    for (int i = 0; i < k; i++) opts[n + i] = src[i];
    return n + k;
}

int cli_add_model_opts(cli_opt *opts, int n, int cap, cli_model_opts *mo) {
    const cli_opt group[] = {
        {"--model", "-m", OPT_STR, &mo->path, "FILE", "GGUF model (default: the embedded sluice-moe-tiny)"},
        {"--ctx-size", "-c", OPT_INT, &mo->n_ctx, "N", "context positions (default: the model's trained length, at most 4096)"},
        {"--batch-size", "-b", OPT_INT, &mo->n_batch, "N", "prompt tokens per forward pass (default: 2048 when the model is resident on the CPU and memory allows, else 512)"},
        {"--threads", "-t", OPT_INT, &mo->n_threads, "N", "CPU threads (default: all cores)"},
    };
    return add(opts, n, cap, group, (int)(sizeof group / sizeof group[0]));
}

int cli_add_sampling_opts(cli_opt *opts, int n, int cap, cli_sampling_opts *so) {
    sluice_sampler_params *sp = &so->sp;
    const cli_opt group[] = {
        {"--temp", NULL, OPT_FLOAT, &sp->temperature, "T", "temperature; 0 = greedy (default 0.8)"},
        {"--top-k", NULL, OPT_INT, &sp->top_k, "K", "keep the K most likely tokens; 0 = off (default 40)"},
        {"--top-p", NULL, OPT_FLOAT, &sp->top_p, "P", "nucleus sampling; 1 = off (default 0.95)"},
        {"--min-p", NULL, OPT_FLOAT, &sp->min_p, "P", "drop tokens below P x the top probability; 0 = off (default 0.05)"},
        {"--repeat-penalty", NULL, OPT_FLOAT, &sp->repeat_penalty, "X", "penalize recent tokens; 1 = off (default 1.0)"},
        {"--repeat-last-n", NULL, OPT_INT, &sp->repeat_last_n, "N", "tokens of history for the penalty (default 64)"},
        {"--seed", "-s", OPT_U64, &so->seed, "S", "random seed (default: random)"},
    };
    return add(opts, n, cap, group, (int)(sizeof group / sizeof group[0]));
}

bool cli_model_opts_check(const char *cmd, const cli_model_opts *mo) {
    if (mo->n_ctx < 0 || mo->n_batch < 0 || mo->n_threads < 0) {
        fprintf(stderr, "sluice %s: -c, -b and -t must not be negative\n", cmd);
        return false;
    }
    return true;
}

bool cli_sampling_opts_check(const char *cmd, const cli_sampling_opts *so) {
    const sluice_sampler_params *sp = &so->sp;
    if (sp->temperature < 0 || sp->top_k < 0 || sp->top_p < 0 || sp->top_p > 1 ||
        sp->min_p < 0 || sp->min_p > 1 || sp->repeat_penalty <= 0 || sp->repeat_last_n < 0) {
        fprintf(stderr,
                "sluice %s: --temp, --top-k and --repeat-last-n must not be negative, --top-p "
                "and --min-p lie in [0, 1], --repeat-penalty is positive\n",
                cmd);
        return false;
    }
    return true;
}

sluice_session_params cli_model_opts_session(const cli_model_opts *mo) {
    return (sluice_session_params){.n_ctx = mo->n_ctx, .n_batch = mo->n_batch,
                                   .n_threads = mo->n_threads};
}
