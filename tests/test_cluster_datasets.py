"""Datasets an operator can list (issue 66): ``cairn ls --cluster FILE`` lists the cluster's
datasets one line each, ``cairn status --json`` (also ``cairn status``, the alias issue 67 asks
for) lists them with their steps in memory, newest step, bytes, drained step and writers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import cairn
from cairn import cluster


def _cairn(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cairn", *args], capture_output=True, text=True, timeout=60)


def test_ls_and_status_list_the_datasets_of_a_cluster(tmp_path: Path) -> None:
    c = cluster.start(tmp_path / "cluster.json", servers=3, memory="64MiB", meta=3, drain=str(tmp_path / "drain"))
    try:
        empty = _cairn("ls", "--cluster", str(c.file))
        assert empty.returncode == 0, empty.stderr
        assert empty.stdout.startswith("0 datasets in"), empty.stdout
        with cairn.open("alpha", "w", cluster=c.file) as w:
            w.define("x", "f8", (10,))
            w.define("y", "i4", (3,))
            for s in range(3):
                with w.step(s):
                    w.put("x", np.arange(10.0) + s)
                    w.put("y", np.arange(3, dtype="i4"))
        cluster.drain(c.file, timeout=30)
        with cairn.open("beta two", "w", cluster=c.file) as w:
            w.define("v", "f4", (8,))
            with w.step(0):
                w.put("v", np.zeros(4, "f4"), offset=(0,))
                w.put("v", np.ones(4, "f4"), offset=(4,))

        ls = _cairn("ls", "--cluster", str(c.file))
        assert ls.returncode == 0, ls.stderr
        lines = ls.stdout.splitlines()
        assert lines[0] == f"2 datasets in {c.file}"
        rows = {ln.split("  ")[0].strip(): ln for ln in lines[3:]}
        assert set(rows) == {"alpha", "beta two"}, lines
        assert "3 committed: 0..2" in rows["alpha"] and rows["alpha"].split()[1] == "2"
        assert "1 committed: 0" in rows["beta two"]
        one = _cairn("ls", "alpha", "--cluster", str(c.file))
        assert one.returncode == 0 and one.stdout.startswith("dataset alpha\n"), one.stdout + one.stderr

        for cmd in (("cluster", "status"), ("status",)):
            st = _cairn(*cmd, "--json", "--cluster", str(c.file))
            assert st.returncode == 0, st.stderr
            doc = json.loads(st.stdout)
            assert doc["health"]["state"] == "ok"
            sets = {d["name"]: d for d in doc["datasets"]}
            assert sets["alpha"] == {"name": "alpha", "steps_in_memory": 3, "newest_step": 2, "bytes": 3 * (80 + 12),
                                     "drained_to": 2, "writers": 1}
            beta = sets["beta two"]
            assert (beta["steps_in_memory"], beta["newest_step"], beta["bytes"], beta["writers"]) == (1, 0, 32, 1)
            assert beta["drained_to"] in (None, 0), "drained or not yet"
        text = _cairn("status", "--cluster", str(c.file))
        assert text.returncode == 0, text.stderr
        assert "health: OK" in text.stdout and "steps in memory" in text.stdout
        assert any(ln.startswith("alpha ") for ln in text.stdout.splitlines())
    finally:
        c.stop()


def test_a_cluster_without_drain_says_none_drained(tmp_path: Path) -> None:
    c = cluster.start(tmp_path / "cluster.json", servers=2, memory="64MiB", meta=1)
    try:
        with cairn.open("only", "w", cluster=c.file) as w:
            w.define("x", "f8", (4,))
            with w.step(0):
                w.put("x", np.ones(4))
        doc = json.loads(_cairn("status", "--json", "--cluster", str(c.file)).stdout)
        assert doc["datasets"] == [{"name": "only", "steps_in_memory": 1, "newest_step": 0, "bytes": 32, "drained_to": None,
                                    "writers": 1}]
    finally:
        c.stop()


def test_ls_without_a_name_needs_a_cluster() -> None:
    r = _cairn("ls")
    assert r.returncode == 1 and "--cluster FILE" in r.stderr, r.stderr
