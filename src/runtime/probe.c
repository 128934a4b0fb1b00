/* Machine facts for the planner: the memory cgroup of this process (v2 unified hierarchy or the
 * v1 memory controller), /proc/meminfo. Unreadable files leave facts at zero / absent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/plan.h"

static bool read_u64(const char *path, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char buf[64];
    bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok || strncmp(buf, "max", 3) == 0) return false;
    char *end;
    unsigned long long v = strtoull(buf, &end, 10);
    if (end == buf) return false;
    *out = v;
    return true;
}

/* "key value" lines (memory.stat, /proc/meminfo); value scaled by mult */
static bool read_keyed(const char *path, const char *key, uint64_t mult, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[256];
    size_t kl = strlen(key);
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) == 0 && (line[kl] == ' ' || line[kl] == ':')) {
            *out = strtoull(line + kl + 1, NULL, 10) * mult;
            found = true;
            break;
        }
    }
    fclose(f);
    return found;
}

/* The process's cgroup path for a controller ("" for v2), from /proc/self/cgroup. */
static bool cgroup_path(const char *controller, char *out, size_t cap) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return false;
    char line[512];
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!a || !b) continue;
        *a = 0;
        *b = 0;
        const char *ctrls = a + 1, *path = b + 1;
        bool match = controller[0] ? strstr(ctrls, controller) != NULL : ctrls[0] == 0;
        if (!match) continue;
        snprintf(out, cap, "%s", path);
        out[strcspn(out, "\n")] = 0;
        found = true;
        break;
    }
    fclose(f);
    return found;
}

static bool probe_v1(plan_machine_facts *mc) {
    char rel[400], dir[512], p[600];
    /* inside a container the controller is often mounted at its own cgroup: try both */
    const char *cands[2] = {NULL, ""};
    if (cgroup_path("memory", rel, sizeof rel)) cands[0] = rel;
    for (int i = 0; i < 2; i++) {
        if (!cands[i]) continue;
        snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory%s", cands[i]);
        snprintf(p, sizeof p, "%s/memory.limit_in_bytes", dir);
        uint64_t limit;
        if (!read_u64(p, &limit)) continue;
        /* "no limit" is reported as a huge page-aligned number */
        if (limit >= (1ull << 62)) return false;
        mc->has_cgroup_limit = true;
        mc->cgroup_version = 1;
        mc->cgroup_limit = limit;
        snprintf(p, sizeof p, "%s/memory.usage_in_bytes", dir);
        read_u64(p, &mc->cgroup_usage);
        snprintf(p, sizeof p, "%s/memory.stat", dir);
        read_keyed(p, "total_inactive_file", 1, &mc->cgroup_reclaimable);
        return true;
    }
    return false;
}

static bool probe_v2(plan_machine_facts *mc) {
    char rel[400], p[600];
    if (!cgroup_path("", rel, sizeof rel)) return false;
    snprintf(p, sizeof p, "/sys/fs/cgroup%s/memory.max", rel);
    uint64_t limit;
    if (!read_u64(p, &limit)) return false;
    mc->has_cgroup_limit = true;
    mc->cgroup_version = 2;
    mc->cgroup_limit = limit;
    snprintf(p, sizeof p, "/sys/fs/cgroup%s/memory.current", rel);
    read_u64(p, &mc->cgroup_usage);
    snprintf(p, sizeof p, "/sys/fs/cgroup%s/memory.stat", rel);
    read_keyed(p, "inactive_file", 1, &mc->cgroup_reclaimable);
    return true;
}

void plan_probe(plan_machine_facts *mc) {
    memset(mc, 0, sizeof *mc);
    read_keyed("/proc/meminfo", "MemTotal", 1024, &mc->mem_total);
    read_keyed("/proc/meminfo", "MemAvailable", 1024, &mc->mem_available);
    read_keyed("/proc/meminfo", "SwapTotal", 1024, &mc->swap_total);
    if (!probe_v2(mc)) probe_v1(mc);
}
