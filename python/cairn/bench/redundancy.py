"""CoREC's synthetic workloads (TOPC 2020, §4.0.1, Fig. 9/10) on real staging servers.

For each scheme (``none``: one copy; ``replicate``; ``erasure``: every object coded on the write
path; ``hybrid``: replicated, least recently used coded when storage efficiency would fall below
the bound, the paper's LRU baseline; ``corec``: replicated, cold objects coded in the background
under the same bound) and level r = 1, 2, a writer runs five workloads on a 3-D domain:

1. ``whole``: the whole domain every step;
2. ``quarters``: a quarter each step, the domain every 4 steps;
3. ``hot``: the whole domain once, then one eighth (the hot spot) every step;
4. ``random``: a random eighth every step;
5. ``read``: the whole domain for 4 steps, then a whole-domain read of each step, repeated.

Each runs twice: with writes back to back (``--compute 0``, the worst case for background
encoding, which then competes with the writer for the same cores) and with the writer computing
between steps (``--compute 20``: 20 ms of one core busy, as a simulation does between outputs;
CoREC's background encoding runs while it computes, as on the paper's separate staging cores).

Reported per run: write response time (put + end of step, mean per step), read response time
(workload 5), storage efficiency (data bytes ÷ bytes stored, once encoding settles) and the
paper's *write efficiency* = write time ÷ storage efficiency (lower is better). Also the encode
throughput of Cairn's path against the bare ``reed-solomon-erasure`` call on the same bytes.

Prints a table beside the paper's percentages and saves ``bench/results/redundancy.json``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import cairn
from cairn import _native, cluster

from .results import save, table

SCHEMES = ["none", "replicate", "erasure", "hybrid", "corec"]
WORKLOADS = ["whole", "quarters", "hot", "random", "read"]
# CoREC's write-time overhead over replication in the paper (Fig. 9, cases 1-3).
PAPER_OVERHEAD = {"whole": 6.9, "quarters": 4.3, "hot": 8.8}


def boxes(workload: str, step: int, n: int, rng: np.random.Generator) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(offset, count) boxes the writer puts at ``step`` of a workload on an n³ domain."""
    h = n // 2
    whole = [((0, 0, 0), (n, n, n))]
    if workload in ("whole", "read") or (workload == "hot" and step == 0):
        return whole
    if workload == "quarters":
        q = n // 4
        return [((q * (step % 4), 0, 0), (q, n, n))]
    if workload == "hot":
        return [((0, 0, 0), (h, h, h))]
    o = tuple(int(x) * h for x in rng.integers(0, 2, 3))
    return [(o, (h, h, h))]


def settle(file: Path, timeout: float = 60.0) -> dict[str, Any]:
    """Cluster status once the background encoding has stopped changing what servers hold."""
    last, deadline = None, time.monotonic() + timeout
    while True:
        rows = cluster.status(file, timeout=5.0)
        now = [(r["memory_used"], r["shards"], r["replicas"]) for r in rows]
        if now == last or time.monotonic() > deadline:
            data = sum(r["data_bytes"] or 0 for r in rows)
            used = sum(r["memory_used"] or 0 for r in rows)
            return {"efficiency": data / used if used else 1.0, "shards": sum(r["shards"] or 0 for r in rows)}
        last = now
        time.sleep(0.3)


def compute(ms: float, a: np.ndarray) -> None:
    """A simulation's compute phase between steps: one core busy for ``ms`` (a stencil sweep)."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        a[1:-1] = 0.5 * a[1:-1] + 0.25 * (a[:-2] + a[2:])


def run(file: Path, workload: str, level: int, n: int, steps: int, seed: int, compute_ms: float = 0.0) -> dict[str, Any]:
    opts = dict(engine="staging", cluster=file, object_size=256 << 10, timeout=30.0)
    rng = np.random.default_rng(seed)
    field = np.random.default_rng(seed).random((n, n, n))
    w = cairn.open(workload, "w", **opts)
    w.define("u", "f8", (n, n, n), redundancy=level)
    writes, scratch = [], np.random.default_rng(seed).random(1 << 16)
    for s in range(4 if workload == "read" else steps):
        compute(compute_ms, scratch)
        t = time.perf_counter()
        with w.step(s):
            for o, c in boxes(workload, s, n, rng):
                w.put("u", field[o[0]:o[0] + c[0], o[1]:o[1] + c[1], o[2]:o[2] + c[2]], offset=o)
        writes.append(time.perf_counter() - t)
    w.close()
    st = settle(file)
    reads = []
    r = cairn.open(workload, "r", **opts)
    if workload == "read":
        for _ in range(max(steps // 4, 1)):
            for s in range(4):
                t = time.perf_counter()
                r.get("u", s)
                reads.append(time.perf_counter() - t)
    for s in r.steps():
        r.release(s)
    write_ms = float(np.mean(writes)) * 1000
    return {"write_ms": write_ms, "read_ms": float(np.mean(reads)) * 1000 if reads else float("nan"),
            "storage_eff": st["efficiency"], "write_eff": write_ms / st["efficiency"], "shards": st["shards"]}


def encode_rows(repeat: int) -> list[dict[str, Any]]:
    rows = []
    for k, m in ((4, 1), (4, 2), (3, 2)):
        for size in (1 << 20, 16 << 20):
            ours, bare = _native.erasure_times(k, m, size, repeat)
            rows.append({"k": k, "m": m, "MiB": size / 2**20, "cairn_MBps": size / ours / 1e6, "bare_MBps": size / bare / 1e6,
                         "ratio": bare / ours})
    return rows


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m cairn.bench redundancy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=6, help="staging servers (default 6)")
    ap.add_argument("--n", type=int, default=64, help="domain edge: n³ doubles (default 64: 2 MiB)")
    ap.add_argument("--steps", type=int, default=24, help="steps per workload (default 24)")
    ap.add_argument("--levels", default="1,2", help="redundancy levels (default 1,2)")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--compute", default="0,20", help="ms the writer computes between steps, one run each (default 0,20)")
    ap.add_argument("--min-efficiency", type=float, default=0.6)
    ap.add_argument("--repeat", type=int, default=15, help="encode timings, best of (default 15)")
    ap.add_argument("--encode-only", action="store_true", help="only the encode throughput table (saved as redundancy_encode.json)")
    a = ap.parse_args(argv)
    if a.encode_only:
        enc = encode_rows(a.repeat)
        print(table(enc, ["k", "m", "MiB", "cairn_MBps", "bare_MBps", "ratio"]))
        print(f"saved {save('redundancy_encode', enc, vars(a))}")
        return
    rows: list[dict[str, Any]] = []
    computes = [float(x) for x in a.compute.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for level, ms in [(int(x), ms) for x in a.levels.split(",") for ms in computes]:
            for scheme in a.schemes.split(","):
                lvl = 0 if scheme == "none" else level
                c = cluster.start(Path(tmp) / f"{scheme}{level}-{ms:g}.json", servers=a.servers, memory="2GiB", redundancy=lvl,
                                  scheme=scheme, rs_data=4, min_efficiency=a.min_efficiency if scheme != "none" else 0.6)
                try:
                    for i, wl in enumerate(a.workloads.split(",")):
                        row = {"workload": wl, "scheme": scheme, "r": level, "compute_ms": ms,
                               **run(c.file, wl, lvl, a.n, a.steps, seed=i, compute_ms=ms)}
                        rows.append(row)
                        print(table([row], ["workload", "scheme", "r", "compute_ms", "write_ms", "read_ms", "storage_eff", "write_eff"]).splitlines()[-1],
                              flush=True)
                finally:
                    c.stop()
    print()
    print(table(rows, ["workload", "scheme", "r", "compute_ms", "write_ms", "read_ms", "storage_eff", "write_eff", "shards"]))
    # CoREC against replication, beside the paper's percentages.
    summary = []
    for level, ms in sorted({(r["r"], r["compute_ms"]) for r in rows}):
        for wl in a.workloads.split(","):
            by = {r["scheme"]: r for r in rows if r["workload"] == wl and r["r"] == level and r["compute_ms"] == ms}
            if "corec" in by and "replicate" in by:
                fault_tolerant = [s for s in by if s != "none"]
                best = min(fault_tolerant, key=lambda s: by[s]["write_eff"])
                summary.append({"workload": wl, "r": level, "compute_ms": ms,
                                "corec_over_replicate_%": 100 * (by["corec"]["write_ms"] / by["replicate"]["write_ms"] - 1),
                                "paper_%": PAPER_OVERHEAD.get(wl, float("nan")), "corec_storage_eff": by["corec"]["storage_eff"],
                                "best_write_eff": best})
    if summary:
        print()
        print(table(summary, ["workload", "r", "compute_ms", "corec_over_replicate_%", "paper_%", "corec_storage_eff", "best_write_eff"]))
    enc = encode_rows(a.repeat)
    print()
    print(table(enc, ["k", "m", "MiB", "cairn_MBps", "bare_MBps", "ratio"]))
    path = save("redundancy", rows + [{"summary": s} for s in summary] + [{"encode": e} for e in enc],
                {"servers": a.servers, "n": a.n, "steps": a.steps, "compute_ms": computes, "min_efficiency": a.min_efficiency})
    print(f"\nsaved {path}")
