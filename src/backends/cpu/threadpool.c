/* Thread pool: a job is n shares (ith = 0..n-1). Every share is CLAIMED from one atomic
 * counter, by the caller or by any worker, so a worker that the OS has descheduled (this
 * machine is shared; a 2-core box runs other processes too) never stalls a job: the caller
 * simply runs that share itself. Which thread runs a share never matters: a share's work is a
 * function of (ctx, ith, nth) alone, so results are the same bits.
 *
 * The counter packs (job generation << 32 | shares << 16 | next share) in one 64-bit word, so
 * a worker that woke late can only claim shares of the job it saw published (a
 * compare-and-swap on the whole word), never a share of the next job with the previous job's
 * function. The job's share count lives in the same word: read apart, a late worker could pair
 * a new job's larger count with the old job's exhausted counter and run a share twice.
 *
 * Idle workers spin (pause) for a while, then sleep on a condition variable; the caller takes
 * the mutex only when some worker sleeps, so a hot dispatch is a few cache-line transfers.
 * tpbench numbers (dispatch cost) are in bench/results. */
#include "backends/cpu/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
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
    pthread_t thread;
} worker;

struct threadpool {
    int n;
    worker *workers;
    /* written by the caller, read by workers; own cache line each group */
    _Alignas(64) atomic_uint_fast64_t claim; /* generation << 32 | shares << 16 | next share */
    _Alignas(64) atomic_int done;            /* shares finished in the current job */
    _Alignas(64) atomic_int sleepers;
    _Atomic(threadpool_fn) fn;
    _Atomic(void *) ctx;
    atomic_bool quit;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* Claim and run shares of job gen until none is left. */
static void run_shares(threadpool *p, uint32_t gen) {
    threadpool_fn fn = atomic_load_explicit(&p->fn, memory_order_acquire);
    void *ctx = atomic_load_explicit(&p->ctx, memory_order_acquire);
    uint_fast64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
    for (;;) {
        const int shares = (int)((c >> 16) & 0xffff), next = (int)(c & 0xffff);
        if ((uint32_t)(c >> 32) != gen || next >= shares) return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        fn(ctx, next, shares);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        c = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    threadpool *p = w->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t gen;
        int spins = 0;
        while ((gen = (uint32_t)(atomic_load_explicit(&p->claim, memory_order_acquire) >> 32)) == seen &&
               !atomic_load_explicit(&p->quit, memory_order_relaxed)) {
            if (++spins < SPIN_ROUNDS) {
                CPU_RELAX();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1); /* seq_cst: pairs with the caller's publish */
            while ((uint32_t)(atomic_load(&p->claim) >> 32) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load_explicit(&p->quit, memory_order_relaxed)) return NULL;
        seen = gen;
        run_shares(p, gen);
    }
}

int threadpool_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

threadpool *threadpool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    threadpool *p = aligned_alloc(64, (sizeof *p + 63) / 64 * 64);
    if (!p) return NULL;
    p->n = n_threads;
    atomic_init(&p->claim, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->fn, NULL);
    atomic_init(&p->ctx, NULL);
    atomic_init(&p->quit, false);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        p->workers[i].pool = p;
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

void threadpool_run(threadpool *p, threadpool_fn fn, void *ctx) { threadpool_run_shares(p, fn, ctx, p->n); }

void threadpool_run_shares(threadpool *p, threadpool_fn fn, void *ctx, int shares) {
    if (shares > 0xffff) shares = 0xffff; /* the claim word's field */
    if (p->n == 1 || shares <= 1) {
        for (int i = 0; i < shares; i++) fn(ctx, i, shares);
        return;
    }
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    uint32_t gen = (uint32_t)(atomic_load_explicit(&p->claim, memory_order_relaxed) >> 32) + 1;
    /* seq_cst publish (release for fn/ctx) */
    atomic_store(&p->claim, (uint_fast64_t)gen << 32 | (uint_fast64_t)shares << 16);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_shares(p, gen);
    while (atomic_load_explicit(&p->done, memory_order_acquire) != shares) CPU_RELAX();
}
