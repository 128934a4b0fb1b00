/* sluice: inference for Mixture-of-Experts language models from standard GGUF files.
 *
 * Two objects:
 *   sluice_model    immutable after load: weights (views into the mapped file), hyper-parameters,
 *                   tokenizer. Safe to share between sessions.
 *   sluice_session  one timeline: KV cache, position, sampler state, scratch, thread pool.
 *
 * Errors: functions that can fail return NULL or a negative value and leave a one-line cause in
 * sluice_last_error() (per thread).
 */
#ifndef SLUICE_H
#define SLUICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SLUICE_VERSION "0.1.0"

/* The git revision the library was built from ("abc123def456", "+dirty" when modified). */
extern const char sluice_git_rev[];

typedef struct sluice_model sluice_model;
typedef struct sluice_session sluice_session;

/* The calling thread's last error, one line, never NULL. */
const char *sluice_last_error(void);

/* ---- model ---------------------------------------------------------------------------- */

/* How routed experts are held. AUTO lets the planner decide from the measured memory budget. */
typedef enum sluice_mode { SLUICE_MODE_AUTO = 0, SLUICE_MODE_RESIDENT = 1, SLUICE_MODE_STREAM = 2 } sluice_mode;
/* How streamed experts are read: direct I/O (no page cache) or through the page cache. */
typedef enum sluice_io { SLUICE_IO_DIRECT = 0, SLUICE_IO_PAGE = 1 } sluice_io;
/* Where a model's sessions compute: the CPU, or a CUDA GPU (sluice built with CUDA). */
typedef enum sluice_backend { SLUICE_BACKEND_CPU = 0, SLUICE_BACKEND_CUDA = 1 } sluice_backend;
/* GPU streaming: an expert not in the VRAM cache is copied in after routing (COPY: the layer
 * waits for the copy, the expert stays cached), read by the kernels straight from pinned host
 * memory (ZEROCOPY: no wait for routing, hot experts are promoted between steps), or, in decode,
 * computed by the host's cores from host memory while the device computes the rest (HOST: up to
 * gpu_host_experts a layer, the other misses copied; the same bits as the device's). */
typedef enum sluice_gpu_miss {
    SLUICE_GPU_MISS_COPY = 0,
    SLUICE_GPU_MISS_ZEROCOPY = 1,
    SLUICE_GPU_MISS_HOST = 2
} sluice_gpu_miss;

typedef struct sluice_model_params {
    bool verbose;          /* print load details to stderr */
    sluice_mode mode;
    uint64_t mem_budget;   /* bytes the process may use; 0: measured (cgroup, MemAvailable) */
    uint64_t cache_bytes;  /* expert cache size; 0: the planner chooses */
    int cache_experts;     /* expert cache as a number of experts ("Nx"); 0: unused */
    sluice_io io;
    int io_depth;          /* reads in flight; 0: 64 */
    bool no_prefetch;      /* no router-lookahead prefetch */
    bool verify_reads;     /* CRC-check every expert record read from a store */
    int n_ctx;             /* context the plan reserves KV for; 0: trained length, max 4096 */
    int n_batch;           /* prompt tokens per forward pass the plan reserves for; 0: 2048 when
                            * every weight is resident for the CPU and that still fits, else 512 */
    bool plan_only;        /* compute the plan, allocate nothing (for --plan) */
    bool no_watchdog;      /* do not watch swap/pressure (the watchdog stops work cleanly) */
    bool mlock;            /* lock a resident model's pages in RAM (mlock), so that the page
                            * cache never evicts them; the load fails when that is refused */
    /* ---- GPU (CUDA builds; sessions of such a model run on the device) ---- */
    sluice_backend backend;
    uint64_t gpu_budget;   /* device memory the model may use; 0: the free memory */
    sluice_gpu_miss gpu_miss; /* how a streamed expert missing from VRAM is read */
    int gpu_host_experts;  /* HOST: a decode layer's misses the host may compute; 0: 4 */
    bool no_graph;         /* never capture decode steps as CUDA graphs */
    bool gpu_profile;      /* time every device operation (slower); see sluice_gpu_profile */
    int gpus;              /* expert parallelism over NCCL (docs/multi-gpu.md): ranks; 0: off.
                            * This build runs 1 (the EP path on one GPU, bit-identical) */
    /* ---- metadata overrides, as llama.cpp's --override-kv: "KEY=TYPE:VALUE" with TYPE int,
     * float, bool or str (e.g. "qwen4exp.attention.indexer.top_k=int:32"); applied to the
     * file's metadata before the architecture reads it ---- */
    const char *const *override_kv;
    int n_override_kv;
    /* ---- the n-gram table tier (qwen4exp) ---- */
    sluice_mode ngram_mode; /* AUTO: mapped when the whole model fits, else read on demand;
                             * RESIDENT: mapped; STREAM: read on demand */
    int ngram_cache_rows;   /* the on-demand row cache; 0: the planner chooses */
    /* ---- MTP speculative decoding (qwen4exp files with an MTP block) ---- */
    int mtp;                /* drafts per step the sessions reserve for: binds the MTP block and
                             * counts its experts in the plan; 0: off (the block is ignored) */
    int mtp_vocab;          /* a draft chooses among the first mtp_vocab token ids and the
                             * recent context's ids (docs/mtp.md); 0: SLUICE_MTP_VOCAB_DEFAULT,
                             * negative: every id. The tokens never depend on it */
} sluice_model_params;

#define SLUICE_MTP_VOCAB_DEFAULT 32768

sluice_model *sluice_model_load(const char *path, const sluice_model_params *params);
/* Load from bytes that outlive the model (the embedded default model). */
sluice_model *sluice_model_load_memory(const void *data, size_t size, const char *name,
                                       const sluice_model_params *params);
void sluice_model_free(sluice_model *model);

typedef struct sluice_model_info {
    const char *arch;     /* general.architecture */
    const char *name;     /* general.name or the file name */
    int n_vocab;
    int n_ctx_train;
    int n_layer;
    int n_embd;
    int n_expert;         /* 0 for dense models */
    int n_expert_used;
    int64_t n_params;
    uint64_t file_bytes;
    int32_t bos, eos;     /* -1 when absent */
    bool add_bos;         /* the metadata asks for BOS at the start of a prompt */
} sluice_model_info;

void sluice_model_get_info(const sluice_model *model, sluice_model_info *info);

/* The memory plan the model was loaded with: a text table (json=false) or one JSON object.
 * Returns the length (like snprintf). */
int sluice_model_plan(const sluice_model *model, bool json, char *buf, size_t cap);
/* True when the plan is feasible (always, except for plan_only loads). */
bool sluice_model_plan_ok(const sluice_model *model);
/* "resident" or "stream" */
const char *sluice_model_mode(const sluice_model *model);

/* ---- tokenizer ------------------------------------------------------------------------ */

/* Tokenize len bytes of UTF-8. parse_special: recognize special-token text such as
 * "<|im_start|>". add_bos: prepend BOS when the model's metadata asks for it
 * (tokenizer.ggml.add_bos_token, or the tokenizer type's default). Writes up to cap ids and returns
 * the total count (which may exceed cap: call again with a larger buffer), or -1 on error. */
int sluice_tokenize(const sluice_model *model, const char *text, size_t len, bool parse_special,
                    bool add_bos, int32_t *ids, int cap);

/* The text of one token as raw bytes (possibly a partial UTF-8 sequence). Control tokens give ""
 * unless render_special. Returns the byte count (may exceed cap; nothing past cap is written). */
int sluice_token_to_piece(const sluice_model *model, int32_t id, bool render_special, char *buf,
                          int cap);

/* True for end-of-generation tokens (eos, eot, <|im_end|>, ...). */
bool sluice_token_is_eog(const sluice_model *model, int32_t id);

/* ---- chat ----------------------------------------------------------------------------- */

/* The message framing a front end should render. sluice does not run the Jinja template; it
 * recognizes the families it implements. */
typedef enum sluice_chat_format {
    SLUICE_CHAT_NONE = 0,   /* no known template (stories260K): concatenate the message texts */
    SLUICE_CHAT_CHATML = 1, /* <|im_start|>role\ncontent<|im_end|>\n (Qwen) */
} sluice_chat_format;

/* tokenizer.chat_template (Jinja source) as stored in the file. Copies min(length, cap - 1)
 * bytes and a NUL to buf (when cap > 0) and returns the full length, or -1 when the file has
 * none. */
int sluice_model_chat_template(const sluice_model *model, char *buf, int cap);
/* The template's family; a file without a template whose vocabulary has <|im_start|> and
 * <|im_end|> tokens counts as ChatML (llama.cpp's default template is ChatML too). */
sluice_chat_format sluice_model_chat_format(const sluice_model *model);

/* ---- session -------------------------------------------------------------------------- */

typedef struct sluice_session_params {
    int n_ctx;     /* positions the KV cache holds; 0: the model's trained length, capped at 4096 */
    int n_batch;   /* tokens per forward pass when evaluating a prompt; 0: the model plan's */
    int n_threads; /* 0: all online cores */
} sluice_session_params;

sluice_session *sluice_session_new(const sluice_model *model, const sluice_session_params *params);
void sluice_session_free(sluice_session *session);

/* Evaluate n tokens at the current position as one batch (split into n_batch chunks).
 * all_logits, when not NULL, receives [n][n_vocab] floats: the logits of every position.
 * The last position's logits are always kept for sampling. Returns 0 or -1. */
int sluice_session_eval(sluice_session *session, const int32_t *tokens, int n, float *all_logits);

const float *sluice_session_logits(const sluice_session *session); /* last position, n_vocab */
int sluice_session_pos(const sluice_session *session);
int sluice_session_n_ctx(const sluice_session *session);
void sluice_session_reset(sluice_session *session);
/* Keep the first n evaluated positions (0 <= n <= pos) and forget the rest, so that a prompt
 * sharing a prefix with what was evaluated needs only its remainder (the server's KV-cache
 * reuse). Attention-only models can always; a model with recurrent state (hybrid) cannot roll
 * it back and returns -1 unless n is 0 (a reset) or pos (nothing to do). The last logits are
 * kept only when n == pos. */
int sluice_session_truncate(sluice_session *session, int n);

/* Bytes held by the session's KV cache (and recurrent state, for hybrid models). */
uint64_t sluice_session_state_bytes(const sluice_session *session);
/* The same bytes split into the KV cache (grows with the context) and the recurrent state of
 * linear-attention layers (fixed per session; 0 for attention-only models). */
void sluice_session_state_breakdown(const sluice_session *session, uint64_t *kv_bytes,
                                    uint64_t *recurrent_bytes);

/* True once the memory watchdog stopped work (swap-out, memory pressure, the cgroup limit, the
 * free-memory floor); why receives the cause. Evaluation fails from then on. */
bool sluice_watchdog_tripped(char *why, size_t cap);

/* ---- observation ---------------------------------------------------------------------- */

/* Called for every token of every MoE layer with the experts the router chose (in slot order)
 * and their weights. Used by routing traces; must not call back into the session. */
typedef void (*sluice_route_fn)(void *ctx, int layer, int pos, int k, const int32_t *experts,
                                const float *weights);
void sluice_session_set_route_callback(sluice_session *session, sluice_route_fn fn, void *ctx);

/* Expert-store counters since load (the store is shared by the model's sessions). */
typedef struct sluice_expert_stats {
    uint64_t acquires;       /* expert uses by the MoE layers */
    uint64_t hits, misses;   /* cache outcome of each acquire (resident: all hits) */
    uint64_t evictions;
    uint64_t bytes_read;     /* from storage */
    uint64_t reads;          /* read requests issued */
    double io_wait_s;        /* time compute waited for reads */
    uint64_t prefetch_issued, prefetch_used;
    uint64_t host_computed;  /* GPU streaming (--gpu-miss host): misses the host's cores computed
                              * from host memory instead of copying them (also counted in misses) */
} sluice_expert_stats;
void sluice_model_expert_stats(const sluice_model *model, sluice_expert_stats *stats);

/* N-gram table counters since load (qwen4exp; all zero for other models). */
typedef struct sluice_ngram_stats {
    bool on_demand;          /* rows read from storage (else from the mapped file) */
    uint64_t lookups, hits, misses; /* rows gathered; found ready; not requested in advance */
    uint64_t prefetched;     /* rows whose read started before the n-gram layer needed them */
    uint64_t reads, bytes_read, evictions;
    uint64_t stalls;         /* times the n-gram layer waited for a read */
    double stall_s;          /* and for how long */
    uint64_t gathers;        /* forward passes that used the table */
} sluice_ngram_stats;
void sluice_model_ngram_stats(const sluice_model *model, sluice_ngram_stats *stats);

/* ---- sampling ------------------------------------------------------------------------- */

typedef struct sluice_sampler_params {
    float temperature;    /* <= 0: greedy (argmax) */
    int top_k;            /* <= 0: off */
    float top_p;          /* >= 1: off */
    float min_p;          /* <= 0: off */
    float repeat_penalty; /* 1: off */
    int repeat_last_n;    /* tokens of history the penalty looks at */
    uint64_t seed;
} sluice_sampler_params;

sluice_sampler_params sluice_sampler_defaults(void);
/* The greedy pick: the index of the largest of x[0..n), the lowest on ties (NaNs never win
 * unless x[0] is one). */
int32_t sluice_argmax(const float *x, int n);
/* sluice_argmax of the session's last logits (-1: none). A GPU session computes it on the
 * device as part of a decode step, so that the host need not read the logits row for it. */
int32_t sluice_session_argmax(const sluice_session *session);
void sluice_session_set_sampler(sluice_session *session, const sluice_sampler_params *params);
/* Pick the next token from the last logits; records it in the penalty history. */
int32_t sluice_session_sample(sluice_session *session);
/* Record a token in the penalty history without sampling it (prompt tokens). */
void sluice_session_accept(sluice_session *session, int32_t id);

/* ---- speculative decoding (MTP) ------------------------------------------------------- */

/* Greedy decoding with the model's own MTP block drafting (qwen4exp files with an MTP block,
 * loaded with sluice_model_params.mtp > 0). The tokens and the logits of every evaluated token
 * are bit-identical to plain greedy decoding (argmax, ties to the lowest id), for any draft
 * length: drafts are verified in one batch and the state is rolled back past the first
 * rejected one. */
typedef struct sluice_spec_stats {
    uint64_t steps;     /* steps (verification passes and plain steps) */
    uint64_t drafted;   /* draft tokens proposed */
    uint64_t accepted;  /* of them, accepted */
    uint64_t plain;     /* of the steps, those the adaptive policy took without drafts */
    uint64_t shadowed;  /* of the plain steps, those that made one draft beside the token and
                         * checked it (acceptance measured without verifying; not in drafted) */
    uint64_t shadow_hits; /* of their drafts, those that equalled the token that followed */
} sluice_spec_stats;

/* How steps choose their drafts. SLUICE_SPEC_ADAPTIVE (the default) drafts only while it pays:
 * every step is timed, and while drafted steps give fewer tokens per second than plain ones
 * (low acceptance, or a verification pass that reads many more experts than one token does),
 * steps go without drafts for a pause (8 steps, doubling to 128 while drafting keeps losing).
 * The session's first steps and each pause's last two are shadow steps (one draft made and
 * checked beside a plain step, no verification); where none of their drafts hits, a longer
 * pause follows at once, else drafted steps measure again. SLUICE_SPEC_ALWAYS drafts n_draft
 * every step.
 * The tokens and logits are the same either way; only the speed and the stats differ. */
typedef enum { SLUICE_SPEC_ADAPTIVE = 0, SLUICE_SPEC_ALWAYS = 1 } sluice_spec_policy;
void sluice_session_set_spec_policy(sluice_session *session, sluice_spec_policy policy);

/* MTP blocks the model was loaded with (0: none, or loaded with mtp 0). */
int sluice_model_mtp_blocks(const sluice_model *model);
/* One step, after a prompt (or a step) left logits: g = argmax(logits) is evaluated together
 * with up to n_draft drafts (fewer near max_tokens, the context end, the batch size or the
 * model's params.mtp); the accepted prefix is kept. fed receives the k >= 1 evaluated tokens
 * (fed[0] = g), logits (may be NULL) their [k][n_vocab] logit rows; the session's logits are
 * then those after fed[k-1]. Returns k (<= max_tokens), or -1. stats (may be NULL) accumulates. */
int sluice_session_spec_step(sluice_session *session, int n_draft, int max_tokens, int32_t *fed,
                             float *logits, sluice_spec_stats *stats);
/* Measurement: fn replaces each draft (the block's proposal for position pos) by the token it
 * returns before the verification pass, so that a run can be timed at a chosen acceptance
 * (sluice bench --mtp-accept). The drafts are still made, and the output never depends on the
 * hook: a draft only decides what is verified. NULL: the block's own drafts. */
typedef int32_t (*sluice_draft_fn)(void *ctx, int pos, int32_t proposed);
void sluice_session_set_draft_hook(sluice_session *session, sluice_draft_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_H */
