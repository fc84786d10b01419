// llama-sparse: GGML_OP_SPARQ_ATTN on Apple GPUs (SparQ attention at decode; contract in ggml-sparse/ggml-sparse.h,
// algorithm in docs/sparq.md, CPU version in ggml-sparse/ggml-sparse-cpu-sparq.c).
//
// One threadgroup per unit (KV head kh, query token t, stream s), grid (Hkv, n_tok, ns). Per unit:
//   0. the G query heads of the group go to threadgroup memory; the visible positions are counted
//   1. i1 = the r components with the largest sum_h |q_h| (rank by counting, ties to the lower index);
//      shat_h = softmax(scale/sqrt(rho_h) * q_h[i1] . k_t[i1, j] + mask[j]) over the positions, reading
//      only the r rows of k_t (threads take consecutive positions: coalesced)
//   2. the k positions with the largest sum_h shat_h: radix select of the k-th largest key (32 counting
//      passes over the float bits), then an ordered compaction (threadgroup prefix sums) that keeps all
//      larger keys and the lowest-positioned equal ones, as the CPU's tie rule
//   3. exact attention of each head over the k positions (or over every visible position when k >= |V|),
//      optionally blended with v_mean by alpha_h = sum of shat_h over the kept positions
// Per-unit scratch in device memory (after dst): shat [G][n_kv], keys [n_kv], p [n_kv], list [n_kv].
//
// Self-contained (only <metal_stdlib>); names carry a sparq_ prefix (ggml-metal prepends kernels/common.h).
#include <metal_stdlib>

using namespace metal;

#define SPARQ_MAX_G 16

// visible position: the mask is 0 or -INF. Metal compiles with fast math, which may fold comparisons with
// infinities away, so the test is against a finite bound
#define SPARQ_VISIBLE(m) ((m) > -1e30f)

// keep in sync with metal/ggml-sparse-metal.h
typedef struct {
    int32_t  D;
    int32_t  Dv;
    int32_t  n_kv;
    int32_t  n_tok;
    int32_t  H;
    int32_t  Hkv;
    int32_t  G;
    int32_t  ns;
    int32_t  r;
    int32_t  k_top;
    int32_t  mean_v;
    int32_t  mask_ne3;
    int32_t  vm_ne2;
    int32_t  vm_ne3;
    float    scale;
    int32_t  kt_q8;
    uint64_t nbq1, nbq2, nbq3;
    uint64_t nbk1, nbk2, nbk3;
    uint64_t nbt1, nbt2, nbt3;
    uint64_t nbv0, nbv1, nbv2, nbv3;
    uint64_t nbm1, nbm3;
    uint64_t nbvm1, nbvm2, nbvm3;
    uint64_t scratch_unit; // bytes of scratch per unit
} ggml_sparse_metal_kargs_sparq;

// threadgroup reductions: every thread gets the result (two barriers; red holds 32 values)
static float sparq_tg_sum(float v, threadgroup float * red, ushort sgitg, ushort tiisg, ushort nsg) {
    v = simd_sum(v);
    if (tiisg == 0) {
        red[sgitg] = v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const float r = simd_sum(tiisg < nsg ? red[tiisg] : 0.0f);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return r;
}

static float sparq_tg_max(float v, threadgroup float * red, ushort sgitg, ushort tiisg, ushort nsg) {
    v = simd_max(v);
    if (tiisg == 0) {
        red[sgitg] = v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const float r = simd_max(tiisg < nsg ? red[tiisg] : -INFINITY);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return r;
}

static int sparq_tg_sum_i(int v, threadgroup int * red, ushort sgitg, ushort tiisg, ushort nsg) {
    v = simd_sum(v);
    if (tiisg == 0) {
        red[sgitg] = v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const int r = simd_sum(tiisg < nsg ? red[tiisg] : 0);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return r;
}

// exclusive prefix of v over the threadgroup in thread order; *total gets the sum (two barriers)
static int sparq_tg_scan(int v, thread int * total, threadgroup int * red, ushort sgitg, ushort tiisg, ushort nsg) {
    const int pos = simd_prefix_exclusive_sum(v);
    const int cnt = simd_sum(v);
    if (tiisg == 0) {
        red[sgitg] = cnt;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const int s      = tiisg < nsg ? red[tiisg] : 0;
    const int s_excl = simd_prefix_exclusive_sum(s);
    *total = simd_sum(s);
    const int off = simd_shuffle(s_excl, sgitg);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return off + pos;
}

// position j of a Q8_0 k_t row (blocks of 32 positions: f16 scale, 32 signed bytes)
static inline float sparq_q8_at(device const char * row, int j) {
    device const char * blk = row + (long) (j/32)*34;
    return (float) *(device const half *) blk * (float) *(device const int8_t *) (blk + 2 + j % 32);
}

// float keys >= 0 of visible positions as ordered integers above 0 (invisible: 0)
static inline uint sparq_key(float score, bool visible) {
    return visible ? as_type<uint>(score) + 1u : 0u;
}

typedef void (kernel_sparq_attn_t)(
        constant ggml_sparse_metal_kargs_sparq & args,
        device const char * q,
        device const char * k,
        device const char * kt,
        device const char * v,
        device const char * mask,
        device const char * vmean,
        device       char * dst,
        device       char * scratch,
        threadgroup float * shq [[threadgroup(0)]],
        uint3  tgpig[[threadgroup_position_in_grid]],
        ushort tiitg[[thread_index_in_threadgroup]],
        ushort   ntg[[threads_per_threadgroup]],
        ushort sgitg[[simdgroup_index_in_threadgroup]],
        ushort tiisg[[thread_index_in_simdgroup]],
        ushort   nsg[[simdgroups_per_threadgroup]]);

// shq: G*D + 2*D floats (q of the group, component keys, component list)
template<typename TKV, typename TM>
kernel void kernel_sparq_attn(
        constant ggml_sparse_metal_kargs_sparq & args,
        device const char * q,
        device const char * k,
        device const char * kt,
        device const char * v,
        device const char * mask,
        device const char * vmean,
        device       char * dst,
        device       char * scratch,
        threadgroup float * shq [[threadgroup(0)]],
        uint3  tgpig[[threadgroup_position_in_grid]],
        ushort tiitg[[thread_index_in_threadgroup]],
        ushort   ntg[[threads_per_threadgroup]],
        ushort sgitg[[simdgroup_index_in_threadgroup]],
        ushort tiisg[[thread_index_in_simdgroup]],
        ushort   nsg[[simdgroups_per_threadgroup]]) {
    threadgroup float sparq_red[32];
    threadgroup int   sparq_ired[32];
    threadgroup float sparq_sc[SPARQ_MAX_G];

    const int kh = tgpig.x;
    const int t  = tgpig.y;
    const int s  = tgpig.z;
    const int D  = args.D;
    const int G  = args.G;
    const int n_kv = args.n_kv;

    const long unit = ((long) s*args.n_tok + t)*args.Hkv + kh;
    device float   * shat  = (device float *) (scratch + unit*args.scratch_unit);
    device float   * score = shat + (long) G*n_kv;
    device float   * pbuf  = score + n_kv;
    device int32_t * sel   = (device int32_t *) (pbuf + n_kv);

    device const TM * mrow = (device const TM *) (mask + t*args.nbm1 + (s % args.mask_ne3)*args.nbm3);
    device const char * kb  = k  + kh*args.nbk2 + s*args.nbk3;
    device const char * ktb = kt + kh*args.nbt2 + s*args.nbt3;
    device const char * vb  = v  + kh*args.nbv2 + s*args.nbv3;

    threadgroup float * qg   = shq;                                // [G][D]
    threadgroup float * ckey = shq + G*D;                          // [D]
    threadgroup int   * i1   = (threadgroup int *) (shq + G*D + D); // [r]

    for (int i = tiitg; i < G*D; i += ntg) {
        const int g = i / D;
        const int c = i % D;
        qg[i] = ((device const float *) (q + t*args.nbq1 + (kh*G + g)*args.nbq2 + s*args.nbq3))[c];
    }

    int nv_part = 0;
    for (int j = tiitg; j < n_kv; j += ntg) {
        nv_part += SPARQ_VISIBLE((float) mrow[j]) ? 1 : 0;
    }
    const int  nv    = sparq_tg_sum_i(nv_part, sparq_ired, sgitg, tiisg, nsg);
    const bool dense = args.k_top >= nv;
    const int  n_sel = dense ? nv : args.k_top;

    if (!dense) {
        // step 1: components by group-summed |q|, rank by counting (ties: lower index first)
        for (int c = tiitg; c < D; c += ntg) {
            float a = 0.0f;
            for (int g = 0; g < G; ++g) {
                a += fabs(qg[g*D + c]);
            }
            ckey[c] = a;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        int n1 = 0;
        for (int base = 0; base < D; base += ntg) {
            const int c = base + tiitg;
            int take = 0;
            if (c < D) {
                const float a = ckey[c];
                int rank = 0;
                for (int c2 = 0; c2 < D; ++c2) {
                    const float b = ckey[c2];
                    rank += (b > a || (b == a && c2 < c)) ? 1 : 0;
                }
                take = rank < args.r ? 1 : 0;
            }
            int total;
            const int pos = sparq_tg_scan(take, &total, sparq_ired, sgitg, tiisg, nsg);
            if (take) {
                i1[n1 + pos] = c;
            }
            n1 += total;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // temperature per head: scale/sqrt(rho_h), rho_h = ||q_h[i1]||_1 / ||q_h||_1
        for (int g = 0; g < G; ++g) {
            float l1 = 0.0f, l1r = 0.0f;
            for (int c = tiitg; c < D; c += ntg) {
                l1 += fabs(qg[g*D + c]);
            }
            for (int i = tiitg; i < n1; i += ntg) {
                l1r += fabs(qg[g*D + i1[i]]);
            }
            l1  = sparq_tg_sum(l1,  sparq_red, sgitg, tiisg, nsg);
            l1r = sparq_tg_sum(l1r, sparq_red, sgitg, tiisg, nsg);
            if (tiitg == 0) {
                const float rho = (l1 > 0.0f && l1r > 0.0f) ? l1r/l1 : 1.0f;
                sparq_sc[g] = args.scale/sqrt(rho);
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // approximate scores; thread j keeps its own positions through the softmax
        for (int j = tiitg; j < n_kv; j += ntg) {
            const float mv = (float) mrow[j];
            float dot[SPARQ_MAX_G];
            for (int g = 0; g < G; ++g) {
                dot[g] = 0.0f;
            }
            if (SPARQ_VISIBLE(mv)) {
                for (int i = 0; i < n1; ++i) {
                    const int c = i1[i];
                    const float kv = args.kt_q8 ? sparq_q8_at(ktb + c*args.nbt1, j) :
                                                  (float) ((device const TKV *) (ktb + c*args.nbt1))[j];
                    for (int g = 0; g < G; ++g) {
                        dot[g] += qg[g*D + c]*kv;
                    }
                }
            }
            for (int g = 0; g < G; ++g) {
                shat[(long) g*n_kv + j] = SPARQ_VISIBLE(mv) ? sparq_sc[g]*dot[g] + mv : -INFINITY;
            }
        }
        for (int g = 0; g < G; ++g) {
            float mx = -INFINITY;
            for (int j = tiitg; j < n_kv; j += ntg) {
                mx = max(mx, shat[(long) g*n_kv + j]);
            }
            mx = sparq_tg_max(mx, sparq_red, sgitg, tiisg, nsg);
            float sum = 0.0f;
            for (int j = tiitg; j < n_kv; j += ntg) {
                const float e = exp(shat[(long) g*n_kv + j] - mx);
                shat[(long) g*n_kv + j] = e;
                sum += e;
            }
            sum = sparq_tg_sum(sum, sparq_red, sgitg, tiisg, nsg);
            for (int j = tiitg; j < n_kv; j += ntg) {
                shat[(long) g*n_kv + j] /= sum;
            }
        }
        for (int j = tiitg; j < n_kv; j += ntg) {
            float a = 0.0f;
            for (int g = 0; g < G; ++g) {
                a += shat[(long) g*n_kv + j];
            }
            score[j] = a;
        }

        // step 2: the k-th largest key, bit by bit from the top
        uint kth = 0;
        for (int bit = 31; bit >= 0; --bit) {
            const uint cand = kth | (1u << bit);
            int cnt = 0;
            for (int j = tiitg; j < n_kv; j += ntg) {
                cnt += sparq_key(score[j], SPARQ_VISIBLE((float) mrow[j])) >= cand ? 1 : 0;
            }
            if (sparq_tg_sum_i(cnt, sparq_ired, sgitg, tiisg, nsg) >= args.k_top) {
                kth = cand;
            }
        }
        int gt = 0;
        for (int j = tiitg; j < n_kv; j += ntg) {
            gt += sparq_key(score[j], SPARQ_VISIBLE((float) mrow[j])) > kth ? 1 : 0;
        }
        const int need_eq = args.k_top - sparq_tg_sum_i(gt, sparq_ired, sgitg, tiisg, nsg);

        // ordered compaction: larger keys, then equal keys of the lowest positions
        int n_out = 0, n_eq = 0;
        for (int base = 0; base < n_kv; base += ntg) {
            const int  j   = base + tiitg;
            const uint key = j < n_kv ? sparq_key(score[j], SPARQ_VISIBLE((float) mrow[j])) : 0u;
            const int  eq  = (j < n_kv && key == kth) ? 1 : 0;
            int eq_total;
            const int eq_rank = n_eq + sparq_tg_scan(eq, &eq_total, sparq_ired, sgitg, tiisg, nsg);
            n_eq += eq_total;
            const int take = (j < n_kv && (key > kth || (eq && eq_rank < need_eq))) ? 1 : 0;
            int total;
            const int pos = sparq_tg_scan(take, &total, sparq_ired, sgitg, tiisg, nsg);
            if (take) {
                sel[n_out + pos] = j;
            }
            n_out += total;
        }
    } else {
        // every visible position, ascending
        int n_out = 0;
        for (int base = 0; base < n_kv; base += ntg) {
            const int j = base + tiitg;
            const int take = (j < n_kv && SPARQ_VISIBLE((float) mrow[j])) ? 1 : 0;
            int total;
            const int pos = sparq_tg_scan(take, &total, sparq_ired, sgitg, tiisg, nsg);
            if (take) {
                sel[n_out + pos] = j;
            }
            n_out += total;
        }
    }
    threadgroup_barrier(mem_flags::mem_device);

    // step 3: exact attention of every head of the group over the selected positions
    const bool blend = !dense && args.mean_v != 0;
    device const float * vm = (device const float *) (vmean + kh*args.nbvm1 + (t % args.vm_ne2)*args.nbvm2 + (s % args.vm_ne3)*args.nbvm3);
    for (int g = 0; g < G; ++g) {
        float mx = -INFINITY;
        for (int i = tiitg; i < n_sel; i += ntg) {
            const int j = sel[i];
            device const TKV * kr = (device const TKV *) (kb + j*args.nbk1);
            float dot = 0.0f;
            for (int c = 0; c < D; ++c) {
                dot += qg[g*D + c]*(float) kr[c];
            }
            const float p = args.scale*dot + (float) mrow[j];
            pbuf[i] = p;
            mx = max(mx, p);
        }
        mx = sparq_tg_max(mx, sparq_red, sgitg, tiisg, nsg);
        float sum = 0.0f, alpha = 0.0f;
        for (int i = tiitg; i < n_sel; i += ntg) {
            const float e = exp(pbuf[i] - mx);
            pbuf[i] = e;
            sum += e;
            if (blend) {
                alpha += shat[(long) g*n_kv + sel[i]];
            }
        }
        sum   = sparq_tg_sum(sum, sparq_red, sgitg, tiisg, nsg);
        alpha = blend ? sparq_tg_sum(alpha, sparq_red, sgitg, tiisg, nsg) : 1.0f;
        threadgroup_barrier(mem_flags::mem_device);

        device float * out = (device float *) dst + (((long) s*args.n_tok + t)*args.H + kh*G + g)*args.Dv;
        for (int c = tiitg; c < args.Dv; c += ntg) {
            float y = 0.0f;
            for (int i = 0; i < n_sel; ++i) {
                y += pbuf[i]*(float) *((device const TKV *) (vb + sel[i]*args.nbv1 + c*args.nbv0));
            }
            y = nv > 0 ? y/sum : 0.0f;
            out[c] = blend ? alpha*y + (1.0f - alpha)*vm[c] : y;
        }
        // pbuf is rewritten for the next head
        threadgroup_barrier(mem_flags::mem_device);
    }
}

template [[host_name("kernel_sparq_attn_f16_f16")]] kernel kernel_sparq_attn_t kernel_sparq_attn<half,  half>;
template [[host_name("kernel_sparq_attn_f16_f32")]] kernel kernel_sparq_attn_t kernel_sparq_attn<half,  float>;
template [[host_name("kernel_sparq_attn_f32_f16")]] kernel kernel_sparq_attn_t kernel_sparq_attn<float, half>;
template [[host_name("kernel_sparq_attn_f32_f32")]] kernel kernel_sparq_attn_t kernel_sparq_attn<float, float>;
