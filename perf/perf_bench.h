/*
 * perf_bench.h -- what gvq-perf's driver (gvq_perf.c) and its benchmarks share: the
 * result of one case, the ops table each codec's benchmark fills (perf_plain.c: none, mpi;
 * perf_compressed.c: gradiveq, qsgd), and the results of a whole run, which perf_report.c prints.
 *
 * Per size, the driver calls run_size of every codec that runs; run_size times the out-of-place
 * case, then the in-place one, on the run's buffers (see gvq_perf.c for the whole schedule).
 */
#ifndef PERF_BENCH_H_
#define PERF_BENCH_H_

#include <stddef.h>
#include <stdint.h>

#include "perf_args.h"
#include "perf_gradsrc.h"

typedef struct {
    double time_us; /* < 0: not measured */
    int64_t wrong;  /* -1: not checked */
    double ratio;   /* uncompressed / wire bytes; 0: not applicable */
    double rel_err; /* < 0: not computed */
} result_t;

#define RESULT_NONE ((result_t){-1.0, -1, 0.0, -1.0})

/* One codec at one size. */
typedef struct {
    result_t res[2];   /* out-of-place, in-place */
    int dims;          /* gradiveq: the compressor's d after the size (0: plain or not run) */
    char details[640]; /* compressed codecs: the size's line of the details section */
} perf_case_t;

/* What every case of a run works on. */
typedef struct {
    const opts_t *o;
    void *sendbuf, *recvbuf; /* o->maxbytes each */
    const gs_source_t *src;  /* gradients of the compressed codecs; NULL when none runs */
    int csv_lossy;           /* the CSV has the ratio and rel_err fields */
} perf_run_t;

typedef struct perf_bench perf_bench_t;
struct perf_bench {
    codec_t codec;
    /* why this codec cannot run with o's datatype and op (written to buf), or NULL if it can */
    const char *(*skip_reason)(const opts_t *o, char *buf, size_t len);
    /* the out-of-place and in-place cases of `count` elements (collective) */
    void (*run_size)(const perf_bench_t *b, const perf_run_t *run, size_t count, perf_case_t *out);
};

extern const perf_bench_t perf_bench_none, perf_bench_mpi; /* perf_plain.c */
extern const perf_bench_t perf_bench_gradiveq, perf_bench_qsgd,
    perf_bench_powersgd; /* perf_compressed.c */

#define PERF_MAX_SIZES 72 /* min, min*f, ... <= max: at most 65 with f >= 2 */

/* Everything a run measured, for the tables at the end. */
typedef struct {
    size_t nsizes;
    size_t count[PERF_MAX_SIZES], bytes[PERF_MAX_SIZES]; /* per size: elements and bytes */
    perf_case_t *cases;                                  /* [size * NUM_CODECS + codec] */
    int nrun;                                            /* the codecs that run, in -C's order */
    codec_t run[NUM_CODECS];
    int have[NUM_CODECS];         /* 1 when the codec runs */
    int lossy;                    /* a compressed codec runs: ratio and rel_err columns */
    double busbw_sum[NUM_CODECS]; /* over the timed cases, for the average */
    int busbw_n[NUM_CODECS];
    int64_t total_wrong;
    int untimed_cases; /* compressed cases that could not be timed */
} perf_results_t;

static inline perf_case_t *perf_case(const perf_results_t *r, size_t z, codec_t c) {
    return &r->cases[z * NUM_CODECS + c];
}

/* busbw = algbw * factor, nccl-tests' factor of each collective: allreduce 2(n-1)/n,
 * reducescatter and allgather (n-1)/n (of the whole vector's size), broadcast, reduce and
 * sendrecv 1; 0 at one rank for the first three. */
static inline double perf_busfactor(coll_t coll, int nranks) {
    switch (coll) {
    case COLL_ALLREDUCE:
        return nranks > 1 ? 2.0 * (nranks - 1) / nranks : 0.0;
    case COLL_REDUCESCATTER:
    case COLL_ALLGATHER:
        return nranks > 1 ? (double)(nranks - 1) / nranks : 0.0;
    default:
        return 1.0;
    }
}

/* GB/s of `bytes` in time_us; 0 when not measured. */
static inline double perf_algbw(size_t bytes, double time_us) {
    return time_us > 0.0 ? (double)bytes / 1e9 / (time_us * 1e-6) : 0.0;
}

#endif /* PERF_BENCH_H_ */
