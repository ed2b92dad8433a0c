/*
 * test_shrink_dead.c -- processes that die, and the survivors that go on (gvqCommShrink with
 * GVQ_SHRINK_ABORT), in a job started without mpirun (scripts/gvq-launch.sh; UCX transport):
 * Open MPI would end an mpirun job whose process dies, so this is the UCX path's test.
 *
 * Every rank runs 4-bit QSGD allreduces; after a few, the last rank (and, with 4 ranks or more,
 * rank 1) leaves with _exit in the middle of the loop, as a crash would: no destroy, no goodbye.
 * The survivors' compressed call fails; they shrink, and each checks on the new communicator,
 * against values computed here: its size and rank, the members' parent ranks (allgather), an
 * exact plain sum, and a compressed allreduce identical on every member. With 2 ranks the one
 * survivor is not a majority: ABORT alone refuses (gvqRemoteError) and NO_QUORUM goes on.
 *
 * Argument "revoke" (run by two_hosts.sh, ranks on two hosts, so no shared memory spans the job
 * and no pid is checked): only the last rank dies, under a 30 s timeout, and every survivor's
 * failed call and shrink must end within 10 s: a survivor waiting on a live rank that waits on
 * the dead one learns of the death from that rank's revoke notice, not from its own timeout.
 *
 * Arguments "cut R" (run by cut_link.sh on the emulated cluster: one rank per host, gvq over UCX's
 * TCP): plain allreduces under a 2 s timeout until host R's link goes down at the bridge (for
 * 15 s); rank R is alive but cut off. Every rank's call fails; the others shrink and must be done
 * within twice the timeout and 3 s (the shrink's first round waits twice the timeout for late
 * ranks), then check the new communicator as above; rank R's own shrink must fail (no majority)
 * and it leaves with status 0. Before UCX's TCP connects were made non-blocking, a survivor's
 * endpoint to rank R's spare worker blocked in connect() until the link came back (SYN resent at
 * 1, 3, 7, 15 s): the shrink took 15 s or more, and in a chaos run a late survivor found the
 * others gone.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "launch_test.h"

#define COUNT ((size_t)1 << 18)

static int revoke_mode, cut_rank = -1;

/* the ranks that leave: die, or (cut mode) are cut off */
static int dies(int r, int n) {
    if (cut_rank >= 0) return r == cut_rank;
    return r == n - 1 || (!revoke_mode && n >= 4 && r == 1);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    revoke_mode = argc > 1 && strcmp(argv[1], "revoke") == 0;
    if (argc > 2 && strcmp(argv[1], "cut") == 0) cut_rank = atoi(argv[2]);
    if (getenv("GVQ_TEST_SKIP") != NULL) {
        printf("test_shrink_dead: skipped (gvq built without UCX: no transport outside an MPI "
               "job)\n");
        return 77;
    }
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = revoke_mode ? 30000 : 2000;
    double limit_s = 2.0 * (double)cfg.timeoutMs / 1000.0 + 3.0; /* cut mode: the shrink's bound */
    gvqComm_t comm;
    GVQ(gvqCommInitFromEnv(&comm, &cfg));
    int n = 0;
    GVQ(gvqCommUserRank(comm, &rank));
    GVQ(gvqCommCount(comm, &n));
    gvqCompressorConfig_t ccfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    ccfg.codec = gvqCodecQsgd;
    ccfg.qsgdBits = 4;
    gvqCompressor_t cp;
    GVQ(gvqCompressorCreate(comm, COUNT, &ccfg, &cp));
    float *x = malloc(COUNT * sizeof *x), *y = malloc(COUNT * sizeof *y);
    for (size_t i = 0; i < COUNT; i++)
        x[i] = val(rank, i) / 30.0f;
    gvqResult_t res = gvqSuccess;
    int calls = 0;
    double t_call = 0, t_start = now_s();
    /* cut mode: plain calls (the link carries them) until the cut fails one, 90 s at most */
    for (; res == gvqSuccess && (cut_rank >= 0 ? now_s() - t_start < 90.0 : calls < 1000);
         calls++) {
        if (cut_rank >= 0) {
            t_call = now_s();
            res = gvqAllReduce(x, y, COUNT, gvqFloat32, gvqSum, comm, NULL);
            continue;
        }
        if (calls == 5 && dies(rank, n)) {
            printf("test_shrink_dead: rank %d of %d leaves now (_exit)\n", rank, n);
            fflush(stdout);
            _exit(0);
        }
        t_call = now_s();
        res = gvqAllReduceCompressed(x, y, COUNT, gvqFloat32, gvqSum, cp, comm, NULL);
        if (res != gvqSuccess && dies(rank, n)) { /* another's death failed it first: this */
            printf("test_shrink_dead: rank %d of %d leaves now (_exit, its call failed)\n", rank,
                   n); /* rank still leaves, so the survivors are the ones expected */
            fflush(stdout);
            _exit(0);
        }
    }
    double t_failed = now_s() - t_call;
    CHECK(res != gvqSuccess && calls >= 5, "the compressed calls went on after a death (%d, %s)",
          calls, gvqGetErrorString(res));
    gvqComm_t nc = NULL;
    double t0 = now_s();
    if (cut_rank >= 0 && rank == cut_rank) { /* cut off: its own shrink finds no majority */
        gvqResult_t r1 = gvqCommShrink(comm, NULL, 0, &nc, NULL, GVQ_SHRINK_ABORT);
        CHECK(r1 != gvqSuccess && nc == NULL, "the cut-off rank's shrink: %s, want an error",
              gvqGetErrorString(r1));
        printf("test_shrink_dead: rank %d (cut off): %d calls, then %s; its shrink: %s after "
               "%.2f s; %s (%d failure(s))\n",
               rank, calls, gvqGetErrorString(res), gvqGetErrorString(r1), now_s() - t0,
               failures ? "FAIL" : "PASS", failures);
        if (nc != NULL) (void)gvqCommDestroy(nc);
        (void)gvqCompressorDestroy(cp);
        (void)gvqCommAbort(comm);
        return failures ? 1 : 0;
    }
    if (n == 2) {
        gvqResult_t r1 = gvqCommShrink(comm, NULL, 0, &nc, NULL, GVQ_SHRINK_ABORT);
        CHECK(r1 == gvqRemoteError && nc == NULL, "1 of 2 without NO_QUORUM: %s",
              gvqGetErrorString(r1));
        GVQ(gvqCommShrink(comm, NULL, 0, &nc, NULL, GVQ_SHRINK_ABORT | GVQ_SHRINK_NO_QUORUM));
    } else {
        GVQ(gvqCommShrink(comm, NULL, 0, &nc, NULL, GVQ_SHRINK_ABORT));
    }
    double took = now_s() - t0;
    if (revoke_mode)
        CHECK(t_failed + took < 10.0,
              "the failed call took %.2f s and the shrink %.2f s under a "
              "30 s timeout: the revoke did not reach this rank",
              t_failed, took);
    if (cut_rank >= 0)
        CHECK(took < limit_s,
              "the shrink after a cut link took %.2f s, more than %.1f s (twice the timeout "
              "and 3 s): something blocked before or between its rounds",
              took, limit_s);
    int members[64], m = 0, want = -1, cn = -1, cr = -1;
    for (int p = 0; p < n && p < 64; p++)
        if (!dies(p, n)) {
            if (p == rank) want = m;
            members[m++] = p;
        }
    GVQ(gvqCommCount(nc, &cn));
    GVQ(gvqCommUserRank(nc, &cr));
    CHECK(cn == m && cr == want, "rank %d of %d on the shrunk communicator, want %d of %d", cr, cn,
          want, m);
    int32_t mine = rank, all[64];
    GVQ(gvqAllGather(&mine, all, 1, gvqInt32, nc, NULL));
    for (int k = 0; k < m; k++)
        CHECK(all[k] == members[k], "member %d is rank %d, want %d", k, all[k], members[k]);
    for (size_t i = 0; i < COUNT; i++)
        x[i] = val(rank, i);
    GVQ(gvqAllReduce(x, y, COUNT, gvqFloat32, gvqSum, nc, NULL));
    size_t bad = 0;
    for (size_t i = 0; i < COUNT; i++) {
        float s = 0;
        for (int k = 0; k < m; k++)
            s += val(members[k], i);
        bad += y[i] != s;
    }
    CHECK(bad == 0, "plain sum on the shrunk communicator: %zu of %zu wrong", bad, COUNT);
    /* a compressor of the new communicator (the old one's stays with the old) */
    gvqCompressor_t cp2;
    GVQ(gvqCompressorCreate(nc, COUNT, &ccfg, &cp2));
    GVQ(gvqAllReduceCompressed(x, y, COUNT, gvqFloat32, gvqSum, cp2, nc, NULL));
    uint64_t h = 1469598103934665603ull, hs[64];
    for (size_t i = 0; i < COUNT * sizeof *y; i++)
        h = (h ^ ((const unsigned char *)y)[i]) * 1099511628211ull;
    GVQ(gvqAllGather(&h, hs, 1, gvqUint64, nc, NULL));
    for (int k = 0; k < m; k++)
        CHECK(hs[k] == h, "the compressed result differs on member %d", k);
    GVQ(gvqCompressorDestroy(cp2));
    GVQ(gvqCommDestroy(nc));
    (void)gvqCompressorDestroy(cp);
    (void)gvqCommDestroy(comm);
    printf("test_shrink_dead: rank %d: %d calls, then %s after %.2f s; shrunk %d -> %d in %.2f s; "
           "%s (%d failure(s))\n",
           rank, calls, gvqGetErrorString(res), t_failed, n, m, took, failures ? "FAIL" : "PASS",
           failures);
    free(x);
    free(y);
    return failures ? 1 : 0;
}
