/*
 * sparse_tune.c -- the math of the partition tuner (ALGORITHMS.md section 4, Parallax 5.2):
 * iteration time t(P) ~ th0 + th1 / P + th2 * P (P shards: more of them spread the work, each
 * costs a little), sampled by a doubling-then-halving search and fitted by least squares.
 *
 *     start S:   sample S, 2S, 4S, ... while the time falls (stop at maxp)
 *                then S/2, S/4, ... while the time falls (stop at 1)
 *     fit:       min || X th - t ||, X = [1, 1/P, P] per sample (needs 3 distinct P)
 *     choose:    argmin of the fit over [max(1, Pmin/2), min(maxp, 2 Pmax)], among the
 *                sampled P and the multiples of a granule (the ranks holding shards)
 */
#include <float.h>
#include <math.h>

#include "gvq_sparse.h"

int gvq_lsq_fit3(const double *P, const double *t, int n, double theta[3]) {
    /* at least 3 distinct P, or the three columns are dependent */
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) seen |= P[j] == P[i];
        distinct += !seen && P[i] > 0;
    }
    if (distinct < 3) return -1;
    /* normal equations on columns scaled to unit norm (1/P and P differ by orders of
     * magnitude), solved by Gaussian elimination with partial pivoting */
    double col[3] = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        double x[3] = {1.0, 1.0 / P[i], P[i]};
        for (int a = 0; a < 3; a++) col[a] += x[a] * x[a];
    }
    for (int a = 0; a < 3; a++) col[a] = sqrt(col[a]);
    double A[3][4] = {{0}};
    for (int i = 0; i < n; i++) {
        double x[3] = {1.0 / col[0], 1.0 / P[i] / col[1], P[i] / col[2]};
        for (int a = 0; a < 3; a++) {
            for (int b = 0; b < 3; b++) A[a][b] += x[a] * x[b];
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
            for (int k = c; k < 4; k++) A[r][k] -= f * A[c][k];
        }
    }
    for (int a = 0; a < 3; a++) {
        theta[a] = A[a][3] / A[a][a] / col[a];
        if (!isfinite(theta[a])) return -1;
    }
    return 0;
}

static void start_halving(gvq_ptune_t *s) {
    s->phase = 1;
    s->prev_t = s->ts[0]; /* the start's time */
    s->P = s->start / 2;
    if (s->P < 1) s->phase = 2;
}

void gvq_ptune_init(gvq_ptune_t *s, int start, int maxp) {
    memset(s, 0, sizeof *s);
    if (maxp < 1) maxp = 1;
    if (start < 1) start = 1;
    if (start > maxp) start = maxp;
    s->start = start;
    s->maxp = maxp;
    s->P = start;
    s->prev_t = DBL_MAX;
}

int gvq_ptune_next(const gvq_ptune_t *s) {
    if (s->phase == 2 || s->n >= GVQ_PTUNE_MAX) return 0;
    return s->P;
}

void gvq_ptune_record(gvq_ptune_t *s, double seconds) {
    if (s->phase == 2 || s->n >= GVQ_PTUNE_MAX) return;
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
    } else if (falls && s->P / 2 >= 1) {
        s->prev_t = seconds;
        s->P /= 2;
    } else {
        s->phase = 2;
    }
}

static int was_sampled(const gvq_ptune_t *s, long P) {
    for (int i = 0; i < s->n; i++)
        if (s->Ps[i] == P) return 1;
    return 0;
}

int gvq_ptune_choose(const gvq_ptune_t *s, int granule, int *fit_ok, double theta[3],
                     double *predicted) {
    int best = 0, pmin = 0, pmax = 0;
    double best_t = DBL_MAX, Pd[GVQ_PTUNE_MAX];
    for (int i = 0; i < s->n; i++) {
        Pd[i] = s->Ps[i];
        if (s->ts[i] < best_t) best_t = s->ts[i], best = s->Ps[i];
        if (pmin == 0 || s->Ps[i] < pmin) pmin = s->Ps[i];
        if (s->Ps[i] > pmax) pmax = s->Ps[i];
    }
    theta[0] = theta[1] = theta[2] = 0.0;
    *fit_ok = 0;
    *predicted = s->n > 0 ? best_t : 0.0;
    if (s->n == 0 || gvq_lsq_fit3(Pd, s->ts, s->n, theta) != 0) return best;
    long lo = GVQ_MAX(1, pmin / 2), hi = GVQ_MIN((long)s->maxp, 2L * pmax);
    long arg = 0;
    double fbest = DBL_MAX;
    if (granule < 1) granule = 1;
    for (long P = lo; P <= hi; P++) {
        if (P % granule != 0 && !was_sampled(s, P)) continue;
        double f = theta[0] + theta[1] / (double)P + theta[2] * (double)P;
        if (isfinite(f) && f < fbest) fbest = f, arg = P;
    }
    if (arg == 0) return best;
    *fit_ok = 1;
    *predicted = fbest;
    return (int)arg;
}
