#!/usr/bin/env bash
# test.sh -- install what is missing, build, and run the whole test suite with ctest: unit tests,
# MPI tests at 1..5 ranks, GPU tests (reported skipped without a device). Extra arguments go to
# ctest (for example -L unit, or -R allreduce).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
gvq_install_packages
gvq_build
cd "$GVQ_BUILD_DIR"
ctest --output-on-failure --timeout 600 "$@"
