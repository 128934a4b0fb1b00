/* Kernel trace of graph replays: where a decode step's time goes, kernel by kernel, as the
 * step really runs (a captured graph with programmatic dependent launch), which neither the
 * per-op event profile (eager, serialized) nor Nsight Compute (one kernel at a time, caches
 * flushed) shows.
 *
 * A measurement build (cmake -DSLUICE_CUDA_KTRACE=ON) makes pdl_wait stamp the global timer in
 * block (0, 0, 0) of every kernel as it is released, i.e. when the kernel before it has
 * finished; run with SLUICE_CUDA_KTRACE=1. The host records the kernels a capture launches, in
 * order; after every replay it reads the stamps back and adds, per kernel, the time from its
 * stamp to the next kernel's: the time that kernel held the chain (its run, its completion and
 * the next one's release). At exit it prints per graph the first kernels in order and the sum
 * per kernel name. Ordinary builds compile none of this (the functions below do nothing). */
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "backends/cuda/cuda_internal.cuh"

#ifdef SLUICE_KTRACE

std::vector<const void *> *cuda_ktrace_log; /* &recorded while a capture records, else NULL */
static std::vector<const void *> recorded;

void cuda_ktrace_init(cuda_backend *c) {
    c->ktrace = nullptr;
    if (!getenv("SLUICE_CUDA_KTRACE")) return;
    CU(cudaMalloc(&c->ktrace, sizeof(ktrace_buf)));
    CU(cudaMemset(c->ktrace, 0, sizeof(ktrace_buf)));
    cuda_ktrace_attach_matmul(c->ktrace);
    cuda_ktrace_attach_moe(c->ktrace);
    cuda_ktrace_attach_ops(c->ktrace);
    cuda_ktrace_attach_attention(c->ktrace);
    fprintf(stderr, "sluice: kernel trace on (every kernel's block 0 stamps its start)\n");
}

void cuda_ktrace_capture_begin(cuda_backend *c) {
    if (!c->ktrace) return;
    recorded.clear();
    cuda_ktrace_log = &recorded;
}

void cuda_ktrace_capture_end(cuda_backend *c, graph_slot *g) {
    cuda_ktrace_log = nullptr;
    if (!c->ktrace || !g) return;
    g->kt_kernels = recorded;
    g->kt_us.assign(g->kt_kernels.size(), 0.0);
    g->kt_step_us = 0;
    g->kt_runs = 0;
}

void cuda_ktrace_replay_begin(cuda_backend *c, graph_slot *g) {
    if (!c->ktrace || g->kt_kernels.empty()) return;
    CU(cudaMemsetAsync(c->ktrace, 0, sizeof(unsigned long long), c->stream));
}

/* after the replay's stream has been waited for */
void cuda_ktrace_replay_end(cuda_backend *c, graph_slot *g) {
    const size_t n = g->kt_kernels.size();
    if (!c->ktrace || n < 2 || n > KTRACE_MAX) return;
    unsigned long long count = 0;
    CU(cudaMemcpy(&count, c->ktrace, sizeof count, cudaMemcpyDeviceToHost));
    if (count != n) return; /* not this graph's kernels (or some not stamped): skip the run */
    std::vector<unsigned long long> t(n);
    CU(cudaMemcpy(t.data(), (const char *)c->ktrace + sizeof(unsigned long long), n * sizeof t[0],
                  cudaMemcpyDeviceToHost));
    for (size_t i = 0; i + 1 < n; i++) g->kt_us[i] += (double)(t[i + 1] - t[i]) / 1e3;
    g->kt_step_us += (double)(t[n - 1] - t[0]) / 1e3;
    g->kt_runs++;
}

static std::string kernel_name(const void *f) {
    const char *mangled = nullptr;
    if (cudaFuncGetName(&mangled, f) != cudaSuccess || !mangled) {
        cudaGetLastError();
        return "?";
    }
    int st = 0;
    char *d = abi::__cxa_demangle(mangled, nullptr, nullptr, &st);
    std::string s = st == 0 && d ? d : mangled;
    free(d);
    const size_t paren = s.find('(');
    if (paren != std::string::npos) s.resize(paren); /* the name and template arguments */
    if (s.compare(0, 5, "void ") == 0) s.erase(0, 5);
    return s;
}

void cuda_ktrace_report(cuda_backend *c) {
    if (!c->ktrace) return;
    for (auto &g : c->graphs) {
        if (g.kt_runs == 0) continue;
        const size_t n = g.kt_kernels.size();
        const double runs = g.kt_runs;
        fprintf(stderr, "sluice: kernel trace: %zu kernels a step, %d replays, first to last stamp %.1f us\n", n,
                g.kt_runs, g.kt_step_us / runs);
        fprintf(stderr, "| # | kernel | us to the next |\n|---:|---|---:|\n");
        const size_t show = n < 64 ? n - 1 : 64;
        for (size_t i = 0; i < show; i++)
            fprintf(stderr, "| %zu | `%s` | %.2f |\n", i, kernel_name(g.kt_kernels[i]).c_str(), g.kt_us[i] / runs);
        std::map<std::string, std::pair<double, int>> by;
        for (size_t i = 0; i + 1 < n; i++) {
            auto &e = by[kernel_name(g.kt_kernels[i])];
            e.first += g.kt_us[i] / runs;
            e.second++;
        }
        std::vector<std::pair<std::string, std::pair<double, int>>> v(by.begin(), by.end());
        std::sort(v.begin(), v.end(), [](const auto &a, const auto &b) { return a.second.first > b.second.first; });
        fprintf(stderr, "| kernel | per step | us a step | us each | share |\n|---|---:|---:|---:|---:|\n");
        for (auto &e : v)
            fprintf(stderr, "| `%s` | %d | %.1f | %.2f | %.1f%% |\n", e.first.c_str(), e.second.second, e.second.first,
                    e.second.first / e.second.second, 100.0 * e.second.first / (g.kt_step_us / runs));
    }
}

void cuda_ktrace_free(cuda_backend *c) {
    if (!c->ktrace) return;
    cuda_ktrace_attach_matmul(nullptr);
    cuda_ktrace_attach_moe(nullptr);
    cuda_ktrace_attach_ops(nullptr);
    cuda_ktrace_attach_attention(nullptr);
    cudaFree(c->ktrace);
    c->ktrace = nullptr;
}

#else

void cuda_ktrace_init(cuda_backend *c) { c->ktrace = nullptr; }
void cuda_ktrace_capture_begin(cuda_backend *) {}
void cuda_ktrace_capture_end(cuda_backend *, graph_slot *) {}
void cuda_ktrace_replay_begin(cuda_backend *, graph_slot *) {}
void cuda_ktrace_replay_end(cuda_backend *, graph_slot *) {}
void cuda_ktrace_report(cuda_backend *) {}
void cuda_ktrace_free(cuda_backend *) {}

#endif
