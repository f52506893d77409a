"""Parity over the head and frames of a container: the staging servers' Reed–Solomon code
(``cairn-core``'s ``erasure``, through ``cairn._native``) over interleaved slices of the region.

The region (the head, then every frame record, one after another) is cut in slices (see
:func:`geometry`). Slice ``j`` belongs to group ``j mod groups`` and each group gets ``parity``
parity records, each carrying the CRC-32 of every slice of its group. A slice is an erasure when
its check fails (or its bytes are missing), so each group repairs any ``parity`` damaged slices,
and one more when two are neighbours in the group holding one run of damage (``_split``): with
parity 1, any run of damaged or cut-out bytes up to groups · slice, about 1/16 of the region
above 1 MiB (8 groups of 16 slices) and one slice below (one group). The cost is parity / slices
per group of the region plus a record header per group and shard, whatever the frame sizes, so
frames can stay large (better compression).
"""

from __future__ import annotations

import bisect
import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .. import _native
from . import records as rec


class Reader(Protocol):
    """What verifying reads of a container of any version (``container.Reader`` is one)."""

    streams: list[Any]

    def pread(self, n: int, off: int) -> bytes: ...
    def frame_count(self, s: int) -> int: ...
    def where(self, s: int, i: int) -> str: ...
    def sound(self, s: int, i: int) -> bool: ...
    def read_frame(self, s: int, i: int) -> np.ndarray: ...


class Container(Reader, Protocol):
    """What parity reads and repairs of a version-2 container (``container.Container`` is one):
    it lives below the container, so the container's types are named here by what they do."""

    size: int
    head: dict[str, Any]
    data_start: int
    records: dict[int, rec.Frame | rec.Parity]
    frames: dict[tuple[int, int], int]
    mended: dict[int, bytes]
    slices: dict[int, bytes]
    tried: dict[int, tuple[int, int]]
    repaired: list[str]

    def placed(self) -> list[tuple[int, int, int]]: ...
    def note_frame(self, r: rec.Frame) -> None: ...

MIN_SLICE, MAX_SLICE = 64, 1 << 20


@dataclass(frozen=True)
class Geometry:
    """How a region of `region` bytes is sliced and grouped, with `parity` shards per group."""

    region: int
    slice: int
    groups: int
    parity: int = 0

    @property
    def slices(self) -> int:
        return -(-self.region // self.slice)

    def members(self, g: int) -> range:
        """The slices of group `g`."""
        return range(g, self.slices, self.groups)


def geometry(region: int, parity_group: int, parity: int = 1, largest: int = 0) -> Geometry:
    """How a region is sliced. From 1 MiB: slices of about region / (8 · parity_group) bytes in 8
    groups (a run of damage of L bytes touches at most ceil(L / slice) + 1 consecutive slices,
    one per group while that is ≤ groups). Below: one group of k slices, k between
    `parity_group` and 4 · `parity_group` (so parity costs parity / k of the region plus one
    header of 42 + 4k bytes per record). A run of damage of at most one slice is repaired
    (``_split``), so k is the largest that keeps the `largest` frame record within one slice, if
    one of at least `parity_group` does; else (frames too long for any) √(region / 4), which
    minimises the record (its 4-byte check per slice plus its slice): a container of one small
    file then pays little for its parity."""
    if region < 1 << 20:
        cheapest = math.isqrt(region // 4)
        fits = region // largest if largest else 0
        k = min(fits, cheapest) if fits >= parity_group else cheapest
        k = min(max(parity_group, k), 4 * parity_group, 255 - parity, max(1, region))
        return Geometry(region, -(-region // k), 1)
    s = max(MIN_SLICE, min(MAX_SLICE, -(-region // (8 * parity_group))))
    n = -(-region // s)
    return Geometry(region, s, -(-n // parity_group))


def encode(read: object, geo: Geometry, parity: int) -> list[tuple[int, list[int], list[bytes]]]:
    """(group, slice crcs, parity shards) of every group; ``read(offset, n)`` reads the region."""
    out = []
    for g in range(geo.groups):
        slices = [read(j * geo.slice, geo.slice).ljust(geo.slice, b"\0") for j in geo.members(g)]  # type: ignore[operator]
        out.append((g, [slice_check(x) for x in slices], _native.erasure_parity(slices, parity)))
    return out


def slice_check(b: bytes) -> int:
    """The check of a slice: CRC-32 (zlib's polynomial), not crc32c. A slice holds records that
    each end in their own crc32c, and two such records of equal length differ by a crc32c
    codeword, which no crc32c over the slice can see (a frame slid into the place of a cut-out
    one of equal content would pass); another polynomial sees it."""
    return zlib.crc32(b)


# -- reading ---------------------------------------------------------------------------------

def _geometry(c: Container) -> tuple[Geometry, dict[int, dict[int, rec.Parity]]] | None:
    """The geometry the container's parity records agree on, and those records by group and shard."""
    found = [r for r in c.records.values() if isinstance(r, rec.Parity)]
    for first in found:
        geo = Geometry(first.region, first.slice, first.groups, first.parity)
        if geo.region > 2 * c.size or geo.groups > geo.slices:
            continue
        by: dict[int, dict[int, rec.Parity]] = {}
        for r in found:
            same = (r.region, r.slice, r.groups, r.parity) == (geo.region, geo.slice, geo.groups, geo.parity)
            if same and len(r.crcs) == len(geo.members(r.group)):
                by.setdefault(r.group, {}).setdefault(r.shard, r)
        return geo, by
    return None


def _slice(c: Container, geo: Geometry, j: int) -> bytes:
    """Slice `j` of the region as the container holds it: its bytes at their place, except frames
    found displaced (bytes were cut out before them), which are put back where they belong."""
    if j in c.slices:
        return c.slices[j]
    a, b = j * geo.slice, min((j + 1) * geo.slice, geo.region)
    out = bytearray(c.pread(b - a, a).ljust(geo.slice, b"\0"))
    placed = c.placed()
    k = max(bisect.bisect_right([p[0] for p in placed], a) - 1, 0)
    while k < len(placed) and placed[k][0] < b:
        at, length, off = placed[k]
        lo, hi = max(a, at), min(b, at + length)
        if lo < hi and off >= 0 and off != at:
            out[lo - a : hi - a] = c.pread(hi - lo, off + lo - at).ljust(hi - lo, b"\0")
        k += 1
    return bytes(out)


def _decode(c: Container, geo: Geometry, g: int, shard_of: dict[int, rec.Parity]) -> tuple[int, int]:
    """Rebuilds the damaged slices of group `g` if it can; returns (sound shards, needed)."""
    js = list(geo.members(g))
    crcs = next(iter(shard_of.values())).crcs
    stored = [_slice(c, geo, j) for j in js]
    shards: list[bytes | None] = [x if slice_check(x) == want else None for x, want in zip(stored, crcs)]
    for p in range(geo.parity):
        r = shard_of.get(p)
        body = c.pread(r.length, r.offset)[r.header :] if r is not None else b""
        shards.append(body if r is not None and len(body) == r.slice and rec.crc(body) == r.shard_crc else None)
    sound = sum(x is not None for x in shards)
    lost = [i for i in range(len(js)) if shards[i] is None]
    if lost and sound >= len(js):
        data = _native.erasure_decode(shards, len(js))
        for i in lost:
            c.slices[js[i]] = data[i * geo.slice : (i + 1) * geo.slice]
    elif sound == len(js) - 1 and _split(c, geo, js, crcs, stored, shards):
        return len(js), len(js)
    return sound, len(js)


def _split(c: Container, geo: Geometry, js: list[int], crcs: list[int], stored: list[bytes], shards: list[bytes | None]) -> bool:
    """Repairs a group one erasure short, if two of its damaged slices are neighbours in the group
    and the damage is one run across their boundary (the end of the first, the start of the
    second, overlapping in no column): each column then has one erasure. Each slice is rebuilt
    as if the other were sound; the boundary `cut` is found by trying the slices made of the
    stored bytes before it and the rebuilt ones after it (and the other way round for the second)
    against their CRC-32: first in the gaps between the columns where the two differ (where a
    run shorter than a slice leaves untouched columns), then, for slices of at most 8 KiB,
    everywhere."""
    k = len(js)
    lost = [i for i in range(k) if shards[i] is None]
    for a in (i for i in lost if i + 1 in lost):
        b = a + 1
        dec = {}
        for gone, kept in ((a, b), (b, a)):
            trial = list(shards)
            trial[kept] = stored[kept]
            dec[gone] = _native.erasure_decode(trial, k)  # every lost slice but `kept` rebuilt
        cols = np.flatnonzero(np.frombuffer(dec[a][a * geo.slice : b * geo.slice], np.uint8) != np.frombuffer(stored[a], np.uint8))
        edges = np.concatenate(([0], cols + 1))
        ends = np.concatenate((cols, [geo.slice]))
        cuts = [int(edges[x]) for x in np.argsort(edges - ends, kind="stable")[:16]]
        if geo.slice <= 8192:
            tried = set(cuts)
            cuts += [x for x in range(geo.slice + 1) if x not in tried]
        for cut in cuts:
            def part(i: int, cut: int = cut) -> bytes:
                lo = stored[a] if i == a else dec[b][i * geo.slice : (i + 1) * geo.slice]
                hi = stored[b] if i == b else dec[a][i * geo.slice : (i + 1) * geo.slice]
                return lo[:cut] + hi[cut:]

            if slice_check(part(a)) == crcs[a] and all(slice_check(part(i)) == crcs[i] for i in lost):
                for i in lost:
                    c.slices[js[i]] = part(i)
                return True
    return False


def _rebuild(c: Container, a: int, b: int) -> list[str]:
    """Rebuilds the slices holding region bytes [a, b); returns why not, per group that cannot."""
    found = _geometry(c)
    if found is None:
        return ["no sound parity record"]
    geo, by = found
    why = []
    first, last = a // geo.slice, (min(b, geo.region) - 1) // geo.slice
    for g in sorted({j % geo.groups for j in range(first, last + 1)}):
        if g not in c.tried:
            c.tried[g] = _decode(c, geo, g, by[g]) if g in by else (0, len(geo.members(g)))
        sound, need = c.tried[g]
        if sound < need:
            why.append(f"parity group {g} has {sound} sound slices of {need + geo.parity} and needs {need}")
    return why


def _logical(c: Container, a: int, b: int) -> bytes:
    found = _geometry(c)
    if found is None or b > found[0].region:
        return b""
    geo = found[0]
    parts = [_slice(c, geo, j) for j in range(a // geo.slice, (b - 1) // geo.slice + 1)]
    base = (a // geo.slice) * geo.slice
    return b"".join(parts)[a - base : b - base]


def _gaps(c: Container) -> list[tuple[int, int]]:
    """Region bytes after the head no known frame covers: where frames were lost (cut out, or
    their header damaged)."""
    found = _geometry(c)
    if found is None:
        return []
    out, pos = [], c.data_start
    for at, length, _ in c.placed():
        if at > pos:
            out.append((pos, min(at, found[0].region)))
        pos = max(pos, at + length)
    if pos < found[0].region:
        out.append((pos, found[0].region))
    return [(a, b) for a, b in out if a < b]


def region_bytes(c: Container, a: int, b: int) -> bytes:
    """Region bytes [a, b), rebuilt from parity where damaged (as far as it can)."""
    _rebuild(c, a, b)
    return _logical(c, a, b)


def _mend(c: Container, at: int, length: int) -> rec.Frame | None:
    b = _logical(c, at, at + length)
    r = rec.parse_record(b)
    if isinstance(r, rec.Frame) and r.at == at and r.length == length:
        c.mended[r.seq] = b
        return r
    return None


def repair(c: Container, s: int, i: int) -> bytes | None:
    """The record of frame (s, i) rebuilt from parity, or None if it cannot be."""
    seq = c.frames.get((s, i))
    r = c.records.get(seq) if seq is not None else None
    if isinstance(r, rec.Frame):
        # Groups that cannot decode (their parity records are damaged too) may hold none of the
        # frame's damage: the rebuilt record's own crcs decide.
        _rebuild(c, r.at, r.at + r.length)
        if _mend(c, r.at, r.length):
            c.repaired.append(f"{c.where(s, i)} rebuilt from parity")
        return c.mended.get(r.seq)
    for a, b in _gaps(c):
        _rebuild(c, a, b)
        pos = a
        while pos < b:
            head = _logical(c, pos, min(b, pos + rec.PARITY.size + 4 * 255 + 4))
            n = rec.header_length(head)
            hr = rec.parse_header(head[:n], b - pos - n) if n is not None and n <= len(head) else None
            fr = _mend(c, pos, hr.length) if isinstance(hr, rec.Frame) else None
            if fr is None:
                break
            c.note_frame(fr)
            c.repaired.append(f"{c.where(fr.stream, fr.index)} (missing) rebuilt from parity")
            pos += fr.length
    seq = c.frames.get((s, i))
    return c.mended.get(seq) if seq is not None else None


def why_not(c: Container, s: int, i: int) -> str:
    """Why frame (s, i) could not be repaired."""
    if not int(c.head["parity"]):
        return "the container has no parity (packed with --parity 0)"
    seq = c.frames.get((s, i))
    r = c.records.get(seq) if seq is not None else None
    spans = [(r.at, r.at + r.length)] if isinstance(r, rec.Frame) else _gaps(c)
    why = sorted({w for a, b in spans for w in _rebuild(c, a, b)})
    return "; ".join(why) or "its bytes were rebuilt but do not form the frame"


@dataclass
class Verified:
    """What `cairn ls --verify` found in one container."""

    frames: int = 0
    damaged: list[str] = field(default_factory=list)  # frames found damaged or missing, repairable
    lost: list[str] = field(default_factory=list)  # frames damaged beyond repair
    parity_damaged: int = 0

    @property
    def repairable(self) -> bool:
        return not self.lost


def verify(c: Reader) -> Verified:
    """Reads, checks and decodes every frame, repairing from parity where it can."""
    from ..exceptions import CorruptError

    v = Verified()
    records = getattr(c, "records", {})  # version-1 containers have no parity records
    v.parity_damaged = sum(1 for r in records.values() if isinstance(r, rec.Parity) and rec.parse_record(c.pread(r.length, r.offset)) is None)
    for s in range(len(c.streams)):
        for i in range(c.frame_count(s)):
            v.frames += 1
            sound = c.sound(s, i)
            try:
                c.read_frame(s, i)
                if not sound:
                    v.damaged.append(c.where(s, i))
            except CorruptError as e:
                v.lost.append(str(e))
    return v
