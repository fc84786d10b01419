// llama-sparse: helpers shared by the standalone CPU bench programs (bench/gemv_cpu.c, bench/gemm_cpu.c,
// bench/zz_probe.c)
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
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

// relative L2 error of y against an fp64 reference
static double rel_err_d(const float * y, const double * ref, int64_t k) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < k; ++i) {
        num += ((double) y[i] - ref[i])*((double) y[i] - ref[i]);
        den += ref[i]*ref[i];
    }
    return den > 0.0 ? sqrt(num/den) : (num > 0.0 ? INFINITY : 0.0);
}

// waits for the child process that timed one side; ends the program where it failed or did not report (ok == 0)
static void bench_wait_side(pid_t pid, const volatile int * ok, const char * prog, const char * side) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || !*ok) {
        fprintf(stderr, "%s: %s process failed (status %d)\n", prog, side, status);
        exit(1);
    }
}
