/* A fixed pool of worker threads for data-parallel loops.
 *
 * threadpool_run(p, fn, ctx) calls fn(ctx, ith, nth) once for each ith in 0..nth-1, the caller
 * running ith = 0, and returns when all have finished. Workers spin briefly between jobs (a
 * decode step issues hundreds of short jobs) and then sleep on a condition variable. */
#ifndef SLUICE_THREADPOOL_H
#define SLUICE_THREADPOOL_H

typedef struct threadpool threadpool;
typedef void (*threadpool_fn)(void *ctx, int ith, int nth);

threadpool *threadpool_new(int n_threads);
void threadpool_free(threadpool *p);
int threadpool_size(const threadpool *p);
void threadpool_run(threadpool *p, threadpool_fn fn, void *ctx);

/* Number of online CPUs (at least 1). */
int threadpool_default_threads(void);

#endif
