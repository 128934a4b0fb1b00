/* Internals of the CUDA backend shared by its translation units: the backend object, error
 * handling, device memory helpers and the launchers each .cu file exports.
 *
 * Execution model: every operation is queued on ONE compute stream in program order, so table
 * updates and kernels are ordered exactly as the host issued them. Expert cache fills
 * (copy_async) run on a second, copy stream so they overlap the kernels: a batch of copies
 * starts after the compute work queued before it (its slots may have been read until then);
 * copy_end(mark) remembers the copies so far and copy_wait makes later compute wait for them,
 * so a layer's kernels wait for its own experts but not for the next layer's lookahead copies. The host waits only in download
 * (and sync). A decode step can be captured as a CUDA graph: operations
 * then only record; the graph reads every per-step value (token ids, positions) from device
 * buffers that set_inputs fills, so replaying it is equivalent to running the step again. */
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

extern "C" {
#include "backends/backend.h"
#include "backends/cuda/backend_cuda.h"
}
#include "backends/cuda/cuda_quant.cuh"

/* Fatal CUDA errors: the backend has no way to report an error from most ops (they return
 * void), and continuing after a failed launch would produce garbage; print and abort. */
void cuda_fail(const char *what, cudaError_t e, const char *file, int line);
#define CU(call)                                                                                 \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) cuda_fail(#call, e_, __FILE__, __LINE__);                         \
    } while (0)
#define CU_LAUNCH() CU(cudaPeekAtLastError())

/* Programmatic dependent launch (sm_90): a kernel queued with pdl_launch may be started while
 * the kernel before it is still running, so that launching and scheduling it overlap that
 * kernel's tail; its first statement, pdl_wait, waits until the previous kernel has finished
 * and its writes are visible, then lets the next kernel start launching. A decode step is a
 * chain of ~33 small dependent kernels per layer, each a few microseconds long, so the launch
 * gap between them is a large share of the step. Every kernel launched through pdl_launch must
 * call pdl_wait before it reads or writes memory that another kernel writes; kernels launched
 * plainly (<<<>>>) are fully ordered as before. What may come before it: prefetching weights
 * that no kernel writes (l2_prefetch), so that their DRAM latency overlaps the previous kernel.
 * SLUICE_CUDA_NO_PDL=1 turns it off (measurement, bisection). */
#ifdef SLUICE_KTRACE
/* Kernel trace (a build with -DSLUICE_CUDA_KTRACE=ON, run with SLUICE_CUDA_KTRACE=1; see
 * cuda_ktrace.cu): block (0, 0, 0) of every kernel stamps the global timer as its pdl_wait
 * returns, in launch order. One buffer pointer per translation unit (KTRACE_TU). */
#define KTRACE_MAX 8192
struct ktrace_buf {
    unsigned long long count;
    unsigned long long t[KTRACE_MAX];
};
static __device__ ktrace_buf *g_ktrace;
__device__ __forceinline__ void ktrace_stamp() {
    if (threadIdx.x | threadIdx.y | blockIdx.x | blockIdx.y | blockIdx.z) return;
    ktrace_buf *b = g_ktrace;
    if (!b) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    const unsigned long long i = atomicAdd(&b->count, 1ull);
    if (i < KTRACE_MAX) b->t[i] = t;
}
#define KTRACE_TU(name) \
    void cuda_ktrace_attach_##name(void *p) { CU(cudaMemcpyToSymbol(g_ktrace, &p, sizeof p)); }
void cuda_ktrace_attach_matmul(void *p);
void cuda_ktrace_attach_moe(void *p);
void cuda_ktrace_attach_ops(void *p);
void cuda_ktrace_attach_attention(void *p);
extern std::vector<const void *> *cuda_ktrace_log; /* kernels launched, while recording */
#else
#define KTRACE_TU(name)
#endif

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#ifdef SLUICE_KTRACE
    ktrace_stamp();
#endif
}

/* sigmoid as every kernel rounds it (sigmoid_mul, the gates, the fused gated attention) */
__device__ __forceinline__ float sigmoidf_(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

/* Ask L2 for bytes [p, p + n) (sm_90 bulk prefetch: the 16-byte units inside the range, one
 * instruction, no registers, no completion to wait for). Values are never changed by it. */
__device__ __forceinline__ void l2_prefetch(const void *p, uint32_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uintptr_t a = reinterpret_cast<uintptr_t>(p), a16 = (a + 15) & ~(uintptr_t)15;
    if (n <= a16 - a) return;
    const uint32_t m = (n - (uint32_t)(a16 - a)) & ~15u;
    if (m) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a16), "r"(m) : "memory");
#endif
}

/* cp.async: 16 bytes (of which `n` are read, the rest zero-filled) or 4, global to shared */
__device__ __forceinline__ void cp16(void *dst, const void *src, int n) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp4(void *dst, const void *src, int n) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

extern bool cuda_pdl; /* set when a backend is created: sm_90 or later and not turned off */

template <typename... KArgs, typename... Args>
static inline void pdl_launch(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                              Args... args) {
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = &at;
    cfg.numAttrs = cuda_pdl ? 1 : 0;
#ifdef SLUICE_KTRACE
    if (cuda_ktrace_log) cuda_ktrace_log->push_back(reinterpret_cast<const void *>(kern));
#endif
    CU(cudaLaunchKernelEx(&cfg, kern, static_cast<KArgs>(args)...));
}

/* A host range the device reaches: an upload (dev = its device copy) or a pinned host range
 * (dev = the device address of the host memory). */
struct cuda_range {
    uintptr_t host;
    size_t bytes;
    uintptr_t dev;
    uintptr_t pin; /* pinned ranges: the page-locked host copy */
};

/* Activations encoded for one weight type's dot products (see cuda_quant.cuh). */
struct qact {
    const int8_t *q;  /* [n][K] codes */
    const float *d;   /* [n][K / B] scales */
    const int *bs;    /* [n][K / 16] group sums (Q8_K) */
    const float *f;   /* [n][K] float activations (F32 / F16 / BF16 weights) */
    int64_t K;
    int act;          /* QT_Q8_0, QT_Q8_K, QT_F32, QT_F16, QT_BF16 */
};

/* A cached encoding of an activation buffer (consecutive matrix products of one input reuse it). */
struct act_cache_entry {
    const void *src;
    int n;
    int64_t K;
    int act;
    void *buf;
    size_t cap;
    bool valid;
    uint64_t age;
};

/* Per layer of the expert table: the three parts' shapes. */
struct expert_shape {
    bool present;
    uint32_t type[3];
    int64_t ne0[3], ne1[3];
    size_t row_bytes[3];
};

/* Device expert table entry: the parts' device-reachable addresses. */
struct expert_entry {
    const uint8_t *p[3];
};

struct table_update {
    int index; /* layer * n_expert + expert */
    expert_entry e;
};

struct graph_slot {
    uint64_t key;
    int runs;               /* eager runs seen (capture on the second) */
    cudaGraphExec_t exec;
    bool failed;            /* capture impossible for this key: always eager */
    std::vector<std::pair<void *, std::pair<size_t, size_t>>> host_copies; /* dst, (off, bytes) */
    /* kernel trace (cuda_ktrace.cu): the captured kernels in order, and per kernel the sum over
     * traced replays of the time from its stamp to the next one */
    std::vector<const void *> kt_kernels;
    std::vector<double> kt_us;
    double kt_step_us = 0;
    int kt_runs = 0;
};

struct prof_entry {
    const char *name;
    double ms;
    uint64_t calls;
};

struct cuda_backend {
    backend base;
    int device;
    cudaStream_t stream;
    cudaStream_t copy_stream;  /* expert cache fills (op_copy_async) */
    cudaEvent_t copy_guard;    /* compute work before a copy batch */
    cudaEvent_t copy_done;     /* every copy so far (copy_join: sync, graphs) */
    cudaEvent_t copy_mark;     /* the copies up to the last copy_end(mark) */
    bool copy_marked;          /* copy_mark recorded and not yet waited for */
    bool copy_batch_open;      /* copy_guard recorded for the current batch */
    bool copy_fenced;          /* copy_guard recorded early for the next batch (op_copy_fence) */
    bool copies_unwaited;      /* copies queued that compute has not been made to wait for */
    bool copies_since_mark;    /* copies queued since copy_mark was last recorded */
    /* the copies of the open batch, issued together at its end (copy_flush): one
     * cudaMemcpyBatchAsync instead of a call each; SLUICE_CUDA_COPY_BATCH=0 issues them one by one */
    std::vector<void *> cp_dst;
    std::vector<const void *> cp_src;
    std::vector<size_t> cp_size;
    bool copy_batch;
    cudaDeviceProp prop;
    uint64_t budget;           /* bytes the backend may allocate (0: unlimited) */
    uint64_t allocated;        /* device bytes held (weights, state, scratch, cache) */
    qtables *tables;           /* device copy of the code books */
    /* weights */
    std::vector<cuda_range> uploads, pinned;
    std::vector<cuda_range> host_bufs; /* host_alloc's page-locked buffers (downloads land there) */
    std::vector<void *> weight_blocks;  /* device allocations holding uploads */
    std::vector<void *> host_copies_pinned; /* page-locked host copies of pinned ranges */
    /* step inputs */
    int32_t *h_in;             /* pinned: ids [cap] then positions [cap] */
    int32_t *d_in;
    int in_cap, in_n;
    /* downloads go through pinned staging */
    uint8_t *h_stage;
    size_t stage_cap, stage_used;
    /* scratch */
    act_cache_entry acts[8];
    uint64_t act_age;
    size_t act_small_max;      /* largest encoding of <= 8 rows seen (sizes entries before a capture) */
    void *scratch[8];          /* named work buffers, see cuda_scratch */
    size_t scratch_cap[8];
    std::vector<void *> deferred_free; /* buffers replaced while capturing */
    /* expert table */
    int n_layer, n_expert;
    std::vector<expert_shape> shapes;
    expert_entry *d_table;
    std::vector<expert_entry> h_table; /* host mirror */
    std::vector<table_update> pending;
    /* graphs */
    std::vector<graph_slot> graphs;
    bool capturing;
    bool capture_broken;
    graph_slot *cur_graph;
    bool no_graph;
    /* profile */
    bool profile;
    cudaEvent_t ev0, ev1;
    std::vector<prof_entry> prof;
    bool host_prof;            /* SLUICE_CUDA_HOST_PROF: prof holds the host's time per op */
    int hp_depth;
    double hp_t0;
    /* SLUICE_CUDA_GRAPH_TIMING: the device time of graph replays against the host's time for
     * the whole replay call (inputs, launch, wait, logits copy), printed at exit */
    bool graph_timing;
    bool attn_rows;            /* SLUICE_CUDA_ATTN_ROWS: prefill attention by the warp-per-row kernel */
    bool no_qk_fuse;           /* SLUICE_CUDA_NO_QK_FUSE: q/k norms, RoPE and KV store as five ops */
    bool attn_wide;            /* SLUICE_CUDA_ATTN_WIDE: decode attention with eight rows' registers
                                * a thread even for one row a warp (k_attn RPW, measurement) */
    bool no_add_norm;          /* SLUICE_CUDA_NO_ADD_NORM: the residual add and the norm as two ops */
    bool mm_cols64;            /* SLUICE_CUDA_MM_COLS64: dense tiled products in 64-column blocks */
    bool act_trace;            /* SLUICE_CUDA_ACT_TRACE: every activation encoding, eviction and drop */
    void *ktrace;              /* SLUICE_CUDA_KTRACE: the device trace buffer (cuda_ktrace.cu) */
    bool mv_half;              /* rows of at most half a warp's blocks take half a warp each
                                * (k_mv_q W = 16); SLUICE_CUDA_MV_HALF=0 turns it off */
    bool mv_encode;            /* cuda_mv_encodes: SLUICE_CUDA_MV_ENCODE=0 turns it off */
    bool no_tail_norm;         /* SLUICE_CUDA_NO_TAIL_NORM: moe_tail and the next norm as two ops */
    bool attn_encode;          /* decode attention's split combine encodes its output to Q8_K
                                * (k_attn_combine q); SLUICE_CUDA_ATTN_ENCODE=0 turns it off */
    bool norm_swiglu;          /* rmsnorm_swiglu fused (k_norm_swiglu); SLUICE_CUDA_NORM_SWIGLU=0 off */
    bool gates_apart;          /* SLUICE_CUDA_GATES_APART: gdn_gates as its own launch, not in
                                * gdn_conv_split's (measurement) */
    void *amax;                /* cuda_op_argmax_row's partial picks, arrival count and pick */
    bool attn_gate_apart;      /* SLUICE_CUDA_ATTN_GATE_APART: gated attention's sigmoid gate as
                                * its own ops, not in the decode combine (measurement) */
    bool mv_mix;               /* one token's products by matrices of two K-quant types in one
                                * launch (k_mv_q_mix); SLUICE_CUDA_MV_MIX=0 turns it off */
    bool shared_in_experts;    /* the shared expert in the routed experts' decode launches
                                * (moe_experts_shared); SLUICE_CUDA_SHARED_APART turns it off */
    bool mv_pair;              /* one token's grouped rows two to a warp (k_mv_q PAIR);
                                * SLUICE_CUDA_MV_PAIR=0 turns it off */
    int mv_prefetch;           /* SLUICE_CUDA_MV_PREFETCH (default 3): weights asked of L2 early:
                                * bit 0, a plain matrix-vector product's rows before pdl_wait;
                                * bit 1, an expert's rows (through the table) after it; bit 2,
                                * the routed experts as soon as they are chosen (moe_prefetch;
                                * off by default since the shared expert left the chain: its
                                * launch then cost more than it saved) */
    int q6_spread;             /* matrix-vector Q6_K rows by q6s_chunk (cuda_matmul.cu);
                                * SLUICE_CUDA_Q6_SPREAD=0 turns it off (measurement) */
    int timed_replays;
    double graph_gpu_ms, graph_call_ms;
    /* routed experts computed by the host (cuda_moe_host.cu, --gpu-miss host) */
    std::vector<uint8_t> h_on_host;       /* [layer][expert]: the entry points at pinned host memory */
    std::vector<expert_entry> h_host_ptr; /* ... at these host addresses (the page-locked copy) */
    struct threadpool *host_pool;         /* created on first use */
    void *host_work;                      /* device_experts_run's scratch */
    size_t host_work_cap;
    float *h_rows;                        /* pinned: the host's slot outputs [slots][E] */
    int32_t *h_ids;                       /* pinned: the ids with -1 at the host's slots */
    size_t h_rows_cap, h_ids_cap;
    uint64_t host_slots;                  /* slots the host computed (stats) */
    uint64_t host_calls;                  /* layers with host slots */
    double host_ms;                       /* the host's compute time over them (wall) */
};

/* Scratch buffer ids. */
enum {
    SCR_ATTN = 0, /* attention split partials */
    SCR_MOE = 1,  /* MoE intermediates */
    SCR_GROUP = 2, /* MoE grouping lists */
    SCR_TMP = 3,
    SCR_HOST_IDS = 4, /* moe_experts_host: the device's ids (cuda_moe_host.cu) */
    /* 5..7: expert parallelism (cuda_ep.cu) */
    SCR_COUNT = 8
};

/* The RMSNorm scale of a row of dim values held by one warp, PER a lane: squares summed in
 * double in the order the lane holds them, the fixed butterfly, 1 / sqrt(mean + eps). It is
 * the arithmetic of k_norm<false, 32> (lane-strided values) and of k_norm8 at 256 values (one
 * warp, eight consecutive a lane), so kernels that norm a head row by one warp give their bits. */
template <int PER> __device__ __forceinline__ float warp_rms_scale(const float (&v)[PER], int dim, float eps) {
    double s = 0.0;
#pragma unroll
    for (int j = 0; j < PER; j++) s += (double)__fmul_rn(v[j], v[j]);
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(s / dim), eps)));
}

/* Pair i of a head (dims i0, i1) at position pos, rotated with the CPU's angle recipe. Shared by
 * k_rope and the attention-input kernels, so both give the same bits. */
__device__ __forceinline__ void rope_dims(int i, int half, int neox, int *i0, int *i1) {
    *i0 = neox ? i : 2 * i;
    *i1 = neox ? i + half : 2 * i + 1;
}
__device__ __forceinline__ void rope_rotate(int i, float pos, float theta_scale, float x0, float x1, float *y0,
                                            float *y1) {
    float theta = pos;
    for (int j = 0; j < i; j++) theta = __fmul_rn(theta, theta_scale);
    const float cs = cosf(theta), sn = sinf(theta);
    *y0 = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
    *y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
}


static inline cuda_backend *CB(backend *b) { return reinterpret_cast<cuda_backend *>(b); }

/* Device scratch of at least bytes (contents undefined; valid until the next call with the
 * same id). Grows eagerly; while capturing, the old buffer's release is deferred. */
void *cuda_scratch(cuda_backend *c, int id, size_t bytes);
/* Device-reachable address of a weight pointer (uploads first, then pinned ranges; other
 * pointers are device memory already and pass through). */
const void *cuda_dev(const cuda_backend *c, const void *p);
/* A weight pointer of known size: as cuda_dev, and host memory outside every mapped range
 * (buffers the model converted at load) is uploaded on first use. */
const void *cuda_weight(cuda_backend *c, const void *p, size_t bytes);
/* a host-to-device copy that has landed when it returns (pageable sources included) */
void cuda_upload_sync(void *dst, const void *src, size_t bytes);
/* Encoded activations of n rows of K floats at x for weight type `type` (cached). */
qact cuda_act(cuda_backend *c, const float *x, int n, int64_t K, uint32_t type);
/* A cache entry for x's encoding `act` (QT_Q8_K, ...) that the caller's own kernel fills (a
 * producer that encodes its output as it writes it, saving the encoder's launch); valid once
 * that kernel has run, which stream order guarantees for every later consumer. */
qact cuda_act_reserve(cuda_backend *c, const float *x, int n, int64_t K, int act);
/* Q8_K encoding of one block of 256 floats by one warp (lane = 0..31): codes, scale, the 16
 * group sums (ggml's reference rule: the value of largest magnitude, the first on ties, maps to
 * -127; round half to even; clamp at 127; d = 1 / iscale). The encoder kernel and producers that
 * encode their own output share it, so both give the same bits. */
__device__ __forceinline__ void q8k_block_regs(const float v[8], int lane, int8_t *qb, float *d, int *bs) {
    float am = -1.0f, mx = 0.0f;
    int ai = 0;
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (fabsf(v[j]) > am) {
            am = fabsf(v[j]);
            ai = lane * 8 + j;
            mx = v[j];
        }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) {
        const float oam = __shfl_xor_sync(0xffffffffu, am, off);
        const int oai = __shfl_xor_sync(0xffffffffu, ai, off);
        const float omx = __shfl_xor_sync(0xffffffffu, mx, off);
        if (oam > am || (oam == am && oai < ai)) {
            am = oam;
            ai = oai;
            mx = omx;
        }
    }
    int8_t *qo = qb + lane * 8;
    int s = 0;
    if (am == 0.0f) {
        *reinterpret_cast<uint2 *>(qo) = make_uint2(0, 0);
    } else {
        const float iscale = __fdiv_rn(-127.0f, mx);
        uint32_t w0 = 0, w1 = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int qv = __float2int_rn(__fmul_rn(iscale, v[j]));
            qv = qv > 127 ? 127 : qv;
            s += qv;
            if (j < 4) w0 |= (uint32_t)(qv & 0xff) << (8 * j);
            else w1 |= (uint32_t)(qv & 0xff) << (8 * (j - 4));
        }
        *reinterpret_cast<uint2 *>(qo) = make_uint2(w0, w1);
        if (lane == 0) *d = __fdiv_rn(1.0f, iscale);
    }
    if (am == 0.0f && lane == 0) *d = 0.0f;
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    if ((lane & 1) == 0) bs[lane / 2] = s;
}

__device__ __forceinline__ void q8k_block(const float *src, int lane, int8_t *qb, float *d, int *bs) {
    src += lane * 8;
    float v[8];
    const float4 u0 = *reinterpret_cast<const float4 *>(src), u1 = *reinterpret_cast<const float4 *>(src + 4);
    v[0] = u0.x; v[1] = u0.y; v[2] = u0.z; v[3] = u0.w;
    v[4] = u1.x; v[5] = u1.y; v[6] = u1.z; v[7] = u1.w;
    q8k_block_regs(v, lane, qb, d, bs);
}

/* Forget cached encodings (any op that writes memory calls it, unless it is known not to
 * touch a cached source). */
void cuda_act_invalidate(cuda_backend *c);
void cuda_act_invalidate_range(cuda_backend *c, const void *p, size_t bytes);
/* Flush pending expert-table updates (one small kernel, ordered before later work). */
void cuda_table_flush(cuda_backend *c);

/* Profiling: bracket an op (no-ops unless profiling). */
/* ---- cuda_ktrace.cu (no-ops unless built with SLUICE_CUDA_KTRACE) ---- */
void cuda_ktrace_init(cuda_backend *c);
void cuda_ktrace_capture_begin(cuda_backend *c);
void cuda_ktrace_capture_end(cuda_backend *c, graph_slot *g);
void cuda_ktrace_replay_begin(cuda_backend *c, graph_slot *g);
void cuda_ktrace_replay_end(cuda_backend *c, graph_slot *g);
void cuda_ktrace_report(cuda_backend *c);
void cuda_ktrace_free(cuda_backend *c);

void cuda_prof_begin(cuda_backend *c);
void cuda_prof_end(cuda_backend *c, const char *name);

/* ---- cuda_matmul.cu ---- */
bool cuda_type_supported(uint32_t type);
int cuda_act_type(uint32_t type);
void cuda_quantize_act(cuda_backend *c, const float *x, int n, int64_t K, int act, void *buf);
size_t cuda_act_bytes(int n, int64_t K, int act);
qact cuda_act_view(void *buf, int n, int64_t K, int act);

/* Where a matrix product's weight rows and activation rows come from: a plain matrix, or per
 * output group an expert of the table (MoE). */
struct mm_src {
    const uint8_t *w;          /* plain: the matrix */
    size_t row_bytes;
    const expert_entry *table; /* grouped: the layer's table row, or NULL */
    int part;                  /* EXPERT_GATE / UP / DOWN */
    /* grouped, decode form: slot j of [n_slots] reads expert ids[j], activation row j / act_div
     * and writes output row j */
    const int32_t *ids;
    int act_div;
    /* grouped, decode form, optional (NULL: none): slots n_tab and up are a plain matrix (the
     * shared expert, computed in the routed experts' launch): slot n_tab + t reads `extra`,
     * activation row x_arow0 + t and writes row t of the launch's xout */
    const uint8_t *extra;
    int n_tab, x_arow0;
};

/* out[t][r] = W_r . x_t. Plain: n tokens; grouped (src.table): n slots. dual: a second source
 * (same shape) whose product u gives out = silu(W.x) * u. */
void cuda_matvec(cuda_backend *c, uint32_t type, int64_t K, int64_t rows, const mm_src *s,
                 const mm_src *s2, const qact *a, int n, float *out, int64_t ostride, float *xout = nullptr,
                 const float *xin = nullptr);
/* Whether cuda_matvec can take a decode product's F32 input as it is (xin) and encode it in the
 * kernel (half-warp rows of K <= 512 whose activations are Q8_K). */
bool cuda_mv_encodes(const cuda_backend *c, uint32_t type, int64_t K);
/* Grouped tiled product for prefill: tiles (expert, entries) from cuda_moe's grouping. */
struct mm_groups {
    const int32_t *list;       /* entries (token * k + slot) grouped by expert */
    const int32_t *tile_exp;   /* per tile: expert */
    const int32_t *tile_off;   /* per tile: first index into list */
    const int32_t *tile_cnt;   /* per tile: entries (<= 64) */
    const int32_t *n_tiles;    /* device scalar */
    int max_tiles;
    int act_div;               /* activation row = entry / act_div (gate/up: k; down: 1) */
};
void cuda_matmul_tiled(cuda_backend *c, uint32_t type, int64_t K, int64_t rows, const mm_src *s,
                       const mm_groups *g, const qact *a, int n, float *out, int64_t ostride);

void cuda_op_embed(backend *b, const tview *w, const int32_t *ids, int n, float *out);
void cuda_op_matmul(backend *b, const tview *w, const float *x, int n, float *out, int out_stride);
void cuda_op_moe_tail(backend *b, float *x, float *y, float *s, const float *g, int n_rows, int dim);
bool cuda_op_moe_tail_rmsnorm(backend *b, float *x, float *y, float *s, const float *g, int n_rows, int dim,
                              const tview *w, float eps, float *out);
bool cuda_op_rmsnorm_swiglu(backend *b, float *x, const tview *w, int n_rows, int dim, float eps, float *g);
bool cuda_op_add_rmsnorm(backend *b, float *x, const float *a, const tview *w, int n_rows, int dim, float eps,
                         float *y);
bool cuda_op_qk_norm_rope_store(backend *b, float *q, float *k, const float *v, int n, int n_head,
                                int n_head_kv, int head_dim, const tview *q_norm, const tview *k_norm,
                                float eps, int n_rot, const int32_t *pos, float freq_base, rope_mode mode,
                                float *kc, float *vc, size_t row_k, size_t row_v);
int cuda_op_gdn_conv_split(backend *b, const float *x, int n, int kd, int vd, int dk, const float *w,
                           int kernel, float *state, float eps, float *q, float *k, float *v,
                           const gdn_gate_args *gates);
void cuda_op_matmul_multi(backend *b, int nw, const tview *const *w, const float *x, int n,
                          float *const *out);
void cuda_op_matmul_swiglu(backend *b, const tview *gate, const tview *up, const float *x, int n,
                           float *out);

/* ---- cuda_moe.cu ---- */
void cuda_op_moe_route(backend *b, float *logits, int n, int n_expert, int k, bool norm,
                       int32_t *ids, float *w);
void cuda_op_moe_prefetch(backend *b, int il, const int32_t *ids, int n, int k);
int cuda_op_moe_experts(backend *b, int il, const float *x, int n, const int32_t *ids,
                        const float *w, int k, float *out);
int cuda_op_moe_experts_shared(backend *b, int il, const float *x, int n, const int32_t *ids, const float *w,
                               int k, const tview *gate_s, const tview *up_s, const tview *down_s, float *out,
                               float *shared);
void cuda_moe_combine(cuda_backend *c, const float *slots, const float *w, int n, int k, int width,
                      float *out);
/* Every slot's expert output, unweighted (Y [n * k][E], scratch): the kernels of moe_experts;
 * a slot whose id is -1 is skipped (its row left as it was). */
float *cuda_moe_slots(cuda_backend *c, int il, const float *x, int n, const int32_t *ids, int k, int n_family);

/* ---- cuda_moe_host.cu ---- */
int cuda_op_moe_experts_host(backend *b, int il, const float *x, const float *x_host, int n, const int32_t *ids,
                             const int32_t *ids_host, const float *w, int k, float *out);
/* Where the table entry [layer][expert] points: pinned host memory (host addresses) or not. */
void cuda_host_entry_set(cuda_backend *c, int index, const void *g, const void *u, const void *d);
void cuda_host_free(cuda_backend *c);

/* ---- cuda_ops.cu ---- */
void cuda_op_rmsnorm(backend *b, const float *x, const tview *w, int n_rows, int dim, float eps,
                     float *y);
void cuda_op_rope(backend *b, float *x, int n_tok, int n_head, int head_dim, int n_rot,
                  const int32_t *pos, float freq_base, rope_mode mode);
void cuda_op_attention(backend *b, const float *q, const float *kc, const float *vc, int n, int pos0,
                       int n_head, int n_head_kv, int hd, int hd_v, float scale, float *out);
bool cuda_op_attention_gated(backend *b, const float *q, const float *kc, const float *vc, int n, int pos0,
                             int n_head, int n_head_kv, int hd, int hd_v, float scale, const float *gate,
                             size_t gate_stride, float *out);
void cuda_op_add(backend *b, float *x, const float *y, size_t n);
void cuda_op_swiglu(backend *b, float *g, const float *u, size_t n);
void cuda_op_l2norm(backend *b, const float *x, int n_rows, int dim, float eps, float *y);
void cuda_op_conv1d_silu(backend *b, const float *x, int n, int channels, const float *w, int kernel,
                         float *state, float *y);
void cuda_op_gated_delta(backend *b, const float *q, const float *k, const float *v, const float *g,
                         const float *beta, float *state, const gdn_params *p, float *out);
void cuda_op_sigmoid_mul(backend *b, float *x, const float *g, int n_rows, int dim, int g_dim);
void cuda_op_argmax_row(backend *b, const float *x, int n, int32_t *out_host);
void cuda_op_gdn_gates(backend *b, float *beta, float *alpha, const float *dt_bias, const float *a,
                       int n, int n_head);
void cuda_op_copy_rows(backend *b, float *dst, size_t dst_stride, const float *src,
                       size_t src_stride, int n_rows, int width);
void cuda_op_kv_store(backend *b, float *kc, float *vc, const float *k, const float *v, int n,
                      const int32_t *pos, size_t row_k, size_t row_v);
void cuda_swiglu_rows(cuda_backend *c, const float *g, const float *u, size_t n, float *out);

/* grid helper */
static inline unsigned cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
