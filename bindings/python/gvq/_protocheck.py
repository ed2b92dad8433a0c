"""The ctypes prototypes of _lib.declare checked against the public headers.

Every function _lib.declare gives a prototype must be declared (GVQ_API) in include/gvq.h,
gvq_mpi.h or gvq_train.h with the same number of parameters, each of the same kind: a pointer or
handle (c_void_p, c_char_p or a POINTER), int or enum (c_int), size_t, unsigned, or a struct
passed by value (its mirror in _structs); the result gvqResult_t (c_int) or a string (c_char_p).
A prototype that drifted from the header would pass a truncated or misplaced argument silently;
this refuses it at import (and tests/test_prototypes.py checks that it does).
"""

from __future__ import annotations

import ctypes as C
import os
import re
from typing import Dict, List, Optional, Tuple

HEADERS = ("gvq.h", "gvq_mpi.h", "gvq_train.h")

_INTS = {"int": "int", "size_t": "size_t", "unsigned": "uint", "unsigned int": "uint",
         "int64_t": "int64", "uint64_t": "uint64", "uint32_t": "uint32", "int32_t": "int32",
         "float": "float", "double": "double"}


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", " ", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def header_functions(include_dir: str) -> Dict[str, Tuple[str, List[str]]]:
    """{name: (result kind, [parameter kinds])} of every GVQ_API function in the headers."""
    texts = []
    for h in HEADERS:
        p = os.path.join(include_dir, h)
        if os.path.isfile(p):
            with open(p, errors="replace") as f:
                texts.append(_strip_comments(f.read()))
    text = "\n".join(texts)
    enums = set(re.findall(r"typedef\s+enum\s*\{[^}]*\}\s*(\w+)\s*;", text))
    handles = set(re.findall(r"typedef\s+struct\s+\w+\s*\*\s*(\w+)\s*;", text))
    handles |= set(re.findall(r"typedef\s+void\s*\*\s*(\w+)\s*;", text))
    handles |= set(re.findall(r"typedef\s+[\w\s\*]+\(\s*\*\s*(\w+)\s*\)", text))  # callbacks
    handles.add("MPI_Comm")  # Open MPI's and MPICH's are pointer-sized; passed as c_void_p
    structs = set(re.findall(r"typedef\s+struct\s*\{[^{}]*\}\s*(\w+)\s*;", text))

    def kind(decl: str) -> str:
        decl = " ".join(decl.replace("const", " ").split())
        if "*" in decl or "[" in decl:
            return "str" if re.match(r"char\b", decl) and decl.count("*") == 1 else "ptr"
        words = decl.split()
        for n in (2, 1):  # "unsigned int x", "int x", or a type without a name
            base = " ".join(words[:n])
            if base in _INTS and (len(words) == n or len(words) == n + 1):
                return _INTS[base]
        base = words[0]
        if base in enums or base == "gvqResult_t":
            return "int"
        if base in handles:
            return "ptr"
        if base in structs:
            return "struct:" + base
        raise ValueError("cannot read the parameter '%s'" % decl)

    out: Dict[str, Tuple[str, List[str]]] = {}
    for ret, name, params in re.findall(r"GVQ_API\s+([\w\s\*]+?)\s*\b(gvq\w+)\s*\(([^)]*)\)\s*;",
                                        text):
        plist = [p.strip() for p in params.split(",")]
        if plist == ["void"] or plist == [""]:
            plist = []
        out[name] = (kind(ret + " r"), [kind(p) for p in plist])
    return out


_SCALARS = {"int": C.c_int, "size_t": C.c_size_t, "uint": C.c_uint, "int64": C.c_int64,
            "uint64": C.c_uint64, "uint32": C.c_uint32, "int32": C.c_int32, "float": C.c_float,
            "double": C.c_double}


def _matches(header_kind: str, t, mirrors: Dict[str, type]) -> bool:
    """Whether the ctypes type t passes a C value of header_kind (ctypes' aliases, such as c_int
    and c_int32, are one type)."""
    pointer = t is C.c_void_p or t is C.c_char_p or (isinstance(t, type) and
                                                      issubclass(t, C._Pointer))
    if header_kind == "str":
        return pointer and not (isinstance(t, type) and issubclass(t, C._Pointer))
    if header_kind == "ptr":
        return pointer and t is not C.c_char_p
    if header_kind.startswith("struct:"):
        return t is mirrors.get(header_kind[7:])
    return t is _SCALARS.get(header_kind)


def _name(t) -> str:
    return "void" if t is None else getattr(t, "__name__", repr(t))


def check(lib, declared: List[str], include_dir: str, mirrors: Dict[str, type]) -> List[str]:
    """The differences between the prototypes of `declared` on `lib` and the headers (empty:
    none)."""
    funcs = header_functions(include_dir)
    problems = []
    for name in declared:
        if name not in funcs:
            problems.append("%s: has a ctypes prototype but no declaration in include/" % name)
            continue
        ret, params = funcs[name]
        f = getattr(lib, name)
        args = list(f.argtypes or [])
        if len(args) != len(params):
            problems.append("%s: %d parameters in the header, %d in the ctypes prototype" %
                            (name, len(params), len(args)))
            continue
        for i, (h, a) in enumerate(zip(params, args)):
            if not _matches(h, a, mirrors):
                problems.append("%s: parameter %d is %s in the header, %s in the prototype" %
                                (name, i + 1, h, _name(a)))
        if not _matches(ret, f.restype, mirrors):
            problems.append("%s: returns %s in the header, %s in the prototype" %
                            (name, ret, _name(f.restype)))
    return problems


def check_loaded(lib, declared: List[str], header: Optional[str], mirrors: Dict[str, type]) -> str:
    """check() at import: raises ImportError on a difference; a one-line verdict otherwise."""
    if header is None:
        return "prototypes not checked: gvq.h not found"
    problems = check(lib, declared, os.path.dirname(header), mirrors)
    if problems:
        raise ImportError("gvq: the ctypes prototypes (bindings/python/gvq/_lib.py) differ from "
                          "the headers:\n  " + "\n  ".join(problems))
    return "%d prototypes match the headers" % len(declared)
