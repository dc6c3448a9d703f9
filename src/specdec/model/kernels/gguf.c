// Matmul over a GGUF file's own quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) for
// AVX2: the weights keep the file's values and scales, unpacked inside the kernel; activations are
// quantized to int8 in blocks of 32 with a float scale each (Q8_0's layout, as w8a8.c), and each 32
// values contribute xs * a * sum(q * xq) + c * xs * sum(xq), where the file's block gives w = a * q + c
// (a per 16 values for Q6_K) and the integer sums are exact. llama.cpp quantizes the activations of
// K-quant weights with one scale per 256 values (Q8_K), which is faster for 4-row verify batches but
// measured 5x the KL from the file's own model on qwen2.5-coder-1.5b; specdec keeps blocks of 32.
//
// At load, each row's groups of 256 values get their bits reordered (gguf_repack, see "Groups of 256
// values, interleaved"), so that the float work of a block of 32 (a conversion, a product, an fma per
// activation row) is done for 8 blocks at once.
//
// The integer dots take one vpdpbusd each where AVX512-VNNI is compiled in (model/kernels builds it so
// where the CPU has it), else maddubs, with the int16 sums of up to 8 steps added before one madd widens
// them (sums16): the same integers, so the same bits on either build.
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

static inline float hsum_ps(__m256 s) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

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
            // a NaN activation makes the block's scale NaN, so that it reaches every output it feeds (it was
            // quantized to -128, giving finite garbage where a float matmul gives NaN)
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

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
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

// -- Groups of 256 values, interleaved ---------------------------------------------------------------
// The kernel keeps a tensor's groups of 256 values (a K-quant super-block, or 8 blocks of a legacy type)
// with their bits moved (gguf_repack: the same bytes per group, the same values and scales) so that one
// 32-byte vector holds 4 values of each of the 8 sub-blocks of 32: step t (0..7) holds values 4t..4t+3 of
// sub-block l in bytes 4l..4l+3. The activations are quantized in the same order (interleave_rows). Then
// the integer dots of 8 steps sum into one vector whose lane l is sub-block l's whole dot, and a group
// takes one conversion and one fma per row, with the 8 sub-blocks' float factors as one vector, where
// the file's layout took one per sub-block. q is a value's bits without scale or offset (unsigned, but
// Q8_0's int8); the interleaved layout of a group:
//   Q4_K (144 bytes): d, dmin, scales[12] as in the file; qs[32c + 4l + e]: low nibble = q of step c,
//                     high nibble = q of step c + 4 (sub-block l, value 4t + e)
//   Q5_K (176): d, dmin, scales[12]; qh[4l + e]: bit t = bit 4 of q of step t; qs as Q4_K's (bits 0..3)
//   Q6_K (210): ql[128] as Q4_K's qs (bits 0..3); qh[32h + 4l + e]: bits 2u..2u+1 = bits 4..5 of q of
//               step 4h + u; scales[16]: the 8 sub-blocks' first-half scales, then their second-half
//               ones (steps 0..3 are values 0..15, which share a scale); d
//   Q4_0, Q4_1, Q5_0, Q5_1 (8 blocks' bytes): the 8 fp16 scales d, (with a min) the 8 fp16 mins, then
//               (Q5) qh as Q5_K's and qs as Q4_K's
//   Q8_0 (272): the 8 fp16 scales, then step t's 32 int8 at 16 + 32t
// A row's blocks past its last whole group (legacy types, K % 256 != 0) stay as the file has them.
// k_unpack reads a group's 256 q in either layout, k_pack writes them in the interleaved one, and
// transpose_steps turns one order into the other.

static inline int is_kquant(int type) { return type == Q4_K || type == Q5_K || type == Q6_K; }
static inline int block_bytes(int type) {  // a legacy block of 32
    return type == Q4_0 ? 18 : type == Q4_1 ? 20 : type == Q5_0 ? 22 : type == Q5_1 ? 24 : 34;
}
static inline int group_bytes(int type) {
    return type == Q4_K ? 144 : type == Q5_K ? 176 : type == Q6_K ? 210 : 8 * block_bytes(type);
}
static inline int has_min(int type) { return type == Q4_1 || type == Q5_1; }
// what a type's stored q carries: w = a * (q - offset) + c
static inline int q_offset(int type) { return type == Q4_0 ? 8 : type == Q5_0 ? 16 : type == Q6_K ? 32 : 0; }
// bits a value keeps above its nibble
static inline int high_bits(int type) { return type == Q6_K ? 2 : (type == Q5_K || type == Q5_0 || type == Q5_1); }
// where the interleaved layout keeps a group's low nibbles (qs) and high bits (qh)
typedef struct {
    int qs, qh;
} Bits;
static inline Bits interleaved_bits(int type) {
    switch (type) {
    case Q4_K: return (Bits){16, 0};
    case Q5_K: return (Bits){48, 16};
    case Q6_K: return (Bits){0, 128};
    case Q4_0: return (Bits){16, 0};
    case Q4_1: return (Bits){32, 0};
    case Q5_0: return (Bits){48, 16};
    case Q8_0: return (Bits){16, 0};  // 256 int8, no nibbles
    default: return (Bits){64, 32};  // Q5_1
    }
}

static inline __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline void store32(uint8_t *p, __m256i v) { _mm256_storeu_si256((__m256i *)p, v); }
// bits `shift`.. of every byte of v, `mask` wide (shift + width <= 8)
static inline __m256i bits_at(__m256i v, int shift, int mask) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8((char)mask));
}
// v's bytes (each below 2^(8 - shift)) moved up by shift
static inline __m256i bits_to(__m256i v, int shift) { return _mm256_sll_epi16(v, _mm_cvtsi32_si128(shift)); }

// step (interleaved) or sub-block (file) `at`'s q from its nibbles and, where the type has them, high bits
static inline __m256i with_high(int type, const uint8_t *qh, __m256i nibbles, int at) {
    const int high = high_bits(type);
    if (high == 1)  // bit k of byte w: sub-block / step k's
        return _mm256_or_si256(nibbles, bits_to(bits_at(load32(qh), at, 1), 4));
    if (high == 2)  // 32 bytes per 4 sub-blocks / steps; bits 2u..2u+1: the u-th of them
        return _mm256_or_si256(nibbles, bits_to(bits_at(load32(qh + 32 * (at >> 2)), 2 * (at & 3), 3), 4));
    return nibbles;
}

// The group at p -> q[256]: in the file's layout, value v of sub-block l at q[32l + v]; in the
// interleaved one, step t's 32 bytes at q[32t]
static void k_unpack(int type, int interleaved, const uint8_t *p, uint8_t q[256]) {
    if (type == Q8_0 && interleaved) {
        memcpy(q, p + 16, 256);
    } else if (!is_kquant(type) && !interleaved) {  // a legacy type's 8 blocks, offsets added back
        for (int l = 0; l < 8; l++)
            store32(q + 32 * l, _mm256_add_epi8(unpack(type, p, l).q, _mm256_set1_epi8((char)q_offset(type))));
    } else {
        const Bits bits = interleaved ? interleaved_bits(type) : (Bits){type == Q4_K ? 16 : type == Q5_K ? 48 : 0,
                                                                        type == Q5_K ? 16 : 128};
        for (int c = 0; c < 4; c++) {  // 32 bytes of nibbles: steps c and c + 4, or two of the file's sub-blocks
            const __m256i v = load32(p + bits.qs + 32 * c);
            int at_lo = interleaved ? c : 2 * c, at_hi = interleaved ? c + 4 : 2 * c + 1;
            if (type == Q6_K && !interleaved)  // half c / 2: bytes 32 (c % 2) hold groups c % 2 and 2 + c % 2
                at_lo = 4 * (c >> 1) + (c & 1), at_hi = at_lo + 2;
            store32(q + 32 * at_lo, with_high(type, p + bits.qh, bits_at(v, 0, 0xF), at_lo));
            store32(q + 32 * at_hi, with_high(type, p + bits.qh, bits_at(v, 4, 0xF), at_hi));
        }
    }
}

// q[256] in the interleaved order (step t at q[32t]) -> the bits of the group at p (other fields kept)
static void k_pack(int type, const uint8_t q[256], uint8_t *p) {
    if (type == Q8_0) {
        memcpy(p + 16, q, 256);
        return;
    }
    const Bits bits = interleaved_bits(type);
    const int high = high_bits(type);
    __m256i hb[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int t = 0; t < 8; t++) {
        const __m256i v = load32(q + 32 * t);
        if (high == 1) hb[0] = _mm256_or_si256(hb[0], bits_to(bits_at(v, 4, 1), t));
        if (high == 2) hb[t >> 2] = _mm256_or_si256(hb[t >> 2], bits_to(bits_at(v, 4, 3), 2 * (t & 3)));
    }
    for (int c = 0; c < 4; c++)
        store32(p + bits.qs + 32 * c, _mm256_or_si256(bits_at(load32(q + 32 * c), 0, 0xF),
                                                      bits_to(bits_at(load32(q + 32 * (c + 4)), 0, 0xF), 4)));
    for (int h = 0; h < high; h++) store32(p + bits.qh + 32 * h, hb[h]);
}

// The file's order (q[32l + 4t + e]) <-> the interleaved one (q[32t + 4l + e]): an 8 x 8 transpose of
// 4-byte words, its own inverse
static inline void transpose_steps(const uint8_t *src, uint8_t *dst) {
    for (int l = 0; l < 8; l++)
        for (int t = 0; t < 8; t++) memcpy(dst + 32 * t + 4 * l, src + 32 * l + 4 * t, 4);
}

// One group from the file's layout to the interleaved one
static void k_move(int type, const uint8_t *src, uint8_t *dst) {
    uint8_t q[256], qi[256];
    memcpy(dst, src, (size_t)group_bytes(type));  // K-quants: d, dmin, scales (Q6_K: reordered below)
    if (!is_kquant(type)) {  // the blocks' scales (and mins) first
        const int bb = block_bytes(type);
        for (int l = 0; l < 8; l++) {
            memcpy(dst + 2 * l, src + l * bb, 2);
            if (has_min(type)) memcpy(dst + 16 + 2 * l, src + l * bb + 2, 2);
        }
    }
    k_unpack(type, 0, src, q);
    transpose_steps(q, qi);
    k_pack(type, qi, dst);
    if (type == Q6_K)  // file: scale j for values 16j..16j+15; interleaved: [sc[2l] for l], then [sc[2l+1] for l]
        for (int l = 0; l < 8; l++) dst[192 + l] = src[192 + 2 * l], dst[200 + l] = src[192 + 2 * l + 1];
}

// A tensor (N rows of row_bytes) in the file's layout -> dst in the kernel's: each row's whole groups of
// 256 values interleaved, the rest (F32; a legacy row's last K % 256 values) copied
void gguf_repack(int type, const uint8_t *src, int64_t N, int64_t row_bytes, uint8_t *dst, int threads) {
    memcpy(dst, src, (size_t)(N * row_bytes));
    if (type == F32) return;
    const int bytes = group_bytes(type);
    const int64_t K = is_kquant(type) ? row_bytes / bytes * 256 : row_bytes / block_bytes(type) * BLOCK;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < K / 256; i++)
            k_move(type, src + n * row_bytes + i * bytes, dst + n * row_bytes + i * bytes);
}

// xq (M, K) in blocks of 32 -> xi (M, K): each whole 256 values in the interleaved order, step t's 32 bytes at
// 64 (t % 4) + 32 (t / 4), so that steps t and t + 4 (one load of the weights' nibbles) lie side by side
// (STEP_PAIRS): xi[64 (t % 4) + 32 (t / 4) + 4l + e] = xq[32l + 4t + e] (the rest not written); s16 (M, K / 256, 16) int32: each sub-block's sum of its
// first 16 values, then of its last 16 (what the types' offsets take off). The transpose is one of 8 x 8
// 4-byte words in registers, and the sums come from the transposed steps: lane l of step t's word sums
// (maddubs by ones, then madd) is the sum of values 4t..4t+3 of sub-block l, so steps 0..3 add up to the
// first 16 values' sum and 4..7 to the last 16's. Exact integers; a scalar loop took ~4 us a call at four
// rows of K = 8960 (qwen2.5-coder-1.5b's ffn_down).
static void interleave_rows(const int8_t *xq, int64_t M, int64_t K, int8_t *xi, int32_t *s16) {
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
// (always_inline: GCC 12 found the out-of-line function free of effects and dropped its calls)
static inline __attribute__((always_inline)) void prefetch_bytes(const uint8_t *p, int bytes) {
    for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
}

// The running sums of one weight row against R activation rows, carried from one span of its groups to
// the next (see "Spans of groups"): acc takes the scaled integer dots, accm the mins' terms
typedef struct {
    float acc[TILE][8], accm[TILE][8];
} Sums;

static inline __m256 cvt8_ps(const uint8_t *p) {  // 8 uint8 -> 8 floats
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
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
            uint8_t sm[16];
            scales_mins_k4(p + 4, sm);
            a = _mm256_mul_ps(_mm256_set1_ps(f16(p)), cvt8_ps(sm));
            c = _mm256_mul_ps(_mm256_set1_ps(-f16(p + 2)), cvt8_ps(sm + 8));
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

// 32 values w = a0 * q + c (values 0..15) and a1 * q + c (16..31) -> out[0..31]: bf16 (as uint16; a product
// and a sum in one fma, rounded to nearest even) or float32 (a product, then, for the types with a min, a
// sum: the gguf package's values)
static inline void store_values(__m256i q, float a0, float a1, float c, int mins, void *out, int bf16) {
    for (int i = 0; i < 4; i++) {
        const __m128i part = i < 2 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
        const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32((i & 1) ? _mm_srli_si128(part, 8) : part));
        const __m256 a = _mm256_set1_ps(i < 2 ? a0 : a1);
        if (!bf16) {
            const __m256 w = _mm256_mul_ps(v, a);
            _mm256_storeu_ps((float *)out + 8 * i, mins ? _mm256_add_ps(w, _mm256_set1_ps(c)) : w);
            continue;
        }
        __m256i bits = _mm256_castps_si256(_mm256_fmadd_ps(v, a, _mm256_set1_ps(c)));
        bits = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1)),
                                                       _mm256_set1_epi32(0x7FFF)));
        bits = _mm256_srli_epi32(bits, 16);
        _mm_storeu_si128((__m128i *)((uint16_t *)out + 8 * i), _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1)));
    }
}

// A group's 256 values as w = a * (q - q_offset) + c, from the file's layout (K-quants) or the interleaved
// one: q[256] with sub-block l's values at q[32l] (Q8_0's as int8), a[16] one factor per 16 values (the two
// of a sub-block differ for Q6_K only), c[8] per sub-block (0 without a min); a and c are the gguf
// package's float32 products (d * sc, dmin * m negated), so a * (q - offset) + c is its value exactly
static void group_values(int type, int interleaved, const uint8_t *p, uint8_t q[256], float a[16], float c[8]) {
    if (interleaved) {
        uint8_t qi[256];
        k_unpack(type, 1, p, qi);
        transpose_steps(qi, q);
    } else {
        k_unpack(type, 0, p, q);
    }
    uint8_t sm[16];
    if (type == Q4_K || type == Q5_K) scales_mins_k4(p + 4, sm);
    for (int l = 0; l < 8; l++) {
        c[l] = 0.0f;
        if (type == Q6_K) {  // file: scale j for values 16j..; interleaved: the first halves', then the second's
            const float d = f16(p + 208);
            a[2 * l] = d * (float)(int8_t)p[interleaved ? 192 + l : 192 + 2 * l];
            a[2 * l + 1] = d * (float)(int8_t)p[interleaved ? 200 + l : 193 + 2 * l];
        } else if (type == Q4_K || type == Q5_K) {
            a[2 * l] = a[2 * l + 1] = f16(p) * (float)sm[l];
            c[l] = -(f16(p + 2) * (float)sm[8 + l]);
        } else {  // a legacy group: the blocks' scales (and mins) first
            a[2 * l] = a[2 * l + 1] = f16(p + 2 * l);
            if (has_min(type)) c[l] = f16(p + 16 + 2 * l);
        }
    }
}

// One row of K values of `type` (in the file's layout, or interleaved as gguf_linear takes it) -> out[0..K-1]:
// bf16 (as uint16) or float32, exactly the values the gguf package's dequantize gives (a product, then a sum,
// in float32: d * q, d * q + m, (d * sc) * q - dmin * m)
static void row_values(int type, int interleaved, const uint8_t *row, int64_t K, void *out, int bf16) {
    const int mins = (is_kquant(type) && type != Q6_K) || has_min(type);
    const size_t size = bf16 ? 2 : 4;
    uint8_t *o = out;
    const int64_t ng = is_kquant(type) || interleaved ? K / 256 : 0;  // a legacy file row: blocks only
    for (int64_t i = 0; i < ng; i++) {
        uint8_t q[256];
        float a[16], c[8];
        group_values(type, interleaved, row + i * group_bytes(type), q, a, c);
        for (int l = 0; l < 8; l++)
            store_values(_mm256_sub_epi8(load32(q + 32 * l), _mm256_set1_epi8((char)q_offset(type))), a[2 * l],
                         a[2 * l + 1], c[l], mins, o + (size_t)(i * 256 + 32 * l) * size, bf16);
    }
    for (int64_t b = ng * 8; b < K / BLOCK; b++) {  // legacy blocks in the file's layout
        const Unpacked u = unpack(type, row, b);  // q offset already (Q4_0, Q5_0): w = a0 * q + c
        store_values(u.q, u.a0, u.a0, u.c, mins, o + (size_t)(b * BLOCK) * size, bf16);
    }
}

// The (N, K) weight of `type` (rows of row_bytes, interleaved as gguf_linear takes them) -> out (N, K), bf16
// (as uint16) or float32: the dense weight, and what a prefill's dense matmul takes (not row-invariant; only
// exact=False spans use it)
void gguf_to_dense(int type, const uint8_t *w, int64_t N, int64_t K, int64_t row_bytes, void *out, int bf16,
                   int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++)
        row_values(type, 1, w + n * row_bytes, K, (uint8_t *)out + (size_t)(n * K) * (bf16 ? 2 : 4), bf16);
}

// Rows ids[0..n-1] of a (V, K) tensor of `type` (rows of row_bytes; in the file's layout, or interleaved as
// gguf_linear takes them) -> out (n, K) float32, the gguf package's values: the embedding's lookups
void gguf_rows(int type, const uint8_t *w, const int64_t *ids, int64_t n, int64_t K, int64_t row_bytes,
               int interleaved, float *out) {
    for (int64_t j = 0; j < n; j++) row_values(type, interleaved, w + ids[j] * row_bytes, K, out + j * K, 0);
}
