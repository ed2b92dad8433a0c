/*
 * codec_vtile.h -- the register tiles of the low-rank products (the expand's rows, the back
 * product's tiles), included by codec_linalg.h once per vector width: VSUF names the width (ymm,
 * zmm), VT is its type, VW its floats, VBT the back product's registers of l per tile (at most
 * 4), V_LOAD .. V_FMA its operations (unaligned loads and stores). Every width runs the same
 * operations in the same order per lane, so every width gives the C forms' bits. No include guard:
 * each inclusion defines the functions of one width, and the macros are undefined at the end.
 */
#define VT_CAT2(a, b) a##_##b
#define VT_CAT(a, b) VT_CAT2(a, b)
#define VT_FN(name) VT_CAT(name, VSUF)

/* The expand's rows: R rows of K registers of values each, the sums in registers (the compilers
 * keep expand_part's acc[] in memory, a store and a load on every chain's step), R K chains of
 * multiply-adds in flight; each load of Q feeds the R rows' chains (an empty asm keeps the
 * compilers from folding it into each multiply-add) and each coefficient the K registers. Row
 * rr's coefficients at pi[rr][j pn], its output at o[rr]; values from l0 on; pfo > 0: the
 * values pfo further on than each part are fetched into the cache meanwhile (the rows written
 * next). Returns where the vector parts end. */
static inline __attribute__((always_inline)) size_t
VT_FN(expand_rows)(size_t R, size_t K, size_t l0, size_t m, size_t r, const float *const *pi,
                   size_t pn, const float *Q, float alpha, float beta, const float *z,
                   float *const *o, size_t pfo) {
    for (; l0 + K * VW <= m; l0 += K * VW) {
        if (pfo > 0)
            for (size_t rr = 0; rr < R; rr++)
                for (size_t t = 0; t < K * VW; t += 16)
                    _mm_prefetch((const char *)(o[rr] + l0 + pfo + t), _MM_HINT_T0);
        VT acc[4][8];
        for (size_t rr = 0; rr < R; rr++)
            for (size_t k = 0; k < K; k++)
                acc[rr][k] = V_ZERO();
        for (size_t j = 0; j < r; j++) {
            const float *q = Q + j * m + l0;
            VT pv[4];
            for (size_t rr = 0; rr < R; rr++)
                pv[rr] = V_SET1(pi[rr][j * pn]);
            for (size_t k = 0; k < K; k++) {
                VT qv = V_LOAD(q + k * VW);
                __asm__("" : "+v"(qv)); /* a local: an array's element would go to the stack */
                for (size_t rr = 0; rr < R; rr++)
                    acc[rr][k] = V_FMA(pv[rr], qv, acc[rr][k]);
            }
        }
        const VT va = V_SET1(alpha), vb = V_SET1(beta);
        for (size_t rr = 0; rr < R; rr++) {
            float *ol = o[rr] + l0;
            for (size_t k = 0; k < K; k++) {
                VT v = V_MUL(va, acc[rr][k]);
                if (z != NULL)
                    v = V_ADD(v, V_LOAD(z + l0 + k * VW));
                else if (beta != 0.0f)
                    v = V_ADD(v, V_MUL(vb, V_LOAD(ol + k * VW)));
                V_STORE(ol + k * VW, v);
            }
        }
    }
    return l0;
}

/* The back product's tile: rows [i0, i1) into B's T registers of l by J columns at b (columns m
 * apart), held in registers over the rows; each row adds its T vectors of s times its J
 * coefficients */
static inline __attribute__((always_inline)) void VT_FN(back_tile)(size_t J, size_t T, size_t i0,
                                                                   size_t i1, size_t m,
                                                                   const float *S, const float *c,
                                                                   size_t ci, size_t cj, float *b) {
    VT acc[4][4];
    for (size_t j = 0; j < J; j++)
        for (size_t k = 0; k < T; k++)
            acc[j][k] = V_LOAD(b + j * m + k * VW);
    for (size_t i = i0; i < i1; i++) {
        VT sv[4];
        for (size_t k = 0; k < T; k++)
            sv[k] = V_LOAD(S + i * m + k * VW);
        for (size_t j = 0; j < J; j++) {
            const VT cv = V_SET1(c[i * ci + j * cj]);
            for (size_t k = 0; k < T; k++)
                acc[j][k] = V_FMA(sv[k], cv, acc[j][k]);
        }
    }
    for (size_t j = 0; j < J; j++)
        for (size_t k = 0; k < T; k++)
            V_STORE(b + j * m + k * VW, acc[j][k]);
}

/* B's columns [0, VBT VW) of every j (S, B: from that column on), rows [i0, i1): tiles of 4
 * columns, then the last ones a tile of their own width (each case its own constants, so that
 * the tile stays in registers) */
static void VT_FN(back_cols)(size_t i0, size_t i1, size_t m, size_t d, const float *S,
                             const float *C, size_t ci, size_t cj, float *B) {
    const size_t T = VBT;
    size_t j = 0;
    for (; j + 4 <= d; j += 4)
        VT_FN(back_tile)(4, T, i0, i1, m, S, C + j * cj, ci, cj, B + j * m);
    switch (d - j) {
    case 3:
        VT_FN(back_tile)(3, T, i0, i1, m, S, C + j * cj, ci, cj, B + j * m);
        break;
    case 2:
        VT_FN(back_tile)(2, T, i0, i1, m, S, C + j * cj, ci, cj, B + j * m);
        break;
    case 1:
        VT_FN(back_tile)(1, T, i0, i1, m, S, C + j * cj, ci, cj, B + j * m);
        break;
    default:
        break;
    }
}

#undef VT_FN
#undef VT_CAT
#undef VT_CAT2
#undef VSUF
#undef VT
#undef VW
#undef VBT
#undef V_LOAD
#undef V_STORE
#undef V_SET1
#undef V_ZERO
#undef V_ADD
#undef V_MUL
#undef V_FMA
