"""`python3 -m gvq.info`: the loaded libgvq's version, build options and where it came from."""

from __future__ import annotations

import os
import sys
from typing import Dict


def build_options() -> Dict[str, str]:
    """CUDA / NCCL: read from the build tree's CMakeCache.txt when the library lives in one, else
    from the shared libraries the loaded libgvq pulled into this process (its NEEDED entries)."""
    from . import _lib
    libdir = os.path.dirname(os.path.realpath(_lib.library_path))
    cache = os.path.join(libdir, "CMakeCache.txt")
    opts: Dict[str, str] = {}
    if os.path.isfile(cache):
        with open(cache, errors="replace") as f:
            for line in f:
                for key in ("GVQ_WITH_CUDA", "GVQ_WITH_NCCL", "CMAKE_BUILD_TYPE", "GVQ_SANITIZE"):
                    if line.startswith(key + ":"):
                        opts[key.replace("GVQ_WITH_", "")] = line.split("=", 1)[1].strip() or "-"
        if opts.get("CUDA", "OFF").upper() in ("OFF", "0", "FALSE", "NO"):
            opts["NCCL"] = "OFF"  # the option is only honoured with CUDA
        opts["source"] = "CMakeCache.txt"
        return opts
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        maps = ""
    opts["CUDA"] = "ON" if "libcudart" in maps else "OFF"
    opts["NCCL"] = "ON" if "libnccl" in maps else "OFF"
    opts["source"] = "libraries loaded with libgvq"
    return opts


def main() -> int:
    import gvq
    v = gvq.version()
    print("gvq Python package %s (%s)" % (gvq.__version__, os.path.dirname(gvq.__file__)))
    print("libgvq %d.%d.%d" % (v // 10000, v // 100 % 100, v % 100))
    print("loaded from %s (found by: %s)" % (os.path.realpath(gvq.library_path),
                                            gvq._lib.found_by))
    o = build_options()
    src = o.pop("source")
    print("build options: " + ", ".join("%s=%s" % kv for kv in o.items()) + " (from %s)" % src)
    print("ABI: " + gvq.abi_check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
