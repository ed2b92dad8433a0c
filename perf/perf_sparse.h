/*
 * perf_sparse.h -- gvq-perf's sparse-variable benchmark (-C sparse-ag|ps|dense): one embedding-
 * like variable of --rows x --dim floats, each rank touching a fraction --alpha of the rows per
 * step with a Zipf-skewed access pattern, aggregated by gvq's sparse allgatherv, by its
 * parameter server (push, apply, pull) or densely (gvqAllReduce of the whole variable).
 * Reports time per step and bytes on the wire per rank next to the Parallax cost table
 * (docs/ALGORITHMS.md section 4); --ps-tune runs gvqPsTunePartitions and a sweep of P beside it.
 */
#ifndef PERF_SPARSE_H_
#define PERF_SPARSE_H_

/* 1 when argv selects a sparse mode: -C / --codec naming sparse-ag, ps or dense. */
int perf_sparse_requested(int argc, char **argv);

/* The sparse benchmark; MPI is initialized (perf_mpi_init) and finalized by the caller. Returns
 * the exit status: 0 ok, 2 bad arguments, 1 a result differed between the methods. */
int perf_sparse_main(int argc, char **argv);

#endif /* PERF_SPARSE_H_ */
