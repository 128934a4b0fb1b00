/* Writes the seed corpora of the fuzz targets (tests/fuzz/corpus_*), a few tiny valid and
 * near-valid inputs each, with the project's own writers where it has them (GGUF, store repack,
 * routing trace) and by hand otherwise (safetensors, request bodies, text, specs). Not run by CI;
 * the output is committed:  make_seeds SOURCE_DIR */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/gguf_write.h"
#include "formats/quant.h"
#include "formats/store.h"
#include "tools/trace.h"

static const char *src;

static void die(const char *what) {
    fprintf(stderr, "make_seeds: %s\n", what);
    exit(1);
}

/* corpus_NAME/FILE = prefix (plen bytes) + body (blen bytes) */
static void seed(const char *corpus, const char *file, const void *prefix, size_t plen,
                 const void *body, size_t blen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fuzz/corpus_%s/%s", src, corpus, file);
    FILE *fp = fopen(path, "wb");
    if (!fp || (plen && fwrite(prefix, 1, plen, fp) != plen) ||
        (blen && fwrite(body, 1, blen, fp) != blen) || fclose(fp) != 0)
        die(path);
}

static void seed_text(const char *corpus, const char *file, uint8_t mode, const char *text) {
    seed(corpus, file, &mode, 1, text, strlen(text));
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) die(path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)n + 1);
    if (!p || fread(p, 1, (size_t)n, fp) != (size_t)n) die(path);
    fclose(fp);
    *len = (size_t)n;
    return p;
}

/* ---- safetensors: 8-byte length, JSON header, data ------------------------------------------ */

static size_t st_file(uint8_t *out, const char *json, const uint8_t *data, size_t dlen) {
    uint64_t h = strlen(json);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(h >> (8 * i));
    memcpy(out + 8, json, h);
    memcpy(out + 8 + h, data, dlen);
    return 8 + h + dlen;
}

static void safetensors_seeds(void) {
    uint8_t data[64], buf[1024], two[2048];
    for (int i = 0; i < 64; i++) data[i] = (uint8_t)(i * 37 + 1);
    static const uint8_t one = 0, sharded = 1;
    size_t n = st_file(buf,
                       "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}",
                       data, 16);
    seed("safetensors", "valid_f32_bf16", &one, 1, buf, n);
    n = st_file(buf,
                "{\"e4\":{\"dtype\":\"F8_E4M3\",\"shape\":[3],\"data_offsets\":[0,3]},"
                "\"e5\":{\"dtype\":\"F8_E5M2\",\"shape\":[1,1],\"data_offsets\":[3,4]},"
                "\"i\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]},"
                "\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[16,20]},"
                "\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[24,32]},"
                "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[32,32]}}",
                data, 32);
    seed("safetensors", "valid_dtypes", &one, 1, buf, n);
    n = st_file(buf,
                "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                data, 12);
    seed("safetensors", "overlap", &one, 1, buf, n);
    n = st_file(buf, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 16);
    seed("safetensors", "truncated", &one, 1, buf, n - 5);
    const char *index = "{\"metadata\":{\"total_size\":16},\"weight_map\":{"
                        "\"a\":\"model-00001-of-00001.safetensors\","
                        "\"b\":\"model-00001-of-00001.safetensors\"}}";
    size_t il = strlen(index);
    memcpy(two, index, il);
    two[il] = 0;
    n = st_file(two + il + 1,
                "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                data, 16);
    seed("safetensors", "sharded", &sharded, 1, two, il + 1 + n);
}

/* ---- routing traces ---------------------------------------------------------------------- */

static void trace_seeds(void) {
    char path[] = "/tmp/make_seeds_trace.XXXXXX", err[256];
    int fd = mkstemp(path);
    if (fd < 0) die("mkstemp");
    close(fd);
    trace_writer *w = trace_writer_open(path, 2, 4, 2, 1234, err, sizeof err);
    if (!w) die(err);
    const int32_t ex[4][2] = {{0, 1}, {3, 2}, {1, 3}, {2, 0}};
    const float wt[2] = {0.75f, 0.25f};
    for (int seq = 0; seq < 2; seq++) {
        trace_writer_set_seq(w, seq);
        for (int layer = 0; layer < 2; layer++) /* a prompt chunk of two tokens */
            for (int pos = 0; pos < 2; pos++) trace_writer_route(w, layer, pos, 2, ex[layer * 2 + pos], wt);
        for (int layer = 0; layer < 2; layer++) trace_writer_route(w, layer, 2, 2, ex[layer], wt);
    }
    if (trace_writer_close(w, err, sizeof err) != 0) die(err);
    size_t len;
    uint8_t *p = slurp(path, &len);
    seed("trace", "valid", NULL, 0, p, len);
    seed("trace", "header_only", NULL, 0, p, TRACE_HEADER_BYTES);
    seed("trace", "truncated", NULL, 0, p, len - 3);
    p[TRACE_HEADER_BYTES + 8] = 9; /* expert 9 of 4 */
    seed("trace", "bad_expert", NULL, 0, p, len);
    free(p);
    unlink(path);
}

/* ---- server request bodies (byte 0: endpoint and template, see fuzz_server.c) ------------- */

static void server_seeds(void) {
    seed_text("server", "chat", 0,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
              "{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":8,\"temperature\":0.5,"
              "\"stop\":[\"\\n\\n\",\"<|im_end|>\"],\"stream\":true,"
              "\"stream_options\":{\"include_usage\":true}}");
    seed_text("server", "chat_think", 4 | 16 | 32,
              "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
              "{\"role\":\"assistant\",\"content\":\"<think>x</think>\\n\\nb\"},"
              "{\"role\":\"tool\",\"content\":\"r1\"},{\"role\":\"tool\",\"content\":\"r2\"},"
              "{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"p1\"},"
              "{\"type\":\"text\",\"text\":\"\\u00e9\\ud83d\\ude00\"}]},"
              "{\"role\":\"user\",\"content\":\"c\"}],"
              "\"chat_template_kwargs\":{\"enable_thinking\":false},\"seed\":-5,\"top_k\":0,"
              "\"top_p\":1,\"min_p\":0,\"repeat_penalty\":1.1,\"repeat_last_n\":64,"
              "\"tools\":[],\"n\":1,\"logprobs\":false,\"response_format\":{\"type\":\"text\"}}");
    seed_text("server", "chat_plain", 2,
              "{\"messages\":[{\"role\":\"assistant\",\"content\":null},"
              "{\"role\":\"user\",\"content\":\"Once upon\"}],\"stop\":\"upon\"}");
    seed_text("server", "chat_bad_role", 0,
              "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}");
    seed_text("server", "completion", 1,
              "{\"prompt\":\"The cat\",\"max_tokens\":16,\"stop\":[\"cat\",\"a\"],"
              "\"ignore_eos\":true,\"echo\":false,\"suffix\":\"\"}");
    seed_text("server", "completion_ids", 1, "{\"prompt\":[1,2,3,999],\"best_of\":1}");
    seed_text("server", "completion_nested", 1, "{\"prompt\":[[5,6]],\"logprobs\":0}");
    seed_text("server", "completion_bad", 1, "{\"prompt\":[\"a\",\"b\"],\"max_tokens\":0}");
}

/* ---- tokenizer text (byte 0: bit 0 SentencePiece, bit 1 parse_special, bit 2 add_bos) ----- */

static void tokenizer_seeds(void) {
    seed_text("tokenizer", "bpe_ascii", 0, "Hello world! It's 2024, isn't it?  Numbers: 12345.");
    seed_text("tokenizer", "bpe_unicode", 0, "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80\n\t\r x");
    seed_text("tokenizer", "bpe_special", 2,
              "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    seed_text("tokenizer", "bpe_invalid", 0, "a\xff\xc3(\xe2\x82 \xed\xa0\x80 z");
    seed_text("tokenizer", "spm_story", 1 | 4, "Once upon a time, there was a little girl named Lily.");
    seed_text("tokenizer", "spm_bytes", 1 | 2, "  \xe4\xb8\xad <s></s>\n\xff end");
}

/* ---- expert layouts: a tiny MoE GGUF and its repacked store ------------------------------- */

static void store_seeds(void) {
    char plain[] = "/tmp/make_seeds_plain.XXXXXX", store[] = "/tmp/make_seeds_store.XXXXXX";
    int fd = mkstemp(plain);
    if (fd < 0) die("mkstemp");
    close(fd);
    fd = mkstemp(store);
    if (fd < 0) die("mkstemp");
    close(fd);
    gguf_writer *w = gguf_writer_new();
    if (!w) die("out of memory");
    gguf_w_str(w, "general.architecture", "qwen3moe");
    gguf_w_u32(w, "qwen3moe.block_count", 2);
    gguf_w_u32(w, "qwen3moe.expert_count", 2);
    static float vals[64];
    for (int i = 0; i < 64; i++) vals[i] = (float)i / 8;
    const int64_t ne_gu[3] = {4, 2, 2}, ne_d[3] = {2, 4, 2}, ne_n[1] = {4};
    gguf_w_tensor(w, "blk.0.attn_norm.weight", GGML_TYPE_F32, 1, ne_n, vals);
    gguf_w_tensor(w, "blk.1.ffn_gate_exps.weight", GGML_TYPE_F32, 3, ne_gu, vals);
    gguf_w_tensor(w, "blk.1.ffn_up_exps.weight", GGML_TYPE_F32, 3, ne_gu, vals + 16);
    gguf_w_tensor(w, "blk.1.ffn_down_exps.weight", GGML_TYPE_F32, 3, ne_d, vals + 32);
    if (gguf_writer_save(w, plain) != 0) die("writing the plain GGUF");
    gguf_writer_free(w);
    char err[512];
    if (store_repack(plain, store, NULL, NULL, err, sizeof err) != 0) die(err);
    size_t pl, sl;
    uint8_t *p = slurp(plain, &pl), *s = slurp(store, &sl);
    /* prefix: mode (bit 0: counts from the file; bit 1: also store_verify), n_layer, n_expert */
    static const uint8_t model[3] = {0, 2, 2}, from_file[3] = {1, 0, 0}, verify[3] = {3, 0, 0},
                         wrong[3] = {0, 1, 3};
    seed("store", "plain_model", model, 3, p, pl);
    seed("store", "plain_from_file", from_file, 3, p, pl);
    seed("store", "store_model", model, 3, s, sl);
    seed("store", "store_verify", verify, 3, s, sl);
    seed("store", "store_wrong_counts", wrong, 3, s, sl);
    free(p);
    free(s);
    unlink(plain);
    unlink(store);
}

/* ---- command-line specs (byte 0 % 3: size, override, argv) -------------------------------- */

static void cli_seeds(void) {
    seed_text("cli_specs", "size_g", 0, "6G");
    seed_text("cli_specs", "size_gib", 0, "1.5GiB");
    seed_text("cli_specs", "size_bytes", 0, "123456");
    seed_text("cli_specs", "override_int", 1, "llama.block_count=int:4");
    seed_text("cli_specs", "override_str", 1, "general.name=str:tiny model");
    seed_text("cli_specs", "override_float", 1, "llama.rope.freq_base=float:1e6");
    seed_text("cli_specs", "override_bool", 1, "general.architecture=bool:true");
    static const char argv[] = "--cache\0" "500M\0" "--override-kv=a.b=int:-3\0" "-n\0" "7\0"
                               "--float=0.5\0" "--u64\0" "0x10\0" "-f\0" "model.gguf\0" "--\0" "-x";
    static const uint8_t two = 2;
    seed("cli_specs", "argv", &two, 1, argv, sizeof argv - 1);
}

int main(int argc, char **argv) {
    if (argc != 2) die("usage: make_seeds SOURCE_DIR");
    src = argv[1];
    safetensors_seeds();
    trace_seeds();
    server_seeds();
    tokenizer_seeds();
    store_seeds();
    cli_seeds();
    return 0;
}
