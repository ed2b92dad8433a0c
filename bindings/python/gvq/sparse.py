"""Sparse variables: sparse allgatherv and the parameter server (gvqSparse*, gvqPs*)."""

from __future__ import annotations

import ctypes
import enum
from typing import Any, Dict, Optional

import numpy as np

from . import _structs
from ._buffers import DTYPE_NAMES, FLOAT32, FLOAT64, INT64, as_buffer
from ._lib import call
from .comm import Communicator, _comm, version

SUMMED = 1  # GVQ_SPARSE_SUMMED
RAW = 2  # GVQ_SPARSE_RAW
_NP = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
       6: np.float16, 7: np.float32, 8: np.float64}


def _indices(x: Any, name: str, func: str):
    b = as_buffer(x, name, func)
    if b.dtype != INT64:
        raise TypeError("%s: %s must be int64 (got %s)" % (func, name, DTYPE_NAMES[b.dtype]))
    return b


class SparseRows:
    """The result of sparse_allgatherv (gvqSparseRows_t). gvq owns the arrays and reuses them
    from call to call (pass the same object as `out` in a training loop): the numpy views
    indices/values/raw_indices/raw_values stay valid until the next call with this object or
    free(). Copy them to keep them longer."""

    def __init__(self) -> None:
        s = _structs.SparseRows()
        s.size, s.magic, s.version = ctypes.sizeof(s), _structs.SPARSE_ROWS_MAGIC, version()
        self._s = s
        self.dim, self._np = 0, np.float32

    def _view(self, ptr: Any, n: int, dtype: Any, shape: tuple) -> np.ndarray:
        if n == 0 or not ptr:
            return np.zeros(shape, dtype)
        addr = ctypes.cast(ptr, ctypes.c_void_p).value
        buf = (ctypes.c_char * (n * np.dtype(dtype).itemsize)).from_address(addr)
        return np.frombuffer(buf, dtype=dtype).reshape(shape)

    @property
    def indices(self) -> np.ndarray:
        """SUMMED: the unique row indices, ascending (a view into gvq's array)."""
        return self._view(self._s.indices, self._s.nrows, np.int64, (self._s.nrows,))

    @property
    def values(self) -> np.ndarray:
        """SUMMED: nrows x dim values, row i belonging to indices[i] (a view)."""
        n = self._s.nrows
        return self._view(self._s.values, n * self.dim, self._np, (n, self.dim))

    @property
    def raw_indices(self) -> np.ndarray:
        """RAW: every rank's indices in rank order (a view)."""
        return self._view(self._s.rawIndices, self._s.rawRows, np.int64, (self._s.rawRows,))

    @property
    def raw_values(self) -> np.ndarray:
        """RAW: the rows in rank order (a view)."""
        n = self._s.rawRows
        return self._view(self._s.rawValues, n * self.dim, self._np, (n, self.dim))

    @property
    def rank_rows(self) -> list:
        """Rows each rank sent."""
        return [self._s.rankRows[i] for i in range(self._s.nranks)] if self._s.rankRows else []

    @property
    def bytes_sent(self) -> int:
        return self._s.bytesSent

    @property
    def bytes_received(self) -> int:
        return self._s.bytesReceived

    def free(self) -> None:
        """gvqSparseRowsFree: releases the arrays (views taken before become invalid)."""
        call("gvqSparseRowsFree", ctypes.byref(self._s))

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:
            pass


def sparse_allgatherv(indices: Any, values: Any, rows: int, comm: Communicator,
                      flags: int = SUMMED, out: Optional[SparseRows] = None) -> SparseRows:
    """Sparse allgatherv (gvqSparseAllGatherv). This rank contributes the rows values[i] (an
    nrows x dim array) of index indices[i] (int64 in [0, rows); duplicates allowed). Every rank
    receives, in the returned SparseRows, the union with rows of equal index summed (SUMMED)
    and/or the raw concatenation in rank order (RAW); results are bitwise identical on all ranks.
    rows, dim, dtype and flags must be the same on every rank. Blocking; not allowed inside a
    group. Raises InvalidArgument (an index outside [0, rows): nothing is written) on the rank
    that gave it and RemoteError on the others."""
    f = "gvq.sparse_allgatherv"
    ib = _indices(indices, "indices", f)
    vb = as_buffer(values, "values", f)
    shape = tuple(getattr(values, "shape", ()))
    nrows = ib.count
    if len(shape) != 2 or shape[0] != nrows:
        raise ValueError("%s: values must be a (len(indices), dim) array, got shape %s for %d "
                         "indices" % (f, shape, nrows))
    dim = int(shape[1])
    out = SparseRows() if out is None else out
    call("gvqSparseAllGatherv", ib.ptr, vb.ptr, nrows, int(rows), dim, vb.dtype, int(flags),
         ctypes.byref(out._s), _comm(comm, f), None)
    out.dim, out._np = dim, _NP[vb.dtype]
    return out


class Rule(enum.IntEnum):
    """gvqPsRule_t."""
    SGD = 0
    MOMENTUM = 1
    ADAGRAD = 2


_CREATE = object()  # ParameterServer's recover_from when creating anew


class ParameterServer:
    """A sparse variable of rows x dim float32/float64 values sharded over the ranks
    (gvqPsCreate). Collective: every rank creates it with the same arguments. Keywords set
    gvqPsConfig_t fields: partitions, partitioning (0 hashed, 1 contiguous), rule (Rule),
    learning_rate, momentum, adagrad_init, epsilon, average, local_aggregation, init (0 zero,
    1 uniform, 2 values), init_scale, seed, init_values (a rows x dim array read during
    creation), serve (1: a thread answers at any time; push, apply and pull are then this
    rank's alone) and staleness (with serve: a pull sees at least the steps up to this many
    before the caller's own)."""

    _KEYS = {"partitions": "partitions", "partitioning": "partitioning", "rule": "rule",
             "learning_rate": "learningRate", "momentum": "momentum",
             "adagrad_init": "adagradInit", "epsilon": "epsilon", "average": "average",
             "local_aggregation": "localAggregation", "init": "init",
             "init_scale": "initScale", "seed": "seed", "serve": "serve",
             "staleness": "staleness"}

    def __init__(self, comm: Communicator, rows: int, dim: int, dtype: Any = np.float32,
                 init_values: Any = None, *, recover_from: Any = _CREATE,
                 **config: Any) -> None:
        f = "gvq.ParameterServer"
        dt = {np.dtype(np.float32): FLOAT32, np.dtype(np.float64): FLOAT64}.get(np.dtype(dtype))
        if dt is None:
            raise TypeError("%s: dtype must be float32 or float64, not %s" % (f, dtype))
        c = _structs.PsConfig()
        for name, t in c._fields_:
            if t is ctypes.c_int:
                setattr(c, name, _structs.UNDEF_INT)
            elif t is ctypes.c_double:
                setattr(c, name, -1.0)
        c.size, c.magic, c.version = ctypes.sizeof(c), _structs.PS_CONFIG_MAGIC, version()
        for k, v in config.items():
            if k not in self._KEYS:
                raise TypeError("%s: unknown field %r (known: init_values, %s)" %
                                (f, k, ", ".join(sorted(self._KEYS))))
            setattr(c, self._KEYS[k], v)
        if init_values is not None:
            b = as_buffer(init_values, "init_values", f)
            if b.dtype != dt or b.count != rows * dim:
                raise ValueError("%s: init_values must hold rows x dim = %d values of %s" %
                                 (f, rows * dim, np.dtype(dtype)))
            c.initValues = b.ptr
            c.init = 2
        self.comm, self.rows, self.dim, self._dt = comm, int(rows), int(dim), dt
        self.config = c
        h = ctypes.c_void_p()
        if recover_from is _CREATE:
            call("gvqPsCreate", _comm(comm, f), self.rows, self.dim, dt, ctypes.byref(c),
                 ctypes.byref(h))
        else:
            if recover_from is not None and not isinstance(recover_from, ParameterServer):
                raise TypeError("%s: recover_from must be a ParameterServer or None" % f)
            old = recover_from.handle if recover_from is not None else None
            call("gvqPsRecover", old, _comm(comm, f), self.rows, self.dim, dt, ctypes.byref(c),
                 ctypes.byref(h))
        self._h: Optional[int] = h.value
        c.initValues = None

    @property
    def handle(self) -> int:
        if self._h is None:
            raise ValueError("gvq: the parameter server was destroyed")
        return self._h

    def _rows(self, indices: Any, data: Any, name: str, func: str, writable: bool):
        ib = _indices(indices, "indices", func)
        db = as_buffer(data, name, func, writable)
        if db.dtype != self._dt:
            raise TypeError("%s: %s must be %s like the variable" %
                            (func, name, DTYPE_NAMES[self._dt]))
        if db.count != ib.count * self.dim:
            raise ValueError("%s: %s must hold len(indices) x dim = %d values, not %d" %
                             (func, name, ib.count * self.dim, db.count))
        return ib, db

    def push(self, indices: Any, grads: Any) -> None:
        """gvqPsPush: grads[i] (dim values) is the gradient of row indices[i]; sums accumulate
        at the shards until apply(). Collective and blocking."""
        ib, gb = self._rows(indices, grads, "grads", "gvq.ParameterServer.push", False)
        call("gvqPsPush", self.handle, ib.ptr, gb.ptr, ib.count)

    def apply(self) -> None:
        """gvqPsApply: the update rule on every row pushed since the last apply. Every rank
        calls it between the same pushes and pulls."""
        call("gvqPsApply", self.handle)

    def pull(self, indices: Any, values: Any) -> Any:
        """gvqPsPull: current rows into values (len(indices) x dim, written in place).
        Collective and blocking. Returns values."""
        ib, vb = self._rows(indices, values, "values", "gvq.ParameterServer.pull", True)
        call("gvqPsPull", self.handle, ib.ptr, vb.ptr, ib.count)
        return values

    def commit(self) -> None:
        """gvqPsCommit: keeps this rank's shards in memory here and on the next rank, so that
        the rows of any one lost rank survive. Collective, between an apply and the next
        push."""
        call("gvqPsCommit", self.handle)

    @classmethod
    def recover(cls, old: Optional["ParameterServer"], comm: Communicator, rows: int, dim: int,
                dtype: Any = np.float32, **config: Any) -> "ParameterServer":
        """gvqPsRecover: a server on comm (a shrunk or grown communicator) holding the rows of
        old's last commit; old is None on a process that had none (a newcomer). Collective over
        comm; old stays as it was (destroy it)."""
        return cls(comm, rows, dim, dtype, recover_from=old, **config)

    def stats(self) -> Dict[str, Any]:
        """gvqPsGetStats as a dict."""
        st = _structs.PsStats()
        call("gvqPsGetStats", self.handle, ctypes.byref(st))
        return {name: getattr(st, name) for name, _ in st._fields_}

    def save(self) -> bytes:
        """gvqPsSave: this rank's shards (local)."""
        n = ctypes.c_size_t()
        call("gvqPsSave", self.handle, None, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        call("gvqPsSave", self.handle, buf, ctypes.byref(n))
        return buf.raw[:n.value]

    def load(self, state: bytes) -> None:
        """gvqPsLoad: all or nothing; InvalidArgument for a state of another shape or rank."""
        data = bytes(state)
        call("gvqPsLoad", self.handle, data, len(data))

    def save_file(self, path: str) -> None:
        call("gvqPsSaveFile", self.handle, str(path).encode())

    def load_file(self, path: str) -> None:
        call("gvqPsLoadFile", self.handle, str(path).encode())

    def destroy(self) -> None:
        """gvqPsDestroy (local; save first). Idempotent here."""
        if self._h is not None:
            h, self._h = self._h, None
            call("gvqPsDestroy", h)

    def __enter__(self) -> "ParameterServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()
