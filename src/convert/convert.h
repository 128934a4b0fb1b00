/* Hugging Face checkpoint -> GGUF in llama.cpp's layout (sluice convert). docs/convert.md.
 *
 * Input: a directory with config.json, tokenizer.json (+ tokenizer_config.json, optional
 * chat_template.jinja) and safetensors weights (one file or shards with an index) in BF16, F16,
 * F32, FP8 e4m3 with block scales (weight_scale_inv), or MLX affine quantization (uint32 codes +
 * scales + biases). Architectures: qwen3_moe -> qwen3moe, qwen3_5_moe / qwen3_5_moe_text ->
 * qwen35moe, qwen4_exp / qwen4_exp_text -> qwen4exp (with its MTP block when present).
 *
 * Output: written to OUT.partial, tensor by tensor, each completed tensor recorded with its
 * SHA-256 in OUT.partial.journal; renamed to OUT when complete. A rerun with the same inputs and
 * options verifies the recorded tensors and continues after the last good one.
 */
#ifndef SLUICE_CONVERT_H
#define SLUICE_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CONVERT_TYPE_AUTO (-1) /* keep each tensor's stored precision (see docs/convert.md) */

typedef struct convert_options {
    int type;          /* output type id for weight matrices, or CONVERT_TYPE_AUTO */
    int n_threads;     /* quantization threads; 0: online cores */
    bool no_resume;    /* discard a previous partial output instead of continuing it */
    /* progress: bytes of tensor data written so far out of the total */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
    /* notes (warnings, resume decisions): one line each, without newline; NULL: stderr */
    void (*note)(void *ctx, const char *line);
    void *note_ctx;
    /* tests: stop (as if interrupted) after writing this many tensors; 0: never */
    int stop_after;
} convert_options;

typedef struct convert_report {
    char arch[32];
    int n_tensors;
    int resumed_tensors;  /* tensors kept from a previous partial run */
    uint64_t bytes;       /* output file size */
    int n_tokens;
} convert_report;

/* 0 on success, 1 when stopped by stop_after (OUT.partial and its journal remain), -1 with one
 * line in err on failure. */
int convert_hf(const char *hf_dir, const char *out_path, const convert_options *opt,
               convert_report *rep, char *err, size_t err_len);

#endif /* SLUICE_CONVERT_H */
