// llama-sparse: FLASH_ATTN_EXT at decode (one token, short KV) as one kernel.
//
// Upstream's vec kernel splits the KV positions of a head over several blocks and merges their partial results in a
// second kernel (flash_attn_combine_results). At batch 1 on a 7B model each of the two costs a few us a layer,
// mostly launch and tail latency. Here one thread block cluster per KV head splits the positions and the blocks
// merge their partial softmax sums through distributed shared memory: one launch a layer.
#pragma once

#include "ggml-cuda/common.cuh"

// the launch, for tests: q (f32) [D][heads] of one token, K / V (f16) rows of D, mask (f16, or nullptr) one row
// of n_kv per mask plane; dst (f32) [D][heads]; strides in elements. nb: blocks per KV head (0: default).
struct attn_decode_args {
    const float * q;    int64_t q_s2, q_s3;            // q head, stream
    const half  * k;    int64_t k_s1, k_s2, k_s3;      // K position, KV head, stream
    const half  * v;    int64_t v_s1, v_s2, v_s3;
    const half  * mask; int64_t m_s2, m_s3; int m_ne2, m_ne3;
    float       * dst;  int64_t d_s2, d_s3;            // dst head, stream
    int           D, n_head, n_head_kv, n_kv, n_seq;
    float         scale;
    float       * ws;   int * cnt;                 // version 3: partials and counters (set by the launcher)
};
struct rs_args; // rope-store.cuh

// false: not handled (shape, type, alignment or device; versions 3 and 8: their buffers cannot be made while the
// stream captures); nothing launched. version: 2, 3, 6 or 8 (0: LLAMA_SPARSE_CUDA_ATTN_V, default 2; see
// attn-decode.cu). Versions 2, 3 and 6 take at most LLAMA_SPARSE_CUDA_ATTN_MAX_KV positions (2048), version 8 any.
// rope: also the RoPE / cache writes of rope-store.cu for this one token first, in the same launch (version 3 runs
// as 2 there)
bool attn_decode_launch(const attn_decode_args & a, int nb, int device, cudaStream_t stream, int version = 0,
                        const rs_args * rope = nullptr);

#ifndef GGML_SPARSE_CUDA_STANDALONE
// graph hook: node i is a FLASH_ATTN_EXT; runs it and returns 1 when this kernel takes it, else 0
// (only with LLAMA_SPARSE_CUDA_ATTN_FUSE=1 or 2, or LLAMA_SPARSE_CUDA_ATTN_LONG=N from N positions on, and not with
// GGML_CUDA_DISABLE_FUSION=1)
int ggml_cuda_attn_decode_fuse(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i);
// LLAMA_SPARSE_CUDA_ATTN_FUSE: 0 off (default), 1 at FLASH_ATTN_EXT nodes, 2 also with the RoPE / cache writes
int ggml_cuda_attn_decode_mode();
// a's fields for a FLASH_ATTN_EXT node this kernel can run (one token, f16 K / V, ...; attn_decode_launch checks the rest)
bool ggml_cuda_attn_decode_args(const ggml_tensor * fa, attn_decode_args & a);
#endif
