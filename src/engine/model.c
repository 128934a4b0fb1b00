/* sluice_model: open the GGUF, pick the architecture, bind weights, build the tokenizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/error.h"
#include "engine/model_gpu.h"
#include "engine/model_mapping.h"
#include "models/model.h"
#include "runtime/ngram_table.h"
#include "runtime/watchdog.h"

static void copy_str(char *dst, size_t cap, gguf_str s) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = 0;
}

#define DEFAULT_PLAN_CTX 4096
#define DEFAULT_PLAN_BATCH 512
/* Without -b, a model whose weights are all resident in host memory for the CPU prefills in
 * chunks of this many tokens when the plan still fits: a routed expert then sees about four
 * times the tokens per chunk, so each decoded weight block serves more of them (30B-A3B shape,
 * pp2048 on 2 cores: 16.4 -> 19.1 t/s side by side, bench/results/2026-11-30-cpu-30b-prefill-
 * profile.md). Results do
 * not change: the CPU's results do not depend on the batch. Streaming keeps DEFAULT_PLAN_BATCH
 * (the memory goes to the expert cache), as does the GPU (its plan trades the batch against
 * the VRAM expert cache). */
#define AUTO_BATCH 2048

/* What the planner needs to know about this model, in bytes. */
static void model_facts(sluice_model *m) {
    const hparams *hp = &m->hp;
    plan_model_facts *f = &m->facts;
    memset(f, 0, sizeof *f);
    f->file_bytes = m->gguf->size;
    uint64_t expert_region = 0;
    for (int i = 0; i < m->layout.n_layer; i++) {
        const expert_layer_layout *L = &m->layout.layers[i];
        if (!L->present) continue;
        f->n_moe_layers++;
        if (m->layout.packed) expert_region += L->record_stride * (uint64_t)m->layout.n_expert;
        else
            for (int p = 0; p < EXPERT_PARTS; p++)
                expert_region += L->part[p].bytes * (uint64_t)m->layout.n_expert;
    }
    f->expert_bytes = expert_region;
    f->dense_bytes = f->file_bytes > expert_region ? f->file_bytes - expert_region : 0;
    f->slot_bytes = expert_slot_bytes(&m->layout);
    f->n_expert = hp->n_expert;
    f->n_expert_used = hp->n_expert_used;
    uint64_t s1 = m->arch->state_bytes(m, 1), s2 = m->arch->state_bytes(m, 2);
    f->kv_bytes_per_pos = s2 - s1;
    f->state_bytes = s1 - f->kv_bytes_per_pos;
    /* activations per token of a batch: residual and norms, projections, FFN hidden, routing,
     * per-slot expert outputs, gathered rows, encoded activations (floats unless noted) */
    uint64_t E = (uint64_t)hp->n_embd, ff = (uint64_t)(hp->n_ff > hp->n_ff_exp ? hp->n_ff : hp->n_ff_exp);
    uint64_t q = (uint64_t)hp->n_head * (uint64_t)(hp->head_dim_k > hp->head_dim_v ? hp->head_dim_k : hp->head_dim_v);
    uint64_t kv = (uint64_t)hp->n_head_kv * (uint64_t)(hp->head_dim_k + hp->head_dim_v);
    uint64_t k = (uint64_t)(hp->n_expert_used > 0 ? hp->n_expert_used : 0);
    f->scratch_per_token = 4 * (6 * E + 2 * q + kv + 2 * ff + 2 * (uint64_t)hp->n_expert + k * E + 4 * E) +
                           2 * (E + ff);
    if (hp->n_layer_recurrent > 0) {
        /* linear-attention buffers (models/qwen35moe.c): qkv before and after the conv, q, k,
         * v, z, gates, mixed output, gated query */
        uint64_t KD = (uint64_t)hp->ssm_n_k_head * hp->ssm_d_k;
        uint64_t VD = (uint64_t)hp->ssm_n_v_head * hp->ssm_d_v;
        uint64_t CD = 2 * KD + VD;
        f->scratch_per_token += 4 * (2 * CD + 2 * KD + 4 * VD + 4 * (uint64_t)hp->ssm_n_v_head + 2 * q);
    }
    f->scratch_fixed = 3 * 4 * (uint64_t)hp->n_vocab + (16ull << 20);
    if (m->arch->plan_facts) m->arch->plan_facts(m, f);
    model_gpu_facts(m, f);
}

/* Plan memory; create the expert store the plan asks for. 0, or -1 with the error set. */
static int plan_and_bind(sluice_model *m, const char *label) {
    const sluice_model_params *p = &m->params;
    m->request = (plan_request){
        .mode = p->mode,
        .mem_budget = p->mem_budget,
        .cache_bytes = p->cache_bytes,
        .cache_slots = p->cache_experts,
        .n_ctx = p->n_ctx > 0 ? p->n_ctx
                              : (m->hp.n_ctx_train < DEFAULT_PLAN_CTX ? m->hp.n_ctx_train : DEFAULT_PLAN_CTX),
        .n_batch = p->n_batch > 0 ? p->n_batch : DEFAULT_PLAN_BATCH,
        .ngram_mode = p->ngram_mode,
        .ngram_cache_rows = p->ngram_cache_rows,
        .io_depth = p->io_depth,
    };
    if (!m->path && m->request.mode == SLUICE_MODE_STREAM) {
        sluice_set_error("%s: a model in memory cannot stream its experts", label);
        return -1;
    }
    model_facts(m);
    plan_probe(&m->machine);
    plan_compute(&m->facts, &m->machine, &m->request, &m->plan);
    if (p->n_batch <= 0 && p->backend != SLUICE_BACKEND_CUDA && m->plan.ok &&
        m->plan.mode == SLUICE_MODE_RESIDENT) {
        plan_request r = m->request;
        r.n_batch = AUTO_BATCH < r.n_ctx ? AUTO_BATCH : r.n_ctx;
        plan big;
        plan_compute(&m->facts, &m->machine, &r, &big);
        if (r.n_batch > m->request.n_batch && big.ok && big.mode == SLUICE_MODE_RESIDENT) {
            m->request = r;
            m->plan = big;
        }
    }
    if (p->backend == SLUICE_BACKEND_CUDA) return model_gpu_bind(m, label); /* the device plan decides */
    if (!m->plan.ok && !p->plan_only) {
        sluice_set_error("%s: memory plan refused: %s", label, m->plan.message);
        return -1;
    }
    char err[512];
    if (!p->plan_only && m->arch->bind && m->arch->bind(m, err, sizeof err) != 0) {
        sluice_set_error("%s: %s", label, err);
        return -1;
    }
    if (p->plan_only || m->facts.n_moe_layers == 0) return 0;
    if (m->plan.mode == SLUICE_MODE_RESIDENT) {
        m->experts = expert_store_resident_new(&m->layout, m->gguf->base);
    } else {
        stream_params sp = {.path = m->path,
                            .layout = &m->layout,
                            .cache_bytes = m->plan.cache,
                            .io_mode = p->io == SLUICE_IO_PAGE ? 1 : 0,
                            .io_depth = p->io_depth,
                            .verify_reads = p->verify_reads};
        m->experts = expert_store_stream_new(&sp, err, sizeof err);
        if (!m->experts) {
            sluice_set_error("%s: %s", label, err);
            return -1;
        }
    }
    if (!m->experts) {
        sluice_set_error("%s: out of memory", label);
        return -1;
    }
    return 0;
}

/* "KEY=TYPE:VALUE" (llama.cpp's --override-kv) onto the file's metadata, before anything
 * reads it. 0, or -1 with the error set. */
static int apply_overrides(sluice_model *m, const char *label) {
    for (int i = 0; i < m->params.n_override_kv; i++) {
        const char *spec = m->params.override_kv[i];
        char key[256], err[512];
        gguf_kv v;
        if (gguf_parse_override(spec, key, sizeof key, &v, err, sizeof err) != 0) {
            sluice_set_error("%s: %s", label, err);
            return -1;
        }
        if (gguf_override(m->gguf, key, &v, err, sizeof err) != 0) {
            sluice_set_error("%s: %s", label, err);
            return -1;
        }
        if (m->params.verbose) fprintf(stderr, "%s: metadata override %s = %s\n", label, key, strchr(spec, '=') + 1);
    }
    return 0;
}

static sluice_model *load_from(gguf_file *g, const char *label, const char *path,
                               const sluice_model_params *params) {
    char err[512] = "";
    sluice_model *m = calloc(1, sizeof *m);
    if (!m) {
        gguf_close(g);
        sluice_set_error("%s: out of memory", label);
        return NULL;
    }
    m->gguf = g;
    if (params) m->params = *params;
    if (path && !(m->path = strdup(path))) {
        sluice_set_error("%s: out of memory", label);
        goto fail;
    }
    gguf_str s;
    if (!gguf_get_str(g, "general.architecture", &s)) {
        sluice_set_error("%s: missing general.architecture", label);
        goto fail;
    }
    copy_str(m->arch_name, sizeof m->arch_name, s);
    m->arch = arch_find(m->arch_name);
    if (!m->arch) {
        sluice_set_error("%s: architecture '%s' is not supported (supported: %s)", label,
                         m->arch_name, arch_supported_list());
        goto fail;
    }
    if (apply_overrides(m, label) != 0) goto fail;
    if (gguf_get_str(g, "general.name", &s)) copy_str(m->name, sizeof m->name, s);
    else copy_str(m->name, sizeof m->name, (gguf_str){label, strlen(label)});

    if (m->arch->load(m, err, sizeof err) != 0) {
        sluice_set_error("%s: %s", label, err);
        goto fail;
    }
    m->tok = tokenizer_load(g, err, sizeof err);
    if (!m->tok) {
        sluice_set_error("%s: tokenizer: %s", label, err);
        goto fail;
    }
    if (tokenizer_n_vocab(m->tok) > m->hp.n_vocab) {
        sluice_set_error("%s: the tokenizer has %d tokens but the model only %d embeddings",
                         label, tokenizer_n_vocab(m->tok), m->hp.n_vocab);
        goto fail;
    }
    if (plan_and_bind(m, label) != 0) goto fail;
    if (m->experts && m->experts->streaming) model_mapping_advise_stream(m);
    else if (!m->params.plan_only && !m->plan.gpu) model_mapping_populate_resident(m);
    if (m->params.mlock && !m->params.plan_only && model_mapping_lock(m, label) != 0) goto fail;
    if (!m->params.plan_only && !m->params.no_watchdog) {
        watchdog_start(NULL);
        m->watching = true;
    }
    return m;
fail:
    sluice_model_free(m);
    return NULL;
}

sluice_model *sluice_model_load(const char *path, const sluice_model_params *params) {
    char err[512];
    gguf_file *g = gguf_open(path, err, sizeof err);
    if (!g) {
        sluice_set_error("%s", err);
        return NULL;
    }
    const char *base = strrchr(path, '/');
    return load_from(g, base ? base + 1 : path, path, params);
}

sluice_model *sluice_model_load_memory(const void *data, size_t size, const char *name,
                                       const sluice_model_params *params) {
    char err[512];
    gguf_file *g = gguf_open_memory(data, size, err, sizeof err);
    if (!g) {
        sluice_set_error("%s: %s", name, err);
        return NULL;
    }
    return load_from(g, name, NULL, params);
}

void sluice_model_free(sluice_model *m) {
    if (!m) return;
    if (m->watching) watchdog_stop();
    if (m->arch && m->arch->unload) m->arch->unload(m);
    expert_store_free(m->experts);
    model_gpu_release(m);
    expert_layout_free(&m->layout);
    free(m->path);
    tokenizer_free(m->tok);
    free(m->layers);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    gguf_close(m->gguf);
    free(m);
}

void sluice_model_get_info(const sluice_model *m, sluice_model_info *info) {
    memset(info, 0, sizeof *info);
    info->arch = m->arch_name;
    info->name = m->name;
    info->n_vocab = m->hp.n_vocab;
    info->n_ctx_train = m->hp.n_ctx_train;
    info->n_layer = m->hp.n_layer;
    info->n_embd = m->hp.n_embd;
    info->n_expert = m->hp.n_expert;
    info->n_expert_used = m->hp.n_expert_used;
    info->n_params = m->n_params;
    info->file_bytes = m->gguf->size;
    info->bos = tokenizer_bos(m->tok);
    info->eos = tokenizer_eos(m->tok);
    info->add_bos = tokenizer_add_bos(m->tok);
}

int sluice_tokenize(const sluice_model *m, const char *text, size_t len, bool parse_special,
                    bool add_bos, int32_t *ids, int cap) {
    int32_t *buf = NULL;
    size_t n = 0, bcap = 0;
    if (tokenizer_encode(m->tok, text, len, parse_special, add_bos && tokenizer_add_bos(m->tok),
                         &buf, &n, &bcap) != 0) {
        free(buf);
        sluice_set_error("tokenize: out of memory");
        return -1;
    }
    if (n > (size_t)INT32_MAX) {
        free(buf);
        sluice_set_error("tokenize: text too long");
        return -1;
    }
    for (size_t i = 0; i < n && (int)i < cap; i++) ids[i] = buf[i];
    free(buf);
    return (int)n;
}

int sluice_token_to_piece(const sluice_model *m, int32_t id, bool render_special, char *buf,
                          int cap) {
    if (id < 0 || id >= tokenizer_n_vocab(m->tok)) return 0;
    return (int)tokenizer_piece(m->tok, id, render_special, buf, cap > 0 ? (size_t)cap : 0);
}

bool sluice_token_is_eog(const sluice_model *m, int32_t id) {
    return tokenizer_is_eog(m->tok, id);
}

void sluice_model_expert_stats(const sluice_model *m, sluice_expert_stats *stats) {
    if (m->experts) *stats = m->experts->stats;
    else memset(stats, 0, sizeof *stats);
}

void sluice_model_ngram_stats(const sluice_model *m, sluice_ngram_stats *stats) {
    memset(stats, 0, sizeof *stats);
    if (!m->ngram) return;
    ngram_table_stats t;
    ngram_table_get_stats(m->ngram, &t);
    stats->on_demand = ngram_table_streaming(m->ngram);
    stats->lookups = t.lookups;
    stats->hits = t.hits;
    stats->misses = t.misses;
    stats->prefetched = t.prefetched;
    stats->reads = t.reads;
    stats->bytes_read = t.bytes_read;
    stats->evictions = t.evictions;
    stats->stalls = t.stalls;
    stats->stall_s = t.stall_s;
    stats->gathers = t.gathers;
}

int sluice_model_plan(const sluice_model *m, bool json, char *buf, size_t cap) {
    int n = plan_format(&m->plan, &m->facts, json, buf, cap);
    if (!m->plan.gpu || n < 0) return n;
    /* the device side: appended lines, or a "gpu" member of the JSON object */
    size_t at = json ? (size_t)n - 1 : (size_t)n; /* JSON: over the closing brace */
    char *dst = buf && at < cap ? buf + at : NULL;
    size_t room = buf && at < cap ? cap - at : 0;
    int g;
    if (json) {
        int h = snprintf(dst, room, ",\"gpu\":");
        if (h < 0) return -1;
        size_t at2 = at + (size_t)h;
        g = h + plan_format_gpu(&m->plan, &m->facts, true, buf && at2 < cap ? buf + at2 : NULL,
                                buf && at2 < cap ? cap - at2 : 0);
        size_t end = at + (size_t)g;
        if (buf && end + 1 < cap) {
            buf[end] = '}';
            buf[end + 1] = 0;
        }
        return (int)end + 1;
    }
    g = plan_format_gpu(&m->plan, &m->facts, false, dst, room);
    return n + g;
}

const char *sluice_model_mode(const sluice_model *m) {
    if (m->plan.gpu) return m->plan.gpu_mode == SLUICE_MODE_STREAM ? "gpu-stream" : "gpu-resident";
    return m->plan.mode == SLUICE_MODE_STREAM ? "stream" : "resident";
}

bool sluice_model_plan_ok(const sluice_model *m) { return m->plan.gpu ? m->plan.gpu_ok : m->plan.ok; }

bool sluice_watchdog_tripped(char *why, size_t cap) { return watchdog_tripped(why, cap); }
