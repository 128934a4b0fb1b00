/* The CUDA backend's codec functions (backends/cuda/cuda_quant.cuh), run on the host against the
 * CPU references: needs nvcc but no GPU, so CI runs it.
 *
 * For every device weight type, on random rows quantized by the CPU encoder:
 *   - dequant_value gives exactly the CPU decoder's floats;
 *   - the device's dot product recipe (chunks of int8 words, integer group scales and mins,
 *     one float step per block, blocks summed in order) reproduces the CPU dot product: bit
 *     for bit where the float steps are the same (all but Q4_0, whose reference associates its
 *     product differently), else within a few ulp;
 *   - the types the tiled kernels treat as scaled per 32 values (scale_per_32) give both
 *     16-value groups of every chunk the same scale and min.
 * The bit layouts are the part of a kernel most likely to be wrong and the hardest to see on a
 * GPU: this pins them down everywhere. */
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backends/cuda/cuda_quant.cuh"

extern "C" {
#include "formats/quant.h"
}

static int failures;
static uint64_t rng = 88172645463325252ull;
static float frand() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static int dot4(uint32_t a, uint32_t b) {
    int s = 0;
    for (int i = 0; i < 4; i++) s += (int8_t)(a >> (8 * i)) * (int8_t)(b >> (8 * i));
    return s;
}

template <int T> static void check(const qtables *tb) {
    constexpr int B = qtraits<T>::B, BYTES = qtraits<T>::BYTES;
    const int64_t K = 2048;
    const int nb = (int)(K / B);
    const quant_traits *qt = quant_traits_of(T);
    const quant_traits *at = quant_traits_of(qt->act_type);
    std::vector<float> x(K), a(K), deq(K);
    for (auto &v : x) v = frand() * 0.7f + frand() * frand();
    for (auto &v : a) v = frand() + 0.5f * frand();
    std::vector<uint8_t> row(quant_row_bytes(T, K) + 16), act(quant_row_bytes(qt->act_type, K) + 16);
    qt->quantize(x.data(), row.data(), K);
    at->quantize(a.data(), act.data(), K);
    qt->dequantize(row.data(), deq.data(), K);
    int bad = 0;
    for (int64_t i = 0; i < K; i++) {
        const float v = dequant_value<T>(row.data(), i, tb);
        if (memcmp(&v, &deq[i], 4) != 0 && bad++ < 3)
            printf("  %s value %lld: device %.9g cpu %.9g\n", quant_type_name(T), (long long)i, v, deq[i]);
    }
    /* the device recipe, blocks in order */
    float acc = 0.0f;
    int shared_bad = 0;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row.data() + (size_t)b * BYTES;
        float fw, fm;
        dfloats<T>(blk, fw, fm);
        int isum = 0, msum = 0;
        float da;
        const int8_t *aq;
        const uint8_t *ab;
        if (B == 256) {
            ab = act.data() + (size_t)b * 292;
            memcpy(&da, ab, 4);
            aq = (const int8_t *)(ab + 4);
        } else {
            ab = act.data() + (size_t)b * 34;
            uint16_t h;
            memcpy(&h, ab, 2);
            da = quant_f16_to_f32(h);
            aq = (const int8_t *)(ab + 2);
        }
        for (int c = 0; c < B / 32; c++) {
            uint32_t q[8];
            int sc[2], mn[2];
            dchunk<T>(blk, c, tb, q, sc, mn);
            /* the tiled kernels take such chunks in one MMA with one scale */
            if (scale_per_32<T>::value && (sc[0] != sc[1] || mn[0] != mn[1]) && shared_bad++ < 3)
                printf("  %s block %d chunk %d: scales %d/%d mins %d/%d differ (scale_per_32)\n",
                       quant_type_name(T), b, c, sc[0], sc[1], mn[0], mn[1]);
            int p[2] = {0, 0};
            for (int w = 0; w < 8; w++) {
                uint32_t av;
                memcpy(&av, aq + 32 * c + 4 * w, 4);
                p[w / 4] += dot4(q[w], av);
            }
            isum += sc[0] * p[0] + sc[1] * p[1];
            if (qtraits<T>::MIN) {
                int16_t bs[2];
                memcpy(bs, ab + 260 + 2 * (2 * c), 4);
                msum += mn[0] * bs[0] + mn[1] * bs[1];
            }
        }
        acc = q_add(acc, block_term<T>(fw, fm, da, isum, msum));
    }
    const float ref = qt->dot(K, row.data(), act.data());
    const bool exact = memcmp(&acc, &ref, 4) == 0;
    const double rel = fabs((double)acc - ref) / (fabs(ref) > 1e-6 ? fabs(ref) : 1e-6);
    const bool ok_dot = T == QT_Q4_0 ? rel < 1e-6 : exact;
    printf("%-8s decode %s, dot %s (device %.9g cpu %.9g)%s\n", quant_type_name(T),
           bad ? "DIFFERS" : "exact", exact ? "exact" : ok_dot ? "within 1e-6" : "DIFFERS", acc, ref,
           scale_per_32<T>::value ? (shared_bad ? ", scale per 32: NO" : ", scale per 32: yes") : "");
    if (bad || !ok_dot || shared_bad) failures++;
}

int main() {
    qtables tb;
    memcpy(tb.kv_iq4nl, quant_kvalues_iq4nl, 16);
    memcpy(tb.kv_mxfp4, quant_kvalues_mxfp4, 16);
    memcpy(tb.ksigns, quant_ksigns_iq2xs, 128);
    memcpy(tb.iq2xxs, quant_iq2xxs_grid, sizeof tb.iq2xxs);
    memcpy(tb.iq2xs, quant_iq2xs_grid, sizeof tb.iq2xs);
    memcpy(tb.iq3xxs, quant_iq3xxs_grid, sizeof tb.iq3xxs);
#define CHECK_T(T) check<T>(&tb);
    CUDA_QTYPES(CHECK_T)
#undef CHECK_T
    if (failures) printf("%d type(s) failed\n", failures);
    return failures ? 1 : 0;
}
