/*
 * gvq_ps_serve.h -- the served parameter server's state (gvqPsConfig_t.serve), shared by its
 * two files: ps_serve.c (the thread, what it receives, the steps it applies, start and stop) and
 * ps_serve_call.c (a rank's own push, apply and pull). The protocol is described in ps_serve.c.
 */
#ifndef GVQ_PS_SERVE_H_
#define GVQ_PS_SERVE_H_

#include <pthread.h>

#include "gvq_ps.h"

enum { OP_PUSH = 1, OP_CLOCK = 2, OP_PULL = 3, OP_BYE = 4 };
enum { HDR_WORDS = 4, REPLY_HDR_BYTES = 2 * sizeof(int64_t) };

typedef struct { /* a push kept until its step is applied */
    uint64_t step, call;
    int src;
    size_t n;
    void *block; /* n rows, a wire block */
} kept_push_t;

typedef struct { /* a pull waiting for its version */
    int src;
    uint64_t need;
    size_t n;
    void *block; /* n indices */
} kept_pull_t;

typedef struct { /* a send in flight; buf freed once done */
    gvq_req_t req;
    void *buf;
} outgoing_t;

typedef struct { /* what comes from one peer: a header, then its body */
    int64_t hdr[HDR_WORDS];
    gvq_req_t req;
    int in_body; /* hdr came; req is its body */
    void *body;
    size_t body_bytes;
    int bye, deaf; /* said goodbye; no longer listened to (failed or malformed) */
} inbox_t;

struct gvq_ps_srv {
    gvqPs_t ps;
    gvqComm_t dup;      /* the handle's own communicator; NULL in-process */
    gvq_transport_t *t; /* dup's transport, or the in-process parent's */
    int tag_req, tag_body, tag_rep;
    int nranks, rank;
    uint64_t timeout_ns;
    pthread_mutex_t lock;
    pthread_t thread;
    int started, stop; /* stop: atomic */
    gvqResult_t failed;
    inbox_t *in;
    int byes;
    uint64_t progress; /* things that happened so far (gvq_ps_srv_progress), for the waits */
    uint64_t version;  /* steps applied here */
    uint64_t *clocked; /* per rank: steps it ended (this rank's: the caller's) */
    uint64_t calls;    /* the caller's pushes in its current step */
    kept_push_t *pushes;
    size_t npushes, cap_pushes;
    kept_pull_t *pulls;
    size_t npulls, cap_pulls;
    outgoing_t *out;
    size_t nout, cap_out;
    void **lost; /* buffers of cancelled transfers, freed once the transport is gone */
    size_t nlost, cap_lost;
};

/* ---- small helpers --------------------------------------------------------------------------- */

/* The first failure of the handle's server wins (later calls report it). */
void gvq_ps_srv_fail(gvq_ps_srv_t *s, gvqResult_t res);
/* A buffer a cancelled transfer may still touch: freed once the transport is gone. */
void gvq_ps_srv_lose(gvq_ps_srv_t *s, void *buf);
/* Send bytes of buf (the server's: freed once sent) to peer; counted in the stats. */
gvqResult_t gvq_ps_srv_send_owned(gvq_ps_srv_t *s, int peer, int tag, void *buf, size_t bytes);
/* A request header {op, a, b, c} to peer's server. */
gvqResult_t gvq_ps_srv_send_header(gvq_ps_srv_t *s, int peer, int64_t op, int64_t a, int64_t b,
                                   int64_t c);
/* Keep n rows (a wire block, taken over) of step `step`, push number `call` of rank src. */
gvqResult_t gvq_ps_srv_keep_push(gvq_ps_srv_t *s, int src, uint64_t step, uint64_t call, size_t n,
                                 void *block);
/* One poll of everything in flight, then the steps that can be applied and the pulls that can
 * be answered; returns how many things happened. Under the lock. */
int gvq_ps_srv_progress(gvq_ps_srv_t *s);
/* Poll until done(s, arg), bounded by the timeout and the communicator's abort. Under the lock
 * on entry and return. */
gvqResult_t gvq_ps_srv_wait(gvq_ps_srv_t *s, const char *fn, int (*done)(gvq_ps_srv_t *, void *),
                            void *arg, const char *what);
/* gvqSuccess, or (with a WARN naming fn) the error the server failed with earlier. */
gvqResult_t gvq_ps_srv_refuse_failed(gvq_ps_srv_t *s, const char *fn);

#endif /* GVQ_PS_SERVE_H_ */
