/* sluice bench: the measured runs (see bench.h). Reports are in bench_report.c. */
#include "tools/bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "models/model.h"
#include "tools/digest.h"
#include "tools/machine.h"
#include "tools/synth.h"
#include "tools/trace.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* ---- prompts ------------------------------------------------------------------------------ */

/* Ordinary text tokens (token type 1) of the vocabulary, grouped by topic (id mod topics) when
 * the file is a synthetic model with topic channels, so that prompts have the topic locality of
 * real text (docs/synth.md). */
typedef struct token_pool {
    int32_t *ids;
    int n;
    int topics;
    int *start, *count; /* per topic, into ids (sorted by topic) */
} token_pool;

static void pool_free(token_pool *tp) {
    free(tp->ids);
    free(tp->start);
    free(tp->count);
}

static int pool_init(token_pool *tp, const sluice_model *m) {
    memset(tp, 0, sizeof *tp);
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    const gguf_kv *tt = m->gguf ? gguf_find(m->gguf, "tokenizer.ggml.token_type") : NULL;
    uint32_t topics = 0;
    if (m->gguf) gguf_get_u32(m->gguf, SYNTH_KEY_TOPICS, &topics);
    tp->topics = topics >= 1 && topics <= 1024 ? (int)topics : 1;
    tp->ids = malloc((size_t)info.n_vocab * sizeof *tp->ids);
    tp->start = calloc((size_t)tp->topics, sizeof *tp->start);
    tp->count = calloc((size_t)tp->topics, sizeof *tp->count);
    if (!tp->ids || !tp->start || !tp->count) return -1;
    for (int t = 0; t < tp->topics; t++) {
        tp->start[t] = tp->n;
        for (int id = t; id < info.n_vocab; id += tp->topics) {
            int64_t type = 1;
            if (tt && (uint64_t)id < tt->arr_n) gguf_arr_get_i64(tt, (uint64_t)id, &type);
            if (type == 1) tp->ids[tp->n++] = id;
        }
        tp->count[t] = tp->n - tp->start[t];
    }
    if (tp->n == 0) { /* no usable type information: every id */
        for (int id = 0; id < info.n_vocab; id++) tp->ids[tp->n++] = id;
        tp->topics = 1;
        tp->start[0] = 0;
        tp->count[0] = tp->n;
    }
    return 0;
}

#define TOPIC_RUN 64 /* tokens per topic run in synthetic prompts */

static void synth_prompt(const token_pool *tp, uint64_t seed, int n, int32_t *out) {
    uint64_t s = mix64(seed ^ 0xB3EC4ull ^ (uint64_t)n);
    int topic = 0;
    for (int i = 0; i < n; i++) {
        if (i % TOPIC_RUN == 0) {
            do {
                s = mix64(s);
                topic = (int)(s % (uint64_t)tp->topics);
            } while (tp->count[topic] == 0);
        }
        s = mix64(s);
        out[i] = tp->ids[tp->start[topic] + (int)(s % (uint64_t)tp->count[topic])];
    }
}

/* ---- one run ------------------------------------------------------------------------------ */

static void stats_delta(bench_stats *d, const sluice_expert_stats *a, const sluice_expert_stats *b) {
    d->acquires = b->acquires - a->acquires;
    d->hits = b->hits - a->hits;
    d->misses = b->misses - a->misses;
    d->evictions = b->evictions - a->evictions;
    d->bytes_read = b->bytes_read - a->bytes_read;
    d->reads = b->reads - a->reads;
    d->io_wait_s = b->io_wait_s - a->io_wait_s;
    d->prefetch_issued = b->prefetch_issued - a->prefetch_issued;
    d->prefetch_used = b->prefetch_used - a->prefetch_used;
    d->host_computed = b->host_computed - a->host_computed;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* nearest-rank percentile of sorted values */
static double percentile(const double *v, int n, double q) {
    if (n <= 0) return 0;
    int r = (int)(q * n + 0.999999);
    if (r < 1) r = 1;
    if (r > n) r = n;
    return v[r - 1];
}

static int write_file(const char *path, const void *p, size_t n, char *err, size_t en) {
    FILE *fp = fopen(path, "wb");
    bool ok = fp && fwrite(p, 1, n, fp) == n;
    if (fp) ok = fclose(fp) == 0 && ok;
    if (!ok) snprintf(err, en, "%s: %s", path, strerror(errno));
    return ok ? 0 : -1;
}

/* Route observer of a measured run: counts the distinct (layer, expert) pairs used (the bytes
 * a perfect cache would read once) and forwards to the trace writer. */
typedef struct route_obs {
    trace_writer *tw;
    uint8_t *seen;
    int n_expert;
    uint64_t distinct;
} route_obs;

static void observe_route(void *ctx, int layer, int pos, int k, const int32_t *experts,
                          const float *weights) {
    route_obs *o = ctx;
    if (!o->seen) return; /* a warmup run */
    for (int i = 0; i < k; i++) {
        uint8_t *f = &o->seen[(size_t)layer * o->n_expert + experts[i]];
        o->distinct += !*f;
        *f = 1;
    }
    if (o->tw) trace_writer_route(o->tw, layer, pos, k, experts, weights);
}

typedef struct run_ctx {
    sluice_model *m;
    const bench_params *bp;
    int n_vocab;
    trace_writer *tw;
    const char *stem;
    /* the session of the last run, reused (reset) by the next run of the same context size, as
     * llama-bench reuses its context: a GPU decode graph captured in the warmup is replayed by
     * the timed runs instead of being recaptured inside the first one */
    sluice_session *s;
    int ctx_min; /* the warmup's context: the first timed run's, so that it reuses the session */
} run_ctx;

/* --mtp-accept: the plain greedy run's token at each position (tokens[pos - first]), and the
 * probability with which a draft becomes it. Whether a position's draft does is a fixed
 * function of the position (splitmix64), so every run and every draft length sees the same
 * choices. */
typedef struct oracle {
    const int32_t *tokens;
    int first, n;
    double p;
} oracle;

static int32_t oracle_draft(void *ctx, int pos, int32_t proposed) {
    const oracle *o = ctx;
    if (pos < o->first || pos >= o->first + o->n) return proposed;
    uint64_t z = (uint64_t)pos + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53 < o->p ? o->tokens[pos - o->first] : proposed;
}

/* The plain greedy continuation of the prompt on s (untimed): tokens[i] is evaluated at
 * position p + i, i < n. The session is reset afterwards. */
static int oracle_record(sluice_session *s, const int32_t *prompt, int p, int n, int32_t *tokens) {
    sluice_session_reset(s);
    if (sluice_session_eval(s, prompt, p, NULL) != 0) return -1;
    for (int i = 0; i < n; i++) {
        tokens[i] = sluice_session_argmax(s);
        if (i + 1 < n && sluice_session_eval(s, &tokens[i], 1, NULL) != 0) return -1;
    }
    sluice_session_reset(s);
    return 0;
}

static int do_run(run_ctx *c, const int32_t *prompt, int p, int n_gen, bool measured, int seq,
                  bench_run *r, char *err, size_t en) {
    const int V = c->n_vocab;
    sluice_session_params sp = {.n_ctx = c->bp->n_ctx ? c->bp->n_ctx : p + n_gen,
                                .n_batch = c->bp->n_batch, .n_threads = c->bp->n_threads};
    if (sp.n_ctx < p + n_gen) sp.n_ctx = p + n_gen;
    if (sp.n_ctx < c->ctx_min) sp.n_ctx = c->ctx_min;
    if (c->s && sluice_session_n_ctx(c->s) == sp.n_ctx) {
        sluice_session_reset(c->s);
    } else {
        sluice_session_free(c->s);
        c->s = sluice_session_new(c->m, &sp);
    }
    sluice_session *s = c->s;
    float *logits = measured ? malloc((size_t)(n_gen + 1) * (size_t)V * sizeof(float)) : NULL;
    int32_t *toks = measured ? malloc((size_t)(p + n_gen + 1) * sizeof(int32_t)) : NULL;
    double *steps = malloc((size_t)(n_gen > 0 ? n_gen : 1) * sizeof(double));
    const bool use_oracle = c->bp->mtp > 0 && c->bp->mtp_oracle && n_gen > 0;
    int32_t *plain = use_oracle ? malloc((size_t)n_gen * sizeof(int32_t)) : NULL;
    oracle orc = {.tokens = plain, .first = p, .n = n_gen, .p = c->bp->mtp_accept};
    sluice_model_info info;
    sluice_model_get_info(c->m, &info);
    route_obs obs = {.tw = c->tw, .n_expert = info.n_expert};
    int rc = -1;
    if (!s || !steps || (measured && (!logits || !toks)) || (use_oracle && !plain)) {
        snprintf(err, en, "%s", s ? "out of memory for the evidence buffers" : sluice_last_error());
        goto done;
    }
    if (use_oracle) { /* before the route callback: the recording run is not observed */
        if (oracle_record(s, prompt, p, n_gen, plain) != 0) goto eval_fail;
        sluice_session_set_draft_hook(s, oracle_draft, &orc);
    }
    /* touched now, outside the timed steps: an MTP step copies its rows' logits in itself, and
     * first touches of this buffer (3 MB a 3-token step at a 248K vocabulary) cost page faults
     * that a plain step, which copies after its timer, never paid (~8% of the MTP decode) */
    if (measured) memset(logits, 0, (size_t)(n_gen + 1) * (size_t)V * sizeof(float));
    if (info.n_expert > 0) {
        if (measured) {
            obs.seen = calloc((size_t)info.n_layer * (size_t)info.n_expert, 1);
            if (!obs.seen) {
                snprintf(err, en, "out of memory");
                goto done;
            }
            if (c->tw) trace_writer_set_seq(c->tw, seq);
        }
        /* the warmup observes too (and ignores what it sees): a GPU session's decode graph
         * then downloads the routing already when the warmup captures it */
        sluice_session_set_route_callback(s, observe_route, &obs);
    }
    sluice_expert_stats st0, st1, st2;
    bool per_run = measured && machine_peak_rss_reset();
    sluice_model_expert_stats(c->m, &st0);
    const double t0 = now_s();
    if (sluice_session_eval(s, prompt, p, NULL) != 0) goto eval_fail;
    const double t1 = now_s();
    int32_t tok = sluice_session_argmax(s); /* sluice_argmax of the logits (a GPU's own pick) */
    const double t2 = now_s();
    sluice_model_expert_stats(c->m, &st1);
    if (measured) {
        memcpy(logits, sluice_session_logits(s), (size_t)V * sizeof(float));
        memcpy(toks, prompt, (size_t)p * sizeof(int32_t));
        toks[p] = tok;
    }
    sluice_spec_stats ss = {0};
    int32_t fed[65];
    sluice_session_set_spec_policy(s, c->bp->mtp_always ? SLUICE_SPEC_ALWAYS : SLUICE_SPEC_ADAPTIVE);
    for (int i = 0; c->bp->mtp > 0 && i < n_gen;) { /* MTP speculative steps */
        float *rows = measured ? logits + (size_t)(i + 1) * V : NULL;
        const double ts = now_s();
        const int k = sluice_session_spec_step(s, c->bp->mtp, n_gen - i, fed, rows, &ss);
        const double dt = now_s() - ts;
        if (k < 1) goto eval_fail;
        if (fed[0] != tok) {
            snprintf(err, en, "MTP step evaluated token %d where %d was chosen", fed[0], tok);
            goto done;
        }
        for (int j = 0; j < k; j++) {
            steps[i + j] = dt / k;
            tok = j + 1 < k ? fed[j + 1] : sluice_argmax(sluice_session_logits(s), V);
            if (measured) toks[p + i + j + 1] = j + 1 < k ? fed[j + 1] : tok;
        }
        i += k;
    }
    for (int i = 0; c->bp->mtp <= 0 && i < n_gen; i++) {
        const double ts = now_s();
        if (sluice_session_eval(s, &tok, 1, NULL) != 0) goto eval_fail;
        int32_t next = sluice_session_argmax(s);
        steps[i] = now_s() - ts;
        if (measured) { /* evidence copies stay outside the timed step */
            memcpy(logits + (size_t)(i + 1) * V, sluice_session_logits(s), (size_t)V * sizeof(float));
            toks[p + i + 1] = next;
        }
        tok = next;
    }
    sluice_model_expert_stats(c->m, &st2);
    if (!measured) {
        rc = 0;
        goto done;
    }
    r->spec_steps = ss.steps;
    r->spec_drafted = ss.drafted;
    r->spec_accepted = ss.accepted;
    r->spec_plain = ss.plain;
    r->spec_shadowed = ss.shadowed;
    r->spec_shadow_hits = ss.shadow_hits;
    r->peak_rss = machine_peak_rss();
    r->peak_rss_per_run = per_run;
    r->n_prompt = p;
    r->n_gen = n_gen;
    r->prefill_s = t1 - t0;
    r->ttft_s = t2 - t0;
    r->decode_s = 0;
    for (int i = 0; i < n_gen; i++) r->decode_s += steps[i];
    r->tpot_mean = n_gen ? r->decode_s / n_gen : 0;
    qsort(steps, (size_t)n_gen, sizeof *steps, cmp_double);
    r->tpot_p50 = percentile(steps, n_gen, 0.50);
    r->tpot_p95 = percentile(steps, n_gen, 0.95);
    r->tpot_p99 = percentile(steps, n_gen, 0.99);
    stats_delta(&r->prefill, &st0, &st1);
    stats_delta(&r->decode, &st1, &st2);
    r->unique_expert_bytes = obs.distinct * trace_model_expert_bytes(c->m);
    r->read_amplification = r->unique_expert_bytes
                                ? (double)(r->prefill.bytes_read + r->decode.bytes_read) /
                                      (double)r->unique_expert_bytes
                                : 0.0;
    const size_t lbytes = (size_t)(n_gen + 1) * (size_t)V * sizeof(float);
    const size_t tbytes = (size_t)(p + n_gen + 1) * sizeof(int32_t);
    if (!digest_buffer(logits, lbytes, r->logits_sha) || !digest_buffer(toks, tbytes, r->tokens_sha)) {
        snprintf(err, en, "SHA-256 failed");
        goto done;
    }
    if (c->bp->evidence_dir) {
        snprintf(r->logits_file, sizeof r->logits_file, "%s/%s-p%d-n%d-r%d.logits.f32",
                 c->bp->evidence_dir, c->stem, p, n_gen, r->rep);
        snprintf(r->tokens_file, sizeof r->tokens_file, "%s/%s-p%d-n%d-r%d.tokens.i32",
                 c->bp->evidence_dir, c->stem, p, n_gen, r->rep);
        if (write_file(r->logits_file, logits, lbytes, err, en) != 0 ||
            write_file(r->tokens_file, toks, tbytes, err, en) != 0)
            goto done;
    }
    rc = 0;
    goto done;
eval_fail:
    snprintf(err, en, "%s", sluice_last_error());
done:
    if (s) {
        sluice_session_set_route_callback(s, NULL, NULL); /* obs is freed below */
        if (use_oracle) sluice_session_set_draft_hook(s, NULL, NULL); /* orc dies here */
    }
    free(plain);
    free(obs.seen);
    free(logits);
    free(toks);
    free(steps);
    return rc;
}

/* The model file's name without directory and .gguf, for evidence file names. */
static void model_stem(const char *path, char *out, size_t cap) {
    const char *b = path ? strrchr(path, '/') : NULL;
    b = b ? b + 1 : path ? path : "embedded";
    snprintf(out, cap, "%s", b);
    size_t n = strlen(out);
    if (n > 5 && strcmp(out + n - 5, ".gguf") == 0) out[n - 5] = 0;
}

int bench_execute(sluice_model *m, const bench_params *bp, bench_result *res, FILE *log,
                  char *err, size_t en) {
    memset(res, 0, sizeof *res);
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    if (bp->model_path) {
        if (!digest_file(bp->model_path, bp->hash_model, res->model_sha, &res->model_bytes, err, en))
            return -1;
        res->model_hash_full = bp->hash_model;
    } else {
        res->model_bytes = info.file_bytes;
    }
    res->expert_bytes = trace_model_expert_bytes(m);
    if (bp->evidence_dir && mkdir(bp->evidence_dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, en, "%s: %s", bp->evidence_dir, strerror(errno));
        return -1;
    }
    char stem[256];
    model_stem(bp->model_path, stem, sizeof stem);
    run_ctx c = {.m = m, .bp = bp, .n_vocab = info.n_vocab, .stem = stem};
    int rc = -1, max_p = 0;
    int32_t *file_ids = NULL, *prompt = NULL;
    int n_file = 0;
    token_pool tp = {0};
    for (int i = 0; i < bp->n_prompts; i++) max_p = bp->n_prompt[i] > max_p ? bp->n_prompt[i] : max_p;
    prompt = malloc((size_t)(max_p > 16 ? max_p : 16) * sizeof *prompt);
    res->runs = calloc((size_t)bp->n_prompts * (size_t)bp->reps, sizeof *res->runs);
    if (!prompt || !res->runs || pool_init(&tp, m) != 0) {
        snprintf(err, en, "out of memory");
        goto done;
    }
    if (bp->prompt_file) {
        FILE *fp = fopen(bp->prompt_file, "rb");
        char *text = NULL;
        size_t len = 0;
        if (fp) {
            fseek(fp, 0, SEEK_END);
            long sz = ftell(fp);
            fseek(fp, 0, SEEK_SET);
            text = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
            len = text ? fread(text, 1, (size_t)sz, fp) : 0;
            fclose(fp);
        }
        if (!text) {
            snprintf(err, en, "%s: %s", bp->prompt_file, fp ? "read error" : strerror(errno));
            goto done;
        }
        n_file = sluice_tokenize(m, text, len, false, true, NULL, 0);
        file_ids = n_file > 0 ? malloc((size_t)n_file * sizeof *file_ids) : NULL;
        if (file_ids) sluice_tokenize(m, text, len, false, true, file_ids, n_file);
        free(text);
        if (!file_ids) {
            snprintf(err, en, "%s: no tokens", bp->prompt_file);
            goto done;
        }
    }
    if (bp->trace_path) {
        c.tw = trace_writer_for_model(bp->trace_path, m, err, en);
        if (!c.tw) goto done;
    }
    if (bp->warmup) {
        int wp = max_p < 16 ? (max_p > 0 ? max_p : 1) : 16;
        synth_prompt(&tp, bp->seed, wp, prompt);
        if (info.add_bos && info.bos >= 0) prompt[0] = info.bos;
        /* two decode steps: a GPU session captures its decode graph in the second */
        if (log) fprintf(log, "bench: warmup (%d prompt tokens, 2 decode steps)\n", wp);
        for (int i = 0; i < bp->n_prompts; i++)
            if (bp->n_prompt[i] + bp->n_gen <= info.n_ctx_train) {
                c.ctx_min = bp->n_ctx ? 0 : bp->n_prompt[i] + bp->n_gen;
                break;
            }
        const int rc_w = do_run(&c, prompt, wp, 2, false, 0, NULL, err, en);
        c.ctx_min = 0;
        if (rc_w != 0) goto done;
    }
    const bool resident = strcmp(sluice_model_mode(m), "resident") == 0;
    int seq = 0;
    for (int i = 0; i < bp->n_prompts; i++) {
        const int p = bp->n_prompt[i];
        if (p + bp->n_gen > info.n_ctx_train) {
            if (log)
                fprintf(log, "bench: skipping %d+%d tokens: beyond the model's context of %d\n", p,
                        bp->n_gen, info.n_ctx_train);
            res->prompts_skipped++;
            continue;
        }
        if (file_ids) {
            for (int j = 0; j < p; j++) prompt[j] = file_ids[j % n_file]; /* cycled when short */
        } else {
            synth_prompt(&tp, bp->seed, p, prompt);
            if (info.add_bos && info.bos >= 0) prompt[0] = info.bos;
        }
        /* a resident model: an untimed run of this very prompt first, as llama-bench warms each
         * test up with its whole prompt. It first-touches what a batch of this size uses
         * (backend scratch, KV cache, recurrent state): page faults that the first timed run
         * paid otherwise (0.47 s of a 35B-A3B pp512 on the 2-vCPU test VM, where a fault costs
         * microseconds). A streamed model keeps the short warmup alone: a whole run would fill
         * its expert cache with this prompt's experts. */
        if (bp->warmup && resident) {
            const int wgen = bp->n_gen < 2 ? bp->n_gen : 2;
            if (log) fprintf(log, "bench: warmup (%d prompt tokens, %d decode steps)\n", p, wgen);
            c.ctx_min = bp->n_ctx ? 0 : p + bp->n_gen; /* the timed runs' session */
            const int rc_w = do_run(&c, prompt, p, wgen, false, 0, NULL, err, en);
            c.ctx_min = 0;
            if (rc_w != 0) goto done;
        }
        for (int rep = 0; rep < bp->reps; rep++) {
            bench_run *r = &res->runs[res->n_runs];
            r->rep = rep;
            if (log) {
                fprintf(log, "bench: prompt %d, generate %d, repetition %d/%d ...", p, bp->n_gen,
                        rep + 1, bp->reps);
                fflush(log);
            }
            if (do_run(&c, prompt, p, bp->n_gen, true, seq++, r, err, en) != 0) {
                if (log) fprintf(log, "\n");
                goto done;
            }
            res->n_runs++;
            if (log)
                fprintf(log, " prefill %.2f t/s, decode %.2f t/s\n",
                        r->prefill_s > 0 ? p / r->prefill_s : 0.0,
                        r->decode_s > 0 ? bp->n_gen / r->decode_s : 0.0);
        }
    }
    rc = 0;
done:
    if (c.tw) {
        char terr[256];
        if (trace_writer_close(c.tw, terr, sizeof terr) != 0 && rc == 0) {
            snprintf(err, en, "%s", terr);
            rc = -1;
        }
    }
    sluice_session_free(c.s);
    pool_free(&tp);
    free(prompt);
    free(file_ids);
    return rc;
}

void bench_result_free(bench_result *res) {
    free(res->runs);
    memset(res, 0, sizeof *res);
}
