/*
 * trainer_commit.c -- gvqTrainCommit: the ranks agree on the variables and settings, each
 * variable gets its route (compressor, fused group, bucket, alone, sufficient factors), and the
 * compressors and buckets are made; trainer.c has the layer's design.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <stddef.h>

#include "gvq_trainer.h"

/* The bytes of a gvqCompressorConfig_t that hold fields: none of its tail padding, whose bytes
 * are indeterminate and would differ between ranks. */
#define CCFG_BYTES (offsetof(gvqCompressorConfig_t, basisUpdate) + sizeof(int))

/* ---- commit: agree, route, make compressors and buckets ---------------------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* A hash of variables [0, upto): names, kinds, shapes. */
uint64_t gvq_train_variables_hash(const gvqTrainer_t t, int upto) {
    uint64_t h = fnv(0xcbf29ce484222325ull, &upto, sizeof upto);
    for (int i = 0; i < upto; i++) {
        const tvar_t *x = &t->vars[i];
        h = fnv(h, x->info.name, strlen(x->info.name));
        h = fnv(h, &x->info.kind, sizeof x->info.kind);
        h = fnv(h, x->shape, sizeof x->shape);
    }
    return h;
}

/* Whether every rank holds the same value (min == max, through the library's own allreduce). */
static gvqResult_t all_equal(gvqTrainer_t t, uint64_t v, int *equal) {
    uint64_t x[2] = {v, ~v};
    GVQCHECK(gvqAllReduce(x, x, 2, gvqUint64, gvqMax, t->comm, NULL));
    *equal = x[0] == v && ~x[1] == v;
    return gvqSuccess;
}

/* The codec config of variable x (NULL: plain), with its shape filled in. */
static const gvqCompressorConfig_t *codec_of(gvqTrainer_t t, tvar_t *x) {
    if (x->sp != NULL) return NULL; /* sparse: rows, not a tensor to compress */
    const gvqCompressorConfig_t *c = x->has_ccfg                                     ? &x->ccfg
                                     : x->info.kind == gvqVarConv && t->has_conv_cfg ? &t->conv_cfg
                                     : x->info.kind == gvqVarFc && t->has_fc_cfg     ? &t->fc_cfg
                                                                                     : NULL;
    if (c == NULL || c->codec == gvqCodecNone) return NULL;
    int own = x->has_ccfg, index = (int)(x - t->vars);
    x->ccfg = *c;
    /* Each variable draws QSGD's random bits from a stream of its own: a shared config's seed
     * (0 when unset) plus the variable's registration index; a variable's own config keeps the
     * seed it set (its index when unset). With one seed for all, every tensor rounded its
     * element e with the same uniform draw at a step, the layers' errors moving together. */
    if (!own || x->ccfg.seed == GVQ_CONFIG_UNDEF_INT)
        x->ccfg.seed = (int)((uint32_t)(x->ccfg.seed == GVQ_CONFIG_UNDEF_INT ? 0 : x->ccfg.seed) +
                             (uint32_t)index);
    if (x->info.kind == gvqVarConv) {
        x->ccfg.filters = x->shape[0];
        x->ccfg.depth = x->shape[1];
        x->ccfg.height = x->shape[2];
        x->ccfg.width = x->shape[3];
    } else if (x->info.kind == gvqVarFc) {
        x->ccfg.filters = x->shape[0];
        x->ccfg.depth = x->shape[1];
        x->ccfg.height = x->ccfg.width = 1;
    }
    return &x->ccfg;
}

static const char *codec_name(int codec) {
    static const char *names[] = {"none", "gradiveq", "qsgd", "powersgd"};
    return codec >= 0 && codec < 4 ? names[codec] : "?";
}

/* Route every variable; compressed ones get their compressor (in registration order, the same
 * on every rank). */
static gvqResult_t route_all(gvqTrainer_t t) {
    const char *fn = "gvqTrainCommit";
    for (int i = 0; i < t->nvars; i++) {
        tvar_t *x = &t->vars[i];
        const gvqCompressorConfig_t *c = codec_of(t, x);
        size_t bytes = x->info.count * sizeof(float);
        if (c != NULL) {
            gvqResult_t res = gvqCompressorCreate(t->comm, x->info.count, c, &x->comp);
            if (res != gvqSuccess) {
                GVQ_WARN("%s: variable '%s' (%s, %zu values): its compressor was refused: %s", fn,
                         x->info.name, gvq_train_kind_name(x->info.kind), x->info.count,
                         gvqGetLastError(t->comm));
                return res;
            }
            x->info.route = gvqRouteCompressed;
            x->info.codec = c->codec;
            snprintf(x->info.why, sizeof x->info.why, "%s compressor (%s)", codec_name(c->codec),
                     x->has_ccfg ? "the variable's" : "the config's");
        } else if (x->sp != NULL) {
            x->info.route = gvqRouteAllReduce; /* decided at the first step */
        } else if (x->factors) {
            x->info.route = gvqRouteAllReduce;
            snprintf(x->info.why, sizeof x->info.why, "factors: %s",
                     t->sfb < 0   ? "SACP picks SFB or the full matrix per step"
                     : t->sfb > 0 ? "always SFB (config)"
                                  : "always the full matrix (config)");
        } else if (bytes < t->bucket_bytes) {
            x->info.route = gvqRouteBucket;
            snprintf(x->info.why, sizeof x->info.why, "plain, %zu B < bucketBytes %zu: fused",
                     bytes, t->bucket_bytes);
        } else {
            x->info.route = gvqRouteAllReduce;
            snprintf(x->info.why, sizeof x->info.why, "plain, %zu B >= bucketBytes %zu: alone",
                     bytes, t->bucket_bytes);
        }
    }
    return gvqSuccess;
}

/* Fuse the bucket-routed variables, in registration order, into buckets of <= bucketBytes. */
/* Whether variable x goes through a compressor whose calls fuse in a group (its method's;
 * the library checks the settings again: calls of other settings run alone inside the group). */
static int fusable(const tvar_t *x) {
    return x->info.route == gvqRouteCompressed && gvq_compressor_fuses(x->comp);
}

/* The fused group of the fusable compressed variables (two or more), after the plain buckets. */
static gvqResult_t make_fused(gvqTrainer_t t) {
    int n = 0;
    for (int i = 0; i < t->nvars; i++) {
        t->vars[i].fused = -1;
        n += fusable(&t->vars[i]);
    }
    if (n < 2 || !gvq_param(GVQ_PARAM_TRAIN_FUSE_COMPRESSED)) return gvqSuccess;
    tbucket_t *b = &t->buckets[t->nbuckets];
    if ((b->members = calloc((size_t)n, sizeof(int))) == NULL) return gvqSystemError;
    b->fused = 1;
    for (int i = 0; i < t->nvars; i++)
        if (fusable(&t->vars[i])) {
            t->vars[i].fused = t->nbuckets;
            b->members[b->nmembers++] = i;
            b->count += t->vars[i].info.count;
        }
    b->pending = b->nmembers;
    t->nbuckets++;
    return gvqSuccess;
}

static gvqResult_t make_buckets(gvqTrainer_t t) {
    t->buckets = calloc((size_t)t->nvars + 1, sizeof *t->buckets);
    if (t->buckets == NULL) return gvqSystemError;
    tbucket_t *b = NULL;
    for (int i = 0; i < t->nvars; i++) {
        tvar_t *x = &t->vars[i];
        if (x->info.route != gvqRouteBucket) continue;
        if (b == NULL || (b->count + x->info.count) * sizeof(float) > t->bucket_bytes)
            b = &t->buckets[t->nbuckets++];
        if (b->members == NULL && (b->members = calloc((size_t)t->nvars, sizeof(int))) == NULL)
            return gvqSystemError;
        x->info.bucket = (int)(b - t->buckets);
        x->bucket_off = b->count;
        b->members[b->nmembers++] = i;
        b->count += x->info.count;
    }
    for (int k = 0; k < t->nbuckets; k++) {
        tbucket_t *bk = &t->buckets[k];
        bk->pending = bk->nmembers;
        if ((bk->buf = malloc(bk->count * sizeof(float))) == NULL) return gvqSystemError;
    }
    return make_fused(t);
}

static void log_routes(gvqTrainer_t t) {
    if (t->rank != 0) return;
    GVQ_INFO("training layer: %d variables, %d buckets (bucketBytes %zu), %s", t->nvars,
             t->nbuckets, t->bucket_bytes,
             t->wait_free ? "wait-free backprop" : "aggregation after backprop");
    for (int i = 0; i < t->nvars; i++) {
        const gvqTrainVariableInfo_t *v = &t->vars[i].info;
        char route[32];
        if (v->route == gvqRouteBucket)
            snprintf(route, sizeof route, "bucket %d", v->bucket);
        else
            snprintf(route, sizeof route, "%s",
                     v->route == gvqRouteCompressed ? "compressed" : "allreduce");
        GVQ_INFO("  %-16s %-5s %9zu  %-10s %s", v->name, gvq_train_kind_name(v->kind), v->count,
                 route, v->why);
    }
}

/* A hash of what decides the routes besides the variables: the config and every variable's own
 * codec, so that settings that differ between ranks (an environment variable set on one node)
 * are caught at commit rather than as a mismatch or a hang at the first step. */
static uint64_t settings_hash(const gvqTrainer_t t) {
    uint64_t h = 0xcbf29ce484222325ull;
    uint64_t cfg[9] = {t->bucket_bytes,
                       (uint64_t)t->schedule,
                       t->chunk_bytes,
                       (uint64_t)t->wait_free,
                       (uint64_t)t->op,
                       (uint64_t)t->sfb,
                       (uint64_t)t->sparse_route,
                       (uint64_t)t->tune_partitions,
                       gvq_param(GVQ_PARAM_TRAIN_FUSE_COMPRESSED)};
    h = fnv(h, cfg, sizeof cfg);
    h = fnv(h, &t->has_conv_cfg, sizeof t->has_conv_cfg);
    if (t->has_conv_cfg) h = fnv(h, &t->conv_cfg, CCFG_BYTES);
    h = fnv(h, &t->has_fc_cfg, sizeof t->has_fc_cfg);
    if (t->has_fc_cfg) h = fnv(h, &t->fc_cfg, CCFG_BYTES);
    for (int i = 0; i < t->nvars; i++) {
        const tvar_t *x = &t->vars[i];
        h = fnv(h, &x->factors, sizeof x->factors);
        h = fnv(h, &x->has_ccfg, sizeof x->has_ccfg);
        if (x->has_ccfg) h = fnv(h, &x->ccfg, CCFG_BYTES);
    }
    return h;
}

/* Undo a commit that failed on some rank: its compressors and buckets. */
static void uncommit(gvqTrainer_t t) {
    gvq_train_sparse_uncommit(t);
    gvq_train_plan_free(t);
    for (int i = 0; i < t->nvars; i++) {
        if (t->vars[i].comp != NULL) gvqCompressorDestroy(t->vars[i].comp);
        t->vars[i].comp = NULL;
        t->vars[i].info.bucket = -1;
    }
    for (int k = 0; k < t->nbuckets; k++) {
        free(t->buckets[k].members);
        free(t->buckets[k].buf);
    }
    free(t->buckets);
    t->buckets = NULL;
    t->nbuckets = 0;
}

GVQ_API gvqResult_t gvqTrainCommit(gvqTrainer_t t) {
    const char *fn = "gvqTrainCommit";
    GVQCHECK(gvq_train_check(fn, t));
    if (t->committed) {
        GVQ_WARN("%s: the layer was committed already", fn);
        return gvqInvalidUsage;
    }
    GVQCHECK(gvq_train_check_comm(fn, t));
    int equal = 0;
    GVQCHECK(all_equal(t, gvq_train_variables_hash(t, t->nvars), &equal));
    if (!equal) { /* the first variable that differs, for the WARN: a search every rank takes
                     alike, over the prefixes of the shortest list */
        uint64_t n[2] = {(uint64_t)t->nvars, ~(uint64_t)t->nvars};
        GVQCHECK(gvqAllReduce(n, n, 2, gvqUint64, gvqMax, t->comm, NULL));
        int lo = 0, hi = (int)~n[1]; /* prefix lo agrees; the shortest list has hi */
        while (lo < hi) {
            int mid = lo + (hi - lo + 1) / 2, eq = 0;
            GVQCHECK(all_equal(t, gvq_train_variables_hash(t, mid), &eq));
            if (eq)
                lo = mid;
            else
                hi = mid - 1;
        }
        GVQ_WARN("%s: the ranks registered different variables; the first that differs is "
                 "number %d (here: %s; this rank has %d, another %llu)",
                 fn, lo, lo < t->nvars ? t->vars[lo].info.name : "none", t->nvars,
                 (unsigned long long)(n[0] != (uint64_t)t->nvars ? n[0] : ~n[1]));
        return gvqInvalidArgument;
    }
    GVQCHECK(all_equal(t, settings_hash(t), &equal));
    if (!equal) {
        GVQ_WARN("%s: the ranks registered the same variables but with different settings "
                 "(bucketBytes %zu here, GVQ_TRAIN_BUCKET_BYTES, GVQ_TRAIN_FUSE_COMPRESSED, "
                 "waitFree, op, "
                 "sfb, or a codec config)",
                 fn, t->bucket_bytes);
        return gvqInvalidArgument;
    }
    gvqResult_t res = route_all(t); /* the same on every rank unless memory runs out */
    if (res == gvqSuccess && make_buckets(t) != gvqSuccess) {
        GVQ_WARN("%s: out of memory for the buckets", fn);
        res = gvqSystemError;
    }
    if (res == gvqSuccess) res = gvq_train_sparse_commit(t);
    t->inline_calls = !gvq_comm_concurrent(t->comm);
    if (res == gvqSuccess) res = gvq_train_plan_commit(t);
    GVQCHECK(all_equal(t, (uint64_t)res, &equal)); /* every rank commits, or none */
    if (res != gvqSuccess || !equal) {
        uncommit(t);
        if (res == gvqSuccess) {
            GVQ_WARN("%s: another rank could not commit (see its log)", fn);
            res = gvqRemoteError;
        }
        return res;
    }
    t->committed = 1;
    if (t->inline_calls && t->rank == 0)
        GVQ_WARN("%s: MPI runs below MPI_THREAD_MULTIPLE, so the layer cannot aggregate on its "
                 "own thread: each aggregation runs at once on the calling thread, without "
                 "overlap (initialize MPI with MPI_THREAD_MULTIPLE for wait-free backprop)",
                 fn);
    log_routes(t);
    return gvqSuccess;
}
