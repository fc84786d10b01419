// llama-sparse: GGML_OP_SPARQ_ATTN on CUDA (SparQ attention at decode; contract in ggml-sparse/ggml-sparse.h).
#pragma once

#include "ggml-cuda/common.cuh"

#define SPARQ_CUDA_MAX_G    8     // q heads per KV head
#define SPARQ_CUDA_MAX_D    256   // head sizes of q/K and V
#define SPARQ_CUDA_MAX_KTOP 1024  // positions kept in step 2
#define SPARQ_CUDA_MAX_NKV  45056 // positions (their sort keys live in shared memory)
#define SPARQ_SPLIT_NSEG    16    // split step 2: most position segments per KV head
#define SPARQ_SPLIT_SEG_MIN 512   // split step 2: fewest positions per segment
#define SPARQ_SPLIT_SEG_MAX 2816  // split step 2: most positions per segment (NSEG*SEG_MAX >= MAX_NKV)
#define SPARQ_PHASES        24    // phase stamps per kernel (-DSPARQ_PHASE_TIMING diagnostics)

// launch arguments: the op fills them from its tensors, the standalone test (cuda/tests) directly.
// Byte strides; shapes and semantics as in ggml-sparse.h. Every dimension must be within the limits above.
struct sparq_args {
    const char * q;    int64_t q_nb1, q_nb2, q_nb3;           // F32 [D, n_tok, H, ns]
    const char * k;    int64_t k_nb1, k_nb2, k_nb3;           // [D, n_kv, Hkv, ns]
    const char * kt;   int64_t kt_nb1, kt_nb2, kt_nb3;        // [n_kv, D, Hkv, ns]
    const char * v;    int64_t v_nb0, v_nb1, v_nb2, v_nb3;    // [Dv, n_kv, Hkv, ns]
    const char * mask; int64_t m_nb1, m_nb3; int m_ne3;       // [n_kv, n_pad, 1, ns|1]
    const char * vm;   int64_t vm_nb1, vm_nb2, vm_nb3; int vm_ne2, vm_ne3; // F32 [Dv, Hkv, n_tok|1, ns|1] or NULL
    float * dst;                                              // F32 [Dv, H, n_tok, ns], contiguous
    int   D, Dv, n_kv, H, Hkv, n_tok, ns, r, k_top, flags;
    float scale;
    bool  kv_f16, mask_f16;                                   // K/k_t/V type, mask type (else F32)
    bool  kt_q8;                                              // k_t is Q8_0 (blocks of 32 positions; n_kv % 32 == 0,
                                                              // f16 K/V): step 1 dequantizes
    int   step2;   // 0: fused where it applies (unless LLAMA_SPARSE_CUDA_SPARQ_FUSED=0), else LLAMA_SPARSE_CUDA_SPARQ_SPLIT
                   // decides (set and != 0: split); 1: one block per KV head, 2: split, 3: step 1 only (timing aid; dst
                   // not written), 4: fused (one cluster per KV head for the whole op; single where it does not apply)

    // set by sparq_attn_launch
    float  * sc;   int64_t sc_ld; // scratch [units][H][sc_ld]: approximate scores, -INF where masked
    float2 * part;                // scratch [units][H][nblk]: per position chunk (max, sum of exp)
    int    * nvis;                // scratch [units][nblk]: visible positions per chunk
    int      nblk;
    bool     kt_vec;              // k_t rows 16-byte aligned: vector loads
    bool     k_vec;               // K rows 16-byte aligned: vector loads (step 2)
    bool     v_vec;               // V rows contiguous, Dv even, pairs aligned: 2-element loads (step 2)
    bool     balance;             // fused: step 3's rows split evenly over the cluster (LLAMA_SPARSE_CUDA_SPARQ_BALANCE=0: off)
    int    * bhint;               // fused, balanced: [units][Hkv] what the last launch on these caches found, 1: its chosen
                                  // positions were spread evenly, so skip the counts' exchange (nullptr: always exchange)
    // split step 2 (scratch too): nseg segments of seg_len positions per (unit, KV head)
    uint64_t * cand;              // [units][Hkv][nseg][kseg]: a segment's top keys, (key << 32 | ~position) descending
    int      * ccnt;              // [units][Hkv][nseg]: how many
    float4   * pml;               // [units][H][nseg]: per segment block (max, sum of exp, alpha, -) of the exact softmax
    float    * pacc;              // [units][H][nseg][Dv]: per segment block, output not yet divided by the sum
    int        seg_len, nseg, kseg;
};

// bytes of device scratch sparq_attn_launch needs
size_t sparq_attn_scratch_size(const sparq_args & a);

// two kernels on stream (one for the fused variant), no host synchronization (graph safe); scratch:
// sparq_attn_scratch_size bytes
void sparq_attn_launch(sparq_args a, void * scratch, cudaStream_t stream);
// whether sparq_attn_launch runs the fused variant for a (step2 4; the default for step2 0 where it applies)
bool sparq_attn_fused_takes(sparq_args a);
#ifdef SPARQ_PHASE_TIMING
// the last call's phase stamps: ns (%globaltimer) and SM cycles (clock64)
void sparq_phase_read(unsigned long long out[2][SPARQ_PHASES], long long clk[2][SPARQ_PHASES]);
#endif

#ifndef GGML_SPARSE_CUDA_STANDALONE
// whether the CUDA kernels take this GGML_OP_SPARQ_ATTN node (shapes, types and the limits above)
bool ggml_cuda_sparq_attn_supported(const ggml_tensor * op);

void ggml_cuda_op_sparq_attn(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
#endif // GGML_SPARSE_CUDA_STANDALONE
