/* The streaming n-gram table (runtime/ngram_table.c) on a file of known rows:
 *   - gather returns every row's bytes, from a cache smaller than the rows asked, direct and
 *     through the page cache;
 *   - a prefetch while every staging buffer holds a read that has landed still sends its rows
 *     to the disk at once: those buffers are handed back first. Checked by the stall count of a
 *     later gather of the new rows (after they had time to land): 0. Before 2026-12-03 they
 *     waited in the queue until the gather, which then stalled on each (qwen4exp's next-token
 *     candidates held every buffer when the real token's rows were asked for);
 *   - the default depth leaves room for a decode step's candidates (4 x 16 rows) beside the
 *     real token's 16 (none queued behind the candidates: no stall either). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "runtime/ngram_table.h"

enum { ROW_BYTES = 320, N_ROWS = 4096 };

static uint8_t byte_of(int64_t row, int i) { return (uint8_t)(row * 131 + i * 7 + 3); }

static void sleep_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static ngram_table *open_table(const char *path, int cache_rows, int io_mode, int depth) {
    ngram_stream_params p = {.path = path, .offset = 4096 + 100, .row_bytes = ROW_BYTES, .n_rows = N_ROWS,
                             .cache_rows = cache_rows, .io_mode = io_mode, .io_depth = depth};
    char err[256];
    ngram_table *t = ngram_table_stream(&p, err, sizeof err);
    CHECKF(t != NULL, "open: %s", err);
    return t;
}

static void check_rows(ngram_table *t, const int32_t *rows, int n, const char *what) {
    uint8_t *dst = malloc((size_t)n * ROW_BYTES);
    CHECK(dst && ngram_table_gather(t, rows, n, dst) == 0);
    int bad = 0;
    for (int r = 0; dst && r < n; r++)
        for (int i = 0; i < ROW_BYTES; i++) bad += dst[(size_t)r * ROW_BYTES + i] != byte_of(rows[r], i);
    CHECKF(bad == 0, "%s: %d bytes differ", what, bad);
    free(dst);
}

/* prefetch `first`, let it land, prefetch `then`, let it land, gather `then`: its stalls */
static uint64_t stalls_after(ngram_table *t, const int32_t *first, int nf, const int32_t *then, int nt) {
    ngram_table_prefetch(t, first, nf);
    sleep_ms(100);
    ngram_table_prefetch(t, then, nt);
    sleep_ms(100);
    ngram_table_stats a, b;
    ngram_table_get_stats(t, &a);
    check_rows(t, then, nt, "rows prefetched behind landed reads");
    ngram_table_get_stats(t, &b);
    return b.stalls - a.stalls;
}

int main(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/ngram-table-XXXXXX", SLUICE_TEST_WORK);
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) CHECK_DONE();
    const size_t bytes = 4096 + 100 + (size_t)N_ROWS * ROW_BYTES;
    uint8_t *file = calloc(1, bytes);
    for (int64_t r = 0; file && r < N_ROWS; r++)
        for (int i = 0; i < ROW_BYTES; i++) file[4096 + 100 + (size_t)r * ROW_BYTES + (size_t)i] = byte_of(r, i);
    CHECK(file && write(fd, file, bytes) == (ssize_t)bytes);
    close(fd);
    free(file);

    for (int mode = 0; mode < 2; mode++) { /* direct, page cache */
        ngram_table *t = open_table(path, 48, mode, 4);
        if (!t) continue;
        int32_t rows[100];
        for (int i = 0; i < 100; i++) rows[i] = (i * 977) % N_ROWS;
        check_rows(t, rows, 100, mode ? "page: 100 rows through 48" : "direct: 100 rows through 48");
        const int32_t a[4] = {5, 900, 1800, 2700}, b[4] = {6, 901, 1801, 2701};
        CHECKF(stalls_after(t, a, 4, b, 4) == 0, "%s: rows asked behind 4 landed reads stalled the gather",
               mode ? "page" : "direct");
        ngram_table_free(t);
    }
    { /* default depth: 64 candidate rows, then a token's 16 */
        ngram_table *t = open_table(path, 1024, 0, 0);
        int32_t cand[64], real[16];
        for (int i = 0; i < 64; i++) cand[i] = 1000 + 17 * i;
        for (int i = 0; i < 16; i++) real[i] = 3000 + 31 * i;
        if (t) {
            /* the candidates stay in flight (no wait between): the real rows need room of their own */
            ngram_table_prefetch(t, cand, 64);
            ngram_table_prefetch(t, real, 16);
            sleep_ms(100);
            ngram_table_stats s0, s1;
            ngram_table_get_stats(t, &s0);
            check_rows(t, real, 16, "a token's rows after 64 candidates");
            ngram_table_get_stats(t, &s1);
            CHECKF(s1.stalls == s0.stalls, "default depth: a token's rows behind 64 candidates stalled %llu times",
                   (unsigned long long)(s1.stalls - s0.stalls));
            check_rows(t, cand, 64, "the candidates");
            ngram_table_free(t);
        }
    }
    unlink(path);
    CHECK_DONE();
}
