/*
 * perf_gradsrc.c -- gvq-perf's gradient sources (see perf_gradsrc.h for the model and the file
 * format). Everything random is a hash of (seed, what, indices): no state, any range of any
 * rank's vector at any iteration can be regenerated in any order.
 */
#include "perf_gradsrc.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GS_PI 3.14159265358979323846
#define GS_DRIFT 0.1 /* relative amplitude of the slow drift of the true gradient */

enum { SRC_SYNTHETIC, SRC_REPLAY };

/* Streams of the hash, so that different quantities never share random bits. */
enum { TAG_BASIS = 1, TAG_MEAN, TAG_PHASE, TAG_MINIBATCH, TAG_ELEM };

struct gs_source {
    int kind;
    /* synthetic */
    uint64_t seed;
    size_t L;
    int r;
    double noise, variation;
    float sigma_e;  /* standard deviation of the per-element noise */
    float *B;       /* r x L, row j = direction j (unit norm) */
    float *w;       /* r weights */
    double *period; /* r drift periods, iterations */
    /* replay */
    int fd;
    uint64_t count, iters;
    char path[256];
};

/* ---- hashing (gs_mix64 in perf_gradsrc.h) ---------------------------------------------------- */

#define GOLD 0x9e3779b97f4a7c15ull

static inline uint64_t hash4(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t x = gs_mix64(seed * GOLD + tag);
    x = gs_mix64(x + a * GOLD + 1);
    x = gs_mix64(x + b * GOLD + 2);
    return gs_mix64(x + c * GOLD + 3);
}

/* Approximately N(0, 1): the sum of four 16-bit uniforms (Irwin-Hall), centred and scaled. */
static inline float gauss_of(uint64_t h) {
    float s = (float)(h & 0xffff) + (float)((h >> 16) & 0xffff) + (float)((h >> 32) & 0xffff) +
              (float)(h >> 48);
    return (s * (1.0f / 65536.0f) + 2.0f / 65536.0f - 2.0f) * 1.7320508f;
}

/* Uniform in [0, 1). */
static inline double unif_of(uint64_t h) {
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- synthetic ------------------------------------------------------------------------------ */

gs_source_t *gs_synthetic(uint64_t seed, size_t L, int r, double noise, double variation) {
    if (L < 1 || r < 1 || (size_t)r > L || r > 4096 || !(noise >= 0) || !(variation >= 0))
        return NULL;
    gs_source_t *s = calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    s->kind = SRC_SYNTHETIC;
    s->seed = seed;
    s->L = L;
    s->r = r;
    s->noise = noise;
    s->variation = variation;
    s->fd = -1;
    s->B = malloc(sizeof(float) * L * (size_t)r);
    s->w = malloc(sizeof(float) * (size_t)r);
    s->period = malloc(sizeof(double) * (size_t)r);
    if (s->B == NULL || s->w == NULL || s->period == NULL) {
        gs_free(s);
        return NULL;
    }
    double energy = 0; /* expected ||signal||^2 of one slice */
    for (int j = 0; j < r; j++) {
        double nrm = 0;
        float *b = s->B + (size_t)j * L;
        for (size_t i = 0; i < L; i++) {
            b[i] = gauss_of(hash4(seed, TAG_BASIS, (uint64_t)j, i, L));
            nrm += (double)b[i] * b[i];
        }
        float inv = (float)(1.0 / sqrt(nrm));
        for (size_t i = 0; i < L; i++)
            b[i] *= inv;
        s->w[j] = r > 1 ? 1.0f - 0.1f * (float)j / (float)(r - 1) : 1.0f;
        s->period[j] = 50.0 + 10.0 * j;
        /* E[m^2 (1 + A sin)^2] + E[(v g)^2] = 1 + A^2 / 2 + v^2 */
        energy +=
            (double)s->w[j] * s->w[j] * (1.0 + 0.5 * GS_DRIFT * GS_DRIFT + variation * variation);
    }
    s->sigma_e = (float)(noise * sqrt(energy / (double)L));
    return s;
}

/* Elements [i0, i0 + n) of slice `slice` of rank's vector at iteration t. */
static void synth_slice(const gs_source_t *s, int rank, long long t, size_t slice, size_t i0,
                        size_t n, float *out) {
    const size_t L = s->L;
    float a[4096];
    for (int j = 0; j < s->r; j++) {
        double m = gauss_of(hash4(s->seed, TAG_MEAN, slice, (uint64_t)j, 0));
        double phi = 2.0 * GS_PI * unif_of(hash4(s->seed, TAG_PHASE, slice, (uint64_t)j, 0));
        double g = gauss_of(hash4(s->seed, TAG_MINIBATCH, (uint64_t)rank, (uint64_t)t,
                                  slice * 4096u + (uint64_t)j));
        double drift = 1.0 + GS_DRIFT * sin(2.0 * GS_PI * (double)t / s->period[j] + phi);
        a[j] = (float)(s->w[j] * (m * drift + s->variation * g));
    }
    for (size_t i = 0; i < n; i++)
        out[i] = 0.0f;
    for (int j = 0; j < s->r; j++) {
        const float aj = a[j], *b = s->B + (size_t)j * L + i0;
        for (size_t i = 0; i < n; i++)
            out[i] += aj * b[i];
    }
    if (s->sigma_e > 0) {
        const uint64_t base = hash4(s->seed, TAG_ELEM, (uint64_t)rank, (uint64_t)t, 0);
        const uint64_t e0 = slice * L + i0;
        const float sig = s->sigma_e;
        for (size_t i = 0; i < n; i++)
            out[i] += sig * gauss_of(gs_mix64(base + (e0 + i) * GOLD));
    }
}

/* ---- replay --------------------------------------------------------------------------------- */

static int host_is_little_endian(void) {
    const uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}

gs_source_t *gs_replay_open(const char *path, char *err, size_t errlen) {
    if (!host_is_little_endian()) {
        snprintf(err, errlen, "replay files are little-endian; this host is not");
        return NULL;
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open replay file '%s': %s", path, strerror(errno));
        return NULL;
    }
    unsigned char h[GS_REPLAY_HEADER_BYTES];
    ssize_t got = pread(fd, h, sizeof h, 0);
    uint64_t count = 0, iters = 0;
    if (got == (ssize_t)sizeof h) {
        memcpy(&count, h + 8, 8);
        memcpy(&iters, h + 16, 8);
    }
    off_t size = lseek(fd, 0, SEEK_END);
    if (got != (ssize_t)sizeof h || memcmp(h, GS_REPLAY_MAGIC, 8) != 0) {
        snprintf(err, errlen, "'%s' is not a replay file (no %s header)", path, GS_REPLAY_MAGIC);
        close(fd);
        return NULL;
    }
    if (count == 0 || iters == 0 || count > ((uint64_t)1 << 40) || iters > ((uint64_t)1 << 40) ||
        (uint64_t)size != GS_REPLAY_HEADER_BYTES + count * iters * 4u) {
        snprintf(err, errlen,
                 "replay file '%s': header says %llu floats x %llu iterations, but the file has "
                 "%lld bytes (expected %llu)",
                 path, (unsigned long long)count, (unsigned long long)iters, (long long)size,
                 (unsigned long long)(GS_REPLAY_HEADER_BYTES + count * iters * 4u));
        close(fd);
        return NULL;
    }
    gs_source_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        close(fd);
        return NULL;
    }
    s->kind = SRC_REPLAY;
    s->fd = fd;
    s->count = count;
    s->iters = iters;
    snprintf(s->path, sizeof s->path, "%s", path);
    return s;
}

static int replay_fill(const gs_source_t *s, int rank, long long t, size_t off, size_t len,
                       float *out) {
    uint64_t rec = ((uint64_t)t + (uint64_t)rank) % s->iters;
    size_t done = 0;
    while (done < len) {
        uint64_t pos = (off + done) % s->count;
        size_t n = (size_t)(s->count - pos < len - done ? s->count - pos : len - done);
        off_t at = (off_t)(GS_REPLAY_HEADER_BYTES + (rec * s->count + pos) * 4u);
        char *dst = (char *)(out + done);
        size_t want = n * 4, have = 0;
        while (have < want) {
            ssize_t k = pread(s->fd, dst + have, want - have, at + (off_t)have);
            if (k <= 0) {
                if (k < 0 && errno == EINTR) continue;
                return -1;
            }
            have += (size_t)k;
        }
        done += n;
    }
    return 0;
}

/* ---- common --------------------------------------------------------------------------------- */

void gs_free(gs_source_t *s) {
    if (s == NULL) return;
    if (s->fd >= 0) close(s->fd);
    free(s->B);
    free(s->w);
    free(s->period);
    free(s);
}

int gs_fill(const gs_source_t *s, int rank, long long t, size_t off, size_t len, float *out) {
    if (s->kind == SRC_REPLAY) return replay_fill(s, rank, t, off, len, out);
    size_t e = off, end = off + len;
    while (e < end) {
        size_t slice = e / s->L, i0 = e % s->L;
        size_t n = s->L - i0 < end - e ? s->L - i0 : end - e;
        synth_slice(s, rank, t, slice, i0, n, out + (e - off));
        e += n;
    }
    return 0;
}

int gs_write_replay(const gs_source_t *s, const char *path, size_t count, int iters, int rank,
                    char *err, size_t errlen) {
    if (!host_is_little_endian()) {
        snprintf(err, errlen, "replay files are little-endian; this host is not");
        return -1;
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        snprintf(err, errlen, "cannot create '%s': %s", path, strerror(errno));
        return -1;
    }
    const size_t block = (size_t)1 << 20;
    float *buf = malloc(sizeof(float) * block);
    uint64_t hdr[2] = {(uint64_t)count, (uint64_t)iters};
    int ok = buf != NULL && fwrite(GS_REPLAY_MAGIC, 1, 8, f) == 8 && fwrite(hdr, 8, 2, f) == 2;
    for (int t = 0; ok && t < iters; t++)
        for (size_t off = 0; ok && off < count; off += block) {
            size_t n = count - off < block ? count - off : block;
            ok = gs_fill(s, rank, t, off, n, buf) == 0 && fwrite(buf, sizeof(float), n, f) == n;
        }
    if (fclose(f) != 0) ok = 0;
    free(buf);
    if (!ok) {
        snprintf(err, errlen, "cannot write '%s'", path);
        return -1;
    }
    return 0;
}

void gs_describe(const gs_source_t *s, char *buf, size_t len) {
    if (s->kind == SRC_REPLAY)
        snprintf(buf, len,
                 "replay %s (%llu floats x %llu iterations; rank n at iteration t reads "
                 "record (t+n) mod %llu)",
                 s->path, (unsigned long long)s->count, (unsigned long long)s->iters,
                 (unsigned long long)s->iters);
    else
        snprintf(buf, len,
                 "synthetic seed=%llu L=%zu rank=%d noise=%g (r shared directions per "
                 "slice, slowly drifting coefficients, per-rank minibatch noise)",
                 (unsigned long long)s->seed, s->L, s->r, s->noise);
}
