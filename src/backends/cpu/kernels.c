/* Kernel selection. The scalar references live with the codecs; vectorized versions are
 * registered here per instruction set. */
#include "backends/cpu/kernels.h"

kernel_dot_fn kernel_dot(uint32_t type) {
    const quant_traits *qt = quant_traits_of(type);
    return qt ? qt->dot : 0;
}

float kernel_dot_f32(int64_t n, const float *a, const float *b) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
