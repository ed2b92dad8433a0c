"""Communicator.shrink and grow/join (gvqCommShrink, gvqCommGrow) at every rank count: the
last rank left out, the survivors' sums exact, then the left-out rank joins again."""

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
    if r != last:
        small = comm.shrink(exclude=[last])
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
    finally:
        big.destroy()
        if small is not None:
            small.destroy()
