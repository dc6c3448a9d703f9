// The small row-wise ops of a decode step in one call each, where torch spends ~5-20 us per call on a
// few thousand floats (its CPU rms_norm is several ops): RMS norm, the rotary embedding, the KV-cache write,
// the MLP's activation. Each output row is a function of its own input row only, in a fixed order, so a
// k-token forward stays bitwise k one-token forwards. Compiled without -ffast-math and with -ffp-contract=off.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define F16_OVERFLOW 65520.0f  // the smallest magnitude that rounds to float16's infinity (65504 is its largest)

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
// nearest float16, ties to even, as torch's conversion does (F16C). Returns how many values were too large
// for it (|x| >= 65520, stored as inf), which the caller refuses; 0 for a float32 cache.
int64_t store_rows(const float *src, int64_t T, int64_t nkv, int64_t hd, void *layer, int64_t slot,
                   int64_t max_len, int64_t start, int half) {
    int64_t over = 0;
    const __m256 limit = _mm256_set1_ps(F16_OVERFLOW), sign = _mm256_set1_ps(-0.0f);
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
            for (; i + 8 <= hd; i += 8) {
                const __m256 x = _mm256_loadu_ps(s + i);
                over += __builtin_popcount((unsigned)_mm256_movemask_ps(
                    _mm256_cmp_ps(_mm256_andnot_ps(sign, x), limit, _CMP_GE_OQ)));
                _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
            }
            for (; i < hd; i++) {
                over += fabsf(s[i]) >= F16_OVERFLOW;
                d[i] = _cvtss_sh(s[i], _MM_FROUND_TO_NEAREST_INT);
            }
        }
    return over;
}

// exp(x) in 8 lanes: x = n ln2 + r, |r| <= ln2 / 2 (Cody-Waite: ln2 in two parts, n ln2's high part
// exact), exp(r) by its Taylor series to r^7 (truncation under 6e-9), 2^n as two powers of two so that
// n from -150 to 128 scales without a special case: overflow gives inf, underflow 0 (or a subnormal);
// NaN stays NaN. (attend.c's softmax has an exp of its own, for x <= 0 only: its bits are attention's.)
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-104.0f), x));  // NaN: the 2nd operand
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_cvtps_epi32(n), e1 = _mm256_srai_epi32(e, 1), e2 = _mm256_sub_epi32(e, e1);
    const __m256i bias = _mm256_set1_epi32(127);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, bias), 23)));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, bias), 23)));
}

// act(g) * u in 8 lanes, with act(g) = g * sigmoid(z) = g / (1 + exp(-z)): SiLU takes z = g; GELU's tanh
// form, 0.5 g (1 + tanh(y)) with y = sqrt(2 / pi) (g + 0.044715 g^3), is the same with z = 2y (no
// cancellation in 1 + tanh). act(g) is rounded, then multiplied by u, as torch's act(gate) * up.
static inline __m256 act_mul8(__m256 g, __m256 u, int gelu) {
    __m256 z = g;
    if (gelu) {
        const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
        z = _mm256_mul_ps(_mm256_set1_ps(1.5957691216057308f),  // 2 sqrt(2 / pi)
                          _mm256_add_ps(g, _mm256_mul_ps(_mm256_set1_ps(0.044715f), cube)));
    }
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), z));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

// The MLP's act(gate) * up: out (M, I) from gate and up rows of I floats at row strides gs and us
// (step.c and the per-op path pass the two halves of one gate_up row). kind 0: SiLU, 1: GELU (tanh).
// Each value is a function of its own gate and up values only: a row's tail goes through the same
// 8-lane code, padded, so no value's bits depend on where it sits.
void act_mul_rows(const float *gate, const float *up, int64_t M, int64_t I, int64_t gs, int64_t us, int kind,
                  float *out) {
    for (int64_t m = 0; m < M; m++) {
        const float *g = gate + m * gs, *u = up + m * us;
        float *o = out + m * I;
        int64_t i = 0;
        for (; i + 8 <= I; i += 8)
            _mm256_storeu_ps(o + i, act_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i), kind));
        if (i < I) {
            float gt[8] = {0}, ut[8] = {0}, ot[8];
            memcpy(gt, g + i, sizeof(float) * (size_t)(I - i));
            memcpy(ut, u + i, sizeof(float) * (size_t)(I - i));
            _mm256_storeu_ps(ot, act_mul8(_mm256_loadu_ps(gt), _mm256_loadu_ps(ut), kind));
            memcpy(o + i, ot, sizeof(float) * (size_t)(I - i));
        }
    }
}
