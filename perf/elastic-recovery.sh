#!/usr/bin/env bash
# elastic-recovery.sh -- how long a training job takes to go on after ranks die: runs
# examples/elastic_trainer.c (built as example_elastic_trainer) R times without mpirun
# (scripts/gvq-launch.sh, UCX transport) with deaths at given steps, and prints one row per fault
# and per join: the time to detect it (the failed call), to shrink, to reload the commit, to the
# first good step after, the steps run again; and the time a replacement took to join.
#
#   bash perf/elastic-recovery.sh [-b BUILD] [-n RANKS] [-r RUNS] [-c RATE] [-- TRAINER ARGS...]
#
# -c RATE: each rank on an emulated host of its own (perf/emulate-cluster.sh -L, links of RATE),
# so a death is seen by the transport (or the timeout), not by its pid on a shared host.
#
# Default: 4 ranks, 5 runs, `--steps 400 --commit 50 --codec qsgd --die 3:120 --die 1:270
# --replace`. With 2 cores the ranks share them (say so beside the numbers).
set -euo pipefail
BUILD=build
N=4
RUNS=5
CLUSTER=""
while [ $# -gt 0 ]; do
    case "$1" in
        -b) BUILD=$2; shift 2 ;;
        -n) N=$2; shift 2 ;;
        -r) RUNS=$2; shift 2 ;;
        -c) CLUSTER=$2; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        --) shift; break ;;
        *) echo "elastic-recovery: unknown option $1" >&2; exit 2 ;;
    esac
done
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(--steps 400 --commit 50 --codec qsgd --die 3:120 --die 1:270 --replace)
EXE=$(find "$BUILD" -name example_elastic_trainer -type f | head -1)
[ -x "$EXE" ] || { echo "elastic-recovery: no example_elastic_trainer under $BUILD" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")/.." && pwd)
export OPENBLAS_NUM_THREADS=1
LAUNCH=(bash "$HERE/scripts/gvq-launch.sh" -n "$N" -t 300 --)
[ -z "$CLUSTER" ] || LAUNCH=(bash "$HERE/perf/emulate-cluster.sh" -n "$N" -L -r "$CLUSTER" --)
echo "# elastic-recovery: $N ranks on $(nproc) cores, ${CLUSTER:-one host}, $RUNS runs: ${ARGS[*]}"
printf '%-4s %-6s %-10s %8s %8s %8s %10s %6s %s\n' run event at_step detect_s shrink_s reload_s first_step lost ranks
for run in $(seq 1 "$RUNS"); do
    out=$("${LAUNCH[@]}" "$(cd "$(dirname "$EXE")" && pwd)/$(basename "$EXE")" "${ARGS[@]}" 2>/dev/null) || {
        echo "run $run: the job failed"; echo "$out" | tail -5; exit 1; }
    echo "$out" | grep -c 'PASS' > /dev/null
    echo "$out" | sed -n 's/^\[0\] fault [0-9]* at step \([0-9]*\): \([0-9]* -> [0-9]*\) ranks; detect \([0-9.]*\) s, shrink \([0-9.]*\) s, reload \([0-9.]*\) s, first step \([0-9.]*\) s; rolled back to step [0-9]* (\([0-9]*\) steps lost).*/\1 \3 \4 \5 \6 \7 \2/p' |
        while read -r at det shr rel fst lost ranks; do
            printf '%-4s %-6s %-10s %8s %8s %8s %10s %6s %s\n' "$run" fault "$at" "$det" "$shr" "$rel" "$fst" "$lost" "$ranks"
        done
    echo "$out" | sed -n 's/^\[0\] join at step \([0-9]*\): \([0-9]* -> [0-9]*\) ranks in \([0-9.]*\) s.*/\1 \3 \2/p' |
        while read -r at secs ranks; do
            printf '%-4s %-6s %-10s %8s %8s %8s %10s %6s %s\n' "$run" join "$at" - "$secs" - - 0 "$ranks"
        done
    pass=$(echo "$out" | grep -c 'identical on every rank: PASS' || true)
    echo "#    run $run: $pass rank(s) ended with the loss fallen and identical weights"
done
