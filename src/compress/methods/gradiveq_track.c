/*
 * gradiveq_track.c -- the tracked-basis GradiVeQ method (gvq_method.h). One allreduce through
 * a GradiVeQ compressor whose basis is tracked
 * (basisUpdate gvqBasisTrack): GradiVeQ's compression (slices of L values projected on a basis
 * U that every rank shares, the coefficients summed inside the ring) with the PCA of the summed
 * slices found by a streaming block power iteration, one step per call, instead of sampling
 * phases of exact sums and eigen-solves (the paper). The products are src/algorithms/powersgd.c's.
 *
 *   g --(+ e)--> x --finite on every rank? (agreed)--> collocated, as GradiVeQ's ring input
 *     S_n = x as nslices x L rows, the tail zero-padded; S = sum over the ranks of S_n
 *     ring 1: C0 = sum S_n U                       nslices x d, U the kept basis
 *     ring 2: B = sum S_n^T C0 = S^T S U           L x d
 *     U <- orth(B)             one power iteration on the covariance of the summed slices
 *                              (what the paper's PCA fits), warm-started from the kept U; the
 *                              same on every rank, since B is
 *     C_n = S_n U              this rank's coefficients on the new basis
 *     e_n = S_n - C_n U^T      this rank's loss; kept with error feedback (clipped, in tensor
 *                              order: error_feedback.c)
 *     ring 3: C = sum C_n                          nslices x d
 *     y = C U^T (gvqAvg: / N), uncollocated        ~ S projected on U
 *
 * Three rings of (2 nslices + L) d values in all: fp32 sums, or with integerBits 8 or 16 the
 * integer-summed wire (codec_intsum.c) with one shared scale per column of C0, B and C (the
 * columns are contiguous: the products are column-major), agreed by a max-allreduce before
 * each ring; its rounding is stochastic (unbiased) and, like a plain ring's, the same on every
 * rank. One call may carry several tensors (a group of compressed calls, a zero-code layout,
 * the training layer): each ring then sums all their factors at once (factor_ring.c), three
 * rings and one finite-input agreement for all of them. Rings 1-2 are one PowerSGD step on the
 * slice matrix; what stays GradiVeQ's is the output: every slice projected on one shared basis
 * of slice space, its coefficients summed. Why a power iteration: on small-batch
 * gradients the samples of a sampling phase are noise-dominated and a PCA fit of them keeps
 * most of the L dimensions (perf/RESULTS.md section 6), while a few tracked directions plus
 * error feedback carry what matters. Two cheaper variants measured worse on the ResNet (RESULTS
 * section 6): the pooled covariance sum S_n^T S_n U in one ring (N times noisier), and that
 * ring riding with the previous call's coefficients (the basis one call late).
 * Host buffers only (device buffers are staged by gvqAllReduceCompressed). A gradient holding
 * NaN or Inf on any rank is sent uncompressed on every rank alike (gvq_compressed_nonfinite; U
 * untouched, residual dropped).
 */
#include <math.h>
#include <stdlib.h>

#include <string.h>

#include "gvq_method.h"

/* The method's state (c->m): the nslices x L slice matrix M (n x m, zero-padded), P the rings'
 * coefficients (n x d) then B (L x d), Q the basis U (L x d); plain: (2 n + L) d >= count, the
 * tensor is sent uncompressed. */
typedef struct {
    size_t n, m;
    gvq_factor_ws_t ws; /* the rings' buffer and integer wire, kept between calls */
    float *M, *P, *Q;
    int plain;
} track_state_t;
#define ST(c) ((track_state_t *)(c)->m)

/* x = g + residual (error feedback) or g, straight into the slice matrix (collocated slices:
 * into ef_input, then collocated), with ||g|| (error feedback), ||x|| over M and whether every
 * x is finite, in one pass (gvq_ef_prepare); over M in M's order when collocated (a pass of its
 * own after the collocation). Returns 1 when every x is finite. */
static int prepare_slices(gvqCompressor_t c, const float *g, double *gnorm, double *xnorm) {
    size_t count = c->cfg.count, nm = ST(c)->n * ST(c)->m;
    int ef = c->cfg.error_feedback, col = c->collocate;
    float *out = col ? (ef ? c->ef_input : NULL) : ST(c)->M;
    int finite = gvq_ef_prepare(c, g, out, gnorm, xnorm);
    memset(ST(c)->M + count, 0, sizeof(float) * (nm - count)); /* the padding adds nothing */
    if (col) {
        gvq_collocate(ef ? c->ef_input : g, ST(c)->M, (size_t)c->cfg.K, (size_t)c->cfg.D,
                      (size_t)c->cfg.H, (size_t)c->cfg.W);
        *xnorm = gvq_ef_norm(ST(c)->M, nm);
    }
    return finite;
}

/* count floats of the slice matrix back into tensor order. */
static void empty_slices(gvqCompressor_t c, float *out) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    if (c->collocate)
        gvq_uncollocate(ST(c)->M, out, (size_t)cfg->K, (size_t)cfg->D, (size_t)cfg->H,
                        (size_t)cfg->W);
    else
        memcpy(out, ST(c)->M, sizeof(float) * cfg->count);
}

/* C_n = S_n U (U the new basis) into the ring's buffer, then S_n - C_n U^T left in M; of the
 * slices [r0, r1). */
static gvqResult_t encode(gvqCompressor_t c, size_t r0, size_t r1) {
    const gvq_device_ops_t *dev = c->comm->dev;
    size_t L = ST(c)->m, d = (size_t)c->cfg.dmax;
    float *M = ST(c)->M + r0 * L;
    return gvq_powersgd_project_residual(dev, M, r1 - r0, L, d, ST(c)->Q, ST(c)->P);
}

/* This rank's loss (stats.lastLoss) and, with error feedback, its residual (its norm taken
 * once, for both). */
static void keep_residual(gvqCompressor_t c, double xnorm, double gnorm) {
    if (!c->cfg.error_feedback) {
        double rnorm = gvq_ef_norm(ST(c)->M, ST(c)->n * ST(c)->m);
        c->st.stats.lastLoss = xnorm > 0 ? rnorm / xnorm : 0;
        return;
    }
    double rnorm;
    if (c->collocate) {
        empty_slices(c, c->residual);
        rnorm = gvq_ef_norm(c->residual, c->cfg.count);
    } else { /* the copy and the norm in one pass */
        rnorm = gvq_ef_keep(c, ST(c)->M);
    }
    c->st.stats.lastLoss = xnorm > 0 ? rnorm / xnorm : 0;
    gvq_ef_clip_norm(c, gnorm, rnorm);
}

/* y = C U^T into the slices [r0, r1) of M. */
static gvqResult_t decode(gvqCompressor_t c, size_t r0, size_t r1) {
    size_t L = ST(c)->m, d = (size_t)c->cfg.dmax;
    return gvq_powersgd_expand(c->comm->dev, r1 - r0, L, d, ST(c)->P, ST(c)->Q, 1.0f, 0.0f,
                               ST(c)->M + r0 * L);
}

/* M's slices into recv, in tensor order (gvqAvg: divided). */
static gvqResult_t decode_out(gvqCompressor_t c, float *recv, gvqRedOp_t op) {
    empty_slices(c, recv);
    if (op == gvqAvg)
        GVQCHECK(c->comm->dev->divide(recv, c->cfg.count, gvqFloat32, c->comm->nranks));
    return gvqSuccess;
}

/* ---- one call of several tensors ---------------------------------------------------------- */

/* The tensors of one fused call that compress (not too small, finite on every rank). */
typedef struct {
    gvqCompressor_t c;
    const float *send;
    float *recv;
    double gnorm, xnorm;
} track_item_t;

typedef struct {
    track_item_t *it;
    size_t n;
    gvq_factor_t *f; /* a ring's factors, one per item */
    gvq_coll_ctx_t ctx;
    int split; /* hierarchical: the products split over a host's ranks (below) */
} track_call_t;

/* The slices [r0, r1) this rank projects: all of them, or with the products split over a host's
 * K ranks, the host's sum of slices [j n / K, (j + 1) n / K) for local rank j. */
static void piece_rows(const track_call_t *t, const track_item_t *x, size_t *r0, size_t *r1) {
    size_t n = ST(x->c)->n;
    *r0 = 0, *r1 = n;
    if (!t->split) return;
    size_t K = (size_t)t->ctx.hier->per_host, j = (size_t)t->ctx.hier->local_index;
    *r0 = n * j / K, *r1 = n * (j + 1) / K;
}

/* Rows of item i's factor in ring k: the coefficients (k 1, 3: the slices projected here) or
 * the basis (k 2: L). */
static size_t ring_rows(const track_call_t *t, const track_item_t *x, int k) {
    size_t r0, r1;
    piece_rows(t, x, &r0, &r1);
    return k == 2 ? ST(x->c)->m : r1 - r0;
}
/* Where item x keeps ring k's factor (column-major, rows x d). */
static float *ring_factor(const track_item_t *x, int k) {
    size_t n = ST(x->c)->n;
    return k == 2 ? ST(x->c)->P + n * (size_t)x->c->cfg.dmax : ST(x->c)->P;
}

/* Ring k (1-3) of the call: every item's factor summed, all in one ring (factor_ring.c): fp32,
 * or the integer-summed wire with a scale per column (k keys the rounding bits apart). */
static gvqResult_t track_ring(track_call_t *t, int k) {
    for (size_t i = 0; i < t->n; i++)
        t->f[i] = (gvq_factor_t){ring_factor(&t->it[i], k), ring_rows(t, &t->it[i], k),
                                 (size_t)t->it[i].c->cfg.dmax};
    gvqCompressor_t c0 = t->it[0].c;
    uint32_t seed = (uint32_t)c0->cfg.seed, call = (uint32_t)(c0->st.iter * 3 + (uint64_t)k);
    if (t->split && k != 2) /* the coefficients of one piece: summed over the hosts only */
        return gvq_factor_ring_across(&t->ctx, c0->cfg.int_bits, t->f, t->n, seed, call,
                                      &ST(c0)->ws);
    return gvq_factor_ring(&t->ctx, c0->cfg.int_bits, t->f, t->n, seed, call, &ST(c0)->ws);
}

/* With the products split: the host's sum of the slice matrices, local rank j keeping the
 * slices of its piece (a reduce-scatter inside the host, on slice boundaries), or (gather) the
 * pieces back to every rank of the host. */
static gvqResult_t host_slices(track_call_t *t, const track_item_t *x, int gather) {
    const gvq_hier_t *h = t->ctx.hier;
    size_t K = (size_t)h->per_host, n = ST(x->c)->n, L = ST(x->c)->m;
    size_t *off = malloc((K + 1) * sizeof *off);
    if (off == NULL) return gvqSystemError;
    for (size_t k = 0; k <= K; k++)
        off[k] = n * k / K * L;
    const int *members;
    gvq_coll_ctx_t lctx = gvq_hier_local_ctx(&t->ctx, &members);
    gvq_subring_t local = {members, (int)K, off};
    float *M = ST(x->c)->M;
    gvqResult_t res = gather ? gvq_subring_allgather(&lctx, &local, M, gvqFloat32)
                             : gvq_subring_reduce_scatter(&lctx, &local, M, M, gvqFloat32, gvqSum);
    free(off);
    return res;
}

/* The three rings and what lies between them, for every item at once. Split (the compressed
 * calls hierarchical, ctx.hier): each host first sums its ranks' slice matrices, local rank j
 * keeping the host's sum of the slices of piece j; every product below then runs on that piece
 * only (K times less work per rank), rings 1 and 3 sum a piece's coefficients over the hosts
 * (ring j of the local ranks j), ring 2 sums every rank's part of B hierarchically, and the
 * decoded pieces are gathered inside the host. The residual a rank keeps is what its piece of
 * the host's sum lost (zero elsewhere), so error feedback adds it back into that piece. */
static gvqResult_t track_compress(track_call_t *t, gvqRedOp_t op) {
    for (size_t i = 0; i < t->n; i++) { /* C0 = S_n U */
        gvqCompressor_t c = t->it[i].c;
        size_t r0, r1;
        if (t->split) GVQCHECK(host_slices(t, &t->it[i], 0));
        piece_rows(t, &t->it[i], &r0, &r1);
        float *M = ST(c)->M + r0 * ST(c)->m;
        if (t->split) t->it[i].xnorm = gvq_ef_norm(M, (r1 - r0) * ST(c)->m);
        GVQCHECK(gvq_powersgd_project(c->comm->dev, M, r1 - r0, ST(c)->m, (size_t)c->cfg.dmax,
                                      ST(c)->Q, ring_factor(&t->it[i], 1)));
    }
    GVQCHECK(track_ring(t, 1));
    for (size_t i = 0; i < t->n; i++) { /* B = S_n^T C0 */
        gvqCompressor_t c = t->it[i].c;
        size_t r0, r1;
        piece_rows(t, &t->it[i], &r0, &r1);
        GVQCHECK(gvq_powersgd_back(c->comm->dev, ST(c)->M + r0 * ST(c)->m, r1 - r0, ST(c)->m,
                                   (size_t)c->cfg.dmax, ring_factor(&t->it[i], 1),
                                   ring_factor(&t->it[i], 2)));
    }
    GVQCHECK(track_ring(t, 2));
    for (size_t i = 0; i < t->n; i++) { /* U = orth(B); C_n; the residual */
        gvqCompressor_t c = t->it[i].c;
        size_t L = ST(c)->m, d = (size_t)c->cfg.dmax, r0, r1;
        memcpy(ST(c)->Q, ring_factor(&t->it[i], 2), sizeof(float) * L * d);
        gvq_powersgd_orthonormalize(ST(c)->Q, L, d);
        piece_rows(t, &t->it[i], &r0, &r1);
        GVQCHECK(encode(c, r0, r1));
        if (t->split) { /* the others' pieces hold partial sums: not this rank's residual */
            memset(ST(c)->M, 0, sizeof(float) * r0 * L);
            memset(ST(c)->M + r1 * L, 0, sizeof(float) * (ST(c)->n - r1) * L);
        }
        keep_residual(c, t->it[i].xnorm, t->it[i].gnorm);
    }
    GVQCHECK(track_ring(t, 3));
    for (size_t i = 0; i < t->n; i++) {
        gvqCompressor_t c = t->it[i].c;
        size_t r0, r1;
        if (!t->split && !c->collocate && ST(c)->n * ST(c)->m == c->cfg.count) {
            /* the slices are the tensor's order with no padding: y = C U^T straight into recv */
            GVQCHECK(gvq_powersgd_expand(c->comm->dev, ST(c)->n, ST(c)->m, (size_t)c->cfg.dmax,
                                         ST(c)->P, ST(c)->Q, 1.0f, 0.0f, t->it[i].recv));
            if (op == gvqAvg)
                GVQCHECK(
                    c->comm->dev->divide(t->it[i].recv, c->cfg.count, gvqFloat32, c->comm->nranks));
            continue;
        }
        piece_rows(t, &t->it[i], &r0, &r1);
        GVQCHECK(decode(t->it[i].c, r0, r1));
        if (t->split) GVQCHECK(host_slices(t, &t->it[i], 1));
        GVQCHECK(decode_out(t->it[i].c, t->it[i].recv, op));
    }
    return gvqSuccess;
}

/* A tensor too small to pay for its basis: the exact sum. */
static gvqResult_t track_plain(gvqCompressor_t c, gvq_coll_ctx_t *ctx, const float *send,
                               float *recv, gvqRedOp_t op, unsigned long long *sent) {
    size_t count = c->cfg.count;
    unsigned long long before = *sent;
    gvq_codec_t plain;
    gvq_codec_identity_init(&plain, c->comm->dev, gvqFloat32, gvqSum);
    GVQCHECK(gvq_ring_allreduce(ctx, &plain, send, recv, count, gvqSum));
    if (op == gvqAvg) GVQCHECK(c->comm->dev->divide(recv, count, gvqFloat32, c->comm->nranks));
    return gvq_compressor_advance(c, ctx, c->comm->dev, recv, *sent - before, 0, 0);
}

static gvqResult_t track_allreduce_many(gvqCompressor_t const *cs, const float *const *send,
                                        float *const *recv, size_t k, gvqRedOp_t op) {
    if (k == 0) return gvqSuccess;
    unsigned long long sent = 0;
    track_call_t t = {0};
    t.ctx = gvq_comm_ctx(cs[0]->comm, &sent);
    if (!gvq_comm_hier_compressed(cs[0]->comm)) t.ctx.hier = NULL; /* factor rings flat */
    t.split = t.ctx.hier != NULL;
    int32_t *bad = calloc(k, sizeof *bad);
    double *norms = calloc(2 * k, sizeof *norms); /* ||g||, ||x|| per tensor */
    t.it = calloc(k, sizeof *t.it);
    t.f = calloc(k, sizeof *t.f);
    gvqResult_t res = gvqSuccess;
    if (norms == NULL || bad == NULL || t.it == NULL || t.f == NULL) goto oom;
    for (size_t i = 0; i < k; i++) /* the slices, norms and finite test in one pass */
        bad[i] =
            !ST(cs[i])->plain && !prepare_slices(cs[i], send[i], &norms[2 * i], &norms[2 * i + 1]);
    GVQCHECKGOTO(gvq_agree_i32(&t.ctx, bad, (int)k, gvqMax), res, out); /* non-finite anywhere */
    for (size_t i = 0; i < k && res == gvqSuccess; i++) {
        gvqCompressor_t c = cs[i];
        if (ST(c)->plain)
            res = track_plain(c, &t.ctx, send[i], recv[i], op, &sent);
        else if (bad[i])
            res = gvq_compressed_nonfinite(c, &t.ctx, send[i], recv[i], op);
        if (ST(c)->plain || bad[i]) continue;
        t.it[t.n++] = (track_item_t){c, send[i], recv[i], norms[2 * i], norms[2 * i + 1]};
    }
    if (res != gvqSuccess || t.n == 0) goto out;
    for (size_t i = 0; t.split && i < t.n; i++) /* a piece for every local rank (the same */
        t.split = ST(t.it[i].c)->n >= (size_t)t.ctx.hier->per_host; /* shapes on every rank) */
    unsigned long long before = sent, total = 0;
    GVQCHECKGOTO(track_compress(&t, op), res, out);
    /* wireBytes: the three rings' bytes shared out by each tensor's part of the values */
    for (size_t i = 0; i < t.n; i++) {
        gvqCompressor_t c = t.it[i].c;
        total += (2 * ST(c)->n + ST(c)->m) * (unsigned long long)c->cfg.dmax;
    }
    for (size_t i = 0; i < t.n && res == gvqSuccess; i++) {
        gvqCompressor_t c = t.it[i].c;
        unsigned long long part = (2 * ST(c)->n + ST(c)->m) * (unsigned long long)c->cfg.dmax;
        res = gvq_compressor_advance(c, &t.ctx, c->comm->dev, t.it[i].recv,
                                     (sent - before) * part / total, 0, 0);
    }
    goto out;
oom:
    GVQ_WARN("gvqAllReduceCompressed: out of memory for a tracked-basis call of %zu tensors", k);
    res = gvqSystemError;
out:
    free(norms);
    free(bad);
    free(t.it);
    free(t.f);
    return res;
}

static gvqResult_t track_allreduce(gvqCompressor_t c, const float *send, float *recv,
                                   gvqRedOp_t op) {
    return track_allreduce_many(&c, &send, &recv, 1, op);
}

/* ---- the method ---------------------------------------------------------------------------- */

static int track_serves(const gvq_comp_cfg_t *cfg) {
    return cfg->codec == gvqCodecGradiveq && cfg->track;
}

/* Its fields: fp32 or integer sums on the wire, L the multiple of K nearest above sqrt(count)
 * by default, d = maxDims (4 by default), error feedback on by default. */
static gvqResult_t track_resolve(const char *fn, const gvqCompressorConfig_t *in,
                                 gvq_comp_cfg_t *c) {
    if (c->fp16) {
        GVQ_WARN("%s: basisUpdate gvqBasisTrack sends fp32 or integer sums (wireType gvqFloat16 "
                 "refused; integerBits 8 or 16 for a smaller wire)",
                 fn);
        return gvqInvalidArgument;
    }
    if (in->sliceSize == GVQ_CONFIG_UNDEF_INT) { /* L the multiple of K nearest above sqrt(count) */
        uint64_t r = 1, K = (uint64_t)c->K;
        while (r * r < c->count)
            r++;
        c->L = (int32_t)GVQ_MIN(GVQ_DIV_UP(r, K) * K, GVQ_MAX(c->count / K, 1) * K);
    }
    if (in->maxDims == GVQ_CONFIG_UNDEF_INT) c->dmax = GVQ_MIN(4, c->L);
    if (c->dmax > c->L) {
        GVQ_WARN("%s: maxDims=%d must be in [1, sliceSize=%d]", fn, c->dmax, c->L);
        return gvqInvalidArgument;
    }
    if (GVQ_DIV_UP(c->count, (uint64_t)c->L) > (uint64_t)INT32_MAX) { /* sgemm's int sizes */
        GVQ_WARN("%s: basisUpdate gvqBasisTrack: %llu values in slices of %d make more than "
                 "2^31 slices",
                 fn, (unsigned long long)c->count, c->L);
        return gvqInvalidArgument;
    }
    if (in->errorFeedback == GVQ_CONFIG_UNDEF_INT)
        c->error_feedback = 1; /* as PowerSGD: few directions a call */
    return gvqSuccess;
}

/* The nslices x L slice matrix (zero-padded), the rings' C0 / C (nslices x d) and B (L x d), and
 * the basis U, random normal from the seed and orthonormalised (the same on every rank). */
static gvqResult_t track_create(gvqCompressor_t c) {
    size_t L = (size_t)c->cfg.L, n = GVQ_DIV_UP((size_t)c->cfg.count, L), d = (size_t)c->cfg.dmax;
    track_state_t *st = calloc(1, sizeof *st);
    if (st == NULL) return gvqSystemError;
    c->m = st;
    st->n = n;
    st->m = L;
    st->M = calloc(n * L, sizeof(float));
    st->P = malloc(sizeof(float) * (n + L) * d);
    st->Q = malloc(sizeof(float) * L * d);
    if (st->M == NULL || st->P == NULL || st->Q == NULL) {
        GVQ_WARN(
            "gvqCompressorCreate: cannot allocate the %zu x %zu slice matrix and the %zu x %zu "
            "basis of a tracked GradiVeQ basis",
            n, L, L, d);
        return gvqSystemError;
    }
    gvq_powersgd_init_q(st->Q, L, d, (uint32_t)c->cfg.seed);
    gvq_powersgd_orthonormalize(st->Q, L, d);
    st->plain = (2 * n + L) * d >= (size_t)c->cfg.count;
    double vbytes = c->cfg.int_bits ? c->cfg.int_bits / 8.0 : 4.0; /* a value on the wire */
    c->st.stats.ratio =
        st->plain ? 1.0 : 4.0 * (double)(n * L) / ((double)((2 * n + L) * d) * vbytes);
    if (st->plain)
        gvq_compressor_set_reason(c, "tracking d directions would send more than the tensor: "
                                     "sent uncompressed");
    return gvqSuccess;
}

static void track_destroy(gvqCompressor_t c) {
    track_state_t *st = c->m;
    if (st == NULL) return;
    gvq_factor_ws_fini(&st->ws);
    free(st->M);
    free(st->P);
    free(st->Q);
    free(st);
    c->m = NULL;
}

static void track_log(gvqCompressor_t c, size_t count) {
    const gvq_comp_cfg_t *g = &c->cfg;
    GVQ_INFO("compressor %p: tensor %d count %zu gradiveq tracked basis d %d L=%d K=%d "
             "integer wire %d",
             (void *)c, c->tensor_index, count, g->dmax, g->L, g->K, g->int_bits);
}

static int track_fusable(gvqCompressor_t c, gvqCompressor_t c0) {
    (void)c, (void)c0;
    return 1; /* any two: each ring sums every tensor's factors */
}

static float *track_kept(gvqCompressor_t c, size_t *floats) {
    *floats = ST(c)->m * (size_t)c->cfg.dmax;
    return ST(c)->Q;
}

static int track_dims(gvqCompressor_t c) {
    return ST(c)->plain ? 0 : c->cfg.dmax;
}

const gvq_method_t gvq_method_gradiveq_track = {.name = "gradiveq-track",
                                                .serves = track_serves,
                                                .resolve = track_resolve,
                                                .create = track_create,
                                                .destroy = track_destroy,
                                                .log_created = track_log,
                                                .allreduce = track_allreduce,
                                                .fusable = track_fusable,
                                                .allreduce_many = track_allreduce_many,
                                                .kept = track_kept,
                                                .dims = track_dims,
                                                .collocates = 1,
                                                .device_resident = 0};
