#!/usr/bin/env python3
"""check-calls.py -- no two source files call each other, and the library's calls go down.

Reads the symbols of the object files under a build directory with `nm` and draws the file
graph: A -> B when A uses a function or variable that B defines. Fails (exit 1) on
- a cycle: files that call each other, directly or around a loop (a strongly connected
  component of more than one file); each program's objects are checked on their own;
- a call in libgvq from a layer to one that is not below it (LAYERS: util; transport and
  device; the CUDA device; algorithms and the NCCL transport; comm; compress and sparse; train.
  Siblings do not call each other). The calls that go up through function pointers are listed
  in docs/ARCHITECTURE.md ("Calls that go up"); nm does not see them.

usage: check-calls.py BUILD_DIR [--print]   (--print also lists every edge)
"""
import os
import subprocess
import sys
from collections import defaultdict


def object_files(build):
    """{target directory: [object files]} for every *.dir under build, CMake's own checks left out."""
    targets = defaultdict(list)
    for root, _dirs, files in os.walk(build):
        if "CMakeFiles/3." in root or "CompilerId" in root or "CheckCUDA" in root:
            continue
        for f in files:
            if f.endswith(".o"):
                d = root
                while d and not d.endswith(".dir"):
                    d = os.path.dirname(d)
                targets[d or root].append(os.path.join(root, f))
    return targets


def symbols(objs):
    """{object: (defined, used)} from one nm run over all of objs (a run per object costs ~80 ms)."""
    out = {o: (set(), set()) for o in objs}
    for i in range(0, len(objs), 200):
        part = objs[i:i + 200]
        text = subprocess.run(["nm", "-P", "-A"] + part, capture_output=True, text=True,
                              check=True).stdout
        for line in text.splitlines():
            obj, sep, rest = line.partition(": ")
            parts = rest.split()
            if not sep or obj not in out or len(parts) < 2:
                continue
            name, kind = parts[0], parts[1]
            defined, used = out[obj]
            if kind == "U":
                used.add(name)
            elif kind in "TDBRVWC":  # global definitions (local t/d/b/r cannot be called)
                defined.add(name)
    return out


def source_name(obj, build):
    rel = os.path.relpath(obj, build)
    parts = rel.split(os.sep)
    for i, p in enumerate(parts):
        if p.endswith(".dir"):  # <subdir>/CMakeFiles/<target>.dir/<source>.o
            return "/".join(parts[:max(i - 1, 0)] + parts[i + 1:])[:-2]
    return rel[:-2]


# folder prefix -> rank; a call must go to the same folder or to a lower rank
# (the first matching prefix counts: the sub-folders that are layers of their own come first)
LAYERS = [("src/util/", 0),
          ("src/transport/nccl/", 3), ("src/transport/", 1),
          ("src/device/cuda/", 2), ("src/device/", 1),
          ("src/algorithms/", 3),
          ("src/comm/", 4),
          ("src/compress/", 5), ("src/sparse/", 5),
          ("src/train/", 6)]


LIB_LAYERS = ("util", "transport", "device", "cuda", "nccl", "algorithms", "comm", "compress",
              "sparse", "train")


def layer_of(path):
    for prefix, rank in LAYERS:
        if path.startswith(prefix):
            return prefix, rank
    return None, None


def strongly_connected(nodes, edges):
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(comp)

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return comps


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build, show = sys.argv[1], "--print" in sys.argv
    # the library's objects form one graph (they link into libgvq); each program adds its own
    lib, programs = {}, {}
    for tdir, objs in object_files(build).items():
        base = os.path.basename(tdir)
        group = "libgvq" if base.startswith("gvq_") and base[4:-4] in LIB_LAYERS else tdir
        for o in objs:
            (lib if group == "libgvq" else programs.setdefault(group, {}))[o] = None
    groups = {"libgvq": list(lib)}
    groups.update({g: list(v) for g, v in programs.items()})
    failed = 0
    syms = symbols(sorted({o for objs in groups.values() for o in objs}))
    for gname, objs in sorted(groups.items()):
        defs, uses, names = {}, {}, {}
        for o in objs:
            names[o] = source_name(o, build)
            defs[o], uses[o] = syms[o]
        owner = {}
        for o, ds in defs.items():
            for s in ds:
                owner[s] = o
        edges = defaultdict(set)
        for o, us in uses.items():
            for s in us:
                if s in owner and owner[s] != o:
                    edges[names[o]].add(names[owner[s]])
        if show:
            for a in sorted(edges):
                print(f"{gname}: {a} -> {', '.join(sorted(edges[a]))}")
        if gname == "libgvq":
            for a in sorted(edges):
                fa, ra = layer_of(a)
                for b in sorted(edges[a]):
                    fb, rb = layer_of(b)
                    if fa is None or fb is None:
                        failed = 1
                        print(f"check-calls: {a} or {b} is in no layer (LAYERS in {sys.argv[0]})")
                    elif fa != fb and rb >= ra:
                        failed = 1
                        print(f"check-calls: layer violation: {a} ({fa}) calls {b} ({fb})")
        for comp in strongly_connected(set(names.values()), edges):
            if len(comp) > 1:
                failed = 1
                print(f"check-calls: {gname}: files that call each other: {' <-> '.join(sorted(comp))}")
    if not failed:
        print(f"check-calls: layers kept, no two source files call each other ({sum(len(v) for v in groups.values())} objects)")
    return failed


if __name__ == "__main__":
    sys.exit(main())
