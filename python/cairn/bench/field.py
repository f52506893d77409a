"""The workload the benchmarks share: a float64 3-D field split into x-slabs over W writer processes,
and the command-line options that size it."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
from typing import Any, Callable

import numpy as np


def shape_for(mib: int) -> tuple[int, int, int]:
    n = mib * (1 << 20) // 8 // (256 * 256)
    return (max(2, n), 256, 256)


def slab(shape, rank, nw):
    return rank * shape[0] // nw, (rank + 1) * shape[0] // nw


def data_for(shape, rank, nw) -> np.ndarray:
    x0, x1 = slab(shape, rank, nw)
    rng = np.random.default_rng(rank)
    return np.cumsum(rng.normal(size=(x1 - x0, *shape[1:])), axis=2)


def boxes(mib: int) -> tuple[tuple[int, int, int], int, Any, Any]:
    """The field's shape, its bytes, and the two read boxes: whole, and 1/8 (half along each axis)."""
    shape = shape_for(mib)
    return shape, int(np.prod(shape)) * 8, ([0, 0, 0], list(shape)), ([0, 0, 0], [n // 2 for n in shape])


def add_field_args(p: argparse.ArgumentParser, steps: int) -> None:
    """--mib, --steps, --writers and --repeat."""
    p.add_argument("--mib", type=int, default=256, help="MiB per step (whole field)")
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--writers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeat", type=int, default=2, help="runs per configuration; best kept")


def run_writers(fn: Callable[..., None], where: Any, shape, steps: int, nw: int) -> float:
    """Runs ``fn(where, shape, steps, rank, nw, barrier, queue)`` in nw spawned processes, each
    putting its elapsed seconds on the queue; returns the slowest."""
    return max(run_processes(fn, lambda r: (where, shape, steps, r, nw), nw))


def run_processes(fn: Callable[..., None], args_for: Callable[[int], tuple], n: int) -> list[Any]:
    """Runs ``fn(*args_for(rank), barrier, queue)`` in n spawned processes sharing the barrier,
    each putting one result on the queue; returns the results (in arrival order)."""
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(n), ctx.Queue()
    ps = [ctx.Process(target=fn, args=(*args_for(r), barrier, q)) for r in range(n)]
    for p in ps:
        p.start()
    got = []
    while len(got) < n:  # a process that died puts nothing: fail instead of waiting for ever
        try:
            got.append(q.get(timeout=5))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in ps):
                for p in ps:
                    p.kill()  # the others may wait for it at the barrier
                break
    for p in ps:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"{fn.__name__} exited with {p.exitcode}")
    return got
