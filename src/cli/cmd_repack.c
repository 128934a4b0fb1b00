/* sluice repack / sluice verify: write and check the expert-major store. */
#include <stdio.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "formats/store.h"

int cmd_repack(int argc, char **argv) {
    bool quiet = false;
    const cli_opt opts[] = {
        {"--quiet", "-q", OPT_FLAG, &quiet, NULL, "no progress output"},
    };
    const cli_cmd cmd = {"repack", "IN.gguf OUT.gguf",
                         "Rewrite a GGUF as an expert-major store: one 4 KiB-aligned record per "
                         "(layer, expert) holding gate|up|down, so one direct read fetches an "
                         "expert. Every other tensor and all metadata stay as they are; the "
                         "result is a valid GGUF. Deterministic: the same input gives the same "
                         "bytes. OUT appears only when complete.",
                         "The manifest (record geometry and per-record CRC-32) is hashed with "
                         "SHA-256 and checked at every load; the payload hash is checked by "
                         "`sluice verify`. Format: docs/store.md.",
                         opts, (int)(sizeof opts / sizeof opts[0]), 2};
    const char *pos[2];
    int n_pos;
    int rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (n_pos != 2) {
        fprintf(stderr, "sluice repack: give IN.gguf and OUT.gguf\n");
        return 2;
    }
    char err[512];
    cli_progress_state ps = {.label = "repack"};
    double t0 = cli_now();
    if (store_repack(pos[0], pos[1], quiet ? NULL : cli_progress, &ps, err, sizeof err) != 0) {
        cli_progress_end(&ps);
        fprintf(stderr, "sluice repack: %s\n", err);
        return 1;
    }
    cli_progress_end(&ps);
    fprintf(stderr, "sluice repack: wrote %s in %.1f s\n", pos[1], cli_now() - t0);
    return 0;
}

int cmd_verify(int argc, char **argv) {
    bool quiet = false;
    const cli_opt opts[] = {
        {"--quiet", "-q", OPT_FLAG, &quiet, NULL, "no progress output"},
    };
    const cli_cmd cmd = {"verify", "FILE",
                         "Check a model file: the GGUF structure; for an expert-major store also "
                         "the manifest hash, every record's CRC-32 and the payload SHA-256. Exit "
                         "0 when all hold, 1 with the first problem otherwise.",
                         NULL, opts, (int)(sizeof opts / sizeof opts[0]), 1};
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (n_pos != 1) {
        fprintf(stderr, "sluice verify: give a file\n");
        return 2;
    }
    char err[512];
    store_verify_report rep;
    cli_progress_state ps = {.label = "verify"};
    rc = store_verify(pos[0], &rep, quiet ? NULL : cli_progress, &ps, err, sizeof err);
    cli_progress_end(&ps);
    if (rc != 0) {
        fprintf(stderr, "sluice verify: %s\n", err);
        return 1;
    }
    if (rep.packed)
        printf("%s: expert-major store OK: %llu records, manifest sha256 %s, payload sha256 %s\n",
               pos[0], (unsigned long long)rep.records, rep.manifest_sha256, rep.payload_sha256);
    else
        printf("%s: plain GGUF, structure OK (no expert store to check)\n", pos[0]);
    return 0;
}
