"""An operator's view of a running cluster (issue 54): ``cairn cluster status`` names its health
(``ok``/``warn``/``err`` with typed reasons), each server's role, the objects below their level,
and warns of layouts that cannot keep their promise. Real servers, real SIGKILLs."""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import cairn
from cairn import cluster
from cairn.cluster_status import health, status_json



def wait_for(cond, what: str, timeout: float):
    """Polls ``cond`` until it returns something; that, or a failure naming ``what``."""
    deadline = time.monotonic() + timeout
    while (got := cond()) is None:
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)
    return got


def _status(file) -> dict:
    return status_json(cluster.status(file, timeout=2.0), cluster.drain_status(file, timeout=2.0))


def _when(doc: dict, ok) -> dict | None:
    return doc if ok(doc) else None


def _codes(doc: dict) -> list[str]:
    return [r["code"] for r in doc["health"]["reasons"]]


def _write(file, steps: int = 4) -> None:
    with cairn.open("sim", "w", cluster=str(file), object_size=4096, rank=0, nranks=1) as w:
        w.define("p", "f8", (32, 32))
        for s in range(steps):
            with w.step(s):
                w.put("p", np.full((32, 32), float(s)))


def test_a_whole_cluster_is_ok_and_names_roles(tmp_path: Path) -> None:
    c = cluster.start(tmp_path / "cluster.json", servers=4, memory="64MiB", meta=3)
    try:
        doc = _status(c.file)
        assert doc["health"] == {"state": "ok", "reasons": []}, doc["health"]
        roles = sorted((s["role"] or "none") for s in doc["servers"])
        assert roles == ["follower", "follower", "leader", "none"], roles
        assert doc["leader"] == next(s["id"] for s in doc["servers"] if s["role"] == "leader")
        assert all(s["meta"] == (s["role"] or "none") for s in doc["servers"]), "meta stays as the role's alias"
        assert doc["recovery"]["degraded_objects"] == 0
        text = subprocess.run([sys.executable, "-m", "cairn", "cluster", "status", "--cluster", str(c.file)],
                              capture_output=True, text=True, check=True).stdout
        assert text.splitlines()[0] == "health: OK", text
        assert " role " in text.splitlines()[1] and "leader" in text, text
    finally:
        c.stop()


def test_a_killed_server_turns_health_to_warn_with_its_degraded_objects(tmp_path: Path) -> None:
    c = cluster.start(tmp_path / "cluster.json", servers=4, memory="64MiB", meta=3, redundancy=1, scheme="replicate",
                      failure_timeout="1s")
    try:
        _write(c.file)
        victim = next(r["id"] for r in cluster.status(c.file) if r["meta"] == "none")
        t0 = time.monotonic()
        c.procs[victim].send_signal(signal.SIGKILL)

        def degraded() -> dict | None:
            doc = _status(c.file)
            return doc if "degraded" in _codes(doc) and "server_down" in _codes(doc) else None

        doc = wait_for(degraded, "health names the down server and its degraded objects", 15)
        took = time.monotonic() - t0
        assert doc["health"]["state"] == "warn", doc["health"]
        assert doc["recovery"]["degraded_objects"] > 0
        down = next(r for r in doc["health"]["reasons"] if r["code"] == "server_down")
        assert str(victim) in down["message"], down
        print(f"health turned warn {took:.1f} s after the SIGKILL (failure timeout 1 s)")
    finally:
        c.stop()


def test_a_two_server_start_warns_of_its_fragile_layout(tmp_path: Path) -> None:
    file = tmp_path / "cluster.json"
    r = subprocess.run([sys.executable, "-m", "cairn", "cluster", "start", "--cluster", str(file), "--servers", "2",
                        "--memory", "64MiB"], capture_output=True, text=True, timeout=120)
    try:
        assert r.returncode == 0, r.stderr
        assert "warning: a fragile layout" in r.stderr and "start 3 or more servers" in r.stderr, r.stderr
        doc = _status(file)
        assert doc["health"]["state"] == "warn" and _codes(doc) == ["fragile_layout"], doc["health"]
    finally:
        subprocess.run([sys.executable, "-m", "cairn", "cluster", "stop", "--cluster", str(file)], capture_output=True, timeout=60)


def test_lost_quorum_is_an_error_and_no_leader_is_named(tmp_path: Path) -> None:
    c = cluster.start(tmp_path / "cluster.json", servers=3, memory="64MiB", meta=3, failure_timeout="1s")
    try:
        leader = next(r["id"] for r in cluster.status(c.file) if r["meta"] == "leader")
        for s in [s for s in range(3) if s != leader]:
            c.procs[s].send_signal(signal.SIGKILL)

        def lost() -> dict | None:
            doc = _status(c.file)
            return doc if doc["health"]["state"] == "err" else None

        doc = wait_for(lost, "health err once the quorum is gone", 20)
        assert "lost_quorum" in _codes(doc), doc["health"]
        assert doc["leader"] is None, doc
    finally:
        c.stop()


def test_a_writer_learns_of_a_lost_quorum_within_the_failure_timeout_and_one_election(tmp_path: Path) -> None:
    """The majority of the control plane SIGKILLed under a writer with a 30 s timeout: its next
    step (an empty one, so no put meets a dead server first) fails with the lost quorum named within the failure timeout (1 s) and one election
    (3 s) and some slack, not at its timeout."""
    c = cluster.start(tmp_path / "cluster.json", servers=3, memory="64MiB", meta=3, redundancy=0, failure_timeout="1s")
    try:
        w = cairn.open("q", "w", cluster=str(c.file), timeout=30.0)
        w.define("t", "f8", (4,))
        with w.step(0):
            w.put("t", np.zeros(4))
        leader = next(r["id"] for r in cluster.status(c.file) if r["meta"] == "leader")
        for s in [s for s in range(3) if s != leader]:
            c.procs[s].send_signal(signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(cairn.UnavailableError) as e:
            for step in range(1, 100):
                with w.step(step):  # an empty step: only the control plane is asked
                    pass
        took = time.monotonic() - started
        assert e.value.code == "lost_quorum" or "quorum" in str(e.value), str(e.value)
        assert took < 1 + 3 + 5, f"told after {took:.1f} s"
    finally:
        c.stop()


def test_status_watch_prints_a_block_per_refresh_off_a_terminal(tmp_path: Path) -> None:
    c = cluster.start(tmp_path / "cluster.json", servers=3, memory="64MiB")
    try:
        with subprocess.Popen([sys.executable, "-m", "cairn", "cluster", "status", "--cluster", str(c.file), "--watch", "0.2"],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}) as p:
            assert p.stdout is not None
            blocks = 0
            deadline = time.monotonic() + 30
            while blocks < 3 and time.monotonic() < deadline:
                line = p.stdout.readline()
                blocks += line.startswith("health: ")
            p.send_signal(signal.SIGINT)
            assert p.wait(10) == 0, "interrupted, it ends quietly"
        assert blocks == 3, "a block per refresh"
    finally:
        c.stop()


def test_status_json_of_a_stopped_cluster_has_no_health(tmp_path: Path) -> None:
    c = cluster.start(tmp_path / "cluster.json", servers=3, memory="64MiB")
    c.stop()
    out = subprocess.run([sys.executable, "-m", "cairn", "cluster", "status", "--cluster", str(c.file), "--json"],
                         capture_output=True, text=True, check=True).stdout
    doc = json.loads(out)
    assert doc["state"] == "stopped" and "health" not in doc, doc


def test_a_client_that_finds_no_leader_says_why() -> None:
    rows = [{"id": 0, "state": "down", "error": "x", "meta": "none", "voters": None, "health": None},
            {"id": 1, "state": "up", "meta": "candidate", "voters": [0, 1, 2], "health": None},
            {"id": 2, "state": "up", "meta": "candidate", "voters": [0, 1, 2], "health": None}]
    doc = health(rows)
    assert doc["state"] == "warn" and [r["code"] for r in doc["reasons"]] == ["server_down", "electing"], doc
    rows[2]["state"] = "down"
    doc = health(rows)
    assert doc["state"] == "err" and [r["code"] for r in doc["reasons"]] == ["server_down", "lost_quorum"], doc


def _fields(file, steps: int):
    """A writer that put ``steps`` steps of a random 32×32 field "p" (2 KiB objects), and the fields."""
    fields = {s: np.random.default_rng(s).random((32, 32)) for s in range(steps)}
    w = cairn.open("sim", "w", cluster=str(file), object_size=2048, rank=0, nranks=1, timeout=20.0)
    w.define("p", "f8", (32, 32))
    for s, a in fields.items():
        with w.step(s):
            w.put("p", a)
    return w, fields


def test_redundancy_returns_on_the_survivors_and_a_second_failure_keeps_quorum_and_data(tmp_path: Path) -> None:
    """The issue's run: 4 servers, no spare, level 1. A follower of the control plane is
    SIGKILLed: health warns, the survivors take its pieces and a non-voter takes its vote, health
    is ok again within the recovery deadline. A second follower SIGKILLed then loses nothing: every
    step reads back exactly and steps still commit."""
    c = cluster.start(tmp_path / "cluster.json", servers=4, memory="64MiB", meta=3, redundancy=1, scheme="replicate",
                      failure_timeout="1s", recovery_deadline="5s")
    try:
        w, fields = _fields(c.file, 8)
        rows = cluster.status(c.file)
        first = next(r["id"] for r in rows if r["meta"] == "follower")
        c.procs[first].send_signal(signal.SIGKILL)
        doc = wait_for(lambda: _when(_status(c.file), lambda d: "degraded" in _codes(d)), "degraded named", 15)
        assert doc["health"]["state"] == "warn" and doc["recovery"]["degraded_objects"] > 0, doc["health"]
        t0 = time.monotonic()
        doc = wait_for(lambda: _when(_status(c.file), lambda d: d["health"]["state"] == "ok"),
                       "health ok again, redundancy restored on the survivors", 5 + 15)
        print(f"redundancy restored {time.monotonic() - t0:.1f} s after the failure was named (recovery deadline 5 s)")
        assert doc["recovery"]["degraded_objects"] == 0
        voters = {s["id"] for s in doc["servers"] if s["role"] in ("leader", "follower")}
        assert len(voters) == 3 and first not in voters, f"a non-voter took the lost vote: {doc['servers']}"
        second = next(s["id"] for s in doc["servers"] if s["role"] == "follower")
        c.procs[second].send_signal(signal.SIGKILL)
        r = cairn.open("sim", "r", cluster=str(c.file), timeout=20.0)
        for s, a in fields.items():
            assert np.array_equal(r.get("p", s), a), f"step {s} after two failures"
        with w.step(8):
            w.put("p", fields[0])
        assert 8 in r.steps(), "a step commits: the quorum is kept"
        doc = _status(c.file)
        assert doc["leader"] is not None and "lost_quorum" not in _codes(doc) and "lost" not in _codes(doc), doc["health"]
        r.close()
        w.close()
    finally:
        c.stop()


def _pieces(file) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Every piece the live servers hold, by (step, object id): (shard, server) pairs."""
    out: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for row in cluster.status(file, objects=True, timeout=2.0):
        for o in row.get("object_list") or []:
            out.setdefault((o["step"], o["id"]), []).append((o.get("shard", 0), row["id"]))
    return out


def test_a_stripe_that_no_longer_fits_is_encoded_again_with_a_smaller_k(tmp_path: Path) -> None:
    """4 servers, no spare, level 1, erasure coded at put: RS(3 + 1) over all four. A follower
    SIGKILLed leaves each stripe a shard short with no server to rebuild it on; recovery decodes
    each object into copies and encodes it again as RS(2 + 1) over the 3 left, health is ok again,
    and a second failure then loses nothing (2 of the 3 shards are left)."""
    c = cluster.start(tmp_path / "cluster.json", servers=4, memory="64MiB", meta=3, redundancy=1, scheme="erasure",
                      failure_timeout="1s", recovery_deadline="5s")
    try:
        w, fields = _fields(c.file, 4)
        before = _pieces(c.file)
        assert len(before) == 16 and all(sorted(sh for sh, _ in p) == [1, 2, 3, 4] for p in before.values()), before
        first = next(r["id"] for r in cluster.status(c.file) if r["meta"] == "follower")
        c.procs[first].send_signal(signal.SIGKILL)
        wait_for(lambda: _when(_status(c.file), lambda d: "degraded" in _codes(d)), "degraded named", 15)
        doc = wait_for(lambda: _when(_status(c.file), lambda d: d["health"]["state"] == "ok"), "health ok again", 20)
        assert doc["recovery"]["degraded_objects"] == 0 and doc["recovery"]["lost_objects"] == 0, doc["recovery"]
        # Every object: RS(2 + 1), one shard on each of the 3 left, no copies left behind.
        narrowed = wait_for(lambda: _when(_pieces(c.file), lambda p: all(sorted(sh for sh, _ in x) == [1, 2, 3] for x in p.values())),
                            "every object RS(2 + 1)", 10)
        assert set(narrowed) == set(before)
        assert all(len({srv for _, srv in x}) == 3 and first not in {srv for _, srv in x} for x in narrowed.values()), narrowed
        r = cairn.open("sim", "r", cluster=str(c.file), timeout=20.0)
        for s, a in fields.items():
            assert np.array_equal(r.get("p", s), a), f"step {s} after the first failure"
        second = next(s["id"] for s in doc["servers"] if s["role"] == "follower")
        c.procs[second].send_signal(signal.SIGKILL)
        for s, a in fields.items():
            assert np.array_equal(r.get("p", s), a), f"step {s} after the second failure"
        r.close()
        w.close()
    finally:
        c.stop()


LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d) +(TRACE|DEBUG|INFO|WARN|ERROR) ")


def test_server_logs_have_times_and_levels_and_outlive_stop_and_restart(tmp_path: Path) -> None:
    file = tmp_path / "cluster.json"
    c = cluster.start(file, servers=4, memory="64MiB", meta=3, failure_timeout="1s")
    victim = next(r["id"] for r in cluster.status(file) if r["meta"] == "none")
    c.procs[victim].send_signal(signal.SIGKILL)
    logs = cluster.entries_dir(file)
    # The leader logs the view change that declares the victim down.
    wait_for(lambda: True if any("declared" in p.read_text() or "down [" in p.read_text() for p in logs.glob("server-*.log")) else None,
             "the leader logs the failure", 15)
    c.stop()
    lines = [line for p in sorted(logs.glob("server-*.log")) for line in p.read_text().splitlines()]
    events = [line for line in lines if LOG_LINE.match(line)]
    assert events, lines
    assert all(LOG_LINE.match(line) for line in lines if "server=" in line), lines
    assert any("server=" in line and " INFO " in line for line in events), events
    first = (logs / "server-0.log").read_text()
    assert first, "stop keeps the logs"
    c = cluster.start(file, servers=4, memory="64MiB", meta=3)
    try:
        assert (logs / "server-0.log.1").read_text() == first, "a start keeps the last run's log as .log.1"
    finally:
        c.stop()


def test_server_logs_as_json_lines(tmp_path: Path) -> None:
    file = tmp_path / "cluster.json"
    log = tmp_path / "s0.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "cairn", "serve", "--cluster", str(file), "--id", "0", "--servers", "1",
                          "--memory", "16MiB", "--meta", "1", "--log-format", "json", "--log-file", str(log), "--log-level", "debug"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_for(lambda: True if log.exists() and log.read_text().strip() else None, "a first log line", 30)
        for line in log.read_text().splitlines():
            doc = json.loads(line)
            assert {"timestamp", "level", "fields"} <= set(doc), doc
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(20)
