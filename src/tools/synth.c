/* sluice synth: plan the tensors of a preset, write the GGUF header, then stream the data
 * section through two large buffers: the thread pool fills one while a writer thread writes
 * the other, so generation and I/O overlap and the disk stays busy. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends/cpu/threadpool.h"
#include "formats/outfile.h"
#include "formats/quant.h"
#include "tools/synth_internal.h"

#define PIECE_BYTES (1u << 20) /* unit of generation and of determinism */
#define BUF_BYTES (64u << 20)  /* each of the two stream buffers */

typedef struct plan {
    synth_tensor *t;
    int n, cap;
} plan;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static synth_tensor *add(plan *pl, synth_role role, float std, int layer, int n_dims, int64_t ne0,
                         int64_t ne1, int64_t ne2, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));

static synth_tensor *add(plan *pl, synth_role role, float std, int layer, int n_dims, int64_t ne0,
                         int64_t ne1, int64_t ne2, const char *fmt, ...) {
    if (pl->n == pl->cap) {
        int cap = pl->cap ? pl->cap * 2 : 256;
        synth_tensor *t = realloc(pl->t, (size_t)cap * sizeof *t);
        if (!t) return NULL;
        pl->t = t;
        pl->cap = cap;
    }
    synth_tensor *t = &pl->t[pl->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->ne[3] = 1;
    t->role = role;
    t->std = std;
    t->layer = layer;
    return t;
}

static bool is_recurrent(const synth_preset *p, int il) {
    /* an MTP block (il >= n_layer) is an attention layer */
    return p->arch != SYNTH_QWEN3MOE && il < p->n_layer && (il + 1) % p->full_attn_interval != 0;
}

/* The qwen4exp MTP block's own tensors beyond its trunk-shaped layer (qwen4exp_mtp.c):
 * enorm, hnorm, eh_proj [2 n_embd -> n_embd] and its output mixer hc_head. */
static bool plan_nextn(plan *pl, const synth_preset *p, int il) {
    const int64_t E = p->n_embd, W = (int64_t)p->hc * E, R = p->hc_rank;
    return add(pl, ROLE_NORM, 0, il, 1, E, 1, 1, "blk.%d.nextn.enorm.weight", il) &&
           add(pl, ROLE_NORM, 0, il, 1, W, 1, 1, "blk.%d.nextn.hnorm.weight", il) &&
           add(pl, ROLE_WEIGHT, 1.0f / sqrtf((float)(2 * E)), il, 2, 2 * E, E, 1, "blk.%d.nextn.eh_proj.weight", il) &&
           add(pl, ROLE_NORM, 0, il, 1, W, 1, 1, "blk.%d.nextn.hc_head_norm.weight", il) &&
           add(pl, ROLE_WEIGHT, 1.0f / sqrtf((float)W), il, 2, W, R, 1, "blk.%d.nextn.hc_head_down.weight", il) &&
           add(pl, ROLE_WEIGHT, 1.0f / sqrtf((float)R), il, 2, R, W, 1, "blk.%d.nextn.hc_head_up.weight", il);
}

/* qwen4exp's primes: the n-gram head moduli are consecutive primes from ple_base. */
static int64_t next_prime(int64_t v) {
    for (;; v++) {
        bool prime = v >= 2;
        for (int64_t d = 2; prime && d * d <= v; d++) prime = v % d != 0;
        if (prime) return v;
    }
}

/* A qwen4exp layer (llama.cpp's load_arch_tensors shapes): two hyper-connection modules
 * instead of norms, Gated DeltaNet or gated attention with the QSA indexer, the n-gram module
 * on its layer, and the MoE with a shared expert. */
static bool plan_layer_q4x(plan *pl, const synth_preset *p, int il) {
    const int64_t E = p->n_embd, W = (int64_t)p->hc * E, R = p->hc_rank;
    const int64_t hd = p->head_dim, H = p->n_head, KV = p->n_head_kv, Fs = p->n_ff_shexp;
    const float w = 1.0f / sqrtf((float)E), rs = 1.0f / sqrtf((float)p->n_layer);
    static const char *const mods[2] = {"attn", "ffn"};
    bool ok = true;
    for (int k = 0; k < 2 && ok; k++)
        ok = add(pl, ROLE_NORM, 0, il, 1, W, 1, 1, "blk.%d.hc_%s_norm.weight", il, mods[k]) &&
             add(pl, ROLE_WEIGHT, 1.0f / sqrtf((float)W), il, 2, W, R, 1, "blk.%d.hc_%s_down.weight", il, mods[k]) &&
             add(pl, ROLE_WEIGHT, 1.0f / sqrtf((float)R), il, 2, R, W, 1, "blk.%d.hc_%s_up.weight", il, mods[k]) &&
             add(pl, ROLE_WEIGHT, 1.0f / sqrtf((float)W), il, 2, W, p->hc, 1, "blk.%d.hc_%s_inject.weight", il, mods[k]);
    if (!is_recurrent(p, il)) {
        ok = ok && add(pl, ROLE_WEIGHT, w, il, 2, E, 2 * H * hd, 1, "blk.%d.attn_q.weight", il) &&
             add(pl, ROLE_WEIGHT, w, il, 2, E, KV * hd, 1, "blk.%d.attn_k.weight", il) &&
             add(pl, ROLE_WEIGHT, w, il, 2, E, KV * hd, 1, "blk.%d.attn_v.weight", il) &&
             add(pl, ROLE_RESID, rs / sqrtf((float)(H * hd)), il, 2, H * hd, E, 1, "blk.%d.attn_output.weight", il) &&
             add(pl, ROLE_NORM, 0, il, 1, hd, 1, 1, "blk.%d.attn_q_norm.weight", il) &&
             add(pl, ROLE_NORM, 0, il, 1, hd, 1, 1, "blk.%d.attn_k_norm.weight", il) &&
             add(pl, ROLE_WEIGHT, w, il, 2, E, (int64_t)p->idx_head * p->idx_dim, 1, "blk.%d.indexer.q_proj.weight", il) &&
             add(pl, ROLE_WEIGHT, w, il, 2, E, p->idx_dim, 1, "blk.%d.indexer.k_proj.weight", il) &&
             add(pl, ROLE_NORM, 0, il, 1, p->idx_dim, 1, 1, "blk.%d.indexer.q_norm.weight", il) &&
             add(pl, ROLE_NORM, 0, il, 1, p->idx_dim, 1, 1, "blk.%d.indexer.k_norm.weight", il);
    } else {
        const int64_t vh = p->ssm_v_heads, kdim = (int64_t)p->ssm_state * p->ssm_group,
                      vdim = (int64_t)p->ssm_state * vh;
        ok = ok && add(pl, ROLE_WEIGHT, w, il, 2, E, 2 * kdim + vdim, 1, "blk.%d.attn_qkv.weight", il) &&
             add(pl, ROLE_WEIGHT, w, il, 2, E, vdim, 1, "blk.%d.attn_gate.weight", il) &&
             add(pl, ROLE_CONV, 0.5f, il, 2, p->ssm_conv, 2 * kdim + vdim, 1, "blk.%d.ssm_conv1d.weight", il) &&
             add(pl, ROLE_SSM_DT, 0, il, 1, vh, 1, 1, "blk.%d.ssm_dt.bias", il) &&
             add(pl, ROLE_SSM_A, 0, il, 1, vh, 1, 1, "blk.%d.ssm_a", il) &&
             add(pl, ROLE_NORM, 0, il, 1, p->ssm_state, 1, 1, "blk.%d.ssm_norm.weight", il) &&
             add(pl, ROLE_RESID, rs / sqrtf((float)vdim), il, 2, vdim, E, 1, "blk.%d.ssm_out.weight", il) &&
             add(pl, ROLE_WEIGHT, w, il, 2, E, vh, 1, "blk.%d.ssm_beta.weight", il) &&
             add(pl, ROLE_WEIGHT, w, il, 2, E, vh, 1, "blk.%d.ssm_alpha.weight", il);
    }
    if (il == p->ple_layer)
        ok = ok && add(pl, ROLE_WEIGHT, w, il, 2, E, W, 1, "blk.%d.ple_key.weight", il) &&
             add(pl, ROLE_RESID, rs * w, il, 2, E, E, 1, "blk.%d.ple_value.weight", il) &&
             add(pl, ROLE_NORM, 0, il, 1, W, 1, 1, "blk.%d.ple_norm_key.weight", il) &&
             add(pl, ROLE_NORM, 0, il, 1, W, 1, 1, "blk.%d.ple_norm_query.weight", il) &&
             add(pl, ROLE_NORM, 0, il, 1, W, 1, 1, "blk.%d.ple_norm_conv.weight", il) &&
             add(pl, ROLE_CONV, 0.1f, il, 2, p->ssm_conv, W, 1, "blk.%d.ple_conv1d.weight", il);
    return ok && add(pl, ROLE_WEIGHT, w, il, 1, E, 1, 1, "blk.%d.ffn_gate_inp_shexp.weight", il) &&
           add(pl, ROLE_WEIGHT, w, il, 2, E, Fs, 1, "blk.%d.ffn_gate_shexp.weight", il) &&
           add(pl, ROLE_WEIGHT, w, il, 2, E, Fs, 1, "blk.%d.ffn_up_shexp.weight", il) &&
           add(pl, ROLE_RESID, rs / sqrtf((float)Fs), il, 2, Fs, E, 1, "blk.%d.ffn_down_shexp.weight", il);
}

/* The tensors of one layer, in llama.cpp's create_tensor shapes (ne order, innermost first). */
static bool plan_layer(plan *pl, const synth_preset *p, int il) {
    const int64_t E = p->n_embd, X = p->n_expert, F = p->n_ff_exp, Fs = p->n_ff_shexp;
    const int64_t hd = p->head_dim, H = p->n_head, KV = p->n_head_kv;
    const float w = 1.0f / sqrtf((float)E);
    /* writes into the residual stream are scaled down by sqrt(n_layer) so that its size stays
     * near the embedding's at every depth (the routers' skew assumes that) */
    const float rs = 1.0f / sqrtf((float)p->n_layer);
    if (p->arch == SYNTH_QWEN4EXP) { /* no norms: hyper-connections (and the same MoE) */
        if (!plan_layer_q4x(pl, p, il)) return false;
    }
    bool ok = p->arch == SYNTH_QWEN4EXP ||
              add(pl, ROLE_NORM, 0, il, 1, E, 1, 1, "blk.%d.attn_norm.weight", il);
    if (p->arch == SYNTH_QWEN4EXP) {
        /* done above */
    } else if (p->arch == SYNTH_QWEN3MOE) {
        ok = ok && add(pl, ROLE_WEIGHT, w, il, 2, E, H * hd, 1, "blk.%d.attn_q.weight", il) &&
             add(pl, ROLE_WEIGHT, w, il, 2, E, KV * hd, 1, "blk.%d.attn_k.weight", il) &&
             add(pl, ROLE_WEIGHT, w, il, 2, E, KV * hd, 1, "blk.%d.attn_v.weight", il) &&
             add(pl, ROLE_RESID, rs / sqrtf((float)(H * hd)), il, 2, H * hd, E, 1,
                 "blk.%d.attn_output.weight", il) &&
             add(pl, ROLE_NORM, 0, il, 1, hd, 1, 1, "blk.%d.attn_q_norm.weight", il) &&
             add(pl, ROLE_NORM, 0, il, 1, hd, 1, 1, "blk.%d.attn_k_norm.weight", il) &&
             add(pl, ROLE_NORM, 0, il, 1, E, 1, 1, "blk.%d.ffn_norm.weight", il);
    } else {
        ok = ok && add(pl, ROLE_NORM, 0, il, 1, E, 1, 1, "blk.%d.post_attention_norm.weight", il);
        if (!is_recurrent(p, il)) {
            ok = ok && add(pl, ROLE_WEIGHT, w, il, 2, E, 2 * H * hd, 1, "blk.%d.attn_q.weight", il) &&
                 add(pl, ROLE_WEIGHT, w, il, 2, E, KV * hd, 1, "blk.%d.attn_k.weight", il) &&
                 add(pl, ROLE_WEIGHT, w, il, 2, E, KV * hd, 1, "blk.%d.attn_v.weight", il) &&
                 add(pl, ROLE_RESID, rs / sqrtf((float)(H * hd)), il, 2, H * hd, E, 1,
                     "blk.%d.attn_output.weight", il) &&
                 add(pl, ROLE_NORM, 0, il, 1, hd, 1, 1, "blk.%d.attn_q_norm.weight", il) &&
                 add(pl, ROLE_NORM, 0, il, 1, hd, 1, 1, "blk.%d.attn_k_norm.weight", il);
        } else {
            const int64_t vh = p->ssm_v_heads, kdim = (int64_t)p->ssm_state * p->ssm_group,
                          vdim = (int64_t)p->ssm_state * vh;
            ok = ok && add(pl, ROLE_WEIGHT, w, il, 2, E, 2 * kdim + vdim, 1, "blk.%d.attn_qkv.weight", il) &&
                 add(pl, ROLE_WEIGHT, w, il, 2, E, vdim, 1, "blk.%d.attn_gate.weight", il) &&
                 add(pl, ROLE_CONV, 0.5f, il, 2, p->ssm_conv, 2 * kdim + vdim, 1,
                     "blk.%d.ssm_conv1d.weight", il) &&
                 add(pl, ROLE_SSM_DT, 0, il, 1, vh, 1, 1, "blk.%d.ssm_dt.bias", il) &&
                 add(pl, ROLE_SSM_A, 0, il, 1, vh, 1, 1, "blk.%d.ssm_a", il) &&
                 add(pl, ROLE_NORM, 0, il, 1, p->ssm_state, 1, 1, "blk.%d.ssm_norm.weight", il) &&
                 add(pl, ROLE_RESID, rs / sqrtf((float)vdim), il, 2, vdim, E, 1,
                     "blk.%d.ssm_out.weight", il);
            if (p->arch == SYNTH_QWEN35MOE)
                ok = ok && add(pl, ROLE_WEIGHT, w, il, 2, E, vh, 1, "blk.%d.ssm_beta.weight", il) &&
                     add(pl, ROLE_WEIGHT, w, il, 2, E, vh, 1, "blk.%d.ssm_alpha.weight", il);
            else
                ok = ok && add(pl, ROLE_WEIGHT, w, il, 2, E, 2 * vh, 1, "blk.%d.ssm_ba.weight", il);
        }
        ok = ok && add(pl, ROLE_WEIGHT, w, il, 1, E, 1, 1, "blk.%d.ffn_gate_inp_shexp.weight", il) &&
             add(pl, ROLE_WEIGHT, w, il, 2, E, Fs, 1, "blk.%d.ffn_gate_shexp.weight", il) &&
             add(pl, ROLE_WEIGHT, w, il, 2, E, Fs, 1, "blk.%d.ffn_up_shexp.weight", il) &&
             add(pl, ROLE_RESID, rs / sqrtf((float)Fs), il, 2, Fs, E, 1,
                 "blk.%d.ffn_down_shexp.weight", il);
    }
    return ok && add(pl, ROLE_ROUTER, w, il, 2, E, X, 1, "blk.%d.ffn_gate_inp.weight", il) &&
           add(pl, ROLE_WEIGHT, w, il, 3, E, F, X, "blk.%d.ffn_gate_exps.weight", il) &&
           add(pl, ROLE_WEIGHT, w, il, 3, E, F, X, "blk.%d.ffn_up_exps.weight", il) &&
           add(pl, ROLE_RESID, rs / sqrtf((float)F), il, 3, F, E, X,
               "blk.%d.ffn_down_exps.weight", il);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const synth_tensor *)a)->name, ((const synth_tensor *)b)->name);
}

/* Tensors in llama-quantize's output order (by layer, then by name), with their types. */
static int build_plan(plan *pl, const synth_preset *p, synth_mix mix, char *err, size_t n) {
    const int64_t E = p->n_embd, V = p->n_vocab;
    if (p->arch == SYNTH_QWEN4EXP) {
        /* no output norm: the final hyper-connection mixer; the n-gram table, its rows padded
         * to a multiple of 128 as the converter does */
        const int64_t W = (int64_t)p->hc * E, heads = 2 * (int64_t)p->ple_heads;
        int64_t rows = 0, m = p->ple_base;
        for (int64_t h = 0; h < heads; h++, m++) rows += (m = next_prime(m));
        rows = (rows + 127) / 128 * 128;
        if (!add(pl, ROLE_OUTPUT, 2.0f / sqrtf((float)E), -1, 2, E, V, 1, "output.weight") ||
            !add(pl, ROLE_NORM, 0, -1, 1, W, 1, 1, "output_hc_norm.weight") ||
            !add(pl, ROLE_WEIGHT, 1.0f / sqrtf((float)W), -1, 2, W, p->hc_rank, 1, "output_hc_down.weight") ||
            !add(pl, ROLE_WEIGHT, 1.0f / sqrtf((float)p->hc_rank), -1, 2, p->hc_rank, W, 1, "output_hc_up.weight") ||
            !add(pl, ROLE_WEIGHT, 1.0f, -1, 2, p->ple_dim, rows, 1, "per_layer_token_embd.weight") ||
            !add(pl, ROLE_EMBD, 1.0f, -1, 2, E, V, 1, "token_embd.weight"))
            goto oom;
    } else if (!add(pl, ROLE_OUTPUT, 2.0f / sqrtf((float)E), -1, 2, E, V, 1, "output.weight") ||
               !add(pl, ROLE_NORM, 0, -1, 1, E, 1, 1, "output_norm.weight") ||
               !add(pl, ROLE_EMBD, 1.0f, -1, 2, E, V, 1, "token_embd.weight"))
        goto oom;
    for (int il = 0; il < p->n_layer + p->nextn; il++) {
        int first = pl->n;
        if (!plan_layer(pl, p, il) || (il >= p->n_layer && !plan_nextn(pl, p, il))) goto oom;
        qsort(pl->t + first, (size_t)(pl->n - first), sizeof *pl->t, cmp_name);
    }
    int n_attn_v = 0, i_attn_v = 0;
    for (int i = 0; i < pl->n; i++)
        n_attn_v += strstr(pl->t[i].name, "attn_v.weight") || strstr(pl->t[i].name, "attn_qkv.weight");
    for (int i = 0; i < pl->n; i++) {
        synth_tensor *t = &pl->t[i];
        t->type = synth_tensor_type(mix, p, t->name, t->n_dims, t->ne[0], t->layer, i_attn_v, n_attn_v);
        i_attn_v += strstr(t->name, "attn_v.weight") || strstr(t->name, "attn_qkv.weight");
        if (!synth_gen_supports(t->type) || synth_gen_calibrate(t->type) != 0) {
            snprintf(err, n, "tensor %s: type %s cannot be generated", t->name,
                     quant_type_name(t->type));
            return -1;
        }
        const quant_traits *qt = quant_traits_of(t->type);
        const uint64_t nel = (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2]);
        t->n_blocks = nel / qt->block_elems;
        t->nbytes = t->n_blocks * qt->block_bytes;
        t->blocks_per_piece = PIECE_BYTES / qt->block_bytes;
    }
    return 0;
oom:
    snprintf(err, n, "out of memory");
    return -1;
}

/* ---- metadata ----------------------------------------------------------------------------- */

static int write_metadata(gguf_writer *w, const synth_preset *p, const synth_options *o,
                          synth_mix mix, char *vocab_used, size_t vcap, char *err, size_t n) {
    const char *a = synth_arch_name(p->arch);
    char k[128];
#define KEY(suffix) (snprintf(k, sizeof k, "%s." suffix, a), k)
    bool ok = gguf_w_str(w, "general.architecture", a) == 0 &&
              gguf_w_str(w, "general.name", p->label) == 0 &&
              gguf_w_str(w, "general.size_label", p->size_label) == 0 &&
              gguf_w_u32(w, KEY("block_count"), (uint32_t)(p->n_layer + p->nextn)) == 0 &&
              gguf_w_u32(w, KEY("context_length"), (uint32_t)p->n_ctx) == 0 &&
              gguf_w_u32(w, KEY("embedding_length"), (uint32_t)p->n_embd) == 0 &&
              (p->n_ff == 0 || gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)p->n_ff) == 0) &&
              gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head) == 0 &&
              gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv) == 0 &&
              gguf_w_u32(w, KEY("attention.key_length"), (uint32_t)p->head_dim) == 0 &&
              gguf_w_u32(w, KEY("attention.value_length"), (uint32_t)p->head_dim) == 0 &&
              gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), p->rms_eps) == 0 &&
              gguf_w_u32(w, KEY("expert_count"), (uint32_t)p->n_expert) == 0 &&
              gguf_w_u32(w, KEY("expert_used_count"), (uint32_t)p->n_expert_used) == 0 &&
              gguf_w_u32(w, KEY("expert_feed_forward_length"), (uint32_t)p->n_ff_exp) == 0 &&
              gguf_w_f32(w, KEY("rope.freq_base"), p->rope_base) == 0;
    if (ok && p->arch != SYNTH_QWEN3MOE) {
        ok = gguf_w_u32(w, KEY("rope.dimension_count"), (uint32_t)p->n_rot) == 0 &&
             (p->arch == SYNTH_QWEN3NEXT ||
              gguf_w_arr(w, KEY("rope.dimension_sections"), GGUF_VT_I32, p->rope_sections, 4) == 0) &&
             gguf_w_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)p->n_ff_shexp) == 0 &&
             gguf_w_u32(w, KEY("ssm.conv_kernel"), (uint32_t)p->ssm_conv) == 0 &&
             gguf_w_u32(w, KEY("ssm.state_size"), (uint32_t)p->ssm_state) == 0 &&
             gguf_w_u32(w, KEY("ssm.group_count"), (uint32_t)p->ssm_group) == 0 &&
             gguf_w_u32(w, KEY("ssm.time_step_rank"), (uint32_t)p->ssm_v_heads) == 0 &&
             gguf_w_u32(w, KEY("ssm.inner_size"), (uint32_t)(p->ssm_v_heads * p->ssm_state)) == 0 &&
             gguf_w_u32(w, KEY("full_attention_interval"), (uint32_t)p->full_attn_interval) == 0;
    }
    if (ok && p->arch == SYNTH_QWEN4EXP) {
        /* llama.cpp's qwen4exp keys; the n-gram arrays are u64 as the converter writes them */
        int32_t ratios[256];
        uint8_t recurrent[256];
        const int nl = p->n_layer + p->nextn < 256 ? p->n_layer + p->nextn : 256;
        for (int il = 0; il < nl; il++) {
            recurrent[il] = is_recurrent(p, il);
            ratios[il] = recurrent[il] || il >= p->n_layer ? 0 : p->idx_ratio; /* MTP: 0 */
        }
        const int heads = 2 * p->ple_heads;
        uint64_t sizes[64], offsets[64], off = 0;
        int64_t m = p->ple_base;
        for (int h = 0; h < heads && h < 64; h++, m++) {
            m = next_prime(m);
            sizes[h] = (uint64_t)m;
            offsets[h] = off;
            off += (uint64_t)m;
        }
        static const uint64_t mult[3] = {23703573157769ull, 20109073645365ull, 8052911324071ull};
        const int32_t ple_layers[1] = {p->ple_layer};
        ok = gguf_w_u32(w, KEY("hyper_connection.count"), (uint32_t)p->hc) == 0 &&
             gguf_w_u32(w, KEY("hyper_connection.low_rank"), (uint32_t)p->hc_rank) == 0 &&
             gguf_w_u32(w, KEY("attention.indexer.head_count"), (uint32_t)p->idx_head) == 0 &&
             gguf_w_u32(w, KEY("attention.indexer.key_length"), (uint32_t)p->idx_dim) == 0 &&
             gguf_w_u32(w, KEY("attention.indexer.top_k"), (uint32_t)p->idx_top_k) == 0 &&
             gguf_w_arr(w, KEY("attention.compress_ratios"), GGUF_VT_I32, ratios, (uint64_t)nl) == 0 &&
             gguf_w_arr(w, KEY("attention.recurrent_layers"), GGUF_VT_BOOL, recurrent, (uint64_t)nl) == 0 &&
             gguf_w_arr(w, KEY("ple.layers"), GGUF_VT_I32, ple_layers, 1) == 0 &&
             gguf_w_u32(w, KEY("ple.ngram_size"), 3) == 0 &&
             gguf_w_u32(w, KEY("ple.heads_per_ngram"), (uint32_t)p->ple_heads) == 0 &&
             gguf_w_u32(w, KEY("ple.conv_kernel"), (uint32_t)p->ssm_conv) == 0 &&
             gguf_w_u32(w, KEY("ple.eos_token_id"), (uint32_t)p->ple_eos) == 0 &&
             gguf_w_u32(w, KEY("embedding_length_per_layer_input"), (uint32_t)p->ple_dim) == 0 &&
             gguf_w_arr(w, KEY("ple.layer_multipliers"), GGUF_VT_U64, mult, 3) == 0 &&
             gguf_w_arr(w, KEY("ple.head_vocab_sizes"), GGUF_VT_U64, sizes, (uint64_t)heads) == 0 &&
             gguf_w_arr(w, KEY("ple.head_offsets"), GGUF_VT_U64, offsets, (uint64_t)heads) == 0 &&
             (p->nextn == 0 || gguf_w_u32(w, KEY("nextn_predict_layers"), (uint32_t)p->nextn) == 0);
    }
#undef KEY
    ok = ok && gguf_w_u32(w, "general.quantization_version", 2) == 0 &&
         gguf_w_u32(w, "general.file_type", synth_mix_file_type(mix)) == 0 &&
         gguf_w_str(w, SYNTH_KEY_PRESET, p->name) == 0 &&
         gguf_w_u64(w, SYNTH_KEY_SEED, o->seed) == 0 &&
         gguf_w_f32(w, SYNTH_KEY_SKEW, o->routing_skew) == 0 &&
         gguf_w_u32(w, SYNTH_KEY_TOPICS, SYNTH_TOPICS) == 0;
    if (!ok) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    return synth_vocab_write(w, p, o->vocab, vocab_used, vcap, err, n);
}

/* ---- the data stream ---------------------------------------------------------------------- */

typedef struct piece {
    int tensor;
    uint64_t index;   /* piece index within the tensor */
    uint64_t offset;  /* byte offset in the current buffer */
    uint32_t bytes;
    uint32_t pad;     /* zero bytes after it (alignment, at a tensor's end) */
} piece;

typedef struct stream {
    const plan *pl;
    const synth_gen_ctx *g;
    piece *pieces;
    size_t n_pieces;
    /* the batch being generated */
    size_t first, last;
    uint8_t *buf;
    atomic_size_t next;
    /* writer thread */
    int fd;
    pthread_t writer;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t *wbuf;     /* buffer handed to the writer; NULL when it is idle */
    size_t wlen;
    bool done, failed;
    int err_no;
    uint64_t written, total;
    int progress;
    FILE *log;
    double t0, last_report;
    int last_pct;
} stream;

static void gen_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    stream *s = ctx;
    for (;;) {
        size_t i = atomic_fetch_add(&s->next, 1) + s->first;
        if (i >= s->last) return;
        const piece *pc = &s->pieces[i];
        synth_gen_piece(s->g, &s->pl->t[pc->tensor], pc->tensor, pc->index, s->buf + pc->offset);
        memset(s->buf + pc->offset + pc->bytes, 0, pc->pad);
    }
}

static void report(stream *s, bool final) {
    if (!s->progress || !s->log) return;
    double t = now_s(), el = t - s->t0;
    double frac = s->total ? (double)s->written / (double)s->total : 1.0;
    double gbs = el > 0 ? (double)s->written / el / 1e9 : 0.0;
    if (s->progress == 1) {
        if (!final && t - s->last_report < 0.2) return;
        s->last_report = t;
        int width = 30, fill = (int)(frac * width);
        char bar[32];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        fprintf(s->log, "\rsynth: [%s] %5.1f%% %.2f/%.2f GB %.2f GB/s%s", bar, frac * 100,
                (double)s->written / 1e9, (double)s->total / 1e9, gbs, final ? "\n" : "");
    } else {
        int pct = (int)(frac * 100);
        if (pct / 10 == s->last_pct / 10 && !final) return;
        if (final && pct == s->last_pct) return;
        s->last_pct = pct;
        fprintf(s->log, "synth: %d%% (%.2f GB, %.2f GB/s)\n", pct, (double)s->written / 1e9, gbs);
    }
    fflush(s->log);
}

static void *writer_main(void *arg) {
    stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->wbuf && !s->done) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->wbuf) break;
        uint8_t *b = s->wbuf;
        size_t len = s->wlen;
        pthread_mutex_unlock(&s->mu);
        size_t off = 0;
        int e = 0;
        while (off < len) {
            ssize_t k = write(s->fd, b + off, len - off);
            if (k < 0) {
                if (errno == EINTR) continue;
                e = errno;
                break;
            }
            off += (size_t)k;
        }
        pthread_mutex_lock(&s->mu);
        if (e) {
            s->failed = true;
            s->err_no = e;
        }
        s->written += off;
        report(s, false);
        s->wbuf = NULL;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int build_pieces(stream *s, uint64_t alignment) {
    size_t n = 0;
    for (int i = 0; i < s->pl->n; i++) {
        const synth_tensor *t = &s->pl->t[i];
        n += (size_t)((t->n_blocks + t->blocks_per_piece - 1) / t->blocks_per_piece);
    }
    s->pieces = calloc(n ? n : 1, sizeof *s->pieces);
    if (!s->pieces) return -1;
    size_t k = 0;
    for (int i = 0; i < s->pl->n; i++) {
        const synth_tensor *t = &s->pl->t[i];
        const uint64_t np = (t->n_blocks + t->blocks_per_piece - 1) / t->blocks_per_piece;
        const uint64_t bb = t->nbytes / t->n_blocks;
        for (uint64_t j = 0; j < np; j++) {
            piece *pc = &s->pieces[k++];
            uint64_t nb = t->n_blocks - j * t->blocks_per_piece;
            if (nb > t->blocks_per_piece) nb = t->blocks_per_piece;
            pc->tensor = i;
            pc->index = j;
            pc->bytes = (uint32_t)(nb * bb);
            if (j + 1 == np) pc->pad = (uint32_t)((alignment - t->nbytes % alignment) % alignment);
        }
    }
    s->n_pieces = k;
    return 0;
}

static int stream_data(stream *s, threadpool *pool, char *err, size_t n) {
    uint8_t *bufs[2] = {malloc(BUF_BYTES), malloc(BUF_BYTES)};
    if (!bufs[0] || !bufs[1]) {
        free(bufs[0]);
        free(bufs[1]);
        snprintf(err, n, "out of memory for the stream buffers");
        return -1;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int rc = pthread_create(&s->writer, NULL, writer_main, s);
    if (rc != 0) {
        free(bufs[0]);
        free(bufs[1]);
        snprintf(err, n, "cannot start the writer thread");
        return -1;
    }
    int cur = 0;
    size_t i = 0;
    bool failed = false;
    while (i < s->n_pieces && !failed) {
        /* a batch: whole pieces that fit the buffer */
        size_t j = i;
        uint64_t off = 0;
        while (j < s->n_pieces && off + s->pieces[j].bytes + s->pieces[j].pad <= BUF_BYTES) {
            s->pieces[j].offset = off;
            off += s->pieces[j].bytes + s->pieces[j].pad;
            j++;
        }
        s->first = i;
        s->last = j;
        s->buf = bufs[cur];
        atomic_store(&s->next, 0);
        threadpool_run(pool, gen_task, s);
        pthread_mutex_lock(&s->mu);
        while (s->wbuf) pthread_cond_wait(&s->cv, &s->mu); /* the other buffer is written */
        failed = s->failed;
        s->wbuf = bufs[cur];
        s->wlen = (size_t)off;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        cur ^= 1;
        i = j;
    }
    pthread_mutex_lock(&s->mu);
    while (s->wbuf) pthread_cond_wait(&s->cv, &s->mu);
    s->done = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->writer, NULL);
    free(bufs[0]);
    free(bufs[1]);
    if (s->failed) {
        snprintf(err, n, "write failed: %s", strerror(s->err_no));
        return -1;
    }
    report(s, true);
    return 0;
}

/* ---- driver ------------------------------------------------------------------------------- */

static void print_plan(FILE *log, const plan *pl, const synth_options *o, uint64_t file_bytes) {
    uint64_t by_type[GGML_TYPE_COUNT] = {0}, cnt[GGML_TYPE_COUNT] = {0}, experts = 0;
    for (int i = 0; i < pl->n; i++) {
        by_type[pl->t[i].type] += pl->t[i].nbytes;
        cnt[pl->t[i].type]++;
        if (strstr(pl->t[i].name, "_exps.")) experts += pl->t[i].nbytes;
    }
    fprintf(log, "synth: %d tensors, %.3f GB (%.2f GiB); routed experts %.3f GB\n", pl->n,
            (double)file_bytes / 1e9, (double)file_bytes / (1024.0 * 1024 * 1024),
            (double)experts / 1e9);
    for (int t = 0; t < GGML_TYPE_COUNT; t++)
        if (cnt[t])
            fprintf(log, "  %-8s %5llu tensors %12.3f MB\n", quant_type_name((uint32_t)t),
                    (unsigned long long)cnt[t], (double)by_type[t] / 1e6);
    if (o->list_tensors)
        for (int i = 0; i < pl->n; i++) {
            const synth_tensor *t = &pl->t[i];
            fprintf(log, "  %-40s %-8s [%lld", t->name, quant_type_name(t->type), (long long)t->ne[0]);
            for (int d = 1; d < t->n_dims; d++) fprintf(log, ", %lld", (long long)t->ne[d]);
            fprintf(log, "] %llu\n", (unsigned long long)t->nbytes);
        }
}

static void make_ranks(const synth_preset *p, uint64_t seed, int32_t *rank, int32_t *home) {
    for (int il = 0; il < p->n_layer + p->nextn; il++) {
        int32_t *perm = rank + (size_t)il * p->n_expert;
        for (int e = 0; e < p->n_expert; e++) perm[e] = e;
        uint64_t s = synth_mix64(seed ^ 0x70707070ull ^ (uint64_t)il);
        for (int e = p->n_expert - 1; e > 0; e--) { /* Fisher-Yates: each layer its own order */
            s = synth_mix64(s);
            int j = (int)(s % (uint64_t)(e + 1));
            int32_t x = perm[e];
            perm[e] = perm[j];
            perm[j] = x;
        }
        for (int e = 0; e < p->n_expert; e++)
            home[(size_t)il * p->n_expert + e] =
                (int32_t)(synth_mix64(seed ^ ((uint64_t)il << 32) ^ (uint64_t)e ^ 0x5151ull) %
                          SYNTH_TOPICS);
    }
}

int synth_run(const synth_options *o, FILE *log, char *err, size_t n) {
    const synth_preset *found = synth_preset_find(o->preset);
    if (!found) {
        snprintf(err, n, "unknown preset '%s' (see sluice synth --list)", o->preset);
        return -1;
    }
    synth_preset with_mtp = *found;
    if (o->mtp) {
        if (found->arch != SYNTH_QWEN4EXP) {
            snprintf(err, n, "--mtp: preset '%s' is not a qwen4exp model", o->preset);
            return -1;
        }
        with_mtp.nextn = 1;
    }
    /* --layers: the same per-layer shapes, fewer layers (a benchmark file that fits where the
     * full depth does not); the name says so, so results are not mistaken for the full model */
    char label[256];
    if (o->n_layer < 0 || o->n_layer > 4096) {
        snprintf(err, n, "--layers must be between 1 and 4096");
        return -1;
    }
    if (o->n_layer > 0) {
        with_mtp.n_layer = o->n_layer;
        snprintf(label, sizeof label, "%s, %d layer%s", found->label, o->n_layer, o->n_layer == 1 ? "" : "s");
        with_mtp.label = label;
    }
    const synth_preset *p = &with_mtp;
    int mix = synth_mix_from_name(o->type);
    if (mix < 0) {
        snprintf(err, n, "unknown type '%s' (see sluice synth --list)", o->type);
        return -1;
    }
    if (!(o->routing_skew >= 0.0f && o->routing_skew <= 8.0f)) {
        snprintf(err, n, "--routing-skew must be between 0 and 8");
        return -1;
    }
    if (outfile_check(o->out, err, n) != 0) return -1;
    int rc = -1;
    plan pl = {0};
    gguf_writer *w = NULL;
    FILE *fp = NULL;
    threadpool *pool = NULL;
    int32_t *rank = NULL, *home = NULL;
    stream s = {0};
    char tmp[4096] = "";
    if (build_plan(&pl, p, (synth_mix)mix, err, n) != 0) goto done;
    w = gguf_writer_new();
    char vocab_used[4096] = "";
    if (!w) {
        snprintf(err, n, "out of memory");
        goto done;
    }
    if (write_metadata(w, p, o, (synth_mix)mix, vocab_used, sizeof vocab_used, err, n) != 0)
        goto done;
    for (int i = 0; i < pl.n; i++) {
        const synth_tensor *t = &pl.t[i];
        if (gguf_w_tensor(w, t->name, t->type, (uint32_t)t->n_dims, t->ne, NULL) < 0) {
            snprintf(err, n, "out of memory");
            goto done;
        }
    }
    /* header size: serialize it once into memory (also what is written below) */
    char *hbuf = NULL;
    size_t hlen = 0;
    FILE *mem = open_memstream(&hbuf, &hlen);
    if (!mem || gguf_writer_write_header(w, mem) != 0 || fclose(mem) != 0) {
        free(hbuf);
        snprintf(err, n, "out of memory serializing the header");
        goto done;
    }
    uint64_t data_bytes = 0;
    /* the writer pads every tensor to the default alignment (it sets no other) */
    const uint64_t al = GGUF_DEFAULT_ALIGNMENT;
    for (int i = 0; i < pl.n; i++) data_bytes += (pl.t[i].nbytes + al - 1) / al * al;
    const uint64_t file_bytes = hlen + data_bytes;
    if (!o->dry_run) {
        /* write to a temporary name, renamed only when complete; opened before anything is
         * reported so that an unwritable path is the only message */
        snprintf(tmp, sizeof tmp, "%s.tmp", o->out);
        fp = fopen(tmp, "wb");
        if (!fp) {
            snprintf(err, n, "%s: %s", tmp, strerror(errno));
            tmp[0] = 0;
            free(hbuf);
            goto done;
        }
    }
    if (log) {
        fprintf(log, "synth: %s %s (%s), seed %llu, routing skew %.2f, vocabulary %s\n", p->name,
                synth_mix_name((synth_mix)mix), synth_arch_name(p->arch),
                (unsigned long long)o->seed, (double)o->routing_skew, vocab_used);
        print_plan(log, &pl, o, file_bytes);
    }
    if (o->dry_run) {
        free(hbuf);
        rc = 0;
        goto done;
    }
    bool hok = fwrite(hbuf, 1, hlen, fp) == hlen && fflush(fp) == 0;
    free(hbuf);
    if (!hok) {
        snprintf(err, n, "%s: %s", tmp, strerror(errno));
        goto done;
    }
    const double t0 = now_s();
    if (o->header_only) {
        /* a sparse data section: a loader sees a complete file of all-zero weights */
        if (ftruncate(fileno(fp), (off_t)file_bytes) != 0) {
            snprintf(err, n, "%s: %s", tmp, strerror(errno));
            goto done;
        }
    } else {
        rank = malloc((size_t)(p->n_layer + p->nextn) * p->n_expert * sizeof *rank);
        home = malloc((size_t)(p->n_layer + p->nextn) * p->n_expert * sizeof *home);
        pool = threadpool_new(o->n_threads > 0 ? o->n_threads : threadpool_default_threads());
        if (!rank || !home || !pool) {
            snprintf(err, n, "out of memory");
            goto done;
        }
        make_ranks(p, o->seed, rank, home);
        const float E = (float)p->n_embd;
        synth_gen_ctx g = {.p = p, .seed = o->seed, .skew = o->routing_skew, .rank = rank,
                           .home = home, .emb_bias = sqrtf(E) / 4, .emb_topic = sqrtf(E) / 4};
        /* after RMSNorm a channel of value v reads v / rms; the embedding's rms is about
         * sqrt(1 + 2/16), and the scaled residual writes add about as much again */
        g.x_bias = g.emb_bias / sqrtf(1.5f);
        g.x_topic = g.emb_topic / sqrtf(1.5f);
        s.pl = &pl;
        s.g = &g;
        s.fd = fileno(fp);
        s.total = data_bytes;
        s.progress = o->progress;
        s.log = log;
        s.t0 = t0;
        s.last_pct = -1;
        if (build_pieces(&s, GGUF_DEFAULT_ALIGNMENT) != 0) {
            snprintf(err, n, "out of memory");
            goto done;
        }
        if (stream_data(&s, pool, err, n) != 0) goto done;
    }
    if (fclose(fp) != 0) {
        fp = NULL;
        snprintf(err, n, "%s: %s", tmp, strerror(errno));
        goto done;
    }
    fp = NULL;
    if (rename(tmp, o->out) != 0) {
        snprintf(err, n, "%s: %s", o->out, strerror(errno));
        goto done;
    }
    tmp[0] = 0;
    const double dt = now_s() - t0;
    if (log)
        fprintf(log, "synth: wrote %s: %.3f GB in %.1f s (%.2f GB/s)\n", o->out,
                (double)file_bytes / 1e9, dt, dt > 0 ? (double)file_bytes / dt / 1e9 : 0.0);
    rc = 0;
done:
    if (fp) fclose(fp);
    if (tmp[0]) remove(tmp);
    threadpool_free(pool);
    free(s.pieces);
    free(rank);
    free(home);
    gguf_writer_free(w);
    free(pl.t);
    return rc;
}
