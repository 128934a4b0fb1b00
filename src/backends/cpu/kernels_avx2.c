/* AVX2 (+F16C) kernels: the shared 256-bit code of kernels_x86.inc with the u8 x s8 dot done by
 * maddubs (pairs into int16; every caller keeps pair sums below 2^15) and madd with ones. This
 * file alone is compiled with -mavx2 -mf16c (CMakeLists.txt); kernels.c calls it only after
 * cpuid and xgetbv confirmed both. */
#if defined(__x86_64__)

#define DPBUSD(acc, u, s) \
    _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1)))

#include "backends/cpu/kernels_x86.inc"

void kernels_register_avx2(kernel_set *ks) {
    kx_register_common(ks);
    kernels_register_avx2_krows(ks); /* the K-quants' products: eight rows a reduction */
    kernels_register_avx2_b32(ks);   /* Q8_0's, the same way */
    kernels_register_avx2_attn(ks);  /* prefill attention: tiles for a block of tokens and heads */
}

#endif
