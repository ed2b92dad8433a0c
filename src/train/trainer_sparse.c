/*
 * trainer_sparse.c -- sparse variables of the training layer (Parallax's hybrid): an embedding
 * table whose steps touch a share alpha of its rows, routed by Parallax's cost rule.
 *
 *   commit:           every rank holds the table's initial values (a replica)
 *   first ready:      alpha = the largest share of rows a rank touches (max over the ranks);
 *                     route by bytes per rank (w: the table's bytes, N ranks):
 *                         PS          4 alpha w (N-1)/N   -> a parameter server made now from
 *                                                            the replica, on the layer's stream
 *                         allgatherv  2 alpha w (N-1)     -> keep the replica
 *                         dense       4 w (N-1)/N         -> keep the replica
 *   every step:       ready -> push (PS) | sparse allgatherv | the whole table's gradient
 *                     allreduced (dense), queued on the layer's stream
 *                     wait  -> PS apply, queued | the rule on the rows any rank touched, here
 *   lookup:           PS pull | copy from the replica
 *
 * Every route applies the same rule (gvq_rule_apply) to the same summed rows, so the tables
 * agree (bitwise when the sums are exact). The PS refuses out-of-range rows on every rank and so
 * does the allgatherv; the dense route checks them at issue and queues a refused allreduce, so
 * the other ranks fail too rather than wait.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gvq_rng.h"
#include "gvq_trainer.h"

/* A shard update rule's fields (gvq_rule_apply_params). */
typedef struct {
    int rule;
    double lr, mu, eps, gscale;
} train_rule_t;

struct gvq_train_sparse {
    size_t rows, dim;
    train_rule_t rule; /* with gscale 1/N when the config averages */
    gvqPsConfig_t ps_cfg;
    float *table;             /* the replica (all routes until the first step; then all but PS) */
    float *state;             /* the rule's state rows (momentum, Adagrad), or NULL */
    gvqPs_t ps;               /* route PS */
    int route;                /* gvqRoute_t, -1 until the first step */
    gvqSparseRows_t gathered; /* route allgatherv: this step's summed rows */
    float *dense;             /* route dense: this step's table gradient */
    unsigned long long wire;  /* bytes this rank sent, all steps */
    int issued;               /* a step's aggregation is queued */
};

static void apply_rule(const train_rule_t *r, gvqDataType_t dtype, size_t dim, void *w, void *st,
                       const void *g) {
    gvq_rule_apply_params(r->rule, r->lr, r->mu, r->eps, r->gscale, dtype, dim, w, st, g);
}

/* ---- configuration ------------------------------------------------------------------------ */

static double dflt(double v, double d) {
    return v == -1.0 ? d : v;
}

static int dflt_int(int v, int d) {
    return v == GVQ_CONFIG_UNDEF_INT ? d : v;
}

gvqResult_t gvq_train_sparse_add(gvqTrainer_t t, tvar_t *x, const gvqPsConfig_t *cfg) {
    const char *fn = "gvqTrainAddVariable";
    gvqPsConfig_t def = GVQ_PS_CONFIG_INITIALIZER;
    if (cfg == NULL) cfg = &def;
    GVQCHECK(gvq_config_header_check(fn, "variable->sparse", cfg->size, cfg->magic, cfg->version,
                                     GVQ_PS_CONFIG_MAGIC, offsetof(gvqPsConfig_t, stream),
                                     sizeof *cfg, "GVQ_PS_CONFIG_INITIALIZER"));
    struct gvq_train_sparse *sp = calloc(1, sizeof *sp);
    if (sp == NULL) {
        GVQ_WARN("%s: out of memory", fn);
        return gvqSystemError;
    }
    sp->rows = (size_t)x->shape[0];
    sp->dim = (size_t)x->shape[1];
    memcpy(&sp->ps_cfg, cfg, GVQ_MIN(cfg->size, sizeof sp->ps_cfg));
    sp->ps_cfg.size = sizeof sp->ps_cfg;
    sp->ps_cfg.stream = NULL;
    int rule = dflt_int(cfg->rule, gvqPsSgd), avg = dflt_int(cfg->average, 0);
    sp->rule = (train_rule_t){rule, dflt(cfg->learningRate, 0.01), dflt(cfg->momentum, 0.9),
                              dflt(cfg->epsilon, 1e-7), avg ? 1.0 / t->nranks : 1.0};
    int init = dflt_int(cfg->init, gvqPsInitZero);
    if (rule < gvqPsSgd || rule > gvqPsAdagrad || sp->rule.lr <= 0 ||
        (init == gvqPsInitValues && cfg->initValues == NULL) || init < gvqPsInitZero ||
        init > gvqPsInitValues) {
        GVQ_WARN("%s: variable '%s': sparse config: rule %d, learningRate %g, init %d%s", fn,
                 x->info.name, rule, sp->rule.lr, init,
                 init == gvqPsInitValues && cfg->initValues == NULL ? " without initValues" : "");
        free(sp);
        return gvqInvalidArgument;
    }
    sp->route = -1;
    gvqSparseRows_t empty = GVQ_SPARSE_ROWS_INITIALIZER;
    sp->gathered = empty;
    x->sp = sp;
    return gvqSuccess;
}

/* Initial values as the parameter server makes them (ps.c): zeros, the caller's values, or
 * uniform in [-initScale, initScale] as a pure function of (seed, row, element). */
static void init_table(struct gvq_train_sparse *sp) {
    const gvqPsConfig_t *c = &sp->ps_cfg;
    int init = dflt_int(c->init, gvqPsInitZero);
    double scale = dflt(c->initScale, 0.05);
    if (init == gvqPsInitValues) {
        memcpy(sp->table, c->initValues, sp->rows * sp->dim * sizeof(float));
    } else if (init == gvqPsInitUniform) {
        uint32_t key[2] = {(uint32_t)c->seed, (uint32_t)(c->seed >> 32)}, out[4];
        for (size_t r = 0; r < sp->rows; r++)
            for (size_t j = 0; j < sp->dim; j++) {
                if (j % 4 == 0) {
                    uint32_t ctr[4] = {(uint32_t)r, (uint32_t)((uint64_t)r >> 32),
                                       (uint32_t)(j / 4), 0x5053u};
                    gvq_philox4x32_10(ctr, key, out);
                }
                sp->table[r * sp->dim + j] = (float)((2.0 * gvq_u01(out[j % 4]) - 1.0) * scale);
            }
    }
    if (sp->state != NULL && sp->rule.rule == gvqPsAdagrad)
        for (size_t i = 0; i < sp->rows * sp->dim; i++)
            sp->state[i] = (float)dflt(c->adagradInit, 0.1);
}

gvqResult_t gvq_train_sparse_commit(gvqTrainer_t t) {
    for (int i = 0; i < t->nvars; i++) {
        struct gvq_train_sparse *sp = t->vars[i].sp;
        if (sp == NULL) continue;
        size_t n = sp->rows * sp->dim;
        sp->table = malloc(n * sizeof(float));
        if (sp->rule.rule != gvqPsSgd) sp->state = calloc(n, sizeof(float));
        if (sp->table == NULL || (sp->rule.rule != gvqPsSgd && sp->state == NULL)) {
            GVQ_WARN("gvqTrainCommit: out of memory for sparse variable '%s' (%zu values)",
                     t->vars[i].info.name, n);
            return gvqSystemError;
        }
        memset(sp->table, 0, n * sizeof(float));
        init_table(sp);
        snprintf(t->vars[i].info.why, sizeof t->vars[i].info.why,
                 "sparse: routed at the first step (Parallax's rule)");
    }
    return gvqSuccess;
}

void gvq_train_sparse_uncommit(gvqTrainer_t t) {
    for (int i = 0; i < t->nvars; i++) {
        struct gvq_train_sparse *sp = t->vars[i].sp;
        if (sp == NULL) continue;
        free(sp->table);
        free(sp->state);
        sp->table = sp->state = NULL;
    }
}

void gvq_train_sparse_free(tvar_t *x) {
    struct gvq_train_sparse *sp = x->sp;
    if (sp == NULL) return;
    if (sp->ps != NULL) gvqPsDestroy(sp->ps);
    if (sp->gathered.indices != NULL || sp->gathered.internal != NULL)
        gvqSparseRowsFree(&sp->gathered);
    free(sp->table);
    free(sp->state);
    free(sp->dense);
    free(sp);
    x->sp = NULL;
}

/* ---- the route ------------------------------------------------------------------------------ */

/* This rank's share of the table's rows among indices (in range). */
static double touched_share(const struct gvq_train_sparse *sp, const int64_t *idx, size_t n) {
    uint8_t *seen = calloc((sp->rows + 7) / 8, 1);
    size_t distinct = 0;
    for (size_t i = 0; i < n && seen != NULL; i++) {
        if (idx[i] < 0 || (uint64_t)idx[i] >= sp->rows) continue;
        uint64_t r = (uint64_t)idx[i];
        if (!(seen[r / 8] & (1u << (r % 8)))) distinct++;
        seen[r / 8] |= (uint8_t)(1u << (r % 8));
    }
    free(seen);
    return (double)distinct / (double)sp->rows;
}

static gvqResult_t set_route(gvqTrainer_t t, tvar_t *x, int route);

/* The partition tuner's step: push the first step's rows, apply, pull them back. */
typedef struct {
    const int64_t *idx;
    const float *grads;
    float *pulled;
    size_t n;
} tune_step_t;

static gvqResult_t tune_step(gvqPs_t ps, int iteration, void *arg) {
    (void)iteration;
    const tune_step_t *s = arg;
    GVQCHECK(gvqPsPush(ps, s->idx, s->grads, s->n));
    GVQCHECK(gvqPsApply(ps));
    return gvqPsPull(ps, s->idx, s->pulled, s->n);
}

/* Parallax's partition count for x's parameter server, tuned on the first step's rows
 * (collective: every rank runs the same samples). */
static gvqResult_t tune(gvqTrainer_t t, tvar_t *x, const int64_t *idx, const float *grads,
                        size_t n) {
    struct gvq_train_sparse *sp = x->sp;
    tune_step_t s = {idx, grads, malloc((n > 0 ? n : 1) * sp->dim * sizeof(float)), n};
    if (s.pulled == NULL) return gvqSystemError;
    gvqPsTuneConfig_t tc = GVQ_PS_TUNE_CONFIG_INITIALIZER;
    tc.itersPerSample = 20;
    tc.skipIters = 5;
    gvqPsConfig_t c = sp->ps_cfg;
    c.stream = NULL;
    gvqPsTuneResult_t r;
    gvqResult_t res =
        gvqPsTunePartitions(t->comm, sp->rows, sp->dim, gvqFloat32, &c, &tc, tune_step, &s, &r);
    free(s.pulled);
    GVQCHECK(res);
    sp->ps_cfg.partitions = r.bestPartitions;
    size_t len = strlen(x->info.why);
    snprintf(x->info.why + len, sizeof x->info.why - len, "; P %d (tuned, %d samples)",
             r.bestPartitions, r.nsamples);
    return gvqSuccess;
}

/* Decide the route (collective: alpha's maximum over the ranks) and set it up. */
static gvqResult_t decide(gvqTrainer_t t, tvar_t *x, const int64_t *idx, const float *grads,
                          size_t n) {
    struct gvq_train_sparse *sp = x->sp;
    double alpha = touched_share(sp, idx, n);
    GVQCHECK(gvqAllReduce(&alpha, &alpha, 1, gvqFloat64, gvqMax, t->comm, NULL));
    double N = t->nranks, w = (double)(sp->rows * sp->dim * sizeof(float));
    double ps = 4 * alpha * w * (N - 1) / N, ag = 2 * alpha * w * (N - 1),
           dense = 4 * w * (N - 1) / N;
    int route = t->sparse_route;
    if (route < 0) /* Parallax's rule: the fewest bytes; a tie goes to the replica (no servers) */
        route = dense <= ps && dense <= ag ? gvqRouteAllReduce
                : ps < ag                  ? gvqRoutePs
                                           : gvqRouteAllGatherv;
    snprintf(x->info.why, sizeof x->info.why,
             "%s: alpha %.4f, bytes/rank PS %.0f, AGV %.0f, dense %.0f",
             t->sparse_route < 0 ? "Parallax" : "config", alpha, ps, ag, dense);
    if (route == gvqRoutePs && t->tune_partitions) GVQCHECK(tune(t, x, idx, grads, n));
    return set_route(t, x, route);
}

/* Set up x's route (collective for the parameter server: every rank makes it at the same call). */
static gvqResult_t set_route(gvqTrainer_t t, tvar_t *x, int route) {
    struct gvq_train_sparse *sp = x->sp;
    if (route == gvqRoutePs) {
        gvqPsConfig_t c = sp->ps_cfg;
        c.init = gvqPsInitValues;
        c.initValues = sp->table; /* the replica's values, equal on every rank */
        c.stream = t->stream;
        GVQCHECK(gvqPsCreate(t->comm, sp->rows, sp->dim, gvqFloat32, &c, &sp->ps));
        free(sp->table);
        free(sp->state);
        sp->table = sp->state = NULL;
    } else if (route == gvqRouteAllReduce) {
        if ((sp->dense = malloc(sp->rows * sp->dim * sizeof(float))) == NULL) {
            GVQ_WARN("gvqTrainSparseReady: out of memory for '%s''s dense gradient", x->info.name);
            return gvqSystemError;
        }
    }
    sp->route = route;
    x->info.route = route;
    return gvqSuccess;
}

/* ---- a step --------------------------------------------------------------------------------- */

static gvqResult_t check_sparse(const char *fn, gvqTrainer_t t, int id, const void *idx,
                                const void *data, size_t n) {
    GVQCHECK(gvq_train_check_step(fn, t));
    if (id < 0 || id >= t->nvars || t->vars[id].sp == NULL ||
        (n > 0 && (idx == NULL || data == NULL))) {
        GVQ_WARN("%s: %s", fn,
                 id < 0 || id >= t->nvars ? "id is not a registered variable"
                 : t->vars[id].sp == NULL ? "the variable is not sparse"
                                          : "indices or values NULL with n > 0");
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

/* The dense route: the rows' sum into the table's gradient, or a refusal every rank sees. */
static gvqResult_t issue_dense(gvqTrainer_t t, tvar_t *x, const int64_t *idx, const float *g,
                               size_t n) {
    struct gvq_train_sparse *sp = x->sp;
    size_t total = sp->rows * sp->dim;
    for (size_t i = 0; i < n; i++)
        if (idx[i] < 0 || (uint64_t)idx[i] >= sp->rows) {
            /* a refused collective queues its refusal: the other ranks fail in their turn */
            (void)gvqAllReduce(NULL, sp->dense, total, gvqFloat32, gvqSum, t->comm, t->stream);
            GVQ_WARN("gvqTrainSparseReady: '%s': indices[%zu] = %lld is outside [0, %zu)",
                     x->info.name, i, (long long)idx[i], sp->rows);
            return gvqInvalidArgument;
        }
    memset(sp->dense, 0, total * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float *row = sp->dense + (size_t)idx[i] * sp->dim;
        for (size_t j = 0; j < sp->dim; j++)
            row[j] += g[i * sp->dim + j];
    }
    sp->wire += t->nranks > 1 ? (unsigned long long)(2.0 * (t->nranks - 1) / t->nranks *
                                                     (double)total * sizeof(float))
                              : 0ull;
    return gvqAllReduce(sp->dense, sp->dense, total, gvqFloat32, gvqSum, t->comm, t->stream);
}

GVQ_API gvqResult_t gvqTrainSparseReady(gvqTrainer_t t, int id, const int64_t *indices,
                                        const float *grads, size_t n) {
    const char *fn = "gvqTrainSparseReady";
    GVQCHECK(check_sparse(fn, t, id, indices, grads, n));
    tvar_t *x = &t->vars[id];
    struct gvq_train_sparse *sp = x->sp;
    if (x->grad != NULL) {
        GVQ_WARN("%s: variable %d '%s' is ready twice in one step (gvqTrainWaitAll ends a step)",
                 fn, id, x->info.name);
        return gvqInvalidUsage;
    }
    if (sp->route < 0) GVQCHECK(decide(t, x, indices, grads, n));
    x->grad = (float *)(uintptr_t)grads; /* marks the variable ready; never written */
    x->info.readyTime = gvq_now_ns() * 1e-9;
    gvqResult_t res;
    if (sp->route == gvqRoutePs)
        res = gvqPsPush(sp->ps, indices, grads, n);
    else if (sp->route == gvqRouteAllReduce)
        res = issue_dense(t, x, indices, grads, n);
    else
        res = gvqSparseAllGatherv(indices, grads, n, sp->rows, sp->dim, gvqFloat32,
                                  GVQ_SPARSE_SUMMED, &sp->gathered, t->comm, t->stream);
    sp->issued = res == gvqSuccess; /* refused here: nothing to apply at the wait */
    return res;
}

void gvq_train_sparse_before_wait(gvqTrainer_t t) {
    for (int i = 0; i < t->nvars; i++) {
        struct gvq_train_sparse *sp = t->vars[i].sp;
        if (sp != NULL && sp->issued && sp->route == gvqRoutePs) (void)gvqPsApply(sp->ps);
    }
}

/* After the wait: the rule on the replica's touched rows (routes allgatherv and dense). */
void gvq_train_sparse_after_wait(gvqTrainer_t t, gvqResult_t waited) {
    for (int i = 0; i < t->nvars; i++) {
        struct gvq_train_sparse *sp = t->vars[i].sp;
        if (sp == NULL || !sp->issued) continue;
        sp->issued = 0;
        if (waited != gvqSuccess || sp->route == gvqRoutePs) continue;
        size_t d = sp->dim;
        if (sp->route == gvqRouteAllGatherv) {
            const float *v = sp->gathered.values;
            for (size_t k = 0; k < sp->gathered.nrows; k++) {
                size_t r = (size_t)sp->gathered.indices[k];
                apply_rule(&sp->rule, gvqFloat32, d, sp->table + r * d,
                           sp->state ? sp->state + r * d : NULL, v + k * d);
            }
            sp->wire += sp->gathered.bytesSent;
        } else { /* dense: the rows whose summed gradient is not all zero */
            for (size_t r = 0; r < sp->rows; r++) {
                const float *g = sp->dense + r * d;
                size_t j = 0;
                while (j < d && g[j] == 0.0f)
                    j++;
                if (j < d)
                    apply_rule(&sp->rule, gvqFloat32, d, sp->table + r * d,
                               sp->state ? sp->state + r * d : NULL, g);
            }
        }
    }
}

unsigned long long gvq_train_sparse_wire(const tvar_t *x) {
    const struct gvq_train_sparse *sp = x->sp;
    if (sp->ps != NULL) {
        gvqPsStats_t st;
        if (gvqPsGetStats(sp->ps, &st) == gvqSuccess) return st.bytesSent;
    }
    return sp->wire;
}

GVQ_API gvqResult_t gvqTrainSparseLookup(gvqTrainer_t t, int id, const int64_t *indices, size_t n,
                                         float *values) {
    const char *fn = "gvqTrainSparseLookup";
    GVQCHECK(check_sparse(fn, t, id, indices, values, n));
    struct gvq_train_sparse *sp = t->vars[id].sp;
    if (sp->ps != NULL) { /* queued on the layer's stream behind what the step queued */
        GVQCHECK(gvqPsPull(sp->ps, indices, values, n));
        return gvqStreamSynchronize(t->stream);
    }
    for (size_t i = 0; i < n; i++)
        if (indices[i] < 0 || (uint64_t)indices[i] >= sp->rows) {
            GVQ_WARN("%s: '%s': indices[%zu] = %lld is outside [0, %zu)", fn, t->vars[id].info.name,
                     i, (long long)indices[i], sp->rows);
            return gvqInvalidArgument;
        }
    for (size_t i = 0; i < n; i++)
        memcpy(values + i * sp->dim, sp->table + (size_t)indices[i] * sp->dim,
               sp->dim * sizeof(float));
    return gvqSuccess;
}

/* ---- saved state (trainer_save.c) ------------------------------------------------------------
 * A sparse variable's part: {route (-1: not decided yet), has_state, table floats, PS bytes},
 * then the table (and the rule's state) on the replica routes, or this rank's parameter-server
 * state (gvqPsSave) on the PS route. */

typedef struct {
    int32_t route;
    uint32_t has_state;
    int32_t partitions; /* the PS route's (tuned) partition count; 0 otherwise */
    uint32_t zero;
    uint64_t floats, ps_bytes;
} sparse_state_t;

gvqResult_t gvq_train_sparse_state_bytes(const tvar_t *x, size_t *n) {
    const struct gvq_train_sparse *sp = x->sp;
    *n = 0;
    if (sp == NULL) return gvqSuccess;
    size_t ps = 0;
    if (sp->ps != NULL) GVQCHECK(gvqPsSave(sp->ps, NULL, &ps));
    size_t floats = sp->ps != NULL ? 0 : sp->rows * sp->dim * (sp->state != NULL ? 2 : 1);
    *n = sizeof(sparse_state_t) + floats * sizeof(float) + ps;
    return gvqSuccess;
}

gvqResult_t gvq_train_sparse_save(const tvar_t *x, void *out, size_t n) {
    const struct gvq_train_sparse *sp = x->sp;
    size_t table = sp->rows * sp->dim;
    sparse_state_t h = {sp->route, sp->state != NULL, 0, 0, sp->ps != NULL ? 0 : table, 0};
    if (sp->ps != NULL) {
        gvqPsStats_t st;
        GVQCHECK(gvqPsGetStats(sp->ps, &st));
        h.partitions = st.partitions;
    }
    char *p = (char *)out + sizeof h;
    if (sp->ps != NULL) {
        size_t ps = n - sizeof h;
        GVQCHECK(gvqPsSave(sp->ps, p, &ps));
        h.ps_bytes = ps;
    } else {
        memcpy(p, sp->table, table * sizeof(float));
        if (sp->state != NULL) memcpy(p + table * sizeof(float), sp->state, table * sizeof(float));
    }
    memcpy(out, &h, sizeof h);
    return gvqSuccess;
}

/* Whether blob (n bytes) is a state this variable can take, nothing changed. */
gvqResult_t gvq_train_sparse_check(const tvar_t *x, const void *blob, size_t n) {
    const char *fn = "gvqTrainLoad";
    const struct gvq_train_sparse *sp = x->sp;
    sparse_state_t h;
    if (n < sizeof h) {
        GVQ_WARN("%s: sparse variable '%s': its state is %zu bytes", fn, x->info.name, n);
        return gvqInvalidArgument;
    }
    memcpy(&h, blob, sizeof h);
    size_t table = sp->rows * sp->dim, want_state = sp->rule.rule != gvqPsSgd;
    int route_ok = h.route == -1 || h.route == gvqRoutePs || h.route == gvqRouteAllGatherv ||
                   h.route == gvqRouteAllReduce;
    int shape_ok = h.route == gvqRoutePs
                       ? h.floats == 0 && h.ps_bytes == n - sizeof h && h.partitions >= 1 &&
                             (uint64_t)h.partitions <= sp->rows
                       : h.ps_bytes == 0 && h.has_state == want_state && h.floats == table &&
                             n - sizeof h == table * sizeof(float) * (want_state ? 2 : 1);
    if (!route_ok || !shape_ok || (sp->route >= 0 && h.route != sp->route)) {
        GVQ_WARN("%s: sparse variable '%s': the state (route %d, %llu values, %llu PS bytes) does "
                 "not fit this layer's (route %d, %zu x %zu)",
                 fn, x->info.name, (int)h.route, (unsigned long long)h.floats,
                 (unsigned long long)h.ps_bytes, sp->route, sp->rows, sp->dim);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

/* Take a checked state: the table, or this rank's shards (making the parameter server first when
 * the route is not decided here yet: collective, as every rank loads at the same call). */
gvqResult_t gvq_train_sparse_load(gvqTrainer_t t, tvar_t *x, const void *blob, size_t n) {
    struct gvq_train_sparse *sp = x->sp;
    sparse_state_t h;
    memcpy(&h, blob, sizeof h);
    const char *p = (const char *)blob + sizeof h;
    if (h.route == gvqRoutePs) {
        if (sp->route < 0) {
            sp->ps_cfg.partitions = h.partitions; /* as tuned when it was saved */
            GVQCHECK(set_route(t, x, gvqRoutePs));
        }
        snprintf(x->info.why, sizeof x->info.why, "route restored from a saved state");
        return gvqPsLoad(sp->ps, p, n - sizeof h);
    }
    size_t table = sp->rows * sp->dim;
    memcpy(sp->table, p, table * sizeof(float));
    if (sp->state != NULL) memcpy(sp->state, p + table * sizeof(float), table * sizeof(float));
    if (h.route >= 0 && sp->route < 0) GVQCHECK(set_route(t, x, h.route));
    if (h.route >= 0)
        snprintf(x->info.why, sizeof x->info.why, "route restored from a saved state");
    return gvqSuccess;
}
