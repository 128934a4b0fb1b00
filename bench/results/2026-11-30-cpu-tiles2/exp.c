#include "backends/cpu/kernels_avx512.c"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static uint64_t rs=88172645463325252ull; static uint32_t rnd(void){rs^=rs<<13;rs^=rs>>7;rs^=rs<<17;return (uint32_t)rs;}
/* F bits: 1 skip float step, 2 skip unpack (after first), 4 skip mullo, 8 skip dpbusd loop */
static inline __attribute__((always_inline)) void pairx(const k45_row8 *rw, int R, const uint8_t *blk0, const uint8_t *blk1, __m512 *acc0, __m512 *acc1, int stride, int F) {
    const int32_t *q0 = (const int32_t *)rw[0].q, *q1 = (const int32_t *)rw[1].q, *q2 = (const int32_t *)rw[2].q, *q3 = (const int32_t *)rw[3].q;
    const __m512i *A0 = (const __m512i *)blk0, *A1 = (const __m512i *)blk1;
    __m512i i00 = _mm512_setzero_si512(), i10 = i00, i20 = i00, i30 = i00, i01 = i00, i11 = i00, i21 = i00, i31 = i00;
    for (int sub = 0; sub < 8; sub++) {
        __m512i p00 = _mm512_setzero_si512(), p10 = p00, p20 = p00, p30 = p00, p01 = p00, p11 = p00, p21 = p00, p31 = p00;
        if (!(F & 8)) for (int i = 8 * sub; i < 8 * sub + 8; i++) {
            const __m512i a0 = _mm512_load_si512(A0 + i), a1 = _mm512_load_si512(A1 + i);
            __m512i b = _mm512_set1_epi32(q0[i]);
            p00 = _mm512_dpbusd_epi32(p00, b, a0); p01 = _mm512_dpbusd_epi32(p01, b, a1);
            b = _mm512_set1_epi32(q1[i]);
            p10 = _mm512_dpbusd_epi32(p10, b, a0); p11 = _mm512_dpbusd_epi32(p11, b, a1);
            b = _mm512_set1_epi32(q2[i]);
            p20 = _mm512_dpbusd_epi32(p20, b, a0); p21 = _mm512_dpbusd_epi32(p21, b, a1);
            b = _mm512_set1_epi32(q3[i]);
            p30 = _mm512_dpbusd_epi32(p30, b, a0); p31 = _mm512_dpbusd_epi32(p31, b, a1);
        }
        if (F & 4) {
            i00 = _mm512_add_epi32(i00, p00); i01 = _mm512_add_epi32(i01, p01); i10 = _mm512_add_epi32(i10, p10); i11 = _mm512_add_epi32(i11, p11);
            i20 = _mm512_add_epi32(i20, p20); i21 = _mm512_add_epi32(i21, p21); i30 = _mm512_add_epi32(i30, p30); i31 = _mm512_add_epi32(i31, p31);
        } else {
        const __m512i s0 = _mm512_set1_epi32(rw[0].sc[sub]), s1 = _mm512_set1_epi32(rw[1].sc[sub]), s2 = _mm512_set1_epi32(rw[2].sc[sub]), s3 = _mm512_set1_epi32(rw[3].sc[sub]);
        i00 = _mm512_add_epi32(i00, _mm512_mullo_epi32(p00, s0)); i01 = _mm512_add_epi32(i01, _mm512_mullo_epi32(p01, s0));
        i10 = _mm512_add_epi32(i10, _mm512_mullo_epi32(p10, s1)); i11 = _mm512_add_epi32(i11, _mm512_mullo_epi32(p11, s1));
        i20 = _mm512_add_epi32(i20, _mm512_mullo_epi32(p20, s2)); i21 = _mm512_add_epi32(i21, _mm512_mullo_epi32(p21, s2));
        i30 = _mm512_add_epi32(i30, _mm512_mullo_epi32(p30, s3)); i31 = _mm512_add_epi32(i31, _mm512_mullo_epi32(p31, s3));
        }
    }
    const __m512i isum0[4] = {i00, i10, i20, i30}, isum1[4] = {i01, i11, i21, i31};
    if (F & 1) {
        for (int r = 0; r < 4; r++) { acc0[r*stride] = _mm512_add_ps(acc0[r*stride], _mm512_castsi512_ps(isum0[r])); acc1[r*stride] = _mm512_add_ps(acc1[r*stride], _mm512_castsi512_ps(isum1[r])); }
    } else {
        k45_float(rw, R, blk0, isum0, acc0, stride);
        k45_float(rw, R, blk1, isum1, acc1, stride);
    }
}
static void runx(int64_t n, const uint8_t *w, size_t ws, int rows, const uint8_t *packed, int toks, float *out, size_t os, int F) {
    const int64_t nsb = n / QK_K; const int ntb = (toks + 15) / 16; const int bytes = 144;
    __m512 acc[4][TB_CHUNK]; k45_row8 rw[4];
    for (int r = 0; r < 4; r++) unpack_k45_8(w + (size_t)r * ws, &rw[r], 16, 0);
    for (int r0 = 0; r0 < rows; r0 += 4) {
        for (int r = 0; r < 4; r++) for (int k = 0; k < ntb; k++) acc[r][k] = _mm512_setzero_ps();
        for (int64_t sb = 0; sb < nsb; sb++) {
            prefetch_next_rows(w, ws, r0 + 4, rows, (size_t)sb * (size_t)bytes, bytes);
            if (!(F & 2)) for (int r = 0; r < 4; r++) unpack_k45_8(w + (size_t)(r0 + r) * ws + (size_t)sb * (size_t)bytes, &rw[r], 16, 0);
            if (F & 16) { static k45_row8 dummy[4]; for (int r = 0; r < 4; r++) unpack_k45_8(w + (size_t)(r0 + r) * ws + (size_t)sb * (size_t)bytes, &dummy[r], 16, 0); __asm__ volatile("" ::: "memory"); }
            for (int tb = 0; tb + 1 < ntb; tb += 2)
                pairx(rw, 4, packed + ((size_t)tb * (size_t)nsb + (size_t)sb) * SB_PACK8, packed + ((size_t)(tb + 1) * (size_t)nsb + (size_t)sb) * SB_PACK8, &acc[0][tb], &acc[0][tb + 1], TB_CHUNK, F);
        }
        tile_store(acc, 4, r0, 0, ntb, toks, out, os);
    }
}
#define V(F) static void run##F(int64_t n, const uint8_t *w, size_t ws, int rows, const uint8_t *p, int toks, float *o, size_t os) { runx(n,w,ws,rows,p,toks,o,os,F); }
V(0) V(1) V(2) V(4) V(8) V(3) V(7) V(15) V(18)
int main(int argc, char **argv) {
  int T = argc > 2 ? atoi(argv[2]) : 32; int64_t n = 2048; int rows = 768, E = argc > 1 ? atoi(argv[1]) : 1;
  size_t rb = 1152, eb = rb * rows; uint8_t *w = aligned_alloc(64, eb * E);
  for (size_t i = 0; i < eb * E; i += 4) { uint32_t v = rnd(); memcpy(w + i, &v, 4); }
  for (size_t off = 0; off < eb * E; off += 144) { uint16_t h = 0x2000; memcpy(w + off, &h, 2); memcpy(w + off + 2, &h, 2); }
  float *a = malloc(sizeof(float) * n * T); for (int64_t i = 0; i < n * T; i++) a[i] = (rnd() % 2001 - 1000) * 1e-3f;
  size_t ab = 292 * (n / 256); uint8_t *aq = malloc(ab * T); for (int t = 0; t < T; t++) quant_quantize_q8_k(a + n * t, aq + ab * t, n);
  void *pk = aligned_alloc(64, (q8k_packed_bytes8(n, T) + 63) / 64 * 64); q8k_pack8(n, aq, ab, T, 0, T, pk);
  float *out = malloc(sizeof(float) * rows * T);
  struct { const char *name; void (*f)(int64_t, const uint8_t *, size_t, int, const uint8_t *, int, float *, size_t); } vs[] = {
    {"full", run0}, {"-float", run1}, {"-unpack", run2}, {"-mullo", run4}, {"-dpbusd", run8}, {"-float-unpack", run3}, {"-float-unpack-mullo", run7}, {"nothing", run15}, {"unpack-to-dummy", run18}, {"real", tile_q4_k8_run}};
  for (int v = 0; v < 10; v++) {
    double best = 1e9;
    for (int rep = 0; rep < 30; rep++) { double t0 = now(); for (int e = 0; e < E; e++) vs[v].f(n, w + eb * e, rb, rows, pk, T, out, rows); double dt = now() - t0; if (dt < best) best = dt; }
    printf("%-22s %7.1f GOP/s  %6.1f us/expert\n", vs[v].name, 2.0 * n * rows * T * E / best / 1e9, best / E * 1e6);
  }
}
