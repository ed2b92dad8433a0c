/*
 * gvq_stream.h -- host streams (stream.c): a queue of calls per stream, run in issue order by
 * the stream's progress thread, and the order of calls per communicator over every stream and
 * the blocking path. The public calls (collectives.c, compressed_call.c, sparse.c) check their
 * arguments on the caller's thread, then hand the rest of the call over as a job.
 */
#ifndef GVQ_STREAM_H_
#define GVQ_STREAM_H_

#include "gvq_comm.h"

/* The rest of a call, run on the progress thread; its result is the call's result. */
typedef gvqResult_t (*gvq_job_fn)(void *arg);
/* Frees a job's arguments (after it ran, or at once when it could not be queued). */
typedef void (*gvq_job_free_fn)(void *arg);

/* Whether s is a live host stream made by gvqStreamCreate (looked up, never dereferenced). */
int gvq_stream_is_host(gvqStream_t s);

/* Queue run(arg) on host stream s as the call fn. The job runs after every job issued before it
 * on s, and after every call issued before it on each of comms[0..ncomms) (duplicates allowed),
 * wherever those were issued. Takes ownership of arg: release(arg) runs after the job, or before
 * this returns when the job is not queued (gvqInvalidArgument: s is not a live host stream;
 * gvqInvalidUsage: a comm's transport cannot run calls from another thread; gvqSystemError). */
gvqResult_t gvq_stream_enqueue(gvqStream_t s, const char *fn, gvqComm_t const *comms, int ncomms,
                               gvq_job_fn run, gvq_job_free_fn release, void *arg);

/* Whether the calling thread is a stream's progress thread (its calls on a communicator hold
 * their turn already). */
int gvq_stream_on_progress_thread(void);

/* Wait until every job queued on comm has run (no-op when none is). */
void gvq_stream_comm_drain(gvqComm_t comm);
/* The same from a caller's thread; a no-op on a progress thread (whose job holds comm's turn):
 * what every call that reads or writes state queued calls use does first. */
void gvq_stream_comm_settle(gvqComm_t comm);
/* Whether gvq_stream_comm_settle would return at once (one load each: the calls' fast path). */
int gvq_stream_comm_settled(gvqComm_t comm);

#endif /* GVQ_STREAM_H_ */
