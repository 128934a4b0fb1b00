/* The expert store: the only way model code reaches routed-expert weights.
 *
 *   expert_acquire(store, layer, expert, &views)  -> gate/up/down matrices of one expert
 *   expert_release(store, layer, expert)
 *
 * The resident store returns views into the mapped model file. A streaming store returns cache
 * slots filled by direct reads. MoE code cannot tell them apart, which is what makes resident
 * and streamed runs bit-identical. Views stay valid until released; an acquired expert is
 * pinned (never evicted) until then. */
#ifndef SLUICE_EXPERTS_H
#define SLUICE_EXPERTS_H

#include "backends/backend.h"
#include "formats/store.h"
#include "sluice.h"

typedef struct expert_views {
    tview gate; /* [n_embd] -> [n_ff_exp] */
    tview up;   /* [n_embd] -> [n_ff_exp] */
    tview down; /* [n_ff_exp] -> [n_embd] */
} expert_views;

typedef struct expert_store expert_store;

typedef struct expert_store_ops {
    const char *name;
    /* 0, or -1 with sluice_last_error() set (I/O failure of a streaming store). */
    int (*acquire)(expert_store *s, int layer, int expert, expert_views *out);
    void (*release)(expert_store *s, int layer, int expert);
    /* Start reading experts that will be acquired soon (may be NULL: nothing to do). demand:
     * they are needed by the layer being computed and are protected from eviction until
     * acquired and released; otherwise a speculative hint that evicts nothing in demand. */
    void (*prefetch)(expert_store *s, int layer, const int32_t *experts, int n, bool demand);
    void (*free)(expert_store *s);
    /* After a forward pass: the experts layer `layer` used (n entries, repeats allowed). A
     * store that keeps a device expert table current without the host in the loop (zero-copy
     * misses) counts hits and promotes hot experts here. May be NULL. 0 or -1. */
    int (*observe)(expert_store *s, int layer, const int32_t *experts, int n);
    /* May be NULL. A demand prefetch (as prefetch with demand) that leaves up to `max` of the
     * missing experts in host memory for the host to compute (a device backend's
     * moe_experts_host); their acquires then succeed without a copy. Returns how many it left. */
    int (*prefetch_host)(expert_store *s, int layer, const int32_t *experts, int n, int max);
    /* May be NULL (every expert is there at once). Whether acquire would return without
     * waiting: the expert is in memory, its reads complete. Never blocks, starts no read. */
    bool (*ready)(expert_store *s, int layer, int expert);
} expert_store_ops;

struct expert_store {
    const expert_store_ops *ops;
    int n_layer;
    int n_expert;
    bool streaming;    /* reads from storage (or host memory): worth prefetching */
    bool device_table; /* keeps a device backend's expert table current (experts_gpu.c) */
    bool per_layer;    /* with device_table: each layer's experts must be acquired before the
                        * backend reads the table (the slots are filled then) */
    int host_max;      /* with prefetch_host: a decode layer's misses the host may compute */
    sluice_expert_stats stats;
};

/* A 2-D view of one expert's part whose bytes are at data. */
tview expert_part_view(const expert_part *p, const void *data);

/* Views into the mapped file (base = the file's first byte). */
expert_store *expert_store_resident_new(const expert_layout *layout, const uint8_t *base);

typedef struct stream_params {
    const char *path;
    const expert_layout *layout; /* must outlive the store */
    uint64_t cache_bytes;        /* slot pool size (a hard ceiling) */
    int io_mode;                 /* enum io_mode */
    int io_depth;                /* reads in flight; 0: expert_io_depth */
    bool verify_reads;           /* CRC-check each record read (expert-major stores) */
} stream_params;

/* Bytes of one cache slot for this layout (the largest expert plus alignment slack). */
uint64_t expert_slot_bytes(const expert_layout *layout);

/* Reads in flight when stream_params.io_depth is 0: a prefill layer's reads when it touches every
 * expert, and the next layer's lookahead (2 * EXPERT_PARTS * n_expert), 64 to 1024. With 64, a
 * 512-token prefill of the 35B-A3B shape (~700 reads a layer) blocked in io_submit until all
 * but 64 of the lookahead's reads had completed, so the reads ran before the layer's products
 * instead of beside them: pp512 at a 12 GB cache 62 -> 67 t/s, CPU busy 122-132% -> 145-146%
 * (bench/results/2026-12-03-stream-expert-sets.md). */
int expert_io_depth(int n_expert);

/* Experts read from storage into a slot pool of cache_bytes. NULL with err on failure. */
expert_store *expert_store_stream_new(const stream_params *p, char *err, size_t err_len);

static inline int expert_acquire(expert_store *s, int layer, int expert, expert_views *out) {
    return s->ops->acquire(s, layer, expert, out);
}
static inline void expert_release(expert_store *s, int layer, int expert) {
    s->ops->release(s, layer, expert);
}
static inline void expert_prefetch(expert_store *s, int layer, const int32_t *experts, int n,
                                   bool demand) {
    if (s->ops->prefetch) s->ops->prefetch(s, layer, experts, n, demand);
}
static inline bool expert_ready(expert_store *s, int layer, int expert) {
    return !s->ops->ready || s->ops->ready(s, layer, expert);
}
static inline void expert_store_free(expert_store *s) {
    if (s) s->ops->free(s);
}

#endif /* SLUICE_EXPERTS_H */
