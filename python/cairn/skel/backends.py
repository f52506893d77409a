"""Where a skeleton writes: Cairn (any engine its configuration names) or ADIOS2 BP5 as the
baseline. Both take the same calls from :mod:`cairn.skel.replay`; both buffer trace records in
the application and write them every ``trace_flush`` steps, as QMCPack TRACES does.

The pip ``adios2`` has no MPI, so each rank writes its own BP5 file (N→N), which is also what
Cairn's file engine does."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .._api import open as cairn_open
from .descriptor import Variable


class CairnBackend:
    """Writes through :func:`cairn.open`; traces use the writer's own buffer (``trace_flush``)."""

    def __init__(self, dataset: str, variables: list[Variable], rank: int, nranks: int, comm: Any,
                 config: str | None, overrides: dict[str, Any], trace_flush: int) -> None:
        self.dataset, self.config, self.overrides, self.rank = dataset, config, overrides, rank
        self.f = cairn_open(dataset, "w", config=config, rank=rank, nranks=nranks, comm=comm,
                            trace_flush=trace_flush, **overrides)
        for v in variables:
            if v.role != "trace":
                self.f.define(v.name, v.dtype, None if v.local else v.shape, local=v.local)
        self._step: Any = None
        self.reader: Any = None

    def begin(self, step: int) -> None:
        self._step = self.f.step(step)
        self._step.__enter__()

    def put(self, v: Variable, arr: np.ndarray, offset: list[int] | None) -> None:
        self.f.put(v.name, arr, offset)

    def trace(self, v: Variable, arr: np.ndarray) -> None:
        self.f.trace(v.name, arr)

    def flush_traces(self) -> None:
        self.f.flush_traces()

    def end(self) -> None:
        self._step.__exit__(None, None, None)

    def close(self) -> None:
        self.f.close()

    def open_reader(self) -> None:
        self.reader = cairn_open(self.dataset, "r", config=self.config, **self.overrides)

    def read_step(self, step: int, wanted: list[tuple[Variable, list[int] | None, list[int] | None]]) -> dict[tuple[str, int], np.ndarray]:
        """Reads back what this rank wrote at ``step``: {(variable, step): array}."""
        out = {}
        for v, offset, count in wanted:
            if v.role == "trace":
                out[(v.name, step)] = self.reader.get_trace(v.name, step, self.rank)
            elif v.local:
                out[(v.name, step)] = self.reader.get_local(v.name, step, self.rank)
            else:
                out[(v.name, step)] = self.reader.get(v.name, step, offset, count)
        return out

    def close_reader(self) -> None:
        self.reader.close()


class Adios2Backend:
    """ADIOS2 BP5, one file per rank. Trace records of the buffered steps are written at the
    flush step as one array plus ``<name>/counts`` (records per step)."""

    def __init__(self, path: str, rank: int) -> None:
        from adios2 import Stream

        self.path, self.rank = os.path.join(path, f"rank-{rank:06d}.bp"), rank
        os.makedirs(path, exist_ok=True)
        self.s = Stream(self.path, "w")
        self.buf: dict[str, list[tuple[int, np.ndarray]]] = {}
        self.step = -1

    def begin(self, step: int) -> None:
        self.step = step
        self.s.begin_step()

    def put(self, v: Variable, arr: np.ndarray, offset: list[int] | None) -> None:
        if v.local:
            self.s.write(v.name, arr, list(arr.shape), [0] * arr.ndim, list(arr.shape))
        else:
            assert v.shape is not None and offset is not None
            self.s.write(v.name, arr, list(v.shape), offset, list(arr.shape))

    def trace(self, v: Variable, arr: np.ndarray) -> None:
        # The application's buffer: records are copied, as the simulation reuses its arrays.
        self.buf.setdefault(v.name, []).append((self.step, arr.copy()))

    def flush_traces(self) -> None:
        for name, recs in self.buf.items():
            if not recs:
                continue
            data = np.concatenate([r for _, r in recs])
            counts = np.array([[s, len(r)] for s, r in recs], dtype=np.int64)
            self.s.write(name, data, list(data.shape), [0] * data.ndim, list(data.shape))
            self.s.write(f"{name}/counts", counts, list(counts.shape), [0, 0], list(counts.shape))
            recs.clear()

    def end(self) -> None:
        self.s.end_step()

    def close(self) -> None:
        self.s.close()

    def open_reader(self) -> None:
        from adios2 import Stream

        self.r = Stream(self.path, "r")
        self.r_steps = iter(self.r.steps())

    def read_step(self, step: int, wanted: list[tuple[Variable, list[int] | None, list[int] | None]]) -> dict[tuple[str, int], np.ndarray]:
        """Reads the next BP5 step whole (this rank's blocks): {(variable, step): array}, with
        buffered trace records under the steps they were traced at."""
        next(self.r_steps)
        have = set(self.r.available_variables())
        out = {}
        for v, offset, count in wanted:
            if v.role == "trace" and v.name in have:
                data, at = self.r.read(v.name), 0
                for s, k in self.r.read(f"{v.name}/counts"):
                    out[(v.name, int(s))] = data[at:at + k]
                    at += k
            elif v.role != "trace" and v.name in have:
                out[(v.name, step)] = self.r.read(v.name) if v.local else self.r.read(v.name, offset, count)
        return out

    def close_reader(self) -> None:
        self.r.close()
