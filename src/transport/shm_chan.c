/*
 * chan.c -- point-to-point messages through memory that every rank of a communicator maps
 * (ranks on one host; the core makes the memory). One channel per ordered pair of ranks, a ring
 * of bytes (GVQ_CHAN_DEPTH x (chunk + 64)) holding records, each on whole 64-byte lines:
 *
 *   channel s -> d:  [head, gave up: by s] [tail, gave up: by d] [ring]
 *   record:          [the message's total bytes, this part's offset and length] [<= chunk]
 *                    (a "skip" record instead where the next one does not fit before the end)
 *
 *   sender:    while its message has bytes left and the ring has room (head - tail):
 *                write a record of what fits at head % ring, then head + its size (release)
 *   receiver:  while tail < head (acquire): copy the record at tail % ring out, then tail + size
 *
 * A small message takes its own size in the ring, not a chunk: a pair holds hundreds of them
 * before its receiver posts anything, and they arrive without the sender's further help.
 *
 * Messages of a pair match in the order posted: per peer a queue of sends and one of receives,
 * and only a queue's head moves. A send is complete once its last chunk is written (the
 * caller's buffer is not read after that: the same promise as the MPI transport's staged
 * sends, without MPI's copy), a receive once its last chunk is read. A message of another
 * length than its receive's is read to its end and the receive fails with gvqRemoteError (as
 * the MPI transport's), so the pair stays in step. A transfer cancelled halfway (timeout,
 * abort) leaves its channel out of step: the pair is marked broken, its later transfers fail
 * at once, and the rank says so in the channel (its "gave up" word), so that the peer's
 * transfer on that channel fails at once too instead of waiting out its timeout.
 *
 * gvqCommDestroy closes a rank's channels ("closed" in both words): a peer's later transfer
 * with it fails at once, but what it wrote into the ring before is still received.
 *
 * Not kept: copying a send that finds the ring full (an "eager" send whose request completes at
 * once). Its bytes then move only while the sender is inside gvq, and a sender that went on to
 * an MPI call of its own (gvq-perf's timing) left its peer waiting for them: a hang where
 * waiting for the ring only slows the sender down.
 */
#include <stdlib.h>
#include <string.h>

#include "gvq_transport.h"

enum { LINE = 64, CHAN_MAGIC = 0x6368616e };
enum { MIN_PART = 4096 }; /* a message is cut to the ring's room only into parts of this or more */
#define SKIP \
    UINT64_MAX /* a record's offset: nothing here, the next record is at the ring's start */
enum { GAVE_UP = 1, CLOSED = 2 }; /* a gave-up word: a transfer cancelled halfway; destroyed */

typedef struct {
    uint64_t total, off, len, pad;
} chunk_hdr_t;

static size_t ring_for(int nranks) {
    return (size_t)GVQ_CHAN_DEPTH * (gvq_chan_chunk(nranks) + LINE);
}

static size_t chan_bytes_for(int nranks) {
    return 2 * (size_t)LINE + ring_for(nranks);
}

/* A record's bytes in the ring: its header and payload on whole lines. */
static size_t record_bytes(size_t len) {
    return GVQ_DIV_UP(sizeof(chunk_hdr_t) + len, (size_t)LINE) * LINE;
}

typedef struct chan_op {
    struct chan_op *next;
    int send, peer;
    const char *sbuf;
    char *rbuf;
    size_t bytes; /* the transfer's length (a receive's expected length) */
    size_t total; /* receive: the message's length, known at its first chunk */
    size_t at;    /* bytes moved */
    int started, done;
    gvqResult_t res;
} chan_op_t;

enum { SPARE_OPS = 16 }; /* finished transfers' records kept for the next: no heap per message */

struct gvq_chan_set {
    char *mem;
    int nranks, rank;
    size_t chunk, ring, chan_bytes; /* gvq_chan_chunk(nranks) and what follows from it */
    chan_op_t **sendq, **recvq;     /* per peer */
    char *broken;                   /* per peer: a pair out of step */
    chan_op_t *spare[SPARE_OPS];
    int nspare;
};

size_t gvq_chan_bytes(int nranks) {
    return (size_t)nranks * (size_t)nranks * chan_bytes_for(nranks);
}

static char *channel(const gvq_chan_set_t *s, int from, int to);

/* Every ring this rank writes and reads, mapped now rather than page by page under the first
 * messages (a fault costs microseconds here): 2 (N - 1) rings of about 512 KiB up to 4 ranks,
 * 128 KiB to 8. Every rank attaches before any sends (the segment's agreement follows). */
static void prefault(const gvq_chan_set_t *s) {
    enum { PAGE = 4096 };
    for (int p = 0; p < s->nranks; p++) { /* atomic: a peer may be touching the same page */
        char *out = channel(s, s->rank, p) + 2 * LINE, *in = channel(s, p, s->rank) + 2 * LINE;
        for (size_t at = 0; at < s->ring; at += PAGE) {
            __atomic_store_n(out + at, 0, __ATOMIC_RELAXED);
            (void)__atomic_load_n(in + at, __ATOMIC_RELAXED);
        }
    }
}

gvq_chan_set_t *gvq_chan_attach(void *mem, int nranks, int rank) {
    gvq_chan_set_t *s = calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    s->sendq = calloc((size_t)nranks, sizeof *s->sendq);
    s->recvq = calloc((size_t)nranks, sizeof *s->recvq);
    s->broken = calloc((size_t)nranks, 1);
    if (s->sendq == NULL || s->recvq == NULL || s->broken == NULL) {
        gvq_chan_detach(s);
        return NULL;
    }
    s->mem = mem;
    s->nranks = nranks;
    s->rank = rank;
    s->chunk = gvq_chan_chunk(nranks);
    s->ring = ring_for(nranks);
    s->chan_bytes = chan_bytes_for(nranks);
    prefault(s);
    return s;
}

void gvq_chan_detach(gvq_chan_set_t *s) {
    if (s == NULL) return;
    for (int p = 0; s->sendq != NULL && s->recvq != NULL && p < s->nranks; p++) {
        for (chan_op_t *o = s->sendq[p], *n; o != NULL; o = n) {
            n = o->next;
            free(o);
        }
        for (chan_op_t *o = s->recvq[p], *n; o != NULL; o = n) {
            n = o->next;
            free(o);
        }
    }
    for (int i = 0; i < s->nspare; i++)
        free(s->spare[i]);
    free(s->sendq);
    free(s->recvq);
    free(s->broken);
    free(s);
}

/* A transfer's record: a spare one, zeroed, or a new one. */
static chan_op_t *op_get(gvq_chan_set_t *s) {
    if (s->nspare == 0) return calloc(1, sizeof(chan_op_t));
    chan_op_t *o = s->spare[--s->nspare];
    memset(o, 0, sizeof *o);
    return o;
}

static void op_put(gvq_chan_set_t *s, chan_op_t *o) {
    if (s->nspare < SPARE_OPS)
        s->spare[s->nspare++] = o;
    else
        free(o);
}

static char *channel(const gvq_chan_set_t *s, int from, int to) {
    return s->mem + ((size_t)from * (size_t)s->nranks + (size_t)to) * s->chan_bytes;
}

static uint64_t *head_of(char *ch) {
    return (uint64_t *)ch;
}

static uint64_t *tail_of(char *ch) {
    return (uint64_t *)(ch + LINE);
}

/* Set by the sender (on the head's line) or the receiver (on the tail's) that cancelled a
 * transfer of this channel halfway. */
static uint64_t *sender_gave_up(char *ch) {
    return (uint64_t *)ch + 1;
}

static uint64_t *receiver_gave_up(char *ch) {
    return (uint64_t *)(ch + LINE) + 1;
}

/* The other end of o's channel gave up on it (or closed it, and a receive finds the ring
 * empty): o fails, the pair is out of step. */
static int peer_gave_up(gvq_chan_set_t *s, chan_op_t *o, char *ch) {
    uint64_t w =
        __atomic_load_n(o->send ? receiver_gave_up(ch) : sender_gave_up(ch), __ATOMIC_ACQUIRE);
    if (w == 0) return 0;
    if (w == CLOSED && !o->send && /* what the sender wrote before it closed is still read */
        __atomic_load_n(head_of(ch), __ATOMIC_ACQUIRE) != *tail_of(ch))
        return 0;
    if (w == CLOSED)
        GVQ_WARN("shm channel: peer %d destroyed its communicator; this rank's %s of %zu bytes "
                 "with it fails",
                 o->peer, o->send ? "send" : "receive", o->bytes);
    else
        GVQ_WARN("shm channel: peer %d gave up a transfer with this rank (its call failed); this "
                 "rank's %s of %zu bytes fails",
                 o->peer, o->send ? "send" : "receive", o->bytes);
    s->broken[o->peer] = 1;
    o->res = gvqRemoteError;
    o->done = 1;
    return 1;
}

static char *record_at(const gvq_chan_set_t *s, char *ch, uint64_t pos) {
    return ch + 2 * LINE + (size_t)(pos % s->ring);
}

typedef enum { PART_WRITE, PART_SKIP, PART_WAIT } part_t;

/* What comes next of a message with `left` bytes to go, where `room` bytes of the ring are free
 * and `to_end` of them lie before its end (both whole lines): a record of *len bytes (all that
 * is left, up to a chunk, or a part of at least MIN_PART that fits), a skip record to the
 * ring's start, or a wait for the receiver to free room. (Tried and not kept: an empty ring
 * starting over at its start once past 64 KiB, to keep small messages on a few hot lines: the
 * skip record holds the rest of the ring until the receiver reads it, so what a pair could
 * hold before its receiver posted depended on its history, 64 KiB at worst; no gain measured.) */
static part_t next_part(const gvq_chan_set_t *s, size_t left, size_t room, size_t to_end,
                        size_t *len) {
    size_t want = GVQ_MIN(s->chunk, left), here = GVQ_MIN(room, to_end);
    if (here == 0) return PART_WAIT; /* the ring is full */
    if (record_bytes(want) <= here) {
        *len = want;
        return PART_WRITE;
    }
    if (here - sizeof(chunk_hdr_t) >= MIN_PART) { /* the part that fits: the rest follows */
        *len = here - sizeof(chunk_hdr_t);
        return PART_WRITE;
    }
    return to_end < room ? PART_SKIP : PART_WAIT; /* at the end, the room is at the start */
}

/* Write what the channel has room for of the queue's head send. */
static void send_step(gvq_chan_set_t *s, chan_op_t *o) {
    char *ch = channel(s, s->rank, o->peer);
    if (peer_gave_up(s, o, ch)) return;
    uint64_t h = __atomic_load_n(head_of(ch), __ATOMIC_RELAXED); /* written by this rank only */
    while (!o->done) {
        size_t room = s->ring - (size_t)(h - __atomic_load_n(tail_of(ch), __ATOMIC_ACQUIRE));
        size_t to_end = s->ring - (size_t)(h % s->ring);
        size_t len = 0;
        part_t part = next_part(s, o->bytes - o->at, room, to_end, &len);
        if (part == PART_WAIT) return; /* the receiver frees room */
        int skip = part == PART_SKIP;
        chunk_hdr_t hdr = {o->bytes, skip ? SKIP : o->at, len, 0};
        char *c = record_at(s, ch, h);
        if (!skip && hdr.len > 0) memcpy(c + sizeof hdr, o->sbuf + o->at, (size_t)hdr.len);
        memcpy(c, &hdr, sizeof hdr);
        h += skip ? to_end : record_bytes((size_t)hdr.len);
        __atomic_store_n(head_of(ch), h, __ATOMIC_RELEASE);
        if (skip) continue;
        o->started = 1;
        o->at += (size_t)hdr.len;
        o->done = o->at == o->bytes; /* a message of 0 bytes is one empty record */
    }
}

/* Read what has come of the queue's head receive. */
static void recv_step(gvq_chan_set_t *s, chan_op_t *o) {
    char *ch = channel(s, o->peer, s->rank);
    if (peer_gave_up(s, o, ch)) return;
    uint64_t t = __atomic_load_n(tail_of(ch), __ATOMIC_RELAXED); /* written by this rank only */
    while (!o->done && __atomic_load_n(head_of(ch), __ATOMIC_ACQUIRE) != t) {
        const char *c = record_at(s, ch, t);
        chunk_hdr_t hdr;
        memcpy(&hdr, c, sizeof hdr);
        if (hdr.off == SKIP) { /* the next record is at the ring's start */
            t += s->ring - (size_t)(t % s->ring);
            __atomic_store_n(tail_of(ch), t, __ATOMIC_RELEASE);
            continue;
        }
        if (!o->started) {
            o->started = 1;
            o->total = (size_t)hdr.total;
            if (o->total != o->bytes) {
                GVQ_WARN("shm channel: the message from peer %d has %zu bytes, this rank's "
                         "receive expects %zu (mismatched calls on the ranks?); it was discarded",
                         o->peer, o->total, o->bytes);
                o->res = gvqRemoteError;
            }
        }
        if (hdr.off != o->at || hdr.len > s->chunk || hdr.off + hdr.len > o->total) {
            GVQ_WARN("shm channel: a chunk from peer %d is out of step (offset %llu, length %llu "
                     "in a message of %zu bytes)",
                     o->peer, (unsigned long long)hdr.off, (unsigned long long)hdr.len, o->total);
            s->broken[o->peer] = 1;
            o->res = gvqRemoteError;
            o->done = 1;
            return;
        }
        if (o->res == gvqSuccess && hdr.len > 0)
            memcpy(o->rbuf + hdr.off, c + sizeof hdr, (size_t)hdr.len);
        t += record_bytes((size_t)hdr.len);
        __atomic_store_n(tail_of(ch), t, __ATOMIC_RELEASE);
        o->at += (size_t)hdr.len;
        o->done = o->at == o->total;
    }
}

/* Move the queue of o's kind and peer as far as it goes; finished heads leave the queue (they
 * are freed when their request is tested). */
static void progress(gvq_chan_set_t *s, int send, int peer) {
    chan_op_t **q = send ? &s->sendq[peer] : &s->recvq[peer];
    while (*q != NULL) {
        chan_op_t *o = *q;
        if (s->broken[peer]) {
            o->res = gvqRemoteError;
            o->done = 1;
        } else if (send) {
            send_step(s, o);
        } else {
            recv_step(s, o);
        }
        if (!o->done) return;
        *q = o->next;
        o->next = NULL;
    }
}

static gvqResult_t post(gvq_chan_set_t *s, int send, int peer, const void *sbuf, void *rbuf,
                        size_t bytes, gvq_req_t *req) {
    if (peer < 0 || peer >= s->nranks) return gvqInternalError;
    chan_op_t *o = op_get(s);
    if (o == NULL) return gvqSystemError;
    o->send = send;
    o->peer = peer;
    o->sbuf = sbuf;
    o->rbuf = rbuf;
    o->bytes = bytes;
    chan_op_t **q = send ? &s->sendq[peer] : &s->recvq[peer];
    while (*q != NULL)
        q = &(*q)->next;
    *q = o;
    memset(req->handle, 0, sizeof req->handle);
    memcpy(req->handle, &o, sizeof o);
    req->handle[1] = CHAN_MAGIC;
    req->peer = peer;
    req->bytes = bytes;
    req->active = 1;
    progress(s, send, peer); /* a short message may go at once */
    return gvqSuccess;
}

gvqResult_t gvq_chan_isend(gvq_chan_set_t *s, int peer, const void *buf, size_t bytes,
                           gvq_req_t *req) {
    return post(s, 1, peer, buf, NULL, bytes, req);
}

gvqResult_t gvq_chan_irecv(gvq_chan_set_t *s, int peer, void *buf, size_t bytes, gvq_req_t *req) {
    return post(s, 0, peer, NULL, buf, bytes, req);
}

int gvq_chan_owns(const gvq_req_t *req) {
    return req->handle[1] == CHAN_MAGIC;
}

static chan_op_t *op_of(const gvq_req_t *req) {
    chan_op_t *o;
    memcpy(&o, req->handle, sizeof o);
    return o;
}

/* Every queue moves on any test, as MPI's progress moves every transfer: a caller waiting for
 * one request (a send that fills its channel) must still drain the channels its peer fills,
 * or both wait on each other. */
static void progress_all(gvq_chan_set_t *s) {
    for (int p = 0; p < s->nranks; p++) {
        if (s->recvq[p] != NULL) progress(s, 0, p);
        if (s->sendq[p] != NULL) progress(s, 1, p);
    }
}

gvqResult_t gvq_chan_test(gvq_chan_set_t *s, gvq_req_t *req, int *done) {
    chan_op_t *o = op_of(req);
    if (!o->done) progress_all(s);
    *done = o->done;
    if (!o->done) return gvqSuccess;
    gvqResult_t res = o->res;
    op_put(s, o);
    req->active = 0;
    return res;
}

void gvq_chan_close(gvq_chan_set_t *s) {
    if (s == NULL) return;
    for (int p = 0; p < s->nranks; p++) {
        __atomic_store_n(sender_gave_up(channel(s, s->rank, p)), CLOSED, __ATOMIC_RELEASE);
        __atomic_store_n(receiver_gave_up(channel(s, p, s->rank)), CLOSED, __ATOMIC_RELEASE);
    }
}

void gvq_chan_cancel(gvq_chan_set_t *s, gvq_req_t *req) {
    chan_op_t *o = op_of(req);
    if (!o->done) { /* still queued: unlink it */
        chan_op_t **q = o->send ? &s->sendq[o->peer] : &s->recvq[o->peer];
        while (*q != NULL && *q != o)
            q = &(*q)->next;
        if (*q == o) *q = o->next;
        if (o->started) { /* halfway: the pair is out of step; the peer learns it at once */
            s->broken[o->peer] = 1;
            char *ch = o->send ? channel(s, s->rank, o->peer) : channel(s, o->peer, s->rank);
            __atomic_store_n(o->send ? sender_gave_up(ch) : receiver_gave_up(ch), GAVE_UP,
                             __ATOMIC_RELEASE);
        }
    }
    op_put(s, o);
    req->active = 0;
}

/* ---- the channels as a transport ------------------------------------------------------------
 * gvqSend/gvqRecv's transport when the ranks share memory: the ops table over one channel set,
 * with the base transport's rank, timeout, abort flag and broken state, so that the one wait
 * loop (transport.c) treats its requests as any transport's. */

static gvqResult_t chan_xisend(gvq_transport_t *t, int peer, int tag, const void *buf, size_t bytes,
                               gvq_req_t *req) {
    (void)tag; /* point-to-point only: one stream of messages per ordered pair */
    return gvq_chan_isend(t->impl, peer, buf, bytes, req);
}

static gvqResult_t chan_xirecv(gvq_transport_t *t, int peer, int tag, void *buf, size_t bytes,
                               gvq_req_t *req) {
    (void)tag;
    return gvq_chan_irecv(t->impl, peer, buf, bytes, req);
}

static gvqResult_t chan_xtest(gvq_transport_t *t, gvq_req_t *req, int *done) {
    return gvq_chan_test(t->impl, req, done);
}

static void chan_xcancel(gvq_transport_t *t, gvq_req_t *req) {
    gvq_chan_cancel(t->impl, req);
}

static void chan_xdestroy(gvq_transport_t *t) {
    gvq_chan_close(t->impl); /* the peers' later transfers with this rank fail at once */
    gvq_chan_detach(t->impl);
    free(t);
}

static const gvq_transport_ops_t chan_ops = {.size = sizeof(gvq_transport_ops_t),
                                             .name = "shared-memory channels",
                                             .isend = chan_xisend,
                                             .irecv = chan_xirecv,
                                             .test = chan_xtest,
                                             .cancel = chan_xcancel,
                                             .destroy = chan_xdestroy,
                                             .iallgatherv = gvq_xport_iallgatherv_unsupported};

gvq_transport_t *gvq_chan_transport(void *mem, const gvq_transport_t *base) {
    gvq_transport_t *t = malloc(sizeof *t);
    gvq_chan_set_t *set = t != NULL ? gvq_chan_attach(mem, base->nranks, base->rank) : NULL;
    if (set == NULL) {
        free(t);
        return NULL;
    }
    *t = *base; /* rank, nranks, timeout, abort flag, broken state, one host */
    t->ops = &chan_ops;
    t->impl = set;
    t->fifo = 0;
    t->cancel_keeps_buffers = 0; /* a cancel unlinks the transfer: nothing reads the buffer later */
    t->stages_sends = 1;         /* a send is copied into the channel */
    return t;
}
