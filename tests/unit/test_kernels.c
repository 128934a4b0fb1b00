/* CPU kernels against the scalar references, bit for bit, at every instruction-set level this
 * machine supports (forced one after another through kernel_isa_force):
 *   - every codec's dot product on random rows of many lengths: weights both as random bytes
 *     (scale fields made finite) and as encoder output, activations encoded by the REFERENCE
 *     encoder from random floats of many magnitudes;
 *   - every activation encoder (Q8_0, Q8_1, Q8_K, F16, BF16): identical bytes, including
 *     values that land exactly on rounding ties, zero blocks, repeated maxima of both signs;
 *   - every tile kernel: each output equals the single-row reference dot;
 *   - the attention kernel against its scalar definition (kernel_attn_ref);
 *   - kernel_dot_f32, the Gated DeltaNet state passes and the conv1d taps against theirs;
 *   - after every vector kernel, the upper halves of the vector registers are clean (XINUSE):
 *     a kernel that returns with dirty upper state makes every later SSE instruction of the
 *     process pay a transition penalty (measured here: legacy-SSE code 54x slower).
 * Prints how many comparisons ran per level. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/exp_f32.h"
#include "backends/cpu/kernels.h"
#include "check.h"
#include "formats/quant.h"

/* XGETBV(1) reads XINUSE: bit 2 is the upper 128 bits of ymm0-15, bit 6 the upper 256 bits of
 * zmm0-15 (zmm16-31, bit 7, are out of reach of legacy SSE code and do not matter). */
static bool xinuse_ok;

static void xinuse_init(void) {
#if defined(__x86_64__)
    uint32_t a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    if (!(c & (1u << 27))) return; /* OSXSAVE */
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0xd), "c"(1));
    xinuse_ok = (a >> 2) & 1;
#endif
}

static bool upper_dirty(void) {
#if defined(__x86_64__)
    if (!xinuse_ok) return false;
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
    /* bits 2 and 6: upper vector halves; bit 18: AMX tile data (a walk that did not
     * TILERELEASE leaves every later context switch saving 8 KiB) */
    return (lo & 0x40044u) != 0;
#else
    return false;
#endif
}

#define CHECK_CLEAN(isa, what, name)                                                              \
    CHECKF(!upper_dirty(), "%s %s %s returns with dirty upper vector or tile state (no vzeroupper or tilerelease)", \
           kernel_isa_name(isa), what, name)

typedef struct rng {
    uint64_t s;
} rng;

static uint32_t rnd(rng *r) {
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(r->s >> 33);
}

static float rnd_unit(rng *r) { return (float)rnd(r) / 2147483648.0f - 1.0f; } /* [-1, 1) */

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* A finite f16 of moderate magnitude (2^-10 .. 2^5), random sign and mantissa. */
static uint16_t rnd_f16(rng *r) {
    uint32_t e = 5 + rnd(r) % 16;
    return (uint16_t)(((rnd(r) & 1) << 15) | (e << 10) | (rnd(r) & 0x3ff));
}

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* Offsets of the f16 scale fields of one block of each type (-1 ends the list). */
static const int *scale_fields(uint32_t type) {
    static const int d0[] = {0, -1}, d0m2[] = {0, 2, -1}, q2k[] = {80, 82, -1}, q3k[] = {108, -1},
                     q6k[] = {208, -1}, none[] = {-1};
    switch (type) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: case GGML_TYPE_IQ4_NL:
    case GGML_TYPE_IQ4_XS: case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S:
    case GGML_TYPE_IQ3_XXS: case GGML_TYPE_IQ3_S: case GGML_TYPE_Q2_0:
        return d0;
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
        return d0m2;
    case GGML_TYPE_Q2_K: return q2k;
    case GGML_TYPE_Q3_K: return q3k;
    case GGML_TYPE_Q6_K: return q6k;
    default: return none;
    }
}

/* Random floats with a per-block magnitude (some blocks tiny, some large, some zero) and a few
 * outliers. */
static void rnd_floats(rng *r, float *x, int64_t n, int block) {
    for (int64_t i = 0; i < n; i += block) {
        int kind = (int)(rnd(r) % 8);
        float mag = kind == 0 ? 0.0f : kind == 1 ? 1e-3f : kind == 2 ? 100.0f : 1.0f;
        for (int64_t j = i; j < i + block && j < n; j++) {
            x[j] = rnd_unit(r) * mag;
            if (rnd(r) % 97 == 0) x[j] *= 8.0f;
        }
    }
}

/* Weight rows of a type: random bytes with finite scales, or (when the encoder is fast) an
 * encoded random float row. */
static void rnd_weights(rng *r, uint32_t type, uint8_t *w, int64_t n, float *tmp) {
    const quant_traits *t = quant_traits_of(type);
    bool float_type = !t->is_quantized;
    bool slow_encoder = type >= GGML_TYPE_IQ2_XXS && type != GGML_TYPE_IQ4_NL &&
                        type != GGML_TYPE_IQ4_XS && type != GGML_TYPE_MXFP4 && type != GGML_TYPE_BF16;
    if (float_type || (!slow_encoder && rnd(r) % 2 == 0)) {
        rnd_floats(r, tmp, n, 32);
        t->quantize(tmp, w, n);
        return;
    }
    size_t bytes = quant_row_bytes(type, n);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rnd(r);
    const int *f = scale_fields(type);
    for (int64_t b = 0; b < n / t->block_elems; b++)
        for (int k = 0; f[k] >= 0; k++) put16(w + b * t->block_bytes + f[k], rnd_f16(r));
    if (type == GGML_TYPE_MXFP4) { /* sane exponents; one row in four only 0 or 1 (subnormal scales) */
        const bool tiny = rnd(r) % 4 == 0;
        for (int64_t b = 0; b < n / 32; b++) w[b * 17] = (uint8_t)(tiny ? rnd(r) % 2 : 100 + rnd(r) % 56);
    }
}

static long n_checks;

static void check_dots(rng *r, kernel_isa isa) {
    enum { NMAX = 8192 + 256 };
    static float x[NMAX];
    static uint8_t w[NMAX * 4 * 4], a[NMAX * 4 * 4];
    static float out[16 * 64];
    for (uint32_t type = 0; type < GGML_TYPE_COUNT; type++) {
        const quant_traits *t = quant_traits_of(type);
        if (!t || !t->dot) continue;
        const quant_traits *at = quant_traits_of(t->act_type);
        kernel_dot_fn fast = kernel_dot(type);
        int64_t be = t->block_elems;
        const int64_t blocks[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 32, 33};
        int nb = (int)(sizeof blocks / sizeof blocks[0]);
        for (int li = 0; li < nb + 40; li++) {
            int64_t n;
            if (li < nb) n = blocks[li] * be;
            else if (be == 1) n = 1 + rnd(r) % 300 + (li % 5 == 0 ? 4096 : 0);
            else n = be * (1 + rnd(r) % (NMAX / be));
            if (n > NMAX) n = NMAX / be * be;
            int n_rows = 3;
            for (int row = 0; row < n_rows; row++) {
                rnd_weights(r, type, w, n, x);
                rnd_floats(r, x, n, (int)(at->block_elems > 1 ? at->block_elems : 16));
                at->quantize(x, a, n);
                float ref = t->dot(n, w, a), got = fast(n, w, a);
                CHECK_CLEAN(isa, "dot", t->name);
                n_checks++;
                CHECKF(fbits(ref) == fbits(got) || (isnan(ref) && isnan(got)),
                       "%s %s n=%lld: kernel %.9g (0x%08x) vs reference %.9g (0x%08x)",
                       kernel_isa_name(isa), t->name, (long long)n, got, fbits(got), ref, fbits(ref));
            }
        }
        /* tiles: rows x tokens (packed in two halves, as threads would) against the dots */
        const kernel_tile *tile = kernel_tile_of(type);
        if (!tile) continue;
        /* reps 8, 9 (K-quants): every quant and sub-scale at its maximum against activations
         * at -127 / +127, the integer sums at their largest (the Q4_K tile keeps 4-quad sums
         * in int16: 16 * 15 * 127 is within its range only just) */
        const bool kquant = type == GGML_TYPE_Q2_K || type == GGML_TYPE_Q3_K || type == GGML_TYPE_Q4_K ||
                            type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K;
        for (int rep = 0; rep < (kquant ? 10 : 8); rep++) {
            const bool extreme = rep >= 8;
            int64_t n = be * (1 + rnd(r) % (be >= 256 ? 12 : 40));
            /* float weights: rows of whole 16-value chunks (the F32 tile's fold of 16 sums at
             * once) up to 768 values, or with a tail */
            if (be == 1) n = 16 * (1 + (int64_t)(rnd(r) % 48)) + (rep % 2 ? (int64_t)(rnd(r) % 16) : 0);
            int rows = 1 + (int)(rnd(r) % 11), toks = 1 + (int)(rnd(r) % (rep < 4 ? 16 : 40));
            size_t ws = quant_row_bytes(type, n), as = quant_row_bytes(t->act_type, n);
            size_t pb = tile->packed_bytes(n, toks);
            if (ws * rows > sizeof w || as * toks > sizeof a || (size_t)toks * 16 > sizeof out / sizeof out[0]) continue;
            uint8_t *packed = aligned_alloc(64, (pb + 63) / 64 * 64);
            for (int i = 0; i < rows; i++) rnd_weights(r, type, w + i * ws, n, x);
            if (extreme) {
                memset(w, 0xff, ws * rows);
                const int *f = scale_fields(type);
                for (int64_t bl = 0; bl < (int64_t)rows * n / be; bl++)
                    for (int k = 0; f[k] >= 0; k++) put16(w + bl * t->block_bytes + f[k], 0x2c00); /* 1/16 */
            }
            for (int i = 0; i < toks; i++) {
                rnd_floats(r, x, n, (int)(at->block_elems > 1 ? at->block_elems : 16));
                if (extreme) /* all -1 encodes to -127; one larger +1 in a block flips the rest to +127 */
                    for (int64_t j = 0; j < n; j++) x[j] = (i & 1) && j % 256 == 0 ? 1.5f : -1.0f;
                at->quantize(x, a + i * as, n);
            }
            int mid = (toks + 15) / 16 / 2 * 16;
            tile->pack(n, a, as, toks, 0, mid, packed);
            tile->pack(n, a, as, toks, mid, toks, packed);
            CHECK_CLEAN(isa, "tile pack", t->name);
            tile->run(n, w, ws, rows, packed, toks, out, 16);
            CHECK_CLEAN(isa, "tile run", t->name);
            for (int i = 0; i < rows; i++)
                for (int k = 0; k < toks; k++) {
                    float ref = t->dot(n, w + i * ws, a + k * as), got = out[k * 16 + i];
                    n_checks++;
                    CHECKF(fbits(ref) == fbits(got), "%s %s tile n=%lld r%d t%d: %.9g vs %.9g",
                           kernel_isa_name(isa), t->name, (long long)n, i, k, got, ref);
                }
            free(packed);
        }
    }
}

/* Every tile at the token and row counts where its kernels split the work: the rows-in-lanes
 * kernels' passes of 4 tokens and groups of 8 rows (Q2_0: 16), the K-quant tiles' 16-token blocks with a
 * remainder on either kernel, and their blocks of 64 rows (kernels_avx512_krows.c); the byte
 * tiles' walks over several pairs of 16-token blocks (64 tokens and more) with one block after. */
static void check_tile_splits(rng *r, kernel_isa isa) {
    enum { KMAX = 768, RMAX = 70, TMAX = 72 };
    static float x[KMAX];
    static uint8_t w[RMAX * KMAX * 4 + 64], a[TMAX * KMAX * 4];
    static float out[TMAX * RMAX];
    const int toks_list[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 21, 23, 24, 25, 31, 33, 40, 64, 65, 72};
    const int rows_list[] = {1, 7, 8, 9, 16, 17, 70};
    for (uint32_t type = 0; type < GGML_TYPE_COUNT; type++) {
        const quant_traits *t = quant_traits_of(type);
        const kernel_tile *tile = t && t->dot ? kernel_tile_of(type) : NULL;
        if (!tile || t->block_elems == 1) continue;
        const quant_traits *at = quant_traits_of(t->act_type);
        for (size_t ti = 0; ti < sizeof toks_list / sizeof toks_list[0]; ti++)
            for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++) {
                const int toks = toks_list[ti], rows = rows_list[ri];
                const int64_t n = 256 * (1 + (int64_t)(rnd(r) % 3));
                const size_t ws = quant_row_bytes(type, n), as = quant_row_bytes(t->act_type, n);
                for (int i = 0; i < rows; i++) rnd_weights(r, type, w + i * ws, n, x);
                for (int i = 0; i < toks; i++) {
                    rnd_floats(r, x, n, (int)(at->block_elems > 1 ? at->block_elems : 16));
                    at->quantize(x, a + i * as, n);
                }
                uint8_t *packed = aligned_alloc(64, (tile->packed_bytes(n, toks) + 63) / 64 * 64);
                const int mid = (toks + 15) / 16 / 2 * 16;
                tile->pack(n, a, as, toks, 0, mid, packed);
                tile->pack(n, a, as, toks, mid, toks, packed);
                tile->run(n, w, ws, rows, packed, toks, out, (size_t)rows);
                CHECK_CLEAN(isa, "tile run", t->name);
                for (int i = 0; i < rows; i++)
                    for (int k = 0; k < toks; k++) {
                        const float ref = t->dot(n, w + i * ws, a + k * as), got = out[k * rows + i];
                        n_checks++;
                        CHECKF(fbits(ref) == fbits(got), "%s %s tile split n=%lld rows %d toks %d: r%d t%d %.9g vs %.9g",
                               kernel_isa_name(isa), t->name, (long long)n, rows, toks, i, k, got, ref);
                    }
                free(packed);
            }
    }
}

static void check_encoders(rng *r, kernel_isa isa) {
    enum { NMAX = 4096 };
    static float x[NMAX];
    static uint8_t ref[NMAX * 4], got[NMAX * 4];
    const uint32_t types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q8_1, GGML_TYPE_Q8_K, GGML_TYPE_F16,
                              GGML_TYPE_BF16, GGML_TYPE_F32};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const quant_traits *t = quant_traits_of(types[k]);
        quant_quantize_fn fast = kernel_quantize(types[k]);
        int64_t be = t->block_elems;
        for (int rep = 0; rep < 200; rep++) {
            int64_t n = be == 1 ? 1 + rnd(r) % 700 : be * (1 + rnd(r) % (NMAX / be));
            int mode = rep % 5;
            rnd_floats(r, x, n, (int)(be > 1 ? be : 32));
            if (mode == 1) {
                /* values on rounding ties of the 8-bit grids: multiples of amax/254 */
                for (int64_t i = 0; i < n; i++) x[i] = (float)((int)(rnd(r) % 255) - 127) * 0.5f;
            } else if (mode == 2) {
                /* repeated maxima of both signs */
                for (int64_t i = 0; i < n; i++) x[i] = (rnd(r) % 3 == 0) ? ((rnd(r) & 1) ? 3.0f : -3.0f) : rnd_unit(r);
            } else if (mode == 3) {
                /* half and bfloat16 ties, subnormals, overflow */
                for (int64_t i = 0; i < n; i++) {
                    uint32_t u = rnd(r);
                    if (rnd(r) % 4 == 0) u = (u & 0x8000ffffu) | (0x33u << 23) | (rnd(r) % 32 << 23);
                    float f;
                    memcpy(&f, &u, 4);
                    if (!isfinite(f) && types[k] != GGML_TYPE_F16 && types[k] != GGML_TYPE_BF16) f = 1.0f;
                    x[i] = f;
                }
                if (t->is_quantized)
                    for (int64_t i = 0; i < n; i++) x[i] = fabsf(x[i]) > 1e30f ? 1.0f : x[i];
            }
            size_t bytes = quant_row_bytes(types[k], n);
            memset(ref, 0xab, bytes);
            memset(got, 0xcd, bytes);
            t->quantize(x, ref, n);
            fast(x, got, n);
            CHECK_CLEAN(isa, "encoder", t->name);
            n_checks++;
            size_t first = bytes;
            for (size_t i = 0; i < bytes && first == bytes; i++)
                if (ref[i] != got[i]) first = i;
            CHECKF(first == bytes, "%s encoder %s n=%lld mode %d: byte %zu differs (%02x vs %02x)",
                   kernel_isa_name(isa), t->name, (long long)n, mode, first, got[first], ref[first]);
        }
    }
}

/* kernel_attn_tokens: T consecutive tokens (rows of a token padded apart, as in a batch),
 * token i against kernel_attn_ref with n_kv + i keys, bit for bit. T up to 11: the 512-bit kernel
 * takes tokens in blocks of 8, so the blocks and their remainders; tokens whose last tile is
 * partial, full or starts a new tile. */
static void check_attention_tokens(rng *r, kernel_isa isa) {
    enum { NKV = 200, HD = 256, G = 12, T = 11 };
    static float q[T * (G * HD + 16)], out[T * (G * HD + 16)], k[(NKV + T) * 2 * HD], v[(NKV + T) * 2 * HD],
        ref[G * HD], work[G * KERNEL_ATTN_TILE];
    kernel_attn_tokens_fn fn = kernel_attn_tokens();
    const int hds[] = {64, 128, 256, 48, 16};
    const int nkvs[] = {1, 16, 57, 60, 64, 120, 128, 129};
    for (int rep = 0; rep < 60; rep++) {
        int hd = hds[rep % 5], g = 1 + (int)(rnd(r) % G), tn = 1 + (int)(rnd(r) % T);
        int n_kv = rep < 40 ? nkvs[rep / 5] : 1 + (int)(rnd(r) % NKV);
        size_t ks = (size_t)(rep % 2 ? 2 * hd : hd), tok = (size_t)g * hd + (size_t)(rep % 3) * 16;
        /* every sixth case scores far below zero (positive keys, negative queries): a tile maximum
         * taken over padding lanes or a wrong starting maximum then changes the bits */
        const bool negative = rep % 6 == 5;
        for (size_t i = 0; i < (size_t)tn * tok; i++)
            q[i] = negative ? -8.0f * fabsf(rnd_unit(r)) : rnd_unit(r) * (rep % 4 == 0 ? 8.0f : 1.0f);
        for (size_t i = 0; i < (size_t)(n_kv + tn) * ks; i++) {
            k[i] = negative ? fabsf(rnd_unit(r)) : rnd_unit(r);
            v[i] = rnd_unit(r);
        }
        float scale = 1.0f / sqrtf((float)hd);
        fn(q, tok, (size_t)hd, g, tn, k, ks, v, ks, n_kv, hd, hd, scale, out, tok, (size_t)hd, work);
        CHECK_CLEAN(isa, "attention_tokens", "");
        for (int t = 0; t < tn; t++) {
            kernel_attn_ref(q + (size_t)t * tok, (size_t)hd, g, k, ks, v, ks, n_kv + t, hd, hd, scale, ref,
                            (size_t)hd, work);
            n_checks++;
            int bad = -1;
            for (int i = 0; i < g * hd && bad < 0; i++)
                if (fbits(ref[i]) != fbits(out[(size_t)t * tok + (size_t)i])) bad = i;
            CHECKF(bad < 0, "%s attention_tokens hd=%d G=%d T=%d n_kv=%d token %d: element %d differs",
                   kernel_isa_name(isa), hd, g, tn, n_kv, t, bad);
        }
    }
}

/* The attention kernel against kernel_attn_ref (bit for bit), and exp_s against expf. */
static void check_attention(rng *r, kernel_isa isa) {
    /* G up to 12: the 512-bit kernel takes heads in groups of 8 and blocks of 4 (and the rest);
     * n_kv at and around the multiples of 16 and of the tile, then at random */
    enum { NKV = 300, HD = 256, G = 12 };
    static float q[G * HD], k[NKV * 2 * HD], v[NKV * 2 * HD], ref[G * HD], got[G * HD], work[G * KERNEL_ATTN_TILE];
    kernel_attn_fn fn = kernel_attn();
    const int hds[] = {8, 16, 64, 128, 48, 256};
    const int nkvs[] = {1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129, 300};
    for (int rep = 0; rep < 108; rep++) { /* each head size with each listed n_kv, then 36 more */
        int hd = hds[rep % 6], g = 1 + (int)(rnd(r) % G);
        int n_kv = rep < 72 ? nkvs[rep / 6] : 1 + (int)(rnd(r) % NKV);
        size_t ks = (size_t)(rep % 2 ? 2 * hd : hd); /* rows of several KV heads or one */
        float mag = rep % 3 == 0 ? 8.0f : 1.0f;
        for (int i = 0; i < g * hd; i++) q[i] = rnd_unit(r) * mag;
        for (size_t i = 0; i < (size_t)n_kv * ks; i++) {
            k[i] = rnd_unit(r);
            v[i] = rnd_unit(r);
        }
        float scale = 1.0f / sqrtf((float)hd);
        kernel_attn_ref(q, (size_t)hd, g, k, ks, v, ks, n_kv, hd, hd, scale, ref, (size_t)hd, work);
        fn(q, (size_t)hd, g, k, ks, v, ks, n_kv, hd, hd, scale, got, (size_t)hd, work);
        CHECK_CLEAN(isa, "attention", hd == 8 ? "hd 8" : "hd >= 16");
        n_checks++;
        int bad = -1;
        for (int i = 0; i < g * hd && bad < 0; i++)
            if (fbits(ref[i]) != fbits(got[i])) bad = i;
        CHECKF(bad < 0, "%s attention hd=%d G=%d n_kv=%d: element %d %.9g vs %.9g", kernel_isa_name(isa), hd, g,
               n_kv, bad, bad >= 0 ? got[bad] : 0.0f, bad >= 0 ? ref[bad] : 0.0f);
    }
    check_attention_tokens(r, isa);
    double worst = 0.0;
    for (float x = -87.0f; x <= 0.0f; x += 0.001f) {
        double e = fabs((double)kernel_exp_s(x) - exp((double)x)) / exp((double)x);
        if (e > worst) worst = e;
    }
    CHECKF(worst < 3e-7, "exp_s relative error %.3g", worst);
    CHECK(kernel_exp_s(-INFINITY) == 0.0f && kernel_exp_s(0.0f) == 1.0f);
}

/* kernel_dot_f32 and the Gated DeltaNet state-row passes against their scalar definitions. */
static void check_f32_passes(rng *r, kernel_isa isa) {
    enum { N = 300 };
    static float a[N], b[N], c[N], s1[N], s2[N];
    kernel_decay_dot_fn decay = kernel_gdn_decay_dot();
    kernel_update_dot_fn update = kernel_gdn_update_dot();
    for (int rep = 0; rep < 60; rep++) {
        int n = rep < 20 ? rep : 1 + (int)(rnd(r) % N);
        for (int i = 0; i < n; i++) {
            a[i] = rnd_unit(r);
            b[i] = rnd_unit(r) * 4.0f;
            c[i] = rnd_unit(r);
            s1[i] = s2[i] = rnd_unit(r) * 2.0f;
        }
        float x = rnd_unit(r);
        n_checks += 3;
        const float df = kernel_dot_f32(n, a, b);
        CHECK_CLEAN(isa, "dot_f32", "");
        CHECKF(fbits(df) == fbits(kernel_dot_f32_ref(n, a, b)), "%s dot_f32 n=%d", kernel_isa_name(isa), n);
        float d1 = kernel_decay_dot_ref(n, s1, x, a), d2 = decay(n, s2, x, a);
        CHECK_CLEAN(isa, "gdn", "decay_dot");
        CHECKF(fbits(d1) == fbits(d2) && !memcmp(s1, s2, sizeof(float) * (size_t)n), "%s decay_dot n=%d", kernel_isa_name(isa), n);
        float u1 = kernel_update_dot_ref(n, s1, x, b, c), u2 = update(n, s2, x, b, c);
        CHECK_CLEAN(isa, "gdn", "update_dot");
        CHECKF(fbits(u1) == fbits(u2) && !memcmp(s1, s2, sizeof(float) * (size_t)n), "%s update_dot n=%d", kernel_isa_name(isa), n);
    }
    /* the four-row passes against four single-row reference passes (rows of different states,
     * different d per row, a stride wider than the row) */
    kernel_decay_dot4_fn decay4 = kernel_gdn_decay_dot4();
    kernel_update_dot4_fn update4 = kernel_gdn_update_dot4();
    if (!decay4 || !update4) return;
    enum { S4 = 136 };
    static float r1[4 * S4], r2[4 * S4];
    for (int rep = 0; rep < 40; rep++) {
        const int n = rep < 4 ? 128 : rep < 8 ? 8 * (1 + rep) : 1 + (int)(rnd(r) % 128);
        for (int i = 0; i < 4 * S4; i++) r1[i] = r2[i] = rnd_unit(r) * 2.0f;
        for (int i = 0; i < n; i++) {
            a[i] = rnd_unit(r);
            b[i] = rnd_unit(r) * 4.0f;
            c[i] = rnd_unit(r);
        }
        const float x = rnd_unit(r), d[4] = {rnd_unit(r), rnd_unit(r), -rnd_unit(r), 3.0f * rnd_unit(r)};
        float m1[4], m2[4], o1[4], o2[4];
        for (int k = 0; k < 4; k++) m1[k] = kernel_decay_dot_ref(n, r1 + k * S4, x, a);
        decay4(n, r2, S4, x, a, m2);
        for (int k = 0; k < 4; k++) o1[k] = kernel_update_dot_ref(n, r1 + k * S4, d[k], b, c);
        update4(n, r2, S4, d, b, c, o2);
        CHECK_CLEAN(isa, "gdn", "dot4");
        n_checks++;
        CHECKF(!memcmp(m1, m2, sizeof m1) && !memcmp(o1, o2, sizeof o1) && !memcmp(r1, r2, sizeof r1),
               "%s decay_dot4/update_dot4 n=%d", kernel_isa_name(isa), n);
    }
}

/* kernel_gdn_rows (8 state rows through T tokens, where a level has it) against the single-row
 * reference passes token after token, bit for bit: row lengths 8-256, 1-9 tokens, strided k, q,
 * v, beta and out as the walk in ops_ssm.c passes them, decays and betas of both kinds. */
static void check_gdn_rows(rng *r, kernel_isa isa) {
    enum { NMAX = KERNEL_GDN_ROWS_MAX_N, TMAX = 9, KS = NMAX + 8, VS = 12 };
    static float s1[8 * NMAX], s2[8 * NMAX], k[TMAX * KS], q[TMAX * KS], v[TMAX * VS], beta[TMAX * 3], decay[TMAX];
    static float o1[TMAX * VS], o2[TMAX * VS];
    const kernel_gdn_rows_fn rows = kernel_gdn_rows();
    if (!rows) return;
    for (int rep = 0; rep < 40; rep++) {
        const int n = rep < 4 ? 128 : 8 * (1 + (int)(rnd(r) % (NMAX / 8))), T = 1 + rep % TMAX;
        for (int i = 0; i < 8 * n; i++) s1[i] = s2[i] = rnd_unit(r) * 2.0f;
        for (int i = 0; i < TMAX * KS; i++) {
            k[i] = rnd_unit(r) * 0.3f;
            q[i] = rnd_unit(r) * 0.3f;
        }
        for (int i = 0; i < TMAX * VS; i++) v[i] = rnd_unit(r) * 4.0f;
        for (int t = 0; t < TMAX; t++) {
            beta[t * 3] = 0.5f + 0.5f * rnd_unit(r);
            decay[t] = 0.9f + 0.1f * rnd_unit(r);
        }
        memset(o1, 0, sizeof o1);
        memset(o2, 0, sizeof o2);
        for (int t = 0; t < T; t++)
            for (int j = 0; j < 8; j++) {
                const float m = kernel_decay_dot_ref(n, s1 + j * n, decay[t], k + t * KS);
                const float d = (v[t * VS + 2 + j] - m) * beta[t * 3];
                o1[t * VS + 2 + j] = kernel_update_dot_ref(n, s1 + j * n, d, k + t * KS, q + t * KS);
            }
        rows(n, s2, T, k, KS, q, KS, v + 2, VS, beta, 3, decay, o2 + 2, VS);
        CHECK_CLEAN(isa, "gdn", "rows");
        n_checks++;
        CHECKF(!memcmp(s1, s2, sizeof(float) * 8 * (size_t)n) && !memcmp(o1, o2, sizeof o1),
               "%s gdn_rows n=%d T=%d", kernel_isa_name(isa), n, T);
    }
}

/* The conv1d taps (kernel_conv_taps) against kernel_conv_taps_ref: runs of 0-140 channels (the
 * vector body and its scalar tail), 1-6 taps, a stride wider than the run, and products of -0
 * (a first tap of -0 x value ends as +0, as the reference's sum from 0.0f). */
static void check_conv_taps(rng *r, kernel_isa isa) {
    enum { N = 140, KMAX = 6, WS = 144 };
    static float wt[KMAX * WS], x[KMAX][N], y1[N], y2[N];
    const kernel_conv_taps_fn taps = kernel_conv_taps();
    for (int rep = 0; rep < 60; rep++) {
        const int n = rep < 20 ? rep : (int)(rnd(r) % (N + 1)), K = 1 + rep % KMAX;
        for (int i = 0; i < K * WS; i++) wt[i] = rnd_unit(r) * 2.0f;
        for (int i = 0; i < K; i++)
            for (int c = 0; c < N; c++) x[i][c] = rnd_unit(r) * 4.0f;
        if (rep % 3 == 0)
            for (int c = 0; c < N; c += 2) { /* every tap's product -0 on even channels */
                for (int i = 0; i < K; i++) {
                    wt[i * WS + c] = -0.0f;
                    x[i][c] = 1.0f;
                }
            }
        const float *src[KMAX] = {x[0], x[1], x[2], x[3], x[4], x[5]};
        memset(y1, 0xff, sizeof y1);
        memset(y2, 0xff, sizeof y2);
        kernel_conv_taps_ref(n, K, wt, WS, src, y1);
        taps(n, K, wt, WS, src, y2);
        CHECK_CLEAN(isa, "conv_taps", "");
        n_checks++;
        CHECKF(!memcmp(y1, y2, sizeof y1), "%s conv_taps n=%d K=%d", kernel_isa_name(isa), n, K);
        if (rep % 3 == 0 && n > 0) CHECKF(fbits(y2[0]) == 0, "%s conv_taps: -0 products must sum to +0", kernel_isa_name(isa));
    }
}

/* The gates with an exponential (kernel_silu_mul, kernel_sigmoid_mul, kernel_silu) against their
 * scalar definitions, bit for bit: lengths 0-70 (the vector body and its tail), values over the
 * whole float range (random bit patterns: NaN, infinities, subnormals, the special cases of
 * exp_f32 from |x| >= 88) and the usual activation range. Where the C library's expf is glibc's
 * FMA form (x86-64 with FMA, which the vector levels require), exp_f32 must also equal it: every
 * 97th float of the range and the edges of its special cases. */
static void check_gates(rng *r, kernel_isa isa) {
    enum { N = 70 };
    static float g[N], u[N], o1[N], o2[N], x1[N], x2[N];
    const kernel_silu_mul_fn silu_mul = kernel_silu_mul();
    const kernel_sigmoid_mul_fn sigmoid_mul = kernel_sigmoid_mul();
    const kernel_silu_fn silu = kernel_silu();
    for (int rep = 0; rep < 400; rep++) {
        const int n = rep < N + 1 ? rep : (int)(rnd(r) % (N + 1));
        for (int i = 0; i < N; i++) {
            if (rep % 2) {
                uint32_t b = (uint32_t)rnd(r) ^ (uint32_t)rnd(r) << 16;
                memcpy(&g[i], &b, 4);
            } else {
                g[i] = rnd_unit(r) * (rep % 4 ? 12.0f : 110.0f);
            }
            u[i] = rnd_unit(r) * 3.0f;
        }
        memcpy(x1, u, sizeof x1);
        memcpy(x2, u, sizeof x2);
        kernel_silu_mul_ref((size_t)n, g, u, o1);
        silu_mul((size_t)n, g, u, o2);
        CHECK_CLEAN(isa, "gates", "silu_mul");
        n_checks += 3;
        CHECKF(!memcmp(o1, o2, sizeof(float) * (size_t)n), "%s silu_mul n=%d", kernel_isa_name(isa), n);
        kernel_sigmoid_mul_ref((size_t)n, g, x1);
        sigmoid_mul((size_t)n, g, x2);
        CHECKF(!memcmp(x1, x2, sizeof(float) * (size_t)n), "%s sigmoid_mul n=%d", kernel_isa_name(isa), n);
        memcpy(x1, g, sizeof x1);
        memcpy(x2, g, sizeof x2);
        kernel_silu_ref((size_t)n, x1);
        silu((size_t)n, x2);
        CHECKF(!memcmp(x1, x2, sizeof(float) * (size_t)n), "%s silu n=%d", kernel_isa_name(isa), n);
    }
    if (isa != KERNEL_ISA_AVX2) return; /* once, on a processor with FMA */
    static const float edges[] = {0.0f, -0.0f, 88.0f, -88.0f, 0x1.62e42ep6f, 0x1.62e430p6f, -0x1.9fe368p6f,
                                  -0x1.9fe36ap6f, -0x1.9d1d9ep6f, -0x1.9d1da0p6f, -0x1.9d1d9cp6f, INFINITY, -INFINITY, NAN};
    long bad = 0;
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        const float a = expf(edges[i]), b = exp_f32(edges[i]);
        bad += fbits(a) != fbits(b) && !(isnan(a) && isnan(b));
    }
    for (uint64_t v = 0; v <= 0xffffffffu; v += 97) {
        float x;
        const uint32_t b32 = (uint32_t)v;
        memcpy(&x, &b32, 4);
        const float a = expf(x), b = exp_f32(x);
        bad += fbits(a) != fbits(b) && !(isnan(a) && isnan(b));
    }
    n_checks++;
    CHECKF(bad == 0, "exp_f32 differs from the C library's expf for %ld of the sampled inputs", bad);
}

/* The Q6_K_R16 tile (16 Q6_K rows interleaved, formats/quant_q6k_r16.c) against quant_dot_q6_k
 * on the rows it was made from, bit for bit: 1-9 tokens (its passes of 4), 1-3 groups, split
 * into the groups' shares as the backend splits them, and the reference product of a group. */
static void check_q6k_r16(rng *r, kernel_isa isa) {
    enum { KMAX = 768, GMAX = 3, TMAX = 9 };
    static float x[KMAX];
    static uint8_t w[GMAX * 16 * 630], g[GMAX * 16 * 630], a[TMAX * 3 * 292];
    static float out[TMAX * GMAX * 16];
    const kernel_tile *tile = kernel_tile_of(SLUICE_TYPE_Q6_K_R16);
    CHECKF(tile && tile->row_group == 16 && tile->min_toks == 1, "%s: no Q6_K_R16 tile", kernel_isa_name(isa));
    if (!tile) return;
    /* the MTP verification head is copied to this layout only where the tile is not the scalar
     * reference's: AVX-512 has its own, the other levels only the reference */
    CHECKF(kernel_tile_vectorized(SLUICE_TYPE_Q6_K_R16) == (isa == KERNEL_ISA_AVX512),
           "%s: Q6_K_R16 tile vectorized says %d", kernel_isa_name(isa), kernel_tile_vectorized(SLUICE_TYPE_Q6_K_R16));
    CHECK(!kernel_tile_vectorized(GGML_TYPE_Q4_K) || isa != KERNEL_ISA_SCALAR);
    CHECK(!kernel_tile_vectorized(QUANT_TYPE_LIMIT));
    for (int toks = 1; toks <= TMAX; toks++)
        for (int groups = 1; groups <= GMAX; groups++) {
            const int64_t n = 256 * (1 + (int64_t)(rnd(r) % 3));
            const int rows = 16 * groups;
            const size_t ws = quant_row_bytes(GGML_TYPE_Q6_K, n), as = quant_row_bytes(GGML_TYPE_Q8_K, n);
            for (int i = 0; i < rows; i++) rnd_weights(r, GGML_TYPE_Q6_K, w + i * ws, n, x);
            for (int k = 0; k < groups; k++) quant_repack_q6_k_r16(w + (size_t)k * 16 * ws, ws, g + (size_t)k * 16 * ws, n);
            for (int i = 0; i < toks; i++) {
                rnd_floats(r, x, n, 256);
                quant_traits_of(GGML_TYPE_Q8_K)->quantize(x, a + i * as, n);
            }
            uint8_t *packed = aligned_alloc(64, (tile->packed_bytes(n, toks) + 63) / 64 * 64);
            tile->pack(n, a, as, toks, 0, toks, packed);
            /* the first group alone, then the rest: a thread's share starts at a group */
            tile->run(n, g, ws, 16, packed, toks, out, (size_t)rows);
            if (groups > 1) tile->run(n, g + 16 * ws, ws, rows - 16, packed, toks, out + 16, (size_t)rows);
            CHECK_CLEAN(isa, "tile run", "Q6_K_R16");
            for (int k = 0; k < toks; k++) {
                float ref16[16];
                for (int gi = 0; gi < groups; gi++) {
                    quant_dot_q6_k_r16(n, g + (size_t)gi * 16 * ws, a + k * as, ref16);
                    for (int i = 16 * gi; i < 16 * gi + 16; i++) {
                        const float ref = quant_dot_q6_k(n, w + i * ws, a + k * as), got = out[k * rows + i];
                        n_checks += 2;
                        CHECKF(fbits(ref) == fbits(got) && fbits(ref) == fbits(ref16[i - 16 * gi]),
                               "%s Q6_K_R16 n=%lld groups %d toks %d: r%d t%d %.9g vs %.9g (group reference %.9g)",
                               kernel_isa_name(isa), (long long)n, groups, toks, i, k, got, ref, ref16[i - 16 * gi]);
                    }
                }
            }
            free(packed);
        }
}

int main(void) {
    xinuse_init();
    kernel_isa best = kernel_isa_best();
    printf("best level: %s, AMX %s, upper-state check %s\n", kernel_isa_name(best),
           kernel_amx_usable() ? "usable" : "not usable", xinuse_ok ? "on (XINUSE)" : "off");
    /* no level above the CPU's (or SLUICE_ISA's) registered: its code would be a SIGILL there */
    CHECK(kernel_isa_registered() == best);
    for (int l = 0; l <= (int)best; l++) {
        kernel_isa isa = kernel_isa_force((kernel_isa)l);
        CHECK(isa == (kernel_isa)l);
        rng r = {0x5eed0000u + (uint64_t)l};
        long before = n_checks;
        check_encoders(&r, isa);
        check_dots(&r, isa);
        check_tile_splits(&r, isa);
        check_q6k_r16(&r, isa);
        check_attention(&r, isa);
        check_f32_passes(&r, isa);
        check_conv_taps(&r, isa);
        check_gates(&r, isa);
        check_gdn_rows(&r, isa);
        printf("%s: %ld comparisons\n", kernel_isa_name(isa), n_checks - before);
        if (isa == KERNEL_ISA_AVX512 && kernel_amx_usable()) {
            /* the AMX tiles above; now their VNNI walk on the same packed activations */
            before = n_checks;
            kernel_amx_set(false);
            check_dots(&r, isa);
            check_tile_splits(&r, isa);
            kernel_amx_set(true);
            printf("%s, the AMX tiles' VNNI walk: %ld comparisons\n", kernel_isa_name(isa), n_checks - before);
        }
    }
    kernel_isa_force(best);
    if (!check_failures) printf("test_kernels: all checks passed\n");
    CHECK_DONE();
}
