"""Size models: how many records (e.g. QMCPack walkers) a writer holds at each step.

``fixed`` never changes. ``spring`` is the damped-spring walker model of Herbein et al. (Sec. III-C):
the count is the position of a damped spring pulled towards a target, integrated with the
midpoint method, plus small random kicks to its position, so it oscillates around the target the
way walker populations do under DMC branching. ``python`` calls a user function
``f(rank, step, rng) -> int``. Every model draws from a generator seeded by (seed, rank), so a
run is reproducible and ranks differ.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Union

import numpy as np

from ..exceptions import InvalidArgumentError


@dataclass
class Fixed:
    """The same count every step."""

    value: int

    def counts(self, rank: int, steps: int, seed: int) -> list[int]:
        return [self.value] * steps


@dataclass
class Spring:
    """Damped spring x'' = -stiffness (x - target) - damping x', midpoint-integrated with step
    ``dt``; after each step the position gets a normal kick of deviation ``kick``. Counts are
    rounded and kept within [``lo``, ``hi``] (default 1 and 2 x target), as a walker population
    never dies out nor grows without bound under population control."""

    target: float
    initial: float | None = None
    stiffness: float = 0.05
    damping: float = 0.1
    kick: float = 1.0
    dt: float = 1.0
    lo: int = 1
    hi: int | None = None

    def positions(self, rank: int, steps: int, seed: int) -> np.ndarray:
        """The spring's (unrounded) positions for ``steps`` steps."""
        rng = np.random.default_rng([seed, rank])
        x = self.target if self.initial is None else float(self.initial)
        v = 0.0
        out = np.empty(steps)

        def accel(x: float, v: float) -> float:
            return -self.stiffness * (x - self.target) - self.damping * v

        for i in range(steps):
            out[i] = x
            # Midpoint method: advance by the slope at the half step.
            xm, vm = x + 0.5 * self.dt * v, v + 0.5 * self.dt * accel(x, v)
            x, v = x + self.dt * vm, v + self.dt * accel(xm, vm)
            x += rng.normal(0.0, self.kick)
        return out

    def counts(self, rank: int, steps: int, seed: int) -> list[int]:
        hi = self.hi if self.hi is not None else max(self.lo, int(2 * self.target))
        return [int(min(max(round(p), self.lo), hi)) for p in self.positions(rank, steps, seed)]


@dataclass
class Custom:
    """Counts from ``function(rank, step, rng) -> int``, named as ``module:function`` or
    ``path/to/file.py:function`` (relative to the descriptor)."""

    function: str
    base: Path = field(default_factory=Path.cwd)

    def resolve(self) -> Callable[[int, int, np.random.Generator], int]:
        where, _, name = self.function.rpartition(":")
        if not where or not name:
            raise InvalidArgumentError(f"size function {self.function!r}: write it as module:function or file.py:function")
        if where.endswith(".py"):
            path = (self.base / where).resolve()
            spec = importlib.util.spec_from_file_location(path.stem, path)
            if spec is None or spec.loader is None or not path.exists():
                raise InvalidArgumentError(f"size function file {path} not found")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(where)
        fn = getattr(mod, name, None)
        if not callable(fn):
            raise InvalidArgumentError(f"size function {self.function!r}: {where} has no function {name!r}")
        return fn

    def counts(self, rank: int, steps: int, seed: int) -> list[int]:
        fn, rng = self.resolve(), np.random.default_rng([seed, rank])
        out = []
        for s in range(steps):
            n = fn(rank, s, rng)
            if not isinstance(n, (int, np.integer)) or n < 0:
                raise InvalidArgumentError(f"size function {self.function!r} returned {n!r} at rank {rank} step {s}; need an int >= 0")
            out.append(int(n))
        return out


SizeModel = Union[Fixed, Spring, Custom]


def parse(name: str, spec: Any, base: Path) -> SizeModel:
    """A size model from its descriptor entry: an int (fixed) or a mapping with ``model``."""
    if isinstance(spec, int):
        return Fixed(spec)
    if not isinstance(spec, dict) or "model" not in spec:
        raise InvalidArgumentError(f"sizes.{name}: give a number or a mapping with model: fixed | spring | python")
    kw = {k: v for k, v in spec.items() if k != "model"}
    kinds: dict[str, Any] = {"fixed": Fixed, "spring": Spring, "python": Custom}
    kind = kinds.get(spec["model"])
    if kind is None:
        raise InvalidArgumentError(f"sizes.{name}: unknown model {spec['model']!r}; use fixed, spring or python")
    if kind is Custom:
        kw["base"] = base
    try:
        model = kind(**kw)
    except TypeError as e:
        raise InvalidArgumentError(f"sizes.{name}: {e}") from None
    if isinstance(model, Spring) and not (model.target > 0 and model.dt > 0 and math.isfinite(model.kick)):
        raise InvalidArgumentError(f"sizes.{name}: a spring needs target > 0 and dt > 0")
    return model
