/* The memory watchdog: a thread that samples the kernel's memory signals every 100 ms and
 * trips (once, for good) when running on would mean swapping or an OOM kill:
 *   - pages written to swap since start (/proc/vmstat pswpout);
 *   - memory pressure stalls: PSI "full avg10" above a threshold (/proc/pressure/memory);
 *   - the memory cgroup's unreclaimable usage within a floor of its limit, or new OOM events
 *     (v2 memory.events, v1 memory.oom_control);
 *   - MemAvailable below a floor.
 * Work checks watchdog_tripped() between steps and stops with the cause. */
#include "runtime/watchdog.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int users;
static bool running, quit;
static pthread_t thread;
static atomic_bool tripped;
static char why[256];
static watchdog_config cfg;

static bool keyed(const char *path, const char *key, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[256];
    size_t kl = strlen(key);
    bool found = false;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && (line[kl] == ' ' || line[kl] == ':')) {
            *out = strtoull(line + kl + 1, NULL, 10);
            found = true;
            break;
        }
    fclose(f);
    return found;
}

static bool psi_full_avg10(double *out) {
    FILE *f = fopen("/proc/pressure/memory", "r");
    if (!f) return false;
    char line[256];
    bool found = false;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "full ", 5) == 0) {
            const char *a = strstr(line, "avg10=");
            if (a) {
                *out = strtod(a + 6, NULL);
                found = true;
            }
        }
    fclose(f);
    return found;
}

static bool read_u64(const char *path, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char buf[64];
    bool ok = fgets(buf, sizeof buf, f) && strncmp(buf, "max", 3) != 0;
    fclose(f);
    if (ok) *out = strtoull(buf, NULL, 10);
    return ok;
}

static void trip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trip(const char *fmt, ...) {
    if (atomic_load(&tripped)) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    atomic_store(&tripped, true);
}

static uint64_t oom_events(void) {
    uint64_t v = 0, total = 0;
    if (keyed("/sys/fs/cgroup/memory.events", "oom_kill", &v)) total += v;
    if (keyed("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill", &v)) total += v;
    return total;
}

static void sample(uint64_t swap0, uint64_t oom0) {
    uint64_t v;
    if (keyed("/proc/vmstat", "pswpout", &v) && v > swap0)
        trip("swap-out detected (%llu pages written to swap)", (unsigned long long)(v - swap0));
    double full;
    if (cfg.psi_full_max > 0 && psi_full_avg10(&full) && full > cfg.psi_full_max)
        trip("memory pressure: tasks fully stalled on memory %.1f%% of the last 10 s", full);
    uint64_t oom = oom_events();
    if (oom > oom0) trip("the memory cgroup reported an out-of-memory event");
    uint64_t avail;
    if (keyed("/proc/meminfo", "MemAvailable", &avail) && avail * 1024 < cfg.min_free_bytes)
        trip("free memory %.0f MiB is below the floor of %.0f MiB", avail / 1024.0,
             cfg.min_free_bytes / 1048576.0);
    /* cgroup: usage that cannot be reclaimed, close to the limit */
    uint64_t limit, usage, inactive = 0;
    if ((read_u64("/sys/fs/cgroup/memory/memory.limit_in_bytes", &limit) && limit < (1ull << 62) &&
         read_u64("/sys/fs/cgroup/memory/memory.usage_in_bytes", &usage) &&
         (keyed("/sys/fs/cgroup/memory/memory.stat", "total_inactive_file", &inactive), true)) ||
        (read_u64("/sys/fs/cgroup/memory.max", &limit) &&
         read_u64("/sys/fs/cgroup/memory.current", &usage) &&
         (keyed("/sys/fs/cgroup/memory.stat", "inactive_file", &inactive), true))) {
        uint64_t hard = usage > inactive ? usage - inactive : 0;
        if (hard + cfg.min_free_bytes > limit)
            trip("memory cgroup at its limit: %.0f of %.0f MiB in use that cannot be reclaimed",
                 hard / 1048576.0, limit / 1048576.0);
    }
}

static void *watch(void *arg) {
    (void)arg;
    uint64_t swap0 = 0;
    keyed("/proc/vmstat", "pswpout", &swap0);
    uint64_t oom0 = oom_events();
    pthread_mutex_lock(&mu);
    while (!quit) {
        pthread_mutex_unlock(&mu);
        sample(swap0, oom0);
        pthread_mutex_lock(&mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)cfg.interval_ms * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        if (!quit) pthread_cond_timedwait(&cv, &mu, &ts);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

watchdog_config watchdog_defaults(void) {
    return (watchdog_config){.interval_ms = 100, .min_free_bytes = 128ull << 20,
                             .psi_full_max = 20.0};
}

int watchdog_start(const watchdog_config *c) {
    pthread_mutex_lock(&mu);
    int rc = 0;
    if (users++ == 0) {
        cfg = c ? *c : watchdog_defaults();
        quit = false;
        running = pthread_create(&thread, NULL, watch, NULL) == 0;
        if (!running) rc = -1;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

void watchdog_stop(void) {
    pthread_mutex_lock(&mu);
    bool join = users > 0 && --users == 0 && running;
    if (join) {
        quit = true;
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
    if (join) {
        pthread_join(thread, NULL);
        running = false;
    }
}

bool watchdog_tripped(char *out, size_t cap) {
    if (!atomic_load(&tripped)) return false;
    if (out && cap) snprintf(out, cap, "%s", why);
    return true;
}

void watchdog_trip_for_test(const char *cause) { trip("%s", cause); }

void watchdog_reset_for_test(void) {
    atomic_store(&tripped, false);
    why[0] = 0;
}
