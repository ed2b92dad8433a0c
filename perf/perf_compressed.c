/*
 * perf_compressed.c -- the compressed allreduce benchmarks: codecs gradiveq and qsgd through
 * gvqAllReduceCompressed, on float32 gradients from perf_gradsrc.c, with the exact result as
 * reference. One compressor per size (fresh, or loaded from --state-dir), carried on from the
 * out-of-place case to the in-place one. Per call:
 *
 *     fill the gradient of iteration t -> MPI_Barrier -> (timed) the call
 *
 *   gradiveq: calls before its compressed phase (warm-up, sampling, the call that fits) run
 *             untimed; then `warmup` calls, then `iters` timed calls, each timed only if the
 *             compressor is in the compressed phase when it starts.
 *   qsgd:     every call after the warmup ones is timed.
 *   (check)   rel_err of the last timed call against the exact sum, which every rank computes
 *             in double for its share of the elements by regenerating every rank's input (the
 *             source is a pure function of rank, t, index).
 */
#include "perf_compressed.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perf_common.h"

/* ---- the gradient source ----------------------------------------------------------------------
 */

void perf_source_fill(const gs_source_t *src, int rank, long long t, size_t off, size_t len,
                      float *out) {
    if (gs_fill(src, rank, t, off, len, out) != 0) {
        fprintf(stderr, "gvq-perf: rank %d: cannot read the replay file (iteration %lld): %s\n",
                perf_rank, t, strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
}

gs_source_t *perf_source_open(const opts_t *o) {
    char err[400] = "out of memory";
    gs_source_t *src;
    if (o->replay != NULL)
        src = gs_replay_open(o->replay, err, sizeof err);
    else
        src = gs_synthetic(o->seed, (size_t)o->L, o->grad_rank, o->noise, o->variation);
    if (perf_all_ok(src != NULL)) return src;
    if (src == NULL) fprintf(stderr, "gvq-perf: rank %d: %s\n", perf_rank, err);
    gs_free(src);
    return NULL;
}

int perf_write_replay(const opts_t *o) {
    int rc = 0;
    if (perf_rank == 0) {
        gs_source_t *src =
            gs_synthetic(o->seed, (size_t)o->L, o->grad_rank, o->noise, o->variation);
        size_t count = o->maxbytes / sizeof(float);
        char err[300] = "out of memory";
        if (src == NULL || count == 0 ||
            gs_write_replay(src, o->write_replay, count, o->replay_iters, 0, err, sizeof err) !=
                0) {
            fprintf(stderr, "gvq-perf: --write-replay: %s\n",
                    count == 0 ? "-e is below 4 bytes" : err);
            rc = 3;
        } else {
            char desc[400];
            gs_describe(src, desc, sizeof desc);
            printf("# wrote %s: %zu floats x %d iterations of rank 0's gradients (%s)\n",
                   o->write_replay, count, o->replay_iters, desc);
        }
        gs_free(src);
    }
    MPITEST(MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD));
    return rc;
}

/* ||y - exact|| / ||exact|| where exact is the sum (or average) over every rank of the source's
 * iteration t, in double. Each rank regenerates every rank's input for its own 1/N of the
 * elements; the squared norms are summed over the ranks. */
static double exact_rel_err(const gs_source_t *src, long long t, size_t count, const float *y,
                            gvqRedOp_t op) {
    const size_t block = (size_t)1 << 16;
    int nranks = perf_nranks;
    size_t lo = count / (size_t)nranks * (size_t)perf_rank,
           hi = count / (size_t)nranks * (size_t)(perf_rank + 1);
    if (perf_rank == nranks - 1) hi = count;
    float *tmp = malloc(sizeof(float) * block);
    double *acc = malloc(sizeof(double) * block);
    if (tmp == NULL || acc == NULL) {
        fprintf(stderr, "gvq-perf: rank %d: out of memory\n", perf_rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double loc[2] = {0.0, 0.0}, tot[2] = {0.0, 0.0};
    for (size_t off = lo; off < hi; off += block) {
        size_t n = hi - off < block ? hi - off : block;
        for (size_t i = 0; i < n; i++)
            acc[i] = 0.0;
        for (int r = 0; r < nranks; r++) {
            perf_source_fill(src, r, t, off, n, tmp);
            for (size_t i = 0; i < n; i++)
                acc[i] += tmp[i];
        }
        for (size_t i = 0; i < n; i++) {
            double want = op == gvqAvg ? acc[i] / nranks : acc[i], diff = (double)y[off + i] - want;
            loc[0] += diff * diff;
            loc[1] += want * want;
        }
    }
    free(tmp);
    free(acc);
    MPITEST(MPI_Allreduce(loc, tot, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    if (tot[1] > 0) return sqrt(tot[0] / tot[1]);
    return tot[0] > 0 ? INFINITY : 0.0;
}

/* ---- the compressor and its saved state --------------------------------------------------- */

static gvqCompressor_t make_compressor(const opts_t *o, codec_t codec, size_t count) {
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = codec == CODEC_GRADIVEQ   ? gvqCodecGradiveq
                : codec == CODEC_POWERSGD ? gvqCodecPowersgd
                                          : gvqCodecQsgd;
    if (codec == CODEC_POWERSGD) cfg.powerRank = o->prank;
    cfg.qsgdBits = o->qbits;
    cfg.qsgdBucket = o->qbucket;
    cfg.seed = (int)(o->seed & 0x7fffffff);
    cfg.integerBits = o->wire >= 8 ? o->wire : 0;
    if (codec == CODEC_GRADIVEQ) {
        cfg.sliceSize = o->L;
        cfg.maxDims = o->dmax;
        if (o->basis) cfg.basisUpdate = gvqBasisTrack;
        cfg.lossThreshold = (float)o->eps;
        cfg.sampleIters = o->T;
        cfg.compressedIters = o->S;
        cfg.warmupIters = o->W;
        cfg.sampleCodec = o->sample_qsgd ? gvqCodecQsgd : gvqCodecNone;
        cfg.wireType = o->wire == 1 ? gvqFloat16 : gvqFloat32;
        cfg.voteThreshold = (float)o->vote;
        cfg.sampleSlices = o->sample_slices;
    }
    gvqCompressor_t c = NULL;
    GVQTEST(gvqCompressorCreate(perf_comm, count, &cfg, &c));
    return c;
}

/* A compressor and the source's iteration, shared by the out-of-place and in-place cases of one
 * size (the compressor carries on from one to the other). */
typedef struct {
    gvqCompressor_t comp;
    const gs_source_t *src;
    long long t;       /* next iteration of the source */
    long long calls;   /* calls made */
    long long untimed; /* calls outside the compressed phase (gradiveq) */
    char why[240];     /* why a case could not be timed */
    int loaded;        /* the compressor started from a saved state (--state-dir) */
} lossy_ctx_t;

/* --state-dir: one file per size and rank, named for everything that makes a saved fit valid
 * (the compressor's config is checked by gvqCompressorLoad; the source's is hashed here). */
static void state_path(char *buf, size_t len, const opts_t *o, const gs_source_t *src,
                       size_t count) {
    char desc[600];
    gs_describe(src, desc, sizeof desc);
    uint64_t h = 1469598103934665603ull; /* FNV-1a of what the fit depends on */
    char key[800];
    snprintf(key, sizeof key, "%s|L%d D%d eps%g T%d S%d W%d sq%d w%d v%g ss%d b%d", desc, o->L,
             o->dmax, o->eps, o->T, o->S, o->W, o->sample_qsgd, o->wire, o->vote, o->sample_slices,
             o->basis);
    for (const char *p = key; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    snprintf(buf, len, "%s/gvq-perf-gradiveq-%016llx-n%d-c%zu-r%d.state", o->state_dir,
             (unsigned long long)h, perf_nranks, count, perf_rank);
}

/* Loads the saved compressor if every rank has one that loads; otherwise every rank starts
 * from a fresh compressor. Returns 1 when loaded. */
static int state_load(const opts_t *o, codec_t codec, gvqCompressor_t *comp, size_t count,
                      const char *path) {
    int ok = access(path, R_OK) == 0 && gvqCompressorLoadFile(*comp, path) == gvqSuccess;
    int all = perf_all_ok(ok);
    if (ok && !all) { /* loaded here but not everywhere: the ranks must hold the same state */
        GVQTEST(gvqCompressorDestroy(*comp));
        *comp = make_compressor(o, codec, count);
    }
    return all;
}

static void state_save(gvqCompressor_t comp, const char *path) {
    gvqCompressorStats_t st;
    GVQTEST(gvqCompressorGetStats(comp, &st));
    if (st.phase == gvqPhaseCompressed && gvqCompressorSaveFile(comp, path) != gvqSuccess)
        fprintf(stderr, "gvq-perf: rank %d: cannot save the compressor to %s: %s\n", perf_rank,
                path, gvqGetLastError(perf_comm));
}

/* ---- one case ---------------------------------------------------------------------------------
 */

/* One compressed call on the source's next iteration; its seconds when `measured` (timed from
 * after a barrier). */
static double lossy_call(const opts_t *o, lossy_ctx_t *lc, float *in, float *recvbuf, size_t count,
                         int measured) {
    perf_source_fill(lc->src, perf_rank, lc->t, 0, count, in);
    if (measured) MPITEST(MPI_Barrier(MPI_COMM_WORLD));
    double t0 = MPI_Wtime();
    GVQTEST(
        gvqAllReduceCompressed(in, recvbuf, count, gvqFloat32, o->op, lc->comp, perf_comm, NULL));
    double dt = MPI_Wtime() - t0;
    lc->t++;
    lc->calls++;
    return dt;
}

/* Sum of the seconds of `iters` timed calls (see the file's comment), or -1 with lc->why set
 * when the compressor did not stay in its compressed phase. */
static double time_lossy_calls(const opts_t *o, codec_t codec, lossy_ctx_t *lc, float *in,
                               float *recvbuf, size_t count) {
    /* enough for the warm-up and three rounds of sampling (early exits send it back there) */
    const long long limit = (long long)o->W + 3 * ((long long)o->T + 1) + 3;
    long long untimed_here = 0;
    int warm = 0, timed = 0;
    double sum = 0.0;
    gvqCompressorStats_t st;
    while (timed < o->iters) {
        GVQTEST(gvqCompressorGetStats(lc->comp, &st));
        /* the phase is the same on every rank, so every rank takes the same branches */
        int measured = codec == CODEC_QSGD || codec == CODEC_POWERSGD ||
                       st.phase == gvqPhaseCompressed || st.phase == gvqPhasePlain;
        if (!measured && untimed_here >= limit) {
            snprintf(lc->why, sizeof lc->why,
                     "%lld calls without staying in the compressed phase (%.120s)", untimed_here,
                     st.reason[0] ? st.reason : "no reason given");
            return -1.0;
        }
        double dt = lossy_call(o, lc, in, recvbuf, count, measured);
        if (!measured) {
            lc->untimed++;
            untimed_here++;
        } else if (warm < o->warmup) {
            warm++;
        } else {
            sum += dt;
            timed++;
        }
    }
    return sum;
}

static result_t run_lossy_case(const opts_t *o, codec_t codec, lossy_ctx_t *lc, float *sendbuf,
                               float *recvbuf, size_t count, int inplace) {
    result_t res = RESULT_NONE;
    double sum = time_lossy_calls(o, codec, lc, inplace ? recvbuf : sendbuf, recvbuf, count);
    if (sum < 0) return res;
    res.time_us = perf_max_over_ranks(sum / o->iters) * 1e6;
    gvqCompressorStats_t st;
    GVQTEST(gvqCompressorGetStats(lc->comp, &st));
    res.ratio = st.ratio;
    if (o->check) res.rel_err = exact_rel_err(lc->src, lc->t - 1, count, recvbuf, o->op);
    return res;
}

/* ---- the details section ------------------------------------------------------------------ */

/* One line on the compressor of a size, for the details section. */
static void lossy_details(char *buf, size_t len, codec_t codec, size_t bytes,
                          const lossy_ctx_t *lc) {
    gvqCompressorStats_t st;
    GVQTEST(gvqCompressorGetStats(lc->comp, &st));
    static const char *const phases[] = {"warm-up", "sample", "compressed", "plain"};
    const char *ph = st.phase >= 0 && st.phase <= 3 ? phases[st.phase] : "?";
    double wire_ratio = st.wireBytes ? (double)st.rawBytes / (double)st.wireBytes : 0.0;
    const char *name = perf_codec_names[codec];
    if (codec == CODEC_GRADIVEQ)
        snprintf(buf, len,
                 "# %-8s %12zu B: d=%d L=%d groups=%d ratio %.3f (all calls %.3f) kept %.4f "
                 "lastLoss %.4g fits %lld refused %lld earlyExits %lld fit %.1f ms; calls %lld "
                 "(%lld untimed: warm-up/sampling/fit)%s, phase now %s%s%s",
                 name, bytes, st.dims, st.sliceSize, st.groups, st.ratio, wire_ratio, st.keptEnergy,
                 st.lastLoss, st.fits, st.fitsRefused, st.earlyExits, st.fitSeconds * 1e3,
                 lc->calls, lc->untimed, lc->loaded ? " [fit loaded from --state-dir]" : "", ph,
                 st.reason[0] ? ": " : "", st.reason);
    else
        snprintf(buf, len, "# %-8s %12zu B: ratio %.3f calls %lld%s%s", name, bytes, st.ratio,
                 lc->calls, lc->why[0] ? "; NOT TIMED: " : "", lc->why);
    if (codec == CODEC_GRADIVEQ && lc->why[0]) {
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "; NOT TIMED: %s", lc->why);
    }
}

/* ---- the benchmarks ----------------------------------------------------------------------- */

/* Why gvqAllReduceCompressed cannot run this collective, dtype and op, or NULL if it can. */
static const char *lossy_skip_reason(const opts_t *o, char *buf, size_t len) {
    if (o->coll != COLL_ALLREDUCE) {
        snprintf(buf, len, "compressed codecs run in allreduce only");
        return buf;
    }
    if (o->dt->type != gvqFloat32) {
        snprintf(buf, len, "gvqAllReduceCompressed takes float32 only, not -d %s", o->dt->name);
        return buf;
    }
    if (o->op != gvqSum && o->op != gvqAvg) {
        snprintf(buf, len, "gvqAllReduceCompressed takes op sum or avg only, not -o %s",
                 perf_op_names[o->op]);
        return buf;
    }
    return NULL;
}

static void run_size(const perf_bench_t *b, const perf_run_t *run, size_t count, perf_case_t *out) {
    const opts_t *o = run->o;
    size_t bytes = count * sizeof(float);
    if (count == 0) {
        snprintf(out->details, sizeof out->details,
                 "# %-8s %12zu B: not run (a compressor needs count >= 1)",
                 perf_codec_names[b->codec], bytes);
        return;
    }
    lossy_ctx_t lc;
    memset(&lc, 0, sizeof lc);
    lc.comp = make_compressor(o, b->codec, count);
    lc.src = run->src;
    char state[1024] = "";
    if (o->state_dir != NULL && b->codec == CODEC_GRADIVEQ) {
        state_path(state, sizeof state, o, run->src, count);
        lc.loaded = state_load(o, b->codec, &lc.comp, count, state);
    }
    for (int ip = 0; ip < 2; ip++)
        out->res[ip] = run_lossy_case(o, b->codec, &lc, run->sendbuf, run->recvbuf, count, ip);
    if (state[0]) state_save(lc.comp, state);
    lossy_details(out->details, sizeof out->details, b->codec, bytes, &lc);
    gvqCompressorStats_t st;
    GVQTEST(gvqCompressorGetStats(lc.comp, &st));
    out->dims = b->codec == CODEC_GRADIVEQ && (st.phase != gvqPhasePlain || o->basis) ? st.dims : 0;
    GVQTEST(gvqCompressorDestroy(lc.comp));
}

const perf_bench_t perf_bench_gradiveq = {
    .codec = CODEC_GRADIVEQ, .skip_reason = lossy_skip_reason, .run_size = run_size};
const perf_bench_t perf_bench_qsgd = {
    .codec = CODEC_QSGD, .skip_reason = lossy_skip_reason, .run_size = run_size};
const perf_bench_t perf_bench_powersgd = {
    .codec = CODEC_POWERSGD, .skip_reason = lossy_skip_reason, .run_size = run_size};
