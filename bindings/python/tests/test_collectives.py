"""Every collective against numpy, zero copy, refused arguments, and errors with gvq's text."""

import os
import tempfile

import numpy as np
import pytest
import torch

import gvq
from gvq import _structs

COUNTS = [0, 1, 7, 1000]
DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32,
          np.float64]


def data(rank, n, dtype, salt=0):
    """Small values (products of a few ranks stay exact) that differ per rank and element."""
    v = (np.arange(n) * 7 + rank * 3 + salt) % 5 + 1
    return v.astype(dtype)


def reference(op, arrays):
    a = np.stack([x.astype(np.float64) for x in arrays])
    if op == gvq.SUM:
        r = a.sum(0)
    elif op == gvq.PROD:
        r = a.prod(0)
    elif op == gvq.MAX:
        r = a.max(0)
    elif op == gvq.MIN:
        r = a.min(0)
    else:
        r = a.sum(0) / len(arrays)
    return r


def check_close(got, want, dtype, op):
    if np.issubdtype(dtype, np.integer):
        if op == gvq.AVG:
            want = np.trunc(want)
        want = want.astype(np.float64)
        if dtype in (np.int8, np.uint8):  # wraps like C
            want = want.astype(np.int64).astype(dtype).astype(np.float64)
        np.testing.assert_array_equal(got.astype(np.float64), want)
    else:
        tol = 2e-3 if dtype == np.float16 else 1e-6
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(gvq.Op))
def test_allreduce_numpy(comm, dtype, op):
    n, r = comm.size, comm.rank
    for count in COUNTS:
        want = reference(op, [data(q, count, dtype) for q in range(n)])
        x = data(r, count, dtype)
        out = np.empty_like(x)
        assert gvq.allreduce(x, out, op, comm) is out
        check_close(out, want, dtype, op)
        np.testing.assert_array_equal(x, data(r, count, dtype))  # sendbuf untouched
        comm.allreduce(x, op=op)  # in place
        check_close(x, want, dtype, op)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.bfloat16])
def test_allreduce_torch(comm, dtype):
    n = comm.size
    t = torch.arange(100, dtype=torch.float32).to(dtype) + comm.rank
    want = sum(torch.arange(100, dtype=torch.float64) + q for q in range(n))
    gvq.allreduce(t, t, gvq.SUM, comm)
    tol = 0.5 if dtype == torch.bfloat16 else 0
    assert torch.allclose(t.double(), want, atol=tol * 8, rtol=1e-2 if tol else 0)


def test_broadcast_reduce(comm):
    n, r = comm.size, comm.rank
    for root in range(n):
        x = data(r, 33, np.float32, salt=root)
        out = np.zeros_like(x)
        gvq.broadcast(x, out, root, comm)
        np.testing.assert_array_equal(out, data(root, 33, np.float32, salt=root))
        y = data(r, 33, np.int64)
        got = np.zeros_like(y) if r == root else None
        gvq.reduce(y, got, gvq.SUM, root, comm)
        if r == root:
            np.testing.assert_array_equal(got, sum(data(q, 33, np.int64) for q in range(n)))


def test_reduce_scatter_allgather(comm):
    n, r = comm.size, comm.rank
    for count in [0, 1, 5, 300]:
        x = data(r, n * count, np.float64)
        out = np.empty(count, np.float64)
        gvq.reduce_scatter(x, out, gvq.MAX, comm)
        full = reference(gvq.MAX, [data(q, n * count, np.float64) for q in range(n)])
        np.testing.assert_array_equal(out, full[r * count:(r + 1) * count])
        mine = data(r, count, np.int32)
        allg = np.empty(n * count, np.int32)
        gvq.allgather(mine, allg, comm)
        np.testing.assert_array_equal(allg, np.concatenate([data(q, count, np.int32)
                                                            for q in range(n)]))
        # in place: sendbuf is block `rank` of recvbuf
        allg2 = np.zeros(n * count, np.int32)
        allg2[r * count:(r + 1) * count] = mine
        gvq.allgather(allg2[r * count:(r + 1) * count], allg2, comm)
        np.testing.assert_array_equal(allg2, allg)


def test_send_recv_ring_in_group(comm):
    n, r = comm.size, comm.rank
    if n == 1:
        pytest.skip("send/recv needs 2 ranks")
    out = np.arange(50, dtype=np.float32) + r
    got = np.zeros(50, np.float32)
    with gvq.group():
        gvq.send(out, (r + 1) % n, comm)
        gvq.recv(got, (r - 1) % n, comm)
    np.testing.assert_array_equal(got, np.arange(50, dtype=np.float32) + (r - 1) % n)


def test_zero_copy(comm):
    """The result lands in the caller's memory: a view of a larger array, and a tensor."""
    n = comm.size
    base = np.zeros(30, np.float32)
    view = base[10:20]
    view[:] = 1
    gvq.allreduce(view, view, gvq.SUM, comm)
    assert np.all(base[10:20] == n) and np.all(base[:10] == 0) and np.all(base[20:] == 0)
    t = torch.ones(4, 8)
    ptr = t.data_ptr()
    arr = t.numpy()  # shares t's memory
    comm.allreduce(t[1], op=gvq.SUM)  # a contiguous row
    assert t.data_ptr() == ptr
    assert np.all(arr[1] == n) and np.all(arr[0] == 1)


def test_refused_buffers_name_the_argument(comm):
    x = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match="recvbuf is not C-contiguous"):
        gvq.allreduce(np.zeros(4, np.float32), x[:, 0], gvq.SUM, comm)
    with pytest.raises(ValueError, match="sendbuf is not contiguous"):
        gvq.allreduce(torch.zeros(4, 4).t(), torch.zeros(4, 4), gvq.SUM, comm)
    with pytest.raises(TypeError, match="sendbuf has dtype complex64"):
        gvq.allreduce(np.zeros(4, np.complex64), np.zeros(4, np.complex64), gvq.SUM, comm)
    with pytest.raises(TypeError, match="recvbuf is float64 but sendbuf is float32"):
        gvq.allreduce(np.zeros(4, np.float32), np.zeros(4, np.float64), gvq.SUM, comm)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="recvbuf is read-only"):
        gvq.allreduce(np.zeros(4, np.float32), ro, gvq.SUM, comm)
    with pytest.raises(TypeError, match="buf must be a numpy array or a CPU torch tensor"):
        gvq.send([1.0, 2.0], 0, comm)
    with pytest.raises(ValueError, match="recvbuf has 3 elements, sendbuf 4"):
        gvq.allreduce(np.zeros(4, np.float32), np.zeros(3, np.float32), gvq.SUM, comm)


def test_errors_carry_gvq_text(comm):
    """A gvqResult_t error becomes a Python exception with gvqGetLastError's WARN line."""
    x = np.zeros(4, np.float32)
    with pytest.raises(gvq.InvalidArgument) as e:
        gvq.broadcast(x, x, comm.size + 3, comm)  # every rank gives the same bad root
    assert e.value.name == "gvqInvalidArgument" and e.value.result == 4
    assert "root" in e.value.detail and str(comm.size + 3) in e.value.detail
    assert "invalid argument" in str(e.value)
    with pytest.raises(gvq.InvalidArgument, match="sliceSize|multiple"):
        gvq.Compressor(comm, 64 * 9, shape=(64, 1, 3, 3), slice_size=100)
    with pytest.raises(gvq.InvalidUsage, match="no open group|group"):
        gvq._lib.call("gvqGroupEnd")


def test_communicator_from_unique_id(mpi):
    c = gvq.Communicator.from_mpi_unique_id(mpi)
    assert (c.size, c.rank) == (mpi.Get_size(), mpi.Get_rank())
    x = np.ones(3, np.float64)
    c.allreduce(x)
    np.testing.assert_array_equal(x, c.size)
    c.destroy()
    with pytest.raises(ValueError, match="destroyed"):
        c.allreduce(x)


def test_compressed_allreduce_and_stats(comm, mpi):
    n, r = comm.size, comm.rank
    K, D, H, W = 16, 8, 3, 3
    count = K * D * H * W
    with gvq.Compressor(comm, count, shape=(K, D, H, W), codec=gvq.Codec.GRADIVEQ,
                        sample_iters=3, compressed_iters=10, slice_size=64, vote_threshold=1.0) as c:
        rng = np.random.default_rng(5)
        basis = rng.standard_normal((4, count)).astype(np.float32)
        for it in range(6):
            common = (rng.standard_normal(4) @ basis).astype(np.float32)
            g = common + np.float32(0.01 * r)
            want = common.astype(np.float64) + 0.01 * (n - 1) / 2
            out = np.empty_like(g)
            gvq.allreduce_compressed(g, out, gvq.AVG, c, comm)
            st = c.stats()
            if it < 3:  # sampling with codec none: exact
                np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
            allout = np.empty(n * count, np.float32)
            gvq.allgather(out, allout, comm)
            for q in range(n):  # bitwise identical on every rank
                assert np.array_equal(allout[q * count:(q + 1) * count], out)
        assert st["fits"] >= 1 and st["phase"] == gvq.Phase.COMPRESSED and st["dims"] >= 1
        assert isinstance(st["reason"], str) and (st["wireBytes"] > 0 or comm.size == 1)
        state = c.save()
        with gvq.Compressor(comm, count, shape=(K, D, H, W), codec=gvq.Codec.GRADIVEQ,
                            sample_iters=3, compressed_iters=10, slice_size=64, vote_threshold=1.0) as c2:
            c2.load(state)
            assert c2.stats()["dims"] == st["dims"]
            with pytest.raises(gvq.InvalidArgument):
                c2.load(state[:20])
        # a newcomer's load: rank 0's state, the same basis and phase on every rank
        state0 = bytearray(state)
        size = np.array([len(state0)], np.int64)
        gvq.broadcast(size, size, 0, comm)
        blob = np.frombuffer(bytes(state0), np.uint8).copy() if r == 0 else \
            np.zeros(int(size[0]), np.uint8)
        gvq.broadcast(blob, blob, 0, comm)
        with gvq.Compressor(comm, count, shape=(K, D, H, W), codec=gvq.Codec.GRADIVEQ,
                            sample_iters=3, compressed_iters=10, slice_size=64, vote_threshold=1.0) as c3:
            c3.load_shared(blob.tobytes())
            assert c3.stats()["dims"] == st["dims"] and c3.stats()["phase"] == st["phase"]
            with pytest.raises(gvq.InvalidArgument):
                c3.load_shared(blob.tobytes()[:20])
    # with error feedback the state holds this rank's residual: a plain load keeps it (the same
    # bytes saved again), a shared load does not (a residual of zeros: other bytes)
    with gvq.Compressor(comm, 1000, codec=gvq.Codec.QSGD, qsgd_bits=2, error_feedback=True) as e:
        x = np.linspace(-1, 1, 1000).astype(np.float32) * (r + 1)
        e.allreduce(x, op=gvq.AVG)
        st_e = e.save()
        for shared in (False, True):
            with gvq.Compressor(comm, 1000, codec=gvq.Codec.QSGD, qsgd_bits=2,
                                error_feedback=True) as e2:
                (e2.load_shared if shared else e2.load)(st_e)
                again = e2.save()
                assert len(again) == len(st_e) and (again != st_e) == shared
    q = gvq.Compressor(comm, 1000, codec=gvq.Codec.QSGD, qsgd_bits=4)
    x = np.linspace(-1, 1, 1000).astype(np.float32)
    q.allreduce(x, op=gvq.AVG)
    assert np.abs(x - np.linspace(-1, 1, 1000)).max() < 0.2
    assert q.stats()["ratio"] > 4
    q.destroy()
    with pytest.raises(TypeError, match="unknown field 'bogus'"):
        gvq.make_config(bogus=1)


def test_tracked_basis_grouped(comm):
    """Tracked-basis compressors inside gvq.group() run fused: identical on every rank, and
    within rounding of the same calls made one by one (fp32 wire)."""
    n = comm.size
    shapes = [(16, 4, 3, 3), (32, 8, 3, 3)]
    counts = [int(np.prod(s)) for s in shapes]

    def make():
        return [gvq.Compressor(comm, c, shape=s, codec=gvq.Codec.GRADIVEQ,
                               basis_update=gvq.Basis.TRACK, max_dims=2)
                for c, s in zip(counts, shapes)]
    grouped, single = make(), make()
    rng = np.random.default_rng(11 + comm.rank)
    for _ in range(3):
        gs = [rng.standard_normal(c).astype(np.float32) for c in counts]
        outs = [np.empty_like(g) for g in gs]
        with gvq.group():
            for c, g, o in zip(grouped, gs, outs):
                c.allreduce(g, o)
        ones = [c.allreduce(g.copy()) for c, g in zip(single, gs)]
        for o, one in zip(outs, ones):
            allout = np.empty(n * o.size, np.float32)
            gvq.allgather(o, allout, comm)
            for q in range(n):
                assert np.array_equal(allout[q * o.size:(q + 1) * o.size], o)
            np.testing.assert_allclose(o, one, rtol=1e-3, atol=1e-4)
    for c in grouped + single:
        c.destroy()


def test_struct_mirror_checked_against_header():
    """The import-time check refuses a header whose struct differs from the mirror."""
    hdr = _structs.find_header()
    assert hdr is not None and "match" in gvq.abi_check
    text = open(hdr).read()
    grown = text.replace("float efBound;", "float efBound;\n    int newField;")
    assert grown != text
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "gvq.h")
        with open(p, "w") as f:
            f.write(grown)
        with pytest.raises(ImportError, match="gvqCompressorConfig_t"):
            _structs.check_abi(p)


def test_sparse_allgatherv(comm):
    n, r = comm.size, comm.rank
    rows, dim = 50, 3
    idx = np.array([r, 7, 7, (r * 11) % rows], np.int64)
    val = (np.arange(4 * dim, dtype=np.float32).reshape(4, dim) + r)
    out = gvq.sparse_allgatherv(idx, val, rows, comm, flags=gvq.SUMMED | gvq.RAW)
    dense = np.zeros((rows, dim), np.float64)
    for q in range(n):
        iq = np.array([q, 7, 7, (q * 11) % rows])
        np.add.at(dense, iq, np.arange(4 * dim).reshape(4, dim) + q)
    nz = np.unique(np.concatenate([[q, 7, (q * 11) % rows] for q in range(n)]))
    np.testing.assert_array_equal(out.indices, nz)
    np.testing.assert_allclose(out.values, dense[nz], rtol=1e-6)
    assert out.raw_values.shape == (4 * n, dim) and list(out.rank_rows) == [4] * n
    bad = idx.copy()
    if r == 0:
        bad[0] = rows + 5
    with pytest.raises(gvq.InvalidArgument if r == 0 else gvq.RemoteError):
        gvq.sparse_allgatherv(bad, val, rows, comm)
    with pytest.raises(TypeError, match="indices must be int64"):
        gvq.sparse_allgatherv(idx.astype(np.int32), val, rows, comm)


@pytest.mark.parametrize("serve", [0, 1])
def test_parameter_server(comm, serve):
    """serve 1: a thread answers at any time; staleness 0 gives the same rows."""
    n, r = comm.size, comm.rank
    rows, dim, lr = 20, 4, 0.5
    init = np.arange(rows * dim, dtype=np.float32).reshape(rows, dim) / 10
    with gvq.ParameterServer(comm, rows, dim, np.float32, init_values=init,
                             learning_rate=lr, serve=serve) as ps:
        idx = np.array([r % rows, 3], np.int64)
        g = np.ones((2, dim), np.float32) * (r + 1)
        ps.push(idx, g)
        ps.apply()
        allidx = np.arange(rows, dtype=np.int64)
        got = np.empty((rows, dim), np.float32)
        ps.pull(allidx, got)
        want = init.astype(np.float64).copy()
        for q in range(n):
            want[q % rows] -= lr * (q + 1)
            want[3] -= lr * (q + 1)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        assert ps.stats()["pushes"] == 1
        blob = ps.save()
        ps.load(blob)
        with pytest.raises(gvq.InvalidArgument):
            ps.load(blob[:-3])


def test_layout_from_shapes(comm):
    """gvq.Layout: the layout of a flat buffer from its tensors' shapes, in buffer order."""
    shapes = [(32, 1, 5, 5), (32,), (10, 800), (10,)]
    layout = gvq.Layout.of(shapes)
    total = 32 * 25 + 32 + 8000 + 10
    assert layout.count == total
    assert layout.text(total) == ("conv:0:32x1x5x5,other:800:32,fc:832:10x800,other:8832:10,"
                                  "count:8842")
    with pytest.raises(ValueError, match="add up to 8842 floats, the buffer holds 8843"):
        layout.text(total + 1)
    with pytest.raises(ValueError, match="must all be >= 1"):
        gvq.Layout().conv(4, 0, 3, 3)
    comm.set_layout(layout.text(total))  # the library accepts it (checks dims and bounds)
    comm.set_layout(None)


def test_split(mpi, comm):
    """Communicator.split: by parity of rank (keys reversed), a duplicate, and NOCOLOR."""
    r, n = comm.rank, comm.size
    half = comm.split(r % 2, key=-r)
    mates = [q for q in range(n) if q % 2 == r % 2]
    assert half.size == len(mates) and half.rank == sorted(mates, reverse=True).index(r)
    x = np.array([float(r + 1)], dtype=np.float32)
    assert half.allreduce(x, np.zeros_like(x))[0] == float(sum(q + 1 for q in mates))
    half.destroy()
    dup = comm.split(0)
    assert dup.size == n and dup.rank == r
    dup.destroy()
    none = comm.split(gvq.Communicator.SPLIT_NOCOLOR if r == 0 else 0)
    assert (none is None) == (r == 0)
    if none is not None:
        assert none.size == n - 1
        none.destroy()
