// llama-sparse: pass/fail counting (and zz_rng.h's generator) shared by the standalone C tests.
// Define ZZ_TEST_SEED before including to pick the test's own stream.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "zz_rng.h"

static int n_pass = 0;
static int n_fail = 0;

#define CHECK(cond, ...) do {                                       \
    if (cond) { n_pass++; } else {                                  \
        n_fail++; printf("FAIL %s:%d: ", __FILE__, __LINE__);       \
        printf(__VA_ARGS__); printf("\n");                          \
    }                                                               \
} while (0)

// ||a - b|| / ||b|| over n floats (the absolute norm when b is all zeros)
static double zz_rel_l2(const float * a, const float * b, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double d = (double) a[i] - b[i];
        num += d*d;
        den += (double) b[i]*b[i];
    }
    return den > 0.0 ? sqrt(num/den) : sqrt(num);
}
