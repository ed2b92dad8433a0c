/*
 * device.c -- the registry of devices built into the library, and which device a buffer's
 * memory belongs to.
 */
#include <strings.h>

#include "gvq_device.h"

gvqResult_t gvq_device_not_supported(const char *device, const char *op) {
    GVQ_WARN("device '%s' does not support the operation %s", device, op);
    return gvqInternalError;
}

const gvq_device_ops_t *gvq_device_find(const char *name) {
    if (name == NULL || strcasecmp(name, "host") == 0) return &gvq_host_device;
    if (strcasecmp(name, "cuda") == 0) {
#ifdef GVQ_WITH_CUDA
        if (gvq_cuda_device_count() > 0) return &gvq_cuda_device;
        GVQ_WARN("device 'cuda': this build has CUDA but no CUDA device is usable");
#else
        GVQ_WARN("device 'cuda': this build of gvq has no CUDA support (GVQ_WITH_CUDA=OFF)");
#endif
        return NULL;
    }
    GVQ_WARN("device '%s' is not known (built in: host%s)", name,
#ifdef GVQ_WITH_CUDA
             ", cuda"
#else
             ""
#endif
    );
    return NULL;
}

const gvq_device_ops_t *gvq_device_of(const void *p) {
#ifdef GVQ_WITH_CUDA
    if (p != NULL && gvq_param(GVQ_PARAM_CUDA_BUFFERS) && gvq_cuda_device_count() > 0 &&
        gvq_cuda_is_device_ptr(p))
        return &gvq_cuda_device;
#endif
    (void)p;
    return &gvq_host_device;
}

void *gvq_device_user_stream(const gvq_device_ops_t *dev, void *stream) {
#ifdef GVQ_WITH_CUDA
    if (stream == NULL && dev == &gvq_cuda_device) return gvq_cuda_legacy_stream();
#endif
    (void)dev;
    return stream;
}

#ifndef GVQ_WITH_CUDA
int gvq_cuda_device_count(void) { return 0; }
#endif
