/*
 * device.c -- the registry of devices built into the library (the host device of src/device/,
 * the CUDA device of src/device/cuda/), which device a buffer's memory belongs to, and staging of
 * device buffers through pinned host memory.
 */
#include <strings.h>

#include "gvq_devices.h"

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

#ifdef GVQ_WITH_CUDA
/* Whether a buffer may be CUDA memory at all (GVQ_CUDA_BUFFERS and a device), asked once: every
 * collective asks where its buffers live. */
static int cuda_buffers_possible(void) {
    static int possible = -1; /* -1: not asked yet; the same answer from every thread */
    int v = __atomic_load_n(&possible, __ATOMIC_RELAXED);
    if (v < 0) {
        v = gvq_param(GVQ_PARAM_CUDA_BUFFERS) && gvq_cuda_device_count() > 0;
        __atomic_store_n(&possible, v, __ATOMIC_RELAXED);
    }
    return v;
}
#endif

const gvq_device_ops_t *gvq_device_of(const void *p) {
    if (extra_dev != NULL && p != NULL && extra_owns(p)) return extra_dev;
#ifdef GVQ_WITH_CUDA
    if (p != NULL && cuda_buffers_possible() && gvq_cuda_is_device_ptr(p)) return &gvq_cuda_device;
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

void gvq_pinned_free(gvq_pinned_t *pin) {
    if (pin->p != NULL) pin->dev->host_free(pin->p);
    pin->p = NULL;
    pin->bytes = 0;
    pin->dev = NULL;
}

void *gvq_pinned_reserve(gvq_pinned_t *pin, const gvq_device_ops_t *dev, size_t bytes) {
    if (pin->p != NULL && pin->dev == dev && pin->bytes >= bytes) return pin->p;
    gvq_pinned_free(pin);
    if ((pin->p = dev->host_alloc(bytes)) == NULL) return NULL;
    pin->bytes = bytes;
    pin->dev = dev;
    return pin->p;
}

gvqResult_t gvq_device_staged(const gvq_device_ops_t *dev, void *stream, const char *fn,
                              gvq_pinned_t *pin, const void *send, size_t slen, void *recv,
                              size_t rlen, gvq_staged_fn_t run, void *arg) {
    int sdev = slen && gvq_device_of(send) == dev, rdev = rlen && gvq_device_of(recv) == dev;
    size_t soff = sdev ? (slen + 63) & ~(size_t)63 : 0; /* recv's copy starts 64-aligned */
    void *prev = NULL;
    char *h = NULL;
    gvqResult_t res = gvqSuccess;
    GVQCHECK(dev->set_stream(gvq_device_user_stream(dev, stream), &prev));
    if ((sdev || rdev) && (h = gvq_pinned_reserve(pin, dev, soff + (rdev ? rlen : 0))) == NULL) {
        GVQ_WARN("%s: cannot allocate %zu + %zu bytes of pinned host memory to stage CUDA buffers",
                 fn, slen, rlen);
        res = gvqSystemError;
        goto out;
    }
    if (sdev) GVQCHECKGOTO(dev->copy_to_host(h, send, slen), res, out);
    GVQCHECKGOTO(run(arg, sdev ? h : send, rdev ? h + soff : recv), res, out);
    if (rdev) GVQCHECKGOTO(dev->copy_from_host(recv, h + soff, rlen), res, out);
out:;
    gvqResult_t r2 = dev->set_stream(prev, NULL);
    return res != gvqSuccess ? res : r2;
}

gvqResult_t gvq_device_copy_behind(const gvq_device_ops_t *dev, void *stream, void *dst,
                                   const void *src, size_t bytes, int to_host) {
    void *prev = NULL;
    GVQCHECK(dev->set_stream(gvq_device_user_stream(dev, stream), &prev));
    gvqResult_t res =
        to_host ? dev->copy_to_host(dst, src, bytes) : dev->copy_from_host(dst, src, bytes);
    gvqResult_t r2 = dev->set_stream(prev, NULL);
    return res != gvqSuccess ? res : r2;
}

#ifndef GVQ_WITH_CUDA
int gvq_cuda_device_count(void) {
    return 0;
}
#endif
