/* GGUF reader tests: every value type round trips; malformed files (truncated, bad counts,
 * overflowing dims, bad offsets, overlaps, duplicates, unknown types) are refused with a
 * one-line cause and never crash; the writer's output is read back; real fixtures parse. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixtures.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "formats/quant.h"

/* ---- a raw byte builder, so tests can write any (also invalid) field ---- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void u8(buf *b, uint8_t v) { put(b, &v, 1); }
static void u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void str(buf *b, const char *s) {
    u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void pad(buf *b, size_t a) {
    while (b->n % a) u8(b, 0);
}

/* The knobs of one generated file; zero means "valid default". */
typedef struct spec {
    uint32_t version;        /* 0 -> 3 */
    const char *magic;       /* NULL -> "GGUF" */
    uint64_t n_tensors_lie;  /* when nonzero, the header claims this many tensors */
    uint64_t n_kv_lie;
    uint64_t str_len_lie;    /* length written for general.name */
    uint32_t kv_type_bad;    /* value type written for general.name */
    uint32_t arr_type_bad;
    uint8_t bool_value;      /* 0 -> 1 */
    bool dup_key;
    bool alignment_bad_type;
    uint32_t alignment;      /* 0 -> default (not written) */
    uint32_t n_dims;         /* of tensor 0; 0 -> 2 */
    uint64_t ne0;            /* of tensor 0; 0 -> 64 */
    uint64_t ne1;            /* of tensor 0; 0 -> 4 */
    uint32_t type0;          /* ggml type of tensor 0; 0 -> F32 */
    bool type0_set;
    uint64_t offset1_delta;  /* added to tensor 1's offset */
    bool offset1_overlap;    /* tensor 1 at offset 0 */
    bool dup_name;
    size_t truncate;         /* keep only this many bytes */
} spec;

static buf build(const spec *s) {
    buf b = {0};
    put(&b, s->magic ? s->magic : "GGUF", 4);
    u32(&b, s->version ? s->version : 3);
    u64(&b, s->n_tensors_lie ? s->n_tensors_lie : 2);
    uint64_t n_kv = 18 + (s->dup_key ? 1 : 0) + (s->alignment || s->alignment_bad_type ? 1 : 0);
    u64(&b, s->n_kv_lie ? s->n_kv_lie : n_kv);
    /* every scalar type */
    str(&b, "general.architecture"); u32(&b, GGUF_VT_STRING); str(&b, "llama");
    str(&b, "general.name");
    u32(&b, s->kv_type_bad ? s->kv_type_bad : GGUF_VT_STRING);
    u64(&b, s->str_len_lie ? s->str_len_lie : 4);
    put(&b, "tiny", 4);
    str(&b, "t.u8"); u32(&b, GGUF_VT_U8); u8(&b, 200);
    str(&b, "t.i8"); u32(&b, GGUF_VT_I8); u8(&b, (uint8_t)-5);
    str(&b, "t.u16"); u32(&b, GGUF_VT_U16); { uint16_t v = 60000; put(&b, &v, 2); }
    str(&b, "t.i16"); u32(&b, GGUF_VT_I16); { int16_t v = -30000; put(&b, &v, 2); }
    str(&b, "t.u32"); u32(&b, GGUF_VT_U32); u32(&b, 4000000000u);
    str(&b, "t.i32"); u32(&b, GGUF_VT_I32); u32(&b, (uint32_t)-7);
    str(&b, "t.f32"); u32(&b, GGUF_VT_F32); { float v = 1.5f; put(&b, &v, 4); }
    str(&b, "t.bool"); u32(&b, GGUF_VT_BOOL); u8(&b, s->bool_value ? s->bool_value : 1);
    str(&b, "t.u64"); u32(&b, GGUF_VT_U64); u64(&b, 1ull << 40);
    str(&b, "t.i64"); u32(&b, GGUF_VT_I64); u64(&b, (uint64_t)-(1ll << 40));
    str(&b, "t.f64"); u32(&b, GGUF_VT_F64); { double v = -2.25; put(&b, &v, 8); }
    /* arrays: numeric, strings, nested */
    str(&b, "t.arr_i32"); u32(&b, GGUF_VT_ARRAY);
    u32(&b, s->arr_type_bad ? s->arr_type_bad : GGUF_VT_I32); u64(&b, 3);
    u32(&b, 1); u32(&b, (uint32_t)-2); u32(&b, 3);
    str(&b, "t.arr_str"); u32(&b, GGUF_VT_ARRAY); u32(&b, GGUF_VT_STRING); u64(&b, 2);
    str(&b, "a"); str(&b, "bc");
    str(&b, "t.arr_nested"); u32(&b, GGUF_VT_ARRAY); u32(&b, GGUF_VT_ARRAY); u64(&b, 2);
    u32(&b, GGUF_VT_U8); u64(&b, 2); u8(&b, 1); u8(&b, 2);
    u32(&b, GGUF_VT_STRING); u64(&b, 1); str(&b, "x");
    str(&b, "t.arr_f32"); u32(&b, GGUF_VT_ARRAY); u32(&b, GGUF_VT_F32); u64(&b, 2);
    { float v[2] = {0.5f, -1.0f}; put(&b, v, 8); }
    str(&b, "t.empty"); u32(&b, GGUF_VT_ARRAY); u32(&b, GGUF_VT_U64); u64(&b, 0);
    if (s->dup_key) { str(&b, "t.u8"); u32(&b, GGUF_VT_U8); u8(&b, 1); }
    uint32_t align = s->alignment ? s->alignment : 32;
    if (s->alignment_bad_type) {
        str(&b, "general.alignment"); u32(&b, GGUF_VT_U64); u64(&b, 64);
    } else if (s->alignment) {
        str(&b, "general.alignment"); u32(&b, GGUF_VT_U32); u32(&b, s->alignment);
    }
    /* tensor 0: [ne0, ne1] of type0; tensor 1: [32] Q8_0 */
    uint32_t t0 = s->type0_set ? s->type0 : GGML_TYPE_F32;
    uint64_t ne0 = s->ne0 ? s->ne0 : 64, ne1 = s->ne1 ? s->ne1 : 4;
    uint32_t nd = s->n_dims ? s->n_dims : 2;
    str(&b, "w0"); u32(&b, nd); u64(&b, ne0);
    for (uint32_t d = 1; d < nd && d < 8; d++) u64(&b, d == 1 ? ne1 : 1);
    u32(&b, t0); u64(&b, 0);
    uint64_t bytes0 = 64 * 4 * 4;
    uint64_t off1 = s->offset1_overlap ? 0 : (bytes0 + align - 1) / align * align;
    str(&b, s->dup_name ? "w0" : "w1"); u32(&b, 1); u64(&b, 32); u32(&b, GGML_TYPE_Q8_0);
    u64(&b, off1 + s->offset1_delta);
    pad(&b, align);
    for (uint64_t i = 0; i < bytes0 / 4; i++) { float v = (float)i; put(&b, &v, 4); }
    pad(&b, align);
    uint8_t q8[34] = {0x00, 0x3c}; /* d = 1.0 */
    for (int i = 0; i < 32; i++) q8[2 + i] = (uint8_t)(i - 16);
    put(&b, q8, sizeof q8);
    if (s->truncate && s->truncate < b.n) b.n = s->truncate;
    return b;
}

static gguf_file *open_spec(const spec *s, char *err, size_t n, buf *keep) {
    *keep = build(s);
    return gguf_open_memory(keep->p, keep->n, err, n);
}

static void expect_error(const spec *s, const char *needle, const char *label) {
    char err[512] = "";
    buf b;
    gguf_file *f = open_spec(s, err, sizeof err, &b);
    CHECKF(f == NULL, "%s: malformed file accepted", label);
    CHECKF(strstr(err, needle) != NULL, "%s: error '%s' lacks '%s'", label, err, needle);
    CHECKF(strchr(err, '\n') == NULL, "%s: error is not one line", label);
    gguf_close(f);
    free(b.p);
}

static void test_valid(void) {
    char err[512] = "";
    buf b;
    spec s = {0};
    gguf_file *f = open_spec(&s, err, sizeof err, &b);
    CHECKF(f != NULL, "valid file refused: %s", err);
    if (!f) return;
    CHECK(f->version == 3 && f->n_kv == 18 && f->n_tensors == 2 && f->alignment == 32);
    uint64_t u;
    int64_t i;
    float fl;
    bool bo;
    gguf_str st;
    CHECK(gguf_get_str(f, "general.name", &st) && st.len == 4 && memcmp(st.ptr, "tiny", 4) == 0);
    CHECK(gguf_get_u64(f, "t.u8", &u) && u == 200);
    CHECK(gguf_get_i64(f, "t.i8", &i) && i == -5);
    CHECK(gguf_get_u64(f, "t.u16", &u) && u == 60000);
    CHECK(gguf_get_i64(f, "t.i16", &i) && i == -30000);
    CHECK(gguf_get_u64(f, "t.u32", &u) && u == 4000000000u);
    CHECK(gguf_get_i64(f, "t.i32", &i) && i == -7);
    CHECK(!gguf_get_u64(f, "t.i32", &u)); /* negative does not convert to unsigned */
    CHECK(gguf_get_f32(f, "t.f32", &fl) && fl == 1.5f);
    CHECK(gguf_get_bool(f, "t.bool", &bo) && bo);
    CHECK(gguf_get_u64(f, "t.u64", &u) && u == 1ull << 40);
    uint32_t u32v;
    CHECK(!gguf_get_u32(f, "t.u64", &u32v)); /* out of range */
    CHECK(gguf_get_i64(f, "t.i64", &i) && i == -(1ll << 40));
    CHECK(gguf_get_f32(f, "t.f64", &fl) && fl == -2.25f);
    const gguf_kv *a = gguf_find(f, "t.arr_i32");
    CHECK(a && a->type == GGUF_VT_ARRAY && a->arr_type == GGUF_VT_I32 && a->arr_n == 3);
    CHECK(a && gguf_arr_get_i64(a, 1, &i) && i == -2);
    CHECK(a && !gguf_arr_get_i64(a, 3, &i));
    a = gguf_find(f, "t.arr_str");
    CHECK(a && a->arr_strs && a->arr_n == 2 && a->arr_strs[1].len == 2 &&
          memcmp(a->arr_strs[1].ptr, "bc", 2) == 0);
    a = gguf_find(f, "t.arr_nested");
    CHECK(a && a->arr_type == GGUF_VT_ARRAY && a->arr_n == 2);
    double d;
    a = gguf_find(f, "t.arr_f32");
    CHECK(a && gguf_arr_get_f64(a, 1, &d) && d == -1.0);
    CHECK(gguf_find(f, "missing") == NULL);
    const gguf_tensor *t0 = gguf_find_tensor(f, "w0"), *t1 = gguf_find_tensor(f, "w1");
    CHECK(t0 && t0->ne[0] == 64 && t0->ne[1] == 4 && t0->nbytes == 1024 && t0->type == 0);
    CHECK(t0 && ((const float *)t0->data)[5] == 5.0f);
    CHECK(t1 && t1->nbytes == 34 && t1->offset == 1024);
    CHECK(t1 && (const uint8_t *)t1->data + 34 == f->base + f->size);
    gguf_close(f);
    free(b.p);

    /* custom alignment */
    s.alignment = 256;
    f = open_spec(&s, err, sizeof err, &b);
    CHECKF(f && f->alignment == 256 && f->data_offset % 256 == 0, "alignment 256: %s", err);
    gguf_close(f);
    free(b.p);
    /* version 2 has the same layout */
    s = (spec){.version = 2};
    f = open_spec(&s, err, sizeof err, &b);
    CHECKF(f && f->version == 2, "v2: %s", err);
    gguf_close(f);
    free(b.p);
}

static void test_malformed(void) {
    expect_error(&(spec){.magic = "GGML"}, "not a GGUF file", "magic");
    expect_error(&(spec){.version = 1}, "version 1", "v1");
    expect_error(&(spec){.version = 4}, "unsupported GGUF version 4", "v4");
    expect_error(&(spec){.version = 0x03000000}, "big-endian", "big-endian");
    expect_error(&(spec){.n_tensors_lie = 1ull << 60}, "tensor count", "tensor count");
    expect_error(&(spec){.n_kv_lie = 1ull << 62}, "metadata count", "kv count");
    expect_error(&(spec){.n_kv_lie = 40}, "past the end", "kv count too high");
    expect_error(&(spec){.str_len_lie = 1ull << 63}, "string length", "string length");
    expect_error(&(spec){.kv_type_bad = 13}, "unknown value type 13", "value type");
    expect_error(&(spec){.arr_type_bad = 99}, "unknown value type 99", "array type");
    expect_error(&(spec){.bool_value = 2}, "bool", "bool");
    expect_error(&(spec){.dup_key = true}, "duplicate metadata key 't.u8'", "dup key");
    expect_error(&(spec){.alignment = 48}, "not a power of two", "alignment 48");
    expect_error(&(spec){.alignment_bad_type = true}, "general.alignment has type", "align type");
    expect_error(&(spec){.n_dims = 5}, "5 dimensions", "n_dims");
    expect_error(&(spec){.ne0 = 1ull << 63}, "negative", "negative dim");
    expect_error(&(spec){.ne0 = 1ull << 40, .ne1 = 1ull << 40}, "overflow", "dim overflow");
    expect_error(&(spec){.ne0 = 48, .type0 = GGML_TYPE_Q8_0, .type0_set = true},
                 "not a multiple", "block multiple");
    expect_error(&(spec){.type0 = 4, .type0_set = true}, "unknown ggml type 4", "removed type");
    expect_error(&(spec){.type0 = 1000, .type0_set = true}, "unknown ggml type", "bad type");
    expect_error(&(spec){.offset1_delta = 8}, "not a multiple of the alignment", "unaligned");
    expect_error(&(spec){.offset1_delta = 1ull << 40}, "past the end", "offset past end");
    expect_error(&(spec){.offset1_delta = UINT64_MAX - 1055}, "past the end", "offset wrap");
    expect_error(&(spec){.offset1_overlap = true}, "overlap", "overlap");
    expect_error(&(spec){.dup_name = true}, "duplicate tensor name 'w0'", "dup name");
    expect_error(&(spec){.ne1 = 1000}, "past the end", "tensor too big");

    /* every truncation fails cleanly, except those that only cut trailing bytes */
    buf full = build(&(spec){0});
    for (size_t len = 0; len < full.n; len++) {
        char err[512] = "";
        gguf_file *f = gguf_open_memory(full.p, len, err, sizeof err);
        CHECKF(f == NULL, "truncation to %zu bytes accepted", len);
        CHECKF(err[0] != 0, "truncation to %zu bytes: empty error", len);
        gguf_close(f);
    }
    free(full.p);
}

static void test_writer(void) {
    gguf_writer *w = gguf_writer_new();
    const char *strs[] = {"x", "yz", ""};
    int32_t ints[] = {5, -6};
    float data[64];
    for (int i = 0; i < 64; i++) data[i] = (float)i * 0.5f;
    int64_t ne[2] = {32, 2};
    CHECK(gguf_w_str(w, "general.architecture", "llama") == 0);
    CHECK(gguf_w_u32(w, "a.u32", 7) == 0);
    CHECK(gguf_w_i32(w, "a.i32", -7) == 0);
    CHECK(gguf_w_f32(w, "a.f32", 0.25f) == 0);
    CHECK(gguf_w_bool(w, "a.b", true) == 0);
    CHECK(gguf_w_u64(w, "a.u64", 1ull << 50) == 0);
    CHECK(gguf_w_arr_str(w, "a.strs", strs, 3) == 0);
    CHECK(gguf_w_arr(w, "a.ints", GGUF_VT_I32, ints, 2) == 0);
    gguf_w_set_alignment(w, 64);
    CHECK(gguf_w_tensor(w, "t.a", GGML_TYPE_F32, 2, ne, data) == 0);
    CHECK(gguf_w_tensor(w, "t.b", GGML_TYPE_F32, 1, ne, data) == 1);
    uint8_t *bytes = NULL;
    size_t len = 0;
    CHECK(gguf_writer_to_memory(w, &bytes, &len) == 0);
    char err[512] = "";
    gguf_file *f = gguf_open_memory(bytes, len, err, sizeof err);
    CHECKF(f != NULL, "writer output refused: %s", err);
    if (f) {
        uint32_t u;
        int64_t i;
        float fl;
        bool b;
        uint64_t u64v;
        CHECK(f->alignment == 64 && f->n_tensors == 2);
        CHECK(gguf_get_u32(f, "a.u32", &u) && u == 7);
        CHECK(gguf_get_i64(f, "a.i32", &i) && i == -7);
        CHECK(gguf_get_f32(f, "a.f32", &fl) && fl == 0.25f);
        CHECK(gguf_get_bool(f, "a.b", &b) && b);
        CHECK(gguf_get_u64(f, "a.u64", &u64v) && u64v == 1ull << 50);
        const gguf_kv *kv = gguf_find(f, "a.strs");
        CHECK(kv && kv->arr_n == 3 && kv->arr_strs[2].len == 0);
        const gguf_tensor *t = gguf_find_tensor(f, "t.b");
        CHECK(t && t->offset == 256 && memcmp(t->data, data, 128) == 0);
        /* copy every key into a second writer: identical metadata section */
        gguf_writer *w2 = gguf_writer_new();
        for (uint64_t k = 0; k < f->n_kv; k++)
            if (strcmp(f->kv[k].key, "general.alignment") != 0) gguf_w_copy_kv(w2, &f->kv[k]);
        gguf_w_set_alignment(w2, 64);
        gguf_w_tensor(w2, "t.a", GGML_TYPE_F32, 2, ne, data);
        gguf_w_tensor(w2, "t.b", GGML_TYPE_F32, 1, ne, data);
        uint8_t *bytes2 = NULL;
        size_t len2 = 0;
        CHECK(gguf_writer_to_memory(w2, &bytes2, &len2) == 0);
        CHECK(len2 == len && memcmp(bytes, bytes2, len) == 0);
        free(bytes2);
        gguf_writer_free(w2);
        gguf_close(f);
    }
    free(bytes);
    gguf_writer_free(w);
}

static void test_fixtures(void) {
    static const char *models[] = {"stories260K.gguf", "qwen3moe-tiny-F32.gguf",
                                   "qwen3moe-tiny-Q4_K_M.gguf", "qwen35moe-tiny-F32.gguf"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char path[1024], err[512] = "";
        if (!fixture_path("models", models[i], path, sizeof path)) continue;
        gguf_file *f = gguf_open(path, err, sizeof err);
        CHECKF(f != NULL, "%s: %s", models[i], err);
        if (!f) continue;
        gguf_str arch;
        CHECK(gguf_get_str(f, "general.architecture", &arch));
        CHECK(f->n_tensors > 10);
        gguf_close(f);
    }
    char err[512] = "";
    CHECK(gguf_open("/nonexistent/model.gguf", err, sizeof err) == NULL);
    CHECK(strstr(err, "No such file") != NULL);
    CHECK(gguf_open("/", err, sizeof err) == NULL);
}

int main(void) {
    test_valid();
    test_malformed();
    test_writer();
    test_fixtures();
    CHECK_DONE();
}
