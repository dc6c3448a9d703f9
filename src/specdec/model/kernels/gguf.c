// Matmul over a GGUF file's own quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) for
// AVX2: the weights stay as the file stores them and are unpacked inside the kernel; activations are
// quantized to int8 in blocks of 32 with a float scale each (Q8_0's layout, as w8a8.c), and each 32
// values contribute xs * a * sum(q * xq) + c * xs * sum(xq), where the file's block gives w = a * q + c
// (a per 16 values for Q6_K) and the integer sums are exact. llama.cpp quantizes the activations of
// K-quant weights with one scale per 256 values (Q8_K), which is faster for 4-row verify batches but
// measured 5x the KL from the file's own model on qwen2.5-coder-1.5b; specdec keeps blocks of 32.
//
// The integer dots take one vpdpbusd each where AVX512-VNNI is compiled in (model/kernels builds it so
// where the CPU has it), else maddubs + madd: the same integers, so the same bits on either build.
//
// Row invariance: each output element is one function of its weight row and its activation row,
// summed in one fixed order, so its bits do not depend on the other rows of the batch or on the
// thread count.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 32

// ggml type ids
enum { F32 = 0, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

// x (M, K) float32 -> xq (M, K) int8, xs (M, K / 32) scales and xsum (M, K / 32) = xs * sum(xq)
void quantize_rows_sums(const float *x, int64_t M, int64_t K, int8_t *xq, float *xs, float *xsum) {
    int64_t nb = K / BLOCK;
    for (int64_t m = 0; m < M; m++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + m * K + b * BLOCK;
            int8_t *q = xq + m * K + b * BLOCK;
            float amax = 0.0f;
            for (int i = 0; i < BLOCK; i++) amax = fmaxf(amax, fabsf(v[i]));
            float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
            int sum = 0;
            for (int i = 0; i < BLOCK; i++) {
                q[i] = (int8_t)lrintf(v[i] * inv);
                sum += q[i];
            }
            xs[m * nb + b] = d;
            xsum[m * nb + b] = d * (float)sum;
        }
    }
}

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline float hsum_ps(__m256 s) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

// 16 bytes -> 32 values: the low nibbles (values 0..15), then the high nibbles (16..31)
static inline __m256i nibbles32(const uint8_t *qs) {
    __m128i b = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

// byte i = 0x10 where bit i of `bits` is set, else 0
static inline __m256i bits32(uint32_t bits) {
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                    _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                      0x0101010101010101, 0x0000000000000000));
    const __m256i mask = _mm256_set1_epi64x((int64_t)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, mask), mask), _mm256_set1_epi8(0x10));
}

// Block b of a legacy-type weight row -> its 32 values q and w = a0 * q + c (q in 0..31 for the types
// with a min, Q4_1 and Q5_1; signed otherwise)
typedef struct {
    __m256i q;
    float a0, c;
} Unpacked;

static inline Unpacked unpack(int type, const uint8_t *row, int64_t b) {
    Unpacked u;
    u.c = 0.0f;
    switch (type) {
    case Q8_0: {
        const uint8_t *p = row + b * 34;
        u.a0 = f16(p);
        u.q = _mm256_loadu_si256((const __m256i *)(p + 2));
        break;
    }
    case Q4_0: {
        const uint8_t *p = row + b * 18;
        u.a0 = f16(p);
        u.q = _mm256_sub_epi8(nibbles32(p + 2), _mm256_set1_epi8(8));
        break;
    }
    case Q4_1: {
        const uint8_t *p = row + b * 20;
        u.a0 = f16(p);
        u.c = f16(p + 2);
        u.q = nibbles32(p + 4);
        break;
    }
    case Q5_0: {
        const uint8_t *p = row + b * 22;
        uint32_t qh;
        memcpy(&qh, p + 2, 4);
        u.a0 = f16(p);
        u.q = _mm256_sub_epi8(_mm256_or_si256(nibbles32(p + 6), bits32(qh)), _mm256_set1_epi8(16));
        break;
    }
    default: {  // Q5_1
        const uint8_t *p = row + b * 24;
        uint32_t qh;
        memcpy(&qh, p + 4, 4);
        u.a0 = f16(p);
        u.c = f16(p + 2);
        u.q = _mm256_or_si256(nibbles32(p + 8), bits32(qh));
        break;
    }
    }
    return u;
}

static inline __m256i low4(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0xF)); }

// u (32 x uint8) . s (32 x int8) -> 8 int32 lanes, lane i = the sum of products 4i..4i+3, exactly: one
// vpdpbusd where AVX512-VNNI is compiled in, else maddubs (int16 pairs; callers keep |u * s| pairs below
// 2^15) and madd with ones. Both give the same integers, so the same bits follow.
static inline __m256i dot4(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// lane k of v in every lane
static inline __m256 lane(__m256 v, int k) { return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(k)); }

// Every dot below takes one weight row and R <= TILE activation rows, unpacks each block of the weight
// once for all R, and computes each row's sum in the same order whatever R is. They are inlined with R
// constant (dot_rows), so that the accumulators stay in registers.
#define TILE 4

// One weight row of a legacy type (blocks of 32, each with its own scale) . R activation rows
static inline __attribute__((always_inline)) void dot_legacy(int type, const uint8_t *row, int64_t nb, int R, const int8_t *xq, int64_t K,
                       const float *xs, const float *xsum, float *out) {
    const int has_min = type == Q4_1 || type == Q5_1;
    __m256 acc[TILE];
    float mins[TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps(), mins[r] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const Unpacked u = unpack(type, row, b);
        const __m256i aq = _mm256_abs_epi8(u.q);
        for (int r = 0; r < R; r++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + r * K + b * BLOCK));
            // unsigned values (with a min) go into dot4 as they are; signed ones as |q| * (x with q's
            // sign): |q| <= 128, |x| <= 127, so maddubs's int16 pairs cannot saturate
            const __m256i prod = has_min ? dot4(u.q, xv) : dot4(aq, _mm256_sign_epi8(xv, u.q));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod),
                                     _mm256_set1_ps(u.a0 * xs[r * nb + b]), acc[r]);
            if (has_min) mins[r] += u.c * xsum[r * nb + b];
        }
    }
    for (int r = 0; r < R; r++) out[r] = hsum_ps(acc[r]) + mins[r];
}

// The 6-bit scales and mins of a Q4_K / Q5_K super-block's 12 bytes: sc[j] = bytes 0..7, m[j] = bytes 8..15
static inline void scales_mins_k4(const uint8_t *packed, uint8_t out[16]) {
    uint32_t u[4];
    memcpy(u, packed, 12);
    const uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
    u[3] = ((u[2] >> 4) & four) | (((u[1] >> 6) & two) << 4);  // m[4..7]
    const uint32_t m03 = u[1] & six;                             // m[0..3]
    u[1] = (u[2] & four) | (((u[0] >> 6) & two) << 4);          // sc[4..7]
    u[2] = m03;
    u[0] &= six;                                                 // sc[0..3]
    memcpy(out, u, 16);
}

// One Q4_K / Q5_K row (nsb super-blocks: d, dmin, scales[12], (Q5_K: qh[32]), qs[128]) . R activation
// rows: sub-block s contributes d * sc_s * xs_s * q.x - dmin * m_s * xs_s * sum(x)
static inline __attribute__((always_inline)) void dot_q45k(int type, const uint8_t *row, int64_t nsb, int R,
                                                         const int8_t *xq, int64_t K, const float *xs,
                                                         const float *xsum, float *out) {
    const int bytes = type == Q4_K ? 144 : 176;
    const int64_t nb = K / BLOCK;
    const __m256i one = _mm256_set1_epi8(1);
    __m256 acc[TILE], accm[TILE];
    for (int r = 0; r < R; r++) acc[r] = accm[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t *p = row + i * bytes;
        const uint8_t *qs = p + (type == Q4_K ? 16 : 48);
        const __m256i qh = type == Q5_K ? _mm256_loadu_si256((const __m256i *)(p + 16)) : _mm256_setzero_si256();
        uint8_t sm[16];
        scales_mins_k4(p + 4, sm);
        const float d = f16(p), dmin = f16(p + 2);
        const __m256 mins = _mm256_mul_ps(_mm256_set1_ps(-dmin),
                                          _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sm + 8)))));
        // a_s = d * sc_s for the 8 sub-blocks, and per row a_s * xs_s (the float factor of sub-block s)
        const __m256 a = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sm))));
        __m256 f[TILE];
        for (int r = 0; r < R; r++) f[r] = _mm256_mul_ps(a, _mm256_loadu_ps(xs + r * nb + i * 8));
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i lo = low4(q), hi = low4(_mm256_srli_epi16(q, 4));
            if (type == Q5_K) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j)), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j + 1)), one), 4));
            }
            for (int r = 0; r < R; r++) {
                const int8_t *x = xq + r * K + i * 256 + 64 * j;
                const __m256i plo = dot4(lo, _mm256_loadu_si256((const __m256i *)x));
                const __m256i phi = dot4(hi, _mm256_loadu_si256((const __m256i *)(x + 32)));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(plo), lane(f[r], 2 * j), acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(phi), lane(f[r], 2 * j + 1), acc[r]);
            }
        }
        for (int r = 0; r < R; r++)  // the 8 sub-blocks' mins against their activation sums, lane by lane
            accm[r] = _mm256_fmadd_ps(mins, _mm256_loadu_ps(xsum + r * nb + i * 8), accm[r]);
    }
    for (int r = 0; r < R; r++) out[r] = hsum_ps(acc[r]) + hsum_ps(accm[r]);
}

// One Q6_K row (ql[128], qh[64], scales[16] int8, d) . R activation rows: 32-value group s contributes
// d * xs_s * (sc * (q - 32)).x with a scale per 16 values and q in 0..63
static inline __attribute__((always_inline)) void dot_q6k(const uint8_t *row, int64_t nsb, int R,
                                                        const int8_t *xq, int64_t K, const float *xs, float *out) {
    const int64_t nb = K / BLOCK;
    __m256 acc[TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t *p = row + i * 210;
        const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 192)));  // 16 x int16
        const __m256 d = _mm256_set1_ps(f16(p + 208));
        __m256 f[TILE];  // d * xs per 32-value group, per row
        for (int r = 0; r < R; r++) f[r] = _mm256_mul_ps(d, _mm256_loadu_ps(xs + r * nb + i * 8));
        for (int h = 0; h < 2; h++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(p + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32));
            for (int g = 0; g < 4; g++) {
                __m256i lo = (g & 1) ? ql1 : ql0;
                lo = low4((g >> 1) ? _mm256_srli_epi16(lo, 4) : lo);
                const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
                const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
                const __m256i aq = _mm256_abs_epi8(q);
                // [sc[2s] x 8 | sc[2s + 1] x 8], s = 4h + g: the pair of int16 scales in every lane, then
                // the first of it in the low half and the second in the high half
                const __m256i scv = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(scales, _mm256_set1_epi32(4 * h + g)),
                                                        _mm256_set_epi64x(0x0302030203020302, 0x0302030203020302,
                                                                          0x0100010001000100, 0x0100010001000100));
                for (int r = 0; r < R; r++) {
                    const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + r * K + i * 256 + 128 * h + 32 * g));
                    // |q| <= 32 and |x| <= 127: the int16 pairs and the scaled int32 lanes cannot overflow
                    const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(xv, q)), scv);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), lane(f[r], 4 * h + g), acc[r]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = hsum_ps(acc[r]);
}

static inline __attribute__((always_inline)) void dot_rows(int type, const uint8_t *row, int64_t nb, int R,
                                                         const int8_t *x, int64_t K, const float *xs,
                                                         const float *sums, float *out) {
    if (type == Q6_K)
        dot_q6k(row, nb, R, x, K, xs, out);
    else if (type == Q4_K || type == Q5_K)
        dot_q45k(type, row, nb, R, x, K, xs, sums, out);
    else
        dot_legacy(type, row, nb, R, x, K, xs, sums, out);
}

// Output column n for all M activation rows: weight row `row` (of `type`; F32: float32 values) against x,
// or its quantized form (xq, xs, xsum) for the block types; y[m * ldy] = dot + b.
static void column(int type, const uint8_t *row, int64_t K, int64_t M, const float *x, const int8_t *xq,
                   const float *xs, const float *xsum, float b, float *y, int64_t ldy) {
    if (type == F32) {
        const float *wn = (const float *)row;
        for (int64_t m = 0; m < M; m++) {
            const float *xm = x + m * K;
            __m256 acc = _mm256_setzero_ps();
            int64_t k = 0;
            for (; k + 8 <= K; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(wn + k), _mm256_loadu_ps(xm + k), acc);
            float s = hsum_ps(acc);
            for (; k < K; k++) s += wn[k] * xm[k];
            y[m * ldy] = s + b;
        }
        return;
    }
    const int kquant = type == Q4_K || type == Q5_K || type == Q6_K;
    const int64_t nb = kquant ? K / 256 : K / BLOCK;  // blocks (super-blocks) per weight row
    for (int64_t m0 = 0; m0 < M; m0 += TILE) {
        const int R = M - m0 < TILE ? (int)(M - m0) : TILE;
        const int8_t *xr = xq + m0 * K;
        const float *s = xs + m0 * (K / BLOCK), *sums = xsum + m0 * (K / BLOCK);
        float out[TILE];
        switch (R) {
        case 1: dot_rows(type, row, nb, 1, xr, K, s, sums, out); break;
        case 2: dot_rows(type, row, nb, 2, xr, K, s, sums, out); break;
        case 3: dot_rows(type, row, nb, 3, xr, K, s, sums, out); break;
        default: dot_rows(type, row, nb, 4, xr, K, s, sums, out); break;
        }
        for (int r = 0; r < R; r++) y[(m0 + r) * ldy] = out[r] + b;
    }
}

// y (M, N) = x (M, K) @ W.T (+ bias), W the rows of nparts parts stacked in order: part p is rows[p]
// rows of ggml type types[p] at address weights[p], row_bytes[p] bytes each (F32: float32 values).
// x is quantized once (quantize_rows_sums) when a part has blocks; K % 32 == 0 then (K-quants: % 256).
void gguf_linear(const float *x, int64_t M, int64_t K, int nparts, const int32_t *types, const uint64_t *weights,
                 const int64_t *rows, const int64_t *row_bytes, const float *bias, float *y, int threads) {
    int64_t N = 0;
    int blocks = 0;
    for (int p = 0; p < nparts; p++) {
        N += rows[p];
        blocks |= types[p] != F32;
    }
    int8_t *xq = NULL;
    float *xs = NULL, *xsum = NULL;
    if (blocks && M > 0) {
        xq = malloc((size_t)(M * K));
        xs = malloc(sizeof(float) * (size_t)(M * (K / BLOCK)));
        xsum = malloc(sizeof(float) * (size_t)(M * (K / BLOCK)));
        quantize_rows_sums(x, M, K, xq, xs, xsum);
    }
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++) {
        int p = 0;
        int64_t r = n;
        while (r >= rows[p]) r -= rows[p++];
        const uint8_t *row = (const uint8_t *)(uintptr_t)weights[p] + r * row_bytes[p];
        column(types[p], row, K, M, x, xq, xs, xsum, bias ? bias[n] : 0.0f, y + n, N);
    }
    free(xq);
    free(xs);
    free(xsum);
}

// Block b (32 values) of a weight row of any handled type -> q (int8) with w = a0 * q + c for values 0..15
// and a1 * q + c for 16..31 (a0 != a1 only for Q6_K)
static inline void block_values(int type, const uint8_t *row, int64_t b, __m256i *q, float *a0, float *a1, float *c) {
    if (type == Q4_K || type == Q5_K) {
        const uint8_t *p = row + (b >> 3) * (type == Q4_K ? 144 : 176);
        const int j = (int)(b & 7);
        __m256i v = _mm256_loadu_si256((const __m256i *)(p + (type == Q4_K ? 16 : 48) + 32 * (j >> 1)));
        v = low4((j & 1) ? _mm256_srli_epi16(v, 4) : v);
        if (type == Q5_K) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(p + 16));
            v = _mm256_or_si256(v, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(j)),
                                                                       _mm256_set1_epi8(1)), 4));
        }
        uint8_t sm[16];
        scales_mins_k4(p + 4, sm);
        *q = v;
        *a0 = *a1 = f16(p) * (float)sm[j];
        *c = -f16(p + 2) * (float)sm[8 + j];
    } else if (type == Q6_K) {
        const uint8_t *p = row + (b >> 3) * 210;
        const int s = (int)(b & 7), h = s >> 2, g = s & 3;
        const int8_t *sc = (const int8_t *)(p + 192);
        __m256i lo = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32 * (g & 1)));
        lo = low4((g >> 1) ? _mm256_srli_epi16(lo, 4) : lo);
        __m256i hi = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
        hi = _mm256_and_si256(_mm256_srl_epi16(hi, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
        *q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
        const float d = f16(p + 208);
        *a0 = d * (float)sc[8 * h + 2 * g];
        *a1 = d * (float)sc[8 * h + 2 * g + 1];
        *c = 0.0f;
    } else {
        const Unpacked u = unpack(type, row, b);
        *q = u.q;
        *a0 = *a1 = u.a0;
        *c = u.c;
    }
}

// The (N, K) weight of `type` (rows of row_bytes) -> out (N, K) bf16 (as uint16, rounded to nearest even):
// what a prefill's dense matmul takes (not row-invariant; only exact=False spans use it)
void gguf_to_bf16(int type, const uint8_t *w, int64_t N, int64_t K, int64_t row_bytes, uint16_t *out, int threads) {
    const int64_t nb = K / BLOCK;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *row = w + n * row_bytes;
        uint16_t *o = out + n * K;
        for (int64_t b = 0; b < nb; b++) {
            __m256i q;
            float a0, a1, c;
            block_values(type, row, b, &q, &a0, &a1, &c);
            for (int i = 0; i < 4; i++) {
                const __m128i part = i < 2 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
                const __m256i q32 = _mm256_cvtepi8_epi32((i & 1) ? _mm_srli_si128(part, 8) : part);
                const __m256 f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q32), _mm256_set1_ps(i < 2 ? a0 : a1), _mm256_set1_ps(c));
                __m256i bits = _mm256_castps_si256(f);
                bits = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1)),
                                                               _mm256_set1_epi32(0x7FFF)));
                bits = _mm256_srli_epi32(bits, 16);
                _mm_storeu_si128((__m128i *)(o + b * BLOCK + 8 * i),
                                 _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1)));
            }
        }
    }
}
