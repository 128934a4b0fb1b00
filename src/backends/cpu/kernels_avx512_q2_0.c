/* Q2_0 products with 512-bit VNNI, eight weight rows at a time (decode and prefill).
 *
 * Why a tile even for one token: the single-row dot (kernels_x86.inc) spends most of its time
 * on work that does not depend on the row: reordering the activations to the codes' bit-plane
 * order, summing them for the "- 1" of each code, and one horizontal reduction per half block.
 * Here the activations are packed once per product (plane order, their sums and scales), and
 * eight rows share one reduction tree, so a row block costs a load, a shift, a mask and one
 * vpdpbusd plus its share of the tree.
 *
 * Exactness (the reference is quant_dot_q2_0 in formats/quant_iq.c): per 32-value half the
 * exact integer sum of (c - 1) * a, computed as sum(c * a) - sum(a) in int32; then, per row and
 * block, t = (0 + da0 * isum0) + da1 * isum1 and sum = sum + dw * t, with every float step one
 * IEEE single operation in the reference's order: rows sit in vector lanes, so the blocks of a
 * row are still summed one after the other. Compiled with the AVX-512 level's flags
 * (CMakeLists.txt); registered by kernels_register_avx512. */
#if defined(__x86_64__)

#include "backends/cpu/kernels_x86_common.h" /* first: contraction off, the helpers */

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_avx512_rows8.h"

#define Q2_BLOCK_BYTES 18 /* d:f16 | 16 code bytes */
#define Q8_BLOCK_BYTES 34 /* d:f16 | 32 int8 */
#define Q2_TOKS 4         /* tokens per pass over a row group (prefill) */

/* Packed activations, per token: nb blocks of 64 bytes in plane order (128-bit lane k, byte j =
 * activation 4 j + k of the block, the position of code bits 2k..2k+1 of code byte j), then nb
 * int32 pairs (the sums of the two halves' activations), then nb float pairs (the halves'
 * scales). */
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
            for (int k = 0; k < 4; k++)
                for (int j = 0; j < 16; j++) {
                    const int v = 4 * j + k; /* value v of the block: half v / 32, element v % 32 */
                    p[64 * b + 16 * k + j] = h[v / 32][2 + v % 32];
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

/* The code bytes of one block broadcast to the four lanes, lane k shifted right by 2k and
 * masked: lane k byte j = code of value 4 j + k. */
static inline __m512i q2_codes(const uint8_t *blk, __m512i shifts, __m512i three) {
    const __m512i q = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(blk + 2)));
    return _mm512_and_si512(_mm512_srlv_epi16(q, shifts), three);
}

/* Eight vectors of vpdpbusd sums (row r: lane k dwords 0-1 half 0, 2-3 half 1) to one vector
 * with dword 2r = row r's half-0 sum and 2r + 1 its half-1 sum. */
static inline __m512i q2_reduce8(const __m512i p[ROWS8]) {
    __m512i q[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m512 a = _mm512_castsi512_ps(p[2 * j]), b = _mm512_castsi512_ps(p[2 * j + 1]);
        /* per lane [a0 a2 b0 b2] + [a1 a3 b1 b3] = [a half 0, a half 1, b half 0, b half 1] */
        q[j] = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))),
                                _mm512_castps_si512(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))));
    }
    /* lanes pairwise: [x(L0+L1), x(L2+L3), y(L0+L1), y(L2+L3)] */
    const __m512i s0 = _mm512_add_epi32(_mm512_shuffle_i32x4(q[0], q[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_i32x4(q[0], q[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i s1 = _mm512_add_epi32(_mm512_shuffle_i32x4(q[2], q[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_i32x4(q[2], q[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(s0, s1, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(s0, s1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* One group of ROWS8 rows (lanes past `rows` repeat the last row; not stored) against tn
 * tokens (a constant after inlining), all blocks. acc lane 2r ends as row r's dot. */
static inline __attribute__((always_inline)) void q2_group(int64_t nb, const uint8_t *w0, __m256i offs,
                                                           const uint8_t *const wr[ROWS8],
                                                           const uint8_t *packed, size_t tb, const int tn,
                                                           const uint8_t *next, size_t next_bytes,
                                                           __m512 acc[Q2_TOKS]) {
    const __m512i shifts = _mm512_setr_epi32(0, 0, 0, 0, 0x00020002, 0x00020002, 0x00020002, 0x00020002,
                                             0x00040004, 0x00040004, 0x00040004, 0x00040004, 0x00060006,
                                             0x00060006, 0x00060006, 0x00060006);
    const __m512i three = _mm512_set1_epi8(3);
    const __m512 zero = _mm512_setzero_ps();
    for (int t = 0; t < tn; t++) acc[t] = zero;
    for (int64_t b = 0; b < nb; b++) {
        /* the next group's bytes, three lines a block (8 rows x 18 bytes = 2.25 lines a block) */
        if (next) {
            const size_t off = (size_t)b * 192;
            if (off < next_bytes) {
                _mm_prefetch((const char *)next + off, _MM_HINT_T0);
                _mm_prefetch((const char *)next + off + 64, _MM_HINT_T0);
                _mm_prefetch((const char *)next + off + 128, _MM_HINT_T0);
            }
        }
        __m512i c[ROWS8];
#pragma GCC unroll 8
        for (int r = 0; r < ROWS8; r++) c[r] = q2_codes(wr[r] + b * Q2_BLOCK_BYTES, shifts, three);
        /* the rows' block scales: dword r of the gather holds row r's d in its low half, so as 16
         * halves, element 2r is row r's d */
        const __m512 dw = _mm512_cvtph_ps(_mm256_i32gather_epi32((const int *)(w0 + b * Q2_BLOCK_BYTES), offs, 1));
#pragma GCC unroll 4
        for (int t = 0; t < tn; t++) {
            const uint8_t *p = packed + (size_t)t * tb;
            __m512i s[ROWS8];
            rows8_dpbusd(c, p + 64 * b, s);
            int64_t asum;
            double dpair;
            memcpy(&asum, p + nb * 64 + 8 * b, 8);
            memcpy(&dpair, p + nb * 72 + 8 * b, 8);
            /* exact half sums of (c - 1) * a */
            const __m512i isum = _mm512_sub_epi32(q2_reduce8(s), _mm512_set1_epi64(asum));
            const __m512 prod = _mm512_mul_ps(_mm512_castpd_ps(_mm512_set1_pd(dpair)), _mm512_cvtepi32_ps(isum));
            /* lane 2r: (0 + da0 * isum0) + da1 * isum1 */
            const __m512 tt = _mm512_add_ps(_mm512_add_ps(zero, prod), _mm512_permute_ps(prod, _MM_SHUFFLE(2, 3, 0, 1)));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(dw, tt));
        }
    }
}

static void q2_run(int64_t n, const void *w, size_t w_stride, int rows, const void *packed, int toks,
                   float *out, size_t out_stride) {
    const int64_t nb = n / 64;
    const size_t tb = q2_token_bytes(n);
    static const int lane_of[ROWS8] = {0, 2, 4, 6, 8, 10, 12, 14}; /* q2_reduce8's layout */
    for (int r0 = 0; r0 < rows; r0 += ROWS8) {
        const rows8 g = rows8_at(w, w_stride, rows, r0);
        int32_t off[ROWS8];
        for (int r = 0; r < ROWS8; r++) off[r] = (int32_t)(g.wr[r] - g.w0);
        const __m256i offs = _mm256_loadu_si256((const __m256i *)off);
        for (int t0 = 0; t0 < toks; t0 += Q2_TOKS) {
            const int tn = toks - t0 < Q2_TOKS ? toks - t0 : Q2_TOKS;
            const uint8_t *p = (const uint8_t *)packed + (size_t)t0 * tb;
            const uint8_t *pf = t0 == 0 ? g.next : NULL; /* later passes find the rows in L1 */
            __m512 acc[Q2_TOKS];
            switch (tn) {
            case 1: q2_group(nb, g.w0, offs, g.wr, p, tb, 1, pf, g.next_bytes, acc); break;
            case 2: q2_group(nb, g.w0, offs, g.wr, p, tb, 2, pf, g.next_bytes, acc); break;
            case 3: q2_group(nb, g.w0, offs, g.wr, p, tb, 3, pf, g.next_bytes, acc); break;
            default: q2_group(nb, g.w0, offs, g.wr, p, tb, 4, pf, g.next_bytes, acc); break;
            }
            for (int t = 0; t < tn; t++) {
                float v[16];
                _mm512_storeu_ps(v, acc[t]);
                rows8_store(v, lane_of, g.nr, out + (size_t)(t0 + t) * out_stride + r0);
            }
        }
    }
}

/* Used from one token on (kernels.h: min_toks). */
static const kernel_tile tile_q2_0 = {q2_packed_bytes, q2_pack, q2_run, 1};

void kernels_register_avx512_q2_0(kernel_set *ks) { ks->tile[GGML_TYPE_Q2_0] = &tile_q2_0; }

#endif
