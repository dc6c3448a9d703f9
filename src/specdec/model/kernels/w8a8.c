// W8A8 matmul for AVX2: int8 weights (one float scale per output row) times activations quantized
// to int8 in blocks of 32 (one float scale per block, as llama.cpp's Q8_0), integer dot products.
//
// Row invariance: each output element is sum over blocks b of (xs[m, b] * (float)dot_i32(w, x)[b]),
// the integer dot is exact, and the float sum runs over b in order; the result of a row never
// depends on which other rows are in the batch or on the thread count.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define BLOCK 32
#define TILE 4

// x (M, K) float32 -> xq (M, K) int8 and xs (M, K / 32) float32; K % 32 == 0
void quantize_rows(const float *x, int64_t M, int64_t K, int8_t *xq, float *xs) {
    int64_t nb = K / BLOCK;
    for (int64_t m = 0; m < M; m++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + m * K + b * BLOCK;
            float amax = 0.0f;
            int nan = 0;
            for (int i = 0; i < BLOCK; i++) amax = fmaxf(amax, fabsf(v[i])), nan |= isnan(v[i]);
            float d = nan ? NAN : amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;  // fmaxf drops a NaN
            xs[m * nb + b] = d;
            for (int i = 0; i < BLOCK; i++) xq[m * K + b * BLOCK + i] = (int8_t)lrintf(v[i] * inv);
        }
    }
}

static inline float hsum_ps(__m256 s) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

static inline __m256i dot32(__m256i w, __m256i x) {
    // sum of w * x in 8 int32 lanes (lane i: products 4i..4i+3) as |x| . (w with x's sign); |w|, |x| <= 127
    // so maddubs's int16 pairs cannot saturate, and vpdpbusd (AVX512-VNNI, where built) gives the same
    // integers in one instruction
    __m256i ax = _mm256_sign_epi8(x, x);
    __m256i sw = _mm256_sign_epi8(w, x);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sw);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sw), _mm256_set1_epi16(1));
#endif
}

void w8a8_mm(const int8_t *xq, const float *xs, int64_t M, int64_t K, const int8_t *w, const float *scale,
             const float *bias, float *y, int64_t N, int threads) {
    int64_t nb = K / BLOCK;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++) {
        const int8_t *wn = w + n * K;
        for (int64_t m0 = 0; m0 < M; m0 += TILE) {
            int r = M - m0 < TILE ? (int)(M - m0) : TILE;
            __m256 acc[TILE];
            for (int i = 0; i < TILE; i++) acc[i] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)(wn + b * BLOCK));
                for (int i = 0; i < r; i++) {
                    const int64_t m = m0 + i;
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + m * K + b * BLOCK));
                    acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(xs[m * nb + b]), _mm256_cvtepi32_ps(dot32(wv, xv)), acc[i]);
                }
            }
            for (int i = 0; i < r; i++) y[(m0 + i) * N + n] = hsum_ps(acc[i]) * scale[n] + (bias ? bias[n] : 0.0f);
        }
    }
}
