/*
 * perf_gradsrc.h -- gradients for gvq-perf's compressed codecs: a synthetic source with the
 * structure of conv-layer gradients, or gradients recorded by a trainer (replay files).
 *
 * Either way the source is a pure function of (rank, iteration t, element index), so any rank
 * can regenerate any other rank's input and compute the exact sum of a call on its own.
 *
 * Synthetic source (seed, L, r, noise, variation v). The vector is cut into slices of L values;
 * slice s of rank n at iteration t is
 *
 *     x = sum_{j<r} a_j(n, t, s) B_j + e                 B_j: a fixed random unit vector in R^L,
 *                                                         shared by every slice and rank
 *     a_j(n, t, s) = w_j ( m_j(s) (1 + 0.1 sin(2 pi t / P_j + phi_j(s))) + v g_j(n, t, s) )
 *
 * m_j(s), phi_j(s): per slice and direction, fixed (the "true" gradient, the same on every
 * rank), drifting slowly with t (P_j = 50 + 10 j iterations); g_j(n, t, s): i.i.d. N(0, 1)
 * per rank, iteration and slice (minibatch noise, inside the same subspace); w_j: 1 down to 0.9,
 * so every direction carries a similar share of the variance; e: i.i.d. normal noise per element
 * whose norm is `noise` times the signal's (expected) norm. All random values are hashes of
 * (seed, ...), so the source needs no state.
 *
 * What GradiVeQ's fit makes of it: the T samples (summed first slice) vary in the r directions
 * (minibatch part), so a fit that keeps all r finds span(B) and then compresses every slice with
 * a local loss of about 1.4 * noise (d = r, ratio L/r). The fit keeps the fewest directions
 * holding 1 - eps of the *sampled* variance, and sampled variances of r equal directions spread
 * (Marchenko-Pastur) down to (1 - sqrt(r/T))^2 of their mean: with T not well above r the
 * smallest ones fall under eps and are dropped, and every slice then loses about 1/r of its
 * norm (far above eps: the loss vote ends the compressed phase). gvq-perf's default r is the
 * largest that a T-sample fit keeps; ratio 8 at L = 256 (r = 32) needs T ~ 100 and eps ~ 0.003.
 *
 * Replay files (what a trainer's --dump-grads writes), little-endian:
 *
 *     offset  0: char[8]  "GVQGRAD1"
 *     offset  8: uint64   count       floats per iteration
 *     offset 16: uint64   iterations
 *     offset 24: iterations x count float32, iteration-major (record k = iteration k)
 *
 * Rank n at iteration t reads record (t + n) mod iterations, so ranks differ; element i of a
 * vector longer than count is element i mod count of the record.
 */
#ifndef PERF_GRADSRC_H_
#define PERF_GRADSRC_H_

#include <stddef.h>
#include <stdint.h>

#define GS_REPLAY_MAGIC "GVQGRAD1"
#define GS_REPLAY_HEADER_BYTES 24

typedef struct gs_source gs_source_t;

/* splitmix64's finalizer: a well-mixed 64-bit hash of x (also the sparse benchmark's access
 * pattern). */
static inline uint64_t gs_mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* A synthetic source; NULL on bad arguments (L < 1, r outside [1, min(L, 4096)], noise < 0)
 * or no memory. */
gs_source_t *gs_synthetic(uint64_t seed, size_t L, int r, double noise, double variation);

/* A replay source reading `path`; NULL with a message in err on failure. */
gs_source_t *gs_replay_open(const char *path, char *err, size_t errlen);

void gs_free(gs_source_t *s);

/* Writes elements [off, off + len) of rank's gradient at iteration t to out. Returns 0, or -1 on
 * an I/O error (replay). */
int gs_fill(const gs_source_t *s, int rank, long long t, size_t off, size_t len, float *out);

/* Writes `iters` iterations (t = 0 .. iters-1) of rank's gradient of `count` floats to path in
 * the replay format. Returns 0, or -1 with a message in err. */
int gs_write_replay(const gs_source_t *s, const char *path, size_t count, int iters, int rank,
                    char *err, size_t errlen);

/* "synthetic seed=1 L=256 r=32 noise=0.005" or "replay FILE (count C, iterations I)". */
void gs_describe(const gs_source_t *s, char *buf, size_t len);

#endif /* PERF_GRADSRC_H_ */
