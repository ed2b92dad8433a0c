#!/usr/bin/env bash
# blas_mixed.sh MPIEXEC TEST -- one job of 3 ranks whose OpenBLAS runs three different kernel
# sets (OPENBLAS_CORETYPE per rank, Open MPI's MPMD form), as on a cluster of mixed CPUs: the
# test's own checks that every rank's output is identical must still hold. GradiVeQ's decode ran
# through BLAS until 2026-11-29 and failed here (ranks decoded the same coefficients to other
# bits); it now runs gvq's own kernels. The core types are chosen from what this CPU runs
# (OpenBLAS does not check a forced type: one the CPU lacks would stop on an illegal
# instruction). Exit 77 (skipped) off x86-64, or where fewer than two types differ.
set -uo pipefail
mpiexec=$1
test=$2
if [ "$(uname -m)" != x86_64 ]; then
    echo "blas_mixed.sh: OPENBLAS_CORETYPE names x86-64 kernel sets; $(uname -m): skipped"
    exit 77
fi
flags=$(grep -m1 '^flags' /proc/cpuinfo)
types=(Prescott)
has() { [[ " $flags " == *" $1 "* ]]; }
if has avx; then types+=(Sandybridge); fi
if has avx2 && has fma; then types+=(Haswell); fi
if has avx512f && has avx512bw && has avx512vl && has avx512dq; then types+=(SkylakeX); fi
if [ ${#types[@]} -lt 2 ]; then
    echo "blas_mixed.sh: this CPU runs one OpenBLAS kernel set only: skipped"
    exit 77
fi
pick=("${types[0]}" "${types[$(( ${#types[@]} / 2 ))]}" "${types[-1]}")
echo "blas_mixed.sh: ranks with OPENBLAS_CORETYPE ${pick[*]}"
args=()
for t in "${pick[@]}"; do
    [ ${#args[@]} -gt 0 ] && args+=(:)
    args+=(-np 1 -x OPENBLAS_CORETYPE="$t" "$test")
done
exec "$mpiexec" --oversubscribe "${args[@]}"
