/* How a loaded model's file mapping is brought into memory: read in at load (resident), the
 * dense tensors read in and the experts kept out of the page cache (streamed), or locked
 * (--mlock). engine/model.c calls these once the plan is bound. */
#ifndef SLUICE_ENGINE_MODEL_MAPPING_H
#define SLUICE_ENGINE_MODEL_MAPPING_H

#include "models/model.h"

typedef struct byte_range {
    uint64_t a, b; /* [a, b), file offsets */
} byte_range;

/* The file's routed-expert bytes as sorted, disjoint ranges: per layer the expert-major
 * records, or each part's stacked tensor (a fused gate_up tensor gives two overlapping part
 * ranges; they are merged). *n = the count; NULL with *n = 0 when out of memory. */
byte_range *model_expert_ranges(const expert_layout *l, int *n);
/* True when [off, off + bytes) lies in one of the ranges. */
bool model_in_experts(const byte_range *r, int n, uint64_t off, uint64_t bytes);

/* Streamed: the mapping random-access, its dense tensors read in (CPU plans only). */
void model_mapping_advise_stream(const sluice_model *m);
/* Resident on the CPU: the whole file read in, before the first token. */
void model_mapping_populate_resident(const sluice_model *m);
/* --mlock: lock a resident model's pages in RAM. 0, or -1 with the error set. */
int model_mapping_lock(const sluice_model *m, const char *label);

#endif
