"""A global variable over all committed steps as one lazy array with the step axis first: what
the xarray backend and :meth:`cairn.Reader.to_dask` index. Steps are positions here (the list of
committed steps when it was made), as along any numpy axis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .exceptions import InvalidArgumentError, NotFoundError
from .variable import normalize, read_box, selected_shape

if TYPE_CHECKING:
    from .info import Source, VariableInfo


class StepArray:
    """``reader``'s variable ``name`` as an array of shape ``(len(steps), *shape)``. Indexing takes
    numpy basic indexing and reads only the bounding box of each step touched. A step where the
    variable is missing or not wholly written reads as NaN (floats and complex numbers; other
    types raise :class:`NotFoundError`)."""

    def __init__(self, reader: Source, name: str, steps: list[int] | None = None, info: VariableInfo | None = None) -> None:
        info = info or reader.variables().get(name)
        if info is None:
            raise NotFoundError(f"unknown variable '{name}'; defined: [{', '.join(reader.variables())}]")
        if info.shape is None:
            raise InvalidArgumentError(f"'{name}' is a local variable (ragged, per writer): it has no global array; "
                                       "read its blocks with get_local(name, step, writer)")
        self.reader, self.name, self.info = reader, name, info
        self.steps = reader.steps() if steps is None else list(steps)
        #: The shape of one step.
        self.item_shape: tuple[int, ...] = info.shape
        self.shape: tuple[int, ...] = (len(self.steps), *info.shape)
        self.dtype: np.dtype = info.dtype
        self.ndim = len(self.shape)

    def __getitem__(self, key: Any) -> np.ndarray:
        first, *rest = normalize(key, self.shape)
        positions = [first] if isinstance(first, int) else first
        parts = [self._read(self.steps[i], rest) for i in positions]
        if isinstance(first, int):
            return parts[0]
        if not parts:
            return np.empty((0, *selected_shape(rest)), dtype=self.dtype)
        return np.stack(parts)

    def _read(self, step: int, key: list[int | range]) -> np.ndarray:
        try:
            return read_box(self.reader, self.name, step, key, self.dtype)
        except NotFoundError:
            if self.dtype.kind not in "fc":
                raise
            return np.full(selected_shape(key), np.nan, dtype=self.dtype)

    def chunks(self) -> tuple[tuple[int, ...], ...]:
        """Chunk sizes per dimension, one chunk per step and per written block: the edges of the
        blocks of the last step (of every block, when they do not form a grid)."""
        edges: list[set[int]] = [{0, n} for n in self.item_shape]
        if self.steps:
            try:
                blocks = self.reader.blocks(self.name, self.steps[-1])
            except NotFoundError:
                blocks = []
            for b in blocks:
                for d, (o, c) in enumerate(zip(b.offset, b.count)):
                    edges[d] |= {o, o + c}
        per_dim = tuple(tuple(int(x) for x in np.diff(sorted(e))) or (0,) for e in edges)
        return ((1,) * len(self.steps) or (0,), *per_dim)
