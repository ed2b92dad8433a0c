/*
 * text.c -- gvq-train --model text: a bag-of-words classifier whose embedding table is a real
 * sparse variable. The data: every Debian package of the apt lists, its Section as the label
 * (the 19 most frequent sections, the rest "other") and its name and one-line description as
 * the words (apps/gvq-train/apt-text.sh writes them as "section<TAB>name description" lines).
 *
 *   words -> hashed into V rows -> embedding rows (V x D, sparse: a step touches the batch's
 *   words) -> mean -> fc C x D + bias -> softmax cross-entropy
 *
 * Through the training layer: the embedding is a gvqVarSparse variable (its rows looked up with
 * gvqTrainSparseLookup and updated by the layer's rule: PS, allgatherv or dense, --sparse-route),
 * the fc weight and bias dense variables; SGD on those here, with the averaged gradients.
 * Packages whose name hashes to 0 mod 10 form the test set.
 */
#include "text.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gvq.h"
#include "gvq_mpi.h"
#include "gvq_train.h"

enum { MAX_WORDS = 32, CLASSES = 20 };

typedef struct {
    int label;
    int nw;
    int32_t w[MAX_WORDS];
} doc_t;

typedef struct {
    doc_t *train, *test;
    int ntrain, ntest;
} corpus_t;

static uint32_t fnv(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the data -------------------------------------------------------------------------------- */

typedef struct {
    char name[48];
    int count;
} section_t;

static int by_count(const void *a, const void *b) {
    const section_t *x = a, *y = b;
    return x->count != y->count ? y->count - x->count : strcmp(x->name, y->name);
}

/* The section without its archive area ("contrib/games" -> "games"). */
static void section_of(const char *line, char *out, size_t n) {
    const char *tab = strchr(line, '\t'), *s = line;
    for (const char *p = line; p < tab; p++)
        if (*p == '/') s = p + 1;
    snprintf(out, n, "%.*s", (int)(tab - s), s);
}

/* Loads the corpus; the 19 most frequent sections are classes 0..18, the rest class 19. */
static int load(const char *path, int vocab, corpus_t *c, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "cannot open '%s' (make it with apps/gvq-train/apt-text.sh)", path);
        return -1;
    }
    char line[4096];
    section_t *secs = NULL;
    int nsec = 0, capsec = 0, nlines = 0;
    while (fgets(line, sizeof line, f)) { /* pass 1: the sections */
        if (strchr(line, '\t') == NULL) continue;
        char s[48];
        section_of(line, s, sizeof s);
        int k = 0;
        while (k < nsec && strcmp(secs[k].name, s) != 0)
            k++;
        if (k == nsec) {
            if (nsec == capsec) {
                capsec = capsec ? 2 * capsec : 64;
                secs = realloc(secs, sizeof *secs * (size_t)capsec);
            }
            snprintf(secs[nsec].name, sizeof secs[nsec].name, "%s", s);
            secs[nsec++].count = 0;
        }
        secs[k].count++;
        nlines++;
    }
    qsort(secs, (size_t)nsec, sizeof *secs, by_count);
    c->train = calloc((size_t)nlines + 1, sizeof(doc_t));
    c->test = calloc((size_t)nlines / 5 + 1, sizeof(doc_t));
    c->ntrain = c->ntest = 0;
    rewind(f);
    while (fgets(line, sizeof line, f)) { /* pass 2: the documents */
        char *tab = strchr(line, '\t');
        if (tab == NULL) continue;
        char s[48];
        section_of(line, s, sizeof s);
        int label = CLASSES - 1;
        for (int k = 0; k < nsec && k < CLASSES - 1; k++)
            if (strcmp(secs[k].name, s) == 0) label = k;
        const char *text = tab + 1;
        size_t name_len = strcspn(text, " \n");
        int is_test = fnv(text, name_len) % 10 == 0;
        if (is_test && c->ntest >= nlines / 5) continue;
        doc_t *d = is_test ? &c->test[c->ntest++] : &c->train[c->ntrain++];
        d->label = label;
        d->nw = 0;
        for (const char *p = text; *p && d->nw < MAX_WORDS;) { /* lowercase alphanumeric words */
            while (*p && !((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                           (*p >= '0' && *p <= '9')))
                p++;
            char word[64];
            size_t n = 0;
            while (*p && ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                          (*p >= '0' && *p <= '9'))) {
                if (n < sizeof word) word[n++] = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
                p++;
            }
            if (n >= 2) d->w[d->nw++] = (int32_t)(fnv(word, n) % (uint32_t)vocab);
        }
        if (d->nw == 0) d->w[d->nw++] = 0;
    }
    fclose(f);
    free(secs);
    if (c->ntrain == 0) {
        snprintf(err, errlen, "'%s' holds no documents", path);
        return -1;
    }
    return 0;
}

/* ---- the model ------------------------------------------------------------------------------ */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The distinct words of docs[0..n), ascending. */
static size_t unique_words(const doc_t *docs, int n, int64_t *u) {
    size_t m = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < docs[i].nw; j++)
            u[m++] = docs[i].w[j];
    qsort(u, m, sizeof *u, cmp_i64);
    size_t k = 0;
    for (size_t i = 0; i < m; i++)
        if (k == 0 || u[k - 1] != u[i]) u[k++] = u[i];
    return k;
}

static size_t pos_of(const int64_t *u, size_t n, int64_t w) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (u[mid] < w)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Forward (and with gW non-NULL, backward) over docs: returns the loss sum, counts correct. */
static double pass(const doc_t *docs, int n, const int64_t *u, size_t nu, const float *E, int D,
                   const float *W, const float *b, float *gW, float *gb, float *gE, long *correct) {
    double loss = 0;
    float h[256], z[CLASSES], dh[256];
    for (int i = 0; i < n; i++) {
        const doc_t *d = &docs[i];
        for (int k = 0; k < D; k++)
            h[k] = 0;
        for (int j = 0; j < d->nw; j++) {
            const float *e = E + pos_of(u, nu, d->w[j]) * (size_t)D;
            for (int k = 0; k < D; k++)
                h[k] += e[k] / (float)d->nw;
        }
        float zmax = -1e30f;
        int arg = 0;
        for (int c = 0; c < CLASSES; c++) {
            z[c] = b[c];
            for (int k = 0; k < D; k++)
                z[c] += W[c * D + k] * h[k];
            if (z[c] > zmax) zmax = z[c], arg = c;
        }
        double sum = 0;
        for (int c = 0; c < CLASSES; c++)
            sum += exp((double)(z[c] - zmax));
        loss += log(sum) - (double)(z[d->label] - zmax);
        *correct += arg == d->label;
        if (gW == NULL) continue;
        for (int k = 0; k < D; k++)
            dh[k] = 0;
        for (int c = 0; c < CLASSES; c++) {
            float g = (float)(exp((double)(z[c] - zmax)) / sum) - (c == d->label);
            g /= (float)n;
            gb[c] += g;
            for (int k = 0; k < D; k++) {
                gW[c * D + k] += g * h[k];
                dh[k] += g * W[c * D + k];
            }
        }
        for (int j = 0; j < d->nw; j++) {
            float *ge = gE + pos_of(u, nu, d->w[j]) * (size_t)D;
            for (int k = 0; k < D; k++)
                ge[k] += dh[k] / (float)d->nw;
        }
    }
    return loss;
}

#define TEXT_GVQ(call)                                                                    \
    do {                                                                                  \
        gvqResult_t r_ = (call);                                                          \
        if (r_ != gvqSuccess) {                                                           \
            fprintf(stderr, "gvq-train: %s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, \
                    gvqGetErrorString(r_), gvqGetLastError(NULL));                        \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                 \
        }                                                                                 \
    } while (0)

/* Test accuracy: each rank a slice of the test set (lookups are collective on the PS route, so
 * every rank makes the same number of them). */
static double evaluate(gvqTrainer_t t, int emb, const corpus_t *c, int D, const float *W,
                       const float *b, int rank, int nranks, int64_t *u, float *E) {
    const int chunk = 256;
    long correct = 0, seen = 0;
    int per = (c->ntest + nranks - 1) / nranks, from = rank * per,
        to = from + per < c->ntest ? from + per : c->ntest;
    for (int s = 0; s < per; s += chunk) {
        int a = from + s, n = a < to ? (a + chunk < to ? chunk : to - a) : 0;
        size_t nu = n > 0 ? unique_words(c->test + a, n, u) : 0;
        TEXT_GVQ(gvqTrainSparseLookup(t, emb, u, nu, E));
        (void)pass(c->test + a, n, u, nu, E, D, W, b, NULL, NULL, NULL, &correct);
        seen += n;
    }
    long both[2] = {correct, seen};
    MPI_Allreduce(MPI_IN_PLACE, both, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    return both[1] > 0 ? 100.0 * (double)both[0] / (double)both[1] : 0.0;
}

static uint64_t hash_floats(const float *x, size_t n) {
    return fnv((const char *)x, n * sizeof *x);
}

/* The embedding's parameter server: SGD at the run's rate, averaged, a small uniform start. */
static gvqPsConfig_t ps_config(const text_opts_t *o) {
    gvqPsConfig_t pc = GVQ_PS_CONFIG_INITIALIZER;
    pc.learningRate = o->lr;
    pc.average = 1; /* the same average as the dense variables */
    pc.init = gvqPsInitUniform;
    pc.initScale = 0.1;
    pc.seed = o->seed;
    if (o->partitions > 0) pc.partitions = o->partitions;
    pc.serve = o->staleness >= 0;
    pc.staleness = o->staleness >= 0 ? o->staleness : 0;
    return pc;
}

int text_run(const text_opts_t *o) {
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    const int V = o->vocab, D = o->dim, B = o->batch;
    char err[512] = "";
    corpus_t c = {0};
    int bad = load(o->data, V, &c, err, sizeof err) != 0, anybad = 0;
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (anybad) {
        if (bad) fprintf(stderr, "gvq-train: rank %d: %s\n", rank, err);
        return -1;
    }
    if (D > 256 || B < 1) {
        if (rank == 0) fprintf(stderr, "gvq-train: --embed-dim at most 256, --batch >= ranks\n");
        return -1;
    }
    gvqComm_t comm;
    TEXT_GVQ(gvqCommInitMPI(&comm, MPI_COMM_WORLD, NULL));
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    cfg.sparseRoute = o->route;
    if (o->partitions > 0) cfg.tunePartitions = 0;
    gvqTrainer_t t;
    TEXT_GVQ(gvqTrainCreate(comm, &cfg, &t));
    gvqPsConfig_t pc = ps_config(o);
    gvqVariable_t ve = GVQ_VARIABLE_INITIALIZER, vw = ve, vb = ve;
    ve.name = "embedding";
    ve.kind = gvqVarSparse;
    ve.shape[0] = V;
    ve.shape[1] = D;
    ve.sparse = &pc;
    vw.name = "fc.w";
    vw.kind = gvqVarFc;
    vw.shape[0] = CLASSES;
    vw.shape[1] = D;
    vb.name = "fc.b";
    vb.kind = gvqVarDense;
    vb.shape[0] = CLASSES;
    int iw, ib, ie;
    TEXT_GVQ(gvqTrainAddVariable(t, &vw, &iw)); /* backward order: fc first */
    TEXT_GVQ(gvqTrainAddVariable(t, &vb, &ib));
    TEXT_GVQ(gvqTrainAddVariable(t, &ve, &ie));
    TEXT_GVQ(gvqTrainCommit(t));

    float *W = calloc((size_t)CLASSES * D, sizeof(float)), *b = calloc(CLASSES, sizeof(float));
    float *gW = malloc(sizeof(float) * CLASSES * (size_t)D), *gb = malloc(sizeof(float) * CLASSES);
    int64_t *u = malloc(sizeof(int64_t) * (size_t)(B > 256 ? B : 256) * MAX_WORDS);
    float *E = malloc(sizeof(float) * (size_t)(B > 256 ? B : 256) * MAX_WORDS * D);
    float *gE = malloc(sizeof(float) * (size_t)B * MAX_WORDS * D);
    int *perm = malloc(sizeof(int) * (size_t)c.ntrain);
    doc_t *local = malloc(sizeof(doc_t) * (size_t)B);
    uint64_t s = o->seed * 2654435761u + 1;
    for (int i = 0; i < CLASSES * D; i++) { /* small uniform init, the same on every rank */
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        W[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.2f;
    }
    const int global = B * nranks;
    const long steps_per_epoch = c.ntrain / global;
    const long iters = o->iters > 0 ? o->iters : (long)o->epochs * steps_per_epoch;
    char server[48] = "synchronous";
    if (o->staleness >= 0) snprintf(server, sizeof server, "served, staleness %d", o->staleness);
    if (rank == 0)
        printf("# gvq-train text: %d train / %d test packages, %d classes, vocabulary %d x %d, "
               "%d ranks x %d docs, %ld steps, lr %g, sparse route %s, parameter server %s\n",
               c.ntrain, c.ntest, CLASSES, V, D, nranks, B, iters, o->lr,
               o->route == GVQ_CONFIG_UNDEF_INT ? "Parallax's rule"
               : o->route == gvqRoutePs         ? "ps"
               : o->route == gvqRouteAllGatherv ? "allgatherv"
                                                : "dense",
               server);
    long pos = c.ntrain, epoch = 0, correct = 0, seen = 0, mismatches = 0;
    double loss = 0, t0 = now_s(), acc = 0;
    for (long step = 0; step < iters; step++) {
        if (pos + global > c.ntrain) { /* the same shuffle on every rank */
            for (int i = 0; i < c.ntrain; i++)
                perm[i] = i;
            uint64_t r = o->seed * 1000003ull + (uint64_t)epoch++;
            for (int i = c.ntrain - 1; i > 0; i--) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                int j = (int)((r >> 33) % (uint64_t)(i + 1)), x = perm[i];
                perm[i] = perm[j];
                perm[j] = x;
            }
            pos = 0;
        }
        for (int i = 0; i < B; i++)
            local[i] = c.train[perm[pos + (long)rank * B + i]];
        pos += global;
        size_t nu = unique_words(local, B, u);
        TEXT_GVQ(gvqTrainSparseLookup(t, ie, u, nu, E));
        memset(gW, 0, sizeof(float) * CLASSES * (size_t)D);
        memset(gb, 0, sizeof(float) * CLASSES);
        memset(gE, 0, sizeof(float) * nu * (size_t)D);
        loss += pass(local, B, u, nu, E, D, W, b, gW, gb, gE, &correct);
        seen += B;
        TEXT_GVQ(gvqTrainGradReady(t, iw, gW));
        TEXT_GVQ(gvqTrainGradReady(t, ib, gb));
        TEXT_GVQ(gvqTrainSparseReady(t, ie, u, gE, nu));
        TEXT_GVQ(gvqTrainWaitAll(t));
        for (int i = 0; i < CLASSES * D; i++)
            W[i] -= (float)o->lr * gW[i];
        for (int i = 0; i < CLASSES; i++)
            b[i] -= (float)o->lr * gb[i];
        int last = step + 1 == iters;
        if ((step + 1) % o->print_every == 0 || last) {
            uint64_t h[2] = {hash_floats(W, (size_t)CLASSES * D), 0}, lo = 0, hi = 0;
            MPI_Allreduce(&h[0], &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
            MPI_Allreduce(&h[0], &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
            mismatches += lo != hi;
            double sums[2] = {loss, (double)correct}, all[2];
            MPI_Allreduce(sums, all, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            acc = evaluate(t, ie, &c, D, W, b, rank, nranks, u, E);
            gvqTrainVariableInfo_t info;
            TEXT_GVQ(gvqTrainGetVariableInfo(t, ie, &info));
            if (rank == 0)
                printf("step %6ld  loss %.4f  train %5.2f%%  test %5.2f%%  embedding: route %s, "
                       "%.0f B/step sent  (%s)\n",
                       step + 1, all[0] / (double)(seen * nranks),
                       100.0 * all[1] / (double)(seen * nranks), acc,
                       info.route == gvqRoutePs           ? "ps"
                       : info.route == gvqRouteAllGatherv ? "allgatherv"
                                                          : "dense",
                       (double)info.wireBytes / (double)(step + 1), info.why);
            loss = 0;
            correct = seen = 0;
        }
    }
    if (rank == 0)
        printf("# done: %ld steps in %.1f s, test accuracy %.2f%%, fc weights identical on every "
               "rank at every check: %s\n",
               iters, now_s() - t0, acc, mismatches == 0 ? "yes" : "NO");
    TEXT_GVQ(gvqTrainDestroy(t));
    TEXT_GVQ(gvqCommDestroy(comm));
    free(W);
    free(b);
    free(gW);
    free(gb);
    free(u);
    free(E);
    free(gE);
    free(perm);
    free(local);
    free(c.train);
    free(c.test);
    return mismatches == 0 ? 0 : 1;
}
