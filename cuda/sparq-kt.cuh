// llama-sparse: the append of SparQ's 8-bit transposed K (kt=q8_0) as one kernel.
//
// src/llama-sparq.cpp keeps the Q8_0 copy current with four nodes a layer: GET_ROWS of each slot's 32 cache cells
// ("sparq_kt_gather"), MUL by 1 / 0 for used / empty cells ("sparq_kt_keep"), CONT of the transpose ("sparq_kt_tr")
// and SET_ROWS of one Q8_0 block per (slot, component) ("sparq_kt_put"). At decode these are four tiny dependent
// kernels a layer; the graph hook runs the chain as one, with the same arithmetic (the bytes are those set_rows
// writes).
#pragma once

#include "ggml-cuda/common.cuh"

// k: the K cache rows (f16, k_nb1 bytes apart); cells[32*n_slots], keep[32*n_slots], rows[n_embd*n_slots] as the
// chain's inputs; dst: the Q8_0 block rows of k_t (dst_nb1 bytes apart)
void sparq_kt_q8_append_launch(const char * k, int64_t k_nb1, const int32_t * cells, const float * keep,
                               const int64_t * rows, char * dst, int64_t dst_nb1, int n_embd, int n_slots,
                               cudaStream_t stream);

#ifndef GGML_SPARSE_CUDA_STANDALONE
// graph hook: node i is the chain's GET_ROWS; runs the chain, returns how many nodes from i it covered (0: not the
// chain, or LLAMA_SPARSE_CUDA_KT_FUSE=0)
int ggml_cuda_sparq_kt_append_fuse(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i);
#endif
