"""The servers' logs tell an incident's story (issue 66): the leader SIGKILLed, then a majority;
the survivor's log has, in order and by structured fields, its start, the first leader, the view
that declared the killed leader down, the new leader, and its lost quorum."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any, Callable

from cairn import cluster

from .test_staging import wait_for


def _events(log: Path) -> list[tuple[str, dict[str, str]]]:
    """The log's structured events, in order: each ``event=NAME`` line with its fields."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = re.search(r'\bevent="?(\w+)"?', line)
        if m:
            fields = dict(re.findall(r'\b(\w+)=("[^"]*"|\[[^\]]*\]|\S+)', line))
            out.append((m.group(1), {k: v.strip('"') for k, v in fields.items()}))
    return out


def _until(f: Callable[[], Any], what: str, timeout: float) -> Any:
    """Polls ``f`` until it gives something but None; fails naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while (got := f()) is None:
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)
    return got


def test_a_survivors_log_tells_a_leader_kill_and_a_lost_quorum_in_order(tmp_path: Path) -> None:
    c = cluster.start(tmp_path / "cluster.json", servers=3, memory="64MiB", meta=3, failure_timeout="1s")
    try:
        def leader() -> int | None:
            return next((r["id"] for r in cluster.status(c.file, timeout=2.0) if r["meta"] == "leader"), None)

        first = _until(leader, "a leader", 20)
        c.procs[first].send_signal(signal.SIGKILL)
        second = _until(lambda: (lambda s: s if s not in (None, first) else None)(leader()), "a new leader", 30)
        other = next(s for s in range(3) if s not in (first, second))
        logs = cluster.entries_dir(c.file)
        wait_for(lambda: any(e == "view_changed" and str(first) in f.get("newly_down", "") for e, f in _events(logs / f"server-{second}.log")),
                 "the view declaring the first leader down", 30)
        c.procs[other].send_signal(signal.SIGKILL)
        log = logs / f"server-{second}.log"
        wait_for(lambda: any(e == "quorum_lost" for e, _ in _events(log)), "the survivor's lost quorum", 30)
        events = _events(log)
        names = [e for e, _ in events]
        started = names.index("started")
        elected = [i for i, (e, f) in enumerate(events) if e == "leader_elected" and f["leader"] == str(first)]
        down = next(i for i, (e, f) in enumerate(events) if e == "view_changed" and str(first) in f["newly_down"])
        took_over = next(i for i, (e, f) in enumerate(events) if e == "leader_elected" and f["leader"] == str(second))
        lost = names.index("quorum_lost")
        assert started < elected[0] < took_over < down < lost, events
        assert int(events[took_over][1]["term"]) > int(events[elected[0]][1]["term"]), "a new term"
        assert events[started][1]["cluster"] and events[started][1]["version"], events[started]
    finally:
        c.stop()
