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

// the regrouping of one type, 200 random shapes: pack(src, src_stride, dst) makes a super-block of sb_bytes from
// 8 blocks of blk_bytes; got(super-block, i) and want(block, l) give the quant of an output, both with d at the
// block's (sub-block's) f16. Prints "label: N outputs, K wrong" and returns K.
template <typename P, typename G, typename W>
static int check(const char * label, const int blk_bytes, const int sb_bytes, P pack, G got, W want, std::mt19937 & rng) {
    long cases = 0;
    int  bad   = 0;
    for (int t = 0; t < 200; ++t) {
        const int64_t n      = 1 + rng() % 300;
        const int64_t groups = 1 + rng() % 4;
        std::vector<uint8_t> src(groups*ZZ_G8_ROWS*n*blk_bytes);
        for (auto & b : src) {
            b = (uint8_t) rng();
        }
        std::vector<uint8_t> dst(groups*n*sb_bytes, 0xA5);
        for (int64_t r = 0; r < groups; ++r) {
            for (int64_t j = 0; j < n; ++j) {
                pack(src.data() + (r*ZZ_G8_ROWS*n + j)*blk_bytes, n*blk_bytes, dst.data() + (r*n + j)*sb_bytes);
            }
        }
        // output o = 256 r + i of column j: block-row 8r + i/32, its output i%32
        for (int64_t r = 0; r < groups; ++r) {
            for (int64_t j = 0; j < n; ++j) {
                const uint8_t * sb = dst.data() + (r*n + j)*sb_bytes;
                for (int i = 0; i < ZZ_G8_ROWS*32; ++i) {
                    const uint8_t * blk = src.data() + ((r*ZZ_G8_ROWS + i/32)*n + j)*blk_bytes;
                    const uint16_t  d   = (uint16_t) (blk[0] | blk[1] << 8);
                    ++cases;
                    if (got(sb, i) != want(blk, i%32) || zz_g8_d_bits(sb, i) != d) {
                        if (bad++ < 5) {
                            printf("FAIL %s n=%lld group %lld column %lld output %d: q %d d %04x, want q %d d %04x\n",
                                   label, (long long) n, (long long) r, (long long) j, i, got(sb, i),
                                   zz_g8_d_bits(sb, i), want(blk, i%32), d);
                        }
                    }
                }
            }
        }
    }
    printf("%s: %ld outputs, %d wrong\n", label, cases, bad);
    return bad;
}

int main() {
    std::mt19937 rng(4321);
    const int bad4 = check("g8 regroup", ZZ_Q4_0_BYTES, ZZ_G8_BYTES, zz_g8_pack, zz_g8_q, q4_0_q, rng);
    // Q8_0: output l of a block is the int8 at byte 2 + l
    const int bad8 = check("g8 regroup q8_0", ZZ_Q8_0_BYTES, ZZ_G8Q8_BYTES, zz_g8_pack_q8, zz_g8_q8,
                           [](const uint8_t * blk, const int l) { return (int) (int8_t) blk[2 + l]; }, rng);
    return bad4 != 0 || bad8 != 0;
}
