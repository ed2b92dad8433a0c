/*
 * gvq_util.h -- internal utilities shared by every layer: error checks, logging, tunables,
 * time, and the element types' sizes and conversions.
 *
 * Nothing here knows about MPI, NCCL or CUDA; src/algorithms/ may include it.
 */
#ifndef GVQ_UTIL_H_
#define GVQ_UTIL_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gvq.h"

/* ---- logging (src/util/log.c) ------------------------------------------------------------- */

typedef enum {
    GVQ_LOG_NONE = 0,
    GVQ_LOG_VERSION = 1,
    GVQ_LOG_WARN = 2,
    GVQ_LOG_INFO = 3,
    GVQ_LOG_TRACE = 4
} gvq_log_level_t;

extern int gvq_log_level_cached; /* -1 until GVQ_DEBUG was read */
int gvq_log_level(void);
void gvq_log(gvq_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The rank printed in log lines of the calling thread (-1: none). */
void gvq_log_set_rank(int rank);
/* The text of the calling thread's last WARN. */
const char *gvq_log_last_warn(void);
/* Make text the calling thread's last WARN (an error reported on another thread than the one that
 * logged it: host streams). */
void gvq_log_set_last_warn(const char *text);

/* The calling thread does background work (a host stream's progress thread, thread.c) for a
 * caller whose waiting count is *waits: while nobody waits for it, its waits on the network
 * sleep rather than spin, leaving the core to the caller's compute. */
void gvq_thread_set_background(const int *waits);
/* A caller blocks until background work is done (+1), or stops (-1): while any does, no
 * background thread sleeps (a blocking call waiting for a communicator's queued calls). */
void gvq_thread_caller_blocked(int delta);
/* Whether the calling thread should sleep rather than spin now (background, nobody waiting). */
int gvq_thread_may_sleep(void);

#define GVQ_LOG_ENABLED(lvl) \
    ((gvq_log_level_cached >= 0 ? gvq_log_level_cached : gvq_log_level()) >= (lvl))
#define GVQ_WARN(...) gvq_log(GVQ_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
/* An INFO line that the default level (WARN) shows too: what the user asked for by name (a
 * statistics line whose GVQ_STATS_EVERY was set). GVQ_DEBUG=NONE or VERSION hides it. */
void gvq_log_note(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define GVQ_NOTE(...) gvq_log_note(__FILE__, __LINE__, __VA_ARGS__)
#define GVQ_INFO(...)                                                                              \
    do {                                                                                           \
        if (GVQ_LOG_ENABLED(GVQ_LOG_INFO)) gvq_log(GVQ_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#define GVQ_TRACE(...)                                               \
    do {                                                             \
        if (GVQ_LOG_ENABLED(GVQ_LOG_TRACE))                          \
            gvq_log(GVQ_LOG_TRACE, __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

/* ---- error propagation -------------------------------------------------------------------- */

/* Return the failure of `call` to the caller; the function that detected it already warned. */
#define GVQCHECK(call)                                                 \
    do {                                                               \
        gvqResult_t gvq_res_ = (call);                                 \
        if (gvq_res_ != gvqSuccess) {                                  \
            GVQ_TRACE("%s -> %s", #call, gvqGetErrorString(gvq_res_)); \
            return gvq_res_;                                           \
        }                                                              \
    } while (0)

/* Store the failure of `call` in `res` and jump to `label` (a cleanup label). */
#define GVQCHECKGOTO(call, res, label)                            \
    do {                                                          \
        (res) = (call);                                           \
        if ((res) != gvqSuccess) {                                \
            GVQ_TRACE("%s -> %s", #call, gvqGetErrorString(res)); \
            goto label;                                           \
        }                                                         \
    } while (0)

/* ---- tunables (src/util/param.c) ----------------------------------------------------------
 * One list, so a tool can print every knob with its value and help text. Each entry:
 * X(id, environment variable, kind, default, choices, help). Kinds: UINT (a non-negative
 * integer), INT (any integer), REAL (a finite number), CHOICE (one of the comma-separated
 * names in `choices`; its value is the name's index), TEXT (a string, gvq_param_text; empty
 * when unset). A value that does not parse is reported at WARN and the default used. Logging
 * (GVQ_DEBUG, GVQ_DEBUG_FILE) sits below this table and reads its own two variables. */
#define GVQ_PARAM_LIST(X)                                                                         \
    X(TIMEOUT_MS, "GVQ_TIMEOUT_MS", UINT, 600000, NULL,                                           \
      "a transfer that makes no progress for this many ms fails with gvqTimeout (0: never)")      \
    X(CHUNK_BYTES, "GVQ_CHUNK_BYTES", UINT, 1 << 20, NULL,                                        \
      "ring and chain pipeline chunk size in bytes")                                              \
    X(ALGO, "GVQ_ALGO", TEXT, 0, NULL,                                                            \
      "algorithm of the plain collectives, as NCCL_ALGO: ring, rd (recursive doubling; "          \
      "allgather: Bruck), rab (Rabenseifner), tree (binomial broadcast/reduce), direct "          \
      "(allreduce/allgather forwarding from library memory), shm (every plain collective on "     \
      "one host through shared memory, GVQ_SHM) or auto (the measured table, "                    \
      "src/comm/select.c), for all or per collective, e.g. "                                      \
      "'allreduce=rd,broadcast=tree' (allreduce, broadcast, reduce, reducescatter, "              \
      "allgather)")                                                                               \
    X(CODEC_CHUNK_BYTES, "GVQ_CODEC_CHUNK_BYTES", UINT, 1 << 18, NULL,                            \
      "ring chunk size (bytes of uncompressed fp32) while a GradiVeQ or QSGD codec runs")         \
    X(SIMD, "GVQ_SIMD", CHOICE, 0, "auto,scalar,avx2,avx512",                                     \
      "instruction set of the host codec kernels (auto: the widest this CPU runs; every choice "  \
      "gives the same bits)")                                                                     \
    X(SPIN_BEFORE_YIELD, "GVQ_SPIN_BEFORE_YIELD", UINT, 16, NULL,                                 \
      "polls of an unfinished transfer before the waiting thread yields the core")                \
    X(WAIT, "GVQ_WAIT", CHOICE, 1, "auto,spin,block",                                             \
      "how a thread waits for the network: spin (poll, yielding the core every "                  \
      "GVQ_SPIN_BEFORE_YIELD polls), block (after GVQ_SPIN_US without progress, sleep in the "    \
      "kernel until the transport has an event: UCX's event fd; MPI and shared memory sleep "     \
      "GVQ_PROGRESS_SLEEP_US at a time) or auto (spin while the thread has its core to itself, "  \
      "block for 100 ms after a yield took over 100 us: another thread wanted the core)")         \
    X(SPIN_US, "GVQ_SPIN_US", UINT, 50, NULL,                                                     \
      "GVQ_WAIT block or auto: microseconds a wait polls without progress before it sleeps")      \
    X(TRAIN_BUCKET_BYTES, "GVQ_TRAIN_BUCKET_BYTES", UINT, 262144, NULL,                           \
      "the training layer's default bucketBytes: plain tensors below it are fused into "          \
      "buckets of up to that size (0: no fusion)")                                                \
    X(TRAIN_FUSE_COMPRESSED, "GVQ_TRAIN_FUSE_COMPRESSED", UINT, 1, NULL,                          \
      "1: the training layer aggregates its tracked-basis GradiVeQ tensors in one grouped "       \
      "call (three rings a step) once the last is ready; 0: each when it is ready")               \
    X(PIPE_RMSE, "GVQ_PIPE_RMSE", UINT, 0, NULL,                                                  \
      "1: DualPipe and SpecTrain stages keep their tasks' weights until the target version is "   \
      "reached, for gvqPipeGetStats' RMSE (4S + 4 weight copies, twice with SpecTrain)")          \
    X(PIPE_LINKS, "GVQ_PIPE_LINKS", UINT, 0, NULL,                                                \
      "1: a pipeline with overlapped transfers splits a communicator of its own per link and "    \
      "direction from forwardComm and backwardComm, a stream each (sends never queue behind "     \
      "receives; measured no faster on 4 stages, perf/RESULTS.md section 10); 0: every "          \
      "transfer of a direction on forwardComm or backwardComm. The same on every stage")          \
    X(PROGRESS_SLEEP_US, "GVQ_PROGRESS_SLEEP_US", UINT, 50, NULL,                                 \
      "a host stream's progress thread waiting on the network sleeps this many microseconds "     \
      "between its rounds of polls, leaving the core to the caller's compute (0: it yields)")     \
    X(BOOTSTRAP_PORT, "GVQ_BOOTSTRAP_PORT", UINT, 0, NULL,                                        \
      "TCP port of the bootstrap root (0: any free port)")                                        \
    X(HIER_LOCAL, "GVQ_HIER_LOCAL", UINT, 1, NULL,                                                \
      "1: a communicator spanning hosts of several ranks each makes one of its host's ranks at "  \
      "init, whose shared memory carries the hierarchical allreduce's stages inside the host; "   \
      "0: those stages use the communicator's own transport. The same on every rank")             \
    X(UCX_SPARE, "GVQ_UCX_SPARE", UINT, 1, NULL,                                                  \
      "1: a UCX communicator (gvqCommInitRank, gvqCommSplit, gvqCommShrink) opens a second UCX "  \
      "worker at creation, idle until gvqCommShrink talks over it (the broken communicator's "    \
      "own worker is never progressed again); 0: none, and gvqCommShrink refuses on UCX")         \
    X(RING_ORDER, "GVQ_RING_ORDER", CHOICE, 0, "host,rank",                                       \
      "order of the allreduce, reduce-scatter and allgather rings when a communicator spans "     \
      "hosts: host (each host's ranks in one run, so the ring crosses each host's link once "     \
      "each way) or rank; the same on every rank")                                                \
    X(TRANSPORT, "GVQ_TRANSPORT", CHOICE, 0, "auto,mpi,ucx",                                      \
      "transport of gvqCommInitRank's communicators: mpi (Open MPI), ucx (UCX's ucp, no MPI "     \
      "at all), auto (mpi inside an MPI job or when MPI is initialized, else ucx where built)")   \
    X(SPARSE_ALLGATHERV, "GVQ_SPARSE_ALLGATHERV", UINT, 0, NULL,                                  \
      "sparse allgatherv transfer: 0 gvq's pipelined ring, 1 the transport's own "                \
      "(MPI_Iallgatherv; the ring where the transport has none)")                                 \
    X(NCCL, "GVQ_NCCL", UINT, 1, NULL,                                                            \
      "collectives on CUDA buffers run on NCCL when built in (0: staged through host memory)")    \
    X(CUDA_BUFFERS, "GVQ_CUDA_BUFFERS", UINT, 1, NULL,                                            \
      "look for CUDA buffers (cudaPointerGetAttributes, which creates a CUDA context on the "     \
      "current GPU); 0: every buffer is host memory and CUDA is never touched")                   \
    X(NCCL_RING, "GVQ_NCCL_RING", UINT, 1, NULL,                                                  \
      "device-resident compressed rings on CUDA buffers run over NCCL sends and receives "        \
      "when NCCL is up (0: their wire is staged through host memory over MPI)")                   \
    X(DEVICE_CODECS, "GVQ_DEVICE_CODECS", UINT, 1, NULL,                                          \
      "compressed allreduce on device buffers runs the device's codecs, only the wire staged "    \
      "through host memory (0: the whole buffers are staged and the host codecs run)")            \
    X(CODEC, "GVQ_CODEC", CHOICE, 0, "none,gradiveq,qsgd,powersgd,auto",                          \
      "zero-code mode: plain float sum/avg gvqAllReduce calls run through compressors made "      \
      "per (recvbuff, count): this codec for the whole buffer or every conv/fc layer of a "       \
      "layout; auto: per layer kind with a layout, QSGD 4-bit without (index = gvqCodec_t; "      \
      "auto = 4)")                                                                                \
    X(GRADIVEQ_EPS, "GVQ_GRADIVEQ_EPS", REAL, -1, NULL,                                           \
      "zero-code mode: GradiVeQ's lossThreshold (-1: the config's default)")                      \
    X(GRADIVEQ_VOTE, "GVQ_GRADIVEQ_VOTE", REAL, -1, NULL,                                         \
      "zero-code mode: GradiVeQ's voteThreshold (-1: 1, no early exit in zero-code mode)")        \
    X(GRADIVEQ_BASIS, "GVQ_GRADIVEQ_BASIS", CHOICE, 0, "fit,track",                               \
      "zero-code mode: GradiVeQ's basisUpdate (fit: sampling phases, the paper; track: a "        \
      "power iteration every call, gvqBasisTrack)")                                               \
    X(INTEGER_BITS, "GVQ_INTEGER_BITS", CHOICE, 0, "0,8,16",                                      \
      "zero-code mode: integerBits of the tracked GradiVeQ basis (0: float sums; QSGD has its "   \
      "own, GVQ_QSGD_INTEGER_BITS)")                                                              \
    X(QSGD_INTEGER_BITS, "GVQ_QSGD_INTEGER_BITS", CHOICE, 0, "0,8,16",                            \
      "zero-code mode: integerBits of QSGD (0: levels re-quantized at every hop, ~8x fewer "      \
      "bytes at 4 bits; 8 or 16: integer sums of the levels, 4x or 2x fewer)")                    \
    X(GRADIVEQ_SAMPLE_SLICES, "GVQ_GRADIVEQ_SAMPLE_SLICES", INT, GVQ_CONFIG_UNDEF_INT, NULL,      \
      "zero-code mode: GradiVeQ's sampleSlices (unset: 64 spread over each reuse group)")         \
    X(LAYOUT, "GVQ_LAYOUT", TEXT, 0, NULL,                                                        \
      "zero-code mode: the layers of a flat buffer, "                                             \
      "'conv:OFFSET:KxDxHxW,fc:OFFSET:OUTxIN,other:OFFSET:COUNT[,count:COUNT]' "                  \
      "(gvqCommSetLayoutString's syntax; a malformed entry fails the zero-code calls)")           \
    X(LAYOUT_MIN_COUNT, "GVQ_LAYOUT_MIN_COUNT", UINT, 4096, NULL,                                 \
      "zero-code mode: layout layers with fewer elements join the plain allreduce")               \
    X(POWER_RANK, "GVQ_POWER_RANK", UINT, 4, NULL,                                                \
      "zero-code mode: PowerSGD's rank r (clamped to the matrix's smaller side)")                 \
    X(CODEC_CONV, "GVQ_CODEC_CONV", CHOICE, 0, "default,none,gradiveq,qsgd,powersgd",             \
      "zero-code mode: codec of a layout's conv layers (default: GVQ_CODEC's rule)")              \
    X(CODEC_FC, "GVQ_CODEC_FC", CHOICE, 0, "default,none,gradiveq,qsgd,powersgd",                 \
      "zero-code mode: codec of a layout's fc layers (default: GVQ_CODEC's rule)")                \
    X(STATS_EVERY, "GVQ_STATS_EVERY", UINT, 100, NULL,                                            \
      "zero-code mode: rank 0 logs the compression statistics at INFO every this many "           \
      "zero-code calls (0: never)")                                                               \
    X(SEND_COPY, "GVQ_SEND_COPY", UINT, 1, NULL,                                                  \
      "MPI transport: 1 copies every send from the caller's memory into library memory, so "      \
      "no transfer reads it after a call failed; 0 sends in place (faster at large sizes; "       \
      "after a failure MPI may still read the caller's buffers until the process exits)")         \
    X(SHM, "GVQ_SHM", UINT, 1, NULL,                                                              \
      "ranks on one host: 1 maps a shared memory segment per communicator for the call "          \
      "agreement, every plain collective and gvqSend/gvqRecv (shared slots and channels instead " \
      "of "                                                                                       \
      "messages); 0 on any rank: messages only")                                                  \
    X(SHM_P2P, "GVQ_SHM_P2P", UINT, 1, NULL,                                                      \
      "ranks on one host with GVQ_SHM, communicators of gvqCommInitRank/gvqCommInitMPI: 1 on "    \
      "every rank sends gvqSend/gvqRecv through shared-memory channels (docs/RELIABILITY.md); "   \
      "0 on any rank: through MPI")                                                               \
    X(SOCKET_IFNAME, "GVQ_SOCKET_IFNAME", TEXT, 0, NULL,                                          \
      "network interface whose IPv4 address the bootstrap root listens on (unset: the first "     \
      "non-loopback interface that is up)")

typedef enum {
    GVQ_PARAM_UINT,
    GVQ_PARAM_INT,
    GVQ_PARAM_REAL,
    GVQ_PARAM_CHOICE,
    GVQ_PARAM_TEXT
} gvq_param_kind_t;

typedef enum {
#define GVQ_PARAM_ENUM(id, env, kind, def, choices, help) GVQ_PARAM_##id,
    GVQ_PARAM_LIST(GVQ_PARAM_ENUM)
#undef GVQ_PARAM_ENUM
        GVQ_PARAM_COUNT
} gvq_param_id_t;

/* The value of a tunable: the environment variable if set and valid, else the default
 * (gvq_param: as an integer; gvq_param_real: as a number, for REAL tunables). */
int64_t gvq_param(gvq_param_id_t id);
double gvq_param_real(gvq_param_id_t id);
const char *gvq_param_text(gvq_param_id_t id);
/* The environment's value of a parameter when it did not parse (the default is used then), else
 * NULL: GVQ_CODEC refuses zero-code calls rather than run them uncompressed. */
const char *gvq_param_rejected(gvq_param_id_t id);
/* 1 when the environment set the parameter (and it parsed). */
int gvq_param_is_set(gvq_param_id_t id);
/* Log every tunable with its value, source and help at INFO. */
void gvq_param_dump(void);

/* ---- saveable handles and versioned configs (src/util/blob.c) ------------------------------ */

/* The header of a versioned config struct (size, magic, version as the caller compiled it):
 * refuses, with a WARN naming fn and what, a wrong magic, a size outside [min_size, max_size]
 * or a version newer than this library's. */
gvqResult_t gvq_config_header_check(const char *fn, const char *what, size_t size, unsigned magic,
                                    unsigned version, unsigned want_magic, size_t min_size,
                                    size_t max_size, const char *initializer);

/* A versioned config (every one starts with size_t size, unsigned magic, unsigned version) of
 * this library's layout, `full` bytes, or of the older one whose fields end at `fields` (its size
 * those rounded up to `align`): checked as above, other sizes refused with a WARN, then copied to
 * *out, which holds the initializer's defaults: the whole struct, or the older one's fields only,
 * never its tail padding. out's size becomes full. */
gvqResult_t gvq_config_layouts(const char *fn, const char *what, const void *in, void *out,
                               size_t fields, size_t align, size_t full, unsigned want_magic,
                               const char *initializer);

/* A handle's save call (buf NULL: *size = bytes needed) and load call, as the public
 * gvq*Save / gvq*Load take them. */
typedef gvqResult_t (*gvq_save_fn_t)(void *obj, void *buf, size_t *size);
typedef gvqResult_t (*gvq_load_fn_t)(void *obj, const void *buf, size_t size);
/* Save obj's state into the file `path`, or load it from there; WARNs name fn and the path. */
gvqResult_t gvq_blob_save_file(const char *fn, const char *path, gvq_save_fn_t save, void *obj);
gvqResult_t gvq_blob_load_file(const char *fn, const char *path, gvq_load_fn_t load, void *obj);

/* CRC-32C of n bytes, continuing crc (0 to start: gvq_crc32c(gvq_crc32c(0, a, na), b, nb) is
 * the CRC of a then b) (src/util/crc.c). */
uint32_t gvq_crc32c(uint32_t crc, const void *data, size_t n);
/* A saved state's checksum: the 8 bytes at offset `at` (inside its header) hold the CRC-32C of
 * all `size` bytes with those 8 read as zero. gvq_blob_seal writes them; gvq_blob_verify refuses
 * a state they do not match (or too short to hold them) with gvqInvalidArgument and a WARN naming
 * fn. */
void gvq_blob_seal(void *buf, size_t size, size_t at);
gvqResult_t gvq_blob_verify(const char *fn, const void *buf, size_t size, size_t at);

/* ---- this process's host (src/util/host.c) ---------------------------------------------------
 * A key equal for processes on the same host: its host name and its network namespace (ranks in
 * the namespaces of perf/emulate-cluster.sh count as hosts of their own, as on the network). */
uint64_t gvq_host_key(void);

/* ---- time --------------------------------------------------------------------------------- */
uint64_t gvq_now_ns(void);

/* ---- element types (src/util/dtype.c) ----------------------------------------------------- */
size_t gvq_dtype_size(gvqDataType_t t); /* 0 for an invalid type */
const char *gvq_dtype_name(gvqDataType_t t);
const char *gvq_op_name(gvqRedOp_t op);
int gvq_dtype_valid(int t);
int gvq_op_valid(int op);
int gvq_dtype_is_float(gvqDataType_t t);

/* IEEE binary16 and bfloat16 <-> float, round to nearest even, NaN kept NaN. Compiled by nvcc
 * they are device functions too, so the CUDA kernels convert bit for bit as the host does. */
#ifdef __CUDACC__
#define GVQ_CONV_FN __host__ __device__ static inline
#else
#define GVQ_CONV_FN static inline
#endif
GVQ_CONV_FN float gvq_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf / nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalize */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while ((man & 0x400u) == 0);
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

GVQ_CONV_FN uint16_t gvq_float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u |
                          (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absx < 0x38800000u) {   /* below 2^-14: subnormal half or zero */
        if (absx < 0x33000000u) /* below 2^-25: rounds to zero */
            return sign;
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t half_m = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (half_m & 1u))) half_m++;
        return (uint16_t)(sign | half_m);
    }
    uint32_t r = absx + 0xfffu + ((absx >> 13) & 1u); /* round to nearest even */
    return (uint16_t)(sign | (uint16_t)((r - 0x38000000u) >> 13));
}

GVQ_CONV_FN float gvq_bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

GVQ_CONV_FN uint16_t gvq_float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#define GVQ_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GVQ_MAX(a, b) ((a) > (b) ? (a) : (b))
#define GVQ_DIV_UP(a, b) (((a) + (b)-1) / (b))

#endif /* GVQ_UTIL_H_ */
