"""The CF conventions as Cairn's exports and xarray backend apply them: attributes that hold
values of the data (``_FillValue``, ``missing_value``, ``valid_*``) in the variable's own type,
the ``step`` coordinate, and a ``time`` coordinate along it.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .exceptions import InvalidArgumentError

#: The conventions the exports follow (their ``Conventions`` attribute).
CONVENTIONS = "CF-1.8"

#: Attributes whose values are values of the data, so in the variable's type (CF §2.5.1, §8.1).
TYPED = ("_FillValue", "missing_value", "valid_min", "valid_max", "valid_range", "actual_range")

#: The ``step`` coordinate's attributes.
STEP_ATTRS = {"long_name": "step number", "comment": "the number the writers gave each committed step"}

#: Steps past this do not fit the int64 ``step`` coordinate.
MAX_STEP = 2**63 - 1


def typed(value: Any, dtype: np.dtype, name: str, key: str) -> np.ndarray:
    """``value`` of attribute ``key`` of variable ``name`` in ``dtype``, or
    :class:`InvalidArgumentError` when it does not fit (``-999.5`` in an integer, ``300`` in ``i1``)."""
    v = np.asarray(value)
    if v.dtype.kind in "OUS" or v.ndim > 1:
        raise InvalidArgumentError(f"'{name}': {key} = {value!r} is not a number of its type {dtype.name}")
    with np.errstate(all="ignore"):
        cast = v.astype(dtype)
    same = (cast == v) | (np.isnan(v.astype("f8")) & np.isnan(cast.astype("f8"))) if dtype.kind in "fc" else cast == v
    if not np.all(same):
        lo, hi = (np.iinfo(dtype).min, np.iinfo(dtype).max) if dtype.kind in "iu" else (None, None)
        span = f" ({lo} to {hi}, whole numbers)" if lo is not None else ""
        raise InvalidArgumentError(f"'{name}': {key} = {value!r} does not fit its type {dtype.name}; give a value "
                                   f"{dtype.name} can hold{span}")
    return cast


def check(name: str, dtype: Any, attrs: Mapping[str, Any] | None) -> None:
    """Refuses typed attributes (``_FillValue`` ...) that do not fit the variable's type."""
    dt = np.dtype(dtype) if dtype != "bytes" else None
    for key in TYPED:
        if attrs and key in attrs and dt is not None:
            typed(attrs[key], dt, name, key)


def attrs_of(name: str, dtype: np.dtype, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """A variable's attributes with the typed ones in its type (scalars for one value)."""
    out = dict(attrs)
    for key in TYPED:
        if key in out:
            v = typed(out[key], dtype, name, key)
            out[key] = v[()] if v.ndim == 0 else v
    return out


def time_variable(variables: Mapping[str, Any]) -> str | None:
    """A per-step scalar variable (shape ``()``) with ``axis: "T"`` and CF time units
    (``"days since 2000-01-01"``): it becomes a ``time`` coordinate along ``step``."""
    for n, info in variables.items():
        a = info.attrs
        if info.shape == () and a.get("axis") == "T" and " since " in str(a.get("units", "")):
            return str(n)
    return None


def check_steps(steps: list[int]) -> np.ndarray:
    """The ``step`` coordinate's values; steps past int64 are refused."""
    big = [s for s in steps if s > MAX_STEP]
    if big:
        raise InvalidArgumentError(f"step {big[0]} does not fit the int64 step coordinate of netCDF/Zarr/xarray; "
                                   "export fewer steps (--steps)")
    return np.asarray(steps, dtype="i8")
