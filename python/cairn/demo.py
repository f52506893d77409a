"""The main job: a simulation of 4 ranks writes a multi-step 3-D field (plus ragged per-rank
walkers) through ``cairn.toml``; 3 ranks then read boxes back and check them. Prints the
throughput of the I/O alone (opens, puts, step commits; gets), apart from the time spent computing
and checking the field, so the number is the engine's.
By default it starts a local 3-server staging cluster for the run and stops it at the end.
The ranks are MPI ranks under ``mpirun`` when it and mpi4py are there, else plain processes
(``--launch processes``: ``rank=``/``nranks=`` and one session for the writers).

    python -m cairn.demo [--engine staging|file] [--launch mpi|processes] [--writers 4] [--readers 3] [--steps 10] [--n 128]
                         [--config cairn.toml]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import numpy as np

import cairn
from cairn import cluster

NAME = "demo"
#: How a rank started as a plain process hands its timings to the launcher (one stdout line).
STATS = "cairn-demo-stats "


def field(step: int, x0: int, x1: int, n: int) -> np.ndarray:
    """The field's values on rows x0..x1: smooth, step-dependent, and checkable anywhere."""
    i, j, k = np.ogrid[x0:x1, 0:n, 0:n]
    return (np.sin(i * 0.05 + step) + np.cos(j * 0.07) * k * 1e-3 + step * 1000.0).astype("f8")


def writer(args: argparse.Namespace, rank: int, nranks: int, comm: Any = None) -> dict[str, float]:
    """Writes this rank's x-slab of every step; returns its I/O and computing seconds."""
    n = args.n
    x0, x1 = rank * n // nranks, (rank + 1) * n // nranks
    rng = np.random.default_rng(rank)
    if comm is not None:
        comm.Barrier()
    t0 = time.perf_counter()
    computing = 0.0
    how = {"comm": comm} if comm is not None else {"rank": rank, "nranks": nranks, "session": args.session}
    with cairn.open(NAME, "w", config=args.config, **how) as f:
        f.define("temperature", dtype="f8", shape=(n, n, n))
        f.define("walkers", dtype="f8", local=True)
        for step in range(args.steps):
            t = time.perf_counter()
            block, walkers = field(step, x0, x1, n), rng.normal(size=(int(rng.integers(50, 150)), 3))
            computing += time.perf_counter() - t
            with f.step(step):
                f.put("temperature", block, offset=(x0, 0, 0))
                f.put("walkers", walkers)
    return {"io": time.perf_counter() - t0 - computing, "computing": computing}


def reader(args: argparse.Namespace, rank: int, nranks: int, comm: Any = None) -> dict[str, float]:
    """Reads this rank's y-slab of every step and checks it; returns its I/O and checking seconds."""
    n = args.n
    if comm is not None:
        comm.Barrier()
    t0 = time.perf_counter()
    nbytes, checking = 0, 0.0
    with cairn.open(NAME, "r", config=args.config) as f:
        steps = f.steps()
        assert steps == list(range(args.steps)), steps
        # Each reader reads y-slabs (the writers wrote x-slabs): every box spans all writers.
        y0, y1 = rank * n // nranks, (rank + 1) * n // nranks
        for s in steps:
            a = f.get("temperature", step=s, offset=(0, y0, 0), count=(n, y1 - y0, n))
            t = time.perf_counter()
            np.testing.assert_array_equal(a, field(s, 0, n, n)[:, y0:y1, :])
            checking += time.perf_counter() - t
            nbytes += a.nbytes
            w = f.get_local("walkers", step=s, writer=rank % args.writers)
            assert w.ndim == 2 and w.shape[1] == 3
    return {"io": time.perf_counter() - t0 - checking, "checking": checking, "nbytes": nbytes}


def report(role: str, args: argparse.Namespace, stats: list[dict]) -> None:
    """The phase's line: the slowest rank's seconds, as the job would see them."""
    io = max(s["io"] for s in stats)
    if role == "write":
        mb = args.n**3 * 8 * args.steps / 1e6
        computing = max(s["computing"] for s in stats)
        print(f"write: {len(stats)} ranks, {args.steps} steps of {args.n}^3 f8: {mb:.0f} MB in {io:.2f} s of I/O = {mb / io:.0f} MB/s "
              f"(computing the field took {computing:.2f} s more)", flush=True)
    else:
        total, checking = sum(s["nbytes"] for s in stats), max(s["checking"] for s in stats)
        print(f"read:  {len(stats)} ranks read y-slabs of every step: {total / 1e6:.0f} MB in {io:.2f} s of I/O = "
              f"{total / 1e6 / io:.0f} MB/s (checking every value took {checking:.2f} s more)", flush=True)


def rank_main(args: argparse.Namespace) -> None:
    """One rank: under mpirun (``--rank`` absent) rank 0 reports; a plain process prints its
    timings for the launcher."""
    run = writer if args.role == "write" else reader
    if args.rank is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        stats = comm.gather(run(args, comm.rank, comm.size, comm), root=0)
        if comm.rank == 0:
            report(args.role, args, stats)
    else:
        print(STATS + json.dumps(run(args, args.rank, args.nranks)), flush=True)


def default_launch() -> str:
    """mpi when both mpirun and mpi4py are there, else plain processes."""
    return "mpi" if shutil.which("mpirun") and importlib.util.find_spec("mpi4py") else "processes"


def mpirun() -> list[str]:
    """The launcher's command before ``-n N``; exits saying what is missing."""
    exe = shutil.which("mpirun")
    if exe is None:
        sys.exit("mpirun not found: install an MPI (`make setup` installs Open MPI) or use --launch processes")
    if importlib.util.find_spec("mpi4py") is None:
        sys.exit("mpi4py is not installed: `pip install mpi4py` (needs an MPI's mpicc) or use --launch processes")
    return [exe, "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def launch(role: str, n: int, args: argparse.Namespace, common: list[str]) -> None:
    """Runs one phase's ``n`` ranks to the end: under mpirun, or as plain processes that share a
    session (writers) and whose timings this process reports."""
    cmd = [sys.executable, "-m", "cairn.demo", role, *common]
    if args.launch == "mpi":
        subprocess.run([*args.mpirun, "-n", str(n), *cmd], check=True)
        return
    session = uuid.uuid4().hex
    procs = [subprocess.Popen([*cmd, "--rank", str(r), "--nranks", str(n), "--session", session], stdout=subprocess.PIPE, text=True)
             for r in range(n)]
    outs = [p.communicate()[0] for p in procs]
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    if failed:
        sys.exit(f"demo {role} ranks {failed} failed (their errors are above)")
    stats = []
    for out in outs:
        for line in out.splitlines():
            if line.startswith(STATS):
                stats.append(json.loads(line[len(STATS):]))
            else:
                print(line)
    report(role, args, stats)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", nargs="?", choices=["write", "read"], help=argparse.SUPPRESS)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--readers", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--n", type=int, default=128, help="edge of the cubic field")
    p.add_argument("--config", help="cairn.toml (default: one for --engine in a temporary directory)")
    p.add_argument("--engine", choices=["staging", "file"], default="staging")
    p.add_argument("--launch", choices=["mpi", "processes"], default=None,
                   help="ranks under mpirun, or plain processes with rank=/nranks= (default: mpi when mpirun and mpi4py are there)")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--nranks", type=int, help=argparse.SUPPRESS)
    p.add_argument("--session", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role is not None:
        return rank_main(args)
    args.launch = args.launch or default_launch()
    args.mpirun = mpirun() if args.launch == "mpi" else None
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
            ranks = "MPI ranks (mpirun)" if args.launch == "mpi" else "ranks as plain processes"
            print(f"cairn {cairn.__version__} demo, {ranks}, config {args.config}:")
            print(open(args.config).read().strip().replace("\n", "\n  ").join(["  ", ""]), flush=True)
            common = ["--writers", str(args.writers), "--steps", str(args.steps), "--n", str(args.n), "--config", args.config]
            for role, n in (("write", args.writers), ("read", args.readers)):
                launch(role, n, args, common)
            if local is not None:
                subprocess.run([sys.executable, "-m", "cairn", "cluster", "status", "--file", str(local.file)], check=True)
            elif args.engine == "file":
                subprocess.run([sys.executable, "-m", "cairn", "ls", os.path.join(tmp, NAME)], check=True)
        finally:
            if local is not None:
                local.stop()


if __name__ == "__main__":
    main()
