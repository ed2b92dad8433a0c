/*
 * perf_plain.c -- the plain collective benchmarks: codec none (gvq's call) and codec mpi (its
 * MPI counterpart, the reference) for every collective of -k, every datatype and op, on data
 * whose result has a closed form (perf_pattern.h). For each size, out-of-place then in-place:
 *
 *     fill the input -> warmup calls -> MPI_Barrier -> time `iters` calls -> max over ranks
 *     -> (check) refill, poison the output, one call, count wrong elements over the ranks
 *
 * `count` is the whole vector, as nccl-tests counts it: reducescatter's input and allgather's
 * output, nranks blocks of `block` elements; every other collective's buffer. Where each
 * collective's input and output lie (S: sendbuf, R: recvbuf, r: this rank, b = block):
 *
 *                  out-of-place                 in-place (gvq)          in-place (MPI)
 *   allreduce      S -> R                       R -> R                  MPI_IN_PLACE, R
 *   reducescatter  S[n*b] -> R[b]               R[n*b] -> R + r*b       MPI_IN_PLACE, result at R
 *   allgather      S[b] -> R[n*b]               R + r*b -> R            MPI_IN_PLACE, R
 *   broadcast      root's S -> every R          root's R -> every R     MPI_Bcast(R)
 *                  (MPI: root copies S to R, then MPI_Bcast(R))
 *   reduce         S -> root's R                R -> root's R           root: MPI_IN_PLACE
 *   sendrecv       S -> R of rank r+1           not run (n/a)
 *
 * The check compares with what the closed form says (never with another library's result):
 * the reduction over the ranks (allreduce, reducescatter's block r, reduce on the root), rank
 * b's input (allgather's block b), the root's (broadcast), rank r-1's (sendrecv).
 */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "perf_bench.h"
#include "perf_common.h"
#include "perf_pattern.h"

/* ---- which cases run ------------------------------------------------------------------------ */

/* Why MPI cannot run this collective with o's dtype and op, or NULL if it can. The collectives
 * that only move data send the bytes of types MPI has no name for. */
static const char *mpi_skip_reason(const opts_t *o, char *buf, size_t len) {
    if (!coll_reduces(o->coll)) return NULL;
    const char *name = perf_coll_mpi_names[o->coll];
    if (perf_mpi_dtype(o->dt->type) == MPI_DATATYPE_NULL) {
        snprintf(buf, len, "%s has no %s type", name, o->dt->name);
        return buf;
    }
    if (perf_mpi_op(o->op) == MPI_OP_NULL) {
        snprintf(buf, len, "%s has no %s op", name, perf_op_names[o->op]);
        return buf;
    }
    return NULL;
}

/* gvq's collectives take every datatype and op. */
static const char *never_skipped(const opts_t *o, char *buf, size_t len) {
    (void)o;
    (void)buf;
    (void)len;
    return NULL;
}

/* ---- one case ------------------------------------------------------------------------------- */

typedef struct {
    const opts_t *o;
    codec_t codec;
    int inplace;
    size_t count, block; /* the whole vector; reducescatter's and allgather's block */
    size_t esize;
    void *sendbuf, *recvbuf; /* the run's buffers */
    const void *send;        /* the call's arguments */
    void *recv;
    check_t chk;
} plain_case_t;

static void *at(void *buf, size_t elems, size_t esize) {
    return (char *)buf + elems * esize;
}

/* The ranks sendrecv sends to and receives from. */
static int next_rank(void) {
    return (perf_rank + 1) % perf_nranks;
}
static int prev_rank(void) {
    return (perf_rank + perf_nranks - 1) % perf_nranks;
}

/* Fills this rank's input for the case and sets the call's send and recv. */
static void setup(plain_case_t *c) {
    const int r = perf_rank;
    void *in = c->inplace ? c->recvbuf : c->sendbuf;
    c->recv = c->recvbuf;
    switch (c->o->coll) {
    case COLL_ALLGATHER:
        if (c->inplace) in = at(c->recvbuf, (size_t)r * c->block, c->esize);
        perf_pattern_fill(in, c->block, r, (size_t)r * c->block, &c->chk);
        break;
    case COLL_REDUCESCATTER:
        perf_pattern_fill(in, c->count, r, 0, &c->chk);
        if (c->inplace && c->codec == CODEC_NONE)
            c->recv = at(c->recvbuf, (size_t)r * c->block, c->esize);
        break;
    case COLL_BROADCAST:
        if (r == c->o->root) perf_pattern_fill(in, c->count, r, 0, &c->chk);
        break;
    default: /* allreduce, reduce, sendrecv */
        perf_pattern_fill(in, c->count, r, 0, &c->chk);
        break;
    }
    c->send = in;
}

/* One call of gvq's collective. */
static void call_gvq(const plain_case_t *c) {
    const opts_t *o = c->o;
    gvqDataType_t t = o->dt->type;
    switch (o->coll) {
    case COLL_ALLREDUCE:
        GVQTEST(gvqAllReduce(c->send, c->recv, c->count, t, o->op, perf_comm, NULL));
        break;
    case COLL_REDUCESCATTER:
        GVQTEST(gvqReduceScatter(c->send, c->recv, c->block, t, o->op, perf_comm, NULL));
        break;
    case COLL_ALLGATHER:
        GVQTEST(gvqAllGather(c->send, c->recv, c->block, t, perf_comm, NULL));
        break;
    case COLL_BROADCAST:
        GVQTEST(gvqBroadcast(c->send, c->recv, c->count, t, o->root, perf_comm, NULL));
        break;
    case COLL_REDUCE:
        GVQTEST(gvqReduce(c->send, c->recv, c->count, t, o->op, o->root, perf_comm, NULL));
        break;
    case COLL_SENDRECV:
        GVQTEST(gvqGroupStart());
        GVQTEST(gvqSend(c->send, c->count, t, next_rank(), perf_comm, NULL));
        GVQTEST(gvqRecv(c->recv, c->count, t, prev_rank(), perf_comm, NULL));
        GVQTEST(gvqGroupEnd());
        break;
    default:
        break;
    }
}

/* MPI's element for the collective: o's type, or bytes where MPI has no name for it (only the
 * collectives that move data get there; mpi_skip_reason keeps the others out). */
static MPI_Datatype mpi_elem(const plain_case_t *c, size_t *per_elem) {
    MPI_Datatype t = perf_mpi_dtype(c->o->dt->type);
    *per_elem = t == MPI_DATATYPE_NULL ? c->esize : 1;
    return t == MPI_DATATYPE_NULL ? MPI_BYTE : t;
}

/* One MPI call on the elements [off, off+n) (allreduce, broadcast, reduce, sendrecv, whose
 * elements are independent: MPI's counts are int, so large counts go in pieces). */
static void call_mpi_piece(const plain_case_t *c, size_t off, size_t n) {
    const opts_t *o = c->o;
    size_t k;
    MPI_Datatype t = mpi_elem(c, &k);
    MPI_Op op = perf_mpi_op(o->op);
    const void *s = c->inplace ? MPI_IN_PLACE : at((void *)c->send, off, c->esize);
    void *r = at(c->recv, off, c->esize);
    int cnt = (int)(n * k);
    switch (o->coll) {
    case COLL_ALLREDUCE:
        MPITEST(MPI_Allreduce(s, r, cnt, t, op, MPI_COMM_WORLD));
        break;
    case COLL_BROADCAST:
        if (!c->inplace && perf_rank == o->root) memcpy(r, s, n * c->esize);
        MPITEST(MPI_Bcast(r, cnt, t, o->root, MPI_COMM_WORLD));
        break;
    case COLL_REDUCE:
        if (perf_rank != o->root) s = at((void *)c->send, off, c->esize);
        MPITEST(MPI_Reduce(s, r, cnt, t, op, o->root, MPI_COMM_WORLD));
        break;
    case COLL_SENDRECV:
        MPITEST(MPI_Sendrecv(s, cnt, t, next_rank(), 7, r, cnt, t, prev_rank(), 7, MPI_COMM_WORLD,
                             MPI_STATUS_IGNORE));
        break;
    default:
        break;
    }
}

/* One call of the MPI counterpart. */
static void call_mpi(const plain_case_t *c) {
    size_t k;
    MPI_Datatype t = mpi_elem(c, &k);
    const void *s = c->inplace ? MPI_IN_PLACE : c->send;
    if (c->o->coll == COLL_REDUCESCATTER) {
        MPITEST(MPI_Reduce_scatter_block(s, c->recv, (int)c->block, t, perf_mpi_op(c->o->op),
                                         MPI_COMM_WORLD));
        return;
    }
    if (c->o->coll == COLL_ALLGATHER) {
        MPITEST(MPI_Allgather(s, (int)(c->block * k), t, c->recv, (int)(c->block * k), t,
                              MPI_COMM_WORLD));
        return;
    }
    const size_t piece = (size_t)1 << 30;
    for (size_t off = 0; off < c->count; off += piece)
        call_mpi_piece(c, off, c->count - off < piece ? c->count - off : piece);
    if (c->count == 0) call_mpi_piece(c, 0, 0);
}

static void call(const plain_case_t *c) {
    if (c->codec == CODEC_NONE)
        call_gvq(c);
    else
        call_mpi(c);
}

/* Poisons the output that the call must write on this rank (never the input of an in-place
 * case): 0xa5 bytes, which no element of the pattern has. */
static void poison_output(const plain_case_t *c) {
    const int r = perf_rank;
    switch (c->o->coll) {
    case COLL_ALLGATHER:
        for (int b = 0; b < perf_nranks; b++)
            if (!c->inplace || b != r)
                memset(at(c->recvbuf, (size_t)b * c->block, c->esize), 0xa5, c->block * c->esize);
        break;
    case COLL_REDUCESCATTER:
        if (!c->inplace) memset(c->recv, 0xa5, c->block * c->esize);
        break;
    case COLL_BROADCAST:
        if (!c->inplace || r != c->o->root) memset(c->recvbuf, 0xa5, c->count * c->esize);
        break;
    default:
        if (!c->inplace) memset(c->recvbuf, 0xa5, c->count * c->esize);
        break;
    }
}

/* Wrong elements of this rank's output, against the closed form. */
static int64_t wrong_here(const plain_case_t *c) {
    const int r = perf_rank;
    const check_t *k = &c->chk;
    int64_t wrong = 0;
    switch (c->o->coll) {
    case COLL_ALLREDUCE:
        return perf_pattern_wrong_reduced(c->recv, c->count, 0, k);
    case COLL_REDUCESCATTER:
        return perf_pattern_wrong_reduced(c->recv, c->block, (size_t)r * c->block, k);
    case COLL_ALLGATHER:
        for (int b = 0; b < perf_nranks; b++)
            wrong += perf_pattern_wrong_copied(at(c->recv, (size_t)b * c->block, c->esize),
                                               c->block, b, (size_t)b * c->block, k);
        return wrong;
    case COLL_BROADCAST:
        return perf_pattern_wrong_copied(c->recv, c->count, c->o->root, 0, k);
    case COLL_REDUCE:
        return r == c->o->root ? perf_pattern_wrong_reduced(c->recv, c->count, 0, k) : 0;
    case COLL_SENDRECV:
        return perf_pattern_wrong_copied(c->recv, c->count, prev_rank(), 0, k);
    default:
        return 0;
    }
}

/* Wrong elements of one more call on fresh data, summed over the ranks. */
static int64_t check_case(plain_case_t *c) {
    setup(c);
    poison_output(c);
    call(c);
    int64_t wrong = wrong_here(c), total = 0;
    MPITEST(MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
    return total;
}

/* MPI takes int counts: reducescatter's and allgather's blocks must fit one call. */
static int runs(const plain_case_t *c) {
    if (c->o->coll == COLL_SENDRECV && c->inplace) return 0;
    if (c->codec != CODEC_MPI) return 1;
    if (c->o->coll != COLL_REDUCESCATTER && c->o->coll != COLL_ALLGATHER) return 1;
    return c->block * c->esize <= (size_t)INT_MAX;
}

static result_t run_case(plain_case_t *c) {
    result_t res = RESULT_NONE;
    if (!runs(c)) return res;
    setup(c);
    for (int k = 0; k < c->o->warmup; k++)
        call(c);

    MPITEST(MPI_Barrier(MPI_COMM_WORLD));
    double t0 = MPI_Wtime();
    for (int k = 0; k < c->o->iters; k++)
        call(c);
    double elapsed = MPI_Wtime() - t0;
    res.time_us = perf_max_over_ranks(elapsed) / c->o->iters * 1e6;

    if (c->o->check) res.wrong = check_case(c);
    return res;
}

static void run_size(const perf_bench_t *b, const perf_run_t *run, size_t count, perf_case_t *out) {
    const opts_t *o = run->o;
    int blocked = o->coll == COLL_REDUCESCATTER || o->coll == COLL_ALLGATHER;
    plain_case_t c = {
        .o = o,
        .codec = b->codec,
        .count = count,
        .block = blocked ? count / (size_t)perf_nranks : count,
        .esize = o->dt->size,
        .sendbuf = run->sendbuf,
        .recvbuf = run->recvbuf,
        .chk = {o->dt, coll_reduces(o->coll) ? o->op : gvqSum, perf_nranks},
    };
    for (int ip = 0; ip < 2; ip++) {
        c.inplace = ip;
        out->res[ip] = run_case(&c);
    }
}

const perf_bench_t perf_bench_none = {
    .codec = CODEC_NONE, .skip_reason = never_skipped, .run_size = run_size};
const perf_bench_t perf_bench_mpi = {
    .codec = CODEC_MPI, .skip_reason = mpi_skip_reason, .run_size = run_size};
