/*
 * test_fifo_ring.c -- the ring over a transport that runs transfers strictly in issue order
 * (sim_fifo.h, NCCL's sends and receives on one stream): told the transport is FIFO, the ring
 * must finish and give exact sums at 2-5 ranks, for many chunk and segment shapes, through the
 * identity codec and a GradiVeQ codec with the vote tally riding along. Told nothing (it then
 * pre-posts receives, as it does for MPI), it must block, which the transport's timeout reports:
 * this shows the simulated stream can catch the deadlock the FIFO mode avoids. Every shape runs
 * in rank order and in a ring order across the ranks (ctx.ring_order: evens up, then odds
 * down), and gvq_ring_order_hosts is held to orders written out here.
 */
#include <math.h>

#include "gvq_test.h"
#include "sim_fifo.h"

typedef struct {
    fifo_world_t *w;
    int fifo, nranks;
    size_t count, chunk_bytes;
    int use_gq;
    const int *order; /* ctx.ring_order (NULL: rank order) */
    gvqResult_t res[16];
    float *out[16];
    int32_t tally[16];
    int carried[16];
} fcase_t;

static int32_t vote_of_rank(void *arg) {
    return *(int *)arg + 1;
}

static void *fifo_rank(void *p) {
    void **a = p;
    fcase_t *k = a[0];
    int r = (int)(intptr_t)a[1];
    gvq_transport_t *t = fifo_transport(k->w, r, k->fifo);
    if (!k->fifo) t->timeout_ns = 2ull * 1000000000ull;
    void *scratch = NULL;
    size_t scratch_bytes = 0;
    gvq_coll_ctx_t ctx = {.xport = t,
                          .dev = &gvq_host_device,
                          .chunk_bytes = k->chunk_bytes,
                          .scratch = &scratch,
                          .scratch_bytes = &scratch_bytes,
                          .ring_order = k->order};
    float *x = malloc(sizeof(float) * k->count), *y = malloc(sizeof(float) * k->count);
    for (size_t i = 0; i < k->count; i++)
        x[i] = (float)((i * 7 + (size_t)r * 13) % 101); /* exact sums */
    gvq_codec_t codec;
    gvq_gradiveq_t g;
    float *U = NULL, *Z = NULL;
    int rank_arg = r;
    gvq_tally_t tally = {vote_of_rank, &rank_arg, 0, 0};
    if (k->use_gq) { /* L = 8, d = 8: U = I, so the codec is exact and sums stay exact */
        size_t L = 8, groups = k->count / L + 1;
        U = calloc(L * L * groups, sizeof(float));
        Z = calloc(L * groups, sizeof(float));
        for (size_t q = 0; q < groups; q++)
            for (size_t i = 0; i < L; i++)
                U[q * L * L + i * L + i] = 1.0f;
        memset(&g, 0, sizeof g);
        g.count = k->count, g.L = L, g.d = L, g.C = 1, g.nranks = k->nranks, g.U = U, g.Z = Z;
        gvq_gradiveq_prepare(&g, &gvq_host_device);
        gvq_codec_gradiveq_init(&codec, &gvq_host_device, &g);
    } else {
        gvq_codec_identity_init(&codec, &gvq_host_device, gvqFloat32, gvqSum);
    }
    k->res[r] =
        gvq_ring_allreduce_tally(&ctx, &codec, x, y, k->count, gvqSum, k->use_gq ? &tally : NULL);
    k->tally[r] = tally.sum;
    k->carried[r] = tally.carried;
    k->out[r] = y;
    if (k->use_gq) gvq_gradiveq_fini(&g);
    free(U), free(Z), free(x), free(scratch);
    t->ops->destroy(t);
    return NULL;
}

static void run_case(fcase_t *k) {
    pthread_t tid[16];
    void *args[16][2];
    k->w = fifo_world_create(k->nranks, 0);
    for (int r = 0; r < k->nranks; r++) {
        args[r][0] = k, args[r][1] = (void *)(intptr_t)r;
        pthread_create(&tid[r], NULL, fifo_rank, args[r]);
    }
    for (int r = 0; r < k->nranks; r++)
        pthread_join(tid[r], NULL);
    fifo_world_destroy(k->w);
}

static void test_order_hosts(void) {
    static const struct {
        int n;
        uint64_t keys[6];
        int moved, order[6];
    } cases[] = {
        {4, {7, 9, 7, 9}, 1, {0, 2, 1, 3}},             /* --map-by node, 2 hosts */
        {4, {7, 7, 9, 9}, 0, {0, 1, 2, 3}},             /* --map-by slot: already in order */
        {5, {9, 7, 5, 7, 9}, 1, {0, 4, 1, 3, 2}},       /* hosts by their lowest rank */
        {6, {1, 2, 3, 1, 2, 3}, 1, {0, 3, 1, 4, 2, 5}}, /* 3 hosts of 2 */
        {3, {4, 4, 4}, 0, {0, 1, 2}},                   /* one host */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int order[6] = {-1, -1, -1, -1, -1, -1};
        int moved = gvq_ring_order_hosts(cases[c].keys, cases[c].n, order);
        EXPECT(moved == cases[c].moved, "case %zu: moved %d, want %d", c, moved, cases[c].moved);
        EXPECT(memcmp(order, cases[c].order, sizeof(int) * (size_t)cases[c].n) == 0,
               "case %zu: order %d %d %d %d .. differs", c, order[0], order[1], order[2], order[3]);
    }
}

int main(void) {
    const size_t counts[] = {1, 5, 97, 1000, 4099};
    const size_t chunks[] = {16, 64, 1000, 1 << 20};
    int cases = 0;
    test_order_hosts();
    for (int n = 2; n <= 5; n++)
        for (int ord = 0; ord < (n > 2 ? 2 : 1); ord++)
            for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
                for (size_t hi = 0; hi < sizeof chunks / sizeof *chunks; hi++)
                    for (int gq = 0; gq < 2; gq++) {
                        int order[16], m = 0; /* evens up, then odds down */
                        for (int r = 0; r < n; r += 2)
                            order[m++] = r;
                        for (int r = (n - 1) | 1; r >= 1; r -= 2)
                            if (r < n) order[m++] = r;
                        fcase_t k;
                        memset(&k, 0, sizeof k);
                        k.fifo = 1, k.nranks = n, k.count = counts[ci], k.chunk_bytes = chunks[hi];
                        k.use_gq = gq;
                        k.order = ord ? order : NULL;
                        run_case(&k);
                        cases++;
                        for (int r = 0; r < n; r++) {
                            EXPECT(k.res[r] == gvqSuccess,
                                   "n=%d count=%zu chunk=%zu gq=%d rank %d: %s", n, k.count,
                                   k.chunk_bytes, gq, r, gvqGetErrorString(k.res[r]));
                            size_t bad = 0;
                            for (size_t i = 0; k.res[r] == gvqSuccess && i < k.count; i++) {
                                double want = 0;
                                for (int q = 0; q < n; q++)
                                    want += (double)((i * 7 + (size_t)q * 13) % 101);
                                bad += k.out[r][i] != (float)want;
                            }
                            EXPECT(bad == 0,
                                   "n=%d count=%zu chunk=%zu gq=%d rank %d: %zu wrong sums", n,
                                   k.count, k.chunk_bytes, gq, r, bad);
                            /* carried when every segment has a chunk; else the rank's own value */
                            int32_t want = k.carried[r] ? n * (n + 1) / 2 : r + 1;
                            if (gq && k.res[r] == gvqSuccess)
                                EXPECT(k.tally[r] == want &&
                                           k.carried[r] == ((k.count + 7) / 8 >= (size_t)n),
                                       "n=%d count=%zu: tally %d (carried %d), want %d", n, k.count,
                                       k.tally[r], k.carried[r], want);
                            free(k.out[r]);
                        }
                    }
    /* the same ring not told the transport is FIFO pre-posts the next step's receives: on a
     * stream that blocks at 3 ranks (every rank waits, and the timeout reports it) */
    fcase_t k;
    memset(&k, 0, sizeof k);
    k.fifo = 0, k.nranks = 3, k.count = 3000, k.chunk_bytes = 1024;
    run_case(&k);
    int timed_out = 0;
    for (int r = 0; r < 3; r++) {
        timed_out += k.res[r] == gvqTimeout;
        free(k.out[r]);
    }
    EXPECT(timed_out == 3,
           "pre-posting ring on a FIFO stream: %d of 3 ranks timed out, expected "
           "all (the simulated stream no longer models the hazard)",
           timed_out);
    printf("fifo ring: %d shapes at 2-5 ranks exact; pre-posting ring on the stream: %d/3 ranks "
           "timed out as expected\n",
           cases, timed_out);
    return gvq_test_finish("test_fifo_ring");
}
