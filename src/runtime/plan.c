/* The planner (pure) and its formatting. See plan.h. */
#include "runtime/plan.h"
#include "runtime/bytes.h"

#include "runtime/ngram_table.h"

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


static void say(plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(plan *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->message, sizeof p->message, fmt, ap);
    va_end(ap);
}

/* "21.03 GiB" or "143.4 MiB" (buf: 32 bytes) */
static const char *size_str(uint64_t b, char *buf) { return bytes_str(b, buf, 32); }

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
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32];
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
    p->floor_slots = m->n_moe_layers * m->n_expert_used + 1;
    p->target_slots = m->n_moe_layers * m->n_expert;

    bool cache_given = r->cache_bytes || r->cache_slots;
    /* The n-gram table is the first tier to leave memory: a token reads a few of its rows,
     * against megabytes of experts. AUTO keeps it mapped only when the whole model fits. */
    p->ngram_resident = true;
    if (m->ngram_bytes > 0) {
        const bool full_fits = m->file_bytes + common <= usable;
        p->ngram_resident = r->ngram_mode == SLUICE_MODE_RESIDENT ||
                            (r->ngram_mode == SLUICE_MODE_AUTO && full_fits &&
                             r->mode != SLUICE_MODE_STREAM && !cache_given);
    }
    uint64_t table_off = 0; /* table bytes that are not mapped in */
    if (!p->ngram_resident) {
        const uint64_t all_rows = m->ngram_row_bytes ? m->ngram_bytes / m->ngram_row_bytes : 0;
        uint64_t rows = r->ngram_cache_rows > 0 ? (uint64_t)r->ngram_cache_rows
                                                : 2 * (uint64_t)r->n_batch * (uint64_t)m->ngram_rows_per_token;
        if (r->ngram_cache_rows <= 0 && rows < 65536) rows = 65536;
        if (rows > all_rows) rows = all_rows;
        if (rows < 1) rows = 1;
        p->ngram_cache_rows = (int)rows;
        p->ngram_cache = ngram_table_stream_bytes(p->ngram_cache_rows, m->ngram_row_bytes, r->io_depth);
        table_off = m->ngram_bytes;
    }
    const uint64_t file_in = m->file_bytes > table_off ? m->file_bytes - table_off : 0;
    const uint64_t dense_in = m->dense_bytes > table_off ? m->dense_bytes - table_off : 0;
    const uint64_t resident_total = file_in + p->ngram_cache + common;
    bool want_resident = r->mode == SLUICE_MODE_RESIDENT ||
                         (r->mode == SLUICE_MODE_AUTO && !cache_given && resident_total <= usable);
    if (m->n_moe_layers == 0) want_resident = true;

    if (want_resident) {
        p->mode = SLUICE_MODE_RESIDENT;
        p->weights = file_in;
        p->total = resident_total;
        p->reason = m->n_moe_layers == 0       ? PLAN_DENSE_MODEL
                    : r->mode == SLUICE_MODE_RESIDENT ? PLAN_RESIDENT_FORCED
                                                      : PLAN_RESIDENT_FITS;
        if (resident_total > usable) {
            p->reason = PLAN_REFUSED_RESIDENT;
            say(p, "resident needs %s (weights %s + context and scratch %s) but the "
                   "budget leaves %s (%s %s minus %s reserve)%s",
                size_str(resident_total, b1), size_str(file_in, b2), size_str(common + p->ngram_cache, b3), size_str(usable, b4), size_str(p->budget, b5),
                p->budget_source, size_str(p->reserve, b6),
                m->n_moe_layers ? "; let experts stream (drop --resident)" : "");
            return;
        }
        p->ok = true;
        say(p, "resident: weights %s + context and scratch %s fit in %s "
               "(%s %s minus %s reserve)",
            size_str(file_in, b1), size_str(common + p->ngram_cache, b2), size_str(usable, b3), size_str(p->budget, b4), p->budget_source,
            size_str(p->reserve, b5));
        return;
    }

    p->mode = SLUICE_MODE_STREAM;
    p->weights = dense_in;
    const uint64_t base = dense_in + p->ngram_cache + common;
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
        say(p, "an expert cache of %s plus dense weights, context and scratch %s "
               "exceeds the %s the budget leaves (%s %s minus %s reserve)",
            size_str(p->cache, b1), size_str(base, b2), size_str(usable, b3), size_str(p->budget, b4), p->budget_source,
            size_str(p->reserve, b5));
        return;
    }
    if (slots < (uint64_t)p->floor_slots) {
        p->reason = cache_given ? PLAN_REFUSED_CACHE : PLAN_REFUSED_BELOW_FLOOR;
        say(p, "the expert cache floor is %d experts (%d layers x top-%d + 1) = %s, but "
               "%s; dense weights, context and scratch take %s of the %s the budget "
               "leaves (%s %s minus %s reserve)",
            p->floor_slots, m->n_moe_layers, m->n_expert_used, size_str(floor_bytes, b1),
            cache_given ? "the requested cache holds fewer" : "not even those fit",
            size_str(base, b2), size_str(usable, b3), size_str(p->budget, b4), p->budget_source, size_str(p->reserve, b5));
        return;
    }
    p->ok = true;
    say(p, "stream: the model needs %s resident but %s is usable; cache %s = "
           "%d of %d experts (floor %d)",
        size_str(resident_total, b1), size_str(usable, b2), size_str(p->cache, b3), p->cache_slots, p->target_slots,
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
    char b1[32];
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
                "\"dense_bytes\":%llu,\"expert_bytes\":%llu,\"n_ctx\":%d,\"n_batch\":%d,"
                "\"ngram_bytes\":%llu,\"ngram_resident\":%s,\"ngram_cache\":%llu,"
                "\"ngram_cache_rows\":%d,\"message\":",
            (unsigned long long)p->reserve, (unsigned long long)p->weights,
            (unsigned long long)p->cache, (unsigned long long)p->kv,
            (unsigned long long)p->state, (unsigned long long)p->scratch,
            (unsigned long long)p->overhead, (unsigned long long)p->total, p->cache_slots,
            p->floor_slots, p->target_slots, (unsigned long long)m->slot_bytes,
            (unsigned long long)m->file_bytes, (unsigned long long)m->dense_bytes,
            (unsigned long long)m->expert_bytes, p->n_ctx, p->n_batch,
            (unsigned long long)m->ngram_bytes, p->ngram_resident ? "true" : "false",
            (unsigned long long)p->ngram_cache, p->ngram_cache_rows);
        json_str(&o, p->message);
        put(&o, "}");
        return (int)o.len;
    }
    put(&o, "plan: %s (%s)%s\n", p->ok ? mode : "refused", plan_reason_name(p->reason),
        p->ok ? "" : " -- nothing was allocated");
    put(&o, "  %-16s %12s  (%s)\n", "budget", size_str(p->budget, b1),
        p->budget_source ? p->budget_source : "?");
    put(&o, "  %-16s %12s\n", "reserve", size_str(p->reserve, b1));
    put(&o, "  %-16s %12s  (%s)\n", "weights", size_str(p->weights, b1),
        p->mode == SLUICE_MODE_STREAM ? "dense tensors, mapped" : "whole file, mapped");
    if (p->mode == SLUICE_MODE_STREAM)
        put(&o, "  %-16s %12s  (%d slots of %.2f MiB; floor %d, all %d)\n", "expert cache",
            size_str(p->cache, b1), p->cache_slots, (double)m->slot_bytes / (1024.0 * 1024.0),
            p->floor_slots, p->target_slots);
    if (m->ngram_bytes > 0) {
        char b2[32];
        if (p->ngram_resident)
            put(&o, "  %-16s %12s  (n-gram table %s, mapped with the weights)\n", "n-gram table",
                "-", size_str(m->ngram_bytes, b2));
        else
            put(&o, "  %-16s %12s  (%d rows of %llu B cached; table %s read on demand, %d rows a "
                "token)\n", "n-gram cache", size_str(p->ngram_cache, b1), p->ngram_cache_rows,
                (unsigned long long)m->ngram_row_bytes, size_str(m->ngram_bytes, b2),
                m->ngram_rows_per_token);
    }
    put(&o, "  %-16s %12s  (%d positions)\n", "KV cache", size_str(p->kv, b1), p->n_ctx);
    put(&o, "  %-16s %12s\n", "recurrent state", size_str(p->state, b1));
    put(&o, "  %-16s %12s  (batch %d)\n", "scratch", size_str(p->scratch, b1), p->n_batch);
    put(&o, "  %-16s %12s\n", "process", size_str(p->overhead, b1));
    put(&o, "  %-16s %12s\n", "total", size_str(p->total, b1));
    put(&o, "  why: %s\n", p->message);
    return (int)o.len;
}
