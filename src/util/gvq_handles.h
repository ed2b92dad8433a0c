/*
 * gvq_handles.h -- a registry of live handles (communicators, compressors, parameter servers),
 * so that every entry point can refuse a NULL or destroyed handle without touching freed
 * memory: a handle is looked up by address under the registry's lock, never dereferenced to
 * find out whether it is alive.
 */
#ifndef GVQ_HANDLES_H_
#define GVQ_HANDLES_H_

#include <pthread.h>
#include <stddef.h>

#include "gvq_util.h"

typedef struct {
    pthread_mutex_t lock;
    const void **items;
    size_t n, cap;
} gvq_handles_t;

#define GVQ_HANDLES_INITIALIZER \
    { PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0 }

/* Register h as live (gvqSystemError when memory runs out). */
gvqResult_t gvq_handles_add(gvq_handles_t *set, const void *h);
/* Take h out; 0 if it was not live (NULL, never added, or removed already). */
int gvq_handles_remove(gvq_handles_t *set, const void *h);
/* Whether h is live now. */
int gvq_handles_live(gvq_handles_t *set, const void *h);

/* For checks that must hold the lock across a lookup and an action (enter a communicator, abort
 * it): lock, find (index or -1), remove by index, unlock. */
void gvq_handles_lock(gvq_handles_t *set);
void gvq_handles_unlock(gvq_handles_t *set);
int gvq_handles_find_locked(const gvq_handles_t *set, const void *h);
void gvq_handles_remove_locked(gvq_handles_t *set, int index);

#endif /* GVQ_HANDLES_H_ */
