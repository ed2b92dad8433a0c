/*
 * powersgd.c -- the PowerSGD method (gvq_method.h): compressors of codec gvqCodecPowersgd (the
 * math is src/algorithms/powersgd.c; Vogels et al. 2019, as PyTorch's powerSGD_hook):
 *
 *   g --(+ e)--> x --finite on every rank? (agreed)--> M = x as n x m, zero-padded
 *     P = M Q                        Q: the kept warm start, the same on every rank
 *     ring: P = sum over ranks       plain fp32 ring (identity codec) on the comm's context
 *     P_hat = orth(P)                the same on every rank, since P is
 *     Q_n = M^T P_hat                this rank's coefficients
 *     ring: Q' = sum over ranks of Q_n
 *     y = P_hat Q'^T (gvqAvg: / N);  kept Q = Q' / N;  e = M - P_hat Q_n^T, clipped
 * (error_feedback.c)
 *
 * The residual is this rank's own loss, M - P_hat P_hat^T M (Vogels et al.'s local
 * decompression), not PyTorch's M - P_hat (Q'/N)^T: both sum over the ranks to the same global
 * error, but PyTorch's also holds the rank's deviation from the mean gradient, which the clip
 * would cut unevenly across ranks and so break the cancellation of that part in the sum.
 *
 * No filter collocation: the tensor [K][D][H][W] is read as the K x DHW matrix it is, a flat one
 * as ceil(count / R) x R (gvq_powersgd_shape). Host buffers only: device buffers reach this file
 * staged through host memory (gvqAllReduceCompressed); there are no device kernels for
 * PowerSGD. A gradient holding NaN or Inf on any rank (agreed before the first ring) is sent
 * uncompressed on every rank alike (gvq_compressed_nonfinite: the plain sum, counted and logged
 * once; Q and the schedule untouched, the residual dropped). Several PowerSGD tensors of one
 * call (a group of compressed calls, a zero-code layout) share the two rings (factor_ring.c).
 */
#include <math.h>
#include <stdlib.h>

#include <string.h>

#include "gvq_method.h"

/* The method's state (c->m): the n x m matrix (row-major, zero-padded), P (n x r), the kept Q
 * (m x r: the last summed Q / N, the warm start) and the Q being summed. */
typedef struct {
    size_t n, m;
    float *M, *P, *Q, *Qsum;
    gvq_factor_ws_t ws; /* the rings' buffer, kept between calls */
} powersgd_state_t;
#define ST(c) ((powersgd_state_t *)(c)->m)

/* This rank's residual e = M - P_hat Q_n^T (its loss in stats.lastLoss; kept with error
 * feedback, clipped against ||g||, in the pass that takes its norm), the kept Q (Q' / N), then
 * the output P_hat Q'^T straight into recv (through M when the matrix is padded). xnorm: ||x||. */
static gvqResult_t finish(gvqCompressor_t c, double gnorm, double xnorm, float *recv,
                          gvqRedOp_t op) {
    const gvq_device_ops_t *dev = c->comm->dev;
    size_t n = ST(c)->n, m = ST(c)->m, r = (size_t)c->cfg.prank, count = c->cfg.count;
    int N = c->comm->nranks;
    GVQCHECK(gvq_powersgd_expand(dev, n, m, r, ST(c)->P, ST(c)->Q, -1.0f, 1.0f, ST(c)->M));
    for (size_t i = 0; i < m * r; i++)
        ST(c)->Q[i] = ST(c)->Qsum[i] / (float)N;
    double rnorm = gvq_ef_keep(c, ST(c)->M);
    c->st.stats.lastLoss = xnorm > 0 ? rnorm / xnorm : 0;
    if (c->cfg.error_feedback) gvq_ef_clip_norm(c, gnorm, rnorm);
    if (n * m == count) {
        GVQCHECK(gvq_powersgd_expand(dev, n, m, r, ST(c)->P, ST(c)->Qsum, 1.0f, 0.0f, recv));
    } else {
        GVQCHECK(gvq_powersgd_expand(dev, n, m, r, ST(c)->P, ST(c)->Qsum, 1.0f, 0.0f, ST(c)->M));
        memcpy(recv, ST(c)->M, sizeof(float) * count);
    }
    if (op == gvqAvg) GVQCHECK(dev->divide(recv, count, gvqFloat32, N));
    return gvqSuccess;
}

/* The k tensors' two rings, each carrying all their factors (factor_ring.c): P = sum M_n Q
 * summed and orthonormalised per tensor, then Q_n = M_n^T P_hat summed into Qsum. */
static gvqResult_t power_steps(gvqCompressor_t const *cs, size_t k, gvq_factor_t *f,
                               gvq_coll_ctx_t *ctx) {
    for (size_t i = 0; i < k; i++) {
        gvqCompressor_t c = cs[i];
        size_t n = ST(c)->n, m = ST(c)->m, r = (size_t)c->cfg.prank;
        GVQCHECK(gvq_powersgd_project(c->comm->dev, ST(c)->M, n, m, r, ST(c)->Q, ST(c)->P));
        f[i] = (gvq_factor_t){ST(c)->P, n, r};
    }
    GVQCHECK(gvq_factor_ring(ctx, 0, f, k, (uint32_t)cs[0]->cfg.seed, 0, &ST(cs[0])->ws));
    for (size_t i = 0; i < k; i++) {
        gvqCompressor_t c = cs[i];
        size_t n = ST(c)->n, m = ST(c)->m, r = (size_t)c->cfg.prank;
        gvq_powersgd_orthonormalize(ST(c)->P, n, r);
        GVQCHECK(gvq_powersgd_back(c->comm->dev, ST(c)->M, n, m, r, ST(c)->P, ST(c)->Q));
        memcpy(ST(c)->Qsum, ST(c)->Q, sizeof(float) * m * r);
        f[i] = (gvq_factor_t){ST(c)->Qsum, m, r};
    }
    return gvq_factor_ring(ctx, 0, f, k, (uint32_t)cs[0]->cfg.seed, 0, &ST(cs[0])->ws);
}

/* Factor values of one PowerSGD call of c: (n + m) r. */
static unsigned long long factor_values(gvqCompressor_t c) {
    return (unsigned long long)(ST(c)->n + ST(c)->m) * (unsigned long long)c->cfg.prank;
}

static gvqResult_t powersgd_allreduce_many(gvqCompressor_t const *cs, const float *const *send,
                                           float *const *recv, size_t k, gvqRedOp_t op) {
    if (k == 0) return gvqSuccess;
    unsigned long long sent = 0, total = 0;
    gvq_coll_ctx_t ctx = gvq_comm_ctx(cs[0]->comm, &sent);
    if (!gvq_comm_hier_compressed(cs[0]->comm)) ctx.hier = NULL; /* factor rings flat */
    int32_t *bad = calloc(k, sizeof *bad);
    double *gnorm = calloc(2 * k, sizeof *gnorm), *xnorm = gnorm + k;
    gvqCompressor_t *ok = calloc(k, sizeof *ok);
    float **okrecv = calloc(k, sizeof *okrecv);
    gvq_factor_t *f = calloc(k, sizeof *f);
    gvqResult_t res = gvqSuccess;
    size_t nok = 0;
    if (!bad || !gnorm || !ok || !okrecv || !f) {
        GVQ_WARN("gvqAllReduceCompressed: out of memory for a PowerSGD call of %zu tensors", k);
        res = gvqSystemError;
        goto out;
    }
    for (size_t i = 0; i < k; i++) { /* x = g (+ e) into M, its norms and finiteness: one pass */
        gvqCompressor_t c = cs[i];
        size_t count = c->cfg.count, nm = ST(c)->n * ST(c)->m;
        bad[i] = !gvq_ef_prepare(c, send[i], ST(c)->M, &gnorm[i], &xnorm[i]);
        memset(ST(c)->M + count, 0, sizeof(float) * (nm - count)); /* the padding */
    }
    GVQCHECKGOTO(gvq_agree_i32(&ctx, bad, (int)k, gvqMax), res, out); /* non-finite anywhere */
    for (size_t i = 0; i < k && res == gvqSuccess; i++) {
        gvqCompressor_t c = cs[i];
        if (bad[i]) {
            res = gvq_compressed_nonfinite(c, &ctx, send[i], recv[i], op);
            continue;
        }
        gnorm[nok] = gnorm[i];
        xnorm[nok] = xnorm[i];
        okrecv[nok] = recv[i];
        ok[nok++] = c;
        total += factor_values(c);
    }
    if (res != gvqSuccess || nok == 0) goto out;
    unsigned long long before = sent; /* wireBytes: the two rings, shared out by values */
    GVQCHECKGOTO(power_steps(ok, nok, f, &ctx), res, out);
    for (size_t i = 0; i < nok && res == gvqSuccess; i++) {
        gvqCompressor_t c = ok[i];
        res = finish(c, gnorm[i], xnorm[i], okrecv[i], op);
        c->st.stats.ratio = (double)(ST(c)->n * ST(c)->m) / (double)factor_values(c);
        if (res == gvqSuccess)
            res = gvq_compressor_advance(c, &ctx, c->comm->dev, okrecv[i],
                                         (sent - before) * factor_values(c) / total, 0, 0);
    }
out:
    free(bad), free(gnorm), free(ok), free(okrecv), free(f);
    return res;
}

static gvqResult_t powersgd_allreduce(gvqCompressor_t c, const float *send, float *recv,
                                      gvqRedOp_t op) {
    return powersgd_allreduce_many(&c, &send, &recv, 1, op);
}

/* ---- the method ---------------------------------------------------------------------------- */

static int powersgd_serves(const gvq_comp_cfg_t *cfg) {
    return cfg->codec == gvqCodecPowersgd;
}

/* The tensor as a K x (count / K) matrix (filters as rows), or for a flat tensor
 * ceil(count / R) x R with R = ceil(sqrt(count)), zero-padded. */
void gvq_powersgd_shape(const gvq_comp_cfg_t *c, size_t *rows, size_t *cols) {
    size_t n = (size_t)c->count;
    if (c->W != 0 && c->K > 1) {
        *rows = (size_t)c->K;
        *cols = n / (size_t)c->K;
    } else {
        size_t r = 1;
        while (r * r < n)
            r++;
        *cols = r;
        *rows = GVQ_DIV_UP(n, r);
    }
}

/* The rank against the matrix; error feedback on by default (PowerSGD needs it, Vogels et al.). */
static gvqResult_t powersgd_resolve(const char *fn, const gvqCompressorConfig_t *in,
                                    gvq_comp_cfg_t *c) {
    size_t rows, cols;
    gvq_powersgd_shape(c, &rows, &cols);
    if (c->prank < 1 || (size_t)c->prank > GVQ_MIN(rows, cols)) {
        GVQ_WARN("%s: powerRank=%d must be in [1, %zu] for a %zu x %zu matrix", fn, c->prank,
                 GVQ_MIN(rows, cols), rows, cols);
        return gvqInvalidArgument;
    }
    if (in->errorFeedback == GVQ_CONFIG_UNDEF_INT) c->error_feedback = 1;
    return gvqSuccess;
}

/* The matrix (n x m, zero-padded), P, the kept Q (random normal from the seed, the same on every
 * rank) and the Q being summed. No collocation work buffer: PowerSGD sees the tensor as it is
 * (filters as rows). */
static gvqResult_t powersgd_create(gvqCompressor_t c) {
    size_t n, m, r = (size_t)c->cfg.prank;
    gvq_powersgd_shape(&c->cfg, &n, &m);
    powersgd_state_t *st = calloc(1, sizeof *st);
    if (st == NULL) return gvqSystemError;
    c->m = st;
    st->n = n;
    st->m = m;
    st->M = calloc(n * m, sizeof(float));
    st->P = malloc(sizeof(float) * n * r);
    st->Q = malloc(sizeof(float) * m * r);
    st->Qsum = malloc(sizeof(float) * m * r);
    if (st->M == NULL || st->P == NULL || st->Q == NULL || st->Qsum == NULL) {
        GVQ_WARN("gvqCompressorCreate: cannot allocate PowerSGD's %zu x %zu matrix and rank-%zu "
                 "factors",
                 n, m, r);
        return gvqSystemError;
    }
    gvq_powersgd_init_q(st->Q, m, r, (uint32_t)c->cfg.seed);
    c->st.stats.ratio = (double)(n * m) / (double)((n + m) * r);
    return gvqSuccess;
}

static void powersgd_destroy(gvqCompressor_t c) {
    powersgd_state_t *st = c->m;
    if (st == NULL) return;
    gvq_factor_ws_fini(&st->ws);
    free(st->M);
    free(st->P);
    free(st->Q);
    free(st->Qsum);
    free(st);
    c->m = NULL;
}

static void powersgd_log(gvqCompressor_t c, size_t count) {
    GVQ_INFO("compressor %p: tensor %d count %zu powersgd rank %d error feedback %d", (void *)c,
             c->tensor_index, count, c->cfg.prank, c->cfg.error_feedback);
}

static int powersgd_fusable(gvqCompressor_t c, gvqCompressor_t c0) {
    (void)c, (void)c0;
    return 1; /* any two: the rings sum each tensor's factors, whatever their shapes */
}

static float *powersgd_kept(gvqCompressor_t c, size_t *floats) {
    *floats = ST(c)->m * (size_t)c->cfg.prank;
    return ST(c)->Q;
}

const gvq_method_t gvq_method_powersgd = {.name = "powersgd",
                                          .serves = powersgd_serves,
                                          .resolve = powersgd_resolve,
                                          .create = powersgd_create,
                                          .destroy = powersgd_destroy,
                                          .log_created = powersgd_log,
                                          .allreduce = powersgd_allreduce,
                                          .fusable = powersgd_fusable,
                                          .allreduce_many = powersgd_allreduce_many,
                                          .kept = powersgd_kept,
                                          .collocates = 0,
                                          .device_resident = 0};
