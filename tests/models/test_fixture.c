/* Model fixture test: one model against its llama.cpp reference.
 *
 *   test_fixture NAME MEDIAN_BOUND MAX_BOUND MIN_TOP1 MIN_GREEDY [options]
 *     --model STEM       the model file is STEM.gguf (default NAME.gguf): a reference made with
 *                        a metadata override of another file
 *     --override KV      KEY=TYPE:VALUE metadata override, as llama.cpp's --override-kv
 *     --teacher-forced   MIN_GREEDY counts the continuation steps whose argmax, given the
 *                        reference's previous tokens, is the reference's token (instead of
 *                        the leading tokens of our own greedy continuation)
 *
 * 1. All-position logits of the prompt (one batch) vs NAME.logits.f32: per position the relative
 *    error ||ours - ref|| / ||ref||; the median must be <= MEDIAN_BOUND and the max <= MAX_BOUND;
 *    the fraction of positions whose argmax agrees must be >= MIN_TOP1.
 * 2. Greedy continuation (one token per step) vs NAME.greedy.ids: at least MIN_GREEDY leading
 *    tokens must agree.
 * 3. Determinism: the logits are bit-identical with 1, 2 and 3 threads, with the prompt split
 *    into batches of 7 tokens, and token by token (decode path) for the last position.
 * Prints the measured numbers on one line for the record. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixtures.h"
#include "sluice.h"

static void *read_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    if (buf) buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

static int32_t *read_ids(const char *path, int *n) {
    size_t len;
    char *s = read_file(path, &len);
    if (!s) return NULL;
    int32_t *ids = malloc((len / 2 + 1) * sizeof *ids);
    int k = 0;
    char *p = s, *end;
    for (;;) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        ids[k++] = (int32_t)v;
        p = end;
    }
    free(s);
    *n = k;
    return ids;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Teacher forcing: evaluate prompt + reference continuation in one pass and count the steps
 * whose argmax is the reference's next token. */
static int teacher_forced(sluice_model *m, const int32_t *ids, int n, const int32_t *greedy,
                          int n_greedy, int V) {
    int32_t *all = malloc((size_t)(n + n_greedy) * sizeof *all);
    float *lg = malloc((size_t)(n + n_greedy) * V * sizeof *lg);
    memcpy(all, ids, (size_t)n * sizeof *all);
    memcpy(all + n, greedy, (size_t)n_greedy * sizeof *all);
    sluice_session_params sp = {.n_ctx = n + n_greedy + 1, .n_threads = 2};
    sluice_session *s = sluice_session_new(m, &sp);
    int agree = -1;
    if (s && sluice_session_eval(s, all, n + n_greedy, lg) == 0) {
        agree = 0;
        for (int i = 0; i < n_greedy; i++)
            agree += argmax(lg + (size_t)(n - 1 + i) * V, V) == greedy[i];
    }
    sluice_session_free(s);
    free(lg);
    free(all);
    return agree;
}

static float *eval_logits(sluice_model *m, const int32_t *ids, int n, int threads, int batch) {
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    sluice_session_params sp = {.n_ctx = n + 64, .n_batch = batch, .n_threads = threads};
    sluice_session *s = sluice_session_new(m, &sp);
    if (!s) return NULL;
    float *lg = malloc((size_t)n * info.n_vocab * sizeof *lg);
    if (sluice_session_eval(s, ids, n, lg) != 0) {
        free(lg);
        lg = NULL;
    }
    sluice_session_free(s);
    return lg;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: test_fixture NAME MEDIAN_BOUND MAX_BOUND MIN_TOP1 MIN_GREEDY "
                        "[--model STEM] [--override KEY=TYPE:VALUE]... [--teacher-forced]\n");
        return 2;
    }
    const char *name = argv[1], *stem = argv[1];
    double median_bound = atof(argv[2]), max_bound = atof(argv[3]), min_top1 = atof(argv[4]);
    int min_greedy = atoi(argv[5]);
    const char *overrides[8];
    int n_overrides = 0;
    bool teacher = false;
    for (int i = 6; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) stem = argv[++i];
        else if (strcmp(argv[i], "--override") == 0 && i + 1 < argc && n_overrides < 8)
            overrides[n_overrides++] = argv[++i];
        else if (strcmp(argv[i], "--teacher-forced") == 0) teacher = true;
        else {
            fprintf(stderr, "test_fixture: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    char path[1024], file[256];

    snprintf(file, sizeof file, "%s.gguf", stem);
    if (!fixture_path("models", file, path, sizeof path)) {
        fprintf(stderr, "fixture %s not found\n", file);
        return 1;
    }
    sluice_model_params mparams = {.override_kv = overrides, .n_override_kv = n_overrides};
    sluice_model *m = sluice_model_load(path, &mparams);
    if (!m) {
        fprintf(stderr, "load: %s\n", sluice_last_error());
        return 1;
    }
    sluice_model_info info;
    sluice_model_get_info(m, &info);
    const int V = info.n_vocab;

    int n = 0, n_greedy = 0;
    snprintf(file, sizeof file, "%s.prompt.ids", name);
    CHECK(fixture_path("golden", file, path, sizeof path));
    int32_t *ids = read_ids(path, &n);
    snprintf(file, sizeof file, "%s.greedy.ids", name);
    CHECK(fixture_path("golden", file, path, sizeof path));
    int32_t *greedy = read_ids(path, &n_greedy);
    snprintf(file, sizeof file, "%s.logits.f32", name);
    CHECK(fixture_path("golden", file, path, sizeof path));
    size_t ref_len = 0;
    float *ref = read_file(path, &ref_len);
    if (!ids || !greedy || !ref || ref_len != (size_t)n * V * sizeof(float)) {
        fprintf(stderr, "reference files missing or inconsistent (%zu bytes of logits for %d x %d)\n",
                ref_len, n, V);
        return 1;
    }

    /* 1. all-position logits */
    float *lg = eval_logits(m, ids, n, 2, 0);
    CHECKF(lg != NULL, "eval: %s", sluice_last_error());
    if (!lg) return 1;
    double *rel = malloc((size_t)n * sizeof *rel);
    int top1 = 0;
    for (int t = 0; t < n; t++) {
        double num = 0, den = 0;
        for (int v = 0; v < V; v++) {
            double d = (double)lg[(size_t)t * V + v] - ref[(size_t)t * V + v];
            num += d * d;
            den += (double)ref[(size_t)t * V + v] * ref[(size_t)t * V + v];
        }
        rel[t] = sqrt(num / (den > 0 ? den : 1));
        top1 += argmax(lg + (size_t)t * V, V) == argmax(ref + (size_t)t * V, V);
    }
    double *sorted = malloc((size_t)n * sizeof *sorted);
    memcpy(sorted, rel, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_double);
    double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    double worst = sorted[n - 1];
    double top1_frac = (double)top1 / n;

    /* 2. greedy continuation, one token per step */
    sluice_session_params sp = {.n_ctx = n + n_greedy + 1, .n_threads = 2};
    sluice_session *s = sluice_session_new(m, &sp);
    sluice_sampler_params greedy_params = sluice_sampler_defaults();
    greedy_params.temperature = 0;
    sluice_session_set_sampler(s, &greedy_params);
    int agree = 0;
    bool diverged = false;
    int32_t *ours = malloc((size_t)n_greedy * sizeof *ours);
    CHECK(sluice_session_eval(s, ids, n, NULL) == 0);
    for (int i = 0; i < n_greedy; i++) {
        int32_t tok = sluice_session_sample(s);
        ours[i] = tok;
        if (!diverged && tok == greedy[i]) agree++;
        else diverged = true;
        if (i + 1 < n_greedy) CHECK(sluice_session_eval(s, &tok, 1, NULL) == 0);
    }
    sluice_session_free(s);
    int forced = teacher ? teacher_forced(m, ids, n, greedy, n_greedy, V) : -1;

    /* 3. determinism: threads, batch splits, token-by-token decode */
    int bit_identical = 1;
    for (int th = 1; th <= 3; th++) {
        float *o = eval_logits(m, ids, n, th, th == 3 ? 7 : 0);
        bool same = o && memcmp(o, lg, (size_t)n * V * sizeof *o) == 0;
        CHECKF(same, "logits differ with %d threads%s", th, th == 3 ? ", batches of 7" : "");
        bit_identical &= same;
        free(o);
    }
    {
        sluice_session_params p1 = {.n_ctx = n, .n_threads = 2};
        sluice_session *s1 = sluice_session_new(m, &p1);
        bool ok = s1 != NULL;
        for (int t = 0; ok && t < n; t++) ok = sluice_session_eval(s1, &ids[t], 1, NULL) == 0;
        bool same = ok && memcmp(sluice_session_logits(s1), lg + (size_t)(n - 1) * V,
                                 (size_t)V * sizeof(float)) == 0;
        CHECKF(same, "token-by-token decode differs from the batched prompt at the last position");
        bit_identical &= same;
        sluice_session_free(s1);
    }

    printf("%s: positions %d, median rel %.3g, max rel %.3g, top-1 %d/%d, greedy %d/%d, ",
           name, n, median, worst, top1, n, agree, n_greedy);
    if (teacher) printf("teacher-forced %d/%d, ", forced, n_greedy);
    printf("deterministic %s\n", bit_identical ? "yes" : "NO");
    if (teacher) agree = forced; /* the bound applies to the teacher-forced steps */
    if (!teacher && agree < n_greedy) {
        printf("  greedy ours:");
        for (int i = 0; i < n_greedy; i++) printf(" %d", ours[i]);
        printf("\n  greedy ref: ");
        for (int i = 0; i < n_greedy; i++) printf(" %d", greedy[i]);
        printf("\n");
    }
    CHECKF(median <= median_bound, "median relative error %.3g > %.3g", median, median_bound);
    CHECKF(worst <= max_bound, "max relative error %.3g > %.3g", worst, max_bound);
    CHECKF(top1_frac >= min_top1, "top-1 agreement %.3f < %.3f", top1_frac, min_top1);
    CHECKF(agree >= min_greedy, "greedy agreement %d < %d", agree, min_greedy);

    free(ours);
    free(sorted);
    free(rel);
    free(lg);
    free(ref);
    free(greedy);
    free(ids);
    sluice_model_free(m);
    CHECK_DONE();
}
