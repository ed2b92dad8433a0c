/*
 * test_train_below.c -- src/train/gvq_train_below.h, the one internal header of the training
 * layer, against the headers of the layers that define what it declares. Included together, any
 * declaration that differs (a parameter's type, a typedef) stops this file from compiling; the
 * run then checks the two functions that exist for the training layer alone against results
 * computed here: gvq_host_sgemm against a 2 x 2 product by hand, and gvq_rule_apply_params
 * against each rule's formula on one row.
 */
#include <math.h>
#include <stdio.h>

#include "gvq_comm.h"
#include "gvq_compressor.h"
#include "gvq_device.h"
#include "gvq_sparse.h"
#include "gvq_stream.h"
#include "gvq_train_below.h"

static int failures;

static void expect(int ok, const char *what) {
    if (!ok) {
        printf("FAIL: %s\n", what);
        failures++;
    }
}

int main(void) {
    /* the declarations are the same functions (the compiler checked the types) */
    gvqResult_t (*check)(gvqComm_t, const char *, int) = gvq_comm_check;
    int (*fuses)(gvqCompressor_t) = gvq_compressor_fuses;
    gvq_job_fn job = NULL;
    expect(check != NULL && fuses != NULL && job == NULL, "declarations");

    /* column-major A = [1 3; 2 4], B = [5 7; 6 8]: A B = [23 31; 34 46] */
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {0};
    expect(gvq_host_sgemm(0, 0, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2) == gvqSuccess, "sgemm rc");
    expect(c[0] == 23 && c[1] == 34 && c[2] == 31 && c[3] == 46, "sgemm values");

    /* one row of 2: SGD w -= lr g s; momentum m = mu m + g s, w -= lr m; Adagrad a += (g s)^2,
     * w -= lr g s / (sqrt(a) + eps) */
    float w[2] = {1, -1}, st[2] = {0.5f, 0}, g[2] = {2, 4};
    gvq_rule_apply_params(gvqPsSgd, 0.1, 0, 0, 0.5, gvqFloat32, 2, w, NULL, g);
    expect(fabsf(w[0] - 0.9f) < 1e-6f && fabsf(w[1] + 1.2f) < 1e-6f, "sgd");
    gvq_rule_apply_params(gvqPsMomentum, 0.1, 0.9, 0, 1.0, gvqFloat32, 2, w, st, g);
    expect(fabsf(st[0] - 2.45f) < 1e-6f && fabsf(st[1] - 4.0f) < 1e-6f, "momentum state");
    expect(fabsf(w[0] - (0.9f - 0.245f)) < 1e-6f && fabsf(w[1] + 1.6f) < 1e-6f, "momentum");
    float w2[1] = {1}, a2[1] = {0}, g2[1] = {3};
    gvq_rule_apply_params(gvqPsAdagrad, 0.1, 0, 1e-8, 1.0, gvqFloat32, 1, w2, a2, g2);
    expect(fabsf(a2[0] - 9.0f) < 1e-6f && fabsf(w2[0] - (1 - 0.1f * 3 / 3)) < 1e-5f, "adagrad");
    if (failures == 0) printf("test_train_below: declarations agree, sgemm and rules correct\n");
    return failures != 0;
}
