#include "cli/common.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* the default model, linked in by default_model.S */
extern const unsigned char sluice_default_model[];
extern const unsigned char sluice_default_model_end[];

sluice_model *cli_load_model(const char *cmd, const char *path) {
    sluice_model_params mp = {0};
    return cli_load_model_params(cmd, path, &mp);
}

sluice_model *cli_load_model_params(const char *cmd, const char *path,
                                    const sluice_model_params *mp) {
    sluice_model *m = path ? sluice_model_load(path, mp)
                           : sluice_model_load_memory(
                                 sluice_default_model,
                                 (size_t)(sluice_default_model_end - sluice_default_model),
                                 DEFAULT_MODEL_NAME, mp);
    if (!m) fprintf(stderr, "sluice %s: %s\n", cmd, sluice_last_error());
    return m;
}

char *cli_prompt_text(const char *cmd, const char *prompt, const char *file, size_t *len) {
    if (prompt && file) {
        fprintf(stderr, "sluice %s: give either -p or -f, not both\n", cmd);
        return NULL;
    }
    if (!file) {
        const char *p = prompt ? prompt : "";
        *len = strlen(p);
        return strdup(p);
    }
    FILE *fp = fopen(file, "rb");
    if (!fp) {
        fprintf(stderr, "sluice %s: %s: %s\n", cmd, file, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t k = fread(buf + n, 1, cap - n, fp);
        n += k;
        if (n < cap) break;
        cap *= 2;
        char *b = realloc(buf, cap + 1);
        if (!b) {
            free(buf);
            buf = NULL;
        } else {
            buf = b;
        }
    }
    bool err = ferror(fp);
    fclose(fp);
    if (!buf || err) {
        fprintf(stderr, "sluice %s: %s: %s\n", cmd, file, buf ? "read error" : "out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int32_t *cli_tokenize(const char *cmd, const sluice_model *m, const char *text, size_t len,
                      bool parse_special, int *n_out) {
    int n = sluice_tokenize(m, text, len, parse_special, true, NULL, 0);
    if (n < 0) {
        fprintf(stderr, "sluice %s: %s\n", cmd, sluice_last_error());
        return NULL;
    }
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids || sluice_tokenize(m, text, len, parse_special, true, ids, n) != n) {
        fprintf(stderr, "sluice %s: tokenization failed\n", cmd);
        free(ids);
        return NULL;
    }
    *n_out = n;
    return ids;
}

int32_t *cli_parse_ids(const char *cmd, const char *s, int *n_out) {
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    const char *p = s;
    while (ids) {
        while (*p == ' ' || *p == ',' || *p == '[' || *p == ']' || *p == '\n' || *p == '\t')
            p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "sluice %s: invalid token id near '%.20s'\n", cmd, p);
            free(ids);
            return NULL;
        }
        if (n == cap) {
            cap *= 2;
            int32_t *b = realloc(ids, cap * sizeof *ids);
            if (!b) {
                free(ids);
                ids = NULL;
                break;
            }
            ids = b;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (!ids) {
        fprintf(stderr, "sluice %s: out of memory\n", cmd);
        return NULL;
    }
    *n_out = (int)n;
    return ids;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cli_progress(void *ctx, uint64_t done, uint64_t total) {
    cli_progress_state *p = ctx;
    if (p->t0 == 0) p->t0 = cli_now();
    int permille = total ? (int)(done * 1000 / total) : 1000;
    bool tty = isatty(2);
    int step = tty ? 2 : 100;
    if (permille < p->last + step && permille != 1000) return;
    if (permille == p->last) return;
    p->last = permille;
    double dt = cli_now() - p->t0;
    double gbs = dt > 0 ? (double)done / dt / 1e9 : 0;
    if (tty) {
        int w = 30, fill = permille * w / 1000;
        fprintf(stderr, "\r%s [%.*s%*s] %5.1f%% %.2f GB/s", p->label, fill,
                "##############################", w - fill, "", permille / 10.0, gbs);
    } else {
        fprintf(stderr, "%s %5.1f%% %.2f GB/s\n", p->label, permille / 10.0, gbs);
    }
}

void cli_progress_end(cli_progress_state *p) {
    if (p->last > 0 && isatty(2)) fputc('\n', stderr);
}
