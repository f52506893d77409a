"""The QMCPack-like skeleton (``cairn skel qmcpack``) on Cairn's file and staging engines and on
ADIOS2 BP5 in the same run, at 1 and 2 MPI ranks, with traces buffered every 1, 10 and 100 steps.

Each configuration is a real ``mpirun -n R python -m cairn skel qmcpack`` (100 DMC steps, 0.05 s
of emulated computation each, graphite 4x4x2 walkers from the damped-spring model, checkpoint
every 10 steps). Printed per run: the share of wall time spent in I/O (all of it, traces,
checkpoints) and the ratio of Cairn's I/O time to BP5's at the same ranks and flush interval. The
paper's goals are traces under 10% and checkpoints under 5% with preventive tactics; the share a
checkpoint would take under a preventive tactic (every 30 min) is printed from its measured cost.
Results: ``bench/results/skel.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .results import save, table

ENGINES = ("file", "staging", "adios2")


def one(tmp: str, ranks: int, engine: str, flush: int, steps: int, compute: float) -> dict[str, Any]:
    out = Path(tmp) / f"{engine}-{ranks}-{flush}"
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("mpirun not found: `make setup` installs Open MPI")
    cmd = [mpirun, "--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "-n", str(ranks),
           sys.executable, "-m", "cairn", "skel", "qmcpack", "--engine", engine, "--trace-flush", str(flush),
           "--steps", str(steps), "--set", f"compute={compute}", "--out", str(out), "--no-plot"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    (path,) = out.glob("*.json")
    return json.loads(path.read_text())


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m cairn.bench skel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--flush", type=int, nargs="+", default=[1, 10, 100])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--compute", type=float, default=0.05, help="seconds of emulated computation per step")
    args = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="cairn-bench-skel-")
    rows: list[dict[str, Any]] = []
    try:
        for ranks in args.ranks:
            for flush in args.flush:
                got = {e: one(tmp, ranks, e, flush, args.steps, args.compute) for e in ENGINES}
                io = {e: sum(x["write_s"] for x in r["per_step"]) for e, r in got.items()}
                for e, r in got.items():
                    ckpts = [x["checkpoint_total_s"] for x in r["per_step"] if x["checkpoint_bytes"]]
                    c = max(ckpts) if ckpts else 0.0
                    rows.append({
                        "engine": e, "ranks": ranks, "flush": flush,
                        "io_pct": r["overhead_pct"], "trace_pct": r["trace_overhead_pct"],
                        "ckpt_pct": r["checkpoint_overhead_pct"],
                        "ckpt_ms": 1e3 * c, "preventive_pct": 100 * c / 1800,
                        "io_ms": 1e3 * io[e], "vs_bp5": io[e] / io["adios2"],
                        "read_ms": 1e3 * r["read_s"], "MB": r["bytes"] / 1e6,
                    })
                    print(f"{e:>8} ranks {ranks} flush {flush:>3}: I/O {r['overhead_pct']:.2f}% (traces "
                          f"{r['trace_overhead_pct']:.2f}%, checkpoints {r['checkpoint_overhead_pct']:.2f}%), "
                          f"{io[e] / io['adios2']:.2f}x BP5's I/O time", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    shown = [{**r, "preventive_pct": f"{r['preventive_pct']:.1e}"} for r in rows]
    print(table(shown, ["engine", "ranks", "flush", "io_pct", "trace_pct", "ckpt_pct", "ckpt_ms", "preventive_pct", "io_ms", "vs_bp5",
                        "read_ms"]))
    params = {"app": "qmcpack (graphite 4x4x2, spring walkers around 130)", "steps": args.steps, "compute_s": args.compute,
              "checkpoint_every": 10, "baseline": "ADIOS2 BP5 (pip adios2, no MPI: one file per rank)",
              "vs_bp5": "I/O time of the run / BP5's at the same ranks and flush interval",
              "preventive_pct": "measured checkpoint cost / 30 min (the paper's preventive tactic)"}
    print(f"saved {save('skel', rows, params)}")
