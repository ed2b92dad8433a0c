/*
 * select.c -- which algorithm runs a plain collective: one table of crossovers, and GVQ_ALGO.
 *
 *   GVQ_ALGO unset or auto      the table below: the first row whose collective, rank range,
 *                               datatype class and size bound match; the ring past every row
 *   GVQ_ALGO=rd                 every collective that has rd runs it, the others the table
 *   GVQ_ALGO=allreduce=rab,broadcast=tree    per collective (items separated by commas)
 *
 * Algorithms per collective (gvq_algo.h):
 *
 *   allreduce       ring, rd (recursive doubling), rab (Rabenseifner), direct, shm
 *   reducescatter   ring, rab (recursive halving), shm
 *   allgather       ring, rd (Bruck), direct, shm
 *   broadcast       ring (the pipelined chain), tree (binomial), shm
 *   reduce          ring (the pipelined chain), tree (binomial), shm
 *
 * When the transport copies sends out of the caller's memory (MPI with GVQ_SEND_COPY=1, the
 * default) and all ranks share one host (memory-bound transfers), allreduce and allgather run
 * direct where the table gives the ring, from 3 ranks (at 2 it copies what the ring copies and
 * has no pipeline) and 4 MiB: it
 * sends from library memory after step 0, so it copies 2 blocks where the ring copies 2(N-1)
 * (direct.c). Measured with perf/sendcopy-cost.sh at 3 and 4 ranks, 16-256 MiB, two runs: +1-41%
 * over sends in place, against +21-47% for the ring with staging; at 1 MiB direct was slower at 2
 * and 3 ranks, at 4 MiB level. Across hosts (the emulated 1 Gbit/s cluster) the ring with
 * staging costs nothing over sends in place (1.00x at 16-64 MiB) while direct, whose steps do
 * not overlap as the ring's pipeline does, was 1.20x: there the ring stays (perf/RESULTS.md
 * section 7).
 *
 * With a shared-memory segment mapped by every rank (one host, GVQ_SHM=1; src/comm/shm_setup.c)
 * every plain collective runs `shm` before any row, at every size (the others than allreduce up to
 * 8 ranks): every rank writes its input into its slot, the call agreement in the same exchange, and
 * takes its output from the slots (reductions above 64 KiB in segments, one per rank; a slot's
 * worth at a time; src/algorithms/shm_collectives.c). GVQ_ALGO=shm without the segment falls back
 * to the table.
 *
 * A name a collective does not have, or a malformed item, is reported at WARN and that item
 * ignored. The choice is reported at INFO the first time each (collective, algorithm) runs.
 * The algorithms other than the ring post receives ahead of their sends, so a FIFO transport
 * (NCCL's) always runs the ring.
 *
 * Rows hold on one host (H_ONE: shared memory, transfers are memory copies), across hosts
 * (H_MANY: the network bounds a call) or both; gvq_transport_t.one_host tells which. The
 * allreduce bounds on one host were measured on the development machine (2 cores shared with other
 * jobs, load 10-17 at the time: the bounds are rough): gvq-perf -b 1K -e 4M -f 2 -n 50 -w 10
 * with GVQ_ALGO forced per algorithm, 2 to 5 ranks, medians over 3 runs of the per-size time;
 * a bound is the largest size at which the row's algorithm had the lowest median. Rows marked
 * "not measured" follow from the step counts (rd/tree: ceil(log2 N) steps, ring/chain: N-1 or
 * 2(N-1)) and wait for the per-collective gvq-perf.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "gvq_select.h"

#define KIB ((size_t)1 << 10)
#define NCOLL 5 /* GVQ_OP_ALLREDUCE .. GVQ_OP_ALLGATHER */

static const char *const algo_names[GVQ_ALGO_COUNT] = {"auto", "ring",   "rd",  "rab",
                                                       "tree", "direct", "shm", "hier"};
static const char *const coll_names[NCOLL] = {"allreduce", "broadcast", "reduce", "reducescatter",
                                              "allgather"};
#define B(a) (1u << (a))
static const unsigned coll_algos[NCOLL] = {
    [GVQ_OP_ALLREDUCE] = B(GVQ_ALGO_RING) | B(GVQ_ALGO_RD) | B(GVQ_ALGO_RAB) | B(GVQ_ALGO_DIRECT) |
                         B(GVQ_ALGO_SHM) | B(GVQ_ALGO_HIER),
    [GVQ_OP_BROADCAST] = B(GVQ_ALGO_RING) | B(GVQ_ALGO_TREE) | B(GVQ_ALGO_SHM),
    [GVQ_OP_REDUCE] = B(GVQ_ALGO_RING) | B(GVQ_ALGO_TREE) | B(GVQ_ALGO_SHM),
    [GVQ_OP_REDUCE_SCATTER] =
        B(GVQ_ALGO_RING) | B(GVQ_ALGO_RAB) | B(GVQ_ALGO_SHM) | B(GVQ_ALGO_HIER),
    [GVQ_OP_ALLGATHER] =
        B(GVQ_ALGO_RING) | B(GVQ_ALGO_RD) | B(GVQ_ALGO_DIRECT) | B(GVQ_ALGO_SHM) | B(GVQ_ALGO_HIER),
};

/* Datatype classes: 16-bit floats reduce through float conversions, so their reductions cost
 * more per byte and the crossovers of reducing collectives may sit elsewhere. */
enum { DC_ANY, DC_HALF };

/* Where the ranks run: rows measured on one host (shared memory: memory-bound transfers) or
 * across hosts (the network bounds a call), or rows for both. */
enum { H_ANY, H_ONE, H_MANY };

typedef struct {
    gvq_op_kind_t kind;
    int min_ranks, max_ranks; /* inclusive */
    int dclass;               /* DC_ANY: every datatype */
    int hosts;                /* H_ANY, H_ONE or H_MANY */
    size_t max_bytes;         /* the row holds up to this size */
    gvq_algo_t algo;
} select_row_t;

/* clang-format off */
static const select_row_t table[] = {
    /* kind                  ranks    dtypes  hosts   up to        algorithm   measured (above) */
    {GVQ_OP_ALLREDUCE,       2, 2,    DC_ANY, H_ONE,  2 * KIB,     GVQ_ALGO_RD},
    {GVQ_OP_ALLREDUCE,       2, 2,    DC_ANY, H_ONE,  4 * KIB,     GVQ_ALGO_RING}, /* rd's one
                                                                     * 4 KiB message: 0.24x */
    {GVQ_OP_ALLREDUCE,       2, 2,    DC_ANY, H_ONE,  32 * KIB,    GVQ_ALGO_RD},   /* to 32K */
    {GVQ_OP_ALLREDUCE,       3, 3,    DC_ANY, H_ONE,  16 * KIB,    GVQ_ALGO_RD},   /* ring 32K+ */
    {GVQ_OP_ALLREDUCE,       4, 4,    DC_ANY, H_ONE,  16 * KIB,    GVQ_ALGO_RD},   /* < 16K:
                                                                     * undecidable */
    {GVQ_OP_ALLREDUCE,       4, 4,    DC_ANY, H_ONE,  256 * KIB,   GVQ_ALGO_RING},
    {GVQ_OP_ALLREDUCE,       4, 4,    DC_ANY, H_ONE,  4096 * KIB,  GVQ_ALGO_RAB},  /* 512K-4M */
    {GVQ_OP_ALLREDUCE,       5, 5,    DC_ANY, H_ONE,  64 * KIB,    GVQ_ALGO_RD},
    {GVQ_OP_ALLREDUCE,       5, 5,    DC_ANY, H_ONE,  512 * KIB,   GVQ_ALGO_RAB},  /* 128K-512K */
    {GVQ_OP_ALLREDUCE,       6, 1024, DC_ANY, H_ONE,  16 * KIB,    GVQ_ALGO_RD},   /* not measured */
    /* across hosts: 4 and 2 ranks on the emulated 1 Gbit/s cluster (perf/RESULTS.md section 7;
     * 4 ranks: rab and ring level at 64-256K, the ring 1.2-1.4x rab from 1 MiB); 3 and 5+ ranks
     * not measured */
    {GVQ_OP_ALLREDUCE,       2, 1024, DC_ANY, H_MANY, 16 * KIB,    GVQ_ALGO_RD},
    {GVQ_OP_ALLREDUCE,       2, 1024, DC_ANY, H_MANY, 256 * KIB,   GVQ_ALGO_RAB},
    {GVQ_OP_ALLREDUCE,       2, 2,    DC_ANY, H_MANY, 4096 * KIB,  GVQ_ALGO_RAB},  /* 2 ranks:
                                                 * rab 1.2-1.4x the ring at 4M, level above */
    /* not measured yet (gvq-perf times allreduce only): bounds from the step counts */
    {GVQ_OP_REDUCE_SCATTER,  2, 1024, DC_ANY, H_ANY,  64 * KIB,    GVQ_ALGO_RAB},
    {GVQ_OP_ALLGATHER,       2, 1024, DC_ANY, H_ANY,  64 * KIB,    GVQ_ALGO_RD},
    {GVQ_OP_BROADCAST,       3, 1024, DC_ANY, H_ANY,  64 * KIB,    GVQ_ALGO_TREE},
    {GVQ_OP_REDUCE,          3, 1024, DC_ANY, H_ANY,  64 * KIB,    GVQ_ALGO_TREE},
};
/* clang-format on */

/* Where the ring's rows go to direct when the transport stages sends (see the header). */
#define DIRECT_MIN_BYTES (4096 * KIB)
/* With a shared-memory segment (one_host 2) the allreduce runs shm at every size. Measured at
 * 2-5 ranks against the table's algorithms (perf/RESULTS.md section 7): 1 KiB-1 MiB 1.3-3.6x
 * MPI but at 1 KiB on 2 ranks (0.89x); 2-128 MiB 0.86-4.6x against the table's 0.73-2.1x (three
 * rounds; shm below the table in 4 of 16 cells, by 9-26%, within this machine's noise). */

/* Across hosts of several ranks each (the hierarchy's shape) the plain allreduce runs hier from
 * 16 MiB. Measured on the emulated 1 Gbit/s cluster, ranks placed round-robin (perf/RESULTS.md
 * section 14), against the table's choice: 2 hosts x 2 ranks 1.15x at 16 MiB, 1.41x at 64 MiB,
 * slower at 1-4 MiB (0.76-0.90x); 4 x 2 level at 16 and 64 MiB (0.95-1.04x). */
#define HIER_MIN_BYTES (16384 * KIB)

/* The other collectives run shm up to 8 ranks, where a slot holds 1 MiB (measured at 2-5 ranks,
 * perf/RESULTS.md section 7); beyond, slots of 64 KiB make a large broadcast or allgather an
 * exchange of every rank per 64 KiB, not measured: the table. */
#define SHM_OTHERS_MAX_RANKS 8

static gvq_algo_t forced[NCOLL]; /* GVQ_ALGO; GVQ_ALGO_AUTO: the table */
static int reported[NCOLL][GVQ_ALGO_COUNT];
static int rode[NCOLL]; /* gvq_select_report_ride */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

const char *gvq_algo_name(gvq_algo_t a) {
    return a >= 0 && a < GVQ_ALGO_COUNT ? algo_names[a] : "?";
}

static int name_index(const char *const *names, int n, const char *s, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(names[i]) == len && strncmp(names[i], s, len) == 0) return i;
    return -1;
}

/* One item of the spec: "algo" (every collective that has it) or "collective=algo". */
static void parse_item(const char *item, size_t len, const char *spec) {
    const char *eq = memchr(item, '=', len);
    const char *an = eq != NULL ? eq + 1 : item;
    size_t alen = (size_t)(item + len - an);
    int a = name_index(algo_names, GVQ_ALGO_COUNT, an, alen);
    int k = eq != NULL ? name_index(coll_names, NCOLL, item, (size_t)(eq - item)) : -1;
    if (a < 0 || (eq != NULL && k < 0)) {
        GVQ_WARN("GVQ_ALGO='%s': '%.*s' is not an algorithm (auto, ring, rd, rab, tree, direct, "
                 "shm, hier) or "
                 "collective=algorithm (allreduce, broadcast, reduce, reducescatter, allgather); "
                 "ignored",
                 spec, (int)len, item);
        return;
    }
    if (eq == NULL) {
        for (int c = 0; c < NCOLL; c++)
            if (a == GVQ_ALGO_AUTO || (coll_algos[c] & B(a))) forced[c] = (gvq_algo_t)a;
        return;
    }
    if (a != GVQ_ALGO_AUTO && !(coll_algos[k] & B(a))) {
        GVQ_WARN("GVQ_ALGO='%s': %s has no algorithm %s; ignored", spec, coll_names[k],
                 algo_names[a]);
        return;
    }
    forced[k] = (gvq_algo_t)a;
}

static void parse_spec(const char *spec) {
    for (int c = 0; c < NCOLL; c++)
        forced[c] = GVQ_ALGO_AUTO;
    for (const char *p = spec; p != NULL && *p != '\0';) {
        const char *end = strchr(p, ',');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        if (len > 0) parse_item(p, len, spec);
        p = end != NULL ? end + 1 : NULL;
    }
}

static void env_init(void) {
    parse_spec(gvq_param_text(GVQ_PARAM_ALGO));
}

void gvq_select_override(const char *spec) {
    pthread_once(&env_once, env_init);
    parse_spec(spec != NULL ? spec : gvq_param_text(GVQ_PARAM_ALGO));
}

gvq_algo_t gvq_select_forced(gvq_op_kind_t kind) {
    pthread_once(&env_once, env_init);
    return (int)kind >= 0 && (int)kind < NCOLL ? forced[kind] : GVQ_ALGO_AUTO;
}

static gvq_algo_t from_table(gvq_op_kind_t kind, int nranks, size_t bytes, gvqDataType_t dtype,
                             int one_host) {
    int half = dtype == gvqFloat16 || dtype == gvqBfloat16;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const select_row_t *row = &table[i];
        if (row->kind == kind && nranks >= row->min_ranks && nranks <= row->max_ranks &&
            (row->dclass == DC_ANY || (row->dclass == DC_HALF && half)) &&
            (row->hosts == H_ANY || row->hosts == (one_host != 0 ? H_ONE : H_MANY)) &&
            bytes <= row->max_bytes)
            return row->algo;
    }
    return GVQ_ALGO_RING;
}

gvq_algo_t gvq_select_algo(gvq_op_kind_t kind, int nranks, size_t bytes, gvqDataType_t dtype,
                           int fifo, int staged, int one_host, int hier) {
    pthread_once(&env_once, env_init);
    if ((int)kind < 0 || (int)kind >= NCOLL || nranks <= 1 || fifo) return GVQ_ALGO_RING;
    gvq_algo_t a = forced[kind];
    int shm = one_host == 2;
    if (a == GVQ_ALGO_SHM && !shm) a = GVQ_ALGO_AUTO;   /* no shared memory, or too large */
    if (a == GVQ_ALGO_HIER && !hier) a = GVQ_ALGO_AUTO; /* not hosts of equal rank counts */
    int from_env = a != GVQ_ALGO_AUTO;
    if (!from_env)
        a = shm && (kind == GVQ_OP_ALLREDUCE || nranks <= SHM_OTHERS_MAX_RANKS)
                ? GVQ_ALGO_SHM
                : from_table(kind, nranks, bytes, dtype, one_host);
    if (!from_env && hier && !one_host && kind == GVQ_OP_ALLREDUCE && bytes >= HIER_MIN_BYTES)
        a = GVQ_ALGO_HIER;
    int moved = !from_env && staged && one_host && nranks >= 3 && a == GVQ_ALGO_RING &&
                (coll_algos[kind] & B(GVQ_ALGO_DIRECT)) && bytes >= DIRECT_MIN_BYTES;
    if (moved) a = GVQ_ALGO_DIRECT;
    if (!__atomic_load_n(&reported[kind][a], __ATOMIC_RELAXED) && /* no write once reported */
        __atomic_exchange_n(&reported[kind][a], 1, __ATOMIC_RELAXED) == 0)
        GVQ_INFO("%s: algorithm %s (%s; first at %zu bytes on %d ranks)", coll_names[kind],
                 algo_names[a],
                 from_env ? "GVQ_ALGO"
                 : moved  ? "the size table; sends are staged and the ranks share one host"
                          : "the size table",
                 bytes, nranks);
    return a;
}

void gvq_select_report_ride(gvq_op_kind_t kind, size_t bytes, int nranks) {
    if ((int)kind < 0 || (int)kind >= NCOLL) return;
    if (!__atomic_load_n(&rode[kind], __ATOMIC_RELAXED) &&
        __atomic_exchange_n(&rode[kind], 1, __ATOMIC_RELAXED) == 0)
        GVQ_INFO("%s: rides along with the call agreement (its vector in one recursive-doubling "
                 "exchange; first at %zu bytes on %d ranks)",
                 coll_names[kind], bytes, nranks);
}
