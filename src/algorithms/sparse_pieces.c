/*
 * sparse.c -- the local pieces of sparse variables: merging duplicate rows, index checks, the
 * partition map of a parameter server and the update rules applied at a shard.
 *
 * Partition map (P shards over N ranks, shard s on rank s mod N), e.g. rows 10, P 3, N 2:
 *
 *     permuted row  0 1 2 | 3 4 5 | 6 7 8 9        start(s) = floor(s * rows / P)
 *     shard           0   |   1   |   2            contiguous: perm(row) = row
 *     rank            0   |   1   |   0            hashed:     perm(row) = (a row + b) mod rows
 *     slot on rank  0 1 2 | 0 1 2 | 3 4 5 6        (a coprime to rows: a bijection)
 */
#include <math.h>
#include <stdlib.h>

#include "gvq_sparse.h"

__extension__ typedef unsigned __int128 gvq_u128;

/* ---- merging ------------------------------------------------------------------------------ */

typedef struct {
    int64_t idx;
    size_t pos;
} keyed_t;

static int keyed_cmp(const void *a, const void *b) {
    const keyed_t *x = a, *y = b;
    if (x->idx != y->idx) return x->idx < y->idx ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

gvqResult_t gvq_sparse_merge(const gvq_device_ops_t *dev, gvqDataType_t dtype, size_t dim,
                             const int64_t *idx, const void *val, size_t n, int64_t *out_idx,
                             void *out_val, size_t *nout) {
    size_t row_bytes = dim * gvq_dtype_size(dtype);
    *nout = 0;
    if (n == 0) return gvqSuccess;
    keyed_t *k = malloc(n * sizeof *k);
    if (k == NULL) {
        GVQ_WARN("sparse merge: cannot allocate the order of %zu rows", n);
        return gvqSystemError;
    }
    for (size_t i = 0; i < n; i++)
        k[i] = (keyed_t){idx[i], i};
    qsort(k, n, sizeof *k, keyed_cmp);
    const char *v = val;
    char *o = out_val;
    size_t m = 0;
    gvqResult_t res = gvqSuccess;
    for (size_t i = 0; i < n; i++) {
        const char *row = v + k[i].pos * row_bytes;
        if (m > 0 && out_idx[m - 1] == k[i].idx) {
            res = dev->reduce(o + (m - 1) * row_bytes, o + (m - 1) * row_bytes, row, dim, dtype,
                              gvqSum);
            if (res != gvqSuccess) break;
        } else {
            out_idx[m] = k[i].idx;
            memcpy(o + m * row_bytes, row, row_bytes);
            m++;
        }
    }
    free(k);
    if (res == gvqSuccess) *nout = m;
    return res;
}

size_t gvq_sparse_find_out_of_range(const int64_t *idx, size_t n, uint64_t rows) {
    for (size_t i = 0; i < n; i++)
        if (idx[i] < 0 || (uint64_t)idx[i] >= rows) return i;
    return n;
}

size_t gvq_sparse_find_unsorted(const int64_t *idx, size_t n) {
    for (size_t i = 1; i < n; i++)
        if (idx[i] <= idx[i - 1]) return i;
    return n;
}

/* ---- partition map ------------------------------------------------------------------------- */

static uint64_t gcd_u64(uint64_t a, uint64_t b) {
    while (b != 0) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m) {
    return (uint64_t)(((gvq_u128)a * b) % m);
}

/* Inverse of a modulo m (gcd(a, m) = 1, m >= 1), by the extended Euclid on signed 128 bits. */
static uint64_t invmod(uint64_t a, uint64_t m) {
    __extension__ __int128 t = 0, nt = 1, r = m, nr = a % m;
    while (nr != 0) {
        __extension__ __int128 q = r / nr, x;
        x = t - q * nt, t = nt, nt = x;
        x = r - q * nr, r = nr, nr = x;
    }
    if (t < 0) t += m;
    return (uint64_t)t;
}

/* The products below stay under 2^64 on a narrow map (rows < 2^32, rows P < 2^64), where
 * 64-bit division is several times cheaper than 128-bit; the results are the same. */
static uint64_t perm(const gvq_part_t *m, uint64_t row) {
    if (m->mode == GVQ_PART_CONTIGUOUS) return row;
    if (m->narrow) return (m->mul * row % m->rows + m->add) % m->rows;
    return (mulmod(m->mul, row, m->rows) + m->add) % m->rows;
}

uint64_t gvq_part_start(const gvq_part_t *m, uint64_t s) {
    if (m->narrow) return s * m->rows / m->P;
    return (uint64_t)(((gvq_u128)s * m->rows) / m->P);
}

static uint64_t shard_of_perm(const gvq_part_t *m, uint64_t p) {
    /* the largest s with floor(s rows / P) <= p, i.e. s < (p + 1) P / rows */
    if (m->narrow) return ((p + 1) * m->P - 1) / m->rows;
    return (uint64_t)((((gvq_u128)p + 1) * m->P - 1) / m->rows);
}

uint64_t gvq_part_shard(const gvq_part_t *m, uint64_t row) {
    return shard_of_perm(m, perm(m, row));
}

void gvq_part_locate(const gvq_part_t *m, uint64_t row, int *rank, uint64_t *slot) {
    uint64_t p = perm(m, row), s = shard_of_perm(m, p);
    *rank = (int)(s % (uint64_t)m->nranks);
    *slot = m->slot_base[s] + (p - gvq_part_start(m, s));
}

uint64_t gvq_part_row_of(const gvq_part_t *m, int rank, uint64_t slot) {
    /* the shards of `rank` are rank, rank + N, ...; their slot bases ascend */
    uint64_t N = (uint64_t)m->nranks, count = (m->P - (uint64_t)rank + N - 1) / N;
    uint64_t lo = 0, hi = count; /* the last k with slot_base[rank + k N] <= slot, among those
                                    whose shard is not empty */
    while (hi - lo > 1) {
        uint64_t mid = (lo + hi) / 2;
        if (m->slot_base[(uint64_t)rank + mid * N] <= slot)
            lo = mid;
        else
            hi = mid;
    }
    uint64_t s = (uint64_t)rank + lo * N;
    /* skip empty shards that share the base */
    while (s + N < m->P && m->slot_base[s + N] <= slot)
        s += N;
    uint64_t p = gvq_part_start(m, s) + (slot - m->slot_base[s]);
    if (m->mode == GVQ_PART_CONTIGUOUS) return p;
    uint64_t q = (p + m->rows - m->add % m->rows) % m->rows;
    return m->narrow ? m->inv * q % m->rows : mulmod(m->inv, q, m->rows);
}

gvqResult_t gvq_part_init(gvq_part_t *m, uint64_t rows, uint64_t P, int nranks, int mode) {
    memset(m, 0, sizeof *m);
    if (rows == 0 || P == 0 || nranks < 1 ||
        (mode != GVQ_PART_HASHED && mode != GVQ_PART_CONTIGUOUS)) {
        GVQ_WARN("partition map: rows %llu, partitions %llu, ranks %d, mode %d not usable",
                 (unsigned long long)rows, (unsigned long long)P, nranks, mode);
        return gvqInvalidArgument;
    }
    m->rows = rows;
    m->P = P;
    m->nranks = nranks;
    m->mode = mode;
    if (mode == GVQ_PART_HASHED) {
        uint64_t a = 0x9e3779b97f4a7c15ull % rows;
        if (a == 0) a = 1;
        while (gcd_u64(a, rows) != 1)
            a = a + 1 < rows ? a + 1 : 1;
        m->mul = a;
        m->add = 0x632be59bd9b4e019ull % rows;
        m->inv = invmod(a, rows);
    }
    /* (p + 1) P <= rows P and s rows <= P rows: below 2^64; mul * row < rows^2 < 2^64 */
    m->narrow = rows < ((uint64_t)1 << 32) && P <= UINT64_MAX / rows;
    m->slot_base = malloc(P * sizeof *m->slot_base);
    m->rank_rows = calloc((size_t)nranks, sizeof *m->rank_rows);
    if (m->slot_base == NULL || m->rank_rows == NULL) {
        gvq_part_fini(m);
        GVQ_WARN("partition map: cannot allocate the bases of %llu shards", (unsigned long long)P);
        return gvqSystemError;
    }
    for (uint64_t s = 0; s < P; s++) {
        int owner = (int)(s % (uint64_t)nranks);
        m->slot_base[s] = m->rank_rows[owner];
        m->rank_rows[owner] += gvq_part_start(m, s + 1) - gvq_part_start(m, s);
    }
    return gvqSuccess;
}

void gvq_part_fini(gvq_part_t *m) {
    free(m->slot_base);
    free(m->rank_rows);
    m->slot_base = NULL;
    m->rank_rows = NULL;
}

/* ---- update rules ---------------------------------------------------------------------------- */

/* One definition of the three rules, stamped out for float and double. */
#define GVQ_RULE_KERNEL(T, SQRT)                                                    \
    static void rule_##T(const gvq_rule_t *r, size_t dim, T *w, T *s, const T *g) { \
        const T lr = (T)r->lr, mu = (T)r->mu, eps = (T)r->eps, gs = (T)r->gscale;   \
        switch (r->rule) {                                                          \
        case GVQ_RULE_SGD:                                                          \
            for (size_t j = 0; j < dim; j++)                                        \
                w[j] -= lr * (g[j] * gs);                                           \
            break;                                                                  \
        case GVQ_RULE_MOMENTUM:                                                     \
            for (size_t j = 0; j < dim; j++) {                                      \
                s[j] = mu * s[j] + g[j] * gs;                                       \
                w[j] -= lr * s[j];                                                  \
            }                                                                       \
            break;                                                                  \
        case GVQ_RULE_ADAGRAD:                                                      \
            for (size_t j = 0; j < dim; j++) {                                      \
                T gj = g[j] * gs;                                                   \
                s[j] += gj * gj;                                                    \
                w[j] -= lr * gj / (SQRT(s[j]) + eps);                               \
            }                                                                       \
            break;                                                                  \
        default:                                                                    \
            break;                                                                  \
        }                                                                           \
    }
GVQ_RULE_KERNEL(float, sqrtf)
GVQ_RULE_KERNEL(double, sqrt)
#undef GVQ_RULE_KERNEL

void gvq_rule_apply(const gvq_rule_t *r, gvqDataType_t dtype, size_t dim, void *w, void *s,
                    const void *g) {
    if (dtype == gvqFloat32)
        rule_float(r, dim, w, s, g);
    else if (dtype == gvqFloat64)
        rule_double(r, dim, w, s, g);
}

void gvq_rule_apply_params(int rule, double lr, double mu, double eps, double gscale,
                           gvqDataType_t dtype, size_t dim, void *w, void *s, const void *g) {
    gvq_rule_t r = {rule, lr, mu, eps, gscale};
    gvq_rule_apply(&r, dtype, dim, w, s, g);
}
