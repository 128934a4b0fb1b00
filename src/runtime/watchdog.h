/* Memory watchdog (see watchdog.c): trips when swap-out, memory pressure, the cgroup limit or a
 * free-memory floor says that going on would swap or be OOM-killed. */
#ifndef SLUICE_WATCHDOG_H
#define SLUICE_WATCHDOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct watchdog_config {
    int interval_ms;         /* sampling period */
    uint64_t min_free_bytes; /* MemAvailable floor, and headroom under the cgroup limit */
    double psi_full_max;     /* PSI memory "full" stall share of the last 10 s (since the start)
                              * that trips, in percent; 0 = ignore */
} watchdog_config;

/* The PSI "full" stall share of the last PSI_WINDOW_MS: the cumulative stall counter sampled
 * every interval, stalls before the first sample not counted. */
#define PSI_WINDOW_MS 10000
#define PSI_RING 1000
typedef struct psi_window {
    uint64_t ring[PSI_RING]; /* the last samples of the counter */
    uint64_t start;          /* the first sample */
    int head, count;
} psi_window;
/* Adds a sample of the counter (microseconds); returns the stall percentage of the window. */
double psi_window_add(psi_window *w, uint64_t total_us, int interval_ms);

watchdog_config watchdog_defaults(void);
/* Start (reference-counted: one thread per process). 0 or -1. */
int watchdog_start(const watchdog_config *c);
void watchdog_stop(void);
/* True once tripped; the cause (one line) goes to out. */
bool watchdog_tripped(char *out, size_t cap);

/* tests */
void watchdog_trip_for_test(const char *cause);
void watchdog_reset_for_test(void);

#endif
