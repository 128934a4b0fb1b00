/* Locating test data: tests/data first (shipped), then ../shared/fixtures (complete set). */
#ifndef SLUICE_TEST_FIXTURES_H
#define SLUICE_TEST_FIXTURES_H

#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

/* Writes the first existing path among tests/data/<name>, models/<name> (the embedded default
 * model), build/testdata/<name> and ../shared/fixtures/<sub>/<name> into out. sub is e.g.
 * "models", "golden", "tokenizer". */
static inline bool fixture_path(const char *sub, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", SLUICE_TEST_DATA, name);
    if (access(out, R_OK) == 0) return true;
    snprintf(out, cap, "%s/../../models/%s", SLUICE_TEST_DATA, name);
    if (access(out, R_OK) == 0) return true;
    snprintf(out, cap, "%s/%s", SLUICE_TEST_WORK, name);
    if (access(out, R_OK) == 0) return true;
    snprintf(out, cap, "%s/%s/%s", SLUICE_SHARED_FIXTURES, sub, name);
    return access(out, R_OK) == 0;
}

#endif
