"""``cairn cohmm``: the CoHMM proxy app on cairn.tasks (see cairn.apps.cohmm)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._check import int_arg, seconds_arg


def cmd_cohmm(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from .apps.cohmm import Config, Options, run
    from .apps.cohmm.numerics import STIMULI
    from .exceptions import ConfigError

    if args.stimulus not in STIMULI or args.nx < 4 or args.ny < 4 or args.steps < 0 or args.task_size < 1:
        raise ConfigError(f"need --stimulus in {STIMULI}, --nx/--ny ≥ 4, --steps ≥ 0, --task-size ≥ 1")
    cfg = Config(nx=args.nx, ny=args.ny, steps=args.steps, stimulus=args.stimulus, kriging=not args.no_kriging, flux=args.flux,
                 md_steps=args.md_steps, cost=args.cost, jitter=args.jitter, task_size=args.task_size)
    opt = Options(out=Path(args.out), mode=args.mode, store=args.store, store_url=args.store_url, engine=args.engine,
                  workers=args.workers, keep_store=args.keep_store, plot=args.plot, inject_faults=args.inject_faults,
                  max_rounds=args.max_rounds)
    bar = tqdm(total=cfg.steps, unit="step", disable=args.quiet or None, file=sys.stderr, desc="cohmm")

    def on_step(st):
        bar.set_postfix(evals=st.flux_evaluations, memo=st.memo_hits, krig=st.kriging_hits, refresh=False)
        bar.update(1)

    try:
        _, stats = run(cfg, opt, on_step)
    finally:
        bar.close()
    if args.quiet:
        return
    print(f"{'step':>4} {'skipped':>7} {'unique':>7} {'evals':>6} {'memo':>6} {'kriged':>6} {'fallbk':>6} {'recov':>6} "
          f"{'tasks':>5} {'retry':>5} {'wall s':>7}")
    for s in stats.steps:
        print(f"{s.step:>4} {str(s.skipped):>7} {s.unique_states:>7} {s.flux_evaluations:>6} {s.memo_hits:>6} {s.kriging_hits:>6} "
              f"{s.kriging_fallbacks:>6} {s.recovered:>6} {s.tasks:>5} {s.retried_tasks:>5} {s.wall_s:>7.2f}")
    print(f"resumed from step {stats.resumed_from_step}; {stats.flux_evaluations} flux evaluations, {stats.memo_hits} memo hits, "
          f"{stats.kriging_hits} kriged, {stats.recovered} recovered; {stats.wall_s:.1f} s; outputs in {opt.out}/")


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cohmm", help="the CoHMM multiscale proxy app on cairn.tasks (resumes a crashed run from its store)",
                       description="2-D shock wave, Jiang-Tadmor scheme, fluxes from tasks (analytic law or LAMMPS MD, kriging, "
                                   "memo). Rerun with the same --out (and store) to resume.")
    p.add_argument("--nx", type=int, default=128, help="grid cells along x")
    p.add_argument("--ny", type=int, default=128, help="grid cells along y")
    p.add_argument("--steps", type=int, default=20, help="macro steps (each has 4 flux phases)")
    p.add_argument("--stimulus", default="centralized", help="line, centralized or x (default centralized)")
    p.add_argument("--mode", choices=["database", "runtime"], default="database",
                   help="database: tags through the engine, data and state in the store (resumable); runtime: data through the engine")
    p.add_argument("--store", choices=["staging", "redis"], default="staging", help="local store to start in --out (default staging)")
    p.add_argument("--store-url", help="an existing store: redis://HOST:PORT or a Cairn cluster file")
    p.add_argument("--engine", choices=["dask", "process"], default="dask",
                   help="task engine: a Dask LocalCluster or a process pool")
    p.add_argument("--workers", type=int_arg(1), default=2, help="worker processes of the engine")
    p.add_argument("--no-kriging", action="store_true",
                   help="solver only, no kriging surrogate (a resumed run is bit-identical to an uninterrupted one with or without it)")
    p.add_argument("--flux", choices=["analytic", "md"], default="analytic", help="fine scale: analytic law or LAMMPS MD")
    p.add_argument("--md-steps", type=int_arg(1), default=1000, help="MD steps per LAMMPS flux (default 1000)")
    p.add_argument("--cost", type=seconds_arg(0.0), default=0.0, help="extra seconds per flux evaluation (emulated fine-scale cost)")
    p.add_argument("--jitter", type=seconds_arg(0.0, "fraction", "use a finite number >= 0"),
                   default=0.0, help="cost varies by up to this fraction per state (load imbalance)")
    p.add_argument("--task-size", type=int, default=256, help="unique states per task (default 256)")
    p.add_argument("--out", required=True, help="output directory (also holds the local store; reuse it to resume)")
    p.add_argument("--plot", action="store_true", help="also draw the final fields to OUT/fields.png")
    p.add_argument("--keep-store", action="store_true", help="leave the local store running after a completed run")
    p.add_argument("--inject-faults", action="store_true", help="every 4th task skips its work in round 0 (tests the retry rounds)")
    p.add_argument("--max-rounds", type=int_arg(1), default=5, help="retry rounds before giving up on a task (default 5)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no per-step table")
    p.set_defaults(func=cmd_cohmm)
