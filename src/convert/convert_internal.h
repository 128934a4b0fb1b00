/* Internals of the converter, shared by its three files:
 *   convert_hf.c     config.json, tokenizer.json / tokenizer_config.json (jansson)
 *   convert_plan.c   the output tensors (names, shapes, types, where each row comes from) and
 *                    the GGUF metadata, per architecture
 *   convert.c        reading and transforming rows, quantizing, writing, journal and resume
 */
#ifndef SLUICE_CONVERT_INTERNAL_H
#define SLUICE_CONVERT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convert/convert.h"
#include "formats/gguf_write.h"
#include "formats/safetensors.h"

typedef void (*note_fn)(void *ctx, const char *line);
void conv_note(note_fn fn, void *ctx, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

enum conv_arch { ARCH_QWEN3MOE, ARCH_QWEN35MOE };

typedef struct hf_config {
    enum conv_arch arch;
    const char *arch_name; /* GGUF general.architecture */
    int64_t vocab, hidden, n_layer, n_head, n_head_kv, head_dim, ctx, ff;
    int64_t n_expert, n_expert_used, ff_exp, ff_shexp;
    double eps, rope_theta, partial_rotary;
    int mrope[4];
    bool has_mrope, tie, norm_topk;
    /* qwen35moe */
    bool *recurrent;       /* [n_layer] */
    int full_attn_interval; /* 0 when the pattern has no single interval */
    int64_t lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, conv_kernel;
    int bos_id, eos_id, pad_id; /* from config.json, -1 when absent */
    /* quantization_config / quantization */
    bool fp8;
    int64_t fp8_block[2];
    bool mlx;
    int mlx_bits, mlx_group;
} hf_config;

typedef struct hf_vocab {
    char **tokens;
    int32_t *types;
    int n;
    char **merges;
    int n_merges;
    const char *pre;       /* "qwen2" or "qwen35" */
    int bos, eos, pad, unk; /* -1 when absent */
    int add_bos, add_eos;  /* -1 unset */
    char *chat_template;
} hf_vocab;

int hf_load_config(const char *dir, hf_config *c, char *err, size_t n);
void hf_config_free(hf_config *c);
int hf_load_vocab(const char *dir, const hf_config *c, hf_vocab *v, note_fn note, void *note_ctx,
                  char *err, size_t n);
void hf_vocab_free(hf_vocab *v);

/* ---- plan ---------------------------------------------------------------------------------- */

enum src_kind { SRC_FLOAT, SRC_FP8, SRC_MLX };

/* One checkpoint tensor, viewed as [outer][rows][cols] values, possibly quantized. */
typedef struct src_ref {
    enum src_kind kind;
    const st_tensor *w;     /* values (float dtypes), FP8 codes, or MLX uint32 codes */
    const st_tensor *scale; /* FP8 weight_scale_inv, or MLX scales */
    const st_tensor *bias;  /* MLX biases */
    int64_t outer, rows, cols;
    int64_t fp8_br, fp8_bc; /* FP8 block of rows x cols sharing a scale */
    int mlx_bits, mlx_group;
    bool mlx_bf16; /* MLX scales/biases are bf16 (else f16) */
} src_ref;

enum elem_op { OP_NONE, OP_PLUS1, OP_NEG_EXP };

/* One output tensor. GGUF shape ne = [cols, rows, experts]; output row i (of rows*experts) is
 * expert e = i / rows, row r = i % rows, taken from
 *     n_src > 1:  src[e], row rowperm(r)          (one checkpoint tensor per expert)
 *     n_src == 1: src[0], outer e, row row_off + rowperm(r)
 * with its columns gathered through colperm and op applied to every value. */
typedef struct out_tensor {
    char name[96];
    uint32_t n_dims;
    int64_t ne[4];
    uint32_t type;
    enum elem_op op;
    int n_src;
    src_ref *src;
    int64_t row_off;
    int64_t *rowperm; /* NULL: identity */
    int64_t *colperm; /* NULL: identity */
} out_tensor;

typedef struct conv_plan {
    hf_config cfg;
    hf_vocab vocab;
    st_set *st;
    out_tensor *t;
    int n_t, cap_t;
    bool mlx_norms_shifted; /* mlx-lm checkpoints store zero-centered norms as 1 + w already */
} conv_plan;

/* Build the tensor list (types chosen for opt->type) into p->t; 0 or -1 with err. */
int plan_tensors(conv_plan *p, int type, note_fn note, void *note_ctx, char *err, size_t n);
/* Metadata (architecture, hyper-parameters, tokenizer) into w. */
int plan_metadata(const conv_plan *p, gguf_writer *w, const char *name, int type, char *err,
                  size_t n);
void plan_free(conv_plan *p);

/* The output type of a weight matrix with rows of ne0 values when `type` is asked for: type
 * itself when ne0 is a multiple of its block, else the nearest type that fits (K/I-quants ->
 * Q8_0 -> F16; MLX and 32-blocks -> F16). */
uint32_t plan_fit_type(uint32_t type, int64_t ne0);

#endif /* SLUICE_CONVERT_INTERNAL_H */
