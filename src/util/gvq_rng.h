/*
 * gvq_rng.h -- Philox4x32-10, a counter-based generator (Salmon et al., SC'11): the random
 * numbers for (key, counter) are a pure function of both, so a quantizer can draw the bits for
 * element i of call c on rank r without any state, identically on host and device, and a run
 * can be reproduced from its seed.
 */
#ifndef GVQ_RNG_H_
#define GVQ_RNG_H_

#include <stdint.h>

/* Compiled by nvcc, the generator is also a device function (src/device/cuda/qsgd_kernels.cu draws
 * QSGD's bits with this very code, so host and device streams are bit-identical). */
#ifdef __CUDACC__
#define GVQ_RNG_FN __host__ __device__ static inline
#else
#define GVQ_RNG_FN static inline
#endif

typedef struct {
    uint32_t v[4];
} gvq_philox_ctr_t;

GVQ_RNG_FN void gvq_philox4x32_10(const uint32_t ctr_in[4], const uint32_t key_in[2],
                                  uint32_t out[4]) {
    uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
    uint32_t k0 = key_in[0], k1 = key_in[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* A uniform float in [0, 1) from 24 random bits. */
GVQ_RNG_FN float gvq_u01(uint32_t x) {
    return (float)(x >> 8) * (1.0f / 16777216.0f);
}

/* A uniform float in [0, 1) from 16 random bits: half `half` (0 low, 1 high) of x -- the
 * codecs draw 16 bits per element (src/algorithms/codecs/kernels/codec_kernels.h). */
GVQ_RNG_FN float gvq_u01_16(uint32_t x, int half) {
    return (float)((x >> (16 * half)) & 0xFFFFu) * (1.0f / 65536.0f);
}

#endif /* GVQ_RNG_H_ */
