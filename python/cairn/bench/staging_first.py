"""The staging bench's cold column and 1-D rows (issue 45): same-node puts and natural gets as a
user meets them first. For a 1-D array and the 3-D field, on 1 and 2 servers, with 1 and 2 writer
(then reader) processes: a fresh cluster is started ``COLD_DELAY`` seconds before the job (as a job
script does), and the job's first steps are timed (cold), then its steps once released steps'
memory is recycled (warm). Readers get every kept step with the natural ``f.get(name, step)``
(a new array each time): the first get (cold) and the next ones (warm). Baselines in the same
run: as many numpy copies in parallel as writers or readers, into a reused buffer (memcpy) and
into a new array each time (``a.copy()``, which pays the same page faults a new array does).
Each time is the best of ``--repeat`` runs.

Where a cold get's time goes: a second fresh reader process gets the same steps into an ``out``
array it touched beforehand (``get_first_out``: Cairn's part of a first get, its mappings of the
server's segments included), and the first ``a.copy()`` of a fresh process (``copy_new_first``)
is what a new array's memory costs this machine the first time (on this VM, memory the host took
back after a process freed it is faulted in again at ~2 ms per MiB).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np

import cairn
from cairn import cluster

from .field import run_processes

#: Seconds between the cluster's start and the job's first put.
COLD_DELAY = 3.0

#: Steps timed cold (the first), then warm (after keep_last = 2 released steps' memory).
COLD_STEPS, WARM_STEPS = 3, 4


def _slab(n: int, rank: int, nw: int) -> tuple[int, int]:
    return rank * n // nw, (rank + 1) * n // nw


def _data(shape: tuple[int, ...], rank: int, nw: int) -> np.ndarray:
    x0, x1 = _slab(shape[0], rank, nw)
    return np.random.default_rng(rank).random((x1 - x0, *shape[1:]))


def _writer(cl: str, shape, rank: int, nw: int, barrier, q) -> None:
    a = _data(shape, rank, nw)
    x0, _ = _slab(shape[0], rank, nw)
    f = cairn.open("first", "w", engine="staging", cluster=cl, rank=rank, nranks=nw, session="first", keep_last=2)
    f.define("x", "f8", shape)
    times = []
    for s in range(COLD_STEPS + 2 + WARM_STEPS):
        barrier.wait()  # ranks of a simulation stay within a step of each other
        t = time.perf_counter()
        with f.step(s):
            f.put("x", a, offset=(x0,) + (0,) * (len(shape) - 1))
        times.append(time.perf_counter() - t)
    f.close()
    q.put(times)


def _reader(cl: str, shape, rank: int, nw: int, into: bool, barrier, q) -> None:
    x0, x1 = _slab(shape[0], rank, nw)
    f = cairn.open("first", "r", engine="staging", cluster=cl)
    steps = f.steps()
    off, cnt = (x0,) + (0,) * (len(shape) - 1), (x1 - x0, *shape[1:])
    out = np.ones(cnt) if into else None  # touched: only Cairn's part of a first get is timed
    barrier.wait()
    times = []
    for s in steps * 2:  # first gets, then the same steps again
        t = time.perf_counter()
        f.get("x", s, off, cnt, out=out)
        times.append(time.perf_counter() - t)
    q.put(times)


def _copies(a: np.ndarray, new: bool, barrier, q) -> None:
    out = np.empty_like(a)
    np.copyto(out, a)
    barrier.wait()
    times = []
    for _ in range(4):
        t = time.perf_counter()
        if new:
            _ = a.copy()
        else:
            np.copyto(out, a)
        times.append(time.perf_counter() - t)
    q.put(times)


def _run(fn: Callable[..., None], args_for: Callable[[int], tuple], nw: int) -> list[float]:
    """Per step, the slowest of ``nw`` spawned processes' times."""
    return [max(col) for col in zip(*run_processes(fn, args_for, nw))]


def measure(mib: int, tmp: str, repeat: int = 2) -> list[dict[str, Any]]:
    """The table's rows; each time is the best of ``repeat`` runs (a fresh cluster each), this
    VM stalling now and then on fresh memory."""
    rows = []
    n = mib * (1 << 20) // 8
    best = lambda old, new: new if old is None else [min(a, b) for a, b in zip(old, new)]  # noqa: E731
    for dims, shape in (("1-D", (n,)), ("3-D", (max(2, n // (256 * 256)), 256, 256))):
        for servers in (1, 2):
            for nw in (1, 2):
                put = get = into = mem = new = None
                for _ in range(repeat):
                    c = cluster.start(os.path.join(tmp, "first.json"), servers=servers,
                                      memory=f"{(4 * mib) // servers + 512}MiB", redundancy=0)
                    try:
                        time.sleep(COLD_DELAY)
                        put = best(put, _run(_writer, lambda r: (str(c.file), shape, r, nw), nw))
                        get = best(get, _run(_reader, lambda r: (str(c.file), shape, r, nw, False), nw))
                        into = best(into, _run(_reader, lambda r: (str(c.file), shape, r, nw, True), nw))
                    finally:
                        c.stop()
                    mem = best(mem, _run(_copies, lambda r: (_data(shape, r, nw), False), nw))
                    new = best(new, _run(_copies, lambda r: (_data(shape, r, nw), True), nw))
                assert put and get and into and mem and new
                mb = n * 8 / 1e6
                cold_put, warm_put = np.mean(put[:COLD_STEPS]), np.median(put[-WARM_STEPS:])
                cold_get, warm_get = np.mean(get[: len(get) // 2]), np.median(get[len(get) // 2:])
                memcpy, copy_new = np.median(mem), np.median(new)
                rows.append({"shape": dims, "servers": servers, "procs": nw,
                             "put_cold_MBps": mb / cold_put, "put_warm_MBps": mb / warm_put,
                             "get_cold_MBps": mb / cold_get, "get_warm_MBps": mb / warm_get,
                             "memcpy_MBps": mb / memcpy, "copy_new_MBps": mb / copy_new,
                             "put_cold_vs_memcpy": memcpy / cold_put, "put_warm_vs_memcpy": memcpy / warm_put,
                             "get_cold_vs_memcpy": memcpy / cold_get, "get_warm_vs_memcpy": memcpy / warm_get,
                             "get_warm_vs_copy_new": copy_new / warm_get,
                             "get_first_MBps": mb / get[0], "get_first_out_MBps": mb / into[0],
                             "copy_new_first_MBps": mb / new[0], "get_first_vs_copy_new_first": new[0] / get[0],
                             "get_first_out_vs_warm": warm_get / into[0]})
    return rows


#: The columns printed.
COLUMNS = ["shape", "servers", "procs", "put_cold_MBps", "put_warm_MBps", "get_cold_MBps", "get_warm_MBps", "memcpy_MBps",
           "copy_new_MBps", "put_cold_vs_memcpy", "put_warm_vs_memcpy", "get_cold_vs_memcpy", "get_warm_vs_memcpy",
           "get_warm_vs_copy_new", "get_first_MBps", "get_first_out_MBps", "copy_new_first_MBps", "get_first_vs_copy_new_first",
           "get_first_out_vs_warm"]
