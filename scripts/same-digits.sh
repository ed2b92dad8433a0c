#!/usr/bin/env bash
# same-digits.sh BUILD_DIR OUT -- the digits a change that should not change results must keep:
# gvq-perf's results (#wrong, ratio, rel_err; every collective, GradiVeQ, QSGD, QSGD on the 8-bit
# integer wire, the tracked basis) and gvq-train's (loss, train and test accuracy, ratio) of
# five short runs (CNN with QSGD, the tracked basis on the 16-bit wire, PowerSGD, fitted
# GradiVeQ; ResNet-8 at 4 ranks with fused QSGD), 2 and 4 ranks on this machine. Writes the
# full output to OUT and the digits alone to OUT.digits; compare two with diff. Timings are left
# out (they differ from run to run). Needs Fashion-MNIST (dataset-fashion-mnist).
#   bash scripts/same-digits.sh build /tmp/before && ... && bash scripts/same-digits.sh build /tmp/after
#   diff /tmp/before.digits /tmp/after.digits
set -euo pipefail
b=$1 out=$2
tr=$b/apps/gvq-train/gvq-train
[ -x "$tr" ] || tr=$b/perf/train/gvq-train # a build from before the house move (issue 35)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
M="mpirun -np 2 --oversubscribe"
T="--epochs 2 --lr 0.05 --seed 1 --eval-every 0 --test-subset 500"
{
    $M "$b/perf/gvq-perf" -k allreduce -C none,mpi,gradiveq,qsgd -b 256K -e 1M -n 3 -w 2
    $M "$b/perf/gvq-perf" -k all -b 64K -e 64K -n 2 -w 1
    $M "$b/perf/gvq-perf" -k allreduce -C qsgd --wire int8 -b 1M -e 1M -n 3 -w 2
    $M "$b/perf/gvq-perf" -k allreduce -C gradiveq --basis track -b 1M -e 1M -n 3 -w 2
    for c in "--codec qsgd" "--codec gradiveq --basis track --int-bits 16 --ef-bound 1e6" \
        "--codec powersgd --power-rank 4"; do
        # shellcheck disable=SC2086
        $M "$tr" --model cnn $T --stop-step 60 --print-every 20 $c
    done
    mpirun -np 4 --oversubscribe "$tr" --model resnet --epochs 3 --lr 0.1 --cosine --seed 1 \
        --stop-step 30 --print-every 10 --eval-every 0 --test-subset 500 --codec qsgd
    # shellcheck disable=SC2086
    $M "$tr" --model cnn $T --stop-step 150 --print-every 50 --codec gradiveq
} >"$out" 2>&1
python3 - "$out" >"$out.digits" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    f = line.split()
    if line.startswith("epoch"):
        d = dict(zip(f, f[1:]))
        print("epoch", f[1], f[3], *(k + " " + str(d.get(k)) for k in ("loss", "train", "test", "ratio")))
    elif len(f) >= 13 and f[0].isdigit() and f[2] in ("float", "half", "double", "bfloat16",
                                                       "int8", "uint8", "int32", "uint32",
                                                       "int64", "uint64"):
        if len(f) == 13:   # a collective against MPI: #wrong out-of-place, in-place
            print(*f[:5], "wrong", f[8], f[12])
        else:              # with ratio and rel_err
            print(*f[:5], "wrong/ratio/rel_err", *f[8:11], *f[14:17])
    elif line.startswith(("# gradiveq ", "# qsgd ")):
        print(re.sub(r"fit [0-9.]+ ms", "fit X ms", line.strip()))
    elif line.startswith("# done"):
        print(re.sub(r"in [0-9.]+ s of training.*?accuracy", "... accuracy", line.strip()).split(", compute")[0])
PY
echo "same-digits: $(wc -l <"$out.digits") lines of digits in $out.digits"
