/*
 * perf_args.c -- gvq-perf's command line for the allreduce benchmarks (gvq-perf -h): the usage
 * text, one table of options (each with its parser and the field it fills), the defaults and
 * the checks across options.
 */
#include "perf_args.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_common.h"

const char *const perf_codec_names[NUM_CODECS] = {"none", "mpi", "gradiveq", "qsgd", "powersgd"};
const char *const perf_op_names[gvqNumOps] = {"sum", "prod", "max", "min", "avg"};
const char *const perf_coll_names[NUM_COLLS] = {"allreduce", "reducescatter", "allgather",
                                                "broadcast", "reduce",        "sendrecv"};
const char *const perf_coll_mpi_names[NUM_COLLS] = {"MPI_Allreduce", "MPI_Reduce_scatter_block",
                                                    "MPI_Allgather", "MPI_Bcast",
                                                    "MPI_Reduce",    "MPI_Sendrecv"};

static const dtype_info_t dtypes[] = {
    {"int8", gvqInt8, 1, 0, 0.0},
    {"uint8", gvqUint8, 1, 0, 0.0},
    {"int32", gvqInt32, 4, 0, 0.0},
    {"uint32", gvqUint32, 4, 0, 0.0},
    {"int64", gvqInt64, 8, 0, 0.0},
    {"uint64", gvqUint64, 8, 0, 0.0},
    {"half", gvqFloat16, 2, 1, 1e-3},
    {"float", gvqFloat32, 4, 1, 1e-3},
    {"double", gvqFloat64, 8, 1, 1e-3},
    /* 8 significant bits: sum/n rounds by up to 2^-9 relative, more than 1e-3 */
    {"bfloat16", gvqBfloat16, 2, 1, 1.0 / 256},
};
#define NUM_DTYPES (sizeof dtypes / sizeof dtypes[0])

static const struct {
    const char *alias, *name;
} dtype_aliases[] = {{"char", "int8"},      {"int", "int32"},     {"float16", "half"},
                     {"fp16", "half"},      {"float32", "float"}, {"fp32", "float"},
                     {"float64", "double"}, {"fp64", "double"},   {"bf16", "bfloat16"}};

/* ---- usage -------------------------------------------------------------------------------- */

static const char usage_text[] =
    "usage: mpirun -np N %s [options]\n"
    "  collective bandwidth, nccl-tests style: gvq against MPI for each collective, and gvq's\n"
    "  compressed allreduce (GradiVeQ, QSGD)\n"
    "  -k, --coll LIST         comma-separated collectives, each gvq's call against MPI's:\n"
    "                          allreduce (MPI_Allreduce), reducescatter\n"
    "                          (MPI_Reduce_scatter_block), allgather (MPI_Allgather),\n"
    "                          broadcast (MPI_Bcast), reduce (MPI_Reduce), sendrecv (gvqSend\n"
    "                          and gvqRecv in a group against MPI_Sendrecv, each rank to the\n"
    "                          next in a ring), all (default allreduce). Size and busbw as\n"
    "                          nccl-tests: the size is the whole buffer (reducescatter: the\n"
    "                          input, allgather: the output, a multiple of nranks elements);\n"
    "                          busbw = algbw * 2(n-1)/n (allreduce), (n-1)/n (reducescatter,\n"
    "                          allgather), 1 (broadcast, reduce, sendrecv). gradiveq and qsgd\n"
    "                          run in allreduce only; sendrecv has no in-place case\n"
    "  -r, --root R            root of broadcast and reduce (default 0)\n"
    "  -b, --minbytes SIZE     smallest size in bytes, suffix K/M/G (default 32M)\n"
    "  -e, --maxbytes SIZE     largest size in bytes, suffix K/M/G (default 32M)\n"
    "  -f, --stepfactor F      multiply the size by F each step, F >= 2 (default 2)\n"
    "  -n, --iters N           timed calls per size (default 20)\n"
    "  -w, --warmup_iters N    untimed calls before (default 5; gradiveq: after it reached\n"
    "                          its compressed phase)\n"
    "  -c, --check 0|1         check the results: #wrong (none, mpi), rel_err (gradiveq,\n"
    "                          qsgd) (default 1)\n"
    "  -d, --datatype T        int8 uint8 int32 uint32 int64 uint64 half float double\n"
    "                          bfloat16 (default float; gradiveq and qsgd take float only)\n"
    "  -o, --op OP             sum prod max min avg (default sum; gradiveq and qsgd: sum,\n"
    "                          avg)\n"
    "  -C, --codec LIST        comma-separated: none (gvq's call: gvqAllReduce, ...),\n"
    "                          mpi (its MPI counterpart, the reference), gradiveq, qsgd,\n"
    "                          powersgd (gvqAllReduceCompressed), all = every one of them\n"
    "                          (default none,mpi); sparse-ag, ps, dense: the sparse-\n"
    "                          variable benchmark (-C ps -h lists its options)\n"
    "      --csv FILE          also write one CSV row per (size, codec)\n"
    " compressed codecs (one compressor per size, made fresh):\n"
    "  -L, --slice L           GradiVeQ slice size (default 256)\n"
    "  -D, --max-dims D        cap on GradiVeQ's d (default L/8: a ratio of 8 or more)\n"
    "      --eps E             loss threshold (default 0.01)\n"
    "  -T, --sample-iters T    sampling calls before a fit (default 20; library: 100)\n"
    "  -S, --compressed-iters S  calls per compressed phase (default: library's, 400)\n"
    "      --gvq-warmup W      compressor warm-up calls before sampling (default 0)\n"
    "      --sample-codec none|qsgd  codec of warm-up and sampling calls (default none)\n"
    "      --vote-threshold V  GradiVeQ's early exit on the local loss (default eps; >= 1: never)\n"
    "      --sample-slices N   slices of each reuse group sampled per call (default 1; 0: all)\n"
    "      --basis fit|track   GradiVeQ's basis: fitted in sampling phases (default), or\n"
    "                          tracked by a power iteration every call (-D d, default 4)\n"
    "      --wire fp32|fp16|int8|int16  what the ring adds (default fp32): GradiVeQ's\n"
    "                          coefficients as fp16; int8/int16: GradiVeQ's coefficients and\n"
    "                          QSGD's levels as integers against agreed scales (integerBits)\n"
    "      --qbits B           QSGD bits: 2, 4 or 8 (default 4)\n"
    "      --qbucket N         QSGD values per bucket (default 512)\n"
    "      --power-rank R      PowerSGD's rank (default 4; the tensor as a near-square matrix)\n"
    " gradient source (gradiveq, qsgd):\n"
    "      --seed N            synthetic source seed (default 1)\n"
    "      --grad-rank R       directions per slice of the synthetic source (default: the\n"
    "                          largest R <= D that a fit on T samples keeps at eps, see\n"
    "                          grad_rank_auto)\n"
    "      --noise F           i.i.d. noise, fraction of the signal norm (default eps/4)\n"
    "      --variation V       per-rank, per-iteration variation of the coefficients,\n"
    "                          relative to their mean (default 1)\n"
    "      --replay FILE       stream recorded gradients (GVQGRAD1 files, see\n"
    "                          perf/perf_gradsrc.h) instead of the synthetic source\n"
    "      --write-replay FILE write the synthetic source (rank 0's gradients, -e bytes,\n"
    "                          --replay-iters iterations) as a replay file and exit\n"
    "      --replay-iters K    iterations --write-replay writes (default 16)\n"
    "      --state-dir DIR     keep each size's fitted GradiVeQ compressor in DIR (one\n"
    "                          file per size and rank) and start from it next time, so a\n"
    "                          rerun skips the sampling calls (same config and ranks)\n"
    " reports:\n"
    "      --overlap           per size: GradiVeQ allreduce time against the same traffic\n"
    "                          uncompressed (T_wire) and the codec's compute (T_comp):\n"
    "                          share of the compute hidden behind the transfer\n"
    "      --fit-bench         time gvq_pca_fit for L = 256, 512, 1024, 2304 (T = 100\n"
    "                          samples) on rank 0 and exit\n"
    "      --fit-reps N        repetitions of each fit (default 5; the median is shown)\n"
    "      --no-progress       no progress line (rank 0 writes one on stderr, with the time\n"
    "                          left, when stderr is a terminal and the run lasts over 3 s)\n"
    "  -h, --help              this text\n"
    " exit status: 0 every result correct, 1 some #wrong > 0, 2 bad arguments, 3 a compressed\n"
    "  case could not be timed\n";

static void usage(FILE *f, const char *prog) {
    fprintf(f, usage_text, prog);
}

/* ---- option values ------------------------------------------------------------------------ */

/* The multiplier of a size's suffix: none, k, m or g (either case, powers of 1024); 0 for
 * anything else. */
static unsigned long long size_unit(const char *suffix) {
    static const char units[] = "kmg";
    if (*suffix == '\0') return 1;
    const char *u = strchr(units, tolower((unsigned char)*suffix));
    if (u == NULL || suffix[1] != '\0') return 0;
    return 1ull << (10 * (u - units + 1));
}

/* Parses "123", "64K", "16M", "1G". */
static int parse_size(const char *s, size_t *out) {
    if (s[0] < '0' || s[0] > '9') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0) return -1;
    unsigned long long mult = size_unit(end);
    if (mult == 0 || v > SIZE_MAX / mult) return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

/* A finite double in (lo, hi) (open at both ends when open != 0, else [lo, hi]). */
static int parse_double(const char *s, double lo, double hi, int open, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v)) return -1;
    if (open ? !(v > lo && v < hi) : !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

static const dtype_info_t *find_dtype(const char *name) {
    for (size_t a = 0; a < sizeof dtype_aliases / sizeof dtype_aliases[0]; a++)
        if (strcmp(name, dtype_aliases[a].alias) == 0) name = dtype_aliases[a].name;
    for (size_t d = 0; d < NUM_DTYPES; d++)
        if (strcmp(name, dtypes[d].name) == 0) return &dtypes[d];
    return NULL;
}

static void add_codec(codec_list_t *l, codec_t c) {
    for (int k = 0; k < l->n; k++)
        if (l->list[k] == c) return;
    l->list[l->n++] = c;
}

/* Adds the codecs named by one token of -C (a codec or "all"); -1 for an unknown name. */
static int add_codec_token(codec_list_t *l, const char *tok) {
    int found = 0;
    for (int c = 0; c < NUM_CODECS; c++)
        if (strcmp(tok, "all") == 0 || strcmp(tok, perf_codec_names[c]) == 0) {
            add_codec(l, (codec_t)c);
            found = 1;
        }
    return found ? 0 : -1;
}

/* Adds the collectives named by one token of -k (a collective or "all"); -1 for an unknown
 * name. */
static int add_coll_token(coll_list_t *l, const char *tok) {
    int found = 0;
    for (int c = 0; c < NUM_COLLS; c++) {
        if (strcmp(tok, "all") != 0 && strcmp(tok, perf_coll_names[c]) != 0) continue;
        found = 1;
        int seen = 0;
        for (int k = 0; k < l->n; k++)
            seen |= l->list[k] == (coll_t)c;
        if (!seen) l->list[l->n++] = (coll_t)c;
    }
    return found ? 0 : -1;
}

/* The parsers of the option table (perf_opt_t): 0, or -1 for a bad value. */

static int opt_size(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) {
    (void)opt;
    (void)msg;
    (void)len;
    return parse_size(arg, field);
}

static int opt_int(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) {
    (void)msg;
    (void)len;
    return parse_int(arg, (int)opt->lo, (int)opt->hi, field);
}

/* A double in [lo, hi]. */
static int opt_double(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) {
    (void)msg;
    (void)len;
    return parse_double(arg, opt->lo, opt->hi, 0, field);
}

/* A double in (lo, hi). */
static int opt_double_open(const perf_opt_t *opt, const char *arg, void *field, char *msg,
                           size_t len) {
    (void)msg;
    (void)len;
    return parse_double(arg, opt->lo, opt->hi, 1, field);
}

/* 2, 4 or 8 (--qbits). */
static int opt_qbits(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) {
    int *bits = field;
    if (opt_int(opt, arg, field, msg, len) != 0) return -1;
    return *bits == 2 || *bits == 4 || *bits == 8 ? 0 : -1;
}

/* A non-negative integer of 64 bits (--seed). */
static int opt_seed(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) {
    (void)opt;
    (void)msg;
    (void)len;
    char *end;
    errno = 0;
    *(unsigned long long *)field = strtoull(arg, &end, 10);
    return errno != 0 || end == arg || *end != '\0' || arg[0] == '-' ? -1 : 0;
}

static int opt_dtype(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) {
    (void)opt;
    (void)msg;
    (void)len;
    const dtype_info_t *dt = find_dtype(arg);
    if (dt == NULL) return -1;
    *(const dtype_info_t **)field = dt;
    return 0;
}

static int opt_op(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) {
    (void)opt;
    (void)msg;
    (void)len;
    for (int k = 0; k < gvqNumOps; k++)
        if (strcmp(arg, perf_op_names[k]) == 0) {
            *(gvqRedOp_t *)field = (gvqRedOp_t)k;
            return 0;
        }
    return -1;
}

/* A comma-separated codec list (-C); says what is wrong in msg. */
static int opt_codecs(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) {
    (void)opt;
    codec_list_t *l = field;
    char buf[256];
    if (strlen(arg) >= sizeof buf) {
        snprintf(msg, len, "codec list too long");
        return -1;
    }
    strcpy(buf, arg);
    l->n = 0;
    for (char *tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ","))
        if (add_codec_token(l, tok) != 0) {
            snprintf(msg, len,
                     "unknown codec '%s' (known: none, mpi, gradiveq, qsgd, powersgd, all)", tok);
            return -1;
        }
    if (l->n == 0) {
        snprintf(msg, len, "empty codec list");
        return -1;
    }
    return 0;
}

/* A comma-separated collective list (-k); says what is wrong in msg. */
static int opt_colls(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len) {
    (void)opt;
    coll_list_t *l = field;
    char buf[256];
    if (strlen(arg) >= sizeof buf) {
        snprintf(msg, len, "collective list too long");
        return -1;
    }
    strcpy(buf, arg);
    l->n = 0;
    for (char *tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ","))
        if (add_coll_token(l, tok) != 0) {
            snprintf(msg, len,
                     "unknown collective '%s' (known: allreduce, reducescatter, allgather, "
                     "broadcast, reduce, sendrecv, all)",
                     tok);
            return -1;
        }
    if (l->n == 0) {
        snprintf(msg, len, "empty collective list");
        return -1;
    }
    return 0;
}

/* ---- the option table --------------------------------------------------------------------- */

enum {
    OPT_CSV = 256,
    OPT_EPS,
    OPT_GVQ_WARMUP,
    OPT_SAMPLE_CODEC,
    OPT_WIRE,
    OPT_BASIS,
    OPT_QBITS,
    OPT_QBUCKET,
    OPT_PRANK,
    OPT_SEED,
    OPT_GRAD_RANK,
    OPT_NOISE,
    OPT_REPLAY,
    OPT_WRITE_REPLAY,
    OPT_REPLAY_ITERS,
    OPT_OVERLAP,
    OPT_FIT_BENCH,
    OPT_FIT_REPS,
    OPT_VARIATION,
    OPT_STATE_DIR,
    OPT_VOTE,
    OPT_SAMPLE_SLICES,
    OPT_NO_PROGRESS
};

static const perf_choice_t sample_codecs[] = {{"none", 0}, {"qsgd", 1}, {NULL, 0}};
static const perf_choice_t bases[] = {{"fit", 0}, {"track", 1}, {NULL, 0}};
static const perf_choice_t wire_types[] = {{"fp32", 0}, {"float", 0},  {"fp16", 1}, {"half", 1},
                                           {"int8", 8}, {"int16", 16}, {NULL, 0}};

#define ARG required_argument
#define FIELD(f) offsetof(opts_t, f)
/* name, has_arg, key, parser, field, lo, hi, choices, what (in "bad value 'X' for WHAT") */
static const perf_opt_t options[] = {
    {"minbytes", ARG, 'b', opt_size, FIELD(minbytes), 0, 0, NULL, "-b (a size like 8, 64K, 16M)"},
    {"maxbytes", ARG, 'e', opt_size, FIELD(maxbytes), 0, 0, NULL, "-e (a size like 8, 64K, 16M)"},
    {"stepfactor", ARG, 'f', opt_int, FIELD(factor), 2, 1 << 20, NULL, "-f (an integer >= 2)"},
    {"iters", ARG, 'n', opt_int, FIELD(iters), 1, INT_MAX, NULL, "-n (an integer >= 1)"},
    {"warmup_iters", ARG, 'w', opt_int, FIELD(warmup), 0, INT_MAX, NULL, "-w (an integer >= 0)"},
    {"check", ARG, 'c', opt_int, FIELD(check), 0, 1, NULL, "-c (0 or 1)"},
    {"datatype", ARG, 'd', opt_dtype, FIELD(dt), 0, 0, NULL,
     "-d (int8 uint8 int32 uint32 int64 uint64 half float double bfloat16)"},
    {"op", ARG, 'o', opt_op, FIELD(op), 0, 0, NULL, "-o (sum prod max min avg)"},
    {"codec", ARG, 'C', opt_codecs, FIELD(codecs), 0, 0, NULL, NULL},
    {"coll", ARG, 'k', opt_colls, FIELD(colls), 0, 0, NULL, NULL},
    {"root", ARG, 'r', opt_int, FIELD(root), 0, INT_MAX, NULL, "-r (an integer >= 0)"},
    {"no-progress", no_argument, OPT_NO_PROGRESS, perf_opt_flag, FIELD(progress), 0, 0, NULL, NULL},
    {"csv", ARG, OPT_CSV, perf_opt_string, FIELD(csv), 0, 0, NULL, NULL},
    {"slice", ARG, 'L', opt_int, FIELD(L), 1, 65536, NULL, "-L (in [1, 65536])"},
    {"max-dims", ARG, 'D', opt_int, FIELD(dmax), 1, 65536, NULL, "-D (an integer >= 1)"},
    {"eps", ARG, OPT_EPS, opt_double_open, FIELD(eps), 0, 1, NULL, "--eps (in (0, 1))"},
    {"sample-iters", ARG, 'T', opt_int, FIELD(T), 1, 1 << 20, NULL, "-T (an integer >= 1)"},
    {"compressed-iters", ARG, 'S', opt_int, FIELD(S), 1, INT_MAX, NULL, "-S (an integer >= 1)"},
    {"gvq-warmup", ARG, OPT_GVQ_WARMUP, opt_int, FIELD(W), 0, 1 << 20, NULL,
     "--gvq-warmup (an integer >= 0)"},
    {"sample-codec", ARG, OPT_SAMPLE_CODEC, perf_opt_choice, FIELD(sample_qsgd), 0, 0,
     sample_codecs, "--sample-codec (none or qsgd)"},
    {"wire", ARG, OPT_WIRE, perf_opt_choice, FIELD(wire), 0, 0, wire_types,
     "--wire (fp32, fp16, int8 or int16)"},
    {"basis", ARG, OPT_BASIS, perf_opt_choice, FIELD(basis), 0, 0, bases, "--basis (fit or track)"},
    {"qbits", ARG, OPT_QBITS, opt_qbits, FIELD(qbits), 2, 8, NULL, "--qbits (2, 4 or 8)"},
    {"qbucket", ARG, OPT_QBUCKET, opt_int, FIELD(qbucket), 1, 1 << 24, NULL,
     "--qbucket (in [1, 2^24])"},
    {"power-rank", ARG, OPT_PRANK, opt_int, FIELD(prank), 1, 4096, NULL,
     "--power-rank (in [1, 4096])"},
    {"seed", ARG, OPT_SEED, opt_seed, FIELD(seed), 0, 0, NULL, "--seed (a non-negative integer)"},
    {"grad-rank", ARG, OPT_GRAD_RANK, opt_int, FIELD(grad_rank), 1, 4096, NULL,
     "--grad-rank (in [1, 4096])"},
    {"noise", ARG, OPT_NOISE, opt_double, FIELD(noise), 0, 10, NULL, "--noise (in [0, 10])"},
    {"variation", ARG, OPT_VARIATION, opt_double, FIELD(variation), 0, 100, NULL,
     "--variation (in [0, 100])"},
    {"state-dir", ARG, OPT_STATE_DIR, perf_opt_string, FIELD(state_dir), 0, 0, NULL, NULL},
    {"vote-threshold", ARG, OPT_VOTE, opt_double, FIELD(vote), 0, 1e6, NULL,
     "--vote-threshold (> 0; >= 1: never exit early)"},
    {"sample-slices", ARG, OPT_SAMPLE_SLICES, opt_int, FIELD(sample_slices), 0, 1 << 20, NULL,
     "--sample-slices (>= 0; 0: every slice)"},
    {"replay", ARG, OPT_REPLAY, perf_opt_string, FIELD(replay), 0, 0, NULL, NULL},
    {"write-replay", ARG, OPT_WRITE_REPLAY, perf_opt_string, FIELD(write_replay), 0, 0, NULL, NULL},
    {"replay-iters", ARG, OPT_REPLAY_ITERS, opt_int, FIELD(replay_iters), 1, 1 << 20, NULL,
     "--replay-iters (>= 1)"},
    {"overlap", no_argument, OPT_OVERLAP, perf_opt_flag, FIELD(overlap), 1, 0, NULL, NULL},
    {"fit-bench", no_argument, OPT_FIT_BENCH, perf_opt_flag, FIELD(fit_bench), 1, 0, NULL, NULL},
    {"fit-reps", ARG, OPT_FIT_REPS, opt_int, FIELD(fit_reps), 1, 1000, NULL,
     "--fit-reps (in [1, 1000])"},
    {"help", no_argument, 'h', NULL, 0, 0, 0, NULL, NULL},
};
#define NUM_OPTIONS (sizeof options / sizeof options[0])

/* ---- parsing ------------------------------------------------------------------------------ */

static void set_defaults(opts_t *o) {
    memset(o, 0, sizeof *o);
    o->minbytes = o->maxbytes = (size_t)32 << 20;
    o->factor = 2;
    o->iters = 20;
    o->warmup = 5;
    o->check = 1;
    o->dt = find_dtype("float");
    o->op = gvqSum;
    o->codecs = (codec_list_t){2, {CODEC_NONE, CODEC_MPI}};
    o->colls = (coll_list_t){1, {COLL_ALLREDUCE}};
    o->coll = COLL_ALLREDUCE;
    o->progress = 1;
    o->L = 256;
    o->eps = 0.01;
    o->T = 20;
    o->S = GVQ_CONFIG_UNDEF_INT;
    o->W = 0;
    o->vote = -1; /* the library default: eps */
    o->sample_slices = GVQ_CONFIG_UNDEF_INT;
    o->qbits = 4;
    o->qbucket = 512;
    o->prank = 4;
    o->seed = 1;
    o->noise = -1.0;
    o->variation = 1.0;
    o->replay_iters = 16;
    o->fit_reps = 5;
}

/* The defaults that depend on other options (dmax 0, grad_rank 0 and noise < 0: not given) and
 * the checks across options; 0, or 2 after reporting on err. */
static int finish_args(opts_t *o, FILE *err) {
    if (o->minbytes > o->maxbytes && o->write_replay == NULL && !o->fit_bench) {
        if (err) fprintf(err, "gvq-perf: -b %zu is larger than -e %zu\n", o->minbytes, o->maxbytes);
        return 2;
    }
    if (o->root >= perf_nranks) {
        if (err) fprintf(err, "gvq-perf: -r %d: there are only %d ranks\n", o->root, perf_nranks);
        return 2;
    }
    if (o->dmax == 0) o->dmax = o->basis ? 4 : o->L / 8 > 0 ? o->L / 8 : 1;
    if (o->dmax > o->L) {
        if (err) fprintf(err, "gvq-perf: -D %d is larger than -L %d\n", o->dmax, o->L);
        return 2;
    }
    if (o->grad_rank == 0) o->grad_rank = perf_grad_rank_auto(o->T, o->dmax, o->eps);
    if (o->noise < 0) o->noise = o->eps / 4;
    if (o->grad_rank > o->L) {
        if (err)
            fprintf(err, "gvq-perf: --grad-rank %d is larger than -L %d\n", o->grad_rank, o->L);
        return 2;
    }
    if (o->replay != NULL && o->write_replay != NULL) {
        if (err) fprintf(err, "gvq-perf: --replay and --write-replay exclude each other\n");
        return 2;
    }
    return 0;
}

int perf_parse_args(int argc, char **argv, opts_t *o, int verbose) {
    FILE *err = verbose ? stderr : NULL;
    set_defaults(o);
    int rc = perf_parse_options(argc, argv, options, NUM_OPTIONS, o, usage, verbose);
    if (rc != 0) return rc;
    if (optind < argc) {
        if (err) fprintf(err, "gvq-perf: unexpected argument '%s' (see -h)\n", argv[optind]);
        return 2;
    }
    return finish_args(o, err);
}

/* The fit keeps the fewest dimensions holding 1 - eps of the sampled variance, and the sampled
 * variances of r equal directions spread (Marchenko-Pastur) down to about (1 - sqrt(r/T))^2 of
 * their mean; asking the smallest to hold 1.5 eps (with 0.8 for the source's unequal weights)
 * leaves a margin. A direction the fit drops costs about 1/r of the gradient's norm, far above
 * eps, and the loss vote then ends the compressed phase. */
int perf_grad_rank_auto(int T, int dmax, double eps) {
    int best = 1;
    for (int r = 1; r <= dmax && r < T; r++) {
        double q = 1.0 - sqrt((double)r / T);
        if (0.8 * q * q / r >= 1.5 * eps) best = r;
    }
    return best;
}
