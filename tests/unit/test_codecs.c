/*
 * test_codecs.c -- the GradiVeQ and QSGD codecs against independent references:
 * collocation order and round trip; PCA on synthetic data of known rank (d equals the rank,
 * reconstruction below eps) and NaN refusal; GradiVeQ linearity as a property (sum of the ranks'
 * compressed slices = compression of the summed slices); the full compressed ring on 1..5
 * in-process ranks against a double-precision projection, bitwise identical on every rank;
 * QSGD unbiasedness and its variance bound, and the QSGD ring.
 */
#include <math.h>

#include "gvq_test.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* uniform [0, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static double nrand(void) { /* standard normal */
    double u = urand() + 1e-12, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static void test_collocation(void) {
    size_t K = 3, D = 2, H = 2, W = 3, n = K * D * H * W;
    float src[36], dst[36], back[36];
    for (size_t i = 0; i < n; i++)
        src[i] = (float)i; /* src[((k*D+d)*H+h)*W+w] */
    gvq_collocate(src, dst, K, D, H, W);
    /* the first K values are the K filters at (d=0,h=0,w=0), then (d=1,h=0,w=0) (depth first),
     * then (d=0,h=0,w=1) (width next), and height last */
    for (size_t k = 0; k < K; k++) {
        EXPECT(dst[k] == (float)((k * D + 0) * H * W), "collocated[%zu] = %g", k, dst[k]);
        EXPECT(dst[K + k] == (float)((k * D + 1) * H * W), "depth next: [%zu] = %g", K + k,
               dst[K + k]);
        EXPECT(dst[D * K + k] == (float)((k * D) * H * W + 1), "width next: [%zu] = %g", D * K + k,
               dst[D * K + k]);
        EXPECT(dst[W * D * K + k] == (float)((k * D) * H * W + W), "height last: [%zu] = %g",
               W * D * K + k, dst[W * D * K + k]);
    }
    gvq_uncollocate(dst, back, K, D, H, W);
    EXPECT(memcmp(src, back, sizeof src) == 0, "uncollocate does not invert collocate");
    for (int trial = 0; trial < 20; trial++) {
        size_t k = 1 + (size_t)(urand() * 40), d = 1 + (size_t)(urand() * 5),
               h = 1 + (size_t)(urand() * 4), w = 1 + (size_t)(urand() * 4), m = k * d * h * w;
        float *a = malloc(m * 4), *b = malloc(m * 4), *c = malloc(m * 4);
        for (size_t i = 0; i < m; i++)
            a[i] = (float)nrand();
        gvq_collocate(a, b, k, d, h, w);
        int bad = 0; /* the definition, element by element (blocks of 16 filters and a rest) */
        for (size_t kk = 0; kk < k; kk++)
            for (size_t dd = 0; dd < d; dd++)
                for (size_t hh = 0; hh < h; hh++)
                    for (size_t ww = 0; ww < w; ww++)
                        bad += b[((hh * w + ww) * d + dd) * k + kk] !=
                               a[((kk * d + dd) * h + hh) * w + ww];
        EXPECT(bad == 0, "collocate %zux%zux%zux%zu: %d values misplaced", k, d, h, w, bad);
        gvq_uncollocate(b, c, k, d, h, w);
        EXPECT(memcmp(a, c, m * 4) == 0, "round trip %zux%zux%zux%zu", k, d, h, w);
        free(a), free(b), free(c);
    }
}

/* T samples of length L: mean + sum of r random directions with random weights. */
static float *make_lowrank(size_t L, size_t T, size_t r, float **dirs_out) {
    float *dirs = malloc(sizeof(float) * L * r), *s = malloc(sizeof(float) * L * T);
    for (size_t i = 0; i < L * r; i++)
        dirs[i] = (float)nrand();
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < L; i++)
            s[t * L + i] = (float)(0.5 * sin((double)i)); /* the mean */
    for (size_t t = 0; t < T; t++) {
        double a[16];
        for (size_t j = 0; j < r; j++)
            a[j] = nrand() * (double)(r - j);
        for (size_t i = 0; i < L; i++) {
            double v = s[t * L + i];
            for (size_t j = 0; j < r; j++)
                v += a[j] * dirs[j * L + i];
            s[t * L + i] = (float)v;
        }
    }
    *dirs_out = dirs;
    return s;
}

static void test_pca(void) {
    size_t L = 64;
    /* T = 80 >= L takes the covariance route, T = 40 < L the Gram route */
    for (size_t T = 80, pass = 0; pass < 2; pass++, T = 40)
        for (size_t r = 1; r <= 6; r += 5) {
            float *dirs, *s = make_lowrank(L, T, r, &dirs);
            float *U = malloc(sizeof(float) * L * L), *Z = malloc(sizeof(float) * L);
            size_t d = 0;
            double kept = 0;
            EXPECT_RES(gvq_pca_fit(&gvq_host_device, L, T, s, 1e-4, 0, U, Z, &d, &kept),
                       gvqSuccess);
            EXPECT(d == r, "PCA of rank-%zu data kept d=%zu", r, d);
            EXPECT(kept >= 1 - 1e-4, "kept energy %g", kept);
            /* columns orthonormal */
            for (size_t a = 0; a < d; a++)
                for (size_t b = 0; b <= a; b++) {
                    double dot = 0;
                    for (size_t i = 0; i < L; i++)
                        dot += (double)U[a * L + i] * U[b * L + i];
                    EXPECT(fabs(dot - (a == b)) < 1e-4, "U^T U (%zu,%zu) = %g", a, b, dot);
                }
            /* a fresh sample of the same subspace reconstructs: x_hat = U U^T (x - Z) + Z */
            float *x = malloc(sizeof(float) * L);
            for (size_t i = 0; i < L; i++)
                x[i] = (float)(0.5 * sin((double)i));
            for (size_t j = 0; j < r; j++) {
                double a = nrand();
                for (size_t i = 0; i < L; i++)
                    x[i] += (float)(a * dirs[j * L + i]);
            }
            double err = 0, nx = 0;
            for (size_t i = 0; i < L; i++) {
                double rec = Z[i];
                for (size_t j = 0; j < d; j++) {
                    double c = 0;
                    for (size_t q = 0; q < L; q++)
                        c += (double)U[j * L + q] * (x[q] - Z[q]);
                    rec += c * U[j * L + i];
                }
                err += (rec - x[i]) * (rec - x[i]);
                nx += (double)(x[i] - Z[i]) * (x[i] - Z[i]);
            }
            EXPECT(sqrt(err / nx) < 1e-2, "rank-%zu reconstruction error %g", r, sqrt(err / nx));
            /* dmax caps d */
            EXPECT_RES(gvq_pca_fit(&gvq_host_device, L, T, s, 1e-4, 1, U, Z, &d, &kept),
                       gvqSuccess);
            EXPECT(d == 1, "dmax 1 gave d=%zu", d);
            /* NaN refusal */
            s[T * L / 2] = NAN;
            EXPECT_RES(gvq_pca_fit(&gvq_host_device, L, T, s, 1e-4, 0, U, Z, &d, &kept),
                       gvqInvalidArgument);
            EXPECT(strstr(gvqGetLastError(NULL), "non-finite") != NULL, "warn: %s",
                   gvqGetLastError(NULL));
            free(dirs), free(s), free(U), free(Z), free(x);
        }
}

/* The covariance and Gram routes agree: same d, same kept energy, same subspace (projectors
 * U U^T equal), both orthonormal; the Gram route falls back cleanly on identical samples. */
static void test_pca_routes(void) {
    const size_t Ls[] = {48, 256}, Ts[] = {20, 100};
    for (int k = 0; k < 2; k++) {
        size_t L = Ls[k], T = Ts[k], r = 5;
        float *dirs, *s = make_lowrank(L, T, r, &dirs);
        for (size_t i = 0; i < L * T; i++)
            s[i] += (float)(1e-3 * nrand()); /* full rank */
        float *U1 = malloc(sizeof(float) * L * L), *U2 = malloc(sizeof(float) * L * L);
        float *Z1 = malloc(sizeof(float) * L), *Z2 = malloc(sizeof(float) * L);
        for (size_t i = 0; i < L * L; i++)
            U1[i] = U2[i] = NAN; /* what was there before */
        size_t d1 = 0, d2 = 0;
        double k1 = 0, k2 = 0;
        EXPECT_RES(gvq_pca_fit_method(&gvq_host_device, L, T, s, 1e-3, 0, U1, Z1, &d1, &k1,
                                      GVQ_PCA_COVARIANCE),
                   gvqSuccess);
        EXPECT_RES(
            gvq_pca_fit_method(&gvq_host_device, L, T, s, 1e-3, 0, U2, Z2, &d2, &k2, GVQ_PCA_GRAM),
            gvqSuccess);
        /* the compressor agrees on the largest d of its reuse groups, so a group's columns past
         * its own d are sent too: they must be zero, not leftovers */
        size_t nz1 = 0, nz2 = 0;
        for (size_t i = d1 * L; i < L * L; i++)
            nz1 += U1[i] != 0.0f;
        for (size_t i = d2 * L; i < L * L; i++)
            nz2 += U2[i] != 0.0f;
        EXPECT(nz1 == 0 && nz2 == 0,
               "L=%zu T=%zu: %zu (covariance) and %zu (Gram) values past "
               "column d are not zero",
               L, T, nz1, nz2);
        EXPECT(d1 == d2 && d1 == r, "L=%zu T=%zu: covariance d=%zu, Gram d=%zu, rank %zu", L, T, d1,
               d2, r);
        EXPECT(fabs(k1 - k2) < 1e-4, "kept energy %g vs %g", k1, k2);
        double worst = 0, orth = 0;
        for (size_t i = 0; i < L; i++)
            for (size_t q = 0; q < L; q++) {
                double p1 = 0, p2 = 0;
                for (size_t j = 0; j < d1 && j < d2; j++) {
                    p1 += (double)U1[j * L + i] * U1[j * L + q];
                    p2 += (double)U2[j * L + i] * U2[j * L + q];
                }
                worst = fmax(worst, fabs(p1 - p2));
            }
        for (size_t a = 0; a < d2; a++)
            for (size_t b = 0; b <= a; b++) {
                double dot = 0;
                for (size_t i = 0; i < L; i++)
                    dot += (double)U2[a * L + i] * U2[b * L + i];
                orth = fmax(orth, fabs(dot - (a == b)));
            }
        EXPECT(worst < 1e-3, "L=%zu T=%zu: projectors differ by %g", L, T, worst);
        EXPECT(orth < 1e-5, "L=%zu T=%zu: Gram route U^T U off identity by %g", L, T, orth);
        /* identical samples: zero variance, the Gram route must not divide by zero */
        for (size_t t = 1; t < T; t++)
            memcpy(s + t * L, s, sizeof(float) * L);
        EXPECT_RES(
            gvq_pca_fit_method(&gvq_host_device, L, T, s, 1e-3, 0, U2, Z2, &d2, &k2, GVQ_PCA_GRAM),
            gvqSuccess);
        int finite = 1;
        for (size_t i = 0; i < L * d2; i++)
            finite &= isfinite(U2[i]) != 0;
        EXPECT(d2 >= 1 && finite, "degenerate samples: d=%zu, U finite %d", d2, finite);
        free(dirs), free(s), free(U1), free(U2), free(Z1), free(Z2);
    }
}

/* A GradiVeQ compressor with random orthonormal U (from a PCA of random data) and random Z. */
typedef struct {
    size_t M, L, d, C, ngroups;
    float *U, *Z;
} gq_model_t;

static void gq_model_make(gq_model_t *m, size_t M, size_t L, size_t d, size_t C) {
    m->M = M, m->L = L, m->d = d, m->C = C;
    m->ngroups = GVQ_DIV_UP(M / L, C);
    size_t G = GVQ_MAX(m->ngroups, (size_t)1);
    m->U = malloc(sizeof(float) * L * L * G);
    m->Z = malloc(sizeof(float) * L * G);
    size_t T = L + 4;
    float *s = malloc(sizeof(float) * L * T), *Zfit = malloc(sizeof(float) * L);
    for (size_t g = 0; g < G; g++) {
        for (size_t i = 0; i < L * T; i++)
            s[i] = (float)nrand();
        size_t got = 0;
        float *Ug = malloc(sizeof(float) * L * L);
        gvq_pca_fit(&gvq_host_device, L, T, s, 0.0, d, Ug, Zfit, &got, NULL);
        memcpy(m->U + g * L * d, Ug, sizeof(float) * L * d);
        free(Ug);
        for (size_t i = 0; i < L; i++)
            m->Z[g * L + i] = (float)nrand();
    }
    free(s);
    free(Zfit);
}

static void gq_codec(const gq_model_t *m, int nranks, int fp16, gvq_gradiveq_t *g, gvq_codec_t *c) {
    memset(g, 0, sizeof *g);
    g->count = m->M, g->L = m->L, g->d = m->d, g->C = m->C, g->nranks = nranks, g->wire_fp16 = fp16;
    g->U = m->U, g->Z = m->Z;
    EXPECT_RES(gvq_gradiveq_prepare(g, &gvq_host_device), gvqSuccess);
    gvq_codec_gradiveq_init(c, &gvq_host_device, g);
}

static void test_linearity(void) {
    for (int trial = 0; trial < 30; trial++) {
        size_t L = 4 * (1 + (size_t)(urand() * 8)), d = 1 + (size_t)(urand() * (double)L / 2);
        size_t M = L * (1 + (size_t)(urand() * 12)) + (size_t)(urand() * (double)L);
        size_t C = 1 + (size_t)(urand() * 4);
        int N = 1 + (int)(urand() * 6);
        gq_model_t m;
        gq_model_make(&m, M, L, d, C);
        gvq_gradiveq_t gN, g1;
        gvq_codec_t cN, c1;
        gq_codec(&m, N, 0, &gN, &cN);
        gq_codec(&m, 1, 0, &g1, &c1);
        size_t wb = cN.wire_bytes(&cN, 0, M);
        float *x = malloc(sizeof(float) * M * (size_t)N), *sum = calloc(M, sizeof(float));
        char *acc = malloc(wb), *tmp = malloc(wb), *ref = malloc(wb);
        for (size_t i = 0; i < M * (size_t)N; i++)
            x[i] = (float)nrand();
        for (int n = 0; n < N; n++) {
            for (size_t i = 0; i < M; i++)
                sum[i] += x[(size_t)n * M + i];
            /* as the ring does: c = encode(x_n) + incoming */
            EXPECT_RES(cN.encode_combine(&cN, 0, M, x + (size_t)n * M, n ? acc : NULL, tmp),
                       gvqSuccess);
            memcpy(acc, tmp, wb);
        }
        EXPECT_RES(c1.encode_combine(&c1, 0, M, sum, NULL, ref), gvqSuccess);
        const float *a = (const float *)acc, *b = (const float *)ref;
        double worst = 0;
        for (size_t i = 0; i < wb / 4; i++)
            worst = fmax(worst, fabs(a[i] - b[i]) / (1 + fabs(b[i])));
        EXPECT(worst < 1e-4, "linearity M=%zu L=%zu d=%zu C=%zu N=%d: worst rel diff %g", M, L, d,
               C, N, worst);
        gvq_gradiveq_fini(&gN), gvq_gradiveq_fini(&g1);
        free(x), free(sum), free(acc), free(tmp), free(ref), free(m.U), free(m.Z);
    }
}

/* ---- the compressed ring on in-process ranks ------------------------------------------------ */

typedef struct {
    gq_model_t m;
    int fp16;
    int inplace;
    float *out[8];
    gvq_tally_t tally[8];
    double seen_all2[8],
        final_all2[8]; /* the codec's local norm when the tally asked, at the end */
    int calls[8];
} ring_case_t;

typedef struct {
    gvq_gradiveq_t *g;
    ring_case_t *rc;
    int rank;
} tally_arg_t;

static int32_t tally_value(void *arg) {
    tally_arg_t *a = arg;
    a->rc->seen_all2[a->rank] = a->g->local_all2;
    a->rc->calls[a->rank]++;
    return a->rank + 1;
}

static float gq_input(int rank, size_t i) {
    return (float)sin(0.37 * (double)i + rank) + 0.01f * (float)rank;
}

static void rank_gq(gvqComm_t comm, int rank, int nranks, void *arg) {
    ring_case_t *rc = arg;
    gvq_gradiveq_t g;
    gvq_codec_t codec;
    gq_codec(&rc->m, nranks, rc->fp16, &g, &codec);
    gvq_coll_ctx_t ctx = gvq_comm_ctx(comm, NULL);
    size_t M = rc->m.M;
    float *s = malloc(sizeof(float) * M), *d = rc->inplace ? s : malloc(sizeof(float) * M);
    for (size_t i = 0; i < M; i++)
        s[i] = gq_input(rank, i);
    /* the tally rides along: value rank + 1, asked for once every local encode is done */
    tally_arg_t ta = {&g, rc, rank};
    gvq_tally_t *t = &rc->tally[rank];
    t->value = tally_value, t->arg = &ta;
    EXPECT_RES(gvq_ring_allreduce_tally(&ctx, &codec, s, d, M, gvqSum, t), gvqSuccess);
    rc->final_all2[rank] = g.local_all2;
    rc->out[rank] = d;
    if (d != s) free(s);
    gvq_gradiveq_fini(&g);
}

static void test_compressed_ring(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    for (int n = 1; n <= 5; n++)
        for (int variant = 0; variant < 4; variant++) {
            ring_case_t rc;
            memset(&rc, 0, sizeof rc);
            size_t L = 16,
                   M = variant == 3 ? 5 : L * (7 + 13 * (size_t)variant) + (size_t)variant * 5;
            gq_model_make(&rc.m, M, L, 5, variant == 1 ? 1 : 3);
            rc.fp16 = variant == 2;
            rc.inplace = variant & 1;
            cfg.chunkBytes = 64 * (1 + variant); /* chunks of a few slices */
            gvq_test_run(n, &cfg, rank_gq, &rc);
            /* reference in double: x_hat = U U^T (sum - Z) + Z per full slice, raw sum in the tail
             */
            size_t full = M / L;
            double worst = 0;
            for (size_t j = 0; j < full; j++) {
                size_t grp = j / rc.m.C;
                const float *U = rc.m.U + grp * L * rc.m.d, *Z = rc.m.Z + grp * L;
                double c[16] = {0};
                for (size_t q = 0; q < rc.m.d; q++)
                    for (size_t i = 0; i < L; i++) {
                        double sum = 0;
                        for (int r = 0; r < n; r++)
                            sum += gq_input(r, j * L + i);
                        c[q] += (double)U[q * L + i] * (sum - Z[i]);
                    }
                for (size_t i = 0; i < L; i++) {
                    double want = Z[i];
                    for (size_t q = 0; q < rc.m.d; q++)
                        want += U[q * L + i] * c[q];
                    worst = fmax(worst, fabs(rc.out[0][j * L + i] - want));
                }
            }
            for (size_t i = full * L; i < M; i++) {
                double sum = 0;
                for (int r = 0; r < n; r++)
                    sum += gq_input(r, i);
                EXPECT(fabs(rc.out[0][i] - sum) < 1e-5, "tail [%zu]: %g vs %g", i, rc.out[0][i],
                       sum);
            }
            EXPECT(worst < (rc.fp16 ? 5e-2 : 1e-4),
                   "compressed ring n=%d variant %d: worst abs error %g", n, variant, worst);
            for (int r = 1; r < n; r++)
                EXPECT(memcmp(rc.out[r], rc.out[0], M * sizeof(float)) == 0,
                       "rank %d differs (n=%d variant %d)", r, n, variant);
            /* the tally: carried unless a segment is empty (variant 3: 5 values, one slice's
             * granule), the sum of all ranks' values when carried, each rank's own otherwise;
             * asked for once, after the rank's last local encode */
            int can_carry = n == 1 || variant != 3;
            for (int r = 0; r < n; r++) {
                EXPECT(rc.tally[r].carried == can_carry, "n=%d variant %d rank %d: carried %d", n,
                       variant, r, rc.tally[r].carried);
                int32_t want = rc.tally[r].carried ? n * (n + 1) / 2 : r + 1;
                EXPECT(rc.tally[r].sum == want, "n=%d variant %d rank %d: tally %d, want %d", n,
                       variant, r, (int)rc.tally[r].sum, (int)want);
                EXPECT(rc.calls[r] == 1, "n=%d variant %d rank %d: value asked %d times", n,
                       variant, r, rc.calls[r]);
                EXPECT(rc.seen_all2[r] == rc.final_all2[r],
                       "n=%d variant %d rank %d: asked before the last encode (norm %g of %g)", n,
                       variant, r, rc.seen_all2[r], rc.final_all2[r]);
            }
            for (int r = 0; r < n; r++)
                free(rc.out[r]);
            free(rc.m.U), free(rc.m.Z);
        }
}

/* ---- QSGD ----------------------------------------------------------------------------------- */

static void test_qsgd_statistics(void) {
    const size_t n = 256;
    float v[256], q[256];
    double vv = 0;
    for (size_t i = 0; i < n; i++)
        v[i] = (float)nrand(), vv += (double)v[i] * v[i];
    for (int norm = 0; norm < 2; norm++) {
        gvq_qsgd_t qs;
        EXPECT_RES(gvq_qsgd_init(&qs, 4, n, norm, 7, 0), gvqSuccess);
        gvq_codec_t c;
        gvq_codec_qsgd_init(&c, &gvq_host_device, &qs);
        EXPECT(c.wire_bytes(&c, 0, n) == 4 + n / 2, "4-bit wire %zu bytes", c.wire_bytes(&c, 0, n));
        char wire[4 + 128];
        double mean[256] = {0}, var = 0;
        const int trials = 4000;
        for (int t = 0; t < trials; t++) {
            qs.call = (uint32_t)t; /* a new random counter per call */
            c.encode_combine(&c, 0, n, v, NULL, wire);
            c.decode(&c, 0, n, wire, q);
            for (size_t i = 0; i < n; i++) {
                mean[i] += q[i];
                var += ((double)q[i] - v[i]) * ((double)q[i] - v[i]);
            }
        }
        double worst = 0, scale = 0;
        for (size_t i = 0; i < n; i++) {
            worst = fmax(worst, fabs(mean[i] / trials - v[i]));
            scale = fmax(scale, fabs(v[i]));
        }
        /* unbiased: the mean over trials approaches v, within a few standard errors */
        EXPECT(worst < 0.05 * scale, "QSGD (%s norm) mean deviates by %g (max |v| %g)",
               norm ? "max" : "L2", worst, scale);
        var /= trials;
        if (norm ==
            GVQ_QSGD_NORM_L2) { /* Lemma 3.1: E||Q(v) - v||^2 <= min(n/s^2, sqrt(n)/s) ||v||^2 */
            double s = qs.levels, bound = fmin(n / (s * s), sqrt((double)n) / s) * vv;
            EXPECT(var <= bound, "QSGD variance %g above the bound %g", var, bound);
        }
        gvq_qsgd_fini(&qs);
    }
    /* a NaN bucket decodes to NaN; a zero bucket to zeros */
    gvq_qsgd_t qs;
    gvq_qsgd_init(&qs, 8, 4, GVQ_QSGD_NORM_MAX, 1, 0);
    gvq_codec_t c;
    gvq_codec_qsgd_init(&c, &gvq_host_device, &qs);
    float x[8] = {1, NAN, 2, 3, 0, 0, 0, 0}, y[8];
    char w[64];
    c.encode_combine(&c, 0, 8, x, NULL, w);
    c.decode(&c, 0, 8, w, y);
    EXPECT(isnan(y[0]) && isnan(y[3]) && y[4] == 0 && y[7] == 0, "NaN/zero buckets: %g %g %g", y[0],
           y[3], y[4]);
    gvq_qsgd_fini(&qs);
    EXPECT_RES(gvq_qsgd_init(&qs, 3, 4, 0, 1, 0), gvqInvalidArgument);
}

typedef struct {
    size_t M;
    float *out[8];
} qring_case_t;

static void rank_qsgd(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)nranks;
    qring_case_t *qc = arg;
    gvq_qsgd_t qs;
    gvq_qsgd_init(&qs, 8, 64, GVQ_QSGD_NORM_MAX, 99, (uint32_t)rank);
    gvq_codec_t codec;
    gvq_codec_qsgd_init(&codec, comm->dev, &qs);
    gvq_coll_ctx_t ctx = gvq_comm_ctx(comm, NULL);
    float *s = malloc(sizeof(float) * qc->M), *d = malloc(sizeof(float) * qc->M);
    for (size_t i = 0; i < qc->M; i++)
        s[i] = gq_input(rank, i);
    EXPECT_RES(gvq_ring_allreduce(&ctx, &codec, s, d, qc->M, gvqAvg), gvqSuccess);
    qc->out[rank] = d;
    free(s);
    gvq_qsgd_fini(&qs);
}

static void test_qsgd_ring(void) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.chunkBytes = 1024;
    for (int n = 1; n <= 5; n++) {
        qring_case_t qc = {5000, {0}};
        gvq_test_run(n, &cfg, rank_qsgd, &qc);
        double err = 0, norm = 0;
        for (size_t i = 0; i < qc.M; i++) {
            double avg = 0;
            for (int r = 0; r < n; r++)
                avg += gq_input(r, i);
            avg /= n;
            err += (qc.out[0][i] - avg) * (qc.out[0][i] - avg);
            norm += avg * avg;
        }
        /* 8-bit QSGD (127 levels, max norm) over up to 4 hops: a few percent at most */
        EXPECT(sqrt(err / norm) < 0.05, "QSGD ring n=%d relative error %g", n, sqrt(err / norm));
        for (int r = 1; r < n; r++)
            EXPECT(memcmp(qc.out[r], qc.out[0], qc.M * sizeof(float)) == 0,
                   "QSGD ring rank %d differs", r);
        for (int r = 0; r < n; r++)
            free(qc.out[r]);
    }
}

/* Integer-summed wires refuse what would overflow or cannot be: bits other than 8/16, and a
 * communicator where each rank would get less than one level; lv follows the documented rule. */
static void test_intsum_headroom(void) {
    gvq_intsum_t s;
    EXPECT_RES(gvq_intsum_init(&s, 12, 0, 64, NULL, &gvq_host_device, 256, 4, 0, 0),
               gvqInvalidArgument);
    EXPECT(strstr(gvqGetLastError(NULL), "bits=12") != NULL, "warn: %s", gvqGetLastError(NULL));
    EXPECT_RES(gvq_intsum_init(&s, 8, 0, 64, NULL, &gvq_host_device, 256, 128, 0, 0),
               gvqInvalidArgument);
    EXPECT(strstr(gvqGetLastError(NULL), "128 ranks") != NULL, "warn: %s", gvqGetLastError(NULL));
    struct {
        int bits, cap, n, lv;
    } cases[] = {{8, 0, 127, 1}, {8, 0, 4, 31}, {8, 7, 4, 7}, {16, 0, 4, 8191}, {16, 127, 5, 127}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        EXPECT_RES(gvq_intsum_init(&s, cases[k].bits, cases[k].cap, 64, NULL, &gvq_host_device, 256,
                                   cases[k].n, 0, 0),
                   gvqSuccess);
        EXPECT(s.levels == cases[k].lv, "int%d, cap %d, %d ranks: lv %d, want %d", cases[k].bits,
               cases[k].cap, cases[k].n, s.levels, cases[k].lv);
        EXPECT(cases[k].n * s.levels <= (1 << (cases[k].bits - 1)) - 1, "N lv overflows");
        EXPECT(s.nscales == 4, "256 values in blocks of 64: %zu scales", s.nscales);
        gvq_intsum_fini(&s);
    }
}

int main(void) {
    test_collocation();
    test_pca();
    test_pca_routes();
    test_linearity();
    test_compressed_ring();
    test_qsgd_statistics();
    test_qsgd_ring();
    test_intsum_headroom();
    return gvq_test_finish("test_codecs");
}
