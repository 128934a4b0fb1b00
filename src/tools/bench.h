/* sluice bench: llama-bench-style measurements with exact evidence.
 *
 * One run = a reset session (one session per context size, reused as llama-bench reuses its
 * context: a GPU decode graph captured in the warmup is replayed, not recaptured), a prompt of n_prompt tokens evaluated in chunks (prefill), then
 * n_gen greedy decode steps. Timed: the prefill (and the first argmax: TTFT) and every decode
 * step (eval + argmax: TPOT). Not timed: copying the logits of the last prompt position and of
 * every decode step, hashing them, writing evidence files.
 *
 * Evidence: logit rows L0..Ln (L0 = last prompt position, Li = after the i-th generated token)
 * as little-endian float32 [n_gen+1][n_vocab]; tokens = the prompt ids then g1..g(n+1), where
 * g(i+1) = argmax(Li) (ties: lowest id), as little-endian int32. Their SHA-256 go into the run
 * record, so equal hashes mean bit-identical outputs.
 *
 * With MTP (bench_params.mtp) a decode step is a speculative step that emits one or more tokens;
 * each emitted token is charged the step's time divided by the tokens it emitted (TPOT), and the
 * evidence is the same rows and tokens as plain greedy decoding (equal hashes prove it).
 * mtp_accept times MTP at a chosen acceptance: an untimed plain greedy run of the same prompt
 * first records the continuation, and each draft of the timed run is replaced by that run's
 * token at its position with probability mtp_accept (a fixed pseudo-random choice per
 * position), else left as the block drafted it; the drafts are still made, so the run pays
 * every cost of MTP, and the evidence is unchanged. */
#ifndef SLUICE_BENCH_H
#define SLUICE_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sluice.h"

#define BENCH_MAX_PROMPTS 16

typedef struct bench_params {
    const char *model_path;     /* for the record and the model hash (NULL: embedded model) */
    int n_prompt[BENCH_MAX_PROMPTS];
    int n_prompts;
    int n_gen;
    int reps;
    int n_batch;                /* prefill chunk; 0: the session default */
    int n_threads;              /* 0: all cores */
    int n_ctx;                  /* 0: tight (prompt + generated) */
    uint64_t seed;              /* synthetic prompt tokens */
    const char *prompt_file;    /* NULL: synthetic tokens */
    const char *evidence_dir;   /* NULL: hashes only */
    const char *trace_path;     /* NULL: no routing trace */
    bool hash_model;            /* full SHA-256 of the model file instead of the fast one */
    bool warmup;                /* one short untimed run first */
    int mtp;                    /* > 0: decode by MTP speculative steps of this many drafts (the
                                 * model loaded with params.mtp); the evidence is unchanged */
    bool mtp_always;            /* draft every step (SLUICE_SPEC_ALWAYS), not adaptively */
    bool mtp_oracle;            /* a measured run at acceptance mtp_accept (the oracle above): */
    float mtp_accept;           /* each draft becomes the plain greedy run's token with this
                                 * probability; mtp_oracle false: the block's own drafts */
} bench_params;

typedef struct bench_stats {
    uint64_t acquires, hits, misses, evictions, bytes_read, reads, prefetch_issued, prefetch_used, host_computed;
    double io_wait_s;
} bench_stats;

typedef struct bench_run {
    int n_prompt, n_gen, rep;
    double prefill_s, ttft_s, decode_s;
    double tpot_p50, tpot_p95, tpot_p99, tpot_mean; /* seconds */
    uint64_t peak_rss;
    bool peak_rss_per_run;                           /* false: process peak so far */
    bench_stats prefill, decode;
    uint64_t unique_expert_bytes;                    /* distinct experts used x expert size */
    double read_amplification;                       /* bytes read / unique_expert_bytes */
    uint64_t spec_steps, spec_drafted, spec_accepted; /* MTP: steps, drafts, accepted */
    uint64_t spec_plain;                              /* MTP: steps the policy took plain */
    uint64_t spec_shadowed, spec_shadow_hits;         /* MTP: of those, shadow steps; their hits */
    char logits_sha[65], tokens_sha[65];
    char logits_file[512], tokens_file[512];
} bench_run;

typedef struct bench_result {
    bench_run *runs;
    int n_runs;
    char model_sha[65];
    bool model_hash_full;
    uint64_t model_bytes;
    uint64_t expert_bytes;
    int prompts_skipped;        /* prompt lengths beyond the model's context */
} bench_result;

/* Run every (prompt length, repetition). Progress lines go to log. -1 with err on failure. */
int bench_execute(sluice_model *m, const bench_params *bp, bench_result *res, FILE *log,
                  char *err, size_t err_len);
void bench_result_free(bench_result *res);

/* Reports. */
void bench_print_markdown(FILE *out, const sluice_model *m, const bench_params *bp,
                          const bench_result *res);
void bench_print_csv(FILE *out, const sluice_model *m, const bench_params *bp,
                     const bench_result *res);
/* The full run record as JSON text (malloc'd), NULL on failure. */
char *bench_json(const sluice_model *m, const bench_params *bp, const bench_result *res);

#endif
