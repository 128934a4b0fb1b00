/* Engine-internal access to a session, for the parts of the engine that drive the model
 * directly (speculative decoding, engine/speculative.c). Not part of sluice.h. */
#ifndef SLUICE_SESSION_INTERNAL_H
#define SLUICE_SESSION_INTERNAL_H

#include "models/state.h"

/* The last SPEC_WINDOW steps of one kind: tokens and seconds of each, a ring. */
#define SPEC_WINDOW 8
typedef struct spec_window {
    double sec[SPEC_WINDOW];
    int tok[SPEC_WINDOW];
    int n, next;
} spec_window;

/* Per-session state of speculative decoding. */
typedef struct session_spec {
    float *logits;           /* [cap][n_vocab] of a verification pass */
    int cap;
    sluice_draft_fn hook;    /* sluice_session_set_draft_hook (tests, measurements) */
    void *hook_ctx;
    /* the adaptive policy (engine/speculative.c): the last drafted and plain steps, the plain
     * steps left in the current pause, the length of the next pause, whether a drafted step
     * has run (the first is not measured: it pays one-time costs), whether the session's
     * opening probe was set, whether a pause (or that probe) has just ended, the shadow drafts
     * made since the last judgement and how many of them hit, and the cost of a drafted step
     * in plain steps where the last judgement found drafting losing (else 0) */
    spec_window drafted, plain;
    int pause, backoff;
    bool warm, begun, probed;
    int shadows, shadow_hits;
    double cost;
    bool always; /* SLUICE_SPEC_ALWAYS */
} session_spec;

const sluice_model *session_model(const sluice_session *s);
model_state *session_model_state(sluice_session *s);
backend *session_backend(sluice_session *s);
int session_batch(const sluice_session *s);
session_spec *session_spec_of(sluice_session *s);
/* Move the position (a rollback after a verification pass) and set the last logits (NULL:
 * none). The model's own state must already match (arch spec_keep). */
void session_set_position(sluice_session *s, int pos, const float *logits);

/* The adaptive draft policy (engine/speculative.c), apart for its tests: what this step does
 * (it counts the step against a pause), the account of a step just taken (a shadow step's as
 * plain, its draft's time left out), and whether a shadow step's draft hit. */
typedef enum spec_choice {
    SPEC_PLAIN,  /* one token, no draft */
    SPEC_SHADOW, /* one token, and one draft made beside it and checked against the token that
                  * follows: acceptance measured without a verification pass */
    SPEC_DRAFT   /* drafts, verified in one pass */
} spec_choice;
spec_choice spec_policy_choose(session_spec *sp, int n_draft);
void spec_policy_account(session_spec *sp, bool drafted, int tokens, double seconds);
void spec_policy_shadow(session_spec *sp, bool hit);

#endif
