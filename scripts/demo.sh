#!/usr/bin/env bash
# demo.sh -- install what is missing, build, and run gvq-perf on 4 local ranks: gvq's ring
# allreduce next to Open MPI's MPI_Allreduce, nccl-tests style. Extra arguments go to gvq-perf.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
gvq_install_packages
gvq_build
NP=${GVQ_DEMO_RANKS:-4}
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(-b 1K -e 64M -f 4 -n 10 -w 3 -C none,mpi)
echo "== mpirun -np $NP gvq-perf ${ARGS[*]}"
mpirun -np "$NP" --oversubscribe "$GVQ_BUILD_DIR/perf/gvq-perf" "${ARGS[@]}"
