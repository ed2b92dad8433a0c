/*
 * gvq_train_below.h -- everything the training layer (src/train/) uses of the library's inside:
 * the one internal header it sees beside include/ and src/util/ (its include path holds nothing
 * else, so the build refuses anything more). Each declaration repeats the one in the layer that
 * defines it; tests/unit/test_train_below.c includes both, so the compiler refuses any
 * difference.
 */
#ifndef GVQ_TRAIN_BELOW_H_
#define GVQ_TRAIN_BELOW_H_

#include <stddef.h>
#include <stdint.h>

#include "gvq.h"
#include "gvq_util.h"

/* ---- src/comm/ --------------------------------------------------------------------------- */
/* comm live (a WARN naming fn otherwise), and with no_group the caller outside a group */
gvqResult_t gvq_comm_check(gvqComm_t comm, const char *fn, int no_group);
int gvq_comm_is_live(gvqComm_t comm);
/* whether gvqCommSplit can split comm (its transport makes new communicators: mpi, ucx) */
int gvq_comm_can_split(gvqComm_t comm);
/* whether comm's transport runs calls from several threads at once; its idle check (an abort or
 * a timeout while the caller waits on something else) */
int gvq_comm_concurrent(gvqComm_t comm);
gvqResult_t gvq_comm_idle(gvqComm_t comm, uint64_t *since);
/* a job queued on a host stream: run, then release, on the stream's thread, in order with the
 * stream's calls on comms */
typedef gvqResult_t (*gvq_job_fn)(void *arg);
typedef void (*gvq_job_free_fn)(void *arg);
gvqResult_t gvq_stream_enqueue(gvqStream_t s, const char *fn, gvqComm_t const *comms, int ncomms,
                               gvq_job_fn run, gvq_job_free_fn release, void *arg);

/* ---- src/compress/ ------------------------------------------------------------------------- */
/* whether c's calls can share one call with others of its method (the fused group) */
int gvq_compressor_fuses(gvqCompressor_t c);

/* ---- src/algorithms/ (sparse pieces) ------------------------------------------------------- */
/* a shard update rule (gvqPsRule_t) on one row: w += rule(g * gscale), s its state */
void gvq_rule_apply_params(int rule, double lr, double mu, double eps, double gscale,
                           gvqDataType_t dtype, size_t dim, void *w, void *s, const void *g);

/* ---- src/device/ ---------------------------------------------------------------------------- */
/* column-major sgemm on the host: C = alpha op(A) op(B) + beta C */
gvqResult_t gvq_host_sgemm(int transa, int transb, int m, int n, int k, float alpha, const float *a,
                           int lda, const float *b, int ldb, float beta, float *c, int ldc);

#endif /* GVQ_TRAIN_BELOW_H_ */
