// llama-sparse: the G8 regrouping of zigzag Q4_0 and Q8_0 weights (cuda/zz-g8.cuh) against their formats, on the host:
// random blocks of random shapes, every output of every super-block. No GPU.
//
//   nvcc -std=c++17 -O2 -I cuda cuda/tests/test_zz_g8.cu -o test_zz_g8 && ./test_zz_g8
#include "zz-g8.cuh"

#include <cstdio>
#include <random>
#include <vector>

// the format: output l (0..31) of a Q4_0 block (f16 d, then qs[16]: l < 16 low nibbles, l >= 16 high)
static int q4_0_q(const uint8_t * blk, const int l) {
    return l < 16 ? blk[2 + l] & 0x0F : blk[2 + l - 16] >> 4;
}

int main() {
    std::mt19937 rng(4321);
    long cases = 0;
    int  bad   = 0;
    for (int t = 0; t < 200; ++t) {
        const int64_t n      = 1 + rng() % 300;
        const int64_t groups = 1 + rng() % 4;
        const int64_t rows   = groups*ZZ_G8_ROWS; // Q4_0 block-rows
        std::vector<uint8_t> src(rows*n*ZZ_Q4_0_BYTES);
        for (auto & b : src) {
            b = (uint8_t) rng();
        }
        std::vector<uint8_t> dst(src.size(), 0xA5);
        for (int64_t r = 0; r < groups; ++r) {
            for (int64_t j = 0; j < n; ++j) {
                zz_g8_pack(src.data() + (r*ZZ_G8_ROWS*n + j)*ZZ_Q4_0_BYTES, n*ZZ_Q4_0_BYTES, dst.data() + (r*n + j)*ZZ_G8_BYTES);
            }
        }
        // output o = 256 r + i of column j: block-row 8r + i/32, its output i%32
        for (int64_t r = 0; r < groups; ++r) {
            for (int64_t j = 0; j < n; ++j) {
                const uint8_t * sb = dst.data() + (r*n + j)*ZZ_G8_BYTES;
                for (int i = 0; i < ZZ_G8_ROWS*32; ++i) {
                    const uint8_t * blk = src.data() + ((r*ZZ_G8_ROWS + i/32)*n + j)*ZZ_Q4_0_BYTES;
                    const uint16_t  d   = (uint16_t) (blk[0] | blk[1] << 8);
                    ++cases;
                    if (zz_g8_q(sb, i) != q4_0_q(blk, i%32) || zz_g8_d_bits(sb, i) != d) {
                        if (bad++ < 5) {
                            printf("FAIL n=%lld group %lld column %lld output %d: q %d d %04x, want q %d d %04x\n",
                                   (long long) n, (long long) r, (long long) j, i, zz_g8_q(sb, i), zz_g8_d_bits(sb, i),
                                   q4_0_q(blk, i%32), d);
                        }
                    }
                }
            }
        }
    }
    printf("g8 regroup: %ld outputs, %d wrong\n", cases, bad);

    // Q8_0: output l of a block is the int8 at byte 2 + l
    long cases8 = 0;
    int  bad8   = 0;
    for (int t = 0; t < 200; ++t) {
        const int64_t n      = 1 + rng() % 300;
        const int64_t groups = 1 + rng() % 4;
        std::vector<uint8_t> src(groups*ZZ_G8_ROWS*n*ZZ_Q8_0_BYTES);
        for (auto & b : src) {
            b = (uint8_t) rng();
        }
        std::vector<uint8_t> dst(src.size(), 0xA5);
        for (int64_t r = 0; r < groups; ++r) {
            for (int64_t j = 0; j < n; ++j) {
                zz_g8_pack_q8(src.data() + (r*ZZ_G8_ROWS*n + j)*ZZ_Q8_0_BYTES, n*ZZ_Q8_0_BYTES,
                              dst.data() + (r*n + j)*ZZ_G8Q8_BYTES);
            }
        }
        for (int64_t r = 0; r < groups; ++r) {
            for (int64_t j = 0; j < n; ++j) {
                const uint8_t * sb = dst.data() + (r*n + j)*ZZ_G8Q8_BYTES;
                for (int i = 0; i < ZZ_G8_ROWS*32; ++i) {
                    const uint8_t * blk = src.data() + ((r*ZZ_G8_ROWS + i/32)*n + j)*ZZ_Q8_0_BYTES;
                    const uint16_t  d   = (uint16_t) (blk[0] | blk[1] << 8);
                    ++cases8;
                    if (zz_g8_q8(sb, i) != (int8_t) blk[2 + i%32] || zz_g8_d_bits(sb, i) != d) {
                        if (bad8++ < 5) {
                            printf("FAIL q8_0 n=%lld group %lld column %lld output %d: q %d d %04x, want q %d d %04x\n",
                                   (long long) n, (long long) r, (long long) j, i, zz_g8_q8(sb, i), zz_g8_d_bits(sb, i),
                                   (int8_t) blk[2 + i%32], d);
                        }
                    }
                }
            }
        }
    }
    printf("g8 regroup q8_0: %ld outputs, %d wrong\n", cases8, bad8);
    return bad != 0 || bad8 != 0;
}
