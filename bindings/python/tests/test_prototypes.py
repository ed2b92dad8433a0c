"""The ctypes prototypes against include/*.h (gvq/_protocheck.py): the import-time check passed,
a drifted prototype is refused, and every C function the package calls has a prototype."""

import ctypes as C
import os
import re
import types

import gvq
from gvq import _lib, _protocheck, _structs

PKG = os.path.dirname(os.path.abspath(gvq.__file__))
MIRRORS = dict(_structs.MIRRORS, **_structs.TRAIN_MIRRORS, gvqUniqueId=_structs.UniqueId)


def _include_dir():
    return os.path.dirname(_structs.find_header())


def test_import_check_passed():
    assert gvq.prototype_check == "%d prototypes match the headers" % len(_lib.DECLARED)
    assert _protocheck.check(_lib.lib, _lib.DECLARED, _include_dir(), MIRRORS) == []


def test_header_parse_sees_known_signatures():
    f = _protocheck.header_functions(_include_dir())
    assert f["gvqAllReduce"] == ("int", ["ptr", "ptr", "size_t", "int", "int", "ptr", "ptr"])
    assert f["gvqGetErrorString"] == ("str", ["int"])
    assert f["gvqCommInitRank"][1] == ["ptr", "int", "struct:gvqUniqueId", "int"]
    assert f["gvqGroupStart"] == ("int", [])
    assert len(f) >= 70  # every public function, not only the bound ones


def _fake(**protos):
    ns = types.SimpleNamespace()
    for name, (res, args) in protos.items():
        setattr(ns, name, types.SimpleNamespace(restype=res, argtypes=args))
    return ns


def test_drift_is_refused():
    good = [C.c_void_p, C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_void_p, C.c_void_p]
    assert _protocheck.check(_fake(gvqAllReduce=(C.c_int, good)), ["gvqAllReduce"],
                             _include_dir(), MIRRORS) == []
    narrow = list(good)
    narrow[2] = C.c_int  # a count truncated to 32 bits
    p = _protocheck.check(_fake(gvqAllReduce=(C.c_int, narrow)), ["gvqAllReduce"],
                          _include_dir(), MIRRORS)
    assert len(p) == 1 and "parameter 3 is size_t" in p[0]
    p = _protocheck.check(_fake(gvqAllReduce=(C.c_int, good[:-1])), ["gvqAllReduce"],
                          _include_dir(), MIRRORS)
    assert len(p) == 1 and "7 parameters in the header, 6" in p[0]
    p = _protocheck.check(_fake(gvqNoSuchCall=(C.c_int, [])), ["gvqNoSuchCall"],
                          _include_dir(), MIRRORS)
    assert len(p) == 1 and "no declaration" in p[0]
    p = _protocheck.check(_fake(gvqGetErrorString=(C.c_int, [C.c_int])), ["gvqGetErrorString"],
                          _include_dir(), MIRRORS)
    assert len(p) == 1 and "returns str" in p[0]


def test_every_called_function_has_a_prototype():
    used = set()
    for name in os.listdir(PKG):
        if name.endswith(".py"):
            with open(os.path.join(PKG, name)) as f:
                text = f.read()
            used |= set(re.findall(r'call\(\s*"(gvq\w+)"', text))
            used |= set(re.findall(r"\blib\.(gvq\w+)", text))
    assert used, "no C call found in the package"
    assert sorted(used - set(_lib.DECLARED)) == []


def test_no_import_cycle():
    """The package's modules import each other in one direction only (top level or inside a
    function alike)."""
    edges = {}
    for name in os.listdir(PKG):
        if name.endswith(".py"):
            with open(os.path.join(PKG, name)) as f:
                text = f.read()
            deps = set(re.findall(r"^\s*from \.(\w+) import", text, re.M))
            for group in re.findall(r"^\s*from \. import ([\w, ]+)", text, re.M):
                deps |= {d.strip() for d in group.split(",")}
            edges[name[:-3]] = deps - {name[:-3]}
    seen, stack = set(), []

    def visit(m):
        assert m not in stack, "import cycle: " + " -> ".join(stack[stack.index(m):] + [m])
        if m in seen:
            return
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            visit(d)
        stack.pop()
        seen.add(m)

    for m in sorted(edges):
        if m != "__init__":
            visit(m)
