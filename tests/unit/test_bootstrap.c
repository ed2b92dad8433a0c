/*
 * test_bootstrap.c -- the bootstrap without MPI: ranks as threads calling
 * gvq_bootstrap_exchange against a root made by gvqGetUniqueId.
 *
 *   siphash     SipHash-2-4 against the paper's test vectors, one-shot and incremental
 *   wire        hello, challenge and reply round-trip; every flipped byte and every other
 *               length is refused; a wrong tag, a wrong secret, an out-of-range field too
 *   exchange    3 ranks form a table, each entry where its rank put it
 *   fake-root   a listener that knows the id's address and tag but not its secret answers
 *               "all joined" with a table: the rank must refuse it (the root is authenticated)
 *   expiry      200 ids nobody uses: their threads and sockets are gone after GVQ_TIMEOUT_MS
 *               (set to 1000 here), counted in /proc/self/task and /proc/self/fd
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gvq_bootstrap.h"
#include "gvq_test.h"

#define LIFE_MS 1000 /* GVQ_TIMEOUT_MS of this process */
#define UNUSED_IDS 200

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int count_dir(const char *path) {
    DIR *d = opendir(path);
    int n = 0;
    if (d == NULL) return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void test_siphash(void) {
    uint8_t key[16], msg[64];
    for (int i = 0; i < 16; i++)
        key[i] = (uint8_t)i;
    for (int i = 0; i < 64; i++)
        msg[i] = (uint8_t)i;
    /* the SipHash paper, appendix A, and the reference implementation's first vector */
    EXPECT(gvq_siphash(key, msg, 15) == 0xa129ca6149be45e5ull, "SipHash-2-4 of 00..0e: %016llx",
           (unsigned long long)gvq_siphash(key, msg, 15));
    EXPECT(gvq_siphash(key, msg, 0) == 0x726fdb47dd0e0e31ull, "SipHash-2-4 of nothing: %016llx",
           (unsigned long long)gvq_siphash(key, msg, 0));
    for (size_t n = 0; n <= 64; n++)
        for (size_t cut = 0; cut <= n; cut += 3) {
            gvq_siphash_t s;
            gvq_siphash_init(&s, key);
            gvq_siphash_update(&s, msg, cut);
            gvq_siphash_update(&s, msg + cut, n - cut);
            EXPECT(gvq_siphash_final(&s) == gvq_siphash(key, msg, n),
                   "incremental SipHash differs (n %zu, cut %zu)", n, cut);
        }
}

static gvq_boot_id_t test_id(void) {
    gvq_boot_id_t id;
    memset(&id, 0, sizeof id);
    id.magic = GVQ_BOOT_ID_MAGIC;
    id.tag = 0x1122334455667788ull;
    id.addr.sin_family = AF_INET;
    id.addr.sin_port = htons(1);
    for (int i = 0; i < GVQ_BOOT_SECRET_BYTES; i++)
        id.secret[i] = (uint8_t)(17 * i + 3);
    return id;
}

static void test_wire(void) {
    gvq_boot_id_t id = test_id(), other = id;
    other.secret[5] ^= 1;
    uint8_t ch[GVQ_BOOT_NONCE_BYTES], got_ch[GVQ_BOOT_NONCE_BYTES];
    for (int i = 0; i < GVQ_BOOT_NONCE_BYTES; i++)
        ch[i] = (uint8_t)(200 - i);

    uint8_t c[GVQ_BOOT_CHALLENGE_BYTES];
    gvq_boot_challenge_encode(c, &id, ch);
    EXPECT(gvq_boot_challenge_parse(c, sizeof c, &id, got_ch) == GVQ_BOOT_MSG_OK &&
               memcmp(ch, got_ch, sizeof ch) == 0,
           "challenge round trip");
    gvq_boot_id_t other_tag = id;
    other_tag.tag++;
    EXPECT(gvq_boot_challenge_parse(c, sizeof c, &other_tag, got_ch) == GVQ_BOOT_MSG_ID,
           "a challenge for another id is refused");

    gvq_boot_hello_t h = {3, 2, 1500, {7, 9, 1234, 0, 0xabcdefull}, {0}}, back;
    for (int i = 0; i < GVQ_BOOT_NONCE_BYTES; i++)
        h.nonce[i] = (uint8_t)i;
    uint8_t m[GVQ_BOOT_HELLO_BYTES];
    gvq_boot_hello_encode(m, &id, ch, &h);
    EXPECT(gvq_boot_hello_parse(m, sizeof m, &id, ch, &back) == GVQ_BOOT_MSG_OK &&
               back.nranks == 3 && back.rank == 2 && back.timeout_ms == 1500 &&
               back.info.world_rank == 7 && back.info.host_key == 0xabcdefull &&
               memcmp(back.nonce, h.nonce, sizeof h.nonce) == 0,
           "hello round trip");
    EXPECT(gvq_boot_hello_parse(m, sizeof m, &other, ch, &back) == GVQ_BOOT_MSG_MAC,
           "a hello MACed with another secret is refused");
    uint8_t ch2[GVQ_BOOT_NONCE_BYTES];
    memcpy(ch2, ch, sizeof ch);
    ch2[0] ^= 1;
    EXPECT(gvq_boot_hello_parse(m, sizeof m, &id, ch2, &back) == GVQ_BOOT_MSG_MAC,
           "a hello answering another challenge (a replay) is refused");
    for (size_t i = 0; i < sizeof m; i++)
        for (int bit = 0; bit < 8; bit += 3) {
            m[i] ^= (uint8_t)(1u << bit);
            EXPECT(gvq_boot_hello_parse(m, sizeof m, &id, ch, &back) != GVQ_BOOT_MSG_OK,
                   "a hello with byte %zu bit %d flipped is accepted", i, bit);
            m[i] ^= (uint8_t)(1u << bit);
        }
    for (size_t len = 0; len < sizeof m; len++)
        EXPECT(gvq_boot_hello_parse(m, len, &id, ch, &back) == GVQ_BOOT_MSG_SIZE,
               "a hello of %zu bytes is not refused for its size", len);
    gvq_boot_hello_t bad = h;
    bad.rank = 3; /* outside [0, nranks) */
    gvq_boot_hello_encode(m, &id, ch, &bad);
    EXPECT(gvq_boot_hello_parse(m, sizeof m, &id, ch, &back) == GVQ_BOOT_MSG_FIELD,
           "an authentic hello with rank 3 of 3 is refused");

    /* a reply with a table of 3, for rank 2 */
    gvq_peer_info_t table[3] = {{0, 3, 10, 0, 1}, {1, 3, 11, 0, 1}, {2, 3, 12, 0, 2}}, out[3];
    size_t n = gvq_boot_reply_bytes(GVQ_BOOT_OK, 3);
    uint8_t *r = malloc(n);
    gvq_boot_reply_t rep = {GVQ_BOOT_OK, 3, 0, 2}, rback;
    gvq_boot_reply_head_encode(r, &rep);
    gvq_boot_table_encode(r + GVQ_BOOT_REPLY_HEAD_BYTES, table, 3);
    uint64_t mac = gvq_boot_reply_mac(
        &id, ch, h.nonce, r,
        gvq_boot_table_digest(&id, r + GVQ_BOOT_REPLY_HEAD_BYTES, 3 * GVQ_BOOT_PEER_BYTES));
    for (int i = 0; i < 8; i++)
        r[n - 8 + (size_t)i] = (uint8_t)(mac >> (8 * i));
    EXPECT(gvq_boot_reply_parse(r, n, &id, ch, h.nonce, 3, 2, &rback, out) == GVQ_BOOT_MSG_OK &&
               out[2].pid == 12 && out[1].world_rank == 1,
           "reply round trip");
    EXPECT(gvq_boot_reply_parse(r, n, &id, ch, h.nonce, 3, 1, &rback, out) == GVQ_BOOT_MSG_FIELD,
           "a reply for another rank is refused");
    EXPECT(gvq_boot_reply_parse(r, n, &id, ch, ch2, 3, 2, &rback, out) == GVQ_BOOT_MSG_MAC,
           "a reply answering another nonce (a replay) is refused");
    for (size_t i = 0; i < n; i++) {
        r[i] ^= 0x10;
        EXPECT(gvq_boot_reply_parse(r, n, &id, ch, h.nonce, 3, 2, &rback, out) != GVQ_BOOT_MSG_OK,
               "a reply with byte %zu altered is accepted", i);
        r[i] ^= 0x10;
    }
    for (size_t len = 0; len < n + 30; len++)
        if (len != n)
            EXPECT(gvq_boot_reply_parse(r, len, &id, ch, h.nonce, 3, 2, &rback, out) ==
                       GVQ_BOOT_MSG_SIZE,
                   "a reply of %zu bytes is not refused for its size", len);
    free(r);
}

typedef struct {
    gvqUniqueId id;
    int nranks, rank;
    gvqResult_t res;
    gvq_peer_info_t all[8];
    uint8_t *blobs;
} rank_job_t;

/* Rank r's blob: none for rank 0, GVQ_BOOT_MAX_BLOB bytes for rank 1, 7 + 300 r otherwise; byte i
 * is (r * 31 + i) & 255. */
static int blob_len(int r) {
    return r == 0 ? 0 : r == 1 ? GVQ_BOOT_MAX_BLOB : 7 + 300 * r;
}

static void *rank_main(void *arg) {
    rank_job_t *j = arg;
    gvq_peer_info_t mine = {j->rank, j->nranks, 100 + j->rank, blob_len(j->rank), 42};
    uint8_t *blob = malloc(GVQ_BOOT_MAX_BLOB);
    for (int i = 0; i < GVQ_BOOT_MAX_BLOB; i++)
        blob[i] = (uint8_t)(j->rank * 31 + i);
    uint64_t tag = 0;
    j->res = gvq_bootstrap_exchange(&j->id, j->nranks, j->rank, &mine, 5000000000ull, blob, j->all,
                                    &j->blobs, &tag);
    free(blob);
    return NULL;
}

static void test_exchange(void) {
    gvqUniqueId id;
    EXPECT(gvqGetUniqueId(&id) == gvqSuccess, "gvqGetUniqueId: %s", gvqGetLastError(NULL));
    rank_job_t j[3];
    pthread_t th[3];
    for (int r = 0; r < 3; r++) {
        memset(&j[r], 0, sizeof j[r]);
        j[r].id = id;
        j[r].nranks = 3;
        j[r].rank = r;
        pthread_create(&th[r], NULL, rank_main, &j[r]);
    }
    for (int r = 0; r < 3; r++) {
        pthread_join(th[r], NULL);
        EXPECT(j[r].res == gvqSuccess, "rank %d: %s", r, gvqGetErrorString(j[r].res));
        size_t at = 0;
        for (int p = 0; p < 3 && j[r].res == gvqSuccess; p++) {
            EXPECT(j[r].all[p].pid == 100 + p && j[r].all[p].world_rank == p &&
                       j[r].all[p].blob_bytes == blob_len(p),
                   "rank %d's table entry %d: pid %d, blob %d bytes", r, p, j[r].all[p].pid,
                   j[r].all[p].blob_bytes);
            int bad = 0;
            for (int i = 0; i < blob_len(p) && j[r].blobs != NULL; i++)
                bad += j[r].blobs[at + (size_t)i] != (uint8_t)(p * 31 + i);
            EXPECT(j[r].blobs != NULL && bad == 0, "rank %d: rank %d's blob has %d wrong bytes", r,
                   p, bad);
            at += (size_t)blob_len(p);
        }
        free(j[r].blobs);
    }
}

/* The blob message: authentic round trip; a flipped bit, another challenge or a length other
 * than the hello's are refused. */
static void test_blob_wire(void) {
    gvq_boot_id_t id = test_id();
    uint8_t ch[GVQ_BOOT_NONCE_BYTES] = {9, 8, 7}, ch2[GVQ_BOOT_NONCE_BYTES] = {9, 8, 6};
    uint8_t blob[100], msg[100 + GVQ_BOOT_MAC_BYTES];
    for (int i = 0; i < 100; i++)
        blob[i] = (uint8_t)(i * 7);
    gvq_boot_blob_encode(msg, &id, ch, blob, sizeof blob);
    EXPECT(gvq_boot_blob_parse(msg, sizeof msg, 100, &id, ch) == GVQ_BOOT_MSG_OK,
           "an authentic blob is refused");
    EXPECT(gvq_boot_blob_parse(msg, sizeof msg, 100, &id, ch2) == GVQ_BOOT_MSG_MAC,
           "a blob made for another challenge is accepted");
    EXPECT(gvq_boot_blob_parse(msg, sizeof msg - 1, 100, &id, ch) == GVQ_BOOT_MSG_SIZE,
           "a short blob is accepted");
    EXPECT(gvq_boot_blob_parse(msg, sizeof msg, GVQ_BOOT_MAX_BLOB + 1, &id, ch) ==
               GVQ_BOOT_MSG_SIZE,
           "a blob over the limit is accepted");
    for (size_t i = 0; i < sizeof msg; i += 13) {
        msg[i] ^= 0x10;
        EXPECT(gvq_boot_blob_parse(msg, sizeof msg, 100, &id, ch) == GVQ_BOOT_MSG_MAC,
               "a blob with byte %zu flipped is accepted", i);
        msg[i] ^= 0x10;
    }
}

/* A root that knows the address and tag, not the secret. */
typedef struct {
    int listen_fd;
    gvq_boot_id_t id;
} fake_root_t;

static void *fake_root(void *arg) {
    fake_root_t *f = arg;
    int fd = accept(f->listen_fd, NULL, NULL);
    if (fd < 0) return NULL;
    uint8_t ch[GVQ_BOOT_NONCE_BYTES] = {1, 2, 3}, msg[GVQ_BOOT_CHALLENGE_BYTES];
    gvq_boot_challenge_encode(msg, &f->id, ch);
    (void)!send(fd, msg, sizeof msg, MSG_NOSIGNAL);
    uint8_t hello[GVQ_BOOT_HELLO_BYTES];
    size_t got = 0;
    while (got < sizeof hello) {
        ssize_t k = recv(fd, hello + got, sizeof hello - got, 0);
        if (k <= 0) break;
        got += (size_t)k;
    }
    /* "everyone joined", with a table of its choosing and a MAC it had to guess */
    uint8_t r[GVQ_BOOT_REPLY_HEAD_BYTES + GVQ_BOOT_PEER_BYTES + GVQ_BOOT_MAC_BYTES] = {0};
    gvq_boot_reply_t rep = {GVQ_BOOT_OK, 1, 0, 0};
    gvq_peer_info_t t = {0, 1, 666, 0, 0};
    gvq_boot_reply_head_encode(r, &rep);
    gvq_boot_table_encode(r + GVQ_BOOT_REPLY_HEAD_BYTES, &t, 1);
    (void)!send(fd, r, sizeof r, MSG_NOSIGNAL);
    usleep(200000);
    close(fd);
    return NULL;
}

static void test_fake_root(void) {
    gvqUniqueId real;
    EXPECT(gvqGetUniqueId(&real) == gvqSuccess, "gvqGetUniqueId");
    fake_root_t f;
    EXPECT(gvq_boot_id_decode(&real, &f.id), "decode the id");
    f.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = f.id.addr;
    sa.sin_port = 0;
    socklen_t len = sizeof sa;
    EXPECT(bind(f.listen_fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
               listen(f.listen_fd, 4) == 0 &&
               getsockname(f.listen_fd, (struct sockaddr *)&sa, &len) == 0,
           "fake root listens");
    gvq_boot_id_t hijacked = f.id; /* the real id's secret and tag, the fake root's address */
    hijacked.addr = sa;
    gvqUniqueId id;
    gvq_boot_id_encode(&id, &hijacked);
    pthread_t th;
    pthread_create(&th, NULL, fake_root, &f);
    gvq_peer_info_t mine = {0, 1, getpid(), 0, 1}, all[1] = {{0, 0, 0, 0, 0}};
    double t0 = now_s();
    gvqResult_t res =
        gvq_bootstrap_exchange(&id, 1, 0, &mine, 3000000000ull, NULL, all, NULL, NULL);
    EXPECT(res == gvqRemoteError, "a forged answer: expected gvqRemoteError, got %s (pid %d)",
           gvqGetErrorString(res), all[0].pid);
    EXPECT(strstr(gvqGetLastError(NULL), "authentication") != NULL,
           "the WARN does not say the answer failed authentication: \"%s\"", gvqGetLastError(NULL));
    EXPECT(now_s() - t0 < 3.0, "the forged answer took %.2f s to refuse", now_s() - t0);
    pthread_join(th, NULL);
    close(f.listen_fd);
}

static void test_expiry(void) {
    usleep((LIFE_MS + 1500) * 1000); /* the ids made above are gone */
    int tasks0 = count_dir("/proc/self/task"), fds0 = count_dir("/proc/self/fd");
    for (int i = 0; i < UNUSED_IDS; i++) {
        gvqUniqueId id;
        if (gvqGetUniqueId(&id) != gvqSuccess) {
            EXPECT(0, "gvqGetUniqueId %d: %s", i, gvqGetLastError(NULL));
            break;
        }
    }
    int tasks1 = count_dir("/proc/self/task");
    printf("  %d unused ids: %d threads (from %d)", UNUSED_IDS, tasks1, tasks0);
    double t0 = now_s();
    int tasks = tasks1, fds = 0;
    while (now_s() - t0 < LIFE_MS / 1000.0 + 10.0) {
        tasks = count_dir("/proc/self/task");
        fds = count_dir("/proc/self/fd");
        if (tasks <= tasks0 && fds <= fds0) break;
        usleep(50000);
    }
    printf(", %d threads and %d fds (from %d) %.2f s later\n", tasks, fds, fds0, now_s() - t0);
    EXPECT(tasks <= tasks0, "%d unused ids left %d threads behind past their timeout (%d ms)",
           UNUSED_IDS, tasks - tasks0, LIFE_MS);
    EXPECT(fds <= fds0, "%d unused ids left %d sockets open past their timeout", UNUSED_IDS,
           fds - fds0);
}

int main(void) {
    char life[16];
    snprintf(life, sizeof life, "%d", LIFE_MS);
    setenv("GVQ_TIMEOUT_MS", life, 1); /* before the first gvq call reads it */
    test_siphash();
    test_wire();
    test_exchange();
    test_blob_wire();
    test_fake_root();
    test_expiry();
    printf("test_bootstrap: %s (%d failure(s))\n", gvq_test_failures ? "FAIL" : "PASS",
           gvq_test_failures);
    return gvq_test_failures ? 1 : 0;
}
