/*
 * perf_pattern.h -- the data gvq-perf's plain benchmarks send and the results they expect
 * (perf_pattern.c), and MPI's names for gvq's types and ops.
 *
 * Rank r's element at global index i is a small integer derived from (r, i) (1..5; for prod 1
 * or 2), so that every collective's result has an exact closed form that the tool computes on
 * its own, in double / int64, without asking any library. "Global index": the element's place
 * in the whole vector the collective works on (reducescatter: the input; allgather: the output).
 */
#ifndef PERF_PATTERN_H_
#define PERF_PATTERN_H_

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "perf_args.h"

typedef struct {
    const dtype_info_t *dt;
    gvqRedOp_t op;
    int nranks;
} check_t;

/* MPI's type for a gvq type, or MPI_DATATYPE_NULL where MPI has none. */
MPI_Datatype perf_mpi_dtype(gvqDataType_t t);

/* MPI's op for a gvq op, or MPI_OP_NULL where MPI has none. */
MPI_Op perf_mpi_op(gvqRedOp_t op);

/* Writes rank `rank`'s elements first .. first+count-1 to buf[0..count). */
void perf_pattern_fill(void *buf, size_t count, int rank, size_t first, const check_t *c);

/* Elements of buf[0..count) that differ from the reduction over every rank of the elements
 * first .. first+count-1 (avg of floats: within the type's tolerance). */
int64_t perf_pattern_wrong_reduced(const void *buf, size_t count, size_t first, const check_t *c);

/* Elements of buf[0..count) that differ from rank `rank`'s elements first .. first+count-1. */
int64_t perf_pattern_wrong_copied(const void *buf, size_t count, int rank, size_t first,
                                  const check_t *c);

#endif /* PERF_PATTERN_H_ */
