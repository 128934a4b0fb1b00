/* Prefill attention on AVX2 (no AVX-512): kernel_attn_tokens for a block of tokens and the query
 * heads of one KV head, the algorithm of kernels.h (kernel_attn_ref) with the same bits.
 *
 * Why: the AVX2 level had no kernel_attn_tokens, so a prefill ran the one-token kernel (attn_x86)
 * once per token and head. It folds 16 lanes for every (row, key) and keeps each row's output in
 * memory, a load and a store per 8 values and key. On a Zen 1 EPYC VM (2 threads, 2026-12-04)
 * a 2,048-token attention of the 30B-A3B shape took 2.6 s a layer (13 GFLOP/s): 38% of a 30B-A3B
 * pp2048 (`bench_kernels --attn`; `sluice bench -p 2048` at 6.1 t/s).
 *
 * Here, as in the 512-bit kernel (kernels_avx512.c, docs/kernels.md "Attention"):
 *  - a tile's keys are transposed once into the lanes (8 x 8 blocks in registers), so each
 *    element class (d mod 16) is accumulated for 8 keys a vector, and the 16-lane fold of a key
 *    becomes additions of whole vectors in the same pairs and order (lane j += lane j + w for
 *    w = 8, 4, 2, 1);
 *  - scores for two heads and 32 keys at once (8 accumulators; one loaded key vector serves both
 *    heads), values for two heads and 32 output dims (8 accumulators), held in registers over
 *    the tile's keys;
 *  - each tile of keys and values serves all the block's tokens and heads before the next.
 * Per row the operations and their order are the reference's: fused multiply-adds from zero in
 * dimension order per class, the fold, fl(dot * scale), the tile maximum, c = exp_s(m - m'),
 * l * c in double, o * c, then per key in order l + e and fma(e, v, o), finally o * (1 / l).
 * With fewer than A2AT_QUERIES query rows (a one-token decode's 8 heads) the transposition costs
 * more than it saves: those blocks score each (head, key) by the 16-lane dot and its fold
 * (attn_dot16, the one-token kernel's) and share the register-held values step; their
 * attention after 2,048 positions (30B-A3B shape, 2 threads) went from 1.93 to 1.54 ms.
 * Compiled with the AVX2 level's flags (CMakeLists.txt); registered by kernels_register_avx2 and
 * replaced at the AVX-512 level by its own kernel. */
#if defined(__x86_64__)

#include "backends/cpu/kernels_x86_common.h" /* first: contraction off, the helpers */

#include <math.h>

#include "backends/cpu/kernels.h"

#define TILE KERNEL_ATTN_TILE
#define A2AT_GB 8       /* query heads per pass over the tiles */
#define A2AT_HB 2       /* heads per register block */
#define A2AT_KB 4       /* key vectors (8 keys each) per score block */
#define A2AT_VB 4       /* output vectors (8 dims each) per value block */
#define A2AT_QUERIES 16 /* query rows (tokens x heads) from which the keys are transposed */
#define A2AT_INLINE static inline __attribute__((always_inline))
#define A2AT_UNROLL _Pragma("GCC unroll 16")

static kernel_attn_fn a2at_one; /* kx_register_common's one-token kernel: the head sizes not instantiated here */

/* Key vectors a token with nt keys in the tile scores: 1, 2, 4 or the whole tile. */
static inline int a2at_key_vectors(int nt) { return nt <= 8 ? 1 : nt <= 16 ? 2 : nt <= 32 ? 4 : TILE / 8; }

/* r[c] = element c of r[0..7] as eight lanes (an 8 x 8 transpose). */
static inline void a2at_transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) { /* rows 4i..4i+3: elements m, 4 + m in u[4i + m] */
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int m = 0; m < 4; m++) {
        r[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
        r[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
    }
}

/* The tile's keys in the lanes: element d = 16 j + c of key p at kT[(c * NQ + j) * TILE + p],
 * for the nt keys at k, zeros up to np keys (a multiple of 8). */
A2AT_INLINE void a2at_keys_t(const int NQ, const float *k, size_t k_stride, int nt, int np, float *kT) {
    for (int p0 = 0; p0 < np; p0 += 8)
        for (int h = 0; h < 2 * NQ; h++) { /* elements 8h .. 8h + 7: classes 8 (h & 1) + 0..7 of chunk h / 2 */
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = p0 + i < nt ? _mm256_loadu_ps(k + (size_t)(p0 + i) * k_stride + 8 * h) : _mm256_setzero_ps();
            a2at_transpose8(r);
            const int c0 = 8 * (h & 1), j = h >> 1;
            for (int c = 0; c < 8; c++) _mm256_store_ps(kT + (size_t)((c0 + c) * NQ + j) * TILE + p0, r[c]);
        }
}

/* Scores of key vectors i0 .. i0 + NK - 1 for H heads (q + h * q_stride): lane p of class c's
 * accumulator is key p's sum over d = c, c + 16, ... in order from zero; the fold adds classes
 * c and c + w for w = 8, 4, 2, 1, then * scale into sc[h]. Keys at or past nt score -inf (never
 * weighted, never the maximum). */
A2AT_INLINE void a2at_scores(const int NQ, const int H, const int NK, int i0, const float *q, size_t q_stride,
                             const float *kT, int nt, float scale, float (*sc)[TILE]) {
    __m256 part[16][A2AT_HB][A2AT_KB];
#pragma GCC unroll 1
    for (int c = 0; c < 16; c++) {
        __m256 acc[A2AT_HB][A2AT_KB];
        A2AT_UNROLL
        for (int h = 0; h < H; h++)
            A2AT_UNROLL
            for (int i = 0; i < NK; i++) acc[h][i] = _mm256_setzero_ps();
        A2AT_UNROLL
        for (int j = 0; j < NQ; j++) {
            const float *kr = kT + (size_t)(c * NQ + j) * TILE + 8 * i0;
            __m256 kv[A2AT_KB];
            A2AT_UNROLL
            for (int i = 0; i < NK; i++) kv[i] = _mm256_load_ps(kr + 8 * i);
            A2AT_UNROLL
            for (int h = 0; h < H; h++) {
                const __m256 qd = _mm256_broadcast_ss(q + (size_t)h * q_stride + 16 * j + c);
                A2AT_UNROLL
                for (int i = 0; i < NK; i++) acc[h][i] = _mm256_fmadd_ps(qd, kv[i], acc[h][i]);
            }
        }
        A2AT_UNROLL
        for (int h = 0; h < H; h++)
            A2AT_UNROLL
            for (int i = 0; i < NK; i++) part[c][h][i] = acc[h][i];
    }
    const __m256 ninf = _mm256_set1_ps(-INFINITY), lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    A2AT_UNROLL
    for (int h = 0; h < H; h++)
        A2AT_UNROLL
        for (int i = 0; i < NK; i++) {
            __m256 f[8];
            A2AT_UNROLL
            for (int c = 0; c < 8; c++) f[c] = _mm256_add_ps(part[c][h][i], part[c + 8][h][i]);
            A2AT_UNROLL
            for (int c = 0; c < 4; c++) f[c] = _mm256_add_ps(f[c], f[c + 4]);
            A2AT_UNROLL
            for (int c = 0; c < 2; c++) f[c] = _mm256_add_ps(f[c], f[c + 2]);
            __m256 sv = _mm256_mul_ps(_mm256_add_ps(f[0], f[1]), _mm256_set1_ps(scale));
            const int p = 8 * (i0 + i);
            if (nt - p < 8) /* lanes of keys past nt */
                sv = _mm256_blendv_ps(sv, ninf, _mm256_cmp_ps(lane, _mm256_set1_ps((float)(nt - p)), _CMP_GE_OQ));
            _mm256_store_ps(sc[h] + p, sv);
        }
}

/* o_h = o_h * c[h] + sum_p e[h][p] v_p over the nt values at v (o_h at out + h * out_stride),
 * l[h] = l[h] + e[h][p] in key order. */
A2AT_INLINE void a2at_values(const int NV, const int H, const float (*e)[TILE], const float *v, size_t v_stride,
                             int nt, const float *c, double *l, float *out, size_t out_stride) {
    A2AT_UNROLL
    for (int j0 = 0; j0 < NV; j0 += A2AT_VB) {
        const int J = NV - j0 < A2AT_VB ? NV - j0 : A2AT_VB;
        __m256 o[A2AT_HB][A2AT_VB];
        double lh[A2AT_HB];
        A2AT_UNROLL
        for (int h = 0; h < H; h++) {
            lh[h] = l[h];
            A2AT_UNROLL
            for (int j = 0; j < J; j++)
                o[h][j] = _mm256_mul_ps(_mm256_loadu_ps(out + (size_t)h * out_stride + 8 * (j0 + j)), _mm256_set1_ps(c[h]));
        }
        for (int p = 0; p < nt; p++) {
            const float *vp = v + (size_t)p * v_stride + 8 * j0;
            __m256 vv[A2AT_VB];
            A2AT_UNROLL
            for (int j = 0; j < J; j++) vv[j] = _mm256_loadu_ps(vp + 8 * j);
            A2AT_UNROLL
            for (int h = 0; h < H; h++) {
                if (j0 == 0) lh[h] = lh[h] + (double)e[h][p];
                const __m256 ve = _mm256_broadcast_ss(&e[h][p]);
                A2AT_UNROLL
                for (int j = 0; j < J; j++) o[h][j] = _mm256_fmadd_ps(ve, vv[j], o[h][j]);
            }
        }
        A2AT_UNROLL
        for (int h = 0; h < H; h++) {
            if (j0 == 0) l[h] = lh[h];
            A2AT_UNROLL
            for (int j = 0; j < J; j++) _mm256_storeu_ps(out + (size_t)h * out_stride + 8 * (j0 + j), o[h][j]);
        }
    }
}

/* One token's tile (nt keys, scores in sc up to the key vectors a2at_key_vectors(nt) covers,
 * -inf past nt) for the G1 heads at og: the softmax step per head, then the values. m, l: the
 * token's running maxima and sums. */
A2AT_INLINE void a2at_softmax_values(const int NV, int G1, const float (*sc)[TILE], const float *vt, size_t v_stride,
                                     int nt, float *m, double *l, float *og, size_t out_stride) {
    _Alignas(32) float e[A2AT_GB][TILE];
    float c[A2AT_GB];
    const int np = 8 * a2at_key_vectors(nt);
    for (int g = 0; g < G1; g++) {
        __m256 vmax = _mm256_set1_ps(-INFINITY);
        for (int p = 0; p < np; p += 8) vmax = _mm256_max_ps(_mm256_load_ps(sc[g] + p), vmax); /* NaN never wins */
        __m128 x = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        x = _mm_max_ps(x, _mm_movehl_ps(x, x));
        const float mt = _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps(x, x, 1)));
        const float mn = m[g] > mt ? m[g] : mt;
        c[g] = kernel_exp_s(m[g] - mn);
        l[g] = l[g] * (double)c[g];
        m[g] = mn;
        const __m256 vm = _mm256_set1_ps(mn);
        for (int p = 0; p < nt; p += 8) _mm256_store_ps(e[g] + p, exp_s8(_mm256_sub_ps(_mm256_load_ps(sc[g] + p), vm)));
    }
    for (int h0 = 0; h0 < G1; h0 += A2AT_HB) {
        if (G1 - h0 >= 2)
            a2at_values(NV, 2, (const float(*)[TILE])(e + h0), vt, v_stride, nt, c + h0, l + h0, og + (size_t)h0 * out_stride, out_stride);
        else
            a2at_values(NV, 1, (const float(*)[TILE])(e + h0), vt, v_stride, nt, c + h0, l + h0, og + (size_t)h0 * out_stride, out_stride);
    }
}

/* One token's tile from the transposed keys: scores for the G1 heads at qg, then the rest. */
A2AT_INLINE void a2at_tile(const int NQ, const int NV, const float *qg, size_t q_stride, int G1, const float *kT,
                           const float *vt, size_t v_stride, int nt, float scale, float *m, double *l, float *og,
                           size_t out_stride) {
    _Alignas(32) float sc[A2AT_GB][TILE];
    const int nk = a2at_key_vectors(nt);
    for (int h0 = 0; h0 < G1; h0 += A2AT_HB) {
        const float *qh = qg + (size_t)h0 * q_stride;
#define A2AT_SCORES(H, NK, I0) a2at_scores(NQ, H, NK, I0, qh, q_stride, kT, nt, scale, sc + h0)
#define A2AT_SCORES_H(H)                                        \
    switch (nk) {                                               \
    case 1: A2AT_SCORES(H, 1, 0); break;                        \
    case 2: A2AT_SCORES(H, 2, 0); break;                        \
    case 4: A2AT_SCORES(H, 4, 0); break;                        \
    default: A2AT_SCORES(H, 4, 0); A2AT_SCORES(H, 4, 4); break; \
    }
        if (G1 - h0 >= 2) {
            A2AT_SCORES_H(2)
        } else {
            A2AT_SCORES_H(1)
        }
#undef A2AT_SCORES_H
#undef A2AT_SCORES
    }
    a2at_softmax_values(NV, G1, (const float(*)[TILE])sc, vt, v_stride, nt, m, l, og, out_stride);
}

/* A row's running state before its first tile, its output zero */
A2AT_INLINE void a2at_start(const int NV, float *m, double *l, float *o) {
    *m = -INFINITY;
    *l = 0.0;
    for (int j = 0; j < NV; j++) _mm256_storeu_ps(o + 8 * j, _mm256_setzero_ps());
}

/* ... and after its last: o * float(1 / l) */
A2AT_INLINE void a2at_finish(const int NV, double l, float *o) {
    const __m256 inv = _mm256_set1_ps((float)(1.0 / l));
    for (int j = 0; j < NV; j++) _mm256_storeu_ps(o + 8 * j, _mm256_mul_ps(_mm256_loadu_ps(o + 8 * j), inv));
}

/* One token (a decode step, or a block too small to transpose for): each (head, key) score by
 * the 16-lane dot and its fold (attn_dot16), the values as above, in registers. */
A2AT_INLINE void a2at_token(const int NV, const float *q, size_t q_stride, int G, const float *k, size_t k_stride,
                            const float *v, size_t v_stride, int n_kv, int hd, float scale, float *out,
                            size_t out_stride) {
    float m[A2AT_GB];
    double l[A2AT_GB];
    _Alignas(32) float sc[A2AT_GB][TILE];
    for (int g0 = 0; g0 < G; g0 += A2AT_GB) {
        const int G1 = G - g0 < A2AT_GB ? G - g0 : A2AT_GB;
        for (int g = 0; g < G1; g++) a2at_start(NV, &m[g], &l[g], out + (size_t)(g0 + g) * out_stride);
        for (int p0 = 0; p0 < n_kv; p0 += TILE) {
            const int nt = n_kv - p0 < TILE ? n_kv - p0 : TILE, np = 8 * a2at_key_vectors(nt);
            for (int g = 0; g < G1; g++) {
                const float *qg = q + (size_t)(g0 + g) * q_stride;
                int p = 0;
                for (; p < nt; p++) sc[g][p] = attn_dot16(qg, k + (size_t)(p0 + p) * k_stride, hd) * scale;
                for (; p < np; p++) sc[g][p] = -INFINITY;
            }
            a2at_softmax_values(NV, G1, (const float(*)[TILE])sc, v + (size_t)p0 * v_stride, v_stride, nt, m, l,
                                out + (size_t)g0 * out_stride, out_stride);
        }
        for (int g = 0; g < G1; g++) a2at_finish(NV, l[g], out + (size_t)(g0 + g) * out_stride);
    }
}

/* Head size 16 NQ (keys), 8 NV (values); tokens in blocks of up to 8, heads in groups of A2AT_GB. */
A2AT_INLINE void a2at_run(const int NQ, const int NV, const float *q, size_t q_tok_stride, size_t q_stride, int G,
                          int T, const float *k, size_t k_stride, const float *v, size_t v_stride, int n_kv,
                          float scale, float *out, size_t out_tok_stride, size_t out_stride) {
    enum { TB = 8 };
    float m[TB][A2AT_GB];
    double l[TB][A2AT_GB];
    _Alignas(32) float kT[256 * TILE]; /* 16 NQ rows used */
    for (int t0 = 0; t0 < T; t0 += TB) {
        const int T1 = T - t0 < TB ? T - t0 : TB;
        for (int g0 = 0; g0 < G; g0 += A2AT_GB) {
            const int G1 = G - g0 < A2AT_GB ? G - g0 : A2AT_GB;
            for (int t = 0; t < T1; t++)
                for (int g = 0; g < G1; g++)
                    a2at_start(NV, &m[t][g], &l[t][g], out + (size_t)(t0 + t) * out_tok_stride + (size_t)(g0 + g) * out_stride);
            const int n_last = n_kv + t0 + T1 - 1; /* the last token's keys: the most */
            for (int p0 = 0; p0 < n_last; p0 += TILE) {
                const int ntile = n_last - p0 < TILE ? n_last - p0 : TILE;
                a2at_keys_t(NQ, k + (size_t)p0 * k_stride, k_stride, ntile, 8 * a2at_key_vectors(ntile), kT);
                for (int t = 0; t < T1; t++) { /* the tile's keys and values stay in L1/L2 for each token */
                    const int n_t = n_kv + t0 + t;
                    if (p0 >= n_t) continue;
                    const int nt = n_t - p0 < TILE ? n_t - p0 : TILE;
                    a2at_tile(NQ, NV, q + (size_t)(t0 + t) * q_tok_stride + (size_t)g0 * q_stride, q_stride, G1, kT,
                              v + (size_t)p0 * v_stride, v_stride, nt, scale, m[t], l[t],
                              out + (size_t)(t0 + t) * out_tok_stride + (size_t)g0 * out_stride, out_stride);
                }
            }
            for (int t = 0; t < T1; t++)
                for (int g = 0; g < G1; g++)
                    a2at_finish(NV, l[t][g], out + (size_t)(t0 + t) * out_tok_stride + (size_t)(g0 + g) * out_stride);
        }
    }
}

#define A2AT(NAME, NQ, NV)                                                                                  \
    static void NAME(const float *q, size_t q_tok_stride, size_t q_stride, int G, int T, const float *k,     \
                     size_t k_stride, const float *v, size_t v_stride, int n_kv, float scale, float *out,    \
                     size_t out_tok_stride, size_t out_stride) {                                            \
        a2at_run(NQ, NV, q, q_tok_stride, q_stride, G, T, k, k_stride, v, v_stride, n_kv, scale, out,       \
                 out_tok_stride, out_stride);                                                               \
    }
A2AT(a2at_64, 4, 8)
A2AT(a2at_128, 8, 16)
A2AT(a2at_256, 16, 32)

#define A2AT_TOKEN(NAME, NV)                                                                                   \
    static void NAME(const float *q, size_t q_stride, int G, const float *k, size_t k_stride, const float *v,    \
                     size_t v_stride, int n_kv, int hd, float scale, float *out, size_t out_stride) {            \
        a2at_token(NV, q, q_stride, G, k, k_stride, v, v_stride, n_kv, hd, scale, out, out_stride);             \
    }
A2AT_TOKEN(a2at_token_64, 8)
A2AT_TOKEN(a2at_token_128, 16)
A2AT_TOKEN(a2at_token_256, 32)

static void attn_tokens_avx2(const float *q, size_t q_tok_stride, size_t q_stride, int G, int T, const float *k,
                             size_t k_stride, const float *v, size_t v_stride, int n_kv, int hd, int hd_v, float scale,
                             float *out, size_t out_tok_stride, size_t out_stride, float *work) {
    const bool many = T * (G < A2AT_GB ? G : A2AT_GB) >= A2AT_QUERIES;
    if (many && hd == 128 && hd_v == 128)
        a2at_128(q, q_tok_stride, q_stride, G, T, k, k_stride, v, v_stride, n_kv, scale, out, out_tok_stride, out_stride);
    else if (many && hd == 256 && hd_v == 256)
        a2at_256(q, q_tok_stride, q_stride, G, T, k, k_stride, v, v_stride, n_kv, scale, out, out_tok_stride, out_stride);
    else if (many && hd == 64 && hd_v == 64)
        a2at_64(q, q_tok_stride, q_stride, G, T, k, k_stride, v, v_stride, n_kv, scale, out, out_tok_stride, out_stride);
    else if (hd % 16 == 0 && (hd_v == 64 || hd_v == 128 || hd_v == 256)) {
        void (*one)(const float *, size_t, int, const float *, size_t, const float *, size_t, int, int, float, float *,
                    size_t) = hd_v == 64 ? a2at_token_64 : hd_v == 128 ? a2at_token_128 : a2at_token_256;
        for (int i = 0; i < T; i++)
            one(q + (size_t)i * q_tok_stride, q_stride, G, k, k_stride, v, v_stride, n_kv + i, hd, scale,
                out + (size_t)i * out_tok_stride, out_stride);
    } else
        for (int i = 0; i < T; i++)
            a2at_one(q + (size_t)i * q_tok_stride, q_stride, G, k, k_stride, v, v_stride, n_kv + i, hd, hd_v, scale,
                     out + (size_t)i * out_tok_stride, out_stride, work);
}

/* kernel_attn: one token through the same path, as at the AVX-512 level (ops_qsa.c calls it) */
static void attn_avx2(const float *q, size_t q_stride, int G, const float *k, size_t k_stride, const float *v,
                      size_t v_stride, int n_kv, int hd, int hd_v, float scale, float *out, size_t out_stride,
                      float *work) {
    attn_tokens_avx2(q, 0, q_stride, G, 1, k, k_stride, v, v_stride, n_kv, hd, hd_v, scale, out, 0, out_stride, work);
}

/* After kx_register_common: its one-token kernel stays for the head sizes not instantiated here. */
void kernels_register_avx2_attn(kernel_set *ks) {
    a2at_one = ks->attn;
    ks->attn = attn_avx2;
    ks->attn_tokens = attn_tokens_avx2;
}

#endif
