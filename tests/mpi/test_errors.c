/*
 * test_errors.c -- bad arguments return the documented code, never crash, and leave a
 * gvqGetLastError text that names what was wrong; outputs are not written on failure; and the
 * communicator still works afterwards.
 *
 * Every refused collective here is refused on every rank alike (a refusal on one rank only
 * would leave the others waiting in a collective), so the run stays in step. Refusals that
 * depend on being the root (overlapping buffers of broadcast/reduce) run on 1 rank only.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gvq.h"
#include "gvq_mpi.h"
#include "mpitest.h"

/* Case-insensitive substring search. */
static int mentions(const char *text, const char *word) {
    size_t n = strlen(word);
    for (const char *p = text; *p; p++) {
        size_t i = 0;
        while (i < n && p[i] && tolower((unsigned char)p[i]) == tolower((unsigned char)word[i]))
            i++;
        if (i == n) return 1;
    }
    return 0;
}

/* The call returned `got`; it must be `want`, and gvqGetLastError must name `word`. */
static void refused_at(int line, const char *call, gvqResult_t got, gvqResult_t want,
                       const char *word) {
    const char *last = gvqGetLastError(NULL);
    mt.checks++;
    if (got != want) {
        mt_report_at(__FILE__, line, "%s: expected %d (%s), got %d (%s); gvqGetLastError: \"%s\"",
                     call, (int)want, gvqGetErrorString(want), (int)got, gvqGetErrorString(got),
                     last ? last : "(NULL)");
        mt.failures++;
        return;
    }
    mt.checks++;
    if (last == NULL || last[0] == '\0' || !mentions(last, word)) {
        mt_report_at(__FILE__, line,
                     "%s: returned %s as it should, but gvqGetLastError is \"%s\" "
                     "(expected a text mentioning \"%s\")",
                     call, gvqGetErrorString(got), last ? last : "(NULL)", word);
        mt.failures++;
    }
}

/* Leave a last-error text that does not mention `word`, so a refusal that logs nothing cannot
 * pass on an older text. */
static void mark_last_error(const char *word) {
    gvqGetVersion(NULL); /* "gvqGetVersion: version is NULL" */
    if (mentions(gvqGetLastError(NULL), word)) {
        int x;
        gvqCommUserRank(NULL, &x); /* "gvqCommUserRank: comm is not a live communicator" */
    }
    if (mentions(gvqGetLastError(NULL), word)) MT_FAIL("no marker text avoids \"%s\"", word);
}

#define REFUSED(call, want, word)                                  \
    do {                                                           \
        mark_last_error(word);                                     \
        gvqResult_t refused_res_ = (call);                         \
        refused_at(__LINE__, #call, refused_res_, (want), (word)); \
    } while (0)

#define BAD_TYPE ((gvqDataType_t)42)
#define BAD_OP ((gvqRedOp_t)42)

/* A normal allreduce on comm, checked against MPI_Allreduce. */
static void allreduce_works(gvqComm_t comm, const char *when) {
    enum { N = 1031 };
    int32_t in[N], out[N], ref[N];
    for (int i = 0; i < N; i++)
        in[i] = i * 7 - mt.rank * 3;
    MPI_Allreduce(in, ref, N, MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
    memset(out, 0, sizeof out);
    gvqResult_t res = gvqAllReduce(in, out, N, gvqInt32, gvqSum, comm, NULL);
    MT_CHECK(res == gvqSuccess, "allreduce %s: returned %d (%s): %s", when, (int)res,
             gvqGetErrorString(res), gvqGetLastError(NULL));
    if (res == gvqSuccess)
        MT_CHECK(memcmp(out, ref, sizeof out) == 0,
                 "allreduce %s: result differs from "
                 "MPI_Allreduce (element 1: expected %d, got %d)",
                 when, (int)ref[1], (int)out[1]);
}

static void error_strings(void) {
    const char *s[gvqNumResults];
    for (int i = 0; i < gvqNumResults; i++) {
        s[i] = gvqGetErrorString((gvqResult_t)i);
        MT_CHECK(s[i] != NULL && s[i][0] != '\0', "gvqGetErrorString(%d) is NULL or empty", i);
        if (s[i] == NULL) s[i] = "";
        for (int j = 0; j < i; j++)
            MT_CHECK(strcmp(s[i], s[j]) != 0,
                     "gvqGetErrorString(%d) == gvqGetErrorString(%d) "
                     "== \"%s\"",
                     i, j, s[i]);
    }
    const char *u = gvqGetErrorString((gvqResult_t)99);
    MT_CHECK(u != NULL, "gvqGetErrorString(99) is NULL");
    u = gvqGetErrorString(gvqNumResults);
    MT_CHECK(u != NULL, "gvqGetErrorString(gvqNumResults) is NULL");
}

/* NULL comm, on every call that takes one. */
static void null_comm(void) {
    float a[4] = {0}, b[16] = {0};
    int x = -7;
    gvqResult_t ae = gvqRemoteError;
    REFUSED(gvqAllReduce(a, b, 4, gvqFloat32, gvqSum, NULL, NULL), gvqInvalidArgument, "NULL");
    REFUSED(gvqBroadcast(a, b, 4, gvqFloat32, 0, NULL, NULL), gvqInvalidArgument, "NULL");
    REFUSED(gvqBcast(b, 4, gvqFloat32, 0, NULL, NULL), gvqInvalidArgument, "NULL");
    REFUSED(gvqReduce(a, b, 4, gvqFloat32, gvqSum, 0, NULL, NULL), gvqInvalidArgument, "NULL");
    REFUSED(gvqReduceScatter(b, a, 1, gvqFloat32, gvqSum, NULL, NULL), gvqInvalidArgument, "NULL");
    REFUSED(gvqAllGather(a, b, 1, gvqFloat32, NULL, NULL), gvqInvalidArgument, "NULL");
    REFUSED(gvqSend(a, 4, gvqFloat32, 0, NULL, NULL), gvqInvalidArgument, "NULL");
    REFUSED(gvqRecv(b, 4, gvqFloat32, 0, NULL, NULL), gvqInvalidArgument, "NULL");
    REFUSED(gvqCommCount(NULL, &x), gvqInvalidArgument, "comm");
    REFUSED(gvqCommUserRank(NULL, &x), gvqInvalidArgument, "comm");
    REFUSED(gvqCommGetAsyncError(NULL, &ae), gvqInvalidArgument, "comm");
    REFUSED(gvqCommDestroy(NULL), gvqInvalidArgument, "NULL");
    REFUSED(gvqCommAbort(NULL), gvqInvalidArgument, "NULL");
    MT_CHECK(x == -7, "gvqCommCount/UserRank(NULL comm) wrote %d to the output", x);
    MT_CHECK(ae == gvqRemoteError, "gvqCommGetAsyncError(NULL comm) wrote its output");
    REFUSED(gvqGetVersion(NULL), gvqInvalidArgument, "version");
    REFUSED(gvqGetUniqueId(NULL), gvqInvalidArgument, "uniqueId");
}

/* Bad arguments on a live comm. n = nranks, r = rank. */
static void bad_args(gvqComm_t comm, int n, int r) {
    enum { C = 8 };
    size_t cap = (size_t)C * (size_t)n + 8;
    float *a = calloc(cap, sizeof(float)), *b = calloc(cap, sizeof(float));
    int x = -7;
    gvqResult_t ae = gvqRemoteError;

    /* NULL outputs of the queries */
    REFUSED(gvqCommCount(comm, NULL), gvqInvalidArgument, "count");
    REFUSED(gvqCommUserRank(comm, NULL), gvqInvalidArgument, "rank");
    REFUSED(gvqCommGetAsyncError(comm, NULL), gvqInvalidArgument, "asyncError");

    /* NULL buffers with count > 0 (every rank reads sendbuff and writes recvbuff here) */
    REFUSED(gvqAllReduce(NULL, b, C, gvqFloat32, gvqSum, comm, NULL), gvqInvalidArgument,
            "sendbuff");
    REFUSED(gvqAllReduce(a, NULL, C, gvqFloat32, gvqSum, comm, NULL), gvqInvalidArgument,
            "recvbuff");
    REFUSED(gvqAllReduce(NULL, NULL, C, gvqFloat32, gvqSum, comm, NULL), gvqInvalidArgument,
            "NULL");
    REFUSED(gvqBroadcast(a, NULL, C, gvqFloat32, 0, comm, NULL), gvqInvalidArgument, "recvbuff");
    REFUSED(gvqBcast(NULL, C, gvqFloat32, 0, comm, NULL), gvqInvalidArgument, "NULL");
    REFUSED(gvqReduce(NULL, b, C, gvqFloat32, gvqSum, 0, comm, NULL), gvqInvalidArgument,
            "sendbuff");
    REFUSED(gvqReduceScatter(NULL, b, C, gvqFloat32, gvqSum, comm, NULL), gvqInvalidArgument,
            "sendbuff");
    REFUSED(gvqReduceScatter(a, NULL, C, gvqFloat32, gvqSum, comm, NULL), gvqInvalidArgument,
            "recvbuff");
    REFUSED(gvqAllGather(NULL, b, C, gvqFloat32, comm, NULL), gvqInvalidArgument, "sendbuff");
    REFUSED(gvqAllGather(a, NULL, C, gvqFloat32, comm, NULL), gvqInvalidArgument, "recvbuff");
    REFUSED(gvqSend(NULL, C, gvqFloat32, 0, comm, NULL), gvqInvalidArgument, "sendbuff");
    REFUSED(gvqRecv(NULL, C, gvqFloat32, 0, comm, NULL), gvqInvalidArgument, "recvbuff");

    /* NULL buffers with count 0 are accepted (collective: every rank makes these calls) */
    MT_OK(gvqAllReduce(NULL, NULL, 0, gvqFloat32, gvqSum, comm, NULL));
    MT_OK(gvqBroadcast(NULL, NULL, 0, gvqInt8, n - 1, comm, NULL));
    MT_OK(gvqBcast(NULL, 0, gvqInt8, 0, comm, NULL));
    MT_OK(gvqReduce(NULL, NULL, 0, gvqFloat64, gvqMax, 0, comm, NULL));
    MT_OK(gvqReduceScatter(NULL, NULL, 0, gvqInt32, gvqSum, comm, NULL));
    MT_OK(gvqAllGather(NULL, NULL, 0, gvqUint8, comm, NULL));
    MT_OK(gvqGroupStart());
    MT_OK(gvqSend(NULL, 0, gvqFloat32, (r + 1) % n, comm, NULL));
    MT_OK(gvqRecv(NULL, 0, gvqFloat32, (r + n - 1) % n, comm, NULL));
    MT_OK(gvqGroupEnd());

    /* invalid datatype and op */
    REFUSED(gvqAllReduce(a, b, C, BAD_TYPE, gvqSum, comm, NULL), gvqInvalidArgument, "datatype");
    REFUSED(gvqAllReduce(a, b, C, (gvqDataType_t)-1, gvqSum, comm, NULL), gvqInvalidArgument,
            "datatype");
    REFUSED(gvqAllReduce(a, b, C, gvqNumTypes, gvqSum, comm, NULL), gvqInvalidArgument, "datatype");
    REFUSED(gvqAllReduce(a, b, C, gvqFloat32, BAD_OP, comm, NULL), gvqInvalidArgument, "op");
    REFUSED(gvqAllReduce(a, b, C, gvqFloat32, (gvqRedOp_t)-1, comm, NULL), gvqInvalidArgument,
            "op");
    REFUSED(gvqAllReduce(a, b, C, gvqFloat32, gvqNumOps, comm, NULL), gvqInvalidArgument, "op");
    REFUSED(gvqBroadcast(a, b, C, BAD_TYPE, 0, comm, NULL), gvqInvalidArgument, "datatype");
    REFUSED(gvqReduce(a, b, C, BAD_TYPE, gvqSum, 0, comm, NULL), gvqInvalidArgument, "datatype");
    REFUSED(gvqReduce(a, b, C, gvqInt32, BAD_OP, 0, comm, NULL), gvqInvalidArgument, "op");
    REFUSED(gvqReduceScatter(b, a, 1, BAD_TYPE, gvqSum, comm, NULL), gvqInvalidArgument,
            "datatype");
    REFUSED(gvqReduceScatter(b, a, 1, gvqInt8, BAD_OP, comm, NULL), gvqInvalidArgument, "op");
    REFUSED(gvqAllGather(a, b, 1, BAD_TYPE, comm, NULL), gvqInvalidArgument, "datatype");
    REFUSED(gvqSend(a, C, BAD_TYPE, 0, comm, NULL), gvqInvalidArgument, "datatype");
    REFUSED(gvqRecv(b, C, BAD_TYPE, 0, comm, NULL), gvqInvalidArgument, "datatype");

    /* root and peer out of range */
    REFUSED(gvqBroadcast(a, b, C, gvqFloat32, n, comm, NULL), gvqInvalidArgument, "root");
    REFUSED(gvqBroadcast(a, b, C, gvqFloat32, -1, comm, NULL), gvqInvalidArgument, "root");
    REFUSED(gvqBcast(b, C, gvqFloat32, n + 5, comm, NULL), gvqInvalidArgument, "root");
    REFUSED(gvqReduce(a, b, C, gvqFloat32, gvqSum, n, comm, NULL), gvqInvalidArgument, "root");
    REFUSED(gvqReduce(a, b, C, gvqFloat32, gvqSum, -1, comm, NULL), gvqInvalidArgument, "root");
    REFUSED(gvqSend(a, C, gvqFloat32, n, comm, NULL), gvqInvalidArgument, "peer");
    REFUSED(gvqSend(a, C, gvqFloat32, -1, comm, NULL), gvqInvalidArgument, "peer");
    REFUSED(gvqRecv(b, C, gvqFloat32, n, comm, NULL), gvqInvalidArgument, "peer");
    REFUSED(gvqRecv(b, C, gvqFloat32, -3, comm, NULL), gvqInvalidArgument, "peer");

    /* overlapping buffers that are not NCCL's in-place layout */
    REFUSED(gvqAllReduce(a, a + 1, C, gvqFloat32, gvqSum, comm, NULL), gvqInvalidArgument,
            "overlap");
    REFUSED(gvqAllReduce(a + 1, a, C, gvqFloat32, gvqSum, comm, NULL), gvqInvalidArgument,
            "overlap");
    /* reduce-scatter: in place is recvbuff == sendbuff + rank*recvcount */
    REFUSED(gvqReduceScatter(a, a + (size_t)r * C + 1, C, gvqFloat32, gvqSum, comm, NULL),
            gvqInvalidArgument, "overlap");
    /* allgather: in place is sendbuff == recvbuff + rank*sendcount */
    REFUSED(gvqAllGather(a + (size_t)r * C + 1, a, C, gvqFloat32, comm, NULL), gvqInvalidArgument,
            "overlap");
    if (n == 1) { /* broadcast and reduce read/write both buffers on the root only */
        REFUSED(gvqBroadcast(a, a + 2, C, gvqFloat32, 0, comm, NULL), gvqInvalidArgument,
                "overlap");
        REFUSED(gvqReduce(a + 3, a, C, gvqFloat32, gvqSum, 0, comm, NULL), gvqInvalidArgument,
                "overlap");
    }

    /* a count whose byte size overflows */
    REFUSED(gvqAllReduce(a, b, SIZE_MAX / 2, gvqFloat32, gvqSum, comm, NULL), gvqInvalidArgument,
            "count");
    REFUSED(gvqAllGather(a, b, SIZE_MAX / 2, gvqFloat32, comm, NULL), gvqInvalidArgument, "count");

    /* a group end without a group start */
    REFUSED(gvqGroupEnd(), gvqInvalidUsage, "group");

    /* a group whose call was refused returns that error at gvqGroupEnd */
    MT_OK(gvqGroupStart());
    REFUSED(gvqAllReduce(a, b, C, BAD_TYPE, gvqSum, comm, NULL), gvqInvalidArgument, "datatype");
    REFUSED(gvqGroupEnd(), gvqInvalidArgument, "group");
    REFUSED(gvqGroupEnd(), gvqInvalidUsage, "group"); /* and the group is closed */

    /* no output written by the failed queries */
    MT_CHECK(x == -7 && ae == gvqRemoteError, "a refused query wrote its output");
    free(a);
    free(b);
}

/* gvqCommInitRank / gvqCommInitRankConfig / gvqCommInitMPI argument checks (all local). */
static void bad_init(gvqUniqueId good, int n, int r) {
    gvqComm_t sentinel = (gvqComm_t)(uintptr_t)0x1234, c = sentinel;
    gvqUniqueId zero;
    memset(&zero, 0, sizeof zero);
    REFUSED(gvqCommInitRank(NULL, n, good, r), gvqInvalidArgument, "comm");
    REFUSED(gvqCommInitRank(&c, 0, good, 0), gvqInvalidArgument, "nranks");
    REFUSED(gvqCommInitRank(&c, -3, good, 0), gvqInvalidArgument, "nranks");
    REFUSED(gvqCommInitRank(&c, n, good, n), gvqInvalidArgument, "rank");
    REFUSED(gvqCommInitRank(&c, n, good, -1), gvqInvalidArgument, "rank");
    REFUSED(gvqCommInitRank(&c, n, zero, r), gvqInvalidArgument, "commId");
    gvqUniqueId junk;
    memset(&junk, 0x5a, sizeof junk);
    REFUSED(gvqCommInitRank(&c, n, junk, r), gvqInvalidArgument, "commId");

    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.magic = 0xdeadbeefu;
    REFUSED(gvqCommInitRankConfig(&c, n, good, r, &cfg), gvqInvalidArgument, "magic");
    REFUSED(gvqCommInitMPI(&c, MPI_COMM_WORLD, &cfg), gvqInvalidArgument, "magic");
    gvqConfig_t cfg2 = GVQ_CONFIG_INITIALIZER;
    cfg2.size = 4;
    REFUSED(gvqCommInitRankConfig(&c, n, good, r, &cfg2), gvqInvalidArgument, "size");
    gvqConfig_t cfg3 = GVQ_CONFIG_INITIALIZER;
    cfg3.version = GVQ_VERSION + 100;
    REFUSED(gvqCommInitRankConfig(&c, n, good, r, &cfg3), gvqInvalidArgument, "version");
    gvqConfig_t cfg4 = GVQ_CONFIG_INITIALIZER;
    cfg4.timeoutMs = -5;
    REFUSED(gvqCommInitRankConfig(&c, n, good, r, &cfg4), gvqInvalidArgument, "timeoutMs");
    gvqConfig_t cfg5 = GVQ_CONFIG_INITIALIZER;
    cfg5.chunkBytes = 3;
    REFUSED(gvqCommInitMPI(&c, MPI_COMM_WORLD, &cfg5), gvqInvalidArgument, "chunkBytes");
    gvqConfig_t cfg6 = GVQ_CONFIG_INITIALIZER;
    cfg6.blocking = 0;
    REFUSED(gvqCommInitMPI(&c, MPI_COMM_WORLD, &cfg6), gvqInvalidArgument, "blocking");
    REFUSED(gvqCommInitMPI(NULL, MPI_COMM_WORLD, NULL), gvqInvalidArgument, "comm");
    REFUSED(gvqCommInitMPI(&c, MPI_COMM_NULL, NULL), gvqInvalidArgument, "MPI_COMM_NULL");
    MT_CHECK(c == sentinel, "a refused gvqCommInit* wrote *comm (%p)", (void *)c);
}

/* Destroyed communicators: every call refuses them, destroy twice too. Collective (makes a
 * communicator with gvqCommInitMPI). */
static void destroyed_comm(void) {
    gvqComm_t d = NULL;
    MT_OK(gvqCommInitMPI(&d, MPI_COMM_WORLD, NULL));
    if (d == NULL) return;
    MT_OK(gvqCommDestroy(d));
    float a[4] = {1, 2, 3, 4}, b[4] = {0};
    int x = -7;
    REFUSED(gvqAllReduce(a, b, 4, gvqFloat32, gvqSum, d, NULL), gvqInvalidArgument, "comm");
    REFUSED(gvqBroadcast(a, b, 4, gvqFloat32, 0, d, NULL), gvqInvalidArgument, "comm");
    REFUSED(gvqSend(a, 4, gvqFloat32, 0, d, NULL), gvqInvalidArgument, "comm");
    REFUSED(gvqCommCount(d, &x), gvqInvalidArgument, "comm");
    REFUSED(gvqCommDestroy(d), gvqInvalidArgument, "comm");
    REFUSED(gvqCommAbort(d), gvqInvalidArgument, "comm");
    MT_CHECK(x == -7, "gvqCommCount on a destroyed comm wrote %d", x);

    gvqComm_t e = NULL; /* abort frees the communicator like destroy */
    MT_OK(gvqCommInitMPI(&e, MPI_COMM_WORLD, NULL));
    if (e == NULL) return;
    MT_OK(gvqCommAbort(e));
    /* calls on an aborted communicator are misuse (README), destroying it again a bad handle */
    REFUSED(gvqAllReduce(a, b, 4, gvqFloat32, gvqSum, e, NULL), gvqInvalidUsage, "aborted");
    REFUSED(gvqCommDestroy(e), gvqInvalidArgument, "comm");
}

/* MPI ranks 0 and 1 bootstrap a 2-rank communicator wrongly: both claim rank 0, or they
 * disagree on nranks. Both must get gvqInvalidUsage (no hang, no communicator). */
static void bad_bootstrap(int r) {
    for (int variant = 0; variant < 2; variant++) {
        gvqUniqueId id;
        memset(&id, 0, sizeof id);
        if (r == 0) MT_OK(gvqGetUniqueId(&id));
        MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
        if (r > 1) continue;
        gvqComm_t sentinel = (gvqComm_t)(uintptr_t)0x1234, c = sentinel;
        if (variant == 0) /* both claim rank 0 */
            REFUSED(gvqCommInitRank(&c, 2, id, 0), gvqInvalidUsage, "claimed");
        else /* rank 1 thinks there are 3 ranks */
            REFUSED(gvqCommInitRank(&c, r == 0 ? 2 : 3, id, r), gvqInvalidUsage, "nranks");
        MT_CHECK(c == sentinel, "a failed bootstrap wrote *comm");
    }
}

/* A receive whose message has another size fails with gvqRemoteError: a longer buffer than
 * the message, and a shorter one. Each case on a fresh communicator (the error breaks it). */
static void p2p_size_mismatch(int r) {
    for (int variant = 0; variant < 2; variant++) {
        gvqComm_t c = NULL;
        MT_OK(gvqCommInitMPI(&c, MPI_COMM_WORLD, NULL));
        if (c == NULL) continue;
        int32_t buf[20];
        for (int i = 0; i < 20; i++)
            buf[i] = i;
        size_t sent = variant == 0 ? 10 : 20, posted = variant == 0 ? 20 : 10;
        if (r == 0) {
            MT_OK(gvqSend(buf, sent, gvqInt32, 1, c, NULL));
        } else if (r == 1) {
            const char *word = variant == 0 ? "bytes" : "peer 0";
            mark_last_error(word);
            gvqResult_t res = gvqRecv(buf, posted, gvqInt32, 0, c, NULL);
            char call[96];
            snprintf(call, sizeof call, "gvqRecv of %zu int32 from a gvqSend of %zu", posted, sent);
            refused_at(__LINE__, call, res, gvqRemoteError, word);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        MT_OK(gvqCommDestroy(c));
    }
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    int n = mt.nranks, r = mt.rank;

    error_strings();
    null_comm();

    gvqUniqueId id;
    memset(&id, 0, sizeof id);
    if (r == 0) MT_OK(gvqGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    gvqComm_t comm = NULL;
    MT_OK(gvqCommInitRank(&comm, n, id, r));
    int ok = comm != NULL, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (!all) return mt_finish("test_errors");

    allreduce_works(comm, "before the refusals");
    bad_args(comm, n, r);

    /* ids are single-use in spirit; a fresh valid one lets the config checks be reached */
    gvqUniqueId id2;
    memset(&id2, 0, sizeof id2);
    if (r == 0) MT_OK(gvqGetUniqueId(&id2));
    MPI_Bcast(&id2, (int)sizeof id2, MPI_BYTE, 0, MPI_COMM_WORLD);
    bad_init(id2, n, r);

    destroyed_comm();
    if (n >= 2) {
        bad_bootstrap(r);
        p2p_size_mismatch(r);
    }

    /* the refusals broke nothing */
    gvqResult_t async = gvqInternalError;
    MT_OK(gvqCommGetAsyncError(comm, &async));
    MT_CHECK(async == gvqSuccess,
             "gvqCommGetAsyncError after the refusals: expected "
             "gvqSuccess, got %d (%s)",
             (int)async, gvqGetErrorString(async));
    allreduce_works(comm, "after the refusals");
    MT_OK(gvqCommDestroy(comm));
    return mt_finish("test_errors");
}
