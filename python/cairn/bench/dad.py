"""Database-assisted distribution (DaD) against runtime-only data movement, on the paper's CoHMM
problem: a centralized shock on a 128×128 grid, 20 macro steps, kriging on.

Two fine scales: the cheap analytic law (the run is then all runtime and store overhead, as in
the paper's Fig. 5), and a costly one: the analytic law plus an emulated fine-scale cost per
evaluation (sleep, with jitter for load imbalance; the paper's CoMD took 8 s a call, far more
than this machine's budget for tens of thousands of calls). ``--md`` adds a small problem on the
real LAMMPS flux. Each configuration runs in ``runtime`` and ``database`` mode, on 1 and 2
workers and on both stores (a local Cairn staging cluster and a real redis-server); modes
alternate within each repeat and the best wall time of the repeats counts. The overhead is
database ÷ runtime − 1 (paper: 8.82% CnC, 10.85% Charm++; target ≤ 3%).

Then crashes: the same costly run is SIGKILLed (driver and workers) in the middle of step
``steps/2``, restarted, and its final field compared with the uninterrupted run's. Printed:
evaluations the killed attempt made, those the restart made, and how many were recomputed
(both attempts together minus the uninterrupted run's). Results: ``bench/results/dad.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import tasks
from ..apps.cohmm import Config, Options, run
from ..apps.cohmm.crash import command, kill_mid_step
from .results import save, table


def one(tmp: Path, tag: str, cfg: Config, mode: str, url: str, engine: str, workers: int) -> dict[str, Any]:
    """One uninterrupted run (engine start-up excluded from its wall time)."""
    out = tmp / tag
    w, stats = run(cfg, Options(out=out, mode=mode, store_url=url, engine=engine, workers=workers))
    return {"wall_s": stats.wall_s, "evals": stats.flux_evaluations, "memo": stats.memo_hits, "kriged": stats.kriging_hits, "w": w}


def overhead(tmp: Path, fluxes: dict[str, Config], urls: dict[str, str], engine: str, workers: list[int], repeat: int,
             ) -> tuple[list[dict[str, Any]], dict[tuple, dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    refs: dict[tuple, dict[str, Any]] = {}
    for flux, cfg in fluxes.items():
        for store, url in urls.items():
            for nw in workers:
                best: dict[str, dict[str, Any]] = {}
                for r in range(repeat):
                    order = tasks.MODES if r % 2 == 0 else tasks.MODES[::-1]
                    for mode in order:
                        got = one(tmp, f"{flux}-{store}-{nw}-{mode}-{r}", cfg, mode, url, engine, nw)
                        if mode not in best or got["wall_s"] < best[mode]["wall_s"]:
                            best[mode] = got
                db, rt = best["database"], best["runtime"]
                same = bool(np.array_equal(db["w"], rt["w"]))
                refs[(flux, store, nw)] = db
                row = {"flux": flux, "store": store, "workers": nw, "runtime_s": rt["wall_s"], "database_s": db["wall_s"],
                       "overhead_pct": 100 * (db["wall_s"] / rt["wall_s"] - 1), "evals": db["evals"], "memo_hits": db["memo"],
                       "kriged": db["kriged"], "same_field": same}
                rows.append(row)
                print(f"{flux:>7} {store:>7} {nw} workers: runtime {rt['wall_s']:.2f} s, database {db['wall_s']:.2f} s, "
                      f"overhead {row['overhead_pct']:+.2f}%  ({db['evals']} evaluations, same field: {same})", flush=True)
    return rows, refs


def crash(tmp: Path, cfg: Config, cli: list[str], urls: dict[str, str], engine: str, nw: int,
          refs: dict[tuple, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for store, url in urls.items():
        for mode in tasks.MODES:
            ref = refs.get(("costly", store, nw))
            if ref is None:
                continue
            out = tmp / f"crash-{store}-{mode}"
            args = [*cli, "--mode", mode, "--store-url", url, "--engine", engine, "--workers", str(nw), "-q"]
            t0 = time.perf_counter()
            killed = kill_mid_step(out, args, after_steps=cfg.steps // 2, after_tasks=2)
            p = subprocess.run(command(out, *args), capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"the restart failed:\n{p.stderr[-2000:]}")
            doc = json.loads((out / "stats.json").read_text())
            same = bool(np.array_equal(np.load(out / "field_final.npy"), ref["w"]))
            resumed = doc["flux_evaluations"]
            row = {"store": store, "mode": mode, "workers": nw, "killed_in_step": cfg.steps // 2,
                   "resumed_from_step": doc["resumed_from_step"], "uninterrupted_evals": ref["evals"],
                   "killed_attempt_evals": killed, "restart_evals": resumed, "recovered": doc["recovered"],
                   "recomputed": killed + resumed - ref["evals"], "same_field": same, "wall_s": time.perf_counter() - t0}
            rows.append(row)
            print(f"crash {store:>7} {mode:>8}: killed in step {row['killed_in_step']} after {killed} evaluations; restart from "
                  f"step {row['resumed_from_step']} made {resumed} ({doc['recovered']} results re-read); recomputed "
                  f"{row['recomputed']} of {ref['evals']}; same field as uninterrupted: {same}", flush=True)
    return rows


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m cairn.bench dad", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nx", type=int, default=128)
    p.add_argument("--ny", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--stores", nargs="+", choices=["staging", "redis"], default=["staging", "redis"])
    p.add_argument("--engine", choices=["dask", "process"], default="dask")
    p.add_argument("--cost", type=float, default=0.001, help="emulated seconds per costly evaluation (default 0.001)")
    p.add_argument("--jitter", type=float, default=0.5, help="costly evaluations take up to this much longer (default 0.5)")
    p.add_argument("--repeat", type=int, default=2, help="runs per mode and configuration; the best counts")
    p.add_argument("--no-crash", action="store_true", help="skip the SIGKILL experiment")
    p.add_argument("--md", action="store_true", help="also a 16x16, 2-step problem on the LAMMPS flux (100 MD steps per call)")
    args = p.parse_args(argv)
    base = dict(nx=args.nx, ny=args.ny, steps=args.steps, stimulus="centralized", kriging=True)
    fluxes = {"cheap": Config(**base), "costly": Config(**base, cost=args.cost, jitter=args.jitter)}
    if args.md:
        fluxes["md"] = Config(nx=16, ny=16, steps=2, stimulus="centralized", kriging=True, flux="md", md_steps=100)
    tmp = Path(tempfile.mkdtemp(prefix="cairn-bench-dad-"))
    stores = {s: tasks.local(s, tmp / f"store-{s}", memory="8GiB") for s in args.stores}
    try:
        urls = {s: st.url for s, st in stores.items()}
        rows, refs = overhead(tmp, fluxes, urls, args.engine, args.workers, args.repeat)
        cli = ["--nx", str(args.nx), "--ny", str(args.ny), "--steps", str(args.steps), "--cost", str(args.cost), "--jitter",
               str(args.jitter)]
        crashes = [] if args.no_crash else crash(tmp, fluxes["costly"], cli, urls, args.engine, max(args.workers), refs)
    finally:
        for s, st in stores.items():
            st.close()
            tasks.stop_local(s, tmp / f"store-{s}")
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(table(rows, ["flux", "store", "workers", "runtime_s", "database_s", "overhead_pct", "evals", "memo_hits", "kriged",
                       "same_field"]))
    if crashes:
        print()
        print(table(crashes, ["store", "mode", "killed_in_step", "resumed_from_step", "uninterrupted_evals", "killed_attempt_evals",
                              "restart_evals", "recovered", "recomputed", "same_field"]))
    costly = [r["overhead_pct"] for r in rows if r["flux"] == "costly"]
    cheap = [r["overhead_pct"] for r in rows if r["flux"] == "cheap"]
    print(f"\nmean overhead of database over runtime mode: costly flux {np.mean(costly):+.2f}%, cheap flux {np.mean(cheap):+.2f}% "
          "(paper, with CoMD: CnC 8.82%, Charm++ 10.85%; target ≤ 3%)")
    params = {"problem": f"{args.nx}x{args.ny} centralized shock, {args.steps} steps, kriging on", "engine": args.engine,
              "costly": f"analytic law + {args.cost} s x (1 + {args.jitter} u) per evaluation", "repeat": args.repeat,
              "overhead_pct": "best database wall / best runtime wall - 1 (engine start-up excluded)",
              "recomputed": "killed attempt's + restart's evaluations - the uninterrupted run's"}
    print(f"saved {save('dad', rows + [{'crash': True, **c} for c in crashes], params)}")
