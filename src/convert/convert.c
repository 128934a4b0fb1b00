/* sluice convert: the writer. Rows of every output tensor are produced from the checkpoint
 * (decoded from BF16/F16/F32/FP8/MLX to float, gathered through the plan's row and column
 * permutations, transformed) and encoded in the output type, in batches spread over threads; MLX
 * groups whose layout needs no change are copied bit for bit instead.
 *
 * Resume (docs/convert.md): the output is written to OUT.partial after its complete header; after
 * each tensor's bytes are on disk (fdatasync) a line "done INDEX SHA256" is appended to
 * OUT.partial.journal (and synced). The journal's first line is a fingerprint of the header (so of
 * every type, shape and metadata value) and of the input files (names, sizes, modification
 * times). A rerun whose fingerprint matches re-hashes the journaled tensors in OUT.partial and
 * continues after the last one that checks out; otherwise it starts over. OUT appears (rename)
 * only when complete. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/convert_internal.h"
#include "formats/gguf.h"
#include "formats/outfile.h"
#include "formats/quant.h"

#define JOURNAL_MAGIC "sluice-convert-journal 1"
#define BATCH_BYTES (8u << 20)

/* ---- reading rows --------------------------------------------------------------------------- */

static float fp8_scale(const src_ref *s, int64_t o, int64_t r, int64_t col) {
    if (!s->scale) return 1.0f;
    if (s->fp8_global) return st_get_f32(s->scale, 0);
    const int64_t cb = (s->cols + s->fp8_bc - 1) / s->fp8_bc;
    const int lead = s->outer > 1 ? 1 : 0;
    if (s->scale->n_dims == 1 + lead) /* a vector's scales: one per column block */
        return st_get_f32(s->scale, o * cb + col / s->fp8_bc);
    const int64_t rb = (s->rows + s->fp8_br - 1) / s->fp8_br;
    return st_get_f32(s->scale, (o * rb + r / s->fp8_br) * cb + col / s->fp8_bc);
}

/* Row r of outer index o of a source, as floats. FP8: value times its block's scale_inv (the
 * dequantization of Qwen's and DeepSeek's FP8 checkpoints); MLX: scale*q + bias, exactly as the
 * MLX codec decodes (quant_mlx.c), for any scale dtype. */
static void src_row_f32(const src_ref *s, int64_t o, int64_t r, float *out) {
    const int64_t C = s->cols, base = (o * s->rows + r) * C;
    if (s->kind == SRC_FLOAT) {
        st_to_f32(s->w, base, C, out);
    } else if (s->kind == SRC_FP8) {
        st_to_f32(s->w, base, C, out);
        for (int64_t c = 0; c < C; c++) out[c] = out[c] * fp8_scale(s, o, r, c);
    } else {
        const int b = s->mlx_bits, G = s->mlx_group;
        const unsigned mask = (1u << b) - 1u;
        const uint8_t *codes = s->w->data + (size_t)((o * s->rows + r) * (C * b / 8));
        const int64_t sbase = (o * s->rows + r) * (C / G);
        for (int64_t g = 0; g < C / G; g++) {
            const float sc = st_get_f32(s->scale, sbase + g), bi = st_get_f32(s->bias, sbase + g);
            for (int64_t k = g * G; k < (g + 1) * G; k++) {
                const int64_t bit = k * b;
                unsigned v = codes[bit / 8];
                if ((bit % 8) + b > 8) v |= (unsigned)codes[bit / 8 + 1] << 8;
                out[k] = sc * (float)((v >> (bit % 8)) & mask) + bi;
            }
        }
    }
}

/* The blocks of an MLX row in sluice's layout: scale and bias as stored, then the group's codes
 * (the G*b/8 bytes of the row's little-endian bit stream), groups taken through gperm. */
static void src_row_blocks(const src_ref *s, int64_t o, int64_t r, const int64_t *gperm,
                           uint8_t *out) {
    const int b = s->mlx_bits, G = s->mlx_group;
    const int64_t nG = s->cols / G, gb = (int64_t)G * b / 8;
    const uint8_t *codes = s->w->data + (size_t)((o * s->rows + r) * (s->cols * b / 8));
    const int64_t sbase = (o * s->rows + r) * nG;
    for (int64_t g = 0; g < nG; g++) {
        const int64_t sg = gperm ? gperm[g] : g;
        uint8_t *blk = out + g * (4 + gb);
        memcpy(blk, s->scale->data + (size_t)(sbase + sg) * 2, 2);
        memcpy(blk + 2, s->bias->data + (size_t)(sbase + sg) * 2, 2);
        memcpy(blk + 4, codes + sg * gb, (size_t)gb);
    }
}

/* Which source, outer index and row output row i comes from (see out_tensor). */
static const src_ref *row_source(const out_tensor *t, int64_t i, int64_t *o, int64_t *r) {
    if (t->rowcat) { /* the source whose rows hold i: the last k with rowcat[k] <= i */
        int lo = 0, hi = t->n_src - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (t->rowcat[mid] <= i) lo = mid;
            else hi = mid - 1;
        }
        *o = 0;
        *r = i - t->rowcat[lo];
        return &t->src[lo];
    }
    const int64_t R = t->ne[1], e = i / R, rr = i % R;
    const int64_t sr = t->row_off + (t->rowperm ? t->rowperm[rr] : rr);
    *r = sr;
    if (t->n_src > 1) {
        *o = 0;
        return &t->src[e];
    }
    *o = e;
    return &t->src[0];
}

static void out_row_f32(const out_tensor *t, int64_t i, float *row, float *tmp) {
    if (t->colcat) {
        int64_t at = 0;
        for (int k = 0; k < t->n_src; k++) {
            src_row_f32(&t->src[k], 0, i, row + at);
            at += t->src[k].cols;
        }
        return;
    }
    int64_t o, r;
    const src_ref *s = row_source(t, i, &o, &r);
    const int64_t C = t->ne[0];
    if (t->colperm) {
        src_row_f32(s, o, r, tmp);
        for (int64_t c = 0; c < C; c++) row[c] = tmp[t->colperm[c]];
    } else {
        src_row_f32(s, o, r, row);
    }
    if (t->op == OP_PLUS1)
        for (int64_t c = 0; c < C; c++) row[c] = 1.0f + row[c];
    else if (t->op == OP_NEG_EXP)
        for (int64_t c = 0; c < C; c++) row[c] = -expf(row[c]);
}

/* MLX groups can be copied when every source is MLX in exactly the output's variant, no value
 * changes, and the column permutation (if any) moves whole groups. *gperm: the group order. */
static bool mlx_passthrough(const out_tensor *t, int64_t **gperm) {
    int bits, group;
    bool bf16;
    *gperm = NULL;
    if (t->op != OP_NONE || t->rowcat || t->colcat ||
        !quant_mlx_params(t->type, &bits, &group, &bf16))
        return false;
    for (int k = 0; k < t->n_src; k++) {
        const src_ref *s = &t->src[k];
        if (s->kind != SRC_MLX || s->mlx_bits != bits || s->mlx_group != group ||
            s->scale->dtype != (bf16 ? ST_BF16 : ST_F16))
            return false;
    }
    if (!t->colperm) return true;
    const int64_t nG = t->ne[0] / group;
    int64_t *gp = malloc((size_t)nG * sizeof *gp);
    if (!gp) return false;
    for (int64_t g = 0; g < nG; g++) {
        const int64_t first = t->colperm[g * group];
        bool ok = first % group == 0;
        for (int64_t k = 1; k < group && ok; k++) ok = t->colperm[g * group + k] == first + k;
        if (!ok) {
            free(gp);
            return false;
        }
        gp[g] = first / group;
    }
    *gperm = gp;
    return true;
}

/* ---- batches over threads ------------------------------------------------------------------ */

typedef struct batch {
    const out_tensor *t;
    const quant_traits *qt;
    bool copy;            /* MLX passthrough */
    const int64_t *gperm;
    int64_t first, count; /* rows */
    size_t row_bytes;
    uint8_t *buf;
    int nth;
    int oom;
} batch;

typedef struct worker {
    batch *b;
    int k;
} worker;

static void *batch_worker(void *arg) {
    worker *w = arg;
    batch *b = w->b;
    const int64_t per = (b->count + b->nth - 1) / b->nth;
    const int64_t lo = w->k * per, hi = lo + per < b->count ? lo + per : b->count;
    if (lo >= hi) return NULL;
    const int64_t C = b->t->ne[0];
    float *row = NULL, *tmp = NULL;
    if (!b->copy) {
        row = malloc((size_t)C * sizeof *row);
        tmp = malloc((size_t)C * sizeof *tmp);
        if (!row || !tmp) {
            __atomic_store_n(&b->oom, 1, __ATOMIC_RELAXED);
            free(row);
            free(tmp);
            return NULL;
        }
    }
    for (int64_t i = lo; i < hi; i++) {
        uint8_t *dst = b->buf + (size_t)i * b->row_bytes;
        if (b->copy) {
            int64_t o, r;
            const src_ref *s = row_source(b->t, b->first + i, &o, &r);
            src_row_blocks(s, o, r, b->gperm, dst);
        } else {
            out_row_f32(b->t, b->first + i, row, tmp);
            b->qt->quantize(row, dst, C);
        }
    }
    free(row);
    free(tmp);
    return NULL;
}

static int run_batch(batch *b, int n_threads) {
    int nth = n_threads;
    if (b->count < 2 * (int64_t)nth) nth = 1;
    b->nth = nth;
    b->oom = 0;
    worker ws[64];
    pthread_t th[64];
    if (nth > 64) nth = b->nth = 64;
    int started = 0;
    for (int k = 0; k < nth; k++) {
        ws[k] = (worker){b, k};
        if (k == 0) continue;
        if (pthread_create(&th[k], NULL, batch_worker, &ws[k]) != 0) break;
        started = k;
    }
    if (started < nth - 1) { /* fewer threads than planned: the rest run here */
        for (int k = started + 1; k < nth; k++) batch_worker(&ws[k]);
    }
    batch_worker(&ws[0]);
    for (int k = 1; k <= started; k++) pthread_join(th[k], NULL);
    return b->oom ? -1 : 0;
}

/* ---- journal --------------------------------------------------------------------------------- */

static void hex(const unsigned char *d, int n, char *out) {
    for (int i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void fingerprint(const uint8_t *hdr, size_t hdr_len, const st_set *st, char out[65]) {
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    unsigned char d[32];
    unsigned len = 0;
    if (!h) {
        memset(out, '0', 64);
        out[64] = 0;
        return;
    }
    EVP_DigestInit_ex(h, EVP_sha256(), NULL);
    EVP_DigestUpdate(h, JOURNAL_MAGIC, sizeof JOURNAL_MAGIC - 1);
    EVP_DigestUpdate(h, hdr, hdr_len);
    for (int i = 0; i < st_n_files(st); i++) {
        uint64_t size;
        int64_t mtime;
        st_file_stat(st, i, &size, &mtime);
        const char *p = st_file_path(st, i), *b = strrchr(p, '/');
        b = b ? b + 1 : p;
        EVP_DigestUpdate(h, b, strlen(b) + 1);
        EVP_DigestUpdate(h, &size, sizeof size);
        EVP_DigestUpdate(h, &mtime, sizeof mtime);
    }
    EVP_DigestFinal_ex(h, d, &len);
    EVP_MD_CTX_free(h);
    hex(d, 32, out);
}

/* SHA-256 of n bytes of fp at offset off. */
static int hash_range(FILE *fp, uint64_t off, uint64_t n, char out[65]) {
    if (fseeko(fp, (off_t)off, SEEK_SET) != 0) return -1;
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    if (!h) return -1;
    EVP_DigestInit_ex(h, EVP_sha256(), NULL);
    uint8_t buf[1 << 16];
    int rc = 0;
    while (n > 0) {
        size_t k = n < sizeof buf ? (size_t)n : sizeof buf;
        if (fread(buf, 1, k, fp) != k) {
            rc = -1;
            break;
        }
        EVP_DigestUpdate(h, buf, k);
        n -= k;
    }
    unsigned char d[32];
    unsigned len = 0;
    EVP_DigestFinal_ex(h, d, &len);
    EVP_MD_CTX_free(h);
    hex(d, 32, out);
    return rc;
}

/* How many leading tensors of an interrupted run are intact (0: start over). */
static int resume_point(const char *partial, const char *journal, const char *fp_hex,
                        const uint8_t *hdr, size_t hdr_len, const uint64_t *off,
                        const uint64_t *nbytes, int n_t, note_fn note, void *nctx) {
    FILE *jf = fopen(journal, "r"), *pf = fopen(partial, "rb");
    int good = 0;
    char line[256];
    if (!jf || !pf) goto out;
    if (!fgets(line, sizeof line, jf) || strncmp(line, JOURNAL_MAGIC " ", sizeof JOURNAL_MAGIC) ||
        strncmp(line + sizeof JOURNAL_MAGIC, fp_hex, 64) != 0) {
        conv_note(note, nctx, "the inputs or options differ from the interrupted run: starting over");
        goto out;
    }
    uint8_t *head = malloc(hdr_len);
    bool same = head && fread(head, 1, hdr_len, pf) == hdr_len && memcmp(head, hdr, hdr_len) == 0;
    free(head);
    if (!same) {
        conv_note(note, nctx, "the partial output's header does not match: starting over");
        goto out;
    }
    while (good < n_t && fgets(line, sizeof line, jf)) {
        int idx;
        char want[65], got[65];
        if (sscanf(line, "done %d %64s", &idx, want) != 2 || idx != good) break;
        if (hash_range(pf, hdr_len + off[good], nbytes[good], got) != 0 || strcmp(got, want) != 0) {
            conv_note(note, nctx, "tensor #%d of the partial output fails its checksum: "
                      "rewriting from there", good);
            break;
        }
        good++;
    }
out:
    if (jf) fclose(jf);
    if (pf) fclose(pf);
    return good;
}

static int sync_file(FILE *fp) { return fflush(fp) == 0 && fdatasync(fileno(fp)) == 0 ? 0 : -1; }

/* ---- driver ----------------------------------------------------------------------------------- */

static void default_name(const char *dir, char *out, size_t n) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    size_t len = strlen(buf);
    while (len > 1 && buf[len - 1] == '/') buf[--len] = 0;
    const char *b = strrchr(buf, '/');
    const char *base = b ? b + 1 : buf;
    /* Truncate explicitly: a directory name longer than the caller's buffer is cut, not an error. */
    size_t blen = strlen(base);
    if (n == 0) return;
    if (blen >= n) blen = n - 1;
    memcpy(out, base, blen);
    out[blen] = 0;
}

static int write_tensor(FILE *fp, const out_tensor *t, uint64_t nbytes, uint64_t padded,
                        int n_threads, uint64_t *done, uint64_t total, const convert_options *opt,
                        char hex_out[65], char *err, size_t n) {
    const quant_traits *qt = quant_traits_of(t->type);
    const size_t row_bytes = quant_row_bytes(t->type, t->ne[0]);
    const int64_t rows = t->ne[1] * t->ne[2];
    int64_t *gperm = NULL;
    const bool copy = mlx_passthrough(t, &gperm);
    int64_t per = (int64_t)(BATCH_BYTES / (row_bytes ? row_bytes : 1));
    if (per < 1) per = 1;
    if (per > rows) per = rows;
    uint8_t *buf = malloc((size_t)per * row_bytes);
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    int rc = -1;
    if (!buf || !h || (uint64_t)rows * row_bytes != nbytes) {
        snprintf(err, n, buf && h ? "internal error: size of '%s'" : "out of memory", t->name);
        goto out;
    }
    EVP_DigestInit_ex(h, EVP_sha256(), NULL);
    for (int64_t first = 0; first < rows; first += per) {
        batch b = {.t = t, .qt = qt, .copy = copy, .gperm = gperm, .first = first,
                   .count = first + per <= rows ? per : rows - first, .row_bytes = row_bytes,
                   .buf = buf};
        if (run_batch(&b, n_threads) != 0) {
            snprintf(err, n, "out of memory converting '%s'", t->name);
            goto out;
        }
        const size_t len = (size_t)b.count * row_bytes;
        if (fwrite(buf, 1, len, fp) != len) {
            snprintf(err, n, "writing '%s': %s", t->name, strerror(errno));
            goto out;
        }
        EVP_DigestUpdate(h, buf, len);
        *done += len;
        if (opt->progress) opt->progress(opt->progress_ctx, *done, total);
    }
    static const uint8_t zeros[64];
    if (padded > nbytes && fwrite(zeros, 1, (size_t)(padded - nbytes), fp) != padded - nbytes) {
        snprintf(err, n, "writing '%s': %s", t->name, strerror(errno));
        goto out;
    }
    unsigned char d[32];
    unsigned dl = 0;
    EVP_DigestFinal_ex(h, d, &dl);
    hex(d, 32, hex_out);
    rc = 0;
out:
    EVP_MD_CTX_free(h);
    free(buf);
    free(gperm);
    return rc;
}

int convert_hf(const char *dir, const char *out, const convert_options *opt_in,
               convert_report *rep, char *err, size_t n) {
    convert_options opt = *opt_in;
    conv_plan p;
    memset(&p, 0, sizeof p);
    gguf_writer *w = NULL;
    uint8_t *hdr = NULL;
    size_t hdr_len = 0;
    uint64_t *off = NULL, *nbytes = NULL;
    FILE *fp = NULL, *jf = NULL;
    int rc = -1;
    char partial[4096], journal[4200];
    bool vocab_loaded = false;
    if (rep) memset(rep, 0, sizeof *rep);
    if ((size_t)snprintf(partial, sizeof partial, "%s.partial", out) >= sizeof partial) {
        snprintf(err, n, "output path too long");
        return -1;
    }
    snprintf(journal, sizeof journal, "%s.journal", partial);
    if (outfile_check(out, err, n) != 0) return -1;
    if (opt.type != CONVERT_TYPE_AUTO) {
        const quant_traits *q = quant_traits_of((uint32_t)opt.type);
        if (!q || !q->quantize || !quant_has_codec((uint32_t)opt.type)) {
            snprintf(err, n, "cannot write tensors of type %s", quant_type_name((uint32_t)opt.type));
            return -1;
        }
    }
    int n_threads = opt.n_threads > 0 ? opt.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 64) n_threads = 64;

    if (hf_load_config(dir, &p.cfg, err, n) != 0) return -1;
    if (p.cfg.arch == ARCH_QWEN3MOE && !p.cfg.norm_topk)
        conv_note(opt.note, opt.note_ctx, "norm_topk_prob is false, but llama.cpp and sluice "
                  "always renormalize qwen3moe's top-k router weights: outputs will differ");
    if (hf_load_vocab(dir, &p.cfg, &p.vocab, opt.note, opt.note_ctx, err, n) != 0) goto done;
    vocab_loaded = true;
    if (!(p.st = st_open(dir, err, n))) goto done;
    if (plan_tensors(&p, opt.type, opt.note, opt.note_ctx, err, n) != 0) goto done;

    char name[256];
    default_name(dir, name, sizeof name);
    if (!(w = gguf_writer_new()) || plan_metadata(&p, w, name, opt.type, err, n) != 0) {
        if (!w) snprintf(err, n, "out of memory");
        goto done;
    }
    off = calloc((size_t)p.n_t + 1, sizeof *off);
    nbytes = calloc((size_t)p.n_t + 1, sizeof *nbytes);
    if (!off || !nbytes) {
        snprintf(err, n, "out of memory");
        goto done;
    }
    uint64_t total = 0, cur = 0;
    for (int i = 0; i < p.n_t; i++) {
        const out_tensor *t = &p.t[i];
        if (gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, NULL) != i) {
            snprintf(err, n, "out of memory");
            goto done;
        }
        nbytes[i] = gguf_w_tensor_nbytes(w, i);
        off[i] = cur;
        cur = (cur + nbytes[i] + GGUF_DEFAULT_ALIGNMENT - 1) / GGUF_DEFAULT_ALIGNMENT * GGUF_DEFAULT_ALIGNMENT;
        total += nbytes[i];
    }
    const uint64_t data_size = cur;
    {
        char *mem = NULL;
        FILE *ms = open_memstream(&mem, &hdr_len);
        int hr = ms ? gguf_writer_write_header(w, ms) : -1;
        if (ms && fclose(ms) != 0) hr = -1;
        hdr = (uint8_t *)mem;
        if (hr != 0) {
            snprintf(err, n, "out of memory");
            goto done;
        }
    }
    char fp_hex[65];
    fingerprint(hdr, hdr_len, p.st, fp_hex);
    int start = 0;
    if (!opt.no_resume && access(partial, F_OK) == 0 && access(journal, F_OK) == 0)
        start = resume_point(partial, journal, fp_hex, hdr, hdr_len, off, nbytes, p.n_t,
                             opt.note, opt.note_ctx);
    uint64_t done_bytes = 0;
    if (start > 0) {
        conv_note(opt.note, opt.note_ctx, "resuming %s: %d of %d tensors already written and "
                  "verified", partial, start, p.n_t);
        fp = fopen(partial, "r+b");
        /* keep the verified journal lines only */
        char tmpj[4300];
        snprintf(tmpj, sizeof tmpj, "%s.tmp", journal);
        FILE *old = fopen(journal, "r");
        jf = fopen(tmpj, "w");
        char line[256];
        int kept = -1;
        while (old && jf && kept < start && fgets(line, sizeof line, old)) {
            fputs(line, jf);
            kept++;
        }
        if (old) fclose(old);
        if (!fp || !jf || sync_file(jf) != 0 || rename(tmpj, journal) != 0) {
            snprintf(err, n, "%s: %s", partial, strerror(errno));
            goto done;
        }
        for (int i = 0; i < start; i++) done_bytes += nbytes[i];
    } else {
        fp = fopen(partial, "wb");
        jf = fopen(journal, "w");
        if (!fp || !jf) {
            snprintf(err, n, "cannot create %s: %s", fp ? journal : partial, strerror(errno));
            goto done;
        }
        if (fwrite(hdr, 1, hdr_len, fp) != hdr_len || sync_file(fp) != 0 ||
            fprintf(jf, "%s %s\n", JOURNAL_MAGIC, fp_hex) < 0 || sync_file(jf) != 0) {
            snprintf(err, n, "writing %s: %s", partial, strerror(errno));
            goto done;
        }
    }
    if (fseeko(fp, (off_t)(hdr_len + off[start]), SEEK_SET) != 0) {
        snprintf(err, n, "%s: %s", partial, strerror(errno));
        goto done;
    }
    if (opt.progress) opt.progress(opt.progress_ctx, done_bytes, total);
    int written = 0;
    for (int i = start; i < p.n_t; i++) {
        char h[65];
        const uint64_t padded = (i + 1 < p.n_t ? off[i + 1] : data_size) - off[i];
        if (write_tensor(fp, &p.t[i], nbytes[i], padded, n_threads, &done_bytes, total, &opt, h,
                         err, n) != 0)
            goto done;
        if (sync_file(fp) != 0 || fprintf(jf, "done %d %s\n", i, h) < 0 || sync_file(jf) != 0) {
            snprintf(err, n, "writing %s: %s", partial, strerror(errno));
            goto done;
        }
        if (opt.stop_after > 0 && ++written >= opt.stop_after && i + 1 < p.n_t) {
            rc = 1;
            goto done;
        }
    }
    /* a longer stale partial must not leave bytes past the end */
    if (fflush(fp) != 0 || ftruncate(fileno(fp), (off_t)(hdr_len + data_size)) != 0 ||
        fsync(fileno(fp)) != 0) {
        snprintf(err, n, "writing %s: %s", partial, strerror(errno));
        goto done;
    }
    fclose(fp);
    fp = NULL;
    fclose(jf);
    jf = NULL;
    if (rename(partial, out) != 0) {
        snprintf(err, n, "renaming %s to %s: %s", partial, out, strerror(errno));
        goto done;
    }
    unlink(journal);
    {
        char verr[256];
        gguf_file *chk = gguf_open(out, verr, sizeof verr);
        if (!chk) {
            snprintf(err, n, "the written file does not validate: %s", verr);
            goto done;
        }
        gguf_close(chk);
    }
    if (rep) {
        snprintf(rep->arch, sizeof rep->arch, "%s", p.cfg.arch_name);
        rep->n_tensors = p.n_t;
        rep->resumed_tensors = start;
        rep->bytes = hdr_len + data_size;
        rep->n_tokens = p.vocab.n;
    }
    rc = 0;
done:
    if (fp) fclose(fp);
    if (jf) fclose(jf);
    free(hdr);
    free(off);
    free(nbytes);
    gguf_writer_free(w);
    plan_free(&p);
    st_close(p.st);
    if (vocab_loaded) hf_vocab_free(&p.vocab);
    hf_config_free(&p.cfg);
    return rc;
}
