/* Engine-internal access to a session, for the parts of the engine that drive the model
 * directly (speculative decoding, engine/speculative.c). Not part of sluice.h. */
#ifndef SLUICE_SESSION_INTERNAL_H
#define SLUICE_SESSION_INTERNAL_H

#include "models/state.h"

/* Test hook: replaces the drafter's proposal for position pos (a test forces high or
 * partial acceptance with it); NULL: the MTP block's own drafts. */
typedef int32_t (*session_draft_fn)(void *ctx, int pos, int32_t proposed);

/* Per-session state of speculative decoding. */
typedef struct session_spec {
    float *logits;           /* [cap][n_vocab] of a verification pass */
    int cap;
    session_draft_fn hook;
    void *hook_ctx;
} session_spec;

const sluice_model *session_model(const sluice_session *s);
model_state *session_model_state(sluice_session *s);
backend *session_backend(sluice_session *s);
int session_batch(const sluice_session *s);
session_spec *session_spec_of(sluice_session *s);
/* Move the position (a rollback after a verification pass) and set the last logits (NULL:
 * none). The model's own state must already match (arch spec_keep). */
void session_set_position(sluice_session *s, int pos, const float *logits);

/* Install the draft hook (tests). */
void sluice_session_set_draft_hook(sluice_session *s, session_draft_fn fn, void *ctx);

#endif
