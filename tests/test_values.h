/* test_values.h -- typed access to test buffers through double (exact for the values used). */
#ifndef GVQ_TEST_VALUES_H_
#define GVQ_TEST_VALUES_H_

static double get(const void *b, gvqDataType_t t, size_t i) {
    switch (t) {
    case gvqInt8:
        return ((const int8_t *)b)[i];
    case gvqUint8:
        return ((const uint8_t *)b)[i];
    case gvqInt32:
        return ((const int32_t *)b)[i];
    case gvqUint32:
        return ((const uint32_t *)b)[i];
    case gvqInt64:
        return (double)((const int64_t *)b)[i];
    case gvqUint64:
        return (double)((const uint64_t *)b)[i];
    case gvqFloat16:
        return gvq_half_to_float(((const uint16_t *)b)[i]);
    case gvqFloat32:
        return ((const float *)b)[i];
    case gvqFloat64:
        return ((const double *)b)[i];
    case gvqBfloat16:
        return gvq_bf16_to_float(((const uint16_t *)b)[i]);
    default:
        return 0;
    }
}

static void put(void *b, gvqDataType_t t, size_t i, double v) {
    switch (t) {
    case gvqInt8:
        ((int8_t *)b)[i] = (int8_t)v;
        break;
    case gvqUint8:
        ((uint8_t *)b)[i] = (uint8_t)v;
        break;
    case gvqInt32:
        ((int32_t *)b)[i] = (int32_t)v;
        break;
    case gvqUint32:
        ((uint32_t *)b)[i] = (uint32_t)v;
        break;
    case gvqInt64:
        ((int64_t *)b)[i] = (int64_t)v;
        break;
    case gvqUint64:
        ((uint64_t *)b)[i] = (uint64_t)v;
        break;
    case gvqFloat16:
        ((uint16_t *)b)[i] = gvq_float_to_half((float)v);
        break;
    case gvqFloat32:
        ((float *)b)[i] = (float)v;
        break;
    case gvqFloat64:
        ((double *)b)[i] = v;
        break;
    case gvqBfloat16:
        ((uint16_t *)b)[i] = gvq_float_to_bf16((float)v);
        break;
    default:
        break;
    }
}

#endif
