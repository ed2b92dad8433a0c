/*
 * test_reference.c -- the differential harness (issue 34): every path of every collective held
 * to one reference, computed here in double precision from inputs that any rank regenerates
 * (a pure function of rank, tensor, call and index), never from the library's own output.
 *
 *   1 plain     allreduce, reducescatter, allgather, broadcast, reduce through every algorithm
 *               the selection can pick for each (forced as GVQ_ALGO would: gvq_select_override,
 *               and auto); blocking, on a host stream, and two calls in a group; in place and
 *               out of place; datatypes x ops; counts 1, 7, 1031 and gvq-train's tensors.
 *               Floats within rounding (N eps sum|x|), integers and max/min/prod exact, and
 *               bitwise identical on every rank
 *   2 qsgd      2/4/8-bit QSGD on gvq-train's conv and fc tensors and odd ones: alone, on a host
 *               stream and fused in a group are bitwise equal (a group gives the bits of its
 *               calls one by one), identical on every rank, within QSGD's variance bound, and
 *               gvqAvg is gvqSum / N
 *   3 intwire   QSGD over 8/16-bit integer sums: every value within N scale / lv of the sum
 *   4 lowrank   PowerSGD rank r, GradiVeQ's tracked basis and GradiVeQ's fitted basis on input
 *               of rank r (d): the sum comes back exact within rounding; alone and on a stream
 *               bitwise equal, fused within rounding of alone
 *   5 layer     the training layer (gvq_train.h): plain variables (bucketed and alone) within
 *               rounding of the mean, QSGD conv variables (one fused group) bitwise equal to
 *               the same compressors called directly, PowerSGD fc variables exact on rank-r
 *               gradients; wait-free and after backprop
 *   6 zerocode  (its own ctest entries, GVQ_CODEC=qsgd) plain gvqAllReduce on a flat buffer with
 *               a layout: each compressed layer the bits of its compressor called directly and
 *               within the bound, the plain rest within rounding
 *
 * The shm setting comes from ctest (GVQ_SHM=0/1 entries) at 1-5 ranks. GVQ_TEST_SWEEP=full runs
 * every datatype and op, every QSGD setting and more counts; the default is a representative
 * sweep quick enough for CI. An argument names one part (plain, qsgd, intwire, lowrank, layer,
 * zerocode).
 */
#include <math.h>
#include <stdint.h>

#include "gvq_train.h"
#include "mpitest.h"

/* The selection's override (src/comm/select.c; the static library): GVQ_ALGO's syntax, NULL
 * back to the environment's. */
void gvq_select_override(const char *spec);

static int full_sweep(void) {
    const char *s = getenv("GVQ_TEST_SWEEP");
    return s != NULL && strcmp(s, "full") == 0;
}

/* ---- inputs: pure functions -------------------------------------------------------------------
 */

static double unit_rand(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    uint64_t z = a * 0x9E3779B97F4A7C15ull + b * 0xD1B54A32D192ED03ull + c * 0x8CB92BA72F3D8DD7ull +
                 d * 0xABC98388FB8FAC03ull + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0; /* [-1, 1) */
}

static size_t dt_size(gvqDataType_t t) {
    switch (t) {
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

static int dt_float(gvqDataType_t t) {
    return t == gvqFloat16 || t == gvqBfloat16 || t == gvqFloat32 || t == gvqFloat64;
}
static int dt_unsigned(gvqDataType_t t) {
    return t == gvqUint8 || t == gvqUint32 || t == gvqUint64;
}

/* Round to the type's precision (from the formats' definitions, independently of the library):
 * IEEE half has 11 significant bits down to 2^-14 and a fixed quantum 2^-24 below (subnormals);
 * bfloat16 has 8 (the values here never come near its subnormals). */
static double to_half(double v) {
    int e;
    if (v == 0) return 0;
    frexp(v, &e); /* |v| in [2^(e-1), 2^e) */
    double q = fmax(ldexp(1.0, e - 1 - 10), ldexp(1.0, -24));
    return nearbyint(v / q) * q;
}
static double to_bf16(double v) {
    int e;
    if (v == 0) return 0;
    frexp(v, &e);
    double q = ldexp(1.0, e - 1 - 7);
    return nearbyint(v / q) * q;
}
/* The binary16 pattern of a value already rounded by to_half. */
static uint16_t half_bits(double v) {
    uint16_t sign = v < 0 ? 0x8000u : 0;
    double a = fabs(v);
    if (a == 0) return sign;
    if (a < ldexp(1.0, -14)) return (uint16_t)(sign | (uint16_t)(a * ldexp(1.0, 24)));
    int e;
    double m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
    return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024));
}
static double half_value(uint16_t h) {
    int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v = exp == 0 ? ldexp(man, -24) : ldexp(1024 + man, exp - 25);
    return (h & 0x8000) ? -v : v;
}

/* Rank r's value at element i of tensor `tag` for op (exactly representable in t). */
static double in_val(int r, int tag, size_t i, gvqDataType_t t, gvqRedOp_t op) {
    double u = unit_rand((uint64_t)r, (uint64_t)tag, i, 1);
    if (op == gvqProd) { /* products stay exact: factors 1, 2, -1 (1, 2 unsigned) */
        int k = (int)((u + 1) * 1.5);
        return k == 0 ? 1 : k == 1 ? 2 : dt_unsigned(t) ? 1 : -1;
    }
    if (!dt_float(t)) { /* small integers: no overflow of int8 sums over 5 ranks */
        int v = (int)floor(u * 12);
        return dt_unsigned(t) ? v + 12 : v;
    }
    double v = u * (1 + (double)(i % 7)); /* magnitudes 1..7, every bit in use */
    if (t == gvqFloat16) return to_half(v);
    if (t == gvqBfloat16) return to_bf16(v);
    if (t == gvqFloat32) return (double)(float)v;
    return v;
}

static void put_val(void *b, gvqDataType_t t, size_t i, double v) {
    switch (t) {
    case gvqInt8:
        ((int8_t *)b)[i] = (int8_t)v;
        break;
    case gvqUint8:
        ((uint8_t *)b)[i] = (uint8_t)v;
        break;
    case gvqInt32:
        ((int32_t *)b)[i] = (int32_t)v;
        break;
    case gvqUint32:
        ((uint32_t *)b)[i] = (uint32_t)v;
        break;
    case gvqInt64:
        ((int64_t *)b)[i] = (int64_t)v;
        break;
    case gvqUint64:
        ((uint64_t *)b)[i] = (uint64_t)v;
        break;
    case gvqFloat16:
        ((uint16_t *)b)[i] = half_bits(v);
        break;
    case gvqBfloat16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)b)[i] = (uint16_t)(u >> 16); /* exact: v has 8 significant bits */
        break;
    }
    case gvqFloat32:
        ((float *)b)[i] = (float)v;
        break;
    default:
        ((double *)b)[i] = v;
        break;
    }
}

static double get_val(const void *b, gvqDataType_t t, size_t i) {
    switch (t) {
    case gvqInt8:
        return ((const int8_t *)b)[i];
    case gvqUint8:
        return ((const uint8_t *)b)[i];
    case gvqInt32:
        return ((const int32_t *)b)[i];
    case gvqUint32:
        return ((const uint32_t *)b)[i];
    case gvqInt64:
        return (double)((const int64_t *)b)[i];
    case gvqUint64:
        return (double)((const uint64_t *)b)[i];
    case gvqFloat16:
        return half_value(((const uint16_t *)b)[i]);
    case gvqBfloat16: {
        uint32_t u = (uint32_t)((const uint16_t *)b)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case gvqFloat32:
        return ((const float *)b)[i];
    default:
        return ((const double *)b)[i];
    }
}

/* The reference: op over ranks 0..n-1 at (tag, i), in double; *mag: sum of |x| (for rounding). */
static double ref_reduce(int n, int tag, size_t i, gvqDataType_t t, gvqRedOp_t op, double *mag) {
    double acc = in_val(0, tag, i, t, op), m = fabs(acc);
    for (int r = 1; r < n; r++) {
        double x = in_val(r, tag, i, t, op);
        m += fabs(x);
        if (op == gvqProd)
            acc *= x;
        else if (op == gvqMax)
            acc = x > acc ? x : acc;
        else if (op == gvqMin)
            acc = x < acc ? x : acc;
        else
            acc += x;
    }
    if (op == gvqAvg) acc = dt_float(t) ? acc / n : trunc(acc / n);
    *mag = m;
    return acc;
}

/* Within rounding: floats sum (N-1) roundings of partial sums of magnitude <= sum|x| in the
 * type (16-bit floats on the wire too), plus the divide; everything else exact. */
static int ref_close(double got, double want, double mag, gvqDataType_t t, gvqRedOp_t op, int n) {
    if (!dt_float(t) || op == gvqMax || op == gvqMin || op == gvqProd) return got == want;
    double eps = t == gvqFloat16    ? 9.8e-4
                 : t == gvqBfloat16 ? 7.9e-3
                 : t == gvqFloat32  ? 1.2e-7
                                    : 2.3e-16;
    return fabs(got - want) <= (double)(n + 1) * eps * (mag + fabs(want)) + 1e-300;
}

/* ---- 1 plain collectives ---------------------------------------------------------------------
 */

enum { C_ALLREDUCE, C_REDUCESCATTER, C_ALLGATHER, C_BROADCAST, C_REDUCE, C_COUNT };
static const char *const coll_name[C_COUNT] = {"allreduce", "reducescatter", "allgather",
                                               "broadcast", "reduce"};
/* every algorithm the selection knows for each collective (src/comm/select.c), auto first */
static const char *const coll_algos[C_COUNT][7] = {
    {"auto", "ring", "rd", "rab", "direct", "shm", NULL},
    {"auto", "ring", "rab", "shm", NULL},
    {"auto", "ring", "rd", "direct", "shm", NULL},
    {"auto", "ring", "tree", "shm", NULL},
    {"auto", "ring", "tree", "shm", NULL},
};
enum { M_BLOCKING, M_STREAM, M_GROUP, M_COUNT };
static const char *const mode_name[M_COUNT] = {"blocking", "host stream", "group"};

typedef struct {
    gvqDataType_t t;
    gvqRedOp_t op;
} dtop_t;

static gvqStream_t g_stream;

/* One call of collective c on (send, recv), counts per rank `count` (reducescatter: recvcount,
 * allgather: sendcount). */
static gvqResult_t coll_call(int c, const void *send, void *recv, size_t count, dtop_t d, int root,
                             gvqComm_t comm, gvqStream_t s) {
    switch (c) {
    case C_ALLREDUCE:
        return gvqAllReduce(send, recv, count, d.t, d.op, comm, s);
    case C_REDUCESCATTER:
        return gvqReduceScatter(send, recv, count, d.t, d.op, comm, s);
    case C_ALLGATHER:
        return gvqAllGather(send, recv, count, d.t, comm, s);
    case C_BROADCAST:
        return gvqBroadcast(send, recv, count, d.t, root, comm, s);
    default:
        return gvqReduce(send, recv, count, d.t, d.op, root, comm, s);
    }
}

/* Elements of the send and receive buffers of collective c for count. */
static void coll_sizes(int c, size_t count, int n, size_t *ns, size_t *nr) {
    *ns = c == C_REDUCESCATTER ? count * (size_t)n : count;
    *nr = c == C_ALLGATHER ? count * (size_t)n : count;
}

/* Fill this rank's send buffer of collective c (tag: the call's tensor). */
static void coll_fill(int c, void *send, size_t ns, dtop_t d, int tag) {
    for (size_t i = 0; i < ns; i++)
        put_val(send, d.t, i, in_val(mt.rank, tag, i, d.t, d.op));
    (void)c;
}

/* Check this rank's output of collective c against the reference; returns the failures. */
static int coll_check(int c, const void *recv, size_t count, dtop_t d, int tag, int root,
                      const char *what) {
    int n = mt.nranks, bad = 0;
    size_t nr = c == C_ALLGATHER ? count * (size_t)n : count;
    if (c == C_REDUCE && mt.rank != root) return 0;
    for (size_t i = 0; i < nr && bad < 3; i++) {
        double mag = 0, want;
        if (c == C_ALLGATHER) {
            want = in_val((int)(i / count), tag, i % count, d.t, gvqSum);
        } else if (c == C_BROADCAST) {
            want = in_val(root, tag, i, d.t, gvqSum);
        } else {
            size_t at = c == C_REDUCESCATTER ? (size_t)mt.rank * count + i : i;
            want = ref_reduce(n, tag, at, d.t, d.op, &mag);
        }
        double got = get_val(recv, d.t, i);
        if (!ref_close(got, want, mag, d.t, c == C_ALLGATHER || c == C_BROADCAST ? gvqMax : d.op,
                       n)) {
            MT_FAIL("%s: element %zu is %.17g, reference %.17g", what, i, got, want);
            bad++;
        }
    }
    mt.checks++;
    return bad;
}

static void part_plain(gvqComm_t comm) {
    mt_part("1 plain: every collective x algorithm x mode against the reference", 600);
    int n = mt.nranks, full = full_sweep();
    /* gvq-train's ResNet-8 tensors (a conv, the fc, all parameters) and odd counts */
    const size_t counts_ci[] = {1, 7, 1031, 36864, 74553};
    const size_t counts_full[] = {1, 2, 7, 64, 513, 1031, 4099, 36864, 74553, 262147};
    const size_t *counts = full ? counts_full : counts_ci;
    size_t ncounts = full ? sizeof counts_full / sizeof *counts : sizeof counts_ci / sizeof *counts;
    const dtop_t dtops_ci[] = {{gvqFloat32, gvqSum},  {gvqFloat32, gvqAvg}, {gvqFloat32, gvqMax},
                               {gvqFloat32, gvqProd}, {gvqFloat16, gvqSum}, {gvqBfloat16, gvqAvg},
                               {gvqFloat64, gvqSum},  {gvqInt32, gvqSum},   {gvqInt32, gvqAvg},
                               {gvqUint8, gvqMin}};
    dtop_t dtops_full[gvqNumTypes * gvqNumOps];
    size_t ndtops = sizeof dtops_ci / sizeof *dtops_ci;
    const dtop_t *dtops = dtops_ci;
    if (full) {
        ndtops = 0;
        for (int t = 0; t < gvqNumTypes; t++)
            for (int op = 0; op < gvqNumOps; op++)
                dtops_full[ndtops++] = (dtop_t){(gvqDataType_t)t, (gvqRedOp_t)op};
        dtops = dtops_full;
    }
    size_t maxc = counts[ncounts - 1] * (size_t)n * 8;
    char *send[2], *recv[2];
    for (int k = 0; k < 2; k++) {
        send[k] = malloc(maxc);
        recv[k] = malloc(maxc);
    }
    long calls = 0;
    for (int c = 0; c < C_COUNT; c++) {
        for (int a = 0; coll_algos[c][a] != NULL; a++) {
            char spec[64];
            snprintf(spec, sizeof spec, "%s=%s", coll_name[c], coll_algos[c][a]);
            gvq_select_override(spec);
            uint64_t h = 0;
            for (size_t ci = 0; ci < ncounts; ci++) {
                /* reducescatter and allgather: the count per rank, their totals about the same */
                size_t count = counts[ci];
                if ((c == C_REDUCESCATTER || c == C_ALLGATHER) && count > 64)
                    count = count / (size_t)n + 1;
                size_t ns, nr;
                coll_sizes(c, count, n, &ns, &nr);
                for (size_t di = 0; di < ndtops; di++) {
                    dtop_t d = dtops[di];
                    if ((c == C_ALLGATHER || c == C_BROADCAST) && d.op != gvqSum) continue;
                    size_t es = dt_size(d.t);
                    for (int m = 0; m < M_COUNT; m++) {
                        int tag = (int)(ci * 1000 + di * 10 + (size_t)m),
                            root = (int)(ci % (size_t)n);
                        int inplace = (int)((ci + (size_t)m + di) % 2);
                        char what[160];
                        snprintf(what, sizeof what, "%s %s, %s, %zu of type %d op %d%s",
                                 coll_name[c], coll_algos[c][a], mode_name[m], count, d.t, d.op,
                                 inplace ? " in place" : "");
                        int ncalls = m == M_GROUP ? 2 : 1;
                        const void *sp[2];
                        void *rp[2];
                        for (int k = 0; k < ncalls; k++) {
                            int kt = tag + 100000 * k;
                            if (inplace && c == C_REDUCESCATTER) {
                                coll_fill(c, recv[k], ns, d, kt); /* recv + rank * count */
                                sp[k] = recv[k];
                                rp[k] = recv[k] + (size_t)mt.rank * count * es;
                            } else if (inplace && c == C_ALLGATHER) {
                                rp[k] = recv[k];
                                sp[k] = recv[k] + (size_t)mt.rank * count * es;
                                for (size_t i = 0; i < count; i++)
                                    put_val(recv[k] + (size_t)mt.rank * count * es, d.t, i,
                                            in_val(mt.rank, kt, i, d.t, d.op));
                            } else if (inplace) {
                                coll_fill(c, recv[k], ns, d, kt);
                                sp[k] = rp[k] = recv[k];
                            } else {
                                coll_fill(c, send[k], ns, d, kt);
                                memset(recv[k], 0x5a, nr * es);
                                sp[k] = send[k];
                                rp[k] = recv[k];
                            }
                        }
                        if (m == M_GROUP) MT_OK(gvqGroupStart());
                        for (int k = 0; k < ncalls; k++)
                            MT_OK(coll_call(c, sp[k], rp[k], count, d, root, comm,
                                            m == M_STREAM ? g_stream : NULL));
                        if (m == M_GROUP) MT_OK(gvqGroupEnd());
                        if (m == M_STREAM) MT_OK(gvqStreamSynchronize(g_stream));
                        calls += ncalls;
                        for (int k = 0; k < ncalls; k++) {
                            coll_check(c, rp[k], count, d, tag + 100000 * k, root, what);
                            if (c != C_REDUCE || mt.rank == root) {
                                size_t bytes = (c == C_REDUCESCATTER ? count : nr) * es;
                                h = h * 31 + (c == C_REDUCESCATTER ? 0 : mt_fnv1a(rp[k], bytes));
                            }
                        }
                    }
                }
            }
            /* reduce: only the root has a result; its hash joins the others' zeros */
            if (c != C_REDUCE)
                MT_CHECK(mt_identical(&h, sizeof h), "%s %s: outputs differ between ranks",
                         coll_name[c], coll_algos[c][a]);
        }
    }
    gvq_select_override(NULL);
    if (mt.rank == 0) printf("   %ld calls checked\n", calls);
    for (int k = 0; k < 2; k++) {
        free(send[k]);
        free(recv[k]);
    }
}

/* ---- compressed calls: tensors -----------------------------------------------------------------
 */

typedef struct {
    const char *name;
    int K, D, H, W; /* conv [K][D][H][W]; K = 0: flat (count in D) */
} shape_t;

/* gvq-train's ResNet-8 convs (its default --model resnet), its fc, the CNN's first conv, and odd
 * ones: a one-filter conv, a tensor shorter than a bucket, one value. */
static const shape_t shapes[] = {
    {"resnet conv1", 16, 1, 3, 3},  {"resnet conv2", 16, 16, 3, 3}, {"resnet conv4", 32, 16, 3, 3},
    {"resnet conv5", 32, 32, 3, 3}, {"resnet conv6", 64, 32, 3, 3}, {"resnet conv7", 64, 64, 3, 3},
    {"resnet fc", 0, 640, 0, 0},    {"cnn conv3", 64, 32, 3, 3},    {"odd conv", 3, 5, 3, 1},
    {"odd flat", 0, 1031, 0, 0},    {"short", 0, 77, 0, 0},         {"one", 0, 1, 0, 0},
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

static size_t shape_count(const shape_t *s) {
    return s->K > 0 ? (size_t)s->K * (size_t)s->D * (size_t)s->H * (size_t)s->W : (size_t)s->D;
}

/* Rank r's gradient of tensor j at call t: uniform values whose magnitude changes by the
 * filter and by the tensor (buckets of unequal scales), a NaN-free float. */
static float grad_val(int r, int j, int t, size_t i, const shape_t *s) {
    size_t per = s->K > 0 ? shape_count(s) / (size_t)s->K : 64;
    double scale = ldexp(1.0, (int)((i / per) % 5) - 2) * (1 + j % 3);
    return (float)(unit_rand((uint64_t)r + 17, (uint64_t)j, (uint64_t)t, i) * scale);
}

/* The position of element i in the filter-collocated order the codecs use for a conv tensor
 * (include/gvq.h: the K filters' values at one (d, h, w) side by side). */
static size_t colloc(size_t i, const shape_t *s) {
    if (s->K <= 1 || (size_t)s->D * s->H * s->W <= 1) return i;
    size_t hw = (size_t)s->H * s->W, k = i / ((size_t)s->D * hw), rest = i % ((size_t)s->D * hw);
    size_t d = rest / hw, p = rest % hw;
    return (p * (size_t)s->D + d) * (size_t)s->K + k;
}

/* QSGD's variance bound for one ring allreduce (docs/ALGORITHMS.md section 3, docs/RELIABILITY.md):
 * each of the N-1 hops re-quantizes a partial sum whose bucket max is at most P_b (1 + 1/s)^N,
 * P_b the sum over ranks of each rank's bucket max, and the errors are martingale differences:
 *     E ||y - sum||^2 <= N sum_b |b| (P_b (1 + 1/s)^N / s)^2 / 4.
 * Allowed: twice its square root, relative to ||sum||. The buckets are taken in the layout the
 * codec quantizes (collocated for a conv) and in the tensor's own; the larger bound counts. */
static double qsgd_bound(const float *xs /* N x n */, const double *ref, size_t n, int bits,
                         size_t bucket, const shape_t *s) {
    int N = mt.nranks;
    double lv = (double)((1 << (bits - 1)) - 1), grow = pow(1 + 1 / lv, N), worst = 0, n2 = 0;
    double *m = malloc(sizeof(double) * (n / bucket + 1) * (size_t)N);
    for (int layout = 0; layout < 2; layout++) {
        size_t nb = (n + bucket - 1) / bucket;
        memset(m, 0, sizeof(double) * nb * (size_t)N);
        for (int r = 0; r < N; r++)
            for (size_t i = 0; i < n; i++) {
                size_t b = (layout ? colloc(i, s) : i) / bucket;
                m[b * (size_t)N + (size_t)r] =
                    fmax(m[b * (size_t)N + (size_t)r], fabs(xs[(size_t)r * n + i]));
            }
        double e = 0;
        for (size_t b = 0; b < nb; b++) {
            double P = 0;
            for (int r = 0; r < N; r++)
                P += m[b * (size_t)N + (size_t)r];
            size_t len = b + 1 < nb ? bucket : n - b * bucket;
            double step = P * grow / lv;
            e += (double)N * (double)len * step * step / 4;
        }
        worst = fmax(worst, e);
    }
    free(m);
    for (size_t i = 0; i < n; i++)
        n2 += ref[i] * ref[i];
    return n2 > 0 ? 2 * sqrt(worst) / sqrt(n2) : 0;
}

static gvqCompressorConfig_t comp_cfg(int codec, const shape_t *s) {
    gvqCompressorConfig_t c = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    c.codec = codec;
    c.seed = 7;
    if (s != NULL && s->K > 0) {
        c.filters = s->K;
        c.depth = s->D;
        c.height = s->H;
        c.width = s->W;
    }
    return c;
}

static double rel_err(const float *y, const double *ref, size_t n, double scale) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)y[i] * scale - ref[i];
        e += d * d;
        r += ref[i] * ref[i];
    }
    return r > 0 ? sqrt(e / r) : sqrt(e);
}

/* ---- 2 QSGD: alone, on a stream, fused ----------------------------------------------------------
 */

static void part_qsgd(gvqComm_t comm) {
    mt_part("2 qsgd: alone, host stream and fused bitwise equal, within the variance bound", 600);
    int N = mt.nranks, full = full_sweep();
    const int set_ci[][2] = {{4, 512}, {8, 100}, {2, 512}};
    const int set_full[][2] = {{4, 512}, {8, 100}, {2, 512}, {4, 100}, {8, 512}, {2, 33}};
    size_t nsets = full ? 6 : 3;
    const int calls = full ? 5 : 3;
    for (size_t si = 0; si < nsets; si++) {
        int bits = full ? set_full[si][0] : set_ci[si][0];
        int bucket = full ? set_full[si][1] : set_ci[si][1];
        gvqCompressor_t c[3][NSHAPES];
        float *x[NSHAPES], *y[3][NSHAPES], *xs[NSHAPES];
        double *ref[NSHAPES];
        for (size_t j = 0; j < NSHAPES; j++) {
            size_t n = shape_count(&shapes[j]);
            gvqCompressorConfig_t cfg = comp_cfg(gvqCodecQsgd, &shapes[j]);
            cfg.qsgdBits = bits;
            cfg.qsgdBucket = bucket;
            cfg.seed += (int)j; /* a stream per tensor: the fused group keeps each bucket's */
            for (int m = 0; m < 3; m++) {
                MT_OK(gvqCompressorCreate(comm, n, &cfg, &c[m][j]));
                y[m][j] = malloc(4 * n);
            }
            x[j] = malloc(4 * n);
            xs[j] = malloc(4 * n * (size_t)N);
            ref[j] = malloc(8 * n);
        }
        for (int t = 0; t < calls; t++) {
            gvqRedOp_t op = t % 2 ? gvqAvg : gvqSum;
            for (size_t j = 0; j < NSHAPES; j++) {
                size_t n = shape_count(&shapes[j]);
                for (size_t i = 0; i < n; i++) {
                    ref[j][i] = 0;
                    for (int r = 0; r < N; r++) {
                        float v = grad_val(r, (int)j, t, i, &shapes[j]);
                        xs[j][(size_t)r * n + i] = v;
                        ref[j][i] += v;
                    }
                    x[j][i] = xs[j][(size_t)mt.rank * n + i];
                }
                memcpy(y[1][j], x[j], 4 * n); /* the stream's and the group's calls in place */
                memcpy(y[2][j], x[j], 4 * n);
            }
            for (size_t j = 0; j < NSHAPES; j++)
                MT_OK(gvqAllReduceCompressed(x[j], y[0][j], shape_count(&shapes[j]), gvqFloat32, op,
                                             c[0][j], comm, NULL));
            for (size_t j = 0; j < NSHAPES; j++)
                MT_OK(gvqAllReduceCompressed(y[1][j], y[1][j], shape_count(&shapes[j]), gvqFloat32,
                                             op, c[1][j], comm, g_stream));
            MT_OK(gvqStreamSynchronize(g_stream));
            MT_OK(gvqGroupStart());
            for (size_t j = 0; j < NSHAPES; j++) /* backward order, as the training layer */
                MT_OK(gvqAllReduceCompressed(y[2][NSHAPES - 1 - j], y[2][NSHAPES - 1 - j],
                                             shape_count(&shapes[NSHAPES - 1 - j]), gvqFloat32, op,
                                             c[2][NSHAPES - 1 - j], comm, NULL));
            MT_OK(gvqGroupEnd());
            uint64_t h = 0;
            for (size_t j = 0; j < NSHAPES; j++) {
                size_t n = shape_count(&shapes[j]);
                char what[128];
                snprintf(what, sizeof what, "qsgd %d-bit bucket %d, %s (%zu), call %d%s", bits,
                         bucket, shapes[j].name, n, t, op == gvqAvg ? " avg" : "");
                MT_CHECK(memcmp(y[0][j], y[1][j], 4 * n) == 0,
                         "%s: on a host stream it differs from the call alone", what);
                MT_CHECK(memcmp(y[0][j], y[2][j], 4 * n) == 0,
                         "%s: fused in a group it differs from the call alone", what);
                double e = rel_err(y[2][j], ref[j], n, op == gvqAvg ? N : 1);
                double bound = qsgd_bound(xs[j], ref[j], n, bits, (size_t)bucket, &shapes[j]);
                MT_CHECK(e <= bound, "%s: relative error %.4g above the variance bound %.4g", what,
                         e, bound);
                if (bits == 8 && n > 1)
                    MT_CHECK(e < 0.05, "%s: relative error %.4g, want < 0.05 at 8 bits", what, e);
                h = h * 31 + mt_fnv1a(y[2][j], 4 * n);
                if (mt.rank == 0 && t == 0 && (j == 0 || j == 5) && si == 0)
                    printf("   %s: relative error %.4f (bound %.4f)\n", what, e, bound);
            }
            MT_CHECK(mt_identical(&h, sizeof h),
                     "qsgd %d-bit call %d: outputs differ between ranks", bits, t);
        }
        for (size_t j = 0; j < NSHAPES; j++) {
            for (int m = 0; m < 3; m++) {
                MT_OK(gvqCompressorDestroy(c[m][j]));
                free(y[m][j]);
            }
            free(x[j]), free(xs[j]), free(ref[j]);
        }
    }
}

/* ---- 3 QSGD over integer sums -------------------------------------------------------------------
 */

static void part_intwire(gvqComm_t comm) {
    mt_part("3 intwire: QSGD over 8/16-bit integer sums within N scale / lv", 300);
    int N = mt.nranks;
    const int cases[][2] = {{4, 8}, {8, 16}}; /* QSGD bits, integer bits */
    const size_t bucket = 256;
    for (int k = 0; k < 2; k++) {
        int qb = cases[k][0], ib = cases[k][1];
        int lv = ((1 << (ib - 1)) - 1) / N, s = (1 << (qb - 1)) - 1;
        if (lv > s) lv = s;
        for (size_t j = 0; j < NSHAPES; j++) {
            const shape_t *sh = &shapes[j];
            size_t n = shape_count(sh);
            gvqCompressorConfig_t cfg = comp_cfg(gvqCodecQsgd, sh);
            cfg.qsgdBits = qb;
            cfg.qsgdBucket = (int)bucket;
            cfg.integerBits = ib;
            gvqCompressor_t ca, cs;
            MT_OK(gvqCompressorCreate(comm, n, &cfg, &ca));
            MT_OK(gvqCompressorCreate(comm, n, &cfg, &cs));
            float *x = malloc(4 * n), *y = malloc(4 * n), *ys = malloc(4 * n);
            double *scale = calloc(n, sizeof(double)), *sum = calloc(n, sizeof(double));
            for (int t = 0; t < 2; t++) {
                /* per value: the largest |x| of any rank in its bucket, in either layout */
                memset(scale, 0, sizeof(double) * n);
                memset(sum, 0, sizeof(double) * n);
                double *bmax = calloc(2 * (n / bucket + 1), sizeof(double));
                for (int r = 0; r < N; r++)
                    for (size_t i = 0; i < n; i++) {
                        float v = grad_val(r, (int)j, t, i, sh);
                        sum[i] += v;
                        if (r == mt.rank) x[i] = ys[i] = v;
                        bmax[2 * (i / bucket)] = fmax(bmax[2 * (i / bucket)], fabs(v));
                        bmax[2 * (colloc(i, sh) / bucket) + 1] =
                            fmax(bmax[2 * (colloc(i, sh) / bucket) + 1], fabs(v));
                    }
                for (size_t i = 0; i < n; i++)
                    scale[i] = fmax(bmax[2 * (i / bucket)], bmax[2 * (colloc(i, sh) / bucket) + 1]);
                free(bmax);
                MT_OK(gvqAllReduceCompressed(x, y, n, gvqFloat32, gvqSum, ca, comm, NULL));
                MT_OK(gvqAllReduceCompressed(ys, ys, n, gvqFloat32, gvqSum, cs, comm, g_stream));
                MT_OK(gvqStreamSynchronize(g_stream));
                int bad = 0;
                for (size_t i = 0; i < n && bad < 3; i++) {
                    double bound = N * scale[i] / lv * (1 + 1e-5) + 1e-30;
                    if (!(fabs(y[i] - sum[i]) <= bound)) {
                        MT_FAIL("int%d wire, qsgd %d-bit, %s call %d: value %zu is %.9g, sum "
                                "%.9g: error above N scale / lv = %.3g",
                                ib, qb, sh->name, t, i, y[i], sum[i], bound);
                        bad++;
                    }
                }
                mt.checks++;
                MT_CHECK(memcmp(y, ys, 4 * n) == 0,
                         "int%d wire, %s call %d: on a host stream it differs from alone", ib,
                         sh->name, t);
                MT_CHECK(mt_identical(y, 4 * n), "int%d wire, %s call %d: ranks differ", ib,
                         sh->name, t);
            }
            MT_OK(gvqCompressorDestroy(ca));
            MT_OK(gvqCompressorDestroy(cs));
            free(x), free(y), free(ys), free(scale), free(sum);
        }
    }
}

/* ---- 4 low-rank codecs on low-rank input -------------------------------------------------------
 */

/* Rank r's call-t gradient of an M x C matrix (row-major) of rank `rank`: rank r's own
 * coefficients times `rank` fixed rows (shared by all ranks and calls), so that the sum has the
 * same rank and every row (a GradiVeQ slice when C = L) lies in one fixed subspace. */
static void lowrank_fill(float *g, double *ref, size_t M, size_t C, int rank, int t) {
    int N = mt.nranks;
    memset(ref, 0, sizeof(double) * M * C);
    for (int r = 0; r < N; r++)
        for (size_t a = 0; a < M; a++)
            for (size_t b = 0; b < C; b++) {
                double v = 0;
                for (int q = 0; q < rank; q++)
                    v += unit_rand(37, (uint64_t)(r * 1000 + t), (uint64_t)q, a) *
                         unit_rand(31, (uint64_t)q, b, 0);
                float f = (float)v;
                ref[a * C + b] += f;
                if (r == mt.rank) g[a * C + b] = f;
            }
}

static void lowrank_case(gvqComm_t comm, const char *name, gvqCompressorConfig_t cfg, size_t M,
                         size_t C, int rank, int calls, int check_from, int want_phase) {
    size_t n = M * C;
    gvqCompressor_t ca, cs, cg, cq;
    MT_OK(gvqCompressorCreate(comm, n, &cfg, &ca));
    MT_OK(gvqCompressorCreate(comm, n, &cfg, &cs));
    MT_OK(gvqCompressorCreate(comm, n, &cfg, &cg));
    /* a QSGD tensor beside it in the group: two kinds fused at once */
    gvqCompressorConfig_t qc = comp_cfg(gvqCodecQsgd, NULL);
    MT_OK(gvqCompressorCreate(comm, 1000, &qc, &cq));
    float *g = malloc(4 * n), *y = malloc(4 * n), *ys = malloc(4 * n), *yg = malloc(4 * n);
    float q[1000];
    double *ref = malloc(8 * n), worst = 0, worst_g = 0;
    for (int t = 0; t < calls; t++) {
        lowrank_fill(g, ref, M, C, rank, t);
        memcpy(ys, g, 4 * n);
        memcpy(yg, g, 4 * n);
        for (int i = 0; i < 1000; i++)
            q[i] = (float)unit_rand(5, (uint64_t)mt.rank, (uint64_t)t, (uint64_t)i);
        MT_OK(gvqAllReduceCompressed(g, y, n, gvqFloat32, gvqSum, ca, comm, NULL));
        MT_OK(gvqAllReduceCompressed(ys, ys, n, gvqFloat32, gvqSum, cs, comm, g_stream));
        MT_OK(gvqStreamSynchronize(g_stream));
        MT_OK(gvqGroupStart());
        MT_OK(gvqAllReduceCompressed(yg, yg, n, gvqFloat32, gvqSum, cg, comm, NULL));
        MT_OK(gvqAllReduceCompressed(q, q, 1000, gvqFloat32, gvqSum, cq, comm, NULL));
        MT_OK(gvqGroupEnd());
        MT_CHECK(memcmp(y, ys, 4 * n) == 0, "%s call %d: on a host stream it differs from alone",
                 name, t);
        MT_CHECK(mt_identical(y, 4 * n), "%s call %d: outputs differ between ranks", name, t);
        MT_CHECK(mt_identical(yg, 4 * n), "%s call %d (fused): outputs differ between ranks", name,
                 t);
        if (t >= check_from) {
            worst = fmax(worst, rel_err(y, ref, n, 1));
            worst_g = fmax(worst_g, rel_err(yg, ref, n, 1));
        }
    }
    gvqCompressorStats_t st;
    MT_OK(gvqCompressorGetStats(ca, &st));
    MT_CHECK(want_phase < 0 || st.phase == want_phase,
             "%s: phase %d after %d calls, want %d (the exactness check would be vacuous)", name,
             st.phase, calls, want_phase);
    MT_CHECK(st.ratio > 1, "%s: ratio %.3g: nothing was compressed", name, st.ratio);
    MT_CHECK(worst <= 1e-4, "%s: relative error %.3g on rank-%d input, want exact (<= 1e-4)", name,
             worst, rank);
    MT_CHECK(worst_g <= 1e-4, "%s fused: relative error %.3g on rank-%d input, want <= 1e-4", name,
             worst_g, rank);
    if (mt.rank == 0)
        printf("   %s: relative error %.2g alone, %.2g fused (ratio %.2f)\n", name, worst, worst_g,
               st.ratio);
    MT_OK(gvqCompressorDestroy(ca));
    MT_OK(gvqCompressorDestroy(cs));
    MT_OK(gvqCompressorDestroy(cg));
    MT_OK(gvqCompressorDestroy(cq));
    free(g), free(y), free(ys), free(yg), free(ref);
}

static void part_lowrank(gvqComm_t comm) {
    mt_part("4 lowrank: PowerSGD, tracked and fitted GradiVeQ exact on low-rank input", 300);
    /* PowerSGD rank 2 on a 64 x 576 matrix (ResNet-8's conv7 as K x DHW) and on the fc */
    shape_t conv7 = {"resnet conv7", 64, 64, 3, 3};
    gvqCompressorConfig_t p = comp_cfg(gvqCodecPowersgd, &conv7);
    p.powerRank = 2;
    p.errorFeedback = 0;
    lowrank_case(comm, "powersgd rank 2, 64 x 576", p, 64, 576, 2, 3, 0, -1);
    gvqCompressorConfig_t pf = comp_cfg(gvqCodecPowersgd, NULL);
    pf.filters = 10;
    pf.depth = 64;
    pf.height = pf.width = 1;
    pf.powerRank = 3;
    pf.errorFeedback = 0;
    lowrank_case(comm, "powersgd rank 3, fc 10 x 64", pf, 10, 64, 3, 3, 0, -1);
    /* GradiVeQ with a tracked basis, d = 2: slices (rows of 24) spanning two directions; the
     * basis converges within a few calls */
    gvqCompressorConfig_t tr = comp_cfg(gvqCodecGradiveq, NULL);
    tr.basisUpdate = gvqBasisTrack;
    tr.maxDims = 2;
    tr.sliceSize = 24;
    tr.errorFeedback = 0;
    lowrank_case(comm, "tracked basis d 2, 40 slices of 24", tr, 40, 24, 2, 10, 6, -1);
    /* GradiVeQ's fitted basis: 3 sampled calls, then the PCA, then compressed calls */
    gvqCompressorConfig_t fit = comp_cfg(gvqCodecGradiveq, NULL);
    fit.sliceSize = 24;
    fit.warmupIters = 0;
    fit.sampleIters = 3;
    fit.maxDims = 2;
    fit.lossThreshold = 1e-3f;
    lowrank_case(comm, "gradiveq fit d 2, 40 slices of 24", fit, 40, 24, 2, 8, 4,
                 gvqPhaseCompressed);
}

/* ---- 5 the training layer
 * ------------------------------------------------------------------------
 */

static void part_layer(gvqComm_t comm, int wait_free) {
    mt_part(wait_free ? "5 layer: wait-free" : "5 layer: after backprop", 300);
    int N = mt.nranks;
    /* backward order: the fc (PowerSGD, rank-2 gradients), biases (bucketed), convs (QSGD, one
     * fused group), a large dense tensor (plain, alone) */
    enum { NV = 9 };
    const shape_t vs[NV] = {
        {"fc", 0, 0, 0, 0},          {"fc bias", 0, 10, 0, 0}, {"conv7", 64, 64, 3, 3},
        {"conv7 bias", 0, 64, 0, 0}, {"conv6", 64, 32, 3, 3},  {"conv2", 16, 16, 3, 3},
        {"conv1", 16, 1, 3, 3},      {"scalars", 0, 5, 0, 0},  {"dense", 0, 70001, 0, 0}};
    gvqCompressorConfig_t qc = comp_cfg(gvqCodecQsgd, NULL), pc = comp_cfg(gvqCodecPowersgd, NULL);
    pc.powerRank = 2;
    pc.errorFeedback = 0;
    gvqTrainConfig_t tc = GVQ_TRAIN_CONFIG_INITIALIZER;
    tc.waitFree = wait_free;
    tc.convCompressor = &qc;
    tc.fcCompressor = &pc;
    tc.bucketBytes = 4096;
    gvqTrainer_t tr = NULL;
    MT_OK(gvqTrainCreate(comm, &tc, &tr));
    if (tr == NULL) return;
    int id[NV];
    size_t cnt[NV];
    for (int v = 0; v < NV; v++) {
        gvqVariable_t var = GVQ_VARIABLE_INITIALIZER;
        var.name = vs[v].name;
        if (v == 0) {
            var.kind = gvqVarFc;
            var.shape[0] = 10;
            var.shape[1] = 64;
            cnt[v] = 640;
        } else if (vs[v].K > 0) {
            var.kind = gvqVarConv;
            var.shape[0] = vs[v].K, var.shape[1] = vs[v].D, var.shape[2] = vs[v].H,
            var.shape[3] = vs[v].W;
            cnt[v] = shape_count(&vs[v]);
        } else {
            var.kind = gvqVarDense;
            var.shape[0] = vs[v].D;
            cnt[v] = (size_t)vs[v].D;
        }
        MT_OK(gvqTrainAddVariable(tr, &var, &id[v]));
    }
    MT_OK(gvqTrainCommit(tr));
    /* the same QSGD compressors, called directly: the layer's must give their bits */
    gvqCompressor_t direct[NV];
    float *g[NV], *d[NV];
    double *ref[NV];
    for (int v = 0; v < NV; v++) {
        direct[v] = NULL;
        g[v] = malloc(4 * cnt[v]);
        d[v] = malloc(4 * cnt[v]);
        ref[v] = malloc(8 * cnt[v]);
        gvqTrainVariableInfo_t info;
        MT_OK(gvqTrainGetVariableInfo(tr, id[v], &info));
        if (vs[v].K > 0) {
            MT_CHECK(info.route == gvqRouteCompressed && info.codec == gvqCodecQsgd,
                     "layer: %s routed %d codec %d, want compressed QSGD", vs[v].name, info.route,
                     info.codec);
            gvqCompressorConfig_t c = qc;
            c.filters = vs[v].K, c.depth = vs[v].D, c.height = vs[v].H, c.width = vs[v].W;
            c.seed = qc.seed + v; /* the layer's rule: the shared seed plus the index */
            MT_OK(gvqCompressorCreate(comm, cnt[v], &c, &direct[v]));
        }
    }
    for (int step = 0; step < 3; step++) {
        for (int v = 0; v < NV; v++) {
            if (v == 0) {
                lowrank_fill(g[v], ref[v], 10, 64, 2, step);
            } else {
                memset(ref[v], 0, 8 * cnt[v]);
                for (int r = 0; r < N; r++)
                    for (size_t i = 0; i < cnt[v]; i++) {
                        float x = grad_val(r, 50 + v, step, i, &vs[v]);
                        ref[v][i] += x;
                        if (r == mt.rank) g[v][i] = x;
                    }
            }
            memcpy(d[v], g[v], 4 * cnt[v]);
            MT_OK(gvqTrainGradReady(tr, id[v], g[v]));
        }
        MT_OK(gvqTrainWaitAll(tr));
        for (int v = 0; v < NV; v++)
            if (direct[v] != NULL)
                MT_OK(gvqAllReduceCompressed(d[v], d[v], cnt[v], gvqFloat32, gvqAvg, direct[v],
                                             comm, NULL));
        uint64_t h = 0;
        for (int v = 0; v < NV; v++) {
            h = h * 31 + mt_fnv1a(g[v], 4 * cnt[v]);
            if (direct[v] != NULL) {
                MT_CHECK(memcmp(g[v], d[v], 4 * cnt[v]) == 0,
                         "layer step %d: %s differs from the same QSGD compressor called directly",
                         step, vs[v].name);
                double e = rel_err(g[v], ref[v], cnt[v], N), b = 0;
                float *xs = malloc(4 * cnt[v] * (size_t)N);
                for (int r = 0; r < N; r++)
                    for (size_t i = 0; i < cnt[v]; i++)
                        xs[(size_t)r * cnt[v] + i] = grad_val(r, 50 + v, step, i, &vs[v]);
                b = qsgd_bound(xs, ref[v], cnt[v], 4, 512, &vs[v]);
                free(xs);
                MT_CHECK(e <= b, "layer step %d: %s relative error %.4g above the bound %.4g", step,
                         vs[v].name, e, b);
            } else if (v == 0) {
                double e = rel_err(g[v], ref[v], cnt[v], N);
                MT_CHECK(e <= 1e-4,
                         "layer step %d: fc (PowerSGD rank 2, rank-2 gradients) "
                         "relative error %.3g, want exact",
                         step, e);
            } else {
                int bad = 0;
                for (size_t i = 0; i < cnt[v] && bad < 3; i++) {
                    double mag = 0;
                    for (int r = 0; r < N; r++)
                        mag += fabs(grad_val(r, 50 + v, step, i, &vs[v]));
                    if (!ref_close(g[v][i], ref[v][i] / N, mag, gvqFloat32, gvqAvg, N)) {
                        MT_FAIL("layer step %d: %s element %zu is %.9g, mean %.9g", step,
                                vs[v].name, i, g[v][i], ref[v][i] / N);
                        bad++;
                    }
                }
                mt.checks++;
            }
        }
        MT_CHECK(mt_identical(&h, sizeof h), "layer step %d: outputs differ between ranks", step);
    }
    MT_OK(gvqTrainDestroy(tr));
    for (int v = 0; v < NV; v++) {
        if (direct[v] != NULL) MT_OK(gvqCompressorDestroy(direct[v]));
        free(g[v]), free(d[v]), free(ref[v]);
    }
}

/* ---- 6 zero-code mode ---------------------------------------------------------------------------
 * Its ctest entries set GVQ_CODEC=qsgd: plain gvqAllReduce calls on one flat buffer with a layout
 * (gvqCommSetLayout): the conv and fc layers from GVQ_LAYOUT_MIN_COUNT up through QSGD (fused in
 * one set), the rest (small layers, biases, gaps) one plain allreduce. Each QSGD layer equals the
 * same QSGD compressor called directly and lies within the variance bound; the rest within
 * rounding; every rank the same bits. */

static void part_zerocode(gvqComm_t comm) {
    mt_part("6 zerocode: GVQ_CODEC=qsgd on a flat buffer with a layout", 300);
    const char *codec = getenv("GVQ_CODEC");
    if (codec == NULL || strcmp(codec, "qsgd") != 0) {
        if (mt.rank == 0) printf("   SKIPPED: part 6 needs GVQ_CODEC=qsgd (its own ctest entry)\n");
        return;
    }
    int N = mt.nranks;
    /* conv7, conv6, fc 64 x 100 compressed; conv1 (144 < 4096), biases and a gap plain */
    const shape_t ls[5] = {{"conv7", 64, 64, 3, 3},
                           {"conv6", 64, 32, 3, 3},
                           {"fc", 0, 6400, 0, 0},
                           {"conv1", 16, 1, 3, 3},
                           {"biases", 0, 300, 0, 0}};
    size_t off[6] = {0}, total;
    for (int l = 0; l < 5; l++)
        off[l + 1] = off[l] + shape_count(&ls[l]);
    total = off[5] + 77; /* a gap no layer claims */
    gvqLayer_t layers[5] = {GVQ_LAYER_CONV(off[0], 64, 64, 3, 3),
                            GVQ_LAYER_CONV(off[1], 64, 32, 3, 3), GVQ_LAYER_FC(off[2], 64, 100),
                            GVQ_LAYER_CONV(off[3], 16, 1, 3, 3), GVQ_LAYER_OTHER(off[4], 300)};
    MT_OK(gvqCommSetLayout(comm, total, layers, 5));
    gvqCompressor_t direct[3];
    for (int l = 0; l < 3; l++) {
        gvqCompressorConfig_t c = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        c.codec = gvqCodecQsgd;
        c.seed = l; /* zero-code's rule: the l-th compressed layer's stream */
        MT_OK(gvqCompressorCreate(comm, shape_count(&ls[l]), &c, &direct[l]));
    }
    float *buf = malloc(4 * total), *d = malloc(4 * total), *xs = malloc(4 * total * (size_t)N);
    double *ref = malloc(8 * total);
    for (int t = 0; t < 3; t++) {
        gvqRedOp_t op = t == 1 ? gvqSum : gvqAvg;
        double scale = op == gvqAvg ? N : 1;
        memset(ref, 0, 8 * total);
        for (int r = 0; r < N; r++)
            for (size_t i = 0; i < total; i++) {
                float v = grad_val(r, 90, t, i, &ls[2]);
                xs[(size_t)r * total + i] = v;
                ref[i] += v;
            }
        memcpy(buf, xs + (size_t)mt.rank * total, 4 * total);
        memcpy(d, buf, 4 * total);
        MT_OK(gvqAllReduce(buf, buf, total, gvqFloat32, op, comm, NULL));
        for (int l = 0; l < 3; l++)
            MT_OK(gvqAllReduceCompressed(d + off[l], d + off[l], shape_count(&ls[l]), gvqFloat32,
                                         op, direct[l], comm, NULL));
        for (int l = 0; l < 3; l++) {
            size_t n = shape_count(&ls[l]);
            MT_CHECK(memcmp(buf + off[l], d + off[l], 4 * n) == 0,
                     "zerocode call %d: layer %s differs from its QSGD compressor called directly",
                     t, ls[l].name);
            float *xl = malloc(4 * n * (size_t)N);
            for (int r = 0; r < N; r++)
                memcpy(xl + (size_t)r * n, xs + (size_t)r * total + off[l], 4 * n);
            shape_t flat = {ls[l].name, 0, (int)n, 0, 0}; /* zero-code QSGD runs flat */
            double e = rel_err(buf + off[l], ref + off[l], n, scale);
            double b = qsgd_bound(xl, ref + off[l], n, 4, 512, &flat);
            free(xl);
            MT_CHECK(e <= b, "zerocode call %d: layer %s relative error %.4g above the bound %.4g",
                     t, ls[l].name, e, b);
        }
        int bad = 0;
        for (size_t i = off[3]; i < total && bad < 3; i++) {
            double mag = 0;
            for (int r = 0; r < N; r++)
                mag += fabs(xs[(size_t)r * total + i]);
            if (!ref_close(buf[i] * scale, ref[i], mag * scale, gvqFloat32, gvqSum, N)) {
                MT_FAIL("zerocode call %d: plain element %zu is %.9g, reference %.9g", t, i,
                        buf[i] * scale, ref[i]);
                bad++;
            }
        }
        mt.checks++;
        MT_CHECK(mt_identical(buf, 4 * total), "zerocode call %d: outputs differ between ranks", t);
    }
    for (int l = 0; l < 3; l++)
        MT_OK(gvqCompressorDestroy(direct[l]));
    MT_OK(gvqCommSetLayout(comm, 0, NULL, 0));
    free(buf), free(d), free(xs), free(ref);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    const char *only = argc > 1 ? argv[1] : NULL;
    gvqComm_t comm = mt_new_comm();
    MT_OK(gvqStreamCreate(&g_stream));
    if (mt.rank == 0)
        printf("test_reference: %d rank(s), GVQ_SHM=%s, sweep %s\n", mt.nranks,
               getenv("GVQ_SHM") ? getenv("GVQ_SHM") : "(default)",
               full_sweep() ? "full" : "representative");
    if (only == NULL || strcmp(only, "plain") == 0) part_plain(comm);
    if (only == NULL || strcmp(only, "qsgd") == 0) part_qsgd(comm);
    if (only == NULL || strcmp(only, "intwire") == 0) part_intwire(comm);
    if (only == NULL || strcmp(only, "lowrank") == 0) part_lowrank(comm);
    if (only != NULL && strcmp(only, "zerocode") == 0) part_zerocode(comm);
    if (only == NULL || strcmp(only, "layer") == 0) {
        part_layer(comm, 1);
        part_layer(comm, 0);
    }
    mt_part("done", 0);
    MT_OK(gvqStreamDestroy(g_stream));
    MT_OK(gvqCommDestroy(comm));
    return mt_finish("test_reference");
}
