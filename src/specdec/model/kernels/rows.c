// The small row-wise ops of a decode step in one call each, where torch spends ~5-20 us per call on a
// few thousand floats (its CPU rms_norm is several ops): RMS norm, the rotary embedding, the KV-cache write.
// Each output row is a function of its own input row only, in a fixed order, so a k-token forward
// stays bitwise k one-token forwards. Compiled without -ffast-math and with -ffp-contract=off.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float hsum_ps(__m256 s) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

// y[m] = (x[m] * 1 / sqrt(mean(x[m]^2) + eps)) * w for M rows of n floats (transformers' order: the
// normed row, then the weight; w NULL: no weight). The squares are summed in 8 lanes, then across.
void rms_norm_rows(const float *x, const float *w, int64_t M, int64_t n, float eps, float *y) {
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * n;
        float *ym = y + m * n;
        __m256 acc = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 8 <= n; k += 8) {
            const __m256 v = _mm256_loadu_ps(xm + k);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
        }
        float ss = hsum_ps(acc);
        for (; k < n; k++) ss += xm[k] * xm[k];
        const float r = 1.0f / sqrtf(ss / (float)n + eps);
        const __m256 rv = _mm256_set1_ps(r);
        k = 0;
        for (; k + 8 <= n; k += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xm + k), rv);
            if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + k));
            _mm256_storeu_ps(ym + k, v);
        }
        for (; k < n; k++) ym[k] = w ? (xm[k] * r) * w[k] : xm[k] * r;
    }
}

// x (N, heads, hd) rotated in the rotate-half layout by its row's cos, sin (N, hd):
// y = x * cos + [-x[hd/2:], x[:hd/2]] * sin, two products and a sum per value, as torch computes it.
void rope_rows(const float *x, const float *cos, const float *sin, int64_t N, int64_t heads, int64_t hd, float *y) {
    const int64_t half = hd / 2;
    for (int64_t t = 0; t < N; t++) {
        const float *c = cos + t * hd, *s = sin + t * hd;
        for (int64_t h = 0; h < heads; h++) {
            const float *xv = x + (t * heads + h) * hd;
            float *yv = y + (t * heads + h) * hd;
            for (int64_t i = 0; i < half; i++) {
                yv[i] = xv[i] * c[i] + (-xv[i + half]) * s[i];
                yv[i + half] = xv[i + half] * c[i + half] + xv[i] * s[i + half];
            }
        }
    }
}

// New keys or values (T, nkv, hd) into one layer of the cache, (slots, nkv, max_len, hd), at slot
// `slot`, offsets start .. start + T - 1: what cache.k[layer, slot, :, start:start + T] = new.transpose(0, 1)
// does, one call instead of a strided torch copy. A float16 cache (half) takes each value rounded to the
// nearest float16, ties to even, as torch's conversion does (F16C).
void store_rows(const float *src, int64_t T, int64_t nkv, int64_t hd, void *layer, int64_t slot, int64_t max_len,
                int64_t start, int half) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < nkv; h++) {
            const float *s = src + (t * nkv + h) * hd;
            const int64_t at = ((slot * nkv + h) * max_len + start + t) * hd;
            if (!half) {
                memcpy((float *)layer + at, s, sizeof(float) * (size_t)hd);
                continue;
            }
            uint16_t *d = (uint16_t *)layer + at;
            int64_t i = 0;
            for (; i + 8 <= hd; i += 8)
                _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
            for (; i < hd; i++) d[i] = _cvtss_sh(s[i], _MM_FROUND_TO_NEAREST_INT);
        }
}
