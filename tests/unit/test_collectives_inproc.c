/*
 * test_collectives_inproc.c -- every collective on 1..5 in-process ranks (threads), against a
 * double-precision reference computed from the inputs, which are a pure function of
 * (rank, index). Small chunks force many chunks per segment. Also: every rank's output is
 * bitwise identical, the generic (non-identity) codec path of the ring, groups with
 * send/receive, and the timeout and abort paths.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <unistd.h>

#include "gvq_test.h"
#include "test_reference.h"
#include "test_values.h"

static void fill(void *b, gvqDataType_t t, size_t n, int rank, gvqRedOp_t op) {
    for (size_t i = 0; i < n; i++)
        put(b, t, i, input(rank, i, t, op));
}

typedef struct {
    size_t count;
    gvqDataType_t t;
    gvqRedOp_t op;
    int inplace;
    int root;
    uint64_t hash[16];
} case_t;

static void rank_allreduce(gvqComm_t comm, int rank, int nranks, void *arg) {
    case_t *c = arg;
    size_t es = gvq_dtype_size(c->t);
    char *s = malloc(c->count * es + 1), *d = c->inplace ? s : malloc(c->count * es + 1);
    fill(s, c->t, c->count, rank, c->op);
    EXPECT_RES(gvqAllReduce(s, d, c->count, c->t, c->op, comm, NULL), gvqSuccess);
    int bad = 0;
    for (size_t i = 0; i < c->count; i++) {
        double want = expect_reduce(nranks, i, c->t, c->op), got = get(d, c->t, i);
        if (!close_enough(got, want, c->t) && bad++ < 2)
            EXPECT(0, "allreduce n=%d count=%zu %s %s %s rank %d [%zu]: got %g want %g", nranks,
                   c->count, gvq_dtype_name(c->t), gvq_op_name(c->op),
                   c->inplace ? "in-place" : "out-of-place", rank, i, got, want);
    }
    c->hash[rank] = fnv(d, c->count * es);
    if (d != s) free(d);
    free(s);
}

static void rank_reduce_scatter(gvqComm_t comm, int rank, int nranks, void *arg) {
    case_t *c = arg;
    size_t es = gvq_dtype_size(c->t), total = c->count * (size_t)nranks;
    char *s = malloc(total * es + 1);
    fill(s, c->t, total, rank, c->op);
    char *d = c->inplace ? s + (size_t)rank * c->count * es : malloc(c->count * es + 1);
    EXPECT_RES(gvqReduceScatter(s, d, c->count, c->t, c->op, comm, NULL), gvqSuccess);
    int bad = 0;
    for (size_t i = 0; i < c->count; i++) {
        double want = expect_reduce(nranks, (size_t)rank * c->count + i, c->t, c->op),
               got = get(d, c->t, i);
        if (!close_enough(got, want, c->t) && bad++ < 2)
            EXPECT(0, "reduce_scatter n=%d count=%zu %s %s rank %d [%zu]: got %g want %g", nranks,
                   c->count, gvq_dtype_name(c->t), gvq_op_name(c->op), rank, i, got, want);
    }
    if (!c->inplace) free(d);
    free(s);
}

static void rank_allgather(gvqComm_t comm, int rank, int nranks, void *arg) {
    case_t *c = arg;
    size_t es = gvq_dtype_size(c->t);
    char *d = malloc(c->count * (size_t)nranks * es + 1);
    char *s = c->inplace ? d + (size_t)rank * c->count * es : malloc(c->count * es + 1);
    /* block of rank r holds input(r, i) */
    fill(s, c->t, c->count, rank, gvqSum);
    EXPECT_RES(gvqAllGather(s, d, c->count, c->t, comm, NULL), gvqSuccess);
    int bad = 0;
    for (int r = 0; r < nranks; r++)
        for (size_t i = 0; i < c->count; i++) {
            double want = input(r, i, c->t, gvqSum), got = get(d, c->t, (size_t)r * c->count + i);
            if (got != want && bad++ < 2)
                EXPECT(0, "allgather n=%d count=%zu %s rank %d block %d [%zu]: got %g want %g",
                       nranks, c->count, gvq_dtype_name(c->t), rank, r, i, got, want);
        }
    c->hash[rank] = fnv(d, c->count * (size_t)nranks * es);
    if (!c->inplace) free(s);
    free(d);
}

static void rank_broadcast(gvqComm_t comm, int rank, int nranks, void *arg) {
    case_t *c = arg;
    (void)nranks;
    size_t es = gvq_dtype_size(c->t);
    char *s = malloc(c->count * es + 1), *d = c->inplace ? s : malloc(c->count * es + 1);
    fill(s, c->t, c->count, rank == c->root ? 1000 : rank, gvqSum);
    EXPECT_RES(gvqBroadcast(s, d, c->count, c->t, c->root, comm, NULL), gvqSuccess);
    int bad = 0;
    for (size_t i = 0; i < c->count; i++)
        if (get(d, c->t, i) != input(1000, i, c->t, gvqSum) && bad++ < 2)
            EXPECT(0, "broadcast root %d count %zu rank %d [%zu]", c->root, c->count, rank, i);
    if (d != s) free(d);
    free(s);
}

static void rank_reduce(gvqComm_t comm, int rank, int nranks, void *arg) {
    case_t *c = arg;
    size_t es = gvq_dtype_size(c->t);
    char *s = malloc(c->count * es + 1), *d = c->inplace ? s : malloc(c->count * es + 1);
    fill(s, c->t, c->count, rank, c->op);
    EXPECT_RES(gvqReduce(s, rank == c->root || c->inplace ? d : NULL, c->count, c->t, c->op,
                         c->root, comm, NULL),
               gvqSuccess);
    int bad = 0;
    if (rank == c->root)
        for (size_t i = 0; i < c->count; i++) {
            double want = expect_reduce(nranks, i, c->t, c->op), got = get(d, c->t, i);
            if (!close_enough(got, want, c->t) && bad++ < 2)
                EXPECT(0, "reduce n=%d root %d count=%zu %s %s [%zu]: got %g want %g", nranks,
                       c->root, c->count, gvq_dtype_name(c->t), gvq_op_name(c->op), i, got, want);
        }
    if (d != s) free(d);
    free(s);
}

static void check_same(const case_t *c, int nranks, const char *what) {
    for (int r = 1; r < nranks; r++)
        EXPECT(c->hash[r] == c->hash[0],
               "%s n=%d count=%zu %s %s: rank %d output differs from rank 0", what, nranks,
               c->count, gvq_dtype_name(c->t), gvq_op_name(c->op), r);
}

static void test_all_collectives(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.chunkBytes = 256; /* many chunks per segment */
    for (int n = 1; n <= 5; n++) {
        size_t counts[] = {0, 1, (size_t)(n > 1 ? n - 1 : 2), 7919, 40009};
        const size_t cap = 5 * gvqNumTypes * gvqNumOps * 2;
        case_t *all = calloc(cap, sizeof *all), *most = calloc(cap, sizeof *most),
               *sums = calloc(cap * 5, sizeof *sums);
        if (all == NULL || most == NULL || sums == NULL) {
            fprintf(stderr, "test_collectives_inproc: out of memory for the case lists\n");
            exit(1);
        }
        size_t na = 0, nm = 0, ns = 0;
        for (int ci = 0; ci < 5; ci++)
            for (int t = 0; t < gvqNumTypes; t++)
                for (int op = 0; op < gvqNumOps; op++)
                    for (int ip = 0; ip < 2; ip++) {
                        if (gvq_test_sweep_skips(n, t, op)) continue;
                        case_t c = {counts[ci], (gvqDataType_t)t, (gvqRedOp_t)op, ip, 0, {0}};
                        all[na++] = c;
                        if (ci == 4 && op > gvqSum)
                            continue; /* large counts: sum only for the rest */
                        c.root = (ci + t) % n;
                        most[nm++] = c;
                        if (op == gvqSum) sums[ns++] = c;
                    }
        /* one communicator per rank count takes every case in turn */
        gvq_test_run_each(n, &cfg, rank_allreduce, all, na, sizeof all[0]);
        for (size_t i = 0; i < na; i++)
            check_same(&all[i], n, "allreduce");
        gvq_test_run_each(n, &cfg, rank_reduce_scatter, most, nm, sizeof most[0]);
        gvq_test_run_each(n, &cfg, rank_reduce, most, nm, sizeof most[0]);
        gvq_test_run_each(n, &cfg, rank_allgather, sums, ns, sizeof sums[0]);
        for (size_t i = 0; i < ns; i++)
            check_same(&sums[i], n, "allgather");
        size_t nb = 0; /* broadcast from every root */
        for (size_t i = 0; i < ns; i++)
            for (int root = 0; root < n; root++) {
                sums[ns + nb] = sums[i];
                sums[ns + nb++].root = root;
            }
        gvq_test_run_each(n, &cfg, rank_broadcast, sums + ns, nb, sizeof sums[0]);
        free(all);
        free(most);
        free(sums);
    }
}

/* ---- the ring's generic codec path: a codec whose wire is doubles -------------------------- */

static size_t wide_wire_bytes(const gvq_codec_t *c, size_t off, size_t count) {
    (void)c;
    (void)off;
    return count * sizeof(double);
}
static gvqResult_t wide_encode_combine(const gvq_codec_t *c, size_t off, size_t count,
                                       const void *local, const void *in, void *out) {
    (void)c;
    (void)off;
    const float *x = local;
    const double *w = in;
    double *o = out;
    for (size_t i = 0; i < count; i++)
        o[i] = (double)x[i] + (w ? w[i] : 0.0);
    return gvqSuccess;
}
static gvqResult_t wide_decode(const gvq_codec_t *c, size_t off, size_t count, const void *wire,
                               void *dst) {
    (void)c;
    (void)off;
    const double *w = wire;
    float *d = dst;
    for (size_t i = 0; i < count; i++)
        d[i] = (float)w[i];
    return gvqSuccess;
}

static void rank_wide(gvqComm_t comm, int rank, int nranks, void *arg) {
    case_t *c = arg;
    gvq_codec_t codec = {.name = "wide",
                         .granule = 3,
                         .wire_bytes = wide_wire_bytes,
                         .encode_combine = wide_encode_combine,
                         .decode = wide_decode,
                         .dev = comm->dev,
                         .dtype = gvqFloat32,
                         .op = gvqSum};
    gvq_coll_ctx_t ctx = gvq_comm_ctx(comm, NULL);
    float *s = malloc(c->count * sizeof(float) + 4),
          *d = c->inplace ? s : malloc(c->count * sizeof(float) + 4);
    /* values whose float sum would round but whose double sum is exact */
    for (size_t i = 0; i < c->count; i++)
        s[i] = rank == 0 ? 16777216.0f : (float)((rank + i) % 2);
    EXPECT_RES(gvq_ring_allreduce(&ctx, &codec, s, d, c->count, c->op), gvqSuccess);
    int bad = 0;
    for (size_t i = 0; i < c->count; i++) {
        double want = 16777216.0; /* exact in double; a float ring would lose the +1s */
        for (int r = 1; r < nranks; r++)
            want += (double)((r + i) % 2);
        float w = (float)want;
        if (c->op == gvqAvg) w = w / (float)nranks; /* decode, then the one final divide */
        if (d[i] != w && bad++ < 2)
            EXPECT(0, "wide codec n=%d count=%zu [%zu]: got %.1f want %.1f", nranks, c->count, i,
                   d[i], w);
    }
    c->hash[rank] = fnv(d, c->count * sizeof(float));
    if (d != s) free(d);
    free(s);
}

static void test_generic_codec(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.chunkBytes = 100; /* not a multiple of the granule: chunks must round to it */
    for (int n = 1; n <= 5; n++) {
        size_t counts[] = {1, 2, 7, 1000, 9001};
        for (int ci = 0; ci < 5; ci++)
            for (int ip = 0; ip < 2; ip++) {
                case_t c = {counts[ci], gvqFloat32, ip ? gvqAvg : gvqSum, ip, 0, {0}};
                gvq_test_run(n, &cfg, rank_wide, &c);
                check_same(&c, n, "wide codec");
            }
    }
}

/* ---- groups ------------------------------------------------------------------------------- */

static void rank_group(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)arg;
    int right = (rank + 1) % nranks, left = (rank - 1 + nranks) % nranks;
    int64_t out[300], in[300];
    for (int i = 0; i < 300; i++)
        out[i] = rank * 1000 + i, in[i] = -1;
    float a[5], b[5];
    for (int i = 0; i < 5; i++)
        a[i] = (float)rank, b[i] = 1;
    EXPECT_RES(gvqGroupStart(), gvqSuccess);
    EXPECT_RES(gvqGroupStart(), gvqSuccess); /* nesting */
    EXPECT_RES(gvqSend(out, 300, gvqInt64, right, comm, NULL), gvqSuccess);
    EXPECT_RES(gvqRecv(in, 300, gvqInt64, left, comm, NULL), gvqSuccess);
    EXPECT_RES(gvqGroupEnd(), gvqSuccess);
    EXPECT_RES(gvqAllReduce(a, a, 5, gvqFloat32, gvqSum, comm, NULL), gvqSuccess);
    EXPECT_RES(gvqAllReduce(b, b, 5, gvqFloat32, gvqSum, comm, NULL), gvqSuccess);
    EXPECT(in[0] == -1, "a queued call ran before gvqGroupEnd");
    EXPECT_RES(gvqGroupEnd(), gvqSuccess);
    for (int i = 0; i < 300; i++)
        if (in[i] != left * 1000 + i) {
            EXPECT(0, "group ring exchange rank %d [%d]: %lld", rank, i, (long long)in[i]);
            break;
        }
    EXPECT(a[4] == nranks * (nranks - 1) / 2.0f && b[0] == nranks, "grouped allreduce: %g %g", a[4],
           b[0]);
    EXPECT_RES(gvqGroupEnd(), gvqInvalidUsage);
    /* a refused call poisons its group: nothing runs, GroupEnd reports it */
    EXPECT_RES(gvqGroupStart(), gvqSuccess);
    EXPECT_RES(gvqAllReduce(a, a, 5, (gvqDataType_t)99, gvqSum, comm, NULL), gvqInvalidArgument);
    EXPECT_RES(gvqGroupEnd(), gvqInvalidArgument);
}

/* ---- timeout and abort -------------------------------------------------------------------- */

static void rank_timeout(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)arg;
    float x[1000] = {0};
    if (rank == nranks - 1) return; /* never joins */
    uint64_t t0 = gvq_now_ns();
    EXPECT_RES(gvqAllReduce(x, x, 1000, gvqFloat32, gvqSum, comm, NULL), gvqTimeout);
    double s = (double)(gvq_now_ns() - t0) / 1e9;
    EXPECT(s >= 0.25 && s < 5, "timeout took %.2f s", s);
    gvqResult_t async = gvqSuccess;
    EXPECT_RES(gvqCommGetAsyncError(comm, &async), gvqSuccess);
    EXPECT(async == gvqTimeout, "async error %s", gvqGetErrorString(async));
    EXPECT_RES(gvqAllReduce(x, x, 1000, gvqFloat32, gvqSum, comm, NULL), gvqTimeout);
    EXPECT(strstr(gvqGetLastError(comm), "broken") != NULL, "last error: %s",
           gvqGetLastError(comm));
}

typedef struct {
    gvqComm_t comm;
    gvqResult_t res;
} abort_arg_t;

static void *abort_victim(void *p) {
    abort_arg_t *a = p;
    float x[100] = {0};
    a->res = gvqAllReduce(x, x, 100, gvqFloat32, gvqSum, a->comm, NULL);
    return NULL;
}

static void test_abort(void) {
    gvqComm_t comms[2];
    EXPECT_RES(gvq_comm_init_inproc(2, NULL, comms), gvqSuccess);
    abort_arg_t a = {comms[0], gvqSuccess};
    pthread_t th;
    uint64_t t0 = gvq_now_ns();
    pthread_create(&th, NULL, abort_victim, &a); /* rank 1 never joins: it would wait 10 min */
    usleep(100000);
    EXPECT_RES(gvqCommAbort(comms[0]), gvqSuccess);
    pthread_join(th, NULL);
    EXPECT(a.res == gvqInvalidUsage, "aborted allreduce returned %s", gvqGetErrorString(a.res));
    EXPECT((gvq_now_ns() - t0) / 1e9 < 5, "abort took too long");
    EXPECT_RES(gvqCommDestroy(comms[0]), gvqInvalidArgument); /* already gone */
    EXPECT_RES(gvqCommDestroy(comms[1]), gvqSuccess);
}

int main(void) {
    test_all_collectives();
    test_generic_codec();
    for (int n = 1; n <= 4; n++)
        gvq_test_run(n, NULL, rank_group, NULL);
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = 300;
    gvq_test_run(3, &cfg, rank_timeout, NULL);
    test_abort();
    return gvq_test_finish("test_collectives_inproc");
}
