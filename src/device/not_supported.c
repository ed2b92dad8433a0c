/*
 * not_supported.c -- the shared stub behind every operation a device does not have.
 */
#include "gvq_device.h"

gvqResult_t gvq_device_not_supported(const char *device, const char *op) {
    GVQ_WARN("device '%s' does not support the operation %s", device, op);
    return gvqInternalError;
}
