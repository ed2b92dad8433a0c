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
/* 256-bit vectors on both vector paths: the expand is bound by its loads of Q, and on the
 * AVX-512 development host (perf/RESULTS.md section 12, stop 56) 512-bit forms of it ran 1.3-1.6x
 * slower than these (GradiVeQ's decode at d 32, the tracked basis's output at d 16 and 32) */
typedef __m256 kv_t;
#define KV_W 8
#define KV_LOAD _mm256_loadu_ps
#define KV_STORE _mm256_storeu_ps
#define KV_SET1 _mm256_set1_ps
#define KV_ZERO _mm256_setzero_ps
#define KV_ADD _mm256_add_ps
#define KV_MUL _mm256_mul_ps
#define KV_FMA _mm256_fmadd_ps
/* R rows of K registers of values each, the sums in registers (the compilers keep expand_part's
 * acc[] in memory, a store and a load on every chain's step), R K chains of multiply-adds in
 * flight; with two rows each load of Q feeds two chains (at d 32 the one-row form waited on its
 * loads of Q). Row rr's coefficients at pi[rr][j pn], its output at o[rr]: the same operations
 * in the same order per lane, so the same bits. Returns where the vector parts end. */
enum { EK1 = 8, EKR = 4 }; /* registers of a row: alone, and beside another */
static inline __attribute__((always_inline)) size_t
expand_rows_vec(size_t R, size_t K, size_t m, size_t r, const float *const *pi, size_t pn,
                const float *Q, float alpha, float beta, const float *z, float *const *o) {
    size_t l0 = 0;
    for (; l0 + K * KV_W <= m; l0 += K * KV_W) {
        kv_t acc[2][8];
        for (size_t rr = 0; rr < R; rr++)
            for (size_t k = 0; k < K; k++)
                acc[rr][k] = KV_ZERO();
        for (size_t j = 0; j < r; j++) {
            const float *q = Q + j * m + l0;
            kv_t pv[2];
            for (size_t rr = 0; rr < R; rr++)
                pv[rr] = KV_SET1(pi[rr][j * pn]);
            for (size_t k = 0; k < K; k++) {
                kv_t qv = KV_LOAD(q + k * KV_W);
                /* one load for both rows: the compilers would fold it into each multiply-add */
                __asm__("" : "+v"(qv));
                for (size_t rr = 0; rr < R; rr++)
                    acc[rr][k] = KV_FMA(pv[rr], qv, acc[rr][k]);
            }
        }
        const kv_t va = KV_SET1(alpha), vb = KV_SET1(beta);
        for (size_t rr = 0; rr < R; rr++) {
            float *ol = o[rr] + l0;
            for (size_t k = 0; k < K; k++) {
                kv_t v = KV_MUL(va, acc[rr][k]);
                if (z != NULL)
                    v = KV_ADD(v, KV_LOAD(z + l0 + k * KV_W));
                else if (beta != 0.0f)
                    v = KV_ADD(v, KV_MUL(vb, KV_LOAD(ol + k * KV_W)));
                KV_STORE(ol + k * KV_W, v);
            }
        }
    }
    return l0;
}
#define K_EXPAND_VEC 1
#else
#define K_EXPAND_VEC 0
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
    l0 = expand_rows_vec(1, EK1, m, r, &pi, pn, Q, alpha, beta, z, &o);
#endif
    expand_tail(l0, m, r, pi, pn, Q, alpha, beta, z, o);
}

static void k_expand(size_t n, size_t m, size_t r, const float *P, size_t pi, size_t pj,
                     const float *Q, float alpha, float beta, const float *z, float *out) {
    /* row i's r coefficients, pj apart in P (column-major: n apart, often a multiple of 4 KiB:
     * one cache set for all), gathered once per row when it has several parts; read from there,
     * the same values */
    float pr[2][64];
    int gather = m > EXW && r <= 64 && pj != 1;
    size_t i = 0;
#if K_EXPAND_VEC
    for (; m >= EKR * KV_W && i + 2 <= n; i += 2) { /* two rows at once */
        const float *c[2];
        float *o[2] = {out + i * m, out + (i + 1) * m};
        for (size_t rr = 0; rr < 2; rr++) {
            c[rr] = P + (i + rr) * pi;
            if (gather) {
                for (size_t j = 0; j < r; j++)
                    pr[rr][j] = c[rr][j * pj];
                c[rr] = pr[rr];
            }
        }
        size_t pn = gather ? 1 : pj;
        size_t l0 = expand_rows_vec(2, EKR, m, r, c, pn, Q, alpha, beta, z, o);
        for (size_t rr = 0; rr < 2; rr++)
            expand_tail(l0, m, r, c[rr], pn, Q, alpha, beta, z, o[rr]);
    }
#endif
    for (; i < n; i++) {
        if (gather) {
            for (size_t j = 0; j < r; j++)
                pr[0][j] = P[i * pi + j * pj];
            expand_row(m, r, pr[0], 1, Q, alpha, beta, z, out + i * m);
        } else {
            expand_row(m, r, P + i * pi, pj, Q, alpha, beta, z, out + i * m);
        }
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
enum { PUT = 8192, PDP = 64 };

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
project_block(size_t R, size_t NV, size_t i0, size_t ci, size_t cj, size_t m, size_t d, size_t dp,
              const float *S, const float *ut, size_t l0, size_t lb, float *C) {
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
    for (size_t l = 0; l < lb; l++) {
        const float *u = ut + l * dp;
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
#define PROJECT_CASE(R, NV)                                              \
    for (; i + (R) <= i1; i += (R))                                      \
        project_block((R), (NV), i, ci, cj, m, d, dp, S, ut, l0, lb, C); \
    for (; i < i1; i++)                                                  \
        project_block(1, (NV), i, ci, cj, m, d, dp, S, ut, l0, lb, C);
static void project_rows_vec(size_t i0, size_t i1, size_t ci, size_t cj, size_t m, size_t d,
                             size_t dp, const float *S, const float *ut, size_t l0, size_t lb,
                             float *C) {
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
static void project_rows_c(size_t i0, size_t i1, size_t ci, size_t cj, size_t m, size_t d,
                           size_t dp, const float *S, const float *ut, size_t l0, size_t lb,
                           float *C) {
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
            PROJECT_ROWS(i0, i1, ci, cj, m, d, dp, S, ut, 0, m, C);
            if (residual) residual_rows(i0, i1, ci, cj, m, d, Sw, U, C);
        }
        return;
    }
    for (size_t l0 = 0; l0 < m; l0 += plb) { /* blocks of U^T, each over every row */
        size_t lb = m - l0 < plb ? m - l0 : plb;
        for (size_t l = 0; l < lb; l++)
            for (size_t j = 0; j < dp; j++)
                ut[l * dp + j] = j < d ? U[j * m + l0 + l] : 0.0f;
        PROJECT_ROWS(0, n, ci, cj, m, d, dp, S, ut, l0, lb, C);
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
 * order from 0. The vector forms run as a matrix product's inner kernel does: a tile of B (TL
 * registers of l by TJ columns) held in registers over a super-block of rows (about 128 KiB of
 * S, kept in the second-level cache while every tile passes over it), each row adding its TL
 * vectors of s times its TJ coefficients; the tile goes back to B between super-blocks, so the
 * rows still reach each b in order. */
enum { TJ = 4 };
#if K_EXPAND_VEC
#if defined(__AVX512F__)
enum { TL = 4 }; /* 16 chains in registers of the 32 (AVX-512VL) */
#else
enum { TL = 2 }; /* 8 of 16 */
#endif
/* rows [i0, i1) into B's tile at b (columns m apart): TL vectors of l by J columns */
static inline __attribute__((always_inline)) void back_tile(size_t J, size_t i0, size_t i1,
                                                            size_t m, const float *S,
                                                            const float *c, size_t ci, size_t cj,
                                                            float *b) {
    kv_t acc[TJ][TL];
    for (size_t j = 0; j < J; j++)
        for (size_t k = 0; k < TL; k++)
            acc[j][k] = KV_LOAD(b + j * m + k * KV_W);
    for (size_t i = i0; i < i1; i++) {
        kv_t sv[TL];
        for (size_t k = 0; k < TL; k++)
            sv[k] = KV_LOAD(S + i * m + k * KV_W);
        for (size_t j = 0; j < J; j++) {
            const kv_t cv = KV_SET1(c[i * ci + j * cj]);
            for (size_t k = 0; k < TL; k++)
                acc[j][k] = KV_FMA(sv[k], cv, acc[j][k]);
        }
    }
    for (size_t j = 0; j < J; j++)
        for (size_t k = 0; k < TL; k++)
            KV_STORE(b + j * m + k * KV_W, acc[j][k]);
}
#endif

static void k_back(size_t n, size_t m, size_t d, const float *S, const float *C, size_t ci,
                   size_t cj, float *B) {
    for (size_t x = 0; x < m * d; x++)
        B[x] = 0.0f;
    size_t lv = 0; /* columns of S the tiles cover */
#if K_EXPAND_VEC
    lv = m - m % (TL * KV_W);
    size_t sb = m > 0 ? 32768 / m : n;
    sb = sb < 1 ? 1 : sb;
    for (size_t i0 = 0; i0 < n; i0 += sb) {
        size_t i1 = n - i0 < sb ? n : i0 + sb;
        for (size_t l = 0; l < lv; l += TL * KV_W) {
            size_t j = 0;
            for (; j + TJ <= d; j += TJ)
                back_tile(TJ, i0, i1, m, S + l, C + j * cj, ci, cj, B + j * m + l);
            switch (d - j) { /* the last columns, a tile of their own width */
            case 3:
                back_tile(3, i0, i1, m, S + l, C + j * cj, ci, cj, B + j * m + l);
                break;
            case 2:
                back_tile(2, i0, i1, m, S + l, C + j * cj, ci, cj, B + j * m + l);
                break;
            case 1:
                back_tile(1, i0, i1, m, S + l, C + j * cj, ci, cj, B + j * m + l);
                break;
            default:
                break;
            }
        }
        for (size_t i = i0; i < i1 && lv < m; i++) /* the columns past the tiles */
            for (size_t j = 0; j < d; j++) {
                const float c = C[i * ci + j * cj], *si = S + i * m;
                float *b = B + j * m;
                for (size_t l = lv; l < m; l++)
                    b[l] = fmaf(si[l], c, b[l]);
            }
    }
    return;
#endif
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < d; j++) {
            const float c = C[i * ci + j * cj], *si = S + i * m;
            float *b = B + j * m;
            for (size_t l = lv; l < m; l++)
                b[l] = fmaf(si[l], c, b[l]);
        }
}

#endif /* GVQ_CODEC_LINALG_H_ */
