// llama-sparse: standalone test and microbenchmark of cuda/attn-decode.cu (one-token flash attention).
//
//   test_attn_cuda test  [--seed S]   every version (2, 3, 6, 8) against a float64 CPU reference: fixed cases (7B /
//                                     8B / SmolLM2 heads, KV cache masks hiding whole blocks or everything, streams,
//                                     nb forced; version 8 also at 3k-20k positions) and 200 random ones; outputs
//                                     poisoned with NaN first
//   test_attn_cuda bench              us a launch in a CUDA graph of 256 back-to-back launches that cycle through 32
//                                     layers' K/V (as decode, which reads another layer's cache in between), per
//                                     version, 7B (32 heads) and 8B (32/8) at 256-2048 positions
//   test_attn_cuda bench-long         8B heads at 4k-32k positions: versions 2, 3 and 8 at several blocks a KV head,
//                                     checked against float64 at 32k, then timed over 8 layers' K/V (bytes beyond L2)
#include "ggml-cuda/common.cuh"
#include "ggml-cuda-stubs.h"
#include "graph-time.h"
#include "attn-decode.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// the kernel's versions (attn-decode.cu), each tested and benched
static const int ad_versions[] = { 2, 3, 6, 8 };
#define AD_SHORT_KV 2048 // longer cases: version 8 only (the others are capped there)

struct ad_case {
    int D, H, Hkv, n_kv, vis, n_seq, nb; // vis: visible positions (the rest -inf); nb 0: the launcher's choice
};

struct ad_dev {
    half  * k = nullptr, * v = nullptr, * mask = nullptr;
    float * q = nullptr, * dst = nullptr;
};

// host data of one case: cache rows hold the KV heads side by side (as llama's K cache), n_kv rows a stream
struct ad_host {
    std::vector<half>  k, v, mask;
    std::vector<float> q;
};

static attn_decode_args ad_args(const ad_case & c, const ad_dev & d) {
    attn_decode_args a = {};
    a.q = d.q;       a.q_s2 = c.D;            a.q_s3 = (int64_t) c.D*c.H;
    a.k = d.k;       a.k_s1 = (int64_t) c.Hkv*c.D; a.k_s2 = c.D; a.k_s3 = (int64_t) c.n_kv*c.Hkv*c.D;
    a.v = d.v;       a.v_s1 = a.k_s1;         a.v_s2 = a.k_s2; a.v_s3 = a.k_s3;
    a.mask = d.mask; a.m_s2 = 0;              a.m_s3 = c.n_kv; a.m_ne2 = 1; a.m_ne3 = c.n_seq;
    a.dst = d.dst;   a.d_s2 = c.D;            a.d_s3 = (int64_t) c.D*c.H;
    a.D = c.D; a.n_head = c.H; a.n_head_kv = c.Hkv; a.n_kv = c.n_kv; a.n_seq = c.n_seq;
    a.scale = 1.0f/sqrtf((float) c.D);
    return a;
}

static void ad_fill(const ad_case & c, std::mt19937 & rng, ad_host & h) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const size_t nkv = (size_t) c.n_seq*c.n_kv*c.Hkv*c.D;
    h.k.resize(nkv);
    h.v.resize(nkv);
    for (size_t i = 0; i < nkv; ++i) {
        h.k[i] = __float2half(u(rng));
        h.v[i] = __float2half(u(rng));
    }
    h.q.resize((size_t) c.n_seq*c.H*c.D);
    for (float & x : h.q) {
        x = 2.0f*u(rng);
    }
    h.mask.resize((size_t) c.n_seq*c.n_kv);
    for (int s = 0; s < c.n_seq; ++s) {
        for (int p = 0; p < c.n_kv; ++p) {
            h.mask[(size_t) s*c.n_kv + p] = __float2half(p < c.vis ? 0.5f*u(rng) : -INFINITY);
        }
    }
}

// float64 reference: softmax(scale q.k + mask) v per query head; all hidden: 0 (as the CPU backend)
static void ad_ref(const ad_case & c, const ad_host & h, std::vector<double> & out) {
    const int G = c.H/c.Hkv;
    out.assign((size_t) c.n_seq*c.H*c.D, 0.0);
    std::vector<double> s(c.n_kv);
    for (int i3 = 0; i3 < c.n_seq; ++i3) {
        for (int hq = 0; hq < c.H; ++hq) {
            const int hk = hq / G;
            double mx = -INFINITY;
            for (int p = 0; p < c.n_kv; ++p) {
                const float mk = __half2float(h.mask[(size_t) i3*c.n_kv + p]);
                double dot = 0.0;
                const size_t kr = (((size_t) i3*c.n_kv + p)*c.Hkv + hk)*c.D;
                for (int d = 0; d < c.D; ++d) {
                    dot += (double) h.q[((size_t) i3*c.H + hq)*c.D + d]*(double) __half2float(h.k[kr + d]);
                }
                s[p] = std::isinf(mk) ? -INFINITY : dot/sqrt((double) c.D) + mk;
                mx = std::max(mx, s[p]);
            }
            if (mx == -INFINITY) {
                continue;
            }
            double sum = 0.0;
            for (int p = 0; p < c.n_kv; ++p) {
                s[p] = exp(s[p] - mx);
                sum += s[p];
            }
            for (int p = 0; p < c.n_kv; ++p) {
                const size_t vr = (((size_t) i3*c.n_kv + p)*c.Hkv + hk)*c.D;
                for (int d = 0; d < c.D; ++d) {
                    out[((size_t) i3*c.H + hq)*c.D + d] += s[p]/sum*(double) __half2float(h.v[vr + d]);
                }
            }
        }
    }
}

static std::string ad_name(const ad_case & c) {
    char b[160];
    snprintf(b, sizeof(b), "D %3d heads %2d/%d n_kv %4d visible %4d streams %d nb %d", c.D, c.H, c.Hkv, c.n_kv, c.vis,
             c.n_seq, c.nb);
    return b;
}

template <typename T>
static T * ad_upload(const std::vector<T> & h) {
    T * d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(h.size(), 1)*sizeof(T)));
    CUDA_CHECK(cudaMemcpy(d, h.data(), h.size()*sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

static void ad_free(ad_dev & d) {
    CUDA_CHECK(cudaFree(d.q)); CUDA_CHECK(cudaFree(d.k)); CUDA_CHECK(cudaFree(d.v)); CUDA_CHECK(cudaFree(d.mask));
    CUDA_CHECK(cudaFree(d.dst));
}

static int ad_test(const unsigned seed) {
    std::vector<ad_case> cases = {
        { 128, 32, 32, 256, 129, 1, 0 }, { 128, 32, 32, 256, 256, 1, 0 }, { 128, 32, 32, 1, 1, 1, 0 },
        { 128, 32, 32, 256, 0, 1, 0 },   { 128, 32, 32, 256, 1, 1, 0 },   { 128, 32, 8, 2048, 2048, 1, 0 },
        { 128, 32, 8, 640, 513, 1, 0 },  { 128, 32, 8, 300, 37, 1, 0 },   { 64, 9, 3, 100, 77, 1, 0 },
        { 64, 16, 2, 513, 400, 1, 0 },   { 64, 8, 4, 129, 129, 3, 0 },    { 128, 32, 32, 256, 200, 1, 1 },
        { 128, 32, 8, 1000, 999, 1, 3 }, { 128, 12, 4, 2048, 1500, 2, 8 }, { 64, 5, 5, 33, 20, 1, 2 },
        { 128, 32, 8, 20000, 19999, 1, 0 }, { 128, 32, 8, 8192, 5000, 2, 0 }, { 64, 9, 3, 3001, 3001, 1, 0 },
        { 128, 64, 8, 4096, 4096, 1, 256 }, { 128, 32, 32, 3000, 2500, 1, 7 },
    };
    std::mt19937 rng(seed);
    for (int i = 0; i < 200; ++i) {
        ad_case c;
        c.D     = rng() % 2 ? 128 : 64;
        c.Hkv   = 1 + rng() % 8;
        c.H     = c.Hkv*(1 + rng() % 8);
        c.n_kv  = 1 + rng() % (rng() % 4 ? 600 : 2048);
        c.vis   = rng() % 5 == 0 ? c.n_kv : (int) (rng() % (c.n_kv + 1));
        c.n_seq = rng() % 6 == 0 ? 2 : 1;
        c.nb    = rng() % 3 == 0 ? 1 + rng() % 8 : 0;
        cases.push_back(c);
    }
    int failures = 0, n_run = 0;
    double worst = 0.0;
    for (const ad_case & c : cases) {
        ad_host h;
        ad_fill(c, rng, h);
        std::vector<double> ref;
        ad_ref(c, h, ref);
        double rmax = 0.0;
        for (double x : ref) {
            rmax = std::max(rmax, fabs(x));
        }
        ad_dev d;
        d.q = ad_upload(h.q); d.k = ad_upload(h.k); d.v = ad_upload(h.v); d.mask = ad_upload(h.mask);
        CUDA_CHECK(cudaMalloc(&d.dst, ref.size()*sizeof(float)));
        for (const int version : ad_versions) {
            if (c.n_kv > AD_SHORT_KV && version != 8) {
                continue;
            }
            CUDA_CHECK(cudaMemset(d.dst, 0xFF, ref.size()*sizeof(float))); // NaN: every output must be written
            const bool ran = attn_decode_launch(ad_args(c, d), c.nb, 0, 0, version);
            CUDA_CHECK(cudaDeviceSynchronize());
            if (!ran) {
                printf("FAIL v%d %s: not launched\n", version, ad_name(c).c_str());
                ++failures;
                continue;
            }
            std::vector<float> out(ref.size());
            CUDA_CHECK(cudaMemcpy(out.data(), d.dst, out.size()*sizeof(float), cudaMemcpyDeviceToHost));
            double err = 0.0;
            bool   nan = false;
            for (size_t i = 0; i < out.size(); ++i) {
                nan = nan || std::isnan(out[i]);
                err = std::max(err, fabs(out[i] - ref[i]));
            }
            // relative to the largest output (all hidden: every output must be exactly 0)
            const double rel = rmax > 0.0 ? err/rmax : err;
            ++n_run;
            worst = std::max(worst, rel);
            if (nan || rel > 1e-4) {
                printf("FAIL v%d %s: %s, max error %.3e of max |out| %.3e\n", version, ad_name(c).c_str(),
                       nan ? "NaN (an output not written)" : "too large", err, rmax);
                ++failures;
            }
        }
        ad_free(d);
    }
    printf("%zu cases, %d runs, worst relative error %.2e: %s (%d failures)\n", cases.size(), n_run, worst,
           failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}

// `layers` device copies of one case (benches cycle through them, as decode reads another layer's cache in between)
static std::vector<ad_dev> ad_layers(const ad_case & c, const ad_host & h, const int layers) {
    std::vector<ad_dev> L(layers);
    for (ad_dev & d : L) {
        d.q = ad_upload(h.q); d.k = ad_upload(h.k); d.v = ad_upload(h.v); d.mask = ad_upload(h.mask);
        CUDA_CHECK(cudaMalloc(&d.dst, (size_t) c.H*c.D*sizeof(float)));
    }
    return L;
}

static void ad_layers_free(std::vector<ad_dev> & L) {
    for (ad_dev & d : L) {
        ad_free(d);
    }
}

static int ad_bench() {
    const int layers = 32, launches = 256;
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int Hkv : { 32, 8 }) {
        // (256 positions, 64 visible: decode early in a context of 256, as llama-bench tg128)
        static const int kvs[][2] = { { 32, 32 }, { 256, 64 }, { 256, 256 }, { 512, 512 }, { 1024, 1024 }, { 2048, 2048 } };
        for (const auto & kv : kvs) {
            const int n_kv = kv[0];
            const ad_case c = { 128, 32, Hkv, n_kv, kv[1], 1, 0 };
            std::mt19937 rng(7);
            ad_host h;
            ad_fill(c, rng, h);
            std::vector<ad_dev> L = ad_layers(c, h, layers);
            for (const int version : ad_versions) {
                // one launch outside capture first (version 3 makes its buffers then)
                if (!attn_decode_launch(ad_args(c, L[0]), 0, 0, stream, version)) {
                    printf("bench v%d: not launched\n", version);
                    continue;
                }
                const double us = time_graph_us([&](cudaStream_t s, const int i) {
                    attn_decode_launch(ad_args(c, L[i % layers]), 0, 0, s, version);
                }, launches, stream);
                printf("bench v%d heads 32/%2d n_kv %4d visible %4d: %.2f us a launch (median of 7 graphs of %d)\n",
                       version, Hkv, n_kv, kv[1], us, launches);
            }
            ad_layers_free(L);
        }
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}

// long contexts, Llama-3-8B heads (32/8, D 128), every position visible: first a check of each configuration against
// float64 at 32k, then us a launch cycling through 8 layers' K/V (1 GiB at 32k, beyond L2) and the K/V bytes a us
static int ad_bench_long() {
    const int layers = 8, launches = 64;
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    static const int cfgs[][2] = { { 2, 8 }, { 3, 32 }, { 8, 0 }, { 8, 16 }, { 8, 32 }, { 8, 64 }, { 8, 128 },
                                   { 8, 256 } }; // version, nb
    int failures = 0;
    for (const int n_kv : { 32768, 16384, 8192, 4096 }) {
        const ad_case c = { 128, 32, 8, n_kv, n_kv, 1, 0 };
        std::mt19937 rng(7);
        ad_host h;
        ad_fill(c, rng, h);
        std::vector<ad_dev> L = ad_layers(c, h, layers);
        std::vector<double> ref;
        if (n_kv == 32768) {
            ad_ref(c, h, ref);
        }
        const double bytes = 2.0*n_kv*c.Hkv*c.D*sizeof(half);
        for (const auto & cfg : cfgs) {
            const int version = cfg[0], nb = cfg[1];
            if (!attn_decode_launch(ad_args(c, L[0]), nb, 0, stream, version)) {
                printf("bench-long v%d nb %d n_kv %d: not launched\n", version, nb, n_kv);
                continue;
            }
            if (!ref.empty()) {
                CUDA_CHECK(cudaMemsetAsync(L[0].dst, 0xFF, ref.size()*sizeof(float), stream));
                attn_decode_launch(ad_args(c, L[0]), nb, 0, stream, version);
                std::vector<float> out(ref.size());
                CUDA_CHECK(cudaMemcpyAsync(out.data(), L[0].dst, out.size()*sizeof(float), cudaMemcpyDeviceToHost, stream));
                CUDA_CHECK(cudaStreamSynchronize(stream));
                double err = 0.0, rmax = 0.0;
                bool nan = false;
                for (size_t i = 0; i < ref.size(); ++i) {
                    nan = nan || !std::isfinite(out[i]);
                    err = std::max(err, fabs(out[i] - ref[i]));
                    rmax = std::max(rmax, fabs(ref[i]));
                }
                const bool bad = nan || err > 1e-4*rmax;
                failures += bad;
                printf("check v%d nb %d n_kv %d: max error %.3e of max |out| %.3e%s\n", version, nb, n_kv, err, rmax,
                       bad ? " FAIL" : "");
            }
            const double us = time_graph_us([&](cudaStream_t s, const int i) {
                attn_decode_launch(ad_args(c, L[i % layers]), nb, 0, s, version);
            }, launches, stream);
            printf("bench-long v%d nb %3d heads 32/8 n_kv %5d: %7.2f us a launch, %.2f TB/s of K/V\n", version, nb, n_kv, us,
                   bytes/us*1e-6);
        }
        ad_layers_free(L);
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    return failures ? 1 : 0;
}

int main(int argc, char ** argv) {
    const std::string cmd = argc > 1 ? argv[1] : "test";
    unsigned seed = 1;
    for (int i = 2; i + 1 < argc; ++i) {
        if (!strcmp(argv[i], "--seed")) {
            seed = (unsigned) atoi(argv[i + 1]);
        }
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, cc %d.%d\n", prop.name, prop.major, prop.minor);
    if (cmd == "test") {
        return ad_test(seed);
    }
    if (cmd == "bench") {
        return ad_bench();
    }
    if (cmd == "bench-long") {
        setenv("LLAMA_SPARSE_CUDA_ATTN_MAX_KV", "65536", 0);
        return ad_bench_long();
    }
    fprintf(stderr, "usage: %s test [--seed S] | bench | bench-long\n", argv[0]);
    return 2;
}
