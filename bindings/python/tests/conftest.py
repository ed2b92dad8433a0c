"""Shared fixtures: one gvq communicator over mpi4py's COMM_WORLD per test session.

Run under mpirun at any number of ranks, every rank running the same tests in the same order:
  mpirun -np 4 /usr/bin/python3 -m pytest -q bindings/python/tests
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mpi4py import MPI  # noqa: E402  (initializes MPI with MPI_THREAD_MULTIPLE)

import gvq  # noqa: E402


@pytest.fixture(scope="session")
def mpi():
    return MPI.COMM_WORLD


@pytest.fixture(scope="session")
def comm():
    c = gvq.Communicator.from_mpi(MPI.COMM_WORLD)
    yield c
    c.destroy()
