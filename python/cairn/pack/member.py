"""What scanning finds in a checkpoint file: a *member* (one process's file) and its variables,
each with the byte ranges holding its values, and mcrEngine's similarity keys."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Variable:
    """One dataset of a member and the file ranges holding its values, in value order."""

    path: str
    dtype: str  # numpy dtype.str of the stored values ('<f8', '>i4', '|S8', '|O' …)
    shape: tuple[int, ...]
    regions: list[tuple[int, int]] = field(default_factory=list)  # (file offset, length)
    ordered: bool = True  # the regions, joined, are the values in C order (not chunks, not heap ids)

    @property
    def klass(self) -> str:
        """mcrEngine's class: ``Atomic`` for scalars, ``ArrayND`` otherwise."""
        return "Atomic" if not self.shape else f"Array{len(self.shape)}D"

    @property
    def numeric(self) -> bool:
        return np.dtype(self.dtype).kind in "iufc"

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.regions)

    def key(self, match: re.Pattern[str] | None = None) -> str:
        """The similarity key ``Group/Name_Type_Class``; with ``match``, the text of each capture
        group of a full match is replaced by ``*`` so that e.g. per-patch copies become similar."""
        path = self.path
        m = match.fullmatch(path) if match else None
        if m:
            for g in range(m.re.groups, 0, -1):
                a, b = m.span(g)
                if a >= 0:
                    path = path[:a] + "*" + path[b:]
        return f"{path}_{type_code(self.dtype)}_{self.klass}"


@dataclass
class Member:
    """One checkpoint file of the set."""

    name: str  # path relative to the set's directory, '/'-separated
    path: str
    format: str  # hdf5 | netcdf4 | netcdf3 | opaque
    size: int
    variables: list[Variable]
    notes: list[str] = field(default_factory=list)  # what was left residual and why


def type_code(dtype: str) -> str:
    """``<f8`` → ``F64LE``, ``>i4`` → ``I32BE``, ``|u1`` → ``U8``, ``|S10`` → ``S10``."""
    dt = np.dtype(dtype)
    if dt.kind in "iufc":
        order = {"<": "LE", ">": "BE"}.get(dt.str[0], "")
        return f"{dt.kind.upper()}{dt.itemsize * 8}{order}"
    return f"{dt.kind.upper()}{dt.itemsize}"
