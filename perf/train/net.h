/*
 * net.h -- the CNN of gvq-train: layers with forward and backward passes in plain C and CBLAS.
 *
 * A network is a chain of layers over a batch of images in NCHW order (batch, channels, height,
 * width). Layer kinds:
 *
 *   conv   K filters of D x k x k, stride 1, "same" zero padding, one bias per filter; weights
 *          [K][D][k][k] (the framework layout GradiVeQ's flattening starts from). Forward is
 *          im2col over the whole batch, then one sgemm:  out[K][B*H*W] = W[K][D*k*k] cols.
 *   relu   in place on its input's copy.
 *   pool   2 x 2 max pooling, stride 2 (odd sizes drop the last row/column); remembers argmax.
 *   fc     out[B][O] = in[B][I] W^T + b, weights [O][I].
 *
 * and a softmax cross-entropy loss on the last layer's output (the mean over the batch).
 *
 * Parameters live in one flat array, and so do their gradients, in this order: the weights of
 * every conv layer (one block each, in network order), then everything else (conv biases, fc
 * weights and biases). So each conv layer's weight gradient is one contiguous [K][D][k][k]
 * tensor that can go through its own compressor, and the rest is one more contiguous block.
 *
 * The layer functions are exposed so tests can check each one against finite differences.
 */
#ifndef GVQ_TRAIN_NET_H_
#define GVQ_TRAIN_NET_H_

#include <stddef.h>
#include <stdint.h>

typedef enum { LAYER_CONV, LAYER_RELU, LAYER_POOL, LAYER_FC } layer_kind_t;

typedef struct {
    layer_kind_t kind;
    int in_c, in_h, in_w;    /* input shape per image */
    int out_c, out_h, out_w; /* output shape per image */
    int ksize;               /* conv: kernel size (odd) */
    float *w, *b;            /* parameters (into the network's flat array) */
    float *dw, *db;          /* their gradients (into the network's flat gradient array) */
    size_t nw, nb;           /* sizes of w and b */
    float *out;              /* forward output, capacity x out size */
    float *dout;             /* gradient with respect to this layer's input, capacity x in size */
    float *cols;             /* conv: im2col buffer [D*k*k][capacity*H*W]; also reused for dW */
    float *tmp;              /* conv: gemm output / its gradient in [K][B*H*W] order */
    int *argmax;             /* pool: index of the max inside the input, per output element */
} layer_t;

typedef struct {
    int nlayers;
    layer_t *layers;
    int capacity;         /* largest batch the buffers hold */
    int in_c, in_h, in_w; /* image shape */
    int classes;
    size_t nparams;     /* floats in params (and grads) */
    size_t conv_params; /* floats of the leading conv-weight blocks */
    float *params, *grads;
    float *probs;   /* softmax output, capacity x classes */
    float *dlogits; /* loss gradient with respect to the logits */
} net_t;

/* Architecture: conv layers with the given output channels (each conv -> relu -> 2x2 pool), an
 * optional hidden fc layer (hidden > 0: fc -> relu), then an fc layer to `classes` outputs. */
typedef struct {
    int nconv;
    int channels[8];
    int ksize;
    int hidden;
    int classes;
} net_arch_t;

/* Builds the network for images of c x h x w and batches up to `capacity`, with parameters
 * initialized from `seed` (He-normal weights, zero biases; the same on every rank). Returns 0,
 * or -1 with a message in err (bad architecture, no memory). */
int net_create(net_t *net, const net_arch_t *arch, int c, int h, int w, int capacity, uint64_t seed,
               char *err, size_t errlen);
void net_free(net_t *net);

/* Forward pass over `batch` images (batch x c x h x w floats); returns the logits
 * (batch x classes, owned by the net). */
const float *net_forward(net_t *net, const float *images, int batch);

/* Softmax cross-entropy of the last forward pass against labels: returns the mean loss over the
 * batch, adds the number of correct argmax predictions to *correct, and leaves the gradient of
 * the mean loss with respect to the logits in net->dlogits. */
double net_loss(net_t *net, const uint8_t *labels, int batch, long *correct);

/* Backward pass from net->dlogits: writes every parameter gradient into net->grads
 * (overwriting). Needs the forward pass of the same batch. */
void net_backward(net_t *net, const float *images, int batch);

/* Number of predictions matching labels, forward only. */
long net_count_correct(net_t *net, const float *images, const uint8_t *labels, int batch);

/* The layer kernels, for tests. `in` is the layer's input of `batch` images; backward takes the
 * gradient with respect to the output and writes the parameter gradients and l->dout. */
void layer_forward(layer_t *l, const float *in, int batch);
void layer_backward(layer_t *l, const float *in, const float *dout_next, int batch);
size_t layer_in_size(const layer_t *l);
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
