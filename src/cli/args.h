/* Command-line options: each subcommand declares a table of options; the same table drives
 * parsing and --help, so every flag is documented. */
#ifndef SLUICE_CLI_ARGS_H
#define SLUICE_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum opt_kind {
    OPT_FLAG,  /* bool, no value */
    OPT_INT,   /* int */
    OPT_FLOAT, /* float */
    OPT_STR,   /* const char * */
    OPT_U64,   /* uint64_t */
    OPT_SIZE,  /* uint64_t bytes: 123, 4K, 8M, 16G (binary units) */
    OPT_LIST,  /* cli_list: every occurrence appends its value */
} opt_kind;

#define CLI_LIST_MAX 32
typedef struct cli_list {
    const char *v[CLI_LIST_MAX];
    int n;
} cli_list;

typedef struct cli_opt {
    const char *lng;     /* "--temp" */
    const char *shrt;    /* "-n" or NULL */
    opt_kind kind;
    void *target;
    const char *metavar; /* "N", "FILE" */
    const char *help;
} cli_opt;

typedef struct cli_cmd {
    const char *name;     /* "run" */
    const char *synopsis; /* "-m MODEL -p PROMPT [options]" */
    const char *summary;  /* one line */
    const char *details;  /* paragraphs printed after the options, or NULL */
    const cli_opt *opts;
    int n_opts;
    int max_positional;
} cli_cmd;

/* Parse argv (argv[0] is the subcommand name). Positional arguments are returned in pos.
 * Returns 0 to run, 1 when --help was printed, 2 on a usage error (already reported). */
int cli_parse(const cli_cmd *cmd, int argc, char **argv, const char **pos, int *n_pos);
void cli_usage(const cli_cmd *cmd, FILE *out);

/* "12G" -> bytes; false on bad syntax or overflow. */
bool cli_parse_size(const char *s, uint64_t *out);

#endif
