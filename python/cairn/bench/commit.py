"""Step commits through the Raft control plane, beside D²T (Fig. 3/5: 1.2 s at 4096 writers × 32
servers).

For each cluster of S servers (M of them running the control plane: M = 1 is a log with no
replication, the baseline; 3 and 5 replicate every entry to a majority) and W writer threads
(each its own rank and connection, one session): every step, the writers put their share of the
step (nothing, or 1 MiB in all), meet at a barrier, and end the step at once; the commit time is
from that moment to the last writer's ``end_step`` returning, which is when the step is visible
(the last fragment's writer is answered after the ``Commit`` entry is applied). The leader's
``status`` gives the time per phase: fragments (first fragment in to the step prepared, W log
entries), seal (objects checked and sealed on the servers that hold them) and commit (the
``Commit`` entry). Also the failover time: from SIGKILL of the leader to the next commit of a
single writer that commits step after step.

Prints a table (median and p90 per configuration) and saves ``bench/results/commit.json``.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import cairn
from cairn import cluster

from .results import save, table


def leader_status(file: Path) -> dict[str, Any]:
    """The status row of the server leading the control plane (waits for one)."""
    deadline = time.monotonic() + 15
    while True:
        rows = cluster.status(file, timeout=2.0)
        lead = [r for r in rows if r.get("meta") == "leader"]
        if lead:
            return lead[0]
        if time.monotonic() > deadline:
            raise SystemExit(f"no leader of the control plane in {file}: {rows}")
        time.sleep(0.05)


def commit_times(file: Path, dataset: str, writers: int, steps: int, step_bytes: int) -> list[float]:
    """Seconds from the writers' simultaneous ``end_step`` to the step's visibility, per step."""
    per = step_bytes // 8 // writers
    opts = dict(engine="staging", cluster=file, session=f"bench-{dataset}", object_size=max(per * 8, 4096))
    ws = [cairn.open(dataset, "a", rank=r, nranks=writers, **opts) for r in range(writers)]
    for w in ws:
        w.define("x", "f8", (max(per, 1) * writers,))
    data = np.ones(per)
    barrier = threading.Barrier(writers + 1)
    done: list[float] = [0.0] * writers
    errors: list[BaseException] = []

    def run(r: int) -> None:
        w = ws[r]
        try:
            for s in range(steps):
                with w.step(s):
                    if per:
                        w.put("x", data, offset=(r * per,))
                    barrier.wait()  # the writers end the step together, leaving the block
                done[r] = time.perf_counter()
                barrier.wait()  # the step is measured
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)
            barrier.abort()

    ts = [threading.Thread(target=run, args=(r,)) for r in range(writers)]
    for t in ts:
        t.start()
    out = []
    try:
        for _ in range(steps):
            barrier.wait()
            t0 = time.perf_counter()
            barrier.wait()
            out.append(max(done) - t0)
    except threading.BrokenBarrierError:
        pass
    for t in ts:
        t.join()
    for w in ws:
        w.close()
    if errors:
        raise errors[0]
    return out


def failover(tmp: Path, servers: int, meta: int) -> float:
    """Seconds from SIGKILL of the leader to the next step a single writer commits."""
    c = cluster.start(tmp / "failover.json", servers=servers, memory="256MiB", meta=meta)
    try:
        lead = leader_status(c.file)["id"]
        w = cairn.open("f", "w", engine="staging", cluster=c.file)
        w.define("x", "f8", (1,))
        with w.step(0):
            w.put("x", np.ones(1))
        c.procs[lead].send_signal(signal.SIGKILL)
        killed = time.perf_counter()
        step = 1
        while True:
            try:
                with w.step(step):
                    w.put("x", np.ones(1))
                return time.perf_counter() - killed
            except cairn.UnavailableError:
                step += 1  # its objects were on the dead leader: the next step places anew
    finally:
        c.stop()


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m cairn.bench commit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="1,2,4,8", help="cluster sizes (default 1,2,4,8)")
    ap.add_argument("--writers", default="1,4,16,64", help="writer threads (default 1,4,16,64)")
    ap.add_argument("--meta", default="1,3,5", help="control-plane sizes M (default 1,3,5; at most the servers)")
    ap.add_argument("--sizes", default="0,1048576", help="bytes per step in all (default empty and 1 MiB)")
    ap.add_argument("--steps", type=int, default=20, help="steps per configuration (default 20)")
    ap.add_argument("--no-failover", action="store_true", help="skip the failover measurement")
    a = ap.parse_args(argv)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for servers in ints(a.servers):
            for m in sorted({min(m, servers) for m in ints(a.meta)}):
                c = cluster.start(Path(tmp) / f"c{servers}-{m}.json", servers=servers, memory="1GiB", meta=m)
                try:
                    leader_status(c.file)
                    for size in ints(a.sizes):
                        for writers in ints(a.writers):
                            before = leader_status(c.file)["commits"]
                            ds = f"d{size}-{writers}"
                            times = commit_times(c.file, ds, writers, a.steps, size)
                            after = leader_status(c.file)["commits"]
                            n = max(after["steps"] - before["steps"], 1)
                            phase = {k: (after[k] - before[k]) / n / 1000 for k in ("fragments_us", "seal_us", "commit_us")}
                            row = {"servers": servers, "meta": m, "bytes": size, "writers": writers,
                                   "commit_ms": pct(times, 50) * 1000, "p90_ms": pct(times, 90) * 1000,
                                   "fragments_ms": phase["fragments_us"], "seal_ms": phase["seal_us"], "log_ms": phase["commit_us"]}
                            rows.append(row)
                            print(table([row], list(row)).splitlines()[-1] if len(rows) > 1 else table([row], list(row)), flush=True)
                finally:
                    c.stop()
        fail = [] if a.no_failover else [failover(Path(tmp), 4, 3) for _ in range(3)]
    # The ratio against the unreplicated log (M = 1) of the same servers, writers and size.
    base = {(r["servers"], r["bytes"], r["writers"]): r["commit_ms"] for r in rows if r["meta"] == 1}
    for r in rows:
        b = base.get((r["servers"], r["bytes"], r["writers"]))
        r["vs_m1"] = r["commit_ms"] / b if b else float("nan")
    print()
    print(table(rows, ["servers", "meta", "bytes", "writers", "commit_ms", "p90_ms", "fragments_ms", "seal_ms", "log_ms", "vs_m1"]))
    if fail:
        print(f"\nfailover (leader SIGKILL to the next commit, 4 servers, M = 3): {', '.join(f'{x:.2f}' for x in fail)} s")
    path = save("commit", rows, {"steps": a.steps, "failover_s": fail,
                                 "d2t_reference": "D²T Fig. 3/5: 1.2 s per commit at 4096 writers x 32 servers"})
    print(f"saved {path}")
