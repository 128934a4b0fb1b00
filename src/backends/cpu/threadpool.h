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

/* Share ith of nth over n items, the shares shrinking linearly (share i weighs nth - i): for jobs
 * whose shares are claimed by whichever thread is free (threadpool_run_shares with more shares
 * than threads), so that the last shares, which one thread may finish while the other waits,
 * are small, with no more shares (and so no more cold starts of a row stream) than an even
 * split. A pure function of (n, ith, nth): which thread runs a share never matters. */
static inline void threadpool_share_guided(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    const int64_t total = (int64_t)nth * (nth + 1) / 2;
    const int64_t w0 = (int64_t)ith * nth - (int64_t)ith * (ith - 1) / 2;
    const int64_t w1 = (int64_t)(ith + 1) * nth - (int64_t)(ith + 1) * ith / 2;
    *lo = n / total * w0 + n % total * w0 / total;
    *hi = n / total * w1 + n % total * w1 / total;
}

/* Number of online CPUs (at least 1). */
int threadpool_default_threads(void);

#endif
