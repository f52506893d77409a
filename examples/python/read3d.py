"""Reads the field examples/c/write3d.c wrote, with any number of MPI ranks, and checks every value.

    mpirun -n 3 python examples/python/read3d.py [name]
"""

import sys

import numpy as np
from mpi4py import MPI

import cairn

NX, NY, NZ = 101, 64, 48
comm = MPI.COMM_WORLD
name = sys.argv[1] if len(sys.argv) > 1 else "field3d"
with cairn.open(name, "r") as f:
    steps = f.steps()
    assert f.variables()["temperature"].shape == (NX, NY, NZ)
    # Each reader takes a slab along y (a different decomposition from the writers' x slabs).
    y0, y1 = comm.rank * NY // comm.size, (comm.rank + 1) * NY // comm.size
    for s in steps:
        a = f.get("temperature", step=s, offset=(0, y0, 0), count=(NX, y1 - y0, NZ))
        i, j, k = np.meshgrid(np.arange(NX), np.arange(y0, y1), np.arange(NZ), indexing="ij")
        np.testing.assert_array_equal(a, s * 1e6 + ((i * NY + j) * NZ + k))
        # The writers' trace records: (rank + s) % 3 per writer (some none), read by any rank.
        writers = len({b.writer for b in f.blocks("temperature", s)})
        for w in range(comm.rank, writers, comm.size):
            want = w * 100 + s * 10 + np.arange((w + s) % 3)
            np.testing.assert_array_equal(f.get_trace("energy", step=s, writer=w), want)
ok = comm.gather(len(steps), root=0)
if comm.rank == 0:
    print(f"Python reader: {comm.size} ranks verified {ok[0]} steps of {NX}x{NY}x{NZ}")
