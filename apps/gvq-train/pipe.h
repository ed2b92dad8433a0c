/*
 * pipe.h -- gvq-train --stages S: the model cut into S pipeline stages, trained with GPipe's
 * schedule through the training layer's gvqPipe (pipe.c), on S ranks or R replicas x S ranks.
 * With R > 1 each stage's replicas average its gradients through the training layer (the codec
 * options apply, as in data-parallel training).
 */
#ifndef GVQ_TRAIN_PIPE_H_
#define GVQ_TRAIN_PIPE_H_

#include <mpi.h>

#include "train.h"

/* Runs the pipelined training (the rank count a multiple of o->stages); returns 0, or -1 after
 * printing why. Collective over comm. */
int pipe_run(const train_opts_t *o, MPI_Comm comm, train_result_t *res);

#endif /* GVQ_TRAIN_PIPE_H_ */
