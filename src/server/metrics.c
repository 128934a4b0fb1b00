/* Counters the server keeps, rendered in the Prometheus text exposition format (version 0.0.4):
 * "# HELP" and "# TYPE" lines, then "name{labels} value" samples. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

static const char *const EP_NAMES[EP_COUNT] = {"chat", "completions", "models", "health",
                                                "metrics", "other"};
static const char *const CODE_NAMES[CODE_COUNT] = {"200", "400", "404", "405",
                                                    "413", "500", "503", "other"};
static const double TTFT_LE[TTFT_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                             1,     2.5,  5,     10,   30,  60,  120};

int metrics_endpoint(const char *url) {
    if (strcmp(url, "/v1/chat/completions") == 0) return EP_CHAT;
    if (strcmp(url, "/v1/completions") == 0) return EP_COMPLETIONS;
    if (strcmp(url, "/v1/models") == 0) return EP_MODELS;
    if (strcmp(url, "/health") == 0) return EP_HEALTH;
    if (strcmp(url, "/metrics") == 0) return EP_METRICS;
    return EP_OTHER;
}

void metrics_count_response(metrics *mt, int ep, unsigned status) {
    int c;
    switch (status) {
    case 200: c = CODE_200; break;
    case 400: c = CODE_400; break;
    case 404: c = CODE_404; break;
    case 405: c = CODE_405; break;
    case 413: c = CODE_413; break;
    case 500: c = CODE_500; break;
    case 503: c = CODE_503; break;
    default: c = CODE_OTHER; break;
    }
    if (ep < 0 || ep >= EP_COUNT) ep = EP_OTHER;
    mt->responses[ep][c]++;
}

void metrics_observe_ttft(metrics *mt, double s) {
    for (int i = 0; i < TTFT_BUCKETS; i++)
        if (s <= TTFT_LE[i]) {
            mt->ttft_bucket[i]++;
            break;
        }
    mt->ttft_count++;
    mt->ttft_sum += s;
}

static void head(strbuf *b, const char *name, const char *type, const char *help) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(strbuf *b, const char *name, const char *help, double v) {
    head(b, name, "counter", help);
    sb_printf(b, "%s %.17g\n", name, v);
}

static void gauge(strbuf *b, const char *name, const char *help, double v) {
    head(b, name, "gauge", help);
    sb_printf(b, "%s %.17g\n", name, v);
}

/* Label values escape backslash, quote and newline; the model name comes from the file. */
static void label_value(strbuf *b, const char *v) {
    for (const char *p = v; *p; p++) {
        if (*p == '\\' || *p == '"') sb_printf(b, "\\%c", *p);
        else if (*p == '\n') sb_puts(b, "\\n");
        else sb_append(b, p, 1);
    }
}

char *metrics_render(server *srv) {
    pthread_mutex_lock(&srv->lock);
    metrics mt = srv->met;
    int queued = srv->n_queued;
    bool busy = srv->busy;
    pthread_mutex_unlock(&srv->lock);

    strbuf b = {0};
    head(&b, "sluice_info", "gauge", "Build and model (value 1).");
    sb_printf(&b, "sluice_info{version=\"%s\",model=\"", SLUICE_VERSION);
    label_value(&b, srv->model_id);
    sb_puts(&b, "\",arch=\"");
    label_value(&b, srv->info.arch);
    sb_printf(&b, "\",chat_format=\"%s\"} 1\n", chat_format_name(srv->tmpl.format));

    head(&b, "sluice_requests_total", "counter", "HTTP responses by endpoint and status code.");
    for (int e = 0; e < EP_COUNT; e++)
        for (int c = 0; c < CODE_COUNT; c++)
            if (mt.responses[e][c])
                sb_printf(&b, "sluice_requests_total{endpoint=\"%s\",code=\"%s\"} %llu\n",
                          EP_NAMES[e], CODE_NAMES[c], (unsigned long long)mt.responses[e][c]);
    counter(&b, "sluice_requests_rejected_total",
            "Generation requests refused with 503 because the queue was full.", (double)mt.rejected);
    counter(&b, "sluice_requests_cancelled_total",
            "Generations stopped because the client disconnected or the server stopped.",
            (double)mt.cancelled);
    counter(&b, "sluice_requests_completed_total", "Generations that ran to their end.",
            (double)mt.completed);
    gauge(&b, "sluice_queue_depth", "Requests waiting for the engine.", queued);
    gauge(&b, "sluice_queue_capacity", "Requests that may wait (--queue).", srv->cfg->queue);
    gauge(&b, "sluice_requests_processing", "Requests the engine is working on (0 or 1).", busy);

    counter(&b, "sluice_prompt_tokens_total", "Prompt tokens of finished requests.",
            (double)mt.prompt_tokens);
    counter(&b, "sluice_prompt_tokens_evaluated_total", "Prompt tokens evaluated.",
            (double)mt.prompt_evaluated);
    counter(&b, "sluice_prompt_tokens_reused_total",
            "Prompt tokens served from the KV cache of the previous request.",
            (double)mt.prompt_reused);
    counter(&b, "sluice_completion_tokens_total", "Generated tokens.", (double)mt.completion_tokens);
    counter(&b, "sluice_prompt_seconds_total", "Time spent evaluating prompts.", mt.prompt_seconds);
    counter(&b, "sluice_generation_seconds_total", "Time spent generating tokens.",
            mt.generation_seconds);
    gauge(&b, "sluice_prompt_tokens_per_second", "Prompt evaluation speed of the last request.",
          mt.last_prompt_tps);
    gauge(&b, "sluice_generation_tokens_per_second", "Generation speed of the last request.",
          mt.last_generation_tps);

    head(&b, "sluice_time_to_first_token_seconds", "histogram",
         "From a request's arrival (body received) to its first generated token.");
    uint64_t cum = 0;
    for (int i = 0; i < TTFT_BUCKETS; i++) {
        cum += mt.ttft_bucket[i];
        sb_printf(&b, "sluice_time_to_first_token_seconds_bucket{le=\"%g\"} %llu\n", TTFT_LE[i],
                  (unsigned long long)cum);
    }
    sb_printf(&b, "sluice_time_to_first_token_seconds_bucket{le=\"+Inf\"} %llu\n",
              (unsigned long long)mt.ttft_count);
    sb_printf(&b, "sluice_time_to_first_token_seconds_sum %.17g\n", mt.ttft_sum);
    sb_printf(&b, "sluice_time_to_first_token_seconds_count %llu\n",
              (unsigned long long)mt.ttft_count);

    gauge(&b, "sluice_context_size", "Positions the session's KV cache holds.", srv->n_ctx);
    gauge(&b, "sluice_kv_cache_tokens", "Positions in use (kept for prefix reuse).", mt.kv_tokens);

    const sluice_expert_stats *x = &mt.experts;
    counter(&b, "sluice_expert_acquires_total", "Expert uses by the MoE layers.", (double)x->acquires);
    counter(&b, "sluice_expert_cache_hits_total", "Expert uses served from memory.", (double)x->hits);
    counter(&b, "sluice_expert_cache_misses_total", "Expert uses that needed a read.",
            (double)x->misses);
    gauge(&b, "sluice_expert_cache_hit_ratio", "hits / (hits + misses) since load (1 when idle).",
          x->hits + x->misses ? (double)x->hits / (double)(x->hits + x->misses) : 1.0);
    counter(&b, "sluice_expert_cache_evictions_total", "Experts evicted from the cache.",
            (double)x->evictions);
    counter(&b, "sluice_expert_bytes_read_total", "Expert bytes read from storage.",
            (double)x->bytes_read);
    counter(&b, "sluice_expert_reads_total", "Expert read requests issued.", (double)x->reads);
    counter(&b, "sluice_expert_io_wait_seconds_total", "Time compute waited for expert reads.",
            x->io_wait_s);
    counter(&b, "sluice_expert_prefetch_issued_total", "Expert prefetches issued.",
            (double)x->prefetch_issued);
    counter(&b, "sluice_expert_prefetch_used_total", "Prefetched experts that were used.",
            (double)x->prefetch_used);
    return sb_take(&b);
}
