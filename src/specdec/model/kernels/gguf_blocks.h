// The GGUF library's shared parts (gguf_acts.c, gguf_linear.c, gguf_repack.c, gguf_values.c): the ggml type
// ids, a legacy block of 32 values in the file's layout (unpack), a group of 256 values in the file's layout
// or in the interleaved one the kernel keeps (k_unpack, transpose_steps), and the activations' functions that
// gguf_linear calls. Every value these give is exact: integers, the file's fp16 scales widened.
#ifndef SPECDEC_GGUF_BLOCKS_H
#define SPECDEC_GGUF_BLOCKS_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 32

// ggml type ids
enum { F32 = 0, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

// the sum of s's 8 lanes
static inline float hsum_ps(__m256 s) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
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

// The 6-bit scales and mins of a Q4_K / Q5_K super-block's 12 bytes, in a register: sc[j] = bytes 0..7,
// m[j] = bytes 8..15. The dot loop takes them from there: through 16 bytes on the stack, read back as two
// 8-byte loads (each spanning two 4-byte stores, which the store buffer does not forward), they held up every
// group; in a register, qwen2.5-coder-1.5b's Q4_K linears at one row took 0.88-0.91x the time (AVX2 AMD EPYC,
// 2 threads; four rows 0.94-0.96x).
static inline __m128i scales_mins_k4_reg(const uint8_t *packed) {
    uint32_t u0, u1, u2;
    memcpy(&u0, packed, 4), memcpy(&u1, packed + 4, 4), memcpy(&u2, packed + 8, 4);
    const uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
    const uint32_t sc47 = (u2 & four) | (((u0 >> 6) & two) << 4), m47 = ((u2 >> 4) & four) | (((u1 >> 6) & two) << 4);
    return _mm_set_epi32((int)m47, (int)(u1 & six), (int)sc47, (int)(u0 & six));  // sc[0..7], m[0..7]
}

// the same 16 bytes in memory (gguf_values.c)
static inline void scales_mins_k4(const uint8_t *packed, uint8_t out[16]) {
    _mm_storeu_si128((__m128i *)out, scales_mins_k4_reg(packed));
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
static inline void k_unpack(int type, int interleaved, const uint8_t *p, uint8_t q[256]) {
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

// The file's order (q[32l + 4t + e]) <-> the interleaved one (q[32t + 4l + e]): an 8 x 8 transpose of
// 4-byte words, its own inverse
static inline void transpose_steps(const uint8_t *src, uint8_t *dst) {
    for (int l = 0; l < 8; l++)
        for (int t = 0; t < 8; t++) memcpy(dst + 32 * t + 4 * l, src + 32 * l + 4 * t, 4);
}

// -- The activations (gguf_acts.c) ----------------------------------------------------------------------
void quantize_rows_sums(const float *x, int64_t M, int64_t K, int8_t *xq, float *xs, float *xsum);
void interleave_rows(const int8_t *xq, int64_t M, int64_t K, int8_t *xi, int32_t *s16);

#endif
