"""The hybrid training layer (include/gvq_train.h): per-variable routing, wait-free backprop,
sufficient factors and sparse variables, from Python.

    t = gvq.train.Trainer(comm, conv_compressor=dict(codec=gvq.Codec.QSGD))
    w = t.add_variable("fc.w", gvq.train.Kind.FC, (10, 64))     # in backward order
    b = t.add_variable("fc.b", gvq.train.Kind.DENSE, (10,))
    t.commit()                                                   # collective: routes decided
    for step ...:
        t.grad_ready(w, grad_w)    # the moment backprop made it: its aggregation starts
        t.grad_ready(b, grad_b)
        t.wait_all()               # every gradient aggregated, in place

For a torch module, wait_free(module, comm) registers its parameters and hooks their gradients
as backprop produces them (the AccumulateGrad hooks Horovod uses); call .wait() before the
optimizer's step.
"""

from __future__ import annotations

import ctypes
import enum
from typing import Any, Dict, List, Optional

import numpy as np

from . import _structs
from ._buffers import FLOAT32, DTYPE_NAMES, as_buffer
from ._lib import call
from .comm import AVG, Communicator, _comm, _op, version
from .compressor import make_config
from .sparse import _indices

try:
    import torch
except ImportError:  # numpy only
    torch = None


class Kind(enum.IntEnum):
    """gvqVarKind_t."""
    CONV = 0
    FC = 1
    DENSE = 2
    SPARSE = 3


class Schedule(enum.IntEnum):
    """gvqTrainSchedule_t."""
    READY = 0
    FORWARD = 1


class Route(enum.IntEnum):
    """gvqRoute_t."""
    ALLREDUCE = 0
    BUCKET = 1
    COMPRESSED = 2
    SFB = 3
    PS = 4
    ALLGATHERV = 5


def _floats(x: Any, name: str, func: str, count: int, writable: bool):
    b = as_buffer(x, name, func, writable)
    if b.dtype != FLOAT32:
        raise TypeError("%s: %s must be float32 (got %s)" % (func, name, DTYPE_NAMES[b.dtype]))
    if count >= 0 and b.count != count:
        raise ValueError("%s: %s holds %d values, the variable %d" % (func, name, b.count, count))
    return b


def _compressor(c: Any, func: str) -> Optional[_structs.CompressorConfig]:
    if c is None or isinstance(c, _structs.CompressorConfig):
        return c
    if isinstance(c, dict):
        return make_config(**c)
    raise TypeError("%s: a compressor is a dict of gvq.make_config keywords or a config from "
                    "it, not %s" % (func, type(c).__name__))


class Trainer:
    """A training layer over comm (gvqTrainCreate). Keywords (None: the library's default):
    bucket_bytes, wait_free (bool), op (gvq.AVG or gvq.SUM), conv_compressor and fc_compressor
    (dicts of gvq.make_config keywords, or configs; the shape is filled in by the layer), sfb
    (1, 0, or None: SACP), sparse_route (a Route, or None: Parallax's rule), tune_partitions,
    schedule (Schedule.FORWARD: the negotiated order, for wait_variable in the next forward
    pass), chunk_bytes.
    Buffers handed to grad_ready / factors_ready / sparse_ready belong to the layer until
    wait_all returns (the Trainer keeps them alive until then)."""

    def __init__(self, comm: Communicator, bucket_bytes: Optional[int] = None,
                 wait_free: Optional[bool] = None, op: Any = AVG, conv_compressor: Any = None,
                 fc_compressor: Any = None, sfb: Optional[int] = None,
                 sparse_route: Optional[int] = None,
                 tune_partitions: Optional[bool] = None, schedule: Optional[int] = None,
                 chunk_bytes: Optional[int] = None) -> None:
        f = "gvq.train.Trainer"
        c = _structs.TrainConfig()
        c.size, c.magic, c.version = ctypes.sizeof(c), _structs.TRAIN_CONFIG_MAGIC, version()

        def opt_int(v: Any) -> int:
            return _structs.UNDEF_INT if v is None else int(v)

        c.bucketBytes, c.waitFree = opt_int(bucket_bytes), opt_int(wait_free)
        c.op, c.sfb = _op(op, f), opt_int(sfb)
        c.sparseRoute, c.tunePartitions = opt_int(sparse_route), opt_int(tune_partitions)
        c.schedule, c.chunkBytes = opt_int(schedule), opt_int(chunk_bytes)
        # the configs must outlive the create call only (the layer copies them)
        self._keep: List[Any] = [_compressor(conv_compressor, f), _compressor(fc_compressor, f)]
        if self._keep[0] is not None:
            c.convCompressor = ctypes.addressof(self._keep[0])
        if self._keep[1] is not None:
            c.fcCompressor = ctypes.addressof(self._keep[1])
        self.comm = comm
        h = ctypes.c_void_p()
        call("gvqTrainCreate", _comm(comm, f), ctypes.byref(c), ctypes.byref(h))
        self._h: Optional[int] = h.value
        self._counts: List[int] = []
        self._shapes: List[List[int]] = []
        self._dims: List[int] = []
        self._held: List[Any] = []  # buffers the layer may still touch (until wait_all)

    @property
    def handle(self) -> int:
        if self._h is None:
            raise ValueError("gvq.train.Trainer: used after destroy()")
        return self._h

    def add_variable(self, name: str, kind: Any, shape: Any, compressor: Any = None,
                     factors: bool = False, **sparse: Any) -> int:
        """Registers a variable (before commit, in backward order); returns its id. shape: conv
        (K, D, H, W), fc (M, N), dense (count,), sparse (rows, dim). compressor: this
        variable's codec (a dict of make_config keywords or a config; codec NONE: plain).
        sparse keywords: the parameter server's (rule, learning_rate, momentum, ...)."""
        f = "gvq.train.Trainer.add_variable"
        k = Kind(kind)
        dims = [int(x) for x in (shape if hasattr(shape, "__len__") else (shape,))]
        want = {Kind.CONV: 4, Kind.FC: 2, Kind.DENSE: 1, Kind.SPARSE: 2}[k]
        if k == Kind.CONV and 1 <= len(dims) < 4:
            dims += [1] * (4 - len(dims))  # (K, D) or (K, D, H): the rest ones
        if len(dims) != want:
            raise ValueError("%s: a %s variable's shape has %d dimension%s, not %r" %
                             (f, k.name.lower(), want, "s" if want > 1 else "", shape))
        v = _structs.TrainVariable()
        v.size, v.magic, v.version = ctypes.sizeof(v), _structs.VARIABLE_MAGIC, version()
        name_b = str(name).encode()
        v.name = name_b
        v.kind = int(k)
        for i, d in enumerate(dims):
            v.shape[i] = d
        cc = _compressor(compressor, f)
        if cc is not None:
            v.compressor = ctypes.addressof(cc)
        v.factors = 1 if factors else 0
        ps = None
        if sparse:
            from .sparse import ParameterServer
            ps = _structs.PsConfig()
            for fname, t in ps._fields_:
                if t is ctypes.c_int:
                    setattr(ps, fname, _structs.UNDEF_INT)
                elif t is ctypes.c_double:
                    setattr(ps, fname, -1.0)
            ps.size, ps.magic, ps.version = (ctypes.sizeof(ps), _structs.PS_CONFIG_MAGIC,
                                             version())
            for key, val in sparse.items():
                if key not in ParameterServer._KEYS:
                    raise TypeError("%s: unknown keyword %r (sparse: %s)" %
                                    (f, key, ", ".join(sorted(ParameterServer._KEYS))))
                setattr(ps, ParameterServer._KEYS[key], val)
            v.sparse = ctypes.addressof(ps)
        vid = ctypes.c_int()
        call("gvqTrainAddVariable", self.handle, ctypes.byref(v), ctypes.byref(vid))
        del name_b, cc, ps  # copied by the layer
        count = int(np.prod(dims))  # as the layer counts it (gvq_train.h's shape)
        self._counts.append(count)
        self._shapes.append(dims)
        self._dims.append(dims[1] if k == Kind.SPARSE and len(dims) > 1 else 1)
        return vid.value

    def commit(self) -> None:
        """Decides the routes; collective (every rank registered the same variables)."""
        call("gvqTrainCommit", self.handle)

    def _count(self, vid: int, func: str) -> int:
        if not 0 <= int(vid) < len(self._counts):
            raise ValueError("%s: id %r is not a registered variable" % (func, vid))
        return self._counts[int(vid)]

    def grad_ready(self, vid: int, grad: Any) -> None:
        """Variable vid's gradient is ready (float32, its count): its aggregation starts; the
        result is written into grad by wait_all."""
        f = "gvq.train.Trainer.grad_ready"
        b = _floats(grad, "grad", f, self._count(vid, f), True)
        self._held.append(b.obj)
        call("gvqTrainGradReady", self.handle, int(vid), b.ptr)

    def factors_ready(self, vid: int, u: Any, v: Any, grad: Any) -> None:
        """Sufficient factors of fc variable vid: u (batch x M), v (batch x N); grad (M x N)
        receives the aggregated gradient by wait_all."""
        f = "gvq.train.Trainer.factors_ready"
        g = _floats(grad, "grad", f, self._count(vid, f), True)
        shp = getattr(u, "shape", ())
        if len(shp) != 2 or len(self._shapes[int(vid)]) != 2:
            raise ValueError("%s: u must be 2-D (batch x M) of an fc variable, not of shape %r" %
                             (f, shp))
        batch, (M, N) = int(shp[0]), self._shapes[int(vid)]
        ub = _floats(u, "u", f, batch * M, False)  # C reads batch x M and batch x N floats
        vb = _floats(v, "v", f, batch * N, False)
        self._held += [ub.obj, vb.obj, g.obj]
        call("gvqTrainFactorsReady", self.handle, int(vid), ub.ptr, vb.ptr, batch, g.ptr)

    def _rows(self, vid: int, indices: Any, rows: Any, name: str, func: str, writable: bool):
        """The int64 indices and the n x dim float32 rows of sparse variable vid."""
        self._count(vid, func)
        ib = _indices(indices, "indices", func)
        return ib, _floats(rows, name, func, ib.count * self._dims[int(vid)], writable)

    def sparse_lookup(self, vid: int, indices: Any, values: Any) -> Any:
        """Rows `indices` (int64) of sparse variable vid into values (n x dim float32)."""
        ib, vb = self._rows(vid, indices, values, "values", "gvq.train.Trainer.sparse_lookup", True)
        call("gvqTrainSparseLookup", self.handle, int(vid), ib.ptr, ib.count, vb.ptr)
        return values

    def sparse_ready(self, vid: int, indices: Any, grads: Any) -> None:
        """The gradient of rows `indices` of sparse variable vid (n x dim float32)."""
        ib, gb = self._rows(vid, indices, grads, "grads", "gvq.train.Trainer.sparse_ready", False)
        self._held += [ib.obj, gb.obj]
        call("gvqTrainSparseReady", self.handle, int(vid), ib.ptr, gb.ptr, ib.count)

    def wait_variable(self, vid: int) -> None:
        """Waits until variable vid's aggregation of this step is in its buffer (wait_all still
        ends the step)."""
        call("gvqTrainWaitVariable", self.handle, int(vid))

    def wait_all(self) -> None:
        """Waits until every gradient of the step is aggregated in its buffer."""
        try:
            call("gvqTrainWaitAll", self.handle)
        finally:
            self._held.clear()

    def info(self, vid: int) -> Dict[str, Any]:
        """The route decided for variable vid, why, and its last step's timeline."""
        st = _structs.TrainVariableInfo()
        call("gvqTrainGetVariableInfo", self.handle, int(vid), ctypes.byref(st))
        d = {name: getattr(st, name) for name, _ in st._fields_}
        d["name"] = st.name.decode(errors="replace")
        d["why"] = st.why.decode(errors="replace")
        d["route"] = Route(st.route)
        d["kind"] = Kind(st.kind)
        return d

    def routes(self) -> List[Dict[str, Any]]:
        """info() of every variable, in registration order."""
        n = ctypes.c_int()
        call("gvqTrainGetVariableCount", self.handle, ctypes.byref(n))
        return [self.info(i) for i in range(n.value)]

    def save(self) -> bytes:
        """The layer's communication state (between steps), for a checkpoint."""
        n = ctypes.c_size_t()
        call("gvqTrainSave", self.handle, None, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        call("gvqTrainSave", self.handle, buf, ctypes.byref(n))
        return buf.raw[:n.value]

    def load(self, state: bytes) -> None:
        """Restores a state from save() of a layer with the same variables and config."""
        data = bytes(state)
        call("gvqTrainLoad", self.handle, data, len(data))

    def destroy(self) -> None:
        h, self._h = self._h, None
        if h is not None:
            call("gvqTrainDestroy", h)
        self._held.clear()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    def __del__(self) -> None:
        try:
            self.destroy()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


def _kind_of(p: Any) -> Kind:
    return Kind.CONV if p.dim() == 4 else Kind.FC if p.dim() == 2 else Kind.DENSE


class WaitFree:
    """A torch module's parameters on a training layer, their gradients handed over as
    backprop produces them. Made by wait_free().

    Either wait() after backward() and then the optimizer's step, or defer(update) after
    backward(): the update then runs inside the next forward pass, module by module, on each
    module's parameters as soon as their aggregation is in (gvqTrainWaitVariable), so that the
    forward pass overlaps the transfers still running (best with schedule=Schedule.FORWARD).
    update(params) gets a list of parameters whose p.grad holds the aggregated gradient. A step
    with defer():

        out = model(x)      # the last step's update, module by module
        wf.flush()          # what the forward pass did not reach; ends the last step
        opt.zero_grad()     # only now: the update read p.grad
        loss_fn(out, y).backward()
        wf.defer(update)

    A backward pass before flush() raises (its gradients would overwrite the ones waiting)."""

    def __init__(self, module: Any, comm: Communicator, **config: Any) -> None:
        if torch is None:
            raise ImportError("gvq.train.wait_free needs torch")
        params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        for name, p in params:  # checked before the collective commit
            if p.device.type != "cpu" or p.dtype != torch.float32 or p.is_sparse:
                raise TypeError("gvq.train.wait_free: parameter %s is %s on %s; the layer takes "
                                "dense float32 CPU parameters" % (name, p.dtype, p.device))
        self.trainer = Trainer(comm, **config)
        self._params = []
        self._hooks = []
        self._update: Any = None  # defer(): the update waiting for the next forward pass
        self._done: set = set()  # the variables it has updated in this forward pass
        for name, p in reversed(params):  # backward order, roughly: the last layer first
            shape = tuple(p.shape) if p.dim() in (2, 4) else (p.numel(),)
            vid = self.trainer.add_variable(name, _kind_of(p), shape)
            self._params.append((vid, p))
        self.trainer.commit()
        with torch.enable_grad():  # the graph node exists under no_grad() too
            accs = [p.expand_as(p).grad_fn.next_functions[0][0] for _, p in self._params]
        for (vid, p), acc in zip(self._params, accs):  # acc: p's AccumulateGrad node
            self._hooks.append((acc, acc.register_hook(self._hook(vid, p))))
        vids = {id(p): vid for vid, p in self._params}
        for m in module.modules():  # modules holding parameters themselves: wait, then update
            own = [(vids[id(p)], p) for p in m.parameters(recurse=False) if id(p) in vids]
            if own:
                self._hooks.append((m, m.register_forward_pre_hook(self._before(own))))

    def _before(self, own: List[Any]):
        def pre(*_: Any) -> None:
            if self._update is None:
                return
            todo = [(vid, p) for vid, p in own if vid not in self._done]
            for vid, _ in todo:
                self.trainer.wait_variable(vid)
                self._done.add(vid)
            if todo:
                self._update([p for _, p in todo])
        return pre

    def defer(self, update: Any) -> None:
        """After backward(): update(params) runs inside the next forward pass, per module, once
        that module's parameters are aggregated (instead of wait() and a step now)."""
        self._update = update
        self._done = set()

    def flush(self) -> None:
        """Completes a deferred step now: waits for the rest, updates what the forward pass
        did not reach, and ends the step (before evaluating, checkpointing, or the end)."""
        if self._update is None:
            return
        update, self._update = self._update, None
        try:
            self.trainer.wait_all()
        finally:
            rest = [p for vid, p in self._params if vid not in self._done]
            self._done = set()
        if rest:
            update(rest)

    def _hook(self, vid: int, p: Any):
        def fire(*_: Any) -> None:
            if self._update is not None:
                raise RuntimeError("gvq.train.WaitFree: backward() with a deferred update "
                                   "pending; call flush() after the forward pass, before "
                                   "zero_grad() and backward()")
            if p.grad is not None:
                if not p.grad.is_contiguous():
                    p.grad = p.grad.contiguous()
                self.trainer.grad_ready(vid, p.grad)
        return fire

    def wait(self) -> None:
        """Every parameter's gradient aggregated (averaged by default) in p.grad; call it after
        backward() and before the optimizer's step. Every parameter must have had a gradient
        in this step."""
        self.flush()
        self.trainer.wait_all()

    def routes(self) -> List[Dict[str, Any]]:
        return self.trainer.routes()

    def close(self) -> None:
        for _, h in self._hooks:
            h.remove()
        self._hooks = []
        self.trainer.destroy()


def wait_free(module: Any, comm: Communicator, **config: Any) -> WaitFree:
    """Registers module's float32 parameters on a new Trainer (keywords as Trainer's: conv
    weights are 4-D, fc weights 2-D, the rest dense) and hooks their gradients: each one's
    aggregation starts when backprop has produced it. Collective (commit)."""
    return WaitFree(module, comm, **config)
