/* MLX affine quantization codec (formats/quant_mlx.c), every variant:
 *   traits and ids; bit packing against an independent bit-by-bit packer (both directions);
 *   dequantization against a double-precision reference; the MLX quantizer's properties and
 *   error; dot products against a double reference and, bit for bit, against the documented
 *   accumulation order; GGUF files carrying the types. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "formats/quant.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double unif(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static double gauss(void) {
    double u = unif() + 1e-300, v = unif();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static const int all_bits[] = {2, 3, 4, 5, 6, 8};
static const int all_groups[] = {32, 64, 128};

/* bit i of the stream is bit i%8 of byte i/8; code k at bits k*b .. k*b+b-1 */
static void ref_pack(const unsigned *codes, int n, int b, uint8_t *out) {
    memset(out, 0, (size_t)n * b / 8);
    for (int k = 0; k < n; k++)
        for (int j = 0; j < b; j++)
            if (codes[k] >> j & 1u) out[(k * b + j) / 8] |= (uint8_t)(1u << ((k * b + j) % 8));
}

static uint16_t to_half(float v, bool bf16) { return bf16 ? quant_f32_to_bf16(v) : quant_f32_to_f16(v); }
static double from_half(uint16_t h, bool bf16) {
    return bf16 ? (double)quant_bf16_to_f32(h) : (double)quant_f16_to_f32(h);
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static void test_traits(void) {
    int n = 0;
    for (int bf = 0; bf < 2; bf++)
        for (size_t bi = 0; bi < 6; bi++)
            for (size_t gi = 0; gi < 3; gi++) {
                int b = all_bits[bi], g = all_groups[gi];
                int id = quant_mlx_type(b, g, bf);
                CHECKF(id == 100 + 18 * bf + 3 * (int)bi + (int)gi, "bits %d group %d", b, g);
                const quant_traits *t = quant_traits_of((uint32_t)id);
                CHECK(t != NULL);
                if (!t) continue;
                char name[32];
                snprintf(name, sizeof name, "MLX%d_G%d%s", b, g, bf ? "_BF16" : "");
                CHECKF(strcmp(t->name, name) == 0, "%s vs %s", t->name, name);
                CHECK(t->block_elems == (uint32_t)g && t->block_bytes == (uint32_t)(4 + g * b / 8));
                CHECK(t->is_quantized && t->act_type == GGML_TYPE_Q8_0);
                CHECK(quant_has_codec((uint32_t)id));
                CHECK(quant_type_from_name(name) == id);
                for (char *c = name; *c; c++) *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
                CHECK(quant_type_from_name(name) == id);
                CHECK(strcmp(quant_type_name((uint32_t)id), t->name) == 0);
                CHECK(quant_row_bytes((uint32_t)id, 4 * g) == (size_t)4 * (4 + g * b / 8));
                CHECK(quant_row_bytes((uint32_t)id, g + 8) == 0);
                int pb, pg;
                bool pbf;
                CHECK(quant_mlx_params((uint32_t)id, &pb, &pg, &pbf) && pb == b && pg == g &&
                      pbf == (bf != 0));
                n++;
            }
    CHECK(n == 36);
    CHECK(quant_mlx_type(7, 64, false) == -1 && quant_mlx_type(4, 16, false) == -1);
    CHECK(!quant_mlx_params(GGML_TYPE_Q4_K, NULL, NULL, NULL));
    CHECK(quant_traits_of(99) == NULL && quant_traits_of(137) == NULL);
    CHECK(QUANT_MLX_LIMIT == 136 && QUANT_TYPE_LIMIT == 137); /* and sluice's Q6_K_R16 */
}

/* Unpack: hand-packed blocks with scale 1, bias 0 decode to the codes themselves; scale 2, bias
 * -3 to 2q-3. Pack: integer data 0..2^b-1 quantizes (MLX rule: the larger-magnitude extreme is
 * the edge) to scale -1, bias 2^b-1 and codes 2^b-1-x, which must equal the reference packing. */
static void test_packing(void) {
    for (int bf = 0; bf < 2; bf++)
        for (size_t bi = 0; bi < 6; bi++)
            for (size_t gi = 0; gi < 3; gi++) {
                const int b = all_bits[bi], g = all_groups[gi], top = (1 << b) - 1;
                const uint32_t id = (uint32_t)quant_mlx_type(b, g, bf);
                const quant_traits *t = quant_traits_of(id);
                uint8_t blk[4 + 128], ref[128];
                unsigned codes[128];
                float out[128], x[128];
                for (int rep = 0; rep < 20; rep++) {
                    for (int k = 0; k < g; k++) codes[k] = (unsigned)(rnd() % (uint64_t)(top + 1));
                    if (rep == 0)
                        for (int k = 0; k < g; k++) codes[k] = (unsigned)top;
                    put16(blk, to_half(1.0f, bf));
                    put16(blk + 2, to_half(0.0f, bf));
                    ref_pack(codes, g, b, blk + 4);
                    t->dequantize(blk, out, g);
                    bool ok = true;
                    for (int k = 0; k < g; k++) ok &= out[k] == (float)codes[k];
                    CHECKF(ok, "%s unpack", t->name);
                    put16(blk, to_half(2.0f, bf));
                    put16(blk + 2, to_half(-3.0f, bf));
                    t->dequantize(blk, out, g);
                    for (int k = 0; k < g; k++) ok &= out[k] == 2.0f * (float)codes[k] - 3.0f;
                    CHECKF(ok, "%s affine", t->name);

                    /* pack: data spanning exactly 0..top */
                    for (int k = 0; k < g; k++) x[k] = (float)codes[k];
                    const int lo = (int)(rnd() % (uint64_t)g);
                    x[lo] = 0.0f;
                    x[(lo + 1 + (int)(rnd() % (uint64_t)(g - 1))) % g] = (float)top;
                    t->quantize(x, blk, g);
                    unsigned want[128];
                    for (int k = 0; k < g; k++) want[k] = (unsigned)(top - (int)x[k]);
                    ref_pack(want, g, b, ref);
                    CHECKF(from_half(get16(blk), bf) == -1.0 && from_half(get16(blk + 2), bf) == top,
                           "%s pack scale/bias", t->name);
                    CHECKF(memcmp(blk + 4, ref, (size_t)g * b / 8) == 0, "%s pack codes", t->name);
                    t->dequantize(blk, out, g);
                    ok = true;
                    for (int k = 0; k < g; k++) ok &= out[k] == x[k];
                    CHECKF(ok, "%s round trip", t->name);
                }
            }
}

/* Random bytes with finite scales: every element within 1 float ulp of the double reference. */
static void test_dequantize_random(void) {
    for (uint32_t id = SLUICE_TYPE_FIRST; id < QUANT_MLX_LIMIT; id++) {
        int b, g;
        bool bf;
        quant_mlx_params(id, &b, &g, &bf);
        const quant_traits *t = quant_traits_of(id);
        const int nb = 16;
        uint8_t *row = malloc((size_t)nb * t->block_bytes);
        float *out = malloc((size_t)nb * g * sizeof *out);
        for (size_t i = 0; i < (size_t)nb * t->block_bytes; i++) row[i] = (uint8_t)rnd();
        for (int k = 0; k < nb; k++) {
            put16(row + (size_t)k * t->block_bytes, to_half((float)(gauss() * 0.05), bf));
            put16(row + (size_t)k * t->block_bytes + 2, to_half((float)(gauss() * 0.3), bf));
        }
        t->dequantize(row, out, (int64_t)nb * g);
        int bad = 0;
        for (int k = 0; k < nb; k++) {
            const uint8_t *blk = row + (size_t)k * t->block_bytes;
            double s = from_half(get16(blk), bf), m = from_half(get16(blk + 2), bf);
            for (int e = 0; e < g; e++) {
                unsigned q = 0; /* bit by bit from the stream */
                for (int j = 0; j < b; j++) {
                    int bit = e * b + j;
                    q |= (unsigned)(blk[4 + bit / 8] >> (bit % 8) & 1) << j;
                }
                double want = s * q + m, got = out[(size_t)k * g + e];
                if (fabs(got - want) > fabs(want) * 0x1p-23 + 1e-30) bad++;
            }
        }
        CHECKF(bad == 0, "%s: %d elements off", t->name, bad);
        free(row);
        free(out);
    }
}

/* The quantizer on gaussian rows: relative rms error within a bound per bit width (measured
 * values are printed). Error bound per element: MLX's rule makes edge/scale an integer q0
 * (|edge| >= range/2, so |q0| >= (2^b-1)/2), which can shrink the grid's span short of the
 * range by at most range/2^b; with half a step of rounding that is at most 1.5 plain steps
 * (range/(2^b-1)), plus what rounding the stored scale and bias moves the grid (relative 2^-11
 * for f16, 2^-8 for bf16, over 2^b - 1 steps and the bias). Constant and zero groups exact. */
static void test_quantize(void) {
    /* relative rms error of a uniform grid over a group's range is about
     * range/(2^b-1)/sqrt(12)/sigma; the range of 32..128 gaussians is ~4.5-5.5 sigma */
    /* measured with g128 (the coarsest): .429 .204 .100 .048 .0235 .0059; bounds ~15% above */
    static const double bound[9] = {0, 0, 0.50, 0.235, 0.115, 0.055, 0.027, 0, 0.0068};
    const int n = 8192;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    uint8_t *q = malloc((size_t)n * 2);
    for (uint32_t id = SLUICE_TYPE_FIRST; id < QUANT_MLX_LIMIT; id++) {
        int b, g;
        bool bf;
        quant_mlx_params(id, &b, &g, &bf);
        const quant_traits *t = quant_traits_of(id);
        for (int i = 0; i < n; i++) x[i] = (float)gauss();
        t->quantize(x, q, n);
        t->dequantize(q, y, n);
        double e2 = 0, x2 = 0;
        int far = 0;
        for (int k = 0; k < n / g; k++) {
            const uint8_t *blk = q + (size_t)k * t->block_bytes;
            double step = fabs(from_half(get16(blk), bf)), bias = fabs(from_half(get16(blk + 2), bf));
            double rel = bf ? 0x1p-8 : 0x1p-11, lo = x[k * g], hi = x[k * g];
            for (int e = 1; e < g; e++) {
                if (x[k * g + e] < lo) lo = x[k * g + e];
                if (x[k * g + e] > hi) hi = x[k * g + e];
            }
            double plain = (hi - lo) / ((1 << b) - 1);
            double allowed = 1.5 * plain * (1 + 1e-6) + (((1 << b) - 1) * step + bias) * rel;
            for (int e = 0; e < g; e++) {
                int i = k * g + e;
                e2 += (double)(x[i] - y[i]) * (x[i] - y[i]);
                x2 += (double)x[i] * x[i];
                if (fabs((double)x[i] - y[i]) > allowed) far++;
            }
        }
        double rel = sqrt(e2 / x2);
        if (g == 64) printf("  %-14s rel rms error %.4f\n", t->name, rel);
        CHECKF(rel < bound[b], "%s rel rms %.4f", t->name, rel);
        CHECKF(far == 0, "%s: %d values off by more than the bound", t->name, far);
        /* a constant group and a zero group decode exactly (constant to the half's precision) */
        for (int e = 0; e < g; e++) x[e] = 0.25f, x[g + e] = 0.0f;
        t->quantize(x, q, 2 * g);
        t->dequantize(q, y, 2 * g);
        bool ok = true;
        for (int e = 0; e < g; e++) ok &= fabsf(y[e] - 0.25f) < 1e-6f && y[g + e] == 0.0f;
        CHECKF(ok, "%s constant groups", t->name);
    }
    free(x);
    free(y);
    free(q);
}

/* Dots: random valid weight rows and Q8_0-encoded gaussian activations, n = 2048. Against the
 * double sum of decoded products within 1e-5 * sum|w*a| (the integer sums are exact; the float
 * steps are two products per 32 values plus a running sum over <= 64 terms), and bit for bit
 * against the documented order. */
static void test_dot(void) {
    const int n = 2048;
    float *x = malloc(n * sizeof *x), *w = malloc(n * sizeof *w), *ad = malloc(n * sizeof *ad);
    uint8_t *act = malloc((size_t)n / 32 * 34), *wq = malloc((size_t)n * 2);
    const quant_traits *q8 = quant_traits_of(GGML_TYPE_Q8_0);
    for (uint32_t id = SLUICE_TYPE_FIRST; id < QUANT_MLX_LIMIT; id++) {
        int b, g;
        bool bf;
        quant_mlx_params(id, &b, &g, &bf);
        const quant_traits *t = quant_traits_of(id);
        for (int rep = 0; rep < 4; rep++) {
            for (int i = 0; i < n; i++) w[i] = (float)(gauss() * 0.05 + (rep == 3 ? 0.02 : 0));
            for (int i = 0; i < n; i++) x[i] = (float)gauss();
            t->quantize(w, wq, n);
            if (rep == 2) /* random code bytes too */
                for (int k = 0; k < n / g; k++)
                    for (int j = 4; j < (int)t->block_bytes; j++) wq[(size_t)k * t->block_bytes + j] = (uint8_t)rnd();
            q8->quantize(x, act, n);
            t->dequantize(wq, w, n);
            q8->dequantize(act, ad, n);
            double want = 0, mag = 0;
            for (int i = 0; i < n; i++) {
                want += (double)w[i] * ad[i];
                mag += fabs((double)w[i] * ad[i]);
            }
            float got = t->dot(n, wq, act);
            CHECKF(fabs(got - want) <= 1e-5 * mag, "%s dot %.9g vs %.9g", t->name, got, want);
            /* the documented order, recomputed here */
            float sumf = 0.0f;
            for (int k = 0; k < n / g; k++) {
                const uint8_t *blk = wq + (size_t)k * t->block_bytes;
                float s = (float)from_half(get16(blk), bf), m = (float)from_half(get16(blk + 2), bf);
                for (int j = 0; j < g / 32; j++) {
                    const uint8_t *a = act + (size_t)(k * g / 32 + j) * 34;
                    float da = quant_f16_to_f32(get16(a));
                    int32_t isum = 0, asum = 0;
                    for (int e = 0; e < 32; e++) {
                        int idx = j * 32 + e;
                        unsigned qv = 0;
                        for (int bit = 0; bit < b; bit++) {
                            int p = idx * b + bit;
                            qv |= (unsigned)(blk[4 + p / 8] >> (p % 8) & 1) << bit;
                        }
                        isum += (int32_t)qv * (int8_t)a[2 + e];
                        asum += (int8_t)a[2 + e];
                    }
                    sumf += (s * da) * (float)isum + (m * da) * (float)asum;
                }
            }
            CHECKF(memcmp(&sumf, &got, sizeof got) == 0, "%s dot order %.9g vs %.9g", t->name,
                   got, sumf);
        }
    }
    free(x);
    free(w);
    free(ad);
    free(act);
    free(wq);
}

/* A GGUF with MLX tensors passes the reader's validation (type ids through quant_traits_of)
 * and reports the right sizes; a row of it decodes as written. */
static void test_gguf(void) {
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", "test");
    float src[2 * 256];
    for (int i = 0; i < 512; i++) src[i] = (float)gauss();
    uint8_t q4[2 * 4 * 36], q3[2 * 2 * 52];
    const uint32_t t4 = (uint32_t)quant_mlx_type(4, 64, false), t3 = (uint32_t)quant_mlx_type(3, 128, true);
    quant_traits_of(t4)->quantize(src, q4, 512);
    quant_traits_of(t3)->quantize(src, q3, 512);
    const int64_t ne[2] = {256, 2};
    CHECK(gguf_w_tensor(w, "a.weight", t4, 2, ne, q4) == 0);
    CHECK(gguf_w_tensor(w, "b.weight", t3, 2, ne, q3) == 1);
    uint8_t *buf;
    size_t len;
    CHECK(gguf_writer_to_memory(w, &buf, &len) == 0);
    gguf_writer_free(w);
    char err[256];
    gguf_file *f = gguf_open_memory(buf, len, err, sizeof err);
    CHECKF(f != NULL, "%s", err);
    if (f) {
        const gguf_tensor *a = gguf_find_tensor(f, "a.weight"), *b = gguf_find_tensor(f, "b.weight");
        CHECK(a && a->type == t4 && a->nbytes == sizeof q4 && memcmp(a->data, q4, sizeof q4) == 0);
        CHECK(b && b->type == t3 && b->nbytes == sizeof q3);
        gguf_close(f);
    }
    /* an undefined private id is still refused */
    w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", "test");
    uint8_t junk[64] = {0};
    const int64_t ne1[1] = {16};
    gguf_w_tensor(w, "c.weight", GGML_TYPE_F32, 1, ne1, junk);
    uint8_t *buf2;
    size_t len2;
    CHECK(gguf_writer_to_memory(w, &buf2, &len2) == 0);
    gguf_writer_free(w);
    /* patch the tensor type (the u32 after the dims) to 140 */
    uint8_t *hit = NULL;
    for (size_t i = 0; i + 8 < len2; i++)
        if (memcmp(buf2 + i, "c.weight", 8) == 0) hit = buf2 + i + 8 + 4 + 8;
    CHECK(hit != NULL);
    if (hit) {
        uint32_t bad = 140;
        memcpy(hit, &bad, 4);
        f = gguf_open_memory(buf2, len2, err, sizeof err);
        CHECK(f == NULL && strstr(err, "unknown ggml type 140"));
        if (f) gguf_close(f);
    }
    free(buf);
    free(buf2);
}

int main(void) {
    test_traits();
    test_packing();
    test_dequantize_random();
    test_quantize();
    test_dot();
    test_gguf();
    CHECK_DONE();
}
