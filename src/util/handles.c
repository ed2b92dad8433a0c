/*
 * handles.c -- the registry of live handles (gvq_handles.h): an array of addresses under a
 * mutex. Lookups compare addresses only.
 */
#include <stdlib.h>

#include "gvq_handles.h"

void gvq_handles_lock(gvq_handles_t *set) {
    pthread_mutex_lock(&set->lock);
}

void gvq_handles_unlock(gvq_handles_t *set) {
    pthread_mutex_unlock(&set->lock);
}

int gvq_handles_find_locked(const gvq_handles_t *set, const void *h) {
    if (h == NULL) return -1;
    for (size_t i = 0; i < set->n; i++)
        if (set->items[i] == h) return (int)i;
    return -1;
}

void gvq_handles_remove_locked(gvq_handles_t *set, int index) {
    set->items[index] = set->items[--set->n];
}

gvqResult_t gvq_handles_add(gvq_handles_t *set, const void *h) {
    gvqResult_t res = gvqSuccess;
    gvq_handles_lock(set);
    if (set->n == set->cap) {
        size_t cap = set->cap ? 2 * set->cap : 16;
        const void **items = realloc(set->items, cap * sizeof *items);
        if (items == NULL) {
            res = gvqSystemError;
            goto out;
        }
        set->items = items;
        set->cap = cap;
    }
    set->items[set->n++] = h;
out:
    gvq_handles_unlock(set);
    return res;
}

int gvq_handles_remove(gvq_handles_t *set, const void *h) {
    gvq_handles_lock(set);
    int i = gvq_handles_find_locked(set, h);
    if (i >= 0) gvq_handles_remove_locked(set, i);
    gvq_handles_unlock(set);
    return i >= 0;
}

int gvq_handles_live(gvq_handles_t *set, const void *h) {
    gvq_handles_lock(set);
    int live = gvq_handles_find_locked(set, h) >= 0;
    gvq_handles_unlock(set);
    return live;
}
