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
partitions, a full drain disk, reader churn, drain fail points); at the end a verifier reads
everything back (and, with a drain, again from disk after every server is SIGKILLed) and the
history is checked (:mod:`cairn.history`). ``--check FILE`` checks a saved history again.
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
        self.op = rec.op if rec else _unrecorded
        self.salt = random.SystemRandom().randrange(1, 1 << 12) / (1 << 12) if rec else 0.0
        self.work, self.out = f"{dataset}-work", f"{dataset}-out"
        #: Steps whose end committed (by dataset), and steps wait_drained said are on disk.
        self.committed: dict[str, set[int]] = {dataset: set(), self.work: set()}
        self.drained: set[int] = set()
        self.claims_over = threading.Event()  # every claimer's loop ended (nothing left to claim)
        self.claim_lease = max(1.0, min(timeout, 3.0))

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
               box: list[list[int]]) -> None:
        """Writes steps of ``ds`` until ``steps`` or ``stop_after``, retrying a failed step."""
        for s in range(self.steps):
            # Writer ranks stop together after one step; the producer at once.
            if self.stop_after is not None and (s > self.stop_after or rank < 0):
                break
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
                        return
                    time.sleep(0.2)

    def writer(self, rank: int) -> None:
        import cairn

        try:
            w = cairn.open(self.dataset, "w", rank=rank, nranks=self.writers, session=self.session, **self.opts)
            w.define("u", "f8", (self.n, self.n))
            if self.queue:
                w.define_queue(*self.queue)
            make = lambda s: _field(rank, self.writers, s, self.n, self.salt)  # noqa: E731
            self._steps(w, f"writer-{rank}", self.dataset, "u", rank, make, self.boxes()[rank])
            w.close()
        except CairnError as e:
            self.errors.append(f"writer {rank}: {e}")
        finally:
            with self.lock:
                self.ended.append(time.monotonic())

    def producer(self) -> None:
        """Writes ``<dataset>-work`` (a 4×n field a step) for the claimers, as one rank."""
        import cairn

        try:
            w = cairn.open(self.work, "w", **self.opts)
            w.define("w", "f8", (4, self.n))
            make = lambda s: np.arange(4 * self.n, dtype="f8").reshape(4, self.n) + 1e3 * s + self.salt  # noqa: E731
            self._steps(w, "producer", self.work, "w", -1, make, [[0, 0], [4, self.n]])
            w.close()
        except CairnError as e:
            self.errors.append(f"producer: {e}")

    def claimer(self, k: int) -> None:
        """Claims steps of the work dataset and consumes each into ``<dataset>-out`` (its column
        means, committed with the release of the step it came from); with churn it leaves after
        a few steps and comes back as a new claimer. Ends once nothing is left to claim."""
        import cairn

        rng, gen = random.Random(self.seed * 1000 + k), 0
        src = cairn.open(self.work, "r", **self.opts)
        dst = steps = None
        while not self.done.is_set():
            gen += 1
            proc = f"claimer-{k}.{gen}"
            try:
                if dst is None:
                    dst = cairn.open(self.out, "w", **self.opts)
                    dst.define("m", "f8", (self.n,))
                steps = src.claims(lease=self.claim_lease)
                while True:
                    with self.op(proc, "claim", dataset=self.work, lease=self.claim_lease) as got:
                        s = got["step"] = next(steps, None)
                    if s is None:
                        dst.close()
                        return
                    with self.op(proc, "read", dataset=self.work, step=s, var="w", box=[[0, 0], [4, self.n]]) as got:
                        a = src.get("w", s)
                        got["crc"] = crc32c(a)
                    m = a.mean(axis=0)
                    with self.op(proc, "consume", dataset=self.work, step=s, dst=self.out, var="m", box=[[0], [self.n]],
                                 crc=crc32c(m)):
                        with dst.step(s, consume=src):
                            dst.put("m", m)
                    if self.churn and rng.random() < 0.25:
                        break  # leave: steps claimed and not consumed go back
            except CairnError as e:
                _debug(f"{proc}: {e}")
                time.sleep(0.2)  # a failed claim loop gives its steps back; a new claimer takes over
            finally:
                if steps is not None:
                    steps.close()

    def drainer(self) -> None:
        """Waits now and then for the newest committed step to be on disk."""
        import cairn

        r = cairn.open(self.dataset, "r", **self.opts)
        while not self.done.wait(1.0):
            with self.lock:
                newest = max(self.committed[self.dataset], default=None)
            if newest is None:
                continue
            with contextlib.suppress(CairnError):
                with self.op("drainer", "wait_drained", dataset=self.dataset, step=newest) as got:
                    got["value"] = r.wait_drained(step=newest, timeout=min(10.0, self.timeout))
                if got["value"]:
                    self.drained.add(newest)

    def reader(self, k: int = 0) -> None:
        import cairn

        proc = f"reader-{k}"
        r = cairn.open(self.dataset, "r", **self.opts)
        while not self.done.is_set():
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
            time.sleep(0.05)
        r.close()

    def _read_box(self, r: Any, proc: str, step: int, box: list[list[int]]) -> np.ndarray:
        with self.op(proc, "read", dataset=self.dataset, step=step, var="u", box=box) as got:
            a = r.get("u", step, offset=box[0], count=box[1])
            got["crc"] = crc32c(a)
        return a

    def expected(self, step: int) -> np.ndarray:
        return np.concatenate([_field(k, self.writers, step, self.n, self.salt) for k in range(self.writers)])

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
                        got["crc"] = crc32c(r.get("u", s, offset=box[0], count=box[1]))
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

    def keep(self) -> None:
        """Starts the readers that are not running (at first, and after a SIGKILL)."""
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
        # Each server's command line, read once while they all run: a killed one is started
        # again with it (same id, flags and cluster file), on its host when there are hosts.
        self.cmdlines: dict[int, list[str]] = {}
        for s in cluster.servers_of(file):
            raw = Path(f"/proc/{_entry(file, s['id'])['pid']}/cmdline").read_bytes()
            cmd = [c.decode() for c in raw.split(b"\0") if c]
            self.cmdlines[s["id"]] = (hosts.wrap(s["id"]) if hosts else []) + cmd
        #: The servers' failure timeout, as their command lines give it (else their default).
        flags = next(iter(self.cmdlines.values()), [])
        self.failure_timeout = seconds(flags[flags.index("--failure-timeout") + 1]) if "--failure-timeout" in flags[:-1] else 3.0

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
        down_in_slot = sum(1 for s in view.get("slots", []) if s in view.get("down", []))
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

    def victims(self, prefer_leader: bool = False) -> list[int]:
        view, rows = self._everyone()
        live = [s for s in view.get("slots", []) if s not in view.get("down", []) and s not in self.taken]
        # The membership as the leader knows it: a voter that died (or is being replaced) counts
        # in the majority until it is removed, although it answers no status.
        meta = _voters(rows)
        voters_alive = len([m for m in meta if m in live])
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
               prefer_leader: bool = False, pause: float = 0.0) -> dict[str, Any] | None:
        """Kills (stops, cuts) the next victims, first waiting (until ``end`` at most, while
        ``going()``) while that would go beyond the level; ``None`` when it is not made: the wait
        ran out, the workload ended, or no recovery can come (no restart and no spare left).
        A stop or a cut lasts ``pause`` seconds."""
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
        victims = self.victims(prefer_leader)
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
            elif how == "stop":
                os.kill(_entry(self.file, sid)["pid"], signal.SIGSTOP)
                target, args = self._resume, (sid, event, pause, lambda: os.kill(_entry(self.file, sid)["pid"], signal.SIGCONT))
            else:
                self.hosts.cut(sid)
                target, args = self._resume, (sid, event, pause, lambda: self.hosts.cut(sid, False))
            self._event(how, server=sid, leader=self.leader == sid, **({"for_s": round(pause, 2)} if how != "kill" else {}))
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
NEMESES = ("kill", "stop", "partition", "disk-full", "reader-churn", "failpoint")
OWN = ("partition", "disk-full", "failpoint")
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
    return None


class OwnCluster:
    """The cluster chaos starts for the nemeses of :data:`OWN`: servers on hosts of their own
    (``partition``: network namespaces, clients over TCP), a drain on a tmpfs that can be made
    full (``disk-full``), the server built with fail points, all started with one seeded
    ``CAIRN_FAILPOINTS`` (``failpoint``). It always drains, so the run ends by reading drained
    steps back from disk. :meth:`close` removes it all."""

    def __init__(self, nemeses: set[str], rng: random.Random, timeout: float) -> None:
        from . import _netns

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
                kw: dict[str, Any] = {"command": command} if command else {}
                self.local = cluster.start(self.file, servers=OWN_SERVERS, spares=OWN_SPARES, memory="128MiB", meta=OWN_META,
                                           redundancy=1, failure_timeout="1s", recovery_deadline="3s", drain=self.drain, **kw)
        except BaseException:
            self.close()
            raise

    @property
    def transport(self) -> str | None:
        return "tcp" if self.hosts else None

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

    def read(r: Any, ds: str, s: int, var: str, box: list[list[int]]) -> None:
        nonlocal reads, lost
        reads += 1
        try:
            with rec.op("verifier", "read", dataset=ds, step=s, var=var, box=box) as got:
                got["crc"] = crc32c(r.get(var, s, offset=box[0], count=box[1]))
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
    if not set(wanted) & set(OWN):
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
    for n, why in skipped.items():
        print(f"cairn chaos: nemesis {n} skipped: {why}", file=sys.stderr, flush=True)
    active = [n for n in wanted if n not in skipped]
    own = OwnCluster(set(active) & set(OWN), rng, args.timeout) if set(active) & set(OWN) else None
    if own:
        print(f"cairn chaos: {', '.join(n for n in active if n in OWN)} run on a cluster of chaos's own ({own.file}), "
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
    readers = StreamReaders(wl, args.stream_readers, args.history, rng, rec) if wl and rec and args.stream_readers else None
    keeper = _Keeper(chaos if rec else None, readers)
    try:
        return {**_faults(args, file, rng, active, own, rec, chaos, wl, threads, readers, keeper), "nemesis": active,
                "nemesis_skipped": skipped}
    finally:
        chaos.calm.set()  # stops and cuts under way end, a full disk gets room (also on an error)
        keeper.stop()
        if readers:
            readers.stop()


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
            readers: StreamReaders | None, keeper: _Keeper) -> dict[str, Any]:
    """The run proper: faults while the workload runs, its end, the checks; the report."""
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
    while time.monotonic() < end and writing():
        if churn and readers and time.monotonic() >= next_churn:
            readers.strike()
            next_churn = time.monotonic() + churn.expovariate(1 / mtbf)
        if time.monotonic() >= next_fault and turns:
            kind = rng.choice(turns) if len(turns) > 1 else turns[0]
            # With a history, a fault that must wait gives up after about one mtbf: the others go on.
            until = min(end, time.monotonic() + mtbf) if rec else end
            ev = _strike(kind, chaos, t0, until, writing, rng, own, rec)
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
        for t in threads[args.writers:]:
            t.join(timeout=60)
    # Recoveries still under way finish, unless none can come (no restart, no spare left).
    waits = chaos.restart or bool((cluster.view(file, timeout=1.0) or {}).get("spares"))
    for t in chaos.restarts:
        t.join(timeout=60 if waits else 0)
    chaos.over.set()
    for child in chaos.children:
        child.poll()  # reap the ones killed again
    if wl and rec:
        # With a drain every server is SIGKILLed, then what was drained is read from disk.
        kill = (lambda: _kill_all(chaos.pids() + [p.pid for p in (own.procs if own else [])])) if wl.drain else None
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
            own: OwnCluster | None, rec: Recorder | None) -> dict[str, Any] | None:
    """One fault of nemesis ``kind``: the event of a server fault, else None."""
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
    p.add_argument("--nemesis", type=_nemeses, default=["kill"], metavar="LIST",
                   help=f"faults to combine, comma-separated: {', '.join(NEMESES)} (default kill); partition, disk-full and "
                        "failpoint run on a cluster chaos starts itself (root only; skipped with a message otherwise)")
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


def main(args: argparse.Namespace) -> None:
    from .exceptions import UnavailableError

    if args.check:
        return check_main(args.check)
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
