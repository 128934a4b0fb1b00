/* sluice logits: evaluate a prompt as one batch and write the logits of every position as
 * little-endian float32, row-major [tokens][vocab]. The file is written to a temporary name and
 * renamed only when complete, so a failure never leaves a partial file behind. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/plan_opts.h"
#include "formats/outfile.h"

static int write_all(const char *path, const float *data, size_t n) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        fprintf(stderr, "sluice logits: %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    bool ok = fwrite(data, sizeof(float), n, fp) == n;
    ok = (fclose(fp) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "sluice logits: writing %s: %s\n", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

int cmd_logits(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *file = NULL, *ids_arg = NULL, *out = NULL;
    int n_threads = 0, n_batch = 0;
    bool no_special = false;
    cli_plan_opts po = {0};
    const cli_opt base_opts[] = {
        {"--model", "-m", OPT_STR, &model, "FILE", "GGUF model (default: the embedded model)"},
        {"--prompt", "-p", OPT_STR, &prompt, "TEXT", "prompt text (BOS added when the model asks for it)"},
        {"--file", "-f", OPT_STR, &file, "FILE", "read the prompt from a file"},
        {"--ids", NULL, OPT_STR, &ids_arg, "\"1 2 3\"", "evaluate these token ids instead of a text"},
        {"--output", "-o", OPT_STR, &out, "OUT.f32", "output file (required)"},
        {"--threads", "-t", OPT_INT, &n_threads, "N", "CPU threads (default: all cores)"},
        {"--batch-size", "-b", OPT_INT, &n_batch, "N", "tokens per forward pass (default: the whole prompt)"},
        {"--no-parse-special", NULL, OPT_FLAG, &no_special, NULL, "treat special-token text as plain text"},
    };
    cli_opt opts[64];
    int n_opts = (int)(sizeof base_opts / sizeof base_opts[0]);
    memcpy(opts, base_opts, sizeof base_opts);
    n_opts = cli_add_plan_opts(opts, n_opts, 64, &po);
    const cli_cmd cmd = {"logits", "-m MODEL (-p TEXT | -f FILE | --ids \"1 2 3\") -o OUT.f32",
                         "Evaluate the prompt as one batch and write the logits of every "
                         "position: little-endian float32, row-major [tokens][vocab].",
                         NULL, opts, n_opts, 0};
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    sluice_model_params mp = {.n_batch = n_batch};
    if (!cli_plan_params("logits", &po, &mp)) return 2;
    if (po.plan) return cli_print_plan("logits", model, &mp, po.json);
    if (!out) {
        fprintf(stderr, "sluice logits: -o OUT.f32 is required\n");
        return 2;
    }
    char oerr[512];
    if (outfile_check(out, oerr, sizeof oerr) != 0) {
        fprintf(stderr, "sluice logits: %s\n", oerr);
        return 1;
    }
    if ((ids_arg != NULL) + (prompt != NULL) + (file != NULL) != 1) {
        fprintf(stderr, "sluice logits: give exactly one of -p, -f, --ids\n");
        return 2;
    }
    if (n_threads < 0 || n_batch < 0) {
        fprintf(stderr, "sluice logits: -t and -b must not be negative\n");
        return 2;
    }
    sluice_model *m = cli_load_model_params("logits", model, &mp);
    if (!m) return 1;
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    int n = 0;
    int32_t *ids = NULL;
    char *text = NULL;
    if (ids_arg) {
        ids = cli_parse_ids("logits", ids_arg, &n);
    } else {
        size_t len = 0;
        text = cli_prompt_text("logits", prompt, file, &len);
        if (text) ids = cli_tokenize("logits", m, text, len, !no_special, &n);
    }
    rc = 1;
    float *logits = NULL;
    sluice_session *s = NULL;
    if (!ids) goto done;
    if (n == 0) {
        fprintf(stderr, "sluice logits: no tokens to evaluate\n");
        goto done;
    }
    sluice_session_params sp = {.n_ctx = n, .n_batch = n_batch ? n_batch : n, .n_threads = n_threads};
    s = sluice_session_new(m, &sp);
    logits = malloc((size_t)n * (size_t)info.n_vocab * sizeof(float));
    if (!s || !logits) {
        fprintf(stderr, "sluice logits: %s\n", s ? "out of memory" : sluice_last_error());
        goto done;
    }
    double t0 = cli_now();
    if (sluice_session_eval(s, ids, n, logits) != 0) {
        fprintf(stderr, "sluice logits: %s\n", sluice_last_error());
        goto done;
    }
    double dt = cli_now() - t0;
    if (write_all(out, logits, (size_t)n * (size_t)info.n_vocab) != 0) goto done;
    fprintf(stderr, "sluice: %d tokens x %d logits -> %s (%.2f tokens/s)\n", n, info.n_vocab, out,
            dt > 0 ? n / dt : 0.0);
    rc = 0;
done:
    sluice_session_free(s);
    free(logits);
    free(ids);
    free(text);
    sluice_model_free(m);
    return rc;
}
