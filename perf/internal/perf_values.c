/*
 * perf_values.c -- typed element access for gvq-perf (see perf_values.h).
 */
#include "perf_values.h"

#include <stdint.h>

#include "gvq_util.h" /* gvq_half_to_float and the other conversions test_values.h calls */
#include "test_values.h"

double perf_value_load(const void *buf, gvqDataType_t t, size_t i) {
    return get(buf, t, i);
}

void perf_value_store(void *buf, gvqDataType_t t, size_t i, double v) {
    put(buf, t, i, v);
}
