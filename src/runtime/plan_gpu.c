/* The device side of the memory plan (see plan.h): where a model's weights live on a GPU.
 *
 * Budget = --gpu-budget (capped at the free device memory; a smaller value emulates a smaller
 * GPU), else the free device memory; a reserve of max(512 MiB, 5%) stays free for the CUDA
 * context, graphs and fragmentation. Components on the device:
 *   weights   resident: the whole file (one upload); stream: the dense tensors but the token
 *             embeddings (gpu_host_dense_bytes: read from page-locked host memory, one row a
 *             token) and the router lookahead's folded routers (gpu_look_bytes)
 *   cache     stream: slots x slot bytes of VRAM expert cache
 *   kv        KV cache for the planned context plus the recurrent state
 *   scratch   activations and device work buffers for a batch
 * AUTO picks resident when everything fits, else stream with the largest cache that fits
 * (capped at all experts). The floor is one layer's experts plus one: a prefill chunk can need
 * every expert of a layer at once, and they are multiplied from VRAM. Streaming keeps a page-locked
 * host copy of the routed experts (the device reads misses from it) and of the token embeddings,
 * so they must fit in the host budget that plan_compute measured. Pure: unit-tested with synthetic machines. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runtime/bytes.h"
#include "runtime/plan.h"

#define GPU_MIN_RESERVE (512ull << 20)

static void say(plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(plan *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->gpu_message, sizeof p->gpu_message, fmt, ap);
    va_end(ap);
}

static const char *sz(uint64_t b, char *buf) { return bytes_str(b, buf, 32); } /* buf: 32 bytes */

const char *plan_gpu_reason_name(int r) {
    switch (r) {
    case PLAN_GPU_RESIDENT_FITS: return "gpu-resident-fits";
    case PLAN_GPU_RESIDENT_FORCED: return "gpu-resident-forced";
    case PLAN_GPU_STREAM_OVER_BUDGET: return "gpu-stream-over-budget";
    case PLAN_GPU_STREAM_FORCED: return "gpu-stream-forced";
    case PLAN_GPU_REFUSED_DEVICE: return "gpu-refused-device";
    case PLAN_GPU_REFUSED_RESIDENT: return "gpu-refused-resident";
    case PLAN_GPU_REFUSED_FLOOR: return "gpu-refused-floor";
    case PLAN_GPU_REFUSED_PINNED: return "gpu-refused-pinned";
    }
    return "?";
}

void plan_compute_gpu(const plan_model_facts *m, const plan_machine_facts *mc,
                      const plan_request *r, plan *p) {
    char b1[32], b2[32], b3[32], b4[32];
    p->gpu = r->gpu;
    p->gpu_ok = false;
    p->gpu_message[0] = 0;
    if (!r->gpu) return;
    if (!mc->gpu) {
        p->gpu_reason = PLAN_GPU_REFUSED_DEVICE;
        say(p, "no usable CUDA device");
        return;
    }
    p->gpu_budget = mc->vram_free;
    p->gpu_budget_source = "free VRAM";
    if (r->gpu_budget && r->gpu_budget < p->gpu_budget) {
        p->gpu_budget = r->gpu_budget;
        p->gpu_budget_source = "--gpu-budget";
    }
    p->gpu_reserve = p->gpu_budget / 20 > GPU_MIN_RESERVE ? p->gpu_budget / 20 : GPU_MIN_RESERVE;
    const uint64_t usable = p->gpu_budget > p->gpu_reserve ? p->gpu_budget - p->gpu_reserve : 0;
    p->vram_kv = (uint64_t)r->n_ctx * m->kv_bytes_per_pos + m->state_bytes;
    p->vram_scratch = (uint64_t)r->n_batch * (m->scratch_per_token + m->gpu_scratch_per_token) +
                      m->scratch_fixed + m->gpu_scratch_fixed;
    const uint64_t common = p->vram_kv + p->vram_scratch;
    const bool cache_given = r->cache_bytes || r->cache_slots;
    bool resident = r->mode == SLUICE_MODE_RESIDENT ||
                    (r->mode == SLUICE_MODE_AUTO && !cache_given && m->file_bytes + common <= usable);
    if (m->n_moe_layers == 0) resident = true;
    p->gpu_floor_slots = m->n_expert + 1;
    if (resident) {
        p->gpu_mode = SLUICE_MODE_RESIDENT;
        p->vram_weights = m->file_bytes;
        p->vram_cache = 0;
        p->gpu_slots = 0;
        p->pinned = 0;
        p->vram_total = p->vram_weights + common;
        p->gpu_reason = r->mode == SLUICE_MODE_RESIDENT ? PLAN_GPU_RESIDENT_FORCED : PLAN_GPU_RESIDENT_FITS;
        if (p->vram_total > usable) {
            p->gpu_reason = PLAN_GPU_REFUSED_RESIDENT;
            say(p, "resident on the GPU needs %s (weights %s + context and scratch %s) but the "
                   "device budget leaves %s (%s %s minus %s reserve)",
                sz(p->vram_total, b1), sz(m->file_bytes, b2), sz(common, b3), sz(usable, b4),
                p->gpu_budget_source, sz(p->gpu_budget, b1), sz(p->gpu_reserve, b2));
            return;
        }
        p->gpu_ok = true;
        say(p, "every weight in VRAM: %s + context and scratch %s of %s usable",
            sz(m->file_bytes, b1), sz(common, b2), sz(usable, b3));
        return;
    }
    p->gpu_mode = SLUICE_MODE_STREAM;
    const uint64_t host_dense = m->gpu_host_dense_bytes < m->dense_bytes ? m->gpu_host_dense_bytes : 0;
    p->vram_weights = m->dense_bytes - host_dense + m->gpu_look_bytes;
    const uint64_t base = p->vram_weights + common;
    const uint64_t room = usable > base ? usable - base : 0;
    const uint64_t target = (uint64_t)m->n_moe_layers * (uint64_t)m->n_expert;
    uint64_t slots;
    if (r->cache_slots) slots = (uint64_t)r->cache_slots;
    else if (r->cache_bytes) slots = m->gpu_slot_bytes ? r->cache_bytes / m->gpu_slot_bytes : 0;
    else slots = m->gpu_slot_bytes ? room / m->gpu_slot_bytes : 0;
    if (slots > target) slots = target;
    p->gpu_slots = (int)slots;
    p->vram_cache = slots * m->gpu_slot_bytes;
    p->vram_total = base + p->vram_cache;
    p->pinned = m->expert_bytes + host_dense;
    p->gpu_reason = r->mode == SLUICE_MODE_STREAM || cache_given ? PLAN_GPU_STREAM_FORCED
                                                                 : PLAN_GPU_STREAM_OVER_BUDGET;
    if (slots < (uint64_t)p->gpu_floor_slots || p->vram_total > usable) {
        p->gpu_reason = PLAN_GPU_REFUSED_FLOOR;
        say(p, "the VRAM expert cache needs at least %d slots (one layer's %d experts + 1) of %s, "
               "but dense weights, context and scratch take %s of the %s the device budget "
               "leaves (%s %s minus %s reserve)",
            p->gpu_floor_slots, m->n_expert, sz(m->gpu_slot_bytes, b1), sz(base, b2),
            sz(usable, b3), p->gpu_budget_source, sz(p->gpu_budget, b4), sz(p->gpu_reserve, b1));
        return;
    }
    /* the host holds the page-locked experts beside the process itself */
    const uint64_t host_usable = p->budget > p->reserve ? p->budget - p->reserve : 0;
    if (p->pinned + PLAN_OVERHEAD_BYTES > host_usable) {
        p->gpu_reason = PLAN_GPU_REFUSED_PINNED;
        say(p, "GPU streaming reads missed experts from a page-locked host copy of %s, but the "
               "host budget leaves %s (%s)",
            sz(p->pinned, b1), sz(host_usable, b2), p->budget_source ? p->budget_source : "?");
        return;
    }
    p->gpu_ok = true;
    say(p, "dense weights %s in VRAM, experts cached in %s = %d of %llu (floor %d), the rest read "
           "from %s of pinned host memory",
        sz(m->dense_bytes - host_dense, b1), sz(p->vram_cache, b2), p->gpu_slots, (unsigned long long)target,
        p->gpu_floor_slots, sz(p->pinned, b3));
}

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

int plan_format_gpu(const plan *p, const plan_model_facts *m, bool json, char *buf, size_t cap) {
    char b1[32], b2[32];
    out o = {buf, cap, 0};
    if (cap) buf[0] = 0;
    if (!p->gpu) return 0;
    const char *mode = p->gpu_mode == SLUICE_MODE_STREAM ? "stream" : "resident";
    if (json) {
        put(&o, "{\"ok\":%s,\"mode\":\"%s\",\"reason\":\"%s\",\"budget\":%llu,\"budget_source\":\"%s\","
                "\"reserve\":%llu,\"weights\":%llu,\"cache\":%llu,\"kv\":%llu,\"scratch\":%llu,"
                "\"total\":%llu,\"cache_slots\":%d,\"floor_slots\":%d,\"slot_bytes\":%llu,"
                "\"pinned\":%llu,\"message\":\"",
            p->gpu_ok ? "true" : "false", mode, plan_gpu_reason_name(p->gpu_reason),
            (unsigned long long)p->gpu_budget, p->gpu_budget_source ? p->gpu_budget_source : "",
            (unsigned long long)p->gpu_reserve, (unsigned long long)p->vram_weights,
            (unsigned long long)p->vram_cache, (unsigned long long)p->vram_kv,
            (unsigned long long)p->vram_scratch, (unsigned long long)p->vram_total, p->gpu_slots,
            p->gpu_floor_slots, (unsigned long long)m->gpu_slot_bytes,
            (unsigned long long)p->pinned);
        for (const char *s = p->gpu_message; *s; s++) {
            if (*s == '"' || *s == '\\') put(&o, "\\%c", *s);
            else if ((unsigned char)*s >= 0x20) put(&o, "%c", *s);
        }
        put(&o, "\"}");
        return (int)o.len;
    }
    put(&o, "gpu plan: %s (%s)\n", p->gpu_ok ? mode : "refused", plan_gpu_reason_name(p->gpu_reason));
    put(&o, "  %-16s %12s  (%s)\n", "gpu budget", sz(p->gpu_budget, b1),
        p->gpu_budget_source ? p->gpu_budget_source : "?");
    put(&o, "  %-16s %12s\n", "gpu reserve", sz(p->gpu_reserve, b1));
    const bool emb_host = p->gpu_mode == SLUICE_MODE_STREAM && m->gpu_host_dense_bytes;
    put(&o, "  %-16s %12s  (%s%s)\n", "vram weights", sz(p->vram_weights, b1),
        p->gpu_mode != SLUICE_MODE_STREAM ? "whole file"
        : m->gpu_look_bytes > 0            ? "dense tensors + lookahead routers"
                                           : "dense tensors",
        emb_host ? "; token embeddings in pinned host memory" : "");
    if (p->gpu_mode == SLUICE_MODE_STREAM) {
        put(&o, "  %-16s %12s  (%d slots of %.2f MiB; floor %d)\n", "vram expert cache",
            sz(p->vram_cache, b1), p->gpu_slots, (double)m->gpu_slot_bytes / (1024.0 * 1024.0),
            p->gpu_floor_slots);
        put(&o, "  %-16s %12s  (routed experts%s, page-locked: misses read over the bus)\n", "pinned host",
            sz(p->pinned, b1), m->gpu_host_dense_bytes ? " + token embeddings" : "");
    }
    put(&o, "  %-16s %12s\n", "vram kv+state", sz(p->vram_kv, b1));
    put(&o, "  %-16s %12s\n", "vram scratch", sz(p->vram_scratch, b1));
    put(&o, "  %-16s %12s  (of %s)\n", "vram total", sz(p->vram_total, b1), sz(p->gpu_budget, b2));
    put(&o, "  gpu why: %s\n", p->gpu_message);
    return (int)o.len;
}
