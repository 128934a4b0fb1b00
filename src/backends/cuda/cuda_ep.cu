/* Expert parallelism over NCCL (docs/multi-gpu.md): the routed experts of a MoE layer go through
 * an all-to-all dispatch of hidden-state rows to the ranks that own the experts and an
 * all-to-all combine of their outputs, summed at the token's home rank in slot order.
 *
 * Per MoE layer, on every rank (dense layers are replicated, so every rank holds x):
 *   1. plan (one block): owner rank of each slot of the home shard, per-rank counts and
 *      offsets, perm (send position -> slot) and inv (slot -> send position): a counting sort
 *      stable in slot order, the device form of ep_dispatch_plan (runtime/ep_placement.c);
 *   2. gather: send row j = x[perm[j] / k], with its expert id;
 *   3. [R > 1] exchange counts, bring them to the host (the sizes of the sends);
 *   4. ncclGroupStart; per peer ncclSend(rows, ids) / ncclRecv(rows, ids); ncclGroupEnd;
 *   5. the owner's expert outputs of the received rows: cuda_moe_slots, the very kernels of
 *      the one-GPU moe_experts, with the kernel family chosen by the batch's token count;
 *   6. the same blocks back (outputs);
 *   7. combine: out[t] = sum_s w[t][s] * Y[inv[t k + s]] in slot order, k_combine's arithmetic;
 *   8. [R > 1] all-gather of the shards' outputs.
 * So each slot's output has the one-GPU bits and the sum has the one-GPU order: the logits are
 * bit-identical to the plain path whatever the rank count.
 *
 * One rank (--gpus 1) runs every step through NCCL (sends to itself) and needs no host
 * synchronization, so a decode step stays capturable as a CUDA graph. Several ranks need one
 * process per GPU (a launcher, ncclCommInitRank with a shared id): written here, not yet run.
 *
 * NCCL is opened with dlopen (SLUICE_NCCL_LIB, else libnccl.so.2): the binary does not depend
 * on it, so every other path runs on machines without NCCL (the H200 image has NCCL only inside
 * its PyTorch environment), and only --gpus needs it. The header (nccl.h) gives the types. */
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_internal.cuh"

extern "C" {
#include "backends/cuda/cuda_ep.h"
#include "runtime/ep_placement.h"
}

/* ---- kernels (also built without NCCL: the plan kernel has a unit-test hook) ---------------- */

#define EP_PLAN_THREADS 256

/* Stable counting sort of the slots by owner rank in one block (per rank, block-wide inclusive
 * scans over tiles of slots in slot order). m is at most a prefill chunk's slots, R <= 64. */
__global__ void __launch_bounds__(EP_PLAN_THREADS)
    k_ep_plan(const int32_t *ids, int m, const int32_t *own, int R, int32_t *owner, int32_t *perm,
              int32_t *inv, int32_t *counts, int32_t *offsets) {
    __shared__ int scan[EP_PLAN_THREADS];
    const int tid = threadIdx.x;
    for (int i = tid; i < m; i += EP_PLAN_THREADS) owner[i] = own[ids[i]];
    __syncthreads();
    int off = 0;
    for (int r = 0; r < R; r++) {
        if (tid == 0) offsets[r] = off;
        int run = 0;
        for (int t0 = 0; t0 < m; t0 += EP_PLAN_THREADS) {
            const int i = t0 + tid;
            const int f = i < m && owner[i] == r;
            scan[tid] = f;
            __syncthreads();
            for (int d = 1; d < EP_PLAN_THREADS; d <<= 1) {
                const int v = tid >= d ? scan[tid - d] : 0;
                __syncthreads();
                scan[tid] += v;
                __syncthreads();
            }
            if (f) {
                const int j = off + run + scan[tid] - 1;
                perm[j] = i;
                inv[i] = j;
            }
            run += scan[EP_PLAN_THREADS - 1];
            __syncthreads();
        }
        if (tid == 0) counts[r] = run;
        off += run;
    }
    if (tid == 0) offsets[R] = off;
}

/* send row j = x[perm[j] / k], send id j = ids[perm[j]] (rows strided over grid.y: a large
 * prefill batch has more slots than a grid dimension allows) */
__global__ void k_ep_gather(const float *x, const int32_t *ids, const int32_t *perm, int m, int k, int width,
                            float *xs, int32_t *ids_s) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int j = blockIdx.y; j < m; j += gridDim.y) {
        const int slot = perm[j];
        if (i < width) xs[(size_t)j * width + i] = x[(size_t)(slot / k) * width + i];
        if (blockIdx.x == 0 && threadIdx.x == 0) ids_s[j] = ids[slot];
    }
}

/* out[t] = sum over s in slot order of y[inv[t k + s]] * w[t][s]: k_combine's arithmetic
 * (explicit round-to-nearest operations, no contraction into FMAs), reading through inv */
__global__ void k_ep_combine(const float *y, const int32_t *inv, const float *w, int k, int width,
                             float *out) {
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width) return;
    const float *wt = w + (size_t)t * k;
    const int32_t *it = inv + (size_t)t * k;
    float o = __fmul_rn(y[(size_t)it[0] * width + i], wt[0]);
    for (int s = 1; s < k; s++) o = __fadd_rn(o, __fmul_rn(y[(size_t)it[s] * width + i], wt[s]));
    out[(size_t)t * width + i] = o;
}


int backend_cuda_ep_selftest_plan(backend *b, const int32_t *ids, int m, const int32_t *own,
                                  int n_expert, int R, int32_t *owner, int32_t *perm,
                                  int32_t *inv, int32_t *counts) {
    cuda_backend *c = CB(b);
    if (m <= 0 || R < 1 || R > EP_MAX_RANKS) return -1;
    const size_t words = (size_t)2 * m + (size_t)n_expert + 3 * (size_t)m + 2 * (size_t)R + 1;
    int32_t *d = nullptr;
    CU(cudaMalloc((void **)&d, words * 4));
    int32_t *d_ids = d, *d_own = d_ids + m, *d_owner = d_own + n_expert, *d_perm = d_owner + m;
    int32_t *d_inv = d_perm + m, *d_counts = d_inv + m, *d_offsets = d_counts + R;
    cuda_upload_sync(d_ids, ids, (size_t)m * 4);
    cuda_upload_sync(d_own, own, (size_t)n_expert * 4);
    k_ep_plan<<<1, EP_PLAN_THREADS, 0, c->stream>>>(d_ids, m, d_own, R, d_owner, d_perm, d_inv, d_counts,
                                                   d_offsets);
    CU_LAUNCH();
    CU(cudaStreamSynchronize(c->stream));
    CU(cudaMemcpy(owner, d_owner, (size_t)m * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(perm, d_perm, (size_t)m * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(inv, d_inv, (size_t)m * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(counts, d_counts, (size_t)R * 4, cudaMemcpyDeviceToHost));
    CU(cudaFree(d));
    return 0;
}

#ifndef SLUICE_HAVE_NCCL

int backend_cuda_ep_enable(backend *b, const backend_cuda_ep_params *p, char *err, size_t err_len) {
    (void)b;
    (void)p;
    snprintf(err, err_len, "--gpus: this sluice was built without NCCL (nccl.h not found)");
    return -1;
}

int backend_cuda_ep_ranks(const backend *b) {
    (void)b;
    return 0;
}

#else

#include <nccl.h>

/* ---- NCCL through dlopen ------------------------------------------------------------------------ */

struct nccl_api {
    void *lib;
    ncclResult_t (*GetVersion)(int *);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    const char *(*GetErrorString)(ncclResult_t);
};

static nccl_api g_nccl;

static bool nccl_open(char *err, size_t err_len) {
    if (g_nccl.lib) return true;
    const char *name = getenv("SLUICE_NCCL_LIB");
    if (!name || !*name) name = "libnccl.so.2";
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
#ifdef SLUICE_NCCL_FALLBACK
    if (!h && !getenv("SLUICE_NCCL_LIB")) h = dlopen(SLUICE_NCCL_FALLBACK, RTLD_NOW | RTLD_LOCAL); /* the build's */
#endif
    if (!h) {
        snprintf(err, err_len, "--gpus: cannot open NCCL (%s); set SLUICE_NCCL_LIB to libnccl.so.2's path",
                 dlerror());
        return false;
    }
    nccl_api a;
    memset(&a, 0, sizeof a);
    a.lib = h;
#define SYM(field, name)                                                                         \
    do {                                                                                         \
        *(void **)&a.field = dlsym(h, name);                                                     \
        if (!a.field) {                                                                          \
            snprintf(err, err_len, "--gpus: NCCL library lacks %s", name);                       \
            dlclose(h);                                                                          \
            return false;                                                                        \
        }                                                                                        \
    } while (0)
    SYM(GetVersion, "ncclGetVersion");
    SYM(GetUniqueId, "ncclGetUniqueId");
    SYM(CommInitRank, "ncclCommInitRank");
    SYM(CommDestroy, "ncclCommDestroy");
    SYM(GroupStart, "ncclGroupStart");
    SYM(GroupEnd, "ncclGroupEnd");
    SYM(Send, "ncclSend");
    SYM(Recv, "ncclRecv");
    SYM(GetErrorString, "ncclGetErrorString");
#undef SYM
    g_nccl = a;
    return true;
}

/* Like CU: a failed collective leaves the layer's output undefined, so stop; except while a
 * decode step is being captured as a graph: then the capture is marked broken, the backend
 * discards the recording and runs the step again eagerly (capture_end returns 1), and later
 * steps stay eager. */
static void nc_check(ncclResult_t r, cuda_backend *c, const char *what, int line) {
    if (r == ncclSuccess) return;
    if (c && c->capturing) {
        if (!c->capture_broken)
            fprintf(stderr, "sluice: NCCL error %d (%s) while capturing a graph (cuda_ep.cu:%d: %s)\n", (int)r,
                    g_nccl.GetErrorString(r), line, what);
        c->capture_broken = true;
        return;
    }
    fprintf(stderr, "sluice: NCCL error %d (%s) at cuda_ep.cu:%d: %s\n", (int)r, g_nccl.GetErrorString(r), line,
            what);
    abort();
}
#define NC(call) nc_check((call), c, #call, __LINE__)

/* ---- the EP state of a backend ---------------------------------------------------------------- */

/* Scratch ids for the EP buffers: cuda_internal.cuh's enum uses 0..3; taking the top ids here
 * (rather than adding names there) keeps this file's change to the backend's files at zero
 * while others edit them. */
enum { SCR_EP_PLAN = 5, SCR_EP_SEND = 6, SCR_EP_RECV = 7 };
static_assert(SCR_COUNT >= 8, "cuda_ep.cu uses scratch ids 5..7");

struct ep_state {
    cuda_backend *c;
    int n_rank, rank;
    ncclComm_t comm;
    int32_t *d_owner;            /* [n_layer][n_expert] owning rank (backend memory) */
    int32_t *h_counts;           /* pinned: send counts [R], receive counts [R] */
    backend_ops ops;             /* the backend's ops with moe_experts and free replaced */
    const backend_ops *base;
    uint64_t calls;
};

/* The state hangs off the backend through its ops table: the table is the first member we own,
 * so the ops pointer of an EP backend points into its ep_state. */
static ep_state *EPS(backend *b) {
    return reinterpret_cast<ep_state *>(reinterpret_cast<char *>(const_cast<backend_ops *>(b->ops)) -
                                        offsetof(ep_state, ops));
}

/* ---- the op ------------------------------------------------------------------------------------- */

static int ep_moe_experts(backend *b, int il, const float *x, int n, const int32_t *ids, const float *w,
                          int k, float *out) {
    ep_state *st = EPS(b);
    cuda_backend *c = st->c;
    if (il < 0 || il >= c->n_layer || !c->shapes[il].present) {
        fprintf(stderr, "sluice: CUDA expert table has no layer %d\n", il);
        return -1;
    }
    cuda_prof_begin(c);
    const int R = st->n_rank, me = st->rank;
    if (R > 1 && c->capturing) {
        /* the sizes come through the host, which a graph cannot do: give the recording up, the
         * session runs this step again eagerly (capture_end returns 1) */
        c->capture_broken = true;
        cuda_prof_end(c, "moe_experts EP");
        return 0;
    }
    const int E = (int)c->shapes[il].ne0[EXPERT_GATE];
    const int t0 = (int)((int64_t)n * me / R), t1 = (int)((int64_t)n * (me + 1) / R);
    const int m = (t1 - t0) * k; /* this home's slots */
    /* plan: owner [m], perm [m], inv [m], counts [R], offsets [R + 1], receive counts [R] */
    int32_t *plan = (int32_t *)cuda_scratch(c, SCR_EP_PLAN, ((size_t)3 * m + 3 * (size_t)R + 1) * 4);
    int32_t *owner = plan, *perm = owner + m, *inv = perm + m, *counts = inv + m;
    int32_t *offsets = counts + R, *rcounts = offsets + R + 1;
    /* send side: rows [m][E], ids [m], the returned outputs [m][E] */
    float *xs = (float *)cuda_scratch(c, SCR_EP_SEND, ((size_t)2 * m * E + m) * 4);
    float *ys = xs + (size_t)m * E;
    int32_t *ids_s = (int32_t *)(ys + (size_t)m * E);
    const int32_t *own = st->d_owner + (size_t)il * c->n_expert;
    if (m > 0) {
        k_ep_plan<<<1, EP_PLAN_THREADS, 0, c->stream>>>(ids + (size_t)t0 * k, m, own, R, owner, perm, inv,
                                                       counts, offsets);
        CU_LAUNCH();
        dim3 grid(cdiv((size_t)E, 256), m < 65535 ? m : 65535);
        k_ep_gather<<<grid, 256, 0, c->stream>>>(x + (size_t)t0 * E, ids + (size_t)t0 * k, perm, m, k, E, xs,
                                                ids_s);
        CU_LAUNCH();
    }
    /* sizes of the exchanges, known on the host */
    int sc[EP_MAX_RANKS], so[EP_MAX_RANKS], rc[EP_MAX_RANKS], ro[EP_MAX_RANKS], mr = 0;
    if (R == 1) {
        sc[0] = rc[0] = m; /* everything goes to ourselves: no host round trip, graphs stay valid */
    } else {
        if (m == 0) CU(cudaMemsetAsync(counts, 0, (size_t)R * 4, c->stream));
        NC(g_nccl.GroupStart());
        for (int p = 0; p < R; p++) {
            NC(g_nccl.Send(counts + p, 1, ncclInt32, p, st->comm, c->stream));
            NC(g_nccl.Recv(rcounts + p, 1, ncclInt32, p, st->comm, c->stream));
        }
        NC(g_nccl.GroupEnd());
        CU(cudaMemcpyAsync(st->h_counts, counts, (size_t)R * 4, cudaMemcpyDeviceToHost, c->stream));
        CU(cudaMemcpyAsync(st->h_counts + R, rcounts, (size_t)R * 4, cudaMemcpyDeviceToHost, c->stream));
        CU(cudaStreamSynchronize(c->stream));
        for (int p = 0; p < R; p++) {
            sc[p] = st->h_counts[p];
            rc[p] = st->h_counts[R + p];
        }
    }
    for (int p = 0, a = 0, r = 0; p < R; p++) {
        so[p] = a;
        ro[p] = r;
        a += sc[p];
        r += rc[p];
        mr = r;
    }
    /* receive side: rows [mr][E], ids [mr] */
    float *xr = (float *)cuda_scratch(c, SCR_EP_RECV, ((size_t)mr * E + mr + 1) * 4);
    int32_t *ids_r = (int32_t *)(xr + (size_t)mr * E);
    /* dispatch: a block of rows and ids to every owner (peers in rank order; NCCL matches each
     * pair's send and receive, and within a pair keeps the issue order) */
    NC(g_nccl.GroupStart());
    for (int p = 0; p < R; p++) {
        if (sc[p]) {
            NC(g_nccl.Send(xs + (size_t)so[p] * E, (size_t)sc[p] * E, ncclFloat32, p, st->comm, c->stream));
            NC(g_nccl.Send(ids_s + so[p], (size_t)sc[p], ncclInt32, p, st->comm, c->stream));
        }
        if (rc[p]) {
            NC(g_nccl.Recv(xr + (size_t)ro[p] * E, (size_t)rc[p] * E, ncclFloat32, p, st->comm, c->stream));
            NC(g_nccl.Recv(ids_r + ro[p], (size_t)rc[p], ncclInt32, p, st->comm, c->stream));
        }
    }
    NC(g_nccl.GroupEnd());
    cuda_act_invalidate_range(c, xr, (size_t)mr * E * 4); /* new rows at an old address */
    /* the owned experts on the received rows: one row per slot (k = 1), the family of the
     * batch's n tokens (not of mr rows), so every slot gets the one-GPU path's bits */
    const float *yr = nullptr;
    if (mr > 0) {
        yr = cuda_moe_slots(c, il, xr, mr, ids_r, 1, n);
        if (!yr) return -1;
    }
    /* combine: the outputs go back to their homes, into the positions their rows left from */
    NC(g_nccl.GroupStart());
    for (int p = 0; p < R; p++) {
        if (rc[p]) NC(g_nccl.Send(yr + (size_t)ro[p] * E, (size_t)rc[p] * E, ncclFloat32, p, st->comm, c->stream));
        if (sc[p]) NC(g_nccl.Recv(ys + (size_t)so[p] * E, (size_t)sc[p] * E, ncclFloat32, p, st->comm, c->stream));
    }
    NC(g_nccl.GroupEnd());
    if (m > 0) {
        dim3 grid(cdiv((size_t)E, 256), t1 - t0);
        k_ep_combine<<<grid, 256, 0, c->stream>>>(ys, inv, w + (size_t)t0 * k, k, E, out + (size_t)t0 * E);
        CU_LAUNCH();
    }
    if (R > 1) { /* every rank needs every token's output (the next dense layer is replicated) */
        NC(g_nccl.GroupStart());
        for (int p = 0; p < R; p++) {
            if (p == me) continue;
            const int p0 = (int)((int64_t)n * p / R), p1 = (int)((int64_t)n * (p + 1) / R);
            if (t1 > t0) NC(g_nccl.Send(out + (size_t)t0 * E, (size_t)(t1 - t0) * E, ncclFloat32, p, st->comm, c->stream));
            if (p1 > p0) NC(g_nccl.Recv(out + (size_t)p0 * E, (size_t)(p1 - p0) * E, ncclFloat32, p, st->comm, c->stream));
        }
        NC(g_nccl.GroupEnd());
    }
    cuda_act_invalidate_range(c, out, (size_t)n * E * sizeof(float));
    cuda_prof_end(c, n <= 8 ? "moe_experts EP (decode)" : "moe_experts EP (tiled)");
    st->calls++;
    return 0;
}

static void ep_free(backend *b) {
    ep_state *st = EPS(b);
    cuda_backend *c = st->c;
    CU(cudaStreamSynchronize(c->stream));
    if (st->comm) g_nccl.CommDestroy(st->comm);
    b->ops = st->base; /* the backend frees itself as it always does */
    if (st->d_owner) st->base->mfree(b, st->d_owner);
    if (st->h_counts) CU(cudaFreeHost(st->h_counts));
    delete st;
    be_free(b);
}

int backend_cuda_ep_enable(backend *b, const backend_cuda_ep_params *p, char *err, size_t err_len) {
    cuda_backend *c = CB(b);
    if (p->n_rank != 1 || p->rank != 0) {
        /* several ranks need one process per GPU and a shared NCCL id (docs/multi-gpu.md) */
        snprintf(err, err_len, "--gpus %d: this build runs expert parallelism over one GPU only", p->n_rank);
        return -1;
    }
    if (!c->d_table || c->n_layer <= 0 || c->n_expert <= 0) {
        snprintf(err, err_len, "--gpus: the model has no routed experts");
        return -1;
    }
    if (!p->owner) {
        snprintf(err, err_len, "--gpus: no expert placement");
        return -1;
    }
    if (!nccl_open(err, err_len)) return -1;
    ep_state *st = new ep_state();
    st->c = c;
    st->n_rank = p->n_rank;
    st->rank = p->rank;
    st->base = b->ops;
    CU(cudaSetDevice(c->device));
    /* The ranks of expert parallelism are the GPUs of one host, so NCCL's bootstrap (a control
     * channel; data moves over NVLink / PCIe) can use loopback: the device machines have no
     * other reachable interface, and NCCL's default interface search may find none. A value
     * the user set wins. */
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    ncclUniqueId id;
    ncclResult_t r = g_nccl.GetUniqueId(&id);
    if (r == ncclSuccess) r = g_nccl.CommInitRank(&st->comm, st->n_rank, id, st->rank);
    if (r != ncclSuccess) {
        snprintf(err, err_len, "--gpus: NCCL communicator: %s", g_nccl.GetErrorString(r));
        delete st;
        return -1;
    }
    const size_t owner_bytes = (size_t)c->n_layer * c->n_expert * sizeof(int32_t);
    st->d_owner = (int32_t *)st->base->alloc(b, owner_bytes);
    if (!st->d_owner || cudaMallocHost((void **)&st->h_counts, 2 * EP_MAX_RANKS * sizeof(int32_t)) != cudaSuccess) {
        snprintf(err, err_len, "--gpus: out of memory for the expert placement");
        g_nccl.CommDestroy(st->comm);
        if (st->d_owner) st->base->mfree(b, st->d_owner);
        delete st;
        return -1;
    }
    /* layers without experts keep -1 entries; the op refuses such layers before reading them */
    st->base->upload(b, st->d_owner, p->owner, owner_bytes);
    st->ops = *st->base;
    st->ops.moe_experts = ep_moe_experts;
    st->ops.moe_prefetch = nullptr; /* a rank's table holds only its own experts */
    st->ops.moe_experts_shared = nullptr; /* ep_moe_experts alone knows the ranks */
    st->ops.free = ep_free;
    b->ops = &st->ops;
    int ver = 0;
    g_nccl.GetVersion(&ver);
    if (p->verbose)
        fprintf(stderr, "sluice: expert parallelism: rank %d of %d, NCCL %d, %d layers x %d experts\n",
                st->rank, st->n_rank, ver, c->n_layer, c->n_expert);
    return 0;
}

int backend_cuda_ep_ranks(const backend *b) {
    backend *bb = const_cast<backend *>(b);
    return b->ops->moe_experts == ep_moe_experts ? EPS(bb)->n_rank : 0;
}

#endif
