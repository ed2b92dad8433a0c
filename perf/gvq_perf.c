/*
 * gvq_perf.c -- gvq-perf: collective bandwidth in the style of nccl-tests (one table per
 * collective: allreduce, reducescatter, allgather, broadcast, reduce, sendrecv), with the codec
 * as an extra column so gvq's call and its MPI counterpart (and, for allreduce, gvq's
 * compressed allreduce: GradiVeQ, QSGD) are measured side by side in one run, on the same
 * buffers.
 *
 *   mpirun -np 4 gvq-perf -b 8 -e 128M -f 2 -n 20 -w 5 -d float -o sum -C none,mpi
 *   mpirun -np 4 gvq-perf -k all -b 1K -e 64M -f 4                 (every collective)
 *   mpirun -np 4 gvq-perf -b 64M -e 64M -C none,gradiveq,qsgd -n 5 -w 2 --overlap -T 100
 *          --eps 0.003 -S 100000 --state-dir /tmp/gvq-state       (GradiVeQ at ratio 8)
 *
 * This file is the driver: it picks the benchmark from the command line and runs one table per
 * collective of -k. For every size (min, min*f, ... <= max) and every codec it calls the
 * codec's benchmark (perf_bench.h), which times the out-of-place case, then the in-place one:
 *
 *   none, mpi        perf_plain.c       block timing of `iters` calls, #wrong against a closed
 *                                       form (every collective)
 *   gradiveq, qsgd   perf_compressed.c  per-call timing in the compressed phase, rel_err against
 *                                       the exact sum (allreduce only)
 *
 * then perf_report.c prints the row (and the CSV line), and perf_progress.c the progress line.
 * After each table: per codec the average bus bandwidth, the compressor details, the ratio
 * tables (none/mpi; none/gradiveq, none/qsgd, qsgd/gradiveq), then the overlap table
 * (--overlap, perf_overlap.c). The other modes run instead of the tables and exit: -C
 * sparse-ag|ps|dense (perf_sparse.c), --fit-bench (perf_fitbench.c), --write-replay
 * (perf_compressed.c).
 *
 * The files, each calling only files on lower lines (scripts/check-calls.py checks that no two
 * call each other); all but internal/ see the public headers only:
 *
 *   gvq_perf.c                                         the driver (this file)
 *   perf_report.c  perf_overlap.c  perf_fitbench.c     perf_sparse.c
 *   perf_plain.c  perf_compressed.c  perf_progress.c   perf_sparse_tune.c
 *   perf_pattern.c (data and closed forms)             perf_sparse_steps.c
 *   perf_args.c (the command line)
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
#include "perf_progress.h"
#include "perf_report.h"
#include "perf_sparse.h"

static const perf_bench_t *const benches[NUM_CODECS] = {
    [CODEC_NONE] = &perf_bench_none,         [CODEC_MPI] = &perf_bench_mpi,
    [CODEC_GRADIVEQ] = &perf_bench_gradiveq, [CODEC_QSGD] = &perf_bench_qsgd,
    [CODEC_POWERSGD] = &perf_bench_powersgd,
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

/* The sizes: min, min*f, ... <= max; each as elements of the datatype and their bytes.
 * reducescatter and allgather: a multiple of nranks elements (nccl-tests rounds down too). */
static void plan_sizes(const opts_t *o, perf_results_t *r) {
    size_t unit = o->coll == COLL_REDUCESCATTER || o->coll == COLL_ALLGATHER ? perf_nranks : 1;
    for (size_t s = o->minbytes;; s *= (size_t)o->factor) {
        size_t count = s / o->dt->size / unit * unit;
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
static void tally_case(const opts_t *o, perf_results_t *r, size_t z, codec_t c,
                       const perf_case_t *pc) {
    for (int ip = 0; ip < 2; ip++) {
        if (pc->res[ip].wrong > 0) r->total_wrong += pc->res[ip].wrong;
        if (pc->res[ip].time_us < 0) {
            r->untimed_cases += codec_is_lossy(c) && r->count[z] > 0;
            continue;
        }
        r->busbw_sum[c] +=
            perf_algbw(r->bytes[z], pc->res[ip].time_us) * perf_busfactor(o->coll, perf_nranks);
        r->busbw_n[c]++;
    }
}

/* The progress weight of codec c's cases at `bytes`: both cases' calls (sendrecv: one case),
 * and for a compressed codec its warm-up and sampling calls too. */
static double case_weight(const opts_t *o, codec_t c, size_t bytes) {
    long long calls = (long long)o->warmup + o->iters + (o->check != 0);
    if (codec_is_lossy(c)) calls += o->W + o->T + 1;
    return perf_progress_weight(calls * (o->coll == COLL_SENDRECV ? 1 : 2), bytes);
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
        tally_case(o, r, z, c, pc);
        char what[96];
        snprintf(what, sizeof what, "%s %zu B %s", perf_coll_names[o->coll], r->bytes[z],
                 perf_codec_names[c]);
        perf_progress_clear();
        if (perf_rank == 0) {
            perf_print_row(o, r->bytes[z], r->count[z], c, pc->res, r->lossy);
            if (csv != NULL)
                perf_csv_row(csv, o, r->bytes[z], r->count[z], c, pc->res, run->csv_lossy);
        }
        perf_progress_step(case_weight(o, c, r->bytes[z]), what);
    }
    const perf_case_t *gq = perf_case(r, z, CODEC_GRADIVEQ);
    if (o->overlap && r->have[CODEC_GRADIVEQ] && gq->res[0].time_us > 0 && gq->dims > 0) {
        perf_progress_clear();
        perf_measure_overlap(o, run->src, r->count[z], gq->res[0].ratio, gq->dims,
                             gq->res[0].time_us, run->sendbuf, run->recvbuf, &ovs[(*novs)++]);
    }
}

/* Every size, the table as it goes, then the summary. */
static void run_table(const perf_run_t *run, perf_results_t *r, FILE *csv) {
    const opts_t *o = run->o;
    perf_overlap_t *ovs = calloc(r->nsizes, sizeof *ovs);
    if (ovs == NULL) {
        fprintf(stderr, "gvq-perf: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int novs = 0;
    if (perf_rank == 0) perf_print_table_header(r->lossy);
    for (size_t z = 0; z < r->nsizes; z++)
        run_size(run, r, z, csv, ovs, &novs);
    perf_progress_clear();
    if (perf_rank == 0) {
        perf_print_summary(o, r);
        if (novs > 0) perf_print_overlap(ovs, novs);
        fflush(stdout);
    }
    free(ovs);
}

/* Collective k of -k: o with o->coll set, the codecs that run and the sizes. */
typedef struct {
    opts_t o;
    perf_results_t r;
    char skipbuf[NUM_CODECS][128];
    const char *skips[NUM_CODECS];
} coll_plan_t;

static void plan_collective(const opts_t *o, coll_t coll, coll_plan_t *p) {
    memset(p, 0, sizeof *p);
    p->o = *o;
    p->o.coll = coll;
    choose_codecs(&p->o, &p->r, p->skipbuf, p->skips);
    plan_sizes(&p->o, &p->r);
}

/* The progress weight of every case of the run. */
static double total_weight(const coll_plan_t *plans, int n) {
    double w = 0.0;
    for (int k = 0; k < n; k++)
        for (size_t z = 0; z < plans[k].r.nsizes; z++)
            for (int c = 0; c < plans[k].r.nrun; c++)
                w += case_weight(&plans[k].o, plans[k].r.run[c], plans[k].r.bytes[z]);
    return w;
}

/* One table per collective of -k; returns the exit status. */
static int run_tables(const opts_t *o) {
    coll_plan_t *plans = calloc((size_t)o->colls.n, sizeof *plans);
    if (plans == NULL) {
        fprintf(stderr, "gvq-perf: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int lossy = 0, overlap_ok = 0;
    for (int k = 0; k < o->colls.n; k++) {
        plan_collective(o, o->colls.list[k], &plans[k]);
        lossy |= plans[k].r.lossy;
        overlap_ok |= plans[k].r.have[CODEC_GRADIVEQ];
    }
    if (o->overlap && !overlap_ok && perf_rank == 0)
        printf("# --overlap: not measured (needs codec gradiveq to run)\n");
    gs_source_t *src = NULL;
    FILE *csv = NULL;
    int rc = 0;
    if (lossy && (src = perf_source_open(o)) == NULL) rc = 2;
    if (rc == 0 && perf_csv_open(o, lossy, &csv) != 0) rc = 2;
    if (rc == 0) {
        open_comm();
        perf_report_start(o, lossy, src);
        perf_progress_start(o->progress, total_weight(plans, o->colls.n));
        perf_run_t run = {NULL, perf_alloc_buffer(o->maxbytes), perf_alloc_buffer(o->maxbytes), src,
                          lossy};
        int64_t wrong = 0;
        int untimed = 0;
        for (int k = 0; k < o->colls.n; k++) {
            run.o = &plans[k].o;
            if (perf_rank == 0) perf_print_coll_header(run.o, plans[k].skips);
            run_table(&run, &plans[k].r, csv);
            wrong += plans[k].r.total_wrong;
            untimed += plans[k].r.untimed_cases;
        }
        perf_progress_end();
        rc = wrong > 0 ? 1 : untimed > 0 ? 3 : 0;
        free(run.sendbuf);
        free(run.recvbuf);
        GVQTEST(gvqCommDestroy(perf_comm));
        perf_comm = NULL;
    }
    if (csv != NULL) fclose(csv);
    for (int k = 0; k < o->colls.n; k++)
        free(plans[k].r.cases);
    free(plans);
    gs_free(src);
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
        rc = run_tables(&o);
    MPI_Finalize();
    return rc;
}
