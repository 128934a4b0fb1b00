/* A model on the GPU: the device side of the memory plan, the CUDA backend that holds the
 * weights, and the GPU expert store (runtime/experts_gpu.c).
 *
 * Resident: the whole mapped file is uploaded (views into it are translated by the backend).
 * Stream: the routed experts are copied into page-locked host memory (the device reads misses
 * there), and so are the token embeddings (the embedding kernel reads its rows there); the other
 * dense tensors are uploaded, and routed experts go through a VRAM cache whose slots
 * the expert table points at (misses point at the page-locked copy). Buffers the loader made itself (converted norms, conv
 * taps) are uploaded by the backend the first time an op meets them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/error.h"
#include "engine/model_gpu.h"
#include "engine/model_mapping.h"
#include "models/model.h"
#include "models/state.h"
#include "runtime/experts_gpu.h"
#ifdef SLUICE_HAVE_CUDA
#include <time.h>

#include "backends/cuda/backend_cuda.h"
#include "backends/cuda/cuda_ep.h"
#include "runtime/ep_placement.h"
#endif

/* Device work memory per batch token beyond the CPU's activations: MoE intermediates (gate, up,
 * hidden per slot, each slot's output), encoded activations, attention split partials. */
void model_gpu_facts(const sluice_model *m, plan_model_facts *f) {
    const hparams *hp = &m->hp;
    const uint64_t E = (uint64_t)hp->n_embd, F = (uint64_t)hp->n_ff_exp;
    const uint64_t k = (uint64_t)(hp->n_expert_used > 0 ? hp->n_expert_used : 0);
    const uint64_t ff = (uint64_t)(hp->n_ff > hp->n_ff_shexp ? hp->n_ff : hp->n_ff_shexp);
    f->gpu_scratch_per_token = 4 * k * (3 * F + E) + 2 * (k * F + 4 * E + 2 * ff) + 8 * ff;
    f->gpu_scratch_fixed = (64ull << 20) + (uint64_t)hp->n_layer * 8 * 64 * 4;
    f->gpu_slot_bytes = expert_gpu_slot_bytes(&m->layout);
    /* --gpus (cuda_ep.cu): rows sent, outputs returned and rows received per slot */
    if (m->params.gpus > 0) f->gpu_scratch_per_token += 4 * k * (3 * E + 2);
    /* streamed with misses copied after routing: the router lookahead's folded routers */
    if (m->params.gpu_miss != SLUICE_GPU_MISS_ZEROCOPY && !m->params.no_prefetch)
        f->gpu_look_bytes = moe_lookahead_bytes(m);
    /* streamed: the token embeddings stay in page-locked host memory, where the embedding kernel
     * reads a token's row over the bus (a few KiB a token; llama.cpp keeps them on the host too),
     * and their VRAM goes to the expert cache. Not when the output head shares them.
     * SLUICE_GPU_EMBED_VRAM=1 keeps them in VRAM (a measurement switch). */
    const char *ev = getenv("SLUICE_GPU_EMBED_VRAM");
    if (m->tok_embd.data && m->tok_embd.data != m->output.data && !(ev && atoi(ev) > 0))
        f->gpu_host_dense_bytes = m->tok_embd.mat_bytes;
}

#ifndef SLUICE_HAVE_CUDA

int model_gpu_bind(sluice_model *m, const char *label) {
    (void)m;
    sluice_set_error("%s: this sluice was built without the CUDA backend", label);
    return -1;
}

void model_gpu_release(sluice_model *m) { (void)m; }

#else

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Stream mode: the routed experts get a page-locked host copy (misses are read from it), the
 * dense tensors a device copy. */
static int map_streamed(sluice_model *m, const char *label) {
    const void *host_dense = m->facts.gpu_host_dense_bytes ? m->tok_embd.data : NULL;
    backend *be = m->gpu;
    const uint8_t *base = m->gguf->base;
    int n = 0;
    byte_range *r = model_expert_ranges(&m->layout, &n);
    if (!r) {
        sluice_set_error("%s: out of memory", label);
        return -1;
    }
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += r[i].b - r[i].a;
    const bool say = total >= (1ull << 30);
    const double t0 = now_s();
    if (say)
        fprintf(stderr, "sluice: copying %.2f GiB of routed experts into page-locked host memory ...\n",
                total / 1073741824.0);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (be->ops->weights_map(be, base + r[i].a, r[i].b - r[i].a, false) != 0) {
            sluice_set_error("%s: cannot allocate %llu bytes of page-locked host memory for the "
                             "routed experts", label, (unsigned long long)(r[i].b - r[i].a));
            rc = -1;
        }
    }
    if (rc == 0 && say) fprintf(stderr, "sluice: experts copied in %.1f s\n", now_s() - t0);
    for (uint64_t i = 0; i < m->gguf->n_tensors && rc == 0; i++) {
        const gguf_tensor *t = &m->gguf->tensors[i];
        const uint64_t off = (uint64_t)((const uint8_t *)t->data - base);
        if (model_in_experts(r, n, off, t->nbytes)) continue;
        if (be->ops->weights_map(be, t->data, t->nbytes, t->data != host_dense) != 0) {
            sluice_set_error("%s: cannot copy tensor '%s' to the GPU", label, t->name);
            rc = -1;
        }
    }
    free(r);
    return rc;
}

/* --gpus: place the experts over the ranks (runtime/ep_placement.c) and route the backend's MoE
 * through the NCCL path. Without a routing trace every expert counts as equally popular; over
 * one rank every expert is the rank's own, the planner's budget already covers them. */
static int bind_ep(sluice_model *m, int n_rank, char *err, size_t err_len) {
    const expert_layout *l = &m->layout;
    uint64_t *eb = calloc((size_t)l->n_layer, sizeof *eb);
    if (!eb) {
        snprintf(err, err_len, "--gpus: out of memory");
        return -1;
    }
    for (int il = 0; il < l->n_layer; il++)
        if (l->layers[il].present)
            for (int q = 0; q < EXPERT_PARTS; q++) eb[il] += l->layers[il].part[q].bytes;
    ep_place_params pp = {.n_rank = n_rank, .n_layer = l->n_layer, .n_expert = l->n_expert, .expert_bytes = eb};
    ep_placement pl;
    int rc = ep_place(&pp, &pl, err, err_len);
    free(eb);
    if (rc != 0) return -1;
    backend_cuda_ep_params ep = {.n_rank = n_rank, .rank = 0, .owner = pl.owner, .verbose = true};
    rc = backend_cuda_ep_enable(m->gpu, &ep, err, err_len);
    ep_placement_free(&pl);
    return rc;
}

/* --gpu-miss host: a decode layer's misses the host computes unless told otherwise */
#define GPU_HOST_EXPERTS_DEFAULT 4

/* SLUICE_GPU_LOOK_MAX=N: at most N router-lookahead copies a layer (measurement; default none) */
static int look_max_env(void) {
    const char *v = getenv("SLUICE_GPU_LOOK_MAX");
    return v && atoi(v) > 0 ? atoi(v) : 0;
}

int model_gpu_bind(sluice_model *m, const char *label) {
    const sluice_model_params *p = &m->params;
    char err[512];
    static const char *const archs[] = {"llama", "qwen3moe", "qwen35moe", "qwen3next"};
    bool known = false;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) known |= strcmp(m->arch_name, archs[i]) == 0;
    if (!known) { /* its forward pass uses operations the device backend does not have yet */
        sluice_set_error("%s: the CUDA backend does not run architecture '%s' yet", label, m->arch_name);
        return -1;
    }
    m->request.gpu = true;
    m->request.gpu_budget = p->gpu_budget;
    m->request.gpu_zerocopy = p->gpu_miss == SLUICE_GPU_MISS_ZEROCOPY;
    plan_probe_gpu(&m->machine);
    plan_compute_gpu(&m->facts, &m->machine, &m->request, &m->plan);
    if (p->plan_only) return 0;
    if (!m->plan.gpu_ok) {
        sluice_set_error("%s: GPU memory plan refused: %s", label, m->plan.gpu_message);
        return -1;
    }
    if (m->arch->bind && m->arch->bind(m, err, sizeof err) != 0) {
        sluice_set_error("%s: %s", label, err);
        return -1;
    }
    const bool resident = m->plan.gpu_mode == SLUICE_MODE_RESIDENT;
    backend_cuda_params bp = {.device = 0, .budget = m->plan.gpu_budget, .no_graph = p->no_graph,
                              .profile = p->gpu_profile};
    m->gpu = backend_cuda_new(&bp, err, sizeof err);
    if (!m->gpu) {
        sluice_set_error("%s: %s", label, err);
        return -1;
    }
    backend *be = m->gpu;
    const uint8_t *base = m->gguf->base;
    if (resident) {
        if (be->ops->weights_map(be, base, m->gguf->size, true) != 0) {
            sluice_set_error("%s: cannot copy %llu bytes of weights to the GPU", label,
                             (unsigned long long)m->gguf->size);
            return -1;
        }
    } else if (map_streamed(m, label) != 0) {
        return -1;
    }
    if (m->facts.n_moe_layers == 0) {
        if (p->gpus > 0) {
            sluice_set_error("%s: --gpus: the model has no routed experts to place", label);
            return -1;
        }
        return 0;
    }
    gpu_store_params gp = {.be = be,
                           .layout = &m->layout,
                           .file = base,
                           .resident = resident,
                           .cache_bytes = m->plan.vram_cache,
                           .zerocopy = p->gpu_miss == SLUICE_GPU_MISS_ZEROCOPY,
                           .host_max = p->gpu_miss != SLUICE_GPU_MISS_HOST ? 0
                                       : p->gpu_host_experts > 0          ? p->gpu_host_experts
                                                                          : GPU_HOST_EXPERTS_DEFAULT,
                           .look_max = look_max_env()};
    m->experts = expert_store_gpu_new(&gp, err, sizeof err);
    if (!m->experts) {
        sluice_set_error("%s: %s", label, err);
        return -1;
    }
    if (!resident && m->facts.gpu_look_bytes > 0 && moe_lookahead_bind(m, err, sizeof err) != 0) {
        sluice_set_error("%s: %s", label, err);
        return -1;
    }
    if (p->gpus > 0 && bind_ep(m, p->gpus, err, sizeof err) != 0) {
        sluice_set_error("%s: %s", label, err);
        return -1;
    }
    return 0;
}

void model_gpu_release(sluice_model *m) {
    if (!m->gpu) return;
    if (m->params.gpu_profile) {
        fprintf(stderr, "sluice: CUDA op profile (ms, calls):\n");
        backend_cuda_profile_report(m->gpu, stderr);
    }
    be_free(m->gpu);
    m->gpu = NULL;
}

#endif
