/* The thread pool: every share of every job runs exactly once, with the job's own function,
 * context and share count, while jobs of different share counts follow each other as fast as
 * the caller can issue them (a decode step issues hundreds of short jobs; the dot path asks for
 * more shares than threads). A worker that wakes late must never pair a new job's function or
 * share count with the previous job's counter: that ran shares twice and crashed `sluice run`
 * on two threads before the share count moved into the claim word. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <signal.h>
#include <unistd.h>

#include "backends/cpu/threadpool.h"
#include "check.h"

#define MAX_SHARES 64

typedef struct job {
    int shares;
    atomic_int runs[MAX_SHARES];
    atomic_int wrong_nth;
} job;

static void count_share(void *ctx, int ith, int nth) {
    job *j = ctx;
    if (nth != j->shares || ith < 0 || ith >= MAX_SHARES) {
        atomic_fetch_add(&j->wrong_nth, 1);
        return;
    }
    atomic_fetch_add(&j->runs[ith], 1);
}

/* A second function with the same signature: a share run with the wrong function shows up as
 * a missing run of the job it belonged to. */
static void count_share_b(void *ctx, int ith, int nth) { count_share(ctx, ith, nth); }

/* The share splits: every item in exactly one share, in order; the even split's shares differ by
 * at most one item; the guided split's shrink (up to one item of rounding), its last share
 * holds about 2 / (nth (nth + 1)) of the items, and no arithmetic overflows at large n. */
static void check_splits(void) {
    const int64_t ns[] = {0, 1, 3, 7, 100, 768, 2048, 6144, 16384, 1000003, (int64_t)1 << 40};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (int nth = 1; nth <= 64; nth++) {
            const int64_t n = ns[k];
            int64_t prev_e = 0, prev_g = 0, size_prev = n, min_e = n, max_e = 0;
            for (int i = 0; i < nth; i++) {
                int64_t lo, hi;
                threadpool_share(n, i, nth, &lo, &hi);
                CHECKF(lo == prev_e && hi >= lo, "even n=%lld nth=%d share %d", (long long)n, nth, i);
                prev_e = hi;
                if (hi - lo < min_e) min_e = hi - lo;
                if (hi - lo > max_e) max_e = hi - lo;
                threadpool_share_guided(n, i, nth, &lo, &hi);
                CHECKF(lo == prev_g && hi >= lo && hi - lo <= size_prev + 1, "guided n=%lld nth=%d share %d: [%lld, %lld)",
                       (long long)n, nth, i, (long long)lo, (long long)hi);
                if (i == nth - 1) /* the last weighs 1 of nth (nth + 1) / 2 */
                    CHECKF(hi - lo <= 2 * n / ((int64_t)nth * (nth + 1)) + 1, "guided n=%lld nth=%d: last %lld",
                           (long long)n, nth, (long long)(hi - lo));
                prev_g = hi;
                size_prev = hi - lo;
            }
            CHECK(prev_e == n && prev_g == n && max_e - min_e <= 1);
        }
}

/* A share counted twice also leaves the caller waiting forever for its count: fail, not hang. */
static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_threadpool: a job never finished (a share ran twice or was lost)\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(1);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(30); /* the whole test takes well under a second */
    check_splits();
    /* more threads than this machine's cores on purpose: descheduled workers wake late */
    const int threads[] = {2, 3, 5};
    const int counts[] = {1, 2, 8, 3, 64, 2, 16, 5, 2, 33};
    const int n_counts = (int)(sizeof counts / sizeof counts[0]);
    for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
        threadpool *p = threadpool_new(threads[ti]);
        CHECK(p != NULL);
        if (!p) continue;
        static job jobs[2];
        long bad = 0, wrong = 0;
        const int rounds = 60000;
        for (int r = 0; r < rounds; r++) {
            job *j = &jobs[r & 1];
            const bool plain = r % 7 == 3; /* threadpool_run: one share a thread */
            j->shares = plain ? threadpool_size(p) : counts[r % n_counts];
            for (int i = 0; i < MAX_SHARES; i++) atomic_store(&j->runs[i], 0);
            atomic_store(&j->wrong_nth, 0);
            if (plain) threadpool_run(p, (r & 1) ? count_share : count_share_b, j);
            else threadpool_run_shares(p, (r & 1) ? count_share : count_share_b, j, j->shares);
            for (int i = 0; i < MAX_SHARES; i++) bad += atomic_load(&j->runs[i]) != (i < j->shares ? 1 : 0);
            wrong += atomic_load(&j->wrong_nth);
        }
        printf("%d threads, %d jobs of 1-64 shares: %ld share(s) run other than once, %ld with a "
               "wrong share count\n",
               threads[ti], rounds, bad, wrong);
        CHECKF(bad == 0 && wrong == 0, "%d threads: %ld bad, %ld wrong", threads[ti], bad, wrong);
        threadpool_free(p);
    }
    CHECK_DONE();
}
