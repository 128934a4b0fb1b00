/* Page-cache helpers of the tests that watch how a model file is read in (test_stream_load,
 * test_resident_hugepages): how much of the process's mappings of a file 2 MiB entries map
 * (/proc/self/smaps), and the file's pages dropped or read back in 4 KiB pages. */
#ifndef SLUICE_TEST_PAGE_CACHE_H
#define SLUICE_TEST_PAGE_CACHE_H

#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* bytes of the process's mappings of path that 2 MiB entries map (FilePmdMapped), and the
 * mappings' size; -1 when smaps cannot be read */
static inline long long pmd_bytes_of(const char *path, long long *mapped) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[4608];
    bool ours = false;
    long long kb = 0, size_kb = 0, v;
    const size_t pl = strlen(path);
    while (fgets(line, sizeof line, f)) {
        const bool header = (line[0] >= '0' && line[0] <= '9') || (line[0] >= 'a' && line[0] <= 'f');
        if (header) {
            size_t n = strlen(line);
            while (n && line[n - 1] == '\n') line[--n] = 0;
            ours = n >= pl && strcmp(line + n - pl, path) == 0;
        } else if (ours && sscanf(line, "FilePmdMapped: %lld kB", &v) == 1) {
            kb += v;
        } else if (ours && sscanf(line, "Size: %lld kB", &v) == 1) {
            size_kb += v;
        }
    }
    fclose(f);
    if (mapped) *mapped = size_kb * 1024;
    return kb * 1024;
}

/* drop the file's pages from the page cache, or read it back in 4 KiB pages */
static inline bool drop_file(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return false;
    fsync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return true;
}

static inline bool fill_small_pages(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return false;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM); /* the read path then adds 4 KiB folios only */
    char *buf = malloc((size_t)1 << 20);
    off_t off = 0;
    ssize_t r = 0;
    while (buf && (r = pread(fd, buf, (size_t)1 << 20, off)) > 0) off += r;
    free(buf);
    close(fd);
    return r == 0;
}

#endif
