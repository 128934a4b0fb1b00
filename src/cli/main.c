/* sluice: the command-line front end. One binary, one subcommand per job. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "sluice.h"

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"run", cmd_run, "generate text from a prompt (the embedded default model without -m)"},
    {"info", cmd_info, "describe a GGUF file: architecture, hyper-parameters, tokenizer, tensors"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"logits", cmd_logits, "evaluate a prompt as one batch and write the logits of every position"},
    {"serve", cmd_serve, "serve a model over an OpenAI-compatible HTTP API"},
    {"bench", cmd_bench, "measure prefill/decode speed with exact evidence (llama-bench style)"},
    {"perplexity", cmd_perplexity, "perplexity of a text file over non-overlapping windows"},
    {"synth", cmd_synth, "write a synthetic full-size model (real shapes, random weights)"},
    {"cachesim", cmd_cachesim, "replay a routing trace through expert-cache policies"},
    {"repack", cmd_repack, "rewrite a GGUF as an expert-major store (one aligned record per expert)"},
    {"verify", cmd_verify, "check a model file; for a store, its manifest, records and payload hash"},
    {"convert", cmd_convert, "convert a Hugging Face checkpoint (safetensors) to a GGUF"},
};

static void usage(FILE *out) {
    fprintf(out,
            "sluice %s (%s): inference for Mixture-of-Experts models from GGUF files\n\n"
            "usage: sluice COMMAND [options]\n\ncommands:\n",
            SLUICE_VERSION, sluice_git_rev);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'sluice COMMAND --help' documents each command's options.\n"
                 "'sluice --version' prints the version.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *c = argv[1];
    if (strcmp(c, "--help") == 0 || strcmp(c, "-h") == 0 || strcmp(c, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(c, "--version") == 0) {
        printf("sluice %s (%s)\n", SLUICE_VERSION, sluice_git_rev);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(c, commands[i].name) == 0) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "sluice: unknown command '%s' (see sluice --help)\n", c);
    return 2;
}
