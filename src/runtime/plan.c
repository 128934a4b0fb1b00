/* The planner (pure) and its formatting. See plan.h. */
#include "runtime/plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MIN_RESERVE (256ull << 20)

const char *plan_reason_name(plan_reason r) {
    switch (r) {
    case PLAN_RESIDENT_FITS: return "resident-fits";
    case PLAN_RESIDENT_FORCED: return "resident-forced";
    case PLAN_STREAM_OVER_BUDGET: return "stream-over-budget";
    case PLAN_STREAM_FORCED: return "stream-forced";
    case PLAN_STREAM_CACHE_GIVEN: return "stream-cache-given";
    case PLAN_DENSE_MODEL: return "dense-model";
    case PLAN_REFUSED_BELOW_FLOOR: return "refused-below-floor";
    case PLAN_REFUSED_RESIDENT: return "refused-resident";
    case PLAN_REFUSED_CACHE: return "refused-cache";
    }
    return "?";
}

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

static void say(plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(plan *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->message, sizeof p->message, fmt, ap);
    va_end(ap);
}

static uint64_t machine_budget(const plan_machine_facts *mc, const char **source) {
    uint64_t b = mc->mem_available;
    *source = "MemAvailable";
    if (mc->has_cgroup_limit) {
        uint64_t used = mc->cgroup_usage > mc->cgroup_reclaimable
                            ? mc->cgroup_usage - mc->cgroup_reclaimable
                            : 0;
        uint64_t free = mc->cgroup_limit > used ? mc->cgroup_limit - used : 0;
        if (free < b || b == 0) {
            b = free;
            *source = mc->cgroup_version == 2 ? "cgroup v2" : "cgroup v1";
        }
    }
    return b;
}

void plan_compute(const plan_model_facts *m, const plan_machine_facts *mc,
                  const plan_request *r, plan *p) {
    memset(p, 0, sizeof *p);
    p->n_ctx = r->n_ctx;
    p->n_batch = r->n_batch;
    if (r->mem_budget) {
        p->budget = r->mem_budget;
        p->budget_source = "--mem-budget";
    } else {
        p->budget = machine_budget(mc, &p->budget_source);
    }
    p->reserve = p->budget / 20 > MIN_RESERVE ? p->budget / 20 : MIN_RESERVE;
    const uint64_t usable = p->budget > p->reserve ? p->budget - p->reserve : 0;
    p->kv = (uint64_t)r->n_ctx * m->kv_bytes_per_pos;
    p->state = m->state_bytes;
    p->scratch = (uint64_t)r->n_batch * m->scratch_per_token + m->scratch_fixed;
    p->overhead = PLAN_OVERHEAD_BYTES;
    const uint64_t common = p->kv + p->state + p->scratch + p->overhead;
    const uint64_t resident_total = m->file_bytes + common;
    p->floor_slots = m->n_moe_layers * m->n_expert_used + 1;
    p->target_slots = m->n_moe_layers * m->n_expert;

    bool cache_given = r->cache_bytes || r->cache_slots;
    bool want_resident = r->mode == SLUICE_MODE_RESIDENT ||
                         (r->mode == SLUICE_MODE_AUTO && !cache_given && resident_total <= usable);
    if (m->n_moe_layers == 0) want_resident = true;

    if (want_resident) {
        p->mode = SLUICE_MODE_RESIDENT;
        p->weights = m->file_bytes;
        p->total = resident_total;
        p->reason = m->n_moe_layers == 0       ? PLAN_DENSE_MODEL
                    : r->mode == SLUICE_MODE_RESIDENT ? PLAN_RESIDENT_FORCED
                                                      : PLAN_RESIDENT_FITS;
        if (resident_total > usable) {
            p->reason = PLAN_REFUSED_RESIDENT;
            say(p, "resident needs %.2f GiB (weights %.2f + context and scratch %.2f) but the "
                   "budget leaves %.2f GiB (%.2f %s minus %.2f reserve)%s",
                gib(resident_total), gib(m->file_bytes), gib(common), gib(usable), gib(p->budget),
                p->budget_source, gib(p->reserve),
                m->n_moe_layers ? "; let experts stream (drop --resident)" : "");
            return;
        }
        p->ok = true;
        say(p, "resident: weights %.2f GiB + context and scratch %.2f GiB fit in %.2f GiB "
               "(%.2f %s minus %.2f reserve)",
            gib(m->file_bytes), gib(common), gib(usable), gib(p->budget), p->budget_source,
            gib(p->reserve));
        return;
    }

    p->mode = SLUICE_MODE_STREAM;
    p->weights = m->dense_bytes;
    const uint64_t base = m->dense_bytes + common;
    const uint64_t room = usable > base ? usable - base : 0;
    uint64_t slots;
    if (r->cache_slots) slots = (uint64_t)r->cache_slots;
    else if (r->cache_bytes) slots = m->slot_bytes ? r->cache_bytes / m->slot_bytes : 0;
    else slots = m->slot_bytes ? room / m->slot_bytes : 0;
    if (slots > (uint64_t)p->target_slots) slots = (uint64_t)p->target_slots;
    p->cache_slots = (int)slots;
    p->cache = slots * m->slot_bytes;
    p->total = base + p->cache;
    p->reason = cache_given                     ? PLAN_STREAM_CACHE_GIVEN
                : r->mode == SLUICE_MODE_STREAM ? PLAN_STREAM_FORCED
                                                : PLAN_STREAM_OVER_BUDGET;
    const uint64_t floor_bytes = (uint64_t)p->floor_slots * m->slot_bytes;
    if (cache_given && p->total > usable) {
        p->reason = PLAN_REFUSED_CACHE;
        say(p, "an expert cache of %.2f GiB plus dense weights, context and scratch %.2f GiB "
               "exceeds the %.2f GiB the budget leaves (%.2f %s minus %.2f reserve)",
            gib(p->cache), gib(base), gib(usable), gib(p->budget), p->budget_source,
            gib(p->reserve));
        return;
    }
    if (slots < (uint64_t)p->floor_slots) {
        p->reason = cache_given ? PLAN_REFUSED_CACHE : PLAN_REFUSED_BELOW_FLOOR;
        say(p, "the expert cache floor is %d experts (%d layers x top-%d + 1) = %.2f GiB, but "
               "%s; dense weights, context and scratch take %.2f GiB of the %.2f GiB the budget "
               "leaves (%.2f %s minus %.2f reserve)",
            p->floor_slots, m->n_moe_layers, m->n_expert_used, gib(floor_bytes),
            cache_given ? "the requested cache holds fewer" : "only that many do not fit",
            gib(base), gib(usable), gib(p->budget), p->budget_source, gib(p->reserve));
        return;
    }
    p->ok = true;
    say(p, "stream: the model needs %.2f GiB resident but %.2f GiB is usable; cache %.2f GiB = "
           "%d of %d experts (floor %d)",
        gib(resident_total), gib(usable), gib(p->cache), p->cache_slots, p->target_slots,
        p->floor_slots);
}

/* ---- formatting ----------------------------------------------------------------------------- */

typedef struct out {
    char *buf;
    size_t cap, len;
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->len < o->cap ? o->buf + o->len : NULL, o->len < o->cap ? o->cap - o->len : 0,
                      fmt, ap);
    va_end(ap);
    if (n > 0) o->len += (size_t)n;
}

static void json_str(out *o, const char *s) {
    put(o, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') put(o, "\\%c", c);
        else if (c < 0x20) put(o, "\\u%04x", c);
        else put(o, "%c", c);
    }
    put(o, "\"");
}

int plan_format(const plan *p, const plan_model_facts *m, bool json, char *buf, size_t cap) {
    out o = {buf, cap, 0};
    if (cap) buf[0] = 0;
    const char *mode = p->mode == SLUICE_MODE_STREAM ? "stream" : "resident";
    if (json) {
        put(&o, "{\"ok\":%s,\"mode\":\"%s\",\"reason\":\"%s\",\"budget\":%llu,\"budget_source\":",
            p->ok ? "true" : "false", mode, plan_reason_name(p->reason),
            (unsigned long long)p->budget);
        json_str(&o, p->budget_source ? p->budget_source : "");
        put(&o, ",\"reserve\":%llu,\"weights\":%llu,\"cache\":%llu,\"kv\":%llu,\"state\":%llu,"
                "\"scratch\":%llu,\"overhead\":%llu,\"total\":%llu,\"cache_slots\":%d,"
                "\"floor_slots\":%d,\"target_slots\":%d,\"slot_bytes\":%llu,\"file_bytes\":%llu,"
                "\"dense_bytes\":%llu,\"expert_bytes\":%llu,\"n_ctx\":%d,\"n_batch\":%d,\"message\":",
            (unsigned long long)p->reserve, (unsigned long long)p->weights,
            (unsigned long long)p->cache, (unsigned long long)p->kv,
            (unsigned long long)p->state, (unsigned long long)p->scratch,
            (unsigned long long)p->overhead, (unsigned long long)p->total, p->cache_slots,
            p->floor_slots, p->target_slots, (unsigned long long)m->slot_bytes,
            (unsigned long long)m->file_bytes, (unsigned long long)m->dense_bytes,
            (unsigned long long)m->expert_bytes, p->n_ctx, p->n_batch);
        json_str(&o, p->message);
        put(&o, "}");
        return (int)o.len;
    }
    put(&o, "plan: %s (%s)%s\n", p->ok ? mode : "refused", plan_reason_name(p->reason),
        p->ok ? "" : " -- nothing was allocated");
    put(&o, "  %-22s %10.2f GiB  (%s)\n", "budget", gib(p->budget),
        p->budget_source ? p->budget_source : "?");
    put(&o, "  %-22s %10.2f GiB\n", "reserve", gib(p->reserve));
    put(&o, "  %-22s %10.2f GiB  (%s)\n", "weights", gib(p->weights),
        p->mode == SLUICE_MODE_STREAM ? "dense tensors, mapped" : "whole file, mapped");
    if (p->mode == SLUICE_MODE_STREAM)
        put(&o, "  %-22s %10.2f GiB  (%d slots of %.2f MiB; floor %d, all %d)\n", "expert cache",
            gib(p->cache), p->cache_slots, (double)m->slot_bytes / (1024.0 * 1024.0),
            p->floor_slots, p->target_slots);
    put(&o, "  %-22s %10.2f GiB  (%d positions)\n", "KV cache", gib(p->kv), p->n_ctx);
    put(&o, "  %-22s %10.2f GiB\n", "recurrent state", gib(p->state));
    put(&o, "  %-22s %10.2f GiB  (batch %d)\n", "scratch", gib(p->scratch), p->n_batch);
    put(&o, "  %-22s %10.2f GiB\n", "process", gib(p->overhead));
    put(&o, "  %-22s %10.2f GiB\n", "total", gib(p->total));
    put(&o, "  why: %s\n", p->message);
    return (int)o.len;
}
