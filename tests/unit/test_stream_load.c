/* A streamed model reads its dense weights in at load (engine/model.c, populate_dense_runs):
 * right after sluice_model_load, every page of the output head (less 2 MiB at each end, where the
 * run's huge pages stop) is in the page cache, while no page inside a routed expert tensor is (experts are read with direct I/O
 * into the expert cache, and the mapping's expert bytes must stay out of a cgroup's page cache).
 * A plan-only load reads nothing.
 *
 * The model is a one-layer qwen3moe-mini from synth (a 124 MB Q6_K output head). Page-cache
 * residency is read with mincore() on a second mapping of the same file; where the file system
 * cannot drop the file's pages first (tmpfs), or the kernel has no MADV_POPULATE_READ, the test
 * says so and skips (77). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "formats/gguf.h"
#include "sluice.h"
#include "tools/synth.h"

#define PAGE 4096u
#define HUGE_PAGE (2u << 20)

/* pages of [a, b) (rounded inward to pages) in the page cache, and how many pages that is */
static size_t resident_pages(const uint8_t *a, const uint8_t *b, size_t *n_pages) {
    uintptr_t lo = ((uintptr_t)a + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
    uintptr_t hi = (uintptr_t)b & ~(uintptr_t)(PAGE - 1);
    *n_pages = 0;
    if (hi <= lo) return 0;
    size_t n = (hi - lo) / PAGE, in = 0;
    unsigned char *vec = malloc(n);
    if (!vec || mincore((void *)lo, hi - lo, vec) != 0) {
        free(vec);
        return (size_t)-1;
    }
    for (size_t i = 0; i < n; i++) in += vec[i] & 1;
    free(vec);
    *n_pages = n;
    return in;
}

static const gguf_tensor *tensor(const gguf_file *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    return NULL;
}

/* a tensor's bytes less HUGE_PAGE at each end, where a large page-cache folio can be shared with
 * the neighbouring bytes (the header that gguf_open has read, a dense neighbour) */
static void interior(const gguf_tensor *t, const uint8_t **a, const uint8_t **b) {
    const uint8_t *p = t->data;
    *a = p + HUGE_PAGE;
    *b = p + t->nbytes - HUGE_PAGE;
}

/* drop the file's pages from the page cache; true when none inside [a, b) is left */
static bool drop_cached(const char *path, const uint8_t *a, const uint8_t *b) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return false;
    fsync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    size_t n;
    return resident_pages(a, b, &n) == 0;
}

int main(void) {
#ifndef MADV_POPULATE_READ
    printf("skipped: this system's headers have no MADV_POPULATE_READ\n");
    return 77;
#else
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/stream-load-mini.gguf", SLUICE_TEST_WORK);
    synth_options o = {.preset = "qwen3moe-mini", .type = "Q4_K_M", .out = path, .seed = 3,
                       .n_threads = 2, .n_layer = 1};
    CHECKF(synth_run(&o, NULL, err, sizeof err) == 0, "synth: %s", err);
    gguf_file *g = gguf_open(path, err, sizeof err);
    CHECKF(g != NULL, "%s", err);
    if (!g) CHECK_DONE();
    const gguf_tensor *head = tensor(g, "output.weight"), *up = tensor(g, "blk.0.ffn_up_exps.weight"),
                      *down = tensor(g, "blk.0.ffn_down_exps.weight");
    CHECK(head && up && down && head->nbytes > 8 * (uint64_t)HUGE_PAGE);
    if (!head || !up || !down) CHECK_DONE();
    CHECK(up->nbytes > 3 * (uint64_t)HUGE_PAGE && down->nbytes > 3 * (uint64_t)HUGE_PAGE);
    const uint8_t *h0, *h1, *u0, *u1, *d0, *d1;
    interior(head, &h0, &h1);
    interior(up, &u0, &u1);
    interior(down, &d0, &d1);
    size_t n_head, n_up, n_down;

    if (!drop_cached(path, h0, h1) || resident_pages(u0, u1, &n_up) != 0 || resident_pages(d0, d1, &n_down) != 0) {
        printf("skipped: the file system keeps the file's pages (tmpfs?); residency cannot be observed\n");
        gguf_close(g);
        remove(path);
        return 77;
    }
    /* a plan-only load reads no weights */
    sluice_model_params plan = {.mode = SLUICE_MODE_STREAM, .plan_only = true, .n_ctx = 64};
    sluice_model *m = sluice_model_load(path, &plan);
    CHECKF(m != NULL, "plan-only load: %s", sluice_last_error());
    sluice_model_free(m);
    CHECK(resident_pages(h0, h1, &n_head) == 0);

    sluice_model_params mp = {.mode = SLUICE_MODE_STREAM, .io = SLUICE_IO_DIRECT, .n_ctx = 64};
    m = sluice_model_load(path, &mp);
    CHECKF(m != NULL, "streamed load: %s", sluice_last_error());
    size_t in_head = resident_pages(h0, h1, &n_head);
    size_t in_up = resident_pages(u0, u1, &n_up);
    size_t in_down = resident_pages(d0, d1, &n_down);
    printf("after a streamed load: output head %zu of %zu pages in the page cache, experts %zu of %zu and %zu of %zu\n",
           in_head, n_head, in_up, n_up, in_down, n_down);
    CHECKF(n_head > 0 && in_head == n_head, "the output head's interior is not read in at load (%zu of %zu pages)",
           in_head, n_head);
    CHECKF(in_up == 0 && in_down == 0, "routed expert pages entered the page cache at load (%zu, %zu)", in_up,
           in_down);
    sluice_model_free(m);
    gguf_close(g);
    remove(path);
    CHECK_DONE();
#endif
}
