/*
 * codec_qsgd.cu -- QSGD's chunk operations on the CUDA device (algorithms/codec_qsgd.c, the same
 * wire bit for bit):
 *
 *     wire, one bucket:  [ float scale ][ code 0 | code 1 | ... ]   codes packed low bits first
 *
 *   encode_combine: k_qsgd_scale   one thread per bucket: decode `in` and add the local values
 *                                  (into scratch), the bucket's norm into the wire's scale
 *                   k_qsgd_codes   one thread per code byte: the levels of its elements
 *   decode:         k_qsgd_decode  one thread per element
 *
 * Bit-for-bit agreement with the host codec: the levels draw their bits from gvq_rng.h's Philox
 * with the host's key and counter (16 bits per element, 8 elements per block:
 * algorithms/codecs/kernels/codec_kernels.h), r is clamped to s as there, and each bucket's
 * norm is summed in the host's order (one thread per bucket, 16 lanes of double sums added
 * 0..15).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gvq_cuda.h"
extern "C" {
#include "gvq_rng.h"
}

__host__ __device__ __forceinline__ size_t qs_bucket_bytes(int bits, size_t len) {
    return sizeof(float) + (len * (size_t)bits + 7) / 8;
}

__device__ __forceinline__ float qs_scale_of(const uint8_t *bucket_wire) {
    float s;
    memcpy(&s, bucket_wire, sizeof s);
    return s;
}

/* Element i of a bucket's wire, dequantized (qsgd_dequantize). */
__device__ __forceinline__ float qs_deq(const uint8_t *bw, int bits, int levels, size_t i) {
    float scale = qs_scale_of(bw);
    const uint8_t *codes = bw + sizeof(float);
    const int per_byte = 8 / bits;
    const unsigned mask = (1u << (bits - 1)) - 1u;
    const float unit = scale / (float)levels;
    unsigned code = (codes[i / (size_t)per_byte] >> ((i % (size_t)per_byte) * (size_t)bits)) &
                    ((1u << bits) - 1u);
    float mag = __fmul_rn((float)(code & mask), unit);
    float out = (code >> (bits - 1)) ? -mag : mag;
    if (scale != scale) out = scale;
    return out;
}

/* One thread per bucket: the combined values (decode of `in` plus local) into tmp when in is
 * given, and the bucket's scale into the wire, summed in the host's order. */
__global__ void k_qsgd_scale(gvq_dev_qsgd_t q, size_t count, const float *x, const uint8_t *in,
                             float *tmp, uint8_t *out) {
    size_t nb = (count + q.bucket - 1) / q.bucket, full = qs_bucket_bytes(q.bits, q.bucket);
    GRID_LOOP(b, nb) {
        size_t first = b * q.bucket, len = count - first < q.bucket ? count - first : q.bucket;
        double acc = 0, lane[16];
        int finite = 1;
        for (int j = 0; j < 16; j++)
            lane[j] = 0;
        for (size_t i = 0; i < len; i++) {
            float v = x[first + i];
            if (in != NULL) {
                v = __fadd_rn(qs_deq(in + b * full, q.bits, q.levels, i), v);
                tmp[first + i] = v;
            }
            float a = fabsf(v);
            if (!(a <= 3.0e38f)) finite = 0;
            if (q.norm == 1 /* GVQ_QSGD_NORM_MAX */)
                acc = a > acc ? a : acc;
            else /* value i into lane i % 16, as codec_kernels.c's l2_norm */
                lane[i & 15] = __dadd_rn(lane[i & 15], __dmul_rn((double)v, (double)v));
        }
        if (q.norm != 1)
            for (int j = 0; j < 16; j++)
                acc = __dadd_rn(acc, lane[j]);
        float scale = q.norm == 1 ? (float)acc : (float)sqrt(acc);
        if (!finite) scale = __int_as_float(0x7fc00000);
        memcpy(out + b * full, &scale, sizeof scale);
    }
}

/* One thread per code byte: the levels drawn with Philox keyed (seed, rank), counted by
 * (element >> 2, call), element e using word e & 3 -- as qsgd_quantize does. */
__global__ void k_qsgd_codes(gvq_dev_qsgd_t q, size_t off, size_t count, const float *src,
                             uint8_t *out) {
    const int bits = q.bits, per_byte = 8 / bits, s = q.levels;
    size_t full = qs_bucket_bytes(q.bits, q.bucket), cbf = full - sizeof(float);
    size_t nfull = count / q.bucket, tail = count % q.bucket;
    size_t nbytes = nfull * cbf + (tail ? (tail * (size_t)bits + 7) / 8 : 0);
    uint32_t key[2] = {q.seed, q.rank};
    GRID_LOOP(t, nbytes) {
        size_t b = t / cbf, j = t % cbf;
        size_t first = b * q.bucket, len = count - first < q.bucket ? count - first : q.bucket;
        uint8_t *bw = out + b * full;
        float scale = qs_scale_of(bw);
        uint8_t byte = 0;
        if (scale > 0) { /* zero bucket: codes 0; NaN scale: codes 0 */
            float inv = __fdiv_rn((float)s, scale);
            if (!(inv <= 3.402823466e38f)) inv = 3.402823466e38f; /* a subnormal scale */
            uint32_t rnd[4] = {0, 0, 0, 0};
            uint64_t have = ~(uint64_t)0; /* the Philox block in rnd: one per 8 elements */
            for (size_t i = j * (size_t)per_byte; i < len && i < (j + 1) * (size_t)per_byte; i++) {
                size_t e = off + first + i;
                if ((uint64_t)(e >> 3) != have) {
                    uint32_t ctr[4] = {(uint32_t)(e >> 3), (uint32_t)(e >> 35), q.call,
                                       0x51534744u};
                    gvq_philox4x32_10(ctr, key, rnd);
                    have = (uint64_t)(e >> 3);
                }
                float v = src[first + i];
                float r = __fmul_rn(fabsf(v), inv);
                r = r < (float)s ? r : (float)s;
                float l = floorf(r);
                int level =
                    (int)l + (gvq_u01_16(rnd[(e >> 1) & 3], (int)(e & 1)) < __fsub_rn(r, l));
                unsigned code = (unsigned)level | ((v < 0 && level) ? 1u << (bits - 1) : 0u);
                byte |= (uint8_t)(code << ((i % (size_t)per_byte) * (size_t)bits));
            }
        }
        bw[sizeof(float) + j] = byte;
    }
}

__global__ void k_qsgd_decode(gvq_dev_qsgd_t q, size_t count, const uint8_t *wire, float *dst) {
    size_t full = qs_bucket_bytes(q.bits, q.bucket);
    GRID_LOOP(i, count) {
        size_t b = i / q.bucket;
        dst[i] = qs_deq(wire + b * full, q.bits, q.levels, i - b * q.bucket);
    }
}

static gvqResult_t qsgd_check(const gvq_dev_qsgd_t *q) {
    if ((q->bits != 2 && q->bits != 4 && q->bits != 8) || q->bucket < 1 ||
        q->levels != (1 << (q->bits - 1)) - 1) {
        GVQ_WARN("CUDA QSGD: invalid parameters bits=%d levels=%d bucket=%zu", q->bits, q->levels,
                 q->bucket);
        return gvqInternalError;
    }
    return gvqSuccess;
}

extern "C" gvqResult_t gvq_cuda_qsgd_encode_combine(const gvq_dev_qsgd_t *q, size_t off,
                                                    size_t count, const float *local,
                                                    const void *in, void *out) {
    GVQCHECK(qsgd_check(q));
    if (count == 0) return gvqSuccess;
    CTX(c);
    void *tmp = NULL;
    if (in != NULL) GVQCHECK(gvq_cuda_scratch(c, count * sizeof(float), &tmp));
    size_t nb = (count + q->bucket - 1) / q->bucket;
    k_qsgd_scale<<<blocks_for(nb), THREADS, 0, c->cur>>>(*q, count, local, (const uint8_t *)in,
                                                         (float *)tmp, (uint8_t *)out);
    LAUNCHCHECK("qsgd scale");
    const float *src = in != NULL ? (const float *)tmp : local;
    size_t cbytes = count * (size_t)q->bits / 8 + 1;
    k_qsgd_codes<<<blocks_for(cbytes), THREADS, 0, c->cur>>>(*q, off, count, src, (uint8_t *)out);
    LAUNCHCHECK("qsgd codes");
    return gvqSuccess;
}

extern "C" gvqResult_t gvq_cuda_qsgd_decode(const gvq_dev_qsgd_t *q, size_t off, size_t count,
                                            const void *wire, float *dst) {
    (void)off;
    GVQCHECK(qsgd_check(q));
    if (count == 0) return gvqSuccess;
    CTX(c);
    k_qsgd_decode<<<blocks_for(count), THREADS, 0, c->cur>>>(*q, count, (const uint8_t *)wire, dst);
    LAUNCHCHECK("qsgd decode");
    return gvqSuccess;
}
