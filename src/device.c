/*
 * device.c -- the registry of devices built into the library.
 */
#include <strings.h>

#include "gvq_device.h"

const gvq_device_ops_t *gvq_device_find(const char *name) {
    if (name == NULL || strcasecmp(name, "host") == 0) return &gvq_host_device;
    if (strcasecmp(name, "cuda") == 0) {
#ifdef GVQ_WITH_CUDA
        GVQ_WARN("device 'cuda': this build has CUDA (%d device(s) visible) but the CUDA device "
                 "backend is not implemented yet", gvq_cuda_device_count());
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

#ifndef GVQ_WITH_CUDA
int gvq_cuda_device_count(void) { return 0; }
#endif
