/*
 * test_collectives.c -- every gvq collective against an independent reference, on 1..5 ranks.
 *
 * References: MPI's own MPI_Allreduce / MPI_Reduce / MPI_Reduce_scatter_block / MPI_Allgather
 * for the types MPI has; for half and bfloat16 (and for the tolerance scale of the floating
 * types) a double-precision reduction of every rank's input, regenerated here: the input of
 * element i on rank r is a pure function of (seed, dtype, op, r, i). Nothing is compared with
 * gvq's own output, except that all ranks' outputs must be bitwise identical.
 *
 * Inputs are chosen so MPI and gvq must agree exactly on the integer types: unsigned sums and
 * products wrap (mod 2^bits, order-free), signed sums and products stay in range, averages are
 * the exact sum divided with C's truncation. Floating sums and products get a relative
 * tolerance against sum(|x|) (resp. |product|); max and min must match exactly.
 *
 * Communicators: the NCCL bootstrap (gvqGetUniqueId on rank 0, MPI_Bcast of the id,
 * gvqCommInitRank) runs the full suite; gvqCommInitMPI(MPI_COMM_WORLD) runs a subset, once with
 * defaults and once with a 256-byte pipeline chunk; so do a communicator whose ranks are the
 * reverse of the MPI ranks (the data must follow gvq's ranks) and one over MPI ranks 1..n-1
 * only, bootstrapped by MPI rank 1. Each is checked against MPI over an MPI communicator of the
 * same processes in gvq's rank order. Then two threads drive two communicators at once, and one
 * group spans two communicators.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gvq.h"
#include "gvq_mpi.h"
#include "mpitest.h"

#define SMALL_PRIME 7919
#define LARGE_COUNT ((size_t)1048576 + 3)
#define MAX_REPORTS 3 /* mismatching elements printed per check */

static const char *dt_name[gvqNumTypes] = {"int8",   "uint8", "int32",   "uint32",  "int64",
                                           "uint64", "half",  "float32", "float64", "bfloat16"};
static const char *op_name[gvqNumOps] = {"sum", "prod", "max", "min", "avg"};

/* ---- element types ------------------------------------------------------------------------ */

static size_t dt_size(gvqDataType_t dt) {
    switch (dt) {
    case gvqInt8:
    case gvqUint8:
        return 1;
    case gvqFloat16:
    case gvqBfloat16:
        return 2;
    case gvqInt32:
    case gvqUint32:
    case gvqFloat32:
        return 4;
    default:
        return 8;
    }
}

static int dt_is_float(gvqDataType_t dt) {
    return dt == gvqFloat16 || dt == gvqFloat32 || dt == gvqFloat64 || dt == gvqBfloat16;
}

static int dt_is_signed(gvqDataType_t dt) {
    return dt == gvqInt8 || dt == gvqInt32 || dt == gvqInt64;
}

/* The MPI type of dt, or MPI_DATATYPE_NULL (half, bfloat16). */
static MPI_Datatype dt_mpi(gvqDataType_t dt) {
    switch (dt) {
    case gvqInt8:
        return MPI_INT8_T;
    case gvqUint8:
        return MPI_UINT8_T;
    case gvqInt32:
        return MPI_INT32_T;
    case gvqUint32:
        return MPI_UINT32_T;
    case gvqInt64:
        return MPI_INT64_T;
    case gvqUint64:
        return MPI_UINT64_T;
    case gvqFloat32:
        return MPI_FLOAT;
    case gvqFloat64:
        return MPI_DOUBLE;
    default:
        return MPI_DATATYPE_NULL;
    }
}

/* gvqAvg is checked as MPI_SUM followed by the division done here. */
static MPI_Op op_mpi(gvqRedOp_t op) {
    switch (op) {
    case gvqProd:
        return MPI_PROD;
    case gvqMax:
        return MPI_MAX;
    case gvqMin:
        return MPI_MIN;
    default:
        return MPI_SUM;
    }
}

static double rtol(gvqDataType_t dt) {
    switch (dt) {
    case gvqFloat16:
        return 1e-2;
    case gvqBfloat16:
        return 2e-2;
    case gvqFloat32:
        return 1e-5;
    default:
        return 1e-12;
    }
}

/* IEEE binary16 and bfloat16, written here independently of the library. The encoders take
 * only values that are exactly representable (the generator makes no others). */
static uint16_t half_from_exact(double v) {
    uint16_t s = signbit(v) ? 0x8000u : 0u;
    v = fabs(v);
    if (v == 0.0) return s;
    int e = 0;
    double m = frexp(v, &e); /* v = m * 2^e, m in [0.5, 1) */
    int E = e + 14;          /* v = (1 + f/1024) * 2^(E-15) */
    double f = (2.0 * m - 1.0) * 1024.0;
    if (E < 1 || E > 30 || f != floor(f)) abort(); /* not exact: a bug in this test */
    return (uint16_t)(s | (unsigned)E << 10 | (unsigned)f);
}

static double half_to_double(uint16_t h) {
    double s = (h & 0x8000u) ? -1.0 : 1.0;
    int E = (h >> 10) & 31, f = h & 1023;
    if (E == 0) return s * ldexp((double)f, -24);
    if (E == 31) return f ? NAN : s * INFINITY;
    return s * ldexp((double)(1024 + f), E - 25);
}

static uint16_t bf16_from_exact(double v) {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((double)f != v || (u & 0xffffu) != 0) abort(); /* not exact: a bug in this test */
    return (uint16_t)(u >> 16);
}

static double bf16_to_double(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return (double)f;
}

/* Unaligned-safe loads of one element. */
#define DEFINE_LOAD(name, T)       \
    static T name(const char *p) { \
        T v;                       \
        memcpy(&v, p, sizeof v);   \
        return v;                  \
    }
DEFINE_LOAD(ld_i8, int8_t)
DEFINE_LOAD(ld_u8, uint8_t)
DEFINE_LOAD(ld_i32, int32_t)
DEFINE_LOAD(ld_u32, uint32_t)
DEFINE_LOAD(ld_i64, int64_t)
DEFINE_LOAD(ld_u64, uint64_t)
DEFINE_LOAD(ld_u16, uint16_t)
DEFINE_LOAD(ld_f32, float)
DEFINE_LOAD(ld_f64, double)

/* Element j of buf as a double (exact for all but 64-bit integers beyond 2^53). */
static double elem_double(gvqDataType_t dt, const void *buf, size_t j) {
    const char *p = (const char *)buf + j * dt_size(dt);
    switch (dt) {
    case gvqInt8:
        return ld_i8(p);
    case gvqUint8:
        return ld_u8(p);
    case gvqInt32:
        return ld_i32(p);
    case gvqUint32:
        return ld_u32(p);
    case gvqInt64:
        return (double)ld_i64(p);
    case gvqUint64:
        return (double)ld_u64(p);
    case gvqFloat16:
        return half_to_double(ld_u16(p));
    case gvqBfloat16:
        return bf16_to_double(ld_u16(p));
    case gvqFloat32:
        return ld_f32(p);
    default:
        return ld_f64(p);
    }
}

/* Integer element j widened: signed types to int64 (in *s), unsigned to uint64 (in *u). */
static void elem_int(gvqDataType_t dt, const void *buf, size_t j, int64_t *s, uint64_t *u) {
    const char *p = (const char *)buf + j * dt_size(dt);
    *s = dt == gvqInt8 ? ld_i8(p) : dt == gvqInt32 ? ld_i32(p) : dt == gvqInt64 ? ld_i64(p) : 0;
    *u = dt == gvqUint8 ? ld_u8(p) : dt == gvqUint32 ? ld_u32(p) : dt == gvqUint64 ? ld_u64(p) : 0;
}

static void elem_str(gvqDataType_t dt, const void *buf, size_t j, char *out, size_t len) {
    if (dt_is_float(dt)) {
        snprintf(out, len, "%.17g", elem_double(dt, buf, j));
        return;
    }
    int64_t s;
    uint64_t u;
    elem_int(dt, buf, j, &s, &u);
    if (dt_is_signed(dt))
        snprintf(out, len, "%" PRId64, s);
    else
        snprintf(out, len, "%" PRIu64, u);
}

/* ---- inputs: a pure function of (seed, dtype, op, rank, index) ------------------------------ */

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t rnd(uint64_t seed, int rank, size_t i) {
    return mix64(seed ^ mix64(((uint64_t)(unsigned)rank << 40) ^ (uint64_t)i));
}

static double unit(uint64_t h) {
    return (double)(h >> 11) * 0x1p-53;
}

/* Floating inputs for float32/float64: products near 1, otherwise mixed signs and scales. */
static double gen_fp(gvqRedOp_t op, uint64_t h) {
    if (op == gvqProd) return ((h & 1) ? -1.0 : 1.0) * (0.5 + 1.5 * unit(h));
    return (2.0 * unit(h) - 1.0) * ldexp(1.0, (int)((h >> 1) % 9) - 4);
}

/* half/bfloat16 inputs, exactly representable: k/64 (|k| < 2048 resp. 256), or for products
 * +-k/4 with k in [2, 8]. */
static double gen_small(gvqDataType_t dt, gvqRedOp_t op, uint64_t h) {
    if (op == gvqProd) return ((h & 1) ? -1.0 : 1.0) * (double)(2 + (h >> 1) % 7) / 4.0;
    int64_t k = dt == gvqFloat16 ? (int64_t)(h % 4095) - 2047 : (int64_t)(h % 511) - 255;
    return (double)k / 64.0;
}

static void gen_elem(gvqDataType_t dt, gvqRedOp_t op, uint64_t seed, int rank, size_t i,
                     void *dst) {
    uint64_t h = rnd(seed ^ ((uint64_t)dt << 56) ^ ((uint64_t)op << 52), rank, i);
    int additive = op == gvqSum || op == gvqAvg;
    switch (dt) {
    case gvqInt8: {
        static const int8_t p[3] = {-1, 1, 2};
        int8_t v = additive        ? (int8_t)((int)(h % 25) - 12)
                   : op == gvqProd ? p[h % 3]
                                   : (int8_t)(uint8_t)h;
        memcpy(dst, &v, 1);
        break;
    }
    case gvqUint8: {
        uint8_t v = op == gvqAvg ? (uint8_t)(h % 51) : (uint8_t)h;
        memcpy(dst, &v, 1);
        break;
    }
    case gvqInt32: {
        int32_t v = additive        ? (int32_t)((int64_t)(h % 2000001) - 1000000)
                    : op == gvqProd ? (int32_t)(1 + (h >> 1) % 9) * ((h & 1) ? -1 : 1)
                                    : (int32_t)(uint32_t)h;
        memcpy(dst, &v, 4);
        break;
    }
    case gvqUint32: {
        uint32_t v = op == gvqAvg ? (uint32_t)(h % 858993459u) : (uint32_t)h;
        memcpy(dst, &v, 4);
        break;
    }
    case gvqInt64: {
        int64_t v = additive        ? (int64_t)(h % (1ull << 60)) - (int64_t)(1ull << 59)
                    : op == gvqProd ? (int64_t)(1 + (h >> 1) % 5000) * ((h & 1) ? -1 : 1)
                                    : (int64_t)h;
        memcpy(dst, &v, 8);
        break;
    }
    case gvqUint64: {
        uint64_t v = op == gvqAvg ? h % (UINT64_MAX / 5) : h;
        memcpy(dst, &v, 8);
        break;
    }
    case gvqFloat16: {
        uint16_t v = half_from_exact(gen_small(dt, op, h));
        memcpy(dst, &v, 2);
        break;
    }
    case gvqBfloat16: {
        uint16_t v = bf16_from_exact(gen_small(dt, op, h));
        memcpy(dst, &v, 2);
        break;
    }
    case gvqFloat32: {
        float v = (float)gen_fp(op, h);
        memcpy(dst, &v, 4);
        break;
    }
    default: {
        double v = gen_fp(op, h);
        memcpy(dst, &v, 8);
        break;
    }
    }
}

static void fill(void *buf, gvqDataType_t dt, gvqRedOp_t op, uint64_t seed, int rank, size_t idx0,
                 size_t n) {
    size_t es = dt_size(dt);
    for (size_t j = 0; j < n; j++)
        gen_elem(dt, op, seed, rank, idx0 + j, (char *)buf + j * es);
}

static double gen_double(gvqDataType_t dt, gvqRedOp_t op, uint64_t seed, int rank, size_t i) {
    char v[8];
    gen_elem(dt, op, seed, rank, i, v);
    return elem_double(dt, v, 0);
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return p;
}

static uint64_t fnv1a(const void *buf, size_t len) {
    const unsigned char *p = buf;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Every rank of `mc` (the processes of the gvq communicator) must hold the same bytes:
 * compare the ranks' hashes, gathered with MPI_Allgather. Collective over mc. */
static void check_identical(MPI_Comm mc, const char *what, const void *buf, size_t len) {
    int n = 0;
    MPI_Comm_size(mc, &n);
    uint64_t h = fnv1a(buf, len);
    uint64_t *all = xmalloc((size_t)n * sizeof *all);
    MPI_Allgather(&h, 8, MPI_BYTE, all, 8, MPI_BYTE, mc);
    int differ = -1;
    for (int r = 0; r < n && differ < 0; r++)
        if (all[r] != all[0]) differ = r;
    MT_CHECK(differ < 0,
             "%s: output differs between ranks (first rank's hash %016" PRIx64
             ", rank %d's %016" PRIx64 ")",
             what, all[0], differ, differ < 0 ? 0 : all[differ]);
    free(all);
}

/* ---- MPI references ------------------------------------------------------------------------ */

typedef enum { REF_ALLREDUCE, REF_REDUCE, REF_REDUCE_SCATTER } ref_kind_t;

/* MPI's reduction of `in` (nin elements) into ref (nout elements: the result, root's result,
 * or this rank's block). 8-bit integers go to MPI widened to 32 bits and come back narrowed:
 * Open MPI 4.1's AVX op component saturates 8-bit MPI_SUM on vectors of 16+ elements where C
 * (and gvq, and NCCL) wrap (open-mpi/ompi#8045); modulo 2^8 the wide sums and products are
 * the wrapped ones, and the signed 8-bit inputs never overflow. */
static void mpi_reference(MPI_Comm mc, ref_kind_t kind, const void *in, void *ref, size_t nin,
                          size_t nout, gvqDataType_t dt, gvqRedOp_t op, int root) {
    MPI_Datatype t = dt_mpi(dt);
    const void *src = in;
    void *dst = ref;
    uint32_t *win = NULL, *wout = NULL;
    if (dt == gvqInt8 || dt == gvqUint8) {
        win = xmalloc(nin * 4);
        wout = calloc(nout ? nout : 1, 4);
        for (size_t i = 0; i < nin; i++) {
            if (dt == gvqInt8) {
                int32_t v = ((const int8_t *)in)[i];
                memcpy(&win[i], &v, 4);
            } else {
                win[i] = ((const uint8_t *)in)[i];
            }
        }
        t = dt == gvqInt8 ? MPI_INT32_T : MPI_UINT32_T;
        src = win;
        dst = wout;
    }
    switch (kind) {
    case REF_ALLREDUCE:
        MPI_Allreduce(src, dst, (int)nout, t, op_mpi(op), mc);
        break;
    case REF_REDUCE:
        MPI_Reduce(src, dst, (int)nout, t, op_mpi(op), root, mc);
        break;
    default:
        MPI_Reduce_scatter_block(src, dst, (int)nout, t, op_mpi(op), mc);
        break;
    }
    if (win != NULL) {
        for (size_t i = 0; i < nout; i++)
            ((uint8_t *)ref)[i] = (uint8_t)wout[i]; /* mod 2^8 */
        free(win);
        free(wout);
    }
}

/* ---- the reduction check ------------------------------------------------------------------ */

/* Is got the reduction with op over ranks 0..nranks-1 of input element gi? mpiref points at
 * MPI's reduction of the same inputs (MPI_SUM for gvqAvg), or is NULL for the types MPI lacks,
 * whose reference is then computed here in double precision. On a mismatch msg says why. */
static int elem_ok(gvqDataType_t dt, gvqRedOp_t op, uint64_t seed, int nranks, size_t gi,
                   const char *got, const char *mpiref, char *msg, size_t len) {
    size_t es = dt_size(dt);
    if (!dt_is_float(dt)) {
        char want[8];
        memcpy(want, mpiref, es);
        if (op == gvqAvg) { /* C truncation of the exact sum */
            int64_t s;
            uint64_t u;
            elem_int(dt, want, 0, &s, &u);
            s /= nranks;
            u /= (uint64_t)nranks;
            int8_t s8 = (int8_t)s;
            int32_t s32 = (int32_t)s;
            uint8_t u8 = (uint8_t)u;
            uint32_t u32 = (uint32_t)u;
            switch (dt) {
            case gvqInt8:
                memcpy(want, &s8, 1);
                break;
            case gvqInt32:
                memcpy(want, &s32, 4);
                break;
            case gvqInt64:
                memcpy(want, &s, 8);
                break;
            case gvqUint8:
                memcpy(want, &u8, 1);
                break;
            case gvqUint32:
                memcpy(want, &u32, 4);
                break;
            default:
                memcpy(want, &u, 8);
                break;
            }
        }
        if (memcmp(want, got, es) == 0) return 1;
        char ws[32], gs[32];
        elem_str(dt, want, 0, ws, sizeof ws);
        elem_str(dt, got, 0, gs, sizeof gs);
        snprintf(msg, len, "expected %s (exact), got %s", ws, gs);
        return 0;
    }
    double g = elem_double(dt, got, 0), ref, absum = 0.0, scale;
    double acc = op == gvqProd ? 1.0 : op == gvqMax ? -INFINITY : op == gvqMin ? INFINITY : 0.0;
    for (int r = 0; r < nranks; r++) {
        double x = gen_double(dt, op, seed, r, gi);
        absum += fabs(x);
        if (op == gvqProd)
            acc *= x;
        else if (op == gvqMax)
            acc = x > acc ? x : acc;
        else if (op == gvqMin)
            acc = x < acc ? x : acc;
        else
            acc += x;
    }
    ref = mpiref != NULL ? elem_double(dt, mpiref, 0) : acc; /* MPI's, where it has one */
    if (op == gvqAvg) ref /= nranks;
    if (op == gvqMax || op == gvqMin) {
        if (g == ref) return 1;
        snprintf(msg, len, "expected %.17g (exact), got %.17g", ref, g);
        return 0;
    }
    scale = op == gvqSum ? absum : op == gvqAvg ? absum / nranks : fabs(ref);
    double tol = rtol(dt) * scale;
    if (fabs(g - ref) <= tol) return 1; /* false for NaN */
    snprintf(msg, len, "expected %.17g (tolerance %.3g), got %.17g", ref, tol, g);
    return 0;
}

/* got[0..n) must hold the reduced elements idx0..idx0+n of the inputs (see elem_ok). */
static void check_reduced(const char *what, gvqDataType_t dt, gvqRedOp_t op, uint64_t seed,
                          int nranks, size_t idx0, size_t n, const void *got, const void *mpiref) {
    size_t es = dt_size(dt);
    long bad = 0;
    mt.checks++;
    for (size_t j = 0; j < n; j++) {
        char msg[256];
        const char *ref = mpiref != NULL ? (const char *)mpiref + j * es : NULL;
        if (elem_ok(dt, op, seed, nranks, idx0 + j, (const char *)got + j * es, ref, msg,
                    sizeof msg))
            continue;
        if (bad < MAX_REPORTS) MT_REPORT("%s: element %zu: %s", what, idx0 + j, msg);
        bad++;
    }
    if (bad > 0) {
        mt.failures++;
        if (bad > MAX_REPORTS) MT_REPORT("%s: %ld of %zu elements wrong", what, bad, n);
    }
}

/* got must equal want byte for byte; report the first differing element. */
static void check_bytes(const char *what, gvqDataType_t dt, const void *want, const void *got,
                        size_t count) {
    size_t es = dt_size(dt);
    mt.checks++;
    if (count == 0 || memcmp(want, got, count * es) == 0) return;
    size_t j = 0, bad = 0;
    for (size_t k = 0; k < count; k++) {
        if (memcmp((const char *)want + k * es, (const char *)got + k * es, es) != 0) {
            if (bad == 0) j = k;
            bad++;
        }
    }
    char ws[32], gs[32];
    elem_str(dt, want, j, ws, sizeof ws);
    elem_str(dt, got, j, gs, sizeof gs);
    MT_FAIL("%s: element %zu: expected %s, got %s (%zu of %zu elements wrong)", what, j, ws, gs,
            bad, count);
}

/* ---- one collective at a time --------------------------------------------------------------- */

typedef struct {
    gvqComm_t comm;
    const char *name; /* label in failure lines */
    int rank, nranks; /* gvq rank and size */
    MPI_Comm mpi;     /* MPI communicator of the same processes in the same rank order: MPI's
                         collectives over it are the references */
} ctx_t;

static uint64_t seed_of(int kind, gvqDataType_t dt, gvqRedOp_t op, size_t count, int variant) {
    return mix64(((uint64_t)kind << 48) ^ ((uint64_t)dt << 40) ^ ((uint64_t)op << 36) ^
                 ((uint64_t)variant << 32) ^ (uint64_t)count);
}

/* res must be gvqSuccess; report it otherwise. Returns whether it was. */
static int result_ok_at(int line, gvqResult_t res, const char *what) {
    mt.checks++;
    if (res == gvqSuccess) return 1;
    mt_report_at(__FILE__, line, "%s: returned %d (%s); gvqGetLastError: \"%s\"", what, (int)res,
                 gvqGetErrorString(res), gvqGetLastError(NULL));
    mt.failures++;
    return 0;
}

#define RESULT_OK(res, what) result_ok_at(__LINE__, (res), (what))

static void run_allreduce(const ctx_t *c, gvqDataType_t dt, gvqRedOp_t op, size_t count,
                          int inplace) {
    char what[160];
    snprintf(what, sizeof what, "%s: gvqAllReduce %s dtype %s op %s count %zu nranks %d", c->name,
             inplace ? "in-place" : "out-of-place", dt_name[dt], op_name[op], count, c->nranks);
    uint64_t seed = seed_of(1, dt, op, count, inplace);
    size_t bytes = count * dt_size(dt);
    char *in = xmalloc(bytes), *out = xmalloc(bytes), *keep = xmalloc(bytes), *ref = NULL;
    fill(in, dt, op, seed, c->rank, 0, count);
    memcpy(keep, in, bytes);
    if (dt_mpi(dt) != MPI_DATATYPE_NULL) {
        ref = xmalloc(bytes);
        mpi_reference(c->mpi, REF_ALLREDUCE, in, ref, count, count, dt, op, 0);
    }
    gvqResult_t res;
    if (inplace) {
        memcpy(out, in, bytes);
        res = gvqAllReduce(out, out, count, dt, op, c->comm, NULL);
    } else {
        memset(out, 0xa5, bytes);
        res = gvqAllReduce(in, out, count, dt, op, c->comm, NULL);
    }
    if (RESULT_OK(res, what)) check_reduced(what, dt, op, seed, c->nranks, 0, count, out, ref);
    if (!inplace) MT_CHECK(memcmp(in, keep, bytes) == 0, "%s: sendbuff was modified", what);
    check_identical(c->mpi, what, out, bytes);
    free(in);
    free(out);
    free(keep);
    free(ref);
}

static void run_reduce_scatter(const ctx_t *c, gvqDataType_t dt, gvqRedOp_t op, size_t rc,
                               int inplace) {
    char what[160];
    snprintf(what, sizeof what, "%s: gvqReduceScatter %s dtype %s op %s recvcount %zu nranks %d",
             c->name, inplace ? "in-place" : "out-of-place", dt_name[dt], op_name[op], rc,
             c->nranks);
    uint64_t seed = seed_of(2, dt, op, rc, inplace);
    size_t es = dt_size(dt), total = rc * (size_t)c->nranks;
    char *in = xmalloc(total * es), *buf = xmalloc(total * es), *ref = NULL;
    fill(in, dt, op, seed, c->rank, 0, total);
    if (dt_mpi(dt) != MPI_DATATYPE_NULL) {
        ref = xmalloc(rc * es);
        mpi_reference(c->mpi, REF_REDUCE_SCATTER, in, ref, total, rc, dt, op, 0);
    }
    gvqResult_t res;
    char *out;
    if (inplace) {
        memcpy(buf, in, total * es);
        out = buf + (size_t)c->rank * rc * es;
        res = gvqReduceScatter(buf, out, rc, dt, op, c->comm, NULL);
    } else {
        memcpy(buf, in, total * es);
        out = xmalloc(rc * es);
        memset(out, 0xa5, rc * es);
        res = gvqReduceScatter(buf, out, rc, dt, op, c->comm, NULL);
    }
    if (RESULT_OK(res, what))
        check_reduced(what, dt, op, seed, c->nranks, (size_t)c->rank * rc, rc, out, ref);
    if (!inplace) {
        MT_CHECK(memcmp(in, buf, total * es) == 0, "%s: sendbuff was modified", what);
        free(out);
    }
    free(in);
    free(buf);
    free(ref);
}

static void run_allgather(const ctx_t *c, gvqDataType_t dt, size_t sc, int inplace) {
    char what[160];
    snprintf(what, sizeof what, "%s: gvqAllGather %s dtype %s sendcount %zu nranks %d", c->name,
             inplace ? "in-place" : "out-of-place", dt_name[dt], sc, c->nranks);
    uint64_t seed = seed_of(3, dt, gvqSum, sc, inplace);
    size_t es = dt_size(dt), n = (size_t)c->nranks, blk = sc * es;
    char *in = xmalloc(blk), *keep = xmalloc(blk), *out = xmalloc(n * blk),
         *want = xmalloc(n * blk);
    fill(in, dt, gvqSum, seed, c->rank, 0, sc);
    memcpy(keep, in, blk);
    MPI_Allgather(in, (int)blk, MPI_BYTE, want, (int)blk, MPI_BYTE, c->mpi);
    memset(out, 0xa5, n * blk);
    gvqResult_t res;
    if (inplace) {
        memcpy(out + (size_t)c->rank * blk, in, blk);
        res = gvqAllGather(out + (size_t)c->rank * blk, out, sc, dt, c->comm, NULL);
    } else {
        res = gvqAllGather(in, out, sc, dt, c->comm, NULL);
    }
    if (RESULT_OK(res, what)) check_bytes(what, dt, want, out, n * sc);
    if (!inplace) MT_CHECK(memcmp(in, keep, blk) == 0, "%s: sendbuff was modified", what);
    check_identical(c->mpi, what, out, n * blk);
    free(in);
    free(keep);
    free(out);
    free(want);
}

/* legacy: gvqBcast (in place by definition). Out of place, non-roots pass sendbuff NULL when
 * root is odd and a junk buffer (which must stay untouched) when it is even. */
static void run_broadcast(const ctx_t *c, gvqDataType_t dt, size_t count, int root, int inplace,
                          int legacy) {
    char what[160];
    snprintf(what, sizeof what, "%s: %s %s dtype %s count %zu root %d nranks %d", c->name,
             legacy ? "gvqBcast" : "gvqBroadcast", inplace ? "in-place" : "out-of-place",
             dt_name[dt], count, root, c->nranks);
    uint64_t seed = seed_of(4, dt, gvqSum, count, root * 4 + inplace * 2 + legacy);
    size_t bytes = count * dt_size(dt);
    int is_root = c->rank == root;
    char *want = xmalloc(bytes), *out = xmalloc(bytes), *send = xmalloc(bytes),
         *keep = xmalloc(bytes);
    fill(want, dt, gvqSum, seed, root, 0, count); /* root's data, regenerated everywhere */
    if (is_root)
        memcpy(send, want, bytes);
    else
        memset(send, 0x5a, bytes);
    memcpy(keep, send, bytes);
    gvqResult_t res;
    if (inplace) {
        if (is_root)
            memcpy(out, want, bytes);
        else
            memset(out, 0xa5, bytes);
        res = legacy ? gvqBcast(out, count, dt, root, c->comm, NULL)
                     : gvqBroadcast(out, out, count, dt, root, c->comm, NULL);
    } else {
        memset(out, 0xa5, bytes);
        const void *s = is_root || !(root & 1) ? send : NULL;
        res = gvqBroadcast(s, out, count, dt, root, c->comm, NULL);
    }
    if (RESULT_OK(res, what)) check_bytes(what, dt, want, out, count);
    if (!inplace) MT_CHECK(memcmp(send, keep, bytes) == 0, "%s: sendbuff was modified", what);
    check_identical(c->mpi, what, out, bytes);
    free(want);
    free(out);
    free(send);
    free(keep);
}

/* Out of place, non-roots pass recvbuff NULL when root is odd and a junk buffer (which must
 * stay untouched) when it is even. In place, non-roots' buffer must stay untouched. */
static void run_reduce(const ctx_t *c, gvqDataType_t dt, gvqRedOp_t op, size_t count, int root,
                       int inplace) {
    char what[160];
    snprintf(what, sizeof what, "%s: gvqReduce %s dtype %s op %s count %zu root %d nranks %d",
             c->name, inplace ? "in-place" : "out-of-place", dt_name[dt], op_name[op], count, root,
             c->nranks);
    uint64_t seed = seed_of(5, dt, op, count, root * 2 + inplace);
    size_t bytes = count * dt_size(dt);
    int is_root = c->rank == root;
    char *in = xmalloc(bytes), *buf = xmalloc(bytes), *junk = xmalloc(bytes), *ref = NULL;
    fill(in, dt, op, seed, c->rank, 0, count);
    if (dt_mpi(dt) != MPI_DATATYPE_NULL) {
        ref = xmalloc(bytes);
        mpi_reference(c->mpi, REF_REDUCE, in, ref, count, count, dt, op, root);
    }
    memset(junk, 0x5a, bytes);
    gvqResult_t res;
    const char *result;
    memcpy(buf, in, bytes);
    if (inplace) {
        res = gvqReduce(buf, buf, count, dt, op, root, c->comm, NULL);
        result = buf;
    } else {
        void *out = is_root ? junk : (root & 1) ? NULL : junk;
        if (is_root) memset(junk, 0xa5, bytes);
        res = gvqReduce(buf, out, count, dt, op, root, c->comm, NULL);
        result = junk;
    }
    if (RESULT_OK(res, what)) {
        if (is_root) {
            check_reduced(what, dt, op, seed, c->nranks, 0, count, result, ref);
        } else if (inplace) {
            MT_CHECK(memcmp(buf, in, bytes) == 0, "%s: a non-root's buffer was modified", what);
        } else {
            char *j2 = xmalloc(bytes);
            memset(j2, 0x5a, bytes);
            MT_CHECK(memcmp(junk, j2, bytes) == 0, "%s: a non-root's recvbuff was written", what);
            free(j2);
        }
    }
    if (!inplace) MT_CHECK(memcmp(buf, in, bytes) == 0, "%s: sendbuff was modified", what);
    free(in);
    free(buf);
    free(junk);
    free(ref);
}

/* Inside one group: send to the right and to the left, receive from the left and from the
 * right (a pair of ranks keeps message order, so this holds for 1 and 2 ranks too). Nested
 * groups when `nested`. */
static void run_ring(const ctx_t *c, gvqDataType_t dt, size_t count, int nested) {
    char what[160];
    snprintf(what, sizeof what,
             "%s: gvqSend/gvqRecv ring in a %sgroup dtype %s count %zu "
             "nranks %d",
             c->name, nested ? "nested " : "", dt_name[dt], count, c->nranks);
    int n = c->nranks, right = (c->rank + 1) % n, left = (c->rank + n - 1) % n;
    uint64_t seed = seed_of(6, dt, gvqSum, count, nested);
    size_t bytes = count * dt_size(dt);
    char *to_r = xmalloc(bytes), *to_l = xmalloc(bytes), *from_l = xmalloc(bytes),
         *from_r = xmalloc(bytes), *want_l = xmalloc(bytes), *want_r = xmalloc(bytes);
    /* rank q sends stream 2q to its right and stream 2q+1 to its left */
    fill(to_r, dt, gvqSum, seed, 2 * c->rank, 0, count);
    fill(to_l, dt, gvqSum, seed, 2 * c->rank + 1, 0, count);
    fill(want_l, dt, gvqSum, seed, 2 * left, 0, count);
    fill(want_r, dt, gvqSum, seed, 2 * right + 1, 0, count);
    memset(from_l, 0xa5, bytes);
    memset(from_r, 0xa5, bytes);
    MT_OK(gvqGroupStart());
    if (nested) {
        MT_OK(gvqGroupStart());
        MT_OK(gvqRecv(from_l, count, dt, left, c->comm, NULL)); /* receives first: order is free */
        MT_OK(gvqGroupEnd());
    }
    MT_OK(gvqSend(to_r, count, dt, right, c->comm, NULL));
    MT_OK(gvqSend(to_l, count, dt, left, c->comm, NULL));
    if (!nested) MT_OK(gvqRecv(from_l, count, dt, left, c->comm, NULL));
    MT_OK(gvqRecv(from_r, count, dt, right, c->comm, NULL));
    gvqResult_t res = gvqGroupEnd();
    if (RESULT_OK(res, what)) {
        char w2[200];
        snprintf(w2, sizeof w2, "%s (from left %d)", what, left);
        check_bytes(w2, dt, want_l, from_l, count);
        snprintf(w2, sizeof w2, "%s (from right %d)", what, right);
        check_bytes(w2, dt, want_r, from_r, count);
    }
    free(to_r);
    free(to_l);
    free(from_l);
    free(from_r);
    free(want_l);
    free(want_r);
}

/* Outside a group: rank 2k sends two messages to rank 2k+1, which receives them in order. */
static void run_blocking_p2p(const ctx_t *c) {
    const size_t count = 1000;
    int r = c->rank;
    int peer = (r & 1) ? r - 1 : r + 1;
    if (peer >= c->nranks) return;
    char what[160];
    snprintf(what, sizeof what, "%s: blocking gvqSend/gvqRecv pair %d<->%d", c->name, r, peer);
    int32_t *a = xmalloc(count * 4), *b = xmalloc(count * 4), *wa = xmalloc(count * 4),
            *wb = xmalloc(count * 4);
    uint64_t seed = seed_of(7, gvqInt32, gvqSum, count, 0);
    int sender = (r & 1) ? peer : r;
    fill(wa, gvqInt32, gvqSum, seed, 2 * sender, 0, count);
    fill(wb, gvqInt32, gvqSum, seed, 2 * sender + 1, 0, count);
    if (!(r & 1)) {
        MT_OK(gvqSend(wa, count, gvqInt32, peer, c->comm, NULL));
        MT_OK(gvqSend(wb, count, gvqInt32, peer, c->comm, NULL));
    } else {
        memset(a, 0, count * 4);
        memset(b, 0, count * 4);
        gvqResult_t r1 = gvqRecv(a, count, gvqInt32, peer, c->comm, NULL);
        gvqResult_t r2 = gvqRecv(b, count, gvqInt32, peer, c->comm, NULL);
        if (RESULT_OK(r1, what)) check_bytes(what, gvqInt32, wa, a, count);
        if (RESULT_OK(r2, what)) check_bytes(what, gvqInt32, wb, b, count);
    }
    free(a);
    free(b);
    free(wa);
    free(wb);
}

/* EAGER_N small blocking sends from every even rank to its odd neighbour, all before the
 * neighbour posts a receive (MPI's eager sends allow it; the shm channels' ring holds them), from
 * one buffer changed after each. With destroy, the sender then destroys its communicator at once
 * (the messages must still arrive); else every rank runs an allreduce. */
enum { EAGER_N = 12, EAGER_COUNT = 250 };
static void run_eager_sends(const ctx_t *c, int destroy) {
    int r = c->rank, peer = (r & 1) ? r - 1 : r + 1;
    int paired = peer < c->nranks;
    char what[160];
    snprintf(what, sizeof what, "%s: %d eager sends %d->%d%s", c->name, EAGER_N, r & ~1,
             (r & ~1) + 1, destroy ? ", then gvqCommDestroy" : "");
    int32_t *buf = xmalloc(EAGER_COUNT * 4), *want = xmalloc(EAGER_COUNT * 4);
    int sender = paired && !(r & 1), receiver = paired && (r & 1);
    for (int k = 0; sender && k < EAGER_N; k++) {
        fill(buf, gvqInt32, gvqSum, seed_of(11, gvqInt32, gvqSum, EAGER_COUNT, k), r, 0,
             EAGER_COUNT);
        MT_OK(gvqSend(buf, EAGER_COUNT, gvqInt32, peer, c->comm, NULL));
    }
    MPI_Barrier(c->mpi); /* every send completed before any receive was posted */
    if (sender && destroy) MT_OK(gvqCommDestroy(c->comm));
    for (int k = 0; receiver && k < EAGER_N; k++) {
        fill(want, gvqInt32, gvqSum, seed_of(11, gvqInt32, gvqSum, EAGER_COUNT, k), peer, 0,
             EAGER_COUNT);
        memset(buf, 0, EAGER_COUNT * 4);
        if (RESULT_OK(gvqRecv(buf, EAGER_COUNT, gvqInt32, peer, c->comm, NULL), what))
            check_bytes(what, gvqInt32, want, buf, EAGER_COUNT);
    }
    if (destroy && !sender) MT_OK(gvqCommDestroy(c->comm));
    if (!destroy) run_allreduce(c, gvqFloat32, gvqSum, SMALL_PRIME, 0);
    free(buf);
    free(want);
}

/* One group holding several allreduces (and a send/recv ring); each checked against MPI. */
static void run_group_of_allreduces(const ctx_t *c) {
    enum { K = 5 };
    static const struct {
        gvqDataType_t dt;
        gvqRedOp_t op;
        size_t count;
        int inplace;
    } spec[K] = {{gvqFloat32, gvqSum, SMALL_PRIME, 0},
                 {gvqInt32, gvqMax, 1000, 1},
                 {gvqFloat64, gvqAvg, 513, 1},
                 {gvqUint8, gvqProd, 1, 0},
                 {gvqInt64, gvqMin, 0, 0}};
    char *in[K], *out[K], *ref[K];
    uint64_t seed[K];
    int n = c->nranks, right = (c->rank + 1) % n, left = (c->rank + n - 1) % n;
    int32_t sendv[3], recvv[3] = {-1, -1, -1};
    for (int k = 0; k < 3; k++)
        sendv[k] = 1000 * c->rank + k;
    for (int k = 0; k < K; k++) {
        size_t bytes = spec[k].count * dt_size(spec[k].dt);
        seed[k] = seed_of(8, spec[k].dt, spec[k].op, spec[k].count, k);
        in[k] = xmalloc(bytes);
        out[k] = xmalloc(bytes);
        ref[k] = xmalloc(bytes);
        fill(in[k], spec[k].dt, spec[k].op, seed[k], c->rank, 0, spec[k].count);
        mpi_reference(c->mpi, REF_ALLREDUCE, in[k], ref[k], spec[k].count, spec[k].count,
                      spec[k].dt, spec[k].op, 0);
        if (spec[k].inplace)
            memcpy(out[k], in[k], bytes);
        else
            memset(out[k], 0xa5, bytes);
    }
    MT_OK(gvqGroupStart());
    for (int k = 0; k < K; k++) {
        MT_OK(gvqAllReduce(spec[k].inplace ? out[k] : in[k], out[k], spec[k].count, spec[k].dt,
                           spec[k].op, c->comm, NULL));
        if (k == 1) {
            MT_OK(gvqSend(sendv, 3, gvqInt32, right, c->comm, NULL));
            MT_OK(gvqRecv(recvv, 3, gvqInt32, left, c->comm, NULL));
        }
    }
    gvqResult_t res = gvqGroupEnd();
    char what[160];
    snprintf(what, sizeof what, "%s: group of %d allreduces and a send/recv, nranks %d", c->name, K,
             n);
    if (RESULT_OK(res, what)) {
        for (int k = 0; k < K; k++) {
            char w[200];
            snprintf(w, sizeof w, "%s: allreduce #%d (%s %s count %zu %s)", what, k,
                     dt_name[spec[k].dt], op_name[spec[k].op], spec[k].count,
                     spec[k].inplace ? "in-place" : "out-of-place");
            check_reduced(w, spec[k].dt, spec[k].op, seed[k], n, 0, spec[k].count, out[k], ref[k]);
        }
        for (int k = 0; k < 3; k++)
            MT_CHECK(recvv[k] == 1000 * left + k, "%s: recv element %d: expected %d, got %d", what,
                     k, 1000 * left + k, (int)recvv[k]);
    }
    for (int k = 0; k < K; k++) {
        free(in[k]);
        free(out[k]);
        free(ref[k]);
    }
}

static void check_identity(const ctx_t *c) {
    int count = -1, rank = -1;
    MT_OK(gvqCommCount(c->comm, &count));
    MT_OK(gvqCommUserRank(c->comm, &rank));
    MT_CHECK(count == c->nranks, "%s: gvqCommCount: expected %d, got %d", c->name, c->nranks,
             count);
    MT_CHECK(rank == c->rank, "%s: gvqCommUserRank: expected %d, got %d", c->name, c->rank, rank);
    gvqResult_t async = gvqInternalError;
    MT_OK(gvqCommGetAsyncError(c->comm, &async));
    MT_CHECK(async == gvqSuccess, "%s: gvqCommGetAsyncError: expected gvqSuccess, got %d", c->name,
             (int)async);
}

/* ---- suites ------------------------------------------------------------------------------- */

static void suite_full(const ctx_t *c) {
    int n = c->nranks;
    const size_t counts[4] = {0, 1, (size_t)n - 1, SMALL_PRIME};
    double t = MPI_Wtime();
    for (int ci = 0; ci < 4; ci++)
        for (int dt = 0; dt < gvqNumTypes; dt++)
            for (int op = 0; op < gvqNumOps; op++)
                for (int ip = 0; ip < 2; ip++)
                    run_allreduce(c, (gvqDataType_t)dt, (gvqRedOp_t)op, counts[ci], ip);
    /* large: every (dtype, op) once, in place or not by turns; float32 sum both ways */
    for (int dt = 0; dt < gvqNumTypes; dt++)
        for (int op = 0; op < gvqNumOps; op++)
            run_allreduce(c, (gvqDataType_t)dt, (gvqRedOp_t)op, LARGE_COUNT, (dt + op) & 1);
    run_allreduce(c, gvqFloat32, gvqSum, LARGE_COUNT, 0);
    if (c->rank == 0) printf("  %s: allreduce %.1f s\n", c->name, MPI_Wtime() - t);

    t = MPI_Wtime();
    for (int ci = 0; ci < 4; ci++)
        for (int dt = 0; dt < gvqNumTypes; dt++)
            for (int op = 0; op < gvqNumOps; op++)
                for (int ip = 0; ip < 2; ip++)
                    run_reduce_scatter(c, (gvqDataType_t)dt, (gvqRedOp_t)op, counts[ci], ip);
    run_reduce_scatter(c, gvqFloat32, gvqSum, LARGE_COUNT / (size_t)n, 0);
    run_reduce_scatter(c, gvqInt32, gvqMax, LARGE_COUNT / (size_t)n, 1);
    run_reduce_scatter(c, gvqFloat16, gvqSum, LARGE_COUNT / (size_t)n, 1);
    if (c->rank == 0) printf("  %s: reduce-scatter %.1f s\n", c->name, MPI_Wtime() - t);

    t = MPI_Wtime();
    for (int ci = 0; ci < 4; ci++)
        for (int dt = 0; dt < gvqNumTypes; dt++)
            for (int ip = 0; ip < 2; ip++)
                run_allgather(c, (gvqDataType_t)dt, counts[ci], ip);
    run_allgather(c, gvqFloat32, LARGE_COUNT / (size_t)n, 0);
    run_allgather(c, gvqUint8, LARGE_COUNT / (size_t)n, 1);
    if (c->rank == 0) printf("  %s: allgather %.1f s\n", c->name, MPI_Wtime() - t);

    t = MPI_Wtime();
    static const gvqDataType_t bdt[] = {gvqInt8, gvqFloat16, gvqFloat32, gvqUint64};
    for (int root = 0; root < n; root++) {
        for (int ci = 0; ci < 4; ci++)
            for (size_t d = 0; d < sizeof bdt / sizeof bdt[0]; d++) {
                run_broadcast(c, bdt[d], counts[ci], root, 0, 0);
                run_broadcast(c, bdt[d], counts[ci], root, 1, 0);
                run_broadcast(c, bdt[d], counts[ci], root, 1, 1);
            }
    }
    run_broadcast(c, gvqFloat32, LARGE_COUNT, 0, 0, 0);
    run_broadcast(c, gvqInt8, LARGE_COUNT, n - 1, 1, 1);
    if (c->rank == 0) printf("  %s: broadcast %.1f s\n", c->name, MPI_Wtime() - t);

    t = MPI_Wtime();
    for (int root = 0; root < n; root++)
        for (int ci = 0; ci < 4; ci++)
            for (int dt = 0; dt < gvqNumTypes; dt++)
                for (int op = 0; op < gvqNumOps; op++)
                    for (int ip = 0; ip < 2; ip++)
                        run_reduce(c, (gvqDataType_t)dt, (gvqRedOp_t)op, counts[ci], root, ip);
    run_reduce(c, gvqFloat32, gvqSum, LARGE_COUNT, n - 1, 0);
    run_reduce(c, gvqInt64, gvqMax, LARGE_COUNT, 0, 1);
    run_reduce(c, gvqBfloat16, gvqSum, LARGE_COUNT, n / 2, 0);
    if (c->rank == 0) printf("  %s: reduce %.1f s\n", c->name, MPI_Wtime() - t);

    t = MPI_Wtime();
    for (int ci = 0; ci < 4; ci++) {
        run_ring(c, gvqFloat32, counts[ci], 0);
        run_ring(c, gvqInt8, counts[ci], 1);
    }
    run_ring(c, gvqFloat64, LARGE_COUNT, 0);
    run_blocking_p2p(c);
    run_group_of_allreduces(c);
    if (c->rank == 0) printf("  %s: send/recv and groups %.1f s\n", c->name, MPI_Wtime() - t);
}

/* The subset run on the communicators made by gvqCommInitMPI. */
static void suite_subset(const ctx_t *c) {
    int n = c->nranks;
    double t = MPI_Wtime();
    for (int dt = 0; dt < gvqNumTypes; dt++)
        for (int op = 0; op < gvqNumOps; op++) {
            run_allreduce(c, (gvqDataType_t)dt, (gvqRedOp_t)op, SMALL_PRIME, op & 1);
            run_allreduce(c, (gvqDataType_t)dt, (gvqRedOp_t)op, (size_t)n - 1, 0);
        }
    run_allreduce(c, gvqFloat32, gvqSum, LARGE_COUNT, 0);
    run_reduce_scatter(c, gvqFloat32, gvqSum, SMALL_PRIME, 0);
    run_reduce_scatter(c, gvqInt64, gvqAvg, SMALL_PRIME, 1);
    run_allgather(c, gvqFloat64, SMALL_PRIME, 0);
    run_allgather(c, gvqInt8, SMALL_PRIME, 1);
    for (int root = 0; root < n; root++) {
        run_broadcast(c, gvqFloat32, SMALL_PRIME, root, root & 1, 0);
        run_reduce(c, gvqFloat32, gvqSum, SMALL_PRIME, root, root & 1);
        run_reduce(c, gvqBfloat16, gvqMax, SMALL_PRIME, root, 0);
    }
    run_ring(c, gvqUint32, SMALL_PRIME, 0);
    run_group_of_allreduces(c);
    if (c->rank == 0) printf("  %s: subset %.1f s\n", c->name, MPI_Wtime() - t);
}

/* ---- concurrency ---------------------------------------------------------------------------- */

/* Calls on different communicators may come from different threads: a thread runs allreduces on
 * one communicator while the main thread runs others on another. Closed-form references. */
typedef struct {
    gvqComm_t comm;
    int rank, nranks, iters, bad;
    gvqResult_t res;
} thread_job_t;

enum { THREAD_COUNT = 4099, THREAD_ITERS = 30 };

/* int64 sum: x = rank*1000003 + 7i + it, so the sum is 1000003*n(n-1)/2 + n(7i + it). */
static void *thread_int64_sums(void *arg) {
    thread_job_t *j = arg;
    int64_t *x = xmalloc(THREAD_COUNT * 8), *y = xmalloc(THREAD_COUNT * 8);
    int64_t n = j->nranks;
    for (int it = 0; it < j->iters && j->res == gvqSuccess; it++) {
        for (int64_t i = 0; i < THREAD_COUNT; i++)
            x[i] = j->rank * 1000003LL + 7 * i + it;
        j->res = gvqAllReduce(x, y, THREAD_COUNT, gvqInt64, gvqSum, j->comm, NULL);
        for (int64_t i = 0; i < THREAD_COUNT && j->res == gvqSuccess; i++)
            j->bad += y[i] != 1000003LL * n * (n - 1) / 2 + n * (7 * i + it);
    }
    free(x);
    free(y);
    return NULL;
}

/* float64 max, in place: x = (31 rank + i + it) mod 97. */
static void *thread_double_maxes(void *arg) {
    thread_job_t *j = arg;
    double *x = xmalloc(THREAD_COUNT * 8);
    for (int it = 0; it < j->iters && j->res == gvqSuccess; it++) {
        for (int i = 0; i < THREAD_COUNT; i++)
            x[i] = (double)((31 * j->rank + i + it) % 97);
        j->res = gvqAllReduce(x, x, THREAD_COUNT, gvqFloat64, gvqMax, j->comm, NULL);
        for (int i = 0; i < THREAD_COUNT && j->res == gvqSuccess; i++) {
            int want = 0;
            for (int r = 0; r < j->nranks; r++) {
                int v = (31 * r + i + it) % 97;
                want = v > want ? v : want;
            }
            j->bad += x[i] != (double)want;
        }
    }
    free(x);
    return NULL;
}

static void run_two_threads(gvqComm_t a, gvqComm_t b, int rank, int n) {
    thread_job_t ja = {a, rank, n, THREAD_ITERS, 0, gvqSuccess};
    thread_job_t jb = {b, rank, n, THREAD_ITERS, 0, gvqSuccess};
    pthread_t th;
    if (pthread_create(&th, NULL, thread_double_maxes, &jb) != 0) {
        MT_FAIL("pthread_create failed");
        return;
    }
    thread_int64_sums(&ja);
    pthread_join(th, NULL);
    MT_CHECK(ja.res == gvqSuccess && jb.res == gvqSuccess,
             "two threads, two comms: returned %d "
             "(%s) and %d (%s)",
             (int)ja.res, gvqGetErrorString(ja.res), (int)jb.res, gvqGetErrorString(jb.res));
    MT_CHECK(ja.bad == 0,
             "two threads, two comms: int64 sum allreduce count %d: %d elements "
             "wrong over %d iterations",
             THREAD_COUNT, ja.bad, THREAD_ITERS);
    MT_CHECK(jb.bad == 0,
             "two threads, two comms: float64 max allreduce count %d: %d elements "
             "wrong over %d iterations",
             THREAD_COUNT, jb.bad, THREAD_ITERS);
}

/* One group holding allreduces on two communicators (the same processes). */
/* A group of a send on one communicator and a receive on the other, each pair of ranks in the
 * opposite order (an even rank sends on c1 and receives on c2, its odd partner sends on c2 and
 * receives on c1), 2 MiB each: more than a shared-memory channel holds, so each send completes
 * only while its receiver moves, and a group waiting for its communicators one after the other
 * would wait forever. */
static void run_group_p2p_two_comms(const ctx_t *c1, const ctx_t *c2) {
    enum { COUNT = 1 << 19 }; /* int32: 2 MiB */
    int r = c1->rank, peer = (r & 1) ? r - 1 : r + 1;
    if (peer >= c1->nranks) return;
    int32_t *out = xmalloc(COUNT * 4), *in = xmalloc(COUNT * 4), *want = xmalloc(COUNT * 4);
    uint64_t seed = seed_of(13, gvqInt32, gvqSum, COUNT, 0);
    fill(out, gvqInt32, gvqSum, seed, r, 0, COUNT);
    fill(want, gvqInt32, gvqSum, seed, peer, 0, COUNT);
    memset(in, 0, COUNT * 4);
    const ctx_t *on_send = (r & 1) ? c2 : c1, *on_recv = (r & 1) ? c1 : c2;
    MT_OK(gvqGroupStart());
    MT_OK(gvqSend(out, COUNT, gvqInt32, peer, on_send->comm, NULL));
    MT_OK(gvqRecv(in, COUNT, gvqInt32, peer, on_recv->comm, NULL));
    gvqResult_t res = gvqGroupEnd();
    if (RESULT_OK(res, "group of a send and a receive on two comms"))
        check_bytes("group of a send and a receive on two comms", gvqInt32, want, in, COUNT);
    free(out);
    free(in);
    free(want);
}

static void run_group_two_comms(const ctx_t *c1, const ctx_t *c2) {
    enum { N = 777 };
    int32_t x[N], y1[N], y2[N], r1[N], r2[N];
    for (int i = 0; i < N; i++)
        x[i] = (int32_t)((i * 37 + c1->rank * 11) % 1001) - 500;
    mpi_reference(c1->mpi, REF_ALLREDUCE, x, r1, N, N, gvqInt32, gvqSum, 0);
    mpi_reference(c1->mpi, REF_ALLREDUCE, x, r2, N, N, gvqInt32, gvqMin, 0);
    MT_OK(gvqGroupStart());
    MT_OK(gvqAllReduce(x, y1, N, gvqInt32, gvqSum, c1->comm, NULL));
    MT_OK(gvqAllReduce(x, y2, N, gvqInt32, gvqMin, c2->comm, NULL));
    gvqResult_t res = gvqGroupEnd();
    if (RESULT_OK(res, "group over two comms")) {
        check_bytes("group over two comms: int32 sum on the first", gvqInt32, r1, y1, N);
        check_bytes("group over two comms: int32 min on the second", gvqInt32, r2, y2, N);
    }
}

/* ---- main --------------------------------------------------------------------------------- */

/* The NCCL bootstrap: MPI rank `boot` makes the id, MPI_Bcast hands it round, the ranks with
 * join set join as `rank` of `nranks`. */
static gvqComm_t init_nccl_way(int boot, int join, int nranks, int rank, const char *name) {
    gvqUniqueId id;
    memset(&id, 0, sizeof id);
    if (mt.rank == boot) MT_OK(gvqGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, boot, MPI_COMM_WORLD);
    if (!join) return NULL;
    gvqComm_t comm = NULL;
    gvqResult_t res = gvqCommInitRank(&comm, nranks, id, rank);
    MT_CHECK(res == gvqSuccess && comm != NULL,
             "%s: gvqCommInitRank(nranks %d, rank %d) "
             "returned %d (%s): %s",
             name, nranks, rank, (int)res, gvqGetErrorString(res), gvqGetLastError(NULL));
    return res == gvqSuccess ? comm : NULL;
}

/* Whether every rank of mc has a communicator (if not, collectives would hang). */
static int all_have(gvqComm_t comm, MPI_Comm mc) {
    int mine = comm != NULL, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, mc);
    return all;
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    int n = mt.nranks, rank = mt.rank;

    int version = 0;
    MT_OK(gvqGetVersion(&version));
    MT_CHECK(version == GVQ_VERSION, "gvqGetVersion: expected %d, got %d", GVQ_VERSION, version);

    gvqComm_t a = init_nccl_way(0, 1, n, rank, "gvqCommInitRank");
    if (!all_have(a, MPI_COMM_WORLD)) return mt_finish("test_collectives");
    ctx_t ca = {a, "gvqCommInitRank comm", rank, n, MPI_COMM_WORLD};
    check_identity(&ca);
    suite_full(&ca);

    gvqComm_t b = NULL;
    MT_OK(gvqCommInitMPI(&b, MPI_COMM_WORLD, NULL));
    if (!all_have(b, MPI_COMM_WORLD)) return mt_finish("test_collectives");
    ctx_t cb = {b, "gvqCommInitMPI comm", rank, n, MPI_COMM_WORLD};
    check_identity(&cb);
    suite_subset(&cb);

    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.chunkBytes = 256;
    gvqComm_t s = NULL;
    MT_OK(gvqCommInitMPI(&s, MPI_COMM_WORLD, &cfg));
    if (!all_have(s, MPI_COMM_WORLD)) return mt_finish("test_collectives");
    ctx_t cs = {s, "gvqCommInitMPI comm, 256-byte chunks", rank, n, MPI_COMM_WORLD};
    check_identity(&cs);
    suite_subset(&cs);

    /* gvq ranks reversed against MPI's; the reference runs on MPI ranks reversed alike */
    MPI_Comm rev;
    MPI_Comm_split(MPI_COMM_WORLD, 0, n - 1 - rank, &rev);
    gvqComm_t r = init_nccl_way(0, 1, n, n - 1 - rank, "reversed gvqCommInitRank");
    if (!all_have(r, MPI_COMM_WORLD)) return mt_finish("test_collectives");
    ctx_t cr = {r, "reversed-rank comm", n - 1 - rank, n, rev};
    check_identity(&cr);
    suite_subset(&cr);

    /* MPI ranks 1..n-1 only, bootstrapped by MPI rank 1; rank 0 never calls gvq for it */
    if (n >= 2) {
        MPI_Comm part;
        MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? MPI_UNDEFINED : 1, rank, &part);
        gvqComm_t p = init_nccl_way(1, rank > 0, n - 1, rank - 1, "subset gvqCommInitRank");
        if (rank > 0) {
            if (!all_have(p, part)) return mt_finish("test_collectives");
            ctx_t cp = {p, "comm of MPI ranks 1..n-1", rank - 1, n - 1, part};
            check_identity(&cp);
            suite_subset(&cp);
            MT_OK(gvqCommDestroy(p));
            MPI_Comm_free(&part);
        }
    }

    run_two_threads(a, b, rank, n);
    run_group_two_comms(&ca, &cb);
    run_group_p2p_two_comms(&ca, &cb);
    /* the communicators are independent: one still works after the others are gone */
    MT_OK(gvqCommDestroy(r));
    MT_OK(gvqCommDestroy(s));
    MT_OK(gvqCommDestroy(b));
    run_allreduce(&ca, gvqFloat32, gvqSum, SMALL_PRIME, 0);
    run_eager_sends(&ca, 0);
    run_eager_sends(&ca, 1); /* destroys a */
    MPI_Comm_free(&rev);
    return mt_finish("test_collectives");
}
