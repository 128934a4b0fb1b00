/* Minimal test harness: CHECK records a failure and continues; main returns the failure count. */
#ifndef SLUICE_TEST_CHECK_H
#define SLUICE_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int check_failures;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);       \
            check_failures++;                                                              \
        }                                                                                  \
    } while (0)

#define CHECKF(cond, ...)                                                                  \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
            check_failures++;                                                              \
        }                                                                                  \
    } while (0)

#define CHECK_DONE()                                                                       \
    do {                                                                                   \
        if (check_failures) fprintf(stderr, "%d check(s) failed\n", check_failures);       \
        return check_failures ? 1 : 0;                                                     \
    } while (0)

#endif
