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
time from the writer's first put to the last reader's last read. Saves
``bench/results/stream.json``.
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
    seen = 0
    for s in it:
        a = r.get("x", s, out=out) if reuse else r.get("x", s)
        assert a[1] == 1 + s % 2, (s, a[:2])
        seen += 1
    q.put(("r", time.perf_counter(), seen))


def cairn_run(mib: int, steps: int, readers: int, reuse: bool, tmp: str) -> tuple[float, int]:
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
    seen = 0
    while e.begin_step() == StepStatus.OK:
        a = out if reuse else np.empty(n)
        e.get(io.inquire_variable("x"), a)
        e.end_step()
        assert a[1] == 1 + seen % 2, (seen, a[:2])
        seen += 1
    e.close()
    q.put(("r", time.perf_counter(), seen))


def sst_run(plane: str, mib: int, steps: int, readers: int, reuse: bool, tmp: str) -> tuple[float, int]:
    n = mib << 17
    # A name of its own per run: a contact file a run left behind would be met by the next.
    path = os.path.join(tmp, f"sst-{plane}-{readers}-{int(reuse)}-{uuid.uuid4().hex[:8]}")
    return _run(_sst_writer, (plane, path, n, steps, readers), _sst_reader, (plane, path, n, steps, reuse), readers)


# ---- both ---------------------------------------------------------------------------------


def _run(writer, wargs: tuple, reader, rargs: tuple, readers: int) -> tuple[float, int]:
    """Runs the writer and the readers (spawned processes), timed from a barrier they all pass
    once ready (Cairn's readers registered on the dataset, SST's connected); the end-to-end
    seconds and the fewest steps a reader saw."""
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
    ends = [g for g in got if g[0] == "r"]
    return max(g[1] for g in ends) - t0, min(g[2] for g in ends)


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
                    for _ in range(args.repeat):
                        t, seen = cairn_run(mib, args.steps, nr, reuse, tmp)
                        assert seen == args.steps, f"a Cairn reader saw {seen} of {args.steps} steps"
                        best["cairn"] = min(best.get("cairn", float("inf")), t)
                        for plane in args.planes.split(","):
                            if plane in skipped:
                                continue
                            try:
                                t, seen = sst_run(plane, mib, args.steps, nr, reuse, tmp)
                            except Exception as e:  # noqa: BLE001 - a data plane the wheel lacks
                                skipped[plane] = str(e).splitlines()[0] if str(e) else type(e).__name__
                                continue
                            best[plane] = min(best.get(plane, float("inf")), t)
                    mb = mib * (1 << 20) * args.steps / 1e6
                    row: dict[str, Any] = {"MiB": mib, "readers": nr, "get": "get(out=)" if reuse else "get()",
                                           "cairn_MBps": mb / best["cairn"]}
                    for plane in (x for x in args.planes.split(",") if x in best):
                        row[f"sst_{plane}_MBps"] = mb / best[plane]
                        row[f"vs_sst_{plane}"] = best[plane] / best["cairn"]
                    rows.append(row)
                    print(table([row], list(row)), flush=True)
    cols = ["MiB", "readers", "get", "cairn_MBps"] + sorted({k for r in rows for k in r if k.startswith(("sst_", "vs_sst_"))})
    print(f"stream: {args.steps} steps, 1 writer, end to end (first put to last read), best of {args.repeat}")
    print(table(rows, cols))
    for plane, why in skipped.items():
        print(f"SST {plane}: not measured ({why})")
    path = save("stream", rows, {**vars(args), "skipped_planes": skipped,
                                 "baseline": "ADIOS2 SST (pip adios2), QueueLimit 2, QueueFullPolicy Block"})
    print(f"saved {path}")
