"""Database-assisted task distribution: the engine schedules small tags while inputs, results
and the driver's state live in a store, so a crashed run resumes where it was.

- :mod:`.stores`: the store (Cairn staging or Redis), opened by URL, or started locally.
- :mod:`.executors`: the engine (Dask or a process pool) behind a thin ``map`` interface.
- :mod:`.runtime`: :class:`TaskRun`: ``runtime`` or ``database`` mode, retry rounds, step
  commit markers, resume.
- :mod:`.memo`: :class:`Memo`: rounded-key buckets with nearest-neighbour queries.
"""

from .executors import DaskExecutor, Executor, ProcessExecutor
from .executors import make as make_executor
from .memo import Lookup, Memo, unique_rows
from .runtime import MODES, InjectedFault, MapInfo, TaskError, TaskRun
from .stores import RedisStore, StagingStore, Store, local, open_store, stop_local

__all__ = ["Store", "StagingStore", "RedisStore", "open_store", "local", "stop_local", "Executor", "ProcessExecutor",
           "DaskExecutor", "make_executor", "TaskRun", "MapInfo", "TaskError", "InjectedFault", "MODES", "Memo", "Lookup",
           "unique_rows"]
