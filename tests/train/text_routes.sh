#!/usr/bin/env bash
# text_routes.sh GVQ_TRAIN MPIEXEC NP -- gvq-train --model text through each sparse route
# (parameter server, allgatherv, dense allreduce) on the apt lists' corpus: every route must
# end with the same test accuracy and loss (the same update: exact sums are not needed for the
# printed digits, but a wrong route shows), identical fc weights on every rank, and Parallax's
# rule must pick the parameter server at NP > 2. The parameter server served at any time with
# staleness 0 (--ps-staleness 0) must print the synchronous server's digits too. Skipped (77)
# when the apt lists are missing.
set -euo pipefail
train=$1 mpiexec=$2 np=$3
corpus=$(mktemp)
trap 'rm -f "$corpus"' EXIT
if ! bash "$(dirname "$0")/../../apps/gvq-train/apt-text.sh" "$corpus" >/dev/null 2>&1; then
    echo "SKIPPED: no apt package lists (run apt-get update)"
    exit 77
fi
run() {
    local route=$1
    shift
    "$mpiexec" -n "$np" --oversubscribe "$train" --model text --text-data "$corpus" --iters 300 \
        --lr 0.5 --print-every 300 --eval-every 300 --sparse-route "$route" "$@"
}
declare -A line
for r in ps allgatherv dense auto served; do
    if [ "$r" = served ]; then out=$(run ps --ps-staleness 0); else out=$(run $r); fi
    echo "$out" | tail -2
    grep -q "identical on every rank at every check: yes" <<<"$out" || { echo "FAIL: $r: weights differ"; exit 1; }
    line[$r]=$(echo "$out" | grep '^step' | tail -1 | sed 's/  embedding.*//')
    [ "$r" != auto ] || grep -q "route $( [ "$np" -gt 2 ] && echo ps || echo allgatherv)," <<<"$out" \
        || { echo "FAIL: Parallax's rule did not pick the expected route at $np ranks"; exit 1; }
done
for r in allgatherv dense auto served; do
    [ "${line[$r]}" = "${line[ps]}" ] || { echo "FAIL: $r ended '${line[$r]}', ps '${line[ps]}'"; exit 1; }
done
echo "text_routes: PASS -- ps, allgatherv, dense, auto and the served ps agree: ${line[ps]}"
