"""gvq.train (include/gvq_train.h) from Python: routes, averages checked against mpi4py's
allreduce, a compressed route identical on every rank, refusals, save/load, and wait-free
backprop on a torch module checked against the average of the ranks' own gradients."""

import copy

import numpy as np
import pytest
from mpi4py import MPI

import gvq
import gvq.train as gt


def grads(rank, step, n, salt):
    g = np.random.default_rng(1000 * salt + 31 * step + rank)
    return g.standard_normal(n).astype(np.float32)


def mpi_average(mpi, x):
    out = np.empty_like(x, dtype=np.float64)
    mpi.Allreduce(x.astype(np.float64), out, op=MPI.SUM)
    return out / mpi.Get_size()


def identical(mpi, x):
    mine = np.ascontiguousarray(x).tobytes()
    return all(b == mine for b in mpi.allgather(mine))


def small_layer(comm, **config):
    t = gt.Trainer(comm, **config)
    ids = [t.add_variable("fc.w", gt.Kind.FC, (10, 64)),
           t.add_variable("fc.b", gt.Kind.DENSE, (10,)),
           t.add_variable("conv.w", gt.Kind.CONV, (8, 4, 3, 3))]
    return t, ids, [640, 10, 288]


def test_plain_routes_average(comm, mpi):
    t, ids, counts = small_layer(comm, bucket_bytes=1024)
    t.commit()
    routes = {r["name"]: r["route"] for r in t.routes()}
    assert routes == {"fc.w": gt.Route.ALLREDUCE, "fc.b": gt.Route.BUCKET,
                      "conv.w": gt.Route.ALLREDUCE}
    for step in range(3):
        mine = [grads(mpi.Get_rank(), step, n, i) for i, n in enumerate(counts)]
        bufs = [m.copy() for m in mine]
        for vid, b in zip(ids, bufs):
            t.grad_ready(vid, b)
        t.wait_all()
        for m, b in zip(mine, bufs):
            np.testing.assert_allclose(b, mpi_average(mpi, m), rtol=1e-5, atol=1e-6)
            assert identical(mpi, b)
    assert t.info(ids[0])["steps"] == 3
    t.destroy()


def test_forward_schedule_waits(comm, mpi):
    # the negotiated order, plain tensors cut into 1 KiB chunks, waited for one by one in
    # forward order (the last registered first), then the step closed
    t, ids, counts = small_layer(comm, bucket_bytes=1024, schedule=gt.Schedule.FORWARD,
                                 chunk_bytes=1024)
    t.commit()
    for step in range(3):
        mine = [grads(mpi.Get_rank(), step, n, i) for i, n in enumerate(counts)]
        bufs = [m.copy() for m in mine]
        for vid, b in zip(ids, bufs):
            t.grad_ready(vid, b)
        for vid, m, b in reversed(list(zip(ids, mine, bufs))):
            t.wait_variable(vid)
            np.testing.assert_allclose(b, mpi_average(mpi, m), rtol=1e-5, atol=1e-6)
        t.wait_all()
        assert all(identical(mpi, b) for b in bufs)
    with pytest.raises(gvq.GvqError):
        t.wait_variable(ids[0])  # not ready in this step
    t.destroy()


def test_compressed_route_identical(comm, mpi):
    t, ids, counts = small_layer(comm, conv_compressor=dict(codec=gvq.Codec.QSGD))
    t.commit()
    info = t.info(ids[2])
    assert info["route"] == gt.Route.COMPRESSED and info["codec"] == gvq.Codec.QSGD
    for step in range(2):
        bufs = [grads(mpi.Get_rank(), step, n, i) for i, n in enumerate(counts)]
        for vid, b in zip(ids, bufs):
            t.grad_ready(vid, b)
        t.wait_all()
        assert all(identical(mpi, b) for b in bufs)
    t.destroy()


def test_refusals(comm):
    t, ids, counts = small_layer(comm)
    with pytest.raises(gvq.InvalidUsage):
        t.grad_ready(ids[0], np.zeros(640, np.float32))  # before commit
    t.commit()
    with pytest.raises(TypeError):
        t.grad_ready(ids[0], np.zeros(640, np.float64))
    with pytest.raises(ValueError):
        t.grad_ready(ids[0], np.zeros(641, np.float32))
    with pytest.raises(ValueError):
        t.grad_ready(7, np.zeros(640, np.float32))
    with pytest.raises(ValueError):
        t.add_variable("x", gt.Kind.CONV, (1, 2, 3, 4, 5))
    with pytest.raises(ValueError):
        t.add_variable("x", gt.Kind.DENSE, (3, 4))  # the layer counts a dense shape[0] only
    t.destroy()
    f = gt.Trainer(comm)
    fid = f.add_variable("fc.w", gt.Kind.FC, (10, 64), factors=True)
    f.commit()
    grad = np.zeros(640, np.float32)
    with pytest.raises(ValueError):  # v must be batch x 64: C would read past a narrower one
        f.factors_ready(fid, np.zeros((4, 10), np.float32), np.zeros((4, 63), np.float32), grad)
    f.destroy()
    with pytest.raises(ValueError):
        t.wait_all()  # after destroy
    with pytest.raises(gvq.InvalidArgument):
        gt.Trainer(comm, wait_free=2)


def test_save_load(comm, mpi):
    cfg = dict(conv_compressor=dict(codec=gvq.Codec.QSGD))
    t, ids, counts = small_layer(comm, **cfg)
    t.commit()
    bufs = [grads(mpi.Get_rank(), 0, n, i) for i, n in enumerate(counts)]
    for vid, b in zip(ids, bufs):
        t.grad_ready(vid, b)
    t.wait_all()
    state = t.save()
    u, _, _ = small_layer(comm, **cfg)
    u.commit()
    u.load(state)
    assert u.info(ids[0])["steps"] == 1 and u.save() == state
    bad = bytearray(state)
    bad[len(bad) // 2] ^= 0x10
    with pytest.raises(gvq.InvalidArgument):
        u.load(bytes(bad))
    t.destroy()
    u.destroy()


torch = pytest.importorskip("torch")
nn = torch.nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))


def test_torch_deferred_update(comm, mpi):
    # the update inside the next forward pass, module by module, in the negotiated order: the
    # same parameters as wait() and the step at once, to float tolerance, identical on every rank
    torch.manual_seed(0)
    model = Tiny()
    ref = copy.deepcopy(model)
    # the reference averages with mpi4py: the layer's communicator is busy with its step from
    # the first gradient to the flush (no other blocking call on it meanwhile)
    wf = gt.wait_free(model, comm, bucket_bytes=0, schedule=gt.Schedule.FORWARD, chunk_bytes=1024)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    calls = []

    def update(params):
        calls.append(len(params))
        with torch.no_grad():
            for p in params:
                p -= 0.1 * p.grad

    g = torch.Generator().manual_seed(mpi.Get_rank())
    for step in range(4):
        x, y = torch.randn(6, 1, 4, 4, generator=g), torch.randint(0, 10, (6,), generator=g)
        out = model(x)
        wf.flush()
        for p in model.parameters():
            p.grad = None
        nn.functional.cross_entropy(out, y).backward()
        wf.defer(update)
        ropt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        for q in ref.parameters():
            q.grad.copy_(torch.from_numpy(mpi_average(mpi, q.grad.numpy()).astype(np.float32)))
        ropt.step()
    with pytest.raises(RuntimeError):  # a backward pass with the update still pending
        nn.functional.cross_entropy(model(x), y).backward()
    wf.flush()  # the forward above made the update; the failed backward left nothing behind
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6)
        assert identical(mpi, p.detach().numpy())
    assert calls[:2] == [2, 2]  # conv then fc, each with its weight and bias, in the forward
    wf.close()


def test_torch_wait_free(comm, mpi):
    torch.manual_seed(0)
    model = Tiny()
    ref = copy.deepcopy(model)
    wf = gt.wait_free(model, comm, bucket_bytes=0)
    assert [r["name"] for r in wf.routes()] == ["fc.bias", "fc.weight", "conv.bias",
                                                "conv.weight"]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(mpi.Get_rank())
    for step in range(3):
        x, y = torch.randn(6, 1, 4, 4, generator=g), torch.randint(0, 10, (6,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        wf.wait()
        ropt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            want = mpi_average(mpi, q.grad.numpy())
            np.testing.assert_allclose(p.grad.numpy(), want, rtol=1e-4, atol=1e-6)
            q.grad.copy_(p.grad)  # the reference takes the same step
        opt.step()
        ropt.step()
        for p in model.parameters():
            assert identical(mpi, p.detach().numpy())
    wf.close()
