/* Facts about the machine a benchmark ran on, and the process's peak memory. */
#ifndef SLUICE_MACHINE_H
#define SLUICE_MACHINE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct machine_facts {
    char cpu[160];          /* /proc/cpuinfo "model name" */
    int cores;              /* online CPUs */
    uint64_t mem_total;     /* bytes, /proc/meminfo MemTotal */
    uint64_t cgroup_max;    /* bytes, cgroup v2 memory.max; 0: none or unlimited */
    char kernel[160];       /* uname: sysname release */
    char host_arch[80];     /* uname machine */
} machine_facts;

void machine_facts_read(machine_facts *f);

/* Reset the peak resident set (VmHWM) so the next reading covers only what follows; false
 * where the kernel does not allow it (the reading is then the process's peak so far). */
bool machine_peak_rss_reset(void);
/* Peak resident set in bytes: VmHWM, or getrusage's maximum. */
uint64_t machine_peak_rss(void);

#endif
