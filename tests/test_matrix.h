/* Random weight matrices for the backend op tests: a xorshift stream (seeded per test) and
 * matrices of any codec encoded from random floats of a few magnitudes. */
#ifndef SLUICE_TEST_MATRIX_H
#define SLUICE_TEST_MATRIX_H

#include <stdint.h>
#include <stdlib.h>

#include "backends/backend.h"
#include "formats/quant.h"

static uint64_t test_rs = 0x9e3779b97f4a7c15ull;
static inline uint32_t rnd(void) {
    test_rs ^= test_rs << 13;
    test_rs ^= test_rs >> 7;
    test_rs ^= test_rs << 17;
    return (uint32_t)test_rs;
}
static inline float rnd_unit(void) { return (float)((int)(rnd() % 2001) - 1000) * 1e-3f; }

/* A rows x cols matrix of type t encoded from random floats. */
static inline tview make_matrix(uint32_t t, int64_t cols, int64_t rows) {
    const size_t rb = quant_row_bytes(t, cols);
    uint8_t *d = malloc(rb * (size_t)rows);
    float *x = malloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < cols; i++) x[i] = rnd_unit() * (1.0f + (float)(rnd() % 4));
        quant_traits_of(t)->quantize(x, d + (size_t)r * rb, cols);
    }
    free(x);
    return (tview){.type = t, .ne = {cols, rows, 1, 1}, .row_bytes = rb, .mat_bytes = rb * (size_t)rows,
                   .data = d, .name = "test"};
}

#endif
