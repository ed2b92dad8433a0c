#!/usr/bin/env bash
# cut_link.sh PROG -- a cut link under gvqCommShrink (docs/RELIABILITY.md, "Link faults"): 3 ranks
# started without mpirun on 3 emulated hosts (perf/link-fault.sh -L: one rank per network
# namespace, gvq over UCX's TCP), host 1's link down at the bridge for 15 s under a 2 s timeout.
# PROG is test_shrink_dead, run as "cut 1": the two others shrink within twice the timeout and
# 3 s and check the new communicator; rank 1's own shrink fails and it leaves. Passes when every
# rank passes. Exit 77 (skipped) where network namespaces cannot be made.
set -uo pipefail
prog=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if ! ip netns add gvqcutprobe$$ 2>/dev/null; then
    echo "cut_link.sh: cannot make network namespaces here: skipped"
    exit 77
fi
ip netns del gvqcutprobe$$
command -v bc >/dev/null || { echo "cut_link.sh: needs bc: skipped"; exit 77; }
out=$(bash "$here/../../perf/link-fault.sh" -L -n 3 -H 1 -a 3 -d 15 -t 2000 -- "$prog" cut 1 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E "test_shrink_dead|FAIL|link-fault"
k=$(printf '%s\n' "$out" | grep -c "test_shrink_dead: rank .*PASS")
if [ "$rc" -ne 0 ] || [ "$k" -ne 3 ]; then
    echo "cut_link.sh: FAIL: exit $rc, $k of 3 ranks passed"
    exit 1
fi
echo "cut_link.sh: the cut-off rank left, the others shrank within the bound and went on"
