/*
 * perf_sparse.c -- gvq-perf -C sparse-ag,ps,dense: a sparse variable aggregated three ways, side
 * by side in one run, with the bytes each rank put on the wire next to the Parallax cost table
 * (docs/ALGORITHMS.md section 4; w = rows x dim x 4 bytes of values, N ranks, per rank,
 * sent+received):
 *
 *     dense (gvqAllReduce)         4 w (N-1)/N
 *     sparse-ag (allgatherv)       2 alpha w (N-1)
 *     ps (push + pull, P shards)   4 alpha w (N-1)/N
 *
 *   mpirun -np 4 gvq-perf -C sparse-ag,ps,dense --rows 500000 --dim 64 --alpha 0.01 -n 10 -w 2
 *   mpirun -np 4 gvq-perf -C ps --ps-tune --alpha 0.01        (tuner, then a sweep over P)
 *
 * This file is the sparse benchmark's driver: its command line, the order of the methods (ps,
 * sparse-ag, dense), the table and the ratios. The steps of each method and the access pattern
 * are in perf_sparse_steps.c, the tuner in perf_sparse_tune.c. After timing, the three methods'
 * variables are compared (the same gradients, the same SGD): they must agree.
 */
#include "perf_sparse.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_common.h"
#include "perf_sparse_steps.h"
#include "perf_sparse_tune.h"

/* ---- arguments --------------------------------------------------------------------------------
 */

static int has_sparse_mode(const char *list) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *t = strtok(buf, ","); t != NULL; t = strtok(NULL, ","))
        for (int m = 0; m < NUM_MODES; m++)
            if (strcmp(t, sp_mode_names[m]) == 0) return 1;
    return 0;
}

int perf_sparse_requested(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if ((strcmp(a, "-C") == 0 || strcmp(a, "--codec") == 0) && i + 1 < argc)
            v = argv[i + 1];
        else if (strncmp(a, "-C", 2) == 0 && a[2] != '\0')
            v = a + 2;
        else if (strncmp(a, "--codec=", 8) == 0)
            v = a + 8;
        if (v != NULL && has_sparse_mode(v)) return 1;
    }
    return 0;
}

static const char usage_text[] =
    "usage: mpirun -np N %s -C sparse-ag,ps,dense [options]\n"
    "  a sparse variable (an embedding) aggregated by gvq's sparse allgatherv, by its\n"
    "  parameter server and densely by gvqAllReduce, with bytes per rank beside the\n"
    "  Parallax cost table\n"
    "  -C, --codec LIST        comma-separated: sparse-ag, ps, dense\n"
    "      --rows R            rows of the variable (default 500000)\n"
    "      --dim D             floats per row (default 64)\n"
    "      --alpha A           fraction of the rows each rank touches per step, (0, 1]\n"
    "                          (default 0.01)\n"
    "      --zipf S            skew of the access pattern: row j drawn with weight\n"
    "                          1/(1+j)^S (default 1.0; 0: uniform)\n"
    "  -n, --iters N           timed steps (default 10)\n"
    "  -w, --warmup_iters N    untimed steps before (default 2)\n"
    "      --partitions P      parameter-server shards (default: the number of ranks)\n"
    "      --contiguous        contiguous row ranges per shard (default: hashed)\n"
    "      --local-agg         sum pushes per host first\n"
    "      --seed N            access-pattern seed (default 1)\n"
    "      --ps-tune           ps: run gvqPsTunePartitions, then time every P of a sweep\n"
    "                          (1, 2, 3, ... up to --sweep-max; 3 passes, the best\n"
    "                          kept) and compare (not --tune: mpirun takes that one\n"
    "                          for itself wherever it appears)\n"
    "      --tune-iters N      steps per tuner sample and per sweep point (default 20;\n"
    "                          the first half is left out of the time)\n"
    "      --sweep-max P       largest P of the sweep and of the tuner (default 4 N)\n"
    "  -h, --help              this text\n";

static void usage(FILE *f, const char *prog) {
    fprintf(f, usage_text, prog);
}

/* The parsers of the option table: the number as strtol/strtoull/strtod read it (range checks
 * come after parsing, in check_options); -1 when the argument is not one number. */

static int bad_number(const char *arg, const char *end) {
    return errno != 0 || *end != '\0' || end == arg ? -1 : 0;
}

/* opt_NAME: the argument as CONV reads it into a TYPE at field. */
#define PLAIN_NUMBER_PARSER(name, type, conv)                                                     \
    static int name(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) { \
        (void)opt;                                                                                \
        (void)msg;                                                                                \
        (void)len;                                                                                \
        char *end;                                                                                \
        errno = 0;                                                                                \
        *(type *)field = (type)conv;                                                              \
        return bad_number(arg, end);                                                              \
    }
PLAIN_NUMBER_PARSER(opt_int, int, strtol(arg, &end, 10))
PLAIN_NUMBER_PARSER(opt_size, size_t, strtoull(arg, &end, 10))
PLAIN_NUMBER_PARSER(opt_ull, unsigned long long, strtoull(arg, &end, 10))
PLAIN_NUMBER_PARSER(opt_double, double, strtod(arg, &end))
#undef PLAIN_NUMBER_PARSER

/* -C: the sparse modes of a comma-separated list; any other name is an error. */
static int opt_modes(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) {
    (void)opt;
    sp_opts_t *o = field;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", arg);
    o->nmodes = 0;
    for (char *t = strtok(buf, ","); t != NULL; t = strtok(NULL, ",")) {
        int found = -1;
        for (int m = 0; m < NUM_MODES; m++)
            if (strcmp(t, sp_mode_names[m]) == 0) found = m;
        if (found < 0) {
            snprintf(msg, len,
                     "'%s' is not a sparse mode (sparse-ag, ps, dense; the others run without "
                     "these)",
                     t);
            return -1;
        }
        if (!o->modes[found]) o->modes[found] = 1, o->nmodes++;
    }
    return 0;
}

enum {
    O_ROWS = 300,
    O_DIM,
    O_ALPHA,
    O_ZIPF,
    O_PART,
    O_CONTIG,
    O_LAGG,
    O_SEED,
    O_TUNE,
    O_TITERS,
    O_SWEEP
};

#define ARG required_argument
#define FIELD(f) offsetof(sp_opts_t, f)
/* name, has_arg, key, parser, field, lo (flags: the value set), hi, choices, what; -C's field
 * is the whole sp_opts_t (modes and nmodes) */
static const perf_opt_t options[] = {
    {"codec", ARG, 'C', opt_modes, 0, 0, 0, NULL, NULL},
    {"iters", ARG, 'n', opt_int, FIELD(iters), 0, 0, NULL, NULL},
    {"warmup_iters", ARG, 'w', opt_int, FIELD(warmup), 0, 0, NULL, NULL},
    {"rows", ARG, O_ROWS, opt_size, FIELD(rows), 0, 0, NULL, NULL},
    {"dim", ARG, O_DIM, opt_size, FIELD(dim), 0, 0, NULL, NULL},
    {"alpha", ARG, O_ALPHA, opt_double, FIELD(alpha), 0, 0, NULL, NULL},
    {"zipf", ARG, O_ZIPF, opt_double, FIELD(zipf), 0, 0, NULL, NULL},
    {"partitions", ARG, O_PART, opt_int, FIELD(partitions), 0, 0, NULL, NULL},
    {"contiguous", no_argument, O_CONTIG, perf_opt_flag, FIELD(partitioning), gvqPsContiguous, 0,
     NULL, NULL},
    {"local-agg", no_argument, O_LAGG, perf_opt_flag, FIELD(local_agg), 1, 0, NULL, NULL},
    {"seed", ARG, O_SEED, opt_ull, FIELD(seed), 0, 0, NULL, NULL},
    {"ps-tune", no_argument, O_TUNE, perf_opt_flag, FIELD(tune), 1, 0, NULL, NULL},
    {"tune-iters", ARG, O_TITERS, opt_int, FIELD(tune_iters), 0, 0, NULL, NULL},
    {"sweep-max", ARG, O_SWEEP, opt_int, FIELD(sweep_max), 0, 0, NULL, NULL},
    {"help", no_argument, 'h', NULL, 0, 0, 0, NULL, NULL},
};
#define NUM_OPTIONS (sizeof options / sizeof options[0])

static void set_defaults(sp_opts_t *o) {
    memset(o, 0, sizeof *o);
    o->rows = 500000;
    o->dim = 64;
    o->alpha = 0.01;
    o->zipf = 1.0;
    o->lr = 0.01;
    o->iters = 10;
    o->warmup = 2;
    o->partitions = perf_nranks;
    o->partitioning = gvqPsHashed;
    o->seed = 1;
    o->tune_iters = 20;
    o->sweep_max = 4 * perf_nranks;
}

/* What is wrong with the parsed options, or NULL. */
static const char *check_options(const sp_opts_t *o) {
    if (o->rows < 1 || o->rows > (1ull << 40)) return "--rows must be >= 1";
    if (o->dim < 1 || o->dim > (1u << 20)) return "--dim must be in [1, 2^20]";
    if (!(o->alpha > 0.0 && o->alpha <= 1.0)) return "--alpha must be in (0, 1]";
    if (!(o->zipf >= 0.0 && o->zipf <= 10.0)) return "--zipf must be in [0, 10]";
    if (o->iters < 1 || o->warmup < 0) return "-n must be >= 1 and -w >= 0";
    if (o->partitions < 1) return "--partitions must be >= 1";
    if (o->tune_iters < 2 || o->sweep_max < 1) return "--tune-iters >= 2, --sweep-max >= 1";
    if (o->nmodes == 0) return "no sparse mode given";
    if (o->tune && !o->modes[M_PS]) return "--ps-tune needs -C ps";
    return NULL;
}

/* 0 to run, 1 to exit with success (help), 2 on an argument error (reported when verbose). */
static int sp_parse(int argc, char **argv, sp_opts_t *o, int verbose) {
    set_defaults(o);
    int rc = perf_parse_options(argc, argv, options, NUM_OPTIONS, o, usage, verbose);
    if (rc != 0) return rc;
    const char *bad = check_options(o);
    if (bad != NULL) {
        if (verbose) fprintf(stderr, "gvq-perf: %s\n", bad);
        return 2;
    }
    return 0;
}

/* ---- the table ---------------------------------------------------------------------------- */

static void print_header(const sp_opts_t *o, const sp_work_t *wk, double w_bytes, double draw_s,
                         double overlap) {
    printf("# gvq-perf sparse: %d ranks, variable %zu x %zu float (w = %.1f MB), alpha %g "
           "(k = %zu rows per rank and step), zipf %g, seed %llu\n",
           perf_nranks, o->rows, o->dim, w_bytes / 1e6, o->alpha, wk->k, o->zipf, o->seed);
    printf("# %d warm-up + %d timed steps; row sets drawn in %.2f s; the union of a step "
           "holds %.3f x N k rows (1: no overlap)\n",
           o->warmup, o->iters, draw_s, overlap);
    printf("# ps: %d partitions (%s)%s\n", o->partitions,
           o->partitioning == gvqPsContiguous ? "contiguous" : "hashed",
           o->local_agg ? ", local aggregation" : "");
    printf("# bytes: per rank and step, MB = 1e6 B; pred = the Parallax table's sent+received "
           "per rank (values only)\n");
    printf("#%9s %9s %5s %7s %10s %11s %11s %11s %11s %11s\n", "mode", "rows", "dim", "alpha",
           "time_ms", "sent_MB", "recv_MB", "total_MB", "max_tot_MB", "pred_MB");
    fflush(stdout);
}

static void print_row(const sp_opts_t *o, int m, const sp_result_t *r, double pred, int P) {
    const double MB = 1e6;
    char extra[64] = "";
    if (m == M_PS) snprintf(extra, sizeof extra, "P=%d", P);
    if (m == M_AG) snprintf(extra, sizeof extra, "%s", r->algorithm ? "native" : "ring");
    printf("%10s %9zu %5zu %7.4f %10.3f %11.3f %11.3f %11.3f %11.3f %11.3f  %s\n", sp_mode_names[m],
           o->rows, o->dim, o->alpha, 1e3 * r->step_s, r->sent_avg / MB, r->recv_avg / MB,
           (r->sent_avg + r->recv_avg) / MB, (r->sent_max + r->recv_max) / MB, pred / MB, extra);
}

/* The methods of -C in the order ps, sparse-ag, dense, each with its row; wrep[m]: the replica
 * of dense and sparse-ag, *ps: the parameter server (kept for the check). Collective. */
static void run_modes(const sp_work_t *wk, const double pred[NUM_MODES], sp_result_t *res,
                      float **wrep, gvqPs_t *ps) {
    static const int order[NUM_MODES] = {M_PS, M_AG, M_DENSE};
    const sp_opts_t *o = wk->o;
    for (int q = 0; q < NUM_MODES; q++) {
        int m = order[q];
        if (!o->modes[m]) continue;
        if (m == M_PS) {
            *ps = sp_make_ps(o, o->partitions);
            res[m] = sp_run_ps(wk, *ps, o->iters, o->warmup);
        } else {
            wrep[m] = calloc(o->rows * o->dim, sizeof(float));
            if (wrep[m] == NULL) {
                fprintf(stderr, "gvq-perf: rank %d: no memory for a replica\n", perf_rank);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            res[m] = m == M_AG ? sp_run_ag(wk, wrep[m]) : sp_run_dense(wk, wrep[m]);
        }
        if (perf_rank == 0) {
            print_row(o, m, &res[m], pred[m], o->partitions);
            fflush(stdout);
        }
    }
}

/* The largest difference between the methods' variables (same gradients, same SGD, zero
 * start): rows of the server against a replica, and the two replicas. 0 when fine or not
 * compared, 1 when they differ. Collective. */
static int check_agreement(const sp_opts_t *o, gvqPs_t ps, float *const *wrep) {
    if (ps == NULL || (wrep[M_AG] == NULL && wrep[M_DENSE] == NULL)) return 0;
    const float *ref = wrep[M_AG] != NULL ? wrep[M_AG] : wrep[M_DENSE];
    size_t nchk = o->rows < 4096 ? o->rows : 4096;
    int64_t *idx = malloc(nchk * sizeof *idx);
    float *got = malloc(nchk * o->dim * sizeof *got);
    for (size_t i = 0; i < nchk; i++)
        idx[i] = (int64_t)(i * (o->rows / nchk));
    GVQTEST(gvqPsPull(ps, idx, got, nchk));
    double maxerr = 0;
    for (size_t i = 0; i < nchk; i++)
        for (size_t j = 0; j < o->dim; j++)
            maxerr = fmax(maxerr, fabs(got[i * o->dim + j] - ref[(size_t)idx[i] * o->dim + j]));
    if (wrep[M_AG] != NULL && wrep[M_DENSE] != NULL)
        for (size_t e = 0; e < o->rows * o->dim; e++)
            maxerr = fmax(maxerr, fabs(wrep[M_AG][e] - wrep[M_DENSE][e]));
    double all = 0;
    MPI_Allreduce(&maxerr, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (perf_rank == 0)
        printf("# check: the methods' variables differ by at most %.3g (%s)\n", all,
               all <= 1e-4 ? "OK" : "FAILED");
    free(idx);
    free(got);
    return all <= 1e-4 ? 0 : 1;
}

static double total_bytes(const sp_result_t *r) {
    return r->sent_avg + r->recv_avg;
}

static void print_ratios(const sp_result_t *res) {
    double N = perf_nranks;
    const sp_result_t *ag = &res[M_AG], *ps = &res[M_PS], *dense = &res[M_DENSE];
    printf("#\n# ratios (table: allgatherv/ps bytes = N/2 = %.2f; at least 0.9 x N/2 = %.2f "
           "asked)\n",
           N / 2, 0.9 * N / 2);
    if (ag->ran && ps->ran) {
        double br = total_bytes(ag) / total_bytes(ps);
        printf("#   bytes sparse-ag / ps = %.3f (%s); time sparse-ag / ps = %.3f (%s)\n", br,
               br >= 0.9 * N / 2 ? "MET" : "MISSED", ag->step_s / ps->step_s,
               ps->step_s < ag->step_s ? "ps faster" : "ps NOT faster");
    }
    if (dense->ran && ps->ran)
        printf("#   bytes dense / ps = %.1f; time dense / ps = %.2f\n",
               total_bytes(dense) / total_bytes(ps), dense->step_s / ps->step_s);
    if (dense->ran && ag->ran)
        printf("#   bytes dense / sparse-ag = %.1f; time dense / sparse-ag = %.2f\n",
               total_bytes(dense) / total_bytes(ag), dense->step_s / ag->step_s);
    fflush(stdout);
}

int perf_sparse_main(int argc, char **argv) {
    sp_opts_t o;
    int prc = sp_parse(argc, argv, &o, perf_rank == 0);
    if (prc != 0) return prc == 1 ? 0 : 2;
    perf_comm = perf_comm_create(NULL);
    sp_work_t wk;
    double tg = MPI_Wtime();
    sp_work_init(&wk, &o);
    double overlap = sp_union_share(&wk);
    double w_bytes = (double)o.rows * (double)o.dim * 4.0, N = perf_nranks;
    if (perf_rank == 0) print_header(&o, &wk, w_bytes, MPI_Wtime() - tg, overlap);
    double pred[NUM_MODES] = {2 * o.alpha * w_bytes * (N - 1), 4 * o.alpha * w_bytes * (N - 1) / N,
                              4 * w_bytes * (N - 1) / N};
    sp_result_t res[NUM_MODES];
    memset(res, 0, sizeof res);
    float *wrep[NUM_MODES] = {NULL, NULL, NULL};
    gvqPs_t ps = NULL;
    run_modes(&wk, pred, res, wrep, &ps);
    int rc = check_agreement(&o, ps, wrep);
    if (perf_rank == 0) print_ratios(res);
    if (ps != NULL) gvqPsDestroy(ps);
    if (o.tune) sp_run_tune(&wk);
    for (int m = 0; m < NUM_MODES; m++)
        free(wrep[m]);
    sp_work_free(&wk);
    GVQTEST(gvqCommDestroy(perf_comm));
    perf_comm = NULL;
    return rc;
}
