/* sluice bench reports: a markdown table (llama-bench style, one row per test with mean and
 * standard deviation over repetitions), CSV (one row per run) and the JSON run record. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/bytes.h"
#include "tools/bench.h"
#include "tools/digest.h"
#include "tools/machine.h"


static double tps(int n, double s) { return s > 0 ? n / s : 0.0; }

static void mean_sd(const double *v, int n, double *mean, double *sd) {
    double m = 0, q = 0;
    for (int i = 0; i < n; i++) m += v[i];
    m = n ? m / n : 0;
    for (int i = 0; i < n; i++) q += (v[i] - m) * (v[i] - m);
    *mean = m;
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

void bench_print_markdown(FILE *out, const sluice_model *m, const bench_params *bp,
                          const bench_result *res) {
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    char size[32], rss[32];
    bytes_str(res->model_bytes, size, sizeof size);
    fprintf(out, "| model | size | threads | test | prefill t/s | TTFT ms | decode t/s | "
                 "TPOT p50/p95/p99 ms | peak RSS | expert hit/miss | logits sha256 |\n");
    fprintf(out, "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|\n");
    for (int i = 0; i < res->n_runs;) {
        int j = i;
        while (j < res->n_runs && res->runs[j].n_prompt == res->runs[i].n_prompt) j++;
        const int n = j - i;
        double pf[64], dc[64], tt[64], m1, s1, m2, s2, m3, s3;
        double p50 = 0, p95 = 0, p99 = 0;
        uint64_t peak = 0, hits = 0, misses = 0;
        bool same = true;
        for (int k = 0; k < n && k < 64; k++) {
            const bench_run *r = &res->runs[i + k];
            pf[k] = tps(r->n_prompt, r->prefill_s);
            dc[k] = tps(r->n_gen, r->decode_s);
            tt[k] = r->ttft_s * 1e3;
            p50 += r->tpot_p50 * 1e3 / n;
            p95 += r->tpot_p95 * 1e3 / n;
            p99 += r->tpot_p99 * 1e3 / n;
            peak = r->peak_rss > peak ? r->peak_rss : peak;
            hits += r->prefill.hits + r->decode.hits;
            misses += r->prefill.misses + r->decode.misses;
            same = same && strcmp(r->logits_sha, res->runs[i].logits_sha) == 0 &&
                   strcmp(r->tokens_sha, res->runs[i].tokens_sha) == 0;
        }
        const int nn = n < 64 ? n : 64;
        mean_sd(pf, nn, &m1, &s1);
        mean_sd(dc, nn, &m2, &s2);
        mean_sd(tt, nn, &m3, &s3);
        bytes_str(peak, rss, sizeof rss);
        fprintf(out, "| %s | %s | %d | p%d+n%d | %.2f ± %.2f | %.1f ± %.1f | %.2f ± %.2f | "
                     "%.2f/%.2f/%.2f | %s | %llu/%llu | %.12s%s |\n",
                info.name, size, bp->n_threads, res->runs[i].n_prompt, res->runs[i].n_gen, m1, s1,
                m3, s3, m2, s2, p50, p95, p99, rss, (unsigned long long)hits,
                (unsigned long long)misses, res->runs[i].logits_sha,
                n > 1 ? (same ? " (all reps equal)" : " (REPS DIFFER)") : "");
        i = j;
    }
    if (bp->mtp > 0) { /* speculative decoding: how many drafts the trunk accepted */
        uint64_t steps = 0, drafted = 0, accepted = 0, plain = 0, shadowed = 0, shadow_hits = 0;
        for (int i = 0; i < res->n_runs; i++) {
            steps += res->runs[i].spec_steps;
            drafted += res->runs[i].spec_drafted;
            accepted += res->runs[i].spec_accepted;
            plain += res->runs[i].spec_plain;
            shadowed += res->runs[i].spec_shadowed;
            shadow_hits += res->runs[i].spec_shadow_hits;
        }
        fprintf(out, "\nMTP %d drafts/step (%s): %llu steps (%llu plain, %llu of them shadow steps, %llu "
                     "hits), %llu drafted, %llu accepted (acceptance %.1f%%, %.2f tokens/step)\n",
                bp->mtp, bp->mtp_always ? "every step" : "adaptive", (unsigned long long)steps,
                (unsigned long long)plain, (unsigned long long)shadowed, (unsigned long long)shadow_hits,
                (unsigned long long)drafted, (unsigned long long)accepted,
                drafted ? 100.0 * (double)accepted / (double)drafted : 0.0,
                steps ? (double)(steps + accepted) / (double)steps : 0.0);
    }
}

void bench_print_csv(FILE *out, const sluice_model *m, const bench_params *bp,
                     const bench_result *res) {
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    fprintf(out, "model,model_bytes,threads,n_batch,n_prompt,n_gen,rep,prefill_tps,ttft_ms,"
                 "decode_tps,tpot_p50_ms,tpot_p95_ms,tpot_p99_ms,peak_rss_bytes,expert_hits,"
                 "expert_misses,expert_evictions,bytes_read,read_amplification,io_wait_s,"
                 "logits_sha256,tokens_sha256\n");
    for (int i = 0; i < res->n_runs; i++) {
        const bench_run *r = &res->runs[i];
        fprintf(out, "\"%s\",%llu,%d,%d,%d,%d,%d,%.4f,%.3f,%.4f,%.4f,%.4f,%.4f,%llu,%llu,%llu,%llu,"
                     "%llu,%.4f,%.6f,%s,%s\n",
                info.name, (unsigned long long)res->model_bytes, bp->n_threads, bp->n_batch,
                r->n_prompt, r->n_gen, r->rep, tps(r->n_prompt, r->prefill_s), r->ttft_s * 1e3,
                tps(r->n_gen, r->decode_s), r->tpot_p50 * 1e3, r->tpot_p95 * 1e3,
                r->tpot_p99 * 1e3, (unsigned long long)r->peak_rss,
                (unsigned long long)(r->prefill.hits + r->decode.hits),
                (unsigned long long)(r->prefill.misses + r->decode.misses),
                (unsigned long long)(r->prefill.evictions + r->decode.evictions),
                (unsigned long long)(r->prefill.bytes_read + r->decode.bytes_read),
                r->read_amplification, r->prefill.io_wait_s + r->decode.io_wait_s, r->logits_sha,
                r->tokens_sha);
    }
}

/* ---- JSON ---------------------------------------------------------------------------------- */

static json_t *stats_json(const bench_stats *s) {
    return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:I,s:I,s:I}", "acquires", (json_int_t)s->acquires,
                     "hits", (json_int_t)s->hits, "misses", (json_int_t)s->misses, "evictions",
                     (json_int_t)s->evictions, "bytes_read", (json_int_t)s->bytes_read, "reads",
                     (json_int_t)s->reads, "io_wait_s", s->io_wait_s, "prefetch_issued",
                     (json_int_t)s->prefetch_issued, "prefetch_used", (json_int_t)s->prefetch_used,
                     "host_computed", (json_int_t)s->host_computed);
}

static json_t *build_json(void) {
    char exe_sha[65] = "";
    uint64_t exe_size = 0;
    char e[128];
    if (!digest_file("/proc/self/exe", true, exe_sha, &exe_size, e, sizeof e)) exe_sha[0] = 0;
    bool sanitized = false;
#if defined(__SANITIZE_ADDRESS__)
    sanitized = true;
#endif
    return json_pack("{s:s,s:s,s:s,s:b,s:s}", "version", SLUICE_VERSION, "git_rev", sluice_git_rev,
                     "compiler", __VERSION__, "sanitizers", sanitized, "binary_sha256", exe_sha);
}

static json_t *machine_json(void) {
    machine_facts f;
    machine_facts_read(&f);
    return json_pack("{s:s,s:i,s:I,s:I,s:s,s:s}", "cpu", f.cpu, "cores", f.cores,
                     "mem_total_bytes", (json_int_t)f.mem_total, "cgroup_memory_max_bytes",
                     (json_int_t)f.cgroup_max, "kernel", f.kernel, "arch", f.host_arch);
}

static json_t *plan_json(const sluice_model *m) {
    /* the planner's own JSON (issue 5); the mode alone when it gives none */
    int need = sluice_model_plan(m, true, NULL, 0);
    json_t *j = NULL;
    if (need > 0) {
        char *buf = malloc((size_t)need + 1);
        if (buf) {
            sluice_model_plan(m, true, buf, (size_t)need + 1);
            j = json_loads(buf, 0, NULL);
            free(buf);
        }
    }
    if (!j) j = json_object();
    if (!json_object_get(j, "mode")) json_object_set_new(j, "mode", json_string(sluice_model_mode(m)));
    return j;
}

char *bench_json(const sluice_model *m, const bench_params *bp, const bench_result *res) {
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *prompts = json_array();
    for (int i = 0; i < bp->n_prompts; i++) json_array_append_new(prompts, json_integer(bp->n_prompt[i]));
    json_t *model = json_pack(
        "{s:s?,s:s,s:s,s:I,s:{s:s,s:s},s:I,s:i,s:i,s:i,s:i,s:i,s:i,s:I}", "path", bp->model_path,
        "name", info.name, "arch", info.arch, "size_bytes", (json_int_t)res->model_bytes, "hash",
        "method", bp->model_path ? (res->model_hash_full ? "sha256-full" : "sha256-size-first-last-mib") : "none",
        "sha256", res->model_sha, "n_params", (json_int_t)info.n_params, "n_layer", info.n_layer,
        "n_embd", info.n_embd, "n_expert", info.n_expert, "n_expert_used", info.n_expert_used,
        "n_vocab", info.n_vocab, "n_ctx_train", info.n_ctx_train, "expert_bytes",
        (json_int_t)res->expert_bytes);
    json_t *params = json_pack(
        "{s:o,s:i,s:i,s:i,s:i,s:i,s:I,s:s,s:s?,s:b,s:s?}", "n_prompt", prompts, "n_gen", bp->n_gen,
        "repetitions", bp->reps, "n_batch", bp->n_batch, "n_threads", bp->n_threads, "n_ctx",
        bp->n_ctx, "seed", (json_int_t)bp->seed, "prompt", bp->prompt_file ? "file" : "synthetic",
        "prompt_file", bp->prompt_file, "warmup", bp->warmup, "evidence_dir", bp->evidence_dir);
    json_t *runs = json_array();
    for (int i = 0; i < res->n_runs; i++) {
        const bench_run *r = &res->runs[i];
        json_t *ev = json_pack("{s:s,s:s,s:i,s:s,s:s}", "logits_sha256", r->logits_sha,
                               "tokens_sha256", r->tokens_sha, "logit_rows", r->n_gen + 1,
                               "logits_layout", "f32le [logit_rows][n_vocab]: last prompt position, then each decode step",
                               "tokens_layout", "i32le: prompt ids, then the n_gen+1 greedy tokens");
        if (r->logits_file[0]) {
            json_object_set_new(ev, "logits_file", json_string(r->logits_file));
            json_object_set_new(ev, "tokens_file", json_string(r->tokens_file));
        }
        json_t *run = json_pack(
            "{s:i,s:i,s:i,s:f,s:f,s:f,s:f,s:f,s:{s:f,s:f,s:f,s:f},s:I,s:s,s:{s:o,s:o,s:f,s:I},s:o}",
            "n_prompt", r->n_prompt, "n_gen", r->n_gen, "rep", r->rep, "prefill_s", r->prefill_s,
            "prefill_tps", tps(r->n_prompt, r->prefill_s), "ttft_ms", r->ttft_s * 1e3, "decode_s",
            r->decode_s, "decode_tps", tps(r->n_gen, r->decode_s), "tpot_ms", "p50",
            r->tpot_p50 * 1e3, "p95", r->tpot_p95 * 1e3, "p99", r->tpot_p99 * 1e3, "mean",
            r->tpot_mean * 1e3, "peak_rss_bytes", (json_int_t)r->peak_rss, "peak_rss_scope",
            r->peak_rss_per_run ? "run" : "process", "experts", "prefill", stats_json(&r->prefill),
            "decode", stats_json(&r->decode), "read_amplification", r->read_amplification,
            "unique_expert_bytes", (json_int_t)r->unique_expert_bytes,
            "evidence", ev);
        if (bp->mtp > 0)
            json_object_set_new(run, "mtp", json_pack("{s:i,s:s,s:I,s:I,s:I,s:I,s:I,s:I}", "drafts", bp->mtp,
                                                      "policy", bp->mtp_always ? "always" : "adaptive",
                                                      "steps", (json_int_t)r->spec_steps,
                                                      "plain_steps", (json_int_t)r->spec_plain,
                                                      "shadow_steps", (json_int_t)r->spec_shadowed,
                                                      "shadow_hits", (json_int_t)r->spec_shadow_hits,
                                                      "drafted", (json_int_t)r->spec_drafted,
                                                      "accepted", (json_int_t)r->spec_accepted));
        json_array_append_new(runs, run);
    }
    json_t *root = json_pack("{s:s,s:s,s:o,s:o,s:o,s:o,s:o,s:o}", "schema", "sluice-bench/1",
                             "timestamp", ts, "build", build_json(), "machine", machine_json(),
                             "model", model, "plan", plan_json(m), "params", params, "runs", runs);
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    return text;
}
