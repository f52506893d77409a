"""Memory for the arrays ``Reader.get`` returns, reused once the caller lets them go. A new array
of a large read costs a page fault per 4 KiB the first time it is written, and in a VM memory
given back to the system can cost far more to fault in again (64 MiB steps streamed with the
natural ``f.get(...)`` ran at a third of ``get(out=)``; docs/performance.md, *Streaming*). A
returned array's memory belongs to a holder object numpy keeps as the array's base (and every
view's), so the memory comes back here only once no array or view uses it."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

#: Reads smaller than this get a plain new array (their faults cost little).
MIN_BYTES = 1 << 20

#: Buffers kept for reuse at most, in bytes and in number per size.
MAX_BYTES, PER_SIZE = 2 << 30, 4

# Re-entrant: a buffer comes back from a finaliser, which garbage collection may run on this
# thread while it holds the lock.
_lock = threading.RLock()
_free: dict[int, list[np.ndarray]] = {}
_held = 0


class _Lent:
    """Owns a buffer lent to the arrays made from it (numpy's base object for them): when the
    last of them goes, the buffer goes back to the pool."""

    __slots__ = ("raw", "__array_interface__")

    def __init__(self, raw: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.raw = raw
        self.__array_interface__ = {"data": (raw.ctypes.data, False), "shape": shape, "typestr": dtype.str, "version": 3}

    def __del__(self) -> None:
        _give(self.raw)


def _give(raw: np.ndarray) -> None:
    global _held
    new: list[np.ndarray] = []  # made outside the lock (an allocation may run a collection)
    with _lock:
        kept = _free.setdefault(raw.nbytes, new)
        if len(kept) < PER_SIZE and _held + raw.nbytes <= MAX_BYTES:
            kept.append(raw)
            _held += raw.nbytes


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array of ``shape`` and ``dtype``, in memory a released one used when
    there is one of its size."""
    global _held
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if nbytes < MIN_BYTES:
        return np.empty(shape, dt)
    with _lock:
        kept = _free.get(nbytes)
        raw = kept.pop() if kept else None
        if raw is not None:
            _held -= nbytes
    if raw is None:
        raw = np.empty(nbytes, np.uint8)
    return np.asarray(_Lent(raw, tuple(shape), dt))
