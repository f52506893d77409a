"""In-situ streaming, end to end, against ADIOS2's SST engine in the same run.

One writer process streams ``--steps`` steps of a 1-D float64 array of ``--mib`` MiB; ``--readers``
reader processes each read every step whole as it commits. Cairn: a fresh one-server staging
cluster started just before the job (as a job script does), the writer's ``define_queue(2,
"block")`` and the readers' ``stream(release=True)``, so no step is missed and memory stays
bounded. SST: the pip wheel's sockets data plane (``WAN``) with ``QueueLimit=2`` and
``QueueFullPolicy=Block``. The wheel has no other: asked for ``RDMA`` or ``UCX`` (``--planes``),
SST warns ``Preferred DataPlane "rdma" not found`` and uses WAN. Each is measured
with the natural call (``f.get(...)`` returning a new array each step; SST's ``get`` into a new
array) and into a reused buffer (``get(out=)``). End to end: the bytes of every step over the
time from the writer's first put to the last reader's last read. Steady: the steps after the
first ``WARMUP`` over the time from the last reader's end of step ``WARMUP - 1`` to its last
read. The natural call's first steps fault in new arrays' memory (two of them live at once in
``a = f.get(...)``), which this VM's host serves at ~2 ms per MiB the first time; the steady
column is what the same code reaches once the process has its memory, and each row keeps the
slowest reader's per-step get times and page faults (``*_get_ms``, ``*_faults``) of its last
run. Cairn and SST take turns to go first, as the run after another on this VM gets the memory
the first freed, still backed by the host. Saves ``bench/results/stream.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import tempfile
import time
import uuid
from typing import Any

import numpy as np

from .results import save, table

#: SST's data planes measured by default (the pip wheel's only one; see the module's docstring).
SST_PLANES = ("WAN",)

#: Steps left out of the steady column (the natural call's two arrays' first faults).
WARMUP = 2


class _Steps:
    """A reader's per-step record: when each step's get ended, how long it took, and the page
    faults it took (``ru_minflt``)."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.gets_ms: list[float] = []
        self.faults: list[int] = []

    def get(self, fn):
        import resource

        f0, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        a = fn()
        end = time.perf_counter()
        self.ends.append(end)
        self.gets_ms.append(round((end - t) * 1e3, 2))
        self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        return a

    def report(self, q) -> None:
        q.put(("r", self.ends[-1] if self.ends else time.perf_counter(), len(self.ends), self))


def _values(n: int, step: int) -> np.ndarray:
    a = np.arange(n, dtype="f8")
    a += step
    return a


# ---- Cairn --------------------------------------------------------------------------------


def _cairn_writer(cl: str, n: int, steps: int, ready, q) -> None:
    import cairn

    f = cairn.open("stream", "w", engine="staging", cluster=cl, timeout=60)
    f.define("x", "f8", (n,))
    f.define_queue(2, "block")
    data = [_values(n, 0), _values(n, 1)]
    ready.wait()
    t0 = time.perf_counter()
    for s in range(steps):
        with f.step(s):
            f.put("x", data[s % 2])
    f.close()
    q.put(("w", t0))


def _cairn_reader(cl: str, n: int, steps: int, reuse: bool, ready, q) -> None:
    import cairn

    r = cairn.open("stream", "r", engine="staging", cluster=cl, timeout=60)
    out = np.empty(n) if reuse else None
    it = r.stream(timeout=60, release=True)  # registered before the writer starts
    ready.wait()
    rec = _Steps()
    for s in it:
        a = rec.get(lambda: r.get("x", s, out=out) if reuse else r.get("x", s))  # noqa: B023 - called at once
        assert a[1] == 1 + s % 2, (s, a[:2])
    rec.report(q)


def cairn_run(mib: int, steps: int, readers: int, reuse: bool, tmp: str) -> Run:
    from cairn import cluster

    n = mib << 17
    c = cluster.start(os.path.join(tmp, "cluster.json"), servers=1, memory=f"{4 * mib + 256}MiB", redundancy=0)
    try:
        return _run(_cairn_writer, (str(c.file), n, steps), _cairn_reader, (str(c.file), n, steps, reuse), readers)
    finally:
        c.stop()


# ---- ADIOS2 SST ---------------------------------------------------------------------------


def _sst_writer(plane: str, path: str, n: int, steps: int, readers: int, ready, q) -> None:
    from adios2 import Adios, Mode

    io = Adios().declare_io("w")
    io.set_engine("SST")
    io.set_parameters({"DataTransport": plane, "RendezvousReaderCount": str(readers), "QueueLimit": "2",
                       "QueueFullPolicy": "Block", "OpenTimeoutSecs": "60"})
    data = [_values(n, 0), _values(n, 1)]
    v = io.define_variable("x", data[0], [n], [0], [n])
    e = io.open(path, Mode.Write)  # returns once the readers connected
    ready.wait()
    t0 = time.perf_counter()
    for s in range(steps):
        e.begin_step()
        e.put(v, data[s % 2])
        e.end_step()
    e.close()
    q.put(("w", t0))


def _sst_reader(plane: str, path: str, n: int, steps: int, reuse: bool, ready, q) -> None:
    from adios2 import Adios, Mode, StepStatus

    io = Adios().declare_io("r")
    io.set_engine("SST")
    io.set_parameters({"DataTransport": plane, "OpenTimeoutSecs": "60"})
    e = io.open(path, Mode.Read)
    out = np.empty(n) if reuse else None
    ready.wait()
    rec = _Steps()

    def get() -> np.ndarray:
        a = out if reuse else np.empty(n)
        e.get(io.inquire_variable("x"), a)
        e.end_step()
        return a

    while e.begin_step() == StepStatus.OK:
        a = rec.get(get)
        assert a[1] == 1 + (len(rec.ends) - 1) % 2, (len(rec.ends), a[:2])
    e.close()
    rec.report(q)


def sst_run(plane: str, mib: int, steps: int, readers: int, reuse: bool, tmp: str) -> Run:
    n = mib << 17
    # A name of its own per run: a contact file a run left behind would be met by the next.
    path = os.path.join(tmp, f"sst-{plane}-{readers}-{int(reuse)}-{uuid.uuid4().hex[:8]}")
    return _run(_sst_writer, (plane, path, n, steps, readers), _sst_reader, (plane, path, n, steps, reuse), readers)


# ---- both ---------------------------------------------------------------------------------


class Run:
    """One run's times: end to end, steady (see the module's docstring), the fewest steps a
    reader saw, and the slowest reader's per-step record."""

    def __init__(self, t0: float, steps: list[_Steps]) -> None:
        self.seconds = max(r.ends[-1] for r in steps) - t0
        self.steady_s = max(r.ends[-1] for r in steps) - max(r.ends[WARMUP - 1] for r in steps)
        self.seen = min(len(r.ends) for r in steps)
        self.slowest = max(steps, key=lambda r: r.ends[-1])


def _run(writer, wargs: tuple, reader, rargs: tuple, readers: int) -> Run:
    """Runs the writer and the readers (spawned processes), timed from a barrier they all pass
    once ready (Cairn's readers registered on the dataset, SST's connected)."""
    ctx = mp.get_context("spawn")
    ready, q = ctx.Barrier(readers + 1), ctx.Queue()
    ps = [ctx.Process(target=reader, args=(*rargs, ready, q)) for _ in range(readers)]
    for p in ps:
        p.start()
    ps.append(ctx.Process(target=writer, args=(*wargs, ready, q)))
    ps[-1].start()
    try:
        got = [q.get(timeout=300) for _ in ps]
    except queue.Empty:
        raise RuntimeError("a benchmark process hung for 5 minutes") from None
    finally:
        for p in ps:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    if any(p.exitcode != 0 for p in ps):
        raise RuntimeError(f"a benchmark process failed (exits {[p.exitcode for p in ps]})")
    t0 = next(g[1] for g in got if g[0] == "w")
    return Run(t0, [g[3] for g in got if g[0] == "r"])


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m cairn.bench stream", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, nargs="+", default=[64, 256], help="MiB per step")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--readers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeat", type=int, default=2, help="runs per configuration; best kept")
    p.add_argument("--planes", default=",".join(SST_PLANES), help="SST data planes tried")
    args = p.parse_args(argv)
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="cairn-stream-") as tmp:
        for mib in args.mib:
            for nr in args.readers:
                for reuse in (False, True):
                    best: dict[str, float] = {}
                    steady: dict[str, float] = {}
                    last: dict[str, Run] = {}

                    def keep(name: str, run: Run) -> None:
                        best[name] = min(best.get(name, float("inf")), run.seconds)
                        steady[name] = min(steady.get(name, float("inf")), run.steady_s)
                        last[name] = run

                    def cairn() -> None:
                        run = cairn_run(mib, args.steps, nr, reuse, tmp)
                        assert run.seen == args.steps, f"a Cairn reader saw {run.seen} of {args.steps} steps"
                        keep("cairn", run)

                    def sst() -> None:
                        for plane in args.planes.split(","):
                            if plane in skipped:
                                continue
                            try:
                                run = sst_run(plane, mib, args.steps, nr, reuse, tmp)
                            except Exception as e:  # noqa: BLE001 - a data plane the wheel lacks
                                skipped[plane] = str(e).splitlines()[0] if str(e) else type(e).__name__
                                continue
                            keep(f"sst_{plane}", run)

                    # Each goes first in turn: on this VM the run after another reuses the memory
                    # it freed, where the first pays the host's faults (module docstring).
                    for i in range(args.repeat):
                        for one in (cairn, sst) if i % 2 == 0 else (sst, cairn):
                            one()
                    mib_s = mib * (1 << 20) / 1e6
                    mb, mb_steady = mib_s * args.steps, mib_s * (args.steps - WARMUP)
                    row: dict[str, Any] = {"MiB": mib, "readers": nr, "get": "get(out=)" if reuse else "get()",
                                           "cairn_MBps": mb / best["cairn"], "cairn_steady_MBps": mb_steady / steady["cairn"]}
                    for plane in (x for x in args.planes.split(",") if f"sst_{x}" in best):
                        row[f"sst_{plane}_MBps"] = mb / best[f"sst_{plane}"]
                        row[f"vs_sst_{plane}"] = best[f"sst_{plane}"] / best["cairn"]
                        row[f"sst_{plane}_steady_MBps"] = mb_steady / steady[f"sst_{plane}"]
                        row[f"steady_vs_sst_{plane}"] = steady[f"sst_{plane}"] / steady["cairn"]
                    printed = dict(row)
                    for name, run in last.items():
                        row[f"{name}_get_ms"], row[f"{name}_faults"] = run.slowest.gets_ms, run.slowest.faults
                    rows.append(row)
                    print(table([printed], list(printed)), flush=True)
    cols = ["MiB", "readers", "get", "cairn_MBps", "cairn_steady_MBps"] + sorted(
        {k for r in rows for k in r if k.startswith(("sst_", "vs_sst_", "steady_vs_")) and not k.endswith(("_ms", "_faults"))})
    print(f"stream: {args.steps} steps, 1 writer, end to end (first put to last read) and steady (after {WARMUP} steps), "
          f"best of {args.repeat}")
    print(table(rows, cols))
    for plane, why in skipped.items():
        print(f"SST {plane}: not measured ({why})")
    path = save("stream", rows, {**vars(args), "skipped_planes": skipped,
                                 "baseline": "ADIOS2 SST (pip adios2), QueueLimit 2, QueueFullPolicy Block"})
    print(f"saved {path}")
