/* Expert layout discovery, and the expert-major store: repack and verify. */
#include "formats/store.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "formats/gguf_write.h"
#include "formats/outfile.h"
#include "formats/quant.h"

static const char *const part_names[EXPERT_PARTS] = {"gate", "up", "down"};

#define KEY(s) "sluice.store." s

#define FUSED_GATE_UP 3 /* "ffn_gate_up_exps": gate rows then up rows of each expert */

/* Layer indices above this are not expert tensors (the store manifest has the same bound); it
 * caps what a file can make the layout allocate. */
#define MAX_LAYER 99999

/* "blk.12.ffn_up_exps.weight" -> layer 12, part EXPERT_UP. Digits only: sscanf's %d accepted a
 * sign or spaces, wrapped past INT_MAX (UB; "blk.4294967297" aliased layer 1) and let a name
 * with layer INT_MAX overflow n_layer (found writing tests/fuzz/fuzz_store.c). */
static bool parse_expert_name(const char *name, int *layer, int *part) {
    if (strncmp(name, "blk.", 4) != 0) return false;
    const char *p = name + 4;
    int l = 0;
    if (*p < '0' || *p > '9') return false;
    for (; *p >= '0' && *p <= '9'; p++) {
        l = l * 10 + (*p - '0');
        if (l > MAX_LAYER) return false;
    }
    if (strcmp(p, ".ffn_gate_up_exps.weight") == 0) {
        *layer = l;
        *part = FUSED_GATE_UP;
        return true;
    }
    for (int q = 0; q < EXPERT_PARTS; q++) {
        const size_t n = strlen(part_names[q]);
        if (strncmp(p, ".ffn_", 5) == 0 && strncmp(p + 5, part_names[q], n) == 0 &&
            strcmp(p + 5 + n, "_exps.weight") == 0) {
            *layer = l;
            *part = q;
            return true;
        }
    }
    return false;
}

void expert_layout_free(expert_layout *l) {
    if (!l) return;
    free(l->layers);
    free(l->record_crc);
    memset(l, 0, sizeof *l);
}

static void finish_sizes(expert_layout *l) {
    l->expert_bytes_max = l->expert_bytes_total = 0;
    for (int i = 0; i < l->n_layer; i++) {
        if (!l->layers[i].present) continue;
        uint64_t b = 0;
        for (int p = 0; p < EXPERT_PARTS; p++) b += l->layers[i].part[p].bytes;
        if (b > l->expert_bytes_max) l->expert_bytes_max = b;
        l->expert_bytes_total += b * (uint64_t)l->n_expert;
    }
}

/* ---- manifest hash: a canonical serialization of everything that locates a record ---------- */

static void h_u64(EVP_MD_CTX *h, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    EVP_DigestUpdate(h, b, 8);
}

static void manifest_hash(const expert_layout *l, uint8_t out[32]) {
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    EVP_DigestInit_ex(h, EVP_sha256(), NULL);
    EVP_DigestUpdate(h, "sluice-store-v1", 15);
    h_u64(h, (uint64_t)l->n_layer);
    h_u64(h, (uint64_t)l->n_expert);
    uint64_t k = 0;
    for (int i = 0; i < l->n_layer; i++) {
        const expert_layer_layout *L = &l->layers[i];
        if (!L->present) continue;
        h_u64(h, (uint64_t)i);
        h_u64(h, L->record_offset);
        h_u64(h, L->record_stride);
        h_u64(h, L->record_bytes);
        for (int p = 0; p < EXPERT_PARTS; p++) {
            const expert_part *P = &L->part[p];
            h_u64(h, P->type);
            h_u64(h, (uint64_t)P->ne0);
            h_u64(h, (uint64_t)P->ne1);
            h_u64(h, P->offset - L->record_offset);
            h_u64(h, P->bytes);
        }
        for (int e = 0; e < l->n_expert; e++) h_u64(h, l->record_crc[k++]);
    }
    unsigned len = 32;
    EVP_DigestFinal_ex(h, out, &len);
    EVP_MD_CTX_free(h);
}

static void to_hex(const uint8_t *b, int n, char *out) {
    for (int i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
    out[2 * n] = 0;
}

/* ---- reading a layout ----------------------------------------------------------------------- */

static bool arr_u64(const gguf_file *f, const char *key, uint64_t n, uint64_t i, uint64_t *out) {
    const gguf_kv *kv = gguf_find(f, key);
    int64_t v;
    if (!kv || kv->type != GGUF_VT_ARRAY || kv->arr_n != n || !gguf_arr_get_i64(kv, i, &v) ||
        v < 0)
        return false;
    *out = (uint64_t)v;
    return true;
}

static int load_packed(const gguf_file *f, int n_layer, int n_expert, expert_layout *l, char *err,
                       size_t n) {
    uint32_t version = 0, ne = 0;
    if (!gguf_get_u32(f, KEY("version"), &version) || version != STORE_VERSION) {
        snprintf(err, n, "expert store version %u is not supported (expected %d)", version,
                 STORE_VERSION);
        return -1;
    }
    const gguf_kv *layers = gguf_find(f, KEY("layers"));
    if (!gguf_get_u32(f, KEY("n_expert"), &ne) || !layers || layers->type != GGUF_VT_ARRAY ||
        layers->arr_n == 0 || layers->arr_n > 4096) {
        snprintf(err, n, "expert store manifest is incomplete (n_expert / layers)");
        return -1;
    }
    if (n_expert >= 0 && (int)ne != n_expert) {
        snprintf(err, n, "expert store has %u experts per layer, the model %d", ne, n_expert);
        return -1;
    }
    const uint64_t nl = layers->arr_n;
    int max_layer = -1;
    for (uint64_t i = 0; i < nl; i++) {
        int64_t v;
        if (!gguf_arr_get_i64(layers, i, &v) || v < 0 || v >= 100000) {
            snprintf(err, n, "expert store manifest: bad layer index");
            return -1;
        }
        if (v > max_layer) max_layer = (int)v;
    }
    if (n_layer < 0) n_layer = max_layer + 1;
    if (max_layer >= n_layer) {
        snprintf(err, n, "expert store names layer %d but the model has %d", max_layer, n_layer);
        return -1;
    }
    /* the checksum array is in the file, so checking its size first bounds the allocations by
     * the file (n_expert and 4096 layer entries alone, a 33 KB file, asked malloc for 16 TB) */
    const gguf_kv *crc = gguf_find(f, KEY("record_crc32"));
    if (ne == 0 || ne > INT32_MAX || !crc || crc->type != GGUF_VT_ARRAY ||
        crc->arr_type != GGUF_VT_U32 || crc->arr_n != nl * ne) {
        snprintf(err, n, "expert store manifest: record checksums missing or of the wrong size");
        return -1;
    }
    l->n_layer = n_layer;
    l->n_expert = (int)ne;
    l->packed = true;
    l->layers = calloc((size_t)n_layer, sizeof *l->layers);
    l->record_crc = malloc(nl * ne * sizeof *l->record_crc);
    if (!l->layers || !l->record_crc) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    memcpy(l->record_crc, crc->arr_data, nl * ne * sizeof(uint32_t));
    for (uint64_t i = 0; i < nl; i++) {
        int64_t li;
        gguf_arr_get_i64(layers, i, &li);
        expert_layer_layout *L = &l->layers[li];
        if (L->present) {
            snprintf(err, n, "expert store manifest lists layer %lld twice", (long long)li);
            return -1;
        }
        L->present = true;
        char name[64];
        snprintf(name, sizeof name, "blk.%lld.ffn_experts.packed", (long long)li);
        const gguf_tensor *t = gguf_find_tensor(f, name);
        if (!arr_u64(f, KEY("record_stride"), nl, i, &L->record_stride) ||
            !arr_u64(f, KEY("record_bytes"), nl, i, &L->record_bytes)) {
            snprintf(err, n, "expert store manifest: record sizes missing");
            return -1;
        }
        if (!t || t->type != GGML_TYPE_I8 || (uint64_t)t->ne[0] != L->record_stride ||
            t->ne[1] != (int64_t)ne || t->n_dims != 2) {
            snprintf(err, n, "expert store: tensor %s is missing or does not match the manifest",
                     name);
            return -1;
        }
        L->record_offset = f->data_offset + t->offset;
        if (L->record_stride % STORE_ALIGN || L->record_offset % STORE_ALIGN ||
            L->record_bytes > L->record_stride) {
            snprintf(err, n, "expert store: layer %lld records are not %d-byte aligned",
                     (long long)li, STORE_ALIGN);
            return -1;
        }
        for (int p = 0; p < EXPERT_PARTS; p++) {
            expert_part *P = &L->part[p];
            char key[64];
            uint64_t type, ne0, ne1, off;
            snprintf(key, sizeof key, KEY("%s.type"), part_names[p]);
            bool ok = arr_u64(f, key, nl, i, &type);
            snprintf(key, sizeof key, KEY("%s.ne0"), part_names[p]);
            ok = ok && arr_u64(f, key, nl, i, &ne0);
            snprintf(key, sizeof key, KEY("%s.ne1"), part_names[p]);
            ok = ok && arr_u64(f, key, nl, i, &ne1);
            snprintf(key, sizeof key, KEY("%s.offset"), part_names[p]);
            ok = ok && arr_u64(f, key, nl, i, &off);
            if (!ok || type >= QUANT_TYPE_LIMIT || !quant_has_codec((uint32_t)type) ||
                ne0 == 0 || ne1 == 0 || ne0 > (1u << 24) || ne1 > (1u << 24)) {
                snprintf(err, n, "expert store manifest: %s descriptor of layer %lld is invalid",
                         part_names[p], (long long)li);
                return -1;
            }
            P->type = (uint32_t)type;
            P->ne0 = (int64_t)ne0;
            P->ne1 = (int64_t)ne1;
            P->bytes = quant_row_bytes(P->type, P->ne0) * ne1;
            P->offset = L->record_offset + off;
            P->stride = L->record_stride;
            if (P->bytes == 0 || off > L->record_bytes || P->bytes > L->record_bytes - off) {
                snprintf(err, n, "expert store manifest: %s of layer %lld lies outside its record",
                         part_names[p], (long long)li);
                return -1;
            }
        }
    }
    finish_sizes(l);
    uint8_t h[32];
    char hex[65];
    gguf_str want;
    manifest_hash(l, h);
    to_hex(h, 32, hex);
    if (!gguf_get_str(f, KEY("manifest_sha256"), &want) || want.len != 64 ||
        memcmp(want.ptr, hex, 64) != 0) {
        snprintf(err, n, "expert store manifest is corrupted: its SHA-256 does not match");
        return -1;
    }
    return 0;
}

static int load_plain(const gguf_file *f, int n_layer, int n_expert, expert_layout *l, char *err,
                      size_t n) {
    if (n_layer < 0) {
        n_layer = 0;
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            int layer, part;
            if (parse_expert_name(f->tensors[i].name, &layer, &part) && layer + 1 > n_layer)
                n_layer = layer + 1;
        }
    }
    l->n_layer = n_layer;
    l->n_expert = n_expert;
    l->layers = calloc((size_t)(n_layer ? n_layer : 1), sizeof *l->layers);
    if (!l->layers) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        int layer, p;
        if (!parse_expert_name(t->name, &layer, &p)) continue;
        if (layer >= n_layer) {
            snprintf(err, n, "tensor '%s' names layer %d but the model has %d", t->name, layer,
                     n_layer);
            return -1;
        }
        if (l->n_expert < 0) l->n_expert = (int)t->ne[2];
        if (t->n_dims != 3 || t->ne[2] != l->n_expert) {
            snprintf(err, n, "tensor '%s' has %lld experts, expected %d", t->name,
                     (long long)t->ne[2], l->n_expert);
            return -1;
        }
        if (!quant_has_codec(t->type)) {
            snprintf(err, n, "tensor '%s' has type %s, which sluice cannot decode", t->name,
                     quant_type_name(t->type));
            return -1;
        }
        const uint64_t row = quant_row_bytes(t->type, t->ne[0]);
        if (p == FUSED_GATE_UP) {
            if (t->ne[1] % 2) {
                snprintf(err, n, "tensor '%s' has an odd number of rows", t->name);
                return -1;
            }
            /* two parts over one tensor: each expert's matrix is gate rows, then up rows */
            for (int q = EXPERT_GATE; q <= EXPERT_UP; q++) {
                expert_part *P = &l->layers[layer].part[q];
                P->type = t->type;
                P->ne0 = t->ne[0];
                P->ne1 = t->ne[1] / 2;
                P->bytes = row * (uint64_t)P->ne1;
                P->stride = row * (uint64_t)t->ne[1];
                P->offset = f->data_offset + t->offset + (q == EXPERT_UP ? P->bytes : 0);
            }
            continue;
        }
        expert_part *P = &l->layers[layer].part[p];
        P->type = t->type;
        P->ne0 = t->ne[0];
        P->ne1 = t->ne[1];
        P->bytes = row * (uint64_t)t->ne[1];
        P->stride = P->bytes;
        P->offset = f->data_offset + t->offset;
    }
    for (int i = 0; i < n_layer; i++) {
        expert_layer_layout *L = &l->layers[i];
        int have = (L->part[0].bytes > 0) + (L->part[1].bytes > 0) + (L->part[2].bytes > 0);
        if (have != 0 && have != EXPERT_PARTS) {
            snprintf(err, n, "layer %d has only some of ffn_{gate,up,down}_exps", i);
            return -1;
        }
        L->present = have == EXPERT_PARTS;
    }
    if (l->n_expert < 0) l->n_expert = 0;
    finish_sizes(l);
    return 0;
}

int expert_layout_load(const gguf_file *f, int n_layer, int n_expert, expert_layout *out,
                       char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    int rc = gguf_find(f, KEY("version")) ? load_packed(f, n_layer, n_expert, out, err, err_len)
                                          : load_plain(f, n_layer, n_expert, out, err, err_len);
    if (rc) expert_layout_free(out);
    return rc;
}

/* ---- repack --------------------------------------------------------------------------------- */

static bool is_store_key(const char *k) { return strncmp(k, "sluice.store.", 13) == 0; }

/* The three parts of expert e of layer L, from the mapped input. */
static const uint8_t *part_ptr(const gguf_file *f, const expert_part *p, int e) {
    return f->base + expert_part_offset(p, e);
}

static int write_zeros(FILE *fp, gguf_writer *w, uint64_t n) {
    static const uint8_t zeros[STORE_ALIGN];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (gguf_writer_write_data(w, fp, zeros, k)) return -1;
        n -= k;
    }
    return 0;
}

int store_repack(const char *in_path, const char *out_path, store_progress_fn progress,
                 void *ctx, char *err, size_t err_len) {
    if (outfile_check(out_path, err, err_len) != 0) return -1;
    gguf_file *f = gguf_open(in_path, err, err_len);
    if (!f) return -1;
    int rc = -1;
    expert_layout lay = {0};
    gguf_writer *w = NULL;
    FILE *fp = NULL;
    char *tmp = NULL;
    uint32_t *crc = NULL;
    uint64_t *strides = NULL, *rbytes = NULL, *layer_ids = NULL, *desc = NULL;
    EVP_MD_CTX *sha = EVP_MD_CTX_new();
    if (gguf_find(f, KEY("version"))) {
        snprintf(err, err_len, "%s is already an expert-major store", in_path);
        goto done;
    }
    char lerr[256];
    if (expert_layout_load(f, -1, -1, &lay, lerr, sizeof lerr) != 0) {
        snprintf(err, err_len, "%s: %s", in_path, lerr);
        goto done;
    }
    int nl = 0;
    for (int i = 0; i < lay.n_layer; i++) nl += lay.layers[i].present;
    if (nl == 0) {
        snprintf(err, err_len, "%s has no routed expert tensors to repack", in_path);
        goto done;
    }
    const int ne = lay.n_expert;
    crc = calloc((size_t)nl * ne, sizeof *crc);
    strides = calloc((size_t)nl, sizeof *strides);
    rbytes = calloc((size_t)nl, sizeof *rbytes);
    layer_ids = calloc((size_t)nl, sizeof *layer_ids);
    desc = calloc((size_t)nl * 4 * EXPERT_PARTS, sizeof *desc);
    if (!crc || !strides || !rbytes || !layer_ids || !desc || !sha) {
        snprintf(err, err_len, "out of memory");
        goto done;
    }
    /* pass 1: record geometry, per-record CRC and the payload hash */
    uint64_t total = lay.expert_bytes_total, done_bytes = 0;
    uint8_t payload[32];
    EVP_DigestInit_ex(sha, EVP_sha256(), NULL);
    static const uint8_t zeros[STORE_ALIGN];
    for (int i = 0, k = 0; i < lay.n_layer; i++) {
        const expert_layer_layout *L = &lay.layers[i];
        if (!L->present) continue;
        uint64_t off = 0;
        for (int p = 0; p < EXPERT_PARTS; p++) {
            desc[(k * EXPERT_PARTS + p) * 4 + 0] = L->part[p].type;
            desc[(k * EXPERT_PARTS + p) * 4 + 1] = (uint64_t)L->part[p].ne0;
            desc[(k * EXPERT_PARTS + p) * 4 + 2] = (uint64_t)L->part[p].ne1;
            desc[(k * EXPERT_PARTS + p) * 4 + 3] = off;
            off += L->part[p].bytes;
        }
        layer_ids[k] = (uint64_t)i;
        rbytes[k] = off;
        strides[k] = (off + STORE_ALIGN - 1) / STORE_ALIGN * STORE_ALIGN;
        for (int e = 0; e < ne; e++) {
            uLong c = crc32(0L, Z_NULL, 0);
            for (int p = 0; p < EXPERT_PARTS; p++) {
                const uint8_t *src = part_ptr(f, &L->part[p], e);
                c = crc32_z(c, src, L->part[p].bytes);
                EVP_DigestUpdate(sha, src, L->part[p].bytes);
            }
            EVP_DigestUpdate(sha, zeros, strides[k] - rbytes[k]);
            crc[(size_t)k * ne + e] = (uint32_t)c;
            done_bytes += rbytes[k];
            if (progress) progress(ctx, done_bytes, 2 * total);
        }
        k++;
    }
    unsigned plen = 32;
    EVP_DigestFinal_ex(sha, payload, &plen);

    /* the manifest as a reader will see it (record offsets are known once the header is laid
     * out, so build the writer first, then fill offsets into a layout to hash) */
    w = gguf_writer_new();
    if (!w) {
        snprintf(err, err_len, "out of memory");
        goto done;
    }
    gguf_w_set_alignment(w, STORE_ALIGN);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        if (strcmp(kv->key, "general.alignment") == 0 || is_store_key(kv->key)) continue;
        if (kv->type == GGUF_VT_ARRAY && kv->arr_type == GGUF_VT_ARRAY) continue; /* nested */
        gguf_w_copy_kv(w, kv);
    }
    uint32_t *u32s = malloc((size_t)nl * sizeof *u32s);
    uint64_t *col = malloc((size_t)nl * sizeof *col);
    if (!u32s || !col) {
        free(u32s);
        free(col);
        snprintf(err, err_len, "out of memory");
        goto done;
    }
    gguf_w_u32(w, KEY("version"), STORE_VERSION);
    gguf_w_u32(w, KEY("n_expert"), (uint32_t)ne);
    for (int k = 0; k < nl; k++) u32s[k] = (uint32_t)layer_ids[k];
    gguf_w_arr(w, KEY("layers"), GGUF_VT_U32, u32s, (uint64_t)nl);
    gguf_w_arr(w, KEY("record_bytes"), GGUF_VT_U64, rbytes, (uint64_t)nl);
    gguf_w_arr(w, KEY("record_stride"), GGUF_VT_U64, strides, (uint64_t)nl);
    static const char *fields[4] = {"type", "ne0", "ne1", "offset"};
    for (int p = 0; p < EXPERT_PARTS; p++)
        for (int fi = 0; fi < 4; fi++) {
            char key[64];
            snprintf(key, sizeof key, KEY("%s.%s"), part_names[p], fields[fi]);
            for (int k = 0; k < nl; k++) col[k] = desc[(k * EXPERT_PARTS + p) * 4 + fi];
            gguf_w_arr(w, key, GGUF_VT_U64, col, (uint64_t)nl);
        }
    free(u32s);
    free(col);
    gguf_w_arr(w, KEY("record_crc32"), GGUF_VT_U32, crc, (uint64_t)nl * ne);
    char hex[65];
    to_hex(payload, 32, hex);
    gguf_w_str(w, KEY("payload_sha256"), hex);
    /* tensors: everything but the routed experts, then one packed tensor per layer */
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        int layer, part;
        if (parse_expert_name(t->name, &layer, &part)) continue;
        gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    int first_packed = -1;
    for (int k = 0; k < nl; k++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_experts.packed", (int)layer_ids[k]);
        int64_t dims[2] = {(int64_t)strides[k], ne};
        int idx = gguf_w_tensor(w, name, GGML_TYPE_I8, 2, dims, NULL);
        if (first_packed < 0) first_packed = idx;
    }
    /* The manifest hash covers absolute record offsets, which depend on the header size. The
     * hash string has a fixed length, so: add a placeholder, lay the header out in memory to
     * learn the data section start and where the placeholder sits, hash, patch it in. */
    gguf_w_str(w, KEY("manifest_sha256"),
               "0000000000000000000000000000000000000000000000000000000000000000");
    long hash_pos = -1;
    uint64_t data_start = 0;
    {
        char *hb = NULL;
        size_t hl = 0;
        FILE *mf = open_memstream(&hb, &hl);
        if (!mf || gguf_writer_write_header(w, mf) != 0) {
            if (mf) fclose(mf);
            free(hb);
            snprintf(err, err_len, "out of memory");
            goto done;
        }
        fclose(mf);
        data_start = hl; /* the writer pads the header to the alignment */
        const char *needle = KEY("manifest_sha256");
        char *at = memmem(hb, hl, needle, strlen(needle));
        if (at) hash_pos = (long)(at - hb) + (long)strlen(needle) + 4 + 8;
        free(hb);
    }
    {
        uint64_t off = 0;
        int n_t = 0;
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            int layer, part;
            if (parse_expert_name(f->tensors[i].name, &layer, &part)) continue;
            off += (gguf_w_tensor_nbytes(w, n_t++) + STORE_ALIGN - 1) / STORE_ALIGN * STORE_ALIGN;
        }
        expert_layout m = {.n_layer = lay.n_layer, .n_expert = ne, .packed = true,
                           .layers = calloc((size_t)lay.n_layer, sizeof *m.layers),
                           .record_crc = crc};
        if (!m.layers) {
            snprintf(err, err_len, "out of memory");
            goto done;
        }
        for (int k = 0; k < nl; k++) {
            expert_layer_layout *L = &m.layers[layer_ids[k]];
            L->present = true;
            L->record_offset = data_start + off;
            L->record_stride = strides[k];
            L->record_bytes = rbytes[k];
            for (int p = 0; p < EXPERT_PARTS; p++) {
                L->part[p] = lay.layers[layer_ids[k]].part[p];
                L->part[p].offset = L->record_offset + desc[(k * EXPERT_PARTS + p) * 4 + 3];
                L->part[p].stride = strides[k];
            }
            off += strides[k] * (uint64_t)ne;
        }
        uint8_t mh[32];
        manifest_hash(&m, mh);
        free(m.layers);
        to_hex(mh, 32, hex);
    }
    size_t tl = strlen(out_path) + 8;
    tmp = malloc(tl);
    snprintf(tmp, tl, "%s.tmp", out_path);
    fp = fopen(tmp, "wb");
    if (!fp) {
        snprintf(err, err_len, "%s: %s", tmp, strerror(errno));
        goto done;
    }
    setvbuf(fp, NULL, _IOFBF, 8u << 20);
    if (gguf_writer_write_header(w, fp) != 0) goto io_error;
    int idx = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        int layer, part;
        if (parse_expert_name(t->name, &layer, &part)) continue;
        if (gguf_writer_begin_tensor(w, fp, idx) || gguf_writer_write_data(w, fp, t->data, t->nbytes) ||
            gguf_writer_end_tensor(w, fp, idx))
            goto io_error;
        idx++;
    }
    for (int k = 0; k < nl; k++, idx++) {
        const expert_layer_layout *L = &lay.layers[layer_ids[k]];
        if (gguf_writer_begin_tensor(w, fp, idx)) goto io_error;
        for (int e = 0; e < ne; e++) {
            for (int p = 0; p < EXPERT_PARTS; p++)
                if (gguf_writer_write_data(w, fp, part_ptr(f, &L->part[p], e), L->part[p].bytes))
                    goto io_error;
            if (write_zeros(fp, w, strides[k] - rbytes[k])) goto io_error;
            done_bytes += rbytes[k];
            if (progress) progress(ctx, done_bytes, 2 * total);
        }
        if (gguf_writer_end_tensor(w, fp, idx)) goto io_error;
    }
    if (hash_pos < 0 || fseek(fp, hash_pos, SEEK_SET) != 0 || fwrite(hex, 1, 64, fp) != 64)
        goto io_error;
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) goto io_error;
    if (fclose(fp) != 0) {
        fp = NULL;
        goto io_error;
    }
    fp = NULL;
    if (rename(tmp, out_path) != 0) goto io_error;
    rc = 0;
    goto done;
io_error:
    snprintf(err, err_len, "writing %s: %s", out_path, strerror(errno ? errno : EIO));
    if (fp) fclose(fp);
    fp = NULL;
    remove(tmp);
done:
    if (fp) fclose(fp);
    free(tmp);
    free(crc);
    free(strides);
    free(rbytes);
    free(layer_ids);
    free(desc);
    EVP_MD_CTX_free(sha);
    gguf_writer_free(w);
    lay.record_crc = NULL;
    expert_layout_free(&lay);
    gguf_close(f);
    return rc;
}

/* ---- verify --------------------------------------------------------------------------------- */

int store_verify(const char *path, store_verify_report *rep, store_progress_fn progress,
                 void *ctx, char *err, size_t err_len) {
    memset(rep, 0, sizeof *rep);
    rep->first_bad_layer = rep->first_bad_expert = -1;
    gguf_file *f = gguf_open(path, err, err_len);
    if (!f) return -1;
    if (!gguf_find(f, KEY("version"))) {
        gguf_close(f);
        return 0; /* a plain GGUF: the structure was validated by gguf_open */
    }
    rep->packed = true;
    expert_layout lay;
    char lerr[256];
    if (expert_layout_load(f, -1, -1, &lay, lerr, sizeof lerr) != 0) {
        snprintf(err, err_len, "%s: %s", path, lerr);
        gguf_close(f);
        return -1;
    }
    uint8_t mh[32], ph[32];
    manifest_hash(&lay, mh);
    to_hex(mh, 32, rep->manifest_sha256);
    EVP_MD_CTX *sha = EVP_MD_CTX_new();
    EVP_DigestInit_ex(sha, EVP_sha256(), NULL);
    uint64_t total = 0, done_bytes = 0, k = 0;
    for (int i = 0; i < lay.n_layer; i++)
        if (lay.layers[i].present) total += lay.layers[i].record_stride * (uint64_t)lay.n_expert;
    for (int i = 0; i < lay.n_layer; i++) {
        const expert_layer_layout *L = &lay.layers[i];
        if (!L->present) continue;
        const uint8_t *base = f->base + L->record_offset;
        uint64_t span = L->record_stride * (uint64_t)lay.n_expert;
        madvise((void *)((uintptr_t)base & ~(uintptr_t)4095), span, MADV_SEQUENTIAL);
        for (int e = 0; e < lay.n_expert; e++, k++) {
            const uint8_t *r = base + (uint64_t)e * L->record_stride;
            uint32_t c = (uint32_t)crc32_z(crc32(0L, Z_NULL, 0), r, L->record_bytes);
            EVP_DigestUpdate(sha, r, L->record_stride);
            rep->records++;
            if (c != lay.record_crc[k]) {
                if (!rep->bad_records) {
                    rep->first_bad_layer = i;
                    rep->first_bad_expert = e;
                }
                rep->bad_records++;
            }
            done_bytes += L->record_stride;
            if (progress) progress(ctx, done_bytes, total);
        }
        madvise((void *)((uintptr_t)base & ~(uintptr_t)4095), span, MADV_DONTNEED);
    }
    unsigned pl = 32;
    EVP_DigestFinal_ex(sha, ph, &pl);
    EVP_MD_CTX_free(sha);
    to_hex(ph, 32, rep->payload_sha256);
    gguf_str want;
    int rc = 0;
    if (rep->bad_records) {
        snprintf(err, err_len, "%s: %" PRIu64 " of %" PRIu64 " expert records are corrupted "
                 "(first: layer %d, expert %d)", path, rep->bad_records, rep->records,
                 rep->first_bad_layer, rep->first_bad_expert);
        rc = -1;
    } else if (!gguf_get_str(f, KEY("payload_sha256"), &want) || want.len != 64 ||
               memcmp(want.ptr, rep->payload_sha256, 64) != 0) {
        snprintf(err, err_len, "%s: the expert payload's SHA-256 does not match the manifest",
                 path);
        rc = -1;
    }
    expert_layout_free(&lay);
    gguf_close(f);
    return rc;
}
