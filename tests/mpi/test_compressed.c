/*
 * test_compressed.c -- compressed allreduce (GradiVeQ, QSGD) under mpirun, on 1..5 ranks, with
 * the NCCL bootstrap (gvqGetUniqueId on rank 0, MPI_Bcast, gvqCommInitRank).
 *
 * References: every rank's input is a pure function of (generator, rank, call, index); each rank
 * regenerates all ranks' inputs and sums them in double. Integer and max allreduces are checked
 * against MPI_Allreduce. Nothing is compared with gvq's output except (a) all ranks' outputs must
 * be bitwise identical (FNV-1a hashes, MPI_Allgather) and (b) a job restarted from saved
 * compressor states must reproduce, bit for bit, the run that was not interrupted.
 *
 * Parts (no argument):
 *   1 gradiveq   five GradiVeQ compressors created in one order and called interleaved (fits of
 *                tensor t, group g land on rank (t+g) mod N): per call the phase of the schedule
 *                (W=2 warm-up, T=8 sampling, S=5 compressed, again), exact sums while
 *                uncompressed, < 1e-4 relative error while compressed (the data are exactly
 *                rank 4 per slice of 32), d == 4, the closed-form ratio, wire < raw bytes,
 *                identical outputs; fp32 and fp16 wires, sum and avg, in and out of place, one
 *                and several reuse groups, and a tensor of one slice (most ring segments
 *                empty).
 *   2 conv       a conv-shaped compressor [K][D][H][W] whose filter-collocated slices are rank 3:
 *                correct results in the tensor's own layout (the layout mapping is written here).
 *   3 qsgd       QSGD compressors (8 and 4 bits, max norm, bucket 512): identical outputs, error
 *                within a bound derived from the QSGD variance, the closed-form ratio, a tensor
 *                shorter than one bucket, and unbiasedness (the mean of 200 calls on one input
 *                is much closer than one call).
 *   4 nan        a NaN on one rank, during sampling and in the compressed phase, error feedback
 *                on: each gives the plain sum on every rank (counted in nonFiniteCalls), stays
 *                out of the schedule, the fit and the residual: the round fits, later
 *                compressed calls stay accurate.
 *   1b, 2b       parts 1 and 2 again on a communicator with 512-byte ring chunks (several
 *                pipelined chunks per ring segment, in the compressed domain too).
 *   5 saveload   three compressors run 16 calls uninterrupted; then the same job is stopped after
 *                5 calls (states saved to buffers, compressors and communicator destroyed, a new
 *                communicator made, states loaded) and after 11 calls (the same through files):
 *                every output must equal the uninterrupted run's bit for bit.
 * Argument "zerocode" (run with GVQ_CODEC=gradiveq): plain gvqAllReduce calls on one buffer are
 *   exact for the first 100 calls (the default T), compressed afterwards (close to the sum, and a
 *   component outside the fitted subspace is dropped), while int32 sums and float max on other
 *   buffers stay exact (equal to MPI_Allreduce) throughout.
 *
 * A watchdog (alarm) turns a hang into a failure that names the part.
 */
#include <inttypes.h>
#include <math.h>
#include <strings.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gvq.h"
#include "mpitest.h"

#define WATCHDOG_S 100
#define TWO_PI 6.283185307179586

static const char *g_part = "start";

static void watchdog(int sig) {
    (void)sig;
    char msg[160];
    int n = snprintf(msg, sizeof msg,
                     "FAIL [rank %d] watchdog: no progress for %d s in part '%s' "
                     "(hang?)\n",
                     mt.rank, WATCHDOG_S, g_part);
    if (n > 0) {
        ssize_t w = write(1, msg, (size_t)n);
        (void)w;
    }
    _exit(3);
}

static void part(const char *name) {
    g_part = name;
    alarm(WATCHDOG_S);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt.rank == 0) {
        printf("-- %s (%.1f s)\n", name, MPI_Wtime() - mt.t0);
        fflush(stdout);
    }
}

/* ---- helpers ------------------------------------------------------------------------------ */

/* The NCCL bootstrap; chunk_bytes > 0 sets the ring's pipeline chunk through the config. */
static gvqComm_t new_comm_chunk(int chunk_bytes) {
    gvqUniqueId id;
    memset(&id, 0, sizeof id);
    if (mt.rank == 0) MT_OK(gvqGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    gvqComm_t comm = NULL;
    gvqResult_t res;
    if (chunk_bytes > 0) {
        gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
        cfg.chunkBytes = chunk_bytes;
        res = gvqCommInitRankConfig(&comm, mt.nranks, id, mt.rank, &cfg);
    } else {
        res = gvqCommInitRank(&comm, mt.nranks, id, mt.rank);
    }
    MT_CHECK(res == gvqSuccess && comm != NULL, "gvqCommInitRank(%d, rank %d): %d (%s): %s",
             mt.nranks, mt.rank, (int)res, gvqGetErrorString(res), gvqGetLastError(NULL));
    if (comm == NULL) {
        printf("FAIL [rank %d] no communicator: cannot continue\n", mt.rank);
        fflush(stdout);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return comm;
}

static gvqComm_t new_comm(void) {
    return new_comm_chunk(0);
}

static uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
#define FNV_INIT 0xcbf29ce484222325ull

/* All ranks' buffers must be bitwise identical; reported once, by rank 0. */
static void check_identical(const void *buf, size_t bytes, const char *what, int call) {
    uint64_t h = fnv1a(buf, bytes, FNV_INIT);
    uint64_t *all = malloc(sizeof(uint64_t) * (size_t)mt.nranks);
    MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    if (mt.rank == 0) {
        int bad = -1;
        for (int r = 1; r < mt.nranks && bad < 0; r++)
            if (all[r] != all[0]) bad = r;
        MT_CHECK(bad < 0,
                 "%s call %d: output of rank %d differs from rank 0's (hash %016" PRIx64
                 " vs %016" PRIx64 ")",
                 what, call, bad, bad < 0 ? 0 : all[bad], all[0]);
    }
    free(all);
}

static double elapsed(void) {
    return MPI_Wtime() - mt.t0;
}

/* ---- low-rank gradients --------------------------------------------------------------------
 * Element i of rank r at call t of a tensor cut into slices of L: in every full slice s,
 *     x = o + sum_{j<rank} a_j(r, t, s) b_j
 * with b_j orthogonal directions of equal norm (cos/sin of the first two harmonics over the
 * slice) and o a common offset (the same on every rank, orthogonal to the b_j) that the
 * whitening vector Z must carry. The tail shorter than L is arbitrary.
 *
 * The coefficients oscillate over the calls with the first two Fourier frequencies of the
 * compressor's sampling window T (cos/sin of 2 pi t/T, cos/sin of 4 pi t/T, shifted per slice):
 * over ANY T consecutive calls these series have mean zero, are exactly orthogonal and carry
 * equal energy (T >= 5), so the summed samples have rank(data) equal eigenvalues and the PCA
 * must find d == rank for any eps. (Incommensurate low frequencies, as in the unit test, are not
 * enough over 5-6 samples: three of them left the third eigenvalue with 0.2% of the variance
 * and d came out 2.) Rank r adds (r - (N-1)/2) times a neighbouring series, which cancels in
 * the sum: every rank's input differs, all lie in the subspace. */
typedef struct {
    int L;
    int rank; /* 1..4 */
    double seed;
    size_t nfull;
    int T; /* sampling window of the compressor */
} lr_t;

static lr_t lr_make(size_t count, int L, int rank, double seed, int T) {
    lr_t g = {L, rank, seed, count / (size_t)L, T};
    return g;
}

static double lr_dir(int j, size_t e, int L) {
    double ph = TWO_PI * (double)e / L;
    switch (j) {
    case 0:
        return cos(ph);
    case 1:
        return sin(ph);
    case 2:
        return cos(2 * ph);
    default:
        return sin(2 * ph);
    }
}

static double lr_series(int j, double u, int T) {
    double w = TWO_PI / T;
    switch (j) {
    case 0:
        return cos(w * u);
    case 1:
        return sin(w * u);
    case 2:
        return cos(2 * w * u);
    default:
        return sin(2 * w * u);
    }
}

static double lr_coef(const lr_t *g, int j, int r, int t, size_t s) {
    double u = t + 0.9 * (double)s + g->seed;
    return (1.0 + 0.15 * r) * lr_series(j, u, g->T) +
           0.3 * (r - 0.5 * (mt.nranks - 1)) * lr_series((j + 1) % g->rank, u, g->T);
}

static float lr_val(const lr_t *g, int r, int t, size_t i) {
    size_t s = i / (size_t)g->L, e = i % (size_t)g->L;
    if (s >= g->nfull) return (float)(0.7 * sin(1.3 * (double)i + 0.77 * t + 0.5 * r + g->seed));
    double ph = TWO_PI * (double)e / g->L;
    double v = 0.25 + 0.2 * cos(3 * ph); /* the common offset */
    for (int j = 0; j < g->rank; j++)
        v += lr_coef(g, j, r, t, s) * lr_dir(j, e, g->L);
    return (float)v;
}

/* A component outside the span of the b_j and the offset (5th harmonic). */
static double lr_outside(size_t e, int L) {
    return 0.5 * sin(5 * TWO_PI * (double)e / L);
}

/* ---- conv gradients: rank 3 in the filter-collocated order ---------------------------------
 * Tensor layout [K][D][H][W]; collocated index j = ((h*W + w)*D + d)*K + k (docs/ALGORITHMS.md 2).
 */
typedef struct {
    size_t K, D, H, W;
    lr_t col; /* generator of the collocated vector */
} conv_t;

static size_t conv_collocated_index(const conv_t *c, size_t i) {
    size_t w = i % c->W, h = (i / c->W) % c->H, d = (i / (c->W * c->H)) % c->D,
           k = i / (c->W * c->H * c->D);
    return ((h * c->W + w) * c->D + d) * c->K + k;
}

static float conv_val(const conv_t *c, int r, int t, size_t i) {
    return lr_val(&c->col, r, t, conv_collocated_index(c, i));
}

/* ---- QSGD test gradients: a component common to all ranks plus a rank-specific one ---------- */
static float q_val(int r, int t, size_t i) {
    double x = (double)i;
    return (float)(sin(0.37 * x + 0.2 * t) * (1 + 0.5 * cos(0.013 * x)) +
                   0.4 * sin(2.3 * x + 1.1 * r + 0.1 * t));
}

/* ---- generic input source ------------------------------------------------------------------ */
typedef enum { SRC_LR, SRC_CONV, SRC_QSGD } src_kind_t;
typedef struct {
    src_kind_t kind;
    lr_t lr;
    conv_t conv;
} src_t;

static float src_val(const src_t *s, int r, int t, size_t i) {
    switch (s->kind) {
    case SRC_LR:
        return lr_val(&s->lr, r, t, i);
    case SRC_CONV:
        return conv_val(&s->conv, r, t, i);
    default:
        return q_val(r, t, i);
    }
}

static void src_fill(const src_t *s, int r, int t, float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] = src_val(s, r, t, i);
}

/* Double-precision reference over all ranks: ref = sum (or mean), absum = sum |x_r|,
 * *xnorm_sum = sum_r ||x_r||. */
static void reference(const src_t *s, int t, size_t n, int avg, double *ref, double *absum,
                      double *xnorm_sum) {
    int N = mt.nranks;
    double *xn2 = calloc((size_t)N, sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double sum = 0, a = 0;
        for (int r = 0; r < N; r++) {
            double v = src_val(s, r, t, i);
            sum += v;
            a += fabs(v);
            xn2[r] += v * v;
        }
        ref[i] = avg ? sum / N : sum;
        absum[i] = avg ? a / N : a;
    }
    if (xnorm_sum != NULL) {
        double sn = 0;
        for (int r = 0; r < N; r++)
            sn += sqrt(xn2[r]);
        *xnorm_sum = avg ? sn / N : sn;
    }
    free(xn2);
}

/* Float sums of N terms in any order: |y - ref| <= (N+1) u sum|x| (u = 2^-24; +1 for the
 * division of avg). Returns the worst ratio err / allowed and its index. */
static double exact_worst(const float *y, const double *ref, const double *absum, size_t n,
                          size_t *at) {
    double tol_u = (mt.nranks + 1) * 5.97e-8, worst = 0;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double allowed = tol_u * absum[i] + 1e-30;
        double q = isnan(y[i]) ? INFINITY : fabs(y[i] - ref[i]) / allowed;
        if (q > worst) worst = q, *at = i;
    }
    return worst;
}

static double rel_l2(const float *y, const double *ref, size_t n) {
    double e2 = 0, n2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)y[i] - ref[i];
        e2 += d * d;
        n2 += ref[i] * ref[i];
    }
    return sqrt(e2 / (n2 > 0 ? n2 : 1));
}

/* ---- the schedule, modelled independently ------------------------------------------------- */
typedef struct {
    int W, T, S;
    int phase;
    long phase_iter, fits;
} model_t;

static model_t model_make(int W, int T, int S) {
    model_t m = {W, T, S, W > 0 ? gvqPhaseWarmup : gvqPhaseSample, 0, 0};
    return m;
}

static void model_enter(model_t *m, int phase) {
    m->phase = phase;
    m->phase_iter = 0;
}

/* One call without early exit or refusal. */
static void model_step(model_t *m) {
    m->phase_iter++;
    if (m->phase == gvqPhaseWarmup && m->phase_iter >= m->W) {
        model_enter(m, gvqPhaseSample);
    } else if (m->phase == gvqPhaseSample && m->phase_iter >= m->T) {
        m->fits++;
        model_enter(m, gvqPhaseCompressed);
    } else if (m->phase == gvqPhaseCompressed && m->phase_iter >= m->S) {
        model_enter(m, gvqPhaseSample);
    }
}

static const char *phase_name(int p) {
    switch (p) {
    case gvqPhaseWarmup:
        return "warmup";
    case gvqPhaseSample:
        return "sample";
    case gvqPhaseCompressed:
        return "compressed";
    case gvqPhasePlain:
        return "plain";
    default:
        return "?";
    }
}

/* ---- part 1 (and 2): GradiVeQ tensors called interleaved ----------------------------------- */
typedef struct {
    const char *name;
    size_t count;
    src_t src;
    gvqCompressorConfig_t cfg;
    gvqRedOp_t op;
    int inplace;
    int fp16;
    int d_want;         /* rank of the data */
    size_t nfull, tail; /* of the (collocated) tensor, for the ratio */
    gvqCompressor_t comp;
    model_t model;
    float *x, *y;
    double *ref, *absum;
    double max_err_compressed, max_exact_q;
    unsigned long long wire_prev, raw_prev;
    int compressed_calls;
} gq_tensor_t;

static void gq_setup(gq_tensor_t *g, gvqComm_t comm) {
    g->nfull = g->count / (size_t)g->cfg.sliceSize;
    g->tail = g->count % (size_t)g->cfg.sliceSize;
    g->model = model_make(g->cfg.warmupIters, g->cfg.sampleIters, g->cfg.compressedIters);
    g->x = malloc(sizeof(float) * g->count);
    g->y = malloc(sizeof(float) * g->count);
    g->ref = malloc(sizeof(double) * g->count);
    g->absum = malloc(sizeof(double) * g->count);
    g->max_err_compressed = g->max_exact_q = 0;
    g->wire_prev = g->raw_prev = 0;
    g->compressed_calls = 0;
    g->comp = NULL;
    MT_OK(gvqCompressorCreate(comm, g->count, &g->cfg, &g->comp));
}

static void gq_free(gq_tensor_t *g) {
    if (g->comp != NULL) MT_OK(gvqCompressorDestroy(g->comp));
    free(g->x), free(g->y), free(g->ref), free(g->absum);
}

/* One call of tensor g at call index t, with every check of part 1. */
static void gq_call(gq_tensor_t *g, gvqComm_t comm, int t) {
    int N = mt.nranks, avg = g->op == gvqAvg;
    float *send = g->inplace ? g->y : g->x;
    src_fill(&g->src, mt.rank, t, send, g->count);
    if (!g->inplace) memset(g->y, 0xff, sizeof(float) * g->count); /* NaN garbage */
    gvqCompressorStats_t st0, st;
    MT_OK(gvqCompressorGetStats(g->comp, &st0));
    int want = g->model.phase;
    MT_CHECK(st0.phase == want && st0.phaseIter == g->model.phase_iter,
             "%s call %d: before the call phase %s/%lld, want %s/%ld", g->name, t,
             phase_name(st0.phase), st0.phaseIter, phase_name(want), g->model.phase_iter);
    MT_OK(gvqAllReduceCompressed(send, g->y, g->count, gvqFloat32, g->op, g->comp, comm, NULL));
    model_step(&g->model);
    MT_OK(gvqCompressorGetStats(g->comp, &st));
    MT_CHECK(st.iteration == t + 1 && st.fits == g->model.fits && st.phase == g->model.phase &&
                 st.earlyExits == 0 && st.fitsRefused == 0,
             "%s call %d: after the call iteration %lld fits %lld phase %s exits %lld refused "
             "%lld; want %d, %ld, %s, 0, 0 (reason '%s', lastLoss %g)",
             g->name, t, st.iteration, st.fits, phase_name(st.phase), st.earlyExits, st.fitsRefused,
             t + 1, g->model.fits, phase_name(g->model.phase), st.reason, st.lastLoss);
    MT_CHECK(st.codec == gvqCodecGradiveq && st.sliceSize == g->cfg.sliceSize,
             "%s: stats codec %d sliceSize %d", g->name, st.codec, st.sliceSize);

    double xnorm_sum = 0;
    reference(&g->src, t, g->count, avg, g->ref, g->absum, &xnorm_sum);
    if (want != gvqPhaseCompressed) {
        size_t at;
        double q = exact_worst(g->y, g->ref, g->absum, g->count, &at);
        if (q > g->max_exact_q) g->max_exact_q = q;
        MT_CHECK(q <= 1.0,
                 "%s call %d (%s, must be exact): element %zu = %.9g, reference %.9g "
                 "(error %.3g of the allowed rounding)",
                 g->name, t, phase_name(want), at, (double)g->y[at], g->ref[at], q);
    } else {
        g->compressed_calls++;
        double e = rel_l2(g->y, g->ref, g->count), n2 = 0;
        for (size_t i = 0; i < g->count; i++)
            n2 += g->ref[i] * g->ref[i];
        /* fp32 wire: the data lie in the fitted subspace, only float rounding remains.
         * fp16 wire: every coefficient is rounded to half (unit 2^-11) once per quantizing
         * hop, N times in all; coefficients of rank r have norm <= ||x_r - Z/N||, which we
         * bound by 2 ||x_r||: error <= N 2^-11 * 2 sum_r ||x_r||. */
        double tol = g->fp16 ? N * 4.8828125e-4 * 2.0 * xnorm_sum / sqrt(n2) : 1e-4;
        if (e > g->max_err_compressed) g->max_err_compressed = e;
        MT_CHECK(e < tol, "%s call %d (compressed, d=%d): relative error %.3g, allowed %.3g",
                 g->name, t, st.dims, e, tol);
        MT_CHECK(st.dims == g->d_want, "%s call %d: d = %d, the data have rank %d (kept %.6f)",
                 g->name, t, st.dims, g->d_want, st.keptEnergy);
        double ratio = (double)(g->count * 4) /
                       (double)(g->nfull * (size_t)g->d_want * (g->fp16 ? 2 : 4) + g->tail * 4);
        MT_CHECK(fabs(st.ratio - ratio) <= 1e-9 * ratio,
                 "%s call %d: ratio %.9g, closed form count*4/(full*d*%d + tail*4) = %.9g", g->name,
                 t, st.ratio, g->fp16 ? 2 : 4, ratio);
        if (N > 1)
            MT_CHECK(st.wireBytes - g->wire_prev < st.rawBytes - g->raw_prev,
                     "%s call %d (compressed): sent %llu bytes, a plain ring %llu", g->name, t,
                     st.wireBytes - g->wire_prev, st.rawBytes - g->raw_prev);
    }
    if (N > 1 && st.rawBytes <= g->raw_prev)
        MT_FAIL("%s call %d: rawBytes did not grow (%llu -> %llu)", g->name, t, g->raw_prev,
                st.rawBytes);
    g->wire_prev = st.wireBytes;
    g->raw_prev = st.rawBytes;
    check_identical(g->y, sizeof(float) * g->count, g->name, t);
}

static gvqCompressorConfig_t gq_cfg(int L, int W, int T, int S) {
    gvqCompressorConfig_t c = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    c.codec = gvqCodecGradiveq;
    c.sliceSize = L;
    c.lossThreshold = 0.01f;
    c.warmupIters = W;
    c.sampleIters = T;
    c.compressedIters = S;
    return c;
}

#define P1_L 32
#define P1_CALLS 25 /* W 0-1, sample 2-9, compressed 10-14, sample 15-22, compressed 23-24 */

static void part_gradiveq(gvqComm_t comm, const char *title) {
    part(title);
    enum { NT = 5 };
    gq_tensor_t t[NT];
    memset(t, 0, sizeof t);
    /* name, count (slices + tail), wire, op, in place, reuse */
    t[0].name = "A fp32 sum out-of-place";
    t[0].count = P1_L * 40 + 7;
    t[0].op = gvqSum;
    t[1].name = "B fp16 avg in-place";
    t[1].count = P1_L * 24 + 19;
    t[1].op = gvqAvg;
    t[1].inplace = 1;
    t[1].fp16 = 1;
    t[2].name = "C fp32 avg out-of-place reuse 8";
    t[2].count = P1_L * 30 + 3;
    t[2].op = gvqAvg;
    t[3].name = "D fp32 sum in-place reuse 5";
    t[3].count = P1_L * 16 + 31;
    t[3].op = gvqSum;
    t[3].inplace = 1;
    /* one slice and a tail: at 3..5 ranks most ring segments are empty */
    t[4].name = "E fp32 sum one slice";
    t[4].count = P1_L + 3;
    t[4].op = gvqSum;
    for (int k = 0; k < NT; k++) {
        t[k].cfg = gq_cfg(P1_L, 2, 8, 5);
        if (t[k].fp16) t[k].cfg.wireType = gvqFloat16;
        if (k == 2) t[k].cfg.reuse = 8;
        if (k == 3) t[k].cfg.reuse = 5;
        t[k].src.kind = SRC_LR;
        t[k].src.lr = lr_make(t[k].count, P1_L, 4, 0.37 * k, 8);
        t[k].d_want = 4;
        gq_setup(&t[k], comm);
    }
    for (int call = 0; call < P1_CALLS; call++)
        for (int k = 0; k < NT; k++)
            gq_call(&t[k], comm, call);
    for (int k = 0; k < NT; k++) {
        gvqCompressorStats_t st;
        MT_OK(gvqCompressorGetStats(t[k].comp, &st));
        int groups_want = k == 2 ? 4 : k == 3 ? 4 : 1; /* ceil(30/8), ceil(16/5) */
        MT_CHECK(st.groups == groups_want, "%s: %d reuse groups, want %d", t[k].name, st.groups,
                 groups_want);
        MT_CHECK(st.fits == 2 && t[k].compressed_calls == 7, "%s: %lld fits, %d compressed calls",
                 t[k].name, st.fits, t[k].compressed_calls);
        /* (not for E: with 2 segments of 1 slice and a 3-value tail, a rank's share of the
         * uncompressed calls can exceed the average that rawBytes counts) */
        if (mt.nranks > 1 && k != 4)
            MT_CHECK(st.wireBytes < st.rawBytes, "%s: wireBytes %llu not below rawBytes %llu",
                     t[k].name, st.wireBytes, st.rawBytes);
        if (mt.rank == 0)
            printf("   %-32s d=%d ratio %.3f kept %.6f wire/raw %.3f max compressed err %.2e "
                   "exact err %.2f of bound\n",
                   t[k].name, st.dims, st.ratio, st.keptEnergy,
                   st.rawBytes ? (double)st.wireBytes / (double)st.rawBytes : 0.0,
                   t[k].max_err_compressed, t[k].max_exact_q);
        gq_free(&t[k]);
    }
}

/* ---- part 2: conv layer ------------------------------------------------------------------- */
static void part_conv(gvqComm_t comm, const char *title) {
    part(title);
    gq_tensor_t g;
    memset(&g, 0, sizeof g);
    g.name = "conv avg";
    g.src.kind = SRC_CONV;
    g.src.conv.K = 8, g.src.conv.D = 3, g.src.conv.H = 3, g.src.conv.W = 5;
    g.count = 8 * 3 * 3 * 5; /* 360 = 22 slices of 16 + a tail of 8 */
    g.src.conv.col = lr_make(g.count, 16, 3, 1.9, 6);
    g.cfg = gq_cfg(16, 0, 6, 100);
    g.cfg.filters = 8, g.cfg.depth = 3, g.cfg.height = 3, g.cfg.width = 5;
    g.op = gvqAvg;
    g.d_want = 3;
    gq_setup(&g, comm);
    for (int call = 0; call < 12; call++)
        gq_call(&g, comm, call);
    if (mt.rank == 0)
        printf("   conv: max compressed err %.2e over %d compressed calls\n", g.max_err_compressed,
               g.compressed_calls);
    MT_CHECK(g.compressed_calls == 6, "conv: %d compressed calls, want 6", g.compressed_calls);
    gq_free(&g);
}

/* ---- part 3: QSGD -------------------------------------------------------------------------
 * Error bound. A bucket with scale m (max norm) is quantized to the grid m/s (s = 2^(bits-1)-1)
 * by stochastic rounding: each value moves by a centred amount of variance <= (m/s)^2 / 4,
 * independently per element. The ring quantizes every element N times (the first send, then
 * decode-add-encode at each of the N-1 reduce-scatter hops; once when N = 1); the partial sum at
 * any hop is bounded by P_b = sum_r max_{i in b} |x_r,i| (times (1+1/s)^N for the errors
 * already added). The errors are martingale differences, so
 *     E ||y - sum||^2 <= N * sum_b |b| (P_b (1+1/s)^N / s)^2 / 4,
 * and we allow twice its square root (the squared norm of thousands of independent errors
 * concentrates well inside 4x its mean). */
static double qsgd_bound(const float *xs_all /* N x n */, size_t n, int bits, size_t bucket,
                         const double *ref) {
    int N = mt.nranks;
    double s = (double)((1 << (bits - 1)) - 1), grow = pow(1 + 1 / s, N), e = 0, n2 = 0;
    for (size_t b = 0; b < n; b += bucket) {
        size_t len = n - b < bucket ? n - b : bucket;
        double P = 0;
        for (int r = 0; r < N; r++) {
            double m = 0;
            for (size_t i = b; i < b + len; i++)
                m = fmax(m, fabs(xs_all[(size_t)r * n + i]));
            P += m;
        }
        double step = P * grow / s;
        e += (double)N * (double)len * step * step / 4;
    }
    for (size_t i = 0; i < n; i++)
        n2 += ref[i] * ref[i];
    return 2 * sqrt(e) / sqrt(n2);
}

static double qsgd_ratio(size_t n, int bits, size_t bucket) {
    size_t full = n / bucket, tail = n % bucket;
    size_t bytes = full * (4 + (bucket * (size_t)bits + 7) / 8) +
                   (tail ? 4 + (tail * (size_t)bits + 7) / 8 : 0);
    return (double)(n * 4) / (double)bytes;
}

static void part_qsgd(gvqComm_t comm) {
    part("3 qsgd: 8 and 4 bits, error bound, ratio, unbiasedness");
    int N = mt.nranks;
    const size_t n = 3000; /* 5 buckets of 512 and one of 440 */
    src_t src;
    memset(&src, 0, sizeof src);
    src.kind = SRC_QSGD;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    float *xs_all = malloc(sizeof(float) * n * (size_t)N);
    double *ref = malloc(sizeof(double) * n), *absum = malloc(sizeof(double) * n);
    int bits_list[2] = {8, 4};
    gvqCompressor_t comp[2];
    for (int b = 0; b < 2; b++) {
        gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        cfg.codec = gvqCodecQsgd;
        cfg.qsgdBits = bits_list[b];
        cfg.qsgdBucket = 512;
        cfg.qsgdMaxNorm = 1;
        cfg.seed = 11;
        MT_OK(gvqCompressorCreate(comm, n, &cfg, &comp[b]));
    }
    /* a few calls of each, interleaved, each on its own input */
    for (int call = 0; call < 3; call++) {
        for (int b = 0; b < 2; b++) {
            int t = 10 * call + b;
            src_fill(&src, mt.rank, t, x, n);
            for (int r = 0; r < N; r++)
                src_fill(&src, r, t, xs_all + (size_t)r * n, n);
            reference(&src, t, n, 0, ref, absum, NULL);
            MT_OK(gvqAllReduceCompressed(x, y, n, gvqFloat32, gvqSum, comp[b], comm, NULL));
            double e = rel_l2(y, ref, n), bound = qsgd_bound(xs_all, n, bits_list[b], 512, ref);
            char what[64];
            snprintf(what, sizeof what, "qsgd %d-bit", bits_list[b]);
            check_identical(y, sizeof(float) * n, what, call);
            MT_CHECK(e <= bound, "%s call %d: relative error %.4g above the variance bound %.4g",
                     what, call, e, bound);
            if (bits_list[b] == 8)
                MT_CHECK(e < 0.05, "%s call %d: relative error %.4g, want < 5%%", what, call, e);
            gvqCompressorStats_t st;
            MT_OK(gvqCompressorGetStats(comp[b], &st));
            double ratio = qsgd_ratio(n, bits_list[b], 512);
            MT_CHECK(st.phase == gvqPhasePlain && st.codec == gvqCodecQsgd &&
                         st.iteration == call + 1 && fabs(st.ratio - ratio) <= 1e-9 * ratio,
                     "%s call %d: phase %s codec %d iteration %lld ratio %.9g (want plain, %d, "
                     "%d, %.9g)",
                     what, call, phase_name(st.phase), st.codec, st.iteration, st.ratio,
                     gvqCodecQsgd, call + 1, ratio);
            if (mt.rank == 0 && call == 0)
                printf("   %s: relative error %.4f (bound %.4f), ratio %.3f\n", what, e, bound,
                       st.ratio);
        }
    }

    /* a tensor shorter than one bucket: one ring segment holds it all, the others are empty */
    {
        const size_t ns = 300;
        gvqCompressor_t cs;
        gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        cfg.codec = gvqCodecQsgd;
        cfg.qsgdBits = 8;
        MT_OK(gvqCompressorCreate(comm, ns, &cfg, &cs));
        for (int r = 0; r < N; r++)
            src_fill(&src, r, 5, xs_all + (size_t)r * ns, ns);
        reference(&src, 5, ns, 0, ref, absum, NULL);
        MT_OK(gvqAllReduceCompressed(xs_all + (size_t)mt.rank * ns, y, ns, gvqFloat32, gvqSum, cs,
                                     comm, NULL));
        double e = rel_l2(y, ref, ns), bound = qsgd_bound(xs_all, ns, 8, 512, ref);
        check_identical(y, sizeof(float) * ns, "qsgd 8-bit, 300 values", 0);
        MT_CHECK(e <= bound && e < 0.05,
                 "qsgd 8-bit, 300 values (one bucket): relative error "
                 "%.4g, bound %.4g",
                 e, bound);
        MT_OK(gvqCompressorDestroy(cs));
    }

    /* unbiasedness: the same input 200 times (the random counter advances per call) */
    const int reps = 200;
    const size_t m = 1024;
    gvqCompressor_t cu;
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = gvqCodecQsgd;
    cfg.qsgdBits = 4;
    cfg.qsgdBucket = 512;
    MT_OK(gvqCompressorCreate(comm, m, &cfg, &cu));
    double *mean = calloc(m, sizeof(double)), sq_single = 0;
    src_fill(&src, mt.rank, 77, x, m);
    reference(&src, 77, m, 0, ref, absum, NULL);
    uint64_t h = FNV_INIT;
    int distinct = 0;
    float *first = malloc(sizeof(float) * m);
    for (int k = 0; k < reps; k++) {
        MT_OK(gvqAllReduceCompressed(x, y, m, gvqFloat32, gvqSum, cu, comm, NULL));
        h = fnv1a(y, sizeof(float) * m, h);
        double e = rel_l2(y, ref, m);
        sq_single += e * e;
        for (size_t i = 0; i < m; i++)
            mean[i] += y[i];
        if (k == 0)
            memcpy(first, y, sizeof(float) * m);
        else if (!distinct && memcmp(first, y, sizeof(float) * m) != 0)
            distinct = 1;
    }
    check_identical(&h, sizeof h, "qsgd 4-bit, 200 calls (hash of all outputs)", reps);
    double e2 = 0, n2 = 0;
    for (size_t i = 0; i < m; i++) {
        mean[i] /= reps;
        e2 += (mean[i] - ref[i]) * (mean[i] - ref[i]);
        n2 += ref[i] * ref[i];
    }
    double e_mean = sqrt(e2 / n2), e_single = sqrt(sq_single / reps);
    /* unbiased: the mean's error shrinks like 1/sqrt(200) = 0.07 of one call's; a biased
     * quantizer (e.g. rounding down) would keep it near 1. */
    MT_CHECK(distinct, "qsgd: 200 calls on one input gave identical outputs; the random "
                       "counter does not advance per call");
    MT_CHECK(e_mean < 0.25 * e_single,
             "qsgd unbiasedness: mean of %d calls has relative error "
             "%.4g, one call %.4g (want < 0.25x)",
             reps, e_mean, e_single);
    if (mt.rank == 0)
        printf("   qsgd 4-bit unbiasedness: one call %.4f, mean of %d calls %.5f (ratio %.3f, "
               "1/sqrt(%d) = %.3f)\n",
               e_single, reps, e_mean, e_mean / e_single, reps, 1 / sqrt((double)reps));
    MT_OK(gvqCompressorDestroy(cu));
    for (int b = 0; b < 2; b++)
        MT_OK(gvqCompressorDestroy(comp[b]));
    free(first), free(mean), free(x), free(y), free(xs_all), free(ref), free(absum);
}

/* ---- part 4: NaN in sampling and in the compressed phase -----------------------------------
 * Error feedback on. A NaN fed by one rank gives every rank the plain sum (exact, the NaN where
 * it was fed), is counted (nonFiniteCalls) and stays out of the schedule, the fit and the
 * residual: the sampling round still fits (no refusal) and the compressed calls after a NaN stay
 * finite and accurate. */
static void part_nan(gvqComm_t comm) {
    part("4 nan: a NaN on one rank, in sampling and in the compressed phase (error feedback)");
    const int L = 16, C = 4, T = 6, S = 6;
    const int nan_calls[2] = {2, T + 3};         /* the second in the compressed phase */
    const size_t n = (size_t)L * 12 + 5;         /* 12 slices, 3 reuse groups, a tail */
    const size_t nan_at = (size_t)1 * C * L + 3; /* in the sampled (first) slice of group 1 */
    const int nan_rank = mt.nranks - 1;
    src_t src;
    memset(&src, 0, sizeof src);
    src.kind = SRC_LR;
    src.lr = lr_make(n, L, 3, 2.3, T + S + 2);
    gvqCompressorConfig_t cfg = gq_cfg(L, 0, T, S);
    cfg.reuse = C;
    cfg.errorFeedback = 1;
    gvqCompressor_t comp;
    MT_OK(gvqCompressorCreate(comm, n, &cfg, &comp));
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    double *ref = malloc(sizeof(double) * n), *absum = malloc(sizeof(double) * n);
    long long want_nonfinite = 0;
    for (int call = 0; call < T + S + 2; call++) {
        int is_nan = call == nan_calls[0] || call == nan_calls[1];
        src_fill(&src, mt.rank, call, x, n);
        if (is_nan && mt.rank == nan_rank) x[nan_at] = NAN;
        MT_OK(gvqAllReduceCompressed(x, y, n, gvqFloat32, gvqSum, comp, comm, NULL));
        check_identical(y, sizeof(float) * n, "nan", call);
        reference(&src, call, n, 0, ref, absum, NULL);
        want_nonfinite += is_nan;
        gvqCompressorStats_t st;
        MT_OK(gvqCompressorGetStats(comp, &st));
        if (call <= T || is_nan) { /* exact: sampling, or a NaN call sent plain */
            if (is_nan) {
                MT_CHECK(isnan(y[nan_at]),
                         "nan call %d: element %zu = %g, want NaN (a NaN "
                         "input must propagate like a plain sum)",
                         call, nan_at, (double)y[nan_at]);
                y[nan_at] = (float)ref[nan_at];
            }
            size_t at;
            double q = exact_worst(y, ref, absum, n, &at);
            MT_CHECK(q <= 1.0, "nan call %d (exact): element %zu = %.9g, reference %.9g", call, at,
                     (double)y[at], ref[at]);
        } else {
            double e = rel_l2(y, ref, n);
            MT_CHECK(e < 1e-4,
                     "nan call %d (compressed, d=%d): relative error %.3g (a NaN earlier must "
                     "not poison the residual)",
                     call, st.dims, e);
        }
        MT_CHECK(st.nonFiniteCalls == want_nonfinite && st.fitsRefused == 0,
                 "nan call %d: nonFiniteCalls %lld fitsRefused %lld; want %lld, 0", call,
                 st.nonFiniteCalls, st.fitsRefused, want_nonfinite);
        if (call == T) /* T counted sampling calls (the NaN call not among them): fitted */
            MT_CHECK(st.fits == 1 && st.phase == gvqPhaseCompressed && st.dims == 3 &&
                         st.reason[0] == '\0',
                     "nan: after the sampling round fits %lld phase %s d %d reason '%s'; want 1, "
                     "compressed, 3, ''",
                     st.fits, phase_name(st.phase), st.dims, st.reason);
        if (call < T)
            MT_CHECK(st.phase == gvqPhaseSample, "nan call %d: phase %s, want sample", call,
                     phase_name(st.phase));
        if (call > T && call < T + S + 1)
            MT_CHECK(st.phase == gvqPhaseCompressed, "nan call %d: phase %s, want compressed", call,
                     phase_name(st.phase));
    }
    MT_OK(gvqCompressorDestroy(comp));
    /* QSGD (4 bits, error feedback), in place: the NaN call is the plain sum, later calls finite */
    gvqCompressorConfig_t q = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    q.codec = gvqCodecQsgd;
    q.qsgdBits = 4;
    q.errorFeedback = 1;
    MT_OK(gvqCompressorCreate(comm, n, &q, &comp));
    for (int call = 0; call < 4; call++) {
        src_fill(&src, mt.rank, call, y, n);
        if (call == 1 && mt.rank == nan_rank) y[nan_at] = NAN;
        MT_OK(gvqAllReduceCompressed(y, y, n, gvqFloat32, gvqSum, comp, comm, NULL));
        check_identical(y, sizeof(float) * n, "nan qsgd", call);
        reference(&src, call, n, 0, ref, absum, NULL);
        if (call == 1) {
            MT_CHECK(isnan(y[nan_at]), "nan qsgd call 1: element %zu = %g, want NaN", nan_at,
                     (double)y[nan_at]);
            y[nan_at] = (float)ref[nan_at];
            size_t at;
            double w = exact_worst(y, ref, absum, n, &at);
            MT_CHECK(w <= 1.0, "nan qsgd call 1 (sent plain): element %zu = %.9g, reference %.9g",
                     at, (double)y[at], ref[at]);
        } else {
            double e = rel_l2(y, ref, n);
            MT_CHECK(e < 0.5, "nan qsgd call %d: relative error %.3g (NaN or a poisoned residual)",
                     call, e);
        }
    }
    gvqCompressorStats_t st;
    MT_OK(gvqCompressorGetStats(comp, &st));
    MT_CHECK(st.nonFiniteCalls == 1, "nan qsgd: nonFiniteCalls %lld, want 1", st.nonFiniteCalls);
    MT_OK(gvqCompressorDestroy(comp));
    free(x), free(y), free(ref), free(absum);
}

/* ---- part 5: save/load across communicators -------------------------------------------------
 * Three compressors, created in this order: P GradiVeQ with error feedback (W=1, T=6, S=5),
 * Q GradiVeQ sampling through 8-bit QSGD, avg in place (W=0, T=5, S=4), R QSGD 4-bit. */
#define SL_N 3
#define SL_CALLS 16
#define SL_STOP1                                                              \
    5 /* saved after 5 calls: P in the middle of sampling (4 of 6 samples), Q \
         just fitted (compressed, nothing run yet) */
#define SL_STOP2                                                                    \
    11 /* saved after 11 calls: P in its compressed phase (4 of 5 calls done), Q in \
          the middle of its second sampling round */

typedef struct {
    size_t count;
    src_t src;
    gvqCompressorConfig_t cfg;
    gvqRedOp_t op;
    int inplace;
} sl_spec_t;

static void sl_specs(sl_spec_t *sp) {
    memset(sp, 0, sizeof(sl_spec_t) * SL_N);
    sp[0].count = 32 * 20 + 9;
    sp[0].src.kind = SRC_LR;
    sp[0].src.lr = lr_make(sp[0].count, 32, 3, 0.5, 6);
    sp[0].cfg = gq_cfg(32, 1, 6, 5);
    sp[0].cfg.errorFeedback = 1;
    sp[0].op = gvqSum;
    sp[1].count = 16 * 20 + 3;
    sp[1].src.kind = SRC_LR;
    sp[1].src.lr = lr_make(sp[1].count, 16, 3, 1.5, 5);
    sp[1].cfg = gq_cfg(16, 0, 5, 4);
    sp[1].cfg.sampleCodec = gvqCodecQsgd;
    sp[1].cfg.qsgdBits = 8;
    sp[1].cfg.qsgdBucket = 64;
    sp[1].op = gvqAvg;
    sp[1].inplace = 1;
    sp[2].count = 700;
    sp[2].src.kind = SRC_QSGD;
    sp[2].cfg = (gvqCompressorConfig_t)GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    sp[2].cfg.codec = gvqCodecQsgd;
    sp[2].cfg.qsgdBits = 4;
    sp[2].cfg.qsgdBucket = 128;
    sp[2].cfg.seed = 7;
    sp[2].op = gvqSum;
}

static void sl_create(const sl_spec_t *sp, gvqComm_t comm, gvqCompressor_t *c) {
    for (int k = 0; k < SL_N; k++)
        MT_OK(gvqCompressorCreate(comm, sp[k].count, &sp[k].cfg, &c[k]));
}

/* Calls [from, to) of every compressor, interleaved; outputs into out[k] + call*count. */
static void sl_run(const sl_spec_t *sp, gvqComm_t comm, gvqCompressor_t *c, int from, int to,
                   float **out) {
    for (int t = from; t < to; t++)
        for (int k = 0; k < SL_N; k++) {
            float *y = out[k] + (size_t)t * sp[k].count;
            float *x = malloc(sizeof(float) * sp[k].count);
            src_fill(&sp[k].src, mt.rank, t, sp[k].inplace ? y : x, sp[k].count);
            MT_OK(gvqAllReduceCompressed(sp[k].inplace ? y : x, y, sp[k].count, gvqFloat32,
                                         sp[k].op, c[k], comm, NULL));
            free(x);
        }
}

static void sl_stats(gvqCompressor_t *c, gvqCompressorStats_t *st) {
    for (int k = 0; k < SL_N; k++)
        MT_OK(gvqCompressorGetStats(c[k], &st[k]));
}

static void sl_check_restored(gvqCompressor_t *c, const gvqCompressorStats_t *before,
                              const char *how) {
    gvqCompressorStats_t st[SL_N];
    sl_stats(c, st);
    for (int k = 0; k < SL_N; k++)
        MT_CHECK(st[k].phase == before[k].phase && st[k].iteration == before[k].iteration &&
                     st[k].phaseIter == before[k].phaseIter && st[k].dims == before[k].dims &&
                     st[k].fits == before[k].fits,
                 "saveload %s, compressor %d: restored phase %s/%lld iteration %lld d %d fits "
                 "%lld; saved %s/%lld, %lld, %d, %lld",
                 how, k, phase_name(st[k].phase), st[k].phaseIter, st[k].iteration, st[k].dims,
                 st[k].fits, phase_name(before[k].phase), before[k].phaseIter, before[k].iteration,
                 before[k].dims, before[k].fits);
}

static void part_saveload(void) {
    part("5 saveload: restart through buffers and files on new communicators");
    sl_spec_t sp[SL_N];
    sl_specs(sp);
    float *ref_out[SL_N], *out[SL_N];
    for (int k = 0; k < SL_N; k++) {
        ref_out[k] = calloc(sp[k].count * SL_CALLS, sizeof(float));
        out[k] = calloc(sp[k].count * SL_CALLS, sizeof(float));
    }
    gvqCompressor_t c[SL_N];
    gvqCompressorStats_t st_u[SL_N], before[SL_N];

    /* the uninterrupted job */
    gvqComm_t comm = new_comm();
    sl_create(sp, comm, c);
    sl_run(sp, comm, c, 0, SL_CALLS, ref_out);
    sl_stats(c, st_u);
    for (int k = 0; k < SL_N; k++)
        MT_OK(gvqCompressorDestroy(c[k]));
    MT_OK(gvqCommDestroy(comm));
    MT_CHECK(st_u[0].fits == 1 && st_u[1].fits >= 1,
             "saveload: the uninterrupted job fitted P %lld times, Q %lld times (want 1, >= 1)",
             st_u[0].fits, st_u[1].fits);

    /* the interrupted job: calls 0-4 */
    comm = new_comm();
    sl_create(sp, comm, c);
    sl_run(sp, comm, c, 0, SL_STOP1, out);
    sl_stats(c, before);
    void *buf[SL_N];
    size_t size[SL_N];
    for (int k = 0; k < SL_N; k++) {
        size[k] = 0;
        MT_OK(gvqCompressorSave(c[k], NULL, &size[k]));
        buf[k] = malloc(size[k]);
        size_t s = size[k];
        MT_OK(gvqCompressorSave(c[k], buf[k], &s));
        MT_CHECK(s == size[k], "saveload: compressor %d saved %zu bytes, size query said %zu", k, s,
                 size[k]);
    }
    for (int k = 0; k < SL_N; k++)
        MT_OK(gvqCompressorDestroy(c[k]));
    MT_OK(gvqCommDestroy(comm));

    /* restarted on a new communicator: calls 5-10 */
    comm = new_comm();
    sl_create(sp, comm, c);
    MT_EXPECT_RES(gvqCompressorLoad(c[1], buf[0], size[0]), gvqInvalidArgument); /* P into Q */
    for (int k = 0; k < SL_N; k++)
        MT_OK(gvqCompressorLoad(c[k], buf[k], size[k]));
    sl_check_restored(c, before, "from buffers");
    for (int k = 0; k < SL_N; k++)
        free(buf[k]);
    sl_run(sp, comm, c, SL_STOP1, SL_STOP2, out);
    sl_stats(c, before);
    char path[SL_N][256];
    int tag = (int)getpid();
    MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);
    const char *tmp = getenv("TMPDIR");
    for (int k = 0; k < SL_N; k++) {
        snprintf(path[k], sizeof path[k], "%s/gvq_test_compressed_%d_r%d_c%d.bin",
                 tmp && tmp[0] ? tmp : "/tmp", tag, mt.rank, k);
        MT_OK(gvqCompressorSaveFile(c[k], path[k]));
        MT_OK(gvqCompressorDestroy(c[k]));
    }
    MT_OK(gvqCommDestroy(comm));

    /* restarted again, from files: calls 11-15 */
    comm = new_comm();
    sl_create(sp, comm, c);
    for (int k = 0; k < SL_N; k++) {
        MT_OK(gvqCompressorLoadFile(c[k], path[k]));
        remove(path[k]);
    }
    sl_check_restored(c, before, "from files");
    sl_run(sp, comm, c, SL_STOP2, SL_CALLS, out);
    gvqCompressorStats_t st[SL_N];
    sl_stats(c, st);
    for (int k = 0; k < SL_N; k++) {
        MT_CHECK(st[k].iteration == SL_CALLS && st[k].phase == st_u[k].phase &&
                     st[k].fits == st_u[k].fits && st[k].dims == st_u[k].dims,
                 "saveload compressor %d: the restarted job ends at iteration %lld phase %s fits "
                 "%lld d %d, the uninterrupted one at %lld %s %lld %d",
                 k, st[k].iteration, phase_name(st[k].phase), st[k].fits, st[k].dims,
                 st_u[k].iteration, phase_name(st_u[k].phase), st_u[k].fits, st_u[k].dims);
        MT_OK(gvqCompressorDestroy(c[k]));
    }
    MT_OK(gvqCommDestroy(comm));

    for (int k = 0; k < SL_N; k++) {
        int first_bad = -1;
        for (int t = 0; t < SL_CALLS && first_bad < 0; t++)
            if (memcmp(out[k] + (size_t)t * sp[k].count, ref_out[k] + (size_t)t * sp[k].count,
                       sizeof(float) * sp[k].count) != 0)
                first_bad = t;
        MT_CHECK(first_bad < 0,
                 "saveload compressor %d: the restarted job's output of call %d "
                 "differs from the uninterrupted job's (restarts after calls %d and %d)",
                 k, first_bad, SL_STOP1, SL_STOP2);
        check_identical(out[k], sizeof(float) * sp[k].count * SL_CALLS, "saveload", k);
        free(out[k]), free(ref_out[k]);
    }
    if (mt.rank == 0)
        printf("   P: %lld fits d=%d, Q: %lld fits d=%d, R: ratio %.3f\n", st_u[0].fits,
               st_u[0].dims, st_u[1].fits, st_u[1].dims, st_u[2].ratio);
}

/* ---- zero-code mode ------------------------------------------------------------------------ */
#define ZC_COUNT ((size_t)256 * 8 + 100) /* 8 slices of the default L = 256, a tail of 100 */
#define ZC_T 100                         /* default sampleIters, warm-up 0 */
#define ZC_CALLS 110

static int32_t zc_int(int r, int t, size_t i) {
    return (int32_t)(((uint32_t)r * 7919u + (uint32_t)i * 31u + (uint32_t)t * 17u) % 2001u) - 1000;
}

static void run_zerocode(void) {
    part("zerocode: GVQ_CODEC=gradiveq, plain gvqAllReduce");
    const char *e = getenv("GVQ_CODEC");
    MT_CHECK(e != NULL && strcasecmp(e, "gradiveq") == 0,
             "zerocode mode needs GVQ_CODEC=gradiveq (any case) in the environment, got '%s'",
             e ? e : "");
    int N = mt.nranks;
    const size_t n = ZC_COUNT;
    gvqComm_t comm = new_comm();
    src_t src;
    memset(&src, 0, sizeof src);
    src.kind = SRC_LR;
    src.lr = lr_make(n, 256, 4, 0.8, ZC_T);
    float *buf = malloc(sizeof(float) * n), *fmax_buf = malloc(sizeof(float) * n);
    float *fmax_mpi = malloc(sizeof(float) * n);
    int32_t *isend = malloc(sizeof(int32_t) * n), *irecv = malloc(sizeof(int32_t) * n);
    int32_t *impi = malloc(sizeof(int32_t) * n);
    double *ref = malloc(sizeof(double) * n), *absum = malloc(sizeof(double) * n);
    double max_err_c = 0, max_q = 0;
    for (int t = 0; t < ZC_CALLS; t++) {
        /* the last call adds, on every rank, a component outside the fitted subspace to slice
         * 0: a compressed allreduce drops it, a plain one would not */
        int probe = t == ZC_CALLS - 1;
        src_fill(&src, mt.rank, t, buf, n);
        if (probe)
            for (size_t i = 0; i < 256; i++)
                buf[i] += (float)lr_outside(i, 256);
        MT_OK(gvqAllReduce(buf, buf, n, gvqFloat32, gvqSum, comm, NULL)); /* in place */

        src_fill(&src, mt.rank, t + 1000, fmax_buf, n);
        if (probe)
            for (size_t i = 0; i < 256; i++)
                fmax_buf[i] += (float)lr_outside(i, 256);
        MPI_Allreduce(fmax_buf, fmax_mpi, (int)n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
        MT_OK(gvqAllReduce(fmax_buf, fmax_buf, n, gvqFloat32, gvqMax, comm, NULL));

        for (size_t i = 0; i < n; i++)
            isend[i] = zc_int(mt.rank, t, i);
        MPI_Allreduce(isend, impi, (int)n, MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
        MT_OK(gvqAllReduce(isend, irecv, n, gvqInt32, gvqSum, comm, NULL));

        MT_CHECK(memcmp(fmax_buf, fmax_mpi, sizeof(float) * n) == 0,
                 "zerocode call %d: float max allreduce differs from MPI_Allreduce(MPI_MAX) (it "
                 "must not be compressed)",
                 t);
        MT_CHECK(memcmp(irecv, impi, sizeof(int32_t) * n) == 0,
                 "zerocode call %d: int32 sum allreduce differs from MPI_Allreduce (it must not "
                 "be compressed)",
                 t);
        uint64_t h = fnv1a(buf, sizeof(float) * n, FNV_INIT);
        h = fnv1a(fmax_buf, sizeof(float) * n, h);
        h = fnv1a(irecv, sizeof(int32_t) * n, h);
        check_identical(&h, sizeof h, "zerocode (all three buffers)", t);

        reference(&src, t, n, 0, ref, absum, NULL);
        if (t < ZC_T) {
            size_t at;
            double q = exact_worst(buf, ref, absum, n, &at);
            if (q > max_q) max_q = q;
            MT_CHECK(q <= 1.0,
                     "zerocode call %d (sampling: must be exact): element %zu = %.9g, "
                     "reference %.9g",
                     t, at, (double)buf[at], ref[at]);
        } else if (!probe) {
            double err = rel_l2(buf, ref, n);
            if (err > max_err_c) max_err_c = err;
            MT_CHECK(err < 1e-4,
                     "zerocode call %d (compressed, rank-4 data): relative error "
                     "%.3g",
                     t, err);
        } else {
            /* the output must be the sum without the probe (projected away)... */
            double err = rel_l2(buf, ref, n);
            /* ...and far from the true sum, which holds N times the probe */
            double d2 = 0, p2 = 0;
            for (size_t i = 0; i < 256; i++) {
                double p = N * lr_outside(i, 256);
                double dv = (double)buf[i] - (ref[i] + p);
                d2 += dv * dv;
                p2 += p * p;
            }
            MT_CHECK(err < 1e-4 && sqrt(d2 / p2) > 0.9,
                     "zerocode call %d: the probe outside the subspace was not dropped (error vs "
                     "the sum without it %.3g, missing share of the probe %.3g): the buffer is "
                     "not compressed after %d sampling calls",
                     t, err, sqrt(d2 / p2), ZC_T);
        }
    }
    if (mt.rank == 0)
        printf("   zerocode: exact calls worst %.2f of the rounding bound, compressed calls max "
               "relative error %.2e\n",
               max_q, max_err_c);
    MT_OK(gvqCommDestroy(comm));
    free(buf), free(fmax_buf), free(fmax_mpi), free(isend), free(irecv), free(impi);
    free(ref), free(absum);
}

/* Run with GVQ_CODEC=gradiveq and GVQ_GRADIVEQ_SAMPLE_SLICES=-3: the zero-code knob reaches the
 * compressor's config, which refuses it: the float sum fails with gvqInvalidArgument and a WARN
 * naming sampleSlices, while allreduces zero-code mode does not touch still work. */
static void run_zerocode_bad(void) {
    part("zerocode-bad: GVQ_GRADIVEQ_SAMPLE_SLICES=-3 is refused");
    gvqComm_t comm = new_comm();
    float f[300];
    int32_t i32[300];
    for (int i = 0; i < 300; i++)
        f[i] = (float)i, i32[i] = i;
    MT_EXPECT_RES(gvqAllReduce(f, f, 300, gvqFloat32, gvqSum, comm, NULL), gvqInvalidArgument);
    const char *err = gvqGetLastError(comm);
    MT_CHECK(strstr(err, "sampleSlices") != NULL, "the refusal does not name sampleSlices: '%s'",
             err);
    MT_OK(gvqAllReduce(i32, i32, 300, gvqInt32, gvqSum, comm, NULL));
    MT_CHECK(i32[299] == 299 * mt.nranks, "int32 sum after the refusal: %d", (int)i32[299]);
    MT_OK(gvqCommDestroy(comm));
}

/* GVQ_CODEC=qsgd8 (no such codec): every zero-code call is refused, never run uncompressed;
 * other calls run. */
static void run_zerocode_badname(void) {
    part("zerocode-badname: GVQ_CODEC=qsgd8 refuses float allreduces");
    gvqComm_t comm = new_comm();
    float f[300];
    int32_t i32[300];
    for (int i = 0; i < 300; i++)
        f[i] = (float)i, i32[i] = i;
    MT_EXPECT_RES(gvqAllReduce(f, f, 300, gvqFloat32, gvqAvg, comm, NULL), gvqInvalidArgument);
    const char *err = gvqGetLastError(comm);
    MT_CHECK(strstr(err, "GVQ_CODEC='qsgd8'") != NULL && strstr(err, "uncompressed") != NULL,
             "the refusal does not name GVQ_CODEC's value: '%s'", err);
    MT_CHECK(f[299] == 299.0f, "the refused call wrote its buffer: %g", f[299]);
    MT_OK(gvqAllReduce(i32, i32, 300, gvqInt32, gvqSum, comm, NULL));
    MT_CHECK(i32[299] == 299 * mt.nranks, "int32 sum after the refusal: %d", (int)i32[299]);
    MT_OK(gvqCommDestroy(comm));
}

/* zerocode-layout-count: GVQ_LAYOUT describes 5001 floats, the buffer holds 5000: the call
 * runs (one whole-buffer compressor) and a WARN, at the default level, says the layout is not
 * used for it. */
static void run_zerocode_layout_count(void) {
    part("zerocode-layout-count: a layout of another count is reported unused");
    gvqComm_t comm = new_comm();
    const size_t n = 5000;
    float *f = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        f[i] = (float)(i % 7);
    MT_OK(gvqAllReduce(f, f, n, gvqFloat32, gvqSum, comm, NULL));
    const char *err = gvqGetLastError(comm);
    MT_CHECK(strstr(err, "describes 5001 floats") != NULL &&
                 strstr(err, "not used for this buffer") != NULL,
             "no WARN that the layout is unused: '%s'", err);
    free(f);
    MT_OK(gvqCommDestroy(comm));
}

/* zerocode-stats (GVQ_CODEC=gradiveq, GVQ_STATS_EVERY=55, GVQ_DEBUG unset, GVQ_DEBUG_FILE=
 * zc_stats_%p.log): 110 calls of slices in a two-dimensional subspace, so the fit after the 100
 * sampled calls keeps d 2; rank 0's statistics line shows at the default level, with the fitted
 * d and its kept energy. */
static void run_zerocode_stats(void) {
    part("zerocode-stats: the statistics line at the default level, with d and kept energy");
    gvqComm_t comm = new_comm();
    const size_t n = 256 * 32;
    float *f = malloc(sizeof(float) * n);
    for (int t = 0; t < 110; t++) {
        for (size_t i = 0; i < n; i++) { /* slice j: a_j v0 + b_j v1 */
            size_t j = i / 256, k = i % 256;
            f[i] = (float)((1 + 0.1 * (double)((j * 7 + (size_t)t + (size_t)mt.rank) % 5)) *
                               sin(0.05 * (double)k) +
                           0.3 * (double)((j + (size_t)t) % 3) * cos(0.11 * (double)k));
        }
        MT_OK(gvqAllReduce(f, f, n, gvqFloat32, gvqAvg, comm, NULL));
    }
    char path[64], line[1024];
    snprintf(path, sizeof path, "zc_stats_%d.log", (int)getpid());
    if (mt.rank == 0) {
        FILE *fp = fopen(path, "r");
        int found = 0, fitted = 0;
        while (fp != NULL && fgets(line, sizeof line, fp) != NULL) {
            if (strstr(line, "GVQ INFO zero-code stats after 110 calls") == NULL) continue;
            found = 1;
            fitted = strstr(line, "GradiVeQ d 2 (smallest fitted) keeping") != NULL &&
                     strstr(line, "of the energy") != NULL;
            if (!fitted) printf("   the line: %s", line);
        }
        if (fp != NULL) fclose(fp);
        MT_CHECK(found, "no statistics line after 110 calls in %s at the default level", path);
        MT_CHECK(fitted, "the statistics line does not give the fitted d 2 and its energy");
    }
    remove(path); /* every rank's own */
    free(f);
    MT_OK(gvqCommDestroy(comm));
}

/* zerocode-ratio MIN MAX: ten zero-code calls on a flat buffer (GVQ_CODEC and the integer
 * widths from the environment); the wire's ratio (gvqCommGetCompressionStats) must lie in
 * [MIN, MAX]: GVQ_INTEGER_BITS=16 leaves QSGD at ~7.9x, GVQ_QSGD_INTEGER_BITS=16 takes it to 2x. */
static void run_zerocode_ratio(double lo, double hi) {
    part("zerocode-ratio: the zero-code wire's ratio");
    gvqComm_t comm = new_comm();
    const size_t n = 40000;
    float *f = malloc(sizeof(float) * n);
    for (int t = 0; t < 10; t++) {
        for (size_t i = 0; i < n; i++)
            f[i] = (float)sin(0.001 * (double)(i * (size_t)(mt.rank + 1)) + t);
        MT_OK(gvqAllReduce(f, f, n, gvqFloat32, gvqAvg, comm, NULL));
    }
    gvqCompressorStats_t st;
    MT_OK(gvqCommGetCompressionStats(comm, GVQ_STATS_TOTAL, &st));
    MT_CHECK(st.ratio >= lo && st.ratio <= hi, "zero-code ratio %.3f, want [%g, %g] (codec %d)",
             st.ratio, lo, hi, st.codec);
    if (mt.rank == 0) printf("   ratio %.3f (codec %d)\n", st.ratio, st.codec);
    free(f);
    MT_OK(gvqCommDestroy(comm));
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    signal(SIGALRM, watchdog);
    alarm(WATCHDOG_S);
    int zerocode = argc > 1 && strcmp(argv[1], "zerocode") == 0;
    int zerocode_bad = argc > 1 && strcmp(argv[1], "zerocode-bad") == 0;
    int zerocode_badname = argc > 1 && strcmp(argv[1], "zerocode-badname") == 0;
    int zerocode_ratio = argc > 3 && strcmp(argv[1], "zerocode-ratio") == 0;
    int zerocode_count = argc > 1 && strcmp(argv[1], "zerocode-layout-count") == 0;
    int zerocode_stats = argc > 1 && strcmp(argv[1], "zerocode-stats") == 0;
    if (argc > 1 && !zerocode && !zerocode_bad && !zerocode_badname && !zerocode_ratio &&
        !zerocode_count && !zerocode_stats) {
        if (mt.rank == 0)
            printf("usage: test_compressed [zerocode|zerocode-bad|zerocode-badname|"
                   "zerocode-ratio MIN MAX|zerocode-layout-count|zerocode-stats]\n");
        MPI_Finalize();
        return 2;
    }
    if (zerocode_stats) {
        run_zerocode_stats();
    } else if (zerocode_count) {
        run_zerocode_layout_count();
    } else if (zerocode_ratio) {
        run_zerocode_ratio(atof(argv[2]), atof(argv[3]));
    } else if (zerocode_badname) {
        run_zerocode_badname();
    } else if (zerocode_bad) {
        run_zerocode_bad();
    } else if (zerocode) {
        run_zerocode();
    } else {
        gvqComm_t comm = new_comm();
        part_gradiveq(comm, "1 gradiveq: five tensors interleaved");
        part_conv(comm, "2 conv: K=8 D=3 H=3 W=5, L=16, rank 3 in the collocated order");
        part_qsgd(comm);
        part_nan(comm);
        MT_OK(gvqCommDestroy(comm));
        /* again with a 512-byte ring chunk: several chunks per segment, each of whole slices */
        comm = new_comm_chunk(512);
        part_gradiveq(comm, "1b gradiveq again, 512-byte ring chunks");
        part_conv(comm, "2b conv again, 512-byte ring chunks");
        MT_OK(gvqCommDestroy(comm));
        part_saveload();
    }
    alarm(0);
    if (mt.rank == 0) printf("-- done (%.1f s)\n", elapsed());
    return mt_finish(zerocode_stats     ? "test_compressed zerocode-stats"
                     : zerocode_count   ? "test_compressed zerocode-layout-count"
                     : zerocode_ratio   ? "test_compressed zerocode-ratio"
                     : zerocode_badname ? "test_compressed zerocode-badname"
                     : zerocode_bad     ? "test_compressed zerocode-bad"
                     : zerocode         ? "test_compressed zerocode"
                                        : "test_compressed");
}
