#!/usr/bin/env bash
# fuzz.sh -- build the libFuzzer targets of tests/fuzz/ with clang (coverage, AddressSanitizer,
# UndefinedBehaviorSanitizer) and run each for a bounded time on its seed corpus. Fails on any
# crash, sanitizer report, leak, timeout or out-of-memory; the input that did it is kept in
# $GVQ_FUZZ_BUILD_DIR/artifacts/.
#
#   bash scripts/fuzz.sh              every target, GVQ_FUZZ_SECONDS (default 30) each, in parallel
#   bash scripts/fuzz.sh NAME...      only fuzz_NAME...
#   bash scripts/fuzz.sh --seeds      rewrite tests/fuzz/corpus/NAME/ for the targets that make
#                                     their own seeds (GVQ_FUZZ_WRITE_SEEDS, tests/fuzz/fuzz_common.h)
#   reproduce a finding:              build-fuzz/fuzz_NAME build-fuzz/artifacts/NAME-crash-...
#
# A target is a file tests/fuzz/fuzz_NAME.c (LLVMFuzzerTestOneInput); its seeds, when it has
# any, are the files of tests/fuzz/corpus/NAME/. New inputs the fuzzer finds go to a scratch
# folder, never into the repository.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
GVQ_PACKAGES="cmake libopenmpi-dev openmpi-bin libopenblas-dev liblapacke-dev clang-14 libclang-rt-14-dev libfuzzer-14-dev"
gvq_install_packages

BUILD=${GVQ_FUZZ_BUILD_DIR:-$GVQ_ROOT/build-fuzz}
SECONDS_EACH=${GVQ_FUZZ_SECONDS:-30}
CORPUS=$GVQ_ROOT/tests/fuzz/corpus

names=()
if [ $# -gt 0 ] && [ "$1" != "--seeds" ]; then
    names=("$@")
else
    for src in "$GVQ_ROOT"/tests/fuzz/fuzz_*.c; do
        n=$(basename "$src" .c)
        names+=("${n#fuzz_}")
    done
fi

echo "== building the fuzz targets (${names[*]}) with clang-14 in $BUILD"
CC=clang-14 cmake -S "$GVQ_ROOT/tests/fuzz" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target "${names[@]/#/fuzz_}"

if [ "${1:-}" = "--seeds" ]; then
    for n in "${names[@]}"; do
        mkdir -p "$CORPUS/$n"
        GVQ_FUZZ_WRITE_SEEDS="$CORPUS/$n" "$BUILD/fuzz_$n" -runs=0 >/dev/null 2>&1 || true
        echo "== $n: $(ls "$CORPUS/$n" | wc -l) seed files in tests/fuzz/corpus/$n"
    done
    exit 0
fi

mkdir -p "$BUILD/artifacts"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
pids=()
for n in "${names[@]}"; do
    mkdir -p "$scratch/$n"
    seeds=()
    [ -d "$CORPUS/$n" ] && seeds=("$CORPUS/$n")
    echo "== fuzz_$n: ${SECONDS_EACH} s, seeds: ${seeds[*]:-none}"
    # the outer timeout guards against a hang libFuzzer itself does not report
    timeout -k 10 $((SECONDS_EACH + 120)) "$BUILD/fuzz_$n" -max_total_time="$SECONDS_EACH" \
        -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$BUILD/artifacts/$n-" "$scratch/$n" "${seeds[@]}" \
        >"$scratch/$n.log" 2>&1 &
    pids+=($!)
done
failed=0
for i in "${!names[@]}"; do
    n=${names[$i]}
    if wait "${pids[$i]}"; then
        echo "== fuzz_$n: passed ($(grep -o 'Done [0-9]* runs' "$scratch/$n.log" || echo '? runs'))"
    else
        failed=1
        echo "== fuzz_$n: FAILED; the end of its log:"
        tail -n 60 "$scratch/$n.log"
    fi
done
if [ "$failed" -ne 0 ]; then
    echo "== fuzzing found a failure; inputs in $BUILD/artifacts/"
    exit 1
fi
echo "== fuzzing: every target passed"
