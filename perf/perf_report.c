/*
 * perf_report.c -- what gvq-perf's benchmarks print, in nccl-tests' layout: the run's header
 * and ranks; per collective a header, one row per (size, codec) with out-of-place and in-place
 * side by side (and the same row as CSV, with the collective in its own field), then the
 * summary: average bus bandwidth per codec, the compressor details, and the ratio tables
 * (none/mpi; none/gradiveq, none/qsgd, qsgd/gradiveq).
 *
 * time is per call (us); algbw = bytes / time; busbw = algbw * the collective's factor
 * (perf_busfactor: nccl-tests'), always of the uncompressed size. Everything here prints on rank 0
 * only, except perf_report_start, which gathers the ranks' hosts.
 */
#include "perf_report.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal/perf_codecbench.h"
#include "perf_common.h"

/* ---- the run's header --------------------------------------------------------------------- */

static void print_compressed_header(const opts_t *o, const gs_source_t *src) {
    char desc[400], s_buf[32];
    gs_describe(src, desc, sizeof desc);
    if (o->S == GVQ_CONFIG_UNDEF_INT)
        snprintf(s_buf, sizeof s_buf, "library default");
    else
        snprintf(s_buf, sizeof s_buf, "%d", o->S);
    printf("# compressed: gradiveq basis %s L=%d maxDims=%d eps=%g T=%d S=%s W=%d sample-codec %s "
           "wire %s; qsgd %d bits, bucket %d; codec chunk %zu B\n",
           o->basis ? "track" : "fit", o->L, o->dmax, o->eps, o->T, s_buf, o->W,
           o->sample_qsgd ? "qsgd" : "none",
           o->wire == 1    ? "fp16"
           : o->wire == 8  ? "int8"
           : o->wire == 16 ? "int16"
                           : "fp32",
           o->qbits, o->qbucket, cb_chunk_bytes());
    printf("# gradient source: %s\n", desc);
    printf("# gradiveq: ONLY calls made in the compressed phase are timed (warm-up, sampling\n"
           "#   and the fitting call run untimed, before the -w warmup calls); qsgd: every\n"
           "#   call after the warmup ones; each timed call starts after a barrier, with a\n"
           "#   fresh gradient (iteration t); time, algbw, busbw: of the uncompressed size;\n"
           "#   ratio: uncompressed / wire bytes (compressor stats); rel_err: ||y - exact|| /\n"
           "#   ||exact|| of the last timed call, exact = the sum of every rank's input in\n"
           "#   double; #wrong: none and mpi only\n");
    int rmax = perf_grad_rank_auto(o->T, o->dmax, o->eps);
    if (o->replay == NULL && o->grad_rank > rmax)
        printf("# warning: the source has %d directions per slice; a fit on T=%d samples at "
               "eps %g keeps about %d for sure: expect dropped directions, a loss far above eps "
               "and early exits (raise -T or lower --grad-rank)\n",
               o->grad_rank, o->T, o->eps, rmax);
    if (o->T - 1 < o->dmax)
        printf("# note: d <= T-1 = %d (a fit on T samples sees at most T-1 directions): the "
               "ratio is at least %.1f\n",
               o->T - 1, (double)o->L / (o->T - 1));
}

static void print_header(const opts_t *o, int lossy, const gs_source_t *src) {
    char list[64] = "", colls[128] = "";
    for (int k = 0; k < o->codecs.n; k++) {
        if (k) strcat(list, ",");
        strcat(list, perf_codec_names[o->codecs.list[k]]);
    }
    for (int k = 0; k < o->colls.n; k++) {
        if (k) strcat(colls, ",");
        strcat(colls, perf_coll_names[o->colls.list[k]]);
    }
    printf("# gvq-perf: nranks %d, dtype %s, op %s, iters %d, warmup %d, codecs %s\n", perf_nranks,
           o->dt->name, perf_op_names[o->op], o->iters, o->warmup, list);
    printf("#  minBytes %zu maxBytes %zu step: %d(factor) validation: %d collectives: %s root: "
           "%d\n",
           o->minbytes, o->maxbytes, o->factor, o->check, colls, o->root);
    if (lossy) print_compressed_header(o, src);
}

/* gvq's call for each collective (codec none). */
static const char *const gvq_calls[NUM_COLLS] = {"gvqAllReduce", "gvqReduceScatter",
                                                 "gvqAllGather", "gvqBroadcast",
                                                 "gvqReduce",    "gvqSend+gvqRecv (group)"};
static const char *const bus_factors[NUM_COLLS] = {"2(n-1)/n", "(n-1)/n", "(n-1)/n", "1", "1", "1"};
static const char *const size_notes[NUM_COLLS] = {"",
                                                  ", size: the input (recvcount * nranks)",
                                                  ", size: the output (sendcount * nranks)",
                                                  ", root %d",
                                                  ", root %d",
                                                  ", rank r sends to r+1 (in-place: n/a)"};

void perf_print_coll_header(const opts_t *o, const char *const skips[NUM_CODECS]) {
    char note[96];
    snprintf(note, sizeof note, size_notes[o->coll], o->root);
    printf("#\n# collective %s: %s (codec none) against %s (codec mpi), busbw = algbw * %s%s\n",
           perf_coll_names[o->coll], gvq_calls[o->coll], perf_coll_mpi_names[o->coll],
           bus_factors[o->coll], note);
    for (int c = 0; c < NUM_CODECS; c++)
        if (skips[c] != NULL) printf("# codec %s skipped: %s\n", perf_codec_names[c], skips[c]);
}

/* Every rank's pid and host, gathered on rank 0. Collective. */
static void print_ranks(void) {
    char host[64] = "";
    int pid = (int)getpid(), nranks = perf_nranks;
    gethostname(host, sizeof host - 1);
    char *hosts = NULL;
    int *pids = NULL;
    if (perf_rank == 0) {
        hosts = malloc((size_t)nranks * sizeof host);
        pids = malloc((size_t)nranks * sizeof *pids);
        if (hosts == NULL || pids == NULL) {
            fprintf(stderr, "gvq-perf: out of memory\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    MPITEST(MPI_Gather(host, (int)sizeof host, MPI_CHAR, hosts, (int)sizeof host, MPI_CHAR, 0,
                       MPI_COMM_WORLD));
    MPITEST(MPI_Gather(&pid, 1, MPI_INT, pids, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (perf_rank == 0) {
        printf("#\n# Using ranks\n");
        for (int r = 0; r < nranks; r++)
            printf("#  Rank %2d Pid %7d on %s\n", r, pids[r], hosts + (size_t)r * sizeof host);
        printf("#\n");
    }
    free(hosts);
    free(pids);
}

/* none and mpi check sums and averages exactly: integers up to 5*nranks must fit the type. */
static void warn_inexact(const opts_t *o) {
    if (!o->check || !o->dt->is_float || o->op == gvqProd || o->op == gvqMax || o->op == gvqMin)
        return;
    int plain = 0;
    for (int k = 0; k < o->codecs.n; k++)
        plain |= !codec_is_lossy(o->codecs.list[k]);
    if (!plain) return;
    int limit = o->dt->type == gvqBfloat16 ? 256 : o->dt->type == gvqFloat16 ? 2048 : 1 << 24;
    if (5 * perf_nranks > limit)
        printf("# warning: %d ranks: sums may not be exact in %s; #wrong may be spurious\n",
               perf_nranks, o->dt->name);
}

void perf_report_start(const opts_t *o, int lossy, const gs_source_t *src) {
    if (perf_rank == 0) print_header(o, lossy, src);
    print_ranks();
    if (perf_rank == 0) warn_inexact(o);
}

/* ---- the table ---------------------------------------------------------------------------- */

void perf_print_table_header(int extra) {
    if (!extra) {
        printf("#%75s%32s\n", "out-of-place", "in-place");
        printf("#%11s%14s%10s%8s%9s%10s%8s%8s%8s%10s%8s%8s%8s\n", "size", "count", "type", "redop",
               "codec", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
        printf("#%11s%14s%10s%8s%9s%10s%8s%8s%8s%10s%8s%8s%8s\n", "(B)", "(elements)", "", "", "",
               "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
        return;
    }
    printf("#%92s%51s\n", "out-of-place", "in-place");
    printf("#%11s%14s%10s%8s%9s%10s%8s%8s%8s%7s%10s%10s%8s%8s%8s%7s%10s\n", "size", "count", "type",
           "redop", "codec", "time", "algbw", "busbw", "#wrong", "ratio", "rel_err", "time",
           "algbw", "busbw", "#wrong", "ratio", "rel_err");
    printf("#%11s%14s%10s%8s%9s%10s%8s%8s%8s%7s%10s%10s%8s%8s%8s%7s%10s\n", "(B)", "(elements)", "",
           "", "", "(us)", "(GB/s)", "(GB/s)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "", "");
}

/* nccl-tests' time format: fewer decimals as the number grows. */
static void fmt_time(char *buf, size_t len, double us) {
    if (us < 0.0)
        snprintf(buf, len, "n/a");
    else if (us >= 10000.0)
        snprintf(buf, len, "%.0f", us);
    else if (us >= 100.0)
        snprintf(buf, len, "%.1f", us);
    else
        snprintf(buf, len, "%.2f", us);
}

static void fmt_wrong(char *buf, size_t len, int64_t wrong) {
    if (wrong < 0)
        snprintf(buf, len, "N/A");
    else
        snprintf(buf, len, "%lld", (long long)wrong);
}

/* The ratio and rel_err columns of one case. */
static void print_extra_columns(codec_t codec, const result_t *res) {
    if (res->ratio > 0)
        printf("%7.2f", res->ratio);
    else
        printf("%7s", codec_is_lossy(codec) ? "n/a" : "1.00");
    if (res->rel_err >= 0)
        printf("%10.2e", res->rel_err);
    else
        printf("%10s", "N/A");
}

/* The redop column: nccl-tests prints "none" for the collectives that do not reduce. */
static const char *op_name(const opts_t *o) {
    return coll_reduces(o->coll) ? perf_op_names[o->op] : "none";
}

void perf_print_row(const opts_t *o, size_t bytes, size_t count, codec_t codec,
                    const result_t res[2], int extra) {
    double busfactor = perf_busfactor(o->coll, perf_nranks);
    printf("%12zu%14zu%10s%8s%9s", bytes, count, o->dt->name, op_name(o), perf_codec_names[codec]);
    for (int ip = 0; ip < 2; ip++) {
        char t[32], w[32];
        double alg = perf_algbw(bytes, res[ip].time_us);
        fmt_time(t, sizeof t, res[ip].time_us);
        fmt_wrong(w, sizeof w, res[ip].wrong);
        printf("%10s%8.2f%8.2f%8s", t, alg, alg * busfactor, w);
        if (extra) print_extra_columns(codec, &res[ip]);
    }
    printf("\n");
    fflush(stdout);
}

/* ---- CSV ---------------------------------------------------------------------------------- */

int perf_csv_open(const opts_t *o, int lossy, FILE **csv) {
    int ok = 1;
    *csv = NULL;
    if (perf_rank == 0 && o->csv != NULL) {
        *csv = fopen(o->csv, "w");
        if (*csv == NULL) {
            fprintf(stderr, "gvq-perf: cannot open %s: %s\n", o->csv, strerror(errno));
            ok = 0;
        } else {
            fprintf(*csv,
                    "nranks,collective,dtype,op,codec,size_bytes,count,oop_time_us,oop_algbw_gbs,"
                    "oop_busbw_gbs,oop_wrong,ip_time_us,ip_algbw_gbs,ip_busbw_gbs,ip_wrong%s\n",
                    lossy ? ",oop_ratio,oop_rel_err,ip_ratio,ip_rel_err" : "");
        }
    }
    MPITEST(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
    return ok ? 0 : -1;
}

void perf_csv_row(FILE *f, const opts_t *o, size_t bytes, size_t count, codec_t codec,
                  const result_t res[2], int extra) {
    double busfactor = perf_busfactor(o->coll, perf_nranks);
    fprintf(f, "%d,%s,%s,%s,%s,%zu,%zu", perf_nranks, perf_coll_names[o->coll], o->dt->name,
            op_name(o), perf_codec_names[codec], bytes, count);
    for (int ip = 0; ip < 2; ip++) {
        double alg = perf_algbw(bytes, res[ip].time_us);
        if (res[ip].time_us >= 0)
            fprintf(f, ",%.3f,%.6f,%.6f,", res[ip].time_us, alg, alg * busfactor);
        else
            fprintf(f, ",,,,");
        if (res[ip].wrong >= 0) fprintf(f, "%lld", (long long)res[ip].wrong);
    }
    if (extra)
        for (int ip = 0; ip < 2; ip++) {
            fprintf(f, ",");
            if (res[ip].ratio > 0) fprintf(f, "%.4f", res[ip].ratio);
            fprintf(f, ",");
            if (res[ip].rel_err >= 0) fprintf(f, "%.6e", res[ip].rel_err);
        }
    fprintf(f, "\n");
    fflush(f);
}

/* ---- the summary -------------------------------------------------------------------------- */

static void print_totals(const opts_t *o, const perf_results_t *r) {
    printf("# Out of bounds values : %lld %s\n", (long long)r->total_wrong,
           !o->check        ? "(not checked)"
           : r->total_wrong ? "FAILED"
                            : "OK");
    for (int k = 0; k < r->nrun; k++) {
        codec_t c = r->run[k];
        printf("# Avg bus bandwidth    : %.3f  (codec %s%s)\n",
               r->busbw_n[c] ? r->busbw_sum[c] / r->busbw_n[c] : 0.0, perf_codec_names[c],
               codec_is_lossy(c) ? ", of the uncompressed size" : "");
    }
    printf("#\n");
}

static void print_details(const perf_results_t *r) {
    printf("# compressor details (per size, after the in-place case)\n");
    for (size_t z = 0; z < r->nsizes; z++)
        for (int c = 0; c < NUM_CODECS; c++)
            if (perf_case(r, z, (codec_t)c)->details[0])
                printf("%s\n", perf_case(r, z, (codec_t)c)->details);
    if (r->untimed_cases)
        printf("# %d compressed case(s) NOT TIMED (see above)\n", r->untimed_cases);
    printf("#\n");
}

/* Geometric mean of the ratios whose logs add up to logsum; 0 when there are none. */
static double geomean(double logsum, int n) {
    return n ? exp(logsum / n) : 0.0;
}

/* busbw(none) / busbw(mpi) = time(mpi) / time(none); the time form holds at 1 rank. */
static void print_ratio_none_mpi(const opts_t *o, const perf_results_t *r) {
    double logsum[3] = {0, 0, 0};
    int nlog[3] = {0, 0, 0};
    printf("# ratio none/mpi (%s): busbw of %s over busbw of %s "
           "(= time mpi / time none; > 1: gvq faster)\n",
           perf_coll_names[o->coll], gvq_calls[o->coll], perf_coll_mpi_names[o->coll]);
    printf("#%11s%14s%14s%14s\n", "size", "count", "out-of-place", "in-place");
    printf("#%11s%14s%14s%14s\n", "(B)", "(elements)", "", "");
    for (size_t z = 0; z < r->nsizes; z++) {
        const result_t *rn = perf_case(r, z, CODEC_NONE)->res;
        const result_t *rm = perf_case(r, z, CODEC_MPI)->res;
        printf("%12zu%14zu", r->bytes[z], r->count[z]);
        for (int ip = 0; ip < 2; ip++) {
            if (rn[ip].time_us > 0.0 && rm[ip].time_us > 0.0) {
                double ratio = rm[ip].time_us / rn[ip].time_us;
                printf("%14.3f", ratio);
                logsum[ip] += log(ratio);
                nlog[ip]++;
                logsum[2] += log(ratio);
                nlog[2]++;
            } else {
                printf("%14s", "n/a");
            }
        }
        printf("\n");
    }
    printf("# Geometric mean ratio :");
    static const char *const labels[3] = {"out-of-place", "in-place", "both"};
    for (int k = 0; k < 3; k++)
        if (nlog[k])
            printf(" %s %.3f ", labels[k], geomean(logsum[k], nlog[k]));
        else
            printf(" %s n/a ", labels[k]);
    printf("\n");
}

/* time(a) / time(b) for out-of-place and in-place, "n/a" where either is missing. */
static void print_time_ratio(const result_t *ra, const result_t *rb, double logsum[2],
                             int nlog[2]) {
    for (int ip = 0; ip < 2; ip++) {
        if (ra[ip].time_us > 0.0 && rb[ip].time_us > 0.0) {
            double q = ra[ip].time_us / rb[ip].time_us;
            printf("%10.3f", q);
            logsum[ip] += log(q);
            nlog[ip]++;
        } else {
            printf("%10s", "n/a");
        }
    }
}

static void print_ratio_compressed(const perf_results_t *r) {
    static const codec_t pa[3] = {CODEC_NONE, CODEC_NONE, CODEC_QSGD};
    static const codec_t pb[3] = {CODEC_GRADIVEQ, CODEC_QSGD, CODEC_GRADIVEQ};
    double logsum[3][2] = {{0, 0}, {0, 0}, {0, 0}};
    int nlog[3][2] = {{0, 0}, {0, 0}, {0, 0}};
    printf("# ratio compressed: time(a) / time(b) (> 1: b faster), out-of-place and in-place\n");
    printf("#%11s%14s%20s%20s%20s\n", "size", "count", "none/gradiveq", "none/qsgd",
           "qsgd/gradiveq");
    printf("#%11s%14s%10s%10s%10s%10s%10s%10s\n", "(B)", "(elements)", "oop", "ip", "oop", "ip",
           "oop", "ip");
    for (size_t z = 0; z < r->nsizes; z++) {
        printf("%12zu%14zu", r->bytes[z], r->count[z]);
        for (int p = 0; p < 3; p++)
            print_time_ratio(perf_case(r, z, pa[p])->res, perf_case(r, z, pb[p])->res, logsum[p],
                             nlog[p]);
        printf("\n");
    }
    printf("# Geometric mean      %14s", "");
    for (int p = 0; p < 3; p++)
        for (int ip = 0; ip < 2; ip++) {
            if (nlog[p][ip])
                printf("%10.3f", geomean(logsum[p][ip], nlog[p][ip]));
            else
                printf("%10s", "n/a");
        }
    printf("\n#\n");
}

void perf_print_summary(const opts_t *o, const perf_results_t *r) {
    const int *have = r->have;
    print_totals(o, r);
    if (r->lossy) print_details(r);
    if (!have[CODEC_NONE] || !have[CODEC_MPI])
        printf("# ratio none/mpi: not printed (needs both codecs none and mpi to run)\n");
    else
        print_ratio_none_mpi(o, r);
    printf("#\n");
    int npairs = (have[CODEC_NONE] && have[CODEC_GRADIVEQ]) +
                 (have[CODEC_NONE] && have[CODEC_QSGD]) +
                 (have[CODEC_QSGD] && have[CODEC_GRADIVEQ]);
    if (r->lossy && npairs == 0)
        printf("# ratio compressed: not printed (needs two of none, gradiveq, qsgd)\n#\n");
    else if (r->lossy)
        print_ratio_compressed(r);
}
