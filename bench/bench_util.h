// llama-sparse: helpers shared by the standalone CPU bench programs (bench/gemv_cpu.c, bench/zz_probe.c)
#pragma once

#include <stdlib.h>
#include <time.h>

#include "zz_rng.h" // generator (tests/c; ZZ_TEST_SEED picks the stream)

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec*1e6 + ts.tv_nsec*1e-3;
}

// qsort order of doubles (medians)
static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}
