/*
 * text.h -- gvq-train --model text (text.c): a bag-of-words classifier over the apt lists'
 * package descriptions, with its embedding table as the training layer's sparse variable.
 */
#ifndef GVQ_TRAIN_TEXT_H_
#define GVQ_TRAIN_TEXT_H_

#include <mpi.h>

typedef struct {
    const char *data; /* "section<TAB>name description" lines (apps/gvq-train/apt-text.sh) */
    int vocab, dim;   /* hashed vocabulary rows, embedding width */
    int batch;        /* documents per rank and step */
    int epochs;       /* used when iters is 0 */
    long iters;
    double lr;
    unsigned long long seed;
    int route;       /* the layer's sparseRoute (GVQ_CONFIG_UNDEF_INT: Parallax's rule) */
    int print_every; /* a line (with test accuracy) every N steps */
    int staleness;   /* >= 0: the parameter server served at any time, this SSP bound; -1: not */
    int partitions;  /* > 0: the parameter server's partitions, untuned; 0: the layer's tuner */
} text_opts_t;

/* Trains on every rank of MPI_COMM_WORLD; 0 when it ran and the ranks agreed. */
int text_run(const text_opts_t *o);

#endif /* GVQ_TRAIN_TEXT_H_ */
