"""The MPI side of collective ``file`` writers (N→M aggregation, ``docs/format.md``): the Rust
engine runs the protocol and asks this module to carry its messages."""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

#: Tag of Cairn's messages, on a duplicate of the application's communicator (so they never
#: match the application's own receives).
_TAG = 7_411


class Exchange:
    """Point-to-point byte messages between the ranks of ``comm``, for ``_native.Writer``."""

    def __init__(self, comm: Any, oversubscribed: bool = False) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = comm.Dup()
        # One 8-byte offset counter per rank (aggregators' are used): members reserve room in
        # their group's file with a one-sided fetch-and-add, the aggregator taking no part.
        try:
            self._win = MPI.Win.Allocate(8, 8, comm=self._comm)
        except BaseException:
            self._comm.Free()
            raise
        self._one = np.zeros(1, np.int64)
        self._out = np.zeros(1, np.int64)
        # With more ranks than cores, a rank waiting in MPI's busy-polling receive takes the core
        # the rank it waits for needs; polling with short sleeps hands it over.
        self._poll = oversubscribed

    def send(self, dest: int, data: memoryview) -> None:
        self._comm.Send([data, self._mpi.BYTE], dest=dest, tag=_TAG)

    def recv(self, src: int) -> np.ndarray:
        status = self._mpi.Status()
        if self._poll:
            delay = 1e-5
            while not self._comm.Iprobe(source=src, tag=_TAG, status=status):
                time.sleep(delay)
                delay = min(2 * delay, 1e-3)
        else:
            self._comm.Probe(source=src, tag=_TAG, status=status)
        buf = np.empty(status.Get_count(self._mpi.BYTE), dtype=np.uint8)
        self._comm.Recv([buf, self._mpi.BYTE], source=src, tag=_TAG)
        return buf

    def start(self, at: int, ok: bool) -> bool:
        """Sets this rank's counter to ``at``; collective, so no rank reserves before it is set.
        Returns whether every rank passed ``ok`` (opened)."""
        me = self._comm.Get_rank()
        self._win.Lock(me, self._mpi.LOCK_EXCLUSIVE)
        self._win.Put(np.array([at], np.int64), me, 0)
        self._win.Unlock(me)
        return bool(self._comm.allreduce(bool(ok), op=self._mpi.LAND))

    def reserve(self, owner: int, n: int) -> int:
        """Adds ``n`` to rank ``owner``'s counter; its value before."""
        self._one[0] = n
        self._win.Lock(owner, self._mpi.LOCK_SHARED)
        self._win.Fetch_and_op(self._one, self._out, owner, 0, self._mpi.SUM)
        self._win.Unlock(owner)
        return int(self._out[0])

    def free(self) -> None:
        if self._win != self._mpi.WIN_NULL:
            self._win.Free()
        if self._comm != self._mpi.COMM_NULL:
            self._comm.Free()


def node_ids(comm: Any) -> tuple[list[int], bool]:
    """Each rank's node, as the lowest rank sharing memory with it (``MPI_Comm_split_type``), and
    whether this node runs more ranks than it has cores."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        leader = local.allreduce(comm.Get_rank(), op=MPI.MIN)
        oversubscribed = local.Get_size() > len(os.sched_getaffinity(0))
    finally:
        local.Free()
    return [int(n) for n in comm.allgather(leader)], oversubscribed
