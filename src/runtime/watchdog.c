/* The memory watchdog: a thread that samples the kernel's memory signals every 100 ms and
 * trips (once, for good) when running on would mean swapping or an OOM kill:
 *   - pages written to swap since start (/proc/vmstat pswpout);
 *   - memory pressure stalls: the PSI memory "full" stall time (/proc/pressure/memory) of the
 *     last 10 s since the start above a share of those 10 s;
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

/* The cumulative PSI memory "full" stall time in microseconds (the "total=" field). */
static bool psi_full_total(uint64_t *out) {
    FILE *f = fopen("/proc/pressure/memory", "r");
    if (!f) return false;
    char line[256];
    bool found = false;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "full ", 5) == 0) {
            const char *a = strstr(line, "total=");
            if (a) {
                *out = strtoull(a + 6, NULL, 10);
                found = true;
            }
        }
    fclose(f);
    return found;
}

/* Why not the kernel's "avg10": it also counts the stalls before the watchdog started, and
 * populating a resident model reclaims other files' page cache, which the kernel counts as
 * full stalls; a 14.6 GB model loaded over a full page cache then read 20-55% for seconds
 * after its load and the first step stopped, though nothing swapped or thrashed any more. */
double psi_window_add(psi_window *w, uint64_t total_us, int interval_ms) {
    const int n = interval_ms > 0 ? PSI_WINDOW_MS / interval_ms : PSI_RING;
    const int cap = n < 1 ? 1 : n > PSI_RING ? PSI_RING : n;
    if (w->count == 0) w->start = total_us;
    /* the total of cap samples ago, or at the start (no stall counted before it) */
    const uint64_t then = w->count >= cap ? w->ring[w->head] : w->start;
    w->ring[w->head] = total_us;
    w->head = (w->head + 1) % cap;
    if (w->count < cap) w->count++;
    const uint64_t stalled = total_us > then ? total_us - then : 0;
    return 100.0 * (double)stalled / (1000.0 * (double)cap * (double)(interval_ms > 0 ? interval_ms : 1));
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

static void sample(uint64_t swap0, uint64_t oom0, psi_window *psi) {
    uint64_t v;
    if (keyed("/proc/vmstat", "pswpout", &v) && v > swap0)
        trip("swap-out detected (%llu pages written to swap)", (unsigned long long)(v - swap0));
    uint64_t total;
    if (cfg.psi_full_max > 0 && psi_full_total(&total)) {
        const double full = psi_window_add(psi, total, cfg.interval_ms);
        if (full > cfg.psi_full_max)
            trip("memory pressure: tasks fully stalled on memory %.1f%% of the last 10 s", full);
    }
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
    static psi_window psi; /* one watchdog thread at a time */
    memset(&psi, 0, sizeof psi);
    pthread_mutex_lock(&mu);
    while (!quit) {
        pthread_mutex_unlock(&mu);
        sample(swap0, oom0, &psi);
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
