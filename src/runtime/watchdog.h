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
    double psi_full_max;     /* PSI memory "full avg10" percentage that trips; 0 = ignore */
} watchdog_config;

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
