/*
 * test_chan.c -- the shared-memory point-to-point channels (src/transport/shm_chan.c), ranks as
 * threads over one zeroed block: messages of 0 bytes to several times a channel's capacity to
 * every peer at once, arriving in the order sent with the bytes sent; to oneself; a receive of
 * another length fails with gvqRemoteError and the pair stays in step for the next message; a
 * send cancelled halfway breaks its pair and the next transfer on it fails at once. Two hundred
 * small blocking sends complete before their receiver posts anything (the ring holds records of
 * their own size), from one buffer that changes after each, and arrive in order once it does. A
 * closed rank's messages in the ring still arrive; the transfers after them fail at once.
 */
#include <pthread.h>
#include <sched.h>
#include <string.h>

#include "gvq_test.h"
#include "gvq_transport.h"

enum { NR = 3, NSIZES = 4 };
static size_t sizes[NSIZES] = {0, 1000, 0 /* a chunk */, 0 /* over twice a channel's ring */};

static void *mem, *mem2;
static pthread_barrier_t bar;
static int small_sent; /* rank 1 finished its small sends */

static unsigned char byte_of(int from, int to, int k, size_t i) {
    return (unsigned char)(from * 61 + to * 17 + k * 5 + i * 13 + (i >> 9));
}

/* Test every request until all are done (bounded: a hang fails the test). */
static gvqResult_t wait_all(gvq_chan_set_t *s, gvq_req_t *r, int n, gvqResult_t *res) {
    uint64_t start = gvq_now_ns();
    for (int left = n; left > 0;) {
        for (int i = 0; i < n; i++) {
            if (!r[i].active) continue;
            int done = 0;
            gvqResult_t one = gvq_chan_test(s, &r[i], &done);
            if (done) {
                res[i] = one;
                left--;
            }
        }
        if (gvq_now_ns() - start > 20ull * 1000000000ull) return gvqTimeout;
        sched_yield();
    }
    return gvqSuccess;
}

/* Every rank sends every size to every rank (itself too), all posted at once, receives
 * posted before or after the sends depending on the rank. */
static void all_to_all(gvq_chan_set_t *s, int rank) {
    enum { N = NR * NSIZES * 2 };
    gvq_req_t req[N];
    gvqResult_t res[N];
    unsigned char *sbuf[NR][NSIZES], *rbuf[NR][NSIZES];
    int n = 0;
    for (int pass = 0; pass < 2; pass++) { /* odd ranks post their receives first */
        int sends = (pass == 0) == (rank % 2 == 0);
        for (int p = 0; p < NR; p++)
            for (int k = 0; k < NSIZES; k++) {
                if (sends) {
                    sbuf[p][k] = malloc(sizes[k] + 1);
                    for (size_t i = 0; i < sizes[k]; i++)
                        sbuf[p][k][i] = byte_of(rank, p, k, i);
                    EXPECT_RES(gvq_chan_isend(s, p, sbuf[p][k], sizes[k], &req[n++]), gvqSuccess);
                } else {
                    rbuf[p][k] = malloc(sizes[k] + 1);
                    memset(rbuf[p][k], 0xee, sizes[k] + 1);
                    EXPECT_RES(gvq_chan_irecv(s, p, rbuf[p][k], sizes[k], &req[n++]), gvqSuccess);
                }
            }
    }
    EXPECT_RES(wait_all(s, req, n, res), gvqSuccess);
    for (int i = 0; i < n; i++)
        EXPECT(res[i] == gvqSuccess, "rank %d: transfer %d failed: %s", rank, i,
               gvqGetErrorString(res[i]));
    for (int p = 0; p < NR; p++)
        for (int k = 0; k < NSIZES; k++) {
            size_t bad = 0;
            for (size_t i = 0; i < sizes[k]; i++)
                bad += rbuf[p][k][i] != byte_of(p, rank, k, i);
            EXPECT(bad == 0 && rbuf[p][k][sizes[k]] == 0xee,
                   "rank %d: message %d from %d (%zu bytes): %zu wrong bytes", rank, k, p, sizes[k],
                   bad);
            free(sbuf[p][k]);
            free(rbuf[p][k]);
        }
}

/* Rank 0 sends 5000 then 777 bytes to rank 1, which expects 4000 then 777: the first fails, the
 * second arrives whole. */
static void mismatch(gvq_chan_set_t *s, int rank) {
    unsigned char a[5000], b[777];
    gvq_req_t r[2];
    gvqResult_t res[2] = {gvqSuccess, gvqSuccess};
    if (rank == 0) {
        memset(a, 1, sizeof a);
        memset(b, 2, sizeof b);
        EXPECT_RES(gvq_chan_isend(s, 1, a, sizeof a, &r[0]), gvqSuccess);
        EXPECT_RES(gvq_chan_isend(s, 1, b, sizeof b, &r[1]), gvqSuccess);
    } else if (rank == 1) {
        memset(b, 0, sizeof b);
        EXPECT_RES(gvq_chan_irecv(s, 0, a, 4000, &r[0]), gvqSuccess);
        EXPECT_RES(gvq_chan_irecv(s, 0, b, sizeof b, &r[1]), gvqSuccess);
    } else {
        return;
    }
    EXPECT_RES(wait_all(s, r, 2, res), gvqSuccess);
    EXPECT(res[0] == (rank == 1 ? gvqRemoteError : gvqSuccess),
           "rank %d: the mismatched message gave %s", rank, gvqGetErrorString(res[0]));
    EXPECT(res[1] == gvqSuccess, "rank %d: the next message failed", rank);
    for (size_t i = 0; rank == 1 && i < sizeof b; i++)
        if (b[i] != 2) {
            EXPECT(0, "rank 1: the message after the mismatch is wrong at %zu", i);
            break;
        }
}

/* Rank 2 starts a send of 1 MiB to rank 0, which does not receive yet; the send is cancelled
 * halfway, and the next one to rank 0 fails at once. Rank 0's receive of that message, posted
 * after the cancel, fails at once too (it does not wait for the missing chunks). */
static void cancel_halfway(gvq_chan_set_t *s, int rank) {
    size_t big = (size_t)1 << 20;
    char *buf = calloc(big, 1);
    gvq_req_t r;
    gvqResult_t res = gvqSuccess;
    if (rank == 2) {
        int done = 0;
        EXPECT_RES(gvq_chan_isend(s, 0, buf, big, &r), gvqSuccess);
        EXPECT_RES(gvq_chan_test(s, &r, &done), gvqSuccess);
        EXPECT(!done, "a send of 1 MiB with no receive completed");
        gvq_chan_cancel(s, &r);
        EXPECT(!r.active, "a cancelled request is still active");
        EXPECT_RES(gvq_chan_isend(s, 0, buf, 10, &r), gvqSuccess);
        EXPECT_RES(wait_all(s, &r, 1, &res), gvqSuccess);
        EXPECT(res == gvqRemoteError, "a send on a pair out of step gave %s",
               gvqGetErrorString(res));
    }
    pthread_barrier_wait(&bar);
    if (rank == 0) {
        uint64_t t0 = gvq_now_ns();
        EXPECT_RES(gvq_chan_irecv(s, 2, buf, big, &r), gvqSuccess);
        EXPECT_RES(wait_all(s, &r, 1, &res), gvqSuccess);
        EXPECT(res == gvqRemoteError, "a receive whose sender gave up gave %s",
               gvqGetErrorString(res));
        EXPECT(gvq_now_ns() - t0 < 2000000000ull, "the receive took %.1f s to fail",
               (double)(gvq_now_ns() - t0) / 1e9);
    }
    free(buf);
}

/* On fresh channels (their rings start at 0): rank 1 sends 100 000 bytes to rank 2, which
 * receives them (the ring's head is then well into it); then SMALL_N messages of 100 bytes, 384 000
 * bytes of the ring with their headers, each waited for before the next and the one buffer changed
 * after each, while rank 2 has posted nothing: the ring holds them all (a record each, not a
 * chunk), wherever it starts. Rank 2 then receives them in order. */
enum { SMALL_N = 2000, SMALL_BYTES = 100, FIRST_BYTES = 100000 };
static void many_small(int rank) {
    gvq_chan_set_t *s = gvq_chan_attach(mem2, NR, rank);
    EXPECT(s != NULL, "attach");
    pthread_barrier_wait(&bar);
    unsigned char buf[SMALL_BYTES];
    gvq_req_t r;
    gvqResult_t res = gvqSuccess;
    if (rank == 1 || rank == 2) {
        char *first = calloc(FIRST_BYTES, 1);
        if (rank == 1)
            EXPECT_RES(gvq_chan_isend(s, 2, first, FIRST_BYTES, &r), gvqSuccess);
        else
            EXPECT_RES(gvq_chan_irecv(s, 1, first, FIRST_BYTES, &r), gvqSuccess);
        EXPECT_RES(wait_all(s, &r, 1, &res), gvqSuccess);
        EXPECT(res == gvqSuccess, "rank %d: the first message gave %s", rank,
               gvqGetErrorString(res));
        free(first);
    }
    pthread_barrier_wait(&bar); /* rank 2 read it all: the ring is empty, its head at 100 032 */
    if (rank == 1) {
        for (int k = 0; k < SMALL_N; k++) {
            for (size_t i = 0; i < SMALL_BYTES; i++)
                buf[i] = byte_of(1, 2, k, i);
            EXPECT_RES(gvq_chan_isend(s, 2, buf, SMALL_BYTES, &r), gvqSuccess);
            EXPECT_RES(wait_all(s, &r, 1, &res), gvqSuccess);
            EXPECT(res == gvqSuccess, "small send %d gave %s", k, gvqGetErrorString(res));
        }
        __atomic_store_n(&small_sent, 1, __ATOMIC_RELEASE);
    } else if (rank == 2) {
        uint64_t t0 = gvq_now_ns();
        while (!__atomic_load_n(&small_sent, __ATOMIC_ACQUIRE) &&
               gvq_now_ns() - t0 < 20000000000ull)
            sched_yield();
        EXPECT(__atomic_load_n(&small_sent, __ATOMIC_ACQUIRE),
               "%d small blocking sends did not complete before their receives", SMALL_N);
        for (int k = 0; k < SMALL_N; k++) {
            memset(buf, 0xee, sizeof buf);
            EXPECT_RES(gvq_chan_irecv(s, 1, buf, SMALL_BYTES, &r), gvqSuccess);
            EXPECT_RES(wait_all(s, &r, 1, &res), gvqSuccess);
            size_t bad = 0;
            for (size_t i = 0; i < SMALL_BYTES; i++)
                bad += buf[i] != byte_of(1, 2, k, i);
            EXPECT(res == gvqSuccess && bad == 0, "small message %d: %s, %zu wrong bytes", k,
                   gvqGetErrorString(res), bad);
        }
    }
    gvq_chan_detach(s);
}

/* Rank 1 sends 300 bytes to rank 0 and closes its channels; rank 0 still receives them, then
 * its next receive from rank 1 and its send to it fail at once. */
static void closed(gvq_chan_set_t *s, int rank) {
    unsigned char a[300], b[300];
    gvq_req_t r;
    gvqResult_t res = gvqSuccess;
    if (rank == 1) {
        memset(a, 7, sizeof a);
        EXPECT_RES(gvq_chan_isend(s, 0, a, sizeof a, &r), gvqSuccess);
        EXPECT_RES(wait_all(s, &r, 1, &res), gvqSuccess);
        gvq_chan_close(s);
    }
    pthread_barrier_wait(&bar);
    if (rank != 0) return;
    memset(b, 0, sizeof b);
    EXPECT_RES(gvq_chan_irecv(s, 1, b, sizeof b, &r), gvqSuccess);
    EXPECT_RES(wait_all(s, &r, 1, &res), gvqSuccess);
    EXPECT(res == gvqSuccess && b[0] == 7 && b[299] == 7, "the message sent before the close: %s",
           gvqGetErrorString(res));
    uint64_t t0 = gvq_now_ns();
    EXPECT_RES(gvq_chan_irecv(s, 1, b, sizeof b, &r), gvqSuccess);
    EXPECT_RES(wait_all(s, &r, 1, &res), gvqSuccess);
    EXPECT(res == gvqRemoteError, "a receive from a closed rank gave %s", gvqGetErrorString(res));
    EXPECT_RES(gvq_chan_isend(s, 1, b, sizeof b, &r), gvqSuccess);
    EXPECT_RES(wait_all(s, &r, 1, &res), gvqSuccess);
    EXPECT(res == gvqRemoteError, "a send to a closed rank gave %s", gvqGetErrorString(res));
    EXPECT(gvq_now_ns() - t0 < 2000000000ull, "failing took %.1f s",
           (double)(gvq_now_ns() - t0) / 1e9);
}

static void *rank_main(void *arg) {
    int rank = (int)(intptr_t)arg;
    gvq_chan_set_t *s = gvq_chan_attach(mem, NR, rank);
    EXPECT(s != NULL, "attach");
    pthread_barrier_wait(&bar); /* attach maps the rings it reads: not while a peer writes */
    all_to_all(s, rank);
    pthread_barrier_wait(&bar);
    all_to_all(s, rank); /* the rings' counters past their first lap */
    pthread_barrier_wait(&bar);
    mismatch(s, rank);
    pthread_barrier_wait(&bar);
    many_small(rank);
    pthread_barrier_wait(&bar);
    cancel_halfway(s, rank);
    pthread_barrier_wait(&bar);
    closed(s, rank);
    gvq_chan_detach(s);
    return NULL;
}

int main(void) {
    sizes[2] = gvq_chan_chunk(NR);
    sizes[3] = 2 * GVQ_CHAN_DEPTH * gvq_chan_chunk(NR) + 12345;
    mem = calloc(1, gvq_chan_bytes(NR));
    mem2 = calloc(1, gvq_chan_bytes(NR));
    pthread_barrier_init(&bar, NULL, NR);
    pthread_t th[NR];
    for (int r = 0; r < NR; r++)
        pthread_create(&th[r], NULL, rank_main, (void *)(intptr_t)r);
    for (int r = 0; r < NR; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&bar);
    free(mem);
    free(mem2);
    return gvq_test_finish("test_chan");
}
