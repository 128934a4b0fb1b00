/* sluice convert and the safetensors reader.
 *
 * 1. safetensors: a valid file reads back; every kind of malformed file is refused in one line.
 * 2. The transformers fixtures (tests/data/hf, made by tools/hf_reference.py): each converted
 *    GGUF's logits at every prompt position against transformers' float64 logits. F32 must agree
 *    to float rounding (bounds below), the other types within their quantization error.
 * 3. The tokenizer: the converted vocabulary tokenizes the prompt as Hugging Face's tokenizers did.
 * 4. Checkpoint variants of the same weights (F32 dtype, shards + index, multimodal prefixes with
 *    text_config, fused 3-D experts) convert to identical tensor bytes.
 * 5. FP8 e4m3 with block scales: every value is code * scale_inv of its block.
 * 6. MLX affine checkpoints (mlx-lm layout): groups copied bit for bit into the MLX types,
 *    dequantized exactly otherwise, norms not shifted twice; logits close to the float model.
 * 7. Resume: interrupted conversions continue and give the same bytes; a corrupted tensor is
 *    rewritten; changed options start over.
 * 8. Bad input: one-line errors, no output, non-zero exit from the CLI.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "st_write.h"
#include "convert/convert.h"
#include "formats/gguf.h"
#include "formats/quant.h"
#include "formats/safetensors.h"
#include "formats/store.h"
#include "sluice.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define HF SLUICE_TEST_DATA "/hf"
static char work[512];

static const char *at(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Paths under the work directory; each call returns its own string (freed at exit), so that
 * callers may keep them. */
static char *paths[4096];
static int n_paths;
static const char *at(const char *fmt, ...) {
    char *b = malloc(1024);
    if (n_paths < 4096) paths[n_paths++] = b;
    int len = snprintf(b, 1024, "%s/", work);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b + len, (size_t)(1024 - len), fmt, ap);
    va_end(ap);
    return b;
}

/* ---- building inputs ---------------------------------------------------------------------- */

typedef st_tensor_out wt;

typedef struct wlist {
    wt *v;
    int n, cap;
    void *own[4096];
    int n_own;
} wlist;

static wt *add(wlist *l, const char *name, const char *dtype, int nd, const int64_t *shape,
               const void *data, size_t nbytes) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 128;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    wt *t = &l->v[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->nd = nd;
    memcpy(t->shape, shape, (size_t)nd * sizeof *shape);
    t->data = data;
    t->nbytes = nbytes;
    return t;
}

static void *own(wlist *l, size_t n) {
    void *p = calloc(1, n ? n : 1);
    l->own[l->n_own++] = p;
    return p;
}

static void wl_free(wlist *l) {
    for (int i = 0; i < l->n_own; i++) free(l->own[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static wt *find_wt(wlist *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->v[i].name, name) == 0) return &l->v[i];
    return NULL;
}

static void drop_wt(wlist *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->v[i].name, name) == 0) {
            l->v[i] = l->v[--l->n];
            return;
        }
}

static void from_st(wlist *l, const st_set *s) {
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *t = st_at(s, i);
        add(l, t->name, st_dtype_name(t->dtype), t->n_dims, t->shape, t->data, t->nbytes);
    }
}

/* A safetensors file of the listed tensors (from index lo to hi). */
static void write_st(const char *path, const wlist *l, int lo, int hi) {
    st_write_file(path, l->v + lo, hi - lo, true);
}

/* A checkpoint directory: the fixture's config (edited) and tokenizer, the given tensors. */
static const char *make_dir(const char *name, const char *fixture, const wlist *l,
                            void (*edit)(json_t *cfg)) {
    const char *dir = at("%s", name);
    mkdir(dir, 0755);
    char src[1024];
    snprintf(src, sizeof src, "%s/%s/config.json", HF, fixture);
    json_t *cfg = json_load_file(src, 0, NULL);
    if (edit) edit(cfg);
    json_dump_file(cfg, at("%s/config.json", name), JSON_INDENT(1));
    json_decref(cfg);
    for (int k = 0; k < 2; k++) {
        const char *f = k ? "tokenizer_config.json" : "tokenizer.json";
        snprintf(src, sizeof src, "%s/%s/%s", HF, fixture, f);
        copy_file(src, at("%s/%s", name, f));
    }
    if (l) write_st(at("%s/model.safetensors", name), l, 0, l->n);
    return dir;
}

/* ---- converting and evaluating ------------------------------------------------------------ */

static char notes[8192];
static void note_cb(void *ctx, const char *line) {
    (void)ctx;
    size_t k = strlen(notes);
    snprintf(notes + k, sizeof notes - k, "%s\n", line);
}

static int conv(const char *dir, const char *out, int type, int stop, convert_report *rep,
                char *err, size_t n) {
    notes[0] = 0;
    convert_options o = {.type = type, .n_threads = 2, .note = note_cb, .stop_after = stop};
    convert_report r;
    return convert_hf(dir, out, &o, rep ? rep : &r, err, n);
}

static int32_t *read_ids(const char *path, int *n) {
    FILE *fp = fopen(path, "r");
    int32_t *ids = malloc(4096 * sizeof *ids);
    int k = 0;
    while (fp && k < 4096 && fscanf(fp, "%d", &ids[k]) == 1) k++;
    if (fp) fclose(fp);
    *n = k;
    return ids;
}

static float *read_f32(const char *path, size_t n) {
    float *v = malloc(n * sizeof *v);
    FILE *fp = fopen(path, "rb");
    size_t got = fp ? fread(v, sizeof *v, n, fp) : 0;
    if (fp) fclose(fp);
    if (got != n) {
        free(v);
        return NULL;
    }
    return v;
}

static float *logits_with(const char *gguf, const sluice_model_params *mp, const int32_t *ids,
                          int n, int *nv) {
    sluice_model *m = sluice_model_load(gguf, mp);
    CHECKF(m != NULL, "%s: %s", gguf, sluice_last_error());
    if (!m) return NULL;
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    *nv = info.n_vocab;
    sluice_session_params sp = {.n_ctx = n + 8, .n_batch = n, .n_threads = 2};
    sluice_session *s = sluice_session_new(m, &sp);
    float *lg = malloc((size_t)n * info.n_vocab * sizeof *lg);
    if (!s || sluice_session_eval(s, ids, n, lg) != 0) {
        free(lg);
        lg = NULL;
    }
    sluice_session_free(s);
    sluice_model_free(m);
    return lg;
}

static float *logits_of(const char *gguf, const int32_t *ids, int n, int *nv) {
    return logits_with(gguf, NULL, ids, n, nv);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct agree {
    double median, max, top1;
} agree;

/* Per position: ||a - ref|| / ||ref||; the fraction of positions whose argmax agrees. */
static agree compare(const float *a, const float *ref, int n, int nv) {
    double *rel = malloc((size_t)n * sizeof *rel);
    int top = 0;
    for (int p = 0; p < n; p++) {
        double d2 = 0, r2 = 0;
        int ia = 0, ir = 0;
        for (int v = 0; v < nv; v++) {
            double x = a[(size_t)p * nv + v], y = ref[(size_t)p * nv + v];
            d2 += (x - y) * (x - y);
            r2 += y * y;
            if (x > a[(size_t)p * nv + ia]) ia = v;
            if (y > ref[(size_t)p * nv + ir]) ir = v;
        }
        rel[p] = sqrt(d2 / r2);
        top += ia == ir;
    }
    qsort(rel, (size_t)n, sizeof *rel, cmp_d);
    agree g = {rel[n / 2], rel[n - 1], (double)top / n};
    free(rel);
    return g;
}

/* Do two GGUFs hold the same tensors (names, types, shapes, bytes)? */
static bool same_tensors(const char *a, const char *b) {
    char e[256];
    gguf_file *fa = gguf_open(a, e, sizeof e), *fb = gguf_open(b, e, sizeof e);
    bool same = fa && fb && fa->n_tensors == fb->n_tensors;
    for (uint64_t i = 0; same && i < fa->n_tensors; i++) {
        const gguf_tensor *x = &fa->tensors[i], *y = gguf_find_tensor(fb, x->name);
        same = y && x->type == y->type && x->nbytes == y->nbytes &&
               memcmp(x->ne, y->ne, sizeof x->ne) == 0 && memcmp(x->data, y->data, x->nbytes) == 0;
        if (!same) fprintf(stderr, "  tensor %s differs\n", x->name);
    }
    if (fa) gguf_close(fa);
    if (fb) gguf_close(fb);
    return same;
}

static bool same_file(const char *a, const char *b) {
    FILE *x = fopen(a, "rb"), *y = fopen(b, "rb");
    bool same = x && y;
    while (same) {
        int c = fgetc(x), d = fgetc(y);
        if (c != d) same = false;
        if (c == EOF) break;
    }
    if (x) fclose(x);
    if (y) fclose(y);
    return same;
}

/* ---- 1. safetensors ------------------------------------------------------------------------ */

static void write_raw(const char *path, const char *json, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    uint64_t len = strlen(json);
    fwrite(&len, 8, 1, fp);
    fwrite(json, 1, len, fp);
    if (n) fwrite(data, 1, n, fp);
    fclose(fp);
}

static void expect_st_error(const char *json, size_t data_len, const char *want) {
    uint8_t data[64] = {0};
    write_raw(at("bad.safetensors"), json, data, data_len);
    char err[512] = "";
    st_set *s = st_open(at("bad.safetensors"), err, sizeof err);
    CHECKF(s == NULL && strstr(err, want) && !strchr(err, '\n'), "%s -> '%s' (want '%s')", json,
           err, want);
    st_close(s);
}

static void test_safetensors(void) {
    float v[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[2] = {0x3c00, 0xc000}; /* f16 1, -2 */
    uint8_t both[28];
    memcpy(both, v, 24);
    memcpy(both + 24, h, 4);
    write_raw(at("ok.safetensors"),
              "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],"
              "\"data_offsets\":[0,24]},\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[24,28]}}",
              both, sizeof both);
    char err[512];
    st_set *s = st_open(at("ok.safetensors"), err, sizeof err);
    CHECKF(s != NULL, "%s", err);
    if (s) {
        const st_tensor *a = st_find(s, "a"), *b = st_find(s, "b");
        CHECK(st_count(s) == 2 && a && b && a->n_dims == 2 && a->shape[1] == 3 && a->nbytes == 24);
        CHECK(b && st_get_f32(b, 0) == 1.0f && st_get_f32(b, 1) == -2.0f && st_get_f32(a, 5) == 6.0f);
        CHECK(st_find(s, "c") == NULL);
        st_close(s);
    }
    /* FP8 e4m3 values of the OCP table */
    CHECK(st_f8_e4m3_to_f32(0x7e) == 448.0f && st_f8_e4m3_to_f32(0x01) == 0x1p-9f &&
          st_f8_e4m3_to_f32(0x08) == 0x1p-6f && st_f8_e4m3_to_f32(0xb8) == -1.0f &&
          isnan(st_f8_e4m3_to_f32(0x7f)) && st_f8_e4m3_to_f32(0x80) == 0.0f);
    CHECK(st_f8_e5m2_to_f32(0x3c) == 1.0f && st_f8_e5m2_to_f32(0x7b) == 57344.0f);

    expect_st_error("{\"a\":", 0, "not valid JSON");
    expect_st_error("[1,2]", 0, "not a JSON object");
    expect_st_error("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unsupported dtype");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "invalid shape");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "past the end");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "its shape needs");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,0]}}", 8, "invalid data_offsets");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "overlap");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "not valid JSON");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "lacks dtype");
    /* header length beyond the file */
    FILE *fp = fopen(at("bad.safetensors"), "wb");
    uint64_t big = 1u << 20;
    fwrite(&big, 8, 1, fp);
    fputs("{}", fp);
    fclose(fp);
    s = st_open(at("bad.safetensors"), err, sizeof err);
    CHECKF(!s && strstr(err, "header length"), "%s", err);
    st_close(s);
    fp = fopen(at("bad.safetensors"), "wb");
    fputs("abc", fp);
    fclose(fp);
    s = st_open(at("bad.safetensors"), err, sizeof err);
    CHECKF(!s && strstr(err, "too short"), "%s", err);
    st_close(s);
    s = st_open(at("nonexistent"), err, sizeof err);
    CHECK(!s && strstr(err, "No such file"));
    st_close(s);
}

/* ---- 2, 3. the transformers fixtures ------------------------------------------------------- */

/* Bounds on (median, max) relative error per position and the least top-1 agreement.
 * F32: the weights are exactly the reference's (bf16 values held in f32); the difference is
 *   float32 evaluation order alone. transformers' own float32 run is 4.7e-7 / 5.1e-7 (median) and
 *   6.1e-7 / 2.2e-6 (max) from its float64 run on these two models (the fixtures' meta.json);
 *   sluice measured 2.3e-7 / 2.6e-7 and 4.1e-7 / 1.7e-6. The bounds, 1e-5 median and 1e-4 max,
 *   leave room for other compilers and kernels while any real mistake (a missed +1, a wrong
 *   head order, a swapped expert) moves the logits by 1e-2 or more.
 * Other types: their own rounding of weights and activations. BF16 activations (act_type BF16)
 *   alone give ~2.5e-3; Q8_0 ~1.5e-2; 4-bit types ~0.15-0.2 on these random models (no
 *   structure to preserve). Occasional positions go further where rounding flips an expert
 *   choice, hence loose maxima; the medians catch a broken codec (which gives ~1). */
typedef struct tcase {
    const char *type;
    double median, max, top1;
} tcase;

static void test_fixtures(void) {
    static const tcase cases[] = {
        {"F32", 1e-5, 1e-4, 1.0},    {"auto", 1e-2, 0.3, 0.9},  {"F16", 2e-3, 0.1, 0.9},
        {"Q8_0", 0.04, 0.4, 0.85},   {"Q4_K", 0.25, 0.6, 0.5},  {"MLX8_G64", 0.04, 0.5, 0.85},
        {"MLX4_G64_BF16", 0.3, 0.7, 0.5}, {"IQ4_XS", 0.25, 0.6, 0.5},
    };
    static const char *models[] = {"qwen3moe-tiny", "qwen35moe-tiny"};
    for (int mi = 0; mi < 2; mi++) {
        char p[1024];
        int n;
        snprintf(p, sizeof p, "%s/%s.prompt.ids", HF, models[mi]);
        int32_t *ids = read_ids(p, &n);
        snprintf(p, sizeof p, "%s/%s.logits.f32", HF, models[mi]);
        float *ref = read_f32(p, (size_t)n * 1024);
        CHECKF(ref && n == 140, "%s reference", models[mi]);
        if (!ref) {
            free(ids);
            continue;
        }
        snprintf(p, sizeof p, "%s/%s", HF, models[mi]);
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            const char *out = at("%s-%s.gguf", models[mi], cases[k].type);
            int type = strcmp(cases[k].type, "auto") ? quant_type_from_name(cases[k].type) : CONVERT_TYPE_AUTO;
            char err[512];
            int rc = conv(p, out, type, 0, NULL, err, sizeof err);
            CHECKF(rc == 0, "%s %s: %s", models[mi], cases[k].type, err);
            int nv = 0;
            float *lg = rc == 0 ? logits_of(out, ids, n, &nv) : NULL;
            if (!lg) continue;
            CHECK(nv == 1024);
            agree g = compare(lg, ref, n, nv);
            printf("  %-15s %-14s median %.3g  max %.3g  top1 %.3f\n", models[mi], cases[k].type,
                   g.median, g.max, g.top1);
            CHECKF(g.median <= cases[k].median && g.max <= cases[k].max && g.top1 >= cases[k].top1,
                   "%s %s: median %.3g max %.3g top1 %.3f", models[mi], cases[k].type, g.median,
                   g.max, g.top1);
            free(lg);
        }
        /* the vocabulary: the prompt tokenizes as Hugging Face's tokenizers did */
        const char *f32 = at("%s-F32.gguf", models[mi]);
        sluice_model *m = sluice_model_load(f32, NULL);
        if (m) {
            FILE *fp = fopen(HF "/prompt.txt", "rb");
            char text[4096];
            size_t len = fp ? fread(text, 1, sizeof text, fp) : 0;
            if (fp) fclose(fp);
            int32_t got[4096];
            int k = sluice_tokenize(m, text, len, true, true, got, 4096);
            CHECKF(k == n && memcmp(got, ids, (size_t)n * sizeof *ids) == 0, "%s: prompt "
                   "tokenizes to %d tokens, reference %d", models[mi], k, n);
            sluice_model_info info;
            sluice_model_get_info(m, &info);
            CHECK(info.eos == 1023 && !info.add_bos && info.n_layer == 2 && info.n_expert == 4);
            sluice_model_free(m);
        }
        free(ids);
        free(ref);
    }
    /* metadata written the way llama.cpp writes it */
    char err[256];
    gguf_file *f = gguf_open(at("qwen35moe-tiny-F32.gguf"), err, sizeof err);
    CHECK(f != NULL);
    if (f) {
        uint32_t u = 0;
        gguf_str s;
        CHECK(gguf_get_str(f, "general.architecture", &s) && s.len == 9 && !memcmp(s.ptr, "qwen35moe", 9));
        CHECK(gguf_get_str(f, "tokenizer.ggml.pre", &s) && s.len == 5 && !memcmp(s.ptr, "qwen2", 5));
        CHECK(gguf_get_u32(f, "qwen35moe.full_attention_interval", &u) && u == 2);
        CHECK(gguf_get_u32(f, "qwen35moe.rope.dimension_count", &u) && u == 32);
        CHECK(gguf_get_u32(f, "qwen35moe.ssm.inner_size", &u) && u == 256);
        CHECK(gguf_get_u32(f, "qwen35moe.ssm.time_step_rank", &u) && u == 4);
        CHECK(gguf_get_u32(f, "general.file_type", &u) && u == 0);
        const gguf_kv *ds = gguf_find(f, "qwen35moe.rope.dimension_sections");
        int64_t d0 = 0;
        CHECK(ds && ds->arr_n == 4 && gguf_arr_get_i64(ds, 0, &d0) && d0 == 6);
        CHECK(gguf_find_tensor(f, "output.weight") == NULL); /* tied */
        const gguf_tensor *a = gguf_find_tensor(f, "blk.0.ssm_a");
        CHECK(a && a->type == GGML_TYPE_F32 && ((const float *)a->data)[0] < 0.0f);
        gguf_close(f);
    }
}

/* ---- 4. checkpoint variants --------------------------------------------------------------- */

static void to_f32_dtype(wlist *l) {
    for (int i = 0; i < l->n; i++) {
        wt *t = &l->v[i];
        if (strcmp(t->dtype, "BF16") != 0) continue;
        size_t n = t->nbytes / 2;
        float *f = own(l, n * 4);
        for (size_t k = 0; k < n; k++) {
            const uint8_t *p = (const uint8_t *)t->data + 2 * k;
            f[k] = quant_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
        }
        t->dtype = "F32";
        t->data = f;
        t->nbytes = n * 4;
    }
}

static void edit_vlm(json_t *cfg) {
    /* the released Qwen3.5-MoE layout: text hyper-parameters under text_config */
    json_t *top = json_pack("{s:s, s:[s], s:O, s:{s:s}}", "model_type", "qwen3_5_moe",
                            "architectures", "Qwen3_5MoeForConditionalGeneration", "tie_word_embeddings",
                            json_object_get(cfg, "tie_word_embeddings"), "vision_config", "model_type",
                            "qwen3_5_moe_vision");
    json_t *text = json_deep_copy(cfg);
    json_object_clear(cfg);
    json_object_update(cfg, top);
    json_object_set_new(cfg, "text_config", text);
    json_decref(top);
}

static void test_variants(void) {
    char err[512];
    st_set *s = st_open(HF "/qwen35moe-tiny", err, sizeof err);
    CHECKF(s != NULL, "%s", err);
    if (!s) return;
    const char *ref = at("qwen35moe-tiny-F32.gguf");
    /* F32 dtype, sharded with an index */
    wlist l = {0};
    from_st(&l, s);
    to_f32_dtype(&l);
    const char *dir = make_dir("v-f32-sharded", "qwen35moe-tiny", NULL, NULL);
    write_st(at("v-f32-sharded/model-00001-of-00002.safetensors"), &l, 0, l.n / 2);
    write_st(at("v-f32-sharded/model-00002-of-00002.safetensors"), &l, l.n / 2, l.n);
    json_t *idx = json_pack("{s:{s:i}, s:{}}", "metadata", "total_size", 0, "weight_map");
    for (int i = 0; i < l.n; i++)
        json_object_set_new(json_object_get(idx, "weight_map"), l.v[i].name,
                            json_string(i < l.n / 2 ? "model-00001-of-00002.safetensors"
                                                    : "model-00002-of-00002.safetensors"));
    json_dump_file(idx, at("v-f32-sharded/model.safetensors.index.json"), 0);
    CHECKF(conv(dir, at("v1.gguf"), GGML_TYPE_F32, 0, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(same_tensors(ref, at("v1.gguf")));
    /* an index naming the wrong shard */
    json_object_set_new(json_object_get(idx, "weight_map"), l.v[0].name,
                        json_string("model-00002-of-00002.safetensors"));
    json_dump_file(idx, at("v-f32-sharded/model.safetensors.index.json"), 0);
    CHECKF(conv(dir, at("v1b.gguf"), GGML_TYPE_F32, 0, NULL, err, sizeof err) == -1 &&
           strstr(err, "is not in model-00002-of-00002.safetensors"), "%s", err);
    json_decref(idx);
    wl_free(&l);

    /* multimodal checkpoint: model.language_model.* names, text_config, a vision tensor */
    from_st(&l, s);
    for (int i = 0; i < l.n; i++) {
        wt *t = &l.v[i];
        if (strncmp(t->name, "model.", 6) == 0) {
            char nm[160];
            snprintf(nm, sizeof nm, "model.language_model.%.130s", t->name + 6);
            snprintf(t->name, sizeof t->name, "%s", nm);
        }
    }
    static const float vis[4] = {1, 2, 3, 4};
    add(&l, "model.visual.patch_embed.weight", "F32", 1, (int64_t[]){4}, vis, sizeof vis);
    dir = make_dir("v-vlm", "qwen35moe-tiny", &l, edit_vlm);
    /* Qwen3.5's pre-tokenizer regex (letters with combining marks) and a chat template in
     * chat_template.jinja, as transformers 5 saves it */
    json_t *tj = json_load_file(at("v-vlm/tokenizer.json"), 0, NULL);
    json_t *split = json_array_get(json_object_get(json_object_get(tj, "pre_tokenizer"), "pretokenizers"), 0);
    json_object_set_new(json_object_get(split, "pattern"), "Regex", json_string(
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}"
        "\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"));
    json_dump_file(tj, at("v-vlm/tokenizer.json"), 0);
    json_decref(tj);
    static const char tmpl[] = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    FILE *tf = fopen(at("v-vlm/chat_template.jinja"), "w");
    fputs(tmpl, tf);
    fclose(tf);
    CHECKF(conv(dir, at("v2.gguf"), GGML_TYPE_F32, 0, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(same_tensors(ref, at("v2.gguf")));
    CHECKF(strstr(notes, "ignoring 1 tensors"), "%s", notes);
    gguf_file *gv = gguf_open(at("v2.gguf"), err, sizeof err);
    gguf_str gs = {0};
    CHECK(gv && gguf_get_str(gv, "tokenizer.ggml.pre", &gs) && gs.len == 6 && !memcmp(gs.ptr, "qwen35", 6));
    CHECK(gv && gguf_get_str(gv, "tokenizer.chat_template", &gs) && gs.len == strlen(tmpl) &&
          !memcmp(gs.ptr, tmpl, gs.len));
    if (gv) gguf_close(gv);
    wl_free(&l);

    /* fused experts: gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I] */
    from_st(&l, s);
    for (int L = 0; L < 2; L++) {
        const int64_t E = 4, I = 128, H = 256;
        uint16_t *gu = own(&l, (size_t)E * 2 * I * H * 2), *dn = own(&l, (size_t)E * H * I * 2);
        for (int e = 0; e < E; e++) {
            char nm[160];
            static const char *pp[3] = {"gate", "up", "down"};
            for (int p = 0; p < 3; p++) {
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s_proj.weight", L, e, pp[p]);
                wt *t = find_wt(&l, nm);
                if (!t) continue;
                uint16_t *dst = p == 2 ? dn + (size_t)e * H * I : gu + ((size_t)e * 2 + (size_t)p) * I * H;
                memcpy(dst, t->data, t->nbytes);
                drop_wt(&l, nm);
            }
        }
        char nm[160];
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj", L);
        add(&l, nm, "BF16", 3, (int64_t[]){E, 2 * I, H}, gu, (size_t)E * 2 * I * H * 2);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj", L);
        add(&l, nm, "BF16", 3, (int64_t[]){E, H, I}, dn, (size_t)E * H * I * 2);
    }
    dir = make_dir("v-fused", "qwen35moe-tiny", &l, NULL);
    CHECKF(conv(dir, at("v3.gguf"), GGML_TYPE_F32, 0, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(same_tensors(ref, at("v3.gguf")));
    wl_free(&l);
    st_close(s);
}

/* ---- 5. FP8 ------------------------------------------------------------------------------- */

static uint8_t f8_encode(float x) { /* nearest finite e4m3 code (the test's own, brute force) */
    int best = 0;
    float bd = INFINITY;
    for (int c = 0; c < 256; c++) {
        float v = st_f8_e4m3_to_f32((uint8_t)c);
        if (isnan(v)) continue;
        float d = fabsf(v - x);
        if (d < bd) {
            bd = d;
            best = c;
        }
    }
    return (uint8_t)best;
}

static void edit_fp8(json_t *cfg) {
    json_object_set_new(cfg, "quantization_config",
                        json_pack("{s:s, s:s, s:s, s:[i, i]}", "quant_method", "fp8", "fmt", "e4m3",
                                  "activation_scheme", "dynamic", "weight_block_size", 128, 96));
}

static void test_fp8(void) {
    char err[512];
    st_set *s = st_open(HF "/qwen3moe-tiny", err, sizeof err);
    if (!s) return;
    wlist l = {0};
    from_st(&l, s);
    const int BR = 128, BC = 96; /* 256 columns: three column blocks, the last one partial */
    int n_fp8 = 0;
    const int n0 = l.n;
    for (int i = 0; i < n0; i++) {
        wt *t = &l.v[i];
        if (t->nd != 2 || !(strstr(t->name, "_proj.weight"))) continue;
        const int64_t R = t->shape[0], C = t->shape[1], RB = (R + BR - 1) / BR, CB = (C + BC - 1) / BC;
        uint8_t *codes = own(&l, (size_t)(R * C));
        float *sc = own(&l, (size_t)(RB * CB) * 4);
        const uint8_t *src = t->data;
        for (int64_t rb = 0; rb < RB; rb++)
            for (int64_t cb = 0; cb < CB; cb++) {
                float amax = 0;
                for (int64_t r = rb * BR; r < R && r < (rb + 1) * BR; r++)
                    for (int64_t c = cb * BC; c < C && c < (cb + 1) * BC; c++) {
                        const uint8_t *p = src + 2 * (r * C + c);
                        amax = fmaxf(amax, fabsf(quant_bf16_to_f32((uint16_t)(p[0] | p[1] << 8))));
                    }
                float scale = amax > 0 ? amax / 448.0f : 1.0f;
                sc[rb * CB + cb] = scale;
                for (int64_t r = rb * BR; r < R && r < (rb + 1) * BR; r++)
                    for (int64_t c = cb * BC; c < C && c < (cb + 1) * BC; c++) {
                        const uint8_t *p = src + 2 * (r * C + c);
                        codes[r * C + c] = f8_encode(quant_bf16_to_f32((uint16_t)(p[0] | p[1] << 8)) / scale);
                    }
            }
        char nm[200];
        snprintf(nm, sizeof nm, "%.150s_scale_inv", t->name);
        t->dtype = "F8_E4M3";
        t->data = codes;
        t->nbytes = (size_t)(R * C);
        add(&l, nm, "F32", 2, (int64_t[]){RB, CB}, sc, (size_t)(RB * CB) * 4);
        n_fp8++;
    }
    CHECK(n_fp8 == 2 * (4 + 12));
    const char *dir = make_dir("fp8", "qwen3moe-tiny", &l, edit_fp8);
    CHECKF(conv(dir, at("fp8-F32.gguf"), GGML_TYPE_F32, 0, NULL, err, sizeof err) == 0, "%s", err);
    CHECKF(conv(dir, at("fp8-auto.gguf"), CONVERT_TYPE_AUTO, 0, NULL, err, sizeof err) == 0, "%s", err);
    gguf_file *f = gguf_open(at("fp8-F32.gguf"), err, sizeof err), *fa = gguf_open(at("fp8-auto.gguf"), err, sizeof err);
    if (f && fa) {
        /* attn_k of layer 1 ([128, 256]: 1 x 3 blocks) and expert 2's down ([256, 128], 2 x 2) */
        const char *names[2] = {"model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.experts.2.down_proj.weight"};
        const char *outs[2] = {"blk.1.attn_k.weight", "blk.0.ffn_down_exps.weight"};
        for (int k = 0; k < 2; k++) {
            wt *w = find_wt(&l, names[k]);
            char nm[200];
            snprintf(nm, sizeof nm, "%s_scale_inv", names[k]);
            wt *sw = find_wt(&l, nm);
            const gguf_tensor *t = gguf_find_tensor(f, outs[k]);
            CHECK(w && sw && t && t->type == GGML_TYPE_F32);
            if (!w || !sw || !t) continue;
            const int64_t R = w->shape[0], C = w->shape[1], CB = (C + BC - 1) / BC;
            const float *got = (const float *)t->data + (k ? 2 * R * C : 0);
            int bad = 0;
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++) {
                    float want = st_f8_e4m3_to_f32(((const uint8_t *)w->data)[r * C + c]) *
                                 ((const float *)sw->data)[(r / BR) * CB + c / BC];
                    bad += got[r * C + c] != want;
                }
            CHECKF(bad == 0, "FP8 %s: %d values differ", outs[k], bad);
            const gguf_tensor *ta = gguf_find_tensor(fa, outs[k]);
            CHECK(ta && ta->type == GGML_TYPE_BF16); /* auto: FP8 becomes BF16 */
        }
    }
    if (f) gguf_close(f);
    if (fa) gguf_close(fa);
    int n, nv;
    int32_t *ids = read_ids(HF "/qwen3moe-tiny.prompt.ids", &n);
    float *ref = read_f32(HF "/qwen3moe-tiny.logits.f32", (size_t)n * 1024);
    float *lg = ref ? logits_of(at("fp8-F32.gguf"), ids, n, &nv) : NULL;
    if (lg) {
        agree g = compare(lg, ref, n, nv);
        printf("  qwen3moe-tiny  FP8 (as F32)   median %.3g  max %.3g  top1 %.3f\n", g.median, g.max, g.top1);
        CHECK(g.median < 0.15 && g.top1 >= 0.5); /* e4m3 keeps 3 mantissa bits */
    }
    free(lg);
    free(ref);
    free(ids);
    wl_free(&l);
    st_close(s);
}

/* ---- 6. MLX -------------------------------------------------------------------------------- */

static int mlx_bits_for(const char *name) {
    return strstr(name, "mlp.gate.") || strstr(name, "shared_expert_gate") ? 8 : 4;
}

/* Quantize a [R, C] (or [E, R, C]) BF16 tensor the way mlx-lm stores it: uint32 codes
 * [.., R, C*b/32], bf16 scales and biases [.., R, C/G]. Returns the blocks too (our layout). */
static void mlx_quantize_into(wlist *l, wt *t, const char *base, int bits, int G) {
    const int nd = t->nd;
    int64_t R = t->shape[nd - 2], C = t->shape[nd - 1], O = nd == 3 ? t->shape[0] : 1;
    const uint32_t type = (uint32_t)quant_mlx_type(bits, G, true);
    const quant_traits *q = quant_traits_of(type);
    const size_t rb = quant_row_bytes(type, C);
    uint8_t *blocks = malloc(rb);
    float *row = malloc((size_t)C * sizeof *row);
    uint32_t *codes = own(l, (size_t)(O * R * C * bits / 32) * 4);
    uint16_t *sc = own(l, (size_t)(O * R * C / G) * 2), *bi = own(l, (size_t)(O * R * C / G) * 2);
    for (int64_t r = 0; r < O * R; r++) {
        const uint8_t *src = (const uint8_t *)t->data + 2 * r * C;
        for (int64_t c = 0; c < C; c++) row[c] = quant_bf16_to_f32((uint16_t)(src[2 * c] | src[2 * c + 1] << 8));
        q->quantize(row, blocks, C);
        for (int64_t g = 0; g < C / G; g++) {
            const uint8_t *b = blocks + g * (4 + G * bits / 8);
            memcpy(&sc[r * (C / G) + g], b, 2);
            memcpy(&bi[r * (C / G) + g], b + 2, 2);
            memcpy((uint8_t *)codes + (r * C + g * G) * bits / 8, b + 4, (size_t)G * bits / 8);
        }
    }
    free(blocks);
    free(row);
    char nm[200];
    int64_t shape[3] = {O, R, C * bits / 32};
    const int64_t *sh = nd == 3 ? shape : shape + 1;
    t->dtype = "U32";
    memcpy(t->shape, sh, (size_t)nd * sizeof *sh);
    t->data = codes;
    t->nbytes = (size_t)(O * R * C * bits / 32) * 4;
    int64_t s2[3] = {O, R, C / G};
    const int64_t *ss = nd == 3 ? s2 : s2 + 1;
    snprintf(nm, sizeof nm, "%s.scales", base);
    add(l, nm, "BF16", nd, ss, sc, (size_t)(O * R * C / G) * 2);
    snprintf(nm, sizeof nm, "%s.biases", base);
    add(l, nm, "BF16", nd, ss, bi, (size_t)(O * R * C / G) * 2);
}

/* Value k of row r of an MLX tensor, from its uint32 words (independent of the codec). */
static float mlx_value(const wlist *l, const char *base, int64_t C, int bits, int G, int64_t r, int64_t k) {
    char nm[200];
    snprintf(nm, sizeof nm, "%s.weight", base);
    const wt *w = find_wt((wlist *)l, nm);
    snprintf(nm, sizeof nm, "%s.scales", base);
    const wt *s = find_wt((wlist *)l, nm);
    snprintf(nm, sizeof nm, "%s.biases", base);
    const wt *b = find_wt((wlist *)l, nm);
    const uint32_t *words = (const uint32_t *)w->data + r * (C * bits / 32);
    const int64_t bit = k * bits, wi = bit / 32, sh = bit % 32;
    uint64_t v = words[wi] >> sh;
    if (sh + bits > 32) v |= (uint64_t)words[wi + 1] << (32 - sh);
    const unsigned q = (unsigned)(v & ((1u << bits) - 1));
    const uint16_t sv = ((const uint16_t *)s->data)[r * (C / G) + k / G], bv = ((const uint16_t *)b->data)[r * (C / G) + k / G];
    return quant_bf16_to_f32(sv) * (float)q + quant_bf16_to_f32(bv);
}

static void edit_mlx(json_t *cfg) {
    json_object_set_new(cfg, "quantization", json_pack("{s:i, s:i, s:s}", "group_size", 64, "bits", 4, "mode", "affine"));
}

static void test_mlx(void) {
    char err[512];
    st_set *s = st_open(HF "/qwen35moe-tiny", err, sizeof err);
    if (!s) return;
    wlist l = {0};
    from_st(&l, s);
    /* mlx-lm's sanitized layout: experts stacked as switch_mlp, conv1d [C, K, 1], zero-centered
     * norms stored as 1 + w (in F32 here, so that the two paths must agree bit for bit) */
    const int64_t E = 4, I = 128, H = 256;
    for (int L = 0; L < 2; L++) {
        static const char *pp[3] = {"gate", "up", "down"};
        for (int p = 0; p < 3; p++) {
            const int64_t R = p == 2 ? H : I, C = p == 2 ? I : H;
            uint16_t *st = own(&l, (size_t)(E * R * C) * 2);
            char nm[160];
            for (int e = 0; e < E; e++) {
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s_proj.weight", L, e, pp[p]);
                wt *t = find_wt(&l, nm);
                memcpy(st + (size_t)e * R * C, t->data, t->nbytes);
                drop_wt(&l, nm);
            }
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.switch_mlp.%s_proj.weight", L, pp[p]);
            add(&l, nm, "BF16", 3, (int64_t[]){E, R, C}, st, (size_t)(E * R * C) * 2);
        }
    }
    for (int i = 0; i < l.n; i++) {
        wt *t = &l.v[i];
        if (strstr(t->name, "conv1d")) {
            int64_t sh[3] = {t->shape[0], t->shape[2], 1};
            memcpy(t->shape, sh, sizeof sh);
        } else if (t->nd == 1 && strstr(t->name, "norm") && !strstr(t->name, "linear_attn.norm")) {
            float *f = own(&l, (size_t)t->shape[0] * 4);
            for (int64_t k = 0; k < t->shape[0]; k++) {
                const uint8_t *p = (const uint8_t *)t->data + 2 * k;
                f[k] = 1.0f + quant_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
            }
            t->dtype = "F32";
            t->data = f;
            t->nbytes = (size_t)t->shape[0] * 4;
        }
    }
    const int n0 = l.n;
    for (int i = 0; i < n0; i++) {
        wt *t = &l.v[i];
        size_t len = strlen(t->name);
        if (t->nd < 2 || len < 7 || strcmp(t->name + len - 7, ".weight") != 0 || strstr(t->name, "conv1d"))
            continue;
        char base[160];
        snprintf(base, sizeof base, "%.*s", (int)(len - 7), t->name);
        mlx_quantize_into(&l, &l.v[i], base, mlx_bits_for(base), 64);
    }
    /* mlx-lm's names */
    for (int i = 0; i < l.n; i++) {
        char nm[160];
        snprintf(nm, sizeof nm, "language_model.%.140s", l.v[i].name);
        memcpy(l.v[i].name, nm, sizeof nm);
    }
    const char *dir = make_dir("mlx", "qwen35moe-tiny", &l, edit_mlx);
    for (int i = 0; i < l.n; i++) /* back to plain names for the checks below */
        memmove(l.v[i].name, l.v[i].name + 15, strlen(l.v[i].name + 15) + 1);
    CHECKF(conv(dir, at("mlx-auto.gguf"), CONVERT_TYPE_AUTO, 0, NULL, err, sizeof err) == 0, "%s", err);
    CHECKF(conv(dir, at("mlx-F32.gguf"), GGML_TYPE_F32, 0, NULL, err, sizeof err) == 0, "%s", err);
    gguf_file *fa = gguf_open(at("mlx-auto.gguf"), err, sizeof err), *ff = gguf_open(at("mlx-F32.gguf"), err, sizeof err);
    gguf_file *fh = gguf_open(at("qwen35moe-tiny-F32.gguf"), err, sizeof err);
    CHECK(fa && ff && fh);
    if (fa && ff && fh) {
        const uint32_t t4 = (uint32_t)quant_mlx_type(4, 64, true), t8 = (uint32_t)quant_mlx_type(8, 64, true);
        /* types as stored; vectors, router F32 (router: dequantized from 8 bits) */
        const gguf_tensor *qkv = gguf_find_tensor(fa, "blk.0.attn_qkv.weight");
        CHECK(qkv && qkv->type == t4);
        CHECK(gguf_find_tensor(fa, "blk.0.ffn_down_exps.weight")->type == t4);
        CHECK(gguf_find_tensor(fa, "blk.1.ffn_gate_inp.weight")->type == GGML_TYPE_F32);
        CHECK(gguf_find_tensor(fa, "token_embd.weight")->type == t4);
        (void)t8;
        /* norms: already 1 + w, not shifted again; A_log -> -exp as usual */
        static const char *same[] = {"blk.0.attn_norm.weight", "output_norm.weight", "blk.1.attn_q_norm.weight",
                                     "blk.0.ssm_norm.weight", "blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.ssm_conv1d.weight"};
        for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
            const gguf_tensor *x = gguf_find_tensor(fa, same[k]), *y = gguf_find_tensor(fh, same[k]);
            CHECKF(x && y && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes), "%s", same[k]);
        }
        /* bit-exact groups: GGUF V head j of attn_qkv = checkpoint head (j % Hk)*r + j/Hk */
        const int Hk = 2, r = 2, dv = 64, KD = 128, C = 256, G = 64, nG = C / G, gb = G * 4 / 8;
        wt *w = find_wt(&l, "model.layers.0.linear_attn.in_proj_qkv.weight");
        wt *sc = find_wt(&l, "model.layers.0.linear_attn.in_proj_qkv.scales");
        int bad = 0;
        for (int row = 0; row < 512 && w && sc; row++) {
            int src = row;
            if (row >= 2 * KD) {
                int j = (row - 2 * KD) / dv, wi = (row - 2 * KD) % dv;
                src = 2 * KD + ((j % Hk) * r + j / Hk) * dv + wi;
            }
            const uint8_t *blk = (const uint8_t *)qkv->data + (size_t)row * nG * (4 + gb);
            for (int g = 0; g < nG; g++, blk += 4 + gb) {
                bad += memcmp(blk, (const uint16_t *)sc->data + src * nG + g, 2) != 0;
                bad += memcmp(blk + 4, (const uint8_t *)w->data + (size_t)src * C * 4 / 8 + g * gb, (size_t)gb) != 0;
            }
        }
        CHECKF(bad == 0, "MLX attn_qkv groups: %d differ", bad);
        /* ssm_out: columns permuted by whole 64-value heads = whole groups: still copied */
        CHECK(gguf_find_tensor(fa, "blk.0.ssm_out.weight")->type == t4);
        CHECKF(!strstr(notes, "requantiz"), "%s", notes);
        /* F32 conversion: every value exactly scale*q + bias (independent decoder) */
        const gguf_tensor *dn = gguf_find_tensor(ff, "blk.1.ffn_down_exps.weight");
        bad = 0;
        for (int e = 0; e < 4 && dn; e++)
            for (int64_t rr = 0; rr < H; rr += 17)
                for (int64_t k = 0; k < I; k++)
                    bad += ((const float *)dn->data)[(e * H + rr) * I + k] !=
                           mlx_value(&l, "model.layers.1.mlp.switch_mlp.down_proj", I, 4, G, e * H + rr, k);
        CHECKF(bad == 0, "MLX down_exps dequantized: %d values differ", bad);
        const gguf_tensor *so = gguf_find_tensor(ff, "blk.0.ssm_out.weight");
        bad = 0;
        for (int64_t rr = 0; rr < H && so; rr += 7)
            for (int64_t c = 0; c < 256; c++) {
                int64_t j = c / dv, wi = c % dv, srcc = ((j % Hk) * r + j / Hk) * dv + wi;
                bad += ((const float *)so->data)[rr * 256 + c] !=
                       mlx_value(&l, "model.layers.0.linear_attn.out_proj", 256, 4, G, rr, srcc);
            }
        CHECKF(bad == 0, "MLX ssm_out columns: %d values differ", bad);
    }
    if (fa) gguf_close(fa);
    if (ff) gguf_close(ff);
    if (fh) gguf_close(fh);
    /* logits: the MLX-typed GGUF against the same weights in F32 (differences: Q8_0 activations) */
    int n, nv, nv2;
    int32_t *ids = read_ids(HF "/qwen35moe-tiny.prompt.ids", &n);
    float *a = logits_of(at("mlx-auto.gguf"), ids, n, &nv), *b = logits_of(at("mlx-F32.gguf"), ids, n, &nv2);
    if (a && b) {
        agree g = compare(a, b, n, nv);
        printf("  qwen35moe-tiny MLX4 vs its F32 median %.3g  max %.3g  top1 %.3f\n", g.median, g.max, g.top1);
        CHECK(g.median < 0.03 && g.top1 >= 0.9);
    }
    /* an expert-major store of the MLX file, resident and streamed through the smallest cache:
     * bit-identical logits (the store invariant holds for the MLX types too) */
    CHECKF(store_repack(at("mlx-auto.gguf"), at("mlx-store.gguf"), NULL, NULL, err, sizeof err) == 0,
           "%s", err);
    sluice_model_params sp = {.mode = SLUICE_MODE_STREAM, .cache_experts = 5, .verify_reads = true};
    float *c = logits_with(at("mlx-store.gguf"), &sp, ids, n, &nv2);
    float *d = logits_of(at("mlx-store.gguf"), ids, n, &nv2);
    CHECK(a && c && d && memcmp(a, c, (size_t)n * nv * sizeof *a) == 0 &&
          memcmp(a, d, (size_t)n * nv * sizeof *a) == 0);
    free(c);
    free(d);
    /* converting to another MLX type requantizes */
    CHECKF(conv(dir, at("mlx-8.gguf"), quant_mlx_type(8, 32, false), 0, NULL, err, sizeof err) == 0, "%s", err);
    free(a);
    free(b);
    free(ids);
    wl_free(&l);
    st_close(s);
}

/* ---- 7. resume ----------------------------------------------------------------------------- */

static void test_resume(void) {
    char err[512];
    const char *dir = HF "/qwen35moe-tiny", *full = at("r-full.gguf"), *out = at("r.gguf");
    convert_report rep;
    CHECKF(conv(dir, full, GGML_TYPE_Q8_0, 0, &rep, err, sizeof err) == 0, "%s", err);
    const int n_t = rep.n_tensors;
    unlink(out);
    CHECK(conv(dir, out, GGML_TYPE_Q8_0, 5, &rep, err, sizeof err) == 1);
    CHECK(access(out, F_OK) != 0 && access(at("r.gguf.partial"), F_OK) == 0 &&
          access(at("r.gguf.partial.journal"), F_OK) == 0);
    CHECK(conv(dir, out, GGML_TYPE_Q8_0, 7, &rep, err, sizeof err) == 1 && rep.resumed_tensors == 0);
    CHECK(conv(dir, out, GGML_TYPE_Q8_0, 0, &rep, err, sizeof err) == 0);
    CHECKF(rep.resumed_tensors == 12 && rep.n_tensors == n_t, "resumed %d", rep.resumed_tensors);
    CHECK(same_file(full, out));
    CHECK(access(at("r.gguf.partial"), F_OK) != 0 && access(at("r.gguf.partial.journal"), F_OK) != 0);
    /* a corrupted completed tensor (#3) is found and everything from it rewritten */
    unlink(out);
    CHECK(conv(dir, out, GGML_TYPE_Q8_0, 6, &rep, err, sizeof err) == 1);
    char e2[256];
    gguf_file *f = gguf_open(full, e2, sizeof e2);
    uint64_t pos = f ? f->data_offset + f->tensors[3].offset + 5 : 0;
    if (f) gguf_close(f);
    FILE *fp = fopen(at("r.gguf.partial"), "r+b");
    if (fp) {
        fseek(fp, (long)pos, SEEK_SET);
        int c = fgetc(fp);
        fseek(fp, (long)pos, SEEK_SET);
        fputc(c ^ 0x40, fp);
        fclose(fp);
    }
    CHECK(conv(dir, out, GGML_TYPE_Q8_0, 0, &rep, err, sizeof err) == 0 && rep.resumed_tensors == 3);
    CHECKF(strstr(notes, "fails its checksum"), "%s", notes);
    CHECK(same_file(full, out));
    /* different options: the partial output is not reused */
    unlink(out);
    CHECK(conv(dir, out, GGML_TYPE_Q8_0, 4, &rep, err, sizeof err) == 1);
    CHECK(conv(dir, out, GGML_TYPE_F16, 0, &rep, err, sizeof err) == 0 && rep.resumed_tensors == 0);
    CHECKF(strstr(notes, "starting over"), "%s", notes);
    /* --restart (no_resume) ignores a partial output */
    unlink(out);
    CHECK(conv(dir, out, GGML_TYPE_Q8_0, 4, &rep, err, sizeof err) == 1);
    convert_options o = {.type = GGML_TYPE_Q8_0, .n_threads = 1, .no_resume = true, .note = note_cb};
    CHECK(convert_hf(dir, out, &o, &rep, err, sizeof err) == 0 && rep.resumed_tensors == 0);
    CHECK(same_file(full, out));
    /* thread count never changes a byte */
    o.no_resume = false;
    o.n_threads = 3;
    CHECK(convert_hf(dir, at("r3.gguf"), &o, &rep, err, sizeof err) == 0 && same_file(full, at("r3.gguf")));
}

/* ---- 8. bad input -------------------------------------------------------------------------- */

static void expect_fail(const char *dir, const char *want) {
    char err[512] = "";
    const char *out = at("bad.gguf");
    unlink(out);
    int rc = conv(dir, out, CONVERT_TYPE_AUTO, 0, NULL, err, sizeof err);
    CHECKF(rc == -1 && strstr(err, want) && !strchr(err, '\n') && access(out, F_OK) != 0,
           "%s: rc %d '%s' (want '%s')", dir, rc, err, want);
}

static void edit_llama(json_t *cfg) { json_object_set_new(cfg, "model_type", json_string("llama")); }
static void edit_noexp(json_t *cfg) { json_object_del(cfg, "num_local_experts"); }
static void edit_yarn(json_t *cfg) {
    json_object_set_new(cfg, "rope_scaling", json_pack("{s:s, s:f}", "rope_type", "yarn", "factor", 4.0));
}
static void edit_gptq(json_t *cfg) {
    json_object_set_new(cfg, "quantization_config", json_pack("{s:s}", "quant_method", "gptq"));
}
static void edit_badint(json_t *cfg) { json_object_set_new(cfg, "hidden_size", json_string("256")); }

static void test_errors(void) {
    char err[512];
    st_set *s = st_open(HF "/qwen3moe-tiny", err, sizeof err);
    if (!s) return;
    mkdir(at("e-empty"), 0755);
    expect_fail(at("e-empty"), "no config.json");
    expect_fail(at("nonexistent"), "no config.json");
    make_dir("e-json", "qwen3moe-tiny", NULL, NULL);
    FILE *fp = fopen(at("e-json/config.json"), "w");
    fputs("{\"model_type\": \"qwen3_moe\",", fp);
    fclose(fp);
    expect_fail(at("e-json"), "config.json: not valid JSON");
    wlist l = {0};
    from_st(&l, s);
    expect_fail(make_dir("e-arch", "qwen3moe-tiny", &l, edit_llama), "model_type 'llama' is not supported");
    expect_fail(make_dir("e-noexp", "qwen3moe-tiny", &l, edit_noexp), "num_experts");
    expect_fail(make_dir("e-yarn", "qwen3moe-tiny", &l, edit_yarn), "RoPE scaling 'yarn'");
    expect_fail(make_dir("e-gptq", "qwen3moe-tiny", &l, edit_gptq), "'gptq' is not supported");
    expect_fail(make_dir("e-int", "qwen3moe-tiny", &l, edit_badint), "'hidden_size' must be an integer");
    make_dir("e-notok", "qwen3moe-tiny", &l, NULL);
    unlink(at("e-notok/tokenizer.json"));
    expect_fail(at("e-notok"), "no tokenizer.json");
    make_dir("e-nost", "qwen3moe-tiny", NULL, NULL);
    expect_fail(at("e-nost"), "no model.safetensors");
    /* a missing tensor, a wrong shape, a truncated file */
    wt saved = *find_wt(&l, "model.layers.1.self_attn.k_proj.weight");
    drop_wt(&l, saved.name);
    expect_fail(make_dir("e-missing", "qwen3moe-tiny", &l, NULL), "missing tensor 'model.layers.1.self_attn.k_proj.weight'");
    saved.shape[0] = 64;
    saved.nbytes /= 2;
    add(&l, saved.name, saved.dtype, saved.nd, saved.shape, saved.data, saved.nbytes);
    expect_fail(make_dir("e-shape", "qwen3moe-tiny", &l, NULL), "has shape [64, 256], expected [128, 256]");
    wl_free(&l);
    from_st(&l, s);
    const char *dir = make_dir("e-trunc", "qwen3moe-tiny", &l, NULL);
    struct stat stt;
    stat(at("e-trunc/model.safetensors"), &stt);
    CHECK(truncate(at("e-trunc/model.safetensors"), stt.st_size - 1000) == 0);
    expect_fail(dir, "past the end of the data");
    /* an output that is no regular file (a pipe; /dev/null as root) is refused, not replaced
     * by the rename that completes a conversion */
    {
        wl_free(&l);
        from_st(&l, s);
        const char *good = make_dir("e-pipe", "qwen3moe-tiny", &l, NULL);
        const char *pipe = at("out.pipe");
        unlink(pipe);
        CHECK(mkfifo(pipe, 0644) == 0);
        char perr[512] = "";
        const int rc = conv(good, pipe, CONVERT_TYPE_AUTO, 0, NULL, perr, sizeof perr);
        struct stat ps;
        CHECKF(rc == -1 && strstr(perr, "not a regular file") && stat(pipe, &ps) == 0 && S_ISFIFO(ps.st_mode),
               "convert into a pipe: rc %d '%s'", rc, perr);
        unlink(pipe);
    }
    /* the CLI: exit status 1 and one line on stderr */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' 2>'%s'", SLUICE_BINARY, dir, at("bad.gguf"), at("stderr.txt"));
    int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    fp = fopen(at("stderr.txt"), "r");
    int lines = 0, ch;
    while (fp && (ch = fgetc(fp)) != EOF) lines += ch == '\n';
    if (fp) fclose(fp);
    CHECK(lines == 1);
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' --type Q9_9 2>/dev/null", SLUICE_BINARY, dir, at("bad.gguf"));
    st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    wl_free(&l);
    st_close(s);
}

int main(void) {
    snprintf(work, sizeof work, "%s/convert-XXXXXX", SLUICE_TEST_WORK);
    if (!mkdtemp(work)) {
        perror("mkdtemp");
        return 1;
    }
    test_safetensors();
    test_fixtures();
    test_variants();
    test_fp8();
    test_mlx();
    test_resume();
    test_errors();
    if (!check_failures) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", work);
    }
    for (int i = 0; i < n_paths; i++) free(paths[i]);
    CHECK_DONE();
}
