// llama-sparse: the 6-bit scale and min of one Q4_K sub-block for two blocks at once, as the direct GEMV's pair form
// uses them (cuda/mul-mat-zz.cu). Host and device, so cuda/tests/test_q4k_pair.cu checks it on a machine with no GPU.
#pragma once

#include <cstdint>

// __byte_perm: byte i of the result is byte (sel >> 4i) & 7 of {b, a} (a bytes 0-3, b bytes 4-7)
static __host__ __device__ __forceinline__ uint32_t zz_prmt(const uint32_t a, const uint32_t b, const uint32_t sel) {
#ifdef __CUDA_ARCH__
    return __byte_perm(a, b, sel);
#else
    const uint64_t v = (uint64_t) b << 32 | a;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) {
        r |= (uint32_t) ((v >> 8*((sel >> 4*i) & 7)) & 0xFF) << 8*i;
    }
    return r;
#endif
}

// constants of sub-block s: the PRMT selector putting byte s & 3 of two words at bytes 0 and 2, the low-bit mask in
// both halves (63 for s < 4, else 15; its complement picks the high bits' 0x30), the min's shift (4 for s > 3)
struct zz_pair_consts {
    uint32_t psel;
    uint32_t pm6;
    int      pmsh;
};
static __host__ __device__ __forceinline__ zz_pair_consts zz_pair_consts_make(const int s) {
    return { (uint32_t) ((s & 3)*0x11 + (4 + (s & 3))*0x1100), (s < 4 ? 63u : 0x0Fu)*0x10001u, s < 4 ? 0 : 4 };
}

// header words y, z, w (scales[0..11]) of blocks a and b -> 0x6400 | sc and 0x6400 | mn of sub-block s in each half
// (a low, b high), i.e. 1024 + value as f16. s < 4: sc = scales[s] (y), mn = scales[s + 4] (z); s > 3: the low bits in
// scales[s + 4] (w), the high bits in the top of scales[s - 4] (y) and scales[s] (z)
static __host__ __device__ __forceinline__ void zz_q4_K_pair_bits(const uint32_t ay, const uint32_t az, const uint32_t aw,
        const uint32_t by, const uint32_t bz, const uint32_t bw, const bool hi, const zz_pair_consts & c,
        uint32_t & sc, uint32_t & mn) {
    const uint32_t a  = zz_prmt(hi ? aw : ay, hi ? bw : by, c.psel);
    const uint32_t am = zz_prmt(hi ? aw : az, hi ? bw : bz, c.psel) >> c.pmsh;
    const uint32_t b  = zz_prmt(ay, by, c.psel) >> 2;
    const uint32_t bm = zz_prmt(az, bz, c.psel) >> 2;
    // (a & m6) | (b & m2) | 0x6400: m2 = ~m6 & 0x30 (0 where m6 = 63), and ~m6 keeps the exponent bits; two LOP3 each
    sc = (a  & c.pm6) | (((b  & 0x00300030u) | 0x64006400u) & ~c.pm6);
    mn = (am & c.pm6) | (((bm & 0x00300030u) | 0x64006400u) & ~c.pm6);
}
