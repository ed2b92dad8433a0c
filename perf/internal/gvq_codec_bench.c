/*
 * gvq_codec_bench.c -- every host codec kernel on one core, at the ring's chunk size, beside
 * memcpy measured in the same run (issue 36), and each codec's break-even link rate.
 *
 *   gvq-codec-bench [-n MiB] [-r reps] [-c chunk_bytes] [-k kernel-substring]
 *
 * Each kernel sweeps a vector of n MiB of fp32 values (default 64, well past the caches) chunk
 * by chunk as the ring does; a row is the best of `reps` sweeps, in GB/s of fp32 input and as a
 * fraction of memcpy's GB/s over the same vector. The break-even table models one ring
 * allreduce per rank (docs/PERFORMANCE.md, "Break-even link rate"):
 *
 *   plain:      compute (N-1)/N n t_add,   wire 2 (N-1)/N 4 n bytes
 *   codec:      compute n/N t_enc + (N-2)/N n t_hop + n t_dec (+ n t_pre, once per call),
 *               wire 2 (N-1)/N w n bytes (w wire bytes per value)
 *   break-even  B* = (wire_plain - wire_codec) / (compute_codec - compute_plain)
 *
 * i.e. the link rate below which the codec's ring is faster than the plain ring, compute and
 * transfer not overlapped (the ring's pipeline overlaps them, so this is the conservative rate).
 * "inf": the codec computes less than the plain ring adds. No MPI: one process, one core.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gvq_algo.h"
#include "codec_kernels.h"
#include "gvq_compressor.h"
#include "gvq_util.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct bench bench_t;
typedef void (*kernel_fn)(bench_t *b, size_t off, size_t len);

struct bench {
    size_t n, chunk; /* values; values per chunk */
    int reps;
    float *x, *y, *z;  /* inputs, outputs */
    uint8_t *w1, *w2;  /* wires */
    gvq_codec_t codec; /* the codec a row runs */
    size_t woff;       /* running wire offset within one sweep */
    gvq_gradiveq_t gq;
    gvq_intsum_t is;
    double memcpy_gbs;
    const char *filter;
};

/* Best of reps sweeps of fn over the vector, chunk by chunk; seconds. */
static double sweep(bench_t *b, kernel_fn fn) {
    double best = 1e30;
    for (int r = 0; r < b->reps; r++) {
        b->woff = 0;
        double t0 = now_s();
        for (size_t off = 0; off < b->n; off += b->chunk)
            fn(b, off, GVQ_MIN(b->chunk, b->n - off));
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    return best;
}

/* ns per value of a row, printed with its GB/s and fraction of memcpy. */
static double row(bench_t *b, const char *name, kernel_fn fn) {
    if (b->filter != NULL && strstr(name, b->filter) == NULL) return NAN;
    double t = sweep(b, fn), gbs = 4.0 * (double)b->n / t / 1e9;
    printf("  %-34s %8.2f GB/s  %5.2f of memcpy  %6.3f ns/value\n", name, gbs, gbs / b->memcpy_gbs,
           t / (double)b->n * 1e9);
    fflush(stdout);
    return t / (double)b->n * 1e9;
}

static void k_memcpy(bench_t *b, size_t off, size_t len) {
    memcpy(b->y + off, b->x + off, len * sizeof(float));
}
static void k_add(bench_t *b, size_t off, size_t len) { /* the plain ring's reduce: y += x */
    float *y = b->y + off;
    const float *x = b->x + off;
    for (size_t i = 0; i < len; i++)
        y[i] += x[i];
}
static void k_encode(bench_t *b, size_t off, size_t len) {
    b->codec.encode_combine(&b->codec, off, len, b->x + off, NULL, b->w1 + b->woff);
    b->woff += b->codec.wire_bytes(&b->codec, off, len);
}
static void k_hop(bench_t *b, size_t off, size_t len) {
    b->codec.encode_combine(&b->codec, off, len, b->x + off, b->w1 + b->woff, b->w2 + b->woff);
    b->woff += b->codec.wire_bytes(&b->codec, off, len);
}
static void k_decode(bench_t *b, size_t off, size_t len) {
    b->codec.decode(&b->codec, off, len, b->w1 + b->woff, b->y + off);
    b->woff += b->codec.wire_bytes(&b->codec, off, len);
}
static void k_is_scales(bench_t *b, size_t off, size_t len) {
    (void)off;
    (void)len;
    if (off == 0) gvq_intsum_local_scales(&b->is);
}
/* fp16 as the codecs' fp16 wires convert (codec_kernels.h); bf16 as gvq_util.h does */
static void k_half(bench_t *b, size_t off, size_t len) { /* the codec kernels' (fp16 wires) */
    gvq_kernels()->f32_to_f16(b->x + off, (uint16_t *)b->w1 + off, len);
}
static void k_unhalf(bench_t *b, size_t off, size_t len) {
    gvq_kernels()->f16_to_f32((const uint16_t *)b->w1 + off, b->y + off, len);
}
static void k_bf16(bench_t *b, size_t off, size_t len) {
    uint16_t *h = (uint16_t *)b->w1 + off;
    for (size_t i = 0; i < len; i++)
        h[i] = gvq_float_to_bf16(b->x[off + i]);
}
static void k_unbf16(bench_t *b, size_t off, size_t len) {
    const uint16_t *h = (const uint16_t *)b->w1 + off;
    for (size_t i = 0; i < len; i++)
        b->y[off + i] = gvq_bf16_to_float(h[i]);
}
/* error feedback's two passes per call: x = g + e (the input), and ||x|| for the clip */
static void k_ef_add(bench_t *b, size_t off, size_t len) {
    for (size_t i = 0; i < len; i++)
        b->y[off + i] = b->x[off + i] + b->z[off + i];
}

/* A codec's per-value costs (ns) and wire bytes per value, for the break-even table. */
typedef struct {
    const char *name;
    double pre, enc, hop, dec, wire;
} cost_t;

static double breakeven_gbit(const cost_t *c, double t_add, int N) {
    double f = (double)(N - 1) / N;
    double comp_p = f * t_add;
    double comp_c = c->pre + c->enc / N + (double)(N - 2) / N * c->hop + c->dec;
    double saved = 2 * f * (4.0 - c->wire) * 8; /* bits per value */
    if (comp_c <= comp_p) return INFINITY;
    return saved / (comp_c - comp_p); /* bits per ns = Gbit/s */
}

static void qsgd_rows(bench_t *b, int bits, cost_t *out) {
    gvq_qsgd_t q;
    char name[64];
    if (gvq_qsgd_init(&q, bits, 512, GVQ_QSGD_NORM_MAX, 7, 0) != gvqSuccess) exit(1);
    gvq_codec_qsgd_init(&b->codec, &gvq_host_device, &q);
    out->name = bits == 2 ? "qsgd 2-bit" : bits == 4 ? "qsgd 4-bit" : "qsgd 8-bit";
    snprintf(name, sizeof name, "qsgd%d encode", bits);
    out->enc = row(b, name, k_encode);
    snprintf(name, sizeof name, "qsgd%d hop (decode+add+encode)", bits);
    out->hop = row(b, name, k_hop);
    snprintf(name, sizeof name, "qsgd%d decode", bits);
    out->dec = row(b, name, k_decode);
    out->wire = (double)gvq_qsgd_wire_size(bits, 512, b->n) / (double)b->n;
    gvq_qsgd_fini(&q);
}

static void intsum_rows(bench_t *b, int nranks, cost_t *out) {
    if (gvq_intsum_init(&b->is, 8, 7, 512, NULL, &gvq_host_device, b->n, nranks, 7, 0) !=
        gvqSuccess)
        exit(1);
    gvq_codec_intsum_init(&b->codec, &gvq_host_device, &b->is);
    b->is.y = b->x;
    b->is.ny = b->n;
    gvq_intsum_local_scales(&b->is);
    out->name = "qsgd 4-bit, 8-bit integer wire";
    out->pre = row(b, "qsgd-int8 scales (local max)", k_is_scales);
    out->enc = row(b, "qsgd-int8 encode", k_encode);
    out->hop = row(b, "qsgd-int8 hop (integer add)", k_hop);
    out->dec = row(b, "qsgd-int8 decode", k_decode);
    out->wire = 1.0;
    gvq_intsum_fini(&b->is);
}

/* GradiVeQ, L = 256 (the default slice of a flat tensor), d = L / 8, one reuse group; the
 * basis is any orthonormal one (the kernels' cost does not depend on which). */
static void gradiveq_rows(bench_t *b, cost_t *out) {
    size_t L = 256, d = 32, n = b->n / L * L;
    float *U = calloc(L * d, sizeof(float)), *Z = calloc(L, sizeof(float));
    if (U == NULL || Z == NULL) exit(1);
    for (size_t j = 0; j < d; j++)
        U[j * L + j * (L / d)] = 1.0f;
    for (size_t i = 0; i < L; i++)
        Z[i] = 0.01f * (float)i;
    memset(&b->gq, 0, sizeof b->gq);
    b->gq.count = n;
    b->gq.L = L;
    b->gq.d = d;
    b->gq.C = n / L;
    b->gq.nranks = 4;
    b->gq.U = U;
    b->gq.Z = Z;
    if (gvq_gradiveq_prepare(&b->gq, &gvq_host_device) != gvqSuccess) exit(1);
    gvq_codec_gradiveq_init(&b->codec, &gvq_host_device, &b->gq);
    size_t save_chunk = b->chunk;
    b->chunk = b->chunk / L * L;
    out->name = "gradiveq ratio 8";
    out->enc = row(b, "gradiveq encode (L 256, d 32)", k_encode);
    out->hop = row(b, "gradiveq hop (encode+add)", k_hop);
    out->dec = row(b, "gradiveq decode", k_decode);
    out->wire = (double)gvq_gradiveq_wire_size(L, d, 0, n) / (double)n;
    b->chunk = save_chunk;
    gvq_gradiveq_fini(&b->gq);
    free(U);
    free(Z);
}

/* n floats on a 64-byte boundary, as PyTorch's and CUDA's allocators give their tensors (malloc
 * gives large blocks 16 bytes past one: every 512-bit access would cross a cache line) */
static float *buf64(size_t n) {
    return aligned_alloc(64, (sizeof(float) * n + 127) / 64 * 64);
}

/* One step of a method timed whole (seconds over `values` values), printed as a row "prefix:
 * name"; ns per value. */
static double step_row(const bench_t *b, const char *prefix, const char *name, double seconds,
                       size_t values) {
    double ns = seconds / (double)values * 1e9, gbs = 4.0 / ns;
    char label[64];
    snprintf(label, sizeof label, "%s: %s", prefix, name);
    printf("  %-34s %8.2f GB/s  %5.2f of memcpy  %6.3f ns/value\n", label, gbs, gbs / b->memcpy_gbs,
           ns);
    return ns;
}

/* The tracked basis's products on the slice matrix S (n slices x L = 256), d = 16 or 32:
 * C0 = S U, B = S^T C0, orth(B), then C = S U with e = S - C U^T in one sweep (on a copy of S,
 * the copy timed apart), and y = C U^T (gradiveq_track.c). Whole vector at once (the method runs
 * them on the whole tensor); ns per value. */
static void track_rows(bench_t *b, size_t d, cost_t *out) {
    if (b->filter != NULL && strstr("track/powersgd expand", b->filter) == NULL) return;
    size_t L = 256, n = b->n / L;
    float *U = buf64(L * d), *C = malloc(sizeof(float) * n * d);
    float *B = malloc(sizeof(float) * L * d);
    if (U != NULL) memset(U, 0, sizeof(float) * L * d);
    if (U == NULL || C == NULL || B == NULL) exit(1);
    for (size_t j = 0; j < d; j++)
        U[j * L + j * (L / d)] = 1.0f;
    const gvq_device_ops_t *dev = &gvq_host_device;
    enum { NT = 6 };
    double t[NT];
    for (int k = 0; k < NT; k++)
        t[k] = 1e30;
    for (int r = 0; r < b->reps; r++) {
        double t0 = now_s();
        gvq_powersgd_project(dev, b->x, n, L, d, U, C); /* C0 = S U */
        double t1 = now_s();
        gvq_powersgd_back(dev, b->x, n, L, d, C, B); /* B = S^T C0 */
        double t2 = now_s();
        gvq_powersgd_orthonormalize(B, L, d);
        double t3 = now_s();
        memcpy(b->y, b->x, sizeof(float) * n * L); /* the sweep below writes e over S */
        double t4 = now_s();
        gvq_powersgd_project_residual(dev, b->y, n, L, d, U, C);
        double t5 = now_s();
        gvq_powersgd_expand(dev, n, L, d, C, U, 1.0f, 0.0f, b->z); /* y = C U^T */
        double t6 = now_s();
        double dt[NT] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5};
        for (int k = 0; k < NT; k++)
            t[k] = dt[k] < t[k] ? dt[k] : t[k];
    }
    const char *names[NT] = {"P = S U",    "Q = S^T P",           "orthonormalise",
                             "(the copy)", "P = S U, S -= P U^T", "expand (output)"};
    double total = 0;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "track d %zu", d);
    for (int k = 0; k < NT; k++)
        if (k != 3) /* the bench's copy, not the method's */
            total += step_row(b, prefix, names[k], t[k], n * L);
    /* per call: each product once; nothing per hop (factor rings of fp32 sums) */
    out->name = d == 16 ? "gradiveq track d 16 (ratio 8)" : "gradiveq track d 32 (ratio 4)";
    out->pre = total;
    out->enc = out->hop = out->dec = 0;
    out->wire = 3.0 * (2.0 * (double)n + (double)L) * (double)d * 4.0 / 3.0 / (double)(n * L);
    free(U);
    free(C);
    free(B);
}

/* PowerSGD at rank r with error feedback on the tensor as a near-square n x m matrix (as the
 * method shapes a flat one): x = g + e into M with both norms, P = M Q, P's orthonormalisation,
 * Q = M^T P (BLAS), the residual M - P Q^T, its copy and norm, the output P Q^T (methods/
 * powersgd.c); each once per call, nothing per hop (two factor rings of fp32 sums). */
static void powersgd_rows(bench_t *b, size_t r, cost_t *out) {
    if (b->filter != NULL && strstr("powersgd", b->filter) == NULL) return;
    size_t m = (size_t)ceil(sqrt((double)b->n)), n = b->n / m;
    float *P = malloc(sizeof(float) * n * r), *Q = malloc(sizeof(float) * m * r);
    float *Qs = malloc(sizeof(float) * m * r);
    if (P == NULL || Q == NULL || Qs == NULL) exit(1);
    gvq_powersgd_init_q(Q, m, r, 1);
    const gvq_device_ops_t *dev = &gvq_host_device;
    const gvq_kernels_t *k = gvq_kernels();
    enum { NT = 7 };
    double t[NT];
    for (int i = 0; i < NT; i++)
        t[i] = 1e30;
    for (int rep = 0; rep < b->reps; rep++) {
        double gs, xs, s[NT + 1];
        s[0] = now_s();
        k->ef_prepare(b->x, b->z, n * m, b->y, &gs, &xs); /* b->z: the residual */
        s[1] = now_s();
        gvq_powersgd_project(dev, b->y, n, m, r, Q, P);
        s[2] = now_s();
        gvq_powersgd_orthonormalize(P, n, r);
        s[3] = now_s();
        gvq_powersgd_back(dev, b->y, n, m, r, P, Qs);
        s[4] = now_s();
        gvq_powersgd_expand(dev, n, m, r, P, Qs, -1.0f, 1.0f, b->y);
        s[5] = now_s();
        k->sumsq8(b->y, (float *)b->w1, n * m); /* the residual kept, its norm */
        s[6] = now_s();
        gvq_powersgd_expand(dev, n, m, r, P, Qs, 1.0f, 0.0f, (float *)b->w2);
        s[7] = now_s();
        for (int i = 0; i < NT; i++)
            t[i] = s[i + 1] - s[i] < t[i] ? s[i + 1] - s[i] : t[i];
    }
    const char *names[NT] = {
        "x = g + e, norms",    "P = M Q",     "orthonormalise P", "Q = M^T P", "residual M - P Q^T",
        "residual kept, norm", "output P Q^T"};
    double total = 0;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "powersgd r %zu", r);
    for (int i = 0; i < NT; i++)
        total += step_row(b, prefix, names[i], t[i], n * m);
    out->name = "powersgd rank 4 (error feedback)";
    out->pre = total;
    out->enc = out->hop = out->dec = 0;
    out->wire = (double)(n + m) * (double)r * 4.0 / (double)(n * m);
    free(P);
    free(Q);
    free(Qs);
}

static void collocate_rows(bench_t *b) {
    size_t K = 64, D = 64, H = 3, W = 3, per = K * D * H * W, m = b->n / per * per;
    const char *names[2] = {"collocate (64x64x3x3 filters)", "uncollocate"};
    for (int k = 0; k < 2; k++) {
        if (b->filter != NULL && strstr(names[k], b->filter) == NULL) continue;
        double best = 1e30;
        for (int r = 0; r < b->reps; r++) {
            double t0 = now_s();
            for (size_t o = 0; o < m; o += per)
                (k == 0 ? gvq_collocate : gvq_uncollocate)(b->x + o, b->y + o, K, D, H, W);
            double t = now_s() - t0;
            best = t < best ? t : best;
        }
        double gbs = 4.0 * (double)m / best / 1e9;
        printf("  %-34s %8.2f GB/s  %5.2f of memcpy  %6.3f ns/value\n", names[k], gbs,
               gbs / b->memcpy_gbs, best / (double)m * 1e9);
    }
}

static double ef_norm_row(bench_t *b) {
    if (b->filter != NULL && strstr("error feedback norm", b->filter) == NULL) return 0;
    double best = 1e30, s = 0;
    for (int r = 0; r < b->reps; r++) {
        double t0 = now_s();
        s += gvq_ef_norm(b->x, b->n);
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    double gbs = 4.0 * (double)b->n / best / 1e9;
    printf("  %-34s %8.2f GB/s  %5.2f of memcpy  %6.3f ns/value\n", "error feedback norm", gbs,
           gbs / b->memcpy_gbs, best / (double)b->n * 1e9);
    return s;
}

/* The core's sgemm rate on a large square product (GFLOP/s): the ceiling of the GEMM-bound
 * codecs (GradiVeQ: 2 d flops per value each way; the tracked basis: 5 products). */
static double sgemm_peak(bench_t *b) {
    int m = 1024;
    float *A = b->x, *B = b->x + (size_t)m * m, *C = b->y;
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        gvq_host_device.sgemm(0, 0, m, m, m, 1.0f, A, m, B, m, 0.0f, C, m);
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    return 2.0 * m * m * (double)m / best / 1e9;
}

static void usage(void) {
    fprintf(stderr, "gvq-codec-bench [-n MiB] [-r reps] [-c chunk_bytes] [-k substring] "
                    "[-s scalar|avx2|avx512]\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (getenv("OPENBLAS_NUM_THREADS") == NULL) { /* one core: BLAS too (read when it loads) */
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
        execv("/proc/self/exe", argv);
    }
    bench_t b = {0};
    size_t mib = 64, chunk_bytes = 1 << 18;
    const char *path = NULL;
    b.reps = 5;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) usage();
        if (strcmp(argv[i], "-n") == 0)
            mib = strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "-r") == 0)
            b.reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "-c") == 0)
            chunk_bytes = strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "-k") == 0)
            b.filter = argv[++i];
        else if (strcmp(argv[i], "-s") == 0)
            path = argv[++i];
        else
            usage();
    }
    if (mib < 1 || b.reps < 1 || chunk_bytes < 4096) usage();
    if (path != NULL && gvq_kernels_force(path) != 0) {
        fprintf(stderr, "gvq-codec-bench: this CPU or build has no '%s' kernels\n", path);
        return 2;
    }
    b.n = mib << 18;
    b.chunk = chunk_bytes / sizeof(float);
    b.x = buf64(b.n);
    b.y = buf64(b.n);
    b.z = buf64(b.n);
    b.w1 = malloc(sizeof(float) * b.n + 64);
    b.w2 = malloc(sizeof(float) * b.n + 64);
    if (!b.x || !b.y || !b.z || !b.w1 || !b.w2) return 1;
    uint32_t st = 12345;
    for (size_t i = 0; i < b.n; i++) { /* a gradient-like spread of magnitudes and signs */
        st = st * 1664525u + 1013904223u;
        float u = (float)(st >> 8) / 16777216.0f - 0.5f;
        b.x[i] = u * u * u * 0.1f;
        b.z[i] = u * 0.001f;
    }
    memset(b.y, 0, sizeof(float) * b.n);
    memset(b.w1, 0, sizeof(float) * b.n + 64);
    memset(b.w2, 0, sizeof(float) * b.n + 64);
    const char *f = b.filter;
    b.filter = NULL;
    b.memcpy_gbs = 1;
    double t_copy = sweep(&b, k_memcpy);
    b.memcpy_gbs = 4.0 * (double)b.n / t_copy / 1e9;
    printf("# gvq-codec-bench: %zu MiB of fp32, chunks of %zu bytes, best of %d; kernels: %s\n",
           mib, chunk_bytes, b.reps, gvq_kernels()->name);
    printf("  %-34s %8.2f GB/s  %5.2f of memcpy  %6.3f ns/value\n", "memcpy", b.memcpy_gbs, 1.0,
           t_copy / (double)b.n * 1e9);
    double t_add = row(&b, "plain ring add (y += x)", k_add);
    b.filter = f;
    cost_t cost[8] = {{0}};
    int nc = 0;
    qsgd_rows(&b, 2, &cost[nc++]);
    qsgd_rows(&b, 4, &cost[nc++]);
    qsgd_rows(&b, 8, &cost[nc++]);
    intsum_rows(&b, 4, &cost[nc++]);
    gradiveq_rows(&b, &cost[nc++]);
    track_rows(&b, 16, &cost[nc++]);
    track_rows(&b, 32, &cost[nc++]);
    powersgd_rows(&b, 4, &cost[nc++]);
    collocate_rows(&b);
    row(&b, "error feedback add (x = g + e)", k_ef_add);
    ef_norm_row(&b);
    row(&b, "fp32 -> fp16", k_half);
    row(&b, "fp16 -> fp32", k_unhalf);
    row(&b, "fp32 -> bf16", k_bf16);
    row(&b, "bf16 -> fp32", k_unbf16);
    if (f != NULL) return 0;
    double peak = sgemm_peak(&b), gq = 2.0 * 32 * 2; /* encode + decode flops per value, d 32 */
    printf("  %-34s %8.1f GFLOP/s (1024^3); gradiveq d 32 encode+decode at %.1f GFLOP/s = %.2f "
           "of it\n",
           "sgemm peak", peak, gq / (cost[4].enc + cost[4].dec),
           gq / (cost[4].enc + cost[4].dec) / peak);
    printf("\n# break-even link rate (Gbit/s; below it the codec's ring beats the plain ring; "
           "compute and transfer not overlapped)\n");
    printf("  %-32s %9s %8s %8s %8s %8s\n", "codec", "wire B/v", "N=2", "N=4", "N=8", "N=64");
    const int Ns[4] = {2, 4, 8, 64};
    for (int c = 0; c < nc; c++) {
        printf("  %-32s %9.3f", cost[c].name, cost[c].wire);
        for (int k = 0; k < 4; k++)
            printf(" %8.1f", breakeven_gbit(&cost[c], t_add, Ns[k]));
        printf("\n");
    }
    free(b.x);
    free(b.y);
    free(b.z);
    free(b.w1);
    free(b.w2);
    return 0;
}
