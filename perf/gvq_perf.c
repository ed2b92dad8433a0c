/*
 * gvq_perf.c -- gvq-perf: allreduce bandwidth in the style of nccl-tests' all_reduce_perf, with
 * the codec as an extra column so gvq's ring, Open MPI's MPI_Allreduce and gvq's compressed
 * allreduce (GradiVeQ, QSGD) are measured side by side in one run, on the same buffers.
 *
 *   mpirun -np 4 gvq-perf -b 8 -e 128M -f 2 -n 20 -w 5 -d float -o sum -C none,mpi
 *   mpirun -np 4 gvq-perf -b 64M -e 64M -C none,gradiveq,qsgd -n 5 -w 2 --overlap -T 100
 *          --eps 0.003 -S 100000 --state-dir /tmp/gvq-state       (GradiVeQ at ratio 8)
 *
 * For every size (min, min*f, ... <= max) and every codec, out-of-place then in-place:
 *
 *   none, mpi:      fill buffers -> warmup calls -> MPI_Barrier -> time `iters` calls
 *                   -> max over ranks -> (check) refill, one call, count wrong elements
 *   gradiveq, qsgd: one compressor per size (fresh), float32 gradients from perf_gradsrc.c;
 *                   per call: fill gradient of iteration t -> MPI_Barrier -> (time) the call
 *                   gradiveq: calls before its compressed phase (warm-up, sampling, the call
 *                   that fits) run untimed; then `warmup` calls, then `iters` timed calls, each
 *                   timed only if the compressor is in the compressed phase when it starts.
 *                   qsgd: every call after the warmup ones is timed.
 *                   (check) rel_err of the last timed call against the exact sum, which every
 *                   rank computes in double for its share of the elements by regenerating
 *                   every rank's input (the source is a pure function of rank, t, index).
 *
 * time is per call (us); algbw = bytes / time; busbw = algbw * 2(n-1)/n (nccl-tests), always of
 * the uncompressed size. Rank r's element i (none, mpi) is a small integer derived from (r, i),
 * so each op's result has an exact closed form that the tool computes on its own, in double,
 * without asking any library. The table comes first, then per codec the average bus bandwidth,
 * the compressor details, then the ratio tables (none/mpi; none/gradiveq, none/qsgd,
 * qsgd/gradiveq), then the overlap table (--overlap). --fit-bench times the PCA fit alone and
 * --write-replay writes a replay file; both exit after that.
 * Exit status: 0 all correct, 1 some #wrong > 0, 2 bad arguments, 3 a compressed codec could
 * not be timed (it never stayed in its compressed phase) or its source failed.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gvq.h"
#include "perf_codecbench.h"
#include "perf_gradsrc.h"
#include "perf_sparse.h"

/* ---- errors --------------------------------------------------------------------------------- */

static int g_rank;
static gvqComm_t g_comm;

#define GVQTEST(call)                                                                          \
    do {                                                                                       \
        gvqResult_t res_ = (call);                                                             \
        if (res_ != gvqSuccess) {                                                              \
            fprintf(stderr, "gvq-perf: rank %d: %s:%d: %s failed: %s (%s)\n", g_rank, __FILE__, \
                    __LINE__, #call, gvqGetErrorString(res_), gvqGetLastError(g_comm));        \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                      \
        }                                                                                      \
    } while (0)

#define MPITEST(call)                                                                          \
    do {                                                                                       \
        int err_ = (call);                                                                     \
        if (err_ != MPI_SUCCESS) {                                                             \
            char msg_[MPI_MAX_ERROR_STRING];                                                   \
            int len_ = 0;                                                                      \
            MPI_Error_string(err_, msg_, &len_);                                               \
            fprintf(stderr, "gvq-perf: rank %d: %s:%d: %s failed: %s\n", g_rank, __FILE__,     \
                    __LINE__, #call, msg_);                                                    \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                      \
        }                                                                                      \
    } while (0)

/* ---- codecs, types, ops ----------------------------------------------------------------------- */

typedef enum { CODEC_NONE, CODEC_MPI, CODEC_GRADIVEQ, CODEC_QSGD, NUM_CODECS } codec_t;
static const char *const codec_names[NUM_CODECS] = {"none", "mpi", "gradiveq", "qsgd"};

/* Codecs that go through gvqAllReduceCompressed (float32 gradients, lossy). */
static int codec_is_lossy(codec_t c) { return c == CODEC_GRADIVEQ || c == CODEC_QSGD; }

typedef struct {
    const char *name;
    gvqDataType_t type;
    size_t size;
    int is_float;
    double avg_tol; /* relative tolerance of the avg check: 1e-3, or the type's own rounding */
} dtype_info_t;

static const dtype_info_t dtypes[] = {
    {"int8", gvqInt8, 1, 0, 0.0},         {"uint8", gvqUint8, 1, 0, 0.0},
    {"int32", gvqInt32, 4, 0, 0.0},       {"uint32", gvqUint32, 4, 0, 0.0},
    {"int64", gvqInt64, 8, 0, 0.0},       {"uint64", gvqUint64, 8, 0, 0.0},
    {"half", gvqFloat16, 2, 1, 1e-3},     {"float", gvqFloat32, 4, 1, 1e-3},
    {"double", gvqFloat64, 8, 1, 1e-3},
    /* 8 significant bits: sum/n rounds by up to 2^-9 relative, more than 1e-3 */
    {"bfloat16", gvqBfloat16, 2, 1, 1.0 / 256},
};
#define NUM_DTYPES (sizeof dtypes / sizeof dtypes[0])

static const struct {
    const char *alias, *name;
} dtype_aliases[] = {{"char", "int8"},     {"int", "int32"},       {"float16", "half"},
                     {"fp16", "half"},     {"float32", "float"},   {"fp32", "float"},
                     {"float64", "double"}, {"fp64", "double"},    {"bf16", "bfloat16"}};

static const char *const op_names[gvqNumOps] = {"sum", "prod", "max", "min", "avg"};

/* MPI's type for a gvq type, or MPI_DATATYPE_NULL where MPI has none. */
static MPI_Datatype mpi_dtype(gvqDataType_t t) {
    switch (t) {
    case gvqInt8: return MPI_INT8_T;
    case gvqUint8: return MPI_UINT8_T;
    case gvqInt32: return MPI_INT32_T;
    case gvqUint32: return MPI_UINT32_T;
    case gvqInt64: return MPI_INT64_T;
    case gvqUint64: return MPI_UINT64_T;
    case gvqFloat32: return MPI_FLOAT;
    case gvqFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
    }
}

/* MPI's op for a gvq op, or MPI_OP_NULL where MPI has none. */
static MPI_Op mpi_op(gvqRedOp_t op) {
    switch (op) {
    case gvqSum: return MPI_SUM;
    case gvqProd: return MPI_PROD;
    case gvqMax: return MPI_MAX;
    case gvqMin: return MPI_MIN;
    default: return MPI_OP_NULL;
    }
}

/* ---- half and bfloat16, round to nearest even -------------------------------------------------- */

static uint32_t f32_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static float bits_f32(uint32_t x) {
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* Drop the low `shift` bits of m, rounding to nearest, ties to even. */
static uint32_t round_shift(uint32_t m, int shift) {
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return q;
}

static uint16_t float_to_half(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                                     /* below 2^-14: subnormal or 0 */
        if (a < 0x33000000u) return (uint16_t)sign;            /* below 2^-25 */
        int e = (int)(a >> 23);
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        return (uint16_t)(sign | round_shift(m, 126 - e)); /* units of 2^-24 */
    }
    /* normal: rebias the exponent, round the mantissa; a carry walks into the exponent */
    uint32_t h = ((a >> 23) - 112u) << 10 | ((a & 0x7fffffu) >> 13);
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | (e + 112u) << 23 | (m << 13));
}

static uint16_t float_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float bf16_to_float(uint16_t b) { return bits_f32((uint32_t)b << 16); }

/* ---- element access --------------------------------------------------------------------------- */

static double load_elem(const void *buf, size_t i, gvqDataType_t t) {
    switch (t) {
    case gvqInt8: return ((const int8_t *)buf)[i];
    case gvqUint8: return ((const uint8_t *)buf)[i];
    case gvqInt32: return ((const int32_t *)buf)[i];
    case gvqUint32: return ((const uint32_t *)buf)[i];
    case gvqInt64: return (double)((const int64_t *)buf)[i];
    case gvqUint64: return (double)((const uint64_t *)buf)[i];
    case gvqFloat16: return half_to_float(((const uint16_t *)buf)[i]);
    case gvqFloat32: return ((const float *)buf)[i];
    case gvqFloat64: return ((const double *)buf)[i];
    case gvqBfloat16: return bf16_to_float(((const uint16_t *)buf)[i]);
    default: return NAN;
    }
}

/* Stores a small non-negative integer v. */
static void store_elem(void *buf, size_t i, gvqDataType_t t, double v) {
    switch (t) {
    case gvqInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case gvqUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case gvqInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case gvqUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case gvqInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case gvqUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case gvqFloat16: ((uint16_t *)buf)[i] = float_to_half((float)v); break;
    case gvqFloat32: ((float *)buf)[i] = (float)v; break;
    case gvqFloat64: ((double *)buf)[i] = v; break;
    case gvqBfloat16: ((uint16_t *)buf)[i] = float_to_bf16((float)v); break;
    default: break;
    }
}

/* An integer value as the integer type holds it after wrapping (sums of int8 wrap). */
static int64_t wrap_int(int64_t v, gvqDataType_t t) {
    uint64_t u = (uint64_t)v;
    switch (t) {
    case gvqInt8: u &= 0xffu; return u >= 0x80u ? (int64_t)u - 0x100 : (int64_t)u;
    case gvqUint8: return (int64_t)(u & 0xffu);
    case gvqInt32: u &= 0xffffffffu; return u >= 0x80000000u ? (int64_t)u - 0x100000000 : (int64_t)u;
    case gvqUint32: return (int64_t)(u & 0xffffffffu);
    default: return v; /* 64-bit types: our values never leave their range */
    }
}

/* ---- data pattern and its closed form --------------------------------------------------------- */

/* A well-mixed key of (rank, index), so that data moved to a wrong offset shows. */
static unsigned pattern_key(int r, size_t i) {
    uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ ((uint64_t)r + 1) * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 32;
    return (unsigned)(x % 15u);
}

/* Rank r's element i: 1..5; for prod 1 or 2, and 2 only on ranks 0..5, so that every product
 * is at most 64 and exact in every type (int8 included). */
static int pattern_value(int r, size_t i, gvqRedOp_t op) {
    unsigned k = pattern_key(r, i);
    if (op == gvqProd) return (r < 6 && k % 3u == 0) ? 2 : 1;
    return (int)(k % 5u) + 1;
}

typedef struct {
    const dtype_info_t *dt;
    gvqRedOp_t op;
    int nranks;
} check_t;

/* The exact result of the allreduce at element i, computed here in double / int64. */
static double expected_value(const check_t *c, size_t i) {
    int64_t acc = c->op == gvqProd ? 1 : 0;
    for (int r = 0; r < c->nranks; r++) {
        int64_t v = pattern_value(r, i, c->op);
        switch (c->op) {
        case gvqSum:
        case gvqAvg: acc += v; break;
        case gvqProd: acc *= v; break;
        case gvqMax: acc = r == 0 || v > acc ? v : acc; break;
        case gvqMin: acc = r == 0 || v < acc ? v : acc; break;
        default: break;
        }
    }
    if (c->dt->is_float) return c->op == gvqAvg ? (double)acc / c->nranks : (double)acc;
    acc = wrap_int(acc, c->dt->type);
    if (c->op == gvqAvg) acc /= c->nranks; /* C truncation, as gvqAvg on integer types */
    return (double)acc;
}

static void fill_pattern(void *buf, size_t count, int rank, const check_t *c) {
    for (size_t i = 0; i < count; i++)
        store_elem(buf, i, c->dt->type, pattern_value(rank, i, c->op));
}

static int64_t count_wrong(const void *buf, size_t count, const check_t *c) {
    int64_t wrong = 0;
    for (size_t i = 0; i < count; i++) {
        double got = load_elem(buf, i, c->dt->type), want = expected_value(c, i);
        int ok;
        if (c->dt->is_float && c->op == gvqAvg)
            ok = fabs(got - want) <= c->dt->avg_tol * fabs(want);
        else
            ok = got == want;
        wrong += !ok;
    }
    return wrong;
}

/* ---- options ---------------------------------------------------------------------------------- */

typedef struct {
    size_t minbytes, maxbytes, factor;
    int iters, warmup, check;
    const dtype_info_t *dt;
    gvqRedOp_t op;
    int ncodecs;
    codec_t codecs[NUM_CODECS];
    const char *csv;
    /* compressed codecs (gvqCompressorConfig_t); S and W: GVQ_CONFIG_UNDEF_INT = library default */
    int L, dmax, T, S, W;
    double eps;
    int qbits, qbucket, wire_fp16, sample_qsgd;
    /* gradient source */
    unsigned long long seed;
    int grad_rank;
    double noise, variation;
    const char *replay, *write_replay, *state_dir;
    int replay_iters;
    /* extra reports */
    int overlap, fit_bench, fit_reps;
} opts_t;

static void usage(FILE *f, const char *prog) {
    fprintf(
        f,
        "usage: mpirun -np N %s [options]\n"
        "  allreduce bandwidth, nccl-tests style: gvq's ring against MPI_Allreduce and gvq's\n"
        "  compressed allreduce (GradiVeQ, QSGD)\n"
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
        "  -C, --codec LIST        comma-separated: none (gvq's ring, gvqAllReduce),\n"
        "                          mpi (MPI_Allreduce, the reference), gradiveq, qsgd\n"
        "                          (gvqAllReduceCompressed), all = none,mpi,gradiveq,qsgd\n"
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
        "      --wire fp32|fp16    GradiVeQ coefficients on the wire (default fp32)\n"
        "      --qbits B           QSGD bits: 2, 4 or 8 (default 4)\n"
        "      --qbucket N         QSGD values per bucket (default 512)\n"
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
        "  -h, --help              this text\n",
        prog);
}

/* Parses "123", "64K", "16M", "1G" (powers of 1024). */
static int parse_size(const char *s, size_t *out) {
    if (s[0] < '0' || s[0] > '9') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0) return -1;
    unsigned long long mult = 1;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': mult = 1ull << 10; end++; break;
    case 'm': case 'M': mult = 1ull << 20; end++; break;
    case 'g': case 'G': mult = 1ull << 30; end++; break;
    default: return -1;
    }
    if (*end != '\0' || v > SIZE_MAX / mult) return -1;
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

static void add_codec(opts_t *o, codec_t c) {
    for (int k = 0; k < o->ncodecs; k++)
        if (o->codecs[k] == c) return;
    o->codecs[o->ncodecs++] = c;
}

/* Parses a comma-separated codec list; prints the error on `err` (NULL: quiet). */
static int parse_codecs(const char *list, opts_t *o, FILE *err) {
    char buf[256];
    if (strlen(list) >= sizeof buf) {
        if (err) fprintf(err, "gvq-perf: codec list too long\n");
        return -1;
    }
    strcpy(buf, list);
    o->ncodecs = 0;
    for (char *tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ",")) {
        int found = 0;
        if (strcmp(tok, "all") == 0) {
            for (int c = 0; c < NUM_CODECS; c++) add_codec(o, (codec_t)c);
            continue;
        }
        for (int c = 0; c < NUM_CODECS; c++)
            if (strcmp(tok, codec_names[c]) == 0) {
                add_codec(o, (codec_t)c);
                found = 1;
            }
        if (found) continue;
        if (err)
            fprintf(err, "gvq-perf: unknown codec '%s' (known: none, mpi, gradiveq, qsgd, all)\n",
                    tok);
        return -1;
    }
    if (o->ncodecs == 0) {
        if (err) fprintf(err, "gvq-perf: empty codec list\n");
        return -1;
    }
    return 0;
}

enum {
    OPT_CSV = 256,
    OPT_EPS,
    OPT_GVQ_WARMUP,
    OPT_SAMPLE_CODEC,
    OPT_WIRE,
    OPT_QBITS,
    OPT_QBUCKET,
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
    OPT_STATE_DIR
};

/* The largest number of directions r <= dmax whose T-sample fit keeps them all at loss threshold
 * eps: the fit keeps the fewest dimensions holding 1 - eps of the sampled variance, and the
 * sampled variances of r equal directions spread (Marchenko-Pastur) down to about
 * (1 - sqrt(r/T))^2 of their mean; asking the smallest to hold 1.5 eps (with 0.8 for the
 * source's unequal weights) leaves a margin. A direction the fit drops costs about 1/r of the
 * gradient's norm, far above eps, and the loss vote then ends the compressed phase. */
static int grad_rank_auto(int T, int dmax, double eps) {
    int best = 1;
    for (int r = 1; r <= dmax && r < T; r++) {
        double q = 1.0 - sqrt((double)r / T);
        if (0.8 * q * q / r >= 1.5 * eps) best = r;
    }
    return best;
}

/* Returns 0 to run, 1 to exit with success (help), 2 to exit with an argument error. Every rank
 * parses the same argv and so reaches the same answer; only `verbose` prints. */
static int parse_args(int argc, char **argv, opts_t *o, int verbose) {
    static const struct option longopts[] = {
        {"minbytes", required_argument, NULL, 'b'},
        {"maxbytes", required_argument, NULL, 'e'},
        {"stepfactor", required_argument, NULL, 'f'},
        {"iters", required_argument, NULL, 'n'},
        {"warmup_iters", required_argument, NULL, 'w'},
        {"check", required_argument, NULL, 'c'},
        {"datatype", required_argument, NULL, 'd'},
        {"op", required_argument, NULL, 'o'},
        {"codec", required_argument, NULL, 'C'},
        {"csv", required_argument, NULL, OPT_CSV},
        {"slice", required_argument, NULL, 'L'},
        {"max-dims", required_argument, NULL, 'D'},
        {"eps", required_argument, NULL, OPT_EPS},
        {"sample-iters", required_argument, NULL, 'T'},
        {"compressed-iters", required_argument, NULL, 'S'},
        {"gvq-warmup", required_argument, NULL, OPT_GVQ_WARMUP},
        {"sample-codec", required_argument, NULL, OPT_SAMPLE_CODEC},
        {"wire", required_argument, NULL, OPT_WIRE},
        {"qbits", required_argument, NULL, OPT_QBITS},
        {"qbucket", required_argument, NULL, OPT_QBUCKET},
        {"seed", required_argument, NULL, OPT_SEED},
        {"grad-rank", required_argument, NULL, OPT_GRAD_RANK},
        {"noise", required_argument, NULL, OPT_NOISE},
        {"variation", required_argument, NULL, OPT_VARIATION},
        {"state-dir", required_argument, NULL, OPT_STATE_DIR},
        {"replay", required_argument, NULL, OPT_REPLAY},
        {"write-replay", required_argument, NULL, OPT_WRITE_REPLAY},
        {"replay-iters", required_argument, NULL, OPT_REPLAY_ITERS},
        {"overlap", no_argument, NULL, OPT_OVERLAP},
        {"fit-bench", no_argument, NULL, OPT_FIT_BENCH},
        {"fit-reps", required_argument, NULL, OPT_FIT_REPS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    FILE *err = verbose ? stderr : NULL;
    int factor = 2, dmax_given = 0;
    memset(o, 0, sizeof *o);
    o->minbytes = o->maxbytes = (size_t)32 << 20;
    o->iters = 20;
    o->warmup = 5;
    o->check = 1;
    o->dt = find_dtype("float");
    o->op = gvqSum;
    parse_codecs("none,mpi", o, NULL);
    o->L = 256;
    o->eps = 0.01;
    o->T = 20;
    o->S = GVQ_CONFIG_UNDEF_INT;
    o->W = 0;
    o->qbits = 4;
    o->qbucket = 512;
    o->seed = 1;
    o->noise = -1.0;
    o->variation = 1.0;
    o->replay_iters = 16;
    o->fit_reps = 5;
    opterr = verbose;
    int ch;
    while ((ch = getopt_long(argc, argv, "b:e:f:n:w:c:d:o:C:L:D:T:S:h", longopts, NULL)) != -1) {
        const char *what = NULL;
        switch (ch) {
        case 'b': if (parse_size(optarg, &o->minbytes)) what = "-b (a size like 8, 64K, 16M)"; break;
        case 'e': if (parse_size(optarg, &o->maxbytes)) what = "-e (a size like 8, 64K, 16M)"; break;
        case 'f': if (parse_int(optarg, 2, 1 << 20, &factor)) what = "-f (an integer >= 2)"; break;
        case 'n': if (parse_int(optarg, 1, INT_MAX, &o->iters)) what = "-n (an integer >= 1)"; break;
        case 'w': if (parse_int(optarg, 0, INT_MAX, &o->warmup)) what = "-w (an integer >= 0)"; break;
        case 'c': if (parse_int(optarg, 0, 1, &o->check)) what = "-c (0 or 1)"; break;
        case 'd':
            o->dt = find_dtype(optarg);
            if (o->dt == NULL)
                what = "-d (int8 uint8 int32 uint32 int64 uint64 half float double bfloat16)";
            break;
        case 'o': {
            int found = -1;
            for (int k = 0; k < gvqNumOps; k++)
                if (strcmp(optarg, op_names[k]) == 0) found = k;
            if (found < 0) what = "-o (sum prod max min avg)";
            else o->op = (gvqRedOp_t)found;
            break;
        }
        case 'C':
            if (parse_codecs(optarg, o, err)) return 2;
            break;
        case OPT_CSV: o->csv = optarg; break;
        case 'L': if (parse_int(optarg, 1, 65536, &o->L)) what = "-L (in [1, 65536])"; break;
        case 'D':
            if (parse_int(optarg, 1, 65536, &o->dmax)) what = "-D (an integer >= 1)";
            dmax_given = 1;
            break;
        case OPT_EPS:
            if (parse_double(optarg, 0.0, 1.0, 1, &o->eps)) what = "--eps (in (0, 1))";
            break;
        case 'T': if (parse_int(optarg, 1, 1 << 20, &o->T)) what = "-T (an integer >= 1)"; break;
        case 'S': if (parse_int(optarg, 1, INT_MAX, &o->S)) what = "-S (an integer >= 1)"; break;
        case OPT_GVQ_WARMUP:
            if (parse_int(optarg, 0, 1 << 20, &o->W)) what = "--gvq-warmup (an integer >= 0)";
            break;
        case OPT_SAMPLE_CODEC:
            if (strcmp(optarg, "none") == 0) o->sample_qsgd = 0;
            else if (strcmp(optarg, "qsgd") == 0) o->sample_qsgd = 1;
            else what = "--sample-codec (none or qsgd)";
            break;
        case OPT_WIRE:
            if (strcmp(optarg, "fp32") == 0 || strcmp(optarg, "float") == 0) o->wire_fp16 = 0;
            else if (strcmp(optarg, "fp16") == 0 || strcmp(optarg, "half") == 0) o->wire_fp16 = 1;
            else what = "--wire (fp32 or fp16)";
            break;
        case OPT_QBITS:
            if (parse_int(optarg, 2, 8, &o->qbits) || o->qbits == 3 || o->qbits == 5 ||
                o->qbits == 6 || o->qbits == 7)
                what = "--qbits (2, 4 or 8)";
            break;
        case OPT_QBUCKET:
            if (parse_int(optarg, 1, 1 << 24, &o->qbucket)) what = "--qbucket (in [1, 2^24])";
            break;
        case OPT_SEED: {
            char *end;
            errno = 0;
            o->seed = strtoull(optarg, &end, 10);
            if (errno != 0 || end == optarg || *end != '\0' || optarg[0] == '-')
                what = "--seed (a non-negative integer)";
            break;
        }
        case OPT_GRAD_RANK:
            if (parse_int(optarg, 1, 4096, &o->grad_rank)) what = "--grad-rank (in [1, 4096])";
            break;
        case OPT_NOISE:
            if (parse_double(optarg, 0.0, 10.0, 0, &o->noise)) what = "--noise (in [0, 10])";
            break;
        case OPT_VARIATION:
            if (parse_double(optarg, 0.0, 100.0, 0, &o->variation))
                what = "--variation (in [0, 100])";
            break;
        case OPT_STATE_DIR:
            o->state_dir = optarg;
            break;
        case OPT_REPLAY:
            o->replay = optarg;
            break;
        case OPT_WRITE_REPLAY:
            o->write_replay = optarg;
            break;
        case OPT_REPLAY_ITERS:
            if (parse_int(optarg, 1, 1 << 20, &o->replay_iters)) what = "--replay-iters (>= 1)";
            break;
        case OPT_OVERLAP:
            o->overlap = 1;
            break;
        case OPT_FIT_BENCH:
            o->fit_bench = 1;
            break;
        case OPT_FIT_REPS:
            if (parse_int(optarg, 1, 1000, &o->fit_reps)) what = "--fit-reps (in [1, 1000])";
            break;
        case 'h':
            if (verbose) usage(stdout, argv[0]);
            return 1;
        default:
            if (verbose) usage(stderr, argv[0]);
            return 2;
        }
        if (what != NULL) {
            if (err) fprintf(err, "gvq-perf: bad value '%s' for %s\n", optarg, what);
            return 2;
        }
    }
    if (optind < argc) {
        if (err) fprintf(err, "gvq-perf: unexpected argument '%s' (see -h)\n", argv[optind]);
        return 2;
    }
    if (o->minbytes > o->maxbytes && o->write_replay == NULL && !o->fit_bench) {
        if (err) fprintf(err, "gvq-perf: -b %zu is larger than -e %zu\n", o->minbytes, o->maxbytes);
        return 2;
    }
    if (!dmax_given) o->dmax = o->L / 8 > 0 ? o->L / 8 : 1;
    if (o->dmax > o->L) {
        if (err) fprintf(err, "gvq-perf: -D %d is larger than -L %d\n", o->dmax, o->L);
        return 2;
    }
    if (o->grad_rank == 0) o->grad_rank = grad_rank_auto(o->T, o->dmax, o->eps);
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
    o->factor = (size_t)factor;
    return 0;
}

/* ---- running one case -------------------------------------------------------------------------
 */

typedef struct {
    double time_us; /* < 0: not measured */
    int64_t wrong;  /* -1: not checked */
    double ratio;   /* uncompressed / wire bytes; 0: not applicable */
    double rel_err; /* < 0: not computed */
} result_t;

static const result_t result_none = {-1.0, -1, 0.0, -1.0};

typedef struct {
    double busbw_sum;
    int busbw_n;
} codec_stats_t;

/* Why MPI_Allreduce cannot run this dtype/op, or NULL if it can. */
static const char *mpi_skip_reason(const opts_t *o, char *buf, size_t len) {
    if (mpi_dtype(o->dt->type) == MPI_DATATYPE_NULL) {
        snprintf(buf, len, "MPI_Allreduce has no %s type", o->dt->name);
        return buf;
    }
    if (mpi_op(o->op) == MPI_OP_NULL) {
        snprintf(buf, len, "MPI_Allreduce has no %s op", op_names[o->op]);
        return buf;
    }
    return NULL;
}

/* Why gvqAllReduceCompressed cannot run this dtype/op, or NULL if it can. */
static const char *lossy_skip_reason(const opts_t *o, char *buf, size_t len) {
    if (o->dt->type != gvqFloat32) {
        snprintf(buf, len, "gvqAllReduceCompressed takes float32 only, not -d %s", o->dt->name);
        return buf;
    }
    if (o->op != gvqSum && o->op != gvqAvg) {
        snprintf(buf, len, "gvqAllReduceCompressed takes op sum or avg only, not -o %s",
                 op_names[o->op]);
        return buf;
    }
    return NULL;
}

/* One allreduce; in place when send == recv. */
static void run_coll(const opts_t *o, codec_t codec, const void *send, void *recv, size_t count) {
    if (codec == CODEC_NONE) {
        GVQTEST(gvqAllReduce(send, recv, count, o->dt->type, o->op, g_comm, NULL));
        return;
    }
    /* MPI counts are int: large counts go in pieces */
    const size_t piece = (size_t)1 << 30;
    for (size_t off = 0; off < count; off += piece) {
        size_t n = count - off < piece ? count - off : piece;
        void *r = (char *)recv + off * o->dt->size;
        const void *s = send == recv ? MPI_IN_PLACE : (const char *)send + off * o->dt->size;
        MPITEST(MPI_Allreduce(s, r, (int)n, mpi_dtype(o->dt->type), mpi_op(o->op), MPI_COMM_WORLD));
    }
}

static result_t run_case(const opts_t *o, codec_t codec, void *sendbuf, void *recvbuf, size_t count,
                         int inplace, const check_t *chk) {
    result_t res = result_none;
    const void *send = inplace ? recvbuf : sendbuf;
    fill_pattern(inplace ? recvbuf : sendbuf, count, g_rank, chk);
    for (int k = 0; k < o->warmup; k++)
        run_coll(o, codec, send, recvbuf, count);

    MPITEST(MPI_Barrier(MPI_COMM_WORLD));
    double t0 = MPI_Wtime();
    for (int k = 0; k < o->iters; k++)
        run_coll(o, codec, send, recvbuf, count);
    double elapsed = MPI_Wtime() - t0, maxel = 0.0;
    MPITEST(MPI_Allreduce(&elapsed, &maxel, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    res.time_us = maxel / o->iters * 1e6;

    if (o->check) {
        fill_pattern(inplace ? recvbuf : sendbuf, count, g_rank, chk);
        if (!inplace) memset(recvbuf, 0xa5, count * o->dt->size); /* poison the output */
        run_coll(o, codec, send, recvbuf, count);
        int64_t wrong = count_wrong(recvbuf, count, chk), total = 0;
        MPITEST(MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
        res.wrong = total;
    }
    return res;
}

/* ---- compressed codecs ---------------------------------------------------------------------- */

/* Fills elements [off, off+len) of rank's gradient at iteration t; a replay read error ends the
 * run (exit 3). */
static void source_fill(const gs_source_t *src, int rank, long long t, size_t off, size_t len,
                        float *out) {
    if (gs_fill(src, rank, t, off, len, out) != 0) {
        fprintf(stderr, "gvq-perf: rank %d: cannot read the replay file (iteration %lld): %s\n",
                g_rank, t, strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
}

/* ||y - exact|| / ||exact|| where exact is the sum (or average) over every rank of the source's
 * iteration t, in double. Each rank regenerates every rank's input for its own 1/N of the
 * elements; the squared norms are summed over the ranks. */
static double exact_rel_err(const gs_source_t *src, long long t, size_t count, const float *y,
                            gvqRedOp_t op, int nranks) {
    const size_t block = (size_t)1 << 16;
    size_t lo = count / (size_t)nranks * (size_t)g_rank,
           hi = count / (size_t)nranks * (size_t)(g_rank + 1);
    if (g_rank == nranks - 1) hi = count;
    float *tmp = malloc(sizeof(float) * block);
    double *acc = malloc(sizeof(double) * block);
    if (tmp == NULL || acc == NULL) {
        fprintf(stderr, "gvq-perf: rank %d: out of memory\n", g_rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double loc[2] = {0.0, 0.0}, tot[2] = {0.0, 0.0};
    for (size_t off = lo; off < hi; off += block) {
        size_t n = hi - off < block ? hi - off : block;
        for (size_t i = 0; i < n; i++)
            acc[i] = 0.0;
        for (int r = 0; r < nranks; r++) {
            source_fill(src, r, t, off, n, tmp);
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

static gvqCompressor_t make_compressor(const opts_t *o, codec_t codec, size_t count) {
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = codec == CODEC_GRADIVEQ ? gvqCodecGradiveq : gvqCodecQsgd;
    cfg.qsgdBits = o->qbits;
    cfg.qsgdBucket = o->qbucket;
    cfg.seed = (int)(o->seed & 0x7fffffff);
    if (codec == CODEC_GRADIVEQ) {
        cfg.sliceSize = o->L;
        cfg.maxDims = o->dmax;
        cfg.lossThreshold = (float)o->eps;
        cfg.sampleIters = o->T;
        cfg.compressedIters = o->S;
        cfg.warmupIters = o->W;
        cfg.sampleCodec = o->sample_qsgd ? gvqCodecQsgd : gvqCodecNone;
        cfg.wireType = o->wire_fp16 ? gvqFloat16 : gvqFloat32;
    }
    gvqCompressor_t c = NULL;
    GVQTEST(gvqCompressorCreate(g_comm, count, &cfg, &c));
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
static void state_path(char *buf, size_t len, const opts_t *o, const gs_source_t *src, size_t count,
                       int nranks) {
    char desc[600];
    gs_describe(src, desc, sizeof desc);
    uint64_t h = 1469598103934665603ull; /* FNV-1a of what the fit depends on */
    char key[800];
    snprintf(key, sizeof key, "%s|L%d D%d eps%g T%d S%d W%d sq%d w%d", desc, o->L, o->dmax, o->eps,
             o->T, o->S, o->W, o->sample_qsgd, o->wire_fp16);
    for (const char *p = key; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    snprintf(buf, len, "%s/gvq-perf-gradiveq-%016llx-n%d-c%zu-r%d.state", o->state_dir,
             (unsigned long long)h, nranks, count, g_rank);
}

/* Loads the saved compressor if every rank has one that loads; otherwise every rank starts
 * from a fresh compressor. Returns 1 when loaded. */
static int state_load(const opts_t *o, codec_t codec, gvqCompressor_t *comp, size_t count,
                      const char *path) {
    int ok = access(path, R_OK) == 0 && gvqCompressorLoadFile(*comp, path) == gvqSuccess, all = 0;
    MPITEST(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
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
        fprintf(stderr, "gvq-perf: rank %d: cannot save the compressor to %s: %s\n", g_rank, path,
                gvqGetLastError(g_comm));
}

static result_t run_lossy_case(const opts_t *o, codec_t codec, lossy_ctx_t *lc, float *sendbuf,
                               float *recvbuf, size_t count, int inplace, int nranks) {
    result_t res = result_none;
    float *in = inplace ? recvbuf : sendbuf;
    /* enough for the warm-up and three rounds of sampling (early exits send it back there) */
    const long long limit = (long long)o->W + 3 * ((long long)o->T + 1) + 3;
    long long untimed_here = 0;
    int warm = 0, timed = 0;
    double sum = 0.0;
    gvqCompressorStats_t st;
    while (timed < o->iters) {
        GVQTEST(gvqCompressorGetStats(lc->comp, &st));
        /* the phase is the same on every rank, so every rank takes the same branches */
        int measured =
            codec == CODEC_QSGD || st.phase == gvqPhaseCompressed || st.phase == gvqPhasePlain;
        if (!measured && untimed_here >= limit) {
            snprintf(lc->why, sizeof lc->why,
                     "%lld calls without staying in the compressed phase (%.120s)", untimed_here,
                     st.reason[0] ? st.reason : "no reason given");
            break;
        }
        source_fill(lc->src, g_rank, lc->t, 0, count, in);
        if (measured) MPITEST(MPI_Barrier(MPI_COMM_WORLD));
        double t0 = MPI_Wtime();
        GVQTEST(
            gvqAllReduceCompressed(in, recvbuf, count, gvqFloat32, o->op, lc->comp, g_comm, NULL));
        double dt = MPI_Wtime() - t0;
        lc->t++;
        lc->calls++;
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
    if (timed < o->iters) return res;
    double per = sum / o->iters, maxper = 0.0;
    MPITEST(MPI_Allreduce(&per, &maxper, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    res.time_us = maxper * 1e6;
    GVQTEST(gvqCompressorGetStats(lc->comp, &st));
    res.ratio = st.ratio;
    if (o->check) res.rel_err = exact_rel_err(lc->src, lc->t - 1, count, recvbuf, o->op, nranks);
    return res;
}

/* One line on the compressor of a size, for the details section. */
static void lossy_details(char *buf, size_t len, codec_t codec, size_t bytes,
                          const lossy_ctx_t *lc) {
    gvqCompressorStats_t st;
    GVQTEST(gvqCompressorGetStats(lc->comp, &st));
    static const char *const phases[] = {"warm-up", "sample", "compressed", "plain"};
    const char *ph = st.phase >= 0 && st.phase <= 3 ? phases[st.phase] : "?";
    double wire_ratio = st.wireBytes ? (double)st.rawBytes / (double)st.wireBytes : 0.0;
    if (codec == CODEC_GRADIVEQ)
        snprintf(buf, len,
                 "# %-8s %12zu B: d=%d L=%d groups=%d ratio %.3f (all calls %.3f) kept %.4f "
                 "lastLoss %.4g fits %lld refused %lld earlyExits %lld fit %.1f ms; calls %lld "
                 "(%lld untimed: warm-up/sampling/fit)%s, phase now %s%s%s",
                 codec_names[codec], bytes, st.dims, st.sliceSize, st.groups, st.ratio, wire_ratio,
                 st.keptEnergy, st.lastLoss, st.fits, st.fitsRefused, st.earlyExits,
                 st.fitSeconds * 1e3, lc->calls, lc->untimed,
                 lc->loaded ? " [fit loaded from --state-dir]" : "", ph, st.reason[0] ? ": " : "",
                 st.reason);
    else
        snprintf(buf, len, "# %-8s %12zu B: ratio %.3f calls %lld%s%s", codec_names[codec], bytes,
                 st.ratio, lc->calls, lc->why[0] ? "; NOT TIMED: " : "", lc->why);
    if (codec == CODEC_GRADIVEQ && lc->why[0]) {
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "; NOT TIMED: %s", lc->why);
    }
}

/* ---- overlap and fit reports ------------------------------------------------------------------
 */

/* A barrier in which waiting ranks sleep instead of spinning, so that the one rank that works
 * meanwhile has a core to itself (ranks may outnumber cores). */
static void sleepy_barrier(void) {
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

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double perf_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Block timing of `iters` plain allreduces of `count` floats on `comm` (as run_case: warmup
 * calls, barrier, the calls, max over ranks), in us. */
static double time_plain(const opts_t *o, gvqComm_t comm, const void *send, void *recv,
                         size_t count, gvqDataType_t type, int iters) {
    for (int k = 0; k < o->warmup; k++)
        GVQTEST(gvqAllReduce(send, recv, count, type, gvqSum, comm, NULL));
    MPITEST(MPI_Barrier(MPI_COMM_WORLD));
    double t0 = MPI_Wtime();
    for (int k = 0; k < iters; k++)
        GVQTEST(gvqAllReduce(send, recv, count, type, gvqSum, comm, NULL));
    double el = MPI_Wtime() - t0, maxel = 0.0;
    MPITEST(MPI_Allreduce(&el, &maxel, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    return maxel / iters * 1e6;
}

typedef struct {
    size_t bytes, count;
    double ratio;
    int d;
    size_t chunk, wchunk;
    double total, wire, vote, wire_def, enc, dec, comp, comp_alone, hidden, hidden_alone;
    char err[160];
} overlap_t;

/* The overlap report of one size (see usage): every rank takes part. */
static void measure_overlap(const opts_t *o, const gs_source_t *src, size_t count, double ratio,
                            int d, double total_us, float *sendbuf, float *recvbuf, int nranks,
                            overlap_t *ov) {
    memset(ov, 0, sizeof *ov);
    ov->bytes = count * sizeof(float);
    ov->count = count;
    ov->ratio = ratio;
    ov->d = d;
    ov->total = total_us;
    ov->chunk = cb_chunk_bytes();
    /* the ring of the compressed call sends chunk/ratio bytes per chunk: give the plain
     * allreduce of the wire-sized vector the same chunks, so only the compute differs */
    ov->wchunk = (size_t)((double)ov->chunk / ratio) / 4 * 4;
    if (ov->wchunk < 64) ov->wchunk = 64;
    size_t count_w = (size_t)llround((double)count / ratio);
    if (count_w < 1) count_w = 1;
    for (size_t i = 0; i < count_w; i++)
        sendbuf[i] = (float)(i % 7);

    gvqUniqueId id;
    memset(&id, 0, sizeof id);
    if (g_rank == 0) GVQTEST(gvqGetUniqueId(&id));
    MPITEST(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.chunkBytes = (int)ov->wchunk;
    gvqComm_t wcomm = NULL;
    GVQTEST(gvqCommInitRankConfig(&wcomm, nranks, id, g_rank, &cfg));
    ov->wire = time_plain(o, wcomm, sendbuf, recvbuf, count_w, gvqFloat32, o->iters);
    GVQTEST(gvqCommDestroy(wcomm));
    ov->wire_def = time_plain(o, g_comm, sendbuf, recvbuf, count_w, gvqFloat32, o->iters);
    int32_t vote_in = 1, vote_out = 0;
    ov->vote =
        time_plain(o, g_comm, &vote_in, &vote_out, 1, gvqInt32, o->iters > 20 ? o->iters : 20);

    /* a compressor of the same d, fitted on slices of this rank's own gradient */
    size_t L = (size_t)o->L, T = (size_t)(4 * d + 8), nsl = count / L;
    float *samples = malloc(sizeof(float) * L * T);
    if (samples == NULL) {
        fprintf(stderr, "gvq-perf: rank %d: out of memory\n", g_rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t k = 0; k < T; k++)
        source_fill(src, g_rank, (long long)(k / nsl), (k % nsl) * L, L, samples + k * L);
    char err[160] = "";
    cb_gradiveq_t *cb =
        cb_gradiveq_create(count, L, (size_t)d, nranks, o->wire_fp16, samples, T, err, sizeof err);
    free(samples);
    int ok = cb != NULL, all_ok = 0;
    MPITEST(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (!all_ok) {
        snprintf(ov->err, sizeof ov->err, "%s", err[0] ? err : "codec bench failed on a rank");
        cb_gradiveq_free(cb);
        return;
    }
    source_fill(src, g_rank, 0, 0, count, sendbuf);
    enum { REPS = 3 };
    double enc[REPS], dec[REPS], both[REPS];
    /* concurrent: every rank computes at once, as in the ring */
    for (int k = 0; k < REPS; k++) {
        MPITEST(MPI_Barrier(MPI_COMM_WORLD));
        if (cb_gradiveq_run(cb, sendbuf, ov->chunk, &enc[k], &dec[k]) != 0) {
            fprintf(stderr, "gvq-perf: rank %d: the codec failed: %s\n", g_rank,
                    gvqGetLastError(NULL));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        both[k] = enc[k] + dec[k];
    }
    double loc[3] = {perf_median(enc, REPS), perf_median(dec, REPS), perf_median(both, REPS)};
    double mx[3];
    MPITEST(MPI_Allreduce(loc, mx, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    ov->enc = mx[0] * 1e6;
    ov->dec = mx[1] * 1e6;
    ov->comp = mx[2] * 1e6;
    /* alone: rank 0 computes while the others sleep */
    double alone = 0.0;
    sleepy_barrier();
    if (g_rank == 0) {
        for (int k = 0; k < REPS; k++) {
            if (cb_gradiveq_run(cb, sendbuf, ov->chunk, &enc[k], &dec[k]) != 0) {
                fprintf(stderr, "gvq-perf: rank 0: the codec failed\n");
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            both[k] = enc[k] + dec[k];
        }
        alone = perf_median(both, REPS);
    }
    sleepy_barrier();
    MPITEST(MPI_Bcast(&alone, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    ov->comp_alone = alone * 1e6;
    cb_gradiveq_free(cb);
    double wire = ov->wire; /* the vote rides inside the compressed message: not added */
    ov->hidden = ov->comp > 0 ? (wire + ov->comp - ov->total) / ov->comp : 0.0;
    ov->hidden = ov->hidden < 0 ? 0.0 : ov->hidden > 1 ? 1.0 : ov->hidden;
    ov->hidden_alone =
        ov->comp_alone > 0 ? (wire + ov->comp_alone - ov->total) / ov->comp_alone : 0.0;
    ov->hidden_alone = ov->hidden_alone < 0 ? 0.0 : ov->hidden_alone > 1 ? 1.0 : ov->hidden_alone;
}

static void print_overlap(const overlap_t *ov, int n) {
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

/* --fit-bench: gvq_pca_fit on rank 0 for a few slice sizes; the other ranks sleep. */
static int run_fit_bench(const opts_t *o) {
    static const size_t Ls[] = {256, 512, 1024, 2304};
    const size_t T = 100;
    int rc = 0;
    sleepy_barrier();
    if (g_rank == 0) {
        const char *nt = getenv("OPENBLAS_NUM_THREADS");
        printf("# fit bench: gvq_pca_fit on the host device (Gram route when T < L: T x T sgemm +\n"
               "#   LAPACKE ssyevd, eigenvectors mapped back and re-orthonormalised),\n"
               "#   T=%zu samples (one slice of the synthetic source over T iterations), eps %g,\n"
               "#   no cap on d; median (min, max) of %d fits; cov(ms) and ssyevd(ms): the\n"
               "#   covariance route's L x L sgemm and L x L eigen-solve, timed on their own;\n"
               "#   OPENBLAS_NUM_THREADS=%s\n",
               T, o->eps, o->fit_reps, nt ? nt : "(unset)");
        printf("#%5s%5s%6s%9s%11s%11s%11s%11s%11s\n", "L", "T", "d", "kept", "fit(ms)", "min",
               "max", "cov(ms)", "ssyevd(ms)");
        for (size_t k = 0; k < sizeof Ls / sizeof Ls[0] && rc == 0; k++) {
            size_t L = Ls[k];
            int r = (int)(L / 8 < T - 4 ? L / 8 : T - 4);
            gs_source_t *src = gs_synthetic(o->seed, L, r, o->noise, o->variation);
            float *samples = malloc(sizeof(float) * L * T);
            double *fit = malloc(sizeof(double) * (size_t)o->fit_reps);
            double *cov = malloc(sizeof(double) * (size_t)o->fit_reps);
            double *eig = malloc(sizeof(double) * (size_t)o->fit_reps);
            if (src == NULL || samples == NULL || fit == NULL || cov == NULL || eig == NULL) {
                fprintf(stderr, "gvq-perf: out of memory\n");
                rc = 1;
            }
            for (size_t t = 0; rc == 0 && t < T; t++)
                gs_fill(src, 0, (long long)t, 0, L, samples + t * L);
            size_t d = 0;
            double kept = 0;
            char err[200];
            for (int rep = 0; rc == 0 && rep < o->fit_reps; rep++)
                if (cb_fit_time(L, T, samples, o->eps, L, &d, &kept, &fit[rep], &cov[rep],
                                &eig[rep], err, sizeof err) != 0) {
                    fprintf(stderr, "gvq-perf: %s\n", err);
                    rc = 1;
                }
            if (rc == 0) {
                double mn = fit[0], mxv = fit[0];
                for (int rep = 1; rep < o->fit_reps; rep++) {
                    mn = fit[rep] < mn ? fit[rep] : mn;
                    mxv = fit[rep] > mxv ? fit[rep] : mxv;
                }
                printf("%6zu%5zu%6zu%9.4f%11.2f%11.2f%11.2f%11.2f%11.2f\n", L, T, d, kept,
                       perf_median(fit, o->fit_reps) * 1e3, mn * 1e3, mxv * 1e3,
                       perf_median(cov, o->fit_reps) * 1e3, perf_median(eig, o->fit_reps) * 1e3);
                fflush(stdout);
            }
            gs_free(src);
            free(samples);
            free(fit);
            free(cov);
            free(eig);
        }
        printf("#\n");
        fflush(stdout);
    }
    sleepy_barrier();
    MPITEST(MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD));
    return rc;
}

/* ---- output -----------------------------------------------------------------------------------
 */

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

static double algbw_of(size_t bytes, double time_us) {
    return time_us > 0.0 ? (double)bytes / 1e9 / (time_us * 1e-6) : 0.0;
}

/* `extra`: the table has the ratio and rel_err columns (a compressed codec runs). */
static void print_row(const opts_t *o, size_t bytes, size_t count, codec_t codec,
                      const result_t res[2], double busfactor, int extra) {
    printf("%12zu%14zu%10s%8s%9s", bytes, count, o->dt->name, op_names[o->op], codec_names[codec]);
    for (int ip = 0; ip < 2; ip++) {
        char t[32], w[32];
        double alg = algbw_of(bytes, res[ip].time_us);
        fmt_time(t, sizeof t, res[ip].time_us);
        fmt_wrong(w, sizeof w, res[ip].wrong);
        printf("%10s%8.2f%8.2f%8s", t, alg, alg * busfactor, w);
        if (extra) {
            if (res[ip].ratio > 0)
                printf("%7.2f", res[ip].ratio);
            else
                printf("%7s", codec_is_lossy(codec) ? "n/a" : "1.00");
            if (res[ip].rel_err >= 0)
                printf("%10.2e", res[ip].rel_err);
            else
                printf("%10s", "N/A");
        }
    }
    printf("\n");
    fflush(stdout);
}

static void csv_row(FILE *f, const opts_t *o, int nranks, size_t bytes, size_t count, codec_t codec,
                    const result_t res[2], double busfactor, int extra) {
    fprintf(f, "%d,%s,%s,%s,%zu,%zu", nranks, o->dt->name, op_names[o->op], codec_names[codec],
            bytes, count);
    for (int ip = 0; ip < 2; ip++) {
        double alg = algbw_of(bytes, res[ip].time_us);
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

static void print_header(const opts_t *o, int nranks, const char *const skips[NUM_CODECS],
                         int lossy, const gs_source_t *src) {
    char list[64] = "";
    for (int k = 0; k < o->ncodecs; k++) {
        if (k) strcat(list, ",");
        strcat(list, codec_names[o->codecs[k]]);
    }
    printf("# gvq-perf: nranks %d, dtype %s, op %s, iters %d, warmup %d, codecs %s\n", nranks,
           o->dt->name, op_names[o->op], o->iters, o->warmup, list);
    printf("#  minBytes %zu maxBytes %zu step: %zu(factor) validation: %d\n", o->minbytes,
           o->maxbytes, o->factor, o->check);
    for (int c = 0; c < NUM_CODECS; c++)
        if (skips[c] != NULL) printf("# codec %s skipped: %s\n", codec_names[c], skips[c]);
    if (lossy) {
        char desc[400], s_buf[32];
        gs_describe(src, desc, sizeof desc);
        if (o->S == GVQ_CONFIG_UNDEF_INT)
            snprintf(s_buf, sizeof s_buf, "library default");
        else
            snprintf(s_buf, sizeof s_buf, "%d", o->S);
        printf("# compressed: gradiveq L=%d maxDims=%d eps=%g T=%d S=%s W=%d sample-codec %s "
               "wire %s; qsgd %d bits, bucket %d; codec chunk %zu B\n",
               o->L, o->dmax, o->eps, o->T, s_buf, o->W, o->sample_qsgd ? "qsgd" : "none",
               o->wire_fp16 ? "fp16" : "fp32", o->qbits, o->qbucket, cb_chunk_bytes());
        printf("# gradient source: %s\n", desc);
        printf("# gradiveq: ONLY calls made in the compressed phase are timed (warm-up, sampling\n"
               "#   and the fitting call run untimed, before the -w warmup calls); qsgd: every\n"
               "#   call after the warmup ones; each timed call starts after a barrier, with a\n"
               "#   fresh gradient (iteration t); time, algbw, busbw: of the uncompressed size;\n"
               "#   ratio: uncompressed / wire bytes (compressor stats); rel_err: ||y - exact|| /\n"
               "#   ||exact|| of the last timed call, exact = the sum of every rank's input in\n"
               "#   double; #wrong: none and mpi only\n");
        int rmax = grad_rank_auto(o->T, o->dmax, o->eps);
        if (o->replay == NULL && o->grad_rank > rmax)
            printf(
                "# warning: the source has %d directions per slice; a fit on T=%d samples at "
                "eps %g keeps about %d for sure: expect dropped directions, a loss far above eps "
                "and early exits (raise -T or lower --grad-rank)\n",
                o->grad_rank, o->T, o->eps, rmax);
        if (o->T - 1 < o->dmax)
            printf("# note: d <= T-1 = %d (a fit on T samples sees at most T-1 directions): the "
                   "ratio is at least %.1f\n",
                   o->T - 1, (double)o->L / (o->T - 1));
    }
}

static void print_ranks(int nranks) {
    char host[64] = "";
    int pid = (int)getpid();
    gethostname(host, sizeof host - 1);
    char *hosts = NULL;
    int *pids = NULL;
    if (g_rank == 0) {
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
    if (g_rank == 0) {
        printf("#\n# Using ranks\n");
        for (int r = 0; r < nranks; r++)
            printf("#  Rank %2d Pid %7d on %s\n", r, pids[r], hosts + (size_t)r * sizeof host);
        printf("#\n");
    }
    free(hosts);
    free(pids);
}

static void print_table_header(int extra) {
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

/* ---- main -------------------------------------------------------------------------------------
 */

static void *alloc_buffer(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) {
        fprintf(stderr, "gvq-perf: rank %d: cannot allocate %zu bytes\n", g_rank, bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(p, 0, bytes ? bytes : 64); /* touch every page before timing */
    return p;
}

/* --write-replay: rank 0 writes, everyone returns the exit status. */
static int write_replay(const opts_t *o) {
    int rc = 0;
    if (g_rank == 0) {
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

int main(int argc, char **argv) {
    int nranks = 0;
    MPITEST(MPI_Init(&argc, &argv));
    MPITEST(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
    MPITEST(MPI_Comm_size(MPI_COMM_WORLD, &nranks));
    if (perf_sparse_requested(argc, argv)) { /* -C sparse-ag|ps|dense: perf_sparse.c */
        int rc = perf_sparse_main(argc, argv);
        MPI_Finalize();
        return rc;
    }

    opts_t o;
    int prc = parse_args(argc, argv, &o, g_rank == 0);
    if (prc != 0) {
        MPI_Finalize();
        return prc == 1 ? 0 : 2;
    }
    if (o.write_replay != NULL || o.fit_bench) {
        int rc = o.write_replay != NULL ? write_replay(&o) : run_fit_bench(&o);
        MPI_Finalize();
        return rc;
    }

    /* codecs that run; mpi drops out where MPI lacks the type or op, the compressed codecs
     * where gvqAllReduceCompressed does */
    char skipbuf[NUM_CODECS][128];
    const char *skips[NUM_CODECS] = {NULL, NULL, NULL, NULL};
    codec_t run[NUM_CODECS];
    int nrun = 0, lossy = 0;
    for (int k = 0; k < o.ncodecs; k++) {
        codec_t c = o.codecs[k];
        if (c == CODEC_MPI) skips[c] = mpi_skip_reason(&o, skipbuf[c], sizeof skipbuf[c]);
        if (codec_is_lossy(c)) skips[c] = lossy_skip_reason(&o, skipbuf[c], sizeof skipbuf[c]);
        if (skips[c] != NULL) continue;
        run[nrun++] = c;
        lossy |= codec_is_lossy(c);
    }
    int have[NUM_CODECS] = {0, 0, 0, 0};
    for (int k = 0; k < nrun; k++)
        have[run[k]] = 1;
    if (o.overlap && !have[CODEC_GRADIVEQ] && g_rank == 0)
        printf("# --overlap: not measured (needs codec gradiveq to run)\n");

    /* the gradient source of the compressed codecs; every rank opens it, all must succeed */
    gs_source_t *src = NULL;
    if (lossy) {
        char err[400] = "out of memory";
        if (o.replay != NULL)
            src = gs_replay_open(o.replay, err, sizeof err);
        else
            src = gs_synthetic(o.seed, (size_t)o.L, o.grad_rank, o.noise, o.variation);
        int ok = src != NULL, all_ok = 0;
        MPITEST(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
        if (!all_ok) {
            if (!ok) fprintf(stderr, "gvq-perf: rank %d: %s\n", g_rank, err);
            gs_free(src);
            MPI_Finalize();
            return 2;
        }
    }

    /* the CSV file opens on rank 0; every rank learns whether it did */
    FILE *csv = NULL;
    int csv_ok = 1;
    if (g_rank == 0 && o.csv != NULL) {
        csv = fopen(o.csv, "w");
        if (csv == NULL) {
            fprintf(stderr, "gvq-perf: cannot open %s: %s\n", o.csv, strerror(errno));
            csv_ok = 0;
        } else {
            fprintf(csv,
                    "nranks,dtype,op,codec,size_bytes,count,oop_time_us,oop_algbw_gbs,"
                    "oop_busbw_gbs,oop_wrong,ip_time_us,ip_algbw_gbs,ip_busbw_gbs,ip_wrong%s\n",
                    lossy ? ",oop_ratio,oop_rel_err,ip_ratio,ip_rel_err" : "");
        }
    }
    MPITEST(MPI_Bcast(&csv_ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (!csv_ok) {
        gs_free(src);
        MPI_Finalize();
        return 2;
    }

    /* the communicator, the NCCL way: rank 0 makes the id, MPI carries it to everyone */
    gvqUniqueId id;
    memset(&id, 0, sizeof id);
    if (g_rank == 0) GVQTEST(gvqGetUniqueId(&id));
    MPITEST(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    GVQTEST(gvqCommInitRank(&g_comm, nranks, id, g_rank));
    int ccount = 0, crank = -1;
    GVQTEST(gvqCommCount(g_comm, &ccount));
    GVQTEST(gvqCommUserRank(g_comm, &crank));
    if (ccount != nranks || crank != g_rank) {
        fprintf(stderr, "gvq-perf: rank %d: communicator says rank %d of %d, MPI says %d of %d\n",
                g_rank, crank, ccount, g_rank, nranks);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    if (g_rank == 0) print_header(&o, nranks, skips, lossy, src);
    print_ranks(nranks);
    if (g_rank == 0 && o.check && o.dt->is_float && o.op != gvqProd && o.op != gvqMax &&
        o.op != gvqMin && (have[CODEC_NONE] || have[CODEC_MPI])) {
        /* integers up to 5*nranks must be exact in the type */
        int limit = o.dt->type == gvqBfloat16 ? 256 : o.dt->type == gvqFloat16 ? 2048 : 1 << 24;
        if (5 * nranks > limit)
            printf("# warning: %d ranks: sums may not be exact in %s; #wrong may be spurious\n",
                   nranks, o.dt->name);
    }

    /* the sizes: min, min*f, ... <= max (at most 65 with f >= 2) */
    size_t sizes[72], nsizes = 0;
    for (size_t s = o.minbytes;; s *= o.factor) {
        sizes[nsizes++] = s;
        if (s == 0 || s > o.maxbytes / o.factor) break;
    }
    result_t *results = malloc(nsizes * NUM_CODECS * 2 * sizeof *results);
    char(*details)[640] = calloc(nsizes * NUM_CODECS, sizeof *details);
    overlap_t *ovs = calloc(nsizes, sizeof *ovs);
    if (results == NULL || details == NULL || ovs == NULL) {
        fprintf(stderr, "gvq-perf: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t k = 0; k < nsizes * NUM_CODECS * 2; k++)
        results[k] = result_none;
    int novs = 0;

    void *sendbuf = alloc_buffer(o.maxbytes), *recvbuf = alloc_buffer(o.maxbytes);
    check_t chk = {o.dt, o.op, nranks};
    double busfactor = nranks > 1 ? 2.0 * (nranks - 1) / nranks : 0.0;
    codec_stats_t stats[NUM_CODECS];
    memset(stats, 0, sizeof stats);
    int64_t total_wrong = 0;
    int untimed_cases = 0;

    if (g_rank == 0) print_table_header(lossy);
    for (size_t z = 0; z < nsizes; z++) {
        size_t count = sizes[z] / o.dt->size, bytes = count * o.dt->size;
        int gq_dims = 0; /* d of this size's GradiVeQ compressor, for --overlap */
        for (int k = 0; k < nrun; k++) {
            result_t *res = &results[(z * NUM_CODECS + run[k]) * 2];
            if (codec_is_lossy(run[k]) && count == 0) {
                snprintf(details[z * NUM_CODECS + run[k]], sizeof details[0],
                         "# %-8s %12zu B: not run (a compressor needs count >= 1)",
                         codec_names[run[k]], bytes);
            } else if (codec_is_lossy(run[k])) {
                lossy_ctx_t lc;
                memset(&lc, 0, sizeof lc);
                lc.comp = make_compressor(&o, run[k], count);
                lc.src = src;
                char state[1024] = "";
                if (o.state_dir != NULL && run[k] == CODEC_GRADIVEQ) {
                    state_path(state, sizeof state, &o, src, count, nranks);
                    lc.loaded = state_load(&o, run[k], &lc.comp, count, state);
                }
                for (int ip = 0; ip < 2; ip++)
                    res[ip] = run_lossy_case(&o, run[k], &lc, sendbuf, recvbuf, count, ip, nranks);
                if (state[0]) state_save(lc.comp, state);
                lossy_details(details[z * NUM_CODECS + run[k]], sizeof details[0], run[k], bytes,
                              &lc);
                if (run[k] == CODEC_GRADIVEQ) {
                    gvqCompressorStats_t st;
                    GVQTEST(gvqCompressorGetStats(lc.comp, &st));
                    gq_dims = st.phase == gvqPhasePlain ? 0 : st.dims;
                }
                GVQTEST(gvqCompressorDestroy(lc.comp));
            } else {
                for (int ip = 0; ip < 2; ip++)
                    res[ip] = run_case(&o, run[k], sendbuf, recvbuf, count, ip, &chk);
            }
            for (int ip = 0; ip < 2; ip++) {
                if (res[ip].wrong > 0) total_wrong += res[ip].wrong;
                if (res[ip].time_us < 0) {
                    untimed_cases += codec_is_lossy(run[k]) && count > 0;
                    continue;
                }
                stats[run[k]].busbw_sum += algbw_of(bytes, res[ip].time_us) * busfactor;
                stats[run[k]].busbw_n++;
            }
            if (g_rank == 0) {
                print_row(&o, bytes, count, run[k], res, busfactor, lossy);
                if (csv != NULL)
                    csv_row(csv, &o, nranks, bytes, count, run[k], res, busfactor, lossy);
            }
        }
        const result_t *rg = &results[(z * NUM_CODECS + CODEC_GRADIVEQ) * 2];
        if (o.overlap && have[CODEC_GRADIVEQ] && rg[0].time_us > 0 && gq_dims > 0)
            measure_overlap(&o, src, count, rg[0].ratio, gq_dims, rg[0].time_us, sendbuf, recvbuf,
                            nranks, &ovs[novs++]);
    }

    if (g_rank == 0) {
        printf("# Out of bounds values : %lld %s\n", (long long)total_wrong,
               !o.check      ? "(not checked)"
               : total_wrong ? "FAILED"
                             : "OK");
        for (int k = 0; k < nrun; k++)
            printf("# Avg bus bandwidth    : %.3f  (codec %s%s)\n",
                   stats[run[k]].busbw_n ? stats[run[k]].busbw_sum / stats[run[k]].busbw_n : 0.0,
                   codec_names[run[k]], codec_is_lossy(run[k]) ? ", of the uncompressed size" : "");
        printf("#\n");
        if (lossy) {
            printf("# compressor details (per size, after the in-place case)\n");
            for (size_t z = 0; z < nsizes; z++)
                for (int c = 0; c < NUM_CODECS; c++)
                    if (details[z * NUM_CODECS + c][0]) printf("%s\n", details[z * NUM_CODECS + c]);
            if (untimed_cases)
                printf("# %d compressed case(s) NOT TIMED (see above)\n", untimed_cases);
            printf("#\n");
        }
        if (!have[CODEC_NONE] || !have[CODEC_MPI]) {
            printf("# ratio none/mpi: not printed (needs both codecs none and mpi to run)\n");
        } else {
            /* busbw(none) / busbw(mpi) = time(mpi) / time(none); the time form holds at 1 rank */
            double logsum[3] = {0, 0, 0};
            int nlog[3] = {0, 0, 0};
            printf("# ratio none/mpi: busbw of gvq's ring over busbw of MPI_Allreduce "
                   "(= time mpi / time none; > 1: gvq faster)\n");
            printf("#%11s%14s%14s%14s\n", "size", "count", "out-of-place", "in-place");
            printf("#%11s%14s%14s%14s\n", "(B)", "(elements)", "", "");
            for (size_t z = 0; z < nsizes; z++) {
                size_t count = sizes[z] / o.dt->size, bytes = count * o.dt->size;
                const result_t *rn = &results[(z * NUM_CODECS + CODEC_NONE) * 2];
                const result_t *rm = &results[(z * NUM_CODECS + CODEC_MPI) * 2];
                printf("%12zu%14zu", bytes, count);
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
            printf("# Geometric mean ratio : out-of-place %.3f  in-place %.3f  both %.3f\n",
                   nlog[0] ? exp(logsum[0] / nlog[0]) : 0.0,
                   nlog[1] ? exp(logsum[1] / nlog[1]) : 0.0,
                   nlog[2] ? exp(logsum[2] / nlog[2]) : 0.0);
        }
        printf("#\n");
        int npairs = (have[CODEC_NONE] && have[CODEC_GRADIVEQ]) +
                     (have[CODEC_NONE] && have[CODEC_QSGD]) +
                     (have[CODEC_QSGD] && have[CODEC_GRADIVEQ]);
        if (lossy && npairs == 0) {
            printf("# ratio compressed: not printed (needs two of none, gradiveq, qsgd)\n#\n");
        } else if (lossy) {
            static const codec_t pa[3] = {CODEC_NONE, CODEC_NONE, CODEC_QSGD};
            static const codec_t pb[3] = {CODEC_GRADIVEQ, CODEC_QSGD, CODEC_GRADIVEQ};
            double logsum[3][2] = {{0, 0}, {0, 0}, {0, 0}};
            int nlog[3][2] = {{0, 0}, {0, 0}, {0, 0}};
            printf("# ratio compressed: time(a) / time(b) (> 1: b faster), out-of-place and "
                   "in-place\n");
            printf("#%11s%14s%20s%20s%20s\n", "size", "count", "none/gradiveq", "none/qsgd",
                   "qsgd/gradiveq");
            printf("#%11s%14s%10s%10s%10s%10s%10s%10s\n", "(B)", "(elements)", "oop", "ip", "oop",
                   "ip", "oop", "ip");
            for (size_t z = 0; z < nsizes; z++) {
                size_t count = sizes[z] / o.dt->size, bytes = count * o.dt->size;
                printf("%12zu%14zu", bytes, count);
                for (int p = 0; p < 3; p++)
                    print_time_ratio(&results[(z * NUM_CODECS + pa[p]) * 2],
                                     &results[(z * NUM_CODECS + pb[p]) * 2], logsum[p], nlog[p]);
                printf("\n");
            }
            printf("# Geometric mean      %14s", "");
            for (int p = 0; p < 3; p++)
                for (int ip = 0; ip < 2; ip++) {
                    if (nlog[p][ip])
                        printf("%10.3f", exp(logsum[p][ip] / nlog[p][ip]));
                    else
                        printf("%10s", "n/a");
                }
            printf("\n#\n");
        }
        if (novs > 0) print_overlap(ovs, novs);
        fflush(stdout);
        if (csv != NULL) fclose(csv);
    }

    free(sendbuf);
    free(recvbuf);
    free(results);
    free(details);
    free(ovs);
    gs_free(src);
    GVQTEST(gvqCommDestroy(g_comm));
    g_comm = NULL;
    MPI_Finalize();
    return total_wrong > 0 ? 1 : untimed_cases > 0 ? 3 : 0;
}
