#!/usr/bin/python3
"""cost-model.py -- an alpha-beta cost model of gvq's allreduce on H hosts of K ranks, fitted to
measured runs, checked against them, and extrapolated to 1024 ranks.

    /usr/bin/python3 perf/cost-model.py                     # fit, errors, the 8-1024 table
    /usr/bin/python3 perf/cost-model.py --hosts 128 --per-host 8 --bytes 64M --link-gbps 100
    /usr/bin/python3 perf/cost-model.py --check             # fails if the median error > 15%

Terms per call of S bytes on N = H K ranks (docs/ALGORITHMS.md section 1 has the algorithms):

  alpha    one step whose slowest hop crosses a host link
  alpha_i  one step inside a host
  1/B      seconds per byte through one host's link, one direction (all of its flows together)
  1/B_i    seconds per byte of a copy inside a host (loopback TCP on the emulated cluster)
  t_r      seconds per byte a rank reduces
  t_c      seconds per fp32 byte a rank runs through the codec (QSGD's decode, add, encode)

  ring, host order   2(N-1) alpha + 2(N-1)/N S/B + (N-1)/N S t_r
  ring, rank order   the same with K flows on each link (ranks round-robin over the hosts)
  hier, S > 16 KiB   2(K-1) alpha_i + 2(K-1)/K S/B_i + 2(H-1) alpha + 2(H-1)/H S/B + reductions
  hier, S <= 16 KiB  log2 K (alpha_i + S/B_i) + log2 H (alpha + K S/B)
  compressed         the link term divided by the codec's ratio, t_c on the bytes each rank
                     encodes: 2(N-1)/N S flat, 2(H-1)/H S/K in the hierarchy (whose stages
                     inside a host carry floats)

On the 2-core machine the measurements come from, N processes share 2 cores: every term but
the link's is multiplied by s = max(1, N/2) (the fit says how much of each a core costs). The
fit is a non-negative least squares on relative errors. The table to 1024 ranks uses s = 1 (a
core per rank) and the fitted or given constants; NCCL's ring and tree are the same alpha-beta
terms as NVIDIA describes them: the ring 2(N-1) steps, the tree (a chain inside a node, double
binary trees across) 2 log2 H steps across plus 2(K-1) inside, both at the ring's bandwidth.
"""
import argparse
import csv
import math
import os
import statistics
import sys

import numpy as np

PARAMS = ["alpha", "alpha_i", "inv_B", "inv_Bi", "t_r", "t_c"]
SMALL = 16 << 10
RATIO = {"none": 1.0, "qsgd": 7.88}


def coefficients(H, K, algo, codec, S, s):
    """The model's row: T = sum(coef[p] * param[p])."""
    N = H * K
    rho = RATIO[codec]
    c = dict.fromkeys(PARAMS, 0.0)
    if algo in ("ring_host", "ring_rank", "nccl_ring"):
        flows = K if algo == "ring_rank" else 1
        c["alpha"] = 2 * (N - 1) * s
        c["inv_B"] = flows * 2 * (N - 1) / N * S / rho
        if codec == "none":
            c["t_r"] = (N - 1) / N * S * s
        else:
            c["t_c"] = 2 * (N - 1) / N * S * s
    elif algo == "hier" and S <= SMALL and codec == "none":
        lk, lh = math.log2(K) if K > 1 else 0, math.log2(H) if H > 1 else 0
        c["alpha_i"] = lk * s
        c["inv_Bi"] = lk * S * s
        c["alpha"] = lh * s
        c["inv_B"] = lh * K * S
        c["t_r"] = (lk + lh) * S * s
    elif algo == "hier":
        c["alpha_i"] = 2 * (K - 1) * s
        c["inv_Bi"] = 2 * (K - 1) / K * S * s
        c["alpha"] = 2 * (H - 1) * s
        c["inv_B"] = 2 * (H - 1) / H * S / rho
        c["t_r"] = (K - 1) / K * S * s
        if codec == "none":
            c["t_r"] += (H - 1) / H * S / K * s
        else:
            c["t_c"] = 2 * (H - 1) / H * S / K * s
    elif algo == "nccl_tree":
        c["alpha"] = 2 * math.ceil(math.log2(H)) * s if H > 1 else 0
        c["alpha_i"] = 2 * (K - 1) * s
        c["inv_B"] = 2 * (N - 1) / N * S
        c["t_r"] = (N - 1) / N * S * s
    return np.array([c[p] for p in PARAMS])


def load(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(line for line in f if not line.startswith("#")):
            H, K = int(r["hosts"]), int(r["per_host"])
            rows.append(dict(H=H, K=K, algo=r["algo"], codec=r["codec"], S=int(r["bytes"]),
                             t=float(r["time_us"]) * 1e-6, section=r["section"]))
    return rows


def nnls(A, b, iters=200):
    """Non-negative least squares by an active set: solve, drop the most negative, repeat."""
    free = list(range(A.shape[1]))
    x = np.zeros(A.shape[1])
    for _ in range(iters):
        sol, *_ = np.linalg.lstsq(A[:, free], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[free] = sol
            return x
        free.pop(int(np.argmin(sol)))
    return x


def fit(rows):
    A = np.array([coefficients(r["H"], r["K"], r["algo"], r["codec"], r["S"],
                               max(1.0, r["H"] * r["K"] / 2)) / r["t"] for r in rows])
    scale = np.maximum(np.abs(A).max(axis=0), 1e-30)  # columns of one magnitude
    x = nnls(A / scale, np.ones(len(rows))) / scale
    return dict(zip(PARAMS, x))


def predict(p, H, K, algo, codec, S, s):
    return float(coefficients(H, K, algo, codec, S, s) @ np.array([p[k] for k in PARAMS]))


def size_text(S):
    for unit, b in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if S >= 1 << b:
            return f"{S / (1 << b):g} {unit}"
    return f"{S} B"


def report_fit(p, rows):
    print("fitted (2-core VM, emulated 1 Gbit/s links):")
    print(f"  alpha {p['alpha'] * 1e6:.1f} us per step across, alpha_i {p['alpha_i'] * 1e6:.1f} us"
          f" inside (per process share of a core)")
    for k, name in (("inv_B", "link"), ("inv_Bi", "inside a host")):
        print(f"  {name}: {1 / p[k] / 1e6:.1f} MB/s" if p[k] > 0 else f"  {name}: not bound")
    print(f"  t_r {p['t_r'] * 1e9:.3f} ns/byte, t_c {p['t_c'] * 1e9:.3f} ns per fp32 byte "
          f"({p['t_c'] * 4e9:.2f} ns per value)")
    print("\n| hosts x ranks | algorithm | codec | size | measured | model | error |")
    print("|---|---|---|---|---|---|---|")
    errs = []
    for r in rows:
        s = max(1.0, r["H"] * r["K"] / 2)
        m = predict(p, r["H"], r["K"], r["algo"], r["codec"], r["S"], s)
        e = (m - r["t"]) / r["t"]
        errs.append(abs(e))
        print(f"| {r['H']} x {r['K']} | {r['algo']} | {r['codec']} | {size_text(r['S'])} | "
              f"{r['t'] * 1e3:.3f} ms | {m * 1e3:.3f} ms | {e * 100:+.0f}% |")
    med = statistics.median(errs)
    print(f"\nerrors over {len(rows)} runs: median {med * 100:.1f}%, "
          f"mean {statistics.mean(errs) * 100:.1f}%, max {max(errs) * 100:.0f}%")
    for name, keep in (("below 1 MiB", lambda r: r["S"] < 1 << 20),
                       ("1 MiB and above", lambda r: r["S"] >= 1 << 20)):
        part = [e for e, r in zip(errs, rows) if keep(r)]
        print(f"  {name}: {len(part)} runs, median {statistics.median(part) * 100:.1f}%, "
              f"max {max(part) * 100:.0f}%")
    return med


def table(p, S, shapes, title):
    print(f"\npredicted allreduce of {size_text(S)}, {title} (s = 1: a core per rank), ms:")
    print("| ranks | hosts x per host | ring, rank order | ring, host order | hier | NCCL ring "
          "| NCCL tree | ring, QSGD 4-bit | hier, QSGD 4-bit |")
    print("|---|---|---|---|---|---|---|---|---|")
    cols = (("ring_rank", "none"), ("ring_host", "none"), ("hier", "none"), ("nccl_ring", "none"),
            ("nccl_tree", "none"), ("ring_host", "qsgd"), ("hier", "qsgd"))
    for H, K in shapes:
        cells = ["-" if a == "hier" and (H < 2 or K < 2) else
                 f"{predict(p, H, K, a, c, S, 1.0) * 1e3:.2f}" for a, c in cols]
        print(f"| {H * K} | {H} x {K} | " + " | ".join(cells) + " |")


def crossovers(p, shapes, s_of):
    """The smallest power-of-two size from which the hierarchy beats the host-ordered ring."""
    print("\nwhere the hierarchy overtakes the flat ring in host order (plain):")
    for H, K in shapes:
        if H < 2 or K < 2:
            continue
        s = s_of(H, K)
        won = [S for S in (1 << b for b in range(10, 31))
               if predict(p, H, K, "hier", "none", S, s) < predict(p, H, K, "ring_host", "none", S, s)]
        first = next((S for S in won if all(T in won for T in won if T >= S)), None)
        print(f"  {H} x {K} (s = {s:g}): " + (f"from {size_text(first)}" if first else "never"))


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * mult[text[-1]]) if text[-1] in mult else int(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--runs", default=os.path.join(here, "data", "topology-runs.csv"))
    ap.add_argument("--hosts", type=int)
    ap.add_argument("--per-host", type=int, default=8)
    ap.add_argument("--bytes", default="64M")
    ap.add_argument("--link-gbps", type=float, help="replace the fitted link rate")
    ap.add_argument("--alpha-us", type=float, help="replace the fitted step latency across")
    ap.add_argument("--alpha-i-us", type=float, help="replace the fitted step latency inside")
    ap.add_argument("--intra-gbps", type=float, help="replace the fitted copy rate inside a host")
    ap.add_argument("--codec-gbps", type=float, help="replace the fitted codec rate (fp32 in)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the median error > 15%%")
    a = ap.parse_args()
    rows = load(a.runs)
    p = fit(rows)
    med = report_fit(p, rows)
    given = []
    for opt, key, conv in (("link_gbps", "inv_B", lambda v: 8 / (v * 1e9)),
                           ("alpha_us", "alpha", lambda v: v * 1e-6),
                           ("alpha_i_us", "alpha_i", lambda v: v * 1e-6),
                           ("intra_gbps", "inv_Bi", lambda v: 8 / (v * 1e9)),
                           ("codec_gbps", "t_c", lambda v: 8 / (v * 1e9))):
        v = getattr(a, opt)
        if v is not None:
            p[key] = conv(v)
            given.append(f"{opt.replace('_', '-')} {v:g}")
    S = parse_size(a.bytes)
    shapes = [(a.hosts, a.per_host)] if a.hosts else \
        [(2, 2), (4, 2), (2, 4), (4, 4)] + [(1 << h, k) for k in (1, 8) for h in range(1, 11)
                                            if 8 <= (1 << h) * k <= 1024]
    table(p, S, shapes, "given " + ", ".join(given) if given else "the fitted constants")
    crossovers(p, shapes[:4] if not a.hosts else shapes,
               (lambda H, K: 1.0) if given else (lambda H, K: max(1.0, H * K / 2)))
    if a.check and med > 0.15:
        print(f"cost-model: median error {med * 100:.1f}% > 15%")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
