/* The n-gram table tier: see ngram_table.h.
 *
 * Streaming layout. A row is tiny (90 B at IQ4_NL, 320 B at BF16) and the rows a token needs
 * are scattered over the whole table, so each row is one direct read of the 4 KiB sectors that
 * hold it (8 KiB when it straddles a sector boundary) into a staging buffer; the row's bytes
 * are then copied into a cache slot. The cache is a fixed array of slots found through an
 * open-addressing index keyed by row id; a slot is FREE, QUEUED (its read waits for a staging
 * buffer), READING (in flight) or READY. Reads are started in request order, at most io_depth
 * at a time; gather waits for exactly the reads it needs and starts queued ones as staging
 * buffers free up. Only READY slots are evicted (CLOCK: a slot used since the hand last passed
 * gets a second chance). */
#include "runtime/ngram_table.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/error.h"
#include "runtime/io.h"

enum { SLOT_FREE = 0, SLOT_QUEUED, SLOT_READING, SLOT_READY };

typedef struct slot {
    int64_t row;   /* -1 when free */
    uint8_t state;
    uint8_t ref;   /* CLOCK reference bit */
    int16_t read;  /* staging buffer while READING */
} slot;

typedef struct staging {
    io_req req;
    uint8_t *buf;
    int32_t slot;  /* the cache slot it fills, -1 when idle */
    uint32_t head; /* the row's first byte within buf */
} staging;

struct ngram_table {
    uint64_t row_bytes, n_rows;
    ngram_table_stats stats;
    /* resident */
    const uint8_t *base;
    /* stream */
    io_engine *io;
    io_mode mode;
    uint64_t offset;
    int n_slots;
    slot *slots;
    uint8_t *data;        /* n_slots * row_bytes */
    int32_t *index;       /* open addressing: slot ids, -1 empty; index_mask + 1 entries */
    uint64_t index_mask;
    int hand;             /* CLOCK */
    int32_t *queue;       /* QUEUED slots in request order (ring of n_slots) */
    int q_head, q_len;
    staging *stage;
    int n_stage, *free_stage, n_free_stage;
    int32_t *inflight;    /* staging ids in submission order (ring of n_stage) */
    int f_head, f_len;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Staging bytes per read: the row's sectors, aligned (direct) or exactly the row (page). */
static uint64_t stage_bytes(uint64_t row_bytes) { return round_up(row_bytes, IO_ALIGN) + IO_ALIGN; }

static uint64_t index_size(int cache_rows) {
    uint64_t n = 16;
    while (n < 2 * (uint64_t)cache_rows) n *= 2;
    return n;
}

/* Reads in flight by default. A decode step of qwen4exp prefetches the rows of its next-token
 * candidates (4 tokens x 16 rows) at its end and the real token's 16 at the next step's start;
 * with 64 staging buffers the candidates' held them all, the real rows waited in the queue until
 * the n-gram layer's gather, and by then a streamed step's expert reads filled the disk's queue:
 * 2.8-6.5 ms of stall a token on the H200 machine's floor runs
 * (bench/results/2026-12-03-synth-centred.md). A buffer is a row's sectors plus one. */
#define NGRAM_DEFAULT_DEPTH 256

uint64_t ngram_table_stream_bytes(int cache_rows, uint64_t row_bytes, int io_depth) {
    if (io_depth <= 0) io_depth = NGRAM_DEFAULT_DEPTH;
    return (uint64_t)cache_rows * (row_bytes + sizeof(slot) + sizeof(int32_t)) +
           index_size(cache_rows) * sizeof(int32_t) +
           (uint64_t)io_depth * (stage_bytes(row_bytes) + sizeof(staging) + 2 * sizeof(int));
}

ngram_table *ngram_table_resident(const uint8_t *base, uint64_t row_bytes, uint64_t n_rows) {
    ngram_table *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->base = base;
    t->row_bytes = row_bytes;
    t->n_rows = n_rows;
    return t;
}

bool ngram_table_streaming(const ngram_table *t) { return t->io != NULL; }

void ngram_table_free(ngram_table *t) {
    if (!t) return;
    io_close(t->io); /* waits for reads in flight */
    if (t->stage)
        for (int i = 0; i < t->n_stage; i++) free(t->stage[i].buf);
    free(t->stage);
    free(t->free_stage);
    free(t->inflight);
    free(t->slots);
    free(t->data);
    free(t->index);
    free(t->queue);
    free(t);
}

ngram_table *ngram_table_stream(const ngram_stream_params *p, char *err, size_t err_len) {
    if (p->cache_rows < 1 || p->row_bytes == 0 || p->row_bytes > (1u << 20)) {
        snprintf(err, err_len, "n-gram table: invalid cache of %d rows of %llu bytes",
                 p->cache_rows, (unsigned long long)p->row_bytes);
        return NULL;
    }
    ngram_table *t = calloc(1, sizeof *t);
    if (!t) goto oom;
    t->row_bytes = p->row_bytes;
    t->n_rows = p->n_rows;
    t->offset = p->offset;
    t->mode = p->io_mode == IO_PAGE ? IO_PAGE : IO_DIRECT;
    t->n_slots = p->cache_rows;
    t->n_stage = p->io_depth > 0 ? p->io_depth : NGRAM_DEFAULT_DEPTH;
    if (t->n_stage > 1024) t->n_stage = 1024;
    const uint64_t isz = index_size(p->cache_rows);
    t->index_mask = isz - 1;
    t->slots = calloc((size_t)t->n_slots, sizeof *t->slots);
    t->data = malloc((size_t)t->n_slots * p->row_bytes);
    t->index = malloc(isz * sizeof *t->index);
    t->queue = malloc((size_t)t->n_slots * sizeof *t->queue);
    t->stage = calloc((size_t)t->n_stage, sizeof *t->stage);
    t->free_stage = malloc((size_t)t->n_stage * sizeof *t->free_stage);
    t->inflight = malloc((size_t)t->n_stage * sizeof *t->inflight);
    if (!t->slots || !t->data || !t->index || !t->queue || !t->stage || !t->free_stage ||
        !t->inflight)
        goto oom;
    memset(t->index, 0xff, isz * sizeof *t->index);
    for (int i = 0; i < t->n_slots; i++) t->slots[i].row = -1;
    for (int i = 0; i < t->n_stage; i++) {
        t->stage[i].buf = aligned_alloc(IO_ALIGN, stage_bytes(p->row_bytes));
        if (!t->stage[i].buf) goto oom;
        t->stage[i].slot = -1;
        t->free_stage[t->n_free_stage++] = i;
    }
    char ioerr[256];
    t->io = io_open(p->path, t->mode, t->n_stage, ioerr, sizeof ioerr);
    if (!t->io) {
        snprintf(err, err_len, "n-gram table: %s", ioerr);
        ngram_table_free(t);
        return NULL;
    }
    return t;
oom:
    snprintf(err, err_len, "n-gram table: out of memory for a cache of %d rows", p->cache_rows);
    ngram_table_free(t);
    return NULL;
}

/* ---- index ---------------------------------------------------------------------------------- */

static uint64_t hash_row(int64_t row) {
    uint64_t x = (uint64_t)row * 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 29);
}

static int32_t index_find(const ngram_table *t, int64_t row) {
    for (uint64_t h = hash_row(row) & t->index_mask;; h = (h + 1) & t->index_mask) {
        const int32_t s = t->index[h];
        if (s < 0) return -1;
        if (t->slots[s].row == row) return s;
    }
}

static void index_insert(ngram_table *t, int32_t s) {
    uint64_t h = hash_row(t->slots[s].row) & t->index_mask;
    while (t->index[h] >= 0) h = (h + 1) & t->index_mask;
    t->index[h] = s;
}

/* Remove slot s's row (linear probing: shift back the entries that probed past it). */
static void index_remove(ngram_table *t, int32_t s) {
    uint64_t h = hash_row(t->slots[s].row) & t->index_mask;
    while (t->index[h] != s) h = (h + 1) & t->index_mask;
    uint64_t hole = h;
    for (uint64_t i = (h + 1) & t->index_mask; t->index[i] >= 0; i = (i + 1) & t->index_mask) {
        const uint64_t home = hash_row(t->slots[t->index[i]].row) & t->index_mask;
        /* the entry at i may move to the hole when its home is not cyclically in (hole, i] */
        const bool stays = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
        if (!stays) {
            t->index[hole] = t->index[i];
            hole = i;
        }
    }
    t->index[hole] = -1;
}

/* ---- reads ---------------------------------------------------------------------------------- */

static int stage_finish(ngram_table *t, int si);

/* Start queued reads while staging buffers are free. 0 or -1 (submission failed). */
static int pump(ngram_table *t) {
    while (t->q_len > 0 && t->n_free_stage > 0) {
        const int32_t s = t->queue[t->q_head];
        t->q_head = (t->q_head + 1) % t->n_slots;
        t->q_len--;
        const int si = t->free_stage[--t->n_free_stage];
        staging *g = &t->stage[si];
        const uint64_t off = t->offset + (uint64_t)t->slots[s].row * t->row_bytes;
        if (t->mode == IO_DIRECT) {
            const uint64_t start = off / IO_ALIGN * IO_ALIGN;
            g->head = (uint32_t)(off - start);
            g->req = (io_req){.offset = start, .len = round_up(g->head + t->row_bytes, IO_ALIGN),
                              .need = g->head + t->row_bytes, .buf = g->buf};
        } else {
            g->head = 0;
            g->req = (io_req){.offset = off, .len = t->row_bytes, .need = t->row_bytes, .buf = g->buf};
        }
        g->slot = s;
        t->slots[s].state = SLOT_READING;
        t->slots[s].read = (int16_t)si;
        if (io_submit(t->io, &g->req) != 0) {
            sluice_set_error("n-gram table: read of row %lld not accepted: %s",
                             (long long)t->slots[s].row, strerror(errno));
            return -1;
        }
        t->inflight[(t->f_head + t->f_len) % t->n_stage] = si;
        t->f_len++;
        t->stats.reads++;
    }
    return 0;
}

/* Wait for the oldest read in flight and file its row. 0 or -1. */
static int finish_oldest(ngram_table *t) {
    const int si = t->inflight[t->f_head];
    t->f_head = (t->f_head + 1) % t->n_stage;
    t->f_len--;
    return stage_finish(t, si);
}

static int stage_finish(ngram_table *t, int si) {
    staging *g = &t->stage[si];
    const double t0 = now_s();
    const bool waited = __atomic_load_n(&g->req.state, __ATOMIC_ACQUIRE) != 2;
    const int e = io_wait(t->io, &g->req);
    if (waited) {
        t->stats.stall_s += now_s() - t0;
        t->stats.stalls++;
    }
    const int32_t s = g->slot;
    g->slot = -1;
    t->free_stage[t->n_free_stage++] = si;
    if (e != 0) {
        sluice_set_error("n-gram table: read of row %lld failed: %s", (long long)t->slots[s].row,
                         strerror(e));
        index_remove(t, s);
        t->slots[s] = (slot){.row = -1};
        return -1;
    }
    t->stats.bytes_read += g->req.done;
    memcpy(t->data + (size_t)s * t->row_bytes, g->buf + g->head, t->row_bytes);
    t->slots[s].state = SLOT_READY;
    return 0;
}

/* A slot for a new row: a free one, else the CLOCK victim among READY slots; -1 when every
 * slot is queued or being read. */
static int32_t take_slot(ngram_table *t) {
    for (int tries = 0; tries < 2 * t->n_slots; tries++) {
        const int32_t s = t->hand;
        t->hand = (t->hand + 1) % t->n_slots;
        slot *sl = &t->slots[s];
        if (sl->state == SLOT_FREE) return s;
        if (sl->state != SLOT_READY) continue;
        if (sl->ref) {
            sl->ref = 0;
            continue;
        }
        index_remove(t, s);
        t->stats.evictions++;
        *sl = (slot){.row = -1};
        return s;
    }
    return -1;
}

/* Queue a read of row into a slot; the slot id, or -1 when no slot can be had. */
static int32_t request(ngram_table *t, int64_t row) {
    const int32_t s = take_slot(t);
    if (s < 0) return -1;
    t->slots[s] = (slot){.row = row, .state = SLOT_QUEUED, .ref = 1, .read = -1};
    index_insert(t, s);
    t->queue[(t->q_head + t->q_len) % t->n_slots] = s;
    t->q_len++;
    return s;
}

void ngram_table_prefetch(ngram_table *t, const int32_t *rows, int n) {
    if (!t->io) return;
    /* reads that have landed give their staging buffers back first (in order, never waiting),
     * so that these rows go to the disk now rather than at the gather */
    io_poll(t->io);
    while (t->f_len > 0 && __atomic_load_n(&t->stage[t->inflight[t->f_head]].req.state, __ATOMIC_ACQUIRE) == 2)
        if (finish_oldest(t) != 0) break; /* the row is dropped: a gather reads it again */
    for (int i = 0; i < n; i++) {
        const int32_t s = index_find(t, rows[i]);
        if (s >= 0) {
            t->slots[s].ref = 1;
            continue;
        }
        if (request(t, rows[i]) < 0) break; /* the cache is full of rows in flight */
        t->stats.prefetched++;
    }
    if (pump(t) != 0) return; /* the error resurfaces when gather needs the row */
}

int ngram_table_gather(ngram_table *t, const int32_t *rows, int n, uint8_t *dst) {
    t->stats.gathers++;
    t->stats.lookups += (uint64_t)n;
    if (!t->io) {
        for (int i = 0; i < n; i++)
            memcpy(dst + (size_t)i * t->row_bytes, t->base + (uint64_t)rows[i] * t->row_bytes,
                   t->row_bytes);
        t->stats.hits += (uint64_t)n;
        return 0;
    }
    io_poll(t->io); /* reads that have landed count as landed: only real waits are stalls */
    for (int i = 0; i < n; i++) {
        int32_t s = index_find(t, rows[i]);
        if (s >= 0 && t->slots[s].state == SLOT_READY) {
            t->stats.hits++;
        } else {
            if (s < 0) {
                t->stats.misses++;
                s = request(t, rows[i]);
                while (s < 0) { /* every slot is in flight: let one land, then retry */
                    if (t->f_len == 0 && pump(t) != 0) return -1;
                    if (finish_oldest(t) != 0) return -1;
                    s = request(t, rows[i]);
                }
            }
            /* reads complete in submission order here: finish the older ones until ours */
            while (t->slots[s].state != SLOT_READY) {
                if (pump(t) != 0) return -1;
                if (t->slots[s].state == SLOT_QUEUED && t->f_len == 0) continue;
                if (finish_oldest(t) != 0) return -1;
            }
        }
        t->slots[s].ref = 1;
        memcpy(dst + (size_t)i * t->row_bytes, t->data + (size_t)s * t->row_bytes, t->row_bytes);
    }
    return pump(t);
}

void ngram_table_get_stats(const ngram_table *t, ngram_table_stats *s) { *s = t->stats; }
