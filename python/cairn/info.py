"""What a reader describes: a variable (:class:`VariableInfo`), a block (:class:`BlockInfo`),
and what the lazy views (``variable``, ``step_array``) read through (:class:`Source`, which
:class:`cairn.Reader` is), so that they sit below the API that hands them out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np


@dataclass(frozen=True)
class VariableInfo:
    """A variable's element type, global shape (``None`` if local), whether it is local, its
    dimension names (``None`` if not given), attributes, and whether it is constant
    (step-invariant: written in one step, read without one)."""

    dtype: np.dtype
    shape: tuple[int, ...] | None
    local: bool
    dims: tuple[str, ...] | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    constant: bool = False


@dataclass(frozen=True)
class BlockInfo:
    """One block a writer put: its box and statistics (``None`` where undefined)."""

    writer: int
    offset: tuple[int, ...]
    count: tuple[int, ...]
    min: float | None
    max: float | None
    mean: float | None
    checksum: int
    nbytes: int  # raw size
    stored: int  # bytes on disk or in memory (less than nbytes when compressed)
    codec: str | None  # codec pipeline of the stored bytes (``pco:f8le:4+zstd:1``), None if raw
    redundancy: int = 0  # server failures its variable survives (staging)
    state: str = "replicated"  # "replicated", or "degraded" when a copy is on a server that is down
    level: str = "memory"  # where it is read from: "memory" (staging servers) or "disk" (drained, or the file engine)


class Source(Protocol):
    """What a lazy view reads through: :class:`cairn.Reader`'s calls of these names."""

    def steps(self) -> list[int]: ...
    def variables(self) -> dict[str, VariableInfo]: ...
    def blocks(self, name: str, step: int) -> list[BlockInfo]: ...
    def get(self, name: str, step: int | None = None, offset: Sequence[int] | None = None,
            count: Sequence[int] | None = None, out: np.ndarray | None = None) -> np.ndarray: ...
    def constant_step(self, name: str) -> int: ...
