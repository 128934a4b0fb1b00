/* sluice info: describe a GGUF file without loading the model, so it works for any
 * architecture: container facts, metadata, tokenizer summary, tensor-type mix and sizes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "formats/gguf.h"
#include "formats/quant.h"

static void print_str(gguf_str s, size_t max) {
    size_t n = s.len < max ? (size_t)s.len : max;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c < 0x20) printf("\\x%02x", c);
        else putchar(c);
    }
    if (s.len > max) printf("... (%llu bytes)", (unsigned long long)s.len);
}

static void print_value(const gguf_kv *kv) {
    switch (kv->type) {
    case GGUF_VT_STRING: putchar('"'); print_str(kv->v.s, 80); putchar('"'); break;
    case GGUF_VT_F32: case GGUF_VT_F64: printf("%g", kv->v.f); break;
    case GGUF_VT_BOOL: printf("%s", kv->v.u ? "true" : "false"); break;
    case GGUF_VT_I8: case GGUF_VT_I16: case GGUF_VT_I32: case GGUF_VT_I64:
        printf("%lld", (long long)kv->v.i);
        break;
    case GGUF_VT_ARRAY:
        printf("[%s x %llu]", gguf_vtype_name(kv->arr_type), (unsigned long long)kv->arr_n);
        if (kv->arr_type != GGUF_VT_STRING && kv->arr_type != GGUF_VT_ARRAY && kv->arr_n <= 16) {
            printf(" {");
            for (uint64_t i = 0; i < kv->arr_n; i++) {
                double d;
                gguf_arr_get_f64(kv, i, &d);
                printf(i ? ", %g" : "%g", d);
            }
            putchar('}');
        }
        break;
    default: printf("%llu", (unsigned long long)kv->v.u); break;
    }
}

static const char *human(double bytes, char *buf, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) {
        bytes /= 1024;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", bytes, u[i]);
    return buf;
}

static void tokenizer_summary(const gguf_file *f) {
    gguf_str s;
    printf("\ntokenizer:\n");
    if (gguf_get_str(f, "tokenizer.ggml.model", &s)) {
        printf("  model: ");
        print_str(s, 40);
        putchar('\n');
    } else {
        printf("  (none)\n");
        return;
    }
    if (gguf_get_str(f, "tokenizer.ggml.pre", &s)) {
        printf("  pre-tokenizer: ");
        print_str(s, 40);
        putchar('\n');
    }
    const gguf_kv *tok = gguf_find(f, "tokenizer.ggml.tokens");
    const gguf_kv *mer = gguf_find(f, "tokenizer.ggml.merges");
    if (tok && tok->type == GGUF_VT_ARRAY) printf("  tokens: %llu\n", (unsigned long long)tok->arr_n);
    if (mer && mer->type == GGUF_VT_ARRAY) printf("  merges: %llu\n", (unsigned long long)mer->arr_n);
    static const char *ids[] = {"bos", "eos", "eot", "padding", "unknown"};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        char key[64];
        snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", ids[i]);
        uint64_t v;
        if (!gguf_get_u64(f, key, &v)) continue;
        printf("  %s: %llu", ids[i], (unsigned long long)v);
        if (tok && tok->arr_strs && v < tok->arr_n) {
            printf(" '");
            print_str(tok->arr_strs[v], 40);
            putchar('\'');
        }
        putchar('\n');
    }
    bool b;
    if (gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b)) printf("  add_bos: %s\n", b ? "true" : "false");
    if (gguf_get_str(f, "tokenizer.chat_template", &s))
        printf("  chat template: %llu bytes\n", (unsigned long long)s.len);
}

int cmd_info(int argc, char **argv) {
    const char *model = NULL;
    bool list_tensors = false, all_keys = false;
    const cli_opt opts[] = {
        {"--model", "-m", OPT_STR, &model, "FILE", "GGUF file (or give it as the argument)"},
        {"--tensors", NULL, OPT_FLAG, &list_tensors, NULL, "list every tensor: name, type, shape, bytes"},
        {"--all-keys", NULL, OPT_FLAG, &all_keys, NULL, "print every metadata key (tokenizer arrays included)"},
    };
    const cli_cmd cmd = {"info", "FILE [--tensors] [--all-keys]",
                         "Describe a GGUF file: container, architecture and hyper-parameters, "
                         "tokenizer, tensor-type mix and sizes. The whole file is validated "
                         "first; the first problem is reported in one line.",
                         NULL, opts, (int)(sizeof opts / sizeof opts[0]), 1};
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (n_pos) model = pos[0];
    if (!model) {
        fprintf(stderr, "sluice info: give a GGUF file\n");
        return 2;
    }
    char err[512], hb[32];
    gguf_file *f = gguf_open(model, err, sizeof err);
    if (!f) {
        fprintf(stderr, "sluice info: %s\n", err);
        return 1;
    }
    printf("file: %s\n  size: %llu bytes (%s)\n  GGUF v%u, %llu metadata keys, %llu tensors, "
           "alignment %llu, data at %llu\n",
           model, (unsigned long long)f->size, human((double)f->size, hb, sizeof hb), f->version,
           (unsigned long long)f->n_kv, (unsigned long long)f->n_tensors,
           (unsigned long long)f->alignment, (unsigned long long)f->data_offset);
    gguf_str arch = {"", 0};
    gguf_get_str(f, "general.architecture", &arch);
    printf("\narchitecture: ");
    print_str(arch, 32);
    printf("\nmetadata:\n");
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        if (!all_keys && strncmp(kv->key, "tokenizer.", 10) == 0) continue;
        printf("  %-48s ", kv->key);
        print_value(kv);
        putchar('\n');
    }
    tokenizer_summary(f);

    uint64_t count[QUANT_TYPE_LIMIT] = {0}, bytes[QUANT_TYPE_LIMIT] = {0};
    uint64_t n_params = 0, expert_bytes = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        count[t->type]++;
        bytes[t->type] += t->nbytes;
        n_params += (uint64_t)gguf_tensor_nelements(t);
        if (strstr(t->name, "_exps.")) expert_bytes += t->nbytes;
    }
    printf("\ntensors: %llu, %.3f B parameters\n", (unsigned long long)f->n_tensors,
           (double)n_params / 1e9);
    printf("  %-10s %8s %14s\n", "type", "count", "bytes");
    for (int t = 0; t < (int)QUANT_TYPE_LIMIT; t++)
        if (count[t])
            printf("  %-10s %8llu %14s\n", quant_type_name((uint32_t)t),
                   (unsigned long long)count[t], human((double)bytes[t], hb, sizeof hb));
    printf("  routed experts: %s", human((double)expert_bytes, hb, sizeof hb));
    uint64_t data = f->size > f->data_offset ? f->size - f->data_offset : 0;
    printf(", other tensors: %s\n",
           human((double)(data > expert_bytes ? data - expert_bytes : 0), hb, sizeof hb));
    if (list_tensors) {
        printf("\n");
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            const gguf_tensor *t = &f->tensors[i];
            printf("  %-40s %-8s [", t->name, quant_type_name(t->type));
            for (uint32_t d = 0; d < t->n_dims; d++)
                printf(d ? ", %lld" : "%lld", (long long)t->ne[d]);
            printf("] %llu\n", (unsigned long long)t->nbytes);
        }
    }
    gguf_close(f);
    return 0;
}
