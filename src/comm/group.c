/*
 * group.c -- the calling thread's group (gvq_group.h): how deep inside gvqGroupStart it is, the
 * calls queued so far and the first refusal. Thread-local, so groups of different threads never
 * mix.
 */
#include <stdio.h>
#include <stdlib.h>

#include "gvq_group.h"

static __thread gvq_group_t group;

gvq_group_t *gvq_group_self(void) {
    return &group;
}

int gvq_group_active(void) {
    return group.depth > 0;
}

gvqResult_t gvq_group_push(gvq_group_t *g, const gvq_op_t *o) {
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        gvq_op_t *ops = realloc(g->ops, cap * sizeof *ops);
        if (ops == NULL) {
            if (g->error == gvqSuccess) g->error = gvqSystemError;
            return gvqSystemError;
        }
        g->ops = ops;
        g->cap = cap;
    }
    g->ops[g->n++] = *o;
    return gvqSuccess;
}

void gvq_group_refuse(gvq_group_t *g, gvqResult_t res) {
    if (g->error != gvqSuccess) return;
    g->error = res;
    snprintf(g->error_text, sizeof g->error_text, "%s", gvq_log_last_warn());
}

void gvq_group_clear(gvq_group_t *g) {
    free(g->ops);
    g->ops = NULL;
    g->n = g->cap = 0;
    g->error = gvqSuccess;
}
