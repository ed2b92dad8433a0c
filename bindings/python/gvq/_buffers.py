"""Buffers: numpy arrays and CPU torch tensors, passed to C by address (never copied).

A buffer must be C-contiguous, of a gvq datatype, and (for outputs) writable; anything else is
refused with a TypeError or ValueError naming the argument, so a silent copy can never leave the
result somewhere the caller does not look.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

try:  # torch is optional
    import torch
except ImportError:  # pragma: no cover
    torch = None

# gvqDataType_t
INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = range(10)

_NUMPY = {np.dtype(np.int8): INT8, np.dtype(np.uint8): UINT8, np.dtype(np.int32): INT32,
          np.dtype(np.uint32): UINT32, np.dtype(np.int64): INT64, np.dtype(np.uint64): UINT64,
          np.dtype(np.float16): FLOAT16, np.dtype(np.float32): FLOAT32,
          np.dtype(np.float64): FLOAT64}
_TORCH = {}
if torch is not None:
    _TORCH = {torch.int8: INT8, torch.uint8: UINT8, torch.int32: INT32, torch.int64: INT64,
              torch.float16: FLOAT16, torch.float32: FLOAT32, torch.float64: FLOAT64,
              torch.bfloat16: BFLOAT16}
DTYPE_NAMES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
               "float64", "bfloat16"]


class Buf(NamedTuple):
    """What C needs of a buffer: its address, element count, gvq datatype and element size."""
    ptr: int
    count: int
    dtype: int
    itemsize: int
    obj: Any


def as_buffer(x: Any, name: str, func: str, writable: bool = False) -> Buf:
    """Returns the Buf of a numpy array or CPU torch tensor `x`, or raises naming `name`."""
    where = "%s: %s" % (func, name)
    if isinstance(x, np.ndarray):
        dt = _NUMPY.get(x.dtype)
        if dt is None:
            raise TypeError("%s has dtype %s, which gvq does not carry (use one of %s)" %
                            (where, x.dtype, ", ".join(DTYPE_NAMES[:9])))
        if not x.flags.c_contiguous:
            raise ValueError("%s is not C-contiguous: gvq reads and writes it in place and "
                             "never copies (pass np.ascontiguousarray(%s))" % (where, name))
        if writable and not x.flags.writeable:
            raise ValueError("%s is read-only, but gvq writes the result into it" % where)
        return Buf(x.ctypes.data, x.size, dt, x.itemsize, x)
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise ValueError("%s is on %s; the Python bindings take CPU tensors" %
                             (where, x.device))
        dt = _TORCH.get(x.dtype)
        if dt is None:
            raise TypeError("%s has dtype %s, which gvq does not carry" % (where, x.dtype))
        if not x.is_contiguous():
            raise ValueError("%s is not contiguous: gvq reads and writes it in place and never "
                             "copies (pass %s.contiguous())" % (where, name))
        if writable and x.requires_grad and x.is_leaf:
            raise ValueError("%s requires grad; pass %s.detach() (it shares the memory)" %
                             (where, name))
        return Buf(x.data_ptr(), x.numel(), dt, x.element_size(), x)
    raise TypeError("%s must be a numpy array or a CPU torch tensor, not %s" %
                    (where, type(x).__name__))


def same_kind(a: Buf, b: Buf, an: str, bn: str, func: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError("%s: %s is %s but %s is %s (gvq does not convert)" %
                        (func, bn, DTYPE_NAMES[b.dtype], an, DTYPE_NAMES[a.dtype]))


def opt(x: Optional[Any], name: str, func: str, writable: bool = False) -> Optional[Buf]:
    return None if x is None else as_buffer(x, name, func, writable)
