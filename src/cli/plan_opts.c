/* Memory-plan flags (see plan_opts.h). */
#include "cli/plan_opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common.h"

int cli_add_plan_opts(cli_opt *opts, int n, int cap, cli_plan_opts *po) {
    const cli_opt group[] = {
        {"--plan", NULL, OPT_FLAG, &po->plan, NULL, "print the memory plan and exit without running"},
        {"--json", NULL, OPT_FLAG, &po->json, NULL, "with --plan: print the plan as JSON"},
        {"--resident", NULL, OPT_FLAG, &po->resident, NULL, "keep every expert in memory (refused if it does not fit)"},
        {"--stream", NULL, OPT_FLAG, &po->stream, NULL, "stream routed experts from storage through the expert cache"},
        {"--mlock", NULL, OPT_FLAG, &po->mlock, NULL, "lock a resident model's pages in RAM (mlock), so that the page cache never evicts them; the load fails if the memory-lock limit (ulimit -l) refuses"},
        {"--cache", NULL, OPT_STR, &po->cache, "SIZE|Nx", "expert cache size: bytes with a unit (6G) or N experts (500x); implies --stream"},
        {"--mem-budget", NULL, OPT_SIZE, &po->mem_budget, "SIZE", "memory the process may use (default: measured from the cgroup and MemAvailable)"},
        {"--io", NULL, OPT_STR, &po->io, "direct|page", "expert reads with direct I/O (default) or through the page cache"},
        {"--io-depth", NULL, OPT_INT, &po->io_depth, "N", "expert reads in flight (default: two layers' reads of every expert, 64 to 1024)"},
        {"--no-prefetch", NULL, OPT_FLAG, &po->no_prefetch, NULL, "no router-lookahead prefetch of the next layer's experts"},
        {"--verify-reads", NULL, OPT_FLAG, &po->verify_reads, NULL, "check each expert record's CRC-32 as it is read (stores only)"},
        {"--gpu", NULL, OPT_FLAG, &po->gpu, NULL, "compute on the GPU (same as --backend cuda)"},
        {"--backend", NULL, OPT_STR, &po->backend, "cpu|cuda", "where sessions compute (default cpu)"},
        {"--gpu-budget", NULL, OPT_SIZE, &po->gpu_budget, "SIZE", "GPU memory the model may use (default: the free memory); smaller values emulate smaller GPUs"},
        {"--gpu-miss", NULL, OPT_STR, &po->gpu_miss, "copy|zerocopy|host", "GPU streaming: copy a missing expert into VRAM after routing (default), read it from pinned host memory, or (host) let the host's cores compute some of a decode layer's misses while the GPU computes the rest (same bits)"},
        {"--gpu-host-experts", NULL, OPT_INT, &po->gpu_host_experts, "N", "with --gpu-miss host: a decode layer's misses the host computes, the rest are copied (default 4)"},
        {"--no-graph", NULL, OPT_FLAG, &po->no_graph, NULL, "GPU: do not capture decode steps as CUDA graphs"},
        {"--gpu-profile", NULL, OPT_FLAG, &po->gpu_profile, NULL, "GPU: time every device operation and print the table at exit (slow)"},
        {"--gpus", NULL, OPT_INT, &po->gpus, "N", "GPU: expert parallelism over N GPUs through NCCL (this build: 1, the same path over one rank; bit-identical logits)"},
        {"--override-kv", NULL, OPT_LIST, &po->override_kv, "KEY=TYPE:VALUE", "override a metadata value (TYPE int, float, bool or str) as llama.cpp's --override-kv does; repeatable"},
        {"--ngram", NULL, OPT_STR, &po->ngram, "auto|resident|disk", "qwen4exp's n-gram table: mapped, or rows read on demand into a row cache (default auto: mapped when the whole model fits)"},
        {"--ngram-cache", NULL, OPT_INT, &po->ngram_cache, "ROWS", "rows of the on-demand n-gram row cache (default: the planner's)"},
    };
    const int k = (int)(sizeof group / sizeof group[0]);
    if (n < 0 || n + k > cap) return -1;
    for (int i = 0; i < k; i++) opts[n + i] = group[i];
    return n + k;
}

bool cli_plan_params(const char *cmd, const cli_plan_opts *po, sluice_model_params *mp) {
    if (po->resident && (po->stream || po->cache)) {
        fprintf(stderr, "sluice %s: --resident cannot go with --stream or --cache\n", cmd);
        return false;
    }
    if (po->json && !po->plan) {
        fprintf(stderr, "sluice %s: --json goes with --plan\n", cmd);
        return false;
    }
    mp->mode = po->resident ? SLUICE_MODE_RESIDENT
               : po->stream || po->cache ? SLUICE_MODE_STREAM
                                         : SLUICE_MODE_AUTO;
    if (po->cache) {
        size_t len = strlen(po->cache);
        if (len > 1 && (po->cache[len - 1] == 'x' || po->cache[len - 1] == 'X')) {
            char *end;
            long v = strtol(po->cache, &end, 10);
            if (end != po->cache + len - 1 || v <= 0 || v > (1L << 30)) {
                fprintf(stderr, "sluice %s: invalid --cache '%s' (e.g. 6G or 500x)\n", cmd, po->cache);
                return false;
            }
            mp->cache_experts = (int)v;
        } else if (!cli_parse_size(po->cache, &mp->cache_bytes) || mp->cache_bytes == 0) {
            fprintf(stderr, "sluice %s: invalid --cache '%s' (e.g. 6G or 500x)\n", cmd, po->cache);
            return false;
        }
    }
    mp->mem_budget = po->mem_budget;
    if (po->io && strcmp(po->io, "direct") != 0 && strcmp(po->io, "page") != 0) {
        fprintf(stderr, "sluice %s: --io must be direct or page\n", cmd);
        return false;
    }
    mp->io = po->io && strcmp(po->io, "page") == 0 ? SLUICE_IO_PAGE : SLUICE_IO_DIRECT;
    if (po->io_depth < 0 || po->io_depth > 1024) {
        fprintf(stderr, "sluice %s: --io-depth must be between 1 and 1024\n", cmd);
        return false;
    }
    mp->io_depth = po->io_depth;
    mp->no_prefetch = po->no_prefetch;
    mp->verify_reads = po->verify_reads;
    mp->mlock = po->mlock;
    if (po->backend && strcmp(po->backend, "cpu") != 0 && strcmp(po->backend, "cuda") != 0) {
        fprintf(stderr, "sluice %s: --backend must be cpu or cuda\n", cmd);
        return false;
    }
    if (po->gpu_miss && strcmp(po->gpu_miss, "copy") != 0 && strcmp(po->gpu_miss, "zerocopy") != 0 &&
        strcmp(po->gpu_miss, "host") != 0) {
        fprintf(stderr, "sluice %s: --gpu-miss must be copy, zerocopy or host\n", cmd);
        return false;
    }
    if (po->gpu_host_experts && (!po->gpu_miss || strcmp(po->gpu_miss, "host") != 0)) {
        fprintf(stderr, "sluice %s: --gpu-host-experts goes with --gpu-miss host\n", cmd);
        return false;
    }
    if (po->gpu_host_experts < 0 || po->gpu_host_experts > 1024) {
        fprintf(stderr, "sluice %s: --gpu-host-experts must be between 1 and 1024\n", cmd);
        return false;
    }
    const bool gpu = po->gpu || (po->backend && strcmp(po->backend, "cuda") == 0);
    if (!gpu && (po->gpu_budget || po->gpu_miss || po->no_graph || po->gpu_profile)) {
        fprintf(stderr, "sluice %s: --gpu-budget, --gpu-miss, --no-graph and --gpu-profile go with --gpu\n", cmd);
        return false;
    }
    if (!gpu && po->gpus) {
        fprintf(stderr, "sluice %s: --gpus goes with --gpu\n", cmd);
        return false;
    }
    if (po->gpus < 0 || po->gpus > 64) {
        fprintf(stderr, "sluice %s: --gpus must be between 1 and 64\n", cmd);
        return false;
    }
    mp->gpus = po->gpus;
    mp->backend = gpu ? SLUICE_BACKEND_CUDA : SLUICE_BACKEND_CPU;
    mp->gpu_budget = po->gpu_budget;
    mp->gpu_miss = !po->gpu_miss                           ? SLUICE_GPU_MISS_COPY
                   : strcmp(po->gpu_miss, "zerocopy") == 0 ? SLUICE_GPU_MISS_ZEROCOPY
                   : strcmp(po->gpu_miss, "host") == 0     ? SLUICE_GPU_MISS_HOST
                                                           : SLUICE_GPU_MISS_COPY;
    mp->gpu_host_experts = po->gpu_host_experts;
    mp->no_graph = po->no_graph;
    mp->gpu_profile = po->gpu_profile;
    mp->override_kv = po->override_kv.v;
    mp->n_override_kv = po->override_kv.n;
    if (po->ngram && strcmp(po->ngram, "auto") != 0 && strcmp(po->ngram, "resident") != 0 &&
        strcmp(po->ngram, "disk") != 0) {
        fprintf(stderr, "sluice %s: --ngram must be auto, resident or disk\n", cmd);
        return false;
    }
    mp->ngram_mode = !po->ngram || strcmp(po->ngram, "auto") == 0 ? SLUICE_MODE_AUTO
                     : strcmp(po->ngram, "resident") == 0        ? SLUICE_MODE_RESIDENT
                                                                 : SLUICE_MODE_STREAM;
    if (po->ngram_cache < 0 || po->ngram_cache > (1 << 28)) {
        fprintf(stderr, "sluice %s: --ngram-cache must be between 1 and %d rows\n", cmd, 1 << 28);
        return false;
    }
    mp->ngram_cache_rows = po->ngram_cache;
    return true;
}

int cli_print_plan(const char *cmd, const char *model_path, const sluice_model_params *mp,
                   bool json) {
    sluice_model_params p = *mp;
    p.plan_only = true;
    sluice_model *m = cli_load_model_params(cmd, model_path, &p);
    if (!m) return 1;
    int need = sluice_model_plan(m, json, NULL, 0);
    char *buf = malloc((size_t)need + 1);
    int rc = 1;
    if (buf) {
        sluice_model_plan(m, json, buf, (size_t)need + 1);
        fputs(buf, stdout);
        if (json) fputc('\n', stdout);
        rc = sluice_model_plan_ok(m) ? 0 : 1;
        free(buf);
    }
    sluice_model_free(m);
    return rc;
}
