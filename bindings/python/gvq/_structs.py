"""ctypes mirrors of the versioned structs of include/gvq.h, and their check against the header.

Each mirror lists the C fields in order with the C types. At import, check_abi() finds gvq.h
(next to the loaded library, in the source tree of a build tree, through pkg-config, or
$GVQ_INCLUDE_DIR), parses each struct's fields from it, builds the layout the C compiler gives
them, and refuses to import (ImportError) when a mirror's size, field names or offsets differ:
a header that grew a field is caught here instead of corrupting memory in a call.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import warnings
from typing import Any, Dict, List, Optional, Tuple

from . import _lib

C = ctypes
UNDEF_INT = -(2**31)  # GVQ_CONFIG_UNDEF_INT

CONFIG_MAGIC = 0x67767163
COMPRESSOR_CONFIG_MAGIC = 0x67767178
SPARSE_ROWS_MAGIC = 0x67767173
PS_CONFIG_MAGIC = 0x67767170
TRAIN_CONFIG_MAGIC = 0x67767154
VARIABLE_MAGIC = 0x67767156


class UniqueId(C.Structure):
    _fields_ = [("internal", C.c_char * 128)]


class Config(C.Structure):
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint),
                ("blocking", C.c_int), ("timeoutMs", C.c_int), ("chunkBytes", C.c_int)]


class CompressorConfig(C.Structure):
    """Mirror of gvqCompressorConfig_t (see include/gvq.h for each field's meaning)."""
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint),
                ("codec", C.c_int), ("filters", C.c_int), ("depth", C.c_int),
                ("height", C.c_int), ("width", C.c_int), ("sliceSize", C.c_int),
                ("reuse", C.c_int), ("lossThreshold", C.c_float), ("warmupIters", C.c_int),
                ("sampleIters", C.c_int), ("compressedIters", C.c_int),
                ("sampleCodec", C.c_int), ("qsgdBits", C.c_int), ("qsgdBucket", C.c_int),
                ("qsgdMaxNorm", C.c_int), ("wireType", C.c_int), ("errorFeedback", C.c_int),
                ("maxDims", C.c_int), ("seed", C.c_int), ("voteThreshold", C.c_float),
                ("sampleSlices", C.c_int), ("integerBits", C.c_int), ("powerRank", C.c_int),
                ("efBound", C.c_float), ("basisUpdate", C.c_int)]


class CompressorStats(C.Structure):
    """Mirror of gvqCompressorStats_t."""
    _fields_ = [("codec", C.c_int), ("phase", C.c_int), ("iteration", C.c_longlong),
                ("phaseIter", C.c_longlong), ("dims", C.c_int), ("sliceSize", C.c_int),
                ("groups", C.c_int), ("ratio", C.c_double), ("lastLoss", C.c_double),
                ("keptEnergy", C.c_double), ("fits", C.c_longlong),
                ("fitsRefused", C.c_longlong), ("earlyExits", C.c_longlong),
                ("fitSeconds", C.c_double), ("wireBytes", C.c_ulonglong),
                ("rawBytes", C.c_ulonglong), ("reason", C.c_char * 160),
                ("nonFiniteCalls", C.c_longlong)]


class SparseRows(C.Structure):
    """Mirror of gvqSparseRows_t."""
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint),
                ("nrows", C.c_size_t), ("indices", C.POINTER(C.c_int64)),
                ("values", C.c_void_p), ("rawRows", C.c_size_t),
                ("rawIndices", C.POINTER(C.c_int64)), ("rawValues", C.c_void_p),
                ("nranks", C.c_int), ("rankRows", C.POINTER(C.c_size_t)),
                ("bytesSent", C.c_ulonglong), ("bytesReceived", C.c_ulonglong),
                ("algorithm", C.c_int), ("internal", C.c_void_p)]


class PsConfig(C.Structure):
    """Mirror of gvqPsConfig_t."""
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint),
                ("partitions", C.c_int), ("partitioning", C.c_int), ("rule", C.c_int),
                ("learningRate", C.c_double), ("momentum", C.c_double),
                ("adagradInit", C.c_double), ("epsilon", C.c_double), ("average", C.c_int),
                ("localAggregation", C.c_int), ("init", C.c_int), ("initScale", C.c_double),
                ("seed", C.c_ulonglong), ("initValues", C.c_void_p), ("stream", C.c_void_p),
                ("serve", C.c_int), ("staleness", C.c_int)]


class PsStats(C.Structure):
    """Mirror of gvqPsStats_t."""
    _fields_ = [("partitions", C.c_int), ("shards", C.c_int), ("localRows", C.c_size_t),
                ("hosts", C.c_int), ("pushes", C.c_longlong), ("pulls", C.c_longlong),
                ("applies", C.c_longlong), ("bytesSent", C.c_ulonglong),
                ("bytesReceived", C.c_ulonglong), ("pendingRows", C.c_ulonglong)]


class TrainConfig(C.Structure):
    """Mirror of gvqTrainConfig_t (include/gvq_train.h)."""
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint),
                ("bucketBytes", C.c_int), ("waitFree", C.c_int), ("op", C.c_int),
                ("convCompressor", C.c_void_p), ("fcCompressor", C.c_void_p), ("sfb", C.c_int),
                ("sparseRoute", C.c_int), ("tunePartitions", C.c_int), ("schedule", C.c_int),
                ("chunkBytes", C.c_int)]


class TrainVariable(C.Structure):
    """Mirror of gvqVariable_t."""
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint),
                ("name", C.c_char_p), ("kind", C.c_int), ("shape", C.c_int * 4),
                ("compressor", C.c_void_p), ("factors", C.c_int), ("sparse", C.c_void_p)]


class TrainVariableInfo(C.Structure):
    """Mirror of gvqTrainVariableInfo_t."""
    _fields_ = [("name", C.c_char * 64), ("kind", C.c_int), ("count", C.c_size_t),
                ("route", C.c_int), ("bucket", C.c_int), ("codec", C.c_int),
                ("why", C.c_char * 96), ("readyTime", C.c_double), ("startTime", C.c_double),
                ("endTime", C.c_double), ("wireBytes", C.c_ulonglong), ("steps", C.c_longlong)]


MIRRORS = {"gvqConfig_t": Config, "gvqCompressorConfig_t": CompressorConfig,
           "gvqCompressorStats_t": CompressorStats, "gvqSparseRows_t": SparseRows,
           "gvqPsConfig_t": PsConfig, "gvqPsStats_t": PsStats}
TRAIN_MIRRORS = {"gvqTrainConfig_t": TrainConfig, "gvqVariable_t": TrainVariable,
                 "gvqTrainVariableInfo_t": TrainVariableInfo}

def stats_dict(st: CompressorStats) -> Dict[str, Any]:
    """A gvqCompressorStats_t as a dict (its reason decoded)."""
    d = {name: getattr(st, name) for name, _ in st._fields_}
    d["reason"] = st.reason.decode(errors="replace")
    return d


# ---- the check against the header --------------------------------------------------------------

_CTYPES = {"size_t": C.c_size_t, "unsigned int": C.c_uint, "unsigned": C.c_uint, "int": C.c_int,
           "float": C.c_float, "double": C.c_double, "long long": C.c_longlong,
           "unsigned long long": C.c_ulonglong, "int64_t": C.c_int64, "char": C.c_char,
           "uint64_t": C.c_uint64, "uint32_t": C.c_uint32, "int32_t": C.c_int32,
           "void": C.c_void_p, "gvqStream_t": C.c_void_p,
           "gvqCompressorConfig_t": C.c_void_p, "gvqPsConfig_t": C.c_void_p}  # pointed to


def find_header() -> Optional[str]:
    """The gvq.h that belongs to the loaded library, or None."""
    dirs: List[str] = []
    if os.environ.get("GVQ_INCLUDE_DIR"):
        dirs.append(os.environ["GVQ_INCLUDE_DIR"])
    libdir = os.path.dirname(os.path.realpath(_lib.library_path))
    cache = os.path.join(libdir, "CMakeCache.txt")  # a build tree: its source's include/
    if os.path.isfile(cache):
        with open(cache, errors="replace") as f:
            for line in f:
                if line.startswith("gvq_SOURCE_DIR:STATIC="):
                    dirs.append(os.path.join(line.split("=", 1)[1].strip(), "include"))
    dirs += [os.path.join(libdir, "..", "include"), os.path.join(libdir, "..", "..", "include")]
    try:
        r = subprocess.run(["pkg-config", "--variable=includedir", "gvq"], capture_output=True,
                           text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            dirs.append(r.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    for d in dirs:
        p = os.path.join(d, "gvq.h")
        if os.path.isfile(p):
            return os.path.normpath(p)
    return None


def _header_fields(text: str, name: str, defines: Dict[str, int]) -> List[Tuple[str, type]]:
    m = re.search(r"typedef\s+struct\s*\{([^{}]*)\}\s*" + re.escape(name) + r"\s*;", text)
    if not m:
        raise ImportError("gvq: struct %s not found in the header" % name)
    out = []
    for decl in m.group(1).split(";"):
        decl = " ".join(decl.replace("const ", "").split())
        if not decl:
            continue
        base = next((t for t in sorted(_CTYPES, key=len, reverse=True)
                     if re.match(re.escape(t) + r"\b", decl)), None)
        if base is None:
            raise ImportError("gvq: unknown type in the field '%s' of %s" % (decl, name))
        rest = decl[len(base):].strip()
        star, names = ("*", rest[1:]) if rest.startswith("*") else ("", rest)
        for item in names.split(","):
            item = item.strip()
            ptr = star or item.startswith("*")
            item = item.lstrip("*").strip()
            am = re.match(r"^(\w+)\s*(?:\[(\w+)\])?$", item)
            if not am:
                raise ImportError("gvq: cannot read the field '%s' of %s" % (item, name))
            t = C.c_void_p if ptr else _CTYPES[base]
            if am.group(2):
                n = am.group(2)
                t = t * (int(n) if n.isdigit() else defines[n])
            out.append((am.group(1), t))
    return out


def _layout(cls) -> List[Tuple[str, int, int]]:
    return [(f[0], getattr(cls, f[0]).offset, getattr(cls, f[0]).size) for f in cls._fields_]


def check_abi(header: Optional[str] = None) -> str:
    """Compares every mirror with the header's struct; raises ImportError on a difference.
    Returns a one-line verdict ("... checked against <path>" or why it was skipped)."""
    header = header or find_header()
    if header is None:
        msg = ("struct layouts not checked: gvq.h not found next to %s (set GVQ_INCLUDE_DIR)" %
               _lib.library_path)
        warnings.warn("gvq: " + msg)
        return msg
    train = os.path.join(os.path.dirname(header), "gvq_train.h")
    checked = 0
    for path, mirrors in ((header, MIRRORS), (train, TRAIN_MIRRORS)):
        with open(path, errors="replace") as f:
            text = re.sub(r"/\*.*?\*/", " ", f.read(), flags=re.S)
        defines = {k: int(v) for k, v in re.findall(r"#define\s+(\w+)\s+(\d+)\b", text)}
        for cname, mirror in mirrors.items():
            hdr = type("_hdr", (C.Structure,),
                       {"_fields_": _header_fields(text, cname, defines)})
            if C.sizeof(hdr) != C.sizeof(mirror) or _layout(hdr) != _layout(mirror):
                raise ImportError(
                    "gvq: the Python mirror of %s (%d bytes) does not match %s (%d bytes): "
                    "update bindings/python/gvq/_structs.py\n  header: %s\n  mirror: %s" %
                    (cname, C.sizeof(mirror), path, C.sizeof(hdr), _layout(hdr),
                     _layout(mirror)))
            checked += 1
    return "%d struct layouts match %s and gvq_train.h" % (checked, header)
