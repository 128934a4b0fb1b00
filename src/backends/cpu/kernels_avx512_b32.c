/* Products of the 32-value block types (Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4 with Q8_0 activations;
 * Q4_1, Q5_1 with Q8_1) with 512-bit VNNI, eight weight rows at a time (one token, a few, and
 * prefill).
 *
 * Why: these types had no tile, so a product of n tokens ran the one-row dot n times, each with
 * a horizontal sum per 32-value block: for Q8_0, 2 tokens cost twice one token (bench_kernels
 * --toks 2: 66 GOP/s against 306 for Q2_0) and prefill ran at ~95 GOP/s, which made such
 * models' prefill and a speculative step's 2-4 token verification compute-bound; the 4/5-bit
 * types' one-token dots were compute-bound too. Here the activations are packed once per
 * product and eight rows share one reduction tree, the layout of the Q2_0 tile
 * (kernels_avx512_q2_0.c): rows in vector lanes, a few tokens per pass over a row group.
 *
 * Exactness (the references are quant_dot_* in formats/quant_legacy.c): each block's weights
 * are decoded to their values v (Q8_0 as stored, Q4_0 nibble - 8, Q5_0 5-bit - 16, IQ4_NL and
 * MXFP4 through their 16-entry code books, Q4_1 / Q5_1 the unsigned 4 / 5-bit codes). Signed
 * values enter vpdpbusd as the unsigned bytes v + 128, so the exact integer sum of v * a is
 * vpdpbusd's sum((v + 128) * a) minus 128 * sum(a); unsigned ones enter as they are. Then per
 * row sum = sum + prod with prod the reference's products in its order (Q4_0: (isum * dw) * da;
 * Q4_1 / Q5_1: (dw * da) * isum + mw * sa; the others: isum * (dw * da), operands commuted at
 * most), every float step one IEEE single operation, a row's blocks one after the other in its
 * lane. Compiled with the AVX-512 level's flags (CMakeLists.txt); registered by
 * kernels_register_avx512. */
#if defined(__x86_64__)

#include "backends/cpu/kernels_x86_common.h" /* first: contraction off, the helpers */

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_avx512_rows8.h"

#include "formats/quant.h"

#define Q8_BLOCK_BYTES 34 /* the activation's blocks (and Q8_0's): d:f16 | 32 int8 */
#define B32_TOKS 4         /* tokens per pass over a row group */

/* The weight types: block bytes, where the values start, how they decode. */
enum { B32_Q8_0, B32_Q4_0, B32_Q5_0, B32_IQ4_NL, B32_MXFP4, B32_Q4_1, B32_Q5_1 };
static const int b32_block_bytes[] = {34, 18, 22, 18, 17, 20, 24};
/* Q4_1 and Q5_1 are affine (d, min m) with Q8_1 activations (d, s = d * sum of the values) */
#define B32_AFFINE(kind) ((kind) == B32_Q4_1 || (kind) == B32_Q5_1)

/* Blocks b and b + 1 (`two`; else zeros) of a row as v + 128: bytes 0-31 block b's values 0-31,
 * 32-63 block b + 1's. lut: the code book + 128 in each 128-bit lane (IQ4_NL, MXFP4). */
static inline __attribute__((always_inline)) __m512i b32_values(const int kind, const uint8_t *blk, bool two,
                                                                __m512i lut) {
    const int bb = b32_block_bytes[kind];
    if (kind == B32_Q8_0) {
        const __m256i lo = _mm256_loadu_si256((const __m256i *)(blk + 2));
        const __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(blk + bb + 2)) : _mm256_setzero_si256();
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    }
    /* 16 code bytes a block: low nibbles are values 0-15, high nibbles 16-31 */
    const int qs = kind == B32_Q5_0 ? 6 : kind == B32_MXFP4 ? 1 : kind == B32_Q4_1 ? 4 : kind == B32_Q5_1 ? 8 : 2;
    const __m128i q0 = _mm_loadu_si128((const __m128i *)(blk + qs));
    const __m128i q1 = two ? _mm_loadu_si128((const __m128i *)(blk + bb + qs)) : _mm_setzero_si128();
    __m512i v = _mm512_castsi128_si512(q0);
    v = _mm512_inserti32x4(v, q0, 1);
    v = _mm512_inserti32x4(v, q1, 2);
    v = _mm512_inserti32x4(v, q1, 3);
    const __m512i shifts = _mm512_setr_epi32(0, 0, 0, 0, 0x00040004, 0x00040004, 0x00040004, 0x00040004, 0, 0, 0,
                                             0, 0x00040004, 0x00040004, 0x00040004, 0x00040004);
    const __m512i nib = _mm512_and_si512(_mm512_srlv_epi16(v, shifts), _mm512_set1_epi8(0x0f));
    if (kind == B32_Q4_0) return _mm512_add_epi8(nib, _mm512_set1_epi8(120)); /* nibble - 8 + 128 */
    if (kind == B32_Q4_1) return nib;                                          /* unsigned as stored */
    if (kind == B32_Q5_0 || kind == B32_Q5_1) { /* the fifth bits: bit j of block b's qh is value j's */
        const int qh = kind == B32_Q5_0 ? 2 : 4;
        uint32_t h0, h1 = 0;
        memcpy(&h0, blk + qh, 4);
        if (two) memcpy(&h1, blk + bb + qh, 4);
        const __mmask64 hb = (__mmask64)h0 | (__mmask64)h1 << 32;
        const __m512i v5 = _mm512_mask_add_epi8(nib, hb, nib, _mm512_set1_epi8(16));
        return kind == B32_Q5_1 ? v5 : _mm512_add_epi8(v5, _mm512_set1_epi8(112)); /* Q5_0: - 16 + 128 */
    }
    return _mm512_shuffle_epi8(lut, nib); /* IQ4_NL, MXFP4 */
}

/* The scale of the block at each dword's offset (raw: the dword there) as a float: f16 d, or
 * MXFP4's 2^(e - 128) (e8m0_half in formats/quant_legacy.c: e = 0, 1 subnormal). */
static inline __attribute__((always_inline)) __m512 b32_scales(const int kind, __m512i raw) {
    if (kind != B32_MXFP4)
        return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_and_si512(raw, _mm512_set1_epi32(0xffff))));
    const __m512i e = _mm512_and_si512(raw, _mm512_set1_epi32(0xff));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i small = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __mmask16 lt2 = _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(lt2, normal, small));
}

/* Packed activations, per token: np pairs of blocks (np = ceil(nb / 2), an odd count's last
 * pair padded with zeros), each 64 bytes of values, then np int32 pairs (Q8_0: 128 * the sum of
 * each block's values; Q8_1: its s as a float), then np float pairs (the blocks' scales). */
static size_t b32_token_bytes(int64_t n) {
    const size_t np = (size_t)(n / 32 + 1) / 2;
    return np * (64 + 8 + 8);
}

static size_t b32_packed_bytes(int64_t n, int toks) { return b32_token_bytes(n) * (size_t)toks; }

static inline __attribute__((always_inline)) void b32_pack(const bool q81, int64_t n, const void *a, size_t a_stride,
                                                           int t0, int t1, void *dst) {
    const int ab = q81 ? 36 : Q8_BLOCK_BYTES, aq = q81 ? 4 : 2; /* block bytes, values' offset */
    const int64_t nb = n / 32, np = (nb + 1) / 2;
    const size_t tb = b32_token_bytes(n);
    for (int t = t0; t < t1; t++) {
        const uint8_t *y = (const uint8_t *)a + (size_t)t * a_stride;
        uint8_t *p = (uint8_t *)dst + (size_t)t * tb;
        int32_t *sums = (int32_t *)(p + np * 64);
        float *scales = (float *)(p + np * 72);
        for (int64_t b = 0; b < 2 * np; b++) {
            if (b >= nb) { /* the padding block: no values, never added */
                memset(p + 32 * b, 0, 32);
                sums[b] = 0;
                scales[b] = 0.0f;
                continue;
            }
            const uint8_t *blk = y + (size_t)b * (size_t)ab;
            memcpy(p + 32 * b, blk + aq, 32);
            uint16_t d, sa;
            memcpy(&d, blk, 2);
            scales[b] = _cvtsh_ss(d);
            if (q81) { /* s as a float, bit for bit in the int32 slot */
                memcpy(&sa, blk + 2, 2);
                const float f = _cvtsh_ss(sa);
                memcpy(&sums[b], &f, 4);
                continue;
            }
            int32_t s = 0;
            for (int i = 0; i < 32; i++) s += (int8_t)blk[2 + i];
            sums[b] = 128 * s;
        }
    }
}

/* One group of ROWS8 rows (lanes past the group's rows repeat the last row; not stored)
 * against tn tokens (a constant after inlining), all blocks. acc lanes 0-3 and 8-11 end as
 * rows 0-3 and 4-7. */
static inline __attribute__((always_inline)) void b32_group(const int kind, __m512i lut, int64_t nb,
                                                           const uint8_t *w0, __m512i offs,
                                                           const uint8_t *const wr[ROWS8],
                                                           const uint8_t *packed, size_t tb, const int tn,
                                                           const uint8_t *ahead, size_t ahead_bytes,
                                                           __m512 acc[B32_TOKS]) {
    const int64_t np = (nb + 1) / 2;
    const int bb = b32_block_bytes[kind], pair_lines = (2 * ROWS8 * bb + 63) / 64;
    const __m512i pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    const __m512 zero = _mm512_setzero_ps();
    for (int t = 0; t < tn; t++) acc[t] = zero;
    for (int64_t pi = 0; pi < np; pi++) {
        const int64_t b = 2 * pi;
        const bool two = b + 1 < nb;
        /* the bytes of the group two ahead (rows8.ahead): 8 rows x two blocks a pair, in lines */
        if (ahead) {
            const size_t off = (size_t)pi * (size_t)pair_lines * 64;
            for (int l = 0; l < pair_lines; l++)
                if (off + 64 * (size_t)l < ahead_bytes) _mm_prefetch((const char *)ahead + off + 64 * l, _MM_HINT_T1);
        }
        __m512i wv[ROWS8];
#pragma GCC unroll 8
        for (int r = 0; r < ROWS8; r++) wv[r] = b32_values(kind, wr[r] + b * bb, two, lut);
        /* the rows' block scales in the reduction's layout (offs: row and block of each dword) */
        const __mmask16 have = two ? (__mmask16)0xffff : (__mmask16)0x0f0f; /* no block b + 1: not read */
        const __m512i raw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), have, offs,
                                                        (const void *)(w0 + b * bb), 1);
        const __m512 dw = b32_scales(kind, raw);
        /* Q4_1 / Q5_1: the min, the f16 after d (the high half of the same dword) */
        const __m512 mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(raw, 16)));
#pragma GCC unroll 4
        for (int t = 0; t < tn; t++) {
            const uint8_t *p = packed + (size_t)t * tb;
            __m512i s[ROWS8];
            rows8_dpbusd(wv, p + 64 * pi, s);
            /* the pair's 128 * sum(a) and scales, each to its block's lanes */
            const __m128i sums2 = _mm_loadl_epi64((const __m128i *)(p + np * 64 + 8 * pi));
            const __m128i scales2 = _mm_loadl_epi64((const __m128i *)(p + np * 72 + 8 * pi));
            const __m512i corr = _mm512_permutexvar_epi32(pair_idx, _mm512_castsi128_si512(sums2));
            const __m512 da = _mm512_permutexvar_ps(pair_idx, _mm512_castps128_ps512(_mm_castsi128_ps(scales2)));
            __m512 prod;
            if (B32_AFFINE(kind)) { /* (dw * da) * isum + mw * sa, the values unsigned: no correction */
                const __m512 fi = _mm512_cvtepi32_ps(rows8_reduce(s));
                prod = _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(dw, da), fi),
                                     _mm512_mul_ps(mw, _mm512_castsi512_ps(corr)));
            } else { /* exact block sums of w * a */
                const __m512 fi = _mm512_cvtepi32_ps(_mm512_sub_epi32(rows8_reduce(s), corr));
                prod = kind == B32_Q4_0 ? _mm512_mul_ps(_mm512_mul_ps(fi, dw), da)
                                        : _mm512_mul_ps(fi, _mm512_mul_ps(dw, da));
            }
            /* block b, then block b + 1 (its lanes moved onto block b's) */
            acc[t] = _mm512_add_ps(acc[t], prod);
            if (two) acc[t] = _mm512_add_ps(acc[t], _mm512_shuffle_f32x4(prod, prod, _MM_SHUFFLE(2, 3, 0, 1)));
        }
    }
}

static inline __attribute__((always_inline)) void b32_run(const int kind, int64_t n, const void *w, size_t w_stride,
                                                          int rows, const void *packed, int toks, float *out,
                                                          size_t out_stride) {
    const int64_t nb = n / 32;
    const int bb = b32_block_bytes[kind];
    uint8_t book[16];
    const int8_t *kv = kind == B32_MXFP4 ? quant_kvalues_mxfp4 : quant_kvalues_iq4nl;
    for (int i = 0; i < 16; i++) book[i] = (uint8_t)(kv[i] + 128);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)book));
    const size_t tb = b32_token_bytes(n);
    static const int lane_of[ROWS8] = {0, 1, 2, 3, 8, 9, 10, 11}; /* rows8_reduce's layout */
    /* the tokens in passes whose packed activations stay in L2 (kernels.h) */
    const int pass = kernel_tile_pass_units(toks, tb, B32_TOKS, toks > B32_TOKS ? toks : B32_TOKS);
    for (int p0 = 0; p0 < toks; p0 += pass) {
        const int p1 = toks - p0 < pass ? toks : p0 + pass;
        rows8_prefetch_second(w, w_stride, rows);
        for (int r0 = 0; r0 < rows; r0 += ROWS8) {
            const rows8 g = rows8_at(w, w_stride, rows, r0);
            const __m512i offs = rows8_pair_offsets(&g, w_stride, (size_t)bb, 0);
            for (int t0 = p0; t0 < p1; t0 += B32_TOKS) {
                const int tn = p1 - t0 < B32_TOKS ? p1 - t0 : B32_TOKS;
                const uint8_t *p = (const uint8_t *)packed + (size_t)t0 * tb;
                const uint8_t *pf = t0 == p0 ? g.ahead : NULL; /* later passes find the rows in L1 */
                __m512 acc[B32_TOKS];
                switch (tn) {
                case 1: b32_group(kind, lut, nb, g.w0, offs, g.wr, p, tb, 1, pf, g.ahead_bytes, acc); break;
                case 2: b32_group(kind, lut, nb, g.w0, offs, g.wr, p, tb, 2, pf, g.ahead_bytes, acc); break;
                case 3: b32_group(kind, lut, nb, g.w0, offs, g.wr, p, tb, 3, pf, g.ahead_bytes, acc); break;
                default: b32_group(kind, lut, nb, g.w0, offs, g.wr, p, tb, 4, pf, g.ahead_bytes, acc); break;
                }
                for (int t = 0; t < tn; t++) {
                    float v[16];
                    _mm512_storeu_ps(v, acc[t]);
                    rows8_store(v, lane_of, g.nr, out + (size_t)(t0 + t) * out_stride + r0);
                }
            }
        }
    }
}

#define B32_TILE(NAME, KIND)                                                                              \
    static void NAME##_pack(int64_t n, const void *a, size_t as, int toks, int t0, int t1, void *dst) {     \
        (void)toks;                                                                                          \
        b32_pack(B32_AFFINE(KIND), n, a, as, t0, t1, dst);                                                   \
    }                                                                                                        \
    static void NAME##_run(int64_t n, const void *w, size_t w_stride, int rows, const void *packed, int toks, \
                           float *out, size_t out_stride) {                                                  \
        b32_run(KIND, n, w, w_stride, rows, packed, toks, out, out_stride);                                 \
    }                                                                                                        \
    static const kernel_tile NAME = {b32_packed_bytes, NAME##_pack, NAME##_run, 1, 0};

/* Used from one token on (kernels.h: min_toks). One-token products, bench_kernels --mb 512, two
 * threads from DRAM: Q4_0, Q5_0, IQ4_NL, MXFP4 18.0-19.9 -> 41.1-46.7 GB/s (their dots were
 * compute-bound), Q8_0 at the memory's speed either way (one core 24.7 -> 32.2); a Q8_0 file of
 * the 30B-A3B shape (4 layers) decodes 62.5 / 69.9 -> 72.0 / 80.2 t/s on two threads, although
 * experts_one, which keeps to the dot path, then declines its experts. */
B32_TILE(tile_q8_0, B32_Q8_0)
B32_TILE(tile_q4_0, B32_Q4_0)
B32_TILE(tile_q5_0, B32_Q5_0)
B32_TILE(tile_iq4_nl, B32_IQ4_NL)
B32_TILE(tile_mxfp4, B32_MXFP4)
B32_TILE(tile_q4_1, B32_Q4_1)
B32_TILE(tile_q5_1, B32_Q5_1)

void kernels_register_avx512_b32(kernel_set *ks) {
    ks->tile[GGML_TYPE_Q8_0] = &tile_q8_0;
    ks->tile[GGML_TYPE_Q4_0] = &tile_q4_0;
    ks->tile[GGML_TYPE_Q5_0] = &tile_q5_0;
    ks->tile[GGML_TYPE_IQ4_NL] = &tile_iq4_nl;
    ks->tile[GGML_TYPE_MXFP4] = &tile_mxfp4;
    ks->tile[GGML_TYPE_Q4_1] = &tile_q4_1;
    ks->tile[GGML_TYPE_Q5_1] = &tile_q5_1;
}

#endif
