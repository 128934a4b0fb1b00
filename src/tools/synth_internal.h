/* Internals shared by the synth files: the tensor plan and the block generator. */
#ifndef SLUICE_SYNTH_INTERNAL_H
#define SLUICE_SYNTH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/gguf_write.h"
#include "tools/synth.h"

/* Residual-stream channels with a fixed meaning (docs/synth.md, "routing skew"): channel 0 is a
 * constant "bias" channel, channels 1..SYNTH_TOPICS carry the token's topic. Every projection
 * that writes the residual stream leaves them untouched (its rows for them are zero), so
 * routers can read them at every layer. */
#define SYNTH_TOPICS 16
#define SYNTH_PROTECTED (1 + SYNTH_TOPICS)

typedef enum synth_role {
    ROLE_WEIGHT,   /* a projection reading the residual stream: std gain/sqrt(ne0) */
    ROLE_RESID,    /* a projection writing the residual stream: protected rows are zero */
    ROLE_EMBD,     /* token embedding: bias and topic channels set */
    ROLE_OUTPUT,   /* output head */
    ROLE_NORM,     /* RMSNorm weight near 1 (exactly 1 on protected channels) */
    ROLE_SSM_A,    /* -exp(A_log): negative decay rates */
    ROLE_SSM_DT,   /* dt bias */
    ROLE_CONV,     /* depthwise conv taps */
    ROLE_ROUTER,   /* ffn_gate_inp: noise plus the skew on the protected columns */
} synth_role;

typedef struct synth_tensor {
    char name[96];
    int n_dims;
    int64_t ne[4];
    uint32_t type;
    synth_role role;
    int layer;        /* -1 outside blocks */
    float std;        /* target standard deviation of the values */
    uint64_t nbytes;
    uint64_t n_blocks;      /* blocks (elements for float types) */
    uint64_t blocks_per_piece;
} synth_tensor;

/* What the generator needs besides the tensor itself. */
typedef struct synth_gen_ctx {
    const synth_preset *p;
    uint64_t seed;
    float skew;
    const int32_t *rank;   /* [n_layer][n_expert]: popularity rank of each expert (0 = most) */
    const int32_t *home;   /* [n_layer][n_expert]: the topic each expert specializes in */
    float emb_bias, emb_topic; /* values of the bias and topic channels in the embedding */
    float x_bias, x_topic;     /* their expected size after RMSNorm (what routers see) */
} synth_gen_ctx;

/* Fill piece `piece` of tensor `t` (index ti in the file) into out (the piece's bytes). */
void synth_gen_piece(const synth_gen_ctx *g, const synth_tensor *t, int ti, uint64_t piece,
                     uint8_t *out);
/* Prepare per-type scale calibration (once, before generating; not thread-safe). */
int synth_gen_calibrate(uint32_t type);
bool synth_gen_supports(uint32_t type);

/* 64-bit mixing (splitmix64 finalizer): seeds and hashes. */
static inline uint64_t synth_mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The tokenizer keys (synth_vocab.c). used receives the vocabulary file's path. */
int synth_vocab_write(gguf_writer *w, const synth_preset *p, const char *path, char *used,
                      size_t used_cap, char *err, size_t err_len);

#endif
