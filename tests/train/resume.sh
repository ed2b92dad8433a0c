#!/usr/bin/env bash
# resume.sh GVQ_TRAIN -- gvq-train's commits on disk (--elastic K --commit-dir DIR, --resume DIR),
# 2 ranks started without mpirun (scripts/gvq-launch.sh), the CNN on real Fashion-MNIST:
#   1. a run stopped after step 70 (--stop-step) leaves the commit of step 60 on disk;
#   2. a run resumed from it ends with the same weights, to the bit, as a run of the same 120
#      steps without a stop, with plain aggregation and with the tracked basis on the 16-bit wire
#      (each rank's compressor state, DIR/gvq-train.agg.RANK, carried: basis, residual,
#      counters); with one rank's compressor file missing or corrupted every rank rebuilds its
#      compressors, a line naming why, and the run ends well;
#   3. a resume refuses, with a line naming the cause and a non-zero status, a commit with a
#      flipped byte (checksum), one cut short, a missing one, one made with another --seed, and
#      one made by another model (other channel widths);
#   4. 3 ranks resumed at step 60 with --elastic 50, one dying at step 75 (before the first
#      multiple of 50): the survivors roll back to step 60 (the commit made where the run
#      started) and end with status 0 (it once rolled back to step -1, uninitialised weights);
#   5. a commit made again by 2 survivors leaves the lost rank's compressor file of that step: a
#      resume on 3 ranks refuses it and every rank rebuilds its compressors.
set -uo pipefail
exe=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
data=/usr/share/datasets/fashion-mnist
if [ ! -r "$data/train-images-idx3-ubyte.gz" ]; then
    echo "SKIPPED: no Fashion-MNIST in $data (Debian package dataset-fashion-mnist)"
    exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
codec=(--codec none)
run() { # ARGS... -> the job's output in $dir/out, its status returned
    bash "$here/../../scripts/gvq-launch.sh" -n 2 -t 120 -- "$exe" --batch 64 --iters 120 \
        --train-subset 5120 --test-subset 500 --print-every 20 --no-progress "${codec[@]}" \
        --elastic 20 "$@" >"$dir/out" 2>&1
}
fail() { echo "FAIL: $*"; cat "$dir/out"; exit 1; }
hash_of() { awk '/# final weights: FNV-1a/ { h = $NF } END { print h }' "$dir/out"; }
stop_resume_whole() { # DIR: stopped at 70, resumed (compressors carried), the whole run alike
    local c=$1
    mkdir "$c"
    run --commit-dir "$c" --stop-step 70 || fail "the stopped run exited with $?"
    grep -q '# commits on disk: 4 in .*, 0 writes failed' "$dir/out" || fail "not 4 commits written"
    [ -s "$c/gvq-train.commit" ] && [ -s "$c/gvq-train.agg.0" ] && [ -s "$c/gvq-train.agg.1" ] ||
        fail "no commit file, or no compressor file of each rank"
    run --resume "$c" || fail "the resumed run exited with $?"
    grep -q '# resumed from .*: step 60 (epoch .*compressors are carried from the commit' \
        "$dir/out" || fail "no resume line at step 60 carrying the compressors"
    grep -q '# done: 60 steps (resumed at step 60)' "$dir/out" ||
        fail "the resumed run did not run 60 steps"
    resumed=$(hash_of)
    run || fail "the whole run exited with $?"
    whole=$(hash_of)
    [ -n "$whole" ] && [ "$resumed" = "$whole" ] ||
        fail "${codec[*]}: resumed weights $resumed, whole run's $whole"
    echo "resume.sh: ${codec[*]}: stopped at 70, resumed from the commit of step 60: final weights $resumed, the same as 120 steps without a stop"
}
stop_resume_whole "$dir/c"
cp "$dir/c/gvq-train.commit" "$dir/good"

# the tracked basis on the 16-bit wire: its basis and each rank's residual carried
codec=(--codec gradiveq --basis track --int-bits 16)
stop_resume_whole "$dir/t"
rebuilt() { # WHAT PATTERN: a resume that rebuilds the compressors, PATTERN on the failing rank
    run --resume "$dir/t" || fail "a resume with $1 exited with $?"
    grep -q -- "--resume: the compressors are rebuilt: .*$2" "$dir/out" &&
        grep -q '# resumed from .*compressors are rebuilt (some rank could not load' "$dir/out" &&
        grep -q '# done: 60 steps (resumed at step 60)' "$dir/out" ||
        fail "a resume with $1: not rebuilt with a line saying '$2', or not finished"
    echo "resume.sh: $1: the compressors rebuilt on every rank ($(grep -m1 -o -- "$2.*" "$dir/out" | cut -c1-80))"
}
cp "$dir/t/gvq-train.agg.1" "$dir/agg1"
rm "$dir/t/gvq-train.agg.1"
rebuilt "rank 1's compressor file missing" "No such file"
cp "$dir/agg1" "$dir/t/gvq-train.agg.1"
size=$(stat -c %s "$dir/agg1")
printf '\x5a' | dd of="$dir/t/gvq-train.agg.1" bs=1 seek=$((size / 2)) conv=notrunc status=none
cmp -s "$dir/agg1" "$dir/t/gvq-train.agg.1" || rebuilt "a flipped byte in rank 1's" "checksum mismatch"
codec=(--codec none)

refuse() { # WHAT PATTERN ARGS...: a resume that must fail with PATTERN in its output
    local what=$1 pat=$2
    shift 2
    run "$@" && fail "a resume from $what succeeded"
    grep -q -- "$pat" "$dir/out" || fail "a resume from $what: no line saying '$pat'"
    echo "resume.sh: $what refused: $(grep -m1 -- "$pat" "$dir/out" | sed 's/^\[[0-9]*\] //' | cut -c1-150)"
}
size=$(stat -c %s "$dir/good")
cp "$dir/good" "$dir/c/gvq-train.commit"
byte=$(od -An -tu1 -j $((size / 2)) -N1 "$dir/good" | tr -d ' ') # flipped, whatever it was
printf "\\$(printf '%03o' $((byte ^ 0x5a)))" |
    dd of="$dir/c/gvq-train.commit" bs=1 seek=$((size / 2)) conv=notrunc status=none
refuse "a flipped byte" "checksum mismatch" --resume "$dir/c"
head -c $((size - 100)) "$dir/good" >"$dir/c/gvq-train.commit"
refuse "a file cut short" "shorter than its header says" --resume "$dir/c"
cp "$dir/good" "$dir/c/gvq-train.commit"
refuse "another seed" "made with --seed 1, this run's is 2" --resume "$dir/c" --seed 2
refuse "another model" "made by another model" --resume "$dir/c" --channels 8,16,32
refuse "a missing file" "No such file" --resume "$dir/none"

run3() { # ARGS... on 3 ranks (a batch of 96) -> $dir/out, the job's status
    bash "$here/../../scripts/gvq-launch.sh" -n 3 -t 120 --keep-going -- "$exe" --batch 96 \
        --iters 120 --train-subset 5760 --test-subset 500 --print-every 20 --no-progress \
        --codec none "$@" >"$dir/out" 2>&1
}
mkdir "$dir/c3"
run3 --elastic 20 --commit-dir "$dir/c3" --stop-step 70 || fail "the 3-rank stopped run exited with $?"
run3 --elastic 50 --resume "$dir/c3" --die 1:75 || fail "the resumed 3-rank run exited with $?"
# rank 1 leaves at the start of step 75: the others see it in step 75's calls or, when its
# part of them was already sent, in step 76's; either way the roll-back is to step 60
grep -Eq '# fault at step 7[56]: 3 -> 2 ranks.*back to step 60 ' "$dir/out" ||
    fail "a fault before the resumed run's first commit step did not roll back to step 60"
grep -q '# done: 60 steps (resumed at step 60)' "$dir/out" || fail "no done line after the fault"
echo "resume.sh: resumed at 60 with --elastic 50, a rank lost at 75: rolled back to 60 and finished"

# a commit made again by fewer ranks after a fault leaves the lost rank's compressor file of the
# same step behind: a resume on 3 ranks must not load it (its residual would count twice), so
# every rank rebuilds
mkdir "$dir/c4"
track=(--codec gradiveq --basis track --int-bits 16)
run3 --elastic 20 --commit-dir "$dir/c4" --die 1:65 --stop-step 70 "${track[@]}" ||
    fail "the 3-rank run that lost a rank exited with $?"
[ -s "$dir/c4/gvq-train.agg.2" ] || fail "no compressor file of rank 2 left from before the fault"
run3 --resume "$dir/c4" "${track[@]}" || fail "the resume on 3 ranks exited with $?"
grep -q 'rank 2: --resume: the compressors are rebuilt: the commit was made by 2 ranks' "$dir/out" &&
    grep -q '# resumed from .*compressors are rebuilt (some rank could not load' "$dir/out" ||
    fail "a compressor file left by a larger job was not refused"
echo "resume.sh: a compressor file left by the rank lost before the commit: refused, rebuilt on every rank"
echo "resume.sh: PASS"
