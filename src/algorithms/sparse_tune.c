/*
 * sparse_tune.c -- the math of the partition tuner (docs/ALGORITHMS.md section 4, Parallax 5.2):
 * iteration time t(P) ~ th0 + th1 / P + th2 * P (P shards: more of them spread the work, each
 * costs a little), sampled by a doubling-then-halving search and fitted by least squares.
 *
 *     start S:   sample S, 2S, 4S, ... while the time falls (stop at maxp)
 *                then S/2, S/4, ... while the time falls (stop at 1)
 *     fit:       min || X th - t ||, X = [1, 1/P, P] per sample (needs 3 distinct P)
 *     refine:    up to 3 more samples: the fit's argmin over [max(1, Pmin/2), min(maxp,
 *                2 Pmax)] among the multiples of a granule (the ranks holding shards) if
 *                not yet sampled, else the untried multiple midway between the fastest
 *                sample and its sampled neighbour
 *     choose:    the fastest sample
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "gvq_sparse.h"

int gvq_lsq_fit3(const double *P, const double *t, int n, double theta[3]) {
    /* at least 3 distinct P, or the three columns are dependent */
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= P[j] == P[i];
        distinct += !seen && P[i] > 0;
    }
    if (distinct < 3) return -1;
    /* normal equations on columns scaled to unit norm (1/P and P differ by orders of
     * magnitude), solved by Gaussian elimination with partial pivoting */
    double col[3] = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        double x[3] = {1.0, 1.0 / P[i], P[i]};
        for (int a = 0; a < 3; a++)
            col[a] += x[a] * x[a];
    }
    for (int a = 0; a < 3; a++)
        col[a] = sqrt(col[a]);
    double A[3][4] = {{0}};
    for (int i = 0; i < n; i++) {
        double x[3] = {1.0 / col[0], 1.0 / P[i] / col[1], P[i] / col[2]};
        for (int a = 0; a < 3; a++) {
            for (int b = 0; b < 3; b++)
                A[a][b] += x[a] * x[b];
            A[a][3] += x[a] * t[i];
        }
    }
    for (int c = 0; c < 3; c++) {
        int piv = c;
        for (int r = c + 1; r < 3; r++)
            if (fabs(A[r][c]) > fabs(A[piv][c])) piv = r;
        if (fabs(A[piv][c]) < 1e-12) return -1;
        if (piv != c)
            for (int k = 0; k < 4; k++) {
                double tmp = A[c][k];
                A[c][k] = A[piv][k];
                A[piv][k] = tmp;
            }
        for (int r = 0; r < 3; r++) {
            if (r == c) continue;
            double f = A[r][c] / A[c][c];
            for (int k = c; k < 4; k++)
                A[r][k] -= f * A[c][k];
        }
    }
    for (int a = 0; a < 3; a++) {
        theta[a] = A[a][3] / A[a][a] / col[a];
        if (!isfinite(theta[a])) return -1;
    }
    return 0;
}

static int was_sampled(const gvq_ptune_t *s, long P) {
    for (int i = 0; i < s->n; i++)
        if (s->Ps[i] == P) return 1;
    return 0;
}

/* Argmin of the fit over the candidates (the sampled P and the granule's multiples within
 * [max(1, Pmin/2), min(maxp, 2 Pmax)]); 0 without a fit. */
static long fit_argmin(const gvq_ptune_t *s, double theta[3], double *fbest) {
    int pmin = 0, pmax = 0;
    double Pd[GVQ_PTUNE_MAX];
    for (int i = 0; i < s->n; i++) {
        Pd[i] = s->Ps[i];
        if (pmin == 0 || s->Ps[i] < pmin) pmin = s->Ps[i];
        if (s->Ps[i] > pmax) pmax = s->Ps[i];
    }
    theta[0] = theta[1] = theta[2] = 0.0;
    *fbest = DBL_MAX;
    if (s->n == 0 || gvq_lsq_fit3(Pd, s->ts, s->n, theta) != 0) return 0;
    long lo = GVQ_MAX(1, pmin / 2), hi = GVQ_MIN((long)s->maxp, 2L * pmax), arg = 0;
    for (long P = lo; P <= hi; P++) {
        if (P % s->granule != 0 && !was_sampled(s, P)) continue;
        double f = theta[0] + theta[1] / (double)P + theta[2] * (double)P;
        if (isfinite(f) && f < *fbest) *fbest = f, arg = P;
    }
    return arg;
}

static int fastest(const gvq_ptune_t *s) {
    int b = 0;
    for (int i = 1; i < s->n; i++)
        if (s->ts[i] < s->ts[b]) b = i;
    return b;
}

/* The unsampled multiple of the granule nearest to (a + b) / 2, strictly between a and b; 0 if
 * none. */
static long between(const gvq_ptune_t *s, long a, long b) {
    if (a > b) {
        long t = a;
        a = b;
        b = t;
    }
    long g = s->granule, mid = (a + b) / 2, best = 0;
    for (long P = (a / g + 1) * g; P < b; P += g)
        if (P > a && P <= s->maxp && !was_sampled(s, P) &&
            (best == 0 || labs(P - mid) < labs(best - mid)))
            best = P;
    return best;
}

/* Refinement (after the doubling/halving search): sample the fit's argmin if it was not
 * sampled; otherwise the untried multiple of the granule midway between the fastest sample and
 * its nearest sampled neighbour above, then below. At most GVQ_PTUNE_REFINE samples. */
static void next_refinement(gvq_ptune_t *s) {
    s->phase = 3;
    if (s->refined >= GVQ_PTUNE_REFINE || s->n == 0) return;
    double theta[3], f;
    long P = fit_argmin(s, theta, &f);
    if (P == 0 || was_sampled(s, P)) {
        int b = s->Ps[fastest(s)], above = 0, below = 0;
        for (int i = 0; i < s->n; i++) {
            if (s->Ps[i] > b && (above == 0 || s->Ps[i] < above)) above = s->Ps[i];
            if (s->Ps[i] < b && s->Ps[i] > below) below = s->Ps[i];
        }
        P = above != 0 ? between(s, b, above) : 0;
        if (P == 0 && below != 0) P = between(s, below, b);
    }
    if (P == 0) return;
    s->phase = 2;
    s->P = (int)P;
}

static void start_halving(gvq_ptune_t *s) {
    s->phase = 1;
    s->prev_t = s->ts[0]; /* the start's time */
    s->P = s->start / 2;
    if (s->P < 1) next_refinement(s);
}

void gvq_ptune_init(gvq_ptune_t *s, int start, int maxp, int granule) {
    memset(s, 0, sizeof *s);
    if (maxp < 1) maxp = 1;
    if (start < 1) start = 1;
    if (start > maxp) start = maxp;
    s->start = start;
    s->maxp = maxp;
    s->granule = granule < 1 ? 1 : granule;
    s->P = start;
    s->prev_t = DBL_MAX;
}

int gvq_ptune_next(const gvq_ptune_t *s) {
    if (s->phase == 3 || s->n >= GVQ_PTUNE_MAX) return 0;
    return s->P;
}

void gvq_ptune_record(gvq_ptune_t *s, double seconds) {
    if (s->phase == 3 || s->n >= GVQ_PTUNE_MAX) return;
    s->Ps[s->n] = s->P;
    s->ts[s->n] = seconds;
    s->n++;
    int falls = s->n == 1 || seconds < s->prev_t;
    if (s->phase == 0) {
        if (falls && s->P <= s->maxp / 2) {
            s->prev_t = seconds;
            s->P *= 2;
        } else {
            start_halving(s);
        }
    } else if (s->phase == 1) {
        if (falls && s->P / 2 >= 1) {
            s->prev_t = seconds;
            s->P /= 2;
        } else {
            next_refinement(s);
        }
    } else {
        s->refined++;
        next_refinement(s);
    }
}

int gvq_ptune_choose(const gvq_ptune_t *s, int *fit_ok, double theta[3], double *predicted) {
    *fit_ok = 0;
    *predicted = 0.0;
    theta[0] = theta[1] = theta[2] = 0.0;
    if (s->n == 0) return 0;
    int b = fastest(s);
    double f;
    *predicted = s->ts[b];
    if (fit_argmin(s, theta, &f) != 0) {
        *fit_ok = 1;
        *predicted = theta[0] + theta[1] / (double)s->Ps[b] + theta[2] * (double)s->Ps[b];
    }
    return s->Ps[b];
}
