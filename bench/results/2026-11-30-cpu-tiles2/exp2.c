#include "backends/cpu/kernels_avx512.c"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static uint64_t rs=88172645463325252ull; static uint32_t rnd(void){rs^=rs<<13;rs^=rs>>7;rs^=rs<<17;return (uint32_t)rs;}
static int PFM;
static int gahead0(int m) { return m == 4 ? 8 : m == 5 ? 16 : m == 6 ? 4 : 32; }
static void runp(int64_t n, const uint8_t *w, size_t ws, int rows, const uint8_t *packed, int toks, float *out, size_t os) {
    const int64_t nsb = n / QK_K; const int ntb = (toks + 15) / 16; const int bytes = 144;
    __m512 acc[4][TB_CHUNK]; k45_row8 rw[4];
    if (PFM >= 4) for (int r = 0; r < gahead0(PFM) && r < rows; r++) for (int b = 0; b < (int)ws; b += 64) _mm_prefetch((const char *)w + r * ws + b, _MM_HINT_T1);
    for (int r0 = 0; r0 < rows; r0 += 4) {
        for (int r = 0; r < 4; r++) for (int k = 0; k < ntb; k++) acc[r][k] = _mm512_setzero_ps();
        static const int gahead[8] = {0, 0, 0, 0, 8, 16, 4, 32};
        if (PFM >= 4) /* the group ahead, whole rows, to L2 */
            for (int r = r0 + gahead[PFM]; r < r0 + gahead[PFM] + 4 && r < rows; r++) for (int b = 0; b < (int)ws; b += 64) _mm_prefetch((const char *)w + r * ws + b, _MM_HINT_T1);
        for (int64_t sb = 0; sb < nsb; sb++) {
            if (PFM == 0) prefetch_next_rows(w, ws, r0 + 4, rows, (size_t)sb * bytes, bytes);
            else if (PFM == 1) { if (sb + 2 < nsb) prefetch_next_rows(w, ws, r0, rows, (size_t)(sb + 2) * bytes, bytes); else prefetch_next_rows(w, ws, r0 + 4, rows, (size_t)(sb + 2 - nsb) * bytes, bytes); }
            else if (PFM == 2) { int64_t s2 = sb + 4; int g = r0; if (s2 >= nsb) { s2 -= nsb; g += 4; } prefetch_next_rows(w, ws, g, rows, (size_t)s2 * bytes, bytes); }
            else if (PFM == 3) { prefetch_next_rows(w, ws, r0 + 8, rows, (size_t)sb * bytes, bytes); }
            else if (PFM >= 4) { if (sb + 2 < nsb) prefetch_next_rows(w, ws, r0, rows, (size_t)(sb + 2) * bytes, bytes); else prefetch_next_rows(w, ws, r0 + 4, rows, (size_t)(sb + 2 - nsb) * bytes, bytes); }
            for (int r = 0; r < 4; r++) unpack_k45_8(w + (size_t)(r0 + r) * ws + (size_t)sb * bytes, &rw[r], 16, 0);
            int tb = 0;
            for (; tb + 1 < ntb; tb += 2) k45_pair(rw, 4, packed + ((size_t)tb * nsb + sb) * SB_PACK8, packed + ((size_t)(tb + 1) * nsb + sb) * SB_PACK8, &acc[0][tb], &acc[0][tb + 1], TB_CHUNK, 0);
            if (tb < ntb) k45_single(rw, 4, packed + ((size_t)tb * nsb + sb) * SB_PACK8, &acc[0][tb], TB_CHUNK, 0);
        }
        tile_store(acc, 4, r0, 0, ntb, toks, out, os);
    }
}
int main(int argc, char **argv) {
  int T = argc > 1 ? atoi(argv[1]) : 16; int E = argc > 2 ? atoi(argv[2]) : 256;
  int64_t n = 2048; int rows = 768; size_t rb = 1152, eb = rb * rows;
  uint8_t *w = aligned_alloc(64, eb * E);
  for (size_t i = 0; i < eb * E; i += 4) { uint32_t v = rnd(); memcpy(w + i, &v, 4); }
  for (size_t off = 0; off < eb * E; off += 144) { uint16_t h = 0x2000; memcpy(w + off, &h, 2); memcpy(w + off + 2, &h, 2); }
  float *a = malloc(sizeof(float) * n * T); for (int64_t i = 0; i < n * T; i++) a[i] = (rnd() % 2001 - 1000) * 1e-3f;
  size_t ab = 292 * (n / 256); uint8_t *aq = malloc(ab * T); for (int t = 0; t < T; t++) quant_quantize_q8_k(a + n * t, aq + ab * t, n);
  void *pk = aligned_alloc(64, (q8k_packed_bytes8(n, T) + 63) / 64 * 64); q8k_pack8(n, aq, ab, T, 0, T, pk);
  float *out = malloc(sizeof(float) * rows * T);
  for (int round = 0; round < 3; round++) for (PFM = 4; PFM < 8; PFM++) {
    double best = 1e9;
    for (int rep = 0; rep < 4; rep++) { double t0 = now(); for (int e = 0; e < E; e++) runp(n, w + eb * e, rb, rows, pk, T, out, rows); double dt = now() - t0; if (dt < best) best = dt; }
    printf("T=%d pfmode %d: %.1f GOP/s\n", T, PFM, 2.0 * n * rows * T * E / best / 1e9);
  }
}
