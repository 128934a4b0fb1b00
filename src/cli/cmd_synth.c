/* sluice synth: write a synthetic model with the exact layout of a real checkpoint. */
#include <stdio.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "formats/quant.h"
#include "tools/synth.h"

static void list_presets(void) {
    printf("presets:\n");
    for (int i = 0; synth_preset_at(i); i++) {
        const synth_preset *p = synth_preset_at(i);
        printf("  %-22s %-9s %2d layers, hidden %4d, %3d experts (top-%d, width %d), vocab %d\n",
               p->name, synth_arch_name(p->arch), p->n_layer, p->n_embd, p->n_expert,
               p->n_expert_used, p->n_ff_exp, p->n_vocab);
    }
    printf("types:\n ");
    for (int m = 0; m < MIX_COUNT; m++) printf(" %s", synth_mix_name((synth_mix)m));
    printf("\n");
}

int cmd_synth(int argc, char **argv) {
    synth_options o = {.seed = 1};
    const char *preset = NULL, *type = "Q4_K_M", *out = NULL, *vocab = NULL;
    float skew = 0.0f;
    int n_threads = 0;
    bool dry = false, header_only = false, list = false, tensors = false, quiet = false;
    const cli_opt opts[] = {
        {"--preset", NULL, OPT_STR, &preset, "NAME", "model shape (see --list)"},
        {"--type", NULL, OPT_STR, &type, "MIX", "per-tensor type mix: Q4_K_M (default), Q8_0, Q2_K, Q2_K_XL, Q6_K, IQ4_XS, F16, BF16, F32"},
        {"--output", "-o", OPT_STR, &out, "FILE", "output GGUF (written as FILE.tmp, renamed when complete)"},
        {"--seed", NULL, OPT_U64, &o.seed, "S", "random seed (default 1); same seed, same bytes"},
        {"--routing-skew", NULL, OPT_FLOAT, &skew, "Z", "Zipf exponent of expert popularity with topic locality (default 0: unbiased)"},
        {"--vocab", NULL, OPT_STR, &vocab, "FILE", "tokenizer vocabulary GGUF (default: ggml-vocab-qwen2/qwen35.gguf from the build's test data)"},
        {"--threads", "-t", OPT_INT, &n_threads, "N", "generator threads (default: all cores)"},
        {"--dry-run", NULL, OPT_FLAG, &dry, NULL, "print the plan (tensor types, size) and write nothing"},
        {"--header-only", NULL, OPT_FLAG, &header_only, NULL, "write the real header and a sparse all-zero data section (loader tests)"},
        {"--list-tensors", NULL, OPT_FLAG, &tensors, NULL, "print every tensor's name, type, shape and size"},
        {"--layers", NULL, OPT_INT, &o.n_layer, "N", "only N layers of the preset's shapes (a shallow benchmark file; the name says so)"},
        {"--mtp", NULL, OPT_FLAG, &o.mtp, NULL, "qwen4exp presets: add the MTP block (blk.N.nextn.*, nextn_predict_layers 1) for speculative decoding"},
        {"--list", NULL, OPT_FLAG, &list, NULL, "list presets and type mixes"},
        {"--quiet", "-q", OPT_FLAG, &quiet, NULL, "no plan summary or progress"},
    };
    const cli_cmd cmd = {
        "synth", "--preset NAME [--type MIX] -o FILE [--seed S] [--routing-skew Z]",
        "Write a synthetic model: a standard GGUF with the tensor names, shapes, metadata and "
        "type mix of a real checkpoint, filled with valid random blocks.",
        "Progress goes to stderr: a bar when stderr is a terminal, percentage lines otherwise.\n"
        "docs/synth.md describes the presets (and their sources), the mixes and --routing-skew.",
        opts, (int)(sizeof opts / sizeof opts[0]), 0};
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (list) {
        list_presets();
        return 0;
    }
    if (!preset) {
        fprintf(stderr, "sluice synth: --preset is required (see sluice synth --list)\n");
        return 2;
    }
    if (!out && !dry) {
        fprintf(stderr, "sluice synth: -o FILE is required (or --dry-run)\n");
        return 2;
    }
    if (n_threads < 0) {
        fprintf(stderr, "sluice synth: -t must not be negative\n");
        return 2;
    }
    o.preset = preset;
    o.type = type;
    o.out = out;
    o.vocab = vocab;
    o.routing_skew = skew;
    o.n_threads = n_threads;
    o.dry_run = dry;
    o.header_only = header_only;
    o.list_tensors = tensors;
    o.progress = quiet ? 0 : isatty(fileno(stderr)) ? 1 : 2;
    char err[512];
    if (synth_run(&o, quiet && !tensors ? NULL : stderr, err, sizeof err) != 0) {
        fprintf(stderr, "sluice synth: %s\n", err);
        return 1;
    }
    return 0;
}
