/*
 * gvq_algo.h -- the collective algorithms and the codec interface they carry data through.
 *
 * Algorithms see only a transport ops table, a device ops table and plain C (no mpi.h, nccl.h
 * or CUDA header), so one ring serves MPI and NCCL, host and device memory, and unit tests can
 * run it over the in-process transport.
 */
#ifndef GVQ_ALGO_H_
#define GVQ_ALGO_H_

#include "gvq_device.h"
#include "gvq_transport.h"

/* What a collective needs from its communicator. */
typedef struct {
    gvq_transport_t *xport;
    const gvq_device_ops_t *dev;
    size_t chunk_bytes; /* pipeline chunk size */
    void **scratch;     /* grown on demand by gvq_coll_scratch; owned by the communicator */
    size_t *scratch_bytes;
    unsigned long long *bytes_sent; /* if not NULL, the ring adds the bytes it sends */
    /* The allreduce ring's order: position p holds rank ring_order[p] (NULL: rank order). The
     * communicator sets it from the host keys so that the ring visits each host's ranks in one
     * run and crosses each host's link once each way (gvq_ring_order_hosts). */
    const int *ring_order;
    /* The ranks' hosts when every host holds the same number of ranks, two or more, on two or
     * more hosts (the hierarchical allreduce's shape; NULL otherwise). */
    const struct gvq_hier *hier;
} gvq_coll_ctx_t;

/* The hosts of a communicator whose every host holds K ranks (K >= 2, H >= 2 hosts): hosts in
 * the order of their lowest rank, ranks in rank order within a host. */
typedef struct gvq_hier {
    int nhosts, per_host; /* H, K */
    int local_index;      /* this rank's place on its host, 0 .. K-1 */
    int *local;           /* the K ranks of this rank's host */
    int *cross;           /* the H ranks whose local index is this rank's, one per host */
    int host_index;       /* this rank's host, 0 .. H-1 */
    int *order;           /* H x K: order[g * K + j] is host g's local rank j */
    /* The stages inside a host over a transport of the host's own (its ranks 0..K-1 in the
     * order of `local`: a per-host communicator's shared-memory channels), or NULL: over the
     * collective's own transport. Set by the communicator; not owned. */
    gvq_transport_t *local_xport;
    int *local_pos; /* 0 .. K-1: the members in local_xport's numbering */
    /* Kept from call to call (the communicator runs one collective at a time): the pieces'
     * boundaries (K + 1 + H + 1) and the reduce-scatter's and allgather's rearranged blocks,
     * grown on demand, so that a call allocates nothing once its size has been seen. */
    struct gvq_hier_scratch {
        size_t *off;
        char *blocks;
        size_t cap;
    } * scratch;
} gvq_hier_t;

/* The shape from every rank's host key (n ranks, this one `rank`): *out NULL when the hosts are
 * not that shape (one host, one rank per host, or hosts of different sizes). */
gvqResult_t gvq_hier_of_hosts(const uint64_t *host_keys, int n, int rank, gvq_hier_t **out);
void gvq_hier_free(gvq_hier_t *h);

/* The ring order that groups ranks by host: hosts in the order of their lowest rank, ranks in
 * rank order within a host. Writes order[0..n) and returns 1, or returns 0 when that is rank
 * order itself. */
int gvq_ring_order_hosts(const uint64_t *host_keys, int n, int *order);

/* A scratch area of at least `bytes`, valid until the next call on the same context. */
gvqResult_t gvq_coll_scratch(gvq_coll_ctx_t *ctx, size_t bytes, void **out);

/*
 * A codec turns a piece of a tensor into what travels on the wire and back (docs/ALGORITHMS.md
 * section 1). The ring calls, per chunk of a segment (off and count in elements of the tensor,
 * off a multiple of `granule`):
 *   encode_combine(local, in, out): out = encode(local) (+) in, or encode(local) when in is NULL
 *   decode(wire, dst):              dst = decode(wire), once per chunk after full aggregation
 * The identity codec sets wire_is_values: its wire is the element values themselves, so the ring
 * reduces straight into the output buffer and never calls decode.
 */
typedef struct gvq_codec {
    const char *name;
    int wire_is_values;
    size_t granule; /* segment and chunk boundaries fall on multiples of this many elements */
    size_t (*wire_bytes)(const struct gvq_codec *c, size_t off, size_t count);
    gvqResult_t (*encode_combine)(const struct gvq_codec *c, size_t off, size_t count,
                                  const void *local, const void *in_wire, void *out_wire);
    gvqResult_t (*decode)(const struct gvq_codec *c, size_t off, size_t count, const void *wire,
                          void *dst);
    const gvq_device_ops_t *dev;
    gvqDataType_t dtype;
    gvqRedOp_t op; /* the elementwise op (gvqAvg reduces as gvqSum; the divide comes last) */
    void *state;   /* the codec's own */
    /* optional: called by the ring once per call with the whole local input before any chunk
     * moves; collective over ctx (a codec that needs the ranks to agree on something first:
     * the integer-summed wires' scales) */
    gvqResult_t (*begin)(const struct gvq_codec *c, gvq_coll_ctx_t *ctx, const void *local,
                         size_t count);
    /* optional, beside begin: the same when this rank encodes only [lo, hi) of local (the
     * hierarchy's stage across the hosts, hier.c); still collective over all of ctx */
    gvqResult_t (*begin_part)(const struct gvq_codec *c, gvq_coll_ctx_t *ctx, const void *local,
                              size_t count, size_t lo, size_t hi);
} gvq_codec_t;

/* The identity codec: the plain allreduce. */
void gvq_codec_identity_init(gvq_codec_t *c, const gvq_device_ops_t *dev, gvqDataType_t dtype,
                             gvqRedOp_t op);

/* ---- QSGD (codec_qsgd.c) ------------------------------------------------------------------ */
enum { GVQ_QSGD_NORM_L2 = 0, GVQ_QSGD_NORM_MAX = 1 };
typedef struct {
    int bits;      /* 2, 4 or 8: one sign bit, the rest the level */
    int levels;    /* s = 2^(bits-1) - 1 */
    size_t bucket; /* values per bucket (one scale each) */
    int norm;      /* GVQ_QSGD_NORM_L2 or GVQ_QSGD_NORM_MAX */
    uint32_t seed, rank;
    uint32_t call; /* set per allreduce, part of the random counter */
    float *tmp;    /* one bucket, for decode-add-encode at a hop */
    /* Several tensors in one ring (the fused QSGD call): for bucket j of the ring's vector, the
     * index its first value has in its own tensor, that tensor's call and its seed (the
     * first word of the Philox key), so that every value draws the random bits it draws when
     * its tensor runs alone. NULL: one tensor. */
    const uint64_t *map_first;
    const uint32_t *map_call;
    const uint32_t *map_seed;
} gvq_qsgd_t;
gvqResult_t gvq_qsgd_init(gvq_qsgd_t *q, int bits, size_t bucket, int norm, uint32_t seed,
                          uint32_t rank);
void gvq_qsgd_fini(gvq_qsgd_t *q);
void gvq_codec_qsgd_init(gvq_codec_t *c, const gvq_device_ops_t *dev, gvq_qsgd_t *q);
/* Bytes on the wire for `count` values starting on a bucket boundary. */
size_t gvq_qsgd_wire_size(int bits, size_t bucket, size_t count);

/* ---- GradiVeQ (codec_gradiveq.c, pca.c) ------------------------------------------------------
 * The codec works on the filter-collocated vector (gvq_collocate). Full slices of L values
 * travel as d coefficients c = U^T (x - Z/N) of their reuse group's compressor; the tail shorter
 * than L travels as raw floats. Coefficients add on the wire; decode is x = U c + Z. */
typedef struct {
    size_t count;   /* M, elements of the (collocated) tensor */
    size_t L, d, C; /* slice size, kept dimensions, slices per compressor (reuse factor) */
    size_t ngroups; /* ceil(full slices / C) */
    int nranks;
    int wire_fp16;  /* coefficients as IEEE half on the wire */
    const float *U; /* ngroups blocks of L x d, column-major (ld L) */
    const float *Z; /* ngroups blocks of L */
    float *UZ;      /* ngroups blocks of d: U^T Z, precomputed by gvq_gradiveq_prepare */
    double *ZZ;     /* ngroups values: ||Z||^2, precomputed likewise (loss bookkeeping) */
    float *tmp;     /* scratch for fp16 wires */
    size_t tmp_len;
    /* added up by every encode of local values (each local slice is encoded once per ring),
     * over every 4th full slice (codec_gradiveq.c, GQ_LOSS_STRIDE): ||x - Z/N||^2,
     * ||U^T (x - Z/N)||^2 and ||x||^2; the local compression loss is sqrt(x2 - c2) / sqrt(all2)
     * since U has orthonormal columns */
    double local_x2, local_c2, local_all2;
} gvq_gradiveq_t;
/* Check the shape and precompute U^T Z (uses dev->sgemm). */
gvqResult_t gvq_gradiveq_prepare(gvq_gradiveq_t *g, const gvq_device_ops_t *dev);
void gvq_gradiveq_fini(gvq_gradiveq_t *g);
void gvq_codec_gradiveq_init(gvq_codec_t *c, const gvq_device_ops_t *dev, gvq_gradiveq_t *g);
/* Bytes on the wire for `count` values starting on a slice boundary. */
size_t gvq_gradiveq_wire_size(size_t L, size_t d, int wire_fp16, size_t count);

/* ---- integer-summed wires (codec_intsum.c) ------------------------------------------------
 * QSGD's values or GradiVeQ's coefficients quantized to b-bit integers against scales all ranks
 * agree on when the ring begins (a max-allreduce of per-block maxima), summed as integers at
 * every hop. Each rank's level is bounded by lv = floor((2^(b-1) - 1) / N) so the sum of N never
 * overflows. Host memory only. */
typedef struct {
    int bits;             /* 8 or 16 */
    int levels;           /* lv: each rank's |integer| <= lv */
    size_t block;         /* QSGD: values per scale */
    uint32_t *blk;        /* columns (gvq_intsum_init_columns): each value's scale, else NULL */
    gvq_gradiveq_t *gq;   /* GradiVeQ's coefficients (NULL: the values themselves) */
    gvq_codec_t gq_codec; /* its fp32 codec: the coefficients at begin, x = U c + Z at decode */
    uint32_t seed, rank;
    uint32_t call;  /* set per allreduce, part of the random counter */
    const float *y; /* this rank's values in codec coordinates (set by begin) */
    size_t ny;
    float *ybuf;  /* GradiVeQ: the coefficients (full slices x d, then the tail) */
    float *scale; /* nscales agreed scales */
    float *mult;  /* per block: lv / scale (0: a zero or non-finite block), set with the scales */
    float *unit;  /* per block: scale / lv (NaN: non-finite) */
    size_t nscales;
    float *tmp; /* decode scratch */
    size_t tmp_len;
} gvq_intsum_t;
/* bits 8 or 16; max_levels > 0 caps lv (QSGD's own s); gq NULL: QSGD with `block` values per
 * scale, else GradiVeQ (prepared) over a tensor of `count` values, one scale per coefficient
 * index and reuse group plus one for the tail. Refuses (WARN) bits, or N too large for them. */
gvqResult_t gvq_intsum_init(gvq_intsum_t *s, int bits, int max_levels, size_t block,
                            gvq_gradiveq_t *gq, const gvq_device_ops_t *dev, size_t count,
                            int nranks, uint32_t seed, uint32_t rank);
/* Plain values in consecutive columns of col_len[0..ncols) values, one scale per column (the
 * tracked basis's rings). */
gvqResult_t gvq_intsum_init_columns(gvq_intsum_t *s, int bits, const size_t *col_len, size_t ncols,
                                    int nranks, uint32_t seed, uint32_t rank);
void gvq_intsum_fini(gvq_intsum_t *s);
void gvq_codec_intsum_init(gvq_codec_t *c, const gvq_device_ops_t *dev, gvq_intsum_t *s);
/* This rank's max |y| per block into s->scale (before the ranks agree on them), s->y set. */
void gvq_intsum_local_scales(gvq_intsum_t *s);
/* Bytes on the wire for the chunk [off, off+count) (off on the codec's granule). */
size_t gvq_intsum_wire_size(const gvq_intsum_t *s, size_t off, size_t count);

/* ---- device codecs (codec_device.c) --------------------------------------------------------
 * The same codecs run by a device's own codec operations (gvq_device_ops_t qsgd_* and gq_*):
 * local values, wires and outputs are memory of that device, and so is everything the
 * parameter structs point at. Same wire format as the host codecs. */
void gvq_codec_qsgd_dev_init(gvq_codec_t *c, const gvq_device_ops_t *dev, const gvq_dev_qsgd_t *q);
/* GradiVeQ; every encode adds the loss norms of its local slices to norms[3] (host memory:
 * ||x - Z/N||^2, ||c||^2, ||x||^2 over the sampled slices, as the host codec's local_*). */
typedef struct {
    gvq_dev_gq_t params; /* the device op parameters */
    double norms[3];
} gvq_gq_dev_codec_t;
void gvq_codec_gradiveq_dev_init(gvq_codec_t *c, const gvq_device_ops_t *dev,
                                 gvq_gq_dev_codec_t *g);
/* Whether a device runs the codecs itself (has the codec entries and is not the host). */
int gvq_device_has_codecs(const gvq_device_ops_t *dev);

/* A device codec behind a host wire, for a transport that moves host memory only (MPI over
 * device buffers): the ring's wire slots are host memory, the local values and the output stay
 * on the device; each encode_combine copies the incoming wire to the device, runs the device
 * codec there and copies the result back, each decode copies the wire in and decodes on the
 * device. Only the (compressed) wire crosses the bus. `inner` must outlive the wrapper; its
 * wire_is_values is ignored (the identity codec's values travel as a wire). */
typedef struct {
    const gvq_codec_t *inner;
    const gvq_device_ops_t *dev; /* inner->dev, kept for gvq_staging_fini */
    void *din, *dout;            /* device copies of the wire, grown on demand */
    size_t cap;
} gvq_staging_t;
void gvq_codec_staged_init(gvq_codec_t *c, const gvq_codec_t *inner, gvq_staging_t *st);
void gvq_staging_fini(gvq_staging_t *st);

/* Filter collocation of a conv gradient [K][D][H][W]: the K values at one (d, h, w) become
 * adjacent, positions ordered depth first, then width, then height:
 * dst[((h*W + w)*D + d)*K + k] = src[((k*D + d)*H + h)*W + w]. gvq_uncollocate inverts it. */
void gvq_collocate(const float *src, float *dst, size_t K, size_t D, size_t H, size_t W);
void gvq_uncollocate(const float *src, float *dst, size_t K, size_t D, size_t H, size_t W);

/* PCA fit (pca.c): from T samples of length L (column-major L x T, each sample contiguous),
 * Z = mean, covariance (1/T) sum (s - Z)(s - Z)^T, its eigen-decomposition, and U = the d leading
 * eigenvectors, d the smallest with (sum of the d largest eigenvalues) / (sum of all) >= 1 - eps,
 * capped at dmax. U must hold L*L floats: the d leading eigenvectors, then zero columns.
 * Refuses samples holding NaN or Inf with gvqInvalidArgument and a WARN naming the sample. */
gvqResult_t gvq_pca_fit(const gvq_device_ops_t *dev, size_t L, size_t T, const float *samples,
                        double eps, size_t dmax, float *U, float *Z, size_t *d,
                        double *kept_energy);
/* The same with the route forced: covariance (L x L eigen-solve) or Gram (T x T eigen-solve,
 * eigenvectors mapped back and re-orthonormalised; falls back to covariance when degenerate).
 * GVQ_PCA_AUTO picks Gram when T < L. */
typedef enum { GVQ_PCA_AUTO = 0, GVQ_PCA_COVARIANCE = 1, GVQ_PCA_GRAM = 2 } gvq_pca_method_t;
gvqResult_t gvq_pca_fit_method(const gvq_device_ops_t *dev, size_t L, size_t T,
                               const float *samples, double eps, size_t dmax, float *U, float *Z,
                               size_t *d, double *kept_energy, gvq_pca_method_t method);

/* Ring allreduce (reduce-scatter then allgather) of `count` elements through `codec`; src may
 * equal dst. gvqAvg divides once at the end. */
gvqResult_t gvq_ring_allreduce(gvq_coll_ctx_t *ctx, const gvq_codec_t *codec, const void *src,
                               void *dst, size_t count, gvqRedOp_t op);

/* A sum of one int32 per rank that rides inside a compressed ring allreduce (GradiVeQ's vote,
 * docs/ALGORITHMS.md section 3): each rank's value is asked for (value(arg)) once all of its own
 * contributions are encoded, i.e. when it finishes its own segment at the end of the
 * reduce-scatter; it travels as 4 extra bytes behind the last chunk of that segment through the
 * allgather, and every rank adds up the N values it holds at the end. `carried` is 0 when the
 * ring could not carry it (a segment without elements, or a codec whose wire is the values):
 * the caller then agrees on the value separately. value() is called exactly once either way
 * (with carried 0, before the ring returns), and sum holds this rank's own value then. */
typedef struct {
    int32_t (*value)(void *arg);
    void *arg;
    int32_t sum; /* out */
    int carried; /* out */
} gvq_tally_t;

/* gvq_ring_allreduce with a tally riding along (tally may be NULL). */
gvqResult_t gvq_ring_allreduce_tally(gvq_coll_ctx_t *ctx, const gvq_codec_t *codec, const void *src,
                                     void *dst, size_t count, gvqRedOp_t op, gvq_tally_t *tally);

/* Ring reduce-scatter: src holds nranks*recvcount elements, dst receives block `rank`. */
gvqResult_t gvq_ring_reduce_scatter(gvq_coll_ctx_t *ctx, const void *src, void *dst,
                                    size_t recvcount, gvqDataType_t dtype, gvqRedOp_t op);

/* Ring allgather: rank r's `count` elements land at dst + r*count elements on every rank. */
gvqResult_t gvq_ring_allgather(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                               gvqDataType_t dtype);

/* Cut count elements into n segments on granule boundaries (seg_off: n+1 element offsets), as
 * the ring cuts a tensor. */
void gvq_ring_partition(size_t *seg_off, int n, size_t count, size_t granule);
/* gvqSum ring allreduce whose segment s is [seg_off[s], seg_off[s+1]) (n + 1 boundaries on the
 * codec's granule) instead of gvq_ring_partition's: several tensors in one ring, each value in
 * the segment (and so the order of additions) it has when its tensor runs alone. */
gvqResult_t gvq_ring_allreduce_given(gvq_coll_ctx_t *ctx, const gvq_codec_t *codec, const void *src,
                                     void *dst, size_t count, const size_t *seg_off);

/* The ring allreduce's reduce-scatter half (nranks >= 2) over the segments seg_off, its result
 * kept in library memory: on return *own points at this rank's segment of the sum in the
 * context's scratch (valid until the scratch is next asked for), and every send after step 0's
 * came from scratch. The segment is also written into dst (the tensor's layout), chunk by chunk
 * as it is finished. gvqAvg is not divided. src may equal dst. */
gvqResult_t gvq_ring_reduce_scatter_keep(gvq_coll_ctx_t *ctx, const void *src, void *dst,
                                         size_t count, gvqDataType_t dtype, gvqRedOp_t op,
                                         const size_t *seg_off, char **own);

/* Rings over some of the transport's ranks: members[0..n) in ring order (this rank among
 * them), segment p = [seg_off[p], seg_off[p+1]) in element offsets of the whole tensor (the
 * codec sees those offsets, as in a ring over every rank), n + 1 boundaries. */
typedef struct {
    const int *members;
    int n;
    const size_t *seg_off;
} gvq_subring_t;
/* The reduce-scatter half: this rank's segment of the members' sum lands in dst (tensor
 * layout); the rest of dst is left as it was. src may equal dst. gvqAvg is not divided. */
gvqResult_t gvq_subring_reduce_scatter(gvq_coll_ctx_t *ctx, const gvq_subring_t *sub,
                                       const void *src, void *dst, gvqDataType_t dtype,
                                       gvqRedOp_t op);
/* Allreduce of [seg_off[0], seg_off[n]) through codec (no begin hook); gvqAvg is not divided. */
gvqResult_t gvq_subring_allreduce(gvq_coll_ctx_t *ctx, const gvq_subring_t *sub,
                                  const gvq_codec_t *codec, const void *src, void *dst);
/* The allgather half: each member's segment, in place in dst, reaches every member. */
gvqResult_t gvq_subring_allgather(gvq_coll_ctx_t *ctx, const gvq_subring_t *sub, void *dst,
                                  gvqDataType_t dtype);

/* Hierarchical allreduce (hier.c; ctx->hier set): a reduce-scatter among each host's K ranks
 * (K pieces on codec's granule), the allreduce of each piece across the hosts on a ring of its
 * own (the K rings of a host run at once, one piece each) through `codec`, then an allgather
 * among each host's ranks. Only the middle stage is compressed: a codec re-encodes H - 1 times,
 * not N - 1. Bitwise identical on every rank. src may equal dst. A codec with a begin hook needs
 * begin_part (the integer wires: made for H ranks, the summands of the middle stage). */
gvqResult_t gvq_hier_allreduce(gvq_coll_ctx_t *ctx, const gvq_codec_t *codec, const void *src,
                               void *dst, size_t count, gvqRedOp_t op);

/* The same for small vectors (plain): recursive doubling of the whole vector inside each host,
 * then across the hosts among the ranks of one local index; no stage after it. */
/* The context and member list (for gvq_subring_*) of the stages inside this rank's host: the
 * host's own transport (shared memory) when there is one, else ctx's. */
gvq_coll_ctx_t gvq_hier_local_ctx(const gvq_coll_ctx_t *ctx, const int **members);
gvqResult_t gvq_hier_allreduce_small(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                                     gvqDataType_t dtype, gvqRedOp_t op);

/* Hierarchical reduce-scatter and allgather (count values per rank; hier.c): the blocks are
 * laid out piece by piece (piece j: the blocks of every host's local rank j, host by host) in a
 * buffer of the call's own; a reduce-scatter of the K pieces inside the host, then of piece j's
 * H blocks across the hosts on ring j (allgather: across first, then inside). Each host's link
 * carries (H - 1) / H of the whole (reduce-scatter: of the host's sums) in H - 1 steps, against
 * the flat ring's N - 1. gvqAvg divides by N at the end. src may equal dst's own block. */
gvqResult_t gvq_hier_reduce_scatter(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                                    gvqDataType_t dtype, gvqRedOp_t op);
gvqResult_t gvq_hier_allgather(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                               gvqDataType_t dtype);

/* ---- forwards from library memory (direct.c) -----------------------------------------------
 * For transports that copy a send out of the caller's memory (t->stages_sends): the ring's
 * reduce-scatter into scratch, then every rank's block sent straight to every other rank: every
 * send after step 0's comes from library memory, so the caller's bytes are copied twice per
 * rank (one block each: step 0's staged send, the own block into dst; allgather: once) where
 * the staged ring copies 2(N-1) blocks. Same results as the ring, bitwise
 * identical on every rank; not for FIFO transports. src may equal dst. */
gvqResult_t gvq_direct_allreduce(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                                 gvqDataType_t dtype, gvqRedOp_t op);
gvqResult_t gvq_direct_allgather(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                                 gvqDataType_t dtype);

/* Pipelined chain broadcast from `root` (root -> root+1 -> ... ), in chunks. */
gvqResult_t gvq_chain_broadcast(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t bytes,
                                int root);

/* Pipelined chain reduce ending at `root` (root+1 -> root+2 -> ... -> root), in chunks. dst is
 * used on the root only. */
gvqResult_t gvq_chain_reduce(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                             gvqDataType_t dtype, gvqRedOp_t op, int root);

/* ---- small and medium sizes (recursive.c, tree.c) -------------------------------------------
 * Latency-bound algorithms beside the ring, for any rank count (non-powers of two fold). Every
 * rank of an allreduce gets bitwise the same result: one reduction order shared by all ranks.
 * They post receives ahead of sends, so they are not for FIFO transports. src may equal dst
 * (in place; for reduce-scatter and allgather NCCL's in-place layouts). gvqAvg divides last. */

/* Recursive doubling allreduce: ceil(log2 N) (+2 with a fold) rounds of the whole vector. */
gvqResult_t gvq_rd_allreduce(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                             gvqDataType_t dtype, gvqRedOp_t op);
/* Rabenseifner: recursive halving reduce-scatter, then recursive doubling allgather. */
/* Recursive doubling among members[0..n) (this rank among them; their positions take the
 * place of ranks). */
gvqResult_t gvq_rd_allreduce_members(gvq_coll_ctx_t *ctx, const int *members, int n,
                                     const void *src, void *dst, size_t count, gvqDataType_t dtype,
                                     gvqRedOp_t op);
gvqResult_t gvq_rab_allreduce(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                              gvqDataType_t dtype, gvqRedOp_t op);
/* Reduce-scatter by recursive halving: src holds nranks*recvcount, dst gets block `rank`. */
gvqResult_t gvq_rab_reduce_scatter(gvq_coll_ctx_t *ctx, const void *src, void *dst,
                                   size_t recvcount, gvqDataType_t dtype, gvqRedOp_t op);
/* Bruck's allgather: ceil(log2 N) rounds; rank r's block lands at dst + r*count elements. */
gvqResult_t gvq_bruck_allgather(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                                gvqDataType_t dtype);
/* Binomial-tree broadcast from root and reduce to root (dst used on the root only). */
gvqResult_t gvq_tree_broadcast(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t bytes,
                               int root);
gvqResult_t gvq_tree_reduce(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                            gvqDataType_t dtype, gvqRedOp_t op, int root);

/* ---- agreement (agree.c): small collectives that keep every rank's decisions identical ---- */

/* v[0..n) = op over the ranks of v (int32 through the plain ring; every rank calls it in the
 * same order). */
gvqResult_t gvq_agree_i32(gvq_coll_ctx_t *ctx, int32_t *v, int n, gvqRedOp_t op);
/* Arguments that must be equal on every rank: mine[0..n) are gathered from all ranks into
 * all[rank * n + f] (all: nranks * n, may be NULL when only the check is wanted), and every
 * field f whose names[f] is not NULL is compared: the first difference is refused on every rank
 * alike (gvqInvalidArgument) with a WARN naming fn, the rank, the field and both values. */
gvqResult_t gvq_agree_fields(gvq_coll_ctx_t *ctx, const char *fn, const int64_t *mine,
                             const char *const *names, int n, int64_t *all);
/* The smallest and the largest of the ranks' rows mine[0..n) (n <= 16; compared field by field,
 * ties by rank) with the ranks that hold them, the same on every rank: ceil(log2 N) rounds of
 * one small message each (dissemination). Equal extremes mean every rank passed the same row. */
gvqResult_t gvq_agree_extremes(gvq_coll_ctx_t *ctx, const int64_t *mine, int n, int64_t *lo,
                               int *lo_rank, int64_t *hi, int *hi_rank);

/* ---- the signed exchange (recursive.c): the call agreement with a small collective riding along
 * On transports with irecv_upto, gvq_agree_extremes runs it with no payload; a plain allreduce
 * of at most GVQ_SIGNED_MAX_BYTES that would run recursive doubling runs it with its vector, and
 * the other collectives whose exchanged vector is that small across hosts (collectives.c,
 * rides_along) with theirs, so that the agreement costs no round of its own. Every message of it,
 * with or without a payload, follows the same pattern and tag, so ranks whose calls differ still
 * read each other. */
enum { GVQ_SIGNED_MAX_BYTES = 64 * 1024 }; /* on the tag GVQ_TAG_SIGNED */
/* What rides along: every kind, on shared memory and by recursive doubling (the order of the
 * core's collectives: gvq_group.h). */
typedef enum {
    GVQ_PAY_ALLREDUCE,
    GVQ_PAY_BROADCAST,
    GVQ_PAY_REDUCE,
    GVQ_PAY_REDUCE_SCATTER,
    GVQ_PAY_ALLGATHER
} gvq_pay_kind_t;
typedef struct {
    const void *src; /* broadcast: read on the root only */
    void *dst;       /* written only when every rank's row is equal; reduce: on the root only */
    size_t count;    /* elements; reducescatter: of each rank's block (the output's count);
                      * allgather: of each rank's input */
    gvqDataType_t dtype;
    gvqRedOp_t op;
    gvq_pay_kind_t kind; /* GVQ_PAY_ALLREDUCE (0) unless set */
    int root;            /* broadcast and reduce */
} gvq_signed_payload_t;
/* gvq_agree_extremes's result for the rows mine[0..n) and, when pay is not NULL (its vector,
 * gvq_rd_signed_bytes, <= GVQ_SIGNED_MAX_BYTES), the collective: an allreduce bitwise identical
 * to gvq_rd_allreduce's; a reduce and a reducescatter as that allreduce of their inputs (the
 * root's result, each rank's block); an allgather and a broadcast exact. The rows must define the
 * payload's length (count and datatype among them). */
gvqResult_t gvq_rd_signed(gvq_coll_ctx_t *ctx, const int64_t *mine, int n, int64_t *lo,
                          int *lo_rank, int64_t *hi, int *hi_rank, const gvq_signed_payload_t *pay);
/* The bytes of the vector that gvq_rd_signed exchanges for pay on nranks ranks: a reducescatter's
 * whole input and an allgather's whole output (its block among zeros); the count's otherwise. */
size_t gvq_rd_signed_bytes(const gvq_signed_payload_t *pay, int nranks);
/* Extremes as gvq_agree_extremes keeps them: [lo rank, lo row (n), hi rank, hi row (n)].
 * Merge another rank's `in` into `have` (min and max are idempotent: rows seen twice do no
 * harm). */
void gvq_extremes_merge(int64_t *have, const int64_t *in, int n);

/* ---- the shared-memory exchange (shm.c): the same on ranks of one host ---------------------
 * Memory every rank of the communicator maps (made by the core: src/comm/shm_setup.c): per rank two
 * slots (alternate calls), each a header [call numbers, length, row] and slot_data bytes of
 * vector: 1 MiB up to 8 ranks, else 64 KiB (gvq_shm_slot_data). */
enum { GVQ_SHM_SMALL_BYTES = 64 * 1024, GVQ_SHM_MAX_FIELDS = 16, GVQ_SHM_HEADER = 192 };
static inline size_t gvq_shm_slot_data(int nranks) {
    return nranks <= 8 ? (size_t)1 << 20 : (size_t)GVQ_SHM_SMALL_BYTES;
}
typedef struct {
    char *base;       /* nranks x 2 slots of GVQ_SHM_HEADER + slot_data */
    size_t slot_data; /* gvq_shm_slot_data(nranks) */
    int nranks, rank;
    uint64_t calls; /* exchanges made through it so far (this rank's count) */
} gvq_shm_t;
/* Writes this rank's process id (and pid namespace) into its slot, once at the segment's
 * creation: a wait on a rank whose process has ended then fails at once with gvqRemoteError
 * instead of at the timeout (ranks of one host in one pid namespace). */
void gvq_shm_announce(const gvq_shm_t *m);
/* 1 when rank q's process is known to have ended: it announced a pid of this pid namespace, and
 * that pid is gone or a zombie (a pid reused since reads as alive: the timeout still holds). */
int gvq_shm_peer_gone(const gvq_shm_t *m, int q);
/* gvq_rd_signed's result through shared memory: every rank posts its row (and vector) in its
 * slot and reads all the others', so every rank holds every row; with pay the collective of
 * its kind, written to pay->dst only when every row agrees, a slot's worth (a piece) per
 * exchange. Reductions run in rank order ((v0 op v1) op v2 ...): an allreduce piece up to
 * GVQ_SHM_SMALL_BYTES on every rank, above it rank q reduces segment q of every vector and every
 * rank copies the N reduced segments (a second wait between), so the result is bitwise the same
 * on every rank; a reduce the same way with only the root copying; a reducescatter's block q
 * on rank q. Broadcast and allgather copy the posted vectors.
 * Waits are bounded by the transport's timeout and abort flag (then the communicator is
 * broken) and drive the transport's progress. */
gvqResult_t gvq_shm_signed(gvq_coll_ctx_t *ctx, gvq_shm_t *shm, const int64_t *mine, int n,
                           int64_t *lo, int *lo_rank, int64_t *hi, int *hi_rank,
                           const gvq_signed_payload_t *pay);

/* ---- PowerSGD (powersgd.c) -----------------------------------------------------------------
 * One power iteration of PowerSGD (Vogels et al. 2019) on an n x m matrix M stored row-major
 * (M[i][j] at i*m + j), with P (n x r) and Q (m x r) column-major. The caller sums P and Q over
 * the ranks between the steps. Host memory: the codec kernels' products (the same bits on every
 * CPU); other devices' sgemm. No device kernels. */
/* The first Q: standard normal values from Philox keyed by seed alone (the same on every rank). */
void gvq_powersgd_init_q(float *Q, size_t m, size_t r, uint32_t seed);
/* P = M Q (the host: the codec kernels' projection, the same bits on every CPU). */
gvqResult_t gvq_powersgd_project(const gvq_device_ops_t *dev, const float *M, size_t n, size_t m,
                                 size_t r, const float *Q, float *P);
/* P = M Q, then M = M - P Q^T: the bits of gvq_powersgd_project then gvq_powersgd_expand(-1, 1),
 * on the host in one sweep over M. */
gvqResult_t gvq_powersgd_project_residual(const gvq_device_ops_t *dev, float *M, size_t n, size_t m,
                                          size_t r, const float *Q, float *P);
/* Q = M^T P. */
gvqResult_t gvq_powersgd_back(const gvq_device_ops_t *dev, const float *M, size_t n, size_t m,
                              size_t r, const float *P, float *Q);
/* out (row-major n x m) = alpha P Q^T + beta out. */
gvqResult_t gvq_powersgd_expand(const gvq_device_ops_t *dev, size_t n, size_t m, size_t r,
                                const float *P, const float *Q, float alpha, float beta,
                                float *out);
/* Orthonormalise P's columns in place (modified Gram-Schmidt, two sweeps, dot products in
 * double; deterministic). A column left with less than 1e-4 of its norm by the projections (a
 * zero or dependent column, or a non-finite one) is replaced by the unit vector e_i least covered
 * by the columns before it, orthogonalised against them. Returns how many columns were replaced.
 * Needs r <= n. */
size_t gvq_powersgd_orthonormalize(float *P, size_t n, size_t r);

/* ---- codec_watch.c: a codec watched for what its encodes drop ----------------------------
 * codec is inner with every encode_combine also writing r[off .. off+count) = (decode(in) +
 * local) - decode(out) (in NULL: local - decode(out)); fini frees its scratch. */
typedef struct {       /* both wrappers of the file begin with this */
    gvq_codec_t codec; /* what the ring runs */
    const gvq_codec_t *inner;
} gvq_codec_wrap_t;
typedef struct {
    gvq_codec_wrap_t wrap;
    float *r;
    float *tmp;
    size_t tmp_len;
} gvq_watch_t;
void gvq_codec_watch_init(gvq_watch_t *w, const gvq_codec_t *inner, float *r);
void gvq_codec_watch_fini(gvq_watch_t *w);

/* The same file: a codec whose decodes also note whether a value they wrote is NaN or +-Inf (a
 * scan of the chunk just decoded, still in the cache). Where decodes write every output value
 * (the flat ring of a codec whose wire is not the values, gvq_ring_allreduce_tally, any rank
 * count) nonfinite after the call says whether the output holds one, without a pass over it. */
typedef struct {
    gvq_codec_wrap_t wrap;
    int nonfinite;
} gvq_finite_watch_t;
void gvq_codec_finite_watch_init(gvq_finite_watch_t *f, const gvq_codec_t *inner);

/* ---- factor_ring.c: several tensors' low-rank factors in one ring -------------------------
 * Each factor column-major rows x cols, summed in place; fp32 (bits 0) or the integer-summed
 * wire (bits 8 or 16) with one scale per column, its rounding keyed by (seed, rank, call).
 * ctx->hier set: hierarchical (gvq_hier_allreduce), the integer wire between the hosts only. */
typedef struct {
    float *buf;
    size_t rows, cols;
} gvq_factor_t;
/* What a factor ring keeps from one call to the next (the caller owns it: a compressor's state):
 * the ring buffer and the column lengths, grown on demand, and the integer wire's state, made
 * again only when the columns, width or ranks change. Zeroed to start; gvq_factor_ws_fini. */
typedef struct {
    float *buf;
    size_t cap;
    size_t *col_len, ccap, ncol;
    gvq_intsum_t is;
    int is_nranks;
    uint32_t is_seed, is_rank;
} gvq_factor_ws_t;
void gvq_factor_ws_fini(gvq_factor_ws_t *ws);
/* ws may be NULL (everything made and freed in the call). */
gvqResult_t gvq_factor_ring(gvq_coll_ctx_t *ctx, int bits, const gvq_factor_t *f, size_t n,
                            uint32_t seed, uint32_t call, gvq_factor_ws_t *ws);
/* With ctx->hier: the factors summed across the hosts only, on this rank's ring of the same
 * local rank on every host (each local rank's ring sums factors of its own shapes; an integer
 * wire's column scales agreed over all ranks, its headroom H's). Collective over all ranks of
 * ctx (the scales), also where this rank has no values. Without ctx->hier: gvq_factor_ring. */
gvqResult_t gvq_factor_ring_across(gvq_coll_ctx_t *ctx, int bits, const gvq_factor_t *f, size_t n,
                                   uint32_t seed, uint32_t call, gvq_factor_ws_t *ws);

#endif /* GVQ_ALGO_H_ */
