"""CoREC's failure and recovery experiment (TOPC 2020, §4.1, Fig. 11) on real staging servers.

For each scheme (``replicate``, ``erasure``, ``corec``) at redundancy 2 and each recovery mode
(``lazy``, ``aggressive``), a writer writes a 3-D domain for 16 steps, then a reader reads them
back step after step (checking every value). One server is SIGKILLed before the read of step 4
and another before step 6 (reads are degraded from then on: copies elsewhere, or decodes);
before step 8 spares take both slots (``cluster.replace``) and recovery rebuilds their objects. Failure
detection is held off (a long ``failure_timeout``) so the failures and the recovery happen at
these steps, as in the paper's figure. Reported: read response time per step, write time per
step (before the failures), and the time recovery took. Saves ``bench/results/recovery.json`` and
``bench/results/recovery.png`` (the Fig. 11 curves).
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import cairn
from cairn import cluster

from .results import results_dir, save, table

SCHEMES = ["replicate", "erasure", "corec"]
MODES = ["lazy", "aggressive"]


def _field(step: int, n: int) -> np.ndarray:
    return np.arange(n ** 3, dtype="f8").reshape(n, n, n) + step


def run(tmp: Path, scheme: str, mode: str, n: int, steps: int) -> dict[str, Any]:
    c = cluster.start(tmp / f"{scheme}-{mode}.json", servers=6, spares=2, memory="1GiB", meta=3, redundancy=2, scheme=scheme,
                      rs_data=3, min_efficiency=0.4, hot_steps=1, failure_timeout="600s", recovery=mode, recovery_deadline="4s")
    try:
        opts = dict(engine="staging", cluster=c.file, object_size=64 << 10, timeout=30.0)
        w = cairn.open("fig11", "w", **opts)
        w.define("u", "f8", (n, n, n))
        r = cairn.open("fig11", "r", **opts)
        victims = [row["id"] for row in cluster.status(c.file) if row["meta"] == "none"][:2]
        spares = cluster.view(c.file)["spares"]
        reads, writes, recovered_at = [], [], None
        for s in range(steps):
            t = time.perf_counter()
            with w.step(s):
                w.put("u", _field(s, n))
            writes.append(time.perf_counter() - t)
        time.sleep(2.0)  # CoREC's background encoding of the cold steps settles
        # The reader then reads step after step while servers fail and spares take over.
        for s in range(steps):
            if s in (4, 6):
                p = c.procs[victims[(s - 4) // 2]]
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=10)
            if s == 8:
                for v, sp in zip(victims, spares):
                    cluster.replace(c.file, v, sp)
                recovered_at = time.monotonic()
            t = time.perf_counter()
            if not np.array_equal(r.get("u", s), _field(s, n)):
                raise AssertionError(f"{scheme}/{mode}: step {s} read back wrong")
            reads.append(time.perf_counter() - t)
        recovery_s = None
        while recovered_at is not None and time.monotonic() - recovered_at < 120:
            rows = cluster.status(c.file, timeout=1.0)
            if sum(row.get("recovery_pending") or 0 for row in rows) == 0:
                recovery_s = time.monotonic() - recovered_at
                break
            time.sleep(0.1)
        return {"scheme": scheme, "recovery": mode, "read_ms": [1000 * x for x in reads], "write_ms": [1000 * x for x in writes],
                "recovery_s": recovery_s}
    finally:
        c.stop()


#: CoREC's overheads at MTBF 18 s (TOPC 2020, Fig. 14-16): degraded-only vs lazy recovery.
PAPER_18S = {"read_%": {"degraded": 9.58, "lazy": 6.77}, "total_%": {"degraded": 5.69, "lazy": 4.25}}


def sweep_one(tmp: Path, mode: str, mtbf: str, a: argparse.Namespace) -> dict[str, Any]:
    """One ``cairn chaos`` run of the built-in workload: ``baseline`` (no kill), ``degraded``
    (killed servers stay dead, no spare: reads are degraded from then on) or ``lazy`` (killed
    servers restart as spares; spares take the slots and lazy recovery rebuilds)."""
    from .. import chaos

    spares = 0 if mode == "degraded" else 2
    c = cluster.start(tmp / f"mtbf-{mode}-{mtbf}.json", servers=6, spares=spares, memory="1GiB", meta=3, redundancy=2,
                      rs_data=3, min_efficiency=0.4, failure_timeout="1s", mtbf=mtbf if mode != "baseline" else None)
    try:
        argv = ["--cluster", str(c.file), "--mtbf", mtbf if mode != "baseline" else "1000000s", "--duration", "600s", "--workload",
                "--writers", "4", "--readers", "2", "--steps", str(a.sweep_steps), "--n", str(a.sweep_n),
                "--interval", a.sweep_interval, "--seed", "3", "--timeout", "30"]
        rep = chaos.run(chaos.options(argv + (["--no-restart"] if mode == "degraded" else [])))
        wl = rep["workload"]
        return {"mode": mode, "mtbf_s": None if mode == "baseline" else chaos.seconds(mtbf), "kills": rep["kills"],
                "skipped": rep["skipped"], "lost_objects": rep["lost_objects"], "wrong_reads": wl["wrong_reads"],
                "degraded_reads": wl["degraded_reads"], "run_s": wl["run_s"], "read_ms": wl["read_ms"]["all"],
                "write_ms": wl["write_ms"]["all"], "read_p50_ms": wl["read_ms"]["p50"], "read_p99_ms": wl["read_ms"]["p99"],
                "write_p50_ms": wl["write_ms"]["p50"], "recovery_s": [x for x in rep["recovery_s"] if x is not None],
                "errors": wl["errors"][:3]}
    finally:
        c.stop()


#: The sweep's MTBFs; a sweep of others is saved beside it (``recovery_mtbf_18s``), not over it.
SWEEP_MTBFS = "150s,60s,30s,18s"

#: What a sweep row averages over its repeats (the rest are summed or listed).
MEANS = ("run_s", "read_ms", "write_ms", "read_p50_ms", "read_p99_ms", "write_p50_ms")


def _mean_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for the repeats of a point: means of the times, sums of kills and losses."""
    row: dict[str, Any] = {"mode": runs[0]["mode"], "mtbf_s": runs[0]["mtbf_s"], "repeats": len(runs)}
    for k in MEANS:
        xs = [r[k] for r in runs if r[k] is not None]
        row[k] = round(float(np.mean(xs)), 3) if xs else None
    for k in ("kills", "skipped", "lost_objects", "wrong_reads", "degraded_reads"):
        row[k] = sum(r[k] for r in runs)
    row["recovery_s"] = [x for r in runs for x in r["recovery_s"]]
    row["errors"] = [e for r in runs for e in r["errors"]][:3]
    row["runs"] = runs
    return row


def sweep(tmp: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    """CoREC Fig. 14-16 at this machine's scale: overheads against a fault-free run. Each point
    runs ``--repeat`` times, interleaved with fault-free runs (this VM's response times move by
    ~10% from run to run), and the means over the repeats are compared."""
    modes = a.sweep_modes.split(",")
    points = [(mtbf, mode) for mtbf in a.mtbf.split(",") for mode in modes]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {("0s", "baseline"): [], **{p: [] for p in points}}
    for rep in range(a.repeat):
        for mtbf, mode in [("0s", "baseline"), *points]:
            row = sweep_one(tmp, mode, mtbf, a)
            runs[(mtbf, mode)].append(row)
            print(f"  [{rep + 1}/{a.repeat}] MTBF {mtbf:>5} {mode:>8}: run {row['run_s']:.1f} s, read {row['read_ms']} ms "
                  f"(p50 {row['read_p50_ms']}), write {row['write_ms']} ms, kills {row['kills']} (not made {row['skipped']}), "
                  f"lost {row['lost_objects']}", flush=True)
    base = _mean_of(runs[("0s", "baseline")])
    rows = [base]
    for p in points:
        row = _mean_of(runs[p])
        pct = lambda k: round(100 * (row[k] / base[k] - 1), 2) if row[k] and base[k] else None  # noqa: E731
        row.update({"run_%": pct("run_s"), "read_%": pct("read_ms"), "write_%": pct("write_ms"),
                    "read_p50_%": pct("read_p50_ms"), "write_p50_%": pct("write_p50_ms")})
        rows.append(row)
        print(f"  MTBF {p[0]:>5} {p[1]:>8}: kills {row['kills']} (not made {row['skipped']}), lost {row['lost_objects']}, "
              f"run {row['run_%']}%, read {row['read_%']}% (p50 {row['read_p50_%']}%), write {row['write_%']}% "
              f"(p50 {row['write_p50_%']}%)", flush=True)
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for row in rows:
        ax.plot(range(len(row["read_ms"])), row["read_ms"], marker="o", ms=3, label=f"{row['scheme']}, {row['recovery']}")
    for x, what in ((4, "kill 1"), (6, "kill 2"), (8, "spares in")):
        ax.axvline(x, color="grey", lw=0.8, ls="--")
        ax.text(x + 0.1, ax.get_ylim()[1] * 0.95, what, fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("read ms")
    ax.set_title("Read response under failures and recovery (CoREC Fig. 11)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m cairn.bench recovery", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=48, help="domain edge: n³ doubles per step (default 48: 0.9 MB)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--parts", default="fig11,mtbf", help="fig11 (failures at steps 4 and 6), mtbf (the chaos sweep)")
    ap.add_argument("--mtbf", default=SWEEP_MTBFS, help=f"MTBFs of the sweep (default {SWEEP_MTBFS})")
    ap.add_argument("--sweep-steps", type=int, default=300, help="steps of the sweep's workload (default 300)")
    ap.add_argument("--sweep-n", type=int, default=128, help="the sweep's field edge (default 128)")
    ap.add_argument("--sweep-interval", default="0.25s", help="the sweep workload's compute time per step")
    ap.add_argument("--sweep-modes", default="degraded,lazy", help="modes of the sweep (default degraded,lazy)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each sweep point, and of the fault-free one, averaged (default 1)")
    a = ap.parse_args(argv)
    parts = a.parts.split(",")
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    swept: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for scheme in a.schemes.split(",") if "fig11" in parts else []:
            for mode in a.modes.split(","):
                row = run(Path(tmp), scheme, mode, a.n, a.steps)
                rows.append(row)
                took = "-" if row["recovery_s"] is None else f"{row['recovery_s']:.2f} s"
                print(f"{scheme:>9} {mode:>10}: read ms/step " + " ".join(f"{x:.1f}" for x in row["read_ms"]) + f"; recovery {took}",
                      flush=True)
        if "mtbf" in parts:
            print("MTBF sweep (CoREC Fig. 14-16):", flush=True)
            swept = sweep(Path(tmp), a)
    for row in rows:
        rd = row["read_ms"]
        summary.append({"scheme": row["scheme"], "recovery": row["recovery"], "read_ms_0_3": float(np.mean(rd[:4])),
                        "read_ms_degraded_5_8": float(np.mean(rd[5:9])), "read_ms_after_9": float(np.mean(rd[9:])),
                        "write_ms": float(np.mean(row["write_ms"])), "recovery_s": row["recovery_s"]})
    if summary:
        print()
        print(table(summary, ["scheme", "recovery", "read_ms_0_3", "read_ms_degraded_5_8", "read_ms_after_9", "write_ms", "recovery_s"]))
        png = results_dir() / "recovery.png"
        plot(rows, png)
        print(f"saved {png}")
    if swept:
        print()
        print(table(swept[1:], ["mtbf_s", "mode", "repeats", "kills", "skipped", "lost_objects", "run_%", "read_%", "read_p50_%",
                                "write_%", "write_p50_%"]))
        print(f"CoREC at MTBF 18 s: read +{PAPER_18S['read_%']['degraded']}% degraded / +{PAPER_18S['read_%']['lazy']}% lazy; "
              f"total +{PAPER_18S['total_%']['degraded']}% / +{PAPER_18S['total_%']['lazy']}%")
    name = "recovery" if "fig11" in parts else "recovery_mtbf" + ("" if a.mtbf == SWEEP_MTBFS else "_" + a.mtbf.replace(",", "_"))
    path = save(name, rows + [{"summary": s} for s in summary] + [{"mtbf_sweep": r} for r in swept],
                {"n": a.n, "steps": a.steps, "servers": 6, "spares": 2, "redundancy": 2, "mtbf": a.mtbf,
                 "sweep_steps": a.sweep_steps, "sweep_n": a.sweep_n, "repeat": a.repeat, "sweep_interval": a.sweep_interval, "paper_18s": PAPER_18S})
    print(f"\nsaved {path}")
