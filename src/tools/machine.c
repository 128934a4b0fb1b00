/* Machine facts from /proc, /sys and uname (see machine.h). */
#include "tools/machine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

static void trim(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = 0;
}

void machine_facts_read(machine_facts *f) {
    memset(f, 0, sizeof *f);
    snprintf(f->cpu, sizeof f->cpu, "unknown");
    char line[512];
    FILE *fp = fopen("/proc/cpuinfo", "r");
    if (fp) {
        while (fgets(line, sizeof line, fp))
            if (strncmp(line, "model name", 10) == 0) {
                const char *c = strchr(line, ':');
                if (c) {
                    snprintf(f->cpu, sizeof f->cpu, "%s", c + 2);
                    trim(f->cpu);
                }
                break;
            }
        fclose(fp);
    }
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    f->cores = nc > 0 ? (int)nc : 1;
    fp = fopen("/proc/meminfo", "r");
    if (fp) {
        unsigned long long kb;
        while (fgets(line, sizeof line, fp))
            if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) {
                f->mem_total = (uint64_t)kb * 1024;
                break;
            }
        fclose(fp);
    }
    fp = fopen("/sys/fs/cgroup/memory.max", "r");
    if (fp) {
        unsigned long long v;
        if (fgets(line, sizeof line, fp) && sscanf(line, "%llu", &v) == 1) f->cgroup_max = v;
        fclose(fp);
    }
    struct utsname u;
    if (uname(&u) == 0) {
        snprintf(f->kernel, sizeof f->kernel, "%s %s", u.sysname, u.release);
        snprintf(f->host_arch, sizeof f->host_arch, "%s", u.machine);
    }
}

bool machine_peak_rss_reset(void) {
    /* writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0) */
    FILE *fp = fopen("/proc/self/clear_refs", "w");
    if (!fp) return false;
    bool ok = fputs("5", fp) >= 0;
    ok = fclose(fp) == 0 && ok;
    return ok;
}

uint64_t machine_peak_rss(void) {
    FILE *fp = fopen("/proc/self/status", "r");
    if (fp) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, fp))
            if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) {
                fclose(fp);
                return (uint64_t)kb * 1024;
            }
        fclose(fp);
    }
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (uint64_t)ru.ru_maxrss * 1024 : 0;
}
