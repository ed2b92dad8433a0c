/*
 * codec_gradiveq.c -- GradiVeQ (Yu et al., NeurIPS 2018; docs/ALGORITHMS.md section 2) as a ring
 * codec, plus the filter-collocation permutation it runs on.
 *
 * The collocated vector is cut into slices of L values; slice j belongs to reuse group j / C,
 * whose compressor is (U_g: L x d, Z_g: L). A chunk of the ring holds whole slices (the codec's
 * granule is L), so each reuse group's slices in a chunk form an L x k matrix X and
 *
 *     encode:  C = U_g^T X - (U_g^T Z_g / N) 1^T (+ incoming C')     one projection per group
 *     decode:  X = U_g C + Z_g 1^T                                      one expand per group
 *
 * On the host both products are the codec kernels' (codec_linalg.h: each coefficient and each
 * decoded value one chain of fused multiply-adds in a fixed order), so every rank decodes the
 * summed coefficients to the same bits whatever its CPU; with BLAS the decode took the CPU's own
 * kernels and ranks on different CPUs disagreed (tests/mpi: the *_blas_mixed_np3 jobs). Other
 * devices run their sgemm.
 *
 * Coefficients are linear in X, so the ring adds them as they arrive (compressed-domain
 * aggregation) and decodes once per chunk. The tail shorter than L is sent as raw floats.
 *
 *     wire of a chunk:  [ d coefficients of slice 0 ][ ... of slice k-1 ][ raw tail ]
 *                        fp32, or IEEE half when wire_fp16 (then combine works in fp32;
 *                        the block is padded to 4 bytes so the fp32 tail stays aligned)
 */
#include <stdlib.h>

#include "codec_kernels.h"
#include "gvq_algo.h"

/* Whole slices and tail elements of [off, off+count). off is a multiple of L (the granule), so
 * only the chunk at the end of the tensor has a tail. */
static void gq_split(const gvq_gradiveq_t *g, size_t off, size_t count, size_t *slices,
                     size_t *tail) {
    (void)off;
    *slices = count / g->L;
    *tail = count % g->L;
}

/* Bytes of the coefficient block on the wire, padded to 4 so the fp32 tail behind it stays
 * aligned when the coefficients travel as fp16. */
static size_t gq_coef_bytes(const gvq_gradiveq_t *g, size_t slices) {
    size_t b = slices * g->d * (g->wire_fp16 ? 2 : 4);
    return (b + 3) & ~(size_t)3;
}

size_t gvq_gradiveq_wire_size(size_t L, size_t d, int wire_fp16, size_t count) {
    size_t b = count / L * d * (wire_fp16 ? 2 : 4);
    return ((b + 3) & ~(size_t)3) + count % L * sizeof(float);
}

static size_t gq_wire_bytes(const gvq_codec_t *c, size_t off, size_t count) {
    const gvq_gradiveq_t *g = c->state;
    (void)off; /* off is a multiple of L: only the chunk at the end has a tail */
    return gvq_gradiveq_wire_size(g->L, g->d, g->wire_fp16, count);
}

static gvqResult_t gq_tmp(gvq_gradiveq_t *g, size_t n) {
    if (g->tmp_len >= n) return gvqSuccess;
    float *t = realloc(g->tmp, n * sizeof(float));
    if (t == NULL) {
        GVQ_WARN("GradiVeQ: cannot allocate %zu floats of scratch", n);
        return gvqSystemError;
    }
    g->tmp = t;
    g->tmp_len = n;
    return gvqSuccess;
}

/* Loss bookkeeping runs over every local value on each encode, so it must cost little next to
 * the sgemm: eight independent fp32 partial sums (vectorisable without -ffast-math), added up in
 * double per slice. The loss they feed is compared with eps ~ 1e-2, far above fp32 rounding. */
#define GQ_LANES 8
/* The loss is estimated on every GQ_LOSS_STRIDE-th slice (by global slice index, so slice 0 of
 *  * every tensor counts): x2, c2 and all2 all come from the same slices, so their ratio is a
 * sample estimate of the whole tensor's loss at a quarter of the cost. The raw tail carries no
 * compression loss and is left out. */
#define GQ_LOSS_STRIDE GVQ_GQ_LOSS_STRIDE /* gvq_device.h: the device ops sample the same */
static double gq_dot(const float *a, const float *b, size_t n) {
    float acc[GQ_LANES] = {0};
    size_t i = 0;
    for (; i + GQ_LANES <= n; i += GQ_LANES)
        for (size_t l = 0; l < GQ_LANES; l++)
            acc[l] += a[i + l] * b[i + l];
    double s = 0;
    for (size_t l = 0; l < GQ_LANES; l++)
        s += acc[l];
    for (; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* x.x and x.z in one pass. */
static void gq_dot2(const float *x, const float *z, size_t n, double *xx, double *xz) {
    float a[GQ_LANES] = {0}, b[GQ_LANES] = {0};
    size_t i = 0;
    for (; i + GQ_LANES <= n; i += GQ_LANES)
        for (size_t l = 0; l < GQ_LANES; l++) {
            a[l] += x[i + l] * x[i + l];
            b[l] += x[i + l] * z[i + l];
        }
    double sa = 0, sb = 0;
    for (size_t l = 0; l < GQ_LANES; l++) {
        sa += a[l];
        sb += b[l];
    }
    for (; i < n; i++) {
        sa += (double)x[i] * x[i];
        sb += (double)x[i] * z[i];
    }
    *xx = sa;
    *xz = sb;
}

/* The coefficients of k slices (x: k x L, a slice a row) on U (L x d, column-major): a slice's d
 * coefficients together in c (k x d row-major). */
static gvqResult_t gq_project(const gvq_device_ops_t *dev, size_t k, size_t L, size_t d,
                              const float *x, const float *U, float *c) {
    if (dev == &gvq_host_device) {
        gvq_kernels()->project(k, L, d, x, U, c, d, 1, 0);
        return gvqSuccess;
    }
    return dev->sgemm(1, 0, (int)d, (int)k, (int)L, 1.0f, U, (int)L, x, (int)L, 0.0f, c, (int)d);
}

/* The slices [s0+rel, s0+rel+k) that share reuse group grp, starting at rel. */
static size_t gq_run(const gvq_gradiveq_t *g, size_t s0, size_t rel, size_t slices, size_t *grp) {
    *grp = (s0 + rel) / g->C;
    return GVQ_MIN(slices - rel, (*grp + 1) * g->C - (s0 + rel));
}

static gvqResult_t gq_encode_combine(const gvq_codec_t *c, size_t off, size_t count,
                                     const void *local, const void *in, void *out) {
    gvq_gradiveq_t *g = c->state;
    const gvq_device_ops_t *dev = c->dev;
    size_t slices, tail, L = g->L, d = g->d, s0 = off / L;
    gq_split(g, off, count, &slices, &tail);
    const float *x = local;
    float *coef = out; /* fp32 wire: straight into out */
    if (g->wire_fp16) {
        GVQCHECK(gq_tmp(g, slices * d));
        coef = g->tmp;
    }
    const float inv_n = 1.0f / (float)g->nranks;
    double all2 = 0;
    for (size_t rel = 0, grp, k; rel < slices; rel += k) {
        k = gq_run(g, s0, rel, slices, &grp);
        float *cg = coef + rel * d;
        GVQCHECK(gq_project(dev, k, L, d, x + rel * L, g->U + grp * L * d, cg));
        const float *uz = g->UZ + grp * d, *z = g->Z + grp * L;
        double x2 = 0, c2 = 0, xx, xz;
        for (size_t j = 0; j < k; j++) {
            float *cj = cg + j * d;
            for (size_t i = 0; i < d; i++)
                cj[i] -= uz[i] * inv_n;
            if ((s0 + rel + j) % GQ_LOSS_STRIDE != 0) continue;
            c2 += gq_dot(cj, cj, d);
            /* ||x - Z/N||^2 = x.x - 2 x.Z / N + Z.Z / N^2: one pass over the slice, which also
             * gives x.x for the local norm */
            gq_dot2(x + (rel + j) * L, z, L, &xx, &xz);
            x2 += xx - 2.0 * xz * inv_n + g->ZZ[grp] * inv_n * inv_n;
            all2 += xx;
        }
        g->local_x2 += x2;
        g->local_c2 += c2;
    }
    g->local_all2 += all2;
    if (in != NULL && slices) {
        if (g->wire_fp16) {
            const uint16_t *h = in; /* coef is g->tmp here: convert through a small buffer */
            float buf[256];
            for (size_t i = 0; i < slices * d; i += 256) {
                size_t m = GVQ_MIN((size_t)256, slices * d - i);
                gvq_kernels()->f16_to_f32(h + i, buf, m);
                for (size_t j = 0; j < m; j++)
                    coef[i + j] += buf[j];
            }
        } else {
            const float *f = in;
            for (size_t i = 0; i < slices * d; i++)
                coef[i] += f[i];
        }
    }
    size_t cbytes = gq_coef_bytes(g, slices);
    if (g->wire_fp16) {
        gvq_kernels()->f32_to_f16(coef, out, slices * d);
    }
    if (tail) {
        float *t = (float *)((char *)out + cbytes);
        const float *tin = in ? (const float *)((const char *)in + cbytes) : NULL;
        const float *xt = x + slices * L;
        for (size_t i = 0; i < tail; i++)
            t[i] = xt[i] + (tin ? tin[i] : 0.0f);
    }
    return gvqSuccess;
}

static gvqResult_t gq_decode(const gvq_codec_t *c, size_t off, size_t count, const void *wire,
                             void *dst) {
    gvq_gradiveq_t *g = c->state;
    const gvq_device_ops_t *dev = c->dev;
    size_t slices, tail, L = g->L, d = g->d, s0 = off / L;
    gq_split(g, off, count, &slices, &tail);
    const float *coef = wire;
    if (g->wire_fp16) {
        GVQCHECK(gq_tmp(g, slices * d));
        gvq_kernels()->f16_to_f32(wire, g->tmp, slices * d);
        coef = g->tmp;
    }
    float *x = dst;
    for (size_t rel = 0, grp, k; rel < slices; rel += k) {
        k = gq_run(g, s0, rel, slices, &grp);
        float *xg = x + rel * L;
        const float *z = g->Z + grp * L, *U = g->U + grp * L * d;
        if (dev == &gvq_host_device) { /* x_j = U c_j + z, one pass */
            gvq_kernels()->expand(k, L, d, coef + rel * d, d, 1, U, 1.0f, 0.0f, z, xg);
            continue;
        }
        for (size_t j = 0; j < k; j++)
            memcpy(xg + j * L, z, L * sizeof(float));
        GVQCHECK(dev->sgemm(0, 0, (int)L, (int)k, (int)d, 1.0f, U, (int)L, coef + rel * d, (int)d,
                            1.0f, xg, (int)L));
    }
    if (tail) {
        size_t cbytes = gq_coef_bytes(g, slices);
        memcpy(x + slices * L, (const char *)wire + cbytes, tail * sizeof(float));
    }
    return gvqSuccess;
}

gvqResult_t gvq_gradiveq_prepare(gvq_gradiveq_t *g, const gvq_device_ops_t *dev) {
    if (g->L == 0 || g->d == 0 || g->d > g->L || g->C == 0 || g->nranks < 1 || g->U == NULL ||
        g->Z == NULL) {
        GVQ_WARN("GradiVeQ: invalid codec shape L=%zu d=%zu C=%zu nranks=%d", g->L, g->d, g->C,
                 g->nranks);
        return gvqInvalidArgument;
    }
    size_t full = g->count / g->L;
    g->ngroups = GVQ_DIV_UP(full, g->C);
    free(g->UZ);
    g->UZ = calloc(GVQ_MAX(g->ngroups, (size_t)1) * g->d, sizeof(float));
    free(g->ZZ);
    g->ZZ = calloc(GVQ_MAX(g->ngroups, (size_t)1), sizeof(double));
    if (g->UZ == NULL || g->ZZ == NULL) return gvqSystemError;
    for (size_t grp = 0; grp < g->ngroups; grp++)
        g->ZZ[grp] = gq_dot(g->Z + grp * g->L, g->Z + grp * g->L, g->L);
    for (size_t grp = 0; grp < g->ngroups; grp++)
        GVQCHECK(gq_project(dev, 1, g->L, g->d, g->Z + grp * g->L, g->U + grp * g->L * g->d,
                            g->UZ + grp * g->d));
    return gvqSuccess;
}

void gvq_gradiveq_fini(gvq_gradiveq_t *g) {
    free(g->UZ);
    free(g->ZZ);
    free(g->tmp);
    g->UZ = NULL;
    g->ZZ = NULL;
    g->tmp = NULL;
    g->tmp_len = 0;
}

void gvq_codec_gradiveq_init(gvq_codec_t *c, const gvq_device_ops_t *dev, gvq_gradiveq_t *g) {
    memset(c, 0, sizeof *c);
    c->name = "gradiveq";
    c->wire_is_values = 0;
    c->granule = g->L;
    c->wire_bytes = gq_wire_bytes;
    c->encode_combine = gq_encode_combine;
    c->decode = gq_decode;
    c->dev = dev;
    c->dtype = gvqFloat32;
    c->op = gvqSum;
    c->state = g;
}

/* Collocation is a transpose of K rows of P = D H W positions, the positions reordered: the codec
 * kernels' (codec_colloc.h; 8 x 8 tiles through registers on the vector paths). */
void gvq_collocate(const float *src, float *dst, size_t K, size_t D, size_t H, size_t W) {
    gvq_kernels()->collocate(src, dst, K, D, H, W);
}

void gvq_uncollocate(const float *src, float *dst, size_t K, size_t D, size_t H, size_t W) {
    gvq_kernels()->uncollocate(src, dst, K, D, H, W);
}
