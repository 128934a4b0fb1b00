/* Device-side codecs of the CUDA backend: every weight type as int8 groups with integer scales.
 *
 * The CPU references (formats/quant_*.c) compute each dot product per block as ONE exact integer
 * sum of the block's 16- or 32-value groups, each weighted by its integer scale (and for the
 * types with mins one integer sum of min * activation-group-sum), followed by one float step per
 * block. The device code keeps exactly that split, so that any kernel shape (a warp per row for
 * decode, int8 tensor-core tiles for prefill) produces the reference's integer sums and differs
 * from the CPU only in the order in which the per-block float terms are added.
 *
 * A "chunk" is 32 consecutive values of a block (a 256-value block has 8): dchunk<T> decodes one
 * into 8 words of four int8 values (element order), the integer scales of its two 16-value
 * groups and, for types with mins, their integer mins. dfloats<T> gives the block's float
 * factors; fw already includes the type's power-of-two final factor (IQ2: 1/8, IQ3_XXS: 1/4),
 * which commutes exactly with rounding. Activations are the CPU's encodings: Q8_K (per 256: f32
 * scale, int8 codes, 16 group sums) for 256-value types, Q8_0 (per 32: f16-rounded scale, int8
 * codes) for 32-value types, rounded f16/bf16 (kept as float) for F16/BF16, plain F32. */
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* The codec functions compile for the host too (QD): tests/gpu/test_cuda_codecs.cu checks them
 * against the CPU references on machines without a GPU. The byte intrinsics they use get
 * portable host versions; on the device they are the single instructions. */
#define QD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define QUNROLL _Pragma("unroll")
#else
#define QUNROLL
#endif
#ifndef __CUDA_ARCH__
#include <cstring>
#endif

QD uint32_t q_vsub4(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __vsub4(a, b);
#else
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= ((((a >> (8 * i)) & 0xff) - ((b >> (8 * i)) & 0xff)) & 0xffu) << (8 * i);
    return r;
#endif
}

QD uint32_t q_vadd4(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __vadd4(a, b);
#else
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= ((((a >> (8 * i)) & 0xff) + ((b >> (8 * i)) & 0xff)) & 0xffu) << (8 * i);
    return r;
#endif
}

/* bytes of {x, y} (0..7) selected by the low three bits of each selector nibble */
QD uint32_t q_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t v = (uint64_t)x | ((uint64_t)y << 32);
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
#endif
}

QD float q_bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* rounded float steps that never contract into fused multiply-adds */
QD float q_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    volatile float r = a * b;
    return r;
#endif
}
QD float q_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    volatile float r = a + b;
    return r;
#endif
}
QD float q_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    volatile float r = a - b;
    return r;
#endif
}

/* ggml type ids used on the device (formats/quant.h) */
enum {
    QT_F32 = 0, QT_F16 = 1, QT_Q4_0 = 2, QT_Q5_0 = 6, QT_Q8_0 = 8, QT_Q2_K = 10, QT_Q3_K = 11,
    QT_Q4_K = 12, QT_Q5_K = 13, QT_Q6_K = 14, QT_Q8_K = 15, QT_IQ2_XXS = 16, QT_IQ2_XS = 17,
    QT_IQ3_XXS = 18, QT_IQ4_NL = 20, QT_IQ4_XS = 23, QT_BF16 = 30, QT_MXFP4 = 39,
};

/* Lookup data of the non-linear types, copied from the CPU tables at start-up. */
struct qtables {
    int8_t kv_iq4nl[16];
    int8_t kv_mxfp4[16];
    uint8_t ksigns[128];
    uint64_t iq2xxs[256];
    uint64_t iq2xs[512];
    uint32_t iq3xxs[256];
};

/* Static facts of a weight type: values per block, bytes per block, mins, the alignment every
 * block start is guaranteed to have (block bytes' power-of-two factor, capped at 16: tensor
 * data and device copies are at least 32-byte aligned), the activation encoding. */
template <int T> struct qtraits;
#define QTRAIT(T_, B_, BYTES_, MIN_, ALIGN_, ACT_)                                               \
    template <> struct qtraits<T_> {                                                             \
        static constexpr int B = B_, BYTES = BYTES_, ALIGN = ALIGN_, ACT = ACT_;                  \
        static constexpr bool MIN = MIN_;                                                        \
    };
QTRAIT(QT_Q4_0, 32, 18, false, 2, QT_Q8_0)
QTRAIT(QT_Q5_0, 32, 22, false, 2, QT_Q8_0)
QTRAIT(QT_Q8_0, 32, 34, false, 2, QT_Q8_0)
QTRAIT(QT_IQ4_NL, 32, 18, false, 2, QT_Q8_0)
QTRAIT(QT_MXFP4, 32, 17, false, 1, QT_Q8_0)
QTRAIT(QT_Q2_K, 256, 84, true, 4, QT_Q8_K)
QTRAIT(QT_Q3_K, 256, 110, false, 2, QT_Q8_K)
QTRAIT(QT_Q4_K, 256, 144, true, 16, QT_Q8_K)
QTRAIT(QT_Q5_K, 256, 176, true, 16, QT_Q8_K)
QTRAIT(QT_Q6_K, 256, 210, false, 2, QT_Q8_K)
QTRAIT(QT_IQ2_XXS, 256, 66, false, 2, QT_Q8_K)
QTRAIT(QT_IQ2_XS, 256, 74, false, 2, QT_Q8_K)
QTRAIT(QT_IQ3_XXS, 256, 98, false, 2, QT_Q8_K)
QTRAIT(QT_IQ4_XS, 256, 136, false, 8, QT_Q8_K)
#undef QTRAIT

/* Whether both 16-value groups of every chunk share one integer scale and min (the scale is
 * per 32 values, or the type has none): the tiled products then take a chunk per MMA. */
template <int T> struct scale_per_32 {
    static constexpr bool value = qtraits<T>::B == 32 || T == QT_Q4_K || T == QT_Q5_K || T == QT_IQ4_XS ||
                                  T == QT_IQ2_XXS || T == QT_IQ3_XXS;
};

/* Expands F(T) for every quantized weight type the device supports. */
#define CUDA_QTYPES(F)                                                                           \
    F(QT_Q4_0) F(QT_Q5_0) F(QT_Q8_0) F(QT_IQ4_NL) F(QT_MXFP4) F(QT_Q2_K) F(QT_Q3_K) F(QT_Q4_K)    \
        F(QT_Q5_K) F(QT_Q6_K) F(QT_IQ2_XXS) F(QT_IQ2_XS) F(QT_IQ3_XXS) F(QT_IQ4_XS)

/* ---- loads at the alignment a type guarantees ------------------------------------------------ */

template <int A> QD uint32_t ld32(const uint8_t *p) {
    if constexpr (A >= 4) {
        return *reinterpret_cast<const uint32_t *>(p);
    } else if constexpr (A == 2) {
        const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
        return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
    } else {
        return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
               ((uint32_t)p[3] << 24);
    }
}

/* N little-endian words from 2-byte aligned p (Q6_K's 210-byte blocks put every other block at
 * 2 mod 4). On the device: N + 1 aligned 32-bit loads from the word at or below p and a funnel
 * shift each (shift 0 when p is aligned), where ld32<2> takes 2N 16-bit loads; the last word lies
 * inside the 4 bytes after p's span, which callers guarantee readable. */
template <int N> QD void ld32s_a2(const uint8_t *p, uint32_t w[N]) {
#ifdef __CUDA_ARCH__
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t *q = reinterpret_cast<const uint32_t *>(a & ~(uintptr_t)3);
    const unsigned sh = (unsigned)(a & 3) * 8;
    uint32_t prev = q[0];
#pragma unroll
    for (int i = 0; i < N; i++) {
        const uint32_t next = q[i + 1];
        w[i] = __funnelshift_r(prev, next, sh);
        prev = next;
    }
#else
    for (int i = 0; i < N; i++) w[i] = ld32<2>(p + 4 * i);
#endif
}

QD uint32_t ld16(const uint8_t *p) {
    return *reinterpret_cast<const uint16_t *>(p);
}

QD float ldf16(const uint8_t *p) {
    return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short *>(p)));
}

/* ---- byte tricks ----------------------------------------------------------------------------- */

/* Four 4-bit codes (one per byte) through a 16-entry int8 code book (four words t). */
QD uint32_t lut16(uint32_t codes, const uint32_t *t) {
    const uint32_t s = (codes & 0x7u) | ((codes >> 4) & 0x70u) | ((codes >> 8) & 0x700u) |
                       ((codes >> 12) & 0x7000u);
    const uint32_t lo = q_perm(t[0], t[1], s), hi = q_perm(t[2], t[3], s);
    const uint32_t m = ((codes >> 3) & 0x01010101u) * 0xFFu;
    return (lo & ~m) | (hi & m);
}

/* Four bits (bit j: byte j) spread to one byte each (0 or 1). */
QD uint32_t spread4(uint32_t bits) {
    return ((bits & 0xFu) * 0x00204081u) & 0x01010101u;
}

/* Negate the bytes of x (unsigned magnitudes) whose sign bit is set in the low 4 bits of sb. */
QD uint32_t apply_signs(uint32_t x, uint32_t sb) {
    const uint32_t one = spread4(sb), m = one * 0xFFu;
    return q_vadd4(x ^ m, one);
}

/* 6-bit scale and min of sub-block s (0..7) of Q4_K/Q5_K. */
QD void k4_scale_min(const uint8_t *sc, int s, int &scale, int &mn) {
    if (s < 4) {
        scale = sc[s] & 63;
        mn = sc[s + 4] & 63;
    } else {
        scale = (sc[s + 4] & 0xf) | ((sc[s - 4] >> 6) << 4);
        mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
}

QD int q3k_scale(const uint8_t *sc, int s) {
    const int lo = s < 8 ? (sc[s] & 0xf) : (sc[s - 8] >> 4);
    const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* 2^(e - 128) (MXFP4's scale, halved: its code book is doubled) */
QD float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? (0x00200000u << e) : ((uint32_t)(e - 1) << 23);
    return q_bits_float(bits);
}

QD void load_lut(const int8_t *kv, uint32_t t[4]) {
    const uint32_t *w = reinterpret_cast<const uint32_t *>(kv);
    t[0] = w[0];
    t[1] = w[1];
    t[2] = w[2];
    t[3] = w[3];
}

/* ---- chunk decoders ---------------------------------------------------------------------------
 * dchunk<T>(block, c, tables, q[8], sc[2], mn[2]): chunk c (values 32c..32c+31 of the block; 0
 * for 32-value types) as int8 words, the integer scales of its 16-value groups (1 for 32-value
 * types) and, for types with mins, the groups' integer mins. */

template <int T>
QD void dchunk(const uint8_t *b, int c, const qtables *tb, uint32_t q[8],
                                       int sc[2], int mn[2]);

template <>
QD void dchunk<QT_Q4_K>(const uint8_t *b, int c, const qtables *, uint32_t q[8],
                                                int sc[2], int mn[2]) {
    const uint8_t *qs = b + 16 + 32 * (c >> 1);
    const int sh = 4 * (c & 1);
    const uint4 v0 = *reinterpret_cast<const uint4 *>(qs), v1 = *reinterpret_cast<const uint4 *>(qs + 16);
    q[0] = (v0.x >> sh) & 0x0F0F0F0Fu; q[1] = (v0.y >> sh) & 0x0F0F0F0Fu;
    q[2] = (v0.z >> sh) & 0x0F0F0F0Fu; q[3] = (v0.w >> sh) & 0x0F0F0F0Fu;
    q[4] = (v1.x >> sh) & 0x0F0F0F0Fu; q[5] = (v1.y >> sh) & 0x0F0F0F0Fu;
    q[6] = (v1.z >> sh) & 0x0F0F0F0Fu; q[7] = (v1.w >> sh) & 0x0F0F0F0Fu;
    int s, m;
    k4_scale_min(b + 4, c, s, m);
    sc[0] = sc[1] = s;
    mn[0] = mn[1] = m;
}

template <>
QD void dchunk<QT_Q5_K>(const uint8_t *b, int c, const qtables *, uint32_t q[8],
                                                int sc[2], int mn[2]) {
    const uint8_t *qh = b + 16, *qs = b + 48 + 32 * (c >> 1);
    const int sh = 4 * (c & 1);
QUNROLL
    for (int w = 0; w < 8; w++) {
        const uint32_t lo = (ld32<4>(qs + 4 * w) >> sh) & 0x0F0F0F0Fu;
        const uint32_t hi = (ld32<4>(qh + 4 * w) >> c) & 0x01010101u;
        q[w] = lo | (hi << 4);
    }
    int s, m;
    k4_scale_min(b + 4, c, s, m);
    sc[0] = sc[1] = s;
    mn[0] = mn[1] = m;
}

template <>
QD void dchunk<QT_Q6_K>(const uint8_t *b, int c, const qtables *, uint32_t q[8],
                                                int sc[2], int mn[2]) {
    const int h = c >> 2, a = c & 3;
    /* ql: 32 bytes at 0, 32, 64 or 96, qh at 128 or 160: the word after each span is still in
     * the block (at most byte 195 of 210), as ld32s_a2 needs */
    const uint8_t *ql = b + 64 * h + 32 * (a & 1), *qh = b + 128 + 32 * h;
    uint32_t lw[8], hw[8];
    ld32s_a2<8>(ql, lw);
    ld32s_a2<8>(qh, hw);
QUNROLL
    for (int w = 0; w < 8; w++) {
        const uint32_t lo = (lw[w] >> (4 * (a >> 1))) & 0x0F0F0F0Fu;
        const uint32_t hi = ((hw[w] >> (2 * a)) & 0x03030303u) << 4;
        q[w] = q_vsub4(lo | hi, 0x20202020u);
    }
    sc[0] = (int8_t)b[192 + 2 * c];
    sc[1] = (int8_t)b[192 + 2 * c + 1];
    mn[0] = mn[1] = 0;
}

template <>
QD void dchunk<QT_Q3_K>(const uint8_t *b, int c, const qtables *, uint32_t q[8],
                                                int sc[2], int mn[2]) {
    const uint8_t *hm = b, *qs = b + 32 + 32 * (c >> 2);
    const int sh = 2 * (c & 3);
QUNROLL
    for (int w = 0; w < 8; w++) {
        const uint32_t q2 = (ld32<2>(qs + 4 * w) >> sh) & 0x03030303u;
        const uint32_t hb = (ld32<2>(hm + 4 * w) >> c) & 0x01010101u;
        q[w] = q_vsub4(q2 | (hb << 2), 0x04040404u);
    }
    sc[0] = q3k_scale(b + 96, 2 * c);
    sc[1] = q3k_scale(b + 96, 2 * c + 1);
    mn[0] = mn[1] = 0;
}

template <>
QD void dchunk<QT_Q2_K>(const uint8_t *b, int c, const qtables *, uint32_t q[8],
                                                int sc[2], int mn[2]) {
    const uint8_t *qs = b + 16 + 32 * (c >> 2);
    const int sh = 2 * (c & 3);
QUNROLL
    for (int w = 0; w < 8; w++) q[w] = (ld32<4>(qs + 4 * w) >> sh) & 0x03030303u;
    const uint8_t s0 = b[2 * c], s1 = b[2 * c + 1];
    sc[0] = s0 & 0xf;
    sc[1] = s1 & 0xf;
    mn[0] = s0 >> 4;
    mn[1] = s1 >> 4;
}

template <>
QD void dchunk<QT_IQ4_XS>(const uint8_t *b, int c, const qtables *tb,
                                                  uint32_t q[8], int sc[2], int mn[2]) {
    uint32_t t[4];
    load_lut(tb->kv_iq4nl, t);
    const uint8_t *qs = b + 8 + 16 * c;
QUNROLL
    for (int w = 0; w < 4; w++) {
        const uint32_t v = ld32<8>(qs + 4 * w);
        q[w] = lut16(v & 0x0F0F0F0Fu, t);
        q[w + 4] = lut16((v >> 4) & 0x0F0F0F0Fu, t);
    }
    const int lo = (b[4 + c / 2] >> (4 * (c % 2))) & 0xf;
    const int hi = (ld16(b + 2) >> (2 * c)) & 3;
    sc[0] = sc[1] = (lo | (hi << 4)) - 32;
    mn[0] = mn[1] = 0;
}

template <>
QD void dchunk<QT_IQ2_XS>(const uint8_t *b, int c, const qtables *tb,
                                                  uint32_t q[8], int sc[2], int mn[2]) {
QUNROLL
    for (int l = 0; l < 4; l++) {
        const uint32_t v = ld16(b + 2 + 2 * (4 * c + l));
        const uint64_t g = tb->iq2xs[v & 511];
        const uint32_t s = tb->ksigns[v >> 9];
        q[2 * l] = apply_signs((uint32_t)g, s);
        q[2 * l + 1] = apply_signs((uint32_t)(g >> 32), s >> 4);
    }
    const uint8_t s = b[66 + c];
    sc[0] = 2 * (s & 0xf) + 1;
    sc[1] = 2 * (s >> 4) + 1;
    mn[0] = mn[1] = 0;
}

template <>
QD void dchunk<QT_IQ2_XXS>(const uint8_t *b, int c, const qtables *tb,
                                                   uint32_t q[8], int sc[2], int mn[2]) {
    const uint8_t *p = b + 2 + 8 * c;
    const uint32_t a0 = ld32<2>(p), a1 = ld32<2>(p + 4);
QUNROLL
    for (int l = 0; l < 4; l++) {
        const uint64_t g = tb->iq2xxs[(a0 >> (8 * l)) & 0xff];
        const uint32_t s = tb->ksigns[(a1 >> (7 * l)) & 127];
        q[2 * l] = apply_signs((uint32_t)g, s);
        q[2 * l + 1] = apply_signs((uint32_t)(g >> 32), s >> 4);
    }
    sc[0] = sc[1] = 2 * (int)(a1 >> 28) + 1;
    mn[0] = mn[1] = 0;
}

template <>
QD void dchunk<QT_IQ3_XXS>(const uint8_t *b, int c, const qtables *tb,
                                                   uint32_t q[8], int sc[2], int mn[2]) {
    const uint8_t *qs = b + 2 + 8 * c;
    const uint32_t ss = ld32<2>(b + 66 + 4 * c);
QUNROLL
    for (int l = 0; l < 4; l++) {
        const uint32_t s = tb->ksigns[(ss >> (7 * l)) & 127];
        q[2 * l] = apply_signs(tb->iq3xxs[qs[2 * l]], s);
        q[2 * l + 1] = apply_signs(tb->iq3xxs[qs[2 * l + 1]], s >> 4);
    }
    sc[0] = sc[1] = 2 * (int)(ss >> 28) + 1;
    mn[0] = mn[1] = 0;
}

template <>
QD void dchunk<QT_Q8_0>(const uint8_t *b, int, const qtables *, uint32_t q[8],
                                                int sc[2], int mn[2]) {
QUNROLL
    for (int w = 0; w < 8; w++) q[w] = ld32<2>(b + 2 + 4 * w);
    sc[0] = sc[1] = 1;
    mn[0] = mn[1] = 0;
}

template <>
QD void dchunk<QT_Q4_0>(const uint8_t *b, int, const qtables *, uint32_t q[8],
                                                int sc[2], int mn[2]) {
QUNROLL
    for (int w = 0; w < 4; w++) {
        const uint32_t v = ld32<2>(b + 2 + 4 * w);
        q[w] = q_vsub4(v & 0x0F0F0F0Fu, 0x08080808u);
        q[w + 4] = q_vsub4((v >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    }
    sc[0] = sc[1] = 1;
    mn[0] = mn[1] = 0;
}

template <>
QD void dchunk<QT_Q5_0>(const uint8_t *b, int, const qtables *, uint32_t q[8],
                                                int sc[2], int mn[2]) {
    const uint32_t qh = ld32<2>(b + 2);
QUNROLL
    for (int w = 0; w < 4; w++) {
        const uint32_t v = ld32<2>(b + 6 + 4 * w);
        const uint32_t h0 = spread4(qh >> (4 * w)) << 4, h1 = spread4(qh >> (16 + 4 * w)) << 4;
        q[w] = q_vsub4((v & 0x0F0F0F0Fu) | h0, 0x10101010u);
        q[w + 4] = q_vsub4(((v >> 4) & 0x0F0F0F0Fu) | h1, 0x10101010u);
    }
    sc[0] = sc[1] = 1;
    mn[0] = mn[1] = 0;
}

template <>
QD void dchunk<QT_IQ4_NL>(const uint8_t *b, int, const qtables *tb, uint32_t q[8],
                                                  int sc[2], int mn[2]) {
    uint32_t t[4];
    load_lut(tb->kv_iq4nl, t);
QUNROLL
    for (int w = 0; w < 4; w++) {
        const uint32_t v = ld32<2>(b + 2 + 4 * w);
        q[w] = lut16(v & 0x0F0F0F0Fu, t);
        q[w + 4] = lut16((v >> 4) & 0x0F0F0F0Fu, t);
    }
    sc[0] = sc[1] = 1;
    mn[0] = mn[1] = 0;
}

template <>
QD void dchunk<QT_MXFP4>(const uint8_t *b, int, const qtables *tb, uint32_t q[8],
                                                 int sc[2], int mn[2]) {
    uint32_t t[4];
    load_lut(tb->kv_mxfp4, t);
QUNROLL
    for (int w = 0; w < 4; w++) {
        const uint32_t v = ld32<1>(b + 1 + 4 * w);
        q[w] = lut16(v & 0x0F0F0F0Fu, t);
        q[w + 4] = lut16((v >> 4) & 0x0F0F0F0Fu, t);
    }
    sc[0] = sc[1] = 1;
    mn[0] = mn[1] = 0;
}

/* Block float factors: fw (times the type's final power-of-two factor) and fm (mins). */
template <int T> QD void dfloats(const uint8_t *b, float &fw, float &fm) {
    fm = 0.0f;
    if constexpr (T == QT_Q4_K || T == QT_Q5_K) {
        fw = ldf16(b);
        fm = ldf16(b + 2);
    } else if constexpr (T == QT_Q2_K) {
        fw = ldf16(b + 80);
        fm = ldf16(b + 82);
    } else if constexpr (T == QT_Q3_K) {
        fw = ldf16(b + 108);
    } else if constexpr (T == QT_Q6_K) {
        fw = ldf16(b + 208);
    } else if constexpr (T == QT_IQ2_XS || T == QT_IQ2_XXS) {
        fw = ldf16(b) * 0.125f;
    } else if constexpr (T == QT_IQ3_XXS) {
        fw = ldf16(b) * 0.25f;
    } else if constexpr (T == QT_MXFP4) {
        fw = e8m0_half(b[0]);
    } else {
        fw = ldf16(b);
    }
}

/* One block's float term from its exact integer sums (the reference's float step). */
template <int T>
QD float block_term(float fw, float fm, float da, int isum, int msum) {
    const float a = q_mul(q_mul(fw, da), (float)isum);
    if constexpr (qtraits<T>::MIN) return q_sub(a, q_mul(q_mul(fm, da), (float)msum));
    else return a;
}

/* ---- dequantization of single values (embedding rows), the CPU decoders' float steps ---------- */

template <int T> __host__ __device__ float dequant_value(const uint8_t *row, int64_t i, const qtables *tb);

#define DQ_BLOCK()                                                                               \
    const uint8_t *b = row + (i / qtraits<T>::B) * qtraits<T>::BYTES;                           \
    const int j = (int)(i % qtraits<T>::B);                                                      \
    uint32_t q[8];                                                                               \
    int sc[2], mn[2];                                                                            \
    dchunk<T>(b, j / 32, tb, q, sc, mn);                                                         \
    const int v = (int8_t)(q[(j % 32) / 4] >> (8 * (j % 4)));                                    \
    const int g = (j % 32) / 16;                                                                 \
    (void)g;                                                                                     \
    (void)mn;

template <int T> __host__ __device__ float dequant_value(const uint8_t *row, int64_t i, const qtables *tb) {
    DQ_BLOCK()
    if constexpr (T == QT_Q4_K || T == QT_Q5_K || T == QT_Q2_K) {
        float d, dm;
        dfloats<T>(b, d, dm);
        return q_sub(q_mul(q_mul(d, (float)sc[g]), (float)v), q_mul(dm, (float)mn[g]));
    } else if constexpr (T == QT_Q3_K || T == QT_Q6_K || T == QT_IQ4_XS) {
        float d, dm;
        dfloats<T>(b, d, dm);
        return q_mul(q_mul(d, (float)sc[g]), (float)v);
    } else if constexpr (T == QT_IQ2_XS || T == QT_IQ2_XXS || T == QT_IQ3_XXS) {
        /* CPU: d * (0.5 + ls) * k * grid * sign with k = 1/4 (IQ2) or 1/2 (IQ3_XXS), ls = (sc-1)/2 */
        const float d = ldf16(b), k = T == QT_IQ3_XXS ? 0.5f : 0.25f;
        const float db = q_mul(q_mul(d, q_add(0.5f, (float)((sc[g] - 1) / 2))), k);
        return q_mul(q_mul(db, (float)(v < 0 ? -v : v)), v < 0 ? -1.0f : 1.0f);
    } else if constexpr (T == QT_Q8_0 || T == QT_Q4_0 || T == QT_Q5_0) {
        return q_mul((float)v, ldf16(b));
    } else if constexpr (T == QT_IQ4_NL) {
        return q_mul(ldf16(b), (float)v);
    } else {
        return q_mul((float)v, e8m0_half(b[0]));
    }
}
#undef DQ_BLOCK
