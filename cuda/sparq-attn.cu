// llama-sparse: GGML_OP_SPARQ_ATTN on CUDA (SparQ attention at decode; contract in ggml-sparse/ggml-sparse.h,
// algorithm in docs/sparq.md).
//
// Two kernels per call, no host synchronization (CUDA-graph safe):
//  1. sparq_scores, grid (position chunks, KV heads, tokens x streams): every block picks i1 (the top-r
//     components of the group's summed |q|, ties to the lower index) itself, reads the r rows of k_t over its
//     SPARQ_POS positions (position-contiguous, coalesced) and writes the approximate scores of the G heads,
//     plus per head the chunk's max and sum of exp (a split softmax) and the chunk's count of visible positions.
//  2. sparq_attend, one block per (KV head, token, stream): merges the chunk statistics, turns the group-summed
//     softmax of every position into a sortable key in shared memory, finds the k-th largest key by an 8-bit
//     radix select (four passes over shared memory), gathers the k positions (ties to the lower position),
//     then runs exact attention of the G heads over their full K and V rows, alpha and the mean-V blend.
// k >= the visible count: the gather keeps every visible position and no blend is applied (dense attention).
//
// Bytes: step 1 reads r/D of K (plus the mask); step 2 reads k full K and V rows; the scores (H*S floats) go
// through L2.
#include "sparq-attn.cuh"

#ifndef GGML_SPARSE_CUDA_STANDALONE
#include "ggml-sparse.h"
#endif // GGML_SPARSE_CUDA_STANDALONE

#include <cmath>

#define SPARQ_POS_THREADS  128
#define SPARQ_POS_PER_THR  4
#define SPARQ_POS          (SPARQ_POS_THREADS*SPARQ_POS_PER_THR) // positions of one step-1 block
#define SPARQ_ATT_THREADS  512
#define SPARQ_DE           (SPARQ_CUDA_MAX_D/WARP_SIZE)           // head elements per lane in step 2

template <typename T> static __device__ __forceinline__ float sparq_f(const T v);
template <> __device__ __forceinline__ float sparq_f<float>(const float v) { return v; }
template <> __device__ __forceinline__ float sparq_f<half>(const half v) { return __half2float(v); }

struct sparq_args {
    // q F32 [D, n_tok, H, ns] (byte strides)
    const char * q; int64_t q_nb1, q_nb2, q_nb3;
    // k [D, n_kv, Hkv, ns], k_t [n_kv, D, Hkv, ns], v [Dv, n_kv, Hkv, ns]
    const char * k;  int64_t k_nb1, k_nb2, k_nb3;
    const char * kt; int64_t kt_nb1, kt_nb2, kt_nb3;
    const char * v;  int64_t v_nb0, v_nb1, v_nb2, v_nb3;
    // mask [n_kv, n_pad, 1, ns|1]
    const char * mask; int64_t m_nb1, m_nb3; int m_ne3;
    // v_mean F32 [Dv, Hkv, n_tok|1, ns|1] or NULL
    const char * vm; int64_t vm_nb1, vm_nb2, vm_nb3; int vm_ne2, vm_ne3;
    float * dst; // [Dv, H, n_tok, ns] contiguous
    float  * sc;    // scratch [units][H][n_kv]: approximate scores (-INF where masked)
    float2 * part;  // scratch [units][H][nblk]: per chunk (max, sum of exp)
    int    * nvis;  // scratch [units][nblk]: visible positions per chunk
    int D, Dv, n_kv, H, Hkv, n_tok, r, k_top, flags, nblk;
    float scale;
};

static __device__ __forceinline__ float sparq_block_max(float v, float * s_red) {
    v = warp_reduce_max<WARP_SIZE>(v);
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, nw = blockDim.x / WARP_SIZE;
    __syncthreads();
    if (lane == 0) {
        s_red[warp] = v;
    }
    __syncthreads();
    v = lane < nw ? s_red[lane] : -INFINITY;
    return warp_reduce_max<WARP_SIZE>(v);
}

static __device__ __forceinline__ float sparq_block_sum(float v, float * s_red) {
    v = warp_reduce_sum<WARP_SIZE>(v);
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, nw = blockDim.x / WARP_SIZE;
    __syncthreads();
    if (lane == 0) {
        s_red[warp] = v;
    }
    __syncthreads();
    v = lane < nw ? s_red[lane] : 0.0f;
    return warp_reduce_sum<WARP_SIZE>(v);
}

// q of the G heads of KV head kh into s_q[h][d]
static __device__ __forceinline__ void sparq_load_q(const sparq_args & a, const int kh, const int t, const int s,
        const int G, float (*s_q)[SPARQ_CUDA_MAX_D]) {
    for (int e = threadIdx.x; e < G*a.D; e += blockDim.x) {
        const int h = e / a.D;
        const int d = e % a.D;
        s_q[h][d] = *(const float *) (a.q + (int64_t) d*sizeof(float) + t*a.q_nb1 + (int64_t) (kh*G + h)*a.q_nb2 + s*a.q_nb3);
    }
}

template <typename KT, typename MT>
static __global__ void __launch_bounds__(SPARQ_POS_THREADS) sparq_scores(const sparq_args a) {
    __shared__ float s_q[SPARQ_CUDA_MAX_G][SPARQ_CUDA_MAX_D];
    __shared__ float s_abs[SPARQ_CUDA_MAX_D];
    __shared__ int   s_take[SPARQ_CUDA_MAX_D];
    __shared__ int   s_i1[SPARQ_CUDA_MAX_D];
    __shared__ float s_coef[SPARQ_CUDA_MAX_G][SPARQ_CUDA_MAX_D]; // q_h[i1[c]] * scale / sqrt(rho_h)
    __shared__ float s_red[WARP_SIZE];

    const int kh   = blockIdx.y;
    const int unit = blockIdx.z;
    const int t    = unit % a.n_tok;
    const int s    = unit / a.n_tok;
    const int G    = a.H / a.Hkv;
    const int D    = a.D;
    const int tid  = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;
    const int rr   = min(a.r, D);

    ggml_cuda_pdl_sync();

    sparq_load_q(a, kh, t, s, G, s_q);
    __syncthreads();
    for (int d = tid; d < D; d += blockDim.x) {
        float v = 0.0f;
        for (int h = 0; h < G; ++h) {
            v += fabsf(s_q[h][d]);
        }
        s_abs[d] = v;
    }
    __syncthreads();
    // i1: rank of each component (larger first, ties to the lower index)
    for (int d = tid; d < D; d += blockDim.x) {
        const float ad = s_abs[d];
        int rank = 0;
        for (int e = 0; e < D; ++e) {
            const float ae = s_abs[e];
            rank += ae > ad || (ae == ad && e < d);
        }
        s_take[d] = rank < rr;
    }
    __syncthreads();
    if (warp == 0) { // compact i1, ascending
        int base = 0;
        for (int d0 = 0; d0 < D; d0 += WARP_SIZE) {
            const bool     tk  = d0 + lane < D && s_take[d0 + lane];
            const uint32_t bal = __ballot_sync(0xFFFFFFFF, tk);
            if (tk) {
                s_i1[base + __popc(bal & ((1u << lane) - 1))] = d0 + lane;
            }
            base += __popc(bal);
        }
    }
    __syncthreads();
    // temperature per head: scale / sqrt(rho_h), rho_h = |q_h[i1]|_1 / |q_h|_1
    for (int h = warp; h < G; h += blockDim.x / WARP_SIZE) {
        float num = 0.0f;
        float den = 0.0f;
        for (int d = lane; d < D; d += WARP_SIZE) {
            const float v = fabsf(s_q[h][d]);
            den += v;
            num += s_take[d] ? v : 0.0f;
        }
        num = warp_reduce_sum<WARP_SIZE>(num);
        den = warp_reduce_sum<WARP_SIZE>(den);
        const float rho = num > 0.0f && den > 0.0f ? num/den : 1.0f;
        const float tf  = a.scale/sqrtf(rho);
        for (int c = lane; c < rr; c += WARP_SIZE) {
            s_coef[h][c] = s_q[h][s_i1[c]]*tf;
        }
    }
    __syncthreads();

    const int j0 = blockIdx.x*SPARQ_POS + tid*SPARQ_POS_PER_THR;
    float acc[SPARQ_CUDA_MAX_G][SPARQ_POS_PER_THR];
#pragma unroll
    for (int h = 0; h < SPARQ_CUDA_MAX_G; ++h) {
#pragma unroll
        for (int u = 0; u < SPARQ_POS_PER_THR; ++u) {
            acc[h][u] = 0.0f;
        }
    }
    const char * ktb = a.kt + kh*a.kt_nb2 + s*a.kt_nb3;
#pragma unroll 4
    for (int c = 0; c < rr; ++c) {
        const KT * row = (const KT *) (ktb + (int64_t) s_i1[c]*a.kt_nb1);
        float kv[SPARQ_POS_PER_THR];
#pragma unroll
        for (int u = 0; u < SPARQ_POS_PER_THR; ++u) {
            kv[u] = j0 + u < a.n_kv ? sparq_f<KT>(row[j0 + u]) : 0.0f;
        }
#pragma unroll
        for (int h = 0; h < SPARQ_CUDA_MAX_G; ++h) {
            if (h < G) {
                const float cf = s_coef[h][c];
#pragma unroll
                for (int u = 0; u < SPARQ_POS_PER_THR; ++u) {
                    acc[h][u] += cf*kv[u];
                }
            }
        }
    }

    const MT * mrow = (const MT *) (a.mask + t*a.m_nb1 + (int64_t) (s % a.m_ne3)*a.m_nb3);
    float mv[SPARQ_POS_PER_THR];
    int   nv = 0;
#pragma unroll
    for (int u = 0; u < SPARQ_POS_PER_THR; ++u) {
        mv[u] = j0 + u < a.n_kv ? sparq_f<MT>(mrow[j0 + u]) : -INFINITY;
        nv += mv[u] != -INFINITY;
    }

    float * scb = a.sc + ((int64_t) unit*a.H + kh*G)*a.n_kv;
#pragma unroll
    for (int h = 0; h < SPARQ_CUDA_MAX_G; ++h) {
        if (h >= G) {
            break;
        }
        float mx = -INFINITY;
#pragma unroll
        for (int u = 0; u < SPARQ_POS_PER_THR; ++u) {
            const float sv = mv[u] != -INFINITY ? acc[h][u] + mv[u] : -INFINITY;
            acc[h][u] = sv;
            if (j0 + u < a.n_kv) {
                scb[(int64_t) h*a.n_kv + j0 + u] = sv;
            }
            mx = fmaxf(mx, sv);
        }
        mx = sparq_block_max(mx, s_red);
        float sum = 0.0f;
        if (mx != -INFINITY) {
#pragma unroll
            for (int u = 0; u < SPARQ_POS_PER_THR; ++u) {
                sum += acc[h][u] != -INFINITY ? expf(acc[h][u] - mx) : 0.0f;
            }
        }
        sum = sparq_block_sum(sum, s_red);
        if (tid == 0) {
            a.part[((int64_t) unit*a.H + kh*G + h)*a.nblk + blockIdx.x] = make_float2(mx, sum);
        }
    }
    const float nvs = sparq_block_sum((float) nv, s_red);
    if (tid == 0 && kh == 0) {
        a.nvis[(int64_t) unit*a.nblk + blockIdx.x] = (int) nvs;
    }
    ggml_cuda_pdl_lc();
}

// exclusive block scan of one int per thread (blockDim.x <= 1024)
static __device__ __forceinline__ int sparq_block_excl_scan(const int v, int * s_tmp) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, nw = blockDim.x / WARP_SIZE;
    const int incl = warp_prefix_inclusive_sum<int>(v);
    __syncthreads();
    if (lane == WARP_SIZE - 1) {
        s_tmp[warp] = incl;
    }
    __syncthreads();
    if (warp == 0) {
        const int w = lane < nw ? s_tmp[lane] : 0;
        s_tmp[lane] = warp_prefix_inclusive_sum<int>(w);
    }
    __syncthreads();
    return incl - v + (warp > 0 ? s_tmp[warp - 1] : 0);
}

template <typename KT, typename MT>
static __global__ void __launch_bounds__(SPARQ_ATT_THREADS) sparq_attend(const sparq_args a) {
    extern __shared__ __align__(16) char sparq_smem[];
    __shared__ float s_q[SPARQ_CUDA_MAX_G][SPARQ_CUDA_MAX_D];
    __shared__ float s_m[SPARQ_CUDA_MAX_G], s_z[SPARQ_CUDA_MAX_G];   // step-1 softmax max / sum
    __shared__ float s_mk[SPARQ_CUDA_MAX_G], s_zk[SPARQ_CUDA_MAX_G]; // step-2 softmax max / sum
    __shared__ float s_alpha[SPARQ_CUDA_MAX_G];
    __shared__ int   s_cnt[256];
    __shared__ int   s_tmp[WARP_SIZE];
    __shared__ int   s_nvis, s_nsel, s_kk;
    __shared__ uint32_t s_prefix;

    const int kh   = blockIdx.x;
    const int unit = blockIdx.y;
    const int t    = unit % a.n_tok;
    const int s    = unit / a.n_tok;
    const int G    = a.H / a.Hkv;
    const int tid  = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;
    const int nw   = blockDim.x / WARP_SIZE;
    const int n_kv = a.n_kv;
    const int kcap = min(a.k_top, n_kv);

    // shared: keys [max(n_kv, G*kcap)] (later the step-2 scores), sel [kcap], hist [4][256], y [G][Dv]
    uint32_t * s_key  = (uint32_t *) sparq_smem;
    float    * s_sc   = (float *) sparq_smem;
    int      * s_sel  = (int *) (s_key + max(n_kv, G*kcap));
    int      * s_hist = s_sel + kcap;
    float    * s_y    = (float *) (s_hist + 4*256);

    ggml_cuda_pdl_sync();

    sparq_load_q(a, kh, t, s, G, s_q);
    for (int h = warp; h < G; h += nw) {
        const float2 * p = a.part + ((int64_t) unit*a.H + kh*G + h)*a.nblk;
        float mx = -INFINITY;
        for (int b = lane; b < a.nblk; b += WARP_SIZE) {
            mx = fmaxf(mx, p[b].x);
        }
        mx = warp_reduce_max<WARP_SIZE>(mx);
        float z = 0.0f;
        for (int b = lane; b < a.nblk; b += WARP_SIZE) {
            z += p[b].x != -INFINITY ? p[b].y*expf(p[b].x - mx) : 0.0f;
        }
        z = warp_reduce_sum<WARP_SIZE>(z);
        if (lane == 0) {
            s_m[h] = mx;
            s_z[h] = z;
        }
    }
    if (warp == nw - 1) {
        int c = 0;
        for (int b = lane; b < a.nblk; b += WARP_SIZE) {
            c += a.nvis[(int64_t) unit*a.nblk + b];
        }
        c = warp_reduce_sum<WARP_SIZE>(c);
        if (lane == 0) {
            s_nvis = c;
            s_nsel = 0;
        }
    }
    __syncthreads();

    const int nvis  = s_nvis;
    float   * dst_u = a.dst + ((int64_t) unit*a.H + kh*G)*a.Dv;
    if (nvis == 0) {
        for (int e = tid; e < G*a.Dv; e += blockDim.x) {
            dst_u[e] = 0.0f;
        }
        return;
    }
    const bool dense = a.k_top >= nvis;

    // sort keys: group-summed softmax + 1 (visible), 0 (masked); non-negative floats order as their bits
    const float * scb = a.sc + ((int64_t) unit*a.H + kh*G)*n_kv;
    for (int j = tid; j < n_kv; j += blockDim.x) {
        float p   = 0.0f;
        bool  vis = false;
        for (int h = 0; h < G; ++h) {
            const float sv = scb[(int64_t) h*n_kv + j];
            if (sv != -INFINITY) {
                vis = true;
                p  += expf(sv - s_m[h])/s_z[h];
            }
        }
        s_key[j] = vis ? __float_as_uint(p) + 1u : 0u;
    }

    uint32_t thr = 1u; // keys >= thr ... see below
    int      kk  = 0;  // keys == thr to take (lowest positions first); every key > thr is taken
    if (dense) {
        __syncthreads();
    } else {
        // radix select of the k_top-th largest key, 8 bits a pass from the top
        if (tid == 0) {
            s_prefix = 0;
            s_kk     = a.k_top;
        }
        uint32_t pmask = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int e = tid; e < 4*256; e += blockDim.x) {
                s_hist[e] = 0;
            }
            __syncthreads();
            const uint32_t prefix = s_prefix;
            int * hist = s_hist + (warp & 3)*256;
            for (int j = tid; j < n_kv; j += blockDim.x) {
                const uint32_t key = s_key[j];
                if ((key & pmask) == prefix) {
                    atomicAdd(hist + ((key >> shift) & 255), 1);
                }
            }
            __syncthreads();
            if (tid < 256) {
                s_cnt[tid] = s_hist[tid] + s_hist[256 + tid] + s_hist[512 + tid] + s_hist[768 + tid];
            }
            __syncthreads();
            if (warp == 0) {
                // lane takes bins 255 - 8*lane - i (i < 8): descending bins in lane order
                int c[8];
                int local = 0;
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    c[i]   = s_cnt[255 - 8*lane - i];
                    local += c[i];
                }
                const int incl = warp_prefix_inclusive_sum<int>(local);
                const int excl = incl - local;
                const int want = s_kk;
                if (excl < want && want <= incl) {
                    int cum = excl;
#pragma unroll
                    for (int i = 0; i < 8; ++i) {
                        if (cum + c[i] >= want) {
                            s_prefix = prefix | ((uint32_t) (255 - 8*lane - i) << shift);
                            s_kk     = want - cum;
                            break;
                        }
                        cum += c[i];
                    }
                }
            }
            pmask |= 255u << shift;
            __syncthreads();
        }
        thr = s_prefix;
        kk  = s_kk;
    }

    // gather: thread-contiguous ranges, so equal keys are taken in position order
    {
        const int per = (n_kv + blockDim.x - 1)/blockDim.x;
        const int lo  = min(n_kv, tid*per);
        const int hi  = min(n_kv, lo + per);
        int neq = 0;
        for (int j = lo; j < hi; ++j) {
            const uint32_t key = s_key[j];
            if (dense ? key != 0u : key > thr) {
                s_sel[atomicAdd(&s_nsel, 1)] = j;
            } else if (!dense && key == thr) {
                ++neq;
            }
        }
        if (!dense) {
            int base = sparq_block_excl_scan(neq, s_tmp);
            for (int j = lo; j < hi && base < kk; ++j) {
                if (s_key[j] == thr) {
                    s_sel[atomicAdd(&s_nsel, 1)] = j;
                    ++base;
                }
            }
        }
    }
    __syncthreads();
    const int nsel = s_nsel; // == min(k_top, nvis)

    // exact scores of the G heads over the chosen rows (keys are dead: s_sc reuses them)
    const MT * mrow = (const MT *) (a.mask + t*a.m_nb1 + (int64_t) (s % a.m_ne3)*a.m_nb3);
    for (int i = warp; i < nsel; i += nw) {
        const int  j    = s_sel[i];
        const KT * krow = (const KT *) (a.k + (int64_t) j*a.k_nb1 + kh*a.k_nb2 + s*a.k_nb3);
        float kv[SPARQ_DE];
#pragma unroll
        for (int e = 0; e < SPARQ_DE; ++e) {
            const int d = lane + WARP_SIZE*e;
            kv[e] = d < a.D ? sparq_f<KT>(krow[d]) : 0.0f;
        }
        const float mvj = sparq_f<MT>(mrow[j]);
        for (int h = 0; h < G; ++h) {
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < SPARQ_DE; ++e) {
                const int d = lane + WARP_SIZE*e;
                dot += d < a.D ? s_q[h][d]*kv[e] : 0.0f;
            }
            dot = warp_reduce_sum<WARP_SIZE>(dot);
            if (lane == 0) {
                s_sc[h*nsel + i] = a.scale*dot + mvj;
            }
        }
    }
    for (int e = tid; e < G*a.Dv; e += blockDim.x) {
        s_y[e] = 0.0f;
    }
    __syncthreads();
    const bool blend = !dense && (a.flags & 1) != 0;
    for (int h = warp; h < G; h += nw) {
        float mx = -INFINITY;
        for (int i = lane; i < nsel; i += WARP_SIZE) {
            mx = fmaxf(mx, s_sc[h*nsel + i]);
        }
        mx = warp_reduce_max<WARP_SIZE>(mx);
        float z  = 0.0f;
        float al = 0.0f;
        for (int i = lane; i < nsel; i += WARP_SIZE) {
            z += expf(s_sc[h*nsel + i] - mx);
            if (blend) {
                al += expf(scb[(int64_t) h*n_kv + s_sel[i]] - s_m[h])/s_z[h];
            }
        }
        z  = warp_reduce_sum<WARP_SIZE>(z);
        al = warp_reduce_sum<WARP_SIZE>(al);
        if (lane == 0) {
            s_mk[h]    = mx;
            s_zk[h]    = z;
            s_alpha[h] = al;
        }
    }
    __syncthreads();

    // y_h = sum_i p_h[i] v[sel[i]]: warps split the rows, lanes the components
    float acc[SPARQ_CUDA_MAX_G][SPARQ_DE];
#pragma unroll
    for (int h = 0; h < SPARQ_CUDA_MAX_G; ++h) {
#pragma unroll
        for (int e = 0; e < SPARQ_DE; ++e) {
            acc[h][e] = 0.0f;
        }
    }
    const char * vb = a.v + kh*a.v_nb2 + s*a.v_nb3;
    for (int i = warp; i < nsel; i += nw) {
        const int j = s_sel[i];
        float vv[SPARQ_DE];
#pragma unroll
        for (int e = 0; e < SPARQ_DE; ++e) {
            const int d = lane + WARP_SIZE*e;
            vv[e] = d < a.Dv ? sparq_f<KT>(*(const KT *) (vb + (int64_t) d*a.v_nb0 + (int64_t) j*a.v_nb1)) : 0.0f;
        }
#pragma unroll
        for (int h = 0; h < SPARQ_CUDA_MAX_G; ++h) {
            if (h < G) {
                const float p = expf(s_sc[h*nsel + i] - s_mk[h])/s_zk[h];
#pragma unroll
                for (int e = 0; e < SPARQ_DE; ++e) {
                    acc[h][e] += p*vv[e];
                }
            }
        }
    }
#pragma unroll
    for (int h = 0; h < SPARQ_CUDA_MAX_G; ++h) {
        if (h < G) {
#pragma unroll
            for (int e = 0; e < SPARQ_DE; ++e) {
                const int d = lane + WARP_SIZE*e;
                if (d < a.Dv) {
                    atomicAdd(&s_y[h*a.Dv + d], acc[h][e]);
                }
            }
        }
    }
    __syncthreads();

    for (int e = tid; e < G*a.Dv; e += blockDim.x) {
        const int h = e / a.Dv;
        const int d = e % a.Dv;
        float y = s_y[e];
        if (blend) {
            const int   tv = a.vm_ne2 == 1 ? 0 : t;
            const int   sv = a.vm_ne3 == 1 ? 0 : s;
            const float vm = *(const float *) (a.vm + (int64_t) d*sizeof(float) + kh*a.vm_nb1 + tv*a.vm_nb2 + sv*a.vm_nb3);
            y = s_alpha[h]*y + (1.0f - s_alpha[h])*vm;
        }
        dst_u[e] = y;
    }
}

static size_t sparq_attend_smem(const int n_kv, const int G, const int k_top, const int Dv) {
    const int kcap = std::min(k_top, n_kv);
    return (size_t) (std::max(n_kv, G*kcap) + kcap + 4*256 + G*Dv)*sizeof(int);
}

template <typename KT, typename MT>
static void sparq_launch(const sparq_args & a, const int units, cudaStream_t stream) {
    const int    G    = a.H / a.Hkv;
    const size_t smem = sparq_attend_smem(a.n_kv, G, a.k_top, a.Dv);
    {
        static int smem_set[GGML_CUDA_MAX_DEVICES] = { 0 };
        int device;
        CUDA_CHECK(cudaGetDevice(&device));
        if (smem_set[device] == 0) {
            int optin;
            CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
            CUDA_CHECK(cudaFuncSetAttribute(sparq_attend<KT, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                    optin - 16*1024)); // room for the static shared arrays
            smem_set[device] = optin - 16*1024;
        }
        GGML_ASSERT(smem <= (size_t) smem_set[device] && "SparQ: n_kv too large for shared memory");
    }
    const ggml_cuda_kernel_launch_params p1(dim3(a.nblk, a.Hkv, units), dim3(SPARQ_POS_THREADS, 1, 1), 0, stream);
    ggml_cuda_kernel_launch(sparq_scores<KT, MT>, p1, a);
    const ggml_cuda_kernel_launch_params p2(dim3(a.Hkv, units, 1), dim3(SPARQ_ATT_THREADS, 1, 1), smem, stream);
    ggml_cuda_kernel_launch(sparq_attend<KT, MT>, p2, a);
}

#ifndef GGML_SPARSE_CUDA_STANDALONE
bool ggml_cuda_sparq_attn_supported(const ggml_tensor * op) {
    const ggml_tensor * q    = op->src[0];
    const ggml_tensor * k    = op->src[1];
    const ggml_tensor * k_t  = op->src[2];
    const ggml_tensor * v    = op->src[3];
    const ggml_tensor * mask = op->src[4];
    const ggml_tensor * vm   = op->src[5];
    if (!q || !k || !k_t || !v || !mask || op->type != GGML_TYPE_F32 || !ggml_is_contiguous(op)) {
        return false;
    }
    if (q->type != GGML_TYPE_F32 || q->nb[0] != sizeof(float)) {
        return false;
    }
    if ((k->type != GGML_TYPE_F16 && k->type != GGML_TYPE_F32) || k_t->type != k->type || v->type != k->type) {
        return false;
    }
    if (k->nb[0] != ggml_type_size(k->type) || k_t->nb[0] != ggml_type_size(k->type)) {
        return false;
    }
    if ((mask->type != GGML_TYPE_F16 && mask->type != GGML_TYPE_F32) || mask->nb[0] != ggml_type_size(mask->type)) {
        return false;
    }
    const int64_t D = q->ne[0], Dv = v->ne[0], H = q->ne[2], Hkv = k->ne[2], n_kv = k->ne[1];
    if (Hkv <= 0 || H % Hkv != 0 || H/Hkv > SPARQ_CUDA_MAX_G || D > SPARQ_CUDA_MAX_D || Dv > SPARQ_CUDA_MAX_D) {
        return false;
    }
    const int32_t k_top = op->op_params[2];
    if (n_kv > SPARQ_CUDA_MAX_NKV || std::min<int64_t>(k_top, n_kv) > SPARQ_CUDA_MAX_KTOP) {
        return false;
    }
    if (vm && (vm->type != GGML_TYPE_F32 || vm->nb[0] != sizeof(float))) {
        return false;
    }
    return true;
}

void ggml_cuda_op_sparq_attn(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * q    = dst->src[0];
    const ggml_tensor * k    = dst->src[1];
    const ggml_tensor * k_t  = dst->src[2];
    const ggml_tensor * v    = dst->src[3];
    const ggml_tensor * mask = dst->src[4];
    const ggml_tensor * vm   = dst->src[5];
    GGML_ASSERT(ggml_cuda_sparq_attn_supported(dst));

    sparq_args a = {};
    a.q = (const char *) q->data; a.q_nb1 = q->nb[1]; a.q_nb2 = q->nb[2]; a.q_nb3 = q->nb[3];
    a.k = (const char *) k->data; a.k_nb1 = k->nb[1]; a.k_nb2 = k->nb[2]; a.k_nb3 = k->nb[3];
    a.kt = (const char *) k_t->data; a.kt_nb1 = k_t->nb[1]; a.kt_nb2 = k_t->nb[2]; a.kt_nb3 = k_t->nb[3];
    a.v = (const char *) v->data; a.v_nb0 = v->nb[0]; a.v_nb1 = v->nb[1]; a.v_nb2 = v->nb[2]; a.v_nb3 = v->nb[3];
    a.mask = (const char *) mask->data; a.m_nb1 = mask->nb[1]; a.m_nb3 = mask->nb[3]; a.m_ne3 = (int) mask->ne[3];
    if (vm) {
        a.vm = (const char *) vm->data; a.vm_nb1 = vm->nb[1]; a.vm_nb2 = vm->nb[2]; a.vm_nb3 = vm->nb[3];
        a.vm_ne2 = (int) vm->ne[2]; a.vm_ne3 = (int) vm->ne[3];
    }
    a.dst   = (float *) dst->data;
    a.D     = (int) q->ne[0];
    a.Dv    = (int) v->ne[0];
    a.n_kv  = (int) k->ne[1];
    a.H     = (int) q->ne[2];
    a.Hkv   = (int) k->ne[2];
    a.n_tok = (int) q->ne[1];
    memcpy(&a.scale, &dst->op_params[0], sizeof(float));
    a.r     = dst->op_params[1];
    a.k_top = dst->op_params[2];
    a.flags = dst->op_params[3];
    if (!vm) {
        a.flags &= ~GGML_SPARQ_MEAN_V;
    }
    const int units = a.n_tok*(int) q->ne[3];
    cudaStream_t stream = ctx.stream();

    if (a.n_kv == 0 || units == 0) {
        CUDA_CHECK(cudaMemsetAsync(dst->data, 0, ggml_nbytes(dst), stream));
        return;
    }
    a.nblk = (a.n_kv + SPARQ_POS - 1)/SPARQ_POS;

    ggml_cuda_pool_alloc<float>  sc(ctx.pool(), (size_t) units*a.H*a.n_kv);
    ggml_cuda_pool_alloc<float2> part(ctx.pool(), (size_t) units*a.H*a.nblk);
    ggml_cuda_pool_alloc<int>    nvis(ctx.pool(), (size_t) units*a.nblk);
    a.sc   = sc.get();
    a.part = part.get();
    a.nvis = nvis.get();

    const bool kf16 = k->type == GGML_TYPE_F16;
    const bool mf16 = mask->type == GGML_TYPE_F16;
    if (kf16 && mf16) {
        sparq_launch<half, half>(a, units, stream);
    } else if (kf16) {
        sparq_launch<half, float>(a, units, stream);
    } else if (mf16) {
        sparq_launch<float, half>(a, units, stream);
    } else {
        sparq_launch<float, float>(a, units, stream);
    }
}
#endif // GGML_SPARSE_CUDA_STANDALONE
