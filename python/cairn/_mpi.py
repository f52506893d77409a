"""The MPI side of collective ``file`` writers (N→M aggregation, ``docs/format.md``): the Rust
engine runs the protocol and asks this module to carry its messages."""
from __future__ import annotations

from typing import Any

import numpy as np

#: Tag of Cairn's messages, on a duplicate of the application's communicator (so they never
#: match the application's own receives).
_TAG = 7_411


class Exchange:
    """Point-to-point byte messages between the ranks of ``comm``, for ``_native.Writer``."""

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = comm.Dup()

    def send(self, dest: int, data: memoryview) -> None:
        self._comm.Send([data, self._mpi.BYTE], dest=dest, tag=_TAG)

    def recv(self, src: int) -> np.ndarray:
        status = self._mpi.Status()
        self._comm.Probe(source=src, tag=_TAG, status=status)
        buf = np.empty(status.Get_count(self._mpi.BYTE), dtype=np.uint8)
        self._comm.Recv([buf, self._mpi.BYTE], source=src, tag=_TAG)
        return buf

    def free(self) -> None:
        if self._comm != self._mpi.COMM_NULL:
            self._comm.Free()


def node_ids(comm: Any) -> list[int]:
    """Each rank's node, as the lowest rank sharing memory with it (``MPI_Comm_split_type``)."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        leader = local.allreduce(comm.Get_rank(), op=MPI.MIN)
    finally:
        local.Free()
    return [int(n) for n in comm.allgather(leader)]
