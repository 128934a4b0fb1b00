/* libFuzzer target for the expert layout / expert-major store manifest reader
 * (expert_layout_load in src/formats/store.c, the sluice.store.* metadata of a store written by
 * `sluice repack`) and, for stores, the whole `sluice verify` check (store_verify).
 *
 * Input: byte 0 picks how the layout is asked for (bit 0: as `sluice verify` and repack do, with
 * the layer and expert counts taken from the file; else as the model loader does, with
 * n_layer = byte 1 % 64 and n_expert = byte 2); bit 1 also runs store_verify on the bytes
 * (through a memfd). The rest (from byte 3) is the GGUF file, opened from memory.
 *
 * Contract as fuzz_gguf: either a layout whose every expert matrix lies inside the input, or
 * one non-empty line of error; never a crash, leak or undefined behaviour. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "formats/gguf.h"
#include "formats/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static int fd = -1;
static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fd = memfd_create("fuzz_store", MFD_CLOEXEC);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    return 0;
}

static void check_layout(const expert_layout *l, const gguf_file *f, const uint8_t *file,
                         size_t size) {
    if (l->n_layer < 0 || l->n_expert < 0 || !l->layers) abort();
    volatile uint64_t sink = 0;
    for (int i = 0; i < l->n_layer; i++) {
        const expert_layer_layout *L = &l->layers[i];
        if (!L->present) continue;
        for (int p = 0; p < EXPERT_PARTS; p++) {
            const expert_part *P = &L->part[p];
            if (!P->bytes || P->ne0 <= 0 || P->ne1 <= 0) abort();
            if (l->n_expert == 0) continue;
            const uint64_t last = expert_part_offset(P, l->n_expert - 1);
            if (P->offset < f->data_offset || last > size || P->bytes > size - last) abort();
            sink += file[P->offset] + file[last + P->bytes - 1];
        }
        if (l->packed && l->n_expert &&
            (L->record_offset > size ||
             L->record_stride * (uint64_t)l->n_expert > size - L->record_offset))
            abort();
    }
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    const uint8_t mode = data[0];
    const int n_layer = mode & 1 ? -1 : data[1] % 64, n_expert = mode & 1 ? -1 : data[2];
    size -= 3;
    /* a copy at malloc's alignment, as a mapped file's bytes would be */
    uint8_t *file = malloc(size ? size : 1);
    if (!file) abort();
    memcpy(file, data + 3, size);
    char err[512] = "";
    gguf_file *f = gguf_open_memory(file, size, err, sizeof err);
    if (!f) {
        free(file);
        return 0; /* fuzz_gguf covers the GGUF reader's errors */
    }
    expert_layout l;
    if (expert_layout_load(f, n_layer, n_expert, &l, err, sizeof err) != 0) {
        if (!err[0] || strchr(err, '\n')) abort(); /* errors are one non-empty line */
    } else {
        check_layout(&l, f, file, size);
        expert_layout_free(&l);
    }
    gguf_close(f);
    if (mode & 2) {
        if (ftruncate(fd, 0) != 0 || pwrite(fd, file, size, 0) != (ssize_t)size) abort();
        store_verify_report rep;
        err[0] = 0;
        if (store_verify(path, &rep, NULL, NULL, err, sizeof err) != 0 &&
            (!err[0] || strchr(err, '\n')))
            abort();
    }
    free(file);
    return 0;
}
