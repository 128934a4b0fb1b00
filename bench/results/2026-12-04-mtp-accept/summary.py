"""One line from a `sluice bench --json` report on stdin: the last run's decode t/s, evidence
hashes and, with --mtp, its steps (plain, shadow), drafts and acceptance. Used by
vm_mtp_accept.sh and ../2026-12-04-mtp-shadow/ab_shadow.sh."""
import json, sys
d = json.load(sys.stdin)
r = d["runs"][-1]
m = r.get("mtp")
extra = ""
if m:
    acc = 100.0 * m["accepted"] / m["drafted"] if m["drafted"] else 0.0
    extra = " steps %d (plain %d, shadow %d) drafted %d accepted %d (%.1f%%)" % (
        m["steps"], m["plain_steps"], m.get("shadow_steps", 0), m["drafted"], m["accepted"], acc)
print("decode %6.2f t/s tokens %s logits %s%s" % (r["decode_tps"], r["evidence"]["tokens_sha256"][:12],
                                                 r["evidence"]["logits_sha256"][:12], extra))
