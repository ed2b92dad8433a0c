/*
 * test_train_layers.c -- gvq-train's layers (perf/train/net.c) against independent references:
 *
 *   conv forward          a direct 6-deep loop in double (no im2col, no BLAS)
 *   every layer backward  central finite differences of f = sum(out .* R), R random, for the
 *                         input and every parameter (conv, relu, max pool, fc)
 *   softmax cross-entropy finite differences of the mean loss with respect to the logits, and
 *                         the loss against log-sum-exp in double
 *   the whole network     finite differences of the loss for a sample of every parameter block
 *
 * conv and fc are linear in each value, so their differences are exact up to rounding; relu and
 * pool inputs are kept away from their kinks (|x| >= 0.05, distinct values 0.05 apart) so a step
 * of 1e-3 never crosses one. Exit status 0 when every check holds, 1 otherwise.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net.h"

static int g_failures;

static void check(int ok, const char *what, double got, double tol) {
    printf("%-4s %-52s max error %.3g (tolerance %.3g)\n", ok ? "ok" : "FAIL", what, got, tol);
    if (!ok) g_failures++;
}

/* A stand-alone layer with its own buffers and parameters. */
typedef struct {
    layer_t l;
    float *params, *grads;
} test_layer_t;

static void make_layer(test_layer_t *t, layer_kind_t kind, int c, int h, int w, int out_c, int k,
                       int batch, rng_t *rng) {
    layer_t *l = &t->l;
    memset(t, 0, sizeof *t);
    l->kind = kind;
    l->in_c = l->out_c = c;
    l->in_h = l->out_h = h;
    l->in_w = l->out_w = w;
    if (kind == LAYER_CONV) {
        l->out_c = out_c;
        l->ksize = k;
        l->nw = (size_t)out_c * c * k * k;
        l->nb = (size_t)out_c;
    } else if (kind == LAYER_POOL) {
        l->out_h = h / 2;
        l->out_w = w / 2;
    } else if (kind == LAYER_FC) {
        l->out_c = out_c;
        l->out_h = l->out_w = 1;
        l->nw = (size_t)out_c * c * h * w;
        l->nb = (size_t)out_c;
    }
    size_t np = l->nw + l->nb;
    t->params = calloc(np + 1, sizeof(float));
    t->grads = calloc(np + 1, sizeof(float));
    l->w = t->params;
    l->b = t->params + l->nw;
    l->dw = t->grads;
    l->db = t->grads + l->nw;
    for (size_t i = 0; i < np; i++)
        t->params[i] = (float)(0.5 * rng_normal(rng));
    l->out = calloc((size_t)batch * layer_out_size(l), sizeof(float));
    l->dout = calloc((size_t)batch * layer_in_size(l), sizeof(float));
    if (kind == LAYER_CONV) {
        size_t ncol = (size_t)batch * h * w;
        l->cols = calloc(ncol * (size_t)c * k * k, sizeof(float));
        l->tmp = calloc(ncol * (size_t)out_c, sizeof(float));
    }
    if (kind == LAYER_POOL) l->argmax = calloc((size_t)batch * layer_out_size(l), sizeof(int));
}

static void free_layer(test_layer_t *t) {
    free(t->l.out);
    free(t->l.dout);
    free(t->l.cols);
    free(t->l.tmp);
    free(t->l.argmax);
    free(t->params);
    free(t->grads);
}

/* f = sum(out .* R) in double after a forward pass. */
static double objective(layer_t *l, const float *in, const float *R, int batch) {
    layer_forward(l, in, batch);
    size_t n = (size_t)batch * layer_out_size(l);
    double f = 0.0;
    for (size_t i = 0; i < n; i++)
        f += (double)l->out[i] * R[i];
    return f;
}

/* Largest |numeric - analytic| / max(1, |analytic|) over the values x[0..n) perturbed by h. */
static double fd_error(layer_t *l, float *in, const float *R, int batch, float *x, size_t n,
                       const float *analytic, float h) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        float keep = x[i];
        x[i] = keep + h;
        double fp = objective(l, in, R, batch);
        x[i] = keep - h;
        double fm = objective(l, in, R, batch);
        x[i] = keep;
        double num = (fp - fm) / (2.0 * (double)h);
        double err = fabs(num - analytic[i]) / fmax(1.0, fabs(analytic[i]));
        if (err > worst) worst = err;
    }
    return worst;
}

/* Checks one layer's backward pass: input gradient, and weight and bias gradients if any. */
static void check_layer_grads(const char *name, test_layer_t *t, float *in, int batch, float h,
                              double tol, rng_t *rng) {
    layer_t *l = &t->l;
    size_t nin = (size_t)batch * layer_in_size(l), nout = (size_t)batch * layer_out_size(l);
    float *R = malloc(sizeof(float) * nout);
    float *din = malloc(sizeof(float) * nin);
    float *dparams = malloc(sizeof(float) * (l->nw + l->nb + 1));
    for (size_t i = 0; i < nout; i++)
        R[i] = (float)rng_normal(rng);
    layer_forward(l, in, batch);
    layer_backward(l, in, R, batch);
    memcpy(din, l->dout, sizeof(float) * nin);
    memcpy(dparams, t->grads, sizeof(float) * (l->nw + l->nb));
    char what[128];
    snprintf(what, sizeof what, "%s: d/d input", name);
    double e = fd_error(l, in, R, batch, in, nin, din, h);
    check(e <= tol, what, e, tol);
    if (l->nw > 0) {
        snprintf(what, sizeof what, "%s: d/d weights", name);
        e = fd_error(l, in, R, batch, l->w, l->nw, dparams, h);
        check(e <= tol, what, e, tol);
        snprintf(what, sizeof what, "%s: d/d bias", name);
        e = fd_error(l, in, R, batch, l->b, l->nb, dparams + l->nw, h);
        check(e <= tol, what, e, tol);
    }
    free(R);
    free(din);
    free(dparams);
}

static void test_conv_forward(rng_t *rng) {
    const int B = 2, D = 3, K = 4, H = 5, W = 6, k = 3, p = k / 2;
    test_layer_t t;
    make_layer(&t, LAYER_CONV, D, H, W, K, k, B, rng);
    float in[2 * 3 * 5 * 6];
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        in[i] = (float)rng_normal(rng);
    layer_forward(&t.l, in, B);
    double worst = 0.0;
    for (int b = 0; b < B; b++)
        for (int f = 0; f < K; f++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++) {
                    double s = t.l.b[f];
                    for (int d = 0; d < D; d++)
                        for (int i = 0; i < k; i++)
                            for (int j = 0; j < k; j++) {
                                int sy = y + i - p, sx = x + j - p;
                                if (sy < 0 || sy >= H || sx < 0 || sx >= W) continue;
                                s += (double)t.l.w[((f * D + d) * k + i) * k + j] *
                                     in[((b * D + d) * H + sy) * W + sx];
                            }
                    double got = t.l.out[((b * K + f) * H + y) * W + x];
                    if (fabs(got - s) > worst) worst = fabs(got - s);
                }
    check(worst < 1e-4, "conv 3x3 forward vs direct loops (2x3x5x6 -> 4)", worst, 1e-4);
    free_layer(&t);
}

static void test_layers(rng_t *rng) {
    const int B = 2;
    /* conv, 3x3 and 5x5, non-square input */
    int ks[2] = {3, 5};
    for (int q = 0; q < 2; q++) {
        test_layer_t t;
        make_layer(&t, LAYER_CONV, 2, 5, 4, 3, ks[q], B, rng);
        float in[2 * 2 * 5 * 4];
        for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
            in[i] = (float)rng_normal(rng);
        char name[64];
        snprintf(name, sizeof name, "conv %dx%d (2x5x4 -> 3)", ks[q], ks[q]);
        check_layer_grads(name, &t, in, B, 1e-2f, 2e-3, rng);
        free_layer(&t);
    }
    /* fc */
    {
        test_layer_t t;
        make_layer(&t, LAYER_FC, 3, 2, 2, 5, 0, B, rng);
        float in[2 * 12];
        for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
            in[i] = (float)rng_normal(rng);
        check_layer_grads("fc (12 -> 5)", &t, in, B, 1e-2f, 2e-3, rng);
        free_layer(&t);
    }
    /* relu: inputs at least 0.05 away from the kink */
    {
        test_layer_t t;
        make_layer(&t, LAYER_RELU, 2, 3, 3, 0, 0, B, rng);
        float in[2 * 18];
        for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
            float v = (float)rng_normal(rng);
            in[i] = v >= 0.0f ? v + 0.05f : v - 0.05f;
        }
        check_layer_grads("relu", &t, in, B, 1e-3f, 2e-3, rng);
        free_layer(&t);
    }
    /* max pool, odd width (the last column is dropped): distinct values 0.05 apart */
    {
        test_layer_t t;
        make_layer(&t, LAYER_POOL, 2, 4, 5, 0, 0, B, rng);
        enum { N = 2 * 2 * 4 * 5 };
        float in[N];
        int order[N];
        for (int i = 0; i < N; i++)
            order[i] = i;
        for (int i = N - 1; i > 0; i--) {
            int j = (int)(rng_uniform(rng) * (i + 1));
            if (j > i) j = i;
            int s = order[i];
            order[i] = order[j];
            order[j] = s;
        }
        for (int i = 0; i < N; i++)
            in[i] = 0.05f * (float)(order[i] - N / 2);
        check_layer_grads("max pool 2x2 (2x4x5 -> 2x2x2)", &t, in, B, 1e-3f, 2e-3, rng);
        free_layer(&t);
    }
}

static void test_softmax(rng_t *rng) {
    enum { B = 3, C = 10 };
    float logits[B * C], probs[B * C], grad[B * C], p2[B * C];
    uint8_t labels[B] = {0, 7, 9};
    for (int i = 0; i < B * C; i++)
        logits[i] = (float)(3.0 * rng_normal(rng));
    long correct = 0;
    double loss = softmax_xent(logits, labels, B, C, probs, grad, &correct);
    double ref = 0.0;
    for (int b = 0; b < B; b++) {
        double m = -INFINITY, s = 0.0;
        for (int c = 0; c < C; c++)
            m = fmax(m, logits[b * C + c]);
        for (int c = 0; c < C; c++)
            s += exp((double)logits[b * C + c] - m);
        ref += m + log(s) - logits[b * C + labels[b]];
    }
    ref /= B;
    check(fabs(loss - ref) < 1e-6, "softmax-CE loss vs log-sum-exp in double", fabs(loss - ref),
          1e-6);
    double worst = 0.0;
    const float h = 1e-3f;
    for (int i = 0; i < B * C; i++) {
        float keep = logits[i];
        long dummy = 0;
        logits[i] = keep + h;
        double fp = softmax_xent(logits, labels, B, C, p2, NULL, &dummy);
        logits[i] = keep - h;
        double fm = softmax_xent(logits, labels, B, C, p2, NULL, &dummy);
        logits[i] = keep;
        double num = (fp - fm) / (2.0 * (double)h);
        if (fabs(num - grad[i]) > worst) worst = fabs(num - grad[i]);
    }
    check(worst < 1e-4, "softmax-CE d/d logits", worst, 1e-4);
}

/* The whole chain: conv -> relu -> pool -> conv -> relu -> pool -> fc -> relu -> fc -> loss. */
static void test_network(rng_t *rng) {
    enum { B = 3, HW = 8 };
    net_t net;
    net_arch_t arch = {.nconv = 2, .channels = {3, 4}, .ksize = 3, .hidden = 6, .classes = 10};
    char err[256];
    if (net_create(&net, &arch, 1, HW, HW, B, 7, err, sizeof err) != 0) {
        check(0, err, 0, 0);
        return;
    }
    float images[B * HW * HW];
    uint8_t labels[B] = {1, 4, 8};
    for (int i = 0; i < B * HW * HW; i++)
        images[i] = (float)rng_normal(rng);
    long correct = 0;
    net_forward(&net, images, B);
    net_loss(&net, labels, B, &correct);
    net_backward(&net, images, B);
    float *analytic = malloc(sizeof(float) * net.nparams);
    memcpy(analytic, net.grads, sizeof(float) * net.nparams);
    double worst = 0.0;
    const float h = 1e-3f;
    /* every third parameter: all blocks (conv weights, biases, fc) are visited */
    for (size_t i = 0; i < net.nparams; i += 3) {
        float keep = net.params[i];
        net.params[i] = keep + h;
        net_forward(&net, images, B);
        double fp = net_loss(&net, labels, B, &correct);
        net.params[i] = keep - h;
        net_forward(&net, images, B);
        double fm = net_loss(&net, labels, B, &correct);
        net.params[i] = keep;
        double num = (fp - fm) / (2.0 * (double)h);
        double e = fabs(num - analytic[i]) / fmax(0.1, fabs(analytic[i]));
        if (e > worst) worst = e;
    }
    char what[128];
    snprintf(what, sizeof what, "network loss d/d params (%zu params, every 3rd)", net.nparams);
    check(worst < 2e-2, what, worst, 2e-2);
    /* parameters are laid out conv weights first, as the trainer's compressors need */
    check(net.conv_params == 3 * 1 * 9 + 4 * 3 * 9 && net.layers[0].w == net.params &&
              net.layers[3].w == net.params + 27,
          "conv weights lead the flat parameter array (error: floats off)",
          fabs((double)net.conv_params - (3 * 1 * 9 + 4 * 3 * 9)), 0);
    free(analytic);
    net_free(&net);
}

int main(void) {
    rng_t rng = {12345};
    test_conv_forward(&rng);
    test_layers(&rng);
    test_softmax(&rng);
    test_network(&rng);
    if (g_failures) {
        printf("test_train_layers: %d checks FAILED\n", g_failures);
        return 1;
    }
    printf("test_train_layers: all checks passed\n");
    return 0;
}
