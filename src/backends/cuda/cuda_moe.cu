/* CUDA backend: the router (softmax, top-k, renormalization) and the routed experts through the
 * device expert table.
 *
 * moe_experts for layer il, n tokens, k slots each:
 *   decode (n <= 8): grouped matvecs, one output group per slot (token t, slot s) reading the
 *     weights of expert ids[t][s] from the table: gate and up fused with SwiGLU into h, then
 *     down into y[t][s];
 *   prefill: the slots are grouped by expert on the device (counts, offsets, tiles of <= 64),
 *     then grouped tiled products (int8 tensor cores), each tile one expert's weights;
 *   then out[t] = sum_s w[t][s] * y[t][s] in slot order (the CPU's combine).
 * The kernels read whatever the table points at (VRAM copy, VRAM cache slot, pinned host
 * memory): the same bytes, the same bits. Nothing here needs the host, so a decode step with
 * this op is capturable as a graph. */
#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_internal.cuh"

KTRACE_TU(moe) /* the kernel trace buffer of this file's kernels (cuda_ktrace.cu) */

/* ---- router ------------------------------------------------------------------------------------ */

#define ROUTE_THREADS 128
#define MOE_MIN_WEIGHT_SUM 6.103515625e-5f

/* One block per token. Softmax as the CPU: max, exp, sum in double, one float reciprocal; top-k
 * by repeated arg-max (ties: the lower id); renormalization with a double sum in slot order. */
__global__ void __launch_bounds__(ROUTE_THREADS)
    k_route(float *logits, int n_expert, int k, bool norm, int32_t *ids, float *w) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    __shared__ double dsum[ROUTE_THREADS];
    __shared__ float fred[ROUTE_THREADS];
    __shared__ int ired[ROUTE_THREADS];
    __shared__ unsigned char taken[1024];
    __shared__ float wsel[64];
    const int t = blockIdx.x, tid = threadIdx.x;
    float *p = logits + (size_t)t * n_expert;
    float mx = -INFINITY;
    for (int e = tid; e < n_expert; e += ROUTE_THREADS) mx = fmaxf(mx, p[e]);
    fred[tid] = mx;
    __syncthreads();
    for (int s = ROUTE_THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) fred[tid] = fmaxf(fred[tid], fred[tid + s]);
        __syncthreads();
    }
    mx = fred[0];
    __syncthreads();
    double sum = 0.0;
    for (int e = tid; e < n_expert; e += ROUTE_THREADS) {
        const float v = expf(__fsub_rn(p[e], mx));
        p[e] = v;
        sum += (double)v;
        taken[e] = 0;
    }
    dsum[tid] = sum;
    __syncthreads();
    for (int s = ROUTE_THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) dsum[tid] = dsum[tid] + dsum[tid + s];
        __syncthreads();
    }
    const float inv = (float)(1.0 / dsum[0]);
    for (int e = tid; e < n_expert; e += ROUTE_THREADS) p[e] = __fmul_rn(p[e], inv);
    __syncthreads();
    for (int s = 0; s < k; s++) {
        float best = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = tid; e < n_expert; e += ROUTE_THREADS)
            if (!taken[e] && (p[e] > best || (p[e] == best && e < bi))) {
                best = p[e];
                bi = e;
            }
        fred[tid] = best;
        ired[tid] = bi;
        __syncthreads();
        for (int h = ROUTE_THREADS / 2; h > 0; h >>= 1) {
            if (tid < h) {
                const float ob = fred[tid + h];
                const int oi = ired[tid + h];
                if (ob > fred[tid] || (ob == fred[tid] && oi < ired[tid])) {
                    fred[tid] = ob;
                    ired[tid] = oi;
                }
            }
            __syncthreads();
        }
        if (tid == 0) {
            const int e = ired[0];
            taken[e] = 1;
            ids[(size_t)t * k + s] = e;
            wsel[s] = p[e];
        }
        __syncthreads();
    }
    if (tid == 0) {
        if (norm) {
            double ws = 0.0;
            for (int s = 0; s < k; s++) ws += (double)wsel[s];
            float wsum = (float)ws;
            if (wsum < MOE_MIN_WEIGHT_SUM) wsum = MOE_MIN_WEIGHT_SUM;
            for (int s = 0; s < k; s++) w[(size_t)t * k + s] = __fdiv_rn(wsel[s], wsum);
        } else {
            for (int s = 0; s < k; s++) w[(size_t)t * k + s] = wsel[s];
        }
    }
}

/* An unsigned key ordered as the router ranks probabilities: float order with -0 as +0, NaN as
 * -inf; every key is above 0. */
__device__ __forceinline__ unsigned route_key(float x) {
    if (x != x) x = -INFINITY;
    if (x == 0.0f) x = 0.0f;
    const unsigned u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* One warp per token, for up to 32 * VPL experts: lane l holds experts l, l + 32, ...; the
 * maximum, the double sum (lane-strided, then a fixed butterfly) and each top-k pick (arg-max
 * by shuffles, ties to the lower id) need no block barriers, which dominate the block form's
 * time at decode (a router runs in every MoE layer of every step). */
template <int VPL>
__global__ void __launch_bounds__(128) k_route_warp(float *logits, int n, int n_expert, int k, bool norm,
                                                    int32_t *ids, float *w) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const int t = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (t >= n) return;
    float *p = logits + (size_t)t * n_expert;
    float v[VPL];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < VPL; i++) {
        const int e = lane + 32 * i;
        v[i] = e < n_expert ? p[e] : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < VPL; i++) {
        const int e = lane + 32 * i;
        v[i] = e < n_expert ? expf(__fsub_rn(v[i], mx)) : 0.0f;
        sum += (double)v[i];
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float inv = (float)(1.0 / sum);
    unsigned taken = 0;
#pragma unroll
    for (int i = 0; i < VPL; i++) {
        const int e = lane + 32 * i;
        v[i] = __fmul_rn(v[i], inv);
        if (e < n_expert) p[e] = v[i];
        else taken |= 1u << i;
    }
    /* Each pick: the largest probability, ties to the lower id, NaN ranking with -inf (lowest,
     * still selectable: the CPU then takes the lowest free id). As unsigned keys that order
     * the same way (route_key), a pick is two warp reductions (redux.sync): the largest key,
     * then the lowest id holding it; the shuffle butterfly over (value, id) pairs it replaced
     * took ten dependent shuffles a pick (4.5 us of every MoE layer, kernel trace 2026-11-30). */
    unsigned key[VPL];
#pragma unroll
    for (int i = 0; i < VPL; i++) key[i] = route_key(v[i]);
    float wmine = 0.0f;
    for (int s = 0; s < k; s++) {
        unsigned best = 0; /* below every key: a lane with nothing left offers nothing */
        unsigned bi = 0xffffffffu;
#pragma unroll
        for (int i = 0; i < VPL; i++)
            if (!(taken & (1u << i)) && (key[i] > best || bi == 0xffffffffu)) { /* ids ascend with i */
                best = key[i];
                bi = (unsigned)(lane + 32 * i);
            }
        const unsigned top = __reduce_max_sync(0xffffffffu, best);
        bi = __reduce_min_sync(0xffffffffu, best == top ? bi : 0xffffffffu);
        float sel = 0.0f; /* the chosen probability as computed (NaN stays NaN, as on the CPU) */
#pragma unroll
        for (int i = 0; i < VPL; i++)
            if (i == (int)(bi >> 5)) sel = v[i];
        const float pw = __shfl_sync(0xffffffffu, sel, (int)(bi & 31));
        if ((int)(bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == s) wmine = pw;
        if (lane == 0) ids[(size_t)t * k + s] = (int32_t)bi;
    }
    /* renormalize: the double sum in slot order, then one float division per slot */
    double ws = 0.0;
    for (int s = 0; s < k; s++) ws += (double)__shfl_sync(0xffffffffu, wmine, s);
    if (lane < k) {
        float r = wmine;
        if (norm) {
            float wsum = (float)ws;
            if (wsum < MOE_MIN_WEIGHT_SUM) wsum = MOE_MIN_WEIGHT_SUM;
            r = __fdiv_rn(wmine, wsum);
        }
        w[(size_t)t * k + lane] = r;
    }
}

void cuda_op_moe_route(backend *b, float *logits, int n, int n_expert, int k, bool norm, int32_t *ids,
                       float *w) {
    cuda_backend *c = CB(b);
    if (n_expert > 1024 || k > 64) {
        fprintf(stderr, "sluice: CUDA router: %d experts / top-%d out of range\n", n_expert, k);
        abort();
    }
    cuda_prof_begin(c);
    const int vpl = (n_expert + 31) / 32;
    const unsigned grid = cdiv((size_t)n * 32, 128);
    if (k > 32 || getenv("SLUICE_CUDA_BLOCK_ROUTER")) pdl_launch(k_route, n, ROUTE_THREADS, 0, c->stream, logits, n_expert, k, norm, ids, w);
    else if (vpl <= 1) pdl_launch(k_route_warp<1>, grid, 128, 0, c->stream, logits, n, n_expert, k, norm, ids, w);
    else if (vpl <= 2) pdl_launch(k_route_warp<2>, grid, 128, 0, c->stream, logits, n, n_expert, k, norm, ids, w);
    else if (vpl <= 4) pdl_launch(k_route_warp<4>, grid, 128, 0, c->stream, logits, n, n_expert, k, norm, ids, w);
    else if (vpl <= 8) pdl_launch(k_route_warp<8>, grid, 128, 0, c->stream, logits, n, n_expert, k, norm, ids, w);
    else if (vpl <= 16) pdl_launch(k_route_warp<16>, grid, 128, 0, c->stream, logits, n, n_expert, k, norm, ids, w);
    else pdl_launch(k_route_warp<32>, grid, 128, 0, c->stream, logits, n, n_expert, k, norm, ids, w);
    CU_LAUNCH();
    cuda_act_invalidate_range(c, logits, (size_t)n * n_expert * sizeof(float));
    cuda_act_invalidate_range(c, w, (size_t)n * k * sizeof(float));
    cuda_prof_end(c, "moe_route");
}

/* ---- grouping slots by expert (prefill) ----------------------------------------------------------- */

#define GROUP_THREADS 1024

/* list: slot entries grouped by expert (order within an expert is irrelevant: every entry's
 * result is computed on its own); tiles of at most 64 entries of one expert. */
__global__ void __launch_bounds__(GROUP_THREADS)
    k_group(const int32_t *ids, int nk, int n_expert, int32_t *list, int32_t *tile_exp,
            int32_t *tile_off, int32_t *tile_cnt, int32_t *n_tiles) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    __shared__ int cnt[1024], base[1024], cur[1024], tb[1024];
    const int tid = threadIdx.x;
    for (int e = tid; e < n_expert; e += GROUP_THREADS) {
        cnt[e] = 0;
        cur[e] = 0;
    }
    __syncthreads();
    for (int i = tid; i < nk; i += GROUP_THREADS) atomicAdd(&cnt[ids[i]], 1);
    __syncthreads();
    if (tid == 0) {
        int run = 0, tiles = 0;
        for (int e = 0; e < n_expert; e++) {
            base[e] = run;
            tb[e] = tiles;
            run += cnt[e];
            tiles += (cnt[e] + 63) / 64;
        }
        *n_tiles = tiles;
    }
    __syncthreads();
    for (int i = tid; i < nk; i += GROUP_THREADS) {
        const int e = ids[i];
        list[base[e] + atomicAdd(&cur[e], 1)] = i;
    }
    for (int e = tid; e < n_expert; e += GROUP_THREADS)
        for (int j = 0; j * 64 < cnt[e]; j++) {
            tile_exp[tb[e] + j] = e;
            tile_off[tb[e] + j] = base[e] + 64 * j;
            tile_cnt[tb[e] + j] = cnt[e] - 64 * j < 64 ? cnt[e] - 64 * j : 64;
        }
}

/* ---- combine ------------------------------------------------------------------------------------ */

__global__ void k_combine(const float *y, const float *w, int n, int k, int width, float *out) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel has finished */
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width) return;
    const float *wt = w + (size_t)t * k;
    const float *y0 = y + (size_t)t * k * width;
    float o = __fmul_rn(y0[i], wt[0]);
    for (int s = 1; s < k; s++) o = __fadd_rn(o, __fmul_rn(y0[(size_t)s * width + i], wt[s]));
    out[(size_t)t * width + i] = o;
}

void cuda_moe_combine(cuda_backend *c, const float *y, const float *w, int n, int k, int width,
                      float *out) {
    dim3 grid(cdiv((size_t)width, 256), n);
    pdl_launch(k_combine, grid, 256, 0, c->stream, y, w, n, k, width, out);
    CU_LAUNCH();
}

/* ---- routed experts ------------------------------------------------------------------------------ */

/* Every slot's expert output (no weighting): Y [slots][E], slot j reading expert ids[j] and
 * activation row j / k of x (n rows). The kernel family (grouped matvecs or tiles) follows
 * n_family, the token count of the whole batch: the expert-parallel path (cuda_ep.cu) calls
 * this with the rows a rank received (k = 1) and the batch's token count, so each slot gets
 * the bits the one-GPU path gives it (every slot's result is computed on its own). Returns Y
 * (SCR_MOE scratch) or nullptr. */
/* A shared expert computed in the routed experts' decode-form launches: one extra slot per token
 * after the n * k routed ones (mm_src::extra), its SwiGLU row in H after theirs, its output in
 * out [n][E]. Each extra slot runs the very kernel and reduction order of a plain product of
 * one token (k_mv_q<T, 1, ...>), so the shared expert's bits are those of be_matmul_swiglu and
 * be_matmul; what changes is that its three launches (gate/up, encoding, down) no longer come
 * one after the other ahead of the routed experts' three. */
struct shared_mats {
    const uint8_t *gate, *up, *down;
    float *out;
};

static float *moe_slots(cuda_backend *c, int il, const float *x, int n, const int32_t *ids, int k, int n_family,
                        const shared_mats *shm);

float *cuda_moe_slots(cuda_backend *c, int il, const float *x, int n, const int32_t *ids, int k,
                      int n_family) {
    return moe_slots(c, il, x, n, ids, k, n_family, nullptr);
}

/* shm: the shared expert (decode form only; the caller checked its shapes and types) */
static float *moe_slots(cuda_backend *c, int il, const float *x, int n, const int32_t *ids, int k, int n_family,
                        const shared_mats *shm) {
    if (il < 0 || il >= c->n_layer || !c->shapes[il].present || !c->d_table) {
        fprintf(stderr, "sluice: CUDA expert table has no layer %d\n", il);
        return nullptr;
    }
    cuda_table_flush(c);
    const expert_shape &sh = c->shapes[il];
    const expert_entry *tab = c->d_table + (size_t)il * c->n_expert;
    const int64_t E = sh.ne0[EXPERT_GATE], F = sh.ne1[EXPERT_GATE];
    const int slots = n * k, xs = shm ? n : 0; /* routed slots, then the shared expert's */
    const size_t fsz = (size_t)slots * F, hsz = (size_t)(slots + xs) * F, esz = (size_t)slots * E;
    float *G = (float *)cuda_scratch(c, SCR_MOE, (2 * fsz + hsz + esz) * sizeof(float));
    float *U = G + fsz, *H = U + fsz, *Y = H + hsz;
    const uint32_t tg = sh.type[EXPERT_GATE], tu = sh.type[EXPERT_UP], td = sh.type[EXPERT_DOWN];

    mm_src sg;
    memset(&sg, 0, sizeof sg);
    sg.table = tab;
    sg.part = EXPERT_GATE;
    sg.row_bytes = sh.row_bytes[EXPERT_GATE];
    sg.ids = ids;
    sg.act_div = k;
    mm_src su = sg;
    su.part = EXPERT_UP;
    su.row_bytes = sh.row_bytes[EXPERT_UP];
    mm_src sd = sg;
    sd.part = EXPERT_DOWN;
    sd.row_bytes = sh.row_bytes[EXPERT_DOWN];
    sd.act_div = 1;

    if (shm) {
        sg.extra = shm->gate;
        su.extra = shm->up;
        sd.extra = shm->down;
        sg.n_tab = su.n_tab = sd.n_tab = slots;
        sg.x_arow0 = su.x_arow0 = 0; /* token t's row of x */
        sd.x_arow0 = slots;          /* its SwiGLU row in H */
    }

    const bool tiled = n_family > 8 && (E % 256 == 0 || tg == QT_F32 || tg == QT_F16 || tg == QT_BF16) &&
                       (F % 256 == 0 || td == QT_F32 || td == QT_F16 || td == QT_BF16);
    if (!tiled) {
        qact ax = cuda_act(c, x, n, E, tg);
        if (ax.act == QT_F32) ax.f = x;
        if (tg == tu && sh.row_bytes[EXPERT_GATE] == sh.row_bytes[EXPERT_UP]) {
            cuda_matvec(c, tg, E, F, &sg, &su, &ax, slots + xs, H, F, H + fsz);
        } else {
            cuda_matvec(c, tg, E, F, &sg, nullptr, &ax, slots, G, F);
            qact au = cuda_act(c, x, n, E, tu);
            if (au.act == QT_F32) au.f = x;
            cuda_matvec(c, tu, E, F, &su, nullptr, &au, slots, U, F);
            cuda_swiglu_rows(c, G, U, fsz, H);
        }
        cuda_act_invalidate_range(c, H, hsz * sizeof(float));
        if (cuda_mv_encodes(c, td, F)) { /* each block encodes its slot's row of H itself */
            qact none;
            memset(&none, 0, sizeof none);
            cuda_matvec(c, td, F, E, &sd, nullptr, &none, slots + xs, Y, E, shm ? shm->out : nullptr, H);
        } else {
            qact ah = cuda_act(c, H, slots + xs, F, td);
            if (ah.act == QT_F32) ah.f = H;
            cuda_matvec(c, td, F, E, &sd, nullptr, &ah, slots + xs, Y, E, shm ? shm->out : nullptr);
        }
    } else {
        /* tiles of 64 entries: 128-entry tiles measured 5% slower at the 30B-A3B shape's 128
         * entries per expert (counts of 120-140 need a second, nearly empty tile either way) */
        const int max_tiles = slots / 64 + (slots < c->n_expert ? slots : c->n_expert) + 1;
        int32_t *gl = (int32_t *)cuda_scratch(c, SCR_GROUP, ((size_t)slots + 3 * (size_t)max_tiles + 64) * 4);
        mm_groups g;
        g.list = gl;
        g.tile_exp = gl + slots;
        g.tile_off = g.tile_exp + max_tiles;
        g.tile_cnt = g.tile_off + max_tiles;
        g.n_tiles = g.tile_cnt + max_tiles;
        g.max_tiles = max_tiles;
        if (c->n_expert > 1024) {
            fprintf(stderr, "sluice: CUDA expert grouping supports up to 1024 experts\n");
            return nullptr;
        }
        pdl_launch(k_group, 1, GROUP_THREADS, 0, c->stream, ids, slots, c->n_expert, (int32_t *)g.list,
                                                   (int32_t *)g.tile_exp, (int32_t *)g.tile_off,
                                                   (int32_t *)g.tile_cnt, (int32_t *)g.n_tiles);
        CU_LAUNCH();
        g.act_div = k;
        qact ax = cuda_act(c, x, n, E, tg);
        if (ax.act == QT_F32) ax.f = x;
        cuda_matmul_tiled(c, tg, E, F, &sg, &g, &ax, n, G, F);
        qact au = cuda_act(c, x, n, E, tu);
        if (au.act == QT_F32) au.f = x;
        cuda_matmul_tiled(c, tu, E, F, &su, &g, &au, n, U, F);
        cuda_swiglu_rows(c, G, U, fsz, H);
        cuda_act_invalidate_range(c, H, fsz * sizeof(float));
        qact ah = cuda_act(c, H, slots, F, td);
        if (ah.act == QT_F32) ah.f = H;
        g.act_div = 1;
        cuda_matmul_tiled(c, td, F, E, &sd, &g, &ah, slots, Y, E);
    }
    cuda_act_invalidate_range(c, G, (2 * fsz + hsz + esz) * sizeof(float));
    if (shm) cuda_act_invalidate_range(c, shm->out, (size_t)n * E * sizeof(float));
    return Y;
}

/* ---- prefetch of the routed experts' weights --------------------------------------------------- */

#define PREFETCH_CHUNKS 16 /* blocks per expert part: one SM's bulk-copy unit alone would be slow */

struct part_sizes {
    uint32_t bytes[EXPERT_PARTS];
};

/* Block (slot * 3 + part, chunk): one sixteenth of that expert part asked of L2. */
__global__ void k_expert_prefetch(const expert_entry *tab, const int32_t *ids, part_sizes ps) {
    pdl_wait(); /* programmatic dependent launch: the previous kernel (the router) has finished */
    const int slot = blockIdx.x / EXPERT_PARTS, part = blockIdx.x % EXPERT_PARTS;
    const uint32_t total = ps.bytes[part];
    const uint32_t chunk = (total / PREFETCH_CHUNKS + 15) & ~15u, off = blockIdx.y * chunk;
    if (threadIdx.x != 0 || off >= total) return;
    const uint8_t *p = tab[ids[slot]].p[part];
    if (p) l2_prefetch(p + off, total - off < chunk ? total - off : chunk);
}

void cuda_op_moe_prefetch(backend *b, int il, const int32_t *ids, int n, int k) {
    cuda_backend *c = CB(b);
    /* decode-sized batches only: a prefill's experts far exceed L2, and its tiles read each
     * expert's weights at full bandwidth anyway */
    if (!(c->mv_prefetch & 4) || n * k > 64 || il < 0 || il >= c->n_layer || !c->shapes[il].present) return;
    const expert_shape &sh = c->shapes[il];
    part_sizes ps;
    for (int p = 0; p < EXPERT_PARTS; p++) {
        const size_t bytes = (size_t)sh.row_bytes[p] * (size_t)sh.ne1[p];
        ps.bytes[p] = bytes > 0xfffffff0u ? 0xfffffff0u : (uint32_t)bytes;
    }
    pdl_launch(k_expert_prefetch, dim3(n * k * EXPERT_PARTS, PREFETCH_CHUNKS), 32, 0, c->stream,
               (const expert_entry *)(c->d_table + (size_t)il * c->n_expert), ids, ps);
    CU_LAUNCH();
}

int cuda_op_moe_experts(backend *b, int il, const float *x, int n, const int32_t *ids, const float *w,
                        int k, float *out) {
    cuda_backend *c = CB(b);
    cuda_prof_begin(c);
    const float *Y = cuda_moe_slots(c, il, x, n, ids, k, n);
    if (!Y) return -1;
    const int64_t E = c->shapes[il].ne0[EXPERT_GATE];
    cuda_moe_combine(c, Y, w, n, k, (int)E, out);
    cuda_act_invalidate_range(c, out, (size_t)n * E * sizeof(float));
    cuda_prof_end(c, n <= 8 ? "moe_experts (decode)" : "moe_experts (tiled)");
    return 0;
}

/* moe_experts with the shared expert in the same launches (decode-sized batches of a resident
 * table; see shared_mats). Declines (1) where the shared expert's matrices differ from the
 * routed experts' in shape or type, or the batch takes the tiled path. */
int cuda_op_moe_experts_shared(backend *b, int il, const float *x, int n, const int32_t *ids, const float *w,
                               int k, const tview *gate_s, const tview *up_s, const tview *down_s, float *out,
                               float *shared) {
    cuda_backend *c = CB(b);
    if (!c->shared_in_experts || n > 8 || il < 0 || il >= c->n_layer || !c->shapes[il].present || !c->d_table)
        return 1;
    const expert_shape &sh = c->shapes[il];
    const int64_t E = sh.ne0[EXPERT_GATE], F = sh.ne1[EXPERT_GATE];
    const tview *v[EXPERT_PARTS] = {gate_s, up_s, down_s};
    for (int p = 0; p < EXPERT_PARTS; p++) {
        const int64_t k0 = p == EXPERT_DOWN ? F : E, k1 = p == EXPERT_DOWN ? E : F;
        if (v[p]->type != sh.type[p] || v[p]->ne[0] != k0 || v[p]->ne[1] != k1 || v[p]->row_bytes != sh.row_bytes[p] ||
            sh.ne0[p] != k0 || sh.ne1[p] != k1)
            return 1;
    }
    if (sh.type[EXPERT_GATE] != sh.type[EXPERT_UP] || sh.row_bytes[EXPERT_GATE] != sh.row_bytes[EXPERT_UP]) return 1;
    cuda_prof_begin(c);
    shared_mats m;
    for (int p = 0; p < EXPERT_PARTS; p++) {
        const uint8_t *d = (const uint8_t *)cuda_weight(c, v[p]->data, v[p]->row_bytes * (size_t)v[p]->ne[1]);
        if (p == EXPERT_GATE) m.gate = d;
        else if (p == EXPERT_UP) m.up = d;
        else m.down = d;
    }
    m.out = shared;
    const float *Y = moe_slots(c, il, x, n, ids, k, n, &m);
    if (!Y) return -1;
    cuda_moe_combine(c, Y, w, n, k, (int)E, out);
    cuda_act_invalidate_range(c, out, (size_t)n * E * sizeof(float));
    cuda_prof_end(c, "moe_experts + shared (decode)");
    return 0;
}
