/* Option parsing for subcommands: "--name value", "--name=value", "-x value". Numbers are
 * checked completely (no trailing garbage, no overflow). */
#include "cli/args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const cli_opt *find_opt(const cli_cmd *cmd, const char *name, size_t len) {
    for (int i = 0; i < cmd->n_opts; i++) {
        const cli_opt *o = &cmd->opts[i];
        if ((o->lng && strlen(o->lng) == len && strncmp(o->lng, name, len) == 0) ||
            (o->shrt && strlen(o->shrt) == len && strncmp(o->shrt, name, len) == 0))
            return o;
    }
    return NULL;
}

bool cli_parse_size(const char *s, uint64_t *out) {
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0) || !isfinite(v)) return false;
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; break;
        case 'm': case 'M': mul = 1024.0 * 1024; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
        case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
        default: return false;
        }
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
        if (*end) return false;
    }
    v *= mul;
    if (v >= 18446744073709551615.0) return false;
    *out = (uint64_t)v;
    return true;
}

static bool set_value(const cli_opt *o, const char *v) {
    char *end;
    errno = 0;
    switch (o->kind) {
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (end == v || *end || errno || x < INT_MIN || x > INT_MAX) return false;
        *(int *)o->target = (int)x;
        return true;
    }
    case OPT_FLOAT: {
        float x = strtof(v, &end);
        if (end == v || *end || errno || !isfinite(x)) return false;
        *(float *)o->target = x;
        return true;
    }
    case OPT_U64: {
        if (*v == '-') return false;
        unsigned long long x = strtoull(v, &end, 0);
        if (end == v || *end || errno) return false;
        *(uint64_t *)o->target = x;
        return true;
    }
    case OPT_SIZE: return cli_parse_size(v, (uint64_t *)o->target);
    case OPT_STR: *(const char **)o->target = v; return true;
    case OPT_LIST: {
        cli_list *l = o->target;
        if (l->n >= CLI_LIST_MAX) return false;
        l->v[l->n++] = v;
        return true;
    }
    case OPT_FLAG: return false;
    }
    return false;
}

int cli_parse(const cli_cmd *cmd, int argc, char **argv, const char **pos, int *n_pos) {
    *n_pos = 0;
    bool only_pos = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_pos && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
            cli_usage(cmd, stdout);
            return 1;
        }
        if (!only_pos && strcmp(a, "--") == 0) {
            only_pos = true;
            continue;
        }
        if (only_pos || a[0] != '-' || a[1] == 0) {
            if (*n_pos >= cmd->max_positional) {
                fprintf(stderr, "sluice %s: unexpected argument '%s' (see sluice %s --help)\n",
                        cmd->name, a, cmd->name);
                return 2;
            }
            pos[(*n_pos)++] = a;
            continue;
        }
        const char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const cli_opt *o = find_opt(cmd, a, len);
        if (!o) {
            fprintf(stderr, "sluice %s: unknown option '%.*s' (see sluice %s --help)\n",
                    cmd->name, (int)len, a, cmd->name);
            return 2;
        }
        if (o->kind == OPT_FLAG) {
            if (eq) {
                fprintf(stderr, "sluice %s: option %s takes no value\n", cmd->name, o->lng);
                return 2;
            }
            *(bool *)o->target = true;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "sluice %s: option %s needs a value %s\n", cmd->name, o->lng,
                        o->metavar ? o->metavar : "");
                return 2;
            }
            v = argv[++i];
        }
        if (!set_value(o, v)) {
            fprintf(stderr, "sluice %s: invalid value '%s' for %s\n", cmd->name, v, o->lng);
            return 2;
        }
    }
    return 0;
}

void cli_usage(const cli_cmd *cmd, FILE *out) {
    fprintf(out, "usage: sluice %s %s\n\n%s\n\noptions:\n", cmd->name, cmd->synopsis,
            cmd->summary);
    for (int i = 0; i < cmd->n_opts; i++) {
        const cli_opt *o = &cmd->opts[i];
        char left[64];
        snprintf(left, sizeof left, "%s%s%s%s%s", o->shrt ? o->shrt : "", o->shrt ? ", " : "",
                 o->lng, o->metavar ? " " : "", o->metavar ? o->metavar : "");
        fprintf(out, "  %-28s %s\n", left, o->help);
    }
    fprintf(out, "  %-28s %s\n", "-h, --help", "show this help");
    if (cmd->details) fprintf(out, "\n%s\n", cmd->details);
}
