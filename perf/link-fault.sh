#!/usr/bin/env bash
# link-fault.sh -- take one emulated host's link down for a while in the middle of a run, and
# report what the run did: its exit status, how long it took, and its output (gvq-perf checks
# every call's result: #wrong).
#
#   bash perf/link-fault.sh [-n RANKS] [-p PER_HOST] [-H HOST] [-a AT_S] [-d DOWN_S] [-r RATE]
#                           [-t TIMEOUT_MS] [-L] [-l LOSS_PCT] [-- PROGRAM ARGS...]
#
# The cluster is perf/emulate-cluster.sh's (mpirun over network namespaces, a shaped veth per
# host); HOST's veth (default 1) goes down at the bridge AT_S seconds (default 3) after every rank
# has started gvq (its GVQ_DEBUG_FILE log holds the version line)
# and comes back DOWN_S seconds later (default 2): no packet crosses it either way meanwhile.
# GVQ_TIMEOUT_MS is TIMEOUT_MS on every rank (default 10000). -L: the ranks start without mpirun
# (emulate-cluster.sh -L: scripts/gvq-launch.sh, gvq over UCX's TCP). Without a program,
# build/perf/gvq-perf -b 4M -e 4M -C none -n 150 -w 2 runs (about 8 s at 1 Gbit/s, 2 ranks).
# -l LOSS_PCT: instead of taking the link down, drop LOSS_PCT percent of HOST's packets, each way,
# at random (nftables' numgen in HOST's namespace; `tc netem` does not exist in this kernel) from
# AT_S for DOWN_S seconds (installs Debian's nftables when `nft` is missing).
# Expected (docs/RELIABILITY.md, "Link faults"): an outage shorter than the timeout changes no
# result and every call completes; a longer one ends every rank's call with an error within the
# timeout and the job exits, no hang.
set -uo pipefail
RANKS=2
PER=1
HOST=1
AT=3
DOWN=2
RATE=1gbit
TIMEOUT=10000
LAUNCH=()
LOSS=""
while [ $# -gt 0 ]; do
    case "$1" in
        -n) RANKS=$2; shift 2 ;;
        -p) PER=$2; shift 2 ;;
        -H) HOST=$2; shift 2 ;;
        -a) AT=$2; shift 2 ;;
        -d) DOWN=$2; shift 2 ;;
        -r) RATE=$2; shift 2 ;;
        -t) TIMEOUT=$2; shift 2 ;;
        -L) LAUNCH=(-L); shift ;;
        -l) LOSS=$2; shift 2 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -n "$LOSS" ]; then
    case "$LOSS" in [0-9] | [1-9][0-9]) ;; *) echo "link-fault: -l takes 0..99 (percent)" >&2; exit 2 ;; esac
    if ! command -v nft >/dev/null; then # installed by the README's commands (scripts/common.sh)
        echo "link-fault: -l needs nft (Debian's nftables); skipped" >&2
        exit 77
    fi
fi
[ $# -gt 0 ] || set -- "$here/../build/perf/gvq-perf" -b 4M -e 4M -C none -n 150 -w 2
out=$(mktemp)
logs=$(mktemp -d) # each rank's gvq log (GVQ_DEBUG_FILE): written where the rank runs, so its
chmod 755 "$logs" # time is the rank's own even while the link that carries mpirun's output is down
start=$(date +%s.%N)
# without mpirun the ranks inherit this environment (mpirun's are given it by -x)
GVQ_TIMEOUT_MS=$TIMEOUT GVQ_DEBUG=WARN GVQ_DEBUG_FILE=$logs/rank.%p.log \
    GVQ_EMU_MPIRUN_ARGS="${GVQ_EMU_MPIRUN_ARGS:-} -x GVQ_TIMEOUT_MS=$TIMEOUT -x GVQ_DEBUG=WARN -x GVQ_DEBUG_FILE=$logs/rank.%p.log" \
    bash "$here/emulate-cluster.sh" "${LAUNCH[@]}" -n "$RANKS" -p "$PER" -k 2 -r "$RATE" -- "$@" >"$out" 2>&1 &
job=$!
trap 'kill "$job" 2>/dev/null' INT TERM # the cluster's own teardown restores links and rules
br="gvq${job}br"
# AT counts from when every rank has started gvq (its log file has the version line): a fault
# during mpirun's start would only delay MPI_Init
for _ in $(seq 1 600); do
    [ "$(find "$logs" -name 'rank.*.log' -size +0 | wc -l)" -ge "$RANKS" ] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
done
sleep "$AT"
fault=""
if kill -0 "$job" 2>/dev/null && [ -n "$LOSS" ]; then
    hns="gvq${job}-$HOST"
    # the host's link only (eth0): its ranks' loopback traffic (-p K > 1) is not the link's
    if ip netns exec "$hns" nft -f - <<EON; then
table inet gvqloss {
    chain in { type filter hook input priority 0; iifname "eth0" numgen random mod 100 < $LOSS counter drop; }
    chain out { type filter hook output priority 0; oifname "eth0" numgen random mod 100 < $LOSS counter drop; }
}
EON
        fault=$(date +%s.%N)
        echo "# link-fault: host $HOST drops $LOSS% of its packets each way from $(date +%T.%3N)"
    else
        echo "# link-fault: the loss rules could not be loaded in $hns (nft failed)" >&2
    fi
    sleep "$DOWN"
    if ip netns exec "$hns" nft list table inet gvqloss 2>/dev/null | grep -q drop; then
        ip netns exec "$hns" nft list table inet gvqloss | grep -E "packets" | sed 's/^ */# link-fault:   /'
        ip netns exec "$hns" nft delete table inet gvqloss && echo "# link-fault: host $HOST drops nothing from $(date +%T.%3N)"
    fi
elif kill -0 "$job" 2>/dev/null; then
    ip -n "$br" link set "p$HOST" down && fault=$(date +%s.%N) &&
        echo "# link-fault: host $HOST's link down at $(date +%T.%3N)"
    sleep "$DOWN"
    ip -n "$br" link set "p$HOST" up 2>/dev/null && echo "# link-fault: host $HOST's link up at $(date +%T.%3N)"
else
    echo "# link-fault: the run ended before the fault (make it longer)"
fi
wait "$job"
rc=$?
end=$(date +%s.%N)
grep -v "^#\s*$" "$out"
for f in "$logs"/rank.*.log; do # when each rank last logged, counted from the fault
    [ -s "$f" ] && [ -n "$fault" ] && tail -n 1 "$f" | grep -q WARN || continue
    printf '# link-fault: %s last logged %.1f s after the link went down: %s\n' "$(basename "$f")" \
        "$(echo "$(stat -c %.9Y "$f") - $fault" | bc)" "$(tail -n 1 "$f" | cut -c1-160)"
done
rm -rf "$out" "$logs"
what="link of host $HOST down $DOWN s"
[ -n "$LOSS" ] && what="host $HOST dropping $LOSS% of its packets for $DOWN s"
printf '# link-fault: %s ranks, %s from %s s, GVQ_TIMEOUT_MS %s: exit %s after %.1f s\n' \
    "$RANKS" "$what" "$AT" "$TIMEOUT" "$rc" "$(echo "$end - $start" | bc)"
exit "$rc"
