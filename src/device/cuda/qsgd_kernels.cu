/*
 * codec_qsgd.cu -- QSGD's chunk operations on the CUDA device (algorithms/codec_qsgd.c, the same
 * wire bit for bit):
 *
 *     wire, one bucket:  [ float scale ][ code 0 | code 1 | ... ]   codes packed low bits first
 *
 *   encode_combine: k_qsgd_encode_tile  a block per tile of whole buckets (up to 4096 values):
 *                                       stage decode(in) + x in shared memory, a half-warp per
 *                                       bucket's norm, a thread per 8 elements' levels; each
 *                                       input byte read once, no scratch buffer
 *                   k_qsgd_encode_long  buckets over 4096 values: a warp per two buckets
 *   decode:         k_qsgd_decode       a thread per 8 elements of a bucket
 * Every kernel is instantiated per bit width (2, 4, 8), so code positions are shifts.
 *
 * Bit-for-bit agreement with the host codec: the levels draw their bits from gvq_rng.h's Philox
 * with the host's key and counter (16 bits per element, 8 elements per block:
 * algorithms/codecs/kernels/codec_kernels.h), r is clamped to s as there, and each bucket's
 * norm is summed in the host's order (16 lanes of double sums, each in sequence, added 0..15).
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

/* Element i of a bucket's codes, dequantized (qsgd_dequantize) given the bucket's scale and
 * unit = scale / levels. BITS is a constant: the code's byte and shift are shifts and masks. */
template <int BITS>
__device__ __forceinline__ float qs_deq_code(unsigned code, float scale, float unit) {
    const unsigned mask = (1u << (BITS - 1)) - 1u;
    float mag = __fmul_rn((float)(code & mask), unit);
    float out = (code >> (BITS - 1)) ? -mag : mag;
    return scale != scale ? scale : out;
}

template <int BITS>
__device__ __forceinline__ unsigned qs_code_at(const uint8_t *codes, unsigned i) {
    constexpr unsigned per_byte = 8 / BITS;
    return (codes[i / per_byte] >> ((i % per_byte) * BITS)) & ((1u << BITS) - 1u);
}

/* Element i of a bucket's wire, dequantized. */
template <int BITS>
__device__ __forceinline__ float qs_deq(const uint8_t *bw, int levels, unsigned i) {
    float scale = qs_scale_of(bw);
    return qs_deq_code<BITS>(qs_code_at<BITS>(bw + sizeof(float), i), scale, scale / (float)levels);
}

/* The levels of 8 elements v[0..n8) whose tensor indices start at e0, packed as the wire holds
 * them (low bits first): Philox keyed (seed, rank), counted by (element >> 3, call), element e
 * taking half e & 1 of word (e >> 1) & 3 -- as qsgd_quantize does; r is clamped to s. */
template <int BITS>
__device__ __forceinline__ uint64_t qs_levels8(const gvq_dev_qsgd_t &q, const float *v, int n8,
                                               size_t e0, float inv) {
    const uint32_t key[2] = {q.seed, q.rank};
    const float s = (float)q.levels;
    uint32_t rnd[4] = {0, 0, 0, 0};
    uint64_t packed = 0;
    if ((e0 & 7) == 0 && n8 == 8) { /* one Philox block; word and half fixed per k */
        uint32_t ctr[4] = {(uint32_t)(e0 >> 3), (uint32_t)(e0 >> 35), q.call, 0x51534744u};
        gvq_philox4x32_10(ctr, key, rnd);
        uint32_t p32 = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float r = __fmul_rn(fabsf(v[k]), inv);
            r = r < s ? r : s;
            float l = floorf(r);
            unsigned level = (unsigned)(int)l + (gvq_u01_16(rnd[k >> 1], k & 1) < __fsub_rn(r, l));
            unsigned code = level | ((v[k] < 0 && level) ? 1u << (BITS - 1) : 0u);
            if (BITS == 8)
                packed |= (uint64_t)code << (k * BITS);
            else
                p32 |= code << (k * BITS);
        }
        return BITS == 8 ? packed : p32;
    }
    uint64_t have = ~(uint64_t)0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        if (k >= n8) break;
        size_t e = e0 + (size_t)k;
        if ((uint64_t)(e >> 3) != have) {
            uint32_t ctr[4] = {(uint32_t)(e >> 3), (uint32_t)(e >> 35), q.call, 0x51534744u};
            gvq_philox4x32_10(ctr, key, rnd);
            have = (uint64_t)(e >> 3);
        }
        float r = __fmul_rn(fabsf(v[k]), inv);
        r = r < s ? r : s;
        float l = floorf(r);
        unsigned w = (unsigned)(e >> 1) & 3u; /* a select: rnd stays in registers */
        uint32_t word = w == 0 ? rnd[0] : w == 1 ? rnd[1] : w == 2 ? rnd[2] : rnd[3];
        int level = (int)l + (gvq_u01_16(word, (int)(e & 1)) < __fsub_rn(r, l));
        uint64_t code = (uint64_t)level | ((v[k] < 0 && level) ? 1ull << (BITS - 1) : 0ull);
        packed |= code << (k * BITS);
    }
    return packed;
}

/* `nbytes` code bytes of one group at p, as wide a store as p's alignment allows. */
__device__ __forceinline__ void qs_put(uint8_t *p, uint64_t packed, int nbytes) {
    if (nbytes == 4 && ((uintptr_t)p & 3) == 0) {
        *(uint32_t *)p = (uint32_t)packed;
    } else if (nbytes == 8 && ((uintptr_t)p & 7) == 0) {
        *(uint64_t *)p = packed;
    } else if (nbytes == 2 && ((uintptr_t)p & 1) == 0) {
        *(uint16_t *)p = (uint16_t)packed;
    } else {
        for (int k = 0; k < nbytes; k++)
            p[k] = (uint8_t)(packed >> (8 * k));
    }
}

/* The norm of a bucket in the host's order, from a half-warp: lane j (0..15) has summed the
 * squares of elements j, j+16, ... in sequence (codec_kernels.c's 16 lanes), and every lane of
 * the half adds the 16 lane sums 0..15; the max norm takes any order. All 32 lanes call it. */
__device__ __forceinline__ float qs_half_scale(const gvq_dev_qsgd_t &q, double acc, int finite,
                                               unsigned half) {
    unsigned bad = __ballot_sync(0xffffffffu, !finite);
    double norm = 0;
    for (int k = 0; k < 16; k++) {
        double o = __shfl_sync(0xffffffffu, acc, (int)(half * 16) + k);
        norm = q.norm == 1 ? (o > norm ? o : norm) : __dadd_rn(norm, o);
    }
    float scale = q.norm == 1 ? (float)norm : (float)sqrt(norm);
    if ((bad >> (half * 16)) & 0xFFFFu) scale = __int_as_float(0x7fc00000);
    return scale;
}

/* A half-warp's part of a norm: element v at position i of the bucket. */
__device__ __forceinline__ void qs_norm_add(const gvq_dev_qsgd_t &q, float v, double *acc,
                                            int *finite) {
    float a = fabsf(v);
    if (!(a <= 3.0e38f)) *finite = 0;
    if (q.norm == 1 /* GVQ_QSGD_NORM_MAX */)
        *acc = a > *acc ? a : *acc;
    else
        *acc = __dadd_rn(*acc, __dmul_rn((double)v, (double)v));
}

/* The reciprocal step of a bucket's levels, s / scale (0 for zero and NaN scales, whose codes
 * are all 0), clamped for a subnormal scale. */
__device__ __forceinline__ float qs_inv(float scale, int levels) {
    float inv = scale > 0 ? __fdiv_rn((float)levels, scale) : 0.0f;
    return inv <= 3.402823466e38f ? inv : 3.402823466e38f;
}

/* ---- encode, buckets of up to QS_TILE elements: a block per tile of whole buckets ----------
 *   1. stage the tile's values in shared memory (x, plus decode(in) on a ring hop), with every
 *      load of the tile in flight at once;
 *   2. one half-warp per bucket: its norm in the host's order, the scale onto the wire;
 *   3. one thread per group of 8 elements: the levels, `BITS` code bytes per group.
 * Each input byte is read once. */
enum { QS_TILE = 4096, QS_TILE_BUCKETS = 256 };

template <int BITS>
__global__ void __launch_bounds__(THREADS)
    k_qsgd_encode_tile(gvq_dev_qsgd_t q, size_t off, size_t count, const float *x,
                       const uint8_t *in, uint8_t *out, unsigned nbk) {
    __shared__ __align__(16) float sv[QS_TILE];
    __shared__ float ssc[QS_TILE_BUCKETS], sin[QS_TILE_BUCKETS], sunit[QS_TILE_BUCKETS];
    const unsigned bucket = (unsigned)q.bucket, full = (unsigned)qs_bucket_bytes(BITS, bucket);
    const unsigned gpb = (bucket + 7) / 8, lane = threadIdx.x & 31, half = lane >> 4;
    const unsigned j = lane & 15, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const size_t nb = (count + bucket - 1) / bucket, ntiles = (nb + nbk - 1) / nbk;
    for (size_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        size_t b0 = tile * nbk, e0 = b0 * bucket;
        unsigned nbt = (unsigned)GVQ_MIN((size_t)nbk, nb - b0);
        unsigned ne = (unsigned)GVQ_MIN((size_t)nbt * bucket, count - e0);
        const uint8_t *inw = in != NULL ? in + b0 * full : NULL;
        __syncthreads(); /* the last tile's readers are done with sv and ssc */
        /* 1. stage: quads of a bucket as float4 where they line up, then the rest */
        if (inw != NULL) { /* the incoming buckets' scales and units, one division each */
            for (unsigned bk = threadIdx.x; bk < nbt; bk += blockDim.x) {
                float sc = qs_scale_of(inw + (size_t)bk * full);
                sin[bk] = sc;
                sunit[bk] = sc / (float)q.levels;
            }
            __syncthreads();
        }
        unsigned n4 = 0;
        if ((bucket & 3) == 0 && ((uintptr_t)(x + e0) & 15) == 0) {
            n4 = ne / 4;
#pragma unroll 4
            for (unsigned i4 = threadIdx.x; i4 < n4; i4 += blockDim.x) {
                float4 v = ((const float4 *)(x + e0))[i4];
                if (inw != NULL) {
                    unsigned i = i4 * 4, bk = i / bucket, rr = i - bk * bucket;
                    const uint8_t *codes = inw + (size_t)bk * full + sizeof(float);
                    float sc = sin[bk], unit = sunit[bk];
                    v.x = __fadd_rn(qs_deq_code<BITS>(qs_code_at<BITS>(codes, rr), sc, unit), v.x);
                    v.y = __fadd_rn(qs_deq_code<BITS>(qs_code_at<BITS>(codes, rr + 1), sc, unit),
                                    v.y);
                    v.z = __fadd_rn(qs_deq_code<BITS>(qs_code_at<BITS>(codes, rr + 2), sc, unit),
                                    v.z);
                    v.w = __fadd_rn(qs_deq_code<BITS>(qs_code_at<BITS>(codes, rr + 3), sc, unit),
                                    v.w);
                }
                ((float4 *)sv)[i4] = v;
            }
        }
        for (unsigned i = n4 * 4 + threadIdx.x; i < ne; i += blockDim.x) {
            float v = x[e0 + i];
            if (inw != NULL) {
                unsigned bk = i / bucket;
                v = __fadd_rn(qs_deq<BITS>(inw + (size_t)bk * full, q.levels, i - bk * bucket), v);
            }
            sv[i] = v;
        }
        __syncthreads();
        /* 2. norms, two buckets per warp and pass (every lane takes part in the shuffles) */
        for (unsigned base = warp * 2; base < nbt; base += nwarps * 2) {
            unsigned bk = base + half;
            double acc = 0;
            int finite = 1;
            if (bk < nbt) {
                unsigned len =
                    (unsigned)GVQ_MIN((size_t)bucket, count - (e0 + (size_t)bk * bucket));
                const float *v = sv + (size_t)bk * bucket;
                for (unsigned i = j; i < len; i += 16)
                    qs_norm_add(q, v[i], &acc, &finite);
            }
            float scale = qs_half_scale(q, acc, finite, half);
            if (bk < nbt && j == 0) {
                ssc[bk] = scale;
                memcpy(out + (b0 + bk) * full, &scale, sizeof scale);
            }
        }
        __syncthreads();
        /* 3. codes */
        for (unsigned t = threadIdx.x; t < nbt * gpb; t += blockDim.x) {
            unsigned bk = t / gpb, g = t - bk * gpb, i0 = g * 8;
            unsigned len = (unsigned)GVQ_MIN((size_t)bucket, count - (e0 + (size_t)bk * bucket));
            if (i0 >= len) continue;
            int n8 = (int)GVQ_MIN(len - i0, 8u);
            float sc = ssc[bk];
            uint64_t packed = 0;
            if (sc > 0) { /* zero bucket: codes 0; NaN scale: codes 0 */
                float v[8];
                const float *sp = sv + (size_t)bk * bucket + i0;
                if (n8 == 8 && (bucket & 3) == 0) { /* two 16-byte reads, few bank conflicts */
                    float4 a = ((const float4 *)sp)[0], b = ((const float4 *)sp)[1];
                    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
                    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
                } else {
#pragma unroll
                    for (int k = 0; k < 8; k++)
                        v[k] = k < n8 ? sp[k] : 0.0f;
                }
                packed = qs_levels8<BITS>(q, v, n8, off + e0 + (size_t)bk * bucket + i0,
                                          qs_inv(sc, q.levels));
            }
            qs_put(out + (b0 + bk) * full + sizeof(float) + (size_t)g * BITS, packed,
                   (n8 * BITS + 7) / 8);
        }
    }
}

/* ---- encode, buckets longer than QS_TILE: one warp per two buckets, straight from memory ----
 * (the second read of a bucket hits L2) */
template <int BITS>
__global__ void k_qsgd_encode_long(gvq_dev_qsgd_t q, size_t off, size_t count, const float *x,
                                   const uint8_t *in, uint8_t *out) {
    const size_t bucket = q.bucket, full = qs_bucket_bytes(BITS, bucket);
    const size_t nb = (count + bucket - 1) / bucket;
    const unsigned lane = threadIdx.x & 31, half = lane >> 4, j = lane & 15;
    const size_t nwarps = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t pair = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; pair * 2 < nb;
         pair += nwarps) {
        size_t b = pair * 2 + half;
        double acc = 0;
        int finite = 1;
        if (b < nb) {
            size_t first = b * bucket, len = GVQ_MIN(count - first, bucket);
            const uint8_t *inb = in != NULL ? in + b * full : NULL;
            for (size_t i = j; i < len; i += 16) {
                float v = x[first + i];
                if (inb != NULL) v = __fadd_rn(qs_deq<BITS>(inb, q.levels, (unsigned)i), v);
                qs_norm_add(q, v, &acc, &finite);
            }
        }
        float scale = qs_half_scale(q, acc, finite, half);
        if (b < nb && j == 0) memcpy(out + b * full, &scale, sizeof scale);
        const float sc0 = __shfl_sync(0xffffffffu, scale, 0);
        const float sc1 = __shfl_sync(0xffffffffu, scale, 16);
        for (int h = 0; h < 2; h++) {
            size_t bb = pair * 2 + h;
            if (bb >= nb) break;
            size_t first = bb * bucket, len = GVQ_MIN(count - first, bucket);
            const uint8_t *inb = in != NULL ? in + bb * full : NULL;
            float sc = h ? sc1 : sc0;
            for (size_t g = lane; g * 8 < len; g += 32) {
                size_t i0 = g * 8;
                int n8 = (int)GVQ_MIN(len - i0, (size_t)8);
                uint64_t packed = 0;
                if (sc > 0) {
                    float v[8];
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        v[k] = 0.0f;
                        if (k < n8) {
                            v[k] = x[first + i0 + k];
                            if (inb != NULL)
                                v[k] = __fadd_rn(qs_deq<BITS>(inb, q.levels, (unsigned)(i0 + k)),
                                                 v[k]);
                        }
                    }
                    packed = qs_levels8<BITS>(q, v, n8, off + first + i0, qs_inv(sc, q.levels));
                }
                qs_put(out + bb * full + sizeof(float) + g * BITS, packed, (n8 * BITS + 7) / 8);
            }
        }
    }
}

/* ---- decode: one thread per group of 8 elements of a bucket: scale and code bytes in once,
 * 8 floats out */
template <int BITS>
__global__ void k_qsgd_decode(gvq_dev_qsgd_t q, size_t count, const uint8_t *wire, float *dst) {
    const size_t bucket = q.bucket, full = qs_bucket_bytes(BITS, bucket);
    const size_t gpb = (bucket + 7) / 8, nb = (count + bucket - 1) / bucket;
    GRID_LOOP(t, nb * gpb) {
        size_t b, gi;
        if (t <= 0xFFFFFFFFu && gpb <= 0xFFFFFFFFu) { /* 32-bit division where it fits */
            b = (unsigned)t / (unsigned)gpb;
        } else {
            b = t / gpb;
        }
        gi = t - b * gpb;
        size_t i0 = gi * 8, first = b * bucket, len = GVQ_MIN(count - first, bucket);
        if (i0 >= len) continue;
        int n8 = (int)GVQ_MIN(len - i0, (size_t)8);
        const uint8_t *bw = wire + b * full;
        float sc = qs_scale_of(bw), unit = sc / (float)q.levels;
        const uint8_t *cp = bw + sizeof(float) + gi * BITS;
        uint64_t packed = 0;
        if (BITS == 4 && n8 == 8 && ((uintptr_t)cp & 3) == 0) {
            packed = *(const uint32_t *)cp;
        } else {
            for (int k = 0; k < (n8 * BITS + 7) / 8; k++)
                packed |= (uint64_t)cp[k] << (8 * k);
        }
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] =
                qs_deq_code<BITS>((unsigned)(packed >> (k * BITS)) & ((1u << BITS) - 1u), sc, unit);
        float *d = dst + first + i0;
        if (n8 == 8 && ((uintptr_t)d & 15) == 0) {
            ((float4 *)d)[0] = make_float4(v[0], v[1], v[2], v[3]);
            ((float4 *)d)[1] = make_float4(v[4], v[5], v[6], v[7]);
        } else {
            for (int k = 0; k < n8; k++)
                d[k] = v[k];
        }
    }
}

template <int BITS>
static void qsgd_launch_encode(gvq_cuda_ctx_t *c, const gvq_dev_qsgd_t *q, size_t off, size_t count,
                               const float *local, const uint8_t *in, uint8_t *out) {
    size_t nb = (count + q->bucket - 1) / q->bucket;
    if (q->bucket <= QS_TILE) {
        unsigned nbk = (unsigned)GVQ_MIN((size_t)QS_TILE / q->bucket, (size_t)QS_TILE_BUCKETS);
        size_t tiles = (nb + nbk - 1) / nbk;
        k_qsgd_encode_tile<BITS><<<(unsigned)GVQ_MIN(tiles, (size_t)65535), THREADS, 0, c->cur>>>(
            *q, off, count, local, in, out, nbk);
    } else {
        k_qsgd_encode_long<BITS>
            <<<blocks_for((nb + 1) / 2 * 32), THREADS, 0, c->cur>>>(*q, off, count, local, in, out);
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
    const uint8_t *inw = (const uint8_t *)in;
    uint8_t *o = (uint8_t *)out;
    if (q->bits == 2)
        qsgd_launch_encode<2>(c, q, off, count, local, inw, o);
    else if (q->bits == 4)
        qsgd_launch_encode<4>(c, q, off, count, local, inw, o);
    else
        qsgd_launch_encode<8>(c, q, off, count, local, inw, o);
    LAUNCHCHECK("qsgd encode");
    return gvqSuccess;
}

extern "C" gvqResult_t gvq_cuda_qsgd_decode(const gvq_dev_qsgd_t *q, size_t off, size_t count,
                                            const void *wire, float *dst) {
    (void)off;
    GVQCHECK(qsgd_check(q));
    if (count == 0) return gvqSuccess;
    CTX(c);
    size_t groups = (count + q->bucket - 1) / q->bucket * ((q->bucket + 7) / 8);
    const uint8_t *w = (const uint8_t *)wire;
    if (q->bits == 2)
        k_qsgd_decode<2><<<blocks_for(groups), THREADS, 0, c->cur>>>(*q, count, w, dst);
    else if (q->bits == 4)
        k_qsgd_decode<4><<<blocks_for(groups), THREADS, 0, c->cur>>>(*q, count, w, dst);
    else
        k_qsgd_decode<8><<<blocks_for(groups), THREADS, 0, c->cur>>>(*q, count, w, dst);
    LAUNCHCHECK("qsgd decode");
    return gvqSuccess;
}
