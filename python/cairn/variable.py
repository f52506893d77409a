"""Lazy variables: ``r["pressure"][9, 0:128, :, 5]`` reads only the box the index touches.

The first index is the step: a step number (``>= 0``) or, negative, counted back from the last
committed step (``-1``: the last). The others are numpy basic indexing (integers, slices with
negative bounds and steps, ``...``); the reader fetches the bounding box of the touched elements
and numpy applies the strides.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from .exceptions import InvalidArgumentError, NotFoundError

if TYPE_CHECKING:
    from .info import Source, VariableInfo


def dims_of(name: str, info: VariableInfo) -> tuple[str, ...]:
    """Dimension names of global variable ``name``: those given to ``define``, else ``<name>_dim<i>``."""
    return info.dims or tuple(f"{name}_dim{i}" for i in range(len(info.shape or ())))


def normalize(key: Any, shape: tuple[int, ...]) -> list[int | range]:
    """``key`` (without the step) as one int or ``range`` of indices per dimension, ``...``
    expanded; :class:`IndexError` (numpy's) for an index out of range. Ranges in ``key`` are taken
    as already normalized."""
    key = key if isinstance(key, tuple) else (key,)
    if sum(k is Ellipsis for k in key) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if any(k is Ellipsis for k in key):
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * (len(shape) - len(key) + 1) + key[at + 1:]
    if len(key) > len(shape):
        raise IndexError(f"too many indices: the variable has {len(shape)} dimensions {shape} after the step, "
                         f"{len(key)} were indexed")
    key = key + (slice(None),) * (len(shape) - len(key))
    out: list[int | range] = []
    for dim, (k, n) in enumerate(zip(key, shape)):
        if isinstance(k, slice):
            out.append(range(*k.indices(n)))
            continue
        if isinstance(k, range):
            if k and not (0 <= min(k) and max(k) < n):
                raise IndexError(f"indices {k} are out of bounds for dimension {dim} with size {n}")
            out.append(k)
            continue
        try:
            i = None if isinstance(k, (bool, np.bool_)) else operator.index(k)
        except TypeError:
            i = None
        if i is None:
            raise InvalidArgumentError(f"index {k!r} of dimension {dim}: use integers, slices or '...' "
                                       "(basic indexing; read the box and index it in numpy for more)")
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {n}")
        out.append(i % n)
    return out


def selected_shape(key: list[int | range]) -> tuple[int, ...]:
    """The shape of what ``key`` (normalized) selects."""
    return tuple(len(k) for k in key if isinstance(k, range))


def bounding_box(key: list[int | range]) -> tuple[list[int], list[int], tuple[int | slice, ...]]:
    """The box (offset, count) holding every element ``key`` (normalized) touches, and the index
    that picks them out of that box. A range selecting nothing gives a zero count."""
    offset: list[int] = []
    count: list[int] = []
    local: list[int | slice] = []
    for k in key:
        if isinstance(k, int):
            offset.append(k)
            count.append(1)
            local.append(0)
            continue
        if not k:
            offset.append(0)
            count.append(0)
            local.append(slice(0, 0))
            continue
        lo, hi = min(k), max(k) + 1
        offset.append(lo)
        count.append(hi - lo)
        local.append(slice(k.start - lo, None, k.step) if k.step < 0 else slice(0, None, k.step))
    return offset, count, tuple(local)


def read_box(reader: Source, name: str, step: int, key: list[int | range], dtype: np.dtype) -> np.ndarray:
    """The elements ``key`` (normalized) selects of ``name`` at ``step``, reading only their
    bounding box."""
    offset, count, local = bounding_box(key)
    if 0 in count:
        return np.empty(selected_shape(key), dtype=dtype)
    return reader.get(name, step, offset, count)[local]


class Variable:
    """A variable of a reader, read lazily by indexing; see the module docstring."""

    def __init__(self, reader: Source, name: str, info: VariableInfo) -> None:
        self._reader = reader
        self.name = name
        self._info = info

    @property
    def shape(self) -> tuple[int, ...]:
        """The global shape of one step (indexes after the step index this)."""
        if self._info.shape is None:
            raise InvalidArgumentError(f"'{self.name}' is a local variable and has no global shape; "
                                       "read its blocks with get_local(name, step, writer)")
        return self._info.shape

    @property
    def dtype(self) -> np.dtype:
        return self._info.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dims(self) -> tuple[str, ...]:
        """Dimension names: those given to ``define``, else ``<name>_dim<i>``."""
        return dims_of(self.name, self._info)

    @property
    def attrs(self) -> dict[str, Any]:
        return self._info.attrs

    @property
    def steps(self) -> list[int]:
        """Committed steps (of the dataset; re-read on every call)."""
        return self._reader.steps()

    def step_of(self, index: Any) -> int:
        """The step number an index names: itself if ``>= 0``, else counted back from the last
        committed step."""
        try:
            i = operator.index(index)
        except TypeError:
            raise InvalidArgumentError(f"step index {index!r}: the first index is one step, a step number or "
                                       "negative from the last committed step (use xarray for several steps)") from None
        if i >= 0:
            return i
        steps = self.steps
        if -i > len(steps):
            raise NotFoundError(f"step index {i}: only {len(steps)} steps are committed")
        return steps[i]

    def __getitem__(self, key: Any) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        if self._info.constant:
            # Step-invariant: indexed as the array itself, read from the step that holds it.
            step = self._reader.constant_step(self.name)
            return read_box(self._reader, self.name, step, normalize(key, self.shape), self.dtype)
        if not key or key[0] is Ellipsis:
            raise InvalidArgumentError(f"index {self.name!r} with the step first, e.g. [-1, ...] for the last step")
        step = self.step_of(key[0])
        return read_box(self._reader, self.name, step, normalize(key[1:], self.shape), self.dtype)

    def __repr__(self) -> str:
        shape = "local" if self._info.local else self.shape
        return f"<cairn.Variable {self.name!r} {self.dtype} {shape} dims={self._info.dims} attrs={self.attrs}>"
