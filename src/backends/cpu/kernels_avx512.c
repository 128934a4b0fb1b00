/* AVX-512 kernels (F, BW, VL, DQ, VNNI): the shared 256-bit code of kernels_x86.inc with the
 * u8 x s8 dot done by VNNI's vpdpbusd (no int16 intermediate), plus 512-bit versions of the
 * hottest kernels. Compiled alone with the AVX-512 -m flags (CMakeLists.txt); kernels.c calls
 * it only after cpuid and xgetbv confirmed them. */
#if defined(__x86_64__)

#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))

#include "backends/cpu/kernels_x86.inc"

void kernels_register_avx512(kernel_set *ks) { kx_register_common(ks); }

#endif
