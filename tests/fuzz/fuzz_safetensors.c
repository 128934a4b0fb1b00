/* libFuzzer target for the safetensors reader (src/formats/safetensors.c). st_open only opens
 * paths, so the input is written to files in a private temporary directory:
 *
 *   first byte even: the rest is one .safetensors file (opened through its path);
 *   first byte odd:  a sharded checkpoint directory: the rest is split at the first NUL into
 *                    model.safetensors.index.json and one shard, written as
 *                    model-00001-of-00001.safetensors (the name the seeds' index uses).
 *
 * Contract as fuzz_gguf: either every tensor lies inside its file and matches its shape, or the
 * input is refused with one non-empty line. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char dir[256];

static void cleanup(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model-00001-of-00001.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/one.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    /* memory-backed when there is one: a file system write per input is the cost of a run */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/fuzz_st.XXXXXX", tmp);
    if (!mkdtemp(dir)) abort();
    atexit(cleanup);
    return 0;
}

static void put(const char *name, const uint8_t *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    if (!fp || (n && fwrite(p, 1, n, fp) != n) || fclose(fp) != 0) abort();
}

static void check(const st_set *s) {
    volatile uint64_t sink = 0;
    const size_t n = st_count(s);
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_at(s, i);
        if (!t || !t->name[0] || st_find(s, t->name) != t) abort();
        if (i && strcmp(st_at(s, i - 1)->name, t->name) >= 0) abort(); /* name order */
        if (t->n_dims < 0 || t->n_dims > ST_MAX_DIMS || t->file < 0 || t->file >= st_n_files(s))
            abort();
        if ((uint64_t)st_nelements(t) * st_dtype_size(t->dtype) != t->nbytes) abort();
        /* the first and last byte: ASan faults if the range leaves the mapping */
        if (t->nbytes) sink += t->data[0] + t->data[t->nbytes - 1];
        if (st_is_float(t->dtype) && t->nbytes) {
            const int64_t ne = st_nelements(t);
            float f = st_get_f32(t, ne - 1);
            sink += (uint64_t)(f == f);
            float buf[4];
            const int64_t m = ne < 4 ? ne : 4;
            st_to_f32(t, ne - m, m, buf);
            sink += (uint64_t)(buf[0] == buf[0]);
        }
    }
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const bool sharded = data[0] & 1;
    data++;
    size--;
    char path[512], err[512] = "";
    if (!sharded) {
        put("one.safetensors", data, size);
        snprintf(path, sizeof path, "%s/one.safetensors", dir);
    } else {
        const uint8_t *nul = memchr(data, 0, size);
        const size_t ilen = nul ? (size_t)(nul - data) : size;
        put("model.safetensors.index.json", data, ilen);
        put("model-00001-of-00001.safetensors", nul ? nul + 1 : data, nul ? size - ilen - 1 : 0);
        snprintf(path, sizeof path, "%s", dir);
    }
    st_set *s = st_open(path, err, sizeof err);
    if (!s) {
        if (!err[0] || strchr(err, '\n')) abort(); /* errors are one non-empty line */
        return 0;
    }
    check(s);
    st_close(s);
    return 0;
}
