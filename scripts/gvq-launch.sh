#!/usr/bin/env bash
# gvq-launch.sh -- start N processes of a program on this host as a launcher would, without
# mpirun: what torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
# MASTER_PORT), or with --slurm what srun sets (SLURM_PROCID, SLURM_NTASKS, and GVQ_STORE for
# the meeting point). gvqCommInitFromEnv (C) and gvq.Communicator.from_env (Python) read them.
#
#   bash scripts/gvq-launch.sh [-n N] [-p PORT] [-a ADDR] [--netns PREFIX [--hosts H] [--map-by node]]
#                              [--slurm] [-t SECONDS] [--keep-going] -- PROGRAM [ARGS...]
#
# -a ADDR: the meeting point's address (default 127.0.0.1). --netns PREFIX: rank r runs in the
# network namespace PREFIXr (perf/emulate-cluster.sh -L uses it); with --hosts H, N / H ranks share
# each of the namespaces PREFIX0 .. PREFIX(H-1): rank r in PREFIX(r / (N / H)), or with --map-by
# node in PREFIX(r % H) (mpirun's round-robin placement).
# Debian's torchrun fails on Python 3.11, so this stands in for it. Every rank's output is
# prefixed with its rank. The exit status is the first failing rank's (the others are then
# stopped after a grace of 10 s), 124 when -t SECONDS passed (default 0: no limit). With
# --keep-going a rank that fails stops no other (an elastic job rides through it: gvq-train
# --elastic, perf/chaos.sh); the exit status is then rank 0's (the rank that reports an elastic
# job), or the first failing rank's when rank 0 was ended by a signal.
set -uo pipefail
N=2
PORT=""
SLURM=0
LIMIT=0
ADDR=127.0.0.1
NETNS=""
NHOSTS=0
MAPNODE=0
KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
        -n) N=$2; shift 2 ;;
        -p) PORT=$2; shift 2 ;;
        -t) LIMIT=$2; shift 2 ;;
        -a) ADDR=$2; shift 2 ;;
        --netns) NETNS=$2; shift 2 ;;
        --hosts) NHOSTS=$2; shift 2 ;;
        --map-by) [ "$2" = node ] && MAPNODE=1; shift 2 ;;
        --slurm) SLURM=1; shift ;;
        --keep-going) KEEP=1; shift ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "gvq-launch: no program given (see -h)" >&2; exit 2; }
[ "$N" -ge 1 ] 2>/dev/null || { echo "gvq-launch: -n must be a positive number" >&2; exit 2; }
if [ "$NHOSTS" != 0 ]; then
    [ -n "$NETNS" ] && [ "$NHOSTS" -ge 1 ] 2>/dev/null && [ $((N % NHOSTS)) -eq 0 ] ||
        { echo "gvq-launch: --hosts needs --netns and must divide -n" >&2; exit 2; }
fi
if [ -z "$PORT" ] && [ -n "$NETNS" ]; then
    PORT=29500 # a namespace of its own: nothing else listens there
elif [ -z "$PORT" ]; then # a free port: bind to 0 and read what the kernel gave
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
fi
unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK PMIX_RANK PMI_RANK PMI_SIZE
PIDS=()
for r in $(seq 0 $((N - 1))); do
    WRAP=()
    host=$r
    if [ "$NHOSTS" -gt 0 ]; then
        if [ "$MAPNODE" = 1 ]; then host=$((r % NHOSTS)); else host=$((r / (N / NHOSTS))); fi
    fi
    [ -n "$NETNS" ] && WRAP=(ip netns exec "$NETNS$host")
    if [ "$SLURM" = 1 ]; then
        "${WRAP[@]}" env SLURM_PROCID=$r SLURM_NTASKS=$N SLURM_LOCALID=$r GVQ_STORE=$ADDR:$PORT \
            "$@" > >(sed -u "s/^/[$r] /") 2> >(sed -u "s/^/[$r] /" >&2) &
    else
        "${WRAP[@]}" env RANK=$r WORLD_SIZE=$N LOCAL_RANK=$r LOCAL_WORLD_SIZE=$N \
            MASTER_ADDR=$ADDR MASTER_PORT=$PORT "$@" > >(sed -u "s/^/[$r] /") 2> >(sed -u "s/^/[$r] /" >&2) &
    fi
    PIDS+=($!)
done
rc=0
rank0=""
grace_end="" # once a rank failed: when the others are stopped (no background timer, whose
start=$(date +%s) # sleep would hold this script's output open after every rank ended)
left=$N
declare -A done_=()
while [ $left -gt 0 ]; do
    for i in "${!PIDS[@]}"; do
        [ -n "${done_[$i]:-}" ] && continue
        if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
            wait "${PIDS[$i]}"; s=$?
            done_[$i]=1; left=$((left - 1))
            [ "$i" = 0 ] && rank0=$s
            if [ $s -ne 0 ] && [ $KEEP = 1 ]; then
                echo "gvq-launch: rank $i exited with $s; the others go on (--keep-going)" >&2
                [ $rc -eq 0 ] && rc=$s
            elif [ $s -ne 0 ] && [ $rc -eq 0 ]; then
                rc=$s
                echo "gvq-launch: rank $i exited with $s; stopping the others in 10 s" >&2
                grace_end=$(( $(date +%s) + 10 ))
            fi
        fi
    done
    if [ -n "$grace_end" ] && [ "$(date +%s)" -ge "$grace_end" ]; then
        for i in "${!PIDS[@]}"; do # only the ranks still running (no reused pid is hit)
            [ -z "${done_[$i]:-}" ] && kill "${PIDS[$i]}" 2>/dev/null
        done
        grace_end=""
    fi
    if [ "$LIMIT" -gt 0 ] && [ $(( $(date +%s) - start )) -ge "$LIMIT" ]; then
        echo "gvq-launch: $LIMIT s passed; stopping every rank" >&2
        kill -9 "${PIDS[@]}" 2>/dev/null
        rc=124
        break
    fi
    sleep 0.1
done
wait 2>/dev/null
[ $KEEP = 1 ] && [ $rc -ne 124 ] && [ -n "$rank0" ] && [ "$rank0" -lt 128 ] && rc=$rank0
exit $rc
