#!/usr/bin/env bash
# emulate-cluster.sh -- run an MPI program on N emulated hosts with rate-limited links.
#
#   bash perf/emulate-cluster.sh [-n RANKS] [-p PER_HOST] [-m slot|node] [-r RATE] [-l LATENCY] [-b BURST]
#                                [-k LINKS] [-L] [-- ] PROGRAM [ARGS...]
#   bash perf/emulate-cluster.sh -n 4 -r 1gbit -- build/perf/gvq-perf -b 64M -e 64M -C none,mpi
#
# Each rank gets a network namespace (gvqN-<pid>-<i>) with one veth link to a bridge that lives
# in a namespace of its own, so the host's network is never touched. Every link is shaped with
# tbf in both directions (default 1gbit, 25 ms of queue, a 256 KB token bucket: a link idle
# for a while then sends that much at once; -b 16kb makes a 100mbit link strict to ~1 ms, which
# time-overlap measurements need). mpirun itself runs inside the first
# namespace and reaches the others through a tiny rsh agent that runs `ip netns exec`; Open MPI is
# told to use TCP on the emulated subnet only (no shared memory between ranks). Everything is
# torn down on exit, error or Ctrl-C. Needs root (or CAP_NET_ADMIN), iproute2 and Open MPI.
#
# -k LINKS: TCP connections per pair of ranks (Open MPI's btl_tcp_links; default 1, Open MPI's
# own). With one, a pair that sends both ways at once shares one TCP connection, and through
# these shaped links that makes the pair about half duplex: a 2 MB MPI_Sendrecv between two
# ranks takes 1.96x a one-way send at 50mbit -b 16kb, against 1.12x with -k 2 and 1.14x for
# two plain sockets (2026-11-26). Measurements of traffic in both directions (a 2-rank ring,
# a pipeline's activations and errors) need -k 2.
#
# -p K: K ranks per emulated host (RANKS / K hosts, each with one shaped link its ranks share;
# ranks of one host talk over the namespace's loopback, unshaped). -m node places ranks
# round-robin over the hosts (mpirun --map-by node: rank r on host r % H), -m slot (default)
# fills each host in turn (rank r on host r / K); with -L as well.
#
# -L: no mpirun. The ranks start as a launcher would start them (scripts/gvq-launch.sh: torchrun's
# RANK, WORLD_SIZE, MASTER_ADDR = the first namespace's address, MASTER_PORT 29500), each in its
# namespace, with GVQ_SOCKET_IFNAME=eth0: gvqCommInitFromEnv, or the DDP example without MPI.
#
# Environment: GVQ_EMU_SUBNET (default 10.213.7), extra mpirun options in GVQ_EMU_MPIRUN_ARGS
# (with -L: extra scripts/gvq-launch.sh options in GVQ_EMU_LAUNCH_ARGS, e.g. --keep-going).
set -euo pipefail

RANKS=4
RATE=1gbit
LATENCY=25ms
BURST=256kb
LINKS=1
LAUNCH=0
PER=1
MAP=slot
while [ $# -gt 0 ]; do
    case "$1" in
        -n) RANKS=$2; shift 2 ;;
        -r) RATE=$2; shift 2 ;;
        -l) LATENCY=$2; shift 2 ;;
        -b) BURST=$2; shift 2 ;;
        -k) LINKS=$2; shift 2 ;;
        -L) LAUNCH=1; shift ;;
        -p) PER=$2; shift 2 ;;
        -m) MAP=$2; shift 2 ;;
        -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "emulate-cluster: no program given (see -h)" >&2; exit 2; }
[ "$RANKS" -ge 1 ] && [ "$RANKS" -le 32 ] || { echo "emulate-cluster: -n must be 1..32" >&2; exit 2; }
case "$LINKS" in [1-8]) ;; *) echo "emulate-cluster: -k must be 1..8" >&2; exit 2 ;; esac
case "$MAP" in slot|node) ;; *) echo "emulate-cluster: -m must be slot or node" >&2; exit 2 ;; esac
[ "$PER" -ge 1 ] 2>/dev/null && [ $((RANKS % PER)) -eq 0 ] ||
    { echo "emulate-cluster: -p must divide -n" >&2; exit 2; }
NHOSTS=$((RANKS / PER))
command -v ip >/dev/null && command -v tc >/dev/null || { echo "emulate-cluster: needs iproute2 (ip, tc)" >&2; exit 2; }

SUBNET=${GVQ_EMU_SUBNET:-10.213.7}
TAG="gvq$$"
BRNS="${TAG}br"
WORK=$(mktemp -d)
NS=()

teardown() {
    trap - EXIT INT TERM
    for ns in "${NS[@]}"; do ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true; done
    for ns in "${NS[@]}" "$BRNS"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap teardown EXIT
trap 'teardown; exit 130' INT TERM

ip netns add "$BRNS"
ip -n "$BRNS" link add br0 type bridge
ip -n "$BRNS" link set br0 up
ip -n "$BRNS" link set lo up
# burst: enough for the rate at a 1 ms timer, and at least one jumbo frame
shape() { # namespace device
    tc -n "$1" qdisc add dev "$2" root tbf rate "$RATE" burst "$BURST" latency "$LATENCY"
}
for i in $(seq 0 $((NHOSTS - 1))); do
    ns="${TAG}-$i"
    NS+=("$ns")
    ip netns add "$ns"
    ip link add "v${TAG}h$i" netns "$ns" type veth peer name "p$i" netns "$BRNS"
    ip -n "$ns" link set "v${TAG}h$i" name eth0
    ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$BRNS" link set "p$i" master br0
    ip -n "$BRNS" link set "p$i" up
    shape "$ns" eth0      # what the rank sends
    shape "$BRNS" "p$i"   # what the rank receives
done

# rsh agent: "agent [opts] host command..." -> run command in the host's namespace
cat > "$WORK/agent" <<'EOF'
#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1; shift
exec ip netns exec "$host" /bin/sh -c "$*"
EOF
chmod +x "$WORK/agent"
HOSTS=$(IFS=,; echo "${NS[*]/%/:$PER}")
MAPBY=()
[ "$MAP" = node ] && MAPBY=(--map-by node)

# gvq's UCX transport (GVQ_TRANSPORT=ucx) is held to TCP on eth0: the namespaces share one kernel,
# so UCX would otherwise find shared memory between the emulated hosts and bypass the links
UCX_TLS_EMU=${GVQ_EMU_UCX_TLS:-tcp,self}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PMIX_MCA_gds=hash
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
echo "# emulate-cluster: $RANKS ranks on $NHOSTS hosts ($PER per host, map by $MAP), links $RATE each way (tbf, $LATENCY queue, burst $BURST), $LINKS TCP connection(s) per pair, subnet $SUBNET.0/24"
set +e
if [ "$LAUNCH" = 1 ]; then
    echo "# emulate-cluster: no mpirun: ranks started from the environment (scripts/gvq-launch.sh)"
    GVQ_SOCKET_IFNAME=eth0 UCX_TLS="$UCX_TLS_EMU" UCX_NET_DEVICES=eth0 \
        bash "$(dirname "${BASH_SOURCE[0]}")/../scripts/gvq-launch.sh" -n "$RANKS" -a "$SUBNET.1" \
        --netns "${TAG}-" --hosts "$NHOSTS" --map-by "$MAP" ${GVQ_EMU_LAUNCH_ARGS:-} -- "$@"
    exit $?
fi
ip netns exec "${NS[0]}" mpirun -np "$RANKS" --host "$HOSTS" "${MAPBY[@]}" \
    --mca plm_rsh_agent "$WORK/agent" --mca rtc ^hwloc --mca pml ob1 --mca btl tcp,self \
    --mca btl_tcp_if_include "$SUBNET.0/24" --mca oob_tcp_if_include "$SUBNET.0/24" \
    --mca btl_tcp_links "$LINKS" \
    -x OPENBLAS_NUM_THREADS -x PMIX_MCA_gds -x GVQ_SOCKET_IFNAME=eth0 \
    -x UCX_TLS="$UCX_TLS_EMU" -x UCX_NET_DEVICES=eth0 \
    ${GVQ_EMU_MPIRUN_ARGS:-} "$@"
rc=$?
set -e
exit $rc
