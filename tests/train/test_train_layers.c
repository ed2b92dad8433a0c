/*
 * test_train_layers.c -- gvq-train's layers (apps/gvq-train/net.c) against independent references:
 *
 *   conv forward          a direct 6-deep loop in double (no im2col, no BLAS), stride 1 and 2
 *   every layer backward  central finite differences of f = sum(out .* R), R random, for the
 *                         input and every parameter (conv with stride 1 and 2, relu, max pool,
 *                         global average pool, fc, residual blocks with an identity and with an
 *                         option-A shortcut)
 *   softmax cross-entropy finite differences of the mean loss with respect to the logits, and
 *                         the loss against log-sum-exp in double
 *   the whole network     finite differences of the loss for a sample of every parameter block,
 *                         for the cnn and for a small resnet (every parameter); the resnet's
 *                         parameter layout and its Fixup initialization
 *
 * conv, gap and fc are linear in each value, so their differences are exact up to rounding; relu
 * and pool inputs are kept away from their kinks (|x| >= 0.05, distinct values 0.05 apart) so a
 * step of 1e-3 never crosses one. Inside residual blocks and the resnet the kinks cannot be
 * placed, so a difference whose +h or -h evaluation switched any relu is skipped (counted; more
 * than a quarter skipped fails). Exit status 0 when every check holds, 1 otherwise.
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
                       int stride, int batch, rng_t *rng) {
    layer_t *l = &t->l;
    memset(t, 0, sizeof *t);
    l->kind = kind;
    l->in_c = l->out_c = c;
    l->in_h = l->out_h = h;
    l->in_w = l->out_w = w;
    if (kind == LAYER_CONV) {
        l->out_c = out_c;
        l->ksize = k;
        l->stride = stride;
        l->out_h = conv_out_dim(h, stride);
        l->out_w = conv_out_dim(w, stride);
        l->nw = (size_t)out_c * c * k * k;
        l->nb = (size_t)out_c;
    } else if (kind == LAYER_GAP) {
        l->out_h = l->out_w = 1;
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
        size_t ncol = (size_t)batch * l->out_h * l->out_w;
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

/* A hash of which side of its kink every relu of the layer's last forward pass was on (blocks:
 * conv1's relu and the final one; 0 for layers without one inside). */
static uint64_t kinks(const layer_t *l, int batch) {
    uint64_t h = 0xcbf29ce484222325ull;
    if (l->kind != LAYER_BLOCK) return 0;
    const size_t n = (size_t)batch * layer_out_size(l);
    for (size_t i = 0; i < n; i++) {
        int bits = (l->out[i] > 0.0f) | (l->sub[0].out[i] + l->b[BLOCK_A2] > 0.0f) << 1;
        h = (h ^ (uint64_t)bits) * 0x100000001b3ull;
    }
    return h;
}

static long g_skipped, g_differences; /* kink-crossing differences skipped, of all taken */

/* Largest |numeric - analytic| / max(1, |analytic|) over the values x[0..n) perturbed by h,
 * skipping values whose perturbation switched a relu inside a block. */
static double fd_error(layer_t *l, float *in, const float *R, int batch, float *x, size_t n,
                       const float *analytic, float h) {
    double worst = 0.0;
    layer_forward(l, in, batch);
    const uint64_t base = kinks(l, batch);
    for (size_t i = 0; i < n; i++) {
        float keep = x[i];
        x[i] = keep + h;
        double fp = objective(l, in, R, batch);
        uint64_t kp = kinks(l, batch);
        x[i] = keep - h;
        double fm = objective(l, in, R, batch);
        uint64_t km = kinks(l, batch);
        x[i] = keep;
        g_differences++;
        if (kp != base || km != base) {
            g_skipped++;
            continue;
        }
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
    const int B = 2, D = 3, K = 4, H = 7, W = 6, k = 3, p = k / 2;
    for (int stride = 1; stride <= 2; stride++) {
        test_layer_t t;
        make_layer(&t, LAYER_CONV, D, H, W, K, k, stride, B, rng);
        const int OH = t.l.out_h, OW = t.l.out_w;
        float in[2 * 3 * 7 * 6];
        for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
            in[i] = (float)rng_normal(rng);
        layer_forward(&t.l, in, B);
        double worst = 0.0;
        for (int b = 0; b < B; b++)
            for (int f = 0; f < K; f++)
                for (int y = 0; y < OH; y++)
                    for (int x = 0; x < OW; x++) {
                        double s = t.l.b[f];
                        for (int d = 0; d < D; d++)
                            for (int i = 0; i < k; i++)
                                for (int j = 0; j < k; j++) {
                                    int sy = stride * y + i - p, sx = stride * x + j - p;
                                    if (sy < 0 || sy >= H || sx < 0 || sx >= W) continue;
                                    s += (double)t.l.w[((f * D + d) * k + i) * k + j] *
                                         in[((b * D + d) * H + sy) * W + sx];
                                }
                        double got = t.l.out[((b * K + f) * OH + y) * OW + x];
                        if (fabs(got - s) > worst) worst = fabs(got - s);
                    }
        char what[96];
        snprintf(what, sizeof what,
                 "conv 3x3 stride %d forward vs direct loops (2x3x7x6 -> 4x%dx%d)", stride, OH, OW);
        int shape_ok = OH == (H + stride - 1) / stride && OW == (W + stride - 1) / stride;
        check(worst < 1e-4 && shape_ok, what, shape_ok ? worst : 1e9, 1e-4);
        free_layer(&t);
    }
}

static void test_layers(rng_t *rng) {
    const int B = 2;
    /* conv, 3x3 and 5x5, stride 1 and 2, non-square input with an odd side */
    int ks[2] = {3, 5};
    for (int q = 0; q < 4; q++) {
        test_layer_t t;
        const int k = ks[q % 2], stride = 1 + q / 2;
        make_layer(&t, LAYER_CONV, 2, 5, 4, 3, k, stride, B, rng);
        float in[2 * 2 * 5 * 4];
        for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
            in[i] = (float)rng_normal(rng);
        char name[64];
        snprintf(name, sizeof name, "conv %dx%d stride %d (2x5x4 -> 3x%dx%d)", k, k, stride,
                 t.l.out_h, t.l.out_w);
        check_layer_grads(name, &t, in, B, 1e-2f, 2e-3, rng);
        free_layer(&t);
    }
    /* global average pooling */
    {
        test_layer_t t;
        make_layer(&t, LAYER_GAP, 3, 3, 2, 0, 0, 1, B, rng);
        float in[2 * 3 * 3 * 2];
        for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
            in[i] = (float)rng_normal(rng);
        check_layer_grads("global average pool (3x3x2 -> 3)", &t, in, B, 1e-2f, 2e-3, rng);
        free_layer(&t);
    }
    /* fc */
    {
        test_layer_t t;
        make_layer(&t, LAYER_FC, 3, 2, 2, 5, 0, 1, B, rng);
        float in[2 * 12];
        for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
            in[i] = (float)rng_normal(rng);
        check_layer_grads("fc (12 -> 5)", &t, in, B, 1e-2f, 2e-3, rng);
        free_layer(&t);
    }
    /* relu: inputs at least 0.05 away from the kink */
    {
        test_layer_t t;
        make_layer(&t, LAYER_RELU, 2, 3, 3, 0, 0, 1, B, rng);
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
        make_layer(&t, LAYER_POOL, 2, 4, 5, 0, 0, 1, B, rng);
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

/* ---- the resnet ----------------------------------------------------------------------------- */

static const net_arch_t k_tiny_resnet = {
    .nconv = 3, .channels = {3, 4, 6}, .ksize = 3, .classes = 10, .model = NET_RESNET, .blocks = 2};

/* Random values for every parameter: Fixup starts with zero branch ends and a zero fc, whose
 * gradients and effects would be trivially zero. Conv weights N(0, 1/fan-in), the blocks'
 * multipliers 1 + N(0, 0.3^2), every other value N(0, 0.2^2). */
static void randomize_resnet(net_t *net, rng_t *rng) {
    for (size_t i = 0; i < net->nparams; i++)
        net->params[i] = (float)(0.2 * rng_normal(rng));
    for (int i = 0; i < net->nconv; i++) {
        layer_t *c = net->conv[i];
        double sd = sqrt(1.0 / (double)(c->in_c * c->ksize * c->ksize));
        for (size_t j = 0; j < c->nw; j++)
            c->w[j] = (float)(sd * rng_normal(rng));
    }
    for (int i = 0; i < net->nlayers; i++)
        if (net->layers[i].kind == LAYER_BLOCK)
            net->layers[i].b[BLOCK_SCALE] = (float)(1.0 + 0.3 * rng_normal(rng));
}

/* One residual block: input, conv1 and conv2 weights, the five scalars. */
static void check_block(const char *name, layer_t *l, int batch, rng_t *rng) {
    const size_t nin = (size_t)batch * layer_in_size(l), nout = (size_t)batch * layer_out_size(l);
    float *in = malloc(sizeof(float) * nin), *R = malloc(sizeof(float) * nout);
    float *din = malloc(sizeof(float) * nin);
    float *dw1 = malloc(sizeof(float) * l->sub[0].nw), *dw2 = malloc(sizeof(float) * l->sub[1].nw);
    float ds[BLOCK_SCALARS];
    for (size_t i = 0; i < nin; i++)
        in[i] = (float)rng_normal(rng);
    for (size_t i = 0; i < nout; i++)
        R[i] = (float)rng_normal(rng);
    layer_forward(l, in, batch);
    layer_backward(l, in, R, batch);
    memcpy(din, l->dout, sizeof(float) * nin);
    memcpy(dw1, l->sub[0].dw, sizeof(float) * l->sub[0].nw);
    memcpy(dw2, l->sub[1].dw, sizeof(float) * l->sub[1].nw);
    memcpy(ds, l->db, sizeof ds);
    const long skipped0 = g_skipped, taken0 = g_differences;
    const float h = 2e-3f;
    const double tol = 5e-3;
    double e[4] = {fd_error(l, in, R, batch, in, nin, din, h),
                   fd_error(l, in, R, batch, l->sub[0].w, l->sub[0].nw, dw1, h),
                   fd_error(l, in, R, batch, l->sub[1].w, l->sub[1].nw, dw2, h),
                   fd_error(l, in, R, batch, l->b, BLOCK_SCALARS, ds, h)};
    const char *of[4] = {"input", "conv1 weights", "conv2 weights", "a1 a2 a3 s a4"};
    for (int i = 0; i < 4; i++) {
        char what[128];
        snprintf(what, sizeof what, "%s: d/d %s", name, of[i]);
        check(e[i] <= tol, what, e[i], tol);
    }
    long skipped = g_skipped - skipped0, taken = g_differences - taken0;
    char what[256];
    snprintf(what, sizeof what, "%s: %ld of %ld differences crossed a kink (<= 1/4)", name, skipped,
             taken);
    check(4 * skipped <= taken, what, (double)skipped / (double)taken, 0.25);
    free(in);
    free(R);
    free(din);
    free(dw1);
    free(dw2);
}

/* Residual blocks of a tiny resnet: the identity shortcut (stage 1) and option A (the first
 * block of stage 2: stride 2, 3 -> 4 channels, 5x5 -> 3x3; of stage 3: 3x3 -> 2x2). */
static void test_blocks(rng_t *rng) {
    enum { B = 2 };
    net_t net;
    char err[256];
    if (net_create(&net, &k_tiny_resnet, 1, 9, 9, B, 3, err, sizeof err) != 0) {
        check(0, err, 0, 0);
        return;
    }
    randomize_resnet(&net, rng);
    int seen_identity = 0, seen_a = 0;
    for (int i = 0; i < net.nlayers; i++) {
        layer_t *l = &net.layers[i];
        if (l->kind != LAYER_BLOCK) continue;
        int identity = l->in_c == l->out_c && l->in_h == l->out_h;
        if (identity && seen_identity) continue;
        char name[96];
        snprintf(name, sizeof name, "block %s %dx%dx%d -> %dx%dx%d",
                 identity ? "identity" : "option A", l->in_c, l->in_h, l->in_w, l->out_c, l->out_h,
                 l->out_w);
        check_block(name, l, B, rng);
        seen_identity |= identity;
        seen_a += !identity;
    }
    check(seen_identity && seen_a == 2, "both shortcut kinds tested (1 identity, 2 option A)",
          seen_identity && seen_a == 2 ? 0 : 1, 0);
    net_free(&net);
}

/* Which side of its kink every relu of the network was on in the last forward pass. */
static uint64_t net_kinks(const net_t *net, int batch) {
    uint64_t h = 0;
    for (int i = 0; i < net->nlayers; i++) {
        const layer_t *l = &net->layers[i];
        if (l->kind == LAYER_RELU) {
            size_t n = (size_t)batch * layer_out_size(l);
            for (size_t j = 0; j < n; j++)
                h = (h ^ (uint64_t)(l->out[j] > 0.0f)) * 0x100000001b3ull;
        }
        h = (h ^ kinks(l, batch)) * 0x100000001b3ull;
    }
    return h;
}

/* The whole resnet against finite differences of the loss for every parameter; its layout. */
static void test_resnet(rng_t *rng) {
    enum { B = 2, HW = 9 };
    net_t net;
    char err[256];
    if (net_create(&net, &k_tiny_resnet, 1, HW, HW, B, 11, err, sizeof err) != 0) {
        check(0, err, 0, 0);
        return;
    }
    randomize_resnet(&net, rng);
    float images[B * HW * HW];
    uint8_t labels[B] = {2, 9};
    for (int i = 0; i < B * HW * HW; i++)
        images[i] = (float)rng_normal(rng);
    long correct = 0;
    net_forward(&net, images, B);
    net_loss(&net, labels, B, &correct);
    const uint64_t base = net_kinks(&net, B);
    net_backward(&net, images, B);
    float *analytic = malloc(sizeof(float) * net.nparams);
    memcpy(analytic, net.grads, sizeof(float) * net.nparams);
    double worst = 0.0;
    long skipped = 0;
    const float h = 1e-4f;
    for (size_t i = 0; i < net.nparams; i++) {
        float keep = net.params[i];
        net.params[i] = keep + h;
        net_forward(&net, images, B);
        double fp = net_loss(&net, labels, B, &correct);
        uint64_t kp = net_kinks(&net, B);
        net.params[i] = keep - h;
        net_forward(&net, images, B);
        double fm = net_loss(&net, labels, B, &correct);
        uint64_t km = net_kinks(&net, B);
        net.params[i] = keep;
        if (kp != base || km != base) {
            skipped++;
            continue;
        }
        double num = (fp - fm) / (2.0 * (double)h);
        double e = fabs(num - analytic[i]) / fmax(0.1, fabs(analytic[i]));
        if (e > worst) worst = e;
    }
    char what[160];
    snprintf(what, sizeof what, "resnet-14 loss d/d params (all %zu, %ld crossed a kink)",
             net.nparams, skipped);
    check(worst < 2e-2 && 4 * skipped <= (long)net.nparams, what, worst, 2e-2);

    /* layout: 1 + 6n convs, their weights first and contiguous in network order */
    size_t off = 0;
    int contiguous = net.nconv == 1 + 6 * k_tiny_resnet.blocks;
    for (int i = 0; i < net.nconv && contiguous; i++) {
        const layer_t *c = net.conv[i];
        contiguous = c->kind == LAYER_CONV && c->w == net.params + off && c->ksize == 3 &&
                     c->nw == (size_t)c->out_c * c->in_c * 9;
        off += c->nw;
    }
    const layer_t *fc = &net.layers[net.nlayers - 1];
    contiguous = contiguous && off == net.conv_params && fc->kind == LAYER_FC &&
                 fc->b + fc->nb == net.params + net.nparams && fc->w > net.params + off;
    snprintf(what, sizeof what, "resnet: %d conv weight blocks lead the flat array, then the rest",
             net.nconv);
    check(contiguous, what, contiguous ? 0 : 1, 0);
    free(analytic);
    net_free(&net);
}

/* Fixup initialization of ResNet-20: branch ends, fc and scalar biases zero, multipliers 1, the
 * branches' first convs He-normal x L^(-1/2) (L = 9), the stem plain He-normal. */
static void test_fixup_init(void) {
    net_arch_t arch = {.nconv = 3,
                       .channels = {16, 32, 64},
                       .ksize = 3,
                       .classes = 10,
                       .model = NET_RESNET,
                       .blocks = 3};
    net_t net;
    char err[256];
    if (net_create(&net, &arch, 1, 28, 28, 1, 1, err, sizeof err) != 0) {
        check(0, err, 0, 0);
        return;
    }
    int zeros_ok = 1;
    double ss = 0.0, expect = 0.0; /* sums of w^2 and of the He x L^-1/2 variance */
    for (int i = 0; i < net.nlayers; i++) {
        const layer_t *l = &net.layers[i];
        if (l->kind == LAYER_FC)
            for (size_t j = 0; j < l->nw + l->nb; j++)
                zeros_ok &= j < l->nw ? l->w[j] == 0.0f : l->b[j - l->nw] == 0.0f;
        if (l->kind != LAYER_BLOCK) continue;
        for (int j = 0; j < BLOCK_SCALARS; j++)
            zeros_ok &= l->b[j] == (j == BLOCK_SCALE ? 1.0f : 0.0f);
        for (size_t j = 0; j < l->sub[1].nw; j++)
            zeros_ok &= l->sub[1].w[j] == 0.0f;
        const layer_t *c1 = &l->sub[0];
        for (size_t j = 0; j < c1->nw; j++)
            ss += (double)c1->w[j] * c1->w[j];
        expect += (double)c1->nw * 2.0 / (double)(c1->in_c * 9) / 9.0;
    }
    check(zeros_ok, "fixup: branch ends and fc zero, scalar biases 0, multipliers 1", !zeros_ok, 0);
    double ratio = sqrt(ss / expect);
    check(fabs(ratio - 1.0) < 0.03, "fixup: branch-first convs' sd / (He x 9^-1/2), minus 1",
          fabs(ratio - 1.0), 0.03);
    const layer_t *stem = net.conv[0];
    double s2 = 0.0;
    for (size_t j = 0; j < stem->nw; j++)
        s2 += (double)stem->w[j] * stem->w[j];
    double stem_ratio = sqrt(s2 / (double)stem->nw / (2.0 / 9.0));
    check(fabs(stem_ratio - 1.0) < 0.25, "fixup: stem sd / He, minus 1", fabs(stem_ratio - 1.0),
          0.25);
    net_free(&net);
}

int main(void) {
    rng_t rng = {12345};
    test_conv_forward(&rng);
    test_layers(&rng);
    test_softmax(&rng);
    test_network(&rng);
    test_blocks(&rng);
    test_resnet(&rng);
    test_fixup_init();
    if (g_failures) {
        printf("test_train_layers: %d checks FAILED\n", g_failures);
        return 1;
    }
    printf("test_train_layers: all checks passed\n");
    return 0;
}
