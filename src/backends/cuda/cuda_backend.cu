/* CUDA backend: lifecycle, memory, weights, step inputs, downloads, CUDA graphs, the expert
 * table and the operation table. Kernels live in cuda_matmul.cu, cuda_moe.cu and cuda_ops.cu.
 *
 * Weights: be_weights_map either uploads a host range (a device copy; views inside it are
 * translated to the copy) or makes a page-locked host copy of it (cudaHostAlloc, mapped; kernels
 * read it over the bus, cache fills copy from it by DMA). A resident model uploads the whole
 * mapped file; a streamed one gives its routed experts a page-locked copy and uploads the dense
 * tensors, so routed experts are reached through the expert table: a VRAM cache slot when
 * cached, else the page-locked copy. Either way a kernel reads the same bytes, which is why
 * resident, streamed and every cache size give the same results.
 *
 * Why a copy and not cudaHostRegister of the mapped file in place: on the H200 VM registering
 * 20 GB of page cache did not finish within 170 s (bench/results/2026-11-30-cuda-decode.md; long-
 * term pinning of file pages waits for write-back and may migrate every page), while an
 * allocation of page-locked memory is filled at memory speed.
 *
 * Graphs: a decode step (session.c) is run eagerly the first time (it sizes every buffer), then
 * captured once and replayed; per-step values reach the graph through set_inputs' device
 * buffers, outputs through pinned staging copied to the caller's memory after the replay. */
#include <algorithm>
#include <atomic>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <ctime>

#include "backends/cuda/cuda_internal.cuh"

extern "C" {
#include "formats/quant.h"
}

static std::unordered_map<void *, size_t> &alloc_sizes() {
    static std::unordered_map<void *, size_t> m;
    return m;
}

void cuda_fail(const char *what, cudaError_t e, const char *file, int line) {
    fprintf(stderr, "sluice: CUDA error %s (%s) at %s:%d: %s\n", cudaGetErrorName(e),
            cudaGetErrorString(e), file, line, what);
    abort();
}

/* ---- device memory ---------------------------------------------------------------------------- */

/* Graphs bake buffer addresses: any buffer they may use that moves makes them stale. */
static void drop_graphs(cuda_backend *c) {
    for (auto &g : c->graphs) {
        if (g.exec) cudaGraphExecDestroy(g.exec);
        g.exec = nullptr;
        g.runs = 0;
    }
}

static void *dev_alloc(cuda_backend *c, size_t bytes) {
    if (bytes == 0) bytes = 256;
    if (c->budget && c->allocated + bytes > c->budget) return nullptr;
    void *p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free out-of-memory error */
        return nullptr;
    }
    alloc_sizes()[p] = bytes;
    c->allocated += bytes;
    return p;
}

static void dev_free(cuda_backend *c, void *p) {
    if (!p) return;
    if (c->capturing) { /* a free would synchronize the capturing stream */
        c->deferred_free.push_back(p);
        return;
    }
    auto it = alloc_sizes().find(p);
    if (it != alloc_sizes().end()) {
        c->allocated -= it->second;
        alloc_sizes().erase(it);
    }
    CU(cudaFree(p));
}

void *cuda_scratch(cuda_backend *c, int id, size_t bytes) {
    if (bytes <= c->scratch_cap[id]) return c->scratch[id];
    size_t cap = bytes + bytes / 4 + 4096;
    if (c->capturing) c->capture_broken = true; /* sizes come from the eager run; be safe */
    else drop_graphs(c);
    dev_free(c, c->scratch[id]);
    c->scratch[id] = dev_alloc(c, cap);
    if (!c->scratch[id]) {
        fprintf(stderr, "sluice: out of device memory for %zu bytes of scratch\n", cap);
        abort();
    }
    c->scratch_cap[id] = cap;
    return c->scratch[id];
}

/* ---- profiling -------------------------------------------------------------------------------- */

static double host_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* --gpu-profile: the device time of every op (events around it, then a wait). SLUICE_CUDA_HOST_PROF:
 * the host's time in every op instead (no events, no waits: the op's own cost to the host,
 * launches and driver calls; an op inside another is counted in the outer one). */
void cuda_prof_begin(cuda_backend *c) {
    if (c->host_prof && c->hp_depth++ == 0) c->hp_t0 = host_ms();
    if (c->profile) CU(cudaEventRecord(c->ev0, c->stream));
}

void cuda_prof_end(cuda_backend *c, const char *name) {
    float ms = 0;
    if (c->host_prof) {
        if (c->hp_depth <= 0 || --c->hp_depth > 0) return;
        ms = (float)(host_ms() - c->hp_t0);
    } else if (c->profile) {
        CU(cudaEventRecord(c->ev1, c->stream));
        CU(cudaEventSynchronize(c->ev1));
        CU(cudaEventElapsedTime(&ms, c->ev0, c->ev1));
    } else {
        return;
    }
    for (auto &e : c->prof)
        if (e.name == name || strcmp(e.name, name) == 0) {
            e.ms += ms;
            e.calls++;
            return;
        }
    c->prof.push_back({name, ms, 1});
}

void backend_cuda_profile_report(const backend *b, FILE *out) {
    const cuda_backend *c = reinterpret_cast<const cuda_backend *>(b);
    std::vector<prof_entry> v = c->prof;
    std::sort(v.begin(), v.end(), [](const prof_entry &a, const prof_entry &x) { return a.ms > x.ms; });
    double total = 0;
    for (auto &e : v) total += e.ms;
    fprintf(out, "| op | ms | calls | us/call | share |\n|---|---:|---:|---:|---:|\n");
    for (auto &e : v)
        fprintf(out, "| %s | %.3f | %llu | %.2f | %.1f%% |\n", e.name, e.ms,
                (unsigned long long)e.calls, 1000.0 * e.ms / (double)(e.calls ? e.calls : 1),
                total > 0 ? 100.0 * e.ms / total : 0.0);
    fprintf(out, "| total | %.3f | | | |\n", total);
}

/* ---- activation cache ------------------------------------------------------------------------- */

void cuda_act_invalidate(cuda_backend *c) {
    for (auto &e : c->acts) e.valid = false;
}

void cuda_act_invalidate_range(cuda_backend *c, const void *p, size_t bytes) {
    const uintptr_t a = (uintptr_t)p, b = a + bytes;
    for (auto &e : c->acts) {
        if (!e.valid) continue;
        const uintptr_t s = (uintptr_t)e.src, t = s + (size_t)e.n * (size_t)e.K * sizeof(float);
        if (a < t && s < b) {
            if (c->act_trace)
                fprintf(stderr, "sluice: act drop %p (n %d K %lld) by a write of [%p, +%zu)\n", e.src, e.n,
                        (long long)e.K, p, bytes);
            e.valid = false;
        }
    }
}

/* The entry that will hold x's encoding: a free one that is large enough, else the least
 * recently used large enough one, else any free one, else the least recently used (growing it). */
static act_cache_entry *act_entry(cuda_backend *c, const float *x, int n, int64_t K, int act) {
    const size_t bytes = cuda_act_bytes(n, K, act);
    if (n <= 8 && bytes > c->act_small_max) c->act_small_max = bytes;
    act_cache_entry *v = nullptr;
    for (auto &e : c->acts)
        if (!e.valid && e.cap >= bytes) {
            v = &e;
            break;
        }
    if (!v)
        for (auto &e : c->acts)
            if (e.cap >= bytes && (!v || e.age < v->age)) v = &e;
    if (!v)
        for (auto &e : c->acts)
            if (!e.valid) {
                v = &e;
                break;
            }
    if (!v) {
        v = &c->acts[0];
        for (auto &e : c->acts)
            if (e.age < v->age) v = &e;
    }
    if (bytes > v->cap) {
        if (c->capturing) c->capture_broken = true;
        else drop_graphs(c);
        dev_free(c, v->buf);
        v->cap = bytes + bytes / 4 + 4096;
        v->buf = dev_alloc(c, v->cap);
        if (!v->buf) {
            fprintf(stderr, "sluice: out of device memory for activations\n");
            abort();
        }
    }
    if (c->act_trace && v->valid)
        fprintf(stderr, "sluice: act evict %p (n %d K %lld) for %p\n", v->src, v->n, (long long)v->K, (const void *)x);
    v->src = x;
    v->n = n;
    v->K = K;
    v->act = act;
    v->valid = true;
    v->age = ++c->act_age;
    return v;
}

qact cuda_act(cuda_backend *c, const float *x, int n, int64_t K, uint32_t type) {
    const int act = cuda_act_type(type);
    if (act == QT_F32) { /* F32 weights read the activations as they are */
        qact a;
        memset(&a, 0, sizeof a);
        a.f = x;
        a.K = K;
        a.act = QT_F32;
        return a;
    }
    for (auto &e : c->acts)
        if (e.valid && e.src == x && e.n == n && e.K == K && e.act == act) {
            e.age = ++c->act_age;
            return cuda_act_view(e.buf, n, K, act);
        }
    act_cache_entry *v = act_entry(c, x, n, K, act);
    if (c->act_trace)
        fprintf(stderr, "sluice: act encode %p (n %d K %lld act %d)\n", (const void *)x, n, (long long)K, act);
    cuda_quantize_act(c, x, n, K, act, v->buf);
    return cuda_act_view(v->buf, n, K, act);
}

qact cuda_act_reserve(cuda_backend *c, const float *x, int n, int64_t K, int act) {
    cuda_act_invalidate_range(c, x, (size_t)n * (size_t)K * sizeof(float));
    if (c->act_trace)
        fprintf(stderr, "sluice: act reserve %p (n %d K %lld act %d)\n", (const void *)x, n, (long long)K, act);
    return cuda_act_view(act_entry(c, x, n, K, act)->buf, n, K, act);
}

/* ---- weights ---------------------------------------------------------------------------------- */

static const void *lookup(const std::vector<cuda_range> &v, uintptr_t p) {
    /* the ranges of one kind never overlap: the last one starting at or before p */
    auto it = std::upper_bound(v.begin(), v.end(), p,
                               [](uintptr_t x, const cuda_range &r) { return x < r.host; });
    if (it == v.begin()) return nullptr;
    --it;
    return p < it->host + it->bytes ? reinterpret_cast<const void *>(it->dev + (p - it->host))
                                    : nullptr;
}

const void *cuda_dev(const cuda_backend *c, const void *p) {
    if (!p) return p;
    const uintptr_t a = (uintptr_t)p;
    if (const void *d = lookup(c->uploads, a)) return d;
    if (const void *d = lookup(c->pinned, a)) return d;
    return p;
}

static void add_range(std::vector<cuda_range> &v, cuda_range r);

/* A host-to-device cudaMemcpy from pageable memory returns once the bytes are staged, possibly
 * before its DMA has landed, and it runs on the legacy stream, which the non-blocking compute
 * stream does not wait for: the next kernel could read part of the old bytes. (test_cuda's
 * F32 matmul_multi check failed once so, on a loaded host.) Waiting for the legacy stream is
 * allowed during a relaxed capture and costs nothing next to the copy itself. */
void cuda_upload_sync(void *dst, const void *src, size_t bytes) {
    CU(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    CU(cudaStreamSynchronize(cudaStreamLegacy));
}

const void *cuda_weight(cuda_backend *c, const void *p, size_t bytes) {
    if (!p) return p;
    const uintptr_t a = (uintptr_t)p;
    if (const void *d = lookup(c->uploads, a)) return d;
    if (const void *d = lookup(c->pinned, a)) return d;
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        cudaGetLastError();
        at.type = cudaMemoryTypeUnregistered;
    }
    if (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged) return p;
    if (at.type == cudaMemoryTypeHost) return at.devicePointer ? at.devicePointer : p;
    /* host memory the model made itself (converted norms, conv taps): copy it once; the first
     * (eager) run of every pass meets all of them, so a capture never does */
    if (c->capturing) c->capture_broken = true;
    void *d = dev_alloc(c, (bytes + 255) / 256 * 256);
    if (!d) {
        fprintf(stderr, "sluice: out of device memory for %zu bytes of weights\n", bytes);
        abort();
    }
    cuda_upload_sync(d, p, bytes);
    c->weight_blocks.push_back(d);
    add_range(c->uploads, {a, bytes, (uintptr_t)d, 0});
    return d;
}

static void add_range(std::vector<cuda_range> &v, cuda_range r) {
    auto it = std::upper_bound(v.begin(), v.end(), r.host,
                               [](uintptr_t x, const cuda_range &q) { return x < q.host; });
    v.insert(it, r);
}

static double wall_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* memcpy over several threads: a streamed model's experts (many GiB) come from the mapped
 * file, so most of this is page faults and reads; one thread would leave the disk and the
 * memory bus idle. The bytes are the same whatever the split. */
static void copy_parallel(void *dst, const void *src, size_t bytes) {
    const size_t piece = 64ull << 20;
    const size_t n_pieces = (bytes + piece - 1) / piece;
    unsigned n = std::thread::hardware_concurrency();
    n = n < 1 ? 1 : n > 8 ? 8 : n;
    if (n_pieces < 2 || n == 1) {
        memcpy(dst, src, bytes);
        return;
    }
    std::atomic<size_t> next{0};
    auto work = [&]() {
        for (size_t i; (i = next.fetch_add(1)) < n_pieces;) {
            const size_t off = i * piece, len = bytes - off < piece ? bytes - off : piece;
            memcpy((uint8_t *)dst + off, (const uint8_t *)src + off, len);
        }
    };
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < n && t < n_pieces; t++) pool.emplace_back(work);
    work();
    for (auto &t : pool) t.join();
}

static int op_weights_map(backend *b, const void *host, size_t bytes, bool upload) {
    cuda_backend *c = CB(b);
    if (!bytes) return 0;
    if (upload) {
        const uint8_t *have = (const uint8_t *)lookup(c->uploads, (uintptr_t)host);
        if (have && lookup(c->uploads, (uintptr_t)host + bytes - 1) == have + bytes - 1) return 0;
        void *d = dev_alloc(c, (bytes + 255) / 256 * 256);
        if (!d) return -1;
        /* in slices: a pageable copy of many GiB is staged by the driver anyway, and slices keep
         * the memory the driver pins for it small */
        const size_t slice = 256ull << 20;
        for (size_t off = 0; off < bytes; off += slice) {
            const size_t len = bytes - off < slice ? bytes - off : slice;
            cuda_upload_sync((uint8_t *)d + off, (const uint8_t *)host + off, len);
        }
        c->weight_blocks.push_back(d);
        add_range(c->uploads, {(uintptr_t)host, bytes, (uintptr_t)d, 0});
        return 0;
    }
    /* a page-locked host copy the device reads over the bus (zero-copy) and copies from (DMA) */
    const bool big = bytes >= (1ull << 30);
    const double t0 = wall_ms();
    void *h = nullptr, *dptr = nullptr;
    if (cudaHostAlloc(&h, bytes, cudaHostAllocMapped) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    copy_parallel(h, host, bytes);
    if (big || wall_ms() - t0 > 2000)
        fprintf(stderr, "sluice: %.2f GiB copied into pinned host memory in %.1f s\n", bytes / 1073741824.0,
                (wall_ms() - t0) / 1e3);
    c->host_copies_pinned.push_back(h);
    CU(cudaHostGetDevicePointer(&dptr, h, 0));
    add_range(c->pinned, {(uintptr_t)host, bytes, (uintptr_t)dptr, (uintptr_t)h});
    return 0;
}

/* ---- memory ops ------------------------------------------------------------------------------- */

static void *op_alloc(backend *b, size_t bytes) {
    cuda_backend *c = CB(b);
    void *p = dev_alloc(c, (bytes + 255) / 256 * 256);
    if (p) CU(cudaMemsetAsync(p, 0, (bytes + 255) / 256 * 256, c->stream));
    return p;
}

static void op_mfree(backend *b, void *p) {
    cuda_backend *c = CB(b);
    cuda_act_invalidate(c);
    if (!c->capturing) { /* queued work may still use it */
        CU(cudaStreamSynchronize(c->copy_stream));
        CU(cudaStreamSynchronize(c->stream));
    }
    dev_free(c, p); /* deferred while capturing */
}

static void op_upload(backend *b, void *dst, const void *src, size_t bytes) {
    cuda_backend *c = CB(b);
    if (!bytes) return;
    if (c->capturing) c->capture_broken = true; /* host data is not part of a graph */
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
    cuda_act_invalidate_range(c, dst, bytes);
}

static void ensure_stage(cuda_backend *c, size_t bytes) {
    if (bytes <= c->stage_cap) return;
    drop_graphs(c);
    CU(cudaStreamSynchronize(c->stream));
    if (c->h_stage) CU(cudaFreeHost(c->h_stage));
    c->stage_cap = bytes + bytes / 2;
    CU(cudaHostAlloc((void **)&c->h_stage, c->stage_cap, cudaHostAllocDefault));
}

/* Page-locked host memory for the caller (a session's logits): a download into it is one DMA,
 * captured as such in a graph, where pageable memory goes through h_stage and a host memcpy
 * after the replay (1 MB of logits per decode step). */
static void *op_host_alloc(backend *b, size_t bytes) {
    cuda_backend *c = CB(b);
    void *p = nullptr;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    memset(p, 0, bytes);
    add_range(c->host_bufs, {(uintptr_t)p, bytes, 0, 0});
    return p;
}

static void op_host_free(backend *b, void *p) {
    cuda_backend *c = CB(b);
    if (!p) return;
    for (size_t i = 0; i < c->host_bufs.size(); i++)
        if (c->host_bufs[i].host == (uintptr_t)p) {
            c->host_bufs.erase(c->host_bufs.begin() + (long)i);
            break;
        }
    CU(cudaStreamSynchronize(c->stream)); /* no copy into it may be in flight */
    CU(cudaFreeHost(p));
}

static bool in_host_buf(const cuda_backend *c, const void *dst, size_t bytes) {
    const uintptr_t a = (uintptr_t)dst;
    auto it = std::upper_bound(c->host_bufs.begin(), c->host_bufs.end(), a,
                               [](uintptr_t x, const cuda_range &r) { return x < r.host; });
    if (it == c->host_bufs.begin()) return false;
    --it;
    return a + bytes <= it->host + it->bytes;
}

static void op_download(backend *b, void *dst, const void *src, size_t bytes) {
    cuda_backend *c = CB(b);
    if (!bytes) return;
    cuda_prof_begin(c);
    if (in_host_buf(c, dst, bytes)) {
        CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
        if (c->capturing) return; /* a graph's run waits for its stream at the end */
        CU(cudaStreamSynchronize(c->stream));
        cuda_prof_end(c, "download");
        return;
    }
    if (c->capturing) {
        const size_t off = (c->stage_used + 255) / 256 * 256;
        if (off + bytes > c->stage_cap) {
            c->capture_broken = true;
            return;
        }
        CU(cudaMemcpyAsync(c->h_stage + off, src, bytes, cudaMemcpyDeviceToHost, c->stream));
        c->cur_graph->host_copies.push_back({dst, {off, bytes}});
        c->stage_used = off + bytes;
        return;
    }
    ensure_stage(c, bytes);
    CU(cudaMemcpyAsync(c->h_stage, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CU(cudaStreamSynchronize(c->stream));
    memcpy(dst, c->h_stage, bytes);
    cuda_prof_end(c, "download");
}

static void op_memzero(backend *b, void *dst, size_t bytes) {
    cuda_backend *c = CB(b);
    if (!bytes) return;
    CU(cudaMemsetAsync(dst, 0, bytes, c->stream));
    cuda_act_invalidate_range(c, dst, bytes);
}

static void op_copy_async(backend *b, void *dst, const void *src, size_t bytes) {
    cuda_backend *c = CB(b);
    if (!bytes) return;
    cuda_prof_begin(c);
    if (c->capturing) c->capture_broken = true; /* cache fills are not part of a graph */
    /* from the page-locked bytes of a pinned range (asynchronous DMA) */
    const uintptr_t a = (uintptr_t)src;
    auto it = std::upper_bound(c->pinned.begin(), c->pinned.end(), a,
                               [](uintptr_t x, const cuda_range &r) { return x < r.host; });
    if (it != c->pinned.begin() && a < (it - 1)->host + (it - 1)->bytes)
        src = (const void *)((it - 1)->pin + (a - (it - 1)->host));
    if (!c->copy_batch_open) { /* the destination slots may be read by compute queued so far */
        /* The table's pending updates (the victims' entries) need not be queued first: only the
         * expert kernels read entries, and they flush the table before they launch. */
        if (!c->copy_fenced) CU(cudaEventRecord(c->copy_guard, c->stream)); /* else: at the fence */
        c->copy_fenced = false;
        CU(cudaStreamWaitEvent(c->copy_stream, c->copy_guard, 0));
        c->copy_batch_open = true;
    }
    if (!c->copy_batch) {
        CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->copy_stream));
    } else {
        c->cp_dst.push_back(dst);
        c->cp_src.push_back(src);
        c->cp_size.push_back(bytes);
    }
    c->copies_unwaited = true;
    c->copies_since_mark = true;
    cuda_prof_end(c, "copy_async (queued)");
}

/* Issue the batch's queued copies on the copy stream: a streamed decode layer copies a few
 * experts of three parts each, twice (demand, lookahead), and a driver call per part cost more
 * host time than the layer's kernels take (2026-12-01-cuda-host-experts.md). */
static void copy_flush(cuda_backend *c) {
    size_t n = c->cp_dst.size();
    if (n == 0) return;
#if CUDART_VERSION >= 12080
    if (n > 1) {
        cudaMemcpyAttributes at;
        memset(&at, 0, sizeof at);
        at.srcAccessOrder = cudaMemcpySrcAccessOrderStream; /* after the batch's guard event */
        at.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        size_t idx = 0;
#if CUDART_VERSION >= 13000
        CU(cudaMemcpyBatchAsync(c->cp_dst.data(), c->cp_src.data(), c->cp_size.data(), n, &at, &idx, 1,
                                c->copy_stream));
#else
        size_t fail = 0;
        CU(cudaMemcpyBatchAsync(c->cp_dst.data(), const_cast<void **>(c->cp_src.data()), c->cp_size.data(), n, &at,
                                &idx, 1, &fail, c->copy_stream));
#endif
        n = 0;
    }
#endif
    for (size_t i = 0; i < n; i++)
        CU(cudaMemcpyAsync(c->cp_dst[i], c->cp_src[i], c->cp_size[i], cudaMemcpyDefault, c->copy_stream));
    c->cp_dst.clear();
    c->cp_src.clear();
    c->cp_size.clear();
}

/* Later compute waits for every copy queued so far (a no-op when there is none). */
static void copy_join(cuda_backend *c) {
    copy_flush(c);
    if (!c->copies_unwaited || c->capturing) return;
    CU(cudaEventRecord(c->copy_done, c->copy_stream));
    CU(cudaStreamWaitEvent(c->stream, c->copy_done, 0));
    c->copies_unwaited = false;
}

static void op_copy_end(backend *b, bool mark) {
    cuda_backend *c = CB(b);
    cuda_prof_begin(c);
    copy_flush(c);
    c->copy_batch_open = false;
    cuda_prof_end(c, "copy_end (the batch's copies)");
    /* no copy since the last mark: that mark, waited for or not, covers every copy already (a
     * streamed decode layer whose experts are all cached saves two driver calls) */
    if (!mark || c->capturing || !c->copies_since_mark) return;
    CU(cudaEventRecord(c->copy_mark, c->copy_stream));
    c->copy_marked = true;
    c->copies_since_mark = false;
}

/* The next batch waits for the compute queued up to here only (backend.h): a streamed decode
 * layer's lookahead, issued after the layer's expert launches, then overlaps them. */
static void op_copy_fence(backend *b, bool on) {
    cuda_backend *c = CB(b);
    c->copy_fenced = false;
    if (!on || c->capturing || c->copy_batch_open) return;
    CU(cudaEventRecord(c->copy_guard, c->stream));
    c->copy_fenced = true;
}

static void op_copy_wait(backend *b) {
    cuda_backend *c = CB(b);
    if (!c->copy_marked) return;
    if (c->capturing) {
        c->capture_broken = true; /* a wait on a copy is not part of a graph */
        return;
    }
    cuda_prof_begin(c);
    CU(cudaStreamWaitEvent(c->stream, c->copy_mark, 0));
    c->copy_marked = false;
    cuda_prof_end(c, "copy_wait");
}

static void op_sync(backend *b) {
    cuda_backend *c = CB(b);
    if (c->capturing) return;
    cuda_table_flush(c);
    copy_join(c);
    c->copy_batch_open = false;
    CU(cudaStreamSynchronize(c->stream));
}

/* ---- step inputs ------------------------------------------------------------------------------ */

static void write_inputs(cuda_backend *c, const int32_t *tokens, int n, int pos0) {
    for (int t = 0; t < n; t++) {
        c->h_in[t] = tokens[t];
        c->h_in[c->in_cap + t] = pos0 + t;
    }
}

static void op_set_inputs(backend *b, const int32_t *tokens, int n, int pos0, const int32_t **ids,
                          const int32_t **pos) {
    cuda_backend *c = CB(b);
    if (n > c->in_cap) {
        if (c->capturing) c->capture_broken = true;
        else drop_graphs(c);
        CU(cudaStreamSynchronize(c->stream));
        if (c->h_in) CU(cudaFreeHost(c->h_in));
        dev_free(c, c->d_in);
        c->in_cap = n < 64 ? 64 : n;
        CU(cudaHostAlloc((void **)&c->h_in, 2 * (size_t)c->in_cap * sizeof(int32_t), cudaHostAllocDefault));
        c->d_in = (int32_t *)dev_alloc(c, 2 * (size_t)c->in_cap * sizeof(int32_t));
        if (!c->d_in) {
            fprintf(stderr, "sluice: out of device memory for step inputs\n");
            abort();
        }
    }
    /* the previous step's copy of the staging area must have run before it is rewritten */
    if (!c->capturing) CU(cudaStreamSynchronize(c->stream));
    write_inputs(c, tokens, n, pos0);
    c->in_n = n;
    CU(cudaMemcpyAsync(c->d_in, c->h_in, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream));
    CU(cudaMemcpyAsync(c->d_in + c->in_cap, c->h_in + c->in_cap, (size_t)n * sizeof(int32_t),
                       cudaMemcpyHostToDevice, c->stream));
    cuda_act_invalidate(c);
    *ids = c->d_in;
    *pos = c->d_in + c->in_cap;
}

/* ---- expert table ------------------------------------------------------------------------------ */

static int op_experts_init(backend *b, const expert_layout *l) {
    cuda_backend *c = CB(b);
    c->n_layer = l->n_layer;
    c->n_expert = l->n_expert;
    c->shapes.assign(l->n_layer, expert_shape{});
    for (int i = 0; i < l->n_layer; i++) {
        const expert_layer_layout *L = &l->layers[i];
        expert_shape &s = c->shapes[i];
        s.present = L->present;
        if (!L->present) continue;
        for (int p = 0; p < EXPERT_PARTS; p++) {
            s.type[p] = L->part[p].type;
            s.ne0[p] = L->part[p].ne0;
            s.ne1[p] = L->part[p].ne1;
            s.row_bytes[p] = quant_row_bytes(L->part[p].type, L->part[p].ne0);
            if (!cuda_type_supported(L->part[p].type)) {
                fprintf(stderr, "sluice: the CUDA backend has no kernels for %s (layer %d experts)\n",
                        quant_type_name(L->part[p].type), i);
                return -1;
            }
        }
    }
    const size_t bytes = (size_t)l->n_layer * l->n_expert * sizeof(expert_entry);
    dev_free(c, c->d_table);
    c->d_table = (expert_entry *)dev_alloc(c, bytes);
    if (!c->d_table) return -1;
    CU(cudaMemsetAsync(c->d_table, 0, bytes, c->stream));
    c->h_table.assign((size_t)l->n_layer * l->n_expert, expert_entry{});
    return 0;
}

static void op_experts_set(backend *b, int layer, int expert, const void *g, const void *u,
                           const void *d) {
    cuda_backend *c = CB(b);
    table_update t;
    t.index = layer * c->n_expert + expert;
    t.e.p[0] = (const uint8_t *)cuda_dev(c, g);
    t.e.p[1] = (const uint8_t *)cuda_dev(c, u);
    t.e.p[2] = (const uint8_t *)cuda_dev(c, d);
    c->h_table[t.index] = t.e;
    c->pending.push_back(t);
    cuda_host_entry_set(c, t.index, g, u, d);
}

struct table_batch {
    int n;
    int index[32];
    expert_entry e[32];
};

__global__ void k_table_set(expert_entry *tab, table_batch b) {
    const int i = threadIdx.x;
    if (i < b.n) tab[b.index[i]] = b.e[i];
}

void cuda_table_flush(cuda_backend *c) {
    if (c->pending.empty()) return;
    cuda_prof_begin(c);
    if (c->pending.size() > 256 && !c->capturing) {
        /* a whole-table fill (resident start-up, or a big promotion): one copy */
        CU(cudaMemcpyAsync(c->d_table, c->h_table.data(), c->h_table.size() * sizeof(expert_entry),
                           cudaMemcpyHostToDevice, c->stream));
        CU(cudaStreamSynchronize(c->stream)); /* the source is pageable and changes later */
        c->pending.clear();
        cuda_prof_end(c, "table_flush (whole table)");
        return;
    }
    for (size_t i = 0; i < c->pending.size(); i += 32) {
        table_batch tb;
        tb.n = (int)std::min<size_t>(32, c->pending.size() - i);
        /* an entry can be updated twice between flushes (loaded, then evicted by the next
         * load): every write of an index carries its final value (h_table), so two threads
         * writing one entry in a batch cannot leave a stale pointer whichever lands last */
        for (int j = 0; j < tb.n; j++) {
            tb.index[j] = c->pending[i + j].index;
            tb.e[j] = c->h_table[(size_t)tb.index[j]];
        }
        k_table_set<<<1, 32, 0, c->stream>>>(c->d_table, tb);
        CU_LAUNCH();
    }
    c->pending.clear();
    cuda_prof_end(c, "table_flush");
}

bool cuda_pdl = false; /* see pdl_launch (cuda_internal.cuh) */

/* ---- graphs ----------------------------------------------------------------------------------- */

static graph_slot *slot_of(cuda_backend *c, uint64_t key, bool create) {
    for (auto &g : c->graphs)
        if (g.key == key) return &g;
    if (!create) return nullptr;
    for (auto &g : c->graphs)
        if (g.key == 0 && !g.exec) {
            g.key = key;
            g.runs = 0;
            g.failed = false;
            g.host_copies.clear();
            return &g;
        }
    c->graphs.push_back(graph_slot{});
    c->graphs.back().key = key;
    c->graphs.back().exec = nullptr;
    return &c->graphs.back();
}

static void finish_graph_run(cuda_backend *c, graph_slot *g) {
    CU(cudaStreamSynchronize(c->stream));
    for (auto &hc : g->host_copies) memcpy(hc.first, c->h_stage + hc.second.first, hc.second.second);
}

static bool op_graph_replay(backend *b, uint64_t key, const int32_t *tokens, int n, int pos0) {
    cuda_backend *c = CB(b);
    graph_slot *g = slot_of(c, key, false);
    if (!g || !g->exec || n > c->in_cap) return false;
    const double t0 = c->graph_timing ? wall_ms() : 0;
    cuda_table_flush(c);
    /* no join: copies still in flight fill slots that no entry points at yet (the expert
     * store points one at a slot only after copy_wait), so the step runs beside them */
    copy_flush(c);
    CU(cudaStreamSynchronize(c->stream));
    write_inputs(c, tokens, n, pos0);
    if (c->graph_timing) CU(cudaEventRecord(c->ev0, c->stream));
    cuda_ktrace_replay_begin(c, g);
    CU(cudaGraphLaunch(g->exec, c->stream));
    if (c->graph_timing) CU(cudaEventRecord(c->ev1, c->stream));
    finish_graph_run(c, g);
    cuda_ktrace_replay_end(c, g);
    cuda_act_invalidate(c);
    if (c->graph_timing) {
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, c->ev0, c->ev1));
        c->graph_gpu_ms += ms;
        c->graph_call_ms += wall_ms() - t0;
        c->timed_replays++;
    }
    return true;
}

static void op_capture_begin(backend *b, uint64_t key) {
    cuda_backend *c = CB(b);
    graph_slot *g = slot_of(c, key, true);
    c->cur_graph = g;
    if (c->no_graph || c->profile || c->host_prof || g->failed || g->runs == 0) return; /* an eager run */
    cuda_table_flush(c);
    copy_join(c);
    ensure_stage(c, 64ull << 20);
    CU(cudaStreamSynchronize(c->stream));
    cuda_act_invalidate(c);
    /* every activation entry large enough for any decode-sized encoding seen so far: an entry
     * that had to grow while capturing would make the capture fail */
    for (auto &e : c->acts)
        if (e.cap < c->act_small_max) {
            dev_free(c, e.buf);
            e.cap = c->act_small_max;
            e.buf = dev_alloc(c, e.cap);
            if (!e.buf) {
                fprintf(stderr, "sluice: out of device memory for activations\n");
                abort();
            }
        }
    c->stage_used = 0;
    g->host_copies.clear();
    c->capture_broken = false;
    cuda_ktrace_capture_begin(c);
    CU(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed));
    c->capturing = true;
}

static void op_graph_drop(backend *b, uint64_t key) {
    cuda_backend *c = CB(b);
    graph_slot *g = slot_of(c, key, false);
    if (!g) return;
    if (g->exec) cudaGraphExecDestroy(g->exec);
    g->exec = nullptr;
    g->runs = 0;
    g->failed = false;
    g->key = 0; /* free for reuse */
}

/* 0: done; 1: the pass was only recorded and could not be captured: run it again eagerly;
 * -1: failure. */
static int op_capture_end(backend *b, bool ok) {
    cuda_backend *c = CB(b);
    graph_slot *g = c->cur_graph;
    c->cur_graph = nullptr;
    if (!c->capturing) {
        if (g && ok) g->runs++;
        return ok ? 0 : -1;
    }
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    c->capturing = false;
    cuda_ktrace_capture_end(c, g);
    for (void *p : c->deferred_free) dev_free(c, p);
    c->deferred_free.clear();
    if (e != cudaSuccess || !ok || c->capture_broken || !graph) {
        if (ok) /* once per session: its decode steps run eagerly from now on */
            fprintf(stderr, "sluice: CUDA graph capture failed (%s); decode steps run eagerly\n",
                    e != cudaSuccess ? cudaGetErrorString(e) : "a buffer had to change while recording");
        cudaGetLastError();
        if (graph) cudaGraphDestroy(graph);
        g->failed = true;
        return ok ? 1 : -1;
    }
    e = cudaGraphInstantiateWithFlags(&g->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        cudaGetLastError();
        g->exec = nullptr;
        g->failed = true;
        return 1;
    }
    CU(cudaGraphLaunch(g->exec, c->stream));
    finish_graph_run(c, g);
    cuda_act_invalidate(c);
    return 0;
}

/* ---- lifecycle -------------------------------------------------------------------------------- */

static void op_free(backend *b) {
    cuda_backend *c = CB(b);
    copy_flush(c);
    cudaStreamSynchronize(c->copy_stream);
    cudaStreamSynchronize(c->stream);
    if (c->graph_timing && c->timed_replays)
        fprintf(stderr, "sluice: %d graph replays: device %.3f ms, replay call %.3f ms per step\n",
                c->timed_replays, c->graph_gpu_ms / c->timed_replays, c->graph_call_ms / c->timed_replays);
    cuda_ktrace_report(c);
    if (c->host_prof) {
        fprintf(stderr, "sluice: CUDA host time per op (SLUICE_CUDA_HOST_PROF; ms, calls):\n");
        backend_cuda_profile_report(&c->base, stderr);
    }
    cuda_ktrace_free(c);
    for (auto &g : c->graphs)
        if (g.exec) cudaGraphExecDestroy(g.exec);
    for (auto &e : c->acts) dev_free(c, e.buf);
    for (int i = 0; i < SCR_COUNT; i++) dev_free(c, c->scratch[i]);
    for (void *p : c->weight_blocks) dev_free(c, p);
    cuda_host_free(c);
    for (void *p : c->host_copies_pinned) cudaFreeHost(p);
    dev_free(c, c->d_table);
    dev_free(c, c->d_in);
    dev_free(c, c->amax);
    dev_free(c, c->tables);
    if (c->h_in) cudaFreeHost(c->h_in);
    if (c->h_stage) cudaFreeHost(c->h_stage);
    cudaEventDestroy(c->ev0);
    cudaEventDestroy(c->ev1);
    cudaStreamDestroy(c->stream);
    cudaEventDestroy(c->copy_guard);
    cudaEventDestroy(c->copy_done);
    cudaEventDestroy(c->copy_mark);
    cudaStreamDestroy(c->copy_stream);
    c->h_table.clear();
    delete c;
}

static backend_ops make_ops() {
    backend_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.free = op_free;
    o.embed = cuda_op_embed;
    o.matmul = cuda_op_matmul;
    o.matmul_multi = cuda_op_matmul_multi;
    o.rmsnorm = cuda_op_rmsnorm;
    o.rope = cuda_op_rope;
    o.attention = cuda_op_attention;
    o.attention_gated = cuda_op_attention_gated;
    o.argmax_row = getenv("SLUICE_CUDA_HOST_ARGMAX") ? nullptr : cuda_op_argmax_row;
    o.add = cuda_op_add;
    o.swiglu = cuda_op_swiglu;
    o.matmul_swiglu = cuda_op_matmul_swiglu;
    o.l2norm = cuda_op_l2norm;
    o.conv1d_silu = cuda_op_conv1d_silu;
    o.gated_delta = cuda_op_gated_delta;
    o.sigmoid_mul = cuda_op_sigmoid_mul;
    o.moe_tail = cuda_op_moe_tail;
    o.gdn_conv_split = cuda_op_gdn_conv_split;
    o.qk_norm_rope_store = cuda_op_qk_norm_rope_store;
    o.add_rmsnorm = cuda_op_add_rmsnorm;
    o.rmsnorm_swiglu = cuda_op_rmsnorm_swiglu;
    o.moe_tail_rmsnorm = cuda_op_moe_tail_rmsnorm;
    o.gdn_gates = cuda_op_gdn_gates;
    o.alloc = op_alloc;
    o.mfree = op_mfree;
    o.upload = op_upload;
    o.download = op_download;
    o.memzero = op_memzero;
    o.copy_rows = cuda_op_copy_rows;
    o.kv_store = cuda_op_kv_store;
    o.set_inputs = op_set_inputs;
    o.moe_route = cuda_op_moe_route;
    o.gather_rows = nullptr; /* the expert table replaces the host loop */
    o.scatter_rows = nullptr;
    o.moe_combine = nullptr;
    o.weights_map = op_weights_map;
    o.experts_init = op_experts_init;
    o.experts_set = op_experts_set;
    o.moe_experts = cuda_op_moe_experts;
    o.moe_prefetch = cuda_op_moe_prefetch;
    o.moe_experts_shared = cuda_op_moe_experts_shared;
    o.moe_experts_host = cuda_op_moe_experts_host;
    o.host_alloc = op_host_alloc;
    o.host_free = op_host_free;
    o.copy_async = op_copy_async;
    o.copy_end = op_copy_end;
    o.copy_wait = op_copy_wait;
    o.copy_fence = op_copy_fence;
    o.sync = op_sync;
    o.graph_replay = op_graph_replay;
    o.capture_begin = op_capture_begin;
    o.capture_end = op_capture_end;
    o.graph_drop = op_graph_drop;
    return o;
}

static const backend_ops cuda_ops = make_ops();

bool backend_cuda_probe(int device, cuda_device_info *out) {
    memset(out, 0, sizeof *out);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= device) {
        snprintf(out->error, sizeof out->error, "%s",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no such CUDA device");
        cudaGetLastError();
        return false;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
        snprintf(out->error, sizeof out->error, "cannot open CUDA device %d", device);
        cudaGetLastError();
        return false;
    }
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    out->present = true;
    snprintf(out->name, sizeof out->name, "%.127s", p.name);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    out->mem_free = fr;
    out->mem_total = tot;
    out->can_map_host = p.canMapHostMemory != 0;
    return true;
}

backend *backend_cuda_new(const backend_cuda_params *p, char *err, size_t err_len) {
    cuda_device_info info;
    if (!backend_cuda_probe(p->device, &info)) {
        snprintf(err, err_len, "no CUDA device: %s", info.error);
        return nullptr;
    }
    if (info.cc_major < 8) {
        snprintf(err, err_len, "%s has compute capability %d.%d; the CUDA backend needs 8.0+",
                 info.name, info.cc_major, info.cc_minor);
        return nullptr;
    }
    cuda_backend *c = new cuda_backend();
    c->base.ops = &cuda_ops;
    c->base.n_threads = 1;
    c->base.host_memory = false;
    c->device = p->device;
    c->budget = p->budget;
    c->no_graph = p->no_graph;
    c->profile = p->profile;
    c->host_prof = !c->profile && getenv("SLUICE_CUDA_HOST_PROF") != nullptr;
    c->graph_timing = getenv("SLUICE_CUDA_GRAPH_TIMING") != nullptr;
    c->attn_rows = getenv("SLUICE_CUDA_ATTN_ROWS") != nullptr;
    c->no_qk_fuse = getenv("SLUICE_CUDA_NO_QK_FUSE") != nullptr;
    c->attn_wide = getenv("SLUICE_CUDA_ATTN_WIDE") != nullptr;
    c->no_add_norm = getenv("SLUICE_CUDA_NO_ADD_NORM") != nullptr;
    c->mm_cols64 = getenv("SLUICE_CUDA_MM_COLS64") != nullptr;
    c->mv_prefetch = getenv("SLUICE_CUDA_MV_PREFETCH") ? atoi(getenv("SLUICE_CUDA_MV_PREFETCH")) : 3;
    c->q6_spread = !getenv("SLUICE_CUDA_Q6_SPREAD") || atoi(getenv("SLUICE_CUDA_Q6_SPREAD")) != 0;
    c->act_trace = getenv("SLUICE_CUDA_ACT_TRACE") != nullptr;
    c->shared_in_experts = getenv("SLUICE_CUDA_SHARED_APART") == nullptr;
    c->mv_half = !getenv("SLUICE_CUDA_MV_HALF") || atoi(getenv("SLUICE_CUDA_MV_HALF")) != 0;
    c->mv_pair = !getenv("SLUICE_CUDA_MV_PAIR") || atoi(getenv("SLUICE_CUDA_MV_PAIR")) != 0;
    c->copy_batch = !getenv("SLUICE_CUDA_COPY_BATCH") || atoi(getenv("SLUICE_CUDA_COPY_BATCH")) != 0;
    c->mv_encode = !getenv("SLUICE_CUDA_MV_ENCODE") || atoi(getenv("SLUICE_CUDA_MV_ENCODE")) != 0;
    c->no_tail_norm = getenv("SLUICE_CUDA_NO_TAIL_NORM") != nullptr;
    c->attn_encode = !getenv("SLUICE_CUDA_ATTN_ENCODE") || atoi(getenv("SLUICE_CUDA_ATTN_ENCODE")) != 0;
    c->norm_swiglu = !getenv("SLUICE_CUDA_NORM_SWIGLU") || atoi(getenv("SLUICE_CUDA_NORM_SWIGLU")) != 0;
    c->gates_apart = getenv("SLUICE_CUDA_GATES_APART") != nullptr;
    c->attn_gate_apart = getenv("SLUICE_CUDA_ATTN_GATE_APART") != nullptr;
    c->mv_mix = !getenv("SLUICE_CUDA_MV_MIX") || atoi(getenv("SLUICE_CUDA_MV_MIX")) != 0;
    cuda_pdl = info.cc_major >= 9 && !getenv("SLUICE_CUDA_NO_PDL");
    cuda_ktrace_init(c);
    CU(cudaGetDeviceProperties(&c->prop, p->device));
    CU(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking));
    CU(cudaEventCreateWithFlags(&c->copy_guard, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&c->copy_done, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&c->copy_mark, cudaEventDisableTiming));
    CU(cudaEventCreate(&c->ev0));
    CU(cudaEventCreate(&c->ev1));
    /* code books */
    qtables h;
    memcpy(h.kv_iq4nl, quant_kvalues_iq4nl, 16);
    memcpy(h.kv_mxfp4, quant_kvalues_mxfp4, 16);
    memcpy(h.ksigns, quant_ksigns_iq2xs, 128);
    memcpy(h.iq2xxs, quant_iq2xxs_grid, sizeof h.iq2xxs);
    memcpy(h.iq2xs, quant_iq2xs_grid, sizeof h.iq2xs);
    memcpy(h.iq3xxs, quant_iq3xxs_grid, sizeof h.iq3xxs);
    c->tables = (qtables *)dev_alloc(c, sizeof h);
    if (!c->tables) {
        snprintf(err, err_len, "out of device memory");
        delete c;
        return nullptr;
    }
    cuda_upload_sync(c->tables, &h, sizeof h);
    return &c->base;
}

uint64_t backend_cuda_allocated(const backend *b) {
    return reinterpret_cast<const cuda_backend *>(b)->allocated;
}
