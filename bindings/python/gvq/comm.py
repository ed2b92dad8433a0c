"""Communicators and the NCCL-shaped collectives.

The functions take NCCL's argument order with the count and datatype read off the buffers:
``gvq.allreduce(sendbuf, recvbuf, op, comm)`` is ``gvqAllReduce(sendbuff, recvbuff, count,
datatype, op, comm, NULL)``. Buffers are numpy arrays or CPU torch tensors, used in place (see
_buffers.py). Every call blocks until its result is in recvbuf (the host backend is synchronous)
and releases the GIL meanwhile; inside ``with gvq.group():`` calls are queued and run at the end
of the block. Calls on one communicator must be serialized, as in C.
"""

from __future__ import annotations

import ctypes
import enum
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, List, Optional, Sequence

from . import _lib, _structs
from ._buffers import as_buffer, same_kind
from ._lib import call


class Op(enum.IntEnum):
    """gvqRedOp_t. AVG sums, then divides once by the number of ranks (integer types truncate)."""
    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


SUM, PROD, MAX, MIN, AVG = Op.SUM, Op.PROD, Op.MAX, Op.MIN, Op.AVG


def _config(timeout_ms: Optional[int], chunk_bytes: Optional[int]):
    if timeout_ms is None and chunk_bytes is None:
        return None
    u = _structs.UNDEF_INT
    return _structs.Config(ctypes.sizeof(_structs.Config), _structs.CONFIG_MAGIC, version(), u,
                           u if timeout_ms is None else timeout_ms,
                           u if chunk_bytes is None else chunk_bytes)


def version() -> int:
    """GVQ_VERSION of the loaded library (major*10000 + minor*100 + patch)."""
    v = ctypes.c_int()
    call("gvqGetVersion", ctypes.byref(v))
    return v.value


def get_unique_id() -> bytes:
    """Creates a bootstrap id (gvqGetUniqueId): call it on one rank and hand the 128 bytes to
    every rank that will call Communicator.init_rank with it (e.g. with mpi4py's bcast). The id
    holds a secret: keep it among the job's processes. Raises SystemError_ if no socket opens."""
    uid = _structs.UniqueId()
    call("gvqGetUniqueId", ctypes.byref(uid))
    return ctypes.string_at(ctypes.addressof(uid), 128)  # .internal would stop at a NUL


_STORE_IDS = 0  # ids passed through torch's store so far (each under a key of its own)


def _torch_store() -> Any:
    """torch.distributed's default store when a process group is up, else None."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            from torch.distributed import distributed_c10d as c10d
            return c10d._get_default_store()
    except ImportError:
        pass
    return None


def _unique_id(unique_id: bytes, what: str):
    """The gvqUniqueId of gvq.get_unique_id()'s 128 bytes."""
    if not isinstance(unique_id, (bytes, bytearray)) or len(unique_id) != 128:
        raise ValueError("%s: unique_id must be the 128 bytes of gvq.get_unique_id()" % what)
    uid = _structs.UniqueId()
    ctypes.memmove(ctypes.addressof(uid), bytes(unique_id), 128)
    return uid


class Communicator:
    """A gvq communicator (gvqComm_t). Make one with Communicator.init_rank (from a unique id),
    Communicator.from_env (from a launcher's environment, no MPI), Communicator.from_mpi (from an mpi4py communicator, keeping its ranks) or
    Communicator.from_mpi_unique_id. Free it with destroy() (or a with-block); abort() unblocks a
    call in progress from another thread."""

    def __init__(self, handle: int) -> None:
        self._h: Optional[int] = handle

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def init_rank(cls, nranks: int, unique_id: bytes, rank: int, timeout_ms: Optional[int] = None,
                  chunk_bytes: Optional[int] = None) -> "Communicator":
        """gvqCommInitRank(Config): collective over `nranks` processes of one MPI job calling it
        with the same id; returns once all joined. timeout_ms / chunk_bytes set gvqConfig_t
        fields (None: environment or default). Raises InvalidArgument, InvalidUsage, Timeout."""
        uid = _unique_id(unique_id, "Communicator.init_rank")
        h = ctypes.c_void_p()
        cfg = _config(timeout_ms, chunk_bytes)
        call("gvqCommInitRankConfig", ctypes.byref(h), int(nranks), uid, int(rank),
             ctypes.byref(cfg) if cfg is not None else None)
        return cls(h.value)

    @classmethod
    def from_env(cls, timeout_ms: Optional[int] = None,
                 chunk_bytes: Optional[int] = None) -> "Communicator":
        """gvqCommInitFromEnv: a communicator from a launcher's environment, without mpirun:
        rank and size from GVQ_RANK/GVQ_WORLD_SIZE, RANK/WORLD_SIZE (torchrun),
        SLURM_PROCID/SLURM_NTASKS (srun), OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/PMI_SIZE; the
        meeting point from GVQ_STORE (host:port) or MASTER_ADDR/MASTER_PORT. Outside an MPI
        job the transport is UCX (GVQ_TRANSPORT). When torch.distributed is initialized, its
        store (on MASTER_PORT) carries rank 0's unique id instead of gvq's own, and its rank
        and size are used. Raises InvalidUsage naming a missing variable, Timeout when rank 0's
        store does not answer."""
        store = _torch_store()
        if store is not None:  # torch's own store holds the meeting point's port already
            import torch.distributed as dist
            global _STORE_IDS
            _STORE_IDS += 1
            key = "gvq/unique_id/%d" % _STORE_IDS
            rank, size = dist.get_rank(), dist.get_world_size()
            if rank == 0:
                store.set(key, get_unique_id())
            return cls.init_rank(size, bytes(store.get(key)), rank, timeout_ms, chunk_bytes)
        h = ctypes.c_void_p()
        cfg = _config(timeout_ms, chunk_bytes)
        call("gvqCommInitFromEnv", ctypes.byref(h), ctypes.byref(cfg) if cfg is not None else None)
        return cls(h.value)

    @classmethod
    def from_mpi(cls, mpi_comm: Any = None, timeout_ms: Optional[int] = None,
                 chunk_bytes: Optional[int] = None) -> "Communicator":
        """gvqCommInitMPI: a communicator over the ranks of an mpi4py communicator (default
        MPI.COMM_WORLD), keeping their ranks. Collective over mpi_comm (gvq duplicates it).
        mpi4py must use the same MPI library as libgvq (Debian's Open MPI for both)."""
        from mpi4py import MPI
        mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        h = ctypes.c_void_p()
        cfg = _config(timeout_ms, chunk_bytes)
        call("gvqCommInitMPI", ctypes.byref(h), ctypes.c_void_p(MPI._handleof(mpi_comm)),
             ctypes.byref(cfg) if cfg is not None else None)
        return cls(h.value)

    @classmethod
    def from_mpi_unique_id(cls, mpi_comm: Any = None, **kw: Any) -> "Communicator":
        """The NCCL bootstrap over mpi4py: rank 0 makes a unique id, mpi_comm broadcasts it,
        every rank calls init_rank with its mpi_comm rank."""
        from mpi4py import MPI
        mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        uid = get_unique_id() if mpi_comm.Get_rank() == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        return cls.init_rank(mpi_comm.Get_size(), uid, mpi_comm.Get_rank(), **kw)

    # ---- handle -------------------------------------------------------------------------
    @property
    def handle(self) -> int:
        if self._h is None:
            raise ValueError("gvq: the communicator was destroyed")
        return self._h

    @property
    def size(self) -> int:
        """Number of ranks (gvqCommCount)."""
        n = ctypes.c_int()
        call("gvqCommCount", self.handle, ctypes.byref(n))
        return n.value

    @property
    def rank(self) -> int:
        """The caller's rank (gvqCommUserRank)."""
        r = ctypes.c_int()
        call("gvqCommUserRank", self.handle, ctypes.byref(r))
        return r.value

    def async_error(self) -> int:
        """The gvqResult_t that broke the communicator, or 0 (gvqCommGetAsyncError)."""
        e = ctypes.c_int()
        call("gvqCommGetAsyncError", self.handle, ctypes.byref(e))
        return e.value

    def destroy(self) -> None:
        """gvqCommDestroy: frees the communicator (local, never hangs). Idempotent here."""
        if self._h is not None:
            h, self._h = self._h, None
            call("gvqCommDestroy", h)

    def abort(self) -> None:
        """gvqCommAbort: a call blocked on this communicator in another thread returns
        InvalidUsage promptly; then the communicator is freed."""
        if self._h is not None:
            h, self._h = self._h, None
            call("gvqCommAbort", h)

    SPLIT_NOCOLOR = -1

    def split(self, color: int, key: int = 0, timeout_ms: Optional[int] = None,
              chunk_bytes: Optional[int] = None) -> Optional["Communicator"]:
        """gvqCommSplit (NCCL's ncclCommSplit): collective over every rank of this communicator;
        the ranks giving the same color (>= 0) form a new communicator ranked by key, then by
        their rank here; SPLIT_NOCOLOR gives None. One color everywhere duplicates it. The new
        communicator has a transport of its own: destroy it on its own."""
        h = ctypes.c_void_p()
        cfg = _config(timeout_ms, chunk_bytes)
        call("gvqCommSplit", self.handle, int(color), int(key), ctypes.byref(h),
             ctypes.byref(cfg) if cfg is not None else None)
        return Communicator(h.value) if h.value else None

    # ---- elastic: shrink and grow --------------------------------------------------------
    def shrink(self, exclude: Sequence[int] = (), abort: bool = False, no_quorum: bool = False,
               timeout_ms: Optional[int] = None,
               chunk_bytes: Optional[int] = None) -> Optional["Communicator"]:
        """gvqCommShrink: a new communicator of this one's ranks less `exclude` (which do not
        call). abort=True (GVQ_SHRINK_ABORT) also leaves out the ranks that do not answer, for
        a communicator broken by a dead or stalled peer; the survivors agree, so each gets the
        same communicator, provided they are a majority (no_quorum=True drops that rule). This
        communicator stays as it was: destroy it. timeout_ms / chunk_bytes default to this
        communicator's. Raises RemoteError when left out, Timeout, InvalidUsage."""
        ex = (ctypes.c_int * max(len(exclude), 1))(*[int(r) for r in exclude])
        flags = (1 if abort else 0) | (2 if no_quorum else 0)
        h = ctypes.c_void_p()
        cfg = _config(timeout_ms, chunk_bytes)
        call("gvqCommShrink", self.handle, ex if exclude else None, len(exclude), ctypes.byref(h),
             ctypes.byref(cfg) if cfg is not None else None, flags)
        return Communicator(h.value) if h.value else None

    def grow(self, nranks: int, unique_id: bytes, timeout_ms: Optional[int] = None,
             chunk_bytes: Optional[int] = None) -> "Communicator":
        """gvqCommGrow as a member: a communicator of `nranks` with this one's ranks (kept) and
        newcomers (Communicator.join with the same id) above them. One process makes the id
        (gvq.get_unique_id) and hands it to the others by the caller's own means."""
        return Communicator._grow(self.handle, nranks, unique_id, -1, timeout_ms, chunk_bytes)

    @classmethod
    def join(cls, nranks: int, unique_id: bytes, rank: int, timeout_ms: Optional[int] = None,
             chunk_bytes: Optional[int] = None) -> "Communicator":
        """gvqCommGrow as a newcomer: joins the members' grow() as `rank` (at least the
        members' count)."""
        return cls._grow(None, nranks, unique_id, rank, timeout_ms, chunk_bytes)

    @classmethod
    def _grow(cls, handle: Optional[int], nranks: int, unique_id: bytes, rank: int,
              timeout_ms: Optional[int], chunk_bytes: Optional[int]) -> "Communicator":
        uid = _unique_id(unique_id, "Communicator.grow/join")
        h = ctypes.c_void_p()
        cfg = _config(timeout_ms, chunk_bytes)
        call("gvqCommGrow", handle, int(nranks), ctypes.byref(uid), int(rank), ctypes.byref(h),
             ctypes.byref(cfg) if cfg is not None else None)
        return cls(h.value)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    # ---- methods: the module functions with this communicator -------------------------------
    def allreduce(self, sendbuf: Any, recvbuf: Any = None, op: Op = SUM) -> Any:
        """gvq.allreduce on this communicator; recvbuf None means in place."""
        return allreduce(sendbuf, sendbuf if recvbuf is None else recvbuf, op, self)

    def broadcast(self, sendbuf: Any, recvbuf: Any = None, root: int = 0) -> Any:
        """gvq.broadcast on this communicator; recvbuf None means in place."""
        return broadcast(sendbuf, sendbuf if recvbuf is None else recvbuf, root, self)

    def reduce(self, sendbuf: Any, recvbuf: Any = None, op: Op = SUM, root: int = 0) -> Any:
        """gvq.reduce on this communicator; recvbuf None means in place."""
        return reduce(sendbuf, sendbuf if recvbuf is None else recvbuf, op, root, self)

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> Any:
        """gvq.reduce_scatter on this communicator."""
        return reduce_scatter(sendbuf, recvbuf, op, self)

    def allgather(self, sendbuf: Any, recvbuf: Any) -> Any:
        """gvq.allgather on this communicator."""
        return allgather(sendbuf, recvbuf, self)

    def send(self, buf: Any, peer: int) -> None:
        """gvq.send on this communicator."""
        send(buf, peer, self)

    def recv(self, buf: Any, peer: int) -> Any:
        """gvq.recv on this communicator."""
        return recv(buf, peer, self)

    def set_layout(self, layout: Optional[str]) -> None:
        """gvqCommSetLayoutString: the zero-code layout of a flat buffer, in GVQ_LAYOUT's syntax
        ("conv:0:64x32x3x3,fc:18432:10x512,count:23562"); None or "" removes it."""
        call("gvqCommSetLayoutString", self.handle,
             None if layout is None else layout.encode())

    def compression_stats(self, layer: int = -1) -> dict:
        """gvqCommGetCompressionStats of the zero-code calls (layer -1: all of them) as a dict."""
        st = _structs.CompressorStats()
        call("gvqCommGetCompressionStats", self.handle, int(layer), ctypes.byref(st))
        return _structs.stats_dict(st)


class Layout:
    """A zero-code layout built from the trainer's own tensors, in the order they sit in the
    flat buffer, without offset arithmetic (C: gvqLayoutAppend):

        layout = gvq.Layout.of(p.shape for p in model.parameters())   # or .conv/.fc/.other
        comm.set_layout(layout.text(flat.numel()))                    # checks the total

    A 4-d shape is a conv weight (K, D, H, W), a 2-d one an fc weight (out, in), anything else
    (biases, scalars) an "other" layer of its element count."""

    def __init__(self) -> None:
        self.entries: List[str] = []
        self.count = 0  # floats so far: where the next tensor starts

    def _add(self, kind: str, dims: Sequence[int]) -> "Layout":
        dims = [int(d) for d in dims]
        if not dims or any(d < 1 for d in dims):
            raise ValueError("layer %d (%s): dims %s must all be >= 1" %
                             (len(self.entries), kind, dims))
        self.entries.append("%s:%d:%s" % (kind, self.count, "x".join(str(d) for d in dims)))
        n = 1
        for d in dims:
            n *= d
        self.count += n
        return self

    def conv(self, k: int, d: int, h: int, w: int) -> "Layout":
        return self._add("conv", (k, d, h, w))

    def fc(self, out: int, inp: int) -> "Layout":
        return self._add("fc", (out, inp))

    def other(self, count: int) -> "Layout":
        return self._add("other", (count,))

    def add(self, shape: Sequence[int]) -> "Layout":
        """One tensor by its shape: 4-d conv, 2-d fc, else other."""
        shape = tuple(int(d) for d in shape)
        if len(shape) == 4:
            return self.conv(*shape)
        if len(shape) == 2:
            return self.fc(*shape)
        n = 1
        for d in shape:
            n *= d
        return self.other(n)

    @classmethod
    def of(cls, shapes: Iterable[Sequence[int]]) -> "Layout":
        layout = cls()
        for shape in shapes:
            layout.add(shape)
        return layout

    def text(self, total: Optional[int] = None) -> str:
        """GVQ_LAYOUT's syntax; with total (the flat buffer's length), refuses a layout whose
        tensors do not add up to it (a layout of another count would go unused)."""
        if total is not None and int(total) != self.count:
            raise ValueError("the layout's tensors add up to %d floats, the buffer holds %d" %
                             (self.count, int(total)))
        return ",".join(self.entries + ["count:%d" % self.count])

    __str__ = text


def _comm(comm: Any, func: str) -> int:
    if not isinstance(comm, Communicator):
        raise TypeError("%s: comm must be a gvq.Communicator, not %s" %
                        (func, type(comm).__name__))
    return comm.handle


def _op(op: Any, func: str) -> int:
    try:
        return int(Op(op))
    except ValueError:
        raise ValueError("%s: op %r is not a gvq.Op (SUM, PROD, MAX, MIN, AVG)" % (func, op))


def allreduce(sendbuf: Any, recvbuf: Any, op: Op, comm: Communicator) -> Any:
    """Reduces the elements of every rank's sendbuf with `op` and writes the result to every
    rank's recvbuf (gvqAllReduce). In place when recvbuf is sendbuf. Both buffers have the same
    size and dtype. Every rank receives bitwise-identical results. Blocks until done (queued
    inside gvq.group()). Returns recvbuf.

    Raises TypeError / ValueError naming the argument (not a numpy array or CPU tensor, not
    contiguous, read-only recvbuf, other dtype or size), InvalidArgument (bad op, destroyed
    comm), Timeout / RemoteError (a peer did not answer or failed), InvalidUsage (the
    communicator was aborted or is broken); each carries gvqGetLastError's text."""
    f = "gvq.allreduce"
    s = as_buffer(sendbuf, "sendbuf", f)
    r = as_buffer(recvbuf, "recvbuf", f, writable=True)
    same_kind(s, r, "sendbuf", "recvbuf", f)
    if r.count != s.count:
        raise ValueError("%s: recvbuf has %d elements, sendbuf %d" % (f, r.count, s.count))
    call("gvqAllReduce", s.ptr, r.ptr, s.count, s.dtype, _op(op, f), _comm(comm, f), None)
    return recvbuf


def broadcast(sendbuf: Any, recvbuf: Any, root: int, comm: Communicator) -> Any:
    """Copies root's sendbuf into every rank's recvbuf (gvqBroadcast). sendbuf is read on the
    root only (pass recvbuf there too elsewhere). In place when recvbuf is sendbuf. Returns
    recvbuf. Errors as gvq.allreduce, and InvalidArgument for a root out of range."""
    f = "gvq.broadcast"
    s = as_buffer(sendbuf, "sendbuf", f)
    r = as_buffer(recvbuf, "recvbuf", f, writable=True)
    same_kind(s, r, "sendbuf", "recvbuf", f)
    if r.count != s.count:
        raise ValueError("%s: recvbuf has %d elements, sendbuf %d" % (f, r.count, s.count))
    call("gvqBroadcast", s.ptr, r.ptr, r.count, r.dtype, int(root), _comm(comm, f), None)
    return recvbuf


def reduce(sendbuf: Any, recvbuf: Any, op: Op, root: int, comm: Communicator) -> Any:
    """Reduces every rank's sendbuf with `op` into root's recvbuf (gvqReduce); recvbuf is only
    written on the root and may be None elsewhere. In place when recvbuf is sendbuf. Returns
    recvbuf. Errors as gvq.allreduce, and InvalidArgument for a root out of range."""
    f = "gvq.reduce"
    s = as_buffer(sendbuf, "sendbuf", f)
    rptr = None
    if recvbuf is not None:
        r = as_buffer(recvbuf, "recvbuf", f, writable=True)
        same_kind(s, r, "sendbuf", "recvbuf", f)
        if r.count != s.count:
            raise ValueError("%s: recvbuf has %d elements, sendbuf %d" % (f, r.count, s.count))
        rptr = r.ptr
    call("gvqReduce", s.ptr, rptr, s.count, s.dtype, _op(op, f), int(root), _comm(comm, f), None)
    return recvbuf


def reduce_scatter(sendbuf: Any, recvbuf: Any, op: Op, comm: Communicator) -> Any:
    """Reduces nranks * recvbuf.size elements of every sendbuf with `op` and leaves block
    `rank` of the result (elements [rank*n, (rank+1)*n), n = recvbuf.size) in that rank's recvbuf
    (gvqReduceScatter). In place when recvbuf is that block of sendbuf. Returns recvbuf. Errors
    as gvq.allreduce."""
    f = "gvq.reduce_scatter"
    h = _comm(comm, f)
    s = as_buffer(sendbuf, "sendbuf", f)
    r = as_buffer(recvbuf, "recvbuf", f, writable=True)
    same_kind(s, r, "sendbuf", "recvbuf", f)
    if s.count != r.count * comm.size:
        raise ValueError("%s: sendbuf has %d elements, not nranks (%d) x recvbuf's %d" %
                         (f, s.count, comm.size, r.count))
    call("gvqReduceScatter", s.ptr, r.ptr, r.count, r.dtype, _op(op, f), h, None)
    return recvbuf


def allgather(sendbuf: Any, recvbuf: Any, comm: Communicator) -> Any:
    """Gathers sendbuf.size elements from every rank into every recvbuf, rank r's at element
    r * sendbuf.size (gvqAllGather). recvbuf has nranks * sendbuf.size elements. In place when
    sendbuf is block `rank` of recvbuf. Returns recvbuf. Errors as gvq.allreduce."""
    f = "gvq.allgather"
    h = _comm(comm, f)
    s = as_buffer(sendbuf, "sendbuf", f)
    r = as_buffer(recvbuf, "recvbuf", f, writable=True)
    same_kind(s, r, "sendbuf", "recvbuf", f)
    if r.count != s.count * comm.size:
        raise ValueError("%s: recvbuf has %d elements, not nranks (%d) x sendbuf's %d" %
                         (f, r.count, comm.size, s.count))
    call("gvqAllGather", s.ptr, r.ptr, s.count, s.dtype, h, None)
    return recvbuf


def send(buf: Any, peer: int, comm: Communicator) -> None:
    """Sends buf to rank `peer`, which must post a matching gvq.recv (same size and dtype)
    (gvqSend). Messages between a pair arrive in order. Outside a group it blocks until
    delivered: put a send and a receive that depend on each other inside one gvq.group()."""
    f = "gvq.send"
    b = as_buffer(buf, "buf", f)
    call("gvqSend", b.ptr, b.count, b.dtype, int(peer), _comm(comm, f), None)


def recv(buf: Any, peer: int, comm: Communicator) -> Any:
    """Receives buf.size elements from rank `peer` into buf (gvqRecv). A message of another size
    raises RemoteError. Blocking rules as gvq.send. Returns buf."""
    f = "gvq.recv"
    b = as_buffer(buf, "buf", f, writable=True)
    call("gvqRecv", b.ptr, b.count, b.dtype, int(peer), _comm(comm, f), None)
    return buf


@contextmanager
def group() -> Iterator[None]:
    """gvqGroupStart / gvqGroupEnd: the calls inside the block are queued on this thread and run
    at the end of the outermost block (collectives in call order, then all sends and receives
    together); buffers must stay alive until then. The block's end raises the first error."""
    call("gvqGroupStart")
    ok = False
    try:
        yield
        ok = True
    finally:
        if ok:
            call("gvqGroupEnd")
        else:
            _lib.lib.gvqGroupEnd()  # keep the first (Python) error
