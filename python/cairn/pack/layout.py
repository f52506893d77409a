"""The merging schemes: how the bytes of a group of members are arranged into streams.

A *stream* is a sequence of *parts*, each part being bytes of one member given as file ranges.
Its layout is either ``concat`` (parts one after another) or ``interleave`` (round robin over the
parts, ``block`` bytes from each per round, skipping parts that are exhausted). Every byte of every
member belongs to exactly one part, so a member is restored by writing each part's bytes back to
its ranges.

- ``agnostic``: one stream of the whole files, concatenated.
- ``agnostic-block``: the whole files interleaved in blocks.
- ``aware``: one stream per similarity key (``Group/Name_Type_Class``), the variables of all
  members concatenated in rank order, plus one stream of the residual bytes.
- ``aware-block``: the same, interleaved in blocks (rounded to whole elements).

Under the aware schemes, streams of less than ``SMALL`` bytes (16 KiB) are coded together, as one stream
``~small`` of their parts one after another: a frame of a few hundred bytes costs more in coder
start-up and framing than modelling its values saves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..exceptions import InvalidArgumentError
from .member import Member

SCHEMES = ("agnostic", "agnostic-block", "aware", "aware-block")
#: The default: each container is packed ``aware`` and ``agnostic`` and the smaller kept.
AUTO = "auto"
CHOICES = (AUTO, *SCHEMES)


def tries(scheme: str) -> tuple[str, ...]:
    """The schemes a group is packed with under `scheme` (the smallest result is kept)."""
    return ("aware", "agnostic") if scheme == AUTO else (scheme,)
RESIDUAL = "~residual"
FILES = "~files"
SMALL_KEY = "~small"
SMALL = 16 << 10


@dataclass
class Part:
    member: int
    extents: list[tuple[int, int]]  # (file offset, length), in part order

    @property
    def length(self) -> int:
        return sum(n for _, n in self.extents)


@dataclass
class Stream:
    key: str
    elem: str | None  # numpy dtype string of the values, None for untyped bytes
    layout: str  # concat | interleave
    block: int
    parts: list[Part] = field(default_factory=list)

    @property
    def length(self) -> int:
        return sum(p.length for p in self.parts)

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "elem": self.elem,
            "layout": self.layout,
            "block": self.block,
            "parts": [[p.member, [list(e) for e in p.extents]] for p in self.parts],
        }

    @classmethod
    def from_json(cls, d: dict) -> Stream:
        parts = [Part(int(m), [(int(a), int(n)) for a, n in ext]) for m, ext in d["parts"]]
        return cls(d["key"], d["elem"], d["layout"], int(d["block"]), parts)


def check_scheme(scheme: str, block: int) -> None:
    if scheme not in CHOICES:
        raise InvalidArgumentError(f"unknown scheme {scheme!r}; use one of {', '.join(CHOICES)}")
    if block < 1:
        raise InvalidArgumentError(f"--block-size {block}: give a positive number of bytes")


def build(members: list[Member], scheme: str, block: int, match: re.Pattern[str] | None = None) -> list[Stream]:
    """The streams of one group under `scheme` (one of SCHEMES)."""
    if scheme not in SCHEMES:
        raise InvalidArgumentError(f"unknown scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
    check_scheme(scheme, block)
    blocked = scheme.endswith("-block")
    layout = "interleave" if blocked else "concat"
    if scheme.startswith("agnostic"):
        return [Stream(FILES, None, layout, block, [Part(i, [(0, m.size)]) for i, m in enumerate(members) if m.size])]
    streams: dict[str, Stream] = {}
    residual = Stream(RESIDUAL, None, "concat", block)
    for i, m in enumerate(members):
        for v in m.variables:
            key = v.key(match)
            s = streams.get(key)
            if s is None:
                elem = v.dtype if v.numeric else None
                size = np.dtype(v.dtype).itemsize or 1
                s = streams[key] = Stream(key, elem, layout, max(size, block // size * size))
            s.parts.append(Part(i, list(v.regions)))
        gaps = _gaps(sorted(r for v in m.variables for r in v.regions), m.size)
        if gaps:
            residual.parts.append(Part(i, gaps))
    small = Stream(SMALL_KEY, None, "concat", block)
    big = []
    for s in streams.values():
        if s.length < SMALL:
            small.parts += s.parts
        else:
            big.append(s)
    return [x for x in (residual, small) if x.parts] + big


def _gaps(regions: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    out, pos = [], 0
    for off, n in regions:
        if off > pos:
            out.append((pos, off - pos))
        pos = max(pos, off + n)
    if pos < size:
        out.append((pos, size - pos))
    return out


@dataclass
class Runs:
    """A stream's bytes in stream order as runs of member file bytes: run i is ``length[i]`` bytes
    of member ``member[i]`` from file offset ``offset[i]``, placed at stream offset ``start[i]``."""

    member: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    start: np.ndarray

    def between(self, a: int, b: int) -> range:
        """Indices of the runs overlapping stream bytes [a, b)."""
        lo = int(np.searchsorted(self.start, a, side="right")) - 1
        hi = int(np.searchsorted(self.start, b, side="left"))
        return range(max(lo, 0), hi)


def runs(stream: Stream) -> Runs:
    """The run table of a stream (the same function serves packing and unpacking)."""
    out: list[tuple[int, int, int]] = []

    def emit(member: int, off: int, n: int) -> None:
        if out and out[-1][0] == member and out[-1][1] + out[-1][2] == off:
            m, o, k = out[-1]
            out[-1] = (m, o, k + n)  # adjacent ranges of one member merge into one run
        else:
            out.append((member, off, n))

    if stream.layout == "concat":
        for p in stream.parts:
            for off, n in p.extents:
                emit(p.member, off, n)
    else:
        cursors = [[p.member, list(p.extents), 0, 0] for p in stream.parts]  # member, extents, ext index, used
        while cursors:
            alive = []
            for cur in cursors:
                member, extents, k, used = cur
                want = stream.block
                while want and k < len(extents):
                    off, n = extents[k]
                    take = min(want, n - used)
                    emit(member, off + used, take)
                    want -= take
                    used += take
                    if used == n:
                        k, used = k + 1, 0
                cur[2], cur[3] = k, used
                if k < len(extents):
                    alive.append(cur)
            cursors = alive
    arr = np.array(out, dtype=np.int64).reshape(-1, 3)
    length = arr[:, 2]
    start = np.zeros(len(arr), dtype=np.int64)
    np.cumsum(length[:-1], out=start[1:])
    return Runs(arr[:, 0], arr[:, 1], length, start)


def check_coverage(members: list[Member], streams: list[Stream]) -> None:
    """Every byte of every member in exactly one part (a failed check is a bug, not bad input)."""
    per: list[list[tuple[int, int]]] = [[] for _ in members]
    for s in streams:
        for p in s.parts:
            per[p.member].extend(p.extents)
    for m, ext in zip(members, per):
        pos = 0
        for off, n in sorted(ext):
            assert off == pos, f"{m.name}: bytes {pos}..{off} not covered (or overlap)"
            pos = off + n
        assert pos == m.size, f"{m.name}: covered {pos} of {m.size} bytes"
