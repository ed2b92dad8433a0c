/*
 * test_hier.c -- the hierarchical allreduce (src/algorithms/hier.c) on in-process ranks that
 * pretend to sit on H hosts of K ranks each (gvq_comm_pretend_hosts), (H, K) = (1..3, 1..3),
 * hosts in blocks and interleaved (as mpirun --map-by node places them): every datatype and op
 * against the double-precision reference of test_reference.h (integers exact, so equal to what
 * the flat ring gives), odd counts, in place and not, outputs bitwise identical on every rank
 * (also with values whose float sum depends on the order of the additions). Hosts of unequal
 * rank counts have no hierarchy: GVQ_ALGO=hier then runs the table's algorithm, with the same
 * checks. The hierarchical reduce-scatter and allgather likewise (every rank's block against
 * the reference; the allgather equal to the inputs and identical on every rank). The shape
 * itself (gvq_hier_of_hosts) is held to shapes written out here, and a compressed middle stage
 * (QSGD) is checked against a flat compressed ring over the same ranks. The flat reduce-scatter
 * and allgather rings, which follow the hosts' order where the hosts are interleaved, take the
 * same reduce-scatter and allgather sweep.
 */
#include <math.h>
#include <string.h>

#include "gvq_comm.h"
#include "gvq_select.h"
#include "gvq_test.h"
#include "test_reference.h"
#include "test_values.h"

typedef struct {
    int H, K, interleave, uneven;
    size_t count;
    gvqDataType_t t;
    gvqRedOp_t op;
    int inplace, order_values;
    int had_hier[16];
    uint64_t hash[16];
} hcase_t;

/* The host of rank r: blocks of K, or r mod H; `uneven` moves the last rank to host 0. */
static uint64_t host_of(const hcase_t *c, int r) {
    int n = c->H * c->K;
    if (c->uneven && r == n - 1) return 1000;
    return 1000 + (uint64_t)(c->interleave ? r % c->H : r / c->K);
}

static float order_value(int rank, size_t i) {
    uint32_t h = (uint32_t)(rank * 2654435761u) ^ (uint32_t)(i * 40503u + 977u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    float m = 1.0f + (float)(h % 1000) / 997.0f;
    return ((h >> 10) & 1 ? -m : m) * ldexpf(1.0f, (int)((h >> 11) % 41) - 20);
}

/* The case's hosts on this communicator, and whether it has the hierarchy's shape. */
static void pretend(hcase_t *c, gvqComm_t comm, int rank, int nranks) {
    uint64_t keys[16];
    for (int r = 0; r < nranks; r++)
        keys[r] = host_of(c, r);
    EXPECT_RES(gvq_comm_pretend_hosts(comm, keys), gvqSuccess);
    c->had_hier[rank] = comm->hier != NULL;
}

static void rank_hier(gvqComm_t comm, int rank, int nranks, void *arg) {
    hcase_t *c = arg;
    pretend(c, comm, rank, nranks);
    size_t es = gvq_dtype_size(c->t);
    char *s = malloc(c->count * es + 1), *d = c->inplace ? s : malloc(c->count * es + 1);
    for (size_t i = 0; i < c->count; i++)
        if (c->order_values)
            ((float *)s)[i] = order_value(rank, i);
        else
            put(s, c->t, i, input(rank, i, c->t, c->op));
    EXPECT_RES(gvqAllReduce(s, d, c->count, c->t, c->op, comm, NULL), gvqSuccess);
    int bad = 0;
    for (size_t i = 0; i < c->count && !c->order_values; i++) {
        double want = expect_reduce(nranks, i, c->t, c->op), got = get(d, c->t, i);
        if (!close_enough(got, want, c->t) && bad++ < 2)
            EXPECT(0, "hier H=%d K=%d%s%s count=%zu %s %s rank %d [%zu]: got %g want %g", c->H,
                   c->K, c->interleave ? " interleaved" : "", c->uneven ? " uneven" : "", c->count,
                   gvq_dtype_name(c->t), gvq_op_name(c->op), rank, i, got, want);
    }
    c->hash[rank] = fnv(d, c->count * es);
    if (d != s) free(d);
    free(s);
}

static void check_case(hcase_t *c) {
    int n = c->H * c->K;
    int want = c->H >= 2 && c->K >= 2 && !c->uneven;
    for (int r = 0; r < n; r++) {
        EXPECT(c->had_hier[r] == want, "H=%d K=%d uneven=%d rank %d: hierarchy %d, want %d", c->H,
               c->K, c->uneven, r, c->had_hier[r], want);
        EXPECT(c->hash[r] == c->hash[0],
               "hier H=%d K=%d%s count=%zu %s %s%s: rank %d's output differs from rank 0's", c->H,
               c->K, c->interleave ? " interleaved" : "", c->count, gvq_dtype_name(c->t),
               gvq_op_name(c->op), c->order_values ? " (order-sensitive values)" : "", r);
    }
}

static int sweep(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.chunkBytes = 256; /* several chunks per segment */
    int cases = 0;
    for (int H = 1; H <= 3; H++)
        for (int K = 1; K <= 3; K++)
            for (int il = 0; il < 2; il++)
                for (int un = 0; un < 2; un++) {
                    int n = H * K;
                    if (n < 2 || (il && (H < 2 || K < 2)) || (un && (H < 2 || n < 3))) continue;
                    if (gvq_test_sweep_small() && n > 4) continue; /* ThreadSanitizer's run */
                    /* the sanitizers' run (widths) checks 4001 values where the plain build checks
                     * 20011: still many chunks of 64, at a fifth of the check's reference sums */
                    size_t counts[] = {1, (size_t)(n - 1), 1021,
                                       gvq_test_sweep_widths() ? (size_t)4001 : (size_t)20011};
                    hcase_t *cs = calloc(4 * gvqNumTypes * gvqNumOps + 2, sizeof *cs);
                    if (cs == NULL) {
                        fprintf(stderr, "test_hier: out of memory for the case list\n");
                        exit(1);
                    }
                    size_t nc = 0;
                    for (int ci = 0; ci < 4; ci++)
                        for (int t = 0; t < gvqNumTypes; t++)
                            for (int op = 0; op < gvqNumOps; op++) {
                                if (gvq_test_sweep_skips(n, t, op)) continue;
                                hcase_t *c = &cs[nc++];
                                c->H = H, c->K = K, c->interleave = il, c->uneven = un;
                                c->count = counts[ci], c->t = (gvqDataType_t)t;
                                c->op = (gvqRedOp_t)op, c->inplace = (ci + t + op) % 2;
                            }
                    for (int ip = 0; ip < 2; ip++) { /* sums whose bits depend on the order */
                        hcase_t *c = &cs[nc++];
                        c->H = H, c->K = K, c->interleave = il, c->uneven = un, c->count = 4099;
                        c->t = gvqFloat32, c->op = ip ? gvqAvg : gvqSum, c->inplace = ip;
                        c->order_values = 1;
                    }
                    /* one communicator per shape takes every case in turn */
                    gvq_test_run_each(n, &cfg, rank_hier, cs, nc, sizeof cs[0]);
                    for (size_t i = 0; i < nc; i++)
                        check_case(&cs[i]);
                    cases += (int)nc;
                    free(cs);
                }
    return cases;
}

/* Reduce-scatter (c->op >= 0) or allgather (c->op < 0, op ignored) of c->count values per rank
 * through the hierarchy: every rank's block against the reference, the allgather's output equal
 * to every rank's input block and identical on every rank. */
static const char *rsag_name = "hier"; /* or "host-ordered ring" */

static void rank_rsag(gvqComm_t comm, int rank, int nranks, void *arg) {
    hcase_t *c = arg;
    pretend(c, comm, rank, nranks);
    size_t es = gvq_dtype_size(c->t), n = (size_t)nranks, m = c->count;
    int rs = (int)c->op >= 0;
    gvqRedOp_t op = rs ? c->op : gvqSum;
    char *big = malloc(n * m * es + 1), *own = malloc(m * es + 1);
    if (rs) { /* input: n blocks; output: this rank's */
        for (size_t i = 0; i < n * m; i++)
            put(big, c->t, i, input(rank, i, c->t, op));
        char *out = c->inplace ? big + (size_t)rank * m * es : own;
        EXPECT_RES(gvqReduceScatter(big, out, m, c->t, op, comm, NULL), gvqSuccess);
        int bad = 0;
        for (size_t i = 0; i < m; i++) {
            double want = expect_reduce(nranks, (size_t)rank * m + i, c->t, op);
            double got = get(out, c->t, i);
            if (!close_enough(got, want, c->t) && bad++ < 2)
                EXPECT(0,
                       "%s reducescatter H=%d K=%d%s%s count=%zu %s %s rank %d [%zu]: got %g "
                       "want %g",
                       rsag_name, c->H, c->K, c->interleave ? " interleaved" : "",
                       c->uneven ? " uneven" : "", m, gvq_dtype_name(c->t), gvq_op_name(op), rank,
                       i, got, want);
        }
        c->hash[rank] = 0; /* one block each: nothing to compare across ranks */
    } else {               /* input: one block; output: n blocks */
        char *in = c->inplace ? big + (size_t)rank * m * es : own;
        for (size_t i = 0; i < m; i++)
            put(in, c->t, i, input(rank, i, c->t, gvqSum));
        EXPECT_RES(gvqAllGather(in, big, m, c->t, comm, NULL), gvqSuccess);
        int bad = 0;
        for (size_t q = 0; q < n; q++)
            for (size_t i = 0; i < m; i++) {
                double want = input((int)q, i, c->t, gvqSum), got = get(big, c->t, q * m + i);
                if (got != want && bad++ < 2)
                    EXPECT(0,
                           "%s allgather H=%d K=%d%s count=%zu %s rank %d block %zu [%zu]: "
                           "got %g want %g",
                           rsag_name, c->H, c->K, c->interleave ? " interleaved" : "", m,
                           gvq_dtype_name(c->t), rank, q, i, got, want);
            }
        c->hash[rank] = fnv(big, n * m * es);
    }
    free(big);
    free(own);
}

static int sweep_rsag(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.chunkBytes = 256;
    int cases = 0;
    for (int H = 1; H <= 3; H++)
        for (int K = 1; K <= 3; K++)
            for (int il = 0; il < 2; il++)
                for (int un = 0; un < 2; un++) {
                    int n = H * K;
                    if (n < 2 || (il && (H < 2 || K < 2)) || (un && (H < 2 || n < 3))) continue;
                    if (gvq_test_sweep_small() && n > 4) continue;
                    size_t counts[] = {1, 3, 1021};
                    hcase_t *cs = calloc(3 * gvqNumTypes * (gvqNumOps + 1), sizeof *cs);
                    if (cs == NULL) {
                        fprintf(stderr, "test_hier: out of memory for the case list\n");
                        exit(1);
                    }
                    size_t nc = 0;
                    for (int ci = 0; ci < 3; ci++)
                        for (int t = 0; t < gvqNumTypes; t++)
                            for (int op = -1; op < gvqNumOps; op++) { /* -1: the allgather */
                                if (op >= 0 && gvq_test_sweep_skips(n, t, op)) continue;
                                hcase_t *c = &cs[nc++];
                                c->H = H, c->K = K, c->interleave = il, c->uneven = un;
                                c->count = counts[ci], c->t = (gvqDataType_t)t;
                                c->op = (gvqRedOp_t)op, c->inplace = (ci + t + op + 1) % 2;
                            }
                    gvq_test_run_each(n, &cfg, rank_rsag, cs, nc, sizeof cs[0]);
                    for (size_t i = 0; i < nc; i++)
                        check_case(&cs[i]);
                    cases += (int)nc;
                    free(cs);
                }
    return cases;
}

/* The shape, against shapes written out: ranks 0..5 on hosts a b a b a b (round-robin). */
static void test_shape(void) {
    const uint64_t rr[6] = {7, 9, 7, 9, 7, 9};
    gvq_hier_t *h = NULL;
    EXPECT_RES(gvq_hier_of_hosts(rr, 6, 3, &h), gvqSuccess);
    EXPECT(h != NULL, "round-robin 2x3: no hierarchy");
    if (h != NULL) {
        EXPECT(h->nhosts == 2 && h->per_host == 3 && h->local_index == 1,
               "rank 3: H %d K %d index %d, want 2 3 1", h->nhosts, h->per_host, h->local_index);
        EXPECT(h->local[0] == 1 && h->local[1] == 3 && h->local[2] == 5, "rank 3: local %d %d %d",
               h->local[0], h->local[1], h->local[2]);
        EXPECT(h->cross[0] == 2 && h->cross[1] == 3, "rank 3: cross %d %d, want 2 3", h->cross[0],
               h->cross[1]);
    }
    gvq_hier_free(h);
    const uint64_t uneven[5] = {7, 7, 9, 9, 7}, one[4] = {5, 5, 5, 5}, each[3] = {1, 2, 3};
    EXPECT_RES(gvq_hier_of_hosts(uneven, 5, 0, &h), gvqSuccess);
    EXPECT(h == NULL, "hosts of 3 and 2 ranks: a hierarchy");
    EXPECT_RES(gvq_hier_of_hosts(one, 4, 0, &h), gvqSuccess);
    EXPECT(h == NULL, "one host: a hierarchy");
    EXPECT_RES(gvq_hier_of_hosts(each, 3, 0, &h), gvqSuccess);
    EXPECT(h == NULL, "one rank per host: a hierarchy");
}

/* A QSGD compressor (4-bit) on hosts of several ranks: with GVQ_ALGO=hier only the stage
 * between the hosts quantizes (H - 1 re-encodes against N - 1 for the flat ring), so the
 * outputs differ from the flat ring's, are the same on every rank, and are nearer the sum. */
typedef struct {
    int H, K;
    size_t M;
    int int_bits; /* integerBits of the compressor (0: float wire) */
    int ef;       /* QSGD: error feedback, over `calls` calls (0 or 1: one call) */
    int calls;
    int slice, dims; /* the tracked basis's sliceSize and maxDims (0: 64 and 4) */
    double err2[16], norm2[16];
    uint64_t hash[16];
} qcase_t;

static float grad_value(int rank, size_t i) {
    return sinf((float)(i * 0.37 + rank * 1.3)) + 0.25f * (float)((rank + 1) % 3);
}

/* The case's ranks round-robin over its H hosts. */
static void pretend_rr(const qcase_t *q, gvqComm_t comm, int nranks) {
    uint64_t keys[16];
    for (int r = 0; r < nranks; r++)
        keys[r] = 50 + (uint64_t)(r % q->H);
    EXPECT_RES(gvq_comm_pretend_hosts(comm, keys), gvqSuccess);
}

/* QSGD 4-bit over q->calls calls (inputs shifted per call); the error is that of the sum of the
 * outputs against the sum of the exact sums: with error feedback, what each call drops comes
 * back in the next, so it stays about one call's error however many calls are added. */
static void rank_qsgd(gvqComm_t comm, int rank, int nranks, void *arg) {
    qcase_t *q = arg;
    pretend_rr(q, comm, nranks);
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = gvqCodecQsgd;
    cfg.qsgdBits = 4;
    cfg.qsgdBucket = 128;
    cfg.integerBits = q->int_bits;
    cfg.errorFeedback = q->ef;
    gvqCompressor_t comp;
    EXPECT_RES(gvqCompressorCreate(comm, q->M, &cfg, &comp), gvqSuccess);
    float *x = malloc(q->M * 4), *y = malloc(q->M * 4);
    double *acc = calloc(q->M, sizeof(double)), *want = calloc(q->M, sizeof(double));
    int calls = q->calls > 0 ? q->calls : 1;
    for (int t = 0; t < calls; t++) {
        for (size_t i = 0; i < q->M; i++)
            x[i] = grad_value(rank, i + (size_t)t * 7);
        EXPECT_RES(gvqAllReduceCompressed(x, y, q->M, gvqFloat32, gvqSum, comp, comm, NULL),
                   gvqSuccess);
        for (size_t i = 0; i < q->M; i++) {
            acc[i] += y[i];
            for (int r = 0; r < nranks; r++)
                want[i] += grad_value(r, i + (size_t)t * 7);
        }
    }
    double e2 = 0, n2 = 0;
    for (size_t i = 0; i < q->M; i++)
        e2 += (acc[i] - want[i]) * (acc[i] - want[i]), n2 += want[i] * want[i];
    q->err2[rank] = e2, q->norm2[rank] = n2;
    q->hash[rank] = fnv(y, q->M * 4);
    free(x), free(y), free(acc), free(want);
    gvqCompressorDestroy(comp);
}

/* fn on H x K ranks through the flat ring, then through the hierarchy: both identical on every
 * rank; *ef and *eh the relative errors of rank 0's output. Returns whether the bits differ. */
static int flat_and_hier_as(const char *name, gvq_rank_fn fn, const qcase_t *q, double *ef,
                            double *eh) {
    int H = q->H, K = q->K;
    qcase_t flat = *q, hier = *q;
    gvq_select_override("ring");
    gvq_test_run(H * K, NULL, fn, &flat);
    gvq_select_override("allreduce=hier");
    gvq_test_run(H * K, NULL, fn, &hier);
    gvq_select_override(NULL);
    for (int r = 1; r < H * K; r++)
        EXPECT(hier.hash[r] == hier.hash[0] && flat.hash[r] == flat.hash[0],
               "%s H=%d K=%d: rank %d's output differs from rank 0's", name, H, K, r);
    *ef = sqrt(flat.err2[0] / flat.norm2[0]);
    *eh = sqrt(hier.err2[0] / hier.norm2[0]);
    return hier.hash[0] != flat.hash[0];
}

static int flat_and_hier(const char *name, gvq_rank_fn fn, int H, int K, size_t M, double *ef,
                         double *eh) {
    qcase_t q;
    memset(&q, 0, sizeof q);
    q.H = H, q.K = K, q.M = M;
    return flat_and_hier_as(name, fn, &q, ef, eh);
}

static void test_compressed(void) {
    const int shapes[][2] = {{2, 2}, {3, 2}, {2, 3}};
    for (size_t s = 0; s < (gvq_test_sweep_small() ? 1u : 3u); s++) {
        int H = shapes[s][0], K = shapes[s][1];
        double ef, eh;
        int differ = flat_and_hier("QSGD", rank_qsgd, H, K, 30011, &ef, &eh);
        EXPECT(differ, "QSGD H=%d K=%d: hier gave the flat ring's bits", H, K);
        EXPECT(eh < ef && eh < 0.2, "QSGD H=%d K=%d: relative error hier %.4f, flat %.4f", H, K, eh,
               ef);
        printf("QSGD 4-bit H=%d K=%d: relative error hier %.4f, flat ring %.4f\n", H, K, eh, ef);
    }
}

/* The integer-summed wire across the hosts (8 bits: each host's level is bounded by 127 / H, not
 * 127 / N, and QSGD 4-bit by its own 7): the scales agreed on the host sums' pieces, identical
 * on every rank, as near the sum as the flat ring's integer wire or nearer. Error feedback in the
 * hierarchy: each rank keeps what its piece of the host's sum dropped, so over 8 calls the
 * summed outputs stay within about one call's error of the summed sums (without it the error of
 * the sum grows like sqrt(8) calls'). */
static void test_compressed_int(void) {
    const int shapes[][2] = {{2, 2}, {3, 2}, {2, 3}};
    for (size_t s = 0; s < (gvq_test_sweep_small() ? 1u : 3u); s++) {
        qcase_t q;
        memset(&q, 0, sizeof q);
        q.H = shapes[s][0], q.K = shapes[s][1], q.M = 30011, q.int_bits = 8;
        double ef, eh;
        int differ = flat_and_hier_as("QSGD int8", rank_qsgd, &q, &ef, &eh);
        EXPECT(differ, "QSGD int8 H=%d K=%d: hier gave the flat ring's bits", q.H, q.K);
        EXPECT(eh < ef && eh < 0.2, "QSGD int8 H=%d K=%d: relative error hier %.4f, flat %.4f", q.H,
               q.K, eh, ef);
        printf("QSGD 4-bit on the 8-bit wire H=%d K=%d: relative error hier %.4f, flat ring %.4f\n",
               q.H, q.K, eh, ef);
        q.int_bits = 0, q.ef = 1, q.calls = 8;
        double ef8, eh8, e1f, e1h;
        (void)flat_and_hier_as("QSGD EF", rank_qsgd, &q, &ef8, &eh8);
        q.ef = 0;
        (void)flat_and_hier_as("QSGD 8 calls", rank_qsgd, &q, &e1f, &e1h);
        EXPECT(eh8 < 0.5 * e1h && ef8 < 0.5 * e1f,
               "QSGD H=%d K=%d, 8 calls: error of the summed outputs with error feedback hier %.4f "
               "flat %.4f, without hier %.4f flat %.4f",
               q.H, q.K, eh8, ef8, e1h, e1f);
        printf("QSGD 4-bit H=%d K=%d, 8 calls summed: error feedback hier %.4f flat %.4f, without "
               "hier %.4f flat %.4f\n",
               q.H, q.K, eh8, ef8, e1h, e1f);
    }
}

/* GradiVeQ on hosts of several ranks: slices of a mean pattern plus two patterns with
 * coefficients that change per rank, call and slice, so that the fitted basis (d 4) carries
 * them nearly exactly. In the compressed phase the hierarchical call must be as near the sum as
 * the flat ring's: each of the H encodes across the hosts takes Z / H off (not Z / N). */
static float gq_value(int rank, int call, size_t i) {
    size_t L = 16, j = i / L, l = i % L;
    float a = sinf((float)(j * 3 + (size_t)rank * 7 + (size_t)call)), b = cosf((float)(j + rank));
    return 2.0f + 0.5f * (float)(l % 4) + a * sinf((float)l) + b * cosf((float)(l * 2));
}

static void rank_gradiveq(gvqComm_t comm, int rank, int nranks, void *arg) {
    qcase_t *q = arg;
    pretend_rr(q, comm, nranks);
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = gvqCodecGradiveq;
    cfg.sliceSize = 16;
    cfg.warmupIters = 2;
    cfg.sampleIters = 6;
    cfg.sampleSlices = 0; /* every slice a sample */
    cfg.compressedIters = 100;
    cfg.maxDims = 4;
    cfg.integerBits = q->int_bits;
    gvqCompressor_t comp;
    EXPECT_RES(gvqCompressorCreate(comm, q->M, &cfg, &comp), gvqSuccess);
    float *x = malloc(q->M * 4), *y = malloc(q->M * 4);
    gvqCompressorStats_t st = {0};
    for (int call = 0; call < 10; call++) {
        for (size_t i = 0; i < q->M; i++)
            x[i] = gq_value(rank, call, i);
        EXPECT_RES(gvqAllReduceCompressed(x, y, q->M, gvqFloat32, gvqSum, comp, comm, NULL),
                   gvqSuccess);
        gvqCompressorGetStats(comp, &st);
        double e2 = 0, n2 = 0;
        for (size_t i = 0; i < q->M; i++) {
            double want = 0;
            for (int r = 0; r < nranks; r++)
                want += gq_value(r, call, i);
            e2 += (y[i] - want) * (y[i] - want), n2 += want * want;
        }
        q->err2[rank] = e2, q->norm2[rank] = n2; /* the last call's */
    }
    EXPECT(st.phase == gvqPhaseCompressed, "GradiVeQ H=%d K=%d: phase %d after 10 calls", q->H,
           q->K, st.phase);
    q->hash[rank] = fnv(y, q->M * 4);
    free(x), free(y);
    gvqCompressorDestroy(comp);
}

static void test_gradiveq(void) {
    const int shapes[][2] = {{2, 2}, {3, 2}};
    for (size_t s = 0; s < (gvq_test_sweep_small() ? 1u : 2u); s++) {
        int H = shapes[s][0], K = shapes[s][1];
        double ef, eh;
        (void)flat_and_hier("GradiVeQ", rank_gradiveq, H, K, 16 * 301 + 5, &ef, &eh);
        EXPECT(ef < 1e-3 && eh < 1e-3, "GradiVeQ H=%d K=%d: relative error hier %.2e, flat %.2e", H,
               K, eh, ef);
        printf("GradiVeQ H=%d K=%d: relative error hier %.2e, flat ring %.2e\n", H, K, eh, ef);
    }
    /* its coefficients on the 8-bit wire: levels of 127 / H across the hosts against 127 / N */
    const int ishapes[][2] = {{2, 2}, {2, 3}};
    for (size_t s = 0; s < (gvq_test_sweep_small() ? 1u : 2u); s++) {
        qcase_t q;
        memset(&q, 0, sizeof q);
        q.H = ishapes[s][0], q.K = ishapes[s][1], q.M = 16 * 301 + 5, q.int_bits = 8;
        double ef, eh;
        (void)flat_and_hier_as("GradiVeQ int8", rank_gradiveq, &q, &ef, &eh);
        EXPECT(eh < ef && eh < 0.05, "GradiVeQ int8 H=%d K=%d: relative error hier %.2e, flat %.2e",
               q.H, q.K, eh, ef);
        printf("GradiVeQ on the 8-bit wire H=%d K=%d: relative error hier %.2e, flat ring %.2e\n",
               q.H, q.K, eh, ef);
    }
}

/* The tracked basis (d 4) on the 16-bit wire: its three factor rings hierarchical (fp32 inside
 * a host, integers across). A 64 x 144 gradient of rank 3 plus noise, 12 calls: identical on every
 * rank, and as near the sum as the flat rings'. */
static float track_value(int rank, int call, size_t i) {
    size_t r = i % 64, c = i / 64;
    float v = 0;
    for (int a = 0; a < 3; a++)
        v += sinf((float)(r * (a + 1)) * 0.21f + (float)a) *
             cosf((float)(c * (2 * a + 1)) * 0.07f) *
             (1.0f + 0.3f * sinf((float)(rank * 3 + call + a)));
    return v + 0.01f * sinf((float)(i * 7919 + (size_t)rank * 31 + (size_t)call * 17));
}

static void rank_track(gvqComm_t comm, int rank, int nranks, void *arg) {
    qcase_t *q = arg;
    pretend_rr(q, comm, nranks);
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = gvqCodecGradiveq;
    cfg.basisUpdate = gvqBasisTrack;
    cfg.maxDims = q->dims > 0 ? q->dims : 4;
    cfg.sliceSize = q->slice > 0 ? q->slice : 64;
    cfg.integerBits = q->int_bits;
    gvqCompressor_t comp;
    EXPECT_RES(gvqCompressorCreate(comm, q->M, &cfg, &comp), gvqSuccess);
    float *x = malloc(q->M * 4), *y = malloc(q->M * 4);
    for (int call = 0; call < 12; call++) {
        for (size_t i = 0; i < q->M; i++)
            x[i] = track_value(rank, call, i);
        EXPECT_RES(gvqAllReduceCompressed(x, y, q->M, gvqFloat32, gvqSum, comp, comm, NULL),
                   gvqSuccess);
        double e2 = 0, n2 = 0;
        for (size_t i = 0; i < q->M; i++) {
            double want = 0;
            for (int r = 0; r < nranks; r++)
                want += track_value(r, call, i);
            e2 += (y[i] - want) * (y[i] - want), n2 += want * want;
        }
        q->err2[rank] = e2, q->norm2[rank] = n2; /* the last call's */
    }
    q->hash[rank] = fnv(y, q->M * 4);
    free(x), free(y);
    gvqCompressorDestroy(comp);
}

static void test_track(void) {
    const int shapes[][2] = {{2, 2}, {3, 2}, {2, 3}};
    for (size_t s = 0; s < (gvq_test_sweep_small() ? 1u : 3u); s++) {
        for (int bits = 0; bits <= 16; bits += 16) {
            qcase_t q;
            memset(&q, 0, sizeof q);
            q.H = shapes[s][0], q.K = shapes[s][1], q.M = 64 * 144, q.int_bits = bits;
            double ef, eh;
            int differ = flat_and_hier_as("tracked basis", rank_track, &q, &ef, &eh);
            EXPECT(differ, "tracked basis int%d H=%d K=%d: hier gave the flat rings' bits", bits,
                   q.H, q.K);
            EXPECT(eh < 0.05 && eh < 1.2 * ef + 1e-4,
                   "tracked basis int%d H=%d K=%d: relative error hier %.2e, flat %.2e", bits, q.H,
                   q.K, eh, ef);
            printf("tracked basis d 4, int%d, H=%d K=%d: relative error hier %.2e, flat rings "
                   "%.2e\n",
                   bits, q.H, q.K, eh, ef);
        }
    }
    /* fewer slices than ranks on a host (2 slices of 256, 3 ranks a host): no piece for one
     * local rank, so the products are not split (the factor rings still hierarchical); every
     * rank the same bits, no worse than the flat rings */
    for (int bits = 0; bits <= 16; bits += 16) {
        qcase_t q;
        memset(&q, 0, sizeof q);
        q.H = 2, q.K = 3, q.M = 512, q.int_bits = bits, q.slice = 256, q.dims = 1;
        double ef, eh;
        (void)flat_and_hier_as("tracked basis, 2 slices", rank_track, &q, &ef, &eh);
        EXPECT(eh < 1.2 * ef + 1e-3,
               "tracked basis, 2 slices on hosts of 3, int%d: relative "
               "error hier %.2e, flat %.2e",
               bits, eh, ef);
    }
}

/* A group through the hierarchy: two tracked-basis tensors (fused into one call of three factor
 * rings), two PowerSGD ones (rank 2, fused: two factor rings) and a QSGD one, blocking and on a
 * host stream, fp32 and with the tracked basis on the 16-bit wire, on 2 x 2 ranks round-robin.
 * Every rank gets the same bits; the stream's group the blocking group's; the grouped fp32 calls
 * stay within 1e-4 of the same calls made one by one, QSGD gives its lone call's bits; and the
 * hierarchy's bits differ from the flat rings' (the factor rings did go through it). */
enum { HG = 5, HG_CALLS = 3 };
static const size_t hg_count[HG] = {16 * 4 * 9, 1000, 16 * 4 * 9, 640, 777};
typedef struct {
    qcase_t q;
    int bits;
    uint64_t hash[16][HG]; /* per rank and tensor: the blocking group's last outputs */
} gcase_t;

static void hg_make(gvqComm_t comm, int bits, gvqCompressor_t *c) {
    for (int i = 0; i < HG; i++) {
        gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        cfg.codec = i < 2 ? gvqCodecGradiveq : i < 4 ? gvqCodecPowersgd : gvqCodecQsgd;
        cfg.powerRank = 2;
        if (i < 2) {
            cfg.basisUpdate = gvqBasisTrack;
            cfg.maxDims = 2;
            cfg.integerBits = bits;
        }
        if (i == 0 || i == 2) cfg.filters = 16, cfg.depth = 4, cfg.height = cfg.width = 3;
        EXPECT_RES(gvqCompressorCreate(comm, hg_count[i], &cfg, &c[i]), gvqSuccess);
    }
}

static float hg_grad(int rank, int call, int i, size_t j) {
    return sinf((float)(j % 37) * 0.3f + (float)(call * 5 + i)) * cosf((float)(j / 37) * 0.11f) +
           0.05f * sinf((float)(j * 7919 + (size_t)rank * 131 + (size_t)call * 17));
}

/* HG_CALLS calls of the HG tensors, grouped (on stream s, or blocking) or one by one. */
static void hg_calls(gvqComm_t comm, int rank, gvqCompressor_t *c, gvqStream_t s, int grouped,
                     float **out) {
    for (int t = 0; t < HG_CALLS; t++) {
        for (int i = 0; i < HG; i++)
            for (size_t j = 0; j < hg_count[i]; j++)
                out[i][j] = hg_grad(rank, t, i, j);
        if (grouped) EXPECT_RES(gvqGroupStart(), gvqSuccess);
        for (int i = 0; i < HG; i++)
            EXPECT_RES(gvqAllReduceCompressed(out[i], out[i], hg_count[i], gvqFloat32, gvqAvg, c[i],
                                              comm, s),
                       gvqSuccess);
        if (grouped) EXPECT_RES(gvqGroupEnd(), gvqSuccess);
        if (s != NULL) EXPECT_RES(gvqStreamSynchronize(s), gvqSuccess);
    }
}

static void rank_group(gvqComm_t comm, int rank, int nranks, void *arg) {
    gcase_t *g = arg;
    pretend_rr(&g->q, comm, nranks);
    gvqCompressor_t a[HG], b[HG], one[HG];
    hg_make(comm, g->bits, a);
    hg_make(comm, g->bits, b);
    hg_make(comm, g->bits, one);
    float *ya[HG], *yb[HG], *y1[HG];
    for (int i = 0; i < HG; i++) {
        ya[i] = malloc(hg_count[i] * 4);
        yb[i] = malloc(hg_count[i] * 4);
        y1[i] = malloc(hg_count[i] * 4);
    }
    gvqStream_t s = NULL;
    EXPECT_RES(gvqStreamCreate(&s), gvqSuccess);
    hg_calls(comm, rank, a, NULL, 1, ya);
    hg_calls(comm, rank, b, s, 1, yb);
    hg_calls(comm, rank, one, NULL, 0, y1);
    for (int i = 0; i < HG; i++) {
        EXPECT(memcmp(ya[i], yb[i], hg_count[i] * 4) == 0,
               "group int%d tensor %d: the stream's group differs from the blocking group", g->bits,
               i);
        double e2 = 0, n2 = 0;
        for (size_t j = 0; j < hg_count[i]; j++)
            e2 += (ya[i][j] - y1[i][j]) * (ya[i][j] - y1[i][j]), n2 += y1[i][j] * y1[i][j];
        if (i == 4)
            EXPECT(memcmp(ya[i], y1[i], hg_count[i] * 4) == 0,
                   "group: fused QSGD differs from its lone call through the hierarchy");
        else if (g->bits == 0 || i >= 2)
            EXPECT(sqrt(e2 / n2) < 1e-4,
                   "group int%d tensor %d: grouped and one-by-one calls differ by %g (relative)",
                   g->bits, i, sqrt(e2 / n2));
        g->hash[rank][i] = fnv(ya[i], hg_count[i] * 4);
    }
    EXPECT_RES(gvqStreamDestroy(s), gvqSuccess);
    for (int i = 0; i < HG; i++) {
        gvqCompressorDestroy(a[i]), gvqCompressorDestroy(b[i]), gvqCompressorDestroy(one[i]);
        free(ya[i]), free(yb[i]), free(y1[i]);
    }
}

static void test_group(void) {
    for (int bits = 0; bits <= 16; bits += 16) {
        gcase_t flat, hier;
        memset(&flat, 0, sizeof flat);
        flat.q.H = 2, flat.q.K = 2, flat.bits = bits;
        hier = flat;
        gvq_select_override("ring");
        gvq_test_run(4, NULL, rank_group, &flat);
        gvq_select_override("allreduce=hier");
        gvq_test_run(4, NULL, rank_group, &hier);
        gvq_select_override(NULL);
        for (int i = 0; i < HG; i++) {
            for (int r = 1; r < 4; r++)
                EXPECT(hier.hash[r][i] == hier.hash[0][i] && flat.hash[r][i] == flat.hash[0][i],
                       "group int%d tensor %d: rank %d's output differs from rank 0's", bits, i, r);
            EXPECT(hier.hash[0][i] != flat.hash[0][i],
                   "group int%d tensor %d: the hierarchy gave the flat rings' bits", bits, i);
        }
        printf("group through the hierarchy (int%d): tracked basis x2, PowerSGD x2, QSGD; "
               "blocking, on a stream and one by one\n",
               bits);
    }
}

int main(void) {
    test_shape();
    gvq_select_override("allreduce=hier");
    int cases = sweep();
    gvq_select_override("reducescatter=hier,allgather=hier");
    int rsag = sweep_rsag();
    /* the flat rings of both, in host order where the hosts are interleaved (ring_order) */
    gvq_select_override("reducescatter=ring,allgather=ring");
    rsag_name = "host-ordered ring";
    int rsag_ring = sweep_rsag();
    gvq_select_override(NULL);
    test_compressed();
    test_compressed_int();
    test_gradiveq();
    test_track();
    test_group();
    printf("hierarchical allreduce: %d cases, reduce-scatter and allgather: %d (and %d through "
           "the flat rings in host order), at (H, K) = (1..3, 1..3)\n",
           cases, rsag, rsag_ring);
    return gvq_test_finish("test_hier");
}
