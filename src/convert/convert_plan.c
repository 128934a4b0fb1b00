/* The converter's plan: which GGUF tensors to write (llama.cpp's names and shapes for qwen3moe
 * and qwen35moe; qwen4exp in convert_qwen4exp.c, with the helpers exported here), where each of their rows comes from in the checkpoint, what is done to the
 * values on the way (norm +1, A_log -> -exp, value-head reordering), the output types, and the
 * GGUF metadata. Checkpoint tensors are found under the plain names (model.layers.N...) or the
 * prefixes of multimodal and MLX checkpoints (model.language_model., language_model.). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_internal.h"
#include "formats/quant.h"


bool pl_failf(pctx *c, const char *fmt, ...) {
    if (!c->bad) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->n, fmt, ap);
        va_end(ap);
    }
    c->bad = true;
    return false;
}

/* The checkpoint tensor for a canonical name (model.layers.0.x / lm_head.weight) under any of
 * the prefixes checkpoints use. */
const st_tensor *pl_lookup(const pctx *c, const char *name) {
    const st_tensor *t = st_find(c->p->st, name);
    char alt[512];
    if (!t && strncmp(name, "model.", 6) == 0) {
        snprintf(alt, sizeof alt, "model.language_model.%s", name + 6);
        t = st_find(c->p->st, alt);
    }
    if (!t) {
        snprintf(alt, sizeof alt, "language_model.%s", name);
        t = st_find(c->p->st, alt);
    }
    return t;
}

static void shape_str(const st_tensor *t, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int d = 0; d < t->n_dims && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Shape [outer,] rows, cols, or [cols] for vectors (rows == 0). */
static bool has_shape(const st_tensor *t, int64_t outer, int64_t rows, int64_t cols) {
    if (rows == 0) return t->n_dims == 1 && t->shape[0] == cols;
    if (outer > 0)
        return t->n_dims == 3 && t->shape[0] == outer && t->shape[1] == rows && t->shape[2] == cols;
    return t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Find and check one checkpoint tensor: name (with ".weight" when weight is set), expected
 * logical shape [outer (0: none), rows (0: a vector), cols]. MLX-quantized tensors are the
 * uint32 codes plus .scales and .biases; FP8 ones carry .weight_scale_inv. */
bool pl_get_src(pctx *c, const char *base, bool weight, int64_t outer, int64_t rows,
                    int64_t cols, bool required, src_ref *s) {
    if (c->bad) return false;
    char name[512], aux[512];
    snprintf(name, sizeof name, "%s%s", base, weight ? ".weight" : "");
    memset(s, 0, sizeof *s);
    const st_tensor *t = pl_lookup(c, name);
    if (!t) return required ? pl_failf(c, "missing tensor '%s'", name) : false;
    s->w = t;
    s->outer = outer > 0 ? outer : 1;
    s->rows = rows > 0 ? rows : 1;
    s->cols = cols;
    char have[128];
    shape_str(t, have, sizeof have);
    const int lead = outer > 0 ? 1 : 0;
    if (t->dtype == ST_U32 && rows > 0) {
        s->kind = SRC_MLX;
        snprintf(aux, sizeof aux, "%s.scales", base);
        s->scale = pl_lookup(c, aux);
        snprintf(aux, sizeof aux, "%s.biases", base);
        s->bias = pl_lookup(c, aux);
        if (!s->scale || !s->bias)
            return pl_failf(c, "tensor '%s' is uint32 but has no .scales/.biases (MLX affine)", name);
        const int64_t packed = t->shape[t->n_dims - 1];
        const int64_t ngroups = s->scale->shape[s->scale->n_dims - 1];
        bool ok = t->n_dims == 2 + lead && t->shape[lead] == rows && (!lead || t->shape[0] == outer) &&
                  packed > 0 && ngroups > 0 && (packed * 32) % cols == 0 && cols % ngroups == 0;
        s->mlx_bits = ok ? (int)(packed * 32 / cols) : 0;
        s->mlx_group = ok ? (int)(cols / ngroups) : 0;
        ok = ok && quant_mlx_type(s->mlx_bits, s->mlx_group, false) >= 0 &&
             s->scale->n_dims == t->n_dims && s->bias->n_dims == t->n_dims &&
             s->scale->shape[lead] == rows && s->bias->shape[lead] == rows &&
             s->bias->shape[t->n_dims - 1] == ngroups && (!lead || (s->scale->shape[0] == outer &&
                                                                   s->bias->shape[0] == outer));
        if (!ok)
            return pl_failf(c, "MLX tensor '%s' %s does not pack %lld x %lld values in 2/3/4/5/6/8 "
                         "bits with groups of 32/64/128", name, have, (long long)rows,
                         (long long)cols);
        if (s->scale->dtype != s->bias->dtype ||
            (s->scale->dtype != ST_F16 && s->scale->dtype != ST_BF16 && s->scale->dtype != ST_F32))
            return pl_failf(c, "MLX tensor '%s': scales/biases must be F16, BF16 or F32 alike", name);
        s->mlx_bf16 = s->scale->dtype == ST_BF16;
        return true;
    }
    if (!st_is_float(t->dtype))
        return pl_failf(c, "tensor '%s' has dtype %s, which is not supported here", name,
                     st_dtype_name(t->dtype));
    if (!has_shape(t, outer, rows, cols)) {
        if (rows == 0) return pl_failf(c, "tensor '%s' has shape %s, expected [%lld]", name, have, (long long)cols);
        if (outer > 0)
            return pl_failf(c, "tensor '%s' has shape %s, expected [%lld, %lld, %lld]", name, have,
                         (long long)outer, (long long)rows, (long long)cols);
        return pl_failf(c, "tensor '%s' has shape %s, expected [%lld, %lld]", name, have,
                     (long long)rows, (long long)cols);
    }
    s->kind = SRC_FLOAT;
    if (t->dtype == ST_F8_E4M3 || t->dtype == ST_F8_E5M2) {
        s->kind = SRC_FP8;
        snprintf(aux, sizeof aux, "%s.weight_scale_inv", base);
        s->scale = weight ? pl_lookup(c, aux) : NULL;
        s->fp8_br = c->p->cfg.fp8 ? c->p->cfg.fp8_block[0] : 128;
        s->fp8_bc = c->p->cfg.fp8 ? c->p->cfg.fp8_block[1] : 128;
        if (s->scale) {
            const st_tensor *sc = s->scale;
            int64_t R = rows > 0 ? rows : 1;
            bool ok = st_is_float(sc->dtype) && sc->n_dims == (rows > 0 ? 2 : 1) + lead &&
                      (!lead || sc->shape[0] == outer) &&
                      (rows == 0 || sc->shape[lead] == cdiv(R, s->fp8_br)) &&
                      sc->shape[sc->n_dims - 1] == cdiv(cols, s->fp8_bc);
            if (!ok)
                return pl_failf(c, "tensor '%s.weight_scale_inv' does not hold one scale per %lldx%lld "
                             "block of '%s'", base, (long long)s->fp8_br, (long long)s->fp8_bc, name);
        } else {
            /* one scale for the whole tensor (per-tensor FP8, e.g. the n-gram table shards) */
            snprintf(aux, sizeof aux, "%s.weight_scale", base);
            const st_tensor *g = weight ? pl_lookup(c, aux) : NULL;
            if (g && st_is_float(g->dtype) && st_nelements(g) == 1) {
                s->scale = g;
                s->fp8_global = true;
            } else if (g) {
                return pl_failf(c, "tensor '%s.weight_scale' is not one scale for '%s'", base, name);
            } else {
                conv_note(c->note, c->nctx, "FP8 tensor '%s' has no weight_scale_inv: scale 1",
                          name);
            }
        }
    }
    return true;
}

/* ---- output tensors ------------------------------------------------------------------------ */

out_tensor *pl_add_out(pctx *c, const char *fmt, ...) {
    conv_plan *p = c->p;
    if (c->bad) return NULL;
    if (p->n_t == p->cap_t) {
        int cap = p->cap_t ? p->cap_t * 2 : 64;
        out_tensor *nt = realloc(p->t, (size_t)cap * sizeof *nt);
        if (!nt) {
            pl_failf(c, "out of memory");
            return NULL;
        }
        p->t = nt;
        p->cap_t = cap;
    }
    out_tensor *t = &p->t[p->n_t++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->ne[0] = t->ne[1] = t->ne[2] = t->ne[3] = 1;
    return t;
}

uint32_t plan_fit_type(uint32_t type, int64_t ne0) {
    const quant_traits *q = quant_traits_of(type);
    if (q && ne0 % q->block_elems == 0) return type;
    if (q && q->block_elems == QK_K && ne0 % 32 == 0) return GGML_TYPE_Q8_0;
    return GGML_TYPE_F16;
}

/* The type a weight matrix is written in: the one asked for (fitted to its row length), or in
 * auto mode the checkpoint's own precision: F32/F16/BF16 as stored, FP8 as BF16, MLX as the
 * same MLX variant (F32 scales: the f16 variant). */
uint32_t pl_weight_type(const pctx *c, const src_ref *s, int64_t ne0) {
    if (c->type != CONVERT_TYPE_AUTO) return plan_fit_type((uint32_t)c->type, ne0);
    switch (s->kind) {
    case SRC_MLX: return (uint32_t)quant_mlx_type(s->mlx_bits, s->mlx_group, s->mlx_bf16);
    case SRC_FP8: return GGML_TYPE_BF16;
    default:
        switch (s->w->dtype) {
        case ST_F16: return GGML_TYPE_F16;
        case ST_BF16: return GGML_TYPE_BF16;
        default: return GGML_TYPE_F32;
        }
    }
}

/* A vector (1-D output, always F32). */
void pl_vec(pctx *c, const char *out, const char *src, bool weight, int64_t n, enum elem_op op) {
    src_ref s;
    if (!pl_get_src(c, src, weight, 0, 0, n, true, &s)) return;
    out_tensor *t = pl_add_out(c, "%s", out);
    if (!t || !(t->src = malloc(sizeof s))) {
        pl_failf(c, "out of memory");
        return;
    }
    *t->src = s;
    t->n_src = 1;
    t->n_dims = 1;
    t->ne[0] = n;
    t->type = GGML_TYPE_F32;
    t->op = op;
}

/* A matrix [rows, cols] in the checkpoint -> GGUF ne [cols, rows]; f32 forces F32. */
out_tensor *pl_mat(pctx *c, const char *out, const char *src, int64_t rows, int64_t cols,
                       bool f32) {
    src_ref s;
    if (!pl_get_src(c, src, true, 0, rows, cols, true, &s)) return NULL;
    out_tensor *t = pl_add_out(c, "%s", out);
    if (!t || !(t->src = malloc(sizeof s))) {
        pl_failf(c, "out of memory");
        return NULL;
    }
    *t->src = s;
    t->n_src = 1;
    t->n_dims = 2;
    t->ne[0] = cols;
    t->ne[1] = rows;
    t->type = f32 ? GGML_TYPE_F32 : pl_weight_type(c, &s, cols);
    return t;
}

/* Routed experts of layer L, three GGUF tensors [cols, rows, E]: per-expert checkpoint tensors
 * (mlp.experts.N.{gate,up,down}_proj), the fused 3-D form (mlp.experts.gate_up_proj [E, 2I, H]
 * with gate rows first, mlp.experts.down_proj [E, H, I]), or MLX's switch_mlp stacks. */
void pl_experts(pctx *c, const char *pre, int L) {
    const hf_config *h = &c->p->cfg;
    const int64_t E = h->n_expert, H = h->hidden, I = h->ff_exp;
    static const char *parts[3] = {"gate", "up", "down"};
    char base[256];
    snprintf(base, sizeof base, "%s.mlp.experts.gate_up_proj", pre);
    const bool fused = pl_lookup(c, base) != NULL;
    snprintf(base, sizeof base, "%s.mlp.switch_mlp.gate_proj.weight", pre);
    const bool mlx = pl_lookup(c, base) != NULL;
    for (int p = 0; p < 3 && !c->bad; p++) {
        const int64_t rows = p == 2 ? H : I, cols = p == 2 ? I : H;
        out_tensor *t = pl_add_out(c, "blk.%d.ffn_%s_exps.weight", L, parts[p]);
        if (!t) return;
        t->n_dims = 3;
        t->ne[0] = cols;
        t->ne[1] = rows;
        t->ne[2] = E;
        t->n_src = fused || mlx ? 1 : (int)E;
        if (!(t->src = calloc((size_t)t->n_src, sizeof *t->src))) {
            pl_failf(c, "out of memory");
            return;
        }
        if (fused) {
            snprintf(base, sizeof base, "%s.mlp.experts.%s", pre,
                     p == 2 ? "down_proj" : "gate_up_proj");
            pl_get_src(c, base, false, E, p == 2 ? H : 2 * I, cols, true, t->src);
            t->row_off = p == 1 ? I : 0;
        } else if (mlx) {
            snprintf(base, sizeof base, "%s.mlp.switch_mlp.%s_proj", pre, parts[p]);
            pl_get_src(c, base, true, E, rows, cols, true, t->src);
        } else {
            for (int64_t e = 0; e < E && !c->bad; e++) {
                snprintf(base, sizeof base, "%s.mlp.experts.%lld.%s_proj", pre, (long long)e,
                         parts[p]);
                pl_get_src(c, base, true, 0, rows, cols, true, &t->src[e]);
            }
        }
        if (!c->bad) t->type = pl_weight_type(c, t->src, cols);
    }
}

/* GGUF position p of a value head takes the checkpoint's head (p mod Hk)*r + p/Hk: llama.cpp's
 * qwen35 converter reorders value heads from grouped (head h uses key head h/r) to tiled
 * (key head h mod Hk) order. Indices [0, offset) stay; the rest are heads of `block` entries. */
static int64_t *pl_vhead_perm(pctx *c, int64_t total, int64_t offset, int64_t block) {
    const hf_config *h = &c->p->cfg;
    const int64_t Hk = h->lin_k_heads, r = h->lin_v_heads / h->lin_k_heads;
    int64_t *perm = malloc((size_t)total * sizeof *perm);
    if (!perm) {
        pl_failf(c, "out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < total; i++) {
        if (i < offset) {
            perm[i] = i;
            continue;
        }
        const int64_t j = i - offset, pos = j / block, w = j % block;
        perm[i] = offset + ((pos % Hk) * r + pos / Hk) * block + w;
    }
    return perm;
}

void pl_linear_attention(pctx *c, const char *pre, int L) {
    const hf_config *h = &c->p->cfg;
    const int64_t H = h->hidden, Hv = h->lin_v_heads, dv = h->lin_v_dim;
    const int64_t KD = h->lin_k_heads * h->lin_k_dim, VD = Hv * dv, CD = 2 * KD + VD;
    char s[256];
    out_tensor *t;
    snprintf(s, sizeof s, "%s.linear_attn.in_proj_qkv", pre);
    if ((t = pl_mat(c, "", s, CD, H, false))) {
        snprintf(t->name, sizeof t->name, "blk.%d.attn_qkv.weight", L);
        t->rowperm = pl_vhead_perm(c, CD, 2 * KD, dv);
    }
    snprintf(s, sizeof s, "%s.linear_attn.in_proj_z", pre);
    if ((t = pl_mat(c, "", s, VD, H, false))) {
        snprintf(t->name, sizeof t->name, "blk.%d.attn_gate.weight", L);
        t->rowperm = pl_vhead_perm(c, VD, 0, dv);
    }
    /* conv1d: HF [C, 1, K], mlx-lm [C, K, 1], or already [C, K] */
    snprintf(s, sizeof s, "%s.linear_attn.conv1d.weight", pre);
    const st_tensor *cw = pl_lookup(c, s);
    if (!cw && !c->bad) pl_failf(c, "missing tensor '%s'", s);
    if (cw && !c->bad) {
        const int64_t K = h->conv_kernel;
        bool ok = (cw->n_dims == 3 && cw->shape[0] == CD &&
                   ((cw->shape[1] == 1 && cw->shape[2] == K) || (cw->shape[1] == K && cw->shape[2] == 1))) ||
                  (cw->n_dims == 2 && cw->shape[0] == CD && cw->shape[1] == K);
        if (!ok || !st_is_float(cw->dtype)) {
            pl_failf(c, "tensor '%s' is not a [%lld, 1, %lld] float convolution", s, (long long)CD,
                  (long long)K);
        } else if ((t = pl_add_out(c, "blk.%d.ssm_conv1d.weight", L)) && (t->src = calloc(1, sizeof *t->src))) {
            *t->src = (src_ref){.kind = SRC_FLOAT, .w = cw, .outer = 1, .rows = CD, .cols = K};
            t->n_src = 1;
            t->n_dims = 2;
            t->ne[0] = K;
            t->ne[1] = CD;
            t->type = GGML_TYPE_F32;
            t->rowperm = pl_vhead_perm(c, CD, 2 * KD, dv);
        } else {
            pl_failf(c, "out of memory");
        }
    }
    snprintf(s, sizeof s, "%s.linear_attn.dt_bias", pre);
    char o[96];
    snprintf(o, sizeof o, "blk.%d.ssm_dt.bias", L);
    pl_vec(c, o, s, false, Hv, OP_NONE);
    if (!c->bad) c->p->t[c->p->n_t - 1].colperm = pl_vhead_perm(c, Hv, 0, 1);
    snprintf(s, sizeof s, "%s.linear_attn.A_log", pre);
    snprintf(o, sizeof o, "blk.%d.ssm_a", L);
    pl_vec(c, o, s, false, Hv, OP_NEG_EXP);
    if (!c->bad) c->p->t[c->p->n_t - 1].colperm = pl_vhead_perm(c, Hv, 0, 1);
    snprintf(s, sizeof s, "%s.linear_attn.in_proj_b", pre);
    if ((t = pl_mat(c, "", s, Hv, H, false))) {
        snprintf(t->name, sizeof t->name, "blk.%d.ssm_beta.weight", L);
        t->rowperm = pl_vhead_perm(c, Hv, 0, 1);
    }
    snprintf(s, sizeof s, "%s.linear_attn.in_proj_a", pre);
    if ((t = pl_mat(c, "", s, Hv, H, false))) {
        snprintf(t->name, sizeof t->name, "blk.%d.ssm_alpha.weight", L);
        t->rowperm = pl_vhead_perm(c, Hv, 0, 1);
    }
    snprintf(s, sizeof s, "%s.linear_attn.norm", pre);
    snprintf(o, sizeof o, "blk.%d.ssm_norm.weight", L);
    pl_vec(c, o, s, true, dv, OP_NONE); /* gated norm: a plain multiplier, never +1 */
    snprintf(s, sizeof s, "%s.linear_attn.out_proj", pre);
    if ((t = pl_mat(c, "", s, H, VD, false))) {
        snprintf(t->name, sizeof t->name, "blk.%d.ssm_out.weight", L);
        t->colperm = pl_vhead_perm(c, VD, 0, dv);
    }
}

void pl_attention(pctx *c, const char *pre, int L, bool gated, enum elem_op norm_op) {
    const hf_config *h = &c->p->cfg;
    const int64_t H = h->hidden, Q = h->n_head * h->head_dim, K = h->n_head_kv * h->head_dim;
    char s[256], o[96];
    static const char *names[4] = {"q", "k", "v", "output"};
    static const char *src[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    /* Qwen3.5's q_proj holds, per head, the query then its output gate: twice the rows */
    const int64_t rows[4] = {gated ? 2 * Q : Q, K, K, H}, cols[4] = {H, H, H, Q};
    for (int i = 0; i < 4; i++) {
        snprintf(s, sizeof s, "%s.self_attn.%s", pre, src[i]);
        snprintf(o, sizeof o, "blk.%d.attn_%s.weight", L, names[i]);
        pl_mat(c, o, s, rows[i], cols[i], false);
    }
    snprintf(s, sizeof s, "%s.self_attn.q_norm", pre);
    snprintf(o, sizeof o, "blk.%d.attn_q_norm.weight", L);
    pl_vec(c, o, s, true, h->head_dim, norm_op);
    snprintf(s, sizeof s, "%s.self_attn.k_norm", pre);
    snprintf(o, sizeof o, "blk.%d.attn_k_norm.weight", L);
    pl_vec(c, o, s, true, h->head_dim, norm_op);
}

/* The shared expert of the MoE under `pre` (Qwen3.5 / qwen4exp): its sigmoid gate [1, H] as the
 * vector ffn_gate_inp_shexp, and ffn_{gate,up,down}_shexp. Absent gate: no shared expert.
 * false when the plan failed. */
bool pl_shared_expert(pctx *c, const char *pre, int L) {
    const hf_config *h = &c->p->cfg;
    const int64_t H = h->hidden, FS = h->ff_shexp;
    char s[256], o[96];
    snprintf(s, sizeof s, "%s.mlp.shared_expert_gate.weight", pre);
    if (!pl_lookup(c, s)) return !c->bad;
    if (FS <= 0) return pl_failf(c, "config.json: shared_expert_intermediate_size is missing");
    /* [1, H] in the checkpoint, a vector in GGUF */
    src_ref sr;
    snprintf(s, sizeof s, "%s.mlp.shared_expert_gate", pre);
    if (pl_get_src(c, s, true, 0, 1, H, true, &sr)) {
        /* (MLX quantizes it at 8 bits: dequantized here like any other source) */
        out_tensor *v = pl_add_out(c, "blk.%d.ffn_gate_inp_shexp.weight", L);
        if (v && (v->src = malloc(sizeof sr))) {
            *v->src = sr;
            v->n_src = 1;
            v->n_dims = 1;
            v->ne[0] = H;
            v->type = GGML_TYPE_F32;
        } else {
            pl_failf(c, "out of memory");
        }
    }
    static const char *sp[3] = {"gate", "up", "down"};
    for (int k = 0; k < 3; k++) {
        snprintf(s, sizeof s, "%s.mlp.shared_expert.%s_proj", pre, sp[k]);
        snprintf(o, sizeof o, "blk.%d.ffn_%s_shexp.weight", L, sp[k]);
        pl_mat(c, o, s, k == 2 ? H : FS, k == 2 ? FS : H, false);
    }
    return !c->bad;
}

/* What the plan does not use: vision towers, MTP blocks (unless converted) and the like. */
static void note_unused(const pctx *c) {
    const conv_plan *p = c->p;
    size_t ignored = 0;
    const char *example = NULL;
    size_t total = st_count(p->st);
    for (size_t i = 0; i < total; i++) {
        const char *nm = st_at(p->st, i)->name;
        if (strstr(nm, "visual.") || (strstr(nm, "mtp.") && p->nextn == 0) || strstr(nm, "vision")) {
            ignored++;
            if (!example) example = nm;
        }
    }
    if (ignored)
        conv_note(c->note, c->nctx, "ignoring %zu tensors that text inference does not use "
                  "(e.g. '%s')", ignored, example);
}

int plan_tensors(conv_plan *p, int type, note_fn note, void *nctx, char *err, size_t n) {
    pctx c = {.p = p, .note = note, .nctx = nctx, .err = err, .n = n, .type = type};
    const hf_config *h = &p->cfg;
    if (h->arch == ARCH_QWEN4EXP) {
        if (!q4x_plan_tensors(&c)) return -1;
        note_unused(&c);
        return 0;
    }
    const bool q35 = h->arch == ARCH_QWEN35MOE;
    const int64_t H = h->hidden, V = h->vocab;
    char s[256], o[96];
    /* zero-centered norms (Qwen3.5) are stored as offsets from 1 by HF: GGUF holds 1 + w.
     * mlx-lm's sanitize adds the 1 itself and moves conv1d's kernel axis last ([C, K, 1]), so
     * that layout tells a file whose norms are already 1 + w; look before planning the norms. */
    if (q35) {
        for (int L = 0; L < h->n_layer; L++) {
            if (!h->recurrent[L]) continue;
            snprintf(s, sizeof s, "model.layers.%d.linear_attn.conv1d.weight", L);
            const st_tensor *cw = pl_lookup(&c, s);
            if (cw && cw->n_dims == 3 && cw->shape[2] == 1 && h->conv_kernel != 1)
                p->mlx_norms_shifted = true;
            break;
        }
    }
    const enum elem_op norm_op = q35 && !p->mlx_norms_shifted ? OP_PLUS1 : OP_NONE;
    pl_mat(&c, "token_embd.weight", "model.embed_tokens", V, H, false);
    pl_vec(&c, "output_norm.weight", "model.norm", true, H, norm_op);
    if (!h->tie || pl_lookup(&c, "lm_head.weight")) {
        if (h->tie) conv_note(note, nctx, "tie_word_embeddings is set but lm_head.weight exists: "
                              "writing it as output.weight");
        pl_mat(&c, "output.weight", "lm_head", V, H, false);
    }
    for (int L = 0; L < h->n_layer && !c.bad; L++) {
        char pre[64];
        snprintf(pre, sizeof pre, "model.layers.%d", L);
        snprintf(s, sizeof s, "model.layers.%d.input_layernorm", L);
        snprintf(o, sizeof o, "blk.%d.attn_norm.weight", L);
        pl_vec(&c, o, s, true, H, norm_op);
        if (q35 && h->recurrent[L]) {
            pl_linear_attention(&c, pre, L);
        } else {
            pl_attention(&c, pre, L, q35, norm_op);
        }
        snprintf(s, sizeof s, "model.layers.%d.post_attention_layernorm", L);
        snprintf(o, sizeof o, q35 ? "blk.%d.post_attention_norm.weight" : "blk.%d.ffn_norm.weight", L);
        pl_vec(&c, o, s, true, H, norm_op);
        snprintf(s, sizeof s, "model.layers.%d.mlp.gate", L);
        snprintf(o, sizeof o, "blk.%d.ffn_gate_inp.weight", L);
        pl_mat(&c, o, s, h->n_expert, H, true); /* the router stays F32, as llama.cpp keeps it */
        pl_experts(&c, pre, L);
        if (q35 && !pl_shared_expert(&c, pre, L)) break;
    }
    if (c.bad) return -1;
    note_unused(&c);
    return 0;
}

/* ---- metadata ------------------------------------------------------------------------------ */

/* llama.cpp's general.file_type (LLAMA_FTYPE) for a uniform output type; -1: none fits. */
static int file_type(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: return 0;
    case GGML_TYPE_F16: return 1;
    case GGML_TYPE_Q4_0: return 2;
    case GGML_TYPE_Q4_1: return 3;
    case GGML_TYPE_Q8_0: return 7;
    case GGML_TYPE_Q5_0: return 8;
    case GGML_TYPE_Q5_1: return 9;
    case GGML_TYPE_Q2_K: return 10;
    case GGML_TYPE_Q3_K: return 11;
    case GGML_TYPE_Q4_K: return 14;
    case GGML_TYPE_Q5_K: return 16;
    case GGML_TYPE_Q6_K: return 18;
    case GGML_TYPE_IQ2_XXS: return 19;
    case GGML_TYPE_IQ2_XS: return 20;
    case GGML_TYPE_IQ3_XXS: return 23;
    case GGML_TYPE_IQ4_NL: return 25;
    case GGML_TYPE_IQ3_S: return 26;
    case GGML_TYPE_IQ2_S: return 28;
    case GGML_TYPE_IQ4_XS: return 30;
    case GGML_TYPE_BF16: return 32;
    default: return -1;
    }
}

#define W(call)                                                                                \
    do {                                                                                       \
        if ((call) != 0) {                                                                     \
            snprintf(err, n, "out of memory writing metadata");                               \
            return -1;                                                                         \
        }                                                                                      \
    } while (0)

int plan_metadata(const conv_plan *p, gguf_writer *w, const char *name, int type, char *err,
                  size_t n) {
    const hf_config *h = &p->cfg;
    const hf_vocab *v = &p->vocab;
    const char *a = h->arch_name;
    char k[128];
#define KEY(s) (snprintf(k, sizeof k, "%s." s, a), k)
    W(gguf_w_str(w, "general.architecture", a));
    W(gguf_w_str(w, "general.name", name));
    /* the type of the largest tensors (the routed experts, else the last matrix) */
    uint32_t main_type = GGML_TYPE_F32;
    for (int i = 0; i < p->n_t; i++)
        if (p->t[i].n_dims >= 2 && strstr(p->t[i].name, "_exps")) main_type = p->t[i].type;
    int ft = file_type(type == CONVERT_TYPE_AUTO ? main_type : (uint32_t)type);
    if (ft >= 0) W(gguf_w_u32(w, "general.file_type", (uint32_t)ft));
    const quant_traits *mq = quant_traits_of(main_type);
    if (mq && mq->is_quantized) W(gguf_w_u32(w, "general.quantization_version", 2));
    W(gguf_w_u32(w, KEY("block_count"), (uint32_t)(h->n_layer + p->nextn)));
    W(gguf_w_u32(w, KEY("context_length"), (uint32_t)h->ctx));
    W(gguf_w_u32(w, KEY("embedding_length"), (uint32_t)h->hidden));
    if (h->ff > 0) W(gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)h->ff));
    W(gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)h->n_head));
    W(gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)h->n_head_kv));
    W(gguf_w_f32(w, KEY("rope.freq_base"), (float)h->rope_theta));
    W(gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), (float)h->eps));
    W(gguf_w_u32(w, KEY("expert_used_count"), (uint32_t)h->n_expert_used));
    W(gguf_w_u32(w, KEY("expert_count"), (uint32_t)h->n_expert));
    W(gguf_w_u32(w, KEY("attention.key_length"), (uint32_t)h->head_dim));
    W(gguf_w_u32(w, KEY("attention.value_length"), (uint32_t)h->head_dim));
    W(gguf_w_u32(w, KEY("expert_feed_forward_length"), (uint32_t)h->ff_exp));
    if (h->arch != ARCH_QWEN3MOE) {
        if (h->ff_shexp > 0)
            W(gguf_w_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)h->ff_shexp));
        W(gguf_w_u32(w, KEY("rope.dimension_count"),
                     (uint32_t)((double)h->head_dim * h->partial_rotary)));
        if (h->has_mrope) {
            W(gguf_w_arr(w, KEY("rope.dimension_sections"), GGUF_VT_I32, h->mrope, 4));
        } else if (h->arch == ARCH_QWEN4EXP) { /* llama.cpp writes transformers' default */
            static const int32_t def[4] = {11, 11, 10, 0};
            W(gguf_w_arr(w, KEY("rope.dimension_sections"), GGUF_VT_I32, def, 4));
        }
        W(gguf_w_u32(w, KEY("ssm.conv_kernel"), (uint32_t)h->conv_kernel));
        W(gguf_w_u32(w, KEY("ssm.state_size"), (uint32_t)h->lin_k_dim));
        W(gguf_w_u32(w, KEY("ssm.group_count"), (uint32_t)h->lin_k_heads));
        W(gguf_w_u32(w, KEY("ssm.time_step_rank"), (uint32_t)h->lin_v_heads));
        W(gguf_w_u32(w, KEY("ssm.inner_size"), (uint32_t)(h->lin_v_heads * h->lin_v_dim)));
        if (h->arch == ARCH_QWEN4EXP) {
            if (q4x_metadata(p, w, err, n) != 0) return -1;
        } else if (h->full_attn_interval > 0) {
            W(gguf_w_u32(w, KEY("full_attention_interval"), (uint32_t)h->full_attn_interval));
        } else {
            int32_t *flags = malloc((size_t)h->n_layer * sizeof *flags);
            if (!flags) {
                snprintf(err, n, "out of memory");
                return -1;
            }
            for (int64_t i = 0; i < h->n_layer; i++) flags[i] = h->recurrent[i];
            int rc = gguf_w_arr(w, KEY("attention.recurrent_layers"), GGUF_VT_I32, flags,
                                (uint64_t)h->n_layer);
            free(flags);
            W(rc);
        }
    } else if (h->partial_rotary < 1.0) {
        W(gguf_w_u32(w, KEY("rope.dimension_count"),
                     (uint32_t)((double)h->head_dim * h->partial_rotary)));
    }
#undef KEY
    W(gguf_w_str(w, "tokenizer.ggml.model", "gpt2"));
    W(gguf_w_str(w, "tokenizer.ggml.pre", v->pre));
    W(gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, (uint64_t)v->n));
    W(gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, v->types, (uint64_t)v->n));
    W(gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges,
                     (uint64_t)v->n_merges));
    if (v->bos >= 0) W(gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos));
    if (v->eos >= 0) W(gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos));
    if (v->unk >= 0) W(gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)v->unk));
    if (v->pad >= 0) W(gguf_w_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad));
    if (v->add_bos >= 0) W(gguf_w_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos != 0));
    if (v->add_eos >= 0) W(gguf_w_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos != 0));
    if (v->chat_template) W(gguf_w_str(w, "tokenizer.chat_template", v->chat_template));
    return 0;
}
#undef W

void plan_free(conv_plan *p) {
    for (int i = 0; i < p->n_t; i++) {
        free(p->t[i].src);
        free(p->t[i].rowperm);
        free(p->t[i].colperm);
        free(p->t[i].rowcat);
    }
    free(p->t);
    p->t = NULL;
    p->n_t = p->cap_t = 0;
}
