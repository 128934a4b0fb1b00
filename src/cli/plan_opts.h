/* The memory-plan flags shared by every command that loads a model (run, logits, bench,
 * perplexity, serve): --plan [--json], --resident, --stream, --cache, --mem-budget, --io,
 * --io-depth, --no-prefetch, --verify-reads, and what else concerns loading: --override-kv
 * (metadata overrides), --ngram and --ngram-cache (qwen4exp's n-gram table tier). */
#ifndef SLUICE_CLI_PLAN_OPTS_H
#define SLUICE_CLI_PLAN_OPTS_H

#include <stdbool.h>
#include <stdint.h>

#include "cli/args.h"
#include "sluice.h"

typedef struct cli_plan_opts {
    bool plan, json, resident, stream, no_prefetch, verify_reads, mlock;
    const char *cache;   /* "6G" or "500x" */
    uint64_t mem_budget;
    const char *io;      /* "direct" or "page" */
    int io_depth;
    /* GPU (CUDA builds): --gpu / --backend cuda, --gpu-budget, --gpu-miss, --no-graph,
     * --gpu-profile, --gpus */
    bool gpu, no_graph, gpu_profile;
    const char *backend;  /* "cpu" or "cuda" */
    uint64_t gpu_budget;
    const char *gpu_miss; /* "copy", "zerocopy" or "host" */
    int gpu_host_experts; /* --gpu-host-experts N (with --gpu-miss host) */
    int gpus;             /* --gpus N: expert parallelism over N GPUs (0: off) */
    /* --override-kv KEY=TYPE:VALUE (repeatable, as llama.cpp's); qwen4exp's n-gram table:
     * --ngram auto|resident|disk, --ngram-cache ROWS */
    cli_list override_kv;
    const char *ngram;
    int ngram_cache;
} cli_plan_opts;

/* Append the flags to opts[n..cap); returns the new count or -1 when cap is too small. */
int cli_add_plan_opts(cli_opt *opts, int n, int cap, cli_plan_opts *po);
/* Check the values and fill the model parameters. false after printing the error. */
bool cli_plan_params(const char *cmd, const cli_plan_opts *po, sluice_model_params *mp);
/* For --plan: load the model for planning only, print the plan (table or JSON) to stdout.
 * Returns the exit status (0 when the plan is feasible, 1 when it is refused or fails). */
int cli_print_plan(const char *cmd, const char *model_path, const sluice_model_params *mp,
                   bool json);

#endif
