/* GGUF v3 writer. Metadata is serialized into one growing byte buffer as it is added; tensor
 * infos are kept as records and serialized when the header is written (offsets depend on the
 * alignment, which may be set late). */
#include "formats/gguf_write.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "formats/quant.h"

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes, offset;
    const void *data;
} wtensor;

struct gguf_writer {
    uint8_t *kv;      /* serialized metadata */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    wtensor *t;
    int n_t, cap_t;
    uint32_t alignment;
    uint64_t written; /* bytes written into the current tensor */
};

gguf_writer *gguf_writer_new(void) {
    gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->alignment = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->kv);
    free(w);
}

static int put(gguf_writer *w, const void *p, size_t n) {
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap * 2 : 4096;
        while (cap < w->kv_len + n) cap *= 2;
        uint8_t *k = realloc(w->kv, cap);
        if (!k) return -1;
        w->kv = k;
        w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return 0;
}

static int put_u32(gguf_writer *w, uint32_t v) { return put(w, &v, 4); }
static int put_u64(gguf_writer *w, uint64_t v) { return put(w, &v, 8); }
static int put_str(gguf_writer *w, const char *s, size_t n) {
    return put_u64(w, n) || put(w, s, n) ? -1 : 0;
}

static int key(gguf_writer *w, const char *k, enum gguf_vtype t) {
    w->n_kv++;
    return put_str(w, k, strlen(k)) || put_u32(w, t) ? -1 : 0;
}

int gguf_w_u8(gguf_writer *w, const char *k, uint8_t v) {
    return key(w, k, GGUF_VT_U8) || put(w, &v, 1) ? -1 : 0;
}
int gguf_w_u32(gguf_writer *w, const char *k, uint32_t v) {
    return key(w, k, GGUF_VT_U32) || put(w, &v, 4) ? -1 : 0;
}
int gguf_w_i32(gguf_writer *w, const char *k, int32_t v) {
    return key(w, k, GGUF_VT_I32) || put(w, &v, 4) ? -1 : 0;
}
int gguf_w_u64(gguf_writer *w, const char *k, uint64_t v) {
    return key(w, k, GGUF_VT_U64) || put(w, &v, 8) ? -1 : 0;
}
int gguf_w_f32(gguf_writer *w, const char *k, float v) {
    return key(w, k, GGUF_VT_F32) || put(w, &v, 4) ? -1 : 0;
}
int gguf_w_bool(gguf_writer *w, const char *k, bool v) {
    uint8_t b = v;
    return key(w, k, GGUF_VT_BOOL) || put(w, &b, 1) ? -1 : 0;
}
int gguf_w_str(gguf_writer *w, const char *k, const char *v) {
    return key(w, k, GGUF_VT_STRING) || put_str(w, v, strlen(v)) ? -1 : 0;
}

int gguf_w_arr(gguf_writer *w, const char *k, enum gguf_vtype t, const void *data, uint64_t n) {
    size_t es = gguf_vtype_size(t);
    if (!es) return -1;
    return key(w, k, GGUF_VT_ARRAY) || put_u32(w, t) || put_u64(w, n) || put(w, data, n * es)
               ? -1
               : 0;
}

int gguf_w_arr_str(gguf_writer *w, const char *k, const char *const *strs, uint64_t n) {
    if (key(w, k, GGUF_VT_ARRAY) || put_u32(w, GGUF_VT_STRING) || put_u64(w, n)) return -1;
    for (uint64_t i = 0; i < n; i++)
        if (put_str(w, strs[i], strlen(strs[i]))) return -1;
    return 0;
}

int gguf_w_copy_kv(gguf_writer *w, const gguf_kv *kv) {
    if (key(w, kv->key, kv->type)) return -1;
    if (kv->type == GGUF_VT_STRING) return put_str(w, kv->v.s.ptr, kv->v.s.len);
    if (kv->type != GGUF_VT_ARRAY) {
        /* re-encode from the widened value */
        uint8_t buf[8];
        size_t es = gguf_vtype_size(kv->type);
        switch (kv->type) {
        case GGUF_VT_F32: { float x = (float)kv->v.f; memcpy(buf, &x, 4); break; }
        case GGUF_VT_F64: memcpy(buf, &kv->v.f, 8); break;
        default: memcpy(buf, &kv->v.u, es); break; /* little-endian truncation */
        }
        return put(w, buf, es);
    }
    if (put_u32(w, kv->arr_type) || put_u64(w, kv->arr_n)) return -1;
    if (kv->arr_type == GGUF_VT_STRING) {
        for (uint64_t i = 0; i < kv->arr_n; i++)
            if (put_str(w, kv->arr_strs[i].ptr, kv->arr_strs[i].len)) return -1;
        return 0;
    }
    size_t es = gguf_vtype_size(kv->arr_type);
    if (!es) return -1; /* nested arrays are not copied */
    return put(w, kv->arr_data, kv->arr_n * es);
}

void gguf_w_set_alignment(gguf_writer *w, uint32_t alignment) { w->alignment = alignment; }

int gguf_w_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                  const int64_t *ne, const void *data) {
    const quant_traits *qt = quant_traits_of(type);
    if (!qt || n_dims == 0 || n_dims > GGUF_MAX_DIMS) return -1;
    if (w->n_t == w->cap_t) {
        int cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return -1;
        w->t = t;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return -1;
    t->type = type;
    t->n_dims = n_dims;
    uint64_t nel = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = d < n_dims ? ne[d] : 1;
        nel *= (uint64_t)t->ne[d];
    }
    t->nbytes = nel / qt->block_elems * qt->block_bytes;
    t->data = data;
    return w->n_t++;
}

uint64_t gguf_w_tensor_nbytes(const gguf_writer *w, int index) { return w->t[index].nbytes; }

static uint64_t pad_to(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int write_bytes(FILE *fp, const void *p, size_t n) {
    return n == 0 || fwrite(p, 1, n, fp) == n ? 0 : -1;
}

static int write_zeros(FILE *fp, size_t n) {
    static const uint8_t zeros[256];
    while (n) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        if (write_bytes(fp, zeros, k)) return -1;
        n -= k;
    }
    return 0;
}

int gguf_writer_write_header(gguf_writer *w, FILE *fp) {
    uint64_t n_kv = w->n_kv;
    bool add_align = w->alignment != GGUF_DEFAULT_ALIGNMENT;
    /* general.alignment is written last when it differs from the default */
    uint8_t head[24];
    memcpy(head, GGUF_MAGIC, 4);
    uint32_t version = 3;
    memcpy(head + 4, &version, 4);
    uint64_t nt = (uint64_t)w->n_t, nk = n_kv + (add_align ? 1 : 0);
    memcpy(head + 8, &nt, 8);
    memcpy(head + 16, &nk, 8);
    if (write_bytes(fp, head, sizeof head) || write_bytes(fp, w->kv, w->kv_len)) return -1;
    uint64_t pos = sizeof head + w->kv_len;
    if (add_align) {
        static const char k[] = "general.alignment";
        uint64_t kl = sizeof k - 1;
        uint32_t t = GGUF_VT_U32;
        if (write_bytes(fp, &kl, 8) || write_bytes(fp, k, kl) || write_bytes(fp, &t, 4) ||
            write_bytes(fp, &w->alignment, 4))
            return -1;
        pos += 8 + kl + 8;
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        t->offset = off;
        off = pad_to(off + t->nbytes, w->alignment);
        uint64_t nl = strlen(t->name);
        if (write_bytes(fp, &nl, 8) || write_bytes(fp, t->name, nl) ||
            write_bytes(fp, &t->n_dims, 4))
            return -1;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if (write_bytes(fp, &t->ne[d], 8)) return -1;
        if (write_bytes(fp, &t->type, 4) || write_bytes(fp, &t->offset, 8)) return -1;
        pos += 8 + nl + 4 + 8ull * t->n_dims + 4 + 8;
    }
    return write_zeros(fp, pad_to(pos, w->alignment) - pos);
}

int gguf_writer_begin_tensor(gguf_writer *w, FILE *fp, int index) {
    (void)fp;
    (void)index;
    w->written = 0;
    return 0;
}

int gguf_writer_write_data(gguf_writer *w, FILE *fp, const void *data, size_t n) {
    w->written += n;
    return write_bytes(fp, data, n);
}

int gguf_writer_end_tensor(gguf_writer *w, FILE *fp, int index) {
    const wtensor *t = &w->t[index];
    if (w->written != t->nbytes) {
        errno = EINVAL;
        return -1;
    }
    return write_zeros(fp, pad_to(t->nbytes, w->alignment) - t->nbytes);
}

int gguf_writer_write_all_data(gguf_writer *w, FILE *fp) {
    for (int i = 0; i < w->n_t; i++) {
        if (!w->t[i].data) {
            errno = EINVAL;
            return -1;
        }
        if (gguf_writer_begin_tensor(w, fp, i) ||
            gguf_writer_write_data(w, fp, w->t[i].data, w->t[i].nbytes) ||
            gguf_writer_end_tensor(w, fp, i))
            return -1;
    }
    return 0;
}

int gguf_writer_save(gguf_writer *w, const char *path) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    int rc = gguf_writer_write_header(w, fp) || gguf_writer_write_all_data(w, fp) ? -1 : 0;
    if (fclose(fp) != 0) rc = -1;
    return rc;
}

int gguf_writer_to_memory(gguf_writer *w, uint8_t **out, size_t *out_len) {
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    if (!fp) return -1;
    int rc = gguf_writer_write_header(w, fp) || gguf_writer_write_all_data(w, fp) ? -1 : 0;
    if (fclose(fp) != 0) rc = -1;
    if (rc) {
        free(buf);
        return -1;
    }
    *out = (uint8_t *)buf;
    *out_len = len;
    return 0;
}
