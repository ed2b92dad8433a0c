/*
 * gvq_devices.h -- the devices as the API front sees them (device.c): the registry of devices
 * built into the library, which device a buffer belongs to, and staged host work on device
 * buffers. The ops table itself is src/device/gvq_device.h.
 */
#ifndef GVQ_DEVICES_H_
#define GVQ_DEVICES_H_

#include "gvq_device.h"

/* The registry of devices built into this library (device.c): "host" always; "cuda" in
 * builds with GVQ_WITH_CUDA when a CUDA device is usable. Returns NULL, with a WARN, for a name
 * that is not built in or has no usable device. */
const gvq_device_ops_t *gvq_device_find(const char *name);
/* The device whose memory holds p: the CUDA device for CUDA device (or managed) memory, the host
 * device for everything else. In builds without CUDA (and with CUDA but no usable device) a
 * device pointer cannot be told from a host one, and this is always the host device. */
const gvq_device_ops_t *gvq_device_of(const void *p);
/* One more device, whose memory `owns` tells from host memory, for gvq_device_of to find
 * before the built-in ones (NULL, NULL: none). Not thread-safe against calls in flight: set it
 * before making communicators. The unit tests' simulated device uses it to run the
 * device-resident paths without a GPU. */
void gvq_device_register(const gvq_device_ops_t *dev, int (*owns)(const void *p));
/* The stream the device ops should run a caller's work on: `stream`, or, for NULL on the CUDA
 * device, the legacy default stream, so that staged copies are ordered after the caller's
 * earlier default-stream work as with NCCL (the ops' own stream is non-blocking and would race
 * with it). */
void *gvq_device_user_stream(const gvq_device_ops_t *dev, void *stream);

/* Host work on device buffers, staged: the buffers that live on `dev` (send: slen bytes, recv:
 * rlen bytes) are replaced by pinned host copies (send copied in behind `stream`), run(arg,
 * send, recv) does the work on host memory, and recv is copied back; returns when the result is
 * in place. The pinned memory comes from *pin, kept for the next call. `fn` names the caller in
 * the WARN when pinned memory runs out. */
typedef gvqResult_t (*gvq_staged_fn_t)(void *arg, const void *send, void *recv);
/* Pinned host memory kept between staged calls (one per communicator), grown on demand. */
typedef struct {
    void *p;
    size_t bytes;
    const gvq_device_ops_t *dev; /* whose host_alloc made p */
} gvq_pinned_t;
void gvq_pinned_free(gvq_pinned_t *pin);
/* At least `bytes` of dev's pinned memory in pin (contents not kept; NULL when out of memory). */
void *gvq_pinned_reserve(gvq_pinned_t *pin, const gvq_device_ops_t *dev, size_t bytes);
/* Copy between a buffer of dev and host memory behind `stream` (the caller's; NULL: as
 * gvq_device_user_stream says), returning when the bytes are in place: to_host 1 copies dev's
 * src into host dst, 0 host src into dev's dst. */
gvqResult_t gvq_device_copy_behind(const gvq_device_ops_t *dev, void *stream, void *dst,
                                   const void *src, size_t bytes, int to_host);
gvqResult_t gvq_device_staged(const gvq_device_ops_t *dev, void *stream, const char *fn,
                              gvq_pinned_t *pin, const void *send, size_t slen, void *recv,
                              size_t rlen, gvq_staged_fn_t run, void *arg);
#endif /* GVQ_DEVICES_H_ */
