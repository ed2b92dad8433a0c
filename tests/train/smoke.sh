#!/usr/bin/env bash
# smoke.sh GVQ_TRAIN MPIEXEC NP MAX_LOSS [gvq-train options...] -- a short training run whose
# loss must fall: the first steps of a longer run (--stop-step; the learning-rate schedule still
# spans its epochs) on real Fashion-MNIST at a fixed seed, through the training layer. Fails
# when the mean loss of the last printed window is above MAX_LOSS or not a number, when the
# ranks' weights ever differed, or when gvq-train fails. A result test, not a timing test: a
# path that silently corrupts the aggregation (issue 34: fused QSGD trained to chance, loss
# 2.303) fails it. The thresholds sit beside each registration (apps/gvq-train/CMakeLists.txt).
set -uo pipefail
exe=$1 mpiexec=$2 np=$3 max=$4
shift 4
data=/usr/share/datasets/fashion-mnist
if [ ! -r "$data/train-images-idx3-ubyte.gz" ]; then
    echo "SKIPPED: no Fashion-MNIST in $data (Debian package dataset-fashion-mnist)"
    exit 77
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== $mpiexec -np $np --oversubscribe $exe $*"
"$mpiexec" -np "$np" --oversubscribe "$exe" "$@" >"$log" 2>&1
rc=$?
grep -v '^# conv' "$log"
if [ $rc -ne 0 ]; then
    echo "FAIL: gvq-train exited with $rc"
    exit 1
fi
loss=$(awk '/^epoch/ { for (i = 1; i < NF; i++) if ($i == "loss") l = $(i + 1) } END { print l }' "$log")
if grep -q 'hold different weights' "$log"; then
    echo "FAIL: the ranks' weights differed"
    exit 1
fi
case "$loss" in
*nan* | *inf* | "")
    echo "FAIL: loss '$loss' after the last window"
    exit 1
    ;;
esac
if ! awk -v l="$loss" -v m="$max" 'BEGIN { exit !(l == l + 0 && l + 0 <= m + 0) }'; then
    echo "FAIL: loss '$loss' after the last window, want <= $max"
    exit 1
fi
echo "PASS: loss $loss <= $max"
