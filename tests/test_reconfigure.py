"""Reconfiguration as view-change transactions (issue 18): servers are added, retired and
replaced between a writer's steps, with a reader opened before the changes; every committed
box reads back and no index entry names a server that left. (Clients that are mid-step across
a retirement can still get an error: an open defect noted on issue 18.)"""

from __future__ import annotations

import threading

import numpy as np

import cairn
from cairn import cluster

ROWS, COLS = 16, 64


def _block(step: int, rank: int) -> np.ndarray:
    return np.arange(ROWS * COLS, dtype="f8").reshape(ROWS, COLS) + 1e6 * step + 1e3 * rank


def test_servers_are_added_retired_and_replaced_and_every_step_reads_back(tmp_path):
    c = cluster.start(tmp_path / "cluster.json", servers=4, spares=1, memory="128MiB", meta=3, redundancy=1,
                      scheme="replicate", failure_timeout="1s", recovery_deadline="3s")
    try:
        opts = dict(engine="staging", cluster=c.file, object_size=2048, timeout=20.0)
        ws = [cairn.open("sim", "w", rank=k, nranks=2, session="reconf", **opts) for k in range(2)]
        for w in ws:
            w.define("u", "f8", (2 * ROWS, COLS))
        r = cairn.open("sim", "r", **opts)
        old = {e["id"] for e in cluster.view(c.file)["servers"]}
        steps_written = []

        def steps(n: int) -> None:
            for _ in range(n):
                s = len(steps_written)
                ts = [threading.Thread(target=_one, args=(ws[k], s, k)) for k in range(2)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                steps_written.append(s)

        steps(5)
        v = cluster.add(c.file, 2)
        added = sorted({e["id"] for e in v["servers"]} - old)
        assert len(added) == 2 and all(a in v["slots"] for a in added), v
        steps(5)
        holders = {o["id"] for row in cluster.status(c.file, objects=True) if row["id"] in added for o in row["object_list"]}
        assert holders, "new steps are placed on the added servers"
        victim = next(row["id"] for row in cluster.status(c.file) if row["meta"] == "none" and row["state"] == "up"
                      and row["id"] not in added)
        v = cluster.retire(c.file, victim, wait=60)
        assert victim not in v["slots"] and all(e["id"] != victim for e in v["servers"]), v
        steps(5)
        spare = v["spares"][0]
        v = cluster.replace(c.file, added[0], spare, wait=60)
        assert spare in v["slots"] and all(e["id"] != added[0] for e in v["servers"]), v
        steps(5)
        rows = cluster.status(c.file)
        states = {row["id"]: row["state"] for row in rows}
        assert victim not in states and added[0] not in states and states[added[1]] == "up" and states[spare] == "up", (rows, cluster.view(c.file))
        assert r.steps() == steps_written
        for s in steps_written:
            assert np.array_equal(r.get("u", s), np.concatenate([_block(s, 0), _block(s, 1)])), f"step {s}"
        # Nothing reads degraded: no index entry names a server that left.
        assert {b.state for s in steps_written for b in r.blocks("u", s)} <= {"replicated", "encoded"}
        r.close()
        for w in ws:
            w.close()
    finally:
        c.stop()


def _one(w, step: int, rank: int) -> None:
    with w.step(step):
        w.put("u", _block(step, rank), offset=(rank * ROWS, 0))
