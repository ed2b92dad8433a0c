/*
 * trainer_save.c -- the training layer's saved state: what a resumed run needs to continue
 * exactly. The routes follow from the variables and the config, so the state checks them
 * instead of storing them; it carries each compressor's own saved state and the counters.
 *
 *   header  magic 'gvqL', version, checksum (CRC-32C of the whole state, gvq_blob_seal),
 *           total size, variables, the variables' hash (names, kinds, shapes)
 *   per variable, in registration order:
 *           steps, wire bytes, route, compressor state length (0: none), sparse state length
 *           (0: not sparse), the compressor's state and the sparse table's, each padded to 8
 *
 * Loading checks everything before it changes anything, and a compressor that refuses its
 * state puts back the states of those loaded before it: all or nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "gvq_trainer.h"

#define STATE_MAGIC 0x4c717667u /* 'gvqL' */
#define STATE_VERSION 2u

typedef struct {
    uint32_t magic, version;
    uint64_t checksum; /* at offset 8 */
    uint64_t size, nvars, hash;
} state_header_t;

typedef struct {
    uint64_t steps, wire_bytes;
    uint32_t route, zero;
    uint64_t comp_bytes;
    uint64_t sparse_bytes; /* a sparse variable's table or shards (trainer_sparse.c) */
} state_var_t;

#define PAD8(n) (((n) + 7u) & ~(size_t)7u)

/* The bytes of variable i's compressor state (0: none). */
static gvqResult_t comp_bytes(gvqTrainer_t t, int i, size_t *n) {
    *n = 0;
    return t->vars[i].comp != NULL ? gvqCompressorSave(t->vars[i].comp, NULL, n) : gvqSuccess;
}

static gvqResult_t train_save(void *obj, void *buf, size_t *size) {
    gvqTrainer_t t = obj;
    size_t need = sizeof(state_header_t);
    for (int i = 0; i < t->nvars; i++) {
        size_t n, sn;
        GVQCHECK(comp_bytes(t, i, &n));
        GVQCHECK(gvq_train_sparse_state_bytes(&t->vars[i], &sn));
        need += sizeof(state_var_t) + PAD8(n) + PAD8(sn);
    }
    if (buf == NULL) {
        *size = need;
        return gvqSuccess;
    }
    if (*size < need) {
        GVQ_WARN("gvqTrainSave: the buffer holds %zu bytes, the state needs %zu", *size, need);
        *size = need;
        return gvqInvalidArgument;
    }
    memset(buf, 0, need);
    state_header_t h = {STATE_MAGIC, STATE_VERSION,      0,
                        need,        (uint64_t)t->nvars, gvq_train_variables_hash(t, t->nvars)};
    memcpy(buf, &h, sizeof h);
    char *p = (char *)buf + sizeof h;
    for (int i = 0; i < t->nvars; i++) {
        const tvar_t *x = &t->vars[i];
        size_t n, sn;
        GVQCHECK(comp_bytes(t, i, &n));
        GVQCHECK(gvq_train_sparse_state_bytes(x, &sn));
        state_var_t v = {
            (uint64_t)x->info.steps, x->info.wireBytes, (uint32_t)x->info.route, 0, n, sn};
        if (x->factors || x->sp != NULL) v.route = gvqRouteAllReduce; /* chosen per step / later */
        memcpy(p, &v, sizeof v);
        p += sizeof v;
        if (n > 0) GVQCHECK(gvqCompressorSave(x->comp, p, &n));
        p += PAD8(n);
        if (sn > 0) GVQCHECK(gvq_train_sparse_save(x, p, sn));
        p += PAD8(sn);
    }
    gvq_blob_seal(buf, need, offsetof(state_header_t, checksum));
    *size = need;
    return gvqSuccess;
}

/* Every check, nothing changed: the entries of the variables, at entry[i]. */
static gvqResult_t check_state(gvqTrainer_t t, const void *buf, size_t size,
                               const state_var_t **entry, const char **blob, const char **sblob) {
    const char *fn = "gvqTrainLoad";
    state_header_t h;
    if (buf == NULL || size < sizeof h) {
        GVQ_WARN("%s: %s", fn, buf == NULL ? "buf is NULL" : "the state is too short");
        return gvqInvalidArgument;
    }
    GVQCHECK(gvq_blob_verify(fn, buf, size, offsetof(state_header_t, checksum)));
    memcpy(&h, buf, sizeof h);
    if (h.magic != STATE_MAGIC || h.version != STATE_VERSION || h.size != size) {
        GVQ_WARN("%s: not a training layer's state of this version (magic 0x%x, version %u, "
                 "size %llu of %zu)",
                 fn, h.magic, h.version, (unsigned long long)h.size, size);
        return gvqInvalidArgument;
    }
    if (h.nvars != (uint64_t)t->nvars || h.hash != gvq_train_variables_hash(t, t->nvars)) {
        GVQ_WARN("%s: the state belongs to other variables (%llu saved, %d here, or other names "
                 "or shapes)",
                 fn, (unsigned long long)h.nvars, t->nvars);
        return gvqInvalidArgument;
    }
    size_t at = sizeof h;
    for (int i = 0; i < t->nvars; i++) {
        const tvar_t *x = &t->vars[i];
        state_var_t v;
        if (size - at < sizeof v) {
            GVQ_WARN("%s: the state ends inside variable %d", fn, i);
            return gvqInvalidArgument;
        }
        entry[i] = (const state_var_t *)((const char *)buf + at);
        memcpy(&v, entry[i], sizeof v);
        at += sizeof v;
        uint32_t route = x->factors || x->sp != NULL ? gvqRouteAllReduce : (uint32_t)x->info.route;
        if (v.route != route || (v.comp_bytes != 0) != (x->comp != NULL) ||
            v.comp_bytes > size - at || PAD8(v.comp_bytes) > size - at) {
            GVQ_WARN("%s: variable %d '%s': the state's route %u or compressor (%llu bytes) does "
                     "not match this layer's (route %u, %s); was it saved with another config?",
                     fn, i, x->info.name, v.route, (unsigned long long)v.comp_bytes, route,
                     x->comp != NULL ? "a compressor" : "no compressor");
            return gvqInvalidArgument;
        }
        blob[i] = (const char *)buf + at;
        at += PAD8(v.comp_bytes);
        if ((v.sparse_bytes != 0) != (x->sp != NULL) || v.sparse_bytes > size - at ||
            PAD8(v.sparse_bytes) > size - at) {
            GVQ_WARN("%s: variable %d '%s': the state's sparse table (%llu bytes) does not fit "
                     "this layer's variable",
                     fn, i, x->info.name, (unsigned long long)v.sparse_bytes);
            return gvqInvalidArgument;
        }
        sblob[i] = (const char *)buf + at;
        if (x->sp != NULL) GVQCHECK(gvq_train_sparse_check(x, sblob[i], (size_t)v.sparse_bytes));
        at += PAD8(v.sparse_bytes);
    }
    if (at != size) {
        GVQ_WARN("%s: %zu bytes after the last variable", fn, size - at);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

/* own: this rank's state; else another rank's, taken as a rank that joins takes it (each
 * compressor's shared part, gvqCompressorLoadShared; a sparse variable's table or shards belong
 * to their ranks, so such a state is refused). */
static gvqResult_t train_load_as(gvqTrainer_t t, const void *buf, size_t size, int own) {
    gvqResult_t res = gvqSuccess;
    const state_var_t **entry = calloc((size_t)t->nvars + 1, sizeof *entry);
    const char **blob = calloc((size_t)t->nvars + 1, sizeof *blob);
    const char **sblob = calloc((size_t)t->nvars + 1, sizeof *sblob);
    void **backup = calloc((size_t)t->nvars + 1, sizeof *backup);
    size_t *backup_bytes = calloc((size_t)t->nvars + 1, sizeof *backup_bytes);
    int loaded = 0;
    if (entry == NULL || blob == NULL || sblob == NULL || backup == NULL || backup_bytes == NULL) {
        GVQ_WARN("gvqTrainLoad: out of memory");
        res = gvqSystemError;
        goto out;
    }
    GVQCHECKGOTO(check_state(t, buf, size, entry, blob, sblob), res, out);
    for (int i = 0; i < t->nvars && !own; i++) {
        state_var_t v;
        memcpy(&v, entry[i], sizeof v);
        if (v.sparse_bytes > 0) {
            GVQ_WARN("gvqTrainLoadShared: variable %d '%s' is sparse: its table or shards are "
                     "its ranks' own, not to be taken from another rank; nothing loaded",
                     i, t->vars[i].info.name);
            res = gvqInvalidUsage;
            goto out;
        }
    }
    for (int i = 0; i < t->nvars; i++) { /* what to put back if a compressor refuses */
        if (t->vars[i].comp == NULL) continue;
        GVQCHECKGOTO(comp_bytes(t, i, &backup_bytes[i]), res, out);
        if ((backup[i] = malloc(backup_bytes[i])) == NULL) {
            res = gvqSystemError;
            goto out;
        }
        GVQCHECKGOTO(gvqCompressorSave(t->vars[i].comp, backup[i], &backup_bytes[i]), res, out);
    }
    for (loaded = 0; loaded < t->nvars; loaded++) {
        state_var_t v;
        memcpy(&v, entry[loaded], sizeof v);
        if (v.comp_bytes == 0) continue;
        res =
            own ? gvqCompressorLoad(t->vars[loaded].comp, blob[loaded], (size_t)v.comp_bytes)
                : gvqCompressorLoadShared(t->vars[loaded].comp, blob[loaded], (size_t)v.comp_bytes);
        if (res != gvqSuccess) break;
    }
    if (res != gvqSuccess) {                              /* all or nothing */
        for (int i = 0; i <= loaded && i < t->nvars; i++) /* the refusing one may be half-loaded */
            if (backup[i] != NULL)
                (void)gvqCompressorLoad(t->vars[i].comp, backup[i], backup_bytes[i]);
        GVQ_WARN("gvqTrainLoad%s: variable %d '%s' refused its compressor state; nothing loaded",
                 own ? "" : "Shared", loaded, t->vars[loaded].info.name);
        goto out;
    }
    for (int i = 0; i < t->nvars; i++) {
        state_var_t v;
        memcpy(&v, entry[i], sizeof v);
        t->vars[i].info.steps = (long long)v.steps;
        t->vars[i].info.wireBytes = v.wire_bytes;
        /* checked above; fails only for lack of memory or a peer while making a server */
        if (t->vars[i].sp != NULL && res == gvqSuccess)
            res = gvq_train_sparse_load(t, &t->vars[i], sblob[i], (size_t)v.sparse_bytes);
    }
out:
    for (int i = 0; backup != NULL && i < t->nvars; i++)
        free(backup[i]);
    free(backup);
    free(backup_bytes);
    free(entry);
    free(blob);
    free(sblob);
    return res;
}

static gvqResult_t train_load(void *obj, const void *buf, size_t size) {
    return train_load_as(obj, buf, size, 1);
}

/* Saving and loading happen between steps, on a committed layer. */
static gvqResult_t check_between_steps(const char *fn, gvqTrainer_t t) {
    GVQCHECK(gvq_train_check(fn, t));
    if (!t->committed) {
        GVQ_WARN("%s: call gvqTrainCommit first (the compressors exist from then on)", fn);
        return gvqInvalidUsage;
    }
    for (int i = 0; i < t->nvars; i++)
        if (t->vars[i].grad != NULL) {
            GVQ_WARN("%s: a step is open (variable '%s' is ready); call gvqTrainWaitAll first", fn,
                     t->vars[i].info.name);
            return gvqInvalidUsage;
        }
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqTrainSave(gvqTrainer_t t, void *buf, size_t *size) {
    GVQCHECK(check_between_steps("gvqTrainSave", t));
    if (size == NULL) {
        GVQ_WARN("gvqTrainSave: size is NULL");
        return gvqInvalidArgument;
    }
    return train_save(t, buf, size);
}

GVQ_API gvqResult_t gvqTrainLoad(gvqTrainer_t t, const void *buf, size_t size) {
    GVQCHECK(check_between_steps("gvqTrainLoad", t));
    return train_load(t, buf, size);
}

GVQ_API gvqResult_t gvqTrainLoadShared(gvqTrainer_t t, const void *buf, size_t size) {
    GVQCHECK(check_between_steps("gvqTrainLoadShared", t));
    return train_load_as(t, buf, size, 0);
}

GVQ_API gvqResult_t gvqTrainSaveFile(gvqTrainer_t t, const char *path) {
    GVQCHECK(check_between_steps("gvqTrainSaveFile", t));
    return gvq_blob_save_file("gvqTrainSaveFile", path, train_save, t);
}

GVQ_API gvqResult_t gvqTrainLoadFile(gvqTrainer_t t, const char *path) {
    GVQCHECK(check_between_steps("gvqTrainLoadFile", t));
    return gvq_blob_load_file("gvqTrainLoadFile", path, train_load, t);
}
