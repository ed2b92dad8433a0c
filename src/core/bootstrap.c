/*
 * bootstrap.c -- how the ranks of a new communicator find each other, the NCCL way.
 *
 *   gvqGetUniqueId (root process)          gvqCommInitRank (every rank, root process too)
 *   listen on a TCP port, start a thread   connect to the address in the id, send hello
 *   thread: collect nranks hellos    <---  {nonce, nranks, rank, world rank, ...}
 *           check them, answer all   --->  table of every rank's world rank, or an error
 *
 * The id (128 bytes) holds a magic, a random nonce and the root's IPv4 address and port. The
 * interface is GVQ_SOCKET_IFNAME if set, else the first non-loopback IPv4 interface that is up,
 * else loopback. The root thread gives up GVQ_TIMEOUT_MS after the first hello when ranks are
 * missing and tells the ranks that came (they return gvqTimeout naming how many joined).
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
#include <pthread.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gvq_comm.h"

#define BOOT_MAGIC 0x3174306f6f627167ull /* "gqboot1" */

typedef struct {
    uint64_t magic;
    uint64_t nonce;
    struct sockaddr_in addr;
} boot_id_t;

typedef struct {
    uint64_t magic;
    uint64_t nonce;
    int32_t nranks;
    int32_t rank;
    int64_t timeout_ms;
    gvq_peer_info_t info;
} boot_hello_t;

enum { BOOT_OK = 0, BOOT_NRANKS_MISMATCH, BOOT_DUP_RANK, BOOT_TIMEOUT, BOOT_TOO_MANY };

typedef struct {
    int32_t status;
    int32_t nranks;
    int32_t detail;
    int32_t pad;
} boot_reply_t;

_Static_assert(sizeof(boot_id_t) <= GVQ_UNIQUE_ID_BYTES, "bootstrap id too large");

int gvq_bootstrap_id_valid(const gvqUniqueId *id) {
    boot_id_t b;
    memcpy(&b, id->internal, sizeof b);
    return b.magic == BOOT_MAGIC && b.addr.sin_family == AF_INET && b.addr.sin_port != 0;
}

static int io_full(int fd, void *buf, size_t len, int writing, int timeout_ms) {
    char *p = buf;
    while (len > 0) {
        struct pollfd pfd = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
        int pr = poll(&pfd, 1, timeout_ms);
        if (pr == 0) return -ETIMEDOUT;
        if (pr < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        ssize_t k = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (k == 0) return -ECONNRESET;
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return -errno;
        }
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

/* ---- root side -------------------------------------------------------------------------- */

typedef struct {
    int listen_fd;
    uint64_t nonce;
} root_args_t;

static void root_reply_all(int *fds, int nfds, boot_reply_t *rep, const gvq_peer_info_t *table) {
    for (int i = 0; i < nfds; i++) {
        if (fds[i] < 0) continue;
        if (io_full(fds[i], rep, sizeof *rep, 1, 5000) == 0 && rep->status == BOOT_OK)
            io_full(fds[i], (void *)table, sizeof(gvq_peer_info_t) * (size_t)rep->nranks, 1, 5000);
        close(fds[i]);
    }
}

static void *root_thread(void *arg) {
    root_args_t a = *(root_args_t *)arg;
    free(arg);
    int nranks = -1, joined = 0, nfds = 0, cap = 0;
    int *fds = NULL;
    gvq_peer_info_t *table = NULL;
    char *seen = NULL;
    uint64_t deadline = 0;
    boot_reply_t rep = {BOOT_OK, 0, 0, 0};
    for (;;) {
        struct pollfd pfd = {a.listen_fd, POLLIN, 0};
        int pr = poll(&pfd, 1, 100);
        if (deadline != 0 && gvq_now_ns() > deadline) {
            rep.status = BOOT_TIMEOUT;
            rep.detail = joined;
            break;
        }
        if (pr <= 0) continue;
        int fd = accept(a.listen_fd, NULL, NULL);
        if (fd < 0) continue;
        boot_hello_t h;
        if (io_full(fd, &h, sizeof h, 0, 5000) != 0 || h.magic != BOOT_MAGIC ||
            h.nonce != a.nonce) {
            close(fd); /* a stray connection, not one of ours */
            continue;
        }
        if (nfds == cap) {
            cap = cap ? 2 * cap : 16;
            int *nf = realloc(fds, sizeof(int) * (size_t)cap);
            if (nf == NULL) {
                close(fd);
                continue;
            }
            fds = nf;
        }
        fds[nfds++] = fd;
        if (nranks < 0) {
            nranks = h.nranks;
            table = calloc((size_t)nranks, sizeof *table);
            seen = calloc((size_t)nranks, 1);
            if (table == NULL || seen == NULL) {
                rep.status = BOOT_TOO_MANY;
                break;
            }
            uint64_t tmo = h.timeout_ms > 0 ? (uint64_t)h.timeout_ms : 0;
            deadline = tmo ? gvq_now_ns() + tmo * 1000000ull : 0;
        }
        rep.nranks = nranks;
        if (h.nranks != nranks) {
            rep.status = BOOT_NRANKS_MISMATCH;
            rep.detail = h.nranks;
            break;
        }
        if (h.rank < 0 || h.rank >= nranks || seen[h.rank]) {
            rep.status = BOOT_DUP_RANK;
            rep.detail = h.rank;
            break;
        }
        seen[h.rank] = 1;
        table[h.rank] = h.info;
        if (++joined == nranks) break;
    }
    root_reply_all(fds, nfds, &rep, table);
    close(a.listen_fd);
    free(fds);
    free(table);
    free(seen);
    return NULL;
}

static int pick_address(struct in_addr *out) {
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

GVQ_API gvqResult_t gvqGetUniqueId(gvqUniqueId *uniqueId) {
    if (uniqueId == NULL) {
        GVQ_WARN("gvqGetUniqueId: uniqueId is NULL");
        return gvqInvalidArgument;
    }
    boot_id_t b;
    memset(&b, 0, sizeof b);
    b.magic = BOOT_MAGIC;
    if (getrandom(&b.nonce, sizeof b.nonce, 0) != (ssize_t)sizeof b.nonce)
        b.nonce = gvq_now_ns() ^ ((uint64_t)getpid() << 32);
    b.addr.sin_family = AF_INET;
    if (pick_address(&b.addr.sin_addr) != 0) {
        GVQ_WARN("gvqGetUniqueId: no usable IPv4 interface (set GVQ_SOCKET_IFNAME)");
        return gvqSystemError;
    }
    b.addr.sin_port = htons((uint16_t)gvq_param(GVQ_PARAM_BOOTSTRAP_PORT));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        GVQ_WARN("gvqGetUniqueId: socket() failed: %s", strerror(errno));
        return gvqSystemError;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = sizeof b.addr;
    if (bind(fd, (struct sockaddr *)&b.addr, sizeof b.addr) != 0 || listen(fd, 1024) != 0 ||
        getsockname(fd, (struct sockaddr *)&b.addr, &len) != 0) {
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &b.addr.sin_addr, ip, sizeof ip);
        GVQ_WARN("gvqGetUniqueId: cannot listen on %s:%d: %s", ip, ntohs(b.addr.sin_port),
                 strerror(errno));
        close(fd);
        return gvqSystemError;
    }
    root_args_t *a = malloc(sizeof *a);
    pthread_t th;
    if (a == NULL) {
        close(fd);
        return gvqSystemError;
    }
    a->listen_fd = fd;
    a->nonce = b.nonce;
    if (pthread_create(&th, NULL, root_thread, a) != 0) {
        GVQ_WARN("gvqGetUniqueId: cannot start the bootstrap thread");
        free(a);
        close(fd);
        return gvqSystemError;
    }
    pthread_detach(th);
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &b.addr.sin_addr, ip, sizeof ip);
    GVQ_INFO("bootstrap root listening on %s:%d", ip, ntohs(b.addr.sin_port));
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &b, sizeof b);
    return gvqSuccess;
}

/* ---- rank side -------------------------------------------------------------------------- */

gvqResult_t gvq_bootstrap_exchange(const gvqUniqueId *id, int nranks, int rank,
                                   const gvq_peer_info_t *mine, uint64_t timeout_ns,
                                   gvq_peer_info_t *all, uint64_t *nonce) {
    boot_id_t b;
    memcpy(&b, id->internal, sizeof b);
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &b.addr.sin_addr, ip, sizeof ip);
    uint64_t start = gvq_now_ns();
    /* connecting may race a root that is still coming up: retry for a while */
    uint64_t connect_limit = timeout_ns ? timeout_ns : 60000000000ull;
    int fd = -1;
    for (;;) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            GVQ_WARN("bootstrap: socket() failed: %s", strerror(errno));
            return gvqSystemError;
        }
        if (connect(fd, (struct sockaddr *)&b.addr, sizeof b.addr) == 0) break;
        int err = errno;
        close(fd);
        fd = -1;
        if (gvq_now_ns() - start > connect_limit) {
            GVQ_WARN("bootstrap: rank %d cannot reach the root at %s:%d: %s", rank, ip,
                     ntohs(b.addr.sin_port), strerror(err));
            return gvqRemoteError;
        }
        usleep(20000);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    boot_hello_t h;
    memset(&h, 0, sizeof h);
    h.magic = BOOT_MAGIC;
    h.nonce = b.nonce;
    h.nranks = nranks;
    h.rank = rank;
    h.timeout_ms = (int64_t)(timeout_ns / 1000000ull);
    h.info = *mine;
    gvqResult_t res = gvqSuccess;
    boot_reply_t rep;
    /* the root answers within its own timeout; allow it some slack beyond ours */
    int wait_ms =
        timeout_ns ? (int)GVQ_MIN(timeout_ns / 1000000ull + 10000ull, (uint64_t)INT32_MAX) : -1;
    int rc = io_full(fd, &h, sizeof h, 1, 10000);
    if (rc == 0) rc = io_full(fd, &rep, sizeof rep, 0, wait_ms);
    if (rc != 0) {
        GVQ_WARN("bootstrap: rank %d lost the root at %s:%d: %s", rank, ip, ntohs(b.addr.sin_port),
                 strerror(-rc));
        res = rc == -ETIMEDOUT ? gvqTimeout : gvqRemoteError;
        goto out_close;
    }
    switch (rep.status) {
    case BOOT_OK:
        if (rep.nranks != nranks) {
            res = gvqInternalError;
            break;
        }
        rc = io_full(fd, all, sizeof(gvq_peer_info_t) * (size_t)nranks, 0, 10000);
        if (rc != 0) {
            GVQ_WARN("bootstrap: rank %d lost the root while reading the table: %s", rank,
                     strerror(-rc));
            res = gvqRemoteError;
        }
        break;
    case BOOT_NRANKS_MISMATCH:
        GVQ_WARN("bootstrap: ranks disagree on nranks (%d and %d)", rep.nranks, rep.detail);
        res = gvqInvalidUsage;
        break;
    case BOOT_DUP_RANK:
        GVQ_WARN("bootstrap: rank %d was claimed twice (or is outside [0, %d))", rep.detail,
                 rep.nranks);
        res = gvqInvalidUsage;
        break;
    case BOOT_TIMEOUT:
        GVQ_WARN("bootstrap: only %d of %d ranks joined within the timeout (GVQ_TIMEOUT_MS)",
                 rep.detail, rep.nranks);
        res = gvqTimeout;
        break;
    default:
        GVQ_WARN("bootstrap: the root failed (status %d)", rep.status);
        res = gvqInternalError;
    }
    if (nonce != NULL) *nonce = b.nonce;
out_close:
    close(fd);
    return res;
}
