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
     * steps left in the current pause, the length of the next pause, and whether a drafted step
     * has run (the first is not measured: it pays one-time costs) */
    spec_window drafted, plain;
    int pause, backoff;
    bool warm;
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

/* The adaptive draft policy (engine/speculative.c), apart for its tests: whether this step
 * drafts (it counts the step against a pause), and the account of a step just taken. */
bool spec_policy_drafts(session_spec *sp);
void spec_policy_account(session_spec *sp, bool drafted, int tokens, double seconds);

#endif
