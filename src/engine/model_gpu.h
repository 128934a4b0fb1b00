/* The GPU side of a model (engine/model_gpu.c): device facts for the planner, binding the
 * weights and experts to the CUDA backend, releasing it. */
#ifndef SLUICE_MODEL_GPU_H
#define SLUICE_MODEL_GPU_H

#include "models/model.h"

/* The facts plan_compute_gpu needs beyond the CPU's (device scratch, slot size). */
void model_gpu_facts(const sluice_model *m, plan_model_facts *f);
/* Plan the device side, create the backend (m->gpu), place the weights, create the expert
 * store. 0, or -1 with the error set. */
int model_gpu_bind(sluice_model *m, const char *label);
/* Free the backend (after the expert store); prints the op profile when it was asked for. */
void model_gpu_release(sluice_model *m);

#endif
