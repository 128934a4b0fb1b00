/* Test support: writing safetensors files and copying files, for the tests that build Hugging
 * Face checkpoints for `sluice convert` (test_convert, test_convert_qwen4exp). */
#ifndef SLUICE_TEST_ST_WRITE_H
#define SLUICE_TEST_ST_WRITE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct st_tensor_out {
    char name[160];
    const char *dtype; /* "F32", "BF16", ... */
    int nd;
    int64_t shape[4];
    const void *data;
    size_t nbytes;
} st_tensor_out;

/* v[0..n) into one safetensors file at path: the JSON header (with transformers' "__metadata__"
 * entry when pt_metadata), padded with spaces to 8 bytes, then the data in order. */
static inline void st_write_file(const char *path, const st_tensor_out *v, int n, bool pt_metadata) {
    json_t *h = json_object();
    if (pt_metadata) json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const st_tensor_out *t = &v[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->nd; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(h, t->name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", t->dtype,
                                                  "shape", shape, "data_offsets", (json_int_t)off,
                                                  (json_int_t)(off + t->nbytes)));
        off += t->nbytes;
    }
    char *s = json_dumps(h, JSON_COMPACT);
    size_t len = strlen(s), padded = (len + 7) / 8 * 8;
    FILE *fp = fopen(path, "wb");
    uint64_t hn = padded;
    fwrite(&hn, 8, 1, fp);
    fwrite(s, 1, len, fp);
    for (size_t i = len; i < padded; i++) fputc(' ', fp);
    for (int i = 0; i < n; i++) fwrite(v[i].data, 1, v[i].nbytes, fp);
    fclose(fp);
    free(s);
    json_decref(h);
}

static inline void copy_file(const char *src, const char *dst) {
    FILE *a = fopen(src, "rb"), *b = fopen(dst, "wb");
    char buf[65536];
    size_t k;
    while (a && b && (k = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, k, b);
    if (a) fclose(a);
    if (b) fclose(b);
}

#endif
