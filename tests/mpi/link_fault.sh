#!/usr/bin/env bash
# link_fault.sh GVQ_PERF [mpi|ucx] -- link faults on the emulated cluster (perf/link-fault.sh):
# 2 ranks on 2 emulated hosts at 1 Gbit/s, host 1's link taken down at the bridge.
#   1. down 2 s with GVQ_TIMEOUT_MS 10000: the run completes, every result checked (#wrong 0);
#   2. down 6 s with GVQ_TIMEOUT_MS 2000: every rank's call fails with a WARN naming the
#      timeout within 2 s + 2 s of the fault, and the job exits non-zero (mpirun's own teardown
#      waits for the link, which carries its out-of-band channel);
#   3. host 1 drops 5% of its packets each way for 4 s (nftables, perf/link-fault.sh -l): the
#      run completes, every result checked (#wrong 0), and packets were dropped.
# Exit 77 (skipped) where network namespaces cannot be made.
set -uo pipefail
perf=$1
transport=${2:-mpi}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if ! ip netns add gvqlfprobe$$ 2>/dev/null; then
    echo "link_fault.sh: cannot make network namespaces here: skipped"
    exit 77
fi
ip netns del gvqlfprobe$$
command -v bc >/dev/null || { echo "link_fault.sh: needs bc: skipped"; exit 77; }
export GVQ_EMU_MPIRUN_ARGS="-x GVQ_TRANSPORT=$transport"
fail=0

out=$(bash "$here/../../perf/link-fault.sh" -a 2 -d 2 -t 10000 -- "$perf" -b 4M -e 4M -C none \
    -n 120 -w 2 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E "link-fault|^ +4194304|WARN"
row=$(printf '%s\n' "$out" | grep -E '^ +4194304 ')
if [ "$rc" -ne 0 ] || [ -z "$row" ] || ! printf '%s\n' "$row" | awk '{exit !($9 == 0 && $13 == 0)}'; then
    echo "link_fault.sh: FAIL: a 2 s outage under a 10 s timeout: exit $rc, row '$row'"
    fail=1
fi
grep -q "link down" <<<"$out" || { echo "link_fault.sh: FAIL: the run ended before the fault"; fail=1; }

out=$(bash "$here/../../perf/link-fault.sh" -a 2 -d 6 -t 2000 -- "$perf" -b 4M -e 4M -C none \
    -n 400 -w 2 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E "link-fault"
n=$(printf '%s\n' "$out" | grep -E "last logged [0-9.]+ s after the link went down: .*GVQ WARN" |
    awk '{for (i = 1; i <= NF; i++) if ($i == "logged") t = $(i + 1); if (t <= 4.0) k++} END {print k + 0}')
if [ "$rc" -eq 0 ] || [ "$n" -ne 2 ]; then
    echo "link_fault.sh: FAIL: a 6 s outage under a 2 s timeout: exit $rc, $n of 2 ranks failed within 4 s"
    fail=1
fi
dropped=skipped
if ! command -v nft >/dev/null; then
    echo "link_fault.sh: the 5% packet loss case skipped: no nft (Debian's nftables)"
else
out=$(bash "$here/../../perf/link-fault.sh" -l 5 -a 1 -d 4 -t 10000 -- "$perf" -b 4M -e 4M -C none \
    -n 120 -w 2 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E "link-fault|^ +4194304"
row=$(printf '%s\n' "$out" | grep -E '^ +4194304 ')
dropped=$(printf '%s\n' "$out" | awk '/counter packets/ { for (i = 1; i < NF; i++) if ($i == "packets") s += $(i + 1) } END { print s + 0 }')
if [ "$rc" -ne 0 ] || [ -z "$row" ] || ! printf '%s\n' "$row" | awk '{exit !($9 == 0 && $13 == 0)}' ||
    [ "$dropped" -eq 0 ]; then
    echo "link_fault.sh: FAIL: 5% packet loss: exit $rc, row '$row', $dropped packets dropped"
    fail=1
fi
fi
[ "$fail" -eq 0 ] && echo "link_fault.sh ($transport): short outage survived exactly, long outage failed on every rank within the timeout, 5% packet loss (packets dropped: $dropped) changed no result"
exit "$fail"
