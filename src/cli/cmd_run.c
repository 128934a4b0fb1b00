/* sluice run: evaluate a prompt, then stream sampled tokens to stdout; speeds go to stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/plan_opts.h"
#include "tools/trace.h"

#define DEFAULT_PROMPT "In the beginning"
#define SEED_RANDOM UINT64_MAX

int cmd_run(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *file = NULL;
    int n_predict = 256, n_threads = 0, n_ctx = 0, n_batch = 0, mtp = 0;
    int mtp_vocab = SLUICE_MTP_VOCAB_DEFAULT;
    bool no_special = false, ignore_eos = false, echo = false, verbose = false, mtp_always = false;
    sluice_sampler_params sp = sluice_sampler_defaults();
    uint64_t seed = SEED_RANDOM;
    cli_plan_opts po = {0};
    const char *trace_path = NULL; /* --trace-routing */
    trace_writer *tw = NULL;
    const cli_opt base_opts[] = {
        {"--model", "-m", OPT_STR, &model, "FILE", "GGUF model (default: the embedded sluice-moe-tiny)"},
        {"--prompt", "-p", OPT_STR, &prompt, "TEXT", "prompt text (default model: \"" DEFAULT_PROMPT "\")"},
        {"--file", "-f", OPT_STR, &file, "FILE", "read the prompt from a file"},
        {"--n-predict", "-n", OPT_INT, &n_predict, "N", "tokens to generate (default 256)"},
        {"--threads", "-t", OPT_INT, &n_threads, "N", "CPU threads (default: all cores)"},
        {"--ctx-size", "-c", OPT_INT, &n_ctx, "N", "context positions (default: prompt + N, tight)"},
        {"--batch-size", "-b", OPT_INT, &n_batch, "N", "prompt tokens per forward pass (default: 2048 when the model is resident on the CPU and memory allows, else 512)"},
        {"--temp", NULL, OPT_FLOAT, &sp.temperature, "T", "temperature; 0 = greedy (default 0.8)"},
        {"--top-k", NULL, OPT_INT, &sp.top_k, "K", "keep the K most likely tokens; 0 = off (default 40)"},
        {"--top-p", NULL, OPT_FLOAT, &sp.top_p, "P", "nucleus sampling; 1 = off (default 0.95)"},
        {"--min-p", NULL, OPT_FLOAT, &sp.min_p, "P", "drop tokens below P x the top probability; 0 = off (default 0.05)"},
        {"--repeat-penalty", NULL, OPT_FLOAT, &sp.repeat_penalty, "X", "penalize recent tokens; 1 = off (default 1.0)"},
        {"--repeat-last-n", NULL, OPT_INT, &sp.repeat_last_n, "N", "tokens of history for the penalty (default 64)"},
        {"--seed", "-s", OPT_U64, &seed, "S", "random seed (default: random, printed)"},
        {"--ignore-eos", NULL, OPT_FLAG, &ignore_eos, NULL, "keep generating past end-of-generation tokens"},
        {"--no-parse-special", NULL, OPT_FLAG, &no_special, NULL, "treat special-token text in the prompt as plain text"},
        {"--echo", NULL, OPT_FLAG, &echo, NULL, "print the prompt before the generated text"},
        {"--verbose", "-v", OPT_FLAG, &verbose, NULL, "print model and session details to stderr"},
        {"--trace-routing", NULL, OPT_STR, &trace_path, "FILE", "write the experts chosen at every MoE call (docs/trace-format.md)"},
        {"--mtp", NULL, OPT_INT, &mtp, "N", "speculative decoding with the model's MTP block, up to N drafts per step, drafting only while it measures faster than plain steps (qwen4exp with an MTP block; greedy: needs --temp 0; default 0: off)"},
        {"--mtp-always", NULL, OPT_FLAG, &mtp_always, NULL, "with --mtp: draft N every step, even when it is slower"},
        {"--mtp-vocab", NULL, OPT_INT, &mtp_vocab, "N", "with --mtp: a draft chooses among the first N token ids and the context's recent ids (default 32768; 0: every id); the tokens never depend on it"},
    };
    cli_opt opts[64];
    int n_opts = (int)(sizeof base_opts / sizeof base_opts[0]);
    memcpy(opts, base_opts, sizeof base_opts);
    n_opts = cli_add_plan_opts(opts, n_opts, 64, &po);
    const cli_cmd cmd = {"run", "[-m MODEL] [-p PROMPT | -f FILE] [-n N] [options]",
                         "Generate text. The generated text streams to stdout; prompt and "
                         "generation speed (tokens/s) go to stderr.",
                         "Without -m, sluice runs its embedded default model (sluice-moe-tiny, "
                         "a 12.7M-parameter qwen3moe trained on the King James Bible) on \""
                         DEFAULT_PROMPT "\".",
                         opts, n_opts, 0};
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (n_predict < 0 || n_threads < 0 || n_ctx < 0 || n_batch < 0 || sp.repeat_last_n < 0) {
        fprintf(stderr, "sluice run: -n, -t, -c, -b and --repeat-last-n must not be negative\n");
        return 2;
    }
    if (!model && !prompt && !file) {
        prompt = DEFAULT_PROMPT;
        echo = true;
    }
    if (seed == SEED_RANDOM) seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    sp.seed = seed;
    if (mtp < 0 || mtp > 64 || (mtp > 0 && (sp.temperature > 0.0f || sp.repeat_penalty != 1.0f))) {
        fprintf(stderr, "sluice run: --mtp takes 0..64 drafts and greedy decoding (--temp 0, "
                        "no --repeat-penalty)\n");
        return 2;
    }
    if (mtp_always && mtp == 0) {
        fprintf(stderr, "sluice run: --mtp-always needs --mtp N\n");
        return 2;
    }

    if (mtp_vocab < 0) {
        fprintf(stderr, "sluice run: --mtp-vocab takes 0 (every id) or a number of ids\n");
        return 2;
    }
    sluice_model_params mp = {.n_ctx = n_ctx, .n_batch = n_batch, .mtp = mtp,
                              .mtp_vocab = mtp_vocab == 0 ? -1 : mtp_vocab};
    if (!cli_plan_params("run", &po, &mp)) return 2;
    if (po.plan) return cli_print_plan("run", model, &mp, po.json);
    sluice_model *m = cli_load_model_params("run", model, &mp);
    if (!m) return 1;
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    size_t len = 0;
    char *text = cli_prompt_text("run", prompt, file, &len);
    int n_prompt = 0;
    int32_t *ids = text ? cli_tokenize("run", m, text, len, !no_special, &n_prompt) : NULL;
    rc = 1;
    sluice_session *s = NULL;
    if (!ids) goto done;
    if (n_prompt == 0) {
        if (info.bos < 0) {
            fprintf(stderr, "sluice run: empty prompt and the model has no BOS token to start from\n");
            goto done;
        }
        ids[0] = info.bos;
        n_prompt = 1;
    }
    if (n_ctx == 0) {
        long want = (long)n_prompt + n_predict;
        n_ctx = want < info.n_ctx_train ? (int)want : info.n_ctx_train;
    }
    if (n_prompt > n_ctx) {
        fprintf(stderr, "sluice run: the prompt has %d tokens but the context holds %d\n",
                n_prompt, n_ctx);
        goto done;
    }
    sluice_session_params spar = {.n_ctx = n_ctx, .n_batch = n_batch, .n_threads = n_threads};
    s = sluice_session_new(m, &spar);
    if (!s) {
        fprintf(stderr, "sluice run: %s\n", sluice_last_error());
        goto done;
    }
    sluice_session_set_sampler(s, &sp);
    sluice_session_set_spec_policy(s, mtp_always ? SLUICE_SPEC_ALWAYS : SLUICE_SPEC_ADAPTIVE);
    if (trace_path) {
        char terr[512];
        if (!(tw = trace_writer_for_model(trace_path, m, terr, sizeof terr))) {
            fprintf(stderr, "sluice run: %s\n", terr);
            goto done;
        }
        sluice_session_set_route_callback(s, trace_writer_route, tw);
    }
    if (verbose) {
        fprintf(stderr, "sluice: %s (%s), %d layers, vocab %d, %.2f M parameters\n", info.name,
                info.arch, info.n_layer, info.n_vocab, (double)info.n_params / 1e6);
        char pb[2048];
        sluice_model_plan(m, false, pb, sizeof pb);
        fputs(pb, stderr);
    }
    uint64_t kv_bytes = 0, rec_bytes = 0;
    sluice_session_state_breakdown(s, &kv_bytes, &rec_bytes);
    fprintf(stderr,
            "sluice: context %d positions, state %.2f MiB (KV %.2f MiB, recurrent %.2f MiB), "
            "seed %llu\n",
            n_ctx, (double)sluice_session_state_bytes(s) / (1024.0 * 1024.0),
            (double)kv_bytes / (1024.0 * 1024.0), (double)rec_bytes / (1024.0 * 1024.0),
            (unsigned long long)seed);
    if (echo) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    for (int i = 0; i < n_prompt; i++) sluice_session_accept(s, ids[i]);
    double t0 = cli_now();
    if (sluice_session_eval(s, ids, n_prompt, NULL) != 0) {
        fprintf(stderr, "\nsluice run: %s\n", sluice_last_error());
        goto done;
    }
    double t_prompt = cli_now() - t0;
    int n_gen = 0;
    double t1 = cli_now();
    char piece[256];
    sluice_spec_stats ss = {0};
    bool stop = false;
    while (mtp > 0 && n_gen < n_predict && !stop) { /* speculative steps: the same tokens */
        int32_t fed[65];
        int k = sluice_session_spec_step(s, mtp, n_predict - n_gen, fed, NULL, &ss);
        if (k < 1) {
            fprintf(stderr, "\nsluice run: %s\n", sluice_last_error());
            goto done;
        }
        for (int j = 0; j < k && !stop; j++) {
            if (!ignore_eos && sluice_token_is_eog(m, fed[j])) {
                stop = true;
                break;
            }
            int np = sluice_token_to_piece(m, fed[j], false, piece, sizeof piece);
            fwrite(piece, 1, (size_t)(np < (int)sizeof piece ? np : (int)sizeof piece), stdout);
            n_gen++;
        }
        fflush(stdout);
        if (!stop && n_gen < n_predict && sluice_session_pos(s) >= sluice_session_n_ctx(s)) {
            fprintf(stderr, "\nsluice run: context full after %d tokens\n", n_gen);
            break;
        }
    }
    while (mtp <= 0 && n_gen < n_predict) {
        int32_t tok = sluice_session_sample(s);
        if (tok < 0) {
            fprintf(stderr, "\nsluice run: %s\n", sluice_last_error());
            goto done;
        }
        if (!ignore_eos && sluice_token_is_eog(m, tok)) break;
        int k = sluice_token_to_piece(m, tok, false, piece, sizeof piece);
        fwrite(piece, 1, (size_t)(k < (int)sizeof piece ? k : (int)sizeof piece), stdout);
        fflush(stdout);
        n_gen++;
        if (sluice_session_pos(s) >= sluice_session_n_ctx(s)) {
            fprintf(stderr, "\nsluice run: context full after %d tokens\n", n_gen);
            break;
        }
        if (n_gen < n_predict && sluice_session_eval(s, &tok, 1, NULL) != 0) {
            fprintf(stderr, "\nsluice run: %s\n", sluice_last_error());
            goto done;
        }
    }
    double t_gen = cli_now() - t1;
    fputc('\n', stdout);
    fflush(stdout);
    fprintf(stderr,
            "sluice: prompt %d tokens, %.2f tokens/s; generation %d tokens, %.2f tokens/s\n",
            n_prompt, t_prompt > 0 ? n_prompt / t_prompt : 0.0, n_gen,
            t_gen > 0 ? n_gen / t_gen : 0.0);
    if (mtp > 0)
        fprintf(stderr, "sluice: MTP %d drafts/step (%s): %llu steps (%llu plain, %llu shadow), %llu of %llu drafts accepted (%.1f%%)\n",
                mtp, mtp_always ? "every step" : "adaptive", (unsigned long long)ss.steps,
                (unsigned long long)ss.plain, (unsigned long long)ss.shadowed, (unsigned long long)ss.accepted,
                (unsigned long long)ss.drafted,
                ss.drafted ? 100.0 * (double)ss.accepted / (double)ss.drafted : 0.0);
    rc = 0;
done:
    sluice_session_free(s);
    if (tw) {
        char terr[512];
        if (trace_writer_close(tw, terr, sizeof terr) != 0) {
            fprintf(stderr, "sluice run: %s\n", terr);
            rc = 1;
        }
    }
    free(ids);
    free(text);
    sluice_model_free(m);
    return rc;
}
