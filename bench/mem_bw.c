// llama-sparse: memory read bandwidth of this machine, for reading GEMV/decode timings against it.
// nth threads each read a disjoint part of one buffer with 32-byte loads; fastest of the passes.
//   gcc -O2 -mavx2 -pthread bench/mem_bw.c -o /tmp/mem_bw && /tmp/mem_bw [threads] [MiB] [passes]
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t      n_bytes;
static const char * buf;
static int         nth;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec*1e-9;
}

static void * reader(void * arg) {
    const long    i = (long) arg;
    const size_t  n = n_bytes/nth/128*128;
    const __m256i * p = (const __m256i *) (buf + i*n);
    __m256i s = _mm256_setzero_si256();
    for (size_t k = 0; k < n/32; k += 4) {
        // xor keeps the loads live without a dependency chain on arithmetic latency
        s = _mm256_xor_si256(s, _mm256_load_si256(p + k + 0));
        s = _mm256_xor_si256(s, _mm256_load_si256(p + k + 1));
        s = _mm256_xor_si256(s, _mm256_load_si256(p + k + 2));
        s = _mm256_xor_si256(s, _mm256_load_si256(p + k + 3));
    }
    return (void *) (long) _mm256_extract_epi32(s, 0);
}

int main(int argc, char ** argv) {
    nth = argc > 1 ? atoi(argv[1]) : 2;
    const size_t mib = argc > 2 ? (size_t) atol(argv[2]) : 512;
    const int passes = argc > 3 ? atoi(argv[3]) : 20;
    n_bytes = mib << 20;
    char * b = aligned_alloc(64, n_bytes);
    memset(b, 1, n_bytes);
    buf = b;
    double best = 1e30;
    for (int r = 0; r < passes; ++r) {
        pthread_t th[64];
        const double t0 = now_s();
        for (long i = 0; i < nth; ++i) {
            pthread_create(&th[i], NULL, reader, (void *) i);
        }
        for (int i = 0; i < nth; ++i) {
            pthread_join(th[i], NULL);
        }
        const double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    printf("threads %d: read %.1f GB/s (fastest of %d passes over %zu MiB)\n", nth, n_bytes/best/1e9, passes, mib);
    free(b);
    return 0;
}
