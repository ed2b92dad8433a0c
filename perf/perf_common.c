/*
 * perf_common.c -- what every gvq-perf benchmark shares (see perf_common.h): MPI helpers, the
 * median, buffers and the option-table parser.
 */
#include "perf_common.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int perf_rank, perf_nranks;
gvqComm_t perf_comm;

/* ---- MPI ---------------------------------------------------------------------------------- */

void perf_mpi_init(int *argc, char ***argv) {
    MPITEST(MPI_Init(argc, argv));
    MPITEST(MPI_Comm_rank(MPI_COMM_WORLD, &perf_rank));
    MPITEST(MPI_Comm_size(MPI_COMM_WORLD, &perf_nranks));
}

gvqComm_t perf_comm_create(gvqConfig_t *cfg) {
    gvqUniqueId id;
    memset(&id, 0, sizeof id);
    if (perf_rank == 0) GVQTEST(gvqGetUniqueId(&id));
    MPITEST(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    gvqComm_t comm = NULL;
    GVQTEST(gvqCommInitRankConfig(&comm, perf_nranks, id, perf_rank, cfg));
    return comm;
}

double perf_max_over_ranks(double x) {
    double mx = 0.0;
    MPITEST(MPI_Allreduce(&x, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    return mx;
}

int perf_all_ok(int ok) {
    int all = 0;
    ok = ok != 0;
    MPITEST(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    return all;
}

void perf_sleepy_barrier(void) {
    MPI_Request rq;
    int done = 0;
    MPITEST(MPI_Ibarrier(MPI_COMM_WORLD, &rq));
    while (!done) {
        MPITEST(MPI_Test(&rq, &done, MPI_STATUS_IGNORE));
        if (!done) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
}

/* ---- numbers and memory ------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double perf_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void *perf_alloc_buffer(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) {
        fprintf(stderr, "gvq-perf: rank %d: cannot allocate %zu bytes\n", perf_rank, bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(p, 0, bytes ? bytes : 64);
    return p;
}

/* ---- command lines ------------------------------------------------------------------------ */

#define PERF_MAX_OPTIONS 64

int perf_opt_flag(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) {
    (void)arg;
    (void)msg;
    (void)len;
    *(int *)field = (int)opt->lo;
    return 0;
}

int perf_opt_string(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) {
    (void)opt;
    (void)msg;
    (void)len;
    *(const char **)field = arg;
    return 0;
}

int perf_opt_choice(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) {
    (void)msg;
    (void)len;
    for (const perf_choice_t *c = opt->choices; c->word != NULL; c++)
        if (strcmp(arg, c->word) == 0) {
            *(int *)field = c->value;
            return 0;
        }
    return -1;
}

/* getopt_long's tables for `table`: longopts (n + 1 entries) and the short options' string. */
static void getopt_tables(const perf_opt_t *table, size_t n, struct option *longopts,
                          char *shortopts) {
    for (size_t k = 0; k < n; k++) {
        longopts[k] = (struct option){table[k].name, table[k].has_arg, NULL, table[k].key};
        if (table[k].key >= 256) continue;
        *shortopts++ = (char)table[k].key;
        if (table[k].has_arg == required_argument) *shortopts++ = ':';
    }
    longopts[n] = (struct option){NULL, 0, NULL, 0};
    *shortopts = '\0';
}

/* Parses the value of the option `key`; 0, or -1 after reporting the bad value on err. */
static int parse_one(const perf_opt_t *table, size_t n, int key, void *out, FILE *err) {
    const perf_opt_t *opt = NULL;
    for (size_t k = 0; k < n && opt == NULL; k++)
        if (table[k].key == key) opt = &table[k];
    char msg[300] = "";
    if (opt->parse(opt, optarg, (char *)out + opt->field, msg, sizeof msg) == 0) return 0;
    if (err == NULL) return -1;
    if (msg[0])
        fprintf(err, "gvq-perf: %s\n", msg);
    else if (opt->what != NULL)
        fprintf(err, "gvq-perf: bad value '%s' for %s\n", optarg, opt->what);
    else
        fprintf(err, "gvq-perf: bad value '%s' (see -h)\n", optarg);
    return -1;
}

int perf_parse_options(int argc, char **argv, const perf_opt_t *table, size_t n, void *out,
                       perf_usage_fn *usage, int verbose) {
    struct option longopts[PERF_MAX_OPTIONS + 1];
    char shortopts[2 * PERF_MAX_OPTIONS + 1];
    if (n > PERF_MAX_OPTIONS) return 2;
    getopt_tables(table, n, longopts, shortopts);
    opterr = verbose;
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        if (ch == 'h') {
            if (verbose) usage(stdout, argv[0]);
            return 1;
        }
        if (ch == '?' || ch == ':') {
            if (verbose) usage(stderr, argv[0]);
            return 2;
        }
        if (parse_one(table, n, ch, out, verbose ? stderr : NULL) != 0) return 2;
    }
    return 0;
}
