"""A driver's side of database-assisted distribution: maps tasks over an engine in one of two
modes, retries missing results in rounds, and commits steps with an explicit marker.

- ``runtime`` mode: inputs and results travel through the engine; the driver's state lives in
  its memory (the paper's baseline). A rerun starts at step 0.
- ``database`` mode: the engine carries only tags (store URL, task key, result key). Tasks read
  their input from the store and write their result next to it. The driver commits each step's
  state followed by a marker key, so a rerun resumes after the last marker and re-reads results
  that finished before a crash instead of recomputing them.

Keys, under the run's name ``R``: ``R/params``, ``R/commit/{t}`` (the marker: names, dtypes,
shapes and checksums of the state), ``R/state/{t}/{name}``, ``R/task/{t}/{phase}/{i}`` and
``R/result/{t}/{phase}/{i}`` (the input's digest and the output; a result whose digest does not
match the current input is stale and recomputed).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..exceptions import CairnError, ConfigError, CorruptError
from .executors import Executor
from .stores import Store, open_store

MODES = ("database", "runtime")


class TaskError(CairnError):
    """Tasks still failed after every retry round."""


class InjectedFault(RuntimeError):
    """A task skipped on purpose (fault injection for tests and benchmarks)."""


@dataclass
class MapInfo:
    """What one :meth:`TaskRun.map` did."""

    tasks: int = 0
    #: Indices of tasks whose result an earlier attempt left, re-read instead of recomputed
    #: (database mode).
    recovered: list[int] = field(default_factory=list)
    #: Task executions that produced a result in this call.
    executed: int = 0
    #: Executions that failed or returned nothing (then retried).
    failed: int = 0
    rounds: int = 0
    errors: list[str] = field(default_factory=list)


def _digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


#: Environment variable naming a file each database-mode task appends its result key to once the
#: result is in the store: how a harness that kills a run knows which results survive it.
DONE_LOG = "CAIRN_TASKS_DONE_LOG"

_worker_stores: dict[str, Store] = {}


def _worker_store(url: str) -> Store:
    s = _worker_stores.get(url)
    if s is None:
        s = _worker_stores[url] = open_store(url)
    return s


def _db_task(tag: tuple[str, Callable[[Any], Any], str, str, bool]) -> bool:
    """Database mode, on a worker: read the input, compute, write the result. Returns a flag only."""
    url, fn, task_key, result_key, skip = tag
    store = _worker_store(url)
    raw = store.get(task_key)
    if raw is None:
        raise TaskError(f"task input {task_key} is missing from the store at {url}")
    if skip:
        return False
    store.put(result_key, pickle.dumps((_digest(raw), fn(pickle.loads(raw))), protocol=5))
    done = os.environ.get(DONE_LOG)
    if done:
        with open(done, "a") as fh:  # one short O_APPEND write: lines from concurrent workers stay whole
            fh.write(result_key + "\n")
    return True


def _runtime_task(arg: tuple[Callable[[Any], Any], Any, bool]) -> Any:
    fn, inp, skip = arg
    if skip:
        raise InjectedFault("task skipped by fault injection")
    return fn(inp)


class TaskRun:
    """One named run of a driver on a store and an engine.

    ``inject_faults``: in each map's first round, tasks with index % 4 == 1 return without doing
    their work (as the original's SAFE_PSEUDOFAULTS), so the retry rounds are exercised.
    """

    def __init__(self, store: Store, run: str, mode: str = "database", executor: Executor | None = None,
                 max_rounds: int = 5, inject_faults: bool = False):
        if mode not in MODES:
            raise ConfigError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
        if executor is None:
            raise ConfigError("TaskRun needs an executor (cairn.tasks.executors.make('process' or 'dask'))")
        self.store, self.run, self.mode, self.executor = store, run, mode, executor
        self.max_rounds, self.inject_faults = max_rounds, inject_faults
        #: Task and result keys written per uncommitted step, and state names per committed step:
        #: what commit deletes.
        self._written: dict[int, list[str]] = {}
        self._names: dict[int, list[str]] = {}

    @property
    def durable(self) -> bool:
        """Whether steps are committed to the store (database mode)."""
        return self.mode == "database"

    def _key(self, *parts: object) -> str:
        return "/".join([self.run, *map(str, parts)])

    def check_params(self, params: dict[str, Any]) -> None:
        """Records the run's parameters, or checks them against the recorded ones: resuming a run
        with other parameters would mix two computations."""
        key, mine = self._key("params"), json.dumps(params, sort_keys=True)
        old = self.store.get(key)
        if old is None:
            self.store.put(key, mine.encode())
        elif old.decode() != mine:
            theirs = json.loads(old)
            diff = {k: (theirs.get(k), v) for k, v in params.items() if theirs.get(k) != v}
            raise ConfigError(f"run {self.run!r} in this store was started with other parameters {diff} (stored, given); "
                              "resume with the same ones, or use another --out / run name")

    def resume_point(self, steps: int) -> int:
        """The first of steps 0..steps-1 without a commit marker (``steps`` when all are); 0 in
        runtime mode."""
        if not self.durable or steps == 0:
            return 0
        marks = self.store.get_many([self._key("commit", t) for t in range(steps)])
        return next((t for t, m in enumerate(marks) if m is None), steps)

    def commit(self, step: int, state: dict[str, np.ndarray]) -> None:
        """Makes ``state`` the committed state after ``step``: the arrays first, then the marker.
        A crash before the marker leaves the step uncommitted (its arrays are rewritten on
        rerun). The step's task keys are dropped after. A no-op in runtime mode."""
        if not self.durable:
            return
        items, meta = [], {}
        for name, a in state.items():
            a = np.ascontiguousarray(a)
            raw = a.tobytes()
            meta[name] = {"dtype": a.dtype.str, "shape": list(a.shape), "crc": zlib.crc32(raw)}
            items.append((self._key("state", step, name), raw))
        self.store.put_many(items)
        self.store.put(self._key("commit", step), json.dumps({"step": step, "state": meta}).encode())
        self._names[step] = list(meta)
        # Deleting the keys by name: a prefix delete visits every key in the store, memo included.
        self.store.delete_many(self._written.pop(step, []))
        if step > 0:
            prev = self._names.pop(step - 1, None)
            if prev is None:
                self.store.delete(self._key("state", step - 1) + "/")
            else:
                self.store.delete_many([self._key("state", step - 1, n) for n in prev])

    def load(self, step: int) -> dict[str, np.ndarray]:
        """The state committed after ``step``, checked against the marker's checksums."""
        mark = self.store.get(self._key("commit", step))
        if mark is None:
            raise ConfigError(f"run {self.run!r} has no committed step {step}")
        meta = json.loads(mark)["state"]
        names = self._names[step] = list(meta)
        raws = self.store.get_many([self._key("state", step, n) for n in names])
        out = {}
        for name, raw in zip(names, raws):
            m = meta[name]
            if raw is None or zlib.crc32(raw) != m["crc"]:
                raise CorruptError(f"state {name!r} of committed step {step} of run {self.run!r} is missing or damaged in the store; "
                                   "the store lost data: start the run again with a fresh --out")
            out[name] = np.frombuffer(raw, dtype=m["dtype"]).reshape(m["shape"]).copy()
        return out

    def map(self, fn: Callable[[Any], Any], inputs: Sequence[Any], step: int, phase: int) -> tuple[list[Any], MapInfo]:
        """``fn`` over ``inputs`` (``fn`` must be importable by the workers: a module-level
        function). Returns the outputs in order and what happened."""
        info = MapInfo(tasks=len(inputs))
        if not inputs:
            return [], info
        if self.durable:
            return self._map_database(fn, inputs, step, phase, info), info
        return self._map_runtime(fn, inputs, info), info

    def _rounds(self, pending: list[int], info: MapInfo, run_round: Callable[[list[int], int], list[int]]) -> None:
        while pending:
            if info.rounds == self.max_rounds:
                raise TaskError(f"{len(pending)} tasks (first: #{pending[0]}) still failed after {self.max_rounds} rounds; "
                                f"last errors: {info.errors[-3:]}")
            failed = run_round(pending, info.rounds)
            info.executed += len(pending) - len(failed)
            info.failed += len(failed)
            info.rounds += 1
            pending = failed

    def _skip(self, i: int, round_: int) -> bool:
        return self.inject_faults and round_ == 0 and i % 4 == 1

    def _map_runtime(self, fn: Callable[[Any], Any], inputs: Sequence[Any], info: MapInfo) -> list[Any]:
        out: list[Any] = [None] * len(inputs)

        def run_round(pending: list[int], round_: int) -> list[int]:
            res = self.executor.map(_runtime_task, [(fn, inputs[i], self._skip(i, round_)) for i in pending])
            failed = []
            for i, r in zip(pending, res):
                if isinstance(r, BaseException):
                    failed.append(i)
                    info.errors.append(f"#{i}: {type(r).__name__}: {r}")
                else:
                    out[i] = r
            return failed

        self._rounds(list(range(len(inputs))), info, run_round)
        return out

    def _map_database(self, fn: Callable[[Any], Any], inputs: Sequence[Any], step: int, phase: int, info: MapInfo) -> list[Any]:
        n = len(inputs)
        tkeys = [self._key("task", step, phase, i) for i in range(n)]
        rkeys = [self._key("result", step, phase, i) for i in range(n)]
        raws = [pickle.dumps(x, protocol=5) for x in inputs]
        digests = [_digest(r) for r in raws]
        self._written.setdefault(step, []).extend(tkeys + rkeys)
        out: list[Any] = [None] * n

        def collect(idx: list[int]) -> list[int]:
            """Reads results of ``idx``; returns those missing or stale."""
            missing = []
            for i, got in zip(idx, self.store.get_many([rkeys[i] for i in idx])):
                d, val = pickle.loads(got) if got is not None else (None, None)
                if d == digests[i]:
                    out[i] = val
                else:
                    missing.append(i)
            return missing

        pending = collect(list(range(n)))
        info.recovered = sorted(set(range(n)) - set(pending))
        self.store.put_many([(tkeys[i], raws[i]) for i in pending])

        def run_round(idx: list[int], round_: int) -> list[int]:
            url = self.store.url
            res = self.executor.map(_db_task, [(url, fn, tkeys[i], rkeys[i], self._skip(i, round_)) for i in idx])
            info.errors.extend(f"#{i}: {type(r).__name__}: {r}" for i, r in zip(idx, res) if isinstance(r, BaseException))
            return collect(idx)

        self._rounds(pending, info, run_round)
        return out
