/*
 * bootstrap.c -- the rank side of the bootstrap (bootstrap_root.c has the protocol and the
 * root side): connect to the root named in the id, answer its challenge, check its reply and
 * take the table of every rank's address.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
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

/* getrandom(2) into p, retried on EINTR: 0, or -1 with errno */
int gvq_boot_random(void *p, size_t n) {
    uint8_t *b = p;
    while (n > 0) {
        ssize_t k = getrandom(b, n, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

void gvq_boot_addr_text(const struct sockaddr_in *a, char *out, size_t n) {
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    snprintf(out, n, "%s:%d", ip, ntohs(a->sin_port));
}

int gvq_boot_pick_address(struct in_addr *out) {
    const char *want = gvq_param_text(GVQ_PARAM_SOCKET_IFNAME);
    struct ifaddrs *ifs = NULL, *lo = NULL, *pick = NULL;
    if (getifaddrs(&ifs) != 0) return -1;
    for (struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET) continue;
        if (!(i->ifa_flags & IFF_UP)) continue;
        if (want != NULL && want[0] != '\0') {
            if (strcmp(i->ifa_name, want) == 0) {
                pick = i;
                break;
            }
            continue;
        }
        if (i->ifa_flags & IFF_LOOPBACK) {
            if (lo == NULL) lo = i;
        } else if (pick == NULL) {
            pick = i;
        }
    }
    if (pick == NULL && (want == NULL || want[0] == '\0')) pick = lo;
    int rc = -1;
    if (pick != NULL) {
        *out = ((struct sockaddr_in *)pick->ifa_addr)->sin_addr;
        rc = 0;
    } else if (want != NULL) {
        GVQ_WARN("GVQ_SOCKET_IFNAME=%s: no such IPv4 interface that is up", want);
    }
    freeifaddrs(ifs);
    return rc;
}

/* ---- rank side -------------------------------------------------------------------------- */

/* Move len bytes, giving up at deadline (ns, 0: never). 0, or -errno (-ETIMEDOUT, -ECONNRESET). */
int gvq_boot_io_until(int fd, void *buf, size_t len, int writing, uint64_t deadline) {
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
                              const gvq_boot_hello_t *h, const void *blob, uint64_t deadline,
                              gvq_peer_info_t *all, uint8_t **blobs, int *retry) {
    uint8_t chal[GVQ_BOOT_CHALLENGE_BYTES], challenge[GVQ_BOOT_NONCE_BYTES];
    uint8_t hello[GVQ_BOOT_HELLO_BYTES];
    uint64_t step = deadline ? deadline : gvq_now_ns() + CONNECT_LIMIT_NS;
    int rc = gvq_boot_io_until(fd, chal, sizeof chal, 0, step);
    gvq_boot_msg_t m =
        rc == 0 ? gvq_boot_challenge_parse(chal, sizeof chal, b, challenge) : GVQ_BOOT_MSG_OK;
    if (rc == 0 && m == GVQ_BOOT_MSG_OK) {
        gvq_boot_hello_encode(hello, b, challenge, h);
        rc = gvq_boot_io_until(fd, hello, sizeof hello, 1, step);
    }
    if (rc == 0 && m == GVQ_BOOT_MSG_OK && h->info.blob_bytes > 0) {
        size_t n = (size_t)h->info.blob_bytes + GVQ_BOOT_MAC_BYTES;
        uint8_t *msg = malloc(n);
        if (msg == NULL) {
            GVQ_WARN("bootstrap: out of memory for a blob of %d bytes", h->info.blob_bytes);
            return gvqSystemError;
        }
        gvq_boot_blob_encode(msg, b, challenge, blob, (size_t)h->info.blob_bytes);
        rc = gvq_boot_io_until(fd, msg, n, 1, step);
        free(msg);
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
    /* the answer: its head says whether a table follows; the size comes from our nranks, then
     * the blobs' from the table (capped per rank; the MAC checks them all) */
    uint64_t wait = deadline ? deadline + RANK_GRACE_NS : 0;
    size_t max = gvq_boot_reply_bytes(GVQ_BOOT_OK, h->nranks);
    uint8_t *rep = malloc(max);
    if (rep == NULL) {
        GVQ_WARN("bootstrap: out of memory for the table of %d ranks", h->nranks);
        return gvqSystemError;
    }
    gvqResult_t res = gvqSuccess;
    size_t len = GVQ_BOOT_REPLY_HEAD_BYTES;
    rc = gvq_boot_io_until(fd, rep, len, 0, wait);
    if (rc == 0) {
        uint32_t status = (uint32_t)rep[8] | (uint32_t)rep[9] << 8 | (uint32_t)rep[10] << 16 |
                          (uint32_t)rep[11] << 24;
        size_t total =
            status == GVQ_BOOT_OK ? max : gvq_boot_reply_bytes(GVQ_BOOT_STATUS_COUNT, h->nranks);
        size_t entries = (size_t)h->nranks * GVQ_BOOT_PEER_BYTES;
        if (status == GVQ_BOOT_OK) { /* the table first, to learn the blobs' length */
            rc = gvq_boot_io_until(fd, rep + len, entries, 0, wait);
            len += entries;
            size_t more = rc == 0 ? gvq_boot_table_blob_bytes(rep + len - entries, h->nranks) : 0;
            uint8_t *grown = more > 0 ? realloc(rep, total + more) : rep;
            if (grown == NULL) {
                GVQ_WARN("bootstrap: out of memory for %zu bytes of blobs", more);
                res = gvqSystemError;
                goto out_free;
            }
            rep = grown;
            total += more;
        }
        if (rc == 0) rc = gvq_boot_io_until(fd, rep + len, total - len, 0, wait);
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
    if (res == gvqSuccess && blobs != NULL) {
        size_t entries = (size_t)h->nranks * GVQ_BOOT_PEER_BYTES;
        size_t bb = len - GVQ_BOOT_REPLY_HEAD_BYTES - entries - GVQ_BOOT_MAC_BYTES;
        *blobs = NULL;
        if (bb > 0) {
            *blobs = malloc(bb);
            if (*blobs == NULL) {
                GVQ_WARN("bootstrap: out of memory for %zu bytes of blobs", bb);
                res = gvqSystemError;
            } else {
                memcpy(*blobs, rep + GVQ_BOOT_REPLY_HEAD_BYTES + entries, bb);
            }
        }
    }
out_free:
    free(rep);
    return res;
}

gvqResult_t gvq_bootstrap_exchange(const gvqUniqueId *id, int nranks, int rank,
                                   const gvq_peer_info_t *mine, uint64_t timeout_ns,
                                   const void *blob, gvq_peer_info_t *all, uint8_t **blobs,
                                   uint64_t *nonce) {
    gvq_boot_id_t b;
    if (!gvq_boot_id_decode(id, &b)) {
        GVQ_WARN("bootstrap: the id was not made by gvqGetUniqueId");
        return gvqInvalidArgument;
    }
    if (mine->blob_bytes < 0 || mine->blob_bytes > GVQ_BOOT_MAX_BLOB ||
        (mine->blob_bytes > 0 && blob == NULL)) {
        GVQ_WARN("bootstrap: a blob of %d bytes is not what the bootstrap carries (at most %d)",
                 mine->blob_bytes, GVQ_BOOT_MAX_BLOB);
        return gvqInternalError;
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
        gvqResult_t res = rank_round(fd, &b, where, &h, blob, deadline, all, blobs, &retry);
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
