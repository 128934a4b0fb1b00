/* libFuzzer target for the small command-line parsers, one input split by its first byte:
 *
 *   0: a size (cli_parse_size: --cache 6G, --mem-budget, --gpu-budget, cachesim's size list);
 *   1: an --override-kv spec "KEY=TYPE:VALUE" (gguf_parse_override), applied to a small GGUF
 *      (tests/fuzz/corpus_gguf/seed1.gguf, opened from memory) and looked up again;
 *   2: a command line (cli_parse, argv split at NUL bytes) against a table with an option of
 *      every kind.
 *
 * Never a crash, leak or undefined behaviour; a refused override has a non-empty error, one
 * line unless the spec itself holds a newline. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "formats/gguf.h"

#ifndef SLUICE_SOURCE_DIR
#error "SLUICE_SOURCE_DIR must name the source tree"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static uint8_t *base; /* a small valid GGUF */
static size_t base_len;
static FILE *devnull;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *path = SLUICE_SOURCE_DIR "/tests/fuzz/corpus_gguf/seed1.gguf";
    FILE *fp = fopen(path, "rb");
    if (!fp) abort();
    base = malloc(1 << 16);
    if (!base) abort();
    base_len = fread(base, 1, 1 << 16, fp);
    fclose(fp);
    devnull = fopen("/dev/null", "w");
    if (!devnull) abort();
    return 0;
}

static void size_spec(const char *s) {
    uint64_t v = 7;
    if (!cli_parse_size(s, &v) && v != 7) abort(); /* a refusal leaves the target alone */
}

static void override_spec(const char *spec) {
    char key[256], err[512] = "";
    gguf_kv v;
    if (gguf_parse_override(spec, key, sizeof key, &v, err, sizeof err) != 0) {
        if (!err[0] || (strchr(err, '\n') && !strchr(spec, '\n'))) abort();
        return;
    }
    if (!key[0] || strlen(key) >= sizeof key || !strchr(spec, '=')) abort();
    gguf_file *f = gguf_open_memory(base, base_len, err, sizeof err);
    if (!f) abort();
    if (gguf_override(f, key, &v, err, sizeof err) == 0) {
        const gguf_kv *kv = gguf_find(f, key);
        if (!kv || kv->type != v.type) abort();
        if (v.type == GGUF_VT_STRING &&
            (kv->v.s.len != v.v.s.len || memcmp(kv->v.s.ptr, v.v.s.ptr, v.v.s.len) != 0))
            abort();
        if (v.type == GGUF_VT_I64 && kv->v.i != v.v.i) abort();
    } else if (!err[0]) {
        abort();
    }
    gguf_close(f);
}

static void command_line(char *s, size_t len) {
    char *argv[64];
    int argc = 0;
    argv[argc++] = "fuzz";
    for (char *p = s; p < s + len && argc < 64; p += strlen(p) + 1) argv[argc++] = p;
    bool flag = false;
    int i = 0;
    float fl = 0;
    const char *str = NULL;
    uint64_t u = 0, sz = 0;
    cli_list list = {0};
    const cli_opt opts[] = {
        {"--flag", "-f", OPT_FLAG, &flag, NULL, "a flag"},
        {"--int", "-n", OPT_INT, &i, "N", "an int"},
        {"--float", NULL, OPT_FLOAT, &fl, "X", "a float"},
        {"--str", "-s", OPT_STR, &str, "S", "a string"},
        {"--u64", NULL, OPT_U64, &u, "N", "a u64"},
        {"--cache", NULL, OPT_SIZE, &sz, "SIZE", "a size"},
        {"--override-kv", NULL, OPT_LIST, &list, "KEY=TYPE:VALUE", "a list"},
    };
    const cli_cmd cmd = {"fuzz", "[options] [FILE]", "fuzz", NULL, opts,
                         (int)(sizeof opts / sizeof opts[0]), 2};
    const char *pos[64];
    int n_pos = 0;
    /* the parser reports on stdout/stderr (glibc's are assignable); keep the fuzzer's log short */
    FILE *out = stdout, *err = stderr;
    stdout = devnull;
    stderr = devnull;
    int rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    stdout = out;
    stderr = err;
    if (rc < 0 || rc > 2 || n_pos < 0 || n_pos > 2 || list.n < 0 || list.n > CLI_LIST_MAX) abort();
    for (int k = 0; k < list.n; k++) override_spec(list.v[k]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    /* an exact-size copy, NUL-terminated, so that ASan sees any read past the end */
    char *s = malloc(size);
    if (!s) abort();
    memcpy(s, data + 1, size - 1);
    s[size - 1] = 0;
    switch (data[0] % 3) {
    case 0: size_spec(s); break;
    case 1: override_spec(s); break;
    default: command_line(s, size - 1); break;
    }
    free(s);
    return 0;
}
