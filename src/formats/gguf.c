/* GGUF reader: parse and validate a whole GGUF v2/v3 container.
 *
 * Every count read from the file is checked against the bytes that remain before anything is
 * allocated, so a malformed header cannot make us allocate more than O(file size). */
#include "formats/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/quant.h"

#define GGUF_MAX_NAME 64    /* ggml's limit, terminator included */
#define GGUF_MAX_NESTING 8  /* arrays of arrays */

typedef struct cursor {
    const uint8_t *base;
    uint64_t size;
    uint64_t off;
    char *err;
    size_t err_len;
    bool failed;
} cursor;

static void fail(cursor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(cursor *c, const char *fmt, ...) {
    if (c->failed) return; /* keep the first problem */
    c->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->err_len, fmt, ap);
    va_end(ap);
    /* names come from the file: keep the message on one printable line */
    for (char *p = c->err; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
}

static uint64_t remaining(const cursor *c) { return c->size - c->off; }

static bool take(cursor *c, uint64_t n, const uint8_t **out, const char *what) {
    if (c->failed) return false;
    if (n > remaining(c)) {
        fail(c, "truncated: %s needs %llu bytes at offset %llu, file has %llu", what,
             (unsigned long long)n, (unsigned long long)c->off, (unsigned long long)c->size);
        return false;
    }
    *out = c->base + c->off;
    c->off += n;
    return true;
}

static bool rd_u32(cursor *c, uint32_t *v, const char *what) {
    const uint8_t *p;
    if (!take(c, 4, &p, what)) return false;
    memcpy(v, p, 4);
    return true;
}

static bool rd_u64(cursor *c, uint64_t *v, const char *what) {
    const uint8_t *p;
    if (!take(c, 8, &p, what)) return false;
    memcpy(v, p, 8);
    return true;
}

static bool rd_str(cursor *c, gguf_str *s, const char *what) {
    uint64_t n;
    if (!rd_u64(c, &n, what)) return false;
    if (n > remaining(c)) {
        fail(c, "%s: string length %llu at offset %llu runs past the end of the file", what,
             (unsigned long long)n, (unsigned long long)(c->off - 8));
        return false;
    }
    const uint8_t *p;
    take(c, n, &p, what);
    s->ptr = (const char *)p;
    s->len = n;
    return true;
}

size_t gguf_vtype_size(enum gguf_vtype t) {
    switch (t) {
    case GGUF_VT_U8: case GGUF_VT_I8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_U16: case GGUF_VT_I16: return 2;
    case GGUF_VT_U32: case GGUF_VT_I32: case GGUF_VT_F32: return 4;
    case GGUF_VT_U64: case GGUF_VT_I64: case GGUF_VT_F64: return 8;
    default: return 0;
    }
}

const char *gguf_vtype_name(enum gguf_vtype t) {
    static const char *names[GGUF_VT_COUNT] = {"u8",  "i8",   "u16",    "i16",   "u32",
                                               "i32", "f32",  "bool",   "string", "array",
                                               "u64", "i64",  "f64"};
    return (unsigned)t < GGUF_VT_COUNT ? names[t] : "invalid";
}

/* Decode one scalar of type t at p into kv->v (widening integers). */
static void decode_scalar(enum gguf_vtype t, const uint8_t *p, gguf_kv *kv) {
    switch (t) {
    case GGUF_VT_U8: kv->v.u = p[0]; break;
    case GGUF_VT_I8: kv->v.i = (int8_t)p[0]; break;
    case GGUF_VT_BOOL: kv->v.u = p[0] != 0; break;
    case GGUF_VT_U16: { uint16_t x; memcpy(&x, p, 2); kv->v.u = x; break; }
    case GGUF_VT_I16: { int16_t x; memcpy(&x, p, 2); kv->v.i = x; break; }
    case GGUF_VT_U32: { uint32_t x; memcpy(&x, p, 4); kv->v.u = x; break; }
    case GGUF_VT_I32: { int32_t x; memcpy(&x, p, 4); kv->v.i = x; break; }
    case GGUF_VT_F32: { float x; memcpy(&x, p, 4); kv->v.f = x; break; }
    case GGUF_VT_U64: { uint64_t x; memcpy(&x, p, 8); kv->v.u = x; break; }
    case GGUF_VT_I64: { int64_t x; memcpy(&x, p, 8); kv->v.i = x; break; }
    case GGUF_VT_F64: { double x; memcpy(&x, p, 8); kv->v.f = x; break; }
    default: break;
    }
}

/* Skip (validate) the elements of an array; strings are recorded into strs when not NULL. */
static bool walk_array(cursor *c, const char *key, int depth, enum gguf_vtype *type_out,
                       uint64_t *n_out, const uint8_t **data_out, gguf_str **strs_out) {
    uint32_t et;
    uint64_t n;
    if (!rd_u32(c, &et, key) || !rd_u64(c, &n, key)) return false;
    if (et >= GGUF_VT_COUNT) {
        fail(c, "key '%s': array of unknown value type %u", key, et);
        return false;
    }
    if (type_out) *type_out = (enum gguf_vtype)et;
    if (n_out) *n_out = n;
    if (data_out) *data_out = c->base + c->off;
    size_t es = gguf_vtype_size((enum gguf_vtype)et);
    if (es) {
        if (n > remaining(c) / es) {
            fail(c, "key '%s': array of %llu %s values runs past the end of the file", key,
                 (unsigned long long)n, gguf_vtype_name((enum gguf_vtype)et));
            return false;
        }
        if (et == GGUF_VT_BOOL) {
            for (uint64_t i = 0; i < n; i++)
                if (c->base[c->off + i] > 1) {
                    fail(c, "key '%s': bool array element %llu is %u, not 0 or 1", key,
                         (unsigned long long)i, c->base[c->off + i]);
                    return false;
                }
        }
        c->off += n * es;
        return true;
    }
    if (et == GGUF_VT_STRING) {
        /* each string needs at least its 8-byte length */
        if (n > remaining(c) / 8) {
            fail(c, "key '%s': array of %llu strings runs past the end of the file", key,
                 (unsigned long long)n);
            return false;
        }
        gguf_str *strs = NULL;
        if (strs_out) {
            strs = malloc((n ? n : 1) * sizeof *strs);
            if (!strs) {
                fail(c, "key '%s': out of memory for %llu strings", key, (unsigned long long)n);
                return false;
            }
            *strs_out = strs;
        }
        for (uint64_t i = 0; i < n; i++) {
            gguf_str s;
            if (!rd_str(c, &s, key)) return false;
            if (strs) strs[i] = s;
        }
        return true;
    }
    /* nested arrays */
    if (depth >= GGUF_MAX_NESTING) {
        fail(c, "key '%s': arrays nested deeper than %d", key, GGUF_MAX_NESTING);
        return false;
    }
    if (n > remaining(c) / 12) {
        fail(c, "key '%s': array of %llu arrays runs past the end of the file", key,
             (unsigned long long)n);
        return false;
    }
    for (uint64_t i = 0; i < n; i++)
        if (!walk_array(c, key, depth + 1, NULL, NULL, NULL, NULL)) return false;
    return true;
}

static char *dup_str(gguf_str s) {
    char *p = malloc(s.len + 1);
    if (!p) return NULL;
    memcpy(p, s.ptr, s.len);
    p[s.len] = 0;
    return p;
}

static bool has_nul(gguf_str s) { return memchr(s.ptr, 0, s.len) != NULL; }

static int cmp_cstr_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

typedef struct span {
    uint64_t begin, end;
    uint64_t index;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static bool parse_kvs(cursor *c, gguf_file *f) {
    for (uint64_t i = 0; i < f->n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        gguf_str key;
        char what[48];
        snprintf(what, sizeof what, "metadata key #%llu", (unsigned long long)i);
        if (!rd_str(c, &key, what)) return false;
        if (key.len == 0 || has_nul(key)) {
            fail(c, "metadata key #%llu: empty or contains a NUL byte", (unsigned long long)i);
            return false;
        }
        kv->key = dup_str(key);
        if (!kv->key) {
            fail(c, "out of memory");
            return false;
        }
        uint32_t t;
        if (!rd_u32(c, &t, kv->key)) return false;
        if (t >= GGUF_VT_COUNT) {
            fail(c, "key '%s': unknown value type %u", kv->key, t);
            return false;
        }
        kv->type = (enum gguf_vtype)t;
        if (t == GGUF_VT_STRING) {
            if (!rd_str(c, &kv->v.s, kv->key)) return false;
        } else if (t == GGUF_VT_ARRAY) {
            if (!walk_array(c, kv->key, 0, &kv->arr_type, &kv->arr_n, &kv->arr_data,
                            &kv->arr_strs))
                return false;
        } else {
            const uint8_t *p;
            if (!take(c, gguf_vtype_size(kv->type), &p, kv->key)) return false;
            if (t == GGUF_VT_BOOL && p[0] > 1) {
                fail(c, "key '%s': bool value is %u, not 0 or 1", kv->key, p[0]);
                return false;
            }
            decode_scalar(kv->type, p, kv);
        }
    }
    /* duplicate keys */
    const char **keys = malloc((f->n_kv ? f->n_kv : 1) * sizeof *keys);
    if (!keys) {
        fail(c, "out of memory");
        return false;
    }
    for (uint64_t i = 0; i < f->n_kv; i++) keys[i] = f->kv[i].key;
    qsort(keys, f->n_kv, sizeof *keys, cmp_cstr_ptr);
    for (uint64_t i = 1; i < f->n_kv; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0) {
            fail(c, "duplicate metadata key '%s'", keys[i]);
            break;
        }
    free(keys);
    return !c->failed;
}

static bool parse_alignment(cursor *c, gguf_file *f) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find(f, "general.alignment");
    if (!kv) return true;
    if (kv->type != GGUF_VT_U32) {
        fail(c, "general.alignment has type %s, expected u32", gguf_vtype_name(kv->type));
        return false;
    }
    uint64_t a = kv->v.u;
    if (a == 0 || (a & (a - 1)) != 0) {
        fail(c, "general.alignment %llu is not a power of two", (unsigned long long)a);
        return false;
    }
    f->alignment = a;
    return true;
}

static bool parse_tensor_infos(cursor *c, gguf_file *f) {
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        gguf_str name;
        char what[48];
        snprintf(what, sizeof what, "tensor info #%llu", (unsigned long long)i);
        if (!rd_str(c, &name, what)) return false;
        if (name.len == 0 || name.len >= GGUF_MAX_NAME || has_nul(name)) {
            fail(c, "tensor #%llu: name is empty, contains NUL or is longer than %d bytes",
                 (unsigned long long)i, GGUF_MAX_NAME - 1);
            return false;
        }
        t->name = dup_str(name);
        if (!t->name) {
            fail(c, "out of memory");
            return false;
        }
        if (!rd_u32(c, &t->n_dims, t->name)) return false;
        if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS) {
            fail(c, "tensor '%s' (#%llu): %u dimensions (1..%d allowed)", t->name,
                 (unsigned long long)i, t->n_dims, GGUF_MAX_DIMS);
            return false;
        }
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t ne;
            if (!rd_u64(c, &ne, t->name)) return false;
            if (ne > (uint64_t)INT64_MAX) {
                fail(c, "tensor '%s': dimension %u is negative", t->name, d);
                return false;
            }
            t->ne[d] = (int64_t)ne;
        }
        if (!rd_u32(c, &t->type, t->name) || !rd_u64(c, &t->offset, t->name)) return false;

        const quant_traits *qt = quant_traits_of(t->type);
        if (!qt || t->type == SLUICE_TYPE_Q6_K_R16) { /* R16: a load-time layout, never in a file */
            fail(c, "tensor '%s': unknown ggml type %u", t->name, t->type);
            return false;
        }
        /* element count and byte size without overflow */
        uint64_t nel = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) {
            uint64_t ne = (uint64_t)t->ne[d];
            if (ne != 0 && nel > (uint64_t)INT64_MAX / ne) {
                fail(c, "tensor '%s': dimensions [%lld, %lld, %lld, %lld] overflow", t->name,
                     (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                     (long long)t->ne[3]);
                return false;
            }
            nel *= ne;
        }
        if (t->ne[0] % qt->block_elems != 0) {
            fail(c, "tensor '%s': row length %lld is not a multiple of the %s block size %u",
                 t->name, (long long)t->ne[0], qt->name, qt->block_elems);
            return false;
        }
        uint64_t blocks = nel / qt->block_elems;
        if (blocks > UINT64_MAX / qt->block_bytes) {
            fail(c, "tensor '%s': byte size overflows", t->name);
            return false;
        }
        t->nbytes = blocks * qt->block_bytes;
    }
    return true;
}

static bool place_tensors(cursor *c, gguf_file *f) {
    uint64_t a = f->alignment;
    uint64_t data = (c->off + a - 1) / a * a;
    if (data < c->off) {
        fail(c, "data section offset overflows");
        return false;
    }
    f->data_offset = data;
    if (f->n_tensors == 0) return true;
    if (data > f->size) {
        fail(c, "truncated: data section starts at %llu but the file has %llu bytes",
             (unsigned long long)data, (unsigned long long)f->size);
        return false;
    }
    uint64_t avail = f->size - data;
    span *spans = malloc(f->n_tensors * sizeof *spans);
    if (!spans) {
        fail(c, "out of memory");
        return false;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset % a != 0) {
            fail(c, "tensor '%s': data offset %llu is not a multiple of the alignment %llu",
                 t->name, (unsigned long long)t->offset, (unsigned long long)a);
            break;
        }
        if (t->offset > avail || t->nbytes > avail - t->offset) {
            fail(c, "tensor '%s': data [%llu, +%llu) runs past the end of the file (%llu bytes "
                 "of data)", t->name, (unsigned long long)t->offset,
                 (unsigned long long)t->nbytes, (unsigned long long)avail);
            break;
        }
        t->data = f->base + data + t->offset;
        spans[i] = (span){t->offset, t->offset + t->nbytes, i};
    }
    if (!c->failed) {
        qsort(spans, f->n_tensors, sizeof *spans, cmp_span);
        for (uint64_t i = 1; i < f->n_tensors; i++)
            if (spans[i].begin < spans[i - 1].end) {
                fail(c, "tensors '%s' and '%s' overlap", f->tensors[spans[i - 1].index].name,
                     f->tensors[spans[i].index].name);
                break;
            }
    }
    free(spans);
    if (c->failed) return false;

    const char **names = malloc(f->n_tensors * sizeof *names);
    if (!names) {
        fail(c, "out of memory");
        return false;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) names[i] = f->tensors[i].name;
    qsort(names, f->n_tensors, sizeof *names, cmp_cstr_ptr);
    for (uint64_t i = 1; i < f->n_tensors; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            fail(c, "duplicate tensor name '%s'", names[i]);
            break;
        }
    free(names);
    return !c->failed;
}

static gguf_file *parse(const uint8_t *base, uint64_t size, bool mapped, char *err,
                        size_t err_len) {
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    f->base = base;
    f->size = size;
    f->mapped = mapped;
    cursor c = {.base = base, .size = size, .err = err, .err_len = err_len};

    const uint8_t *magic;
    if (size == 0) {
        fail(&c, "empty file");
    } else if (take(&c, 4, &magic, "magic") && memcmp(magic, GGUF_MAGIC, 4) != 0) {
        fail(&c, "not a GGUF file (magic %02x %02x %02x %02x)", magic[0], magic[1], magic[2],
             magic[3]);
    }
    if (!c.failed && rd_u32(&c, &f->version, "version")) {
        if (f->version == 1)
            fail(&c, "GGUF version 1 is not supported (convert the file with a current tool)");
        else if (f->version != 2 && f->version != 3)
            fail(&c, "unsupported GGUF version %u%s", f->version,
                 (f->version & 0xffff) == 0 ? " (a big-endian file?)" : "");
    }
    if (!c.failed && rd_u64(&c, &f->n_tensors, "tensor count") &&
        rd_u64(&c, &f->n_kv, "metadata count")) {
        /* A key/value takes at least 8 (key length) + 1 (key) + 4 (type) + 1 (value) bytes;
         * a tensor info at least 8 + 1 + 4 + 8 + 4 + 8. */
        if (f->n_kv > remaining(&c) / 14)
            fail(&c, "metadata count %llu is impossible for a %llu-byte file",
                 (unsigned long long)f->n_kv, (unsigned long long)size);
        else if (f->n_tensors > remaining(&c) / 33)
            fail(&c, "tensor count %llu is impossible for a %llu-byte file",
                 (unsigned long long)f->n_tensors, (unsigned long long)size);
    }
    if (!c.failed) {
        f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kv);
        f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
        if (!f->kv || !f->tensors) fail(&c, "out of memory");
    }
    if (!c.failed) parse_kvs(&c, f);
    if (!c.failed) parse_alignment(&c, f);
    if (!c.failed) parse_tensor_infos(&c, f);
    if (!c.failed) place_tensors(&c, f);
    if (c.failed) {
        f->mapped = false; /* the caller unmaps */
        gguf_close(f);
        return NULL;
    }
    return f;
}

gguf_file *gguf_open_memory(const void *data, size_t size, char *err, size_t err_len) {
    return parse(data, size, false, err, err_len);
}

gguf_file *gguf_open(const char *path, char *err, size_t err_len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size == 0) {
        snprintf(err, err_len, "%s: empty file", path);
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(err, err_len, "%s: mmap failed: %s", path, strerror(map_errno));
        return NULL;
    }
    char cause[512];
    gguf_file *f = parse(p, size, true, cause, sizeof cause);
    if (!f) {
        munmap(p, size);
        snprintf(err, err_len, "%s: %s", path, cause);
        return NULL;
    }
    return f;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++) {
            free((void *)f->kv[i].key);
            free(f->kv[i].arr_strs);
        }
    if (f->tensors)
        for (uint64_t i = 0; i < f->n_tensors; i++) free((void *)f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    if (f->mapped) munmap((void *)f->base, f->size);
    free(f);
}

const gguf_kv *gguf_find(const gguf_file *f, const char *key) {
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (f->kv[i].key && strcmp(f->kv[i].key, key) == 0) return &f->kv[i];
    return NULL;
}

int gguf_parse_override(const char *spec, char *key, size_t key_len, gguf_kv *value, char *err,
                        size_t err_len) {
    const char *eq = spec ? strchr(spec, '=') : NULL;
    const char *colon = eq ? strchr(eq + 1, ':') : NULL;
    if (!eq || !colon || eq == spec || (size_t)(eq - spec) >= key_len) {
        snprintf(err, err_len, "override '%s' is not KEY=TYPE:VALUE", spec ? spec : "");
        return -1;
    }
    memcpy(key, spec, (size_t)(eq - spec));
    key[eq - spec] = 0;
    char type[16];
    const size_t tl = (size_t)(colon - eq - 1);
    memcpy(type, eq + 1, tl < sizeof type - 1 ? tl : sizeof type - 1);
    type[tl < sizeof type - 1 ? tl : sizeof type - 1] = 0;
    const char *val = colon + 1;
    gguf_kv v;
    memset(&v, 0, sizeof v);
    char *end = NULL;
    errno = 0;
    if (strcmp(type, "int") == 0) {
        v.type = GGUF_VT_I64;
        v.v.i = strtoll(val, &end, 10);
        if (errno == ERANGE) end = NULL; /* out of range: strtoll saturates, never silently */
    } else if (strcmp(type, "float") == 0) {
        v.type = GGUF_VT_F64;
        v.v.f = strtod(val, &end);
        if (errno == ERANGE && isinf(v.v.f)) end = NULL; /* overflow, not a number we can hold */
    } else if (strcmp(type, "bool") == 0) {
        v.type = GGUF_VT_BOOL;
        v.v.u = strcmp(val, "true") == 0;
        end = (char *)val + (strcmp(val, "true") == 0 || strcmp(val, "false") == 0 ? strlen(val) : 0);
    } else if (strcmp(type, "str") == 0) {
        v.type = GGUF_VT_STRING;
        v.v.s = (gguf_str){val, strlen(val)};
        end = (char *)val + strlen(val);
    } else {
        snprintf(err, err_len, "override '%s': type must be int, float, bool or str", spec);
        return -1;
    }
    if (!end || end == val || *end) {
        snprintf(err, err_len, "override '%s': bad %s value '%s'", spec, type, val);
        return -1;
    }
    *value = v;
    return 0;
}

int gguf_override(gguf_file *f, const char *key, const gguf_kv *value, char *err, size_t err_len) {
    const enum gguf_vtype t = value->type;
    if (t != GGUF_VT_I64 && t != GGUF_VT_F64 && t != GGUF_VT_BOOL && t != GGUF_VT_STRING) {
        snprintf(err, err_len, "override of '%s': unsupported value type %s", key, gguf_vtype_name(t));
        return -1;
    }
    gguf_kv *kv = (gguf_kv *)gguf_find(f, key);
    if (kv && kv->type == GGUF_VT_ARRAY) {
        snprintf(err, err_len, "override of '%s': the file's value is an array", key);
        return -1;
    }
    /* the key and a string value share one allocation, freed with the key by gguf_close */
    const size_t klen = strlen(key), slen = t == GGUF_VT_STRING ? (size_t)value->v.s.len : 0;
    char *mem = malloc(klen + 1 + slen + 1);
    if (!mem) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    memcpy(mem, key, klen + 1);
    if (t == GGUF_VT_STRING) {
        memcpy(mem + klen + 1, value->v.s.ptr, slen);
        mem[klen + 1 + slen] = 0;
    }
    if (!kv) {
        gguf_kv *grown = realloc(f->kv, (size_t)(f->n_kv + 1) * sizeof *grown);
        if (!grown) {
            free(mem);
            snprintf(err, err_len, "out of memory");
            return -1;
        }
        f->kv = grown;
        kv = &f->kv[f->n_kv++];
        memset(kv, 0, sizeof *kv);
    } else {
        free((void *)kv->key);
    }
    kv->key = mem;
    kv->type = t;
    kv->v = value->v;
    if (t == GGUF_VT_STRING) kv->v.s = (gguf_str){mem + klen + 1, slen};
    return 0;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static bool is_signed(enum gguf_vtype t) {
    return t == GGUF_VT_I8 || t == GGUF_VT_I16 || t == GGUF_VT_I32 || t == GGUF_VT_I64;
}

static bool is_unsigned(enum gguf_vtype t) {
    return t == GGUF_VT_U8 || t == GGUF_VT_U16 || t == GGUF_VT_U32 || t == GGUF_VT_U64 ||
           t == GGUF_VT_BOOL;
}

bool gguf_get_i64(const gguf_file *f, const char *key, int64_t *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return false;
    if (is_signed(kv->type)) {
        *out = kv->v.i;
        return true;
    }
    if (is_unsigned(kv->type) && kv->v.u <= (uint64_t)INT64_MAX) {
        *out = (int64_t)kv->v.u;
        return true;
    }
    return false;
}

bool gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return false;
    if (is_unsigned(kv->type)) {
        *out = kv->v.u;
        return true;
    }
    if (is_signed(kv->type) && kv->v.i >= 0) {
        *out = (uint64_t)kv->v.i;
        return true;
    }
    return false;
}

bool gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out) {
    uint64_t v;
    if (!gguf_get_u64(f, key, &v) || v > UINT32_MAX) return false;
    *out = (uint32_t)v;
    return true;
}

bool gguf_get_f32(const gguf_file *f, const char *key, float *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || (kv->type != GGUF_VT_F32 && kv->type != GGUF_VT_F64)) return false;
    *out = (float)kv->v.f;
    return true;
}

bool gguf_get_bool(const gguf_file *f, const char *key, bool *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->type != GGUF_VT_BOOL) return false;
    *out = kv->v.u != 0;
    return true;
}

bool gguf_get_str(const gguf_file *f, const char *key, gguf_str *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->type != GGUF_VT_STRING) return false;
    *out = kv->v.s;
    return true;
}

static bool arr_elem(const gguf_kv *kv, uint64_t i, gguf_kv *tmp) {
    if (kv->type != GGUF_VT_ARRAY || i >= kv->arr_n) return false;
    size_t es = gguf_vtype_size(kv->arr_type);
    if (!es) return false;
    decode_scalar(kv->arr_type, kv->arr_data + i * es, tmp);
    return true;
}

bool gguf_arr_get_f64(const gguf_kv *kv, uint64_t i, double *out) {
    gguf_kv tmp;
    if (!arr_elem(kv, i, &tmp)) return false;
    if (kv->arr_type == GGUF_VT_F32 || kv->arr_type == GGUF_VT_F64) *out = tmp.v.f;
    else if (is_signed(kv->arr_type)) *out = (double)tmp.v.i;
    else *out = (double)tmp.v.u;
    return true;
}

bool gguf_arr_get_i64(const gguf_kv *kv, uint64_t i, int64_t *out) {
    gguf_kv tmp;
    if (!arr_elem(kv, i, &tmp)) return false;
    if (is_signed(kv->arr_type)) *out = tmp.v.i;
    else if (is_unsigned(kv->arr_type) && tmp.v.u <= (uint64_t)INT64_MAX) *out = (int64_t)tmp.v.u;
    else return false;
    return true;
}

int64_t gguf_tensor_nelements(const gguf_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}
