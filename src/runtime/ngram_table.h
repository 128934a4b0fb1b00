/* The n-gram embedding table tier (qwen4exp's "PLE"/Engram table: 320 M rows of 160 values,
 * 28-102 GB, of which a token reads 16 rows).
 *
 * The rows a token needs depend only on token ids, so they are known before the forward pass
 * starts: the model calls ngram_table_prefetch with the rows of a whole prompt (or of the next
 * token) before layer 0 runs and ngram_table_gather when the n-gram layer needs them.
 *
 *   resident  rows are read from the mapped model file (the table counts in the plan's
 *             weights)
 *   stream    rows are read on demand with direct I/O (io.h) into a small RAM row cache
 *             (CLOCK eviction; a row whose read is in flight is never evicted); the table is
 *             never mapped in, so it costs only the cache
 *
 * Both return the same bytes, so the tier never changes a result bit. Not thread-safe: one
 * thread (the engine's compute thread) calls it, like the expert store. */
#ifndef SLUICE_NGRAM_TABLE_H
#define SLUICE_NGRAM_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ngram_table_stats {
    uint64_t lookups;     /* rows gathered by the model */
    uint64_t hits;        /* found ready in the cache (resident: every lookup) */
    uint64_t misses;      /* not requested before gather needed them */
    uint64_t prefetched;  /* rows whose read started before gather needed them */
    uint64_t reads;       /* read requests issued */
    uint64_t bytes_read;  /* bytes read from storage */
    uint64_t evictions;
    uint64_t stalls;      /* gathers that had to wait for a read */
    double stall_s;       /* time gather waited for reads (compute stalled) */
    uint64_t gathers;     /* gather calls (forward passes that used the table) */
} ngram_table_stats;

typedef struct ngram_table ngram_table;

/* Rows at base (row r at base + r * row_bytes) of a mapping that outlives the table. */
ngram_table *ngram_table_resident(const uint8_t *base, uint64_t row_bytes, uint64_t n_rows);

typedef struct ngram_stream_params {
    const char *path;
    uint64_t offset;      /* file offset of row 0 */
    uint64_t row_bytes, n_rows;
    int cache_rows;       /* rows the RAM cache holds (>= 1) */
    int io_mode;          /* enum io_mode */
    int io_depth;         /* reads in flight (0: 64) */
} ngram_stream_params;

ngram_table *ngram_table_stream(const ngram_stream_params *p, char *err, size_t err_len);

/* Bytes a streaming table holds: the row cache, its index and the staging buffers of the
 * reads in flight. */
uint64_t ngram_table_stream_bytes(int cache_rows, uint64_t row_bytes, int io_depth);

/* Start reading rows that will be gathered soon (duplicates and cached rows cost nothing).
 * Never waits; stops early when every cache slot holds a row still being read. Rows must be
 * < n_rows. */
void ngram_table_prefetch(ngram_table *t, const int32_t *rows, int n);

/* dst + i * row_bytes receives row rows[i] for i < n, waiting for reads as needed. 0, or -1
 * with sluice_last_error() set (I/O error). */
int ngram_table_gather(ngram_table *t, const int32_t *rows, int n, uint8_t *dst);

bool ngram_table_streaming(const ngram_table *t);
void ngram_table_get_stats(const ngram_table *t, ngram_table_stats *s);
void ngram_table_free(ngram_table *t);

#endif
