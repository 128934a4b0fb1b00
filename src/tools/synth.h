/* Synthetic models: standard GGUF files with the exact tensor names, shapes, metadata and
 * per-tensor type mixes of real Qwen MoE checkpoints, filled with valid random blocks.
 *
 * Real weights cannot be downloaded where sluice is developed, yet performance work needs files
 * of the real size and layout. A synthetic file is indistinguishable from a real one to a loader
 * (llama.cpp loads it); only the numbers are random. Random quantized blocks are written
 * directly (random bits, then sane f16 scales), so 20 GB take minutes, not hours.
 *
 * The same preset, type, seed and skew always give the same bytes, whatever the thread count.
 * docs/synth.md describes presets, mixes, the routing-skew model and the hit-rate curves.
 */
#ifndef SLUICE_SYNTH_H
#define SLUICE_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum synth_arch { SYNTH_QWEN3MOE, SYNTH_QWEN35MOE, SYNTH_QWEN3NEXT, SYNTH_QWEN4EXP } synth_arch;

typedef struct synth_preset {
    const char *name;      /* "qwen35moe-35b-a3b" */
    const char *label;     /* general.name */
    const char *size_label;
    synth_arch arch;
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_rot;
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    int n_ff;              /* <arch>.feed_forward_length; 0: key omitted */
    /* Gated DeltaNet (qwen35moe, qwen3next) */
    int ssm_conv, ssm_state, ssm_group, ssm_v_heads, full_attn_interval;
    int rope_sections[4];  /* qwen35moe M-RoPE sections */
    int n_ctx;
    float rope_base, rms_eps;
    int n_vocab;           /* embedding rows (the tokenizer is padded up to it) */
    int tiny_vocab;        /* nonzero: a truncated real vocabulary of this many tokens */
    const char *vocab;     /* "qwen2" or "qwen35": which vocabulary file the tokenizer comes from */
    /* qwen4exp: hc residual streams of low rank hc_rank; the QSA indexer (idx_head heads of
     * idx_dim, top_k cells, blocks of idx_ratio); the n-gram module on layer ple_layer
     * (ple_heads heads per order 2 and 3, rows of ple_dim, moduli the consecutive primes from
     * ple_base, end-of-text ple_eos) */
    int hc, hc_rank, idx_head, idx_dim, idx_top_k, idx_ratio;
    int ple_layer, ple_heads, ple_dim, ple_eos;
    int64_t ple_base;
    /* qwen4exp: MTP blocks after the trunk (nextn_predict_layers; synth_options.mtp sets 1) */
    int nextn;
} synth_preset;

/* The preset table; NULL-terminated lookups. */
const synth_preset *synth_preset_find(const char *name);
const synth_preset *synth_preset_at(int i); /* NULL past the end */
const char *synth_arch_name(synth_arch a);

/* Type mixes ("Q4_K_M", "Q8_0", "Q2_K", "Q2_K_XL", ...). */
typedef enum synth_mix {
    MIX_F32, MIX_F16, MIX_BF16, MIX_Q8_0, MIX_Q6_K, MIX_Q4_K_M, MIX_Q2_K, MIX_IQ4_XS, MIX_Q2_K_XL,
    MIX_Q2_0, /* llama-quantize's Q2_0 preset (ggml type 42 on most matrices) */
    MIX_COUNT
} synth_mix;
int synth_mix_from_name(const char *name); /* -1 if unknown (case-insensitive) */
const char *synth_mix_name(synth_mix m);
uint32_t synth_mix_file_type(synth_mix m); /* general.file_type (llama_ftype) */

/* Per-tensor type choice, following llama.cpp's llama_tensor_get_type rules for the mix.
 * name: full tensor name; n_dims/ne0: shape facts; layer: -1 outside blocks; i_attn_v: how many
 * attn_v-like tensors came before in file order (llama.cpp counts them the same way). */
uint32_t synth_tensor_type(synth_mix mix, const synth_preset *p, const char *name, int n_dims,
                           int64_t ne0, int layer, int i_attn_v, int n_attn_v);

typedef struct synth_options {
    const char *preset;
    const char *type;       /* mix name */
    const char *out;        /* output path */
    const char *vocab;      /* vocabulary GGUF (NULL: search the usual places) */
    uint64_t seed;
    float routing_skew;     /* Zipf exponent of expert popularity; 0: unbiased routers */
    int n_threads;          /* 0: all cores */
    bool dry_run;           /* plan only: print the tensor mix and size, write nothing */
    bool header_only;       /* write the header and a sparse (all-zero) data section */
    bool list_tensors;      /* print every tensor of the plan */
    bool mtp;               /* qwen4exp: add the MTP block (blk.N.nextn.*, nextn_predict_layers 1) */
    int n_layer;            /* > 0: this many layers of the preset's shapes (a shallower file) */
    int progress;           /* 0: none, 1: bar (tty), 2: percentage lines */
} synth_options;

/* Write (or plan) a synthetic model. Returns 0, or -1 with a one-line cause in err.
 * Reports to `log` (stderr normally): plan summary, progress, speed. */
int synth_run(const synth_options *o, FILE *log, char *err, size_t err_len);

/* Where the vocabulary files are looked for when --vocab is not given. */
const char *synth_vocab_search_path(void);

/* Metadata keys synth adds (documented in docs/synth.md); bench reads them. */
#define SYNTH_KEY_PRESET "sluice.synth.preset"
#define SYNTH_KEY_SEED "sluice.synth.seed"
#define SYNTH_KEY_SKEW "sluice.synth.routing_skew"
#define SYNTH_KEY_TOPICS "sluice.synth.topics"

#endif /* SLUICE_SYNTH_H */
