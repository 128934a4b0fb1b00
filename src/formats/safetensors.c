/* safetensors reader (format notes in safetensors.h). JSON through jansson. */
#include "formats/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/quant.h"

/* The reference implementation refuses headers over 100 MB; so do we (a bound on what a
 * corrupt length can make us allocate). */
#define ST_MAX_HEADER (100u << 20)

typedef struct st_file {
    char *path;
    const uint8_t *map;
    uint64_t size;
    int64_t mtime_ns;
} st_file;

struct st_set {
    st_file *files;
    int n_files;
    st_tensor *tensors; /* sorted by name */
    size_t n, cap;
};

static const struct {
    const char *name;
    size_t size;
} dtypes[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 1},    [ST_U8] = {"U8", 1},   [ST_I8] = {"I8", 1},
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_I16] = {"I16", 2},      [ST_U16] = {"U16", 2}, [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},    [ST_I32] = {"I32", 4}, [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},      [ST_I64] = {"I64", 8}, [ST_U64] = {"U64", 8},
    [ST_F64] = {"F64", 8},
};

const char *st_dtype_name(enum st_dtype t) { return (unsigned)t < ST_DTYPE_COUNT ? dtypes[t].name : "?"; }
size_t st_dtype_size(enum st_dtype t) { return (unsigned)t < ST_DTYPE_COUNT ? dtypes[t].size : 0; }

int64_t st_nelements(const st_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) n *= t->shape[d];
    return n;
}

static void fail(char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int add_tensor(st_set *s, const st_tensor *t) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        st_tensor *nt = realloc(s->tensors, cap * sizeof *nt);
        if (!nt) return -1;
        s->tensors = nt;
        s->cap = cap;
    }
    s->tensors[s->n++] = *t;
    return 0;
}

typedef struct range {
    uint64_t begin, end;
    const char *name;
} range;

static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Parse and validate one file's header; append its tensors. */
static int parse_file(st_set *s, int fi, char *err, size_t n) {
    st_file *f = &s->files[fi];
    const char *fname = base_name(f->path);
    if (f->size < 8) {
        fail(err, n, "%s: too short for a safetensors file (%llu bytes)", fname,
             (unsigned long long)f->size);
        return -1;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)f->map[i] << (8 * i);
    if (hlen == 0 || hlen > f->size - 8 || hlen > ST_MAX_HEADER) {
        fail(err, n, "%s: header length %llu does not fit the file (%llu bytes)", fname,
             (unsigned long long)hlen, (unsigned long long)f->size);
        return -1;
    }
    const uint8_t *data = f->map + 8 + hlen;
    const uint64_t data_len = f->size - 8 - hlen;
    json_error_t je;
    json_t *root = json_loadb((const char *)f->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        fail(err, n, "%s: header is not valid JSON: %s (at byte %d)", fname, je.text, je.position);
        return -1;
    }
    int rc = -1;
    range *ranges = NULL;
    size_t nr = 0;
    if (!json_is_object(root)) {
        fail(err, n, "%s: header is not a JSON object", fname);
        goto done;
    }
    ranges = calloc(json_object_size(root) + 1, sizeof *ranges);
    if (!ranges) {
        fail(err, n, "out of memory");
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                fail(err, n, "%s: __metadata__ is not an object", fname);
                goto done;
            }
            continue;
        }
        if (!*key) {
            fail(err, n, "%s: a tensor has an empty name", fname);
            goto done;
        }
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
               *jo = json_object_get(val, "data_offsets");
        if (!json_is_object(val) || !json_is_string(jd) || !json_is_array(js) ||
            !json_is_array(jo) || json_array_size(jo) != 2) {
            fail(err, n, "%s: tensor '%s' lacks dtype, shape or data_offsets", fname, key);
            goto done;
        }
        st_tensor t = {.file = fi};
        int dt = -1;
        for (int d = 0; d < ST_DTYPE_COUNT; d++)
            if (strcmp(json_string_value(jd), dtypes[d].name) == 0) dt = d;
        if (dt < 0) {
            fail(err, n, "%s: tensor '%s' has unsupported dtype %s", fname, key,
                 json_string_value(jd));
            goto done;
        }
        t.dtype = (enum st_dtype)dt;
        if (json_array_size(js) > ST_MAX_DIMS) {
            fail(err, n, "%s: tensor '%s' has %zu dimensions (at most %d)", fname, key,
                 json_array_size(js), ST_MAX_DIMS);
            goto done;
        }
        t.n_dims = (int)json_array_size(js);
        uint64_t nel = 1;
        for (int d = 0; d < t.n_dims; d++) {
            json_t *e = json_array_get(js, (size_t)d);
            if (!json_is_integer(e) || json_integer_value(e) < 0) {
                fail(err, n, "%s: tensor '%s' has an invalid shape", fname, key);
                goto done;
            }
            uint64_t v = (uint64_t)json_integer_value(e);
            if (v && nel > UINT64_MAX / 16 / v) {
                fail(err, n, "%s: tensor '%s' is impossibly large", fname, key);
                goto done;
            }
            nel *= v;
            t.shape[d] = (int64_t)v;
        }
        json_t *b0 = json_array_get(jo, 0), *b1 = json_array_get(jo, 1);
        if (!json_is_integer(b0) || !json_is_integer(b1) || json_integer_value(b0) < 0 ||
            json_integer_value(b1) < json_integer_value(b0)) {
            fail(err, n, "%s: tensor '%s' has invalid data_offsets", fname, key);
            goto done;
        }
        uint64_t begin = (uint64_t)json_integer_value(b0), end = (uint64_t)json_integer_value(b1);
        if (end > data_len) {
            fail(err, n, "%s: tensor '%s' ends at byte %llu, past the end of the data (%llu "
                 "bytes; truncated file?)", fname, key, (unsigned long long)end,
                 (unsigned long long)data_len);
            goto done;
        }
        t.nbytes = nel * dtypes[dt].size;
        if (end - begin != t.nbytes) {
            fail(err, n, "%s: tensor '%s' has %llu bytes of data, its shape needs %llu", fname,
                 key, (unsigned long long)(end - begin), (unsigned long long)t.nbytes);
            goto done;
        }
        t.data = data + begin;
        t.name = strdup(key);
        if (!t.name || add_tensor(s, &t) != 0) {
            free((void *)t.name);
            fail(err, n, "out of memory");
            goto done;
        }
        ranges[nr++] = (range){begin, end, s->tensors[s->n - 1].name};
    }
    qsort(ranges, nr, sizeof *ranges, cmp_range);
    for (size_t i = 1; i < nr; i++)
        if (ranges[i].begin < ranges[i - 1].end) {
            fail(err, n, "%s: tensors '%s' and '%s' overlap", fname, ranges[i - 1].name,
                 ranges[i].name);
            goto done;
        }
    rc = 0;
done:
    free(ranges);
    json_decref(root);
    return rc;
}

static int map_file(st_file *f, const char *path, char *err, size_t n) {
    f->path = strdup(path);
    if (!f->path) {
        fail(err, n, "out of memory");
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fail(err, n, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        fail(err, n, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    f->size = (uint64_t)st.st_size;
    f->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    if (f->size > 0) {
        void *p = mmap(NULL, (size_t)f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            fail(err, n, "%s: cannot map: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        f->map = p;
    }
    close(fd);
    return 0;
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int add_file(st_set *s, const char *path, char *err, size_t n) {
    st_file *nf = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *nf);
    if (!nf) {
        fail(err, n, "out of memory");
        return -1;
    }
    s->files = nf;
    memset(&s->files[s->n_files], 0, sizeof *nf);
    s->n_files++;
    if (map_file(&s->files[s->n_files - 1], path, err, n) != 0) return -1;
    return parse_file(s, s->n_files - 1, err, n);
}

/* Sharded checkpoint: the index's weight_map names each tensor's shard. */
static int open_index(st_set *s, const char *dir, const char *index, char *err, size_t n) {
    json_error_t je;
    json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        fail(err, n, "%s: not valid JSON: %s (line %d)", base_name(index), je.text, je.line);
        return -1;
    }
    int rc = -1;
    char **shards = NULL;
    size_t n_shards = 0;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        fail(err, n, "%s: no weight_map", base_name(index));
        goto done;
    }
    shards = calloc(json_object_size(wm), sizeof *shards);
    if (!shards) goto oom;
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const char *file = json_string_value(val);
        if (!file || !*file || strchr(file, '/') || strcmp(file, "..") == 0) {
            fail(err, n, "%s: tensor '%s' maps to an invalid file name", base_name(index), key);
            goto done;
        }
        bool seen = false;
        for (size_t i = 0; i < n_shards && !seen; i++) seen = strcmp(shards[i], file) == 0;
        if (!seen) shards[n_shards++] = (char *)file;
    }
    for (size_t i = 0; i < n_shards; i++) {
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, shards[i]) >= sizeof path) {
            fail(err, n, "path too long");
            goto done;
        }
        if (add_file(s, path, err, n) != 0) goto done;
    }
    qsort(s->tensors, s->n, sizeof *s->tensors, cmp_tensor);
    for (size_t i = 1; i < s->n; i++)
        if (strcmp(s->tensors[i].name, s->tensors[i - 1].name) == 0) {
            fail(err, n, "tensor '%s' is in two shards", s->tensors[i].name);
            goto done;
        }
    json_object_foreach(wm, key, val) {
        const st_tensor *t = st_find(s, key);
        if (!t || strcmp(base_name(s->files[t->file].path), json_string_value(val)) != 0) {
            fail(err, n, "tensor '%s' is not in %s as the index says", key, json_string_value(val));
            goto done;
        }
    }
    rc = 0;
    goto done;
oom:
    fail(err, n, "out of memory");
done:
    free(shards);
    json_decref(root);
    return rc;
}

st_set *st_open(const char *path, char *err, size_t n) {
    st_set *s = calloc(1, sizeof *s);
    if (!s) {
        fail(err, n, "out of memory");
        return NULL;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        fail(err, n, "%s: %s", path, strerror(errno));
        free(s);
        return NULL;
    }
    int rc;
    if (S_ISDIR(st.st_mode)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
        if (access(p, F_OK) == 0) {
            rc = open_index(s, path, p, err, n);
        } else {
            snprintf(p, sizeof p, "%s/model.safetensors", path);
            if (access(p, F_OK) != 0) {
                fail(err, n, "%s: no model.safetensors or model.safetensors.index.json", path);
                rc = -1;
            } else {
                rc = add_file(s, p, err, n);
            }
        }
    } else {
        rc = add_file(s, path, err, n);
    }
    if (rc == 0 && s->n_files == 1) {
        qsort(s->tensors, s->n, sizeof *s->tensors, cmp_tensor);
        /* names are unique within a file (JSON_REJECT_DUPLICATES) */
    }
    if (rc != 0) {
        /* one line whatever the file quotes (tensor and shard names are JSON strings and may
         * hold newlines: found by tests/fuzz/fuzz_safetensors.c) */
        for (char *c = err; n && *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
        st_close(s);
        return NULL;
    }
    return s;
}

void st_close(st_set *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) free((void *)s->tensors[i].name);
    free(s->tensors);
    for (int i = 0; i < s->n_files; i++) {
        if (s->files[i].map) munmap((void *)s->files[i].map, (size_t)s->files[i].size);
        free(s->files[i].path);
    }
    free(s->files);
    free(s);
}

size_t st_count(const st_set *s) { return s->n; }
const st_tensor *st_at(const st_set *s, size_t i) { return i < s->n ? &s->tensors[i] : NULL; }

const st_tensor *st_find(const st_set *s, const char *name) {
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(s->tensors[mid].name, name);
        if (c == 0) return &s->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

int st_n_files(const st_set *s) { return s->n_files; }
const char *st_file_path(const st_set *s, int i) { return s->files[i].path; }
void st_file_stat(const st_set *s, int i, uint64_t *size, int64_t *mtime_ns) {
    *size = s->files[i].size;
    *mtime_ns = s->files[i].mtime_ns;
}

/* ---- element conversion ------------------------------------------------------------------ */

float st_f8_e4m3_to_f32(uint8_t v) {
    const int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
    float r;
    if (exp == 0xf && man == 7) r = NAN; /* e4m3fn: the only NaN pattern; no infinities */
    else if (exp == 0) r = ldexpf((float)man, -9); /* subnormal: man/8 * 2^-6 */
    else r = ldexpf((float)(8 + man), exp - 10);   /* (1 + man/8) * 2^(exp-7) */
    return sign ? -r : r;
}

float st_f8_e5m2_to_f32(uint8_t v) { return quant_f16_to_f32((uint16_t)(v << 8)); }

bool st_is_float(enum st_dtype t) {
    return t == ST_F32 || t == ST_F16 || t == ST_BF16 || t == ST_F64 || t == ST_F8_E4M3 ||
           t == ST_F8_E5M2;
}

static float elem(const st_tensor *t, int64_t i) {
    const uint8_t *p = t->data + (size_t)i * dtypes[t->dtype].size;
    switch (t->dtype) {
    case ST_F32: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    case ST_F16: return quant_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
    case ST_BF16: return quant_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
    case ST_F64: {
        double d;
        memcpy(&d, p, 8);
        return (float)d;
    }
    case ST_F8_E4M3: return st_f8_e4m3_to_f32(p[0]);
    case ST_F8_E5M2: return st_f8_e5m2_to_f32(p[0]);
    default: return NAN;
    }
}

float st_get_f32(const st_tensor *t, int64_t i) { return elem(t, i); }

void st_to_f32(const st_tensor *t, int64_t first, int64_t n, float *out) {
    if (t->dtype == ST_F32) {
        memcpy(out, t->data + (size_t)first * 4, (size_t)n * 4);
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = elem(t, first + i);
}
