/*
 * pipe.h -- gvq-train --stages S: the model cut into S pipeline stages, one per rank, trained
 * with GPipe's schedule through the training layer's gvqPipe (pipe.c).
 */
#ifndef GVQ_TRAIN_PIPE_H_
#define GVQ_TRAIN_PIPE_H_

#include <mpi.h>

#include "train.h"

/* Runs the pipelined training (o->stages = the rank count); returns 0, or -1 after printing
 * why. Collective over comm. */
int pipe_run(const train_opts_t *o, MPI_Comm comm, train_result_t *res);

#endif /* GVQ_TRAIN_PIPE_H_ */
