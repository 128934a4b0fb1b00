/* The model file of the page-cache tests (test_stream_load, test_resident_hugepages): argv[1]
 * when given (a real model file, kept), else a one-layer qwen35moe-mini (Q4_K_M, ~390 MB: a
 * 199 MB Q6_K output head, one layer of routed experts) synthesized into the test work
 * directory as `name`. False with err set when synth fails. */
#ifndef SLUICE_TEST_MINI_MODEL_H
#define SLUICE_TEST_MINI_MODEL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "tools/synth.h"

static inline bool mini_model_path(int argc, char **argv, const char *name, uint64_t seed, char *path, size_t len,
                                   char *err, size_t err_len) {
    if (argc > 1) {
        snprintf(path, len, "%s", argv[1]);
        return true;
    }
    snprintf(path, len, "%s/%s", SLUICE_TEST_WORK, name);
    synth_options o = {.preset = "qwen35moe-mini", .type = "Q4_K_M", .out = path, .seed = seed, .n_threads = 2,
                       .n_layer = 1};
    return synth_run(&o, NULL, err, err_len) == 0;
}

#endif
