/* I/O engine: io_uring when available, else a pread thread pool (see io.h). Setting the
 * environment variable SLUICE_IO_BACKEND=pread forces the pool (tests cover both).
 *
 * SLUICE_IO_LOG=FILE appends every read an engine submits to FILE as fio's iolog (version 2:
 * "PATH read OFFSET LENGTH" lines after "PATH add" / "PATH open"), so that `fio --read_iolog=FILE
 * --replay_no_stall=1 --direct=1 --ioengine=io_uring --iodepth=N` replays exactly a run's reads
 * as fast as the disk gives them: the I/O ceiling of that run, with its offsets and sizes
 * (bench/stream/io_ceiling.sh). Each line is one write() to a file opened O_APPEND, so engines
 * of one process (experts, n-gram table) may share the file. */
#include "runtime/io.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define IO_MAX_CHUNK (1u << 30) /* one read call moves at most 1 GiB */

struct io_engine {
    int fd;
    io_mode mode;
    int depth;
    bool uring;
    struct io_uring ring;
    int in_flight;
    /* pread pool */
    pthread_t *threads;
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    io_req **queue;
    int q_head, q_len;
    bool quit;
    /* statistics */
    atomic_ulong reads, bytes;
    double wait_s;
    /* SLUICE_IO_LOG: the log's descriptor (-1: none) and the file's path as the log names it */
    int log_fd;
    char *log_path;
};

/* Open the read log named by SLUICE_IO_LOG (if any) for path: the iolog header when the file is
 * new, then this file's add and open lines. A log that cannot be opened is reported once and
 * left off: it is a measurement aid, never a reason to fail a run. */
static void log_open(io_engine *io, const char *path) {
    io->log_fd = -1;
    const char *log = getenv("SLUICE_IO_LOG");
    if (!log || !*log) return;
    char *abs = realpath(path, NULL);
    int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    const bool fresh = fd >= 0;
    if (!fresh) fd = open(log, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0 || !abs) {
        fprintf(stderr, "sluice: SLUICE_IO_LOG=%s: %s (no read log)\n", log, strerror(errno));
        if (fd >= 0) close(fd);
        free(abs);
        return;
    }
    if (fresh) dprintf(fd, "fio version 2 iolog\n");
    dprintf(fd, "%s add\n", abs);
    dprintf(fd, "%s open\n", abs);
    io->log_fd = fd;
    io->log_path = abs;
}

static void log_read(const io_engine *io, const io_req *r) {
    if (io->log_fd < 0) return;
    char line[4352];
    const int n = snprintf(line, sizeof line, "%s read %llu %llu\n", io->log_path, (unsigned long long)r->offset,
                           (unsigned long long)r->len);
    if (n <= 0 || n >= (int)sizeof line) return; /* a path too long for a line: not logged */
    const ssize_t w = write(io->log_fd, line, (size_t)n); /* best effort: a measurement aid */
    (void)w;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* After `got` more bytes (0 = end of file): finished? Sets err when the request cannot be
 * satisfied. */
static bool advance(io_engine *io, io_req *r, uint64_t got) {
    r->done += got;
    if (r->done >= r->len) return true;
    /* end of file, or a short direct read that leaves the position unaligned */
    if (got == 0 || (io->mode == IO_DIRECT && r->done % IO_ALIGN != 0)) {
        if (r->done < r->need) r->err = EIO; /* the file is shorter than the model says */
        return true;
    }
    return false; /* continue with the remainder */
}

static void complete(io_engine *io, io_req *r) {
    atomic_fetch_add(&io->reads, 1);
    atomic_fetch_add(&io->bytes, r->done);
    __atomic_store_n(&r->state, 2, __ATOMIC_RELEASE);
}

/* ---- io_uring ------------------------------------------------------------------------------- */

static void uring_queue(io_engine *io, io_req *r) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    while (!sqe) { /* the submission queue is full: push what is there */
        io_uring_submit(&io->ring);
        sqe = io_uring_get_sqe(&io->ring);
    }
    uint64_t left = r->len - r->done;
    unsigned n = left > IO_MAX_CHUNK ? IO_MAX_CHUNK : (unsigned)left;
    io_uring_prep_read(sqe, io->fd, (char *)r->buf + r->done, n, r->offset + r->done);
    io_uring_sqe_set_data(sqe, r);
    io_uring_submit(&io->ring);
    io->in_flight++;
}

static void uring_handle(io_engine *io, struct io_uring_cqe *cqe) {
    io_req *r = io_uring_cqe_get_data(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&io->ring, cqe);
    io->in_flight--;
    if (res == -EINTR || res == -EAGAIN) {
        uring_queue(io, r);
        return;
    }
    if (res < 0) {
        r->err = -res;
        complete(io, r);
        return;
    }
    if (advance(io, r, (uint64_t)res)) complete(io, r);
    else uring_queue(io, r);
}

static void uring_reap(io_engine *io, bool block) {
    struct io_uring_cqe *cqe;
    if (block) {
        int rc;
        do rc = io_uring_wait_cqe(&io->ring, &cqe);
        while (rc == -EINTR);
        if (rc == 0) uring_handle(io, cqe);
    }
    while (io_uring_peek_cqe(&io->ring, &cqe) == 0) uring_handle(io, cqe);
}

/* ---- pread pool ----------------------------------------------------------------------------- */

static void pool_read(io_engine *io, io_req *r) {
    for (;;) {
        uint64_t left = r->len - r->done;
        size_t n = left > IO_MAX_CHUNK ? IO_MAX_CHUNK : (size_t)left;
        ssize_t got = pread(io->fd, (char *)r->buf + r->done, n, (off_t)(r->offset + r->done));
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            r->err = errno;
            return;
        }
        if (advance(io, r, (uint64_t)got)) return;
    }
}

static void *pool_main(void *arg) {
    io_engine *io = arg;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        while (!io->quit && io->q_len == 0) pthread_cond_wait(&io->cv_work, &io->mu);
        if (io->quit) break;
        io_req *r = io->queue[io->q_head];
        io->q_head = (io->q_head + 1) % io->depth;
        io->q_len--;
        pthread_mutex_unlock(&io->mu);
        pool_read(io, r);
        pthread_mutex_lock(&io->mu);
        complete(io, r);
        io->in_flight--;
        pthread_cond_broadcast(&io->cv_done);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

/* ---- interface ------------------------------------------------------------------------------ */

io_engine *io_open(const char *path, io_mode mode, int depth, char *err, size_t err_len) {
    if (depth < 1) depth = 1;
    if (depth > 1024) depth = 1024;
    io_engine *io = calloc(1, sizeof *io);
    if (!io) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    io->mode = mode;
    io->depth = depth;
    io->log_fd = -1;
    io->fd = open(path, O_RDONLY | O_CLOEXEC | (mode == IO_DIRECT ? O_DIRECT : 0));
    if (io->fd < 0) {
        snprintf(err, err_len, "%s: %s%s", path, strerror(errno),
                 mode == IO_DIRECT && errno == EINVAL ? " (direct I/O unsupported here: try --io page)" : "");
        free(io);
        return NULL;
    }
    log_open(io, path);
    const char *force = getenv("SLUICE_IO_BACKEND");
    bool want_uring = !(force && strcmp(force, "pread") == 0);
    if (want_uring && io_uring_queue_init((unsigned)depth, &io->ring, 0) == 0) {
        io->uring = true;
        return io;
    }
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->cv_work, NULL);
    pthread_cond_init(&io->cv_done, NULL);
    io->queue = calloc((size_t)depth, sizeof *io->queue);
    io->n_threads = depth < 8 ? depth : 8;
    io->threads = calloc((size_t)io->n_threads, sizeof *io->threads);
    if (!io->queue || !io->threads) {
        snprintf(err, err_len, "out of memory");
        io_close(io);
        return NULL;
    }
    for (int i = 0; i < io->n_threads; i++)
        if (pthread_create(&io->threads[i], NULL, pool_main, io) != 0) {
            io->n_threads = i;
            break;
        }
    if (io->n_threads == 0) {
        snprintf(err, err_len, "cannot start I/O threads");
        io_close(io);
        return NULL;
    }
    return io;
}

void io_close(io_engine *io) {
    if (!io) return;
    if (io->uring) {
        while (io->in_flight > 0) uring_reap(io, true);
        io_uring_queue_exit(&io->ring);
    } else if (io->threads) {
        pthread_mutex_lock(&io->mu);
        while (io->in_flight > 0) pthread_cond_wait(&io->cv_done, &io->mu);
        io->quit = true;
        pthread_cond_broadcast(&io->cv_work);
        pthread_mutex_unlock(&io->mu);
        for (int i = 0; i < io->n_threads; i++) pthread_join(io->threads[i], NULL);
    }
    if (!io->uring) {
        pthread_mutex_destroy(&io->mu);
        pthread_cond_destroy(&io->cv_work);
        pthread_cond_destroy(&io->cv_done);
    }
    free(io->threads);
    free(io->queue);
    if (io->fd >= 0) close(io->fd);
    if (io->log_fd >= 0) {
        dprintf(io->log_fd, "%s close\n", io->log_path);
        close(io->log_fd);
    }
    free(io->log_path);
    free(io);
}

const char *io_backend_name(const io_engine *io) { return io->uring ? "io_uring" : "pread pool"; }

int io_submit(io_engine *io, io_req *r) {
    if (io->mode == IO_DIRECT &&
        (r->offset % IO_ALIGN || r->len % IO_ALIGN || (uintptr_t)r->buf % IO_ALIGN)) {
        errno = EINVAL;
        return -1;
    }
    if (r->need > r->len) r->need = r->len;
    r->done = 0;
    r->err = 0;
    r->state = 1;
    log_read(io, r);
    if (io->uring) {
        while (io->in_flight >= io->depth) uring_reap(io, true);
        uring_queue(io, r);
        return 0;
    }
    pthread_mutex_lock(&io->mu);
    while (io->in_flight >= io->depth) pthread_cond_wait(&io->cv_done, &io->mu);
    io->queue[(io->q_head + io->q_len) % io->depth] = r;
    io->q_len++;
    io->in_flight++;
    pthread_cond_signal(&io->cv_work);
    pthread_mutex_unlock(&io->mu);
    return 0;
}

int io_wait(io_engine *io, io_req *r) {
    if (__atomic_load_n(&r->state, __ATOMIC_ACQUIRE) != 2) {
        double t0 = now_s();
        if (io->uring) {
            while (__atomic_load_n(&r->state, __ATOMIC_ACQUIRE) != 2) uring_reap(io, true);
        } else {
            pthread_mutex_lock(&io->mu);
            while (__atomic_load_n(&r->state, __ATOMIC_ACQUIRE) != 2)
                pthread_cond_wait(&io->cv_done, &io->mu);
            pthread_mutex_unlock(&io->mu);
        }
        io->wait_s += now_s() - t0;
    }
    return r->err;
}

void io_poll(io_engine *io) {
    if (io->uring) uring_reap(io, false);
}

void io_get_stats(const io_engine *io, io_stats *st) {
    st->reads = atomic_load(&((io_engine *)io)->reads);
    st->bytes = atomic_load(&((io_engine *)io)->bytes);
    st->wait_s = io->wait_s;
}
