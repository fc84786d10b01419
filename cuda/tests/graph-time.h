// llama-sparse: timing helper shared by the standalone CUDA tests (include after ggml-cuda/common.cuh).
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

// median (best: the least) over 7 runs of the time of one iteration in microseconds; `reps` iterations captured in
// one CUDA graph
static double time_graph_us(const std::function<void(cudaStream_t, int)> & iter, const int reps, cudaStream_t stream,
                            const bool best = false) {
    iter(stream, 0);
    CUDA_CHECK(cudaStreamSynchronize(stream));

    cudaGraph_t     graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < reps; ++i) {
        iter(stream, i);
    }
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    std::vector<double> t;
    for (int k = 0; k < 7; ++k) {
        CUDA_CHECK(cudaEventRecord(e0, stream));
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CUDA_CHECK(cudaEventRecord(e1, stream));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(1000.0*ms/reps);
    }
    std::sort(t.begin(), t.end());
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return best ? t[0] : t[t.size()/2];
}
