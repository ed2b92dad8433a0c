/*
 * ps.c -- the parameter server of a sparse variable (ALGORITHMS.md section 4): handles and their
 * config, push / apply / pull over the row exchange of algorithms/sparse_exchange.c, save/load,
 * and the partition tuner's driver (its math is algorithms/sparse_tune.c).
 *
 * The shards are colocated with the workers, as in Parallax: shard s lives on rank s mod N, and
 * each rank keeps its shards' rows in one array of slots (gvq_part_t maps row -> rank, slot).
 *
 *   push:  check rows -> merge duplicates -> (local aggregation: host members -> host leader,
 *          merged there) -> one block per owning rank -> headers + blocks all-to-all ->
 *          every received block checked (in range, ascending, held here) -> summed into the
 *          pending gradient of its slots (all or nothing: a refusal anywhere, announced in the
 *          headers, or a malformed block leaves every shard as it was)
 *   apply: the rule on every pending slot, then the sums are cleared (local)
 *   pull:  unique indices -> requests per owner (headers + index blocks) -> each owner checks
 *          the request and answers {status, rows} -> rows scattered to the caller's order
 *
 * Everything is synchronous: a shard serves pushes and pulls inside the same calls on its own
 * rank. Asynchronous push/pull would need a progress thread per rank serving its shards; it is
 * not offered (the host backend has none, and the training layer above steps synchronously).
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gvq_comm.h"
#include "gvq_rng.h"
#include "gvq_sparse.h"

#define GVQ_PS_MAGIC 0x67767350u      /* 'gvqP' */
#define PS_SAVE_MAGIC 0x3153505152564721ull /* "!GVRQPS1" */
#define PS_MAX_PARTITIONS (1 << 24)


typedef struct {
    int partitions, partitioning, rule, average, local_agg, init;
    double lr, mu, ada_init, eps, init_scale;
    unsigned long long seed;
    const void *init_values;
} ps_cfg_t;

struct gvqPs {
    uint32_t magic;
    gvqComm_t comm;
    uint64_t rows;
    size_t dim, esize, rb;
    gvqDataType_t dtype;
    ps_cfg_t cfg;
    gvq_part_t map;
    size_t nlocal;        /* slots (rows) held here */
    char *w, *s, *g;      /* values, rule state (NULL for SGD), pending gradient sums */
    uint8_t *touched;     /* per slot: pending */
    uint64_t *tlist;      /* pending slots, in the order first touched */
    size_t ntouched;
    int hosts, leader;    /* distinct hosts; the lowest rank of this rank's host */
    uint8_t *same_host;   /* per rank: on this rank's host */
    gvqPsStats_t st;
};

/* ---- config ------------------------------------------------------------------------------- */

static gvqResult_t resolve_cfg(const gvqPsConfig_t *in, int nranks, gvqDataType_t dtype,
                               ps_cfg_t *o) {
    const char *fn = "gvqPsCreate";
    gvqPsConfig_t def = GVQ_PS_CONFIG_INITIALIZER;
    if (in == NULL) in = &def;
    if (in->magic != GVQ_PS_CONFIG_MAGIC || in->size != sizeof(gvqPsConfig_t) ||
        in->version > GVQ_VERSION) {
        GVQ_WARN("%s: config not made with GVQ_PS_CONFIG_INITIALIZER (magic 0x%x size %zu "
                 "version %u)", fn, in->magic, in->size, in->version);
        return gvqInvalidArgument;
    }
#define PS_INT(f, d) (in->f == GVQ_CONFIG_UNDEF_INT ? (d) : in->f)
#define PS_DBL(f, d) (in->f == -1.0 ? (d) : in->f)
    o->partitions = PS_INT(partitions, nranks);
    o->partitioning = PS_INT(partitioning, gvqPsHashed);
    o->rule = PS_INT(rule, gvqPsSgd);
    o->average = PS_INT(average, 0);
    o->local_agg = PS_INT(localAggregation, 0);
    o->init = PS_INT(init, gvqPsInitZero);
    o->lr = PS_DBL(learningRate, 0.01);
    o->mu = PS_DBL(momentum, 0.9);
    o->ada_init = PS_DBL(adagradInit, 0.1);
    o->eps = PS_DBL(epsilon, 1e-7);
    o->init_scale = PS_DBL(initScale, 0.05);
    o->seed = in->seed;
    o->init_values = in->initValues;
#undef PS_INT
#undef PS_DBL
    const char *bad = NULL;
    char why[160];
    if (o->partitions < 1 || o->partitions > PS_MAX_PARTITIONS)
        snprintf(why, sizeof why, "partitions %d is outside [1, %d]", o->partitions,
                 PS_MAX_PARTITIONS), bad = why;
    else if (o->partitioning != gvqPsHashed && o->partitioning != gvqPsContiguous)
        snprintf(why, sizeof why, "partitioning %d is unknown", o->partitioning), bad = why;
    else if (o->rule != gvqPsSgd && o->rule != gvqPsMomentum && o->rule != gvqPsAdagrad)
        snprintf(why, sizeof why, "rule %d is unknown", o->rule), bad = why;
    else if (!(o->lr > 0.0) || !isfinite(o->lr))
        snprintf(why, sizeof why, "learningRate %g is not > 0", o->lr), bad = why;
    else if (!(o->mu >= 0.0 && o->mu < 1.0))
        snprintf(why, sizeof why, "momentum %g is outside [0, 1)", o->mu), bad = why;
    else if (!(o->ada_init >= 0.0) || !isfinite(o->ada_init))
        snprintf(why, sizeof why, "adagradInit %g is not >= 0", o->ada_init), bad = why;
    else if (!(o->eps >= 0.0) || !isfinite(o->eps))
        snprintf(why, sizeof why, "epsilon %g is not >= 0", o->eps), bad = why;
    else if (o->average != 0 && o->average != 1)
        snprintf(why, sizeof why, "average %d is not 0 or 1", o->average), bad = why;
    else if (o->local_agg != 0 && o->local_agg != 1)
        snprintf(why, sizeof why, "localAggregation %d is not 0 or 1", o->local_agg), bad = why;
    else if (o->init != gvqPsInitZero && o->init != gvqPsInitUniform &&
             o->init != gvqPsInitValues)
        snprintf(why, sizeof why, "init %d is unknown", o->init), bad = why;
    else if (o->init == gvqPsInitValues && o->init_values == NULL)
        snprintf(why, sizeof why, "initValues is NULL with init gvqPsInitValues"), bad = why;
    else if (o->init == gvqPsInitUniform && (!(o->init_scale >= 0.0) || !isfinite(o->init_scale)))
        snprintf(why, sizeof why, "initScale %g is not >= 0", o->init_scale), bad = why;
    if (bad != NULL) {
        GVQ_WARN("%s: config: %s", fn, bad);
        return gvqInvalidArgument;
    }
    (void)dtype;
    return gvqSuccess;
}

/* The live handles, so that a destroyed one is refused without reading freed memory. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static gvqPs_t *live;
static size_t nlive, live_cap;

static int live_index(gvqPs_t ps) {
    for (size_t i = 0; i < nlive; i++)
        if (live[i] == ps) return (int)i;
    return -1;
}

static int ps_live(gvqPs_t ps) {
    pthread_mutex_lock(&live_lock);
    int ok = ps != NULL && live_index(ps) >= 0 && ps->magic == GVQ_PS_MAGIC;
    pthread_mutex_unlock(&live_lock);
    return ok;
}

static gvqResult_t live_add(gvqPs_t ps) {
    pthread_mutex_lock(&live_lock);
    if (nlive == live_cap) {
        size_t cap = live_cap ? 2 * live_cap : 16;
        gvqPs_t *n = realloc(live, cap * sizeof *n);
        if (n == NULL) {
            pthread_mutex_unlock(&live_lock);
            return gvqSystemError;
        }
        live = n;
        live_cap = cap;
    }
    live[nlive++] = ps;
    pthread_mutex_unlock(&live_lock);
    return gvqSuccess;
}

/* Take ps out of the registry; 0 if it was not live. */
static int live_remove(gvqPs_t ps) {
    pthread_mutex_lock(&live_lock);
    int i = ps != NULL ? live_index(ps) : -1;
    if (i >= 0) live[i] = live[--nlive];
    pthread_mutex_unlock(&live_lock);
    return i >= 0;
}

static gvq_coll_ctx_t ctx_of(gvqComm_t c, unsigned long long *sent) {
    gvq_coll_ctx_t ctx = {c->xport, c->dev, c->chunk_bytes, &c->scratch, &c->scratch_bytes, sent};
    return ctx;
}

/* ---- hosts --------------------------------------------------------------------------------- */

/* This process's host: its host name and its network namespace (so ranks in the namespaces of
 * perf/emulate-cluster.sh count as hosts of their own, as they are on the network). */
static uint64_t host_key(void) {
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    struct stat sb;
    if (stat("/proc/self/ns/net", &sb) == 0)
        h = (h ^ (uint64_t)sb.st_ino) * 0x100000001b3ull, h ^= (uint64_t)sb.st_dev << 17;
    return h;
}

/* Exchange host keys; count hosts, find this rank's leader and host members. The caller has
 * entered the communicator. */
static gvqResult_t hosts_of(gvqComm_t c, int *hosts, int *leader, uint8_t *same_host) {
    int N = c->nranks;
    uint64_t mine = host_key(), *all = calloc((size_t)N, sizeof *all);
    if (all == NULL) return gvqSystemError;
    gvq_coll_ctx_t ctx = ctx_of(c, NULL);
    gvqResult_t res = gvq_ring_allgather(&ctx, &mine, all, 1, gvqUint64);
    if (res == gvqSuccess) {
        *hosts = 0;
        *leader = -1;
        for (int p = 0; p < N; p++) {
            int first = 1;
            for (int q = 0; q < p; q++) first &= all[q] != all[p];
            *hosts += first;
            if (same_host != NULL) same_host[p] = all[p] == mine;
            if (all[p] == mine && *leader < 0) *leader = p;
        }
    }
    free(all);
    return res;
}

/* Every rank must create the server with the same shape and partitioning: compare them all,
 * so that every rank refuses alike. */
static gvqResult_t agree(gvqComm_t c, const char *fn, const int64_t shape[6]) {
    static const char *const what[6] = {"rows", "dim", "datatype", "partitions", "partitioning",
                                        "rule"};
    int N = c->nranks;
    int64_t(*all)[6] = calloc((size_t)N, sizeof *all);
    if (all == NULL) return gvqSystemError;
    gvq_coll_ctx_t ctx = ctx_of(c, NULL);
    gvqResult_t res = gvq_ring_allgather(&ctx, shape, all, 6, gvqInt64);
    for (int p = 0; p < N && res == gvqSuccess; p++)
        for (int f = 0; f < 6; f++)
            if (all[p][f] != shape[f]) {
                GVQ_WARN("%s: rank %d passed %s %lld, this rank %lld (must be equal on every rank)",
                         fn, p, what[f], (long long)all[p][f], (long long)shape[f]);
                res = gvqInvalidArgument;
                break;
            }
    free(all);
    return res;
}

/* ---- create / destroy ------------------------------------------------------------------------ */

static void ps_free(gvqPs_t ps) {
    if (ps == NULL) return;
    gvq_part_fini(&ps->map);
    free(ps->w);
    free(ps->s);
    free(ps->g);
    free(ps->touched);
    free(ps->tlist);
    free(ps->same_host);
    ps->magic = 0;
    free(ps);
}

/* Initial values of the slots held here. */
static void ps_init_values(gvqPs_t ps) {
    int r = ps->comm->rank;
    uint32_t key[2] = {(uint32_t)ps->cfg.seed, (uint32_t)(ps->cfg.seed >> 32)};
    for (size_t slot = 0; slot < ps->nlocal; slot++) {
        uint64_t row = gvq_part_row_of(&ps->map, r, slot);
        char *w = ps->w + slot * ps->rb;
        if (ps->cfg.init == gvqPsInitValues) {
            memcpy(w, (const char *)ps->cfg.init_values + row * ps->rb, ps->rb);
        } else if (ps->cfg.init == gvqPsInitUniform) {
            uint32_t out[4];
            for (size_t j = 0; j < ps->dim; j++) {
                if (j % 4 == 0) {
                    uint32_t ctr[4] = {(uint32_t)row, (uint32_t)(row >> 32), (uint32_t)(j / 4),
                                       0x5053u};
                    gvq_philox4x32_10(ctr, key, out);
                }
                double v = (2.0 * gvq_u01(out[j % 4]) - 1.0) * ps->cfg.init_scale;
                if (ps->dtype == gvqFloat32) ((float *)w)[j] = (float)v;
                else ((double *)w)[j] = v;
            }
        }
        if (ps->s != NULL && ps->cfg.rule == gvqPsAdagrad)
            for (size_t j = 0; j < ps->dim; j++) {
                if (ps->dtype == gvqFloat32)
                    ((float *)(ps->s + slot * ps->rb))[j] = (float)ps->cfg.ada_init;
                else
                    ((double *)(ps->s + slot * ps->rb))[j] = ps->cfg.ada_init;
            }
    }
}

GVQ_API gvqResult_t gvqPsCreate(gvqComm_t comm, size_t rows, size_t dim, gvqDataType_t datatype,
                                const gvqPsConfig_t *config, gvqPs_t *out) {
    const char *fn = "gvqPsCreate";
    if (out == NULL) {
        GVQ_WARN("%s: ps is NULL", fn);
        return gvqInvalidArgument;
    }
    GVQCHECK(gvq_comm_check(comm, fn, 1));
    if (datatype != gvqFloat32 && datatype != gvqFloat64) {
        GVQ_WARN("%s: datatype %d: a parameter server holds gvqFloat32 or gvqFloat64", fn,
                 (int)datatype);
        return gvqInvalidArgument;
    }
    if (rows == 0 || rows > ((uint64_t)1 << 48)) {
        GVQ_WARN("%s: rows %zu is outside [1, 2^48]", fn, rows);
        return gvqInvalidArgument;
    }
    if (dim == 0 || dim > ((size_t)1 << 24)) {
        GVQ_WARN("%s: dim %zu is outside [1, 2^24]", fn, dim);
        return gvqInvalidArgument;
    }
    ps_cfg_t cfg;
    GVQCHECK(resolve_cfg(config, comm->nranks, datatype, &cfg));
    gvqPs_t ps = calloc(1, sizeof *ps);
    if (ps == NULL) return gvqSystemError;
    gvqResult_t res = gvqSuccess;
    ps->comm = comm;
    ps->rows = rows;
    ps->dim = dim;
    ps->dtype = datatype;
    ps->esize = gvq_dtype_size(datatype);
    ps->rb = dim * ps->esize;
    ps->cfg = cfg;
    GVQCHECKGOTO(gvq_part_init(&ps->map, rows, (uint64_t)cfg.partitions, comm->nranks,
                               cfg.partitioning == gvqPsContiguous ? GVQ_PART_CONTIGUOUS
                                                                   : GVQ_PART_HASHED),
                 res, err_free);
    ps->nlocal = ps->map.rank_rows[comm->rank];
    if (ps->nlocal > SIZE_MAX / ps->rb) {
        GVQ_WARN("%s: %zu rows of %zu bytes do not fit the address space", fn, ps->nlocal, ps->rb);
        res = gvqInvalidArgument;
        goto err_free;
    }
    size_t nb = GVQ_MAX(ps->nlocal * ps->rb, (size_t)1);
    ps->w = calloc(1, nb);
    ps->g = calloc(1, nb);
    ps->s = cfg.rule == gvqPsSgd ? NULL : calloc(1, nb);
    ps->touched = calloc(GVQ_MAX(ps->nlocal, (size_t)1), 1);
    ps->tlist = malloc(GVQ_MAX(ps->nlocal, (size_t)1) * sizeof *ps->tlist);
    ps->same_host = calloc((size_t)comm->nranks, 1);
    if (ps->w == NULL || ps->g == NULL || (cfg.rule != gvqPsSgd && ps->s == NULL) ||
        ps->touched == NULL || ps->tlist == NULL || ps->same_host == NULL) {
        GVQ_WARN("%s: cannot allocate %zu rows of %zu bytes", fn, ps->nlocal, ps->rb);
        res = gvqSystemError;
        goto err_free;
    }
    ps_init_values(ps);
    int64_t shape[6] = {(int64_t)rows, (int64_t)dim, (int64_t)datatype, cfg.partitions,
                        cfg.partitioning, cfg.rule};
    GVQCHECKGOTO(gvq_comm_enter(comm, fn), res, err_free);
    res = hosts_of(comm, &ps->hosts, &ps->leader, ps->same_host);
    if (res == gvqSuccess) res = agree(comm, fn, shape);
    gvq_comm_leave(comm);
    if (res != gvqSuccess) goto err_free;
    ps->st.partitions = cfg.partitions;
    ps->st.shards = comm->rank < cfg.partitions
                        ? (cfg.partitions - comm->rank + comm->nranks - 1) / comm->nranks
                        : 0;
    ps->st.localRows = ps->nlocal;
    ps->st.hosts = ps->hosts;
    ps->magic = GVQ_PS_MAGIC;
    GVQCHECKGOTO(live_add(ps), res, err_free);
    *out = ps;
    GVQ_INFO("%s: %zu x %zu %s, %d partitions (%s), rule %d; %zu rows here, %d host(s)", fn, rows,
             dim, gvq_dtype_name(datatype), cfg.partitions,
             cfg.partitioning == gvqPsContiguous ? "contiguous" : "hashed", cfg.rule, ps->nlocal,
             ps->hosts);
    return gvqSuccess;
err_free:
    ps_free(ps);
    return res;
}

GVQ_API gvqResult_t gvqPsDestroy(gvqPs_t ps) {
    if (!live_remove(ps)) {
        GVQ_WARN("gvqPsDestroy: ps is %s", ps == NULL ? "NULL" : "not a live parameter server");
        return gvqInvalidArgument;
    }
    ps_free(ps);
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqPsGetStats(gvqPs_t ps, gvqPsStats_t *stats) {
    if (!ps_live(ps) || stats == NULL) {
        GVQ_WARN("gvqPsGetStats: %s", stats == NULL ? "stats is NULL" : "not a live parameter server");
        return gvqInvalidArgument;
    }
    *stats = ps->st;
    stats->pendingRows = ps->ntouched;
    return gvqSuccess;
}

/* ---- shared checks -------------------------------------------------------------------------- */

/* The checks of push and pull that do not depend on the rows. */
static gvqResult_t check_call(gvqPs_t ps, const char *fn) {
    if (!ps_live(ps)) {
        GVQ_WARN("%s: ps is %s", fn, ps == NULL ? "NULL" : "not a live parameter server");
        return gvqInvalidArgument;
    }
    if (gvq_group_active()) {
        GVQ_WARN("%s: not allowed inside gvqGroupStart/gvqGroupEnd", fn);
        return gvqInvalidUsage;
    }
    return gvqSuccess;
}

/* The rows a caller gave: 1 (refused, with a WARN) or 0. */
static int refuse_rows(gvqPs_t ps, const char *fn, const int64_t *idx, const void *vals,
                       const char *vname, size_t n) {
    if (n > 0 && (idx == NULL || vals == NULL)) {
        GVQ_WARN("%s: %s is NULL with n %zu", fn, idx == NULL ? "indices" : vname, n);
        return 1;
    }
    size_t bad = gvq_sparse_find_out_of_range(idx, n, ps->rows);
    if (bad < n) {
        GVQ_WARN("%s: indices[%zu] = %lld is outside [0, rows = %llu)", fn, bad,
                 (long long)idx[bad], (unsigned long long)ps->rows);
        return 1;
    }
    return 0;
}

/* A block received by a shard: indices in range, strictly ascending, held here. Returns the
 * first bad position or n. */
static size_t check_block(gvqPs_t ps, const int64_t *idx, size_t n, int owner_check) {
    size_t bad = gvq_sparse_find_out_of_range(idx, n, ps->rows);
    size_t uns = gvq_sparse_find_unsorted(idx, n);
    bad = GVQ_MIN(bad, uns);
    if (owner_check)
        for (size_t i = 0; i < bad; i++) {
            int rk;
            uint64_t slot;
            gvq_part_locate(&ps->map, (uint64_t)idx[i], &rk, &slot);
            if (rk != ps->comm->rank) return i;
        }
    return bad;
}

/* ---- push ------------------------------------------------------------------------------------ */

/* Add rows (indices ascending, held here) to the pending sums. */
static gvqResult_t accumulate(gvqPs_t ps, const int64_t *idx, const char *vals, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int rk;
        uint64_t slot;
        gvq_part_locate(&ps->map, (uint64_t)idx[i], &rk, &slot);
        char *g = ps->g + slot * ps->rb;
        if (!ps->touched[slot]) {
            ps->touched[slot] = 1;
            ps->tlist[ps->ntouched++] = slot;
            memcpy(g, vals + i * ps->rb, ps->rb);
        } else {
            GVQCHECK(ps->comm->dev->reduce(g, g, vals + i * ps->rb, ps->dim, ps->dtype, gvqSum));
        }
    }
    return gvqSuccess;
}

typedef struct {
    int64_t *idx;  /* merged rows of this rank */
    char *val;
    size_t n;
} rowset_t;

/* Local aggregation: the members of a host send their merged rows to its leader, which merges
 * them with its own (rank order). *status becomes 1 on the leader when a member refused or sent
 * a malformed block (then *malformed tells which); a member's rows become empty. */
static gvqResult_t aggregate_local(gvqPs_t ps, rowset_t *mine, int64_t *status, int *malformed,
                                   gvq_sx_bytes_t *bytes) {
    gvqComm_t c = ps->comm;
    int N = c->nranks, r = c->rank;
    gvqResult_t res = gvqSuccess;
    uint8_t *smask = calloc((size_t)N, 1), *rmask = calloc((size_t)N, 1);
    size_t *cap = calloc((size_t)N, sizeof *cap);
    gvq_sx_block_t *send = calloc((size_t)N, sizeof *send), *recv = calloc((size_t)N, sizeof *recv);
    char *blk = NULL, *cat_v = NULL, *mv = NULL;
    int64_t *cat_i = NULL, *mi = NULL;
    if (!smask || !rmask || !cap || !send || !recv) {
        res = gvqSystemError;
        goto out;
    }
    if (r != ps->leader) {
        smask[ps->leader] = 1;
        send[ps->leader].status = *status;
        send[ps->leader].nrows = *status ? 0 : mine->n;
        if (mine->n && !*status) {
            blk = malloc(mine->n * (8 + ps->rb));
            if (blk == NULL) {
                res = gvqSystemError;
                goto out;
            }
            memcpy(blk, mine->idx, mine->n * 8);
            memcpy(blk + mine->n * 8, mine->val, mine->n * ps->rb);
            send[ps->leader].buf = blk;
        }
    } else {
        for (int p = 0; p < N; p++) rmask[p] = p != r && ps->same_host[p];
    }
    for (int p = 0; p < N; p++) cap[p] = ps->rows;
    GVQCHECKGOTO(gvq_sx_alltoallv(&(gvq_coll_ctx_t){c->xport, c->dev, c->chunk_bytes, &c->scratch,
                                                    &c->scratch_bytes, NULL},
                                  GVQ_SX_PUSH_LOCAL, ps->rb, send, smask, cap, rmask, recv, bytes),
                 res, out);
    if (r != ps->leader) { /* the leader pushes for this rank now */
        mine->n = 0;
        goto out;
    }
    size_t total = mine->n;
    for (int p = 0; p < N; p++) {
        if (!rmask[p]) continue;
        if (recv[p].status != 0) {
            GVQ_WARN("gvqPsPush: rank %d (same host) refused its rows; the push is refused", p);
            *status = 1;
        }
        size_t k = recv[p].nrows, bad = check_block(ps, recv[p].buf, k, 0);
        if (bad < k) {
            GVQ_WARN("gvqPsPush: rank %d (same host) sent a malformed block: row %zu has index "
                     "%lld (out of range or not ascending); the push is refused",
                     p, bad, (long long)((int64_t *)recv[p].buf)[bad]);
            *status = 1;
            *malformed = 1;
        }
        total += k;
    }
    if (*status || total == mine->n) goto out;
    /* own rows and the members', in rank order, merged */
    cat_i = malloc(total * 8);
    cat_v = malloc(total * ps->rb);
    mi = malloc(total * 8);
    mv = malloc(total * ps->rb);
    if (!cat_i || !cat_v || !mi || !mv) {
        res = gvqSystemError;
        goto out;
    }
    size_t at = 0;
    for (int p = 0; p < N; p++) {
        const int64_t *pi = p == r ? mine->idx : (rmask[p] ? recv[p].buf : NULL);
        size_t k = p == r ? mine->n : (rmask[p] ? recv[p].nrows : 0);
        if (k == 0) continue;
        const char *pv = p == r ? mine->val : (const char *)recv[p].buf + k * 8;
        memcpy(cat_i + at, pi, k * 8);
        memcpy(cat_v + at * ps->rb, pv, k * ps->rb);
        at += k;
    }
    size_t m = 0;
    GVQCHECKGOTO(gvq_sparse_merge(c->dev, ps->dtype, ps->dim, cat_i, cat_v, total, mi, mv, &m), res,
                 out);
    free(mine->idx);
    free(mine->val);
    mine->idx = mi;
    mine->val = mv;
    mine->n = m;
    mi = NULL;
    mv = NULL;
out:
    for (int p = 0; recv != NULL && p < N; p++) free(recv[p].buf);
    free(cat_i), free(cat_v), free(mi), free(mv), free(blk);
    free(smask), free(rmask), free(cap), free(send), free(recv);
    return res;
}

static gvqResult_t push_entered(gvqPs_t ps, const int64_t *idx, const void *grads, size_t n,
                                int refused) {
    const char *fn = "gvqPsPush";
    gvqComm_t c = ps->comm;
    int N = c->nranks, r = c->rank;
    size_t rb = ps->rb, rowb = 8 + rb;
    gvq_sx_bytes_t bytes = {0, 0};
    gvqResult_t res = gvqSuccess;
    int64_t status = refused;
    int malformed = 0;
    rowset_t mine = {NULL, NULL, 0};
    gvq_sx_block_t *send = calloc((size_t)N, sizeof *send), *recv = calloc((size_t)N, sizeof *recv);
    size_t *cnt = calloc((size_t)N, sizeof *cnt), *cap = calloc((size_t)N, sizeof *cap);
    int *owner = NULL;
    if (!send || !recv || !cnt || !cap) {
        res = gvqSystemError;
        goto out;
    }
    if (!refused && n > 0) {
        mine.idx = malloc(n * 8);
        mine.val = malloc(n * rb);
        if (!mine.idx || !mine.val) {
            res = gvqSystemError;
            goto out;
        }
        GVQCHECKGOTO(gvq_sparse_merge(c->dev, ps->dtype, ps->dim, idx, grads, n, mine.idx,
                                      mine.val, &mine.n),
                     res, out);
    }
    int host_members = 0;
    for (int p = 0; p < N; p++) host_members += ps->same_host[p];
    if (ps->cfg.local_agg && host_members > 1)
        GVQCHECKGOTO(aggregate_local(ps, &mine, &status, &malformed, &bytes), res, out);
    /* one block per owning rank; this rank's own rows stay here */
    owner = malloc(GVQ_MAX(mine.n, (size_t)1) * sizeof *owner);
    if (owner == NULL) {
        res = gvqSystemError;
        goto out;
    }
    for (size_t i = 0; i < mine.n; i++) {
        uint64_t slot;
        gvq_part_locate(&ps->map, (uint64_t)mine.idx[i], &owner[i], &slot);
        cnt[owner[i]]++;
    }
    for (int p = 0; p < N; p++) {
        send[p].status = status;
        send[p].nrows = status ? 0 : cnt[p];
        cap[p] = ps->nlocal;
        if (p == r || send[p].nrows == 0) continue;
        send[p].buf = malloc(cnt[p] * rowb);
        if (send[p].buf == NULL) {
            res = gvqSystemError;
            goto out;
        }
        cnt[p] = 0; /* reused as the fill position */
    }
    for (size_t i = 0; i < mine.n && !status; i++) {
        int p = owner[i];
        if (p == r) continue;
        char *b = send[p].buf;
        size_t k = send[p].nrows, at = cnt[p]++;
        memcpy(b + at * 8, &mine.idx[i], 8);
        memcpy(b + k * 8 + at * rb, mine.val + i * rb, rb);
    }
    gvq_coll_ctx_t ctx = ctx_of(c, NULL);
    GVQCHECKGOTO(gvq_sx_alltoallv(&ctx, GVQ_SX_PUSH, rb, send, NULL, cap, NULL, recv, &bytes), res,
                 out);
    /* all or nothing: every refusal and every malformed block before the first sum */
    int peer_refused = -1;
    for (int p = 0; p < N; p++) {
        if (p == r) continue;
        if (recv[p].status != 0 && peer_refused < 0) peer_refused = p;
        size_t k = recv[p].nrows, bad = check_block(ps, recv[p].buf, k, 1);
        if (bad < k) {
            GVQ_WARN("%s: rank %d sent a malformed block: row %zu has index %lld (out of range, "
                     "not ascending or not held by rank %d); this rank's shards discard the push",
                     fn, p, bad, (long long)((int64_t *)recv[p].buf)[bad], r);
            malformed = 1;
        }
    }
    if (refused) {
        res = gvqInvalidArgument; /* warned by the caller; the last WARN */
    } else if (malformed) {
        res = gvqRemoteError;
    } else if (status) {
        GVQ_WARN("%s: a rank of this host refused its rows; no shard changed", fn);
        res = gvqRemoteError;
    } else if (peer_refused >= 0) {
        GVQ_WARN("%s: rank %d refused its rows (see its log); no shard changed", fn, peer_refused);
        res = gvqRemoteError;
    }
    if (res != gvqSuccess) goto out;
    /* sums in rank order: own rows at position r */
    for (int p = 0; p < N; p++) {
        if (p == r) {
            for (size_t i = 0; i < mine.n; i++)
                if (owner[i] == r)
                    GVQCHECKGOTO(accumulate(ps, &mine.idx[i], mine.val + i * rb, 1), res, out);
        } else if (recv[p].nrows > 0) {
            size_t k = recv[p].nrows;
            GVQCHECKGOTO(accumulate(ps, recv[p].buf, (char *)recv[p].buf + k * 8, k), res, out);
        }
    }
    ps->st.pushes++;
out:
    ps->st.bytesSent += bytes.sent;
    ps->st.bytesReceived += bytes.received;
    for (int p = 0; p < N && send != NULL; p++) free(send[p].buf);
    for (int p = 0; p < N && recv != NULL; p++) free(recv[p].buf);
    free(send), free(recv), free(cnt), free(cap), free(owner);
    free(mine.idx), free(mine.val);
    return res;
}

GVQ_API gvqResult_t gvqPsPush(gvqPs_t ps, const int64_t *indices, const void *grads, size_t n) {
    const char *fn = "gvqPsPush";
    GVQCHECK(check_call(ps, fn));
    int refused = refuse_rows(ps, fn, indices, grads, "grads", n);
    GVQCHECK(gvq_comm_enter(ps->comm, fn));
    gvqResult_t res = push_entered(ps, indices, grads, n, refused);
    gvq_comm_leave(ps->comm);
    return res;
}

/* ---- apply ----------------------------------------------------------------------------------- */

GVQ_API gvqResult_t gvqPsApply(gvqPs_t ps) {
    if (!ps_live(ps)) {
        GVQ_WARN("gvqPsApply: ps is %s", ps == NULL ? "NULL" : "not a live parameter server");
        return gvqInvalidArgument;
    }
    gvq_rule_t rule = {ps->cfg.rule, ps->cfg.lr, ps->cfg.mu, ps->cfg.eps,
                       ps->cfg.average ? 1.0 / ps->comm->nranks : 1.0};
    for (size_t i = 0; i < ps->ntouched; i++) {
        uint64_t slot = ps->tlist[i];
        gvq_rule_apply(&rule, ps->dtype, ps->dim, ps->w + slot * ps->rb,
                       ps->s != NULL ? ps->s + slot * ps->rb : NULL, ps->g + slot * ps->rb);
        ps->touched[slot] = 0;
    }
    ps->ntouched = 0;
    ps->st.applies++;
    return gvqSuccess;
}

/* ---- pull ------------------------------------------------------------------------------------ */

static int i64_cmp(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static size_t find_sorted(const int64_t *u, size_t n, int64_t v) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (u[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static gvqResult_t pull_entered(gvqPs_t ps, const int64_t *idx, void *values, size_t n,
                                int refused) {
    const char *fn = "gvqPsPull";
    gvqComm_t c = ps->comm;
    int N = c->nranks, r = c->rank;
    size_t rb = ps->rb;
    gvq_sx_bytes_t bytes = {0, 0};
    gvqResult_t res = gvqSuccess;
    int malformed = 0;
    size_t nu = 0;
    int64_t *u = NULL;
    int *owner = NULL;
    size_t *pos = NULL; /* per unique row: its place in its owner's request */
    gvq_sx_block_t *send = calloc((size_t)N, sizeof *send), *recv = calloc((size_t)N, sizeof *recv);
    size_t *cnt = calloc((size_t)N, sizeof *cnt), *cap = calloc((size_t)N, sizeof *cap);
    size_t *sbytes = calloc((size_t)N, sizeof *sbytes), *rbytes = calloc((size_t)N, sizeof *rbytes);
    void **sbuf = calloc((size_t)N, sizeof *sbuf), **rbuf = calloc((size_t)N, sizeof *rbuf);
    if (!send || !recv || !cnt || !cap || !sbytes || !rbytes || !sbuf || !rbuf) {
        res = gvqSystemError;
        goto out;
    }
    if (!refused && n > 0) { /* unique indices, ascending, bucketed by owner */
        u = malloc(n * 8);
        owner = malloc(n * sizeof *owner);
        pos = malloc(n * sizeof *pos);
        if (!u || !owner || !pos) {
            res = gvqSystemError;
            goto out;
        }
        memcpy(u, idx, n * 8);
        qsort(u, n, 8, i64_cmp);
        for (size_t i = 0; i < n; i++)
            if (nu == 0 || u[nu - 1] != u[i]) u[nu++] = u[i];
        for (size_t i = 0; i < nu; i++) {
            uint64_t slot;
            gvq_part_locate(&ps->map, (uint64_t)u[i], &owner[i], &slot);
            pos[i] = owner[i] == r ? slot : cnt[owner[i]]++;
        }
    }
    for (int p = 0; p < N; p++) {
        send[p].status = refused;
        send[p].nrows = p == r ? 0 : cnt[p];
        cap[p] = ps->nlocal;
        if (send[p].nrows == 0) continue;
        send[p].buf = malloc(cnt[p] * 8);
        if (send[p].buf == NULL) {
            res = gvqSystemError;
            goto out;
        }
    }
    for (size_t i = 0; i < nu; i++)
        if (owner[i] != r) ((int64_t *)send[owner[i]].buf)[pos[i]] = u[i];
    gvq_coll_ctx_t ctx = ctx_of(c, NULL);
    GVQCHECKGOTO(gvq_sx_alltoallv(&ctx, GVQ_SX_PULL, 0, send, NULL, cap, NULL, recv, &bytes), res,
                 out);
    /* serve the requests: {status, rows}; a malformed request is answered with status 1 */
    for (int p = 0; p < N; p++) {
        if (p == r) continue;
        if (send[p].nrows > 0) {
            rbytes[p] = 8 + send[p].nrows * rb;
            rbuf[p] = malloc(rbytes[p]);
            if (rbuf[p] == NULL) {
                res = gvqSystemError;
                goto out;
            }
        }
        size_t k = recv[p].nrows;
        if (k == 0) continue;
        sbytes[p] = 8 + k * rb;
        char *reply = calloc(1, sbytes[p]);
        if (reply == NULL) {
            res = gvqSystemError;
            goto out;
        }
        sbuf[p] = reply;
        const int64_t *q = recv[p].buf;
        size_t bad = check_block(ps, q, k, 1);
        int64_t st = 0;
        if (bad < k) {
            GVQ_WARN("%s: rank %d sent a malformed request: row %zu has index %lld (out of range, "
                     "not ascending or not held by rank %d); it is refused",
                     fn, p, bad, (long long)q[bad], r);
            malformed = 1;
            st = 1;
        } else {
            for (size_t i = 0; i < k; i++) {
                int rk;
                uint64_t slot;
                gvq_part_locate(&ps->map, (uint64_t)q[i], &rk, &slot);
                memcpy(reply + 8 + i * rb, ps->w + slot * rb, rb);
            }
        }
        memcpy(reply, &st, 8);
    }
    GVQCHECKGOTO(gvq_sx_exchange(&ctx, sbuf, sbytes, rbuf, rbytes, &bytes), res, out);
    int refused_by = -1;
    for (int p = 0; p < N; p++) {
        if (rbuf[p] == NULL) continue;
        int64_t st;
        memcpy(&st, rbuf[p], 8);
        if (st != 0 && refused_by < 0) refused_by = p;
    }
    if (refused) {
        res = gvqInvalidArgument; /* warned by the caller */
    } else if (refused_by >= 0) {
        GVQ_WARN("%s: rank %d refused this rank's request (see its log); values not written", fn,
                 refused_by);
        res = gvqRemoteError;
    } else if (malformed) {
        res = gvqRemoteError; /* this rank's own rows were still delivered to the others */
    }
    if (res != gvqSuccess) goto out;
    for (size_t i = 0; i < n; i++) {
        size_t j = find_sorted(u, nu, idx[i]);
        const char *src = owner[j] == r ? ps->w + pos[j] * rb
                                        : (const char *)rbuf[owner[j]] + 8 + pos[j] * rb;
        memcpy((char *)values + i * rb, src, rb);
    }
    ps->st.pulls++;
out:
    ps->st.bytesSent += bytes.sent;
    ps->st.bytesReceived += bytes.received;
    for (int p = 0; p < N; p++) {
        if (send != NULL) free(send[p].buf);
        if (recv != NULL) free(recv[p].buf);
        if (sbuf != NULL) free(sbuf[p]);
        if (rbuf != NULL) free(rbuf[p]);
    }
    free(send), free(recv), free(cnt), free(cap), free(sbytes), free(rbytes), free(sbuf);
    free(rbuf), free(u), free(owner), free(pos);
    return res;
}

GVQ_API gvqResult_t gvqPsPull(gvqPs_t ps, const int64_t *indices, void *values, size_t n) {
    const char *fn = "gvqPsPull";
    GVQCHECK(check_call(ps, fn));
    int refused = refuse_rows(ps, fn, indices, values, "values", n);
    GVQCHECK(gvq_comm_enter(ps->comm, fn));
    gvqResult_t res = pull_entered(ps, indices, values, n, refused);
    gvq_comm_leave(ps->comm);
    return res;
}

/* ---- save / load ----------------------------------------------------------------------------- */

typedef struct {
    uint64_t magic, bytes;
    uint64_t rows, dim, dtype, partitions, partitioning, rule, nranks, rank, nlocal, ntouched;
} ps_save_hdr_t;

static size_t ps_save_size(gvqPs_t ps, size_t ntouched) {
    size_t n = sizeof(ps_save_hdr_t) + ps->nlocal * ps->rb;
    if (ps->s != NULL) n += ps->nlocal * ps->rb;
    return n + ntouched * (8 + ps->rb);
}

GVQ_API gvqResult_t gvqPsSave(gvqPs_t ps, void *buf, size_t *size) {
    if (!ps_live(ps) || size == NULL) {
        GVQ_WARN("gvqPsSave: %s", size == NULL ? "size is NULL" : "not a live parameter server");
        return gvqInvalidArgument;
    }
    size_t need = ps_save_size(ps, ps->ntouched);
    if (buf == NULL) {
        *size = need;
        return gvqSuccess;
    }
    if (*size < need) {
        GVQ_WARN("gvqPsSave: buffer of %zu bytes, %zu needed", *size, need);
        *size = need;
        return gvqInvalidArgument;
    }
    ps_save_hdr_t h = {PS_SAVE_MAGIC, need, ps->rows, ps->dim, (uint64_t)ps->dtype,
                       (uint64_t)ps->cfg.partitions, (uint64_t)ps->cfg.partitioning,
                       (uint64_t)ps->cfg.rule, (uint64_t)ps->comm->nranks,
                       (uint64_t)ps->comm->rank, ps->nlocal, ps->ntouched};
    char *p = buf;
    memcpy(p, &h, sizeof h);
    p += sizeof h;
    memcpy(p, ps->w, ps->nlocal * ps->rb);
    p += ps->nlocal * ps->rb;
    if (ps->s != NULL) {
        memcpy(p, ps->s, ps->nlocal * ps->rb);
        p += ps->nlocal * ps->rb;
    }
    for (size_t i = 0; i < ps->ntouched; i++) {
        uint64_t slot = ps->tlist[i];
        memcpy(p, &slot, 8);
        memcpy(p + 8, ps->g + slot * ps->rb, ps->rb);
        p += 8 + ps->rb;
    }
    *size = need;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqPsLoad(gvqPs_t ps, const void *buf, size_t size) {
    const char *fn = "gvqPsLoad";
    if (!ps_live(ps) || buf == NULL) {
        GVQ_WARN("%s: %s", fn, buf == NULL ? "buf is NULL" : "not a live parameter server");
        return gvqInvalidArgument;
    }
    ps_save_hdr_t h;
    if (size < sizeof h) {
        GVQ_WARN("%s: %zu bytes is too short for a saved parameter server", fn, size);
        return gvqInvalidArgument;
    }
    memcpy(&h, buf, sizeof h);
    if (h.magic != PS_SAVE_MAGIC || h.bytes != size) {
        GVQ_WARN("%s: not a saved parameter-server state (magic or size %zu wrong)", fn, size);
        return gvqInvalidArgument;
    }
    if (h.rows != ps->rows || h.dim != ps->dim || h.dtype != (uint64_t)ps->dtype ||
        h.partitions != (uint64_t)ps->cfg.partitions ||
        h.partitioning != (uint64_t)ps->cfg.partitioning || h.rule != (uint64_t)ps->cfg.rule ||
        h.nranks != (uint64_t)ps->comm->nranks || h.rank != (uint64_t)ps->comm->rank ||
        h.nlocal != ps->nlocal) {
        GVQ_WARN("%s: the state was saved from another shape, config or rank (rows %llu dim %llu "
                 "partitions %llu rule %llu rank %llu of %llu)",
                 fn, (unsigned long long)h.rows, (unsigned long long)h.dim,
                 (unsigned long long)h.partitions, (unsigned long long)h.rule,
                 (unsigned long long)h.rank, (unsigned long long)h.nranks);
        return gvqInvalidArgument;
    }
    if (h.ntouched > ps->nlocal || ps_save_size(ps, (size_t)h.ntouched) != size) {
        GVQ_WARN("%s: the saved state's pending rows (%llu) do not match its size", fn,
                 (unsigned long long)h.ntouched);
        return gvqInvalidArgument;
    }
    /* check the pending slots before anything changes */
    const char *pend = (const char *)buf + sizeof h + ps->nlocal * ps->rb * (ps->s != NULL ? 2 : 1);
    uint8_t *seen = calloc(GVQ_MAX(ps->nlocal, (size_t)1), 1);
    if (seen == NULL) return gvqSystemError;
    for (size_t i = 0; i < h.ntouched; i++) {
        uint64_t slot;
        memcpy(&slot, pend + i * (8 + ps->rb), 8);
        if (slot >= ps->nlocal || seen[slot]) {
            GVQ_WARN("%s: pending row %zu names slot %llu, %s", fn, i, (unsigned long long)slot,
                     slot >= ps->nlocal ? "outside the shard" : "twice");
            free(seen);
            return gvqInvalidArgument;
        }
        seen[slot] = 1;
    }
    free(seen);
    const char *p = (const char *)buf + sizeof h;
    memcpy(ps->w, p, ps->nlocal * ps->rb);
    p += ps->nlocal * ps->rb;
    if (ps->s != NULL) {
        memcpy(ps->s, p, ps->nlocal * ps->rb);
        p += ps->nlocal * ps->rb;
    }
    for (size_t i = 0; i < ps->ntouched; i++) ps->touched[ps->tlist[i]] = 0;
    ps->ntouched = 0;
    for (size_t i = 0; i < h.ntouched; i++, p += 8 + ps->rb) {
        uint64_t slot;
        memcpy(&slot, p, 8);
        memcpy(ps->g + slot * ps->rb, p + 8, ps->rb);
        ps->touched[slot] = 1;
        ps->tlist[ps->ntouched++] = slot;
    }
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqPsSaveFile(gvqPs_t ps, const char *path) {
    if (path == NULL) {
        GVQ_WARN("gvqPsSaveFile: path is NULL");
        return gvqInvalidArgument;
    }
    size_t n = 0;
    GVQCHECK(gvqPsSave(ps, NULL, &n));
    void *buf = malloc(n);
    if (buf == NULL) return gvqSystemError;
    gvqResult_t res = gvqPsSave(ps, buf, &n);
    FILE *f = res == gvqSuccess ? fopen(path, "wb") : NULL;
    if (res == gvqSuccess && (f == NULL || fwrite(buf, 1, n, f) != n)) {
        GVQ_WARN("gvqPsSaveFile: cannot write '%s'", path);
        res = gvqSystemError;
    }
    if (f != NULL && fclose(f) != 0 && res == gvqSuccess) {
        GVQ_WARN("gvqPsSaveFile: cannot write '%s'", path);
        res = gvqSystemError;
    }
    free(buf);
    return res;
}

GVQ_API gvqResult_t gvqPsLoadFile(gvqPs_t ps, const char *path) {
    if (path == NULL) {
        GVQ_WARN("gvqPsLoadFile: path is NULL");
        return gvqInvalidArgument;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        GVQ_WARN("gvqPsLoadFile: cannot open '%s'", path);
        return gvqSystemError;
    }
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    void *buf = n > 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)n) : NULL;
    gvqResult_t res = gvqSuccess;
    if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        GVQ_WARN("gvqPsLoadFile: cannot read '%s'", path);
        res = gvqSystemError;
    }
    fclose(f);
    if (res == gvqSuccess) res = gvqPsLoad(ps, buf, (size_t)n);
    free(buf);
    return res;
}

/* ---- partition tuning ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Seconds per iteration of `step` on a fresh server with P partitions: each rank's median over
 * the timed iterations (robust to the odd descheduled step on a busy host), the slowest rank's. */
static gvqResult_t tune_sample(gvqComm_t comm, size_t rows, size_t dim, gvqDataType_t dtype,
                               const gvqPsConfig_t *config, int P, int iters, int skip,
                               gvqPsStepFn_t step, void *user, double *seconds) {
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    if (config != NULL) cfg = *config;
    cfg.partitions = P;
    double *dt = malloc((size_t)iters * sizeof *dt);
    if (dt == NULL) {
        GVQ_WARN("gvqPsTunePartitions: out of memory for %d sample times", iters);
        return gvqSystemError;
    }
    gvqPs_t ps = NULL;
    gvqResult_t res = gvqPsCreate(comm, rows, dim, dtype, &cfg, &ps);
    for (int it = 0; it < iters && res == gvqSuccess; it++) {
        uint64_t t0 = gvq_now_ns();
        res = step(ps, it, user);
        dt[it] = (double)(gvq_now_ns() - t0) * 1e-9;
    }
    if (ps != NULL) gvqPsDestroy(ps);
    double mine = 0.0;
    if (res == gvqSuccess) {
        int m = iters - skip;
        qsort(dt + skip, (size_t)m, sizeof *dt, cmp_double);
        mine = m % 2 ? dt[skip + m / 2] : 0.5 * (dt[skip + m / 2 - 1] + dt[skip + m / 2]);
    }
    free(dt);
    GVQCHECK(res);
    return gvqAllReduce(&mine, seconds, 1, gvqFloat64, gvqMax, comm, NULL);
}

GVQ_API gvqResult_t gvqPsTunePartitions(gvqComm_t comm, size_t rows, size_t dim,
                                        gvqDataType_t datatype, const gvqPsConfig_t *config,
                                        const gvqPsTuneConfig_t *tune, gvqPsStepFn_t step,
                                        void *userData, gvqPsTuneResult_t *result) {
    const char *fn = "gvqPsTunePartitions";
    gvqPsTuneConfig_t def = GVQ_PS_TUNE_CONFIG_INITIALIZER;
    if (tune == NULL) tune = &def;
    if (step == NULL || result == NULL) {
        GVQ_WARN("%s: %s is NULL", fn, step == NULL ? "step" : "result");
        return gvqInvalidArgument;
    }
    GVQCHECK(gvq_comm_check(comm, fn, 0));
    if (tune->magic != GVQ_PS_TUNE_CONFIG_MAGIC || tune->size != sizeof(gvqPsTuneConfig_t) ||
        tune->version > GVQ_VERSION) {
        GVQ_WARN("%s: tune config not made with GVQ_PS_TUNE_CONFIG_INITIALIZER", fn);
        return gvqInvalidArgument;
    }
    int iters = tune->itersPerSample == GVQ_CONFIG_UNDEF_INT ? 100 : tune->itersPerSample;
    int skip = tune->skipIters == GVQ_CONFIG_UNDEF_INT ? iters / 2 : tune->skipIters;
    long dmax = GVQ_MIN((long)GVQ_MIN(rows, (size_t)PS_MAX_PARTITIONS), 64L * comm->nranks);
    int maxp = tune->maxPartitions == GVQ_CONFIG_UNDEF_INT ? (int)dmax : tune->maxPartitions;
    if (iters < 1 || skip < 0 || skip >= iters) {
        GVQ_WARN("%s: itersPerSample %d and skipIters %d: need 0 <= skip < iters", fn, iters, skip);
        return gvqInvalidArgument;
    }
    if (maxp < 1 || maxp > PS_MAX_PARTITIONS) {
        GVQ_WARN("%s: maxPartitions %d is outside [1, %d]", fn, maxp, PS_MAX_PARTITIONS);
        return gvqInvalidArgument;
    }
    int start = tune->startPartitions;
    if (start == GVQ_CONFIG_UNDEF_INT) {
        int leader = 0;
        GVQCHECK(gvq_comm_enter(comm, fn));
        gvqResult_t res = hosts_of(comm, &start, &leader, NULL);
        gvq_comm_leave(comm);
        GVQCHECK(res);
    }
    if (start < 1) {
        GVQ_WARN("%s: startPartitions %d is not >= 1", fn, start);
        return gvqInvalidArgument;
    }
    gvq_ptune_t s;
    /* shards live on rank s mod N: multiples of N keep the ranks' loads equal */
    gvq_ptune_init(&s, start, maxp, comm->nranks);
    for (int P; (P = gvq_ptune_next(&s)) != 0;) {
        double t = 0.0;
        GVQCHECK(tune_sample(comm, rows, dim, datatype, config, P, iters, skip, step, userData, &t));
        GVQ_INFO("%s: P %d: %.6f s per iteration", fn, P, t);
        gvq_ptune_record(&s, t);
    }
    gvqPsTuneResult_t out;
    memset(&out, 0, sizeof out);
    out.nsamples = s.n;
    for (int i = 0; i < s.n; i++) {
        out.partitions[i] = s.Ps[i];
        out.seconds[i] = s.ts[i];
        if (out.bestSampledPartitions == 0 || s.ts[i] < out.bestSampledSeconds)
            out.bestSampledPartitions = s.Ps[i], out.bestSampledSeconds = s.ts[i];
    }
    out.bestPartitions = gvq_ptune_choose(&s, &out.fitOk, out.theta, &out.predictedSeconds);
    *result = out;
    return gvqSuccess;
}
