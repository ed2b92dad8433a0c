#!/usr/bin/env python3
"""plot_busbw.py -- bus bandwidth against message size, one line per codec, from gvq-perf's CSV.

    python3 perf/plot_busbw.py -o busbw.png run.csv [more.csv ...] [-t TITLE] [--in-place]

Reads the CSV that `gvq-perf --csv FILE` writes (one row per size and codec; columns named in
its header line) and draws busbw (GB/s, out-of-place; --in-place adds the in-place case dashed)
against the message size on log axes, the way nccl-tests results are usually read. busbw is
that of the uncompressed size for every codec, so a compressed codec's line above the plain ring
is its speed-up. With several files each line is labelled with the file's name too. Rows of
another collective than allreduce (a `collective` column, when gvq-perf writes one) are drawn as
lines of their own. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import csv
import os
import sys

CODEC_LABELS = {
    "none": "gvq ring (plain)",
    "mpi": "MPI_Allreduce",
    "gradiveq": "GradiVeQ",
    "qsgd": "QSGD",
    "powersgd": "PowerSGD",
}


def fmt_size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%g %s" % (n, unit)
        n /= 1024.0
    return str(n)


def read_series(path, tag):
    """{(label): [(size, busbw_oop, busbw_ip)]} from one CSV."""
    series = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                size = int(row["size_bytes"])
            except (KeyError, ValueError):
                continue
            coll = row.get("collective") or "allreduce"
            codec = row.get("codec", "?")
            label = CODEC_LABELS.get(codec, codec)
            if coll != "allreduce":
                label = "%s %s" % (coll, "gvq" if codec == "none" else label)
            if tag:
                label = "%s (%s)" % (label, tag)

            def num(key):
                try:
                    return float(row.get(key) or "nan")
                except ValueError:
                    return float("nan")

            series.setdefault(label, []).append(
                (size, num("oop_busbw_gbs"), num("ip_busbw_gbs")))
    return series


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+", help="gvq-perf --csv files")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("-t", "--title", default=None, help="title of the plot")
    ap.add_argument("--in-place", action="store_true", help="also draw the in-place case (dashed)")
    args = ap.parse_args(argv)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator
    except ImportError:
        print("plot_busbw: matplotlib is missing (Debian: apt-get install python3-matplotlib)",
              file=sys.stderr)
        return 2

    many = len(args.csv) > 1
    series = {}
    for path in args.csv:
        tag = os.path.splitext(os.path.basename(path))[0] if many else ""
        for label, pts in read_series(path, tag).items():
            series.setdefault(label, []).extend(pts)
    if not series:
        print("plot_busbw: no rows with size_bytes in %s" % ", ".join(args.csv), file=sys.stderr)
        return 1

    fig, ax = plt.subplots(figsize=(10, 5))
    for label, pts in series.items():
        pts.sort()
        sizes = [p[0] for p in pts]
        line, = ax.plot(sizes, [p[1] for p in pts], marker="o", label=label)
        if args.in_place:
            ax.plot(sizes, [p[2] for p in pts], marker="x", linestyle="--",
                    color=line.get_color(), label=label + ", in-place")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_size(x)))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis(FuncFormatter(lambda y, _: "%g" % y))
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s, of the uncompressed size)")
    ax.set_title(args.title or "gvq-perf: allreduce bus bandwidth per codec")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print("plot_busbw: wrote %s (%d lines)" % (args.output, len(series)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
