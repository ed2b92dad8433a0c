/*
 * test_nccl_port.c -- an NCCL program with host buffers, written exactly as an NCCL user writes
 * one: nccl.h, ncclUniqueId, ncclGetUniqueId on rank 0 + MPI_Bcast, ncclCommInitRank,
 * ncclAllReduce / ncclBroadcast / ncclGroupStart / ncclGroupEnd, ncclCommDestroy.
 *
 * This file is never compiled as it stands. The build copies it with every "nccl" replaced by
 * "gvq" (and every upper-case NCCL by GVQ) and compiles and runs that copy: passing proves that
 * an NCCL program ports to gvq by renaming alone. Keep this file free of gvq names.
 *
 * The stream argument is a cudaStream_t in NCCL; host buffers need none, so it is NULL.
 * Results are checked against MPI_Allreduce / MPI_Bcast of the same inputs (small integers,
 * exact in every type, reduced by MPI in double precision).
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

static int failures = 0;
static long checks = 0;
static int myRank = 0;

#define MPICHECK(cmd)                                                                      \
    do {                                                                                   \
        int e = cmd;                                                                       \
        if (e != MPI_SUCCESS) {                                                            \
            printf("FAIL [rank %d] %s:%d: MPI error %d\n", myRank, __FILE__, __LINE__, e); \
            exit(EXIT_FAILURE);                                                            \
        }                                                                                  \
    } while (0)

#define NCCLCHECK(cmd)                                                                        \
    do {                                                                                      \
        ncclResult_t r = cmd;                                                                 \
        checks++;                                                                             \
        if (r != ncclSuccess) {                                                               \
            printf("FAIL [rank %d] %s:%d: %s: NCCL error '%s'\n", myRank, __FILE__, __LINE__, \
                   #cmd, ncclGetErrorString(r));                                              \
            failures++;                                                                       \
        }                                                                                     \
    } while (0)

static const ncclDataType_t types[] = {ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,
                                       ncclInt64,   ncclUint64,  ncclFloat16, ncclFloat32,
                                       ncclFloat64, ncclBfloat16};
static const char *typeNames[] = {"ncclInt8",    "ncclUint8",   "ncclInt32",   "ncclUint32",
                                  "ncclInt64",   "ncclUint64",  "ncclFloat16", "ncclFloat32",
                                  "ncclFloat64", "ncclBfloat16"};
static const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
static const char *opNames[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};

static size_t typeSize(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    default:
        return 8;
    }
}

/* half and bfloat16 of small integers (|v| <= 2048), as a user would convert them. */
static uint16_t toHalf(double v) {
    if (v == 0) return 0;
    uint16_t s = v < 0 ? 0x8000 : 0;
    int e;
    double m = frexp(fabs(v), &e);
    return (uint16_t)(s | (unsigned)(e + 14) << 10 | (unsigned)((2 * m - 1) * 1024));
}
static double fromHalf(uint16_t h) {
    int e = (h >> 10) & 31, f = h & 1023;
    double v = e == 0 ? ldexp(f, -24) : ldexp(1024 + f, e - 25);
    return (h & 0x8000) ? -v : v;
}
static uint16_t toBf16(double v) {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}
static double fromBf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void store(ncclDataType_t t, void *buf, size_t i, double v) {
    char *p = (char *)buf + i * typeSize(t);
    switch (t) {
    case ncclInt8: {
        int8_t x = (int8_t)v;
        memcpy(p, &x, 1);
        break;
    }
    case ncclUint8: {
        uint8_t x = (uint8_t)v;
        memcpy(p, &x, 1);
        break;
    }
    case ncclInt32: {
        int32_t x = (int32_t)v;
        memcpy(p, &x, 4);
        break;
    }
    case ncclUint32: {
        uint32_t x = (uint32_t)v;
        memcpy(p, &x, 4);
        break;
    }
    case ncclInt64: {
        int64_t x = (int64_t)v;
        memcpy(p, &x, 8);
        break;
    }
    case ncclUint64: {
        uint64_t x = (uint64_t)v;
        memcpy(p, &x, 8);
        break;
    }
    case ncclFloat16: {
        uint16_t x = toHalf(v);
        memcpy(p, &x, 2);
        break;
    }
    case ncclBfloat16: {
        uint16_t x = toBf16(v);
        memcpy(p, &x, 2);
        break;
    }
    case ncclFloat32: {
        float x = (float)v;
        memcpy(p, &x, 4);
        break;
    }
    default:
        memcpy(p, &v, 8);
        break;
    }
}

static double load(ncclDataType_t t, const void *buf, size_t i) {
    const char *p = (const char *)buf + i * typeSize(t);
    switch (t) {
    case ncclInt8: {
        int8_t x;
        memcpy(&x, p, 1);
        return x;
    }
    case ncclUint8: {
        uint8_t x;
        memcpy(&x, p, 1);
        return x;
    }
    case ncclInt32: {
        int32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    case ncclUint32: {
        uint32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    case ncclInt64: {
        int64_t x;
        memcpy(&x, p, 8);
        return (double)x;
    }
    case ncclUint64: {
        uint64_t x;
        memcpy(&x, p, 8);
        return (double)x;
    }
    case ncclFloat16: {
        uint16_t x;
        memcpy(&x, p, 2);
        return fromHalf(x);
    }
    case ncclBfloat16: {
        uint16_t x;
        memcpy(&x, p, 2);
        return fromBf16(x);
    }
    case ncclFloat32: {
        float x;
        memcpy(&x, p, 4);
        return x;
    }
    default: {
        double x;
        memcpy(&x, p, 8);
        return x;
    }
    }
}

static int isUnsigned(ncclDataType_t t) {
    return t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
}
static int isFloating(ncclDataType_t t) {
    return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16;
}

/* Small integers, exact in every type; products of 5 ranks stay within int8. */
static double inputValue(ncclDataType_t t, ncclRedOp_t op, int rank, size_t i) {
    unsigned h = (unsigned)(i * 2654435761u) ^ (unsigned)(rank * 40503u + (unsigned)t * 977u);
    h ^= h >> 13;
    if (op == ncclProd)
        return isUnsigned(t) ? (double)(1 + h % 2) : (h % 2 ? -1.0 : 1.0) * (1 + (h >> 1) % 2);
    if (op == ncclMax || op == ncclMin)
        return isUnsigned(t) ? (double)(h % 200) : (double)(h % 201) - 100;
    return isUnsigned(t) ? (double)(h % 17) : (double)(h % 17) - 8;
}

static void testAllReduce(ncclComm_t comm, int nRanks, ncclDataType_t t, ncclRedOp_t op,
                          size_t count, int inPlace, const char *tName, const char *opName) {
    size_t bytes = count * typeSize(t);
    void *sendbuff = malloc(bytes + 1), *recvbuff = malloc(bytes + 1);
    double *in = malloc(count * sizeof(double) + 1), *ref = malloc(count * sizeof(double) + 1);
    for (size_t i = 0; i < count; i++) {
        in[i] = inputValue(t, op, myRank, i);
        store(t, sendbuff, i, in[i]);
    }
    MPI_Op mop = op == ncclProd  ? MPI_PROD
                 : op == ncclMax ? MPI_MAX
                 : op == ncclMin ? MPI_MIN
                                 : MPI_SUM;
    MPICHECK(MPI_Allreduce(in, ref, (int)count, MPI_DOUBLE, mop, MPI_COMM_WORLD));

    if (inPlace) {
        NCCLCHECK(ncclAllReduce(sendbuff, sendbuff, count, t, op, comm, NULL));
        memcpy(recvbuff, sendbuff, bytes);
    } else {
        memset(recvbuff, 0, bytes);
        NCCLCHECK(ncclAllReduce((const void *)sendbuff, recvbuff, count, t, op, comm, NULL));
    }

    int bad = 0;
    for (size_t i = 0; i < count; i++) {
        double want = ref[i];
        if (op == ncclAvg) want = isFloating(t) ? want / nRanks : (double)((int64_t)want / nRanks);
        double got = load(t, recvbuff, i);
        double tol = 0;
        if (op == ncclAvg && isFloating(t))
            tol = (t == ncclFloat16 || t == ncclBfloat16) ? 1e-2 * fabs(want) : 1e-6 * fabs(want);
        if (fabs(got - want) > tol || got != got) {
            if (bad < 3)
                printf("FAIL [rank %d] ncclAllReduce %s %s count %zu %s: element %zu: expected "
                       "%.9g, got %.9g\n",
                       myRank, tName, opName, count, inPlace ? "in-place" : "out-of-place", i, want,
                       got);
            bad++;
        }
    }
    checks++;
    if (bad) failures++;
    free(sendbuff);
    free(recvbuff);
    free(in);
    free(ref);
}

int main(int argc, char *argv[]) {
    int nRanks;
    MPICHECK(MPI_Init(&argc, &argv));
    MPICHECK(MPI_Comm_rank(MPI_COMM_WORLD, &myRank));
    MPICHECK(MPI_Comm_size(MPI_COMM_WORLD, &nRanks));

    ncclUniqueId id;
    ncclComm_t comm;
    if (myRank == 0) NCCLCHECK(ncclGetUniqueId(&id));
    MPICHECK(MPI_Bcast((void *)&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
    NCCLCHECK(ncclCommInitRank(&comm, nRanks, id, myRank));
    if (failures) {
        printf("FAIL [rank %d] no communicator\n", myRank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    int count = -1, rank = -1, version = 0;
    NCCLCHECK(ncclCommCount(comm, &count));
    NCCLCHECK(ncclCommUserRank(comm, &rank));
    NCCLCHECK(ncclGetVersion(&version));
    checks++;
    if (count != nRanks || rank != myRank || version < NCCL_VERSION_CODE(0, 1, 0)) {
        printf("FAIL [rank %d] count %d rank %d version %d\n", myRank, count, rank, version);
        failures++;
    }

    const size_t counts[] = {0, 1, 7, 4099, 262147};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
        for (int t = 0; t < 10; t++)
            for (int o = 0; o < 5; o++)
                for (int inPlace = 0; inPlace < 2; inPlace++)
                    testAllReduce(comm, nRanks, types[t], ops[o], counts[c], inPlace, typeNames[t],
                                  opNames[o]);

    /* ncclBroadcast from the last rank, compared with MPI_Bcast of the same data */
    {
        const size_t n = 100003;
        float *buf = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            ref[i] = buf[i] = myRank == nRanks - 1 ? (float)i * 0.5f : -1.0f;
        MPICHECK(MPI_Bcast(ref, (int)n, MPI_FLOAT, nRanks - 1, MPI_COMM_WORLD));
        NCCLCHECK(ncclBroadcast(buf, buf, n, ncclFloat, nRanks - 1, comm, NULL));
        checks++;
        if (memcmp(buf, ref, n * sizeof(float)) != 0) {
            printf("FAIL [rank %d] ncclBroadcast differs from MPI_Bcast\n", myRank);
            failures++;
        }
        free(buf);
        free(ref);
    }

    /* two allreduces aggregated in one group, the NCCL way */
    {
        const size_t n = 1000;
        double *a = malloc(n * sizeof(double)), *ra = malloc(n * sizeof(double));
        int *b = malloc(n * sizeof(int)), *rb = malloc(n * sizeof(int));
        for (size_t i = 0; i < n; i++) {
            a[i] = 0.25 * (double)(myRank + (int)i);
            b[i] = (int)i - myRank;
        }
        MPICHECK(MPI_Allreduce(a, ra, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
        MPICHECK(MPI_Allreduce(b, rb, (int)n, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
        NCCLCHECK(ncclGroupStart());
        NCCLCHECK(ncclAllReduce(a, a, n, ncclDouble, ncclSum, comm, NULL));
        NCCLCHECK(ncclAllReduce(b, b, n, ncclInt, ncclMax, comm, NULL));
        NCCLCHECK(ncclGroupEnd());
        checks++;
        if (memcmp(a, ra, n * sizeof(double)) != 0 || memcmp(b, rb, n * sizeof(int)) != 0) {
            printf("FAIL [rank %d] grouped ncclAllReduce differs from MPI_Allreduce\n", myRank);
            failures++;
        }
        free(a);
        free(ra);
        free(b);
        free(rb);
    }

    ncclResult_t asyncErr;
    NCCLCHECK(ncclCommGetAsyncError(comm, &asyncErr));
    checks++;
    if (asyncErr != ncclSuccess) {
        printf("FAIL [rank %d] async error %s\n", myRank, ncclGetErrorString(asyncErr));
        failures++;
    }
    NCCLCHECK(ncclCommDestroy(comm));

    int allFailures = 0;
    long allChecks = 0;
    MPICHECK(MPI_Allreduce(&failures, &allFailures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    MPICHECK(MPI_Allreduce(&checks, &allChecks, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (myRank == 0)
        printf("port test: %s -- %d rank(s), %ld checks, %d failure(s)\n",
               allFailures ? "FAIL" : "PASS", nRanks, allChecks, allFailures);
    MPICHECK(MPI_Finalize());
    return allFailures ? 1 : 0;
}
