/* Kernel selection: cpuid + xgetbv decide the best instruction-set level once; each level's
 * table starts as a copy of the level below and its translation unit overrides what it
 * implements, so a missing kernel always falls back to a slower but identical one. */
#include "backends/cpu/kernels.h"
#include "backends/cpu/exp_f32.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static kernel_set sets[KERNEL_ISA_COUNT];

uint64_t kernels_ksigns_pm1[128]; /* kernels_x86_common.h */

static void init_ksigns_pm1(void) {
    for (int i = 0; i < 128; i++) {
        uint64_t v = 0;
        for (int j = 0; j < 8; j++) v |= (uint64_t)((quant_ksigns_iq2xs[i] >> j) & 1 ? 0xff : 0x01) << (8 * j);
        kernels_ksigns_pm1[i] = v;
    }
}

static kernel_isa best_isa = KERNEL_ISA_SCALAR;
static kernel_isa cur_isa = KERNEL_ISA_SCALAR;
static kernel_isa registered_isa = KERNEL_ISA_SCALAR; /* the highest level whose own kernels were registered */
bool kernels_amx_granted; /* kernels.h */
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

size_t kernel_tile_l2_bytes = (size_t)384 << 10; /* kernels.h; 384 KiB of a 1-2 MiB L2 */

#if defined(__x86_64__)
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* AMX tile data is off by default for a process: ask the kernel (Linux >= 5.16) for it. */
static bool request_amx(void) {
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

static void detect(void) {
    uint32_t a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29), fma = c & (1u << 12);
    if (!osxsave || !avx || !f16c || !fma) return;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return; /* the OS saves XMM and YMM state */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    bool avx2 = b & (1u << 5);
    if (!avx2) return;
    best_isa = KERNEL_ISA_AVX2;
    bool f = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30), vl = b & (1u << 31);
    bool vnni = c & (1u << 11);
    if (f && dq && bw && vl && vnni && (xcr0 & 0xe0) == 0xe0) best_isa = KERNEL_ISA_AVX512;
    bool amx_tile = d & (1u << 24), amx_int8 = d & (1u << 25);
    if (amx_tile && amx_int8 && (xcr0 & 0x60000) == 0x60000) kernels_amx_granted = request_amx();
}
#else
static void detect(void) {}
#endif

/* ---- Q6_K_R16, the scalar tile: the reference product of each group, token by token ---- */

static size_t r16_ref_bytes(int64_t n, int toks) { return (size_t)toks * (size_t)(n / 256) * 292; }

static void r16_ref_pack(int64_t n, const void *a, size_t a_stride, int toks, int t0, int t1, void *dst) {
    (void)toks;
    const size_t row = (size_t)(n / 256) * 292;
    for (int t = t0; t < t1; t++) memcpy((uint8_t *)dst + (size_t)t * row, (const uint8_t *)a + (size_t)t * a_stride, row);
}

static void r16_ref_run(int64_t n, const void *w, size_t w_stride, int rows, const void *packed, int toks,
                        float *out, size_t out_stride) {
    const size_t row = (size_t)(n / 256) * 292;
    for (int g = 0; g < rows / QUANT_R16_ROWS; g++) {
        const uint8_t *grp = (const uint8_t *)w + (size_t)g * QUANT_R16_ROWS * w_stride;
        for (int t = 0; t < toks; t++) {
            float v[QUANT_R16_ROWS];
            quant_dot_q6_k_r16(n, grp, (const uint8_t *)packed + (size_t)t * row, v);
            memcpy(out + (size_t)t * out_stride + (size_t)g * QUANT_R16_ROWS, v, sizeof v);
        }
    }
}

static const kernel_tile r16_ref_tile = {r16_ref_bytes, r16_ref_pack, r16_ref_run, 1, QUANT_R16_ROWS};

static void init(void) {
    init_ksigns_pm1();
    kernel_set *s = &sets[KERNEL_ISA_SCALAR];
    for (uint32_t t = 0; t < GGML_TYPE_COUNT; t++) {
        const quant_traits *qt = quant_traits_of(t);
        if (!qt) continue;
        s->dot[t] = qt->dot;
        s->quantize[t] = qt->quantize;
    }
    s->tile[SLUICE_TYPE_Q6_K_R16] = &r16_ref_tile;
    s->attn = kernel_attn_ref;
    s->dot_f32 = kernel_dot_f32_ref;
    s->decay_dot = kernel_decay_dot_ref;
    s->update_dot = kernel_update_dot_ref;
    s->conv_taps = kernel_conv_taps_ref;
    s->silu_mul = kernel_silu_mul_ref;
    s->sigmoid_mul = kernel_sigmoid_mul_ref;
    s->silu = kernel_silu_ref;
    detect();
    /* SLUICE_ISA names a lower level: the process then behaves as on a CPU that has no more
     * (the levels above are never registered), so an AVX-512 machine tests the AVX2 build's
     * start-up and whole-model paths (tests/models: the fixture_avx2_* twins) */
    const char *env = getenv("SLUICE_ISA");
    if (env) {
        for (int l = 0; l < KERNEL_ISA_COUNT; l++)
            if (strcmp(env, kernel_isa_name((kernel_isa)l)) == 0 && l < (int)best_isa) best_isa = (kernel_isa)l;
    }
    if (best_isa < KERNEL_ISA_AVX512) kernels_amx_granted = false; /* its tiles are AVX-512 code */
#if defined(__x86_64__)
    /* A level's registration runs only where the CPU has it: its translation unit is compiled
     * for that level, and the compiler may use the level's instructions anywhere in it, the
     * registration function included (on an AVX2-only CPU that was a SIGILL at start-up). The
     * levels above the best stay copies of it, never selected. */
    sets[KERNEL_ISA_AVX2] = sets[KERNEL_ISA_SCALAR];
    if (best_isa >= KERNEL_ISA_AVX2) {
        kernels_register_avx2(&sets[KERNEL_ISA_AVX2]);
        registered_isa = KERNEL_ISA_AVX2;
    }
    sets[KERNEL_ISA_AVX512] = sets[KERNEL_ISA_AVX2];
    if (best_isa >= KERNEL_ISA_AVX512) {
        kernels_register_avx512(&sets[KERNEL_ISA_AVX512]);
        registered_isa = KERNEL_ISA_AVX512;
    }
#else
    for (int l = 1; l < KERNEL_ISA_COUNT; l++) sets[l] = sets[0];
#endif
    cur_isa = best_isa;
    const char *l2 = getenv("SLUICE_TILE_L2_KB");
    if (l2) kernel_tile_l2_bytes = (size_t)strtoul(l2, NULL, 10) << 10;
}

static void ensure_init(void) { pthread_once(&init_once, init); }

const char *kernel_isa_name(kernel_isa isa) {
    switch (isa) {
    case KERNEL_ISA_SCALAR: return "scalar";
    case KERNEL_ISA_AVX2: return "avx2";
    case KERNEL_ISA_AVX512: return "avx512";
    default: return "?";
    }
}

kernel_isa kernel_isa_best(void) {
    ensure_init();
    return best_isa;
}

kernel_isa kernel_isa_registered(void) {
    ensure_init();
    return registered_isa;
}

kernel_isa kernel_isa_current(void) {
    ensure_init();
    return cur_isa;
}

kernel_isa kernel_isa_force(kernel_isa isa) {
    ensure_init();
    cur_isa = isa > best_isa ? best_isa : isa;
    return cur_isa;
}

bool kernel_amx_usable(void) {
    ensure_init();
    return kernels_amx_granted;
}

kernel_dot_fn kernel_dot(uint32_t type) {
    ensure_init();
    if (type < GGML_TYPE_COUNT) return sets[cur_isa].dot[type];
    /* sluice-private types (MLX affine, ids 100+) have only their scalar reference */
    const quant_traits *qt = quant_traits_of(type);
    return qt ? qt->dot : NULL;
}

kernel_terms_fn kernel_terms_of(uint32_t type) {
    ensure_init();
    return type < GGML_TYPE_COUNT ? sets[cur_isa].terms[type] : NULL;
}

void kernel_block_terms(uint32_t type, int64_t n, const void *w, const void *a, float *terms) {
    const kernel_terms_fn f = kernel_terms_of(type);
    if (f) {
        f(n, w, a, terms);
        return;
    }
    /* one block at a time through the dot kernel: 0 + term */
    const quant_traits *wt = quant_traits_of(type), *at = quant_traits_of(wt->act_type);
    const kernel_dot_fn dot = kernel_dot(type);
    const int64_t B = wt->block_elems;
    for (int64_t b = 0; b < n / B; b++)
        terms[b] = dot(B, (const uint8_t *)w + (size_t)b * wt->block_bytes, (const uint8_t *)a + (size_t)b * at->block_bytes);
}

quant_quantize_fn kernel_quantize(uint32_t act_type) {
    ensure_init();
    return act_type < GGML_TYPE_COUNT ? sets[cur_isa].quantize[act_type] : NULL;
}

const kernel_tile *kernel_tile_of(uint32_t type) {
    ensure_init();
    return type < QUANT_TYPE_LIMIT ? sets[cur_isa].tile[type] : NULL;
}

bool kernel_tile_vectorized(uint32_t type) {
    ensure_init();
    if (type >= QUANT_TYPE_LIMIT || !sets[cur_isa].tile[type]) return false;
    return sets[cur_isa].tile[type] != sets[KERNEL_ISA_SCALAR].tile[type];
}

kernel_attn_fn kernel_attn(void) {
    ensure_init();
    return sets[cur_isa].attn;
}

static void attn_tokens_loop(const float *q, size_t q_tok_stride, size_t q_stride, int G, int T, const float *k,
                             size_t k_stride, const float *v, size_t v_stride, int n_kv, int hd, int hd_v,
                             float scale, float *out, size_t out_tok_stride, size_t out_stride, float *work) {
    kernel_attn_fn fn = kernel_attn();
    for (int i = 0; i < T; i++)
        fn(q + (size_t)i * q_tok_stride, q_stride, G, k, k_stride, v, v_stride, n_kv + i, hd, hd_v, scale,
           out + (size_t)i * out_tok_stride, out_stride, work);
}

kernel_attn_tokens_fn kernel_attn_tokens(void) {
    ensure_init();
    return sets[cur_isa].attn_tokens ? sets[cur_isa].attn_tokens : attn_tokens_loop;
}

/* ---- attention: the one algorithm (see kernels.h); SIMD versions must match it bit for bit */

float kernel_exp_s(float x) {
    if (!(x >= -87.0f)) return 0.0f; /* also -inf (the first tile's correction) */
    float n = rintf(x * 1.44269504f);  /* round to nearest even */
    float r = (x - n * 0.693145751953125f) - n * 1.42860677e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

static float attn_dot(const float *a, const float *b, int n) {
    float s[16] = {0};
    for (int i = 0; i < n; i++) s[i % 16] = fmaf(a[i], b[i], s[i % 16]);
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) s[j] += s[j + w];
    return s[0];
}

void kernel_attn_ref(const float *q, size_t q_stride, int G, const float *k, size_t k_stride, const float *v,
                     size_t v_stride, int n_kv, int hd, int hd_v, float scale, float *out, size_t out_stride,
                     float *work) {
    for (int g = 0; g < G; g++) {
        const float *qg = q + (size_t)g * q_stride;
        float *o = out + (size_t)g * out_stride, *s = work + (size_t)g * KERNEL_ATTN_TILE;
        float m = -INFINITY;
        double l = 0.0;
        for (int d = 0; d < hd_v; d++) o[d] = 0.0f;
        for (int p0 = 0; p0 < n_kv; p0 += KERNEL_ATTN_TILE) {
            int p1 = p0 + KERNEL_ATTN_TILE < n_kv ? p0 + KERNEL_ATTN_TILE : n_kv;
            float mt = -INFINITY;
            for (int p = p0; p < p1; p++) {
                s[p - p0] = attn_dot(qg, k + (size_t)p * k_stride, hd) * scale;
                mt = s[p - p0] > mt ? s[p - p0] : mt;
            }
            float mn = m > mt ? m : mt;
            float c = kernel_exp_s(m - mn);
            l = l * (double)c;
            for (int d = 0; d < hd_v; d++) o[d] = o[d] * c;
            for (int p = p0; p < p1; p++) {
                float e = kernel_exp_s(s[p - p0] - mn);
                l = l + (double)e;
                const float *vp = v + (size_t)p * v_stride;
                for (int d = 0; d < hd_v; d++) o[d] = fmaf(e, vp[d], o[d]);
            }
            m = mn;
        }
        float inv = (float)(1.0 / l);
        for (int d = 0; d < hd_v; d++) o[d] = o[d] * inv;
    }
}

kernel_decay_dot_fn kernel_gdn_decay_dot(void) {
    ensure_init();
    return sets[cur_isa].decay_dot;
}

kernel_update_dot_fn kernel_gdn_update_dot(void) {
    ensure_init();
    return sets[cur_isa].update_dot;
}

kernel_decay_dot4_fn kernel_gdn_decay_dot4(void) {
    ensure_init();
    return sets[cur_isa].decay_dot4;
}

kernel_update_dot4_fn kernel_gdn_update_dot4(void) {
    ensure_init();
    return sets[cur_isa].update_dot4;
}

kernel_gdn_rows_fn kernel_gdn_rows(void) {
    ensure_init();
    return sets[cur_isa].gdn_rows;
}

kernel_conv_taps_fn kernel_conv_taps(void) {
    ensure_init();
    return sets[cur_isa].conv_taps;
}

kernel_silu_mul_fn kernel_silu_mul(void) {
    ensure_init();
    return sets[cur_isa].silu_mul;
}

kernel_sigmoid_mul_fn kernel_sigmoid_mul(void) {
    ensure_init();
    return sets[cur_isa].sigmoid_mul;
}

kernel_silu_fn kernel_silu(void) {
    ensure_init();
    return sets[cur_isa].silu;
}

/* 2^(i/32) correctly rounded to double, less i << 47 (the exponent bits exp_f32 adds back) */
const uint64_t exp_f32_table[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

void kernel_silu_mul_ref(size_t n, const float *g, const float *u, float *out) {
    for (size_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + exp_f32(-g[i])) * u[i];
}

void kernel_sigmoid_mul_ref(size_t n, const float *g, float *x) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] * (1.0f / (1.0f + exp_f32(-g[i])));
}

void kernel_silu_ref(size_t n, float *x) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + exp_f32(-x[i]));
}

void kernel_conv_taps_ref(int n, int K, const float *wt, size_t wt_stride, const float *const *src, float *y) {
    for (int c = 0; c < n; c++) {
        float acc = 0.0f;
        for (int i = 0; i < K; i++) acc += wt[(size_t)i * wt_stride + c] * src[i][c];
        y[c] = acc;
    }
}

static inline float lanes_sum(const float acc[8]) {
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

float kernel_decay_dot_ref(int n, float *s, float a, const float *k) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            s[i + l] *= a;
            acc[l] += s[i + l] * k[i + l];
        }
    float r = lanes_sum(acc);
    for (; i < n; i++) {
        s[i] *= a;
        r += s[i] * k[i];
    }
    return r;
}

float kernel_update_dot_ref(int n, float *s, float d, const float *k, const float *q) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            s[i + l] += k[i + l] * d;
            acc[l] += s[i + l] * q[i + l];
        }
    float r = lanes_sum(acc);
    for (; i < n; i++) {
        s[i] += k[i] * d;
        r += s[i] * q[i];
    }
    return r;
}

float kernel_dot_f32(int64_t n, const float *a, const float *b) {
    ensure_init();
    return sets[cur_isa].dot_f32(n, a, b);
}

float kernel_dot_f32_ref(int64_t n, const float *a, const float *b) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
