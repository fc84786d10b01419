// llama-sparse: a kernel launch with upstream's programmatic dependent launch (PDL) and, optionally, a thread block
// cluster (cuda/*.cu kernels that use the cluster API).
#pragma once

#include "ggml-cuda/common.cuh"

#include <cstdlib>

#if !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA) && CUDART_VERSION >= 12000
#define GGML_SPARSE_CUDA_CLUSTERS // host side; device side also needs __CUDA_ARCH__ >= 900

// kern on grid with clusters of nc blocks along x (nc 0: no cluster attribute) and, with pdl, programmatic stream
// serialization
template <typename... P, typename... A>
static void ggml_sparse_cuda_launch_cfg(void (*kern)(P...), const dim3 grid, const dim3 block, const size_t smem,
        const int nc, const bool pdl, cudaStream_t stream, A... args) {
    cudaLaunchAttribute attr[2];
    int n_attr = 0;
    if (nc > 0) {
        attr[n_attr].id               = cudaLaunchAttributeClusterDimension;
        attr[n_attr].val.clusterDim.x = nc;
        attr[n_attr].val.clusterDim.y = 1;
        attr[n_attr].val.clusterDim.z = 1;
        ++n_attr;
    }
    if (pdl) {
        attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n_attr].val.programmaticStreamSerializationAllowed = 1;
        ++n_attr;
    }
    cudaLaunchConfig_t lc = {};
    lc.gridDim          = grid;
    lc.blockDim         = block;
    lc.dynamicSmemBytes = smem;
    lc.stream           = stream;
    lc.attrs            = attr;
    lc.numAttrs         = n_attr;
    CUDA_CHECK(cudaLaunchKernelEx(&lc, kern, args...));
}

// as ggml_sparse_cuda_launch_cfg, with PDL where ggml's launcher uses it (GGML_CUDA_USE_PDL, unless GGML_CUDA_PDL=0)
template <typename... P, typename... A>
static void ggml_sparse_cuda_launch_ex(void (*kern)(P...), const dim3 grid, const dim3 block, const size_t smem, const int nc,
        cudaStream_t stream, A... args) {
#if defined(GGML_CUDA_USE_PDL)
    static const bool pdl = [] { const char * e = getenv("GGML_CUDA_PDL"); return e == nullptr || atoi(e) != 0; }();
#else
    const bool pdl = false;
#endif // defined(GGML_CUDA_USE_PDL)
    ggml_sparse_cuda_launch_cfg(kern, grid, block, smem, nc, pdl, stream, args...);
}
#endif // clusters
