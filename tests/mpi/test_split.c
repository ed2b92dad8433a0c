/*
 * test_split.c -- gvqCommSplit over the transport of GVQ_TRANSPORT (MPI or UCX): colors and
 * keys (ranks in key order, ties in parent order), GVQ_SPLIT_NOCOLOR, a duplicate, nested
 * splits, children used beside their parent, destroyed before and after it, a parent aborted
 * with its children alive, a compressor per child, bad arguments, and a rank that makes
 * another call of the same shape.
 *
 * Sums are of small integers, so every expected value is computed here exactly from the
 * definition (which parent ranks a child holds), not by gvq.
 */
#include "mpitest.h"

/* parent rank p's value i */
static float val(int p, size_t i) {
    return (float)((int)((i * 5 + (size_t)p * 11) % 37) - 18);
}

/* The child's sum of val over its members (parent ranks) must equal gvqAllReduce on it. */
static void check_sum(gvqComm_t child, const int *members, int m, size_t count, const char *what) {
    float *x = malloc(count * sizeof *x), *y = malloc(count * sizeof *y);
    for (size_t i = 0; i < count; i++)
        x[i] = val(mt.rank, i);
    MT_OK(gvqAllReduce(x, y, count, gvqFloat32, gvqSum, child, NULL));
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int k = 0; k < m; k++)
            want += val(members[k], i);
        bad += y[i] != want;
    }
    MT_CHECK(bad == 0, "%s: allreduce of %zu on the child: %zu wrong", what, count, bad);
    free(x);
    free(y);
}

/* color: parity of the parent rank; key: minus the rank (so the order reverses) */
static void test_colors_keys(gvqComm_t parent) {
    int N = mt.nranks, r = mt.rank;
    gvqComm_t child = NULL;
    MT_OK(gvqCommSplit(parent, r % 2, -r, &child, NULL));
    if (child == NULL) return;
    int members[8], m = 0;
    for (int p = N - 1; p >= 0; p--) /* key -p: the highest parent rank first */
        if (p % 2 == r % 2) members[m++] = p;
    int cr = -1, cn = -1;
    MT_OK(gvqCommUserRank(child, &cr));
    MT_OK(gvqCommCount(child, &cn));
    int want_rank = -1;
    for (int k = 0; k < m; k++)
        if (members[k] == r) want_rank = k;
    MT_CHECK(cn == m && cr == want_rank, "colors/keys: rank %d of %d, want %d of %d", cr, cn,
             want_rank, m);
    check_sum(child, members, m, 1, "colors/keys");
    check_sum(child, members, m, 100003, "colors/keys");
    /* the parent still works beside the child, calls interleaved */
    int all[8];
    for (int p = 0; p < N; p++)
        all[p] = p;
    check_sum(parent, all, N, 4099, "parent beside child");
    check_sum(child, members, m, 4099, "child after parent");
    /* ties: the same key everywhere keeps the parent's order */
    gvqComm_t tie = NULL;
    MT_OK(gvqCommSplit(child, 0, 7, &tie, NULL));
    int tr = -1;
    if (tie != NULL) MT_OK(gvqCommUserRank(tie, &tr));
    MT_CHECK(tie != NULL && tr == cr, "a split with equal keys changed the rank %d -> %d", cr, tr);
    if (tie != NULL) check_sum(tie, members, m, 513, "nested split");
    MT_OK(gvqCommDestroy(child)); /* the nested child outlives its parent */
    if (tie != NULL) check_sum(tie, members, m, 77, "nested child after its parent's destroy");
    if (tie != NULL) MT_OK(gvqCommDestroy(tie));
}

static void test_nocolor(gvqComm_t parent) {
    int N = mt.nranks, r = mt.rank;
    gvqComm_t child = (gvqComm_t)0x1;
    MT_OK(gvqCommSplit(parent, r == 0 ? GVQ_SPLIT_NOCOLOR : 3, r, &child, NULL));
    if (r == 0) {
        MT_CHECK(child == NULL, "NOCOLOR: newcomm is not NULL");
        return;
    }
    int members[8], m = 0;
    for (int p = 1; p < N; p++)
        members[m++] = p;
    MT_CHECK(child != NULL, "rank %d got no communicator", r);
    if (child == NULL) return;
    check_sum(child, members, m, 1000, "NOCOLOR's others");
    MT_OK(gvqCommDestroy(child));
}

/* a duplicate with a compressor: the same bits on every rank, the parent destroyed first */
static gvqComm_t test_dup_compressor(gvqComm_t parent, gvqComm_t *dup_out) {
    gvqComm_t dup = NULL;
    MT_OK(gvqCommSplit(parent, 0, 0, &dup, NULL));
    *dup_out = dup;
    if (dup == NULL) return parent;
    size_t count = 50000;
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = gvqCodecQsgd;
    gvqCompressor_t cp = NULL;
    MT_OK(gvqCompressorCreate(dup, count, &cfg, &cp));
    float *x = malloc(count * sizeof *x), *y = malloc(count * sizeof *y);
    for (size_t i = 0; i < count; i++)
        x[i] = val(mt.rank, i) / 18.0f;
    MT_OK(gvqAllReduceCompressed(x, y, count, gvqFloat32, gvqSum, cp, dup, NULL));
    uint64_t h = mt_fnv1a(y, count * sizeof *y), h0 = h;
    MPI_Bcast(&h0, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    MT_CHECK(h == h0, "compressed allreduce on the duplicate: other bits than rank 0's");
    MT_OK(gvqCompressorDestroy(cp));
    free(x);
    free(y);
    return parent;
}

/* abort the parent while a child is alive: the child goes on */
static void test_abort_parent(void) {
    gvqComm_t parent = mt_new_comm(), child = NULL;
    MT_OK(gvqCommSplit(parent, 0, mt.rank, &child, NULL));
    MT_OK(gvqCommAbort(parent));
    int all[8];
    for (int p = 0; p < mt.nranks; p++)
        all[p] = p;
    if (child != NULL) check_sum(child, all, mt.nranks, 30011, "child of an aborted parent");
    if (child != NULL) MT_OK(gvqCommDestroy(child));
}

static void test_bad(gvqComm_t parent) {
    gvqComm_t c = NULL;
    MT_EXPECT_RES(gvqCommSplit(parent, 0, 0, NULL, NULL), gvqInvalidArgument);
    MT_EXPECT_RES(gvqCommSplit(parent, -5, 0, &c, NULL), gvqInvalidArgument);
    MT_EXPECT_RES(gvqCommSplit(NULL, 0, 0, &c, NULL), gvqInvalidArgument);
    MT_OK(gvqGroupStart());
    MT_EXPECT_RES(gvqCommSplit(parent, 0, 0, &c, NULL), gvqInvalidUsage);
    MT_OK(gvqGroupEnd());
    /* the last rank gathers three int32 where the others split: all the splitting ranks refuse */
    if (mt.rank == mt.nranks - 1) {
        int32_t mine[3] = {1, 2, 3}, all[24];
        MT_OK(gvqAllGather(mine, all, 3, gvqInt32, parent, NULL));
    } else {
        MT_EXPECT_RES(gvqCommSplit(parent, 0, 0, &c, NULL), gvqInvalidUsage);
        MT_CHECK(c == NULL, "a refused split left a communicator");
    }
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    if (mt.nranks > 8) return mt_finish("test_split");
    mt_part("colors and keys", 120);
    gvqComm_t parent = mt_new_comm();
    test_colors_keys(parent);
    mt_part("no color", 60);
    test_nocolor(parent);
    mt_part("duplicate with a compressor, parent destroyed first", 60);
    gvqComm_t dup = NULL;
    test_dup_compressor(parent, &dup);
    mt_part("bad arguments", 60);
    test_bad(parent);
    MT_OK(gvqCommDestroy(parent));
    int all[8];
    for (int p = 0; p < mt.nranks; p++)
        all[p] = p;
    if (dup != NULL) check_sum(dup, all, mt.nranks, 2049, "duplicate after its parent's destroy");
    if (dup != NULL) MT_OK(gvqCommDestroy(dup));
    mt_part("abort of a parent with a child alive", 60);
    test_abort_parent();
    return mt_finish("test_split");
}
