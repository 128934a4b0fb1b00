/* How a loaded model's file mapping is brought into memory (see model_mapping.h). */
#include "engine/model_mapping.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "engine/error.h"
#include "runtime/bytes.h"

static double mapping_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- byte ranges ---------------------------------------------------------------------------- */
static int range_cmp(const void *x, const void *y) {
    const byte_range *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a;
}

/* sort, and merge ranges at most gap bytes apart; the count left */
static size_t ranges_merge(byte_range *r, size_t n, uint64_t gap) {
    qsort(r, n, sizeof *r, range_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m > 0 && r[i].a <= r[m - 1].b + gap) {
            if (r[i].b > r[m - 1].b) r[m - 1].b = r[i].b;
        } else {
            r[m++] = r[i];
        }
    }
    return m;
}

byte_range *model_expert_ranges(const expert_layout *l, int *n) {
    byte_range *r = calloc((size_t)l->n_layer * EXPERT_PARTS + 1, sizeof *r);
    size_t k = 0;
    *n = 0;
    if (!r) return NULL;
    for (int i = 0; i < l->n_layer; i++) {
        const expert_layer_layout *L = &l->layers[i];
        if (!L->present) continue;
        if (l->packed) {
            r[k++] = (byte_range){L->record_offset, L->record_offset + L->record_stride * (uint64_t)l->n_expert};
            continue;
        }
        for (int p = 0; p < EXPERT_PARTS; p++) {
            const uint64_t a = L->part[p].offset;
            r[k++] = (byte_range){a, a + L->part[p].stride * (uint64_t)(l->n_expert - 1) + L->part[p].bytes};
        }
    }
    *n = (int)ranges_merge(r, k, 0);
    return r;
}

bool model_in_experts(const byte_range *r, int n, uint64_t off, uint64_t bytes) {
    for (int i = 0; i < n; i++)
        if (off >= r[i].a && off + bytes <= r[i].b) return true;
    return false;
}

/* ---- reading ranges in ---------------------------------------------------------------------
 * MADV_POPULATE_READ, in file order. Not spread over threads: three threads claiming 64 MiB
 * pieces loaded the 10.4 GB qwen4exp-8l file in 2.45-2.89 s against 2.32-2.86 s from one
 * (alternating, page cache dropped; bench/results/2026-12-02-stream-dense-populate.md). */
static void populate_runs(const uint8_t *base, const byte_range *runs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        void *p = (void *)(base + runs[i].a);
        const size_t len = (size_t)(runs[i].b - runs[i].a);
#ifdef MADV_POPULATE_READ
        /* other failures (an I/O error): the pages are faulted in on use, and fail there */
        if (madvise(p, len, MADV_POPULATE_READ) == 0 || errno != EINVAL) continue;
#endif
        madvise(p, len, MADV_WILLNEED); /* older kernels: start the reads */
    }
}

/* ---- 2 MiB pages ----------------------------------------------------------------------------
 * Weights in 2 MiB pages. Decode reads every active weight once per token, and from 4 KiB
 * pages it runs at about half the speed: 30B-A3B Q4_K_M resident, 2 threads, 8.8-9.0 t/s after
 * `cat` had filled the page cache (38% of the file in 2 MiB folios) against 16.7 t/s after the
 * page cache was dropped and sluice read the file itself (all of it in 2 MiB folios;
 * bench/results/2026-12-02-cpu-resident-hugepages.md). The page cache keeps whatever folios its
 * first reader made (a copy, a download, another program's reads), and this kernel cannot
 * collapse a regular file's small folios (MADV_COLLAPSE needs CONFIG_READ_ONLY_THP_FOR_FS). So
 * what is read in at load gets MADV_HUGEPAGE (reads from disk then come in 2 MiB folios, mapped
 * by 2 MiB entries: a resident mapping's 2 MiB-aligned interior, a streamed one's runs of dense
 * tensors), and where the populated ranges are mostly in small pages they are read again, piece
 * by piece: a new mapping of the piece moved over ours, the file's clean, unmapped pages of the
 * piece dropped from the page cache (POSIX_FADV_DONTNEED: pages another process maps or that
 * are dirty stay), the piece read in again. The cost is one more read of those bytes at load;
 * when the first piece does not come back in 2 MiB pages (memory too fragmented), or the rest
 * would take more than REFRESH_MAX_S at its speed (a slow disk), the rest is left as it is. */
#define REFRESH_PIECE ((uint64_t)256 << 20)
#define HUGE_SHARE_OK 0.9
#define REFRESH_MAX_S 30.0 /* the estimated re-read of the rest, at the first piece's speed; more: stop
                            * (SLUICE_REFRESH_MAX_S sets it, for tests) */

/* [a, b): the file offsets of the mapping's 2 MiB-aligned interior; false when it has none */
static bool huge_interior(const gguf_file *g, byte_range *in) {
    const uintptr_t huge = (uintptr_t)2 << 20, base = (uintptr_t)g->base;
    const uintptr_t ha = (base + huge - 1) & ~(huge - 1), hb = (base + g->size) & ~(huge - 1);
    if (hb <= ha) return false;
    *in = (byte_range){ha - base, hb - base};
    return true;
}

/* Bytes of [p, p + len) mapped by 2 MiB entries: the FilePmdMapped of the process's mappings
 * that lie inside it (MADV_HUGEPAGE splits the file's mapping into several); -1 when
 * /proc/self/smaps cannot be read. */
static int64_t pmd_mapped_bytes(const void *p, size_t len) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    const uintptr_t lo = (uintptr_t)p, hi = lo + len;
    char line[4096 + 256]; /* a header holds the file's path: whole lines, never a path's tail */
    bool inside = false;
    int64_t kb = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        long long v;
        /* a mapping's header starts with its lowercase-hex range, its fields with a capital */
        const bool header = (line[0] >= '0' && line[0] <= '9') || (line[0] >= 'a' && line[0] <= 'f');
        if (header && sscanf(line, "%lx-%lx", &a, &b) == 2)
            inside = a >= lo && b <= hi;
        else if (inside && sscanf(line, "FilePmdMapped: %lld kB", &v) == 1)
            kb += v;
    }
    fclose(f);
    return kb * 1024;
}

/* Bytes of the runs (file offsets) mapped by 2 MiB entries; -1 when smaps cannot be read */
static int64_t runs_pmd_bytes(const uint8_t *base, const byte_range *runs, size_t n) {
    int64_t all = 0;
    for (size_t i = 0; i < n; i++) {
        const int64_t b = pmd_mapped_bytes(base + runs[i].a, (size_t)(runs[i].b - runs[i].a));
        if (b < 0) return -1;
        all += b;
    }
    return all;
}

/* runs: 2 MiB-aligned ranges of the mapping (file offsets) that are to be in 2 MiB pages;
 * random: they keep MADV_RANDOM (a streamed model's mapping) */
static void refresh_small_pages(const sluice_model *m, const byte_range *runs, size_t n_runs, bool random) {
    const gguf_file *g = m->gguf;
    uint8_t *base = (uint8_t *)g->base;
    uint64_t len = 0;
    for (size_t i = 0; i < n_runs; i++) {
        if (runs[i].a % ((uint64_t)2 << 20)) return; /* file offsets not on 2 MiB: no 2 MiB entries map them */
        len += runs[i].b - runs[i].a;
    }
    if (!len) return;
    const int64_t pmd0 = runs_pmd_bytes(base, runs, n_runs);
    if (pmd0 < 0 || (double)pmd0 >= HUGE_SHARE_OK * (double)len) return;
    const int fd = open(m->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return; /* an optimization only */
    const char *e = getenv("SLUICE_REFRESH_MAX_S");
    const double max_s = e ? atof(e) : REFRESH_MAX_S, t0 = mapping_now();
    uint64_t done = 0;
    const char *stop = NULL;
    for (size_t i = 0; i < n_runs && !stop; i++)
        for (uint64_t off = runs[i].a; off < runs[i].b && !stop; off += REFRESH_PIECE) {
            const uint64_t n = runs[i].b - off < REFRESH_PIECE ? runs[i].b - off : REFRESH_PIECE;
            /* A new mapping of the piece, not MADV_DONTNEED: that keeps the page tables, and a
             * 2 MiB entry is only made where none is. Mapped elsewhere first and moved over the
             * old one (mremap replaces it in one step), so that a failure leaves the old pages. */
            void *q = mmap(NULL, (size_t)n, PROT_READ, MAP_PRIVATE, fd, (off_t)off);
            if (q == MAP_FAILED) {
                stop = "no new mapping";
                break;
            }
            if (mremap(q, (size_t)n, (size_t)n, MREMAP_MAYMOVE | MREMAP_FIXED, base + off) == MAP_FAILED) {
                munmap(q, (size_t)n);
                stop = "no new mapping";
                break;
            }
            madvise(base + off, (size_t)n, MADV_HUGEPAGE);
            if (random) madvise(base + off, (size_t)n, MADV_RANDOM);
            posix_fadvise(fd, (off_t)off, (off_t)n, POSIX_FADV_DONTNEED);
            const byte_range r = {off, off + n};
            populate_runs(base, &r, 1);
            const bool first = done == 0;
            done += n;
            if (first && done < len) {
                /* Did the first piece come back in 2 MiB pages? The runs' count must have grown
                 * by at least half of what the piece held in small pages (its share of them
                 * taken as the runs'; the piece's own mapping may have merged with its
                 * neighbours, so only whole runs are counted). And would the rest take too long
                 * (a slow disk: the re-read costs once per load, the 4 KiB pages per token)? */
                const int64_t pmd1 = runs_pmd_bytes(base, runs, n_runs);
                const double small = (double)n * (1.0 - (double)pmd0 / (double)len);
                const double rest_s = (mapping_now() - t0) * (double)(len - n) / (double)n;
                if (pmd1 < 0 || (double)(pmd1 - pmd0) < 0.5 * small)
                    stop = "it came back in 4 KiB pages (memory too fragmented?)";
                else if (rest_s > max_s)
                    stop = "the disk is too slow for the rest";
            }
        }
    close(fd);
    const int64_t pmd = runs_pmd_bytes(base, runs, n_runs);
    fprintf(stderr,
            "sluice: the page cache held the model's %s mostly in 4 KiB pages (%.0f%% in 2 MiB pages): read %.1f GB "
            "again in 2 MiB pages in %.1f s%s%s, now %.0f%%\n",
            random ? "dense weights" : "weights", 100.0 * (double)pmd0 / (double)len, (double)done / 1e9,
            mapping_now() - t0, stop ? ", then stopped: " : "", stop ? stop : "",
            pmd < 0 ? 0.0 : 100.0 * (double)pmd / (double)len);
}

/* ---- streamed -------------------------------------------------------------------------------
 * The routed experts of the mapping must never enter the page cache (a memory cgroup charges
 * it): fault-time readahead around a dense tensor would otherwise pull in megabytes of the
 * neighbouring expert tensors and push the process past its budget. So the mapping is marked
 * random-access, and the dense tensors are read in ahead of use.
 *
 * MADV_WILLNEED alone reads only the first readahead window of each range (the kernel caps it at
 * the device's io_pages / ra_pages), so the rest of a dense matrix was faulted in 4 KiB at a
 * time by the first forward pass: a cold qwen4exp-8l run in an 8 GiB cgroup prefilled 48 tokens
 * in 10.5-11.6 s, against about 1 s with the dense tensors read in at load
 * (bench/results/2026-12-02-stream-dense-populate.md). So the runs of dense tensors that every
 * token reads whole are read in at load (MADV_POPULATE_READ), their 2 MiB-aligned interior in
 * huge pages (MADV_HUGEPAGE: 2 MiB reads, and 2 MiB mappings for the compute); pages at the runs'
 * ends, which a huge page would share with expert bytes, keep the random-access 4 KiB reads. The
 * interior stays random-access too: with normal readahead each huge-page fault also reads the
 * next 2 MiB, which past a run's end are expert bytes (95 MB of them on qwen4exp-8l;
 * tests/unit/test_stream_load.c counts them).
 * Embedding tables (token_embd, qwen4exp's per_layer_token_embd) are read by rows and stay
 * faulted on demand, as does every tensor of a model that only plans or computes on a GPU. */
static void populate_dense_runs(const sluice_model *m, const byte_range *experts, int n_experts) {
    const gguf_file *g = m->gguf;
    const uintptr_t huge = (uintptr_t)2 << 20;
    byte_range *runs = malloc((size_t)g->n_tensors * sizeof *runs);
    if (!runs) return; /* an optimization only: the pages still fault in on use */
    size_t n = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        const uint64_t off = (uint64_t)((const uint8_t *)t->data - g->base);
        if (!t->nbytes || model_in_experts(experts, n_experts, off, t->nbytes) || strstr(t->name, "token_embd"))
            continue;
        runs[n++] = (byte_range){off, off + t->nbytes};
    }
    n = ranges_merge(runs, n, 4096); /* tensors at most a page apart (alignment padding) */
    /* each run's interior on 2 MiB-aligned addresses, where it has one */
    const uintptr_t base = (uintptr_t)g->base;
    size_t h = 0;
    for (size_t i = 0; i < n; i++) {
        const uintptr_t ha = (base + runs[i].a + huge - 1) & ~(uintptr_t)(huge - 1);
        const uintptr_t hb = (base + runs[i].b) & ~(uintptr_t)(huge - 1);
        if (hb <= ha) continue;
        madvise((void *)ha, hb - ha, MADV_HUGEPAGE); /* a hint: where refused, 4 KiB pages */
        runs[h++] = (byte_range){ha - base, hb - base};
    }
    populate_runs(g->base, runs, h);
    if (m->path) refresh_small_pages(m, runs, h, true); /* a page cache that held them in 4 KiB pages */
    free(runs);
}

void model_mapping_advise_stream(const sluice_model *m) {
    const gguf_file *g = m->gguf;
    if (!g->mapped) return;
    uintptr_t page = 4096;
    madvise((void *)g->base, g->size, MADV_RANDOM);
    int n_experts = 0;
    byte_range *experts = model_expert_ranges(&m->layout, &n_experts);
    if (!experts) return; /* out of memory: the pages fault in on use */
    if (!m->params.plan_only && !m->plan.gpu) populate_dense_runs(m, experts, n_experts);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        const uint64_t off = (uint64_t)((const uint8_t *)t->data - g->base);
        if (!t->nbytes || model_in_experts(experts, n_experts, off, t->nbytes)) continue;
        uintptr_t a = (uintptr_t)t->data & ~(page - 1);
        uintptr_t b = ((uintptr_t)t->data + t->nbytes + page - 1) & ~(page - 1);
        madvise((void *)a, b - a, MADV_WILLNEED);
    }
    free(experts);
}

/* ---- resident -------------------------------------------------------------------------------
 * The weights are read in at load, in file order, before the first token, instead of being
 * faulted in at random inside the first prefill. Otherwise the first work after a cold page
 * cache pays the reads (measured: 30B-A3B prefill of 512 tokens at 23.0 t/s cold vs 31.7 t/s
 * warm) and a benchmark depends on what ran before it. The plan has already counted these pages
 * as resident. */
void model_mapping_populate_resident(const sluice_model *m) {
    const gguf_file *g = m->gguf;
    if (!g->mapped || !g->size) return;
    byte_range in = {0, 0};
    const bool huge = huge_interior(g, &in);
    if (huge) madvise((void *)(g->base + in.a), (size_t)(in.b - in.a), MADV_HUGEPAGE);
    const byte_range all = {0, g->size};
    populate_runs(g->base, &all, 1);
    if (huge && m->path) refresh_small_pages(m, &in, 1, false);
}

/* --mlock: the resident mapping's pages stay in RAM. Otherwise the page cache evicts them when
 * other files are read, and the run reads them back from disk (a 21.2 GB model on a 23 GB host
 * refaulted pages for minutes after any other large file). Only for a model the CPU computes
 * from its mapping: a streamed model reads its experts into its own cache, a GPU model copies
 * the file to the device. */
int model_mapping_lock(const sluice_model *m, const char *label) {
    const gguf_file *g = m->gguf;
    if (m->plan.gpu) {
        sluice_set_error("%s: --mlock keeps the CPU's copy of a resident model; this model runs on the GPU", label);
        return -1;
    }
    if (m->experts && m->experts->streaming) {
        sluice_set_error("%s: --mlock needs a resident model, but the plan streams its experts "
                         "(add --resident, or drop --mlock)", label);
        return -1;
    }
    if (!g->mapped || !g->size) {
        sluice_set_error("%s: --mlock: the model is not memory-mapped", label);
        return -1;
    }
    if (mlock(g->base, g->size) == 0) return 0;
    const int e = errno;
    struct rlimit rl;
    char lim[32] = "unknown", size[32];
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY) snprintf(lim, sizeof lim, "unlimited");
        else bytes_str((uint64_t)rl.rlim_cur, lim, sizeof lim);
    }
    bytes_str((uint64_t)g->size, size, sizeof size);
    sluice_set_error("%s: --mlock: locking %s in RAM failed: %s (memory-lock limit %s; raise it with "
                     "ulimit -l, or run without --mlock)",
                     label, size, strerror(e), lim);
    return -1;
}
