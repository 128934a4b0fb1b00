/* The Gated DeltaNet recurrence of a group of 8 state rows through several tokens, with 512-bit
 * AVX-512 (kernel_gdn_rows in kernels.h; ops_ssm.c's rows-outermost walk calls it in prefill).
 *
 * The passes' definition is 8 lanes wide (decay_dot / update_dot: per row, chunks of 8 values,
 * products and adds never fused, then the fold ((0+4)+(2+6))+((1+5)+(3+7))), and the 256-bit
 * kernels (kernels_x86.inc) run four rows side by side. They are bound by their multiplies
 * (four per 8 values, row and token: a third of a 35B-A3B prefill's Gated DeltaNet time). Here
 * a 512-bit register holds the same 8-value chunk of two rows, row 2p in its low half and row
 * 2p + 1 in its high half: every lane does exactly the operations of its row's 8-lane pass, in
 * the same order, so the bits are the same, with half the instructions. The k and q chunks are
 * broadcast to both halves; the rows' d = (v - m) beta are a pair of broadcasts.
 *
 * So that no shuffle is needed per chunk, the 8 rows are copied once into that interleaved
 * layout (chunk-major, 4 KiB at 128 values a row) before the first token and copied back after
 * the last. Compiled with the AVX-512 level's flags (CMakeLists.txt); registered by
 * kernels_register_avx512. */
#if defined(__x86_64__)

#include "backends/cpu/kernels_x86_common.h" /* first: contraction off, the helpers */

#include "backends/cpu/kernels.h"

#define GDN_PAIRS 4 /* 8 rows */

/* fold8 of kernels_x86.inc on one 256-bit half */
static inline float gdn_fold8(__m256 acc) {
    const __m128 t = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

/* the two rows' sums of a pair's accumulator: row 2p (low half), row 2p + 1 (high half) */
static inline void gdn_fold_pair(__m512 acc, float *lo, float *hi) {
    *lo = gdn_fold8(_mm512_castps512_ps256(acc));
    *hi = gdn_fold8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
}

static void gdn_rows_avx512(int n, float *s, int T, const float *k, size_t k_stride, const float *q,
                            size_t q_stride, const float *v, size_t v_stride, const float *beta, size_t beta_stride,
                            const float *decay, float *out, size_t out_stride) {
    const int nc = n / 8; /* n % 8 == 0 and n <= KERNEL_GDN_ROWS_MAX_N (the caller checks) */
    _Alignas(64) float w[KERNEL_GDN_ROWS_MAX_N / 8 * GDN_PAIRS * 16];
    __m512 *W = (__m512 *)w; /* W[c * GDN_PAIRS + p] = [row 2p chunk c | row 2p + 1 chunk c] */
    for (int c = 0; c < nc; c++)
        for (int p = 0; p < GDN_PAIRS; p++)
            W[c * GDN_PAIRS + p] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(s + (size_t)(2 * p) * n + 8 * c)),
                                                      _mm256_loadu_ps(s + (size_t)(2 * p + 1) * n + 8 * c), 1);
    for (int t = 0; t < T; t++) {
        const float *kt = k + (size_t)t * k_stride, *qt = q + (size_t)t * q_stride, *vt = v + (size_t)t * v_stride;
        float *ot = out + (size_t)t * out_stride;
        /* decay: s *= a, m = s . k */
        const __m512 va = _mm512_set1_ps(decay[t]);
        __m512 acc[GDN_PAIRS];
#pragma GCC unroll 4
        for (int p = 0; p < GDN_PAIRS; p++) acc[p] = _mm512_setzero_ps();
        for (int c = 0; c < nc; c++) {
            const __m512 kv = _mm512_broadcast_f32x8(_mm256_loadu_ps(kt + 8 * c));
#pragma GCC unroll 4
            for (int p = 0; p < GDN_PAIRS; p++) {
                const __m512 sv = _mm512_mul_ps(W[c * GDN_PAIRS + p], va);
                W[c * GDN_PAIRS + p] = sv;
                acc[p] = _mm512_add_ps(acc[p], _mm512_mul_ps(sv, kv));
            }
        }
        /* d = (v - m) * beta per row, as ops_ssm.c computes it */
        const float bt = beta[(size_t)t * beta_stride];
        __m512 vd[GDN_PAIRS];
#pragma GCC unroll 4
        for (int p = 0; p < GDN_PAIRS; p++) {
            float m0, m1;
            gdn_fold_pair(acc[p], &m0, &m1);
            const float d0 = (vt[2 * p] - m0) * bt, d1 = (vt[2 * p + 1] - m1) * bt;
            vd[p] = _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
            acc[p] = _mm512_setzero_ps();
        }
        /* update: s += k d, o = s . q */
        for (int c = 0; c < nc; c++) {
            const __m512 kv = _mm512_broadcast_f32x8(_mm256_loadu_ps(kt + 8 * c));
            const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(qt + 8 * c));
#pragma GCC unroll 4
            for (int p = 0; p < GDN_PAIRS; p++) {
                const __m512 sv = _mm512_add_ps(W[c * GDN_PAIRS + p], _mm512_mul_ps(kv, vd[p]));
                W[c * GDN_PAIRS + p] = sv;
                acc[p] = _mm512_add_ps(acc[p], _mm512_mul_ps(sv, qv));
            }
        }
#pragma GCC unroll 4
        for (int p = 0; p < GDN_PAIRS; p++) gdn_fold_pair(acc[p], &ot[2 * p], &ot[2 * p + 1]);
    }
    for (int c = 0; c < nc; c++)
        for (int p = 0; p < GDN_PAIRS; p++) {
            _mm256_storeu_ps(s + (size_t)(2 * p) * n + 8 * c, _mm512_castps512_ps256(W[c * GDN_PAIRS + p]));
            _mm256_storeu_ps(s + (size_t)(2 * p + 1) * n + 8 * c, _mm512_extractf32x8_ps(W[c * GDN_PAIRS + p], 1));
        }
}

void kernels_register_avx512_gdn(kernel_set *ks) { ks->gdn_rows = gdn_rows_avx512; }

#endif
