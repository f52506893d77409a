"""Unpacking: containers → the original files, byte for byte, or one member in memory.

Frames are decoded in parallel and each run of a frame is written straight to its member's file
offset. A damaged frame costs only the members with bytes in it: the others are restored and
verified (crc32c of the whole file) and the error names every damaged part.
"""

from __future__ import annotations

import glob
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .. import _native
from ..exceptions import CorruptError, InvalidArgumentError, NotFoundError
from . import layout
from .aggregate import progress_bar
from .container import Reader
from .versions import open_container


@dataclass
class UnpackReport:
    restored: list[str] = field(default_factory=list)
    damaged: dict[str, str] = field(default_factory=dict)  # member (or container) → why
    repaired: list[str] = field(default_factory=list)  # frames rebuilt from parity, and where
    raw: int = 0
    seconds: float = 0.0


def containers_in(src: str) -> list[str]:
    if os.path.isfile(src):
        return [src]
    found = sorted(glob.glob(os.path.join(src, "*.cpk")))
    if not found:
        raise NotFoundError(f"{src!r} holds no .cpk containers; give the folder `cairn pack -o` wrote")
    return found


def _dest(out: str, name: str) -> str:
    """Where member `name` is restored (names are checked when a container is opened)."""
    return os.path.join(out, *name.split("/"))


def unpack(src: str, out: str, members: list[str] | None = None, workers: int | None = None, progress: bool = False) -> UnpackReport:
    """Restores the members of every container under `src` (or only those named) into `out`.
    Raises CorruptError after restoring all it can if anything was damaged; the error's
    ``report`` attribute lists what was restored."""
    paths = containers_in(src)
    report = UnpackReport()
    t0 = time.perf_counter()
    want = set(members) if members else None
    opened = []
    for p in paths:
        try:
            opened.append(open_container(p))
        except CorruptError as e:
            report.damaged[p] = str(e)
    chosen = [m for c in opened for m in c.members if want is None or m["name"] in want]
    for m in chosen:
        if os.path.lexists(_dest(out, m["name"])):
            for c in opened:
                c.close()
            raise InvalidArgumentError(f"{_dest(out, m['name'])!r} exists; unpack into an empty folder")
    bar = progress_bar(sum(int(m["size"]) for m in chosen), "unpack", progress)
    try:
        with ThreadPoolExecutor(workers or os.cpu_count() or 2) as pool:
            for c in opened:
                with c:
                    _unpack_container(c, out, want, pool, bar, report)
                    report.repaired += [f"{c.path}: {r}" for r in c.repaired]
    finally:
        if bar is not None:
            bar.close()  # type: ignore[attr-defined]
    report.seconds = time.perf_counter() - t0
    if want:
        missing = want - set(report.restored) - set(report.damaged)
        if missing:
            raise NotFoundError(f"no member named {sorted(missing)[0]!r} in {src!r}; `cairn ls {src}` lists them")
    if report.damaged:
        lines = "\n".join(f"  {k}: {v}" for k, v in report.damaged.items())
        err = CorruptError(
            f"restored {len(report.restored)} files; {len(report.damaged)} could not be restored from damaged containers:\n{lines}"
        )
        err.report = report  # type: ignore[attr-defined]
        raise err
    return report


def _unpack_container(
    c: Reader, out: str, want: set[str] | None, pool: ThreadPoolExecutor, bar: object | None, report: UnpackReport
) -> None:
    sel = [i for i, m in enumerate(c.members) if want is None or m["name"] in want]
    targets = {}
    for i in sel:
        m = c.members[i]
        dest = _dest(out, m["name"])
        try:
            os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
            # Sized only once restored: a member whose frames are damaged never grows a large file.
            targets[i] = (dest, os.open(dest + ".partial", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        except OSError as e:
            for made, fd in targets.values():
                os.close(fd)
                os.unlink(made + ".partial")
            raise InvalidArgumentError(f"{dest!r} cannot be created ({e.strerror or e}); unpack into an empty folder you can write") from None

    def put(m: int, off: int, data: np.ndarray) -> None:
        os.pwrite(targets[m][1], data, off)

    damaged = restore_into(c, set(sel), put, pool, bar)
    for i, (dest, fd) in targets.items():
        m = c.members[i]
        if i not in damaged:
            os.ftruncate(fd, int(m["size"]))
        os.close(fd)
        if i not in damaged:
            data = np.memmap(dest + ".partial", np.uint8, mode="r") if m["size"] else np.zeros(0, np.uint8)
            if _native.crc32c(data) != m["crc"]:
                damaged[i] = f"{c.path}: restored {m['name']!r} fails its whole-file checksum"
            del data
        if i in damaged:
            os.unlink(dest + ".partial")
            report.damaged[m["name"]] = damaged[i]
        else:
            os.replace(dest + ".partial", dest)
            report.restored.append(m["name"])
            report.raw += int(m["size"])


def restore_into(
    c: Reader,
    sel: set[int],
    put: Callable[[int, int, np.ndarray], None],
    pool: ThreadPoolExecutor,
    bar: object | None = None,
    streams: set[int] | None = None,
) -> dict[int, str]:
    """Decodes the frames holding bytes of the members in `sel` (in `streams`, default all) and
    hands each run to ``put(member, file offset, bytes)``. Returns the damaged members with the
    reason."""
    damaged: dict[int, str] = {}
    depth = 2 * pool._max_workers  # noqa: SLF001
    # One queue across streams, so that many small streams (one frame each) still overlap.
    inflight: deque = deque()

    def finish(s: int, i: int, r: layout.Runs, mine: np.ndarray, fut: object) -> None:
        a, b = c.frame_range(s, i)
        ks = [k for k in r.between(a, b) if mine[k]]
        try:
            buf = fut.result()  # type: ignore[attr-defined]
        except CorruptError as e:
            for k in ks:
                damaged.setdefault(int(r.member[k]), str(e))
            return
        done = 0
        for k in ks:
            st, n = int(r.start[k]), int(r.length[k])
            lo, hi = max(st, a), min(st + n, b)
            done += hi - lo
            m = int(r.member[k])
            if m not in damaged:
                put(m, int(r.offset[k]) + lo - st, buf[lo - a : hi - a])
        if bar is not None:
            bar.update(done)  # type: ignore[attr-defined]

    for s, stream in enumerate(c.streams):
        if (streams is not None and s not in streams) or not any(p.member in sel for p in stream.parts):
            continue
        r = layout.runs(stream)
        mine = np.isin(r.member, list(sel))
        for i in _frames_touched(c, s, r.start[mine], r.length[mine]):
            inflight.append((s, i, r, mine, pool.submit(c.read_frame, s, i)))
            while len(inflight) > depth:
                finish(*inflight.popleft())
    while inflight:
        finish(*inflight.popleft())
    return damaged


def _frames_touched(c: Reader, s: int, start: np.ndarray, length: np.ndarray) -> list[int]:
    """Frames of stream `s` overlapping any of the runs (start, length)."""
    f, n = c.frame_size, c.frame_count(s)
    keep = length > 0
    first, last = start[keep] // f, (start[keep] + length[keep] - 1) // f
    marks = np.zeros(n + 1, np.int64)
    np.add.at(marks, first, 1)
    np.add.at(marks, last + 1, -1)
    return [int(i) for i in np.flatnonzero(np.cumsum(marks)[:-1] > 0)]


def decode_all(path: str, pool: ThreadPoolExecutor) -> None:
    """Decodes and checks every frame of a container, discarding the bytes: the cost of unpacking
    without the disk writes (for `--compare` and the benchmark). Damage raises CorruptError."""
    with open_container(path) as c:
        damaged = restore_into(c, set(range(len(c.members))), lambda _m, _off, _data: None, pool)
        if damaged or c.damage:
            raise CorruptError("; ".join([*c.damage, *damaged.values()]))


def read_member(c: Reader, name: str, workers: int | None = None) -> bytes:
    """One member's file, in memory, decoding only the frames that hold its bytes."""
    idx = next((i for i, m in enumerate(c.members) if m["name"] == name), None)
    if idx is None:
        raise NotFoundError(f"{c.path}: no member {name!r}; members are {[m['name'] for m in c.members[:4]]}…")
    buf = bytearray(int(c.members[idx]["size"]))
    view = np.frombuffer(buf, np.uint8) if buf else np.zeros(0, np.uint8)

    def put(_m: int, off: int, data: np.ndarray) -> None:
        view[off : off + len(data)] = data

    with ThreadPoolExecutor(workers or os.cpu_count() or 2) as pool:
        damaged = restore_into(c, {idx}, put, pool)
    if damaged:
        raise CorruptError(damaged[idx])
    if _native.crc32c(view) != c.members[idx]["crc"]:
        raise CorruptError(f"{c.path}: {name!r} fails its whole-file checksum")
    return bytes(buf)
