/*
 * test_shm_mixed.c -- many collectives of every kind, one after another on one communicator
 * through shared memory (GVQ_ALGO=shm, src/algorithms/shm_collectives.c), with ranks delayed at
 * random so that they leave a call at different times and reuse the two slots in every order: in
 * place and not, roots that vary, a reduce's non-root recvbuff and a broadcast's non-root sendbuff
 * NULL, counts from one element to several pieces (a segmented first piece with a small last one
 * among them). Every output against values computed from the inputs; and calls whose counts
 * differ between ranks, of every kind, fail on every rank without writing an output.
 */
#define _DEFAULT_SOURCE /* usleep */
#include <string.h>
#include <unistd.h>

#include "gvq_select.h"
#include "gvq_test.h"

enum { NCALLS = 60 };

typedef struct {
    int kind, root, inplace;
    size_t count;
} call_t;

static call_t calls[NCALLS];
static unsigned seed_skew;

static uint32_t hsh(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static float val(int rank, size_t i) {
    return (float)((hsh((uint32_t)(rank * 7919 + i)) % 64) + rank);
}

static void rank_mixed(gvqComm_t comm, int rank, int n, void *arg) {
    (void)arg;
    for (int ci = 0; ci < NCALLS; ci++) {
        call_t c = calls[ci];
        uint32_t d = hsh((uint32_t)(ci * 31 + rank + seed_skew)) % 4;
        if (d == 0) usleep(2000 + (hsh((uint32_t)ci + rank) % 3000));
        size_t cnt = c.count, tot = cnt * (size_t)n;
        float *s = NULL, *r = NULL;
        gvqResult_t res = gvqSuccess;
        int bad = 0;
        switch (c.kind) {
        case 0: /* allreduce */
            s = malloc(cnt * 4);
            r = c.inplace ? s : malloc(cnt * 4);
            for (size_t i = 0; i < cnt; i++)
                s[i] = val(rank, i);
            res = gvqAllReduce(s, r, cnt, gvqFloat32, gvqSum, comm, NULL);
            for (size_t i = 0; i < cnt && !bad; i++) {
                float w = 0;
                for (int q = 0; q < n; q++)
                    w += val(q, i);
                if (r[i] != w) {
                    bad = 1;
                    EXPECT(0, "call %d allreduce rank %d [%zu] %g %g", ci, rank, i, r[i], w);
                }
            }
            break;
        case 1: /* reduce */
            s = malloc(cnt * 4);
            r = c.inplace ? s : (rank == c.root ? malloc(cnt * 4) : NULL);
            for (size_t i = 0; i < cnt; i++)
                s[i] = val(rank, i);
            res = gvqReduce(s, r, cnt, gvqFloat32, gvqSum, c.root, comm, NULL);
            for (size_t i = 0; i < cnt && !bad && rank == c.root; i++) {
                float w = 0;
                for (int q = 0; q < n; q++)
                    w += val(q, i);
                if (r[i] != w) {
                    bad = 1;
                    EXPECT(0, "call %d reduce rank %d [%zu] %g %g", ci, rank, i, r[i], w);
                }
            }
            for (size_t i = 0; i < cnt && !bad && rank != c.root; i++)
                if (s[i] != val(rank, i)) {
                    bad = 1;
                    EXPECT(0, "call %d reduce nonroot input changed", ci);
                }
            break;
        case 2: /* broadcast */
            s = malloc(cnt * 4);
            r = c.inplace ? s : malloc(cnt * 4);
            for (size_t i = 0; i < cnt; i++)
                s[i] = val(rank == c.root ? 100 : rank, i);
            res = gvqBroadcast(rank == c.root || c.inplace ? s : NULL, r, cnt, gvqFloat32, c.root,
                               comm, NULL);
            for (size_t i = 0; i < cnt && !bad; i++)
                if (r[i] != val(100, i)) {
                    bad = 1;
                    EXPECT(0, "call %d bcast rank %d [%zu]", ci, rank, i);
                }
            break;
        case 3: /* reducescatter */
            s = malloc(tot * 4);
            for (size_t i = 0; i < tot; i++)
                s[i] = val(rank, i);
            r = c.inplace ? s + (size_t)rank * cnt : malloc(cnt * 4);
            res = gvqReduceScatter(s, r, cnt, gvqFloat32, gvqSum, comm, NULL);
            for (size_t i = 0; i < cnt && !bad; i++) {
                float w = 0;
                for (int q = 0; q < n; q++)
                    w += val(q, (size_t)rank * cnt + i);
                if (r[i] != w) {
                    bad = 1;
                    EXPECT(0, "call %d rs rank %d [%zu] %g %g", ci, rank, i, r[i], w);
                }
            }
            if (c.inplace) r = s;
            break;
        case 4: /* allgather */
            r = malloc(tot * 4);
            s = c.inplace ? r + (size_t)rank * cnt : malloc(cnt * 4);
            for (size_t i = 0; i < cnt; i++)
                s[i] = val(rank, i);
            res = gvqAllGather(s, r, cnt, gvqFloat32, comm, NULL);
            for (int q = 0; q < n && !bad; q++)
                for (size_t i = 0; i < cnt && !bad; i++)
                    if (r[(size_t)q * cnt + i] != val(q, i)) {
                        bad = 1;
                        EXPECT(0, "call %d ag rank %d blk %d [%zu]", ci, rank, q, i);
                    }
            if (c.inplace) s = r;
            break;
        }
        EXPECT(res == gvqSuccess, "call %d kind %d rank %d: %s", ci, c.kind, rank,
               gvqGetErrorString(res));
        if (r != s) free(r);
        free(s);
    }
}

/* rows differ: rank 0 broadcasts from root 0 with count A, the others count B; outputs untouched */
static void rank_mismatch(gvqComm_t comm, int rank, int n, void *arg) {
    (void)arg;
    (void)n;
    size_t cnt = 400000;
    float *s = malloc(cnt * 4), *r = malloc(cnt * 4 * 5);
    for (size_t i = 0; i < cnt; i++)
        s[i] = 1.0f;
    for (size_t i = 0; i < cnt * 5; i++)
        r[i] = -7.0f;
    for (int kind = 0; kind < 5; kind++) {
        size_t c = rank == 0 ? cnt : cnt - 1;
        gvqResult_t res = gvqSuccess;
        if (kind == 0) res = gvqAllReduce(s, r, c, gvqFloat32, gvqSum, comm, NULL);
        if (kind == 1) res = gvqReduce(s, r, c, gvqFloat32, gvqSum, 0, comm, NULL);
        if (kind == 2) res = gvqBroadcast(s, r, c, gvqFloat32, 0, comm, NULL);
        if (kind == 3) res = gvqReduceScatter(s, r, c / 5, gvqFloat32, gvqSum, comm, NULL);
        if (kind == 4) res = gvqAllGather(s, r, c / 5, gvqFloat32, comm, NULL);
        EXPECT(res != gvqSuccess, "mismatch kind %d rank %d succeeded", kind, rank);
        int bad = 0;
        for (size_t i = 0; i < cnt * 5 && !bad; i++)
            if (r[i] != -7.0f) {
                bad = 1;
                EXPECT(0, "mismatch kind %d rank %d wrote output [%zu]", kind, rank, i);
            }
    }
    float a = 1, b = 0;
    EXPECT_RES(gvqAllReduce(&a, &b, 1, gvqFloat32, gvqSum, comm, NULL), gvqSuccess);
    free(s);
    free(r);
}

int main(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    gvq_select_override("shm");
    const size_t counts[] = {1, 5, 1000, 20000, 263144, 300001, 600007};
    int reps = gvq_test_sweep_small() ? 1 : 3; /* ThreadSanitizer's run: one of three */
    for (int rep = 0; rep < reps; rep++)
        for (int n = 2; n <= 5; n++) {
            for (int ci = 0; ci < NCALLS; ci++) {
                uint32_t h = hsh((uint32_t)(ci + 1000 * n + 77777 * rep));
                calls[ci].kind = (int)(h % 5);
                calls[ci].root = (int)((h >> 4) % (uint32_t)n);
                calls[ci].inplace = (int)((h >> 8) & 1);
                calls[ci].count = counts[(h >> 12) % 7];
                if (calls[ci].kind >= 3) calls[ci].count = calls[ci].count / (size_t)n + 1;
            }
            seed_skew = (unsigned)rep * 13u + (unsigned)n;
            gvq_test_run(n, &cfg, rank_mixed, NULL);
        }
    for (int n = 2; n <= 4; n++)
        gvq_test_run(n, &cfg, rank_mismatch, NULL);
    gvq_select_override(NULL);
    return gvq_test_finish("test_shm_mixed");
}
