/*
 * cuda_probe.c -- what the CUDA runtime sees, and where a pointer lives. Built only with
 * GVQ_WITH_CUDA. The count is taken once per process: every collective asks where its buffers
 * live, and a machine without a device must not pay a failing runtime call each time.
 */
#include <cuda_runtime_api.h>
#include <pthread.h>

#include "gvq_device.h"

static int probe_count;
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;

static void probe(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) { /* no driver or no device (error 35 and friends): none */
        GVQ_INFO("cudaGetDeviceCount: %s; treating as no CUDA device", cudaGetErrorString(err));
        (void)cudaGetLastError(); /* clear the sticky error of this thread */
        n = 0;
    }
    probe_count = n;
}

int gvq_cuda_device_count(void) {
    pthread_once(&probe_once, probe);
    return probe_count;
}

void *gvq_cuda_legacy_stream(void) {
    return (void *)cudaStreamLegacy;
}

int gvq_cuda_is_device_ptr(const void *p) {
    if (p == NULL || gvq_cuda_device_count() == 0) return 0;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* host memory unknown to CUDA on old runtimes: not an error */
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}
