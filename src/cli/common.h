/* Helpers shared by subcommands. */
#ifndef SLUICE_CLI_COMMON_H
#define SLUICE_CLI_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

#define DEFAULT_MODEL_NAME "sluice-moe-tiny (embedded)"

/* Load the model at path, or the embedded default model when path is NULL. Reports errors. */
sluice_model *cli_load_model(const char *cmd, const char *path);
/* The same with model parameters (memory plan). */
sluice_model *cli_load_model_params(const char *cmd, const char *path,
                                    const sluice_model_params *mp);

/* The prompt text from -p or from the file given by -f (exactly one may be set); NULL and an
 * error message on failure. *len receives the byte count. The result is malloc'd. */
char *cli_prompt_text(const char *cmd, const char *prompt, const char *file, size_t *len);

/* Tokenize text (the model's BOS rule) into a malloc'd array; NULL on error. */
int32_t *cli_tokenize(const char *cmd, const sluice_model *m, const char *text, size_t len,
                      bool parse_special, int *n_out);

/* Parse "1 2 3" / "1,2,3" / "[1, 2, 3]" into a malloc'd array; NULL on error. */
int32_t *cli_parse_ids(const char *cmd, const char *s, int *n_out);

/* Monotonic seconds. */
double cli_now(void);

/* Progress on stderr: a bar when stderr is a terminal, else a line every 10%. ctx is a
 * cli_progress_state initialized with a label. */
typedef struct cli_progress_state {
    const char *label;
    double t0;
    int last; /* last printed permille */
} cli_progress_state;
void cli_progress(void *ctx, uint64_t done, uint64_t total);
void cli_progress_end(cli_progress_state *p);

#endif
