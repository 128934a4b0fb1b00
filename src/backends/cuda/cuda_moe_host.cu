/* CUDA backend: routed experts computed by the host's cores while the device computes the others
 * (--gpu-miss host, docs/cuda.md).
 *
 * A streamed layer's experts that are not in VRAM are either copied over the bus (about 53 GB/s
 * on the H200 machine) or read by the kernels in place (about 33 GB/s); either way a token's
 * misses cost bus time the device mostly waits for. The host holds those experts already (the
 * page-locked copy) and has cores idle while the device works: it computes some misses itself,
 * so the bus carries fewer.
 *
 * One decode-sized batch of one layer (moe_experts_host):
 *   1. the slots whose table entries point at host memory are the host's; their ids go to the
 *      device as -1, which the grouped matvec kernels skip (k_mv_q);
 *   2. the device's products are queued (cuda_moe_slots, the kernels of moe_experts);
 *   3. meanwhile the host's threads compute its slots (backends/cpu/device_rows.c: the kernels'
 *      fold order, the fixed-exponential SwiGLU, the same activation encodings), into pinned rows;
 *   4. those rows are copied into the slot outputs, then the combine runs as always.
 * Every slot's output has the same bits whoever computed it, so the evidence of a run does not
 * depend on the split (tests/gpu/test_cuda checks the layer and whole runs). */
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "backends/cuda/cuda_internal.cuh"

extern "C" {
#include "backends/cpu/device_rows.h"
#include "backends/cpu/threadpool.h"
}

#define HOST_MAX_TOKENS 8 /* the decode form of moe_experts (grouped matvecs) */

/* The page-locked host address of a pinned range's host address p, or NULL. */
static const uint8_t *pinned_host(const cuda_backend *c, const void *p) {
    const uintptr_t a = (uintptr_t)p;
    /* the ranges are sorted and disjoint: the last one starting at or before a */
    auto it = std::upper_bound(c->pinned.begin(), c->pinned.end(), a,
                               [](uintptr_t v, const cuda_range &r) { return v < r.host; });
    if (it == c->pinned.begin()) return nullptr;
    --it;
    return a < it->host + it->bytes && it->pin ? reinterpret_cast<const uint8_t *>(it->pin + (a - it->host)) : nullptr;
}

void cuda_host_entry_set(cuda_backend *c, int index, const void *g, const void *u, const void *d) {
    if (c->h_on_host.size() != c->h_table.size()) {
        c->h_on_host.assign(c->h_table.size(), 0);
        c->h_host_ptr.assign(c->h_table.size(), expert_entry{});
    }
    expert_entry h;
    h.p[0] = pinned_host(c, g);
    h.p[1] = pinned_host(c, u);
    h.p[2] = pinned_host(c, d);
    c->h_on_host[(size_t)index] = h.p[0] && h.p[1] && h.p[2];
    c->h_host_ptr[(size_t)index] = h;
}

static double now_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void cuda_host_free(cuda_backend *c) {
    if (c->host_calls && getenv("SLUICE_CUDA_HOST_TIMING"))
        fprintf(stderr, "sluice: host experts: %llu slots in %llu layer calls, %.1f us a call, %.1f us a slot\n",
                (unsigned long long)c->host_slots, (unsigned long long)c->host_calls, c->host_ms * 1e3 / c->host_calls,
                c->host_ms * 1e3 / (double)c->host_slots);
    if (c->host_pool) threadpool_free(c->host_pool);
    free(c->host_work);
    if (c->h_rows) cudaFreeHost(c->h_rows);
    if (c->h_ids) cudaFreeHost(c->h_ids);
    c->host_pool = nullptr;
    c->host_work = nullptr;
    c->h_rows = nullptr;
    c->h_ids = nullptr;
}

/* A page-locked buffer of at least `bytes` in *p (capacity *cap); false when memory runs out. */
static bool grow_pinned(void **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return true;
    if (*p) cudaFreeHost(*p);
    *p = nullptr;
    *cap = 0;
    if (cudaHostAlloc(p, bytes, cudaHostAllocDefault) != cudaSuccess) return false;
    *cap = bytes;
    return true;
}

/* Host buffers for `slots` slots of width E; false when memory runs out. */
static bool host_buffers(cuda_backend *c, int slots, int64_t E, size_t work) {
    if (!c->host_pool) {
        int nt = threadpool_default_threads();
        if (const char *v = getenv("SLUICE_CUDA_HOST_THREADS")) nt = atoi(v) > 0 ? atoi(v) : nt;
        c->host_pool = threadpool_new(nt);
        if (!c->host_pool) return false;
    }
    if (!grow_pinned((void **)&c->h_rows, &c->h_rows_cap, (size_t)slots * (size_t)E * sizeof(float)) ||
        !grow_pinned((void **)&c->h_ids, &c->h_ids_cap, (size_t)slots * sizeof(int32_t)))
        return false;
    if (work > c->host_work_cap) {
        free(c->host_work);
        c->host_work = malloc(work);
        c->host_work_cap = c->host_work ? work : 0;
        if (!c->host_work) return false;
    }
    return true;
}

int cuda_op_moe_experts_host(backend *b, int il, const float *x, const float *x_host, int n, const int32_t *ids,
                             const int32_t *ids_host, const float *w, int k, float *out) {
    cuda_backend *c = CB(b);
    if (il < 0 || il >= c->n_layer || !c->shapes[il].present || n > HOST_MAX_TOKENS || c->capturing ||
        c->h_on_host.size() != c->h_table.size())
        return cuda_op_moe_experts(b, il, x, n, ids, w, k, out);
    const expert_shape &sh = c->shapes[il];
    const device_expert_shape ds = {sh.type[EXPERT_GATE], sh.type[EXPERT_UP], sh.type[EXPERT_DOWN],
                                    sh.ne0[EXPERT_GATE], sh.ne1[EXPERT_GATE]};
    const int slots = n * k;
    int host[HOST_MAX_TOKENS * 32], nh = 0;
    if (slots <= HOST_MAX_TOKENS * 32 && device_experts_supported(&ds))
        for (int j = 0; j < slots; j++)
            if (c->h_on_host[(size_t)il * c->n_expert + ids_host[j]]) host[nh++] = j;
    const size_t work = device_experts_work_bytes(&ds, nh);
    if (nh == 0 || !host_buffers(c, slots, ds.E, work)) return cuda_op_moe_experts(b, il, x, n, ids, w, k, out);
    cuda_prof_begin(c);

    /* 1. the device's ids: -1 where the host computes */
    memcpy(c->h_ids, ids_host, (size_t)slots * sizeof(int32_t));
    for (int i = 0; i < nh; i++) c->h_ids[host[i]] = -1;
    int32_t *d_ids = (int32_t *)cuda_scratch(c, SCR_HOST_IDS, (size_t)slots * sizeof(int32_t));
    CU(cudaMemcpyAsync(d_ids, c->h_ids, (size_t)slots * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream));
    /* 2. the device's slots */
    float *Y = cuda_moe_slots(c, il, x, n, d_ids, k, n);
    if (!Y) return -1;
    /* 3. the host's slots, while the device runs */
    device_expert_job jobs[HOST_MAX_TOKENS * 32];
    for (int i = 0; i < nh; i++) {
        const int j = host[i];
        const expert_entry &e = c->h_host_ptr[(size_t)il * c->n_expert + ids_host[j]];
        jobs[i].gate = e.p[EXPERT_GATE];
        jobs[i].up = e.p[EXPERT_UP];
        jobs[i].down = e.p[EXPERT_DOWN];
        jobs[i].x = x_host + (size_t)(j / k) * ds.E;
        jobs[i].y = c->h_rows + (size_t)j * ds.E;
    }
    const double t0 = now_ms();
    const int rc = device_experts_run(c->host_pool, &ds, jobs, nh, c->host_work, c->host_work_cap);
    c->host_ms += now_ms() - t0;
    c->host_calls++;
    if (rc != 0) {
        fprintf(stderr, "sluice: host experts: unsupported shape at layer %d\n", il);
        return -1;
    }
    c->host_slots += (uint64_t)nh;
    /* 4. their rows into the slot outputs, then the combine. The pinned rows are not written
     * again before the next layer's routing, which the host waits for after this copy. */
    for (int i = 0; i < nh; i++)
        CU(cudaMemcpyAsync(Y + (size_t)host[i] * ds.E, c->h_rows + (size_t)host[i] * ds.E,
                           (size_t)ds.E * sizeof(float), cudaMemcpyHostToDevice, c->stream));
    cuda_moe_combine(c, Y, w, n, k, (int)ds.E, out);
    cuda_act_invalidate_range(c, out, (size_t)n * ds.E * sizeof(float));
    cuda_prof_end(c, "moe_experts (decode, host slots)");
    return 0;
}
