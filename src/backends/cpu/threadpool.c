/* Thread pool: a job is published by bumping a generation counter; workers that see a new
 * generation run their share and decrement a pending counter; the caller runs share 0 and spins
 * until pending reaches zero. Idle workers spin for a short while, then sleep on a condvar, so
 * an idle session costs no CPU. */
#include "backends/cpu/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_ROUNDS 20000

typedef struct worker {
    threadpool *pool;
    int ith;
    pthread_t thread;
} worker;

struct threadpool {
    int n;
    worker *workers;
    atomic_uint generation;
    atomic_int pending;
    atomic_bool quit;
    threadpool_fn fn;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int sleepers; /* guarded by mu */
};

static void *worker_main(void *arg) {
    worker *w = arg;
    threadpool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->quit, memory_order_relaxed)) {
            if (++spins < SPIN_ROUNDS) {
                CPU_RELAX();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            p->sleepers++;
            while (atomic_load_explicit(&p->generation, memory_order_acquire) == seen &&
                   !atomic_load_explicit(&p->quit, memory_order_relaxed))
                pthread_cond_wait(&p->cv, &p->mu);
            p->sleepers--;
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load_explicit(&p->quit, memory_order_relaxed)) return NULL;
        seen = gen;
        p->fn(p->ctx, w->ith, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
}

int threadpool_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

threadpool *threadpool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    threadpool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i;
        if (pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]) != 0) {
            p->n = i; /* run with the threads we got */
            break;
        }
    }
    return p;
}

void threadpool_free(threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->workers[i].thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->workers);
    free(p);
}

int threadpool_size(const threadpool *p) { return p->n; }

void threadpool_run(threadpool *p, threadpool_fn fn, void *ctx) {
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_mutex_lock(&p->mu);
    if (p->sleepers) pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0) CPU_RELAX();
}
