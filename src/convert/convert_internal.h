/* Internals of the converter, shared by its files:
 *   convert_hf.c     config.json, tokenizer.json / tokenizer_config.json (jansson)
 *   convert_plan.c   the output tensors (names, shapes, types, where each row comes from) and
 *                    the GGUF metadata, per architecture; the planning helpers (pl_*)
 *   convert_qwen4exp.c  qwen4exp's tensors, metadata and n-gram hashing constants
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

enum conv_arch { ARCH_QWEN3MOE, ARCH_QWEN35MOE, ARCH_QWEN4EXP };

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
    /* qwen4exp (also uses the qwen35moe fields above) */
    int64_t hc, hc_rank;                      /* hyper-connection streams and their rank */
    int64_t idx_heads, idx_dim, idx_budget, idx_ratio; /* QSA indexer */
    int64_t ple_layer;                        /* 0-based n-gram layer, -1: none */
    int64_t ple_embed, ple_kernel, ngram_size, heads_per_ngram, ngram_base, ngram_div, seed;
    int64_t ngram_parts;                      /* split_ngram_parts (0: not given) */
    int image_id;                             /* -1 when absent */
    int bos_id, eos_id, pad_id; /* from config.json, -1 when absent (eos: the first of a list) */
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
    bool fp8_global;        /* scale: one weight_scale for the whole tensor */
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
    /* other layouts of several sources (no row_off, permutations or MLX copying):
     * rowcat: the sources' rows one after the other; rowcat[k] is the first output row of
     *         src[k] (n_src + 1 entries); one 2-D output (n-gram table shards)
     * colcat: output row r = src[0] row r, then src[1] row r, ... (eh_proj from two halves) */
    int64_t *rowcat;
    bool colcat;
} out_tensor;

#define CONV_MAX_NGRAM 4      /* n-gram orders 2..ngram_size (sluice's qwen4exp limits) */
#define CONV_MAX_PLE_HEADS 64

typedef struct conv_plan {
    hf_config cfg;
    hf_vocab vocab;
    st_set *st;
    out_tensor *t;
    int n_t, cap_t;
    bool mlx_norms_shifted; /* mlx-lm checkpoints store zero-centered norms as 1 + w already */
    /* qwen4exp: MTP blocks converted (nextn_predict_layers), n-gram hashing constants */
    int nextn;
    int ple_heads;
    uint64_t ple_mult[CONV_MAX_NGRAM], ple_size[CONV_MAX_PLE_HEADS], ple_off[CONV_MAX_PLE_HEADS];
} conv_plan;

/* Planning state and helpers (convert_plan.c), used by the architectures' planners. */
typedef struct pctx {
    conv_plan *p;
    note_fn note;
    void *nctx;
    char *err;
    size_t n;
    int type;
    bool bad;
} pctx;

bool pl_failf(pctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The checkpoint tensor of a canonical name (model.X also as model.language_model.X, and any
 * name under language_model.). */
const st_tensor *pl_lookup(const pctx *c, const char *name);
/* Find and check one source: base (+ ".weight" when weight), logical shape [outer (0: none),
 * rows (0: a vector), cols]; MLX codes + scales/biases, FP8 + scales. */
bool pl_get_src(pctx *c, const char *base, bool weight, int64_t outer, int64_t rows,
                int64_t cols, bool required, src_ref *s);
out_tensor *pl_add_out(pctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint32_t pl_weight_type(const pctx *c, const src_ref *s, int64_t ne0);
/* A vector (F32) and a matrix [rows, cols] -> ne [cols, rows] (f32: always F32). */
void pl_vec(pctx *c, const char *out, const char *src, bool weight, int64_t n, enum elem_op op);
out_tensor *pl_mat(pctx *c, const char *out, const char *src, int64_t rows, int64_t cols,
                   bool f32);
/* Layer parts read under the source prefix `pre` ("model.layers.3", "mtp.layers.0") and written
 * as block L: routed experts, Gated DeltaNet (value heads tiled), attention (gated: q_proj holds
 * query and gate), the shared expert (false on failure). */
void pl_experts(pctx *c, const char *pre, int L);
void pl_linear_attention(pctx *c, const char *pre, int L);
void pl_attention(pctx *c, const char *pre, int L, bool gated, enum elem_op norm_op);
bool pl_shared_expert(pctx *c, const char *pre, int L);

/* qwen4exp (convert_qwen4exp.c): the tensors (false on failure, with c->err), the metadata
 * beyond the hybrid keys (0 or -1 with err), and the n-gram hashing constants of transformers'
 * Qwen4ExpTextNGramEmbedding for the ple_index-th n-gram layer: multipliers [ngram_size], head
 * moduli and offsets [(ngram_size - 1) * heads_per_ngram], and the padded row count. */
bool q4x_plan_tensors(pctx *c);
int q4x_metadata(const conv_plan *p, gguf_writer *w, char *err, size_t n);
void q4x_hash_constants(const hf_config *h, int ple_index, uint64_t *mult, uint64_t *size,
                        uint64_t *off, int64_t *rows_padded);

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
