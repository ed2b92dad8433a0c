/*
 * dtype.c -- element sizes and names, and result strings (one X-macro list).
 */
#include "gvq_util.h"

#define GVQ_RESULT_LIST(X)                                                  \
    X(gvqSuccess, "no error")                                               \
    X(gvqUnhandledCudaError, "unhandled cuda error")                        \
    X(gvqSystemError, "unhandled system error")                             \
    X(gvqInternalError, "internal error")                                   \
    X(gvqInvalidArgument, "invalid argument")                               \
    X(gvqInvalidUsage, "invalid usage")                                     \
    X(gvqRemoteError, "remote process exited or there was a network error") \
    X(gvqInProgress, "operation in progress")                               \
    X(gvqTimeout, "operation timed out")

const char *gvqGetErrorString(gvqResult_t result) {
    switch (result) {
#define GVQ_RESULT_CASE(code, text) \
    case code:                      \
        return text;
        GVQ_RESULT_LIST(GVQ_RESULT_CASE)
#undef GVQ_RESULT_CASE
    default:
        return "unknown result code";
    }
}

#define GVQ_DTYPE_LIST(X)            \
    X(gvqInt8, int8_t, "int8")       \
    X(gvqUint8, uint8_t, "uint8")    \
    X(gvqInt32, int32_t, "int32")    \
    X(gvqUint32, uint32_t, "uint32") \
    X(gvqInt64, int64_t, "int64")    \
    X(gvqUint64, uint64_t, "uint64") \
    X(gvqFloat16, uint16_t, "half")  \
    X(gvqFloat32, float, "float")    \
    X(gvqFloat64, double, "double")  \
    X(gvqBfloat16, uint16_t, "bfloat16")

int gvq_dtype_valid(int t) {
    return t >= 0 && t < gvqNumTypes;
}
int gvq_op_valid(int op) {
    return op >= 0 && op < gvqNumOps;
}

size_t gvq_dtype_size(gvqDataType_t t) {
    switch (t) {
#define GVQ_DTYPE_SIZE(e, ctype, name) \
    case e:                            \
        return sizeof(ctype);
        GVQ_DTYPE_LIST(GVQ_DTYPE_SIZE)
#undef GVQ_DTYPE_SIZE
    default:
        return 0;
    }
}

const char *gvq_dtype_name(gvqDataType_t t) {
    switch (t) {
#define GVQ_DTYPE_NAME(e, ctype, name) \
    case e:                            \
        return name;
        GVQ_DTYPE_LIST(GVQ_DTYPE_NAME)
#undef GVQ_DTYPE_NAME
    default:
        return "invalid";
    }
}

int gvq_dtype_is_float(gvqDataType_t t) {
    return t == gvqFloat16 || t == gvqFloat32 || t == gvqFloat64 || t == gvqBfloat16;
}

const char *gvq_op_name(gvqRedOp_t op) {
    static const char *names[gvqNumOps] = {"sum", "prod", "max", "min", "avg"};
    return gvq_op_valid((int)op) ? names[op] : "invalid";
}
