/*
 * gvq.h -- the public API of gvq, gradient aggregation for data-parallel training.
 *
 * gvq mirrors NCCL: a program written against nccl.h ports by renaming `nccl` to `gvq`
 * (ncclAllReduce -> gvqAllReduce, ncclFloat32 -> gvqFloat32, ...). The same argument orders,
 * in-place rules and bootstrap (rank 0 calls gvqGetUniqueId, the program broadcasts the id,
 * every rank calls gvqCommInitRank) apply.
 *
 * Host buffers travel over Open MPI. A call on host buffers returns when its result is in
 * recvbuff, unless it is given a host stream (gvqStreamCreate): then it is checked, queued and
 * returns at once, and the stream's progress thread runs it (see "Host streams" below). A
 * stream argument that is not a host stream (NULL, a cudaStream_t) is ignored for host buffers.
 *
 * Every call returns a gvqResult_t. Outputs come last and are written only on success. The
 * function that detects an error logs a WARN line naming what was wrong (see GVQ_DEBUG) and
 * gvqGetLastError returns that line.
 *
 * C99. Thread-safety: calls on different communicators may come from different threads; calls
 * on one communicator must be serialized by the caller, except gvqCommAbort, which may be called
 * from any thread to unblock a call in progress.
 */
#ifndef GVQ_H_
#define GVQ_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define GVQ_API
#elif defined(GVQ_BUILDING_LIBRARY)
#define GVQ_API __attribute__((visibility("default")))
#else
#define GVQ_API
#endif

#define GVQ_MAJOR 0
#define GVQ_MINOR 1
#define GVQ_PATCH 0
#define GVQ_VERSION_CODE(X, Y, Z) ((X)*10000 + (Y)*100 + (Z))
#define GVQ_VERSION GVQ_VERSION_CODE(GVQ_MAJOR, GVQ_MINOR, GVQ_PATCH)

/* Result codes. The numbering follows NCCL's where the two share a name. */
/* clang-format off */
typedef enum {
    gvqSuccess            = 0,
    gvqUnhandledCudaError = 1,
    gvqSystemError        = 2,
    gvqInternalError      = 3,
    gvqInvalidArgument    = 4,
    gvqInvalidUsage       = 5,
    gvqRemoteError        = 6,
    gvqInProgress         = 7,
    gvqTimeout            = 8,
    gvqNumResults         = 9
} gvqResult_t;
/* clang-format on */

/* Element types. gvqFloat16 is IEEE binary16, gvqBfloat16 is bfloat16; both reduce in fp32. */
/* clang-format off */
typedef enum {
    gvqInt8     = 0, gvqChar = 0,
    gvqUint8    = 1,
    gvqInt32    = 2, gvqInt = 2,
    gvqUint32   = 3,
    gvqInt64    = 4,
    gvqUint64   = 5,
    gvqFloat16  = 6, gvqHalf = 6,
    gvqFloat32  = 7, gvqFloat = 7,
    gvqFloat64  = 8, gvqDouble = 8,
    gvqBfloat16 = 9,
    gvqNumTypes = 10
} gvqDataType_t;
/* clang-format on */

/* Reductions. gvqAvg sums, then divides once by the number of ranks at the end (integer types
 * divide with C's truncation). */
/* clang-format off */
typedef enum {
    gvqSum    = 0,
    gvqProd   = 1,
    gvqMax    = 2,
    gvqMin    = 3,
    gvqAvg    = 4,
    gvqNumOps = 5
} gvqRedOp_t;
/* clang-format on */

#define GVQ_UNIQUE_ID_BYTES 128
/* Opaque bootstrap handle made by gvqGetUniqueId on one rank and handed to the others. */
typedef struct {
    char internal[GVQ_UNIQUE_ID_BYTES];
} gvqUniqueId;

/* Communicator handle. */
typedef struct gvqComm *gvqComm_t;

/* A cudaStream_t for device buffers, a host stream (gvqStreamCreate) for host buffers, or NULL. */
typedef void *gvqStream_t;

#define GVQ_CONFIG_MAGIC 0x67767163u /* 'gvqc' */
#define GVQ_CONFIG_UNDEF_INT INT32_MIN

/* Versioned communicator configuration. Fill it with GVQ_CONFIG_INITIALIZER and set only the
 * fields you need; a field left at GVQ_CONFIG_UNDEF_INT takes its value from the environment
 * (GVQ_TIMEOUT_MS, ...) or its default. New fields are only ever appended. */
typedef struct {
    size_t size;          /* sizeof(gvqConfig_t) as the caller compiled it */
    unsigned int magic;   /* GVQ_CONFIG_MAGIC */
    unsigned int version; /* GVQ_VERSION the caller compiled against */
    int blocking;         /* 1: calls return when done (the only mode of the host backend) */
    int timeoutMs;        /* a transfer that makes no progress this long fails with gvqTimeout;
                             0 waits forever */
    int chunkBytes;       /* ring pipeline chunk size in bytes */
} gvqConfig_t;

#define GVQ_CONFIG_INITIALIZER                                                    \
    {                                                                             \
        sizeof(gvqConfig_t), GVQ_CONFIG_MAGIC, GVQ_VERSION, GVQ_CONFIG_UNDEF_INT, \
            GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT                            \
    }

/* ---------------------------------------------------------------------------------------------
 * Library and errors
 * ------------------------------------------------------------------------------------------ */

/* Writes GVQ_VERSION of the library (not of the header) to *version. Returns gvqInvalidArgument
 * if version is NULL. */
GVQ_API gvqResult_t gvqGetVersion(int *version);

/* Returns a static string describing result code `result` ("invalid argument", ...). Never NULL. */
GVQ_API const char *gvqGetErrorString(gvqResult_t result);

/* Returns the text of the last WARN logged by the calling thread (the facts behind the last
 * error: which argument, which peer, which value), or "" if none. `comm` may be NULL; it is
 * accepted for NCCL compatibility. The string stays valid until the thread's next gvq call. */
GVQ_API const char *gvqGetLastError(gvqComm_t comm);

/* ---------------------------------------------------------------------------------------------
 * Communicators
 * ------------------------------------------------------------------------------------------ */

/* Creates a bootstrap id. Call it on one rank (the root) and pass the bytes to every rank that
 * will call gvqCommInitRank with it, e.g. with MPI_Bcast. The id holds a random 128-bit secret,
 * so keep it among the job's processes like a password: root and ranks prove they hold it by
 * challenge-response and it never travels on the network; a connection without it is dropped
 * with a WARN and never counts as a rank. The calling process listens on a TCP port (interface
 * from GVQ_SOCKET_IFNAME, else the first non-loopback IPv4 interface) on a thread of its own
 * until all ranks have joined or the timeout passes, then releases thread and socket. An id
 * nobody uses is released GVQ_TIMEOUT_MS after this call (the first gvqCommInitRank with it must
 * come within that time); the first rank to join sets the timeout from then on. Each id serves
 * one gvqCommInitRank round.
 * Errors: gvqInvalidArgument (NULL), gvqSystemError (no socket could be opened). */
GVQ_API gvqResult_t gvqGetUniqueId(gvqUniqueId *uniqueId);

/* Creates a communicator of `nranks` ranks in which the caller is `rank`. Blocking and
 * collective: returns once all nranks processes called it with the same id. Its transport is
 * GVQ_TRANSPORT's (the same on every rank):
 * - mpi: the processes must belong to one MPI job (launched together by mpirun); MPI is
 *   initialized with MPI_THREAD_MULTIPLE if the program did not do so (and finalized at exit);
 * - ucx: UCX's ucp (shared memory, TCP, RDMA where present; UCX_TLS and UCX_NET_DEVICES apply),
 *   any processes that reach each other, started by any launcher; no MPI call is made;
 * - auto (default): mpi when the process is in an MPI job (MPI initialized, or mpirun's or a
 *   PMI's environment), else ucx when gvq was built with UCX.
 * Errors: gvqInvalidArgument (NULL comm, nranks < 1, rank outside [0, nranks), an id not made by
 * gvqGetUniqueId), gvqInvalidUsage (ranks disagree on nranks, two ranks claim the same rank,
 * processes not in one MPI job, ranks on different transports, ucx asked of a build without
 * it), gvqTimeout (not every rank joined within the timeout), gvqSystemError. */
GVQ_API gvqResult_t gvqCommInitRank(gvqComm_t *comm, int nranks, gvqUniqueId commId, int rank);

/* As gvqCommInitRank, with a configuration (NULL means all defaults). A config whose size,
 * magic or version is wrong is refused with gvqInvalidArgument. */
GVQ_API gvqResult_t gvqCommInitRankConfig(gvqComm_t *comm, int nranks, gvqUniqueId commId, int rank,
                                          gvqConfig_t *config);

/* Creates a communicator from a launcher's environment, without passing an id by hand:
 * - rank and size: GVQ_RANK/GVQ_WORLD_SIZE, else RANK/WORLD_SIZE (torchrun), else
 *   SLURM_PROCID/SLURM_NTASKS (srun), else OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (mpirun),
 *   else PMI_RANK/PMI_SIZE;
 * - the meeting point: GVQ_STORE (host:port), else MASTER_ADDR and MASTER_PORT (torchrun's).
 * Rank 0 makes the id (gvqGetUniqueId) and serves it on the meeting point's port to the other
 * ranks, which fetch it (retrying until GVQ_TIMEOUT_MS), then all call gvqCommInitRankConfig.
 * The store hands the id to whoever connects and names the job's size, as torch's TCPStore does:
 * keep the port inside the job's network. It closes once every rank has the id, or at the
 * timeout. Errors: those of gvqCommInitRank; gvqInvalidUsage (a variable missing or malformed,
 * with a WARN naming it), gvqTimeout (the store did not answer), gvqSystemError (the port is
 * taken). */
GVQ_API gvqResult_t gvqCommInitFromEnv(gvqComm_t *comm, gvqConfig_t *config);

/* The color of a rank that takes part in gvqCommSplit without joining a new communicator. */
#define GVQ_SPLIT_NOCOLOR (-1)

/* Splits comm as ncclCommSplit does: collective over every rank of comm; the ranks that give the
 * same color (>= 0) form a new communicator, ranked by key and then by their rank in comm; a
 * rank that gives GVQ_SPLIT_NOCOLOR gets *newcomm = NULL. One color on every rank duplicates
 * comm. The new communicator has a transport of its own (MPI: a new MPI communicator; UCX: a
 * new worker), so parent and children can be used, destroyed or aborted in any order; config
 * (NULL: defaults) sets its timeout and chunk size. What gvq keeps per communicator
 * (zero-code compressors, statistics) starts afresh on it. Not inside a group, and not on the
 * in-process test transport.
 * Errors: gvqInvalidArgument (dead comm, NULL newcomm, a color below 0 other than NOCOLOR),
 * gvqInvalidUsage (inside a group, a transport that cannot split), and the errors of a
 * collective on comm: a rank that does not call gvqCommSplit fails it on the others
 * (gvqInvalidUsage, or gvqTimeout when it calls nothing). */
GVQ_API gvqResult_t gvqCommSplit(gvqComm_t comm, int color, int key, gvqComm_t *newcomm,
                                 gvqConfig_t *config);

/* gvqCommShrink's flags. ABORT: the communicator may be broken (a peer died or stalled); the
 * ranks that do not take part within the timeout are left out as well, provided more than half
 * of the ranks not excluded remain (a rank cut off from the others, or a stalled one that
 * resumes, must not go on alone). NO_QUORUM (with ABORT): without that majority rule, for a
 * caller that knows the missing ranks are dead (its launcher saw them exit), e.g. 1 of 2. */
#define GVQ_SHRINK_DEFAULT 0
#define GVQ_SHRINK_ABORT 1
#define GVQ_SHRINK_NO_QUORUM 2

/* A new communicator of comm's ranks less excludeRanks[0..excludeCount) (NCCL's
 * ncclCommShrink; MPI ULFM's MPIX_Comm_shrink), also after comm broke. Every rank not excluded
 * calls it; the excluded do not. With GVQ_SHRINK_ABORT, a rank that has not called it within
 * twice the timeout (it died, stalled, or hangs elsewhere) is left out too: the survivors agree
 * on who remains, so every rank that gets a communicator gets the same one (ranks in comm's
 * order), and a rank left out gets an error. The new communicator has a transport of its own
 * and starts afresh (zero-code compressors, statistics), as gvqCommSplit's; config sets its
 * timeout and chunk size (NULL, or a field left undefined: comm's), and that timeout bounds each
 * round of the agreement. comm stays as it
 * was: destroy it. MPI: the survivors' MPI processes must stay up (Open MPI ends a job whose
 * process dies); UCX: any process may die. On UCX each communicator keeps a spare worker for
 * this (GVQ_UCX_SPARE), used by one shrink that reaches an agreement.
 * Errors: gvqInvalidArgument (dead comm, NULL newcomm, a rank outside comm or the caller in the
 * list, unknown flags, no timeout), gvqInvalidUsage (inside a group, the in-process transport,
 * no spare worker, ranks with different flags, this rank left out by another's list),
 * gvqTimeout (without ABORT, a rank that did not take part; a member that did not confirm),
 * gvqRemoteError (left out by the survivors; no majority under ABORT), gvqSystemError. */
GVQ_API gvqResult_t gvqCommShrink(gvqComm_t comm, const int *excludeRanks, int excludeCount,
                                  gvqComm_t *newcomm, gvqConfig_t *config, int shrinkFlags);

/* A new communicator of comm's ranks and newcomers, nranks in all (NCCL's ncclCommGrow). One
 * process makes a new id (gvqGetUniqueId) and every participant gets it by the caller's own
 * means (a gvqBroadcast among the members, a file or store for the newcomers). A member passes
 * its comm and rank -1 and keeps its rank; a newcomer passes comm NULL and its rank, one of
 * comm's size .. nranks - 1. Collective over all nranks processes, as gvqCommInitRank (whose
 * rules it follows: over MPI the newcomers must be processes of the same MPI job). comm stays as
 * it was; the new communicator starts afresh, and its config (NULL: comm's timeout and chunk
 * size for members, the defaults for newcomers) is its own.
 * Errors: gvqInvalidArgument (NULL newcomm or commId, a member's rank other than -1 or nranks
 * below its size, a newcomer's rank outside [0, nranks)), and gvqCommInitRank's (two processes
 * claiming one rank, a process missing at the timeout). */
GVQ_API gvqResult_t gvqCommGrow(gvqComm_t comm, int nranks, const gvqUniqueId *commId, int rank,
                                gvqComm_t *newcomm, gvqConfig_t *config);

/* Frees a communicator once its operations are done. Local (not collective); never hangs.
 * Errors: gvqInvalidArgument (NULL or already destroyed). */
GVQ_API gvqResult_t gvqCommDestroy(gvqComm_t comm);

/* Marks the communicator aborted, makes any call blocked on it in another thread return
 * gvqInvalidUsage ("aborted") promptly, waits for such calls to leave and frees the
 * communicator. Local; never hangs. Errors: gvqInvalidArgument (NULL or already destroyed). */
GVQ_API gvqResult_t gvqCommAbort(gvqComm_t comm);

/* Writes the number of ranks to *count. Errors: gvqInvalidArgument. */
GVQ_API gvqResult_t gvqCommCount(const gvqComm_t comm, int *count);

/* Writes the caller's rank to *rank. Errors: gvqInvalidArgument. */
GVQ_API gvqResult_t gvqCommUserRank(const gvqComm_t comm, int *rank);

/* Writes to *asyncError the error that broke the communicator (gvqTimeout, gvqRemoteError, ...)
 * or gvqSuccess if it is healthy. A broken communicator refuses further collectives with that
 * error; destroy or abort it. Errors: gvqInvalidArgument. */
GVQ_API gvqResult_t gvqCommGetAsyncError(gvqComm_t comm, gvqResult_t *asyncError);

/* ---------------------------------------------------------------------------------------------
 * Collectives. NCCL's argument orders and in-place rules. `count` is in elements. With host
 * buffers each call blocks until done, unless it is inside gvqGroupStart/gvqGroupEnd, where it
 * is queued and runs at the outermost gvqGroupEnd (buffers must stay valid until then), or is
 * given a host stream (see "Host streams").
 * Every rank receives bitwise-identical results. Errors common to all: gvqInvalidArgument (NULL
 * or destroyed comm, NULL buffer with count > 0, bad datatype or op, root out of range),
 * gvqTimeout / gvqRemoteError (a peer did not answer or failed), gvqInvalidUsage (the
 * communicator was aborted or is broken).
 * ------------------------------------------------------------------------------------------ */

/* Reduces `count` elements of every rank's sendbuff with `op` and writes the result to every
 * rank's recvbuff. In place when sendbuff == recvbuff. */
GVQ_API gvqResult_t gvqAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                 gvqDataType_t datatype, gvqRedOp_t op, gvqComm_t comm,
                                 gvqStream_t stream);

/* Copies `count` elements of root's sendbuff into every rank's recvbuff. sendbuff is read on
 * the root only. In place when sendbuff == recvbuff. */
GVQ_API gvqResult_t gvqBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                 gvqDataType_t datatype, int root, gvqComm_t comm,
                                 gvqStream_t stream);

/* NCCL's legacy in-place broadcast: gvqBroadcast(buff, buff, ...). */
GVQ_API gvqResult_t gvqBcast(void *buff, size_t count, gvqDataType_t datatype, int root,
                             gvqComm_t comm, gvqStream_t stream);

/* Reduces every rank's sendbuff with `op` into root's recvbuff; recvbuff is only used on the
 * root (it may be NULL elsewhere). In place when sendbuff == recvbuff. */
GVQ_API gvqResult_t gvqReduce(const void *sendbuff, void *recvbuff, size_t count,
                              gvqDataType_t datatype, gvqRedOp_t op, int root, gvqComm_t comm,
                              gvqStream_t stream);

/* Reduces nranks*recvcount elements of every sendbuff with `op` and leaves block `rank` (the
 * elements [rank*recvcount, (rank+1)*recvcount)) of the result in that rank's recvbuff.
 * In place when recvbuff == sendbuff + rank*recvcount*sizeof(element). */
GVQ_API gvqResult_t gvqReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                     gvqDataType_t datatype, gvqRedOp_t op, gvqComm_t comm,
                                     gvqStream_t stream);

/* Gathers sendcount elements from every rank into every recvbuff, rank r's at
 * recvbuff + r*sendcount elements. In place when sendbuff == recvbuff + rank*sendcount
 * elements. */
GVQ_API gvqResult_t gvqAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                 gvqDataType_t datatype, gvqComm_t comm, gvqStream_t stream);

/* Sends `count` elements to rank `peer`, which must post a matching gvqRecv (same count and
 * datatype). Messages between a pair of ranks arrive in the order sent. Outside a group the
 * call blocks until the message is delivered; put a send and a receive that depend on each
 * other inside one gvqGroupStart/gvqGroupEnd. */
GVQ_API gvqResult_t gvqSend(const void *sendbuff, size_t count, gvqDataType_t datatype, int peer,
                            gvqComm_t comm, gvqStream_t stream);

/* Receives `count` elements from rank `peer` into recvbuff. A message of a different size is
 * reported as gvqRemoteError. Blocking rules as gvqSend. */
GVQ_API gvqResult_t gvqRecv(void *recvbuff, size_t count, gvqDataType_t datatype, int peer,
                            gvqComm_t comm, gvqStream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Host streams: what a CUDA stream is to NCCL's calls on device buffers, a gvq host stream is to
 * calls on host buffers. A collective, point-to-point, compressed or sparse call given a host
 * stream checks its arguments at once (a refusal returns its error and WARN at once, and the
 * other ranks' matching calls fail in their turn rather than wait), then is queued and returns
 * gvqSuccess; the stream's progress thread runs its calls one after the other in issue order.
 * A group whose calls name a host stream is queued whole at gvqGroupEnd (all its calls must name
 * that stream). The buffers must stay valid and untouched until the call is done: after
 * gvqStreamSynchronize, a gvqStreamQuery that returns gvqSuccess, or an event recorded after
 * the call completes. Compressor and sparse outputs likewise.
 *
 * Order: the calls on one communicator run in the order they were issued, over every stream and
 * the blocking path (a call without a host stream first waits for the communicator's queued
 * calls). As in NCCL, every rank issues the same calls in the same order per communicator, from
 * one thread at a time. Errors of queued calls (a peer that differs, a timeout, a refusal of
 * the data such as an out-of-range sparse index) are returned by the next wait on the stream,
 * which makes their WARN line gvqGetLastError's; gvqCommGetAsyncError shows the last failed
 * queued call of a communicator until one of its queued calls succeeds. gvqCommDestroy,
 * gvqCompressorDestroy and the compressor and parameter-server save, load and stats calls first
 * wait for the communicator's queued calls; gvqCommAbort makes them fail at once (one queued on
 * a stream behind another communicator's call first waits for that call, which its own timeout
 * bounds). Host streams order host buffers only (a call with CUDA buffers and a host
 * stream is refused) and need a transport that runs calls from several threads at once
 * (MPI_THREAD_MULTIPLE, which gvq asks for when it initializes MPI; otherwise the call is
 * refused with gvqInvalidUsage).
 * ------------------------------------------------------------------------------------------ */

/* Makes a host stream and starts its progress thread. Errors: gvqInvalidArgument (NULL),
 * gvqSystemError. */
GVQ_API gvqResult_t gvqStreamCreate(gvqStream_t *stream);

/* Waits until the stream's queued calls have run, then frees it. Returns the first error of its
 * calls that no wait reported, else gvqSuccess. Errors: gvqInvalidArgument (not a live stream). */
GVQ_API gvqResult_t gvqStreamDestroy(gvqStream_t stream);

/* Waits until every call queued on the stream so far has run. Returns the first error of those
 * calls not yet reported by a wait (and forgets it), else gvqSuccess. Errors:
 * gvqInvalidArgument (not a live stream). */
GVQ_API gvqResult_t gvqStreamSynchronize(gvqStream_t stream);

/* gvqInProgress while a queued call has not run; otherwise as gvqStreamSynchronize. */
GVQ_API gvqResult_t gvqStreamQuery(gvqStream_t stream);

/* An event marks a point in a host stream: it completes when every call queued on the stream
 * before gvqEventRecord has run. */
typedef struct gvqEvent *gvqEvent_t;

/* Makes an event (complete until recorded). Errors: gvqInvalidArgument, gvqSystemError. */
GVQ_API gvqResult_t gvqEventCreate(gvqEvent_t *event);

/* Frees an event. Errors: gvqInvalidArgument (not a live event). */
GVQ_API gvqResult_t gvqEventDestroy(gvqEvent_t event);

/* Marks the current end of the stream's queue (a later record moves the mark). Errors:
 * gvqInvalidArgument (not a live event or host stream). */
GVQ_API gvqResult_t gvqEventRecord(gvqEvent_t event, gvqStream_t stream);

/* Waits until the event is complete. Returns the stream's first unreported error if it belongs
 * to a call before the event (without forgetting it: the stream's next wait reports it again),
 * else gvqSuccess. Errors: gvqInvalidArgument (not a live event). */
GVQ_API gvqResult_t gvqEventSynchronize(gvqEvent_t event);

/* gvqInProgress while the event is not complete; otherwise as gvqEventSynchronize. */
GVQ_API gvqResult_t gvqEventQuery(gvqEvent_t event);

/* Opens a group: the calls that follow on this thread are queued, not run. Groups nest. */
GVQ_API gvqResult_t gvqGroupStart(void);

/* Closes a group; at the outermost gvqGroupEnd the queued collectives run in call order, then
 * all queued sends and receives are posted together and completed, so a group may hold a
 * send and a receive that depend on each other. Returns the first error of the group.
 * Errors: gvqInvalidUsage (no open group), and any error of the queued calls. */
GVQ_API gvqResult_t gvqGroupEnd(void);

/* ---------------------------------------------------------------------------------------------
 * Compressed allreduce (GradiVeQ, QSGD). A compressor belongs to one tensor (one layer's
 * gradient) of one communicator; every rank creates its compressors in the same order with the
 * same config, and every rank holds bitwise-identical compressor state at all times.
 *
 * GradiVeQ schedule per compressor: warm-up (W calls, aggregated with the sampling codec) ->
 * sampling (T calls; the summed first slice of each reuse group is kept) -> fit (PCA, spread over
 * the ranks and broadcast) -> compressed (S calls; coefficients summed inside the ring) ->
 * sampling ... A compressed phase ends early when a majority of ranks see a local compression
 * loss above the threshold.
 * ------------------------------------------------------------------------------------------ */

typedef struct gvqCompressor *gvqCompressor_t;

/* clang-format off */
typedef enum {
    gvqCodecNone     = 0, /* plain ring */
    gvqCodecGradiveq = 1, /* PCA compression, summed in the compressed domain */
    gvqCodecQsgd     = 2, /* stochastic quantization; decoded, added, re-encoded at each hop
                             (integerBits > 0: integers summed at each hop instead) */
    gvqCodecPowersgd = 3  /* rank-r approximation P Q^T of the tensor seen as a K x (count/K)
                             matrix (Vogels et al. 2019); P and Q are plain sums on the ring */
} gvqCodec_t;
/* clang-format on */

/* clang-format off */
typedef enum {
    gvqPhaseWarmup     = 0,
    gvqPhaseSample     = 1,
    gvqPhaseCompressed = 2,
    gvqPhasePlain      = 3  /* no schedule: codec none, QSGD, PowerSGD, or GradiVeQ with a
                               tracked basis (gvqBasisTrack) */
} gvqCompressorPhase_t;
/* clang-format on */

/* How GradiVeQ's basis U (L x d, the same on every rank) is found. */
/* clang-format off */
typedef enum {
    gvqBasisFit   = 0, /* the paper: sampling phases of exact (or QSGD) sums, then a PCA fit by
                          eigen-solve, then compressed phases with U fixed */
    gvqBasisTrack = 1  /* streaming PCA: every call is compressed, in three rings: the
                          coefficients C0 = sum S_n U on the kept basis, then B = sum S_n^T C0,
                          U <- orth(B) (one power iteration on the covariance of the summed
                          slices, warm-started), then the coefficients on the new U, decoded.
                          S_n: this rank's slices as rows. d = maxDims [4]; no sampling, fit
                          or vote; error feedback on by default; sliceSize [the multiple of K
                          nearest above sqrt(count)]. A tensor for which
                          (2 nslices + L) d >= its count is sent uncompressed. Host buffers. */
} gvqBasisUpdate_t;
/* clang-format on */

#define GVQ_COMPRESSOR_CONFIG_MAGIC 0x67767178u /* 'gvqx' */

/* Versioned compressor configuration. Fill it with GVQ_COMPRESSOR_CONFIG_INITIALIZER; every
 * field left at GVQ_CONFIG_UNDEF_INT (or a float left at -1) takes the default in brackets. */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int codec;   /* gvqCodec_t [gvqCodecGradiveq] */
    int filters; /* K of a conv layer [K][D][H][W]; with depth/height/width. All four
                    unset: a flat tensor (K = 1). K*D*H*W must equal the count. */
    int depth, height, width;
    int sliceSize;       /* L, a multiple of K [the smallest multiple of K >= 256, at most the
                            count] */
    int reuse;           /* C, slices per compressor [all slices of the tensor: one compressor] */
    float lossThreshold; /* eps in (0, 1) [0.01] */
    int warmupIters;     /* W [0] */
    int sampleIters;     /* T [100] */
    int compressedIters; /* S [400] */
    int sampleCodec;   /* codec during warm-up and sampling: gvqCodecNone or gvqCodecQsgd [None] */
    int qsgdBits;      /* 2, 4 or 8 [4] */
    int qsgdBucket;    /* values per QSGD bucket [512] */
    int qsgdMaxNorm;   /* 1: scale buckets by the max norm, 0: by the L2 norm [1] */
    int wireType;      /* GradiVeQ coefficients on the wire: gvqFloat32 or gvqFloat16 [Float32] */
    int errorFeedback; /* 1: add what compression dropped to the next call's gradient [0] */
    int maxDims;       /* cap on d [L]; with basisUpdate gvqBasisTrack, d itself [4] */
    int seed;          /* random seed [0]: QSGD's draws, the integer wire's rounding, the
                          first Q of PowerSGD and the tracked basis; compressors of one seed
                          draw the same bits for an element and call: give each tensor its
                          own (gvqTrain* adds the variable's index to a shared config's seed) */
    float voteThreshold; /* early exit: a rank votes to leave the compressed phase when its local
                            loss ||x_n - x_hat_n|| / ||x_n|| exceeds this [lossThreshold, the
                            paper's rule]; >= 1 never exits early. Small-batch local gradients
                            are noise-dominated, so their loss is often far above eps. */
    int sampleSlices;    /* slices of each reuse group kept as PCA samples per sampling call,
                            spread evenly over the group; 0: all of them. The fit then sees
                            T x sampleSlices samples of the group (memory: T x count floats with
                            0). [1: the first slice, as the paper] */
    int integerBits;     /* 0: the ring adds floats. 8 or 16: integer-summed wire: GradiVeQ's
                            coefficients and QSGD's levels (with gvqBasisTrack: its three
                            rings, one scale per column) are quantized with one scale per
                            block that every rank uses (agreed before the ring), and the ring
                            adds b-bit integers: exact, order-independent. Each rank's values
                            are limited to +-floor((2^(b-1) - 1) / N) for N ranks, so the sum of
                            N never overflows. With GradiVeQ and sampleCodec gvqCodecQsgd
                            the sampling calls run QSGD's levels over the same integer sums
                            (at most QSGD's s levels: 8 and 16 bits sample alike). With
                            gvqBasisTrack, 16 is the tested choice: 8 costs 0.7 points on
                            perf/RESULTS.md's ResNet and once diverged (cause not found). [0] */
    int powerRank;       /* r of gvqCodecPowersgd, at most min(rows, columns) [1] */
    float efBound;       /* error feedback: the residual carried to the next call is clipped to
                            at most efBound x the norm of this call's gradient (a fixed PCA
                            basis never sends what lies outside it, so an unclipped residual
                            would grow there without bound) [4.0] */
    int basisUpdate;     /* how GradiVeQ finds its basis U (gvqBasisUpdate_t) [gvqBasisFit] */
} gvqCompressorConfig_t;

#define GVQ_COMPRESSOR_CONFIG_INITIALIZER                                            \
    {                                                                                \
        sizeof(gvqCompressorConfig_t), GVQ_COMPRESSOR_CONFIG_MAGIC, GVQ_VERSION,     \
            GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT,        \
            GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT,        \
            GVQ_CONFIG_UNDEF_INT, -1.0f, GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, \
            GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT,        \
            GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT,        \
            GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, -1.0f, \
            GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, -1.0f, \
            GVQ_CONFIG_UNDEF_INT                                                     \
    }

/* What a compressor is doing and has done. */
typedef struct {
    int codec;           /* gvqCodec_t */
    int phase;           /* gvqCompressorPhase_t */
    long long iteration; /* calls so far */
    long long phaseIter; /* calls in the current phase */
    int dims;            /* d of the current compressor (0 before the first fit) */
    int sliceSize;       /* L */
    int groups;          /* compressors of the tensor (reuse groups) */
    double ratio;      /* uncompressed / wire bytes of the compressed phase (QSGD: of every call) */
    double lastLoss;   /* this rank's last local compression loss ||x - x_hat|| / ||x|| */
    double keptEnergy; /* share of the sample variance the last fit kept */
    long long fits;    /* successful fits */
    long long fitsRefused; /* fits refused (non-finite samples) */
    long long earlyExits;  /* compressed phases ended by the vote */
    double fitSeconds;     /* wall time of the last fit on this rank (eigen-solves + broadcast) */
    unsigned long long wireBytes; /* bytes this rank sent for this tensor, all calls */
    unsigned long long rawBytes;  /* what a plain fp32 ring would send per rank for the same calls:
                                     2(n-1)/n of the tensor per call, a per-rank average */
    char reason[160];             /* why the tensor is not compressed right now, or "" */
    long long nonFiniteCalls;     /* calls whose gradient held NaN or Inf on some rank: each got
                                     the uncompressed sum, stayed out of the schedule, the fit
                                     and the error-feedback residual (logged once) */
} gvqCompressorStats_t;

/* Creates a compressor for a tensor of `count` floats. Collective in the sense that every rank
 * must create its compressors in the same order with the same config (no communication now).
 * Errors: gvqInvalidArgument with a WARN naming the field (L not a multiple of K, shape not
 * matching count, eps outside (0,1), d cap > L, unknown codec, QSGD bits not 2/4/8, ...). */
GVQ_API gvqResult_t gvqCompressorCreate(gvqComm_t comm, size_t count,
                                        const gvqCompressorConfig_t *config,
                                        gvqCompressor_t *compressor);

/* Frees a compressor. Local. */
GVQ_API gvqResult_t gvqCompressorDestroy(gvqCompressor_t compressor);

/* Copies the compressor's statistics to *stats. */
GVQ_API gvqResult_t gvqCompressorGetStats(gvqCompressor_t compressor, gvqCompressorStats_t *stats);

/* Allreduce of `count` gvqFloat32 values through the compressor (op gvqSum or gvqAvg). The
 * result is the exact sum during warm-up and sampling with codec none, an approximation
 * otherwise, and bitwise identical on every rank. In place when sendbuff == recvbuff. CUDA
 * buffers (both on the device) run device-resident on `stream`: collocation, the codecs and the
 * divide run on the GPU, the ring over NCCL when it is up (else its wire is staged through pinned
 * host memory over MPI), and the PCA fit on the host from the copied-out samples; a compressor
 * with errorFeedback, mixed host/device buffers and GVQ_DEVICE_CODECS=0 stage the whole buffers
 * and run the host codecs. The call returns when the result is in place, except on host
 * buffers with a host stream (queued; the compressor must not be used until it has run).
 * Inside gvqGroupStart/gvqGroupEnd the call is checked and queued like the plain collectives;
 * at the group's end its consecutive compressed calls on one communicator agree once, and
 * those with a tracked basis (gvqBasisTrack) on host buffers and the same op run as one call
 * (three rings for all of them instead of three each), the PowerSGD ones likewise (two rings),
 * and the QSGD ones of equal QSGD settings without error feedback or integer wire in one ring.
 * Fused QSGD gives the bits of the calls made one by one (each value meets the ring segment,
 * order of additions, bucket and random bits its own call gives it; tests/mpi/test_reference.c);
 * the fused tracked-basis and PowerSGD calls compute what separate calls compute, but the
 * ring's summation order and the integer wire's random draws differ, so their bits may. Each
 * compressor counts its share of the bytes. Every rank
 * must group the same calls alike. Errors: as gvqAllReduce, plus gvqInvalidArgument for a count,
 * type or op the compressor was not made for. */
GVQ_API gvqResult_t gvqAllReduceCompressed(const void *sendbuff, void *recvbuff, size_t count,
                                           gvqDataType_t datatype, gvqRedOp_t op,
                                           gvqCompressor_t compressor, gvqComm_t comm,
                                           gvqStream_t stream);

/* Writes the compressor's state (phase, counters, samples, U, Z, d, residuals) to buf. With
 * buf NULL, writes the size needed to *size and nothing else. Errors: gvqInvalidArgument
 * (buffer too small: *size then holds the size needed). */
GVQ_API gvqResult_t gvqCompressorSave(gvqCompressor_t compressor, void *buf, size_t *size);

/* Restores a state written by gvqCompressorSave into a compressor created with the same count
 * and config, so a restarted job continues exactly. Errors: gvqInvalidArgument (not a saved
 * state, or one of another shape or config). */
GVQ_API gvqResult_t gvqCompressorLoad(gvqCompressor_t compressor, const void *buf, size_t size);

/* The same for a rank that joins (gvqCommGrow): another rank's saved state, of which it takes
 * what every rank holds alike (phase, counters, samples, basis, PowerSGD's warm start) and not
 * that rank's error-feedback residual, which starts at zero here. Same checks and errors. */
GVQ_API gvqResult_t gvqCompressorLoadShared(gvqCompressor_t compressor, const void *buf,
                                            size_t size);

/* The same, to and from a file. Errors: gvqSystemError (I/O), as above otherwise. */
GVQ_API gvqResult_t gvqCompressorSaveFile(gvqCompressor_t compressor, const char *path);
GVQ_API gvqResult_t gvqCompressorLoadFile(gvqCompressor_t compressor, const char *path);

/* ---------------------------------------------------------------------------------------------
 * Zero-code mode (docs/ZERO_CODE.md). With GVQ_CODEC set, every plain gvqAllReduce of
 * gvqFloat32 with gvqSum or gvqAvg on host buffers runs through compressors that gvq makes for
 * its (recvbuff, count) on the first such call and keeps on the communicator:
 *   GVQ_CODEC unset or none       no compression: gvqAllReduce is exact (the drop-in default)
 *   GVQ_CODEC=auto                with a layout (below): each layer the codec of its kind;
 *                                 without one: QSGD 4-bit over the whole buffer
 *   GVQ_CODEC=gradiveq|qsgd|powersgd  that codec for the whole buffer, or for every conv and fc
 *                                 layer of a layout (GVQ_CODEC_CONV / GVQ_CODEC_FC override it
 *                                 per kind)
 * A layout describes a flat gradient buffer as layers. A zero-code call of exactly the layout's
 * count is split: conv layers [K][D][H][W] run GradiVeQ with their conv shape, fc layers
 * [out][in] run PowerSGD of rank GVQ_POWER_RANK on the out x in matrix, and the other layers,
 * layers under GVQ_LAYOUT_MIN_COUNT elements and the gaps between layers are summed exactly by
 * one plain allreduce of them together. The first call that uses a layout checks that every rank
 * gave the same layout and the same per-layer codecs (refused with gvqInvalidArgument on every
 * rank otherwise). The environment's GVQ_LAYOUT gives a layout as text (gvqCommSetLayoutString's
 * syntax); a layout set by a call replaces it on that communicator.
 * ------------------------------------------------------------------------------------------ */

#define GVQ_LAYER_MAGIC 0x6776716cu /* 'gvql' */

/* clang-format off */
typedef enum {
    gvqLayerOther = 0, /* biases, norms, anything small: summed exactly with the gaps */
    gvqLayerConv  = 1, /* dims = {K, D, H, W}: K filters of D x H x W, element [k][d][h][w] */
    gvqLayerFc    = 2  /* dims = {out, in, 0, 0}: a row-major out x in weight matrix */
} gvqLayerKind_t;
/* clang-format on */

/* One layer of a flat buffer, versioned like the config structs: fill it with
 * GVQ_LAYER_CONV(offset, K, D, H, W), GVQ_LAYER_FC(offset, out, in) or
 * GVQ_LAYER_OTHER(offset, count). */
typedef struct {
    size_t size;          /* sizeof(gvqLayer_t) as the caller compiled it */
    unsigned int magic;   /* GVQ_LAYER_MAGIC */
    unsigned int version; /* GVQ_VERSION */
    int kind;             /* gvqLayerKind_t */
    size_t offset;        /* first element of the layer in the buffer */
    size_t count;         /* elements; 0 for conv and fc: the product of dims */
    int dims[4];          /* conv: K D H W >= 1; fc: out in >= 1 (dims[2], dims[3] 0 or 1) */
} gvqLayer_t;

#define GVQ_LAYER_OF(kind, offset, count, d0, d1, d2, d3)                              \
    {                                                                                  \
        sizeof(gvqLayer_t), GVQ_LAYER_MAGIC, GVQ_VERSION, (kind), (offset), (count), { \
            (d0), (d1), (d2), (d3)                                                     \
        }                                                                              \
    }
#define GVQ_LAYER_CONV(offset, k, d, h, w) GVQ_LAYER_OF(gvqLayerConv, offset, 0, k, d, h, w)
#define GVQ_LAYER_FC(offset, out, in) GVQ_LAYER_OF(gvqLayerFc, offset, 0, out, in, 0, 0)
#define GVQ_LAYER_OTHER(offset, count) GVQ_LAYER_OF(gvqLayerOther, offset, count, 0, 0, 0, 0)

/* Describes the layers of the flat buffer of `count` floats that the program passes to
 * gvqAllReduce: later zero-code calls of exactly `count` elements are split per layer as above
 * (other counts are not). Layers may come in any order and leave gaps (summed exactly); they
 * must not overlap and must lie inside [0, count). Replaces the communicator's previous layout
 * (and GVQ_LAYOUT) and drops the compressors made for either; nlayers 0 (layers may be NULL)
 * leaves the communicator without a layout (GVQ_LAYOUT included). Local and immediate: every rank
 * must set the same layout before the first call that uses it, which checks that they did. Has no
 * effect while GVQ_CODEC is unset. Errors: gvqInvalidArgument with a WARN naming the layer and the
 * rule (NULL or destroyed comm, count 0 with layers, a layer not made by the GVQ_LAYER_* macros,
 * unknown kind, dims < 1, a count that is not the product of dims, a layer outside the buffer, two
 * layers overlapping; the previous layout then stays), gvqSystemError. */
GVQ_API gvqResult_t gvqCommSetLayout(gvqComm_t comm, size_t count, const gvqLayer_t *layers,
                                     int nlayers);

/* gvqCommSetLayout from text, the syntax of GVQ_LAYOUT: comma-separated entries
 *   conv:OFFSET:KxDxHxW   fc:OFFSET:OUTxIN   other:OFFSET:COUNT   count:COUNT
 * (decimal integers; spaces around entries allowed). The buffer's count is the count entry's,
 * else the end of the last layer. NULL or "" removes the layout. Errors: gvqInvalidArgument with
 * a WARN naming every malformed entry (and gvqCommSetLayout's), gvqSystemError. */
GVQ_API gvqResult_t gvqCommSetLayoutString(gvqComm_t comm, const char *layout);

/* A layout built from the trainer's own tensors, in buffer order, without offset arithmetic:
 * appends one layer at *offset (where the next tensor starts in the flat buffer) to
 * layers[*nlayers], then advances both. kind gvqLayerConv takes dims = {K, D, H, W} (a conv
 * weight's shape), gvqLayerFc dims = {out, in}, gvqLayerOther `count` elements (dims unused).
 *
 *     gvqLayer_t l[8]; int n = 0; size_t at = 0;
 *     gvqLayoutAppend(l, 8, &n, &at, gvqLayerConv, (int[]){32, 1, 5, 5}, 0);
 *     gvqLayoutAppend(l, 8, &n, &at, gvqLayerOther, NULL, 32);            (its bias)
 *     gvqLayoutAppend(l, 8, &n, &at, gvqLayerFc, (int[]){10, 4608}, 0);
 *     if (at != nparams) ... the tensors do not add up to the buffer ...
 *     gvqCommSetLayout(comm, nparams, l, n);
 *
 * Errors: gvqInvalidArgument with a WARN (NULL pointers, no room left in layers, unknown kind,
 * dims < 1, count 0, an offset past SIZE_MAX); nothing is appended then. Local. */
GVQ_API gvqResult_t gvqLayoutAppend(gvqLayer_t *layers, int capacity, int *nlayers, size_t *offset,
                                    int kind, const int *dims, size_t count);

#define GVQ_STATS_TOTAL (-1)

/* The statistics of the communicator's zero-code calls, on this rank. layer GVQ_STATS_TOTAL:
 * all of them together: iteration = zero-code calls, wireBytes/rawBytes summed over every
 * compressor and the plain allreduces (so ratio = rawBytes / wireBytes is what the wire saw),
 * fits, fitsRefused, earlyExits and fitSeconds summed, lastLoss the largest, keptEnergy the
 * smallest of the fitted parts, groups = compressors, codec the one codec of every compressor
 * (gvqCodecNone: none compress, -1: several), phase -1, reason the first compressor's that is
 * not compressing ("layer 3: ..."). layer i >= 0: layer i of the current layout, summed over
 * the buffers that used it (a plain layer: codec gvqCodecNone, and its share by element count
 * of the plain allreduce's bytes). Zeros before the first call. Local. Errors:
 * gvqInvalidArgument (NULL or destroyed comm, NULL stats, layer outside the layout). */
GVQ_API gvqResult_t gvqCommGetCompressionStats(gvqComm_t comm, int layer,
                                               gvqCompressorStats_t *stats);

/* =============================================================================================
 * Sparse variables (docs/ALGORITHMS.md section 4, after Parallax, EuroSys 2019)
 *
 * A sparse variable has `rows` rows of `dim` elements; a step touches a few of them (an
 * embedding). Two ways to aggregate its gradient:
 *   - gvqSparseAllGatherv: every rank contributes (row indices, rows) and receives the union,
 *     rows of equal index summed. Each rank's rows cross every link: about 2 alpha w (N-1)
 *     bytes per rank for a variable of w bytes with a fraction alpha touched per rank.
 *   - the parameter server (gvqPs*): the rows are partitioned over P shards held by the ranks
 *     themselves (shard s on rank s mod N); a push sends each row's gradient to its shard only,
 *     a pull fetches current rows by index: about 4 alpha w (N-1)/N bytes per rank.
 * Row indices are int64_t in [0, rows). Every call here is collective over the communicator:
 * every rank calls it, in the same order, also a rank that has nothing to contribute (n = 0);
 * except a parameter server made with `serve` (gvqPsConfig_t), whose push, apply and pull are
 * this rank's alone: a thread of the handle answers the other ranks' requests whenever they come,
 * gvqPsApply ends this rank's step, and a pull waits only for the steps it must see (staleness).
 * Input that a rank refuses (an index outside [0, rows), NULL with n > 0) makes that rank return
 * gvqInvalidArgument with a WARN; the ranks still exchange their headers, so the others learn
 * of it and return gvqRemoteError instead of waiting, and nothing of the call is applied.
 * Everything received from a peer is validated before it is used; a malformed message is
 * reported as gvqRemoteError and never written outside its buffers.
 * ========================================================================================== */

#define GVQ_SPARSE_ROWS_MAGIC 0x67767173u /* 'gvqs' */

/* Flags of gvqSparseAllGatherv (or them together; 0 means GVQ_SPARSE_SUMMED). */
#define GVQ_SPARSE_SUMMED 1u /* fill the union: unique indices, ascending, duplicates summed */
#define GVQ_SPARSE_RAW                                                \
    2u /* fill the concatenation: rank 0's rows as it gave them, then \
          rank 1's, ... (what a NCCL user expects of an allgatherv) */

/* The result of gvqSparseAllGatherv. Initialize it with GVQ_SPARSE_ROWS_INITIALIZER once and
 * pass it to every call: gvq owns the arrays, grows them on demand and keeps them between calls
 * (so a training loop does not allocate per step); gvqSparseRowsFree releases them. */
typedef struct {
    size_t size;          /* sizeof(gvqSparseRows_t) as the caller compiled it */
    unsigned int magic;   /* GVQ_SPARSE_ROWS_MAGIC */
    unsigned int version; /* GVQ_VERSION */
    size_t nrows;         /* GVQ_SPARSE_SUMMED: rows of the union */
    int64_t *indices;     /*   nrows unique indices, ascending */
    void *values;         /*   nrows x dim elements, row i belongs to indices[i] */
    size_t rawRows;       /* GVQ_SPARSE_RAW: sum of the ranks' row counts */
    int64_t *rawIndices;  /*   rawRows indices in rank order */
    void *rawValues;      /*   rawRows x dim elements */
    int nranks;           /* entries of rankRows */
    size_t *rankRows;     /* rows each rank sent (after its local merge unless GVQ_SPARSE_RAW) */
    unsigned long long bytesSent;     /* bytes this rank put on the wire in the last call */
    unsigned long long bytesReceived; /* bytes this rank received in the last call */
    int algorithm;  /* transfer used by the last call: 0 ring, 1 the transport's own */
    void *internal; /* gvq's bookkeeping (capacities); do not touch */
} gvqSparseRows_t;

#define GVQ_SPARSE_ROWS_INITIALIZER                                                                \
    {                                                                                              \
        sizeof(gvqSparseRows_t), GVQ_SPARSE_ROWS_MAGIC, GVQ_VERSION, 0, NULL, NULL, 0, NULL, NULL, \
            0, NULL, 0, 0, 0, NULL                                                                 \
    }

/* Sparse allgatherv. Rank r contributes `nrows` rows: indices[i] in [0, rows) and the `dim`
 * elements of row i at values + i*dim elements (duplicate indices allowed). Every rank receives,
 * in *out, the union with rows of equal index summed (GVQ_SPARSE_SUMMED) and/or the raw
 * concatenation in rank order (GVQ_SPARSE_RAW); all ranks get bitwise-identical results (sums
 * run in rank order, then in the order the rows were given). Without GVQ_SPARSE_RAW each rank
 * sums its own duplicates before sending. The row counts are exchanged first; the rows then
 * travel around a pipelined ring or through the transport's native allgatherv (MPI_Iallgatherv),
 * chosen by GVQ_SPARSE_ALLGATHERV (perf/RESULTS.md, section 4 says which is faster and the
 * default). `rows`, `dim`, `datatype` and `flags` must be the same on every rank. Blocking (with
 * a host stream: queued, the rows read when it runs, *out written then); not allowed inside a
 * group. Only sums (any gvq datatype; fp16/bf16 add in fp32). Errors:
 * gvqInvalidArgument (NULL or destroyed comm, NULL out or an out not made with
 * GVQ_SPARSE_ROWS_INITIALIZER, dim 0, bad datatype or flags, NULL indices/values with
 * nrows > 0, an index outside [0, rows): nothing is written), gvqRemoteError (another rank
 * refused its input, or a peer sent a malformed block), gvqInvalidUsage (inside a group;
 * aborted), gvqTimeout, gvqSystemError (out of memory). */
GVQ_API gvqResult_t gvqSparseAllGatherv(const int64_t *indices, const void *values, size_t nrows,
                                        size_t rows, size_t dim, gvqDataType_t datatype,
                                        unsigned int flags, gvqSparseRows_t *out, gvqComm_t comm,
                                        gvqStream_t stream);

/* Frees the arrays of a gvqSparseRows_t and resets it to GVQ_SPARSE_ROWS_INITIALIZER. Local.
 * Errors: gvqInvalidArgument (NULL, or not made with the initializer). */
GVQ_API gvqResult_t gvqSparseRowsFree(gvqSparseRows_t *rows);

/* ---- parameter server ----------------------------------------------------------------------- */

/* Parameter-server handle: one sparse variable, sharded over the ranks of a communicator. */
typedef struct gvqPs *gvqPs_t;

/* Update rule applied at the shard to the summed gradient g of a touched row (lr: learning
 * rate). Rows no push touched since the last gvqPsApply are left alone (lazy, as TensorFlow's
 * sparse optimizers): SGD w -= lr g; momentum m = mu m + g, w -= lr m; Adagrad a += g^2,
 * w -= lr g / (sqrt(a) + eps). */
/* clang-format off */
typedef enum { gvqPsSgd = 0, gvqPsMomentum = 1, gvqPsAdagrad = 2 } gvqPsRule_t;

/* Which rows a shard owns: hashed (a fixed pseudo-random permutation of the rows cut into P
 * nearly equal ranges: hot rows of a skewed vocabulary spread over the shards) or contiguous
 * (shard s owns rows [s*rows/P, (s+1)*rows/P)). With P > rows some shards are empty. */
typedef enum { gvqPsHashed = 0, gvqPsContiguous = 1 } gvqPsPartitioning_t;

/* Initial values: zero, uniform in [-initScale, initScale) from `seed` (a pure function of
 * (seed, row, column): the same for every P and rank count), or copied from initValues. */
typedef enum { gvqPsInitZero = 0, gvqPsInitUniform = 1, gvqPsInitValues = 2 } gvqPsInit_t;

#define GVQ_PS_CONFIG_MAGIC 0x67767170u /* 'gvqp' */

/* Versioned parameter-server configuration. Fill it with GVQ_PS_CONFIG_INITIALIZER; an int left
 * at GVQ_CONFIG_UNDEF_INT or a double left at -1 takes the default in brackets. */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int partitions;       /* P, shards, >= 1 [the number of ranks]; shard s lives on rank s mod N */
    int partitioning;     /* gvqPsPartitioning_t [gvqPsHashed] */
    int rule;             /* gvqPsRule_t [gvqPsSgd] */
    double learningRate;  /* lr > 0 [0.01] */
    double momentum;      /* mu in [0, 1) [0.9] (momentum only) */
    double adagradInit;   /* initial accumulator a >= 0 [0.1] (Adagrad only) */
    double epsilon;       /* Adagrad's eps >= 0 [1e-7] */
    int average;          /* 1: divide the summed gradient by the number of ranks first [0] */
    int localAggregation; /* 1: ranks on one host sum their pushes at the host's lowest rank
                             before anything leaves the host [0] */
    int init;             /* gvqPsInit_t [gvqPsInitZero] */
    double initScale;     /* gvqPsInitUniform's range [0.05] */
    unsigned long long seed;  /* gvqPsInitUniform's seed [0] */
    const void *initValues;   /* gvqPsInitValues: rows x dim elements of the variable's type, read
                                 during gvqPsCreate (each rank copies the rows it holds) */
    gvqStream_t stream;       /* a host stream (gvqStreamCreate): gvqPsPush, gvqPsApply and
                                 gvqPsPull are queued on it and return at once; the rows are read
                                 and written when they run. The state calls (stats, save, load)
                                 need the stream synchronized first [NULL: blocking] */
    int serve;     /* 1: each rank's shards are answered by a thread of the handle's own, at any
                      time: push, apply and pull are no longer collective, and a pull needs
                      nothing from the owning ranks' calls (below) [0: synchronous] */
    int staleness; /* with serve: a pull after this rank's c-th gvqPsApply sees at least the first
                      c - staleness steps of every rank (stale synchronous parallel); 0 gives
                      exactly the synchronous server's rows and bits [0] */
} gvqPsConfig_t;
/* clang-format on */

#define GVQ_PS_CONFIG_INITIALIZER                                                                  \
    {                                                                                              \
        sizeof(gvqPsConfig_t), GVQ_PS_CONFIG_MAGIC, GVQ_VERSION, GVQ_CONFIG_UNDEF_INT,             \
            GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, -1.0, -1.0, -1.0, -1.0,                    \
            GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, -1.0, 0, NULL, NULL, \
            GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT                                             \
    }

/* What a parameter server has done, on this rank. */
typedef struct {
    int partitions;   /* P */
    int shards;       /* shards held by this rank */
    size_t localRows; /* rows held by this rank */
    int hosts;        /* distinct hosts among the ranks (host name and network namespace) */
    long long pushes, pulls, applies;
    unsigned long long bytesSent;     /* bytes this rank put on the wire, all calls */
    unsigned long long bytesReceived; /* bytes this rank received, all calls */
    unsigned long long pendingRows;   /* rows touched since the last gvqPsApply, on this rank */
} gvqPsStats_t;

/* Creates a parameter server for a variable of rows x dim elements of `datatype` (gvqFloat32
 * or gvqFloat64), partitioned as config says (NULL: all defaults). Collective: every rank calls
 * it with the same arguments (it exchanges host identities for local aggregation).
 * Errors: gvqInvalidArgument with a WARN naming the field (rows or dim 0, datatype, partitions
 * < 1, unknown rule or partitioning, lr <= 0, momentum outside [0, 1), NULL initValues, a config
 * not made with GVQ_PS_CONFIG_INITIALIZER), gvqSystemError, and the errors of a collective. */
GVQ_API gvqResult_t gvqPsCreate(gvqComm_t comm, size_t rows, size_t dim, gvqDataType_t datatype,
                                const gvqPsConfig_t *config, gvqPs_t *ps);

/* Frees a parameter server (its shards are lost: save them first). Local; with `serve`, its
 * thread answers the other ranks until every rank has destroyed the handle (or the timeout
 * passed: a WARN), so that no request is left without its answer.
 * Errors: gvqInvalidArgument (NULL or destroyed). */
GVQ_API gvqResult_t gvqPsDestroy(gvqPs_t ps);

/* Pushes gradient rows: grads + i*dim elements is the gradient of row indices[i] (duplicates
 * allowed: they are summed, here first, then at the shard with the other ranks'). The sums
 * accumulate at the shards until gvqPsApply. Collective and blocking, or queued on the config's
 * host stream (the shards are held by the
 * ranks, which receive inside this call). With localAggregation, the ranks of a host sum their
 * rows at the host's lowest rank first. Errors: gvqInvalidArgument (bad handle, NULL with n > 0,
 * an index outside [0, rows): no shard changes on any rank), gvqRemoteError (another rank
 * refused, or a malformed message reached a shard: that shard discards the whole push),
 * gvqInvalidUsage, gvqTimeout, gvqSystemError. */
GVQ_API gvqResult_t gvqPsPush(gvqPs_t ps, const int64_t *indices, const void *grads, size_t n);

/* Applies the update rule to every row pushed since the last apply, with the summed (or
 * averaged) gradient, and clears the sums. Local to this rank's shards, but every rank must
 * call it between the same pushes and pulls: calls are collective in order, so a pull that
 * follows an apply on every rank sees the updated rows everywhere (the synchronous step
 * barrier). With `serve`: ends this rank's step and returns; a shard runs the rule on a step
 * once every rank has ended it, summing its pushes in the synchronous server's order.
 * Errors: gvqInvalidArgument (bad handle); with `serve` also gvqRemoteError or gvqTimeout when
 * the handle's server failed earlier. */
GVQ_API gvqResult_t gvqPsApply(gvqPs_t ps);

/* Pulls current rows: values + i*dim elements receives row indices[i] (duplicates allowed).
 * Collective and blocking, or queued on the config's host stream. Errors: gvqInvalidArgument
 * (bad handle, NULL with n > 0, an index
 * outside [0, rows): values not written; the other ranks' pulls complete), gvqRemoteError (a
 * shard refused this rank's request, or a peer sent a malformed message), gvqInvalidUsage,
 * gvqTimeout, gvqSystemError. */
GVQ_API gvqResult_t gvqPsPull(gvqPs_t ps, const int64_t *indices, void *values, size_t n);

/* Copies the statistics of this rank to *stats. Errors: gvqInvalidArgument. */
GVQ_API gvqResult_t gvqPsGetStats(gvqPs_t ps, gvqPsStats_t *stats);

/* Writes this rank's shards (values, momentum or Adagrad accumulators, pending gradient sums)
 * and the shape they belong to into buf. With buf NULL writes the size needed to *size only.
 * Local. Errors: gvqInvalidArgument (buffer too small: *size then holds the size needed). */
GVQ_API gvqResult_t gvqPsSave(gvqPs_t ps, void *buf, size_t *size);

/* Restores what gvqPsSave wrote on the same rank of a parameter server created with the same
 * rows, dim, datatype, partitions, partitioning, rule and rank count, so a restarted job
 * continues exactly (with `serve`: saved at a step every rank has ended and pulled, since the
 * pushes of steps not yet applied and the step counts are not saved). Local; all or nothing.
 * Errors: gvqInvalidArgument (not a saved state, a truncated one, or one of another shape, rank or
 * config: the shards stay as they were). */
GVQ_API gvqResult_t gvqPsLoad(gvqPs_t ps, const void *buf, size_t size);

/* The same, to and from a file (one per rank). Errors: gvqSystemError (I/O), as above. */
GVQ_API gvqResult_t gvqPsSaveFile(gvqPs_t ps, const char *path);
GVQ_API gvqResult_t gvqPsLoadFile(gvqPs_t ps, const char *path);

/* Keeps a commit of this rank's shards (values, momentum or Adagrad accumulators) in memory,
 * on this rank and on the next one (rank + 1 mod N), beside the previous commit (the last two
 * are kept): the rows of any one lost rank survive in its neighbour's memory, at the cost of
 * four times the shards' bytes per rank and one transfer of each rank's shards. Collective; between
 * a gvqPsApply and the next push (rows pushed and not applied are refused on every rank alike);
 * with `serve`, after the same number of gvqPsApply calls on every rank, and it waits for the
 * shards here to apply them. Blocking (a config's host stream is drained first).
 * Errors: gvqInvalidArgument (bad handle; ranks with different commit or step counts, or rows
 * pushed on some ranks only), gvqInvalidUsage (rows pushed since the last apply on every rank,
 * inside a group), gvqTimeout, gvqRemoteError (another rank could not take its copy: the
 * previous commit stays on every rank), gvqSystemError. */
GVQ_API gvqResult_t gvqPsCommit(gvqPs_t ps);

/* Creates a parameter server on comm, as gvqPsCreate(comm, rows, dim, datatype, config, out),
 * holding the rows of `from`'s last commit: a server of the ranks' former communicator (from
 * may have lost it: destroyed, aborted or broken), or NULL on a process that had none (a
 * newcomer of gvqCommGrow). comm is any communicator of surviving and new processes
 * (gvqCommShrink, gvqCommGrow, gvqCommInitRank); its size, partitions and partitioning may
 * differ from the old server's. A former rank q's rows come from q itself or, when q is not in
 * comm, from the copy its next rank kept. The new server keeps the recovered rows as its
 * commit. Collective over comm; every rank returns the same result, and none returns before
 * every rank holds its rows. `from` stays as it was: destroy it.
 * Errors: gvqRemoteError (a former rank and the next one both missing: their rows are lost; a
 * rank whose rows did not arrive whole), gvqInvalidUsage (no rank with a commit, commits of
 * different serials or sizes, two ranks claiming one former rank, a `from` of another shape,
 * update rule or without a commit), gvqPsCreate's errors, gvqTimeout, gvqSystemError. */
GVQ_API gvqResult_t gvqPsRecover(gvqPs_t from, gvqComm_t comm, size_t rows, size_t dim,
                                 gvqDataType_t datatype, const gvqPsConfig_t *config, gvqPs_t *out);

/* ---- partition tuning ------------------------------------------------------------------------ */

#define GVQ_PS_TUNE_CONFIG_MAGIC 0x67767174u /* 'gvqt' */
#define GVQ_PS_TUNE_MAX_SAMPLES 32

/* One training iteration with parameter server `ps` (push, apply, pull, ...), called by
 * gvqPsTunePartitions on every rank; a non-success result stops the tuning with that error. */
typedef gvqResult_t (*gvqPsStepFn_t)(gvqPs_t ps, int iteration, void *userData);

/* Versioned tuner configuration (GVQ_PS_TUNE_CONFIG_INITIALIZER; unset fields in brackets). */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int itersPerSample;  /* iterations run per sampled P [100, as Parallax] */
    int skipIters;       /* first iterations of a sample left out of its time [itersPerSample/2] */
    int startPartitions; /* first P sampled [the number of hosts] */
    int maxPartitions;   /* largest P sampled or chosen [min(rows, 64 x ranks)] */
} gvqPsTuneConfig_t;

#define GVQ_PS_TUNE_CONFIG_INITIALIZER                                                          \
    {                                                                                           \
        sizeof(gvqPsTuneConfig_t), GVQ_PS_TUNE_CONFIG_MAGIC, GVQ_VERSION, GVQ_CONFIG_UNDEF_INT, \
            GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT                    \
    }

/* What the tuner sampled, the fit and its choice (identical on every rank). */
typedef struct {
    int nsamples;                            /* samples taken, in the order taken */
    int partitions[GVQ_PS_TUNE_MAX_SAMPLES]; /* P of sample i */
    double seconds[GVQ_PS_TUNE_MAX_SAMPLES]; /* iteration time of sample i: each rank's
                                                median over the timed iterations, the
                                                slowest rank's */
    int fitOk;                 /* 1: theta from least squares over >= 3 distinct P; 0: too few or
                                  singular, the best sample was chosen */
    double theta[3];           /* time ~ theta[0] + theta[1] / P + theta[2] * P */
    int bestPartitions;        /* the choice: the fastest sample, after the search and the
                                  refinement samples the fit pointed to (see below) */
    double predictedSeconds;   /* the fit at bestPartitions (the sample's time without a fit) */
    int bestSampledPartitions; /* the fastest sample */
    double bestSampledSeconds;
} gvqPsTuneResult_t;

/* Finds the number of partitions P for a parameter server as Parallax does (docs/ALGORITHMS.md
 * section 4): starting at startPartitions, runs itersPerSample calls of `step` on a fresh
 * parameter server (gvqPsCreate(comm, rows, dim, datatype, config with partitions = P)) and
 * times them, doubling P until the time rises, then halving from the start until it rises; fits
 * time ~ theta0 + theta1/P + theta2*P by least squares. Then, because that grid is coarse and a
 * real curve is flat near its minimum with bumps the model cannot see (which rank holds the hot
 * rows changes with P), it takes up to 3 refinement samples: the fit's argmin if not yet
 * sampled, else the untried P midway between the fastest sample and its sampled neighbours.
 * Candidates for refinement are multiples of the rank count (shard s lives on rank s mod N, so
 * other P load the ranks unequally). result->bestPartitions is the fastest sample. Collective;
 * the decisions use the slowest rank's times, so every rank returns the same result. Errors:
 * gvqInvalidArgument (NULL step or result, bad tune config, and gvqPsCreate's), the step's own
 * errors, and those of a collective. */
GVQ_API gvqResult_t gvqPsTunePartitions(gvqComm_t comm, size_t rows, size_t dim,
                                        gvqDataType_t datatype, const gvqPsConfig_t *config,
                                        const gvqPsTuneConfig_t *tune, gvqPsStepFn_t step,
                                        void *userData, gvqPsTuneResult_t *result);

#ifdef __cplusplus
}
#endif

#endif /* GVQ_H_ */
