/* Tile harness: times kernel_tile_of(TYPE)->run over E distinct experts (ROWS x N weights,
 * default 768 x 2048) for T tokens ("stream": each pass over all E experts, E large enough to
 * leave the last-level cache) and over one expert again and again ("L2"). Prints GOP/s and a
 * hash of the output bits. Usage: tile TYPE T E (env ROWS, N). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/cpu/kernels.h"
#include "formats/quant.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static uint64_t rs=88172645463325252ull; static uint32_t rnd(void){rs^=rs<<13;rs^=rs>>7;rs^=rs<<17;return (uint32_t)rs;}
int main(int argc,char**argv){
  int type = argc>1? quant_type_from_name(argv[1]) : 12; int T = argc>2? atoi(argv[2]):32; int E = argc>3?atoi(argv[3]):64;
  int64_t n=getenv("N")?atoi(getenv("N")):2048; int rows=getenv("ROWS")?atoi(getenv("ROWS")):768; const quant_traits *qt=quant_traits_of(type);
  size_t rb=quant_row_bytes(type,n), eb=rb*rows; uint8_t *w=aligned_alloc(64,eb*E);
  for(size_t i=0;i<eb*E;i+=4){uint32_t v=rnd();memcpy(w+i,&v,4);}
  /* sane scales: encode one block and stamp its header fields onto every block */
  float x[256]; uint8_t blk[512]; for(int k=0;k<256;k++) x[k]=(rnd()%2001-1000)*1e-3f; qt->quantize(x,blk,256);
  size_t bb=qt->block_bytes; int hdr = (type==12||type==13)?4: (type==14? 0:0);
  for(size_t off=0;off+bb<=eb*E;off+=bb){ if(type==12||type==13) memcpy(w+off,blk,4); if(type==14) memcpy(w+off+208,blk+208,2);}
  float *a=malloc(sizeof(float)*n*T); for(int64_t i=0;i<n*T;i++) a[i]=(rnd()%2001-1000)*1e-3f;
  size_t ab=quant_row_bytes(GGML_TYPE_Q8_K,n); uint8_t *aq=malloc(ab*T); for(int t=0;t<T;t++) quant_quantize_q8_k(a+n*t,aq+ab*t,n);
  const kernel_tile *kt=kernel_tile_of(type); if(!kt){printf("no tile\n");return 1;}
  void *pk=aligned_alloc(64,(kt->packed_bytes(n,T)+63)/64*64); kt->pack(n,aq,ab,T,0,T,pk);
  float *out=malloc(sizeof(float)*rows*T);
  double best=1e9, bestl2=1e9; unsigned h=0;
  for(int rep=0;rep<4;rep++){ double t0=now(); for(int e=0;e<E;e++) kt->run(n,w+eb*e,rb,rows,pk,T,out,rows); double dt=now()-t0; if(dt<best)best=dt;
    for(int i=0;i<rows*T;i++){unsigned u; memcpy(&u,out+i,4); h=h*31+u;} }
  for(int rep=0;rep<5;rep++){ double t0=now(); for(int e=0;e<E;e++) kt->run(n,w,rb,rows,pk,T,out,rows); double dt=now()-t0; if(dt<bestl2)bestl2=dt; }
  double ops=2.0*n*rows*T*E;
  printf("%s T=%d: stream %.1f GOP/s, L2 %.1f GOP/s  (hash %08x)\n", argv[1], T, ops/best/1e9, ops/bestl2/1e9, h);
}
