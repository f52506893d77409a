"""``cairn chaos``: SIGKILL staging servers at exponential intervals (mean ``--mtbf``) while the
cluster serves a workload, and report what it cost (CoREC §4.1, Fig. 14-16).

A kill that would leave more servers down or recovering than the cluster's redundancy level waits
until recovery catches up (reported as deferred) unless ``--beyond-level``. A killed control-plane
voter is replaced by the spare that takes its slot (it joins the control plane in its place), and a
kill never leaves fewer than a majority of the voters alive. A killed server is started again (same id,
same command line, same port) once the control plane has declared it down, so it rejoins empty as
the next spare. With ``--workload`` a built-in workload runs: ``--writers`` ranks write a 2-D field
each step, ``--readers`` read and check committed steps; its response times before the first kill
(the fault-free baseline) are compared with those under failures. Without it, chaos runs beside
your own workload and checks every committed step of every dataset at the end. Only servers of
this machine can be killed (their pids are in the cluster's entries).

With ``--history FILE`` the workload grows (stream readers that come and go, claimers that
consume and produce, ``wait_drained`` calls, a blocking queue) and every operation is recorded;
``--nemesis`` combines faults (SIGKILL and SIGSTOP of the leader and of other servers, network
partitions, a full drain disk, reader churn, drain fail points, and at the seams: every member
replaced by a spare, servers lost with no spare, a rival cluster on the same drain folder, a
planned restart of the whole cluster, writers sent back with ``from_step``); at the end a
verifier reads everything back (and, with a drain, again from disk after every server is
SIGKILLed) and the history is checked (:mod:`cairn.history`). ``--check FILE`` checks a saved
history again; ``--seeds N`` runs N mixes of nemeses the seeds draw, and ``--seed S --seeds 1``
replays one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from . import _check, _native, cluster, history
from ._check import int_arg, seconds_arg
from .exceptions import AlreadyExistsError, CairnError, ConflictError, DataLossError, InvalidArgumentError, NotFoundError
from .history import Recorder, crc32c


def seconds(text: str | float) -> float:
    """Seconds in ``"18s"``, ``"250ms"``, ``"2m"`` or a number (parsed in Rust, like the servers)."""
    return float(_native.parse_duration(str(text)))


def _debug(msg: str) -> None:
    """With CAIRN_CHAOS_DEBUG set, a wall-clock-stamped line on stderr (to line up with server logs)."""
    if os.environ.get("CAIRN_CHAOS_DEBUG"):
        print(f"{time.time():.3f} {msg}", file=sys.stderr, flush=True)


def _entry(file: Path, sid: int) -> dict[str, Any]:
    """A server's current entry (its pid changes when it is started again)."""
    return json.loads((cluster.entries_dir(file) / f"server-{sid}.json").read_text())


def _field(rank: int, nranks: int, step: int, n: int, salt: float = 0.0) -> np.ndarray:
    rows = n // nranks
    base = np.arange(rows * n, dtype="f8").reshape(rows, n)
    return base + 1e6 * step + 1e3 * rank + salt


@contextlib.contextmanager
def _unrecorded(*_: Any, **__: Any) -> Iterator[dict[str, Any]]:
    """Stands for :meth:`Recorder.op` without a history."""
    yield {}


def read_box(r: Any, var: str, step: int, box: list[list[int]]) -> tuple[np.ndarray, str]:
    """Reads ``box`` (``[offset, count]``) of ``var`` at ``step`` and says which level served it:
    the level (``BlockInfo.level``) of the blocks meeting the box as listed right after the
    read, ``"memory"`` or ``"disk"`` (a drained copy), ``"mixed"``, or ``"unknown"`` when the
    listing failed."""
    a = r.get(var, step, offset=box[0], count=box[1])
    try:
        levels = {b.level for b in r.blocks(var, step) if _meets(b.offset, b.count, box)}
    except CairnError:
        return a, "unknown"
    return a, (levels.pop() if len(levels) == 1 else "mixed" if levels else "unknown")


def _meets(offset: tuple[int, ...], count: tuple[int, ...], box: list[list[int]]) -> bool:
    return all(o < bo + bc and bo < o + c for o, c, bo, bc in zip(offset, count, box[0], box[1]))


@dataclass
class _Hold:
    """A nemesis's hold on the workload (:meth:`Workload.hold`)."""

    roles: set[str]
    after: int
    parked: set[str] = field(default_factory=set)
    resumed: threading.Event = field(default_factory=threading.Event)


class Workload:
    """``writers`` ranks write an n×n field step after step; ``readers`` read committed steps and
    check every value. Times are kept per phase (``"baseline"`` before the first kill, then
    ``"chaos"``).

    With a history (``rec``) every operation is recorded, the field carries a salt drawn for the
    run (another run's bytes never pass for this one's), the dataset has a queue (``queue``:
    ``(limit, policy)``), and a producer writes ``<dataset>-work`` for ``claimers`` that consume
    each step into ``<dataset>-out``; with ``drain`` a drainer waits for steps to reach disk."""

    def __init__(self, file: Path, dataset: str, writers: int, readers: int, steps: int, n: int, timeout: float, interval: float,
                 rec: Recorder | None = None, queue: tuple[int, str] | None = None, claimers: int = 0, drain: bool = False,
                 churn: bool = False, seed: int = 0, transport: str | None = None):
        self.file, self.dataset, self.writers, self.readers, self.steps, self.n = file, dataset, writers, readers, steps, n
        self.interval, self.timeout = interval, timeout
        self.opts: dict[str, Any] = dict(engine="staging", cluster=str(file), object_size=16 << 10, timeout=timeout)
        if transport:
            self.opts["transport"] = transport
        self.session = f"chaos-{os.getpid()}-{time.time_ns()}"  # the writer ranks' shared session
        self.phase = "baseline"
        self.times: dict[str, dict[str, list[float]]] = {"baseline": {"write": [], "read": []}, "chaos": {"write": [], "read": []}}
        self.counts = {"write_retries": 0, "degraded_reads": 0, "read_errors": 0, "lost_reads": 0, "wrong_reads": 0}
        self.lock = threading.Lock()
        self.done = threading.Event()
        #: Writers stop after this step (set when the run's duration is up), all at the same one,
        #: so the last step commits.
        self.stop_after: int | None = None
        self.at = [0] * writers  # the step each writer is at
        self.written = 0  # steps written (by any rank)
        self.errors: list[str] = []
        self.ended: list[float] = []  # when each writer finished (the run's time)
        self.rec, self.queue, self.claimers, self.drain, self.churn, self.seed = rec, queue, claimers, drain, churn, seed
        #: Set once every server is killed on purpose at the end: workload threads still in a
        #: call then (stuck far beyond their deadline) record nothing more.
        self.quiet = False
        self.salt = random.SystemRandom().randrange(1, 1 << 12) / (1 << 12) if rec else 0.0
        self.work, self.out = f"{dataset}-work", f"{dataset}-out"
        #: Steps whose end committed (by dataset), and steps wait_drained said are on disk.
        self.committed: dict[str, set[int]] = {dataset: set(), self.work: set()}
        self.drained: set[int] = set()
        self.claims_over = threading.Event()  # every claimer's loop ended (nothing left to claim)
        self.producer_over = threading.Event()  # the producer ended (closed, or failed): no step comes
        self.claim_lease = max(1.0, min(timeout, 3.0))
        #: A nemesis's hold (:meth:`hold`): the roles it names park at their next boundary.
        self.held: _Hold | None = None
        #: Bumped by a restart of the whole cluster: every handle opened before is reopened.
        self.epoch = 0
        #: The discards so far (``from_step``): each gives the field a new salt, and the step the
        #: writer ranks go back to.
        self.discards = 0
        self.back_to: int | None = None
        self.salts: dict[int, float] = {}  # step -> the salt it was last written with
        self.live: set[str] = set()  # workload threads running (those a hold waits for)

    def op(self, process: str, f: str, **fields: Any) -> contextlib.AbstractContextManager[dict[str, Any]]:
        """:meth:`Recorder.op`, or nothing recorded (no history, or after the end's kill)."""
        if self.rec is None or self.quiet:
            return _unrecorded()
        return self.rec.op(process, f, **fields)

    def boxes(self) -> list[list[list[int]]]:
        """Each writer rank's box of ``u`` as ``[offset, count]``."""
        rows = self.n // self.writers
        return [[[k * rows, 0], [rows, self.n]] for k in range(self.writers)]

    def _count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def _time(self, kind: str, t: float, what: str) -> None:
        with self.lock:
            self.times[self.phase][kind].append(t)
        if t > 0.05:
            _debug(f"slow {kind}: {what} took {t:.3f} s")

    def hold(self, roles: set[str], after: int | None = None) -> _Hold:
        """Holds the threads of ``roles`` (``writer``, ``producer``, ``claimer``, ``reader``,
        ``drainer``) at their next boundary: writer ranks once they ended every step up to
        ``after`` (all the same one, so it commits), claimers once nothing is left to claim."""
        h = _Hold(roles, max(self.at) if after is None else after)
        self.held = h
        return h

    def wait_held(self, h: _Hold, roles: set[str], deadline: float) -> bool:
        """Waits until every running thread of ``roles`` parked, or until ``deadline``."""
        while time.monotonic() < deadline:
            with self.lock:
                want = {t for t in self.live if t.split("-")[0] in roles}
                if want <= h.parked:
                    return True
            time.sleep(0.05)
        _debug(f"hold: not parked in time: {sorted(want - h.parked)}")
        return False

    def resume(self, h: _Hold) -> None:
        if self.held is h:
            self.held = None
        h.resumed.set()

    def _park(self, who: str, step: int | None = None) -> bool:
        """Waits while a hold names ``who``'s role (a writer rank only before a step after the
        hold's); whether it parked."""
        h, role = self.held, who.split("-")[0]
        if h is None or role not in h.roles or (step is not None and step <= h.after) or self.done.is_set():
            return False
        with self.lock:
            h.parked.add(who)
        while not h.resumed.wait(0.2) and not self.done.is_set():
            pass
        with self.lock:
            h.parked.discard(who)
        return True

    def _holding(self, role: str) -> bool:
        h = self.held
        return h is not None and role in h.roles

    def _write_step(self, w: Any, proc: str, ds: str, step: int, var: str, data: np.ndarray, box: list[list[int]],
                    unsure: bool) -> bool:
        """One attempt at a step: begin, put, end (aborted on an error, which propagates).
        Whether it committed; a step an earlier attempt may have committed (``unsure``: its end's
        outcome is unknown) that is already there counts as committed."""
        try:
            with self.op(proc, "begin", dataset=ds, step=step, timeout=self.timeout):
                w.begin_step(step)
        except AlreadyExistsError:
            if unsure:
                return True
            raise
        try:
            w.put(var, data, offset=tuple(box[0]))
            with self.op(proc, "end", dataset=ds, step=step, var=var, box=box, crc=crc32c(data)) as done:
                done["value"] = w.end_step()
            return bool(done["value"])
        except BaseException:
            with contextlib.suppress(CairnError):
                w.abort_step()
            raise

    def _steps(self, w: Any, proc: str, ds: str, var: str, rank: int, make: Callable[[int], np.ndarray],
               box: list[list[int]], reopen: Callable[[Any, int | None], Any]) -> Any:
        """Writes steps of ``ds`` until ``steps`` or ``stop_after``, retrying a failed step; at
        a nemesis's hold it parks between steps, and afterwards reopens its writer (``reopen``:
        the old one, the step to discard from or None) when the cluster was restarted or the
        steps from one on are to be discarded, going on at the reopened writer's next step.
        Returns the writer it ends with."""
        s, epoch, discards = 0, self.epoch, self.discards
        while s < self.steps:
            # Writer ranks stop together after one step; the producer at once.
            if self.stop_after is not None and (s > self.stop_after or rank < 0):
                break
            self._park(proc, s if rank >= 0 else None)
            back = self.back_to if rank >= 0 and self.discards != discards else None
            if self.epoch != epoch or back is not None:
                epoch, discards = self.epoch, self.discards
                w = reopen(w, back)
                s = w.next_step
                continue
            if rank >= 0:
                self.at[rank] = s
            time.sleep(self.interval)  # the simulation computing
            data, unsure = make(s), False
            for attempt in range(10):
                t = time.perf_counter()
                try:
                    committed = self._write_step(w, proc, ds, s, var, data, box, unsure)
                    self._time("write", time.perf_counter() - t, f"{proc} step {s}")
                    with self.lock:
                        self.written += rank >= 0
                        if committed:
                            self.committed[ds].add(s)
                    break
                except CairnError as e:
                    if isinstance(e, ConflictError) and "will never commit" in str(e):
                        break  # the step aborted for this session (a server failed under it): write the next
                    unsure = unsure or not isinstance(e, history.DEFINITE)
                    self._count("write_retries")
                    _debug(f"write retry: {proc} step {s} after {time.perf_counter() - t:.3f} s: {e}")
                    if attempt == 9:
                        self.errors.append(f"{proc} gave up on step {s}: {e}")
                        return w
                    time.sleep(0.2)
            s += 1
        return w

    def _reopen(self, w: Any, proc: str, name: str, back: int | None, **kw: Any) -> Any:
        """A writer of ``name`` opened again in mode "a" (a restart of the application: a new
        session), after closing ``w`` (an error of a stopped cluster's writer is its own);
        with ``back`` going back to that step (``from_step``: rank 0 discards the steps from it
        on, recorded as an ``rm`` with that step; the other ranks wait until it did)."""
        import cairn

        with contextlib.suppress(CairnError):
            w.close()
        for attempt in range(10):
            try:
                if back is not None and kw.get("rank", 0) == 0:
                    with self.op(proc, "rm", dataset=name, step=back):
                        return cairn.open(name, "a", from_step=back, **kw, **self.opts)
                return cairn.open(name, "a", **({"from_step": back} if back is not None else {}), **kw, **self.opts)
            except CairnError as e:
                _debug(f"{proc}: reopening {name} failed: {e}")
                if attempt == 9:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def _salted(self, rank: int, step: int) -> np.ndarray:
        """Rank ``rank``'s part of ``step`` as written now: a discard gives the run a new salt."""
        salt = self.salt + self.discards / 8
        with self.lock:
            self.salts[step] = salt
        return _field(rank, self.writers, step, self.n, salt)

    def _thread_live(self, name: str, live: bool) -> None:
        with self.lock:
            (self.live.add if live else self.live.discard)(name)

    def writer(self, rank: int) -> None:
        import cairn

        proc = f"writer-{rank}"
        self._thread_live(proc, True)
        try:
            w = cairn.open(self.dataset, "w", rank=rank, nranks=self.writers, session=self.session, **self.opts)
            w.define("u", "f8", (self.n, self.n))
            if self.queue:
                w.define_queue(*self.queue)

            def reopen(old: Any, back: int | None) -> Any:
                new = self._reopen(old, proc, self.dataset, back, rank=rank, nranks=self.writers,
                                   session=f"{self.session}-{self.epoch}.{self.discards}")
                if self.queue:
                    new.define_queue(*self.queue)
                return new

            make = lambda s: self._salted(rank, s)  # noqa: E731
            w = self._steps(w, proc, self.dataset, "u", rank, make, self.boxes()[rank], reopen)
            w.close()
        except CairnError as e:
            self.errors.append(f"writer {rank}: {e}")
        finally:
            self._thread_live(proc, False)
            with self.lock:
                self.ended.append(time.monotonic())

    def producer(self) -> None:
        """Writes ``<dataset>-work`` (a 4×n field a step) for the claimers, as one rank."""
        import cairn

        self._thread_live("producer", True)
        try:
            w = cairn.open(self.work, "w", **self.opts)
            w.define("w", "f8", (4, self.n))
            make = lambda s: np.arange(4 * self.n, dtype="f8").reshape(4, self.n) + 1e3 * s + self.salt  # noqa: E731
            w = self._steps(w, "producer", self.work, "w", -1, make, [[0, 0], [4, self.n]],
                            lambda old, _: self._reopen(old, "producer", self.work, None))
            w.close()
        except CairnError as e:
            self.errors.append(f"producer: {e}")
        finally:
            self.producer_over.set()
            self._thread_live("producer", False)

    def claimer(self, k: int) -> None:
        """Claims steps of the work dataset and consumes each into ``<dataset>-out`` (its column
        means, committed with the release of the step it came from); with churn it leaves after
        a few steps and comes back as a new claimer. Ends once nothing is left to claim. At a
        hold it claims on until nothing is left to claim now, then parks (holding no step)."""
        import cairn

        name = f"claimer-{k}"
        self._thread_live(name, True)
        rng, gen, epoch = random.Random(self.seed * 1000 + k), 0, self.epoch
        dst = steps = None
        try:
            src = cairn.open(self.work, "r", **self.opts)
            while not self.done.is_set():
                self._park(name)
                if self.epoch != epoch:  # the cluster was restarted: open again (the destination with "a")
                    epoch, src = self.epoch, cairn.open(self.work, "r", **self.opts)
                    if dst is not None:
                        with contextlib.suppress(CairnError):
                            dst.close()
                        dst = None
                gen += 1
                proc = f"claimer-{k}.{gen}"
                try:
                    if dst is None:
                        dst = self._destination(epoch)
                    steps = src.claims(lease=self.claim_lease, timeout=1.0)
                    while True:
                        with self.op(proc, "claim", dataset=self.work, lease=self.claim_lease) as got:
                            s = got["step"] = next(steps, None)
                        if s is None:
                            if not self._holding("claimer") and (self.producer_over.is_set() or src._inner.listing()[1]):
                                dst.close()
                                return  # the producer closed the work dataset (or failed) and nothing is left
                            break  # none came for a second: claim again (or park)
                        box = [[0, 0], [4, self.n]]
                        with self.op(proc, "read", dataset=self.work, step=s, var="w", box=box) as got:
                            a, got["level"] = read_box(src, "w", s, box)
                            got["crc"] = crc32c(a)
                        m = a.mean(axis=0)
                        with self.op(proc, "consume", dataset=self.work, step=s, dst=self.out, var="m", box=[[0], [self.n]],
                                     crc=crc32c(m)):
                            with dst.step(s, consume=src):
                                dst.put("m", m)
                        # The consume released the step it came from: read again, only a drained copy may answer.
                        with contextlib.suppress(CairnError), self.op(proc, "read", dataset=self.work, step=s, var="w",
                                                                      box=box) as got:
                            a, got["level"] = read_box(src, "w", s, box)
                            got["crc"] = crc32c(a)
                        if self.churn and rng.random() < 0.25:
                            break  # leave: steps claimed and not consumed go back
                except CairnError as e:
                    _debug(f"{proc}: {e}")
                    time.sleep(0.2)  # a failed claim loop gives its steps back; a new claimer takes over
                finally:
                    if steps is not None:
                        steps.close()
        finally:
            self._thread_live(name, False)

    def _destination(self, epoch: int) -> Any:
        """The claim destination: mode "w" (claimers share it), or after a restart of the
        cluster "a" (its steps on the drain's disk are this run's), "w" if it has none yet."""
        import cairn

        if epoch:
            try:
                return cairn.open(self.out, "a", **self.opts)
            except NotFoundError:
                pass
        dst = cairn.open(self.out, "w", **self.opts)
        dst.define("m", "f8", (self.n,))
        return dst

    def drainer(self) -> None:
        """Waits now and then for the newest committed step to be on disk."""
        import cairn

        self._thread_live("drainer", True)
        try:
            r, epoch = cairn.open(self.dataset, "r", **self.opts), self.epoch
            while not self.done.wait(1.0):
                self._park("drainer")
                if self.epoch != epoch:
                    r, epoch = cairn.open(self.dataset, "r", **self.opts), self.epoch
                with self.lock:
                    newest = max(self.committed[self.dataset], default=None)
                if newest is None:
                    continue
                with contextlib.suppress(CairnError):
                    with self.op("drainer", "wait_drained", dataset=self.dataset, step=newest) as got:
                        got["value"] = r.wait_drained(step=newest, timeout=min(10.0, self.timeout))
                    if got["value"]:
                        with self.lock:
                            if newest in self.committed[self.dataset]:  # not discarded meanwhile
                                self.drained.add(newest)
        finally:
            self._thread_live("drainer", False)

    def reader(self, k: int = 0) -> None:
        """Lists the dataset and reads its newest steps, again and again; with a history it now
        and then releases the newest step (``release``) and reads it again: from its drained
        copy, or "not found"."""
        import cairn

        proc = f"reader-{k}"
        self._thread_live(proc, True)
        rng, epoch = random.Random(self.seed * 1000 + 500 + k), self.epoch
        try:
            r = cairn.open(self.dataset, "r", **self.opts)
            while not self.done.is_set():
                self._park(proc)
                if self.epoch != epoch:
                    epoch, r = self.epoch, cairn.open(self.dataset, "r", **self.opts)
                try:
                    with self.op(proc, "read", dataset=self.dataset) as got:
                        steps = got["value"] = r.steps()
                except CairnError:
                    self._count("read_errors")
                    time.sleep(0.1)
                    continue
                for s in steps[-3:]:
                    t = time.perf_counter()
                    try:
                        if any(b.state == "degraded" for b in r.blocks("u", s)):
                            self._count("degraded_reads")
                        if self.rec is None:
                            got_all = r.get("u", s)
                        else:
                            got_all = np.concatenate([self._read_box(r, proc, s, box) for box in self.boxes()])
                        self._time("read", time.perf_counter() - t, f"step {s}")
                        if not np.array_equal(got_all, self.expected(s)):
                            self._count("wrong_reads")
                    except DataLossError:
                        self._count("lost_reads")
                    except CairnError:
                        self._count("read_errors")
                if self.rec is not None and steps and rng.random() < 0.1:
                    self._release(r, proc, steps[-1])  # the newest: the stream readers may not have passed it yet
                time.sleep(0.05)
            r.close()
        finally:
            self._thread_live(proc, False)

    def _release(self, r: Any, proc: str, step: int) -> None:
        """Releases ``step`` (the servers wait until the drain has it, where they drain) and
        reads it again: recorded, the read's level saying whether a drained copy served it."""
        with contextlib.suppress(CairnError):
            with self.op(proc, "release", dataset=self.dataset, step=step):
                r.release(step)
        with contextlib.suppress(CairnError):
            self._read_box(r, proc, step, self.boxes()[0])

    def _read_box(self, r: Any, proc: str, step: int, box: list[list[int]]) -> np.ndarray:
        with self.op(proc, "read", dataset=self.dataset, step=step, var="u", box=box) as got:
            a, got["level"] = read_box(r, "u", step, box)
            got["crc"] = crc32c(a)
        return a

    def expected(self, step: int) -> np.ndarray:
        salt = self.salts.get(step, self.salt)
        return np.concatenate([_field(k, self.writers, step, self.n, salt) for k in range(self.writers)])

    def run(self) -> list[threading.Thread]:
        """Starts the writers (the first ``writers`` threads returned), the readers and, with a
        history, the producer, claimers and drainer."""
        def thread(target: Callable[..., None], name: str, *args: Any) -> threading.Thread:
            return threading.Thread(target=target, args=args, name=name, daemon=True)

        threads = [thread(self.writer, f"writer-{k}", k) for k in range(self.writers)]
        threads += [thread(self.reader, f"reader-{k}", k) for k in range(self.readers)]
        if self.rec:
            threads.append(thread(self.producer, "producer"))
            threads += [thread(self.claimer, f"claimer-{k}", k) for k in range(self.claimers)]
            if self.drain:
                threads.append(thread(self.drainer, "drainer"))
        for t in threads:
            t.start()
        return threads


#: A stream reader process: ``stream_reader`` with its settings (JSON) as the argument.
_STREAM_READER = "import sys; from cairn.chaos import stream_reader; stream_reader(sys.argv[1])"


def stream_reader(settings: str) -> None:
    """A reader process looping over ``stream(release=True)``, recording each step it is given
    and each box it reads; with churn it leaves after 1 to 6 steps and registers again. Runs
    until killed (the chaos run ends it with SIGTERM)."""
    import warnings

    import cairn

    cfg = json.loads(settings)
    warnings.simplefilter("ignore")  # StepsMissedWarning: expected with several releasing readers
    rec, rng, proc, ds, lease = Recorder(cfg["history"]), random.Random(cfg["seed"]), cfg["process"], cfg["dataset"], cfg["opts"]["timeout"]
    r = cairn.open(ds, "r", **cfg["opts"])
    while True:
        left, steps = rng.randint(1, 6) if cfg["churn"] else -1, None
        try:
            steps = r.stream(timeout=5.0, release=True)
            while left:
                with rec.op(proc, "read", dataset=ds, stream=True, lease=lease) as got:
                    s = got["step"] = next(steps, None)
                if s is None:
                    break
                for box in cfg["boxes"]:
                    with contextlib.suppress(CairnError), rec.op(proc, "read", dataset=ds, step=s, var="u", box=box, lease=lease) as got:
                        a, got["level"] = read_box(r, "u", s, box)
                        got["crc"] = crc32c(a)
                left -= 1
        except CairnError:
            pass
        finally:
            if steps is not None:
                steps.close()  # leave: the registration ends
        time.sleep(rng.uniform(0.05, 0.5))


class StreamReaders:
    """``n`` stream reader processes (:func:`stream_reader`), each started again when it dies;
    :meth:`strike` is the reader-churn nemesis: SIGKILL or SIGSTOP (SIGCONT later) of one."""

    def __init__(self, wl: Workload, n: int, path: str, rng: random.Random, rec: Recorder) -> None:
        self.wl, self.path, self.rng, self.rec = wl, path, rng, rec
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * n
        self.gen = [0] * n
        self.stopped: set[int] = set()

    paused = False

    def pause(self) -> None:
        """Ends every reader and starts none again until :meth:`resume` (a restart of the cluster)."""
        self.paused = True
        self.stop()

    def resume(self) -> None:
        self.paused = False

    def keep(self) -> None:
        """Starts the readers that are not running (at first, and after a SIGKILL)."""
        if self.paused:
            return
        for i, p in enumerate(self.procs):
            if p is None or p.poll() is not None:
                self.gen[i] += 1
                cfg = {"history": self.path, "process": f"stream-{i}.{self.gen[i]}", "dataset": self.wl.dataset,
                       "seed": self.rng.randrange(1 << 30), "churn": self.wl.churn, "opts": self.wl.opts, "boxes": self.wl.boxes()}
                self.procs[i] = subprocess.Popen([sys.executable, "-c", _STREAM_READER, json.dumps(cfg)], stdin=subprocess.DEVNULL,
                                                 stdout=subprocess.DEVNULL, start_new_session=True,
                                                 stderr=None if os.environ.get("CAIRN_CHAOS_DEBUG") else subprocess.DEVNULL)

    def strike(self) -> None:
        live = [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None and i not in self.stopped]
        if not live:
            return
        i = self.rng.choice(live)
        p = self.procs[i]
        assert p is not None
        if self.rng.random() < 0.5:
            p.kill()
            self.rec.event("reader-kill", value={"reader": f"stream-{i}.{self.gen[i]}"})
            return
        pause = self.rng.uniform(0.5, 2 * self.wl.timeout)
        p.send_signal(signal.SIGSTOP)
        self.stopped.add(i)
        self.rec.event("reader-stop", value={"reader": f"stream-{i}.{self.gen[i]}", "for_s": round(pause, 2)})

        def cont() -> None:
            self.stopped.discard(i)
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                self.rec.event("reader-cont", value={"reader": f"stream-{i}.{self.gen[i]}"})

        threading.Timer(pause, cont).start()

    def stop(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.procs:
            if p is not None:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def _lost_objects(file: Path, timeout: float) -> tuple[int, int]:
    """(blocks checked, blocks lost) over every committed step of every dataset."""
    import cairn

    checked = lost = 0
    for name in cluster.request(file, _leader(file), "datasets")["names"]:
        r = cairn.open(name, "r", engine="staging", cluster=file, timeout=timeout)
        for s in r.steps():
            for var, info in r.variables().items():
                for b in r.blocks(var, s):
                    checked += 1
                    try:
                        if info.local:
                            r.get_local(var, s, b.writer)
                        else:
                            r.get(var, s, offset=b.offset, count=b.count)
                    except DataLossError:
                        lost += 1
        r.close()
    return checked, lost


def _nothing_pending(rows: list[dict[str, Any]]) -> bool:
    """Whether the control plane's leader answered and has no recovery queued."""
    leaders = [r for r in rows if r.get("meta") == "leader" and r.get("state") == "up"]
    return bool(leaders) and all((r.get("recovery_pending") or 0) == 0 for r in rows) and \
        all(r.get("recovery_pending") is not None for r in leaders)


def _voters(rows: list[dict[str, Any]]) -> list[int]:
    """The control plane's voters (servers) as its leader's replica has them, else as any
    answering voter's has them, else the servers answering with a voter's role."""
    up = [r for r in rows if r.get("state") == "up"]
    for r in sorted(up, key=lambda r: r.get("meta") != "leader"):
        if r.get("voters") and r.get("meta") in ("leader", "follower", "candidate"):
            return sorted(r["voters"])
    return [r["id"] for r in up if r.get("meta") in ("leader", "follower", "candidate")]


def _leader(file: Path) -> int:
    rows = cluster.status(file, timeout=1.0)
    return next((r["leader"] for r in rows if r.get("leader") is not None), rows[0]["id"])


class Chaos:
    """The killer: picks victims, defers faults beyond the level, restarts the dead as spares.
    Besides SIGKILL (``strike(how="kill")``) it SIGSTOPs a server for a while (``"stop"``) and
    cuts one off the network (``"cut"``, with ``hosts``); one the control plane declared down
    meanwhile rejoins by itself, else it is killed and started again as well."""

    def __init__(self, file: Path, kill: str, beyond_level: bool, rng: random.Random, restart: bool = True,
                 rec: Recorder | None = None, hosts: Any = None):
        self.file, self.kill, self.beyond_level, self.rng, self.restart = file, kill, beyond_level, rng, restart
        self.rec, self.hosts = rec, hosts
        # With a history, a server fault waits for a live spare to take the slot (a slot declared
        # down with none left stays down, and would hold every later fault back) and for the
        # control plane to be whole again: a leader and all its voters following, not only a
        # majority (a replaced voter still joining counted as one, and the next kill took the
        # majority for good).
        self.careful = rec is not None
        self.spare_first = self.careful and bool((cluster.view(file, timeout=1.0) or {}).get("spares"))
        self.voters = sum(1 for r in cluster.status(file, timeout=1.0) if r.get("meta") in ("leader", "follower", "candidate"))
        self.level = cluster.document(file).get("redundancy", {}).get("redundancy", 0)
        self.log: list[dict[str, Any]] = []
        self.leader: int | None = None  # the control plane's leader, as last seen
        self.skipped = 0  # kills never made: the level was reached until the end
        self.over = threading.Event()  # the run ended: stop waiting for recoveries that cannot come
        self.calm = threading.Event()  # the faults are over: stops and cuts end now
        self.restarts: list[threading.Thread] = []
        self.children: list[subprocess.Popen[bytes]] = []
        #: Servers this killer took down (killed, stopped, cut) and has not yet seen back.
        self.taken: set[int] = set()
        self.fresh: dict[int, int] = {}  # server -> pid of the process it was started again as
        #: Servers killed for good (``narrow``): their slots stay down, what they held re-encoded.
        self.lost: set[int] = set()
        #: Set while the whole cluster is being restarted: servers going down are not "died".
        self.suspended = threading.Event()
        self.cmdlines: dict[int, list[str]] = {}
        self.rebind()
        #: The servers' failure timeout, as their command lines give it (else their default).
        flags = next(iter(self.cmdlines.values()), [])
        self.failure_timeout = seconds(flags[flags.index("--failure-timeout") + 1]) if "--failure-timeout" in flags[:-1] else 3.0

    def rebind(self) -> None:
        """Reads each server's command line, once while they all run: a killed one is started
        again with it (same id, flags and cluster file), on its host when there are hosts. After
        a restart of the whole cluster, also forgets the old one's servers."""
        self.cmdlines.clear()
        for s in cluster.servers_of(self.file):
            raw = Path(f"/proc/{_entry(self.file, s['id'])['pid']}/cmdline").read_bytes()
            cmd = [c.decode() for c in raw.split(b"\0") if c]
            self.cmdlines[s["id"]] = (self.hosts.wrap(s["id"]) if self.hosts else []) + cmd
        self.leader = None
        self.taken.clear()
        self.fresh.clear()
        self.lost.clear()
        for child in self.children:
            child.poll()
        self.children = [c for c in self.children if c.returncode is None]

    def settled(self, deadline: float) -> bool:
        """Waits until no fault of this killer is under way (every server it took down is back
        or replaced, and every recovery it waits for is done), or until ``deadline``."""
        while time.monotonic() < deadline:
            if not (self.taken - self.lost) and not any(t.is_alive() for t in self.restarts):
                return True
            time.sleep(0.2)
        return False

    def _event(self, f: str, **value: Any) -> None:
        if self.rec:
            self.rec.event(f, value=value)

    def _thread(self, target: Callable[..., None], *args: Any) -> None:
        """Runs ``target`` on a thread of its own; an error it dies of is recorded and shown."""
        def guarded() -> None:
            try:
                target(*args)
            except Exception as e:  # a fault left unhealed must not pass unseen
                self._event("nemesis-error", error=history.error_text(e))
                print(f"cairn chaos: {target.__name__} failed: {history.error_text(e)}", file=sys.stderr, flush=True)

        t = threading.Thread(target=guarded, daemon=True)
        t.start()
        self.restarts.append(t)

    def _everyone(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The newest view any server holds and every server's status row."""
        return cluster.view(self.file, timeout=1.0) or {}, cluster.status(self.file, timeout=1.0)

    def _state(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The current view and status rows: the control plane leader's alone (its view is the
        newest, and it keeps the recovery queue), or every server's when the leader moved or did
        not answer. Polled every 0.2 s per recovery awaited, asking every server took ~85
        authenticated connections a second from the workload's cores."""
        if self.leader is not None:
            try:
                st = cluster.request(self.file, self.leader, "status", timeout=1.0)["status"]
                if st.get("meta") == "leader":
                    view = cluster.request(self.file, self.leader, "view", timeout=1.0)["view"]
                    return view, [{**st, "id": self.leader, "state": "up"}]
            except CairnError:
                pass
        view, rows = self._everyone()
        self.leader = next((r["id"] for r in rows if r.get("meta") == "leader" and r.get("state") == "up"), None)
        return view, rows

    def outstanding(self) -> int:
        """Servers killed and not yet recovered (or down in a slot no spare took), plus one while
        the control plane reports recovery pending."""
        view, rows = self._state()
        down_in_slot = sum(1 for s in view.get("slots", []) if s in view.get("down", []) and s not in self.lost)
        pending = sum(r.get("recovery_pending") or 0 for r in rows)
        unrecovered = sum(len(e["servers"]) for e in self.log if "recovered_s" not in e and not e.get("gave_up"))
        return max(down_in_slot + (1 if pending else 0), unrecovered)

    def _live_spare(self) -> bool:
        view, _ = self._state()
        return bool(set(view.get("spares", [])) - set(view.get("down", [])))

    def _whole(self) -> bool:
        """Whether the control plane has one leader and every voter of its membership following it
        (a voter being replaced sits beside its replacement for a moment: 4 voters, 3 needed)."""
        rows = [r for r in cluster.status(self.file, timeout=1.0) if r.get("state") == "up"]
        roles = {r["id"]: r.get("meta") for r in rows}
        voters = _voters(rows)
        whole = list(roles.values()).count("leader") == 1 and len(voters) >= self.voters and \
            all(roles.get(v) in ("leader", "follower") for v in voters)
        if not whole:
            _debug(f"not whole: voters {voters}, roles {roles}")
        return whole

    def victims(self, prefer_leader: bool = False, only: list[int] | None = None) -> list[int]:
        view, rows = self._everyone()
        live = [s for s in view.get("slots", []) if s not in view.get("down", []) and s not in self.taken]
        # The membership as the leader knows it: a voter that died (or is being replaced) counts
        # in the majority until it is removed, although it answers no status.
        meta = _voters(rows)
        voters_alive = len([m for m in meta if m in live])
        if only is not None:
            live = [s for s in live if s in only]
        entries = {s["id"]: s for s in cluster.servers_of(self.file)}
        if self.kill == "node":
            nodes = sorted({entries[s].get("node", "") for s in live})
            choices = [[s for s in live if entries[s].get("node", "") == n] for n in nodes]
        else:
            choices = [[s] for s in live]
        # Never leave the control plane without a majority of its voters.
        choices = [c for c in choices if voters_alive - len([s for s in c if s in meta]) > len(meta) // 2]
        if prefer_leader:
            # The control plane's leader, which also runs the drain.
            lead = next((r["id"] for r in rows if r.get("meta") == "leader" and r.get("state") == "up"), None)
            choices = [c for c in choices if lead in c] or choices
        return self.rng.choice(choices) if choices else []

    def strike(self, t0: float, end: float, going: Callable[[], bool] = lambda: True, how: str = "kill",
               prefer_leader: bool = False, pause: float = 0.0, only: list[int] | None = None,
               lose: bool = False) -> dict[str, Any] | None:
        """Kills (stops, cuts) the next victims, first waiting (until ``end`` at most, while
        ``going()``) while that would go beyond the level; ``None`` when it is not made: the wait
        ran out, the workload ended, or no recovery can come (no restart and no spare left).
        A stop or a cut lasts ``pause`` seconds. ``only``: the victims are among these servers;
        ``lose``: a killed server is not started again (its slot stays down)."""
        deferred = 0.0
        if not self.beyond_level:
            start = time.monotonic()
            while self.outstanding() + 1 > self.level or (self.spare_first and not self._live_spare()) or \
                    (self.careful and not self._whole()):
                hopeless = not self.restart and not (cluster.view(self.file, timeout=1.0) or {}).get("spares")
                if time.monotonic() >= end or not going() or hopeless:
                    self.skipped += 1
                    return None
                time.sleep(0.2)
            deferred = time.monotonic() - start
        victims = self.victims(prefer_leader, only)
        if not victims:
            self.skipped += 1
            return None
        event: dict[str, Any] = {"t_s": round(time.monotonic() - t0, 2), "servers": victims, "deferred_s": round(deferred, 2)}
        if how != "kill":
            event.update(how=how, pause_s=round(pause, 2))
        for sid in victims:
            self.taken.add(sid)
            target: Callable[..., None] = self._recover_and_restart
            args: tuple[Any, ...] = (sid, self.cmdlines[sid], event)
            if how == "kill":
                os.kill(_entry(self.file, sid)["pid"], signal.SIGKILL)
                if lose:
                    self.lost.add(sid)
                    target, args = self._lose, (sid, event)
            elif how == "stop":
                os.kill(_entry(self.file, sid)["pid"], signal.SIGSTOP)
                target, args = self._resume, (sid, event, pause, lambda: os.kill(_entry(self.file, sid)["pid"], signal.SIGCONT))
            else:
                self.hosts.cut(sid)
                target, args = self._resume, (sid, event, pause, lambda: self.hosts.cut(sid, False))
            self._event(how, server=sid, leader=self.leader == sid, **({"for_s": round(pause, 2)} if how != "kill" else {}),
                        **({"lost": True} if lose else {}))
            self._thread(target, *args)
        self.log.append(event)
        return event

    def _resume(self, sid: int, event: dict[str, Any], pause: float, undo: Callable[[], None]) -> None:
        """Ends a stop or a cut after ``pause`` (or at the run's end). A server declared down
        meanwhile rejoins by itself, empty, as a spare; one that has not within 10 s is killed
        and started again. It is recovered once it is not down and the control plane has
        nothing pending."""
        self.calm.wait(pause)
        undo()
        self._event("cont" if event.get("how") == "stop" else "heal", server=sid)
        start = time.monotonic()
        while time.monotonic() - start < 60:
            view, rows = self._state()
            if sid in view.get("down", []):
                event.setdefault("declared_s", round(pause, 2))
                if time.monotonic() - start > 10:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(_entry(self.file, sid)["pid"], signal.SIGKILL)
                    self._event("kill", server=sid, why="declared down while stopped or cut off, and not back in 10 s")
                    self._recover_and_restart(sid, self.cmdlines[sid], event)
                    return
            elif time.monotonic() - start > 1.0 and _nothing_pending(rows):
                done = event.setdefault("recovered_each", {})
                done[str(sid)] = round(time.monotonic() - start + pause, 2)
                if len(done) == len(event["servers"]):
                    event["recovered_s"] = max(done.values())
                self.taken.discard(sid)
                return
            time.sleep(0.2)
        self.taken.discard(sid)
        event["gave_up"] = True

    def _lose(self, sid: int, event: dict[str, Any]) -> None:
        """Waits for the control plane to declare ``sid`` down and for the recovery of what it
        held (with no spare, onto the survivors: stripes encoded again narrower) to be done."""
        start = declared_at = time.monotonic()
        declared = False
        while time.monotonic() - start < 60 and not self.over.is_set():
            view, rows = self._state()
            if not declared and sid in view.get("down", []):
                declared, declared_at = True, time.monotonic()
                event.setdefault("declared_s", round(time.monotonic() - start, 2))
            # The recovery is queued once the leader declared it down: give it a moment.
            if declared and time.monotonic() - declared_at > 1.0 and _nothing_pending(rows):
                done = event.setdefault("recovered_each", {})
                done[str(sid)] = round(time.monotonic() - start, 2)
                if len(done) == len(event["servers"]):
                    event["recovered_s"] = max(done.values())
                return
            time.sleep(0.2)
        event["gave_up"] = True

    def _recover_and_restart(self, sid: int, cmd: list[str], event: dict[str, Any]) -> None:
        """Waits for the control plane to declare ``sid`` down, records when the recovery of what
        it held was done, and starts it again (it rejoins empty, as the next spare): at once when
        no spare is left to take its slot, else once the recovery is done, so that starting a
        server (~0.3 s of CPU) does not compete with the rebuild and the workload."""
        start = time.monotonic()
        declared = restarted = False
        declared_at = 0.0

        def restart() -> None:
            nonlocal restarted
            if self.restart and not restarted:
                restarted = True
                # Started without fail points: armed servers dying whenever they come to lead could
                # take the control plane's majority with another fault.
                env = {k: v for k, v in os.environ.items() if k != "CAIRN_FAILPOINTS"}
                with open(cluster.entries_dir(self.file) / f"server-{sid}.log", "ab") as log:
                    child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
                self.children.append(child)
                self.fresh[sid] = child.pid
                self._event("restart", server=sid)
                self.taken.discard(sid)

        while time.monotonic() - start < 60 and not self.over.is_set():
            view, rows = self._state()
            late = cluster.recovery_overdue(rows)
            if late > event.get("overdue_s", 0.0):
                event["overdue_s"] = round(late, 2)
            if not declared and sid in view.get("down", []):
                declared, declared_at = True, time.monotonic()
                event.setdefault("declared_s", round(time.monotonic() - start, 2))
            if declared and not set(view.get("spares", [])) - set(view.get("down", [])):
                restart()
            elif declared and not restarted and sid in view.get("slots", []) and time.monotonic() - declared_at > 10:
                event["slot_kept_s"] = 10  # no spare took its slot in 10 s: started again all the same
                restart()
            # Recovered: its slot went to a live server (or it holds it again) and the leader, which
            # keeps the recovery queue, answered that nothing is pending (a leader that did not
            # answer in time, or none elected yet, proves nothing).
            slot_live = sid not in view.get("slots", []) or sid not in view.get("down", [])
            if declared and slot_live and _nothing_pending(rows):
                done = event.setdefault("recovered_each", {})
                done[str(sid)] = round(time.monotonic() - start, 2)
                if len(done) == len(event["servers"]):
                    event["recovered_s"] = max(done.values())
                restart()
                return
            time.sleep(0.2)
        if declared and not self.over.is_set():
            restart()
        event["gave_up"] = True  # never seen recovered: no longer holds faults back (the view still does)

    def pids(self) -> list[int]:
        """Every server process of the cluster this machine runs, as their entries say."""
        out = []
        for s in cluster.servers_of(self.file):
            with contextlib.suppress(OSError, ValueError, KeyError):
                out.append(int(_entry(self.file, s["id"])["pid"]))
        return out + [c.pid for c in self.children if c.poll() is None]

    def watch(self) -> None:
        """Notices servers that died by themselves (at a fail point, or a crash): recorded with the
        fail points reached so far, and started again like a killed one."""
        if self.suspended.is_set():
            return
        for entry in cluster.servers_of(self.file):
            sid = entry["id"]
            with contextlib.suppress(OSError, ValueError, KeyError):
                pid = int(_entry(self.file, sid)["pid"])
                if sid in self.taken or self.fresh.get(sid, pid) != pid or _running(pid):
                    continue  # taken down by this killer, started again (its entry not yet rewritten), or running
                self.taken.add(sid)
                reached = sorted(p.name.removeprefix("failpoint-") for p in cluster.entries_dir(self.file).glob("failpoint-*"))
                event = {"t_s": None, "servers": [sid], "deferred_s": 0.0, "how": "died", "failpoints_reached": reached}
                self._event("died", server=sid, failpoints_reached=reached)
                self.log.append(event)
                self._thread(self._recover_and_restart, sid, self.cmdlines[sid], event)


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _ms(xs: list[float]) -> float | None:
    return round(1000 * float(np.mean(xs)), 2) if xs else None


def _tail(xs: list[float]) -> dict[str, float | None]:
    """Median, 99th percentile and worst of response times, in ms (a mean hides whether a few
    stalls or a slower common case cost the time)."""
    if not xs:
        return {"p50": None, "p99": None, "max": None}
    p50, p99, top = np.percentile(xs, [50, 99, 100])
    return {"p50": round(1000 * float(p50), 2), "p99": round(1000 * float(p99), 2), "max": round(1000 * float(top), 2)}


#: Every nemesis (``--nemesis``); those of :data:`OWN` run on a cluster chaos starts itself.
NEMESES = ("kill", "stop", "partition", "disk-full", "reader-churn", "failpoint", "replace-all", "narrow", "rival",
           "cluster-restart", "discard")
OWN = ("partition", "disk-full", "failpoint", "replace-all", "narrow", "rival", "cluster-restart")
#: Nemeses that cannot share a run: the first of a pair present is kept, the other skipped
#: (``narrow`` runs with no spare, which ``replace-all`` needs; a restart of the whole cluster
#: cannot yet start one in network namespaces).
CONFLICTS = {("narrow", "replace-all"): "narrow runs on a cluster with no spare, and replace-all needs one",
             ("partition", "cluster-restart"): "chaos cannot restart a cluster of servers in network namespaces"}
#: The most nemeses a mix of ``--seeds`` draws.
MIX_MOST = 3
#: The drain's fail points (issue 51, item 2), compiled into the server only with the cargo
#: feature ``failpoints``; a server started with ``CAIRN_FAILPOINTS=name[,name]`` dies at them.
FAILPOINTS = ("drain.before_data", "drain.part_written", "drain.before_commit", "drain.after_index_tmp", "drain.after_link",
              "drain.before_record")
#: chaos's own cluster: 4 servers and a spare at level 1, the control plane on 3 of them.
OWN_SERVERS, OWN_SPARES, OWN_META = 4, 1, 3


def failpoint_binary() -> Path:
    """The server built with fail points: ``$CAIRN_SERVER_FAILPOINTS``, else
    ``target/release/cairn-server-failpoints`` of this source tree."""
    given = os.environ.get("CAIRN_SERVER_FAILPOINTS")
    return Path(given) if given else Path(__file__).resolve().parents[2] / "target" / "release" / "cairn-server-failpoints"


def unavailable(nemesis: str, history: bool) -> str | None:
    """Why ``nemesis`` cannot run here, or None."""
    import inspect

    from . import _netns

    if nemesis == "partition":
        return _netns.unavailable()
    if nemesis == "disk-full" and (os.geteuid() != 0 or not shutil.which("mount")):
        return "a full drain disk is a small tmpfs chaos mounts: that needs root"
    if nemesis == "failpoint":
        if not failpoint_binary().exists():
            return f"no server built with fail points at {failpoint_binary()} (build it with the cargo feature `failpoints`)"
        if "command" not in inspect.signature(cluster.start).parameters:
            return "cairn.cluster.start takes no command= in this build"
    if nemesis == "reader-churn" and not history:
        return "the stream readers it churns run only with --history"
    if nemesis in ("discard", "cluster-restart", "rival") and not history:
        return "the workload it acts on (writers sent back, handles reopened, drained steps) runs only with --history"
    return None


def conflicting(nemeses: list[str]) -> dict[str, str]:
    """Those of ``nemeses`` that cannot run beside an earlier one (:data:`CONFLICTS`), and why."""
    out: dict[str, str] = {}
    for (a, b), why in CONFLICTS.items():
        if a in nemeses and b in nemeses:
            later = max(a, b, key=nemeses.index)
            out.setdefault(later, why)
    return out


class OwnCluster:
    """The cluster chaos starts for the nemeses of :data:`OWN`: servers on hosts of their own
    (``partition``: network namespaces, clients over TCP), a drain on a tmpfs that can be made
    full (``disk-full``), the server built with fail points, all started with one seeded
    ``CAIRN_FAILPOINTS`` (``failpoint``). It always drains, so the run ends by reading drained
    steps back from disk. :meth:`close` removes it all."""

    def __init__(self, nemeses: set[str], rng: random.Random, timeout: float) -> None:
        from . import _netns

        self.kw: dict[str, Any] = {}  # how it was started (cluster.start's arguments), for a restart
        self.dir = Path(tempfile.mkdtemp(prefix="cairn-chaos-"))
        self.file = self.dir / "cluster.json"
        self.hosts: Any = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.local: cluster.LocalCluster | None = None
        self.disk: Path | None = None
        self.size = ""
        self.failpoint: str | None = None
        try:
            if "disk-full" in nemeses:
                self.disk = self.dir / "disk"
                self.disk.mkdir()
                self.size = "1g"  # filled by shrinking it to what it holds, so this much is never allocated
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.disk)], check=True,
                               capture_output=True)
            self.drain = (self.disk or self.dir) / "drain"
            self.drain.mkdir()
            command = None
            if "failpoint" in nemeses:
                # Every server armed with one point: the first leader to reach it dies (at the
                # first drain, before any other fault), the next passes it. One only: two would
                # kill two leaders in a row, the control plane's majority with them.
                self.failpoint = rng.choice(FAILPOINTS)
                command = ["env", f"CAIRN_FAILPOINTS={self.failpoint}", str(failpoint_binary())]
            if "partition" in nemeses:
                self.hosts = _netns.Hosts(OWN_SERVERS + OWN_SPARES)
                flags = ["--servers", str(OWN_SERVERS), "--spares", str(OWN_SPARES), "--memory", "128MiB", "--meta", str(OWN_META),
                         "--redundancy", "1", "--failure-timeout", "1s", "--recovery-deadline", "3s", "--drain", str(self.drain),
                         "--timeout", str(timeout)]
                self.procs = _netns.start_servers(self.hosts, self.file, flags, command=command)
                cluster._await_control_plane(self.file, OWN_META, 30.0)  # as cluster.start does
            else:
                # narrow: no spare, erasure-coded at put, so a lost server's stripes are encoded again narrower.
                narrow = "narrow" in nemeses
                self.kw = dict(servers=OWN_SERVERS, spares=0 if narrow else OWN_SPARES, memory="128MiB", meta=OWN_META,
                               redundancy=1, failure_timeout="1s", recovery_deadline="3s", drain=self.drain,
                               **({"scheme": "erasure"} if narrow else {}))
                self.local = cluster.start(self.file, **self.kw, **({"command": command} if command else {}))
        except BaseException:
            self.close()
            raise

    @property
    def transport(self) -> str | None:
        return "tcp" if self.hosts else None

    def restart(self) -> float:
        """A planned restart of the whole cluster: stopped (after the drain caught up), then a
        new one started on the same file and drain folder (without fail points). Seconds the
        stop took."""
        assert self.local is not None, "a restart of servers in network namespaces is not supported"
        from .exceptions import CapacityError

        t = time.monotonic()
        try:
            for attempt in range(5):  # a full drain disk gets room again within seconds
                try:
                    cluster.drain(self.file, timeout=30.0)
                    break
                except CapacityError:
                    if attempt == 4:
                        raise
                    time.sleep(2.0)
            cluster.stop(self.file, procs=self.local.procs, timeout=30.0, drain_first=False)
        finally:
            for p in self.local.procs:  # any that lingers
                p.kill()
        took = time.monotonic() - t
        self.local = cluster.start(self.file, **self.kw)
        return took

    def rival(self, name: str, timeout: float) -> dict[str, Any]:
        """A second cluster on the same drain folder opens dataset ``name`` in mode "w": what
        came of it (``opened``, else the ``error`` and its ``code``). The rival is stopped."""
        import cairn

        self.rivals = getattr(self, "rivals", 0) + 1
        file = self.dir / f"rival-{self.rivals}.json"
        rival = cluster.start(file, servers=1, memory="64MiB", drain=self.drain)
        out: dict[str, Any] = {"dataset": name, "drain": str(self.drain), "cluster": str(file)}
        try:
            w = cairn.open(name, "w", cluster=str(file), timeout=timeout)
            out["opened"] = True
            with contextlib.suppress(CairnError):
                w.close()
        except CairnError as e:
            out.update(opened=False, error=history.error_text(e), code=e.code)
        finally:
            for p in rival.procs:
                p.kill()
            for p in rival.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(10)
        return out

    def fill(self, seconds: float, rec: Recorder | None, calm: threading.Event) -> None:
        """Makes the drain's disk full for ``seconds``: the tmpfs shrunk to what it holds."""
        assert self.disk is not None
        # The drain writes on while this measures: a tmpfs refuses a size under what it holds, so
        # a write between the measure and the remount fails it; measure again and retry.
        for attempt in range(50):
            st = os.statvfs(self.disk)
            used = (st.f_blocks - st.f_bfree) * st.f_frsize
            shrink = subprocess.run(["mount", "-o", f"remount,size={used + 4096}", str(self.disk)], capture_output=True)
            if shrink.returncode == 0:
                break
            if attempt == 49:
                raise RuntimeError(f"cannot shrink {self.disk} to what it holds: {shrink.stderr.decode().strip()}")
        if rec:
            rec.event("disk-full", value={"for_s": round(seconds, 2), "used_bytes": used})

        def room() -> None:
            calm.wait(seconds)
            subprocess.run(["mount", "-o", f"remount,size={self.size}", str(self.disk)], capture_output=True)
            if rec:
                rec.event("disk-room")

        threading.Thread(target=room, daemon=True).start()

    def close(self, keep_logs: bool = False) -> None:
        """Stops it all and removes it; with ``keep_logs`` its folder (the servers' logs) stays."""
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        if self.local:
            for s in self.local.procs:
                s.kill()
            for s in self.local.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    s.wait(10)
        with contextlib.suppress(CairnError):
            for pid in _server_pids(self.file):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.hosts:
            self.hosts.clear()
        if self.disk:
            subprocess.run(["umount", "-l", str(self.disk)], capture_output=True)
        if keep_logs:
            print(f"cairn chaos: the logs of chaos's own cluster are kept in {self.dir}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def _server_pids(file: Path) -> list[int]:
    out = []
    for s in cluster.servers_of(file):
        with contextlib.suppress(OSError, ValueError, KeyError):
            out.append(int(_entry(file, s["id"])["pid"]))
    return out


def _crash(file: Path, pids: list[int]) -> None:
    """Every server SIGKILLed, then the cluster file marked stopped, as an operator does after
    a crash of the whole cluster: only then do its readers read the drain alone."""
    _kill_all(pids)
    with contextlib.suppress(CairnError):
        cluster.stop(file, timeout=5.0)


def _kill_all(pids: list[int]) -> None:
    """SIGKILLs ``pids`` and waits until none runs."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _settled(wl: Workload, deadline: float) -> None:
    """Waits until the dataset's listing reaches the newest step the writers saw committed
    (older ones may be released) and the claim destination's listing stops growing (followers
    caught up), or until ``deadline``."""
    import cairn

    def steps(ds: str) -> list[int]:
        try:
            return cairn.open(ds, "r", **wl.opts).steps()
        except CairnError:
            return []

    newest = max(wl.committed[wl.dataset], default=-1)
    last: list[int] | None = None
    while time.monotonic() < deadline:
        have, out = steps(wl.dataset), steps(wl.out)
        if max(have, default=-1) >= newest and out == last:
            return
        last = out
        time.sleep(0.5)


def verify(wl: Workload, rec: Recorder, kill: Callable[[], None] | None) -> tuple[int, int]:
    """The verifier's reads, recorded: every committed step of the workload's dataset, the claim
    source's steps still in memory, every result in the claim destination; then, with ``kill``
    (the cluster drains), every server is SIGKILLed and each step ``wait_drained`` said was on
    disk is read back from it. Returns (reads, reads that found a loss)."""
    import cairn

    reads = lost = 0

    def read(r: Any, ds: str, s: int, var: str, box: list[list[int]], who: str = "verifier") -> None:
        nonlocal reads, lost
        reads += 1
        try:
            with rec.op(who, "read", dataset=ds, step=s, var=var, box=box) as got:
                a, got["level"] = read_box(r, var, s, box)
                got["crc"] = crc32c(a)
        except DataLossError:
            lost += 1
        except CairnError:
            pass

    def in_memory(r: Any, var: str, s: int) -> bool:
        try:
            return all(b.level == "memory" for b in r.blocks(var, s))
        except NotFoundError:
            return False

    def listing(ds: str, memory: str | None = None) -> tuple[Any, list[int]]:
        try:
            r = cairn.open(ds, "r", **wl.opts)
            with rec.op("verifier", "read", dataset=ds, **({"level": "memory"} if memory else {})) as got:
                steps = r.steps()
                if memory:  # what is still to claim: steps held in memory (consumed ones left it)
                    steps = [s for s in steps if in_memory(r, memory, s)]
                got["value"] = steps
            return r, steps
        except CairnError:
            return None, []

    # Without a leader readers fall back to the drain: what memory holds could not be told.
    deadline = time.monotonic() + 20
    while not _has_leader(wl.file) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not _has_leader(wl.file):
        rec.event("no-leader", process="verifier")
    else:
        # Once settled: readers may list from a follower, whose list may end a step or two early
        # right after a fault (docs/protocol.md); wait until a listing holds every step whose end
        # was acknowledged, up to 20 s (the checker then judges what the last one shows).
        _settled(wl, deadline=time.monotonic() + 20)
        r, _ = listing(wl.dataset)
        for s in sorted(wl.committed[wl.dataset]):
            for box in wl.boxes():
                if r is not None:
                    read(r, wl.dataset, s, "u", box)
        listing(wl.work, memory="w")
        out, results = listing(wl.out)
        for s in results:
            read(out, wl.out, s, "m", [[0], [wl.n]])
    if kill is not None:
        wl.quiet = True
        rec.event("kill-all")
        kill()
        try:
            r = cairn.open(wl.dataset, "r", **{**wl.opts, "timeout": 2.0})
        except CairnError as e:
            r = _Unopened(e)  # each drained step's reads fail with why
        for s in sorted(wl.drained):
            for box in wl.boxes():
                read(r, wl.dataset, s, "u", box)
    return reads, lost


def _has_leader(file: Path) -> bool:
    try:
        return any(r.get("meta") == "leader" for r in cluster.status(file, timeout=1.0))
    except CairnError:
        return False


class _Unopened:
    """A reader that could not be opened: its reads raise why."""

    def __init__(self, e: CairnError) -> None:
        self.e = e

    def get(self, *_: Any, **__: Any) -> np.ndarray:
        raise self.e


def _nemeses(text: str) -> list[str]:
    """``--nemesis`` words: a comma-separated list of :data:`NEMESES`."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in NEMESES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown nemesis {', '.join(bad) or repr(text)}: give a comma-separated list of "
                                         f"{', '.join(NEMESES)}")
    return list(dict.fromkeys(names))


def run(args: argparse.Namespace) -> dict[str, Any]:
    rec: Recorder | None = None
    wanted = getattr(args, "nemesis", None) or ["kill"]
    if not set(wanted) & set(OWN) and not getattr(args, "own", False):
        cluster.document(Path(args.cluster).absolute())  # a missing or foreign cluster file stops the run before it starts
    _check.output_folder(args.json, "--json")
    if getattr(args, "history", None):
        _check.output_folder(args.history, "--history")
        if Path(args.history).exists() and Path(args.history).stat().st_size:
            raise InvalidArgumentError(f"--history {args.history} exists: a history is one run's; give a new file")
        args.workload = True
    if args.workload and args.n < args.writers:
        raise InvalidArgumentError(f"--n {args.n} is less than --writers {args.writers}: each writer writes n / writers "
                                   "rows of the n×n field; give --n of at least --writers")
    rng = random.Random(args.seed)
    skipped = {n: why for n in wanted if (why := unavailable(n, bool(getattr(args, "history", None))))}
    skipped.update(conflicting([n for n in wanted if n not in skipped]))
    for n, why in skipped.items():
        print(f"cairn chaos: nemesis {n} skipped: {why}", file=sys.stderr, flush=True)
    active = [n for n in wanted if n not in skipped]
    mine = bool(set(active) & set(OWN)) or bool(getattr(args, "own", False))
    own = OwnCluster(set(active) & set(OWN), rng, args.timeout) if mine else None
    if own:
        print(f"cairn chaos: {', '.join(active)} run on a cluster of chaos's own ({own.file}), "
              "not --cluster", file=sys.stderr, flush=True)
    report: dict[str, Any] = {}
    try:
        if getattr(args, "history", None):
            rec = Recorder(args.history)
            args.history = str(Path(args.history).absolute())  # the stream reader processes append to it too
        report = _run(args, own.file if own else Path(args.cluster).absolute(), rng, active, skipped, own, rec)
        return report
    finally:
        if rec:
            rec.close()
        if own:
            clean = report and report.get("history", {}).get("valid", True) and not report.get("workload", {}).get("errors")
            own.close(keep_logs=not clean)


def _run(args: argparse.Namespace, file: Path, rng: random.Random, active: list[str], skipped: dict[str, str],
         own: OwnCluster | None, rec: Recorder | None) -> dict[str, Any]:
    cluster.document(file)
    chaos = Chaos(file, args.kill, args.beyond_level, rng, restart=not args.no_restart, rec=rec, hosts=own.hosts if own else None)
    drains = bool(cluster.document(file).get("drain"))
    if rec:
        rec.event("start", process="chaos", value={"seed": args.seed, "nemesis": active, "skipped": skipped, "level": chaos.level,
                                                   "beyond_level": args.beyond_level, "drain": drains, "timeout": args.timeout,
                                                   "failure_timeout_s": chaos.failure_timeout,
                                                   "failpoint": own.failpoint if own else None})
    wl = None
    if args.workload:
        wl = Workload(file, args.dataset, args.writers, args.readers, args.steps, args.n, args.timeout, seconds(args.interval),
                      rec=rec, queue=(args.queue_limit, args.queue_policy) if rec and args.queue_limit else None,
                      claimers=args.claimers, drain=drains, churn="reader-churn" in active, seed=args.seed,
                      transport=own.transport if own else None)
    threads = wl.run() if wl else []
    # The stream readers draw from a generator of their own: the keeper starts them when it gets
    # to it, and the faults' draws stay those of the seed whatever the threads' timing.
    readers = StreamReaders(wl, args.stream_readers, args.history, random.Random(args.seed + 2), rec) \
        if wl and rec and args.stream_readers else None
    keeper = _Keeper(chaos if rec else None, readers)
    seams = _Seams(args, rng, chaos, wl, rec, own, readers)
    try:
        return {**_faults(args, file, rng, active, own, rec, chaos, wl, threads, readers, keeper, seams), "nemesis": active,
                "nemesis_skipped": skipped}
    finally:
        chaos.calm.set()  # stops and cuts under way end, a full disk gets room (also on an error)
        keeper.stop()
        if readers:
            readers.stop()


class _Seams:
    """The nemeses at the seams where two mechanisms meet: ``replace-all`` (every member of the
    cluster SIGKILLed in turn, each slot taken by a spare), ``narrow`` (a server lost for good
    with no spare: its stripes encoded again narrower while reads go on), ``rival`` (a second
    cluster opens the dataset in mode "w" on the same drain folder: it must be refused),
    ``cluster-restart`` (a planned stop of the whole cluster, a new one on the same drain
    folder, the workload's handles opened again, "a" for writers, and every committed step read)
    and ``discard`` (the writer ranks go back to an older step, ``from_step``, while readers
    read). Each records its events; what it does to the workload is recorded as operations."""

    KINDS = ("replace-all", "narrow", "rival", "cluster-restart", "discard")
    #: The most servers ``narrow`` loses in a run (4 servers, no spare: two keep the control
    #: plane's majority and, at level 1, every step).
    NARROW_MOST = 2

    def __init__(self, args: argparse.Namespace, rng: random.Random, chaos: Chaos, wl: Workload | None,
                 rec: Recorder | None, own: OwnCluster | None, readers: StreamReaders | None) -> None:
        self.args, self.rng, self.chaos, self.wl, self.rec, self.own, self.readers = args, rng, chaos, wl, rec, own, readers
        self.narrowed = 0

    def _event(self, f: str, **value: Any) -> None:
        if self.rec:
            self.rec.event(f, value=value)

    def _say(self, t0: float, what: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f} s] {what}", flush=True)
        _debug(what)

    def strike(self, kind: str, t0: float, end: float, going: Callable[[], bool]) -> dict[str, Any] | None:
        return getattr(self, kind.replace("-", "_"))(t0, end, going)

    def replace_all(self, t0: float, end: float, going: Callable[[], bool]) -> dict[str, Any] | None:
        """Every member (a server holding a slot) SIGKILLed in turn, the next once a spare took
        the slot of the one before, its recovery was done and the killed one is a spare again."""
        view = cluster.view(self.chaos.file, timeout=1.0) or {}
        members = [sid for sid in view.get("slots", []) if sid not in view.get("down", [])]
        self._event("replace-all", servers=members)
        replaced = []
        for sid in members:
            ev = self.chaos.strike(t0, time.monotonic() + 60, going, only=[sid])
            if ev is None:
                break
            replaced.append(sid)
            self._say(t0, f"replace-all: killed {sid} ({len(replaced)} of {len(members)}, deferred {ev['deferred_s']} s)")
        self.chaos.settled(time.monotonic() + 60)
        slots = (cluster.view(self.chaos.file, timeout=1.0) or {}).get("slots", [])
        self._event("replaced-all", servers=replaced, complete=replaced == members, slots=slots)
        return None

    def narrow(self, t0: float, end: float, going: Callable[[], bool]) -> dict[str, Any] | None:
        """A server SIGKILLed and never started again: with no spare, recovery encodes its
        stripes again narrower on the servers left."""
        if self.narrowed >= self.NARROW_MOST:
            return None
        view = cluster.view(self.chaos.file, timeout=1.0) or {}
        spares = [sid for sid in view.get("spares", []) if sid not in view.get("down", [])]
        ev = self.chaos.strike(t0, end, going, prefer_leader=self.rng.random() < 0.5, lose=True)
        if ev is not None:
            self.narrowed += 1
            self._event("narrow", servers=ev["servers"], spares=spares)
            ev["how"] = "lost for good"
        return ev

    def rival(self, t0: float, end: float, going: Callable[[], bool]) -> dict[str, Any] | None:
        """A second cluster on the same drain folder opens the workload's dataset in mode "w"
        once a step of it is drained (recorded: ``rival-open``, refused or ``opened``)."""
        wl = self.wl
        if self.own is None or wl is None:
            return None
        deadline = time.monotonic() + 15
        while not wl.drained and time.monotonic() < deadline and going():
            time.sleep(0.2)
        if not wl.drained:
            self._event("rival-skipped", why="no step of the dataset was drained yet")
            return None
        out = self.own.rival(wl.dataset, self.args.timeout)
        self._event("rival-open", **out)
        self._say(t0, f"rival: a second cluster's \"w\" open of {wl.dataset} on the same drain folder: "
                      + ("OPENED" if out["opened"] else f"refused ({out.get('code')})"))
        return None

    def cluster_restart(self, t0: float, end: float, going: Callable[[], bool]) -> dict[str, Any] | None:
        """A planned stop of the whole cluster (the drain catches up first) and a new cluster on
        the same file and drain folder: the workload is held at a step boundary, its handles are
        opened again (writers with "a"), and every committed step is read back."""
        wl, own = self.wl, self.own
        if wl is None or own is None or own.local is None:
            return None
        self.chaos.settled(time.monotonic() + 60)  # no fault of the killer under way
        h = wl.hold({"writer", "producer"})
        try:
            timeout = self.args.timeout
            if not wl.wait_held(h, {"writer", "producer"}, time.monotonic() + 2 * timeout + 10):
                self._event("cluster-restart-skipped", why="the writers did not reach a step boundary in time")
                return None
            # Then the claimers (once nothing is left to claim), the readers and the drainer. A reader
            # stuck in a call is not waited for long: it reopens its handle at its next turn anyway.
            h.roles |= {"claimer", "reader", "drainer"}
            wl.wait_held(h, {"claimer"}, time.monotonic() + timeout + wl.claim_lease + 10)
            wl.wait_held(h, {"reader", "drainer"}, time.monotonic() + 2.0)
            if self.readers:
                self.readers.pause()
            self.chaos.suspended.set()
            self._event("cluster-stop", after=h.after)
            start = time.monotonic()
            try:
                took = own.restart()
                self.chaos.rebind()
            finally:
                self.chaos.suspended.clear()
            wl.epoch += 1
            self._event("cluster-start", stop_s=round(took, 2), restart_s=round(time.monotonic() - start, 2))
            self._say(t0, f"cluster-restart: stopped after step {h.after} and started again in "
                          f"{time.monotonic() - start:.1f} s")
        finally:
            wl.resume(h)
            if self.readers:
                self.readers.resume()
        self._read_every_step()
        return None

    def _read_every_step(self) -> None:
        """Lists the dataset and reads every box of every committed step (``restart-reader``)."""
        import cairn

        wl = self.wl
        assert wl is not None
        op = self.rec.op if self.rec else _unrecorded
        try:
            r = cairn.open(wl.dataset, "r", **wl.opts)
            with op("restart-reader", "read", dataset=wl.dataset) as got:
                got["value"] = r.steps()
        except CairnError as e:
            _debug(f"restart-reader: {e}")
            return
        with wl.lock:
            steps = sorted(wl.committed[wl.dataset])
        for s in steps:
            for box in wl.boxes():
                with contextlib.suppress(CairnError), op("restart-reader", "read", dataset=wl.dataset, step=s, var="u",
                                                         box=box) as got:
                    a, got["level"] = read_box(r, "u", s, box)
                    got["crc"] = crc32c(a)
        r.close()

    def discard(self, t0: float, end: float, going: Callable[[], bool]) -> dict[str, Any] | None:
        """The writer ranks, held between steps, go back to one of the newest three committed
        steps (``from_step``: rank 0 discards it and those after on every level, recorded as an
        ``rm`` with that step) and write on from it with a new salt, while readers read."""
        wl = self.wl
        if wl is None or self.rec is None:
            return None
        h = wl.hold({"writer"})
        try:
            if not wl.wait_held(h, {"writer"}, time.monotonic() + 2 * self.args.timeout + 10):
                self._event("discard-skipped", why="the writer ranks did not reach a step boundary in time")
                return None
            with wl.lock:
                newest = max(wl.committed[wl.dataset], default=None)
                if newest is None:
                    return None
                back = self.rng.randint(max(0, newest - 2), newest)
                wl.committed[wl.dataset] = {s for s in wl.committed[wl.dataset] if s < back}
                wl.drained = {s for s in wl.drained if s < back}
                wl.back_to, wl.discards = back, wl.discards + 1
            self._event("discard", from_step=back, newest=newest)
            self._say(t0, f"discard: the writers go back to step {back} (newest {newest})")
        finally:
            wl.resume(h)
        return None


class _Keeper(threading.Thread):
    """Every half second, also while a fault waits for the level: notices servers that died by
    themselves (``chaos.watch``) and starts stream readers again."""

    def __init__(self, chaos: Chaos | None, readers: StreamReaders | None) -> None:
        super().__init__(name="chaos-keeper", daemon=True)
        self.chaos, self.readers, self.over = chaos, readers, threading.Event()
        if chaos or readers:
            self.start()

    def run(self) -> None:
        while True:
            try:
                if self.chaos:
                    self.chaos.watch()
                if self.over.is_set():
                    return
                if self.readers:
                    self.readers.keep()
            except Exception as e:  # noqa: BLE001 - keep watching; say what failed
                _debug(f"keeper: {history.error_text(e)}")
            self.over.wait(0.5)

    def stop(self) -> None:
        self.over.set()
        if self.is_alive():
            self.join()


def _faults(args: argparse.Namespace, file: Path, rng: random.Random, active: list[str], own: OwnCluster | None,
            rec: Recorder | None, chaos: Chaos, wl: Workload | None, threads: list[threading.Thread],
            readers: StreamReaders | None, keeper: _Keeper, seams: _Seams) -> dict[str, Any]:
    """The run proper: faults while the workload runs, its end, the checks; the report. The
    nemeses take turns in rounds (each once a round, in an order the seed draws); with a history
    the run goes on past its duration until each has had its first turn (at once, then)."""
    mtbf, duration = seconds(args.mtbf), seconds(args.duration)
    writing = lambda: not wl or any(t.is_alive() for t in threads[: wl.writers])  # noqa: E731
    t0 = time.monotonic()
    if wl:
        # The fault-free baseline: the workload's first steps before any kill.
        while len(wl.times["baseline"]["write"]) < max(2, args.writers * 3) and writing():
            time.sleep(0.05)
        wl.phase = "chaos"
    end = time.monotonic() + duration
    next_fault = time.monotonic() + rng.expovariate(1 / mtbf)
    # Reader churn runs on a clock of its own; the other nemeses take turns.
    churn = random.Random(args.seed + 1) if readers and "reader-churn" in active else None
    next_churn = time.monotonic() + (churn.expovariate(1 / mtbf) if churn else duration)
    turns = [n for n in active if n != "reader-churn"]
    order: list[str] = []
    untried = set(turns) if rec else set()
    while (time.monotonic() < end or untried) and writing():
        if churn and readers and time.monotonic() >= next_churn:
            readers.strike()
            next_churn = time.monotonic() + churn.expovariate(1 / mtbf)
        if time.monotonic() >= end and untried:
            next_fault = time.monotonic()  # the duration is up: those yet to strike do at once
        if time.monotonic() >= next_fault and turns:
            if not order:
                order = rng.sample(turns, len(turns))
            kind = order.pop(0)
            untried.discard(kind)
            # With a history, a fault that must wait gives up after about one mtbf: the others go on.
            until = (min(end, time.monotonic() + mtbf) if time.monotonic() < end else time.monotonic() + mtbf) if rec else end
            ev = _strike(kind, chaos, t0, until, writing, rng, own, rec, seams)
            if ev:
                print(f"[{ev['t_s']:7.1f} s] {ev.get('how', 'killed')} {ev['servers']} (deferred {ev['deferred_s']} s)", flush=True)
                _debug(f"{ev.get('how', 'killed')} {ev['servers']}")
            next_fault = time.monotonic() + rng.expovariate(1 / mtbf)
        time.sleep(0.05)
    chaos.calm.set()  # stops and cuts under way end, a full disk gets room
    if wl:
        # The duration is up: every writer ends the step the furthest one is at, then stops.
        wl.stop_after = max(wl.at)
        for t in threads[: args.writers]:
            t.join(timeout=args.timeout + 60)
        run_s = max(wl.ended, default=time.monotonic()) - t0
        keeper.stop()
        if readers:
            readers.stop()
        # Claimers end by themselves once the producer closed and nothing is left to claim.
        deadline = time.monotonic() + args.timeout + 30
        for t in threads:
            if t.name == "producer" or t.name.startswith("claimer"):
                t.join(timeout=max(0.0, deadline - time.monotonic()))
        wl.done.set()
        # Readers end at their next turn; one stuck in a call far beyond its deadline is left
        # behind (a daemon thread), and named in the history.
        deadline = time.monotonic() + args.timeout + 5
        for t in threads[args.writers:]:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck and rec:
            rec.event("still-running", process="chaos", value={"threads": stuck})
    # Recoveries still under way finish, unless none can come (no restart, no spare left).
    waits = chaos.restart or bool((cluster.view(file, timeout=1.0) or {}).get("spares"))
    for t in chaos.restarts:
        t.join(timeout=60 if waits else 0)
    chaos.over.set()
    for child in chaos.children:
        child.poll()  # reap the ones killed again
    if wl and rec:
        # With a drain every server is SIGKILLed, then what was drained is read from disk.
        kill = (lambda: _crash(file, chaos.pids() + [p.pid for p in (own.procs if own else [])])) if wl.drain else None
        checked, lost = verify(wl, rec, kill)
    else:
        checked, lost = _lost_objects(file, args.timeout)
    report: dict[str, Any] = {
        "mtbf_s": mtbf, "duration_s": duration, "kill": args.kill, "seed": args.seed, "level": chaos.level,
        "kills": sum(len(e["servers"]) for e in chaos.log), "deferred": sum(1 for e in chaos.log if e["deferred_s"] > 0.5),
        "skipped": chaos.skipped,
        "events": chaos.log, "blocks_checked": checked, "lost_objects": lost,
        "recovery_s": [e.get("recovered_s") for e in chaos.log],
        # The most any recovery ran past its deadline (the machine could not keep it).
        "overdue_s": max([e.get("overdue_s", 0.0) for e in chaos.log], default=0.0),
    }
    if wl:
        b, c = wl.times["baseline"], wl.times["chaos"]
        both = {k: b[k] + c[k] for k in ("write", "read")}
        over = lambda k: round(float(100 * (np.mean(c[k]) / np.mean(b[k]) - 1)), 1) if b[k] and c[k] else None  # noqa: E731
        report["workload"] = {
            "writers": args.writers, "readers": args.readers, "steps": args.steps, "steps_written": wl.written // max(1, args.writers),
            "run_s": round(run_s, 2), **wl.counts,
            "errors": wl.errors,
            "write_ms": {"baseline": _ms(b["write"]), "chaos": _ms(c["write"]), "all": _ms(both["write"]),
                         "overhead_%": over("write"), **_tail(both["write"])},
            "read_ms": {"baseline": _ms(b["read"]), "chaos": _ms(c["read"]), "all": _ms(both["read"]),
                        "overhead_%": over("read"), **_tail(both["read"])},
        }
    if rec:
        report["history"] = history.check(history.load(args.history))
    return report


def _strike(kind: str, chaos: Chaos, t0: float, end: float, going: Callable[[], bool], rng: random.Random,
            own: OwnCluster | None, rec: Recorder | None, seams: _Seams | None = None) -> dict[str, Any] | None:
    """One fault of nemesis ``kind``: the event of a server fault, else None."""
    if seams is not None and kind in _Seams.KINDS:
        return seams.strike(kind, t0, end, going)
    prefer = rec is not None and rng.random() < 0.5  # half of them at the leader (which also drains)
    if kind == "kill":
        return chaos.strike(t0, end, going, prefer_leader=prefer)
    if kind == "stop":
        return chaos.strike(t0, end, going, how="stop", prefer_leader=prefer, pause=rng.uniform(0.5, 3.0))
    if kind == "partition":
        return chaos.strike(t0, end, going, how="cut", prefer_leader=prefer, pause=rng.uniform(1.0, 4.0))
    if kind == "disk-full" and own:
        own.fill(rng.uniform(2.0, 6.0), rec, chaos.calm)
    elif kind == "failpoint":
        # The armed fail point fired at the first drain; from then on, kills of the drain's leader.
        return chaos.strike(t0, end, going, prefer_leader=True)
    return None


def add(sub: Any) -> None:
    p = sub.add_parser("chaos", help="SIGKILL staging servers at random while a workload runs; report losses and costs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", default="cluster.json", help="cluster file (default cluster.json)")
    p.add_argument("--mtbf", default="18s", help="mean time between kills (default 18s)")
    p.add_argument("--duration", default="150s", help="how long to run (default 150s)")
    p.add_argument("--kill", choices=["server", "node"], default="server", help="kill one server, or every server of a node (default server)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill times and victims; the same seed repeats a run (default 0)")
    p.add_argument("--json", help="write the JSON report to this file (default: print only)")
    p.add_argument("--workload", action="store_true", help="run the built-in writer/reader workload")
    p.add_argument("--dataset", default="chaos-workload", help="the workload's dataset (default chaos-workload; must be new)")
    p.add_argument("--writers", type=int_arg(1), default=2, help="workload writer ranks (default 2)")
    p.add_argument("--readers", type=int_arg(0), default=1, help="workload readers (default 1)")
    p.add_argument("--steps", type=int_arg(1), default=100, help="workload steps (default 100)")
    p.add_argument("--interval", default="0.2s", help="workload compute time between steps (default 0.2s)")
    p.add_argument("--n", type=int_arg(1), default=256, help="workload field edge: n×n doubles (default 256)")
    p.add_argument("--timeout", type=seconds_arg(0.001), default=30.0,
                   help="the workload's call deadline in seconds (default 30)")
    p.add_argument("--beyond-level", action="store_true", help="kill even when more servers than the level are down or recovering")
    p.add_argument("--no-restart", action="store_true",
                   help="leave killed servers dead (degraded service only, unless spares take their slots)")
    p.add_argument("--nemesis", type=_nemeses, default=None, metavar="LIST",
                   help=f"faults to combine, comma-separated: {', '.join(NEMESES)} (default kill; with --seeds, the ones a "
                        f"mix draws from, default all that can run here); {', '.join(OWN)} run on a cluster chaos starts "
                        "itself (partition, disk-full and failpoint need root, and are skipped with a message otherwise)")
    p.add_argument("--seeds", type=int_arg(1), default=None, metavar="N",
                   help="run N mixes, of seeds S to S+N-1 (S: --seed), each with nemeses the seed draws, on a cluster chaos "
                        "starts itself, and check each history; every violation is printed with its seed and nemeses, and "
                        "--seed S --seeds 1 replays that mix (implies --history: FILE.seedS, else a folder it names)")
    runs = p.add_mutually_exclusive_group()
    runs.add_argument("--history", metavar="FILE",
                      help="record every operation of the workload (JSON Lines; implies --workload) and check the rules at the end")
    runs.add_argument("--check", metavar="FILE", help="check a saved history: exit 0 clean, 1 on a violation (JSON report on stdout)")
    p.add_argument("--stream-readers", type=int_arg(0), default=2, help="with --history: stream(release=True) reader processes (default 2)")
    p.add_argument("--claimers", type=int_arg(0), default=2, help="with --history: claimers consuming <dataset>-work (default 2)")
    p.add_argument("--queue-limit", type=int_arg(0), default=3,
                   help="with --history: the workload dataset's queue limit, 0 for none (default 3)")
    p.add_argument("--queue-policy", choices=["block", "discard_oldest"], default="block", help="with --history: its policy (default block)")
    p.set_defaults(func=main)


def options(argv: list[str]) -> argparse.Namespace:
    """``cairn chaos`` options from its command-line words (for callers in Python)."""
    ap = argparse.ArgumentParser(prog="cairn")
    add(ap.add_subparsers())
    return ap.parse_args(["chaos", *argv])


def check_main(path: str) -> None:
    """``cairn chaos --check FILE``: the report on stdout; exit 1 on a violation, 2 when FILE is
    not a history."""
    try:
        records = history.load(path)
    except (OSError, ValueError) as e:
        print(f"cairn chaos: error: --check {path}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    report = history.check(records)
    print(json.dumps(report, indent=1))
    if not report["valid"]:
        raise SystemExit(1)


def mix_of(seed: int, pool: list[str] | tuple[str, ...]) -> list[str]:
    """The nemeses of the mix of ``seed`` (``--seeds``): 1 to :data:`MIX_MOST` of ``pool``, in
    an order drawn from the seed alone (the same on every run and machine for the same pool),
    never two that conflict (:data:`CONFLICTS`)."""
    rng = random.Random(f"cairn chaos mix {seed}")  # a str seed hashes the same in every process
    want = rng.randint(1, max(1, min(MIX_MOST, len(pool))))
    chosen: list[str] = []
    for n in rng.sample(list(pool), len(pool)):
        if len(chosen) < want and not conflicting([*chosen, n]):
            chosen.append(n)
    return chosen


def _seed_history(args: argparse.Namespace, seed: int, folder: list[Path]) -> Path:
    """Where the history of mix ``seed`` goes: ``FILE.seedS`` beside --history's FILE, else in
    a folder made once (and named)."""
    if args.history:
        h = Path(args.history)
        return h.with_name(f"{h.stem}.seed{seed}{h.suffix}")
    if not folder:
        folder.append(Path(tempfile.mkdtemp(prefix="cairn-chaos-seeds-")))
        print(f"cairn chaos: the mixes' histories are in {folder[0]}", flush=True)
    return folder[0] / f"seed-{seed}.jsonl"


def seeds_main(args: argparse.Namespace) -> None:
    """``cairn chaos --seeds N``: the mixes of seeds S .. S+N-1, each on a cluster of chaos's
    own, with nemeses the seed draws (:func:`mix_of`) from --nemesis (else from every nemesis
    that can run here); a line per violation naming its seed and nemeses; exit 1 if any mix
    found one (or failed)."""
    import copy

    pool = args.nemesis or [n for n in NEMESES if unavailable(n, True) is None]
    folder: list[Path] = []
    bad: list[tuple[int, list[str]]] = []
    for seed in range(args.seed, args.seed + args.seeds):
        mix = mix_of(seed, pool)
        one = copy.copy(args)
        one.seed, one.nemesis, one.seeds, one.own, one.json = seed, mix, None, True, None
        one.history, one.dataset = str(_seed_history(args, seed, folder)), f"{args.dataset}-{seed}"
        tag = f"seed {seed} [{','.join(mix)}]"
        print(f"cairn chaos: {tag}: history {one.history}", flush=True)
        try:
            report = run(one)
        except (CairnError, OSError) as e:
            print(f"{tag}: the run failed: {history.error_text(e)}", flush=True)
            bad.append((seed, mix))
            continue
        checked = report.get("history") or {}
        for v in checked.get("violations", []):
            print(f"{tag}: {v['rule']}: {v['message']}", flush=True)
        left = sum(checked.get("violations_by_rule", {}).values()) - len(checked.get("violations", []))
        if left > 0:
            print(f"{tag}: and {left} more ({checked['violations_by_rule']}); see {one.history}", flush=True)
        errors = (report.get("workload") or {}).get("errors")
        if errors:
            print(f"{tag}: the workload could not write: {'; '.join(errors)}", flush=True)
        if not checked.get("valid", False) or errors:
            bad.append((seed, mix))
        else:
            print(f"{tag}: no violation ({checked.get('operations', 0)} operations)", flush=True)
    if bad:
        print(f"cairn chaos: {len(bad)} of {args.seeds} mixes found something; replay one with --seed S --seeds 1: "
              + ", ".join(f"{s} [{','.join(m)}]" for s, m in bad), flush=True)
        raise SystemExit(1)


def main(args: argparse.Namespace) -> None:
    from .exceptions import UnavailableError

    if args.check:
        if args.seeds:
            raise InvalidArgumentError("--seeds runs mixes and checks their histories: give it without --check")
        return check_main(args.check)
    if args.seeds:
        return seeds_main(args)
    report = run(args)
    wl = report.get("workload")
    print(f"kills {report['kills']} (deferred {report['deferred']}, not made {report['skipped']}), blocks checked {report['blocks_checked']}, "
          f"lost objects {report['lost_objects']}, recovery s {report['recovery_s']}"
          + (f", overdue by up to {report['overdue_s']} s" if report["overdue_s"] else ""))
    if wl:
        print(f"workload: write ms {wl['write_ms']}, read ms {wl['read_ms']}, degraded reads {wl['degraded_reads']}, "
              f"lost reads {wl['lost_reads']}, wrong reads {wl['wrong_reads']}, write retries {wl['write_retries']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    checked = report.get("history")
    if checked:
        print(f"history: {checked['operations']} operations, " + ("no violation" if checked["valid"] else
              f"violations {checked['violations_by_rule']}; the first:\n" + json.dumps(checked["violations"][:3], indent=1)))
        if not checked["valid"]:
            raise SystemExit(1)
    if wl and (wl["errors"] or not wl["steps_written"]):
        why = "; ".join(wl["errors"]) or "no step was written"
        raise UnavailableError(f"the workload could not write: {why}")
