/*
 * test_compressor.c -- compressor handles on in-process ranks: config refusals naming the
 * field; the GradiVeQ schedule (warm-up -> sample -> fit -> compressed -> sample) at the right
 * calls; d equal to the rank of low-rank gradients and their reconstruction; exact sums while
 * sampling; the early exit by vote; NaN samples refused; outputs bitwise identical on every rank;
 * save/load resuming identically; QSGD compressors; conv shapes (collocation) and error feedback.
 */
#include <math.h>

#include "gvq_test.h"

#define SL 16  /* slice size */
#define RANK 3 /* rank of the synthetic gradients */

/* Slice s of rank r at iteration t: sum_j a_j(r,t,s) B_j, with B fixed -- every slice lies in
 * one RANK-dimensional subspace, as GradiVeQ assumes of a conv layer. */
static int first_slice_rank1; /* 1: slice 0 varies along B_0 only (unrepresentative) */

static float grad(int r, int t, size_t i) {
    size_t s = i / SL, e = i % SL;
    double v = 0;
    for (int j = 0; j < (first_slice_rank1 && s == 0 ? 1 : RANK); j++) {
        double a = sin((0.7 + 0.45 * j) * t + 1.3 * r + 0.9 * (double)s + 2.1 * j);
        double ph = 6.283185307179586 * (double)e / SL; /* orthogonal directions of equal norm */
        double b = j == 0 ? cos(ph) : j == 1 ? sin(ph) : cos(2 * ph);
        v += a * b;
    }
    return (float)v;
}

static double exact_sum(int n, int t, size_t i) {
    double v = 0;
    for (int r = 0; r < n; r++)
        v += grad(r, t, i);
    return v;
}

typedef struct {
    size_t count;
    gvqCompressorConfig_t cfg;
    int iters;
    int nan_iter;   /* iteration at which rank 0 feeds a NaN, -1 none */
    int noise_from; /* iteration from which gradients leave the subspace, -1 never */
    double offset;  /* a constant added along a 4th direction before quiet_from (no variance:
                       the fit's centring takes it, no component of U does) */
    int quiet_from; /* iteration from which gradients are small noise only (0: never) */
    float *out[8];  /* last output per rank */
    gvqCompressorStats_t st[8];
    int phases[64]; /* rank 0: phase before each call */
    double err[64]; /* rank 0: relative error vs the exact sum per call */
    const char *save_path;
    int save_at;           /* save after this call */
    const char *load_path; /* load before the first call */
    int start_t;
} sched_t;

static void rank_sched(gvqComm_t comm, int rank, int nranks, void *arg) {
    sched_t *sc = arg;
    gvqCompressor_t comp;
    EXPECT_RES(gvqCompressorCreate(comm, sc->count, &sc->cfg, &comp), gvqSuccess);
    if (sc->load_path) EXPECT_RES(gvqCompressorLoadFile(comp, sc->load_path), gvqSuccess);
    float *x = malloc(sizeof(float) * sc->count), *y = malloc(sizeof(float) * sc->count);
    for (int it = 0; it < sc->iters; it++) {
        int t = sc->start_t + it;
        for (size_t i = 0; i < sc->count; i++) {
            x[i] = grad(rank, t, i);
            if (sc->noise_from >= 0 && t >= sc->noise_from)
                x[i] += (float)sin(12.9898 * (double)i * (rank + 1) + t) * 3;
            if (sc->offset != 0)
                x[i] += (float)(sc->offset * cos(4 * 6.283185307179586 * (double)(i % SL) / SL));
            if (sc->quiet_from > 0 && t >= sc->quiet_from)
                x[i] = (float)(0.01 * sin(12.9898 * (double)i * (rank + 1) + t));
        }
        if (t == sc->nan_iter && rank == 0) x[0] = NAN;
        gvqCompressorStats_t st;
        gvqCompressorGetStats(comp, &st);
        if (rank == 0 && it < 64) sc->phases[it] = st.phase;
        EXPECT_RES(gvqAllReduceCompressed(x, y, sc->count, gvqFloat32, gvqSum, comp, comm, NULL),
                   gvqSuccess);
        if (rank == 0 && it < 64 && sc->noise_from < 0) {
            double e2 = 0, n2 = 0;
            for (size_t i = 0; i < sc->count; i++) {
                double want = exact_sum(nranks, t, i);
                e2 += (y[i] - want) * (y[i] - want);
                n2 += want * want;
            }
            sc->err[it] = sqrt(e2 / n2);
        }
        if (sc->save_path && it == sc->save_at && rank == 0)
            EXPECT_RES(gvqCompressorSaveFile(comp, sc->save_path), gvqSuccess);
    }
    gvqCompressorGetStats(comp, &sc->st[rank]);
    sc->out[rank] = y;
    free(x);
    EXPECT_RES(gvqCompressorDestroy(comp), gvqSuccess);
    /* a destroyed handle is refused by the registry, never read (ASan would see a read) */
    gvqCompressorStats_t st;
    EXPECT_RES(gvqCompressorGetStats(comp, &st), gvqInvalidArgument);
    EXPECT_RES(gvqCompressorDestroy(comp), gvqInvalidArgument);
    EXPECT_RES(gvqCompressorSave(comp, NULL, &(size_t){0}), gvqInvalidArgument);
}

static gvqCompressorConfig_t base_cfg(void) {
    gvqCompressorConfig_t c = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    c.codec = gvqCodecGradiveq;
    c.sliceSize = SL;
    c.lossThreshold = 0.01f;
    c.warmupIters = 2;
    c.sampleIters = 6;
    c.maxDims = 8;
    c.compressedIters = 4;
    return c;
}

static void free_outs(sched_t *sc, int n) {
    for (int r = 0; r < n; r++)
        free(sc->out[r]), sc->out[r] = NULL;
}

static void test_schedule(void) {
    for (int n = 1; n <= 4; n++) {
        sched_t sc;
        memset(&sc, 0, sizeof sc);
        sc.count = SL * 20 + 5; /* 20 slices and a tail */
        sc.cfg = base_cfg();
        sc.iters = 20;
        sc.nan_iter = -1;
        sc.noise_from = -1;
        gvq_test_run(n, NULL, rank_sched, &sc);
        /* calls 0-1 warm-up, 2-7 sampling, fit at the end of call 7, 8-11 compressed, 12-17
         * sampling, second fit, 18-19 compressed */
        for (int it = 0; it < 20; it++) {
            int want = it < 2    ? gvqPhaseWarmup
                       : it < 8  ? gvqPhaseSample
                       : it < 12 ? gvqPhaseCompressed
                       : it < 18 ? gvqPhaseSample
                                 : gvqPhaseCompressed;
            EXPECT(sc.phases[it] == want, "n=%d call %d: phase %d, want %d", n, it, sc.phases[it],
                   want);
            if (sc.phases[it] != gvqPhaseCompressed)
                EXPECT(sc.err[it] < 1e-6, "n=%d call %d (uncompressed) error %g", n, it,
                       sc.err[it]);
            else
                EXPECT(sc.err[it] < 1e-4, "n=%d call %d (compressed, exact low rank) error %g", n,
                       it, sc.err[it]);
        }
        EXPECT(sc.st[0].dims == RANK, "n=%d: d=%d, the data has rank %d", n, sc.st[0].dims, RANK);
        EXPECT(sc.st[0].fits == 2 && sc.st[0].earlyExits == 0, "n=%d fits %lld exits %lld", n,
               sc.st[0].fits, sc.st[0].earlyExits);
        EXPECT(fabs(sc.st[0].ratio - (double)(sc.count * 4) / (20 * RANK * 4 + 5 * 4)) < 1e-9,
               "ratio %g", sc.st[0].ratio);
        EXPECT(n == 1 || sc.st[0].wireBytes < sc.st[0].rawBytes, "wire %llu raw %llu",
               sc.st[0].wireBytes, sc.st[0].rawBytes);
        for (int r = 1; r < n; r++)
            EXPECT(memcmp(sc.out[r], sc.out[0], sc.count * 4) == 0, "n=%d rank %d output differs",
                   n, r);
        free_outs(&sc, n);
    }
}

static void test_early_exit_and_nan(void) {
    sched_t sc;
    memset(&sc, 0, sizeof sc);
    sc.count = SL * 8;
    sc.cfg = base_cfg();
    sc.cfg.compressedIters = 10;
    sc.iters = 12;
    sc.nan_iter = -1;
    sc.noise_from = 9; /* compressed from call 8; call 9 leaves the subspace: every rank votes */
    gvq_test_run(3, NULL, rank_sched, &sc);
    EXPECT(sc.phases[8] == gvqPhaseCompressed && sc.phases[9] == gvqPhaseCompressed, "phases %d %d",
           sc.phases[8], sc.phases[9]);
    EXPECT(sc.phases[10] == gvqPhaseSample, "after the vote: phase %d", sc.phases[10]);
    EXPECT(sc.st[0].earlyExits == 1 && sc.st[0].lastLoss > 0.01, "exits %lld loss %g",
           sc.st[0].earlyExits, sc.st[0].lastLoss);
    free_outs(&sc, 3);

    /* voteThreshold >= 1 never exits early, even when the local loss (centred residual over the
     * uncentred norm) exceeds 1: a constant offset the centring removes, then tiny gradients
     * without it, whose loss is ~ ||offset|| / ||x|| >> 1 */
    memset(&sc, 0, sizeof sc);
    sc.count = SL * 8;
    sc.cfg = base_cfg();
    sc.cfg.compressedIters = 10;
    sc.cfg.voteThreshold = 1.0f;
    sc.iters = 12;
    sc.nan_iter = -1;
    sc.noise_from = -1;
    sc.offset = 2.0;
    sc.quiet_from = 9;
    gvq_test_run(3, NULL, rank_sched, &sc);
    EXPECT(sc.phases[8] == gvqPhaseCompressed && sc.phases[11] == gvqPhaseCompressed,
           "vote off: phases %d %d", sc.phases[8], sc.phases[11]);
    EXPECT(sc.st[0].lastLoss > 1.0, "vote off: the case should have a local loss above 1, got %g",
           sc.st[0].lastLoss);
    EXPECT(sc.st[0].earlyExits == 0, "vote off: %lld early exits (last loss %g)",
           sc.st[0].earlyExits, sc.st[0].lastLoss);
    free_outs(&sc, 3);

    memset(&sc, 0, sizeof sc);
    sc.count = SL * 8;
    sc.cfg = base_cfg();
    sc.cfg.warmupIters = 0;
    sc.iters = 14;
    sc.nan_iter = 3; /* a NaN while sampling: sent plain, not a sample, the fit one call later */
    sc.noise_from = -1;
    gvq_test_run(2, NULL, rank_sched, &sc);
    EXPECT(sc.st[0].fitsRefused == 0 && sc.st[1].fitsRefused == 0 && sc.st[0].nonFiniteCalls == 1 &&
               sc.st[1].nonFiniteCalls == 1,
           "refused %lld %lld, non-finite calls %lld %lld", sc.st[0].fitsRefused,
           sc.st[1].fitsRefused, sc.st[0].nonFiniteCalls, sc.st[1].nonFiniteCalls);
    EXPECT(sc.phases[6] == gvqPhaseSample && sc.phases[7] == gvqPhaseCompressed, "phases %d %d",
           sc.phases[6], sc.phases[7]);
    EXPECT(sc.st[0].fits == 1, "fits %lld", sc.st[0].fits);
    free_outs(&sc, 2);
}

/* sampleSlices: when the first slice of a group is not representative (it varies along one of
 * the three directions), the paper's first-slice sampling fits d = 1 and loses the rest of the
 * other slices; sampling every slice (0) or a spread of 4 fits d = 3 and reconstructs them. */
static void test_sample_slices(void) {
    first_slice_rank1 = 1;
    const int ss[3] = {1, 4, 0};
    for (int k = 0; k < 3; k++) {
        sched_t sc;
        memset(&sc, 0, sizeof sc);
        sc.count = SL * 20 + 5;
        sc.cfg = base_cfg();
        sc.cfg.sampleSlices = ss[k];
        sc.cfg.maxDims = 8;
        sc.iters = 10;
        sc.nan_iter = -1;
        sc.noise_from = -1;
        gvq_test_run(2, NULL, rank_sched, &sc);
        EXPECT(sc.phases[8] == gvqPhaseCompressed, "sampleSlices %d: phase %d", ss[k],
               sc.phases[8]);
        if (ss[k] == 1)
            EXPECT(sc.st[0].dims == 1 && sc.err[8] > 0.1,
                   "sampleSlices 1: d %d error %g (expected d 1 and a large error)", sc.st[0].dims,
                   sc.err[8]);
        else
            EXPECT(sc.st[0].dims == RANK && sc.err[8] < 1e-4 && sc.err[9] < 1e-4,
                   "sampleSlices %d: d %d errors %g %g (expected d %d, exact)", ss[k],
                   sc.st[0].dims, sc.err[8], sc.err[9], RANK);
        for (int r = 1; r < 2; r++)
            EXPECT(memcmp(sc.out[r], sc.out[0], sc.count * 4) == 0,
                   "sampleSlices %d: rank %d differs", ss[k], r);
        free_outs(&sc, 2);
    }
    first_slice_rank1 = 0;
}

/* gvqCompressorLoadShared (a rank that joins): the state of another rank without its residual.
 * A GradiVeQ state with error feedback ends with its residual (compressor_save.c's layout):
 * saved again after a shared load, it must hold zeros there and, before it, the bytes of the
 * state it came from but for the checksum (8 bytes of the header); after a plain load, the
 * residual as it was. */
static gvqCompressorConfig_t shared_c;
static size_t shared_count;
static const char *shared_path;

static void *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = len > 0 ? malloc((size_t)len) : NULL;
    *n = p != NULL && fread(p, 1, (size_t)len, f) == (size_t)len ? (size_t)len : 0;
    fclose(f);
    return p;
}

static void rank_load_shared(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)rank, (void)nranks, (void)arg;
    size_t n = 0, rb = sizeof(float) * shared_count;
    unsigned char *orig = read_all(shared_path, &n);
    EXPECT(orig != NULL && n > rb, "the saved state (%zu bytes) could not be read", n);
    if (orig == NULL || n <= rb) return;
    for (int shared = 0; shared < 2; shared++) {
        gvqCompressor_t c;
        EXPECT_RES(gvqCompressorCreate(comm, shared_count, &shared_c, &c), gvqSuccess);
        EXPECT_RES(shared ? gvqCompressorLoadShared(c, orig, n) : gvqCompressorLoad(c, orig, n),
                   gvqSuccess);
        size_t m = n;
        unsigned char *again = malloc(n);
        EXPECT_RES(gvqCompressorSave(c, again, &m), gvqSuccess);
        EXPECT(m == n, "saved again: %zu bytes, not %zu", m, n);
        size_t diff = 0, first = n, last = 0, nonzero = 0, orig_nonzero = 0;
        for (size_t i = 0; i < n - rb; i++)
            if (orig[i] != again[i]) {
                diff++;
                first = i < first ? i : first;
                last = i;
            }
        for (size_t i = n - rb; i < n; i++) {
            nonzero += again[i] != 0;
            orig_nonzero += orig[i] != 0;
        }
        EXPECT(diff == 0 || (last - first < 8 && first / 8 == last / 8),
               "%s load: %zu bytes before the residual differ (%zu..%zu)",
               shared ? "shared" : "own", diff, first, last);
        EXPECT(orig_nonzero > 0, "the saved residual is all zero: the test shows nothing");
        if (shared)
            EXPECT(nonzero == 0, "after a shared load %zu residual bytes are not zero", nonzero);
        else
            EXPECT(memcmp(orig + n - rb, again + n - rb, rb) == 0, "own load: another residual");
        free(again);
        EXPECT_RES(gvqCompressorDestroy(c), gvqSuccess);
    }
    /* the same refusals as gvqCompressorLoad */
    gvqCompressor_t c;
    EXPECT_RES(gvqCompressorCreate(comm, shared_count, &shared_c, &c), gvqSuccess);
    EXPECT_RES(gvqCompressorLoadShared(c, NULL, n), gvqInvalidArgument);
    orig[n / 2] ^= 1;
    EXPECT_RES(gvqCompressorLoadShared(c, orig, n), gvqInvalidArgument);
    EXPECT_RES(gvqCompressorDestroy(c), gvqSuccess);
    EXPECT_RES(gvqCompressorLoadShared(c, orig, n), gvqInvalidArgument); /* destroyed */
    free(orig);
}

static void test_save_load(void) {
    const char *path = "test_compressor_state.bin";
    sched_t a, b;
    memset(&a, 0, sizeof a);
    a.count = SL * 10 + 3;
    a.cfg = base_cfg();
    a.cfg.errorFeedback = 1;
    a.cfg.sampleSlices = 3; /* the samples of several slices per call travel in the state */
    a.iters = 16;
    a.nan_iter = -1;
    a.noise_from = -1;
    a.save_path = path;
    a.save_at = 9; /* after call 9: in the compressed phase */
    gvq_test_run(1, NULL, rank_sched, &a);
    /* resume from the file at call 10 and run the same 6 calls */
    memset(&b, 0, sizeof b);
    b.count = a.count;
    b.cfg = a.cfg;
    b.iters = 6;
    b.start_t = 10;
    b.nan_iter = -1;
    b.noise_from = -1;
    b.load_path = path;
    gvq_test_run(1, NULL, rank_sched, &b);
    EXPECT(memcmp(a.out[0], b.out[0], a.count * 4) == 0,
           "resumed run differs from the uninterrupted one");
    EXPECT(a.st[0].phase == b.st[0].phase && a.st[0].iteration == b.st[0].iteration,
           "state %d/%lld vs %d/%lld", a.st[0].phase, a.st[0].iteration, b.st[0].phase,
           b.st[0].iteration);
    shared_c = a.cfg;
    shared_count = a.count;
    shared_path = path;
    gvq_test_run(1, NULL, rank_load_shared, NULL);
    remove(path);
    free_outs(&a, 1);
    free_outs(&b, 1);
}

/* collocated element i of rank r at call t: two orthogonal directions per slice of 8 */
static double conv_val(int t, int r, size_t i) {
    double ph = 6.283185307179586 * (double)(i % 8) / 8;
    return sin(t + r + 0.3 * (double)(i / 8)) * cos(ph) + cos(2.7 * t + 0.5 * r) * sin(ph);
}

static void rank_conv(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)arg;
    /* a conv layer K=4 D=2 H=3 W=3 whose gradient is rank-2 in the collocated slices */
    size_t K = 4, D = 2, H = 3, W = 3, M = K * D * H * W;
    gvqCompressorConfig_t cfg = base_cfg();
    cfg.filters = (int)K, cfg.depth = (int)D, cfg.height = (int)H, cfg.width = (int)W;
    cfg.sliceSize = 8;
    cfg.warmupIters = 0;
    cfg.sampleIters = 6;
    cfg.compressedIters = 100;
    gvqCompressor_t comp;
    EXPECT_RES(gvqCompressorCreate(comm, M, &cfg, &comp), gvqSuccess);
    float x[72], y[72], col[72];
    for (int t = 0; t < 10; t++) {
        for (size_t i = 0; i < M; i++) /* defined in collocated order, stored in tensor order */
            col[i] = (float)conv_val(t, rank, i);
        gvq_uncollocate(col, x, K, D, H, W);
        EXPECT_RES(gvqAllReduceCompressed(x, y, M, gvqFloat32, gvqAvg, comp, comm, NULL),
                   gvqSuccess);
        double e2 = 0, n2 = 0;
        for (size_t i = 0; i < M; i++) {
            double want = 0;
            for (int r = 0; r < nranks; r++) {
                size_t j; /* tensor index i -> collocated index */
                size_t k = i / (D * H * W), d = (i / (H * W)) % D, h = (i / W) % H, w = i % W;
                j = ((h * W + w) * D + d) * K + k;
                want += conv_val(t, r, j);
            }
            want /= nranks;
            e2 += (y[i] - want) * (y[i] - want);
            n2 += want * want;
        }
        EXPECT(sqrt(e2 / n2) < 1e-4, "conv t=%d rank %d error %g", t, rank, sqrt(e2 / n2));
        if (sqrt(e2 / n2) >= 1e-4) {
            gvqCompressorStats_t st;
            gvqCompressorGetStats(comp, &st);
            fprintf(stderr, "  d=%d kept %g phase %d\n", st.dims, st.keptEnergy, st.phase);
        }
    }
    gvqCompressorStats_t st;
    gvqCompressorGetStats(comp, &st);
    EXPECT(st.phase == gvqPhaseCompressed && st.dims == 2, "conv: phase %d d %d", st.phase,
           st.dims);
    gvqCompressorDestroy(comp);
}

static void rank_qsgd(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)arg;
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = gvqCodecQsgd;
    cfg.qsgdBits = 8;
    cfg.qsgdBucket = 128;
    gvqCompressor_t comp;
    size_t M = 3000;
    EXPECT_RES(gvqCompressorCreate(comm, M, &cfg, &comp), gvqSuccess);
    float *x = malloc(M * 4), *y = malloc(M * 4);
    for (size_t i = 0; i < M; i++)
        x[i] = grad(rank, 1, i);
    EXPECT_RES(gvqAllReduceCompressed(x, y, M, gvqFloat32, gvqSum, comp, comm, NULL), gvqSuccess);
    double e2 = 0, n2 = 0;
    for (size_t i = 0; i < M; i++) {
        double want = exact_sum(nranks, 1, i);
        e2 += (y[i] - want) * (y[i] - want), n2 += want * want;
    }
    EXPECT(sqrt(e2 / n2) < 0.05, "QSGD compressor error %g", sqrt(e2 / n2));
    gvqCompressorStats_t st;
    gvqCompressorGetStats(comp, &st);
    EXPECT(fabs(st.ratio - 12000.0 / (23 * 132 + 4 + 56)) < 1e-9 && st.phase == gvqPhasePlain,
           "QSGD ratio %g phase %d", st.ratio, st.phase);
    free(x), free(y);
    gvqCompressorDestroy(comp);
}

static void rank_refusals(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)rank, (void)nranks, (void)arg;
    struct {
        const char *field;
        gvqCompressorConfig_t cfg;
        size_t count;
    } bad[12];
    for (int i = 0; i < 12; i++)
        bad[i].cfg = base_cfg(), bad[i].count = 64;
    bad[0].field = "sliceSize", bad[0].cfg.filters = 4, bad[0].cfg.width = 16,
    bad[0].cfg.sliceSize = 6;
    bad[1].field = "shape", bad[1].cfg.filters = 4, bad[1].cfg.width = 5;
    bad[2].field = "lossThreshold", bad[2].cfg.lossThreshold = 1.5f;
    bad[3].field = "codec", bad[3].cfg.codec = 9;
    bad[4].field = "qsgdBits", bad[4].cfg.qsgdBits = 3;
    bad[5].field = "maxDims", bad[5].cfg.maxDims = SL + 1;
    bad[6].field = "wireType", bad[6].cfg.wireType = gvqInt32;
    bad[7].field = "sampleIters", bad[7].cfg.sampleIters = 0;
    bad[8].field = "magic", bad[8].cfg.magic = 1;
    bad[9].field = "count", bad[9].count = 0;
    bad[10].field = "voteThreshold", bad[10].cfg.voteThreshold = 0.0f;
    bad[11].field = "sampleSlices", bad[11].cfg.sampleSlices = -2;
    for (int i = 0; i < 12; i++) {
        gvqCompressor_t c = NULL;
        EXPECT_RES(gvqCompressorCreate(comm, bad[i].count, &bad[i].cfg, &c), gvqInvalidArgument);
        EXPECT(strstr(gvqGetLastError(comm), bad[i].field) != NULL ||
                   (i == 8 && strstr(gvqGetLastError(comm), "INITIALIZER")),
               "refusal %d does not name '%s': %s", i, bad[i].field, gvqGetLastError(comm));
    }
    gvqCompressor_t c;
    gvqCompressorConfig_t cfg = base_cfg();
    EXPECT_RES(gvqCompressorCreate(comm, 64, &cfg, &c), gvqSuccess);
    float x[64] = {0};
    EXPECT_RES(gvqAllReduceCompressed(x, x, 63, gvqFloat32, gvqSum, c, comm, NULL),
               gvqInvalidArgument);
    EXPECT_RES(gvqAllReduceCompressed(x, x, 64, gvqFloat64, gvqSum, c, comm, NULL),
               gvqInvalidArgument);
    EXPECT_RES(gvqAllReduceCompressed(x, x, 64, gvqFloat32, gvqMax, c, comm, NULL),
               gvqInvalidArgument);
    EXPECT_RES(gvqAllReduceCompressed(NULL, x, 64, gvqFloat32, gvqSum, c, comm, NULL),
               gvqInvalidArgument);
    EXPECT_RES(gvqGroupStart(), gvqSuccess); /* queued, run at the group's end */
    EXPECT_RES(gvqAllReduceCompressed(x, x, 64, gvqFloat32, gvqSum, c, comm, NULL), gvqSuccess);
    EXPECT_RES(gvqAllReduceCompressed(x, x, 63, gvqFloat32, gvqSum, c, comm, NULL),
               gvqInvalidArgument); /* refused at once: the group runs nothing */
    EXPECT_RES(gvqGroupEnd(), gvqInvalidArgument);
    char small[8];
    size_t n = sizeof small;
    EXPECT_RES(gvqCompressorSave(c, small, &n), gvqInvalidArgument);
    EXPECT(n > sizeof small, "size needed %zu", n);
    EXPECT_RES(gvqCompressorLoad(c, small, sizeof small), gvqInvalidArgument);
    EXPECT_RES(gvqCompressorDestroy(c), gvqSuccess);
}

/* Finite samples whose covariance overflows (|x| near FLT_MAX): the eigen-solve fails, and the
 * fit is refused like a non-finite one on every rank (the tensor stays uncompressed), never a
 * failed call (found by fuzz_compressor_state through a loaded state). */
static void rank_huge(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)rank, (void)arg;
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = gvqCodecGradiveq;
    cfg.sliceSize = 16;
    cfg.sampleIters = 3;
    cfg.compressedIters = 5;
    cfg.sampleSlices = 0;
    gvqCompressor_t c;
    EXPECT_RES(gvqCompressorCreate(comm, 64, &cfg, &c), gvqSuccess);
    float x[64], y[64];
    for (int t = 0; t < 6; t++) {
        for (int i = 0; i < 64; i++) /* the sum of the ranks stays finite */
            x[i] = (i + t) % 3 == 0 ? 3.0e38f / (float)nranks : -2.5e38f / (float)nranks;
        EXPECT_RES(gvqAllReduceCompressed(x, y, 64, gvqFloat32, gvqSum, c, comm, NULL), gvqSuccess);
    }
    gvqCompressorStats_t st;
    EXPECT_RES(gvqCompressorGetStats(c, &st), gvqSuccess);
    EXPECT(st.fitsRefused >= 1 && st.fits == 0, "fits %lld refused %lld", st.fits, st.fitsRefused);
    EXPECT_RES(gvqCompressorDestroy(c), gvqSuccess);
}

/* Tracked-basis and PowerSGD compressors grouped (gvqGroupStart/End: one fused call of three
 * rings, one of two) beside a QSGD one, the tracked ones fp32 and on the 16-bit wire, blocking
 * and on a host stream: every rank gets the same bits, the stream's group the blocking group's
 * bits (fresh compressors, the same calls), and fp32 stays within 1e-4 of the same calls made
 * one by one. Under TSan/ASan in CI. */
enum { TG = 6, TG_CALLS = 3 };
/* 0, 1: tracked basis; 2, 5: QSGD (fused: the bits of the lone calls); 3, 4: PowerSGD */
static const size_t tg_count[TG] = {16 * 4 * 9, 1000, 777, 16 * 4 * 9, 640, 300};
static float *tg_out[4][TG]; /* the last call's grouped results, per rank */

static void tg_make(gvqComm_t comm, int bits, gvqCompressor_t *c) {
    for (int i = 0; i < TG; i++) {
        gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        cfg.codec = i == 2 || i == 5 ? gvqCodecQsgd : i > 2 ? gvqCodecPowersgd : gvqCodecGradiveq;
        cfg.powerRank = 2;
        if (i < 2) {
            cfg.basisUpdate = gvqBasisTrack;
            cfg.maxDims = 2;
            cfg.integerBits = bits;
        }
        if (i == 0 || i == 3) cfg.filters = 16, cfg.depth = 4, cfg.height = cfg.width = 3;
        EXPECT_RES(gvqCompressorCreate(comm, tg_count[i], &cfg, &c[i]), gvqSuccess);
    }
}

/* TG_CALLS grouped calls (on stream s, or blocking) into out. */
static void tg_calls(gvqComm_t comm, int rank, gvqCompressor_t *c, gvqStream_t s, float **out) {
    for (int t = 0; t < TG_CALLS; t++) {
        for (int i = 0; i < TG; i++)
            for (size_t j = 0; j < tg_count[i]; j++)
                out[i][j] = grad(rank, t * TG + i, j);
        EXPECT_RES(gvqGroupStart(), gvqSuccess);
        for (int i = 0; i < TG; i++)
            EXPECT_RES(gvqAllReduceCompressed(out[i], out[i], tg_count[i], gvqFloat32, gvqAvg, c[i],
                                              comm, s),
                       gvqSuccess);
        EXPECT_RES(gvqGroupEnd(), gvqSuccess);
        if (s != NULL) EXPECT_RES(gvqStreamSynchronize(s), gvqSuccess);
    }
}

static void rank_track_group(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)nranks;
    int bits = *(const int *)arg;
    gvqCompressor_t a[TG], b[TG], one[TG];
    tg_make(comm, bits, a);
    tg_make(comm, bits, b);
    tg_make(comm, bits, one);
    float *ys[TG], *y1[TG];
    for (int i = 0; i < TG; i++) {
        tg_out[rank][i] = malloc(tg_count[i] * 4);
        ys[i] = malloc(tg_count[i] * 4);
        y1[i] = malloc(tg_count[i] * 4);
    }
    gvqStream_t s = NULL;
    EXPECT_RES(gvqStreamCreate(&s), gvqSuccess);
    tg_calls(comm, rank, a, NULL, tg_out[rank]);
    tg_calls(comm, rank, b, s, ys);
    for (int t = 0; t < TG_CALLS; t++) /* one by one */
        for (int i = 0; i < TG; i++) {
            for (size_t j = 0; j < tg_count[i]; j++)
                y1[i][j] = grad(rank, t * TG + i, j);
            EXPECT_RES(gvqAllReduceCompressed(y1[i], y1[i], tg_count[i], gvqFloat32, gvqAvg, one[i],
                                              comm, NULL),
                       gvqSuccess);
        }
    for (int i = 0; i < TG; i++) {
        EXPECT(memcmp(ys[i], tg_out[rank][i], tg_count[i] * 4) == 0,
               "int%d tensor %d: the stream's group differs from the blocking group", bits, i);
        double e2 = 0, n2 = 0;
        for (size_t j = 0; j < tg_count[i]; j++)
            e2 += (ys[i][j] - y1[i][j]) * (ys[i][j] - y1[i][j]), n2 += y1[i][j] * y1[i][j];
        EXPECT((bits != 0 && i < 3) || i == 2 || i == 5 || sqrt(e2 / n2) < 1e-4,
               "tensor %d: grouped and one-by-one calls differ by %g (relative)", i, sqrt(e2 / n2));
        /* QSGD: the fused ring gives each value its lone call's arithmetic and random bits */
        EXPECT((i != 2 && i != 5) || memcmp(ys[i], y1[i], tg_count[i] * 4) == 0,
               "QSGD tensor %d: grouped and one-by-one calls differ (by %g relative)", i,
               sqrt(e2 / n2));
        free(ys[i]), free(y1[i]);
        gvqCompressorDestroy(a[i]), gvqCompressorDestroy(b[i]), gvqCompressorDestroy(one[i]);
    }
    EXPECT_RES(gvqStreamDestroy(s), gvqSuccess);
}

static void test_track_group(void) {
    for (int bits = 0; bits <= 16; bits += 16)
        for (int n = 1; n <= 3; n++) {
            gvq_test_run(n, NULL, rank_track_group, &bits);
            for (int i = 0; i < TG; i++)
                for (int r = 0; r < n; r++) {
                    EXPECT(memcmp(tg_out[r][i], tg_out[0][i], tg_count[i] * 4) == 0,
                           "int%d, %d ranks: tensor %d differs between ranks 0 and %d", bits, n, i,
                           r);
                    free(r > 0 ? tg_out[r][i] : NULL);
                }
            for (int i = 0; i < TG; i++)
                free(tg_out[0][i]);
        }
}

int main(void) {
    for (int n = 1; n <= 2; n++)
        gvq_test_run(n, NULL, rank_huge, NULL);
    gvq_test_run(1, NULL, rank_refusals, NULL);
    test_schedule();
    test_early_exit_and_nan();
    test_sample_slices();
    test_save_load();
    for (int n = 1; n <= 3; n++)
        gvq_test_run(n, NULL, rank_conv, NULL);
    for (int n = 1; n <= 4; n++)
        gvq_test_run(n, NULL, rank_qsgd, NULL);
    test_track_group();
    return gvq_test_finish("test_compressor");
}
