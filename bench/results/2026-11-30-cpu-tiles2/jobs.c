#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/backend.h"
#include "formats/quant.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static uint64_t rs=88172645463325252ull; static uint32_t rnd(void){rs^=rs<<13;rs^=rs>>7;rs^=rs<<17;return (uint32_t)rs;}
int main(int argc, char **argv) {
  int E = 320; /* experts in the pool: 320 x 2.6 MB = 850 MB, beyond L3 */
  int64_t K = 2048, R = 768; size_t rb = 1152, mb = rb * R; /* one matrix */
  uint8_t *w = aligned_alloc(4096, mb * 3 * E);
  for (size_t i = 0; i < mb * 3 * E; i += 4) { uint32_t v = rnd(); memcpy(w + i, &v, 4); }
  for (size_t off = 0; off < mb * 3 * E; off += 144) { uint16_t h = 0x2000; memcpy(w + off, &h, 2); memcpy(w + off + 2, &h, 2); }
  backend *be = backend_cpu_new(2);
  float x[2048], y[8][2048], mid[8][768]; for (int i = 0; i < 2048; i++) x[i] = (rnd() % 2001 - 1000) * 1e-3f;
  /* down: 2048 rows of 768 -> row 3 blocks = 432 B; use a separate view over the same bytes */
  int layers = 40, k = 8;
  int only = argc > 1 ? atoi(argv[1]) : 0;
  for (int mode = 0; mode < 2; mode++) for (int rep = 0; rep < 3; rep++) {
    double t0 = now(); int e = 0;
    for (int l = 0; l < layers; l++) {
      if (mode == 0) {
        for (int j = 0; j < k; j++, e = (e + 1) % E) {
          uint8_t *base = w + (size_t)e * mb * 3;
          tview g = {.type = 12, .ne = {K, R, 1, 1}, .row_bytes = rb, .mat_bytes = mb, .data = base, .name = "g"};
          tview u = g; u.data = base + mb;
          tview d = {.type = 12, .ne = {768, 2048, 1, 1}, .row_bytes = 432, .mat_bytes = 432 * 2048, .data = base + 2 * mb, .name = "d"};
          if (only != 2) be_matmul_swiglu(be, &g, &u, x, 1, mid[j]);
          if (only != 1) be_matmul(be, &d, mid[j], 1, y[j]);
        }
      } else { /* the same bytes as 2 big products: gate/up of 8 experts as one 8x taller matrix (contiguous), down likewise */
        uint8_t *base = w + (size_t)e * mb * 3; e = (e + k) % E; if (e + k > E) e = 0;
        tview g = {.type = 12, .ne = {K, R * k, 1, 1}, .row_bytes = rb, .mat_bytes = mb * k, .data = base, .name = "g"};
        tview u = g; u.data = base + mb * k;
        tview d = {.type = 12, .ne = {768, 2048 * k, 1, 1}, .row_bytes = 432, .mat_bytes = 432 * 2048 * k, .data = base + 2 * mb * k, .name = "d"};
        static float big[8 * 2048 * 8];
        if (only != 2) be_matmul_swiglu(be, &g, &u, x, 1, big);
        if (only != 1) be_matmul(be, &d, big, 1, big + 8 * 768);
      }
    }
    double dt = now() - t0;
    printf("%s: %.1f ms for %d layers, %.2f GB/s\n", mode ? "2 jobs/layer " : "16 jobs/layer", dt * 1e3, layers, (only ? 1.0 + (only == 1) : 3.0) * mb * k * layers / dt / 1e9);
  }
}
