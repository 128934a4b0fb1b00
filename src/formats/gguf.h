/* GGUF reader (v2 and v3), over a read-only mapping of the file or over caller-owned bytes.
 *
 * gguf_open validates the whole container before returning: header, every metadata value,
 * every tensor info, alignment, data offsets, overlaps, duplicates. The first problem found is
 * reported as one line ("tensor 'x' (#3): data ends past the end of the file"). Nothing in the
 * returned object points outside the mapped bytes.
 *
 * Strings inside the file are not NUL-terminated: they are returned as (ptr, len) views.
 * Keys and tensor names are additionally copied as C strings for convenient lookup.
 */
#ifndef SLUICE_GGUF_H
#define SLUICE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

enum gguf_vtype {
    GGUF_VT_U8 = 0,
    GGUF_VT_I8 = 1,
    GGUF_VT_U16 = 2,
    GGUF_VT_I16 = 3,
    GGUF_VT_U32 = 4,
    GGUF_VT_I32 = 5,
    GGUF_VT_F32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_U64 = 10,
    GGUF_VT_I64 = 11,
    GGUF_VT_F64 = 12,
    GGUF_VT_COUNT = 13,
};

typedef struct gguf_str {
    const char *ptr; /* not NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    const char *key;          /* NUL-terminated copy */
    enum gguf_vtype type;
    /* scalar values (type != ARRAY); integers are widened, bool is 0/1 */
    union {
        uint64_t u;
        int64_t i;
        double f;
        gguf_str s;
    } v;
    /* arrays (type == ARRAY) */
    enum gguf_vtype arr_type;
    uint64_t arr_n;
    const uint8_t *arr_data;  /* first element in the file (numeric arrays: packed LE values) */
    gguf_str *arr_strs;       /* string arrays: arr_n views; NULL otherwise */
} gguf_kv;

typedef struct gguf_tensor {
    const char *name;       /* NUL-terminated copy */
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] innermost; unused dims are 1 */
    uint32_t type;          /* enum ggml_type */
    uint64_t offset;        /* relative to the data section */
    uint64_t nbytes;
    const void *data;       /* inside the mapping */
} gguf_tensor;

typedef struct gguf_file {
    const uint8_t *base;    /* file bytes */
    uint64_t size;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;   /* start of the tensor data section */
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
    /* private */
    bool mapped;
} gguf_file;

/* Open and validate. On failure returns NULL and writes one line into err. */
gguf_file *gguf_open(const char *path, char *err, size_t err_len);
/* Same over bytes the caller keeps alive until gguf_close. */
gguf_file *gguf_open_memory(const void *data, size_t size, char *err, size_t err_len);
void gguf_close(gguf_file *f);

const gguf_kv *gguf_find(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters: true when the key exists and converts losslessly (any integer type to an
 * integer within range; f32/f64 to float). */
bool gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
bool gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
bool gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
bool gguf_get_f32(const gguf_file *f, const char *key, float *out);
bool gguf_get_bool(const gguf_file *f, const char *key, bool *out);
/* String value as a view; false when absent or not a string. */
bool gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);
/* Numeric array element i converted to double / int64 (false when out of range or not numeric). */
bool gguf_arr_get_f64(const gguf_kv *kv, uint64_t i, double *out);
bool gguf_arr_get_i64(const gguf_kv *kv, uint64_t i, int64_t *out);

/* Metadata override (llama.cpp's --override-kv KEY=TYPE:VALUE): set key to a scalar value of
 * type I64, F64, BOOL or STRING (v.i, v.f, v.u or v.s; a string is copied), replacing the
 * file's value or adding the key, so that every later lookup sees it. An array value cannot be
 * overridden. 0, or -1 with err. */
int gguf_override(gguf_file *f, const char *key, const gguf_kv *value, char *err, size_t err_len);
/* Parse one override spec "KEY=TYPE:VALUE" (TYPE int, float, bool or str) into key (at most
 * key_len - 1 bytes; NUL-terminated) and a value for gguf_override (a string value points into
 * spec). A parser of its own, apart from the model loader, so that it can be fuzzed
 * (tests/fuzz/fuzz_cli_specs.c). 0, or -1 with one line in err. */
int gguf_parse_override(const char *spec, char *key, size_t key_len, gguf_kv *value, char *err,
                        size_t err_len);

/* Size in bytes of one value of a scalar type (0 for STRING/ARRAY). */
size_t gguf_vtype_size(enum gguf_vtype t);
const char *gguf_vtype_name(enum gguf_vtype t);

/* Number of elements of a tensor (product of ne). */
int64_t gguf_tensor_nelements(const gguf_tensor *t);

#endif /* SLUICE_GGUF_H */
