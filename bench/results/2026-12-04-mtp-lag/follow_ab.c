/* follow_ab: what following the trunk costs a one-token pass of an MTP model, in one process.
 * Greedy decode after a prompt, in blocks of B one-token passes; blocks alternate between the
 * MTP block following every pass at once (queue capacity 0, as SLUICE_MTP_LAG=0) and the lag
 * (capacity 64; the queue is run at the end of each lag block and timed with it, so a lag
 * block pays a flush every B tokens, not every 64). Prints each mode's median and mean pass.
 * Links libsluice.a and the engine's internal headers (-I include -I src).
 * NOMTP=1 in the environment loads the model without its block (both modes then time the
 * same plain passes: the floor the two should approach).
 *   follow_ab MODEL N_PROMPT ROUNDS B THREADS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "sluice.h"
#include "engine/session_internal.h"
#include "models/qwen4exp.h"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
    if (argc < 6) { fprintf(stderr, "usage: %s MODEL N_PROMPT ROUNDS B THREADS\n", argv[0]); return 2; }
    const int np = atoi(argv[2]), rounds = atoi(argv[3]), B = atoi(argv[4]), nt = atoi(argv[5]);
    sluice_model_params mp = {0};
    mp.mode = SLUICE_MODE_RESIDENT;
    mp.mtp = getenv("NOMTP") ? 0 : 1;
    mp.n_ctx = np + 2 * rounds * B + 8;
    sluice_model *m = sluice_model_load(argv[1], &mp);
    if (!m) { fprintf(stderr, "load: %s\n", sluice_last_error()); return 1; }
    sluice_session_params sp = {.n_ctx = mp.n_ctx, .n_batch = 64, .n_threads = nt};
    sluice_session *s = sluice_session_new(m, &sp);
    if (!s) { fprintf(stderr, "session: %s\n", sluice_last_error()); return 1; }
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)np);
    uint32_t r = 12345;
    for (int i = 0; i < np; i++) { r = r * 1103515245u + 12345u; prompt[i] = (int32_t)((r >> 8) % 30000u); }
    if (sluice_session_eval(s, prompt, np, NULL) != 0) { fprintf(stderr, "eval: %s\n", sluice_last_error()); return 1; }
    model_state *st = session_model_state(s);
    q4x_state *xs = q4x_state_of(st);
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    const int V = info.n_vocab, n = rounds * B;
    double *t_at_once = malloc(sizeof(double) * (size_t)n), *t_lag = malloc(sizeof(double) * (size_t)n);
    double sum[2] = {0, 0};
    for (int round = 0; round < 2 * rounds; round++) {
        const int lag = round % 2;
        if (mp.mtp) xs->mtp_lag_cap = lag ? 64 : 0;
        double *t = lag ? t_lag : t_at_once;
        for (int i = 0; i < B; i++) {
            const double t0 = now();
            int32_t tok = sluice_argmax(sluice_session_logits(s), V);
            if (sluice_session_eval(s, &tok, 1, NULL) != 0) { fprintf(stderr, "eval: %s\n", sluice_last_error()); return 1; }
            if (mp.mtp && lag && i == B - 1 && mtp_lag_flush(m, st, session_backend(s)) != 0) return 1;
            t[(round / 2) * B + i] = now() - t0;
            sum[lag] += t[(round / 2) * B + i];
        }
    }
    qsort(t_at_once, (size_t)n, sizeof(double), cmp);
    qsort(t_lag, (size_t)n, sizeof(double), cmp);
    printf("one-token passes %d per mode, blocks of %d: at once median %.2f ms mean %.2f ms | lag median %.2f ms mean %.2f ms (lag/at once: median %.3f, mean %.3f)\n",
           n, B, 1e3 * t_at_once[n / 2], 1e3 * sum[0] / n, 1e3 * t_lag[n / 2], 1e3 * sum[1] / n,
           t_lag[n / 2] / t_at_once[n / 2], sum[1] / sum[0]);
    sluice_session_free(s);
    sluice_model_free(m);
    return 0;
}
