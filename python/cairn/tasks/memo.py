"""A memoisation cache in a store: samples (point → value) in buckets keyed by the point rounded
to a number of digits, with nearest-neighbour queries inside a bucket. Surrogates such as
kriging draw their neighbours from it.

Each sample carries the epoch (e.g. step·phases + phase) it was added in. Queries can ask for
samples added before an epoch only: that is how a resumed run sees exactly what the
uninterrupted run saw at that point, although the crashed attempt already added later samples.

Queries are vectorised over many points: a driver asks about every distinct state of a phase at
once (:meth:`Memo.lookup`), and gets nearest samples or exact matches for all of them as arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from .stores import Store

#: Distance-matrix entries computed at once (bounds the memory of a query on a full bucket).
_BLOCK = 1 << 20


def unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of a 2-D array and, per row, the index of its distinct row. Rows are
    compared by their bytes (after turning −0.0 into 0.0), which sorts ~10× faster than
    ``np.unique(axis=0)``; the order of the distinct rows is that of their bytes."""
    a = np.ascontiguousarray(a + 0 if a.dtype.kind == "f" else a)
    rows = a.view(np.dtype((np.void, a.dtype.itemsize * a.shape[1]))).ravel()
    uniq, inv = np.unique(rows, return_inverse=True)
    return uniq.view(a.dtype).reshape(-1, a.shape[1]), inv.reshape(-1)


@dataclass
class Lookup:
    """The buckets of many query points at once: the samples of every distinct bucket back to
    back (``points`` (m, dim), ``values`` (m, width), ``epochs`` (m,), in stored order), and for
    query ``i`` its bucket's rows ``lo[i]:hi[i]``. Queries are answered for all points together,
    as arrays over (query, sample) pairs, whatever the number of buckets."""

    queries: np.ndarray
    points: np.ndarray
    values: np.ndarray
    epochs: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    def _pairs(self, keep: np.ndarray | None):
        """(query, sample) index pairs of each query with the samples of its bucket where
        ``keep``, ordered by query then sample, in blocks of bounded size."""
        counts = self.hi - self.lo
        ends = np.cumsum(counts)
        q0 = 0
        while q0 < len(counts):
            base = ends[q0] - counts[q0]
            q1 = max(q0 + 1, int(np.searchsorted(ends, base + _BLOCK // max(1, self.queries.shape[1]), side="right")))
            c = counts[q0:q1]
            q = np.repeat(np.arange(q0, q1), c)
            s = np.arange(c.sum()) - np.repeat(np.cumsum(c) - c, c) + np.repeat(self.lo[q0:q1], c)
            if keep is not None:
                m = keep[s]
                q, s = q[m], s[m]
            yield q, s
            q0 = q1

    def nearest(self, k: int, keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """For each query, the L1 distances (n, k) to the ``k`` nearest samples of its bucket
        (where ``keep``) and their rows; ties in stored order; ``inf`` and −1 pad a bucket with
        fewer than ``k``."""
        n = len(self.queries)
        dist, rows = np.full((n, k), np.inf), np.full((n, k), -1, np.intp)
        for q, s in self._pairs(keep):
            d = np.abs(self.queries[q] - self.points[s]).sum(axis=1)
            o = np.lexsort((s, d, q))
            q, s, d = q[o], s[o], d[o]
            rank = np.arange(len(q)) - np.searchsorted(q, q)
            m = rank < k
            dist[q[m], rank[m]], rows[q[m], rank[m]] = d[m], s[m]
        return dist, rows

    def exact(self, keep: np.ndarray | None = None) -> np.ndarray:
        """For each query, the first row of its bucket (where ``keep``) holding exactly the query
        point, or −1."""
        out = np.full(len(self.queries), -1, np.intp)
        for q, s in self._pairs(keep):
            eq = (self.queries[q] == self.points[s]).all(axis=1)
            q, s = q[eq], s[eq]
            first, at = np.unique(q, return_index=True)
            out[first] = s[at]
        return out


class Memo:
    """Samples of a ``dim``-dimensional point to a value, in buckets of points rounded to
    ``digits`` decimals (``name`` namespaces the keys in the store)."""

    def __init__(self, store: Store, name: str, digits: int, dim: int):
        self.store, self.name, self.digits, self.dim = store, name, digits, dim
        self._scale = 10.0 ** digits

    def keys(self, points: np.ndarray) -> list[str]:
        """The bucket key of each point: its components times 10^digits, rounded half to even, as
        integers (``name/10400:0:…``). A component that rounds to zero is zero, so −0.0000 and
        0.0000 share a bucket (the original tried both signs of tiny components instead: up to
        2^dim lookups). Non-finite or huge components are keyed by their exact value."""
        names, inv = self._distinct(np.atleast_2d(points))
        return [names[i] for i in inv]

    def _distinct(self, points: np.ndarray) -> tuple[list[str], np.ndarray]:
        """The distinct bucket keys of ``points`` and, per point, the index of its key."""
        scaled = np.rint(points * self._scale)
        ok = (np.abs(scaled) < 2.0 ** 53).all(axis=1)  # also False for NaN
        q, inv = unique_rows(np.where(ok[:, None], scaled, 0.0).astype(np.int64))
        names = [f"{self.name}/" + ":".join(map(str, r)) for r in q.tolist()]
        bad = np.flatnonzero(~ok)
        if len(bad):
            inv = inv.copy()
            inv[bad] = len(names) + np.arange(len(bad))
            names += [f"{self.name}/=" + ":".join(map(repr, points[i].tolist())) for i in bad]
        return names, inv

    def key(self, point: np.ndarray) -> str:
        """The bucket key of one point (see :meth:`keys`)."""
        return self.keys(np.asarray(point)[None, :])[0]

    def lookup(self, points: np.ndarray) -> Lookup:
        """The buckets of ``points`` (one store request for all distinct ones)."""
        points = np.atleast_2d(np.asarray(points, np.float64))
        names, inv = self._distinct(points)
        fetched = self.store.members_many(names)
        sizes = np.array([len(m) for m in fetched], np.intp)
        lo = (np.cumsum(sizes) - sizes)[inv]
        hi = lo + sizes[inv]
        raw = b"".join(m for ms in fetched for m in ms)
        rows = np.frombuffer(raw, np.float64).reshape(int(sizes.sum()), -1) if raw else np.empty((0, 1 + self.dim))
        return Lookup(points, rows[:, 1:1 + self.dim], rows[:, 1 + self.dim:], rows[:, 0].astype(np.int64), lo, hi)

    def add(self, points: np.ndarray, values: np.ndarray, epoch: int = 0) -> None:
        """Adds samples (points (n, dim), values (n, width)) in ``epoch``."""
        points, values = np.atleast_2d(points), np.atleast_2d(values)
        if points.shape[1] != self.dim or len(points) != len(values):
            raise ValueError(f"memo {self.name}: need points (n, {self.dim}) and values (n, width), got {points.shape} and {values.shape}")
        rows = np.concatenate([np.full((len(points), 1), float(epoch)), points, values], axis=1).astype(np.float64)
        self.store.add_many(list(zip(self.keys(points), (r.tobytes() for r in rows))))
