/*
 * codec_gradiveq.cu -- GradiVeQ's chunk operations on the CUDA device
 * (algorithms/codec_gradiveq.c, the same wire): the projections through cuBLAS, the centering,
 * the incoming coefficients and the wire's precision in kernels, and the norms of the local
 * loss estimate summed on the device.
 *
 *   slices [s0, s0+k) of a chunk, reuse group = slice / C:
 *     | head: partial group | full groups of C slices ...      | rest: partial group |
 *       one sgemm             one strided-batched sgemm            one sgemm
 * encode: C_run = U_g^T X_run (d x k) through cuBLAS; decode: X_run = U_g C_run + Z_g in one
 * kernel for d = 16, 32, 48, 64 (k_gq_decode_rows), else Z_g into X_run and cuBLAS adds U_g C_run.
 *
 *   wire of a chunk: [ d coefficients per full slice, fp32 or fp16, padded to 4 bytes ][ tail ]
 *                    the tail: count % L raw fp32 values (the tensor's last chunk only)
 */
#include <stdint.h>

#include "gvq_cuda.h"

/* ---- block reduction of up to two doubles into device accumulators --------------------------- */

__device__ __forceinline__ void block_add2(double a, double b, double *acc_a, double *acc_b) {
    __shared__ double sa[THREADS / 32], sb[THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, o);
        b += __shfl_down_sync(0xffffffffu, b, o);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sa[warp] = a;
        sb[warp] = b;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double ta = 0, tb = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) {
            ta += sa[w];
            tb += sb[w];
        }
        if (acc_a != NULL) atomicAdd(acc_a, ta);
        if (acc_b != NULL) atomicAdd(acc_b, tb);
    }
}

static size_t gq_coef_bytes(const gvq_dev_gq_t *g, size_t slices) {
    size_t b = slices * g->d * (g->wire_fp16 ? 2 : 4);
    return (b + 3) & ~(size_t)3;
}

static gvqResult_t gq_gemm(gvq_cuda_ctx_t *c, const gvq_dev_gq_t *g, size_t s0, size_t slices,
                           int encode, const float *X, float *Cf, float *Xout) {
    const int L = (int)g->L, d = (int)g->d;
    const float one = 1.0f, zero = 0.0f;
    size_t rel = 0;
    while (rel < slices) {
        size_t grp = (s0 + rel) / g->C, k = GVQ_MIN(slices - rel, (grp + 1) * g->C - (s0 + rel));
        size_t batch = 1;
        if (k == g->C) { /* full groups from here on: one batched call for all of them */
            batch = (slices - rel) / g->C;
        }
        const float *U = g->U + grp * g->L * g->d;
        long long sU = (long long)g->L * d, sX = (long long)g->C * L, sC = (long long)g->C * d;
        if (encode) {
            if (batch == 1)
                CUBLASCHECK(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, d, (int)k, L, &one, U, L,
                                        X + rel * g->L, L, &zero, Cf + rel * g->d, d));
            else
                CUBLASCHECK(cublasSgemmStridedBatched(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, d, (int)k,
                                                      L, &one, U, L, sU, X + rel * g->L, L, sX,
                                                      &zero, Cf + rel * g->d, d, sC, (int)batch));
        } else {
            if (batch == 1)
                CUBLASCHECK(cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, L, (int)k, d, &one, U, L,
                                        Cf + rel * g->d, d, &one, Xout + rel * g->L, L));
            else
                CUBLASCHECK(cublasSgemmStridedBatched(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, L, (int)k,
                                                      d, &one, U, L, sU, Cf + rel * g->d, d, sC,
                                                      &one, Xout + rel * g->L, L, sX, (int)batch));
        }
        rel += k * batch;
    }
    return gvqSuccess;
}

/* ||x - Z/N||^2 and ||x||^2 over the full slices whose global index is a multiple of
 * GVQ_GQ_LOSS_STRIDE, as the host sums them. */
__global__ void k_gq_xnorms(const float *x, const float *Z, size_t L, size_t C, size_t s0,
                            size_t full_elems, float inv_n, double *acc) {
    double x2 = 0, all2 = 0;
    GRID_LOOP(e, full_elems) {
        size_t j = e / L;
        if ((s0 + j) % GVQ_GQ_LOSS_STRIDE != 0) continue;
        double v = x[e];
        all2 += v * v;
        size_t grp = (s0 + j) / C;
        double u = __dsub_rn(v, __dmul_rn((double)Z[grp * L + e % L], (double)inv_n));
        x2 += u * u;
    }
    block_add2(x2, all2, acc + 0, acc + 2);
}

/* c = coef - UZ_g / N, ||c||^2, then + incoming, stored in the wire's precision. */
__global__ void k_gq_finish(const float *coef, const float *UZ, size_t d, size_t C, size_t s0,
                            size_t n, float inv_n, const void *in, void *out, int fp16,
                            double *acc) {
    double c2 = 0;
    GRID_LOOP(idx, n) {
        size_t j = idx / d, i = idx % d, grp = (s0 + j) / C;
        float cv = __fsub_rn(coef[idx], __fmul_rn(UZ[grp * d + i], inv_n));
        if ((s0 + j) % GVQ_GQ_LOSS_STRIDE == 0) c2 += (double)cv * cv;
        if (in != NULL)
            cv = __fadd_rn(cv, fp16 ? gvq_half_to_float(((const uint16_t *)in)[idx])
                                    : ((const float *)in)[idx]);
        if (fp16)
            ((uint16_t *)out)[idx] = gvq_float_to_half(cv);
        else
            ((float *)out)[idx] = cv;
    }
    if (acc != NULL) block_add2(c2, 0.0, acc + 1, NULL);
}

__global__ void k_gq_tail(const float *x, const float *tin, float *t, size_t n) {
    GRID_LOOP(i, n) t[i] = __fadd_rn(x[i], tin != NULL ? tin[i] : 0.0f);
}

__global__ void k_gq_fill_z(float *x, const float *Z, size_t L, size_t C, size_t s0, size_t n) {
    GRID_LOOP(e, n) {
        size_t j = e / L, grp = (s0 + j) / C;
        x[e] = Z[grp * L + e % L];
    }
}

__global__ void k_half_to_float(const uint16_t *h, float *f, size_t n) {
    GRID_LOOP(i, n) f[i] = gvq_half_to_float(h[i]);
}

/* ---- the decode: X = U_g C + Z_g, one thread per row l of U_g, the row in registers --------
 * For d = 16, 32, 48, 64 (a template each: the row in registers, the coefficients read as
 * float4). A block takes GQ_DEC_SLICES slices; their coefficients are staged in shared memory
 * (fp16 wires converted there), and each thread writes element l of each slice:
 * x = Z_g[l] + (sum_i U_g[l, i] c_i, fused multiply-adds in i order). */
enum { GQ_DEC_SLICES = 32 };

template <int D>
__global__ void __launch_bounds__(THREADS)
    k_gq_decode_rows(const void *wire, int fp16, const float *Ug, const float *Zg, size_t L,
                     size_t C, size_t s0, size_t slices, float *dst) {
    __shared__ __align__(16) float cs[GQ_DEC_SLICES * D];
    const int d = D;
    const size_t lanes = L >= THREADS ? 1 : THREADS / L; /* slices side by side in a block */
    const size_t ntile = (slices + GQ_DEC_SLICES - 1) / GQ_DEC_SLICES;
    for (size_t tile = blockIdx.x; tile < ntile; tile += gridDim.x) {
        size_t j0 = tile * GQ_DEC_SLICES, nj = GVQ_MIN(slices - j0, (size_t)GQ_DEC_SLICES);
        __syncthreads();
        for (size_t e = threadIdx.x; e < nj * (size_t)d; e += blockDim.x) {
            size_t o = j0 * (size_t)d + e;
            cs[e] =
                fp16 ? gvq_half_to_float(((const uint16_t *)wire)[o]) : ((const float *)wire)[o];
        }
        __syncthreads();
        for (size_t l0 = threadIdx.x % (L >= THREADS ? THREADS : L); l0 < L;
             l0 += (L >= THREADS ? THREADS : L)) {
            size_t jl = L >= THREADS ? 0 : threadIdx.x / L;
            if (jl >= lanes) break;
            float u[D];
            float z = 0;
            size_t gbeg = 1, gend = 0; /* the slices of group `have` */
            for (size_t j = jl; j < nj; j += lanes) {
                size_t gs = s0 + j0 + j;
                if (gs < gbeg || gs >= gend) { /* a division only where the group changes */
                    size_t grp = gs / C;
                    gbeg = grp * C;
                    gend = gbeg + C;
                    const float *U = Ug + grp * L * (size_t)d;
#pragma unroll
                    for (int i = 0; i < D; i++)
                        u[i] = U[(size_t)i * L + l0];
                    z = Zg[grp * L + l0];
                }
                const float4 *c4 = (const float4 *)(cs + j * (size_t)D); /* D % 4 == 0 */
                float a = 0.0f;
#pragma unroll
                for (int i4 = 0; i4 < D / 4; i4++) {
                    float4 c = c4[i4];
                    a = __fmaf_rn(u[4 * i4], c.x, a);
                    a = __fmaf_rn(u[4 * i4 + 1], c.y, a);
                    a = __fmaf_rn(u[4 * i4 + 2], c.z, a);
                    a = __fmaf_rn(u[4 * i4 + 3], c.w, a);
                }
                dst[(j0 + j) * L + l0] = __fadd_rn(a, z);
            }
        }
    }
}

static gvqResult_t gq_check(const gvq_dev_gq_t *g) {
    if (g->L == 0 || g->d == 0 || g->d > g->L || g->C == 0 || g->nranks < 1 || g->U == NULL ||
        g->Z == NULL || g->UZ == NULL) {
        GVQ_WARN("CUDA GradiVeQ: invalid shape L=%zu d=%zu C=%zu nranks=%d", g->L, g->d, g->C,
                 g->nranks);
        return gvqInternalError;
    }
    return gvqSuccess;
}

extern "C" gvqResult_t gvq_cuda_gq_encode_combine(const gvq_dev_gq_t *g, size_t off, size_t count,
                                                  const float *x, const void *in, void *out,
                                                  double norms[3]) {
    GVQCHECK(gq_check(g));
    if (count == 0) return gvqSuccess;
    CTX(c);
    size_t L = g->L, d = g->d, s0 = off / L, slices = count / L, tail = count % L;
    const float inv_n = 1.0f / (float)g->nranks;
    float *coef = (float *)out;
    if (g->wire_fp16 && slices) {
        void *t = NULL;
        GVQCHECK(gvq_cuda_scratch(c, slices * d * sizeof(float), &t));
        coef = (float *)t;
    }
    double *acc = norms != NULL ? c->norms : NULL;
    if (acc != NULL) {
        CUDACHECK(cudaMemsetAsync(acc, 0, 3 * sizeof(double), c->cur));
        if (slices) {
            k_gq_xnorms<<<blocks_for(slices * L), THREADS, 0, c->cur>>>(x, g->Z, L, g->C, s0,
                                                                        slices * L, inv_n, acc);
            LAUNCHCHECK("gq norms");
        }
    }
    if (slices) {
        GVQCHECK(gq_gemm(c, g, s0, slices, 1, x, coef, NULL));
        k_gq_finish<<<blocks_for(slices * d), THREADS, 0, c->cur>>>(
            coef, g->UZ, d, g->C, s0, slices * d, inv_n, in, out, g->wire_fp16, acc);
        LAUNCHCHECK("gq finish");
    }
    if (tail) {
        size_t cb = gq_coef_bytes(g, slices);
        const float *tin = in != NULL ? (const float *)((const char *)in + cb) : NULL;
        k_gq_tail<<<blocks_for(tail), THREADS, 0, c->cur>>>(x + slices * L, tin,
                                                            (float *)((char *)out + cb), tail);
        LAUNCHCHECK("gq tail");
    }
    if (acc != NULL) {
        double h[3];
        CUDACHECK(cudaMemcpyAsync(h, acc, sizeof h, cudaMemcpyDeviceToHost, c->cur));
        CUDACHECK(cudaStreamSynchronize(c->cur));
        for (int i = 0; i < 3; i++)
            norms[i] += h[i];
    }
    return gvqSuccess;
}

extern "C" gvqResult_t gvq_cuda_gq_decode(const gvq_dev_gq_t *g, size_t off, size_t count,
                                          const void *wire, float *dst) {
    GVQCHECK(gq_check(g));
    if (count == 0) return gvqSuccess;
    CTX(c);
    size_t L = g->L, d = g->d, s0 = off / L, slices = count / L, tail = count % L;
    size_t blocks = GVQ_MIN((slices + GQ_DEC_SLICES - 1) / GQ_DEC_SLICES, (size_t)65535);
    const int f = g->wire_fp16;
    if (slices && d == 16)
        k_gq_decode_rows<16><<<(unsigned)blocks, THREADS, 0, c->cur>>>(wire, f, g->U, g->Z, L, g->C,
                                                                       s0, slices, dst);
    else if (slices && d == 32)
        k_gq_decode_rows<32><<<(unsigned)blocks, THREADS, 0, c->cur>>>(wire, f, g->U, g->Z, L, g->C,
                                                                       s0, slices, dst);
    else if (slices && d == 48)
        k_gq_decode_rows<48><<<(unsigned)blocks, THREADS, 0, c->cur>>>(wire, f, g->U, g->Z, L, g->C,
                                                                       s0, slices, dst);
    else if (slices && d == 64)
        k_gq_decode_rows<64><<<(unsigned)blocks, THREADS, 0, c->cur>>>(wire, f, g->U, g->Z, L, g->C,
                                                                       s0, slices, dst);
    if (slices && (d == 16 || d == 32 || d == 48 || d == 64)) {
        LAUNCHCHECK("gq decode");
    } else if (slices) { /* other d: Z into dst, then cuBLAS adds U C */
        const float *coef = (const float *)wire;
        if (g->wire_fp16) {
            void *t = NULL;
            GVQCHECK(gvq_cuda_scratch(c, slices * d * sizeof(float), &t));
            k_half_to_float<<<blocks_for(slices * d), THREADS, 0, c->cur>>>((const uint16_t *)wire,
                                                                            (float *)t, slices * d);
            LAUNCHCHECK("gq half");
            coef = (const float *)t;
        }
        k_gq_fill_z<<<blocks_for(slices * L), THREADS, 0, c->cur>>>(dst, g->Z, L, g->C, s0,
                                                                    slices * L);
        LAUNCHCHECK("gq fill");
        GVQCHECK(gq_gemm(c, g, s0, slices, 0, NULL, (float *)coef, dst));
    }
    if (tail)
        CUDACHECK(cudaMemcpyAsync(dst + slices * L, (const char *)wire + gq_coef_bytes(g, slices),
                                  tail * sizeof(float), cudaMemcpyDeviceToDevice, c->cur));
    return gvqSuccess;
}
