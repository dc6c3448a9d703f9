// Repacking at load: each row's groups of 256 values from the file's layout into the interleaved one that
// gguf_linear reads (see "Groups of 256 values, interleaved" in gguf_blocks.h).
#include "gguf_blocks.h"

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
