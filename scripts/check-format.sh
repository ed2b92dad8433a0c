#!/usr/bin/env bash
# check-format.sh -- every C source and header of the project is formatted as .clang-format
# says (clang-format 14, Debian's `clang-format`). Installs it when missing. With --fix, formats
# the files in place instead of checking.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v clang-format-14 >/dev/null; then
    echo "== installing Debian package: clang-format"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y clang-format
fi
files=$(git ls-files '*.c' '*.h' '*.cu')
if [ "${1:-}" = "--fix" ]; then
    clang-format-14 -i $files
    exit 0
fi
echo "== clang-format: $(echo "$files" | wc -w) files"
clang-format-14 --dry-run --Werror $files
echo "== clang-format: clean"
