/* The RMSNorm and L2-norm row steps. Sums of squares of rows in double precision, in ggml's order for RMSNorm and the L2 norm: each
 * value squared in float, the squares added to a double running sum in index order. That order
 * is a chain of dependent double additions (4 cycles each on the x86 cores measured), so one row
 * at a time ran at a quarter of the adder's rate; here up to eight rows advance together, eight
 * independent chains, each row's additions still in its own order: the same bits. */
#ifndef SLUICE_SUMSQ_ROWS_H
#define SLUICE_SUMSQ_ROWS_H

#include <stddef.h>
#include <string.h>

#define SUMSQ_ROWS 8 /* rows advanced together */

/* out[r] = sum over i of (double)(x[r * stride + i]^2), for rows r < n (n <= SUMSQ_ROWS). The eight
 * sums are named variables: as an array, gcc vectorized the row loop and kept the array in
 * memory, a store and a reload per value (slower than one row at a time). */
static inline void sumsq_rows(const float *x, size_t stride, int n, int dim, double *out) {
    if (n == SUMSQ_ROWS) {
        const float *x0 = x, *x1 = x + stride, *x2 = x + 2 * stride, *x3 = x + 3 * stride;
        const float *x4 = x + 4 * stride, *x5 = x + 5 * stride, *x6 = x + 6 * stride, *x7 = x + 7 * stride;
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0, s4 = 0.0, s5 = 0.0, s6 = 0.0, s7 = 0.0;
        for (int i = 0; i < dim; i++) {
            s0 += (double)(x0[i] * x0[i]);
            s1 += (double)(x1[i] * x1[i]);
            s2 += (double)(x2[i] * x2[i]);
            s3 += (double)(x3[i] * x3[i]);
            s4 += (double)(x4[i] * x4[i]);
            s5 += (double)(x5[i] * x5[i]);
            s6 += (double)(x6[i] * x6[i]);
            s7 += (double)(x7[i] * x7[i]);
        }
        out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3, out[4] = s4, out[5] = s5, out[6] = s6, out[7] = s7;
        return;
    }
    for (int k = 0; k < n; k++) {
        const float *xr = x + (size_t)k * stride;
        double s = 0.0;
        for (int i = 0; i < dim; i++) s += (double)(xr[i] * xr[i]);
        out[k] = s;
    }
}

/* y[i] = (x[i] * s) * w[i] (w NULL: x[i] * s), the norms' last step, four values at a time by
 * the compiler's vector extension (gcc -O2 left the loop scalar: it would have to check that y
 * does not overlap x or w). Element by element the same two float products; y may be x. */
typedef float sumsq_v4 __attribute__((vector_size(16)));

static inline void scale_row(float *y, const float *x, const float *w, float s, int dim) {
    const sumsq_v4 vs = {s, s, s, s};
    int i = 0;
    for (; i + 4 <= dim; i += 4) {
        sumsq_v4 v;
        memcpy(&v, x + i, sizeof v);
        v *= vs;
        if (w) {
            sumsq_v4 vw;
            memcpy(&vw, w + i, sizeof vw);
            v *= vw;
        }
        memcpy(y + i, &v, sizeof v);
    }
    for (; i < dim; i++) y[i] = w ? (x[i] * s) * w[i] : x[i] * s;
}

#endif
