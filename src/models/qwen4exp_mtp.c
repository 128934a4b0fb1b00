/* qwen4exp's MTP block (spec QWEN4EXP.md 1.7), the drafter of speculative decoding, and the
 * per-token checkpoints that let a verified batch keep only its accepted prefix.
 *
 * The block predicts the token after next from the trunk's wide residual h_t at position t and
 * the embedding of the next token t+1:
 *
 *   e    = RMSNorm(embed(token t+1)) * enorm                          [n_embd]
 *   hn   = grouped RMSNorm(h_t) * hnorm   (each of the hc streams)     [hc][n_embd]
 *   x_s  = eh_proj [e | hn_s]             per stream s                 [hc][n_embd]
 *   x    = one trunk-shaped layer over x: hc read, dense gated attention (its own KV cache;
 *          llama.cpp attends densely in the MTP block), hc write, hc read, MoE with the shared
 *          expert, hc write
 *   logits = W_out hc_read_head(x)         its own output mixer, the shared output head
 *
 * x (still hc streams wide) is the block's exported residual: a chained draft feeds it back as
 * h of the next position. The tensors are blk.N.nextn.{enorm,hnorm,eh_proj}.weight and
 * blk.N.nextn.hc_head_{norm,down,up}.weight (N = the trunk's n_layer), next to the block's
 * trunk-shaped blk.N.* tensors; the order inside eh_proj's input is [embedding | hidden].
 *
 * The block runs at position t for the pair (h_t, token t+1), so its KV cache follows the trunk
 * one position behind: after every trunk pass, mtp_follow runs it over the positions whose
 * next token became known. A draft then starts at the last position (pos - 1) with the token
 * the trunk just chose.
 *
 * Checkpoints: a verification pass of n tokens (the chosen token and n - 1 drafts) runs the
 * recurrent parts (Gated DeltaNet conv and delta rule, the n-gram conv) token by token and
 * copies their state after every token but the last (whose state is the live one), so spec_keep
 * can return to the state after any prefix
 * exactly. Attention caches need nothing: positions past the kept ones are never read and are
 * overwritten (QSA block keys are re-pooled from the batch's first block). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "engine/error.h"
#include "formats/quant.h"
#include "models/qwen4exp.h"

#define MTP_SHORTLIST 64 /* a draft's rows computed exactly (the drafts' head, below) */
#define MTP_CANDIDATES (MTP_SHORTLIST + Q4X_MTP_SEEN)

/* ---- loading ------------------------------------------------------------------------------ */

bool mtp_load(sluice_model *m, char *err, size_t n) {
    const hparams *hp = &m->hp;
    q4x_model *q = q4x_of(m);
    const int L = hp->n_layer; /* the first block after the trunk */
    const int64_t E = hp->n_embd, W = (int64_t)q->hc * E;
    if (q->nextn < 1) {
        snprintf(err, n, "the model has no MTP block (%s.nextn_predict_layers is 0)",
                 m->arch_name);
        return false;
    }
    if (m->params.backend != SLUICE_BACKEND_CPU) {
        snprintf(err, n, "MTP speculative decoding runs on the CPU backend only");
        return false;
    }
    if (!m->layout.layers || m->layout.n_layer <= L || !m->layout.layers[L].present) {
        snprintf(err, n, "the MTP block (layer %d) has no routed experts", L);
        return false;
    }
    m->layers[L].recurrent = false;
    q->layers[L].compress = 0; /* dense attention, as llama.cpp */
    char pa[48], pf[48], ph[48];
    snprintf(pa, sizeof pa, "blk.%d.hc_attn", L);
    snprintf(pf, sizeof pf, "blk.%d.hc_ffn", L);
    snprintf(ph, sizeof ph, "blk.%d.nextn.hc_head", L);
    if (!hc_load(m, &q->layers[L].attn, true, err, n, pa) ||
        !hc_load(m, &q->layers[L].ffn, true, err, n, pf) || !qsa_load_layer(m, L, err, n) ||
        !hybrid_load_moe_layer(m, L, err, n) || !hc_load(m, &q->mtp_head, false, err, n, ph) ||
        !ld_tensor(m, &q->mtp_enorm, true, E, -1, -1, err, n, "blk.%d.nextn.enorm.weight", L) ||
        !ld_tensor(m, &q->mtp_hnorm, true, W, -1, -1, err, n, "blk.%d.nextn.hnorm.weight", L) ||
        !ld_tensor(m, &q->mtp_eh_proj, true, 2 * E, E, -1, err, n,
                   "blk.%d.nextn.eh_proj.weight", L))
        return false;
    q->mtp = true;
    return true;
}

/* ---- state -------------------------------------------------------------------------------- */

/* Verification passes hold the chosen token and up to params.mtp drafts. */
static int ck_cap_of(const sluice_model *m) { return m->params.mtp + 1; }

static uint64_t recurrent_floats(const sluice_model *m) {
    const hparams *hp = &m->hp;
    const q4x_model *q = q4x_of(m);
    uint64_t f = (uint64_t)hp->n_layer_recurrent *
                 ((uint64_t)hp->ssm_n_v_head * hp->ssm_d_v * hp->ssm_d_k +
                  (uint64_t)(hp->ssm_kernel - 1) * (uint64_t)hybrid_conv_dim(hp));
    if (q->ple_layer >= 0)
        f += (uint64_t)(q->ple_kernel - 1) * q->ngram_size * (uint64_t)q->hc * hp->n_embd;
    return f;
}

uint64_t mtp_state_bytes(const sluice_model *m, int n_ctx) {
    const hparams *hp = &m->hp;
    if (!q4x_of(m)->mtp) return 0;
    const uint64_t kv = (uint64_t)n_ctx * hp->n_head_kv * (uint64_t)(hp->head_dim_k + hp->head_dim_v);
    /* checkpoints after every token of a pass but its last */
    return (kv + (uint64_t)(ck_cap_of(m) - 1) * recurrent_floats(m)) * sizeof(float);
}

bool mtp_state_alloc(const sluice_model *m, model_state *st) {
    const hparams *hp = &m->hp;
    const q4x_model *q = q4x_of(m);
    q4x_state *xs = q4x_state_of(st);
    struct hybrid_state *H = st->hybrid;
    backend *be = st->be;
    const size_t B = (size_t)st->n_batch, F = sizeof(float), E = (size_t)hp->n_embd;
    const size_t W = (size_t)q->hc * E, C = (size_t)ck_cap_of(m);
    xs->mtp_h = state_alloc(be, (B + 1) * W * F);
    xs->mtp_x = state_alloc(be, B * W * F);
    xs->mtp_chain = state_alloc(be, W * F);
    xs->mtp_cat = state_alloc(be, B * (size_t)q->hc * 2 * E * F);
    xs->mtp_logits = malloc((size_t)hp->n_vocab * F);
    xs->mtp_rows = malloc((size_t)MTP_CANDIDATES * m->output.row_bytes);
    xs->ck_tokens = malloc(C * sizeof(int32_t));
    xs->ck_cap = (int)C;
    H->ck_conv = state_alloc(be, (C - 1) * (size_t)H->n_rec * H->conv_len * F + F);
    H->ck_ssm = state_alloc(be, (C - 1) * (size_t)H->n_rec * H->ssm_len * F + F);
    bool ok = xs->mtp_h && xs->mtp_x && xs->mtp_chain && xs->mtp_cat && xs->mtp_logits &&
              xs->mtp_rows && xs->ck_tokens && H->ck_conv && H->ck_ssm;
    if (ok && xs->ple_hist) {
        xs->ck_ple = state_alloc(be, (C - 1) * xs->ple_hist_len * F + F);
        ok = xs->ck_ple != NULL;
    }
    return ok;
}

void mtp_state_free(model_state *st) {
    q4x_state *xs = q4x_state_of(st);
    struct hybrid_state *H = st->hybrid;
    backend *be = st->be;
    if (xs) {
        float *bufs[] = {xs->mtp_h, xs->mtp_x, xs->mtp_chain, xs->mtp_cat, xs->ck_ple};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) state_release(be, bufs[i]);
        free(xs->mtp_logits);
        free(xs->mtp_rows);
        free(xs->ck_tokens);
    }
    if (H) {
        state_release(be, H->ck_conv);
        state_release(be, H->ck_ssm);
    }
}

/* ---- forward ------------------------------------------------------------------------------ */

/* How far mtp_block goes: the KV rows (following), the logits, or the head's input in st->cur
 * (a draft: mtp_draft_argmax takes it from there). */
enum mtp_upto { MTP_KV, MTP_LOGITS, MTP_HEAD_INPUT };

static int mtp_block(const sluice_model *m, model_state *st, backend *be, const float *h,
                     const int32_t *next, int n, int pos0, enum mtp_upto upto, float *logits) {
    const hparams *hp = &m->hp;
    const q4x_model *q = q4x_of(m);
    q4x_state *xs = q4x_state_of(st);
    const int L = hp->n_layer, E = hp->n_embd, hc = q->hc;
    const q4x_layer *X = &q->layers[L];
    /* the route callback sees the trunk's layers only (its tables are sized for them) */
    sluice_route_fn route = st->route_fn;
    st->route_fn = NULL;
    const int32_t *ids;
    be_set_inputs(be, next, n, pos0, &ids, &st->pos);
    st->pos0 = pos0;
    /* eh_proj's input rows, one per (token, stream): [enorm(e_t) | hnorm(h_t)_s] */
    be_embed(be, &m->tok_embd, ids, n, st->cur);
    be_rmsnorm(be, st->cur, &q->mtp_enorm, n, E, hp->rms_eps, st->cur);
    be_rmsnorm_groups(be, h, q->mtp_hnorm.data, n, hc, E, hp->rms_eps, xs->xn);
    for (int s = 0; s < hc; s++)
        be_copy_rows(be, xs->mtp_cat + (size_t)s * 2 * E, (size_t)hc * 2 * E, st->cur, (size_t)E,
                     n, E);
    be_copy_rows(be, xs->mtp_cat + E, (size_t)2 * E, xs->xn, (size_t)E, n * hc, E);
    /* row t * hc + s of the product is stream s of token t: the wide layout */
    be_matmul(be, &q->mtp_eh_proj, xs->mtp_cat, n * hc, xs->mtp_x);
    /* the trunk-shaped layer */
    hc_read(m, st, be, &X->attn, xs->mtp_x, n, st->cur);
    if (upto == MTP_KV) { /* following: the KV rows are all later positions read of this pass */
        qsa_attention(m, st, be, L, n, pos0, true);
        st->route_fn = route;
        return 0;
    }
    qsa_attention(m, st, be, L, n, pos0, false);
    be_hc_combine(be, xs->mtp_x, st->tmp, xs->inject, n, hc, E);
    hc_read(m, st, be, &X->ffn, xs->mtp_x, n, st->cur);
    const int rc = moe_forward(m, st, be, L, st->cur, n, st->tmp, NULL, NULL, NULL);
    st->route_fn = route;
    if (rc != 0) return -1;
    be_hc_combine(be, xs->mtp_x, st->tmp, xs->inject, n, hc, E);
    hc_read(m, st, be, &q->mtp_head, xs->mtp_x, n, st->cur);
    if (upto == MTP_LOGITS) be_matmul(be, &m->output, st->cur, n, logits); /* host backends only */
    return 0;
}

int mtp_forward(const sluice_model *m, model_state *st, backend *be, const float *h,
                const int32_t *next, int n, int pos0, float *logits) {
    return mtp_block(m, st, be, h, next, n, pos0, logits ? MTP_LOGITS : MTP_KV, logits);
}

static void mtp_seen_add(const sluice_model *m, q4x_state *xs, int32_t id);

int mtp_follow(const sluice_model *m, model_state *st, backend *be, const int32_t *tokens, int n,
               int pos0) {
    q4x_state *xs = q4x_state_of(st);
    const size_t W = (size_t)q4x_of(m)->hc * m->hp.n_embd;
    /* row 0: the trunk residual of position pos0 - 1 (the pass before, cut where it was kept) */
    if (pos0 > 0 && xs->mtp_pend != 0)
        be_copy_rows(be, xs->mtp_h, W, xs->mtp_h + (size_t)xs->mtp_pend * W, W, 1, (int)W);
    be_copy_rows(be, xs->mtp_h + W, W, st->x, W, n, (int)W);
    xs->mtp_pend = n;
    if (pos0 == 0) xs->mtp_n_seen = xs->mtp_seen_next = 0; /* a new sequence */
    for (int i = 0; i < n; i++) mtp_seen_add(m, xs, tokens[i]);
    /* positions pos0 - 1 .. pos0 + n - 2, each with its next token */
    if (pos0 > 0) return mtp_forward(m, st, be, xs->mtp_h, tokens, n, pos0 - 1, NULL);
    return n > 1 ? mtp_forward(m, st, be, xs->mtp_h + W, tokens + 1, n - 1, 0, NULL) : 0;
}

/* ---- the drafts' head ---------------------------------------------------------------------
 * A draft needs the argmax of the block's logits only, and a wrong one costs a rejected draft,
 * never a wrong token (the verification decides). The shared output head is a draft's largest
 * read (at the 8-layer preset 521 MB of Q6_K, ~9.6 ms of a ~12 ms draft on two cores), so a
 * draft reads less of it in two ways:
 *
 * - Its vocabulary: the first mtp_vocab ids (SLUICE_MTP_VOCAB_DEFAULT, 32,768, of the preset's
 *   248,320) and the context's most recent distinct ids past them (Q4X_MTP_SEEN, kept by
 *   mtp_follow and mtp_draft). Byte-level BPE vocabularies number their tokens in merge order,
 *   so the first ids are the most frequent ones; the context's ids cover the tokens a text
 *   repeats. Draft heads over a ~32K frequent-token vocabulary are the practice of EAGLE-3 and
 *   FR-Spec; what it costs in acceptance on real weights is unmeasured here (docs/mtp.md).
 * - A 2-bit copy of those first rows (Q2_0 without the scale search, made once after the plan,
 *   in the plan's fixed scratch) scores them; the MTP_SHORTLIST best and the context's ids are
 *   then computed exactly (the head's own rows through the same kernel, so the same bits as the
 *   full product's) and the draft is their argmax, ties to the lower id as sluice_argmax. The
 *   draft equals the exact argmax over the vocabulary whenever that is in the shortlist
 *   (test_qwen4exp_mtp compares them). The copy is made only where it pays: a head of more
 *   than 3 bits a value whose rows are whole Q2_0 blocks; otherwise the first ids are scored
 *   exactly.
 * SLUICE_MTP_DRAFT_HEAD=full: no copy (measurement). */
/* The drafts' vocabulary: the first ids a draft scores. */
static int64_t draft_vocab(const sluice_model *m) {
    const int64_t V = m->output.ne[1], want = m->params.mtp_vocab;
    const int64_t n = want == 0 ? SLUICE_MTP_VOCAB_DEFAULT : want < 0 ? V : want;
    return n < V ? n : V;
}

static bool draft_head_wanted(const sluice_model *m) {
    const tview *o = &m->output;
    const char *e = getenv("SLUICE_MTP_DRAFT_HEAD");
    if (e && !strcmp(e, "full")) return false;
    if (!q4x_of(m)->mtp || !o->data || o->ne[0] % 64 != 0 || draft_vocab(m) <= MTP_SHORTLIST) return false;
    const quant_traits *qt = quant_traits_of(o->type);
    return qt && qt->dequantize && 8.0 * (double)o->row_bytes / (double)o->ne[0] > 3.0;
}

uint64_t mtp_draft_head_bytes(const sluice_model *m) {
    if (!draft_head_wanted(m)) return 0;
    return (uint64_t)draft_vocab(m) * (uint64_t)(m->output.ne[0] / 64) * 18;
}

/* One share of a load-time copy of the head: units [u0, u1) (rows or groups of rows) into dst. */
typedef struct head_job {
    const tview *o;
    uint8_t *dst;
    size_t rb; /* the copy's bytes a row */
    int64_t u0, u1;
    bool ok;
} head_job;

/* Runs fn over `units` units of the head spread over the cores (a whole head is ~2 s of one
 * core at the 8-layer preset); each unit on its own, so the copy does not depend on the split.
 * false: a share ran out of memory. */
static bool head_copy(void *(*fn)(void *), const tview *o, uint8_t *dst, size_t rb, int64_t units) {
    enum { MAX_THREADS = 16 };
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const int nth = cores < 1 ? 1 : cores > MAX_THREADS ? MAX_THREADS : (int)cores;
    head_job jobs[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    bool started[MAX_THREADS] = {false}, ok = true;
    for (int t = 0; t < nth; t++) {
        jobs[t] = (head_job){.o = o, .dst = dst, .rb = rb, .u0 = units * t / nth, .u1 = units * (t + 1) / nth};
        started[t] = t > 0 && pthread_create(&th[t], NULL, fn, &jobs[t]) == 0;
    }
    for (int t = 0; t < nth; t++)
        if (!started[t]) fn(&jobs[t]); /* the caller's share, and any not started */
    for (int t = 0; t < nth; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        ok = ok && jobs[t].ok;
    }
    return ok;
}

/* Rows [u0, u1) of the head: dequantized, then Q2_0 without the scale search. Every row on its
 * own: the copy does not depend on how the rows are split. */
static void *draft_head_rows(void *arg) {
    head_job *j = arg;
    const int64_t E = j->o->ne[0];
    float *row = malloc((size_t)E * sizeof(float));
    if (!(j->ok = row != NULL)) return NULL;
    const quant_dequantize_fn deq = quant_traits_of(j->o->type)->dequantize;
    for (int64_t r = j->u0; r < j->u1; r++) {
        deq((const uint8_t *)j->o->data + (size_t)r * j->o->row_bytes, row, E);
        quant_quantize_q2_0_fast(row, j->dst + (size_t)r * j->rb, E);
    }
    free(row);
    return NULL;
}

bool mtp_draft_head_bind(sluice_model *m, char *err, size_t n) {
    q4x_model *q = q4x_of(m);
    const tview *o = &m->output;
    const uint64_t bytes = mtp_draft_head_bytes(m);
    if (!bytes || q->mtp_draft_head.data) return true;
    const int64_t E = o->ne[0], V = draft_vocab(m);
    const size_t rb = (size_t)(E / 64) * 18;
    uint8_t *d = malloc((size_t)bytes);
    if (!d) {
        snprintf(err, n, "out of memory for the MTP draft head (%.1f MiB)", (double)bytes / 1048576.0);
        return false;
    }
    const bool ok = head_copy(draft_head_rows, o, d, rb, V);
    if (!ok) {
        free(d);
        snprintf(err, n, "out of memory making the MTP draft head");
        return false;
    }
    q->mtp_draft_head = (tview){.type = GGML_TYPE_Q2_0, .ne = {E, V, 1, 1}, .row_bytes = rb,
                                .mat_bytes = rb * (size_t)V, .data = d, .name = "mtp draft head"};
    return true;
}

void mtp_draft_head_free(sluice_model *m) {
    q4x_model *q = q4x_of(m);
    if (!q) return;
    free((void *)q->mtp_draft_head.data);
    q->mtp_draft_head.data = NULL;
    free((void *)q->mtp_verify_head.data);
    q->mtp_verify_head.data = NULL;
}

/* ---- the verification head -----------------------------------------------------------------
 * A verification pass multiplies the output head by its 2-4 tokens. Stored row by row, a Q6_K
 * head's few-token product is compute-bound (kernels_avx512_krows.c: ~25% of a drafted step on
 * the 8-layer preset, at twice the one-token time); its rows interleaved by sixteen
 * (formats/quant_q6k_r16.c) are multiplied with each row in a lane of its own, at the memory's
 * speed. Same bits (the tile computes quant_dot_q6_k's sums). A second copy of the head (521 MB
 * at the 8-layer preset), so only on a resident plan whose headroom (budget - total - reserve)
 * holds it; streamed plans give the memory to the expert cache. SLUICE_MTP_VERIFY_HEAD=off:
 * none (measurement). Products of 2 to MTP_VERIFY_MAX rows read it; one row (plain decoding)
 * reads the output head, as without MTP. */
#define MTP_VERIFY_MAX 8

static bool verify_head_wanted(const sluice_model *m) {
    const tview *o = &m->output;
    const char *e = getenv("SLUICE_MTP_VERIFY_HEAD");
    if (e && !strcmp(e, "off")) return false;
    if (!q4x_of(m)->mtp || !o->data || o->type != GGML_TYPE_Q6_K || o->ne[0] % 256 != 0 ||
        o->ne[1] % QUANT_R16_ROWS != 0 || m->plan.mode != SLUICE_MODE_RESIDENT || m->plan.gpu ||
        !backend_cpu_tile_vectorized(SLUICE_TYPE_Q6_K_R16))
        return false;
    const uint64_t bytes = (uint64_t)o->row_bytes * (uint64_t)o->ne[1];
    return m->plan.budget > m->plan.total + m->plan.reserve + bytes;
}

static void *verify_head_groups(void *arg) {
    head_job *j = arg;
    const size_t rb = j->o->row_bytes, gb = rb * QUANT_R16_ROWS;
    for (int64_t g = j->u0; g < j->u1; g++)
        quant_repack_q6_k_r16((const uint8_t *)j->o->data + (size_t)g * gb, rb, j->dst + (size_t)g * gb, j->o->ne[0]);
    j->ok = true;
    return NULL;
}

bool mtp_verify_head_bind(sluice_model *m, char *err, size_t n) {
    q4x_model *q = q4x_of(m);
    const tview *o = &m->output;
    if (q->mtp_verify_head.data || !verify_head_wanted(m)) return true;
    const size_t bytes = o->row_bytes * (size_t)o->ne[1];
    /* in 2 MiB pages where the kernel gives them (transparent huge pages, madvise mode): in 4
     * KiB pages the copy's drafted steps stalled for 100-300 ms every few steps on the test VM
     * (TPOT p95 80-263 ms against 30-39 in huge pages, same runs alternating;
     * bench/results/2026-12-02-mtp-vocab.md) */
    const size_t huge = (size_t)2 << 20, span = (bytes + huge - 1) / huge * huge;
    void *p = NULL;
    uint8_t *d = posix_memalign(&p, huge, span) == 0 ? p : NULL;
    if (d) (void)madvise(d, span, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
    if (!d) {
        snprintf(err, n, "out of memory for the MTP verification head (%.1f MiB)", (double)bytes / 1048576.0);
        return false;
    }
    head_copy(verify_head_groups, o, d, o->row_bytes, o->ne[1] / QUANT_R16_ROWS);
    q->mtp_verify_head = *o;
    q->mtp_verify_head.type = SLUICE_TYPE_Q6_K_R16;
    q->mtp_verify_head.data = d;
    q->mtp_verify_head.name = "mtp verification head";
    return true;
}

const tview *mtp_head_for(const sluice_model *m, int n) {
    const q4x_model *q = q4x_of(m);
    return q->mtp_verify_head.data && n >= 2 && n <= MTP_VERIFY_MAX ? &q->mtp_verify_head : &m->output;
}

/* Note a context token for the drafts: ids past the vocabulary, most recent distinct first out
 * of a ring (the order never matters: candidates are sorted by id). */
static void mtp_seen_add(const sluice_model *m, q4x_state *xs, int32_t id) {
    if (id < draft_vocab(m) || id >= m->hp.n_vocab) return;
    for (int i = 0; i < xs->mtp_n_seen; i++)
        if (xs->mtp_seen[i] == id) return;
    xs->mtp_seen[xs->mtp_seen_next] = id;
    xs->mtp_seen_next = (xs->mtp_seen_next + 1) % Q4X_MTP_SEEN;
    if (xs->mtp_n_seen < Q4X_MTP_SEEN) xs->mtp_n_seen++;
}

/* The k best of the n scores at s (NaN never enters): their ids into id, k returned. */
static int top_scores(const float *s, int64_t n, int kmax, int32_t *id) {
    float sc[MTP_SHORTLIST];
    int k = 0, lo = 0;
    for (int64_t v = 0; v < n; v++) {
        if (k < kmax) {
            if (!(s[v] == s[v])) continue;
            id[k] = (int32_t)v;
            sc[k++] = s[v];
            if (k == kmax)
                for (int i = 1; i < k; i++) lo = sc[i] < sc[lo] ? i : lo;
        } else if (s[v] > sc[lo]) {
            id[lo] = (int32_t)v;
            sc[lo] = s[v];
            for (int i = 0; i < k; i++) lo = sc[i] < sc[lo] ? i : lo;
        }
    }
    return k;
}

/* The draft token from the head input x (host [n_embd]). */
static int32_t mtp_draft_argmax(const sluice_model *m, model_state *st, backend *be, const float *x) {
    const q4x_model *q = q4x_of(m);
    q4x_state *xs = q4x_state_of(st);
    const tview *o = &m->output;
    const int64_t N = draft_vocab(m);
    int32_t id[MTP_CANDIDATES];
    float sc[MTP_CANDIDATES];
    int k;
    if (q->mtp_draft_head.data) { /* approximate scores of the vocabulary, the best kept */
        be_matmul(be, &q->mtp_draft_head, x, 1, xs->mtp_logits);
        k = top_scores(xs->mtp_logits, N, MTP_SHORTLIST, id);
    } else { /* exact scores of the vocabulary: its best is a candidate (scored again below) */
        const tview first = {.type = o->type, .ne = {o->ne[0], N, 1, 1}, .row_bytes = o->row_bytes,
                             .mat_bytes = o->row_bytes * (size_t)N, .data = o->data, .name = o->name};
        be_matmul(be, &first, x, 1, xs->mtp_logits);
        k = 0;
        if (N > 0) id[k++] = sluice_argmax(xs->mtp_logits, (int)N);
    }
    for (int i = 0; i < xs->mtp_n_seen; i++) id[k++] = xs->mtp_seen[i]; /* all >= N: distinct */
    if (k == 0) return 0;
    /* in id order (the tie rule), their exact rows side by side, one product */
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && id[j - 1] > id[j]; j--) {
            const int32_t t = id[j];
            id[j] = id[j - 1];
            id[j - 1] = t;
        }
    for (int i = 0; i < k; i++)
        memcpy(xs->mtp_rows + (size_t)i * o->row_bytes, (const uint8_t *)o->data + (size_t)id[i] * o->row_bytes,
               o->row_bytes);
    const tview rows = {.type = o->type, .ne = {o->ne[0], k, 1, 1}, .row_bytes = o->row_bytes,
                        .mat_bytes = o->row_bytes * (size_t)k, .data = xs->mtp_rows, .name = o->name};
    be_matmul(be, &rows, x, 1, sc);
    int best = 0;
    for (int i = 1; i < k; i++)
        if (sc[i] > sc[best]) best = i;
    return id[best];
}

int mtp_draft(const sluice_model *m, model_state *st, backend *be, int32_t next, int pos,
              int n_draft, int32_t *drafts) {
    const q4x_model *q = q4x_of(m);
    q4x_state *xs = q4x_state_of(st);
    if (!q->mtp || !xs->mtp_h) {
        sluice_set_error("the model was loaded without its MTP block");
        return -1;
    }
    if (!be->host_memory) {
        sluice_set_error("MTP drafting runs on the CPU backend only");
        return -1;
    }
    if (pos < 1 || n_draft < 0 || pos - 1 + n_draft > st->n_ctx) {
        sluice_set_error("mtp: cannot draft %d tokens at position %d", n_draft, pos);
        return -1;
    }
    const size_t W = (size_t)q->hc * m->hp.n_embd;
    const float *h = xs->mtp_h + (size_t)xs->mtp_pend * W; /* the trunk at pos - 1 */
    int32_t tok = next;
    mtp_seen_add(m, xs, next);
    for (int j = 0; j < n_draft; j++) {
        if (mtp_block(m, st, be, h, &tok, 1, pos - 1 + j, MTP_HEAD_INPUT, NULL) != 0) return -1;
        drafts[j] = tok = mtp_draft_argmax(m, st, be, st->cur);
        if (j + 1 < n_draft) { /* the block's own residual is the next draft's hidden */
            be_copy_rows(be, xs->mtp_chain, W, xs->mtp_x, W, 1, (int)W);
            h = xs->mtp_chain;
        }
    }
    return 0;
}

/* ---- checkpoints -------------------------------------------------------------------------- */

int mtp_spec_begin(const sluice_model *m, model_state *st, const int32_t *tokens, int n) {
    q4x_state *xs = q4x_state_of(st);
    struct hybrid_state *H = st->hybrid;
    (void)m;
    if (!xs->ck_tokens || n < 1 || n > xs->ck_cap) {
        sluice_set_error("spec: a verification pass of %d tokens exceeds the %d checkpoints", n,
                         xs->ck_cap);
        return -1;
    }
    H->ck_n = xs->ck_n = n;
    memcpy(xs->ck_tokens, tokens, (size_t)n * sizeof *tokens);
    memcpy(xs->ck_prev, xs->prev, sizeof xs->prev);
    xs->ck_n_prev = xs->n_prev;
    return 0;
}

int mtp_spec_keep(const sluice_model *m, model_state *st, int keep) {
    const q4x_model *q = q4x_of(m);
    q4x_state *xs = q4x_state_of(st);
    struct hybrid_state *H = st->hybrid;
    backend *be = st->be;
    const int n = xs->ck_n;
    H->ck_n = xs->ck_n = 0;
    if (n < 1 || keep < 1 || keep > n) {
        sluice_set_error("spec: keep %d of a pass of %d tokens", keep, n);
        return -1;
    }
    if (keep == n) return 0; /* the state is already after the last token */
    const size_t t = (size_t)keep - 1;
    const size_t conv = (size_t)H->n_rec * H->conv_len, ssm = (size_t)H->n_rec * H->ssm_len;
    if (conv) be_copy_rows(be, H->conv, conv, H->ck_conv + t * conv, conv, 1, (int)conv);
    if (ssm) be_copy_rows(be, H->ssm, ssm, H->ck_ssm + t * ssm, ssm, 1, (int)ssm);
    if (xs->ple_hist)
        be_copy_rows(be, xs->ple_hist, xs->ple_hist_len, xs->ck_ple + t * xs->ple_hist_len,
                     xs->ple_hist_len, 1, (int)xs->ple_hist_len);
    memcpy(xs->prev, xs->ck_prev, sizeof xs->prev);
    xs->n_prev = xs->ck_n_prev;
    if (q->ple_layer >= 0) ngram_advance(q, xs, xs->ck_tokens, keep);
    xs->mtp_pend = keep; /* mtp_h row of the last kept position */
    return 0;
}
