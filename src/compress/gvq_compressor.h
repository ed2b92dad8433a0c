/*
 * gvq_compressor.h -- the compressor handle and what its files share:
 *
 *   compressor.c         the handle (create, destroy, stats, registry)
 *   compressor_config.c  the public config resolved into gvq_comp_cfg_t (every refusal names
 *                        its field)
 *   schedule.c           the phase machine a call advances
 *   compressor_fit.c     the fit spread over the ranks, and the codec state it yields
 *   gvq_method.h         the compression methods behind one ops table: methods.c the registry,
 *                        methods/ one file per method, phase_call.c the ring of the phase's
 *                        codec that plain, gradiveq and qsgd share
 *   compressed_call.c    gvqAllReduceCompressed: checks, agreement, host / device / staged,
 *                        groups and fused sets
 *   compressor_save.c    saved state
 *   error_feedback.c     the per-call, bounded error-feedback residual (every codec; the ring's
 *                        encodes watched by src/algorithms/codecs/codec_watch.c)
 *   zero_code.c          GVQ_CODEC: compressors attached to plain allreduce calls
 */
#ifndef GVQ_COMPRESSOR_H_
#define GVQ_COMPRESSOR_H_

#include "gvq_comm.h"

#define GVQ_COMPRESSOR_MAGIC 0x67767163u

/* The resolved configuration (every default filled in). Saved states carry it, so a load can
 * check that it restores into the same kind of compressor: its layout is part of the saved
 * format. */
typedef struct {
    int32_t codec, K, D, H, W, L, C;
    float eps;
    int32_t warmup, sample, compressed, sample_codec, qbits, qbucket, qmaxnorm, fp16,
        error_feedback, dmax, seed;
    float vote;            /* early-exit threshold on the local loss */
    int32_t sample_slices; /* slices per reuse group kept per sampling call (1..C) */
    int32_t int_bits;      /* integer-summed wire: 0, 8 or 16 */
    int32_t prank;         /* PowerSGD's rank r */
    float ef_bound;        /* error feedback's clip, relative to the gradient's norm */
    int32_t track;         /* GradiVeQ's basis: 0 fitted (sampling phases), 1 tracked */
    int32_t reserved;      /* 0 */
    uint64_t count;        /* 8-aligned without implicit padding, so that save/load can memcmp */
} gvq_comp_cfg_t;
_Static_assert(sizeof(gvq_comp_cfg_t) == 26 * 4 + 8,
               "gvq_comp_cfg_t must have no implicit padding");

/* Where the schedule stands (saved with the state). */
typedef struct {
    int32_t phase;
    int32_t d;
    int64_t iter, phase_iter, nsamples;
    gvqCompressorStats_t stats;
} gvq_comp_state_t;

struct gvq_method;

struct gvqCompressor {
    uint32_t magic;
    const struct gvq_method *method; /* gvq_method.h: what serves cfg */
    void *m;                         /* the method's own state (methods/<name>.c), or NULL */
    gvqComm_t comm;
    int tensor_index;
    gvq_comp_cfg_t cfg;
    gvq_comp_state_t st;
    size_t nfull, ngroups;
    int collocate;
    float *samples; /* ngroups x T x sample_slices x L */
    float *U, *Z;   /* ngroups x L x d, ngroups x L */
    float *work;    /* collocated vector (count) */
    /* the fused QSGD call's buffers when this compressor leads the group (methods/qsgd.c):
     * kept from call to call, fuse_cap bytes */
    void *fuse_buf;
    size_t fuse_cap;
    float *ef_input; /* gradient + residual (count) */
    float *residual;
    float *ef_coef; /* GradiVeQ's coefficients of one slice's residual (L >= d), made once */
    gvq_gradiveq_t gq;
    gvq_qsgd_t qs;
    int have_qsgd;
    /* integer-summed wires (integerBits): QSGD's, and GradiVeQ's of fit is_gq_version */
    gvq_intsum_t is_qsgd, is_gq;
    uint64_t is_gq_version; /* 0: none */
    int is_qsgd_n, is_gq_n; /* the summands each was made for: N, or H in the hierarchy */
    size_t
        codec_chunk_bytes; /* ring chunk while a compressing codec runs (GVQ_CODEC_CHUNK_BYTES) */
    uint64_t fit_version;  /* bumped by every gvq_compressor_codec_setup (a fit or a load) */
    /* Device-resident calls (buffers in a device's memory): the device's copies of the
     * collocated vector and of U, Z, U^T Z, and the device codecs' parameters. */
    const gvq_device_ops_t *ddev;
    float *dwork, *dU, *dZ, *dUZ;
    size_t dU_len;        /* floats in dU (ngroups L d) */
    uint64_t dev_version; /* fit_version of dU, dZ, dUZ (0: none) */
    gvq_gq_dev_codec_t gq_dev;
    gvq_dev_qsgd_t qsgd_dev;
    gvq_staging_t stg;
};

/* compressor_config.c: resolve a public config (NULL: defaults) for a tensor of count floats. */
gvqResult_t gvq_compressor_config_resolve(const gvqCompressorConfig_t *in, size_t count,
                                          gvq_comp_cfg_t *cfg);
/* The matrix PowerSGD sees: K x (count / K) for a conv shape with K > 1, else
 * ceil(count / R) x R with R = ceil(sqrt(count)) (the tail zero-padded). */
void gvq_powersgd_shape(const gvq_comp_cfg_t *cfg, size_t *rows, size_t *cols);

/* compressor.c */
int gvq_compressor_live(gvqCompressor_t c);
/* schedule.c */
void gvq_compressor_set_reason(gvqCompressor_t c, const char *why);
/* phase_call.c: drop the device copies (the next device-resident call makes them again). */
void gvq_compressor_device_free(gvqCompressor_t c);
/* The phase machine, after the ring of one call: keeps the samples of a sampling call (dst: the
 * summed, collocated result on dev), counts the bytes, takes the vote (`vote`: the sum of the
 * ranks' votes, already agreed) and moves to the next phase, fitting when the samples are
 * complete. Every input is identical on all ranks. */
gvqResult_t gvq_compressor_advance(gvqCompressor_t c, gvq_coll_ctx_t *ctx,
                                   const gvq_device_ops_t *dev, const float *dst,
                                   unsigned long long sent, double loss, int32_t vote);

/* compressor_fit.c */
/* Slices of group g kept per sampling call: sample_slices, or fewer in a short last group. */
size_t gvq_compressor_group_samples(gvqCompressor_t c, size_t g);
/* (Re)build the GradiVeQ codec state from U, Z, d. */
gvqResult_t gvq_compressor_codec_setup(gvqCompressor_t c);
/* Fit every reuse group on its owner rank, agree on d, broadcast (U, Z) from the owners.
 * gvqSuccess with *ok = 0 when a fit was refused (non-finite samples) on any rank. */
gvqResult_t gvq_compressor_fit(gvqCompressor_t c, gvq_coll_ctx_t *ctx, int *ok);

/* error_feedback.c: the residual of this rank's compression, carried to the next call and
 * bounded (the file's header says why). Host buffers; only with cfg.error_feedback. */
/* One pass over a call's gradient g (count values): x = g + residual with error feedback, else
 * g, written to out (NULL: not written), with ||g|| (0 without error feedback) and ||x|| in
 * gvq_ef_norm's lanes (the same bits as calling it); returns 1 when every x is finite. What five
 * passes did: gvq_ef_input, a finite scan, the two norms and the copy. */
int gvq_ef_prepare(gvqCompressor_t c, const float *g, float *out, double *gnorm, double *xnorm);
/* A call's residual e (count values) kept with error feedback (copied into c->residual, not
 * clipped yet), in the pass that takes its norm; returns gvq_ef_norm(e, count) either way. */
double gvq_ef_keep(gvqCompressor_t c, const float *e);
/* The ring's input before collocation: g + residual in c->ef_input. */
const float *gvq_ef_input(gvqCompressor_t c, const float *g);
/* One call's residual: gvq_ef_begin before the ring (g: this call's gradient, src: the ring's
 * input, in its layout), the ring running *ring_codec (codec itself, or codec watched so that
 * every encode records what it dropped), gvq_ef_end after the ring (ok: the residual into the
 * tensor's order, clipped against ||g||; not ok: the residual dropped). */
typedef struct {
    gvq_watch_t watch; /* the ring's codec watched (src/algorithms/codecs/codec_watch.c) */
    float *r;          /* the residual in the ring's layout */
    double gnorm;
} gvq_ef_call_t;
gvqResult_t gvq_ef_begin(gvqCompressor_t c, gvq_ef_call_t *ef, const gvq_codec_t *codec,
                         const float *g, const float *src, const gvq_codec_t **ring_codec);
void gvq_ef_end(gvqCompressor_t c, gvq_ef_call_t *ef, int ok);
/* Scale the residual down to efBound x gnorm when it is longer; a non-finite one is dropped. */
void gvq_ef_clip(gvqCompressor_t c, double gnorm);
/* The same where the residual's norm e = gvq_ef_norm(residual, count) is known already. */
void gvq_ef_clip_norm(gvqCompressor_t c, double gnorm, double e);
/* ||v|| in double. */
double gvq_ef_norm(const float *v, size_t n);

/* error_feedback.c: a call whose gradient holds NaN or Inf on some rank (every rank takes
 * this path alike): the uncompressed sum of send into recv, counted and logged once, the
 * residual dropped, the schedule not advanced. */
gvqResult_t gvq_compressed_nonfinite(gvqCompressor_t c, gvq_coll_ctx_t *ctx, const float *send,
                                     float *recv, gvqRedOp_t op);

/* compressed_call.c: whether c's calls can share one call with others of its method (in a
 * group, a zero-code layout, the training layer's fused group). */
int gvq_compressor_fuses(gvqCompressor_t c);
/* compressed_call.c: n compressed allreduces of one communicator on host buffers (entered,
 * agreed), call i with ops[i] (ops NULL: all op): those with op whose codec fuses run fused (the
 * tracked-basis ones in one call, the PowerSGD ones in another, the QSGD ones of the first
 * fusable one's settings in a third), after the others, which run one by one in order. */
gvqResult_t gvq_compressed_allreduce_set(gvqCompressor_t const *c, const float *const *send,
                                         float *const *recv, const gvqRedOp_t *ops, gvqRedOp_t op,
                                         size_t n);
/* compressed_call.c: one compressed allreduce on host buffers, for a caller that has entered
 * the communicator and checked the arguments. */
gvqResult_t gvq_compressed_allreduce_entered(gvqCompressor_t c, const void *send, void *recv,
                                             gvqRedOp_t op);

#endif /* GVQ_COMPRESSOR_H_ */
