/* Routing traces: for every MoE call of every token, the layer, the token position and the
 * experts the router chose with their weights. Compact binary, little-endian, documented in
 * docs/trace-format.md:
 *
 *   header (48 bytes)  "SLTR", u32 version (1), u32 header_bytes (48), u32 n_layer,
 *                      u32 n_expert, u32 k, u32 flags (bit 0: weights present),
 *                      u32 record_bytes (8 + 4k), u64 expert_bytes, u64 reserved
 *   records            u16 layer, u16 seq, u32 pos, u16 expert[k], f16 weight[k]
 *
 * seq numbers the sequences (bench runs) within one file; records keep the engine's call order
 * (a prompt chunk: layer 0 for every token, then layer 1, ...), which is the order in which the
 * expert cache sees them. */
#ifndef SLUICE_TRACE_H
#define SLUICE_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

#define TRACE_MAGIC "SLTR"
#define TRACE_VERSION 1
#define TRACE_HEADER_BYTES 48
#define TRACE_MAX_K 64

typedef struct trace_writer trace_writer;

/* Create (truncate) path. expert_bytes: bytes of one routed expert (gate+up+down), 0 unknown. */
trace_writer *trace_writer_open(const char *path, int n_layer, int n_expert, int k,
                                uint64_t expert_bytes, char *err, size_t err_len);
/* Start a new sequence (bench: one per run). */
void trace_writer_set_seq(trace_writer *w, int seq);
/* A sluice_route_fn: pass the writer as ctx. */
void trace_writer_route(void *ctx, int layer, int pos, int k, const int32_t *experts,
                        const float *weights);
/* Flush and close; -1 (with err) when any write failed. Frees w. */
int trace_writer_close(trace_writer *w, char *err, size_t err_len);
uint64_t trace_writer_records(const trace_writer *w);

/* Open a trace for a model's routing: header facts from the model. */
trace_writer *trace_writer_for_model(const char *path, const sluice_model *m, char *err,
                                     size_t err_len);
/* Bytes of one routed expert of layer 0 (gate + up + down), 0 when unknown. */
uint64_t trace_model_expert_bytes(const sluice_model *m);

typedef struct trace {
    uint32_t n_layer, n_expert, k, flags;
    uint64_t expert_bytes;
    size_t n_records;
    uint16_t *layer, *seq;
    uint32_t *pos;
    uint16_t *experts; /* [n_records][k] */
    float *weights;    /* [n_records][k] */
} trace;

/* Read and validate a whole trace file; -1 with a one-line cause. */
int trace_load(const char *path, trace *t, char *err, size_t err_len);
void trace_free(trace *t);

#endif
