/*
 * gvq_transport.h -- the transport ops table: how bytes move between the ranks of a
 * communicator. Implementations: src/transport/mpi.c (Open MPI), src/transport/ucx.c (UCX's
 * ucp, without MPI), src/transport/inproc.c (ranks as threads of one process, for unit tests). A
 * NCCL transport comes with the CUDA backend.
 *
 * All operations are non-blocking: isend/irecv post a transfer and fill a request; test
 * reports completion. gvq_xport_wait (transport.c) is the one blocking loop, which enforces the
 * communicator's timeout and abort flag. Messages between a pair of ranks with the same tag
 * match in the order posted.
 */
#ifndef GVQ_TRANSPORT_H_
#define GVQ_TRANSPORT_H_

#include "gvq_util.h"

/* Tags separate the traffic of collectives from user point-to-point messages. */
enum {
    GVQ_TAG_P2P = 1,
    GVQ_TAG_COLL = 2,
    GVQ_TAG_SIGNED = 3, /* the call agreement */
    GVQ_TAG_REVOKE = 5  /* a rank's call failed: the others' fail too (revoke, below) */
};

typedef struct {
    uint64_t handle[2]; /* owned by the transport */
    size_t bytes;       /* expected (recv) or sent size; irecv_upto: the received length */
    int peer;
    int active; /* posted and not completed */
} gvq_req_t;

struct gvq_transport;
typedef struct gvq_chan_set gvq_chan_set_t;

typedef struct gvq_transport_ops {
    size_t size; /* sizeof(gvq_transport_ops_t), to catch tables built against another layout */
    const char *name;
    gvqResult_t (*isend)(struct gvq_transport *t, int peer, int tag, const void *buf, size_t bytes,
                         gvq_req_t *req);
    gvqResult_t (*irecv)(struct gvq_transport *t, int peer, int tag, void *buf, size_t bytes,
                         gvq_req_t *req);
    /* Optional (NULL: not offered): like irecv, but the message may be shorter than `bytes`;
     * at completion req->bytes holds its length. A longer one fails as irecv's would. The
     * signed exchange of recursive.c needs it (a mismatched peer's message is still read). */
    gvqResult_t (*irecv_upto)(struct gvq_transport *t, int peer, int tag, void *buf, size_t bytes,
                              gvq_req_t *req);
    /* *done = 1 when complete (the request is then inactive). A receive whose message is not
     * `bytes` long (irecv_upto: longer than `bytes`) completes with gvqRemoteError. */
    gvqResult_t (*test)(struct gvq_transport *t, gvq_req_t *req, int *done);
    /* Optional (NULL: nothing to do): let transfers still in the transport's hands move on while
     * the caller waits for something else (shared memory, src/algorithms/shm_collectives.c). MPI
     * needs its progress engine driven: a rendezvous send of the peer's completes only once this
     * rank acknowledges its receive. */
    void (*progress)(struct gvq_transport *t);
    /* Give up on a request that will not complete (after a timeout or an abort). */
    void (*cancel)(struct gvq_transport *t, gvq_req_t *req);
    void (*destroy)(struct gvq_transport *t);
    /* Optional native collective (the sparse allgatherv's alternative to gvq's ring): blocks
     * holds nranks blocks, block p at byte offset displ[p] with blen[p] bytes, this rank's in
     * place; req completes when every block is in place on this rank. The arrays are read during
     * the call only. Transports without one point at gvq_xport_iallgatherv_unsupported. */
    gvqResult_t (*iallgatherv)(struct gvq_transport *t, void *blocks, const size_t *displ,
                               const size_t *blen, gvq_req_t *req);
    /* Optional (NULL: not offered): revoke tells every peer, once, that a call of this rank
     * failed (a peer gone, a timeout), so that a peer waiting on a third rank that waits on this
     * one does not sit out its timeout (MPI ULFM's revoke); the notice carries the error that
     * broke this rank's transport (t->broken). revoked gives the rank whose notice came, or -1,
     * and its error in *cause. gvq_xport_waitall sends it when a wait fails and answers it at
     * its idle turns (gvq_xport_idle gives the notice's error). */
    void (*revoke)(struct gvq_transport *t);
    int (*revoked)(struct gvq_transport *t, gvqResult_t *cause);
    /* Optional (NULL: the waiter sleeps GVQ_PROGRESS_SLEEP_US instead): sleep in the kernel until
     * the transport has something to progress or max_ns pass, whichever is first; returns at
     * once when events are already waiting (UCX: the worker's event fd). GVQ_WAIT=block/auto. */
    void (*block)(struct gvq_transport *t, uint64_t max_ns);
} gvq_transport_ops_t;

typedef struct gvq_transport {
    const gvq_transport_ops_t *ops;
    int rank;
    int nranks;
    uint64_t timeout_ns;      /* 0: wait forever */
    int *abort_flag;          /* read atomically; set by gvqCommAbort */
    gvqResult_t *broken;      /* the error that broke the communicator, gvqSuccess while healthy;
                               * atomic: gvq_broken_get / gvq_broken_set */
    int cancel_keeps_buffers; /* a cancelled send may still read its buffer later (MPI) */
    /* The transport runs its transfers in issue order on one queue: a transfer does not start
     * before every earlier one has finished (NCCL sends and receives on one stream). A receive
     * posted ahead of the sends its peer can only make after a receive behind it would block
     * the queue, so algorithms post each receive with the send of the same step (ring.c). */
    int fifo;
    /* Calls on different threads may use the transport at once (MPI_THREAD_MULTIPLE; the
     * in-process transport): needed by host streams, whose progress threads run calls beside
     * the caller's thread. */
    int concurrent;
    /* Library memory that outlives a failure (the communicator's scratch, kept when the
     * communicator broke): *own_mem, *own_mem_bytes long (NULL: none). A transport that copies
     * sends out of the caller's memory (MPI) sends from here without a copy. */
    void *const *own_mem;
    /* The transport copies a send out of the caller's memory, one pass over its bytes, unless it
     * lies in own_mem (MPI with GVQ_SEND_COPY=1): algorithms that forward received data then
     * prefer to send from scratch (direct.c). Part of the algorithm choice (select.c). */
    int stages_sends;
    /* Every rank of the communicator runs on one host (set at creation: MPI_COMM_TYPE_SHARED
     * for gvqCommInitMPI, the bootstrap's host keys for gvqCommInitRank; the in-process
     * transport always): transfers are memory copies, so a copy more costs as much as a
     * transfer; across hosts the network bounds a call and a staging copy hides behind it.
     * The same on every rank (a rank that differs fails the signature agreement). */
    int one_host;
    const size_t *own_mem_bytes;
    void *impl;
} gvq_transport_t;

/* The broken state (gvq_transport_t.broken, the communicator's) is shared between a call and
 * gvqCommAbort or gvqCommGetAsyncError on other threads: read it and set it only through these
 * (atomic; the first error wins). A NULL pointer reads as healthy. */
static inline gvqResult_t gvq_broken_get(const gvqResult_t *broken) {
    return broken != NULL ? __atomic_load_n(broken, __ATOMIC_ACQUIRE) : gvqSuccess;
}
static inline void gvq_broken_set(gvqResult_t *broken, gvqResult_t res) {
    gvqResult_t healthy = gvqSuccess;
    if (broken != NULL && res != gvqSuccess)
        __atomic_compare_exchange_n(broken, &healthy, res, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* Wait for `n` requests (inactive ones are skipped). On timeout or abort the unfinished
 * requests are cancelled, the communicator marked broken and the error returned with a WARN
 * naming the peer and what was pending. */
gvqResult_t gvq_xport_waitall(gvq_transport_t *t, gvq_req_t *reqs, int n, const char *what);
/* The same for requests of several transports, ts[i] that of reqs[i] (a group's transfers on
 * several communicators): every one moves while any is waited for. A failed transfer breaks its
 * own transport; a timeout or abort every transport with a transfer pending. */
gvqResult_t gvq_xport_waitall_many(gvq_transport_t *const *ts, gvq_req_t *reqs, int n,
                                   const char *what);
/* One idle turn of a wait whose polls found nothing (after GVQ_SPIN_BEFORE_YIELD of them):
 * gvqInvalidUsage after gvqCommAbort; once a peer revoked the transport, the error its call
 * failed with (gvqTimeout, gvqRemoteError; a WARN names the peer, and the communicator is then
 * broken with it); else leaves the core a moment and gives gvqTimeout once the timeout has passed
 * since *start (0: the first idle turn, which sets it). No WARN: the caller says what it waited
 * for. How the core is left (GVQ_WAIT): a host stream's progress thread sleeps
 * GVQ_PROGRESS_SLEEP_US while its caller computes; other waits yield, and once GVQ_SPIN_US have
 * passed without progress in block mode (auto: while a yield recently showed another thread
 * wanting this core) they sleep GVQ_PROGRESS_SLEEP_US at a time here (what is waited for may
 * not be the transport's: shared memory); gvq_xport_waitall sleeps in the transport's block op. */
gvqResult_t gvq_xport_idle(gvq_transport_t *t, uint64_t *start);
/* The same, and *slept = 1 when the turn slept: the waiter then polls once before the next turn
 * instead of GVQ_SPIN_BEFORE_YIELD times (a sleeping wait costs next to no CPU). */
gvqResult_t gvq_xport_idle_slept(gvq_transport_t *t, uint64_t *start, int *slept);
static inline gvqResult_t gvq_xport_wait(gvq_transport_t *t, gvq_req_t *req, const char *what) {
    return gvq_xport_waitall(t, req, 1, what);
}
/* The shared stub of transports without a native allgatherv: gvqInvalidUsage with a WARN. */
gvqResult_t gvq_xport_iallgatherv_unsupported(struct gvq_transport *t, void *blocks,
                                              const size_t *displ, const size_t *blen,
                                              gvq_req_t *req);

/* Cancel every active request of the array (error paths). */
void gvq_xport_cancelall(gvq_transport_t *t, gvq_req_t *reqs, int n);

/* ---- shared-memory channels (shm_chan.c) ----------------------------------------------------
 * Memory of gvq_chan_bytes(nranks) that every rank maps, zeroed when made; per ordered pair of
 * ranks a ring of about GVQ_CHAN_DEPTH x gvq_chan_chunk(nranks) bytes (chunks of 128 KiB up to
 * 4 ranks, 32 KiB beyond: about 8 MiB in all at 4 and at 8 ranks) holding records of any size
 * up to a chunk. Requests as the transports' (test until done; a message of another length than
 * its receive fails it with gvqRemoteError); a cancelled transfer that had started marks its
 * pair broken. */
enum { GVQ_CHAN_DEPTH = 4 };
static inline size_t gvq_chan_chunk(int nranks) {
    return nranks <= 4 ? (size_t)128 << 10 : (size_t)32 << 10;
}
size_t gvq_chan_bytes(int nranks);
gvq_chan_set_t *gvq_chan_attach(void *mem, int nranks, int rank);
void gvq_chan_detach(gvq_chan_set_t *s);
gvqResult_t gvq_chan_isend(gvq_chan_set_t *s, int peer, const void *buf, size_t bytes,
                           gvq_req_t *req);
gvqResult_t gvq_chan_irecv(gvq_chan_set_t *s, int peer, void *buf, size_t bytes, gvq_req_t *req);
int gvq_chan_owns(const gvq_req_t *req);
gvqResult_t gvq_chan_test(gvq_chan_set_t *s, gvq_req_t *req, int *done);
void gvq_chan_cancel(gvq_chan_set_t *s, gvq_req_t *req);
/* Marks every channel of this rank closed (gvqCommDestroy): the peers' later transfers with it
 * fail at once; what it wrote before is still received. */
void gvq_chan_close(gvq_chan_set_t *s);
/* The channels in mem as a transport of their own (gvqSend/gvqRecv's when every rank maps
 * them), with base's rank, timeout, abort flag and broken state; NULL when out of memory. Its
 * destroy closes the channels (as gvq_chan_close) and detaches them. */
gvq_transport_t *gvq_chan_transport(void *mem, const gvq_transport_t *base);

/* Transports built into the library. */
gvqResult_t gvq_inproc_world_create(int nranks, void **world);
void gvq_inproc_world_destroy(void *world);
gvqResult_t gvq_inproc_transport_create(void *world, int rank, gvq_transport_t **t);

/* The MPI transport (mpi.c). */
gvqResult_t gvq_mpi_ensure_init(int *world_rank, int *world_size);
/* The communicator's MPI side, made with MPI_Comm_create_group by the members only; with
 * MPI_THREAD_MULTIPLE bounded by timeout_ns (gvqTimeout past it). The untimed form uses
 * GVQ_TIMEOUT_MS. */
gvqResult_t gvq_mpi_transport_from_world(const int *world_ranks, int nranks, int rank, int tag,
                                         gvq_transport_t **t);
gvqResult_t gvq_mpi_transport_from_world_timed(const int *world_ranks, int nranks, int rank,
                                               int tag, uint64_t timeout_ns, gvq_transport_t **t);
/* A transport on a duplicate of *(MPI_Comm *)mpi_comm (collective over that communicator). */
gvqResult_t gvq_mpi_transport_dup(const void *mpi_comm, gvq_transport_t **t);
/* The MPI transport of the parent ranks ranks[0..n) of an MPI transport, this rank being
 * ranks[rank] (collective over those members only; bounded by the parent's timeout). */
gvqResult_t gvq_mpi_transport_subset(const gvq_transport_t *parent, const int *ranks, int n,
                                     int rank, int tag, gvq_transport_t **t);
/* Whether this process is part of an MPI job: MPI is initialized, or a launcher's environment
 * (Open MPI's OMPI_COMM_WORLD_SIZE, PMIx's PMIX_RANK, MPICH's PMI_RANK) says so. Calls no MPI
 * function that needs MPI initialized. */
int gvq_mpi_in_job(void);

/* The UCX transport (ucx.c; GVQ_WITH_UCX, else these refuse with a WARN). open makes the worker
 * of one communicator and gives its address (valid until close or the transport's destroy);
 * transport_create makes the endpoints from every rank's address (addrs: nranks addresses, rank
 * r's lens[r] bytes, in rank order) and takes u over; on failure u is still the caller's to
 * close. */
typedef struct gvq_ucx gvq_ucx_t;
int gvq_ucx_available(void);
gvqResult_t gvq_ucx_open(gvq_ucx_t **u, const void **addr, size_t *addr_len);
gvqResult_t gvq_ucx_transport_create(gvq_ucx_t *u, const uint8_t *addrs, const int32_t *lens,
                                     int nranks, int rank, gvq_transport_t **t);
void gvq_ucx_close(gvq_ucx_t *u);
/* The spare worker of a UCX transport t, for gvqCommShrink (a broken communicator's own worker
 * is never progressed again). spare_open opens it (once) and gives its address; spare_peers
 * keeps a copy of every rank's spare address (packed as transport_create's); spare_transport
 * gives the transport on the spare with endpoints to the ranks with reach[p] != 0 (the others,
 * and any whose endpoint cannot be made, count as failed peers), made on the first call and kept
 * by t for the next; spare_take turns that one into the transport of the m ranks ranks[] (this
 * one at me) and hands it to the caller: t has no spare after it. Other transports:
 * gvqInvalidUsage. */
gvqResult_t gvq_ucx_spare_open(gvq_transport_t *t, const void **addr, size_t *len);
gvqResult_t gvq_ucx_spare_peers(gvq_transport_t *t, const uint8_t *addrs, const int32_t *lens);
gvqResult_t gvq_ucx_spare_transport(gvq_transport_t *t, const uint8_t *reach,
                                    gvq_transport_t **out);
gvqResult_t gvq_ucx_spare_take(gvq_transport_t *t, const int *ranks, int m, int me,
                               gvq_transport_t **out);

#endif /* GVQ_TRANSPORT_H_ */
