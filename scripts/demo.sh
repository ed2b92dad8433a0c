#!/usr/bin/env bash
# demo.sh -- what gvq is for, in about two minutes: install what is missing, build, then run
# gvq-perf on 4 ranks over emulated slow links (perf/emulate-cluster.sh: one network namespace per
# rank, every link shaped to 1 Gbit/s each way) with gvq's plain ring, MPI_Allreduce, GradiVeQ
# and 4-bit QSGD side by side, and end with a short summary (speed-ups, compression ratio, error)
# and a picture: bus bandwidth against message size per codec (build/demo/busbw.png, drawn by
# perf/plot_busbw.py from gvq-perf's CSV).
#
# The emulation needs root and `ip netns` (iproute2); without them the demo says so and runs the
# same codecs on 4 local ranks over shared memory, where the link is not the bottleneck.
#   bash scripts/demo.sh                    # the default run
#   bash scripts/demo.sh -b 64M -e 64M      # arguments replace gvq-perf's defaults
# Environment: GVQ_DEMO_LOCAL=1 skips the emulation, GVQ_DEMO_RATE (1gbit) is the links' rate,
# GVQ_DEMO_RANKS (4) the ranks.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
START=$(date +%s)
gvq_install_packages
gvq_install_packages python3-matplotlib iproute2 ||
    echo "== could not install python3-matplotlib and iproute2: no picture, no emulated links"
gvq_build

NP=${GVQ_DEMO_RANKS:-4}
RATE=${GVQ_DEMO_RATE:-1gbit}
OUT=$GVQ_BUILD_DIR/demo
CSV=$OUT/allreduce.csv
PNG=$OUT/busbw.png
mkdir -p "$OUT"
rm -f "$CSV" "$PNG"
PERF="$GVQ_BUILD_DIR/perf/gvq-perf"
ARGS=("$@")
# 1, 4 and 16 MiB of float32; GradiVeQ at slice 64, d <= 8 (ratio 8), fitted after 20 sampling
# calls (untimed); 4-bit QSGD; 5 timed calls per size after 2 warm-up ones
[ ${#ARGS[@]} -gt 0 ] ||
    ARGS=(-b 1M -e 16M -f 4 -n 5 -w 2 -C all -L 64 -D 8 --eps 0.003 -T 20)
ARGS+=(--csv "$CSV")

# Can this shell make network namespaces? (root, iproute2, a kernel that allows it)
can_emulate() {
    [ "${GVQ_DEMO_LOCAL:-0}" != 1 ] || { WHY="GVQ_DEMO_LOCAL=1"; return 1; }
    [ "$(id -u)" -eq 0 ] || { WHY="not root"; return 1; }
    command -v ip >/dev/null && command -v tc >/dev/null || { WHY="no ip/tc (iproute2)"; return 1; }
    local probe="gvqdemo-probe-$$"
    ip netns add "$probe" 2>/dev/null || { WHY="'ip netns add' is not allowed here"; return 1; }
    ip netns del "$probe"
}

WHERE=""
if can_emulate; then
    echo "== $NP ranks in network namespaces, links shaped to $RATE each way: gvq-perf ${ARGS[*]}"
    if bash "$GVQ_ROOT/perf/emulate-cluster.sh" -n "$NP" -r "$RATE" -- "$PERF" "${ARGS[@]}"; then
        WHERE="emulated cluster, $NP ranks, $RATE links"
    else
        echo "== the emulated cluster failed (above); running on local ranks instead"
    fi
else
    echo "== no emulated cluster: $WHY (perf/emulate-cluster.sh needs root and 'ip netns')"
fi
if [ -z "$WHERE" ]; then
    echo "== $NP local ranks over shared memory: gvq-perf ${ARGS[*]}"
    rm -f "$CSV"
    mpirun -np "$NP" --oversubscribe "$PERF" "${ARGS[@]}"
    WHERE="local, $NP ranks over shared memory (no slow link: compression has little to win)"
fi

# the picture: with Debian's python3-matplotlib (/usr/bin/python3 when another python3 comes first)
PICTURE="none (python3-matplotlib missing)"
for py in python3 /usr/bin/python3; do
    if "$py" -c "import matplotlib" 2>/dev/null; then
        if "$py" "$GVQ_ROOT/perf/plot_busbw.py" -o "$PNG" -t "gvq-perf allreduce, $WHERE" "$CSV" \
            >/dev/null; then
            PICTURE="$PNG (busbw per message size and codec)"
        fi
        break
    fi
done

# The summary: the largest size, out-of-place, read back from the CSV.
python3 - "$CSV" "$WHERE" "$PICTURE" "$(($(date +%s) - START))" <<'EOF'
import csv, sys
path, where, picture, secs = sys.argv[1:5]
rows = [r for r in csv.DictReader(open(path)) if (r.get("collective") or "allreduce") == "allreduce"]
by = {}
for r in rows:
    by.setdefault(int(r["size_bytes"]), {})[r["codec"]] = r
def t(r):
    try: return float(r["oop_time_us"]) / 1e3
    except (TypeError, ValueError): return None
def f(r, k):
    try: return float(r.get(k) or "")
    except ValueError: return None
def mib(n): return "%g MiB" % (n / 1048576) if n >= 1048576 else "%g KiB" % (n / 1024)
if not by:
    sys.exit("demo: gvq-perf wrote no rows to %s" % path)
size = max(by)
c = by[size]
names = {"none": "gvq plain ring", "mpi": "MPI_Allreduce", "gradiveq": "GradiVeQ", "qsgd": "QSGD 4-bit",
         "powersgd": "PowerSGD r 4"}
print("\n== summary: allreduce of %s float32, %s, out-of-place" % (mib(size), where))
base = t(c["none"]) if "none" in c else None
for k in ("none", "mpi", "gradiveq", "qsgd", "powersgd"):
    if k not in c or t(c[k]) is None:
        continue
    line = "   %-15s %8.1f ms" % (names[k], t(c[k]))
    if k != "none" and base:
        line += "   %5.2fx the plain ring's speed" % (base / t(c[k]))
    if k in ("gradiveq", "qsgd", "powersgd"):
        ratio, err = f(c[k], "oop_ratio"), f(c[k], "oop_rel_err")
        if ratio: line += ", %.1fx fewer bytes" % ratio
        if err is not None: line += ", relative error %.1e" % err
    print(line)
if "gradiveq" in c and t(c["gradiveq"]):
    g = t(c["gradiveq"])
    vs = ["%.1fx over %s" % (t(c[k]) / g, names[k]) for k in ("none", "mpi", "qsgd")
          if k in c and t(c[k])]
    print("   GradiVeQ's speed-up (their time / its time): " + ", ".join(vs))
    per = ["%s %.1fx" % (mib(s), t(by[s]["none"]) / t(by[s]["gradiveq"])) for s in sorted(by)
           if "none" in by[s] and "gradiveq" in by[s] and t(by[s]["none"]) and t(by[s]["gradiveq"])]
    if len(per) > 1:
        print("   GradiVeQ over the plain ring by size: " + ", ".join(per))
print("   picture: %s\n   table: %s (gvq-perf --csv); the demo took %s s" % (picture, path, secs))
EOF
