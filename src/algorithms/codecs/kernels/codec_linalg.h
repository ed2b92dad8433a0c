/*
 * codec_linalg.h -- the low-rank products of the host codecs, included by codec_kernels.c only
 * (compiled once per path): the expand (PowerSGD's decompression, the tracked basis's residual
 * and output) and the projection (PowerSGD's P = M Q, the tracked basis's coefficients). The C
 * forms define the bits; the AVX2 and AVX-512 forms run the same operations in the same order
 * per lane (tests/unit/test_kernels.c holds every path to the C forms).
 */
#ifndef GVQ_CODEC_LINALG_H_
#define GVQ_CODEC_LINALG_H_

/* ---- low-rank expand: out (n x m, row-major) = alpha P Q^T + beta out, or + z ----------------
 * P n x r with p_ij at P[i pi + j pj] (column-major: pi 1, pj n; GradiVeQ's coefficients, a
 * slice's d together: pi d, pj 1), Q m x r column-major (PowerSGD's decompression, the tracked
 * basis's residual and output, GradiVeQ's decode). Each output value is one chain of fused
 * multiply-adds over its r products in order j = 0..r-1 (fmaf), then alpha acc (+ beta out, or
 * + z[l] when z is not NULL: GradiVeQ's mean, the same m values added to every row) in separate
 * roundings; the lanes run along a row. beta 0 and z NULL: out is not read (as BLAS). */
enum { EXW = 64 }; /* values of a row per pass of the C form */

/* w <= EXW values of one output row: acc = P[i,0] Q[l,0] + ... (j in order), then alpha, beta */
static inline void expand_part(size_t w, size_t n, size_t m, size_t r, const float *Pi,
                               const float *Ql, float alpha, float beta, const float *z, float *o) {
    float acc[EXW];
    for (size_t l = 0; l < EXW; l++)
        acc[l] = 0.0f;
    if (w == EXW) {
        for (size_t j = 0; j < r; j++) {
            const float pj = Pi[j * n], *q = Ql + j * m;
            for (size_t l = 0; l < EXW; l++)
                acc[l] = fmaf(pj, q[l], acc[l]);
        }
    } else {
        for (size_t j = 0; j < r; j++) {
            const float pj = Pi[j * n], *q = Ql + j * m;
            for (size_t l = 0; l < w; l++)
                acc[l] = fmaf(pj, q[l], acc[l]);
        }
    }
    if (z != NULL)
        for (size_t l = 0; l < w; l++)
            o[l] = alpha * acc[l] + z[l];
    else if (beta == 0.0f)
        for (size_t l = 0; l < w; l++)
            o[l] = alpha * acc[l];
    else
        for (size_t l = 0; l < w; l++)
            o[l] = alpha * acc[l] + beta * o[l];
}

#if defined(__AVX512F__) || defined(__AVX2__)
/* The register tiles (codec_vtile.h) in 256-bit vectors on both vector paths, and in 512-bit
 * ones on the AVX-512 path. The 256-bit expand takes two rows at a time (each load of Q feeds two
 * chains: three quarters of a load per multiply-add) and reaches half the 512-bit multiply-add
 * rate; the 512-bit one takes four rows of four registers (64 values: half a load per
 * multiply-add); the back product runs tiles of 64 values by 4 columns. On the AVX-512 host of stop
 * 57 (perf/RESULTS.md section 12) the 512-bit back product took 0.6-0.7 of the 256-bit one's time
 * at d 16 and 32. */
#define VSUF ymm
#define VT __m256
#define VW 8
#if defined(__AVX512F__)
#define VBT 4 /* 16 chains in registers of the 32 (AVX-512VL) */
#else
#define VBT 2 /* 8 of 16 */
#endif
#define V_LOAD _mm256_loadu_ps
#define V_STORE _mm256_storeu_ps
#define V_SET1 _mm256_set1_ps
#define V_ZERO _mm256_setzero_ps
#define V_ADD _mm256_add_ps
#define V_MUL _mm256_mul_ps
#define V_FMA _mm256_fmadd_ps
enum { YW = 8, YBT = VBT }; /* for the callers: VBT is undefined by the inclusion */
#include "codec_vtile.h"    /* expand_rows_ymm, back_cols_ymm */
enum { EK1 = 8, EKR = 4 };  /* 256-bit registers of a row: alone, and beside another */
enum { PFE = 8 };           /* the expand fetches the rows PFE further on while it computes */
#define K_EXPAND_VEC 1
#else
#define K_EXPAND_VEC 0
#endif

#if defined(__AVX512F__)
#define VSUF zmm
#define VT __m512
#define VW 16
#define VBT 4
#define V_LOAD _mm512_loadu_ps
#define V_STORE _mm512_storeu_ps
#define V_SET1 _mm512_set1_ps
#define V_ZERO _mm512_setzero_ps
#define V_ADD _mm512_add_ps
#define V_MUL _mm512_mul_ps
#define V_FMA _mm512_fmadd_ps
#include "codec_vtile.h"                   /* expand_rows_zmm, back_cols_zmm */
enum { ZW = 16, ZBT = 4, ER = 4, EK = 4 }; /* the 512-bit expand's tile: rows, registers of a row */
#define K_EXPAND_ZMM 1
#else
#define K_EXPAND_ZMM 0
#endif

/* values [l0, m) of a row from its r coefficients pi[j * pn], the C form */
static inline void expand_tail(size_t l0, size_t m, size_t r, const float *pi, size_t pn,
                               const float *Q, float alpha, float beta, const float *z, float *o) {
    for (; l0 < m; l0 += EXW)
        expand_part(m - l0 < EXW ? m - l0 : EXW, pn, m, r, pi, Q + l0, alpha, beta,
                    z != NULL ? z + l0 : NULL, o + l0);
}

/* row i of out from its r coefficients pi[j * pn] */
static inline void expand_row(size_t m, size_t r, const float *pi, size_t pn, const float *Q,
                              float alpha, float beta, const float *z, float *o) {
    size_t l0 = 0;
#if K_EXPAND_VEC
    l0 = expand_rows_ymm(1, EK1, 0, m, r, &pi, pn, Q, alpha, beta, z, &o, 0);
#endif
    expand_tail(l0, m, r, pi, pn, Q, alpha, beta, z, o);
}

/* rows i .. i+R-1's coefficients into c[]: where they lie, or gathered into pr (returns the
 * stride of c's values) */
static inline size_t expand_coefs(size_t R, size_t i, const float *P, size_t pi, size_t pj,
                                  size_t r, int gather, float (*pr)[64], const float **c) {
    for (size_t rr = 0; rr < R; rr++) {
        c[rr] = P + (i + rr) * pi;
        if (gather) {
            for (size_t j = 0; j < r; j++)
                pr[rr][j] = c[rr][j * pj];
            c[rr] = pr[rr];
        }
    }
    return gather ? 1 : pj;
}

static void k_expand(size_t n, size_t m, size_t r, const float *P, size_t pi, size_t pj,
                     const float *Q, float alpha, float beta, const float *z, float *out) {
    /* row i's r coefficients, pj apart in P (column-major: n apart, often a multiple of 4 KiB:
     * one cache set for all), gathered once per row when it has several parts; read from there,
     * the same values */
    float pr[4][64];
    int gather = m > EXW && r <= 64 && pj != 1;
    size_t i = 0;
#if K_EXPAND_ZMM
    /* ER rows at once, 64 values at a time (without the prefetch of the rows written next, the
     * outputs only written ran slower this way out of the cache than in 256-bit pairs: stop 57) */
    for (; m >= EK * 16 && i + ER <= n; i += ER) {
        const float *c[ER];
        float *o[ER];
        for (size_t rr = 0; rr < ER; rr++)
            o[rr] = out + (i + rr) * m;
        size_t pn = expand_coefs(ER, i, P, pi, pj, r, gather, pr, c);
        size_t pfo = i + ER + PFE <= n ? PFE * m : 0;
        size_t l0 = expand_rows_zmm(ER, EK, 0, m, r, c, pn, Q, alpha, beta, z, o, pfo);
        for (size_t rr = 0; rr < ER; rr += 2) { /* the rest of the rows, two at a time */
            size_t l1 =
                expand_rows_ymm(2, EKR, l0, m, r, c + rr, pn, Q, alpha, beta, z, o + rr, pfo);
            for (size_t q = rr; q < rr + 2; q++)
                expand_tail(l1, m, r, c[q], pn, Q, alpha, beta, z, o[q]);
        }
    }
#endif
#if K_EXPAND_VEC
    for (; m >= EKR * YW && i + 2 <= n; i += 2) { /* two rows at once */
        const float *c[2];
        float *o[2] = {out + i * m, out + (i + 1) * m};
        size_t pn = expand_coefs(2, i, P, pi, pj, r, gather, pr, c);
        size_t pfo = i + 2 + PFE <= n ? PFE * m : 0;
        size_t l0 = expand_rows_ymm(2, EKR, 0, m, r, c, pn, Q, alpha, beta, z, o, pfo);
        for (size_t rr = 0; rr < 2; rr++)
            expand_tail(l0, m, r, c[rr], pn, Q, alpha, beta, z, o[rr]);
    }
#endif
    for (; i < n; i++) {
        const float *c;
        size_t pn = expand_coefs(1, i, P, pi, pj, r, gather, pr, &c);
        expand_row(m, r, c, pn, Q, alpha, beta, z, out + i * m);
    }
}

/* ---- projection: C (n x d) = S U ----------------------------------------------------------------
 * S n x m row-major, U m x d column-major, c_ij at C[i ci + j cj] (column-major: ci 1, cj n;
 * GradiVeQ's coefficients, a slice's d together: ci d, cj 1) (PowerSGD's P = M Q, the tracked
 * basis's coefficients, GradiVeQ's encode). c_ij = s_i0 u_0j + ... in one chain of fused
 * multiply-adds, l in order from 0 (fmaf: one rounding each). Columns in groups of up to 64
 * (each c_ij's chain is its own, so any d). Every path runs over blocks of rows of U^T (d floats a
 * row, padded to dp; PUT floats a block, so 512 rows at d 16, 256 at d 32): the chains of a row's d
 * columns side by side, so the C form vectorizes where the compiler may (a single path off x86) and
 * the AVX2 / AVX-512 forms hold them in the lanes of registers, several rows at once. With
 * residual, also S = S - C U^T row by row, with the expand's operations (alpha -1, beta 1): the
 * bits of k_expand run after k_project. */
enum { PUT = 8192, PDP = 64, PFR = 32 };

#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__AVX512F__)
typedef __m512 pv_t;
#define PV_W 16
#define PV_ZERO _mm512_setzero_ps
#define PV_SET1 _mm512_set1_ps
#define PV_LOAD _mm512_load_ps
#define PV_STORE _mm512_store_ps
#define PV_FMA _mm512_fmadd_ps
#else
typedef __m256 pv_t;
#define PV_W 8
#define PV_ZERO _mm256_setzero_ps
#define PV_SET1 _mm256_set1_ps
#define PV_LOAD _mm256_load_ps
#define PV_STORE _mm256_store_ps
#define PV_FMA _mm256_fmadd_ps
#endif

/* rows i0 .. i0+R-1, the columns in NV registers (R NV <= 8: eight chains in flight) */
static inline __attribute__((always_inline)) void
project_block(size_t R, size_t NV, size_t i0, size_t n, size_t ci, size_t cj, size_t m, size_t d,
              size_t dp, const float *S, const float *ut, size_t l0, size_t lb, float *C) {
    pv_t acc[8][8];
    float tmp[8 * PV_W] __attribute__((aligned(64)));
    for (size_t r = 0; r < R; r++) {
        if (l0 == 0) {
            for (size_t v = 0; v < NV; v++)
                acc[r][v] = PV_ZERO();
        } else {
            for (size_t j = 0; j < NV * PV_W; j++)
                tmp[j] = j < d ? C[(i0 + r) * ci + j * cj] : 0.0f;
            for (size_t v = 0; v < NV; v++)
                acc[r][v] = PV_LOAD(tmp + v * PV_W);
        }
    }
    /* the same rows PFR further on, a line of each per 16 steps: read from memory while these
     * are computed (the blocks of the sweep are too short for the hardware's prefetch) */
    const float *pf = i0 + PFR + R <= n ? S + (i0 + PFR) * m + l0 : NULL;
    for (size_t l = 0; l < lb; l++) {
        const float *u = ut + l * dp;
        if (pf != NULL && (l & 15) == 0)
            for (size_t r = 0; r < R; r++)
                _mm_prefetch((const char *)(pf + r * m + l), _MM_HINT_T0);
        for (size_t r = 0; r < R; r++) {
            const pv_t sv = PV_SET1(S[(i0 + r) * m + l0 + l]);
            for (size_t v = 0; v < NV; v++)
                acc[r][v] = PV_FMA(sv, PV_LOAD(u + v * PV_W), acc[r][v]);
        }
    }
    for (size_t r = 0; r < R; r++) {
        for (size_t v = 0; v < NV; v++)
            PV_STORE(tmp + v * PV_W, acc[r][v]);
        for (size_t j = 0; j < d; j++)
            C[(i0 + r) * ci + j * cj] = tmp[j];
    }
}

/* dp = PV_W times 1, 2, 4 or 8: blocks of R = 8 / NV rows, then single rows (each case its own
 * constants, so that the block's sums stay in registers) */
#define PROJECT_CASE(R, NV)                                                 \
    for (; i + (R) <= i1; i += (R))                                         \
        project_block((R), (NV), i, n, ci, cj, m, d, dp, S, ut, l0, lb, C); \
    for (; i < i1; i++)                                                     \
        project_block(1, (NV), i, n, ci, cj, m, d, dp, S, ut, l0, lb, C);
static void project_rows_vec(size_t i0, size_t i1, size_t n, size_t ci, size_t cj, size_t m,
                             size_t d, size_t dp, const float *S, const float *ut, size_t l0,
                             size_t lb, float *C) {
    size_t i = i0;
    switch (dp / PV_W) {
    case 1:
        PROJECT_CASE(8, 1)
        break;
    case 2:
        PROJECT_CASE(4, 2)
        break;
    case 4:
        PROJECT_CASE(2, 4)
        break;
    default:
        PROJECT_CASE(1, 8)
    }
}
#define K_PROJECT_VEC 1
#else
#define K_PROJECT_VEC 0
/* rows [0, n) over U^T's block [l0, l0 + lb) (ut: rows of dp floats), C form: the chains
 * continue from C (l0 > 0) or start at 0 */
static void project_rows_c(size_t i0, size_t i1, size_t n, size_t ci, size_t cj, size_t m, size_t d,
                           size_t dp, const float *S, const float *ut, size_t l0, size_t lb,
                           float *C) {
    (void)n; /* the vector forms' prefetch bound */
    float c[PDP];
    for (size_t i = i0; i < i1; i++) {
        for (size_t j = 0; j < d; j++)
            c[j] = l0 == 0 ? 0.0f : C[i * ci + j * cj];
        for (size_t l = 0; l < lb; l++) {
            const float sv = S[i * m + l0 + l], *u = ut + l * dp;
            for (size_t j = 0; j < d; j++)
                c[j] = fmaf(sv, u[j], c[j]);
        }
        for (size_t j = 0; j < d; j++)
            C[i * ci + j * cj] = c[j];
    }
}
#endif

#if K_PROJECT_VEC
#define PROJECT_ROWS project_rows_vec
#else
#define PROJECT_ROWS project_rows_c
#endif

/* rows [i0, i1) of S minus their c_i U^T (C as the projection writes it): the expand with alpha
 * -1, beta 1, two rows at a time */
static inline void residual_rows(size_t i0, size_t i1, size_t ci, size_t cj, size_t m, size_t d,
                                 float *S, const float *U, const float *C) {
    k_expand(i1 - i0, m, d, C + i0 * ci, ci, cj, U, -1.0f, 1.0f, NULL, S + i0 * m);
}

/* columns [0, d) of C, d <= PDP (the caller's group of U's columns) */
static void project_cols(size_t n, size_t m, size_t d, const float *S, const float *U, float *C,
                         size_t ci, size_t cj, int residual) {
#if K_PROJECT_VEC
    size_t nv = (d + PV_W - 1) / PV_W;
    size_t dp = PV_W * (nv <= 1 ? 1 : nv <= 2 ? 2 : nv <= 4 ? 4 : 8);
#else
    size_t dp = d > 0 ? d : 1;
#endif
    float ut[PUT] __attribute__((aligned(64)));
    float *Sw = (float *)S; /* written only with residual (the caller's M) */
    size_t plb = PUT / dp;
    if (m <= plb) { /* U^T whole: 32 rows projected, then their residual while in the cache */
        for (size_t l = 0; l < m; l++)
            for (size_t j = 0; j < dp; j++)
                ut[l * dp + j] = j < d ? U[j * m + l] : 0.0f;
        for (size_t i0 = 0; i0 < n; i0 += 32) {
            size_t i1 = n - i0 < 32 ? n : i0 + 32;
            PROJECT_ROWS(i0, i1, n, ci, cj, m, d, dp, S, ut, 0, m, C);
            if (residual) residual_rows(i0, i1, ci, cj, m, d, Sw, U, C);
        }
        return;
    }
    for (size_t l0 = 0; l0 < m; l0 += plb) { /* blocks of U^T, each over every row */
        size_t lb = m - l0 < plb ? m - l0 : plb;
        for (size_t l = 0; l < lb; l++)
            for (size_t j = 0; j < dp; j++)
                ut[l * dp + j] = j < d ? U[j * m + l0 + l] : 0.0f;
        PROJECT_ROWS(0, n, n, ci, cj, m, d, dp, S, ut, l0, lb, C);
    }
    if (residual) residual_rows(0, n, ci, cj, m, d, Sw, U, C);
}

static void k_project(size_t n, size_t m, size_t d, const float *S, const float *U, float *C,
                      size_t ci, size_t cj, int residual) {
    if (d <= PDP) {
        project_cols(n, m, d, S, U, C, ci, cj, residual);
        return;
    }
    for (size_t j0 = 0; j0 < d; j0 += PDP) /* groups of 64 columns, then the residual of all */
        project_cols(n, m, d - j0 < PDP ? d - j0 : PDP, S, U + j0 * m, C + j0 * cj, ci, cj, 0);
    if (residual) residual_rows(0, n, ci, cj, m, d, (float *)S, U, C);
}

/* ---- back product: B (m x d, column-major) = S^T C ----------------------------------------------
 * S n x m row-major, c_ij at C[i ci + j cj] (PowerSGD's Q = M^T P, the tracked basis's B = S^T
 * C0). b_lj = s_0l c_0j + s_1l c_1j + ... in one chain of fused multiply-adds over the rows i in
 * order from 0. The vector forms run as a matrix product's inner kernel does: a tile of B (up to
 * 4 registers of l by 4 columns; codec_vtile.h's back_cols) held in registers over a super-block
 * of rows (about 128 KiB of S, kept in the second-level cache while every tile passes over it),
 * each row adding its vectors of s times its coefficients; the tile goes back to B between
 * super-blocks, so the rows still reach each b in order. */

/* rows [i0, i1), B's columns [l0, m): the C form */
static void back_rows_c(size_t i0, size_t i1, size_t l0, size_t m, size_t d, const float *S,
                        const float *C, size_t ci, size_t cj, float *B) {
    for (size_t i = i0; i < i1 && l0 < m; i++)
        for (size_t j = 0; j < d; j++) {
            const float c = C[i * ci + j * cj], *si = S + i * m;
            float *b = B + j * m;
            for (size_t l = l0; l < m; l++)
                b[l] = fmaf(si[l], c, b[l]);
        }
}

static void k_back(size_t n, size_t m, size_t d, const float *S, const float *C, size_t ci,
                   size_t cj, float *B) {
    for (size_t x = 0; x < m * d; x++)
        B[x] = 0.0f;
    size_t sb = n; /* rows per super-block */
#if K_EXPAND_VEC
    sb = m > 0 ? 32768 / m : n;
    sb = sb < 1 ? 1 : sb;
#endif
    for (size_t i0 = 0; i0 < n; i0 += sb) {
        size_t i1 = n - i0 < sb ? n : i0 + sb, l = 0;
#if K_EXPAND_ZMM
        for (; l + ZBT * ZW <= m; l += ZBT * ZW)
            back_cols_zmm(i0, i1, m, d, S + l, C, ci, cj, B + l);
#endif
#if K_EXPAND_VEC
        for (; l + YBT * YW <= m; l += YBT * YW)
            back_cols_ymm(i0, i1, m, d, S + l, C, ci, cj, B + l);
#endif
        back_rows_c(i0, i1, l, m, d, S, C, ci, cj, B); /* the columns past the tiles */
    }
}

#endif /* GVQ_CODEC_LINALG_H_ */
