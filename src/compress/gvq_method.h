/*
 * gvq_method.h -- a compression method behind one ops table. Each method is one file of
 * src/compress/methods/ holding its table, its calls and its private state (c->m); methods.c
 * lists them, one line each. The handle's code (compressor.c, compressed_call.c,
 * compressor_save.c) asks the table and never tests which method it holds.
 *
 *   method          file                        serves (resolved config)     state (c->m)
 *   plain           methods/plain.c             codec none                   none
 *   gradiveq        methods/gradiveq.c          codec gradiveq, fitted basis the handle's (*)
 *   gradiveq-track  methods/gradiveq_track.c    codec gradiveq, tracked      track_state_t
 *   qsgd            methods/qsgd.c              codec qsgd                   the handle's (*)
 *   powersgd        methods/powersgd.c          codec powersgd               powersgd_state_t
 *
 * (*) the fitted GradiVeQ basis and QSGD run one ring per call through the phase's codec
 * (compressed_call.c: host, device-resident or staged), and GradiVeQ samples through QSGD, so
 * their codec states (gq, qs, the integer wires, the samples, U and Z, the device copies) stay in
 * the handle where that shared path reads them.
 *
 * Adding a method: a file in methods/ with its gvq_method_t (CMakeLists.txt builds every file
 * there), and its line in methods.c (and, for a new public codec, its gvqCodec_t value in
 * include/gvq.h and compressor_config.c's list of codecs).
 */
#ifndef GVQ_METHOD_H_
#define GVQ_METHOD_H_

#include "gvq_compressor.h"

typedef struct gvq_method {
    const char *name;
    /* whether the method serves this resolved config (the first in methods.c that does) */
    int (*serves)(const gvq_comp_cfg_t *cfg);
    /* its own fields of the config, after the common ones are resolved into cfg: defaults and
     * checks (a WARN naming fn and the field). NULL: none */
    gvqResult_t (*resolve)(const char *fn, const gvqCompressorConfig_t *in, gvq_comp_cfg_t *cfg);
    /* its state in c->m and the stats it fixes at creation (the handle is laid out, its common
     * buffers made); a WARN naming gvqCompressorCreate on failure. NULL: nothing to make */
    gvqResult_t (*create)(gvqCompressor_t c);
    /* free what create made (also after a failed create) */
    void (*destroy)(gvqCompressor_t c);
    /* the INFO line of a new compressor: the fields of this method */
    void (*log_created)(gvqCompressor_t c, size_t count);
    /* one call on host buffers, entered and checked */
    gvqResult_t (*allreduce)(gvqCompressor_t c, const float *send, float *recv, gvqRedOp_t op);
    /* whether c can share one call with c0 (both of this method; NULL: never), and that call:
     * k compressors of this method, all fusable with cs[0] */
    int (*fusable)(gvqCompressor_t c, gvqCompressor_t c0);
    gvqResult_t (*allreduce_many)(gvqCompressor_t const *cs, const float *const *send,
                                  float *const *recv, size_t k, gvqRedOp_t op);
    /* the floats kept between calls that saved state carries beyond the schedule, fit and
     * residual (PowerSGD's Q, a tracked basis), and their number; NULL: none */
    float *(*kept)(gvqCompressor_t c, size_t *floats);
    /* stats.dims: the directions a call keeps now */
    int (*dims)(gvqCompressor_t c);
    /* 1: a conv tensor is reordered filter-collocated (GradiVeQ's layout) for the method's calls */
    int collocates;
    /* 1: calls on device buffers may run on the device (its codecs), 0: staged through host */
    int device_resident;
} gvq_method_t;

/* methods.c: the registry (NULL-terminated; the fused calls of a set run in this order), and the
 * method serving cfg (never NULL for a resolved config). */
extern const gvq_method_t *const gvq_methods[];
const gvq_method_t *gvq_method_of(const gvq_comp_cfg_t *cfg);

/* phase_call.c: the plan of one call of the phase's codec -- the codec and where its ring
 * runs -- for buffers on dev; */
typedef struct {
    gvq_codec_t codec;   /* what the ring runs */
    gvq_codec_t inner;   /* the device codec, when codec wraps it (staged wire) */
    gvq_coll_ctx_t comm; /* the communicator's own ring (agreements, the fit) */
    gvq_coll_ctx_t ring; /* where the compressed ring runs */
    unsigned long long sent;
    int hier; /* compressed between the hosts only (gvq_hier_allreduce): host buffers on hosts
                 of several ranks, GVQ_ALGO naming the hierarchy */
} gvq_call_plan_t;
gvqResult_t gvq_compressed_plan(gvqCompressor_t c, const gvq_device_ops_t *dev, gvq_call_plan_t *p);
/* one such call on host buffers, entered and checked (the allreduce of plain, gradiveq and
 * qsgd); the same on a device with codecs, on the caller's stream (compressed_call.c decides);
 * whether v holds no NaN or Inf; QSGD's codec state from the config (c->qs: QSGD calls, and
 * GradiVeQ's sampling through QSGD). */
gvqResult_t gvq_compressed_run_host(gvqCompressor_t c, const float *send, float *recv,
                                    gvqRedOp_t op);
gvqResult_t gvq_compressed_run_device(gvqCompressor_t c, const gvq_device_ops_t *dev,
                                      const void *send, void *recv, gvqRedOp_t op,
                                      gvqStream_t stream);
int gvq_compressed_all_finite(const float *v, size_t n);
gvqResult_t gvq_compressed_qsgd_init(gvqCompressor_t c);

#endif /* GVQ_METHOD_H_ */
