"""Checkpoint-cost models (Herbein et al., Sec. IV-B): fit checkpoint time against process count
(and size) from skel or real runs by least squares, extrapolate to larger machines, and predict
the share of time spent checkpointing under preventive and proactive tactics for a given MTTF,
next to the Young/Daly optimal interval.

Samples come from ``cairn skel`` reports (every checkpoint step of every run is one sample: the
slowest rank's puts plus the commit) or from CSV files with columns ``procs,seconds[,bytes]``.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .exceptions import InvalidArgumentError


@dataclass(frozen=True)
class Sample:
    procs: int
    seconds: float
    bytes: float = 0.0


@dataclass(frozen=True)
class Fit:
    """``seconds = intercept + per_proc * procs (+ per_byte * bytes)``."""

    intercept: float
    per_proc: float
    per_byte: float | None
    r2: float
    residual_s: float  # standard deviation of the residuals
    n: int
    procs_range: tuple[int, int]
    bytes_per_proc: float  # mean checkpoint bytes per process in the samples (for extrapolating size)

    def predict(self, procs: float, nbytes: float | None = None) -> float:
        t = self.intercept + self.per_proc * procs
        if self.per_byte is not None:
            t += self.per_byte * (self.bytes_per_proc * procs if nbytes is None else nbytes)
        return max(t, 0.0)

    def law(self) -> str:
        s = f"time_chkpt = {self.intercept:.6g} + n * {self.per_proc:.6g}"
        return s + (f" + bytes * {self.per_byte:.6g}" if self.per_byte is not None else "")


@dataclass(frozen=True)
class Platform:
    """A machine to predict for: process count, MTTF, and the two tactics' checkpoint intervals."""

    name: str
    procs: int
    mttf_s: float
    preventive_s: float
    proactive_s: float


#: The paper's configurations (Cappello et al. via Herbein et al.): Titan with 16K nodes, MTTF
#: 6-24 h, preventive every 30 min, proactive every 10 s; an extreme-scale machine with 64K nodes,
#: optimistic (MTTF 1-2 h, every 2.5 min / 5 s) and pessimistic (MTTF 30 min, every 10 min / 1 s).
PAPER_PLATFORMS = [
    Platform("petascale (Titan)", 16384, 6 * 3600, 30 * 60, 10),
    Platform("extreme, optimistic", 65536, 3600, 150, 5),
    Platform("extreme, pessimistic", 65536, 30 * 60, 10 * 60, 1),
]


def duration(text: str) -> float:
    """Seconds in ``"30min"``, ``"2.5min"``, ``"6h"``, ``"10s"``, ``"1d"`` or a bare number of seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|sec|m|min|h|d)?\s*", text)
    if not m:
        raise InvalidArgumentError(f"duration {text!r}: write a number with s, min, h or d (e.g. 30min, 6h)")
    return float(m.group(1)) * {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}[m.group(2)]


def platform(text: str) -> Platform:
    """``NAME:PROCS:MTTF:PREVENTIVE:PROACTIVE``, e.g. ``mine:4096:12h:30min:10s``."""
    parts = text.split(":")
    if len(parts) != 5:
        raise InvalidArgumentError(f"--platform {text!r}: write NAME:PROCS:MTTF:PREVENTIVE:PROACTIVE, e.g. mine:4096:12h:30min:10s")
    try:
        procs = int(parts[1])
    except ValueError:
        raise InvalidArgumentError(f"--platform {text!r}: PROCS must be an integer") from None
    return Platform(parts[0], procs, duration(parts[2]), duration(parts[3]), duration(parts[4]))


def load_samples(paths: Sequence[str | Path]) -> list[Sample]:
    """Samples from skel reports (``.json``) and ``procs,seconds[,bytes]`` CSV files."""
    out: list[Sample] = []
    for p in map(Path, paths):
        if not p.exists():
            raise InvalidArgumentError(f"{p}: no such file; give cairn skel reports (.json) or CSV files (procs,seconds[,bytes])")
        if p.suffix == ".json":
            try:
                doc = json.loads(p.read_text())
                got = [Sample(int(doc["ranks"]), float(x["checkpoint_total_s"]), float(x["checkpoint_bytes"]))
                       for x in doc["per_step"] if x.get("checkpoint_bytes")]
            except (ValueError, KeyError, TypeError) as e:
                raise InvalidArgumentError(f"{p}: not a cairn skel report ({e}); CSV files need columns procs,seconds[,bytes]") from None
        else:
            with p.open(newline="") as f:
                rows = list(csv.DictReader(f))
            try:
                got = [Sample(int(r["procs"]), float(r["seconds"]), float(r.get("bytes") or 0)) for r in rows]
            except (KeyError, ValueError) as e:
                raise InvalidArgumentError(f"{p}: need CSV columns procs,seconds[,bytes] ({e})") from None
        if not got:
            raise InvalidArgumentError(f"{p}: holds no checkpoint samples (did the run write any checkpoint?)")
        out += got
    return out


def fit(samples: Sequence[Sample], with_size: bool = False) -> Fit:
    """Least-squares fit of checkpoint time on process count (and checkpoint bytes)."""
    procs = np.array([s.procs for s in samples], dtype=float)
    t = np.array([s.seconds for s in samples], dtype=float)
    nb = np.array([s.bytes for s in samples], dtype=float)
    cols = [np.ones_like(procs), procs] + ([nb] if with_size else [])
    need = len(cols)
    if len(set(procs)) < 2:
        raise InvalidArgumentError(f"{len(samples)} samples all at {int(procs[0]) if len(procs) else 0} processes: "
                                   "a law in the process count needs runs at two or more counts")
    if len(samples) < need + 1:
        raise InvalidArgumentError(f"{len(samples)} samples cannot fit {need} coefficients with a residual; run more")
    a = np.column_stack(cols)
    coef, *_ = np.linalg.lstsq(a, t, rcond=None)
    resid = t - a @ coef
    ss_tot = float(((t - t.mean()) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return Fit(
        intercept=float(coef[0]),
        per_proc=float(coef[1]),
        per_byte=float(coef[2]) if with_size else None,
        r2=r2,
        residual_s=float(resid.std(ddof=need)) if len(t) > need else 0.0,
        n=len(samples),
        procs_range=(int(procs.min()), int(procs.max())),
        bytes_per_proc=float((nb / procs).mean()),
    )


def young_daly(c: float, mttf: float) -> float:
    """Optimal checkpoint interval (compute time between checkpoints) for checkpoint cost ``c``:
    Daly's higher-order estimate, which reduces to Young's sqrt(2 c M) for c << M."""
    if c <= 0:
        return 0.0
    if c >= 2 * mttf:
        return mttf
    x = c / (2 * mttf)
    return math.sqrt(2 * c * mttf) * (1 + math.sqrt(x) / 3 + x / 9) - c


def share(c: float, interval: float) -> float:
    """Fraction of wall time spent checkpointing when a checkpoint of ``c`` seconds is taken every
    ``interval`` seconds (the paper's count: checkpoints per day times their cost, over a day)."""
    return 1.0 if interval <= 0 else min(1.0, c / interval)


def waste(c: float, interval: float, mttf: float) -> float:
    """Expected fraction of time lost to checkpoints and to rework after failures (first order):
    c / interval + (interval + c) / (2 MTTF)."""
    return min(1.0, share(c, interval) + (interval + c) / (2 * mttf))


def predict(f: Fit, platforms: Sequence[Platform], nbytes: float | None = None) -> list[dict[str, Any]]:
    """One row per platform: predicted checkpoint time and the time shares of each tactic."""
    rows = []
    for p in platforms:
        c = f.predict(p.procs, nbytes)
        tau = young_daly(c, p.mttf_s)
        rows.append({
            "platform": p.name, "procs": p.procs, "mttf_s": p.mttf_s, "checkpoint_s": c,
            "preventive_every_s": p.preventive_s, "preventive_pct": 100 * share(c, p.preventive_s),
            "proactive_every_s": p.proactive_s, "proactive_pct": 100 * share(c, p.proactive_s),
            "young_daly_s": tau, "young_daly_pct": 100 * share(c, tau),
            "young_daly_waste_pct": 100 * waste(c, tau, p.mttf_s),
            "preventive_waste_pct": 100 * waste(c, p.preventive_s, p.mttf_s),
        })
    return rows
