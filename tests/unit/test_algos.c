/*
 * test_algos.c -- every algorithm of every plain collective, each forced through GVQ_ALGO's
 * override (gvq_select_override), on 1..5 in-process ranks with odd counts: results against a
 * double-precision reference computed from the inputs, and, for allreduce, outputs bitwise
 * identical on every rank -- also with values whose float sum depends on the order of the
 * additions and with max/min over +0 and -0, where only a reduction order that all ranks share
 * gives every rank the same bits.
 */
#include <math.h>
#include <string.h>

#include "gvq_select.h"
#include "gvq_test.h"
#include "test_reference.h"
#include "test_values.h"

typedef struct {
    const char *algo; /* GVQ_ALGO for the case */
    size_t count;
    gvqDataType_t t;
    gvqRedOp_t op;
    int inplace, root;
    int order_values; /* allreduce: order-sensitive float values instead of input() */
    uint64_t hash[8];
} case_t;

/* Float values whose sum over the ranks rounds differently in different orders: magnitudes
 * 2^-20 .. 2^20 and both signs. For max and min: +0, -0, 1 and -1. */
static float order_value(int rank, size_t i, gvqRedOp_t op) {
    uint32_t h = (uint32_t)(rank * 2654435761u) ^ (uint32_t)(i * 40503u + 977u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    if (op == gvqMax || op == gvqMin) {
        static const float z[4] = {0.0f, -0.0f, 0.0f, -0.0f};
        return (h % 5 == 0) ? ((h & 8) ? 1.0f : -1.0f) : z[h % 4];
    }
    float m = 1.0f + (float)(h % 1000) / 997.0f;
    return ((h >> 10) & 1 ? -m : m) * ldexpf(1.0f, (int)((h >> 11) % 41) - 20);
}

static void rank_allreduce(gvqComm_t comm, int rank, int nranks, void *arg) {
    case_t *c = arg;
    size_t es = gvq_dtype_size(c->t);
    char *s = malloc(c->count * es + 1), *d = c->inplace ? s : malloc(c->count * es + 1);
    for (size_t i = 0; i < c->count; i++)
        if (c->order_values)
            ((float *)s)[i] = order_value(rank, i, c->op);
        else
            put(s, c->t, i, input(rank, i, c->t, c->op));
    EXPECT_RES(gvqAllReduce(s, d, c->count, c->t, c->op, comm, NULL), gvqSuccess);
    int bad = 0;
    for (size_t i = 0; i < c->count && !c->order_values; i++) {
        double want = expect_reduce(nranks, i, c->t, c->op), got = get(d, c->t, i);
        if (!close_enough(got, want, c->t) && bad++ < 2)
            EXPECT(0, "GVQ_ALGO=%s allreduce n=%d count=%zu %s %s %s rank %d [%zu]: got %g want %g",
                   c->algo, nranks, c->count, gvq_dtype_name(c->t), gvq_op_name(c->op),
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
    for (size_t i = 0; i < total; i++)
        put(s, c->t, i, input(rank, i, c->t, c->op));
    char *d = c->inplace ? s + (size_t)rank * c->count * es : malloc(c->count * es + 1);
    EXPECT_RES(gvqReduceScatter(s, d, c->count, c->t, c->op, comm, NULL), gvqSuccess);
    int bad = 0;
    for (size_t i = 0; i < c->count; i++) {
        double want = expect_reduce(nranks, (size_t)rank * c->count + i, c->t, c->op),
               got = get(d, c->t, i);
        if (!close_enough(got, want, c->t) && bad++ < 2)
            EXPECT(0,
                   "GVQ_ALGO=%s reduce_scatter n=%d count=%zu %s %s rank %d [%zu]: got %g want %g",
                   c->algo, nranks, c->count, gvq_dtype_name(c->t), gvq_op_name(c->op), rank, i,
                   got, want);
    }
    if (!c->inplace) free(d);
    free(s);
}

static void rank_allgather(gvqComm_t comm, int rank, int nranks, void *arg) {
    case_t *c = arg;
    size_t es = gvq_dtype_size(c->t);
    char *d = malloc(c->count * (size_t)nranks * es + 1);
    char *s = c->inplace ? d + (size_t)rank * c->count * es : malloc(c->count * es + 1);
    for (size_t i = 0; i < c->count; i++)
        put(s, c->t, i, input(rank, i, c->t, gvqSum));
    EXPECT_RES(gvqAllGather(s, d, c->count, c->t, comm, NULL), gvqSuccess);
    int bad = 0;
    for (int r = 0; r < nranks; r++)
        for (size_t i = 0; i < c->count; i++) {
            double want = input(r, i, c->t, gvqSum), got = get(d, c->t, (size_t)r * c->count + i);
            if (got != want && bad++ < 2)
                EXPECT(0, "GVQ_ALGO=%s allgather n=%d count=%zu %s rank %d block %d [%zu]: got %g",
                       c->algo, nranks, c->count, gvq_dtype_name(c->t), rank, r, i, got);
        }
    if (!c->inplace) free(s);
    free(d);
}

static void rank_broadcast(gvqComm_t comm, int rank, int nranks, void *arg) {
    case_t *c = arg;
    (void)nranks;
    size_t es = gvq_dtype_size(c->t);
    char *s = malloc(c->count * es + 1), *d = c->inplace ? s : malloc(c->count * es + 1);
    for (size_t i = 0; i < c->count; i++)
        put(s, c->t, i, input(rank == c->root ? 1000 : rank, i, c->t, gvqSum));
    EXPECT_RES(gvqBroadcast(s, d, c->count, c->t, c->root, comm, NULL), gvqSuccess);
    int bad = 0;
    for (size_t i = 0; i < c->count; i++)
        if (get(d, c->t, i) != input(1000, i, c->t, gvqSum) && bad++ < 2)
            EXPECT(0, "GVQ_ALGO=%s broadcast n=%d root %d count %zu rank %d [%zu]", c->algo, nranks,
                   c->root, c->count, rank, i);
    if (d != s) free(d);
    free(s);
}

static void rank_reduce(gvqComm_t comm, int rank, int nranks, void *arg) {
    case_t *c = arg;
    size_t es = gvq_dtype_size(c->t);
    char *s = malloc(c->count * es + 1), *d = c->inplace ? s : malloc(c->count * es + 1);
    for (size_t i = 0; i < c->count; i++)
        put(s, c->t, i, input(rank, i, c->t, c->op));
    EXPECT_RES(gvqReduce(s, rank == c->root || c->inplace ? d : NULL, c->count, c->t, c->op,
                         c->root, comm, NULL),
               gvqSuccess);
    int bad = 0;
    for (size_t i = 0; rank == c->root && i < c->count; i++) {
        double want = expect_reduce(nranks, i, c->t, c->op), got = get(d, c->t, i);
        if (!close_enough(got, want, c->t) && bad++ < 2)
            EXPECT(0, "GVQ_ALGO=%s reduce n=%d root %d count=%zu %s %s [%zu]: got %g want %g",
                   c->algo, nranks, c->root, c->count, gvq_dtype_name(c->t), gvq_op_name(c->op), i,
                   got, want);
    }
    for (size_t i = 0; rank != c->root && i < c->count; i++) /* recvbuff is the root's only */
        if (get(s, c->t, i) != input(rank, i, c->t, c->op) && bad++ < 1)
            EXPECT(0,
                   "GVQ_ALGO=%s reduce n=%d root %d count=%zu: non-root rank %d's input "
                   "changed at [%zu]",
                   c->algo, nranks, c->root, c->count, rank, i);
    if (d != s) free(d);
    free(s);
}

static void check_same(const case_t *c, int nranks) {
    for (int r = 1; r < nranks; r++)
        EXPECT(c->hash[r] == c->hash[0],
               "GVQ_ALGO=%s allreduce n=%d count=%zu %s %s%s: rank %d's output differs from rank "
               "0's",
               c->algo, nranks, c->count, gvq_dtype_name(c->t), gvq_op_name(c->op),
               c->order_values ? " (order-sensitive values)" : "", r);
}

static const char *const algos[] = {"ring", "rd", "rab", "tree", "direct", "shm"};

/* Every collective with every algorithm forced, all datatypes and ops, 1..5 ranks. */
static void test_forced(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.chunkBytes = 256;
    for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++) {
        gvq_select_override(algos[a]);
        for (int n = 1; n <= 5; n++) {
            size_t counts[] = {1, (size_t)(n > 1 ? n - 1 : 2), 7, 1021};
            case_t cs[4 * gvqNumTypes * gvqNumOps], sums[4 * gvqNumTypes];
            size_t nc = 0, ns = 0;
            for (int ci = 0; ci < 4; ci++)
                for (int t = 0; t < gvqNumTypes; t++)
                    for (int op = 0; op < gvqNumOps; op++) {
                        if (gvq_test_sweep_skips(n, t, op)) continue;
                        cs[nc++] = (case_t){algos[a],
                                            counts[ci],
                                            (gvqDataType_t)t,
                                            (gvqRedOp_t)op,
                                            (ci + t + op) % 2,
                                            (ci + t) % n,
                                            0,
                                            {0}};
                        if (op == gvqSum) sums[ns++] = cs[nc - 1];
                    }
            /* one communicator per (algorithm, rank count) takes every case in turn */
            gvq_test_run_each(n, &cfg, rank_allreduce, cs, nc, sizeof cs[0]);
            for (size_t i = 0; i < nc; i++)
                check_same(&cs[i], n);
            gvq_test_run_each(n, &cfg, rank_reduce_scatter, cs, nc, sizeof cs[0]);
            gvq_test_run_each(n, &cfg, rank_reduce, cs, nc, sizeof cs[0]);
            gvq_test_run_each(n, &cfg, rank_allgather, sums, ns, sizeof sums[0]);
            gvq_test_run_each(n, &cfg, rank_broadcast, sums, ns, sizeof sums[0]);
        }
    }
    gvq_select_override(NULL);
}

/* The order-sensitive values really are: some element's float sum over 3 or more ranks differs
 * between the two groupings of a 3-rank slice, so equal hashes are no accident. */
static void test_values_are_order_sensitive(void) {
    int differ = 0;
    for (size_t i = 0; i < 4096 && !differ; i++) {
        volatile float a = order_value(0, i, gvqSum), b = order_value(1, i, gvqSum),
                       c = order_value(2, i, gvqSum);
        float x = (a + b) + c, y = a + (b + c);
        differ = x != y;
    }
    EXPECT(differ, "the order-sensitive test values sum alike in every order");
}

/* Bitwise identical outputs on every rank where the order of the reduction shows. */
static void test_identical(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    const gvqRedOp_t ops[] = {gvqSum, gvqAvg, gvqMax, gvqMin};
    const char *const ar[] = {"ring", "rd", "rab", "direct", "shm"};
    for (size_t a = 0; a < 5; a++) {
        gvq_select_override(ar[a]);
        for (int n = 2; n <= 5; n++)
            for (size_t o = 0; o < 4; o++)
                for (int ip = 0; ip < 2; ip++) {
                    case_t c = {ar[a], 4099, gvqFloat32, ops[o], ip, 0, 1, {0}};
                    gvq_test_run(n, &cfg, rank_allreduce, &c);
                    check_same(&c, n);
                }
    }
    gvq_select_override(NULL);
}

/* shm above 64 KiB reduces each rank's segment on that rank (src/algorithms/shm_collectives.c):
 * every datatype and op against the reference, in place and not, outputs identical on every rank
 * (1, 3, 5 ranks; order-sensitive sums at 2-5). */
static void test_shm_large(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    gvq_select_override("shm");
    for (int n = 1; n <= 5; n += 2)
        for (int t = 0; t < gvqNumTypes; t++)
            for (int op = 0; op < gvqNumOps; op++) {
                if (gvq_test_sweep_skips(n, t, op)) continue;
                size_t count = (size_t)(80 * 1024) / gvq_dtype_size((gvqDataType_t)t) + 7;
                case_t c = {"shm", count, (gvqDataType_t)t, (gvqRedOp_t)op, (t + op) % 2, 0,
                            0,     {0}};
                gvq_test_run(n, &cfg, rank_allreduce, &c);
                check_same(&c, n);
            }
    for (int n = 2; n <= 5; n++) { /* order-sensitive float sums */
        case_t c = {"shm", 50001, gvqFloat32, gvqSum, n % 2, 0, 1, {0}};
        gvq_test_run(n, &cfg, rank_allreduce, &c);
        check_same(&c, n);
    }
    gvq_select_override(NULL);
}

/* The other collectives on shm past one piece (a slot holds 1 MiB): reduce's segments and
 * pieces, reducescatter's pieces of every block, allgather's and broadcast's pieces, in place
 * and not, roots other than 0. */
static void test_shm_pieces(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    gvq_select_override("shm");
    for (int n = 2; n <= 4; n++)
        for (int ip = 0; ip < 2; ip++) {
            const gvqDataType_t types[] = {gvqFloat32, gvqFloat16, gvqInt64};
            for (size_t ti = 0; ti < 3; ti++) {
                gvqDataType_t t = types[ti];
                size_t big = (size_t)(2600 * 1024) / gvq_dtype_size(t) + 3; /* 3 pieces */
                case_t c = {"shm", big, t, ti == 2 ? gvqMax : gvqSum, ip, n - 1, 0, {0}};
                gvq_test_run(n, &cfg, rank_reduce, &c);
                gvq_test_run(n, &cfg, rank_broadcast, &c);
                c.count = big / (size_t)n + 1;
                gvq_test_run(n, &cfg, rank_reduce_scatter, &c);
                gvq_test_run(n, &cfg, rank_allgather, &c);
                c.count = (size_t)(100 * 1024) / gvq_dtype_size(t) + 1; /* one piece, segments */
                c.root = ip;
                gvq_test_run(n, &cfg, rank_reduce, &c);
            }
        }
    gvq_select_override(NULL);
}

/* direct is the ring's reduce-scatter with another allgather: the same sums, so the same bits
 * as the ring on order-sensitive values (and chunk boundaries that differ from the segments'). */
static void test_direct_is_ring(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.chunkBytes = 1000;
    for (int n = 2; n <= 5; n++)
        for (int ip = 0; ip < 2; ip++) {
            case_t ring = {"ring", 4099, gvqFloat32, gvqSum, ip, 0, 1, {0}}, direct = ring;
            direct.algo = "direct";
            gvq_select_override("ring");
            gvq_test_run(n, &cfg, rank_allreduce, &ring);
            gvq_select_override("direct");
            gvq_test_run(n, &cfg, rank_allreduce, &direct);
            for (int r = 0; r < n; r++)
                EXPECT(ring.hash[r] == direct.hash[r],
                       "n=%d %s: rank %d's direct allreduce differs from the ring's", n,
                       ip ? "in-place" : "out-of-place", r);
        }
    gvq_select_override(NULL);
}

/* The signed exchange (recursive.c): its riding allreduce has gvq_rd_allreduce's bits on every
 * rank; a row that differs is seen by every rank alike and leaves dst unwritten, also when one
 * rank sends its signature alone (a refused or larger call) and the others their vectors. */
typedef struct {
    size_t count;
    gvqRedOp_t op;
    int odd_rank;  /* -1: every row equal; else this rank's row differs */
    int bare_rank; /* -1: every rank sends its vector; else this one its signature alone */
    gvqResult_t want;
    int64_t ext[8][2 * 3];
    int same[8], untouched[8];
} signed_case_t;

static void rank_signed(gvqComm_t comm, int rank, int nranks, void *arg) {
    signed_case_t *c = arg;
    (void)nranks;
    gvq_coll_ctx_t ctx = gvq_comm_ctx(comm, NULL);
    float *s = malloc(c->count * 4), *want = malloc(c->count * 4), *got = malloc(c->count * 4);
    for (size_t i = 0; i < c->count; i++) {
        s[i] = order_value(rank, i, c->op);
        got[i] = -7.0f;
    }
    int64_t row[3] = {42, (int64_t)c->count, rank == c->odd_rank ? 5 : 4}, lo[3], hi[3];
    int lo_rank = -1, hi_rank = -1;
    gvq_signed_payload_t pay = {s, got, c->count, gvqFloat32, c->op, GVQ_PAY_ALLREDUCE, 0};
    EXPECT_RES(
        gvq_rd_signed(&ctx, row, 3, lo, &lo_rank, hi, &hi_rank, rank == c->bare_rank ? NULL : &pay),
        c->want);
    if (c->odd_rank < 0 && c->bare_rank < 0)
        EXPECT_RES(gvq_rd_allreduce(&ctx, s, want, c->count, gvqFloat32, c->op), gvqSuccess);
    c->same[rank] = c->odd_rank < 0 && c->bare_rank < 0 && memcmp(got, want, c->count * 4) == 0;
    int untouched = 1;
    for (size_t i = 0; i < c->count; i++)
        untouched &= got[i] == -7.0f;
    c->untouched[rank] = untouched;
    for (int f = 0; f < 3; f++) {
        c->ext[rank][f] = lo[f];
        c->ext[rank][3 + f] = hi[f];
    }
    c->ext[rank][0] += 1000 * lo_rank; /* the call number field carries the ranks along */
    c->ext[rank][3] += 1000 * hi_rank;
    free(s);
    free(want);
    free(got);
}

static void test_signed(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    const size_t counts[] = {1, 7, 300, 960};
    for (int n = 1; n <= 6; n++)
        for (size_t ci = 0; ci < 4; ci++)
            for (int k = 0; k < 5; k++) {       /* equal rows (sum; avg or max), a differing row, a
                                                 * bare rank beside a differing row, beside equal rows */
                if (n == 1 && k >= 2) continue; /* one rank's rows always agree */
                gvqRedOp_t op = k != 1 ? gvqSum : ci % 2 ? gvqMax : gvqAvg; /* max: +0 vs -0 */
                signed_case_t c = {counts[ci], op, -1, -1, gvqSuccess, {{0}}, {0}, {0}};
                if (k == 2) c.odd_rank = (int)(ci % (size_t)n);
                if (k == 3) c.bare_rank = (int)((ci + 1) % (size_t)n), c.odd_rank = 0;
                if (k == 4) /* rows that do not define the length: every rank fails alike */
                    c.bare_rank = (int)((ci + 1) % (size_t)n), c.want = gvqInternalError;
                gvq_test_run(n, &cfg, rank_signed, &c);
                for (int r = 0; r < n; r++) {
                    EXPECT(memcmp(c.ext[r], c.ext[0], sizeof c.ext[0]) == 0,
                           "n=%d count=%zu case %d: rank %d's extremes differ from rank 0's", n,
                           c.count, k, r);
                    if (c.odd_rank < 0 && c.bare_rank < 0)
                        EXPECT(c.same[r],
                               "n=%d count=%zu %s: rank %d's result differs from "
                               "gvq_rd_allreduce's",
                               n, c.count, gvq_op_name(c.op), r);
                    else
                        EXPECT(c.untouched[r],
                               "n=%d count=%zu case %d: rank %d wrote its output "
                               "although the rows differ",
                               n, c.count, k, r);
                }
                if (c.odd_rank >= 0 && n > 1) { /* the odd row (5) is the highest, rank odd's */
                    EXPECT(c.ext[0][5] == 5 && c.ext[0][3] == 42 + 1000 * c.odd_rank,
                           "n=%d case %d: the highest row is not rank %d's", n, k, c.odd_rank);
                    EXPECT(c.ext[0][2] == 4, "n=%d case %d: the lowest row is not a common one", n,
                           k);
                }
            }
}

/* The other collectives riding along (recursive.c's gvq_rd_signed_bytes): a reducescatter's
 * block and a reduce's root result bitwise those of gvq_rd_allreduce on the whole input, a
 * reduce's non-roots untouched; an allgather's blocks and a broadcast's root vector bit for bit,
 * -0.0 and a NaN's payload included (they travel as bytes summed with zeros). */
typedef struct {
    size_t count;
    gvq_pay_kind_t kind;
    gvqRedOp_t op;
    int root;
    int ok[8];
} kind_case_t;

static float kind_value(int rank, size_t i, gvqRedOp_t op) {
    uint32_t nan = 0x7fc12345u + (uint32_t)rank;
    float v;
    if (i == 1) return -0.0f;
    if (i == 2) return memcpy(&v, &nan, 4), v;
    return order_value(rank, i, op);
}

static void rank_kinds(gvqComm_t comm, int rank, int nranks, void *arg) {
    kind_case_t *c = arg;
    gvq_coll_ctx_t ctx = gvq_comm_ctx(comm, NULL);
    size_t N = (size_t)nranks, in_n = c->kind == GVQ_PAY_REDUCE_SCATTER ? N * c->count : c->count;
    size_t out_n = c->kind == GVQ_PAY_ALLGATHER ? N * c->count : c->count;
    float *s = malloc(in_n * 4), *got = malloc(out_n * 4), *want = malloc(N * c->count * 4 + 4);
    for (size_t i = 0; i < in_n; i++)
        s[i] = kind_value(rank, i, c->op);
    for (size_t i = 0; i < out_n; i++)
        got[i] = -7.0f;
    int64_t row[3] = {42, (int64_t)c->count, (int64_t)c->kind}, lo[3], hi[3];
    int lo_rank = -1, hi_rank = -1;
    gvq_signed_payload_t pay = {s, got, c->count, gvqFloat32, c->op, c->kind, c->root};
    EXPECT_RES(gvq_rd_signed(&ctx, row, 3, lo, &lo_rank, hi, &hi_rank, &pay), gvqSuccess);
    int ok = 1, reduces = c->kind == GVQ_PAY_REDUCE_SCATTER || c->kind == GVQ_PAY_REDUCE;
    if (reduces) /* the whole input reduced as the riding allreduce does it (every rank) */
        EXPECT_RES(gvq_rd_allreduce(&ctx, s, want, in_n, gvqFloat32, c->op), gvqSuccess);
    if (c->kind == GVQ_PAY_ALLGATHER) {
        for (int q = 0; q < nranks; q++)
            for (size_t i = 0; i < c->count; i++) {
                float v = kind_value(q, i, c->op);
                ok &= memcmp(&got[(size_t)q * c->count + i], &v, 4) == 0;
            }
    } else if (c->kind == GVQ_PAY_BROADCAST) {
        for (size_t i = 0; i < c->count; i++) {
            float v = kind_value(c->root, i, c->op);
            ok &= memcmp(&got[i], &v, 4) == 0;
        }
    } else if (c->kind == GVQ_PAY_REDUCE && rank != c->root) {
        for (size_t i = 0; i < out_n; i++)
            ok &= got[i] == -7.0f;
    } else {
        size_t at = c->kind == GVQ_PAY_REDUCE_SCATTER ? (size_t)rank * c->count : 0;
        ok = memcmp(got, want + at, c->count * 4) == 0;
    }
    c->ok[rank] = ok;
    free(s), free(got), free(want);
}

static void test_signed_kinds(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    const size_t counts[] = {1, 7, 300};
    const gvq_pay_kind_t kinds[] = {GVQ_PAY_REDUCE_SCATTER, GVQ_PAY_ALLGATHER, GVQ_PAY_BROADCAST,
                                    GVQ_PAY_REDUCE};
    const char *names[] = {"", "broadcast", "reduce", "reducescatter", "allgather"};
    int cases = 0;
    for (int n = 1; n <= 6; n++)
        for (size_t ci = 0; ci < 3; ci++)
            for (size_t k = 0; k < 4; k++) {
                kind_case_t c = {counts[ci],
                                 kinds[k],
                                 ci == 1 ? gvqAvg : gvqSum,
                                 (int)((ci + k) % (size_t)n),
                                 {0}};
                gvq_test_run(n, &cfg, rank_kinds, &c);
                for (int r = 0; r < n; r++)
                    EXPECT(c.ok[r],
                           "signed %s n=%d count=%zu %s root %d: rank %d's output is wrong",
                           names[c.kind], n, c.count, gvq_op_name(c.op), c.root, r);
                cases++;
            }
    printf("signed exchange: reducescatter, allgather, broadcast, reduce riding along: %d cases\n",
           cases);
}

/* Malformed or unsupported GVQ_ALGO items are ignored (WARN), the rest applies. */
static void test_spec(void) {
    gvq_select_override("allreduce=tree,bogus,allgather=rd");
    EXPECT(gvq_select_algo(GVQ_OP_ALLREDUCE, 4, 1 << 30, gvqFloat32, 0, 0, 1, 0) == GVQ_ALGO_RING,
           "allreduce=tree is not an allreduce algorithm: the table (ring at 1 GiB) must stay");
    EXPECT(gvq_select_algo(GVQ_OP_ALLGATHER, 4, 1 << 30, gvqFloat32, 0, 0, 1, 0) == GVQ_ALGO_RD,
           "allgather=rd must force Bruck");
    gvq_select_override("rab");
    EXPECT(gvq_select_algo(GVQ_OP_REDUCE_SCATTER, 3, 1, gvqInt8, 0, 0, 1, 0) == GVQ_ALGO_RAB,
           "rab for RS");
    EXPECT(gvq_select_algo(GVQ_OP_ALLREDUCE, 3, 1, gvqInt8, 1, 0, 1, 0) == GVQ_ALGO_RING,
           "FIFO transports keep the ring");
    gvq_select_override("hier");
    EXPECT(gvq_select_algo(GVQ_OP_ALLREDUCE, 4, 1024, gvqFloat32, 0, 0, 0, 1) == GVQ_ALGO_HIER,
           "GVQ_ALGO=hier with the hierarchy's shape: hier at any size");
    EXPECT(gvq_select_algo(GVQ_OP_ALLREDUCE, 4, 1024, gvqFloat32, 0, 0, 0, 0) == GVQ_ALGO_RD,
           "GVQ_ALGO=hier without the shape: the table (rd at 1 KiB across hosts)");
    EXPECT(gvq_select_forced(GVQ_OP_ALLREDUCE) == GVQ_ALGO_HIER &&
               gvq_select_forced(GVQ_OP_BROADCAST) == GVQ_ALGO_AUTO,
           "GVQ_ALGO=hier names allreduce only");
    gvq_select_override(NULL);
}

/* Hosts of several ranks (the hierarchy's shape) without GVQ_ALGO. */
static void test_table_hier(void) {
    const size_t M = (size_t)1 << 20;
    gvq_select_override(NULL);
    EXPECT(gvq_select_algo(GVQ_OP_ALLREDUCE, 4, 64 * M, gvqFloat32, 0, 0, 0, 1) == GVQ_ALGO_HIER,
           "hosts of several ranks: the hierarchy at 64 MiB");
    EXPECT(gvq_select_algo(GVQ_OP_ALLREDUCE, 4, M, gvqFloat32, 0, 0, 0, 1) == GVQ_ALGO_RING,
           "hosts of several ranks: the table at 1 MiB (hier slower there)");
    EXPECT(gvq_select_algo(GVQ_OP_REDUCE_SCATTER, 4, 64 * M, gvqFloat32, 0, 0, 0, 1) ==
               GVQ_ALGO_RING,
           "no hierarchical reduce-scatter");
    EXPECT(gvq_select_algo(GVQ_OP_ALLREDUCE, 4, 64 * M, gvqFloat32, 0, 0, 1, 1) == GVQ_ALGO_RING,
           "one host: no hierarchy");
}

/* The table without GVQ_ALGO: by size, rank count, staged sends and one host or several. */
static void test_table(void) {
    const size_t G = (size_t)1 << 30, M = (size_t)1 << 20;
    static const struct {
        gvq_op_kind_t kind;
        int n;
        size_t bytes;
        int staged, one_host;
        gvq_algo_t want;
        const char *why;
    } rows[] = {
        {GVQ_OP_ALLREDUCE, 4, G, 0, 1, GVQ_ALGO_RING, "the table gives the ring at 1 GiB"},
        {GVQ_OP_ALLREDUCE, 4, G, 1, 1, GVQ_ALGO_DIRECT,
         "a transport that stages sends gets direct where the table gives the ring"},
        {GVQ_OP_ALLREDUCE, 2, G, 1, 1, GVQ_ALGO_RING,
         "2 ranks keep the ring (direct copies the same bytes there)"},
        {GVQ_OP_ALLREDUCE, 4, 1024, 1, 1, GVQ_ALGO_RD,
         "staging leaves the small sizes' rows alone"},
        {GVQ_OP_REDUCE_SCATTER, 4, G, 1, 1, GVQ_ALGO_RING,
         "reduce-scatter has no direct algorithm"},
        {GVQ_OP_ALLREDUCE, 4, G, 1, 0, GVQ_ALGO_RING, "across hosts staged sends keep the ring"},
        {GVQ_OP_ALLREDUCE, 4, M, 0, 0, GVQ_ALGO_RING,
         "across hosts the ring from 512 KiB (the one-host rows give rab at 1 MiB)"},
        {GVQ_OP_ALLREDUCE, 4, 1024, 0, 0, GVQ_ALGO_RD, "across hosts recursive doubling at 1 KiB"},
        {GVQ_OP_ALLREDUCE, 2, 4 * M, 0, 0, GVQ_ALGO_RAB,
         "across hosts 2 ranks run rab up to 4 MiB"},
        {GVQ_OP_ALLREDUCE, 4, 1024, 1, 2, GVQ_ALGO_SHM, "shared memory: shm at 1 KiB"},
        {GVQ_OP_ALLREDUCE, 2, 64 * 1024, 1, 2, GVQ_ALGO_SHM, "shared memory: shm up to 64 KiB"},
        {GVQ_OP_ALLREDUCE, 5, G, 1, 2, GVQ_ALGO_SHM, "shared memory: shm at 1 GiB too"},
        {GVQ_OP_ALLREDUCE, 9, 64 * 1024 + 4, 0, 2, GVQ_ALGO_SHM,
         "shared memory beyond 8 ranks: shm (pieces of 64 KiB)"},
        {GVQ_OP_ALLGATHER, 4, 1024, 0, 2, GVQ_ALGO_SHM, "shared memory: allgather too"},
        {GVQ_OP_BROADCAST, 3, G, 1, 2, GVQ_ALGO_SHM, "shared memory: broadcast at 1 GiB"},
        {GVQ_OP_REDUCE, 5, 4 * M, 1, 2, GVQ_ALGO_SHM, "shared memory: reduce"},
        {GVQ_OP_REDUCE_SCATTER, 2, 1024, 1, 2, GVQ_ALGO_SHM, "shared memory: reducescatter"},
        {GVQ_OP_ALLGATHER, 9, 1024, 1, 2, GVQ_ALGO_RD,
         "shared memory beyond 8 ranks: the table for the others than allreduce"},
    };
    gvq_select_override(NULL);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        EXPECT(gvq_select_algo(rows[i].kind, rows[i].n, rows[i].bytes, gvqFloat32, 0,
                               rows[i].staged, rows[i].one_host, 0) == rows[i].want,
               "%s", rows[i].why);
}

int main(void) {
    test_values_are_order_sensitive();
    test_spec();
    test_table();
    test_table_hier();
    test_identical();
    test_direct_is_ring();
    test_signed();
    test_signed_kinds();
    test_shm_large();
    test_shm_pieces();
    test_forced();
    return gvq_test_finish("test_algos");
}
