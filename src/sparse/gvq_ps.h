/*
 * gvq_ps.h -- the parameter-server handle shared by its files (docs/ALGORITHMS.md section 4):
 *
 *   ps.c        the handle: config, create / destroy, stats, the live registry, the checks
 *               every entry point shares
 *   ps_push.c   push (with local aggregation) and apply
 *   ps_pull.c   pull
 *   ps_save.c   save / load of a rank's shards
 *   ps_tune.c   the partition tuner's driver
 *   ps_serve.c  the served mode (config `serve`): a thread per handle answers at any time
 *   ps_shard.c  what every path does to this rank's shards: check indices, sum, run the rule
 *   ps_commit.c commits (each rank's rows also kept by the next rank) and the recovery from
 *               them onto a shrunk or grown communicator
 *
 * The shards are colocated with the workers: shard s lives on rank s mod N, and each rank keeps
 * its shards' rows in one array of slots (gvq_part_t maps row -> rank, slot). A slot with a
 * pending gradient sum is listed in pending_slots (in the order first pushed) and flagged in
 * is_pending; apply runs the rule on those slots and clears them.
 *
 * A shard serves pushes and pulls inside the same calls on its own rank: the calls are
 * collective. With a host stream in the config they run on the stream's progress thread
 * (queued in issue order, like every call on the stream), so a trainer can overlap them with
 * its own work; a shard is still only served inside a push or pull of its own rank.
 * With `serve`, a thread of the handle answers the other ranks at any time (ps_serve.c), and
 * push, apply and pull are this rank's alone.
 */
#ifndef GVQ_PS_H_
#define GVQ_PS_H_

#include "gvq_comm.h"
#include "gvq_sparse.h"

#define GVQ_PS_MAGIC 0x67767350u /* 'gvqP' */
#define GVQ_PS_MAX_PARTITIONS (1 << 24)

/* A gvqPsConfig_t with the defaults filled in. */
typedef struct {
    int partitions, partitioning, rule, average, local_aggregation, init;
    double lr, momentum, adagrad_init, eps, init_scale;
    unsigned long long seed;
    const void *init_values; /* gvqPsInitValues: rows x dim elements, read in gvqPsCreate */
    gvqStream_t stream;      /* a host stream: push, apply and pull are queued on it; or NULL */
    int serve, staleness;    /* the served mode (ps_serve.c) and its SSP bound */
} gvq_ps_cfg_t;

typedef struct gvq_ps_srv gvq_ps_srv_t;

/* gvqPsCommit's copies (ps_commit.c): this rank's rows and those of the rank before it, as
 * records (a row's values, then its rule state), in slot order; the last two commits, so that a
 * failure in the middle of a commit (done on some ranks, not on others) leaves the one before
 * whole everywhere. A commit writes into the older generation's buffers. */
typedef struct {
    uint64_t serial;           /* which commit; 0: none, or being written */
    char *own, *buddy;         /* the rows of own_rank and of buddy_of */
    size_t own_cap, buddy_cap; /* bytes allocated */
} gvq_ps_gen_t;
typedef struct {
    gvq_ps_gen_t gen[2]; /* gen[0] the newest */
    int nranks;          /* the communicator's size */
    int own_rank;        /* this rank's rank in it */
    int buddy_of;        /* (own_rank - 1) mod nranks; -1: none (one rank) */
} gvq_ps_commit_t;
/* The recovery's decision (ps_commit.c), from the fields every rank of the new communicator
 * tells (N x GVQ_PSR_FIELDS; a newcomer: old rank -1): the commit recovered -- the newest that
 * every former rank present holds -- and where each former rank's rows come from (itself, or the
 * next rank's copy). The same on every rank. gvqInvalidUsage or gvqRemoteError (rows lost) with
 * a WARN naming fn; source and from_buddy are malloc'ed (the caller frees them, also on error). */
enum {
    GVQ_PSR_OLD_RANK,
    GVQ_PSR_OLD_SIZE,
    GVQ_PSR_SERIAL0, /* the newest commit held */
    GVQ_PSR_SERIAL1, /* the one before (0: none) */
    GVQ_PSR_BUDDY_OF,
    GVQ_PSR_BAD, /* 1: this rank cannot take part (no commit, another shape) */
    GVQ_PSR_FIELDS
};
typedef struct {
    int old_n;       /* the former communicator's size */
    uint64_t serial; /* the commit recovered */
    int *source;     /* per former rank: the new rank that sends its rows */
    int *from_buddy; /* per former rank: 1 when from the next rank's copy */
} gvq_ps_plan_t;
gvqResult_t gvq_ps_plan_recovery(const char *fn, const int64_t *all, int N, gvq_ps_plan_t *plan);
void gvq_ps_commit_free(gvq_ps_commit_t *c); /* (ps.c) frees the copies; no commit after */

struct gvqPs {
    uint32_t magic;
    gvqComm_t comm;
    uint64_t rows;
    size_t dim, esize, row_bytes; /* row_bytes = dim * esize */
    gvqDataType_t dtype;
    gvq_ps_cfg_t cfg;
    gvq_part_t map;
    size_t nlocal;           /* slots (rows) held here */
    char *values;            /* nlocal rows: the variable's values */
    char *rule_state;        /* nlocal rows: momentum or Adagrad accumulator; NULL for SGD */
    char *grad_sum;          /* nlocal rows: pending gradient sums */
    uint8_t *is_pending;     /* per slot: has a pending sum */
    uint64_t *pending_slots; /* the pending slots, in the order first pushed */
    size_t npending;
    int hosts, leader;  /* distinct hosts; the lowest rank of this rank's host */
    uint8_t *same_host; /* per rank: on this rank's host */
    gvqPsStats_t stats;
    gvq_ps_srv_t *srv;      /* the served mode's state and thread (ps_serve.c); NULL: synchronous */
    gvq_ps_commit_t commit; /* the last gvqPsCommit (ps_commit.c) */
};

/* Row `slot` of one of the handle's row arrays. */
static inline char *gvq_ps_row(const struct gvqPs *ps, char *rows, uint64_t slot) {
    return rows + slot * ps->row_bytes;
}

/* gvqPsCreate; with blank the rows are left unset (zero, untouched) for the caller to write
 * before any other call (gvqPsRecover), and WARNs name gvqPsRecover. pre: the caller's own
 * verdict on its call (gvqSuccess, or the error its checks gave, already WARNed): a rank that
 * refused still takes part in the agreement when comm is usable, so every rank returns at once
 * (its own error; gvqRemoteError on the others). */
gvqResult_t gvq_ps_create(gvqComm_t comm, size_t rows, size_t dim, gvqDataType_t datatype,
                          const gvqPsConfig_t *config, int blank, gvqResult_t pre, gvqPs_t *out);

/* Whether ps is a live parameter server (never dereferences a destroyed one). */
int gvq_ps_live(gvqPs_t ps);
/* Whether ps is a parameter server not yet destroyed, live or orphaned (its communicator gone:
 * gvqPsRecover still reads its commit). */
int gvq_ps_known(gvqPs_t ps);

/* The checks of push and pull that do not depend on the rows: a live handle (gvqInvalidArgument)
 * outside a group (gvqInvalidUsage), with a WARN naming fn. */
gvqResult_t gvq_ps_check_call(gvqPs_t ps, const char *fn);

/* The rows a caller gave (n indices and their rows `vals`, called vname in the WARN): 1 when
 * refused (NULL with n > 0, an index outside [0, rows)), with a WARN naming fn; else 0. */
int gvq_ps_refuse_rows(gvqPs_t ps, const char *fn, const int64_t *idx, const void *vals,
                       const char *vname, size_t n);

/* A block of indices received by a shard: in range, strictly ascending and (with owner_check)
 * held by this rank. Returns the first bad position, or n. */
size_t gvq_ps_check_block(gvqPs_t ps, const int64_t *idx, size_t n, int owner_check);

/* Add n rows (indices held here, `vals` n rows) to the pending sums of their slots: the first
 * sum of a slot is a copy, later ones add (ps_shard.c, as are gvq_ps_check_block and the next). */
gvqResult_t gvq_ps_add_pending(gvqPs_t ps, const int64_t *idx, const char *vals, size_t n);
/* The rule on every pending slot, gradients scaled by gscale; the sums are then cleared. */
void gvq_ps_apply_pending(gvqPs_t ps, double gscale);

/* qsort's order of int64 indices, and the position of v in the ascending sorted[0..n) (or where
 * it would go) (ps_shard.c). */
int gvq_ps_i64_cmp(const void *a, const void *b);
size_t gvq_ps_find_sorted(const int64_t *sorted, size_t n, int64_t v);

/* ---- the served mode (ps_serve.c) ------------------------------------------------------------
 * start: at the end of gvqPsCreate (collective: it splits off the handle's own communicator).
 * stop: at destroy (waits, bounded by the timeout, for every rank's destroy; the caller holds the
 * communicator meanwhile) or when the communicator goes first (orphaned: at once); once. The
 * calls run inside the communicator (gvq_comm_enter), on the caller's thread or its stream. */
gvqResult_t gvq_ps_serve_start(gvqPs_t ps, const char *fn);
void gvq_ps_serve_stop(gvqPs_t ps, int orphaned);
gvqResult_t gvq_ps_serve_push(gvqPs_t ps, const int64_t *idx, const void *grads, size_t n);
gvqResult_t gvq_ps_serve_apply(gvqPs_t ps);
gvqResult_t gvq_ps_serve_pull(gvqPs_t ps, const int64_t *idx, void *values, size_t n);
/* The state calls (save, load, stats): hold the handle's communicator (so that its destroy or
 * abort, which stops the thread, waits) and lock the served state against the thread. */
typedef struct {
    gvqComm_t comm;
    gvq_ps_srv_t *srv;
} gvq_ps_pin_t;
gvqResult_t gvq_ps_pin(gvqPs_t ps, const char *fn, gvq_ps_pin_t *pin);
void gvq_ps_unpin(gvq_ps_pin_t *pin);

#endif /* GVQ_PS_H_ */
