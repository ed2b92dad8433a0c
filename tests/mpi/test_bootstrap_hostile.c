/*
 * test_bootstrap_hostile.c -- the bootstrap lets no one in, and no one can stop it. One program,
 * three scenarios (argv[1]); in each, rank 0 makes the id and MPI_Bcast hands it to all:
 *
 *   stranger   (2 ranks) Before the real ranks join, rank 1 runs four hostile clients that know
 *              the root's address and the id's public tag but not its secret: an old-style
 *              hello claiming rank 1 with the tag (what the 64-bit clear nonce used to admit),
 *              a well-formed hello MACed with a wrong secret, 80 random bytes, and 20 bytes then
 *              close. The real ranks must form the communicator, and an allreduce must work.
 *   slowloris  (2 ranks) Rank 1 holds 50 silent connections and one client that sends a byte a
 *              second; the real ranks must still form the communicator within the timeout.
 *   duplicate  (3 ranks) nranks 3, ranks 1 and 2 both claim rank 1, rank 0 arrives last: every
 *              rank must get gvqInvalidUsage naming the claim, well within the timeout (before,
 *              rank 0 found the root gone and waited out its timeout; a stranger's claim made
 *              rank 0 hang).
 *
 * The hostile clients read the address and tag through gvq_bootstrap.h (this test links the
 * static library). A watchdog turns a hang into a failure.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "gvq.h"
#include "gvq_bootstrap.h"
#include "mpitest.h"

#define TIMEOUT_MS 5000
#define SILENT 50

static gvq_boot_id_t the_id;

/* A blocking connection to the root, or -1. */
static int dial(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&the_id.addr, sizeof the_id.addr) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Read up to n bytes within ms; the count read (0 at EOF or timeout). */
static size_t read_for(int fd, void *buf, size_t n, int ms) {
    size_t got = 0;
    while (got < n) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, ms) != 1) break;
        ssize_t k = recv(fd, (char *)buf + got, n - got, 0);
        if (k <= 0) break;
        got += (size_t)k;
    }
    return got;
}

static void put_le(uint8_t *p, uint64_t x, int bytes) {
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(x >> (8 * i));
}

/* The hello that the old bootstrap accepted from anyone who saw the id's 64-bit nonce. */
static void *hostile_old_hello(void *arg) {
    (void)arg;
    int fd = dial();
    if (fd < 0) return NULL;
    uint8_t h[56] = {0};
    put_le(h, 0x3174306f6f627167ull, 8); /* the old magic */
    put_le(h + 8, the_id.tag, 8);
    put_le(h + 16, 2, 4);    /* nranks */
    put_le(h + 20, 1, 4);    /* rank */
    put_le(h + 24, 5000, 8); /* timeout */
    put_le(h + 32, 1, 4);    /* world rank 1 */
    put_le(h + 36, 2, 4);    /* world size 2 */
    put_le(h + 40, (uint64_t)getpid(), 4);
    (void)!send(fd, h, sizeof h, MSG_NOSIGNAL);
    uint8_t junk[256];
    read_for(fd, junk, sizeof junk, 8000);
    close(fd);
    return NULL;
}

/* A hello of the right form, MACed with a secret that is not the id's. */
static void *hostile_wrong_secret(void *arg) {
    (void)arg;
    int fd = dial();
    if (fd < 0) return NULL;
    uint8_t chal[GVQ_BOOT_CHALLENGE_BYTES], challenge[GVQ_BOOT_NONCE_BYTES];
    if (read_for(fd, chal, sizeof chal, 8000) == sizeof chal &&
        gvq_boot_challenge_parse(chal, sizeof chal, &the_id, challenge) == GVQ_BOOT_MSG_OK) {
        gvq_boot_id_t fake = the_id;
        (void)!getrandom(fake.secret, sizeof fake.secret, 0);
        gvq_boot_hello_t h;
        memset(&h, 0, sizeof h);
        h.nranks = 2;
        h.rank = 1;
        h.timeout_ms = 5000;
        h.info = (gvq_peer_info_t){1, 2, (int32_t)getpid(), 0, 0};
        uint8_t hello[GVQ_BOOT_HELLO_BYTES];
        gvq_boot_hello_encode(hello, &fake, challenge, &h);
        (void)!send(fd, hello, sizeof hello, MSG_NOSIGNAL);
        uint8_t junk[256];
        read_for(fd, junk, sizeof junk, 8000);
    }
    close(fd);
    return NULL;
}

static void *hostile_garbage(void *arg) {
    size_t n = (size_t)(uintptr_t)arg;
    int fd = dial();
    if (fd < 0) return NULL;
    uint8_t junk[256];
    (void)!getrandom(junk, n, 0);
    (void)!send(fd, junk, n, MSG_NOSIGNAL);
    if (n == GVQ_BOOT_HELLO_BYTES) read_for(fd, junk, sizeof junk, 8000);
    close(fd);
    return NULL;
}

/* Sends one byte a second for `arg` seconds. */
static void *slow_loris(void *arg) {
    int secs = (int)(uintptr_t)arg;
    int fd = dial();
    if (fd < 0) return NULL;
    for (int i = 0; i < secs; i++) {
        if (send(fd, "g", 1, MSG_NOSIGNAL) != 1) break;
        mt_sleep_ms(1000);
    }
    close(fd);
    return NULL;
}

static void share_id(gvqUniqueId *id) {
    memset(id, 0, sizeof *id);
    if (mt.rank == 0) MT_OK(gvqGetUniqueId(id));
    MPI_Bcast(id, (int)sizeof *id, MPI_BYTE, 0, MPI_COMM_WORLD);
    MT_CHECK(gvq_boot_id_decode(id, &the_id), "the broadcast id does not decode");
}

/* gvqCommInitRankConfig(rank, nranks) with TIMEOUT_MS; the result, its time in *el. */
static gvqResult_t init(gvqUniqueId id, int nranks, int rank, gvqComm_t *comm, double *el) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = TIMEOUT_MS;
    double t0 = mt_now();
    gvqResult_t res = gvqCommInitRankConfig(comm, nranks, id, rank, &cfg);
    *el = mt_now() - t0;
    return res;
}

/* The real ranks formed a working communicator in time. */
static void expect_formed(gvqResult_t res, gvqComm_t comm, double el, const char *what) {
    MT_CHECK(res == gvqSuccess && comm != NULL,
             "%s: gvqCommInitRankConfig returned %d (%s) after %.2f s: %s", what, (int)res,
             gvqGetErrorString(res), el, gvqGetLastError(NULL));
    MT_CHECK(el < TIMEOUT_MS / 1000.0, "%s: the communicator took %.2f s (timeout %d ms)", what, el,
             TIMEOUT_MS);
    if (res != gvqSuccess || comm == NULL) return;
    float x[4] = {1, 2, 3, (float)mt.rank}, y[4];
    MT_OK(gvqAllReduce(x, y, 4, gvqFloat32, gvqSum, comm, NULL));
    float want = (float)(mt.nranks * (mt.nranks - 1) / 2);
    MT_CHECK(y[0] == (float)mt.nranks && y[3] == want, "%s: allreduce gave %g,%g", what, y[0],
             y[3]);
    MT_OK(gvqCommDestroy(comm));
}

static void scenario_stranger(void) {
    gvqUniqueId id;
    share_id(&id);
    pthread_t th[4];
    int nth = 0;
    if (mt.rank == 1) {
        pthread_create(&th[nth++], NULL, hostile_old_hello, NULL);
        pthread_create(&th[nth++], NULL, hostile_wrong_secret, NULL);
        pthread_create(&th[nth++], NULL, hostile_garbage, (void *)(uintptr_t)GVQ_BOOT_HELLO_BYTES);
        pthread_create(&th[nth++], NULL, hostile_garbage, (void *)(uintptr_t)20);
        mt_sleep_ms(500); /* the strangers come first */
    }
    MPI_Barrier(MPI_COMM_WORLD);
    gvqComm_t comm = NULL;
    double el;
    gvqResult_t res = init(id, mt.nranks, mt.rank, &comm, &el);
    expect_formed(res, comm, el, "strangers without the secret");
    for (int i = 0; i < nth; i++)
        pthread_join(th[i], NULL);
}

static void scenario_slowloris(void) {
    gvqUniqueId id;
    share_id(&id);
    int silent[SILENT];
    pthread_t loris;
    if (mt.rank == 1) {
        for (int i = 0; i < SILENT; i++)
            silent[i] = dial();
        pthread_create(&loris, NULL, slow_loris, (void *)(uintptr_t)8);
        mt_sleep_ms(300);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    gvqComm_t comm = NULL;
    double el;
    gvqResult_t res = init(id, mt.nranks, mt.rank, &comm, &el);
    expect_formed(res, comm, el, "50 silent connections and a slow loris");
    if (mt.rank == 1) {
        for (int i = 0; i < SILENT; i++)
            if (silent[i] >= 0) close(silent[i]);
        pthread_join(loris, NULL);
    }
}

static void scenario_duplicate(void) {
    gvqUniqueId id;
    share_id(&id);
    int claim = mt.rank == 2 ? 1 : mt.rank; /* rank 2 never comes, rank 1 twice */
    if (mt.rank == 0) mt_sleep_ms(500);     /* the duplicate is seen before rank 0 comes */
    gvqComm_t sentinel = (gvqComm_t)(uintptr_t)0x1234, comm = sentinel;
    double el;
    gvqResult_t res = init(id, 3, claim, &comm, &el);
    const char *last = gvqGetLastError(NULL);
    MT_CHECK(res == gvqInvalidUsage,
             "process %d claiming rank %d: expected gvqInvalidUsage, got %d (%s) after %.2f s: %s",
             mt.rank, claim, (int)res, gvqGetErrorString(res), el, last);
    MT_CHECK(strstr(last, "claimed twice") != NULL, "the error does not name the claim: \"%s\"",
             last);
    MT_CHECK(el < TIMEOUT_MS / 2000.0,
             "the duplicate claim was refused after %.2f s (timeout %d ms)", el, TIMEOUT_MS);
    MT_CHECK(comm == sentinel, "the failed gvqCommInitRankConfig wrote *comm");
    if (mt.rank == 0)
        printf("  rank 0: %s after %.2f s: \"%s\"\n", gvqGetErrorString(res), el, last);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    const char *which = argc > 1 ? argv[1] : "stranger";
    mt_part(which, 60);
    if (strcmp(which, "stranger") == 0 && mt.nranks == 2)
        scenario_stranger();
    else if (strcmp(which, "slowloris") == 0 && mt.nranks == 2)
        scenario_slowloris();
    else if (strcmp(which, "duplicate") == 0 && mt.nranks == 3)
        scenario_duplicate();
    else
        MT_CHECK(0, "unknown scenario '%s' for %d ranks", which, mt.nranks);
    mt_part("finish", 60);
    MPI_Barrier(MPI_COMM_WORLD);
    return mt_finish("bootstrap_hostile");
}
