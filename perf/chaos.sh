#!/usr/bin/env bash
# chaos.sh -- an elastic training run on the emulated cluster with faults injected at random
# times (issue 39): gvq-train --elastic --replace started without mpirun (perf/emulate-cluster.sh
# -L, one rank per emulated host, gvq over UCX's TCP), and, while it trains,
#   stop    a rank is stopped (SIGSTOP) and resumed (SIGCONT) after half the timeout: no fault;
#   link2   a host's link goes down at the bridge for 2 s (under a timeout below 5 s: a fifth of
#           it): no fault (TCP's retransmission comes within the timeout);
#   link30  a host's link goes down for 30 s (or three timeouts, whichever is longer): its rank
#           is cut off, the others shrink it out and
#           a replacement joins at the next commit; the cut-off rank leaves when its own shrink
#           finds no majority;
#   kill    a rank is killed (SIGKILL): the others shrink, a replacement joins.
# Targets are ranks other than 0 (rank 0 starts the replacements and prints the run; a host whose
# rank has left passes its turn to another, links only of hosts other than 0), times are
# drawn at random (seed -s) between 10% and 80% of the expected run, at least 45 s apart.
#
#   bash perf/chaos.sh [-n RANKS] [-m MINUTES] [-s SEED] [-t TIMEOUT_MS] [-r RATE]
#                      [-f stop,link2,link30,kill|none] [-o DIR] -- GVQ_TRAIN [ARGS...]
#   bash perf/chaos.sh --summary DIR      # the summary of a run written to DIR, again
#
# MINUTES is how long the run is expected to take (the faults are spread over it; the run's own
# length is its --epochs/--iters). -f none runs the same command without faults (the reference).
# Written to DIR (default /tmp/chaos.SEED): run.log (every rank's output, prefixed by rank),
# faults.log (what was injected when), rss.csv (each gvq-train process's resident memory every
# 15 s). At the end one summary: faults injected and reported, steps lost, time to recover,
# weight checks and mismatches, final accuracy, memory growth per process, exit status.
set -uo pipefail
RANKS=4
MINUTES=15
SEED=1
TIMEOUT=10000
RATE=1gbit
FAULTS=stop,link2,link30,kill
OUT=""
SUMMARY=""
while [ $# -gt 0 ]; do
    case "$1" in
        -n) RANKS=$2; shift 2 ;;
        -m) MINUTES=$2; shift 2 ;;
        -s) SEED=$2; shift 2 ;;
        -t) TIMEOUT=$2; shift 2 ;;
        -r) RATE=$2; shift 2 ;;
        -f) FAULTS=$2; shift 2 ;;
        -o) OUT=$2; shift 2 ;;
        --summary) SUMMARY=$2; shift 2 ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
summary() { # DIR: what run.log, faults.log and rss.csv say
    local log="$1/run.log" flog="$1/faults.log" rss="$1/rss.csv" faults lost checks mism acc
    grep -E '^\[[0-9]+\] # (fault|join|first|done|elastic|wire)' "$log" | sed 's/^/#   /'
    grep -E 'leaves the run|exited with' "$log" | sed 's/^/#   /'
    faults=$(grep -c '# fault at step' "$log")
    lost=$(awk '/# fault at step/ { for (i = 1; i < NF; i++) if ($i ~ /^\(/) s += substr($i, 2) } END { print s + 0 }' "$log")
    checks=$(awk '/weight checksums compared/ { for (i = 1; i < NF; i++) if ($i == "compared") c = $(i + 1) } END { print c + 0 }' "$log")
    mism=$(grep -c 'hold different weights' "$log")
    acc=$(awk '/# done:/ { for (i = 1; i < NF; i++) if ($i == "accuracy") a = $(i + 1) } END { sub(/,$/, "", a); print a }' "$log")
    echo "# injected: $(grep -c ': SIGKILL' "$flog") kill(s) and $(grep -c 'link30: .*link down for' "$flog") long outage(s) (each a fault to ride through), $(grep -c ': SIGSTOP' "$flog") stop(s) and $(grep -c 'link2: .*link down for' "$flog") short outage(s) (within the timeout: no fault); faults reported by the run: $faults, steps lost: $lost"
    echo "# weight checks: $checks at the end's count, mismatches reported: $mism; final test accuracy: ${acc:-none}"
    # memory: each process's resident set 60 s into its life and at its last sample
    awk -F, 'NR > 1 { if (!($2 in t0)) t0[$2] = $1; if ($1 - t0[$2] >= 60 && !($2 in a)) a[$2] = $4; z[$2] = $4; h[$2] = $3; e[$2] = $1 }
        END { for (p in a) printf "# memory: pid %s (host %s, to %.0f s): %d -> %d kB (%+.1f%%)\n", p, h[p], e[p], a[p], z[p], 100 * (z[p] - a[p]) / a[p] }' "$rss"
}
[ -n "$SUMMARY" ] && { summary "$SUMMARY"; exit 0; }
[ $# -gt 0 ] || { echo "chaos: no program given (see -h)" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-/tmp/chaos.$SEED}
mkdir -p "$OUT"
log="$OUT/run.log" flog="$OUT/faults.log" rss="$OUT/rss.csv"
: >"$flog"
echo "t_s,pid,host,rss_kb" >"$rss"
stamp() { awk -v s="$start" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }'; }
note() { echo "$(stamp) $*" | tee -a "$flog"; }

# replacements start on a host whose rank has left (the first of 1..RANKS-1 without a gvq-train,
# whose link is up and that no replacement took in the last minute; else host 0), as a scheduler
# would place them: gvq-train runs GVQ_TRAIN_SPAWN_WITH with the replacement's command line
cat >"$OUT/spawn" <<'EOS'
#!/bin/bash
d=$(dirname "$0")
job=$(cat "$d/job")
n=$(cat "$d/ranks")
exec 9>"$d/spawn.lock"
flock 9 # two replacements started at once take two hosts
h=1 pick=""
while [ "$h" -lt "$n" ] && [ -z "$pick" ]; do
    busy=0
    [ -e "$d/down.$h" ] && busy=1
    [ -n "$(find "$d" -maxdepth 1 -name "placed.$h" -newermt '-60 seconds')" ] && busy=1
    for p in $(ip netns pids "gvq$job-$h" 2>/dev/null); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = gvq-train ] && busy=1
    done
    [ "$busy" = 0 ] && pick=$h && : >"$d/placed.$h"
    h=$((h + 1))
done
exec 9>&-
[ -n "$pick" ] && exec ip netns exec "gvq$job-$pick" "$@"
exec "$@"
EOS
chmod +x "$OUT/spawn"
echo "$RANKS" >"$OUT/ranks"
start=$(date +%s.%N)
GVQ_TRAIN_SPAWN_WITH="$OUT/spawn" GVQ_TIMEOUT_MS=$TIMEOUT GVQ_EMU_LAUNCH_ARGS="--keep-going" \
    bash "$here/emulate-cluster.sh" -L -n "$RANKS" -r "$RATE" -- "$@" >"$log" 2>&1 &
job=$!
echo "$job" >"$OUT/job"
br="gvq${job}br"
trainers() { # host -> the gvq-train processes in its namespace
    ip netns pids "gvq${job}-$1" 2>/dev/null | while read -r p; do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = gvq-train ] && echo "$p"
    done
}
# a target: a gvq-train on host $1, else on any host but rank 0's process (a replacement runs
# on host 0); prints "pid host"
first0=""
target() {
    local h p
    for h in "$1" $(seq 1 $((RANKS - 1))) 0; do
        for p in $(trainers "$h"); do
            [ "$p" = "$first0" ] || { echo "$p $h"; return; }
        done
    done
}

# the plan: kinds in a random order at random times
plan=$(awk -v seed="$SEED" -v m="$MINUTES" -v f="$FAULTS" -v n="$RANKS" 'BEGIN {
    srand(seed); k = (f == "none") ? 0 : split(f, kind, ",")
    for (i = 1; i <= k; i++) { j = 1 + int(rand() * i); t = kind[i]; kind[i] = kind[j]; kind[j] = t }
    span = 0.7 * m * 60; gap = 45; free = span - (k - 1) * gap; if (free < 0) free = 0
    for (i = 1; i <= k; i++) {      # sorted draws (insertion: mawk has no asort)
        x = rand() * free
        for (j = i; j > 1 && u[j - 1] > x; j--) u[j] = u[j - 1]
        u[j] = x
    }
    for (i = 1; i <= k; i++) printf "%d %s %d\n", 0.1 * m * 60 + u[i] + (i - 1) * gap, kind[i], 1 + int(rand() * (n - 1))
}')
echo "# chaos: $RANKS ranks, $RATE links, GVQ_TIMEOUT_MS=$TIMEOUT, seed $SEED, plan (s kind host):" | tee -a "$flog"
echo "$plan" | sed 's/^/#   /' | tee -a "$flog"

for _ in $(seq 1 300); do # rank 0's process: never a target
    first0=$(trainers 0 | head -1)
    [ -n "$first0" ] && break
    sleep 0.2
done

sampler() {
    while kill -0 "$job" 2>/dev/null; do
        for h in $(seq 0 $((RANKS - 1))); do
            for p in $(trainers "$h"); do
                kb=$(awk '/^VmRSS/ { print $2 }' "/proc/$p/status" 2>/dev/null)
                [ -n "$kb" ] && echo "$(stamp),$p,$h,$kb" >>"$rss"
            done
        done
        sleep 15
    done
}
sampler &
samp=$!

inject() { # kind host
    local kind=$1 h=$2 p
    case "$kind" in
        stop)
            read -r p h <<<"$(target "$h")"
            [ -n "$p" ] || { note "stop: no gvq-train to stop"; return; }
            local hold
            hold=$(awk -v t="$TIMEOUT" 'BEGIN { printf "%.3f", t / 2000 }')
            note "stop: SIGSTOP pid $p on host $h for $hold s"
            kill -STOP "$p"; sleep "$hold"; kill -CONT "$p"
            note "stop: SIGCONT pid $p" ;;
        link2|link30)
            local d # the outage: short enough to ride through, or long enough to cut the rank off
            if [ "$kind" = link2 ]; then
                d=$(awk -v t="$TIMEOUT" 'BEGIN { d = t < 5000 ? t / 5000 : 2; printf "%.3f", d }')
            else
                d=$(awk -v t="$TIMEOUT" 'BEGIN { d = 3 * t / 1000; if (d < 30) d = 30; printf "%.0f", d }')
            fi
            read -r p h <<<"$(target "$h")"
            [ -n "$p" ] && [ "$h" != 0 ] || { note "$kind: no host but rank 0's with a gvq-train"; return; }
            note "$kind: host $h's link down for $d s"
            : >"$OUT/down.$h" # the spawn wrapper places no replacement behind a link that is down
            ip -n "$br" link set "p$h" down; sleep "$d"; ip -n "$br" link set "p$h" up
            rm -f "$OUT/down.$h"
            note "$kind: host $h's link up" ;;
        kill)
            read -r p h <<<"$(target "$h")"
            [ -n "$p" ] || { note "kill: no gvq-train to kill"; return; }
            note "kill: SIGKILL pid $p on host $h"
            kill -KILL "$p" ;;
    esac
}

while read -r at kind h; do
    [ -n "${at:-}" ] || continue
    while kill -0 "$job" 2>/dev/null && awk -v a="$at" -v t="$(stamp)" 'BEGIN { exit !(t < a) }'; do
        sleep 1
    done
    kill -0 "$job" 2>/dev/null || { note "$kind: the run ended before it"; continue; }
    inject "$kind" "$h"
done <<<"$plan"
wait "$job"
rc=$?
kill "$samp" 2>/dev/null
wait 2>/dev/null
end=$(stamp)

echo "# chaos summary ($OUT), run ended after $end s with status $rc"
summary "$OUT"
exit "$rc"
