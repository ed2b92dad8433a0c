#!/usr/bin/env bash
# two_hosts.sh N PROG ARGS... -- N ranks started by scripts/gvq-launch.sh, rank r in a UTS
# namespace of its own named "gvq-h<r % 2>": gvq sees two hosts whose ranks interleave
# (0 2 4 .. on one, 1 3 5 .. on the other), as `mpirun --map-by node` places them. Passes when
# PROG passes on every rank and every rank reports that its allreduce ring follows the hosts
# (GVQ_DEBUG=INFO); with GVQ_ALGO=hier and an even N, also that every rank has the hierarchical
# allreduce's shape (2 hosts of N/2 ranks), its stages inside a host on shared memory, and that
# it ran; with TWO_HOSTS_RIDES=1 (and no GVQ_ALGO), that small reducescatters, allgathers,
# broadcasts and reduces rode along with the call agreement somewhere. Exit 77 (skipped) where unshare
# --uts is not allowed.
set -uo pipefail
n=$1
shift
if ! unshare --uts true 2>/dev/null; then
    echo "two_hosts.sh: unshare --uts is not allowed here: skipped"
    exit 77
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$(GVQ_DEBUG=INFO bash "$here/../../scripts/gvq-launch.sh" -n "$n" -t 240 -- \
    unshare --uts sh -c 'hostname "gvq-h$((RANK % 2))" && exec "$@"' sh "$@" 2>&1)
rc=$?
printf '%s\n' "$out" | grep -v ' GVQ INFO gvq version'
[ "$rc" -eq 0 ] || exit "$rc"
k=$(printf '%s\n' "$out" | grep -c 'allreduce ring follows the hosts (2 hosts)')
if [ "$k" -lt "$n" ]; then # a communicator made later (a shrink) reports too
    echo "two_hosts.sh: FAIL: $k of $n ranks report the ring following the hosts"
    exit 1
fi
if [ "${GVQ_ALGO:-}" = hier ]; then # hosts of n/2 ranks each: every rank has the hierarchy
    h=$(printf '%s\n' "$out" | grep -c "hosts of $((n / 2)) ranks each on 2 hosts")
    a=$(printf '%s\n' "$out" | grep -c 'allreduce: algorithm hier')
    c=$(printf '%s\n' "$out" | grep -c "hierarchy's stages inside the host go through its shared")
    if [ "$h" -ne "$n" ] || [ "$a" -lt 1 ] || [ "$c" -ne "$n" ]; then
        echo "two_hosts.sh: FAIL: $h of $n ranks report the hierarchy, $a report running it, $c its shared-memory stages"
        exit 1
    fi
fi
if [ -n "${TWO_HOSTS_RIDES:-}" ]; then # the selection's own choice: small calls ride along
    for c in reducescatter allgather broadcast reduce; do
        if ! printf '%s\n' "$out" | grep -q " $c: rides along with the call agreement"; then
            echo "two_hosts.sh: FAIL: no rank reports a $c riding along with the call agreement"
            exit 1
        fi
    done
fi
echo "two_hosts.sh: $n ranks on 2 interleaved hosts passed, every ring in host order"
