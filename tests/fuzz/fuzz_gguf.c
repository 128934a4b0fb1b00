/* libFuzzer target for the GGUF reader: any byte string either parses into an object whose
 * every reachable field lies inside the input, or is refused with a one-line error. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    gguf_file *f = gguf_open_memory(data, size, err, sizeof err);
    if (!f) {
        if (!err[0] || strchr(err, '\n')) abort(); /* errors are one non-empty line */
        return 0;
    }
    volatile uint64_t sink = 0;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        sink += strlen(kv->key);
        if (kv->type == GGUF_VT_STRING && kv->v.s.len) sink += (uint8_t)kv->v.s.ptr[kv->v.s.len - 1];
        if (kv->type == GGUF_VT_ARRAY) {
            for (uint64_t j = 0; j < kv->arr_n && j < 64; j++) {
                double d;
                if (gguf_arr_get_f64(kv, j, &d)) sink += (uint64_t)(d == d);
                if (kv->arr_strs && kv->arr_strs[j].len)
                    sink += (uint8_t)kv->arr_strs[j].ptr[kv->arr_strs[j].len - 1];
            }
        }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (t->nbytes) sink += ((const uint8_t *)t->data)[t->nbytes - 1] + ((const uint8_t *)t->data)[0];
        if (gguf_find_tensor(f, t->name) == NULL) abort();
    }
    (void)sink;
    gguf_close(f);
    return 0;
}
