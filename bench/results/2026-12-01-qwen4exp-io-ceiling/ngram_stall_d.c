/* ngram_stall: the n-gram tier's counters (sluice_model_ngram_stats) over a prompt and a greedy
 * decode, which `sluice bench` does not report. Links libsluice.a; public API only.
 *   ngram_stall MODEL PROMPT_FILE N_PROMPT N_GEN N_BATCH THREADS [auto|resident|stream] [greedy|forced] [CACHE_EXPERTS]
 * forced: each decode step evaluates the next token of the file (teacher forcing: diverse tokens,
 * one token per pass, as decode) instead of the greedy pick. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "sluice.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void pr(const char *tag, const sluice_ngram_stats *a, const sluice_ngram_stats *b, int ntok) {
    unsigned long long look = b->lookups - a->lookups, miss = b->misses - a->misses;
    printf("%s: tokens %d on_demand %d lookups %llu hits %llu misses(not requested ahead) %llu prefetched %llu "
           "reads %llu bytes %llu evictions %llu stalls %llu stall_s %.6f gathers %llu | per token: reads %.2f "
           "bytes %.0f stall_us %.1f\n", tag, ntok, (int)b->on_demand, look,
           (unsigned long long)(b->hits - a->hits), miss, (unsigned long long)(b->prefetched - a->prefetched),
           (unsigned long long)(b->reads - a->reads), (unsigned long long)(b->bytes_read - a->bytes_read),
           (unsigned long long)(b->evictions - a->evictions), (unsigned long long)(b->stalls - a->stalls),
           b->stall_s - a->stall_s, (unsigned long long)(b->gathers - a->gathers),
           (double)(b->reads - a->reads) / ntok, (double)(b->bytes_read - a->bytes_read) / ntok,
           (b->stall_s - a->stall_s) * 1e6 / ntok);
}
static void pe(const char *tag, const sluice_expert_stats *a, const sluice_expert_stats *b, int ntok) {
    printf("%s experts: acquires %llu hits %llu misses %llu bytes %llu (%.1f MB/token) io_wait_s %.3f prefetch %llu/%llu\n",
           tag, (unsigned long long)(b->acquires - a->acquires), (unsigned long long)(b->hits - a->hits),
           (unsigned long long)(b->misses - a->misses), (unsigned long long)(b->bytes_read - a->bytes_read),
           (b->bytes_read - a->bytes_read) / 1e6 / ntok, b->io_wait_s - a->io_wait_s,
           (unsigned long long)(b->prefetch_used - a->prefetch_used),
           (unsigned long long)(b->prefetch_issued - a->prefetch_issued));
}
int main(int argc, char **argv) {
    if (argc < 7) { fprintf(stderr, "usage: %s MODEL PROMPT_FILE N_PROMPT N_GEN N_BATCH THREADS [auto|resident|stream]\n", argv[0]); return 2; }
    int np = atoi(argv[3]), ng = atoi(argv[4]), nb = atoi(argv[5]), nt = atoi(argv[6]);
    sluice_model_params mp = {0};
    mp.mode = argc > 7 && !strcmp(argv[7], "resident") ? SLUICE_MODE_RESIDENT : argc > 7 && !strcmp(argv[7], "stream") ? SLUICE_MODE_STREAM : SLUICE_MODE_AUTO;
    mp.n_ctx = np + ng + 1;
    mp.io_depth = getenv("IO_DEPTH") ? atoi(getenv("IO_DEPTH")) : 0;
    if (argc > 9) mp.cache_experts = atoi(argv[9]); /* as --cache Nx */ mp.n_batch = nb;
    double t0 = now();
    sluice_model *m = sluice_model_load(argv[1], &mp);
    if (!m) { fprintf(stderr, "load: %s\n", sluice_last_error()); return 1; }
    printf("load %.2f s, mode %s\n", now() - t0, sluice_model_mode(m));
    FILE *f = fopen(argv[2], "rb"); if (!f) return 1;
    fseek(f, 0, SEEK_END); long sz = ftell(f); fseek(f, 0, SEEK_SET);
    char *text = malloc(sz + 1); if (fread(text, 1, sz, f) != (size_t)sz) return 1; fclose(f);
    int n = sluice_tokenize(m, text, sz, false, true, NULL, 0);
    int32_t *file = malloc(n * 4); sluice_tokenize(m, text, sz, false, true, file, n);
    int32_t *ids = malloc((np + ng + 1) * 4);
    for (int i = 0; i < np; i++) ids[i] = file[i % n];
    sluice_session_params sp = {.n_ctx = np + ng + 1, .n_batch = nb, .n_threads = nt};
    sluice_session *s = sluice_session_new(m, &sp);
    if (!s) { fprintf(stderr, "session: %s\n", sluice_last_error()); return 1; }
    sluice_sampler_params g = sluice_sampler_defaults(); g.temperature = 0; sluice_session_set_sampler(s, &g);
    sluice_ngram_stats n0, n1, n2, n3; sluice_expert_stats e0, e1, e2, e3;
    sluice_model_ngram_stats(m, &n0); sluice_model_expert_stats(m, &e0);
    t0 = now();
    if (sluice_session_eval(s, ids, np, NULL) != 0) { fprintf(stderr, "eval: %s\n", sluice_last_error()); return 1; }
    double tp = now() - t0;
    sluice_model_ngram_stats(m, &n1); sluice_model_expert_stats(m, &e1);
    const int forced = argc > 8 && !strcmp(argv[8], "forced");
    int half = ng / 2; double td1 = 0, td2 = 0;
    for (int i = 0; i < ng; i++) {
        if (i == half) { sluice_model_ngram_stats(m, &n2); sluice_model_expert_stats(m, &e2); }
        double t = now();
        int32_t tok = sluice_session_sample(s);
        if (forced) tok = file[(np + i) % n];
        if (sluice_session_eval(s, &tok, 1, NULL) != 0) { fprintf(stderr, "eval: %s\n", sluice_last_error()); return 1; }
        ids[np + i] = tok;
        if (i < half) td1 += now() - t; else td2 += now() - t;
    }
    sluice_model_ngram_stats(m, &n3); sluice_model_expert_stats(m, &e3);
    printf("prefill %d tokens %.2f s (%.2f t/s); decode %d tokens %.2f s (%.2f t/s), second half %.2f t/s\n",
           np, tp, np / tp, ng, td1 + td2, ng / (td1 + td2), (ng - half) / td2);
    pr("ngram prefill", &n0, &n1, np); pr("ngram decode", &n1, &n3, ng); pr("ngram decode 2nd half", &n2, &n3, ng - half);
    pe("prefill", &e0, &e1, np); pe("decode", &e1, &e3, ng); pe("decode 2nd half", &e2, &e3, ng - half);
    printf("%s:", forced ? "fed (forced)" : "generated"); for (int i = 0; i < ng; i++) printf(" %d", ids[np + i]); printf("\n");
    sluice_session_free(s); sluice_model_free(m);
    return 0;
}
