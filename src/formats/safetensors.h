/* safetensors reader: one file, or a Hugging Face checkpoint directory (sharded through
 * model.safetensors.index.json, or a single model.safetensors).
 *
 * File layout: an 8-byte little-endian header length N, N bytes of JSON, then the data. The JSON
 * object maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
 * relative to the end of the header); an optional "__metadata__" entry holds strings.
 *
 * st_open validates everything before returning: header length within the file, the JSON (no
 * duplicate keys), every dtype and shape, every byte range inside the data and matching the
 * shape's size, no two tensors overlapping, no name given twice across shards, every tensor the
 * index names present in the shard it names. The first problem is reported as one line. Files
 * are mapped read-only; tensor data pointers stay valid until st_close.
 */
#ifndef SLUICE_SAFETENSORS_H
#define SLUICE_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8

enum st_dtype {
    ST_BOOL,
    ST_U8,
    ST_I8,
    ST_F8_E4M3, /* "F8_E4M3": OCP e4m3fn (no infinities; 0x7f/0xff are NaN), max 448 */
    ST_F8_E5M2,
    ST_I16,
    ST_U16,
    ST_F16,
    ST_BF16,
    ST_I32,
    ST_U32,
    ST_F32,
    ST_I64,
    ST_U64,
    ST_F64,
    ST_DTYPE_COUNT,
};

typedef struct st_tensor {
    const char *name;
    enum st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS]; /* outermost first, as PyTorch */
    uint64_t nbytes;
    const uint8_t *data;        /* inside the mapping */
    int file;                   /* index of the shard that holds it */
} st_tensor;

typedef struct st_set st_set;

/* path: a .safetensors file, or a directory with model.safetensors.index.json (sharded) or
 * model.safetensors. NULL and one line in err on failure. */
st_set *st_open(const char *path, char *err, size_t err_len);
void st_close(st_set *s);

size_t st_count(const st_set *s);
const st_tensor *st_at(const st_set *s, size_t i); /* in name order */
const st_tensor *st_find(const st_set *s, const char *name);

/* The shard files: path, size and modification time (for resume fingerprints). */
int st_n_files(const st_set *s);
const char *st_file_path(const st_set *s, int i);
void st_file_stat(const st_set *s, int i, uint64_t *size, int64_t *mtime_ns);

const char *st_dtype_name(enum st_dtype t);
size_t st_dtype_size(enum st_dtype t);
int64_t st_nelements(const st_tensor *t);

/* Element i of a float tensor (F32, F16, BF16, F64, F8_E4M3, F8_E5M2) as float; false for
 * integer dtypes. */
bool st_is_float(enum st_dtype t);
float st_get_f32(const st_tensor *t, int64_t i);
/* Convert n elements starting at element `first` to float (a float dtype). */
void st_to_f32(const st_tensor *t, int64_t first, int64_t n, float *out);

float st_f8_e4m3_to_f32(uint8_t v);
float st_f8_e5m2_to_f32(uint8_t v);

#endif /* SLUICE_SAFETENSORS_H */
