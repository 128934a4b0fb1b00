/* Helpers of the streaming tests (test_stream, test_moe_sets): a fixture's prompt ids and the
 * streaming plan's cache sizes. */
#ifndef SLUICE_TEST_STREAM_FIXTURE_H
#define SLUICE_TEST_STREAM_FIXTURE_H

#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "sluice.h"

/* The fixture's prompt ids (llama.cpp's tokenization of the golden prompt), at most max; NULL
 * when the fixture has none. */
static inline int32_t *fixture_prompt_ids(const char *name, int max, int *n) {
    char file[256], path[1024];
    snprintf(file, sizeof file, "%s.prompt.ids", name);
    if (!fixture_path("golden", file, path, sizeof path)) return NULL;
    FILE *fp = fopen(path, "r");
    if (!fp) return NULL;
    int32_t *ids = malloc((size_t)max * sizeof *ids);
    int k = 0;
    while (ids && k < max && fscanf(fp, "%d", &ids[k]) == 1) k++;
    fclose(fp);
    *n = k;
    return ids;
}

/* The streaming plan's floor and target cache sizes, in experts, for a context of n_ctx. false
 * when there is no plan. */
static inline bool stream_plan_slots(const char *path, int n_ctx, int *floor, int *target) {
    sluice_model_params mp = {.mode = SLUICE_MODE_STREAM, .plan_only = true, .n_ctx = n_ctx};
    sluice_model *m = sluice_model_load(path, &mp);
    if (!m) return false;
    char buf[4096];
    sluice_model_plan(m, true, buf, sizeof buf);
    sluice_model_free(m);
    const char *f = strstr(buf, "\"floor_slots\":");
    const char *t = strstr(buf, "\"target_slots\":");
    if (!f || !t) return false;
    *floor = atoi(f + 14);
    *target = atoi(t + 15);
    return *floor > 0;
}

#endif
