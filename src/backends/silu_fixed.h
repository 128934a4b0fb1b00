/* SwiGLU's gate, silu(g) * u = g / (1 + exp(-g)) * u, with an exponential made of IEEE
 * operations alone, so that C on the host and CUDA on the device compute the same bits.
 *
 * Why: CUDA's expf uses the hardware's approximate 2^x (ex2.approx), whose results no host can
 * reproduce, and libm's expf differs from it in the last bit for some inputs. The CUDA backend's
 * SwiGLU uses this function, and the host computes some of a streamed layer's experts with it
 * (backends/cpu/device_rows.c: the GPU's products in the GPU's order) bit for bit.
 *
 * The exponential: Cody-Waite reduction by ln 2 (n = rint(x log2 e), r = x - n ln2_hi - n ln2_lo),
 * a degree-7 Taylor polynomial in Horner form (separate multiplies and adds, never fused), scaled
 * by 2^n built from its exponent bits; 0 below -87, +inf above 88 (where silu's quotient is
 * below 1e-36 in magnitude anyway). Relative error about 1e-7 over the range (one or two ulps).
 * C callers must compile without FP contraction (the build's -ffp-contract=off); on the device
 * every step is an explicitly rounded intrinsic. */
#ifndef SLUICE_SILU_FIXED_H
#define SLUICE_SILU_FIXED_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define SF_FN static __host__ __device__ __forceinline__
#else
#define SF_FN static inline
#endif

#if defined(__CUDA_ARCH__)
#define SF_MUL(a, b) __fmul_rn(a, b)
#define SF_ADD(a, b) __fadd_rn(a, b)
#define SF_SUB(a, b) __fsub_rn(a, b)
#define SF_DIV(a, b) __fdiv_rn(a, b)
#else
#define SF_MUL(a, b) ((a) * (b))
#define SF_ADD(a, b) ((a) + (b))
#define SF_SUB(a, b) ((a) - (b))
#define SF_DIV(a, b) ((a) / (b))
#endif

SF_FN float silu_fixed_exp(float x) {
    if (!(x >= -87.0f)) return 0.0f;
    if (x > 88.0f) return INFINITY;
    const float n = rintf(SF_MUL(x, 1.44269504f)); /* round half to even, exact on both sides */
    const float r = SF_SUB(SF_SUB(x, SF_MUL(n, 0.693145751953125f)), SF_MUL(n, 1.42860677e-06f));
    float p = 1.0f / 5040.0f;
    p = SF_ADD(SF_MUL(p, r), 1.0f / 720.0f);
    p = SF_ADD(SF_MUL(p, r), 1.0f / 120.0f);
    p = SF_ADD(SF_MUL(p, r), 1.0f / 24.0f);
    p = SF_ADD(SF_MUL(p, r), 1.0f / 6.0f);
    p = SF_ADD(SF_MUL(p, r), 0.5f);
    p = SF_ADD(SF_MUL(p, r), 1.0f);
    p = SF_ADD(SF_MUL(p, r), 1.0f);
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* n in -126..127 here */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return SF_MUL(p, scale);
}

/* silu(g) * u: the quotient rounded, then the product (the CPU backend's order of operations). */
SF_FN float silu_fixed_mul(float g, float u) {
    return SF_MUL(SF_DIV(g, SF_ADD(1.0f, silu_fixed_exp(-g))), u);
}

#endif
