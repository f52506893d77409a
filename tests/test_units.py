"""Sizes and durations as HPC users write them (issue 56): one parser for the CLI, ``cairn.toml``
and ``cairn serve``; a bare ``K``/``M``/``G``/``T`` is binary, as in Slurm."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import cairn
from cairn import cluster


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cairn", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_a_bare_letter_memory_is_binary_on_every_server_and_its_meaning_is_noted_once(tmp_path):
    file = tmp_path / "c.json"
    p = _cli("cluster", "start", "--servers", "2", "--memory", "96m", "--prefault", "8M", "--cluster", str(file))
    try:
        assert p.returncode == 0, p.stderr
        assert p.stderr.count('size "96m" is 100663296 bytes: a bare M is binary, as in Slurm (write 96MB') == 1, p.stderr
        st = _cli("cluster", "status", "--cluster", str(file), "--json")
        rows = json.loads(st.stdout)["servers"]
        assert [r["limit"] for r in rows] == [96 << 20] * 2
        assert all(r["prefault"]["target_bytes"] == 8 << 20 for r in rows), rows
    finally:
        assert _cli("cluster", "stop", "--cluster", str(file)).returncode == 0


def test_cairn_toml_takes_integer_sizes_and_duration_seconds(tmp_path):
    # prefault = 0 (an integer) was a parse error; timeout takes "2s" as well as 2.
    (tmp_path / "cairn.toml").write_text('engine = "staging"\n[staging]\nservers = 1\nmemory = 67108864\n'
                                         'prefault = 0\nobject_size = "1M"\ntimeout = "2s"\n')
    c = cluster.start(tmp_path / "c.json", servers=1, memory="64MiB")
    try:
        with cairn.open("u", "w", config=str(tmp_path / "cairn.toml"), cluster=str(c.file)) as f:
            f.define("x", "f8", (1 << 18,))
            with f.step(0):
                f.put("x", [1.0] * (1 << 18))
        assert sum(s["objects"] for s in cluster.status(c.file)) >= 2, "2 MiB cut into objects of at most 1 MiB"
    finally:
        c.stop()
    bad = tmp_path / "bad.toml"
    bad.write_text('[staging]\nprefault = "lots"\n')
    with pytest.raises(cairn.ConfigError, match=r'(?s)prefault = "lots".*size "lots" not understood.*4G \(binary\)'):
        cairn.open("u", "w", config=str(bad))
