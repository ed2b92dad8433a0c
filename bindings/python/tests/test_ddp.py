"""The DDP hooks on a tiny model: weights identical on all ranks, the plain hook equal to gloo's
allreduce, asynchronous completion, and the GradiVeQ state through a checkpoint."""

import copy
import os
import socket
import threading

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gvq
import gvq.ddp


@pytest.fixture(scope="module")
def pg(mpi):
    """torch.distributed's gloo group over the mpirun ranks (torchrun is not used)."""
    if not dist.is_initialized():
        port = None
        if mpi.Get_rank() == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = mpi.bcast(port, root=0)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=mpi.Get_rank(), world_size=mpi.Get_size())
    yield
    # left initialized: destroying and re-making it in one process is fragile in torch 1.13


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)  # 1152 weights: GradiVeQ at min 1000
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.fc(torch.flatten(x, 1))


def batches(rank, steps, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return [(torch.randn(8, 1, 4, 4, generator=g), torch.randint(0, 10, (8,), generator=g))
            for _ in range(steps)]


def train(model, data):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def identical_on_all_ranks(mpi, arr):
    allv = mpi.allgather(arr.tobytes())
    return all(v == allv[0] for v in allv)


def ddp(model):
    # ~2 KB buckets, the first one too (DDP's default caps it at 1 MB): several per step
    dist._DEFAULT_FIRST_BUCKET_BYTES = 2048
    return DDP(model, bucket_cap_mb=0.002)


def make(seed=0, hook=None, comm=None, **kw):
    torch.manual_seed(seed)
    model = ddp(Tiny())
    state = None
    if hook is not None:
        state = gvq.ddp.register(model, hook, comm=comm, **kw)
    return model, state


def test_plain_hook_matches_gloo(pg, mpi, comm):
    r = mpi.Get_rank()
    ref, _ = make()
    mine, state = make(hook="plain", comm=comm)
    data = batches(r, 5)
    train(ref, data)
    train(mine, data)
    np.testing.assert_allclose(flat(mine), flat(ref), rtol=1e-5, atol=1e-6)
    assert identical_on_all_ranks(mpi, flat(mine))
    assert state.steps >= 5 * 2  # several buckets per step went through gvq
    state.close()


def test_hook_is_asynchronous(pg, mpi, comm):
    """The hook returns a future before gvq runs; gvq runs on the state's worker thread."""
    torch.manual_seed(0)
    model = ddp(Tiny())
    state = gvq.ddp.GvqHookState("plain", comm=comm)
    returned, seen = threading.Event(), []
    real = state._reduce

    def spy(key, names, buf):  # runs the gvq call only once the hook has returned
        seen.append((threading.current_thread().name, returned.wait(30)))
        return real(key, names, buf)

    def hook(st, bucket):
        returned.clear()
        fut = gvq.ddp.gvq_hook(st, bucket)
        assert isinstance(fut, torch.futures.Future)
        returned.set()
        return fut

    state._reduce = spy
    model.register_comm_hook(state, hook)
    train(model, batches(mpi.Get_rank(), 2))
    assert seen and all(name == "gvq-ddp-hook" and ok for name, ok in seen)
    state.close()


@pytest.mark.parametrize("codec", ["qsgd", "gradiveq"])
def test_compressed_hooks_keep_ranks_identical(pg, mpi, comm, codec):
    kw = dict(sample_iters=2, compressed_iters=50, vote_threshold=1.0, min_conv_elems=1000)
    if codec == "gradiveq":
        kw["rest"] = "qsgd"
    else:
        kw.pop("min_conv_elems")
    model, state = make(hook=codec, comm=comm, **kw)
    before = flat(model).copy()
    train(model, batches(mpi.Get_rank(), 6))
    w = flat(model)
    assert np.all(np.isfinite(w)) and not np.array_equal(w, before)
    assert identical_on_all_ranks(mpi, w)
    st = state.stats()
    names = list(st["compressors"])
    if codec == "gradiveq":
        conv = [s for n, s in st["compressors"].items() if s["codec"] == gvq.Codec.GRADIVEQ]
        assert len(conv) == 1 and all(s["fits"] >= 1 for s in conv), names
        assert any(s["sliceSize"] % 16 == 0 for s in conv)  # conv2's K = 16 divides L
    if comm.size > 1:
        assert st["wire_bytes"] < st["raw_bytes"]
    state.close()


def test_tracked_basis_hook_keeps_ranks_identical(pg, mpi, comm):
    """GradiVeQ with a tracked basis on the 16-bit wire through the DDP hook: each bucket's conv
    compressors run in one gvq.group() (fused), the weights train and stay identical."""
    model, state = make(hook="gradiveq", comm=comm, min_conv_elems=100, rest="qsgd",
                        basis_update=gvq.Basis.TRACK, max_dims=2, integer_bits=16)
    before = flat(model).copy()
    train(model, batches(mpi.Get_rank(), 6))
    w = flat(model)
    assert np.all(np.isfinite(w)) and not np.array_equal(w, before)
    assert identical_on_all_ranks(mpi, w)
    conv = [s for s in state.stats()["compressors"].values() if s["codec"] == gvq.Codec.GRADIVEQ]
    assert conv and all(s["iteration"] >= 1 for s in conv)
    state.close()


def test_gradiveq_state_through_checkpoint(pg, mpi, comm):
    """Saving the model and the hook state, then loading both into fresh ones, continues as the
    run that never stopped (up to the rounding of DDP's first, unrebuilt bucket layout); loading
    the model alone does not."""
    r = mpi.Get_rank()
    kw = dict(sample_iters=2, compressed_iters=50, vote_threshold=1.0, min_conv_elems=1000,
              rest="plain")
    a, sa = make(hook="gradiveq", comm=comm, **kw)
    train(a, batches(r, 4))
    ckpt = {"model": copy.deepcopy(a.state_dict()), "gvq": sa.state_dict()}
    assert list(ckpt["gvq"]["convs"]) == ["conv2.weight"]
    later = batches(r, 3, seed=1)
    train(a, later)
    b, sb = make(seed=7, hook="gradiveq", comm=comm, **kw)
    b.load_state_dict(ckpt["model"])
    sb.load_state_dict(ckpt["gvq"])
    train(b, later)
    c, sc = make(seed=7, hook="gradiveq", comm=comm, **kw)
    c.load_state_dict(ckpt["model"])
    train(c, later)
    np.testing.assert_allclose(flat(b), flat(a), rtol=1e-5, atol=1e-6)
    assert np.abs(flat(c) - flat(a)).max() > 1e-4
    sc.close()
    with pytest.raises(ValueError, match="codec"):
        s3 = gvq.ddp.GvqHookState("qsgd", comm=comm)
        try:
            s3.load_state_dict(ckpt["gvq"])
        finally:
            s3.close()
    sa.close()
    sb.close()


def test_buckets_and_convs_draw_their_own_streams(comm):
    """Each bucket's QSGD compressor and each GradiVeQ conv gets a random stream of its own
    (the config's seed plus the bucket's index, or a checksum of the conv's name): with one seed
    for all, every bucket would round its element e with the same draw (stop 52's find)."""
    state = gvq.ddp.GvqHookState("gradiveq", comm=comm, rest="qsgd", seed=7)
    try:
        b0 = gvq.ddp.BucketCompressor(comm, "qsgd", [(300,)], ["w"], {"seed": 7}, "plain", 1024,
                                      state._conv, stream=0)
        b1 = gvq.ddp.BucketCompressor(comm, "qsgd", [(300,)], ["w"], {"seed": 7}, "plain", 1024,
                                      state._conv, stream=1)
        s0, s1 = (b.parts[0][3].config.seed for b in (b0, b1))
        assert s0 != s1 and s0 == 7, (s0, s1)
        c1, c2 = state._conv("conv1.weight", (8, 1, 3, 3)), state._conv("conv2.weight", (8, 8, 3, 3))
        assert c1.config.seed != c2.config.seed
        assert state._conv("conv1.weight", (8, 1, 3, 3)) is c1  # one compressor per name
        b0.destroy()
        b1.destroy()
    finally:
        state.close()
