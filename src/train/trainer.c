/*
 * trainer.c -- the training layer (gvq_train.h): routes, buckets and wait-free backprop over a
 * host stream of the layer's own.
 *
 *   backprop:   layer L        layer L-1        layer L-2    ...      gvqTrainWaitAll
 *   ready:         v0 ------------ v1 ------------- v2 ---------------- |
 *   stream:        [ allreduce v0 ][ bucket(v1,v2) -- when v2 is ready ] wait, then the step
 *                  ^ starts while layer L-1 computes
 *
 * The order, and whether units are cut into chunks, is trainer_plan.c's (schedule ready: as
 * below; forward: negotiated with the other ranks, what the next forward pass needs first
 * first); running a job is trainer_run.c's.
 * Each variable (or bucket) is one job on the layer's stream (gvq_stream_enqueue, ordered on
 * the communicator with every other call): the job takes its start time, runs the blocking
 * collective on the progress thread (gvqAllReduce or gvqAllReduceCompressed, stream NULL: the
 * job holds the communicator's turn), and takes its end time. A bucket is packed on the
 * caller's thread when its last member is ready, and unpacked by its job. Tensors whose codec
 * fuses (GradiVeQ with a tracked basis, PowerSGD, QSGD without error feedback or an integer
 * wire) form one fused group (GVQ_TRAIN_FUSE_COMPRESSED, on by default): its job runs their
 * compressed calls inside one gvqGroupStart/End once the last is ready, so a step pays three
 * rings for all tracked ones, two for all PowerSGD ones and one for all QSGD ones instead of
 * that many each (on a small model the rings' latency outweighs the overlap lost;
 * perf/RESULTS.md section 6). Without waitFree the
 * jobs are all queued at gvqTrainWaitAll, in registration order. Over a transport that cannot
 * run calls from two threads (MPI below MPI_THREAD_MULTIPLE) every job runs at once on the
 * caller's thread instead: the same calls in the same order, without overlap.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gvq_trainer.h"

#define TRAINER_MAGIC 0x67767452u /* 'gvqR' */

/* ---- configuration ------------------------------------------------------------------------- */

static gvqResult_t copy_compressor_cfg(const char *fn, const char *what,
                                       const gvqCompressorConfig_t *in, gvqCompressorConfig_t *out,
                                       int *has) {
    *has = in != NULL;
    if (in == NULL) return gvqSuccess;
    if (in->size < offsetof(gvqCompressorConfig_t, efBound) + sizeof in->efBound ||
        in->size > sizeof *in || in->magic != GVQ_COMPRESSOR_CONFIG_MAGIC) {
        GVQ_WARN("%s: %s was not made with GVQ_COMPRESSOR_CONFIG_INITIALIZER", fn, what);
        return gvqInvalidArgument;
    }
    gvqCompressorConfig_t def = GVQ_COMPRESSOR_CONFIG_INITIALIZER; /* fields it predates */
    memcpy(&def, in, in->size);
    def.size = sizeof def;
    *out = def;
    return gvqSuccess;
}

static gvqResult_t resolve_config(const gvqTrainConfig_t *in, gvqTrainer_t t) {
    const char *fn = "gvqTrainCreate";
    gvqTrainConfig_t def = GVQ_TRAIN_CONFIG_INITIALIZER;
    if (in != NULL) /* a config of the layout before schedule: those two at their defaults */
        GVQCHECK(gvq_config_layouts(fn, "config", in, &def, offsetof(gvqTrainConfig_t, schedule),
                                    _Alignof(gvqTrainConfig_t), sizeof def, GVQ_TRAIN_CONFIG_MAGIC,
                                    "GVQ_TRAIN_CONFIG_INITIALIZER"));
    in = &def;
    long bucket = (long)gvq_param(GVQ_PARAM_TRAIN_BUCKET_BYTES);
    if (in->bucketBytes != GVQ_CONFIG_UNDEF_INT) bucket = in->bucketBytes;
    if (bucket < 0 || bucket > (1l << 30)) {
        GVQ_WARN("%s: bucketBytes %ld is outside [0, 2^30]", fn, bucket);
        return gvqInvalidArgument;
    }
    t->bucket_bytes = (size_t)bucket;
    t->wait_free = in->waitFree == GVQ_CONFIG_UNDEF_INT ? 1 : in->waitFree;
    if (t->wait_free != 0 && t->wait_free != 1) {
        GVQ_WARN("%s: waitFree %d is not 0 or 1", fn, in->waitFree);
        return gvqInvalidArgument;
    }
    t->op = in->op == GVQ_CONFIG_UNDEF_INT ? gvqAvg : (gvqRedOp_t)in->op;
    if (t->op != gvqAvg && t->op != gvqSum) {
        GVQ_WARN("%s: op %d is not gvqAvg or gvqSum", fn, in->op);
        return gvqInvalidArgument;
    }
    t->sparse_route = in->sparseRoute == GVQ_CONFIG_UNDEF_INT ? -1 : in->sparseRoute;
    if (t->sparse_route != -1 && t->sparse_route != gvqRoutePs &&
        t->sparse_route != gvqRouteAllGatherv && t->sparse_route != gvqRouteAllReduce) {
        GVQ_WARN("%s: sparseRoute %d is not gvqRoutePs, gvqRouteAllGatherv, gvqRouteAllReduce or "
                 "unset",
                 fn, in->sparseRoute);
        return gvqInvalidArgument;
    }
    t->tune_partitions = in->tunePartitions == GVQ_CONFIG_UNDEF_INT ? 1 : in->tunePartitions;
    if (t->tune_partitions != 0 && t->tune_partitions != 1) {
        GVQ_WARN("%s: tunePartitions %d is not 0 or 1", fn, in->tunePartitions);
        return gvqInvalidArgument;
    }
    t->sfb = in->sfb == GVQ_CONFIG_UNDEF_INT ? -1 : in->sfb;
    if (t->sfb < -1 || t->sfb > 1) {
        GVQ_WARN("%s: sfb %d is not 0, 1 or unset (SACP)", fn, in->sfb);
        return gvqInvalidArgument;
    }
    t->schedule = in->schedule == GVQ_CONFIG_UNDEF_INT ? gvqTrainScheduleReady : in->schedule;
    if (t->schedule != gvqTrainScheduleReady && t->schedule != gvqTrainScheduleForward) {
        GVQ_WARN("%s: schedule %d is not gvqTrainScheduleReady or gvqTrainScheduleForward", fn,
                 in->schedule);
        return gvqInvalidArgument;
    }
    long chunk = in->chunkBytes == GVQ_CONFIG_UNDEF_INT ? 65536 : in->chunkBytes;
    if (chunk < 1024 || chunk > (1l << 30)) {
        GVQ_WARN("%s: chunkBytes %ld is outside [1024, 2^30]", fn, chunk);
        return gvqInvalidArgument;
    }
    /* only a plan reorders chunks; without one a unit goes whole, as it always did */
    t->chunk_bytes =
        t->schedule == gvqTrainScheduleForward && t->wait_free ? (size_t)chunk : (size_t)0;
    GVQCHECK(copy_compressor_cfg(fn, "convCompressor", in->convCompressor, &t->conv_cfg,
                                 &t->has_conv_cfg));
    GVQCHECK(copy_compressor_cfg(fn, "fcCompressor", in->fcCompressor, &t->fc_cfg, &t->has_fc_cfg));
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqTrainCreate(gvqComm_t comm, const gvqTrainConfig_t *config,
                                   gvqTrainer_t *trainer) {
    const char *fn = "gvqTrainCreate";
    GVQCHECK(gvq_comm_check(comm, fn, 1));
    if (trainer == NULL) {
        GVQ_WARN("%s: trainer is NULL", fn);
        return gvqInvalidArgument;
    }
    gvqTrainer_t t = calloc(1, sizeof *t);
    if (t == NULL) {
        GVQ_WARN("%s: out of memory", fn);
        return gvqSystemError;
    }
    gvqResult_t res = resolve_config(config, t);
    if (res != gvqSuccess) goto err_free;
    t->comm = comm;
    GVQCHECKGOTO(gvqCommCount(comm, &t->nranks), res, err_free);
    GVQCHECKGOTO(gvqCommUserRank(comm, &t->rank), res, err_free);
    GVQCHECKGOTO(gvqStreamCreate(&t->stream), res, err_free);
    t->magic = TRAINER_MAGIC;
    if ((res = gvq_train_register(t)) != gvqSuccess) {
        GVQ_WARN("%s: out of memory", fn);
        gvqStreamDestroy(t->stream);
        goto err_free;
    }
    *trainer = t;
    return gvqSuccess;
err_free:
    free(t);
    return res;
}

/* ---- variables ----------------------------------------------------------------------------- */

/* The variable's count from its shape, or 0 when the shape is bad (WARN). */
static size_t shape_count(const char *fn, const gvqVariable_t *v) {
    int dims = v->kind == gvqVarConv ? 4 : v->kind == gvqVarFc || v->kind == gvqVarSparse ? 2 : 1;
    size_t n = 1;
    for (int i = 0; i < dims; i++) {
        if (v->shape[i] <= 0) {
            GVQ_WARN("%s: variable '%s' (%s): shape[%d] = %d is not positive", fn,
                     v->name ? v->name : "", gvq_train_kind_name(v->kind), i, v->shape[i]);
            return 0;
        }
        n *= (size_t)v->shape[i];
    }
    if (n > ((size_t)1 << 31)) {
        GVQ_WARN("%s: variable '%s' has %zu values; at most 2^31", fn, v->name ? v->name : "", n);
        return 0;
    }
    return n;
}

GVQ_API gvqResult_t gvqTrainAddVariable(gvqTrainer_t t, const gvqVariable_t *v, int *id) {
    const char *fn = "gvqTrainAddVariable";
    GVQCHECK(gvq_train_check(fn, t));
    if (v == NULL || id == NULL) {
        GVQ_WARN("%s: %s is NULL", fn, v == NULL ? "variable" : "id");
        return gvqInvalidArgument;
    }
    if (t->committed) {
        GVQ_WARN("%s: variable '%s' comes after gvqTrainCommit", fn, v->name ? v->name : "");
        return gvqInvalidUsage;
    }
    GVQCHECK(gvq_config_header_check(fn, "variable", v->size, v->magic, v->version,
                                     GVQ_VARIABLE_MAGIC, sizeof *v, sizeof *v,
                                     "GVQ_VARIABLE_INITIALIZER"));
    if (v->kind != gvqVarConv && v->kind != gvqVarFc && v->kind != gvqVarDense &&
        v->kind != gvqVarSparse) {
        GVQ_WARN("%s: variable '%s': kind %d is not gvqVarConv, gvqVarFc, gvqVarDense or "
                 "gvqVarSparse",
                 fn, v->name ? v->name : "", v->kind);
        return gvqInvalidArgument;
    }
    size_t count = shape_count(fn, v);
    if (count == 0) return gvqInvalidArgument;
    if (v->factors != 0 && (v->factors != 1 || v->kind != gvqVarFc)) {
        GVQ_WARN("%s: variable '%s': factors %d: only an fc variable can take factors (1)", fn,
                 v->name ? v->name : "", v->factors);
        return gvqInvalidArgument;
    }
    if (t->nvars == t->cap) {
        int cap = t->cap ? 2 * t->cap : 16;
        tvar_t *vars = realloc(t->vars, (size_t)cap * sizeof *vars);
        if (vars == NULL) {
            GVQ_WARN("%s: out of memory", fn);
            return gvqSystemError;
        }
        t->vars = vars;
        t->cap = cap;
    }
    tvar_t *x = &t->vars[t->nvars];
    memset(x, 0, sizeof *x);
    GVQCHECK(
        copy_compressor_cfg(fn, "variable->compressor", v->compressor, &x->ccfg, &x->has_ccfg));
    snprintf(x->info.name, sizeof x->info.name, "%s", v->name ? v->name : "");
    x->info.kind = v->kind;
    x->info.count = count;
    x->info.bucket = -1;
    x->factors = v->factors;
    memcpy(x->shape, v->shape, sizeof x->shape);
    if (v->kind == gvqVarSparse) GVQCHECK(gvq_train_sparse_add(t, x, v->sparse));
    *id = t->nvars++;
    return gvqSuccess;
}

/* ---- a step -------------------------------------------------------------------------------- */

/* Variable id is ready: so is its unit when it was the last member of its bucket. */
static gvqResult_t start_variable(gvqTrainer_t t, int id) {
    tvar_t *x = &t->vars[id];
    const tunit_t *u = &t->units[x->unit];
    if (u->bucket >= 0 && --t->buckets[u->bucket].pending > 0) return gvqSuccess;
    return gvq_train_plan_ready(t, x->unit);
}

/* The checks of every hand-over: a committed layer, a registered variable not yet ready in this
 * step, a gradient buffer. */
static gvqResult_t check_hand_over(const char *fn, gvqTrainer_t t, int id, const float *grad) {
    GVQCHECK(gvq_train_check_step(fn, t));
    if (id < 0 || id >= t->nvars || grad == NULL) {
        GVQ_WARN("%s: %s", fn, grad == NULL ? "grad is NULL" : "id is not a registered variable");
        return gvqInvalidArgument;
    }
    if (t->vars[id].grad != NULL) {
        GVQ_WARN("%s: variable %d '%s' is ready twice in one step (gvqTrainWaitAll ends a step)",
                 fn, id, t->vars[id].info.name);
        return gvqInvalidUsage;
    }
    return gvqSuccess;
}

/* Variable id's gradient (in grad) is ready: its aggregation starts now with waitFree. */
static gvqResult_t hand_over(gvqTrainer_t t, int id, float *grad) {
    tvar_t *x = &t->vars[id];
    x->grad = grad;
    x->info.readyTime = gvq_train_now();
    x->info.startTime = x->info.endTime = 0;
    return t->wait_free ? start_variable(t, id) : gvqSuccess;
}

GVQ_API gvqResult_t gvqTrainGradReady(gvqTrainer_t t, int id, float *grad) {
    GVQCHECK(check_hand_over("gvqTrainGradReady", t, id, grad));
    return hand_over(t, id, grad);
}

/* SACP: whether the factors of batch b cost fewer bytes than the full matrix (per rank, on the
 * ring: allgather (P-1) b (M+N) floats against allreduce 2(P-1)/P MN), and why. */
static int sacp_picks_sfb(const gvqTrainer_t t, const tvar_t *x, int b, char *why, size_t n) {
    double P = t->nranks, M = x->shape[0], N = x->shape[1];
    double sfb = (P - 1) * b * (M + N) * 4, full = 2 * (P - 1) / P * M * N * 4;
    int pick = x->comp == NULL && (t->sfb > 0 || (t->sfb < 0 && sfb < full));
    snprintf(why, n, "%s: SFB %.0f B %s full %.0f B per rank (b %d)%s",
             t->sfb < 0 ? "SACP" : "config", sfb, sfb < full ? "<" : ">=", full, b,
             x->comp != NULL ? "; compressed: full" : "");
    return pick;
}

/* Grow *buf to hold n floats. */
static gvqResult_t reserve(float **buf, size_t *cap, size_t n) {
    if (n <= *cap) return gvqSuccess;
    float *p = realloc(*buf, n * sizeof(float));
    if (p == NULL) {
        GVQ_WARN("gvqTrainFactorsReady: out of memory for %zu gathered floats", n);
        return gvqSystemError;
    }
    *buf = p;
    *cap = n;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqTrainFactorsReady(gvqTrainer_t t, int id, const float *u, const float *v,
                                         int batch, float *grad) {
    const char *fn = "gvqTrainFactorsReady";
    GVQCHECK(check_hand_over(fn, t, id, grad));
    if (!t->vars[id].factors || u == NULL || v == NULL || batch < 1) {
        GVQ_WARN("%s: %s", fn,
                 !t->vars[id].factors ? "the variable was not registered with factors"
                 : batch < 1          ? "batch < 1"
                                      : "u or v is NULL");
        return gvqInvalidArgument;
    }
    tvar_t *x = &t->vars[id];
    int M = x->shape[0], N = x->shape[1];
    char why[sizeof x->info.why];
    int sfb = sacp_picks_sfb(t, x, batch, why, sizeof why);
    if (sfb) { /* every rank's factors, gathered (before anything of the variable changes) */
        size_t pb = (size_t)t->nranks * (size_t)batch;
        GVQCHECK(reserve(&x->all_u, &x->cap_u, pb * (size_t)M));
        GVQCHECK(reserve(&x->all_v, &x->cap_v, pb * (size_t)N));
    }
    x->sfb_now = sfb;
    memcpy(x->info.why, why, sizeof why);
    x->info.route = x->sfb_now        ? gvqRouteSfb
                    : x->comp != NULL ? gvqRouteCompressed
                                      : gvqRouteAllReduce;
    if (x->sfb_now) {
        x->fu = u;
        x->fv = v;
        x->fbatch = batch;
    } else { /* this rank's gradient, sum_j u_j v_j^T, then the usual route */
        GVQCHECK(gvq_host_sgemm(0, 1, N, M, batch, 1.0f, v, N, u, M, 0.0f, grad, N));
    }
    return hand_over(t, id, grad);
}

static void end_step(gvqTrainer_t t) {
    for (int i = 0; i < t->nvars; i++) {
        tvar_t *x = &t->vars[i];
        if (x->grad != NULL) x->info.steps++;
        if (x->info.route == gvqRouteBucket || x->fused >= 0) {
            const tbucket_t *b = &t->buckets[x->fused >= 0 ? x->fused : x->info.bucket];
            x->info.startTime = b->start;
            x->info.endTime = b->end;
        }
        x->grad = NULL;
        x->sfb_now = 0;
    }
    for (int k = 0; k < t->nbuckets; k++) {
        t->buckets[k].pending = t->buckets[k].nmembers;
        t->buckets[k].start = t->buckets[k].end = 0;
    }
    t->issue_error = gvqSuccess;
}

GVQ_API gvqResult_t gvqTrainWaitAll(gvqTrainer_t t) {
    const char *fn = "gvqTrainWaitAll";
    GVQCHECK(gvq_train_check(fn, t));
    if (!t->committed) {
        GVQ_WARN("%s: call gvqTrainCommit first", fn);
        return gvqInvalidUsage;
    }
    gvqResult_t live = gvq_train_check_comm(fn, t);
    if (live != gvqSuccess) {    /* nothing more may be queued; what was queued has failed */
        gvq_train_plan_close(t); /* a negotiation waits for no more */
        (void)gvqStreamSynchronize(t->stream);
        end_step(t);
        gvq_train_plan_end_step(t);
        return live;
    }
    int missing = -1;
    for (int i = 0; i < t->nvars; i++) {
        if (t->vars[i].grad == NULL) {
            if (missing < 0) missing = i;
            continue;
        }
        if (!t->wait_free && t->vars[i].sp == NULL) (void)start_variable(t, i);
    }
    gvq_train_plan_close(t);
    gvq_train_sparse_before_wait(t); /* the parameter servers' apply, behind their pushes */
    gvqResult_t res = gvqStreamSynchronize(t->stream);
    gvq_train_sparse_after_wait(t, res);
    if (res == gvqSuccess) res = t->issue_error;
    if (missing >= 0) {
        GVQ_WARN("%s: variable %d '%s' was not made ready in this step (gvqTrainGradReady); its "
                 "aggregation did not run here%s",
                 fn, missing, t->vars[missing].info.name,
                 t->vars[missing].info.route == gvqRouteBucket ? ", nor its bucket's" : "");
        res = gvqInvalidUsage;
    }
    end_step(t);
    gvq_train_plan_end_step(t);
    return res;
}

GVQ_API gvqResult_t gvqTrainWaitVariable(gvqTrainer_t t, int id) {
    const char *fn = "gvqTrainWaitVariable";
    GVQCHECK(gvq_train_check_step(fn, t));
    if (id < 0 || id >= t->nvars) {
        GVQ_WARN("%s: id %d is not a registered variable", fn, id);
        return gvqInvalidArgument;
    }
    const tvar_t *x = &t->vars[id];
    if (x->sp != NULL || x->grad == NULL) {
        GVQ_WARN("%s: variable %d '%s' %s", fn, id, x->info.name,
                 x->sp != NULL ? "is sparse: gvqTrainWaitAll completes it"
                               : "was not made ready in this step");
        return gvqInvalidUsage;
    }
    if (!t->wait_free) {
        GVQ_WARN("%s: variable %d '%s': without waitFree nothing is issued before "
                 "gvqTrainWaitAll",
                 fn, id, x->info.name);
        return gvqInvalidUsage;
    }
    return gvq_train_plan_wait(fn, t, x->unit);
}

/* ---- queries and destroy ----------------------------------------------------------------- */

static gvqResult_t check_id(const char *fn, gvqTrainer_t t, int id, const void *out) {
    GVQCHECK(gvq_train_check(fn, t));
    if (id < 0 || id >= t->nvars || out == NULL) {
        GVQ_WARN("%s: %s", fn, out == NULL ? "output is NULL" : "id is not a registered variable");
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqTrainGetVariableInfo(gvqTrainer_t t, int id, gvqTrainVariableInfo_t *info) {
    GVQCHECK(check_id("gvqTrainGetVariableInfo", t, id, info));
    if (t->vars[id].comp != NULL && t->negotiate) { /* its stats wait for the comm's calls */
        pthread_mutex_lock(&t->lock);
        int open = t->job_queued && !t->job_over;
        pthread_mutex_unlock(&t->lock);
        if (open) {
            GVQ_WARN("gvqTrainGetVariableInfo: variable %d '%s' is compressed and the layer's "
                     "negotiated step is open: ask after gvqTrainWaitAll",
                     id, t->vars[id].info.name);
            return gvqInvalidUsage;
        }
    }
    if (t->units != NULL) pthread_mutex_lock(&t->lock); /* the progress thread writes it */
    *info = t->vars[id].info;
    if (t->units != NULL) pthread_mutex_unlock(&t->lock);
    if (t->vars[id].comp != NULL) {
        gvqCompressorStats_t st;
        if (gvqCompressorGetStats(t->vars[id].comp, &st) == gvqSuccess)
            info->wireBytes = st.wireBytes;
    }
    if (t->vars[id].sp != NULL) info->wireBytes = gvq_train_sparse_wire(&t->vars[id]);
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqTrainGetVariableCount(gvqTrainer_t t, int *count) {
    GVQCHECK(gvq_train_check("gvqTrainGetVariableCount", t));
    if (count == NULL) {
        GVQ_WARN("gvqTrainGetVariableCount: count is NULL");
        return gvqInvalidArgument;
    }
    *count = t->nvars;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqTrainGetCompressor(gvqTrainer_t t, int id, gvqCompressor_t *compressor) {
    GVQCHECK(check_id("gvqTrainGetCompressor", t, id, compressor));
    *compressor = t->vars[id].comp;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqTrainDestroy(gvqTrainer_t t) {
    if (!gvq_train_unregister(t)) return gvq_train_check("gvqTrainDestroy", t);
    if (t->negotiate && (t->job_queued || gvq_comm_is_live(t->comm)))
        gvq_train_plan_close(t); /* this rank's step, or an empty one, closed: the other ranks'
                                    negotiation ends instead of waiting for the timeout */
    gvqResult_t res = gvqStreamDestroy(t->stream); /* waits for the queued work */
    for (int i = 0; i < t->nvars; i++)
        if (t->vars[i].comp != NULL) gvqCompressorDestroy(t->vars[i].comp);
    for (int i = 0; i < t->nvars; i++) {
        free(t->vars[i].all_u);
        free(t->vars[i].all_v);
        gvq_train_sparse_free(&t->vars[i]);
    }
    for (int k = 0; k < t->nbuckets; k++) {
        free(t->buckets[k].members);
        free(t->buckets[k].buf);
    }
    gvq_train_plan_free(t);
    free(t->buckets);
    free(t->vars);
    t->magic = 0;
    free(t);
    return res;
}
