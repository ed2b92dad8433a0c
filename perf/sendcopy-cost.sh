#!/usr/bin/env bash
# sendcopy-cost.sh -- what the guarantee "no transfer touches the caller's memory after a call
# returns" costs the plain allreduce (docs/RELIABILITY.md, class 3): gvq-perf's out-of-place
# time with and without the send staging, in interleaved rounds so that the machine's drift hits
# every configuration alike, and the median per size.
#
#   bash perf/sendcopy-cost.sh [-B BUILD] [-r ROUNDS] [-n "2 3 4"] [-b 1M] [-e 256M] [-E RATE]
#
# -E RATE runs every rank on its own emulated host with RATE links (perf/emulate-cluster.sh,
# TCP): where the network, not memory bandwidth, bounds the call.
#
# Configurations (GVQ_SEND_COPY, GVQ_ALGO):
#   nocopy      0, auto   sends in place: the speed without the guarantee (the reference)
#   default     1, auto   the default: staged sends, direct allreduce from 4 MiB at 3+ ranks on one host (select.c)
#   ring-staged 1, ring   staged sends through the ring (the default before direct.c)
# Prints, per rank count and size, the median time of each and its ratio to nocopy.
set -euo pipefail

BUILD=build
ROUNDS=5
RANKS="2 3 4"
BEGIN=1M
END=256M
RATE=
while getopts "B:r:n:b:e:E:" o; do
    case "$o" in
    B) BUILD=$OPTARG ;;
    r) ROUNDS=$OPTARG ;;
    n) RANKS=$OPTARG ;;
    b) BEGIN=$OPTARG ;;
    e) END=$OPTARG ;;
    E) RATE=$OPTARG ;;
    *) exit 2 ;;
    esac
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
CONFIGS=("nocopy 0 auto" "default 1 auto" "ring-staged 1 allreduce=ring")
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

for np in $RANKS; do
    for ((round = 0; round < ROUNDS; round++)); do
        for cfg in "${CONFIGS[@]}"; do
            read -r name copy algo <<<"$cfg"
            export GVQ_SEND_COPY=$copy GVQ_ALGO=$algo
            if [ -n "$RATE" ]; then
                GVQ_EMU_MPIRUN_ARGS="-x GVQ_SEND_COPY -x GVQ_ALGO -x OPENBLAS_NUM_THREADS" \
                    bash "$(dirname "$0")/emulate-cluster.sh" -n "$np" -r "$RATE" -- \
                    "$BUILD/perf/gvq-perf" -b "$BEGIN" -e "$END" -f 4 -n 5 -w 2 -C none
            else
                mpirun -np "$np" --oversubscribe -x GVQ_SEND_COPY -x GVQ_ALGO \
                    -x OPENBLAS_NUM_THREADS \
                    "$BUILD/perf/gvq-perf" -b "$BEGIN" -e "$END" -f 4 -n 10 -w 3 -C none
            fi 2>/dev/null |
                awk -v np="$np" -v name="$name" '/^ *[0-9]+ /{print np, name, $1, $6}' \
                    >>"$OUT/times"
        done
    done
done

python3 - "$OUT/times" <<'EOF'
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    np, name, size, us = line.split()
    t.setdefault((int(np), int(size)), {}).setdefault(name, []).append(float(us))
print("| ranks | size | nocopy (ms) | default (ms) | ring staged (ms) | default / nocopy | ring staged / nocopy |")
print("|---|---|---|---|---|---|---|")
for (np, size) in sorted(t):
    m = {k: statistics.median(v) / 1000 for k, v in t[(np, size)].items()}
    if len(m) < 3:
        continue
    print(f"| {np} | {size >> 20} MiB | {m['nocopy']:.2f} | {m['default']:.2f} | "
          f"{m['ring-staged']:.2f} | {m['default'] / m['nocopy']:.2f} | "
          f"{m['ring-staged'] / m['nocopy']:.2f} |")
EOF
