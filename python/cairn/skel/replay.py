"""Replays an application's I/O without its computation: each rank sleeps the compute time,
writes what the descriptor says is due (outputs, checkpoints, trace records), and times it; then
it reads every step back and times that. Rank 0 gathers the per-rank timings into a report."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..exceptions import CorruptError
from .descriptor import App, Variable, box, grid


@dataclass
class Options:
    engine: str = "cairn"  # "cairn" (engine from the config) or "adios2" (BP5 baseline)
    config: str | None = None
    overrides: dict[str, Any] | None = None
    trace_flush: int = 1
    out: str = "skel-out"
    seed: int = 0
    read: bool = True
    progress: bool = False  # a bar on rank 0


def mpi_comm() -> Any:
    """MPI.COMM_WORLD when started by an MPI launcher (and mpi4py is installed), else None."""
    if not any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")):
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD


class _Data:
    """Deterministic contents for each variable: one random pool per variable, sliced per step, so
    nothing is generated inside the timed loop and reads can be checked exactly."""

    def __init__(self, app: App, rank: int, nranks: int, seed: int) -> None:
        self.counts = {n: m.counts(rank, app.steps, seed) for n, m in app.sizes.items()}
        rng = np.random.default_rng([seed, rank, 7])
        self.pool: dict[str, np.ndarray] = {}
        self.boxes: dict[str, tuple[list[int], list[int]]] = {}
        for v in app.variables:
            if v.local:
                assert v.count is not None
                most = max(self.extents(v, s)[0] for s in range(app.steps))
                rec = int(np.prod(self.extents(v, 0)[1:], dtype=np.int64))
                n = (most + 1) * rec
            else:
                assert v.shape is not None
                self.boxes[v.name] = box(v.shape, v.decomposition or grid(nranks, len(v.shape)), rank)
                n = int(np.prod(self.boxes[v.name][1], dtype=np.int64)) + 1
            raw = rng.integers(0, 1 << 16, size=n) if v.dtype.kind in "iub" else rng.normal(size=n)
            self.pool[v.name] = raw.astype(v.dtype)

    def extents(self, v: Variable, step: int) -> list[int]:
        assert v.count is not None
        return [self.counts[c][step] if isinstance(c, str) else int(c) for c in v.count]

    def block(self, v: Variable, step: int) -> tuple[np.ndarray, list[int] | None, list[int] | None]:
        """(array, offset, count) this rank writes for ``v`` at ``step``; shifted by the step so
        each step's contents differ."""
        if v.local:
            ext = self.extents(v, step)
            n = int(np.prod(ext, dtype=np.int64))
            return self.pool[v.name][step % 2:step % 2 + n].reshape(ext), None, None
        off, cnt = self.boxes[v.name]
        n = int(np.prod(cnt, dtype=np.int64))
        return self.pool[v.name][step % 2:step % 2 + n].reshape(cnt), off, cnt


def run(app: App, opts: Options, comm: Any = None) -> dict[str, Any] | None:
    """Replays ``app`` on this rank; returns the gathered report on rank 0 (None elsewhere)."""
    rank, nranks = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    run_id = uuid.uuid4().hex[:8] if rank == 0 else None
    if comm is not None:
        run_id = comm.bcast(run_id, root=0)
    dataset = f"{app.name}-{run_id}"
    data = _Data(app, rank, nranks, opts.seed)
    backend = _backend(app, opts, dataset, rank, nranks, comm)
    last = app.steps - 1
    steps = []
    if comm is not None:
        comm.Barrier()
    from tqdm import tqdm

    bar = tqdm(total=app.steps, desc=f"{app.name} steps", unit="step", disable=not (opts.progress and rank == 0), leave=False)
    t_start = time.perf_counter()
    for s in range(app.steps):
        t0 = time.perf_counter()
        if app.compute > 0:
            time.sleep(app.compute)
        t1 = time.perf_counter()
        rec = {"step": s, "compute_s": t1 - t0, "checkpoint_s": 0.0, "output_s": 0.0, "trace_s": 0.0, "bytes": 0, "checkpoint_bytes": 0}
        backend.begin(s)
        for v in app.variables:
            if v.role != "trace" and not v.due(s):
                continue
            arr, off, _ = data.block(v, s)
            ta = time.perf_counter()
            if v.role == "trace":
                backend.trace(v, arr)
            else:
                backend.put(v, arr, off)
            rec["trace_s" if v.role == "trace" else f"{v.role}_s"] += time.perf_counter() - ta
            rec["bytes"] += arr.nbytes
            if v.role == "checkpoint":
                rec["checkpoint_bytes"] += arr.nbytes
        ta = time.perf_counter()
        if (s + 1) % opts.trace_flush == 0 or s == last:
            backend.flush_traces()
        rec["trace_s"] += time.perf_counter() - ta
        ta = time.perf_counter()
        backend.end()
        rec["commit_s"] = time.perf_counter() - ta
        rec["write_s"] = time.perf_counter() - t1
        rec["checkpointed"] = any(v.role == "checkpoint" and v.due(s) for v in app.variables)
        steps.append(rec)
        bar.update()
    t_close = time.perf_counter()
    backend.close()
    close_s = time.perf_counter() - t_close
    bar.close()
    wall = time.perf_counter() - t_start
    if comm is not None:
        comm.Barrier()
    if opts.read:
        _read_back(app, backend, data, steps)
    mine = {"rank": rank, "steps": steps, "wall_s": wall, "close_s": close_s,
            "counts": data.counts}
    every = comm.gather(mine, root=0) if comm is not None else [mine]
    if rank != 0:
        return None
    return _report(app, opts, every, dataset, nranks)


def _backend(app: App, opts: Options, dataset: str, rank: int, nranks: int, comm: Any) -> Any:
    from .backends import Adios2Backend, CairnBackend

    if opts.engine == "adios2":
        return Adios2Backend(os.path.join(opts.out, "bp5", dataset), rank)
    overrides = dict(opts.overrides or {})
    return CairnBackend(dataset, app.variables, rank, nranks, comm, opts.config, overrides, opts.trace_flush)


def _read_back(app: App, backend: Any, data: _Data, steps: list[dict[str, Any]]) -> None:
    """Reads each step back (this rank's blocks), times it and checks every array exactly."""
    backend.open_reader()
    try:
        for s in range(app.steps):
            wanted = []
            for v in app.variables:
                if v.role == "trace" or v.due(s):
                    _, off, cnt = data.block(v, s)
                    wanted.append((v, off, cnt))
            t = time.perf_counter()
            got = backend.read_step(s, wanted)
            steps[s]["read_s"] = time.perf_counter() - t
            for (name, step), arr in got.items():
                v = next(x for x in app.variables if x.name == name)
                want = data.block(v, step)[0]
                if not np.array_equal(arr.reshape(want.shape) if arr.size == want.size else arr, want):
                    raise CorruptError(f"skel read-back of '{name}' at step {step} differs from what was written")
    finally:
        backend.close_reader()


def _report(app: App, opts: Options, every: list[dict[str, Any]], dataset: str, nranks: int) -> dict[str, Any]:
    """Per-step times (max over ranks: the slowest rank holds the others back) and overheads."""
    n = app.steps
    per_step = []
    for s in range(n):
        rows = [r["steps"][s] for r in every]
        per_step.append({
            "step": s,
            "write_s": max(r["write_s"] for r in rows),
            "read_s": max(r.get("read_s", 0.0) for r in rows),
            "checkpoint_s": max(r["checkpoint_s"] for r in rows),
            # A checkpoint's cost: its puts and the commit that makes it durable and visible.
            "checkpoint_total_s": max(r["checkpoint_s"] + r["commit_s"] for r in rows) if rows[0]["checkpointed"] else 0.0,
            "checkpoint_bytes": sum(r["checkpoint_bytes"] for r in rows),
            "trace_s": max(r["trace_s"] for r in rows),
            "output_s": max(r["output_s"] for r in rows),
            "bytes": sum(r["bytes"] for r in rows),
        })

    def share(key: str) -> float:
        # Per rank: time in this kind of I/O over the rank's wall time; the worst rank is reported.
        return max(100.0 * (sum(x[key] for x in r["steps"]) + (r["close_s"] if key == "write_s" else 0.0)) / r["wall_s"]
                   for r in every)

    compute = sum(r["compute_s"] for r in every[0]["steps"])
    return {
        "app": app.name,
        "source": app.source,
        "dataset": dataset,
        "engine": opts.engine if opts.engine == "adios2" else _engine_name(opts),
        "ranks": nranks,
        "steps": n,
        "trace_flush": opts.trace_flush,
        "checkpoint_every": app.checkpoint_every,
        "compute_s": compute,
        "wall_s": max(r["wall_s"] for r in every),
        "bytes": sum(x["bytes"] for x in per_step),
        "overhead_pct": share("write_s"),
        "checkpoint_overhead_pct": share("checkpoint_s"),
        "trace_overhead_pct": share("trace_s"),
        "read_s": sum(x["read_s"] for x in per_step),
        "per_step": per_step,
        "sizes": {name: [r["counts"][name] for r in every] for name in app.sizes},
    }


def _engine_name(opts: Options) -> str:
    import json

    from .. import _native
    from .._api import _overrides

    return str(json.loads(_native.config_json(opts.config, _overrides(opts.overrides or {})))["engine"])
