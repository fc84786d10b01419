// llama-sparse: a seeded splitmix64 generator for the standalone C tests and bench programs.
// Define ZZ_TEST_SEED before including to pick the program's own stream.
#pragma once

#include <math.h>
#include <stdint.h>

#ifndef ZZ_TEST_SEED
#define ZZ_TEST_SEED 0x853c49e6748fea9bULL
#endif

static uint64_t rng_state = ZZ_TEST_SEED;

static uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30))*0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27))*0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int rng_int(int lo, int hi) { // [lo, hi]
    return lo + (int) (rng_u64() % (uint64_t) (hi - lo + 1));
}

static float rng_unif(void) {
    return (float) ((rng_u64() >> 11)*(1.0/9007199254740992.0));
}

static float rng_normal(void) {
    const float u1 = rng_unif() + 1e-12f;
    const float u2 = rng_unif();
    return sqrtf(-2.0f*logf(u1))*cosf(6.2831853f*u2);
}
