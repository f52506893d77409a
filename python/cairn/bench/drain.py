"""Multi-level checkpoints: what the drain to disk costs the application, and what a restart gains.

``--ranks`` writer ranks (in this process, one after the other) checkpoint a field of ``--mib``
MiB each every step for ``--steps`` steps, computing ``--compute`` seconds between steps (by
sleeping: compute on cores the servers do not share; this machine has 2 cores for everything).
In the same run: (a) the ``file`` engine directly (fsync on, as a checkpoint needs), (b) a staging
cluster without drain, (c) the same with ``drain`` (the steps written to disk in the background),
(d) a restart reading the newest step back, from memory and from disk after the cluster was
SIGKILLed and the drained files dropped from the page cache. Reported: application time per step
((c) against (b)), the drain's throughput against (a)'s write throughput, and the restart's read
time from memory against disk. Saves ``bench/results/drain.json`` and ``drain.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import cairn
from cairn import cluster

from .results import results_dir, save, table


def _field(rank: int, rows: int, step: int) -> np.ndarray:
    return np.linspace(0, 1, rows * 1024).reshape(rows, 1024) + rank + 1000 * step


def _run(opts: dict[str, Any], a: argparse.Namespace, name: str, compute: float) -> dict[str, Any]:
    """The application loop: compute, then every rank checkpoints its part; per-step times."""
    rows = a.mib * (1 << 20) // 8 // 1024
    ws = [cairn.open(name, "w", rank=r, nranks=a.ranks, session=f"bench-{name}", **opts) for r in range(a.ranks)]
    for w in ws:
        w.define("u", "f8", (rows * a.ranks, 1024))
    parts = [[_field(r, rows, s) for r in range(a.ranks)] for s in range(2)]
    steps, ckpt = [], []
    t0 = time.perf_counter()
    for s in range(a.steps):
        t = time.perf_counter()
        time.sleep(compute)
        c = time.perf_counter()
        for r, w in enumerate(ws):
            with w.step(s):
                w.put("u", parts[s % 2][r], offset=(r * rows, 0))
        steps.append(time.perf_counter() - t)
        ckpt.append(time.perf_counter() - c)
    total = time.perf_counter() - t0
    for w in ws:
        w.close()
    nbytes = a.mib * (1 << 20) * a.ranks * a.steps
    return {"app_s": total, "step_s": steps, "ckpt_s": ckpt, "ckpt_MBps": nbytes / 1e6 / sum(ckpt), "bytes": nbytes}


def _drop_cache(root: Path) -> None:
    """Drops the files under ``root`` from the page cache, so reads come from the device."""
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


#: A restarted process: opens the dataset and reads its newest step whole (the time printed, from
#: after ``import cairn``, which both levels pay alike).
RESTART = """
import json, sys, time
import cairn
t = time.perf_counter()
r = cairn.open(sys.argv[1], "r", **json.loads(sys.argv[2]))
a = r.get("u", r.steps()[-1])
print(json.dumps({"s": time.perf_counter() - t, "bytes": a.nbytes}))
"""


def _restart(opts: dict[str, Any], name: str, drop: Path | None = None, runs: int = 5) -> tuple[float, int]:
    """Median time of ``runs`` restarts, each a new process (the page cache of ``drop`` dropped
    before each)."""
    times, nbytes = [], 0
    for _ in range(runs):
        if drop is not None:
            _drop_cache(drop)
        out = subprocess.run([sys.executable, "-c", RESTART, name, json.dumps(opts)], capture_output=True, text=True,
                             check=True, timeout=300)
        rec = json.loads(out.stdout.strip().splitlines()[-1])
        times.append(rec["s"])
        nbytes = rec["bytes"]
    return float(np.median(times)), nbytes


def _device_read(root: Path) -> float:
    """MB/s of a plain read of the drained files with their pages dropped: what the disk gives."""
    _drop_cache(root)
    total, t = 0, time.perf_counter()
    for p in root.rglob("*.bin"):
        with p.open("rb", buffering=0) as f:
            while chunk := f.read(8 << 20):
                total += len(chunk)
    return total / 1e6 / (time.perf_counter() - t)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m cairn.bench drain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="writer ranks (default 2)")
    p.add_argument("--steps", type=int, default=10, help="steps (default 10)")
    p.add_argument("--mib", type=int, default=32, help="MiB each rank checkpoints a step (default 32)")
    p.add_argument("--compute", type=float, default=None,
                   help="seconds of compute between steps (default: 1.5x a step's write time in (a), so the drain keeps up)")
    p.add_argument("--servers", type=int, default=3, help="staging servers (default 3, redundancy 1)")
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="cairn-drain-bench-", dir=os.environ.get("CAIRN_BENCH_DIR")))
    memory = f"{max(256, 3 * a.mib * a.ranks * a.steps // a.servers + 64)}MiB"
    # (a) the file engine, with no compute, for its write throughput; then the compute is chosen.
    fopts = {"engine": "file", "path": str(tmp / "file"), "fsync": True}
    probe = _run(fopts, a, "probe", 0.0)
    per_step = a.mib * (1 << 20) * a.ranks / 1e6 / probe["ckpt_MBps"]
    compute = a.compute if a.compute is not None else 1.5 * per_step
    print(f"(a) file engine: {probe['ckpt_MBps']:.0f} MB/s; a step of {a.mib * a.ranks} MiB takes {per_step * 1e3:.0f} ms; "
          f"compute between steps {compute * 1e3:.0f} ms", flush=True)
    rows: list[dict[str, Any]] = []
    runs: dict[str, dict[str, Any]] = {}
    runs["file"] = _run(fopts, a, "sim", compute)
    for label, drain in (("staging", None), ("staging+drain", tmp / "drain")):
        c = cluster.start(tmp / f"{label}.json", servers=a.servers, memory=memory, redundancy=1, drain=drain)
        try:
            sopts = {"engine": "staging", "cluster": str(c.file), "timeout": 60.0}
            runs[label] = _run(sopts, a, "sim", compute)
            if drain is not None:
                t = time.perf_counter()
                w = cairn.open("sim", "r", **sopts)
                assert w.wait_drained(timeout=600), "the drain did not catch up"
                runs[label]["drain_tail_s"] = time.perf_counter() - t
                runs[label]["drain"] = cluster.drain_status(c.file)
                mem_s, nbytes = _restart(sopts, "sim")
                for proc in c.procs:
                    proc.kill()
                for proc in c.procs:
                    proc.wait(10)
                disk_s, _ = _restart(sopts, "sim", drop=drain)
                runs["restart"] = {"memory_s": mem_s, "disk_s": disk_s, "bytes": nbytes, "device_MBps": _device_read(drain)}
        finally:
            if drain is None or any(pr.poll() is None for pr in c.procs):
                c.stop()
    for label in ("file", "staging", "staging+drain"):
        r = runs[label]
        rows.append({"setup": label, "compute_ms": compute * 1e3, "app_s": r["app_s"], "ckpt_ms_median": float(np.median(r["ckpt_s"])) * 1e3,
                     "ckpt_MBps": r["ckpt_MBps"], "step_s": r["step_s"]})
    drain_mbps = runs["staging+drain"]["drain"]["MBps"]
    summary = {
        "app_ratio_drain_vs_staging": runs["staging+drain"]["app_s"] / runs["staging"]["app_s"],
        "drain_MBps": drain_mbps, "file_write_MBps": probe["ckpt_MBps"], "drain_vs_file": drain_mbps / probe["ckpt_MBps"],
        "restart_memory_s": runs["restart"]["memory_s"], "restart_disk_s": runs["restart"]["disk_s"],
        "restart_disk_vs_memory": runs["restart"]["disk_s"] / runs["restart"]["memory_s"],
        "disk_read_MBps": runs["restart"]["device_MBps"],
        "drain_tail_s": runs["staging+drain"]["drain_tail_s"],
    }
    rows.append({"setup": "summary", **summary})
    print(table(rows[:3], ["setup", "compute_ms", "app_s", "ckpt_ms_median", "ckpt_MBps"]))
    print(f"application time, staging+drain / staging: {summary['app_ratio_drain_vs_staging']:.3f} (target <= 1.05)")
    print(f"drain {drain_mbps:.0f} MB/s vs file engine write {probe['ckpt_MBps']:.0f} MB/s: {summary['drain_vs_file']:.2f} (target >= 0.8)")
    print(f"restart (a new process reading the newest step): memory {summary['restart_memory_s'] * 1e3:.0f} ms, disk (pages "
          f"dropped) {summary['restart_disk_s'] * 1e3:.0f} ms: {summary['restart_disk_vs_memory']:.1f}x (target >= 3; the disk "
          f"here reads at {runs['restart']['device_MBps']:.0f} MB/s)")
    params = {"ranks": a.ranks, "steps": a.steps, "mib": a.mib, "servers": a.servers, "compute_s": compute,
              "note": "compute emulated by sleeping (cores the servers do not share); 2-core machine"}
    print(f"saved {save('drain', rows, params)}")
    png = results_dir() / "drain.png"
    plot(rows[:3], png)
    print(f"saved {png}")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for row in rows:
        ax.plot(range(len(row["step_s"])), [s * 1e3 for s in row["step_s"]], marker="o", ms=3, label=row["setup"])
    ax.set_xlabel("step")
    ax.set_ylabel("ms per step (compute + checkpoint)")
    ax.set_title("Checkpoint cost: file engine, staging, staging draining to disk")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
