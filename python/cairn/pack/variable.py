"""Reading one variable of one member from a container, without restoring the member's file.

The head records, for every variable the scanner found, its element type, shape, and the stream
and part holding its values; only the frames of that stream that hold the part are decoded.
Variables whose stored bytes are not their values in order (chunked, compound, variable-length,
or in a container packed ``agnostic``) are read from the member restored in memory instead.
"""

from __future__ import annotations

import bisect
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..exceptions import CorruptError, NotFoundError
from .container import Reader
from .versions import open_container
from .restore import read_member, restore_into


def read_variable(container: str | Reader, member: str, path: str) -> np.ndarray:
    """Variable `path` (``/group/name``) of `member` as a numpy array.

    >>> read_variable("packed/group-00000.cpk", "rank-3.h5", "/hydro/rho")
    """
    if isinstance(container, str):
        with open_container(container) as c:
            return read_variable(c, member, path)
    c = container
    idx = next((i for i, m in enumerate(c.members) if m["name"] == member), None)
    if idx is None:
        raise NotFoundError(f"{c.path}: no member {member!r}; `cairn ls {c.path}` lists them")
    want = path if path.startswith("/") else "/" + path
    entry = next((v for v in c.members[idx]["variables"] if v[0] == want), None)
    if entry is not None and entry[3] is not None and entry[5]:
        _, dtype, shape, s, p, _ = entry
        extents = c.streams[s].parts[p].extents
        data = _read_extents(c, idx, s, extents)
        dt = np.dtype(dtype)
        if len(data) != dt.itemsize * int(np.prod(shape, dtype=np.int64)):
            raise CorruptError(f"{c.path}: {member}:{want} holds {len(data)} bytes, not {shape} values of {dtype}")
        return np.frombuffer(data, dt).reshape(shape)
    return _from_file(c, member, want)


def _read_extents(c: Reader, idx: int, s: int, extents: list[tuple[int, int]]) -> bytes:
    """The bytes of member `idx` at file `extents` (in that order), from stream `s` only."""
    starts, at = [], 0
    for _off, n in extents:
        starts.append(at)
        at += n
    by_offset = sorted(zip((o for o, _ in extents), (n for _, n in extents), starts))
    keys = [o for o, _, _ in by_offset]
    out = bytearray(at)

    def put(_m: int, off: int, data: np.ndarray) -> None:
        end = off + len(data)
        k = max(bisect.bisect_right(keys, off) - 1, 0)
        while k < len(by_offset) and by_offset[k][0] < end:
            eo, en, es = by_offset[k]
            lo, hi = max(off, eo), min(end, eo + en)
            if lo < hi:
                out[es + lo - eo : es + hi - eo] = data[lo - off : hi - off].tobytes()
            k += 1

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        damaged = restore_into(c, {idx}, put, pool, streams={s})
    if damaged:
        raise CorruptError(damaged[idx])
    return bytes(out)


def _from_file(c: Reader, member: str, path: str) -> np.ndarray:
    data = read_member(c, member)
    fmt = next(m["format"] for m in c.members if m["name"] == member)
    if fmt == "netcdf3":
        import netCDF4

        with netCDF4.Dataset(member, mode="r", memory=data) as d:
            var = d[path.lstrip("/")] if path.lstrip("/") in d.variables else None
            if var is None:
                raise NotFoundError(f"{c.path}: {member} has no variable {path!r}")
            var.set_auto_mask(False)
            return np.asarray(var[...])
    import io

    import h5py

    with h5py.File(io.BytesIO(data), "r") as f:
        obj = f.get(path)
        if not isinstance(obj, h5py.Dataset):
            raise NotFoundError(f"{c.path}: {member} has no dataset {path!r}")
        return obj[()]
