#!/usr/bin/env python3
"""check-sizes.py -- no C function longer than 150 lines anywhere in the repository (library,
apps, perf, tests, examples), no Python function longer than 150 lines, and no library source
file (src/) longer than 600 lines. Exit 1 naming each offender.

A C function counts from the line of its signature to its closing brace at column 0 (the
project's clang-format style puts both there); a Python function from its `def` to its last
indented line.

usage: check-sizes.py [ROOT]   (default: the repository this script is in)
"""
import os
import re
import subprocess
import sys

MAX_FUNCTION = 150
MAX_LIBRARY_FILE = 600


def tracked(root, *patterns):
    out = subprocess.run(["git", "-C", root, "ls-files", *patterns], capture_output=True,
                         text=True, check=True).stdout
    return [f for f in out.split("\n") if f]


def c_functions(lines):
    """(name line, first line number, length) of every function body at column 0."""
    start, inbody = None, False
    for i, line in enumerate(lines):
        if not inbody:
            if (start is None and re.match(r"^[A-Za-z_][\w\s\*]*\b\w+\s*\(", line)
                    and not re.match(r"^(typedef|struct|enum|return|if|for|while)\b", line)
                    and not line.rstrip().endswith(";")):
                start = i
            if start is not None:
                if line.rstrip().endswith(";") and i != start:
                    start = None
                elif line.rstrip().endswith("{"):
                    inbody = True
                elif i - start > 8:
                    start = None
        elif line.startswith("}"):
            yield lines[start].strip(), start + 1, i - start + 1
            start, inbody = None, False


def py_functions(lines):
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)def \w+", line)
        if not m:
            continue
        indent, last = len(m.group(1)), i
        for j in range(i + 1, len(lines)):
            s = lines[j]
            if s.strip() == "":
                continue
            if len(s) - len(s.lstrip()) <= indent:
                break
            last = j
        yield line.strip(), i + 1, last - i + 1


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad = []
    for f in tracked(root, "*.c", "*.cu", "*.h", "*.py"):
        with open(os.path.join(root, f), errors="replace") as fh:
            lines = fh.read().split("\n")
        funcs = py_functions(lines) if f.endswith(".py") else c_functions(lines)
        for name, at, n in funcs:
            if n > MAX_FUNCTION:
                bad.append("%s:%d: a function of %d lines (at most %d): %s" %
                           (f, at, n, MAX_FUNCTION, name[:60]))
        if f.startswith("src/") and len(lines) - 1 > MAX_LIBRARY_FILE:
            bad.append("%s: %d lines (a library file holds at most %d)" %
                       (f, len(lines) - 1, MAX_LIBRARY_FILE))
    for b in bad:
        print("check-sizes: " + b)
    if not bad:
        print("check-sizes: every function within %d lines, every library file within %d" %
              (MAX_FUNCTION, MAX_LIBRARY_FILE))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
