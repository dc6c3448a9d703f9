// The activations of a gguf_linear call as its dot products read them: quantized to int8 in blocks of 32 with
// a float scale each (Q8_0's layout, as w8a8.c), then, where K >= 256, interleaved as the weights' groups are.
#include "gguf_blocks.h"

// x (M, K) float32 -> xq (M, K) int8, xs (M, K / 32) scales and xsum (M, K / 32) = xs * sum(xq): per block of
// 32, d = max|v| / 127 and q = v * (1 / d) rounded to nearest even (cvtps, as lrintf in the default rounding
// mode), so the same bits as a scalar loop
void quantize_rows_sums(const float *x, int64_t M, int64_t K, int8_t *xq, float *xs, float *xsum) {
    const int64_t nb = K / BLOCK;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // packs works within 128-bit lanes
    for (int64_t m = 0; m < M; m++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + m * K + b * BLOCK;
            __m256 f[4], amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                f[i] = _mm256_loadu_ps(v + 8 * i);
                amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, f[i]));
                nan = _mm256_or_ps(nan, _mm256_cmp_ps(f[i], f[i], _CMP_UNORD_Q));  // max drops a NaN
            }
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            // a NaN activation makes the block's scale NaN, so that it reaches every output it feeds, as in a
            // float matmul (its q alone would be -128: finite garbage)
            const float d = _mm256_movemask_ps(nan) ? NAN : _mm_cvtss_f32(h) / 127.0f;
            const float inv = d > 0.0f ? 1.0f / d : 0.0f;
            __m256i q[4];
            for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(f[i], _mm256_set1_ps(inv)));
            const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(xq + m * K + b * BLOCK), _mm256_permutevar8x32_epi32(bytes, order));
            xs[m * nb + b] = d;
            xsum[m * nb + b] = d * hsum_ps(_mm256_cvtepi32_ps(sum));
        }
    }
}

// xq (M, K) in blocks of 32 -> xi (M, K): each whole 256 values in the interleaved order, step t's 32 bytes at
// 64 (t % 4) + 32 (t / 4), so that steps t and t + 4 (one load of the weights' nibbles) lie side by side
// (STEP_PAIRS, gguf_linear.c): xi[64 (t % 4) + 32 (t / 4) + 4l + e] = xq[32l + 4t + e] (the rest not written);
// s16 (M, K / 256, 16) int32: each sub-block's sum of its first 16 values, then of its last 16 (what the types'
// offsets take off). The transpose is one of 8 x 8 4-byte words in registers, and the sums come from the
// transposed steps: lane l of step t's word sums (maddubs by ones, then madd) is the sum of values 4t..4t+3 of
// sub-block l, so steps 0..3 add up to the first 16 values' sum and 4..7 to the last 16's. Exact integers; a
// scalar loop took ~4 us a call at four rows of K = 8960 (qwen2.5-coder-1.5b's ffn_down).
void interleave_rows(const int8_t *xq, int64_t M, int64_t K, int8_t *xi, int32_t *s16) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t m = 0; m < M; m++) {
        for (int64_t i = 0; i < K / 256; i++) {
            const int8_t *src = xq + m * K + i * 256;
            int8_t *dst = xi + m * K + i * 256;
            __m256i r[8], a[8], b[8];
            for (int l = 0; l < 8; l++) r[l] = load32((const uint8_t *)(src + 32 * l));  // row l: sub-block l's 8 words
            for (int l = 0; l < 8; l += 2) {  // words (l, t) and (l + 1, t) side by side
                a[l] = _mm256_unpacklo_epi32(r[l], r[l + 1]);      // t = 0, 1 | 4, 5
                a[l + 1] = _mm256_unpackhi_epi32(r[l], r[l + 1]);  // t = 2, 3 | 6, 7
            }
            for (int h = 0; h < 2; h++) {  // sub-blocks 4h..4h + 3: 4 words of each step
                b[4 * h + 0] = _mm256_unpacklo_epi64(a[4 * h], a[4 * h + 2]);      // t = 0 | 4
                b[4 * h + 1] = _mm256_unpackhi_epi64(a[4 * h], a[4 * h + 2]);      // t = 1 | 5
                b[4 * h + 2] = _mm256_unpacklo_epi64(a[4 * h + 1], a[4 * h + 3]);  // t = 2 | 6
                b[4 * h + 3] = _mm256_unpackhi_epi64(a[4 * h + 1], a[4 * h + 3]);  // t = 3 | 7
            }
            __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
            for (int t = 0; t < 4; t++) {
                const __m256i first = _mm256_permute2x128_si256(b[t], b[4 + t], 0x20);  // step t: sub-blocks 0..7
                const __m256i second = _mm256_permute2x128_si256(b[t], b[4 + t], 0x31);  // step t + 4
                store32((uint8_t *)(dst + 64 * t), first);
                store32((uint8_t *)(dst + 64 * t + 32), second);
                lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, first), ones16));
                hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, second), ones16));
            }
            int32_t *sums = s16 + (m * (K / 256) + i) * 16;
            _mm256_storeu_si256((__m256i *)sums, lo);
            _mm256_storeu_si256((__m256i *)(sums + 8), hi);
        }
    }
}
