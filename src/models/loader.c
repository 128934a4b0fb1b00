/* Helpers shared by the architectures' load functions: hyper-parameters by key suffix and
 * tensor views with shape and codec checks. Every failure names the key or tensor. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/quant.h"
#include "models/model.h"

static void key_of(const sluice_model *m, const char *suffix, char *key, size_t n) {
    snprintf(key, n, "%s.%s", m->arch_name, suffix);
}

bool ld_int(sluice_model *m, const char *suffix, int *out, bool required, char *err, size_t n) {
    char key[160];
    key_of(m, suffix, key, sizeof key);
    const gguf_kv *kv = gguf_find(m->gguf, key);
    if (!kv) {
        if (required) snprintf(err, n, "missing metadata key '%s'", key);
        return !required;
    }
    int64_t v;
    if (!gguf_get_i64(m->gguf, key, &v) || v < 0 || v > (1 << 30)) {
        snprintf(err, n, "metadata key '%s' is not a valid count (type %s)", key,
                 gguf_vtype_name(kv->type));
        return false;
    }
    *out = (int)v;
    return true;
}

bool ld_float(sluice_model *m, const char *suffix, float *out, bool required, char *err,
              size_t n) {
    char key[160];
    key_of(m, suffix, key, sizeof key);
    const gguf_kv *kv = gguf_find(m->gguf, key);
    if (!kv) {
        if (required) snprintf(err, n, "missing metadata key '%s'", key);
        return !required;
    }
    if (!gguf_get_f32(m->gguf, key, out)) {
        snprintf(err, n, "metadata key '%s' has type %s, expected a float", key,
                 gguf_vtype_name(kv->type));
        return false;
    }
    return true;
}

bool ld_own(sluice_model *m, void *p) {
    void **o = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *o);
    if (!o) {
        free(p);
        return false;
    }
    m->owned = o;
    m->owned[m->n_owned++] = p;
    return true;
}

bool ld_tensor(sluice_model *m, tview *out, bool required, int64_t ne0, int64_t ne1, int64_t ne2,
               char *err, size_t n, const char *fmt, ...) {
    char name[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    memset(out, 0, sizeof *out);
    const gguf_tensor *t = gguf_find_tensor(m->gguf, name);
    if (!t) {
        if (required) snprintf(err, n, "missing tensor '%s'", name);
        return !required;
    }
    const int64_t want[3] = {ne0, ne1, ne2};
    for (int d = 0; d < 3; d++) {
        if (want[d] > 0 && t->ne[d] != want[d]) {
            snprintf(err, n, "tensor '%s' has shape [%lld, %lld, %lld], expected dim %d = %lld",
                     name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], d,
                     (long long)want[d]);
            return false;
        }
        if (want[d] < 0 && t->ne[d] != 1) {
            snprintf(err, n, "tensor '%s' has %u dimensions, expected %d", name, t->n_dims, d);
            return false;
        }
    }
    if (t->ne[3] != 1) {
        snprintf(err, n, "tensor '%s' has 4 dimensions", name);
        return false;
    }
    if (!quant_has_codec(t->type)) {
        snprintf(err, n, "tensor '%s' has type %s, which sluice cannot decode", name,
                 quant_type_name(t->type));
        return false;
    }
    out->type = t->type;
    memcpy(out->ne, t->ne, sizeof out->ne);
    out->row_bytes = quant_row_bytes(t->type, t->ne[0]);
    out->mat_bytes = out->row_bytes * (size_t)t->ne[1];
    out->data = t->data;
    out->name = t->name;
    m->n_params += gguf_tensor_nelements(t);
    /* vectors (norms, biases) are read element-wise by model code: keep them as F32 */
    if (t->ne[1] == 1 && t->ne[2] == 1 && t->type != GGML_TYPE_F32) {
        float *f = malloc((size_t)t->ne[0] * sizeof *f);
        if (!f || !ld_own(m, f)) {
            snprintf(err, n, "out of memory converting '%s'", name);
            return false;
        }
        quant_traits_of(t->type)->dequantize(t->data, f, t->ne[0]);
        out->type = GGML_TYPE_F32;
        out->row_bytes = out->mat_bytes = (size_t)t->ne[0] * sizeof(float);
        out->data = f;
    }
    return true;
}

bool load_attention_hparams(sluice_model *m, char *err, size_t n) {
    hparams *hp = &m->hp;
    if (!ld_int(m, "embedding_length", &hp->n_embd, true, err, n) ||
        !ld_int(m, "block_count", &hp->n_layer, true, err, n) ||
        !ld_int(m, "attention.head_count", &hp->n_head, true, err, n))
        return false;
    hp->n_ctx_train = 2048;
    hp->n_head_kv = hp->n_head;
    hp->rms_eps = 1e-5f;
    hp->rope_base = 10000.0f;
    if (!ld_int(m, "context_length", &hp->n_ctx_train, false, err, n) ||
        !ld_int(m, "attention.head_count_kv", &hp->n_head_kv, false, err, n) ||
        !ld_float(m, "attention.layer_norm_rms_epsilon", &hp->rms_eps, false, err, n) ||
        !ld_float(m, "rope.freq_base", &hp->rope_base, false, err, n))
        return false;
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0) {
        snprintf(err, n, "invalid attention shape: %d heads, %d KV heads, %d layers, width %d",
                 hp->n_head, hp->n_head_kv, hp->n_layer, hp->n_embd);
        return false;
    }
    hp->head_dim_k = hp->head_dim_v = hp->n_embd / hp->n_head;
    if (!ld_int(m, "attention.key_length", &hp->head_dim_k, false, err, n) ||
        !ld_int(m, "attention.value_length", &hp->head_dim_v, false, err, n))
        return false;
    hp->n_rot = hp->head_dim_k;
    if (!ld_int(m, "rope.dimension_count", &hp->n_rot, false, err, n)) return false;
    if (hp->head_dim_k <= 0 || hp->head_dim_v <= 0 || hp->n_rot <= 0 ||
        hp->n_rot > hp->head_dim_k || hp->n_rot % 2 || hp->n_rot > 1024) {
        snprintf(err, n, "invalid head dims: key %d, value %d, rotary %d", hp->head_dim_k,
                 hp->head_dim_v, hp->n_rot);
        return false;
    }
    if (!(hp->rope_base > 0.0f) || !(hp->rms_eps > 0.0f)) {
        snprintf(err, n, "invalid rope.freq_base or rms epsilon");
        return false;
    }
    return true;
}

bool load_io_tensors(sluice_model *m, char *err, size_t n) {
    hparams *hp = &m->hp;
    if (!ld_tensor(m, &m->tok_embd, true, hp->n_embd, 0, -1, err, n, "token_embd.weight"))
        return false;
    hp->n_vocab = (int)m->tok_embd.ne[1];
    if (!ld_tensor(m, &m->output_norm, true, hp->n_embd, -1, -1, err, n, "output_norm.weight") ||
        !ld_tensor(m, &m->output, false, hp->n_embd, hp->n_vocab, -1, err, n, "output.weight"))
        return false;
    if (!m->output.data) m->output = m->tok_embd;
    return true;
}


bool ld_experts(sluice_model *m, bool every_layer, char *err, size_t n) {
    const hparams *hp = &m->hp;
    if (expert_layout_load(m->gguf, hp->n_layer, hp->n_expert, &m->layout, err, n) != 0)
        return false;
    for (int il = 0; il < hp->n_layer; il++) {
        const expert_layer_layout *L = &m->layout.layers[il];
        if (!L->present) {
            if (every_layer) {
                snprintf(err, n, "layer %d has no routed experts (ffn_{gate,up,down}_exps)", il);
                return false;
            }
            continue;
        }
        const int64_t want[EXPERT_PARTS][2] = {{hp->n_embd, hp->n_ff_exp},
                                               {hp->n_embd, hp->n_ff_exp},
                                               {hp->n_ff_exp, hp->n_embd}};
        static const char *names[EXPERT_PARTS] = {"gate", "up", "down"};
        for (int p = 0; p < EXPERT_PARTS; p++) {
            if (L->part[p].ne0 != want[p][0] || L->part[p].ne1 != want[p][1]) {
                snprintf(err, n, "layer %d: %s experts have shape [%lld, %lld], expected "
                         "[%lld, %lld]", il, names[p], (long long)L->part[p].ne0,
                         (long long)L->part[p].ne1, (long long)want[p][0], (long long)want[p][1]);
                return false;
            }
            m->n_params += L->part[p].ne0 * L->part[p].ne1 * (int64_t)hp->n_expert;
        }
    }
    return true;
}
