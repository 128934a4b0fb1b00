/* The planner with synthetic machines and models: mode choice, component sums, the floor,
 * forced modes, explicit caches and budgets, cgroup accounting, monotonicity; the probe on this
 * machine; the watchdog stopping evaluation with its cause. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "fixtures.h"
#include "runtime/plan.h"
#include "runtime/watchdog.h"
#include "sluice.h"

#define GiB (1024ull * 1024 * 1024)
#define MiB (1024ull * 1024)

/* Qwen3.6-35B-A3B Q4_K_M-like: 40 MoE layers, 256 experts, top-8 */
static plan_model_facts big_moe(void) {
    return (plan_model_facts){.file_bytes = 21 * GiB, .dense_bytes = 1536 * MiB,
                              .expert_bytes = 21 * GiB - 1536 * MiB, .slot_bytes = 2 * MiB,
                              .n_moe_layers = 40, .n_expert = 256, .n_expert_used = 8,
                              .kv_bytes_per_pos = 80 * 1024, .state_bytes = 63 * MiB,
                              .scratch_per_token = 200 * 1024, .scratch_fixed = 8 * MiB};
}

static plan_machine_facts machine(uint64_t avail, uint64_t cg_limit, uint64_t cg_usage,
                                  uint64_t cg_inactive) {
    return (plan_machine_facts){.has_cgroup_limit = cg_limit != 0, .cgroup_version = 1,
                                .cgroup_limit = cg_limit, .cgroup_usage = cg_usage,
                                .cgroup_reclaimable = cg_inactive, .mem_total = 24 * GiB,
                                .mem_available = avail};
}

static plan_request req(sluice_mode mode) {
    return (plan_request){.mode = mode, .n_ctx = 4096, .n_batch = 512};
}

static void check_sums(const plan *p) {
    CHECK(p->total == p->weights + p->cache + p->kv + p->state + p->scratch + p->overhead);
    if (p->ok) CHECKF(p->total + p->reserve <= p->budget, "total %llu + reserve > budget %llu",
                      (unsigned long long)p->total, (unsigned long long)p->budget);
}

static void test_modes(void) {
    plan_model_facts m = big_moe();
    plan p;
    plan_machine_facts roomy = machine(60 * GiB, 0, 0, 0);
    plan_request r = req(SLUICE_MODE_AUTO);
    plan_compute(&m, &roomy, &r, &p);
    CHECK(p.ok && p.mode == SLUICE_MODE_RESIDENT && p.reason == PLAN_RESIDENT_FITS);
    CHECK(p.weights == m.file_bytes && p.kv == 4096 * m.kv_bytes_per_pos);
    check_sums(&p);

    /* the target: 8 GiB cgroup (v1, counts page cache) -> stream */
    plan_machine_facts cg8 = machine(23 * GiB, 8 * GiB, 300 * MiB, 200 * MiB);
    plan_compute(&m, &cg8, &r, &p);
    CHECK(p.ok && p.mode == SLUICE_MODE_STREAM && p.reason == PLAN_STREAM_OVER_BUDGET);
    CHECK(strcmp(p.budget_source, "cgroup v1") == 0);
    CHECK(p.budget == 8 * GiB - 100 * MiB); /* limit minus unreclaimable usage */
    CHECK(p.floor_slots == 40 * 8 + 1 && p.target_slots == 40 * 256);
    CHECK(p.cache_slots >= p.floor_slots && p.cache_slots <= p.target_slots);
    CHECK(p.weights == m.dense_bytes && p.cache == (uint64_t)p.cache_slots * m.slot_bytes);
    /* the cache takes what is left: one more slot would break the budget */
    CHECK(p.total + p.reserve + m.slot_bytes > p.budget);
    check_sums(&p);

    /* below the floor: refused, with the numbers */
    plan_machine_facts tiny = machine(23 * GiB, 2 * GiB, 0, 0);
    plan_compute(&m, &tiny, &r, &p);
    CHECK(!p.ok && p.reason == PLAN_REFUSED_BELOW_FLOOR);
    CHECKF(strstr(p.message, "floor is 321 experts") != NULL, "%s", p.message);

    /* --resident that does not fit */
    r = req(SLUICE_MODE_RESIDENT);
    plan_compute(&m, &cg8, &r, &p);
    CHECK(!p.ok && p.reason == PLAN_REFUSED_RESIDENT);
    /* --resident that fits */
    plan_compute(&m, &roomy, &r, &p);
    CHECK(p.ok && p.reason == PLAN_RESIDENT_FORCED);

    /* --stream with room: the cache holds every expert, not more */
    r = req(SLUICE_MODE_STREAM);
    plan_compute(&m, &roomy, &r, &p);
    CHECK(p.ok && p.mode == SLUICE_MODE_STREAM && p.cache_slots == p.target_slots);
    check_sums(&p);

    /* --cache: given sizes, too big, below the floor */
    r = req(SLUICE_MODE_AUTO);
    r.cache_bytes = 3 * GiB;
    plan_compute(&m, &cg8, &r, &p);
    CHECK(p.ok && p.reason == PLAN_STREAM_CACHE_GIVEN && p.cache_slots == 1536);
    r.cache_bytes = 7 * GiB;
    plan_compute(&m, &cg8, &r, &p);
    CHECK(!p.ok && p.reason == PLAN_REFUSED_CACHE && strstr(p.message, "exceeds"));
    r.cache_bytes = 0;
    r.cache_slots = 100;
    plan_compute(&m, &cg8, &r, &p);
    CHECK(!p.ok && p.reason == PLAN_REFUSED_CACHE);

    /* --mem-budget overrides the machine */
    r = req(SLUICE_MODE_AUTO);
    r.mem_budget = 4 * GiB;
    plan_compute(&m, &roomy, &r, &p);
    CHECK(p.ok && p.mode == SLUICE_MODE_STREAM && p.budget == 4 * GiB &&
          strcmp(p.budget_source, "--mem-budget") == 0);
    check_sums(&p);

    /* MemAvailable below the cgroup's room wins */
    plan_machine_facts low = machine(5 * GiB, 8 * GiB, 0, 0);
    r = req(SLUICE_MODE_AUTO);
    plan_compute(&m, &low, &r, &p);
    CHECK(p.budget == 5 * GiB && strcmp(p.budget_source, "MemAvailable") == 0);

    /* reclaimable page cache counts as free under a v1 limit */
    plan_machine_facts full_cache = machine(23 * GiB, 8 * GiB, 8 * GiB, 7 * GiB);
    plan_compute(&m, &full_cache, &r, &p);
    CHECK(p.budget == 7 * GiB && p.ok);

    /* a dense model is resident whatever the budget allows */
    plan_model_facts dense = {.file_bytes = 100 * MiB, .dense_bytes = 100 * MiB,
                              .kv_bytes_per_pos = 1024};
    plan_compute(&dense, &roomy, &r, &p);
    CHECK(p.ok && p.reason == PLAN_DENSE_MODEL);

    /* a larger context takes from the cache */
    plan q;
    r = req(SLUICE_MODE_STREAM);
    plan_compute(&m, &cg8, &r, &p);
    r.n_ctx = 32768;
    plan_compute(&m, &cg8, &r, &q);
    CHECK(q.ok && q.kv > p.kv && q.cache_slots < p.cache_slots);
}

static void test_monotonic(void) {
    plan_model_facts m = big_moe();
    plan_request r = req(SLUICE_MODE_AUTO);
    int prev = 0;
    for (uint64_t b = 2 * GiB; b <= 40 * GiB; b += GiB / 4) {
        plan_machine_facts mc = machine(b, 0, 0, 0);
        plan p;
        plan_compute(&m, &mc, &r, &p);
        check_sums(&p);
        int slots = p.mode == SLUICE_MODE_RESIDENT ? 1 << 30 : p.ok ? p.cache_slots : 0;
        CHECKF(slots >= prev, "cache shrank at budget %.2f GiB", (double)b / GiB);
        prev = slots;
    }
}

static void test_format(void) {
    plan_model_facts m = big_moe();
    plan_machine_facts mc = machine(23 * GiB, 8 * GiB, 0, 0);
    plan_request r = req(SLUICE_MODE_AUTO);
    plan p;
    plan_compute(&m, &mc, &r, &p);
    char buf[4096];
    int n = plan_format(&p, &m, true, buf, sizeof buf);
    CHECK(n > 0 && (size_t)n < sizeof buf && buf[0] == '{' && buf[n - 1] == '}');
    CHECK(strstr(buf, "\"mode\":\"stream\"") && strstr(buf, "\"floor_slots\":321"));
    n = plan_format(&p, &m, false, buf, sizeof buf);
    CHECK(strstr(buf, "plan: stream") && strstr(buf, "expert cache") && strstr(buf, "why: "));
    char small[16];
    int need = plan_format(&p, &m, false, small, sizeof small);
    CHECK(need == n && strlen(small) == sizeof small - 1);
}

static void test_probe(void) {
    plan_machine_facts mc;
    plan_probe(&mc);
    CHECK(mc.mem_total > 0 && mc.mem_available > 0 && mc.mem_available <= mc.mem_total);
    if (mc.has_cgroup_limit) CHECK(mc.cgroup_limit > 0 && mc.cgroup_version >= 1);
}

static void test_watchdog(void) {
    char path[1024];
    if (!fixture_path("models", "qwen3moe-tiny-Q4_K_M.gguf", path, sizeof path)) return;
    sluice_model *m = sluice_model_load(path, NULL);
    CHECK(m != NULL);
    if (!m) return;
    sluice_session_params sp = {.n_ctx = 16};
    sluice_session *s = sluice_session_new(m, &sp);
    int32_t ids[2] = {1, 2};
    CHECK(sluice_session_eval(s, ids, 2, NULL) == 0);
    watchdog_trip_for_test("swap-out detected (test)");
    CHECK(sluice_session_eval(s, ids, 1, NULL) != 0);
    CHECKF(strstr(sluice_last_error(), "watchdog: swap-out detected (test)") != NULL, "%s",
           sluice_last_error());
    char why[256];
    CHECK(sluice_watchdog_tripped(why, sizeof why) && strstr(why, "swap-out"));
    watchdog_reset_for_test();
    CHECK(sluice_session_eval(s, ids, 1, NULL) == 0);
    sluice_session_free(s);
    sluice_model_free(m);
}

/* --mlock: a resident model's pages locked (or, where the memory-lock limit refuses, a clean
 * error naming it); refused for a streamed model. */
static void test_mlock(void) {
    char path[1024];
    if (!fixture_path("models", "qwen3moe-tiny-Q4_K_M.gguf", path, sizeof path)) return;
    sluice_model_params mp = {.mlock = true, .mode = SLUICE_MODE_RESIDENT};
    sluice_model *m = sluice_model_load(path, &mp);
    if (m) {
        sluice_session_params sp = {.n_ctx = 16};
        sluice_session *s = sluice_session_new(m, &sp);
        int32_t ids[2] = {1, 2};
        CHECK(s && sluice_session_eval(s, ids, 2, NULL) == 0);
        sluice_session_free(s);
        sluice_model_free(m);
    } else {
        CHECKF(strstr(sluice_last_error(), "--mlock: locking") && strstr(sluice_last_error(), "ulimit -l"), "%s",
               sluice_last_error());
    }
    mp.mode = SLUICE_MODE_STREAM;
    m = sluice_model_load(path, &mp);
    CHECK(m == NULL);
    if (m) sluice_model_free(m);
    CHECKF(strstr(sluice_last_error(), "--mlock needs a resident model") != NULL, "%s", sluice_last_error());
}

/* The watchdog's stall share: the PSI "full" counter's growth over the last 10 s of samples,
 * nothing before the first sample (a model's load) counted. */
static void test_psi_window(void) {
    static psi_window w;
    memset(&w, 0, sizeof w);
    uint64_t t = 987654321; /* stalls before the start: not counted */
    CHECK(psi_window_add(&w, t, 100) == 0.0);
    for (int i = 0; i < 10; i++) CHECK(psi_window_add(&w, t, 100) == 0.0);
    double pct = 0.0;
    for (int i = 0; i < 10; i++) pct = psi_window_add(&w, t += 100000, 100); /* 1 s fully stalled */
    CHECKF(pct > 9.99 && pct < 10.01, "1 s of stalls in 10 s: %.3f%%", pct);
    for (int i = 0; i < 20; i++) pct = psi_window_add(&w, t += 100000, 100);
    CHECKF(pct > 29.99 && pct < 30.01, "3 s of stalls in 10 s: %.3f%%", pct);
    for (int i = 0; i < 100; i++) pct = psi_window_add(&w, t, 100); /* 10 s without: they age out */
    CHECKF(pct == 0.0, "stalls older than 10 s: %.3f%%", pct);
    for (int i = 0; i < 200; i++) pct = psi_window_add(&w, t += 50000, 100); /* half stalled */
    CHECKF(pct > 49.99 && pct < 50.01, "half of every interval: %.3f%%", pct);
}

/* The device side (runtime/plan_gpu.c): resident when the file fits the GPU budget, else a
 * VRAM expert cache of at least one layer's experts over a page-locked host copy of the experts. */
static void test_gpu(void) {
    plan_model_facts m = big_moe();
    m.gpu_slot_bytes = 2 * MiB;
    m.gpu_scratch_per_token = 64 * 1024;
    m.gpu_scratch_fixed = 96 * MiB;
    plan_machine_facts mc = machine(120 * GiB, 0, 0, 0);
    mc.gpu = true;
    mc.vram_total = 140 * GiB;
    mc.vram_free = 139 * GiB;
    plan_request r = req(SLUICE_MODE_AUTO);
    r.gpu = true;
    plan p;
    plan_compute(&m, &mc, &r, &p);
    plan_compute_gpu(&m, &mc, &r, &p);
    CHECK(p.gpu && p.gpu_ok && p.gpu_mode == SLUICE_MODE_RESIDENT && p.gpu_reason == PLAN_GPU_RESIDENT_FITS);
    CHECK(p.vram_weights == m.file_bytes && strcmp(p.gpu_budget_source, "free VRAM") == 0);
    CHECK(p.vram_total == p.vram_weights + p.vram_kv + p.vram_scratch);
    CHECK(p.vram_total + p.gpu_reserve <= p.gpu_budget);

    /* --gpu-budget 8GiB emulates a smaller GPU: dense weights + a cache of >= one layer */
    r.gpu_budget = 8 * GiB;
    plan_compute(&m, &mc, &r, &p);
    plan_compute_gpu(&m, &mc, &r, &p);
    CHECK(p.gpu_ok && p.gpu_mode == SLUICE_MODE_STREAM && p.gpu_reason == PLAN_GPU_STREAM_OVER_BUDGET);
    CHECK(p.gpu_budget == 8 * GiB && strcmp(p.gpu_budget_source, "--gpu-budget") == 0);
    CHECK(p.gpu_floor_slots == 257 && p.gpu_slots >= p.gpu_floor_slots);
    CHECK(p.vram_cache == (uint64_t)p.gpu_slots * m.gpu_slot_bytes && p.vram_weights == m.dense_bytes);
    CHECKF(p.vram_total + p.gpu_reserve <= p.gpu_budget, "vram %llu", (unsigned long long)p.vram_total);
    CHECK(p.pinned == m.expert_bytes); /* the dense tensors are not kept page-locked */
    /* one slot more would not fit */
    CHECK(p.vram_total + m.gpu_slot_bytes + p.gpu_reserve > p.gpu_budget);

    /* the router lookahead's folded routers are planned with the dense tensors (stream only):
     * the cache gives up the slots they take */
    {
        plan q = p; /* the host side as planned above */
        plan_model_facts ml = m;
        ml.gpu_look_bytes = 39ull * 256 * 2048 * 4; /* 39 folds of a 256 x 2048 F32 router */
        plan_compute_gpu(&ml, &mc, &r, &q);
        CHECK(q.gpu_ok && q.gpu_mode == SLUICE_MODE_STREAM && q.vram_weights == m.dense_bytes + ml.gpu_look_bytes);
        CHECK(q.vram_total + q.gpu_reserve <= q.gpu_budget && q.vram_total + ml.gpu_slot_bytes + q.gpu_reserve > q.gpu_budget);
        CHECK(q.gpu_slots < p.gpu_slots && q.gpu_slots >= p.gpu_slots - (int)(ml.gpu_look_bytes / ml.gpu_slot_bytes) - 1);
        char buf[4096];
        plan_format_gpu(&q, &ml, false, buf, sizeof buf);
        CHECK(strstr(buf, "dense tensors + lookahead routers") != NULL);
        r.gpu_budget = 500 * GiB; /* resident: the whole file, no lookahead */
        plan_compute_gpu(&ml, &mc, &r, &q);
        CHECK(q.gpu_mode == SLUICE_MODE_RESIDENT && q.vram_weights == ml.file_bytes);
        r.gpu_budget = 8 * GiB;
    }

    /* the token embeddings in page-locked host memory (stream only): out of the VRAM weights,
     * into the pinned host bytes, and their VRAM goes to the cache */
    {
        plan q = p;
        plan_model_facts me = m;
        me.gpu_host_dense_bytes = 248320ull * 2048 / 256 * 144; /* a Q4_K 248,320 x 2048 table */
        plan_compute_gpu(&me, &mc, &r, &q);
        CHECK(q.gpu_ok && q.gpu_mode == SLUICE_MODE_STREAM);
        CHECK(q.vram_weights == m.dense_bytes - me.gpu_host_dense_bytes);
        CHECK(q.pinned == m.expert_bytes + me.gpu_host_dense_bytes);
        CHECK(q.gpu_slots >= p.gpu_slots + (int)(me.gpu_host_dense_bytes / me.gpu_slot_bytes) &&
              q.gpu_slots <= p.gpu_slots + (int)(me.gpu_host_dense_bytes / me.gpu_slot_bytes) + 1);
        CHECK(q.vram_total + q.gpu_reserve <= q.gpu_budget && q.vram_total + me.gpu_slot_bytes + q.gpu_reserve > q.gpu_budget);
        char buf[4096];
        plan_format_gpu(&q, &me, false, buf, sizeof buf);
        CHECK(strstr(buf, "token embeddings in pinned host memory") && strstr(buf, "routed experts + token embeddings"));
        /* resident: the whole file stays in VRAM */
        r.gpu_budget = 500 * GiB;
        plan_compute_gpu(&me, &mc, &r, &q);
        CHECK(q.gpu_mode == SLUICE_MODE_RESIDENT && q.vram_weights == me.file_bytes && q.pinned == 0);
        plan_format_gpu(&q, &me, false, buf, sizeof buf);
        CHECK(!strstr(buf, "token embeddings"));
        r.gpu_budget = 8 * GiB;
    }

    /* a budget above the free memory is capped at it */
    r.gpu_budget = 500 * GiB;
    plan_compute_gpu(&m, &mc, &r, &p);
    CHECK(p.gpu_budget == mc.vram_free && p.gpu_mode == SLUICE_MODE_RESIDENT);

    /* too small for one layer's experts: refused with the floor in the message */
    r.gpu_budget = 2 * GiB;
    plan_compute_gpu(&m, &mc, &r, &p);
    CHECK(!p.gpu_ok && p.gpu_reason == PLAN_GPU_REFUSED_FLOOR && strstr(p.gpu_message, "257"));

    /* --resident that does not fit; --stream that fits; a host too small for the page-locked experts */
    r.gpu_budget = 8 * GiB;
    r.mode = SLUICE_MODE_RESIDENT;
    plan_compute_gpu(&m, &mc, &r, &p);
    CHECK(!p.gpu_ok && p.gpu_reason == PLAN_GPU_REFUSED_RESIDENT);
    r.mode = SLUICE_MODE_STREAM;
    r.gpu_budget = 0;
    plan_compute_gpu(&m, &mc, &r, &p);
    CHECK(p.gpu_ok && p.gpu_mode == SLUICE_MODE_STREAM && p.gpu_reason == PLAN_GPU_STREAM_FORCED);
    CHECK(p.gpu_slots == 40 * 256); /* capped at all experts */
    plan_machine_facts small = mc;
    small.mem_available = 16 * GiB;
    r.mode = SLUICE_MODE_AUTO;
    r.gpu_budget = 8 * GiB;
    plan_compute(&m, &small, &r, &p);
    plan_compute_gpu(&m, &small, &r, &p);
    CHECK(!p.gpu_ok && p.gpu_reason == PLAN_GPU_REFUSED_PINNED);

    /* no device */
    plan_machine_facts none = mc;
    none.gpu = false;
    plan_compute_gpu(&m, &none, &r, &p);
    CHECK(!p.gpu_ok && p.gpu_reason == PLAN_GPU_REFUSED_DEVICE);

    /* the format lists the device components; JSON parses as one object */
    r = req(SLUICE_MODE_AUTO);
    r.gpu = true;
    r.gpu_budget = 8 * GiB;
    plan_compute(&m, &mc, &r, &p);
    plan_compute_gpu(&m, &mc, &r, &p);
    char buf[4096];
    plan_format_gpu(&p, &m, false, buf, sizeof buf);
    CHECK(strstr(buf, "gpu plan: stream (gpu-stream-over-budget)") && strstr(buf, "vram expert cache") &&
          strstr(buf, "pinned host"));
    int n = plan_format_gpu(&p, &m, true, buf, sizeof buf);
    CHECK(n > 0 && buf[0] == '{' && buf[n - 1] == '}' && strstr(buf, "\"cache_slots\":"));
}

int main(void) {
    test_gpu();
    test_modes();
    test_monotonic();
    test_format();
    test_probe();
    test_watchdog();
    test_psi_window();
    test_mlock();
    CHECK_DONE();
}
