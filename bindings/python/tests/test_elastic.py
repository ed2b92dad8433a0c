"""Communicator.shrink and grow/join (gvqCommShrink, gvqCommGrow) at every rank count: the
last rank left out, the survivors' sums exact, then the left-out rank joins again; a parameter
server committed before the shrink recovered on the shrunk and on the grown communicator with
the committed rows, bit for bit (ParameterServer.commit, ParameterServer.recover)."""

import numpy as np
import pytest

import gvq


def test_shrink_then_grow(comm, mpi):
    n, r = mpi.Get_size(), mpi.Get_rank()
    if n < 2:
        with pytest.raises(gvq.InvalidArgument):
            comm.shrink(exclude=[0])  # the caller itself
        return
    last = n - 1
    small = None
    rows, dim = 50, 3
    ps = gvq.ParameterServer(comm, rows, dim, rule=gvq.Rule.ADAGRAD, learning_rate=0.125,
                             init=1, seed=9)
    idx = np.arange(rows, dtype=np.int64)
    mine = np.ascontiguousarray(idx[r::2])
    ps.push(mine, np.full((len(mine), dim), (r + 1) / 8, np.float32))
    ps.apply()
    ps.commit()
    table = ps.pull(idx, np.empty((rows, dim), np.float32)).copy()
    ps.push(idx, np.ones((rows, dim), np.float32))  # after the commit: rolled back
    ps.apply()
    if r == last:
        ps.destroy()  # the left-out rank loses its rows
    if r != last:
        small = comm.shrink(exclude=[last])
        kept = gvq.ParameterServer.recover(ps, small, rows, dim, rule=gvq.Rule.ADAGRAD,
                                           learning_rate=0.125)
        ps.destroy()
        ps = kept
        got = ps.pull(idx, np.empty((rows, dim), np.float32))
        assert np.array_equal(got, table)
        assert small.size == n - 1 and small.rank == r
        x = np.arange(10, dtype=np.float32) + r
        y = small.allreduce(x.copy())
        want = sum(np.arange(10, dtype=np.float32) + p for p in range(n - 1))
        assert np.array_equal(y, want)
    uid = gvq.get_unique_id() if r == 0 else None
    uid = mpi.bcast(uid, root=0)
    if r != last:
        big = small.grow(n, uid)
    else:
        big = gvq.Communicator.join(n, uid, last)
    try:
        assert big.size == n and big.rank == r
        x = np.full(5, r + 1, dtype=np.int32)
        assert np.array_equal(big.allreduce(x.copy()), np.full(5, n * (n + 1) // 2, np.int32))
        grown = gvq.ParameterServer.recover(ps if r != last else None, big, rows, dim,
                                            rule=gvq.Rule.ADAGRAD, learning_rate=0.125)
        got = grown.pull(idx, np.empty((rows, dim), np.float32))
        grown.destroy()
        assert np.array_equal(got, table)
    finally:
        if r != last:
            ps.destroy()
        big.destroy()
        if small is not None:
            small.destroy()
