/*
 * gvq_perf.c -- gvq-perf: allreduce bandwidth in the style of nccl-tests' all_reduce_perf, with
 * the codec as an extra column so gvq's ring, Open MPI's MPI_Allreduce and gvq's compressed
 * allreduce (GradiVeQ, QSGD) are measured side by side in one run, on the same buffers.
 *
 *   mpirun -np 4 gvq-perf -b 8 -e 128M -f 2 -n 20 -w 5 -d float -o sum -C none,mpi
 *   mpirun -np 4 gvq-perf -b 64M -e 64M -C none,gradiveq,qsgd -n 5 -w 2 --overlap -T 100
 *          --eps 0.003 -S 100000 --state-dir /tmp/gvq-state       (GradiVeQ at ratio 8)
 *
 * This file is the driver: it picks the benchmark from the command line and runs the allreduce
 * table. For every size (min, min*f, ... <= max) and every codec it calls the codec's benchmark
 * (perf_bench.h), which times the out-of-place case, then the in-place one:
 *
 *   none, mpi        perf_allreduce.c   block timing of `iters` calls, #wrong against a closed form
 *   gradiveq, qsgd   perf_compressed.c  per-call timing in the compressed phase, rel_err against
 *                                       the exact sum
 *
 * then perf_report.c prints the row (and the CSV line). After the table: per codec the average
 * bus bandwidth, the compressor details, the ratio tables (none/mpi; none/gradiveq, none/qsgd,
 * qsgd/gradiveq), then the overlap table (--overlap, perf_overlap.c). The other modes run instead
 * of the table and exit: -C sparse-ag|ps|dense (perf_sparse.c), --fit-bench (perf_fitbench.c),
 * --write-replay (perf_compressed.c).
 *
 * The files, each calling only files on lower lines (scripts/check-calls.py checks that no two
 * call each other); all but internal/ see the public headers only:
 *
 *   gvq_perf.c                                         the driver (this file)
 *   perf_report.c  perf_overlap.c  perf_fitbench.c     perf_sparse.c
 *   perf_allreduce.c  perf_compressed.c                perf_sparse_tune.c
 *   perf_args.c (the command line)                     perf_sparse_steps.c
 *   perf_common.c (MPI helpers, median, option tables), perf_gradsrc.c (gradient sources)
 *   internal/ (gvq_perf_internal: codec and PCA fit timed directly, typed element access)
 *
 * Exit status: 0 all correct, 1 some #wrong > 0, 2 bad arguments, 3 a compressed codec could
 * not be timed (it never stayed in its compressed phase) or its source failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_args.h"
#include "perf_bench.h"
#include "perf_common.h"
#include "perf_compressed.h"
#include "perf_fitbench.h"
#include "perf_overlap.h"
#include "perf_report.h"
#include "perf_sparse.h"

static const perf_bench_t *const benches[NUM_CODECS] = {
    [CODEC_NONE] = &perf_bench_none,
    [CODEC_MPI] = &perf_bench_mpi,
    [CODEC_GRADIVEQ] = &perf_bench_gradiveq,
    [CODEC_QSGD] = &perf_bench_qsgd,
};

/* ---- setting up ----------------------------------------------------------------------------- */

/* The codecs that run: those of -C that can run o's datatype and op; skips[c] says why not. */
static void choose_codecs(const opts_t *o, perf_results_t *r, char skipbuf[NUM_CODECS][128],
                          const char *skips[NUM_CODECS]) {
    for (int k = 0; k < o->codecs.n; k++) {
        codec_t c = o->codecs.list[k];
        skips[c] = benches[c]->skip_reason(o, skipbuf[c], sizeof skipbuf[c]);
        if (skips[c] != NULL) continue;
        r->run[r->nrun++] = c;
        r->have[c] = 1;
        r->lossy |= codec_is_lossy(c);
    }
}

/* The sizes: min, min*f, ... <= max; each as elements of the datatype and their bytes. */
static void plan_sizes(const opts_t *o, perf_results_t *r) {
    for (size_t s = o->minbytes;; s *= (size_t)o->factor) {
        size_t count = s / o->dt->size;
        r->count[r->nsizes] = count;
        r->bytes[r->nsizes] = count * o->dt->size;
        r->nsizes++;
        if (s == 0 || s > o->maxbytes / (size_t)o->factor) break;
    }
    r->cases = calloc(r->nsizes * NUM_CODECS, sizeof *r->cases);
    if (r->cases == NULL) {
        fprintf(stderr, "gvq-perf: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t k = 0; k < r->nsizes * NUM_CODECS; k++)
        r->cases[k].res[0] = r->cases[k].res[1] = RESULT_NONE;
}

/* perf_comm over every rank, which must see the ranks as MPI does. */
static void open_comm(void) {
    perf_comm = perf_comm_create(NULL);
    int ccount = 0, crank = -1;
    GVQTEST(gvqCommCount(perf_comm, &ccount));
    GVQTEST(gvqCommUserRank(perf_comm, &crank));
    if (ccount != perf_nranks || crank != perf_rank) {
        fprintf(stderr, "gvq-perf: rank %d: communicator says rank %d of %d, MPI says %d of %d\n",
                perf_rank, crank, ccount, perf_rank, perf_nranks);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

/* ---- the table ------------------------------------------------------------------------------ */

/* Adds one case to the totals: wrong elements, untimed compressed cases, bus bandwidth. */
static void tally_case(perf_results_t *r, size_t z, codec_t c, const perf_case_t *pc) {
    for (int ip = 0; ip < 2; ip++) {
        if (pc->res[ip].wrong > 0) r->total_wrong += pc->res[ip].wrong;
        if (pc->res[ip].time_us < 0) {
            r->untimed_cases += codec_is_lossy(c) && r->count[z] > 0;
            continue;
        }
        r->busbw_sum[c] +=
            perf_algbw(r->bytes[z], pc->res[ip].time_us) * perf_busfactor(perf_nranks);
        r->busbw_n[c]++;
    }
}

/* Size z for every codec that runs, its rows; then GradiVeQ's overlap at that size (--overlap,
 * when its out-of-place case was timed in the compressed phase). */
static void run_size(const perf_run_t *run, perf_results_t *r, size_t z, FILE *csv,
                     perf_overlap_t *ovs, int *novs) {
    const opts_t *o = run->o;
    for (int k = 0; k < r->nrun; k++) {
        codec_t c = r->run[k];
        perf_case_t *pc = perf_case(r, z, c);
        benches[c]->run_size(benches[c], run, r->count[z], pc);
        tally_case(r, z, c, pc);
        if (perf_rank != 0) continue;
        perf_print_row(o, r->bytes[z], r->count[z], c, pc->res, r->lossy);
        if (csv != NULL) perf_csv_row(csv, o, r->bytes[z], r->count[z], c, pc->res, r->lossy);
    }
    const perf_case_t *gq = perf_case(r, z, CODEC_GRADIVEQ);
    if (o->overlap && r->have[CODEC_GRADIVEQ] && gq->res[0].time_us > 0 && gq->dims > 0)
        perf_measure_overlap(o, run->src, r->count[z], gq->res[0].ratio, gq->dims,
                             gq->res[0].time_us, run->sendbuf, run->recvbuf, &ovs[(*novs)++]);
}

/* Every size, the table as it goes, then the summary; returns the exit status. */
static int run_table(const opts_t *o, perf_results_t *r, const gs_source_t *src, FILE *csv) {
    perf_run_t run = {o, perf_alloc_buffer(o->maxbytes), perf_alloc_buffer(o->maxbytes), src};
    perf_overlap_t *ovs = calloc(r->nsizes, sizeof *ovs);
    if (ovs == NULL) {
        fprintf(stderr, "gvq-perf: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int novs = 0;
    if (perf_rank == 0) perf_print_table_header(r->lossy);
    for (size_t z = 0; z < r->nsizes; z++)
        run_size(&run, r, z, csv, ovs, &novs);
    if (perf_rank == 0) {
        perf_print_summary(o, r);
        if (novs > 0) perf_print_overlap(ovs, novs);
        fflush(stdout);
    }
    free(run.sendbuf);
    free(run.recvbuf);
    free(ovs);
    return r->total_wrong > 0 ? 1 : r->untimed_cases > 0 ? 3 : 0;
}

/* The allreduce table (none, mpi, gradiveq, qsgd); returns the exit status. */
static int run_allreduce(const opts_t *o) {
    perf_results_t r;
    memset(&r, 0, sizeof r);
    char skipbuf[NUM_CODECS][128];
    const char *skips[NUM_CODECS] = {NULL, NULL, NULL, NULL};
    choose_codecs(o, &r, skipbuf, skips);
    if (o->overlap && !r.have[CODEC_GRADIVEQ] && perf_rank == 0)
        printf("# --overlap: not measured (needs codec gradiveq to run)\n");
    gs_source_t *src = NULL;
    if (r.lossy && (src = perf_source_open(o)) == NULL) return 2;
    FILE *csv = NULL;
    if (perf_csv_open(o, r.lossy, &csv) != 0) {
        gs_free(src);
        return 2;
    }
    open_comm();
    perf_report_start(o, &r, skips, src);
    plan_sizes(o, &r);
    int rc = run_table(o, &r, src, csv);
    if (csv != NULL) fclose(csv);
    free(r.cases);
    gs_free(src);
    GVQTEST(gvqCommDestroy(perf_comm));
    perf_comm = NULL;
    return rc;
}

int main(int argc, char **argv) {
    perf_mpi_init(&argc, &argv);
    int rc;
    opts_t o;
    if (perf_sparse_requested(argc, argv)) /* -C sparse-ag|ps|dense */
        rc = perf_sparse_main(argc, argv);
    else if ((rc = perf_parse_args(argc, argv, &o, perf_rank == 0)) != 0)
        rc = rc == 1 ? 0 : 2;
    else if (o.write_replay != NULL)
        rc = perf_write_replay(&o);
    else if (o.fit_bench)
        rc = perf_fit_bench(&o);
    else
        rc = run_allreduce(&o);
    MPI_Finalize();
    return rc;
}
