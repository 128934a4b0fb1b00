/* sluice convert: a Hugging Face checkpoint directory to a GGUF (src/convert, docs/convert.md). */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "convert/convert.h"
#include "formats/quant.h"

static void note_line(void *ctx, const char *line) {
    cli_progress_state *ps = ctx;
    /* finish a progress bar line before a note */
    if (ps && ps->last > 0) {
        cli_progress_end(ps);
        ps->last = 0;
    }
    fprintf(stderr, "sluice convert: %s\n", line);
}

int cmd_convert(int argc, char **argv) {
    const char *type_name = NULL;
    int n_threads = 0;
    bool quiet = false, restart = false;
    const cli_opt opts[] = {
        {"--type", "-t", OPT_STR, &type_name, "T",
         "type of the weight matrices: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, "
         "IQ4_NL, IQ4_XS, MLXb_Gg[_BF16] (b 2,3,4,5,6,8; g 32,64,128), or auto (default: each "
         "tensor's stored precision)"},
        {"--threads", NULL, OPT_INT, &n_threads, "N", "quantization threads (default: all cores)"},
        {"--restart", NULL, OPT_FLAG, &restart, NULL,
         "discard an interrupted conversion's partial output instead of resuming it"},
        {"--quiet", "-q", OPT_FLAG, &quiet, NULL, "no progress output"},
    };
    const cli_cmd cmd = {
        "convert", "HF_DIR OUT.gguf [--type T]",
        "Convert a Hugging Face checkpoint (config.json, tokenizer.json, safetensors in BF16, F16, "
        "F32, FP8 e4m3 with block scales, or MLX affine-quantized) of a qwen3_moe, qwen3_5_moe or "
        "qwen4_exp model to a GGUF in llama.cpp's layout (qwen3moe / qwen35moe / qwen4exp).",
        "Written tensor by tensor to OUT.gguf.partial with a journal of the completed tensors; an "
        "interrupted conversion continues where it stopped when run again with the same inputs "
        "and options (completed tensors are verified first). OUT.gguf appears only when complete. "
        "Vectors, routers and conv1d stay F32; matrices whose rows do not fit the type's block "
        "fall back to Q8_0 or F16. Details: docs/convert.md.",
        opts, (int)(sizeof opts / sizeof opts[0]), 2};
    const char *pos[2];
    int n_pos;
    int rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (n_pos != 2) {
        fprintf(stderr, "sluice convert: give HF_DIR and OUT.gguf\n");
        return 2;
    }
    int type = CONVERT_TYPE_AUTO;
    if (type_name && strcmp(type_name, "auto") != 0) {
        type = quant_type_from_name(type_name);
        if (type < 0) {
            fprintf(stderr, "sluice convert: unknown type '%s'\n", type_name);
            return 2;
        }
    }
    cli_progress_state ps = {.label = "convert"};
    convert_options opt = {.type = type, .n_threads = n_threads, .no_resume = restart,
                           .progress = quiet ? NULL : cli_progress, .progress_ctx = &ps,
                           .note = note_line, .note_ctx = &ps};
    convert_report rep;
    char err[512];
    double t0 = cli_now();
    rc = convert_hf(pos[0], pos[1], &opt, &rep, err, sizeof err);
    if (!quiet) cli_progress_end(&ps);
    if (rc != 0) {
        fprintf(stderr, "sluice convert: %s\n", err);
        return 1;
    }
    fprintf(stderr, "sluice convert: wrote %s (%s, %d tensors, %d tokens, %.2f MB) in %.1f s%s\n",
            pos[1], rep.arch, rep.n_tensors, rep.n_tokens, (double)rep.bytes / 1e6, cli_now() - t0,
            rep.resumed_tensors ? " (resumed)" : "");
    return 0;
}
