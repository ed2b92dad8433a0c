#!/usr/bin/env bash
# pipe_stages.sh GVQ_TRAIN MPIEXEC -- gvq-train --stages S (GPipe through gvqPipe) on the ResNet:
# cutting the model into 2 and 3 stages must not change a single printed digit of the loss,
# train accuracy or test accuracy against the same run on 1 stage (the same layer code, the
# same micro-batches in the same order, the same updates); 2 replicas x 2 stages on 4 ranks keep
# every stage's replicas identical; a stage count that does not divide the ranks, or that would
# leave a stage without layers, is refused.
# (grep -q reads a here-string, never a pipe: under pipefail an `echo | grep -q` that stops
# at its first match can fail on the echo's SIGPIPE, as CI once saw)
set -euo pipefail
train=$1 mpiexec=$2
run() {
    local np=$1
    shift
    "$mpiexec" -n "$np" --oversubscribe "$train" --model resnet --micro-batches 4 --batch 64 \
        --iters 20 --train-subset 2560 --test-subset 500 --lr 0.05 --print-every 10 \
        --eval-every 20 "$@"
}
digits() { grep '^epoch' | sed 's/ *[0-9]* img\/s//'; }
one=$(run 1 --stages 1)
echo "$one" | tail -3
ref=$(echo "$one" | digits)
[ "$(echo "$ref" | wc -l)" -eq 2 ] || { echo "FAIL: 1 stage printed no progress lines"; exit 1; }
for s in 2 3; do
    out=$(run $s --stages $s)
    echo "$out" | grep '^# stages'
    got=$(echo "$out" | digits)
    [ "$got" = "$ref" ] || { printf 'FAIL: %s stages printed\n%s\nbut 1 stage\n%s\n' $s "$got" "$ref"; exit 1; }
done
if out=$(run 3 --stages 2 2>&1); then echo "FAIL: --stages 2 on 3 ranks was accepted"; exit 1; fi
grep -q 'needs a multiple of 2 ranks' <<<"$out" || { echo "FAIL: no reason for the refusal: $out"; exit 1; }
out=$(run 4 --stages 2)
echo "$out" | grep '^# replicas'
grep -q "identical across its replicas: yes" <<<"$out" || { echo "FAIL: 2 x 2: replicas differ"; exit 1; }
[ "$(echo "$out" | digits | wc -l)" -eq 2 ] || { echo "FAIL: 2 replicas x 2 stages printed no progress"; exit 1; }
if out=$("$mpiexec" -n 8 --oversubscribe "$train" --model resnet --stages 8 --iters 1 \
        --train-subset 640 --test-subset 100 2>&1); then
    echo "FAIL: 8 stages of a 7-layer network were accepted"; exit 1
fi
grep -q 'cannot be cut into 8 stages' <<<"$out" || { echo "FAIL: no reason for the bad cut: $out"; exit 1; }
for sched in pipedream spectrain; do # they train, and 2 x 2 replicas stay identical
  for np in 2 4; do
    out=$(run $np --stages 2 --schedule $sched)
    first=$(echo "$out" | grep '^epoch' | head -1 | awk '{print $6}')
    last=$(echo "$out" | grep '^epoch' | tail -1 | awk '{print $6}')
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || { echo "FAIL: $sched on $np ranks: loss $first -> $last"; exit 1; }
    [ $np = 2 ] || grep -q "identical across its replicas: yes" <<<"$out" || { echo "FAIL: $sched 2 x 2: replicas differ"; exit 1; }
  done
done
# overlapped transfers move the same data: every printed digit as the blocking run's; so does
# the pipeline without a flush (dualpipe, 3 stages); and it trains
ref=$(run 3 --stages 3 --schedule dualpipe --no-flush | digits)
got=$(run 3 --stages 3 --schedule dualpipe --no-flush --overlap-transfers | digits)
[ "$got" = "$ref" ] || { printf 'FAIL: overlapped transfers printed\n%s\nblocking ones\n%s\n' "$got" "$ref"; exit 1; }
first=$(echo "$ref" | head -1 | awk '{print $6}') last=$(echo "$ref" | tail -1 | awk '{print $6}')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || { echo "FAIL: dualpipe without a flush: loss $first -> $last"; exit 1; }
got=$(run 3 --stages 3 --overlap-transfers | digits)
ref=$(run 3 --stages 3 | digits)
[ "$got" = "$ref" ] || { echo "FAIL: gpipe with overlapped transfers differs"; exit 1; }
# the mlp (wide fc layers) cut into 4 stages prints 1 stage's digits
mlp() { "$mpiexec" -n "$1" --oversubscribe "$train" --model mlp --hidden 64 --depth 3 --micro-batches 4 \
        --batch 64 --iters 20 --train-subset 1280 --test-subset 200 --print-every 10 --eval-every 20 --stages "$1"; }
[ "$(mlp 4 | digits)" = "$(mlp 1 | digits)" ] || { echo "FAIL: the mlp on 4 stages differs from 1 stage"; exit 1; }
if out=$(run 2 --stages 2 --no-flush 2>&1); then echo "FAIL: gpipe --no-flush was accepted"; exit 1; fi
grep -q 'gpipe flushes every step' <<<"$out" || { echo "FAIL: no reason for refusing gpipe --no-flush: $out"; exit 1; }
echo "PASS: 2 and 3 stages reproduce 1 stage; 2 x 2 replicas agree; pipedream and spectrain train; overlapped transfers change no digit; dualpipe without a flush trains; the mlp on 4 stages reproduces 1 stage; bad stage counts and gpipe --no-flush refused"
