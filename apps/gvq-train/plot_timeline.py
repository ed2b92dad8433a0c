#!/usr/bin/env python3
"""plot_timeline.py -- one training step as a picture, from gvq-train --timeline CSVs.

usage: plot_timeline.py OUT.png LABEL=timeline.csv [LABEL=timeline.csv ...]

One panel per CSV (e.g. aggregation after backprop, and wait-free backprop), time on x:
the forward pass and each layer's backward on the compute row, each aggregation (a bucket is one
bar: its members share start and end) on the communication row, a tick where each gradient
became ready, and the wait and update.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    rows = []
    with open(path) as f:
        lines = [line for line in f if not line.startswith("#")]
    for r in csv.DictReader(lines):
        r["start_s"] = float(r["start_s"]) * 1e3
        r["end_s"] = float(r["end_s"]) * 1e3
        r["ready_s"] = float(r["ready_s"]) * 1e3 if r["ready_s"] else None
        rows.append(r)
    return rows


def draw(ax, rows, label):
    colors = {"forward": "#4c72b0", "backward": "#55a868", "update": "#8172b2"}
    for r in rows:
        w = r["end_s"] - r["start_s"]
        if r["what"] in colors:
            ax.broken_barh([(r["start_s"], w)], (2.6, 0.8), facecolors=colors[r["what"]],
                           edgecolor="white")
            if r["what"] == "backward" and w > 1.0:
                ax.text(r["start_s"] + w / 2, 3.0, r["name"].replace("layer", "L"), ha="center",
                        va="center", fontsize=7, color="white")
        elif r["what"] == "wait":
            ax.broken_barh([(r["start_s"], w)], (2.6, 0.8), facecolors="#dddddd",
                           edgecolor="white", hatch="//")
    seen = {}
    for r in rows:
        if r["what"] != "aggregate":
            continue
        key = (round(r["start_s"], 4), round(r["end_s"], 4))
        seen.setdefault(key, []).append(r["name"])
        ax.plot([r["ready_s"]] * 2, [1.45, 1.85], color="black", lw=0.8)
    for (s, e), names in sorted(seen.items()):
        ax.broken_barh([(s, e - s)], (0.6, 0.8), facecolors="#c44e52", edgecolor="white")
        text = names[0] if len(names) == 1 else "%s..%s" % (names[0], names[-1])
        if e - s > 2.0:
            ax.text((s + e) / 2, 1.0, text, ha="center", va="center", fontsize=6, color="white")
    step = max(r["end_s"] for r in rows)
    ax.set_yticks([1.0, 3.0])
    ax.set_yticklabels(["aggregation", "compute"])
    ax.set_ylim(0.3, 3.7)
    ax.set_title("%s: step %.1f ms (ticks: gradient ready)" % (label, step), fontsize=9)
    return step


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    panels = [a.split("=", 1) for a in sys.argv[2:]]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 1.9 * len(panels)), sharex=True)
    if len(panels) == 1:
        axes = [axes]
    for ax, (label, path) in zip(axes, panels):
        draw(ax, read(path), label)
    axes[-1].set_xlabel("ms since the step's start")
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
