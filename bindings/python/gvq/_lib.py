"""Finding and loading libgvq, the C prototypes, and errors as exceptions.

Why ctypes (and not CFFI or a C extension): the package has no compiler step, so it installs from
Debian's own packages alone (python3-numpy, python3-mpi4py, python3-torch) with nothing to build
and nothing to fetch, and it loads whichever libgvq.so the user built or installed. ctypes releases
the GIL for the duration of every call through a CDLL, so a collective blocked in MPI never stops
other Python threads (the DDP hook's worker thread relies on this). The cost, keeping the struct
mirrors and prototypes in sync with include/, is paid back by _structs.check_abi and
_protocheck.py, which check them against the headers at import.

The library is looked for, in order:
  1. the GVQ_LIBRARY environment variable (a path to libgvq.so, or a folder holding it);
  2. the path recorded when the package was installed (`pip install bindings/python`, _config.py);
  3. pkg-config's gvq module (its libdir);
  4. the build tree: $GVQ_BUILD_DIR, then <repository>/build when the package runs from a checkout;
  5. the dynamic loader's own search (ctypes.util.find_library).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
from typing import List, Optional, Tuple

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.normpath(os.path.join(_HERE, "..", "..", ".."))


class LibraryNotFound(ImportError):
    """No libgvq.so could be found; the message lists every place that was tried."""


def _lib_in(folder: str) -> Optional[str]:
    for name in ("libgvq.so", "libgvq.so.0"):
        p = os.path.join(folder, name)
        if os.path.isfile(p):
            return p
    return None


def _pkg_config_libdir() -> Optional[str]:
    try:
        r = subprocess.run(["pkg-config", "--variable=libdir", "gvq"], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    d = r.stdout.strip()
    return d if r.returncode == 0 and d else None


def _recorded_path() -> Optional[str]:
    try:
        from . import _config  # written by setup.py at install time
    except ImportError:
        return None
    return getattr(_config, "LIBRARY", None)


def candidates() -> List[Tuple[str, Optional[str]]]:
    """(where, path or None) for each place the loader looks, in order."""
    out: List[Tuple[str, Optional[str]]] = []
    env = os.environ.get("GVQ_LIBRARY")
    if env:
        out.append(("GVQ_LIBRARY=" + env, _lib_in(env) if os.path.isdir(env) else env))
    rec = _recorded_path()
    if rec:
        out.append(("recorded at install", rec))
    out.append(("package folder", _lib_in(os.path.join(_HERE, "_lib"))))
    d = _pkg_config_libdir()
    out.append(("pkg-config gvq" + (" (libdir " + d + ")" if d else ": not found"),
                _lib_in(d) if d else None))
    bd = os.environ.get("GVQ_BUILD_DIR")
    if bd:
        out.append(("GVQ_BUILD_DIR=" + bd, _lib_in(bd)))
    if os.path.isfile(os.path.join(_REPO, "include", "gvq.h")):
        out.append(("build tree " + os.path.join(_REPO, "build"),
                    _lib_in(os.path.join(_REPO, "build"))))
    found = ctypes.util.find_library("gvq")
    out.append(("dynamic loader" + ("" if found else ": not found"), found))
    return out


def _load() -> Tuple[ctypes.CDLL, str, str]:
    tried = []
    for where, path in candidates():
        if not path:
            tried.append(where)
            continue
        try:
            # RTLD_GLOBAL: Open MPI's plugins resolve MPI symbols from the global namespace
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append("%s: %s (%s)" % (where, path, e))
            continue
        return lib, path, where
    raise LibraryNotFound(
        "gvq: libgvq.so not found. Tried:\n  " + "\n  ".join(tried) +
        "\nBuild it (cmake -S . -B build && cmake --build build) or install it, or set "
        "GVQ_LIBRARY to its path.")


lib, library_path, found_by = _load()

# ---- prototypes ------------------------------------------------------------------------------
c_int, c_void_p, c_size_t, c_char_p, c_uint = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                                               ctypes.c_char_p, ctypes.c_uint)
P = ctypes.POINTER


# the functions given a prototype, in order (_protocheck.py checks them against the headers)
DECLARED: List[str] = []


def _proto(name: str, *args) -> None:
    DECLARED.append(name)
    f = getattr(lib, name)
    f.restype = c_int
    f.argtypes = list(args)


def declare(structs) -> None:
    """Sets restype/argtypes of every function used (structs: the module with the mirrors)."""
    s = structs
    lib.gvqGetErrorString.restype = c_char_p
    lib.gvqGetErrorString.argtypes = [c_int]
    lib.gvqGetLastError.restype = c_char_p
    lib.gvqGetLastError.argtypes = [c_void_p]
    DECLARED.extend(["gvqGetErrorString", "gvqGetLastError"])
    _proto("gvqGetVersion", P(c_int))
    _proto("gvqGetUniqueId", P(s.UniqueId))
    _proto("gvqCommInitRank", P(c_void_p), c_int, s.UniqueId, c_int)
    _proto("gvqCommInitRankConfig", P(c_void_p), c_int, s.UniqueId, c_int, P(s.Config))
    _proto("gvqCommInitFromEnv", P(c_void_p), P(s.Config))
    _proto("gvqCommInitMPI", P(c_void_p), c_void_p, P(s.Config))
    _proto("gvqCommDestroy", c_void_p)
    _proto("gvqCommAbort", c_void_p)
    _proto("gvqCommSplit", c_void_p, c_int, c_int, P(c_void_p), P(s.Config))
    _proto("gvqCommShrink", c_void_p, P(c_int), c_int, P(c_void_p), P(s.Config), c_int)
    _proto("gvqCommGrow", c_void_p, c_int, P(s.UniqueId), c_int, P(c_void_p), P(s.Config))
    _proto("gvqCommCount", c_void_p, P(c_int))
    _proto("gvqCommUserRank", c_void_p, P(c_int))
    _proto("gvqCommGetAsyncError", c_void_p, P(c_int))
    _proto("gvqAllReduce", c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p)
    _proto("gvqBroadcast", c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p)
    _proto("gvqReduce", c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, c_void_p, c_void_p)
    _proto("gvqReduceScatter", c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p)
    _proto("gvqAllGather", c_void_p, c_void_p, c_size_t, c_int, c_void_p, c_void_p)
    _proto("gvqSend", c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p)
    _proto("gvqRecv", c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p)
    _proto("gvqGroupStart")
    _proto("gvqGroupEnd")
    _proto("gvqCompressorCreate", c_void_p, c_size_t, P(s.CompressorConfig), P(c_void_p))
    _proto("gvqCompressorDestroy", c_void_p)
    _proto("gvqCompressorGetStats", c_void_p, P(s.CompressorStats))
    _proto("gvqAllReduceCompressed", c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p,
           c_void_p, c_void_p)
    _proto("gvqCompressorSave", c_void_p, c_void_p, P(c_size_t))
    _proto("gvqCompressorLoad", c_void_p, c_void_p, c_size_t)
    _proto("gvqCompressorLoadShared", c_void_p, c_void_p, c_size_t)
    _proto("gvqCompressorSaveFile", c_void_p, c_char_p)
    _proto("gvqCompressorLoadFile", c_void_p, c_char_p)
    _proto("gvqCommSetLayoutString", c_void_p, c_char_p)
    _proto("gvqCommGetCompressionStats", c_void_p, c_int, P(s.CompressorStats))
    _proto("gvqSparseAllGatherv", c_void_p, c_void_p, c_size_t, c_size_t, c_size_t, c_int, c_uint,
           P(s.SparseRows), c_void_p, c_void_p)
    _proto("gvqSparseRowsFree", P(s.SparseRows))
    _proto("gvqTrainCreate", c_void_p, P(s.TrainConfig), P(c_void_p))
    _proto("gvqTrainAddVariable", c_void_p, P(s.TrainVariable), P(c_int))
    _proto("gvqTrainCommit", c_void_p)
    _proto("gvqTrainGradReady", c_void_p, c_int, c_void_p)
    _proto("gvqTrainFactorsReady", c_void_p, c_int, c_void_p, c_void_p, c_int, c_void_p)
    _proto("gvqTrainSparseLookup", c_void_p, c_int, c_void_p, c_size_t, c_void_p)
    _proto("gvqTrainSparseReady", c_void_p, c_int, c_void_p, c_void_p, c_size_t)
    _proto("gvqTrainWaitAll", c_void_p)
    _proto("gvqTrainWaitVariable", c_void_p, c_int)
    _proto("gvqTrainGetVariableInfo", c_void_p, c_int, P(s.TrainVariableInfo))
    _proto("gvqTrainGetVariableCount", c_void_p, P(c_int))
    _proto("gvqTrainSave", c_void_p, c_void_p, P(c_size_t))
    _proto("gvqTrainLoad", c_void_p, c_void_p, c_size_t)
    _proto("gvqTrainDestroy", c_void_p)
    _proto("gvqPsCreate", c_void_p, c_size_t, c_size_t, c_int, P(s.PsConfig), P(c_void_p))
    _proto("gvqPsDestroy", c_void_p)
    _proto("gvqPsPush", c_void_p, c_void_p, c_void_p, c_size_t)
    _proto("gvqPsApply", c_void_p)
    _proto("gvqPsPull", c_void_p, c_void_p, c_void_p, c_size_t)
    _proto("gvqPsGetStats", c_void_p, P(s.PsStats))
    _proto("gvqPsSave", c_void_p, c_void_p, P(c_size_t))
    _proto("gvqPsLoad", c_void_p, c_void_p, c_size_t)
    _proto("gvqPsSaveFile", c_void_p, c_char_p)
    _proto("gvqPsLoadFile", c_void_p, c_char_p)
    _proto("gvqPsCommit", c_void_p)
    _proto("gvqPsRecover", c_void_p, c_void_p, c_size_t, c_size_t, c_int, P(s.PsConfig),
           P(c_void_p))


# ---- errors ----------------------------------------------------------------------------------


class GvqError(RuntimeError):
    """A gvq call returned an error. `result` is the gvqResult_t code, `name` its C name,
    `detail` the text of gvqGetLastError (the WARN line naming what was wrong)."""

    result: int = -1

    def __init__(self, func: str, result: int, detail: str) -> None:
        self.func, self.result, self.detail = func, result, detail
        self.name = _RESULT_NAMES.get(result, "gvqResult(%d)" % result)
        text = lib.gvqGetErrorString(result).decode(errors="replace")
        super().__init__("%s: %s (%s)%s" % (func, text, self.name,
                                            ": " + detail if detail else ""))


class InvalidArgument(GvqError):
    """gvqInvalidArgument."""


class InvalidUsage(GvqError):
    """gvqInvalidUsage (aborted or broken communicator, call inside a group, ...)."""


class RemoteError(GvqError):
    """gvqRemoteError: a peer failed or refused its input."""


class Timeout(GvqError):
    """gvqTimeout: a peer did not answer within the timeout."""


class SystemError_(GvqError):
    """gvqSystemError (I/O, no memory, no socket)."""


_RESULT_NAMES = {0: "gvqSuccess", 1: "gvqUnhandledCudaError", 2: "gvqSystemError",
                 3: "gvqInternalError", 4: "gvqInvalidArgument", 5: "gvqInvalidUsage",
                 6: "gvqRemoteError", 7: "gvqInProgress", 8: "gvqTimeout"}
_CLASSES = {2: SystemError_, 4: InvalidArgument, 5: InvalidUsage, 6: RemoteError, 8: Timeout}


def check(func: str, result: int) -> None:
    """Raises the GvqError subclass for `result` unless it is gvqSuccess. Call it right after the
    C call, on the same thread: gvqGetLastError is per thread."""
    if result != 0:
        raw = lib.gvqGetLastError(None)
        detail = raw.decode(errors="replace").strip() if raw else ""
        raise _CLASSES.get(result, GvqError)(func, result, detail)


def call(name: str, *args) -> None:
    """Runs lib.<name>(*args) (the GIL is released meanwhile) and raises on an error."""
    check(name, getattr(lib, name)(*args))
