/*
 * perf_overlap.c -- gvq-perf --overlap: how much of GradiVeQ's compute the compressed allreduce
 * hides behind its transfers. Per size, next to the compressed call's time T_total:
 *
 *   T_wire   the same traffic without compute: plain gvqAllReduce of count/ratio floats on a
 *            communicator whose chunks are chunk/ratio bytes (the compressed ring's messages)
 *   T_comp   the codec's compute of one allreduce, run directly through the codec
 *            (perf_codecbench.c): encode+combine and decode of the whole local vector
 *
 *   hidden = clamp((T_wire + T_comp - T_total) / T_comp, 0, 1)
 *
 * T_comp is measured twice: all ranks at once (as in the ring; max over ranks) and rank 0 alone
 * while the others sleep.
 */
#include "perf_overlap.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/perf_codecbench.h"
#include "perf_common.h"
#include "perf_compressed.h"

enum { COMPUTE_REPS = 3 };

/* Block timing of `iters` plain allreduces of `count` elements on `comm` (as the plain
 * benchmark: warmup calls, barrier, the calls, max over ranks), in us. */
static double time_plain(const opts_t *o, gvqComm_t comm, const void *send, void *recv,
                         size_t count, gvqDataType_t type, int iters) {
    for (int k = 0; k < o->warmup; k++)
        GVQTEST(gvqAllReduce(send, recv, count, type, gvqSum, comm, NULL));
    MPITEST(MPI_Barrier(MPI_COMM_WORLD));
    double t0 = MPI_Wtime();
    for (int k = 0; k < iters; k++)
        GVQTEST(gvqAllReduce(send, recv, count, type, gvqSum, comm, NULL));
    double el = MPI_Wtime() - t0;
    return perf_max_over_ranks(el) / iters * 1e6;
}

/* T_wire (wire-sized chunks), T_wire1 (the communicator's chunk) and T_vote. */
static void measure_wire(const opts_t *o, float *sendbuf, float *recvbuf, perf_overlap_t *ov) {
    /* the ring of the compressed call sends chunk/ratio bytes per chunk: give the plain
     * allreduce of the wire-sized vector the same chunks, so only the compute differs */
    ov->wchunk = (size_t)((double)ov->chunk / ov->ratio) / 4 * 4;
    if (ov->wchunk < 64) ov->wchunk = 64;
    size_t count_w = (size_t)llround((double)ov->count / ov->ratio);
    if (count_w < 1) count_w = 1;
    for (size_t i = 0; i < count_w; i++)
        sendbuf[i] = (float)(i % 7);

    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.chunkBytes = (int)ov->wchunk;
    gvqComm_t wcomm = perf_comm_create(&cfg);
    ov->wire = time_plain(o, wcomm, sendbuf, recvbuf, count_w, gvqFloat32, o->iters);
    GVQTEST(gvqCommDestroy(wcomm));
    ov->wire_def = time_plain(o, perf_comm, sendbuf, recvbuf, count_w, gvqFloat32, o->iters);
    int32_t vote_in = 1, vote_out = 0;
    ov->vote =
        time_plain(o, perf_comm, &vote_in, &vote_out, 1, gvqInt32, o->iters > 20 ? o->iters : 20);
}

/* A codec of the compressor's d, fitted on slices of this rank's own gradient; NULL on every
 * rank (err set) when it failed on one. Collective. */
static cb_gradiveq_t *make_codec(const opts_t *o, const gs_source_t *src, const perf_overlap_t *ov,
                                 char *err, size_t errlen) {
    size_t L = (size_t)o->L, T = (size_t)(4 * ov->d + 8), nsl = ov->count / L;
    float *samples = malloc(sizeof(float) * L * T);
    if (samples == NULL) {
        fprintf(stderr, "gvq-perf: rank %d: out of memory\n", perf_rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t k = 0; k < T; k++)
        perf_source_fill(src, perf_rank, (long long)(k / nsl), (k % nsl) * L, L, samples + k * L);
    char why[160] = "";
    cb_gradiveq_t *cb = cb_gradiveq_create(ov->count, L, (size_t)ov->d, perf_nranks, o->wire == 1,
                                           samples, T, why, sizeof why);
    free(samples);
    if (perf_all_ok(cb != NULL)) return cb;
    snprintf(err, errlen, "%s", why[0] ? why : "codec bench failed on a rank");
    cb_gradiveq_free(cb);
    return NULL;
}

/* COMPUTE_REPS passes of the codec over x (each after a barrier when `barrier`): the medians
 * of encode, decode and both, in seconds. */
static void run_codec(cb_gradiveq_t *cb, const float *x, size_t chunk, int barrier, double med[3]) {
    double enc[COMPUTE_REPS], dec[COMPUTE_REPS], both[COMPUTE_REPS];
    for (int k = 0; k < COMPUTE_REPS; k++) {
        if (barrier) MPITEST(MPI_Barrier(MPI_COMM_WORLD));
        if (cb_gradiveq_run(cb, x, chunk, &enc[k], &dec[k]) != 0) {
            fprintf(stderr, "gvq-perf: rank %d: the codec failed: %s\n", perf_rank,
                    gvqGetLastError(NULL));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        both[k] = enc[k] + dec[k];
    }
    med[0] = perf_median(enc, COMPUTE_REPS);
    med[1] = perf_median(dec, COMPUTE_REPS);
    med[2] = perf_median(both, COMPUTE_REPS);
}

/* T_enc, T_dec, T_comp with every rank computing at once, as in the ring (max over ranks); then
 * T_comp with rank 0 alone, the others asleep. */
static void measure_compute(cb_gradiveq_t *cb, const float *x, perf_overlap_t *ov) {
    double med[3], mx[3];
    run_codec(cb, x, ov->chunk, 1, med);
    MPITEST(MPI_Allreduce(med, mx, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    ov->enc = mx[0] * 1e6;
    ov->dec = mx[1] * 1e6;
    ov->comp = mx[2] * 1e6;
    double alone = 0.0;
    perf_sleepy_barrier();
    if (perf_rank == 0) {
        run_codec(cb, x, ov->chunk, 0, med);
        alone = med[2];
    }
    perf_sleepy_barrier();
    MPITEST(MPI_Bcast(&alone, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    ov->comp_alone = alone * 1e6;
}

/* Share of the compute comp hidden behind the transfer: (wire + comp - total) / comp in [0, 1]. */
static double hidden_share(double wire, double comp, double total) {
    double h = comp > 0 ? (wire + comp - total) / comp : 0.0;
    return h < 0 ? 0.0 : h > 1 ? 1.0 : h;
}

void perf_measure_overlap(const opts_t *o, const gs_source_t *src, size_t count, double ratio,
                          int d, double total_us, float *sendbuf, float *recvbuf,
                          perf_overlap_t *ov) {
    memset(ov, 0, sizeof *ov);
    ov->bytes = count * sizeof(float);
    ov->count = count;
    ov->ratio = ratio;
    ov->d = d;
    ov->total = total_us;
    ov->chunk = cb_chunk_bytes();
    measure_wire(o, sendbuf, recvbuf, ov);
    cb_gradiveq_t *cb = make_codec(o, src, ov, ov->err, sizeof ov->err);
    if (cb == NULL) return;
    perf_source_fill(src, perf_rank, 0, 0, count, sendbuf);
    measure_compute(cb, sendbuf, ov);
    cb_gradiveq_free(cb);
    /* the vote rides inside the compressed message: not added */
    ov->hidden = hidden_share(ov->wire, ov->comp, ov->total);
    ov->hidden_alone = hidden_share(ov->wire, ov->comp_alone, ov->total);
}

void perf_print_overlap(const perf_overlap_t *ov, int n) {
    printf(
        "# overlap (gradiveq, out-of-place): T_total = the compressed allreduce (table above);\n"
        "#   T_wire = plain gvqAllReduce of count/ratio floats with chunks of chunk/ratio bytes\n"
        "#   (the same messages, no compute); T_vote = a separate 1-int allreduce, for reference\n"
        "#   only (the loss vote rides inside the compressed message: 4 bytes per segment);\n"
        "#   T_wire1 = the same with the communicator's chunk; T_enc, T_dec = encode+combine and\n"
        "#   decode of the whole local vector through the codec, all ranks at once (max over\n"
        "#   ranks); T_comp = T_enc + T_dec; alone = rank 0 alone, the others asleep;\n"
        "#   hidden = clamp((T_wire + T_comp - T_total) / T_comp, 0, 1)\n");
    printf("#%11s%7s%4s%7s%11s%11s%8s%11s%10s%10s%10s%10s%8s%8s\n", "size", "ratio", "d", "chunk",
           "T_total", "T_wire", "T_vote", "T_wire1", "T_enc", "T_dec", "T_comp", "alone", "hidden",
           "alone");
    printf("#%11s%7s%4s%7s%11s%11s%8s%11s%10s%10s%10s%10s%8s%8s\n", "(B)", "", "", "(KiB)", "(us)",
           "(us)", "(us)", "(us)", "(us)", "(us)", "(us)", "(us)", "", "");
    for (int k = 0; k < n; k++) {
        if (ov[k].err[0]) {
            printf("%12zu  n/a: %s\n", ov[k].bytes, ov[k].err);
            continue;
        }
        printf("%12zu%7.2f%4d%7zu%11.0f%11.0f%8.0f%11.0f%10.0f%10.0f%10.0f%10.0f%8.2f%8.2f\n",
               ov[k].bytes, ov[k].ratio, ov[k].d, ov[k].chunk / 1024, ov[k].total, ov[k].wire,
               ov[k].vote, ov[k].wire_def, ov[k].enc, ov[k].dec, ov[k].comp, ov[k].comp_alone,
               ov[k].hidden, ov[k].hidden_alone);
    }
    printf("#\n");
}
