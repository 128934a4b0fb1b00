/* sluice tokenize: print the token ids of a text. */
#include <stdio.h>
#include <stdlib.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *file = NULL;
    bool ids_only = false, no_special = false;
    const cli_opt opts[] = {
        {"--model", "-m", OPT_STR, &model, "FILE", "GGUF model whose tokenizer to use (default: the embedded model)"},
        {"--prompt", "-p", OPT_STR, &prompt, "TEXT", "text to tokenize"},
        {"--file", "-f", OPT_STR, &file, "FILE", "read the text from a file"},
        {"--ids", NULL, OPT_FLAG, &ids_only, NULL, "print only the ids, as [1, 2, 3]"},
        {"--no-parse-special", NULL, OPT_FLAG, &no_special, NULL, "treat special-token text (<|im_start|>) as plain text"},
    };
    const cli_cmd cmd = {"tokenize", "-m MODEL (-p TEXT | -f FILE) [--ids]",
                         "Tokenize text with the model's tokenizer. Special tokens are "
                         "recognized unless --no-parse-special; BOS is added only when the "
                         "model's metadata asks for it. Without --ids, one line per token: "
                         "id and its text.",
                         NULL, opts, (int)(sizeof opts / sizeof opts[0]), 0};
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (!prompt && !file) {
        fprintf(stderr, "sluice tokenize: give the text with -p or -f\n");
        return 2;
    }
    sluice_model *m = cli_load_model("tokenize", model);
    if (!m) return 1;
    size_t len = 0;
    char *text = cli_prompt_text("tokenize", prompt, file, &len);
    int n = 0;
    int32_t *ids = text ? cli_tokenize("tokenize", m, text, len, !no_special, &n) : NULL;
    if (ids) {
        if (ids_only) {
            putchar('[');
            for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
            puts("]");
        } else {
            char piece[512];
            for (int i = 0; i < n; i++) {
                int k = sluice_token_to_piece(m, ids[i], true, piece, sizeof piece);
                if (k > (int)sizeof piece) k = (int)sizeof piece;
                printf("%6d -> '%.*s'\n", ids[i], k, piece);
            }
        }
    }
    free(ids);
    free(text);
    sluice_model_free(m);
    return ids ? 0 : 1;
}
