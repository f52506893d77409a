"""Histories of ``cairn chaos`` and the checker of their rules (in the manner of Jepsen's Knossos
and Elle): every operation of the workload is recorded as it is invoked and as it completes, one
JSON object per line, and :func:`check` decides afterwards whether what was observed breaks a
rule of the staging cluster.

A record: ``{"process", "type", "f", "dataset", "step", "var", "box", "crc", "time"}`` and, where
they apply, ``value`` (``end``: whether the call committed; ``wait_drained``: its result; a
listing, which is a ``read`` without ``var``: the steps), ``error`` (``"ClassName: message"``),
``lease`` (seconds: a stream registration's or a claim's), ``timeout`` (a writer's call deadline),
``dst`` (the dataset a ``consume`` commits into) and, on a read's completion, ``level``: where the
bytes came from, ``"memory"`` (the servers), ``"disk"`` (a drained copy), ``"mixed"`` or
``"unknown"``; on a listing's invoke ``level`` ``"memory"`` asks for only the steps memory holds. An ``rm`` with a ``step`` discards the steps
from that one on (a restart's ``from_step``); without one, the whole dataset. ``type`` is ``invoke`` and then ``ok``,
``fail`` (it did not happen) or ``info`` (unknown whether it happened: a deadline or a lost
connection during a change); an invoke its process never completed (it was killed) counts as
``info``. ``f`` is one of :data:`FS`, or a nemesis's event (process ``nemesis``, type ``info``; those the
rules read: :data:`SERVER_FAULTS`, ``kill-all``, ``cluster-stop`` and ``cluster-start`` around a
planned restart of the whole cluster, ``rival-open``).
``box`` is ``[offset, count]``; ``crc`` the crc32c (:func:`crc32c`, hardware crc32c of the
little-endian C-order bytes) of what a writer put (on ``end``; on ``consume`` of what it put into
``dst``) or a read returned. ``time``: seconds on the host's monotonic clock (the same in every
process of the machine, unmoved by clock adjustments).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np

from . import _native
from .exceptions import (AlreadyExistsError, CairnError, CapacityError, ConflictError, DataLossError, InvalidArgumentError,
                         NotFoundError, StepError)

FIELDS = ("process", "type", "f", "dataset", "step", "var", "box", "crc", "time")
TYPES = ("invoke", "ok", "fail", "info")
FS = ("begin", "end", "read", "claim", "consume", "release", "wait_drained", "rm")
#: Operations that change the cluster: a deadline or a lost connection leaves them unknown (info).
CHANGES = ("end", "claim", "consume", "release", "rm")
#: Errors that say the operation did not happen.
DEFINITE = (StepError, ConflictError, AlreadyExistsError, NotFoundError, CapacityError, InvalidArgumentError, DataLossError)
#: Scheduling and round trips a writer's wait for room may take beyond the bound (2 busy cores).
SLACK_S = 2.0
#: Server faults during which the control plane may lawfully not answer: the failure timeout
#: (the run's start record says it, else this) plus an election and a view change.
FAILURE_TIMEOUT_S, ELECTION_S = 3.0, 2.0
SERVER_FAULTS = ("kill", "stop", "cut", "died")
#: Levels a read may record it was served from (a drained copy is ``"disk"``).
LEVELS = ("memory", "disk", "mixed", "unknown")
#: Violations listed in a report (the first ones in time); the counts cover all.
SHOWN = 20


def crc32c(a: np.ndarray) -> int:
    """crc32c of an array's little-endian C-order bytes: what writers record of what they put
    and readers of what they got (the blocks' own checksums use the same function)."""
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return int(_native.crc32c(a.reshape(-1).view(np.uint8), 0))


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class Recorder:
    """Appends records to a history file: thread-safe, and safe across processes, each record one
    whole-line ``write`` to a file opened for appending (the kernel never interleaves those)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.lock = threading.Lock()

    def write(self, process: str, type: str, f: str, **fields: Any) -> dict[str, Any]:  # noqa: A002 - the record's key
        rec: dict[str, Any] = {"process": process, "type": type, "f": f, "dataset": None, "step": None, "var": None,
                               "box": None, "crc": None, "time": time.monotonic()}
        rec.update(fields)
        line = (json.dumps(rec, separators=(",", ":"), default=_plain) + "\n").encode()
        with self.lock:
            if self.fd >= 0:  # after close (a run that failed with workload threads still going): dropped
                os.write(self.fd, line)
        return rec

    def event(self, f: str, process: str = "nemesis", **fields: Any) -> None:
        """A nemesis's (or the run's) event: one ``info`` record."""
        self.write(process, "info", f, **fields)

    @contextlib.contextmanager
    def op(self, process: str, f: str, **fields: Any) -> Iterator[dict[str, Any]]:
        """Records the invoke, runs the block, records the completion: ``ok`` with what the block
        put in the dict it was given (``crc``, ``value``), else ``fail`` or ``info`` with the
        error, which propagates."""
        self.write(process, "invoke", f, **fields)
        done: dict[str, Any] = {}
        try:
            yield done
        except CairnError as e:
            definite = f not in CHANGES or isinstance(e, DEFINITE)
            self.write(process, "fail" if definite else "info", f, **fields, error=error_text(e))
            raise
        except BaseException as e:
            self.write(process, "info", f, **fields, error=error_text(e))
            raise
        self.write(process, "ok", f, **{**fields, **done})

    def close(self) -> None:
        with self.lock:
            os.close(self.fd)
            self.fd = -1


def _plain(v: Any) -> Any:
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, (tuple, np.ndarray)):
        return list(v)
    raise TypeError(f"cannot record {type(v).__name__}")


def load(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a history file; :class:`ValueError` naming the line that is not one."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not a JSON record ({e})") from None
            missing = [k for k in FIELDS if not isinstance(rec, dict) or k not in rec]
            if missing or rec["type"] not in TYPES:
                raise ValueError(f"{path}:{n}: not a history record (missing {missing or 'a valid type'})")
            rec["line"] = n
            out.append(rec)
    return out


@dataclass
class Op:
    """An invoke and its completion (``info`` with ``done`` infinite when there was none)."""

    inv: dict[str, Any]
    end: dict[str, Any] | None

    @property
    def type(self) -> str:
        return self.end["type"] if self.end else "info"

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        if self.end is not None and self.end.get(key) is not None:
            return self.end[key]
        return self.inv.get(key)

    @property
    def t0(self) -> float:
        return self.inv["time"]

    @property
    def t1(self) -> float:
        return self.end["time"] if self.end else float("inf")

    @property
    def err(self) -> str:
        return (self.end or {}).get("error") or ""

    def failed_with(self, *kinds: str) -> bool:
        return self.type != "ok" and self.err.split(":", 1)[0] in kinds

    def show(self) -> list[dict[str, Any]]:
        return [self.inv] + ([self.end] if self.end else [])


def pair(records: Iterable[dict[str, Any]]) -> tuple[list[Op], list[dict[str, Any]]]:
    """Operations (each process's invoke with its next record) in invoke order, and the events."""
    ops: list[Op] = []
    events: list[dict[str, Any]] = []
    open_: dict[str, Op] = {}
    for rec in records:
        if rec["type"] == "invoke":
            open_[rec["process"]] = op = Op(rec, None)
            ops.append(op)
        elif rec["process"] in open_ and open_[rec["process"]].inv["f"] == rec["f"]:
            open_.pop(rec["process"]).end = rec
        else:
            events.append(rec)
    ops.sort(key=lambda o: o.t0)
    return ops, events


def _box(box: Any) -> str:
    return json.dumps(box, separators=(",", ":"))


@dataclass
class _State:
    """What the history says, indexed for the rules."""

    ops: list[Op]
    events: list[dict[str, Any]]
    #: (dataset, step, var, box) -> the crc of each put that may have committed (end or consume
    #: not failed) and when its call completed (a discard makes those before it another run's)
    puts: dict[tuple[Any, ...], list[tuple[int, float]]] = field(default_factory=dict)
    #: dataset -> writer processes (those that began a step of it)
    ranks: dict[str, set[str]] = field(default_factory=dict)
    #: (dataset, step) -> process -> when it first invoked the step's end (or its consume into it)
    ended: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    #: (dataset, step) -> when it was first known committed (a committing end, or a reader saw it)
    committed: dict[tuple[str, int], float] = field(default_factory=dict)
    #: (dataset, step) -> when a reader first saw it (a read, a listing, a stream): visible
    seen: dict[tuple[str, int], float] = field(default_factory=dict)
    #: (dataset, step) -> when something was invoked that may release it (release, consume, rm)
    freed: dict[tuple[str, int], float] = field(default_factory=dict)
    #: (dataset, step) -> when a release of it was first invoked
    released: dict[tuple[str, int], float] = field(default_factory=dict)
    #: dataset -> removals invoked: (first step discarded, None for all; invoked, completed ok)
    rm: dict[str, list[tuple[int | None, float, float | None]]] = field(default_factory=dict)
    kill_all: float | None = None
    beyond_level: bool = False
    #: The run drained to disk: a consumed step stays in memory until it is on disk.
    drains: bool = False
    #: When the control plane may have been out: each server fault, for its pause and a failover,
    #: and each planned restart of the whole cluster
    outages: list[tuple[float, float]] = field(default_factory=list)
    #: Planned restarts of the whole cluster: (stop began, the new cluster served); leases die there
    restarts: list[tuple[float, float]] = field(default_factory=list)


def _index(ops: list[Op], events: list[dict[str, Any]]) -> _State:
    st = _State(ops, events)
    failover = FAILURE_TIMEOUT_S + ELECTION_S
    for e in events:
        if e["f"] == "start":
            st.beyond_level = bool((e.get("value") or {}).get("beyond_level"))
            st.drains = bool((e.get("value") or {}).get("drain"))
            failover = float((e.get("value") or {}).get("failure_timeout_s") or FAILURE_TIMEOUT_S) + ELECTION_S
    for e in events:
        if e["f"] == "kill-all" and st.kill_all is None:
            st.kill_all = e["time"]
        if e["process"] == "nemesis" and e["f"] in SERVER_FAULTS:
            st.outages.append((e["time"], e["time"] + float((e.get("value") or {}).get("for_s") or 0) + failover))
    stops = sorted(e["time"] for e in events if e["process"] == "nemesis" and e["f"] == "cluster-stop")
    starts = sorted(e["time"] for e in events if e["process"] == "nemesis" and e["f"] == "cluster-start")
    for t0 in stops:
        t1 = min((t for t in starts if t >= t0), default=float("inf"))
        st.restarts.append((t0, t1))
        st.outages.append((t0, t1 + failover))
    for op in ops:
        ds, s = op.dataset, op.step
        if op.f == "begin":
            st.ranks.setdefault(ds, set()).add(op.process)
        if op.f in ("end", "consume") and s is not None:
            target = ds if op.f == "end" else op.dst
            st.ended.setdefault((target, s), {}).setdefault(op.process, op.t0)
            if op.type != "fail" and op.inv.get("crc") is not None:
                key = (target, s, op.inv["var"], _box(op.inv["box"]))
                st.puts.setdefault(key, []).append((op.inv["crc"], op.t1))
        if op.type == "ok" and op.f == "end" and op.value is True:
            _earliest(st.committed, (ds, s), op.t1)
        if op.f == "consume" and op.type == "ok":
            _earliest(st.committed, (op.dst, s), op.t1)
        if op.f in ("release", "consume") and s is not None:
            _earliest(st.freed, (ds, s), op.t0)
        if op.f == "release" and s is not None:
            _earliest(st.released, (ds, s), op.t0)
        if op.f == "rm":
            st.rm.setdefault(ds, []).append((s, op.t0, op.t1 if op.type == "ok" else None))
        if op.f == "read" and op.type == "ok":
            for step in _visible(op):
                _earliest(st.committed, (ds, step), op.t1)
                _earliest(st.seen, (ds, step), op.t1)
    return st


def _earliest(d: dict[Any, float], key: Any, t: float) -> None:
    if key not in d or t < d[key]:
        d[key] = t


def _listing(op: Op) -> bool:
    """A listing: a read without a variable whose value is the steps (``level`` ``"memory"``: only
    those still in the servers' memory, not those on disk)."""
    return op.f == "read" and op.var is None and isinstance(op.value, list)


def _visible(op: Op) -> list[int]:
    """The steps an ok read showed: a listing's, or the one it read (or a stream yielded)."""
    if _listing(op):
        return op.value
    return [] if op.step is None else [op.step]


def _violation(rule: str, message: str, *ops: Op) -> dict[str, Any]:
    return {"rule": rule, "message": message, "time": max(o.t1 if o.t1 != float("inf") else o.t0 for o in ops),
            "ops": [r for o in ops for r in o.show()]}


def _wrong_bytes(st: _State) -> Iterator[dict[str, Any]]:
    """Every read equals the committed bytes of its step: the crc a writer recorded for that box."""
    for op in st.ops:
        if op.f != "read" or op.type != "ok" or op.crc is None or op.var is None:
            continue
        key = (op.dataset, op.step, op.var, _box(op.box))
        puts = st.puts.get(key)
        want = None if puts is None else {crc for crc, _ in puts}
        cut = _discarded_at(st, op.dataset, op.step, op.t0)
        if puts is not None and cut is not None:
            # Only puts that may have committed after the discard are this step's bytes now.
            fresh = {crc for crc, done in puts if done > cut}
            if op.crc in want - fresh:
                yield _violation("wrong-bytes", f"read {op.dataset} step {op.step} {op.var} {op.box}: crc {op.crc}, bytes put "
                                                "before the step was discarded (rm or from_step)", op)
                continue
        if want is None:
            if op.dataset in st.ranks or (op.dataset, op.step) in st.ended:
                yield _violation("wrong-bytes", f"read {op.dataset} step {op.step} {op.var} {op.box}: no writer put this box "
                                                "of this step", op)
        elif op.crc not in want:
            yield _violation("wrong-bytes", f"read {op.dataset} step {op.step} {op.var} {op.box}: crc {op.crc}, the writers "
                                            f"put {sorted(want)}", op)


def _half_written(st: _State) -> Iterator[dict[str, Any]]:
    """No step is seen before every writer rank ended it (or, for a claim destination, before a
    claimer's consume into it was invoked)."""
    for op in st.ops:
        if op.f != "read" or op.type != "ok":
            continue
        for s in _visible(op):
            ended = st.ended.get((op.dataset, s), {})
            ranks = st.ranks.get(op.dataset)
            if ranks:
                missing = sorted(p for p in ranks if ended.get(p, float("inf")) > op.t1)
            elif ended or (op.dataset, s) in st.committed:
                missing = [] if min(ended.values(), default=float("inf")) <= op.t1 else ["its claimer"]
            else:
                continue
            if missing:
                yield _violation("half-written", f"{op.process} saw {op.dataset} step {s} before {', '.join(missing)} "
                                                 "ended it", op)


def _lost(st: _State) -> Iterator[dict[str, Any]]:
    """A committed step is never lost: no read of it fails with DataLossError, unless the run
    went beyond the redundancy level (its start record says so) or the step was released or
    removed before the read."""
    if st.beyond_level:
        return
    for op in st.ops:
        if op.f != "read" or op.step is None or op.var is None or op.type != "fail" or not op.failed_with("DataLossError"):
            continue
        if _after_the_end(st, op):
            continue
        if not _freed(st, op.dataset, op.step, op.t1) and st.committed.get((op.dataset, op.step), op.t0) < op.t0:
            yield _violation("lost", f"{op.dataset} step {op.step}, committed, read as lost by {op.process}", op)


def _vanished(st: _State) -> Iterator[dict[str, Any]]:
    """A step a reader saw never becomes invisible except by release, rm or the queue's policy
    ("released" in the error): no read of it is "not found" otherwise, a listing that lost it is
    followed by no sight of it again, and a committed step is in the verifier's final listing
    (the last one before every server was killed) unless it was released (a read said so, or it
    is older than every step listed), ``release``d, consumed or removed, or seen after that
    listing. (Visible means seen by a
    reader: a commit's return does not promise that other readers list the step at that
    instant; a listing of what memory holds, ``level`` ``"memory"``, proves nothing.)"""
    last_absent: dict[tuple[str, int], Op] = {}
    for op in st.ops:
        if op.f != "read":
            continue
        ds = op.dataset
        if op.step is not None and op.var is not None and op.type == "fail" and not _after_the_end(st, op):
            # A release or removal under way while the read was may have come first.
            if not _freed(st, ds, op.step, op.t1) and op.failed_with("NotFoundError") and "released" not in op.err \
                    and st.seen.get((ds, op.step), op.t0) < op.t0:
                yield _violation("vanished", f"{ds} step {op.step}, committed, not found by {op.process} (not released)", op)
        if op.type != "ok":
            continue
        for s in _visible(op):
            gone = last_absent.get((ds, s))
            if gone is not None and gone.t1 < op.t0 and not _freed(st, ds, s, op.t0):
                yield _violation("vanished", f"{ds} step {s} was listed, then missing from a listing, then seen again", gone, op)
                last_absent.pop((ds, s))
        if _listing(op) and op.inv.get("level") is None:
            shown = set(op.value)
            for (d, s), t in st.seen.items():
                if d == ds and t < op.t0 and s not in shown and s >= min(shown, default=s):
                    last_absent.setdefault((d, s), op)
    yield from _gone_for_good(st)


def _gone_for_good(st: _State) -> Iterator[dict[str, Any]]:
    """Committed steps missing from the verifier's final full listing of their dataset (not
    below its oldest step) and never seen after it, with no sign that they were released."""
    released = {(op.dataset, op.step) for op in st.ops
                if op.f == "read" and op.step is not None and op.type != "ok" and "released" in op.err}
    lost = {(op.dataset, op.step) for op in st.ops if op.f == "read" and op.failed_with("DataLossError")}
    sights: dict[tuple[str, int], float] = {}  # the last invoke of an ok read that showed the step
    for op in st.ops:
        if op.f == "read" and op.type == "ok":
            for s in _visible(op):
                sights[(op.dataset, s)] = max(sights.get((op.dataset, s), op.t0), op.t0)
    final: dict[str, Op] = {}
    for op in st.ops:
        if op.process == "verifier" and _listing(op) and op.type == "ok" and op.inv.get("level") is None:
            if st.kill_all is None or op.t1 < st.kill_all:
                final[op.dataset] = op
    for (ds, s), t in sorted(st.committed.items(), key=lambda kv: kv[1]):
        last = final.get(ds)
        if last is None or t >= last.t0 or s in last.value or (ds, s) in released or _freed(st, ds, s, last.t1):
            continue
        if s < min(last.value, default=s):
            continue  # below the oldest step kept: released in order (streams, the queue, keep_last)
        if sights.get((ds, s), -1.0) >= last.t0 or (st.beyond_level and (ds, s) in lost):
            continue
        commit = [o for o in st.ops if o.type == "ok" and o.step == s and ((o.f == "end" and o.dataset == ds and o.value is True)
                                                                         or (o.f == "consume" and o.dst == ds))][:1]
        yield _violation("vanished", f"{ds} step {s}, committed, is missing from the final listing and was never seen "
                                     "after it (not released, consumed or removed)", *commit, last)


def _after_the_end(st: _State, op: Op) -> bool:
    """Whether ``op`` is a workload process's (not the verifier's) that was under way when every
    server was killed on purpose: what it found then says nothing of the rules."""
    return st.kill_all is not None and op.process != "verifier" and op.t0 < st.kill_all < op.t1


def _freed(st: _State, ds: str, s: int, before: float) -> bool:
    return st.freed.get((ds, s), float("inf")) < before or _removed(st, ds, s, before)


def _removed(st: _State, ds: str, s: int, before: float = float("inf")) -> bool:
    """Whether a removal of ``ds`` (whole, or from a step up to ``s``) was invoked before ``before``."""
    return any((first is None or s >= first) and t0 < before for first, t0, _ in st.rm.get(ds, []))


def _discarded_at(st: _State, ds: str, s: int, before: float) -> float | None:
    """When the newest removal covering step ``s`` of ``ds`` that completed before ``before`` was
    invoked: puts completed before it are gone for reads that start after it."""
    times = [t0 for first, t0, t1 in st.rm.get(ds, []) if (first is None or s >= first) and t1 is not None and t1 < before]
    return max(times, default=None)


def _claims(st: _State) -> Iterator[dict[str, Any]]:
    """Every claimed step is processed exactly once: one consume commits it, and at the end
    (the verifier's listings) its result is in the destination and the source step gone, or it is
    unprocessed in the source and nowhere else."""
    consumed: dict[tuple[str, int], list[Op]] = {}
    maybe: dict[tuple[str, int], list[Op]] = {}
    claimed: dict[tuple[str, int], Op] = {}
    dst_of: dict[str, str] = {}
    for op in st.ops:
        if op.f == "claim" and op.type == "ok" and op.step is not None:
            claimed.setdefault((op.dataset, op.step), op)
        if op.f == "consume" and op.step is not None:
            dst_of[op.dataset] = op.dst
            if op.type == "ok":
                consumed.setdefault((op.dataset, op.step), []).append(op)
            elif op.type == "info":
                maybe.setdefault((op.dataset, op.step), []).append(op)
    for (src, s), oks in consumed.items():
        if len(oks) > 1:
            yield _violation("claims", f"{src} step {s} was processed {len(oks)} times", *oks)
    final = _final_listings(st)
    for (src, s), claim in claimed.items():
        dst = dst_of.get(src)
        if src not in final or dst not in final:
            continue
        in_src, in_dst = s in final[src][1], s in final[dst][1]
        oks, unknown = consumed.get((src, s), []), maybe.get((src, s), [])
        if in_src and in_dst:
            yield _violation("claims", f"{src} step {s} is both processed into {dst} and still in {src}", claim, final[dst][0])
        elif oks and not in_dst:
            yield _violation("claims", f"{src} step {s} was consumed but its result is not in {dst}", *oks, final[dst][0])
        elif in_dst and not oks and not unknown:
            yield _violation("claims", f"{dst} step {s} is there though no consume of it completed", claim, final[dst][0])
        elif not in_src and not in_dst and (src, s) not in st.released and not _removed(st, src, s):
            yield _violation("claims", f"{src} step {s} was claimed and is neither processed nor left to process", claim,
                             final[src][0])


def _claim_twice(st: _State) -> Iterator[dict[str, Any]]:
    """No step is granted to a claimer while another's lease on it is live. A lease is live from
    its claim's completion until its claimer may have given the step up (it invoked the step's
    consume, or its last operation ended: a claimer whose loop fails or ends gives its steps
    back), and until it may have expired: ``lease`` seconds after the claim was invoked, or later
    while renewals could go on (no server fault or cluster restart since). A second grant is one
    invoked after the first completed and completed within that time."""
    by_process: dict[str, list[Op]] = {}
    for op in st.ops:
        by_process.setdefault(op.process, []).append(op)
    grants: dict[tuple[str, int], list[Op]] = {}
    for op in st.ops:
        if op.f == "claim" and op.type == "ok" and op.step is not None:
            grants.setdefault((op.dataset, op.step), []).append(op)
    for (ds, s), ops in grants.items():
        for first in ops:
            later = by_process[first.process]
            after = [o for o in later if o.t0 >= first.t1 and o is not first]
            consume = next((o for o in after if o.f == "consume" and o.step == s), None)
            given_up = consume.t0 if consume else max((o.t1 for o in after), default=first.t1)
            expires = first.t0 + float(first.inv.get("lease") or 0.0)
            for second in ops:
                if second is first or second.t0 <= first.t1 or second.t1 >= given_up:
                    continue
                renewed = not any(lo < second.t1 and hi > first.t0 for lo, hi in st.outages + st.restarts)
                if second.t1 < expires or renewed:
                    yield _violation("claim-twice", f"{ds} step {s} was granted to {second.process} while {first.process}'s "
                                                    "lease on it was live", first, second)


def _read_after_release(st: _State) -> Iterator[dict[str, Any]]:
    """A step released (a ``release`` or a ``consume`` of it completed) is never read again from
    memory: a read invoked after that returns bytes only from its drained copy (the read's
    ``level`` ``"disk"``; ``"unknown"`` proves nothing), unless a removal let the step be written
    again since. In a run that drains, a consumed step keeps its objects until it is on disk
    (docs/guide.md, *Consumed steps are drained too*): a reader holding its index may read it
    from memory until then, and its bytes are judged by ``wrong-bytes``."""
    done: dict[tuple[str, int], Op] = {}
    released = ("release",) if st.drains else ("release", "consume")
    for op in st.ops:
        if op.f in released and op.type == "ok" and op.step is not None:
            key = (op.dataset, op.step)
            if key not in done or op.t1 < done[key].t1:
                done[key] = op
    for op in st.ops:
        if op.f != "read" or op.type != "ok" or op.var is None or op.step is None:
            continue
        rel = done.get((op.dataset, op.step))
        if rel is None or rel.t1 >= op.t0 or op.level in ("disk", "unknown"):
            continue
        if any((first is None or op.step >= first) and rel.t0 < t0 < op.t0 for first, t0, _ in st.rm.get(op.dataset, [])):
            continue  # discarded and written again since the release
        yield _violation("read-after-release", f"{op.process} read {op.dataset} step {op.step} from "
                                               f"{op.level or 'memory'} after its {rel.f} completed", rel, op)


def _rival_open(st: _State) -> Iterator[dict[str, Any]]:
    """A second cluster never opens, in mode "w", a dataset whose drain folder holds this run's
    committed steps (the ``rival`` nemesis's ``rival-open`` event: it must be refused,
    ``AlreadyExistsError`` with code ``foreign_drain``)."""
    for e in st.events:
        value = e.get("value") or {}
        if e["process"] == "nemesis" and e["f"] == "rival-open" and value.get("opened"):
            yield {"rule": "rival-open", "message": f"a second cluster opened {value.get('dataset')} in mode \"w\" on the "
                                                    f"drain folder {value.get('drain')}, which holds this run's steps",
                   "time": e["time"], "ops": [e]}


def _final_listings(st: _State) -> dict[str, tuple[Op, set[int]]]:
    """Each dataset's last listing by the verifier before every server was killed."""
    out: dict[str, tuple[Op, set[int]]] = {}
    for op in st.ops:
        if op.process == "verifier" and _listing(op) and op.type == "ok":
            if st.kill_all is None or op.t1 < st.kill_all:
                out[op.dataset] = (op, set(op.value))
    return out


def _drained(st: _State) -> Iterator[dict[str, Any]]:
    """Every step whose wait_drained returned True reads back exactly from disk after every
    server was SIGKILLed (the verifier's reads then; their bytes are checked by wrong-bytes)."""
    if st.kill_all is None:
        return
    after: dict[tuple[str, int], list[Op]] = {}
    for op in st.ops:
        if op.process == "verifier" and op.f == "read" and op.var is not None and op.t0 >= st.kill_all:
            after.setdefault((op.dataset, op.step), []).append(op)
    newest: dict[tuple[str, int], Op] = {}
    for op in st.ops:
        if op.f == "wait_drained" and op.type == "ok" and op.value is True:
            newest[(op.dataset, op.step)] = op
    for key, op in newest.items():
        if any((first is None or key[1] >= first) and t0 > op.t1 for first, t0, _ in st.rm.get(key[0], [])):
            continue  # discarded after it drained: the promise went with it
        reads = after.get(key, [])
        boxes = {k[3] for k in st.puts if k[:2] == key}
        good = {_box(r.box) for r in reads if r.type == "ok"}
        bad = [r for r in reads if r.type != "ok"]
        if bad:
            yield _violation("drained", f"{op.dataset} step {op.step} was drained, and after every server was killed "
                                        f"reading it failed: {bad[0].err}", op, bad[0])
        elif boxes - good:
            yield _violation("drained", f"{op.dataset} step {op.step} was drained, and after every server was killed "
                                        f"{len(boxes - good)} of its boxes were not read back", op)


def _writer_waits(st: _State) -> Iterator[dict[str, Any]]:
    """No writer waits for room longer than max(timeout, longest registered lease + 1 s) (plus
    :data:`SLACK_S`, and the time server faults overlapping the wait may keep the control plane
    out): a begin that went through or failed with CapacityError (a full queue), or a run of
    begins of one step that each failed so, and the one that ended it. The longest lease is the
    longest any op on the dataset recorded (stream registrations, claims)."""
    leases: dict[str, float] = {}
    for op in st.ops:
        if op.inv.get("lease") is not None:
            leases[op.dataset] = max(leases.get(op.dataset, 0.0), float(op.inv["lease"]))
    runs: dict[tuple[str, str, int], Op] = {}  # a writer's first begin of the wait under way
    told: set[tuple[str, str, int]] = set()
    for op in st.ops:
        if op.f != "begin" or op.inv.get("timeout") is None or op.t1 == float("inf"):
            continue
        if op.type != "ok" and not op.failed_with("CapacityError"):
            runs.pop((op.process, op.dataset, op.step), None)  # not a wait for room (no leader, a server down)
            told.discard((op.process, op.dataset, op.step))
            continue
        key = (op.process, op.dataset, op.step)
        first = runs.get(key, op)
        bound = max(float(op.inv["timeout"]), leases.get(op.dataset, 0.0) + 1.0)
        waited = op.t1 - first.t0
        if waited > bound + SLACK_S + _overlap(st.outages, first.t0, op.t1) and key not in told:
            told.add(key)  # once per wait
            why = "and was still refused" if op.type != "ok" else "before it began"
            yield _violation("writer-wait", f"{op.process} waited {waited:.1f} s for room for {op.dataset} step {op.step} "
                                            f"{why}; the bound is {bound:.1f} s", *([first] if first is not op else []), op)
        if op.type == "ok":
            told.discard(key)
            runs.pop(key, None)
        else:
            runs.setdefault(key, op)


def _overlap(spans: list[tuple[float, float]], a: float, b: float) -> float:
    """How much of ``a..b`` the union of ``spans`` covers."""
    covered, at = 0.0, a
    for lo, hi in sorted(spans):
        lo, hi = max(lo, at), min(hi, b)
        if hi > lo:
            covered += hi - lo
            at = hi
    return covered


def _stream_raised(st: _State) -> Iterator[dict[str, Any]]:
    """A stream never raises for a step another reader or the queue released: it skips it and
    warns (a stream's next step is a read without ``var``, marked ``stream``, its step the one
    yielded)."""
    for op in st.ops:
        if op.inv.get("stream") and op.step is None and op.failed_with("NotFoundError") and "released" in op.err:
            yield _violation("stream-raised", f"{op.process}'s stream raised for a released step instead of skipping it", op)


#: Each rule's name (the one its violations carry) and its function.
RULES = {"wrong-bytes": _wrong_bytes, "half-written": _half_written, "lost": _lost, "vanished": _vanished,
         "claims": _claims, "claim-twice": _claim_twice, "read-after-release": _read_after_release, "drained": _drained,
         "writer-wait": _writer_waits, "stream-raised": _stream_raised, "rival-open": _rival_open}


def check(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The report on a history: ``valid``, the operations by kind and outcome, and the
    violations (the first :data:`SHOWN` in time, each with its rule, a message and the records
    of the operations involved)."""
    ops, events = pair(records)
    st = _index(ops, events)
    found = sorted((v for rule in RULES.values() for v in rule(st)), key=lambda v: v["time"])
    counts: dict[str, int] = {}
    for op in ops:
        k = f"{op.f}:{op.type}"
        counts[k] = counts.get(k, 0) + 1
    by_rule: dict[str, int] = {}
    for v in found:
        by_rule[v["rule"]] = by_rule.get(v["rule"], 0) + 1
    notes = []
    if st.kill_all is None and any(o.f == "wait_drained" and o.value is True for o in ops):
        notes.append("no kill-all in the history: drained steps were not read back from disk")
    if st.beyond_level:
        notes.append("the run went beyond the redundancy level: losses are not violations")
    if any(e["f"] == "no-leader" for e in events):
        notes.append("the cluster had no leader at the end: the verifier read nothing before the kill")
    return {"valid": not found, "operations": len(ops), "events": len(events), "counts": dict(sorted(counts.items())),
            "violations_by_rule": by_rule, "violations": found[:SHOWN], "notes": notes}
