/* Q2_0 products with 512-bit VNNI, sixteen weight rows in the lanes of a vector (decode and
 * prefill).
 *
 * Why rows in lanes: a Q2_0 block is 64 values with one scale, and the reference sums each
 * 32-value half exactly before its float step. With a row's block in a vector (vpdpbusd against
 * the token's 64 activations), each block left 16 partial sums per row to fold into two, a
 * reduction tree of ~21 shuffles and adds per 8 rows, token and block: the kernel ran at half
 * the memory's speed at one token and was compute-bound at the 3 tokens of a speculative
 * verification. Here lane r of every vector is row r: a block's code bytes of 16 rows are
 * transposed once (dword i of each row's 16 code bytes into dword lane r of W_i: 16 loads, 12
 * inserts, 8 two-source permutes), each W_i shifted by 0, 2, 4, 6 and masked gives four
 * vectors of 16 rows x 4 codes, and a token's activation quads, packed once per product in the
 * matching order, are broadcast into vpdpbusd: 16 of them per block and token leave each lane
 * holding its row's two exact half sums. No tree; the transposition is shared by the tokens of
 * a pass.
 *
 * Code layout (quant_dot_q2_0, formats/quant_iq.c): value v of a block is bits 2 (v % 4) ..
 * 2 (v % 4) + 1 of code byte v / 4. So byte m of dword i, shifted by 2k, holds value
 * 16 i + 4 m + k, and the activation quad (i, k) is a[16 i + 4 m + k] for m = 0..3. Dwords 0-1
 * are the first 32-value half, 2-3 the second.
 *
 * Exactness: per half the exact integer sum of (c - 1) * a, as sum(c * a) - sum(a) in int32;
 * then per row and block t = (0 + da0 * isum0) + da1 * isum1 and sum = sum + dw * t, every
 * float step one IEEE single operation in the reference's order, a row's blocks one after the
 * other in its lane. Compiled with the AVX-512 level's flags (CMakeLists.txt); registered by
 * kernels_register_avx512. */
#if defined(__x86_64__)

#include "backends/cpu/kernels_x86_common.h" /* first: contraction off, the helpers */

#include "backends/cpu/kernels.h"

#define Q2_BLOCK_BYTES 18 /* d:f16 | 16 code bytes */
#define Q8_BLOCK_BYTES 34 /* d:f16 | 32 int8 */
#define Q2_ROWS 16        /* rows per group: the lanes of a vector */
#define Q2_TOKS 4         /* tokens per pass over a row group (prefill) */

/* Packed activations, per token: nb blocks of 64 bytes, dword 4 i + k = the quad (i, k) above,
 * then nb int32 pairs (the sums of the two halves' activations), then nb float pairs (the
 * halves' scales). */
static size_t q2_token_bytes(int64_t n) { return (size_t)(n / 64) * (64 + 8 + 8); }

static size_t q2_packed_bytes(int64_t n, int toks) { return q2_token_bytes(n) * (size_t)toks; }

static void q2_pack(int64_t n, const void *a, size_t a_stride, int toks, int t0, int t1, void *dst) {
    (void)toks;
    const int64_t nb = n / 64;
    const size_t tb = q2_token_bytes(n);
    for (int t = t0; t < t1; t++) {
        const uint8_t *y = (const uint8_t *)a + (size_t)t * a_stride;
        uint8_t *p = (uint8_t *)dst + (size_t)t * tb;
        int32_t *sums = (int32_t *)(p + nb * 64);
        float *scales = (float *)(p + nb * 72);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *h[2] = {y + (2 * b) * Q8_BLOCK_BYTES, y + (2 * b + 1) * Q8_BLOCK_BYTES};
            for (int i = 0; i < 4; i++)
                for (int k = 0; k < 4; k++)
                    for (int m = 0; m < 4; m++) {
                        const int v = 16 * i + 4 * m + k; /* half v / 32, element v % 32 */
                        p[64 * b + 16 * i + 4 * k + m] = h[v / 32][2 + v % 32];
                    }
            for (int hf = 0; hf < 2; hf++) {
                int32_t s = 0;
                for (int i = 0; i < 32; i++) s += (int8_t)h[hf][2 + i];
                uint16_t d;
                memcpy(&d, h[hf], 2);
                sums[2 * b + hf] = s;
                scales[2 * b + hf] = _cvtsh_ss(d);
            }
        }
    }
}

/* A group of Q2_ROWS rows: row r at wr[r] (rows past the matrix repeat its last row; their
 * lanes are never stored) and the next group's bytes for the prefetch that runs ahead of the
 * first token pass. */
typedef struct q2_group_rows {
    int nr;
    const uint8_t *w0;
    const uint8_t *wr[Q2_ROWS];
    const uint8_t *next;
    size_t next_bytes;
} q2_group_rows;

static inline q2_group_rows q2_group_at(const uint8_t *w, size_t w_stride, int rows, int r0) {
    q2_group_rows g;
    g.nr = rows - r0 < Q2_ROWS ? rows - r0 : Q2_ROWS;
    g.w0 = w + (size_t)r0 * w_stride;
    for (int r = 0; r < Q2_ROWS; r++) g.wr[r] = g.w0 + (size_t)(r < g.nr ? r : g.nr - 1) * w_stride;
    const int next_rows = rows - r0 - g.nr < Q2_ROWS ? rows - r0 - g.nr : Q2_ROWS;
    g.next = next_rows > 0 ? g.w0 + (size_t)g.nr * w_stride : NULL;
    g.next_bytes = next_rows > 0 ? (size_t)next_rows * w_stride : 0;
    return g;
}

/* Block b of the group's rows: e[4 i + k] lane r = the codes of values 16 i + 4 m + k (byte m)
 * of row r, and the rows' scales dw (lane r). */
static inline __attribute__((always_inline)) void q2_block(const q2_group_rows *g, int64_t b, __m512i e[16],
                                                           __m512 *dw) {
    const size_t at = (size_t)b * Q2_BLOCK_BYTES;
#define Q2_ROW(r) (g->wr[r] + at)
    __m512i z[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) { /* z[q] lane l: row 4 q + l's 16 code bytes (dwords i = 0..3) */
        __m512i v = _mm512_castsi128_si512(ldu128(Q2_ROW(4 * q) + 2));
        v = _mm512_inserti32x4(v, ldu128(Q2_ROW(4 * q + 1) + 2), 1);
        v = _mm512_inserti32x4(v, ldu128(Q2_ROW(4 * q + 2) + 2), 2);
        z[q] = _mm512_inserti32x4(v, ldu128(Q2_ROW(4 * q + 3) + 2), 3);
    }
    /* [dword i of rows 0-7 | dword i + 1 of rows 0-7] for i = 0 (p01) and 2 (q01), rows 8-15 likewise */
    const __m512i i01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i i23 = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    const __m512i p01 = _mm512_permutex2var_epi32(z[0], i01, z[1]), q01 = _mm512_permutex2var_epi32(z[0], i23, z[1]);
    const __m512i p23 = _mm512_permutex2var_epi32(z[2], i01, z[3]), q23 = _mm512_permutex2var_epi32(z[2], i23, z[3]);
    const __m512i W[4] = {_mm512_permutex2var_epi32(p01, lo, p23), _mm512_permutex2var_epi32(p01, hi, p23),
                          _mm512_permutex2var_epi32(q01, lo, q23), _mm512_permutex2var_epi32(q01, hi, q23)};
    const __m512i three = _mm512_set1_epi8(3);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        e[4 * i] = _mm512_and_si512(W[i], three);
        e[4 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(W[i], 2), three);
        e[4 * i + 2] = _mm512_and_si512(_mm512_srli_epi16(W[i], 4), three);
        e[4 * i + 3] = _mm512_and_si512(_mm512_srli_epi16(W[i], 6), three);
    }
    /* the rows' scales by scalar loads: a 16-lane gather cost more (integer ports are idle here) */
    uint16_t dh[Q2_ROWS];
#pragma GCC unroll 16
    for (int r = 0; r < Q2_ROWS; r++) memcpy(&dh[r], Q2_ROW(r), 2);
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
#undef Q2_ROW
}

/* One token's block b: acc + dw * ((0 + da0 * isum0) + da1 * isum1), lane-wise. */
static inline __attribute__((always_inline)) __m512 q2_token(const __m512i e[16], __m512 dw, const uint8_t *p,
                                                             int64_t nb, int64_t b, __m512 acc) {
    const int32_t *A = (const int32_t *)(p + 64 * b);
    /* two chains per half, so that four vpdpbusd chains are in flight */
    __m512i c[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        c[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), e[4 * j], _mm512_set1_epi32(A[4 * j]));
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
#pragma GCC unroll 3
        for (int k = 1; k < 4; k++) c[j] = _mm512_dpbusd_epi32(c[j], e[4 * j + k], _mm512_set1_epi32(A[4 * j + k]));
    const int32_t *s = (const int32_t *)(p + nb * 64 + 8 * b);
    const float *da = (const float *)(p + nb * 72 + 8 * b);
    const __m512i isum0 = _mm512_sub_epi32(_mm512_add_epi32(c[0], c[1]), _mm512_set1_epi32(s[0]));
    const __m512i isum1 = _mm512_sub_epi32(_mm512_add_epi32(c[2], c[3]), _mm512_set1_epi32(s[1]));
    const __m512 p0 = _mm512_mul_ps(_mm512_set1_ps(da[0]), _mm512_cvtepi32_ps(isum0));
    const __m512 p1 = _mm512_mul_ps(_mm512_set1_ps(da[1]), _mm512_cvtepi32_ps(isum1));
    const __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_setzero_ps(), p0), p1);
    return _mm512_add_ps(acc, _mm512_mul_ps(dw, t));
}

/* One row group against tn tokens (a constant after inlining), all blocks. */
static inline __attribute__((always_inline)) void q2_group(int64_t nb, const q2_group_rows *g, const uint8_t *packed,
                                                           size_t tb, const int tn, int prefetch,
                                                           __m512 acc[Q2_TOKS]) {
    for (int t = 0; t < tn; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (prefetch && g->next) { /* the next group's bytes: 16 rows x 18 bytes a block, 5 lines */
            const size_t off = (size_t)b * (Q2_ROWS * Q2_BLOCK_BYTES);
            for (size_t l = 0; l < 5 * 64; l += 64)
                if (off + l < g->next_bytes) _mm_prefetch((const char *)g->next + off + l, _MM_HINT_T0);
        }
        __m512i e[16];
        __m512 dw;
        q2_block(g, b, e, &dw);
#pragma GCC unroll 4
        for (int t = 0; t < tn; t++) acc[t] = q2_token(e, dw, packed + (size_t)t * tb, nb, b, acc[t]);
    }
}

static void q2_run(int64_t n, const void *w, size_t w_stride, int rows, const void *packed, int toks,
                   float *out, size_t out_stride) {
    const int64_t nb = n / 64;
    const size_t tb = q2_token_bytes(n);
    /* the tokens in passes whose packed activations stay in L2 (kernels.h) */
    const int pass = kernel_tile_pass_units(toks, tb, Q2_TOKS, toks > Q2_TOKS ? toks : Q2_TOKS);
    for (int p0 = 0; p0 < toks; p0 += pass) {
        const int p1 = toks - p0 < pass ? toks : p0 + pass;
        for (int r0 = 0; r0 < rows; r0 += Q2_ROWS) {
            const q2_group_rows g = q2_group_at((const uint8_t *)w, w_stride, rows, r0);
            const __mmask16 keep = (__mmask16)((1u << g.nr) - 1u);
            for (int t0 = p0; t0 < p1; t0 += Q2_TOKS) {
                const int tn = p1 - t0 < Q2_TOKS ? p1 - t0 : Q2_TOKS;
                const uint8_t *p = (const uint8_t *)packed + (size_t)t0 * tb;
                const int pf = t0 == p0; /* later passes find the rows in cache */
                __m512 acc[Q2_TOKS];
                switch (tn) {
                case 1: q2_group(nb, &g, p, tb, 1, pf, acc); break;
                case 2: q2_group(nb, &g, p, tb, 2, pf, acc); break;
                case 3: q2_group(nb, &g, p, tb, 3, pf, acc); break;
                default: q2_group(nb, &g, p, tb, 4, pf, acc); break;
                }
                for (int t = 0; t < tn; t++)
                    _mm512_mask_storeu_ps(out + (size_t)(t0 + t) * out_stride + r0, keep, acc[t]);
            }
        }
    }
}

/* Used from one token on (kernels.h: min_toks). */
static const kernel_tile tile_q2_0 = {q2_packed_bytes, q2_pack, q2_run, 1, 0};

void kernels_register_avx512_q2_0(kernel_set *ks) { ks->tile[GGML_TYPE_Q2_0] = &tile_q2_0; }

#endif
