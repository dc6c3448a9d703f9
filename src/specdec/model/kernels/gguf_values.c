// The weights' values, exactly the gguf package's dequantized float32 (or rounded to bf16): the embedding's
// row lookups (gguf_rows) and the dense weight a prefill's bf16 GEMM takes (gguf_to_dense).
#include "gguf_blocks.h"

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
