/* One weight matrix through the CPU backend's matmul (a record's harness, not a test):
 *   one_matrix TOKS REPS THREADS TYPE K MB
 * rows of K values, MB megabytes of them (0.5: cache-resident; 200+: from DRAM), best of REPS
 * products; GOP/s and a hash of the output bits (equal hashes: equal bits).
 * Build: gcc -O2 -I src -o one_matrix one_matrix.c build/libsluice.a -lm -lpthread */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/backend.h"
#include "formats/quant.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
int main(int argc,char**argv){
  int toks = argc>1?atoi(argv[1]):16; int reps=argc>2?atoi(argv[2]):50; int threads=argc>3?atoi(argv[3]):1;
  int type = argc>4?quant_type_from_name(argv[4]):quant_type_from_name("Q4_K");
  int64_t K=argc>5?atoi(argv[5]):2048; double mbx=argc>6?atof(argv[6]):37.7;
  int64_t rows=(int64_t)(mbx*1e6/quant_row_bytes(type,K))/8*8;
  size_t row=quant_row_bytes(type,K);
  uint8_t *w=aligned_alloc(4096,(row*rows+4095)/4096*4096);
  uint32_t s=1; for(size_t i=0;i<row*rows;i++){s=s*1664525u+1013904223u; w[i]=s>>24;}
  /* sane f16 scales: set d/dmin of every block to small */
  const quant_traits *t=quant_traits_of(type);
  for(size_t off=0; off+t->block_bytes<=row*rows; off+=t->block_bytes){ if(type==quant_type_from_name("Q4_K")){w[off]=0x00;w[off+1]=0x1c;w[off+2]=0;w[off+3]=0x1c;} else {w[off+208]=0;w[off+209]=0x1c;} }
  float *x=malloc(sizeof(float)*K*toks); for(int i=0;i<K*toks;i++) x[i]=((int)(i*7919%2001)-1000)*1e-3f;
  float *out=malloc(sizeof(float)*rows*toks);
  backend *be=backend_cpu_new(threads);
  tview tw={.type=(uint32_t)type,.ne={K,rows,1,1},.row_bytes=row,.mat_bytes=row*rows,.data=w,.name="b"};
  double best=1e30; unsigned h=0;
  for(int r=0;r<reps;r++){double t0=now(); be_matmul(be,&tw,x,toks,out); double dt=now()-t0; if(dt<best)best=dt;}
  for(size_t i=0;i<(size_t)rows*toks;i++){unsigned u; memcpy(&u,&out[i],4); h=h*31+u;}
  printf("%s toks %d: %.1f GOP/s  (%.3f ms) hash %08x\n", argv[4]?argv[4]:"Q4_K", toks, 2.0*K*rows*toks/best/1e9, best*1e3, h);
  be_free(be); return 0;
}
