/*
 * perf_values.h -- typed access to gvq-perf's buffers through double: tests/test_values.h's get
 * and put, whose half and bfloat16 conversions are the library's own (round to nearest even).
 * Part of gvq_perf_internal, since test_values.h calls those conversions from gvq_util.h.
 */
#ifndef PERF_VALUES_H_
#define PERF_VALUES_H_

#include <stddef.h>

#include "gvq.h"

/* Element i of buf, of type t, as a double. */
double perf_value_load(const void *buf, gvqDataType_t t, size_t i);

/* Stores v (a small non-negative integer) as element i of buf, of type t. */
void perf_value_store(void *buf, gvqDataType_t t, size_t i, double v);

#endif /* PERF_VALUES_H_ */
