/*
 * codec_kernels.h -- the host codecs' inner loops (QSGD, the integer-summed wires, fp16, error
 * feedback's sums, and the products of GradiVeQ, PowerSGD and the tracked basis), one table
 * per instruction set: codec_kernels.c is compiled once per path (scalar, avx2, avx512; see
 * CMakeLists.txt) and codec_kernels_dispatch.c picks the table once per process.
 *
 * Every path gives the same output bit for bit (docs/ARCHITECTURE.md, "Codec kernels"): the
 * kernels use only integer operations and single IEEE operations with the order of every sum
 * fixed by the C code (lanes combined in one order, or one chain of fmaf per product's value),
 * compiled without contraction or
 * reassociation (-ffp-contract=off, no -ffast-math); the vector paths differ from the scalar one
 * only in how many lanes run at once. So ranks whose CPUs take different paths agree, and
 * tests/unit/test_kernels.c checks it by running every path this CPU has on the same inputs.
 * One exception: where two NaNs meet in a product's multiply-add (expand, project, back), which
 * payload and sign survive depends on the instruction (libm's fmaf or a vfmadd form); the
 * result is NaN on every path. No such NaN reaches a codec's output: a gradient holding NaN or
 * Inf on any rank is sent uncompressed on every rank alike (PowerSGD and the tracked basis before
 * any product runs; GradiVeQ's ring runs first, and its output, NaN at the same places on every
 * rank, is then replaced by the plain sum).
 *
 * Random bits (gvq_rng.h): value e of a stream draws 16 bits, half (e & 1) of word
 * ((e >> 1) & 3) of the Philox block with counter (e >> 3, call, tag) and key (seed, rank):
 * one Philox-4x32-10 per 8 values; u = draw / 65536 in [0, 1). The CUDA kernels draw the same.
 */
#ifndef GVQ_CODEC_KERNELS_H_
#define GVQ_CODEC_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

enum { GVQ_K_NORM_L2 = 0, GVQ_K_NORM_MAX = 1 };
#define GVQ_K_TAG_QSGD 0x51534744u   /* "QSGD" */
#define GVQ_K_TAG_INTSUM 0x49535543u /* "ISUC" */
/* Values whose |v| exceeds this count as non-finite (the codecs' NaN/Inf rule, host and device) */
#define GVQ_K_FINITE_MAX 3.0e38f

typedef struct {
    int bits;        /* QSGD: 2, 4 or 8; integer wire: 8 or 16 */
    int levels;      /* QSGD: s; integer wire: lv */
    int norm;        /* QSGD: GVQ_K_NORM_* */
    uint32_t key[2]; /* (seed, rank) */
    uint32_t call, tag;
} gvq_kparams_t;

#define GVQ_K_MB_UNKNOWN 0xffffffffu /* qsgd_quantize: find the bucket's max itself */

typedef struct {
    const char *name; /* "scalar", "avx2", "avx512" */
    /* One QSGD bucket of len values, the first of which is value `first` of its stream, into
     * wire ([float scale][codes]; codec_qsgd.c); mb: the largest bit pattern of |v| when the
     * caller knows it (qsgd_dequantize's result), else GVQ_K_MB_UNKNOWN. */
    void (*qsgd_quantize)(const gvq_kparams_t *p, uint64_t first, const float *v, size_t len,
                          uint8_t *wire, uint32_t mb);
    /* One bucket's wire back to len values, plus add[i] when add is not NULL; returns the
     * largest bit pattern of the |values| written when add is not NULL (a ring hop's sum, about
     * to be quantized), else 0. */
    uint32_t (*qsgd_dequantize)(const gvq_kparams_t *p, const uint8_t *wire, size_t len,
                                const float *add, float *out);
    /* Integer wire: out[j] = round(|y[j]| mult) signed (+ in[j]) for n values, the first value
     * of the stream being k0; mult per value (stride 1) or one for all (stride 0), 0 for a
     * zero or non-finite block; p->bits 8 or 16 (int8/int16 wire), in may be NULL. */
    void (*is_quantize_add)(const gvq_kparams_t *p, uint64_t k0, const float *y, size_t n,
                            const float *mult, int stride, const void *in, void *out);
    /* dst[j] = wire[j] unit (unit per value or one for all; NaN for a non-finite block). */
    void (*is_to_float)(int bits, const void *wire, size_t n, const float *unit, int stride,
                        float *dst);
    /* out[b] = max |y| over block b of `block` values (NaN counts as Inf), n values. */
    void (*max_abs_blocks)(const float *y, size_t n, size_t block, float *out);
    /* 1 when none of the n values is NaN or +-Inf (an integer max of the bit patterns: exact). */
    int (*all_finite)(const float *v, size_t n);
    /* IEEE binary16 <-> float, the bits of gvq_util.h's gvq_float_to_half / gvq_half_to_float
     * (round to nearest even, NaN kept NaN) */
    void (*f32_to_f16)(const float *src, uint16_t *dst, size_t n);
    void (*f16_to_f32)(const uint16_t *src, float *dst, size_t n);
    /* out (n x m row-major) = alpha P Q^T + beta out, or alpha P Q^T + z when z is not NULL (z:
     * m floats added to every row); p_ij at P[i pi + j pj] (column-major: pi 1, pj n), Q m x r
     * column-major; each value's r products one fmaf chain in order, then alpha and the added
     * term in separate roundings (the host's low-rank expand; beta 0 and z NULL: out not read;
     * codec_linalg.h) */
    void (*expand)(size_t n, size_t m, size_t r, const float *P, size_t pi, size_t pj,
                   const float *Q, float alpha, float beta, const float *z, float *out);
    /* C (n x d) = S U, c_ij at C[i ci + j cj], S n x m row-major, U m x d column-major, any d;
     * each c_ij one fmaf chain over l in order (codec_linalg.h). With residual, also S = S - C
     * U^T row by row (the bits of expand with alpha -1, beta 1). */
    void (*project)(size_t n, size_t m, size_t d, const float *S, const float *U, float *C,
                    size_t ci, size_t cj, int residual);
    /* B (m x d, column-major) = S^T C, S n x m row-major, c_ij at C[i ci + j cj], any d; each
     * b_lj one fmaf chain over the rows i in order (codec_linalg.h). */
    void (*back)(size_t n, size_t m, size_t d, const float *S, const float *C, size_t ci, size_t cj,
                 float *B);
    /* GradiVeQ's filter collocation of a [K][D][H][W] tensor and back (codec_colloc.h: position
     * p = d H W + hw of filter k to row hw D + d, column k); data movement only */
    void (*collocate)(const float *src, float *dst, size_t K, size_t D, size_t H, size_t W);
    void (*uncollocate)(const float *src, float *dst, size_t K, size_t D, size_t H, size_t W);
    /* The sum of squares in double of n values, value i into lane i % 8, the lanes added 0..7 in
     * order (error feedback's norms), copying v into dst on the way when dst is not NULL. */
    double (*sumsq8)(const float *v, float *dst, size_t n);
    /* x = g + e (e NULL: x = g) into out (NULL: not written), *gs and *xs the sumsq8 of g and of
     * x; returns 1 when every x is finite. */
    int (*ef_prepare)(const float *g, const float *e, size_t n, float *out, double *gs, double *xs);
} gvq_kernels_t;

extern const gvq_kernels_t gvq_kernels_scalar;
#if defined(GVQ_KERNELS_X86)
extern const gvq_kernels_t gvq_kernels_avx2;
extern const gvq_kernels_t gvq_kernels_avx512;
#endif

/* Asks the cache for the lines of [p, p + bytes) (read), ahead of a kernel's call on them: the
 * codecs' loops over buckets of 512 values fetch the next bucket while the kernels work on this
 * one (the hardware's prefetch starts each short stream late; perf/RESULTS.md section 12). Only a
 * hint: no fault, whatever p is. */
static inline void gvq_prefetch_range(const void *p, size_t bytes) {
#if defined(__GNUC__)
    const uintptr_t a = (uintptr_t)p & ~(uintptr_t)63, end = (uintptr_t)p + bytes;
    for (uintptr_t o = a; o < end; o += 64) /* every line the range touches */
        __builtin_prefetch((const void *)o, 0, 3);
#else
    (void)p, (void)bytes;
#endif
}

/* The table this process uses: GVQ_SIMD (auto, scalar, avx2, avx512) or, for auto, the widest
 * this CPU runs. Chosen once; a forced path this CPU lacks is refused with a WARN (auto). */
const gvq_kernels_t *gvq_kernels(void);
/* The table of a path by name if this build and CPU have it, else NULL. */
const gvq_kernels_t *gvq_kernels_named(const char *name);
/* Selects a path for the rest of the process (tests, benchmarks); returns 0, or -1 if absent. */
int gvq_kernels_force(const char *name);

#endif /* GVQ_CODEC_KERNELS_H_ */
