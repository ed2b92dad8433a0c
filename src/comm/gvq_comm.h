/*
 * gvq_comm.h -- the communicator and the internal entry points between src/ files.
 */
#ifndef GVQ_COMM_H_
#define GVQ_COMM_H_

#include "gvq_algo.h"
#include "gvq_devices.h"

#define GVQ_COMM_MAGIC 0x67767143u /* 'gvqC' */

struct gvqComm {
    uint32_t magic;
    int rank;
    int nranks;
    gvq_transport_t *xport;
    /* gvqSend/gvqRecv's transport: the one-host shared-memory channels when every rank maps
     * them (gvq_chan_transport, made with the segment), else xport */
    gvq_transport_t *p2p;
    const gvq_device_ops_t *dev;
    int abort_flag;     /* atomic; set by gvqCommAbort */
    int inflight;       /* atomic; calls in progress on this communicator */
    gvqResult_t broken; /* first transport error; gvqSuccess while healthy */
    size_t chunk_bytes;
    void *scratch;
    size_t scratch_bytes;
    void *owned_world; /* in-process world owned by this communicator, freed by the last rank */
    int ntensors;      /* compressors created so far: spreads the fits over the ranks */
    struct gvq_comm_attachment *attached; /* state of layers above (gvq_comm_attach) */
    uint64_t *host_keys;                  /* every rank's gvq_host_key (NULL: not exchanged yet) */
    int *ring_order;     /* the allreduce ring's order by host (gvq_comm_hosts sets it; NULL: rank
                          * order, also when the hosts' ranks are already consecutive) */
    gvq_hier_t *hier;    /* hosts of K >= 2 ranks each, H >= 2 (gvq_comm_hosts sets it; NULL: not
                          * that shape, or not known yet) */
    gvqComm_t host_comm; /* this rank's host's ranks (gvq_comm_hier_local), whose shared-memory
                          * channels carry the hierarchy's stages inside the host; or NULL */
    uint32_t shrinks;    /* gvqCommShrink calls so far on this rank (shrink.c): tags each one's */
    int ps_serial;       /* served parameter servers made on it (ps_serve.c): their tags */
    uint64_t calls;  /* collective calls agreed on so far (signature.c): the next call's number */
    uint64_t serial; /* unique among the communicators of this process (handles outlive comms) */
    /* Host streams (stream.c), atomic: tickets handed to queued calls so far, calls of those
     * finished, and the result of the last one that finished. */
    uint64_t stream_issued;
    uint64_t stream_done;
    gvqResult_t stream_error;
    /* CUDA buffers (comm_nccl.c): a NCCL communicator made on the first collective on CUDA
     * buffers (gvq_nccl_t, builds with GVQ_WITH_NCCL); nccl_state 0: not tried yet, 1: ready,
     * -1: unavailable, CUDA buffers are staged through host memory */
    void *nccl;
    int nccl_state;
    /* A transport that moves memory of device dxport_dev (the NCCL transport over `nccl`, made
     * on the first device-resident compressed call; tests attach a simulated one), and the
     * scratch of rings run over it, on that device. dxport_state 0: not tried, 1: ready,
     * -1: unavailable (device rings stage their wire through host memory over xport). */
    gvq_transport_t *dxport;
    const gvq_device_ops_t *dxport_dev;
    int dxport_state;
    void *dscratch;
    size_t dscratch_bytes;
    gvq_pinned_t pinned; /* host memory of staged calls on device buffers (gvq_device_staged) */
    /* The wire slots of device-resident rings whose wire is staged over xport: pinned memory of
     * the device pinned_ops_for (pinned_ops: the host device, allocating through its
     * host_alloc), so the wire's copies to and from the device run at full speed. */
    gvq_device_ops_t pinned_ops;
    const gvq_device_ops_t *pinned_ops_for;
    void *pscratch;
    size_t pscratch_bytes;
    /* Shared memory of ranks on one host (shm.c), made at creation or at the first collective:
     * shm_state 0 not tried, 1 mapped (shm_bytes long), -1 unavailable (messages only) */
    gvq_shm_t shm;
    int shm_state;
    size_t shm_bytes;
    int shm_channels; /* made at creation (gvq_comm_shm_at_init): with point-to-point channels */
};

/* The host device allocating dev's pinned memory (comm->pinned_ops), for a ring's host scratch
 * whose contents go to and from dev. */
const gvq_device_ops_t *gvq_comm_pinned_host(gvqComm_t comm, const gvq_device_ops_t *dev);

/* The device transport for device-resident rings on dev's memory, or NULL (then the wire is
 * staged over comm->xport). Collective the first time (all ranks agree on the outcome). The
 * caller has entered the communicator. (comm_nccl.c) */
gvq_transport_t *gvq_comm_device_transport(gvqComm_t comm, const gvq_device_ops_t *dev);
/* Adopt t (a transport of dev's memory) as comm's device transport: it takes comm's timeout,
 * abort flag and broken state, and is destroyed with comm. */
void gvq_comm_adopt_device_transport(gvqComm_t comm, gvq_transport_t *t,
                                     const gvq_device_ops_t *dev);

/* comm's shared memory (shm.c), made the first time: collective then, as every collective's
 * first step (all ranks of one host, GVQ_SHM=1 on every rank, the segment made and opened
 * everywhere; else none, the same on every rank). *shm is NULL without it. The caller has
 * entered the communicator. */
gvqResult_t gvq_comm_shm(gvqComm_t comm, gvq_shm_t **shm);
/* The same at creation, by the init calls whose ranks are separate processes calling at once
 * (gvqCommInitRank, gvqCommInitMPI); the segment then also holds point-to-point channels up to
 * 8 ranks (comm->p2p, their transport: gvqSend/gvqRecv through shared memory). Not for the
 * in-process transport, whose ranks one thread creates one after another: its segment comes at
 * the first collective, without channels, so that every rank of a pair agrees on the path of
 * every message. On failure the caller destroys the communicator. */
gvqResult_t gvq_comm_shm_at_init(gvqComm_t comm);

/* The collective context of comm's own transport, device and scratch; `sent` (may be NULL)
 * adds up the bytes the ring sends. */
static inline gvq_coll_ctx_t gvq_comm_ctx(gvqComm_t c, unsigned long long *sent) {
    return (gvq_coll_ctx_t){.xport = c->xport,
                            .dev = c->dev,
                            .chunk_bytes = c->chunk_bytes,
                            .scratch = &c->scratch,
                            .scratch_bytes = &c->scratch_bytes,
                            .bytes_sent = sent,
                            .ring_order = c->ring_order,
                            .hier = c->hier};
}

/* State that a layer above the communicator keeps per communicator (zero-code mode's
 * compressors), found again by its key and handed to detach when the communicator is
 * destroyed or aborted (newest first). The communicator does not know what it holds. */
typedef void (*gvq_comm_detach_fn)(void *state);
gvqResult_t gvq_comm_attach(gvqComm_t comm, const void *key, void *state,
                            gvq_comm_detach_fn detach);
void *gvq_comm_attached(gvqComm_t comm, const void *key);

/* The hosts of comm's ranks (gvq_host_key; exchanged on first use unless the bootstrap brought
 * them, so collective then): how many, this rank's leader (the lowest rank on its host), and
 * same_host[p] (may be NULL) whether rank p shares this rank's host. The caller has entered. */
gvqResult_t gvq_comm_hosts(gvqComm_t comm, int *nhosts, int *leader, uint8_t *same_host);

/* At init, on a communicator with the hierarchy's shape over MPI or UCX: a communicator of this
 * rank's host (gvqCommSplit by host, collective), whose shared-memory channels then carry the
 * hierarchy's stages inside the host (gvq_hier_t.local_xport). Destroyed and aborted with comm.
 * Nothing to do (gvqSuccess) for other shapes and transports, or with GVQ_HIER_LOCAL=0. */
gvqResult_t gvq_comm_hier_local(gvqComm_t comm);

/* At creation of a UCX communicator (collective): its spare worker opened and every rank's spare
 * address kept by the transport, for gvqCommShrink (gvq_ucx_spare_*). Nothing to do on other
 * transports or with GVQ_UCX_SPARE=0. (split.c) */
gvqResult_t gvq_comm_ucx_spare(gvqComm_t comm);
/* The last steps of a communicator made from the parent's ranks ranks[0..m) (split, shrink):
 * their host keys, the shared memory at init, the spare worker when `spare`. Collective on the
 * child; on failure the caller destroys it. (split.c) */
gvqResult_t gvq_comm_child_finish(gvqComm_t parent, const int *ranks, int m, gvqComm_t child,
                                  int spare);

/* Whether a compressed allreduce on comm takes the hierarchical algorithm (gvq_hier_allreduce,
 * compressed between the hosts only): the hosts have its shape and GVQ_ALGO names hier for
 * allreduce. Not by default: its stages inside a host carry uncompressed floats; on the
 * emulated cluster it led at 2 hosts x 2 ranks (1.06-1.64x) and lost at 4 x 2, where 8 ranks
 * share 2 cores (0.46-0.67x; perf/RESULTS.md section 14b). */
int gvq_comm_hier_compressed(gvqComm_t comm);

/* Resolve a config (NULL: defaults) into timeout and chunk size; refuses a bad header. */
gvqResult_t gvq_config_resolve(const gvqConfig_t *config, const char *caller, int64_t *timeout_ms,
                               size_t *chunk_bytes);

/* Wrap a transport into a communicator and register it as live. Takes ownership of xport, also
 * on failure. */
gvqResult_t gvq_comm_create(gvq_transport_t *xport, const gvqConfig_t *config, const char *caller,
                            gvqComm_t *out);

/* Check that comm is a live communicator, for argument checks (never dereferences a dangling
 * pointer). */
int gvq_comm_is_live(gvqComm_t comm);
/* Whether comm is live and still the communicator numbered serial (comm->serial when a handle
 * was made on it): false once it was destroyed or aborted, even if a new communicator has
 * since been allocated at the same address. */
int gvq_comm_is_serial(gvqComm_t comm, uint64_t serial);
/* Whether comm was aborted (and not reused since): its calls are refused with gvqInvalidUsage. */
int gvq_comm_was_aborted(gvqComm_t comm);
/* The refusal of a comm that is not live, with its WARN naming fn: gvqInvalidUsage when it was
 * aborted (the README's promise), gvqInvalidArgument otherwise (NULL, destroyed, never made). */
gvqResult_t gvq_comm_refuse_dead(gvqComm_t comm, const char *fn);
/* Forget the attachment of key (its owner is gone first); no-op when there is none. */
void gvq_comm_detach(gvqComm_t comm, const void *key);

/* Enter a call on comm (it must be live, not aborted, not broken) and leave it. A communicator
 * is freed only when no call is inside. */
gvqResult_t gvq_comm_enter(gvqComm_t comm, const char *fn);
void gvq_comm_leave(gvqComm_t comm);
/* Hold comm as a call does (a destroy or abort from another thread waits until
 * gvq_comm_leave), whether it is broken or not: 1 when it is live, else 0 (nothing held). For
 * state of a layer above that the communicator's destroy would otherwise free under it. */
int gvq_comm_hold(gvqComm_t comm);

/* ---- call signatures (signature.c) ---------------------------------------------------------
 * Every collective call agrees on its signature with the other ranks before any data moves
 * (gvq_agree_extremes: about log2 N small messages; a small allreduce's data rides along with
 * them, written out only once all agree), so that a call whose arguments differ
 * between ranks fails on every rank with a WARN naming both sides, never pairs with another
 * rank's different call and never leaves a message for the next call. */
typedef enum {
    GVQ_SIG_ALLREDUCE,
    GVQ_SIG_BROADCAST,
    GVQ_SIG_REDUCE,
    GVQ_SIG_REDUCE_SCATTER,
    GVQ_SIG_ALLGATHER,
    GVQ_SIG_COMPRESSED /* gvqAllReduceCompressed; identity: gvq_compressor_identity */
} gvq_sig_kind_t;

typedef struct {
    gvq_sig_kind_t kind;
    size_t count;
    int dtype;           /* -1: none */
    int op;              /* -1: none (broadcast, allgather) */
    int root;            /* -1: none (all but broadcast and reduce) */
    uint64_t identity;   /* what else defines the call (a compressor's config); 0: nothing */
    int algo;            /* the plain collective's algorithm (gvq_algo_t, GVQ_ALGO); -1: none */
    int device;          /* the buffers are a device's (CUDA), 0: host memory */
    gvqResult_t refused; /* this rank's own refusal of its arguments, gvqSuccess if none */
} gvq_call_sig_t;

/* Agree on sig with every rank (the caller has entered comm; no-op on one rank). Returns
 * gvqSuccess when every rank passed the same signature. Otherwise, on every rank, a WARN naming
 * fn, the two ranks and both calls, and: sig->refused on a rank that refused its own call;
 * gvqInvalidArgument when the ranks' arguments differ (the communicator stays usable, no data
 * moved); gvqInvalidUsage when the ranks are out of step (different call numbers: one rank
 * skipped a call), which also breaks the communicator. */
gvqResult_t gvq_call_agree(gvqComm_t comm, const char *fn, const gvq_call_sig_t *sig);
/* gvq_call_agree with a small collective riding along (gvq_rd_signed or shared memory's
 * gvq_shm_signed: collectives.c's rides_along decides, on host buffers, on more than one rank,
 * over a transport with irecv_upto): on gvqSuccess pay->dst holds the result; on any other
 * result it was not written. pay NULL: gvq_call_agree. */
gvqResult_t gvq_call_agree_allreduce(gvqComm_t comm, const char *fn, const gvq_call_sig_t *sig,
                                     const gvq_signed_payload_t *pay);
/* A compressor's identity for its call signature: a hash of its config and creation order
 * (compressor.c), the same on every rank for the same tensor's compressor. */
uint64_t gvq_compressor_identity(gvqCompressor_t c);

/* Whether the calling thread is inside gvqGroupStart/gvqGroupEnd (group.c). */
int gvq_group_active(void);
/* comm is live (WARN naming fn otherwise), and with no_group: not inside a group. */
gvqResult_t gvq_comm_check(gvqComm_t comm, const char *fn, int no_group);
/* whether gvqCommSplit can split comm (its transport makes new communicators: mpi, ucx) */
int gvq_comm_can_split(gvqComm_t comm);
/* Whether comm's transport runs calls from several threads at once (xport->concurrent), and
 * its idle check (gvq_xport_idle: an abort or a timeout while waiting on something else). */
int gvq_comm_concurrent(gvqComm_t comm);
gvqResult_t gvq_comm_idle(gvqComm_t comm, uint64_t *since);

/* In-process communicators for unit tests: comms[r] for r < nranks, ranks as threads. */
gvqResult_t gvq_comm_init_inproc(int nranks, const gvqConfig_t *config, gvqComm_t *comms);
/* For tests of host-shaped algorithms on in-process ranks: comm's ranks are on the hosts named
 * by keys[0..nranks) (copied), as if the bootstrap had brought them; ring order and hierarchy
 * follow. Before comm's first collective, the same keys on every rank. */
gvqResult_t gvq_comm_pretend_hosts(gvqComm_t comm, const uint64_t *keys);

/* Bootstrap (bootstrap.c): exchange (rank -> world rank, host, blob) through the root named in
 * id. mine->blob_bytes bytes at blob go with this rank's entry; with blobs != NULL, *blobs gets
 * every rank's blob in rank order, concatenated (malloc'd; NULL when all are empty), rank r's
 * all[r].blob_bytes long. */
#define GVQ_BOOT_MAX_BLOB 16384 /* the most bytes of one rank's blob */
typedef struct {
    int32_t world_rank;
    int32_t world_size;
    int32_t pid;
    int32_t blob_bytes; /* the length of the rank's blob (0..GVQ_BOOT_MAX_BLOB): what its
                         * transport needs the others to know (UCX: its worker address) */
    uint64_t host_key;  /* gvq_host_key */
} gvq_peer_info_t;
gvqResult_t gvq_bootstrap_exchange(const gvqUniqueId *id, int nranks, int rank,
                                   const gvq_peer_info_t *mine, uint64_t timeout_ns,
                                   const void *blob, gvq_peer_info_t *all, uint8_t **blobs,
                                   uint64_t *nonce);
int gvq_bootstrap_id_valid(const gvqUniqueId *id);

#endif /* GVQ_COMM_H_ */
