/* A streamed model reads its dense weights in at load (engine/model_mapping.c, populate_dense_runs):
 * right after sluice_model_load, every page of the output head (less 2 MiB at each end, where
 * its run's huge pages may stop) is in the page cache, while no page inside a routed expert
 * tensor is (experts are read with direct I/O into the expert cache, and the mapping's expert
 * bytes must stay out of a cgroup's page cache). A plan-only load reads nothing. And when the
 * page cache held the file in 4 KiB pages before the load, the dense runs are read again into
 * 2 MiB pages (refresh_small_pages): the head's interior mapped by 2 MiB entries, still no
 * expert page.
 *
 * The model is a one-layer qwen35moe-mini from synth: a 199 MB Q6_K output head, and a 4.6 MB
 * run of dense tensors right before the routed experts (whose huge-page reads must stop at the
 * run's end). Page-cache residency is read with mincore() on a second mapping of the same file;
 * where the file system cannot drop the file's pages first (tmpfs), or the headers have no
 * MADV_POPULATE_READ, the test says so and skips (77). With a path argument it checks that
 * model file instead (and keeps it). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "formats/gguf.h"
#include "sluice.h"
#include "mini_model.h"
#include "page_cache.h"

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
    if (!drop_file(path)) return false;
    size_t n;
    return resident_pages(a, b, &n) == 0;
}

/* pages of every routed expert tensor in the page cache (whole pages only) */
static size_t expert_pages(const gguf_file *g, size_t *n_pages) {
    size_t in_all = 0;
    *n_pages = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (!strstr(t->name, "_exps.")) continue;
        size_t n, in = resident_pages(t->data, (const uint8_t *)t->data + t->nbytes, &n);
        in_all += in;
        *n_pages += n;
    }
    return in_all;
}

/* drop the page cache's pages of the routed experts (a 4 KiB fill read the whole file) */
static bool drop_cached_experts(const char *path, const gguf_file *g) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return false;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (strstr(t->name, "_exps."))
            posix_fadvise(fd, (off_t)((const uint8_t *)t->data - g->base), (off_t)t->nbytes, POSIX_FADV_DONTNEED);
    }
    close(fd);
    size_t n;
    return expert_pages(g, &n) == 0;
}

/* MODEL (optional): check that file instead of the synthetic one, and keep it */
int main(int argc, char **argv) {
#ifndef MADV_POPULATE_READ
    (void)argc, (void)argv;
    printf("skipped: this system's headers have no MADV_POPULATE_READ\n");
    return 77;
#else
    char path[4096], err[512];
    CHECKF(mini_model_path(argc, argv, "stream-load-mini.gguf", 3, path, sizeof path, err, sizeof err), "synth: %s",
           err);
    gguf_file *g = gguf_open(path, err, sizeof err);
    CHECKF(g != NULL, "%s", err);
    if (!g) CHECK_DONE();
    const gguf_tensor *head = tensor(g, "output.weight");
    CHECK(head && head->nbytes > (32u << 20));
    if (!head) CHECK_DONE();
    const uint8_t *h0, *h1;
    interior(head, &h0, &h1);
    size_t n_head, in_head, n_exp, in_exp;
    if (!drop_cached(path, h0, h1) || expert_pages(g, &n_exp) != 0) {
        printf("skipped: the file system keeps the file's pages (tmpfs?); residency cannot be observed\n");
        gguf_close(g);
        if (argc <= 1) remove(path);
        return 77;
    }
    /* a plan-only load reads no weights (past the first 16 MiB of the head: parsing the header
     * faults its pages in with the device's readahead, up to 8 MiB past them here) */
    sluice_model_params plan = {.mode = SLUICE_MODE_STREAM, .plan_only = true, .n_ctx = 64};
    sluice_model *m = sluice_model_load(path, &plan);
    CHECKF(m != NULL, "plan-only load: %s", sluice_last_error());
    sluice_model_free(m);
    in_head = resident_pages(h0 + (16u << 20), h1, &n_head);
    CHECKF(in_head == 0, "a plan-only load read %zu of the output head's %zu pages", in_head, n_head);

    sluice_model_params mp = {.mode = SLUICE_MODE_STREAM, .io = SLUICE_IO_DIRECT, .n_ctx = 64};
    m = sluice_model_load(path, &mp);
    CHECKF(m != NULL, "streamed load: %s", sluice_last_error());
    in_head = resident_pages(h0, h1, &n_head);
    in_exp = expert_pages(g, &n_exp);
    printf("after a streamed load: output head %zu of %zu pages in the page cache, routed experts %zu of %zu\n",
           in_head, n_head, in_exp, n_exp);
    CHECKF(n_head > 0 && in_head == n_head, "the output head's interior is not read in at load (%zu of %zu pages)",
           in_head, n_head);
    CHECKF(n_exp > 0 && in_exp == 0, "%zu routed expert pages entered the page cache at load", in_exp);
    sluice_model_free(m);

    /* The page cache held the file in 4 KiB pages (readahead off): the streamed load reads the
     * dense runs again, into 2 MiB pages (engine/model_mapping.c, refresh_small_pages), still
     * without a page of any routed expert. The head's interior alone is most of the dense bytes. */
    char real[4096];
    if (!realpath(path, real)) snprintf(real, sizeof real, "%s", path); /* smaps names the real path */
    CHECK(fill_small_pages(real));
    CHECK(drop_cached_experts(real, g));
    m = sluice_model_load(real, &mp);
    CHECKF(m != NULL, "streamed load after a 4 KiB page cache: %s", sluice_last_error());
    const long long pmd = pmd_bytes_of(real, NULL);
    in_exp = expert_pages(g, &n_exp);
    printf("page cache in 4 KiB pages before a streamed load: %lld MB mapped by 2 MiB entries after it (the head's "
           "interior: %zu MB), routed experts %zu of %zu pages\n",
           pmd >> 20, (size_t)(h1 - h0) >> 20, in_exp, n_exp);
    CHECKF(pmd >= (long long)(h1 - h0) * 9 / 10, "the dense runs were left in 4 KiB pages (%lld MB in 2 MiB)",
           pmd >> 20);
    CHECKF(in_exp == 0, "%zu routed expert pages entered the page cache at load", in_exp);
    sluice_model_free(m);
    gguf_close(g);
    if (argc <= 1) remove(path);
    CHECK_DONE();
#endif
}
