/* The I/O engine's read log (runtime/io.c, SLUICE_IO_LOG): what fio replays as a run's I/O
 * ceiling (bench/stream/io_ceiling.sh). Checked with both back ends (io_uring and the pread
 * pool) and both modes (direct where the file system allows it, page):
 *   - the reads still return the file's bytes;
 *   - the log is fio's iolog version 2: the header once, "PATH add" and "PATH open" for each
 *     engine, one "PATH read OFFSET LENGTH" per submitted read in submission order, "PATH close"
 *     when the engine closes; PATH is the file's absolute path;
 *   - two engines of one process share the file (one header, both engines' lines);
 *   - a log that cannot be opened leaves the engine working (a warning only);
 *   - without SLUICE_IO_LOG nothing is written. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "runtime/io.h"

#define FILE_BYTES (64 * IO_ALIGN)

static char dir[512], data_path[600], log_path[600];
static uint8_t *expect;

static void make_data(void) {
    snprintf(dir, sizeof dir, "%s/io-XXXXXX", SLUICE_TEST_WORK);
    CHECK(mkdtemp(dir) != NULL);
    snprintf(data_path, sizeof data_path, "%s/data.bin", dir);
    snprintf(log_path, sizeof log_path, "%s/reads.iolog", dir);
    expect = malloc(FILE_BYTES);
    for (int i = 0; i < FILE_BYTES; i++) expect[i] = (uint8_t)(i * 131u + (i >> 12));
    FILE *f = fopen(data_path, "wb");
    CHECK(f && fwrite(expect, 1, FILE_BYTES, f) == FILE_BYTES);
    if (f) fclose(f);
}

/* Reads of (offset, len) in pages; checks their bytes. */
static const int reads[][2] = {{0, 1}, {5, 3}, {17, 8}, {63, 1}, {40, 16}};
#define N_READS ((int)(sizeof reads / sizeof reads[0]))

static bool run_reads(io_mode mode) {
    char err[256];
    io_engine *io = io_open(data_path, mode, 4, err, sizeof err);
    if (!io) return false;
    void *buf = NULL;
    CHECK(posix_memalign(&buf, IO_ALIGN, 16 * IO_ALIGN) == 0);
    for (int k = 0; k < N_READS; k++) {
        io_req r = {.offset = (uint64_t)reads[k][0] * IO_ALIGN, .len = (uint64_t)reads[k][1] * IO_ALIGN,
                    .need = (uint64_t)reads[k][1] * IO_ALIGN, .buf = buf};
        CHECK(io_submit(io, &r) == 0 && io_wait(io, &r) == 0);
        CHECKF(memcmp(buf, expect + r.offset, r.len) == 0, "read %d", k);
    }
    free(buf);
    io_close(io);
    return true;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = calloc(1, 1 << 16);
    size_t n = fread(s, 1, (1 << 16) - 1, f);
    s[n] = 0;
    fclose(f);
    return s;
}

/* The log of `engines` engines run one after another, each reading `reads`. */
static void check_log(const char *text, int engines) {
    char *abs = realpath(data_path, NULL);
    CHECK(abs != NULL);
    if (!abs || !text) return;
    char want[8192] = "fio version 2 iolog\n";
    for (int e = 0; e < engines; e++) {
        size_t n = strlen(want);
        n += (size_t)snprintf(want + n, sizeof want - n, "%s add\n%s open\n", abs, abs);
        for (int k = 0; k < N_READS; k++)
            n += (size_t)snprintf(want + n, sizeof want - n, "%s read %llu %llu\n", abs,
                                  (unsigned long long)reads[k][0] * IO_ALIGN, (unsigned long long)reads[k][1] * IO_ALIGN);
        snprintf(want + n, sizeof want - n, "%s close\n", abs);
    }
    CHECKF(strcmp(text, want) == 0, "log:\n%s\nwanted:\n%s", text, want);
    free(abs);
}

int main(void) {
    make_data();
    const char *backends[] = {"io_uring", "pread"};
    for (int b = 0; b < 2; b++) {
        setenv("SLUICE_IO_BACKEND", backends[b], 1);
        for (int m = 0; m < 2; m++) {
            const io_mode mode = m == 0 ? IO_DIRECT : IO_PAGE;
            unlink(log_path);
            unsetenv("SLUICE_IO_LOG");
            if (!run_reads(mode)) {
                CHECK(mode == IO_DIRECT); /* direct I/O may be unsupported here; page never is */
                continue;
            }
            CHECK(access(log_path, F_OK) != 0); /* no SLUICE_IO_LOG: no log */
            setenv("SLUICE_IO_LOG", log_path, 1);
            CHECK(run_reads(mode));
            CHECK(run_reads(mode)); /* a second engine appends to the same log */
            char *text = slurp(log_path);
            check_log(text, 2);
            free(text);
            /* a log that cannot be opened: the engine still reads */
            char bad[700];
            snprintf(bad, sizeof bad, "%s/no-such-dir/reads.iolog", dir);
            setenv("SLUICE_IO_LOG", bad, 1);
            CHECK(run_reads(mode));
            unsetenv("SLUICE_IO_LOG");
        }
    }
    unlink(log_path);
    unlink(data_path);
    rmdir(dir);
    free(expect);
    CHECK_DONE();
}
