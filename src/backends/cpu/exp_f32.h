/* The CPU backend's float exponential: glibc's expf (2.28 and later, the variant its ifunc picks
 * on processors with FMA, __expf_fma) written out in portable C, so that every operation that
 * takes an exponential (SwiGLU, sigmoid gates, SiLU) has one definition that vector kernels can
 * reproduce lane by lane, and that does not change with the C library or the processor (libm's
 * expf rounds two steps apart where the CPU has no FMA).
 *
 * The method (the published algorithm of glibc's sysdeps/ieee754/flt-32/e_expf.c, N = 32):
 *   k = round(x * N / ln 2), r = x * N / ln 2 - k (both from fused multiply-adds in double),
 *   exp(x) = 2^(k / N) * (C2 r^3 + C1 r^2 + C0 r + 1) in double, rounded once to float;
 *   2^(k / N) = the table entry T[k mod N] (2^(i/N) correctly rounded, less i << 47) plus k << 47
 *   in the exponent bits.
 * Equal to this host's libm expf for all 2^32 inputs (Debian glibc 2.36, checked exhaustively on
 * 2026-12-05; tests/unit/test_kernels.c checks a few million and the special values).
 * Special inputs as glibc: -inf -> 0, NaN -> NaN, above 0x1.62e42ep6 -> inf, below
 * -0x1.9fe368p6 -> 0, in [-0x1.9fe368p6, -0x1.9d1d9ep6) -> the smallest subnormal. */
#ifndef SLUICE_EXP_F32_H
#define SLUICE_EXP_F32_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define EXP_F32_INV_LN2_N 0x1.71547652b82fep+5 /* 32 / ln 2 */
#define EXP_F32_SHIFT 0x1.8p52                 /* adds round a double to an integer in its low bits */
#define EXP_F32_C0 0x1.c6af84b912394p-20       /* the polynomial's r^3, r^2 and r coefficients */
#define EXP_F32_C1 0x1.ebfce50fac4f3p-13
#define EXP_F32_C2 0x1.62e42ff0c52d6p-6
/* |x| from 88 on (and NaN) takes the special cases: the bits above a float's top 12 */
#define EXP_F32_BIG_TOP 0x42bu

extern const uint64_t exp_f32_table[32];

/* The special inputs (|x| >= 88 or NaN): what glibc returns for them. */
static inline float exp_f32_special(float x) {
    uint32_t ix;
    memcpy(&ix, &x, sizeof ix);
    if (ix == 0xff800000u) return 0.0f;
    if (((ix >> 20) & 0x7ffu) >= 0x7f8u) return x + x;
    if (x > 0x1.62e42ep6f) return INFINITY;
    if (x < -0x1.9fe368p6f) return 0.0f;
    if (x < -0x1.9d1d9ep6f) return 0x1p-149f;
    return -1.0f; /* not special */
}

static inline float exp_f32(float x) {
    uint32_t ix;
    memcpy(&ix, &x, sizeof ix);
    if (((ix >> 20) & 0x7ffu) >= EXP_F32_BIG_TOP) {
        const float s = exp_f32_special(x);
        if (s >= 0.0f || s != s) return s;
    }
    const double xd = x;
    double kd = fma(EXP_F32_INV_LN2_N, xd, EXP_F32_SHIFT);
    uint64_t ki;
    memcpy(&ki, &kd, sizeof ki);
    kd -= EXP_F32_SHIFT;
    const double r = fma(EXP_F32_INV_LN2_N, xd, -kd);
    const uint64_t t = exp_f32_table[ki & 31] + (ki << 47);
    double s;
    memcpy(&s, &t, sizeof s);
    const double z = fma(EXP_F32_C0, r, EXP_F32_C1);
    const double r2 = r * r;
    double y = fma(r, EXP_F32_C2, 1.0);
    y = fma(z, r2, y);
    return (float)(y * s);
}

#endif
