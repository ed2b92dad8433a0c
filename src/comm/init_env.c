/*
 * init_env.c -- gvqCommInitFromEnv: a communicator from a launcher's environment (torchrun,
 * srun, mpirun, or any script that sets rank, size and a meeting point), with no id passed by
 * hand.
 *
 * Rank 0 makes the bootstrap id and serves it from a small TCP store on the meeting point's
 * port; the others fetch it there. The store speaks one exchange per connection:
 *
 *   ask     rank -> store  "gvqSTOR1" rank nranks                                   16 bytes
 *   answer  store -> rank  "gvqSTOK1" status id[GVQ_UNIQUE_ID_BYTES] (status 0: the id follows;
 *                          1: nranks differs, 2: rank out of range, the id zeroed)
 *
 * It runs on a thread of its own with poll, serves many connections at once, drops one that
 * sends anything else or stays silent for STORE_CONN_MS, and closes when every rank 1..n-1 has
 * its answer or the timeout passed. What it gives away is the id (see gvq.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gvq_bootstrap.h"

#define MS 1000000ull
#define STORE_CONN_MS 5000
#define STORE_MAX_CONNS 64
#define ASK_BYTES 16
#define ANSWER_BYTES (12 + GVQ_UNIQUE_ID_BYTES)

static const char MAGIC_ASK[8] = {'g', 'v', 'q', 'S', 'T', 'O', 'R', '1'};
static const char MAGIC_ANSWER[8] = {'g', 'v', 'q', 'S', 'T', 'O', 'K', '1'};

static void put32(uint8_t *p, uint32_t x) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(x >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- the environment ---------------------------------------------------------------------- */

/* A whole decimal number in [lo, hi] from variable name: 1, 0 when unset, -1 (WARN) when bad. */
static int env_int(const char *name, long lo, long hi, int *out) {
    const char *v = getenv(name);
    if (v == NULL || v[0] == '\0') return 0;
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) {
        GVQ_WARN("gvqCommInitFromEnv: %s='%s' is not a whole number in [%ld, %ld]", name, v, lo,
                 hi);
        return -1;
    }
    *out = (int)x;
    return 1;
}

static gvqResult_t env_rank_size(int *rank, int *size) {
    static const char *const pairs[][2] = {{"GVQ_RANK", "GVQ_WORLD_SIZE"},
                                           {"RANK", "WORLD_SIZE"},
                                           {"SLURM_PROCID", "SLURM_NTASKS"},
                                           {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                           {"PMI_RANK", "PMI_SIZE"}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        int r = 0, n = 0;
        int hr = env_int(pairs[i][0], 0, INT32_MAX - 1, &r);
        int hn = env_int(pairs[i][1], 1, INT32_MAX, &n);
        if (hr < 0 || hn < 0) return gvqInvalidUsage;
        if (hr == 0 && hn == 0) continue;
        if (hr == 0 || hn == 0) {
            GVQ_WARN("gvqCommInitFromEnv: %s is set but %s is not", hr ? pairs[i][0] : pairs[i][1],
                     hr ? pairs[i][1] : pairs[i][0]);
            return gvqInvalidUsage;
        }
        if (r >= n) {
            GVQ_WARN("gvqCommInitFromEnv: %s=%d is not below %s=%d", pairs[i][0], r, pairs[i][1],
                     n);
            return gvqInvalidUsage;
        }
        *rank = r;
        *size = n;
        GVQ_INFO("gvqCommInitFromEnv: rank %d of %d from %s/%s", r, n, pairs[i][0], pairs[i][1]);
        return gvqSuccess;
    }
    GVQ_WARN("gvqCommInitFromEnv: no rank and size in the environment (GVQ_RANK/GVQ_WORLD_SIZE, "
             "RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_RANK/SIZE or "
             "PMI_RANK/PMI_SIZE)");
    return gvqInvalidUsage;
}

/* The meeting point: host (written to host, n bytes) and port. */
static gvqResult_t env_store(char *host, size_t n, int *port) {
    const char *store = getenv("GVQ_STORE");
    if (store != NULL && store[0] != '\0') {
        const char *colon = strrchr(store, ':');
        char *end = NULL;
        long p = colon != NULL ? strtol(colon + 1, &end, 10) : -1;
        if (colon == NULL || colon == store || (size_t)(colon - store) >= n || end == colon + 1 ||
            *end != '\0' || p < 1 || p > 65535) {
            GVQ_WARN("gvqCommInitFromEnv: GVQ_STORE='%s' is not host:port", store);
            return gvqInvalidUsage;
        }
        memcpy(host, store, (size_t)(colon - store));
        host[colon - store] = '\0';
        *port = (int)p;
        return gvqSuccess;
    }
    const char *addr = getenv("MASTER_ADDR");
    int hp = env_int("MASTER_PORT", 1, 65535, port);
    if (hp < 0) return gvqInvalidUsage;
    if (addr == NULL || addr[0] == '\0' || hp == 0) {
        GVQ_WARN("gvqCommInitFromEnv: no meeting point: set GVQ_STORE=host:port, or MASTER_ADDR "
                 "and MASTER_PORT");
        return gvqInvalidUsage;
    }
    if (strlen(addr) >= n) {
        GVQ_WARN("gvqCommInitFromEnv: MASTER_ADDR is %zu characters long", strlen(addr));
        return gvqInvalidUsage;
    }
    strcpy(host, addr);
    return gvqSuccess;
}

/* ---- the store (rank 0) ------------------------------------------------------------------- */

typedef struct {
    int fd;
    uint64_t deadline;
    uint8_t in[ASK_BYTES], out[ANSWER_BYTES];
    size_t got, sent;
    int rank; /* answered rank (>= 0 once its answer is queued with the id) */
} store_conn_t;

typedef struct {
    int listen_fd, nranks;
    gvqUniqueId id;
    char *served;
    int left; /* ranks 1..n-1 without their answer */
    uint64_t deadline;
    store_conn_t c[STORE_MAX_CONNS];
    int nc;
} store_t;

static void store_drop(store_t *s, int i) {
    close(s->c[i].fd);
    s->c[i] = s->c[--s->nc];
}

static void store_read(store_t *s, int i) {
    store_conn_t *c = &s->c[i];
    ssize_t k = recv(c->fd, c->in + c->got, ASK_BYTES - c->got, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (k <= 0) {
        store_drop(s, i);
        return;
    }
    c->got += (size_t)k;
    if (c->got >= 8 && memcmp(c->in, MAGIC_ASK, 8) != 0) {
        GVQ_WARN("gvqCommInitFromEnv: the store dropped a connection that is not a gvq rank "
                 "asking for the id");
        store_drop(s, i);
        return;
    }
    if (c->got < ASK_BYTES) return;
    uint32_t rank = get32(c->in + 8), nranks = get32(c->in + 12);
    uint32_t status = nranks != (uint32_t)s->nranks ? 1 : rank >= nranks || rank == 0 ? 2 : 0;
    memcpy(c->out, MAGIC_ANSWER, 8);
    put32(c->out + 8, status);
    memset(c->out + 12, 0, GVQ_UNIQUE_ID_BYTES);
    if (status == 0) {
        memcpy(c->out + 12, &s->id, GVQ_UNIQUE_ID_BYTES);
        c->rank = (int)rank;
    } else {
        GVQ_WARN("gvqCommInitFromEnv: the store refused rank %u of %u (this job has %d ranks)",
                 rank, nranks, s->nranks);
    }
    c->sent = 0;
}

static void store_write(store_t *s, int i) {
    store_conn_t *c = &s->c[i];
    ssize_t k = send(c->fd, c->out + c->sent, ANSWER_BYTES - c->sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (k < 0) {
        store_drop(s, i);
        return;
    }
    c->sent += (size_t)k;
    if (c->sent < ANSWER_BYTES) return;
    if (c->rank > 0 && !s->served[c->rank]) {
        s->served[c->rank] = 1;
        s->left--;
    }
    store_drop(s, i);
}

static void *store_thread(void *arg) {
    store_t *s = arg;
    struct pollfd pfd[STORE_MAX_CONNS + 1];
    while (s->left > 0) {
        uint64_t now = gvq_now_ns();
        if (s->deadline != 0 && now >= s->deadline) {
            GVQ_WARN("gvqCommInitFromEnv: the store closed with %d rank(s) that never asked for "
                     "the id (GVQ_TIMEOUT_MS)",
                     s->left);
            break;
        }
        for (int i = s->nc - 1; i >= 0; i--)
            if (now >= s->c[i].deadline) store_drop(s, i);
        for (int i = 0; i < s->nc; i++) {
            int answering = s->c[i].got == ASK_BYTES;
            pfd[i] = (struct pollfd){s->c[i].fd, (short)(answering ? POLLOUT : POLLIN), 0};
        }
        pfd[s->nc] = (struct pollfd){s->listen_fd, POLLIN, 0};
        int n = s->nc;
        if (poll(pfd, (nfds_t)n + 1, 200) <= 0) continue;
        for (int i = n - 1; i >= 0; i--) {
            if (pfd[i].revents == 0) continue;
            if (s->c[i].got == ASK_BYTES)
                store_write(s, i);
            else
                store_read(s, i);
        }
        if (pfd[n].revents & POLLIN) {
            int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0 && s->nc == STORE_MAX_CONNS) { /* make room: the oldest goes */
                int old = 0;
                for (int i = 1; i < s->nc; i++)
                    if (s->c[i].deadline < s->c[old].deadline) old = i;
                store_drop(s, old);
            }
            if (fd >= 0) {
                store_conn_t *c = &s->c[s->nc++];
                memset(c, 0, sizeof *c);
                c->fd = fd;
                c->rank = -1;
                c->deadline = gvq_now_ns() + STORE_CONN_MS * MS;
            }
        }
    }
    for (int i = 0; i < s->nc; i++)
        close(s->c[i].fd);
    close(s->listen_fd);
    free(s->served);
    free(s);
    return NULL;
}

static gvqResult_t store_start(int port, int nranks, const gvqUniqueId *id, int64_t timeout_ms) {
    store_t *s = calloc(1, sizeof *s);
    char *served = calloc((size_t)nranks, 1);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s == NULL || served == NULL || fd < 0) {
        GVQ_WARN("gvqCommInitFromEnv: cannot start the store: %s",
                 fd < 0 ? strerror(errno) : "out of memory");
        if (fd >= 0) close(fd);
        free(s);
        free(served);
        return gvqSystemError;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1024) != 0) {
        GVQ_WARN("gvqCommInitFromEnv: the store cannot listen on port %d: %s", port,
                 strerror(errno));
        close(fd);
        free(s);
        free(served);
        return gvqSystemError;
    }
    s->listen_fd = fd;
    s->nranks = nranks;
    s->id = *id;
    s->served = served;
    s->left = nranks - 1;
    s->deadline = timeout_ms > 0 ? gvq_now_ns() + (uint64_t)timeout_ms * MS : 0;
    pthread_attr_t attr;
    pthread_t th;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&th, &attr, store_thread, s);
        pthread_attr_destroy(&attr);
    }
    if (rc != 0) {
        GVQ_WARN("gvqCommInitFromEnv: cannot start the store's thread: %s", strerror(rc));
        close(fd);
        free(s);
        free(served);
        return gvqSystemError;
    }
    GVQ_INFO("gvqCommInitFromEnv: the store serves the id on port %d", port);
    return gvqSuccess;
}

/* ---- asking the store (ranks 1..n-1) ------------------------------------------------------ */

static gvqResult_t store_ask(const char *host, int port, int rank, int nranks, int64_t timeout_ms,
                             gvqUniqueId *id) {
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    uint64_t start = gvq_now_ns();
    uint64_t deadline = start + (uint64_t)(timeout_ms > 0 ? timeout_ms : 600000) * MS;
    int warned = 0;
    for (;;) {
        struct addrinfo hints, *ai = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        int gai = getaddrinfo(host, ports, &hints, &ai);
        if (gai == 0) {
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                uint8_t ask[ASK_BYTES], ans[ANSWER_BYTES];
                memcpy(ask, MAGIC_ASK, 8);
                put32(ask + 8, (uint32_t)rank);
                put32(ask + 12, (uint32_t)nranks);
                uint64_t by = GVQ_MIN(deadline, gvq_now_ns() + STORE_CONN_MS * MS);
                int ok = gvq_boot_io_until(fd, ask, sizeof ask, 1, by) == 0 &&
                         gvq_boot_io_until(fd, ans, sizeof ans, 0, by) == 0;
                close(fd);
                freeaddrinfo(ai);
                if (ok && memcmp(ans, MAGIC_ANSWER, 8) == 0) {
                    uint32_t status = get32(ans + 8);
                    if (status == 0) {
                        memcpy(id, ans + 12, GVQ_UNIQUE_ID_BYTES);
                        return gvqSuccess;
                    }
                    GVQ_WARN("gvqCommInitFromEnv: the store at %s:%d refused rank %d of %d: %s",
                             host, port, rank, nranks,
                             status == 1 ? "rank 0 has another size" : "rank out of range");
                    return gvqInvalidUsage;
                }
                if (ok) {
                    GVQ_WARN("gvqCommInitFromEnv: %s:%d is not a gvq store (wrong answer)", host,
                             port);
                    return gvqRemoteError;
                }
            } else {
                if (fd >= 0) close(fd);
                freeaddrinfo(ai);
            }
        } else if (!warned) {
            GVQ_INFO("gvqCommInitFromEnv: %s: %s; retrying", host, gai_strerror(gai));
            warned = 1;
        }
        if (gvq_now_ns() >= deadline) {
            GVQ_WARN("gvqCommInitFromEnv: rank %d got no id from the store at %s:%d within %lld "
                     "ms (is rank 0 running?)",
                     rank, host, port, (long long)((gvq_now_ns() - start) / MS));
            return gvqTimeout;
        }
        usleep(50000);
    }
}

GVQ_API gvqResult_t gvqCommInitFromEnv(gvqComm_t *comm, gvqConfig_t *config) {
    if (comm == NULL) {
        GVQ_WARN("gvqCommInitFromEnv: comm is NULL");
        return gvqInvalidArgument;
    }
    int rank = 0, nranks = 0, port = 0;
    char host[256];
    GVQCHECK(env_rank_size(&rank, &nranks));
    int64_t timeout_ms;
    size_t chunk;
    GVQCHECK(gvq_config_resolve(config, "gvqCommInitFromEnv", &timeout_ms, &chunk));
    gvqUniqueId id;
    if (nranks > 1) GVQCHECK(env_store(host, sizeof host, &port));
    if (rank == 0) {
        GVQCHECK(gvqGetUniqueId(&id));
        if (nranks > 1) GVQCHECK(store_start(port, nranks, &id, timeout_ms));
    } else {
        GVQCHECK(store_ask(host, port, rank, nranks, timeout_ms, &id));
    }
    return gvqCommInitRankConfig(comm, nranks, id, rank, config);
}
