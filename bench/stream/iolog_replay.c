/* iolog_replay: replay the reads of an fio iolog v2 (what SLUICE_IO_LOG writes) with direct I/O
 * on io_uring at a fixed queue depth, as fast as the disk gives them, and print the time; for
 * machines without fio (bench/stream/io_ceiling.sh uses fio where it is installed). One file.
 *
 *   cc -O2 -o iolog_replay bench/stream/iolog_replay.c -luring
 *   iolog_replay LOG DEPTH [SKIP_BYTES]
 *
 * SKIP_BYTES: the reads that make up the log's first SKIP_BYTES bytes are not replayed (the
 * prompt's, as io_ceiling.sh --skip-bytes). Drop the page cache first if the file's pages might
 * be cached (direct reads bypass it, but a device's own cache does not). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct rd {
    uint64_t off, len;
} rd;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s LOG DEPTH [SKIP_BYTES]\n", argv[0]);
        return 2;
    }
    const int depth = atoi(argv[2]);
    const uint64_t skip = argc > 3 ? strtoull(argv[3], NULL, 10) : 0;
    FILE *fp = fopen(argv[1], "r");
    if (!fp || depth < 1 || depth > 4096) {
        fprintf(stderr, "iolog_replay: cannot open %s or bad depth\n", argv[1]);
        return 1;
    }
    char line[4096], path[4096] = "", name[4096], act[64];
    size_t n = 0, cap = 1 << 16;
    rd *r = malloc(cap * sizeof *r);
    uint64_t dropped = 0, maxlen = 0, bytes = 0;
    while (r && fgets(line, sizeof line, fp)) {
        unsigned long long off, len;
        if (sscanf(line, "%4095s %63s %llu %llu", name, act, &off, &len) == 4 && !strcmp(act, "read")) {
            if (!path[0]) snprintf(path, sizeof path, "%s", name);
            if (strcmp(name, path)) continue; /* one file: the model's */
            if (dropped < skip) {
                dropped += len;
                continue;
            }
            if (n == cap) r = realloc(r, (cap *= 2) * sizeof *r);
            if (!r) break;
            r[n++] = (rd){off, len};
            if (len > maxlen) maxlen = len;
            bytes += len;
        }
    }
    fclose(fp);
    if (!r || n == 0) {
        fprintf(stderr, "iolog_replay: no reads to replay\n");
        return 1;
    }
    const int fd = open(path, O_RDONLY | O_DIRECT);
    struct io_uring ring;
    if (fd < 0 || io_uring_queue_init((unsigned)depth, &ring, 0) != 0) {
        fprintf(stderr, "iolog_replay: cannot open %s with O_DIRECT or set up io_uring\n", path);
        return 1;
    }
    const size_t stride = (maxlen + 4095) / 4096 * 4096;
    uint8_t *buf = NULL;
    if (posix_memalign((void **)&buf, 2 << 20, (size_t)depth * stride) != 0) return 1;
    /* in 2 MiB pages, as the engine's slot pool (experts_stream.c): on the Zen 5 VM the same
     * 7.26 GB replayed at depth 128 in 1.02-1.13 s into 2 MiB pages and 1.96-3.65 s into 4 KiB
     * pages; then faulted in before the clock starts */
    (void)madvise(buf, (size_t)depth * stride, MADV_HUGEPAGE);
    memset(buf, 0, (size_t)depth * stride);
    int *free_slots = malloc(sizeof(int) * (size_t)depth), nfree = depth;
    for (int i = 0; i < depth; i++) free_slots[i] = i;
    size_t next = 0, done = 0;
    int errors = 0;
    uint64_t got = 0; /* bytes the reads returned (a short read is not resubmitted: reported) */
    const double t0 = now();
    while (done < n) {
        while (next < n && nfree > 0) {
            const int s = free_slots[--nfree];
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            io_uring_prep_read(sqe, fd, buf + (size_t)s * stride, (unsigned)r[next].len, r[next].off);
            io_uring_sqe_set_data64(sqe, (uint64_t)s);
            next++;
        }
        io_uring_submit(&ring);
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&ring, &cqe) != 0) return 1;
        do {
            if (cqe->res < 0) errors++;
            else got += (uint64_t)cqe->res;
            free_slots[nfree++] = (int)io_uring_cqe_get_data64(cqe);
            io_uring_cqe_seen(&ring, cqe);
            done++;
        } while (io_uring_peek_cqe(&ring, &cqe) == 0);
    }
    const double secs = now() - t0;
    printf("depth %d: %zu reads, %.1f MB in %.3f s, %.2f GB/s%s%s\n", depth, n, (double)bytes / 1e6, secs,
           (double)bytes / 1e9 / secs, errors ? " (some reads failed)" : "", got < bytes ? " (some reads short)" : "");
    return errors ? 1 : 0;
}
