#!/usr/bin/env bash
# elastic.sh GVQ_TRAIN -- gvq-train --elastic started without mpirun (scripts/gvq-launch.sh, over
# UCX): 3 ranks of the CNN on real Fashion-MNIST, commits every 20 steps; the process first
# ranked 2 dies at step 75 and the one first ranked 1 at step 78 (--die: _Exit, no goodbye),
# which it reaches only after the first rollback to step 60 and the replacement's join there.
# Each time the survivors must shrink, roll back to the last commit and go on, and rank 0 must
# start a replacement that joins at the next commit (--replace). Fails unless the job ends with
# status 0 (the replacements take part in its last reductions), both faults are reported with
# at most 21 steps lost each, 3 of 3 ranks train at the end, every weight check found the ranks
# identical, the compressors' state was carried through both faults (loaded from the commit on
# every survivor) and both joins (each member its own, each newcomer rank 0's without the
# residual: with the tracked basis a newcomer with another basis would decode other weights), and the loss of the last window is below MAX (the same run without faults
# ends at 0.357; chance is 2.30). Arguments after MAX replace the codec options (--codec qsgd).
set -uo pipefail
exe=$1
max=${2:-0.60}
shift $(($# < 2 ? $# : 2))
codec=("$@") # the codec options (default: --codec qsgd)
[ ${#codec[@]} -gt 0 ] || codec=(--codec qsgd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
data=/usr/share/datasets/fashion-mnist
if [ ! -r "$data/train-images-idx3-ubyte.gz" ]; then
    echo "SKIPPED: no Fashion-MNIST in $data (Debian package dataset-fashion-mnist)"
    exit 77
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
GVQ_TIMEOUT_MS=3000 bash "$here/../../scripts/gvq-launch.sh" -n 3 -t 240 -- "$exe" --batch 96 \
    --iters 300 --print-every 50 --train-subset 5120 --test-subset 500 --no-progress \
    --elastic 20 --die 2:75 --die 1:78 --replace "${codec[@]}" >"$log" 2>&1
rc=$?
grep -E '^\[[0-9]\] (epoch|# (fault|join|first|done|elastic|wire))|gvq-train:' "$log"
fail() { echo "FAIL: $*"; exit 1; }
[ $rc -eq 0 ] || fail "the job exited with $rc"
[ "$(grep -c '# fault at step' "$log")" -eq 2 ] || fail "not two faults reported"
[ "$(grep -c '# join at step' "$log")" -eq 2 ] || fail "not two replacements joined"
[ "$(grep -c 'compressors carried from the commit' "$log")" -eq 2 ] ||
    fail "the compressors were not carried through both faults"
[ "$(grep -c '# join at step .*compressors carried' "$log")" -eq 2 ] ||
    fail "the compressors were not carried through both joins"
awk '/# fault at step/ { for (i = 1; i < NF; i++) if ($i ~ /^\(/) { n = substr($i, 2) + 0; if (n > 21) bad = 1 } }
     END { exit bad }' "$log" || fail "a fault lost more than a commit's steps"
grep -q '# elastic: 2 fault(s) ridden through, .* 3 of 3 ranks at the end' "$log" ||
    fail "not 3 of 3 ranks at the end"
grep -q 'weight checksums compared [0-9]* times, 0 mismatches' "$log" || fail "weights differed"
grep -q 'hold different weights' "$log" && fail "weights differed"
loss=$(awk '/\] epoch/ { for (i = 1; i < NF; i++) if ($i == "loss") l = $(i + 1) } END { print l }' "$log")
awk -v l="$loss" -v m="$max" 'BEGIN { exit !(l == l + 0 && l < m) }' || fail "last loss $loss, not below $max"
echo "elastic.sh: two deaths ridden through, two replacements joined, last loss $loss (< $max)"
