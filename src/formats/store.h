/* Where each routed expert's weights live in a model file, and the expert-major store.
 *
 * An expert of layer L is three matrices (gate, up, down). In a plain GGUF they are slices of
 * the stacked tensors blk.L.ffn_{gate,up,down}_exps.weight (three reads per expert). In an
 * expert-major store written by `sluice repack` they are one record per (layer, expert):
 * gate|up|down back to back, each record 4 KiB aligned, so one direct read fetches an expert.
 *
 * Store file (a valid GGUF v3, general.alignment = 4096; format documented in docs/store.md):
 *   every tensor of the input except the routed experts, unchanged;
 *   per MoE layer a tensor blk.L.ffn_experts.packed (I8, ne = [record_stride, n_expert]);
 *   metadata sluice.store.*: version, per-layer descriptors (types, shapes, offsets inside the
 *   record, record bytes and stride), a CRC-32 per record, the SHA-256 of the manifest (checked
 *   at every load) and of the payload (checked by `sluice verify`). */
#ifndef SLUICE_STORE_H
#define SLUICE_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/gguf.h"

#define STORE_ALIGN 4096
#define STORE_VERSION 1

enum { EXPERT_GATE = 0, EXPERT_UP = 1, EXPERT_DOWN = 2, EXPERT_PARTS = 3 };

typedef struct expert_part {
    uint32_t type;       /* ggml type */
    int64_t ne0, ne1;    /* one expert's matrix: ne1 rows of ne0 values */
    uint64_t offset;     /* absolute file offset of expert 0's matrix */
    uint64_t stride;     /* bytes from one expert's matrix to the next */
    uint64_t bytes;      /* bytes of one expert's matrix */
} expert_part;

typedef struct expert_layer_layout {
    bool present;        /* the layer has routed experts */
    expert_part part[EXPERT_PARTS];
    /* expert-major store only: the record of expert e starts at record_offset + e*record_stride
     * and holds the three parts at part[i].offset - record_offset */
    uint64_t record_offset, record_stride, record_bytes;
} expert_layer_layout;

typedef struct expert_layout {
    int n_layer;                 /* model layers (entries in layers) */
    int n_expert;
    bool packed;                 /* an expert-major store */
    expert_layer_layout *layers; /* [n_layer] */
    uint32_t *record_crc;        /* packed: CRC-32 of each record's bytes, [layer][expert] */
    uint64_t expert_bytes_max;   /* largest expert (sum of its three parts) */
    uint64_t expert_bytes_total; /* all routed experts */
} expert_layout;

/* Find the routed experts of a model with n_layer layers and n_expert experts per layer.
 * Detects a store (validating its manifest hash) or reads the plain stacked tensors. Layers
 * without expert tensors are marked absent. 0, or -1 with one line in err. */
int expert_layout_load(const gguf_file *f, int n_layer, int n_expert, expert_layout *out,
                       char *err, size_t err_len);
void expert_layout_free(expert_layout *l);

/* Bytes of expert e's part i in the file and where they start. */
static inline uint64_t expert_part_offset(const expert_part *p, int e) {
    return p->offset + (uint64_t)e * p->stride;
}

/* Progress callback: done/total bytes. */
typedef void (*store_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* Write the expert-major store of in_path to out_path (via a temporary file renamed when
 * complete). Deterministic: the same input gives the same bytes. 0, or -1 with err. */
int store_repack(const char *in_path, const char *out_path, store_progress_fn progress,
                 void *ctx, char *err, size_t err_len);

typedef struct store_verify_report {
    bool packed;
    uint64_t records, bad_records;
    int first_bad_layer, first_bad_expert;
    char manifest_sha256[65], payload_sha256[65];
} store_verify_report;

/* Check a file: GGUF structure; for a store also the manifest hash, every record's CRC and the
 * payload hash. 0 when everything holds, -1 with the first problem in err. */
int store_verify(const char *path, store_verify_report *rep, store_progress_fn progress,
                 void *ctx, char *err, size_t err_len);

#endif /* SLUICE_STORE_H */
