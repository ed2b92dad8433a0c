/*
 * thread.c -- what the calling thread is: a host stream's progress thread (background work that
 * leaves the core to the caller's compute while it waits on the network, unless the caller is
 * itself waiting for it) or not.
 */
#include "gvq_util.h"

static __thread const int *caller_waits; /* NULL: not a background thread */
static int drainers;                     /* callers blocked until background work is done */

void gvq_thread_set_background(const int *waits) {
    caller_waits = waits;
}

void gvq_thread_caller_blocked(int delta) {
    __atomic_add_fetch(&drainers, delta, __ATOMIC_ACQ_REL);
}

int gvq_thread_may_sleep(void) {
    return caller_waits != NULL && __atomic_load_n(caller_waits, __ATOMIC_ACQUIRE) == 0 &&
           __atomic_load_n(&drainers, __ATOMIC_ACQUIRE) == 0;
}
