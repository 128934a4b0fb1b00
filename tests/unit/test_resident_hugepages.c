/* A resident model's mapping ends up in 2 MiB pages even when the page cache held the file in
 * 4 KiB pages before the load (engine/model_mapping.c, refresh_small_pages): decode from 4 KiB
 * pages ran at about half the speed (bench/results/2026-12-02-cpu-resident-hugepages.md).
 *
 * The model is a one-layer qwen35moe-mini from synth (~390 MB). The test first checks that this
 * machine can hold the file in 2 MiB page-cache pages at all (page cache dropped, read through a
 * MADV_HUGEPAGE mapping: most of it mapped by 2 MiB entries), else it skips (77: transparent huge
 * pages off, tmpfs, a kernel without large folios for the file system). Then it fills the page
 * cache with the file in 4 KiB pages (readahead off, POSIX_FADV_RANDOM), shows that a mapping of
 * it is now in 4 KiB pages, and loads the model resident: sluice's mapping of the file must be
 * at least 90% in 2 MiB entries. Then once more with the re-read told the disk is too slow
 * (SLUICE_REFRESH_MAX_S=0): only its first 256 MiB piece is read again. Sizes come from
 * /proc/self/smaps (FilePmdMapped of the mappings of the file). With a path argument it checks
 * that model file instead (and keeps it). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "sluice.h"
#include "mini_model.h"
#include "page_cache.h"

#define HUGE_PAGE ((size_t)2 << 20)

/* the share of a fresh MADV_HUGEPAGE mapping of the file that 2 MiB entries map once read in */
static double mapped_share(const char *path, size_t size) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return -1;
    madvise(p, size, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_READ
    madvise(p, size, MADV_POPULATE_READ);
#endif
    long long all = 0;
    const long long pmd = pmd_bytes_of(path, &all);
    munmap(p, size);
    return pmd < 0 || all <= 0 ? -1 : (double)pmd / (double)all;
}

/* MODEL (optional): check that file instead of the synthetic one, and keep it */
int main(int argc, char **argv) {
#ifndef MADV_POPULATE_READ
    (void)argc, (void)argv;
    printf("skipped: this system's headers have no MADV_POPULATE_READ\n");
    return 77;
#else
    char path[4096], err[512];
    CHECKF(mini_model_path(argc, argv, "resident-hugepages-mini.gguf", 5, path, sizeof path, err, sizeof err),
           "synth: %s", err);
    char real[4096];
    if (!realpath(path, real)) snprintf(real, sizeof real, "%s", path); /* smaps names the real path */
    struct stat st;
    CHECKF(stat(real, &st) == 0 && (size_t)st.st_size > 16 * HUGE_PAGE, "%s: missing or too small", real);
    if ((size_t)st.st_size <= 16 * HUGE_PAGE) CHECK_DONE();
    const size_t size = (size_t)st.st_size;

    /* can this machine hold the file in 2 MiB pages at all? */
    const double fresh = drop_file(real) ? mapped_share(real, size) : -1;
    printf("page cache dropped, read through a MADV_HUGEPAGE mapping: %.0f%% in 2 MiB pages\n", 100 * fresh);
    if (fresh < 0.5) {
        printf("skipped: this kernel or file system gives the file no 2 MiB page-cache pages "
               "(transparent huge pages off, tmpfs, no large folios)\n");
        if (argc <= 1) remove(path);
        return 77;
    }
    CHECK(fill_small_pages(real));
    const double small = mapped_share(real, size);
    printf("page cache filled with readahead off: a mapping of the file %.0f%% in 2 MiB pages\n", 100 * small);
    CHECKF(small >= 0 && small < 0.1, "the page cache was to hold the file in 4 KiB pages (%.0f%% in 2 MiB)",
           100 * small);

    sluice_model_params mp = {.mode = SLUICE_MODE_RESIDENT, .n_ctx = 64, .no_watchdog = true};
    sluice_model *m = sluice_model_load(real, &mp);
    CHECKF(m != NULL, "resident load: %s", sluice_last_error());
    long long all = 0;
    const long long pmd = pmd_bytes_of(real, &all);
    const double share = pmd < 0 || all <= 0 ? -1 : (double)pmd / (double)all;
    printf("after a resident load: sluice's mapping %.0f%% in 2 MiB pages (%lld of %lld MB)\n", 100 * share,
           pmd >> 20, all >> 20);
    CHECKF(share >= 0.9, "the resident mapping is %.0f%% in 2 MiB pages", 100 * share);
    /* the weights read back are the file's: a forward pass runs */
    if (m) {
        sluice_session *s = sluice_session_new(m, NULL);
        CHECK(s != NULL);
        const int32_t tok[2] = {1, 2};
        if (s) CHECKF(sluice_session_eval(s, tok, 2, NULL) == 0, "eval: %s", sluice_last_error());
        sluice_session_free(s);
    }
    sluice_model_free(m);

    /* a disk too slow for the rest (SLUICE_REFRESH_MAX_S=0: any estimate is too long): only the
     * first 256 MiB piece is read again, the rest stays in 4 KiB pages, and the load succeeds */
    CHECK(fill_small_pages(real));
    setenv("SLUICE_REFRESH_MAX_S", "0", 1);
    m = sluice_model_load(real, &mp);
    unsetenv("SLUICE_REFRESH_MAX_S");
    CHECKF(m != NULL, "resident load, slow-disk stop: %s", sluice_last_error());
    const long long pmd2 = pmd_bytes_of(real, &all);
    const double share2 = pmd2 < 0 || all <= 0 ? -1 : (double)pmd2 / (double)all;
    printf("the same with the re-read stopped after its first piece: %.0f%% in 2 MiB pages\n", 100 * share2);
    if (size > ((size_t)300 << 20)) /* a first piece of 256 MiB leaves some of the file */
        CHECKF(share2 > 0.3 && share2 < 0.9, "after a stopped re-read: %.0f%% in 2 MiB pages", 100 * share2);
    sluice_model_free(m);
    if (argc <= 1) remove(path);
    CHECK_DONE();
#endif
}
