/* Synthetic tensor data: valid random blocks, generated piece by piece.
 *
 * A quantized block is random bits with its f16 scale fields overwritten: every bit pattern of
 * the quant fields decodes to something valid, so only the scales need care. Each type's scale
 * is calibrated once (random blocks at scale 1, decoded with sluice's own codec) so that the
 * decoded values have the tensor's target standard deviation; types with a minimum get one
 * that centres the values on zero. Each block's scale is jittered by +-25% so blocks differ.
 *
 * Determinism: a piece's random stream is seeded from (seed, tensor index, piece index) only, so
 * the bytes do not depend on which thread generates which piece. Hosts are little-endian (x86,
 * arm64), like the GGUF format; values are stored with memcpy. */
#include <math.h>
#include <string.h>

#include "formats/quant.h"
#include "tools/synth_internal.h"

typedef struct rng {
    uint64_t s;
} rng;

static inline uint64_t rng_next(rng *r) {
    r->s += 0x9E3779B97F4A7C15ull;
    uint64_t x = r->s;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* uniform in [0, 1) */
static inline float rng_unit(rng *r) { return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f); }

/* uniform with standard deviation s (half-width s*sqrt(3)) */
static inline float rng_sym(rng *r, float s) { return (2.0f * rng_unit(r) - 1.0f) * s * 1.7320508f; }

static void fill_random(rng *r, uint8_t *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = rng_next(r);
        memcpy(p + i, &v, 8);
    }
    if (i < n) {
        uint64_t v = rng_next(r);
        memcpy(p + i, &v, n - i);
    }
}

/* Where a type keeps its scales. m_kind 1: y = d*q - dmin*m (K-quants; dmin = ratio*d centres
 * the values); 2: y = d*q + m (Q4_1/Q5_1; m = -ratio*d). ratio = mean(q-part)/mean(m-part) for
 * uniformly random fields. */
typedef struct qfix {
    int d_off, m_off, m_kind;
    float ratio;
} qfix;

static bool qfix_of(uint32_t t, qfix *f) {
    *f = (qfix){0, 0, 0, 0.0f};
    switch (t) {
    case GGML_TYPE_Q2_0: /* d first, like Q4_0 */
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: case GGML_TYPE_IQ2_XXS:
    case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S: case GGML_TYPE_IQ3_XXS: case GGML_TYPE_IQ3_S:
    case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS: return true;
    case GGML_TYPE_Q4_1: *f = (qfix){0, 2, 2, 7.5f}; return true;
    case GGML_TYPE_Q5_1: *f = (qfix){0, 2, 2, 15.5f}; return true;
    case GGML_TYPE_Q2_K: *f = (qfix){80, 82, 1, 1.5f}; return true;
    case GGML_TYPE_Q3_K: f->d_off = 108; return true;
    case GGML_TYPE_Q4_K: *f = (qfix){0, 2, 1, 7.5f}; return true;
    case GGML_TYPE_Q5_K: *f = (qfix){0, 2, 1, 15.5f}; return true;
    case GGML_TYPE_Q6_K: f->d_off = 208; return true;
    default: return false;
    }
}

static inline void put_f16(uint8_t *p, float v) {
    uint16_t h = quant_f32_to_f16(v);
    memcpy(p, &h, 2);
}

static void set_scales(const qfix *f, uint8_t *blk, float d) {
    put_f16(blk + f->d_off, d);
    if (f->m_kind == 1) put_f16(blk + f->m_off, f->ratio * d);
    else if (f->m_kind == 2) put_f16(blk + f->m_off, -f->ratio * d);
}

/* decoded rms of random blocks at d = 1, per type (0: not calibrated) */
static float unit_rms[GGML_TYPE_COUNT];
/* Random codes of some types decode to an off-centre set that no field of the block centres
 * (Q2_0: d * {-1, 0, 1, 2}, mean d / 2; no sub-block scale whose random sign would mirror it).
 * A matrix of such blocks carries a mean: a rank-one part that maps every input onto one
 * direction. In qwen4exp (hyper-connections, no norm before its writes) that part made the
 * residual grow ~10^4-fold over 8 layers and every token route to the same experts in every
 * layer. Trained weights are centred, so for such a type (calibration: |mean| above
 * MIRROR_MEAN of the spread) d's sign is random per block; a negative d mirrors the set.
 * Measured: Q2_0 0.46, Q4_0 0.11, IQ4_NL 0.086 are mirrored; Q5_0 0.056 and every other type
 * (0.016 at most: sub-block scales with random signs) are not, so files of those types keep
 * their bytes. */
static bool mirror_of[GGML_TYPE_COUNT];
#define MIRROR_MEAN 0.06

bool synth_gen_supports(uint32_t type) {
    qfix f;
    if (type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) return true;
    return qfix_of(type, &f) && quant_has_codec(type);
}

int synth_gen_calibrate(uint32_t type) {
    if (type >= GGML_TYPE_COUNT || unit_rms[type] > 0) return 0;
    const quant_traits *qt = quant_traits_of(type);
    qfix f;
    if (!qt->is_quantized) {
        unit_rms[type] = 1.0f;
        return 0;
    }
    if (!qfix_of(type, &f) || !qt->dequantize) return -1;
    enum { N_BLOCKS = 512 };
    static uint8_t buf[N_BLOCKS * 292];
    static float vals[N_BLOCKS * QK_K];
    rng r = {0x5EEDu + type};
    for (int b = 0; b < N_BLOCKS; b++) {
        uint8_t *blk = buf + (size_t)b * qt->block_bytes;
        fill_random(&r, blk, qt->block_bytes);
        set_scales(&f, blk, 1.0f);
    }
    const int64_t n = (int64_t)N_BLOCKS * qt->block_elems;
    qt->dequantize(buf, vals, n);
    double s2 = 0, s1 = 0;
    for (int64_t i = 0; i < n; i++) {
        s1 += vals[i];
        s2 += (double)vals[i] * vals[i];
    }
    const double mean = s1 / (double)n, var = s2 / (double)n - mean * mean;
    mirror_of[type] = var > 0 && fabs(mean) > MIRROR_MEAN * sqrt(var);
    /* mirrored, the values are +-v with equal odds: their rms is that of v */
    unit_rms[type] = (float)sqrt(mirror_of[type] || !(var > 0) ? s2 / (double)n : var);
    return unit_rms[type] > 0 ? 0 : -1;
}

/* ---- element values ------------------------------------------------------------------------ */

/* The embedding row of token `tok`, element c. */
static float embd_value(const synth_gen_ctx *g, int64_t tok, int64_t c, rng *r) {
    if (c == 0) return g->emb_bias;
    if (c <= SYNTH_TOPICS) return (c - 1) == tok % SYNTH_TOPICS ? g->emb_topic : 0.0f;
    return rng_sym(r, 1.0f);
}

/* Router logit bias that makes expert popularity Zipf-like: an expert of popularity rank k gets
 * -skew*ln(1+k) from the constant channel, plus TOPIC_BOOST*skew from its topic's channel when
 * the token belongs to that topic. Read off after RMSNorm, so divided by the channel's size. */
#define TOPIC_BOOST 1.5f

static float router_value(const synth_gen_ctx *g, const synth_tensor *t, int64_t e, int64_t c,
                          rng *r) {
    const int n_expert = g->p->n_expert;
    if (c < SYNTH_PROTECTED) {
        if (!(g->skew > 0)) return 0.0f;
        const int32_t *rank = g->rank + (size_t)t->layer * n_expert;
        const int32_t *home = g->home + (size_t)t->layer * n_expert;
        if (c == 0) return -g->skew * logf(1.0f + (float)rank[e]) / g->x_bias;
        return home[e] == c - 1 ? TOPIC_BOOST * g->skew / g->x_topic : 0.0f;
    }
    return rng_sym(r, t->std);
}

static float elem_value(const synth_gen_ctx *g, const synth_tensor *t, int64_t row, int64_t c,
                        rng *r) {
    switch (t->role) {
    case ROLE_WEIGHT: case ROLE_OUTPUT: return rng_sym(r, t->std);
    case ROLE_RESID: return row % t->ne[1] < SYNTH_PROTECTED ? 0.0f : rng_sym(r, t->std);
    case ROLE_EMBD: return embd_value(g, row, c, r);
    case ROLE_NORM:
        if (t->ne[0] == g->p->n_embd && c < SYNTH_PROTECTED) return 1.0f;
        return 1.0f + 0.02f * (2.0f * rng_unit(r) - 1.0f);
    case ROLE_SSM_A: return -(0.1f + 0.9f * rng_unit(r));
    case ROLE_SSM_DT: return -3.0f + 2.0f * rng_unit(r);
    case ROLE_CONV: return rng_sym(r, 0.5f);
    case ROLE_ROUTER: return router_value(g, t, row % t->ne[1], c, r);
    }
    return 0.0f;
}

/* ---- pieces -------------------------------------------------------------------------------- */

void synth_gen_piece(const synth_gen_ctx *g, const synth_tensor *t, int ti, uint64_t piece,
                     uint8_t *out) {
    rng r = {synth_mix64(g->seed ^ synth_mix64(((uint64_t)ti << 40) ^ piece))};
    const quant_traits *qt = quant_traits_of(t->type);
    const uint64_t b0 = piece * t->blocks_per_piece;
    uint64_t nb = t->n_blocks - b0;
    if (nb > t->blocks_per_piece) nb = t->blocks_per_piece;
    const int64_t ne0 = t->ne[0], be = qt->block_elems;

    if (!qt->is_quantized) {
        for (uint64_t i = 0; i < nb; i++) {
            const uint64_t el = b0 + i;
            float v = elem_value(g, t, (int64_t)(el / (uint64_t)ne0), (int64_t)(el % (uint64_t)ne0),
                                 &r);
            if (t->type == GGML_TYPE_F32) {
                memcpy(out + 4 * i, &v, 4);
            } else {
                uint16_t h = t->type == GGML_TYPE_F16 ? quant_f32_to_f16(v) : quant_f32_to_bf16(v);
                memcpy(out + 2 * i, &h, 2);
            }
        }
        return;
    }

    qfix f;
    qfix_of(t->type, &f);
    const size_t bb = qt->block_bytes;
    fill_random(&r, out, nb * bb);
    const float d_base = t->std / unit_rms[t->type];
    float vals[QK_K];
    for (uint64_t i = 0; i < nb; i++) {
        uint8_t *blk = out + i * bb;
        const uint64_t el = (b0 + i) * (uint64_t)be;
        const int64_t row = (int64_t)(el / (uint64_t)ne0), col = (int64_t)(el % (uint64_t)ne0);
        if (t->role == ROLE_RESID && row % t->ne[1] < SYNTH_PROTECTED) {
            set_scales(&f, blk, 0.0f); /* all-zero row: the protected channels stay untouched */
            continue;
        }
        if (t->role == ROLE_EMBD && col == 0) {
            /* the block holding the bias and topic channels is quantized from exact values */
            for (int64_t c = 0; c < be; c++) vals[c] = embd_value(g, row, c, &r);
            qt->quantize(vals, blk, be);
            continue;
        }
        const float d = d_base * (0.75f + 0.5f * rng_unit(&r));
        set_scales(&f, blk, mirror_of[t->type] && (rng_next(&r) & 1) ? -d : d);
    }
}
