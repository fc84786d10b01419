// llama-sparse: the G8 layouts of zigzag Q4_0 and Q8_0 weights in CUDA memory (GGML_SPARSE_ZZ_LAYOUT_G256). Host and
// device, so cuda/tests/test_zz_g8.cu checks them on a machine with no GPU.
//
// The file's layout (ROWS) puts a column's 18-byte Q4_0 blocks of one block-row (32 outputs) side by side with the
// other columns'. A skipped column then saves 18 bytes, less than a 32-byte DRAM sector, so at 50 % sparsity ~86 % of
// the sectors are still read. G8 gathers the 8 blocks of a column in block-rows 8r..8r+7 into one 144-byte
// super-block shaped like a Q4_K block, which the direct Q4_K GEMV reads with 16-byte loads:
//   bytes   0..15:  f16 d of sub-block s = 0..7 (the block of block-row 8r + s)
//   bytes 16..143:  output i = 32 s + l (l = 0..31) in the nibble (s & 1) of byte 16 + 32 (s/2) + l, as Q4_K
// and w_i = d_s (q_i - 8). Super-block (r, j) sits at (r n + j) 144: group r takes exactly the bytes of its 8
// block-rows, so the change is done in place, one group at a time.
#pragma once

#include <cstdint>

#define ZZ_G8_ROWS  8   // Q4_0 block-rows a super-block
#define ZZ_G8_BYTES 144 // = sizeof(block_q4_K) = 8 sizeof(block_q4_0)
#define ZZ_Q4_0_BYTES 18

// the super-block of one column from its 8 Q4_0 blocks, src + s src_stride (s = 0..7)
static __host__ __device__ inline void zz_g8_pack(const uint8_t * src, const int64_t src_stride, uint8_t * dst) {
    for (int s = 0; s < ZZ_G8_ROWS; ++s) {
        dst[2*s + 0] = src[s*src_stride + 0];
        dst[2*s + 1] = src[s*src_stride + 1];
    }
    for (int p = 0; p < ZZ_G8_ROWS/2; ++p) {
        const uint8_t * lo = src + (2*p + 0)*src_stride + 2; // quants of sub-blocks 2p and 2p + 1
        const uint8_t * hi = src + (2*p + 1)*src_stride + 2;
        for (int l = 0; l < 32; ++l) {
            // Q4_0: output l < 16 in the low nibble of qs[l], l >= 16 in the high nibble of qs[l - 16]
            const int qa = l < 16 ? lo[l] & 0x0F : lo[l - 16] >> 4;
            const int qb = l < 16 ? hi[l] & 0x0F : hi[l - 16] >> 4;
            dst[16 + 32*p + l] = (uint8_t) (qa | qb << 4);
        }
    }
}

// the 4-bit quant of output i (0..255) of a super-block, and the f16 bits of its sub-block's d
static __host__ __device__ inline int zz_g8_q(const uint8_t * blk, const int i) {
    const int s = i/32;
    return (blk[16 + 32*(s/2) + i%32] >> 4*(s & 1)) & 0x0F;
}
static __host__ __device__ inline uint16_t zz_g8_d_bits(const uint8_t * blk, const int i) {
    const int s = i/32;
    return (uint16_t) (blk[2*s] | blk[2*s + 1] << 8);
}

// Q8_0 the same way: the 8 blocks (34 bytes) of a column in block-rows 8r..8r+7 as one 272-byte super-block,
//   bytes   0..15:  f16 d of sub-block s = 0..7
//   bytes 16..271:  the int8 quant of output i = 32 s + l at byte 16 + i
// The direct kernel's lane g then reads the words at 16 + 32 s + 4g (s = 0..7), as Q4_K's at 16 + 32 p + 4g.
#define ZZ_G8Q8_BYTES 272 // = 8 sizeof(block_q8_0)
#define ZZ_Q8_0_BYTES 34

static __host__ __device__ inline void zz_g8_pack_q8(const uint8_t * src, const int64_t src_stride, uint8_t * dst) {
    for (int s = 0; s < ZZ_G8_ROWS; ++s) {
        dst[2*s + 0] = src[s*src_stride + 0];
        dst[2*s + 1] = src[s*src_stride + 1];
        for (int l = 0; l < 32; ++l) {
            dst[16 + 32*s + l] = src[s*src_stride + 2 + l];
        }
    }
}

static __host__ __device__ inline int zz_g8_q8(const uint8_t * blk, const int i) {
    return (int8_t) blk[16 + i];
}
