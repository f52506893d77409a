"""Parity over groups of frames: the staging servers' Reed–Solomon code (``cairn-core``'s
``erasure``, through ``cairn._native``) applied to whole frame records.

A container's frames are put in groups of up to ``parity_group`` frames of similar size (sorted
by length, so padding is small); each group gets ``parity`` parity records whose shards are the
Reed–Solomon parity of the group's records, each zero-padded to the longest. Any ``parity``
damaged or missing records of a group (frames or parity) are rebuilt from the others: a frame is
damaged when its own checksums fail, so the code only ever has to fill erasures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import _native
from . import records as rec

if TYPE_CHECKING:
    from .container import Container


def groups(frames: list[rec.Frame], size: int) -> list[list[rec.Frame]]:
    """Frames in groups of at most `size`, by record length (so shards need little padding)."""
    order = sorted(frames, key=lambda f: f.length)
    return [order[a : a + size] for a in range(0, len(order), size)]


def encode(shards: list[bytes], m: int) -> list[bytes]:
    """The `m` parity shards of frame records, each padded to the longest."""
    n = max(len(s) for s in shards)
    return _native.erasure_parity([s.ljust(n, b"\0") for s in shards], m)


def _parity_groups(c: Container) -> dict[int, dict[int, rec.Parity]]:
    out: dict[int, dict[int, rec.Parity]] = {}
    for r in c.records.values():
        if isinstance(r, rec.Parity):
            out.setdefault(r.group, {}).setdefault(r.shard, r)
    return out


def _shards(c: Container, shard_of: dict[int, rec.Parity]) -> tuple[list[int], int, list[bytes | None]]:
    """The group's frame seqs, shard length and shards (None where damaged or missing)."""
    first = next(iter(shard_of.values()))
    seqs, n, m = first.seqs, first.n, int(c.head["parity"])
    shards: list[bytes | None] = []
    for seq in seqs:
        b = c.record_bytes(seq)
        shards.append(b.ljust(n, b"\0") if b is not None and len(b) <= n else None)
    for j in range(m):
        p = shard_of.get(j)
        b = c.pread(p.length, p.offset) if p is not None and p.seqs == seqs and p.n == n else b""
        body = b[p.header :] if p is not None and len(b) == p.length else b""
        shards.append(body if body and rec.crc(body) == p.shard_crc else None)  # type: ignore[union-attr]
    return seqs, n, shards


def _rebuild(c: Container, g: int, shard_of: dict[int, rec.Parity]) -> None:
    seqs, n, shards = _shards(c, shard_of)
    k = len(seqs)
    lost = [i for i in range(k) if shards[i] is None]
    if not lost or sum(s is not None for s in shards) < k:
        return
    data = _native.erasure_decode(shards, k)
    for i in lost:
        b = data[i * n : (i + 1) * n]
        r = rec.parse_record(b)
        if isinstance(r, rec.Frame) and r.seq == seqs[i] and r.stream < len(c.streams) and r.index < c.frame_count(r.stream):
            c.mended[r.seq] = b[: r.length]
            c.frames.setdefault((r.stream, r.index), r.seq)
            c.repaired.append(f"{c.where(r.stream, r.index)} rebuilt from parity group {g}")


def repair(c: Container, s: int, i: int) -> bytes | None:
    """The record of frame (s, i) rebuilt from its parity group, or None if it cannot be."""
    seq = c.frames.get((s, i))
    for g, shard_of in _parity_groups(c).items():
        if g in c.tried:
            continue
        seqs = next(iter(shard_of.values())).seqs
        if seq in seqs or (seq is None and any(q not in c.records for q in seqs)):
            c.tried.add(g)
            _rebuild(c, g, shard_of)
    seq = c.frames.get((s, i))
    return c.mended.get(seq) if seq is not None else None


def why_not(c: Container, s: int, i: int) -> str:
    """Why frame (s, i) could not be repaired."""
    if not int(c.head["parity"]):
        return "the container has no parity (packed with --parity 0)"
    seq = c.frames.get((s, i))
    for g, shard_of in sorted(_parity_groups(c).items()):
        seqs, _n, shards = _shards(c, shard_of)
        if seq in seqs or seq is None and any(q not in c.records for q in seqs):
            sound = sum(x is not None for x in shards)
            return f"parity group {g} has {sound} sound records of {len(shards)} and needs {len(seqs)}"
    return "no sound parity record covers it"


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


def verify(c: Container) -> Verified:
    """Reads, checks and decodes every frame, repairing from parity where it can."""
    from ..exceptions import CorruptError

    v = Verified()
    v.parity_damaged = sum(1 for r in c.records.values() if isinstance(r, rec.Parity) and rec.parse_record(c.pread(r.length, r.offset)) is None)
    for s in range(len(c.streams)):
        for i in range(c.frame_count(s)):
            v.frames += 1
            seq = c.frames.get((s, i))
            sound = seq is not None and c.record_bytes(seq, mended=False) is not None
            try:
                c.read_frame(s, i)
                if not sound:
                    v.damaged.append(c.where(s, i))
            except CorruptError as e:
                v.lost.append(str(e))
    return v
