/*
 * shm.c -- the shared memory of a communicator whose ranks share one host (gvq_comm.h), for the
 * call agreement and the plain collectives of src/algorithms/shm_collectives.c, and for
 * gvqSend/gvqRecv through the channels' transport (src/transport/shm_chan.c).
 *
 *   when:  at creation for gvqCommInitRank and gvqCommInitMPI (gvq_comm_shm_at_init: every
 *          rank a process of its own, all in the call at once), with the channels up to 8
 *          ranks unless a rank sets GVQ_SHM_P2P=0 (agreed first); at the first collective for the
 * in-process transport, without channels (its ranks are created one after another by one thread;
 * and a gvqSend before the first collective and its gvqRecv after it must take the same path)
 *
 *   rank 0 creates a POSIX shared memory object (a fresh name, mode 0600; without the channels
 *          if there is no room for them)
 *   -> chain broadcast of (ok, channels, name) -> every other rank opens and maps it
 *   -> agree: min(ok) -> rank 0 unlinks the name (nobody can open it after)
 *   -> all ok: every rank uses it; else none does (messages only)
 *
 * The agreement makes the choice the same on every rank; a rank with GVQ_SHM=0 takes part with
 * ok = 0. The memory is nranks x 2 slots of GVQ_SHM_HEADER + gvq_shm_slot_data (about 2 MiB a
 * rank up to 8 ranks, 130 KiB beyond), then the channels (about 8 MiB at 4 and at 8 ranks;
 * pages are backed only where a pair of ranks exchanges messages). It is made only while its file
 * system has twice that room left, since a write to a page tmpfs cannot back fails with SIGBUS,
 * and mapped until the communicator is freed (comm.c unmaps it).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "gvq_comm.h"

enum { SHM_MAX_RANKS = 64, SHM_NAME = 64, CHANNELS_MAX_RANKS = 8 };

/* The collectives' slots, then (channels) the point-to-point channels. */
static size_t slots_bytes(int nranks) {
    return (size_t)nranks * 2 * ((size_t)GVQ_SHM_HEADER + gvq_shm_slot_data(nranks));
}

static size_t shm_bytes_for(int nranks, int channels) {
    return slots_bytes(nranks) + (channels ? gvq_chan_bytes(nranks) : 0);
}

static void *map_fd(int fd, size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/* Rank 0: a new object of `bytes` (zeroed), its name in name. */
static void *shm_make(char *name, size_t bytes) {
    static unsigned long long serial;
    unsigned long long n = __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED);
    snprintf(name, SHM_NAME, "/gvq-%ld-%llu-%llx", (long)getpid(), n,
             (unsigned long long)gvq_now_ns());
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        GVQ_INFO("shm: cannot create %s (%s); collectives use messages only", name,
                 strerror(errno));
        return NULL;
    }
    /* tmpfs backs pages only when they are written: a segment larger than the room left would
     * fail a later write with SIGBUS. Too little room: messages only (as Open MPI checks its own
     * segments; reserving every page up front costs a zeroing pass per communicator). */
    struct statvfs vs;
    if (fstatvfs(fd, &vs) != 0 || (double)vs.f_bavail * (double)vs.f_frsize < 2.0 * (double)bytes ||
        ftruncate(fd, (off_t)bytes) != 0) {
        GVQ_INFO("shm: no room for %zu bytes in %s's file system (%s); collectives use messages "
                 "only",
                 bytes, name, strerror(errno));
        close(fd);
        shm_unlink(name);
        return NULL;
    }
    void *p = map_fd(fd, bytes);
    if (p == NULL) shm_unlink(name);
    return p;
}

static void *shm_join(const char *name, size_t bytes) {
    int fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0) {
        GVQ_INFO("shm: cannot open %s (%s); collectives use messages only", name, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != bytes) {
        close(fd);
        return NULL;
    }
    return map_fd(fd, bytes);
}

gvqResult_t gvq_comm_shm(gvqComm_t c, gvq_shm_t **out) {
    *out = NULL;
    if (c->shm_state == 1) *out = &c->shm;
    if (c->shm_state != 0) return gvqSuccess;
    c->shm_state = -1;
    if (!c->xport->one_host || c->xport->fifo || c->nranks < 2 || c->nranks > SHM_MAX_RANKS)
        return gvqSuccess; /* the same on every rank: nothing to agree on */
    struct {
        int32_t ok, channels;
        char name[SHM_NAME];
    } msg;
    memset(&msg, 0, sizeof msg);
    int want = gvq_param(GVQ_PARAM_SHM) != 0;
    void *base = NULL;
    gvq_coll_ctx_t ctx = gvq_comm_ctx(c, NULL);
    int32_t chan_ok = 0; /* channels only if every rank asks for them (GVQ_SHM_P2P) */
    if (c->shm_channels && c->nranks <= CHANNELS_MAX_RANKS) {
        chan_ok = want && gvq_param(GVQ_PARAM_SHM_P2P) != 0;
        GVQCHECK(gvq_agree_i32(&ctx, &chan_ok, 1, gvqMin));
    }
    msg.channels = chan_ok;
    if (c->rank == 0 && want) { /* without the channels if there is no room for them */
        base = shm_make(msg.name, shm_bytes_for(c->nranks, msg.channels));
        if (base == NULL && msg.channels)
            base = shm_make(msg.name, shm_bytes_for(c->nranks, msg.channels = 0));
        msg.ok = base != NULL;
    }
    gvqResult_t res = gvq_chain_broadcast(&ctx, &msg, &msg, sizeof msg, 0);
    msg.name[SHM_NAME - 1] = '\0';
    int channels = msg.channels != 0;
    size_t bytes = shm_bytes_for(c->nranks, channels);
    int32_t ok = res == gvqSuccess && msg.ok && want;
    if (ok && c->rank != 0) ok = (base = shm_join(msg.name, bytes)) != NULL;
    gvq_transport_t *chan = NULL;
    if (ok && channels)
        ok = (chan = gvq_chan_transport((char *)base + slots_bytes(c->nranks), c->xport)) != NULL;
    if (ok &&
        base != NULL) { /* before the agreement below: every rank's pid is there once it is over */
        gvq_shm_t mine = {.base = base,
                          .slot_data = gvq_shm_slot_data(c->nranks),
                          .nranks = c->nranks,
                          .rank = c->rank};
        gvq_shm_announce(&mine);
    }
    if (res == gvqSuccess) res = gvq_agree_i32(&ctx, &ok, 1, gvqMin);
    if (c->rank == 0 && base != NULL) shm_unlink(msg.name); /* every rank has opened it */
    if (res != gvqSuccess || !ok) {
        if (chan != NULL) chan->ops->destroy(chan);
        if (base != NULL) munmap(base, bytes);
        return res;
    }
    if (chan != NULL) c->p2p = chan; /* gvqSend/gvqRecv through the channels from now on */
    c->shm = (gvq_shm_t){.base = base,
                         .slot_data = gvq_shm_slot_data(c->nranks),
                         .nranks = c->nranks,
                         .rank = c->rank,
                         .calls = 0};
    c->shm_bytes = bytes;
    c->shm_state = 1;
    *out = &c->shm;
    GVQ_INFO("comm %p rank %d: call agreements and plain collectives through shared memory "
             "(%zu bytes, pieces of %zu bytes)%s",
             (void *)c, c->rank, bytes, c->shm.slot_data,
             chan != NULL ? "; gvqSend/gvqRecv too" : "");
    return gvqSuccess;
}

gvqResult_t gvq_comm_shm_at_init(gvqComm_t c) {
    gvq_shm_t *shm = NULL;
    c->shm_channels = 1;
    gvqResult_t res = gvq_comm_shm(c, &shm);
    if (res != gvqSuccess)
        GVQ_WARN("comm %p rank %d: setting up shared memory failed (%s)", (void *)c, c->rank,
                 gvqGetErrorString(res));
    return res;
}
