/*
 * test_handles.c -- handles after their owner is gone, and calls the ranks disagree on
 * (issue 13, classes 2 and 7), over in-process communicators:
 *
 *   - a compressor or parameter server whose communicator was destroyed or aborted is refused
 *     (gvqInvalidArgument, a WARN) by every call but its destroy, which still frees it; under
 *     ASan (GVQ_SANITIZE=address) this also proves no call reads the freed communicator;
 *   - a destroyed compressor is refused;
 *   - a count near SIZE_MAX is refused at once;
 *   - calls on an aborted communicator return gvqInvalidUsage (the README's promise);
 *   - ranks out of step (one rank's call number ahead) fail on both ranks, and the communicator
 *     is broken afterwards.
 */
#include <stdint.h>
#include <string.h>

#include "gvq_test.h"

static int last_mentions(const char *word) {
    const char *t = gvqGetLastError(NULL);
    return t != NULL && strstr(t, word) != NULL;
}

static gvqComm_t one_rank(void) {
    gvqComm_t c = NULL;
    EXPECT_RES(gvq_comm_init_inproc(1, NULL, &c), gvqSuccess);
    return c;
}

static void test_compressor_destroyed(void) {
    gvqComm_t comm = one_rank();
    gvqCompressor_t c = NULL;
    EXPECT_RES(gvqCompressorCreate(comm, 1024, NULL, &c), gvqSuccess);
    EXPECT_RES(gvqCompressorDestroy(c), gvqSuccess);
    gvqCompressorStats_t st;
    size_t size = 0;
    float x[1024] = {0};
    EXPECT_RES(gvqCompressorGetStats(c, &st), gvqInvalidArgument);
    EXPECT_RES(gvqCompressorSave(c, NULL, &size), gvqInvalidArgument);
    EXPECT_RES(gvqAllReduceCompressed(x, x, 1024, gvqFloat32, gvqSum, c, comm, NULL),
               gvqInvalidArgument);
    EXPECT(last_mentions("compressor"), "no WARN naming the compressor: %s", gvqGetLastError(NULL));
    EXPECT_RES(gvqCompressorDestroy(c), gvqInvalidArgument);
    EXPECT_RES(gvqCommDestroy(comm), gvqSuccess);
}

static void test_compressor_orphaned(int abort) {
    gvqComm_t comm = one_rank();
    gvqCompressor_t c = NULL;
    EXPECT_RES(gvqCompressorCreate(comm, 1024, NULL, &c), gvqSuccess);
    EXPECT_RES(abort ? gvqCommAbort(comm) : gvqCommDestroy(comm), gvqSuccess);
    gvqCompressorStats_t st;
    size_t size = 0;
    EXPECT_RES(gvqCompressorGetStats(c, &st), gvqInvalidArgument);
    EXPECT(last_mentions("compressor"), "no WARN: %s", gvqGetLastError(NULL));
    EXPECT_RES(gvqCompressorSave(c, NULL, &size), gvqInvalidArgument);
    /* a new communicator may take the old one's address: the compressor stays orphaned */
    gvqComm_t again = one_rank();
    float x[1024] = {0};
    EXPECT_RES(gvqAllReduceCompressed(x, x, 1024, gvqFloat32, gvqSum, c, again, NULL),
               gvqInvalidArgument);
    EXPECT_RES(gvqCompressorDestroy(c), gvqSuccess);
    EXPECT_RES(gvqCommDestroy(again), gvqSuccess);
}

static void test_ps_orphaned(int abort) {
    gvqComm_t comm = one_rank();
    gvqPs_t ps = NULL;
    EXPECT_RES(gvqPsCreate(comm, 16, 4, gvqFloat32, NULL, &ps), gvqSuccess);
    EXPECT_RES(abort ? gvqCommAbort(comm) : gvqCommDestroy(comm), gvqSuccess);
    gvqPsStats_t st;
    int64_t idx[1] = {3};
    float v[4] = {0};
    EXPECT_RES(gvqPsGetStats(ps, &st), gvqInvalidArgument);
    EXPECT(last_mentions("parameter server"), "no WARN: %s", gvqGetLastError(NULL));
    EXPECT_RES(gvqPsPush(ps, idx, v, 1), gvqInvalidArgument);
    EXPECT_RES(gvqPsPull(ps, idx, v, 1), gvqInvalidArgument);
    EXPECT_RES(gvqPsApply(ps), gvqInvalidArgument);
    EXPECT_RES(gvqPsDestroy(ps), gvqSuccess);
    EXPECT_RES(gvqPsDestroy(ps), gvqInvalidArgument);
}

static void test_huge_count(void) {
    gvqComm_t comm = one_rank();
    float x[4] = {0};
    size_t counts[] = {SIZE_MAX / 4, SIZE_MAX / 8, SIZE_MAX / 4 - 1};
    for (int i = 0; i < 3; i++) {
        EXPECT_RES(gvqAllReduce(x, x, counts[i], gvqFloat32, gvqSum, comm, NULL),
                   gvqInvalidArgument);
        EXPECT_RES(gvqBroadcast(x, x, counts[i], gvqFloat32, 0, comm, NULL), gvqInvalidArgument);
        EXPECT_RES(gvqReduce(x, x, counts[i], gvqFloat32, gvqSum, 0, comm, NULL),
                   gvqInvalidArgument);
    }
    EXPECT(last_mentions("count"), "no WARN naming the count: %s", gvqGetLastError(NULL));
    EXPECT_RES(gvqCommDestroy(comm), gvqSuccess);
}

/* issue 39: a push or pull whose n would need more memory than exists is refused before any
 * index is read (it read past a 4-element array: ASan, stack-buffer-overflow) */
static void test_ps_huge_count(void) {
    gvqComm_t comm = one_rank();
    gvqPs_t ps = NULL;
    EXPECT_RES(gvqPsCreate(comm, 16, 4, gvqFloat32, NULL, &ps), gvqSuccess);
    int64_t idx[4] = {0, 1, 2, 3};
    float v[16] = {0};
    size_t ns[] = {SIZE_MAX / 16, SIZE_MAX / 8, SIZE_MAX / 2 + 1, SIZE_MAX};
    for (int i = 0; i < 4; i++) {
        EXPECT_RES(gvqPsPush(ps, idx, v, ns[i]), gvqInvalidArgument);
        EXPECT(last_mentions("overflows"), "push n=%zu: no WARN naming the overflow: %s", ns[i],
               gvqGetLastError(NULL));
        EXPECT_RES(gvqPsPull(ps, idx, v, ns[i]), gvqInvalidArgument);
        EXPECT(last_mentions("overflows"), "pull n=%zu: no WARN naming the overflow: %s", ns[i],
               gvqGetLastError(NULL));
    }
    EXPECT_RES(gvqPsPush(ps, idx, v, 4), gvqSuccess); /* and the server still works */
    EXPECT_RES(gvqPsPull(ps, idx, v, 4), gvqSuccess);
    EXPECT_RES(gvqPsDestroy(ps), gvqSuccess);
    EXPECT_RES(gvqCommDestroy(comm), gvqSuccess);
}

static void test_after_abort(void) {
    gvqComm_t comms[2];
    EXPECT_RES(gvq_comm_init_inproc(2, NULL, comms), gvqSuccess);
    EXPECT_RES(gvqCommAbort(comms[0]), gvqSuccess);
    float x[4] = {0};
    int n = 0;
    gvqResult_t async = gvqSuccess;
    EXPECT_RES(gvqAllReduce(x, x, 4, gvqFloat32, gvqSum, comms[0], NULL), gvqInvalidUsage);
    EXPECT(last_mentions("aborted"), "no WARN saying aborted: %s", gvqGetLastError(NULL));
    EXPECT_RES(gvqBroadcast(x, x, 4, gvqFloat32, 0, comms[0], NULL), gvqInvalidUsage);
    EXPECT_RES(gvqSend(x, 4, gvqFloat32, 1, comms[0], NULL), gvqInvalidUsage);
    EXPECT_RES(gvqCommCount(comms[0], &n), gvqInvalidUsage);
    EXPECT_RES(gvqCommGetAsyncError(comms[0], &async), gvqInvalidUsage);
    gvqCompressor_t c = NULL;
    EXPECT_RES(gvqCompressorCreate(comms[0], 64, NULL, &c), gvqInvalidUsage);
    EXPECT_RES(gvqCommDestroy(comms[0]), gvqInvalidArgument); /* gone: gvq.h */
    EXPECT_RES(gvqCommDestroy(comms[1]), gvqSuccess);
}

/* Rank 1's call number is one ahead, as if it had skipped a call. */
static void out_of_step_rank(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)nranks, (void)arg;
    float x[16];
    for (int i = 0; i < 16; i++)
        x[i] = 1.0f;
    if (rank == 1) comm->calls++;
    EXPECT_RES(gvqAllReduce(x, x, 16, gvqFloat32, gvqSum, comm, NULL), gvqInvalidUsage);
    EXPECT(last_mentions("out of step"), "rank %d: %s", rank, gvqGetLastError(NULL));
    gvqResult_t async = gvqSuccess;
    EXPECT_RES(gvqCommGetAsyncError(comm, &async), gvqSuccess);
    EXPECT(async == gvqInvalidUsage, "rank %d: not broken (%s)", rank, gvqGetErrorString(async));
    EXPECT_RES(gvqAllReduce(x, x, 16, gvqFloat32, gvqSum, comm, NULL), gvqInvalidUsage);
}

/* Different counts on two in-process ranks: refused on both, then a correct call works. */
static void count_mismatch_rank(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)nranks, (void)arg;
    float x[64];
    for (int i = 0; i < 64; i++)
        x[i] = 1.0f;
    EXPECT_RES(gvqAllReduce(x, x, rank == 0 ? 64 : 16, gvqFloat32, gvqSum, comm, NULL),
               gvqInvalidArgument);
    EXPECT(last_mentions("count 64") && last_mentions("count 16"), "rank %d: %s", rank,
           gvqGetLastError(NULL));
    EXPECT_RES(gvqAllReduce(x, x, 64, gvqFloat32, gvqSum, comm, NULL), gvqSuccess);
    EXPECT(x[0] == 2.0f && x[63] == 2.0f, "rank %d: %g %g", rank, x[0], x[63]);
}

int main(void) {
    test_compressor_destroyed();
    test_compressor_orphaned(0);
    test_compressor_orphaned(1);
    test_ps_orphaned(0);
    test_ps_orphaned(1);
    test_huge_count();
    test_ps_huge_count();
    test_after_abort();
    gvq_test_run(2, NULL, out_of_step_rank, NULL);
    gvq_test_run(2, NULL, count_mismatch_rank, NULL);
    return gvq_test_finish("test_handles");
}
