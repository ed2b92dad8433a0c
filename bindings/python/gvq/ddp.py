"""PyTorch DDP communication hooks over gvq: plain allreduce, QSGD and GradiVeQ.

    state = gvq.ddp.register(model, codec="gradiveq", sample_iters=20, compressed_iters=200)
    ... train ...
    torch.save({"model": model.state_dict(), "gvq": state.state_dict()}, path)   # rank 0
    state.load_state_dict(torch.load(path)["gvq"])                               # every rank

How it runs. DDP calls the hook once per gradient bucket, in bucket order, on every rank. The
hook returns at once with a torch.futures.Future and hands the bucket's flat buffer to the
state's worker thread, which runs the gvq calls in place (averaging: gvqAvg) and completes the
future; backprop meanwhile computes the next buckets, so DDP's overlap of computation and
communication is kept. One worker thread per state serializes the calls on the communicator,
so every rank issues them in the same order (gvq's rule for a communicator). ctypes releases
the GIL while a gvq call runs.

What each codec does with a bucket:
  plain     one gvqAllReduce of the whole bucket (the drop-in; equal to gloo's up to rounding).
  qsgd      one QSGD compressor over the whole bucket (codec config: qsgd_bits, qsgd_bucket...).
  gradiveq  one BucketCompressor per bucket: each conv weight (3-D or 4-D, at least
            `min_conv_elems` values) gets a GradiVeQ compressor that knows its [K][D][H][W]
            shape, so filter-collocated slicing applies; the rest of the bucket (biases, norms,
            fc weights) is packed once and goes through one plain allreduce (rest="plain") or a
            QSGD compressor (rest="qsgd"). A bucket's conv calls run in one gvq.group(): with
            basis_update=gvq.Basis.TRACK (and integer_bits=16) they fuse into one call of three
            rings, gvq's fastest setting on real gradients (perf/RESULTS.md section 6).
A conv weight's GradiVeQ compressor belongs to the parameter (known by its name in the model),
so it keeps its schedule when DDP rebuilds its buckets after the first iteration and across a
checkpoint; the QSGD compressors belong to a bucket (its index and its parameters' shapes).
state_dict()/load_state_dict() carry both through a checkpoint.
"""

import os
import queue
import threading
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .comm import AVG, Communicator, group
from .compressor import Codec, Compressor

CODECS = ("plain", "qsgd", "gradiveq")
Key = Tuple[int, Tuple[Tuple[int, ...], ...]]


class _Worker:
    """One thread running submitted jobs in submission order."""

    def __init__(self) -> None:
        self._q: "queue.Queue[Optional[Tuple[Callable[[], Any], torch.futures.Future]]]" = \
            queue.Queue()
        self._t = threading.Thread(target=self._loop, name="gvq-ddp-hook", daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                job, fut = item
                try:
                    fut.set_result(job())
                except BaseException as e:  # the future carries it to DDP's wait
                    fut.set_exception(e)
            finally:
                self._q.task_done()

    def submit(self, job: Callable[[], Any]) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        self._q.put((job, fut))
        return fut

    def flush(self) -> None:
        """Waits until every submitted job has finished."""
        self._q.join()

    def stop(self) -> None:
        self._q.put(None)
        self._t.join()


class BucketCompressor:
    """The compressors of one DDP bucket (see the module comment for the layout)."""

    def __init__(self, comm: Communicator, codec: str, shapes: List[Tuple[int, ...]],
                 names: List[str], config: Dict[str, Any], rest: str, min_conv_elems: int,
                 conv: Callable[[str, Tuple[int, ...]], Compressor], stream: int = 0) -> None:
        self.comm, self.codec = comm, codec
        # QSGD's random bits: each bucket from a stream of its own (the config's seed plus the
        # bucket's index), else every bucket rounds its element e with the same draw
        config = _with(config, seed=(int(config.get("seed", 0)) + stream) & 0x7fffffff)
        sizes = [_numel(s) for s in shapes]
        self.count = sum(sizes)
        self.parts: List[Tuple[str, int, int, Compressor]] = []  # (name, offset, count, comp)
        self.rest: List[Tuple[int, int]] = []  # (offset, count) of the packed remainder
        self.rest_comp: Optional[Compressor] = None
        self.plain_bytes = 0  # bytes of the calls made without a compressor
        if codec == "qsgd":
            self.parts.append(("flat", 0, self.count,
                               Compressor(comm, self.count, **_with(config, codec=Codec.QSGD))))
            return
        off = 0
        for i, (shape, n) in enumerate(zip(shapes, sizes)):
            if codec == "gradiveq" and len(shape) in (3, 4) and n >= min_conv_elems:
                self.parts.append((names[i], off, n, conv(names[i], tuple(shape))))
            else:
                self.rest.append((off, n))
            off += n
        nrest = sum(n for _, n in self.rest)
        if nrest and rest == "qsgd":
            qcfg = {k: v for k, v in config.items() if k.startswith("qsgd") or k == "seed"}
            self.rest_comp = Compressor(comm, nrest, codec=Codec.QSGD, **qcfg)

    def compressors(self) -> Dict[str, Compressor]:
        """The compressors this bucket owns (a conv weight's belongs to the state)."""
        out = {name: c for name, _, _, c in self.parts if self.codec == "qsgd"}
        if self.rest_comp is not None:
            out["rest"] = self.rest_comp
        return out

    def run(self, buf: torch.Tensor) -> torch.Tensor:
        """Averages the flat float32 bucket buffer over the ranks, in place."""
        if buf.numel() != self.count:
            raise ValueError("gvq.ddp: bucket buffer has %d values, its parameters %d" %
                             (buf.numel(), self.count))
        with group():  # tracked-basis convs (basis_update=Basis.TRACK) fuse into one call
            for _, off, n, comp in self.parts:
                comp.allreduce(buf[off:off + n])
        if not self.rest:
            return buf
        if len(self.rest) == 1 and self.rest_comp is None:
            off, n = self.rest[0]
            self.comm.allreduce(buf[off:off + n], op=AVG)
            self.plain_bytes += n * 4
            return buf
        packed = torch.cat([buf[off:off + n] for off, n in self.rest])
        if self.rest_comp is not None:
            self.rest_comp.allreduce(packed)
        else:
            self.comm.allreduce(packed, op=AVG)
            self.plain_bytes += packed.numel() * 4
        at = 0
        for off, n in self.rest:
            buf[off:off + n].copy_(packed[at:at + n])
            at += n
        return buf

    def destroy(self) -> None:
        for c in self.compressors().values():
            c.destroy()


def _numel(shape: Tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _with(config: Dict[str, Any], **kw: Any) -> Dict[str, Any]:
    out = dict(config)
    out.update(kw)
    return out


def _key_str(key: Key) -> str:
    return "%d:%s" % (key[0], ";".join("x".join(str(d) for d in s) for s in key[1]))


def _in_mpi_job() -> bool:
    """Whether mpirun (or a PMI) started this process: then mpi4py's world is the job."""
    return any(os.environ.get(v) for v in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"))


def _default_comm() -> Communicator:
    """The hooks' communicator when none is given: over mpi4py's world inside an MPI job, else
    from the launcher's environment (torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, srun's;
    gvqCommInitFromEnv) on the UCX transport, with no MPI at all."""
    if _in_mpi_job():
        return Communicator.from_mpi()
    return Communicator.from_env()


class GvqHookState:
    """The state of a gvq DDP hook: communicator, codec, the per-bucket compressors and the worker
    thread. codec: "plain", "qsgd" or "gradiveq"; config: gvqCompressorConfig_t keywords
    (gvq.make_config's), applied to every compressor; rest: "plain" or "qsgd" for the non-conv
    part of a GradiVeQ bucket; comm: a gvq.Communicator (default: one over mpi4py's
    COMM_WORLD, which must hold the same processes in the same rank order as DDP's group)."""

    def __init__(self, codec: str = "plain", comm: Optional[Communicator] = None,
                 rest: str = "plain", min_conv_elems: int = 1024,
                 model: Optional[torch.nn.Module] = None, **config: Any) -> None:
        if codec not in CODECS:
            raise ValueError("gvq.ddp: codec must be one of %s, not %r" % (CODECS, codec))
        if rest not in ("plain", "qsgd"):
            raise ValueError("gvq.ddp: rest must be 'plain' or 'qsgd', not %r" % (rest,))
        self.codec, self.rest, self.min_conv_elems, self.config = codec, rest, min_conv_elems, config
        self.comm = comm if comm is not None else _default_comm()
        self._own_comm = comm is None
        self.buckets: Dict[Key, BucketCompressor] = {}
        self.convs: Dict[str, Compressor] = {}
        self._saved: Dict[str, Dict[str, bytes]] = {}
        self._saved_convs: Dict[str, bytes] = {}
        self._names: Dict[int, str] = {}
        if model is not None:
            self._names = {id(p): n for n, p in model.named_parameters()}
        self.steps = 0  # buckets reduced
        self.plain_bytes = 0  # bytes of the codec "plain" calls
        self._worker = _Worker()

    # ---- the hook's work (on the worker thread) -----------------------------------------------
    def _conv(self, name: str, shape: Tuple[int, ...]) -> Compressor:
        c = self.convs.get(name)
        if c is None:
            # its own random stream (QSGD sampling, integer-wire rounding, the tracked basis's
            # first Q): the config's seed plus a checksum of the name, the same on every rank
            seed = (int(self.config.get("seed", 0)) + zlib.crc32(name.encode())) & 0x7fffffff
            c = Compressor(self.comm, _numel(shape), shape=shape,
                           **_with(self.config, codec=Codec.GRADIVEQ, seed=seed))
            if name in self._saved_convs:
                c.load(self._saved_convs.pop(name))
            self.convs[name] = c
        return c

    def _bucket(self, key: Key, names: List[str]) -> BucketCompressor:
        b = self.buckets.get(key)
        if b is None:
            # DDP rebuilt its buckets (after the first iteration): drop the stale layout's
            for old in [k for k in self.buckets if k[0] == key[0]]:
                self.buckets.pop(old).destroy()
            b = BucketCompressor(self.comm, self.codec, list(key[1]), names, self.config,
                                 self.rest, self.min_conv_elems, self._conv, stream=key[0])
            saved = self._saved.pop(_key_str(key), None)
            if saved:
                for name, comp in b.compressors().items():
                    if name in saved:
                        comp.load(saved[name])
            self.buckets[key] = b
        return b

    def _reduce(self, key: Key, names: List[str], buf: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        if self.codec == "plain":
            self.plain_bytes += buf.numel() * 4
            return self.comm.allreduce(buf, op=AVG)
        return self._bucket(key, names).run(buf)

    def submit(self, key: Key, params: List[torch.Tensor],
               buf: torch.Tensor) -> torch.futures.Future:
        names = [self._names.get(id(p), "bucket%d.%d" % (key[0], i)) for i, p in enumerate(params)]
        return self._worker.submit(lambda: self._reduce(key, names, buf))

    # ---- checkpoints and statistics -----------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """The compressors' states (bytes of gvqCompressorSave, the same on every rank) with the
        codec and config, for the model's checkpoint. Waits for the hook's calls in flight."""
        self._worker.flush()
        comps = {_key_str(k): {n: c.save() for n, c in b.compressors().items()}
                 for k, b in self.buckets.items()}
        comps.update({k: v for k, v in self._saved.items() if k not in comps})
        convs = {n: c.save() for n, c in self.convs.items()}
        convs.update({k: v for k, v in self._saved_convs.items() if k not in convs})
        return {"codec": self.codec, "rest": self.rest, "config": dict(self.config),
                "min_conv_elems": self.min_conv_elems, "compressors": comps, "convs": convs}

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        """Restores what state_dict() returned (call it on every rank before training goes on).
        Raises ValueError when the codec or config differs; a compressor's own state is checked
        by gvqCompressorLoad when its bucket is next seen."""
        for k in ("codec", "rest", "config", "min_conv_elems"):
            mine = getattr(self, k)
            if d.get(k) != mine:
                raise ValueError("gvq.ddp: checkpoint has %s=%r, this hook %r" % (k, d.get(k), mine))
        self._worker.flush()
        self._free()
        self._saved = {k: dict(v) for k, v in d["compressors"].items()}
        self._saved_convs = dict(d["convs"])

    def _free(self) -> None:
        for b in self.buckets.values():
            b.destroy()
        for c in self.convs.values():
            c.destroy()
        self.buckets, self.convs = {}, {}

    def stats(self) -> Dict[str, Any]:
        """Bytes this rank sent through gvq's compressors (wire_bytes) and what a plain fp32 ring
        would have sent (raw_bytes), summed over the buckets; per-compressor stats under
        'compressors'. Plain calls count 2(n-1)/n of their bytes on both sides."""
        self._worker.flush()
        n = self.comm.size
        plain_factor = 2.0 * (n - 1) / n if n > 1 else 0.0
        wire = raw = self.plain_bytes * plain_factor
        per: Dict[str, Dict[str, Any]] = {}
        comps = {"conv/" + n: c for n, c in self.convs.items()}
        for k, b in self.buckets.items():
            wire += b.plain_bytes * plain_factor
            raw += b.plain_bytes * plain_factor
            comps.update({"%s/%s" % (_key_str(k), n): c for n, c in b.compressors().items()})
        for name, c in comps.items():
            st = c.stats()
            wire += st["wireBytes"]
            raw += st["rawBytes"]
            per[name] = st
        return {"wire_bytes": int(wire), "raw_bytes": int(raw), "buckets": self.steps,
                "compressors": per}

    def close(self) -> None:
        """Stops the worker and frees the compressors (and the communicator it made)."""
        self._worker.flush()
        self._worker.stop()
        self._free()
        if self._own_comm:
            self.comm.destroy()


# no `from __future__ import annotations` in this file: DDP checks the annotations' objects
def gvq_hook(state: "GvqHookState",
             bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook (model.register_comm_hook(state, gvq.ddp.gvq_hook)): averages
    the bucket over the ranks through gvq with the state's codec; returns at once with a future
    that the state's worker thread completes."""
    buf = bucket.buffer()
    if buf.dtype != torch.float32:
        raise TypeError("gvq.ddp: bucket %d is %s; the gvq hook takes float32 gradients" %
                        (bucket.index(), buf.dtype))
    params = bucket.parameters()
    shapes = tuple(tuple(p.shape) for p in params)
    return state.submit((bucket.index(), shapes), params, buf)


def register(model: torch.nn.parallel.DistributedDataParallel, codec: str = "plain",
             comm: Optional[Communicator] = None, **kw: Any) -> GvqHookState:
    """Makes a GvqHookState (codec "plain", "qsgd" or "gradiveq"; keywords as GvqHookState)
    and registers gvq_hook on the DDP model with it. Returns the state."""
    state = GvqHookState(codec, comm, model=model.module, **kw)
    model.register_comm_hook(state, gvq_hook)
    return state
