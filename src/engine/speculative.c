/* Speculative decoding with the model's own MTP block as the drafter (greedy).
 *
 * One step, with g = argmax of the session's logits at position pos (g not yet evaluated):
 *   1. the MTP block drafts d1..dN after g (models/qwen4exp_mtp.c: mtp_draft);
 *   2. the trunk evaluates [g, d1..dN] in one pass with the logits of every row, keeping the
 *      recurrent state after every token (spec_begin);
 *   3. k = the drafts that equal the argmax of the row before them; g, d1..dk are kept: the
 *      position becomes pos + k + 1, the recurrent state returns to its checkpoint after dk
 *      (spec_keep), attention caches past it are simply never read.
 * The engine is bit-identical across batch sizes (docs/ARCHITECTURE.md, Determinism), so the
 * kept rows are the logits plain decoding computes one token at a time, and the tokens follow.
 * The MTP block's own KV cache follows the trunk inside every pass (mtp_follow).
 *
 * Whether a step drafts at all is the adaptive policy's choice (spec_policy_drafts): drafting
 * pays only when accepted tokens outweigh the drafts' passes and the wider verification pass
 * (on a streamed model that pass reads the experts of every drafted token). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/error.h"
#include "engine/session_internal.h"
#include "models/model.h"

int sluice_model_mtp_blocks(const sluice_model *m) {
    return m->arch->mtp_blocks ? m->arch->mtp_blocks(m) : 0;
}

void sluice_session_set_draft_hook(sluice_session *s, sluice_draft_fn fn, void *ctx) {
    session_spec *sp = session_spec_of(s);
    sp->hook = fn;
    sp->hook_ctx = ctx;
}

void sluice_session_set_spec_policy(sluice_session *s, sluice_spec_policy policy) {
    session_spec_of(s)->always = policy == SLUICE_SPEC_ALWAYS;
}

/* ---- the adaptive policy -------------------------------------------------------------------
 * Measured, not modelled: tokens per second of drafted steps against plain ones. Each kind
 * keeps its last SPEC_WINDOW steps; its rate is the mean tokens of a step over the median
 * step time. The median, because the host's interference only ever adds time and comes in
 * bursts: on the shared two-core VM a drafted step took 74 ms and, inside a burst, 2-3 times
 * that, so an exponential average of rates (the policy until 2026-12-02) sent runs whose drafts
 * paid 1.3-1.4x into pauses of 8-56 plain steps (bench/results/2026-12-02-mtp-vocab.md); a
 * burst shorter than half the window leaves the median where it was, while a lasting change
 * (drafts that stop hitting, a streamed model's misses) moves it within half a window. The
 * host's stalls came as pairs of slow steps about every 0.5 s (a slow step, then a half-slow
 * one: step-timelines.txt there), so a judgement takes SPEC_JUDGE = 5 drafted steps, whose
 * median a pair cannot move.
 *
 * Drafting is judged once SPEC_JUDGE drafted steps are measured: the steps draft until then
 * (after the session's opening shadow steps, below, which also measure the plain cost; where
 * no plain step has been measured, one is taken), then a step drafts while the drafted rate is
 * at least the plain one. Otherwise a pause of plain steps begins, SPEC_PAUSE_MIN long,
 * doubling up to SPEC_PAUSE_MAX while drafting keeps losing; its end forgets the drafted steps
 * (stale), so the next SPEC_JUDGE steps draft and are judged afresh. A session's first drafted
 * step is not measured: it pays one-time costs (the first pass of several tokens with every
 * row's logits, the drafts' first touches; 116-159 ms against 74-93 ms for the next ones on the
 * 8-layer qwen4exp file, bench/results/2026-12-02-cpu-q2-0-lanes.md).
 *
 * Drafts that never hit need no clock: a drafted step that accepts nothing gives the one token
 * a plain step gives, for more work. So once SPEC_MISS_JUDGE drafted steps are measured and
 * none gave more than one token, a pause begins at once and the next is four times as long
 * (not twice). On the centred 8-layer qwen4exp file (acceptance 0%: its MTP block is as random
 * as the trunk) the timed rule drafted 21 of 128 steps and lost 9-12% against plain decoding
 * (bench/results/2026-12-03-synth-centred.md).
 *
 * Nor does acceptance need a verification pass: a shadow step is a plain step that also makes
 * one draft (a draft pass, 0.1-0.3 of a plain step on that file, against a drafted step's 1.4-2)
 * and checks it against the token the step then computes. The session opens with
 * SPEC_SHADOW_JUDGE shadow steps, and every pause ends with as many; when none of them hit, the
 * next pause begins at once (four times as long, as for missed drafts), so drafts that never
 * hit cost shadow steps only, never a verification. When one hits, drafting is judged afresh by
 * drafted steps as above, unless the last judgement found a drafted step costing more than
 * n_draft + 1 plain steps: then it cannot pay at any acceptance, and the pause doubles without
 * a judgement until it reaches SPEC_PAUSE_MAX (the cost may have changed by then: a streamed
 * model's cache). On the centred 8-layer file streamed with its cache at the floor, a drafted
 * step of one draft took 81-88 ms against 43 ms for a plain one (it reads two tokens' experts
 * and the MTP layer's), a shadow step 49 ms. */
#define SPEC_JUDGE 5
#define SPEC_MISS_JUDGE 2
#define SPEC_SHADOW_JUDGE 2
#define SPEC_PAUSE_MIN 8
#define SPEC_PAUSE_MAX 128

static void spec_window_add(spec_window *w, int tokens, double seconds) {
    w->sec[w->next] = seconds;
    w->tok[w->next] = tokens;
    w->next = (w->next + 1) % SPEC_WINDOW;
    if (w->n < SPEC_WINDOW) w->n++;
}

/* The median step time (the lower middle of an even count). */
static double spec_window_median(const spec_window *w) {
    double t[SPEC_WINDOW];
    for (int i = 0; i < w->n; i++) {
        double v = w->sec[i];
        int j = i;
        for (; j > 0 && t[j - 1] > v; j--) t[j] = t[j - 1];
        t[j] = v;
    }
    return t[(w->n - 1) / 2];
}

/* Tokens per second: mean tokens over the median time. */
static double spec_window_rate(const spec_window *w) {
    int tokens = 0;
    for (int i = 0; i < w->n; i++) tokens += w->tok[i];
    return (double)tokens / (double)w->n / spec_window_median(w);
}

/* A pause of plain steps, ending in SPEC_SHADOW_JUDGE shadow steps; this step is its first.
 * grow: how much longer the next one is (4 where drafts did not hit, else 2). */
static spec_choice spec_pause(session_spec *sp, int n_draft, int grow) {
    const int len = sp->backoff > 0 ? sp->backoff : SPEC_PAUSE_MIN;
    sp->backoff = grow * len < SPEC_PAUSE_MAX ? grow * len : SPEC_PAUSE_MAX;
    sp->pause = len; /* > SPEC_SHADOW_JUDGE: this first step is plain */
    sp->shadows = sp->shadow_hits = 0;
    return spec_policy_choose(sp, n_draft);
}

spec_choice spec_policy_choose(session_spec *sp, int n_draft) {
    if (sp->always) return SPEC_DRAFT;
    if (!sp->begun) { /* the session opens with its shadow steps */
        sp->begun = true;
        sp->pause = SPEC_SHADOW_JUDGE;
    }
    if (sp->pause > 0) {
        const bool shadow = sp->pause <= SPEC_SHADOW_JUDGE;
        if (--sp->pause == 0) sp->probed = true;
        return shadow ? SPEC_SHADOW : SPEC_PLAIN;
    }
    if (sp->probed) { /* a pause has ended: its shadows decide whether drafting is judged again */
        sp->probed = false;
        const bool none_hit = sp->shadows >= SPEC_SHADOW_JUDGE && sp->shadow_hits == 0;
        sp->shadows = sp->shadow_hits = 0;
        if (none_hit) return spec_pause(sp, n_draft, 4);
        if (sp->cost > n_draft + 1 && sp->backoff < SPEC_PAUSE_MAX) return spec_pause(sp, n_draft, 2);
        sp->drafted.n = sp->drafted.next = 0; /* judged afresh */
        sp->cost = 0.0;
    }
    bool missed = sp->drafted.n >= SPEC_MISS_JUDGE; /* every measured draft missed */
    for (int i = 0; missed && i < sp->drafted.n; i++) missed = sp->drafted.tok[i] <= 1;
    if (!missed) {
        if (sp->drafted.n < SPEC_JUDGE) return SPEC_DRAFT;
        if (sp->plain.n == 0) return SPEC_PLAIN; /* one plain step, for its cost */
        if (spec_window_rate(&sp->drafted) >= spec_window_rate(&sp->plain)) {
            sp->backoff = 0; /* it pays (again) */
            return SPEC_DRAFT;
        }
        sp->cost = spec_window_median(&sp->drafted) / spec_window_median(&sp->plain);
    }
    return spec_pause(sp, n_draft, missed ? 4 : 2);
}

void spec_policy_shadow(session_spec *sp, bool hit) {
    sp->shadows++;
    sp->shadow_hits += hit;
}

void spec_policy_account(session_spec *sp, bool drafted, int tokens, double seconds) {
    if (sp->always || seconds <= 0.0) return;
    if (drafted && !sp->warm) { /* the first drafted step: not measured */
        sp->warm = true;
        return;
    }
    spec_window_add(drafted ? &sp->drafted : &sp->plain, tokens, seconds);
}

/* SLUICE_SPEC_TRACE=1: every step's kind and time on stderr (measurement: what a drafted step
 * costs against a plain one, bench/results/2026-12-04-mtp-accept.md). */
static bool spec_trace(void) {
    static int on = -1;
    if (on < 0) on = getenv("SLUICE_SPEC_TRACE") != NULL;
    return on != 0;
}

static double spec_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int sluice_session_spec_step(sluice_session *s, int n_draft, int max_tokens, int32_t *fed,
                             float *logits, sluice_spec_stats *stats) {
    const sluice_model *m = session_model(s);
    const arch_desc *a = m->arch;
    model_state *st = session_model_state(s);
    backend *be = session_backend(s);
    session_spec *sp = session_spec_of(s);
    const int V = m->hp.n_vocab, pos = sluice_session_pos(s);
    const float *last = sluice_session_logits(s);
    if (sluice_model_mtp_blocks(m) < 1 || !a->mtp_draft || !a->spec_begin || !a->spec_keep) {
        sluice_set_error("spec: the model has no MTP block loaded (load it with mtp > 0)");
        return -1;
    }
    if (!last) {
        sluice_set_error("spec: no logits (evaluate a prompt first)");
        return -1;
    }
    if (max_tokens < 1 || pos >= sluice_session_n_ctx(s) || n_draft < 0) {
        sluice_set_error("spec: nothing to generate (max %d tokens at position %d of %d)",
                         max_tokens, pos, sluice_session_n_ctx(s));
        return -1;
    }
    /* drafts that could be kept: within the budget, the context, one batch, the checkpoints */
    int N = n_draft;
    if (N > max_tokens - 1) N = max_tokens - 1;
    if (N > sluice_session_n_ctx(s) - pos - 1) N = sluice_session_n_ctx(s) - pos - 1;
    if (N > session_batch(s) - 1) N = session_batch(s) - 1;
    if (N > m->params.mtp) N = m->params.mtp;
    if (N < 0) N = 0;
    if (sp->cap < N + 1) {
        float *nl = realloc(sp->logits, (size_t)(N + 1) * (size_t)V * sizeof(float));
        if (!nl) {
            sluice_set_error("out of memory");
            return -1;
        }
        sp->logits = nl;
        sp->cap = N + 1;
    }
    int32_t batch[64 + 1];
    if (N > 64) N = 64;
    batch[0] = sluice_argmax(last, V);
    double t0 = spec_now();
    const spec_choice c = N > 0 ? spec_policy_choose(sp, N) : SPEC_DRAFT;
    if (c != SPEC_DRAFT) { /* a plain step (the MTP block still follows) */
        int32_t shadow = -1;   /* a shadow step's draft of the token after batch[0] */
        const double ts = t0;
        if (c == SPEC_SHADOW) {
            if (a->mtp_draft(m, st, be, batch[0], pos, 1, &shadow) != 0) return -1;
            if (sp->hook) shadow = sp->hook(sp->hook_ctx, pos + 1, shadow);
            t0 = spec_now(); /* the plain cost is the pass's alone */
        }
        if (sluice_session_eval(s, batch, 1, NULL) != 0) return -1;
        spec_policy_account(sp, false, 1, spec_now() - t0);
        const bool hit = c == SPEC_SHADOW && sluice_argmax(sluice_session_logits(s), V) == shadow;
        if (c == SPEC_SHADOW) spec_policy_shadow(sp, hit);
        if (spec_trace() && c == SPEC_SHADOW)
            fprintf(stderr, "spec: shadow step %.2f ms (draft %.2f ms, %s)\n", 1e3 * (spec_now() - ts),
                    1e3 * (t0 - ts), hit ? "hit" : "missed");
        else if (spec_trace())
            fprintf(stderr, "spec: plain step %.2f ms\n", 1e3 * (spec_now() - t0));
        fed[0] = batch[0];
        if (logits) memcpy(logits, sluice_session_logits(s), (size_t)V * sizeof(float));
        if (stats) {
            stats->steps++;
            stats->plain++;
            stats->shadowed += c == SPEC_SHADOW;
            stats->shadow_hits += hit;
        }
        return 1;
    }
    if (N > 0 && a->mtp_draft(m, st, be, batch[0], pos, N, batch + 1) != 0) return -1;
    const double t_d = spec_now();
    if (sp->hook)
        for (int j = 1; j <= N; j++) batch[j] = sp->hook(sp->hook_ctx, pos + j, batch[j]);
    if (a->spec_begin(m, st, batch, N + 1) != 0) return -1;
    if (sluice_session_eval(s, batch, N + 1, sp->logits) != 0) {
        a->spec_keep(m, st, N + 1); /* clears the checkpoints; the session is unusable now */
        return -1;
    }
    int k = 0; /* accepted drafts */
    while (k < N && sluice_argmax(sp->logits + (size_t)k * V, V) == batch[k + 1]) k++;
    if (a->spec_keep(m, st, k + 1) != 0) return -1;
    session_set_position(s, pos + k + 1, sp->logits + (size_t)k * V);
    if (N > 0) spec_policy_account(sp, true, k + 1, spec_now() - t0);
    if (N > 0 && spec_trace())
        fprintf(stderr, "spec: drafted step, %d tokens, %.2f ms (drafts %.2f ms)\n", k + 1, 1e3 * (spec_now() - t0),
                1e3 * (t_d - t0));
    memcpy(fed, batch, (size_t)(k + 1) * sizeof *fed);
    if (logits) memcpy(logits, sp->logits, (size_t)(k + 1) * (size_t)V * sizeof(float));
    if (stats) {
        stats->steps++;
        stats->drafted += (uint64_t)N;
        stats->accepted += (uint64_t)k;
    }
    return k + 1;
}
