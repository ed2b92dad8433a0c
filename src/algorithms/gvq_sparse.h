/*
 * gvq_sparse.h -- the algorithms behind sparse variables (docs/ALGORITHMS.md section 4): merging
 * duplicate rows, the partition map of a parameter server, the shard update rules, the
 * all-to-all row exchange and the sparse allgatherv transfers, and the partition tuner's math.
 *
 * Like the rest of algorithms/, these see only the transport and device ops tables and plain C.
 * A "row" is an int64 index plus `dim` elements; on the wire a block of n rows is the n indices
 * followed by the n rows of values (row_bytes = dim * element size each).
 */
#ifndef GVQ_SPARSE_H_
#define GVQ_SPARSE_H_

#include "gvq_algo.h"

/* ---- merging duplicate rows (sparse.c) --------------------------------------------------------
 * Sorts n rows by index and sums rows of equal index, in the order they were given (so the
 * result is a pure function of the input order). out_idx/out_val must hold n rows; they must not
 * alias the input. *nout receives the number of unique rows; out_idx is strictly ascending.
 * Summation is dev->reduce(gvqSum) in `dtype`. gvqSystemError when out of memory. */
gvqResult_t gvq_sparse_merge(const gvq_device_ops_t *dev, gvqDataType_t dtype, size_t dim,
                             const int64_t *idx, const void *val, size_t n, int64_t *out_idx,
                             void *out_val, size_t *nout);

/* First position i < n whose index is outside [0, rows), or n if all are inside. */
size_t gvq_sparse_find_out_of_range(const int64_t *idx, size_t n, uint64_t rows);

/* First position i in [1, n) with idx[i] <= idx[i-1] (not strictly ascending), or n. */
size_t gvq_sparse_find_unsorted(const int64_t *idx, size_t n);

/* ---- the partition map of a parameter server (sparse.c) ---------------------------------------
 * rows are cut into P shards; shard s lives on rank s mod N. Contiguous: shard s owns the rows
 * [start(s), start(s+1)) with start(s) = floor(s * rows / P). Hashed: the same ranges of
 * perm(row) = (a * row + b) mod rows, a bijection (a coprime to rows), so neighbouring hot rows
 * land on different shards. On its rank a shard's rows are stored after those of the rank's
 * lower shards, so each rank holds one array of "slots". */
enum { GVQ_PART_HASHED = 0, GVQ_PART_CONTIGUOUS = 1 };
typedef struct {
    uint64_t rows;
    uint64_t P;
    int nranks;
    int mode;
    uint64_t mul, add;   /* hashed: perm(row) = (mul * row + add) mod rows */
    uint64_t inv;        /* hashed: mul's inverse mod rows (row = inv (perm - add) mod rows) */
    int narrow;          /* rows < 2^32 and rows * P < 2^64: 64-bit arithmetic suffices */
    uint64_t *slot_base; /* P entries: first slot of shard s on its rank */
    uint64_t *rank_rows; /* nranks entries: slots (rows) each rank holds */
} gvq_part_t;

/* Build the map; gvqInvalidArgument for rows 0, P 0, nranks < 1, unknown mode; gvqSystemError. */
gvqResult_t gvq_part_init(gvq_part_t *m, uint64_t rows, uint64_t P, int nranks, int mode);
void gvq_part_fini(gvq_part_t *m);
/* Start of shard s in permuted-row space (s may equal P: then rows). */
uint64_t gvq_part_start(const gvq_part_t *m, uint64_t s);
/* Shard of a row in [0, rows). */
uint64_t gvq_part_shard(const gvq_part_t *m, uint64_t row);
/* Rank holding a row and the row's slot on that rank. */
void gvq_part_locate(const gvq_part_t *m, uint64_t row, int *rank, uint64_t *slot);
/* The row stored at slot `slot` of rank `rank` (the inverse of gvq_part_locate). */
uint64_t gvq_part_row_of(const gvq_part_t *m, int rank, uint64_t slot);

/* ---- shard update rules (sparse.c) ------------------------------------------------------------
 * One row of dim elements (float or double as dtype): w the values, s the rule's state (momentum
 * m or Adagrad accumulator a; unused by SGD), g the summed gradient, already scaled by `gscale`
 * (1, or 1/N for averaging) inside the rule. */
enum { GVQ_RULE_SGD = 0, GVQ_RULE_MOMENTUM = 1, GVQ_RULE_ADAGRAD = 2 };
typedef struct {
    int rule;
    double lr, mu, eps, gscale;
} gvq_rule_t;
void gvq_rule_apply(const gvq_rule_t *r, gvqDataType_t dtype, size_t dim, void *w, void *s,
                    const void *g);
/* The same with the rule's fields as arguments (for the training layer, gvq_train_below.h). */
void gvq_rule_apply_params(int rule, double lr, double mu, double eps, double gscale,
                           gvqDataType_t dtype, size_t dim, void *w, void *s, const void *g);

/* ---- all-to-all of row blocks (sparse_exchange.c) --------------------------------------------
 * Every rank sends each peer one header {magic ^ kind, status, nrows} and, when nrows > 0, one
 * block of nrows rows (pieces of at most 1 GiB). A receiver checks each header (magic, status
 * 0 or 1, nrows <= recv_cap[peer]) before it posts the block's receive, so a header that
 * announces more than the receiver accepts never reaches memory; the transport then refuses a
 * block whose length differs from what its header announced. A bad header breaks the
 * communicator (the pair's message order is lost) and returns gvqRemoteError. Rows inside a
 * block are not checked here: the caller validates them before using them. */
#define GVQ_SX_MAGIC 0x5350415253453147ll /* "SPARSE1G"; a header carries it xor the kind */
enum { GVQ_SX_PUSH_LOCAL = 1, GVQ_SX_PUSH = 2, GVQ_SX_PULL = 3, GVQ_SX_MOVE = 4 }; /* kinds */

typedef struct {
    int64_t status; /* 0 ok; 1 the sender refused its own input (nrows is then 0) */
    size_t nrows;
    void *buf; /* nrows * (8 + row_bytes): indices, then values */
} gvq_sx_block_t;

typedef struct {
    unsigned long long sent, received; /* bytes, added to */
} gvq_sx_bytes_t;

/* send[p] for peers p != rank with send_mask[p] (NULL: all); recv from peers with recv_mask[p]
 * (NULL: all). recv[p].buf is malloc'ed here (the caller frees it, also on error). */
gvqResult_t gvq_sx_alltoallv(gvq_coll_ctx_t *ctx, int kind, size_t row_bytes,
                             const gvq_sx_block_t *send, const uint8_t *send_mask,
                             const size_t *recv_cap, const uint8_t *recv_mask, gvq_sx_block_t *recv,
                             gvq_sx_bytes_t *bytes);

/* Plain exchange of known sizes: sends sbytes[p] from sbuf[p] to each peer with sbytes[p] > 0
 * and receives rbytes[p] into rbuf[p] from each peer with rbytes[p] > 0 (both sides know the
 * sizes; a message of another length is gvqRemoteError from the transport). */
gvqResult_t gvq_sx_exchange(gvq_coll_ctx_t *ctx, void *const *sbuf, const size_t *sbytes,
                            void *const *rbuf, const size_t *rbytes, gvq_sx_bytes_t *bytes);

/* ---- sparse allgatherv transfers (sparse_exchange.c) ------------------------------------------
 * blocks: nranks contiguous blocks of bytes (block p at offset displ[p], blen[p] bytes); this
 * rank's block already in place. After the call every block is in place on every rank.
 *   ring:   step k sends block (r-k) mod N right and receives block (r-k-1) mod N from the left,
 *           in chunks of chunk_bytes, each chunk forwarded the moment it arrives:
 *               4 ranks, step 0: 0->1 b0  1->2 b1  2->3 b2  3->0 b3
 *                        step 1: 0->1 b3  1->2 b0  ...   step 2: 0->1 b2 ...
 *   native: the transport's iallgatherv (MPI_Iallgatherv), waited on like any request.
 * gvq_sparse_native_ok says whether the transport has one and the sizes fit it. */
gvqResult_t gvq_sparse_ring_allgatherv(gvq_coll_ctx_t *ctx, void *blocks, const size_t *displ,
                                       const size_t *blen, gvq_sx_bytes_t *bytes);
int gvq_sparse_native_ok(const gvq_transport_t *t, const size_t *blen);
gvqResult_t gvq_sparse_native_allgatherv(gvq_coll_ctx_t *ctx, void *blocks, const size_t *displ,
                                         const size_t *blen, gvq_sx_bytes_t *bytes);

/* ---- partition tuning (sparse_tune.c) ---------------------------------------------------------
 * Least squares for t ~ th0 + th1/P + th2*P over n samples. Returns 0 and theta, or -1 when
 * fewer than 3 distinct P or the system is singular. */
int gvq_lsq_fit3(const double *P, const double *t, int n, double theta[3]);

/* The search of docs/ALGORITHMS.md: sample start; double while the time falls (up to maxp); then
 * halve from start while the time falls (down to 1). Then up to GVQ_PTUNE_REFINE refinement samples
 * (the doubling/halving grid is coarse, and the measured curve is often flat near its minimum
 * with bumps the model cannot see): the fit's argmin if it was not sampled, else the untried
 * candidate midway between the fastest sample and its sampled neighbour above (then below).
 * Candidates are the multiples of `granule` (>= 1): with shards colocated on N ranks, a P that
 * is not a multiple of N gives some ranks more shards than others. Drive it with next/record. */
#define GVQ_PTUNE_MAX 32
#define GVQ_PTUNE_REFINE 3
typedef struct {
    int start, maxp, granule;
    int phase;     /* 0 doubling, 1 halving, 2 refining, 3 done */
    int refined;   /* refinement samples taken */
    int P;         /* the P to sample next */
    double prev_t; /* time of the previous sample of this phase */
    int n;
    int Ps[GVQ_PTUNE_MAX];
    double ts[GVQ_PTUNE_MAX];
} gvq_ptune_t;
void gvq_ptune_init(gvq_ptune_t *s, int start, int maxp, int granule);
/* The P to sample next, or 0 when the search is done. */
int gvq_ptune_next(const gvq_ptune_t *s);
/* Record the time of the sample gvq_ptune_next returned. */
void gvq_ptune_record(gvq_ptune_t *s, double seconds);
/* The choice: the fastest sample (the fit decides where to look, the measurement decides; 0
 * without samples). Writes the least-squares fit over all samples (fit_ok 0 with fewer than 3
 * distinct P or a singular system) and the predicted time at the choice (the fit's value, or the
 * sample's own time without a fit). */
int gvq_ptune_choose(const gvq_ptune_t *s, int *fit_ok, double theta[3], double *predicted);

#endif /* GVQ_SPARSE_H_ */
