/* GPU facts for the planner: device 0's name and memory, through the CUDA backend (CUDA builds
 * only; elsewhere there is no GPU). Kept apart from probe.c so that CPU-only planning never
 * initializes a CUDA context. */
#include <stdio.h>
#include <string.h>

#include "runtime/plan.h"
#ifdef SLUICE_HAVE_CUDA
#include "backends/cuda/backend_cuda.h"
#endif

bool plan_probe_gpu(plan_machine_facts *out) {
    out->gpu = false;
#ifdef SLUICE_HAVE_CUDA
    cuda_device_info info;
    if (!backend_cuda_probe(0, &info)) return false;
    out->gpu = true;
    snprintf(out->gpu_name, sizeof out->gpu_name, "%.63s", info.name);
    out->vram_total = info.mem_total;
    out->vram_free = info.mem_free;
#endif
    return out->gpu;
}
