/*
 * perf_codecbench.h -- what gvq-perf measures below the public API: GradiVeQ's encode and
 * decode run directly through the codec (for the overlap report), and the PCA fit (--fit-bench).
 * Part of gvq_perf_internal (perf/internal/CMakeLists.txt): it calls the codec and the fit below
 * the public API. This header itself needs only standard types.
 */
#ifndef PERF_CODECBENCH_H_
#define PERF_CODECBENCH_H_

#include <stddef.h>

/* The compressed ring's pipeline chunk in uncompressed bytes, as the library resolves it
 * (GVQ_CODEC_CHUNK_BYTES or 256 KiB). */
size_t cb_chunk_bytes(void);

typedef struct cb_gradiveq cb_gradiveq_t;

/* A GradiVeQ codec for a flat tensor of `count` floats, one compressor (reuse group) of slice L
 * and exactly d dimensions, fitted with gvq_pca_fit on T samples (L x T, column-major) and set
 * up with gvq_gradiveq_prepare, as a compressor holds it after a fit. NULL with a message in err.
 */
cb_gradiveq_t *cb_gradiveq_create(size_t count, size_t L, size_t d, int nranks, int wire_fp16,
                                  const float *samples, size_t T, char *err, size_t errlen);
void cb_gradiveq_free(cb_gradiveq_t *g);

/* Encodes x (count floats) and combines it with a received wire, chunk by chunk as the ring does
 * (chunk_bytes of values per chunk, whole slices), then decodes every chunk into an output
 * vector. Writes the seconds of each pass. Returns 0, or -1 if the codec failed. */
int cb_gradiveq_run(cb_gradiveq_t *g, const float *x, size_t chunk_bytes, double *enc_s,
                    double *dec_s);

/* Times gvq_pca_fit(L, T samples, eps, dmax) on the host device: *fit_s the whole fit, *cov_s
 * the covariance sgemm alone, *eig_s the ssyevd alone (each measured once per call). Returns 0,
 * or -1 with a message in err. */
int cb_fit_time(size_t L, size_t T, const float *samples, double eps, size_t dmax, size_t *d,
                double *kept, double *fit_s, double *cov_s, double *eig_s, char *err,
                size_t errlen);

#endif /* PERF_CODECBENCH_H_ */
