"""The CoHMM driver: per macro step, 4 flux phases whose fluxes come from tasks, planned from the
memo exactly as the original's prepTasks, and run through a :class:`cairn.tasks.TaskRun` in
either mode.

Per unique cell state w of a phase (epoch e = 4·step + phase), in order:
1. the nearest sample of w's 4-digit solver bucket, if within L1 distance 1e-4: reuse it;
2. with kriging, where the gradient is small, an exact sample of the 8-digit kriging bucket: reuse;
3. a value this same epoch already produced in an earlier, crashed attempt: recover it;
4. with kriging and ≥ 2 samples in the solver bucket: a kriging task (≤ 10 nearest samples);
5. else a solver task.
Plans use only samples added before epoch e, so a resumed run plans exactly as an uninterrupted
one did, and its fields come out bit-identical.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from ...tasks import Memo, TaskRun
from ...tasks.memo import unique_rows
from . import kriging, numerics
from .flux import flux_task

PHASES = 4
MEMO_DISTANCE = 1e-4
SOLVER_DIGITS = 4
KRIGING_DIGITS = 8


@dataclass
class Config:
    """The problem and its cost model (what a resumed run must share with the first attempt)."""

    nx: int = 128
    ny: int = 128
    steps: int = 20
    stimulus: str = "centralized"
    kriging: bool = True
    flux: str = "analytic"
    md_steps: int = 1000
    cost: float = 0.0
    jitter: float = 0.0
    task_size: int = 256

    def params(self) -> dict[str, Any]:
        """What must match on resume (the cost model may differ)."""
        d = asdict(self)
        for k in ("cost", "jitter", "task_size"):
            d.pop(k)
        return d


@dataclass
class StepStats:
    """What one step did (summed over its 4 phases)."""

    step: int
    skipped: bool = False
    flux_evaluations: int = 0
    memo_hits: int = 0
    kriging_hits: int = 0
    kriging_fallbacks: int = 0
    recovered: int = 0
    unique_states: int = 0
    tasks: int = 0
    retried_tasks: int = 0
    wall_s: float = 0.0


@dataclass
class Stats:
    """What this invocation did."""

    resumed_from_step: int = 0
    flux_evaluations: int = 0
    memo_hits: int = 0
    kriging_hits: int = 0
    recovered: int = 0
    wall_s: float = 0.0
    steps: list[StepStats] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Simulation:
    """CoHMM on a task run: ``run()`` steps the field from the last committed step to the end."""

    def __init__(self, cfg: Config, tasks: TaskRun):
        self.cfg, self.tasks = cfg, tasks
        self.solver_memo = Memo(tasks.store, f"{tasks.run}/memo/solver", SOLVER_DIGITS, numerics.NFIELDS)
        self.kriging_memo = Memo(tasks.store, f"{tasks.run}/memo/kriging", KRIGING_DIGITS, numerics.NFIELDS)

    def run(self, on_step: Callable[[StepStats, Stats], None] | None = None) -> tuple[np.ndarray, Stats]:
        cfg, t0 = self.cfg, time.perf_counter()
        self.tasks.check_params(cfg.params())
        start = self.tasks.resume_point(cfg.steps)
        stats = Stats(resumed_from_step=start)
        w = self.tasks.load(start - 1)["w"] if start > 0 else numerics.initial(cfg.nx, cfg.ny, cfg.stimulus)
        for t in range(cfg.steps):
            st = StepStats(step=t, skipped=t < start)
            if not st.skipped:
                ts = time.perf_counter()
                w = self.step(w, t, st)
                self.tasks.commit(t, {"w": w})
                st.wall_s = time.perf_counter() - ts
                for k in ("flux_evaluations", "memo_hits", "kriging_hits", "recovered"):
                    setattr(stats, k, getattr(stats, k) + getattr(st, k))
            stats.steps.append(st)
            stats.wall_s = time.perf_counter() - t0
            if on_step:
                on_step(st, stats)
        return w, stats

    def step(self, w: np.ndarray, t: int, st: StepStats) -> np.ndarray:
        """One macro step: two staggered half steps, 4 flux phases."""
        f, g = self.fluxes(w, t, 0, st)
        stag = numerics.corrector(w, *self.fluxes(numerics.predictor(w, f, g), t, 1, st))
        f, g = self.fluxes(stag, t, 2, st)
        return numerics.shift_back(numerics.corrector(stag, *self.fluxes(numerics.predictor(stag, f, g), t, 3, st)))

    def fluxes(self, w: np.ndarray, t: int, phase: int, st: StepStats) -> tuple[np.ndarray, np.ndarray]:
        """f and g at every cell of w, from the memo or from tasks. All distinct states of the
        phase are planned together, as arrays."""
        cfg, epoch = self.cfg, t * PHASES + phase
        uniq, inv = unique_rows(w.reshape(-1, numerics.NFIELDS))
        n = len(uniq)
        st.unique_states += n
        # Kriged values are reused only where every cell with this state has a small gradient.
        small = np.ones(n, bool)
        np.logical_and.at(small, inv, numerics.small_gradient(w).reshape(-1))
        fg = np.empty((n, 2 * numerics.NFIELDS))
        sol = self.solver_memo.lookup(uniq)
        dist, near = sol.nearest(kriging.MAX_NEIGHBOURS if cfg.kriging else 1, keep=sol.epochs < epoch)
        memo_hit = dist[:, 0] <= MEMO_DISTANCE
        done = np.zeros(n, bool)

        def take(hit: np.ndarray, values: np.ndarray, rows: np.ndarray) -> int:
            if hit.any():
                fg[hit] = values[rows[hit]]
                done[hit] = True
            return int(hit.sum())

        st.memo_hits += take(memo_hit, sol.values, near[:, 0])
        if cfg.kriging:
            kri = self.kriging_memo.lookup(uniq)
            exact = kri.exact(keep=kri.epochs < epoch)
            st.memo_hits += take(small & ~done & (exact >= 0), kri.values, exact)
        # Values an earlier, killed attempt produced for exactly these states in this phase.
        for lk in (sol, kri) if cfg.kriging else (sol,):
            again = lk.exact(keep=lk.epochs == epoch)
            st.recovered += take(~done & (again >= 0), lk.values, again)
        seen = (near >= 0).sum(axis=1)
        plan = [(u, (sol.points[near[u, :seen[u]]], sol.values[near[u, :seen[u]]]) if cfg.kriging and seen[u] >= 2 else None)
                for u in np.flatnonzero(~done).tolist()]
        self._solve(plan, uniq, fg, t, phase, epoch, st)
        f = fg[inv, :numerics.NFIELDS].reshape(w.shape)
        g = fg[inv, numerics.NFIELDS:].reshape(w.shape)
        return f, g

    def _solve(self, plan: list, uniq: np.ndarray, fg: np.ndarray, t: int, phase: int, epoch: int, st: StepStats) -> None:
        """Runs the planned states as tasks of at most task_size rows, then memoises the results."""
        cfg = self.cfg
        chunks = [plan[i:i + cfg.task_size] for i in range(0, len(plan), cfg.task_size)]
        inputs = [{"w": uniq[[u for u, _ in c]], "krige": {i: nb for i, (_, nb) in enumerate(c) if nb is not None},
                   "flux": cfg.flux, "md_steps": cfg.md_steps, "cost": cfg.cost, "jitter": cfg.jitter} for c in chunks]
        results, info = self.tasks.map(flux_task, inputs, t, phase)
        st.tasks += info.tasks
        st.retried_tasks += info.failed
        recovered = set(info.recovered)
        solved: list[int] = []
        kriged: list[int] = []
        for k, (c, r) in enumerate(zip(chunks, results)):
            for i, (u, nb) in enumerate(c):
                fg[u] = r["fg"][i]
                (kriged if r["kriged"][i] else solved).append(u)
                if k in recovered:
                    st.recovered += 1
                elif r["kriged"][i]:
                    st.kriging_hits += 1
                else:
                    st.flux_evaluations += 1
                    st.kriging_fallbacks += nb is not None
        if solved:
            self.solver_memo.add(uniq[solved], fg[solved], epoch)
        if kriged:
            self.kriging_memo.add(uniq[kriged], fg[kriged], epoch)
