/*
 * gvq_train.c -- gvq-train: a data-parallel trainer of a small CNN or a Fixup ResNet on
 * Fashion-MNIST in plain C and BLAS, aggregating gradients through gvq. Run it under mpirun
 * (gvq-train -h):
 *
 *   mpirun -np 4 --oversubscribe gvq-train --epochs 2 --codec gradiveq --log gvq.csv
 *   mpirun -np 4 --oversubscribe gvq-train --epochs 2 --codec none --log plain.csv
 *   mpirun -np 4 --oversubscribe gvq-train --model resnet --train-subset 16000 --epochs 3
 *   GVQ_CODEC=gradiveq mpirun -np 4 --oversubscribe -x GVQ_CODEC gvq-train --zero-code
 *   bash apps/gvq-train/plot.sh train.png gvq.csv plain.csv
 *
 * The model (net.c), the data (mnist.c) and the training loop (train.c) live beside this file;
 * this one only reads the command line. Exit status: 0 done, 1 a run-time failure (data missing,
 * a gvq error, ranks out of step), 2 bad arguments.
 */
#include <getopt.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gvq_train.h"
#include "text.h"
#include "pipe.h"
#include "train.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: mpirun -np N gvq-train [options]\n"
        "data and model:\n"
        "  --data DIR            Fashion-MNIST IDX .gz files (default %s,\n"
        "                        from the Debian package dataset-fashion-mnist)\n"
        "  --train-subset N      use the first N training images (default all 60000)\n"
        "  --test-subset N       use the first N test images (default all 10000)\n"
        "  --model M             cnn, resnet or mlp (default cnn):\n"
        "                          cnn: each conv -> relu -> 2x2 max pool, [fc -> relu], fc\n"
        "                          mlp: --depth D (default 3) hidden fc layers of --hidden H\n"
        "                          units (default 1024), each fc -> relu, then fc: large\n"
        "                          weights, small activations (for --stages)\n"
        "                          resnet: ResNet-(6n+2) for 28x28 images without batch norm\n"
        "                          (Fixup init): stem conv stride 2 -> relu, 3 stages of n basic\n"
        "                          blocks (the first of stages 2 and 3 with stride 2; option-A\n"
        "                          shortcuts), global average pool, fc\n"
        "  --blocks N            resnet: blocks per stage (default 1: ResNet-8; 3: ResNet-20)\n"
        "  --channels A,B,...    cnn: output channels of the conv layers (default 16,32,64);\n"
        "                        resnet: the 3 stages' widths (default 16,32,64)\n"
        "  --kernel K            conv kernel size, odd (default 3)\n"
        "  --hidden H            cnn: a hidden fc layer of H units before the output (default\n"
        "                        0: none); mlp: the hidden layers' width (default 1024)\n"
        "training:\n"
        "  --batch B             global batch, a multiple of the ranks (default: cnn 64, resnet\n"
        "                        32 per rank)\n"
        "  --epochs E            epochs (default 2), or --iters N steps\n"
        "  --lr X --momentum X --wd X   SGD with momentum (default 0.05, 0.9, 0)\n"
        "  --cosine              decay the learning rate from lr to 0 along a half cosine over\n"
        "                        the run (default: constant)\n"
        "  --seed S              weights and shuffling (default 1; the same on every rank)\n"
        "aggregation through gvq:\n"
        "  --codec C             conv weight gradients: none (gvqAllReduce), gradiveq, qsgd or\n"
        "                        powersgd: a compressor per conv layer (those in residual\n"
        "                        blocks too) with its [K][D][k][k] shape (default gradiveq)\n"
        "  --rest-codec C        fc weights: none, qsgd, or powersgd (an outputs x inputs\n"
        "                        matrix); biases and scalars plain (default none)\n"
        "  --no-wait-free        aggregate after backprop instead of layer by layer during it\n"
        "  --overlap-forward     make a step's update layer by layer inside the next forward\n"
        "                        pass, each layer's as soon as its gradients are aggregated\n"
        "                        (the aggregation overlaps the next forward as well)\n"
        "  --comm-order O        ready (as backprop makes them) or forward (negotiated with the\n"
        "                        other ranks: what the next forward needs first, first; the\n"
        "                        default with --overlap-forward); --chunk-bytes N cuts plain\n"
        "                        ones for it\n"
        "  --model text          a bag-of-words classifier of Debian packages' sections from\n"
        "                        their names and descriptions (--text-data FILE, made by\n"
        "                        apps/gvq-train/apt-text.sh); its embedding is a sparse variable,\n"
        "                        --sparse-route ps|allgatherv|dense|auto (default auto:\n"
        "                        Parallax's rule), --vocab V (65536), --embed-dim D (32);\n"
        "                        --batch is per rank here (default 64); --ps-staleness S: the\n"
        "                        parameter server answers at any time (its own thread), a\n"
        "                        lookup seeing the rows at most S steps old (default: the\n"
        "                        synchronous server); --ps-partitions P: P shards, not tuned\n"
        "  --sfb MODE            fc weights as sufficient factors (Poseidon): on (always SFB),\n"
        "                        full (the factors, but always the full matrix), auto (SACP)\n"
        "  --bucket-bytes N      fuse plain tensors below N bytes (default: the library's)\n"
        "  --timeline FILE       CSV of one step: per layer backprop end, per variable ready,\n"
        "                        aggregation start and end (--timeline-step S, default 100)\n"
        "  --zero-code           one plain gvqAllReduce of the whole flat gradient; set GVQ_CODEC\n"
        "                        to compress it without code changes\n"
        "  --slice L             GradiVeQ slice size, rounded up to a multiple of each layer's K\n"
        "  --reuse C             slices per compressor\n"
        "  --eps X               GradiVeQ loss threshold\n"
        "  --vote-threshold V    GradiVeQ early exit when a majority of local losses exceed V\n"
        "                        (default: eps; >= 1 never exits early)\n"
        "  --warmup W --sample T --compressed S   the schedule (library defaults 0, 100, 400)\n"
        "  --sample-codec C      none or qsgd during warm-up and sampling\n"
        "  --sample-slices N     slices of each reuse group kept as PCA samples per sampling\n"
        "                        call (default: the library's, 1; 0: all)\n"
        "  --qsgd-bits B --qsgd-bucket N   QSGD settings\n"
        "  --wire fp16|fp32      GradiVeQ coefficients on the wire\n"
        "  --ef, --no-ef         error feedback on or off (default: the library's, on for\n"
        "                        PowerSGD only)\n"
        "  --ef-bound X          clip the error-feedback residual to X x the gradient's norm\n"
        "  --max-dims D          cap on GradiVeQ's d\n"
        "  --power-rank R        PowerSGD's rank r\n"
        "  --stages S            pipeline model parallelism: the model cut into S stages,\n"
        "                        GPipe's schedule (gvqPipe); R x S ranks run R replicas, each\n"
        "                        stage's gradients averaged over them with the codec options\n"
        "  --micro-batches M     micro-batches per step of the pipeline (default 4)\n"
        "  --schedule S          the pipeline's schedule: gpipe (synchronous, a flush per\n"
        "                        step), pipedream (1F1B, an update after every micro-batch,\n"
        "                        weight stashing), dualpipe (the same on stale weights) or\n"
        "                        spectrain (dualpipe on SpecTrain's predicted weights)\n"
        "  --predict-distance D  SpecTrain's s: schedule (default: to the micro-batch's own\n"
        "                        backward, which the schedule runs min(m, N-k-1) updates\n"
        "                        later, N-k-1 without a flush) or paper (forward 2N-k-2,\n"
        "                        backward k: it diverged on the flushed ResNet, perf/RESULTS.md\n"
        "                        section 10)\n"
        "  --no-flush            pipedream, dualpipe, spectrain: the pipeline runs on across\n"
        "                        steps (the next step's first forwards inside this step; the\n"
        "                        last step flushes), as their papers run it\n"
        "  --overlap-transfers   activations and errors on two more communicators, each from a\n"
        "                        host stream, while the stage computes\n"
        "  --basis fit|track     GradiVeQ's basis: fitted from sampling phases (the paper, the\n"
        "                        default) or tracked on every call (--max-dims d, default 4)\n"
        "  --int-bits B          0, 8 or 16: integer-summed wire for GradiVeQ and QSGD (0: "
        "floats)\n"
        "output:\n"
        "  --print-every N       progress line (and CSV row) every N steps (default 50)\n"
        "  --eval-every N        test accuracy every N steps (default 200; also at the end)\n"
        "  --check-every N       compare weight checksums across ranks every N steps (default:\n"
        "                        at every progress line)\n"
        "  --stop-at ACC         stop once test accuracy reaches ACC percent\n"
        "  --stop-step N         end after step N; the learning-rate schedule still spans\n"
        "                        --epochs (a short run of a long run's first steps)\n"
        "  --elastic K           commit every K steps; when a rank dies or stalls the others\n"
        "                        shrink to the survivors, roll back to the last commit, scale\n"
        "                        the learning rate by the ranks left and go on (start without\n"
        "                        mpirun, e.g. scripts/gvq-launch.sh, so a death ends no job)\n"
        "  --commit-dir DIR      with --elastic: rank 0 also writes each commit to\n"
        "                        DIR/gvq-train.commit (step, the epoch's place, weights,\n"
        "                        momentum), every rank its compressors' state to\n"
        "                        DIR/gvq-train.agg.RANK\n"
        "  --resume DIR          start from DIR/gvq-train.commit (the same model, --seed and\n"
        "                        run length) and each rank's compressors' state (when every\n"
        "                        rank has its own of that step; else they start afresh)\n"
        "  --replace             with --elastic: at the first commit after a fault rank 0\n"
        "                        starts a replacement per rank lost (this program), which\n"
        "                        joins (gvqCommGrow) and takes the state from rank 0\n"
        "  --die R:S             (tests) the process first ranked R leaves at step S\n"
        "  --log FILE            CSV: iter,epoch,time_s,loss,train_acc,test_acc,img_per_s,\n"
        "                        compute_s,comm_s,conv_ratio,phase (apps/gvq-train/plot.sh draws "
        "it)\n"
        "  --dump-grads FILE     record rank 0's local gradient of one conv layer per step in\n"
        "                        gvq-perf --replay's GVQGRAD1 format\n"
        "  --dump-layer I        which conv layer, 1-based in network order (default 2; the\n"
        "                        resnet's are the stem, then conv1, conv2 of each block)\n"
        "  --dump-iters K        record the first K steps only (default all)\n"
        "  --no-progress         no progress line: by default rank 0 keeps one on stderr with\n"
        "                        the estimated time left, when stderr (under mpirun: mpirun's)\n"
        "                        is a terminal and the run is longer than a few seconds\n",
        "/usr/share/datasets/fashion-mnist");
}

static int parse_long(const char *s, long lo, long hi, long *v) {
    char *end;
    long x = strtol(s, &end, 10);
    if (end == s || *end != '\0' || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

static int parse_int(const char *s, int lo, int hi, int *v) {
    long x;
    if (parse_long(s, lo, hi, &x)) return -1;
    *v = (int)x;
    return 0;
}

static int parse_double(const char *s, double lo, double hi, double *v) {
    char *end;
    double x = strtod(s, &end);
    if (end == s || *end != '\0' || !(x >= lo && x <= hi)) return -1;
    *v = x;
    return 0;
}

/* Accepts none, qsgd, and the codecs named by the allow_* flags. */
static int parse_codec(const char *s, int allow_gradiveq, int allow_powersgd, int *v) {
    if (strcmp(s, "none") == 0)
        *v = TRAIN_CODEC_NONE;
    else if (strcmp(s, "qsgd") == 0)
        *v = TRAIN_CODEC_QSGD;
    else if (allow_gradiveq && strcmp(s, "gradiveq") == 0)
        *v = TRAIN_CODEC_GRADIVEQ;
    else if (allow_powersgd && strcmp(s, "powersgd") == 0)
        *v = TRAIN_CODEC_POWERSGD;
    else
        return -1;
    return 0;
}

static int parse_channels(const char *s, net_arch_t *a) {
    int n = 0;
    const char *p = s;
    while (*p != '\0') {
        char *end;
        long c = strtol(p, &end, 10);
        if (end == p || c < 1 || c > 4096 || n == 8) return -1;
        a->channels[n++] = (int)c;
        if (*end == ',')
            end++;
        else if (*end != '\0')
            return -1;
        p = end;
    }
    if (n == 0) return -1;
    a->nconv = n;
    return 0;
}

enum {
    OPT_DATA = 256,
    OPT_TRAIN_SUBSET,
    OPT_TEST_SUBSET,
    OPT_CHANNELS,
    OPT_KERNEL,
    OPT_HIDDEN,
    OPT_BATCH,
    OPT_EPOCHS,
    OPT_ITERS,
    OPT_LR,
    OPT_MOMENTUM,
    OPT_WD,
    OPT_SEED,
    OPT_CODEC,
    OPT_REST_CODEC,
    OPT_ZERO_CODE,
    OPT_NO_WAIT_FREE,
    OPT_OVERLAP_FORWARD,
    OPT_COMM_ORDER,
    OPT_CHUNK_BYTES,
    OPT_SFB,
    OPT_TEXT_DATA,
    OPT_SPARSE_ROUTE,
    OPT_PS_STALENESS,
    OPT_PS_PARTITIONS,
    OPT_VOCAB,
    OPT_EMBED_DIM,
    OPT_BUCKET_BYTES,
    OPT_TIMELINE,
    OPT_TIMELINE_STEP,
    OPT_SLICE,
    OPT_REUSE,
    OPT_EPS,
    OPT_VOTE,
    OPT_WARMUP,
    OPT_SAMPLE,
    OPT_COMPRESSED,
    OPT_SAMPLE_CODEC,
    OPT_QSGD_BITS,
    OPT_QSGD_BUCKET,
    OPT_WIRE,
    OPT_EF,
    OPT_NO_EF,
    OPT_MAX_DIMS,
    OPT_PRINT_EVERY,
    OPT_EVAL_EVERY,
    OPT_CHECK_EVERY,
    OPT_STOP_AT,
    OPT_STOP_STEP,
    OPT_ELASTIC,
    OPT_COMMIT_DIR,
    OPT_RESUME,
    OPT_REPLACE,
    OPT_JOIN,
    OPT_JOIN_RANK,
    OPT_JOIN_SIZE,
    OPT_JOIN_FIRST,
    OPT_DIE,
    OPT_LOG,
    OPT_DUMP,
    OPT_DUMP_LAYER,
    OPT_DUMP_ITERS,
    OPT_COSINE,
    OPT_SAMPLE_SLICES,
    OPT_MODEL,
    OPT_BLOCKS,
    OPT_DEPTH,
    OPT_POWER_RANK,
    OPT_BASIS,
    OPT_STAGES,
    OPT_SCHEDULE,
    OPT_PREDICT_DISTANCE,
    OPT_NO_FLUSH,
    OPT_OVERLAP_TRANSFERS,
    OPT_MICRO,
    OPT_INT_BITS,
    OPT_EF_BOUND,
    OPT_NO_PROGRESS
};

static const struct option long_opts[] = {
    {"help", no_argument, NULL, 'h'},
    {"data", required_argument, NULL, OPT_DATA},
    {"train-subset", required_argument, NULL, OPT_TRAIN_SUBSET},
    {"test-subset", required_argument, NULL, OPT_TEST_SUBSET},
    {"channels", required_argument, NULL, OPT_CHANNELS},
    {"kernel", required_argument, NULL, OPT_KERNEL},
    {"hidden", required_argument, NULL, OPT_HIDDEN},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"epochs", required_argument, NULL, OPT_EPOCHS},
    {"iters", required_argument, NULL, OPT_ITERS},
    {"lr", required_argument, NULL, OPT_LR},
    {"momentum", required_argument, NULL, OPT_MOMENTUM},
    {"cosine", no_argument, NULL, OPT_COSINE},
    {"sample-slices", required_argument, NULL, OPT_SAMPLE_SLICES},
    {"wd", required_argument, NULL, OPT_WD},
    {"seed", required_argument, NULL, OPT_SEED},
    {"codec", required_argument, NULL, OPT_CODEC},
    {"rest-codec", required_argument, NULL, OPT_REST_CODEC},
    {"zero-code", no_argument, NULL, OPT_ZERO_CODE},
    {"no-wait-free", no_argument, NULL, OPT_NO_WAIT_FREE},
    {"overlap-forward", no_argument, NULL, OPT_OVERLAP_FORWARD},
    {"comm-order", required_argument, NULL, OPT_COMM_ORDER},
    {"chunk-bytes", required_argument, NULL, OPT_CHUNK_BYTES},
    {"sfb", required_argument, NULL, OPT_SFB},
    {"text-data", required_argument, NULL, OPT_TEXT_DATA},
    {"sparse-route", required_argument, NULL, OPT_SPARSE_ROUTE},
    {"ps-staleness", required_argument, NULL, OPT_PS_STALENESS},
    {"ps-partitions", required_argument, NULL, OPT_PS_PARTITIONS},
    {"vocab", required_argument, NULL, OPT_VOCAB},
    {"embed-dim", required_argument, NULL, OPT_EMBED_DIM},
    {"bucket-bytes", required_argument, NULL, OPT_BUCKET_BYTES},
    {"timeline", required_argument, NULL, OPT_TIMELINE},
    {"timeline-step", required_argument, NULL, OPT_TIMELINE_STEP},
    {"slice", required_argument, NULL, OPT_SLICE},
    {"reuse", required_argument, NULL, OPT_REUSE},
    {"eps", required_argument, NULL, OPT_EPS},
    {"vote-threshold", required_argument, NULL, OPT_VOTE},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"sample", required_argument, NULL, OPT_SAMPLE},
    {"compressed", required_argument, NULL, OPT_COMPRESSED},
    {"sample-codec", required_argument, NULL, OPT_SAMPLE_CODEC},
    {"qsgd-bits", required_argument, NULL, OPT_QSGD_BITS},
    {"qsgd-bucket", required_argument, NULL, OPT_QSGD_BUCKET},
    {"wire", required_argument, NULL, OPT_WIRE},
    {"ef", no_argument, NULL, OPT_EF},
    {"no-ef", no_argument, NULL, OPT_NO_EF},
    {"max-dims", required_argument, NULL, OPT_MAX_DIMS},
    {"print-every", required_argument, NULL, OPT_PRINT_EVERY},
    {"eval-every", required_argument, NULL, OPT_EVAL_EVERY},
    {"check-every", required_argument, NULL, OPT_CHECK_EVERY},
    {"stop-at", required_argument, NULL, OPT_STOP_AT},
    {"stop-step", required_argument, NULL, OPT_STOP_STEP},
    {"elastic", required_argument, NULL, OPT_ELASTIC},
    {"commit-dir", required_argument, NULL, OPT_COMMIT_DIR},
    {"resume", required_argument, NULL, OPT_RESUME},
    {"replace", no_argument, NULL, OPT_REPLACE},
    {"join", required_argument, NULL, OPT_JOIN},
    {"join-rank", required_argument, NULL, OPT_JOIN_RANK},
    {"join-size", required_argument, NULL, OPT_JOIN_SIZE},
    {"join-first", required_argument, NULL, OPT_JOIN_FIRST},
    {"die", required_argument, NULL, OPT_DIE},
    {"log", required_argument, NULL, OPT_LOG},
    {"dump-grads", required_argument, NULL, OPT_DUMP},
    {"dump-layer", required_argument, NULL, OPT_DUMP_LAYER},
    {"dump-iters", required_argument, NULL, OPT_DUMP_ITERS},
    {"model", required_argument, NULL, OPT_MODEL},
    {"blocks", required_argument, NULL, OPT_BLOCKS},
    {"depth", required_argument, NULL, OPT_DEPTH},
    {"power-rank", required_argument, NULL, OPT_POWER_RANK},
    {"basis", required_argument, NULL, OPT_BASIS},
    {"stages", required_argument, NULL, OPT_STAGES},
    {"schedule", required_argument, NULL, OPT_SCHEDULE},
    {"predict-distance", required_argument, NULL, OPT_PREDICT_DISTANCE},
    {"no-flush", no_argument, NULL, OPT_NO_FLUSH},
    {"overlap-transfers", no_argument, NULL, OPT_OVERLAP_TRANSFERS},
    {"micro-batches", required_argument, NULL, OPT_MICRO},
    {"int-bits", required_argument, NULL, OPT_INT_BITS},
    {"ef-bound", required_argument, NULL, OPT_EF_BOUND},
    {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
    {NULL, 0, NULL, 0}};

/* The option groups: each takes option c, with its argument arg, when it is one of the group's
 * (returns 1, with *what naming the option and its range when arg is bad); else returns 0. */

/* The data and the model: the image sets, the network's shape, --batch, and --model text's
 * corpus and embedding. */
static int parse_model_opt(int c, const char *arg, train_opts_t *o, int *batch_given,
                           const char **what) {
    switch (c) {
    case OPT_DATA:
        o->data_dir = arg;
        break;
    case OPT_TRAIN_SUBSET:
        if (parse_int(arg, 0, 1 << 24, &o->train_subset)) *what = "--train-subset (>= 0)";
        break;
    case OPT_TEST_SUBSET:
        if (parse_int(arg, 0, 1 << 24, &o->test_subset)) *what = "--test-subset (>= 0)";
        break;
    case OPT_CHANNELS:
        if (parse_channels(arg, &o->arch)) *what = "--channels (1..8 numbers, comma-separated)";
        break;
    case OPT_KERNEL:
        if (parse_int(arg, 1, 15, &o->arch.ksize) || o->arch.ksize % 2 == 0)
            *what = "--kernel (odd, 1..15)";
        break;
    case OPT_HIDDEN:
        if (parse_int(arg, 0, 1 << 16, &o->arch.hidden)) *what = "--hidden (>= 0)";
        break;
    case OPT_BATCH:
        if (parse_int(arg, 1, 1 << 20, &o->batch)) *what = "--batch (>= 1)";
        *batch_given = 1;
        break;
    case OPT_MODEL:
        if (strcmp(arg, "cnn") == 0)
            o->arch.model = NET_CNN;
        else if (strcmp(arg, "resnet") == 0)
            o->arch.model = NET_RESNET;
        else if (strcmp(arg, "mlp") == 0)
            o->arch.model = NET_MLP;
        else if (strcmp(arg, "text") == 0)
            o->text = 1;
        else
            *what = "--model (cnn, resnet, mlp or text)";
        break;
    case OPT_BLOCKS:
        if (parse_int(arg, 1, 64, &o->arch.blocks)) *what = "--blocks (1..64)";
        break;
    case OPT_DEPTH:
        if (parse_int(arg, 1, 16, &o->arch.depth)) *what = "--depth (1..16)";
        break;
    case OPT_TEXT_DATA:
        o->text_data = arg;
        break;
    case OPT_VOCAB:
        if (parse_int(arg, 16, 1 << 24, &o->vocab)) *what = "--vocab (16..2^24)";
        break;
    case OPT_EMBED_DIM:
        if (parse_int(arg, 1, 256, &o->embed_dim)) *what = "--embed-dim (1..256)";
        break;
    default:
        return 0;
    }
    return 1;
}

/* The optimizer: how long, SGD's rates, the seed. */
static int parse_optimizer_opt(int c, const char *arg, train_opts_t *o, const char **what) {
    long seed;
    switch (c) {
    case OPT_EPOCHS:
        if (parse_int(arg, 1, 100000, &o->epochs)) *what = "--epochs (>= 1)";
        break;
    case OPT_ITERS:
        if (parse_long(arg, 1, 1L << 40, &o->iters)) *what = "--iters (>= 1)";
        break;
    case OPT_LR:
        if (parse_double(arg, 0.0, 100.0, &o->lr)) *what = "--lr (0..100)";
        break;
    case OPT_COSINE:
        o->cosine = 1;
        break;
    case OPT_MOMENTUM:
        if (parse_double(arg, 0.0, 0.999999, &o->momentum)) *what = "--momentum ([0, 1))";
        break;
    case OPT_WD:
        if (parse_double(arg, 0.0, 1.0, &o->weight_decay)) *what = "--wd ([0, 1])";
        break;
    case OPT_SEED:
        if (parse_long(arg, 0, 1L << 40, &seed))
            *what = "--seed (>= 0)";
        else
            o->seed = (unsigned long long)seed;
        break;
    default:
        return 0;
    }
    return 1;
}

/* The aggregation through gvq: the codecs, the training layer's schedule and routes. */
static int parse_aggregation_opt(int c, const char *arg, train_opts_t *o, const char **what) {
    switch (c) {
    case OPT_CODEC:
        if (parse_codec(arg, 1, 1, &o->codec)) *what = "--codec (none, gradiveq, qsgd or powersgd)";
        break;
    case OPT_REST_CODEC:
        if (parse_codec(arg, 0, 1, &o->rest_codec)) *what = "--rest-codec (none, qsgd or powersgd)";
        break;
    case OPT_ZERO_CODE:
        o->zero_code = 1;
        break;
    case OPT_NO_WAIT_FREE:
        o->no_wait_free = 1;
        break;
    case OPT_OVERLAP_FORWARD:
        o->overlap_forward = 1;
        break;
    case OPT_COMM_ORDER:
        o->comm_order = !strcmp(arg, "ready")     ? gvqTrainScheduleReady
                        : !strcmp(arg, "forward") ? gvqTrainScheduleForward
                                                  : -1;
        if (o->comm_order == -1) *what = "--comm-order (ready or forward)";
        break;
    case OPT_CHUNK_BYTES:
        if (parse_int(arg, 1024, 1 << 30, &o->chunk_bytes)) *what = "--chunk-bytes (1024..2^30)";
        break;
    case OPT_SPARSE_ROUTE:
        o->sparse_route = !strcmp(arg, "ps")           ? gvqRoutePs
                          : !strcmp(arg, "allgatherv") ? gvqRouteAllGatherv
                          : !strcmp(arg, "dense")      ? gvqRouteAllReduce
                          : !strcmp(arg, "auto")       ? GVQ_CONFIG_UNDEF_INT
                                                       : -1;
        if (o->sparse_route == -1) *what = "--sparse-route (ps, allgatherv, dense or auto)";
        break;
    case OPT_PS_STALENESS:
        if (parse_int(arg, 0, 1000, &o->ps_staleness)) *what = "--ps-staleness (0..1000)";
        break;
    case OPT_PS_PARTITIONS:
        if (parse_int(arg, 1, 1 << 20, &o->ps_partitions)) *what = "--ps-partitions (1..2^20)";
        break;
    case OPT_SFB:
        o->sfb = !strcmp(arg, "full") ? 0 : !strcmp(arg, "on") ? 1 : !strcmp(arg, "auto") ? 2 : -2;
        if (o->sfb == -2) *what = "--sfb (full, on or auto)";
        break;
    case OPT_BUCKET_BYTES:
        if (parse_int(arg, 0, 1 << 30, &o->bucket_bytes)) *what = "--bucket-bytes (0..2^30)";
        break;
    default:
        return 0;
    }
    return 1;
}

/* The compressors' settings: GradiVeQ's schedule and basis, QSGD, PowerSGD, error feedback,
 * the wire. */
static int parse_compression_opt(int c, const char *arg, train_opts_t *o, const char **what) {
    switch (c) {
    case OPT_BASIS:
        if (strcmp(arg, "fit") == 0 || strcmp(arg, "track") == 0)
            o->basis_track = strcmp(arg, "track") == 0;
        else
            *what = "--basis (fit or track)";
        break;
    case OPT_POWER_RANK:
        if (parse_int(arg, 1, 1 << 20, &o->power_rank)) *what = "--power-rank (>= 1)";
        break;
    case OPT_INT_BITS:
        if (parse_int(arg, 0, 16, &o->integer_bits) ||
            (o->integer_bits != 0 && o->integer_bits != 8 && o->integer_bits != 16))
            *what = "--int-bits (0, 8 or 16)";
        break;
    case OPT_EF_BOUND:
        if (parse_double(arg, 0.0, 1e9, &o->ef_bound)) *what = "--ef-bound (>= 0)";
        break;
    case OPT_SAMPLE_SLICES:
        if (parse_int(arg, 0, 1 << 24, &o->sample_slices)) *what = "--sample-slices (>= 0)";
        break;
    case OPT_SLICE:
        if (parse_int(arg, 1, 1 << 20, &o->slice)) *what = "--slice (>= 1)";
        break;
    case OPT_REUSE:
        if (parse_int(arg, 1, 1 << 24, &o->reuse)) *what = "--reuse (>= 1)";
        break;
    case OPT_EPS:
        if (parse_double(arg, 1e-9, 0.999999, &o->eps)) *what = "--eps (in (0, 1))";
        break;
    case OPT_VOTE:
        if (parse_double(arg, 1e-9, 1e9, &o->vote)) *what = "--vote-threshold (> 0)";
        break;
    case OPT_WARMUP:
        if (parse_int(arg, 0, 1 << 30, &o->warmup)) *what = "--warmup (>= 0)";
        break;
    case OPT_SAMPLE:
        if (parse_int(arg, 1, 1 << 30, &o->sample)) *what = "--sample (>= 1)";
        break;
    case OPT_COMPRESSED:
        if (parse_int(arg, 1, 1 << 30, &o->compressed)) *what = "--compressed (>= 1)";
        break;
    case OPT_SAMPLE_CODEC:
        if (parse_codec(arg, 0, 0, &o->sample_codec)) *what = "--sample-codec (none or qsgd)";
        break;
    case OPT_QSGD_BITS:
        if (parse_int(arg, 2, 8, &o->qsgd_bits)) *what = "--qsgd-bits (2, 4 or 8)";
        break;
    case OPT_QSGD_BUCKET:
        if (parse_int(arg, 1, 1 << 24, &o->qsgd_bucket)) *what = "--qsgd-bucket (>= 1)";
        break;
    case OPT_WIRE:
        if (strcmp(arg, "fp16") == 0)
            o->wire_fp16 = 1;
        else if (strcmp(arg, "fp32") == 0)
            o->wire_fp16 = 0;
        else
            *what = "--wire (fp16 or fp32)";
        break;
    case OPT_EF:
        o->error_feedback = 1;
        break;
    case OPT_NO_EF:
        o->error_feedback = 0;
        break;
    case OPT_MAX_DIMS:
        if (parse_int(arg, 1, 1 << 20, &o->max_dims)) *what = "--max-dims (>= 1)";
        break;
    default:
        return 0;
    }
    return 1;
}

/* The pipeline (--stages and what goes with it). */
static int parse_pipeline_opt(int c, const char *arg, train_opts_t *o, const char **what) {
    switch (c) {
    case OPT_STAGES:
        if (parse_int(arg, 1, 64, &o->stages)) *what = "--stages (1..64)";
        break;
    case OPT_SCHEDULE: { /* gvqPipeSchedule_t's order */
        static const char *const names[] = {"gpipe", "pipedream", "dualpipe", "spectrain"};
        o->pipe_schedule = -1;
        for (int i = 0; i < 4; i++)
            if (strcmp(arg, names[i]) == 0) o->pipe_schedule = i;
        if (o->pipe_schedule < 0) *what = "--schedule (gpipe, pipedream, dualpipe, spectrain)";
        break;
    }
    case OPT_PREDICT_DISTANCE: /* gvqPipePredictDistance_t's order */
        o->predict_distance = strcmp(arg, "paper") == 0 ? 0 : strcmp(arg, "schedule") == 0 ? 1 : -1;
        if (o->predict_distance < 0) *what = "--predict-distance (paper, schedule)";
        break;
    case OPT_MICRO:
        if (parse_int(arg, 1, 1 << 16, &o->micro_batches)) *what = "--micro-batches (>= 1)";
        break;
    case OPT_NO_FLUSH:
        o->pipe_no_flush = 1;
        break;
    case OPT_OVERLAP_TRANSFERS:
        o->pipe_overlap = 1;
        break;
    default:
        return 0;
    }
    return 1;
}

/* The output: progress lines, evaluation, checks, stopping, the log, the timeline, gradient
 * recording. */
static int parse_output_opt(int c, const char *arg, train_opts_t *o, const char **what) {
    switch (c) {
    case OPT_TIMELINE:
        o->timeline_path = arg;
        break;
    case OPT_TIMELINE_STEP:
        if (parse_long(arg, 1, 1L << 40, &o->timeline_step)) *what = "--timeline-step (>= 1)";
        break;
    case OPT_NO_PROGRESS:
        o->progress = 0;
        break;
    case OPT_PRINT_EVERY:
        if (parse_int(arg, 1, 1 << 30, &o->print_every)) *what = "--print-every (>= 1)";
        break;
    case OPT_EVAL_EVERY:
        if (parse_int(arg, 0, 1 << 30, &o->eval_every)) *what = "--eval-every (>= 0)";
        break;
    case OPT_CHECK_EVERY:
        if (parse_int(arg, 0, 1 << 30, &o->check_every)) *what = "--check-every (>= 0)";
        break;
    case OPT_STOP_AT:
        if (parse_double(arg, 0.0, 100.0, &o->stop_at)) *what = "--stop-at (0..100)";
        break;
    case OPT_STOP_STEP:
        if (parse_long(arg, 1, 1L << 40, &o->stop_step)) *what = "--stop-step (>= 1)";
        break;
    case OPT_ELASTIC:
        if (parse_int(arg, 1, 1 << 30, &o->elastic)) *what = "--elastic (>= 1)";
        break;
    case OPT_COMMIT_DIR:
        o->commit_dir = arg;
        break;
    case OPT_RESUME:
        o->resume_dir = arg;
        break;
    case OPT_REPLACE:
        o->replace = 1;
        break;
    case OPT_JOIN:
        o->join_hex = arg;
        break;
    case OPT_JOIN_RANK:
        if (parse_int(arg, 1, 1 << 20, &o->join_rank)) *what = "--join-rank";
        break;
    case OPT_JOIN_SIZE:
        if (parse_int(arg, 2, 1 << 20, &o->join_size)) *what = "--join-size";
        break;
    case OPT_JOIN_FIRST:
        if (parse_int(arg, 0, 1 << 20, &o->join_first)) *what = "--join-first";
        break;
    case OPT_DIE: {
        int rr = -1;
        long st = -1;
        char tail = 0;
        if (o->ndie >= 8 || sscanf(arg, "%d:%ld%c", &rr, &st, &tail) != 2 || rr < 0 || st < 0)
            *what = "--die (R:S, at most 8)";
        else
            o->die_rank[o->ndie] = rr, o->die_step[o->ndie++] = st;
        break;
    }
    case OPT_LOG:
        o->log_path = arg;
        break;
    case OPT_DUMP:
        o->dump_path = arg;
        break;
    case OPT_DUMP_LAYER:
        if (parse_int(arg, 1, 1 << 20, &o->dump_layer)) *what = "--dump-layer (>= 1)";
        break;
    case OPT_DUMP_ITERS:
        if (parse_long(arg, 0, 1L << 40, &o->dump_iters)) *what = "--dump-iters (>= 0)";
        break;
    default:
        return 0;
    }
    return 1;
}

/* Settles what depends on the model (the resnet's batch, the mlp's layers) and refuses the
 * options that do not go together: 0, or -1 after saying why on stderr. */
static int check_args(train_opts_t *o, int batch_given) {
    if (o->arch.model == NET_RESNET && !batch_given) o->batch = 0; /* 32 per rank */
    if (o->arch.model == NET_RESNET && (o->arch.nconv != 3 || o->arch.hidden != 0)) {
        fprintf(stderr, "gvq-train: --model resnet takes 3 --channels (the stages' widths) and no "
                        "--hidden layer\n");
        return -1;
    }
    if (o->arch.model != NET_RESNET && o->arch.blocks != 1) {
        fprintf(stderr, "gvq-train: --blocks applies to --model resnet\n");
        return -1;
    }
    if ((o->pipe_no_flush || o->pipe_overlap) && o->stages < 1) {
        fprintf(stderr, "gvq-train: --no-flush and --overlap-transfers apply to --stages\n");
        return -1;
    }
    if (o->pipe_no_flush && (o->micro_batches > 0 ? o->micro_batches : 4) < o->stages - 1) {
        fprintf(stderr, "gvq-train: --no-flush needs --micro-batches >= --stages - 1 (the next "
                        "step's first forwards fit in its micro-batches)\n");
        return -1;
    }
    if (o->pipe_no_flush && o->pipe_schedule == 0) {
        fprintf(stderr, "gvq-train: --no-flush needs --schedule pipedream, dualpipe or spectrain "
                        "(gpipe flushes every step)\n");
        return -1;
    }
    if (o->arch.model != NET_MLP && o->arch.depth != 0) {
        fprintf(stderr, "gvq-train: --depth applies to --model mlp\n");
        return -1;
    }
    if (o->arch.model == NET_MLP) { /* no convs; 3 hidden layers of 1024 unless told */
        o->arch.nconv = 0;
        if (o->arch.hidden == 0) o->arch.hidden = 1024;
        if (o->arch.depth == 0) o->arch.depth = 3;
    }
    if (o->eval_every > 0 && o->eval_every % o->print_every != 0) {
        fprintf(stderr, "gvq-train: --eval-every (%d) must be a multiple of --print-every (%d)\n",
                o->eval_every, o->print_every);
        return -1;
    }
    if (o->overlap_forward &&
        (o->zero_code || o->no_wait_free || o->stages > 0 || o->text || o->sfb != TRAIN_UNSET)) {
        fprintf(stderr, "gvq-train: --overlap-forward needs the training layer with wait-free "
                        "backprop and an image model (not --zero-code, --no-wait-free, --stages, "
                        "--model text, or --sfb: the factors are the fc's activations, which the "
                        "next forward pass overwrites before the step ends)\n");
        return -1;
    }
    if ((o->elastic > 0 || o->ndie > 0) &&
        (o->stages > 0 || o->text || o->overlap_forward || o->dump_path != NULL)) {
        fprintf(stderr, "gvq-train: --elastic and --die apply to data-parallel image models "
                        "without --overlap-forward and --dump-grads\n");
        return -1;
    }
    if (o->commit_dir != NULL && o->elastic <= 0) {
        fprintf(stderr, "gvq-train: --commit-dir needs --elastic K (the commits it writes)\n");
        return -1;
    }
    /* a replacement (--join) ignores --resume: it takes the members' state */
    if (o->resume_dir != NULL && (o->stages > 0 || o->text || o->overlap_forward)) {
        fprintf(stderr, "gvq-train: --resume applies to data-parallel image models (not "
                        "--stages, --model text or --overlap-forward)\n");
        return -1;
    }
    if ((o->replace || o->join_hex != NULL) && o->elastic <= 0) {
        fprintf(stderr, "gvq-train: --replace needs --elastic\n");
        return -1;
    }
    if (o->join_hex != NULL && (o->join_rank <= 0 || o->join_size <= o->join_rank)) {
        fprintf(stderr, "gvq-train: --join needs --join-rank R and --join-size N > R\n");
        return -1;
    }
    if ((o->ps_staleness >= 0 || o->ps_partitions > 0) && !o->text) {
        fprintf(stderr, "gvq-train: --ps-staleness and --ps-partitions apply to --model text "
                        "(its embedding's parameter server)\n");
        return -1;
    }
    if (o->stop_step > 0 && (o->stages > 0 || o->text)) {
        fprintf(stderr, "gvq-train: --stop-step applies to data-parallel image models (not "
                        "--stages or --model text)\n");
        return -1;
    }
    if (o->zero_code && (o->codec == TRAIN_CODEC_QSGD || o->codec == TRAIN_CODEC_POWERSGD ||
                         o->rest_codec != TRAIN_CODEC_NONE)) {
        fprintf(stderr, "gvq-train: --zero-code uses plain gvqAllReduce only; choose the codec "
                        "with GVQ_CODEC instead of --codec/--rest-codec\n");
        return -1;
    }
    return 0;
}

/* Returns 0, 1 for --help, or -1 after naming the bad option on stderr. */
static int parse_args(int argc, char **argv, train_opts_t *o) {
    int batch_given = 0;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        const char *what = NULL;
        if (c == 'h') return 1;
        if (!parse_model_opt(c, optarg, o, &batch_given, &what) &&
            !parse_optimizer_opt(c, optarg, o, &what) &&
            !parse_aggregation_opt(c, optarg, o, &what) &&
            !parse_compression_opt(c, optarg, o, &what) &&
            !parse_pipeline_opt(c, optarg, o, &what) && !parse_output_opt(c, optarg, o, &what)) {
            fprintf(stderr, "gvq-train: unknown option '%s' (see -h)\n", argv[optind - 1]);
            return -1;
        }
        if (what != NULL) {
            fprintf(stderr, "gvq-train: bad value '%s' for %s\n", optarg, what);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gvq-train: unexpected argument '%s' (see -h)\n", argv[optind]);
        return -1;
    }
    return check_args(o, batch_given);
}

/* Whether what rank 0 writes to stderr ends on a terminal. Under mpirun a rank's stderr is a
 * pipe to mpirun (and its stdout a pseudo-terminal whatever mpirun's own output is), so then
 * mpirun's stderr decides: mpirun is the parent of the ranks it starts on its own host. */
static int stderr_is_terminal(void) {
    if (isatty(STDERR_FILENO)) return 1;
    struct stat st;
    if (getenv("OMPI_COMM_WORLD_RANK") == NULL || fstat(STDERR_FILENO, &st) != 0 ||
        !S_ISFIFO(st.st_mode))
        return 0;
    char link[64], target[256];
    snprintf(link, sizeof link, "/proc/%ld/fd/2", (long)getppid());
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return 0;
    target[n] = '\0';
    return strncmp(target, "/dev/pts/", 9) == 0 || strncmp(target, "/dev/tty", 8) == 0;
}

/* --model text: --batch counts documents per rank (default 64). */
static int batch_given_text(const train_opts_t *o) {
    return o->batch > 0 ? o->batch : 64;
}

/* Started by mpirun (or srun with PMI), or by a launcher that only sets torchrun's or Slurm's
 * variables: then the data-parallel run meets through gvqCommInitFromEnv and MPI is not used,
 * so a process that dies ends no job (--elastic). */
static int under_mpi(void) {
    if (getenv("OMPI_COMM_WORLD_RANK") != NULL || getenv("PMIX_RANK") != NULL ||
        getenv("PMI_RANK") != NULL)
        return 1;
    return !((getenv("RANK") != NULL && getenv("WORLD_SIZE") != NULL) ||
             getenv("SLURM_PROCID") != NULL);
}

int main(int argc, char **argv) {
    int provided = 0; /* the training layer's stream runs MPI from its progress thread */
    const int mpi = under_mpi();
    int rank = 0;
    if (mpi) {
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    } else {
        const char *e = getenv("RANK") != NULL ? getenv("RANK") : getenv("SLURM_PROCID");
        rank = e != NULL ? atoi(e) : 0;
    }
    train_opts_t o;
    train_opts_default(&o);
    o.progress = rank == 0 && stderr_is_terminal();
    o.argc = argc;
    o.argv = argv;
    int p = parse_args(argc, argv, &o);
    if (p == 0 && !mpi && (o.text || o.stages > 0)) {
        fprintf(stderr, "gvq-train: --model text and --stages run under mpirun only\n");
        p = -1;
    }
    if (p == 0 && mpi && o.replace) { /* a replacement cannot join an MPI job */
        fprintf(stderr, "gvq-train: --replace needs a start without mpirun (a launcher's "
                        "environment, e.g. scripts/gvq-launch.sh)\n");
        p = -1;
    }
    if (p != 0) {
        if (rank == 0) usage(p > 0 ? stdout : stderr);
        if (mpi) MPI_Finalize();
        return p > 0 ? 0 : 2;
    }
    if (o.text) {
        text_opts_t t = {o.text_data ? o.text_data : "apt-text.tsv",
                         o.vocab,
                         o.embed_dim,
                         batch_given_text(&o),
                         o.epochs,
                         o.iters,
                         o.lr,
                         o.seed,
                         o.sparse_route,
                         o.print_every,
                         o.ps_staleness,
                         o.ps_partitions};
        int trc = text_run(&t);
        MPI_Finalize();
        return trc == 0 ? 0 : 1;
    }
    train_result_t res;
    int rc = o.stages > 0 ? pipe_run(&o, MPI_COMM_WORLD, &res)
                          : train_run(&o, mpi ? MPI_COMM_WORLD : MPI_COMM_NULL, &res);
    free(res.loss_hist);
    if (rc == 0 && res.sync_mismatches > 0) {
        if (rank == 0)
            fprintf(stderr, "gvq-train: the ranks' weights differed at %ld of %ld checks\n",
                    res.sync_mismatches, res.sync_checks);
        rc = -1;
    }
    if (mpi) MPI_Finalize();
    return rc == 0 ? 0 : 1;
}
