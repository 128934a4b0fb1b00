/* Kernel micro-benchmark (not a test: timings are never unit tests).
 *
 *   bench_kernels [--mb N] [--threads T] [--isa scalar|avx2|avx512] [--types Q4_K,Q6_K,...]
 *                 [--reps R] [--toks K] [--cols N] [--bw-only] [--l1] [--pool] [--attn] [--attn-pos P] [--attn-cold] [--device-rows]
 *                 [--experts-one]
 *
 * For each weight type: a matrix of about N MiB of random valid rows (default 1024 MiB, far
 * beyond the last-level cache) and a small one (4 MiB, cache resident), multiplied by one
 * activation row (decode) through the CPU backend's matmul on T threads; reports GB/s of weight
 * bytes, and the ratio to the measured memory read bandwidth (an AVX2 sum over the same big
 * buffer). With --toks K > 1 it also reports the K-token tile path (prefill) in GOP/s.
 * --cols N: rows of N values (default 2048; 768 is the 30B-A3B expert down rows). The best of R
 * repetitions is reported (the machine may be shared). --l1: each level's dot
 * kernel on one core with cache-resident rows instead (robust to a busy machine). --pool: the
 * thread pool's dispatch cost. --attn: the backend's causal attention for a prefill of K tokens
 * (default 2048) from position 0 on T threads, in the head shapes of the models (GFLOP/s counts
 * 4 * hd flops per query head and key), with an FNV-1a hash of the output bits. --attn-pos P:
 * one token's attention after P positions instead (a decode step's). --attn-cold: with
 * --attn-pos, each call reads another copy of the keys and values, from 512 MiB of copies, so
 * they come from DRAM as in a decode step (whose other layers' weights evicted them); the time
 * is a call's mean over one pass of the copies, best of R passes.
 * --device-rows: backends/cpu/device_rows.c (the GPU's expert products on the host, --gpu-miss
 * host) at the 35B-A3B expert shape (Q4_K gate/up 2048 -> 512, Q6_K down) on T threads, 1, 2
 * and 4 experts a call, each call's experts from a pool of 64 (128 MiB: cache-resident on a big
 * last-level cache) or from --mb MiB of them (DRAM); microseconds an expert.
 * --experts-one: a decode step's routed experts through the backend's experts_one, from a pool
 * of --mb MiB (experts_one_bench below); --reps sets the steps (default 200). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backends/backend.h"
#include "backends/cpu/device_rows.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/threadpool.h"
#include "formats/quant.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)rs;
}

/* Random bytes with sane scale fields: every block's f16 fields set to small values. */
static void fill_weights(uint32_t type, uint8_t *w, size_t bytes, int64_t row_elems) {
    const quant_traits *t = quant_traits_of(type);
    for (size_t i = 0; i + 4 <= bytes; i += 4) {
        uint32_t v = rnd();
        memcpy(w + i, &v, 4);
    }
    if (!t->is_quantized) {
        /* float rows: encode moderate values */
        float x[256];
        size_t eb = t->block_bytes;
        for (size_t off = 0; off + 256 * eb <= bytes; off += 256 * eb) {
            for (int k = 0; k < 256; k++) x[k] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
            t->quantize(x, w + off, 256);
        }
        return;
    }
    /* a quick way to get valid scales: encode one random block and stamp its scale bytes; the
     * quants stay random, which is all a kernel's speed depends on */
    float x[QK_K];
    uint8_t blk[512];
    for (int k = 0; k < QK_K; k++) x[k] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
    if (type >= GGML_TYPE_IQ2_XXS && type != GGML_TYPE_IQ4_NL && type != GGML_TYPE_IQ4_XS &&
        type != GGML_TYPE_MXFP4) {
        for (size_t off = 0; off + t->block_bytes <= bytes; off += t->block_bytes) {
            uint16_t h = 0x2000;
            memcpy(w + off, &h, 2);
        }
        return;
    }
    t->quantize(x, blk, t->block_elems);
    (void)row_elems;
    for (size_t off = 0; off + t->block_bytes <= bytes; off += t->block_bytes) {
        /* the scale fields sit at the block's start or end depending on type; copying the
         * first and last 16 bytes of a valid block covers every layout's scales */
        size_t nb = t->block_bytes;
        size_t head = nb < 16 ? 2 : 16;
        memcpy(w + off, blk, head);
        if (nb > 32) memcpy(w + off + nb - 16, blk + nb - 16, 16);
    }
}

static double mem_bandwidth(const uint8_t *buf, size_t bytes, int reps) {
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        uint64_t acc = 0;
        const uint64_t *p = (const uint64_t *)buf;
        size_t n = bytes / 8;
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (size_t i = 0; i + 4 <= n; i += 4) {
            a0 += p[i];
            a1 += p[i + 1];
            a2 += p[i + 2];
            a3 += p[i + 3];
        }
        acc = a0 + a1 + a2 + a3;
        double dt = now() - t0;
        if (acc == 42) printf(" ");
        double gbs = (double)bytes / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}

typedef struct bw_job {
    const uint8_t *buf;
    size_t bytes;
    uint64_t sink[64];
} bw_job;

static void bw_task(void *ctx, int ith, int nth) {
    bw_job *j = ctx;
    size_t per = j->bytes / (size_t)nth / 64 * 64;
    const uint64_t *p = (const uint64_t *)(j->buf + per * (size_t)ith);
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i + 4 <= per / 8; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
    }
    j->sink[ith * 8] = a0 + a1 + a2 + a3;
}

static double mem_bandwidth_mt(backend *be, const uint8_t *buf, size_t bytes, int reps) {
    double best = 0;
    bw_job j = {buf, bytes, {0}};
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        backend_cpu_parallel(be, bw_task, &j);
        double gbs = (double)bytes / (now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}

/* Single-core, cache-resident speed of each level's dot kernel: 8 rows of 2048 values (a few
 * KiB, in L1/L2) against one activation row, the minimum over many repetitions (robust on a
 * shared machine: the fastest repetition is the one nobody interrupted). GB/s of weight bytes. */
static void l1_table(const char *types_arg) {
    printf("single core, cache resident (min of 300 reps), GB/s of weight bytes:\n%-8s", "type");
    for (int l = 0; l <= (int)kernel_isa_best(); l++) printf(" %9s", kernel_isa_name((kernel_isa)l));
    printf("\n");
    const int64_t n = 2048;
    static float x[2048];
    static uint8_t w[2048 * 4 * 8], a[2048 * 4];
    char list[512];
    snprintf(list, sizeof list, "%s", types_arg);
    kernel_isa saved = kernel_isa_current();
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int type = quant_type_from_name(tok);
        if (type < 0 || !quant_has_codec((uint32_t)type)) continue;
        const quant_traits *qt = quant_traits_of((uint32_t)type), *at = quant_traits_of(qt->act_type);
        size_t row = quant_row_bytes((uint32_t)type, n);
        fill_weights((uint32_t)type, w, row * 8, n);
        for (int i = 0; i < n; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
        at->quantize(x, a, n);
        printf("%-8s", tok);
        for (int l = 0; l <= (int)kernel_isa_best(); l++) {
            kernel_isa_force((kernel_isa)l);
            kernel_dot_fn dot = kernel_dot((uint32_t)type);
            double best = 1e30;
            volatile float sink = 0;
            for (int rep = 0; rep < 300; rep++) {
                double t0 = now();
                float sum = 0;
                for (int r = 0; r < 8; r++) sum += dot(n, w + (size_t)r * row, a);
                double dt = now() - t0;
                sink = sum;
                if (dt < best) best = dt;
            }
            (void)sink;
            printf(" %9.2f", (double)(8 * row) / best / 1e9);
        }
        printf("\n");
    }
    kernel_isa_force(saved);
}

static void empty_task(void *ctx, int ith, int nth) {
    (void)ctx;
    (void)ith;
    (void)nth;
}

/* Thread-pool dispatch cost: an empty job on T threads, the best of 20 batches of 20000. */
static void pool_cost(int threads) {
    backend *be = backend_cpu_new(threads);
    double best = 1e30;
    for (int rep = 0; rep < 20; rep++) {
        double t0 = now();
        for (int i = 0; i < 20000; i++) backend_cpu_parallel(be, empty_task, NULL);
        double dt = (now() - t0) / 20000;
        if (dt < best) best = dt;
    }
    printf("thread pool: empty dispatch on %d threads: %.3f us (best of 20 batches of 20000)\n", threads, best * 1e6);
    be_free(be);
}

/* Prefill attention through the backend op (the thread pool and the kernel of this ISA level):
 * random q, k, v in [-1, 1]; best of reps. With decode_pos > 0, one token after decode_pos
 * positions instead (a decode step's attention; best of 20 x reps). */
static void attn_bench(int threads, int reps, int n, int decode_pos, int cold) {
    static const struct { const char *name; int n_head, n_head_kv, hd; } shapes[] = {
        {"30B-A3B", 32, 4, 128}, {"hd64", 16, 4, 64}, {"35B-A3B", 16, 2, 256}};
    backend *be = backend_cpu_new(threads);
    const int n_tok = decode_pos > 0 ? 1 : n, pos0 = decode_pos > 0 ? decode_pos : 0, n_pos = pos0 + n_tok;
    if (decode_pos > 0) reps *= 20;
    if (decode_pos <= 0) cold = 0;
    printf("attention, isa %s, threads %d, %d token(s) from position %d%s\n", kernel_isa_name(kernel_isa_current()),
           threads, n_tok, pos0, cold ? ", keys and values from DRAM" : "");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int nh = shapes[s].n_head, nkv = shapes[s].n_head_kv, hd = shapes[s].hd;
        size_t nq = (size_t)n_tok * nh * hd, nk = (size_t)n_pos * nkv * hd;
        /* the backend's allocator (64-byte aligned), as the model's KV cache: from malloc
         * (16 bytes past a page) every vector load split two cache lines, 20-30% slower */
        const size_t copies = cold ? ((size_t)512 << 20) / (2 * sizeof(float) * nk) + 1 : 1;
        float *q = be_alloc(be, sizeof(float) * nq), *k = be_alloc(be, sizeof(float) * nk * copies),
              *v = be_alloc(be, sizeof(float) * nk * copies), *out = be_alloc(be, sizeof(float) * nq);
        for (size_t i = 0; i < nq; i++) q[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
        for (size_t i = 0; i < nk; i++) {
            k[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
            v[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
        }
        for (size_t c = 1; c < copies; c++) {
            memcpy(k + c * nk, k, sizeof(float) * nk);
            memcpy(v + c * nk, v, sizeof(float) * nk);
        }
        double best = 1e30;
        for (int r = 0; r < (cold ? 5 : reps); r++) {
            double t0 = now();
            for (size_t c = 0; c < copies; c++)
                be_attention(be, q, k + c * nk, v + c * nk, n_tok, pos0, nh, nkv, hd, hd, 1.0f / sqrtf((float)hd), out);
            double dt = (now() - t0) / (double)copies;
            if (dt < best) best = dt;
        }
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < nq; i++) {
            uint32_t b;
            memcpy(&b, &out[i], 4);
            h = (h ^ b) * 1099511628211ull;
        }
        double flops = 4.0 * hd * nh * ((double)n_pos * (n_pos + 1) / 2 - (double)pos0 * (pos0 + 1) / 2);
        printf("%-8s heads %2d/%d hd %3d: %9.3f ms  %6.1f GFLOP/s  hash %016llx\n", shapes[s].name, nh, nkv, hd,
               best * 1e3, flops / best / 1e9, (unsigned long long)h);
        fflush(stdout);
        be_mfree(be, q), be_mfree(be, k), be_mfree(be, v), be_mfree(be, out);
    }
    be_free(be);
}

/* device_experts_run's time an expert, best of reps x 20 calls, experts taken round-robin from
 * a pool of pool_bytes (valid scales, random quants). */
static void device_rows_bench(int threads, int reps, size_t pool_bytes) {
    const device_expert_shape sh = {GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 2048, 512};
    const size_t rg = quant_row_bytes(sh.type_gate, sh.E), rd = quant_row_bytes(sh.type_down, sh.F);
    const size_t eb = rg * (size_t)sh.F * 2 + rd * (size_t)sh.E;
    const size_t n_exp = pool_bytes / eb > 0 ? pool_bytes / eb : 1;
    uint8_t *pool = malloc(eb * n_exp);
    float *x = malloc(sizeof(float) * (size_t)sh.E), *y = malloc(sizeof(float) * (size_t)sh.E * 4);
    if (!pool || !x || !y) return;
    for (size_t i = 0; i < eb * n_exp; i++) pool[i] = (uint8_t)rnd();
    for (size_t e = 0; e < n_exp; e++) { /* f16 scales of 2^-13 (Q4_K d, dmin; Q6_K d) */
        uint8_t *b = pool + e * eb;
        for (size_t o = 0; o < rg * (size_t)sh.F * 2; o += 144) b[o] = 0, b[o + 1] = 0x08, b[o + 2] = 0, b[o + 3] = 0x08;
        for (size_t o = rg * (size_t)sh.F * 2; o < eb; o += 210) b[o + 208] = 0, b[o + 209] = 0x08;
    }
    for (int i = 0; i < sh.E; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
    threadpool *tp = threadpool_new(threads);
    for (int nj = 1; nj <= 4; nj *= 2) {
        device_expert_job jobs[4];
        const size_t wb = device_experts_work_bytes(&sh, nj);
        void *work = malloc(wb);
        double best = 1e30;
        size_t next = 0;
        for (int r = 0; r < reps * 20; r++) {
            for (int j = 0; j < nj; j++, next = (next + 1) % n_exp) {
                uint8_t *b = pool + next * eb;
                jobs[j] = (device_expert_job){b, b + rg * (size_t)sh.F, b + rg * (size_t)sh.F * 2, x, y + (size_t)j * sh.E};
            }
            const double t0 = now();
            device_experts_run(tp, &sh, jobs, nj, work, wb);
            const double dt = now() - t0;
            if (dt < best) best = dt;
        }
        printf("device rows: %d threads, %d expert(s) a call, pool %zu MiB: %.1f us an expert (%.2f GB/s)\n", threads, nj,
               eb * n_exp >> 20, best * 1e6 / nj, (double)eb * nj / best / 1e9);
        free(work);
    }
    threadpool_free(tp);
    free(pool);
    free(x);
    free(y);
}

/* --experts-one: a decode step's routed experts through the backend's experts_one (two
 * dispatches a layer: all gate/up rows, then all down rows) at the 30B-A3B shape (128 experts
 * of Q4_K gate/up 768 x 2048; down 2048 x 768 in Q4_K and Q6_K on alternate layers, as in a
 * Q4_K_M file), 8 random experts a layer, from a pool of --mb MiB in 2 MiB pages (as a resident
 * model is mapped). Reports the weight bytes a step reads over its time, best and median of
 * `steps` steps, against the read bandwidth measured just before and just after (their mean):
 * what the decode's expert path makes of the memory, beside the one-matrix stream above. */
static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void experts_one_bench(int threads, int steps, size_t pool_bytes) {
    enum { E = 128, F = 768, H = 2048, K = 8 };
    const uint32_t tg = GGML_TYPE_Q4_K, td[2] = {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
    const size_t rg = quant_row_bytes(tg, H), gu = rg * F;
    size_t eb[2];
    for (int i = 0; i < 2; i++) eb[i] = 2 * gu + quant_row_bytes(td[i], F) * H;
    const size_t pair = (size_t)E * (eb[0] + eb[1]); /* two layers, one of each down type */
    const int L = (int)(pool_bytes / pair) * 2 > 2 ? (int)(pool_bytes / pair) * 2 : 2;
    const size_t total = (size_t)L / 2 * pair, huge = (size_t)2 << 20;
    const size_t alloc = (total + huge - 1) / huge * huge;
    uint8_t *buf = aligned_alloc(huge, alloc);
    if (!buf) return;
    madvise(buf, alloc, MADV_HUGEPAGE);
    for (int l = 0; l < L; l++) {
        uint8_t *lay = buf + (size_t)(l / 2) * pair + (size_t)(l % 2) * (size_t)E * eb[0];
        for (int e = 0; e < E; e++) {
            uint8_t *x = lay + (size_t)e * eb[l % 2];
            fill_weights(tg, x, 2 * gu, H);
            fill_weights(td[l % 2], x + 2 * gu, eb[l % 2] - 2 * gu, F);
        }
    }
    backend *be = backend_cpu_new(threads);
    float *xin = malloc(sizeof(float) * H), *outs = malloc(sizeof(float) * H * K);
    double *gbs = malloc(sizeof(double) * (size_t)steps);
    if (!be || !xin || !outs || !gbs || !be->ops->experts_one) {
        printf("experts_one: not available\n");
        goto done;
    }
    for (int i = 0; i < H; i++) xin[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
    float *out[K];
    for (int k = 0; k < K; k++) out[k] = outs + (size_t)k * H;
    const double bw0 = mem_bandwidth_mt(be, buf, total, 3);
    double bytes_step = 0;
    for (int l = 0; l < L; l++) bytes_step += (double)K * (double)eb[l % 2];
    for (int st = -1; st < steps; st++) { /* step -1: warm-up, not counted */
        const double t0 = now();
        for (int l = 0; l < L; l++) {
            const uint8_t *lay = buf + (size_t)(l / 2) * pair + (size_t)(l % 2) * (size_t)E * eb[0];
            tview g[K], u[K], d[K];
            const tview *gp[K], *up[K], *dp[K];
            for (int k = 0; k < K; k++) { /* 8 distinct experts */
                int e;
                for (;;) {
                    e = (int)(rnd() % E);
                    int dup = 0;
                    for (int j = 0; j < k; j++) dup |= g[j].data == lay + (size_t)e * eb[l % 2];
                    if (!dup) break;
                }
                const uint8_t *x = lay + (size_t)e * eb[l % 2];
                const size_t rd = quant_row_bytes(td[l % 2], F);
                g[k] = (tview){.type = tg, .ne = {H, F, 1, 1}, .row_bytes = rg, .mat_bytes = gu, .data = x, .name = "gate"};
                u[k] = (tview){.type = tg, .ne = {H, F, 1, 1}, .row_bytes = rg, .mat_bytes = gu, .data = x + gu, .name = "up"};
                d[k] = (tview){.type = td[l % 2], .ne = {F, H, 1, 1}, .row_bytes = rd, .mat_bytes = rd * H,
                               .data = x + 2 * gu, .name = "down"};
                gp[k] = &g[k], up[k] = &u[k], dp[k] = &d[k];
            }
            if (!be->ops->experts_one(be, K, gp, up, dp, xin, out)) {
                printf("experts_one: declined\n");
                goto done;
            }
        }
        if (st >= 0) gbs[st] = bytes_step / (now() - t0) / 1e9;
    }
    const double bw1 = mem_bandwidth_mt(be, buf, total, 3);
    qsort(gbs, (size_t)steps, sizeof *gbs, cmp_double);
    const double bw = (bw0 + bw1) / 2;
    printf("experts_one, 30B-A3B expert shape, %d layers x %d of %d experts, pool %.0f MiB, %d threads, %d steps\n", L, K, E,
           (double)total / 1048576.0, threads, steps);
    printf("read bandwidth before / after: %.2f / %.2f GB/s\n", bw0, bw1);
    printf("experts' bytes / step time: best %.2f GB/s (%.0f%% of the bandwidth), median %.2f GB/s (%.0f%%)\n",
           gbs[steps - 1], 100.0 * gbs[steps - 1] / bw, gbs[steps / 2], 100.0 * gbs[steps / 2] / bw);
done:
    free(gbs);
    free(outs);
    free(xin);
    if (be) be_free(be);
    free(buf);
}

int main(int argc, char **argv) {
    size_t mb = 1024;
    int threads = 2, reps = 5, toks = 0, l1 = 0, attn = 0, attn_pos = 0, attn_cold = 0, drows = 0, eone = 0;
    int64_t K = 2048; /* row length: the 30B-A3B hidden size (--cols: 768, its expert down rows) */
    const char *types_arg = "F32,F16,BF16,Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,IQ4_NL,MXFP4,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,IQ4_XS,IQ2_XXS,IQ2_XS,IQ2_S,IQ3_XXS,IQ3_S";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--toks") && i + 1 < argc) toks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cols") && i + 1 < argc) K = atol(argv[++i]);
        else if (!strcmp(argv[i], "--types") && i + 1 < argc) types_arg = argv[++i];
        else if (!strcmp(argv[i], "--bw-only")) types_arg = "";
        else if (!strcmp(argv[i], "--l1")) l1 = 1;
        else if (!strcmp(argv[i], "--pool")) l1 = 2;
        else if (!strcmp(argv[i], "--attn")) attn = 1;
        else if (!strcmp(argv[i], "--attn-pos") && i + 1 < argc) attn = 1, attn_pos = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--attn-cold")) attn_cold = 1;
        else if (!strcmp(argv[i], "--device-rows")) drows = 1;
        else if (!strcmp(argv[i], "--experts-one")) eone = 1;
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *name = argv[++i];
            for (int l = 0; l < KERNEL_ISA_COUNT; l++)
                if (!strcmp(name, kernel_isa_name((kernel_isa)l))) kernel_isa_force((kernel_isa)l);
        } else {
            fprintf(stderr, "usage: %s [--mb N] [--threads T] [--isa L] [--types A,B] [--reps R] [--toks K] [--cols N] [--bw-only] [--l1] [--pool] [--attn] [--attn-pos P] [--attn-cold] [--device-rows] [--experts-one]\n", argv[0]);
            return 2;
        }
    }
    if (attn) {
        attn_bench(threads, reps, toks > 1 ? toks : 2048, attn_pos, attn_cold);
        return 0;
    }
    if (eone) {
        experts_one_bench(threads, reps < 20 ? 200 : reps, mb << 20);
        return 0;
    }
    if (drows) {
        device_rows_bench(threads, reps, (size_t)128 << 20);
        device_rows_bench(threads, reps, mb << 20);
        return 0;
    }
    if (l1 == 1) {
        l1_table(types_arg);
        return 0;
    }
    if (l1 == 2) {
        pool_cost(threads);
        return 0;
    }
    backend *be = backend_cpu_new(threads);
    if (mb < 1) {
        fprintf(stderr, "bench_kernels: --mb must be at least 1\n");
        return 2;
    }
    size_t big = mb << 20;
    uint8_t *buf = aligned_alloc(4096, big);
    if (!buf) return 1;
    for (size_t i = 0; i < big; i += 4096) buf[i] = (uint8_t)i; /* fault the pages in */
    memset(buf, 1, big);
    double bw1 = mem_bandwidth(buf, big, reps), bwn = mem_bandwidth_mt(be, buf, big, reps);
    printf("isa %s, threads %d, matrix %zu MiB, row %lld values\n", kernel_isa_name(kernel_isa_current()),
           threads, mb, (long long)K);
    printf("memory read bandwidth: %.2f GB/s (1 thread), %.2f GB/s (%d threads)\n", bw1, bwn, threads);
    printf("%-8s %10s %10s %8s %12s", "type", "mem GB/s", "vs bw", "L2 GB/s", "");
    if (toks > 1) printf(" %10s", "tile GOP/s");
    printf("\n");
    float *x = malloc(sizeof(float) * (size_t)K * (size_t)(toks > 1 ? toks : 1));
    for (int64_t i = 0; i < K * (toks > 1 ? toks : 1); i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
    char list[512];
    snprintf(list, sizeof list, "%s", types_arg);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int type = quant_type_from_name(tok);
        if (type < 0 || !quant_has_codec((uint32_t)type)) {
            printf("%-8s (no codec)\n", tok);
            continue;
        }
        size_t row = quant_row_bytes((uint32_t)type, K);
        int64_t rows = (int64_t)(big / row);
        fill_weights((uint32_t)type, buf, rows * row, K);
        float *out = malloc(sizeof(float) * (size_t)rows * (size_t)(toks > 1 ? toks : 1));
        tview w = {.type = (uint32_t)type, .ne = {K, rows, 1, 1}, .row_bytes = row,
                   .mat_bytes = row * (size_t)rows, .data = buf, .name = "bench"};
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            be_matmul(be, &w, x, 1, out);
            double dt = now() - t0;
            if (dt < best) best = dt;
        }
        double gbs = (double)(rows * row) / best / 1e9;
        /* cache resident: 2 MiB of the same rows, many passes */
        int64_t rows_small = (int64_t)((2u << 20) / row);
        if (rows_small > rows) rows_small = rows; /* --mb 1: the whole matrix (it and out hold no more) */
        tview ws = w;
        ws.ne[1] = rows_small;
        ws.mat_bytes = row * (size_t)rows_small;
        double best_s = 1e30;
        for (int r = 0; r < reps * 20; r++) {
            double t0 = now();
            be_matmul(be, &ws, x, 1, out);
            double dt = now() - t0;
            if (dt < best_s) best_s = dt;
        }
        double gbs_s = (double)(rows_small * row) / best_s / 1e9;
        printf("%-8s %10.2f %9.0f%% %8.2f %12s", tok, gbs, 100.0 * gbs / bwn, gbs_s, "");
        if (toks > 1) {
            /* prefill-like: 64 MiB of rows x toks tokens */
            int64_t rows_t = (int64_t)((64u << 20) / row);
            if (rows_t > rows) rows_t = rows;
            tview wt = w;
            wt.ne[1] = rows_t;
            wt.mat_bytes = row * (size_t)rows_t;
            double best_t = 1e30;
            for (int r = 0; r < reps; r++) {
                double t0 = now();
                be_matmul(be, &wt, x, toks, out);
                double dt = now() - t0;
                if (dt < best_t) best_t = dt;
            }
            printf(" %10.1f", 2.0 * (double)K * (double)rows_t * toks / best_t / 1e9);
        }
        printf("\n");
        fflush(stdout);
        free(out);
    }
    free(x);
    free(buf);
    be_free(be);
    return 0;
}
