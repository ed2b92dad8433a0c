/*
 * test_gpu_probe.c -- the CUDA probe of the device registry. Without a device (or driver) it
 * reports itself skipped (exit 77). With one, it checks that gvq sees the devices the CUDA
 * runtime sees and that a device buffer round-trips; the CUDA device backend's own tests come
 * with that backend.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "gvq_device.h"

int main(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        printf("SKIPPED: no CUDA device (%s)\n",
               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return 77;
    }
    int seen = gvq_cuda_device_count();
    if (seen != n) {
        fprintf(stderr, "FAIL: gvq sees %d CUDA devices, the runtime %d\n", seen, n);
        return 1;
    }
    float h[256], back[256];
    for (int i = 0; i < 256; i++)
        h[i] = (float)i * 0.5f;
    void *d = NULL;
    if (cudaMalloc(&d, sizeof h) != cudaSuccess ||
        cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(back, d, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "FAIL: device round trip\n");
        return 1;
    }
    cudaFree(d);
    for (int i = 0; i < 256; i++)
        if (back[i] != h[i]) {
            fprintf(stderr, "FAIL: device round trip differs at %d\n", i);
            return 1;
        }
    printf("test_gpu_probe: %d CUDA device(s), all checks passed\n", n);
    return 0;
}
