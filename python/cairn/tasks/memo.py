"""A memoisation cache in a store: samples (point → value) in buckets keyed by the point rounded
to a number of digits, with nearest-neighbour queries inside a bucket. Surrogates such as
kriging draw their neighbours from it.

Each sample carries the epoch (e.g. step·phases + phase) it was added in. Queries can ask for
samples added before an epoch only: that is how a resumed run sees exactly what the
uninterrupted run saw at that point, although the crashed attempt already added later samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .stores import Store


@dataclass
class Bucket:
    """The samples of one bucket: points (m, dim), values (m, width), epochs (m,)."""

    points: np.ndarray
    values: np.ndarray
    epochs: np.ndarray

    def before(self, epoch: int | None) -> "Bucket":
        """Only the samples added before ``epoch`` (all when None)."""
        if epoch is None:
            return self
        keep = self.epochs < epoch
        return Bucket(self.points[keep], self.values[keep], self.epochs[keep])

    def nearest(self, point: np.ndarray, k: int) -> tuple[np.ndarray, "Bucket"]:
        """The ``k`` samples nearest to ``point`` in L1 distance (ties in stored order), with their
        distances."""
        d = np.abs(self.points - point).sum(axis=1)
        order = np.argsort(d, kind="stable")[:k]
        return d[order], Bucket(self.points[order], self.values[order], self.epochs[order])

    def exact(self, point: np.ndarray) -> np.ndarray | None:
        """The value of a sample at exactly ``point``, if any."""
        hit = np.flatnonzero((self.points == point).all(axis=1))
        return self.values[hit[0]] if len(hit) else None

    def __len__(self) -> int:
        return len(self.epochs)


class Memo:
    """Samples of a ``dim``-dimensional point to a value, in buckets of points rounded to
    ``digits`` decimals (``name`` namespaces the keys in the store)."""

    def __init__(self, store: Store, name: str, digits: int, dim: int):
        self.store, self.name, self.digits, self.dim = store, name, digits, dim
        self._fmt = ":".join([f"%.{digits}f"] * dim)
        self._tiny = 0.5 * 10.0 ** -digits

    def key(self, point: np.ndarray) -> str:
        """The bucket key of a point: its components printed with ``digits`` decimals. Components
        that print as zero are zero, so -0.0000 and 0.0000 share a bucket (the original tried
        both signs of tiny components instead: up to 2^dim lookups)."""
        p = np.where(np.abs(point) < self._tiny, 0.0, point)
        return f"{self.name}/{self._fmt % tuple(p)}"

    def buckets(self, points: np.ndarray) -> list[Bucket]:
        """The bucket of each point (one store request for all)."""
        keys = [self.key(p) for p in points]
        uniq = sorted(set(keys))
        fetched = dict(zip(uniq, (self._decode(m) for m in self.store.members_many(uniq))))
        return [fetched[k] for k in keys]

    def _decode(self, members: Sequence[bytes]) -> Bucket:
        if not members:
            return Bucket(np.empty((0, self.dim)), np.empty((0, 0)), np.empty(0, np.int64))
        rows = np.frombuffer(b"".join(members), dtype=np.float64).reshape(len(members), -1)
        return Bucket(rows[:, 1:1 + self.dim], rows[:, 1 + self.dim:], rows[:, 0].astype(np.int64))

    def add(self, points: np.ndarray, values: np.ndarray, epoch: int = 0) -> None:
        """Adds samples (points (n, dim), values (n, width)) in ``epoch``."""
        points, values = np.atleast_2d(points), np.atleast_2d(values)
        if points.shape[1] != self.dim or len(points) != len(values):
            raise ValueError(f"memo {self.name}: need points (n, {self.dim}) and values (n, width), got {points.shape} and {values.shape}")
        rows = np.concatenate([np.full((len(points), 1), float(epoch)), points, values], axis=1).astype(np.float64)
        self.store.add_many([(self.key(p), r.tobytes()) for p, r in zip(points, rows)])

    def nearest(self, points: np.ndarray, k: int, before: int | None = None) -> list[tuple[np.ndarray, Bucket]]:
        """For each point, the ``k`` nearest samples (L1) of its bucket added before ``before``."""
        return [b.before(before).nearest(p, k) for p, b in zip(points, self.buckets(points))]
