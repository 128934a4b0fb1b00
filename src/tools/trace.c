/* Routing trace writer and reader (format in trace.h and docs/trace-format.md). */
#include "tools/trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/quant.h"
#include "models/model.h"

#define WBUF_BYTES (1u << 20)

struct trace_writer {
    FILE *fp;
    int n_layer, n_expert, k;
    uint16_t seq;
    size_t rec_bytes;
    uint8_t *buf;
    size_t len;
    uint64_t records;
    bool failed;
    int err_no;
};

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static void flush_buf(trace_writer *w) {
    if (w->len && !w->failed && fwrite(w->buf, 1, w->len, w->fp) != w->len) {
        w->failed = true;
        w->err_no = errno;
    }
    w->len = 0;
}

trace_writer *trace_writer_open(const char *path, int n_layer, int n_expert, int k,
                                uint64_t expert_bytes, char *err, size_t n) {
    if (n_layer <= 0 || n_layer > 65535 || n_expert <= 0 || n_expert > 65535 || k <= 0 ||
        k > TRACE_MAX_K) {
        snprintf(err, n, "%s: a routing trace needs an MoE model (%d layers, %d experts, top-%d)",
                 path, n_layer, n_expert, k);
        return NULL;
    }
    trace_writer *w = calloc(1, sizeof *w);
    if (w) w->buf = malloc(WBUF_BYTES);
    if (!w || !w->buf) {
        if (w) free(w);
        snprintf(err, n, "out of memory");
        return NULL;
    }
    w->fp = fopen(path, "wb");
    if (!w->fp) {
        snprintf(err, n, "%s: %s", path, strerror(errno));
        free(w->buf);
        free(w);
        return NULL;
    }
    w->n_layer = n_layer;
    w->n_expert = n_expert;
    w->k = k;
    w->rec_bytes = 8 + 4 * (size_t)k;
    uint8_t h[TRACE_HEADER_BYTES] = {0};
    memcpy(h, TRACE_MAGIC, 4);
    put32(h + 4, TRACE_VERSION);
    put32(h + 8, TRACE_HEADER_BYTES);
    put32(h + 12, (uint32_t)n_layer);
    put32(h + 16, (uint32_t)n_expert);
    put32(h + 20, (uint32_t)k);
    put32(h + 24, 1u); /* weights present */
    put32(h + 28, (uint32_t)w->rec_bytes);
    put64(h + 32, expert_bytes);
    memcpy(w->buf, h, sizeof h);
    w->len = sizeof h;
    return w;
}

void trace_writer_set_seq(trace_writer *w, int seq) { w->seq = (uint16_t)seq; }
uint64_t trace_writer_records(const trace_writer *w) { return w->records; }

void trace_writer_route(void *ctx, int layer, int pos, int k, const int32_t *experts,
                        const float *weights) {
    trace_writer *w = ctx;
    if (k != w->k || w->failed) return; /* the header fixed k; a mismatch is a caller bug */
    if (w->len + w->rec_bytes > WBUF_BYTES) flush_buf(w);
    uint8_t *r = w->buf + w->len;
    put16(r, (uint16_t)layer);
    put16(r + 2, w->seq);
    put32(r + 4, (uint32_t)pos);
    for (int i = 0; i < k; i++) {
        put16(r + 8 + 2 * i, (uint16_t)experts[i]);
        put16(r + 8 + 2 * (size_t)k + 2 * i, quant_f32_to_f16(weights[i]));
    }
    w->len += w->rec_bytes;
    w->records++;
}

int trace_writer_close(trace_writer *w, char *err, size_t n) {
    if (!w) return 0;
    flush_buf(w);
    int rc = 0;
    if (fclose(w->fp) != 0 && !w->failed) {
        w->failed = true;
        w->err_no = errno;
    }
    if (w->failed) {
        snprintf(err, n, "writing the routing trace: %s", strerror(w->err_no));
        rc = -1;
    }
    free(w->buf);
    free(w);
    return rc;
}

uint64_t trace_model_expert_bytes(const sluice_model *m) {
    static const char *const parts[3] = {"gate", "up", "down"};
    uint64_t total = 0;
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.0.ffn_%s_exps.weight", parts[i]);
        const gguf_tensor *t = m->gguf ? gguf_find_tensor(m->gguf, name) : NULL;
        if (!t || t->ne[2] <= 0) return 0;
        total += t->nbytes / (uint64_t)t->ne[2];
    }
    return total;
}

trace_writer *trace_writer_for_model(const char *path, const sluice_model *m, char *err,
                                     size_t n) {
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    return trace_writer_open(path, info.n_layer, info.n_expert, info.n_expert_used,
                             trace_model_expert_bytes(m), err, n);
}

/* ---- reader -------------------------------------------------------------------------------- */

static uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

void trace_free(trace *t) {
    free(t->layer);
    free(t->seq);
    free(t->pos);
    free(t->experts);
    free(t->weights);
    memset(t, 0, sizeof *t);
}

int trace_load(const char *path, trace *t, char *err, size_t n) {
    memset(t, 0, sizeof *t);
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        snprintf(err, n, "%s: %s", path, strerror(errno));
        return -1;
    }
    int rc = -1;
    uint8_t h[TRACE_HEADER_BYTES];
    uint8_t *rec = NULL;
    if (fread(h, 1, sizeof h, fp) != sizeof h || memcmp(h, TRACE_MAGIC, 4) != 0) {
        snprintf(err, n, "%s: not a routing trace (bad magic or short header)", path);
        goto done;
    }
    const uint32_t version = get32(h + 4), hbytes = get32(h + 8);
    t->n_layer = get32(h + 12);
    t->n_expert = get32(h + 16);
    t->k = get32(h + 20);
    t->flags = get32(h + 24);
    const uint32_t rbytes = get32(h + 28);
    memcpy(&t->expert_bytes, h + 32, 8);
    if (version != TRACE_VERSION) {
        snprintf(err, n, "%s: trace version %u is not supported (expected %d)", path, version,
                 TRACE_VERSION);
        goto done;
    }
    if (hbytes < TRACE_HEADER_BYTES || t->n_layer == 0 || t->n_layer > 65535 ||
        t->n_expert == 0 || t->n_expert > 65535 || t->k == 0 || t->k > TRACE_MAX_K ||
        t->k > t->n_expert || rbytes != 8 + 4 * t->k) {
        snprintf(err, n, "%s: invalid trace header (%u layers, %u experts, k %u, record %u bytes)",
                 path, t->n_layer, t->n_expert, t->k, rbytes);
        goto done;
    }
    if (fseek(fp, 0, SEEK_END) != 0) goto io;
    long size = ftell(fp);
    if (size < 0 || fseek(fp, (long)hbytes, SEEK_SET) != 0) goto io;
    if ((uint64_t)size < hbytes || ((uint64_t)size - hbytes) % rbytes != 0) {
        snprintf(err, n, "%s: truncated trace (%ld bytes is not a whole number of %u-byte records)",
                 path, size, rbytes);
        goto done;
    }
    t->n_records = (size_t)(((uint64_t)size - hbytes) / rbytes);
    const size_t nr = t->n_records ? t->n_records : 1, k = t->k;
    t->layer = malloc(nr * sizeof *t->layer);
    t->seq = malloc(nr * sizeof *t->seq);
    t->pos = malloc(nr * sizeof *t->pos);
    t->experts = malloc(nr * k * sizeof *t->experts);
    t->weights = malloc(nr * k * sizeof *t->weights);
    rec = malloc(rbytes);
    if (!t->layer || !t->seq || !t->pos || !t->experts || !t->weights || !rec) {
        snprintf(err, n, "%s: out of memory for %zu records", path, t->n_records);
        goto done;
    }
    for (size_t i = 0; i < t->n_records; i++) {
        if (fread(rec, 1, rbytes, fp) != rbytes) goto io;
        memcpy(&t->layer[i], rec, 2);
        memcpy(&t->seq[i], rec + 2, 2);
        memcpy(&t->pos[i], rec + 4, 4);
        if (t->layer[i] >= t->n_layer) {
            snprintf(err, n, "%s: record %zu: layer %u out of range (%u layers)", path, i,
                     t->layer[i], t->n_layer);
            goto done;
        }
        for (size_t j = 0; j < k; j++) {
            uint16_t e, wh;
            memcpy(&e, rec + 8 + 2 * j, 2);
            memcpy(&wh, rec + 8 + 2 * k + 2 * j, 2);
            if (e >= t->n_expert) {
                snprintf(err, n, "%s: record %zu: expert %u out of range (%u experts)", path, i, e,
                         t->n_expert);
                goto done;
            }
            t->experts[i * k + j] = e;
            t->weights[i * k + j] = quant_f16_to_f32(wh);
        }
    }
    rc = 0;
    goto done;
io:
    snprintf(err, n, "%s: read error", path);
done:
    free(rec);
    fclose(fp);
    if (rc) trace_free(t);
    return rc;
}
