/*
 * codec_philox.h -- Philox-4x32-10 for 16 consecutive blocks, included by codec_kernels.c only
 * (compiled once per path, so the path's instruction set picks the form): hand-written AVX-512
 * and AVX2 forms, the compilers not vectorizing the 32x32->64 multiplies well, and the scalar
 * definition (gvq_rng.h's gvq_philox4x32_10 per block). tests/unit/test_kernels.c holds every
 * path to the scalar one. Expects codec_kernels.h, gvq_rng.h and (vector paths) <immintrin.h>.
 */
#ifndef GVQ_CODEC_PHILOX_H_
#define GVQ_CODEC_PHILOX_H_

#define PH_M0 0xD2511F53u
#define PH_M1 0xCD9E8D57u
#define PH_W0 0x9E3779B9u
#define PH_W1 0xBB67AE85u

/* ---- Philox: 16 blocks g0 .. g0+15, out[4j + w] = word w of block j ------------------------ */
#if defined(__AVX512F__)
/* Eight blocks per register, one per 64-bit lane, each word in a lane's low half: the multiply
 * (vpmuludq) reads only the low halves and gives the full 64-bit product, so a round is two
 * multiplies, two shifts and two three-way xors; what the high halves hold does not matter. */
static inline void philox8x64(__m512i *a0, __m512i *a1, __m512i *a2, __m512i *a3, uint32_t k0,
                              uint32_t k1) {
    const __m512i m0 = _mm512_set1_epi64(PH_M0), m1 = _mm512_set1_epi64(PH_M1);
    for (int r = 0; r < 10; r++) {
        __m512i p0 = _mm512_mul_epu32(*a0, m0), p1 = _mm512_mul_epu32(*a2, m1);
        *a0 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p1, 32), *a1, _mm512_set1_epi32((int)k0),
                                        0x96); /* a ^ b ^ c */
        *a2 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p0, 32), *a3, _mm512_set1_epi32((int)k1),
                                        0x96);
        *a1 = p1;
        *a3 = p0;
        k0 += PH_W0;
        k1 += PH_W1;
    }
}

/* blocks g .. g+7 (lanes) into out[0..32): out[4j + w] = word w of block j */
static inline void philox8x64_store(__m512i a0, __m512i a1, __m512i a2, __m512i a3, uint32_t *out) {
    __m512i w01 = _mm512_mask_blend_epi32(0xAAAA, a0, _mm512_slli_epi64(a1, 32));
    __m512i w23 = _mm512_mask_blend_epi32(0xAAAA, a2, _mm512_slli_epi64(a3, 32));
    __m512i ev = _mm512_unpacklo_epi64(w01, w23), od = _mm512_unpackhi_epi64(w01, w23);
    /* ev: blocks 0, 2, 4, 6 (one per 128-bit lane); od: 1, 3, 5, 7 */
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i hi = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    _mm512_storeu_si512((void *)out, _mm512_permutex2var_epi64(ev, lo, od));
    _mm512_storeu_si512((void *)(out + 16), _mm512_permutex2var_epi64(ev, hi, od));
}

static void philox16(const gvq_kparams_t *p, uint64_t g0, uint32_t *out) {
    const __m512i lane = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    __m512i ga = _mm512_add_epi64(_mm512_set1_epi64((long long)g0), lane);
    __m512i gb = _mm512_add_epi64(ga, _mm512_set1_epi64(8));
    __m512i c2 = _mm512_set1_epi64(p->call), c3 = _mm512_set1_epi64(p->tag);
    __m512i a0 = ga, a1 = _mm512_srli_epi64(ga, 32), a2 = c2, a3 = c3;
    __m512i b0 = gb, b1 = _mm512_srli_epi64(gb, 32), b2 = c2, b3 = c3;
    philox8x64(&a0, &a1, &a2, &a3, p->key[0], p->key[1]);
    philox8x64(&b0, &b1, &b2, &b3, p->key[0], p->key[1]);
    philox8x64_store(a0, a1, a2, a3, out);
    philox8x64_store(b0, b1, b2, b3, out + 32);
}
#elif defined(__AVX2__)
/* 8 blocks g0 .. g0+7 */
static void philox8(const gvq_kparams_t *p, uint64_t g0, uint32_t *out) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    __m256i lo = _mm256_set1_epi32((int)(uint32_t)g0), hi = _mm256_set1_epi32((int)(g0 >> 32));
    __m256i c0 = _mm256_add_epi32(lo, lane);
    /* carry where c0 < lo unsigned: compare with the sign bits flipped */
    __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(lo, sign), _mm256_xor_si256(c0, sign));
    __m256i c1 = _mm256_sub_epi32(hi, carry); /* carry lanes are -1 */
    __m256i c2 = _mm256_set1_epi32((int)p->call), c3 = _mm256_set1_epi32((int)p->tag);
    const __m256i m0 = _mm256_set1_epi32((int)PH_M0), m1 = _mm256_set1_epi32((int)PH_M1);
    uint32_t k0 = p->key[0], k1 = p->key[1];
    for (int r = 0; r < 10; r++) {
        __m256i e0 = _mm256_mul_epu32(c0, m0), o0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
        __m256i e1 = _mm256_mul_epu32(c2, m1), o1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
        __m256i lo0 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), 0xAA);
        __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(e0, 32), o0, 0xAA);
        __m256i lo1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(o1, 32), 0xAA);
        __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(e1, 32), o1, 0xAA);
        c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32((int)k0));
        c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32((int)k1));
        c1 = lo1;
        c3 = lo0;
        k0 += PH_W0;
        k1 += PH_W1;
    }
    /* v_k holds blocks k and 4+k (one per 128-bit lane) */
    __m256i a = _mm256_unpacklo_epi32(c0, c1), b = _mm256_unpackhi_epi32(c0, c1);
    __m256i c = _mm256_unpacklo_epi32(c2, c3), d = _mm256_unpackhi_epi32(c2, c3);
    __m256i v0 = _mm256_unpacklo_epi64(a, c), v1 = _mm256_unpackhi_epi64(a, c);
    __m256i v2 = _mm256_unpacklo_epi64(b, d), v3 = _mm256_unpackhi_epi64(b, d);
    _mm256_storeu_si256((__m256i *)out, _mm256_permute2x128_si256(v0, v1, 0x20));
    _mm256_storeu_si256((__m256i *)(out + 8), _mm256_permute2x128_si256(v2, v3, 0x20));
    _mm256_storeu_si256((__m256i *)(out + 16), _mm256_permute2x128_si256(v0, v1, 0x31));
    _mm256_storeu_si256((__m256i *)(out + 24), _mm256_permute2x128_si256(v2, v3, 0x31));
}
static void philox16(const gvq_kparams_t *p, uint64_t g0, uint32_t *out) {
    philox8(p, g0, out);
    philox8(p, g0 + 8, out + 32);
}
#else
static void philox16(const gvq_kparams_t *p, uint64_t g0, uint32_t *out) {
    for (uint64_t j = 0; j < 16; j++) {
        uint64_t g = g0 + j;
        uint32_t ctr[4] = {(uint32_t)g, (uint32_t)(g >> 32), p->call, p->tag};
        gvq_philox4x32_10(ctr, p->key, out + 4 * j);
    }
}
#endif

#endif /* GVQ_CODEC_PHILOX_H_ */
