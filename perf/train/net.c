/*
 * net.c -- gvq-train's CNN: im2col + sgemm convolution, ReLU, 2x2 max pooling, fully connected
 * layers and softmax cross-entropy, each with its backward pass (see net.h).
 *
 * Convolution over a batch of B images (D x H x W in, K x H x W out, kernel k, padding k/2):
 *
 *     cols[D*k*k][B*H*W]   im2col: column (b, y, x) holds the k x k x D patch around (y, x)
 *     tmp [K][B*H*W]     = W[K][D*k*k] . cols                        (one sgemm for the batch)
 *     out [B][K][H*W]    = tmp, transposed per image, + bias
 *   backward:
 *     tmp                = dout, transposed back
 *     dW                 = tmp . cols^T          db = row sums of tmp
 *     cols               = W^T . tmp             (reusing the buffer, dW is done with it)
 *     din                = col2im(cols)          (patches added back where they came from)
 */
#include "net.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- random numbers ------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double rng_uniform(rng_t *r) {
    return (double)(splitmix64(&r->s) >> 11) * (1.0 / 9007199254740992.0);
}

double rng_normal(rng_t *r) {
    /* Box-Muller; u1 is kept away from 0 so the log is finite */
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t hash_floats(const float *x, size_t n) {
    const unsigned char *p = (const unsigned char *)x;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n * sizeof(float); i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* ---- layer sizes ---------------------------------------------------------------------------- */

size_t layer_in_size(const layer_t *l) {
    return (size_t)l->in_c * l->in_h * l->in_w;
}
size_t layer_out_size(const layer_t *l) {
    return (size_t)l->out_c * l->out_h * l->out_w;
}

/* ---- convolution ---------------------------------------------------------------------------- */

static void im2col(const float *in, int batch, int D, int H, int W, int k, float *cols) {
    const int pad = k / 2;
    const size_t hw = (size_t)H * W, ncol = (size_t)batch * hw;
    for (int d = 0; d < D; d++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                float *row = cols + ((size_t)(d * k + ki) * k + kj) * ncol;
                for (int b = 0; b < batch; b++) {
                    const float *img = in + ((size_t)b * D + d) * hw;
                    float *dst = row + (size_t)b * hw;
                    for (int y = 0; y < H; y++) {
                        int sy = y + ki - pad;
                        if (sy < 0 || sy >= H) {
                            memset(dst + (size_t)y * W, 0, sizeof(float) * (size_t)W);
                            continue;
                        }
                        for (int x = 0; x < W; x++) {
                            int sx = x + kj - pad;
                            dst[(size_t)y * W + x] =
                                sx >= 0 && sx < W ? img[(size_t)sy * W + sx] : 0.0f;
                        }
                    }
                }
            }
}

/* The adjoint of im2col: every patch entry is added back to the input pixel it came from. */
static void col2im(const float *cols, int batch, int D, int H, int W, int k, float *din) {
    const int pad = k / 2;
    const size_t hw = (size_t)H * W, ncol = (size_t)batch * hw;
    memset(din, 0, sizeof(float) * (size_t)batch * D * hw);
    for (int d = 0; d < D; d++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                const float *row = cols + ((size_t)(d * k + ki) * k + kj) * ncol;
                for (int b = 0; b < batch; b++) {
                    float *img = din + ((size_t)b * D + d) * hw;
                    const float *src = row + (size_t)b * hw;
                    for (int y = 0; y < H; y++) {
                        int sy = y + ki - pad;
                        if (sy < 0 || sy >= H) continue;
                        for (int x = 0; x < W; x++) {
                            int sx = x + kj - pad;
                            if (sx >= 0 && sx < W)
                                img[(size_t)sy * W + sx] += src[(size_t)y * W + x];
                        }
                    }
                }
            }
}

static void conv_forward(layer_t *l, const float *in, int batch) {
    const int K = l->out_c, D = l->in_c, k = l->ksize;
    const int rows = D * k * k;
    const size_t hw = (size_t)l->out_h * l->out_w, ncol = (size_t)batch * hw;
    im2col(in, batch, D, l->in_h, l->in_w, k, l->cols);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, K, (int)ncol, rows, 1.0f, l->w, rows,
                l->cols, (int)ncol, 0.0f, l->tmp, (int)ncol);
    for (int b = 0; b < batch; b++)
        for (int f = 0; f < K; f++) {
            const float *src = l->tmp + (size_t)f * ncol + (size_t)b * hw;
            float *dst = l->out + ((size_t)b * K + f) * hw;
            for (size_t i = 0; i < hw; i++)
                dst[i] = src[i] + l->b[f];
        }
}

static void conv_backward(layer_t *l, const float *in, const float *dout, int batch) {
    const int K = l->out_c, D = l->in_c, k = l->ksize;
    const int rows = D * k * k;
    const size_t hw = (size_t)l->out_h * l->out_w, ncol = (size_t)batch * hw;
    (void)in; /* the forward pass left its im2col in l->cols */
    for (int f = 0; f < K; f++) {
        double sum = 0.0;
        for (int b = 0; b < batch; b++) {
            const float *src = dout + ((size_t)b * K + f) * hw;
            float *dst = l->tmp + (size_t)f * ncol + (size_t)b * hw;
            for (size_t i = 0; i < hw; i++) {
                dst[i] = src[i];
                sum += src[i];
            }
        }
        l->db[f] = (float)sum;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, K, rows, (int)ncol, 1.0f, l->tmp,
                (int)ncol, l->cols, (int)ncol, 0.0f, l->dw, rows);
    if (l->dout == NULL) return; /* the first layer: nobody needs the image gradient */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, (int)ncol, K, 1.0f, l->w, rows,
                l->tmp, (int)ncol, 0.0f, l->cols, (int)ncol);
    col2im(l->cols, batch, D, l->in_h, l->in_w, k, l->dout);
}

/* ---- relu, pool, fc ------------------------------------------------------------------------- */

static void relu_forward(layer_t *l, const float *in, int batch) {
    size_t n = (size_t)batch * layer_in_size(l);
    for (size_t i = 0; i < n; i++)
        l->out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

static void relu_backward(layer_t *l, const float *in, const float *dout, int batch) {
    size_t n = (size_t)batch * layer_in_size(l);
    for (size_t i = 0; i < n; i++)
        l->dout[i] = in[i] > 0.0f ? dout[i] : 0.0f;
}

static void pool_forward(layer_t *l, const float *in, int batch) {
    const int C = l->in_c, H = l->in_h, W = l->in_w, OH = l->out_h, OW = l->out_w;
    for (int b = 0; b < batch; b++)
        for (int c = 0; c < C; c++) {
            size_t ibase = ((size_t)b * C + c) * H * W;
            size_t obase = ((size_t)b * C + c) * OH * OW;
            for (int oy = 0; oy < OH; oy++)
                for (int ox = 0; ox < OW; ox++) {
                    size_t best = ibase + (size_t)(2 * oy) * W + 2 * ox;
                    for (int dy = 0; dy < 2; dy++)
                        for (int dx = 0; dx < 2; dx++) {
                            size_t j = ibase + (size_t)(2 * oy + dy) * W + 2 * ox + dx;
                            if (in[j] > in[best]) best = j;
                        }
                    l->out[obase + (size_t)oy * OW + ox] = in[best];
                    l->argmax[obase + (size_t)oy * OW + ox] = (int)best;
                }
        }
}

static void pool_backward(layer_t *l, const float *dout, int batch) {
    memset(l->dout, 0, sizeof(float) * (size_t)batch * layer_in_size(l));
    size_t n = (size_t)batch * layer_out_size(l);
    for (size_t i = 0; i < n; i++)
        l->dout[l->argmax[i]] += dout[i];
}

static void fc_forward(layer_t *l, const float *in, int batch) {
    const int ni = (int)layer_in_size(l), no = l->out_c;
    for (int b = 0; b < batch; b++)
        memcpy(l->out + (size_t)b * no, l->b, sizeof(float) * (size_t)no);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, no, ni, 1.0f, in, ni, l->w, ni,
                1.0f, l->out, no);
}

static void fc_backward(layer_t *l, const float *in, const float *dout, int batch) {
    const int ni = (int)layer_in_size(l), no = l->out_c;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, no, ni, batch, 1.0f, dout, no, in, ni,
                0.0f, l->dw, ni);
    for (int o = 0; o < no; o++) {
        double sum = 0.0;
        for (int b = 0; b < batch; b++)
            sum += dout[(size_t)b * no + o];
        l->db[o] = (float)sum;
    }
    if (l->dout == NULL) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, ni, no, 1.0f, dout, no, l->w, ni,
                0.0f, l->dout, ni);
}

void layer_forward(layer_t *l, const float *in, int batch) {
    switch (l->kind) {
    case LAYER_CONV:
        conv_forward(l, in, batch);
        break;
    case LAYER_RELU:
        relu_forward(l, in, batch);
        break;
    case LAYER_POOL:
        pool_forward(l, in, batch);
        break;
    case LAYER_FC:
        fc_forward(l, in, batch);
        break;
    }
}

void layer_backward(layer_t *l, const float *in, const float *dout_next, int batch) {
    switch (l->kind) {
    case LAYER_CONV:
        conv_backward(l, in, dout_next, batch);
        break;
    case LAYER_RELU:
        relu_backward(l, in, dout_next, batch);
        break;
    case LAYER_POOL:
        pool_backward(l, dout_next, batch);
        break;
    case LAYER_FC:
        fc_backward(l, in, dout_next, batch);
        break;
    }
}

/* ---- loss ----------------------------------------------------------------------------------- */

double softmax_xent(const float *logits, const uint8_t *labels, int batch, int classes,
                    float *probs, float *dlogits, long *correct) {
    double loss = 0.0;
    for (int b = 0; b < batch; b++) {
        const float *z = logits + (size_t)b * classes;
        float *p = probs + (size_t)b * classes;
        int arg = 0;
        for (int c = 1; c < classes; c++)
            if (z[c] > z[arg]) arg = c;
        double sum = 0.0;
        for (int c = 0; c < classes; c++)
            sum += exp((double)z[c] - z[arg]);
        for (int c = 0; c < classes; c++)
            p[c] = (float)(exp((double)z[c] - z[arg]) / sum);
        /* -log p[label], computed from the logits so it stays finite */
        loss += log(sum) - ((double)z[labels[b]] - z[arg]);
        if (arg == labels[b]) (*correct)++;
        if (dlogits != NULL) {
            float *g = dlogits + (size_t)b * classes;
            for (int c = 0; c < classes; c++)
                g[c] = (p[c] - (c == labels[b] ? 1.0f : 0.0f)) / (float)batch;
        }
    }
    return loss / batch;
}

/* ---- the network ---------------------------------------------------------------------------- */

static int add_layer(net_t *net, int max_layers, layer_kind_t kind, int in_c, int in_h, int in_w) {
    if (net->nlayers == max_layers) return -1;
    layer_t *l = &net->layers[net->nlayers++];
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->in_c = l->out_c = in_c;
    l->in_h = l->out_h = in_h;
    l->in_w = l->out_w = in_w;
    return 0;
}

void net_free(net_t *net) {
    for (int i = 0; i < net->nlayers; i++) {
        layer_t *l = &net->layers[i];
        free(l->out);
        free(l->dout);
        free(l->cols);
        free(l->tmp);
        free(l->argmax);
    }
    free(net->layers);
    free(net->params);
    free(net->grads);
    free(net->probs);
    free(net->dlogits);
    memset(net, 0, sizeof *net);
}

int net_create(net_t *net, const net_arch_t *arch, int c, int h, int w, int capacity, uint64_t seed,
               char *err, size_t errlen) {
    memset(net, 0, sizeof *net);
    if (arch->nconv < 1 || arch->nconv > 8 || arch->ksize < 1 || arch->ksize % 2 == 0 ||
        arch->hidden < 0 || arch->classes < 2 || capacity < 1) {
        snprintf(err, errlen,
                 "bad architecture: %d conv layers (1..8), kernel %d (odd), hidden %d (>= 0), "
                 "%d classes (>= 2)",
                 arch->nconv, arch->ksize, arch->hidden, arch->classes);
        return -1;
    }
    const int max_layers = 3 * arch->nconv + 3;
    net->layers = calloc((size_t)max_layers, sizeof(layer_t));
    if (net->layers == NULL) goto err_nomem;
    net->capacity = capacity;
    net->in_c = c;
    net->in_h = h;
    net->in_w = w;
    net->classes = arch->classes;

    /* shapes */
    int cc = c, hh = h, ww = w;
    for (int i = 0; i < arch->nconv; i++) {
        if (arch->channels[i] < 1 || hh < 2 || ww < 2) {
            snprintf(err, errlen, "bad architecture: conv layer %d has %d channels on %dx%d", i + 1,
                     arch->channels[i], hh, ww);
            net_free(net);
            return -1;
        }
        add_layer(net, max_layers, LAYER_CONV, cc, hh, ww);
        layer_t *l = &net->layers[net->nlayers - 1];
        l->out_c = arch->channels[i];
        l->ksize = arch->ksize;
        l->nw = (size_t)l->out_c * cc * arch->ksize * arch->ksize;
        l->nb = (size_t)l->out_c;
        cc = l->out_c;
        add_layer(net, max_layers, LAYER_RELU, cc, hh, ww);
        add_layer(net, max_layers, LAYER_POOL, cc, hh, ww);
        l = &net->layers[net->nlayers - 1];
        l->out_h = hh / 2;
        l->out_w = ww / 2;
        hh /= 2;
        ww /= 2;
    }
    int flat = cc * hh * ww;
    if (arch->hidden > 0) {
        add_layer(net, max_layers, LAYER_FC, cc, hh, ww);
        layer_t *l = &net->layers[net->nlayers - 1];
        l->out_c = arch->hidden;
        l->out_h = l->out_w = 1;
        l->nw = (size_t)arch->hidden * flat;
        l->nb = (size_t)arch->hidden;
        add_layer(net, max_layers, LAYER_RELU, arch->hidden, 1, 1);
        cc = arch->hidden;
        hh = ww = 1;
    }
    add_layer(net, max_layers, LAYER_FC, cc, hh, ww);
    layer_t *last = &net->layers[net->nlayers - 1];
    last->out_c = arch->classes;
    last->out_h = last->out_w = 1;
    last->nw = (size_t)arch->classes * cc * hh * ww;
    last->nb = (size_t)arch->classes;

    /* parameters: conv weights first, then the rest in layer order */
    size_t total = 0;
    for (int i = 0; i < net->nlayers; i++)
        total += net->layers[i].nw + net->layers[i].nb;
    net->nparams = total;
    net->params = calloc(total, sizeof(float));
    net->grads = calloc(total, sizeof(float));
    if (net->params == NULL || net->grads == NULL) goto err_nomem;
    size_t off = 0;
    for (int i = 0; i < net->nlayers; i++) {
        layer_t *l = &net->layers[i];
        if (l->kind != LAYER_CONV) continue;
        l->w = net->params + off;
        l->dw = net->grads + off;
        off += l->nw;
    }
    net->conv_params = off;
    for (int i = 0; i < net->nlayers; i++) {
        layer_t *l = &net->layers[i];
        if (l->kind == LAYER_FC) {
            l->w = net->params + off;
            l->dw = net->grads + off;
            off += l->nw;
        }
        if (l->nb > 0) {
            l->b = net->params + off;
            l->db = net->grads + off;
            off += l->nb;
        }
    }

    /* He-normal weights from one stream, in layer order; biases stay zero */
    rng_t rng = {seed * 0x2545f4914f6cdd1dull + 1};
    for (int i = 0; i < net->nlayers; i++) {
        layer_t *l = &net->layers[i];
        if (l->nw == 0) continue;
        double fan_in = (double)l->nw / (double)l->out_c;
        double sd = sqrt(2.0 / fan_in);
        for (size_t j = 0; j < l->nw; j++)
            l->w[j] = (float)(sd * rng_normal(&rng));
    }

    /* buffers */
    for (int i = 0; i < net->nlayers; i++) {
        layer_t *l = &net->layers[i];
        l->out = malloc(sizeof(float) * (size_t)capacity * layer_out_size(l));
        if (i > 0) l->dout = malloc(sizeof(float) * (size_t)capacity * layer_in_size(l));
        if (l->out == NULL || (i > 0 && l->dout == NULL)) goto err_nomem;
        if (l->kind == LAYER_CONV) {
            size_t ncol = (size_t)capacity * l->out_h * l->out_w;
            l->cols = malloc(sizeof(float) * ncol * (size_t)l->in_c * l->ksize * l->ksize);
            l->tmp = malloc(sizeof(float) * ncol * (size_t)l->out_c);
            if (l->cols == NULL || l->tmp == NULL) goto err_nomem;
        }
        if (l->kind == LAYER_POOL) {
            l->argmax = malloc(sizeof(int) * (size_t)capacity * layer_out_size(l));
            if (l->argmax == NULL) goto err_nomem;
        }
    }
    net->probs = malloc(sizeof(float) * (size_t)capacity * arch->classes);
    net->dlogits = malloc(sizeof(float) * (size_t)capacity * arch->classes);
    if (net->probs == NULL || net->dlogits == NULL) goto err_nomem;
    return 0;

err_nomem:
    snprintf(err, errlen, "out of memory building the network (batch capacity %d)", capacity);
    net_free(net);
    return -1;
}

const float *net_forward(net_t *net, const float *images, int batch) {
    const float *in = images;
    for (int i = 0; i < net->nlayers; i++) {
        layer_forward(&net->layers[i], in, batch);
        in = net->layers[i].out;
    }
    return in;
}

double net_loss(net_t *net, const uint8_t *labels, int batch, long *correct) {
    const float *logits = net->layers[net->nlayers - 1].out;
    return softmax_xent(logits, labels, batch, net->classes, net->probs, net->dlogits, correct);
}

void net_backward(net_t *net, const float *images, int batch) {
    const float *dnext = net->dlogits;
    for (int i = net->nlayers - 1; i >= 0; i--) {
        layer_t *l = &net->layers[i];
        const float *in = i > 0 ? net->layers[i - 1].out : images;
        layer_backward(l, in, dnext, batch);
        dnext = l->dout;
    }
}

long net_count_correct(net_t *net, const float *images, const uint8_t *labels, int batch) {
    const float *logits = net_forward(net, images, batch);
    long correct = 0;
    for (int b = 0; b < batch; b++) {
        const float *z = logits + (size_t)b * net->classes;
        int arg = 0;
        for (int c = 1; c < net->classes; c++)
            if (z[c] > z[arg]) arg = c;
        if (arg == labels[b]) correct++;
    }
    return correct;
}
