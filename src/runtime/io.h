/* The I/O engine: asynchronous reads of file ranges into caller buffers.
 *
 *   direct  O_DIRECT reads (no page cache: memory use is exactly what the cache holds), via
 *           io_uring; buffers, offsets and lengths must be multiples of IO_ALIGN
 *   page    buffered reads through the page cache (same calls; no alignment needed)
 *
 * io_uring is used when the kernel allows it; otherwise a pool of threads issues pread. Short
 * reads are continued, EINTR/EAGAIN retried, EIO and unexpected end of file reported per
 * request. One thread submits and waits (the engine's compute thread); no locking is needed for
 * that side. */
#ifndef SLUICE_IO_H
#define SLUICE_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IO_ALIGN 4096

typedef enum io_mode { IO_DIRECT = 0, IO_PAGE = 1 } io_mode;

typedef struct io_engine io_engine;

typedef struct io_req {
    uint64_t offset;    /* file offset */
    uint64_t len;       /* bytes to read (direct: multiple of IO_ALIGN) */
    uint64_t need;      /* bytes that must arrive (<= len; the rest may lie past end of file) */
    void *buf;
    /* filled by the engine */
    uint64_t done;      /* bytes read so far */
    int err;            /* 0, or a positive errno once failed */
    volatile int state; /* 0 idle, 1 in flight, 2 complete */
} io_req;

/* Open path for reading. depth: reads in flight at most. NULL with err on failure. */
io_engine *io_open(const char *path, io_mode mode, int depth, char *err, size_t err_len);
void io_close(io_engine *io);
const char *io_backend_name(const io_engine *io); /* "io_uring" or "pread pool" */

/* Start a read. The request must stay valid until it completes. 0, or -1 (errno set) when the
 * request is invalid (unaligned in direct mode). */
int io_submit(io_engine *io, io_req *r);
/* Block until r completes. 0, or the request's errno. */
int io_wait(io_engine *io, io_req *r);
/* Reap finished reads without blocking. */
void io_poll(io_engine *io);

typedef struct io_stats {
    uint64_t reads, bytes;
    double wait_s; /* time spent blocked in io_wait */
} io_stats;
void io_get_stats(const io_engine *io, io_stats *st);

#endif /* SLUICE_IO_H */
