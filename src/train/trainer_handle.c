/*
 * trainer_handle.c -- the registry of live training layers, below the files that use it
 * (trainer.c, trainer_save.c, trainer_sparse.c): a handle is looked up by address, never
 * dereferenced to find out whether it is alive.
 */
#include "gvq_handles.h"
#include "gvq_trainer.h"

static gvq_handles_t live = GVQ_HANDLES_INITIALIZER;

gvqResult_t gvq_train_register(gvqTrainer_t t) {
    return gvq_handles_add(&live, t);
}

int gvq_train_unregister(gvqTrainer_t t) {
    return gvq_handles_remove(&live, t);
}

gvqResult_t gvq_train_check(const char *fn, gvqTrainer_t t) {
    if (gvq_handles_live(&live, t)) return gvqSuccess;
    GVQ_WARN("%s: trainer %p is %s", fn, (void *)t,
             t == NULL ? "NULL" : "not a live training layer (destroyed?)");
    return gvqInvalidArgument;
}

gvqResult_t gvq_train_check_step(const char *fn, gvqTrainer_t t) {
    GVQCHECK(gvq_train_check(fn, t));
    if (!t->committed) {
        GVQ_WARN("%s: call gvqTrainCommit first", fn);
        return gvqInvalidUsage;
    }
    return gvq_comm_check(t->comm, fn, 1); /* live, and the caller outside a group */
}

gvqResult_t gvq_train_check_comm(const char *fn, gvqTrainer_t t) {
    return gvq_comm_check(t->comm, fn, 1);
}

const char *gvq_train_kind_name(int kind) {
    return kind == gvqVarConv     ? "conv"
           : kind == gvqVarFc     ? "fc"
           : kind == gvqVarSparse ? "sparse"
                                  : "dense";
}
