/* AMX byte tiles (Q4_K, Q5_K, Q6_K, IQ2_XS, IQ3_XXS, IQ4_XS): the byte tiles' walk with the
 * integer step on the tile unit. A row's super-block is decoded as for the VNNI byte tiles
 * (kernels_avx512_byte_tile.h: unsigned bytes q, integer sub-block scales sc), then each value's
 * weight w = sc * (q - off) (the offset that made the type's values unsigned, 0 for Q4_K / Q5_K,
 * whose mins stay in the float step) is split into two signed byte planes, w = lo + 128 hi. Per
 * 64-value chunk two TDPBSSD multiply 16 rows' planes by 16 tokens' activations (the packed
 * layout as stored: 16 quads x 16 tokens x 4 bytes is a B tile), so a super-block costs 8 tile
 * products per 16 rows and token block whatever its sub-blocks, and lo + 128 hi is the exact
 * integer sum of sc * (q - off) * a, the reference's isum: the float step, the VNNI walk's, gives
 * the same bits.
 *
 * Why planes: the sub-block scales must be applied between sub-blocks, and a tile product per
 * sub-block (one TDPBUSD of 16 or 32 values, a store, a vector multiply by the scales) left the
 * walk waiting on each product's store: Q6_K at 64 tokens ran at 246 GOP/s, slower than the
 * VNNI byte tile (317), one core. The tile unit's throughput does not depend on the tile's shape
 * (one product per ~16 cycles for 16 x 64 or 16 x 16 bytes).
 *
 * Compiled with the AVX-512 level's flags plus -mamx-tile -mamx-int8 (CMakeLists.txt); used only
 * where the CPU has AMX-TILE and AMX-INT8 and Linux granted the tile state (kernels.c).
 * SLUICE_AMX=0 keeps the VNNI tiles; kernel_amx_set turns the AMX walk off and on at run time
 * (tests), the registered tiles then running the VNNI walk on the same packed activations. */
#if defined(__x86_64__)

#include "backends/cpu/kernels_x86_common.h" /* first: contraction off, the helpers */

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_avx512_byte_tile.h"

#include <stdbool.h>

#define AMX_ROWS 16 /* rows per group: a tile's 16 rows */

/* the tile configuration (palette 1) as LDTILECFG reads it */
typedef struct amx_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* Tiles: tmm0 / tmm1 the low / high planes of 16 rows (16 x 64 bytes: one 64-value chunk), tmm2 /
 * tmm3 the chunk's activations of two token blocks (16 quads x 16 tokens x 4 bytes), tmm4-7 the
 * sums (low, high) x (two token blocks). The intrinsics stringify their tile numbers, so the
 * walk names them as literals. */
static bool amx_on = true;

void kernel_amx_set(bool on) { amx_on = on; }

static void amx_configure(void) {
    amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = AMX_ROWS;
        c.colsb[t] = 64;
    }
    /* gcc 12's _tile_loadconfig names only 8 bytes of the configuration as its input, so the
     * stores of the rows and widths were dropped as dead: a barrier keeps them */
    __asm__ volatile("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
}

/* 16 rows' weights w = scale * v as two signed byte planes, w = lo + 128 * hi */
typedef struct amx_planes {
    _Alignas(64) int8_t lo[AMX_ROWS][QK_K];
    _Alignas(64) int8_t hi[AMX_ROWS][QK_K];
} amx_planes;

/* A decoded row's w = sc * (q - off) per value (Q4_K / Q5_K: off 0 and their mins stay in the
 * float step; the others' offset that made their quants unsigned: Q6_K 32, IQ2_XS / IQ3_XXS 64,
 * IQ4_XS 128), |w| <= 63 * 128 (Q6_K, the largest), split into lo = w & 127 and hi = w >> 7
 * (-64..63): both signed bytes. Words by unpacking each 128-bit lane's bytes against zero, which
 * the packs undo in the same order; a lane's 16 values share a scale. */
static inline __attribute__((always_inline)) void amx_split(int kind, const byte_row *o, int8_t *lo, int8_t *hi) {
    const int shift = byte_kind_offset_shift(kind), off = shift ? 1 << shift : 0;
    const int sub16 = byte_kind_sub16(kind);
    __m512i sc = _mm512_loadu_si512((const void *)o->sc); /* the 16-value groups' scales */
    if (!sub16) sc = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), sc);
    const __m512i scw = _mm512_castsi256_si512(_mm512_cvtepi32_epi16(sc));
    const __m512i zero = _mm512_setzero_si512(), m7 = _mm512_set1_epi16(127), vo = _mm512_set1_epi16((short)off);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        /* word j of the chunk's scale vector: group 4c + j / 8 (a 128-bit lane) */
        const __m512i idx = _mm512_add_epi16(_mm512_set1_epi16((short)(4 * c)),
                                             _mm512_setr_epi32(0, 0, 0, 0, 0x10001, 0x10001, 0x10001, 0x10001, 0x20002,
                                                               0x20002, 0x20002, 0x20002, 0x30003, 0x30003, 0x30003, 0x30003));
        const __m512i s = _mm512_permutexvar_epi16(idx, scw);
        const __m512i q = _mm512_load_si512((const void *)(o->q + 64 * c));
        __m512i a = _mm512_unpacklo_epi8(q, zero), b = _mm512_unpackhi_epi8(q, zero);
        if (off) {
            a = _mm512_sub_epi16(a, vo);
            b = _mm512_sub_epi16(b, vo);
        }
        a = _mm512_mullo_epi16(a, s);
        b = _mm512_mullo_epi16(b, s);
        _mm512_store_si512((void *)(lo + 64 * c), _mm512_packus_epi16(_mm512_and_si512(a, m7), _mm512_and_si512(b, m7)));
        _mm512_store_si512((void *)(hi + 64 * c), _mm512_packs_epi16(_mm512_srai_epi16(a, 7), _mm512_srai_epi16(b, 7)));
    }
}

/* The float step of 16 rows' exact integers (lo + 128 hi) against one token block: Q4_K / Q5_K
 * subtract their mins (k45_float); for the others isum is already the reference's integer, the
 * offset folded into w, so the step is q6_float's with no correction to subtract. */
static inline __attribute__((always_inline)) void amx_float(int kind, const byte_row *rw, int R, const uint8_t *blk,
                                                            const int32_t *clo, const int32_t *chi, __m512 *acc) {
    __m512i isum[AMX_ROWS];
#pragma GCC unroll 16
    for (int r = 0; r < AMX_ROWS; r++)
        isum[r] = _mm512_add_epi32(_mm512_load_si512((const void *)(clo + 16 * r)),
                                   _mm512_slli_epi32(_mm512_load_si512((const void *)(chi + 16 * r)), 7));
    if (kind == BYTE_Q4_K || kind == BYTE_Q5_K) {
        k45_float(rw, R, blk, isum, acc, TB_CHUNK);
        return;
    }
    const __m512 vda = _mm512_load_ps((const float *)(blk + 64 * 64));
    for (int r = 0; r < R; r++)
        acc[r * TB_CHUNK] = _mm512_add_ps(acc[r * TB_CHUNK], _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(rw[r].d), vda),
                                                                           _mm512_cvtepi32_ps(isum[r])));
}

/* 16 rows' planes against one token block (blk1 NULL) or two: four 64-value chunks, each
 * TDPBSSD adding a chunk's 16 x 16 dot products of one plane to its sums */
static inline __attribute__((always_inline)) void amx_pass(int kind, const amx_planes *pl, const byte_row *rw, int R,
                                                           const uint8_t *blk0, const uint8_t *blk1, __m512 *acc0,
                                                           __m512 *acc1) {
    _Alignas(64) int32_t cb[4][AMX_ROWS * 16];
    _tile_zero(4);
    _tile_zero(5);
    if (blk1) {
        _tile_zero(6);
        _tile_zero(7);
    }
    for (int c = 0; c < 4; c++) {
        _tile_loadd(0, pl->lo[0] + 64 * c, QK_K);
        _tile_loadd(1, pl->hi[0] + 64 * c, QK_K);
        _tile_loadd(2, blk0 + 1024 * c, 64); /* quads 16c .. 16c + 15, 64 bytes each */
        _tile_dpbssd(4, 0, 2);
        _tile_dpbssd(5, 1, 2);
        if (blk1) {
            _tile_loadd(3, blk1 + 1024 * c, 64);
            _tile_dpbssd(6, 0, 3);
            _tile_dpbssd(7, 1, 3);
        }
    }
    _tile_stored(4, cb[0], 64);
    _tile_stored(5, cb[1], 64);
    if (blk1) {
        _tile_stored(6, cb[2], 64);
        _tile_stored(7, cb[3], 64);
    }
    amx_float(kind, rw, R, blk0, cb[0], cb[1], acc0);
    if (blk1) amx_float(kind, rw, R, blk1, cb[2], cb[3], acc1);
}

/* Writes 16 rows' accumulators (row r, lane k: token 16 tb + k) to the token-major output: a full
 * group transposed 16 x 16 in registers, so that each token's 16 rows go out as one 64-byte
 * store (through the 4-row store, each token took four 16-byte stores into a line of its own:
 * 18% of the dense Q4_K walk's samples at 512 tokens); partial groups through the 4-row store. */
static inline void amx_store(__m512 acc[AMX_ROWS][TB_CHUNK], int R, int r0, int tb0, int tb1, int toks, float *out,
                             size_t os) {
    if (R < AMX_ROWS) {
        for (int g = 0; g < R; g += 4) tile_store(&acc[g], R - g < 4 ? R - g : 4, r0 + g, tb0, tb1, toks, out, os);
        return;
    }
    for (int tb = tb0; tb < tb1; tb++) {
        const int nk = toks - tb * 16 < 16 ? toks - tb * 16 : 16;
        __m512 a[16], b[16];
#pragma GCC unroll 8
        for (int i = 0; i < 16; i += 2) { /* rows i, i + 1 interleaved by token pairs */
            a[i] = _mm512_unpacklo_ps(acc[i][tb - tb0], acc[i + 1][tb - tb0]);
            a[i + 1] = _mm512_unpackhi_ps(acc[i][tb - tb0], acc[i + 1][tb - tb0]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < 16; i += 4) { /* 128-bit lane L of b[i + j]: rows i..i+3 of token 4L + j */
            b[i] = _mm512_shuffle_ps(a[i], a[i + 2], 0x44);
            b[i + 1] = _mm512_shuffle_ps(a[i], a[i + 2], 0xEE);
            b[i + 2] = _mm512_shuffle_ps(a[i + 1], a[i + 3], 0x44);
            b[i + 3] = _mm512_shuffle_ps(a[i + 1], a[i + 3], 0xEE);
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) { /* token 4L + j: lane L of b[j], b[4 + j], b[8 + j], b[12 + j] */
            const __m512 lo = _mm512_shuffle_f32x4(b[j], b[4 + j], 0x44), hi = _mm512_shuffle_f32x4(b[j], b[4 + j], 0xEE);
            const __m512 lo2 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0x44),
                         hi2 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0xEE);
            /* lanes of lo: token j rows 0-3, token 4 + j rows 0-3, token j rows 4-7, token 4 + j rows 4-7 */
            const __m512 t[4] = {_mm512_shuffle_f32x4(lo, lo2, 0x88), _mm512_shuffle_f32x4(lo, lo2, 0xDD),
                                 _mm512_shuffle_f32x4(hi, hi2, 0x88), _mm512_shuffle_f32x4(hi, hi2, 0xDD)};
#pragma GCC unroll 4
            for (int L = 0; L < 4; L++)
                if (4 * L + j < nk) _mm512_storeu_ps(out + (size_t)(tb * 16 + 4 * L + j) * os + (size_t)r0, t[L]);
        }
    }
}

/* super-blocks ahead that the walk asks for (rows r0.. of the next group past a row's end) */
#define AMX_PREFETCH_AHEAD 2

static inline __attribute__((always_inline)) void amx_walk(int64_t n, const uint8_t *w, size_t ws, int rows,
                                                           const uint8_t *packed, int toks, float *out, size_t os,
                                                           int kind) {
    const int bytes = byte_kind_bytes(kind);
    const size_t sbp = byte_kind_pack(kind);
    const float factor = byte_kind_factor(kind);
    const int64_t nsb = n / QK_K;
    const int ntb = (toks + 15) / 16;
    _Alignas(64) __m512 acc[AMX_ROWS][TB_CHUNK];
    _Alignas(64) byte_row rw[AMX_ROWS];
    _Alignas(64) amx_planes pl;
    amx_configure();
    const int chunk = kernel_tile_pass_units(ntb, (size_t)nsb * sbp, 2, TB_CHUNK);
    for (int tb0 = 0; tb0 < ntb; tb0 += chunk) {
        const int tb1 = tb0 + chunk < ntb ? tb0 + chunk : ntb;
        for (int r0 = 0; r0 < rows; r0 += AMX_ROWS) {
            const int R = rows - r0 < AMX_ROWS ? rows - r0 : AMX_ROWS;
            for (int r = 0; r < AMX_ROWS; r++)
                for (int t = 0; t < tb1 - tb0; t++) acc[r][t] = _mm512_setzero_ps();
            for (int64_t sb = 0; sb < nsb; sb++) {
                const int64_t ahead = sb + AMX_PREFETCH_AHEAD;
                const int pr = r0 + AMX_ROWS * (int)(ahead / nsb);
                for (int g = 0; g < AMX_ROWS; g += 4)
                    prefetch_next_rows(w, ws, pr + g, rows, (size_t)(ahead % nsb) * (size_t)bytes, bytes);
                for (int r = 0; r < R; r++) byte_decode(kind, w + (size_t)(r0 + r) * ws + (size_t)sb * (size_t)bytes, &rw[r], 0);
                for (int r = R; r < AMX_ROWS; r++) rw[r] = rw[0]; /* padding rows: computed, never stored */
                for (int r = 0; r < AMX_ROWS; r++) amx_split(kind, &rw[r], pl.lo[r], pl.hi[r]);
                for (int tb = tb0; tb < tb1; tb += 2) {
                    const uint8_t *b0 = packed + ((size_t)tb * (size_t)nsb + (size_t)sb) * sbp;
                    amx_pass(kind, &pl, rw, R, b0, tb + 1 < tb1 ? b0 + (size_t)nsb * sbp : NULL, &acc[0][tb - tb0],
                             &acc[0][tb + 1 - tb0]);
                }
            }
            if (factor != 0.0f)
                for (int r = 0; r < R; r++)
                    for (int tb = tb0; tb < tb1; tb++) acc[r][tb - tb0] = _mm512_mul_ps(_mm512_set1_ps(factor), acc[r][tb - tb0]);
            amx_store(acc, R, r0, tb0, tb1, toks, out, os);
        }
    }
    _tile_release();
}

/* the VNNI byte tiles of the same kinds, run where the AMX walk is turned off */
static const kernel_tile *amx_vnni[6];

#define AMX_TILE(name, kind)                                                                                  \
    static __attribute__((noinline)) void name##_walk(int64_t n, const void *w, size_t ws, int rows,          \
                                                      const void *packed, int toks, float *out, size_t os) { \
        amx_walk(n, (const uint8_t *)w, ws, rows, (const uint8_t *)packed, toks, out, os, kind);               \
    }                                                                                                         \
    static void name##_run(int64_t n, const void *w, size_t ws, int rows, const void *packed, int toks,         \
                           float *out, size_t os) {                                                           \
        if (amx_on) name##_walk(n, w, ws, rows, packed, toks, out, os);                                       \
        else amx_vnni[kind]->run(n, w, ws, rows, packed, toks, out, os);                                      \
    }                                                                                                         \
    static kernel_tile name = {NULL, NULL, name##_run, 0, 0};
AMX_TILE(tile_q4_k_amx, BYTE_Q4_K)
AMX_TILE(tile_q5_k_amx, BYTE_Q5_K)
AMX_TILE(tile_q6_k_amx, BYTE_Q6_K)
AMX_TILE(tile_iq2_xs_amx, BYTE_IQ2_XS)
AMX_TILE(tile_iq3_xxs_amx, BYTE_IQ3_XXS)
AMX_TILE(tile_iq4_xs_amx, BYTE_IQ4_XS)

bool kernel_tile_is_amx(const kernel_tile *t) {
    return t == &tile_q4_k_amx || t == &tile_q5_k_amx || t == &tile_q6_k_amx || t == &tile_iq2_xs_amx ||
           t == &tile_iq3_xxs_amx || t == &tile_iq4_xs_amx;
}

void kernels_register_avx512_amx(kernel_set *ks, const kernel_tile *const vnni[6]) {
    const uint32_t types[6] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
                               GGML_TYPE_IQ2_XS, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ4_XS};
    kernel_tile *amx[6] = {&tile_q4_k_amx, &tile_q5_k_amx, &tile_q6_k_amx,
                           &tile_iq2_xs_amx, &tile_iq3_xxs_amx, &tile_iq4_xs_amx};
    for (int i = 0; i < 6; i++) {
        amx_vnni[i] = vnni[i];
        amx[i]->packed_bytes = vnni[i]->packed_bytes; /* the same packed activations */
        amx[i]->pack = vnni[i]->pack;
        amx[i]->min_toks = vnni[i]->min_toks;
        ks->tile[types[i]] = amx[i];
    }
}

#endif
