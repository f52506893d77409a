"""The engines that run tasks: a thin interface (``map`` a function over items, getting each
item's result or the exception it raised) over a process pool and Dask. Another engine (Ray, an
MPI pool) needs only ``map`` and ``close``."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
from typing import Any, Callable, Sequence

from ..exceptions import ConfigError


class Executor:
    """Runs ``fn(item)`` for each item on ``workers`` processes."""

    name: str
    workers: int

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """Each item's result, or the exception it raised (a worker that died counts as one).
        Never raises for a task's failure: the caller decides what to retry."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProcessExecutor(Executor):
    """A ``concurrent.futures`` process pool (forkserver: workers never inherit the driver's
    store connections or threads). A pool broken by a dead worker is replaced on the next map."""

    name = "process"

    def __init__(self, workers: int = 2):
        self.workers = workers
        self._pool: cf.ProcessPoolExecutor | None = None

    def _get(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("forkserver"))
        return self._pool

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        futs = [self._get().submit(fn, it) for it in items]
        out = []
        for f in futs:
            e = f.exception()
            out.append(e if e is not None else f.result())
        if any(isinstance(r, cf.process.BrokenProcessPool) for r in out):
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


class DaskExecutor(Executor):
    """Dask distributed: a ``LocalCluster`` of ``workers`` single-threaded worker processes
    started here, or any ``dask.distributed.Client`` given (a multi-node scheduler)."""

    name = "dask"

    def __init__(self, workers: int = 2, client: Any = None):
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise ConfigError("the dask engine needs dask.distributed: pip install 'dask[distributed]' (make setup does)") from None
        self._own = client is None
        if client is None:
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                                   silence_logs=logging.CRITICAL)
            client = Client(cluster)
        self.client = client
        self.workers = len(client.scheduler_info()["workers"]) or workers

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        futs = self.client.map(fn, items, pure=False)
        out = []
        for f in futs:
            try:
                out.append(f.result())
            except Exception as e:  # noqa: BLE001 - reported per task, retried by the caller
                out.append(e)
        return out

    def close(self) -> None:
        if self._own:
            cluster = self.client.cluster
            self.client.close()
            cluster.close()


ENGINES = ("dask", "process")


def make(engine: str, workers: int = 2, client: Any = None) -> Executor:
    """The executor named ``engine`` (``dask`` or ``process``) with ``workers`` workers."""
    if workers < 1:
        raise ConfigError(f"workers = {workers}; need at least 1")
    if engine == "dask":
        return DaskExecutor(workers, client)
    if engine == "process":
        return ProcessExecutor(workers)
    raise ConfigError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
