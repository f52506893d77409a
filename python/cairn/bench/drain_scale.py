"""Drain scaling: the drain's throughput with 1, 2 and 4 staging servers, each server's drain
writes held to ``--link`` MB/s (``CAIRN_DRAIN_BPS``, a test-only cap standing in for one
node's link to a parallel file system, well below what this machine's cores and disk move), so
the measurement shows whether every server drains what it holds (throughput grows with the
servers) or one node does it all (it stays flat).

``--ranks`` writers put ``--mib`` MiB each per step for ``--steps`` steps as fast as they can;
the drain's throughput is the bytes drained over the time from the first commit to the last
step on disk. Targets: 2 servers >= 1.8x one server, 4 servers >= 3.2x. Saves
``bench/results/drain_scale.json`` and ``drain_scale.png``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import cairn
from cairn import cluster

from .results import results_dir, save, table

TARGETS = {2: 1.8, 4: 3.2}


def _run(servers: int, a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    rows = a.mib * (1 << 20) // 8 // 1024
    drain = tmp / f"drain-{servers}"
    os.environ["CAIRN_DRAIN_BPS"] = str(a.link * 1e6)
    try:
        c = cluster.start(tmp / f"c{servers}.json", servers=servers, memory=f"{a.mib * a.ranks * a.steps * 2 // servers + 128}MiB",
                          redundancy=0, drain=drain)
    finally:
        del os.environ["CAIRN_DRAIN_BPS"]
    try:
        opts = {"engine": "staging", "cluster": str(c.file), "timeout": 120.0}
        ws = [cairn.open("scale", "w", rank=r, nranks=a.ranks, session="scale", **opts) for r in range(a.ranks)]
        for w in ws:
            w.define("u", "f8", (rows * a.ranks, 1024))
        part = np.linspace(0, 1, rows * 1024).reshape(rows, 1024)
        t0 = None
        for s in range(a.steps):
            for r, w in enumerate(ws):
                with w.step(s):
                    w.put("u", part + r + 1000 * s, offset=(r * rows, 0))
            t0 = t0 or time.perf_counter()
        assert ws[0].wait_drained(step=a.steps - 1, timeout=600), "the drain did not finish"
        took = time.perf_counter() - (t0 or 0.0)
        for w in ws:
            w.close()
        nbytes = a.mib * (1 << 20) * a.ranks * a.steps  # the clock starts as the first step commits (and its drain)
        files = len(list((drain / "scale" / "data").glob(f"drain-{a.steps - 1:012}.*")))
        return {"servers": servers, "drain_s": took, "drain_MBps": nbytes / 1e6 / took, "files_per_step": files}
    finally:
        c.stop()
        shutil.rmtree(drain, ignore_errors=True)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m cairn.bench drain-scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=8, help="writer ranks (default 8)")
    p.add_argument("--steps", type=int, default=5, help="steps (default 5)")
    p.add_argument("--mib", type=int, default=8, help="MiB each rank puts a step (default 8)")
    p.add_argument("--link", type=float, default=40.0, help="each server's drain write cap, MB/s (default 40)")
    p.add_argument("--servers", default="1,2,4", help="server counts (default 1,2,4)")
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="cairn-drain-scale-", dir=os.environ.get("CAIRN_BENCH_DIR")))
    rows = []
    try:
        for n in (int(x) for x in a.servers.split(",")):
            rows.append(_run(n, a, tmp))
            print(f"{n} servers: {rows[-1]['drain_MBps']:.0f} MB/s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = rows[0]["drain_MBps"]
    for r in rows:
        r["vs_1_server"] = r["drain_MBps"] / base
        r["target"] = TARGETS.get(r["servers"])
    print(table(rows, ["servers", "drain_s", "drain_MBps", "vs_1_server", "target", "files_per_step"]))
    params = {"ranks": a.ranks, "steps": a.steps, "mib": a.mib, "link_MBps": a.link,
              "note": "each server's drain writes capped by CAIRN_DRAIN_BPS; redundancy 0; 2-core machine"}
    print(f"saved {save('drain_scale', rows, params)}")
    png = results_dir() / "drain_scale.png"
    plot(rows, a.link, png)
    print(f"saved {png}")


def plot(rows: list[dict[str, Any]], link: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    n = [r["servers"] for r in rows]
    ax.plot(n, [r["drain_MBps"] for r in rows], marker="o", label="measured")
    ax.plot(n, [rows[0]["drain_MBps"] * k for k in n], ls="--", color="grey", label="linear")
    ax.set_xlabel("staging servers")
    ax.set_ylabel("drain throughput, MB/s")
    ax.set_title(f"Every server drains what it holds ({link:.0f} MB/s per server link)")
    ax.set_xticks(n)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
