/* Q6_K_R16: sixteen Q6_K rows interleaved so that a kernel keeps row r in lane r of its
 * vectors (kernels_avx512_q6k_r16.c), made once at load time.
 *
 * Why: a verification pass of speculative decoding multiplies the output head by 2-4 tokens.
 * Stored row by row, each token's sums of a row end in a reduction across the lanes of a
 * vector, which made the head's 3-token product compute-bound at twice its one-token time
 * (bench/results/2026-12-02-mtp-vocab.md). With the rows interleaved, a vpdpbusd of one
 * broadcast 4-value activation quad against a vector of 16 rows' codes leaves each row's sum in
 * its own lane: no reduction, the codes unpacked once for every token.
 *
 * A group is 16 rows x n values (n a multiple of 256) in the bytes of 16 Q6_K rows (210 per 256
 * values), super-block by super-block; super-block b of the group, 3,360 bytes at 3360 * b:
 *   [0, 2048)     32 vectors L[k] of 64 bytes: byte 4r + i holds the low four bits of row r's
 *                 code of value 4(2k) + i (low nibble) and of value 4(2k + 1) + i (high nibble);
 *   [2048, 3072)  16 vectors H[s]: byte 4r + i holds the top two bits of row r's codes of
 *                 values 16s + 4j + i, j = 0..3, at bits 2j;
 *   [3072, 3328)  the sub-block scales, byte 16s + r: row r's scale of sub-block s (int8);
 *   [3328, 3360)  the rows' d (f16), row r at 2r.
 * Codes are Q6_K's unsigned q + 32 (0..63); sub-block s holds values 16s..16s + 15, the quads
 * 4s..4s + 3, so it reads L[2s], L[2s + 1] and H[s]. */
#include <string.h>

#include "formats/quant.h"

#define QK 256
#define R QUANT_R16_ROWS
#define SB_BYTES (R * 210)

void quant_repack_q6_k_r16(const void *rows, size_t row_bytes, void *group, int64_t n) {
    uint8_t *g = group;
    for (int64_t b = 0; b < n / QK; b++, g += SB_BYTES) {
        memset(g, 0, SB_BYTES);
        for (int r = 0; r < R; r++) {
            const uint8_t *x = (const uint8_t *)rows + (size_t)r * row_bytes + (size_t)b * 210;
            uint8_t c[QK];
            quant_q6_k_codes(x, c);
            for (int v = 0; v < QK; v++) {
                const int quad = v / 4, i = v % 4;
                g[64 * (quad / 2) + 4 * r + i] |= (uint8_t)((c[v] & 0xf) << (4 * (quad % 2)));
                g[2048 + 64 * (v / 16) + 4 * r + i] |= (uint8_t)((c[v] >> 4) << (2 * (quad % 4)));
            }
            for (int s = 0; s < 16; s++) g[3072 + 16 * s + r] = x[192 + s];
            memcpy(g + 3328 + 2 * r, x + 208, 2);
        }
    }
}

/* The reference: quant_dot_q6_k's steps per row (exact integer sums per super-block, then
 * sum + (d * da) * isum), the codes read from the group. */
void quant_dot_q6_k_r16(int64_t n, const void *group, const void *a, float out[R]) {
    const uint8_t *g = group, *y = a;
    float sum[R] = {0};
    for (int64_t b = 0; b < n / QK; b++, g += SB_BYTES, y += 292) {
        const int8_t *q8 = (const int8_t *)(y + 4);
        float da;
        memcpy(&da, y, 4);
        for (int r = 0; r < R; r++) {
            int32_t isum = 0;
            for (int s = 0; s < 16; s++) {
                int32_t part = 0;
                for (int v = 16 * s; v < 16 * s + 16; v++) {
                    const int quad = v / 4, i = v % 4;
                    const int lo = (g[64 * (quad / 2) + 4 * r + i] >> (4 * (quad % 2))) & 0xf;
                    const int hi = (g[2048 + 64 * s + 4 * r + i] >> (2 * (quad % 4))) & 3;
                    part += q8[v] * ((lo | (hi << 4)) - 32);
                }
                isum += (int8_t)g[3072 + 16 * s + r] * part;
            }
            uint16_t d16;
            memcpy(&d16, g + 3328 + 2 * r, 2);
            sum[r] += (quant_f16_to_f32(d16) * da) * (float)isum;
        }
    }
    memcpy(out, sum, sizeof sum);
}
