/* Synthetic-model presets (real shapes, sources in docs/synth.md) and the per-tensor type rules
 * of llama.cpp's quantization mixes, restated from its llama_tensor_get_type. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "formats/quant.h"
#include "tools/synth.h"

/* clang-format off */
static const synth_preset presets[] = {
    /* Qwen3.5/3.6-35B-A3B: 40 layers, 3 of 4 Gated DeltaNet (spec QWEN-MOE-GGUF.md 1.2, 2.3) */
    {.name = "qwen35moe-35b-a3b", .label = "Qwen3.6-35B-A3B (synthetic)", .size_label = "35B-A3B",
     .arch = SYNTH_QWEN35MOE, .n_layer = 40, .n_embd = 2048, .n_head = 16, .n_head_kv = 2,
     .head_dim = 256, .n_rot = 64, .n_expert = 256, .n_expert_used = 8, .n_ff_exp = 512,
     .n_ff_shexp = 512, .ssm_conv = 4, .ssm_state = 128, .ssm_group = 16, .ssm_v_heads = 32,
     .full_attn_interval = 4, .rope_sections = {11, 11, 10, 0}, .n_ctx = 262144,
     .rope_base = 1e7f, .rms_eps = 1e-6f, .n_vocab = 248320, .vocab = "qwen35"},
    /* Qwen3-30B-A3B */
    {.name = "qwen3moe-30b-a3b", .label = "Qwen3-30B-A3B (synthetic)", .size_label = "30B-A3B",
     .arch = SYNTH_QWEN3MOE, .n_layer = 48, .n_embd = 2048, .n_head = 32, .n_head_kv = 4,
     .head_dim = 128, .n_rot = 128, .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768,
     .n_ff = 6144, .n_ctx = 40960, .rope_base = 1e6f, .rms_eps = 1e-6f, .n_vocab = 151936,
     .vocab = "qwen2"},
    /* Qwen3-Next-80B-A3B */
    {.name = "qwen3next-80b-a3b", .label = "Qwen3-Next-80B-A3B (synthetic)", .size_label = "80B-A3B",
     .arch = SYNTH_QWEN3NEXT, .n_layer = 48, .n_embd = 2048, .n_head = 16, .n_head_kv = 2,
     .head_dim = 256, .n_rot = 64, .n_expert = 512, .n_expert_used = 10, .n_ff_exp = 512,
     .n_ff_shexp = 512, .n_ff = 5120, .ssm_conv = 4, .ssm_state = 128, .ssm_group = 16,
     .ssm_v_heads = 32, .full_attn_interval = 4, .n_ctx = 262144, .rope_base = 1e7f,
     .rms_eps = 1e-6f, .n_vocab = 151936, .vocab = "qwen2"},
    /* Qwen3.5-397B-A17B */
    {.name = "qwen35moe-397b-a17b", .label = "Qwen3.5-397B-A17B (synthetic)", .size_label = "397B-A17B",
     .arch = SYNTH_QWEN35MOE, .n_layer = 60, .n_embd = 4096, .n_head = 32, .n_head_kv = 2,
     .head_dim = 256, .n_rot = 64, .n_expert = 512, .n_expert_used = 10, .n_ff_exp = 1024,
     .n_ff_shexp = 1024, .ssm_conv = 4, .ssm_state = 128, .ssm_group = 16, .ssm_v_heads = 64,
     .full_attn_interval = 4, .rope_sections = {11, 11, 10, 0}, .n_ctx = 262144,
     .rope_base = 1e7f, .rms_eps = 1e-6f, .n_vocab = 248320, .vocab = "qwen35"},
    /* Tests: the shapes of the shared fixtures (tiny), and a few-hundred-MB model for benches. */
    {.name = "qwen3moe-tiny", .label = "qwen3moe-tiny (synthetic)", .size_label = "tiny",
     .arch = SYNTH_QWEN3MOE, .n_layer = 2, .n_embd = 256, .n_head = 4, .n_head_kv = 2,
     .head_dim = 64, .n_rot = 64, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256,
     .n_ff = 256, .n_ctx = 4096, .rope_base = 1e6f, .rms_eps = 1e-6f, .n_vocab = 2048,
     .tiny_vocab = 2048, .vocab = "qwen2"},
    {.name = "qwen35moe-tiny", .label = "qwen35moe-tiny (synthetic)", .size_label = "tiny",
     .arch = SYNTH_QWEN35MOE, .n_layer = 2, .n_embd = 256, .n_head = 4, .n_head_kv = 2,
     .head_dim = 64, .n_rot = 16, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256,
     .n_ff_shexp = 256, .n_ff = 256, .ssm_conv = 4, .ssm_state = 64, .ssm_group = 2,
     .ssm_v_heads = 4, .full_attn_interval = 2, .rope_sections = {4, 2, 2, 0}, .n_ctx = 4096,
     .rope_base = 1e7f, .rms_eps = 1e-6f, .n_vocab = 2048, .tiny_vocab = 2048, .vocab = "qwen35"},
    {.name = "qwen3next-tiny", .label = "qwen3next-tiny (synthetic)", .size_label = "tiny",
     .arch = SYNTH_QWEN3NEXT, .n_layer = 2, .n_embd = 256, .n_head = 4, .n_head_kv = 2,
     .head_dim = 64, .n_rot = 16, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256,
     .n_ff_shexp = 256, .n_ff = 256, .ssm_conv = 4, .ssm_state = 64, .ssm_group = 2,
     .ssm_v_heads = 4, .full_attn_interval = 2, .n_ctx = 4096, .rope_base = 1e7f,
     .rms_eps = 1e-6f, .n_vocab = 2048, .tiny_vocab = 2048, .vocab = "qwen2"},
    {.name = "qwen3moe-mini", .label = "qwen3moe-mini (synthetic)", .size_label = "mini",
     .arch = SYNTH_QWEN3MOE, .n_layer = 8, .n_embd = 1024, .n_head = 16, .n_head_kv = 4,
     .head_dim = 64, .n_rot = 64, .n_expert = 64, .n_expert_used = 4, .n_ff_exp = 256,
     .n_ff = 2048, .n_ctx = 32768, .rope_base = 1e6f, .rms_eps = 1e-6f, .n_vocab = 151936,
     .vocab = "qwen2"},
    {.name = "qwen35moe-mini", .label = "qwen35moe-mini (synthetic)", .size_label = "mini",
     .arch = SYNTH_QWEN35MOE, .n_layer = 8, .n_embd = 1024, .n_head = 8, .n_head_kv = 2,
     .head_dim = 128, .n_rot = 32, .n_expert = 64, .n_expert_used = 4, .n_ff_exp = 256,
     .n_ff_shexp = 256, .ssm_conv = 4, .ssm_state = 128, .ssm_group = 8, .ssm_v_heads = 16,
     .full_attn_interval = 4, .rope_sections = {11, 11, 10, 0}, .n_ctx = 262144,
     .rope_base = 1e7f, .rms_eps = 1e-6f, .n_vocab = 248320, .vocab = "qwen35"},
    /* Qwen3.8-Flash-Next (spec QWEN4EXP.md 1.1): 48 layers, 3 of 4 Gated DeltaNet, 4-stream
     * hyper-connections, QSA attention, 512 experts of 640, the 320 M-row n-gram table */
    {.name = "qwen4exp-flash-next", .label = "Qwen3.8-Flash-Next (synthetic)", .size_label = "125B-A6B",
     .arch = SYNTH_QWEN4EXP, .n_layer = 48, .n_embd = 2560, .n_head = 24, .n_head_kv = 2,
     .head_dim = 256, .n_rot = 64, .n_expert = 512, .n_expert_used = 10, .n_ff_exp = 640,
     .n_ff_shexp = 640, .ssm_conv = 4, .ssm_state = 128, .ssm_group = 16, .ssm_v_heads = 48,
     .full_attn_interval = 4, .rope_sections = {11, 11, 10, 0}, .n_ctx = 262144,
     .rope_base = 1e7f, .rms_eps = 1e-6f, .n_vocab = 248320, .vocab = "qwen35", .hc = 4,
     .hc_rank = 320, .idx_head = 4, .idx_dim = 128, .idx_top_k = 2048, .idx_ratio = 4,
     .ple_layer = 1, .ple_heads = 8, .ple_dim = 160, .ple_eos = 248044, .ple_base = 20000000},
    /* the same layers, 8 deep, with a tenth of the table's rows: every per-layer shape real,
     * small enough for these disks (10 GB at Q2_0) and to stream in an 8 GiB cgroup */
    {.name = "qwen4exp-flash-next-8l", .label = "Qwen3.8-Flash-Next 8-layer (synthetic)", .size_label = "125B-A6B-8L",
     .arch = SYNTH_QWEN4EXP, .n_layer = 8, .n_embd = 2560, .n_head = 24, .n_head_kv = 2,
     .head_dim = 256, .n_rot = 64, .n_expert = 512, .n_expert_used = 10, .n_ff_exp = 640,
     .n_ff_shexp = 640, .ssm_conv = 4, .ssm_state = 128, .ssm_group = 16, .ssm_v_heads = 48,
     .full_attn_interval = 4, .rope_sections = {11, 11, 10, 0}, .n_ctx = 262144,
     .rope_base = 1e7f, .rms_eps = 1e-6f, .n_vocab = 248320, .vocab = "qwen35", .hc = 4,
     .hc_rank = 320, .idx_head = 4, .idx_dim = 128, .idx_top_k = 2048, .idx_ratio = 4,
     .ple_layer = 1, .ple_heads = 8, .ple_dim = 160, .ple_eos = 248044, .ple_base = 2000000},
    /* the shapes of the qwen4exp-tiny fixture */
    {.name = "qwen4exp-tiny", .label = "qwen4exp-tiny (synthetic)", .size_label = "tiny",
     .arch = SYNTH_QWEN4EXP, .n_layer = 3, .n_embd = 256, .n_head = 4, .n_head_kv = 2,
     .head_dim = 64, .n_rot = 16, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 128,
     .n_ff_shexp = 128, .n_ff = 128, .ssm_conv = 4, .ssm_state = 64, .ssm_group = 2,
     .ssm_v_heads = 4, .full_attn_interval = 3, .rope_sections = {3, 3, 2, 0}, .n_ctx = 4096,
     .rope_base = 1e7f, .rms_eps = 1e-6f, .n_vocab = 2048, .tiny_vocab = 2048, .vocab = "qwen2",
     .hc = 4, .hc_rank = 32, .idx_head = 8, .idx_dim = 32, .idx_top_k = 2048, .idx_ratio = 4,
     .ple_layer = 1, .ple_heads = 4, .ple_dim = 32, .ple_eos = 2045, .ple_base = 250},
};
/* clang-format on */

#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

const synth_preset *synth_preset_find(const char *name) {
    for (int i = 0; i < N_PRESETS; i++)
        if (strcmp(presets[i].name, name) == 0) return &presets[i];
    return NULL;
}

const synth_preset *synth_preset_at(int i) { return i >= 0 && i < N_PRESETS ? &presets[i] : NULL; }

const char *synth_arch_name(synth_arch a) {
    switch (a) {
    case SYNTH_QWEN3MOE: return "qwen3moe";
    case SYNTH_QWEN35MOE: return "qwen35moe";
    case SYNTH_QWEN3NEXT: return "qwen3next";
    case SYNTH_QWEN4EXP: return "qwen4exp";
    }
    return "?";
}

/* ---- mixes --------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    uint32_t ftype;   /* llama_ftype written as general.file_type */
    uint32_t base;    /* the mix's default tensor type */
} mixes[MIX_COUNT] = {
    [MIX_F32] = {"F32", 0, GGML_TYPE_F32},
    [MIX_F16] = {"F16", 1, GGML_TYPE_F16},
    [MIX_BF16] = {"BF16", 32, GGML_TYPE_BF16},
    [MIX_Q8_0] = {"Q8_0", 7, GGML_TYPE_Q8_0},
    [MIX_Q6_K] = {"Q6_K", 18, GGML_TYPE_Q6_K},
    [MIX_Q4_K_M] = {"Q4_K_M", 15, GGML_TYPE_Q4_K},
    [MIX_Q2_K] = {"Q2_K", 10, GGML_TYPE_Q2_K},
    [MIX_IQ4_XS] = {"IQ4_XS", 30, GGML_TYPE_IQ4_XS},
    /* Unsloth-"XL"-style: no llama_ftype of its own; labelled as its nominal base Q2_K */
    [MIX_Q2_K_XL] = {"Q2_K_XL", 10, GGML_TYPE_Q4_K},
    [MIX_Q2_0] = {"Q2_0", 41, GGML_TYPE_Q2_0},
};

int synth_mix_from_name(const char *name) {
    for (int i = 0; i < MIX_COUNT; i++)
        if (strcasecmp(mixes[i].name, name) == 0) return i;
    if (strcasecmp(name, "MIX") == 0) return MIX_Q2_K_XL; /* the fixtures' name for it */
    return -1;
}

const char *synth_mix_name(synth_mix m) { return mixes[m].name; }
uint32_t synth_mix_file_type(synth_mix m) { return mixes[m].ftype; }

static bool has(const char *name, const char *part) { return strstr(name, part) != NULL; }

/* llama.cpp quantizes only 2-D/3-D tensors named *weight, never norms, routers or conv1d. */
static bool quantizable(const char *name, int n_dims) {
    size_t n = strlen(name);
    if (n_dims < 2 || n < 6 || strcmp(name + n - 6, "weight") != 0) return false;
    /* qwen4exp: llama.cpp never quantizes the indexer projections */
    return !has(name, "_norm.weight") && !has(name, "ffn_gate_inp.weight") &&
           !has(name, "ssm_conv1d") && !has(name, "indexer.");
}

/* llama.cpp's "use more bits" layer pattern: first and last eighth, and every third between. */
static bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* llama.cpp's tensor_type_fallback: row length not a multiple of the block size. */
static uint32_t fallback(uint32_t t, int64_t ne0) {
    const quant_traits *qt = quant_traits_of(t);
    if (ne0 % qt->block_elems == 0) return t;
    uint32_t r;
    switch (t) {
    case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S:
    case GGML_TYPE_IQ3_XXS: case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ4_XS: r = GGML_TYPE_IQ4_NL; break;
    case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: r = GGML_TYPE_Q4_0; break;
    case GGML_TYPE_Q4_K: r = GGML_TYPE_Q5_0; break;
    case GGML_TYPE_Q5_K: r = GGML_TYPE_Q5_1; break;
    case GGML_TYPE_Q6_K: r = GGML_TYPE_Q8_0; break;
    case GGML_TYPE_Q2_0: r = GGML_TYPE_Q4_0; break;
    default: r = GGML_TYPE_F16; break;
    }
    return ne0 % quant_traits_of(r)->block_elems == 0 ? r : GGML_TYPE_F16;
}

uint32_t synth_tensor_type(synth_mix mix, const synth_preset *p, const char *name, int n_dims,
                           int64_t ne0, int layer, int i_attn_v, int n_attn_v) {
    if (!quantizable(name, n_dims)) return GGML_TYPE_F32;
    uint32_t t = mixes[mix].base;
    if (!quant_traits_of(t)->is_quantized) return t; /* float mixes: every 2-D tensor as is */

    const bool is_output = strcmp(name, "output.weight") == 0;
    /* qwen4exp's n-gram table follows the token embedding's rules */
    const bool is_embd = strcmp(name, "token_embd.weight") == 0 ||
                         strcmp(name, "per_layer_token_embd.weight") == 0;
    const bool attn_v_like = has(name, "attn_v.weight") || has(name, "attn_qkv.weight");
    const int n_gqa = p->n_head / p->n_head_kv;
    const bool eight = p->n_expert == 8; /* llama.cpp special-cases 8-expert models */
    const int n_layer = p->n_layer;

    if (mix == MIX_Q2_K_XL) {
        /* Routed experts at 2-4 bits, embeddings and head kept high, the rest per Q4_K_M. */
        if (has(name, "ffn_gate_exps")) return fallback(GGML_TYPE_IQ2_XS, ne0);
        if (has(name, "ffn_up_exps")) return fallback(GGML_TYPE_IQ3_XXS, ne0);
        if (has(name, "ffn_down_exps")) return fallback(GGML_TYPE_IQ4_XS, ne0);
        if (is_output) return fallback(GGML_TYPE_Q6_K, ne0);
        if (is_embd) return fallback(GGML_TYPE_Q4_K, ne0);
        mix = MIX_Q4_K_M;
    }
    if (mix == MIX_Q2_0) {
        /* the fixtures' llama-quantize Q2_0: head Q6_K, embeddings Q4_K, K/V/QKV Q8_0 */
        if (is_output) return fallback(GGML_TYPE_Q6_K, ne0);
        if (is_embd) return fallback(GGML_TYPE_Q4_K, ne0);
        if (attn_v_like || has(name, "attn_k.weight")) return fallback(GGML_TYPE_Q8_0, ne0);
        return fallback(t, ne0);
    }
    if (is_output) {
        if (ne0 % (int64_t)quant_traits_of(t)->block_elems != 0) return GGML_TYPE_Q8_0;
        return t == GGML_TYPE_Q8_0 ? t : GGML_TYPE_Q6_K;
    }
    if (is_embd) return fallback(t, ne0);
    if (attn_v_like) {
        if (mix == MIX_Q2_K) t = n_gqa >= 4 ? GGML_TYPE_Q4_K : GGML_TYPE_Q3_K;
        else if (mix == MIX_IQ4_XS && n_gqa >= 4) t = GGML_TYPE_Q5_K;
        else if (mix == MIX_Q4_K_M && use_more_bits(i_attn_v, n_attn_v)) t = GGML_TYPE_Q6_K;
        if (eight) t = GGML_TYPE_Q8_0;
        return fallback(t, ne0);
    }
    if (has(name, "attn_k.weight")) return fallback(eight ? GGML_TYPE_Q8_0 : t, ne0);
    if (has(name, "ffn_down")) {
        /* layer from the name, as llama.cpp does for MoE models */
        int il = layer < 0 ? 0 : layer;
        if (mix == MIX_Q2_K) t = GGML_TYPE_Q3_K;
        else if (mix == MIX_Q4_K_M && use_more_bits(il, n_layer)) t = GGML_TYPE_Q6_K;
        else if (mix == MIX_IQ4_XS && il < n_layer / 8) t = GGML_TYPE_Q5_K;
        return fallback(t, ne0);
    }
    if (has(name, "attn_output.weight")) {
        if (eight) {
            if (mix == MIX_Q2_K || mix == MIX_Q4_K_M || mix == MIX_IQ4_XS) t = GGML_TYPE_Q5_K;
        } else if (mix == MIX_Q2_K) {
            t = GGML_TYPE_Q3_K;
        }
        return fallback(t, ne0);
    }
    return fallback(t, ne0);
}
