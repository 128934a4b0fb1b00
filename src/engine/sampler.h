/* Token sampling: repetition penalty, top-k, top-p, min-p, temperature, seeded draw.
 * Greedy (temperature <= 0) takes the argmax after the penalty, lowest id on ties. */
#ifndef SLUICE_SAMPLER_H
#define SLUICE_SAMPLER_H

#include <stdint.h>

#include "sluice.h"

typedef struct sampler sampler;

sampler *sampler_new(int n_vocab, const sluice_sampler_params *p);
void sampler_free(sampler *s);
void sampler_set(sampler *s, const sluice_sampler_params *p);
void sampler_reset(sampler *s);
/* Record a token in the penalty history. */
void sampler_accept(sampler *s, int32_t id);
/* Whether sampler_sample is the plain argmax now (greedy, no penalty in effect). */
bool sampler_is_argmax(const sampler *s);
/* Choose a token from logits[n_vocab] (not modified). */
int32_t sampler_sample(sampler *s, const float *logits);

#endif
