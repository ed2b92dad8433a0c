/*
 * mnist.c -- IDX files through zlib's gzread (see mnist.h).
 */
#include "mnist.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* Fashion-MNIST's pixel mean and standard deviation over the training set (in [0, 1] units). */
#define MNIST_MEAN 0.2860f
#define MNIST_STD 0.3530f

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Reads one IDX file: header words into hdr (magic first), then at most `keep` items of
 * item_bytes each into a fresh buffer. */
static int read_idx(const char *path, uint32_t magic, int nwords, uint32_t *hdr, int limit,
                    size_t item_bytes_of_hdr(const uint32_t *), uint8_t **data, int *kept,
                    char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen,
                 "cannot open %s: %s. gvq-train reads Fashion-MNIST from the Debian package %s "
                 "(apt-get install %s), or from the directory given with --data",
                 path, strerror(errno), MNIST_PACKAGE, MNIST_PACKAGE);
        return -1;
    }
    gzFile f = gzopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "cannot open %s with zlib", path);
        return -1;
    }
    unsigned char h[16];
    if (gzread(f, h, (unsigned)(4 * nwords)) != 4 * nwords) {
        snprintf(err, errlen, "%s: truncated IDX header", path);
        gzclose(f);
        return -1;
    }
    for (int i = 0; i < nwords; i++)
        hdr[i] = be32(h + 4 * i);
    if (hdr[0] != magic) {
        snprintf(err, errlen, "%s: IDX magic 0x%08x, expected 0x%08x", path, hdr[0], magic);
        gzclose(f);
        return -1;
    }
    int n = (int)hdr[1];
    if (hdr[1] > (1u << 24)) {
        snprintf(err, errlen, "%s: implausible item count %u", path, hdr[1]);
        gzclose(f);
        return -1;
    }
    if (limit > 0 && limit < n) n = limit;
    size_t item = item_bytes_of_hdr(hdr);
    size_t bytes = (size_t)n * item;
    uint8_t *buf = malloc(bytes > 0 ? bytes : 1);
    if (buf == NULL) {
        snprintf(err, errlen, "%s: out of memory for %zu bytes", path, bytes);
        gzclose(f);
        return -1;
    }
    size_t got = 0;
    while (got < bytes) {
        unsigned want = bytes - got > (1u << 30) ? (1u << 30) : (unsigned)(bytes - got);
        int k = gzread(f, buf + got, want);
        if (k <= 0) {
            int zerr = 0;
            const char *msg = gzerror(f, &zerr);
            snprintf(err, errlen, "%s: truncated after %zu of %zu bytes (%s)", path, got, bytes,
                     zerr != Z_OK ? msg : "end of file");
            free(buf);
            gzclose(f);
            return -1;
        }
        got += (size_t)k;
    }
    gzclose(f);
    *data = buf;
    *kept = n;
    return 0;
}

static size_t image_bytes(const uint32_t *hdr) {
    return (size_t)hdr[2] * hdr[3];
}
static size_t label_bytes(const uint32_t *hdr) {
    (void)hdr;
    return 1;
}

int mnist_load(mnist_set_t *set, const char *dir, const char *prefix, int limit, char *err,
               size_t errlen) {
    memset(set, 0, sizeof *set);
    char path[4096];
    uint32_t hdr[4];
    int nimg = 0, nlab = 0;
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    if (read_idx(path, 0x00000803u, 4, hdr, limit, image_bytes, &set->pixels, &nimg, err, errlen))
        return -1;
    if (hdr[2] < 1 || hdr[2] > 4096 || hdr[3] < 1 || hdr[3] > 4096) {
        snprintf(err, errlen, "%s: implausible image size %ux%u", path, hdr[2], hdr[3]);
        mnist_free(set);
        return -1;
    }
    set->rows = (int)hdr[2];
    set->cols = (int)hdr[3];
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    if (read_idx(path, 0x00000801u, 2, hdr, limit, label_bytes, &set->labels, &nlab, err, errlen)) {
        mnist_free(set);
        return -1;
    }
    if (nlab != nimg) {
        snprintf(err, errlen, "%s: %d labels for %d images", path, nlab, nimg);
        mnist_free(set);
        return -1;
    }
    for (int i = 0; i < nlab; i++)
        if (set->labels[i] > 9) {
            snprintf(err, errlen, "%s: label %d of item %d is not a class 0..9", path,
                     set->labels[i], i);
            mnist_free(set);
            return -1;
        }
    set->n = nimg;
    return 0;
}

void mnist_free(mnist_set_t *set) {
    free(set->pixels);
    free(set->labels);
    memset(set, 0, sizeof *set);
}

void mnist_batch(const mnist_set_t *set, const int *idx, int n, float *images, uint8_t *labels) {
    const size_t px = (size_t)set->rows * set->cols;
    for (int i = 0; i < n; i++) {
        const uint8_t *src = set->pixels + (size_t)idx[i] * px;
        float *dst = images + (size_t)i * px;
        for (size_t j = 0; j < px; j++)
            dst[j] = ((float)src[j] * (1.0f / 255.0f) - MNIST_MEAN) * (1.0f / MNIST_STD);
        labels[i] = set->labels[idx[i]];
    }
}
