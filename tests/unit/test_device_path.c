/*
 * test_device_path.c -- the compressed allreduce on device buffers, device-resident (the
 * device's codecs, only the wire staged through host memory), on a simulated device
 * (sim_device.h) over in-process ranks: at 1-4 ranks, for GradiVeQ (flat and conv-shaped,
 * fp32 and fp16 wires, QSGD while sampling, a vote that exits early and refits), QSGD alone,
 * sum and avg, in place and out of place, every output must equal the host path's bit for bit
 * and the statistics must agree, with no breach of the device contract (device ops handed host
 * memory, the transport handed device memory) and the device codecs actually called. Error
 * feedback and mixed host/device buffers take the whole-buffer staging, which must agree too.
 * Compressed calls on device buffers inside a group run one by one (the fused calls are for
 * host buffers): the same bits as the host calls made outside a group. gvqSend/gvqRecv on device
 * buffers are staged through pinned memory and deliver every value.
 */
#include <math.h>

#include "gvq_test.h"
#include "sim_fifo.h"

#define RANK 3

/* Low-rank slices (as GradiVeQ assumes of a conv layer) plus, from noise_from on, noise that
 * leaves the subspace so the vote exits early. */
static float grad(int r, int t, size_t i, size_t L, int noise_from) {
    size_t s = i / L, e = i % L;
    double v = 0;
    for (int j = 0; j < RANK; j++) {
        double a = sin((0.7 + 0.45 * j) * t + 1.3 * r + 0.9 * (double)s + 2.1 * j);
        double ph = 6.283185307179586 * (double)e / (double)L;
        v += a * (j == 0 ? cos(ph) : j == 1 ? sin(ph) : cos(2 * ph));
    }
    if (noise_from >= 0 && t >= noise_from) {
        uint64_t h =
            (uint64_t)i * 0x9E3779B97F4A7C15ull ^ (uint64_t)(t * 131 + r) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        v += 0.8 * ((double)(h % 2001) / 1000.0 - 1.0);
    }
    return (float)v;
}

typedef struct {
    const char *name;
    size_t count, L;
    gvqCompressorConfig_t cfg;
    int iters, noise_from, in_place, mixed;
    gvqRedOp_t op;
    int expect_device;            /* 1: the device codecs must run; 0: whole-buffer staging */
    int saw_compressed, saw_exit; /* out: rank 0 */
    fifo_world_t *fw; /* not NULL: rings on device memory run over this NCCL-like transport */
} dcase_t;

static void rank_case(gvqComm_t comm, int rank, int nranks, void *arg) {
    dcase_t *k = arg;
    sim_guard_transport(comm);
    if (k->fw != NULL) /* as the NCCL transport is adopted on a GPU */
        gvq_comm_adopt_device_transport(comm, fifo_transport(k->fw, rank, 1), &sim_device);
    gvqCompressor_t ch, cd;
    gvqCompressor_t pad[16];
    EXPECT_RES(gvqCompressorCreate(comm, k->count, &k->cfg, &ch), gvqSuccess);
    /* compressors made in between give cd the same fit owners as ch (group g is fitted on
     * rank (tensor index + g) mod N) */
    for (int i = 0; i + 1 < nranks; i++)
        EXPECT_RES(gvqCompressorCreate(comm, 1, NULL, &pad[i]), gvqSuccess);
    EXPECT_RES(gvqCompressorCreate(comm, k->count, &k->cfg, &cd), gvqSuccess);
    for (int i = 0; i + 1 < nranks; i++)
        EXPECT_RES(gvqCompressorDestroy(pad[i]), gvqSuccess);
    size_t n = k->count;
    float *x = malloc(sizeof(float) * n), *yh = malloc(sizeof(float) * n);
    float *hy = malloc(sizeof(float) * n);
    int hostonly = getenv("DP_HOSTONLY") != NULL;
    float *dx = hostonly ? malloc(sizeof(float) * n) : sim_alloc(sizeof(float) * n);
    float *dy = hostonly ? malloc(sizeof(float) * n) : sim_alloc(sizeof(float) * n);
    for (int t = 0; t < k->iters; t++) {
        for (size_t i = 0; i < n; i++)
            x[i] = grad(rank, t, i, k->L, k->noise_from);
        gvqCompressorStats_t sh, sd;
        EXPECT_RES(gvqAllReduceCompressed(x, yh, n, gvqFloat32, k->op, ch, comm, NULL), gvqSuccess);
        memcpy(dx, x, sizeof(float) * n);
        float *out = k->in_place ? dx : k->mixed ? hy : dy;
        EXPECT_RES(gvqAllReduceCompressed(dx, out, n, gvqFloat32, k->op, cd, comm, NULL),
                   gvqSuccess);
        size_t bad_h = 0, bad_d = 0, ndiff = 0;
        for (size_t i = 0; i < n; i++) {
            bad_h += !isfinite(yh[i]);
            bad_d += !isfinite(out[i]);
            ndiff += memcmp(&yh[i], &out[i], sizeof(float)) != 0;
            if (getenv("DP_TRACE") && memcmp(&yh[i], &out[i], sizeof(float)) != 0 && ndiff < 4)
                fprintf(stderr, "  r%d t%d [%zu] host %.9g dev %.9g\n", rank, t, i, yh[i], out[i]);
        }
        EXPECT(ndiff == 0,
               "%s rank %d call %d: the device output differs from the host path's "
               "in %zu of %zu values (non-finite: host %zu, device %zu)",
               k->name, rank, t, ndiff, n, bad_h, bad_d);
        EXPECT_RES(gvqCompressorGetStats(ch, &sh), gvqSuccess);
        EXPECT_RES(gvqCompressorGetStats(cd, &sd), gvqSuccess);
        EXPECT(sh.phase == sd.phase && sh.dims == sd.dims && sh.fits == sd.fits &&
                   sh.earlyExits == sd.earlyExits && sh.wireBytes == sd.wireBytes &&
                   /* the loss norms are summed per chunk on the device, in one running sum on
                    * the host: equal up to the order of additions */
                   fabs(sh.lastLoss - sd.lastLoss) <= 1e-12 * fabs(sh.lastLoss),
               "%s rank %d call %d: stats differ: phase %d/%d d %d/%d fits %d/%d exits %d/%d "
               "wire %llu/%llu loss %g/%g",
               k->name, rank, t, sh.phase, sd.phase, sh.dims, sd.dims, (int)sh.fits, (int)sd.fits,
               (int)sh.earlyExits, (int)sd.earlyExits, sh.wireBytes, sd.wireBytes, sh.lastLoss,
               sd.lastLoss);
        if (getenv("DP_TRACE"))
            fprintf(stderr,
                    "%s r%d t%d host ph %d d %d loss %.6f exits %d | dev ph %d d %d loss %.6f "
                    "exits %d\n",
                    k->name, rank, t, sh.phase, sh.dims, sh.lastLoss, (int)sh.earlyExits, sd.phase,
                    sd.dims, sd.lastLoss, (int)sd.earlyExits);
        if (rank == 0) {
            k->saw_compressed |= sd.phase == gvqPhaseCompressed;
            k->saw_exit |= sd.earlyExits > 0;
        }
    }
    EXPECT_RES(gvqCompressorDestroy(ch), gvqSuccess);
    EXPECT_RES(gvqCompressorDestroy(cd), gvqSuccess);
    free(x), free(yh), free(hy);
    if (hostonly)
        free(dx), free(dy);
    else
        sim_free(dx), sim_free(dy);
}

/* Two QSGD and one tracked-basis compressor on device buffers in one group, against the same
 * calls on host buffers one by one. */
static void rank_group(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)nranks, (void)arg;
    sim_guard_transport(comm);
    enum { NGC = 3 };
    const size_t n[NGC] = {1000, 333, 16 * 40};
    gvqCompressor_t h[NGC], d[NGC];
    float *x[NGC], *yh[NGC], *dx[NGC];
    for (int i = 0; i < NGC; i++) {
        gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        cfg.codec = i < 2 ? gvqCodecQsgd : gvqCodecGradiveq;
        if (i == 2) cfg.basisUpdate = gvqBasisTrack, cfg.maxDims = 2;
        EXPECT_RES(gvqCompressorCreate(comm, n[i], &cfg, &h[i]), gvqSuccess);
        EXPECT_RES(gvqCompressorCreate(comm, n[i], &cfg, &d[i]), gvqSuccess);
        x[i] = malloc(sizeof(float) * n[i]);
        yh[i] = malloc(sizeof(float) * n[i]);
        dx[i] = sim_alloc(sizeof(float) * n[i]);
    }
    for (int t = 0; t < 3; t++) {
        for (int i = 0; i < NGC; i++) {
            for (size_t j = 0; j < n[i]; j++)
                x[i][j] = grad(rank, t + 7 * i, j, 16, -1);
            EXPECT_RES(
                gvqAllReduceCompressed(x[i], yh[i], n[i], gvqFloat32, gvqAvg, h[i], comm, NULL),
                gvqSuccess);
            memcpy(dx[i], x[i], sizeof(float) * n[i]);
        }
        EXPECT_RES(gvqGroupStart(), gvqSuccess);
        for (int i = 0; i < NGC; i++)
            EXPECT_RES(
                gvqAllReduceCompressed(dx[i], dx[i], n[i], gvqFloat32, gvqAvg, d[i], comm, NULL),
                gvqSuccess);
        EXPECT_RES(gvqGroupEnd(), gvqSuccess);
        for (int i = 0; i < NGC; i++)
            EXPECT(
                memcmp(dx[i], yh[i], sizeof(float) * n[i]) == 0,
                "group on device buffers, rank %d call %d tensor %d: differs from the host calls",
                rank, t, i);
    }
    for (int i = 0; i < NGC; i++) {
        EXPECT_RES(gvqCompressorDestroy(h[i]), gvqSuccess);
        EXPECT_RES(gvqCompressorDestroy(d[i]), gvqSuccess);
        free(x[i]), free(yh[i]);
        sim_free(dx[i]);
    }
}

/* gvqSend/gvqRecv on device buffers, staged through pinned memory: a ring in a group, device to
 * device and device to host, an odd size over several pieces; the transport never sees device
 * memory (sim_guard_transport). */
static void rank_p2p(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)arg;
    sim_guard_transport(comm);
    const size_t n = 70001;
    float *ds = sim_alloc(n * 4), *dr = sim_alloc(n * 4), *hr = calloc(n, 4);
    for (size_t i = 0; i < n; i++) {
        ds[i] = (float)(rank * 100003 + (int)i);
        dr[i] = 0.0f;
    }
    int to = (rank + 1) % nranks, from = (rank + nranks - 1) % nranks;
    EXPECT_RES(gvqGroupStart(), gvqSuccess);
    EXPECT_RES(gvqSend(ds, n, gvqFloat32, to, comm, NULL), gvqSuccess);
    EXPECT_RES(gvqRecv(dr, n, gvqFloat32, from, comm, NULL), gvqSuccess);
    EXPECT_RES(gvqSend(ds, n, gvqFloat32, to, comm, NULL), gvqSuccess);
    EXPECT_RES(gvqRecv(hr, n, gvqFloat32, from, comm, NULL), gvqSuccess);
    EXPECT_RES(gvqGroupEnd(), gvqSuccess);
    size_t bad = 0, bad_host = 0;
    for (size_t i = 0; i < n; i++) {
        float want = (float)(from * 100003 + (int)i);
        bad += dr[i] != want;
        bad_host += hr[i] != want;
    }
    EXPECT(bad == 0 && bad_host == 0,
           "p2p on device buffers, rank %d of %d: %zu device and %zu host values wrong", rank,
           nranks, bad, bad_host);
    sim_free(ds);
    sim_free(dr);
    free(hr);
}

/* A small allreduce where one rank passes device buffers and the others host buffers (which
 * gvq.h's rule forbids): the signature says which, so every rank fails at once naming both
 * sides, nothing is written, and the next call works. (The host ranks' data would otherwise
 * ride along with the agreement while the device rank staged its own: partial sums.) */
typedef struct {
    int device_rank;
    gvqResult_t res[8];
} mixed_t;

static void rank_mixed(gvqComm_t comm, int rank, int nranks, void *arg) {
    mixed_t *m = arg;
    int dev = rank == m->device_rank;
    float *s = dev ? sim_alloc(64) : malloc(64), *d = dev ? sim_alloc(64) : malloc(64);
    for (int i = 0; i < 16; i++) {
        s[i] = (float)(1 << rank);
        d[i] = -7.0f;
    }
    m->res[rank] = gvqAllReduce(s, d, 16, gvqFloat32, gvqSum, comm, NULL);
    const char *last = gvqGetLastError(comm);
    EXPECT(last != NULL && strstr(last, "CUDA buffers") != NULL,
           "mixed buffers, rank %d: the WARN does not name the device buffers (\"%s\")", rank,
           last ? last : "(null)");
    int written = 0;
    for (int i = 0; i < 16; i++)
        written += d[i] != -7.0f;
    EXPECT(written == 0, "mixed buffers, rank %d: %d values written by a failed call", rank,
           written);
    for (int i = 0; i < 16; i++)
        s[i] = dev ? 0.0f : (float)(1 << rank); /* now every rank on the host */
    float hs[16], hd[16];
    memcpy(hs, s, sizeof hs);
    EXPECT_RES(gvqAllReduce(hs, hd, 16, gvqFloat32, gvqSum, comm, NULL), gvqSuccess);
    float want = (float)((1 << nranks) - 1 - (1 << m->device_rank));
    EXPECT(hd[0] == want && hd[15] == want, "mixed buffers, rank %d: the next call gave %g, not %g",
           rank, hd[0], want);
    if (dev)
        sim_free(s), sim_free(d);
    else
        free(s), free(d);
}

static gvqCompressorConfig_t base_cfg(int L) {
    gvqCompressorConfig_t c = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    c.sliceSize = L;
    c.warmupIters = 1;
    c.sampleIters = 3;
    c.compressedIters = 6;
    c.sampleSlices = 2;
    c.maxDims = 6;
    return c;
}

int main(void) {
    gvq_device_register(&sim_device, sim_owns);
    enum { NCASES = 7 };
    dcase_t cases[NCASES];
    memset(cases, 0, sizeof cases);
    /* flat GradiVeQ, a tail shorter than L, groups of 5 slices, the paper's vote; noise from
     * call 8 makes the vote exit and refit */
    cases[0] =
        (dcase_t){"gradiveq", 16 * 23 + 5, 16, base_cfg(16), 18, 8, 0, 0, gvqSum, 1, 0, 0, NULL};
    cases[0].cfg.reuse = 5;
    /* conv-shaped (collocated on the device), fp16 wire, QSGD while sampling, avg, in place */
    cases[1] = (dcase_t){"conv fp16 qsgd-sampling avg in-place",
                         8 * 4 * 3 * 3,
                         16,
                         base_cfg(16),
                         14,
                         -1,
                         1,
                         0,
                         gvqAvg,
                         1,
                         0,
                         0,
                         NULL};
    cases[1].cfg.filters = 8, cases[1].cfg.depth = 4, cases[1].cfg.height = 3,
    cases[1].cfg.width = 3;
    cases[1].cfg.wireType = gvqFloat16;
    cases[1].cfg.sampleCodec = gvqCodecQsgd;
    cases[1].cfg.qsgdBucket = 32;
    cases[1].cfg.reuse = 6;
    /* vote off, every slice sampled */
    cases[2] = (dcase_t){
        "gradiveq vote-off ss=all", 16 * 40, 16, base_cfg(16), 12, -1, 0, 0, gvqSum, 1, 0, 0, NULL};
    cases[2].cfg.voteThreshold = 1.0f;
    cases[2].cfg.sampleSlices = 0;
    /* QSGD alone, a short last bucket, avg */
    cases[3] = (dcase_t){"qsgd avg", 1000, 16, base_cfg(16), 5, -1, 0, 0, gvqAvg, 1, 0, 0, NULL};
    cases[3].cfg.codec = gvqCodecQsgd;
    cases[3].cfg.qsgdBucket = 64;
    cases[3].cfg.qsgdBits = 4;
    /* plain (codec none): the identity codec's values travel as a staged wire */
    cases[4] = (dcase_t){"none", 777, 16, base_cfg(16), 3, -1, 0, 0, gvqSum, 1, 0, 0, NULL};
    cases[4].cfg.codec = gvqCodecNone;
    /* error feedback: whole-buffer staging, host codecs */
    cases[5] = (dcase_t){
        "error feedback (staged)", 16 * 20, 16, base_cfg(16), 10, -1, 0, 0, gvqSum, 0, 0, 0, NULL};
    cases[5].cfg.errorFeedback = 1;
    /* device send, host recv: whole-buffer staging */
    cases[6] = (dcase_t){
        "mixed buffers (staged)", 16 * 20, 16, base_cfg(16), 10, -1, 0, 1, gvqSum, 0, 0, 0, NULL};
    for (int nr = 1; nr <= 4; nr++) {
        for (int i = 0; i < NCASES; i++) {
            dcase_t *k = &cases[i];
            if (getenv("DP_CASE") && atoi(getenv("DP_CASE")) != i) continue;
            if (getenv("DP_RANKS") && atoi(getenv("DP_RANKS")) != nr) continue;
            for (int via = 0; via < 2; via++) {
                k->saw_compressed = k->saw_exit = 0;
                k->fw = via ? fifo_world_create(nr, 1) : NULL;
                long before = __atomic_load_n(&sim_codec_calls, __ATOMIC_RELAXED);
                long pinned_before = __atomic_load_n(&sim_pinned_allocs, __ATOMIC_RELAXED);
                gvq_test_run(nr, NULL, rank_case, k);
                long calls = __atomic_load_n(&sim_codec_calls, __ATOMIC_RELAXED) - before;
                long pinned = __atomic_load_n(&sim_pinned_allocs, __ATOMIC_RELAXED) - pinned_before;
                /* staged rings keep their host wire in pinned memory; staged calls stage through
                 * it; the communicators give all of it back */
                if (!via || !k->expect_device)
                    EXPECT(nr == 1 || pinned > 0, "%s at %d ranks: no pinned host memory used",
                           k->name, nr);
                EXPECT(__atomic_load_n(&sim_pinned_live, __ATOMIC_RELAXED) == 0,
                       "%s at %d ranks: %ld pinned blocks not freed", k->name, nr,
                       __atomic_load_n(&sim_pinned_live, __ATOMIC_RELAXED));
                long moved = 0;
                if (k->fw != NULL) {
                    moved = k->fw->transfers;
                    /* device-resident rings use it from 2 ranks; staged calls never do */
                    if (k->expect_device && nr > 1)
                        EXPECT(moved > 0, "%s at %d ranks: the device transport moved nothing",
                               k->name, nr);
                    if (!k->expect_device)
                        EXPECT(moved == 0, "%s at %d ranks: staged calls used the device transport",
                               k->name, nr);
                    fifo_world_destroy(k->fw);
                    k->fw = NULL;
                }
                int codecs = k->cfg.codec != gvqCodecNone; /* identity runs through reduce/copy */
                if (k->expect_device && codecs)
                    EXPECT(calls > 0, "%s at %d ranks: the device codecs were never called",
                           k->name, nr);
                if (!k->expect_device)
                    EXPECT(calls == 0,
                           "%s at %d ranks: %ld device codec calls, expected the host "
                           "codecs on staged buffers",
                           k->name, nr, calls);
                if (k->cfg.codec == GVQ_CONFIG_UNDEF_INT || k->cfg.codec == gvqCodecGradiveq)
                    EXPECT(k->saw_compressed, "%s at %d ranks: never reached the compressed phase",
                           k->name, nr);
                if (i == 0)
                    EXPECT(k->saw_exit, "%s at %d ranks: the vote never exited early", k->name, nr);
                printf("%-40s %d ranks, %s: %ld device codec calls%s\n", k->name, nr,
                       via ? "device wire over a FIFO transport" : "wire staged over the host one",
                       calls, k->saw_exit ? ", early exit + refit" : "");
            }
        }
    }
    for (int nr = 1; nr <= 3; nr++)
        gvq_test_run(nr, NULL, rank_group, NULL);
    printf("%-40s 1-3 ranks: grouped device calls equal the host calls\n", "group");
    for (int nr = 1; nr <= 4; nr++)
        gvq_test_run(nr, NULL, rank_p2p, NULL);
    printf("%-40s 1-4 ranks: gvqSend/gvqRecv on device buffers, staged\n", "point-to-point");
    for (int nr = 2; nr <= 6; nr++) {
        mixed_t m = {nr - 1, {gvqSuccess}};
        gvq_test_run(nr, NULL, rank_mixed, &m);
        for (int r = 0; r < nr; r++)
            EXPECT(m.res[r] == gvqInvalidArgument,
                   "mixed buffers at %d ranks: rank %d returned %s, not invalid argument", nr, r,
                   gvqGetErrorString(m.res[r]));
    }
    printf("%-40s 2-6 ranks: host and device buffers in one call refused\n", "mixed buffers");
    EXPECT(sim_violations == 0, "%d breaches of the device contract", sim_violations);
    EXPECT(sim_nblocks == 0, "%d device allocations leaked", sim_nblocks);
    gvq_device_register(NULL, NULL);
    return gvq_test_finish("test_device_path");
}
