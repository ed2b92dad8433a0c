"""gvq: Python bindings of libgvq (gradient aggregation for data-parallel training).

    import numpy as np, gvq
    comm = gvq.Communicator.from_mpi()              # over mpi4py's COMM_WORLD (run under mpirun)
    x = np.ones(1024, np.float32)
    gvq.allreduce(x, x, gvq.SUM, comm)              # in place, x is written, never copied
    c = gvq.Compressor(comm, 64 * 32 * 3 * 3, shape=(64, 32, 3, 3), codec=gvq.Codec.GRADIVEQ)
    c.allreduce(grad)                               # compressed, averaged, in place
    c.stats()["ratio"]

Buffers are numpy arrays or CPU torch tensors (contiguous, of a gvq datatype). Errors raise
gvq.GvqError subclasses carrying gvqGetLastError's text. gvq.ddp has the PyTorch DDP
communication hooks; `python3 -m gvq.info` says which library was loaded and how it was built.
"""

from ._lib import (GvqError, InvalidArgument, InvalidUsage, LibraryNotFound, RemoteError,
                   SystemError_, Timeout, library_path)
from . import _lib, _protocheck, _structs

_lib.declare(_structs)
abi_check = _structs.check_abi()
prototype_check = _protocheck.check_loaded(
    _lib.lib, _lib.DECLARED, _structs.find_header(),
    dict(_structs.MIRRORS, **_structs.TRAIN_MIRRORS, gvqUniqueId=_structs.UniqueId))

from .comm import (AVG, MAX, MIN, PROD, SUM, Communicator, Layout, Op, allgather,  # noqa: E402
                   allreduce, broadcast, get_unique_id, group, recv, reduce, reduce_scatter, send,
                   version)
from .compressor import (Basis, Codec, Compressor, Phase, allreduce_compressed,  # noqa: E402
                         make_config)
from .sparse import RAW, SUMMED, ParameterServer, Rule, SparseRows, sparse_allgatherv  # noqa: E402
from . import train  # noqa: E402  (gvq.train: the training layer, include/gvq_train.h)

__version__ = "0.1.0"
__all__ = ["GvqError", "InvalidArgument", "InvalidUsage", "RemoteError", "SystemError_", "Timeout",
           "LibraryNotFound", "library_path", "abi_check", "prototype_check", "Communicator", "Layout", "Op", "SUM", "PROD",
           "MAX", "MIN", "AVG", "allreduce", "broadcast", "reduce", "reduce_scatter", "allgather",
           "send", "recv", "group", "get_unique_id", "version", "Basis", "Codec", "Phase",
           "Compressor",
           "allreduce_compressed", "make_config", "SUMMED", "RAW", "SparseRows",
           "sparse_allgatherv", "ParameterServer", "Rule", "train"]
