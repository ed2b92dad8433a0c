/*
 * gvq_cuda_check.h -- the CUDA runtime error check shared by cuda/'s sources: a failed call is
 * logged with its text, its error is cleared (so that the next launch check does not report it
 * against an unrelated kernel), and the function returns gvqUnhandledCudaError.
 */
#ifndef GVQ_CUDA_CHECK_H_
#define GVQ_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "gvq_util.h" /* GVQ_WARN, gvqResult_t */
#ifdef __cplusplus
}
#endif

#define CUDACHECK(call)                                                                  \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) {                                                         \
            GVQ_WARN("CUDA: %s failed: %s", #call, cudaGetErrorString(e_));              \
            (void)cudaGetLastError(); /* not left for the next launch check to report */ \
            return gvqUnhandledCudaError;                                                \
        }                                                                                \
    } while (0)

#endif /* GVQ_CUDA_CHECK_H_ */
