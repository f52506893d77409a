"""The control plane across real server processes: the first meta servers of the ring elect a
Raft leader, ``cairn cluster status --json`` shows it and every server's part, a SIGKILLed
leader is replaced within 2 s, and a restarted meta server rejoins."""

from __future__ import annotations

import json
import signal
import subprocess
import time

from cairn import cluster

from .conftest import PY


def status(file) -> dict:
    out = subprocess.run([PY, "-m", "cairn", "cluster", "status", "--file", str(file), "--json", "--timeout", "2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wait_leader(file, meta_servers: int, not_in: tuple[int, ...] = (), timeout: float = 10.0) -> tuple[int, dict]:
    """The leader, once ``meta_servers`` live meta servers agree on one outside ``not_in``."""
    deadline = time.monotonic() + timeout
    while True:
        rows = cluster.status(file, timeout=2.0)
        meta = [r for r in rows if r["state"] == "up" and r["meta"] in ("leader", "follower")]
        leaders = {r["leader"] for r in meta}
        if len(meta) == meta_servers and len(leaders) == 1 and None not in leaders and leaders <= {r["id"] for r in meta} - set(not_in):
            lead = leaders.pop()
            if [r["meta"] for r in meta].count("leader") == 1:
                return lead, {r["id"]: r["meta"] for r in rows}
        assert time.monotonic() < deadline, rows
        time.sleep(0.02)


def test_status_shows_the_raft_leader_and_a_killed_leader_is_replaced_within_2s(tmp_path):
    c = cluster.start(tmp_path / "cluster.json", servers=4, memory="16MiB", meta=3)
    try:
        leader, roles = wait_leader(c.file, 3)
        assert sorted(roles.values()) == ["follower", "follower", "leader", "none"], roles
        doc = status(c.file)
        assert doc["leader"] == leader and doc["epoch"] == 1
        assert {s["id"]: s["meta"] for s in doc["servers"]} == roles
        c.procs[leader].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        c.procs[leader].wait(timeout=10)
        new, _ = wait_leader(c.file, 2, not_in=(leader,))
        assert new != leader and time.monotonic() - killed < 2.0 + 1.0  # + the polling's own status calls
    finally:
        c.stop()
