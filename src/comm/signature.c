/*
 * signature.c -- call signatures: every collective agrees on what it is before its data moves.
 *
 * A call's signature is a row of integers, the same on every rank when the ranks made the same
 * call:
 *
 *   [ call number | refused | kind | count | datatype | op | root | identity | algorithm | device ]
 *
 * The call number counts the collectives agreed on this communicator; `refused` is the result
 * with which this rank refused its own arguments (the rank still takes part, so that the others
 * fail at once instead of waiting out the timeout); identity is what else defines the call (a
 * compressed allreduce's compressor config); algorithm is the one a plain collective will run
 * (GVQ_ALGO or the size table: a rank with a different GVQ_ALGO would otherwise pair its
 * messages with another algorithm's and time out); device says the buffers are CUDA memory (a
 * rank with host buffers would take another path: NCCL or staging, and the small allreduce's
 * data rides along on host buffers only). gvq_agree_extremes gives every rank the smallest
 * and the largest row of all ranks in about log2 N small messages; equal means every rank made
 * the same call. A small allreduce that runs recursive doubling, and across hosts a small
 * reducescatter, allgather, broadcast or reduce, sends its vector in the same messages
 * (gvq_call_agree_allreduce, recursive.c's signed exchange): one exchange instead of an
 * agreement and then the data, and the result is written only once the rows agree. Otherwise
 * both extremes are named in the WARN, which reads the same on every rank:
 *
 *   gvqAllReduce: rank 0 called gvqAllReduce(count 256, float, sum) but rank 1 called
 *   gvqAllReduce(count 8192, float, sum) (collective call 3 on this communicator)
 *
 * The order of the fields decides which difference is reported: ranks out of step first (the
 * communicator is then broken: every later call would pair with another rank's different one),
 * then a rank's own refusal, then the arguments. No output was written (a small allreduce's data
 * may have ridden along, into library memory only), so after a refusal or different
 * arguments the communicator stays usable.
 */
#include <stdio.h>

#include "gvq_comm.h"
#include "gvq_select.h"

enum {
    F_CALL,
    F_REFUSED,
    F_KIND,
    F_COUNT,
    F_DTYPE,
    F_OP,
    F_ROOT,
    F_IDENTITY,
    F_ALGO,
    F_DEVICE,
    F_N
};

/* On the wire a row is packed into W_N words, so that on shared memory it shares one cache line
 * with the slot's call number: the call number, then the small fields a byte each (refusal
 * first: it is compared right after the call number), the count, the root, the identity. A
 * small field outside its byte (a refused call's bad datatype) travels as SMALL_OUT. */
enum { W_CALL, W_SMALL, W_COUNT, W_ROOT, W_IDENTITY, W_N };
enum { SMALL_OUT = 0xff };
static const int small_field[] = {F_REFUSED, F_KIND, F_DTYPE, F_OP, F_DEVICE, F_ALGO};
enum { SMALL_FIELDS = sizeof small_field / sizeof small_field[0] };
_Static_assert(SMALL_FIELDS * 8 < 64, "the small fields leave the packed word's sign bit clear");

static void pack_row(const int64_t *row, int64_t *w) {
    uint64_t small = 0;
    for (int i = 0; i < SMALL_FIELDS; i++) { /* -1 (none) and 0..253 as 0..254 */
        int64_t v = row[small_field[i]] + 1;
        small = small << 8 | (uint64_t)(v >= 0 && v < SMALL_OUT ? v : SMALL_OUT);
    }
    w[W_CALL] = row[F_CALL];
    w[W_SMALL] = (int64_t)small;
    w[W_COUNT] = row[F_COUNT];
    w[W_ROOT] = row[F_ROOT];
    w[W_IDENTITY] = row[F_IDENTITY];
}

static void unpack_row(const int64_t *w, int64_t *row) {
    uint64_t small = (uint64_t)w[W_SMALL];
    for (int i = SMALL_FIELDS - 1; i >= 0; i--, small >>= 8) {
        int64_t v = (int64_t)(small & 0xffu);
        row[small_field[i]] = v == SMALL_OUT ? INT32_MIN : v - 1;
    }
    row[F_CALL] = w[W_CALL];
    row[F_COUNT] = w[W_COUNT];
    row[F_ROOT] = w[W_ROOT];
    row[F_IDENTITY] = w[W_IDENTITY];
}

static const char *kind_fn[] = {"gvqAllReduce",     "gvqBroadcast", "gvqReduce",
                                "gvqReduceScatter", "gvqAllGather", "gvqAllReduceCompressed"};

static const char *kind_name(int64_t kind) {
    return kind >= 0 && kind <= GVQ_SIG_COMPRESSED ? kind_fn[kind] : "an unknown call";
}

/* "gvqReduce(count 256, float, sum, root 0)": the arguments that define the call, and the
 * algorithm when show_algo (the ranks differ in it). */
static void describe(const int64_t *row, int show_algo, char *buf, size_t len) {
    int n = snprintf(buf, len, "%s(count %llu", kind_name(row[F_KIND]),
                     (unsigned long long)row[F_COUNT]);
    if (row[F_DTYPE] >= 0 && n > 0 && (size_t)n < len)
        n +=
            snprintf(buf + n, len - (size_t)n, ", %s", gvq_dtype_name((gvqDataType_t)row[F_DTYPE]));
    if (row[F_OP] >= 0 && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ", %s", gvq_op_name((gvqRedOp_t)row[F_OP]));
    if (row[F_ROOT] >= 0 && row[F_KIND] == GVQ_SIG_COMPRESSED && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ", a group of %lld compressed calls in all",
                      (long long)row[F_ROOT]);
    else if (row[F_ROOT] >= 0 && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ", root %lld", (long long)row[F_ROOT]);
    static const char *const codec[] = {"none", "gradiveq", "qsgd", "powersgd", "auto"};
    uint64_t id = (uint64_t)row[F_IDENTITY];
    if (id != 0 && row[F_KIND] == GVQ_SIG_ALLREDUCE && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ", GVQ_CODEC=%s with zero-code settings %014llx",
                      (id & 0xffu) < 5        ? codec[id & 0xffu]
                      : (id & 0xffu) == 0xffu ? "(a value that names no codec)"
                                              : "?",
                      (unsigned long long)(id >> 8));
    else if (id != 0 && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ", compressor config %016llx",
                      (unsigned long long)id);
    if (row[F_DEVICE] != 0 && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ", CUDA buffers");
    if (show_algo && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ", algorithm %s",
                      gvq_algo_name((gvq_algo_t)row[F_ALGO]));
    if (n > 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, ")");
}

static void sig_row(gvqComm_t comm, const gvq_call_sig_t *sig, int64_t *row) {
    row[F_CALL] = (int64_t)comm->calls;
    row[F_REFUSED] = (int64_t)sig->refused;
    row[F_KIND] = (int64_t)sig->kind;
    row[F_COUNT] = (int64_t)sig->count;
    row[F_DTYPE] = sig->dtype;
    row[F_OP] = sig->op;
    row[F_ROOT] = sig->root;
    row[F_IDENTITY] = (int64_t)sig->identity;
    row[F_ALGO] = sig->algo;
    row[F_DEVICE] = sig->device;
}

static gvqResult_t judge(gvqComm_t comm, const char *fn, const gvq_call_sig_t *sig,
                         const int64_t *lo, int lo_rank, const int64_t *hi, int hi_rank);

gvqResult_t gvq_call_agree(gvqComm_t comm, const char *fn, const gvq_call_sig_t *sig) {
    return gvq_call_agree_allreduce(comm, fn, sig, NULL);
}

gvqResult_t gvq_call_agree_allreduce(gvqComm_t comm, const char *fn, const gvq_call_sig_t *sig,
                                     const gvq_signed_payload_t *pay) {
    if (comm->nranks == 1 && pay == NULL) return sig->refused;
    int64_t row[F_N], lo[F_N], hi[F_N], w[W_N], wlo[W_N], whi[W_N];
    int lo_rank = 0, hi_rank = 0;
    gvq_shm_t *shm = NULL;
    GVQCHECK(gvq_comm_shm(comm, &shm));
    sig_row(comm, sig, row);
    pack_row(row, w);
    gvq_coll_ctx_t ctx = gvq_comm_ctx(comm, NULL);
    if (shm != NULL)
        GVQCHECK(gvq_shm_signed(&ctx, shm, w, W_N, wlo, &lo_rank, whi, &hi_rank, pay));
    else if (pay != NULL)
        GVQCHECK(gvq_rd_signed(&ctx, w, W_N, wlo, &lo_rank, whi, &hi_rank, pay));
    else
        GVQCHECK(gvq_agree_extremes(&ctx, w, W_N, wlo, &lo_rank, whi, &hi_rank));
    comm->calls++;
    unpack_row(wlo, lo);
    unpack_row(whi, hi);
    return judge(comm, fn, sig, lo, lo_rank, hi, hi_rank);
}

/* The call's result from the extremes of all ranks' rows, and the WARN when they differ. */
static gvqResult_t judge(gvqComm_t comm, const char *fn, const gvq_call_sig_t *sig,
                         const int64_t *lo, int lo_rank, const int64_t *hi, int hi_rank) {
    int differ = 0;
    for (int f = 0; f < F_N; f++)
        differ |= lo[f] != hi[f];
    if (!differ) return sig->refused;

    char a[160], b[160];
    int show_algo = lo[F_ALGO] != hi[F_ALGO] && lo[F_ALGO] >= 0 && hi[F_ALGO] >= 0;
    describe(lo, show_algo, a, sizeof a);
    describe(hi, show_algo, b, sizeof b);
    if (lo[F_CALL] != hi[F_CALL]) {
        GVQ_WARN("%s: the ranks are out of step: rank %d is at collective call %llu of this "
                 "communicator, %s, but rank %d at call %llu, %s (a rank skipped or added a "
                 "call); the communicator is broken",
                 fn, lo_rank, (unsigned long long)lo[F_CALL], a, hi_rank,
                 (unsigned long long)hi[F_CALL], b);
        gvq_broken_set(&comm->broken, gvqInvalidUsage);
        return gvqInvalidUsage;
    }
    if (sig->refused != gvqSuccess) return sig->refused; /* its WARN says why: keep it the last */
    if (hi[F_REFUSED] != gvqSuccess) {
        GVQ_WARN("%s: rank %d refused its own call %s (%s) while rank %d called %s; nothing ran on "
                 "any rank (collective call %llu of this communicator)",
                 fn, hi_rank, b, gvqGetErrorString((gvqResult_t)hi[F_REFUSED]), lo_rank, a,
                 (unsigned long long)lo[F_CALL]);
        return gvqRemoteError;
    }
    GVQ_WARN("%s: rank %d called %s but rank %d called %s; nothing ran on any rank (collective "
             "call %llu of this communicator)%s",
             fn, lo_rank, a, hi_rank, b, (unsigned long long)lo[F_CALL],
             show_algo ? "; GVQ_ALGO or GVQ_SEND_COPY differs between the ranks" : "");
    return gvqInvalidArgument;
}
