/* GGUF writer (version 3): collect metadata and tensor infos, then write the header and stream
 * tensor data in order. Used by synth, repack, convert and by tests that build files. */
#ifndef SLUICE_GGUF_WRITE_H
#define SLUICE_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "formats/gguf.h"

typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);

/* Metadata, in insertion order. Each returns 0, or -1 on allocation failure. */
int gguf_w_u8(gguf_writer *w, const char *key, uint8_t v);
int gguf_w_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_w_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_w_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_w_f32(gguf_writer *w, const char *key, float v);
int gguf_w_bool(gguf_writer *w, const char *key, bool v);
int gguf_w_str(gguf_writer *w, const char *key, const char *v);
/* Numeric array of n elements of scalar type t, packed little-endian in data. */
int gguf_w_arr(gguf_writer *w, const char *key, enum gguf_vtype t, const void *data, uint64_t n);
int gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Copy a key/value from an existing file unchanged. */
int gguf_w_copy_kv(gguf_writer *w, const gguf_kv *kv);

/* Tensor info; offsets are assigned in insertion order with the file's alignment.
 * data may be NULL when the caller streams it with gguf_writer_write_data. Returns the index. */
int gguf_w_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                  const int64_t *ne, const void *data);
uint64_t gguf_w_tensor_nbytes(const gguf_writer *w, int index);
void gguf_w_set_alignment(gguf_writer *w, uint32_t alignment);

/* Write header + tensor infos + padding. Then tensor data, in insertion order: either all at
 * once (gguf_writer_write_all_data, for tensors given with data) or streamed tensor by tensor:
 * gguf_writer_begin_tensor(i), any number of gguf_writer_write_data calls totalling the tensor's
 * byte size, gguf_writer_end_tensor(i) (pads). Return 0 or -1 (errno set). */
int gguf_writer_write_header(gguf_writer *w, FILE *fp);
int gguf_writer_begin_tensor(gguf_writer *w, FILE *fp, int index);
int gguf_writer_write_data(gguf_writer *w, FILE *fp, const void *data, size_t n);
int gguf_writer_end_tensor(gguf_writer *w, FILE *fp, int index);
int gguf_writer_write_all_data(gguf_writer *w, FILE *fp);
/* Whole file to path (all tensors must have data). */
int gguf_writer_save(gguf_writer *w, const char *path);
/* Whole file into a malloc'd buffer (tests). */
int gguf_writer_to_memory(gguf_writer *w, uint8_t **out, size_t *out_len);

#endif /* SLUICE_GGUF_WRITE_H */
