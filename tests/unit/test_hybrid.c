/* Hybrid models (qwen35moe, qwen3next) end to end on the qwen35moe-tiny-F32 fixture:
 *
 * 1. Prefill/decode equivalence with a prompt of 220 tokens (chunk boundaries at 64, 128, 192
 *    crossed): the last position's logits from one batch, from batches of 64 and of 7, and
 *    from token-by-token decoding. The default prefill (the per-token recurrence) must be
 *    bit-identical to decoding; the chunked prefill (chunk 64, selected in the model state)
 *    must agree within 1e-5 relative, at the last position and over all positions.
 * 2. A session reset clears the recurrent state: re-evaluating gives the same bits.
 * 3. State bytes: KV for the attention layer only, sized to n_ctx, plus the recurrent and conv
 *    state, as sluice_session_state_breakdown reports.
 * 4. qwen3next: the fixture rewritten as a qwen3next file (value heads in grouped order, fused
 *    ssm_ba; once with attn_qkv + attn_gate, once with the legacy fused ssm_in) must give the
 *    qwen35moe logits at every prompt position within 1e-5 relative (only the summation order
 *    of the permuted ssm_out columns differs).
 * 5. An appended MTP block and the layer pattern as a flag array leave the main pass as is. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixtures.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "models/hybrid.h"
#include "sluice.h"

#define NAME "qwen35moe-tiny-F32"

static int32_t *read_ids(const char *path, int *n) {
    FILE *fp = fopen(path, "r");
    if (!fp) return NULL;
    int32_t *ids = malloc(4096 * sizeof *ids);
    int k = 0;
    long v;
    while (k < 4096 && fscanf(fp, "%ld", &v) == 1) ids[k++] = (int32_t)v;
    fclose(fp);
    *n = k;
    return ids;
}

static double rel(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* Last-position logits through the public API, the prompt in batches of `batch` (1: decode). */
static float *eval_last(sluice_model *m, const int32_t *ids, int n, int batch, int n_ctx) {
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    sluice_session_params sp = {.n_ctx = n_ctx, .n_batch = batch, .n_threads = 2};
    sluice_session *s = sluice_session_new(m, &sp);
    if (!s) return NULL;
    bool ok = true;
    if (batch == 1)
        for (int t = 0; ok && t < n; t++) ok = sluice_session_eval(s, &ids[t], 1, NULL) == 0;
    else ok = sluice_session_eval(s, ids, n, NULL) == 0;
    float *out = NULL;
    if (ok) {
        out = malloc((size_t)info.n_vocab * sizeof *out);
        memcpy(out, sluice_session_logits(s), (size_t)info.n_vocab * sizeof *out);
    }
    sluice_session_free(s);
    return out;
}

/* All-position logits through the model's forward directly, with the delta rule's prefill
 * form chosen (chunk 0: recurrence), the prompt in batches of `batch`. */
static float *eval_internal(const sluice_model *m, const int32_t *ids, int n, int batch, int chunk) {
    const int V = m->hp.n_vocab;
    backend *be = backend_cpu_new(2);
    model_state *st = be ? m->arch->state_new(m, be, n, batch) : NULL;
    float *lg = malloc((size_t)n * V * sizeof *lg);
    if (!st || !be || !lg) abort();
    st->hybrid->gdn_chunk = chunk;
    for (int t0 = 0; t0 < n; t0 += batch) {
        int k = n - t0 < batch ? n - t0 : batch;
        CHECK(m->arch->forward(m, st, be, ids + t0, k, t0, lg + (size_t)t0 * V, true) == 0);
    }
    m->arch->state_free(st);
    be_free(be);
    return lg;
}

static void test_equivalence(sluice_model *m, const int32_t *prompt, int n_prompt) {
    const int V = m->hp.n_vocab;
    enum { N = 220 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = prompt[i % n_prompt];

    float *dec = eval_last(m, ids, N, 1, N);
    float *one = eval_last(m, ids, N, N, N);
    float *b64 = eval_last(m, ids, N, 64, N);
    float *b7 = eval_last(m, ids, N, 7, N);
    CHECK(dec && one && b64 && b7);
    if (!dec || !one || !b64 || !b7) return;
    CHECKF(memcmp(one, dec, (size_t)V * 4) == 0, "one batch differs from decoding");
    CHECKF(memcmp(b64, dec, (size_t)V * 4) == 0, "batches of 64 differ from decoding");
    CHECKF(memcmp(b7, dec, (size_t)V * 4) == 0, "batches of 7 differ from decoding");

    /* the chunked prefill: one batch of 220 and batches of 100 (chunks restart per batch) */
    float *rec = eval_internal(m, ids, N, N, 0);
    float *chk = eval_internal(m, ids, N, N, 64);
    float *chk100 = eval_internal(m, ids, N, 100, 64);
    const float *last_rec = rec + (size_t)(N - 1) * V;
    CHECKF(memcmp(last_rec, dec, (size_t)V * 4) == 0, "internal recurrence differs");
    double e_last = rel(chk + (size_t)(N - 1) * V, dec, V);
    double e_last100 = rel(chk100 + (size_t)(N - 1) * V, dec, V);
    double e_max = 0, e_sum = 0;
    for (int t = 0; t < N; t++) {
        double e = rel(chk + (size_t)t * V, rec + (size_t)t * V, V);
        e_max = e > e_max ? e : e_max;
        e_sum += e;
    }
    printf("prefill/decode, %d tokens: recurrent prefill (1 batch, batches of 64 and 7) vs "
           "decode bit-identical: %s; chunked (64) prefill vs decode at the last position: "
           "%.3g (one batch), %.3g (batches of 100); over all positions: mean %.3g, max %.3g\n",
           N,
           memcmp(one, dec, (size_t)V * 4) == 0 && memcmp(b64, dec, (size_t)V * 4) == 0 &&
                   memcmp(b7, dec, (size_t)V * 4) == 0
               ? "yes"
               : "NO",
           e_last, e_last100, e_sum / N, e_max);
    CHECKF(e_last <= 1e-5, "chunked prefill vs decode: %g", e_last);
    CHECKF(e_last100 <= 1e-5, "chunked prefill (batches of 100) vs decode: %g", e_last100);
    CHECKF(e_max <= 1e-5, "chunked vs recurrent prefill, worst position: %g", e_max);
    free(dec), free(one), free(b64), free(b7), free(rec), free(chk), free(chk100);
}

static void test_reset_and_bytes(sluice_model *m, const int32_t *ids, int n) {
    const int V = m->hp.n_vocab, n_ctx = 300;
    sluice_session_params sp = {.n_ctx = n_ctx, .n_threads = 2};
    sluice_session *s = sluice_session_new(m, &sp);
    CHECK(s != NULL);
    if (!s) return;
    float *a = malloc((size_t)V * 4);
    CHECK(sluice_session_argmax(s) == -1); /* no logits yet */
    CHECK(sluice_session_eval(s, ids, n, NULL) == 0);
    memcpy(a, sluice_session_logits(s), (size_t)V * 4);
    CHECK(sluice_session_argmax(s) == sluice_argmax(a, V));
    sluice_session_reset(s);
    CHECK(sluice_session_argmax(s) == -1);
    CHECK(sluice_session_eval(s, ids, n, NULL) == 0);
    CHECKF(memcmp(a, sluice_session_logits(s), (size_t)V * 4) == 0,
           "a reset session gives other logits: recurrent state not cleared");

    /* 1 attention layer: n_ctx x 2 KV heads x (64 + 64) floats; 1 recurrent layer: 4 value
     * heads x 64 x 64 state + 3 rows x 512 conv channels */
    const hparams *hp = &m->hp;
    CHECK(hp->n_layer == 2 && hp->n_layer_recurrent == 1 && m->layers[0].recurrent &&
          !m->layers[1].recurrent);
    uint64_t kv = 0, recur = 0;
    sluice_session_state_breakdown(s, &kv, &recur);
    const uint64_t want_kv = (uint64_t)n_ctx * 2 * (64 + 64) * 4;
    const uint64_t want_rec = (4ull * 64 * 64 + 3ull * 512) * 4;
    printf("state: %llu bytes = KV %llu + recurrent %llu (n_ctx %d)\n",
           (unsigned long long)sluice_session_state_bytes(s), (unsigned long long)kv,
           (unsigned long long)recur, n_ctx);
    CHECK(kv == want_kv && recur == want_rec);
    CHECK(sluice_session_state_bytes(s) == want_kv + want_rec);
    free(a);
    sluice_session_free(s);
}

/* ---- qwen3next from the qwen35moe fixture ------------------------------------------------- */

typedef struct conv_ctx {
    const gguf_file *g;
    int Hk, Hv, r, Dk, Dv, KD, VD, CD, E, K;
    void *bufs[64];
    int n_bufs;
} conv_ctx;

static float *buf_new(conv_ctx *c, size_t floats) {
    float *p = calloc(floats, sizeof *p);
    c->bufs[c->n_bufs++] = p;
    return p;
}

/* grouped value head G = g*r + j holds what tiled head j*Hk + g held */
static int src_head(const conv_ctx *c, int G) { return (G % c->r) * c->Hk + G / c->r; }

static const float *tensor_f32(const conv_ctx *c, const char *name, const gguf_tensor **t) {
    *t = gguf_find_tensor(c->g, name);
    if (!*t || (*t)->type != 0) abort(); /* the F32 fixture */
    return (*t)->data;
}

static int add_renamed_kv(gguf_writer *w, const gguf_kv *kv, const char *key) {
    char tmp[256];
    switch (kv->type) {
    case GGUF_VT_U8: return gguf_w_u8(w, key, (uint8_t)kv->v.u);
    case GGUF_VT_U32: return gguf_w_u32(w, key, (uint32_t)kv->v.u);
    case GGUF_VT_I32: return gguf_w_i32(w, key, (int32_t)kv->v.i);
    case GGUF_VT_U64: return gguf_w_u64(w, key, kv->v.u);
    case GGUF_VT_F32: return gguf_w_f32(w, key, (float)kv->v.f);
    case GGUF_VT_BOOL: return gguf_w_bool(w, key, kv->v.u != 0);
    case GGUF_VT_STRING:
        snprintf(tmp, sizeof tmp, "%.*s", (int)kv->v.s.len, kv->v.s.ptr);
        return gguf_w_str(w, key, tmp);
    case GGUF_VT_ARRAY:
        if (kv->arr_type != GGUF_VT_STRING)
            return gguf_w_arr(w, key, kv->arr_type, kv->arr_data, kv->arr_n);
        return -1;
    default: return -1;
    }
}

/* The fixture as a qwen3next GGUF in memory; legacy: ssm_in instead of attn_qkv + attn_gate. */
static uint8_t *make_qwen3next(const char *path, bool legacy, size_t *len) {
    char err[256];
    gguf_file *g = gguf_open(path, err, sizeof err);
    if (!g) return NULL;
    conv_ctx c = {.g = g, .Hk = 2, .Hv = 4, .r = 2, .Dk = 64, .Dv = 64, .E = 256, .K = 4};
    c.KD = c.Hk * c.Dk, c.VD = c.Hv * c.Dv, c.CD = 2 * c.KD + c.VD;
    gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        int rc;
        if (strcmp(kv->key, "general.architecture") == 0) {
            rc = gguf_w_str(w, kv->key, "qwen3next");
        } else if (strncmp(kv->key, "qwen35moe.", 10) == 0) {
            char key[160];
            snprintf(key, sizeof key, "qwen3next.%s", kv->key + 10);
            rc = add_renamed_kv(w, kv, key);
        } else {
            rc = gguf_w_copy_kv(w, kv);
        }
        CHECK(rc == 0);
    }
    const size_t F = sizeof(float);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (strncmp(t->name, "blk.0.", 6) != 0) {
            gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
            continue;
        }
        const char *base = t->name + 6;
        const gguf_tensor *src;
        if (strcmp(base, "attn_qkv.weight") == 0) {
            const float *qkv = tensor_f32(&c, "blk.0.attn_qkv.weight", &src);
            const float *z = tensor_f32(&c, "blk.0.attn_gate.weight", &src);
            if (legacy) {
                /* per key head g: q_g, k_g, v of heads g*r.., z of heads g*r.. (rows of E) */
                const int rows = 2 * c.KD + 2 * c.VD, grp = 2 * c.Dk + 2 * c.r * c.Dv;
                float *in = buf_new(&c, (size_t)rows * c.E);
                for (int gk = 0; gk < c.Hk; gk++) {
                    float *o = in + (size_t)gk * grp * c.E;
                    memcpy(o, qkv + (size_t)gk * c.Dk * c.E, (size_t)c.Dk * c.E * F);
                    memcpy(o + (size_t)c.Dk * c.E, qkv + (size_t)(c.KD + gk * c.Dk) * c.E,
                           (size_t)c.Dk * c.E * F);
                    for (int j = 0; j < c.r; j++) {
                        const int T = src_head(&c, gk * c.r + j);
                        memcpy(o + (size_t)(2 * c.Dk + j * c.Dv) * c.E,
                               qkv + (size_t)(2 * c.KD + T * c.Dv) * c.E, (size_t)c.Dv * c.E * F);
                        memcpy(o + (size_t)(2 * c.Dk + (c.r + j) * c.Dv) * c.E,
                               z + (size_t)T * c.Dv * c.E, (size_t)c.Dv * c.E * F);
                    }
                }
                int64_t ne[2] = {c.E, rows};
                gguf_w_tensor(w, "blk.0.ssm_in.weight", 0, 2, ne, in);
            } else {
                float *o = buf_new(&c, (size_t)c.CD * c.E);
                memcpy(o, qkv, (size_t)2 * c.KD * c.E * F);
                for (int G = 0; G < c.Hv; G++)
                    memcpy(o + (size_t)(2 * c.KD + G * c.Dv) * c.E,
                           qkv + (size_t)(2 * c.KD + src_head(&c, G) * c.Dv) * c.E,
                           (size_t)c.Dv * c.E * F);
                gguf_w_tensor(w, t->name, 0, t->n_dims, t->ne, o);
            }
        } else if (strcmp(base, "attn_gate.weight") == 0) {
            if (legacy) continue; /* inside ssm_in */
            const float *z = tensor_f32(&c, t->name, &src);
            float *o = buf_new(&c, (size_t)c.VD * c.E);
            for (int G = 0; G < c.Hv; G++)
                memcpy(o + (size_t)G * c.Dv * c.E, z + (size_t)src_head(&c, G) * c.Dv * c.E,
                       (size_t)c.Dv * c.E * F);
            gguf_w_tensor(w, t->name, 0, t->n_dims, t->ne, o);
        } else if (strcmp(base, "ssm_beta.weight") == 0) {
            const float *b = tensor_f32(&c, "blk.0.ssm_beta.weight", &src);
            const float *a = tensor_f32(&c, "blk.0.ssm_alpha.weight", &src);
            float *o = buf_new(&c, (size_t)2 * c.Hv * c.E);
            for (int gk = 0; gk < c.Hk; gk++)
                for (int j = 0; j < c.r; j++) {
                    const int T = src_head(&c, gk * c.r + j);
                    memcpy(o + (size_t)(gk * 2 * c.r + j) * c.E, b + (size_t)T * c.E,
                           (size_t)c.E * F);
                    memcpy(o + (size_t)(gk * 2 * c.r + c.r + j) * c.E, a + (size_t)T * c.E,
                           (size_t)c.E * F);
                }
            int64_t ne[2] = {c.E, 2 * c.Hv};
            gguf_w_tensor(w, "blk.0.ssm_ba.weight", 0, 2, ne, o);
        } else if (strcmp(base, "ssm_alpha.weight") == 0) {
            continue; /* inside ssm_ba */
        } else if (strcmp(base, "ssm_a") == 0 || strcmp(base, "ssm_dt.bias") == 0) {
            const float *v = tensor_f32(&c, t->name, &src);
            float *o = buf_new(&c, (size_t)c.Hv);
            for (int G = 0; G < c.Hv; G++) o[G] = v[src_head(&c, G)];
            gguf_w_tensor(w, t->name, 0, t->n_dims, t->ne, o);
        } else if (strcmp(base, "ssm_conv1d.weight") == 0) {
            const float *v = tensor_f32(&c, t->name, &src);
            float *o = buf_new(&c, (size_t)c.CD * c.K);
            memcpy(o, v, (size_t)2 * c.KD * c.K * F);
            for (int G = 0; G < c.Hv; G++)
                memcpy(o + (size_t)(2 * c.KD + G * c.Dv) * c.K,
                       v + (size_t)(2 * c.KD + src_head(&c, G) * c.Dv) * c.K,
                       (size_t)c.Dv * c.K * F);
            gguf_w_tensor(w, t->name, 0, t->n_dims, t->ne, o);
        } else if (strcmp(base, "ssm_out.weight") == 0) {
            const float *v = tensor_f32(&c, t->name, &src);
            float *o = buf_new(&c, (size_t)c.VD * c.E);
            for (int row = 0; row < c.E; row++)
                for (int G = 0; G < c.Hv; G++)
                    memcpy(o + (size_t)row * c.VD + (size_t)G * c.Dv,
                           v + (size_t)row * c.VD + (size_t)src_head(&c, G) * c.Dv,
                           (size_t)c.Dv * F);
            gguf_w_tensor(w, t->name, 0, t->n_dims, t->ne, o);
        } else {
            gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
        }
    }
    uint8_t *out = NULL;
    CHECK(gguf_writer_to_memory(w, &out, len) == 0);
    gguf_writer_free(w);
    for (int i = 0; i < c.n_bufs; i++) free(c.bufs[i]);
    gguf_close(g);
    return out;
}

/* The fixture with an MTP block appended (block_count 3, nextn_predict_layers 1, blk.2 a copy
 * of blk.1 plus nextn tensors) and the layer pattern given as a per-layer flag array instead of
 * full_attention_interval: the main pass must not change a bit. */
static uint8_t *make_mtp_flags(const char *path, size_t *len) {
    char err[256];
    gguf_file *g = gguf_open(path, err, sizeof err);
    if (!g) return NULL;
    gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        if (strcmp(kv->key, "qwen35moe.full_attention_interval") == 0) continue;
        if (strcmp(kv->key, "qwen35moe.block_count") == 0) CHECK(gguf_w_u32(w, kv->key, 3) == 0);
        else CHECK(gguf_w_copy_kv(w, kv) == 0);
    }
    const uint8_t flags[3] = {1, 0, 0}; /* the MTP block is attention */
    CHECK(gguf_w_u32(w, "qwen35moe.nextn_predict_layers", 1) == 0);
    CHECK(gguf_w_arr(w, "qwen35moe.attention.recurrent_layers", GGUF_VT_BOOL, flags, 3) == 0);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (strncmp(t->name, "blk.1.", 6) != 0) continue;
        char name[96];
        snprintf(name, sizeof name, "blk.2.%s", t->name + 6);
        gguf_w_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
    }
    const int E = 256;
    float *eh = calloc((size_t)2 * E * E, sizeof *eh), *ones = malloc(E * sizeof *ones);
    for (int i = 0; i < E; i++) ones[i] = 1.0f;
    const int64_t ne_eh[2] = {2 * E, E}, ne_n[1] = {E};
    gguf_w_tensor(w, "blk.2.nextn.eh_proj.weight", 0, 2, ne_eh, eh);
    gguf_w_tensor(w, "blk.2.nextn.enorm.weight", 0, 1, ne_n, ones);
    gguf_w_tensor(w, "blk.2.nextn.hnorm.weight", 0, 1, ne_n, ones);
    uint8_t *out = NULL;
    CHECK(gguf_writer_to_memory(w, &out, len) == 0);
    gguf_writer_free(w);
    free(eh);
    free(ones);
    gguf_close(g);
    return out;
}

static void test_mtp_and_flags(const char *path, sluice_model *ref_model, const int32_t *ids,
                               int n) {
    const int V = ref_model->hp.n_vocab;
    size_t len = 0;
    uint8_t *bytes = make_mtp_flags(path, &len);
    CHECK(bytes != NULL);
    if (!bytes) return;
    sluice_model *m = sluice_model_load_memory(bytes, len, "with-mtp", NULL);
    CHECKF(m != NULL, "load: %s", sluice_last_error());
    if (m) {
        CHECK(m->hp.n_layer == 2 && m->layers[0].recurrent && !m->layers[1].recurrent);
        float *ref = eval_internal(ref_model, ids, n, n, 0);
        float *lg = eval_internal(m, ids, n, n, 0);
        const bool same = memcmp(ref, lg, (size_t)n * V * sizeof *lg) == 0;
        printf("MTP block + recurrent_layers flag array: main pass bit-identical: %s\n",
               same ? "yes" : "NO");
        CHECK(same);
        free(ref);
        free(lg);
        sluice_model_free(m);
    }
    free(bytes);
}

static void test_qwen3next(const char *path, sluice_model *ref_model, const int32_t *ids, int n) {
    const int V = ref_model->hp.n_vocab;
    float *ref = eval_internal(ref_model, ids, n, n, 0);
    for (int legacy = 0; legacy < 2; legacy++) {
        size_t len = 0;
        uint8_t *bytes = make_qwen3next(path, legacy, &len);
        CHECK(bytes != NULL);
        if (!bytes) continue;
        sluice_model *m = sluice_model_load_memory(bytes, len, "qwen3next-from-fixture", NULL);
        CHECKF(m != NULL, "load: %s", sluice_last_error());
        if (m) {
            sluice_model_info info;
            sluice_model_get_info(m, &info);
            CHECK(strcmp(info.arch, "qwen3next") == 0 && !m->hp.ssm_kv_tiled);
            CHECK(legacy ? m->layers[0].ssm.in.data != NULL : m->layers[0].ssm.qkv.data != NULL);
            float *lg = eval_internal(m, ids, n, n, 0);
            double worst = 0;
            for (int t = 0; t < n; t++) {
                double e = rel(lg + (size_t)t * V, ref + (size_t)t * V, V);
                worst = e > worst ? e : worst;
            }
            printf("qwen3next (%s projections) vs qwen35moe on the same weights: max rel %.3g "
                   "over %d positions\n",
                   legacy ? "legacy ssm_in" : "attn_qkv + attn_gate", worst, n);
            CHECKF(worst <= 1e-5, "qwen3next%s differs: %g", legacy ? " (legacy)" : "", worst);
            free(lg);
            sluice_model_free(m);
        }
        free(bytes);
    }
    free(ref);
}

int main(void) {
    char path[1024], ids_path[1024];
    if (!fixture_path("models", NAME ".gguf", path, sizeof path) ||
        !fixture_path("golden", NAME ".prompt.ids", ids_path, sizeof ids_path)) {
        /* shipped only with ../shared/fixtures (CI); a plain clone has the Q4_K_M fixture,
         * whose batch-split and decode identity test_fixture checks */
        fprintf(stderr, "SKIP: fixture %s not found\n", NAME);
        return 77;
    }
    sluice_model *m = sluice_model_load(path, NULL);
    CHECKF(m != NULL, "load: %s", sluice_last_error());
    if (!m) CHECK_DONE();
    int n = 0;
    int32_t *ids = read_ids(ids_path, &n);
    CHECK(ids && n > 64);
    if (ids && n > 0) {
        test_equivalence(m, ids, n);
        test_reset_and_bytes(m, ids, n);
        test_qwen3next(path, m, ids, n);
        test_mtp_and_flags(path, m, ids, n);
    }
    free(ids);
    sluice_model_free(m);
    CHECK_DONE();
}
