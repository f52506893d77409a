"""One CoHMM invocation: open (or start) the store, start the engine, resume or start the run,
write ``field_final.npy``, ``field_final.vtk``, ``stats.json`` (and ``fields.png``) to the output
directory. ``cairn cohmm`` parses its flags into :class:`Options` and calls :func:`run`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ... import tasks
from .driver import Config, Simulation, Stats, StepStats
from .output import plot, write_vtk


@dataclass
class Options:
    """Everything about an invocation that is not the problem itself."""

    out: Path
    mode: str = "database"
    store: str = "staging"
    store_url: str | None = None
    engine: str = "dask"
    workers: int = 2
    keep_store: bool = False
    plot: bool = False
    inject_faults: bool = False
    max_rounds: int = 5
    client: Any = field(default=None, repr=False)


def run_name(out: Path) -> str:
    """The run's key prefix in the store: one per output directory."""
    return "cohmm/" + hashlib.sha1(str(out.absolute()).encode()).hexdigest()[:12]


def run(cfg: Config, opt: Options, on_step: Callable[[StepStats], None] | None = None) -> tuple[np.ndarray, Stats]:
    """Runs (or resumes) CoHMM and writes its outputs. ``stats.json`` is rewritten after every
    step ("complete" turns true at the end). A local store started here is stopped at the end
    of a completed run unless ``keep_store``; after a crash it stays up for the rerun."""
    out = Path(opt.out)
    out.mkdir(parents=True, exist_ok=True)
    about = {"config": cfg.__dict__, "mode": opt.mode, "store": opt.store_url or opt.store, "engine": opt.engine,
             "workers": opt.workers}

    def write_stats(stats: Stats, complete: bool) -> None:
        tmp = out / "stats.json.tmp"
        tmp.write_text(json.dumps(stats.as_dict() | about | {"complete": complete}, indent=1))
        tmp.replace(out / "stats.json")

    def step_done(st: StepStats, stats: Stats) -> None:
        write_stats(stats, False)
        if on_step:
            on_step(st)

    store = tasks.open_store(opt.store_url) if opt.store_url else tasks.local(opt.store, out)
    try:
        with tasks.make_executor(opt.engine, opt.workers, opt.client) as ex:
            run = tasks.TaskRun(store, run_name(out), opt.mode, ex, max_rounds=opt.max_rounds, inject_faults=opt.inject_faults)
            w, stats = Simulation(cfg, run).run(step_done)
    finally:
        store.close()
    np.save(out / "field_final.npy", w)
    write_vtk(out / "field_final.vtk", w, f"CoHMM {cfg.nx}x{cfg.ny} {cfg.stimulus} after {cfg.steps} steps")
    write_stats(stats, True)
    if opt.plot:
        plot(out / "fields.png", w, f"CoHMM {cfg.nx}x{cfg.ny}, {cfg.stimulus}, step {cfg.steps}")
    if not opt.store_url and not opt.keep_store:
        tasks.stop_local(opt.store, out)
    return w, stats
