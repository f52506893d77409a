"""The task CoHMM's runtime schedules: fluxes for a chunk of unique cell states, by kriging from
the neighbours the driver chose (falling back to the solver when the kriging error is too
large) or by the solver: the analytic law or LAMMPS MD, plus an optional cost (sleep with
jitter) to emulate an expensive, imbalanced fine scale."""

from __future__ import annotations

import os
import time
import zlib
from typing import Any

import numpy as np

from . import kriging, md
from .numerics import NFIELDS, analytic_flux

FLUXES = ("analytic", "md")
#: Environment variable naming a file each task appends its solver evaluation count to: how the
#: benchmark counts the work of an attempt that was SIGKILLed before it could report.
EVAL_LOG = "CAIRN_COHMM_EVAL_LOG"


def cost_of(w: np.ndarray, cost: float, jitter: float) -> float:
    """Seconds one evaluation at w costs: cost·(1 + jitter·u), u in [0, 1) drawn from w's bytes,
    so a rerun sees the same imbalance."""
    if cost <= 0:
        return 0.0
    u = (zlib.crc32(w.tobytes()) & 0xFFFF) / 65536.0
    return cost * (1.0 + jitter * u)


def flux_task(task: dict[str, Any]) -> dict[str, np.ndarray]:
    """Fluxes of the rows of ``task["w"]`` (n, 7). ``task["krige"]`` maps row → (points, values)
    of its neighbours. Returns f, g (n, 7), which rows were kriged, and which were solved."""
    w = task["w"]
    n = len(w)
    fg = np.empty((n, 2 * NFIELDS))
    kriged = np.zeros(n, bool)
    for i, (pts, vals) in task.get("krige", {}).items():
        est, err = kriging.krige(pts, vals, w[i])
        if err <= kriging.ERROR_THRESHOLD:
            fg[i], kriged[i] = est, True
    rows = np.flatnonzero(~kriged)
    if task["flux"] == "analytic":
        f, g = analytic_flux(w[rows])
        fg[rows] = np.concatenate([f, g], axis=1)
    elif task["flux"] == "md":
        for i in rows:
            fg[i] = np.concatenate(md.flux(w[i], steps=task.get("md_steps", 1000)))
    else:
        raise ValueError(f"unknown flux {task['flux']!r}; use one of {', '.join(FLUXES)}")
    pause = sum(cost_of(w[i], task.get("cost", 0.0), task.get("jitter", 0.0)) for i in rows)
    if pause:
        time.sleep(pause)
    log = os.environ.get(EVAL_LOG)
    if log and len(rows):
        with open(log, "a") as fh:  # one short O_APPEND write: lines from concurrent workers stay whole
            fh.write(f"{len(rows)}\n")
    return {"fg": fg, "kriged": kriged}
