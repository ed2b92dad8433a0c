#!/usr/bin/env bash
# device-bundle.sh BUILD OUTDIR -- pack what the GPU checks need onto a bare GPU machine that has
# CUDA but neither Open MPI nor OpenBLAS/LAPACKE: the GPU test binaries and gvq-gpu-bench from
# BUILD (configured here with CUDA), the host libraries they load (not CUDA's: the GPU machine's
# own cuBLAS/cuSOLVER/NCCL are used), Open MPI's runtime tree for mpirun, and UCX's libraries
# and transport modules (libgvq links libucp when built with libucx-dev). Writes
# OUTDIR/bundle.tar.xz; scripts/device-check.sh unpacks and runs it there.
set -euo pipefail
build=$1 out=$2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$out"
bins="tests/gpu/test_gpu_probe tests/gpu/test_gpu_device tests/gpu/test_gpu_collectives perf/gvq-gpu-bench"
for b in $bins; do cp "$build/$b" "$stage/bin/"; done
cp -L "$build/libgvq.so.0" "$stage/lib/"
cp -L /usr/bin/orterun "$stage/bin/mpirun"
A=/usr/lib/x86_64-linux-gnu
libs=$( (cd "$build" && ldd $bins libgvq.so.0 /usr/bin/orterun $A/openmpi/lib/openmpi3/*.so \
          $A/pmix2/lib/pmix/*.so 2>/dev/null) | awk '/=>/{print $3}' | sort -u |
       grep -v cuda | grep -E 'libuc[pstm]|libmpi|libopen-|libevent|libhwloc|libpmix|libmca_common_(sm|monitoring|ompio)|libnuma|libmunge|libuuid|libatomic|blas|lapack|tmglib|gfortran|quadmath' || true)
for l in $libs; do cp -L "$l" "$stage/lib/"; done
tar -C / -cf "$stage/mpi.tar" usr/lib/x86_64-linux-gnu/openmpi usr/lib/x86_64-linux-gnu/pmix2 \
    usr/share/openmpi etc/openmpi $( [ -d /usr/lib/x86_64-linux-gnu/ucx ] && echo usr/lib/x86_64-linux-gnu/ucx)
XZ_OPT="-T0 -6" tar -C "$stage" -cJf "$out/bundle.tar.xz" bin lib mpi.tar
ls -la "$out/bundle.tar.xz"
