"""Hung is not lost (issue 51, item 7): a get whose only holder is SIGSTOPped, or SIGKILLed but
not yet declared down, raises UnavailableError naming the server; DataLossError comes only once
the control plane declared every holder down (a server declared down rejoins empty). Copies on
servers still up keep reading. Real server processes and signals."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import cairn
from cairn import cluster

from .test_staging import wait_for

N = 4096


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL])
def test_a_holder_hung_or_not_yet_declared_down_is_unavailable_and_declared_down_is_lost(tmp_path, sig):
    c = cluster.start(tmp_path / "c.json", servers=3, memory="64MiB", failure_timeout="5s", redundancy=1)
    pids = {s["id"]: s["pid"] for s in cluster.servers_of(c.file)}
    try:
        w = cairn.open("h", "w", engine="staging", cluster=c.file, object_size=N * 8)
        w.define("lone", "f8", (N,), redundancy=0)
        w.define("safe", "f8", (N,), redundancy=1)
        with w.step(0):
            w.put("lone", np.arange(N, dtype="f8"))
            w.put("safe", np.arange(N, dtype="f8") * 2)
        rows = cluster.status(c.file, objects=True)
        holder = next(r["id"] for r in rows for o in r.get("object_list", []) if o["var"] == "lone")
        os.kill(pids[holder], sig)
        r = cairn.open("h", "r", engine="staging", cluster=c.file, timeout=0.5)
        with pytest.raises(cairn.UnavailableError, match=f"server {holder}") as e:
            r.get("lone", 0)
        assert not isinstance(e.value, cairn.DataLossError)
        np.testing.assert_array_equal(r.get("safe", 0), np.arange(N) * 2.0)
        wait_for(lambda: holder in (cluster.view(c.file, timeout=1.0) or {}).get("down", []), f"server {holder} declared down", 30)
        later = cairn.open("h", "r", engine="staging", cluster=c.file, timeout=0.5)
        with pytest.raises(cairn.DataLossError, match="lost"):
            later.get("lone", 0)
        np.testing.assert_array_equal(later.get("safe", 0), np.arange(N) * 2.0)
    finally:
        if sig == signal.SIGSTOP:
            os.kill(pids[holder], signal.SIGCONT)
        c.stop()
