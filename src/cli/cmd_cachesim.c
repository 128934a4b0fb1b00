/* sluice cachesim: hit rate of expert-cache policies on a routing trace, per cache size. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "runtime/ep_placement.h"
#include "tools/cachesim.h"

#define MAX_SIZES 64

/* "64", "10%", "2G" (needs the trace's expert size) -> slots */
static int parse_sizes(const char *s, const trace *t, int *caps, char *err, size_t n) {
    const double all = (double)t->n_layer * t->n_expert;
    int k = 0;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ", "); tok; tok = strtok(NULL, ", ")) {
        if (k == MAX_SIZES) {
            snprintf(err, n, "at most %d sizes", MAX_SIZES);
            return -1;
        }
        size_t len = strlen(tok);
        double v = 0;
        char *end = NULL;
        errno = 0;
        if (len > 1 && tok[len - 1] == '%') {
            tok[len - 1] = 0;
            v = strtod(tok, &end);
            if (*end || errno || !(v > 0) || v > 100) goto bad;
            v = ceil(all * v / 100.0);
        } else {
            long long x = strtoll(tok, &end, 10);
            if (*end == 0 && !errno && x > 0) {
                v = (double)x;
            } else {
                uint64_t bytes;
                if (!cli_parse_size(tok, &bytes) || bytes == 0) goto bad;
                if (!t->expert_bytes) {
                    snprintf(err, n, "size '%s' in bytes needs the expert size, which this trace "
                                     "does not record; give slots or percentages", tok);
                    return -1;
                }
                v = floor((double)bytes / (double)t->expert_bytes);
                if (v < 1) v = 1;
            }
        }
        if (v > all) v = all;
        caps[k++] = (int)v;
        continue;
    bad:
        snprintf(err, n, "invalid size '%s' (slots, N%%, or bytes like 4G)", tok);
        return -1;
    }
    if (k == 0) {
        snprintf(err, n, "no sizes given");
        return -1;
    }
    return k;
}

/* --ep-ranks: slot counts per (layer, expert) from the records (every slot is one row sent to
 * the expert's rank), the first half placing the experts (ep_place), the second half measuring
 * the balance, against contiguous blocks of experts and against the popularity-blind placement
 * (ep_place without counts). */
static int ep_report(const trace *t, const char *list) {
    const size_t cells = (size_t)t->n_layer * t->n_expert;
    uint64_t *fit = calloc(cells, sizeof *fit), *held = calloc(cells, sizeof *held);
    uint64_t *eb = calloc(t->n_layer, sizeof *eb);
    int rc = 1;
    if (!fit || !held || !eb) {
        fprintf(stderr, "sluice cachesim: out of memory\n");
        goto out;
    }
    for (size_t r = 0; r < t->n_records; r++)
        for (uint32_t s = 0; s < t->k; s++) {
            const size_t key = (size_t)t->layer[r] * t->n_expert + t->experts[r * t->k + s];
            (r < t->n_records / 2 ? fit : held)[key]++;
        }
    for (uint32_t il = 0; il < t->n_layer; il++) eb[il] = t->expert_bytes ? t->expert_bytes : 1;
    printf("expert-parallel balance, %zu records (placed from the first half, measured on the second):\n"
           "largest rank's slots / mean rank's slots, mean over %u layers\n\n"
           "| ranks | popularity (ep_place) | popularity-blind | contiguous blocks | same half (fit) |\n"
           "|---:|---:|---:|---:|---:|\n", t->n_records, t->n_layer);
    for (const char *p = list; *p;) {
        char *end;
        const long R = strtol(p, &end, 10);
        if (end == p || R < 1 || R > EP_MAX_RANKS || R > (long)t->n_expert) {
            fprintf(stderr, "sluice cachesim: --ep-ranks wants rank counts between 1 and %d\n", EP_MAX_RANKS);
            rc = 2;
            goto out;
        }
        char err[256];
        ep_place_params pp = {.n_rank = (int)R, .n_layer = (int)t->n_layer, .n_expert = (int)t->n_expert,
                              .counts = fit, .expert_bytes = eb};
        ep_placement pop, blind, block;
        if (ep_place(&pp, &pop, err, sizeof err) != 0) {
            fprintf(stderr, "sluice cachesim: %s\n", err);
            goto out;
        }
        pp.counts = NULL;
        if (ep_place(&pp, &blind, err, sizeof err) != 0 || ep_place(&pp, &block, err, sizeof err) != 0) {
            fprintf(stderr, "sluice cachesim: %s\n", err);
            ep_placement_free(&pop);
            goto out;
        }
        for (size_t i = 0; i < cells; i++) /* expert e on rank e / ceil(X / R) */
            block.owner[i] = (int32_t)((i % t->n_expert) / ((t->n_expert + R - 1) / R));
        printf("| %ld | %.3f | %.3f | %.3f | %.3f |\n", R, ep_imbalance(&pop, held), ep_imbalance(&blind, held),
               ep_imbalance(&block, held), ep_imbalance(&pop, fit));
        ep_placement_free(&pop);
        ep_placement_free(&blind);
        ep_placement_free(&block);
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            fprintf(stderr, "sluice cachesim: --ep-ranks: a comma-separated list (2,4,8)\n");
            rc = 2;
            goto out;
        }
    }
    rc = 0;
out:
    free(fit);
    free(held);
    free(eb);
    return rc;
}

int cmd_cachesim(int argc, char **argv) {
    const char *sizes = "2%,5%,10%,15%,20%,30%,40%,50%,60%,75%,90%", *svg = NULL;
    int seq = -1, n_threads = 2;
    const char *phase_s = "all";
    float pin_frac = 0.5f;
    bool csv = false, no_svg = false;
    const char *ep_ranks = NULL;
    const cli_opt opts[] = {
        {"--sizes", NULL, OPT_STR, &sizes, "LIST", "cache sizes: slots (256), % of all experts (10%) or bytes (4G); default 2%..90%"},
        {"--svg", NULL, OPT_STR, &svg, "FILE", "plot of the curves (default TRACE.svg)"},
        {"--no-svg", NULL, OPT_FLAG, &no_svg, NULL, "do not write the plot"},
        {"--seq", NULL, OPT_INT, &seq, "N", "replay only sequence N of the trace (default: all, in order)"},
        {"--phase", NULL, OPT_STR, &phase_s, "all|decode|prefill", "replay only decode steps or only prompt chunks (default all)"},
        {"--pin-frac", NULL, OPT_FLOAT, &pin_frac, "F", "share of the slots pinned-hot pins (default 0.5)"},
        {"--threads", "-t", OPT_INT, &n_threads, "N", "simulation threads (default 2)"},
        {"--csv", NULL, OPT_FLAG, &csv, NULL, "print CSV instead of a table"},
        {"--ep-ranks", NULL, OPT_STR, &ep_ranks, "LIST", "instead: expert-parallel load balance for these rank counts (e.g. 2,4,8), placed from the first half of the trace, measured on the second (docs/multi-gpu.md)"},
    };
    const cli_cmd cmd = {
        "cachesim", "TRACE [--sizes LIST] [--svg FILE]",
        "Replay a routing trace (from --trace-routing) through expert-cache policies and print the "
        "hit rate per cache size.",
        "Policies: lru, lfu and engine (the engine's decayed hotness, then recency) over one pool "
        "for all layers;\nlru-layer and engine-layer with one pool per layer; pinned-hot (the "
        "trace's hottest experts never evicted);\nlru-warm and engine-warm (cache prefilled with "
        "the hottest experts); belady (the offline optimum,\nan upper bound for every cold policy) "
        "and belady-warm (the bound for the warm ones).\ndocs/cachesim.md defines each one.",
        opts, (int)(sizeof opts / sizeof opts[0]), 1};
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (n_pos != 1) {
        fprintf(stderr, "sluice cachesim: give one trace file (see sluice cachesim --help)\n");
        return 2;
    }
    if (!(pin_frac >= 0 && pin_frac <= 1) || n_threads < 1) {
        fprintf(stderr, "sluice cachesim: --pin-frac must be in [0, 1] and -t at least 1\n");
        return 2;
    }
    sim_phase phase = strcmp(phase_s, "decode") == 0    ? SIM_PHASE_DECODE
                      : strcmp(phase_s, "prefill") == 0 ? SIM_PHASE_PREFILL
                                                        : SIM_PHASE_ALL;
    if (phase == SIM_PHASE_ALL && strcmp(phase_s, "all") != 0) {
        fprintf(stderr, "sluice cachesim: --phase must be all, decode or prefill\n");
        return 2;
    }
    char err[512];
    trace t;
    if (trace_load(pos[0], &t, err, sizeof err) != 0) {
        fprintf(stderr, "sluice cachesim: %s\n", err);
        return 1;
    }
    if (ep_ranks) {
        rc = ep_report(&t, ep_ranks);
        trace_free(&t);
        return rc;
    }
    int caps[MAX_SIZES];
    int n_cap = parse_sizes(sizes, &t, caps, err, sizeof err);
    sim_keys k = {0};
    uint64_t *hits = NULL;
    rc = 1;
    if (n_cap < 0) {
        fprintf(stderr, "sluice cachesim: %s\n", err);
        rc = 2;
        goto done;
    }
    if (sim_keys_from_trace(&t, seq, phase, &k) != 0 || !(hits = calloc((size_t)SIM_COUNT * n_cap, sizeof *hits))) {
        fprintf(stderr, "sluice cachesim: out of memory\n");
        goto done;
    }
    if (k.n == 0) {
        fprintf(stderr, "sluice cachesim: the trace has no expert uses%s\n", seq >= 0 ? " in that sequence" : "");
        goto done;
    }
    sim_run_all(&k, caps, n_cap, pin_frac, n_threads, hits);
    const size_t distinct = sim_distinct(&k);
    const double all = (double)t.n_layer * t.n_expert;
    if (!csv) {
        printf("trace %s: %zu records, %u layers x %u experts, top-%u; phase %s: %zu expert "
               "acquires, %zu distinct (cold hit-rate ceiling %.2f%%)\n", pos[0], t.n_records,
               t.n_layer, t.n_expert, t.k, phase_s, k.n, distinct,
               100.0 * (1.0 - (double)distinct / (double)k.n));
        if (t.expert_bytes) printf("expert size %.3f MiB\n", (double)t.expert_bytes / 1048576.0);
        printf("\n| slots | %% experts |");
        if (t.expert_bytes) printf(" GiB |");
        for (int p = 0; p < SIM_COUNT; p++) printf(" %s |", sim_policy_name((sim_policy)p));
        printf("\n|---:|---:|");
        if (t.expert_bytes) printf("---:|");
        for (int p = 0; p < SIM_COUNT; p++) printf("---:|");
        printf("\n");
    } else {
        printf("slots,percent_experts,bytes");
        for (int p = 0; p < SIM_COUNT; p++) printf(",%s", sim_policy_name((sim_policy)p));
        printf("\n");
    }
    for (int c = 0; c < n_cap; c++) {
        if (csv) {
            printf("%d,%.3f,%llu", caps[c], 100.0 * caps[c] / all,
                   (unsigned long long)((uint64_t)caps[c] * t.expert_bytes));
            for (int p = 0; p < SIM_COUNT; p++) printf(",%.6f", (double)hits[p * n_cap + c] / (double)k.n);
            printf("\n");
            continue;
        }
        printf("| %d | %.1f |", caps[c], 100.0 * caps[c] / all);
        if (t.expert_bytes) printf(" %.2f |", (double)caps[c] * (double)t.expert_bytes / 1073741824.0);
        for (int p = 0; p < SIM_COUNT; p++) printf(" %.2f%% |", 100.0 * (double)hits[p * n_cap + c] / (double)k.n);
        printf("\n");
    }
    if (!no_svg) {
        char path[4096];
        snprintf(path, sizeof path, "%s%s", svg ? svg : pos[0], svg ? "" : ".svg");
        char title[512];
        snprintf(title, sizeof title, "expert-cache hit rate: %s", pos[0]);
        if (sim_write_svg(path, &k, caps, n_cap, hits, title) != 0) {
            fprintf(stderr, "sluice cachesim: %s: %s\n", path, strerror(errno));
            goto done;
        }
        if (!csv) printf("\nplot: %s\n", path);
    }
    rc = 0;
done:
    free(hits);
    sim_keys_free(&k);
    trace_free(&t);
    return rc;
}
