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
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import _check, _native, cluster
from ._check import int_arg, seconds_arg
from .exceptions import CairnError, DataLossError, InvalidArgumentError


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


def _field(rank: int, nranks: int, step: int, n: int) -> np.ndarray:
    rows = n // nranks
    base = np.arange(rows * n, dtype="f8").reshape(rows, n)
    return base + 1e6 * step + 1e3 * rank


class Workload:
    """``writers`` ranks write an n×n field step after step; ``readers`` read committed steps and
    check every value. Times are kept per phase (``"baseline"`` before the first kill, then
    ``"chaos"``)."""

    def __init__(self, file: Path, dataset: str, writers: int, readers: int, steps: int, n: int, timeout: float, interval: float):
        self.file, self.dataset, self.writers, self.readers, self.steps, self.n = file, dataset, writers, readers, steps, n
        self.interval = interval
        self.opts = dict(engine="staging", cluster=file, object_size=16 << 10, timeout=timeout)
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

    def _count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def _time(self, kind: str, t: float, what: str) -> None:
        with self.lock:
            self.times[self.phase][kind].append(t)
        if t > 0.05:
            _debug(f"slow {kind}: {what} took {t:.3f} s")

    def writer(self, rank: int) -> None:
        import cairn

        rows = self.n // self.writers
        try:
            w = cairn.open(self.dataset, "w", rank=rank, nranks=self.writers, session=self.session, **self.opts)
            w.define("u", "f8", (self.n, self.n))
            for s in range(self.steps):
                if self.stop_after is not None and s > self.stop_after:
                    break
                self.at[rank] = s
                time.sleep(self.interval)  # the simulation computing
                for attempt in range(10):
                    t = time.perf_counter()
                    try:
                        with w.step(s):
                            w.put("u", _field(rank, self.writers, s, self.n), offset=(rank * rows, 0))
                        self._time("write", time.perf_counter() - t, f"rank {rank} step {s}")
                        with self.lock:
                            self.written += 1
                        break
                    except CairnError as e:
                        self._count("write_retries")
                        _debug(f"write retry: rank {rank} step {s} after {time.perf_counter() - t:.3f} s: {e}")
                        if attempt == 9:
                            self.errors.append(f"writer {rank} gave up on step {s}: {e}")
                            return
                        time.sleep(0.2)
            w.close()
        except CairnError as e:
            self.errors.append(f"writer {rank}: {e}")
        finally:
            with self.lock:
                self.ended.append(time.monotonic())

    def reader(self) -> None:
        import cairn

        r = cairn.open(self.dataset, "r", **self.opts)
        while not self.done.is_set():
            try:
                steps = r.steps()
            except CairnError:
                self._count("read_errors")
                time.sleep(0.1)
                continue
            for s in steps[-3:]:
                t = time.perf_counter()
                try:
                    if any(b.state == "degraded" for b in r.blocks("u", s)):
                        self._count("degraded_reads")
                    got = r.get("u", s)
                    self._time("read", time.perf_counter() - t, f"step {s}")
                    if not np.array_equal(got, self.expected(s)):
                        self._count("wrong_reads")
                except DataLossError:
                    self._count("lost_reads")
                except CairnError:
                    self._count("read_errors")
            time.sleep(0.05)
        r.close()

    def expected(self, step: int) -> np.ndarray:
        return np.concatenate([_field(k, self.writers, step, self.n) for k in range(self.writers)])

    def run(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.writer, args=(k,), daemon=True) for k in range(self.writers)]
        threads += [threading.Thread(target=self.reader, daemon=True) for _ in range(self.readers)]
        for t in threads:
            t.start()
        return threads


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


def _leader(file: Path) -> int:
    rows = cluster.status(file, timeout=1.0)
    return next((r["leader"] for r in rows if r.get("leader") is not None), rows[0]["id"])


class Chaos:
    """The killer: picks victims, defers kills beyond the level, restarts the dead as spares."""

    def __init__(self, file: Path, kill: str, beyond_level: bool, rng: random.Random, restart: bool = True):
        self.file, self.kill, self.beyond_level, self.rng, self.restart = file, kill, beyond_level, rng, restart
        self.level = cluster.document(file).get("redundancy", {}).get("redundancy", 0)
        self.log: list[dict[str, Any]] = []
        self.leader: int | None = None  # the control plane's leader, as last seen
        self.skipped = 0  # kills never made: the level was reached until the end
        self.over = threading.Event()  # the run ended: stop waiting for recoveries that cannot come
        self.restarts: list[threading.Thread] = []
        self.children: list[subprocess.Popen[bytes]] = []
        # Each server's command line, read once while they all run: a killed one is started
        # again with it (same id, flags and cluster file).
        self.cmdlines: dict[int, list[str]] = {}
        for s in cluster.servers_of(file):
            raw = Path(f"/proc/{_entry(file, s['id'])['pid']}/cmdline").read_bytes()
            self.cmdlines[s["id"]] = [c.decode() for c in raw.split(b"\0") if c]

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
        unrecovered = sum(len(e["servers"]) for e in self.log if "recovered_s" not in e)
        return max(down_in_slot + (1 if pending else 0), unrecovered)

    def victims(self) -> list[int]:
        view, rows = self._everyone()
        live = [s for s in view.get("slots", []) if s not in view.get("down", [])]
        meta = [r["id"] for r in rows if r.get("meta") in ("leader", "follower", "candidate")]
        voters_alive = len([m for m in meta if m in live])
        entries = {s["id"]: s for s in cluster.servers_of(self.file)}
        if self.kill == "node":
            nodes = sorted({entries[s].get("node", "") for s in live})
            choices = [[s for s in live if entries[s].get("node", "") == n] for n in nodes]
        else:
            choices = [[s] for s in live]
        # Never leave the control plane without a majority of its voters.
        choices = [c for c in choices if voters_alive - len([s for s in c if s in meta]) > len(meta) // 2]
        return self.rng.choice(choices) if choices else []

    def strike(self, t0: float, end: float, going: Callable[[], bool] = lambda: True) -> dict[str, Any] | None:
        """Kills the next victims, first waiting (until ``end`` at most, while ``going()``) while
        that would go beyond the level; ``None`` when the kill is not made: the wait ran out, the
        workload ended, or no recovery can come (no restart and no spare left)."""
        deferred = 0.0
        if not self.beyond_level:
            start = time.monotonic()
            while self.outstanding() + 1 > self.level:
                hopeless = not self.restart and not (cluster.view(self.file, timeout=1.0) or {}).get("spares")
                if time.monotonic() >= end or not going() or hopeless:
                    self.skipped += 1
                    return None
                time.sleep(0.2)
            deferred = time.monotonic() - start
        victims = self.victims()
        event: dict[str, Any] = {"t_s": round(time.monotonic() - t0, 2), "servers": victims, "deferred_s": round(deferred, 2)}
        for sid in victims:
            os.kill(_entry(self.file, sid)["pid"], signal.SIGKILL)
            t = threading.Thread(target=self._recover_and_restart, args=(sid, self.cmdlines[sid], event), daemon=True)
            t.start()
            self.restarts.append(t)
        self.log.append(event)
        return event

    def _recover_and_restart(self, sid: int, cmd: list[str], event: dict[str, Any]) -> None:
        """Waits for the control plane to declare ``sid`` down, records when the recovery of what
        it held was done, and starts it again (it rejoins empty, as the next spare): at once when
        no spare is left to take its slot, else once the recovery is done, so that starting a
        server (~0.3 s of CPU) does not compete with the rebuild and the workload."""
        start = time.monotonic()
        declared = restarted = False

        def restart() -> None:
            nonlocal restarted
            if self.restart and not restarted:
                restarted = True
                with open(cluster.entries_dir(self.file) / f"server-{sid}.log", "ab") as log:
                    self.children.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

        while time.monotonic() - start < 120 and not self.over.is_set():
            view, rows = self._state()
            late = cluster.recovery_overdue(rows)
            if late > event.get("overdue_s", 0.0):
                event["overdue_s"] = round(late, 2)
            if not declared and sid in view.get("down", []):
                declared = True
                event.setdefault("declared_s", round(time.monotonic() - start, 2))
            if declared and not set(view.get("spares", [])) - set(view.get("down", [])):
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


def _ms(xs: list[float]) -> float | None:
    return round(1000 * float(np.mean(xs)), 2) if xs else None


def _tail(xs: list[float]) -> dict[str, float | None]:
    """Median, 99th percentile and worst of response times, in ms (a mean hides whether a few
    stalls or a slower common case cost the time)."""
    if not xs:
        return {"p50": None, "p99": None, "max": None}
    p50, p99, top = np.percentile(xs, [50, 99, 100])
    return {"p50": round(1000 * float(p50), 2), "p99": round(1000 * float(p99), 2), "max": round(1000 * float(top), 2)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    file = Path(args.cluster).absolute()
    cluster.document(file)  # a missing or foreign cluster file stops the run before it starts
    _check.output_folder(args.json, "--json")
    if args.workload and args.n < args.writers:
        raise InvalidArgumentError(f"--n {args.n} is less than --writers {args.writers}: each writer writes n / writers "
                                   "rows of the n×n field; give --n of at least --writers")
    mtbf, duration = seconds(args.mtbf), seconds(args.duration)
    rng = random.Random(args.seed)
    chaos = Chaos(file, args.kill, args.beyond_level, rng, restart=not args.no_restart)
    wl = Workload(file, args.dataset, args.writers, args.readers, args.steps, args.n, args.timeout, seconds(args.interval)) if args.workload else None
    threads = wl.run() if wl else []
    t0 = time.monotonic()
    if wl:
        # The fault-free baseline: the workload's first steps before any kill.
        while len(wl.times["baseline"]["write"]) < max(2, args.writers * 3) and any(t.is_alive() for t in threads[: args.writers]):
            time.sleep(0.05)
        wl.phase = "chaos"
    end = time.monotonic() + duration
    next_kill = time.monotonic() + rng.expovariate(1 / mtbf)
    while time.monotonic() < end:
        if wl and not any(t.is_alive() for t in threads[: args.writers]):
            break
        if time.monotonic() >= next_kill:
            ev = chaos.strike(t0, end, lambda: not wl or any(t.is_alive() for t in threads[: wl.writers]))
            if ev:
                print(f"[{ev['t_s']:7.1f} s] killed {ev['servers']} (deferred {ev['deferred_s']} s)", flush=True)
                _debug(f"killed {ev['servers']}")
            next_kill = time.monotonic() + rng.expovariate(1 / mtbf)
        time.sleep(0.05)
    if wl:
        # The duration is up: every writer ends the step the furthest one is at, then stops.
        wl.stop_after = max(wl.at)
        for t in threads[: args.writers]:
            t.join(timeout=args.timeout + 60)
        run_s = max(wl.ended, default=time.monotonic()) - t0
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
    return report


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
    p.set_defaults(func=main)


def options(argv: list[str]) -> argparse.Namespace:
    """``cairn chaos`` options from its command-line words (for callers in Python)."""
    ap = argparse.ArgumentParser(prog="cairn")
    add(ap.add_subparsers())
    return ap.parse_args(["chaos", *argv])


def main(args: argparse.Namespace) -> None:
    from .exceptions import UnavailableError

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
    if wl and (wl["errors"] or not wl["steps_written"]):
        why = "; ".join(wl["errors"]) or "no step was written"
        raise UnavailableError(f"the workload could not write: {why}")
