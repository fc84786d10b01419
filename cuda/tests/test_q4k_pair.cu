// llama-sparse: the direct GEMV's pair-form Q4_K scale extraction (cuda/q4k-pair.cuh) against get_scale_min_k4 of
// the Q4_K format, on the host: every sub-block, every value of the bytes involved and random headers. No GPU.
//
//   nvcc -std=c++17 -O2 -I cuda cuda/tests/test_q4k_pair.cu -o test_q4k_pair && ./test_q4k_pair
#include "q4k-pair.cuh"

#include <cstdio>
#include <random>

// the format: sub-block j of a block with scales q[12]
static void scale_min_ref(const uint8_t * q, const int j, int & sc, int & mn) {
    if (j < 4) {
        sc = q[j] & 63;
        mn = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static uint32_t word(const uint8_t * q, const int i) {
    return (uint32_t) q[4*i] | (uint32_t) q[4*i + 1] << 8 | (uint32_t) q[4*i + 2] << 16 | (uint32_t) q[4*i + 3] << 24;
}

static int check(const uint8_t * qa, const uint8_t * qb, long & cases) {
    int bad = 0;
    for (int s = 0; s < 8; ++s) {
        uint32_t sc, mn;
        zz_q4_K_pair_bits(word(qa, 0), word(qa, 1), word(qa, 2), word(qb, 0), word(qb, 1), word(qb, 2), s >= 4,
                          zz_pair_consts_make(s), sc, mn);
        int sa, ma, sb, mb;
        scale_min_ref(qa, s, sa, ma);
        scale_min_ref(qb, s, sb, mb);
        const uint32_t want_sc = (0x6400u | sa) | (0x6400u | sb) << 16;
        const uint32_t want_mn = (0x6400u | ma) | (0x6400u | mb) << 16;
        ++cases;
        if (sc != want_sc || mn != want_mn) {
            if (bad++ < 5) {
                printf("FAIL s=%d: sc %08x (want %08x), mn %08x (want %08x)\n", s, sc, want_sc, mn, want_mn);
            }
        }
    }
    return bad;
}

int main() {
    std::mt19937 rng(1234);
    uint8_t qa[12], qb[12];
    long cases = 0;
    int  bad   = 0;
    // every value of each scale byte of block a (the others random), block b random
    for (int i = 0; i < 12; ++i) {
        for (int v = 0; v < 256; ++v) {
            for (int k = 0; k < 12; ++k) {
                qa[k] = (uint8_t) rng();
                qb[k] = (uint8_t) rng();
            }
            qa[i] = (uint8_t) v;
            bad += check(qa, qb, cases);
            qb[i] = (uint8_t) v; // and of block b
            qa[i] = (uint8_t) rng();
            bad += check(qa, qb, cases);
        }
    }
    for (int t = 0; t < 200000; ++t) {
        for (int k = 0; k < 12; ++k) {
            qa[k] = (uint8_t) rng();
            qb[k] = (uint8_t) rng();
        }
        bad += check(qa, qb, cases);
    }
    printf("q4k pair scales: %ld cases, %d wrong\n", cases, bad);
    return bad != 0;
}
