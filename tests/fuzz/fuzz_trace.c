/* libFuzzer target for the routing-trace reader used by `sluice cachesim` (trace_load in
 * src/tools/trace.c, format in docs/trace-format.md). trace_load reads a path, so the input is
 * put in a memfd and opened as /proc/self/fd/N. Contract as fuzz_gguf: either every record's
 * layer and experts are in range of the header, or the input is refused with one non-empty
 * line. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tools/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static int fd = -1;
static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fd = memfd_create("fuzz_trace", MFD_CLOEXEC);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
    trace t;
    char err[512] = "";
    if (trace_load(path, &t, err, sizeof err) != 0) {
        if (!err[0] || strchr(err, '\n')) abort(); /* errors are one non-empty line */
        return 0;
    }
    if (t.n_layer == 0 || t.n_layer > 65535 || t.n_expert == 0 || t.n_expert > 65535 || t.k == 0 ||
        t.k > TRACE_MAX_K || t.k > t.n_expert)
        abort();
    if (size < TRACE_HEADER_BYTES || t.n_records > (size - TRACE_HEADER_BYTES) / (8 + 4 * t.k))
        abort();
    volatile double sink = 0;
    for (size_t i = 0; i < t.n_records; i++) {
        if (t.layer[i] >= t.n_layer) abort();
        sink += t.seq[i] + t.pos[i];
        for (size_t j = 0; j < t.k; j++) {
            if (t.experts[i * t.k + j] >= t.n_expert) abort();
            sink += t.weights[i * t.k + j];
        }
    }
    (void)sink;
    trace_free(&t);
    return 0;
}
