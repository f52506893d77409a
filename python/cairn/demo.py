"""The main job: a simulation of 4 MPI ranks writes a multi-step 3-D field (plus ragged per-rank
walkers) through ``cairn.toml``; 3 MPI ranks then read boxes back and check them. Prints the
throughput of the I/O alone (opens, puts, step commits; gets), apart from the time spent computing
and checking the field, so the number is the engine's.
By default it starts a local 3-server staging cluster for the run and stops it at the end.

    python -m cairn.demo [--engine staging|file] [--writers 4] [--readers 3] [--steps 10] [--n 128] [--config cairn.toml]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import cairn
from cairn import cluster

NAME = "demo"


def field(step: int, x0: int, x1: int, n: int) -> np.ndarray:
    """The field's values on rows x0..x1: smooth, step-dependent, and checkable anywhere."""
    i, j, k = np.ogrid[x0:x1, 0:n, 0:n]
    return (np.sin(i * 0.05 + step) + np.cos(j * 0.07) * k * 1e-3 + step * 1000.0).astype("f8")


def writer(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n = args.n
    x0, x1 = comm.rank * n // comm.size, (comm.rank + 1) * n // comm.size
    rng = np.random.default_rng(comm.rank)
    comm.Barrier()
    t0 = time.perf_counter()
    computing = 0.0
    with cairn.open(NAME, "w", config=args.config, comm=comm) as f:
        f.define("temperature", dtype="f8", shape=(n, n, n))
        f.define("walkers", dtype="f8", local=True)
        for step in range(args.steps):
            t = time.perf_counter()
            block, walkers = field(step, x0, x1, n), rng.normal(size=(int(rng.integers(50, 150)), 3))
            computing += time.perf_counter() - t
            with f.step(step):
                f.put("temperature", block, offset=(x0, 0, 0))
                f.put("walkers", walkers)
    io = comm.reduce(time.perf_counter() - t0 - computing, op=MPI.MAX)
    computing = comm.reduce(computing, op=MPI.MAX)
    if comm.rank == 0:
        mb = n**3 * 8 * args.steps / 1e6
        print(f"write: {comm.size} ranks, {args.steps} steps of {n}^3 f8: {mb:.0f} MB in {io:.2f} s of I/O = {mb / io:.0f} MB/s "
              f"(computing the field took {computing:.2f} s more)")


def reader(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n = args.n
    comm.Barrier()
    t0 = time.perf_counter()
    nbytes, checking = 0, 0.0
    with cairn.open(NAME, "r", config=args.config) as f:
        steps = f.steps()
        assert steps == list(range(args.steps)), steps
        # Each reader reads y-slabs (the writers wrote x-slabs): every box spans all writers.
        y0, y1 = comm.rank * n // comm.size, (comm.rank + 1) * n // comm.size
        for s in steps:
            a = f.get("temperature", step=s, offset=(0, y0, 0), count=(n, y1 - y0, n))
            t = time.perf_counter()
            np.testing.assert_array_equal(a, field(s, 0, n, n)[:, y0:y1, :])
            checking += time.perf_counter() - t
            nbytes += a.nbytes
            w = f.get_local("walkers", step=s, writer=comm.rank % args.writers)
            assert w.ndim == 2 and w.shape[1] == 3
    io = comm.reduce(time.perf_counter() - t0 - checking, op=MPI.MAX)
    checking = comm.reduce(checking, op=MPI.MAX)
    total = comm.reduce(nbytes, op=MPI.SUM)
    if comm.rank == 0:
        print(f"read:  {comm.size} ranks read y-slabs of every step: {total / 1e6:.0f} MB in {io:.2f} s of I/O = "
              f"{total / 1e6 / io:.0f} MB/s (checking every value took {checking:.2f} s more)")


def mpirun(n: int) -> list[str]:
    exe = shutil.which("mpirun")
    if exe is None:
        sys.exit("mpirun not found: run `make setup` (installs Open MPI) first")
    extra = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return [exe, *extra, "-n", str(n)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", nargs="?", choices=["write", "read"], help=argparse.SUPPRESS)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--readers", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--n", type=int, default=128, help="edge of the cubic field")
    p.add_argument("--config", help="cairn.toml (default: one for --engine in a temporary directory)")
    p.add_argument("--engine", choices=["staging", "file"], default="staging")
    args = p.parse_args()
    if args.role == "write":
        return writer(args)
    if args.role == "read":
        return reader(args)
    with tempfile.TemporaryDirectory(prefix="cairn-demo-") as tmp:
        local = None
        if args.config is None:
            args.config = os.path.join(tmp, "cairn.toml")
            if args.engine == "staging":
                local = cluster.start(os.path.join(tmp, "cluster.json"), servers=3, memory="2GiB")
                text = f'engine = "staging"\n\n[staging]\ncluster = "{local.file}"\n'
            else:
                text = f'engine = "file"\n\n[file]\npath = "{tmp}"\n'
            with open(args.config, "w") as fh:
                fh.write(text)
        try:
            print(f"cairn {cairn.__version__} demo, config {args.config}:")
            print(open(args.config).read().strip().replace("\n", "\n  ").join(["  ", ""]))
            common = ["--writers", str(args.writers), "--steps", str(args.steps), "--n", str(args.n), "--config", args.config]
            for role, n in (("write", args.writers), ("read", args.readers)):
                subprocess.run([*mpirun(n), sys.executable, "-m", "cairn.demo", role, *common], check=True)
            if local is not None:
                subprocess.run([sys.executable, "-m", "cairn", "cluster", "status", "--file", str(local.file)], check=True)
            elif args.engine == "file":
                subprocess.run([sys.executable, "-m", "cairn", "ls", os.path.join(tmp, NAME)], check=True)
        finally:
            if local is not None:
                local.stop()

if __name__ == "__main__":
    main()
