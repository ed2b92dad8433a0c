/*
 * stream.c -- host streams: what a CUDA stream is to NCCL's calls on device buffers, a gvq
 * stream is to calls on host buffers. A call given a stream is checked on the caller's thread,
 * queued as a job, and returns; the stream's progress thread runs the jobs in issue order.
 *
 *   caller's thread                          progress thread of stream s
 *   gvqAllReduce(.., comm, s)
 *     check the arguments (refused: return now)
 *     take a ticket on comm  -->  s: [ job | job | job ]
 *     return gvqSuccess                       take the head job
 *                                             wait for comm's turn: comm->stream_done == ticket
 *                                             run the call (the blocking code path)
 *                                             comm->stream_done++ ; s->done++ ; wake the waiters
 *   gvqStreamSynchronize(s): wait until s->done == s->issued; return the first unreported error
 *
 * Order per communicator. A job takes a ticket on each of its communicators when it is issued
 * (comm->stream_issued++) and runs when comm->stream_done reaches it; a blocking call on a
 * communicator first waits until stream_done == stream_issued (gvq_comm_enter). Tickets follow
 * the caller's issue order, which NCCL's rule makes the same on every rank, so the calls meet in
 * the same order everywhere; and the earliest job not yet run can always run (every job issued
 * before it has run), so streams never wait on each other in a circle.
 *
 * Errors. A job's failure is kept with its WARN line as the stream's first unreported error:
 * the next wait on the stream returns it (and makes its WARN gvqGetLastError's), and the
 * communicator's stream_error shows it to gvqCommGetAsyncError until a later job on the
 * communicator succeeds. A communicator is freed only after its queued jobs have run: destroy
 * waits for them, abort makes them fail at once (gvq_comm_enter refuses an aborted
 * communicator), so neither hangs or leaves a job pointing at freed memory.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gvq_handles.h"
#include "gvq_stream.h"

#define STREAM_MAGIC 0x67767153u /* 'gvqS' */
#define EVENT_MAGIC 0x67767145u  /* 'gvqE' */

typedef struct gvq_job {
    struct gvq_job *next;
    uint64_t seq; /* position in its stream, from 1 */
    const char *fn;
    int ncomms;
    gvqComm_t *comms;  /* distinct */
    uint64_t *tickets; /* tickets[i]: comms[i]->stream_issued when the job was issued */
    gvq_job_fn run;
    gvq_job_free_fn release;
    void *arg;
} gvq_job_t;

typedef struct {
    uint32_t magic;
    uint64_t serial; /* events name their stream by address and serial */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work; /* the progress thread waits here for jobs */
    pthread_cond_t idle; /* waiters wait here for jobs to finish */
    gvq_job_t *head, *tail;
    uint64_t issued, done; /* jobs queued and finished so far */
    int closing;           /* destroy: the progress thread ends when the queue is empty */
    int waiters;        /* threads inside a wait (destroy frees only when none is); atomic, as the
                           progress thread reads it to choose between sleeping and spinning */
    gvqResult_t error;  /* the first error not yet reported by a wait */
    uint64_t error_seq; /* its job's seq */
    char error_text[1024]; /* its WARN line */
} gvq_stream_t;

struct gvqEvent {
    uint32_t magic;
    const gvq_stream_t *stream; /* NULL: never recorded */
    uint64_t serial;            /* the stream's */
    uint64_t seq;               /* complete when the stream's done reaches it */
};

static gvq_handles_t streams = GVQ_HANDLES_INITIALIZER;
static gvq_handles_t events = GVQ_HANDLES_INITIALIZER;
static uint64_t last_serial; /* under streams' lock */

/* Every communicator's turn: jobs wait here for stream_done to reach their tickets, blocking
 * calls for it to reach stream_issued. */
static pthread_mutex_t order_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t order_cv = PTHREAD_COND_INITIALIZER;

static __thread int on_progress_thread;

int gvq_stream_on_progress_thread(void) {
    return on_progress_thread;
}

int gvq_stream_is_host(gvqStream_t s) {
    return s != NULL && gvq_handles_live(&streams, s);
}

/* ---- the order per communicator ----------------------------------------------------------- */

void gvq_stream_comm_drain(gvqComm_t c) {
    if (__atomic_load_n(&c->stream_done, __ATOMIC_ACQUIRE) ==
        __atomic_load_n(&c->stream_issued, __ATOMIC_ACQUIRE))
        return;
    gvq_thread_caller_blocked(1); /* the progress threads spin while a caller waits */
    pthread_mutex_lock(&order_lock);
    while (__atomic_load_n(&c->stream_done, __ATOMIC_ACQUIRE) !=
           __atomic_load_n(&c->stream_issued, __ATOMIC_ACQUIRE))
        pthread_cond_wait(&order_cv, &order_lock);
    pthread_mutex_unlock(&order_lock);
    gvq_thread_caller_blocked(-1);
}

int gvq_stream_comm_settled(gvqComm_t c) {
    return on_progress_thread || __atomic_load_n(&c->stream_done, __ATOMIC_ACQUIRE) ==
                                     __atomic_load_n(&c->stream_issued, __ATOMIC_ACQUIRE);
}

void gvq_stream_comm_settle(gvqComm_t c) {
    if (!on_progress_thread) gvq_stream_comm_drain(c);
}

static void wait_turn(const gvq_job_t *j) {
    pthread_mutex_lock(&order_lock);
    for (int i = 0; i < j->ncomms; i++)
        while (__atomic_load_n(&j->comms[i]->stream_done, __ATOMIC_ACQUIRE) != j->tickets[i])
            pthread_cond_wait(&order_cv, &order_lock);
    pthread_mutex_unlock(&order_lock);
}

/* The job is done: its communicators' next calls may go (after this, the job no longer
 * touches them: one may be freed at once). */
static void pass_turn(const gvq_job_t *j, gvqResult_t res) {
    pthread_mutex_lock(&order_lock);
    for (int i = 0; i < j->ncomms; i++) {
        __atomic_store_n(&j->comms[i]->stream_error, res, __ATOMIC_RELEASE);
        __atomic_add_fetch(&j->comms[i]->stream_done, 1, __ATOMIC_ACQ_REL);
    }
    pthread_cond_broadcast(&order_cv);
    pthread_mutex_unlock(&order_lock);
}

/* ---- jobs ----------------------------------------------------------------------------------- */

static void job_free(gvq_job_t *j) {
    free(j->comms);
    free(j->tickets);
    free(j);
}

/* A job with the distinct communicators of comms. */
static gvq_job_t *job_new(gvqComm_t const *comms, int ncomms) {
    gvq_job_t *j = calloc(1, sizeof *j);
    if (j == NULL) return NULL;
    j->comms = calloc((size_t)(ncomms > 0 ? ncomms : 1), sizeof *j->comms);
    j->tickets = calloc((size_t)(ncomms > 0 ? ncomms : 1), sizeof *j->tickets);
    if (j->comms == NULL || j->tickets == NULL) {
        job_free(j);
        return NULL;
    }
    for (int i = 0; i < ncomms; i++) {
        int seen = 0;
        for (int k = 0; k < j->ncomms; k++)
            seen |= j->comms[k] == comms[i];
        if (!seen) j->comms[j->ncomms++] = comms[i];
    }
    return j;
}

gvqResult_t gvq_stream_enqueue(gvqStream_t handle, const char *fn, gvqComm_t const *comms,
                               int ncomms, gvq_job_fn run, gvq_job_free_fn release, void *arg) {
    gvqResult_t res = gvqSuccess;
    gvq_job_t *j = job_new(comms, ncomms);
    if (j == NULL) {
        GVQ_WARN("%s: out of memory queueing the call on stream %p", fn, handle);
        res = gvqSystemError;
        goto err_release;
    }
    for (int i = 0; i < j->ncomms; i++)
        if (!j->comms[i]->xport->concurrent) {
            GVQ_WARN("%s: host streams need a transport that runs calls from several threads; "
                     "initialize MPI with MPI_THREAD_MULTIPLE (or let gvq initialize it)",
                     fn);
            res = gvqInvalidUsage;
            goto err_free_job;
        }
    j->fn = fn;
    j->run = run;
    j->release = release;
    j->arg = arg;
    gvq_handles_lock(&streams);
    if (gvq_handles_find_locked(&streams, handle) < 0) {
        gvq_handles_unlock(&streams);
        GVQ_WARN("%s: stream %p is not a live host stream (gvqStreamCreate)", fn, handle);
        res = gvqInvalidArgument;
        goto err_free_job;
    }
    gvq_stream_t *s = handle;
    pthread_mutex_lock(&s->lock);
    pthread_mutex_lock(&order_lock); /* a job's tickets are taken together */
    for (int i = 0; i < j->ncomms; i++)
        j->tickets[i] = __atomic_fetch_add(&j->comms[i]->stream_issued, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&order_lock);
    j->seq = ++s->issued;
    if (s->tail != NULL)
        s->tail->next = j;
    else
        s->head = j;
    s->tail = j;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->lock);
    gvq_handles_unlock(&streams);
    return gvqSuccess;
err_free_job:
    job_free(j);
err_release:
    release(arg);
    return res;
}

/* Run one job in its communicators' turn; its result. */
static gvqResult_t job_run(gvq_job_t *j, char *warn, size_t warn_size) {
    wait_turn(j);
    gvqResult_t res = j->run(j->arg);
    if (res != gvqSuccess) snprintf(warn, warn_size, "%s", gvq_log_last_warn());
    j->release(j->arg);
    pass_turn(j, res);
    return res;
}

static void *progress_main(void *arg) {
    gvq_stream_t *s = arg;
    on_progress_thread = 1;
    gvq_thread_set_background(&s->waiters);
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (s->head == NULL && !s->closing)
            pthread_cond_wait(&s->work, &s->lock);
        gvq_job_t *j = s->head;
        if (j == NULL) break; /* closing, and nothing left */
        pthread_mutex_unlock(&s->lock);
        char warn[sizeof s->error_text];
        gvqResult_t res = job_run(j, warn, sizeof warn);
        pthread_mutex_lock(&s->lock);
        s->head = j->next;
        if (s->head == NULL) s->tail = NULL;
        s->done = j->seq;
        if (res != gvqSuccess && s->error == gvqSuccess) {
            s->error = res;
            s->error_seq = j->seq;
            snprintf(s->error_text, sizeof s->error_text, "%s", warn);
        }
        pthread_cond_broadcast(&s->idle);
        job_free(j);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* ---- waits ---------------------------------------------------------------------------------- */

/* The live stream of handle (with serial, unless 0), locked, counted as waited on; NULL if
 * there is none. */
static gvq_stream_t *stream_acquire(const void *handle, uint64_t serial) {
    gvq_handles_lock(&streams);
    gvq_stream_t *s = NULL;
    if (gvq_handles_find_locked(&streams, handle) >= 0) {
        s = (gvq_stream_t *)handle;
        if (serial != 0 && s->serial != serial) s = NULL;
    }
    if (s != NULL) {
        pthread_mutex_lock(&s->lock);
        __atomic_add_fetch(&s->waiters, 1, __ATOMIC_ACQ_REL);
    }
    gvq_handles_unlock(&streams);
    return s;
}

static void stream_release(gvq_stream_t *s) {
    __atomic_sub_fetch(&s->waiters, 1, __ATOMIC_ACQ_REL);
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
}

/* The stream's unreported error if its job is at or before seq (forgotten with forget), its
 * WARN made the calling thread's last. Under s->lock. */
static gvqResult_t take_error(gvq_stream_t *s, uint64_t seq, int forget) {
    gvqResult_t res = s->error;
    if (res == gvqSuccess || s->error_seq > seq) return gvqSuccess;
    gvq_log_set_last_warn(s->error_text);
    if (forget) s->error = gvqSuccess;
    return res;
}

static gvqResult_t refuse_stream(const char *fn, gvqStream_t stream) {
    GVQ_WARN("%s: stream %p is %s", fn, stream,
             stream == NULL ? "NULL" : "not a live host stream (gvqStreamCreate; destroyed?)");
    return gvqInvalidArgument;
}

/* ---- public calls --------------------------------------------------------------------------- */

GVQ_API gvqResult_t gvqStreamCreate(gvqStream_t *stream) {
    if (stream == NULL) {
        GVQ_WARN("gvqStreamCreate: stream is NULL");
        return gvqInvalidArgument;
    }
    gvq_stream_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        GVQ_WARN("gvqStreamCreate: out of memory");
        return gvqSystemError;
    }
    s->magic = STREAM_MAGIC;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    int rc = pthread_create(&s->thread, NULL, progress_main, s);
    if (rc != 0) {
        GVQ_WARN("gvqStreamCreate: cannot start the progress thread (%s)", strerror(rc));
        goto err_free;
    }
    gvq_handles_lock(&streams);
    s->serial = ++last_serial;
    gvq_handles_unlock(&streams);
    if (gvq_handles_add(&streams, s) != gvqSuccess) {
        GVQ_WARN("gvqStreamCreate: out of memory");
        pthread_mutex_lock(&s->lock);
        s->closing = 1;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
        goto err_free;
    }
    *stream = s;
    return gvqSuccess;
err_free:
    pthread_cond_destroy(&s->idle);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->lock);
    free(s);
    return gvqSystemError;
}

GVQ_API gvqResult_t gvqStreamDestroy(gvqStream_t stream) {
    if (!gvq_handles_remove(&streams, stream)) return refuse_stream("gvqStreamDestroy", stream);
    gvq_stream_t *s = stream;
    pthread_mutex_lock(&s->lock);
    s->closing = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->lock);
    __atomic_add_fetch(&s->waiters, 1, __ATOMIC_ACQ_REL); /* waited for: no sleeping */
    pthread_join(s->thread, NULL);                        /* every queued job has run */
    __atomic_sub_fetch(&s->waiters, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_lock(&s->lock);
    while (__atomic_load_n(&s->waiters, __ATOMIC_ACQUIRE) > 0)
        pthread_cond_wait(&s->idle, &s->lock);
    gvqResult_t res = take_error(s, UINT64_MAX, 1);
    pthread_mutex_unlock(&s->lock);
    pthread_cond_destroy(&s->idle);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->lock);
    s->magic = 0;
    free(s);
    return res;
}

GVQ_API gvqResult_t gvqStreamSynchronize(gvqStream_t stream) {
    gvq_stream_t *s = stream_acquire(stream, 0);
    if (s == NULL) return refuse_stream("gvqStreamSynchronize", stream);
    while (s->done < s->issued)
        pthread_cond_wait(&s->idle, &s->lock);
    gvqResult_t res = take_error(s, UINT64_MAX, 1);
    stream_release(s);
    return res;
}

GVQ_API gvqResult_t gvqStreamQuery(gvqStream_t stream) {
    gvq_stream_t *s = stream_acquire(stream, 0);
    if (s == NULL) return refuse_stream("gvqStreamQuery", stream);
    gvqResult_t res = s->done < s->issued ? gvqInProgress : take_error(s, UINT64_MAX, 1);
    stream_release(s);
    return res;
}

GVQ_API gvqResult_t gvqEventCreate(gvqEvent_t *event) {
    if (event == NULL) {
        GVQ_WARN("gvqEventCreate: event is NULL");
        return gvqInvalidArgument;
    }
    gvqEvent_t e = calloc(1, sizeof *e);
    if (e == NULL || gvq_handles_add(&events, e) != gvqSuccess) {
        free(e);
        GVQ_WARN("gvqEventCreate: out of memory");
        return gvqSystemError;
    }
    e->magic = EVENT_MAGIC;
    *event = e;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqEventDestroy(gvqEvent_t event) {
    if (!gvq_handles_remove(&events, event)) {
        GVQ_WARN("gvqEventDestroy: event %p is %s", (void *)event,
                 event == NULL ? "NULL" : "not a live event (destroyed already?)");
        return gvqInvalidArgument;
    }
    event->magic = 0;
    free(event);
    return gvqSuccess;
}

static gvqResult_t check_event(const char *fn, gvqEvent_t event) {
    if (gvq_handles_live(&events, event)) return gvqSuccess;
    GVQ_WARN("%s: event %p is %s", fn, (void *)event,
             event == NULL ? "NULL" : "not a live event (gvqEventCreate; destroyed?)");
    return gvqInvalidArgument;
}

GVQ_API gvqResult_t gvqEventRecord(gvqEvent_t event, gvqStream_t stream) {
    GVQCHECK(check_event("gvqEventRecord", event));
    gvq_stream_t *s = stream_acquire(stream, 0);
    if (s == NULL) return refuse_stream("gvqEventRecord", stream);
    event->stream = s;
    event->serial = s->serial;
    event->seq = s->issued;
    stream_release(s);
    return gvqSuccess;
}

/* Wait for (or with query, look at) the calls before the event. */
static gvqResult_t event_wait(const char *fn, gvqEvent_t event, int query) {
    GVQCHECK(check_event(fn, event));
    if (event->stream == NULL) return gvqSuccess; /* never recorded: complete, as in CUDA */
    gvq_stream_t *s = stream_acquire(event->stream, event->serial);
    if (s == NULL) return gvqSuccess; /* the stream was destroyed: all its calls ran */
    gvqResult_t res = gvqInProgress;
    if (!query)
        while (s->done < event->seq)
            pthread_cond_wait(&s->idle, &s->lock);
    if (s->done >= event->seq) res = take_error(s, event->seq, 0);
    stream_release(s);
    return res;
}

GVQ_API gvqResult_t gvqEventSynchronize(gvqEvent_t event) {
    return event_wait("gvqEventSynchronize", event, 0);
}

GVQ_API gvqResult_t gvqEventQuery(gvqEvent_t event) {
    return event_wait("gvqEventQuery", event, 1);
}
