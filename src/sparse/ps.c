/*
 * ps.c -- the parameter-server handle (gvq_ps.h; docs/ALGORITHMS.md section 4): its config, create
 * and destroy, stats, the registry of live handles, and the checks every entry point shares.
 *
 *   gvqPsCreate:  arguments and config (local, every rank alike)
 *                 -> partition map -> this rank's slots allocated and initialized
 *                 -> enter the communicator: hosts of the ranks (gvq_comm_hosts)
 *                    + shape agreement (allgather of rows, dim, datatype, partitions,
 *                      partitioning, rule; a difference is refused on every rank)
 *                 -> registered live
 *
 * Push and apply are ps_push.c, pull ps_pull.c, save/load ps_save.c, the tuner ps_tune.c.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gvq_handles.h"
#include "gvq_ps.h"
#include "gvq_stream.h"
#include "gvq_rng.h"

/* The live handles, so that a destroyed one is refused without reading freed memory. */
static gvq_handles_t live_servers = GVQ_HANDLES_INITIALIZER;

/* A server whose communicator was destroyed or aborted is orphaned (comm = NULL, by the
 * attachment below): every call but gvqPsDestroy refuses it. */
int gvq_ps_known(gvqPs_t ps) {
    gvq_handles_lock(&live_servers);
    int found = gvq_handles_find_locked(&live_servers, ps) >= 0;
    gvq_handles_unlock(&live_servers);
    return found;
}

int gvq_ps_live(gvqPs_t ps) {
    gvq_handles_lock(&live_servers);
    int found = gvq_handles_find_locked(&live_servers, ps) >= 0,
        orphaned = found && ps->comm == NULL;
    gvq_handles_unlock(&live_servers);
    if (orphaned)
        GVQ_WARN("parameter server %p: its communicator was destroyed or aborted; only "
                 "gvqPsDestroy may still be called",
                 (void *)ps);
    return found && !orphaned;
}

static void orphan(void *state) {
    gvqPs_t ps = state;
    gvq_ps_serve_stop(ps, 1); /* its thread may use the communicator's transport */
    gvq_handles_lock(&live_servers);
    ps->comm = NULL;
    gvq_handles_unlock(&live_servers);
}

/* ---- config ------------------------------------------------------------------------------- */

static gvq_ps_cfg_t cfg_with_defaults(const gvqPsConfig_t *in, int nranks) {
#define PS_INT(f, d) (in->f == GVQ_CONFIG_UNDEF_INT ? (d) : in->f)
#define PS_DBL(f, d) (in->f == -1.0 ? (d) : in->f)
    gvq_ps_cfg_t o = {
        .partitions = PS_INT(partitions, nranks),
        .partitioning = PS_INT(partitioning, gvqPsHashed),
        .rule = PS_INT(rule, gvqPsSgd),
        .average = PS_INT(average, 0),
        .local_aggregation = PS_INT(localAggregation, 0),
        .init = PS_INT(init, gvqPsInitZero),
        .lr = PS_DBL(learningRate, 0.01),
        .momentum = PS_DBL(momentum, 0.9),
        .adagrad_init = PS_DBL(adagradInit, 0.1),
        .eps = PS_DBL(epsilon, 1e-7),
        .init_scale = PS_DBL(initScale, 0.05),
        .seed = in->seed,
        .init_values = in->initValues,
        .stream =
            in->size >= offsetof(gvqPsConfig_t, stream) + sizeof in->stream ? in->stream : NULL,
        .serve =
            in->size >= offsetof(gvqPsConfig_t, serve) + sizeof in->serve ? PS_INT(serve, 0) : 0,
        .staleness = in->size >= offsetof(gvqPsConfig_t, staleness) + sizeof in->staleness
                         ? PS_INT(staleness, 0)
                         : 0,
    };
#undef PS_INT
#undef PS_DBL
    return o;
}

static int is_01(int v) {
    return v == 0 || v == 1;
}
static int nonneg_finite(double v) {
    return v >= 0.0 && isfinite(v);
}

/* What is wrong with a resolved config, written to why; 0 when nothing. */
static int cfg_problem(const gvq_ps_cfg_t *o, char *why, size_t n) {
    if (o->partitions < 1 || o->partitions > GVQ_PS_MAX_PARTITIONS)
        snprintf(why, n, "partitions %d is outside [1, %d]", o->partitions, GVQ_PS_MAX_PARTITIONS);
    else if (o->partitioning != gvqPsHashed && o->partitioning != gvqPsContiguous)
        snprintf(why, n, "partitioning %d is unknown", o->partitioning);
    else if (o->rule != gvqPsSgd && o->rule != gvqPsMomentum && o->rule != gvqPsAdagrad)
        snprintf(why, n, "rule %d is unknown", o->rule);
    else if (!(o->lr > 0.0) || !isfinite(o->lr))
        snprintf(why, n, "learningRate %g is not > 0", o->lr);
    else if (!(o->momentum >= 0.0 && o->momentum < 1.0))
        snprintf(why, n, "momentum %g is outside [0, 1)", o->momentum);
    else if (!nonneg_finite(o->adagrad_init))
        snprintf(why, n, "adagradInit %g is not >= 0", o->adagrad_init);
    else if (!nonneg_finite(o->eps))
        snprintf(why, n, "epsilon %g is not >= 0", o->eps);
    else if (!is_01(o->average))
        snprintf(why, n, "average %d is not 0 or 1", o->average);
    else if (!is_01(o->local_aggregation))
        snprintf(why, n, "localAggregation %d is not 0 or 1", o->local_aggregation);
    else if (o->init != gvqPsInitZero && o->init != gvqPsInitUniform && o->init != gvqPsInitValues)
        snprintf(why, n, "init %d is unknown", o->init);
    else if (o->init == gvqPsInitValues && o->init_values == NULL)
        snprintf(why, n, "initValues is NULL with init gvqPsInitValues");
    else if (o->init == gvqPsInitUniform && !nonneg_finite(o->init_scale))
        snprintf(why, n, "initScale %g is not >= 0", o->init_scale);
    else if (!is_01(o->serve))
        snprintf(why, n, "serve %d is not 0 or 1", o->serve);
    else if (o->staleness < 0 || (o->staleness > 0 && !o->serve))
        snprintf(why, n, "staleness %d: a bound >= 0, and above 0 only with serve 1", o->staleness);
    else if (o->serve && o->local_aggregation)
        snprintf(why, n, "localAggregation needs the synchronous server (serve 0)");
    else
        return 0;
    return 1;
}

/* The caller's config (NULL: defaults) checked and resolved into *out. */
static gvqResult_t resolve_cfg(const char *fn, const gvqPsConfig_t *in, int nranks,
                               gvq_ps_cfg_t *out) {
    gvqPsConfig_t def = GVQ_PS_CONFIG_INITIALIZER;
    if (in == NULL) in = &def;
    GVQCHECK(gvq_config_header_check(fn, "config", in->size, in->magic, in->version,
                                     GVQ_PS_CONFIG_MAGIC, offsetof(gvqPsConfig_t, stream),
                                     sizeof(gvqPsConfig_t), "GVQ_PS_CONFIG_INITIALIZER"));
    gvq_ps_cfg_t o = cfg_with_defaults(in, nranks);
    char why[160];
    if (cfg_problem(&o, why, sizeof why)) {
        GVQ_WARN("%s: config: %s", fn, why);
        return gvqInvalidArgument;
    }
    if (o.stream != NULL && !gvq_stream_is_host(o.stream)) {
        GVQ_WARN("%s: config: stream %p is not a live host stream (gvqStreamCreate)", fn, o.stream);
        return gvqInvalidArgument;
    }
    *out = o;
    return gvqSuccess;
}

/* ---- initial values ------------------------------------------------------------------------ */

static void set_element(gvqDataType_t dtype, char *row, size_t j, double v) {
    if (dtype == gvqFloat32)
        ((float *)row)[j] = (float)v;
    else
        ((double *)row)[j] = v;
}

/* Uniform in [-initScale, initScale], a pure function of (seed, row, element): one Philox
 * block (counter row, j / 4) gives four elements. */
static void init_row_uniform(gvqPs_t ps, uint64_t row, char *w) {
    uint32_t key[2] = {(uint32_t)ps->cfg.seed, (uint32_t)(ps->cfg.seed >> 32)};
    uint32_t out[4];
    for (size_t j = 0; j < ps->dim; j++) {
        if (j % 4 == 0) {
            uint32_t ctr[4] = {(uint32_t)row, (uint32_t)(row >> 32), (uint32_t)(j / 4), 0x5053u};
            gvq_philox4x32_10(ctr, key, out);
        }
        set_element(ps->dtype, w, j, (2.0 * gvq_u01(out[j % 4]) - 1.0) * ps->cfg.init_scale);
    }
}

/* Initial values (and Adagrad's initial accumulator) of the slots held here. */
static void init_slots(gvqPs_t ps) {
    int r = ps->comm->rank;
    for (size_t slot = 0; slot < ps->nlocal; slot++) {
        uint64_t row = gvq_part_row_of(&ps->map, r, slot);
        char *w = gvq_ps_row(ps, ps->values, slot);
        if (ps->cfg.init == gvqPsInitValues)
            memcpy(w, (const char *)ps->cfg.init_values + row * ps->row_bytes, ps->row_bytes);
        else if (ps->cfg.init == gvqPsInitUniform)
            init_row_uniform(ps, row, w);
        if (ps->rule_state != NULL && ps->cfg.rule == gvqPsAdagrad)
            for (size_t j = 0; j < ps->dim; j++)
                set_element(ps->dtype, gvq_ps_row(ps, ps->rule_state, slot), j,
                            ps->cfg.adagrad_init);
    }
}

/* ---- create / destroy ------------------------------------------------------------------------ */

void gvq_ps_commit_free(gvq_ps_commit_t *c) {
    for (int g = 0; g < 2; g++)
        free(c->gen[g].own), free(c->gen[g].buddy);
    *c = (gvq_ps_commit_t){.buddy_of = -1};
}

static void ps_free(gvqPs_t ps) {
    if (ps == NULL) return;
    gvq_ps_serve_stop(ps, ps->comm == NULL);
    gvq_part_fini(&ps->map);
    free(ps->values);
    free(ps->rule_state);
    free(ps->grad_sum);
    free(ps->is_pending);
    free(ps->pending_slots);
    free(ps->same_host);
    gvq_ps_commit_free(&ps->commit);
    ps->magic = 0;
    free(ps);
}

/* The arguments of gvqPsCreate besides the communicator (checked first) and the config. */
static gvqResult_t check_create_args(const char *fn, size_t rows, size_t dim,
                                     gvqDataType_t datatype, const gvqPs_t *out) {
    if (out == NULL) {
        GVQ_WARN("%s: ps is NULL", fn);
        return gvqInvalidArgument;
    }
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
    return gvqSuccess;
}

/* The partition map and this rank's slots. */
static gvqResult_t alloc_slots(const char *fn, gvqPs_t ps) {
    const gvq_ps_cfg_t *cfg = &ps->cfg;
    gvqComm_t comm = ps->comm;
    GVQCHECK(gvq_part_init(&ps->map, ps->rows, (uint64_t)cfg->partitions, comm->nranks,
                           cfg->partitioning == gvqPsContiguous ? GVQ_PART_CONTIGUOUS
                                                                : GVQ_PART_HASHED));
    ps->nlocal = ps->map.rank_rows[comm->rank];
    if (ps->nlocal > SIZE_MAX / ps->row_bytes) {
        GVQ_WARN("%s: %zu rows of %zu bytes do not fit the address space", fn, ps->nlocal,
                 ps->row_bytes);
        return gvqInvalidArgument;
    }
    size_t bytes = GVQ_MAX(ps->nlocal * ps->row_bytes, (size_t)1);
    size_t slots = GVQ_MAX(ps->nlocal, (size_t)1);
    ps->values = calloc(1, bytes);
    ps->grad_sum = calloc(1, bytes);
    ps->rule_state = cfg->rule == gvqPsSgd ? NULL : calloc(1, bytes);
    ps->is_pending = calloc(slots, 1);
    ps->pending_slots = malloc(slots * sizeof *ps->pending_slots);
    ps->same_host = calloc((size_t)comm->nranks, 1);
    if (ps->values == NULL || ps->grad_sum == NULL ||
        (cfg->rule != gvqPsSgd && ps->rule_state == NULL) || ps->is_pending == NULL ||
        ps->pending_slots == NULL || ps->same_host == NULL) {
        GVQ_WARN("%s: cannot allocate %zu rows of %zu bytes", fn, ps->nlocal, ps->row_bytes);
        return gvqSystemError;
    }
    return gvqSuccess;
}

/* The collective part of creation. Every rank's verdict on its own call first: a rank that
 * refused its arguments or could not allocate (local, with ps NULL) still takes part, so that
 * the others fail at once (gvqRemoteError) rather than after the timeout, and it returns its own
 * error. Then the ranks' hosts, and the shape and partitioning, which must be equal on every
 * rank (compared on every rank, so that every rank refuses alike). */
static gvqResult_t join_ranks(const char *fn, gvqComm_t comm, gvqPs_t ps, gvqResult_t local) {
    static const char *const names[8] = {"rows",         "dim",  "datatype", "partitions",
                                         "partitioning", "rule", "serve",    "staleness"};
    GVQCHECK(gvq_comm_enter(comm, fn));
    gvq_coll_ctx_t ctx = gvq_comm_ctx(comm, NULL);
    int32_t refused = local != gvqSuccess;
    gvqResult_t res = gvq_agree_i32(&ctx, &refused, 1, gvqMax);
    if (res == gvqSuccess && refused) {
        res = local;
        if (res == gvqSuccess) {
            GVQ_WARN("%s: another rank refused its own call (its WARN says why); nothing was "
                     "created on any rank",
                     fn);
            res = gvqRemoteError;
        }
    }
    if (res == gvqSuccess) res = gvq_comm_hosts(comm, &ps->hosts, &ps->leader, ps->same_host);
    if (res == gvqSuccess) {
        int64_t shape[8] = {(int64_t)ps->rows,  (int64_t)ps->dim,     (int64_t)ps->dtype,
                            ps->cfg.partitions, ps->cfg.partitioning, ps->cfg.rule,
                            ps->cfg.serve,      ps->cfg.staleness};
        res = gvq_agree_fields(&ctx, fn, shape, names, 8, NULL);
    }
    gvq_comm_leave(comm);
    return res;
}

static void init_stats(gvqPs_t ps) {
    int P = ps->cfg.partitions, r = ps->comm->rank, N = ps->comm->nranks;
    ps->stats.partitions = P;
    ps->stats.shards = r < P ? (P - r + N - 1) / N : 0;
    ps->stats.localRows = ps->nlocal;
    ps->stats.hosts = ps->hosts;
}

GVQ_API gvqResult_t gvqPsCreate(gvqComm_t comm, size_t rows, size_t dim, gvqDataType_t datatype,
                                const gvqPsConfig_t *config, gvqPs_t *out) {
    return gvq_ps_create(comm, rows, dim, datatype, config, 0, gvqSuccess, out);
}

gvqResult_t gvq_ps_create(gvqComm_t comm, size_t rows, size_t dim, gvqDataType_t datatype,
                          const gvqPsConfig_t *config, int blank, gvqResult_t pre, gvqPs_t *out) {
    const char *fn = blank ? "gvqPsRecover" : "gvqPsCreate";
    GVQCHECK(gvq_comm_check(comm, fn, 1)); /* no communicator to tell the others through */
    gvqResult_t res = pre;
    if (res == gvqSuccess) res = check_create_args(fn, rows, dim, datatype, out);
    gvq_ps_cfg_t cfg;
    if (res == gvqSuccess) res = resolve_cfg(fn, config, comm->nranks, &cfg);
    gvqPs_t ps = res == gvqSuccess ? calloc(1, sizeof *ps) : NULL;
    if (res == gvqSuccess && ps == NULL) {
        GVQ_WARN("%s: out of memory for the handle", fn);
        res = gvqSystemError;
    }
    if (ps != NULL) {
        ps->comm = comm;
        ps->rows = rows;
        ps->dim = dim;
        ps->dtype = datatype;
        ps->esize = gvq_dtype_size(datatype);
        ps->row_bytes = dim * ps->esize;
        ps->cfg = cfg;
        res = alloc_slots(fn, ps);
        /* blank: every row is written before any call (gvqPsRecover) */
        if (res == gvqSuccess && !blank) init_slots(ps);
    }
    GVQCHECKGOTO(join_ranks(fn, comm, ps, res), res, err_free_ps);
    init_stats(ps);
    if (cfg.serve) GVQCHECKGOTO(gvq_ps_serve_start(ps, fn), res, err_free_ps);
    ps->magic = GVQ_PS_MAGIC;
    GVQCHECKGOTO(gvq_comm_attach(comm, ps, ps, orphan), res, err_free_ps);
    if ((res = gvq_handles_add(&live_servers, ps)) != gvqSuccess) {
        gvq_comm_detach(comm, ps);
        goto err_free_ps;
    }
    *out = ps;
    GVQ_INFO("%s: %zu x %zu %s, %d partitions (%s), rule %d; %zu rows here, %d host(s)%s", fn, rows,
             dim, gvq_dtype_name(datatype), cfg.partitions,
             cfg.partitioning == gvqPsContiguous ? "contiguous" : "hashed", cfg.rule, ps->nlocal,
             ps->hosts, cfg.serve ? "; served at any time" : "");
    return gvqSuccess;
err_free_ps:
    if (ps != NULL) ps_free(ps);
    return res;
}

GVQ_API gvqResult_t gvqPsDestroy(gvqPs_t ps) {
    gvq_handles_lock(&live_servers);
    gvqComm_t comm = gvq_handles_find_locked(&live_servers, ps) >= 0 ? ps->comm : NULL;
    gvq_handles_unlock(&live_servers);
    if (comm != NULL && gvq_comm_is_live(comm)) gvq_stream_comm_drain(comm); /* queued calls */
    if (!gvq_handles_remove(&live_servers, ps)) {
        GVQ_WARN("gvqPsDestroy: ps is %s", ps == NULL ? "NULL" : "not a live parameter server");
        return gvqInvalidArgument;
    }
    if (ps->srv != NULL) { /* served: the goodbyes, holding the communicator (its destroy or */
        int held = comm != NULL && gvq_comm_hold(comm); /* abort waits; if it went first: */
        gvq_ps_serve_stop(ps, !held);                   /* at once) */
        if (held) gvq_comm_leave(comm);
    }
    if (ps->comm != NULL) gvq_comm_detach(ps->comm, ps); /* NULL: the communicator went first */
    ps_free(ps);
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqPsGetStats(gvqPs_t ps, gvqPsStats_t *stats) {
    if (!gvq_ps_live(ps) || stats == NULL) {
        GVQ_WARN("gvqPsGetStats: %s",
                 stats == NULL ? "stats is NULL" : "not a live parameter server");
        return gvqInvalidArgument;
    }
    gvq_stream_comm_settle(ps->comm);
    gvq_ps_pin_t pin;
    GVQCHECK(gvq_ps_pin(ps, "gvqPsGetStats", &pin));
    *stats = ps->stats;
    stats->pendingRows = ps->npending;
    gvq_ps_unpin(&pin);
    return gvqSuccess;
}

/* ---- checks shared by push and pull ---------------------------------------------------------- */

gvqResult_t gvq_ps_check_call(gvqPs_t ps, const char *fn) {
    if (!gvq_ps_live(ps)) {
        GVQ_WARN("%s: ps is %s", fn, ps == NULL ? "NULL" : "not a live parameter server");
        return gvqInvalidArgument;
    }
    if (gvq_group_active()) {
        GVQ_WARN("%s: not allowed inside gvqGroupStart/gvqGroupEnd", fn);
        return gvqInvalidUsage;
    }
    return gvqSuccess;
}

int gvq_ps_refuse_rows(gvqPs_t ps, const char *fn, const int64_t *idx, const void *vals,
                       const char *vname, size_t n) {
    if (n > 0 && (idx == NULL || vals == NULL)) {
        GVQ_WARN("%s: %s is NULL with n %zu", fn, idx == NULL ? "indices" : vname, n);
        return 1;
    }
    /* before anything reads the arrays: n rows of indices and of values must fit in memory
     * (a count past that is not a count the caller's arrays can have) */
    if (n > (size_t)PTRDIFF_MAX / sizeof(int64_t) ||
        (ps->row_bytes > 0 && n > (size_t)PTRDIFF_MAX / ps->row_bytes)) {
        GVQ_WARN("%s: n %zu rows of %zu bytes overflows the address space", fn, n, ps->row_bytes);
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
