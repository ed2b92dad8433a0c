/*
 * init_rank.c -- gvqCommInitRank: a communicator from the bootstrap id, over the transport
 * GVQ_TRANSPORT picks (MPI, or UCX without MPI). The bootstrap (bootstrap*.c) gives every rank
 * the others' pid, host key, MPI world rank or UCX worker address; the transport is made from
 * them; the host keys decide whether every rank is on one host (shared memory, shm_setup.c).
 */
#include <stdlib.h>
#include <unistd.h>

#include "gvq_comm.h"

/* GVQ_TRANSPORT: *ucx = 1 for UCX, 0 for MPI (auto: MPI inside an MPI job, else UCX if built). */
static gvqResult_t choose_transport(int *ucx) {
    int64_t want = gvq_param(GVQ_PARAM_TRANSPORT); /* auto, mpi, ucx */
    if (want == 2 && !gvq_ucx_available()) {
        GVQ_WARN("GVQ_TRANSPORT=ucx: this gvq was built without UCX (install libucx-dev and "
                 "rebuild)");
        return gvqInvalidUsage;
    }
    *ucx = want == 2 || (want == 0 && gvq_ucx_available() && !gvq_mpi_in_job());
    GVQ_INFO("gvqCommInitRank: transport %s", *ucx ? "ucx" : "mpi");
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCommInitRankConfig(gvqComm_t *comm, int nranks, gvqUniqueId commId, int rank,
                                          gvqConfig_t *config) {
    if (comm == NULL) {
        GVQ_WARN("gvqCommInitRank: comm is NULL");
        return gvqInvalidArgument;
    }
    if (nranks < 1) {
        GVQ_WARN("gvqCommInitRank: nranks=%d must be at least 1", nranks);
        return gvqInvalidArgument;
    }
    if (rank < 0 || rank >= nranks) {
        GVQ_WARN("gvqCommInitRank: rank=%d is outside [0, %d)", rank, nranks);
        return gvqInvalidArgument;
    }
    if (!gvq_bootstrap_id_valid(&commId)) {
        GVQ_WARN("gvqCommInitRank: commId was not made by gvqGetUniqueId (or was not broadcast "
                 "intact)");
        return gvqInvalidArgument;
    }
    gvq_log_set_rank(rank);
    int64_t timeout_ms;
    size_t chunk;
    GVQCHECK(gvq_config_resolve(config, "gvqCommInitRank", &timeout_ms, &chunk));
    int ucx = 0;
    GVQCHECK(choose_transport(&ucx));
    int wrank = rank, wsize = nranks;
    gvq_ucx_t *u = NULL;
    const void *addr = NULL;
    size_t addr_len = 0;
    if (ucx) {
        GVQCHECK(gvq_ucx_open(&u, &addr, &addr_len));
        if (addr_len > GVQ_BOOT_MAX_BLOB) {
            GVQ_WARN("gvqCommInitRank: this rank's UCX address has %zu bytes, more than the %d "
                     "the bootstrap carries (narrow UCX_TLS or UCX_NET_DEVICES)",
                     addr_len, GVQ_BOOT_MAX_BLOB);
            gvq_ucx_close(u);
            return gvqSystemError;
        }
    } else {
        GVQCHECK(gvq_mpi_ensure_init(&wrank, &wsize));
    }

    gvq_peer_info_t mine = {wrank, wsize, (int32_t)getpid(), (int32_t)addr_len, gvq_host_key()};
    gvq_peer_info_t *all = calloc((size_t)nranks, sizeof *all);
    int *wranks = calloc((size_t)nranks, sizeof *wranks);
    int32_t *lens = calloc((size_t)nranks, sizeof *lens);
    char *seen = calloc((size_t)wsize, 1);
    uint8_t *blobs = NULL;
    gvqResult_t res = gvqSuccess;
    uint64_t nonce = 0;
    if (all == NULL || wranks == NULL || seen == NULL || lens == NULL) {
        res = gvqSystemError;
        goto out_free;
    }
    GVQCHECKGOTO(gvq_bootstrap_exchange(&commId, nranks, rank, &mine,
                                        (uint64_t)timeout_ms * 1000000ull, addr, all, &blobs,
                                        &nonce),
                 res, out_free);
    gvq_transport_t *t = NULL;
    if (ucx) {
        for (int r = 0; r < nranks; r++)
            lens[r] = all[r].blob_bytes;
        GVQCHECKGOTO(gvq_ucx_transport_create(u, blobs, lens, nranks, rank, &t), res, out_free);
        u = NULL; /* the transport's now */
        t->timeout_ns = (uint64_t)timeout_ms * 1000000ull;
    } else {
        for (int r = 0; r < nranks; r++) {
            if (all[r].blob_bytes != 0 || all[r].world_size != wsize || all[r].world_rank < 0 ||
                all[r].world_rank >= wsize || seen[all[r].world_rank]) {
                GVQ_WARN("gvqCommInitRank: rank %d (pid %d, MPI world rank %d of %d) is not a "
                         "distinct process of this MPI job (world size %d)%s; launch every rank "
                         "with one mpirun, or set GVQ_TRANSPORT alike on every rank",
                         r, all[r].pid, all[r].world_rank, all[r].world_size, wsize,
                         all[r].blob_bytes != 0 ? " (its transport is UCX)" : "");
                res = gvqInvalidUsage;
                goto out_free;
            }
            seen[all[r].world_rank] = 1;
            wranks[r] = all[r].world_rank;
        }
        GVQCHECKGOTO(gvq_mpi_transport_from_world_timed(wranks, nranks, rank, (int)(nonce % 32768u),
                                                        (uint64_t)timeout_ms * 1000000ull, &t),
                     res, out_free);
    }
    GVQCHECKGOTO(gvq_comm_create(t, config, "gvqCommInitRank", comm), res, out_free);
    uint64_t *keys = calloc((size_t)nranks, sizeof *keys);
    if (keys != NULL) { /* without them, gvq_comm_hosts exchanges the keys on first use */
        for (int r = 0; r < nranks; r++)
            keys[r] = all[r].host_key;
        (*comm)->host_keys = keys;
        int nhosts = 0, leader = 0;
        if (gvq_comm_hosts(*comm, &nhosts, &leader, NULL) == gvqSuccess) /* no transfer: known */
            (*comm)->xport->one_host = nhosts == 1;
    }
    res = gvq_comm_shm_at_init(*comm);
    if (res == gvqSuccess) res = gvq_comm_hier_local(*comm);
    if (res == gvqSuccess) res = gvq_comm_ucx_spare(*comm);
    if (res != gvqSuccess) {
        (void)gvqCommDestroy(*comm);
        *comm = NULL;
    }
out_free:
    gvq_ucx_close(u);
    free(all);
    free(wranks);
    free(lens);
    free(seen);
    free(blobs);
    return res;
}

GVQ_API gvqResult_t gvqCommInitRank(gvqComm_t *comm, int nranks, gvqUniqueId commId, int rank) {
    return gvqCommInitRankConfig(comm, nranks, commId, rank, NULL);
}
