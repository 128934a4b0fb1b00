/* GPU expert store (runtime/experts_gpu.c): keeps a device backend's expert table current,
 * resident (a device copy of the file) or streamed (a VRAM slot cache over pinned host
 * memory, misses copied in per layer or read in place). */
#ifndef SLUICE_EXPERTS_GPU_H
#define SLUICE_EXPERTS_GPU_H

#include "backends/backend.h"
#include "runtime/experts.h"

typedef struct gpu_store_params {
    backend *be;                 /* a backend with an expert table (be_has_expert_table) */
    const expert_layout *layout; /* must outlive the store */
    const uint8_t *file;         /* the mapped file (weights_map'ed: uploaded or pinned) */
    bool resident;               /* the backend holds a device copy of the whole file */
    uint64_t cache_bytes;        /* stream: VRAM slot pool */
    bool zerocopy;               /* stream: decode reads misses from pinned memory */
    int promote_max;             /* zerocopy: promotions per layer and step (0: 16) */
    bool promote_wait;           /* zerocopy: the next step waits for the promotions' copies
                                  * and reads the slots (else it runs beside the copies and
                                  * still reads host memory; the step after reads the slots) */
    int host_max;                /* copy path: a decode layer's misses the host may compute
                                  * (moe_experts_host) instead of copying them; 0: none */
    int look_max;                /* copy path: router-lookahead copies per layer; 0: no limit */
    bool victim_scan;            /* choose victims by a pass over every slot, not the heap (the
                                  * same choices; tests compare the two) */
} gpu_store_params;

/* Bytes of one VRAM slot (the largest expert, parts 256-byte aligned). */
uint64_t expert_gpu_slot_bytes(const expert_layout *layout);

expert_store *expert_store_gpu_new(const gpu_store_params *p, char *err, size_t err_len);
int expert_store_gpu_slots(const expert_store *s);

#endif
