/*
 * net.c -- gvq-train's networks: im2col + sgemm convolution, ReLU, 2x2 max pooling, global
 * average pooling, fully connected layers, residual blocks and softmax cross-entropy, each with
 * its backward pass; the cnn and the Fixup resnet built from them (see net.h).
 *
 * Convolution over a batch of B images (D x H x W in, K x OH x OW out, kernel k, padding k/2,
 * stride s; OH = ceil(H / s)):
 *
 *     cols[D*k*k][B*OH*OW] im2col: column (b, y, x) holds the k x k x D patch around (s y, s x)
 *     tmp [K][B*OH*OW]   = W[K][D*k*k] . cols                        (one sgemm for the batch)
 *     out [B][K][OH*OW]  = tmp, transposed per image, + bias
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

int conv_out_dim(int n, int stride) {
    return (n + stride - 1) / stride;
}

static int stride_of(const layer_t *l) {
    return l->stride > 0 ? l->stride : 1;
}

/* Output columns [*x0, *x1) whose input column ox * s + kj - pad lies inside [0, W). */
static void valid_range(int W, int OW, int kj, int pad, int s, int *x0, int *x1) {
    int lo = pad - kj > 0 ? (pad - kj + s - 1) / s : 0;
    int hi = W - 1 + pad - kj >= 0 ? (W - 1 + pad - kj) / s + 1 : 0;
    if (hi > OW) hi = OW;
    if (lo > OW) lo = OW;
    if (hi < lo) hi = lo;
    *x0 = lo;
    *x1 = hi;
}

static void im2col(const layer_t *l, const float *in, int batch, float *cols) {
    const int D = l->in_c, H = l->in_h, W = l->in_w, OH = l->out_h, OW = l->out_w;
    const int k = l->ksize, s = stride_of(l), pad = k / 2;
    const size_t ihw = (size_t)H * W, ohw = (size_t)OH * OW, ncol = (size_t)batch * ohw;
    for (int d = 0; d < D; d++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                float *row = cols + ((size_t)(d * k + ki) * k + kj) * ncol;
                int x0, x1;
                valid_range(W, OW, kj, pad, s, &x0, &x1);
                for (int b = 0; b < batch; b++) {
                    const float *img = in + ((size_t)b * D + d) * ihw;
                    for (int oy = 0; oy < OH; oy++) {
                        float *dst = row + (size_t)b * ohw + (size_t)oy * OW;
                        int sy = oy * s + ki - pad;
                        if (sy < 0 || sy >= H) {
                            memset(dst, 0, sizeof(float) * (size_t)OW);
                            continue;
                        }
                        const float *src = img + (size_t)sy * W;
                        for (int ox = 0; ox < x0; ox++)
                            dst[ox] = 0.0f;
                        if (s == 1 && x1 > x0)
                            memcpy(dst + x0, src + x0 + kj - pad,
                                   sizeof(float) * (size_t)(x1 - x0));
                        else
                            for (int ox = x0; ox < x1; ox++)
                                dst[ox] = src[ox * s + kj - pad];
                        for (int ox = x1; ox < OW; ox++)
                            dst[ox] = 0.0f;
                    }
                }
            }
}

/* The adjoint of im2col: every patch entry is added back to the input pixel it came from. */
static void col2im(const layer_t *l, const float *cols, int batch, float *din) {
    const int D = l->in_c, H = l->in_h, W = l->in_w, OH = l->out_h, OW = l->out_w;
    const int k = l->ksize, s = stride_of(l), pad = k / 2;
    const size_t ihw = (size_t)H * W, ohw = (size_t)OH * OW, ncol = (size_t)batch * ohw;
    memset(din, 0, sizeof(float) * (size_t)batch * D * ihw);
    for (int d = 0; d < D; d++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                const float *row = cols + ((size_t)(d * k + ki) * k + kj) * ncol;
                int x0, x1;
                valid_range(W, OW, kj, pad, s, &x0, &x1);
                for (int b = 0; b < batch; b++) {
                    float *img = din + ((size_t)b * D + d) * ihw;
                    for (int oy = 0; oy < OH; oy++) {
                        int sy = oy * s + ki - pad;
                        if (sy < 0 || sy >= H) continue;
                        const float *src = row + (size_t)b * ohw + (size_t)oy * OW;
                        float *dst = img + (size_t)sy * W;
                        for (int ox = x0; ox < x1; ox++)
                            dst[ox * s + kj - pad] += src[ox];
                    }
                }
            }
}

static void conv_forward(layer_t *l, const float *in, int batch) {
    const int K = l->out_c, D = l->in_c, k = l->ksize;
    const int rows = D * k * k;
    const size_t hw = (size_t)l->out_h * l->out_w, ncol = (size_t)batch * hw;
    im2col(l, in, batch, l->cols);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, K, (int)ncol, rows, 1.0f, l->w, rows,
                l->cols, (int)ncol, 0.0f, l->tmp, (int)ncol);
    for (int b = 0; b < batch; b++)
        for (int f = 0; f < K; f++) {
            const float *src = l->tmp + (size_t)f * ncol + (size_t)b * hw;
            float *dst = l->out + ((size_t)b * K + f) * hw;
            const float bias = l->b != NULL ? l->b[f] : 0.0f;
            for (size_t i = 0; i < hw; i++)
                dst[i] = src[i] + bias;
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
        if (l->db != NULL) l->db[f] = (float)sum;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, K, rows, (int)ncol, 1.0f, l->tmp,
                (int)ncol, l->cols, (int)ncol, 0.0f, l->dw, rows);
    if (l->dout == NULL) return; /* the first layer: nobody needs the image gradient */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, (int)ncol, K, 1.0f, l->w, rows,
                l->tmp, (int)ncol, 0.0f, l->cols, (int)ncol);
    col2im(l, l->cols, batch, l->dout);
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

static void gap_forward(layer_t *l, const float *in, int batch) {
    const size_t hw = (size_t)l->in_h * l->in_w, n = (size_t)batch * l->in_c;
    for (size_t i = 0; i < n; i++) {
        double sum = 0.0;
        for (size_t j = 0; j < hw; j++)
            sum += in[i * hw + j];
        l->out[i] = (float)(sum / (double)hw);
    }
}

static void gap_backward(layer_t *l, const float *dout, int batch) {
    const size_t hw = (size_t)l->in_h * l->in_w, n = (size_t)batch * l->in_c;
    const float scale = 1.0f / (float)hw;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < hw; j++)
            l->dout[i * hw + j] = dout[i] * scale;
}

/* ---- residual block ------------------------------------------------------------------------- *
 *
 *   forward                                      backward (g: gradient at the final relu)
 *     xa  = x + a1                                 g    = dout . [out > 0]
 *     c1  = conv1(xa)                              da4  = sum g      ds = sum g . c2
 *     mid = relu(c1 + a2) + a3                     dxa  = S^T g
 *     c2  = conv2(mid)                             dmid = conv2^T(s g)          da3 = sum dmid
 *     out = relu(s c2 + a4 + S(xa))                dp   = dmid . [c1 + a2 > 0]  da2 = sum dp
 *                                                  dxa += conv1^T(dp)           da1 = sum dxa
 * S: option A, out[b][c][y][x] = xa[b][c][s y][s x] for c < D, 0 for the padded channels. */

static void shortcut_add(const layer_t *l, const float *xa, int batch, float *out) {
    const int D = l->in_c, K = l->out_c, s = stride_of(l);
    const size_t ihw = (size_t)l->in_h * l->in_w, ohw = (size_t)l->out_h * l->out_w;
    for (int b = 0; b < batch; b++)
        for (int c = 0; c < D && c < K; c++) {
            const float *src = xa + ((size_t)b * D + c) * ihw;
            float *dst = out + ((size_t)b * K + c) * ohw;
            for (int y = 0; y < l->out_h; y++)
                for (int x = 0; x < l->out_w; x++)
                    dst[(size_t)y * l->out_w + x] += src[(size_t)y * s * l->in_w + (size_t)x * s];
        }
}

/* dxa = S^T g (overwrites dxa). */
static void shortcut_adjoint(const layer_t *l, const float *g, int batch, float *dxa) {
    const int D = l->in_c, K = l->out_c, s = stride_of(l);
    const size_t ihw = (size_t)l->in_h * l->in_w, ohw = (size_t)l->out_h * l->out_w;
    memset(dxa, 0, sizeof(float) * (size_t)batch * D * ihw);
    for (int b = 0; b < batch; b++)
        for (int c = 0; c < D && c < K; c++) {
            const float *src = g + ((size_t)b * K + c) * ohw;
            float *dst = dxa + ((size_t)b * D + c) * ihw;
            for (int y = 0; y < l->out_h; y++)
                for (int x = 0; x < l->out_w; x++)
                    dst[(size_t)y * s * l->in_w + (size_t)x * s] = src[(size_t)y * l->out_w + x];
        }
}

static void block_forward(layer_t *l, const float *in, int batch) {
    layer_t *c1 = &l->sub[0], *c2 = &l->sub[1];
    const float *p = l->b;
    const size_t nin = (size_t)batch * layer_in_size(l), nout = (size_t)batch * layer_out_size(l);
    for (size_t i = 0; i < nin; i++)
        l->xa[i] = in[i] + p[BLOCK_A1];
    conv_forward(c1, l->xa, batch);
    for (size_t i = 0; i < nout; i++) {
        float v = c1->out[i] + p[BLOCK_A2];
        l->mid[i] = (v > 0.0f ? v : 0.0f) + p[BLOCK_A3];
    }
    if (l->hook != NULL) l->hook(l->index, 0, l->hook_arg);
    conv_forward(c2, l->mid, batch);
    for (size_t i = 0; i < nout; i++)
        l->out[i] = p[BLOCK_SCALE] * c2->out[i] + p[BLOCK_A4];
    shortcut_add(l, l->xa, batch, l->out);
    for (size_t i = 0; i < nout; i++)
        if (l->out[i] < 0.0f) l->out[i] = 0.0f;
}

static double sum_floats(const float *x, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += x[i];
    return sum;
}

static void block_backward(layer_t *l, const float *dout, int batch) {
    layer_t *c1 = &l->sub[0], *c2 = &l->sub[1];
    const float *p = l->b;
    float *g = l->tmp;
    const size_t nin = (size_t)batch * layer_in_size(l), nout = (size_t)batch * layer_out_size(l);
    double ds = 0.0;
    for (size_t i = 0; i < nout; i++) {
        g[i] = l->out[i] > 0.0f ? dout[i] : 0.0f;
        ds += (double)g[i] * c2->out[i];
    }
    l->db[BLOCK_A4] = (float)sum_floats(g, nout);
    l->db[BLOCK_SCALE] = (float)ds;
    shortcut_adjoint(l, g, batch, l->dout);
    for (size_t i = 0; i < nout; i++)
        g[i] *= p[BLOCK_SCALE];
    conv_backward(c2, l->mid, g, batch);
    if (l->hook != NULL) l->hook(l->index, 1, l->hook_arg);
    float *dmid = c2->dout;
    l->db[BLOCK_A3] = (float)sum_floats(dmid, nout);
    for (size_t i = 0; i < nout; i++)
        if (!(c1->out[i] + p[BLOCK_A2] > 0.0f)) dmid[i] = 0.0f;
    l->db[BLOCK_A2] = (float)sum_floats(dmid, nout);
    conv_backward(c1, l->xa, dmid, batch);
    for (size_t i = 0; i < nin; i++)
        l->dout[i] += c1->dout[i];
    l->db[BLOCK_A1] = (float)sum_floats(l->dout, nin);
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
    case LAYER_GAP:
        gap_forward(l, in, batch);
        break;
    case LAYER_BLOCK:
        block_forward(l, in, batch);
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
    case LAYER_GAP:
        gap_backward(l, dout_next, batch);
        break;
    case LAYER_BLOCK:
        block_backward(l, dout_next, batch);
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

static layer_t *add_layer(net_t *net, int max_layers, layer_kind_t kind, int in_c, int in_h,
                          int in_w) {
    if (net->nlayers == max_layers) return NULL;
    layer_t *l = &net->layers[net->nlayers++];
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->index = net->nlayers - 1;
    l->in_c = l->out_c = in_c;
    l->in_h = l->out_h = in_h;
    l->in_w = l->out_w = in_w;
    return l;
}

/* Shapes a conv layer: K filters of k x k over its input, the given stride, a bias per filter
 * or none. */
static void shape_conv(layer_t *l, int K, int k, int stride, int bias) {
    l->kind = LAYER_CONV;
    l->out_c = K;
    l->ksize = k;
    l->stride = stride;
    l->out_h = conv_out_dim(l->in_h, stride);
    l->out_w = conv_out_dim(l->in_w, stride);
    l->nw = (size_t)K * l->in_c * k * k;
    l->nb = bias ? (size_t)K : 0;
}

static void free_layer_buffers(layer_t *l) {
    free(l->out);
    free(l->dout);
    free(l->cols);
    free(l->tmp);
    free(l->argmax);
    free(l->xa);
    free(l->mid);
    if (l->sub != NULL) {
        free_layer_buffers(&l->sub[0]);
        free_layer_buffers(&l->sub[1]);
        free(l->sub);
    }
}

void net_free(net_t *net) {
    for (int i = 0; i < net->nlayers; i++)
        free_layer_buffers(&net->layers[i]);
    free(net->layers);
    free(net->conv);
    free(net->params);
    free(net->grads);
    free(net->lr_scale);
    free(net->probs);
    free(net->dlogits);
    memset(net, 0, sizeof *net);
}

/* The cnn's layers: (conv -> relu -> pool) per channel entry, [fc -> relu], fc; the mlp's: no
 * conv, (fc -> relu) x depth, fc. */
static int build_cnn(net_t *net, const net_arch_t *arch, char *err, size_t errlen) {
    const int mlp = arch->model == NET_MLP, depth = mlp ? arch->depth : arch->hidden > 0;
    if (mlp ? arch->nconv != 0 || arch->depth < 1 || arch->depth > 16 || arch->hidden < 1
            : arch->nconv < 1 || arch->nconv > 8 || arch->hidden < 0) {
        snprintf(err, errlen,
                 "bad architecture: %d conv layers (cnn 1..8, mlp 0), hidden %d (cnn >= 0, mlp "
                 ">= 1), depth %d (mlp 1..16)",
                 arch->nconv, arch->hidden, arch->depth);
        return -1;
    }
    const int max_layers = 3 * arch->nconv + 2 * depth + 1;
    net->layers = calloc((size_t)max_layers, sizeof(layer_t));
    if (net->layers == NULL) return 1;
    int cc = net->in_c, hh = net->in_h, ww = net->in_w;
    for (int i = 0; i < arch->nconv; i++) {
        if (arch->channels[i] < 1 || hh < 2 || ww < 2) {
            snprintf(err, errlen, "bad architecture: conv layer %d has %d channels on %dx%d", i + 1,
                     arch->channels[i], hh, ww);
            return -1;
        }
        shape_conv(add_layer(net, max_layers, LAYER_CONV, cc, hh, ww), arch->channels[i],
                   arch->ksize, 1, 1);
        cc = arch->channels[i];
        add_layer(net, max_layers, LAYER_RELU, cc, hh, ww);
        layer_t *l = add_layer(net, max_layers, LAYER_POOL, cc, hh, ww);
        l->out_h = hh / 2;
        l->out_w = ww / 2;
        hh /= 2;
        ww /= 2;
    }
    int flat = cc * hh * ww;
    for (int d = 0; d < depth; d++) {
        layer_t *l = add_layer(net, max_layers, LAYER_FC, cc, hh, ww);
        l->out_c = arch->hidden;
        l->out_h = l->out_w = 1;
        l->nw = (size_t)arch->hidden * flat;
        l->nb = (size_t)arch->hidden;
        add_layer(net, max_layers, LAYER_RELU, arch->hidden, 1, 1);
        cc = flat = arch->hidden;
        hh = ww = 1;
    }
    layer_t *last = add_layer(net, max_layers, LAYER_FC, cc, hh, ww);
    last->out_c = arch->classes;
    last->out_h = last->out_w = 1;
    last->nw = (size_t)arch->classes * cc * hh * ww;
    last->nb = (size_t)arch->classes;
    return 0;
}

/* The resnet's layers: stem conv (stride 2) -> relu, 3 stages of `blocks` blocks, gap, fc. */
static int build_resnet(net_t *net, const net_arch_t *arch, char *err, size_t errlen) {
    const int n = arch->blocks;
    if (arch->nconv != 3 || n < 1 || n > 64 || arch->hidden != 0 || arch->channels[0] < 1 ||
        arch->channels[1] < arch->channels[0] || arch->channels[2] < arch->channels[1]) {
        snprintf(err, errlen,
                 "bad architecture: the resnet takes 3 non-decreasing stage widths (got %d), "
                 "1..64 blocks per stage (got %d), no hidden fc layer (got %d)",
                 arch->nconv, n, arch->hidden);
        return -1;
    }
    const int max_layers = 3 * n + 4;
    net->layers = calloc((size_t)max_layers, sizeof(layer_t));
    if (net->layers == NULL) return 1;
    int cc = net->in_c, hh = net->in_h, ww = net->in_w;
    layer_t *stem = add_layer(net, max_layers, LAYER_CONV, cc, hh, ww);
    shape_conv(stem, arch->channels[0], arch->ksize, 2, 1);
    cc = stem->out_c;
    hh = stem->out_h;
    ww = stem->out_w;
    add_layer(net, max_layers, LAYER_RELU, cc, hh, ww);
    for (int stage = 0; stage < 3; stage++)
        for (int j = 0; j < n; j++) {
            const int K = arch->channels[stage], stride = stage > 0 && j == 0 ? 2 : 1;
            layer_t *l = add_layer(net, max_layers, LAYER_BLOCK, cc, hh, ww);
            l->stride = stride;
            l->out_c = K;
            l->out_h = conv_out_dim(hh, stride);
            l->out_w = conv_out_dim(ww, stride);
            l->nb = BLOCK_SCALARS;
            l->sub = calloc(2, sizeof(layer_t));
            if (l->sub == NULL) return 1;
            l->sub[0].in_c = cc;
            l->sub[0].in_h = hh;
            l->sub[0].in_w = ww;
            shape_conv(&l->sub[0], K, arch->ksize, stride, 0);
            l->sub[1].in_c = K;
            l->sub[1].in_h = l->out_h;
            l->sub[1].in_w = l->out_w;
            shape_conv(&l->sub[1], K, arch->ksize, 1, 0);
            cc = K;
            hh = l->out_h;
            ww = l->out_w;
        }
    layer_t *gap = add_layer(net, max_layers, LAYER_GAP, cc, hh, ww);
    gap->out_h = gap->out_w = 1;
    layer_t *fc = add_layer(net, max_layers, LAYER_FC, cc, 1, 1);
    fc->out_c = arch->classes;
    fc->nw = (size_t)arch->classes * cc;
    fc->nb = (size_t)arch->classes;
    return 0;
}

/* Lists the conv layers (those inside blocks too) in network order. */
static int list_convs(net_t *net) {
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        n = 0;
        for (int i = 0; i < net->nlayers; i++) {
            layer_t *l = &net->layers[i];
            for (int j = 0; j < (l->kind == LAYER_BLOCK ? 2 : 1); j++) {
                layer_t *c = l->kind == LAYER_BLOCK ? &l->sub[j] : l;
                if (c->kind != LAYER_CONV) continue;
                if (pass == 1) net->conv[n] = c;
                n++;
            }
        }
        if (pass == 0) {
            net->conv = calloc((size_t)(n > 0 ? n : 1), sizeof(layer_t *));
            if (net->conv == NULL) return -1;
        }
    }
    net->nconv = n;
    return 0;
}

/* Points every layer's parameters into the flat arrays: conv weights first, in network order,
 * then the rest (fc weights and every bias) in layer order. */
static int place_params(net_t *net) {
    size_t total = 0;
    for (int i = 0; i < net->nlayers; i++) {
        const layer_t *l = &net->layers[i];
        total += l->nw + l->nb;
        if (l->kind == LAYER_BLOCK) total += l->sub[0].nw + l->sub[1].nw; /* convs, no biases */
    }
    net->nparams = total;
    net->params = calloc(total, sizeof(float));
    net->grads = calloc(total, sizeof(float));
    if (net->params == NULL || net->grads == NULL) return -1;
    size_t off = 0;
    for (int i = 0; i < net->nconv; i++) {
        layer_t *l = net->conv[i];
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
    return 0;
}

static int alloc_buffers(layer_t *l, int capacity, int need_dout) {
    const size_t cin = (size_t)capacity * layer_in_size(l);
    const size_t cout = (size_t)capacity * layer_out_size(l);
    if ((l->out = malloc(sizeof(float) * cout)) == NULL) return -1;
    if (need_dout && (l->dout = malloc(sizeof(float) * cin)) == NULL) return -1;
    if (l->kind == LAYER_CONV) {
        size_t ncol = (size_t)capacity * l->out_h * l->out_w;
        l->cols = malloc(sizeof(float) * ncol * (size_t)l->in_c * l->ksize * l->ksize);
        l->tmp = malloc(sizeof(float) * ncol * (size_t)l->out_c);
        if (l->cols == NULL || l->tmp == NULL) return -1;
    }
    if (l->kind == LAYER_POOL && (l->argmax = malloc(sizeof(int) * cout)) == NULL) return -1;
    if (l->kind == LAYER_BLOCK) {
        l->tmp = malloc(sizeof(float) * cout);
        l->xa = malloc(sizeof(float) * cin);
        l->mid = malloc(sizeof(float) * cout);
        if (l->tmp == NULL || l->xa == NULL || l->mid == NULL) return -1;
        if (alloc_buffers(&l->sub[0], capacity, 1) != 0) return -1;
        if (alloc_buffers(&l->sub[1], capacity, 1) != 0) return -1;
    }
    return 0;
}

static void init_he(layer_t *l, double scale, rng_t *rng) {
    double fan_in = (double)l->nw / (double)l->out_c;
    double sd = scale * sqrt(2.0 / fan_in);
    for (size_t j = 0; j < l->nw; j++)
        l->w[j] = (float)(sd * rng_normal(rng));
}

int net_create(net_t *net, const net_arch_t *arch, int c, int h, int w, int capacity, uint64_t seed,
               char *err, size_t errlen) {
    memset(net, 0, sizeof *net);
    if (arch->ksize < 1 || arch->ksize % 2 == 0 || arch->classes < 2 || capacity < 1 ||
        (arch->model != NET_CNN && arch->model != NET_RESNET && arch->model != NET_MLP)) {
        snprintf(err, errlen,
                 "bad architecture: model %d (0 cnn, 1 resnet, 2 mlp), kernel %d (odd), %d classes "
                 "(>= 2), batch capacity %d (>= 1)",
                 arch->model, arch->ksize, arch->classes, capacity);
        return -1;
    }
    net->capacity = capacity;
    net->in_c = c;
    net->in_h = h;
    net->in_w = w;
    net->classes = arch->classes;
    int rc = arch->model == NET_RESNET ? build_resnet(net, arch, err, errlen)
                                       : build_cnn(net, arch, err, errlen);
    if (rc < 0) {
        net_free(net);
        return -1;
    }
    if (rc > 0 || list_convs(net) != 0 || place_params(net) != 0) goto err_nomem;

    rng_t rng = {seed * 0x2545f4914f6cdd1dull + 1};
    if (arch->model != NET_RESNET) {
        /* He-normal weights from one stream, in layer order; biases stay zero */
        for (int i = 0; i < net->nlayers; i++)
            if (net->layers[i].nw > 0) init_he(&net->layers[i], 1.0, &rng);
    } else {
        /* Fixup: the stem He-normal, each branch's first conv He-normal x L^(-1/2), its last
         * conv and the fc zero (calloc), scalar biases 0, multipliers 1 */
        const double branch_scale = 1.0 / sqrt(3.0 * arch->blocks);
        for (int i = 0; i < net->nlayers; i++) {
            layer_t *l = &net->layers[i];
            if (l->kind == LAYER_CONV) init_he(l, 1.0, &rng);
            if (l->kind == LAYER_BLOCK) {
                init_he(&l->sub[0], branch_scale, &rng);
                l->b[BLOCK_SCALE] = 1.0f;
            }
        }
        if ((net->lr_scale = malloc(sizeof(float) * net->nparams)) == NULL) goto err_nomem;
        for (size_t j = 0; j < net->nparams; j++)
            net->lr_scale[j] = 1.0f;
        for (int i = 0; i < net->nlayers; i++)
            for (size_t j = 0; j < net->layers[i].nb; j++)
                net->lr_scale[net->layers[i].b - net->params + (ptrdiff_t)j] = 0.1f;
    }

    for (int i = 0; i < net->nlayers; i++) {
        layer_t *l = &net->layers[i];
        if (alloc_buffers(l, capacity, i > 0 || l->kind == LAYER_BLOCK) != 0) goto err_nomem;
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
    return net_forward_each(net, images, batch, NULL, NULL);
}

const float *net_forward_each(net_t *net, const float *images, int batch,
                              net_layer_before_fn before, void *arg) {
    const float *in = images;
    for (int i = 0; i < net->nlayers; i++) {
        if (before != NULL) before(i, arg);
        layer_forward(&net->layers[i], in, batch);
        in = net->layers[i].out;
    }
    return in;
}

double net_loss(net_t *net, const uint8_t *labels, int batch, long *correct) {
    const float *logits = net->layers[net->nlayers - 1].out;
    return softmax_xent(logits, labels, batch, net->classes, net->probs, net->dlogits, correct);
}

void net_backward_each(net_t *net, const float *images, int batch, net_layer_done_fn done,
                       void *arg) {
    const float *dnext = net->dlogits;
    for (int i = net->nlayers - 1; i >= 0; i--) {
        layer_t *l = &net->layers[i];
        const float *in = i > 0 ? net->layers[i - 1].out : images;
        layer_backward(l, in, dnext, batch);
        if (done != NULL) done(i, in, dnext, arg);
        dnext = l->dout;
    }
}

void net_backward(net_t *net, const float *images, int batch) {
    net_backward_each(net, images, batch, NULL, NULL);
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
