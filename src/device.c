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

/* A device registered from outside the library's registry (gvq_device_register). */
static const gvq_device_ops_t *extra_dev;
static int (*extra_owns)(const void *p);

void gvq_device_register(const gvq_device_ops_t *dev, int (*owns)(const void *p)) {
    extra_owns = dev != NULL ? owns : NULL;
    extra_dev = owns != NULL ? dev : NULL;
}

const gvq_device_ops_t *gvq_device_of(const void *p) {
    if (extra_dev != NULL && p != NULL && extra_owns(p)) return extra_dev;
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

gvqResult_t gvq_device_staged(const gvq_device_ops_t *dev, void *stream, const char *fn,
                              const void *send, size_t slen, void *recv, size_t rlen,
                              gvq_staged_fn_t run, void *arg) {
    int sdev = slen && gvq_device_of(send) == dev, rdev = rlen && gvq_device_of(recv) == dev;
    void *hs = NULL, *hr = NULL, *prev = NULL;
    gvqResult_t res = gvqSuccess;
    GVQCHECK(dev->set_stream(gvq_device_user_stream(dev, stream), &prev));
    if ((sdev && (hs = dev->host_alloc(slen)) == NULL) || (rdev && (hr = dev->host_alloc(rlen)) == NULL)) {
        GVQ_WARN("%s: cannot allocate %zu + %zu bytes of pinned host memory to stage CUDA buffers",
                 fn, slen, rlen);
        res = gvqSystemError;
        goto out_free;
    }
    if (sdev) GVQCHECKGOTO(dev->copy_to_host(hs, send, slen), res, out_free);
    GVQCHECKGOTO(run(arg, sdev ? hs : send, rdev ? hr : recv), res, out_free);
    if (rdev) GVQCHECKGOTO(dev->copy_from_host(recv, hr, rlen), res, out_free);
out_free:
    if (hs != NULL) dev->host_free(hs);
    if (hr != NULL) dev->host_free(hr);
    gvqResult_t r2 = dev->set_stream(prev, NULL);
    return res != gvqSuccess ? res : r2;
}

#ifndef GVQ_WITH_CUDA
int gvq_cuda_device_count(void) { return 0; }
#endif
