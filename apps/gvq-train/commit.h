/*
 * commit.h -- gvq-train's commits on disk (--commit-dir, --resume): the state an elastic run
 * keeps in memory at a commit (step, the epoch's place, weights, momentum), written by rank 0 to
 * DIR/gvq-train.commit (a new file renamed over the old, so a crash mid-write leaves the last
 * whole one) and read back by --resume. Beside it each rank writes its compressors' state
 * (gvqTrainSave: error feedback, fitted or tracked bases, counters; a rank's residual is its own)
 * to DIR/gvq-train.agg.RANK; a resume loads them when every rank finds its own of the commit's
 * step, else every rank rebuilds its compressors, as after a shrink.
 *
 * Layout (this host's byte order; the header's magic and version say which): the header below,
 * params[nparams] and velocity[nparams] as float32, then an FNV-1a 64 of every byte before it.
 * A compressor file: commit_agg_hdr_t, the state's bytes, an FNV-1a 64 of every byte before it.
 */
#ifndef GVQ_TRAIN_COMMIT_H_
#define GVQ_TRAIN_COMMIT_H_

#include <stddef.h>
#include <stdint.h>

#define COMMIT_MAGIC "GVQTRCK1"
#define COMMIT_FILE "gvq-train.commit"

#define COMMIT_AGG_MAGIC "GVQTRAG1"
#define COMMIT_AGG_FILE "gvq-train.agg" /* then .RANK */

/* commit_hdr_t.compressors: none in the commit (a resume rebuilds them), or one file per rank */
enum { COMMIT_COMPRESSORS_REBUILT = 0, COMMIT_COMPRESSORS_PER_RANK = 1 };

typedef struct {
    char magic[8];         /* COMMIT_MAGIC */
    uint32_t version;      /* 1 */
    uint32_t header_bytes; /* sizeof(commit_hdr_t) */
    uint64_t nparams;      /* floats in params and in velocity */
    uint64_t model_sig;    /* commit_model_sig: the layers' shapes */
    uint64_t seed;         /* --seed (the epochs' orders follow from it) */
    int64_t step;          /* the next step to run */
    int64_t pos;           /* the next image of the epoch's order */
    int64_t epoch;
    int64_t iters;       /* the run's length (the learning-rate schedule spans it) */
    int32_t nranks;      /* the ranks at the commit */
    int32_t compressors; /* COMMIT_COMPRESSORS_*: where the compressors' state is */
} commit_hdr_t;

typedef struct {
    char magic[8];         /* COMMIT_AGG_MAGIC */
    uint32_t version;      /* 1 */
    uint32_t header_bytes; /* sizeof(commit_agg_hdr_t) */
    uint64_t model_sig;    /* as the commit's */
    uint64_t seed;
    int64_t step;   /* the commit's step */
    int32_t rank;   /* the rank that wrote it, at the commit */
    int32_t nranks; /* the ranks at the commit */
    uint64_t bytes; /* the state's (gvqTrainSave) */
} commit_agg_hdr_t;

/* FNV-1a over the sizes that define the model's layout (every layer's parameter count). */
uint64_t commit_model_sig(size_t nparams, int nsizes, const size_t *sizes);

/* Writes DIR/gvq-train.commit (via DIR/gvq-train.commit.tmp, fsync and rename). 0, or -1 with
 * the cause in err. */
int commit_write(const char *dir, const commit_hdr_t *h, const float *params, const float *velocity,
                 char *err, size_t cap);

/* Reads DIR/gvq-train.commit into h, params and velocity (nparams floats each), after checking
 * magic, version, size, checksum, and that it was made by a model of this layout and seed
 * (want_sig, want_seed): 0, or -1 with the cause in err (nothing else is trusted then). */
int commit_read(const char *dir, commit_hdr_t *h, float *params, float *velocity, size_t nparams,
                uint64_t want_sig, uint64_t want_seed, char *err, size_t cap);

/* Writes DIR/gvq-train.agg.RANK (h->rank; h->bytes of state), as commit_write. */
int commit_agg_write(const char *dir, const commit_agg_hdr_t *h, const void *state, char *err,
                     size_t cap);

/* Reads DIR/gvq-train.agg.RANK after checking magic, version, model, seed, rank, the commit's
 * step (want_step), size and checksum: 0 with the state in *state (malloc'd, h->bytes), or -1
 * with the cause in err. */
int commit_agg_read(const char *dir, int rank, int64_t want_step, uint64_t want_sig,
                    uint64_t want_seed, commit_agg_hdr_t *h, void **state, char *err, size_t cap);

#endif /* GVQ_TRAIN_COMMIT_H_ */
