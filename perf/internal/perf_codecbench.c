/*
 * perf_codecbench.c -- GradiVeQ's codec and PCA fit timed directly (see perf_codecbench.h).
 *
 *   overlap:   x --encode_combine(chunk, received wire)--> wire --decode(chunk)--> y
 *              every chunk of the vector once each way: per rank, the ring encodes every
 *              segment once (its own at step 0, the others combined with what arrives) and
 *              decodes every segment once (its own at the end of the reduce-scatter, the others
 *              in the allgather), so this is the compute one allreduce asks of one rank.
 *   fit bench: gvq_pca_fit (Gram route when T < L), plus the covariance route's L x L sgemm
 *   and ssyevd on their own.
 */
#include "perf_codecbench.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gvq_algo.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

size_t cb_chunk_bytes(void) {
    /* as gvqCompressorCreate (src/compress/compressor.c): out-of-range values give 256 KiB */
    int64_t c = gvq_param(GVQ_PARAM_CODEC_CHUNK_BYTES);
    return c < 1024 || c > (1 << 30) ? (size_t)1 << 18 : (size_t)c;
}

struct cb_gradiveq {
    gvq_gradiveq_t gq;
    gvq_codec_t codec;
    float *U, *Z;
    char *wire, *in;
    float *y;
    size_t count, wire_bytes;
};

void cb_gradiveq_free(cb_gradiveq_t *g) {
    if (g == NULL) return;
    gvq_gradiveq_fini(&g->gq);
    free(g->U);
    free(g->Z);
    free(g->wire);
    free(g->in);
    free(g->y);
    free(g);
}

cb_gradiveq_t *cb_gradiveq_create(size_t count, size_t L, size_t d, int nranks, int wire_fp16,
                                  const float *samples, size_t T, char *err, size_t errlen) {
    if (L == 0 || d == 0 || d > L || count < L) {
        snprintf(err, errlen, "codec bench: L=%zu d=%zu count=%zu", L, d, count);
        return NULL;
    }
    cb_gradiveq_t *g = calloc(1, sizeof *g);
    if (g == NULL) goto err_nomem;
    g->count = count;
    g->U = malloc(sizeof(float) * L * L);
    g->Z = malloc(sizeof(float) * L);
    if (g->U == NULL || g->Z == NULL) goto err_nomem;
    /* eps ~ 0: keep every dimension up to the cap, so d is exactly the compressor's */
    size_t got = 0;
    double kept = 0;
    if (gvq_pca_fit(&gvq_host_device, L, T, samples, 1e-12, d, g->U, g->Z, &got, &kept) !=
        gvqSuccess) {
        snprintf(err, errlen, "codec bench: gvq_pca_fit failed (%s)", gvqGetLastError(NULL));
        cb_gradiveq_free(g);
        return NULL;
    }
    if (got != d) {
        snprintf(err, errlen, "codec bench: the fit kept %zu dimensions, not %zu", got, d);
        cb_gradiveq_free(g);
        return NULL;
    }
    g->gq.count = count;
    g->gq.L = L;
    g->gq.d = d;
    g->gq.C = count / L; /* one compressor for the tensor, the library's default */
    g->gq.nranks = nranks;
    g->gq.wire_fp16 = wire_fp16;
    g->gq.U = g->U;
    g->gq.Z = g->Z;
    if (gvq_gradiveq_prepare(&g->gq, &gvq_host_device) != gvqSuccess) {
        snprintf(err, errlen, "codec bench: gvq_gradiveq_prepare failed (%s)",
                 gvqGetLastError(NULL));
        cb_gradiveq_free(g);
        return NULL;
    }
    gvq_codec_gradiveq_init(&g->codec, &gvq_host_device, &g->gq);
    g->wire_bytes = g->codec.wire_bytes(&g->codec, 0, count);
    g->wire = malloc(g->wire_bytes + 64);
    g->in = calloc(g->wire_bytes + 64, 1);
    g->y = malloc(sizeof(float) * count);
    if (g->wire == NULL || g->in == NULL || g->y == NULL) goto err_nomem;
    memset(g->wire, 0, g->wire_bytes);
    memset(g->y, 0, sizeof(float) * count);
    return g;
err_nomem:
    snprintf(err, errlen, "codec bench: out of memory");
    cb_gradiveq_free(g);
    return NULL;
}

int cb_gradiveq_run(cb_gradiveq_t *g, const float *x, size_t chunk_bytes, double *enc_s,
                    double *dec_s) {
    const gvq_codec_t *c = &g->codec;
    size_t L = g->gq.L;
    /* the ring's chunk: chunk_bytes of values, whole slices (the codec's granule) */
    size_t ce = (chunk_bytes / sizeof(float)) / L * L;
    if (ce < L) ce = L;
    g->gq.local_x2 = g->gq.local_c2 = g->gq.local_all2 = 0;
    double t0 = now_s();
    size_t woff = 0;
    for (size_t off = 0; off < g->count; off += ce) {
        size_t len = g->count - off < ce ? g->count - off : ce;
        if (c->encode_combine(c, off, len, x + off, g->in + woff, g->wire + woff) != gvqSuccess)
            return -1;
        woff += c->wire_bytes(c, off, len);
    }
    double t1 = now_s();
    woff = 0;
    for (size_t off = 0; off < g->count; off += ce) {
        size_t len = g->count - off < ce ? g->count - off : ce;
        if (c->decode(c, off, len, g->wire + woff, g->y + off) != gvqSuccess) return -1;
        woff += c->wire_bytes(c, off, len);
    }
    double t2 = now_s();
    *enc_s = t1 - t0;
    *dec_s = t2 - t1;
    return 0;
}

int cb_fit_time(size_t L, size_t T, const float *samples, double eps, size_t dmax, size_t *d,
                double *kept, double *fit_s, double *cov_s, double *eig_s, char *err,
                size_t errlen) {
    const gvq_device_ops_t *dev = &gvq_host_device;
    float *U = malloc(sizeof(float) * L * L), *Z = malloc(sizeof(float) * L);
    float *xc = malloc(sizeof(float) * L * T), *w = malloc(sizeof(float) * L);
    int rc = -1;
    if (U == NULL || Z == NULL || xc == NULL || w == NULL) {
        snprintf(err, errlen, "fit bench: out of memory (L=%zu)", L);
        goto out_free;
    }
    double t0 = now_s();
    if (gvq_pca_fit(dev, L, T, samples, eps, dmax, U, Z, d, kept) != gvqSuccess) {
        snprintf(err, errlen, "fit bench: gvq_pca_fit failed (%s)", gvqGetLastError(NULL));
        goto out_free;
    }
    double t1 = now_s();
    /* the two heavy steps on their own: covariance (one sgemm) and the eigen-solve */
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < L; i++)
            xc[t * L + i] = samples[t * L + i] - Z[i];
    double t2 = now_s();
    if (dev->sgemm(0, 1, (int)L, (int)L, (int)T, 1.0f / (float)T, xc, (int)L, xc, (int)L, 0.0f, U,
                   (int)L) != gvqSuccess) {
        snprintf(err, errlen, "fit bench: sgemm failed");
        goto out_free;
    }
    double t3 = now_s();
    if (dev->ssyevd((int)L, U, (int)L, w) != gvqSuccess) {
        snprintf(err, errlen, "fit bench: ssyevd failed (%s)", gvqGetLastError(NULL));
        goto out_free;
    }
    double t4 = now_s();
    *fit_s = t1 - t0;
    *cov_s = t3 - t2;
    *eig_s = t4 - t3;
    rc = 0;
out_free:
    free(U);
    free(Z);
    free(xc);
    free(w);
    return rc;
}
