/*
 * split.c -- gvqCommSplit: new communicators from the ranks of one, NCCL's way (color, key,
 * GVQ_SPLIT_NOCOLOR); a duplicate is a split with one color.
 *
 * Every rank of the parent takes part. The parent allgathers each rank's (color, key), so a
 * rank that does not call gvqCommSplit fails the others at the call agreement, not in a
 * transport of its own. Each color's members, ordered by key and then by parent rank, get a
 * transport of their own:
 * - MPI: MPI_Comm_create_group over the parent's MPI communicator, collective over the members
 *   only and bounded by the timeout (gvq_mpi_transport_subset);
 * - UCX: a new worker per member; the parent allgathers the workers' addresses (NOCOLOR ranks
 *   send none), and each member makes endpoints to its color's addresses.
 * The child shares nothing with its parent but the host keys it copies: either can be destroyed
 * or aborted first, and what the layers above keep per communicator (zero-code compressors,
 * compressors, parameter servers) starts empty on the child.
 */
#include <stdlib.h>
#include <string.h>

#include "gvq_comm.h"

/* The parent's rank p's color and key, from the gathered pairs. */
typedef struct {
    int32_t magic, color, key; /* magic: SPLIT_MAGIC, so that a rank making another call of the
                                * same shape is seen by every rank */
} split_pair_t;
#define SPLIT_MAGIC 0x74696c73 /* "slit" */

/* The members of color: parent ranks sorted by (key, parent rank); *me = this rank's index. */
static int members_of(const split_pair_t *all, int n, int32_t color, int self, int *ranks,
                      int *me) {
    int m = 0;
    for (int p = 0; p < n; p++)
        if (all[p].color == color) ranks[m++] = p;
    for (int i = 1; i < m; i++) { /* insertion sort: stable, so ties keep the parent's order */
        int r = ranks[i], j = i;
        while (j > 0 && all[ranks[j - 1]].key > all[r].key) {
            ranks[j] = ranks[j - 1];
            j--;
        }
        ranks[j] = r;
    }
    for (int i = 0; i < m; i++)
        if (ranks[i] == self) *me = i;
    return m;
}

/* Every rank's blob of bytes through comm: lengths first (-1: that rank failed before; every
 * rank still takes part), then the blobs padded to the longest. *lens (n) and *all (n x *max,
 * rank p's at p x *max) are the caller's to free. gvqRemoteError when any rank had failed. */
static gvqResult_t gather_blobs(gvqComm_t comm, const void *mine, int32_t len, int32_t **lens,
                                uint8_t **all, size_t *max) {
    int n = comm->nranks;
    *all = NULL;
    *max = 0;
    *lens = calloc((size_t)n, 4);
    if (*lens == NULL) { /* the others' exchange then times out */
        GVQ_WARN("out of memory for %d ranks' address lengths", n);
        return gvqSystemError;
    }
    gvqResult_t rg = gvqAllGather(&len, *lens, 1, gvqInt32, comm, NULL);
    int failed = rg != gvqSuccess;
    for (int p = 0; rg == gvqSuccess && p < n; p++) {
        failed |= (*lens)[p] < 0;
        if ((*lens)[p] > 0 && (size_t)(*lens)[p] > *max) *max = (size_t)(*lens)[p];
    }
    if (failed || *max == 0) return rg != gvqSuccess ? rg : failed ? gvqRemoteError : gvqSuccess;
    *all = malloc(*max * (size_t)n);
    uint8_t *pad = calloc(*max, 1);
    if (pad != NULL && len > 0) memcpy(pad, mine, (size_t)len);
    /* from a zero pad, or nothing (then the others time out), if memory ran out */
    rg = *all != NULL && pad != NULL ? gvqAllGather(pad, *all, *max, gvqUint8, comm, NULL)
                                     : gvqSystemError;
    free(pad);
    return rg;
}

/* UCX: the members' worker addresses through the parent, then this rank's transport. */
static gvqResult_t ucx_child(gvqComm_t comm, int color_member, const int *ranks, int m, int me,
                             gvq_transport_t **t) {
    gvq_ucx_t *u = NULL;
    const void *addr = NULL;
    size_t len = 0;
    gvqResult_t res = gvqSuccess;
    if (color_member) res = gvq_ucx_open(&u, &addr, &len);
    if (res == gvqSuccess && len > GVQ_BOOT_MAX_BLOB) {
        GVQ_WARN("gvqCommSplit: this rank's UCX address has %zu bytes (at most %d)", len,
                 GVQ_BOOT_MAX_BLOB);
        res = gvqSystemError;
    }
    int32_t *lens = NULL, *mlens = calloc((size_t)m > 0 ? (size_t)m : 1, 4);
    uint8_t *all = NULL, *packed = NULL;
    size_t max = 0;
    gvqResult_t rg =
        gather_blobs(comm, addr, res == gvqSuccess ? (int32_t)len : -1, &lens, &all, &max);
    if (res == gvqSuccess && rg != gvqSuccess) {
        GVQ_WARN("gvqCommSplit: a rank could not open its UCX worker, or the exchange of the "
                 "addresses failed; no communicator made");
        res = rg;
    }
    if (res == gvqSuccess && color_member) {
        packed = malloc(max * (size_t)(m > 0 ? m : 1));
        res = packed != NULL && mlens != NULL ? gvqSuccess : gvqSystemError;
        size_t at = 0;
        for (int i = 0; res == gvqSuccess && i < m; i++) {
            mlens[i] = lens[ranks[i]];
            memcpy(packed + at, all + (size_t)ranks[i] * max, (size_t)mlens[i]);
            at += (size_t)mlens[i];
        }
        if (res == gvqSuccess) res = gvq_ucx_transport_create(u, packed, mlens, m, me, t);
        if (res == gvqSuccess) u = NULL;
    }
    gvq_ucx_close(u);
    free(lens);
    free(mlens);
    free(all);
    free(packed);
    return res;
}

gvqResult_t gvq_comm_ucx_spare(gvqComm_t c) {
    if (strcmp(c->xport->ops->name, "ucx") != 0 || !gvq_param(GVQ_PARAM_UCX_SPARE))
        return gvqSuccess; /* the same on every rank: the transport, the setting */
    const void *addr = NULL;
    size_t len = 0;
    gvqResult_t res = gvq_ucx_spare_open(c->xport, &addr, &len);
    int32_t *lens = NULL, mine = res == gvqSuccess ? (int32_t)len : -1;
    uint8_t *all = NULL;
    size_t max = 0;
    gvqResult_t rg = gather_blobs(c, addr, mine, &lens, &all, &max);
    if (res == gvqSuccess) res = rg;
    for (int p = 0, at = 0; res == gvqSuccess && p < c->nranks; at += lens[p], p++)
        memmove(all + at, all + (size_t)p * max, (size_t)lens[p]); /* packed, in rank order */
    if (res == gvqSuccess) res = gvq_ucx_spare_peers(c->xport, all, lens);
    if (res != gvqSuccess)
        GVQ_WARN("comm %p rank %d: the spare UCX workers (gvqCommShrink's) could not be set up: %s",
                 (void *)c, c->rank, gvqGetErrorString(res));
    free(lens);
    free(all);
    return res;
}

gvqResult_t gvq_comm_child_finish(gvqComm_t parent, const int *ranks, int m, gvqComm_t child,
                                  int spare) {
    uint64_t *keys = calloc((size_t)m, sizeof *keys);
    if (keys != NULL && parent->host_keys != NULL) {
        for (int i = 0; i < m; i++)
            keys[i] = parent->host_keys[ranks[i]];
        child->host_keys = keys;
        keys = NULL;
        int nhosts = 0, lead = 0;
        if (gvq_comm_hosts(child, &nhosts, &lead, NULL) == gvqSuccess)
            child->xport->one_host = nhosts == 1;
    }
    free(keys);
    gvqResult_t res = gvq_comm_shm_at_init(child);
    if (res == gvqSuccess && spare) res = gvq_comm_ucx_spare(child);
    return res;
}

static gvqResult_t split(gvqComm_t comm, int color, int key, gvqComm_t *newcomm,
                         gvqConfig_t *config, int spare) {
    if (newcomm != NULL) *newcomm = NULL;
    GVQCHECK(gvq_comm_check(comm, "gvqCommSplit", 1));
    if (newcomm == NULL || (color < 0 && color != GVQ_SPLIT_NOCOLOR)) {
        GVQ_WARN("gvqCommSplit: %s",
                 newcomm == NULL ? "newcomm is NULL" : "color must be >= 0 or GVQ_SPLIT_NOCOLOR");
        return gvqInvalidArgument;
    }
    int64_t timeout_ms;
    size_t chunk;
    GVQCHECK(gvq_config_resolve(config, "gvqCommSplit", &timeout_ms, &chunk));
    const char *kind = comm->xport->ops->name;
    int ucx = strcmp(kind, "ucx") == 0;
    if (!gvq_comm_can_split(comm)) {
        GVQ_WARN("gvqCommSplit: the %s transport cannot make new communicators (mpi and ucx can)",
                 kind);
        return gvqInvalidUsage;
    }
    int n = comm->nranks, nh = 0, leader = 0;
    split_pair_t *all = calloc((size_t)n, sizeof *all);
    int *ranks = calloc((size_t)n, sizeof *ranks);
    gvqResult_t res = all && ranks ? gvqSuccess : gvqSystemError;
    split_pair_t mine = {SPLIT_MAGIC, color, key};
    /* collective on the parent: a rank that is not splitting fails this call on every rank (a
     * call of another shape at the agreement; an allgather of the same shape by its magic) */
    if (res == gvqSuccess) res = gvqAllGather(&mine, all, 3, gvqInt32, comm, NULL);
    for (int p = 0; res == gvqSuccess && p < n; p++)
        if (all[p].magic != SPLIT_MAGIC) {
            GVQ_WARN("gvqCommSplit: rank %d made another call (an allgather of three int32) "
                     "where the others split",
                     p);
            res = gvqInvalidUsage;
        }
    if (res == gvqSuccess) res = gvq_comm_hosts(comm, &nh, &leader, NULL); /* knows the keys */
    int me = -1, m = 0;
    if (res == gvqSuccess && color != GVQ_SPLIT_NOCOLOR)
        m = members_of(all, n, color, comm->rank, ranks, &me);
    gvq_transport_t *t = NULL;
    if (res == gvqSuccess && ucx) {
        res = ucx_child(comm, color != GVQ_SPLIT_NOCOLOR, ranks, m, me, &t);
    } else if (res == gvqSuccess && color != GVQ_SPLIT_NOCOLOR) {
        /* a tag of this split: the parent's calls so far, the same number on every rank */
        res = gvq_mpi_transport_subset(comm->xport, ranks, m, me,
                                       (int)(comm->calls % 30000u) + 1000, &t);
    }
    if (res == gvqSuccess && t != NULL) {
        t->timeout_ns = (uint64_t)timeout_ms * 1000000ull;
        res = gvq_comm_create(t, config, "gvqCommSplit", newcomm);
        t = NULL; /* the communicator's now, or freed by a failed create */
    }
    if (res == gvqSuccess && *newcomm != NULL) {
        res = gvq_comm_child_finish(comm, ranks, m, *newcomm, spare);
        if (res != gvqSuccess) {
            (void)gvqCommDestroy(*newcomm);
            *newcomm = NULL;
        } else {
            GVQ_INFO("gvqCommSplit: color %d key %d: rank %d of %d (rank %d of %d in the parent)",
                     color, key, me, m, comm->rank, n);
        }
    }
    if (t != NULL) t->ops->destroy(t);
    free(all);
    free(ranks);
    return res;
}

int gvq_comm_can_split(gvqComm_t comm) {
    const char *kind = comm->xport->ops->name;
    return strcmp(kind, "ucx") == 0 || strcmp(kind, "mpi") == 0;
}

GVQ_API gvqResult_t gvqCommSplit(gvqComm_t comm, int color, int key, gvqComm_t *newcomm,
                                 gvqConfig_t *config) {
    return split(comm, color, key, newcomm, config, 1);
}

/* ---- the hierarchy's communicator of a host (gvq_comm.h) ------------------------------------ */

gvqResult_t gvq_comm_hier_local(gvqComm_t c) {
    gvq_hier_t *h = c->hier;
    const char *kind = c->xport->ops->name;
    if (h == NULL || c->host_comm != NULL || c->xport->fifo || !gvq_param(GVQ_PARAM_HIER_LOCAL) ||
        (strcmp(kind, "mpi") != 0 && strcmp(kind, "ucx") != 0))
        return gvqSuccess; /* the same on every rank: the keys, the transport, the setting */
    int color = 0;         /* this rank's host: its place in the host order */
    for (int g = 0; g < h->nhosts; g++)
        if (h->cross[g] == c->rank) color = g;
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = (int)GVQ_MIN(c->xport->timeout_ns / 1000000ull, (uint64_t)INT32_MAX);
    cfg.chunkBytes = (int)GVQ_MIN(c->chunk_bytes, (size_t)INT32_MAX);
    gvqComm_t child = NULL;
    /* key: local order is rank order; no spare worker: this one is never shrunk */
    GVQCHECK(split(c, color, c->rank, &child, &cfg, 0));
    c->host_comm = child;
    if (child->p2p != child->xport) h->local_xport = child->p2p;
    GVQ_INFO("comm %p rank %d: the hierarchy's stages inside the host go through %s", (void *)c,
             c->rank, h->local_xport != NULL ? "its shared-memory channels" : "the transport");
    return gvqSuccess;
}
