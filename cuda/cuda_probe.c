/*
 * cuda_probe.c -- what the CUDA runtime sees. Built only with GVQ_WITH_CUDA. The CUDA device
 * backend and NCCL transport build on this file's place in the tree.
 */
#include <cuda_runtime_api.h>

#include "gvq_device.h"

int gvq_cuda_device_count(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) { /* no driver or no device (error 35 and friends): none */
        GVQ_INFO("cudaGetDeviceCount: %s; treating as no CUDA device", cudaGetErrorString(err));
        return 0;
    }
    return n;
}
