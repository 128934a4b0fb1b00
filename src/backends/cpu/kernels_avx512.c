/* AVX-512 kernels (F, BW, VL, DQ, VNNI): the shared 256-bit code of kernels_x86.inc with the
 * u8 x s8 dot done by VNNI's vpdpbusd (no int16 intermediate), plus 512-bit versions of the
 * hottest kernels. Compiled alone with the AVX-512 -m flags (CMakeLists.txt); kernels.c calls
 * it only after cpuid and xgetbv confirmed them. */
#if defined(__x86_64__)

#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))

#include "backends/cpu/kernels_x86.inc"

/* ---- 512-bit K-quant dots (same integers, same float steps as the 256-bit ones) ----------- */

/* Scales and mins of a Q4_K/Q5_K super-block as 16 words: 0..7 scales, 8..15 mins. The 12
 * packed bytes as three little-endian u32 u0..u2: scales 0..3 / mins 0..3 are the low six bits
 * of the bytes of u0 / u1; scales 4..7 take their low nibble from u2's low nibbles and their top
 * two bits from the top of u0's bytes; mins 4..7 likewise from u2's high nibbles and u1. */
static inline __m256i k4_scales16(const uint8_t *p) {
    uint32_t u[3];
    memcpy(u, p, 12);
    const uint32_t low6 = 0x3f3f3f3fu, nib = 0x0f0f0f0fu, two = 0x03030303u;
    uint32_t s0 = u[0] & low6, s1 = (u[2] & nib) | (((u[0] >> 6) & two) << 4);
    uint32_t m0 = u[1] & low6, m1 = ((u[2] >> 4) & nib) | (((u[1] >> 6) & two) << 4);
    return _mm256_cvtepu8_epi16(_mm_setr_epi32((int)s0, (int)s1, (int)m0, (int)m1));
}

/* Reduce 16 int32 lanes (a) and 8 int32 lanes (b) to their two sums at once. */
static inline void hsum2(__m512i a, __m256i b, int32_t *sa, int32_t *sb) {
    __m256i a8 = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
    __m256i h = _mm256_hadd_epi32(a8, b);
    __m128i h2 = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    h2 = _mm_hadd_epi32(h2, h2);
    *sa = _mm_cvtsi128_si32(h2);
    *sb = _mm_extract_epi32(h2, 1);
}

/* 64 elements of a Q4_K/Q5_K chunk c as [low nibbles | high nibbles] (sub-blocks 2c, 2c+1),
 * matching 64 contiguous activation bytes. */
static inline __m512i k4_chunk(const uint8_t *qs) {
    __m256i q = ldu(qs);
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1);
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
}

/* Q4_K / Q5_K: sumf += (d*da) * isum - (dmin*da) * summs (quant_kquants.c) */
static inline float k45_dot512(int64_t n, const uint8_t *x, const uint8_t *y, int bytes, int qs_off,
                               int has_high) {
    float sumf = 0.0f;
    /* word g of the result = min g/2 (words 8.. of the scale vector) */
    const __m256i mdup = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    __m512i sel[4];
    for (int c = 0; c < 4; c++)
        sel[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * c))),
                                    _mm256_set1_epi16((short)(2 * c + 1)), 1);
    const __m512i one = _mm512_set1_epi8(1);
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += bytes, y += 292) {
        __m256i sm = k4_scales16(x + 4);
        __m256i pm = _mm256_madd_epi16(bsums16(y), _mm256_permutexvar_epi16(mdup, sm));
        __m512i sc = _mm512_castsi256_si512(sm);
        const int8_t *q8 = (const int8_t *)(y + 4);
        __m512i acc = _mm512_setzero_si512();
        __m512i hb = has_high ? _mm512_inserti64x4(_mm512_castsi256_si512(ldu(x + 16)), ldu(x + 16), 1)
                              : _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            __m512i u = k4_chunk(x + qs_off + 32 * c);
            if (has_high) {
                /* low half: bit 2c of qh, high half: bit 2c+1, moved to 0x10 */
                __m512i sh = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * c))),
                                                _mm256_set1_epi16((short)(2 * c + 1)), 1);
                __m512i b = _mm512_and_si512(_mm512_srlv_epi16(hb, sh), one);
                u = _mm512_or_si512(u, _mm512_slli_epi16(b, 4));
            }
            __m512i p = _mm512_maddubs_epi16(u, _mm512_loadu_si512(q8 + 64 * c));
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_permutexvar_epi16(sel[c], sc)));
        }
        int32_t isum, summs;
        hsum2(acc, pm, &isum, &summs);
        float da = ld_f32(y);
        sumf += (ld_f16(x) * da) * (float)isum - (ld_f16(x + 2) * da) * (float)summs;
    }
    return sumf;
}

static float dot_q4_k_512(int64_t n, const void *w, const void *a) { return k45_dot512(n, w, a, 144, 16, 0); }
static float dot_q5_k_512(int64_t n, const void *w, const void *a) { return k45_dot512(n, w, a, 176, 48, 1); }

/* The four 16-element sub-blocks 4m..4m+3 of a 64-element zmm: word index vector that spreads
 * sub-block scale 4m+k over the k-th 128-bit lane (8 words). */
static inline __m512i sel16(int m) {
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16((short)(4 * m + 1)), _mm_set1_epi16((short)(4 * m)))),
        _mm256_set_m128i(_mm_set1_epi16((short)(4 * m + 3)), _mm_set1_epi16((short)(4 * m + 2))), 1);
}

/* Per-half shift counts [lo x16 words | hi x16 words]. */
static inline __m512i counts2(int lo, int hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)lo)), _mm256_set1_epi16((short)hi), 1);
}

static inline __m512i bcast256(__m256i v) { return _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1); }

/* Q2_K: sumf += (da*d) * isum - (da*dmin) * summs */
static float dot_q2_k_512(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    const __m512i m3 = _mm512_set1_epi8(3);
    __m512i sel[4];
    for (int m = 0; m < 4; m++) sel[m] = sel16(m);
    const __m512i sh01 = counts2(0, 2), sh23 = counts2(4, 6);
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 84, y += 292) {
        __m256i sc8 = _mm256_cvtepu8_epi16(ldu128(x));
        __m512i sc = _mm512_castsi256_si512(_mm256_and_si256(sc8, _mm256_set1_epi16(15)));
        __m256i pm = _mm256_madd_epi16(bsums16(y), _mm256_srli_epi16(sc8, 4));
        const int8_t *q8 = (const int8_t *)(y + 4);
        __m512i acc = _mm512_setzero_si512();
        for (int m = 0; m < 4; m++) { /* elements 64m..: half m/2, shifts 2t for t = 2(m%2), +1 */
            __m512i qs = bcast256(ldu(x + 16 + 32 * (m / 2)));
            __m512i u = _mm512_and_si512(_mm512_srlv_epi16(qs, (m % 2) ? sh23 : sh01), m3);
            __m512i p = _mm512_maddubs_epi16(u, _mm512_loadu_si512(q8 + 64 * m));
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_permutexvar_epi16(sel[m], sc)));
        }
        int32_t isum, summs;
        hsum2(acc, pm, &isum, &summs);
        float da = ld_f32(y);
        float dall = da * ld_f16(x + 80), dmin = da * ld_f16(x + 82);
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    return sumf;
}

/* Q3_K's sixteen signed 6-bit scales as words: low nibbles from bytes 0..7 (low then high
 * nibbles), top two bits from bytes 8..11 at bit pairs 0..3 (one pair per group of four). */
static inline __m256i q3k_scales16(const uint8_t *p) {
    uint32_t u[3];
    memcpy(u, p, 12);
    const uint32_t nib = 0x0f0f0f0fu, two = 0x03030303u;
    uint32_t v0 = (u[0] & nib) | ((u[2] & two) << 4);
    uint32_t v1 = (u[1] & nib) | (((u[2] >> 2) & two) << 4);
    uint32_t v2 = ((u[0] >> 4) & nib) | (((u[2] >> 4) & two) << 4);
    uint32_t v3 = ((u[1] >> 4) & nib) | (((u[2] >> 6) & two) << 4);
    __m128i b = _mm_sub_epi8(_mm_setr_epi32((int)v0, (int)v1, (int)v2, (int)v3), _mm_set1_epi8(32));
    return _mm256_cvtepi8_epi16(b);
}

/* Q3_K: sumf += (d*da) * isum, isum = sum sc*u*a - 4 sum sc*bsum, u = q + 4 */
static float dot_q3_k_512(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    const __m512i m3 = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1);
    __m512i sel[4], hsh[4];
    for (int m = 0; m < 4; m++) {
        sel[m] = sel16(m);
        hsh[m] = counts2(2 * m, 2 * m + 1);
    }
    const __m512i sh01 = counts2(0, 2), sh23 = counts2(4, 6);
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 110, y += 292) {
        __m256i sc16 = q3k_scales16(x + 96);
        __m256i bias = _mm256_madd_epi16(bsums16(y), sc16);
        __m512i sc = _mm512_castsi256_si512(sc16);
        const int8_t *q8 = (const int8_t *)(y + 4);
        __m512i hm = bcast256(ldu(x));
        __m512i acc = _mm512_setzero_si512();
        for (int m = 0; m < 4; m++) {
            __m512i qs = bcast256(ldu(x + 32 + 32 * (m / 2)));
            __m512i lo = _mm512_and_si512(_mm512_srlv_epi16(qs, (m % 2) ? sh23 : sh01), m3);
            __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(hm, hsh[m]), one);
            __m512i u = _mm512_or_si512(lo, _mm512_slli_epi16(hb, 2));
            __m512i p = _mm512_maddubs_epi16(u, _mm512_loadu_si512(q8 + 64 * m));
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_permutexvar_epi16(sel[m], sc)));
        }
        int32_t isum, corr;
        hsum2(acc, bias, &isum, &corr);
        isum -= 4 * corr;
        sumf += (ld_f16(x + 108) * ld_f32(y)) * (float)isum;
    }
    return sumf;
}

/* Q6_K: sumf += (d*da) * isum, isum = sum sc*u*a - 32 sum sc*bsum, u = q + 32 */
static float dot_q6_k_512(int64_t n, const void *w, const void *a) {
    const uint8_t *x = w, *y = a;
    float sumf = 0.0f;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    __m512i sel[4];
    for (int m = 0; m < 4; m++) sel[m] = sel16(m);
    const __m512i shl = counts2(4, 2), shr = counts2(0, 2);
    for (int64_t blk = 0; blk < n / QK_K; blk++, x += 210, y += 292) {
        __m256i sc16 = _mm256_cvtepi8_epi16(ldu128(x + 192));
        __m256i bias = _mm256_madd_epi16(bsums16(y), sc16);
        __m512i sc = _mm512_castsi256_si512(sc16);
        const int8_t *q8 = (const int8_t *)(y + 4);
        __m512i acc = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512i ql = _mm512_loadu_si512(x + 64 * h);
            __m512i qh = bcast256(ldu(x + 128 + 32 * h));
            /* quarters 0,1: low nibbles of ql[0..31], ql[32..63] with qh bits 0-1 / 2-3;
             * quarters 2,3: high nibbles with qh bits 4-5 / 6-7 */
            __m512i u01 = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
            __m512i u23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                          _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
            __m512i p0 = _mm512_maddubs_epi16(u01, _mm512_loadu_si512(q8 + 128 * h));
            __m512i p1 = _mm512_maddubs_epi16(u23, _mm512_loadu_si512(q8 + 128 * h + 64));
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p0, _mm512_permutexvar_epi16(sel[2 * h], sc)));
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p1, _mm512_permutexvar_epi16(sel[2 * h + 1], sc)));
        }
        int32_t isum, corr;
        hsum2(acc, bias, &isum, &corr);
        isum -= 32 * corr;
        sumf += (ld_f16(x + 208) * ld_f32(y)) * (float)isum;
    }
    return sumf;
}

void kernels_register_avx512(kernel_set *ks) {
    kx_register_common(ks);
    ks->dot[GGML_TYPE_Q2_K] = dot_q2_k_512;
    ks->dot[GGML_TYPE_Q3_K] = dot_q3_k_512;
    ks->dot[GGML_TYPE_Q6_K] = dot_q6_k_512;
    ks->dot[GGML_TYPE_Q4_K] = dot_q4_k_512;
    ks->dot[GGML_TYPE_Q5_K] = dot_q5_k_512;
}

#endif
