/* A fixed pool of worker threads for data-parallel loops.
 *
 * threadpool_run(p, fn, ctx) calls fn(ctx, ith, nth) once for each ith in 0..nth-1, the caller
 * running ith = 0, and returns when all have finished. Workers spin briefly between jobs (a
 * decode step issues hundreds of short jobs) and then sleep on a condition variable. */
#ifndef SLUICE_THREADPOOL_H
#define SLUICE_THREADPOOL_H

#include <stdint.h>

typedef struct threadpool threadpool;
typedef void (*threadpool_fn)(void *ctx, int ith, int nth);

threadpool *threadpool_new(int n_threads);
void threadpool_free(threadpool *p);
int threadpool_size(const threadpool *p);
void threadpool_run(threadpool *p, threadpool_fn fn, void *ctx);
/* The same with `shares` shares (fn sees nth = shares), claimed by whichever thread is free:
 * more shares than threads balance a job whose threads run at different speeds. */
void threadpool_run_shares(threadpool *p, threadpool_fn fn, void *ctx, int shares);

/* Contiguous share [*lo, *hi) of n items for share ith of nth: the first n % nth shares take
 * one item more. Every CPU op splits its work so. */
static inline void threadpool_share(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    const int64_t per = n / nth, extra = n % nth;
    *lo = ith * per + (ith < extra ? ith : extra);
    *hi = *lo + per + (ith < extra ? 1 : 0);
}

/* Number of online CPUs (at least 1). */
int threadpool_default_threads(void);

#endif
