/*
 * gvq_select.h -- which algorithm runs a plain collective (select.c): a table of measured
 * crossovers by collective, rank count, size and datatype, overridden by GVQ_ALGO.
 */
#ifndef GVQ_SELECT_H_
#define GVQ_SELECT_H_

#include "gvq_group.h"

typedef enum {
    GVQ_ALGO_AUTO,   /* the table */
    GVQ_ALGO_RING,   /* the pipelined ring (broadcast and reduce: the chain) */
    GVQ_ALGO_RD,     /* recursive doubling (allgather: Bruck) */
    GVQ_ALGO_RAB,    /* Rabenseifner's recursive halving/doubling */
    GVQ_ALGO_TREE,   /* binomial tree */
    GVQ_ALGO_DIRECT, /* ring reduce-scatter, direct allgather: sends from library memory only */
    GVQ_ALGO_SHM,    /* allreduce through the communicator's shared memory
                        (src/algorithms/shm_collectives.c) */
    GVQ_ALGO_HIER,   /* allreduce: inside each host, across hosts per local rank, inside again
                        (src/algorithms/hier.c) */
    GVQ_ALGO_COUNT
} gvq_algo_t;

/* The algorithm for a collective of `kind` (GVQ_OP_ALLREDUCE .. GVQ_OP_ALLGATHER) on nranks
 * ranks moving `bytes` (nccl-tests' size: the whole buffer, all blocks for reduce-scatter and
 * allgather) of dtype. FIFO transports always get the ring. `one_host`: every rank runs on one
 * host (gvq_transport_t.one_host), which picks the rows measured on shared memory, else those
 * measured across hosts, and 2 the same with the communicator's shared memory mapped (then
 * allreduce up to 64 KiB runs shm); `staged`: the transport copies sends out of the caller's memory
 * (stages_sends), which on one host moves the ring's rows to direct; `hier`: the hosts have the
 * hierarchical allreduce's shape (gvq_coll_ctx_t.hier). The first use of each (collective,
 * algorithm) is reported at INFO. Never GVQ_ALGO_AUTO. */
gvq_algo_t gvq_select_algo(gvq_op_kind_t kind, int nranks, size_t bytes, gvqDataType_t dtype,
                           int fifo, int staged, int one_host, int hier);
const char *gvq_algo_name(gvq_algo_t a);
/* Reports at INFO, the first time for each collective, that a call of `kind` rode along with
 * the call agreement (collectives.c rides_along; reducescatter, allgather, broadcast, reduce). */
void gvq_select_report_ride(gvq_op_kind_t kind, size_t bytes, int nranks);
/* What GVQ_ALGO names for a collective of `kind` (GVQ_ALGO_AUTO: nothing). */
gvq_algo_t gvq_select_forced(gvq_op_kind_t kind);
/* Replace GVQ_ALGO's setting with spec (same syntax; NULL: the environment's again). For tests;
 * not while collectives run. */
void gvq_select_override(const char *spec);

#endif /* GVQ_SELECT_H_ */
