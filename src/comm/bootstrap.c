/*
 * bootstrap.c -- the rank side of the bootstrap (bootstrap_root.c has the protocol and the
 * root side): connect to the root named in the id, answer its challenge, check its reply and
 * take the table of every rank's address.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
#include "gvq_bootstrap.h"

#define MS 1000000ull                    /* ns */
#define CONNECT_LIMIT_NS (60000ull * MS) /* how long to retry reaching the root without timeout */
#define RANK_GRACE_NS (1000ull * MS)     /* a rank waits this past its timeout for the answer */

int gvq_bootstrap_id_valid(const gvqUniqueId *id) {
    gvq_boot_id_t b;
    return gvq_boot_id_decode(id, &b);
}

/* ---- rank side -------------------------------------------------------------------------- */

/* Move len bytes, giving up at deadline (ns, 0: never). 0, or -errno (-ETIMEDOUT, -ECONNRESET). */
static int io_until(int fd, void *buf, size_t len, int writing, uint64_t deadline) {
    char *p = buf;
    while (len > 0) {
        int wait_ms = -1;
        if (deadline != 0) {
            uint64_t now = gvq_now_ns();
            if (now >= deadline) return -ETIMEDOUT;
            wait_ms = (int)GVQ_MIN((deadline - now + MS - 1) / MS, (uint64_t)INT32_MAX);
        }
        struct pollfd pfd = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
        int pr = poll(&pfd, 1, wait_ms);
        if (pr == 0) continue;
        if (pr < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        ssize_t k = writing ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : recv(fd, p, len, MSG_DONTWAIT);
        if (k == 0) return -ECONNRESET;
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return -errno;
        }
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

/* A connected socket to the root, retrying until limit (ns): the root may still be coming up. */
static gvqResult_t rank_connect(const gvq_boot_id_t *b, const char *where, int rank, uint64_t limit,
                                int *out) {
    for (;;) {
        int err = 0;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            GVQ_WARN("bootstrap: socket() failed: %s", strerror(errno));
            return gvqSystemError;
        }
        int rc = connect(fd, (const struct sockaddr *)&b->addr, sizeof b->addr);
        if (rc != 0 && errno == EINPROGRESS) {
            uint64_t now = gvq_now_ns();
            int wait_ms = now >= limit ? 0 : (int)GVQ_MIN((limit - now) / MS + 1, 10000ull);
            struct pollfd pfd = {fd, POLLOUT, 0};
            socklen_t len = sizeof err;
            if (poll(&pfd, 1, wait_ms) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
                rc = 0;
            else if (err == 0)
                err = ETIMEDOUT;
        } else if (rc != 0) {
            err = errno;
        }
        if (rc == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            *out = fd;
            return gvqSuccess;
        }
        close(fd);
        if (gvq_now_ns() >= limit) {
            GVQ_WARN("bootstrap: rank %d cannot reach the root at %s: %s", rank, where,
                     strerror(err));
            return err == ETIMEDOUT ? gvqTimeout : gvqRemoteError;
        }
        usleep(20000);
    }
}

static gvqResult_t rank_status(const gvq_boot_reply_t *rep, int rank) {
    switch (rep->status) {
    case GVQ_BOOT_OK:
        return gvqSuccess;
    case GVQ_BOOT_NRANKS_MISMATCH:
        GVQ_WARN("bootstrap: ranks disagree on nranks (%d and %d)", rep->nranks, rep->detail);
        return gvqInvalidUsage;
    case GVQ_BOOT_DUP_RANK:
        GVQ_WARN("bootstrap: rank %d was claimed twice (rank %d of %d here)", rep->detail, rank,
                 rep->nranks);
        return gvqInvalidUsage;
    case GVQ_BOOT_TIMEOUT:
        GVQ_WARN("bootstrap: only %d of %d ranks joined within the timeout (GVQ_TIMEOUT_MS)",
                 rep->detail, rep->nranks);
        return gvqTimeout;
    default:
        GVQ_WARN("bootstrap: the root failed (status %d: out of memory)", rep->status);
        return gvqSystemError;
    }
}

/* One attempt: challenge, hello, answer. *retry is set when the root dropped us before it read
 * our hello (pushed out by strangers), so connecting again may succeed. */
static gvqResult_t rank_round(int fd, const gvq_boot_id_t *b, const char *where,
                              const gvq_boot_hello_t *h, uint64_t deadline, gvq_peer_info_t *all,
                              int *retry) {
    uint8_t chal[GVQ_BOOT_CHALLENGE_BYTES], challenge[GVQ_BOOT_NONCE_BYTES];
    uint8_t hello[GVQ_BOOT_HELLO_BYTES];
    uint64_t step = deadline ? deadline : gvq_now_ns() + CONNECT_LIMIT_NS;
    int rc = io_until(fd, chal, sizeof chal, 0, step);
    gvq_boot_msg_t m =
        rc == 0 ? gvq_boot_challenge_parse(chal, sizeof chal, b, challenge) : GVQ_BOOT_MSG_OK;
    if (rc == 0 && m == GVQ_BOOT_MSG_OK) {
        gvq_boot_hello_encode(hello, b, challenge, h);
        rc = io_until(fd, hello, sizeof hello, 1, step);
    }
    if (rc != 0) {
        *retry = rc == -ECONNRESET || rc == -EPIPE;
        if (!*retry)
            GVQ_WARN("bootstrap: rank %d lost the root at %s before its hello: %s", h->rank, where,
                     strerror(-rc));
        return rc == -ETIMEDOUT ? gvqTimeout : gvqRemoteError;
    }
    if (m != GVQ_BOOT_MSG_OK) {
        GVQ_WARN("bootstrap: rank %d: the peer at %s is not this id's root: its challenge %s",
                 h->rank, where, gvq_boot_msg_text(m));
        return gvqRemoteError;
    }
    /* the answer: its head says whether a table follows; the size comes from our nranks */
    uint64_t wait = deadline ? deadline + RANK_GRACE_NS : 0;
    size_t max = gvq_boot_reply_bytes(GVQ_BOOT_OK, h->nranks);
    uint8_t *rep = malloc(max);
    if (rep == NULL) {
        GVQ_WARN("bootstrap: out of memory for the table of %d ranks", h->nranks);
        return gvqSystemError;
    }
    gvqResult_t res = gvqSuccess;
    size_t len = GVQ_BOOT_REPLY_HEAD_BYTES;
    rc = io_until(fd, rep, len, 0, wait);
    if (rc == 0) {
        uint32_t status = (uint32_t)rep[8] | (uint32_t)rep[9] << 8 | (uint32_t)rep[10] << 16 |
                          (uint32_t)rep[11] << 24;
        size_t total =
            status == GVQ_BOOT_OK ? max : gvq_boot_reply_bytes(GVQ_BOOT_STATUS_COUNT, h->nranks);
        rc = io_until(fd, rep + len, total - len, 0, wait);
        len = total;
    }
    if (rc != 0) {
        *retry = rc == -ECONNRESET && len == GVQ_BOOT_REPLY_HEAD_BYTES;
        if (rc == -ETIMEDOUT)
            GVQ_WARN("bootstrap: rank %d: no answer from the root at %s within the timeout",
                     h->rank, where);
        else if (!*retry)
            GVQ_WARN("bootstrap: rank %d lost the root at %s: %s", h->rank, where, strerror(-rc));
        res = rc == -ETIMEDOUT ? gvqTimeout : gvqRemoteError;
        goto out_free;
    }
    gvq_boot_reply_t r;
    m = gvq_boot_reply_parse(rep, len, b, challenge, h->nonce, h->nranks, h->rank, &r, all);
    if (m != GVQ_BOOT_MSG_OK) {
        GVQ_WARN("bootstrap: rank %d: the answer from %s %s; not trusted", h->rank, where,
                 gvq_boot_msg_text(m));
        res = gvqRemoteError;
        goto out_free;
    }
    res = rank_status(&r, h->rank);
out_free:
    free(rep);
    return res;
}

gvqResult_t gvq_bootstrap_exchange(const gvqUniqueId *id, int nranks, int rank,
                                   const gvq_peer_info_t *mine, uint64_t timeout_ns,
                                   gvq_peer_info_t *all, uint64_t *nonce) {
    gvq_boot_id_t b;
    if (!gvq_boot_id_decode(id, &b)) {
        GVQ_WARN("bootstrap: the id was not made by gvqGetUniqueId");
        return gvqInvalidArgument;
    }
    if (nranks > GVQ_BOOT_MAX_RANKS) {
        GVQ_WARN("bootstrap: nranks=%d is more than the %d the bootstrap serves", nranks,
                 GVQ_BOOT_MAX_RANKS);
        return gvqInvalidArgument;
    }
    char where[32];
    gvq_boot_addr_text(&b.addr, where, sizeof where);
    gvq_boot_hello_t h;
    memset(&h, 0, sizeof h);
    h.nranks = nranks;
    h.rank = rank;
    h.timeout_ms = (int64_t)(timeout_ns / MS);
    h.info = *mine;
    if (gvq_boot_random(h.nonce, sizeof h.nonce) != 0) {
        GVQ_WARN("bootstrap: getrandom failed: %s", strerror(errno));
        return gvqSystemError;
    }
    uint64_t start = gvq_now_ns();
    uint64_t deadline = timeout_ns ? start + timeout_ns : 0;
    uint64_t connect_limit = deadline ? deadline : start + CONNECT_LIMIT_NS;
    for (;;) {
        int fd = -1, retry = 0;
        GVQCHECK(rank_connect(&b, where, rank, connect_limit, &fd));
        gvqResult_t res = rank_round(fd, &b, where, &h, deadline, all, &retry);
        close(fd);
        if (res == gvqSuccess && nonce != NULL) *nonce = b.tag;
        if (!retry) return res;
        if (gvq_now_ns() >= connect_limit) {
            GVQ_WARN("bootstrap: rank %d: the root at %s kept closing the connection", rank, where);
            return gvqRemoteError;
        }
        GVQ_INFO("bootstrap: rank %d: the root at %s closed the connection early; retrying", rank,
                 where);
        usleep(20000);
    }
}
