/* The architecture registry: general.architecture -> implementation. */
#include <string.h>

#include "models/model.h"

extern const arch_desc arch_llama;
extern const arch_desc arch_qwen3moe;
extern const arch_desc arch_qwen35moe;
extern const arch_desc arch_qwen3next;
extern const arch_desc arch_qwen4exp;

static const arch_desc *const archs[] = {&arch_llama, &arch_qwen3moe, &arch_qwen35moe,
                                         &arch_qwen3next, &arch_qwen4exp};

const arch_desc *arch_find(const char *name) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(archs[i]->name, name) == 0) return archs[i];
    return NULL;
}

const char *arch_supported_list(void) { return "llama, qwen3moe, qwen35moe, qwen3next, qwen4exp"; }
