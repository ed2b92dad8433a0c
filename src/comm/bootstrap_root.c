/*
 * bootstrap_root.c -- how the ranks of a new communicator find each other, the NCCL way, with a
 * root that lets in only those who hold the id's secret.
 *
 *   gvqGetUniqueId (root process)            gvqCommInitRank (every rank, root process too)
 *   random tag + 128-bit secret, listen,     connect to the address in the id
 *   start the root thread
 *   thread, per connection:  challenge  --->  check tag
 *                            <---  hello     {nranks, rank, timeout, info, nonce}
 *                                            MAC(secret, challenge || hello)
 *            check MAC, claim the rank
 *   when all ranks joined:   reply      --->  {status, table} MAC(secret, challenge || nonce ||
 *                                            reply || table digest): the rank checks the root
 *
 * The secret never travels: a client that saw the address, or every byte on the wire, can
 * neither claim a rank (it cannot answer a fresh challenge) nor feed ranks a forged table (it
 * cannot answer their nonce). Message layouts and parsers: bootstrap_wire.c.
 *
 * The root thread serves every connection at once from one poll loop. A connection that has not
 * authenticated within HELLO_MS is dropped, and at most MAX_PENDING wait to authenticate (a new
 * one pushes out the oldest), so silent or trickling clients delay no one. Strangers (wrong
 * size, magic, tag or MAC) are dropped with a WARN and never count as a rank. A rank claimed
 * twice, or ranks that disagree on nranks, fail the round: every rank that joined, and every
 * rank that arrives until the deadline, is told so. A rank that leaves before the round is
 * complete gives its claim back.
 *
 * Deadlines: an id nobody uses expires GVQ_TIMEOUT_MS after gvqGetUniqueId; the first
 * authenticated hello moves the deadline to its own timeout from then. At the deadline the
 * ranks that joined are told how many came (gvqTimeout). The thread closes its listening socket
 * as soon as the communicator is formed, fails or expires, and exits once the answers are out
 * (ANSWER_MS at most). A rank gives up at its own timeout whatever the root does.
 *
 * Interface: GVQ_SOCKET_IFNAME if set, else the first non-loopback IPv4 interface that is up,
 * else loopback.
 *
 * This file is the root side (gvqGetUniqueId and its thread); bootstrap.c the rank side
 * (gvqCommInitRank's exchange).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
#include "gvq_bootstrap.h"

#define MS 1000000ull                   /* ns */
#define HELLO_MS 10000                  /* a connection must authenticate this soon */
#define ANSWER_MS 5000                  /* a rank must take its answer this soon */
#define FAIL_LINGER_MS 30000            /* a failed round keeps answering at most this long */
#define MAX_PENDING 64                  /* connections waiting to authenticate */
#define MAX_STRANGER_WARNS 16           /* WARN lines per id for dropped strangers */
#define ROOT_STACK_BYTES (512u * 1024u) /* the root thread needs little */

/* ---- root side -------------------------------------------------------------------------- */

/* C_BLOB: the hello is authentic, its blob still coming (counted as pending, not yet a rank) */
enum { C_PENDING, C_BLOB, C_JOINED, C_ANSWER };

typedef struct {
    int fd, state, rank;
    uint64_t since, deadline; /* accepted at; dropped at (0: never) */
    char peer[32];
    uint8_t challenge[GVQ_BOOT_NONCE_BYTES], nonce[GVQ_BOOT_NONCE_BYTES];
    uint8_t in[GVQ_BOOT_HELLO_BYTES];
    size_t got;
    gvq_boot_hello_t hello; /* C_BLOB: the authentic hello whose blob is coming */
    uint8_t *blob;          /* C_BLOB: blob and MAC as they come, blob_got of them */
    size_t blob_got;
    /* the answer: head, the shared table (GVQ_BOOT_OK only), mac */
    uint8_t head[GVQ_BOOT_REPLY_HEAD_BYTES], mac[GVQ_BOOT_MAC_BYTES];
    size_t table_bytes, sent;
} conn_t;

typedef struct {
    gvq_boot_id_t id;
    char where[32];
    int listen_fd;
    conn_t *c;
    int nc, cap, npending;
    int nranks, joined; /* nranks: 0 until the first authenticated hello */
    char *claimed;
    gvq_peer_info_t *info;
    uint8_t **blobs;    /* rank r's blob, info[r].blob_bytes long (NULL: none) */
    uint8_t *table;     /* encoded with the blobs after it, once formed */
    size_t table_bytes; /* table and blobs */
    uint64_t deadline;
    gvq_boot_reply_t fail; /* status != GVQ_BOOT_OK once the round failed */
    int closed;            /* listener closed: only answers left */
    long dropped;
} root_t;

static void root_drop(root_t *r, int i, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Close connection i, with a WARN saying why unless fmt is NULL. Strangers (connections that
 * never authenticated) are counted, and only the first MAX_STRANGER_WARNS logged. */
static void root_drop(root_t *r, int i, const char *fmt, ...) {
    conn_t *c = &r->c[i];
    int stranger = c->state == C_PENDING || c->state == C_BLOB;
    if (fmt != NULL && (!stranger || r->dropped++ < MAX_STRANGER_WARNS)) {
        char why[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);
        GVQ_WARN("bootstrap root %s: dropped the connection from %s: %s%s", r->where, c->peer, why,
                 stranger && r->dropped == MAX_STRANGER_WARNS
                     ? " (further drops are counted, not logged)"
                     : "");
    }
    if (stranger) r->npending--;
    if (c->state == C_JOINED) {
        r->claimed[c->rank] = 0;
        r->joined--;
    }
    free(c->blob);
    close(c->fd);
    r->c[i] = r->c[--r->nc];
}

static void root_close_listener(root_t *r) {
    if (r->closed) return;
    close(r->listen_fd);
    r->listen_fd = -1;
    r->closed = 1;
    for (int i = r->nc - 1; i >= 0; i--)
        if (r->c[i].state == C_PENDING || r->c[i].state == C_BLOB) root_drop(r, i, NULL);
}

/* Queue connection c's answer: status (with the table for GVQ_BOOT_OK). */
static void root_answer(root_t *r, conn_t *c, int32_t status, int32_t detail) {
    gvq_boot_reply_t rep = {status, r->nranks, detail, c->rank};
    gvq_boot_reply_head_encode(c->head, &rep);
    c->table_bytes = status == GVQ_BOOT_OK ? r->table_bytes : 0;
    uint64_t digest = gvq_boot_table_digest(&r->id, r->table, c->table_bytes);
    uint64_t mac = gvq_boot_reply_mac(&r->id, c->challenge, c->nonce, c->head, digest);
    for (int i = 0; i < GVQ_BOOT_MAC_BYTES; i++)
        c->mac[i] = (uint8_t)(mac >> (8 * i));
    if (c->state == C_JOINED) { /* its claim is settled by this answer */
        r->claimed[c->rank] = 0;
        r->joined--;
    }
    c->state = C_ANSWER;
    c->sent = 0;
    c->deadline = gvq_now_ns() + ANSWER_MS * MS;
}

static void root_answer_all(root_t *r, int32_t status, int32_t detail) {
    for (int i = 0; i < r->nc; i++)
        if (r->c[i].state == C_JOINED) root_answer(r, &r->c[i], status, detail);
}

/* The round failed: tell everyone who joined and, until the deadline, everyone who comes. */
static void root_fail(root_t *r, conn_t *c, int32_t status, int32_t detail) {
    r->fail = (gvq_boot_reply_t){status, r->nranks, detail, 0};
    root_answer_all(r, status, detail);
    root_answer(r, c, status, detail);
    uint64_t linger = gvq_now_ns() + FAIL_LINGER_MS * MS;
    if (r->deadline == 0 || r->deadline > linger) r->deadline = linger;
}

/* Send what the socket takes of connection c's answer: 1 all sent, 0 more to send, -1 error. */
static int root_send(root_t *r, conn_t *c) {
    size_t total = GVQ_BOOT_REPLY_HEAD_BYTES + c->table_bytes + GVQ_BOOT_MAC_BYTES;
    while (c->sent < total) {
        const uint8_t *p;
        size_t n;
        if (c->sent < GVQ_BOOT_REPLY_HEAD_BYTES) {
            p = c->head + c->sent;
            n = GVQ_BOOT_REPLY_HEAD_BYTES - c->sent;
        } else if (c->sent < GVQ_BOOT_REPLY_HEAD_BYTES + c->table_bytes) {
            p = r->table + (c->sent - GVQ_BOOT_REPLY_HEAD_BYTES);
            n = GVQ_BOOT_REPLY_HEAD_BYTES + c->table_bytes - c->sent;
        } else {
            p = c->mac + (c->sent - GVQ_BOOT_REPLY_HEAD_BYTES - c->table_bytes);
            n = total - c->sent;
        }
        ssize_t k = send(c->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        c->sent += (size_t)k;
    }
    return 1;
}

/* A complete, authenticated hello on connection c. */
static void root_hello(root_t *r, conn_t *c, const gvq_boot_hello_t *h) {
    c->rank = h->rank;
    memcpy(c->nonce, h->nonce, sizeof c->nonce);
    r->npending--;
    c->state = C_ANSWER; /* until decided below; never C_PENDING again */
    if (r->fail.status != GVQ_BOOT_OK) {
        root_answer(r, c, r->fail.status, r->fail.detail);
        return;
    }
    if (r->nranks == 0) {
        r->nranks = h->nranks;
        r->claimed = calloc((size_t)h->nranks, 1);
        r->info = calloc((size_t)h->nranks, sizeof *r->info);
        r->blobs = calloc((size_t)h->nranks, sizeof *r->blobs);
        r->deadline = h->timeout_ms > 0 ? gvq_now_ns() + (uint64_t)h->timeout_ms * MS : 0;
        if (r->claimed == NULL || r->info == NULL || r->blobs == NULL) {
            GVQ_WARN("bootstrap root %s: no memory for %d ranks", r->where, h->nranks);
            root_fail(r, c, GVQ_BOOT_NO_MEMORY, 0);
            return;
        }
    }
    if (h->nranks != r->nranks) {
        GVQ_WARN("bootstrap root %s: rank %d (%s) says nranks=%d, the first rank said %d", r->where,
                 h->rank, c->peer, h->nranks, r->nranks);
        root_fail(r, c, GVQ_BOOT_NRANKS_MISMATCH, h->nranks);
        return;
    }
    if (r->claimed[h->rank]) {
        GVQ_WARN("bootstrap root %s: rank %d claimed a second time (by %s, pid %d); failing the "
                 "round on every rank",
                 r->where, h->rank, c->peer, h->info.pid);
        root_fail(r, c, GVQ_BOOT_DUP_RANK, h->rank);
        return;
    }
    c->state = C_JOINED;
    c->deadline = 0;
    r->claimed[h->rank] = 1;
    r->info[h->rank] = h->info;
    free(r->blobs[h->rank]); /* a claim released before, then made again */
    r->blobs[h->rank] = c->blob;
    c->blob = NULL;
    if (++r->joined < r->nranks) return;
    size_t entries = (size_t)r->nranks * GVQ_BOOT_PEER_BYTES;
    r->table_bytes = entries;
    for (int q = 0; q < r->nranks; q++)
        r->table_bytes += (size_t)r->info[q].blob_bytes;
    r->table = malloc(r->table_bytes);
    if (r->table == NULL) {
        GVQ_WARN("bootstrap root %s: no memory for the table of %d ranks", r->where, r->nranks);
        r->fail = (gvq_boot_reply_t){GVQ_BOOT_NO_MEMORY, r->nranks, 0, 0};
        root_answer_all(r, GVQ_BOOT_NO_MEMORY, 0);
    } else {
        gvq_boot_table_encode(r->table, r->info, r->nranks);
        size_t at = entries;
        for (int q = 0; q < r->nranks; q++) {
            if (r->info[q].blob_bytes > 0)
                memcpy(r->table + at, r->blobs[q], (size_t)r->info[q].blob_bytes);
            at += (size_t)r->info[q].blob_bytes;
        }
        root_answer_all(r, GVQ_BOOT_OK, 0);
        GVQ_INFO("bootstrap root %s: all %d ranks joined", r->where, r->nranks);
    }
    root_close_listener(r); /* formed: nobody else may join */
}

/* Bytes arrived on a connection that has not authenticated yet. */
static void root_read_pending(root_t *r, int i) {
    conn_t *c = &r->c[i];
    ssize_t k = recv(c->fd, c->in + c->got, sizeof c->in - c->got, MSG_DONTWAIT);
    if (k < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            root_drop(r, i, "recv: %s", strerror(errno));
        return;
    }
    if (k == 0) {
        root_drop(r, i, "closed after %zu of the %d bytes of a hello", c->got,
                  GVQ_BOOT_HELLO_BYTES);
        return;
    }
    c->got += (size_t)k;
    gvq_boot_hello_t h;
    if (c->got < GVQ_BOOT_HELLO_BYTES) {
        /* refuse a wrong magic as soon as it is visible, without waiting for the rest */
        if (c->got >= 8 && memcmp(c->in, "gvqHELO1", 8) != 0)
            root_drop(r, i, "%s", gvq_boot_msg_text(GVQ_BOOT_MSG_MAGIC));
        return;
    }
    gvq_boot_msg_t m = gvq_boot_hello_parse(c->in, c->got, &r->id, c->challenge, &h);
    if (m != GVQ_BOOT_MSG_OK) {
        root_drop(r, i, "its hello is refused: %s; not counted as a rank", gvq_boot_msg_text(m));
        return;
    }
    if (h.info.blob_bytes > 0) { /* its blob and the blob's MAC come next */
        c->blob = malloc((size_t)h.info.blob_bytes + GVQ_BOOT_MAC_BYTES);
        if (c->blob == NULL) {
            root_drop(r, i, "no memory for a blob of %d bytes", h.info.blob_bytes);
            return;
        }
        c->hello = h;
        c->blob_got = 0;
        c->state = C_BLOB;
        return;
    }
    root_hello(r, c, &h);
}

/* Bytes of the blob that follows an authentic hello. */
static void root_read_blob(root_t *r, int i) {
    conn_t *c = &r->c[i];
    size_t need = (size_t)c->hello.info.blob_bytes + GVQ_BOOT_MAC_BYTES;
    ssize_t k = recv(c->fd, c->blob + c->blob_got, need - c->blob_got, MSG_DONTWAIT);
    if (k < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            root_drop(r, i, "recv: %s", strerror(errno));
        return;
    }
    if (k == 0) {
        root_drop(r, i, "closed after %zu of the %zu bytes of its blob", c->blob_got, need);
        return;
    }
    c->blob_got += (size_t)k;
    if (c->blob_got < need) return;
    gvq_boot_msg_t m =
        gvq_boot_blob_parse(c->blob, need, (size_t)c->hello.info.blob_bytes, &r->id, c->challenge);
    if (m != GVQ_BOOT_MSG_OK) {
        root_drop(r, i, "its blob is refused: %s; not counted as a rank", gvq_boot_msg_text(m));
        return;
    }
    gvq_boot_hello_t h = c->hello;
    root_hello(r, c, &h);
}

/* Something on an authenticated connection waiting for its answer: the rank left (or talks out
 * of turn); its claim is given back. */
static void root_read_joined(root_t *r, int i) {
    char b;
    ssize_t k = recv(r->c[i].fd, &b, 1, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    int rank = r->c[i].rank;
    root_drop(r, i, "rank %d %s before all ranks joined; its claim is released", rank,
              k == 0  ? "left"
              : k < 0 ? "failed"
                      : "sent bytes out of turn");
}

static void root_accept(root_t *r) {
    for (int n = 0; n < 2 * MAX_PENDING; n++) {
        struct sockaddr_in sa;
        socklen_t len = sizeof sa;
        int fd = accept4(r->listen_fd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;               /* EAGAIN, or a connection that failed: nothing to do */
        if (r->npending == MAX_PENDING) { /* push out the oldest stranger */
            int oldest = -1;
            for (int i = 0; i < r->nc; i++)
                if (r->c[i].state == C_PENDING &&
                    (oldest < 0 || r->c[i].since < r->c[oldest].since))
                    oldest = i;
            root_drop(r, oldest, "%d connections are waiting to authenticate; dropped the oldest",
                      MAX_PENDING);
        }
        if (r->nc == r->cap) {
            int cap = r->cap ? 2 * r->cap : 2 * MAX_PENDING;
            conn_t *nc = realloc(r->c, sizeof *nc * (size_t)cap);
            if (nc == NULL) {
                close(fd);
                continue;
            }
            r->c = nc;
            r->cap = cap;
        }
        conn_t *c = &r->c[r->nc];
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->state = C_PENDING;
        c->rank = -1;
        c->since = gvq_now_ns();
        c->deadline = c->since + HELLO_MS * MS;
        gvq_boot_addr_text(&sa, c->peer, sizeof c->peer);
        r->nc++;
        r->npending++;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        uint8_t msg[GVQ_BOOT_CHALLENGE_BYTES];
        if (gvq_boot_random(c->challenge, sizeof c->challenge) != 0) {
            root_drop(r, r->nc - 1, "no random bytes for its challenge: %s", strerror(errno));
            continue;
        }
        gvq_boot_challenge_encode(msg, &r->id, c->challenge);
        /* a fresh socket's buffer always takes 32 bytes; a short send is a dead peer */
        if (send(fd, msg, sizeof msg, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof msg)
            root_drop(r, r->nc - 1, "could not send the challenge");
    }
}

/* The deadlines that passed: connections, then the round's. */
static void root_expire(root_t *r, uint64_t now) {
    for (int i = r->nc - 1; i >= 0; i--) {
        conn_t *c = &r->c[i];
        if (c->deadline == 0 || now < c->deadline) continue;
        if (c->state == C_PENDING || c->state == C_BLOB)
            root_drop(r, i, "no authenticated hello and blob within %d ms (%zu bytes came)",
                      HELLO_MS, c->got + c->blob_got);
        else
            root_drop(r, i, "rank %d did not take its answer within %d ms", c->rank, ANSWER_MS);
    }
    if (r->closed || r->deadline == 0 || now < r->deadline) return;
    if (r->fail.status == GVQ_BOOT_OK && r->joined > 0) {
        GVQ_WARN("bootstrap root %s: only %d of %d ranks joined before the timeout", r->where,
                 r->joined, r->nranks);
        root_answer_all(r, GVQ_BOOT_TIMEOUT, r->joined);
    } else if (r->nranks == 0) {
        GVQ_INFO("bootstrap root %s: the id was not used before its timeout; released", r->where);
    }
    root_close_listener(r);
}

static void root_free(root_t *r) {
    for (int i = 0; i < r->nc; i++)
        close(r->c[i].fd);
    if (r->listen_fd >= 0) close(r->listen_fd);
    if (r->dropped > MAX_STRANGER_WARNS)
        GVQ_WARN("bootstrap root %s: dropped %ld connections in all", r->where, r->dropped);
    free(r->c);
    for (int i = 0; i < r->nc; i++)
        free(r->c[i].blob);
    for (int q = 0; r->blobs != NULL && q < r->nranks; q++)
        free(r->blobs[q]);
    free(r->blobs);
    free(r->claimed);
    free(r->info);
    free(r->table);
    free(r);
}

static void *root_thread(void *arg) {
    root_t *r = arg;
    struct pollfd *pfd = NULL;
    int pcap = 0;
    for (;;) {
        uint64_t now = gvq_now_ns();
        root_expire(r, now);
        if (r->closed && r->nc == 0) break;
        if (pcap < r->nc + 1) {
            pcap = 2 * (r->nc + 1);
            struct pollfd *np = realloc(pfd, sizeof *np * (size_t)pcap);
            if (np == NULL) {
                GVQ_WARN("bootstrap root %s: out of memory; giving up", r->where);
                break;
            }
            pfd = np;
        }
        uint64_t next = r->closed ? 0 : r->deadline;
        for (int i = 0; i < r->nc; i++) {
            conn_t *c = &r->c[i];
            pfd[i] = (struct pollfd){c->fd, (short)(c->state == C_ANSWER ? POLLOUT : POLLIN), 0};
            if (c->deadline != 0 && (next == 0 || c->deadline < next)) next = c->deadline;
        }
        int np = r->nc;
        if (!r->closed) pfd[np++] = (struct pollfd){r->listen_fd, POLLIN, 0};
        int wait_ms = next == 0     ? -1
                      : next <= now ? 0
                                    : (int)GVQ_MIN((next - now + MS - 1) / MS, 60000ull);
        int pr = poll(pfd, (nfds_t)np, wait_ms);
        if (pr <= 0) continue;
        int nc = r->nc; /* connections accepted below are served on the next turn */
        int listening = !r->closed && (pfd[nc].revents & POLLIN);
        for (int i = nc - 1; i >= 0; i--) {
            if (pfd[i].revents == 0) continue;
            conn_t *c = &r->c[i];
            if (c->state == C_PENDING) {
                root_read_pending(r, i);
            } else if (c->state == C_BLOB) {
                root_read_blob(r, i);
            } else if (c->state == C_JOINED) {
                root_read_joined(r, i);
            } else {
                int s = root_send(r, c);
                if (s != 0) {
                    if (s < 0)
                        root_drop(r, i, "could not answer rank %d: %s", c->rank, strerror(errno));
                    else
                        root_drop(r, i, NULL);
                }
            }
        }
        if (listening && !r->closed) root_accept(r);
    }
    free(pfd);
    root_free(r);
    return NULL;
}

static gvqResult_t start_root(root_t *r) {
    pthread_attr_t attr;
    pthread_t th;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        pthread_attr_setstacksize(&attr, ROOT_STACK_BYTES);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&th, &attr, root_thread, r);
        pthread_attr_destroy(&attr);
    }
    if (rc != 0) {
        GVQ_WARN("gvqGetUniqueId: cannot start the bootstrap thread: %s", strerror(rc));
        return gvqSystemError;
    }
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqGetUniqueId(gvqUniqueId *uniqueId) {
    if (uniqueId == NULL) {
        GVQ_WARN("gvqGetUniqueId: uniqueId is NULL");
        return gvqInvalidArgument;
    }
    root_t *r = calloc(1, sizeof *r);
    if (r == NULL) {
        GVQ_WARN("gvqGetUniqueId: out of memory");
        return gvqSystemError;
    }
    r->listen_fd = -1;
    gvq_boot_id_t *b = &r->id;
    b->magic = GVQ_BOOT_ID_MAGIC;
    if (gvq_boot_random(&b->tag, sizeof b->tag) != 0 ||
        gvq_boot_random(b->secret, sizeof b->secret) != 0) {
        GVQ_WARN("gvqGetUniqueId: getrandom failed: %s", strerror(errno));
        free(r);
        return gvqSystemError;
    }
    b->addr.sin_family = AF_INET;
    if (gvq_boot_pick_address(&b->addr.sin_addr) != 0) {
        GVQ_WARN("gvqGetUniqueId: no usable IPv4 interface (set GVQ_SOCKET_IFNAME)");
        free(r);
        return gvqSystemError;
    }
    b->addr.sin_port = htons((uint16_t)gvq_param(GVQ_PARAM_BOOTSTRAP_PORT));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        GVQ_WARN("gvqGetUniqueId: socket() failed: %s", strerror(errno));
        free(r);
        return gvqSystemError;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = sizeof b->addr;
    if (bind(fd, (struct sockaddr *)&b->addr, sizeof b->addr) != 0 || listen(fd, 1024) != 0 ||
        getsockname(fd, (struct sockaddr *)&b->addr, &len) != 0) {
        gvq_boot_addr_text(&b->addr, r->where, sizeof r->where);
        GVQ_WARN("gvqGetUniqueId: cannot listen on %s: %s", r->where, strerror(errno));
        close(fd);
        free(r);
        return gvqSystemError;
    }
    r->listen_fd = fd;
    gvq_boot_addr_text(&b->addr, r->where, sizeof r->where);
    uint64_t life_ms = (uint64_t)gvq_param(GVQ_PARAM_TIMEOUT_MS);
    r->deadline = life_ms ? gvq_now_ns() + life_ms * MS : 0;
    gvqUniqueId out;
    gvq_boot_id_encode(&out, b);
    GVQ_INFO("bootstrap root listening on %s", r->where);
    if (start_root(r) != gvqSuccess) { /* r still ours */
        close(fd);
        free(r);
        return gvqSystemError;
    }
    *uniqueId = out; /* r belongs to the thread now */
    return gvqSuccess;
}
