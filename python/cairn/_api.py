"""The user-facing API: :func:`open`, :class:`Writer` and :class:`Reader` over ``cairn._native``."""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
import warnings
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from . import _check, cf, _native, metadata
from ._mpi import Exchange, node_ids
from .exceptions import (CairnError, CapacityError, ConfigError, ConflictError, InvalidArgumentError, NotFoundError, StepsMissedWarning,
                         UnavailableError, step_aborted, step_error)
from .info import BlockInfo, VariableInfo
from .variable import Variable


def _dtype(spec: Any) -> str:
    """Canonical dtype name for the native layer (``f8``, ``i4``, ``c16`` …)."""
    if isinstance(spec, str) and spec == "bytes":
        return spec
    try:
        dt = np.dtype(spec)
    except (TypeError, ValueError) as e:  # ValueError: also text numpy cannot encode
        raise InvalidArgumentError(f"unknown dtype {_check.show(spec)}: {e}") from None
    return f"{dt.kind}{dt.itemsize}"


def _wait_drained(inner: Any, step: int | None, timeout: float | None) -> bool:
    """A native handle's ``wait_drained``, in slices so Ctrl-C is honoured while it waits."""
    step = None if step is None else _step(step)
    timeout = _timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        if inner.wait_drained(step, left):
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False


def _step(step: Any) -> int:
    """``step`` as a plain ``int``, or :class:`InvalidArgumentError` unless it is an integer in
    ``0 .. 2**64 - 1`` (numpy integers count; ``bool`` and floats do not)."""
    return _check.integer(step, "step", rule="steps are integers >= 0 (and below 2**64)")


def _var(name: Any) -> str:
    """A variable name as the native layer takes it (which checks its length and characters)."""
    return _check.text(name, "variable name", "use 1 to 256 printable characters")


def _timeout(timeout: Any) -> float | None:
    """A wait's ``timeout``: ``None`` (wait for ever) or finite seconds >= 0."""
    if timeout is None:
        return None
    return _check.seconds(timeout, "timeout", rule="use a finite number of seconds >= 0, or None to wait for ever")


#: Bounds of a claim's lease in seconds (the client crate's): a millisecond to a day.
LEASE_RANGE: tuple[float, float] = _native.LEASE_RANGE


def _staging_if_cluster(ov: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``cluster=`` names a staging cluster, so it means the staging engine (as the xarray
    backend's ``cluster`` does); with another ``engine=`` it is an error, not silently ignored."""
    given = dict(ov)
    if "cluster" not in given:
        return ov
    engine = given.get("engine", "staging")
    if engine != "staging":
        raise InvalidArgumentError(f"cluster= names a staging cluster, but engine={engine!r}: leave engine= out (cluster= "
                                   "means the staging engine), or give path= without cluster= for the file engine")
    return ov if "engine" in given else [*ov, ("engine", "staging")]


def _overrides(kw: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for k, v in kw.items():
        if v is None:
            continue
        key = _check.text(k, "setting name", "use the keys of cairn.toml (engine, path, cluster, keep_last ...)")
        if isinstance(v, (os.PathLike, bytes)):
            out.append((key, _check.path(v, f"{key}=")))
        else:
            out.append((key, _check.text(str(v).lower() if isinstance(v, bool) else str(v), f"{key}=", "give UTF-8 text")))
    return out


def open(  # noqa: A001 - mirrors builtins.open on purpose
    name: str,
    mode: str = "r",
    config: str | os.PathLike[str] | None = None,
    *,
    rank: int | None = None,
    nranks: int | None = None,
    comm: Any = None,
    session: str | None = None,
    from_step: int | None = None,
    **overrides: Any,
) -> Writer | Reader:
    """Open dataset ``name``.

    ``mode`` is ``"w"`` (write, starting without definitions; a dataset that has steps opens too,
    its committed steps staying immutable, so claimers can share a destination), ``"a"`` (add steps
    to an existing one, taking its definitions over, e.g. after a restart) or ``"r"``. A writer
    reads committed steps too (``steps``, ``get``, ``get_local``, ``variables``, ``f[name]``), so a
    restart is ``f = open(name, "a")``, ``f.get(..., step=f.next_step - 1)``, then go on writing.
    ``from_step=N`` (mode ``"a"``) goes back to an older step, as when the newest are bad: the
    committed steps from ``N`` on are discarded on every level (staging memory and its drained
    copies; the ``file`` engine's indexes) and writing continues at ``N`` (``f.next_step == N``).
    Rank 0 discards (refused with :class:`ConflictError` while a step is begun and not ended);
    the other ranks wait until it did. Readers of a discarded step get :class:`NotFoundError`. Writers are
    rank ``rank`` of ``nranks`` (or take both from an mpi4py ``comm``); a step commits when every
    rank has ended it. ``config`` names a ``cairn.toml`` (else
    ``$CAIRN_CONFIG``, else ``./cairn.toml``); keyword ``overrides`` such as ``engine="file"`` or
    ``path="out"`` win over it. Readers may run on any number of processes.

    ``session`` names this launch of the application: all writer ranks of one launch share it and
    a restart uses a new one, so fragments a crashed run left behind never mix into its restart.
    Without ``session``: with ``comm``, rank 0 draws a random one and broadcasts it; else
    ``$CAIRN_SESSION`` is used, else the launcher's (``mpirun``'s PMIx namespace or PMI KVS name,
    Slurm's job and step), else a single writer (``nranks`` 1) draws a random one. Several ranks
    with none of these are refused with :class:`InvalidArgumentError`: ranks started separately by
    hand must pass the same ``session`` (or set ``$CAIRN_SESSION``), and a new one when restarted.
    With the ``file`` engine, a second writer of a rank is refused with :class:`ConflictError`
    while the first has it open, and when it ends a step the first ended in the same session.
    """
    name = _check.text(name, "dataset name", "use a plain name of 1 to 255 bytes of UTF-8, without '/' or NUL, "
                       "other than \".\" and \"..\"")
    cfg = _check.path(config, "config") if config is not None else None
    ov = _staging_if_cluster(_overrides(overrides))
    if not isinstance(mode, str) or mode not in ("w", "a", "r"):
        raise InvalidArgumentError(f"mode {_check.show(mode)}: use 'w' (write), 'a' (append) or 'r' (read)")
    if comm is not None:
        rank, nranks = comm.Get_rank(), comm.Get_size()
        if session is None and mode != "r":
            session = comm.bcast(uuid.uuid4().hex if rank == 0 else None, root=0)
    rank = 0 if rank is None else _check.integer(rank, "rank", 0, _check.U32 - 1, "give this writer's rank, from 0 to nranks - 1")
    nranks = 1 if nranks is None else _check.integer(nranks, "nranks", 1, _check.U32,
                                                     f"give the number of writer ranks, from 1 to {_check.U32}")
    if session is not None:
        session = _check.text(session, "session", "give the same text on every rank of this launch, e.g. a job id")
    if from_step is not None:
        if mode != "a":
            raise InvalidArgumentError(f"from_step={from_step!r} with mode {mode!r}: going back to an older step continues a "
                                       "dataset; open it with mode 'a'")
        from_step = _step(from_step)
    ov += _embedded_cluster(cfg, ov, mode, rank, nranks, comm)
    where = _where(cfg, ov)
    if from_step is not None:
        _discard_from(name, cfg, ov, from_step, rank, comm)
    if mode == "r":
        return Reader(_native.Reader(name, cfg, ov), name, where)
    if rank < 0 or nranks < 1 or rank >= nranks:
        raise InvalidArgumentError(f"rank {rank} of {nranks}: need 0 <= rank < nranks")
    exchange, nodes = _collective(comm, cfg, ov) if nranks > 1 else (None, None)
    try:
        inner = _native.Writer(name, cfg, ov, rank, nranks, mode == "a", session, exchange, nodes)
    except BaseException:
        # A collective open fails on every rank alike (the ranks agree before returning), so
        # every rank frees its share of the communicator here.
        if exchange is not None:
            exchange.free()
        raise
    return Writer(inner, comm, where, exchange, lambda: _native.Reader(name, cfg, ov), from_step)


#: How long ranks other than 0 wait for rank 0's discard of steps (``from_step``).
_DISCARD_WAIT = 120.0


def _discard_from(name: str, cfg: str | None, ov: list[tuple[str, str]], step: int, rank: int, comm: Any) -> None:
    """Rank 0 discards the committed steps of ``name`` from ``step`` on; the other ranks return
    once it did (told over ``comm``, else seen in the listing), so every rank resumes at ``step``."""
    if comm is not None:
        error = None
        if rank == 0:
            try:
                _native.Reader(name, cfg, ov).discard_from(step)
            except CairnError as e:
                error = e
        failed = comm.bcast(None if error is None else f"{type(error).__name__}: {error}", root=0)
        if error is not None:
            raise error
        if failed is not None:
            raise ConflictError(f"rank 0 could not discard the steps of '{name}' from {step}: {failed}")
        return
    reader = _native.Reader(name, cfg, ov)
    if rank == 0:
        reader.discard_from(step)
        return
    deadline = time.monotonic() + _DISCARD_WAIT
    while any(s >= step for s in reader.steps()):
        if time.monotonic() >= deadline:
            raise ConflictError(f"'{name}' still has committed steps from {step} on after {_DISCARD_WAIT:g} s: rank 0 "
                                f"discards them (from_step={step}); open rank 0 with from_step too")
        time.sleep(0.05)


def _collective(comm: Any, cfg: str | None, ov: list[tuple[str, str]]) -> tuple[Exchange | None, list[int] | None]:
    """The MPI exchange of a collective ``file`` writer (N→M aggregation and gathered metadata)
    and each rank's node, or Nones when there is no communicator or the engine does not aggregate."""
    if comm is None:
        return None, None
    resolved = json.loads(_native.config_json(cfg, ov))
    if resolved["engine"] != "file" or resolved["file"]["aggregation"] == "none":
        return None, None
    nodes, oversubscribed = node_ids(comm)
    return Exchange(comm, oversubscribed), nodes


def _where(cfg: str | None, ov: list[tuple[str, str]]) -> tuple[str, str | None]:
    """The engine and where a dataset opened with ``cfg`` and ``ov`` is: the cluster file
    (staging) or the directory holding the datasets (file)."""
    resolved = json.loads(_native.config_json(cfg, ov))
    at = resolved["staging"]["cluster"] if resolved["engine"] == "staging" else resolved["file"]["path"]
    return resolved["engine"], None if at is None else os.path.abspath(at)


def _embedded_cluster(cfg: str | None, ov: list[tuple[str, str]], mode: str, rank: int, nranks: int, comm: Any) -> list[tuple[str, str]]:
    """``cluster=`` for the staging engine when the configuration names none: this process's
    embedded cluster (started by rank 0 and shared over ``comm``), or for readers a kept one in
    ``./cluster.json``."""
    resolved = json.loads(_native.config_json(cfg, ov))
    st = resolved["staging"]
    if resolved["engine"] != "staging" or st["cluster"] is not None:
        return []
    from . import cluster

    global _shared_cluster
    if mode == "r" and _shared_cluster is not None:
        return [("cluster", _shared_cluster)]
    if mode == "r" and cluster._embedded is None:
        if not os.path.exists("cluster.json"):
            raise ConfigError("engine = \"staging\" names no cluster and none runs here: set [staging] cluster = \"cluster.json\" "
                              "(from `cairn cluster start`) or write with keep = true first")
        return [("cluster", os.path.abspath("cluster.json"))]
    if comm is not None and nranks > 1:
        path = comm.bcast(str(cluster.embedded(st["servers"], st["memory"], st["keep"], st)) if rank == 0 else None, root=0)
    elif nranks > 1:
        raise ConfigError(f"{nranks} writer ranks and no staging cluster: pass comm= so rank 0 starts the embedded one, "
                          "or start one with `cairn cluster start` and set [staging] cluster")
    else:
        path = str(cluster.embedded(st["servers"], st["memory"], st["keep"], st))
    # Readers in this process (any rank) use the cluster its writers did.
    _shared_cluster = path
    return [("cluster", path)]


#: The embedded cluster this process's writers used (started here or by rank 0 of their comm).
_shared_cluster: str | None = None


class _Reads:
    """The read calls of both handles: a :class:`Reader`'s, and a :class:`Writer`'s, which reads
    the committed steps through a reader of its own (a restart loads its state from the handle it
    goes on writing with)."""

    _rd: _native.Reader

    def steps(self) -> list[int]:
        """Committed steps, sorted. Re-read on every call, so new commits appear."""
        return self._rd.steps()

    def variables(self) -> dict[str, VariableInfo]:
        """Variables of the committed steps: name -> :class:`VariableInfo` (with ``dims`` and
        ``attrs``)."""
        return {n: VariableInfo(np.dtype(_np_name(d)), None if s is None else tuple(s), s is None,
                                None if dims is None else tuple(dims), metadata.from_json(attrs), constant)
                for n, d, s, dims, attrs, constant in self._rd.variables()}

    def __getitem__(self, name: str) -> Variable:
        """Variable ``name``, read lazily by indexing with the step first:
        ``r["pressure"][9, 0:128, :, 5]``, ``r["pressure"][-1]`` (the last committed step)."""
        info = self.variables().get(_var(name))
        if info is None:
            raise NotFoundError(f"unknown variable '{name}'; defined: [{', '.join(self.variables())}]")
        return Variable(self, name, info)

    def blocks(self, name: str, step: int) -> list[BlockInfo]:
        """Blocks of ``name`` at ``step`` with their boxes and min/max/mean/checksum."""
        return [BlockInfo(w, tuple(o), tuple(c), lo, hi, mean, crc, n, stored, codec, redundancy, state, level)
                for w, o, c, lo, hi, mean, crc, n, stored, codec, redundancy, (state, level)
                in self._rd.blocks(_var(name), _step(step))]

    def get(self, name: str, step: int | None = None, offset: Sequence[int] | None = None,
            count: Sequence[int] | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """Read the box ``offset + count`` (default: the whole array) of ``name`` at ``step``,
        assembled from whichever blocks intersect it. ``out`` may be a C-contiguous array to fill.
        A constant variable is read without a step (``get("x")``)."""
        name = _var(name)
        step = self.constant_step(name) if step is None else _step(step)
        dtype, shape = self._rd.var(name, step)
        if shape is None:
            raise InvalidArgumentError(f"'{name}' is a local variable; use get_local(name, step, writer)")
        off = [0] * len(shape) if offset is None else _check.extents(offset, "offset")
        cnt = [max(n - o, 0) for n, o in zip(shape, off)] if count is None else _check.extents(count, "count")
        _inside(name, shape, off, cnt)
        if out is None:
            out = _empty(name, cnt, _np_name(dtype))
        elif not isinstance(out, np.ndarray):
            raise InvalidArgumentError(f"out={_check.show(out)}: give a C-contiguous numpy array to fill, or None")
        elif out.shape != tuple(cnt) or out.dtype != np.dtype(_np_name(dtype)):
            raise InvalidArgumentError(f"out has shape {out.shape} {out.dtype}; need {tuple(cnt)} {_np_name(dtype)}")
        self._rd.get_into(name, step, off, cnt, out)
        return out

    def constant_step(self, name: str) -> int:
        """The step constant variable ``name`` was written in (the first kept step holding it);
        :class:`InvalidArgumentError` for a per-step variable, which needs a step."""
        return self._rd.constant_step(_var(name))

    def get_local(self, name: str, step: int, writer: int) -> np.ndarray:
        """The block writer ``writer`` put for local variable ``name`` at ``step``."""
        name, step, writer = _var(name), _step(step), _writer(writer)
        dtype, _ = self._rd.var(name, step)
        out = np.empty(self._rd.local_count(name, step, writer), dtype=_np_name(dtype))
        self._rd.get_local_into(name, step, writer, out)
        return out

    def get_trace(self, name: str, step: int, writer: int) -> np.ndarray:
        """The trace records writer ``writer`` appended to ``name`` at ``step``, in order (an
        empty array if it appended none)."""
        name, step, writer = _var(name), _step(step), _writer(writer)
        dtype, count = self._rd.trace_count(name, step, writer)
        out = np.empty(count, dtype=_np_name(dtype))
        if out.size:
            self._rd.get_local_into(name, step, writer, out)
        return out


class Writer(_Reads):
    """One rank's handle for writing steps. Use as a context manager; see :func:`open`."""

    def __init__(self, inner: _native.Writer, comm: Any = None, where: tuple[str, str | None] = ("file", None),
                 exchange: Exchange | None = None, reads: Callable[[], _native.Reader] | None = None,
                 from_step: int | None = None) -> None:
        self._inner = inner
        self._from_step = from_step
        self._reads = reads
        self._reader: _native.Reader | None = None
        self._comm = comm
        self._exchange = exchange
        self._where = where
        self._local: dict[str, bool] = {}
        self._open = 0  # the step last begun
        self._halted = False  # halt_requested() said so: close() waits for the last step on disk

    def define(self, name: str, dtype: Any, shape: Sequence[int] | None = None, *, local: bool = False,
               redundancy: int | None = None, dims: Sequence[str] | None = None,
               attrs: dict[str, Any] | None = None, constant: bool = False) -> None:
        """Define a variable: a global array of ``shape``, or with ``local=True`` a per-writer
        block of any size (ragged). Every rank must define it identically. ``dims`` names each
        dimension (``("z", "y", "x")``: xarray and the exported files use them) and ``attrs`` holds
        its attributes (``{"units": "K"}``: JSON-serialisable values, numpy scalars and arrays,
        at most 64 KiB as JSON). With the staging
        engine, ``redundancy=r`` (0 to 16) makes it survive any ``r`` server failures: its objects are
        written to ``r + 1`` servers in different failure domains, and the cluster's scheme may
        later erasure-code cold ones into ``rs_data + r`` shards (CoREC). Without it the level is
        ``[staging] redundancy`` or the cluster's default (``cairn cluster start --redundancy``).
        ``constant=True`` makes a global variable step-invariant (a coordinate, a mesh): it is written
        in one step only, the first in which any rank puts it (ranks may put disjoint parts of it
        there; a put in a later step raises :class:`ConflictError`), read without a step
        (``r.get("x")``, ``r["x"][...]``), kept while any step of the dataset is kept, and exported
        without the step axis (``x(x)``: a 1-D constant named like its dimension is an index
        coordinate in xarray)."""
        name = _var(name)
        if constant is not True and constant is not False:
            raise InvalidArgumentError(f"'{name}': constant={_check.show(constant)}; give True or False")
        if redundancy is not None:
            redundancy = _check.integer(redundancy, "redundancy", 0, _check.MAX_REDUNDANCY,
                                        f"give the number of server failures '{name}' survives, an integer from 0 "
                                        f"to {_check.MAX_REDUNDANCY}, or None for the cluster's default")
        if local and shape is not None:
            raise InvalidArgumentError(f"'{name}': a local variable has no global shape; drop shape= or local=True")
        if not local and shape is None:
            raise InvalidArgumentError(f"'{name}': give a global shape, or local=True for per-writer blocks")
        cf.check(name, _dtype(dtype), attrs)
        names_rule = "give a sequence of names, one per dimension, e.g. ('y', 'x')"
        if dims is not None and (isinstance(dims, (str, bytes)) or not isinstance(dims, Iterable)):
            raise InvalidArgumentError(f"'{name}': dims={_check.show(dims)}; {names_rule}")
        self._inner.define(name, _dtype(dtype), None if local else _check.extents(shape, "shape"),
                           redundancy, None if dims is None else [_check.text(d, "dimension name", names_rule) for d in dims],
                           None if attrs is None else metadata.to_json(attrs, f"variable '{name}'"), constant)
        self._local[name] = local

    @property
    def _rd(self) -> _native.Reader:  # type: ignore[override]
        # Opened at the first read: a writer that never reads costs no second connection.
        if self._reader is None:
            if self._reads is None:
                raise InvalidArgumentError("this writer was not opened by cairn.open; open a Reader to read")
            self._reader = self._reads()
        return self._reader

    @property
    def attrs(self) -> metadata.DatasetAttrs:
        """The dataset's attributes, a dict: ``f.attrs["title"] = "run 1"``. Set them before or
        inside the first step; every step carries them (a restart in mode ``"a"`` keeps them)."""
        return metadata.DatasetAttrs(metadata.from_json(self._inner.attrs()), self._inner.set_attrs)

    @property
    def next_step(self) -> int:
        """Where to resume: the step after the last one committed when opened (0 for a new
        dataset; with ``from_step``, that step). In mode ``"a"`` the definitions of that step are
        kept, so no ``define`` is needed."""
        return self._inner.next_step if self._from_step is None else self._from_step

    @contextlib.contextmanager
    def step(self, step: int, consume: Reader | Sequence[Reader] | None = None) -> Iterator[Writer]:
        """Write step ``step`` inside the ``with`` block. It commits (becomes visible) once every
        rank has left the block; an exception abandons this rank's part and the step stays hidden.

        Each put is a sub-transaction: one that cannot be stored (a full or failed server, a disk
        error) does not stop the block; leaving it raises :class:`StepError` naming every such
        variable and the servers involved (a :class:`CapacityError` itself when all found servers
        or disk full), and abandons the step (never partly visible). To retry
        only those, write the step with :meth:`begin_step` and :meth:`end_step` instead.

        ``consume=src`` (a :class:`Reader`, or a list of them, of the same staging cluster or the
        same ``file`` engine path) makes this step's commit release step ``step`` of ``src`` in one
        transaction: both happen or neither (D²T consume-and-produce, with :meth:`Reader.claims`).
        If another claimer consumed that step first (this one's lease had lapsed), the step is
        refused with :class:`ConflictError` and nothing changes."""
        self.begin_step(step, consume)
        try:
            yield self
            self.end_step()
        except BaseException:
            # Also when ending fails (e.g. a trace flush into a full server): the step stays
            # hidden and the next one can begin; steps ended earlier stay held for the next flush.
            self._inner.abort_step()
            raise

    def begin_step(self, step: int, consume: Reader | Sequence[Reader] | None = None) -> None:
        """Open step ``step`` (see :meth:`step`; ``with f.step(s):`` is the usual form). End it
        with :meth:`end_step` or drop it with :meth:`abort_step`."""
        sources = self._sources(consume)
        self._settle()
        try:
            self._inner.begin_step(_step(step))
        except CapacityError as e:  # a full queue: which step waited, as for a full server's
            e.step = _step(step)  # type: ignore[attr-defined]
            raise
        self._open = _step(step)
        try:
            if sources:
                self._inner.consume(sources)
        except BaseException:
            self._inner.abort_step()
            raise

    def end_step(self) -> bool:
        """End the open step; returns whether this call committed it (this rank was the last).
        If some of its puts could not be stored, raises :class:`StepError` (:class:`CapacityError`
        when every one found servers or disk full; both with ``step``, ``failed``) naming them and keeps
        the step open and hidden with the puts that were: put those boxes again and call
        ``end_step()`` again, or :meth:`abort_step`.

        Writers opened with an MPI ``comm`` on the ``file`` engine end steps collectively (N→M
        aggregation, ``[file] aggregation``): every rank calls ``end_step`` (or every rank
        ``abort_step``), each returns once the step is committed, and rank 0's call returns True."""
        self._settle()
        failed = self._inner.failed_puts()
        if failed:
            raise step_error(self._open, failed)
        try:
            return self._inner.end_step()
        except CairnError:
            # Small puts go out together at the step's end (see ``put``); a batch that could not
            # be stored fails its puts there.
            failed = self._inner.failed_puts()
            if failed:
                raise step_error(self._open, failed) from None
            raise

    def abort_step(self) -> None:
        """Drop the open step and everything put in it; nothing of it becomes visible. With
        several ranks, the step aborts for all of them: those that ended it hear of it."""
        self._inner.abort_step()

    def wait_committed(self, step: int, timeout: float | None = None) -> bool:
        """Wait until step ``step`` (ended by this rank) is committed: True once it is, False
        after ``timeout`` seconds (``None``: no limit); raises :class:`StepError` (``aborted``
        True, with ``reason``) if it aborted. ``end_step`` returns False to every rank but the
        last; this is how the others learn the outcome without waiting for their next step."""
        step = _step(step)
        timeout = _timeout(timeout)
        while True:
            slice_ = 3600.0 if timeout is None else timeout
            outcome, why = self._inner.wait_committed(step, slice_)
            if outcome == "committed":
                return True
            if outcome == "aborted":
                raise step_aborted(step, why)
            if timeout is not None:
                return False

    def wait_drained(self, step: int | None = None, timeout: float | None = None) -> bool:
        """Wait until ``step`` (default: the newest committed step the cluster's drain cadence
        names) is drained to disk: True once it is, False after ``timeout`` seconds (``None``: no
        limit); raises the drain's error if it failed (:class:`CapacityError` for a full disk).
        Always True for the ``file`` engine. A job script calls it before its allocation ends."""
        return _wait_drained(self._inner, step, timeout)

    def define_queue(self, limit: int, policy: str = "block") -> None:
        """Backpressure with streaming readers, as ADIOS2 SST's queue limit: at most ``limit``
        committed steps of this dataset stay unreleased. ``"block"``: :meth:`begin_step` (and
        :meth:`step`) waits until one is released (by readers iterating ``stream(release=True)``,
        ``keep_last`` or ``release``), up to the staging ``timeout``, then raises
        :class:`CapacityError` naming the queue; ``"discard_oldest"``: the oldest committed step
        is released instead (never one the drain still owes; the newest stays), and readers that
        missed it are told with :class:`StepsMissedWarning`. A policy of the dataset, set by its
        writers (ranks may each call it alike); ``limit`` 0 removes it. ``[staging] queue_limit``
        and ``queue_policy`` set it for the datasets writers open. The ``file`` engine keeps every
        step on disk: there the call is checked and does nothing."""
        limit = _check.integer(limit, "limit", 0, _check.U32, "give the committed steps that may stay unreleased, or 0 for no limit")
        if policy not in ("block", "discard_oldest"):
            raise InvalidArgumentError(f"policy {_check.show(policy)}: use 'block' (writers wait) or 'discard_oldest' "
                                       "(the oldest step is released)")
        self._inner.define_queue(limit, policy)

    def _settle(self) -> None:
        """Raises the :class:`StepError` of a step this rank ended that aborted since."""
        aborted = self._inner.take_aborted()
        if aborted is not None:
            raise step_aborted(*aborted)

    def _sources(self, consume: Reader | Sequence[Reader] | None) -> list[str]:
        """Names of the datasets ``consume`` names, checked to live where this writer writes."""
        if consume is None:
            return []
        readers = list(consume) if isinstance(consume, Iterable) and not isinstance(consume, (str, bytes)) else [consume]
        for r in readers:
            if not isinstance(r, Reader):
                raise InvalidArgumentError(f"consume={r!r}: give the Reader (or a list of Readers) of the dataset whose step this commit releases")
            if r._where != self._where:
                raise InvalidArgumentError(f"consume= of dataset '{r._name}' ({r._where[0]} {r._where[1] or ''}) from a writer on "
                                           f"{self._where[0]} {self._where[1] or ''}: consume-and-produce works within one staging "
                                           "cluster or one file engine path; open both datasets there")
        return [r._name for r in readers]

    def put(self, name: str, data: Any, offset: Sequence[int] | None = None) -> None:
        """Put ``data`` (its shape is the block's count) at ``offset`` of a global variable, or as
        this rank's block of a local variable (no offset). C- and Fortran-ordered arrays both work;
        C-contiguous native-endian arrays cross into Rust without a copy. With the staging engine,
        blocks of at most 64 KiB are copied and sent together, at the step's end or once 4 MiB
        or 1,024 of them have gathered (one round trip for many); ``data`` may be reused at once
        either way. A put that cannot be stored (full or failed servers, a disk error) is
        reported by :meth:`end_step` as a :class:`StepError`, together with the step's other
        failed puts."""
        name = _var(name)
        arr = _little_endian_c(data)
        off = None if offset is None else _check.extents(offset, "offset")
        try:
            self._inner.put(name, _dtype(arr.dtype), arr, off)
        except (CapacityError, UnavailableError):
            # A failed sub-transaction of the open step: end_step reports it with the others.
            if not any(f[0] == name for f in self._inner.failed_puts()):
                raise

    def trace(self, name: str, values: Any) -> None:
        """Append fine-grained records (e.g. each walker's energy, or an ``(n, 3)`` array of
        particle positions) to trace ``name`` for this step. The number of records may differ per
        writer and per step; a scalar is one record. Records are buffered and written every
        ``trace_flush`` steps as one write (``cairn.open(..., trace_flush=n)`` or ``trace_flush``
        in ``cairn.toml``); a step with buffered records commits at that flush, at the latest on
        :meth:`close`. Readers get them with :meth:`Reader.get_trace`.

        Steps commit in order, so every step ended while records wait is held with its puts until
        the flush (with the staging engine its blocks wait in server memory meanwhile)."""
        name = _var(name)
        arr = _little_endian_c(values)
        self._inner.trace(name, _dtype(arr.dtype), arr.reshape(1) if arr.ndim == 0 else arr)

    def flush_traces(self) -> None:
        """Write buffered trace records now and commit the steps that waited for them.
        Records of the open step are written too, as its block: that step takes no more records
        of those variables."""
        self._inner.flush_traces()

    @property
    def traced_bytes(self) -> int:
        """Bytes of trace records waiting for the next flush."""
        return self._inner.traced_bytes()

    def halt_requested(self) -> bool:
        """Whether the job asks this application to stop before the step this writer writes next
        (the one after the newest it ended, else :attr:`next_step`); see
        :func:`cairn.halt_requested`. Every rank gets the same answer for the same step, so a
        collective code stops at one step on every rank: with ``comm=`` it is collective (every
        rank calls it at the same step; true if any rank's job asks), without it the first rank
        to ask for a step fixes the answer for all. Once it returned True, :meth:`close` returns
        only when the newest step this writer ended is on the drain's disk."""
        last = self._inner.last_ended
        step = self.next_step if last is None else last + 1
        if self._comm is not None:
            from mpi4py import MPI

            halt_requested_warn()
            mine, error = False, None
            try:
                mine = _native.halt_requested()
            except CairnError as e:  # every rank still joins the reduction
                error = e
            halt = bool(self._comm.allreduce(mine, op=MPI.LOR))
            if error is not None:
                raise error
        else:
            halt_requested_warn()
            halt = self._inner.halt_requested_all(step)
        self._halted |= halt
        return halt

    def _drain_last(self) -> None:
        """After a halt: waits until the newest step this rank ended is committed and on disk,
        at most until 30 s before ``$SLURM_JOB_END_TIME`` (else 60 s); raises the drain's error."""
        last = self._inner.last_ended
        if last is None:
            return
        end = os.environ.get("SLURM_JOB_END_TIME", "").strip()
        budget = max(1.0, float(end) - 30.0 - time.time()) if end else 60.0
        deadline = time.monotonic() + budget
        if self.wait_committed(last, timeout=budget):
            left = max(0.0, deadline - time.monotonic())
            try:
                drained = self.wait_drained(last, timeout=left)
            except ConfigError:  # a cluster that drains nothing: memory is the last level
                return
            if not drained:
                warnings.warn(f"step {last} of this writer is not on disk yet after {budget:.0f} s; the job ends with it "
                              "in memory only", RuntimeWarning, stacklevel=3)

    def close(self) -> None:
        """Close the writer, flushing buffered traces. With an MPI ``comm``, waits for all ranks
        so that every step they ended is committed when ``close`` returns. After
        :meth:`halt_requested` returned True, it returns once the newest step this writer ended
        is drained to disk (the job's last checkpoint, whatever the drain's cadence)."""
        try:
            try:
                self._settle()
                if self._halted:
                    self._drain_last()
            finally:
                self._inner.close()
        finally:
            # Every rank reaches the barrier, so one rank's error never leaves the others waiting.
            if self._comm is not None:
                self._comm.Barrier()
            if self._exchange is not None:
                self._exchange.free()
                self._exchange = None

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self._inner.abort_step()
        self.close()


class Reader(_Reads):
    """Read handle over committed steps; any number of processes may read at once."""

    def __init__(self, inner: _native.Reader, name: str = "", where: tuple[str, str | None] = ("file", None)) -> None:
        self._inner = self._rd = inner
        self._name = name
        self._where = where

    def wait_drained(self, step: int | None = None, timeout: float | None = None) -> bool:
        """Wait until ``step`` (default: the newest committed step the cluster's drain cadence
        names) is drained to disk: True once it is, False after ``timeout`` seconds (``None``: no
        limit); raises the drain's error if it failed (:class:`CapacityError` for a full disk).
        Always True for the ``file`` engine. A job script calls it before its allocation ends."""
        return _wait_drained(self._inner, step, timeout)

    def wait_step(self, step: int, timeout: float | None = None) -> bool:
        """Wait until ``step`` is committed (at most ``timeout`` seconds, finite and >= 0; ``None``
        waits for ever). Returns whether it is."""
        step = _step(step)
        timeout = _timeout(timeout)
        forever = timeout is None
        deadline = time.monotonic() + (0 if timeout is None else timeout)
        while True:
            # Wait in slices so Ctrl-C is honoured while blocked in native code.
            left = 1.0 if forever else max(0.0, min(1.0, deadline - time.monotonic()))
            if self._inner.wait_step(step, left):
                return True
            if not forever and time.monotonic() >= deadline:
                return False

    def stream(self, start: int | None = None, timeout: float | None = None, release: bool = False) -> Iterator[int]:
        """Yield committed steps in order as they commit, from ``start`` (default: the first kept
        step), for in-situ analysis. Ends once the writers closed the dataset and every step was
        yielded, or once no new step has committed for ``timeout`` seconds (``None``: never).

        With ``release=True`` (staging engine) this call registers the reader on the dataset until
        the loop ends: a
        step is released once every registered reader has passed it (asked for the next), and
        ``keep_last`` keeps what they have not; with the writers' ``define_queue(limit,
        "block")`` a slow reader then sees every step. A reader that dies is dropped after the
        staging ``timeout``. Steps released before the loop got to them (``discard_oldest``,
        ``keep_last`` without registration) are named by a :class:`StepsMissedWarning`. The
        ``file`` engine keeps every step: ``release`` changes nothing there."""
        start = None if start is None else _step(start)
        if not isinstance(release, bool):
            raise InvalidArgumentError(f"release={release!r}: give True (release what this loop passed) or False")
        if release:
            from ._queue import releasing

            return releasing(self._inner, start, lambda at: self._stream(at, _timeout(timeout)), self._warn_missed)
        return self._stream(start, _timeout(timeout))

    def _stream(self, nxt: int | None, timeout: float | None) -> Iterator[int]:
        last = time.monotonic()
        while True:
            steps, finished = self._inner.listing()
            new = [s for s in steps if nxt is None or s >= nxt]
            if new and nxt is not None and new[0] > nxt:
                self._warn_missed(nxt, new[0])
            if new:
                for s in new:
                    yield s
                nxt = new[-1] + 1
                last = time.monotonic()
                continue
            if finished or (timeout is not None and time.monotonic() - last >= timeout):
                return
            # Wake at once when the next step number commits; re-list now and then for gaps.
            slice_ = 0.5 if timeout is None else max(0.0, min(0.5, timeout - (time.monotonic() - last)))
            try:
                self._inner.wait_step(0 if nxt is None else nxt, slice_)
            except NotFoundError:
                # Committed and released meanwhile (another reader, the queue's policy): the
                # next listing shows the gap, and the warning names it.
                if nxt is None:
                    nxt = 0


    def _warn_missed(self, lo: int, hi: int) -> None:
        """Warns of the steps in ``lo..hi`` that were committed and released unread (a gap may
        also be step numbers nobody wrote; the servers tell which, for the newest 4096)."""
        missed = []
        for s in range(max(lo, hi - 4096), hi):
            try:
                self._inner.wait_step(s, 0.0)
            except NotFoundError:  # only a released step is an error to wait for
                missed.append(s)
        if missed:
            warnings.warn(StepsMissedWarning(missed), stacklevel=3)

    def claims(self, lease: float = 30.0, timeout: float | None = None) -> Iterator[int]:
        """Yield committed steps that no other claimer holds, lowest first, each leased to this
        loop (D²T claims): any number of claimer processes share the steps, each step going to
        one. The lease is renewed in the background while this process lives; a claimer that
        dies loses its steps to the others after ``lease`` seconds. Consume a step by committing
        its result with ``dst.step(step, consume=self)``. Ends when the writers closed the
        dataset and nothing is left for this claimer, or when no step came for ``timeout``
        seconds (``None``: wait for ever); steps yielded and not consumed then go back to the
        others. On the ``file`` engine leases are files (``claims/``) and expire by wall-clock
        time, so claimers on several nodes need synchronised clocks. ``lease`` is from 0.001 to
        86400 seconds (a day)."""
        from . import _claims

        lo, hi = LEASE_RANGE
        lease = _check.seconds(lease, "lease", lo, hi, f"give the seconds a claim lasts without renewal, from {lo:g} to "
                                                       f"{hi:g} (a day); the heartbeat renews it every third of that")
        return _claims.claims(self._inner, lease, _timeout(timeout))

    def release(self, step: int) -> None:
        """Free a committed step for every reader: in the staging servers, or (file engine) its
        index, the data files being append-only. Later reads of it fail with :class:`NotFoundError`."""
        self._inner.release(_step(step))

    def pending(self) -> list[tuple[int, int, int]]:
        """Steps some writer ranks ended that are not committed: ``(step, ranks that ended it,
        ranks it waits for)``, on both engines."""
        return self._inner.pending()

    @property
    def attrs(self) -> dict[str, Any]:
        """The dataset's attributes (as of the last committed step)."""
        return metadata.from_json(self._inner.attrs())

    def to_dask(self, name: str) -> Any:
        """Global variable ``name`` over the committed steps as a lazy Dask array of shape
        ``(steps, *shape)``, one chunk per step and per written block (the block edges of the last
        step); a step where it is missing or partly written reads as NaN (floats)."""
        import dask.array as da

        from .step_array import StepArray

        arr = StepArray(self, name)
        # Named, not tokenized: the reader's native handle cannot be hashed by content.
        return da.from_array(arr, chunks=arr.chunks(), asarray=False, lock=False, fancy=False,
                             meta=np.empty((0,) * arr.ndim, dtype=arr.dtype), name=f"cairn-{name}-{uuid.uuid4().hex}")

    def close(self) -> None:
        """Release the handle (files are closed when it is collected)."""

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _writer(writer: Any) -> int:
    return _check.integer(writer, "writer", 0, _check.U32 - 1,
                          f"give the rank of the writer that put the block, from 0 to {_check.U32 - 1}")


def _inside(name: str, shape: list[int], offset: list[int], count: list[int]) -> None:
    """Refuses a box outside ``shape`` before memory is set aside for it."""
    if len(offset) != len(shape) or len(count) != len(shape):
        raise InvalidArgumentError(f"box of '{name}' offset {offset} count {count}: give one value per dimension of its "
                                   f"shape {shape}")
    for d, (o, c, n) in enumerate(zip(offset, count, shape)):
        if o + c > n:
            raise InvalidArgumentError(f"requested box of '{name}' offset {offset} count {count} ends at {o + c} along "
                                       f"dimension {d}, outside the global shape {shape}; read a box inside it")


def _empty(name: str, count: list[int], dtype: str) -> np.ndarray:
    """The array a read of ``count`` elements fills, or :class:`InvalidArgumentError` if this
    process cannot hold it."""
    from . import _reuse

    try:
        return _reuse.empty(tuple(count), dtype)
    except (ValueError, MemoryError) as e:
        raise InvalidArgumentError(f"reading box count {count} of '{name}' at once needs more memory than this process "
                                   f"can allocate ({e}); read smaller boxes, e.g. f['{name}'][step, i] row by row") from None


def _little_endian_c(data: Any) -> np.ndarray:
    """``data`` as a C-contiguous little-endian array (no copy when it already is one)."""
    try:
        arr = np.asarray(data)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"data {_check.show(data)} is not an array ({e}); give a numpy array, or nested "
                                   "lists of numbers of one shape") from None
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and np.little_endian is False):
        return arr.astype(arr.dtype.newbyteorder("<"), order="C")
    # Not np.ascontiguousarray: it makes a 0-d array (a per-step scalar) 1-d.
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _np_name(dtype: str) -> str:
    return "V1" if dtype == "bytes" else "<" + dtype


def halt_requested_warn() -> None:
    """Reports a stale halt file once per process (see :func:`cairn.halt_requested`)."""
    if (stale := _native.halt_stale_warning()) is not None:
        warnings.warn(stale, RuntimeWarning, stacklevel=3)
