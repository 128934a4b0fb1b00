/* The AUTO memory planner: a pure function from model facts, machine facts and a request to a
 * plan (mode, every component in bytes, cache size, reason), plus a probe that reads the
 * machine facts. Pure so that it is unit-tested with synthetic machines; the probe is the only
 * part that reads /sys and /proc.
 *
 * Accounting. In resident mode the whole file is mapped and counts (page cache is charged to
 * the memory cgroup). In stream mode the dense tensors are mapped and count, the expert cache is
 * anonymous memory of cache_slots x slot_bytes, and expert reads bypass the page cache (direct
 * I/O). Both modes add the KV cache for the planned context, recurrent state, activation
 * scratch, a fixed allowance for the process (tokenizer, code, stacks) and a reserve. */
#ifndef SLUICE_PLAN_H
#define SLUICE_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

typedef struct plan_model_facts {
    uint64_t file_bytes;
    uint64_t dense_bytes;        /* every tensor but the routed experts */
    uint64_t expert_bytes;       /* all routed experts as stored */
    uint64_t slot_bytes;         /* one cache slot (largest expert + alignment slack) */
    int n_moe_layers, n_expert, n_expert_used;
    uint64_t kv_bytes_per_pos;   /* KV cache bytes per context position */
    uint64_t state_bytes;        /* recurrent + conv state (independent of context) */
    uint64_t scratch_per_token;  /* activation bytes per token of a batch */
    uint64_t scratch_fixed;      /* activation bytes independent of the batch (logits...) */
    /* the n-gram table (qwen4exp), a third tier: mapped with the weights (resident) or read
     * on demand into a row cache; 0 when the model has none. Part of dense_bytes. */
    uint64_t ngram_bytes;
    uint64_t ngram_row_bytes;
    int ngram_rows_per_token;
    /* device (CUDA) work memory beyond the activations: per token of a batch (MoE
     * intermediates, encoded activations) and fixed (logit rows, code books, graphs); one VRAM
     * expert slot (runtime/plan_gpu.c) */
    uint64_t gpu_scratch_per_token, gpu_scratch_fixed;
    uint64_t gpu_slot_bytes;
    /* streamed on the device only: the router lookahead's folded routers (models/moe.c
     * moe_lookahead_bind), kept in VRAM with the dense tensors */
    uint64_t gpu_look_bytes;
    /* streamed on the device only: dense tensors the device reads from page-locked host memory
     * instead of VRAM (the token embeddings: one row a token), part of dense_bytes */
    uint64_t gpu_host_dense_bytes;
} plan_model_facts;

typedef struct plan_machine_facts {
    bool has_cgroup_limit;
    int cgroup_version;          /* 1 or 2 */
    uint64_t cgroup_limit;       /* memory.max / memory.limit_in_bytes */
    uint64_t cgroup_usage;       /* memory.current / memory.usage_in_bytes */
    uint64_t cgroup_reclaimable; /* inactive file pages counted in usage */
    uint64_t mem_total, mem_available, swap_total;
    /* the GPU (plan_probe_gpu; absent unless a CUDA device was asked for and found) */
    bool gpu;
    char gpu_name[64];
    uint64_t vram_total, vram_free;
} plan_machine_facts;

typedef struct plan_request {
    sluice_mode mode;            /* AUTO, RESIDENT, STREAM */
    uint64_t mem_budget;         /* 0: from the machine facts */
    uint64_t cache_bytes;        /* 0: the planner chooses */
    int cache_slots;             /* "Nx": a number of expert slots; 0: unused */
    sluice_mode ngram_mode;      /* the n-gram table: AUTO, RESIDENT (mapped), STREAM (on demand) */
    int ngram_cache_rows;        /* its row cache when on demand; 0: the planner chooses */
    int io_depth;                /* reads in flight (sizes the table's staging); 0: 64 */
    int n_ctx, n_batch;
    /* GPU: compute on the device; its memory budget (0: the free memory); zero-copy misses */
    bool gpu;
    uint64_t gpu_budget;
    bool gpu_zerocopy;
} plan_request;

typedef enum plan_reason {
    PLAN_RESIDENT_FITS = 0,      /* everything fits in the budget */
    PLAN_RESIDENT_FORCED,        /* --resident, and it fits */
    PLAN_STREAM_OVER_BUDGET,     /* the model does not fit: experts stream */
    PLAN_STREAM_FORCED,          /* --stream */
    PLAN_STREAM_CACHE_GIVEN,     /* --cache set the cache size */
    PLAN_DENSE_MODEL,            /* no routed experts: resident is the only mode */
    PLAN_REFUSED_BELOW_FLOOR,    /* not even the smallest cache fits */
    PLAN_REFUSED_RESIDENT,       /* --resident does not fit */
    PLAN_REFUSED_CACHE,          /* --cache below the floor or above the budget */
} plan_reason;

typedef struct plan {
    bool ok;
    sluice_mode mode;            /* RESIDENT or STREAM */
    plan_reason reason;
    uint64_t budget;             /* what the process may use */
    const char *budget_source;   /* "--mem-budget", "cgroup v1", "cgroup v2", "MemAvailable" */
    uint64_t reserve;            /* kept free inside the budget */
    /* components */
    uint64_t weights;            /* resident: the whole file; stream: dense tensors */
    uint64_t cache;              /* stream: cache_slots x slot_bytes */
    uint64_t kv, state, scratch, overhead;
    uint64_t total;              /* sum of the components */
    int cache_slots, floor_slots, target_slots;
    int n_ctx, n_batch;
    /* the n-gram table tier: mapped (its bytes are in weights) or on demand (ngram_cache) */
    bool ngram_resident;
    int ngram_cache_rows;
    uint64_t ngram_cache;        /* row cache, index and read staging */
    char message[320];           /* why, in one line */
    /* GPU (request.gpu; runtime/plan_gpu.c): where the weights live on the device. gpu_mode
     * resident: every weight in VRAM; stream: dense weights in VRAM and a VRAM expert cache
     * over the file pinned in host memory. */
    bool gpu, gpu_ok;
    sluice_mode gpu_mode;
    int gpu_reason;              /* enum plan_gpu_reason */
    uint64_t gpu_budget;         /* device bytes the model may use */
    const char *gpu_budget_source; /* "--gpu-budget", "free VRAM" */
    uint64_t gpu_reserve;
    uint64_t vram_weights, vram_cache, vram_kv, vram_scratch, vram_total;
    int gpu_slots, gpu_floor_slots;
    uint64_t pinned;             /* host bytes pinned for the device to read (stream) */
    char gpu_message[320];
} plan;

/* Fixed allowance for the process itself (code, tokenizer, stacks, allocator slack). */
#define PLAN_OVERHEAD_BYTES (192ull << 20)

void plan_compute(const plan_model_facts *m, const plan_machine_facts *mc,
                  const plan_request *r, plan *out);

/* Read the machine facts of this process (cgroup v2 or v1, /proc/meminfo). */
void plan_probe(plan_machine_facts *out);

/* ---- the device side (runtime/plan_gpu.c) ---- */
typedef enum plan_gpu_reason {
    PLAN_GPU_RESIDENT_FITS = 0,  /* every weight fits in the device budget */
    PLAN_GPU_RESIDENT_FORCED,    /* --resident, and it fits */
    PLAN_GPU_STREAM_OVER_BUDGET, /* the weights do not fit: a VRAM expert cache */
    PLAN_GPU_STREAM_FORCED,      /* --stream */
    PLAN_GPU_REFUSED_DEVICE,     /* no usable device */
    PLAN_GPU_REFUSED_RESIDENT,   /* --resident does not fit */
    PLAN_GPU_REFUSED_FLOOR,      /* not even one layer's experts fit in the VRAM cache */
    PLAN_GPU_REFUSED_PINNED,     /* streaming needs the file in host memory, and it does not fit */
} plan_gpu_reason;

/* Pure, like plan_compute, whose result (the host budget) it reads: fills the gpu fields of p
 * (gpu_ok false with gpu_message when refused). */
void plan_compute_gpu(const plan_model_facts *m, const plan_machine_facts *mc,
                      const plan_request *r, plan *p);
const char *plan_gpu_reason_name(int r);
/* The device part of the plan: table lines, or a JSON object (the value of "gpu"). */
int plan_format_gpu(const plan *p, const plan_model_facts *m, bool json, char *buf, size_t cap);
/* Add the GPU's facts (CUDA builds: device 0's name, total and free memory); false when none. */
bool plan_probe_gpu(plan_machine_facts *out);

const char *plan_reason_name(plan_reason r);
/* The plan as an aligned text table, or as one JSON object. Returns bytes written (like
 * snprintf: may exceed cap). */
int plan_format(const plan *p, const plan_model_facts *m, bool json, char *buf, size_t cap);

#endif /* SLUICE_PLAN_H */
