#!/usr/bin/env bash
# elastic_example.sh PYTHON -- bindings/python/examples/elastic_fashion_mnist.py on 3 processes
# started without mpirun (scripts/gvq-launch.sh): the process first ranked 2 dies at step 130,
# the one first ranked 1 at step 140, which it reaches only after the rollback to step 100 and
# the replacement's join there; each time the survivors shrink and roll back, and rank 0 starts
# a replacement that joins at the next commit. Fails unless every process ends with status 0
# (each final rank checks that its held-out loss fell and that the weights are identical on
# every rank), rank 0 reports both faults and three ranks (two of them replacements) print PASS.
set -uo pipefail
py=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$py" -c "import numpy, torch" 2>/dev/null || { echo "SKIPPED: $py lacks numpy or torch"; exit 77; }
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
    { echo "SKIPPED: no Fashion-MNIST (Debian package dataset-fashion-mnist)"; exit 77; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
bash "$here/../../../scripts/gvq-launch.sh" -n 3 -t 240 -- "$py" \
    "$here/../examples/elastic_fashion_mnist.py" --steps 400 --commit 50 --die 2:130 \
    --die 1:140 --replace --timeout-ms 15000 >"$log" 2>&1
rc=$?
grep -vE 'UCX|GVQ WARN' "$log"
[ $rc -eq 0 ] || { echo "FAIL: the job exited with $rc"; exit 1; }
grep -q '\] \[0\] rank 0 of 3: .* 2 fault(s)' "$log" || { echo "FAIL: rank 0 did not ride through 2 faults"; exit 1; }
[ "$(grep -o 'identical on every rank: PASS' "$log" | wc -l)" -eq 3 ] || { echo "FAIL: not 3 ranks passed"; exit 1; }
echo "elastic_example.sh: two deaths ridden through, two replacements joined, 3 ranks passed"
