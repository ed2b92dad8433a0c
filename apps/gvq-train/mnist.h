/*
 * mnist.h -- Fashion-MNIST (or MNIST) from gzip-compressed IDX files, read with zlib.
 *
 * Debian's dataset-fashion-mnist installs them under /usr/share/datasets/fashion-mnist/ as
 * train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and
 * t10k-labels-idx1-ubyte.gz. IDX: a big-endian magic (0x00000803 for images, 0x00000801 for
 * labels), the count, for images the rows and columns, then one unsigned byte per value.
 *
 * Images stay bytes in memory (47 MB for the training set, not 188 MB as floats per rank);
 * mnist_batch converts the ones a step needs.
 */
#ifndef GVQ_TRAIN_MNIST_H_
#define GVQ_TRAIN_MNIST_H_

#include <stddef.h>
#include <stdint.h>

#define MNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#define MNIST_PACKAGE "dataset-fashion-mnist"

typedef struct {
    int n, rows, cols;
    uint8_t *pixels; /* n x rows x cols */
    uint8_t *labels; /* n */
} mnist_set_t;

/* Loads `prefix` ("train" or "t10k") from dir, keeping at most `limit` images (0: all).
 * Returns 0, or -1 with a message in err: a missing file names the Debian package. */
int mnist_load(mnist_set_t *set, const char *dir, const char *prefix, int limit, char *err,
               size_t errlen);
void mnist_free(mnist_set_t *set);

/* Writes images idx[0..n) as normalized floats (1 x rows x cols each) and their labels. */
void mnist_batch(const mnist_set_t *set, const int *idx, int n, float *images, uint8_t *labels);

#endif /* GVQ_TRAIN_MNIST_H_ */
