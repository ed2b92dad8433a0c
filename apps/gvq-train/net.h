/*
 * net.h -- the networks of gvq-train: layers with forward and backward passes in plain C and
 * CBLAS, over a batch of images in NCHW order (batch, channels, height, width). Layer kinds:
 *
 *   conv   K filters of D x k x k, stride 1 or 2, "same" zero padding (k/2; output ceil(in /
 *          stride)), one bias per filter or none; weights [K][D][k][k] (the framework layout
 *          GradiVeQ's flattening starts from). Forward is im2col over the whole batch, then one
 *          sgemm:  out[K][B*OH*OW] = W[K][D*k*k] cols.
 *   relu   on a copy of its input.
 *   pool   2 x 2 max pooling, stride 2 (odd sizes drop the last row/column); remembers argmax.
 *   gap    global average pooling: C x H x W -> C.
 *   fc     out[B][O] = in[B][I] W^T + b, weights [O][I].
 *   block  a residual basic block (below): two bias-free convs and five scalars.
 *
 * and a softmax cross-entropy loss on the last layer's output (the mean over the batch).
 *
 * Two models (net_arch_t.model):
 *
 *   cnn     conv -> relu -> pool per entry of channels, [fc -> relu], fc (the default; He-normal
 *           weights, zero biases).
 *   resnet  the CIFAR ResNet-(6n+2) of He et al. (2016), the family GradiVeQ's paper trains,
 *           for 28 x 28 images: stem conv (channels[0], stride 2: 28 -> 14) -> relu; three
 *           stages of n blocks with channels[0..2] filters (16, 32, 64), the first block of
 *           stages 2 and 3 with stride 2 (14 -> 7 -> 4); global average pooling; fc -> classes.
 *           n = 1 is ResNet-8, n = 3 ResNet-20. A block (Fixup form, Zhang et al., ICLR 2019):
 *
 *               xa  = x + a1                          a1..a4, s: scalars of the block
 *               out = relu( s conv2(relu(conv1(xa) + a2) + a3) + a4  +  S(xa) )
 *
 *           S, the shortcut: identity, or where the block changes shape the parameter-free
 *           "option A" of He et al. (take every stride-th pixel, zero-pad the extra channels).
 *           So every weight tensor but the fc is a k x k conv [K][D][k][k].
 *
 *           No batch normalization: its running statistics are per rank in data-parallel
 *           training and would differ between ranks unless synchronized, and gvq needs
 *           bitwise-identical weights on every rank. Fixup initialization trains a deep residual
 *           net without it: the stem conv He-normal; the first conv of each of the L = 3n
 *           residual branches He-normal scaled by L^(-1/(2m-2)) = L^(-1/2) (m = 2 layers per
 *           branch), the last conv of each branch and the fc weights zero, so every block starts
 *           as the identity and the output's variance does not grow with depth; the scalar
 *           biases start at 0, the multipliers s at 1. As in Fixup's training code, the biases
 *           and scalars learn at 1/10 of the learning rate (net_t.lr_scale).
 *   mlp     fully connected only: `depth` hidden layers of `hidden` units (fc -> relu each), then
 *           fc -> classes (He-normal weights, zero biases): large weights and small activations,
 *           the shape pipeline model parallelism is for (gvq-train --stages).
 *
 * Parameters live in one flat array, and so do their gradients, in this order: the weights of
 * every conv layer (one block each, in network order, convs inside residual blocks included),
 * then everything else (conv biases, the blocks' scalars, fc weights and biases). So each conv
 * layer's weight gradient is one contiguous [K][D][k][k] tensor that can go through its own
 * compressor (net_t.conv lists them), and the rest is one more contiguous block.
 *
 * The layer functions are exposed so tests can check each one against finite differences.
 */
#ifndef GVQ_TRAIN_NET_H_
#define GVQ_TRAIN_NET_H_

#include <stddef.h>
#include <stdint.h>

typedef enum { LAYER_CONV, LAYER_RELU, LAYER_POOL, LAYER_FC, LAYER_GAP, LAYER_BLOCK } layer_kind_t;

typedef enum { NET_CNN = 0, NET_RESNET = 1, NET_MLP = 2 } net_model_t;

/* A residual block's scalars, in this order in its b (and db): */
enum { BLOCK_A1, BLOCK_A2, BLOCK_A3, BLOCK_SCALE, BLOCK_A4, BLOCK_SCALARS };

typedef struct layer {
    layer_kind_t kind;
    int in_c, in_h, in_w;    /* input shape per image */
    int out_c, out_h, out_w; /* output shape per image */
    int ksize;               /* conv: kernel size (odd) */
    int stride;              /* conv and block: 1 or 2 (0 reads as 1) */
    float *w, *b;            /* parameters (into the network's flat array); conv b may be NULL */
    float *dw, *db;          /* their gradients (into the network's flat gradient array) */
    size_t nw, nb;           /* sizes of w and b */
    float *out;              /* forward output, capacity x out size */
    float *dout;             /* gradient with respect to this layer's input, capacity x in size */
    float *cols;             /* conv: im2col buffer [D*k*k][capacity*H*W]; also reused for dW */
    float *tmp;              /* conv: gemm output / its gradient in [K][B*H*W] order;
                                block: the gradient at the final relu, capacity x out size */
    int *argmax;             /* pool: index of the max inside the input, per output element */
    struct layer *sub;       /* block: conv1, conv2 */
    float *xa;               /* block: x + a1, capacity x in size */
    float *mid;              /* block: conv2's input, capacity x out size */
    /* block: called just before conv2's forward (phase 0) and just after its backward wrote
     * its weight gradient (phase 1), with `index` (the layer's in the network) and hook_arg:
     * where a trainer waits for, or hands over, conv2's weights alone */
    void (*hook)(int index, int phase, void *arg);
    void *hook_arg;
    int index;
} layer_t;

typedef struct {
    int nlayers;
    layer_t *layers;
    int capacity;         /* largest batch the buffers hold */
    int in_c, in_h, in_w; /* image shape */
    int classes;
    size_t nparams;     /* floats in params (and grads) */
    size_t conv_params; /* floats of the leading conv-weight blocks */
    int nconv;          /* conv layers, those inside blocks included */
    layer_t **conv;     /* ... in network order (the order of their weight blocks) */
    float *params, *grads;
    float *lr_scale; /* per parameter learning-rate factor (resnet: 0.1 for biases and the
                        blocks' scalars, as Fixup trains them; NULL: 1 for all) */
    float *probs;    /* softmax output, capacity x classes */
    float *dlogits;  /* loss gradient with respect to the logits */
} net_t;

/* Architecture. cnn: conv layers with the given output channels (each conv -> relu -> 2x2 pool),
 * an optional hidden fc layer (hidden > 0: fc -> relu), then an fc layer to `classes` outputs.
 * resnet: channels[0..2] are the stages' widths (nconv must be 3), `blocks` the n of
 * ResNet-(6n+2), hidden must be 0. mlp: nconv 0, `depth` (>= 1) hidden layers of `hidden` (>= 1)
 * units. */
typedef struct {
    int nconv;
    int channels[8];
    int ksize;
    int hidden;
    int classes;
    int model;  /* net_model_t */
    int blocks; /* resnet: blocks per stage */
    int depth;  /* mlp: hidden layers (cnn: 0 or 1 from hidden) */
} net_arch_t;

/* Builds the network for images of c x h x w and batches up to `capacity`, with parameters
 * initialized from `seed` (cnn: He-normal weights, zero biases; resnet: Fixup, see above; the
 * same on every rank). Returns 0, or -1 with a message in err (bad architecture, no memory). */
int net_create(net_t *net, const net_arch_t *arch, int c, int h, int w, int capacity, uint64_t seed,
               char *err, size_t errlen);
void net_free(net_t *net);

/* Forward pass over `batch` images (batch x c x h x w floats); returns the logits
 * (batch x classes, owned by the net). */
const float *net_forward(net_t *net, const float *images, int batch);
/* The same, calling before(i, arg) just before layer i's forward (layers from the first to the
 * last): where a deferred update of layer i's weights is made. */
typedef void (*net_layer_before_fn)(int layer, void *arg);
const float *net_forward_each(net_t *net, const float *images, int batch,
                              net_layer_before_fn before, void *arg);

/* Softmax cross-entropy of the last forward pass against labels: returns the mean loss over the
 * batch, adds the number of correct argmax predictions to *correct, and leaves the gradient of
 * the mean loss with respect to the logits in net->dlogits. */
double net_loss(net_t *net, const uint8_t *labels, int batch, long *correct);

/* Backward pass from net->dlogits: writes every parameter gradient into net->grads
 * (overwriting). Needs the forward pass of the same batch. */
void net_backward(net_t *net, const float *images, int batch);
/* The same, calling done(i, in, dout_next, arg) as soon as layer i's parameter gradients are
 * written (layers from the last to the first), with the layer's input and the gradient with
 * respect to its output (an fc layer's sufficient factors): where wait-free backprop hands them
 * to the training layer. */
typedef void (*net_layer_done_fn)(int layer, const float *in, const float *dout_next, void *arg);
void net_backward_each(net_t *net, const float *images, int batch, net_layer_done_fn done,
                       void *arg);

/* Number of predictions matching labels, forward only. */
long net_count_correct(net_t *net, const float *images, const uint8_t *labels, int batch);

/* The layer kernels, for tests. `in` is the layer's input of `batch` images; backward takes the
 * gradient with respect to the output and writes the parameter gradients and l->dout. */
void layer_forward(layer_t *l, const float *in, int batch);
void layer_backward(layer_t *l, const float *in, const float *dout_next, int batch);
size_t layer_in_size(const layer_t *l);
/* Output side of a "same"-padded convolution or pooling of stride s: ceil(n / s). */
int conv_out_dim(int n, int stride);
size_t layer_out_size(const layer_t *l);

/* Softmax cross-entropy of logits (batch x classes) against labels, the mean over the batch;
 * probs and dlogits (batch x classes) receive the softmax and the gradient of the mean loss. */
double softmax_xent(const float *logits, const uint8_t *labels, int batch, int classes,
                    float *probs, float *dlogits, long *correct);

/* A 64-bit FNV-1a hash of n floats' bits (weight checksums compared across ranks). */
uint64_t hash_floats(const float *x, size_t n);

/* Deterministic random numbers (splitmix64): uniform in [0, 1) and standard normal. */
typedef struct {
    uint64_t s;
} rng_t;
double rng_uniform(rng_t *r);
double rng_normal(rng_t *r);

#endif /* GVQ_TRAIN_NET_H_ */
