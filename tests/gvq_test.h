/*
 * gvq_test.h -- small helpers shared by the unit tests: checks that count failures, and a
 * runner that executes a function on N in-process ranks (threads), gloo's habit.
 */
#ifndef GVQ_TEST_H_
#define GVQ_TEST_H_

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "gvq_comm.h"

static int gvq_test_failures;
static pthread_mutex_t gvq_test_lock = PTHREAD_MUTEX_INITIALIZER;

#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            pthread_mutex_lock(&gvq_test_lock);                                 \
            if (gvq_test_failures++ < 50) {                                     \
                fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
                fprintf(stderr, __VA_ARGS__);                                   \
                fprintf(stderr, "\n");                                          \
            }                                                                   \
            pthread_mutex_unlock(&gvq_test_lock);                               \
        }                                                                       \
    } while (0)

#define EXPECT_RES(call, want)                                                                     \
    do {                                                                                           \
        gvqResult_t got_ = (call);                                                                 \
        EXPECT(got_ == (want), "%s returned %s, expected %s (%s)", #call, gvqGetErrorString(got_), \
               gvqGetErrorString(want), gvqGetLastError(NULL));                                    \
    } while (0)

typedef void (*gvq_rank_fn)(gvqComm_t comm, int rank, int nranks, void *arg);

typedef struct {
    gvq_rank_fn fn;
    gvqComm_t comm;
    int rank, nranks;
    void *arg;
} gvq_test_thread_t;

static void *gvq_test_thread_main(void *p) {
    gvq_test_thread_t *t = p;
    t->fn(t->comm, t->rank, t->nranks, t->arg);
    return NULL;
}

/* Run fn on nranks in-process ranks of a fresh communicator; destroys it afterwards. */
static inline void gvq_test_run(int nranks, const gvqConfig_t *cfg, gvq_rank_fn fn, void *arg) {
    gvqComm_t comms[16];
    gvq_test_thread_t th[16];
    pthread_t tid[16];
    gvqResult_t res = gvq_comm_init_inproc(nranks, cfg, comms);
    EXPECT(res == gvqSuccess, "gvq_comm_init_inproc(%d): %s", nranks, gvqGetErrorString(res));
    if (res != gvqSuccess) return;
    for (int r = 0; r < nranks; r++) {
        th[r] = (gvq_test_thread_t){fn, comms[r], r, nranks, arg};
        pthread_create(&tid[r], NULL, gvq_test_thread_main, &th[r]);
    }
    for (int r = 0; r < nranks; r++)
        pthread_join(tid[r], NULL);
    for (int r = 0; r < nranks; r++)
        gvqCommDestroy(comms[r]);
}

/* Run fn over ncases cases (stride bytes apart from cases) on one communicator of nranks
 * in-process ranks, every rank taking them in the same order: the sweeps' way of calling a
 * communicator many times, as a trainer does, without a communicator's setup per case. */
typedef struct {
    gvq_rank_fn fn;
    char *cases;
    size_t ncases, stride;
} gvq_test_each_t;

static void gvq_test_each_main(gvqComm_t comm, int rank, int nranks, void *arg) {
    const gvq_test_each_t *e = arg;
    for (size_t i = 0; i < e->ncases; i++)
        e->fn(comm, rank, nranks, e->cases + i * e->stride);
}

static inline void gvq_test_run_each(int nranks, const gvqConfig_t *cfg, gvq_rank_fn fn,
                                     void *cases, size_t ncases, size_t stride) {
    gvq_test_each_t e = {fn, cases, ncases, stride};
    if (ncases > 0) gvq_test_run(nranks, cfg, gvq_test_each_main, &e);
}

/* GVQ_TEST_SWEEP=small: the exhaustive sweeps (every dtype x op x count x rank count) keep a
 * representative part -- float32, int32 and float16; sum and max; up to 4 ranks -- for the
 * sanitizer builds, where a thread switch costs a hundred times more (ThreadSanitizer). */
static inline int gvq_test_sweep_small(void) {
    const char *s = getenv("GVQ_TEST_SWEEP");
    return s != NULL && s[0] == 's';
}
/* GVQ_TEST_SWEEP=widths: every rank count, and of the types one signed integer and one float
 * of each width (int8, int32, int64, float16, float32, double) with sum, prod, max and avg --
 * for AddressSanitizer and UBSan, whose findings (a read or write past a buffer, a signed
 * overflow) depend on the element's width, its signedness and the op, not on which type of a
 * width it is; the plain build runs the whole sweep. */
static inline int gvq_test_sweep_widths(void) {
    const char *s = getenv("GVQ_TEST_SWEEP");
    return s != NULL && s[0] == 'w';
}
static inline int gvq_test_sweep_skips(int nranks, int dtype, int op) {
    if (gvq_test_sweep_widths())
        return !(dtype == gvqInt8 || dtype == gvqInt32 || dtype == gvqInt64 ||
                 dtype == gvqFloat16 || dtype == gvqFloat32 || dtype == gvqFloat64) ||
               op == gvqMin;
    if (!gvq_test_sweep_small()) return 0;
    return nranks > 4 || !(dtype == gvqFloat32 || dtype == gvqInt32 || dtype == gvqFloat16) ||
           !(op == gvqSum || op == gvqMax);
}

static inline int gvq_test_finish(const char *name) {
    if (gvq_test_failures) {
        fprintf(stderr, "%s: %d failure(s)\n", name, gvq_test_failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}

#endif /* GVQ_TEST_H_ */
