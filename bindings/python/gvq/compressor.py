"""Compressed allreduce: GradiVeQ, QSGD and PowerSGD compressors (gvqCompressor_t)."""

from __future__ import annotations

import ctypes
import enum
from typing import Any, Dict, Optional, Tuple

from . import _structs
from ._buffers import FLOAT32, as_buffer
from ._lib import call
from .comm import AVG, Communicator, Op, _comm, _op, version


class Codec(enum.IntEnum):
    """gvqCodec_t."""
    NONE = 0
    GRADIVEQ = 1
    QSGD = 2
    POWERSGD = 3


class Basis(enum.IntEnum):
    """gvqBasisUpdate_t: how GradiVeQ finds its basis."""
    FIT = 0
    TRACK = 1


class Phase(enum.IntEnum):
    """gvqCompressorPhase_t."""
    WARMUP = 0
    SAMPLE = 1
    COMPRESSED = 2
    PLAIN = 3


# Python keyword -> gvqCompressorConfig_t field
_FIELDS = {"codec": "codec", "sample_codec": "sampleCodec", "slice_size": "sliceSize",
           "reuse": "reuse", "loss_threshold": "lossThreshold", "warmup_iters": "warmupIters",
           "sample_iters": "sampleIters", "compressed_iters": "compressedIters",
           "qsgd_bits": "qsgdBits", "qsgd_bucket": "qsgdBucket", "qsgd_max_norm": "qsgdMaxNorm",
           "wire_type": "wireType", "error_feedback": "errorFeedback", "max_dims": "maxDims",
           "seed": "seed", "vote_threshold": "voteThreshold", "sample_slices": "sampleSlices",
           "integer_bits": "integerBits", "power_rank": "powerRank", "ef_bound": "efBound",
           "basis_update": "basisUpdate"}
CONFIG_KEYS = tuple(_FIELDS) + ("shape",)


def make_config(shape: Optional[Tuple[int, ...]] = None, **kw: Any) -> _structs.CompressorConfig:
    """A gvqCompressorConfig_t filled as GVQ_COMPRESSOR_CONFIG_INITIALIZER does, then with the
    keywords given (snake_case of the C fields: codec, sample_codec, slice_size, sample_iters,
    compressed_iters, qsgd_bits, error_feedback, vote_threshold, ...). shape: a conv weight's
    (K, D, H, W) (a 4-tuple; (K, D) or (K, D, H) are padded with ones), or None for a flat
    tensor. Unknown keywords raise TypeError; the library checks the values."""
    c = _structs.CompressorConfig()
    for name, t in c._fields_:
        setattr(c, name, -1.0 if t is ctypes.c_float else _structs.UNDEF_INT)
    c.size = ctypes.sizeof(c)
    c.magic = _structs.COMPRESSOR_CONFIG_MAGIC
    c.version = version()
    for k, v in kw.items():
        if k not in _FIELDS:
            raise TypeError("gvq.make_config: unknown field %r (known: %s)" %
                            (k, ", ".join(sorted(_FIELDS))))
        setattr(c, _FIELDS[k], int(v) if not isinstance(v, float) else v)
    if shape is not None:
        s = tuple(int(x) for x in shape) + (1,) * (4 - len(shape))
        if len(s) != 4:
            raise ValueError("gvq.make_config: shape %r has more than 4 dimensions" % (shape,))
        c.filters, c.depth, c.height, c.width = s
    return c


class Compressor:
    """A compressor for one tensor of `count` float32 values (gvqCompressorCreate). Every rank
    creates its compressors in the same order with the same config; all ranks then hold
    bitwise-identical state. Keywords as make_config. Raises InvalidArgument with a WARN naming
    the field (L not a multiple of K, shape not matching count, ...)."""

    def __init__(self, comm: Communicator, count: int, shape: Optional[Tuple[int, ...]] = None,
                 **config: Any) -> None:
        self.comm, self.count = comm, int(count)
        self.config = make_config(shape, **config)
        h = ctypes.c_void_p()
        call("gvqCompressorCreate", _comm(comm, "gvq.Compressor"), self.count,
             ctypes.byref(self.config), ctypes.byref(h))
        self._h: Optional[int] = h.value

    @property
    def handle(self) -> int:
        if self._h is None:
            raise ValueError("gvq: the compressor was destroyed")
        return self._h

    def destroy(self) -> None:
        """gvqCompressorDestroy (local). Idempotent here."""
        if self._h is not None:
            h, self._h = self._h, None
            call("gvqCompressorDestroy", h)

    def stats(self) -> Dict[str, Any]:
        """gvqCompressorGetStats as a dict of the C field names (phase, dims, ratio, lastLoss,
        wireBytes, rawBytes, reason, ...)."""
        st = _structs.CompressorStats()
        call("gvqCompressorGetStats", self.handle, ctypes.byref(st))
        return _structs.stats_dict(st)

    def save(self) -> bytes:
        """gvqCompressorSave: the whole state (phase, counters, samples, U, Z, d, residuals)."""
        n = ctypes.c_size_t()
        call("gvqCompressorSave", self.handle, None, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        call("gvqCompressorSave", self.handle, buf, ctypes.byref(n))
        return buf.raw[:n.value]

    def load(self, state: bytes) -> None:
        """gvqCompressorLoad: restores what save() wrote into a compressor made with the same
        count and config. Raises InvalidArgument for anything else."""
        data = bytes(state)
        call("gvqCompressorLoad", self.handle, data, len(data))

    def load_shared(self, state: bytes) -> None:
        """gvqCompressorLoadShared: another rank's save() taken as a rank that joins takes it
        (after Communicator.grow / join): the phase, counters, samples and basis every rank
        holds alike; this compressor's error-feedback residual starts at zero."""
        data = bytes(state)
        call("gvqCompressorLoadShared", self.handle, data, len(data))

    def save_file(self, path: str) -> None:
        """gvqCompressorSaveFile."""
        call("gvqCompressorSaveFile", self.handle, str(path).encode())

    def load_file(self, path: str) -> None:
        """gvqCompressorLoadFile."""
        call("gvqCompressorLoadFile", self.handle, str(path).encode())

    def allreduce(self, sendbuf: Any, recvbuf: Any = None, op: Op = AVG) -> Any:
        """gvq.allreduce_compressed through this compressor; recvbuf None means in place."""
        return allreduce_compressed(sendbuf, sendbuf if recvbuf is None else recvbuf, op, self,
                                    self.comm)

    def __enter__(self) -> "Compressor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()


def allreduce_compressed(sendbuf: Any, recvbuf: Any, op: Op, compressor: Compressor,
                         comm: Communicator) -> Any:
    """Allreduce of float32 values through `compressor` (gvqAllReduceCompressed), op SUM or AVG.
    The result is the exact sum during warm-up and sampling with codec none, an approximation
    otherwise, and bitwise identical on every rank. In place when recvbuf is sendbuf. Inside
    `with gvq.group():` the call is queued and runs at the block's end, the tracked-basis ones
    (basis_update=gvq.Basis.TRACK) fused into one call of three rings; the buffers must stay
    alive until then. Returns recvbuf. Errors as gvq.allreduce, plus InvalidArgument for a
    count, dtype or op the compressor was not made for."""
    f = "gvq.allreduce_compressed"
    s = as_buffer(sendbuf, "sendbuf", f)
    r = as_buffer(recvbuf, "recvbuf", f, writable=True)
    if s.dtype != FLOAT32 or r.dtype != FLOAT32:
        raise TypeError("%s: sendbuf and recvbuf must be float32 (got %s and %s)" %
                        (f, getattr(sendbuf, "dtype", "?"), getattr(recvbuf, "dtype", "?")))
    if r.count != s.count:
        raise ValueError("%s: recvbuf has %d elements, sendbuf %d" % (f, r.count, s.count))
    if not isinstance(compressor, Compressor):
        raise TypeError("%s: compressor must be a gvq.Compressor" % f)
    call("gvqAllReduceCompressed", s.ptr, r.ptr, s.count, s.dtype, _op(op, f), compressor.handle,
         _comm(comm, f), None)
    return recvbuf
