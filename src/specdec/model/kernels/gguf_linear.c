// Matmul over a GGUF file's own quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) for
// AVX2: the weights keep the file's values and scales, unpacked inside the kernel; activations are
// quantized to int8 in blocks of 32 with a float scale each (Q8_0's layout, as w8a8.c), and each 32
// values contribute xs * a * sum(q * xq) + c * xs * sum(xq), where the file's block gives w = a * q + c
// (a per 16 values for Q6_K) and the integer sums are exact. llama.cpp quantizes the activations of
// K-quant weights with one scale per 256 values (Q8_K), which is faster for 4-row verify batches but
// measured 5x the KL from the file's own model on qwen2.5-coder-1.5b; specdec keeps blocks of 32.
//
// At load, each row's groups of 256 values get their bits reordered (gguf_repack.c; see "Groups of 256
// values, interleaved" in gguf_blocks.h), and so do the activations' at each call (gguf_acts.c), so that the
// float work of a block of 32 (a conversion, a product, an fma per activation row) is done for 8 blocks at once.
//
// The integer dots take one vpdpbusd each where AVX512-VNNI is compiled in (model/kernels builds it so
// where the CPU has it), else maddubs, with the int16 sums of up to 8 steps added before one madd widens
// them (sums16): the same integers, so the same bits on either build.
//
// Row invariance: each output element is one function of its weight row and its activation row,
// summed in one fixed order, so its bits do not depend on the other rows of the batch or on the
// thread count.
#include "gguf_blocks.h"

// out[r] = the sum of v[r]'s 8 lanes for r < R, as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) whatever R
// is (a row's lanes only ever meet its own). Four rows take three hadds, where each row alone took three
// shuffles and three adds: with a row's lanes summed once (dot_rows), 0.86x the time of smollm2-135m's
// 4-token forward and 0.95x its 1-token one (same process, AMD EPYC, Zen 5 class, 2 threads; K = 576 leaves
// each weight row only 2.25 groups to amortize its end over).
static inline void hsum_rows(const __m256 *v, int R, float *out) {
    const __m256 z = _mm256_setzero_ps();
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(v[0], R > 1 ? v[1] : z), _mm256_hadd_ps(R > 2 ? v[2] : z, R > 3 ? v[3] : z));
    float sums[4];
    _mm_storeu_ps(sums, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
    for (int r = 0; r < R; r++) out[r] = sums[r];
}

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

// Every dot below takes one weight row and R <= TILE activation rows, unpacks each block of the weight
// once for all R, and computes each row's sum in the same order whatever R is. They are inlined with R
// constant (dot_rows), so that the accumulators stay in registers.
#define TILE 4

// Blocks b0..nb-1 of one weight row of a legacy type (blocks of 32 in the file's layout: a row's last
// nb % 8 blocks, past its interleaved groups) . R activation rows, added into each row's lanes acc[r]
// (the scaled integer dots) and mins[r] (the mins' terms)
static inline __attribute__((always_inline)) void dot_legacy(int type, const uint8_t *row, int64_t b0, int64_t nb, int R,
                                                           const int8_t *xq, int64_t K, const float *xs,
                                                           const float *xsum, __m256 *acc, float *mins) {
    const int has_min = type == Q4_1 || type == Q5_1;
    for (int64_t b = b0; b < nb; b++) {
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
}

// acc + the 8 lanes' sums of 4 products of u (32 x uint8) . s (32 x int8), exactly (see dot4)
static inline __m256i dot4_add(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define WIDEN_EACH 1
#define STEP_PAIRS 1
#else
#define WIDEN_EACH 0
#define STEP_PAIRS 0
#endif
// STEP_PAIRS (the VNNI build, every type but Q8_0): steps c and c + 4 of a group, whose weights come
// from one 32-byte load (low and high nibbles), go into one 512-bit vpdpbusd, the weights' two halves side
// by side and the activations' 64 bytes as interleave_rows lays them out, where two 256-bit ones took them.
// Lanes l and l + 8 then hold sub-block l's sums of the two steps, added at the group's end: the same
// integers, so the same bits. smollm2-135m's linears at four rows 0.91-0.96x the time, qwen2.5-coder-0.5b's
// and -1.5b's 0.95-0.98x, one row alike (same process, AMD EPYC, Zen 5 class: 48 KB L1d a core). Not measured
// where 512-bit operations run as two halves (Zen 4); there only the issue slots are saved.
// AVX2 without VNNI: maddubs's int16 pair sums of a type's q (unsigned, at most qmax; Q8_0's |q| at most 128)
// and activations (|x| <= 127) are each at most 2 * qmax * 127, so sums16(type) of them add up in int16
// exactly before one madd widens them to int32: a Q4 group's 8 steps take one madd where they took 8
// (0.94x the time of the 1.5B's linears at one row, 0.89x at four, on a Zen 3). The integers are the same,
// so the bits are the VNNI build's.
static inline int sums16(int type) { return type == Q8_0 ? 1 : type == Q6_K ? 2 : high_bits(type) ? 4 : 8; }
static inline __m256i widen16(__m256i p) { return _mm256_madd_epi16(p, _mm256_set1_epi16(1)); }

// The integer dots of a row run in up to CHAINS independent sums, fewer the more rows there are, so that
// one row is not held up by the latency of one long chain; integers, so the total is the same
#define CHAINS 4
static inline int chains(int R) { return R == 1 ? 4 : R == 2 ? 2 : 1; }
static inline int chain(int R, int k) { return k % chains(R); }
static inline __m256i chains_sum(const __m256i *d, int R) {
    __m256i s = d[0];
    for (int k = 1; k < chains(R); k++) s = _mm256_add_epi32(s, d[k]);
    return s;
}

// The weight bytes PREFETCH ahead of a group asked into L1 now: a thread reads its columns' rows as one
// sequential stream, yet the hardware prefetcher alone kept it below half the memory's bandwidth, most of all
// where several activation rows make each group slower to consume. On an AMD Zen 4 (2 threads, VNNI) the
// linears of qwen2.5-coder-1.5b took 0.73x the time at four rows (its ffn_down, K = 8960, 0.55x) and 0.95x
// at one; qwen2.5-coder-0.5b's 0.87x at four; 1024, 1536, 2048 and 4096 bytes ahead measured alike.
#define PREFETCH 1536
// (always_inline: out of line, GCC 12 finds the function free of effects and drops its calls)
static inline __attribute__((always_inline)) void prefetch_bytes(const uint8_t *p, int bytes) {
    for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
}

// The running sums of one weight row against R activation rows, carried from one span of its groups to
// the next (see "Spans of groups"): acc takes the scaled integer dots, accm the mins' terms
typedef struct {
    float acc[TILE][8], accm[TILE][8];
} Sums;

static inline __m256 cvt8_ph(const uint8_t *p) {  // 8 fp16 -> 8 floats
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

// Groups g0..g1-1 of one row's ng interleaved groups . R activation rows (xi interleaved; the sums carried
// as dot_rows says), every type but Q6_K: sub-block l contributes a_l * xs_l * (q - offset).x
// + c_l * xs_l * sum(x), with a_l = d * sc_l and
// c_l = -dmin * m_l (Q4_K, Q5_K), a_l = d_l and c_l = m_l (Q4_1, Q5_1), a_l = d_l and c_l = 0 otherwise;
// the offset (Q4_0: 8, Q5_0: 16) comes off the exact integer dot as offset * sum(xq)
static inline __attribute__((always_inline)) void dot_groups(int type, const uint8_t *row, int64_t g0, int64_t g1,
                                                           int R, const int8_t *xi, int64_t K, const float *xs,
                                                           const float *xsum, const int32_t *s16, int64_t ng,
                                                           int64_t ahead, Sums *carry, __m256 *part) {
    const int bytes = group_bytes(type), kquant = is_kquant(type), mins = kquant || has_min(type);
    const int offset = q_offset(type), per = sums16(type);
    const int64_t nb = K / BLOCK;
    const Bits bits = interleaved_bits(type);
    __m256 acc[TILE], accm[TILE];
    for (int r = 0; r < R; r++) acc[r] = accm[r] = _mm256_setzero_ps();
    if (carry && g0)
        for (int r = 0; r < R; r++) acc[r] = _mm256_loadu_ps(carry->acc[r]), accm[r] = _mm256_loadu_ps(carry->accm[r]);
    for (int64_t i = g0; i < g1; i++) {
        const uint8_t *p = row + i * bytes;
        __m256 a, c = _mm256_setzero_ps();
        prefetch_bytes(p + ahead, bytes);
        if (kquant) {
            const __m128i sm = scales_mins_k4_reg(p + 4);
            a = _mm256_mul_ps(_mm256_set1_ps(f16(p)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm)));
            c = _mm256_mul_ps(_mm256_set1_ps(-f16(p + 2)),
                              _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8))));
        } else {
            a = cvt8_ph(p);
            if (mins) c = cvt8_ph(p + 16);
        }
        __m256i dots[TILE][CHAINS], h[TILE] = {0};
        for (int r = 0; r < R; r++)
            for (int k = 0; k < CHAINS; k++) dots[r][k] = _mm256_setzero_si256();
#if STEP_PAIRS
        __m512i pairs[TILE][2];  // one chain a row, two where fewer rows leave the latency exposed
        for (int r = 0; r < R; r++) pairs[r][0] = pairs[r][1] = _mm512_setzero_si512();
#endif
        // unrolled: each step's chain and int16 bookkeeping (c4 % (per / 2)...) become constants. Where GCC 12 kept
        // the loop, they were branches and index moves between the maddubs; qwen2.5-coder-1.5b's linears at four
        // rows 0.81x the time (its Q6_K ffn_down 0.70x), at eight 0.75x, one to three rows alike (AVX2-only AMD
        // EPYC, 2 threads, same process, interleaved). The same operations in the same order: the same bits.
        #pragma GCC unroll 4
        for (int c4 = 0; c4 < 4; c4++) {
            __m256i lo, hi;
            if (type == Q8_0) {
                lo = load32(p + 16 + 32 * c4), hi = load32(p + 16 + 32 * (c4 + 4));
            } else {
                const __m256i v = load32(p + bits.qs + 32 * c4);
                lo = with_high(type, p + bits.qh, bits_at(v, 0, 0xF), c4);
                hi = with_high(type, p + bits.qh, bits_at(v, 4, 0xF), c4 + 4);
            }
            const __m256i ulo = type == Q8_0 ? _mm256_abs_epi8(lo) : lo, uhi = type == Q8_0 ? _mm256_abs_epi8(hi) : hi;
#if STEP_PAIRS
            const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
#endif
            for (int r = 0; r < R; r++) {
                const int8_t *x = xi + r * K + i * 256;
#if STEP_PAIRS
                if (type != Q8_0) {
                    const int k = R <= 2 ? c4 & 1 : 0;
                    pairs[r][k] = _mm512_dpbusd_epi32(pairs[r][k], both, _mm512_loadu_si512((const void *)(x + 64 * c4)));
                    continue;
                }
#endif
                __m256i xlo = load32((const uint8_t *)(x + 64 * c4)), xhi = load32((const uint8_t *)(x + 64 * c4 + 32));
                if (type == Q8_0)  // signed: |q| . (x with q's sign), as dot_legacy
                    xlo = _mm256_sign_epi8(xlo, lo), xhi = _mm256_sign_epi8(xhi, hi);
                if (WIDEN_EACH || per == 1) {
                    dots[r][chain(R, 2 * c4)] = dot4_add(dots[r][chain(R, 2 * c4)], ulo, xlo);
                    dots[r][chain(R, 2 * c4 + 1)] = dot4_add(dots[r][chain(R, 2 * c4 + 1)], uhi, xhi);
                } else {  // int16 sums of per / 2 steps' pairs, then one madd
                    const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(ulo, xlo), _mm256_maddubs_epi16(uhi, xhi));
                    h[r] = c4 % (per / 2) ? _mm256_add_epi16(h[r], s) : s;
                    if ((c4 + 1) % (per / 2) == 0) dots[r][chain(R, c4)] = _mm256_add_epi32(dots[r][chain(R, c4)], widen16(h[r]));
                }
            }
        }
        for (int r = 0; r < R; r++) {
            __m256i d = chains_sum(dots[r], R);
#if STEP_PAIRS
            if (type != Q8_0) {
                const __m512i sum = R <= 2 ? _mm512_add_epi32(pairs[r][0], pairs[r][1]) : pairs[r][0];
                d = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
            }
#endif
            if (offset) {
                const int32_t *sums = s16 + (r * (K / 256) + i) * 16;
                const __m256i sum = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)sums),
                                                     _mm256_loadu_si256((const __m256i *)(sums + 8)));
                d = _mm256_sub_epi32(d, _mm256_sll_epi32(sum, _mm_cvtsi32_si128(offset == 8 ? 3 : 4)));
            }
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(a, _mm256_loadu_ps(xs + r * nb + i * 8)), acc[r]);
            if (mins) accm[r] = _mm256_fmadd_ps(c, _mm256_loadu_ps(xsum + r * nb + i * 8), accm[r]);
        }
    }
    if (carry && g1 < ng)
        for (int r = 0; r < R; r++) _mm256_storeu_ps(carry->acc[r], acc[r]), _mm256_storeu_ps(carry->accm[r], accm[r]);
    else
        for (int r = 0; r < R; r++) part[r] = _mm256_add_ps(acc[r], accm[r]);
}

// Groups g0..g1-1 of one interleaved Q6_K row . R activation rows (as dot_groups): sub-block l contributes
// d * xs_l * (sc_first * (q - 32).x over its first 16 values + sc_second * the same over its last 16), q in
// 0..63; the offset 32 comes off the exact integer dots as 32 * s16
static inline __attribute__((always_inline)) void dot_q6k(const uint8_t *row, int64_t g0, int64_t g1, int R,
                                                        const int8_t *xi, int64_t K, const float *xs,
                                                        const int32_t *s16, int64_t ng, int64_t ahead,
                                                        Sums *carry, __m256 *part) {
    const int64_t nb = K / BLOCK;
    const __m256i nib = _mm256_set1_epi8(0xF), two = _mm256_set1_epi8(3);
    __m256 acc[TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    if (carry && g0)
        for (int r = 0; r < R; r++) acc[r] = _mm256_loadu_ps(carry->acc[r]);
    for (int64_t i = g0; i < g1; i++) {
        const uint8_t *p = row + i * 210;
        prefetch_bytes(p + ahead, 210);
        const __m256 d = _mm256_set1_ps(f16(p + 208));
        const __m256 sa = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 192)))));
        const __m256 sb = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 200)))));
        const __m256i qh0 = _mm256_loadu_si256((const __m256i *)(p + 128));
        const __m256i qh1 = _mm256_loadu_si256((const __m256i *)(p + 160));
        __m256i da[TILE][CHAINS], db[TILE][CHAINS], ha[TILE], hb[TILE];  // steps 0..3 (first halves), 4..7 (second halves)
        for (int r = 0; r < R; r++)
            for (int k = 0; k < CHAINS; k++) da[r][k] = db[r][k] = _mm256_setzero_si256();
#if STEP_PAIRS
        __m512i pairs[TILE][2];  // lanes 0..7: da's sums, 8..15: db's (as dot_groups)
        for (int r = 0; r < R; r++) pairs[r][0] = pairs[r][1] = _mm512_setzero_si512();
#endif
        #pragma GCC unroll 4  // as dot_groups' steps
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(p + 32 * c));
            const __m256i ua = _mm256_or_si256(_mm256_and_si256(q, nib),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh0, 2 * c), two), 4));
            const __m256i ub = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), nib),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh1, 2 * c), two), 4));
#if STEP_PAIRS
            const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(ua), ub, 1);
#endif
            for (int r = 0; r < R; r++) {
                const int8_t *x = xi + r * K + i * 256;
#if STEP_PAIRS
                const int k = R <= 2 ? c & 1 : 0;
                pairs[r][k] = _mm512_dpbusd_epi32(pairs[r][k], both, _mm512_loadu_si512((const void *)(x + 64 * c)));
#else  // AVX2: sums16(Q6_K) = 2, two steps' pairs in int16, then one madd
                const __m256i xa = _mm256_loadu_si256((const __m256i *)(x + 64 * c)), xb = _mm256_loadu_si256((const __m256i *)(x + 64 * c + 32));
                if (c % 2 == 0) {
                    ha[r] = _mm256_maddubs_epi16(ua, xa), hb[r] = _mm256_maddubs_epi16(ub, xb);
                } else {
                    da[r][chain(R, c)] = _mm256_add_epi32(da[r][chain(R, c)], widen16(_mm256_add_epi16(ha[r], _mm256_maddubs_epi16(ua, xa))));
                    db[r][chain(R, c)] = _mm256_add_epi32(db[r][chain(R, c)], widen16(_mm256_add_epi16(hb[r], _mm256_maddubs_epi16(ub, xb))));
                }
#endif
            }
        }
        for (int r = 0; r < R; r++) {
            const int32_t *sums = s16 + (r * (K / 256) + i) * 16;
#if STEP_PAIRS
            const __m512i sum = R <= 2 ? _mm512_add_epi32(pairs[r][0], pairs[r][1]) : pairs[r][0];
            const __m512i both = _mm512_sub_epi32(sum, _mm512_slli_epi32(_mm512_loadu_si512((const void *)sums), 5));
            const __m256i ia = _mm512_castsi512_si256(both), ib = _mm512_extracti64x4_epi64(both, 1);
#else
            const __m256i ia = _mm256_sub_epi32(chains_sum(da[r], R), _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)sums), 5));
            const __m256i ib = _mm256_sub_epi32(chains_sum(db[r], R), _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(sums + 8)), 5));
#endif
            const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ib), sb, _mm256_mul_ps(_mm256_cvtepi32_ps(ia), sa));
            acc[r] = _mm256_fmadd_ps(t, _mm256_loadu_ps(xs + r * nb + i * 8), acc[r]);
        }
    }
    if (carry && g1 < ng)
        for (int r = 0; r < R; r++) _mm256_storeu_ps(carry->acc[r], acc[r]);
    else
        for (int r = 0; r < R; r++) part[r] = acc[r];
}

// The activations of one call as the dots read them: xq (M, K) in blocks of 32 with scales xs and
// xs * sum(xq) per block (xsum); where K-quant parts are present, xi and s16 too (interleave_rows)
typedef struct {
    const float *x;
    const int8_t *xq, *xi;
    const float *xs, *xsum;
    const int32_t *s16;
} Acts;

// Groups g0..g1-1 of one weight row . R activation rows from m0. With carry NULL: one pass over all ng
// groups (g0 = 0, g1 = ng), the sums in registers. Else the sums come from *carry (g0 > 0) and go back to it
// (g1 < ng): see "Spans of groups". The call that ends the row writes out[0..R-1], a legacy row's blocks
// past its last group added. Meanwhile the weight bytes `ahead` bytes past each group's are asked into L1.
static inline __attribute__((always_inline)) void dot_rows(int type, const uint8_t *row, int64_t g0, int64_t g1,
                                                         int R, const Acts *a, int64_t m0, int64_t K,
                                                         int64_t ahead, Sums *carry, float *out) {
    const int64_t nb = K / BLOCK, ng = K / 256;
    const float *xs = a->xs + m0 * nb, *sums = a->xsum + m0 * nb;
    const int8_t *xi = a->xi + m0 * K;
    const int32_t *s16 = a->s16 + m0 * ng * 16;
    __m256 part[TILE];  // each row's lanes, summed once the row ends
    float mins[TILE] = {0};
    for (int r = 0; r < R; r++) part[r] = _mm256_setzero_ps();
    if (type == Q6_K)
        dot_q6k(row, g0, g1, R, xi, K, xs, s16, ng, ahead, carry, part);
    else if (ng)
        dot_groups(type, row, g0, g1, R, xi, K, xs, sums, s16, ng, ahead, carry, part);
    if (g1 < ng) return;  // the sums went to carry
    if (!is_kquant(type) && ng * 8 < nb)  // a legacy row's blocks past its groups, into the same lanes
        dot_legacy(type, row, ng * 8, nb, R, a->xq + m0 * K, K, xs, sums, part, mins);
    hsum_rows(part, R, out);
    for (int r = 0; r < R; r++) out[r] += mins[r];
}

// dot_rows with R constant (the accumulators stay in registers); column calls it with `type` constant too,
// so that each type gets its own loops without a branch on the type inside them: 0.70-0.77x the time of
// one copy for all types on qwen2.5-coder-1.5b and smollm2-135m (AVX2, AMD Zen 3)
static inline __attribute__((always_inline)) void dot_tile(int type, const uint8_t *row, int64_t g0, int64_t g1,
                                                         int R, const Acts *a, int64_t m0, int64_t K,
                                                         int64_t ahead, Sums *carry, float *out) {
    switch (R) {
    case 1: dot_rows(type, row, g0, g1, 1, a, m0, K, ahead, carry, out); break;
    case 2: dot_rows(type, row, g0, g1, 2, a, m0, K, ahead, carry, out); break;
    case 3: dot_rows(type, row, g0, g1, 3, a, m0, K, ahead, carry, out); break;
    default: dot_rows(type, row, g0, g1, 4, a, m0, K, ahead, carry, out); break;
    }
}

// Output column n for all M activation rows: weight row `row` (of `type`; F32: float32 values) against the
// activations; y[m * ldy] = dot + b.
static void column(int type, const uint8_t *row, int64_t K, int64_t M, const Acts *a, float b, float *y,
                   int64_t ldy) {
    if (type == F32) {
        const float *wn = (const float *)row;
        for (int64_t m = 0; m < M; m++) {
            const float *xm = a->x + m * K;
            __m256 acc = _mm256_setzero_ps();
            int64_t k = 0;
            for (; k + 8 <= K; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(wn + k), _mm256_loadu_ps(xm + k), acc);
            float s = hsum_ps(acc);
            for (; k < K; k++) s += wn[k] * xm[k];
            y[m * ldy] = s + b;
        }
        return;
    }
    for (int64_t m0 = 0; m0 < M; m0 += TILE) {
        const int R = M - m0 < TILE ? (int)(M - m0) : TILE;
        float out[TILE];
        switch (type) {
        case Q4_0: dot_tile(Q4_0, row, 0, K / 256, R, a, m0, K, PREFETCH, NULL, out); break;
        case Q4_1: dot_tile(Q4_1, row, 0, K / 256, R, a, m0, K, PREFETCH, NULL, out); break;
        case Q5_0: dot_tile(Q5_0, row, 0, K / 256, R, a, m0, K, PREFETCH, NULL, out); break;
        case Q5_1: dot_tile(Q5_1, row, 0, K / 256, R, a, m0, K, PREFETCH, NULL, out); break;
        case Q8_0: dot_tile(Q8_0, row, 0, K / 256, R, a, m0, K, PREFETCH, NULL, out); break;
        case Q4_K: dot_tile(Q4_K, row, 0, K / 256, R, a, m0, K, PREFETCH, NULL, out); break;
        case Q5_K: dot_tile(Q5_K, row, 0, K / 256, R, a, m0, K, PREFETCH, NULL, out); break;
        default: dot_tile(Q6_K, row, 0, K / 256, R, a, m0, K, PREFETCH, NULL, out); break;
        }
        for (int r = 0; r < R; r++) y[(m0 + r) * ldy] = out[r] + b;
    }
}

// -- Spans of groups ----------------------------------------------------------------------------------
// A tile of R activation rows is read once per output column. Where it fits in L1 with the weights
// streaming past it, a column takes all of its groups in one pass (column). Where it does not
// (qwen2.5-coder-1.5b's ffn_down at four rows: 35 KB of int8 values, plus their scales and sums, ~52 KB
// against a 48 KB L1), every column read it from L2 again, and the 4-row ffn_down ran at 1.65x the time it
// took with every activation load sent to one L1-resident 2 KB. So there the columns go in panels of
// PANEL, and a panel takes its groups in spans of span_groups: span by span, every column of the panel
// adds the span's groups to its running sums, carried in a Sums from one span to the next. Each sum
// still takes its groups one after the other in the same order, so the bits are those of one pass (and do
// not depend on R or on the thread count). The 4-row ffn_down: 0.72-0.78x the time (qwen2.5-coder-1.5b,
// AMD Zen 5, 2 threads); PANEL 16, 64 and 128 and SPAN_BYTES 24 and 40 KB measured within 10% of these.
// The loop over a panel's columns sits in span, around the dots, as column's loop over row tiles does:
// with it in the caller, GCC 12 kept the 4-row loops' accumulators in memory too (a store each per group).
#define PANEL 32
#define SPAN_BYTES 32768  // of activations a span may read: 2/3 of a 48 KB L1, the rest for the weights
// what one group of 256 values costs an activation row: its int8 values, xs and xsum per block, s16
#define ACT_GROUP_BYTES (256 + 2 * 8 * 4 + 16 * 4)

// groups a span of R rows takes: all ng where they fit in SPAN_BYTES, else spans of about equal size
static inline int64_t span_groups(int R, int64_t ng) {
    const int64_t most = SPAN_BYTES / (R * ACT_GROUP_BYTES);
    if (most >= ng) return ng > 0 ? ng : 1;
    const int64_t spans = (ng + most - 1) / most;
    return (ng + spans - 1) / spans;  // where 35 groups in spans of at most 21 would leave one of 14: 18 and 17
}

// groups g0..g1-1 of the panel's rows (not F32) . the R rows from m0, each row's sums carried in its Sums;
// the last span writes outs; for each row, the weight bytes of the call two on are asked into L1 on the way
static void span(const uint8_t *const *rows, const int *types, int64_t cols, int64_t g0, int64_t g1, int R,
                 const Acts *a, int64_t m0, int64_t K, Sums *sums, float (*outs)[TILE]) {
    for (int64_t c = 0; c < cols; c++) {
        const int type = types[c];
        if (type == F32) continue;
        // what the call two on reads: the span of the column after next, or past the panel's last columns,
        // the first ones' next span
        const int64_t c2 = (c + 2) % cols, at = c + 2 < cols ? g0 : g1;
        const int64_t ahead = (int64_t)((uintptr_t)(rows[c2] + at * group_bytes(types[c2])) -
                                        (uintptr_t)(rows[c] + g0 * group_bytes(type)));
        const uint8_t *row = rows[c];
        Sums *carry = &sums[c];
        float *out = outs[c];
        switch (type) {
        case Q4_0: dot_tile(Q4_0, row, g0, g1, R, a, m0, K, ahead, carry, out); break;
        case Q4_1: dot_tile(Q4_1, row, g0, g1, R, a, m0, K, ahead, carry, out); break;
        case Q5_0: dot_tile(Q5_0, row, g0, g1, R, a, m0, K, ahead, carry, out); break;
        case Q5_1: dot_tile(Q5_1, row, g0, g1, R, a, m0, K, ahead, carry, out); break;
        case Q8_0: dot_tile(Q8_0, row, g0, g1, R, a, m0, K, ahead, carry, out); break;
        case Q4_K: dot_tile(Q4_K, row, g0, g1, R, a, m0, K, ahead, carry, out); break;
        case Q5_K: dot_tile(Q5_K, row, g0, g1, R, a, m0, K, ahead, carry, out); break;
        default: dot_tile(Q6_K, row, g0, g1, R, a, m0, K, ahead, carry, out); break;
        }
    }
}

// The weight rows of y's columns: part p is rows[p] rows of ggml type types[p] at weights[p], row_bytes[p]
// bytes each
typedef struct {
    const int32_t *types;
    const uint64_t *weights;
    const int64_t *rows, *row_bytes;
} Parts;

static inline const uint8_t *weight_row(const Parts *w, int64_t n, int *type) {
    int p = 0;
    while (n >= w->rows[p]) n -= w->rows[p++];
    *type = w->types[p];
    return (const uint8_t *)(uintptr_t)w->weights[p] + n * w->row_bytes[p];
}

// Columns n0..n1-1 (at most PANEL) for all M activation rows, tile by tile of rows, span by span of groups;
// y[m * ldy + n] = dot + bias[n]
static void panel(const Parts *w, int64_t n0, int64_t n1, int64_t K, int64_t M, const Acts *a, const float *bias,
                  float *y, int64_t ldy) {
    const uint8_t *rows[PANEL];
    int types[PANEL];
    const int64_t ng = K / 256, cols = n1 - n0;
    for (int64_t c = 0; c < cols; c++) {
        rows[c] = weight_row(w, n0 + c, &types[c]);
        if (types[c] == F32) column(F32, rows[c], K, M, a, bias ? bias[n0 + c] : 0.0f, y + n0 + c, ldy);
    }
    for (int64_t m0 = 0; m0 < M; m0 += TILE) {
        const int R = M - m0 < TILE ? (int)(M - m0) : TILE;
        const int64_t G = span_groups(R, ng);
        Sums sums[PANEL];  // each written by its column's first span, read by the next
        float outs[PANEL][TILE];
        for (int64_t g0 = 0; g0 < ng; g0 += G) {
            const int64_t g1 = g0 + G < ng ? g0 + G : ng;
            span(rows, types, cols, g0, g1, R, a, m0, K, sums, outs);
        }
        for (int64_t c = 0; c < cols; c++) {
            if (types[c] == F32) continue;
            const float b = bias ? bias[n0 + c] : 0.0f;
            for (int r = 0; r < R; r++) y[(m0 + r) * ldy + n0 + c] = outs[c][r] + b;
        }
    }
}

// y (M, N) = x (M, K) @ W.T (+ bias), W the rows of nparts parts stacked in order: part p is rows[p]
// rows of ggml type types[p] at address weights[p], row_bytes[p] bytes each (F32: float32 values; the others
// interleaved, gguf_repack). x is quantized once when a part has blocks; K % 32 == 0 then (K-quants: % 256).
void gguf_linear(const float *x, int64_t M, int64_t K, int nparts, const int32_t *types, const uint64_t *weights,
                 const int64_t *rows, const int64_t *row_bytes, const float *bias, float *y, int threads) {
    int64_t N = 0;
    int blocks = 0;
    for (int p = 0; p < nparts; p++) {
        N += rows[p];
        blocks |= types[p] != F32;
    }
    Acts a = {x, NULL, NULL, NULL, NULL, NULL};
    int8_t *xq = NULL, *xi = NULL;
    float *xs = NULL, *xsum = NULL;
    int32_t *s16 = NULL;
    if (blocks && M > 0) {
        xq = malloc((size_t)(M * K));
        xs = malloc(sizeof(float) * (size_t)(M * (K / BLOCK)));
        xsum = malloc(sizeof(float) * (size_t)(M * (K / BLOCK)));
        quantize_rows_sums(x, M, K, xq, xs, xsum);
        if (K >= 256) {
            xi = malloc((size_t)(M * K));
            s16 = malloc(sizeof(int32_t) * (size_t)(M * (K / 16)));
            interleave_rows(xq, M, K, xi, s16);
        }
    }
    a.xq = xq, a.xi = xi, a.xs = xs, a.xsum = xsum, a.s16 = s16;
    const Parts w = {types, weights, rows, row_bytes};
    const int tile = M < TILE ? (int)M : TILE;
    if (tile == 0 || span_groups(tile, K / 256) >= K / 256) {  // a tile of rows fits in L1: one pass a column
        #pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t n = 0; n < N; n++) {
            int type;
            const uint8_t *row = weight_row(&w, n, &type);
            column(type, row, K, M, &a, bias ? bias[n] : 0.0f, y + n, N);
        }
    } else {
        #pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t i = 0; i < (N + PANEL - 1) / PANEL; i++)
            panel(&w, i * PANEL, (i + 1) * PANEL < N ? (i + 1) * PANEL : N, K, M, &a, bias, y, N);
    }
    free(xq);
    free(xi);
    free(xs);
    free(xsum);
    free(s16);
}
