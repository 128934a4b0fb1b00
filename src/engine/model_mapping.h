/* How a loaded model's file mapping is brought into memory: read in at load (resident), the
 * dense tensors read in and the experts kept out of the page cache (streamed), or locked
 * (--mlock). engine/model.c calls these once the plan is bound. */
#ifndef SLUICE_ENGINE_MODEL_MAPPING_H
#define SLUICE_ENGINE_MODEL_MAPPING_H

#include "models/model.h"

/* Streamed: the mapping random-access, its dense tensors read in (CPU plans only). */
void model_mapping_advise_stream(const sluice_model *m);
/* Resident on the CPU: the whole file read in, before the first token. */
void model_mapping_populate_resident(const sluice_model *m);
/* --mlock: lock a resident model's pages in RAM. 0, or -1 with the error set. */
int model_mapping_lock(const sluice_model *m, const char *label);

#endif
