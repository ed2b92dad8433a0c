#!/usr/bin/env bash
# plot.sh -- draw gvq-train runs (their --log CSV files) into one PNG: training loss and test
# accuracy against wall-clock time (evaluation excluded) and against iterations, one line per run.
#
#   bash apps/gvq-train/plot.sh OUT.png RUN.csv [RUN.csv ...]
#   bash apps/gvq-train/plot.sh perf/figures/train_parity.png none.csv gradiveq.csv qsgd.csv
#
# A run is labelled with its file name without .csv (set GVQ_PLOT_TITLE for the figure's title).
# Needs gnuplot: the Debian package gnuplot-nox is installed with apt-get when it is missing.
set -euo pipefail

if [ $# -lt 2 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    sed -n '2,10p' "$0"
    [ $# -ge 2 ] || exit 2
    exit 0
fi
out=$1
shift
for f in "$@"; do
    [ -r "$f" ] || { echo "plot.sh: cannot read '$f'" >&2; exit 2; }
    head -1 "$f" | grep -q '^iter,epoch,time_s,loss,train_acc,test_acc' ||
        { echo "plot.sh: '$f' is not a gvq-train --log file (no CSV header)" >&2; exit 2; }
done

if ! command -v gnuplot >/dev/null; then
    echo "== installing the Debian package gnuplot-nox"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y gnuplot-nox
fi

# one "plot" clause per file for a column pair; test_acc is -1 in rows without an evaluation
plots() { # xcol ycol
    local first=1 f title
    for f in "$@"; do
        title=$(basename "$f" .csv)
        [ $first -eq 1 ] || printf ', '
        first=0
        # rows without the value are dropped before gnuplot sees them (an undefined point
        # would break the line, and evaluations are rarer than progress rows)
        printf "\"< awk -F, 'NR == 1 || \\\$%s >= 0' %s\" using %s:%s with lines lw 2 title '%s'" \
            "$ycol" "$f" "$xcol" "$ycol" "$title"
    done
}

title=${GVQ_PLOT_TITLE:-gvq-train on Fashion-MNIST}
{
    echo "set terminal pngcairo size 1100,760 font ',9' noenhanced"
    echo "set output '$out'"
    echo "set datafile separator ','"
    echo "set key autotitle columnhead"
    echo "set grid"
    echo "set multiplot layout 2,2 title '${title//\'/}'"
    echo "set key top right"
    xcol=3 ycol=4; echo "set xlabel 'wall-clock training time (s)'; set ylabel 'training loss'"
    echo "plot $(plots "$@")"
    xcol=1 ycol=4; echo "set xlabel 'iteration'; set ylabel 'training loss'"
    echo "plot $(plots "$@")"
    echo "set key bottom right"
    xcol=3 ycol=6; echo "set xlabel 'wall-clock training time (s)'; set ylabel 'test accuracy (%)'"
    echo "plot $(plots "$@")"
    xcol=1 ycol=6; echo "set xlabel 'iteration'; set ylabel 'test accuracy (%)'"
    echo "plot $(plots "$@")"
    echo "unset multiplot"
} | gnuplot
echo "plot.sh: wrote $out ($(du -k "$out" | cut -f1) KB)"
