/* Exact attention rows over a per-slot KV cache, all rows of a forward in one call.
 *
 * Row r (one query token of some sequence) reduces over its own key list idx[off[r] .. off[r+1]),
 * offsets into its slot's keys, in that order:
 *     s_j = scale * q . k_j,  p_j = exp(s_j - max s) / sum p,  out = sum_j p_j v_j.
 * Each (row, query head) is computed by one thread in a fixed order that depends only on the row's
 * own key list (8-wide dot products over head_dim, exp in blocks of 8 from j = 0, the tail of the
 * list one key at a time), so a row's bits never depend on which other rows share the call: the
 * property a k-token verify forward relies on to equal k one-token steps. The rows of one verify
 * (nested key lists) share a thread and their reads of the cache (bundles, below). The q . k products
 * run 8 keys at a time (the q loads shared; the 8 lane sums reduced together in hsum8's own order, so
 * each is bitwise the one-key dot), and p . v runs the group's heads together over blocks of keys
 * (weigh_values).
 *
 * q: (n, nh, hd); k, v: one layer of the cache, (slots, nkv, max_len, hd), float32, or float16 where half
 * (each value widened exactly as it is read); slot: (n,); off: (n + 1,); out: (n, nh, hd). hd % 8 == 0,
 * hd <= MAX_HEAD_DIM. Built by kernels/build.py with -O3 -mavx2 -mfma -mf16c -ffp-contract=off, and where the
 * CPU has AVX512-VNNI with AVX-512 as well (__AVX512F__): then p . v runs 16 values a vector (weigh_block16),
 * and a task's q . k, where it has 3 (row, head) pairs or more, over pairs of keys (dot8_paired); each sum is
 * the same fmas in the same order: the AVX2 build's bits. On an Intel Xeon (AMX class, 2 threads), one layer's
 * attention took 0.74-0.90x the AVX2 build's time after 1500-3000 keys, 1.00-1.07x for smollm2-135m's decode
 * step after 100; whole 4-token verifies after 3000 tokens 0.92x (smollm2-135m), 0.95x (qwen2.5-coder-0.5b),
 * 0.93-0.97x (-1.5b), at par after 100 (the two builds in one process).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HEAD_DIM 512
#define MAX_GROUP 64 /* query heads per kv head (kernels/libraries.py, ATTEND_MAX_GROUP) */
/* multiply-adds of the q.k products from which the tasks share the threads. At 2^21 (1365 keys of
 * qwen2.5-coder-1.5b's 12 heads of 128) a decode step at 1000 keys of context ran its two kv heads on one
 * thread: 217 against 170 us a layer with the K/V cache coming from memory (2 threads, AMD EPYC), 47
 * against 29 us at 300 keys. 2^14 is 28 keys of smollm2-135m's 9 heads of 64: with the heads split
 * (below), its decode step and 4-token verify after 100 keys took 0.95x the time they took at 2^18,
 * where attention ran on one thread while the other waited (same process, AMD EPYC, Zen 5 class); after 1000 keys,
 * alike. */
#define PARALLEL_MIN_WORK (1 << 14)
/* keys ahead whose rows are asked into L1 while the current ones are used: 28 layers of K/V cache pass
 * through memory once a step, and the hardware prefetcher alone left a single thread at ~10 GB/s here;
 * 170 -> 138 us a layer at 1000 keys (above), 16 keys ahead measured alike */
#define PREFETCH_KEYS 8
/* a key list of this many float16 values (keys x head_dim) and more is widened 8 keys at a time (attend_task) */
#define WIDEN_MIN_VALUES (1 << 15)

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* lane i = hsum8(v[i]), summed in hsum8's order ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), so
 * the same bits, for 8 vectors at once */
static inline __m256 hsum8x8(const __m256 v[8]) {
    __m256 h[4], u[2];
    for (int i = 0; i < 4; i++)  /* [v2i lanes l_k + l_k+4 | v2i+1 lanes l_k + l_k+4], k = 0..3 */
        h[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    for (int i = 0; i < 2; i++)  /* per half: [x0 + x2, x1 + x3] of h[2i], then of h[2i + 1] */
        u[i] = _mm256_add_ps(_mm256_shuffle_ps(h[2 * i], h[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(h[2 * i], h[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lanes: [v0, v2, v4, v6 | v1, v3, v5, v7], then in order */
    const __m256 t = _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* max(s[0..n-1]), -inf for n = 0: 8 lanes in 4 chains, then across (max is exact, so the value of a scalar
 * loop; a NaN never wins, as `s[j] > m ? s[j] : m` keeps m). Against that scalar loop's chain of dependent
 * compares, after 3000 tokens of context: 0.95-0.97x the time of smollm2-135m's decode step and 0.96x its
 * 4-token verify, qwen2.5-coder-0.5b's 0.95x and 0.98x (same process, AMD EPYC, Zen 5 class). */
static inline float max_of(const float *s, int64_t n) {
    __m256 m[4];
    for (int c = 0; c < 4; c++) m[c] = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 32 <= n; j += 32)
        for (int c = 0; c < 4; c++) m[c] = _mm256_max_ps(_mm256_loadu_ps(s + j + 8 * c), m[c]);
    for (; j + 8 <= n; j += 8) m[0] = _mm256_max_ps(_mm256_loadu_ps(s + j), m[0]);
    const __m256 v = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    float lanes[8], best = -INFINITY;
    _mm256_storeu_ps(lanes, v);
    for (int i = 0; i < 8; i++) best = lanes[i] > best ? lanes[i] : best;
    for (; j < n; j++) best = s[j] > best ? s[j] : best;
    return best;
}

/* The cache holds float32 or float16 (half) values: a key's or value's row at `index` (in values) of base,
 * and 8 of its values from d on as floats (F16C: exact, as every float16 is a float32) */
static inline const void *kv_row(const void *base, int64_t index, int half) {
    return (const char *)base + index * (half ? 2 : 4);
}
static inline __m256 kv8(const void *row, int64_t d, int half) {
    return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d)))
                : _mm256_loadu_ps((const float *)row + d);
}
/* a row's hd values asked into L1, a cache line a prefetch */
static inline void prefetch_row(const void *row, int64_t hd, int half) {
    for (int64_t o = 0; o < hd * (half ? 2 : 4); o += 64) _mm_prefetch((const char *)row + o, _MM_HINT_T0);
}

static inline __attribute__((always_inline)) float dot(const float *a, const void *b, int64_t n, int half) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < n; d += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), kv8(b, d, half), acc);
    return hsum8(acc);
}

/* dst[e] = scale * (a . keys[e]) for 8 keys (float16 rows where half): the a loads shared, the 8 sums
 * reduced together by hsum8x8, so each is bitwise dot(a, keys[e]) * scale */
static inline __attribute__((always_inline)) void dot8(const float *a, const void *const keys[8], int64_t hd,
                                                     int half, float scale, float *dst) {
    __m256 acc[8];
    for (int e = 0; e < 8; e++) acc[e] = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8) {
        const __m256 av = _mm256_loadu_ps(a + d);
        for (int e = 0; e < 8; e++) acc[e] = _mm256_fmadd_ps(av, kv8(keys[e], d, half), acc[e]);
    }
    _mm256_storeu_ps(dst, _mm256_mul_ps(hsum8x8(acc), _mm256_set1_ps(scale)));
}

#ifdef __AVX512F__
/* The q . k products in zmm registers with dot8's bits: 8 keys' rows laid out as 4 pairs of keys, each step of 8
 * values of the two side by side (pair p's step t at w + (p * hd / 8 + t) * 16, float16 widened exactly), so one
 * fma carries the 8-lane sums of two keys, each lane the same fma over the same values in the same order as
 * dot8's; the halves then go through hsum8x8. */
static inline void pair_keys(const void *const kr[8], int64_t hd, int half, float *w) {
    for (int p = 0; p < 4; p++)
        for (int64_t t = 0; t < hd / 8; t++) {
            _mm256_storeu_ps(w + (p * hd / 8 + t) * 16, kv8(kr[2 * p], 8 * t, half));
            _mm256_storeu_ps(w + (p * hd / 8 + t) * 16 + 8, kv8(kr[2 * p + 1], 8 * t, half));
        }
}

/* dst[u][e] = scale * (qs[u] . key e) for Q (<= 3) query rows over pair_keys' 8 keys: bitwise dot8's */
static inline __attribute__((always_inline)) void dot8_paired(const float *const qs[3], int Q, const float *w,
                                                            int64_t hd, float scale, float *const dst[3]) {
    __m512 acc[3][4];
    for (int u = 0; u < Q; u++)
        for (int p = 0; p < 4; p++) acc[u][p] = _mm512_setzero_ps();
    for (int64_t t = 0; t < hd / 8; t++) {
        __m512 qv[3];
        for (int u = 0; u < Q; u++)  // q's 8 values in both halves
            qv[u] = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(qs[u] + 8 * t))));
        for (int p = 0; p < 4; p++) {
            const __m512 kv = _mm512_loadu_ps(w + (p * hd / 8 + t) * 16);
            for (int u = 0; u < Q; u++) acc[u][p] = _mm512_fmadd_ps(qv[u], kv, acc[u][p]);
        }
    }
    for (int u = 0; u < Q; u++) {
        __m256 h[8];
        for (int p = 0; p < 4; p++) {
            h[2 * p] = _mm512_castps512_ps256(acc[u][p]);
            h[2 * p + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[u][p]), 1));
        }
        _mm256_storeu_ps(dst[u], _mm256_mul_ps(hsum8x8(h), _mm256_set1_ps(scale)));
    }
}
#endif

/* exp(x) for x <= 0: x = n ln2 + r, |r| <= ln2 / 2, a degree-7 polynomial in r (relative error
 * about 1e-7), times 2^n; x below -87 gives 0. The scalar form computes the same steps. */
#define EXP_C1 0.693359375f
#define EXP_C2 -2.12194440e-4f
static const float P[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                           4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

static inline __m256 exp8(__m256 x) {
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 fx = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                              _mm256_set1_ps(0.5f)));
    x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(EXP_C1)));
    x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(EXP_C2)));
    __m256 y = _mm256_set1_ps(P[0]);
    for (int i = 1; i < 6; i++) y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(P[i]));
    y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(y, x), x), x), _mm256_set1_ps(1.0f));
    __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(n));
    return _mm256_andnot_ps(under, y);
}

static inline float exp1(float x) {
    if (x < -87.0f) return 0.0f;
    float fx = floorf(x * 1.44269504088896341f + 0.5f);
    x = x - fx * EXP_C1;
    x = x - fx * EXP_C2;
    float y = P[0];
    for (int i = 1; i < 6; i++) y = y * x + P[i];
    y = y * x * x + x + 1.0f;
    union { int32_t i; float f; } n = {((int32_t)fx + 127) << 23};
    return y * n.f;
}

/* p . v, the heads of one kv group together: keys in blocks of VALUE_BLOCK, and within a block, 16 output
 * values (two vectors) of up to HEADS_AT_ONCE heads at a time in registers across the block's keys, carried
 * from block to block in acc (L1). Each key's values are loaded once for the heads, and the block's rows
 * (32 KB at head_dim 128) stay in L1 for its passes, where one head at a time streamed the group's V once
 * per head. Each output value is still summed over the keys in their order, from 0, by fma: the same bits. */
#define HEADS_AT_ONCE 6
#define VALUE_BLOCK 64
static inline __attribute__((always_inline)) void weigh_block(const float *s, int64_t L, const int64_t *keys,
                                                            const void *vb, int64_t hd, int64_t j0, int64_t j1,
                                                            int64_t d0, int HEADS, int W, int half, float *acc) {
    __m256 c[HEADS_AT_ONCE][2];
    for (int a = 0; a < HEADS; a++)
        for (int w = 0; w < W; w++) c[a][w] = _mm256_loadu_ps(acc + a * hd + d0 + 8 * w);
    for (int64_t j = j0; j < j1; j++) {
        const void *vr = kv_row(vb, keys[j] * hd, half);
        __m256 v[2];
        for (int w = 0; w < W; w++) v[w] = kv8(vr, d0 + 8 * w, half);
        for (int a = 0; a < HEADS; a++) {
            const __m256 p = _mm256_broadcast_ss(s + a * L + j);
            for (int w = 0; w < W; w++) c[a][w] = _mm256_fmadd_ps(p, v[w], c[a][w]);
        }
    }
    for (int a = 0; a < HEADS; a++)
        for (int w = 0; w < W; w++) _mm256_storeu_ps(acc + a * hd + d0 + 8 * w, c[a][w]);
}

#ifdef __AVX512F__
/* weigh_block with 16 values a vector (W of them): built where the CPU has AVX-512 (kernels/build.py).
 * Each output value is the same chain of fmas over the keys in order as in weigh_block: the same bits, with
 * half the instructions a key (one float16 widening and one fma for 16 values, where weigh_block takes two of
 * each), and twice the values a dependent chain carries. */
static inline __m512 kv16(const void *row, int64_t d, int half) {
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + d)))
                : _mm512_loadu_ps((const float *)row + d);
}
static inline __attribute__((always_inline)) void weigh_block16(const float *s, int64_t L, const int64_t *keys,
                                                              const void *vb, int64_t hd, int64_t j0, int64_t j1,
                                                              int64_t d0, int HEADS, int W, int half, float *acc) {
    __m512 c[HEADS_AT_ONCE][2];
    for (int a = 0; a < HEADS; a++)
        for (int w = 0; w < W; w++) c[a][w] = _mm512_loadu_ps(acc + a * hd + d0 + 16 * w);
    for (int64_t j = j0; j < j1; j++) {
        const void *vr = kv_row(vb, keys[j] * hd, half);
        __m512 v[2];
        for (int w = 0; w < W; w++) v[w] = kv16(vr, d0 + 16 * w, half);
        for (int a = 0; a < HEADS; a++) {
            const __m512 p = _mm512_set1_ps(s[a * L + j]);
            for (int w = 0; w < W; w++) c[a][w] = _mm512_fmadd_ps(p, v[w], c[a][w]);
        }
    }
    for (int a = 0; a < HEADS; a++)
        for (int w = 0; w < W; w++) _mm512_storeu_ps(acc + a * hd + d0 + 16 * w, c[a][w]);
}
#endif

/* One pass of weigh_block or weigh_block16 (F, n values a vector) from value d0 on, two vectors wide or the last
 * one, with `heads` made a constant (each its own unrolled copy); for weigh_values' loop */
#define WEIGH(F, n, H) (hd - d0 >= 2 * (n) ? F(sa, L, keys, vb, hd, j0, end, d0, H, 2, half, ca) \
                                           : F(sa, L, keys, vb, hd, j0, end, d0, H, 1, half, ca))
#define WEIGH_HEADS(F, n)                           \
    switch (heads) {                                \
    case 1: WEIGH(F, n, 1); break;                  \
    case 2: WEIGH(F, n, 2); break;                  \
    case 3: WEIGH(F, n, 3); break;                  \
    case 4: WEIGH(F, n, 4); break;                  \
    case 5: WEIGH(F, n, 5); break;                  \
    default: WEIGH(F, n, 6); break;                 \
    }

/* For rows i = 0..nr-1 of a bundle and their heads a: out + (i * nh + a) * hd = (s + (i * group + a) * L) .
 * the values of the row's first lens[i] keys / total[i * group + a] (s: the softmax's unnormalized weights,
 * rows L apart; total: their sums); acc: nr * group * hd floats of scratch. Block by block of keys, every
 * row that reaches the block takes it while its values are in L1. */
static inline __attribute__((always_inline)) void weigh_values(const float *s, int64_t L, const int64_t *lens,
                                                             int64_t nr, const int64_t *keys, const void *vb,
                                                             int64_t hd, int64_t group, int64_t nh, int half,
                                                             const float *total, float *acc, float *out) {
    for (int64_t i = 0; i < nr * group * hd; i++) acc[i] = 0.0f;
    const int64_t longest = lens[nr - 1];
    for (int64_t j0 = 0; j0 < longest; j0 += VALUE_BLOCK) {
        const int64_t j1 = j0 + VALUE_BLOCK < longest ? j0 + VALUE_BLOCK : longest;
        for (int64_t j = j1; j < j1 + VALUE_BLOCK && j < longest; j++)  // the next block's rows, from memory
            prefetch_row(kv_row(vb, keys[j] * hd, half), hd, half);
        // a block that every row's list covers: the rows' heads taken together, (row, head) pairs in s's and
        // acc's order, each key's values loaded once for up to HEADS_AT_ONCE of them (a 4-row verify of 3
        // heads a group: 2 passes over the block where a row at a time took 4); the block the shorter rows
        // end in, a row at a time. Either way each sum takes the same keys in the same order.
        const int together = lens[0] >= j1;
        for (int64_t i = 0; i < (together ? 1 : nr); i++) {
            const int64_t end = j1 < lens[i] ? j1 : lens[i], pairs = together ? nr * group : group;
            if (end <= j0) continue;
            for (int64_t a0 = 0; a0 < pairs; a0 += HEADS_AT_ONCE) {
                const int heads = pairs - a0 < HEADS_AT_ONCE ? (int)(pairs - a0) : HEADS_AT_ONCE;
                const float *sa = s + (i * group + a0) * L;
                float *ca = acc + (i * group + a0) * hd;
                for (int64_t d0 = 0; d0 < hd; d0 += 16) {
#ifdef __AVX512F__
                    if (hd - d0 >= 16) {  // 32 values a pass, or the last 16, in zmm registers
                        WEIGH_HEADS(weigh_block16, 16);
                        if (hd - d0 >= 32) d0 += 16;
                        continue;
                    }
#endif
                    WEIGH_HEADS(weigh_block, 8);
                }
            }
        }
    }
    for (int64_t i = 0; i < nr; i++)
        for (int64_t a = 0; a < group; a++)
            for (int64_t d = 0; d < hd; d += 8)
                _mm256_storeu_ps(out + i * nh * hd + a * hd + d,
                                 _mm256_div_ps(_mm256_loadu_ps(acc + (i * group + a) * hd + d),
                                               _mm256_set1_ps(total[i * group + a])));
}

#undef WEIGH_HEADS
#undef WEIGH

/* Bundles: a verify forward's rows of one sequence attend to the context, then one more key each; each
 * row's key list begins with the whole list of the row before. Such rows, of one slot, go to one task per
 * kv head, which reads each key's K and V rows once for all of them, where a task per row read the cache
 * once a row: qwen2.5-coder-1.5b's 4-row verify, a layer's attention after 3000 keys 693 -> 600 us, after
 * 1000 keys 240 -> 209 us (2 threads, AMD Zen 5; a decode step's: 308 and 97 us). The rest is arithmetic:
 * four rows' q . k and p . v are four times one row's. Each row's arithmetic is the one it has alone: its
 * q . k products in the same blocks of 8 from key 0, its softmax over its own keys, its p . v over its keys
 * in order. Rows of other shapes (a tree of drafts, a sliding window, other sequences) are bundles of one. */
#define MAX_BUNDLE 16

/* the end of the bundle that starts at row r0 */
static int64_t bundle_end(const int64_t *slot, const int64_t *off, const int64_t *idx, int64_t r0, int64_t n) {
    int64_t r = r0 + 1;
    for (; r < n && r - r0 < MAX_BUNDLE && slot[r] == slot[r0]; r++) {
        const int64_t before = off[r] - off[r - 1];
        if (off[r + 1] - off[r] < before || memcmp(idx + off[r - 1], idx + off[r], sizeof(int64_t) * (size_t)before))
            break;
    }
    return r;
}

/* One task of attend_rows: rows starts[b] .. starts[b + 1] - 1 (a bundle), kv head g, query heads h0 .. h0 +
 * heads - 1 (the cache's values float16 where half) */
static inline __attribute__((always_inline)) void attend_task(const float *q, const void *k, const void *v,
                                                            const int64_t *slot, const int64_t *off,
                                                            const int64_t *idx, float *out, int64_t r0, int64_t nr,
                                                            int64_t g, int64_t h0, int64_t heads, int64_t nh,
                                                            int64_t nkv, int64_t hd, int64_t max_len, float scale,
                                                            int half) {
    int64_t lens[MAX_BUNDLE];
    for (int64_t i = 0; i < nr; i++) lens[i] = off[r0 + i + 1] - off[r0 + i];
    const int64_t L = lens[nr - 1];  // the longest list, which every row's begins
    const int64_t *keys = idx + off[r0 + nr - 1];
    const void *kb = kv_row(k, (slot[r0] * nkv + g) * max_len * hd, half);
    const void *vb = kv_row(v, (slot[r0] * nkv + g) * max_len * hd, half);
    // the weights of row i's head a at s + (i * heads + a) * L, then weigh_values's sums, then 8 keys widened
    float *s = malloc(sizeof(float) * (size_t)(nr * heads * (L + hd) + 8 * hd));
    float *widened = s + nr * heads * (L + hd);
    float totals[MAX_BUNDLE * MAX_GROUP];
    // a long float16 list's 8 keys widened once into L1 for every (row, head) of the task, where each product
    // widened them again (the same floats: widening is exact). Where the keys come from memory, reading each
    // row whole, in order, is what pays: one layer's attention of qwen2.5-coder-1.5b (12 heads of 128, 2 kv
    // heads) over 3000 keys took 0.70x the time for a decode step, 0.93x for a 4-token verify, over 1000
    // keys 0.74x and 0.87-0.98x; qwen2.5-coder-0.5b's decode step 0.89x after 3000 (a cache of 28 layers, 2
    // threads, AMD EPYC, Zen 5 class); the 1.5B's whole decode step 0.93x after 1000 and 3000 tokens. Over
    // 100 keys, in cache, it cost 1.07-1.16x (the widened rows' stores and loads): hence only from
    // WIDEN_MIN_VALUES values on. Values widened the same way gained nothing (p . v reads a block of them).
    const int widen_once = half && nr * heads > 1 && L * hd >= WIDEN_MIN_VALUES;
    int64_t j0 = 0;
    for (; j0 + 8 <= L; j0 += 8) {  // 8 keys at a time: the q loads shared, the 8 sums reduced together
        const void *kr[8];
        for (int i = 0; i < 8; i++) kr[i] = kv_row(kb, keys[j0 + i] * hd, half);
        if (j0 + PREFETCH_KEYS + 8 <= L)
            for (int i = 0; i < 8; i++) prefetch_row(kv_row(kb, keys[j0 + PREFETCH_KEYS + i] * hd, half), hd, half);
#ifdef __AVX512F__
        // the rows' (row, head) pairs that cover these keys, 3 at a time over paired keys. Not for a task of 2:
        // smollm2-135m's decode step (its groups split 2 + 1 heads) ran 1.08-1.10x after 100-400 keys so.
        if (nr * heads >= 3) {
            if (half) pair_keys(kr, hd, 1, widened);
            else pair_keys(kr, hd, 0, widened);
            int64_t i0 = 0;  // lists grow row by row: the rows from i0 on cover them
            while (j0 + 8 > lens[i0]) i0++;
            const int64_t first = i0 * heads, last = nr * heads;
            for (int64_t u0 = first; u0 < last; u0 += 3) {
                const float *qs[3];
                float *dst[3];
                const int Q = last - u0 < 3 ? (int)(last - u0) : 3;
                for (int u = 0; u < Q; u++) {
                    const int64_t i = (u0 + u) / heads, a = (u0 + u) % heads;
                    qs[u] = q + ((r0 + i) * nh + h0 + a) * hd;
                    dst[u] = s + (i * heads + a) * L + j0;
                }
                if (Q == 3) dot8_paired(qs, 3, widened, hd, scale, dst);
                else if (Q == 2) dot8_paired(qs, 2, widened, hd, scale, dst);
                else dot8_paired(qs, 1, widened, hd, scale, dst);
            }
            continue;
        }
#endif
        if (widen_once) {
            for (int e = 0; e < 8; e++) {
                for (int64_t d = 0; d < hd; d += 8) _mm256_storeu_ps(widened + e * hd + d, kv8(kr[e], d, 1));
                kr[e] = widened + e * hd;
            }
        }
        for (int64_t i = 0; i < nr; i++) {
            if (j0 + 8 > lens[i]) continue;  // that row's last keys: one at a time, below
            for (int64_t a = 0; a < heads; a++) {
                float *sa = s + (i * heads + a) * L + j0;
                if (half && !widen_once)
                    dot8(q + ((r0 + i) * nh + h0 + a) * hd, kr, hd, 1, scale, sa);
                else
                    dot8(q + ((r0 + i) * nh + h0 + a) * hd, kr, hd, 0, scale, sa);
            }
        }
    }
    for (int64_t i = 0; i < nr; i++)
        for (int64_t j = lens[i] / 8 * 8; j < lens[i]; j++) {
            const void *kr = kv_row(kb, keys[j] * hd, half);
            for (int64_t a = 0; a < heads; a++)
                s[(i * heads + a) * L + j] = dot(q + ((r0 + i) * nh + h0 + a) * hd, kr, hd, half) * scale;
        }
    for (int64_t i = 0; i < nr; i++)
        for (int64_t a = 0; a < heads; a++) {
            float *sa = s + (i * heads + a) * L;
            const int64_t len = lens[i];
            const float m = max_of(sa, len);
            __m256 lanes = _mm256_setzero_ps(), mv = _mm256_set1_ps(m);
            int64_t j = 0;
            for (; j + 8 <= len; j += 8) {
                __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sa + j), mv));
                _mm256_storeu_ps(sa + j, e);
                lanes = _mm256_add_ps(lanes, e);
            }
            float sum = hsum8(lanes);
            for (; j < len; j++) {
                sa[j] = exp1(sa[j] - m);
                sum += sa[j];
            }
            totals[i * heads + a] = sum;
        }
    weigh_values(s, L, lens, nr, keys, vb, hd, heads, nh, half, totals, s + nr * heads * L, out + (r0 * nh + h0) * hd);
    free(s);
}

void attend_rows(const float *q, const void *k, const void *v, const int64_t *slot, const int64_t *off,
                 const int64_t *idx, float *out, int64_t n, int64_t nh, int64_t nkv, int64_t hd, int64_t max_len,
                 float scale, int half, int threads) {
    const int64_t group = nh / nkv;
    int64_t *starts = malloc(sizeof(int64_t) * (size_t)(n + 1)), bundles = 0;
    for (int64_t r = 0; r < n; r = bundle_end(slot, off, idx, r, n)) starts[bundles++] = r;
    starts[bundles] = n;
    /* threads only where the work pays for waking them: an OpenMP pool that spins after a small
     * region takes the cores from torch's own pool in the matmuls that follow */
    const int parallel = threads > 1 && off[n] * nh * hd >= PARALLEL_MIN_WORK;
    /* a task: one bundle's rows, one kv head, and `per` of its group's query heads. Where the bundles
     * and kv heads alone leave the threads uneven work, and few tasks (one verify of smollm2-135m's 3 kv
     * heads on 2 threads: 2 tasks against 1; Gemma 3's single kv head: 1 against none), the groups split.
     * Not where they divide evenly: each task reads its kv head's keys and values whole, so qwen2.5-coder-
     * 1.5b's decode step split into 4 tasks of 3 heads read its cache twice, and one layer's attention took
     * 1.37x the time of 2 tasks of 6 after 3000 keys, 1.11x after 1000 and 100 (Gemma 3's 4 heads of 256:
     * 1.16x and 1.20x for 4 tasks against 2). Each head's arithmetic is the same whichever heads share its
     * task: the same bits. */
    /* Not either for a decode step's single rows over long lists where every thread has a kv head of its own:
     * there the cache comes from memory, and a group split reads it once a part. smollm2-135m (3 kv heads, 2
     * threads) after 3000 keys: a layer's attention over a cache of 30 layers took 0.80x the time of 6 tasks,
     * after 600-2000 keys 0.80-0.96x; its whole decode step 0.91-0.94x after 3000 tokens (Intel Xeon, the two
     * kernels in one process). A verify's rows do 4 times the arithmetic a key read: its bundles still split
     * (0.82x for one layer's attention unsplit, but 1.01-1.02x for the whole 4-token verify). */
    const int long_lists = n == bundles && off[n] / n * hd >= WIDEN_MIN_VALUES;
    int64_t parts = 1;
    const int whole_groups = long_lists && bundles * nkv >= threads;
    while (parallel && !whole_groups && bundles * nkv * parts < 2 * threads && bundles * nkv * parts % threads
           && parts < group)
        parts++;
    const int64_t per = (group + parts - 1) / parts;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if(parallel)
    for (int64_t task = 0; task < bundles * nkv * parts; task++) {
        const int64_t b = task / (nkv * parts), g = task / parts % nkv, h0 = g * group + task % parts * per;
        const int64_t r0 = starts[b], nr = starts[b + 1] - r0;
        const int64_t heads = g * group + group - h0 < per ? g * group + group - h0 : per;
        if (heads <= 0) continue;
        if (half)
            attend_task(q, k, v, slot, off, idx, out, r0, nr, g, h0, heads, nh, nkv, hd, max_len, scale, 1);
        else
            attend_task(q, k, v, slot, off, idx, out, r0, nr, g, h0, heads, nh, nkv, hd, max_len, scale, 0);
    }
    free(starts);
}
