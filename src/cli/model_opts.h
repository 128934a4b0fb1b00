/* Option groups shared by the subcommands that load a model and run a session (serve, bench,
 * perplexity; run can move over). One place declares the flags, their help and their checks, so
 * a new model or sampling flag appears in every such command at once. The memory-plan flags
 * (--resident, --stream, --cache, --mem-budget, --io, ...) are their own group, plan_opts.h. */
#ifndef SLUICE_CLI_MODEL_OPTS_H
#define SLUICE_CLI_MODEL_OPTS_H

#include <stdbool.h>
#include <stdint.h>

#include "cli/args.h"
#include "sluice.h"

typedef struct cli_model_opts {
    const char *path; /* -m; NULL: the embedded default model */
    int n_ctx;        /* -c; 0: the session's default */
    int n_batch;      /* -b; 0: the session's default */
    int n_threads;    /* -t; 0: all cores */
} cli_model_opts;

/* Sampling defaults; seed stays CLI_SEED_RANDOM when no --seed was given. */
typedef struct cli_sampling_opts {
    sluice_sampler_params sp;
    uint64_t seed;
} cli_sampling_opts;

#define CLI_SEED_RANDOM UINT64_MAX

void cli_model_opts_init(cli_model_opts *mo);
void cli_sampling_opts_init(cli_sampling_opts *so);

/* Append the group's entries to opts[n..cap) and return the new count, or -1 when cap is too
 * small (a programming error the caller reports). The targets are fields of mo / so. */
int cli_add_model_opts(cli_opt *opts, int n, int cap, cli_model_opts *mo);
int cli_add_sampling_opts(cli_opt *opts, int n, int cap, cli_sampling_opts *so);

/* Range checks after parsing; false after printing "sluice CMD: ..." to stderr. */
bool cli_model_opts_check(const char *cmd, const cli_model_opts *mo);
bool cli_sampling_opts_check(const char *cmd, const cli_sampling_opts *so);

sluice_session_params cli_model_opts_session(const cli_model_opts *mo);

#endif
